/*
 * test_balanced_lanes.c - the balanced split's warp statements (nl = 32 lanes,
 * as src/cuda/balanced.cu runs them) on 32 host threads, one per lane,
 * against the CPU reference (nl = 1), on random layers (seeded; the seed is
 * printed on failure): Kimi-K2.5's shape (one component of 8 GPUs),
 * DeepSeek-V3's on 4 nodes of 8 GPUs (components of up to 8) and on any of
 * 32 GPUs (large components: the max-flows on lane 0), and small random
 * layers under each solve's knobs (subset tables up to 12 GPUs or 3, the
 * closed form on and off). Every level, flow and rounded flow must be the
 * same bits.
 *
 * Why: the kernel's result equals the CPU's only if the lanes' split of the
 * subsets, their shuffled reductions and votes, and their barriers are
 * right; a GPU run checks that, but only where a GPU is lent. Here
 * balanced_subsets.h's lane primitives (EPXI_BAL_LANES) are a barrier and
 * a reduction over 32 threads: lanes that diverge (one waits at a barrier
 * the others never reach) fail the test after a timeout instead of hanging
 * it, and a lane reading what another has not yet written races on real
 * threads as it would on the GPU.
 */
#define _POSIX_C_SOURCE 200809L
#define EPXI_BAL_LANES 1
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"
#include "bal_place.h"
#include "../src/dispatch/balanced_solve.h"

#define LANES 32

/* ---- one warp of host threads ---------------------------------------------------- */

static struct warp {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    unsigned gen;
    int64_t v64[LANES];
    int32_t v32[LANES];
    uint32_t vm[LANES];
    int site[LANES];
    /* the job */
    epxi_bal *b;
    int32_t c;
} W = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, {0}, {0}, {0}, {0}, NULL, 0};

/* what the lanes passed (EPX_LANES_STATS): __syncwarp barriers, and the
 * barriers of the reductions and votes (two each) */
static unsigned long barriers, collective_barriers;
static _Thread_local int my_lane = -1; /* -1: not a lane (the nl = 1 reference) */
static _Thread_local unsigned my_syncs;

/* Every lane's arrival, then all go on. The lanes must arrive at the same
 * barrier (site: a SYNCWARP's line, or a reduction's kind), as a warp's
 * lanes must reach the same __syncwarp and shuffles; a lane at another one,
 * or left waiting 20 s because the others never came, means the lanes took
 * different paths: the test fails saying where. */
enum {
    SITE_MIN = -1,
    SITE_ALL = -2,
    SITE_BEST = -3,
    SITE_OR = -4,
    SITE_FIRST = -5,
    SITE_SUM = -6,
    SITE_FROM = -7
};

static void diverged(const char *how) {
    fprintf(stderr, "component %d, barrier %u: %s: the lanes diverged\n", W.c, my_syncs, how);
    exit(1);
}

static void barrier(int site) {
    pthread_mutex_lock(&W.mu);
    unsigned gen = W.gen;
    W.site[my_lane] = site;
    if (++W.arrived == LANES) {
        for (int l = 1; l < LANES; l++)
            if (W.site[l] != W.site[0]) {
                char how[96];
                snprintf(how, sizeof how, "lane 0 at site %d, lane %d at site %d", W.site[0], l,
                         W.site[l]);
                diverged(how);
            }
        W.arrived = 0;
        W.gen++;
        if (site >= 0)
            barriers++;
        else
            collective_barriers++;
        pthread_cond_broadcast(&W.cv);
    } else {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 20;
        while (gen == W.gen)
            if (pthread_cond_timedwait(&W.cv, &W.mu, &until) == ETIMEDOUT)
                diverged("a lane waited 20 s for the others");
    }
    my_syncs++;
    pthread_mutex_unlock(&W.mu);
}

void epxi_bal_lanes_sync(int line) {
    if (my_lane >= 0) barrier(line);
}

int64_t epxi_bal_lanes_min(int64_t v) {
    W.v64[my_lane] = v;
    barrier(SITE_MIN);
    int64_t m = W.v64[0];
    for (int l = 1; l < LANES; l++) m = W.v64[l] < m ? W.v64[l] : m;
    barrier(SITE_MIN); /* nobody writes the slots again before all have read them */
    return m;
}

int epxi_bal_lanes_all(int ok) {
    W.v32[my_lane] = ok != 0;
    barrier(SITE_ALL);
    int all = 1;
    for (int l = 0; l < LANES; l++) all &= W.v32[l];
    barrier(SITE_ALL);
    return all;
}

uint32_t epxi_bal_lanes_or(uint32_t m) {
    W.vm[my_lane] = m;
    barrier(SITE_OR);
    uint32_t all = 0;
    for (int l = 0; l < LANES; l++) all |= W.vm[l];
    barrier(SITE_OR);
    return all;
}

uint32_t epxi_bal_lanes_best(int64_t num, int32_t den, uint32_t mask) {
    W.v64[my_lane] = num;
    W.v32[my_lane] = den;
    W.vm[my_lane] = mask;
    barrier(SITE_BEST);
    num = W.v64[0];
    den = W.v32[0];
    mask = W.vm[0];
    for (int l = 1; l < LANES; l++) epxi_bal_better(&num, &den, &mask, W.v64[l], W.v32[l], W.vm[l]);
    barrier(SITE_BEST);
    return mask;
}

int64_t epxi_bal_lanes_sum(int64_t v) {
    W.v64[my_lane] = v;
    barrier(SITE_SUM);
    int64_t sum = 0;
    for (int l = 0; l < LANES; l++) sum += W.v64[l];
    barrier(SITE_SUM);
    return sum;
}

int64_t epxi_bal_lanes_from(int64_t v, int src) {
    W.v64[my_lane] = v;
    barrier(SITE_FROM);
    v = W.v64[src];
    barrier(SITE_FROM);
    return v;
}

/* The lanes' graph build against epxi_bal_build on the same level: every
 * array the max-flows read, to the element (lane 0, between barriers). */
enum { KEEP_NODES = 4096, KEEP_EDGES = 16384, KEEP_FLEX = 65536 };
static struct {
    int32_t head[KEEP_NODES], sink[KEEP_NODES], next[KEEP_EDGES], to[KEEP_EDGES];
    int32_t f_edge[KEEP_FLEX];
    uint8_t g_graph[KEEP_NODES];
    int64_t cap[KEEP_EDGES];
    long builds, greedies, bfs;
} K;

/* Each hook checks that what it copies fits K (and its own copies, sized
 * alike) before it copies. */
static void check_fits(int64_t nodes, int64_t edges, int64_t flex) {
    if (nodes > KEEP_NODES || edges > KEEP_EDGES || flex > KEEP_FLEX)
        diverged("a graph larger than the test's copies");
}

void epxi_bal_lanes_built(epxi_bal *b, epxi_bal_part *p, int64_t a, int64_t den, int64_t need) {
    check_fits(p->n > p->ng ? p->n : p->ng, p->m, (int64_t)p->nf * b->D);
    const int32_t n = p->n, m = p->m, D = b->D;
    memcpy(K.head, p->head, (size_t)n * sizeof(int32_t));
    memcpy(K.sink, p->sink, (size_t)n * sizeof(int32_t));
    memcpy(K.next, p->next, (size_t)m * sizeof(int32_t));
    memcpy(K.to, p->to, (size_t)m * sizeof(int32_t));
    memcpy(K.cap, p->cap, (size_t)m * sizeof(int64_t));
    for (int32_t gi = 0; gi < p->ng; gi++) K.g_graph[gi] = b->g_graph[p->gl[gi]];
    for (int32_t j = 0; j < p->nf; j++)
        memcpy(K.f_edge + (size_t)j * D, b->f_edge + (size_t)p->fl[j] * D,
               (size_t)D * sizeof(int32_t));
    const int64_t need2 = epxi_bal_build(b, p, a, den); /* the serial build, over the same arrays */
    int same = need2 == need && p->n == n && p->m == m &&
               !memcmp(K.head, p->head, (size_t)n * sizeof(int32_t)) &&
               !memcmp(K.sink, p->sink, (size_t)n * sizeof(int32_t)) &&
               !memcmp(K.next, p->next, (size_t)m * sizeof(int32_t)) &&
               !memcmp(K.to, p->to, (size_t)m * sizeof(int32_t)) &&
               !memcmp(K.cap, p->cap, (size_t)m * sizeof(int64_t));
    for (int32_t gi = 0; gi < p->ng; gi++) same &= K.g_graph[gi] == b->g_graph[p->gl[gi]];
    for (int32_t j = 0; j < p->nf; j++) {
        const int32_t i = p->fl[j], e = b->flex[i];
        if (b->f_level[i] != -1) continue;
        for (int32_t k = 0; k < b->eg_n[e]; k++)
            same &= K.f_edge[(size_t)j * D + k] == b->f_edge[(size_t)i * D + k];
    }
    if (!same) diverged("the lanes' graph build differs from epxi_bal_build");
    K.builds++;
}

void epxi_bal_lanes_keep(const epxi_bal_part *p) {
    check_fits(0, p->m, 0);
    memcpy(K.cap, p->cap, (size_t)p->m * sizeof(int64_t));
}

/* The lanes' greedy start against epxi_bal_greedy from the capacities kept
 * before it: the same flow in every edge and the same total. */
void epxi_bal_lanes_greedy(epxi_bal_part *p, int64_t start) {
    static int64_t lanes_cap[KEEP_EDGES];
    const int32_t m = p->m;
    memcpy(lanes_cap, p->cap, (size_t)m * sizeof(int64_t));
    memcpy(p->cap, K.cap, (size_t)m * sizeof(int64_t));
    const int64_t start2 = epxi_bal_greedy(p, 0);
    if (start2 != start || memcmp(lanes_cap, p->cap, (size_t)m * sizeof(int64_t)))
        diverged("the lanes' greedy start differs from epxi_bal_greedy");
    K.greedies++;
}

/* The lanes' BFS against epxi_bal_bfs on the same residual graph: whether
 * t is reached; if it is, t's distance and every label below it (the serial
 * BFS also labels some nodes at t's distance, met before t: dead ends for
 * the blocking flow); if not, every label. lvl and queue are put back as
 * the lanes left them (queue holds the GPUs' experts since the build). */
void epxi_bal_lanes_bfs(epxi_bal_part *p, int reached) {
    static int32_t lanes_lvl[KEEP_NODES], queue[KEEP_NODES];
    const int32_t n = p->n;
    check_fits(n, 0, 0);
    memcpy(lanes_lvl, p->lvl, (size_t)n * sizeof(int32_t));
    memcpy(queue, p->queue, (size_t)n * sizeof(int32_t));
    const int reached2 = epxi_bal_bfs(p, 0, 1);
    int same = reached2 == reached;
    const int32_t td = reached ? lanes_lvl[1] : INT32_MAX;
    if (reached) same &= p->lvl[1] == td;
    for (int32_t v = 0; v < n && same; v++)
        if (v != 1 &&
            ((lanes_lvl[v] >= 0 && lanes_lvl[v] < td) || (p->lvl[v] >= 0 && p->lvl[v] < td)))
            same &= lanes_lvl[v] == p->lvl[v];
    if (!same) diverged("the lanes' BFS differs from epxi_bal_bfs");
    memcpy(p->lvl, lanes_lvl, (size_t)n * sizeof(int32_t));
    memcpy(p->queue, queue, (size_t)n * sizeof(int32_t));
    K.bfs++;
}

int32_t epxi_bal_lanes_first(int64_t num, int32_t den, int32_t idx) {
    W.v64[my_lane] = num;
    W.v32[my_lane] = den;
    W.vm[my_lane] = (uint32_t)idx;
    barrier(SITE_FIRST);
    num = W.v64[0];
    den = W.v32[0];
    idx = (int32_t)W.vm[0];
    for (int l = 1; l < LANES; l++)
        if (epxi_bal_first_before(W.v64[l], W.v32[l], (int32_t)W.vm[l], num, den, idx)) {
            num = W.v64[l];
            den = W.v32[l];
            idx = (int32_t)W.vm[l];
        }
    barrier(SITE_FIRST);
    return idx;
}

static void *lane_main(void *arg) {
    my_lane = (int)(intptr_t)arg;
    my_syncs = 0;
    epxi_bal_solve_comp(W.b, W.c, my_lane, LANES);
    return NULL;
}

/* Component c of b solved by 32 lanes, as a warp of the kernel does. */
static void solve_on_lanes(epxi_bal *b, int32_t c) {
    pthread_t th[LANES];
    W.b = b;
    W.c = c;
    W.arrived = 0;
    for (int l = 0; l < LANES; l++)
        assert_int_equal(pthread_create(&th[l], NULL, lane_main, (void *)(intptr_t)l), 0);
    for (int l = 0; l < LANES; l++) pthread_join(th[l], NULL);
}

/* ---- the two solves ------------------------------------------------------------- */

typedef struct solver {
    epxi_bal b;
    void *mem;
} solver;

/* A workspace for p with subset tables up to k GPUs (-1: the default) and
 * the closed form on or off, grouped and classified for counts c. */
static solver solver_for(const place *p, const int64_t *c, int k, int closed) {
    solver s;
    memset(&s, 0, sizeof s);
    epxi_bal_shape(&s.b, p->E, p->W, p->P, p->G);
    if (k >= 0) epxi_bal_subsets(&s.b, k);
    s.b.closed = closed;
    s.mem = calloc(1, epxi_bal_carve(&s.b, NULL));
    assert_non_null(s.mem);
    epxi_bal_carve(&s.b, s.mem);
    for (int32_t e = 0; e < p->E; e++) {
        s.b.cnt[e] = c[e];
        epxi_bal_group(&s.b, p->rep, p->nv, e);
    }
    assert_int_equal(epxi_bal_classify(&s.b), EPXI_BAL_OK);
    return s;
}

static int same_i64(const char *what, const int64_t *x, const int64_t *y, size_t n,
                    const char *ctx) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i]) {
            fprintf(stderr, "%s: %s[%zu] = %lld on the lanes, %lld on one thread\n", ctx, what, i,
                    (long long)x[i], (long long)y[i]);
            return 0;
        }
    return 1;
}

static int same_i32(const char *what, const int32_t *x, const int32_t *y, size_t n,
                    const char *ctx) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i]) {
            fprintf(stderr, "%s: %s[%zu] = %d on the lanes, %d on one thread\n", ctx, what, i, x[i],
                    y[i]);
            return 0;
        }
    return 1;
}

/* One layer both ways; returns the number of components the lanes solved
 * by their subsets (so the caller can tell the cases reached them). */
static int32_t one_layer(const place *p, const int64_t *c, int k, int closed, const char *ctx) {
    solver ref = solver_for(p, c, k, closed), lan = solver_for(p, c, k, closed);
    assert_int_equal(epxi_bal_solve(&ref.b), EPXI_BAL_OK);
    epxi_bal *b = &lan.b;
    epxi_bal_unfix(b, 0, 1);
    epxi_bal_components(b);
    int32_t by_subsets = 0;
    for (int32_t ci = 0; ci < b->C; ci++) {
        solve_on_lanes(b, ci);
        by_subsets += b->c_soff[ci] >= 0;
    }
    const epxi_bal *r = &ref.b;
    const size_t G = (size_t)b->G, MD = (size_t)b->M * (size_t)b->D;
    int ok = b->C == r->C && b->M == r->M;
    ok = ok && same_i32("c_levels", b->c_levels, r->c_levels, (size_t)b->C, ctx);
    ok = ok && same_i32("c_rc", b->c_rc, r->c_rc, (size_t)b->C, ctx);
    ok = ok && same_i32("g_level", b->g_level, r->g_level, G, ctx);
    ok = ok && same_i32("f_level", b->f_level, r->f_level, (size_t)b->M, ctx);
    ok = ok && same_i64("f_flow", b->f_flow, r->f_flow, MD, ctx);
    ok = ok && same_i64("f_int", b->f_int, r->f_int, MD, ctx);
    for (int32_t ci = 0; ok && ci < b->C; ci++) {
        size_t l0 = (size_t)b->c_goff[ci], nl = (size_t)b->c_levels[ci];
        ok = same_i64("lv_num", b->lv_num + l0, r->lv_num + l0, nl, ctx) &&
             same_i64("lv_den", b->lv_den + l0, r->lv_den + l0, nl, ctx);
    }
    if (!ok)
        fprintf(stderr, "%s: C = %d, M = %d (one thread: C = %d, M = %d)\n", ctx, b->C, b->M, r->C,
                r->M);
    assert_true(ok);
    free(ref.mem);
    free(lan.mem);
    return by_subsets;
}

/* ---- the cases ------------------------------------------------------------------ */

/* n layers of shape (E, G, per, nodes) at token scales from a few to
 * thousands per expert, and hundreds of millions (a component of 2^26
 * tokens or more splits through its tables, not the lanes' 32-bit
 * registers: epxi_bal_split_regs); returns the components solved by
 * subsets. */
static int32_t layers(tu_rng *r, int n, int32_t E, int32_t G, int32_t per, int32_t nodes, int k,
                      int closed, const char *name) {
    int32_t by_subsets = 0;
    int64_t *c = malloc(sizeof(int64_t) * (size_t)E);
    static const uint32_t scale[] = {1, 3, 40, 1000, 400000000};
    for (int it = 0; it < n; it++) {
        place p = bal_random_place(r, E, G, per, it % 2 ? 8 : 0, nodes);
        bal_random_counts(r, c, E, scale[it % 5]);
        char ctx[160];
        snprintf(ctx, sizeof ctx, "%s layer %d (E %d, G %d, P %d, subsets <= %d, closed %d)", name,
                 it, E, G, p.P, k, closed);
        by_subsets += one_layer(&p, c, k, closed, ctx);
        bal_free_place(&p);
    }
    free(c);
    return by_subsets;
}

static void kimi_k25(void **state) {
    (void)state;
    tu_rng r = {tu_seed(4101)};
    assert_true(layers(&r, 24, 384, 8, 52, 1, -1, 1, "Kimi-K2.5") > 0);
    assert_true(layers(&r, 8, 384, 8, 52, 1, -1, 0, "Kimi-K2.5") > 0);
}

static void deepseek_v3(void **state) {
    (void)state;
    tu_rng r = {tu_seed(4102)};
    assert_true(layers(&r, 16, 256, 32, 9, 4, -1, 1, "DeepSeek-V3 node-local") > 0);
    /* large parts: their levels' graphs are built, started and searched by
     * the lanes, each checked against the serial build, greedy start and BFS (K) */
    const long builds = K.builds, greedies = K.greedies, bfs = K.bfs;
    layers(&r, 8, 256, 32, 9, 1, -1, 1, "DeepSeek-V3 any GPU");
    assert_true(K.builds > builds && K.greedies > greedies && K.bfs > bfs);
}

/* Small layers: components from 2 to 12 GPUs, tables up to 12 GPUs or 3
 * (so some components take the max-flows beside subset-solved ones), the
 * closed form on and off. */
static void small_layers(void **state) {
    (void)state;
    tu_rng r = {tu_seed(4103)};
    static const int ks[] = {-1, 12, 3};
    int32_t by_subsets = 0;
    for (int it = 0; it < 90; it++) {
        int32_t G = 2 + (int32_t)tu_below(&r, 11), per = 2 + (int32_t)tu_below(&r, 6);
        int32_t E = G * per - 1 - (int32_t)tu_below(&r, (uint32_t)(G * per / 3 + 1));
        by_subsets += layers(&r, 1, E < 1 ? 1 : E, G, per, 1, ks[it % 3], it % 4 != 0, "small");
    }
    assert_true(by_subsets > 0);
}

/* The split on masks' three masks (epxi_bal_jm_has, _sup, _in) against
 * their definitions on subset v = lane + 32 j, for every lane, GPU bit and
 * set of at most 8 GPUs. */
static void subset_masks(void **state) {
    (void)state;
    for (int lane = 0; lane < 32; lane++)
        for (uint32_t r = 0; r < 256; r++) {
            const uint32_t sup = epxi_bal_jm_sup(lane, r), in = epxi_bal_jm_in(lane, r);
            const uint32_t has = epxi_bal_jm_has(lane, (int32_t)(r & 7));
            for (uint32_t j = 0; j < 8; j++) {
                const uint32_t v = (uint32_t)lane + 32u * j;
                if ((sup >> j & 1) != ((v & r) == r) || (in >> j & 1) != ((v & ~r) == 0) ||
                    (has >> j & 1) != (v >> (r & 7) & 1))
                    fail_msg("lane %d, set 0x%x, j %u: masks sup 0x%x, in 0x%x, has 0x%x", lane, r,
                             j, sup, in, has);
            }
            assert_int_equal(sup >> 8, 0);
            assert_int_equal(in >> 8, 0);
        }
}

/* EPX_LANES_STATS=1: the __syncwarp barriers a layer takes, and its warp
 * reductions and votes (each one collective: a few shuffles or one vote on
 * the GPU), averaged over 12 random layers per shape and batch of T tokens
 * x top-8 (skewed toward low experts): the length of the solve's chain in
 * steps, a figure that needs no GPU (bench/RESULTS.md). Not the time: the
 * lanes' work between them is not counted. Skipped otherwise. */
static void barrier_counts(void **state) {
    (void)state;
    if (getenv("EPX_LANES_STATS") == NULL) skip();
    static const struct {
        const char *name;
        int32_t E, G, per, nodes;
    } shapes[] = {{"Kimi-K2.5", 384, 8, 52, 1}, {"DeepSeek-V3 node-local", 256, 32, 9, 4}};
    static const int32_t Ts[] = {1, 16, 128, 1024, 4096};
    for (size_t si = 0; si < 2; si++) {
        printf("%-24s", shapes[si].name);
        for (size_t ti = 0; ti < 5; ti++) {
            tu_rng r = {7};
            const int32_t E = shapes[si].E;
            int64_t *c = malloc(sizeof(int64_t) * (size_t)E);
            barriers = collective_barriers = 0;
            for (int it = 0; it < 12; it++) {
                place p =
                    bal_random_place(&r, E, shapes[si].G, shapes[si].per, 8, shapes[si].nodes);
                memset(c, 0, sizeof(int64_t) * (size_t)E);
                for (int32_t t = 0; t < Ts[ti] * 8; t++) {
                    double u = tu_uniform(&r);
                    c[(int32_t)(E * u * u)]++;
                }
                one_layer(&p, c, -1, 1, shapes[si].name);
                bal_free_place(&p);
            }
            printf("  T=%d: %.1f + %.1f", Ts[ti], (double)barriers / 12.0,
                   (double)collective_barriers / 24.0);
            free(c);
        }
        printf("  syncs + collectives a layer\n");
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kimi_k25),       cmocka_unit_test(deepseek_v3),
        cmocka_unit_test(small_layers),   cmocka_unit_test(subset_masks),
        cmocka_unit_test(barrier_counts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
