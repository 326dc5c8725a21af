/*
 * test_ep.c - EP dispatch/combine and the TP baseline on 1-4 ranks run as
 * threads in one process (tests/util/thread_comm.h), so the multi-rank
 * paths also run under ASan; the MPI tests (tests/mpi) repeat the same
 * cases over real processes.
 *
 * Oracles: EP with EPX_EP_COMBINE_TOPK is bitwise equal to the single-rank
 * reference epx_moe_forward; EPX_EP_COMBINE_RANK and TP are within a
 * rigorous reordering bound (n * eps * sum of |terms|); identity experts on
 * bf16 reproduce a locally computed expectation bit for bit in both modes;
 * injected faults and capacity overflows fail cleanly, on every rank.
 */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_case.h"
#include "thread_comm.h"

#define MAXR 4

/* One rank's batch and results. */
typedef struct rank_io {
    int64_t T;
    float *x, *w, *out, *ref;
    int32_t *ids, *slots;
    epx_status st;
    epx_error err;
} rank_io;

typedef struct ep_job {
    const mc_layer *L;
    int64_t Tmax;
    epx_ep_combine_mode mode;
    epx_ep_mode ep_mode;
    rank_io io[MAXR];
} ep_job;

static void ep_rank(epx_comm *comm, void *arg) {
    ep_job *j = arg;
    rank_io *io = &j->io[epx_comm_rank(comm)];
    io->st = mc_ep_forward(comm, j->L, j->Tmax, io->T, io->x, io->slots, io->w, j->mode, j->ep_mode,
                           io->out, &io->err);
}

/* Make ranks receive nothing: every slot off rank 0 moves to a rank-0
 * replica of its expert, or to -1 (and the id with it). */
static void all_to_rank0(const mc_layer *L, rank_io *io) {
    int32_t spr = L->P / L->R, K = L->cfg.top_k;
    for (int64_t i = 0; i < io->T * K; i++) {
        if (io->slots[i] < spr) continue;
        int32_t e = io->ids[i], to = -1;
        for (int32_t q = 0; q < L->nrep[e]; q++)
            if (L->reps[(size_t)e * L->P + q] < spr) to = L->reps[(size_t)e * L->P + q];
        io->slots[i] = to;
        if (to < 0) io->ids[i] = -1;
    }
}

static void free_io(rank_io *io) {
    free(io->x);
    free(io->w);
    free(io->out);
    free(io->ref);
    free(io->ids);
    free(io->slots);
}

static void make_io(tu_rng *r, const mc_layer *L, int64_t T, int32_t rank, rank_io *io) {
    int32_t H = L->cfg.hidden, K = L->cfg.top_k;
    memset(io, 0, sizeof *io);
    io->T = T;
    size_t n = (size_t)(T > 0 ? T : 1);
    io->x = malloc(n * (size_t)H * sizeof(float));
    io->out = malloc(n * (size_t)H * sizeof(float));
    io->ref = malloc(n * (size_t)H * sizeof(float));
    io->w = malloc(n * (size_t)K * sizeof(float));
    io->ids = malloc(n * (size_t)K * sizeof(int32_t));
    io->slots = malloc(n * (size_t)K * sizeof(int32_t));
    mc_batch(r, L, T, 1, io->x, io->ids, io->w);
    mc_slots(L, T, io->ids, rank, io->slots);
}

static void ep_random(epx_ep_combine_mode mode, epx_ep_mode ep_mode, int iters) {
    tu_rng rng = {tu_seed(ep_mode == EPX_EP_MODE_LOW_LATENCY ? 7011
                          : mode == EPX_EP_COMBINE_TOPK      ? 7001
                                                             : 7002)};
    for (int it = 0; it < iters; it++) {
        int32_t R = 1 + (int32_t)tu_below(&rng, MAXR);
        mc_layer L;
        mc_layer_random(&rng, R, &L);
        ep_job job;
        memset(&job, 0, sizeof job);
        job.L = &L;
        job.mode = mode;
        job.ep_mode = ep_mode;
        job.Tmax = 1 + (int64_t)tu_below(&rng, 12);
        bool concentrate = tu_below(&rng, 4) == 0;
        for (int32_t q = 0; q < R; q++) {
            int64_t T =
                tu_below(&rng, 4) == 0 ? 0 : (int64_t)tu_below(&rng, (uint32_t)job.Tmax + 1);
            make_io(&rng, &L, T, q, &job.io[q]);
            if (concentrate) all_to_rank0(&L, &job.io[q]);
        }
        tc_run(R, ep_rank, &job);
        const int32_t H = L.cfg.hidden, K = L.cfg.top_k;
        for (int32_t q = 0; q < R; q++) {
            rank_io *io = &job.io[q];
            if (io->st != EPX_OK) fail_msg("iteration %d rank %d: %s", it, q, io->err.msg);
            epx_error err = {0};
            assert_int_equal(
                epx_moe_forward(&L.cfg, &L.w, io->x, io->T, io->ids, io->w, 0, 1, 1, io->ref, &err),
                EPX_OK);
            if (mode == EPX_EP_COMBINE_TOPK) {
                for (int64_t i = 0; i < io->T * H; i++)
                    if (memcmp(&io->out[i], &io->ref[i], sizeof(float)) != 0)
                        fail_msg("iteration %d (R=%d) rank %d token %lld: EP %.9g != reference "
                                 "%.9g (must be bitwise equal)",
                                 it, R, q, (long long)(i / H), (double)io->out[i],
                                 (double)io->ref[i]);
            } else {
                double *S = malloc((size_t)(io->T > 0 ? io->T : 1) * (size_t)H * sizeof(double));
                mc_abs_sums(&L, io->T, io->x, io->ids, io->w, S);
                for (int64_t i = 0; i < io->T * H; i++) {
                    double tol = 2.0 * (K + R + 4) * FLT_EPSILON * S[i] + 1e-30;
                    if (fabs((double)io->out[i] - io->ref[i]) > tol)
                        fail_msg("iteration %d rank %d: rank-order EP %.9g vs reference %.9g, "
                                 "beyond the bound %.3g",
                                 it, q, (double)io->out[i], (double)io->ref[i], tol);
                }
                free(S);
            }
        }
        for (int32_t q = 0; q < R; q++) free_io(&job.io[q]);
        mc_layer_free(&L);
    }
}

static void ep_topk_bitwise(void **state) {
    (void)state;
    ep_random(EPX_EP_COMBINE_TOPK, EPX_EP_MODE_NORMAL, 120);
}

/* The low-latency protocol: the same bits as the reference, with empty
 * ranks, ranks that receive nothing, -1 ids and idle experts. */
static void ep_low_latency_bitwise(void **state) {
    (void)state;
    ep_random(EPX_EP_COMBINE_TOPK, EPX_EP_MODE_LOW_LATENCY, 120);
}

static void ep_rank_mode_within_bound(void **state) {
    (void)state;
    ep_random(EPX_EP_COMBINE_RANK, EPX_EP_MODE_NORMAL, 60);
}

/* ---- bf16 records with identity experts ------------------------------- */

/* A random EP layer for the identity tests: 1..MAXR ranks, H in [1, hmax],
 * K in [1, kmax], P a multiple of R up to pmul per rank, Tmax in [1, tmax]
 * (drawn in that order). */
static void random_shape(tu_rng *rng, uint32_t hmax, uint32_t kmax, uint32_t pmul, uint32_t tmax,
                         int32_t *R, int32_t *H, int32_t *K, int32_t *P, int64_t *Tmax) {
    *R = 1 + (int32_t)tu_below(rng, MAXR);
    *H = 1 + (int32_t)tu_below(rng, hmax);
    *K = 1 + (int32_t)tu_below(rng, kmax);
    *P = *R * (1 + (int32_t)tu_below(rng, pmul));
    *Tmax = 1 + (int64_t)tu_below(rng, tmax);
}

typedef struct id_job {
    int32_t R, H, K, P;
    int64_t Tmax;
    epx_ep_combine_mode mode;
    epx_ep_mode ep_mode;
    int64_t T[MAXR];
    uint16_t *x[MAXR];
    int32_t *slots[MAXR];
    float *w[MAXR], *out[MAXR];
    epx_status st[MAXR];
    epx_error err[MAXR];
    int64_t dbytes[MAXR], cbytes[MAXR];
} id_job;

static void id_rank(epx_comm *comm, void *arg) {
    id_job *j = arg;
    int32_t q = epx_comm_rank(comm);
    epx_ep_config c = EPX_EP_CONFIG_INIT;
    c.hidden = j->H;
    c.top_k = j->K;
    c.num_slots = j->P;
    c.max_tokens = j->Tmax;
    c.x_dtype = EPX_DTYPE_BF16;
    c.y_dtype = EPX_DTYPE_BF16;
    c.combine = j->mode;
    c.mode = j->ep_mode;
    size_t bytes = 0;
    j->st[q] = epx_ep_workspace_bytes(&c, j->R, &bytes, &j->err[q]);
    if (j->st[q] != EPX_OK) return;
    void *ws = aligned_alloc(64, (bytes + 63) / 64 * 64);
    epx_ep *ep = NULL;
    j->st[q] = epx_ep_create(comm, &c, ws, bytes, &ep, &j->err[q]);
    epx_ep_recv rv;
    for (int rep = 0; rep < 2 && j->st[q] == EPX_OK; rep++) { /* twice: buffers reused */
        j->st[q] = epx_ep_dispatch(ep, j->T[q], j->x[q], j->slots[q], j->w[q], &rv, &j->err[q]);
        if (j->st[q] != EPX_OK) break;
        for (int64_t e = 0; e < rv.num_entries; e++)
            memcpy((uint16_t *)rv.y + e * j->H,
                   (const char *)rv.x + (size_t)rv.entry_token[e] * rv.x_stride, (size_t)j->H * 2);
        j->st[q] = epx_ep_combine(ep, j->out[q], &j->err[q]);
    }
    epx_ep_last_bytes(ep, &j->dbytes[q], &j->cbytes[q]);
    epx_ep_destroy(ep);
    free(ws);
}

static void ep_bf16_identity(void **state) {
    (void)state;
    tu_rng rng = {tu_seed(7003)};
    for (int it = 0; it < 40; it++) {
        id_job j;
        memset(&j, 0, sizeof j);
        random_shape(&rng, 40, 8, 5, 20, &j.R, &j.H, &j.K, &j.P, &j.Tmax);
        j.mode = (epx_ep_combine_mode)tu_below(&rng, 2);
        j.ep_mode = j.mode == EPX_EP_COMBINE_TOPK && tu_below(&rng, 2) ? EPX_EP_MODE_LOW_LATENCY
                                                                       : EPX_EP_MODE_NORMAL;
        for (int32_t q = 0; q < j.R; q++) {
            j.T[q] = (int64_t)tu_below(&rng, (uint32_t)j.Tmax + 1);
            size_t n = (size_t)(j.T[q] ? j.T[q] : 1);
            j.x[q] = malloc(n * (size_t)j.H * 2);
            j.slots[q] = malloc(n * (size_t)j.K * sizeof(int32_t));
            j.w[q] = malloc(n * (size_t)j.K * sizeof(float));
            j.out[q] = malloc(n * (size_t)j.H * sizeof(float));
            for (int64_t i = 0; i < j.T[q] * j.H; i++)
                j.x[q][i] = epx_bf16_from_f32((float)(tu_uniform(&rng) * 4 - 2));
            for (int64_t i = 0; i < j.T[q] * j.K; i++) {
                j.slots[q][i] =
                    tu_below(&rng, 6) == 0 ? -1 : (int32_t)tu_below(&rng, (uint32_t)j.P);
                j.w[q][i] = (float)tu_uniform(&rng);
            }
        }
        tc_run(j.R, id_rank, &j);
        int32_t spr = j.P / j.R;
        float *part = malloc((size_t)j.H * sizeof(float));
        for (int32_t q = 0; q < j.R; q++) {
            if (j.st[q] != EPX_OK) fail_msg("iteration %d rank %d: %s", it, q, j.err[q].msg);
            int64_t expect_dbytes = 0;
            for (int64_t t = 0; t < j.T[q]; t++) {
                const int32_t *s = j.slots[q] + t * j.K;
                const float *w = j.w[q] + t * j.K;
                const uint16_t *x = j.x[q] + t * j.H;
                for (int32_t h = 0; h < j.H; h++) {
                    float acc = 0.0f;
                    if (j.mode == EPX_EP_COMBINE_TOPK) {
                        for (int32_t k = 0; k < j.K; k++)
                            if (s[k] >= 0) acc += w[k] * epx_bf16_to_f32(x[h]);
                    } else {
                        for (int32_t r = 0; r < j.R; r++) {
                            float p = 0.0f;
                            bool any = false;
                            for (int32_t k = 0; k < j.K; k++)
                                if (s[k] >= 0 && s[k] / spr == r) {
                                    p += w[k] * epx_bf16_to_f32(x[h]);
                                    any = true;
                                }
                            if (any) acc += epx_bf16_to_f32(epx_bf16_from_f32(p));
                        }
                    }
                    part[h] = acc;
                }
                if (memcmp(part, j.out[q] + t * j.H, (size_t)j.H * sizeof(float)) != 0)
                    fail_msg("iteration %d rank %d token %lld (mode %d): combine differs from "
                             "the expected fixed-order sum",
                             it, q, (long long)t, (int)j.mode);
                for (int32_t r = 0; r < j.R; r++) {
                    bool to = false;
                    for (int32_t k = 0; k < j.K; k++) to |= s[k] >= 0 && s[k] / spr == r;
                    if (to && r != q) expect_dbytes++;
                }
            }
            size_t tag = j.ep_mode == EPX_EP_MODE_LOW_LATENCY ? 4 : 0;
            size_t rec = ((size_t)j.H * 2 + 15) / 16 * 16 + ((size_t)j.K * 8 + tag + 15) / 16 * 16;
            assert_int_equal(j.dbytes[q], expect_dbytes * (int64_t)rec);
        }
        free(part);
        for (int32_t q = 0; q < j.R; q++) {
            free(j.x[q]);
            free(j.slots[q]);
            free(j.w[q]);
            free(j.out[q]);
        }
    }
}

/* ---- TP --------------------------------------------------------------- */

typedef struct tp_job {
    const mc_layer *L;
    rank_io *io; /* the same tokens on every rank */
    float *out[MAXR];
    epx_status st[MAXR];
    epx_error err[MAXR];
} tp_job;

static void tp_rank(epx_comm *comm, void *arg) {
    tp_job *j = arg;
    int32_t q = epx_comm_rank(comm), R = epx_comm_size(comm);
    j->st[q] = epx_moe_forward(&j->L->cfg, &j->L->w, j->io->x, j->io->T, j->io->ids, j->io->w, q, R,
                               1, j->out[q], &j->err[q]);
    epx_status st2 = epx_comm_allreduce_sum(comm, j->out[q], j->out[q], j->io->T * j->L->cfg.hidden,
                                            EPX_DTYPE_F32, &j->err[q]);
    if (j->st[q] == EPX_OK) j->st[q] = st2;
}

static void tp_within_bound(void **state) {
    (void)state;
    tu_rng rng = {tu_seed(7004)};
    for (int it = 0; it < 60; it++) {
        int32_t R = 1 + (int32_t)tu_below(&rng, MAXR);
        mc_layer L;
        mc_layer_random(&rng, R, &L);
        rank_io io;
        make_io(&rng, &L, 1 + (int64_t)tu_below(&rng, 10), 0, &io);
        tp_job j;
        memset(&j, 0, sizeof j);
        j.L = &L;
        j.io = &io;
        for (int32_t q = 0; q < R; q++)
            j.out[q] = malloc((size_t)io.T * (size_t)L.cfg.hidden * sizeof(float));
        tc_run(R, tp_rank, &j);
        epx_error err = {0};
        assert_int_equal(
            epx_moe_forward(&L.cfg, &L.w, io.x, io.T, io.ids, io.w, 0, 1, 1, io.ref, &err), EPX_OK);
        double *S = malloc((size_t)io.T * (size_t)L.cfg.hidden * sizeof(double));
        mc_abs_sums(&L, io.T, io.x, io.ids, io.w, S);
        int32_t n = L.cfg.intermediate + L.cfg.top_k + R + 4;
        for (int32_t q = 0; q < R; q++) {
            if (j.st[q] != EPX_OK) fail_msg("rank %d: %s", q, j.err[q].msg);
            for (int64_t i = 0; i < io.T * L.cfg.hidden; i++) {
                double tol = 2.0 * n * FLT_EPSILON * S[i] + 1e-30;
                if (fabs((double)j.out[q][i] - io.ref[i]) > tol)
                    fail_msg("iteration %d R=%d rank %d: TP %.9g vs reference %.9g beyond %.3g", it,
                             R, q, (double)j.out[q][i], (double)io.ref[i], tol);
            }
            /* Every rank holds the same all-reduced result. */
            assert_memory_equal(j.out[q], j.out[0],
                                (size_t)io.T * (size_t)L.cfg.hidden * sizeof(float));
        }
        for (int32_t q = 0; q < R; q++) free(j.out[q]);
        free(S);
        free_io(&io);
        mc_layer_free(&L);
    }
}

/* ---- faults, capacity, arguments ---------------------------------------- */

static void injected_faults_fail_cleanly(void **state) {
    (void)state;
    tu_rng rng = {tu_seed(7005)};
    mc_layer L;
    mc_layer_random(&rng, 1, &L);
    rank_io io;
    make_io(&rng, &L, 5, 0, &io);
    for (int64_t fail_at = 1; fail_at <= 3; fail_at++) {
        epx_comm *local = NULL, *bad = NULL;
        epx_error err = {0};
        assert_int_equal(epx_comm_create_local(&local, &err), EPX_OK);
        assert_int_equal(epx_comm_create_faulty(local, fail_at, &bad, &err), EPX_OK);
        epx_status st = mc_ep_forward(bad, &L, 8, io.T, io.x, io.slots, io.w, EPX_EP_COMBINE_TOPK,
                                      EPX_EP_MODE_NORMAL, io.out, &err);
        assert_int_equal(st, EPX_ERR_COMM);
        TU_MSG_HAS(err.msg, "injected fault", fail_at == 3 ? "EP combine" : "EP dispatch");
        epx_error e2 = {0};
        assert_int_equal(epx_comm_health(bad, &e2), EPX_ERR_COMM);
        assert_int_equal(epx_comm_barrier(bad, &e2), EPX_ERR_COMM);
        TU_MSG_HAS(e2.msg, "failed earlier", "injected fault");
        assert_int_equal(epx_comm_health(local, &e2), EPX_OK);
        epx_comm_destroy(bad);
        epx_comm_destroy(local);
    }
    free_io(&io);
    mc_layer_free(&L);
}

typedef struct cap_job {
    epx_status st[2], st2[2];
    epx_error err[2];
} cap_job;

static void cap_rank(epx_comm *comm, void *arg) {
    cap_job *j = arg;
    int32_t q = epx_comm_rank(comm);
    epx_ep_config c = EPX_EP_CONFIG_INIT;
    c.hidden = 4;
    c.top_k = 2;
    c.num_slots = 4;
    c.max_tokens = 4;
    c.max_recv_tokens = 3;
    epx_ep *ep = NULL;
    j->st[q] = epx_ep_create(comm, &c, NULL, 0, &ep, &j->err[q]);
    if (j->st[q] != EPX_OK) return;
    float x[16] = {0}, w[8] = {1, 1, 1, 1, 1, 1, 1, 1}, out[16];
    int32_t to0[8] = {0, 1, 0, 1, 0, 1, 0, 1}; /* both ranks send 4 tokens to rank 0 */
    epx_ep_recv rv;
    j->st[q] = epx_ep_dispatch(ep, 4, x, to0, w, &rv, &j->err[q]);
    /* The communicator is still healthy: a small batch goes through. */
    j->st2[q] = epx_ep_dispatch(ep, 1, x, to0, w, &rv, NULL);
    if (j->st2[q] == EPX_OK) {
        memset(rv.y, 0, (size_t)rv.num_entries * 4 * sizeof(float));
        j->st2[q] = epx_ep_combine(ep, out, NULL);
    }
    epx_ep_destroy(ep);
}

static void capacity_overflow_agreed(void **state) {
    (void)state;
    cap_job j;
    memset(&j, 0, sizeof j);
    tc_run(2, cap_rank, &j);
    for (int q = 0; q < 2; q++) {
        assert_int_equal(j.st[q], EPX_ERR_OVERFLOW);
        assert_int_equal(j.st2[q], EPX_OK);
    }
    TU_MSG_HAS(j.err[0].msg, "rank 0 would receive 8 tokens", "max_recv_tokens");
    TU_MSG_HAS(j.err[1].msg, "1 rank(s) would receive more", "raise the bounds");
}

static void argument_errors(void **state) {
    (void)state;
    epx_comm *local = NULL;
    epx_error err = {0};
    assert_int_equal(epx_comm_create_local(&local, &err), EPX_OK);
    epx_ep_config c = EPX_EP_CONFIG_INIT;
    c.hidden = 8;
    c.top_k = 2;
    c.num_slots = 4;
    c.max_tokens = 2;
    epx_ep *ep = NULL;
    assert_int_equal(epx_ep_create(local, &c, NULL, 0, &ep, &err), EPX_OK);
    float x[16] = {0}, w[4] = {0}, out[16];
    int32_t bad[4] = {0, 4, 1, 2};
    epx_ep_recv rv;
    assert_int_equal(epx_ep_dispatch(ep, 2, x, bad, w, &rv, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "topk_slots[0][1] = 4", "[-1, 4)");
    assert_int_equal(epx_ep_dispatch(ep, 3, x, bad, w, &rv, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "3 tokens", "max_tokens 2");
    assert_int_equal(epx_ep_combine(ep, out, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "without a successful dispatch");
    epx_ep_destroy(ep);
    /* Configs. */
    epx_ep_config c2 = c;
    c2.num_slots = 0;
    assert_int_equal(epx_ep_create(local, &c2, NULL, 0, &ep, &err), EPX_ERR_SHAPE);
    c2 = c;
    c2.version = 3;
    assert_int_equal(epx_ep_create(local, &c2, NULL, 0, &ep, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "EPX_EP_CONFIG_INIT");
    c2 = c;
    c2.x_dtype = EPX_DTYPE_I32;
    assert_int_equal(epx_ep_create(local, &c2, NULL, 0, &ep, &err), EPX_ERR_INVALID_ARG);
    size_t need = 0;
    assert_int_equal(epx_ep_workspace_bytes(&c, 1, &need, &err), EPX_OK);
    assert_true(need > 0);
    char small[64];
    assert_int_equal(epx_ep_create(local, &c, small, sizeof small, &ep, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "epx_ep_workspace_bytes");
    size_t need3 = 0;
    assert_int_equal(epx_ep_workspace_bytes(&c, 3, &need3, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "num_slots (4)", "3 ranks", "use 6");
    epx_comm_destroy(local);
    /* Communicator arguments. */
    epx_comm_ops ops = {1, "x", EPX_COMM_MEMORY_HOST, NULL, NULL, NULL, NULL, NULL, NULL};
    epx_comm *cm = NULL;
    assert_int_equal(epx_comm_create(&ops, NULL, 0, 1, &cm, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "EPX_COMM_OPS_VERSION");
    epx_comm_destroy(NULL);
    epx_ep_destroy(NULL);
}

/* ---- low latency: many batches on one handle ----------------------------- */

/* Each rank runs a sequence of batches through one low-latency handle with
 * fp32 identity experts; batch 3 carries a bad slot on the last rank, which
 * every rank must refuse together, and the batches after it go through.
 * Rows left from earlier batches (other tokens, larger T) must never leak
 * into later ones: the epoch tags tell them apart. */
typedef struct ll_job {
    int32_t R, H, K, P;
    int64_t Tmax;
    uint64_t seed;
    int64_t fails[MAXR];
    int64_t sent[8][MAXR], got[8][MAXR]; /* entries per batch and rank */
    epx_status bad_st[MAXR];
    epx_error err[MAXR];
} ll_job;

static void ll_rank(epx_comm *comm, void *arg) {
    ll_job *j = arg;
    int32_t q = epx_comm_rank(comm);
    epx_ep_config c = EPX_EP_CONFIG_INIT;
    c.hidden = j->H;
    c.top_k = j->K;
    c.num_slots = j->P;
    c.max_tokens = j->Tmax;
    c.mode = EPX_EP_MODE_LOW_LATENCY;
    epx_ep *ep = NULL;
    if (epx_ep_create(comm, &c, NULL, 0, &ep, &j->err[q]) != EPX_OK) {
        j->fails[q]++;
        return;
    }
    size_t n = (size_t)j->Tmax;
    float *x = malloc(n * (size_t)j->H * 4), *w = malloc(n * (size_t)j->K * 4);
    float *out = malloc(n * (size_t)j->H * 4);
    int32_t *s = malloc(n * (size_t)j->K * 4);
    tu_rng r = {j->seed * 977 + (uint64_t)q};
    for (int b = 0; b < 8; b++) {
        int64_t T = (int64_t)tu_below(&r, (uint32_t)j->Tmax + 1);
        for (int64_t i = 0; i < T * j->H; i++) x[i] = (float)(tu_uniform(&r) * 2 - 1);
        for (int64_t i = 0; i < T * j->K; i++) {
            s[i] = tu_below(&r, 5) == 0 ? -1 : (int32_t)tu_below(&r, (uint32_t)j->P);
            w[i] = (float)tu_uniform(&r);
        }
        bool poison = b == 3 && q == j->R - 1;
        if (b == 3 && T == 0) T = 1, s[0] = 0; /* make sure rank R-1 has a token to spoil */
        if (poison) s[0] = j->P;
        epx_ep_recv rv;
        epx_status st = epx_ep_dispatch(ep, T, x, s, w, &rv, &j->err[q]);
        if (b == 3) {
            j->bad_st[q] = st;
            continue;
        }
        if (st == EPX_OK) {
            j->got[b][q] = rv.num_entries;
            for (int64_t i = 0; i < T * j->K; i++) j->sent[b][q] += s[i] >= 0;
            st = epx_ep_identity_experts(ep, &rv, &j->err[q]);
        }
        if (st == EPX_OK) st = epx_ep_combine(ep, out, &j->err[q]);
        if (st != EPX_OK) {
            j->fails[q]++;
            break;
        }
        for (int64_t t = 0; t < T; t++)
            for (int32_t h = 0; h < j->H; h++) {
                float acc = 0.0f;
                for (int32_t k = 0; k < j->K; k++)
                    if (s[t * j->K + k] >= 0) acc += w[t * j->K + k] * x[t * j->H + h];
                if (memcmp(&acc, &out[t * j->H + h], 4) != 0) j->fails[q]++;
            }
    }
    /* A batch above the capacity is refused before anything is written. */
    epx_ep_recv rv;
    if (epx_ep_dispatch(ep, j->Tmax + 1, x, s, w, &rv, &j->err[q]) != EPX_ERR_INVALID_ARG)
        j->fails[q]++;
    free(x), free(w), free(out), free(s);
    epx_ep_destroy(ep);
}

static void ll_many_batches(void **state) {
    (void)state;
    tu_rng rng = {tu_seed(7012)};
    for (int it = 0; it < 30; it++) {
        ll_job j;
        memset(&j, 0, sizeof j);
        random_shape(&rng, 24, 6, 4, 10, &j.R, &j.H, &j.K, &j.P, &j.Tmax);
        j.seed = rng.s + (uint64_t)it;
        tc_run(j.R, ll_rank, &j);
        for (int32_t q = 0; q < j.R; q++) {
            if (j.fails[q])
                fail_msg("iteration %d rank %d: %lld mismatches or failures (%s)", it, q,
                         (long long)j.fails[q], j.err[q].msg);
            if (j.bad_st[q] != EPX_ERR_INVALID_ARG)
                fail_msg("iteration %d rank %d: a bad slot on rank %d gave %s, not "
                         "EPX_ERR_INVALID_ARG on every rank",
                         it, q, j.R - 1, epx_status_str(j.bad_st[q]));
        }
        TU_MSG_HAS(j.err[0].msg, "max_tokens");
        for (int b = 0; b < 8; b++) {
            int64_t sent = 0, got = 0;
            for (int32_t q = 0; q < j.R; q++) sent += j.sent[b][q], got += j.got[b][q];
            if (sent != got)
                fail_msg("iteration %d batch %d: %lld entries sent but %lld received (rows of "
                         "earlier batches leaked in?)",
                         it, b, (long long)sent, (long long)got);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ep_topk_bitwise),
        cmocka_unit_test(ep_low_latency_bitwise),
        cmocka_unit_test(ll_many_batches),
        cmocka_unit_test(ep_rank_mode_within_bound),
        cmocka_unit_test(ep_bf16_identity),
        cmocka_unit_test(tp_within_bound),
        cmocka_unit_test(injected_faults_fail_cleanly),
        cmocka_unit_test(capacity_overflow_agreed),
        cmocka_unit_test(argument_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
