/*
 * test_plan_epx.c - epx's own placement algorithm (src/plan/epx_*.c).
 *
 *  - random loads and shapes (seed printed): every plan is a valid layout,
 *    replica shares are >= 0 and sum to 1 per expert, the max GPU load on
 *    the summed load is never above DeepSeek's under the same constraints
 *    (even split and with the shares), strict mode keeps every replica on
 *    its group's node, relaxed mode keeps to its cross-node budget, and the
 *    same input gives the same plan;
 *  - references: the water-filled shares against the optimum of a literal
 *    bisection + max-flow; the search against brute force on tiny layers
 *    (it can never claim less than the optimum); the estimates and the
 *    cross-node share against direct recomputations;
 *  - bad options get explained errors;
 *  - back-test on shared/traces (skipped without ../shared): planning on
 *    windows <= w, epx is at least as balanced as DeepSeek on window w + 1,
 *    and in-sample.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "epx/metrics.h"
#include "../src/plan/epx_algo.h"
#include "../src/plan/plan_internal.h"

/* ---- helpers ------------------------------------------------------------- */

/* GPU loads of one layer under an even split (or shares), the test's own. */
static double ref_max_load(const int32_t *map, const double *share, const double *w, int32_t E,
                           int32_t P, int32_t G) {
    int32_t *cnt = calloc((size_t)E, sizeof *cnt);
    double *load = calloc((size_t)G, sizeof *load);
    for (int32_t p = 0; p < P; p++) cnt[map[p]]++;
    const int32_t K = P / G;
    for (int32_t p = 0; p < P; p++)
        load[p / K] += w[map[p]] * (share ? share[p] : 1.0 / cnt[map[p]]);
    double mx = 0.0;
    for (int32_t g = 0; g < G; g++) mx = load[g] > mx ? load[g] : mx;
    free(cnt);
    free(load);
    return mx;
}

/* A random load row: lognormal-ish floats, integers with ties, or sparse. */
static void random_row(tu_rng *r, double *w, int32_t E, int kind) {
    for (int32_t e = 0; e < E; e++) {
        double u = tu_uniform(r);
        if (kind == 0)
            w[e] = exp(3.0 * (u - 0.5) * 2.0) * 100.0;
        else if (kind == 1)
            w[e] = (double)tu_below(r, 8);
        else
            w[e] = tu_below(r, 3) == 0 ? (double)tu_below(r, 1000) : 0.0;
    }
}

typedef struct rshape {
    epx_shape s;
    int32_t groups; /* 0 = none */
} rshape;

static rshape random_shape(tu_rng *r) {
    static const int32_t gpus[] = {1, 2, 4, 8};
    rshape out;
    int32_t G = gpus[tu_below(r, 4)];
    int32_t N = 1;
    if (G > 1 && tu_below(r, 2)) N = G / (1 << tu_below(r, 2)); /* N | G */
    if (N < 1) N = 1;
    int32_t E = 2 + (int32_t)tu_below(r, 46);
    /* groups: a divisor of E that is a multiple of N, when one exists */
    int32_t groups = 0;
    if (tu_below(r, 3) != 0)
        for (int32_t k = N; k <= E; k += N)
            if (E % k == 0 && tu_below(r, 2)) {
                groups = k;
                break;
            }
    int32_t spg = (E + G - 1) / G + (int32_t)tu_below(r, 4);
    if (spg * G < E) spg++;
    out.s = (epx_shape){1 + (int32_t)tu_below(r, 3), E, spg * G, G, N};
    out.groups = groups;
    return out;
}

static epx_counts *random_counts(tu_rng *r, const epx_shape *s, int32_t S) {
    epx_counts *c = NULL;
    epx_error err = {0};
    assert_int_equal(epx_counts_create(S, s->num_layers, s->num_logical_experts, &c, &err), EPX_OK);
    int kind = (int)tu_below(r, 3);
    for (int32_t w = 0; w < S; w++)
        for (int32_t l = 0; l < s->num_layers; l++)
            random_row(r, epx_counts_row(c, w, l), s->num_logical_experts, kind);
    if (s->num_layers > 1 && tu_below(r, 4) == 0) /* a dense layer */
        for (int32_t w = 0; w < S; w++)
            memset(epx_counts_row(c, w, 0), 0, sizeof(double) * (size_t)s->num_logical_experts);
    return c;
}

/* DeepSeek's map under the constraints epx's mode implies, by the public API. */
static int32_t *deepseek_map(const epx_counts *c, const epx_shape *s, int32_t groups, bool hier) {
    epx_plan_opts o = EPX_PLAN_OPTS_INIT;
    o.algorithm = hier ? EPX_ALGO_DEEPSEEK_HIERARCHICAL : EPX_ALGO_DEEPSEEK;
    o.num_groups = groups;
    epx_plan *p = NULL;
    epx_error err = {0};
    epx_status st = epx_plan_compute(c, s, &o, &p, &err);
    if (st != EPX_OK) fprintf(stderr, "deepseek: %s\n", err.msg);
    assert_int_equal(st, EPX_OK);
    size_t LP = (size_t)s->num_layers * (size_t)s->num_physical_experts;
    int32_t *m = malloc(LP * sizeof *m);
    memcpy(m, epx_layout_physical_to_logical(epx_plan_layout(p)), LP * sizeof *m);
    epx_plan_destroy(p);
    return m;
}

/* ---- random plans ----------------------------------------------------------- */

static void check_plan(const epx_counts *c, const epx_shape *s, int32_t groups, epx_node_local mode,
                       int iter) {
    const int32_t L = s->num_layers, E = s->num_logical_experts, P = s->num_physical_experts;
    const int32_t G = s->num_gpus, N = s->num_nodes;
    epx_plan_opts o = EPX_PLAN_OPTS_INIT;
    o.num_groups = groups;
    o.node_local = mode;
    const size_t LP = (size_t)L * (size_t)P;
    int32_t *map = malloc(LP * sizeof *map), *map2 = malloc(LP * sizeof *map2);
    double *share = malloc(LP * sizeof *share), *share2 = malloc(LP * sizeof *share2);
    epx_error err = {0};
    static const epxi_knobs kd = EPXI_KNOBS_DEFAULT;
    epxi_plan_info info;
    epx_status st = epxi_plan_epx_knobs(c, s, &o, &kd, map, share, &info, &err);
    if (st != EPX_OK)
        fprintf(stderr, "iter %d: L%d E%d P%d G%d N%d groups %d mode %d: %s\n", iter, L, E, P, G, N,
                groups, (int)mode, err.msg);
    assert_int_equal(st, EPX_OK);
    /* valid layout */
    epx_layout *lay = NULL;
    assert_int_equal(epx_layout_create_from_map(s, map, &lay, &err), EPX_OK);
    /* shares: >= 0, summing to 1 per expert */
    double *sum = calloc((size_t)E, sizeof *sum);
    for (int32_t l = 0; l < L; l++) {
        memset(sum, 0, (size_t)E * sizeof *sum);
        for (int32_t p = 0; p < P; p++) {
            assert_true(share[(size_t)l * P + p] >= 0.0);
            sum[map[(size_t)l * P + p]] += share[(size_t)l * P + p];
        }
        for (int32_t e = 0; e < E; e++) assert_true(fabs(sum[e] - 1.0) <= 1e-9);
    }
    /* never worse than DeepSeek under the same constraints, on the summed
     * load; unless the history moved (then the plan is made for the
     * estimate alone, and the sum is not its target) */
    const bool node_local = N > 1 && groups > 0 && groups % N == 0 && mode != EPX_NODE_LOCAL_OFF;
    int32_t *ds = deepseek_map(c, s, groups, node_local);
    double *w = calloc((size_t)E, sizeof *w);
    for (int32_t l = 0; l < L; l++) {
        memset(w, 0, (size_t)E * sizeof *w);
        for (int32_t win = 0; win < c->num_windows; win++)
            for (int32_t e = 0; e < E; e++) w[e] += epx_counts_row(c, win, l)[e];
        double d = ref_max_load(ds + (size_t)l * P, NULL, w, E, P, G);
        double me = ref_max_load(map + (size_t)l * P, NULL, w, E, P, G);
        double mw = ref_max_load(map + (size_t)l * P, share + (size_t)l * P, w, E, P, G);
        if (info.tracked) continue;
        if (me > d * (1 + 1e-12) + 1e-12 || mw > d * (1 + 1e-9) + 1e-9)
            fprintf(stderr, "iter %d layer %d: deepseek %.17g, epx even %.17g, shares %.17g\n",
                    iter, l, d, me, mw);
        assert_true(me <= d * (1 + 1e-12) + 1e-12);
        assert_true(mw <= d * (1 + 1e-9) + 1e-9);
    }
    /* node locality */
    if (node_local && (mode == EPX_NODE_LOCAL_STRICT || mode == EPX_NODE_LOCAL_RELAXED)) {
        const int32_t gs = E / groups, ppn = P / N;
        int32_t *home = malloc((size_t)groups * sizeof *home);
        for (int32_t l = 0; l < L; l++) {
            const int32_t *m = map + (size_t)l * P;
            /* strict: one node per group; relaxed: count replicas off the
             * node that holds most of the group's replicas */
            int32_t off = 0;
            for (int32_t g = 0; g < groups; g++) {
                int32_t best = 0, bestn = -1;
                for (int32_t n = 0; n < N; n++) {
                    int32_t k = 0;
                    for (int32_t p = n * ppn; p < (n + 1) * ppn; p++) k += m[p] / gs == g;
                    if (k > best) best = k, bestn = n;
                }
                home[g] = bestn;
            }
            for (int32_t p = 0; p < P; p++) off += p / ppn != home[m[p] / gs];
            if (mode == EPX_NODE_LOCAL_STRICT)
                assert_int_equal(off, 0);
            else
                assert_true(off <= (int32_t)(EPXI_DEFAULT_CROSS_NODE_BUDGET * (P - E)));
        }
        free(home);
        double cross = -1.0;
        assert_int_equal(epx_plan_cross_node_share(lay, share, c, groups, NULL, &cross, &err),
                         EPX_OK);
        if (mode == EPX_NODE_LOCAL_STRICT) assert_true(cross == 0.0);
        assert_true(cross >= 0.0 && cross <= 1.0);
    }
    /* deterministic */
    assert_int_equal(epxi_plan_epx(c, s, &o, map2, share2, &err), EPX_OK);
    assert_memory_equal(map, map2, LP * sizeof *map);
    assert_memory_equal(share, share2, LP * sizeof *share);
    free(w), free(ds), free(sum), free(map), free(map2), free(share), free(share2);
    epx_layout_destroy(lay);
}

static void random_plans(void **state) {
    (void)state;
    tu_rng r = {tu_seed(20261202)};
    for (int iter = 0; iter < 300; iter++) {
        rshape rs = random_shape(&r);
        int32_t S = 1 + (int32_t)tu_below(&r, 4);
        epx_counts *c = random_counts(&r, &rs.s, S);
        epx_node_local mode = EPX_NODE_LOCAL_DEFAULT;
        bool fits = rs.s.num_nodes > 1 && rs.groups > 0 && rs.groups % rs.s.num_nodes == 0;
        if (fits || rs.s.num_nodes == 1)
            mode = (epx_node_local)tu_below(&r, 4);
        else
            mode = tu_below(&r, 2) ? EPX_NODE_LOCAL_OFF : EPX_NODE_LOCAL_DEFAULT;
        check_plan(c, &rs.s, rs.groups, mode, iter);
        epx_counts_destroy(c);
    }
}

/* Through the public entry point, with each estimate. */
static void public_api_estimates(void **state) {
    (void)state;
    tu_rng r = {tu_seed(7)};
    const epx_estimate kinds[] = {EPX_ESTIMATE_DEFAULT, EPX_ESTIMATE_SUM, EPX_ESTIMATE_RECENCY,
                                  EPX_ESTIMATE_MEAN_STD, EPX_ESTIMATE_MINMAX};
    for (int iter = 0; iter < 40; iter++) {
        rshape rs = random_shape(&r);
        epx_counts *c = random_counts(&r, &rs.s, 1 + (int32_t)tu_below(&r, 5));
        epx_plan_opts o = EPX_PLAN_OPTS_INIT;
        o.num_groups = rs.groups;
        o.estimate = kinds[iter % 5];
        epx_plan *p = NULL;
        epx_error err = {0};
        epx_status st = epx_plan_compute(c, &rs.s, &o, &p, &err);
        if (st != EPX_OK) fprintf(stderr, "%s\n", err.msg);
        assert_int_equal(st, EPX_OK);
        assert_int_equal(epx_plan_algorithm(p), EPX_ALGO_EPX);
        epx_plan_destroy(p);
        epx_counts_destroy(c);
    }
}

/* ---- references ---------------------------------------------------------------- */

/* Literal max-flow (Edmonds-Karp on a dense matrix): can the load w be
 * routed to the GPUs holding each expert with no GPU above T? */
static bool ref_feasible(const int32_t *map, const double *w, int32_t E, int32_t P, int32_t G,
                         double T) {
    const int32_t n = E + G + 2, src = E + G, dst = E + G + 1, K = P / G;
    double *cap = calloc((size_t)n * n, sizeof *cap);
    int32_t *prev = malloc((size_t)n * sizeof *prev), *queue = malloc((size_t)n * sizeof *queue);
    double total = 0.0;
    for (int32_t e = 0; e < E; e++) cap[src * n + e] = w[e], total += w[e];
    for (int32_t p = 0; p < P; p++) cap[map[p] * n + E + p / K] = 1e300;
    for (int32_t g = 0; g < G; g++) cap[(E + g) * n + dst] = T;
    double flow = 0.0;
    for (;;) {
        for (int32_t i = 0; i < n; i++) prev[i] = -1;
        int32_t qh = 0, qt = 0;
        queue[qt++] = src;
        prev[src] = src;
        while (qh < qt && prev[dst] < 0) {
            int32_t u = queue[qh++];
            for (int32_t v = 0; v < n; v++)
                if (prev[v] < 0 && cap[u * n + v] > 1e-12) prev[v] = u, queue[qt++] = v;
        }
        if (prev[dst] < 0) break;
        double aug = 1e300;
        for (int32_t v = dst; v != src; v = prev[v])
            aug = cap[prev[v] * n + v] < aug ? cap[prev[v] * n + v] : aug;
        for (int32_t v = dst; v != src; v = prev[v]) {
            cap[prev[v] * n + v] -= aug;
            cap[v * n + prev[v]] += aug;
        }
        flow += aug;
    }
    free(cap), free(prev), free(queue);
    return flow >= total * (1 - 1e-9);
}

static void shares_vs_maxflow(void **state) {
    (void)state;
    tu_rng r = {tu_seed(99)};
    for (int iter = 0; iter < 150; iter++) {
        int32_t G = 1 + (int32_t)tu_below(&r, 6), E = 1 + (int32_t)tu_below(&r, 12);
        int32_t K = (E + G - 1) / G + (int32_t)tu_below(&r, 3), P = K * G;
        int32_t *map = malloc((size_t)P * sizeof *map);
        for (int32_t p = 0; p < P; p++) map[p] = p < E ? p : (int32_t)tu_below(&r, (uint32_t)E);
        for (int32_t p = P - 1; p > 0; p--) { /* shuffle */
            int32_t q = (int32_t)tu_below(&r, (uint32_t)p + 1), t = map[p];
            map[p] = map[q], map[q] = t;
        }
        double *w = malloc((size_t)E * sizeof *w), *share = malloc((size_t)P * sizeof *share);
        random_row(&r, w, E, (int)tu_below(&r, 3));
        epxi_shares_ws *ws = NULL;
        epx_error err = {0};
        assert_int_equal(epxi_shares_ws_create(E, P, G, &ws, &err), EPX_OK);
        double got = epxi_shares_compute(ws, map, w, E, P, G, 100000, share);
        double even = ref_max_load(map, NULL, w, E, P, G);
        assert_true(fabs(got - ref_max_load(map, share, w, E, P, G)) <= 1e-9 * (even + 1));
        assert_true(got <= even * (1 + 1e-12) + 1e-12);
        /* the optimum by bisection on T with the literal max-flow */
        double lo = 0.0, hi = even;
        for (int i = 0; i < 60; i++) {
            double mid = 0.5 * (lo + hi);
            if (ref_feasible(map, w, E, P, G, mid))
                hi = mid;
            else
                lo = mid;
        }
        if (fabs(got - hi) > 1e-6 * (hi + 1e-9))
            fprintf(stderr, "iter %d: water-filling %.12g, optimum %.12g\n", iter, got, hi);
        assert_true(fabs(got - hi) <= 1e-6 * (hi + 1e-9));
        epxi_shares_ws_destroy(ws);
        free(map), free(w), free(share);
    }
}

/* An expert whose load rounds to nothing against the GPU loads it is poured
 * onto (1e-300 against 1e6) once gave 0 / 0 shares; it keeps the even split. */
static void shares_of_a_vanishing_load(void **state) {
    (void)state;
    const int32_t E = 3, P = 4, G = 2;
    const int32_t map[4] = {0, 2, 1, 2}; /* expert 2 on both GPUs */
    const double w[3] = {1e6, 1e6, 1e-300};
    double share[4];
    epxi_shares_ws *ws = NULL;
    epx_error err = {0};
    assert_int_equal(epxi_shares_ws_create(E, P, G, &ws, &err), EPX_OK);
    double got = epxi_shares_compute(ws, map, w, E, P, G, 100, share);
    assert_true(isfinite(got));
    for (int32_t p = 0; p < P; p++) assert_true(isfinite(share[p]) && share[p] >= 0.0);
    assert_true(fabs(share[1] + share[3] - 1.0) <= 1e-12);
    epxi_shares_ws_destroy(ws);
}

/* Sparse per-pass rows, as a recorder dump holds them: thousands of windows
 * of a few tokens each, many experts (and some whole layers) idle. The
 * recency weights of old windows underflow toward 0, which once made the
 * shares NaN; every plan must be valid with finite shares. */
static void sparse_per_pass_rows(void **state) {
    (void)state;
    tu_rng r = {tu_seed(4096)};
    const int32_t S = 4096;
    for (int iter = 0; iter < 6; iter++) {
        rshape rs = random_shape(&r);
        const int32_t L = rs.s.num_layers, E = rs.s.num_logical_experts;
        epx_counts *c = NULL;
        epx_error err = {0};
        assert_int_equal(epx_counts_create(S, L, E, &c, &err), EPX_OK);
        for (int32_t s = 0; s < S; s++)
            for (int32_t l = 1; l < L; l++) { /* layer 0 stays all zero */
                double *row = epx_counts_row(c, s, l);
                for (int k = 0; k < 2; k++) /* a couple of tokens per pass */
                    if (tu_below(&r, 4) == 0) row[tu_below(&r, (uint32_t)E)] += 1.0;
            }
        /* one expert seen only in the oldest pass */
        epx_counts_row(c, 0, L - 1)[E - 1] += 1.0;
        check_plan(c, &rs.s, rs.groups, EPX_NODE_LOCAL_DEFAULT, iter);
        epx_counts_destroy(c);
    }
}

/* Shift detection: a trace whose hot experts move in its last window picks
 * the shortest half-life and is planned for the estimate alone; a
 * stationary one picks a long half-life or the sum and keeps the summed
 * cap (with it the in-sample guarantee against DeepSeek). */
static void shift_detection(void **state) {
    (void)state;
    const epx_model *m = NULL;
    epx_error err = {0};
    assert_int_equal(epx_model_lookup("qwen3-30b", &m, &err), EPX_OK);
    epx_trace_opts o = EPX_TRACE_OPTS_INIT;
    o.num_windows = 6;
    o.tokens = 1 << 16;
    o.drift = 0.0;
    epx_counts *c = NULL;
    assert_int_equal(epx_trace_synth(m, &o, &c, &err), EPX_OK);
    assert_true(epxi_choose_half_life(c, NULL) >= 2.0);
    epx_counts_destroy(c);
    o.shift_window = 5;
    o.shift_layers = 0.5;
    assert_int_equal(epx_trace_synth(m, &o, &c, &err), EPX_OK);
    assert_true(epxi_choose_half_life(c, NULL) == 0.25);
    /* the plan: tracked, valid */
    epx_shape s = {c->num_layers, c->num_experts, c->num_experts + 32, 8, 1};
    const size_t LP = (size_t)s.num_layers * (size_t)s.num_physical_experts;
    int32_t *map = malloc(LP * sizeof *map);
    double *share = malloc(LP * sizeof *share);
    epx_plan_opts po = EPX_PLAN_OPTS_INIT;
    static const epxi_knobs kd = EPXI_KNOBS_DEFAULT;
    epxi_plan_info info;
    assert_int_equal(epxi_plan_epx_knobs(c, &s, &po, &kd, map, share, &info, &err), EPX_OK);
    assert_true(info.tracked && info.half_life == 0.25);
    epx_layout *lay = NULL;
    assert_int_equal(epx_layout_create_from_map(&s, map, &lay, &err), EPX_OK);
    epx_layout_destroy(lay);
    /* two windows are too few to tell a move from noise */
    epx_counts v = *c;
    v.num_windows = 2;
    assert_true(isinf(epxi_choose_half_life(&v, NULL)));
    free(map), free(share);
    epx_counts_destroy(c);
}

/* epx_plan_refit_shares: plan once, re-fit the shares to another window's
 * counts. The shares are valid, never worse than the even split on that
 * window, identical to the planner's water-filling layer by layer, and the
 * even split on a layer without load; bad loads are explained errors. */
static void refit_shares(void **state) {
    (void)state;
    tu_rng r = {tu_seed(1616)};
    for (int iter = 0; iter < 40; iter++) {
        rshape rs = random_shape(&r);
        const epx_shape *s = &rs.s;
        const int32_t L = s->num_layers, E = s->num_logical_experts;
        const int32_t P = s->num_physical_experts, G = s->num_gpus;
        epx_counts *c = random_counts(&r, s, 2);
        epx_counts first = *c;
        first.num_windows = 1;
        epx_plan_opts o = EPX_PLAN_OPTS_INIT;
        epx_plan *plan = NULL;
        epx_error err = {0};
        assert_int_equal(epx_plan_compute(&first, s, &o, &plan, &err), EPX_OK);
        const epx_layout *lay = epx_plan_layout(plan);
        const int32_t *map = epx_layout_physical_to_logical(lay);
        const double *next = epx_counts_row(c, 1, 0); /* [L][E] */
        double *share = malloc((size_t)L * P * sizeof *share);
        double *ref = malloc((size_t)P * sizeof *ref);
        assert_int_equal(epx_plan_refit_shares(lay, next, share, &err), EPX_OK);
        epxi_shares_ws *ws = NULL;
        assert_int_equal(epxi_shares_ws_create(E, P, G, &ws, &err), EPX_OK);
        for (int32_t l = 0; l < L; l++) {
            const int32_t *m = map + (size_t)l * P;
            const double *w = next + (size_t)l * E, *sh = share + (size_t)l * P;
            double *sum = calloc((size_t)E, sizeof *sum);
            for (int32_t p = 0; p < P; p++) {
                assert_true(sh[p] >= 0.0 && isfinite(sh[p]));
                sum[m[p]] += sh[p];
            }
            for (int32_t e = 0; e < E; e++) assert_true(fabs(sum[e] - 1.0) <= 1e-9);
            free(sum);
            const double even = ref_max_load(m, NULL, w, E, P, G);
            assert_true(ref_max_load(m, sh, w, E, P, G) <= even * (1 + 1e-12) + 1e-12);
            (void)epxi_shares_compute(ws, m, w, E, P, G, EPXI_REFIT_SWEEPS, ref);
            assert_memory_equal(ref, sh, (size_t)P * sizeof *ref);
        }
        epxi_shares_ws_destroy(ws);
        /* a layer without load: the even split */
        double *zero = calloc((size_t)L * E, sizeof *zero);
        assert_int_equal(epx_plan_refit_shares(lay, zero, share, &err), EPX_OK);
        int32_t *cnt = calloc((size_t)E, sizeof *cnt);
        for (int32_t p = 0; p < P; p++) cnt[map[p]]++;
        for (int32_t p = 0; p < P; p++) assert_true(share[p] == 1.0 / cnt[map[p]]);
        free(cnt);
        /* bad loads */
        zero[(size_t)(L - 1) * E + (E - 1)] = NAN;
        assert_int_equal(epx_plan_refit_shares(lay, zero, share, &err), EPX_ERR_INVALID_ARG);
        char want[64];
        snprintf(want, sizeof want, "layer %d, expert %d", L - 1, E - 1);
        assert_non_null(strstr(err.msg, want));
        assert_int_equal(epx_plan_refit_shares(NULL, zero, share, &err), EPX_ERR_INVALID_ARG);
        free(zero), free(share), free(ref);
        epx_plan_destroy(plan);
        epx_counts_destroy(c);
    }
}

/* Brute force over every map of a tiny layer (each expert >= 1 replica):
 * the search's result is a real placement, never better than the optimum,
 * never worse than its greedy start, and often optimal. */
static double brute(const double *w, int32_t E, int32_t P, int32_t G, int32_t *map, int32_t p) {
    if (p == P) {
        int32_t *cnt = calloc((size_t)E, sizeof *cnt);
        for (int32_t q = 0; q < P; q++) cnt[map[q]]++;
        bool ok = true;
        for (int32_t e = 0; e < E; e++) ok &= cnt[e] > 0;
        free(cnt);
        return ok ? ref_max_load(map, NULL, w, E, P, G) : HUGE_VAL;
    }
    double best = HUGE_VAL;
    for (int32_t e = 0; e < E; e++) {
        map[p] = e;
        double v = brute(w, E, P, G, map, p + 1);
        best = v < best ? v : best;
    }
    return best;
}

static void search_vs_brute_force(void **state) {
    (void)state;
    tu_rng r = {tu_seed(4242)};
    int optimal = 0, runs = 0;
    for (int iter = 0; iter < 120; iter++) {
        int32_t G = 1 + (int32_t)tu_below(&r, 3), K = 1 + (int32_t)tu_below(&r, 3);
        int32_t P = G * K;
        if (P > 7) continue;
        int32_t E = 1 + (int32_t)tu_below(&r, (uint32_t)P);
        double *w = malloc((size_t)E * sizeof *w);
        random_row(&r, w, E, (int)tu_below(&r, 2));
        int32_t *map = malloc((size_t)P * sizeof *map), *tmp = malloc((size_t)P * sizeof *tmp);
        double opt = brute(w, E, P, G, tmp, 0);
        epxi_search *s = NULL;
        epx_error err = {0};
        assert_int_equal(epxi_search_create(E, P, G, 1, &s, &err), EPX_OK);
        epxi_search_begin(s, w, NULL, 0);
        epxi_search_init_lpt(s);
        double start = epxi_search_max_load(s);
        (void)epxi_search_fix_duplicates(s, false);
        (void)epxi_search_improve(s, 1000);
        (void)epxi_search_fix_duplicates(s, true);
        epxi_search_export(s, map);
        double got = ref_max_load(map, NULL, w, E, P, G);
        assert_true(fabs(got - epxi_search_max_load(s)) <= 1e-9 * (got + 1));
        assert_true(got >= opt * (1 - 1e-12));
        assert_true(got <= start * (1 + 1e-12) + 1e-12 || start < opt); /* dup fixing may lift */
        epx_layout *lay = NULL;
        epx_shape sh = {1, E, P, G, 1};
        assert_int_equal(epx_layout_create_from_map(&sh, map, &lay, &err), EPX_OK);
        epx_layout_destroy(lay);
        optimal += got <= opt * (1 + 1e-12);
        runs++;
        epxi_search_destroy(s);
        free(w), free(map), free(tmp);
    }
    fprintf(stderr, "search reached the brute-force optimum in %d of %d tiny layers\n", optimal,
            runs);
    assert_true(optimal * 10 >= runs * 7); /* a heuristic, but a good one */
}

static void estimates_by_hand(void **state) {
    (void)state;
    epx_counts *c = NULL;
    epx_error err = {0};
    assert_int_equal(epx_counts_create(3, 1, 2, &c, &err), EPX_OK);
    const double v[3][2] = {{1, 10}, {3, 10}, {5, 40}};
    for (int s = 0; s < 3; s++)
        for (int e = 0; e < 2; e++) epx_counts_row(c, s, 0)[e] = v[s][e];
    double out[2];
    epxi_estimate_layer(c, 0, EPX_ESTIMATE_SUM, -1, out);
    assert_true(out[0] == 9 && out[1] == 60);
    /* half-life 1: weights 1/4, 1/2, 1 normalised to sum to S = 3 */
    epxi_estimate_layer(c, 0, EPX_ESTIMATE_RECENCY, 1.0, out);
    const double a = 3.0 / 1.75;
    assert_true(fabs(out[0] - a * (0.25 * 1 + 0.5 * 3 + 5)) < 1e-12);
    assert_true(fabs(out[1] - a * (0.25 * 10 + 0.5 * 10 + 40)) < 1e-12);
    /* mean + 1 sd (population), scaled by S */
    epxi_estimate_layer(c, 0, EPX_ESTIMATE_MEAN_STD, 1.0, out);
    assert_true(fabs(out[0] - 3 * (3 + sqrt(8.0 / 3))) < 1e-12);
    assert_true(fabs(out[1] - 3 * (20 + sqrt(200.0))) < 1e-9);
    epx_counts_destroy(c);
}

static void cross_node_by_hand(void **state) {
    (void)state;
    /* 4 experts in 2 groups on 2 nodes x 1 GPU x 3 slots. */
    epx_shape s = {1, 4, 6, 2, 2};
    const int32_t map[6] = {0, 1, 2, /* node 1: */ 2, 3, 3};
    epx_layout *lay = NULL;
    epx_error err = {0};
    assert_int_equal(epx_layout_create_from_map(&s, map, &lay, &err), EPX_OK);
    epx_counts *c = NULL;
    assert_int_equal(epx_counts_create(1, 1, 4, &c, &err), EPX_OK);
    const double w[4] = {10, 20, 30, 40};
    memcpy(c->data, w, sizeof w);
    double share = -1, per[1];
    /* even split: group 0 (experts 0, 1) all on node 0; group 1: expert 2
     * half on each node (15 / 15), expert 3 on node 1 (40): home node 1,
     * off-node 15 of 100. */
    assert_int_equal(epx_plan_cross_node_share(lay, NULL, c, 2, per, &share, &err), EPX_OK);
    assert_true(fabs(share - 0.15) < 1e-12 && fabs(per[0] - 0.15) < 1e-12);
    /* weights sending all of expert 2 to node 1: no cross-node load */
    const double wt[6] = {1, 1, 0, 1, 0.5, 0.5};
    assert_int_equal(epx_plan_cross_node_share(lay, wt, c, 2, NULL, &share, &err), EPX_OK);
    assert_true(fabs(share) < 1e-12);
    /* one group: home is node 1 (30 * 0.5 + 40 = 55 of 100), off-node 45 */
    assert_int_equal(epx_plan_cross_node_share(lay, NULL, c, 1, NULL, &share, &err), EPX_OK);
    assert_true(fabs(share - 0.45) < 1e-12);
    assert_int_equal(epx_plan_cross_node_share(lay, NULL, c, 3, NULL, &share, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "num_groups (3)", "divide");
    /* NaN or negative loads and weights: the share was 0 (or garbage) */
    const double bad_wt[6] = {1, 1, 0, -1, 0.5, 0.5};
    assert_int_equal(epx_plan_cross_node_share(lay, bad_wt, c, 2, NULL, &share, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "weights[3] is -1");
    c->data[1] = NAN;
    assert_int_equal(epx_plan_cross_node_share(lay, NULL, c, 2, NULL, &share, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "counts[1] is nan");
    double gl[4] = {1, NAN, 2, 2}, bal = 0;
    assert_int_equal(epx_gpu_loads_balance(gl, 2, 2, &bal, NULL, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "gpu_load[1] is nan");
    gl[1] = -3;
    assert_int_equal(epx_gpu_loads_balance(gl, 2, 2, &bal, NULL, &err), EPX_ERR_INVALID_ARG);
    epx_counts_destroy(c);
    epx_layout_destroy(lay);
}

/* ---- errors ---------------------------------------------------------------------- */

static void bad_options(void **state) {
    (void)state;
    epx_shape s = {2, 16, 32, 8, 2};
    epx_counts *c = NULL;
    epx_error err = {0};
    assert_int_equal(epx_counts_create(1, 2, 16, &c, &err), EPX_OK);
    for (int i = 0; i < 32; i++) c->data[i] = 1 + i % 5;
    int32_t map[64];
    double share[64];
    epx_plan_opts o = EPX_PLAN_OPTS_INIT;
    o.node_local = EPX_NODE_LOCAL_STRICT; /* no groups: cannot be node-local */
    assert_int_equal(epxi_plan_epx(c, &s, &o, map, share, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "node-local strict", "num_groups (1)", "num_nodes (2)", "off");
    o.num_groups = 4;
    o.cross_node_budget = 2.0;
    o.node_local = EPX_NODE_LOCAL_RELAXED;
    assert_int_equal(epxi_plan_epx(c, &s, &o, map, share, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "cross_node_budget (2)", "[0, 1]");
    o.cross_node_budget = -1.0;
    o.num_groups = 3;
    assert_int_equal(epxi_plan_epx(c, &s, &o, map, share, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "num_groups (3)", "16 experts");
    epx_shape s2 = {3, 16, 32, 8, 2};
    o.num_groups = 4;
    assert_int_equal(epxi_plan_epx(c, &s2, &o, map, share, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "[2][16]", "3 layers");
    /* and through the public API: the default relaxed mode with groups works */
    epx_plan *p = NULL;
    assert_int_equal(epx_plan_compute(c, &s, &o, &p, &err), EPX_OK);
    epx_plan_destroy(p);
    epx_counts_destroy(c);
}

/* ---- back-test on the shared traces -------------------------------------------------- */

static double balancedness(const int32_t *map, const double *share, const double *load,
                           const epx_shape *s) {
    epx_layout *lay = NULL;
    epx_error err = {0};
    assert_int_equal(epx_layout_create_from_map(s, map, &lay, &err), EPX_OK);
    epx_balance b;
    assert_int_equal(epx_balance_compute(lay, load, share, &b, NULL, &err), EPX_OK);
    epx_layout_destroy(lay);
    return b.balancedness;
}

static void backtest_traces(void **state) {
    (void)state;
    const char *shared = tu_shared_dir();
    if (shared == NULL) {
        fprintf(stderr, "skipping the back-test: ../shared is not present\n");
        skip();
    }
    struct {
        const char *trace;
        int32_t G, N, P, groups;
    } cases[] = {{"kimi_k2", 8, 1, 416, 0},      {"deepseek_v3", 32, 4, 288, 8},
                 {"deepseek_v3", 64, 8, 320, 8}, {"qwen3_235b", 16, 2, 160, 0},
                 {"gpt_oss_120b", 8, 1, 160, 0}, {"mixtral_8x7b", 8, 1, 16, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/traces/%s.json", shared, cases[i].trace);
        epx_counts *c = NULL;
        epx_error err = {0};
        assert_int_equal(epx_counts_read(path, &c, &err), EPX_OK);
        epx_shape s = {c->num_layers, c->num_experts, cases[i].P, cases[i].G, cases[i].N};
        const int32_t S = c->num_windows;
        const size_t LP = (size_t)s.num_layers * (size_t)s.num_physical_experts;
        int32_t *map = malloc(LP * sizeof *map);
        double *share = malloc(LP * sizeof *share);
        double *sum = malloc((size_t)s.num_layers * s.num_logical_experts * sizeof *sum);
        double epx_next = 0, ds_next = 0, epx_in = 0, ds_in = 0;
        bool tracked = false;
        for (int32_t w = 0; w < S; w++) {
            epx_counts v = *c;
            v.num_windows = w + 1;
            epx_plan_opts o = EPX_PLAN_OPTS_INIT;
            o.num_groups = cases[i].groups;
            static const epxi_knobs kd = EPXI_KNOBS_DEFAULT;
            epxi_plan_info info;
            assert_int_equal(epxi_plan_epx_knobs(&v, &s, &o, &kd, map, share, &info, &err), EPX_OK);
            int32_t *ds =
                deepseek_map(&v, &s, cases[i].groups, cases[i].groups > 0 && cases[i].N > 1);
            if (w + 1 == S && info.tracked) {
                /* The history moved: the plan was made for the estimate
                 * alone, and must beat DeepSeek's plan of that estimate on
                 * it (the sum is no longer the target). */
                epx_counts *one = NULL;
                assert_int_equal(
                    epx_counts_create(1, s.num_layers, s.num_logical_experts, &one, &err), EPX_OK);
                for (int32_t l = 0; l < s.num_layers; l++)
                    epxi_estimate_layer(&v, l, EPX_ESTIMATE_RECENCY, info.half_life,
                                        epx_counts_row(one, 0, l));
                int32_t *dse =
                    deepseek_map(one, &s, cases[i].groups, cases[i].groups > 0 && cases[i].N > 1);
                const double be = balancedness(map, share, one->data, &s);
                const double bd = balancedness(dse, NULL, one->data, &s);
                fprintf(stderr,
                        "%s: tracked (half-life %g): on the estimate epx %.4f, deepseek "
                        "%.4f\n",
                        cases[i].trace, info.half_life, be, bd);
                assert_true(be >= bd - 1e-12);
                free(dse);
                epx_counts_destroy(one);
                tracked = true;
            }
            if (w + 1 < S) {
                const double *next = epx_counts_row(c, w + 1, 0);
                epx_next += balancedness(map, share, next, &s) / (S - 1);
                ds_next += balancedness(ds, NULL, next, &s) / (S - 1);
            } else {
                assert_int_equal(epx_counts_sum_windows(c, 0, S, sum, &err), EPX_OK);
                epx_in = balancedness(map, share, sum, &s);
                ds_in = balancedness(ds, NULL, sum, &s);
            }
            free(ds);
        }
        fprintf(stderr,
                "%s %d GPUs/%d nodes/%d: in-sample deepseek %.4f epx %.4f; next "
                "window deepseek %.4f epx %.4f\n",
                cases[i].trace, s.num_gpus, s.num_nodes, s.num_physical_experts, ds_in, epx_in,
                ds_next, epx_next);
        if (!tracked) assert_true(epx_in >= ds_in - 1e-12);
        assert_true(epx_next >= ds_next);
        free(map), free(share), free(sum);
        epx_counts_destroy(c);
    }
}

/* epxi_sort_desc (radix from 64 keys, merge sort below) against a plain
 * stable insertion sort: descending, ties in input order, with many ties,
 * both zeros (equal), negatives and infinities, at sizes on both sides of
 * the switch; a NaN key falls back to the merge sort (a permutation). */
static void sort_desc_vs_insertion(void **state) {
    (void)state;
    tu_rng r = {tu_seed(6464)};
    static const double pool[] = {0.0,    -0.0,      1.0,      -1.0,      2.5,   1e-300,
                                  -1e300, 7.0 / 3.0, HUGE_VAL, -HUGE_VAL, 1e300, 0.5};
    enum { NMAX = 700 };
    double *key = malloc(NMAX * sizeof *key);
    int32_t *idx = malloc(NMAX * sizeof *idx), *tmp = malloc(NMAX * sizeof *tmp);
    int32_t *ref = malloc(NMAX * sizeof *ref);
    assert_non_null(key), assert_non_null(idx), assert_non_null(tmp), assert_non_null(ref);
    for (int round = 0; round < 300; round++) {
        const int32_t n = 1 + (int32_t)tu_below(&r, round < 150 ? 130 : NMAX);
        const uint32_t spread = 1 + tu_below(&r, 3);
        for (int32_t i = 0; i < n; i++) {
            const uint32_t k = tu_below(&r, 3 * spread);
            key[i] = k < 2 * spread ? pool[tu_below(&r, sizeof pool / sizeof *pool)]
                                    : tu_uniform(&r) * (k == 2 * spread ? -1e6 : 1e-3);
            idx[i] = (int32_t)(n - 1 - i); /* not ascending: ties keep this order */
            ref[i] = idx[i];
        }
        for (int32_t i = 1; i < n; i++) {
            const int32_t v = ref[i];
            int32_t j = i;
            while (j > 0 && key[ref[j - 1]] < key[v]) ref[j] = ref[j - 1], j--;
            ref[j] = v;
        }
        epxi_sort_desc(key, idx, n, tmp);
        assert_memory_equal(idx, ref, (size_t)n * sizeof *idx);
    }
    const int32_t n = 100;
    for (int32_t i = 0; i < n; i++) key[i] = (double)(i % 7), idx[i] = i;
    key[37] = NAN;
    epxi_sort_desc(key, idx, n, tmp);
    int32_t seen = 0;
    for (int32_t i = 0; i < n; i++) seen += idx[i] >= 0 && idx[i] < n;
    memset(ref, 0, (size_t)n * sizeof *ref);
    for (int32_t i = 0; i < n; i++) ref[idx[i]]++;
    for (int32_t i = 0; i < n; i++) assert_int_equal(ref[i], 1);
    assert_int_equal(seen, n);
    free(key), free(idx), free(tmp), free(ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sort_desc_vs_insertion), cmocka_unit_test(random_plans),
        cmocka_unit_test(public_api_estimates),   cmocka_unit_test(shares_vs_maxflow),
        cmocka_unit_test(search_vs_brute_force),  cmocka_unit_test(estimates_by_hand),
        cmocka_unit_test(cross_node_by_hand),     cmocka_unit_test(bad_options),
        cmocka_unit_test(backtest_traces),        cmocka_unit_test(shares_of_a_vanishing_load),
        cmocka_unit_test(sparse_per_pass_rows),   cmocka_unit_test(shift_detection),
        cmocka_unit_test(refit_shares),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
