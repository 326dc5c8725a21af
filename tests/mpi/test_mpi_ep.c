/*
 * test_mpi_ep.c - EP dispatch/combine, the TP baseline and the communicator
 * operations over real MPI processes (run by CTest under mpirun with 2, 3
 * and 4 ranks; every rank runs every test, in the same order, since each is
 * collective).
 *
 * Oracles as in test_ep.c: EP (top-k order) bitwise equals the single-rank
 * reference, TP is within the rigorous reordering bound. Uneven batches,
 * empty ranks, ranks that receive nothing and experts with no tokens all
 * occur. A failed check on one rank is shared with all (an all-reduce of
 * failure counts), so every rank fails the same test and the collective
 * sequence stays aligned.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epx_comm_mpi.h"
#include "moe_case.h"

static epx_comm *g_comm;
static int32_t g_rank, g_size;
static uint64_t g_seed;

/* Every rank learns whether any rank failed. */
static void all_ok(int64_t bad, const char *what) {
    int64_t total = bad;
    epx_error err = {0};
    assert_int_equal(epx_comm_allreduce_sum(g_comm, &total, &total, 1, EPX_DTYPE_I64, &err),
                     EPX_OK);
    if (total != 0)
        fail_msg("%s: %lld failure(s) over the ranks (this rank: %lld)", what, (long long)total,
                 (long long)bad);
}

static void comm_ops(void **state) {
    (void)state;
    epx_error err = {0};
    tu_rng r = {g_seed + 17};
    /* Random counts known to all: counts[s][d] = elements s sends to d. */
    int64_t counts[8][8];
    for (int s = 0; s < g_size; s++)
        for (int d = 0; d < g_size; d++)
            counts[s][d] = tu_below(&r, 3) == 0 ? 0 : (int64_t)tu_below(&r, 50);
    int64_t sc[8], sd[8], rc[8], rd[8], ns = 0, nr = 0;
    for (int d = 0; d < g_size; d++) {
        sc[d] = counts[g_rank][d];
        sd[d] = ns;
        ns += sc[d];
        rc[d] = counts[d][g_rank];
        rd[d] = nr;
        nr += rc[d];
    }
    int32_t *send = malloc((size_t)(ns + 1) * 12), *recv = malloc((size_t)(nr + 1) * 12);
    for (int d = 0; d < g_size; d++)
        for (int64_t i = 0; i < sc[d]; i++)
            for (int q = 0; q < 3; q++)
                send[(sd[d] + i) * 3 + q] = g_rank * 1000000 + d * 10000 + (int32_t)i * 3 + q;
    assert_int_equal(epx_comm_alltoallv(g_comm, send, sc, sd, recv, rc, rd, 12, &err), EPX_OK);
    int64_t bad = 0;
    for (int s = 0; s < g_size; s++)
        for (int64_t i = 0; i < rc[s]; i++)
            for (int q = 0; q < 3; q++)
                bad +=
                    recv[(rd[s] + i) * 3 + q] != s * 1000000 + g_rank * 10000 + (int32_t)i * 3 + q;
    all_ok(bad, "alltoallv contents");
    free(send);
    free(recv);
    int64_t v[2] = {g_rank, 1};
    assert_int_equal(epx_comm_allreduce_sum(g_comm, v, v, 2, EPX_DTYPE_I64, &err), EPX_OK);
    assert_int_equal(v[0], (int64_t)g_size * (g_size - 1) / 2);
    assert_int_equal(v[1], g_size);
    float f[3] = {0.5f, (float)g_rank, 1.0f}, fo[3];
    assert_int_equal(epx_comm_allreduce_sum(g_comm, f, fo, 3, EPX_DTYPE_F32, &err), EPX_OK);
    assert_float_equal(fo[0], 0.5 * g_size, 0);
    assert_int_equal(epx_comm_barrier(g_comm, &err), EPX_OK);
    assert_int_equal(epx_comm_allreduce_sum(g_comm, f, fo, 1, EPX_DTYPE_BF16, &err),
                     EPX_ERR_UNSUPPORTED);
    assert_string_equal(epx_comm_name(g_comm), "mpi");
    assert_int_equal(epx_comm_health(g_comm, NULL), EPX_OK);
}

/* An all-reduce past EPX_MPI_MAX_COUNT runs as several calls with the
 * same sums: here a bound of 3 (rank 0's; the others ask for 5, and the
 * smallest wins) cuts 10 int64 and 7 float elements, in place and not; a
 * bound that is not a whole number from 1 to INT_MAX is refused by name. */
static void allreduce_in_chunks(void **state) {
    (void)state;
    epx_error err = {0};
    epx_comm *c = NULL;
    setenv("EPX_MPI_MAX_COUNT", g_rank == 0 ? "3" : "5", 1);
    assert_int_equal(epx_comm_mpi_create(MPI_COMM_WORLD, NULL, &c, &err), EPX_OK);
    int64_t v[10], bad = 0;
    for (int i = 0; i < 10; i++) v[i] = (int64_t)(g_rank + 1) * (i + 1);
    assert_int_equal(epx_comm_allreduce_sum(c, v, v, 10, EPX_DTYPE_I64, &err), EPX_OK);
    const int64_t ranks_sum = (int64_t)g_size * (g_size + 1) / 2;
    for (int i = 0; i < 10; i++) bad += v[i] != ranks_sum * (i + 1);
    float f[7], fo[7];
    for (int i = 0; i < 7; i++) f[i] = (float)(i * 0.25 + g_rank);
    assert_int_equal(epx_comm_allreduce_sum(c, f, fo, 7, EPX_DTYPE_F32, &err), EPX_OK);
    for (int i = 0; i < 7; i++) /* small integers and quarters: exact in any order */
        bad += fo[i] != (float)(g_size * i * 0.25 + (double)g_size * (g_size - 1) / 2);
    epx_comm_destroy(c);
    c = NULL;
    all_ok(bad, "all-reduce in calls of at most 3 elements");
    static const char *const refused[] = {"0", "-3", "2147483648", "12x", "99999999999999999999"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        setenv("EPX_MPI_MAX_COUNT", refused[i], 1);
        assert_int_equal(epx_comm_mpi_create(MPI_COMM_WORLD, NULL, &c, &err), EPX_ERR_INVALID_ARG);
        TU_MSG_HAS(err.msg, "EPX_MPI_MAX_COUNT", refused[i], "2147483647");
        assert_null(c);
    }
}

/* allreduce_in_chunks' teardown, run even when a check failed: later tests
 * create communicators too. */
static int unset_max_count(void **state) {
    (void)state;
    unsetenv("EPX_MPI_MAX_COUNT");
    return 0;
}

/* Communicators epx cannot work over are refused with a message, not
 * passed to MPI (whose handler on MPI_COMM_WORLD aborts the job):
 * MPI_COMM_NULL (what MPI_Comm_split gives a rank with MPI_UNDEFINED) and
 * an intercommunicator (its collectives go to the remote group). */
static void mpi_bad_comms(void **state) {
    (void)state;
    epx_comm *c = NULL;
    epx_error err = {0};
    assert_int_equal(epx_comm_mpi_create(MPI_COMM_NULL, NULL, &c, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "MPI_COMM_NULL", "MPI_UNDEFINED");
    assert_null(c);
    if (g_size < 2) return;
    MPI_Comm half, inter;
    assert_int_equal(MPI_Comm_split(MPI_COMM_WORLD, g_rank % 2, g_rank, &half), MPI_SUCCESS);
    assert_int_equal(MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, 1 - g_rank % 2, 77, &inter),
                     MPI_SUCCESS);
    memset(&err, 0, sizeof err);
    assert_int_equal(epx_comm_mpi_create(inter, NULL, &c, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "intercommunicator");
    MPI_Comm_free(&inter);
    MPI_Comm_free(&half);
}

/* A faulty wrapper failing at the same call on every rank fails cleanly and
 * leaves the MPI communicator below it healthy. */
static void injected_fault(void **state) {
    (void)state;
    epx_comm *bad = NULL;
    epx_error err = {0};
    assert_int_equal(epx_comm_create_faulty(g_comm, 2, &bad, &err), EPX_OK);
    assert_int_equal(epx_comm_barrier(bad, &err), EPX_OK);
    assert_int_equal(epx_comm_barrier(bad, &err), EPX_ERR_COMM);
    TU_MSG_HAS(err.msg, "injected fault");
    epx_comm_destroy(bad);
    assert_int_equal(epx_comm_barrier(g_comm, &err), EPX_OK);
}

static void ep_cases(epx_ep_combine_mode mode, epx_ep_mode ep_mode, int iters) {
    tu_rng lr = {g_seed + (uint64_t)mode * 7919 +
                 (uint64_t)ep_mode * 104729}; /* the same on all ranks */
    for (int it = 0; it < iters; it++) {
        mc_layer L;
        mc_layer_random(&lr, g_size, &L);
        int64_t Tmax = 1 + (int64_t)tu_below(&lr, 16);
        int scenario =
            (int)tu_below(&lr, 4); /* 0: rank 0 empty, 1: only rank 0's slots, else random */
        tu_rng r = {g_seed * 31 + (uint64_t)it * 1000003 + (uint64_t)g_rank}; /* per rank */
        int64_t T = (scenario == 0 && g_rank == 0) ? 0 : (int64_t)tu_below(&r, (uint32_t)Tmax + 1);
        int32_t H = L.cfg.hidden, K = L.cfg.top_k, spr = L.P / L.R;
        size_t n = (size_t)(T ? T : 1);
        float *x = malloc(n * H * 4), *w = malloc(n * K * 4), *out = malloc(n * H * 4),
              *ref = malloc(n * H * 4);
        int32_t *ids = malloc(n * K * 4), *slots = malloc(n * K * 4);
        mc_batch(&r, &L, T, 1, x, ids, w);
        mc_slots(&L, T, ids, g_rank, slots);
        if (scenario == 1) /* ranks >= 1 receive nothing */
            for (int64_t i = 0; i < T * K; i++)
                if (slots[i] >= spr) {
                    int32_t e = ids[i], to = -1;
                    for (int32_t q = 0; q < L.nrep[e]; q++)
                        if (L.reps[(size_t)e * L.P + q] < spr) to = L.reps[(size_t)e * L.P + q];
                    slots[i] = to;
                    if (to < 0) ids[i] = -1;
                }
        epx_error err = {0};
        epx_status st = mc_ep_forward(g_comm, &L, Tmax, T, x, slots, w, mode, ep_mode, out, &err);
        if (st != EPX_OK) fail_msg("rank %d iteration %d: %s", g_rank, it, err.msg);
        assert_int_equal(epx_moe_forward(&L.cfg, &L.w, x, T, ids, w, 0, 1, 1, ref, &err), EPX_OK);
        int64_t bad = 0;
        if (mode == EPX_EP_COMBINE_TOPK) {
            bad = T > 0 && memcmp(out, ref, (size_t)T * H * 4) != 0;
        } else {
            double *S = malloc(n * H * sizeof(double));
            mc_abs_sums(&L, T, x, ids, w, S);
            for (int64_t i = 0; i < T * H; i++)
                bad += fabs((double)out[i] - ref[i]) >
                       2.0 * (K + g_size + 4) * FLT_EPSILON * S[i] + 1e-30;
            free(S);
        }
        if (bad)
            fprintf(stderr, "rank %d iteration %d (scenario %d): EP differs from the reference\n",
                    g_rank, it, scenario);
        all_ok(bad, "EP vs the single-rank reference");
        free(x), free(w), free(out), free(ref), free(ids), free(slots);
        mc_layer_free(&L);
    }
}

static void ep_topk_bitwise(void **state) {
    (void)state;
    ep_cases(EPX_EP_COMBINE_TOPK, EPX_EP_MODE_NORMAL, 40);
}

static void ep_rank_mode(void **state) {
    (void)state;
    ep_cases(EPX_EP_COMBINE_RANK, EPX_EP_MODE_NORMAL, 20);
}

/* The low-latency protocol over real processes: fixed blocks, epoch tags
 * and in-band flags, bitwise equal to the reference. */
static void ep_low_latency(void **state) {
    (void)state;
    ep_cases(EPX_EP_COMBINE_TOPK, EPX_EP_MODE_LOW_LATENCY, 40);
}

/* One rank's config differs from the others' in one field: every rank's
 * first dispatch refuses, naming the field, instead of exchanging records
 * of other sizes (a truncation on some ranks, wrong rows on others, the
 * rest waiting for the timeout); the communicator stays usable. */
static void ep_config_mismatch(void **state) {
    (void)state;
    tu_rng lr = {g_seed + 4242}; /* the same on all ranks */
    static const char *const fields[] = {"hidden",  "top_k",   "max_tokens",     "mode",
                                         "x_dtype", "combine", "max_recv_tokens"};
    for (int it = 0; it < 12; it++) {
        epx_ep_config c = EPX_EP_CONFIG_INIT;
        c.hidden = 1 + (int32_t)tu_below(&lr, 24);
        c.top_k = 1 + (int32_t)tu_below(&lr, 9);
        c.num_slots = g_size * (1 + (int32_t)tu_below(&lr, 4));
        c.max_tokens = 1 + (int64_t)tu_below(&lr, 8);
        const int f = (int)tu_below(&lr, sizeof fields / sizeof fields[0]);
        const int32_t odd = (int32_t)tu_below(&lr, (uint32_t)g_size);
        if (g_rank == odd) {
            if (f == 0) c.hidden ^= 1; /* 4 and 5, 2 and 3: one record size in f32 */
            if (f == 1) c.top_k = c.top_k % 9 + 1;
            if (f == 2) c.max_tokens++;
            if (f == 3) c.mode = EPX_EP_MODE_LOW_LATENCY;
            if (f == 4) c.x_dtype = EPX_DTYPE_BF16;
            if (f == 5) c.combine = EPX_EP_COMBINE_RANK;
            if (f == 6) c.max_recv_tokens = 1;
        }
        if (c.hidden == 0) c.hidden = 2; /* 1 ^ 1 */
        epx_ep *ep = NULL;
        epx_error err = {0};
        assert_int_equal(epx_ep_create(g_comm, &c, NULL, 0, &ep, &err), EPX_OK);
        const int64_t T = c.max_tokens - 1;
        float x[8 * 24] = {0}, w[8 * 9] = {0};
        int32_t s[8 * 9];
        for (int64_t i = 0; i < T * c.top_k; i++) s[i] = (int32_t)(i % c.num_slots);
        epx_ep_recv rv;
        epx_status st = epx_ep_dispatch(ep, T, x, s, w, &rv, &err);
        int64_t bad = st != EPX_ERR_INVALID_ARG || strstr(err.msg, fields[f]) == NULL ||
                      strstr(err.msg, "same config") == NULL;
        if (bad)
            fprintf(stderr, "rank %d iteration %d (%s differs on rank %d, seed %llu): %s: %s\n",
                    g_rank, it, fields[f], odd, (unsigned long long)g_seed, epx_status_str(st),
                    err.msg);
        epx_ep_destroy(ep);
        all_ok(bad, "a config that differs between ranks refused on every rank");
    }
}

/* A communicator of its own with a short timeout, so that a failure is
 * quick. */
static epx_comm *quick_comm(void) {
    epx_comm_mpi_opts o = EPX_COMM_MPI_OPTS_INIT;
    o.timeout_ms = 3000;
    epx_comm *comm = NULL;
    epx_error err = {0};
    assert_int_equal(epx_comm_mpi_create(MPI_COMM_WORLD, &o, &comm, &err), EPX_OK);
    return comm;
}

/* A small random config drawn from lr (the same on every rank). */
static epx_ep_config small_config(tu_rng *lr) {
    epx_ep_config c = EPX_EP_CONFIG_INIT;
    c.hidden = 1 + (int32_t)tu_below(lr, 16);
    c.top_k = 1 + (int32_t)tu_below(lr, 9);
    c.num_slots = g_size * (1 + (int32_t)tu_below(lr, 4));
    c.max_tokens = 1 + (int64_t)tu_below(lr, 8);
    return c;
}

/* The elements of out [T][H] that differ from the identity experts'
 * combine, sum_k w x over the token's valid slots, to the bit. */
static int64_t identity_mismatches(int64_t T, int32_t H, int32_t K, const float *x,
                                   const int32_t *s, const float *w, const float *out) {
    int64_t wrong = 0;
    for (int64_t t = 0; t < T; t++)
        for (int32_t h = 0; h < H; h++) {
            float acc = 0.0f;
            for (int32_t k = 0; k < K; k++)
                if (s[t * K + k] >= 0) acc += w[t * K + k] * x[t * H + h];
            wrong += memcmp(&acc, &out[t * H + h], 4) != 0;
        }
    return wrong;
}

/* rows tokens: x in [-1, 1), slots in [-1, P) (-1: dropped), weights in
 * [0, 1), drawn in that order from r. */
static void random_rows(tu_rng *r, int64_t rows, int32_t H, int32_t K, int32_t P, float *x,
                        int32_t *s, float *w) {
    for (int64_t i = 0; i < rows * H; i++) x[i] = (float)(tu_uniform(r) * 2 - 1);
    for (int64_t i = 0; i < rows * K; i++) {
        s[i] = (int32_t)tu_below(r, (uint32_t)P + 1) - 1;
        w[i] = (float)tu_uniform(r);
    }
}

/* One rank passes a batch it cannot dispatch (a slot >= P or < -1, more
 * tokens than max_tokens, no x): in either mode every rank returns
 * EPX_ERR_INVALID_ARG for that batch at once (the bad rank naming the
 * value, the others the rank) instead of waiting out the timeout on a
 * poisoned communicator, and the next batch on the same handles is right.
 * A communicator of its own with a short timeout keeps a failure quick. */
static void ep_bad_batch_shared(void **state) {
    (void)state;
    epx_comm *comm = quick_comm();
    epx_error err = {0};
    tu_rng lr = {g_seed + 5151}; /* the same on all ranks */
    static const char *const kinds[] = {"slot >= num_slots", "slot < -1", "T > max_tokens",
                                        "x NULL"};
    static const char *const says[] = {"topk_slots[", "topk_slots[", "max_tokens", "needs x"};
    int64_t bad = 0;
    for (int it = 0; it < 16 && bad == 0; it++) {
        epx_ep_config c = small_config(&lr);
        c.mode = tu_below(&lr, 2) ? EPX_EP_MODE_LOW_LATENCY : EPX_EP_MODE_NORMAL;
        const int kind = (int)tu_below(&lr, 4);
        const int32_t culprit = (int32_t)tu_below(&lr, (uint32_t)g_size);
        const int32_t H = c.hidden, K = c.top_k, P = c.num_slots;
        const int64_t M = c.max_tokens;
        tu_rng r = {g_seed * 131 + (uint64_t)it * 7919 + (uint64_t)g_rank}; /* per rank */
        float *x = malloc((size_t)(M + 1) * H * 4), *w = malloc((size_t)(M + 1) * K * 4);
        float *out = malloc((size_t)(M + 1) * H * 4);
        int32_t *s = malloc((size_t)(M + 1) * K * 4);
        random_rows(&r, M + 1, H, K, P, x, s, w);
        epx_ep *ep = NULL;
        assert_int_equal(epx_ep_create(comm, &c, NULL, 0, &ep, &err), EPX_OK);
        int64_t T = (int64_t)tu_below(&r, (uint32_t)M + 1);
        const float *bx = x;
        if (g_rank == culprit) {
            T = kind == 2 ? M + 1 : 1 + (int64_t)tu_below(&r, (uint32_t)M);
            const int64_t at = (int64_t)tu_below(&r, (uint32_t)(T * K));
            if (kind == 0) s[at] = P + (int32_t)tu_below(&r, 3);
            if (kind == 1) s[at] = -2 - (int32_t)tu_below(&r, 3);
            if (kind == 3) bx = NULL;
        }
        epx_ep_recv rv;
        epx_status st = epx_ep_dispatch(ep, T, bx, s, w, &rv, &err);
        char who[32];
        snprintf(who, sizeof who, "rank %d", culprit);
        const char *want = g_rank == culprit ? says[kind] : who;
        int64_t wrong = st != EPX_ERR_INVALID_ARG || strstr(err.msg, want) == NULL;
        if (wrong)
            fprintf(stderr, "rank %d iteration %d (%s mode, %s on rank %d, seed %llu): %s: %s\n",
                    g_rank, it, c.mode ? "low-latency" : "normal", kinds[kind], culprit,
                    (unsigned long long)g_seed, epx_status_str(st), err.msg);
        /* The next batch, good everywhere, goes through and is right. */
        for (int64_t i = 0; i < M * K; i++)
            if (s[i] < -1 || s[i] >= P) s[i] = -1;
        T = (int64_t)tu_below(&r, (uint32_t)M + 1);
        st = wrong ? EPX_ERR_INTERNAL : epx_ep_dispatch(ep, T, x, s, w, &rv, &err);
        if (st == EPX_OK) st = epx_ep_identity_experts(ep, &rv, &err);
        if (st == EPX_OK) st = epx_ep_combine(ep, out, &err);
        if (!wrong && st != EPX_OK) {
            fprintf(stderr, "rank %d iteration %d: the batch after a refused one: %s\n", g_rank, it,
                    err.msg);
            wrong = 1;
        }
        if (st == EPX_OK) wrong += identity_mismatches(T, H, K, x, s, w, out);
        bad += wrong;
        epx_ep_destroy(ep);
        free(x), free(w), free(out), free(s);
    }
    epx_comm_destroy(comm);
    all_ok(bad, "a batch one rank cannot dispatch refused on every rank, the next one right");
}

/* A combine one rank calls without out: that rank is refused, naming out,
 * but the exchange still runs, so every other rank gets its result (right,
 * bit for bit) instead of waiting for the timeout, and the next batch goes
 * through everywhere. Both modes. */
static void ep_combine_without_out(void **state) {
    (void)state;
    epx_comm *comm = quick_comm();
    epx_error err = {0};
    tu_rng lr = {g_seed + 6262}; /* the same on all ranks */
    int64_t bad = 0;
    for (int it = 0; it < 8; it++) { /* every rank the same iterations */
        epx_ep_config c = small_config(&lr);
        c.mode = it % 2 ? EPX_EP_MODE_LOW_LATENCY : EPX_EP_MODE_NORMAL;
        const int32_t culprit = (int32_t)tu_below(&lr, (uint32_t)g_size);
        const int32_t H = c.hidden, K = c.top_k, P = c.num_slots;
        const int64_t M = c.max_tokens;
        tu_rng r = {g_seed * 137 + (uint64_t)it * 7919 + (uint64_t)g_rank}; /* per rank */
        float *x = malloc((size_t)M * H * 4), *w = malloc((size_t)M * K * 4);
        float *out = malloc((size_t)M * H * 4);
        int32_t *s = malloc((size_t)M * K * 4);
        epx_ep *ep = NULL;
        assert_int_equal(epx_ep_create(comm, &c, NULL, 0, &ep, &err), EPX_OK);
        for (int round = 0; round < 2; round++) { /* culprit without out, then all with */
            random_rows(&r, M, H, K, P, x, s, w);
            const int64_t T = g_rank == culprit ? M : (int64_t)tu_below(&r, (uint32_t)M + 1);
            const int dropped = round == 0 && g_rank == culprit;
            epx_ep_recv rv;
            epx_status st = epx_ep_dispatch(ep, T, x, s, w, &rv, &err);
            if (st == EPX_OK) st = epx_ep_identity_experts(ep, &rv, &err);
            if (st == EPX_OK) st = epx_ep_combine(ep, dropped ? NULL : out, &err);
            int64_t wrong = dropped ? st != EPX_ERR_INVALID_ARG || strstr(err.msg, "out") == NULL
                                    : st != EPX_OK;
            if (st == EPX_OK) wrong += identity_mismatches(T, H, K, x, s, w, out);
            if (wrong)
                fprintf(stderr,
                        "rank %d iteration %d round %d (%s mode, culprit %d, seed %llu): "
                        "%s: %s\n",
                        g_rank, it, round, c.mode ? "low-latency" : "normal", culprit,
                        (unsigned long long)g_seed, epx_status_str(st), err.msg);
            bad += wrong;
        }
        epx_ep_destroy(ep);
        free(x), free(w), free(out), free(s);
    }
    epx_comm_destroy(comm);
    all_ok(bad, "a combine without out refused on its rank alone, the others right");
}

static void tp_baseline(void **state) {
    (void)state;
    tu_rng r = {g_seed + 99}; /* same tokens on every rank, as TP serves them */
    for (int it = 0; it < 20; it++) {
        mc_layer L;
        mc_layer_random(&r, g_size, &L);
        int64_t T = 1 + (int64_t)tu_below(&r, 12);
        int32_t H = L.cfg.hidden, K = L.cfg.top_k;
        float *x = malloc((size_t)T * H * 4), *w = malloc((size_t)T * K * 4);
        float *out = malloc((size_t)T * H * 4), *ref = malloc((size_t)T * H * 4);
        int32_t *ids = malloc((size_t)T * K * 4);
        mc_batch(&r, &L, T, 1, x, ids, w);
        epx_error err = {0};
        assert_int_equal(epx_moe_forward(&L.cfg, &L.w, x, T, ids, w, g_rank, g_size, 1, out, &err),
                         EPX_OK);
        assert_int_equal(epx_comm_allreduce_sum(g_comm, out, out, T * H, EPX_DTYPE_F32, &err),
                         EPX_OK);
        assert_int_equal(epx_moe_forward(&L.cfg, &L.w, x, T, ids, w, 0, 1, 1, ref, &err), EPX_OK);
        double *S = malloc((size_t)T * H * sizeof(double));
        mc_abs_sums(&L, T, x, ids, w, S);
        int32_t nterms = L.cfg.intermediate + K + g_size + 4;
        int64_t bad = 0;
        for (int64_t i = 0; i < T * H; i++)
            bad += fabs((double)out[i] - ref[i]) > 2.0 * nterms * FLT_EPSILON * S[i] + 1e-30;
        all_ok(bad, "TP vs the single-rank reference");
        free(S), free(x), free(w), free(out), free(ref), free(ids);
        mc_layer_free(&L);
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    epx_comm_mpi_opts o = EPX_COMM_MPI_OPTS_INIT;
    o.timeout_ms = 20000;
    epx_error err = {0};
    if (epx_comm_mpi_create(MPI_COMM_WORLD, &o, &g_comm, &err) != EPX_OK) {
        fprintf(stderr, "epx_comm_mpi_create: %s\n", err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    g_rank = epx_comm_rank(g_comm);
    g_size = epx_comm_size(g_comm);
    if (g_size > 8) {
        fprintf(stderr, "test_mpi_ep runs on at most 8 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* Rank 0's seed for everyone. */
    int64_t seed = g_rank == 0 ? (int64_t)(tu_seed(20240607) & 0x7fffffffffffll) : 0;
    epx_comm_allreduce_sum(g_comm, &seed, &seed, 1, EPX_DTYPE_I64, &err);
    g_seed = (uint64_t)seed;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(comm_ops),
        cmocka_unit_test(mpi_bad_comms),
        cmocka_unit_test_teardown(allreduce_in_chunks, unset_max_count),
        cmocka_unit_test(injected_fault),
        cmocka_unit_test(ep_topk_bitwise),
        cmocka_unit_test(ep_rank_mode),
        cmocka_unit_test(ep_low_latency),
        cmocka_unit_test(ep_config_mismatch),
        cmocka_unit_test(ep_bad_batch_shared),
        cmocka_unit_test(ep_combine_without_out),
        cmocka_unit_test(tp_baseline),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    epx_comm_destroy(g_comm);
    MPI_Finalize();
    return failed;
}
