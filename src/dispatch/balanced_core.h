/*
 * balanced_core.h - the exact balanced split (epx/dispatch.h part 4) written
 * once for the CPU reference (balanced.c) and the CUDA kernel
 * (src/cuda/balanced.cu): every function is plain C11 and, under nvcc,
 * __host__ __device__, so the two sides run the same statements on the
 * same integers and cannot drift. Internal to libepx.
 *
 * The problem and the algorithm are stated in balanced.c. What this file
 * fixes is the exact result, which a max-flow alone leaves open (a flow is
 * rarely unique): the result is DEFINED as what these functions compute.
 *
 * The reduced graph. An expert whose replicas sit on one GPU has no choice:
 * all its tokens go there. Such experts are folded into their GPU's base
 * load (an edge s -> g of den * base_g, the parallel paths s -> e -> g
 * merged; a max-flow and its min cut are the same on both graphs, see
 * bal_level), so the flow graph holds only the "flexible" experts (tokens on
 * two GPUs or more; at most P - E of them) and the GPUs: 4 + M + G nodes.
 * On a Kimi-K2.5 or DeepSeek-V3 layer that is tens of nodes instead of
 * hundreds, which is what makes one GPU thread able to solve it.
 *
 * The split of the work. Per expert and independent: grouping an expert's
 * replicas by GPU (epxi_bal_group) and writing its outputs
 * (epxi_bal_write_expert); the kernel runs these on all threads. Per batch
 * and sequential: the levels and the rounding (epxi_bal_solve), on the
 * reduced graph, in one thread. In between, classifying experts (base loads
 * and the ascending list of flexible experts) is a sum and a compaction:
 * epxi_bal_classify does it in order on the CPU; the kernel does it in
 * parallel to the same result (integer sums, the list kept ascending).
 *
 * Max-flow: Dinic's algorithm (BFS level graph, then augmenting paths found
 * by an iterative DFS with current-arc pointers, each path from s again),
 * edges tried in the reverse order of their addition. Deterministic.
 */
#ifndef EPX_DISPATCH_BALANCED_CORE_H
#define EPX_DISPATCH_BALANCED_CORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define EPXI_BAL __host__ __device__ static inline
#else
#define EPXI_BAL static inline
#endif

#define EPXI_BAL_INF ((int64_t)1 << 62)
#define EPXI_BAL_MAX_TOTAL ((int64_t)1 << 40)

/* epxi_bal_solve's failures: none can happen on valid input; each names a
 * broken invariant of the algorithm. */
enum {
    EPXI_BAL_OK = 0,
    EPXI_BAL_NO_ADVANCE = 1, /* Dinkelbach's ratio did not rise   */
    EPXI_BAL_NO_TIGHT = 2,   /* a level fixed no consistent set   */
    EPXI_BAL_LEVELS = 3,     /* more than G levels                */
    EPXI_BAL_ROUNDING = 4,   /* the rounding flow fell short      */
    EPXI_BAL_TOO_MANY = 5    /* more flexible experts than P - E (a slot listed twice) */
};

/* The workspace: pointers into one block carved by epxi_bal_carve (host
 * memory for the CPU, device memory for the kernel) and the scalars. */
typedef struct epxi_bal {
    int32_t E, W, P, G, per, D, maxM; /* D = min(W, G); maxM = min(E, P - E) */
    int32_t max_nodes, max_edges;     /* max_edges counts both directions    */
    int32_t M, levels, n, m;          /* per solve: flexible experts, levels; the graph */
    /* [E] */
    int64_t *cnt;              /* tokens per logical expert                     */
    int32_t *eg_n;             /* distinct GPUs of the expert (0: no valid slot) */
    int32_t *fidx;             /* index in flex, or -1                          */
    int32_t *eg_gpu, *eg_mult; /* [E][D] its GPUs ascending, replicas on each  */
    /* [maxM]: the flexible experts (count > 0 on >= 2 GPUs), ascending */
    int32_t *flex, *f_level;
    uint8_t *f_in;
    int32_t *f_edge;         /* [maxM][D] edge of the current graph, -1 none */
    int64_t *f_flow, *f_int; /* [maxM][D] flow times the level's den; rounded */
    /* [G] */
    int64_t *base;                   /* tokens of one-GPU experts                    */
    int32_t *g_level;                /* -1: not (yet) at a level                     */
    uint8_t *g_in, *g_graph, *g_sin; /* in N(S); in the graph; base in S      */
    int64_t *lv_num, *lv_den, *gex;  /* level loads (not reduced); excess     */
    /* the flow graph */
    int32_t *head, *lvl, *iter, *queue, *path; /* [max_nodes] */
    uint8_t *mark;                             /* [max_nodes] */
    int32_t *next, *to;                        /* [max_edges] */
    int64_t *cap;                              /* [max_edges] */
    int64_t *rc;                               /* [E][W] replica counts (scratch) */
} epxi_bal;

/* Fill the shape fields of b for (E, W, P, G); P % G == 0. */
EPXI_BAL void epxi_bal_shape(epxi_bal *b, int32_t E, int32_t W, int32_t P, int32_t G) {
    b->E = E;
    b->W = W;
    b->P = P;
    b->G = G;
    b->per = P / G;
    b->D = W < G ? W : G;
    int32_t extra = P > E ? P - E : 0;
    b->maxM = extra < E ? extra : E;
    b->max_nodes = 4 + b->maxM + G;
    /* level graph: s->e, e->g, s->g, g->t; rounding: s->e, e->g, two per GPU, one more */
    int64_t fwd = (int64_t)b->maxM * (1 + (int64_t)b->D) + 2 * (int64_t)G + 1;
    b->max_edges = (int32_t)(2 * fwd);
}

/* Carve the arrays out of mem (NULL: only measure); returns the bytes. */
static inline size_t epxi_bal_carve(epxi_bal *b, void *mem) {
    size_t off = 0, E = (size_t)b->E, G = (size_t)b->G, M = (size_t)b->maxM;
    size_t ED = E * (size_t)b->D, MD = M * (size_t)b->D, N = (size_t)b->max_nodes;
    size_t X = (size_t)b->max_edges;
    char *base = (char *)mem;
#define EPXI_BAL_ARR(field, type, count)                                                           \
    do {                                                                                           \
        off = (off + 15) & ~(size_t)15;                                                            \
        if (base) b->field = (type *)(void *)(base + off);                                         \
        off += (count) * sizeof(type);                                                             \
    } while (0)
    EPXI_BAL_ARR(cnt, int64_t, E);
    EPXI_BAL_ARR(eg_n, int32_t, E);
    EPXI_BAL_ARR(fidx, int32_t, E);
    EPXI_BAL_ARR(eg_gpu, int32_t, ED);
    EPXI_BAL_ARR(eg_mult, int32_t, ED);
    EPXI_BAL_ARR(flex, int32_t, M + 1);
    EPXI_BAL_ARR(f_level, int32_t, M + 1);
    EPXI_BAL_ARR(f_in, uint8_t, M + 1);
    EPXI_BAL_ARR(f_edge, int32_t, MD + 1);
    EPXI_BAL_ARR(f_flow, int64_t, MD + 1);
    EPXI_BAL_ARR(f_int, int64_t, MD + 1);
    EPXI_BAL_ARR(base, int64_t, G);
    EPXI_BAL_ARR(g_level, int32_t, G);
    EPXI_BAL_ARR(g_in, uint8_t, G);
    EPXI_BAL_ARR(g_graph, uint8_t, G);
    EPXI_BAL_ARR(g_sin, uint8_t, G);
    EPXI_BAL_ARR(lv_num, int64_t, G);
    EPXI_BAL_ARR(lv_den, int64_t, G);
    EPXI_BAL_ARR(gex, int64_t, G);
    EPXI_BAL_ARR(head, int32_t, N);
    EPXI_BAL_ARR(lvl, int32_t, N);
    EPXI_BAL_ARR(iter, int32_t, N);
    EPXI_BAL_ARR(queue, int32_t, N);
    EPXI_BAL_ARR(path, int32_t, N);
    EPXI_BAL_ARR(mark, uint8_t, N);
    EPXI_BAL_ARR(next, int32_t, X);
    EPXI_BAL_ARR(to, int32_t, X);
    EPXI_BAL_ARR(cap, int64_t, X);
    EPXI_BAL_ARR(rc, int64_t, E * (size_t)b->W);
#undef EPXI_BAL_ARR
    return (off + 15) & ~(size_t)15;
}

/* ---- per expert ----------------------------------------------------------- */

/* num_valid[e] as the kernel reads it: the CPU checked it is in [1, W]; on
 * the GPU tables are trusted, and this keeps a bad one inside the row. */
EPXI_BAL int32_t epxi_bal_nvalid(const epxi_bal *b, const int32_t *num_valid, int32_t e) {
    int32_t n = num_valid[e];
    return n < 1 ? 1 : n > b->W ? b->W : n;
}

/* Group expert e's replicas by GPU: eg_gpu ascending, eg_mult replicas on
 * each; slots outside [0, P) are skipped (the CPU rejected them first). */
EPXI_BAL void epxi_bal_group(epxi_bal *b, const int32_t *replicas, const int32_t *num_valid,
                             int32_t e) {
    int32_t n = epxi_bal_nvalid(b, num_valid, e), m = 0, D = b->D;
    int32_t *gl = b->eg_gpu + (size_t)e * (size_t)D, *ml = b->eg_mult + (size_t)e * (size_t)D;
    for (int32_t j = 0; j < n; j++) {
        int32_t s = replicas[(size_t)e * (size_t)b->W + (size_t)j];
        if (s < 0 || s >= b->P) continue;
        int32_t g = s / b->per, i = 0;
        while (i < m && gl[i] < g) i++;
        if (i < m && gl[i] == g) {
            ml[i]++;
            continue;
        }
        if (m == D) continue; /* only with a slot listed twice */
        for (int32_t k = m; k > i; k--) {
            gl[k] = gl[k - 1];
            ml[k] = ml[k - 1];
        }
        gl[i] = g;
        ml[i] = 1;
        m++;
    }
    b->eg_n[e] = m;
}

/* Expert e's kind once grouped and counted: 1 = all on one GPU (its tokens
 * are that GPU's base), 2 = flexible, 0 = no tokens (or no valid slot). */
EPXI_BAL int epxi_bal_kind(const epxi_bal *b, int32_t e) {
    if (b->cnt[e] <= 0 || b->eg_n[e] == 0) return 0;
    return b->eg_n[e] == 1 ? 1 : 2;
}

/* The classification in order (the CPU's; the kernel computes the same with
 * a sum per GPU and a compaction). Returns EPXI_BAL_TOO_MANY or OK. */
EPXI_BAL int epxi_bal_classify(epxi_bal *b) {
    int rc = EPXI_BAL_OK;
    for (int32_t g = 0; g < b->G; g++) b->base[g] = 0;
    b->M = 0;
    for (int32_t e = 0; e < b->E; e++) {
        int k = epxi_bal_kind(b, e);
        b->fidx[e] = -1;
        if (k == 1) b->base[b->eg_gpu[(size_t)e * (size_t)b->D]] += b->cnt[e];
        if (k != 2) continue;
        if (b->M == b->maxM) {
            rc = EPXI_BAL_TOO_MANY;
            continue;
        }
        b->fidx[e] = b->M;
        b->flex[b->M++] = e;
    }
    return rc;
}

/* ---- the max-flow ----------------------------------------------------------- */

EPXI_BAL void epxi_bal_reset(epxi_bal *b, int32_t n) {
    b->n = n;
    b->m = 0;
    for (int32_t v = 0; v < n; v++) b->head[v] = -1;
}

/* Add u -> v (capacity c) and its reverse (e ^ 1); returns e. Sized at
 * carve time: -1 only if that sizing is wrong. */
EPXI_BAL int32_t epxi_bal_add(epxi_bal *b, int32_t u, int32_t v, int64_t c) {
    if (b->m + 2 > b->max_edges) return -1;
    int32_t e = b->m;
    b->to[e] = v;
    b->cap[e] = c;
    b->next[e] = b->head[u];
    b->head[u] = e;
    b->to[e + 1] = u;
    b->cap[e + 1] = 0;
    b->next[e + 1] = b->head[v];
    b->head[v] = e + 1;
    b->m += 2;
    return e;
}

/* The flow on forward edge e (its reverse's residual); 0 for e = -1. */
EPXI_BAL int64_t epxi_bal_on(const epxi_bal *b, int32_t e) { return e >= 0 ? b->cap[e ^ 1] : 0; }

EPXI_BAL int epxi_bal_bfs(epxi_bal *b, int32_t s, int32_t t) {
    for (int32_t v = 0; v < b->n; v++) b->lvl[v] = -1;
    int32_t qh = 0, qt = 0;
    b->lvl[s] = 0;
    b->queue[qt++] = s;
    while (qh < qt) {
        int32_t u = b->queue[qh++];
        for (int32_t e = b->head[u]; e >= 0; e = b->next[e]) {
            int32_t v = b->to[e];
            if (b->cap[e] > 0 && b->lvl[v] < 0) {
                b->lvl[v] = b->lvl[u] + 1;
                b->queue[qt++] = v;
            }
        }
    }
    return b->lvl[t] >= 0;
}

/* Dinic: push a maximum flow from s to t; returns the amount. Afterwards lvl
 * marks (>= 0) what s reaches in the residual graph: the min cut's source side. */
EPXI_BAL int64_t epxi_bal_maxflow(epxi_bal *b, int32_t s, int32_t t) {
    int64_t total = 0;
    while (epxi_bal_bfs(b, s, t)) {
        for (int32_t v = 0; v < b->n; v++) b->iter[v] = b->head[v];
        for (;;) {
            int32_t u = s, d = 0, stuck = 0;
            while (u != t) {
                int32_t e = b->iter[u];
                while (e >= 0 && (b->cap[e] <= 0 || b->lvl[b->to[e]] != b->lvl[u] + 1))
                    e = b->next[e];
                b->iter[u] = e;
                if (e >= 0) {
                    b->path[d++] = e;
                    u = b->to[e];
                    continue;
                }
                if (u == s) {
                    stuck = 1;
                    break;
                }
                /* u is a dead end: retreat and move the parent past the edge */
                int32_t back = b->path[--d];
                u = b->to[back ^ 1];
                b->iter[u] = b->next[b->iter[u]];
            }
            if (stuck) break;
            int64_t f = INT64_MAX;
            for (int32_t k = 0; k < d; k++)
                if (b->cap[b->path[k]] < f) f = b->cap[b->path[k]];
            for (int32_t k = 0; k < d; k++) {
                b->cap[b->path[k]] -= f;
                b->cap[b->path[k] ^ 1] += f;
            }
            total += f;
        }
    }
    return total;
}

/* mark[v] = 1 for every node that reaches t in the residual graph. */
EPXI_BAL void epxi_bal_reaches(epxi_bal *b, int32_t t) {
    for (int32_t v = 0; v < b->n; v++) b->mark[v] = 0;
    int32_t qh = 0, qt = 0;
    b->mark[t] = 1;
    b->queue[qt++] = t;
    while (qh < qt) {
        int32_t v = b->queue[qh++];
        for (int32_t e = b->head[v]; e >= 0; e = b->next[e]) {
            int32_t w = b->to[e];
            if (!b->mark[w] && b->cap[e ^ 1] > 0) {
                b->mark[w] = 1;
                b->queue[qt++] = w;
            }
        }
    }
}

/* ---- the levels --------------------------------------------------------------- */

/* Nodes: 0 = s (S' while rounding), 1 = t (T'), 2 = s and t merged while
 * rounding, 3 unused, then the flexible experts, then the GPUs. */
#define EPXI_BAL_FN(i) (4 + (i))
#define EPXI_BAL_GN(b, g) (4 + (b)->M + (g))

/* C(S) and |N(S)| over unfixed GPUs, S = the flexible experts with f_in and
 * the bases of the GPUs with g_sin. */
EPXI_BAL void epxi_bal_ratio(epxi_bal *b, int64_t *a, int64_t *den) {
    int64_t c = 0, n = 0;
    int32_t D = b->D;
    for (int32_t g = 0; g < b->G; g++) b->g_in[g] = 0;
    for (int32_t i = 0; i < b->M; i++) {
        if (!b->f_in[i]) continue;
        int32_t e = b->flex[i];
        c += b->cnt[e];
        for (int32_t k = 0; k < b->eg_n[e]; k++) {
            int32_t g = b->eg_gpu[(size_t)e * (size_t)D + (size_t)k];
            if (b->g_level[g] == -1 && !b->g_in[g]) {
                b->g_in[g] = 1;
                n++;
            }
        }
    }
    for (int32_t g = 0; g < b->G; g++) {
        if (!b->g_sin[g]) continue;
        c += b->base[g];
        if (!b->g_in[g]) {
            b->g_in[g] = 1;
            n++;
        }
    }
    *a = c;
    *den = n;
}

/* The graph of the unfixed part at lambda = a / den: s -> e (den c_e),
 * e -> g (unbounded) to unfixed GPUs, s -> g (den base_g), g -> t (a).
 * Returns the flow that means feasible. */
EPXI_BAL int64_t epxi_bal_build(epxi_bal *b, int64_t a, int64_t den) {
    int32_t G = b->G, D = b->D;
    epxi_bal_reset(b, 4 + b->M + G);
    for (int32_t g = 0; g < G; g++) b->g_graph[g] = 0;
    int64_t need = 0;
    for (int32_t i = 0; i < b->M; i++) {
        if (b->f_level[i] != -1) continue;
        int32_t e = b->flex[i];
        epxi_bal_add(b, 0, EPXI_BAL_FN(i), den * b->cnt[e]);
        need += den * b->cnt[e];
        for (int32_t k = 0; k < b->eg_n[e]; k++) {
            int32_t g = b->eg_gpu[(size_t)e * (size_t)D + (size_t)k];
            int32_t *ed = b->f_edge + (size_t)i * (size_t)D + (size_t)k;
            *ed = -1;
            if (b->g_level[g] != -1) continue;
            *ed = epxi_bal_add(b, EPXI_BAL_FN(i), EPXI_BAL_GN(b, g), EPXI_BAL_INF);
            b->g_graph[g] = 1;
        }
    }
    for (int32_t g = 0; g < G; g++)
        if (b->g_level[g] == -1 && b->base[g] > 0) {
            epxi_bal_add(b, 0, EPXI_BAL_GN(b, g), den * b->base[g]);
            need += den * b->base[g];
            b->g_graph[g] = 1;
        }
    for (int32_t g = 0; g < G; g++)
        if (b->g_graph[g]) epxi_bal_add(b, EPXI_BAL_GN(b, g), 1, a);
    return need;
}

/* One level: lambda of the unfixed part by Dinkelbach's iteration, then fix
 * its largest tight set. With the one-GPU experts merged into s -> g, an
 * unmerged expert on GPU g (count > 0) is reached from s exactly when g is
 * (its edge to g is unbounded; a saturated s -> e carries flow, whose
 * reverse leads back from g), so the cut's set S' takes g's base exactly
 * when s reaches g; and such experts reach t exactly when g does. */
EPXI_BAL int epxi_bal_level(epxi_bal *b, int32_t lv) {
    int32_t G = b->G, D = b->D;
    for (int32_t i = 0; i < b->M; i++) b->f_in[i] = b->f_level[i] == -1;
    for (int32_t g = 0; g < G; g++) b->g_sin[g] = b->g_level[g] == -1 && b->base[g] > 0;
    int64_t a, den, a_prev = 0, den_prev = 1;
    for (int32_t step = 0;; step++) {
        epxi_bal_ratio(b, &a, &den);
        if (den == 0 || step > G + 1 || (step > 0 && a * den_prev <= a_prev * den))
            return EPXI_BAL_NO_ADVANCE;
        int64_t need = epxi_bal_build(b, a, den);
        if (epxi_bal_maxflow(b, 0, 1) == need) break;
        for (int32_t i = 0; i < b->M; i++)
            b->f_in[i] = b->f_level[i] == -1 && b->lvl[EPXI_BAL_FN(i)] >= 0;
        for (int32_t g = 0; g < G; g++)
            b->g_sin[g] = b->g_level[g] == -1 && b->base[g] > 0 && b->lvl[EPXI_BAL_GN(b, g)] >= 0;
        a_prev = a;
        den_prev = den;
    }
    epxi_bal_reaches(b, 1);
    for (int32_t i = 0; i < b->M; i++) {
        if (b->f_level[i] != -1 || b->mark[EPXI_BAL_FN(i)]) continue;
        b->f_level[i] = lv;
        int32_t e = b->flex[i];
        for (int32_t k = 0; k < b->eg_n[e]; k++) {
            size_t j = (size_t)i * (size_t)D + (size_t)k;
            b->f_flow[j] = epxi_bal_on(b, b->f_edge[j]);
        }
    }
    int32_t fixed = 0;
    for (int32_t g = 0; g < G; g++)
        if (b->g_graph[g] && !b->mark[EPXI_BAL_GN(b, g)]) {
            b->g_level[g] = lv;
            fixed++;
        }
    /* the tight set sends only to its own GPUs, which carry exactly a each */
    for (int32_t i = 0; i < b->M; i++) {
        if (b->f_level[i] != lv) continue;
        int32_t e = b->flex[i];
        for (int32_t k = 0; k < b->eg_n[e]; k++) {
            size_t j = (size_t)i * (size_t)D + (size_t)k;
            if (b->f_flow[j] > 0 && b->g_level[b->eg_gpu[(size_t)e * (size_t)D + (size_t)k]] != lv)
                fixed = 0;
        }
    }
    if (fixed == 0) return EPXI_BAL_NO_TIGHT;
    b->lv_num[lv] = a;
    b->lv_den[lv] = den;
    return EPXI_BAL_OK;
}

/* Integer flows within one token of the fractional ones, GPU loads within
 * one of theirs: a max-flow with lower bounds (balanced.c). */
EPXI_BAL int epxi_bal_round(epxi_bal *b) {
    int32_t G = b->G, D = b->D;
    epxi_bal_reset(b, 4 + b->M + G);
    int64_t need = 0, sum_lo = 0, total = 0;
    for (int32_t g = 0; g < G; g++) {
        b->gex[g] = b->base[g];
        total += b->base[g];
    }
    for (int32_t i = 0; i < b->M; i++) {
        int32_t e = b->flex[i];
        int64_t den = b->lv_den[b->f_level[i]], r = b->cnt[e];
        total += r;
        for (int32_t k = 0; k < b->eg_n[e]; k++) {
            size_t j = (size_t)i * (size_t)D + (size_t)k;
            int32_t g = b->eg_gpu[(size_t)e * (size_t)D + (size_t)k];
            int64_t lo = b->f_flow[j] / den;
            r -= lo;
            b->gex[g] += lo;
            b->f_edge[j] =
                b->f_flow[j] % den ? epxi_bal_add(b, EPXI_BAL_FN(i), EPXI_BAL_GN(b, g), 1) : -1;
        }
        if (r > 0) {
            epxi_bal_add(b, 0, EPXI_BAL_FN(i), r);
            need += r;
        }
    }
    for (int32_t g = 0; g < G; g++) {
        int32_t lv = b->g_level[g];
        int64_t lo = 0;
        if (lv >= 0) {
            lo = b->lv_num[lv] / b->lv_den[lv];
            if (b->lv_num[lv] % b->lv_den[lv]) epxi_bal_add(b, EPXI_BAL_GN(b, g), 2, 1);
        }
        sum_lo += lo;
        int64_t x = b->gex[g] - lo;
        if (x > 0) {
            epxi_bal_add(b, 0, EPXI_BAL_GN(b, g), x);
            need += x;
        } else if (x < 0) {
            epxi_bal_add(b, EPXI_BAL_GN(b, g), 1, -x);
        }
    }
    if (total - sum_lo > 0) epxi_bal_add(b, 2, 1, total - sum_lo);
    if (epxi_bal_maxflow(b, 0, 1) != need) return EPXI_BAL_ROUNDING;
    for (int32_t i = 0; i < b->M; i++) {
        int64_t den = b->lv_den[b->f_level[i]];
        int32_t e = b->flex[i];
        for (int32_t k = 0; k < b->eg_n[e]; k++) {
            size_t j = (size_t)i * (size_t)D + (size_t)k;
            b->f_int[j] = b->f_flow[j] / den + epxi_bal_on(b, b->f_edge[j]);
        }
    }
    return EPXI_BAL_OK;
}

/* The sequential part, once grouped and classified: every level, then the
 * rounding. Returns EPXI_BAL_OK or the broken invariant. */
EPXI_BAL int epxi_bal_solve(epxi_bal *b) {
    int32_t left = b->M;
    for (int32_t i = 0; i < b->M; i++) b->f_level[i] = -1;
    for (int32_t g = 0; g < b->G; g++) {
        b->g_level[g] = -1;
        left += b->base[g] > 0;
    }
    b->levels = 0;
    while (left > 0) {
        if (b->levels >= b->G) return EPXI_BAL_LEVELS;
        int rc = epxi_bal_level(b, b->levels);
        if (rc != EPXI_BAL_OK) return rc;
        b->levels++;
        left = 0;
        for (int32_t i = 0; i < b->M; i++) left += b->f_level[i] == -1;
        for (int32_t g = 0; g < b->G; g++) left += b->g_level[g] == -1 && b->base[g] > 0;
    }
    return epxi_bal_round(b);
}

/* ---- outputs -------------------------------------------------------------------- */

/* Expert e's row of shares and replica counts (each optional) and its
 * slots' counts (optional; slots no expert lists stay as the caller set
 * them). A GPU's k replicas of the expert split its integer count n as
 * n / k, the first n % k columns (in list order) taking one more. Shares:
 * an expert without tokens splits evenly; a one-GPU expert gives each
 * replica 1 / k; a flexible one flow / (den c k). */
EPXI_BAL void epxi_bal_write_expert(const epxi_bal *b, const int32_t *replicas,
                                    const int32_t *num_valid, int32_t e, double *shares,
                                    int64_t *rcounts, int64_t *slot_counts) {
    int32_t W = b->W, D = b->D, n = epxi_bal_nvalid(b, num_valid, e);
    int kind = epxi_bal_kind(b, e);
    int32_t i = b->fidx[e];
    const int32_t *row = replicas + (size_t)e * (size_t)W;
    const int32_t *gl = b->eg_gpu + (size_t)e * (size_t)D;
    for (int32_t j = 0; j < W; j++) {
        double share = 0.0;
        int64_t cnt = 0;
        int32_t s = j < n ? row[j] : -1;
        if (j < n && kind == 0) share = 1.0 / (double)n;
        if (j < n && kind != 0 && s >= 0 && s < b->P &&
            !(kind == 2 && (i < 0 || b->f_level[i] < 0))) {
            int32_t g = s / b->per, k = 0, nth = 0;
            while (k < b->eg_n[e] && gl[k] != g) k++;
            for (int32_t jj = 0; jj < j; jj++) {
                int32_t sj = row[jj];
                nth += sj >= 0 && sj < b->P && sj / b->per == g;
            }
            if (k < b->eg_n[e]) { /* else only with a slot listed twice */
                int64_t mult = b->eg_mult[(size_t)e * (size_t)D + (size_t)k], x;
                if (kind == 1) {
                    share = 1.0 / (double)mult;
                    x = b->cnt[e];
                } else {
                    size_t f = (size_t)i * (size_t)D + (size_t)k;
                    share = (double)b->f_flow[f] /
                            ((double)b->lv_den[b->f_level[i]] * (double)b->cnt[e] * (double)mult);
                    x = b->f_int[f];
                }
                cnt = x / mult + (nth < x % mult);
            }
        }
        if (slot_counts && j < n && s >= 0 && s < b->P) slot_counts[s] = cnt;
        if (shares) shares[(size_t)e * (size_t)W + (size_t)j] = share;
        if (rcounts) rcounts[(size_t)e * (size_t)W + (size_t)j] = cnt;
    }
}

/* GPU g's load under the shares: its level, or 0. */
EPXI_BAL double epxi_bal_gpu_load(const epxi_bal *b, int32_t g) {
    int32_t lv = b->g_level[g];
    return lv < 0 ? 0.0 : (double)b->lv_num[lv] / (double)b->lv_den[lv];
}

/* The optimum as a reduced fraction, its ceiling, and the level count:
 * out[0..3] = num, den, ceil, levels. */
EPXI_BAL void epxi_bal_summary(const epxi_bal *b, int64_t out[4]) {
    if (b->levels == 0) {
        out[0] = 0;
        out[1] = 1;
        out[2] = 0;
        out[3] = 0;
        return;
    }
    int64_t a = b->lv_num[0], d = b->lv_den[0], x = a, y = d;
    while (y) {
        int64_t t = x % y;
        x = y;
        y = t;
    }
    out[0] = a / x;
    out[1] = d / x;
    out[2] = (a + d - 1) / d;
    out[3] = b->levels;
}

#endif /* EPX_DISPATCH_BALANCED_CORE_H */
