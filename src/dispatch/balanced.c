/*
 * balanced.c - exact per-batch balanced routing (epx/dispatch.h, part 4).
 *
 * The problem. Expert e has c_e tokens and replicas on a set of GPUs N(e)
 * (several replicas on one GPU count as one edge and split its share
 * evenly). A split is a flow x_eg >= 0 with sum_g x_eg = c_e; GPU g's load
 * is L_g = sum_e x_eg. SGLang 0.5.23's LP minimises max_g L_g. By max-flow /
 * min-cut (Hall's condition), loads <= lambda are feasible iff every set S
 * of experts fits its neighbourhood: C(S) <= lambda |N(S)|, so the optimum
 * is lambda* = max_S C(S) / |N(S)|, a fraction with denominator <= G.
 *
 * The algorithm (Dinkelbach's iteration for that max ratio, one max-flow per
 * step, exact in integers). Start with S = all experts, lambda = a / b with
 * a = C(S), b = |N(S)|. Test lambda with a max-flow on s -> e (capacity
 * b c_e), e -> g (unbounded, g in N(e)), g -> t (capacity a): everything
 * scaled by b, so capacities stay integers. If the flow carries all b C,
 * lambda is feasible, and since S attains it, lambda = lambda*. If not, the
 * min cut's source side is a set S' with C(S') b > a |N(S')|: set
 * lambda = C(S') / |N(S')| and test again. |N(S)| falls at every step, so
 * there are at most G + 1 max-flows.
 *
 * Water-filling on top (the lexicographic optimum). At lambda* the experts
 * that cannot reach the sink in the residual graph form the largest tight
 * set T (C(T) = lambda* |N(T)|); their GPUs N(T) are full at lambda* and
 * take flow only from T, and T sends nothing elsewhere. Fix T and N(T) at
 * that level, drop them, and solve the rest the same way (its optimum is
 * lower). The levels give every GPU its load in the unique lexicographically
 * minimal load vector; at most G levels.
 *
 * Rounding. Each fixed x_eg = f / b is rounded to an integer n_eg in
 * {floor x_eg, ceil x_eg} with sum_g n_eg = c_e and every GPU's integer load
 * in {floor L_g, ceil L_g}: a feasible flow with those lower and upper
 * bounds exists (x is one) and a max-flow finds an integral one (the usual
 * reduction of lower bounds to a super source and sink, s and t merged).
 * A GPU's k replicas of one expert split n_eg as n/k, the first n % k
 * columns taking one more; each stays within one token of its share.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "balanced_internal.h"

#define ENODE(e) (4 + (e))
#define GNODE(b, g) (4 + (b)->E + (g))

void epx_dispatch_balanced_destroy(epx_balancer *b) {
    if (b == NULL) return;
    epxi_flow_free(&b->flow);
    free(b->mark);
    free(b->in_s);
    free(b->g_in);
    free(b->g_graph);
    free(b->owner);
    free(b->eg_gpu);
    free(b->eg_mult);
    free(b->eg_n);
    free(b->eg_edge);
    free(b->seen);
    free(b->eg_flow);
    free(b->eg_int);
    free(b->e_level);
    free(b->g_level);
    free(b->lv_num);
    free(b->lv_den);
    free(b->gex);
    free(b->cnt);
    free(b->rc);
    free(b->left);
    free(b->col);
    free(b);
}

epx_status epx_dispatch_balanced_create(int32_t num_experts, int32_t width, int32_t num_physical,
                                        int32_t num_gpus, epx_balancer **out, epx_error *err) {
    if (out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "epx_dispatch_balanced_create: out is NULL");
    *out = NULL;
    if (num_experts < 1 || width < 1 || num_physical < 1 || num_gpus < 1 || num_gpus > 4096 ||
        num_physical % num_gpus != 0)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "epx_dispatch_balanced_create: E = %d, W = %d, P = %d, G = %d: all must "
                         "be >= 1, G at most 4096 and P a multiple of G",
                         num_experts, width, num_physical, num_gpus);
    if (num_experts > (1 << 24) || width > (1 << 16) || num_physical > (1 << 24))
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "epx_dispatch_balanced_create: E = %d, W = %d or P = %d is too large",
                         num_experts, width, num_physical);
    epx_balancer *b = epxi_calloc(1, sizeof *b, "balancer", err);
    if (b == NULL) return EPX_ERR_NOMEM;
    size_t E = (size_t)num_experts, G = (size_t)num_gpus, P = (size_t)num_physical;
    int32_t D = width < num_gpus ? width : num_gpus;
    b->E = num_experts;
    b->W = width;
    b->P = num_physical;
    b->G = num_gpus;
    b->per = num_physical / num_gpus;
    b->D = D;
    int32_t nodes = 4 + num_experts + num_gpus;
    /* levels: s->e, e->g, g->t; rounding: S'->e, e->g, g->ts, S'->g or g->T', ts->T' */
    int64_t edges = 2 * (int64_t)E + (int64_t)E * D + 3 * (int64_t)G + 1;
    if (edges > INT32_MAX / 2) {
        free(b);
        return epxi_fail(err, EPX_ERR_SHAPE, "epx_dispatch_balanced_create: graph too large");
    }
    epx_status st = epxi_flow_init(&b->flow, nodes, (int32_t)edges, err);
    if (st != EPX_OK) {
        free(b);
        return st;
    }
    size_t ED = E * (size_t)D;
    b->mark = epxi_calloc((size_t)nodes, 1, "balancer marks", err);
    b->in_s = epxi_calloc(E, 1, "balancer set", err);
    b->g_in = epxi_calloc(G, 1, "balancer set", err);
    b->g_graph = epxi_calloc(G, 1, "balancer set", err);
    b->owner = epxi_calloc(P, sizeof *b->owner, "balancer slots", err);
    b->eg_gpu = epxi_calloc(ED, sizeof *b->eg_gpu, "balancer lists", err);
    b->eg_mult = epxi_calloc(ED, sizeof *b->eg_mult, "balancer lists", err);
    b->eg_n = epxi_calloc(E, sizeof *b->eg_n, "balancer lists", err);
    b->eg_edge = epxi_calloc(ED, sizeof *b->eg_edge, "balancer lists", err);
    b->seen = epxi_calloc((size_t)D, sizeof *b->seen, "balancer lists", err);
    b->eg_flow = epxi_calloc(ED, sizeof *b->eg_flow, "balancer flows", err);
    b->eg_int = epxi_calloc(ED, sizeof *b->eg_int, "balancer flows", err);
    b->e_level = epxi_calloc(E, sizeof *b->e_level, "balancer levels", err);
    b->g_level = epxi_calloc(G, sizeof *b->g_level, "balancer levels", err);
    b->lv_num = epxi_calloc(G, sizeof *b->lv_num, "balancer levels", err);
    b->lv_den = epxi_calloc(G, sizeof *b->lv_den, "balancer levels", err);
    b->gex = epxi_calloc(G, sizeof *b->gex, "balancer excess", err);
    b->cnt = epxi_calloc(E, sizeof *b->cnt, "balancer counts", err);
    b->rc = epxi_calloc(E * (size_t)width, sizeof *b->rc, "balancer counts", err);
    b->left = epxi_calloc(E, sizeof *b->left, "balancer cursors", err);
    b->col = epxi_calloc(E, sizeof *b->col, "balancer cursors", err);
    if (!b->mark || !b->in_s || !b->g_in || !b->g_graph || !b->owner || !b->eg_gpu || !b->eg_mult ||
        !b->eg_n || !b->eg_edge || !b->seen || !b->eg_flow || !b->eg_int || !b->e_level ||
        !b->g_level || !b->lv_num || !b->lv_den || !b->gex || !b->cnt || !b->rc || !b->left ||
        !b->col) {
        epx_dispatch_balanced_destroy(b);
        return EPX_ERR_NOMEM;
    }
    *out = b;
    return EPX_OK;
}

/* Check the lists and counts; group each expert's replicas by GPU. */
static epx_status check_and_group(epx_balancer *b, const int32_t *replicas,
                                  const int32_t *num_valid, const int64_t *counts, int64_t *total,
                                  epx_error *err) {
    int32_t E = b->E, W = b->W, P = b->P, D = b->D;
    for (int32_t p = 0; p < P; p++) b->owner[p] = -1;
    int64_t sum = 0;
    for (int32_t e = 0; e < E; e++) {
        int32_t n = num_valid[e];
        if (n < 1 || n > W)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "num_valid[%d] = %d is outside [1, %d] (the width)", e, n, W);
        int64_t c = counts[e];
        if (c < 0 || c > BAL_MAX_TOTAL - sum)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "counts[%d] = %lld: counts must be >= 0 and sum to at most 2^40", e,
                             (long long)c);
        sum += c;
        int32_t *gl = b->eg_gpu + (size_t)e * (size_t)D, *ml = b->eg_mult + (size_t)e * (size_t)D;
        int32_t m = 0;
        for (int32_t j = 0; j < n; j++) {
            int32_t s = replicas[(size_t)e * (size_t)W + (size_t)j];
            if (s < 0 || s >= P)
                return epxi_fail(err, EPX_ERR_INVALID_MAP,
                                 "replicas[%d][%d] = %d is outside [0, %d) (P); num_valid[%d] = "
                                 "%d",
                                 e, j, s, P, e, n);
            if (b->owner[s] >= 0)
                return epxi_fail(err, EPX_ERR_INVALID_MAP,
                                 "slot %d is listed twice: by expert %d and by expert %d (column "
                                 "%d)",
                                 s, b->owner[s], e, j);
            b->owner[s] = e;
            int32_t g = s / b->per, i = 0;
            while (i < m && gl[i] < g) i++;
            if (i < m && gl[i] == g) {
                ml[i]++;
                continue;
            }
            memmove(gl + i + 1, gl + i, (size_t)(m - i) * sizeof *gl);
            memmove(ml + i + 1, ml + i, (size_t)(m - i) * sizeof *ml);
            gl[i] = g;
            ml[i] = 1;
            m++;
        }
        b->eg_n[e] = m;
    }
    *total = sum;
    return EPX_OK;
}

/* The graph of the unfixed experts R at lambda = a / den: s -> e (den c_e),
 * e -> g (unbounded), g -> t (a) over the unfixed GPUs next to R. Returns
 * den * C(R), the flow that means feasible. */
static int64_t build_level_graph(epx_balancer *b, const int64_t *counts, int64_t a, int64_t den) {
    epxi_flow *f = &b->flow;
    int32_t E = b->E, G = b->G, D = b->D;
    epxi_flow_reset(f, 4 + E + G);
    memset(b->g_graph, 0, (size_t)G);
    int64_t need = 0;
    for (int32_t e = 0; e < E; e++) {
        if (b->e_level[e] != -1) continue;
        epxi_flow_add(f, 0, ENODE(e), den * counts[e]);
        need += den * counts[e];
        const int32_t *gl = b->eg_gpu + (size_t)e * (size_t)D;
        int32_t *ed = b->eg_edge + (size_t)e * (size_t)D;
        for (int32_t i = 0; i < b->eg_n[e]; i++) {
            ed[i] = -1;
            if (b->g_level[gl[i]] != -1) continue;
            ed[i] = epxi_flow_add(f, ENODE(e), GNODE(b, gl[i]), BAL_INF);
            b->g_graph[gl[i]] = 1;
        }
    }
    for (int32_t g = 0; g < G; g++)
        if (b->g_graph[g]) epxi_flow_add(f, GNODE(b, g), 1, a);
    return need;
}

/* C(S) and |N(S)| over unfixed GPUs for the experts with in_s set. */
static void set_ratio(epx_balancer *b, const int64_t *counts, int64_t *a, int64_t *den) {
    int64_t c = 0, n = 0;
    memset(b->g_in, 0, (size_t)b->G);
    for (int32_t e = 0; e < b->E; e++) {
        if (!b->in_s[e]) continue;
        c += counts[e];
        const int32_t *gl = b->eg_gpu + (size_t)e * (size_t)b->D;
        for (int32_t i = 0; i < b->eg_n[e]; i++)
            if (b->g_level[gl[i]] == -1 && !b->g_in[gl[i]]) {
                b->g_in[gl[i]] = 1;
                n++;
            }
    }
    *a = c;
    *den = n;
}

/* One level: find lambda of the unfixed experts and fix their tight set. */
static epx_status solve_level(epx_balancer *b, const int64_t *counts, int32_t lv, epx_error *err) {
    int32_t E = b->E, G = b->G, D = b->D;
    epxi_flow *f = &b->flow;
    for (int32_t e = 0; e < E; e++) b->in_s[e] = b->e_level[e] == -1;
    int64_t a, den, a_prev = 0, den_prev = 1;
    for (int32_t step = 0;; step++) {
        set_ratio(b, counts, &a, &den);
        /* each step must raise the ratio; |N(S)| > 0 as every expert has an unfixed GPU */
        if (den == 0 || step > G + 1 || (step > 0 && a * den_prev <= a_prev * den))
            return epxi_fail(err, EPX_ERR_INTERNAL,
                             "balanced dispatch: the ratio search did not advance at level %d "
                             "(step %d, %lld / %lld)",
                             lv, step, (long long)a, (long long)den);
        int64_t need = build_level_graph(b, counts, a, den);
        if (epxi_flow_max(f, 0, 1) == need) break;
        /* the min cut's source side: the experts the last BFS reached */
        for (int32_t e = 0; e < E; e++) b->in_s[e] = b->e_level[e] == -1 && f->level[ENODE(e)] >= 0;
        a_prev = a;
        den_prev = den;
    }
    epxi_flow_reaches(f, 1, b->mark);
    for (int32_t e = 0; e < E; e++) {
        if (b->e_level[e] != -1 || b->mark[ENODE(e)]) continue;
        b->e_level[e] = lv;
        const int32_t *ed = b->eg_edge + (size_t)e * (size_t)D;
        for (int32_t i = 0; i < b->eg_n[e]; i++)
            b->eg_flow[(size_t)e * (size_t)D + (size_t)i] = ed[i] >= 0 ? epxi_flow_on(f, ed[i]) : 0;
    }
    int32_t fixed = 0;
    for (int32_t g = 0; g < G; g++)
        if (b->g_graph[g] && !b->mark[GNODE(b, g)]) {
            b->g_level[g] = lv;
            fixed++;
        }
    /* the tight set sends only to its own GPUs, which carry exactly a each */
    for (int32_t e = 0; e < E; e++) {
        if (b->e_level[e] != lv) continue;
        for (int32_t i = 0; i < b->eg_n[e]; i++) {
            size_t k = (size_t)e * (size_t)D + (size_t)i;
            if (b->eg_flow[k] > 0 && b->g_level[b->eg_gpu[k]] != lv) fixed = 0;
        }
    }
    if (fixed == 0)
        return epxi_fail(err, EPX_ERR_INTERNAL,
                         "balanced dispatch: level %d found no consistent tight set", lv);
    b->lv_num[lv] = a;
    b->lv_den[lv] = den;
    return EPX_OK;
}

static int64_t floor_div(int64_t a, int64_t d) { return a / d; } /* a, d >= 0 */

/* Integer n_eg within one of x_eg, GPU loads within one of L_g (see top). */
static epx_status round_counts(epx_balancer *b, const int64_t *counts, int64_t total,
                               epx_error *err) {
    int32_t E = b->E, G = b->G, D = b->D;
    epxi_flow *f = &b->flow;
    epxi_flow_reset(f, 4 + E + G); /* 0 = S', 1 = T', 2 = s and t merged */
    int64_t need = 0, sum_lo = 0;
    for (int32_t g = 0; g < G; g++) b->gex[g] = 0;
    for (int32_t e = 0; e < E; e++) {
        int32_t lv = b->e_level[e];
        if (lv < 0) continue;
        int64_t den = b->lv_den[lv], r = counts[e];
        for (int32_t i = 0; i < b->eg_n[e]; i++) {
            size_t k = (size_t)e * (size_t)D + (size_t)i;
            int64_t lo = floor_div(b->eg_flow[k], den);
            r -= lo;
            b->gex[b->eg_gpu[k]] += lo;
            b->eg_edge[k] =
                b->eg_flow[k] % den ? epxi_flow_add(f, ENODE(e), GNODE(b, b->eg_gpu[k]), 1) : -1;
        }
        if (r > 0) {
            epxi_flow_add(f, 0, ENODE(e), r);
            need += r;
        }
    }
    for (int32_t g = 0; g < G; g++) {
        int32_t lv = b->g_level[g];
        int64_t lo = 0;
        if (lv >= 0) {
            lo = floor_div(b->lv_num[lv], b->lv_den[lv]);
            if (b->lv_num[lv] % b->lv_den[lv]) epxi_flow_add(f, GNODE(b, g), 2, 1);
        }
        sum_lo += lo;
        int64_t x = b->gex[g] - lo;
        if (x > 0) {
            epxi_flow_add(f, 0, GNODE(b, g), x);
            need += x;
        } else if (x < 0) {
            epxi_flow_add(f, GNODE(b, g), 1, -x);
        }
    }
    if (total - sum_lo > 0) epxi_flow_add(f, 2, 1, total - sum_lo);
    int64_t got = epxi_flow_max(f, 0, 1);
    if (got != need)
        return epxi_fail(err, EPX_ERR_INTERNAL,
                         "balanced dispatch: rounding found %lld of %lld tokens", (long long)got,
                         (long long)need);
    for (int32_t e = 0; e < E; e++) {
        if (b->e_level[e] < 0) continue;
        int64_t den = b->lv_den[b->e_level[e]];
        for (int32_t i = 0; i < b->eg_n[e]; i++) {
            size_t k = (size_t)e * (size_t)D + (size_t)i;
            b->eg_int[k] = floor_div(b->eg_flow[k], den) +
                           (b->eg_edge[k] >= 0 ? epxi_flow_on(f, b->eg_edge[k]) : 0);
        }
    }
    return EPX_OK;
}

static int64_t gcd64(int64_t a, int64_t b) {
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static void write_outputs(epx_balancer *b, const int32_t *replicas, const int32_t *num_valid,
                          const int64_t *counts, int32_t levels, epx_balanced_out *out) {
    int32_t E = b->E, W = b->W, D = b->D;
    if (out->slot_counts) memset(out->slot_counts, 0, (size_t)b->P * sizeof *out->slot_counts);
    for (int32_t e = 0; e < E; e++) {
        int32_t n = num_valid[e], lv = b->e_level[e];
        const int32_t *gl = b->eg_gpu + (size_t)e * (size_t)D;
        for (int32_t i = 0; i < b->eg_n[e]; i++) b->seen[i] = 0;
        for (int32_t j = 0; j < W; j++) {
            size_t o = (size_t)e * (size_t)W + (size_t)j;
            double share = 0.0;
            int64_t cnt = 0;
            if (j < n) {
                int32_t s = replicas[o], g = s / b->per, i = 0;
                while (gl[i] != g) i++;
                size_t k = (size_t)e * (size_t)D + (size_t)i;
                int64_t mult = b->eg_mult[k], nth = b->seen[i]++;
                if (lv < 0) {
                    share = 1.0 / (double)n;
                } else {
                    share = (double)b->eg_flow[k] /
                            ((double)b->lv_den[lv] * (double)counts[e] * (double)mult);
                    cnt = b->eg_int[k] / mult + (nth < b->eg_int[k] % mult);
                }
                if (out->slot_counts) out->slot_counts[s] = cnt;
            }
            if (out->shares) out->shares[o] = share;
            if (out->replica_counts) out->replica_counts[o] = cnt;
        }
    }
    if (out->gpu_load)
        for (int32_t g = 0; g < b->G; g++) {
            int32_t lv = b->g_level[g];
            out->gpu_load[g] = lv < 0 ? 0.0 : (double)b->lv_num[lv] / (double)b->lv_den[lv];
        }
    out->num_levels = levels;
    if (levels == 0) {
        out->max_load_num = 0;
        out->max_load_den = 1;
        out->max_load_int = 0;
        return;
    }
    int64_t a = b->lv_num[0], d = b->lv_den[0], q = gcd64(a, d);
    out->max_load_num = a / q;
    out->max_load_den = d / q;
    out->max_load_int = (a + d - 1) / d;
}

epx_status epx_dispatch_balanced_solve(epx_balancer *b, const int32_t *replicas,
                                       const int32_t *num_valid, const int64_t *counts,
                                       epx_balanced_out *out, epx_error *err) {
    if (b == NULL || replicas == NULL || num_valid == NULL || counts == NULL || out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_dispatch_balanced_solve: the balancer, replicas, num_valid, counts "
                         "and out are required");
    int64_t total = 0;
    EPX_TRY(check_and_group(b, replicas, num_valid, counts, &total, err));
    int32_t left = 0, levels = 0;
    for (int32_t e = 0; e < b->E; e++) {
        b->e_level[e] = counts[e] > 0 ? -1 : -2;
        left += counts[e] > 0;
    }
    for (int32_t g = 0; g < b->G; g++) b->g_level[g] = -1;
    while (left > 0) {
        if (levels >= b->G)
            return epxi_fail(err, EPX_ERR_INTERNAL, "balanced dispatch: more than G levels");
        EPX_TRY(solve_level(b, counts, levels, err));
        left = 0;
        for (int32_t e = 0; e < b->E; e++) left += b->e_level[e] == -1;
        levels++;
    }
    EPX_TRY(round_counts(b, counts, total, err));
    write_outputs(b, replicas, num_valid, counts, levels, out);
    return EPX_OK;
}
