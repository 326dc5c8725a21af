/*
 * execute.c - run a migration plan over a communicator, chunk of layers by
 * chunk of layers, so that a failure never leaves a layer half moved.
 *
 * Everything every rank needs to know about the others comes from the plan,
 * which all ranks share: who sends which block to whom and in which order.
 * So each all-to-all is laid out without exchanging counts first. Per
 * chunk, on rank r (GPU g):
 *
 *   staging = [recv blocks, grouped by source rank] [relay blocks, grouped
 *             by source rank] [local copies, second copies, loads] [send pack]
 *
 * Within a group blocks are ordered by (layer, slot), which is also the
 * order in which the sender packs them, so block i of a group is the same
 * transfer on both sides. The send pack is reused by the relay round: a
 * relay's sender forwards the block it received in the first round from its
 * own staging.
 *
 * Trust: a block is committed only if its checksum equals the checksum its
 * first sender computed over the old weights (shared through the first
 * all-reduce of the chunk) and every other rank reports the same for all of
 * its blocks (the vote, the chunk's last all-reduce). The commit itself is
 * memcpy and an in-place layout update: it cannot fail.
 */
#include "migrate_internal.h"
#include "epx_comm.h"

#include <string.h>

#define CHECK_SEED 0x6570785f6d696772ull /* "epx_migr" */
#define VOTE_COLS 4                      /* code, layer, slot, source rank */

enum { VOTE_OK = 0, VOTE_INPUT = 1, VOTE_CORRUPT = 2, VOTE_LOAD = 3 };

typedef struct {
    const epx_migration *m;
    epx_comm *comm;
    int32_t P, G, spg, L, R, me, gpu;
    const int32_t *gpu_of_rank; /* [R] */
    const int32_t *rank_of_gpu; /* [G], -1 = not in the communicator */
    size_t B, slot_stride, layer_stride;
    unsigned char *weights, *staging;
    const epx_migrate_exec_opts *opts;
    /* the chunk */
    int32_t l0, l1;
    int32_t *stage_of; /* [Lc * spg] own slot -> staging block, -1 = none */
    int32_t nstage;    /* blocks staged */
    int32_t nsend_a, nsend_b;
    int64_t *sc, *sd, *rc, *rd; /* [R] */
    int64_t *rc_b;              /* [R] relay receive counts */
    int64_t *vote;              /* [R * VOTE_COLS + Lc * P] */
    uint8_t *have_sum;          /* [Lc * P] */
    epx_migrate_result *res;
} xctx;

static const uint8_t *kinds_of(const xctx *x, int32_t l) {
    return x->m->kinds + (size_t)l * (size_t)x->P;
}
static const int32_t *srcs_of(const xctx *x, int32_t l) {
    return x->m->src + (size_t)l * (size_t)x->P;
}
static unsigned char *slot_ptr(const xctx *x, int32_t l, int32_t local) {
    return x->weights + (size_t)l * x->layer_stride + (size_t)local * x->slot_stride;
}
static unsigned char *stage_ptr(const xctx *x, int32_t i) {
    return x->staging ? x->staging + (size_t)i * x->B : NULL; /* NULL: nothing staged */
}
static int32_t *stage_idx(const xctx *x, int32_t l, int32_t p) {
    return &x->stage_of[(size_t)(l - x->l0) * (size_t)x->spg + (size_t)(p % x->spg)];
}
static int64_t *table(const xctx *x, int32_t l, int32_t p) {
    return &x->vote[(size_t)x->R * VOTE_COLS + (size_t)(l - x->l0) * (size_t)x->P + (size_t)p];
}

/* Lay out the chunk's staging on this GPU and count what every peer sends
 * and receives. */
static void layout_chunk(xctx *x) {
    const int32_t g = x->gpu, spg = x->spg, R = x->R;
    memset(x->rc, 0, (size_t)R * sizeof *x->rc);
    memset(x->rc_b, 0, (size_t)R * sizeof *x->rc_b);
    for (size_t i = 0; i < (size_t)(x->l1 - x->l0) * (size_t)spg; i++) x->stage_of[i] = -1;
    x->nstage = x->nsend_a = x->nsend_b = 0;
    if (g < 0 || x->m->failed[g]) return;
    /* counts per source rank, then offsets, then indices in (layer, slot) order */
    for (int32_t l = x->l0; l < x->l1; l++)
        for (int32_t p = g * spg; p < (g + 1) * spg; p++) {
            const int32_t k = kinds_of(x, l)[p], h = srcs_of(x, l)[p] / spg;
            if (k == EPX_MOVE_RECV)
                x->rc[x->rank_of_gpu[h]]++;
            else if (k == EPX_MOVE_RELAY)
                x->rc_b[x->rank_of_gpu[h]]++;
        }
    int32_t off = 0;
    for (int32_t r = 0; r < R; r++) {
        x->rd[r] = off;
        off += (int32_t)x->rc[r];
    }
    int32_t relay0 = off;
    for (int32_t r = 0; r < R; r++) off += (int32_t)x->rc_b[r];
    int32_t rest = off;
    /* sd is free until packing: use it as the relay cursor */
    int32_t b = relay0;
    for (int32_t r = 0; r < R; r++) {
        x->sd[r] = b;
        b += (int32_t)x->rc_b[r];
    }
    for (int32_t l = x->l0; l < x->l1; l++)
        for (int32_t p = g * spg; p < (g + 1) * spg; p++) {
            const int32_t k = kinds_of(x, l)[p], h = srcs_of(x, l)[p] / spg;
            if (k == EPX_MOVE_RECV)
                *stage_idx(x, l, p) = (int32_t)x->rd[x->rank_of_gpu[h]]++;
            else if (k == EPX_MOVE_RELAY)
                *stage_idx(x, l, p) = (int32_t)x->sd[x->rank_of_gpu[h]]++;
            else if (k != EPX_MOVE_KEEP)
                *stage_idx(x, l, p) = rest++;
        }
    x->nstage = rest;
    /* what this GPU sends in each round */
    for (int32_t l = x->l0; l < x->l1; l++) {
        const uint8_t *kind = kinds_of(x, l);
        const int32_t *src = srcs_of(x, l);
        for (int32_t p = 0; p < x->P; p++) {
            if (p / spg == g || src[p] < 0 || src[p] / spg != g) continue;
            if (kind[p] == EPX_MOVE_RECV)
                x->nsend_a++;
            else if (kind[p] == EPX_MOVE_RELAY)
                x->nsend_b++;
        }
    }
}

/* Displacements of the receive groups of a round (blocks from rank r start
 * at rd[r]); relay groups start after all first-round blocks. */
static void recv_displs(xctx *x, const int64_t *counts, int64_t start) {
    int64_t off = start;
    for (int32_t r = 0; r < x->R; r++) {
        x->rd[r] = off;
        off += counts[r];
    }
}

/* Pack the blocks this GPU sends in a round, grouped by destination rank.
 * Round A sends old weights (the source slot); round B forwards a block
 * received in round A (the relay's source slot is a RECV slot here). */
static void pack(xctx *x, bool relay) {
    const int32_t g = x->gpu, spg = x->spg;
    unsigned char *out = stage_ptr(x, x->nstage);
    int64_t n = 0;
    for (int32_t r = 0; r < x->R; r++) {
        const int32_t h = x->gpu_of_rank[r];
        x->sd[r] = n;
        x->sc[r] = 0;
        if (h == g || g < 0) continue;
        for (int32_t l = x->l0; l < x->l1; l++) {
            const uint8_t *kind = kinds_of(x, l);
            const int32_t *src = srcs_of(x, l);
            for (int32_t p = h * spg; p < (h + 1) * spg; p++) {
                if (kind[p] != (relay ? EPX_MOVE_RELAY : EPX_MOVE_RECV) || src[p] / spg != g)
                    continue;
                const unsigned char *from =
                    relay ? stage_ptr(x, *stage_idx(x, l, src[p])) : slot_ptr(x, l, src[p] % spg);
                memcpy(out + (size_t)n * x->B, from, x->B);
                n++;
                x->sc[r]++;
            }
        }
    }
    x->res->bytes_sent += (uint64_t)n * (uint64_t)x->B;
}

/* The checksum a staged slot must have: that of the old block it copies. */
static uint64_t expected_sum(const xctx *x, int32_t l, int32_t p) {
    const uint8_t *kind = kinds_of(x, l);
    const int32_t *src = srcs_of(x, l);
    for (;;) {
        const int32_t k = kind[p];
        if (k == EPX_MOVE_RECV || k == EPX_MOVE_LOCAL) return (uint64_t)*table(x, l, src[p]);
        if (k == EPX_MOVE_LOAD)
            return epx_checksum64(stage_ptr(x, *stage_idx(x, l, p)), x->B, CHECK_SEED);
        p = src[p]; /* RELAY: the RECV it forwards; RECV_COPY: the slot it copies */
    }
}

static void set_vote(xctx *x, int64_t code, int32_t l, int32_t p, int32_t source) {
    int64_t *row = x->vote + (size_t)x->me * VOTE_COLS;
    if (row[0] != VOTE_OK) return; /* keep the first */
    row[0] = code;
    row[1] = l;
    row[2] = p;
    row[3] = source;
}

/* Local inputs of the chunk, checked before anything moves. */
static epx_status precheck(xctx *x, const epx_layout *layout, size_t staging_bytes,
                           epx_error *err) {
    const int32_t *have = epx_layout_physical_to_logical(layout);
    for (int32_t l = x->l0; l < x->l1; l++)
        for (int32_t p = 0; p < x->P; p++) {
            size_t i = (size_t)l * (size_t)x->P + (size_t)p;
            if (have[i] != x->m->current[i])
                return epxi_fail(err, EPX_ERR_INVALID_ARG,
                                 "rank %d: its layout holds expert %d in layer %d, slot %d, where "
                                 "the migration plan starts from expert %d: plan from the layout "
                                 "in service (or a chunk was committed before)",
                                 x->me, have[i], l, p, x->m->current[i]);
        }
    const size_t nsend = (size_t)(x->nsend_a > x->nsend_b ? x->nsend_a : x->nsend_b);
    const size_t need = ((size_t)x->nstage + nsend) * x->B;
    if (staging_bytes < need || (need > 0 && x->staging == NULL))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "rank %d: staging of %zu bytes is too small for layers %d-%d, which "
                         "need %zu: size it with epx_migration_staging_bytes",
                         x->me, staging_bytes, x->l0, x->l1 - 1, need);
    if (x->gpu >= 0 && !x->m->failed[x->gpu] && x->weights == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "rank %d: weights are NULL", x->me);
    if (x->opts->load == NULL)
        for (int32_t l = x->l0; l < x->l1; l++)
            for (int32_t s = 0; s < x->spg && x->gpu >= 0; s++)
                if (kinds_of(x, l)[x->gpu * x->spg + s] == EPX_MOVE_LOAD)
                    return epxi_fail(err, EPX_ERR_INVALID_ARG,
                                     "rank %d: layer %d, slot %d needs expert %d, which no live "
                                     "GPU holds: pass a loader (opts.load) to read it from the "
                                     "checkpoint",
                                     x->me, l, x->gpu * x->spg + s,
                                     epx_layout_physical_to_logical(
                                         x->m->layout)[(size_t)l * (size_t)x->P +
                                                       (size_t)(x->gpu * x->spg + s)]);
    return EPX_OK;
}

/* This rank's sources: checksums of the old blocks others (or its own local
 * copies) will read, into the table. */
static void source_sums(xctx *x) {
    const int32_t g = x->gpu, spg = x->spg;
    if (g < 0 || x->m->failed[g]) return;
    memset(x->have_sum, 0, (size_t)(x->l1 - x->l0) * (size_t)x->P);
    for (int32_t l = x->l0; l < x->l1; l++) {
        const uint8_t *kind = kinds_of(x, l);
        const int32_t *src = srcs_of(x, l);
        for (int32_t p = 0; p < x->P; p++) {
            if ((kind[p] != EPX_MOVE_RECV && kind[p] != EPX_MOVE_LOCAL) || src[p] / spg != g)
                continue;
            uint8_t *done = &x->have_sum[(size_t)(l - x->l0) * (size_t)x->P + (size_t)src[p]];
            if (*done) continue;
            *done = 1;
            uint64_t h = epx_checksum64(slot_ptr(x, l, src[p] % spg), x->B, CHECK_SEED);
            memcpy(table(x, l, src[p]), &h, sizeof h);
        }
    }
}

/* Local copies and loads into staging, then second copies, then the check
 * of every staged block. */
static epx_status local_work(xctx *x, epx_error *err) {
    const int32_t g = x->gpu, spg = x->spg;
    if (g < 0 || x->m->failed[g]) return EPX_OK;
    const int32_t *tgt = epx_layout_physical_to_logical(x->m->layout);
    for (int pass = 0; pass < 2; pass++)
        for (int32_t l = x->l0; l < x->l1; l++)
            for (int32_t p = g * spg; p < (g + 1) * spg; p++) {
                const int32_t k = kinds_of(x, l)[p], q = srcs_of(x, l)[p];
                unsigned char *dst =
                    *stage_idx(x, l, p) >= 0 ? stage_ptr(x, *stage_idx(x, l, p)) : NULL;
                if (pass == 0 && k == EPX_MOVE_LOCAL) {
                    memcpy(dst, slot_ptr(x, l, q % spg), x->B);
                } else if (pass == 0 && k == EPX_MOVE_LOAD) {
                    const int32_t e = tgt[(size_t)l * (size_t)x->P + (size_t)p];
                    epx_status st = x->opts->load(x->opts->load_user, l, e, dst, x->B, err);
                    if (st != EPX_OK) {
                        epxi_error_prefix(err, "rank %d: loading expert %d for layer %d, slot %d",
                                          x->me, e, l, p);
                        set_vote(x, VOTE_LOAD, l, p, -1);
                        return st;
                    }
                } else if (pass == 1 && k == EPX_MOVE_RECV_COPY) {
                    memcpy(dst, stage_ptr(x, *stage_idx(x, l, q)), x->B);
                } else {
                    continue;
                }
                x->res->bytes_local += x->B;
            }
    for (int32_t l = x->l0; l < x->l1; l++)
        for (int32_t p = g * spg; p < (g + 1) * spg; p++) {
            const int32_t k = kinds_of(x, l)[p];
            if (k == EPX_MOVE_KEEP || k == EPX_MOVE_LOAD) continue;
            const uint64_t want = expected_sum(x, l, p);
            const uint64_t got =
                epx_checksum64(stage_ptr(x, *stage_idx(x, l, p)), x->B, CHECK_SEED);
            if (got == want) continue;
            const int32_t q = srcs_of(x, l)[p];
            const int32_t from =
                (k == EPX_MOVE_RECV || k == EPX_MOVE_RELAY) ? x->rank_of_gpu[q / spg] : x->me;
            set_vote(x, VOTE_CORRUPT, l, p, from);
            return epxi_fail(err, EPX_ERR_COMM,
                             "rank %d: layer %d, slot %d (%s of expert %d from rank %d, slot %d) "
                             "arrived with checksum %016llx, expected %016llx",
                             x->me, l, p, epx_move_kind_name(k),
                             tgt[(size_t)l * (size_t)x->P + (size_t)p], from, q,
                             (unsigned long long)got, (unsigned long long)want);
        }
    return EPX_OK;
}

/* The first transfer this rank expects in a round: what a failed exchange
 * names. */
static void first_transfer(xctx *x, bool relay) {
    const int32_t g = x->gpu, spg = x->spg;
    if (g < 0) return;
    for (int32_t l = x->l0; l < x->l1; l++)
        for (int32_t p = g * spg; p < (g + 1) * spg; p++)
            if (kinds_of(x, l)[p] == (relay ? EPX_MOVE_RELAY : EPX_MOVE_RECV)) {
                x->res->failed_layer = l;
                x->res->failed_slot = p;
                x->res->failed_source = x->rank_of_gpu[srcs_of(x, l)[p] / spg];
                x->res->failed_rank = x->me;
                return;
            }
}

static epx_status exchange(xctx *x, bool relay, epx_error *err) {
    pack(x, relay);
    int64_t start = 0;
    if (relay)
        for (int32_t r = 0; r < x->R; r++) start += x->rc[r];
    const int64_t *counts = relay ? x->rc_b : x->rc;
    recv_displs(x, counts, start);
    /* Send and receive pointers must differ: with no blocks staged the send
     * pack starts where the receive area does, and Open MPI's non-blocking
     * collectives take equal pointers for MPI_IN_PLACE, which changes their
     * message schedule on that rank alone and deadlocks the exchange. An
     * empty side points at its own never-touched byte. */
    static unsigned char no_send[1], no_recv[1];
    int64_t nsend = 0, nrecv = 0;
    for (int32_t r = 0; r < x->R; r++) nsend += x->sc[r], nrecv += counts[r];
    epx_status st =
        epx_comm_alltoallv(x->comm, nsend ? stage_ptr(x, x->nstage) : no_send, x->sc, x->sd,
                           nrecv ? x->staging : no_recv, counts, x->rd, x->B, err);
    if (st != EPX_OK) {
        first_transfer(x, relay);
        epxi_error_prefix(err,
                          "migration not committed (layers %d-%d stay as they were): the %s "
                          "exchange failed on rank %d",
                          x->l0, x->l1 - 1, relay ? "relay" : "first", x->me);
        return st;
    }
    for (int32_t r = 0; r < x->R; r++) x->res->bytes_received += (uint64_t)counts[r] * x->B;
    return EPX_OK;
}

/* After an all-reduce of the votes: the first rank that reported trouble. */
static int32_t first_vote(const xctx *x) {
    for (int32_t r = 0; r < x->R; r++)
        if (x->vote[(size_t)r * VOTE_COLS] != VOTE_OK) return r;
    return -1;
}

static epx_status peer_failed(xctx *x, int32_t r, epx_status own, epx_error *err) {
    const int64_t *row = x->vote + (size_t)r * VOTE_COLS;
    x->res->failed_rank = r;
    if (row[0] == VOTE_CORRUPT || row[0] == VOTE_LOAD) {
        x->res->failed_layer = (int32_t)row[1];
        x->res->failed_slot = (int32_t)row[2];
        x->res->failed_source = (int32_t)row[3];
    }
    if (r == x->me && own != EPX_OK) {
        epxi_error_prefix(err, "migration not committed (layers %d-%d stay as they were)", x->l0,
                          x->l1 - 1);
        return own;
    }
    if (row[0] == VOTE_CORRUPT)
        return epxi_fail(err, EPX_ERR_COMM,
                         "migration not committed (layers %d-%d stay as they were): rank %d "
                         "received layer %lld, slot %lld from rank %lld with a wrong checksum",
                         x->l0, x->l1 - 1, r, (long long)row[1], (long long)row[2],
                         (long long)row[3]);
    if (row[0] == VOTE_LOAD)
        return epxi_fail(err, EPX_ERR_COMM,
                         "migration not committed (layers %d-%d stay as they were): rank %d "
                         "could not load the expert of layer %lld, slot %lld",
                         x->l0, x->l1 - 1, r, (long long)row[1], (long long)row[2]);
    return epxi_fail(err, EPX_ERR_INVALID_ARG,
                     "migration not started for layers %d-%d: rank %d refused its inputs (its "
                     "own error says why); nothing moved",
                     x->l0, x->l1 - 1, r);
}

static void commit(xctx *x, epx_layout *layout, uint8_t *mask) {
    const int32_t g = x->gpu, spg = x->spg;
    if (g >= 0 && !x->m->failed[g])
        for (int32_t l = x->l0; l < x->l1; l++)
            for (int32_t p = g * spg; p < (g + 1) * spg; p++)
                if (*stage_idx(x, l, p) >= 0)
                    memcpy(slot_ptr(x, l, p % spg), stage_ptr(x, *stage_idx(x, l, p)), x->B);
    memset(mask, 0, (size_t)x->L);
    memset(mask + x->l0, 1, (size_t)(x->l1 - x->l0));
    /* Same shape, checked before: cannot fail. */
    epx_layout_update(layout, x->m->layout, mask, NULL);
    x->res->layers_committed += x->l1 - x->l0;
}

static epx_status run_chunk(xctx *x, epx_layout *layout, size_t staging_bytes, uint8_t *mask,
                            epx_error *err) {
    const size_t tcells = (size_t)(x->l1 - x->l0) * (size_t)x->P;
    const size_t vcells = (size_t)x->R * VOTE_COLS;
    memset(x->vote, 0, (vcells + tcells) * sizeof *x->vote);
    layout_chunk(x);
    epx_error own = {0};
    epx_status ost = precheck(x, layout, staging_bytes, &own);
    if (ost != EPX_OK)
        set_vote(x, VOTE_INPUT, -1, -1, -1);
    else
        source_sums(x);
    epx_status st = epx_comm_allreduce_sum(x->comm, x->vote, x->vote, (int64_t)(vcells + tcells),
                                           EPX_DTYPE_I64, err);
    if (st != EPX_OK) {
        epxi_error_prefix(err, "migration not started for layers %d-%d", x->l0, x->l1 - 1);
        return st;
    }
    int32_t bad = first_vote(x);
    if (bad >= 0) {
        if (err != NULL && bad == x->me) *err = own;
        return peer_failed(x, bad, ost, err);
    }
    EPX_TRY(exchange(x, false, err));
    /* a relay round only when some rank relays in this chunk (all know) */
    bool relays = false;
    for (int32_t l = x->l0; l < x->l1 && !relays; l++)
        for (int32_t p = 0; p < x->P && !relays; p++) relays = kinds_of(x, l)[p] == EPX_MOVE_RELAY;
    if (relays) EPX_TRY(exchange(x, true, err));
    memset(x->vote, 0, vcells * sizeof *x->vote);
    ost = local_work(x, &own);
    st = epx_comm_allreduce_sum(x->comm, x->vote, x->vote, (int64_t)vcells, EPX_DTYPE_I64, err);
    if (st != EPX_OK) {
        epxi_error_prefix(err,
                          "migration not committed (layers %d-%d stay as they were): the vote "
                          "failed on rank %d",
                          x->l0, x->l1 - 1, x->me);
        return st;
    }
    bad = first_vote(x);
    if (bad >= 0) {
        if (err != NULL && bad == x->me) *err = own;
        return peer_failed(x, bad, ost, err);
    }
    commit(x, layout, mask);
    return EPX_OK;
}

/* Staging blocks and send pack of one GPU for layers [l0, l1). */
static void chunk_need(const epx_migration *m, int32_t g, int32_t l0, int32_t l1, size_t *blocks) {
    const int32_t P = m->shape.num_physical_experts, spg = P / m->shape.num_gpus;
    size_t staged = 0, sa = 0, sb = 0;
    for (int32_t l = l0; l < l1; l++) {
        const uint8_t *kind = m->kinds + (size_t)l * (size_t)P;
        const int32_t *src = m->src + (size_t)l * (size_t)P;
        for (int32_t p = 0; p < P; p++) {
            if (p / spg == g)
                staged += kind[p] != EPX_MOVE_KEEP && kind[p] != EPX_MOVE_DEAD;
            else if (src[p] >= 0 && src[p] / spg == g) {
                sa += kind[p] == EPX_MOVE_RECV;
                sb += kind[p] == EPX_MOVE_RELAY;
            }
        }
    }
    *blocks = staged + (sa > sb ? sa : sb);
}

epx_status epx_migration_staging_bytes(const epx_migration *m, int32_t gpu, int32_t chunk_layers,
                                       size_t *bytes, epx_error *err) {
    if (m == NULL || bytes == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "migration and bytes must not be NULL");
    const int32_t L = m->shape.num_layers;
    if (gpu < 0 || gpu >= m->shape.num_gpus || chunk_layers < 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "gpu (%d) must be in [0, %d) and chunk_layers (%d) >= 0 (0 = all layers)",
                         gpu, m->shape.num_gpus, chunk_layers);
    const int32_t step = chunk_layers == 0 || chunk_layers > L ? L : chunk_layers;
    size_t most = 0;
    for (int32_t l0 = 0; l0 < L; l0 += step) {
        size_t blocks = 0;
        chunk_need(m, gpu, l0, l0 + step < L ? l0 + step : L, &blocks);
        if (blocks > most) most = blocks;
    }
    if (!epxi_mul_size(most, m->stats.expert_bytes, bytes))
        return epxi_fail(err, EPX_ERR_OVERFLOW, "staging of %zu blocks of %zu bytes overflows",
                         most, m->stats.expert_bytes);
    return EPX_OK;
}

/* Map communicator ranks to GPUs: all GPUs, or the live ones in order. */
static epx_status map_ranks(const epx_migration *m, int32_t R, int32_t *gpu_of_rank,
                            int32_t *rank_of_gpu, epx_error *err) {
    const int32_t G = m->shape.num_gpus;
    int32_t live = 0;
    for (int32_t g = 0; g < G; g++) live += !m->failed[g];
    if (R != G && R != live)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "the communicator has %d ranks, but the plan is for %d GPUs (%d live): "
                         "use a communicator of all GPUs or of the live ones",
                         R, G, live);
    for (int32_t g = 0, r = 0; g < G; g++) {
        rank_of_gpu[g] = -1;
        if (R == G || !m->failed[g]) {
            rank_of_gpu[g] = r;
            gpu_of_rank[r++] = g;
        }
    }
    return EPX_OK;
}

epx_status epx_migration_execute(const epx_migration *m, struct epx_comm *comm, void *weights,
                                 epx_layout *layout, void *staging, size_t staging_bytes,
                                 const epx_migrate_exec_opts *opts, epx_migrate_result *result,
                                 epx_error *err) {
    epx_migrate_result local_res;
    epx_migrate_result *res = result ? result : &local_res;
    memset(res, 0, sizeof *res);
    res->failed_layer = res->failed_slot = res->failed_source = res->failed_rank = -1;
    if (m == NULL || comm == NULL || layout == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_migration_execute: migration, communicator and layout must not be "
                         "NULL");
    const epx_migrate_exec_opts defaults = EPX_MIGRATE_EXEC_OPTS_INIT;
    if (opts == NULL) opts = &defaults;
    EPX_TRY(epxi_check_version(opts->version, EPX_MIGRATE_EXEC_OPTS_VERSION,
                               "epx_migrate_exec_opts", "EPX_MIGRATE_EXEC_OPTS_INIT", err));
    if (opts->chunk_layers < 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "execution options: chunk_layers %d (want >= 0, 0 = all layers at "
                         "once)",
                         opts->chunk_layers);
    if (epx_comm_memory_kind(comm) != EPX_COMM_MEMORY_HOST)
        return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                         "communicator '%s' moves device buffers; migrations move host buffers "
                         "only so far: stage the weights through host memory and use an MPI "
                         "communicator",
                         epx_comm_name(comm));
    const epx_shape *sh = &m->shape, *ls = epx_layout_shape(layout);
    EPX_TRY(
        epxi_check_same_shape(ls, sh, "the layout (", ") is not of the plan's shape (", ")", err));
    const int32_t G = sh->num_gpus, P = sh->num_physical_experts, L = sh->num_layers;
    const int32_t R = epx_comm_size(comm), spg = P / G;
    const size_t B = m->stats.expert_bytes;
    const size_t slot_stride = opts->slot_stride ? opts->slot_stride : B;
    if (slot_stride < B)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "slot_stride (%zu) is below expert_bytes (%zu): slots would overlap",
                         slot_stride, B);
    const size_t layer_stride = opts->layer_stride ? opts->layer_stride : (size_t)spg * slot_stride;
    if (layer_stride < (size_t)(spg - 1) * slot_stride + B)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "layer_stride (%zu) is below the %d slots of a layer (%zu bytes): layers "
                         "would overlap",
                         layer_stride, spg, (size_t)(spg - 1) * slot_stride + B);
    const int32_t step = opts->chunk_layers == 0 || opts->chunk_layers > L ? L : opts->chunk_layers;

    epx_status st = EPX_OK;
    xctx x = {0};
    x.m = m;
    x.comm = comm;
    x.P = P, x.G = G, x.spg = spg, x.L = L, x.R = R, x.me = epx_comm_rank(comm);
    x.B = B, x.slot_stride = slot_stride, x.layer_stride = layer_stride;
    x.weights = weights;
    x.staging = staging;
    x.opts = opts;
    x.res = res;
    int32_t *ranks = epxi_calloc((size_t)R + (size_t)G, sizeof *ranks, "rank map", err);
    int64_t *counts = ranks ? epxi_calloc((size_t)R * 5, sizeof *counts, "counts", err) : NULL;
    x.stage_of =
        counts ? epxi_calloc((size_t)step * (size_t)spg, sizeof *x.stage_of, "staging map", err)
               : NULL;
    x.vote = x.stage_of ? epxi_calloc((size_t)R * VOTE_COLS + (size_t)step * (size_t)P,
                                      sizeof *x.vote, "vote", err)
                        : NULL;
    x.have_sum = x.vote ? epxi_calloc((size_t)step * (size_t)P, 1, "checksum marks", err) : NULL;
    uint8_t *mask = x.have_sum ? epxi_calloc((size_t)L, 1, "layer mask", err) : NULL;
    if (mask == NULL) {
        st = EPX_ERR_NOMEM;
        goto done;
    }
    x.gpu_of_rank = ranks;
    x.rank_of_gpu = ranks + R;
    EPX_TRY_GOTO(st, map_ranks(m, R, ranks, ranks + R, err), done);
    x.gpu = x.gpu_of_rank[x.me];
    x.sc = counts, x.sd = counts + R, x.rc = counts + 2 * R, x.rd = counts + 3 * R;
    x.rc_b = counts + 4 * R;
    for (int32_t l0 = 0; l0 < L; l0 += step) {
        x.l0 = l0;
        x.l1 = l0 + step < L ? l0 + step : L;
        EPX_TRY_GOTO(st, run_chunk(&x, layout, staging_bytes, mask, err), done);
    }
done:
    free(ranks);
    free(counts);
    free(x.stage_of);
    free(x.vote);
    free(x.have_sum);
    free(mask);
    return st;
}
