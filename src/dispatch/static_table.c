/*
 * static_table.c - static dispatch tables [G][L][E]: for each rank, the one
 * replica that rank's tokens of each logical expert are sent to.
 *
 * SGLang's algorithm (compute_logical_to_rank_dispatch_physical_map) is
 * reproduced exactly, which takes CPython's random.Random draw for draw
 * (pyrandom.c): per (layer, expert), GPUs that hold a replica use their first
 * one, and the remaining GPUs share the replicas through "fair choices" --
 * every replica q times plus a random sample of k % n, shuffled. One
 * generator runs over the whole table, so a single extra or missing draw in
 * any expert changes every later one; the golden tests compare whole tables.
 *
 * epx's own table needs no generator. What balances a static table is
 * that every replica receives about its share of the expert's ranks (G / n
 * for an even split): SGLang gets that by its fair choices, epx by
 * counting. Choices with a single candidate (the rank's own GPU, a lone
 * replica) are committed first; the rest go, heaviest expert first, to the
 * replica furthest below its share, rounding ties towards the GPU furthest
 * below the load the placement expects of it. A replica on the rank's node
 * is preferred while it stays within half a rank of its share, which keeps
 * traffic on the node at no cost in balance. (A first version that sent
 * each rank to the least loaded GPU outright balanced worse than SGLang:
 * with the flexible load still unassigned, "least loaded" piled whole
 * experts onto one replica. bench/RESULTS.md has both.)
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "pyrandom.h"
#include "table_common.h"

epx_status epxi_table_check_replicas(const epx_shape *s, const int32_t *replicas, int32_t width,
                                     epx_error *err) {
    int32_t L = s->num_layers, E = s->num_logical_experts, P = s->num_physical_experts;
    for (int32_t l = 0; l < L; l++)
        for (int32_t e = 0; e < E; e++) {
            const int32_t *row = replicas + ((size_t)l * (size_t)E + (size_t)e) * (size_t)width;
            int32_t n = 0;
            for (int32_t j = 0; j < width; j++) {
                if (row[j] < -1 || row[j] >= P)
                    return epxi_fail(err, EPX_ERR_INVALID_MAP,
                                     "replica list of layer %d, expert %d holds slot %d, "
                                     "outside [0, %d) (P = %d): is the map for this shape?",
                                     l, e, row[j], P, P);
                n += row[j] >= 0;
            }
            if (n == 0)
                return epxi_fail(err, EPX_ERR_INVALID_MAP,
                                 "logical expert %d of layer %d has no replica: every expert "
                                 "needs at least one slot",
                                 e, l);
        }
    return EPX_OK;
}

epx_status epx_sglang_table_rule(const char *release, epx_sglang_rule *rule, int32_t *newer,
                                 epx_error *err) {
    long v[4];
    bool is_newer = false;
    if (rule == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "epx_sglang_table_rule: rule is required");
    EPX_TRY(epxi_sglang_release(release, v, &is_newer, err));
    static const long r053[4] = {0, 5, 3, 0}, r054p2[4] = {0, 5, 4, 2}, r0516[4] = {0, 5, 16, 0};
    if (epxi_release_cmp(v, r053) < 0)
        *rule = EPX_SGLANG_RULE_0_5_2;
    else if (epxi_release_cmp(v, r054p2) < 0)
        *rule = EPX_SGLANG_RULE_0_5_3;
    else if (epxi_release_cmp(v, r0516) < 0)
        *rule = EPX_SGLANG_RULE_0_5_4_POST2;
    else
        *rule = EPX_SGLANG_RULE_0_5_16;
    if (newer) *newer = is_newer;
    return EPX_OK;
}

/* Where each candidate stands, for every rank's nearest replica at once:
 * the first candidate on each GPU and on each node, and each node's count
 * of candidates. All -1 / 0 between entries; an entry sets and clears only
 * what its candidates touch. */
typedef struct sg_near {
    int32_t *on_gpu, *on_node, *node_n; /* [G], [N], [N] */
} sg_near;

/* part[g] = epxi_sg_nearest(q, g, cand, n) for every rank g, in O(G + n)
 * instead of O(G n): at 1,024 GPUs with 128 replicas of each expert on one
 * node (0.5.16's rule then leaves most ranks without a nearest replica)
 * the scan took 45 s a table. Returns how many ranks have none. */
static int32_t sg_nearest_all(const epxi_sg_geom *q, int32_t G, const int32_t *cand, int32_t n,
                              int32_t *part, const sg_near *t) {
    if (q->rule >= EPX_SGLANG_RULE_0_5_4_POST2 && n == 1) {
        for (int32_t g = 0; g < G; g++) part[g] = cand[0];
        return 0;
    }
    for (int32_t j = n - 1; j >= 0; j--) { /* backwards: the first in list order stays */
        t->on_gpu[cand[j] / q->per_gpu] = cand[j];
        t->on_node[cand[j] / q->per_node] = cand[j];
        t->node_n[cand[j] / q->per_node]++;
    }
    int32_t k = 0;
    for (int32_t g = 0; g < G; g++) {
        int32_t node = g / q->gpus_per_node, p = t->on_gpu[g];
        if (p < 0 && q->rule != EPX_SGLANG_RULE_0_5_2 &&
            !(q->rule == EPX_SGLANG_RULE_0_5_16 && t->node_n[node] == n))
            p = t->on_node[node];
        k += (part[g] = p) < 0;
    }
    for (int32_t j = 0; j < n; j++) {
        t->on_gpu[cand[j] / q->per_gpu] = -1;
        t->on_node[cand[j] / q->per_node] = -1;
        t->node_n[cand[j] / q->per_node] = 0;
    }
    return k;
}

/* One (layer, expert) of SGLang's table over the candidates cand[0..n):
 * the no-draw choices, then _fair_choices for the rest. part [G] gets every
 * rank's replica. */
static void sg_entry(const epxi_sg_geom *q, int32_t G, epxi_pyrandom *rng, int32_t *cand, int32_t n,
                     int32_t *part, int32_t *ans, void *scratch, const sg_near *near) {
    int32_t k = sg_nearest_all(q, G, cand, n, part, near);
    if (k == 0) return; /* _fair_choices(k = 0) draws nothing */
    /* _fair_choices(cand, k): cand * q + sample(cand, r), shuffled */
    int32_t quo = k / n, rem = k % n, m = 0;
    for (int32_t i = 0; i < quo; i++)
        for (int32_t j = 0; j < n; j++) ans[m++] = cand[j];
    epxi_pyrandom_sample(rng, cand, (size_t)n, (size_t)rem, ans + m, scratch);
    m += rem;
    epxi_pyrandom_shuffle(rng, ans, (size_t)m);
    for (int32_t g = 0, i = 0; g < G; g++)
        if (part[g] < 0) part[g] = ans[i++];
}

/* Scratch of one pass over SGLang's table: the candidates, every rank's
 * choice, the fair choices, the nearest-replica tables and sample()'s own. */
typedef struct sg_scratch {
    int32_t *cand, *part, *ans;
    sg_near near;
    void *sample;
} sg_scratch;

static size_t sg_scratch_bytes(int32_t G, int32_t width) {
    return (2 * (size_t)width + 5 * (size_t)G) * sizeof(int32_t) +
           epxi_pyrandom_sample_scratch_bytes((size_t)width);
}

/* Carved from mem (sg_scratch_bytes of it); the nearest-replica tables
 * set to empty (nodes <= G: G entries each suffice). */
static sg_scratch sg_scratch_at(void *mem, int32_t G, int32_t width) {
    sg_scratch w;
    w.cand = mem;
    w.part = w.cand + width;
    w.ans = w.part + G;
    w.near.on_gpu = w.ans + G + width;
    w.near.on_node = w.near.on_gpu + G;
    w.near.node_n = w.near.on_node + G;
    w.sample = w.near.node_n + G;
    for (int32_t g = 0; g < G; g++) w.near.on_gpu[g] = w.near.on_node[g] = -1, w.near.node_n[g] = 0;
    return w;
}

/* One pass over SGLang's table, one generator from `seed`. cut_rank < 0:
 * the lists as given, every rank's row written. cut_rank = r
 * (init_by_mapping from 0.5.4.post2): rank r's lists cut to its nearest
 * replica, and only its row kept, as every SGLang rank computes the whole
 * table from its own lists. A lone candidate (from 0.5.4.post2) is every
 * rank's choice and draws nothing, so it skips the per-rank scan: with the
 * cut that is most entries. */
static void sglang_pass(const epx_shape *s, const int32_t *replicas, int32_t width, uint64_t seed,
                        epx_sglang_rule rule, int32_t cut_rank, int32_t *out, const sg_scratch *w) {
    int32_t L = s->num_layers, E = s->num_logical_experts, G = s->num_gpus;
    epxi_sg_geom q = epxi_sg_geom_of(s, rule);
    size_t LE = (size_t)L * (size_t)E;
    const bool lone_free = rule >= EPX_SGLANG_RULE_0_5_4_POST2;
    epxi_pyrandom rng;
    epxi_pyrandom_seed(&rng, seed);
    for (int32_t l = 0; l < L; l++)
        for (int32_t e = 0; e < E; e++) {
            const int32_t *row = replicas + ((size_t)l * (size_t)E + (size_t)e) * (size_t)width;
            int32_t n = 0;
            for (int32_t j = 0; j < width; j++)
                if (row[j] >= 0) w->cand[n++] = row[j];
            if (cut_rank >= 0) { /* _compute_logical_to_all_physical_map's cut */
                int32_t near = epxi_sg_nearest(&q, cut_rank, w->cand, n);
                if (near >= 0) w->cand[0] = near, n = 1;
            }
            size_t at = (size_t)l * (size_t)E + (size_t)e;
            if (lone_free && n == 1) {
                if (cut_rank >= 0)
                    out[(size_t)cut_rank * LE + at] = w->cand[0];
                else
                    for (int32_t g = 0; g < G; g++) out[(size_t)g * LE + at] = w->cand[0];
                continue;
            }
            sg_entry(&q, G, &rng, w->cand, n, w->part, w->ans, w->sample, &w->near);
            if (cut_rank >= 0)
                out[(size_t)cut_rank * LE + at] = w->part[cut_rank];
            else
                for (int32_t g = 0; g < G; g++) out[(size_t)g * LE + at] = w->part[g];
        }
}

/* The per-rank passes of a cut table, shared by the threads (epxi_parallel):
 * thread t runs ranks t, t + n, ...; rows of different ranks never overlap,
 * so threads write `out` without locks. Passes ended are counted across the
 * threads; only thread 0, which epxi_parallel runs on the calling thread,
 * tells `progress`, so the callback is never called concurrently. */
typedef struct sg_job {
    const epx_shape *s;
    const int32_t *replicas;
    int32_t width;
    uint64_t seed;
    epx_sglang_rule rule;
    int32_t *out;
    uint8_t *failed; /* [threads]: out of memory for its scratch */
    epx_progress_fn progress;
    void *progress_user;
    atomic_int passes_done;
} sg_job;

/* Passes first, first + step, ... of a cut table, with their own scratch. */
static void sg_run(void *arg, int32_t first, int32_t step) {
    sg_job *j = arg;
    void *mem = calloc(1, sg_scratch_bytes(j->s->num_gpus, j->width));
    if (mem == NULL) {
        j->failed[first] = 1;
        return;
    }
    sg_scratch w = sg_scratch_at(mem, j->s->num_gpus, j->width);
    for (int32_t r = first; r < j->s->num_gpus; r += step) {
        sglang_pass(j->s, j->replicas, j->width, j->seed, j->rule, r, j->out, &w);
        int done = atomic_fetch_add(&j->passes_done, 1) + 1;
        /* the last call (done = G) comes from sglang_table, after every pass */
        if (first == 0 && j->progress && done < j->s->num_gpus)
            j->progress(j->progress_user, "ranks computed", done, j->s->num_gpus);
    }
    free(mem);
}

/* SGLang's table. With the cut (init_by_mapping, >= 0.5.4.post2) rank r's
 * row comes from a pass over rank r's cut lists: G passes of G ranks each,
 * spread over threads and told to o->progress (~8 s on one core at 256
 * GPUs x 61 layers x 256 experts, growing with G squared: minutes at 1,024;
 * a table with no cut takes one pass). */
static epx_status sglang_table(const epx_shape *s, const int32_t *replicas, int32_t width,
                               const epx_table_opts *o, epx_sglang_rule rule, int32_t *out,
                               const sg_scratch *w, epx_error *err) {
    int32_t G = s->num_gpus;
    if (!(o->init_by_mapping != 0 && rule >= EPX_SGLANG_RULE_0_5_4_POST2)) {
        sglang_pass(s, replicas, width, o->seed, rule, -1, out, w);
        return EPX_OK;
    }
    if (o->rank_only) { /* one rank's row: its own pass alone */
        sglang_pass(s, replicas, width, o->seed, rule, o->rank, out, w);
        return EPX_OK;
    }
    int32_t nt = 1;
    EPX_TRY(epxi_threads(G, &nt, err));
    uint8_t failed_of[64] = {0};
    sg_job job = {.s = s,
                  .replicas = replicas,
                  .width = width,
                  .seed = o->seed,
                  .rule = rule,
                  .out = out,
                  .failed = failed_of,
                  .progress = o->progress,
                  .progress_user = o->progress_user}; /* passes_done 0 */
    epxi_parallel(nt, sg_run, &job);
    int failed = 0;
    for (int32_t t = 0; t < nt; t++) failed |= failed_of[t];
    if (failed)
        return epxi_fail(err, EPX_ERR_NOMEM,
                         "out of memory for the per-rank passes of SGLang's cut dispatch table");
    if (o->progress) o->progress(o->progress_user, "ranks computed", G, G);
    return EPX_OK;
}

/* Experts by load, heaviest first, ties by lower id (a total order, so
 * qsort's instability cannot show). */
typedef struct expert_key {
    double load;
    int32_t id;
} expert_key;

static int heavier_first(const void *a, const void *b) {
    const expert_key *x = a, *y = b;
    if (x->load != y->load) return x->load > y->load ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

typedef struct epx_scratch {
    double *expected;  /* [G] expected load of each GPU in the current layer */
    double *actual;    /* [G] load the table sends it so far                 */
    expert_key *order; /* [E] experts, heaviest first                       */
    int32_t *cand;     /* [width] valid replicas of one expert               */
    int32_t *chosen;   /* [width] ranks that chose each of them              */
    double *target;    /* [width] ranks each of them should get (G x share)  */
} epx_scratch;

/* The share of its expert's tokens slot p should take: its weight over the
 * expert's total, or an even split when there are no weights (or all 0). */
static double replica_share(const double *weights, int32_t l, int32_t P, int32_t p, double wsum,
                            int32_t n) {
    if (weights && wsum > 0.0) return weights[(size_t)l * (size_t)P + (size_t)p] / wsum;
    return 1.0 / n;
}

/* Whether replica j is a better choice than replica k (k < 0: none yet):
 * further below its share of ranks, then its GPU further below the load
 * expected there, then earlier in the list. */
static bool better(const epx_scratch *w, int32_t j, int32_t k, int32_t per) {
    if (k < 0) return true;
    double rj = w->chosen[j] - w->target[j], rk = w->chosen[k] - w->target[k];
    if (rj != rk) return rj < rk;
    int32_t gj = w->cand[j] / per, gk = w->cand[k] / per;
    return w->actual[gj] - w->expected[gj] < w->actual[gk] - w->expected[gk];
}

static void epx_table(const epx_shape *s, const int32_t *replicas, int32_t width,
                      const double *load_all, const double *weights, int32_t *out, epx_scratch *w,
                      double *unit_load) {
    int32_t L = s->num_layers, E = s->num_logical_experts, G = s->num_gpus;
    int32_t P = s->num_physical_experts, per = P / G, gpn = G / s->num_nodes;
    size_t LE = (size_t)L * (size_t)E;
#define OUT(g, l, e) out[(size_t)(g)*LE + (size_t)(l) * (size_t)E + (size_t)(e)]
    for (int32_t l = 0; l < L; l++) {
        const double *load = load_all ? load_all + (size_t)l * (size_t)E : unit_load;
        for (int32_t g = 0; g < G; g++) w->expected[g] = w->actual[g] = 0.0;
        /* Pass 1: every choice that has one candidate is committed first
         * (a replica on the rank's own GPU, the only one on its node, the
         * only one at all), so the load the flexible choices even out is
         * known before any of them is made. With weights, also the load the
         * placement expects each GPU to carry. */
        for (int32_t e = 0; e < E; e++) {
            const int32_t *row = replicas + ((size_t)l * (size_t)E + (size_t)e) * (size_t)width;
            int32_t n = 0;
            double wsum = 0.0;
            for (int32_t j = 0; j < width; j++)
                if (row[j] >= 0) {
                    w->cand[n++] = row[j];
                    if (weights) wsum += weights[(size_t)l * (size_t)P + (size_t)row[j]];
                }
            for (int32_t j = 0; j < n; j++)
                w->expected[w->cand[j] / per] +=
                    load[e] * replica_share(weights, l, P, w->cand[j], wsum, n);
            for (int32_t g = 0; g < G; g++) OUT(g, l, e) = -1;
            for (int32_t j = n - 1; j >= 0; j--) OUT(w->cand[j] / per, l, e) = w->cand[j];
            for (int32_t g = 0; g < G; g++) {
                int32_t only = OUT(g, l, e) >= 0 ? OUT(g, l, e) : n == 1 ? w->cand[0] : -1;
                if (only < 0) continue; /* a flexible choice, made in pass 2 */
                OUT(g, l, e) = only;
                w->actual[only / per] += load[e] / G;
            }
        }
        /* Pass 2: the flexible choices, heaviest expert first. Each rank goes
         * to the replica furthest below its share of the expert's ranks
         * (G x its weight share: about G / n each, as SGLang's fair choices
         * give, but deterministic); among equals, to the one whose GPU is
         * furthest below the load the placement expects it to carry, which
         * steers the rounding where the load is known. A replica on the
         * rank's own node is taken while that keeps it within half a rank
         * of its share, so traffic stays on the node without piling an
         * expert onto the node's replicas. */
        for (int32_t e = 0; e < E; e++) w->order[e] = (expert_key){load[e], e};
        qsort(w->order, (size_t)E, sizeof *w->order, heavier_first);
        for (int32_t oi = 0; oi < E; oi++) {
            int32_t e = w->order[oi].id, n = 0;
            const int32_t *row = replicas + ((size_t)l * (size_t)E + (size_t)e) * (size_t)width;
            double wsum = 0.0;
            for (int32_t j = 0; j < width; j++)
                if (row[j] >= 0) {
                    w->chosen[n] = 0;
                    w->cand[n++] = row[j];
                    if (weights) wsum += weights[(size_t)l * (size_t)P + (size_t)row[j]];
                }
            for (int32_t j = 0; j < n; j++)
                w->target[j] = G * replica_share(weights, l, P, w->cand[j], wsum, n);
            for (int32_t g = 0; g < G; g++)
                for (int32_t j = 0; j < n; j++) w->chosen[j] += OUT(g, l, e) == w->cand[j];
            for (int32_t g = 0; g < G; g++) {
                if (OUT(g, l, e) >= 0) continue;
                int32_t best = -1, best_local = -1;
                for (int32_t j = 0; j < n; j++) {
                    if (better(w, j, best, per)) best = j;
                    if (w->cand[j] / per / gpn == g / gpn && better(w, j, best_local, per))
                        best_local = j;
                }
                if (best_local >= 0 && w->chosen[best_local] + 1 - w->target[best_local] <= 0.5)
                    best = best_local;
                OUT(g, l, e) = w->cand[best];
                w->chosen[best]++;
                w->actual[w->cand[best] / per] += load[e] / G;
            }
        }
    }
#undef OUT
}

static epx_status check_nonneg(const double *v, size_t n, const char *what, epx_error *err) {
    for (size_t i = 0; i < n; i++)
        if (!(v[i] >= 0.0) || !isfinite(v[i]))
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "%s[%zu] is %g: entries must be finite and >= 0", what, i, v[i]);
    return EPX_OK;
}

epx_status epx_dispatch_table_compute(const epx_shape *shape, const int32_t *replicas,
                                      int32_t width, const epx_table_opts *opts, int32_t *out,
                                      epx_error *err) {
    epx_table_opts defaults = EPX_TABLE_OPTS_INIT;
    if (opts == NULL) opts = &defaults;
    if (shape == NULL || replicas == NULL || out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_dispatch_table_compute: shape, replicas and out are required");
    EPX_TRY(epxi_check_version(opts->version, EPX_TABLE_OPTS_VERSION, "epx_table_opts",
                               "EPX_TABLE_OPTS_INIT", err));
    EPX_TRY(epx_shape_check(shape, err));
    if (width < 1)
        return epxi_fail(err, EPX_ERR_SHAPE, "replica map width is %d: it must be >= 1", width);
    if (opts->algorithm != EPX_TABLE_SGLANG && opts->algorithm != EPX_TABLE_EPX)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "table algorithm %d is not EPX_TABLE_SGLANG (0) or EPX_TABLE_EPX (1)",
                         (int)opts->algorithm);
    if (opts->algorithm == EPX_TABLE_SGLANG && (opts->expected_load || opts->replica_weights))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "expected_load and replica_weights are used by EPX_TABLE_EPX only; "
                         "SGLang's table ignores load, so pass NULL or choose EPX_TABLE_EPX");
    epx_sglang_rule rule = EPX_SGLANG_RULE_0_5_16;
    if (opts->algorithm == EPX_TABLE_SGLANG)
        EPX_TRY(epx_sglang_table_rule(opts->sglang_version ? opts->sglang_version
                                                           : EPX_SGLANG_DEFAULT_VERSION,
                                      &rule, NULL, err));
    int32_t L = shape->num_layers, E = shape->num_logical_experts, G = shape->num_gpus;
    int32_t P = shape->num_physical_experts;
    if (opts->rank_only && (opts->rank < 0 || opts->rank >= G))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_table_opts.rank %d is outside [0, %d) (num_gpus %d): give a rank "
                         "of the table, or rank_only = 0 for every rank",
                         opts->rank, G, G);
    EPX_TRY(epxi_table_check_replicas(shape, replicas, width, err));
    if (opts->expected_load)
        EPX_TRY(epxi_check_loads(opts->expected_load, (size_t)L * (size_t)E, "expected_load", err));
    if (opts->replica_weights)
        EPX_TRY(check_nonneg(opts->replica_weights, (size_t)L * (size_t)P, "replica_weights", err));

    /* One block of scratch, so every path frees one pointer: the doubles and
     * expert keys first (8-byte aligned), then the int32 arrays. SGLang's
     * fair choices need at most G entries (k <= G), sample() its own. */
    size_t nw = (size_t)width, ng = (size_t)G, ne = (size_t)E;
    size_t bytes =
        (2 * ng + ne + nw) * sizeof(double) + ne * sizeof(expert_key) + sg_scratch_bytes(G, width);
    unsigned char *mem = epxi_calloc(bytes, 1, "dispatch table scratch", err);
    if (mem == NULL) return err ? err->status : EPX_ERR_NOMEM;
    double *dbl = (double *)mem;
    expert_key *keys = (expert_key *)(dbl + 2 * ng + ne + nw);
    int32_t *ip = (int32_t *)(keys + ne);
    if (opts->algorithm == EPX_TABLE_SGLANG) {
        sg_scratch w = sg_scratch_at(ip, G, width);
        epx_status st = sglang_table(shape, replicas, width, opts, rule, out, &w, err);
        free(mem);
        return st;
    } else {
        epx_scratch w = {dbl, dbl + ng, keys, ip, ip + nw, dbl + 2 * ng + ne};
        double *unit = dbl + 2 * ng;
        for (size_t e = 0; e < ne; e++) unit[e] = 1.0;
        epx_table(shape, replicas, width, opts->expected_load, opts->replica_weights, out, &w,
                  unit);
    }
    free(mem);
    return EPX_OK;
}

epx_status epx_dispatch_table_from_layout(const epx_layout *layout, const epx_table_opts *opts,
                                          int32_t *out, epx_error *err) {
    if (layout == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_dispatch_table_from_layout: layout is NULL");
    int32_t width = 0;
    const int32_t *l2p = epx_layout_logical_to_all_physical(layout, &width);
    epx_table_opts o = EPX_TABLE_OPTS_INIT;
    if (opts) {
        EPX_TRY(epxi_check_version(opts->version, EPX_TABLE_OPTS_VERSION, "epx_table_opts",
                                   "EPX_TABLE_OPTS_INIT", err));
        o = *opts;
    }
    o.init_by_mapping = 1; /* SGLang cuts the lists of a mapping */
    return epx_dispatch_table_compute(epx_layout_shape(layout), l2p, width, &o, out, err);
}

epx_status epx_dispatch_table_gpu_load(const epx_shape *shape, const int32_t *table,
                                       const double *load, double *gpu_load, epx_error *err) {
    if (shape == NULL || table == NULL || load == NULL || gpu_load == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_dispatch_table_gpu_load: every argument is required");
    EPX_TRY(epx_shape_check(shape, err));
    int32_t L = shape->num_layers, E = shape->num_logical_experts, G = shape->num_gpus;
    int32_t P = shape->num_physical_experts, per = P / G;
    size_t LE = (size_t)L * (size_t)E;
    EPX_TRY(epxi_check_loads(load, LE, "load", err));
    for (size_t i = 0; i < (size_t)G * LE; i++) /* first: an error leaves gpu_load as it was */
        if (table[i] < 0 || table[i] >= P)
            return epxi_fail(err, EPX_ERR_INVALID_MAP,
                             "table[%zu][%zu][%zu] = %d is outside [0, %d)", i / LE,
                             (i % LE) / (size_t)E, i % (size_t)E, table[i], P);
    memset(gpu_load, 0, (size_t)L * (size_t)G * sizeof *gpu_load);
    for (int32_t r = 0; r < G; r++)
        for (int32_t l = 0; l < L; l++)
            for (int32_t e = 0; e < E; e++) {
                int32_t p = table[(size_t)r * LE + (size_t)l * (size_t)E + (size_t)e];
                gpu_load[(size_t)l * (size_t)G + (size_t)(p / per)] +=
                    load[(size_t)l * (size_t)E + (size_t)e] / G;
            }
    return EPX_OK;
}
