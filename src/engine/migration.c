/*
 * migration.c - plan the moves from the layout in service to a new one.
 *
 * The target is first relabelled inside each GPU (relabel.c), then each slot
 * of each live GPU gets the cheapest way to obtain its expert, in this order:
 *   keep       it holds it already;
 *   local      another slot of the same GPU holds it now (a device copy);
 *   recv-copy  the GPU receives it for an earlier slot of this layer (a
 *              device copy after the transfer: one transfer per GPU and
 *              expert, however many replicas the GPU gets);
 *   recv       from a GPU of the same node that holds it now, else from one
 *              of another node; among candidates the one that has sent the
 *              fewest bytes so far, so sending is spread over the holders;
 *   relay      (with opts.relay) when only other nodes hold it and a GPU of
 *              this node already receives it from there: take it from that
 *              GPU over the node's links, so each node pulls each expert
 *              across the network once;
 *   load       no live GPU holds it (every holder failed): the caller loads it.
 * Slots of failed GPUs are "dead": nothing is sent to or from them.
 *
 * The naive plan beside it counts every slot whose expert differs between
 * the current and the target as given, each moved whole: what one pays
 * without relabelling, local copies or sharing of received experts.
 */
#include "migrate_internal.h"

#include <string.h>

static epx_status check_shapes(const epx_layout *cur, const epx_layout *tgt, epx_error *err) {
    const epx_shape *a = epx_layout_shape(cur), *b = epx_layout_shape(tgt);
    return epxi_check_same_shape(a, b, "the current layout (", ") and the target (",
                                 ") differ in shape: a migration moves weights between slots "
                                 "of one shape; plan the target for the current shape",
                                 err);
}

const char *epx_move_kind_name(int kind) {
    switch (kind) {
    case EPX_MOVE_KEEP: return "keep";
    case EPX_MOVE_LOCAL: return "local";
    case EPX_MOVE_RECV: return "recv";
    case EPX_MOVE_RELAY: return "relay";
    case EPX_MOVE_RECV_COPY: return "recv-copy";
    case EPX_MOVE_LOAD: return "load";
    case EPX_MOVE_DEAD: return "dead";
    default: return "?";
    }
}

void epx_migration_destroy(epx_migration *mig) {
    if (mig == NULL) return;
    epx_layout_destroy(mig->layout);
    free(mig->current);
    free(mig->failed);
    free(mig->perm);
    free(mig->kinds);
    free(mig->src);
    free(mig->sent);
    free(mig->recv);
    free(mig);
}

/* Scratch for one layer: live holders of each expert now (CSR), and marks
 * for "this GPU / this node already receives expert e in this layer". */
typedef struct {
    int32_t *hstart;                 /* [E + 1] */
    int32_t *hslot;                  /* [P] */
    int64_t *gpu_mark, *node_mark;   /* [E] stamps */
    int32_t *gpu_first, *node_first; /* [E] slots */
} layer_scratch;

static void build_holders(layer_scratch *s, const int32_t *row, int32_t P, int32_t E, int32_t spg,
                          const uint8_t *failed) {
    memset(s->hstart, 0, (size_t)(E + 1) * sizeof *s->hstart);
    for (int32_t p = 0; p < P; p++)
        if (failed == NULL || !failed[p / spg]) s->hstart[row[p] + 1]++;
    for (int32_t e = 0; e < E; e++) s->hstart[e + 1] += s->hstart[e];
    /* gpu_first doubles as a fill cursor here; its marks are reset below. */
    int32_t *fill = s->gpu_first;
    memcpy(fill, s->hstart, (size_t)E * sizeof *fill);
    for (int32_t p = 0; p < P; p++)
        if (failed == NULL || !failed[p / spg]) s->hslot[fill[row[p]]++] = p;
}

/* The live holder of `e` that slot p's GPU should receive from, or -1. */
static int32_t pick_source(const layer_scratch *s, int32_t e, int32_t g, int32_t spg, int32_t gpn,
                           const uint64_t *sent, bool *same_node) {
    int32_t best = -1, best_tier = 2;
    for (int32_t i = s->hstart[e]; i < s->hstart[e + 1]; i++) {
        int32_t q = s->hslot[i], h = q / spg;
        if (h == g) continue; /* a local holder is handled before */
        int32_t tier = (h / gpn == g / gpn) ? 0 : 1;
        if (tier < best_tier || (tier == best_tier && sent[h] < sent[best / spg])) {
            best = q;
            best_tier = tier;
        }
    }
    *same_node = best_tier == 0;
    return best;
}

static int32_t local_holder(const layer_scratch *s, int32_t e, int32_t g, int32_t spg) {
    for (int32_t i = s->hstart[e]; i < s->hstart[e + 1]; i++)
        if (s->hslot[i] / spg == g) return s->hslot[i];
    return -1;
}

static bool node_holds(const layer_scratch *s, int32_t e, int32_t node, int32_t spg, int32_t gpn) {
    for (int32_t i = s->hstart[e]; i < s->hstart[e + 1]; i++)
        if (s->hslot[i] / spg / gpn == node) return true;
    return false;
}

static void plan_layer(epx_migration *m, int32_t l, const int32_t *old, const int32_t *given,
                       const uint8_t *failed, bool relay, layer_scratch *s) {
    const epx_shape *sh = &m->shape;
    const int32_t P = sh->num_physical_experts, E = sh->num_logical_experts;
    const int32_t G = sh->num_gpus, spg = P / G, gpn = G / sh->num_nodes;
    const size_t B = m->stats.expert_bytes;
    const int32_t *tgt = epx_layout_physical_to_logical(m->layout) + (size_t)l * (size_t)P;
    uint8_t *kind = m->kinds + (size_t)l * (size_t)P;
    int32_t *src = m->src + (size_t)l * (size_t)P;
    epx_migration_stats *st = &m->stats;
    build_holders(s, old, P, E, spg, failed);
    for (int32_t g = 0; g < G; g++) {
        const int64_t gstamp = (int64_t)l * G + g + 1;
        const int64_t nstamp = (int64_t)l * sh->num_nodes + g / gpn + 1;
        for (int32_t p = g * spg; p < (g + 1) * spg; p++) {
            if (failed != NULL && failed[g]) {
                kind[p] = EPX_MOVE_DEAD;
                src[p] = -1;
                continue;
            }
            const int32_t e = tgt[p];
            st->slots++;
            if (given[p] != old[p]) {
                st->naive_changed++;
                /* no live holder anywhere: loaded by the caller, no link;
                 * else none on this node: it crosses between nodes */
                if (s->hstart[given[p]] == s->hstart[given[p] + 1])
                    m->naive_loaded++;
                else if (!node_holds(s, given[p], g / gpn, spg, gpn))
                    st->naive_bytes_inter_node += B;
            }
            if (e == old[p]) {
                kind[p] = EPX_MOVE_KEEP;
                src[p] = p;
                st->kept++;
                continue;
            }
            st->changed++;
            int32_t q = local_holder(s, e, g, spg);
            if (q >= 0) {
                kind[p] = EPX_MOVE_LOCAL;
            } else if (s->gpu_mark[e] == gstamp) {
                kind[p] = EPX_MOVE_RECV_COPY;
                q = s->gpu_first[e];
            } else {
                bool same_node = false;
                q = pick_source(s, e, g, spg, gpn, m->sent, &same_node);
                if (relay && !same_node && s->node_mark[e] == nstamp) {
                    kind[p] = EPX_MOVE_RELAY;
                    q = s->node_first[e];
                    st->relayed++;
                    st->bytes_intra_node += B;
                } else if (q >= 0) {
                    kind[p] = EPX_MOVE_RECV;
                    st->received++;
                    if (same_node) {
                        st->bytes_intra_node += B;
                    } else {
                        st->bytes_inter_node += B;
                        if (s->node_mark[e] != nstamp) {
                            s->node_mark[e] = nstamp;
                            s->node_first[e] = p;
                        }
                    }
                } else {
                    kind[p] = EPX_MOVE_LOAD;
                    st->loaded++;
                    st->bytes_loaded += B;
                }
                if (kind[p] == EPX_MOVE_RECV || kind[p] == EPX_MOVE_RELAY) {
                    m->sent[q / spg] += B;
                    m->recv[g] += B;
                }
                s->gpu_mark[e] = gstamp;
                s->gpu_first[e] = p;
            }
            if (kind[p] == EPX_MOVE_LOCAL || kind[p] == EPX_MOVE_RECV_COPY) {
                st->local_copies++;
                st->bytes_local += B;
            }
            src[p] = kind[p] == EPX_MOVE_LOAD ? -1 : q;
        }
    }
}

static epx_status check_opts(const epx_migrate_opts *o, const epx_shape *sh, epx_error *err) {
    EPX_TRY(epxi_check_version(o->version, EPX_MIGRATE_OPTS_VERSION, "epx_migrate_opts",
                               "EPX_MIGRATE_OPTS_INIT", err));
    if (o->expert_bytes == 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "expert_bytes is 0: give the size in bytes of one expert's weights in "
                         "one layer (e.g. 3 * hidden * intermediate * bytes per element)");
    if ((o->relabel != 0 && o->relabel != 1) || (o->relay != 0 && o->relay != 1))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "relabel (%d) and relay (%d) must each be 0 or 1", o->relabel, o->relay);
    uint64_t slots = (uint64_t)sh->num_layers * (uint64_t)sh->num_physical_experts;
    if ((uint64_t)o->expert_bytes > UINT64_MAX / slots)
        return epxi_fail(err, EPX_ERR_OVERFLOW,
                         "expert_bytes (%zu) times %llu slots overflows a 64-bit byte count: "
                         "use at most %llu bytes per expert",
                         o->expert_bytes, (unsigned long long)slots,
                         (unsigned long long)(UINT64_MAX / slots));
    int32_t live = 0;
    return epxi_count_live(sh, o->failed_gpus, &live, err);
}

epx_status epx_migration_plan(const epx_layout *current, const epx_layout *target,
                              const epx_migrate_opts *opts, epx_migration **out, epx_error *err) {
    if (current == NULL || target == NULL || opts == NULL || out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_migration_plan: current, target, opts and out must not be NULL");
    EPX_TRY(check_shapes(current, target, err));
    const epx_shape *sh = epx_layout_shape(current);
    EPX_TRY(check_opts(opts, sh, err));
    if (opts->failed_gpus != NULL) { /* a target that leaves an expert only on lost GPUs */
        int32_t most = 0;
        EPX_TRY(epxi_live_replicas_most(target, opts->failed_gpus, "the target", &most, err));
    }
    const int32_t P = sh->num_physical_experts, E = sh->num_logical_experts, G = sh->num_gpus;
    const size_t cells = (size_t)sh->num_layers * (size_t)P;
    const int32_t *old = epx_layout_physical_to_logical(current);
    const int32_t *given = epx_layout_physical_to_logical(target);

    epx_status st = EPX_OK;
    layer_scratch s = {0};
    int32_t *map = NULL;
    epx_migration *m = epxi_calloc(1, sizeof *m, "migration", err);
    if (m == NULL) return EPX_ERR_NOMEM;
    m->shape = *sh;
    m->stats.expert_bytes = opts->expert_bytes;
    m->perm = epxi_calloc(cells, sizeof *m->perm, "migration permutation", err);
    m->kinds = m->perm ? epxi_calloc(cells, 1, "migration kinds", err) : NULL;
    m->src = m->kinds ? epxi_calloc(cells, sizeof *m->src, "migration sources", err) : NULL;
    m->sent = m->src ? epxi_calloc((size_t)G, sizeof *m->sent, "bytes sent", err) : NULL;
    m->recv = m->sent ? epxi_calloc((size_t)G, sizeof *m->recv, "bytes received", err) : NULL;
    m->current = m->recv ? epxi_calloc(cells, sizeof *m->current, "current map", err) : NULL;
    m->failed = m->current ? epxi_calloc((size_t)G, 1, "failed GPUs", err) : NULL;
    map = m->failed ? epxi_calloc(cells, sizeof *map, "relabelled map", err) : NULL;
    s.hstart = map ? epxi_calloc((size_t)E + 1, sizeof *s.hstart, "holders", err) : NULL;
    s.hslot = s.hstart ? epxi_calloc((size_t)P, sizeof *s.hslot, "holders", err) : NULL;
    s.gpu_mark = s.hslot ? epxi_calloc((size_t)E * 2, sizeof *s.gpu_mark, "marks", err) : NULL;
    s.gpu_first = s.gpu_mark ? epxi_calloc((size_t)E * 2, sizeof *s.gpu_first, "marks", err) : NULL;
    if (s.gpu_first == NULL) {
        st = EPX_ERR_NOMEM;
        goto fail;
    }
    s.node_mark = s.gpu_mark + E;
    s.node_first = s.gpu_first + E;

    memcpy(map, given, cells * sizeof *map);
    memcpy(m->current, old, cells * sizeof *old);
    if (opts->failed_gpus != NULL) memcpy(m->failed, opts->failed_gpus, (size_t)G);
    if (opts->relabel) {
        EPX_TRY_GOTO(st, epxi_relabel_map(sh, old, map, m->perm, err), fail);
    } else {
        for (size_t i = 0; i < cells; i++) m->perm[i] = (int32_t)(i % (size_t)P);
    }
    /* A permutation inside each GPU keeps every expert present: cannot fail
     * validation, but the constructor also builds the derived maps. */
    EPX_TRY_GOTO(st, epx_layout_create_from_map(sh, map, &m->layout, err), fail);
    for (int32_t l = 0; l < sh->num_layers; l++)
        plan_layer(m, l, old + (size_t)l * (size_t)P, given + (size_t)l * (size_t)P,
                   opts->failed_gpus, opts->relay != 0, &s);
    epx_migration_stats *t = &m->stats;
    t->bytes_moved = t->bytes_intra_node + t->bytes_inter_node;
    t->naive_bytes_moved = (uint64_t)t->naive_changed * (uint64_t)t->expert_bytes;
    for (int32_t g = 0; g < G; g++) {
        if (m->sent[g] > t->max_rank_send) t->max_rank_send = m->sent[g];
        if (m->recv[g] > t->max_rank_recv) t->max_rank_recv = m->recv[g];
    }
    *out = m;
    goto done;
fail:
    epx_migration_destroy(m);
done:
    free(map);
    free(s.hstart);
    free(s.hslot);
    free(s.gpu_mark);
    free(s.gpu_first);
    return st;
}

const epx_layout *epx_migration_layout(const epx_migration *m) { return m ? m->layout : NULL; }
const int32_t *epx_migration_permutation(const epx_migration *m) { return m ? m->perm : NULL; }
const uint8_t *epx_migration_kinds(const epx_migration *m) { return m ? m->kinds : NULL; }
const int32_t *epx_migration_sources(const epx_migration *m) { return m ? m->src : NULL; }
/* A NULL handle or out writes nothing (stats of no migration: zeros). */
void epx_migration_get_stats(const epx_migration *m, epx_migration_stats *out) {
    if (out == NULL) return;
    if (m == NULL)
        memset(out, 0, sizeof *out);
    else
        *out = m->stats;
}

int64_t epx_migration_naive_loaded(const epx_migration *m) { return m ? m->naive_loaded : 0; }

void epx_migration_rank_bytes(const epx_migration *m, uint64_t *sent, uint64_t *received) {
    if (m == NULL) return;
    size_t n = (size_t)m->shape.num_gpus * sizeof(uint64_t);
    if (sent != NULL) memcpy(sent, m->sent, n);
    if (received != NULL) memcpy(received, m->recv, n);
}

void epx_migration_link_bytes(const epx_migration *m, uint64_t *out) {
    if (m == NULL || out == NULL) return;
    const int32_t G = m->shape.num_gpus, spg = m->shape.num_physical_experts / G;
    const size_t cells = (size_t)m->shape.num_layers * (size_t)m->shape.num_physical_experts;
    const uint64_t B = m->stats.expert_bytes;
    memset(out, 0, (size_t)G * (size_t)G * sizeof *out);
    for (size_t i = 0; i < cells; i++) {
        int32_t k = m->kinds[i], dst = (int32_t)(i % (size_t)m->shape.num_physical_experts) / spg;
        if (k == EPX_MOVE_KEEP || k == EPX_MOVE_LOAD || k == EPX_MOVE_DEAD) continue;
        out[(size_t)(m->src[i] / spg) * (size_t)G + (size_t)dst] += B;
    }
}
