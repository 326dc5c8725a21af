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
 * epxi_bal_level), so the flow graphs hold only the "flexible" experts
 * (tokens on two GPUs or more; at most P - E of them) and the GPUs.
 *
 * Components. No flexible expert joins two components of the graph "GPUs
 * linked by a flexible expert", so the lexicographic optimum is each
 * component's optimum side by side: each is solved alone (its levels, its
 * rounding) on a graph of its own, carved at offsets no other component
 * uses. A GPU with no flexible expert is its own level with no flow at all.
 * This is what keeps the flows small (tens of nodes instead of hundreds)
 * and lets the kernel solve components in parallel, one warp each, with the
 * same result as the CPU's loop over them. A component of at most sub_max
 * GPUs is solved over its subsets (epxi_bal_subset_levels, all lanes of
 * the warp, rounded level by level with epxi_bal_subset_round), a larger
 * one by the max-flows (epxi_bal_level, then epxi_bal_round, lane 0).
 *
 * The split of the work. Per expert and independent: grouping an expert's
 * replicas by GPU (epxi_bal_group) and writing its outputs
 * (epxi_bal_write_expert); the kernel runs these on all threads. Per batch:
 * classifying experts (base loads and the ascending list of flexible
 * experts: epxi_bal_classify in order on the CPU, a sum and a compaction to
 * the same result in the kernel), then the components (epxi_bal_components,
 * sequential), then each component's levels and rounding
 * (epxi_bal_solve_part, sequential within a component).
 *
 * Max-flow: a level's starts from a greedy flow (epxi_bal_greedy), then
 * Dinic's algorithm (BFS level graph, then augmenting paths found by an
 * iterative DFS with current-arc pointers, each path from s again), edges
 * tried in the reverse order of their addition. Deterministic.
 */
#ifndef EPX_DISPATCH_BALANCED_CORE_H
#define EPX_DISPATCH_BALANCED_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "internal.h" /* epxi_env_switch */

#ifdef __CUDACC__
#define EPXI_BAL __host__ __device__ static inline
#else
#define EPXI_BAL static inline
#endif

#define EPXI_BAL_INF ((int64_t)1 << 62)
/* The subset solve's default and largest component (GPUs): 2^10 entries a
 * table, 32 per lane of a warp; at most 2^12 (at G = 4096, 34 MB for the three
 * tables). */
#define EPXI_BAL_SUBSET_GPUS 10
#define EPXI_BAL_SUBSET_MAX 12
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
    int32_t M, C, levels;             /* per solve: flexible experts, components, levels */
    int32_t sub_max;                  /* components of 2..sub_max GPUs: the subset solve */
    int32_t closed;                   /* 1: one-expert components in closed form */
    int64_t sub_size;                 /* entries of sub_d / sub_s: every such table fits */
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
    /* the components (epxi_bal_components) */
    int32_t *g_par, *g_comp, *g_loc; /* [G] union-find; component or -1; index in it */
    int32_t *c_goff, *c_foff;        /* [G + 1] offsets into c_gpus and c_flex      */
    int32_t *c_gpus, *c_flex;        /* [G], [maxM] the lists, component by component */
    int32_t *c_levels, *c_rc;        /* [G] per component: levels, status           */
    int32_t *c_soff;                 /* [G] its subset tables' offset, or -1: flows */
    int32_t *f_mask;                 /* [maxM] a flexible expert's GPUs, component bits */
    int32_t *f_frac;                 /* [maxM] its GPUs with a fractional flow (rounding) */
    int64_t *f_units;                /* [maxM] its tokens left once flows round down */
    int64_t *g_lo;                   /* [G] rounding: units a GPU must still take */
    int64_t *sub_d, *sub_s, *sub_l;  /* [sub_size] per subset: load inside, slacks */
    /* the flow graphs, each component's at its own offsets (epxi_bal_view) */
    int32_t *head, *lvl, *iter, *queue, *path; /* [max_nodes] */
    uint8_t *mark;                             /* [max_nodes] */
    int32_t *next, *to;                        /* [max_edges] */
    int64_t *cap;                              /* [max_edges] */
    int64_t *rc;                               /* [E][W] replica counts (scratch) */
} epxi_bal;

/* Components of at most k GPUs (0..EPXI_BAL_SUBSET_MAX) get the subset
 * solve, larger ones the max-flows; sizes the tables for it. Every table
 * of a component of n GPUs has 2^n entries; disjoint parts of at most k
 * GPUs out of G need at most floor(G / k) 2^k + 2^(G mod k) entries (2^G
 * when G <= k): merging two parts never shrinks the sum (2^(x + y) >= 2^x
 * + 2^y), so the largest sum fills parts of k. (ceil(G / k) 2^k before:
 * 4,096 entries for 32 GPUs where 3,076 is the most, 24 KB of workspace.)
 * Call before epxi_bal_carve. */
EPXI_BAL void epxi_bal_subsets(epxi_bal *b, int32_t k) {
    k = k < 0 ? 0 : k > EPXI_BAL_SUBSET_MAX ? EPXI_BAL_SUBSET_MAX : k;
    b->sub_max = k < 2 ? 0 : k;
    if (b->sub_max == 0)
        b->sub_size = 0;
    else if (b->G <= k)
        b->sub_size = (int64_t)1 << b->G;
    else
        b->sub_size = ((int64_t)(b->G / k) << k) + (b->G % k ? (int64_t)1 << (b->G % k) : 0);
}

/* EPX_BALANCED_SUBSET_GPUS=k overrides the largest component the subset
 * solve takes (0: max-flows for every component), read when a balancer is
 * created: the knob tests and benchmarks use to run both solves. Returns
 * 0 (unset, or set and applied) or -1 with *bad = the value when it is not
 * an integer in [0, EPXI_BAL_SUBSET_MAX]; the callers name it. Host only. */
static inline int epxi_bal_subsets_from_env(epxi_bal *b, const char **bad) {
    const char *v = getenv("EPX_BALANCED_SUBSET_GPUS");
    if (v == NULL || *v == '\0') return 0;
    char *end = NULL;
    long k = strtol(v, &end, 10);
    if (*end != '\0' || k < 0 || k > EPXI_BAL_SUBSET_MAX) {
        *bad = v;
        return -1;
    }
    epxi_bal_subsets(b, (int32_t)k);
    return 0;
}
#define EPXI_BAL_STR2(x) #x
#define EPXI_BAL_STR(x) EPXI_BAL_STR2(x)
#define EPXI_BAL_ENV_HELP                                                                          \
    "must be an integer from 0 (max-flows only) to " EPXI_BAL_STR(EPXI_BAL_SUBSET_MAX)

/* EPX_BALANCED_CLOSED_FORM=0 solves a component of one flexible expert by
 * the subset solve like any other (epxi_bal_one_levels gives the same
 * results; the switch is there to compare them). Returns 0, or -1 with
 * *bad = the value when it is not 0 or 1. Host only. */
static inline int epxi_bal_closed_from_env(epxi_bal *b, const char **bad) {
    int on = b->closed;
    if (!epxi_env_switch("EPX_BALANCED_CLOSED_FORM", &on, bad)) return -1;
    b->closed = on;
    return 0;
}
#define EPXI_BAL_CLOSED_HELP "must be 0 (the subset solve) or 1 (the closed form, the default)"

/* Both solve knobs above, read when a balancer is created (CPU and GPU
 * alike). Returns 0, or -1 with *name, *bad (its value) and *help for the
 * first one refused, for the caller's message. Host only. */
static inline int epxi_bal_env(epxi_bal *b, const char **name, const char **bad,
                               const char **help) {
    if (epxi_bal_subsets_from_env(b, bad) != 0) {
        *name = "EPX_BALANCED_SUBSET_GPUS";
        *help = EPXI_BAL_ENV_HELP;
        return -1;
    }
    if (epxi_bal_closed_from_env(b, bad) != 0) {
        *name = "EPX_BALANCED_CLOSED_FORM";
        *help = EPXI_BAL_CLOSED_HELP;
        return -1;
    }
    return 0;
}

/* The GPU ids entry point (src/cuda/balanced.cu) counts and ranks a batch
 * of at least this many (t, k) pairs on many blocks (two launches) rather
 * than on its one block: on an H200 the one block's counting and ranking
 * cost 3.2 us at 1,024 pairs, 10.6 at 4,096 and 79 at 32,768, against
 * ~1-2 us for the second launch and a few for the handoff. */
#define EPXI_BAL_GRID_PAIRS 4096

/* EPX_BALANCED_GRID_PAIRS=n moves that threshold (0: every batch in the
 * grid form; 2^31 or more: never), read when a GPU balancer is created.
 * Returns 0 with *pairs set (EPXI_BAL_GRID_PAIRS when unset or empty), or
 * -1 with *bad = the value when it is not a whole number >= 0 (digits
 * only, no sign); the caller names it. Host only. */
static inline int epxi_bal_grid_pairs_from_env(int64_t *pairs, const char **bad) {
    const char *v = getenv("EPX_BALANCED_GRID_PAIRS");
    *pairs = EPXI_BAL_GRID_PAIRS;
    if (v == NULL || *v == '\0') return 0;
    int64_t n = 0;
    for (const char *c = v; *c; c++) {
        if (*c < '0' || *c > '9') {
            *bad = v;
            return -1;
        }
        /* past 2^40 it means "never" as well as any larger number would */
        n = n > ((int64_t)1 << 40) ? n : n * 10 + (*c - '0');
    }
    *pairs = n;
    return 0;
}
#define EPXI_BAL_GRID_HELP                                                                         \
    "must be a whole number of (t, k) pairs, 0 or more (batches of at least that many use the "    \
    "grid form; 0: all, 2147483648: none; default " EPXI_BAL_STR(EPXI_BAL_GRID_PAIRS) ")"

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
    /* at most G components, each 4 + its experts + its GPUs nodes */
    b->max_nodes = 5 * G + b->maxM;
    /* level graph: s->e, e->g, s->g, g->t; rounding: s->e, e->g, two per GPU,
     * one more per component */
    int64_t fwd = (int64_t)b->maxM * (1 + (int64_t)b->D) + 3 * (int64_t)G;
    b->max_edges = (int32_t)(2 * fwd);
    epxi_bal_subsets(b, EPXI_BAL_SUBSET_GPUS);
    b->closed = 1;
}

/* Carve the arrays out of mem (NULL: only measure); returns the bytes. */
EPXI_BAL size_t epxi_bal_carve(epxi_bal *b, void *mem) {
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
    EPXI_BAL_ARR(g_par, int32_t, G);
    EPXI_BAL_ARR(g_comp, int32_t, G);
    EPXI_BAL_ARR(g_loc, int32_t, G);
    EPXI_BAL_ARR(c_goff, int32_t, G + 1);
    EPXI_BAL_ARR(c_foff, int32_t, G + 1);
    EPXI_BAL_ARR(c_gpus, int32_t, G);
    EPXI_BAL_ARR(c_flex, int32_t, M + 1);
    EPXI_BAL_ARR(c_levels, int32_t, G);
    EPXI_BAL_ARR(c_rc, int32_t, G);
    EPXI_BAL_ARR(c_soff, int32_t, G);
    EPXI_BAL_ARR(f_mask, int32_t, M + 1);
    EPXI_BAL_ARR(f_frac, int32_t, M + 1);
    EPXI_BAL_ARR(f_units, int64_t, M + 1);
    EPXI_BAL_ARR(g_lo, int64_t, G);
    EPXI_BAL_ARR(sub_d, int64_t, (size_t)b->sub_size);
    EPXI_BAL_ARR(sub_s, int64_t, (size_t)b->sub_size);
    EPXI_BAL_ARR(sub_l, int64_t, (size_t)b->sub_size);
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

/* ---- components ------------------------------------------------------------- */

/* GPU g's root in the union-find of the flexible experts' GPU sets (path
 * halving; roots are the smallest GPU of their set, so the result does not
 * depend on the order of the unions). */
EPXI_BAL int32_t epxi_bal_find(epxi_bal *b, int32_t g) {
    while (b->g_par[g] != g) {
        b->g_par[g] = b->g_par[b->g_par[g]];
        g = b->g_par[g];
    }
    return g;
}

/* Split the reduced problem into its connected components: GPUs joined
 * when a flexible expert has replicas on both. The lexicographic optimum of
 * the whole is the union of the components' (no expert crosses two), so
 * each is solved alone, on a graph of its own, which is what lets the
 * kernel solve them side by side. A GPU is in play when it has a base or a
 * flexible expert; the others carry nothing and are in no component.
 * Components come in the order of their smallest GPU, their GPUs and
 * experts ascending; component c owns level ids [c_goff[c], c_goff[c+1]). */
EPXI_BAL void epxi_bal_components(epxi_bal *b) {
    int32_t G = b->G, D = b->D, C = 0;
    for (int32_t g = 0; g < G; g++) {
        b->g_par[g] = g;
        b->g_comp[g] = b->base[g] > 0 ? 0 : -1; /* in play, for now */
    }
    for (int32_t i = 0; i < b->M; i++) {
        int32_t e = b->flex[i];
        const int32_t *gl = b->eg_gpu + (size_t)e * (size_t)D;
        int32_t r0 = epxi_bal_find(b, gl[0]);
        b->g_comp[gl[0]] = 0;
        for (int32_t k = 1; k < b->eg_n[e]; k++) {
            int32_t r = epxi_bal_find(b, gl[k]);
            b->g_comp[gl[k]] = 0;
            if (r < r0) {
                b->g_par[r0] = r;
                r0 = r;
            } else if (r > r0) {
                b->g_par[r] = r0;
            }
        }
    }
    for (int32_t g = 0; g < G; g++) /* roots first: a root is its set's smallest GPU */
        if (b->g_comp[g] == 0 && epxi_bal_find(b, g) == g) b->g_comp[g] = ++C;
    for (int32_t c = 0; c <= C; c++) b->c_goff[c] = b->c_foff[c] = 0;
    for (int32_t g = 0; g < G; g++) /* every GPU reads its root's number first... */
        if (b->g_comp[g] >= 0) b->g_loc[g] = b->g_comp[epxi_bal_find(b, g)] - 1;
    for (int32_t g = 0; g < G; g++) /* ...then takes it, 0-based */
        if (b->g_comp[g] >= 0) {
            b->g_comp[g] = b->g_loc[g];
            b->c_goff[b->g_loc[g] + 1]++;
        }
    for (int32_t i = 0; i < b->M; i++)
        b->c_foff[b->g_comp[b->eg_gpu[(size_t)b->flex[i] * (size_t)D]] + 1]++;
    for (int32_t c = 0; c < C; c++) {
        b->c_goff[c + 1] += b->c_goff[c];
        b->c_foff[c + 1] += b->c_foff[c];
        b->c_levels[c] = 0;
    }
    for (int32_t c = 0; c < C; c++) b->c_rc[c] = 0; /* fill cursors */
    for (int32_t g = 0; g < G; g++) {
        int32_t c = b->g_comp[g];
        if (c < 0) continue;
        b->g_loc[g] = b->c_rc[c]++;
        b->c_gpus[b->c_goff[c] + b->g_loc[g]] = g;
    }
    for (int32_t c = 0; c < C; c++) b->c_rc[c] = 0;
    for (int32_t i = 0; i < b->M; i++) {
        int32_t c = b->g_comp[b->eg_gpu[(size_t)b->flex[i] * (size_t)D]];
        b->c_flex[b->c_foff[c] + b->c_rc[c]++] = i;
    }
    int64_t soff = 0;
    for (int32_t c = 0; c < C; c++) {
        int32_t ng = b->c_goff[c + 1] - b->c_goff[c];
        int has_flex = b->c_foff[c + 1] > b->c_foff[c];
        b->c_rc[c] = EPXI_BAL_OK;
        b->c_soff[c] = -1;
        if (has_flex && ng <= b->sub_max && soff + ((int64_t)1 << ng) <= b->sub_size) {
            b->c_soff[c] = (int32_t)soff;
            soff += (int64_t)1 << ng;
        }
    }
    b->C = C;
}

/* ---- one component's max-flow graph ------------------------------------------ */

/* A component's view: its experts (indices into flex) and GPUs, the level
 * ids it owns, and its graph's nodes and edges, carved from the shared
 * arrays at offsets no other component uses. Nodes: 0 = s (S' while
 * rounding), 1 = t (T'), 2 = s and t merged while rounding, 3 unused, then
 * its experts, then its GPUs. */
typedef struct epxi_bal_part {
    int32_t nf, ng, lv0;
    const int32_t *fl, *gl;
    int32_t n, m, max_edges;
    int32_t *head, *lvl, *iter, *queue, *path;
    uint8_t *mark;
    int32_t *next, *to;
    int64_t *cap;
} epxi_bal_part;

#define EPXI_BAL_FN(j) (4 + (j))
#define EPXI_BAL_GN(p, gi) (4 + (p)->nf + (gi))

EPXI_BAL epxi_bal_part epxi_bal_view(const epxi_bal *b, int32_t c) {
    epxi_bal_part p;
    int32_t f0 = b->c_foff[c], g0 = b->c_goff[c];
    p.nf = b->c_foff[c + 1] - f0;
    p.ng = b->c_goff[c + 1] - g0;
    p.lv0 = g0;
    p.fl = b->c_flex + f0;
    p.gl = b->c_gpus + g0;
    size_t node0 = 4 * (size_t)c + (size_t)f0 + (size_t)g0;
    size_t edge0 = 2 * ((size_t)f0 * (1 + (size_t)b->D) + 2 * (size_t)g0 + (size_t)c);
    p.n = p.m = 0;
    p.max_edges = 2 * (p.nf * (1 + b->D) + 2 * p.ng + 1);
    p.head = b->head + node0;
    p.lvl = b->lvl + node0;
    p.iter = b->iter + node0;
    p.queue = b->queue + node0;
    p.path = b->path + node0;
    p.mark = b->mark + node0;
    p.next = b->next + edge0;
    p.to = b->to + edge0;
    p.cap = b->cap + edge0;
    return p;
}

EPXI_BAL void epxi_bal_reset(epxi_bal_part *p) {
    p->n = 4 + p->nf + p->ng;
    p->m = 0;
    for (int32_t v = 0; v < p->n; v++) p->head[v] = -1;
}

/* Add u -> v (capacity c) and its reverse (e ^ 1); returns e. Sized at
 * carve time: -1 only if that sizing is wrong. */
EPXI_BAL int32_t epxi_bal_add(epxi_bal_part *p, int32_t u, int32_t v, int64_t c) {
    if (p->m + 2 > p->max_edges) return -1;
    int32_t e = p->m;
    p->to[e] = v;
    p->cap[e] = c;
    p->next[e] = p->head[u];
    p->head[u] = e;
    p->to[e + 1] = u;
    p->cap[e + 1] = 0;
    p->next[e + 1] = p->head[v];
    p->head[v] = e + 1;
    p->m += 2;
    return e;
}

/* The flow on forward edge e (its reverse's residual); 0 for e = -1. */
EPXI_BAL int64_t epxi_bal_on(const epxi_bal_part *p, int32_t e) {
    return e >= 0 ? p->cap[e ^ 1] : 0;
}

/* Push f along edge e (its reverse is e ^ 1). */
EPXI_BAL void epxi_bal_push(epxi_bal_part *p, int32_t e, int64_t f) {
    p->cap[e] -= f;
    p->cap[e ^ 1] += f;
}

EPXI_BAL int epxi_bal_bfs(epxi_bal_part *p, int32_t s, int32_t t) {
    for (int32_t v = 0; v < p->n; v++) p->lvl[v] = -1;
    int32_t qh = 0, qt = 0;
    p->lvl[s] = 0;
    p->queue[qt++] = s;
    while (qh < qt) {
        int32_t u = p->queue[qh++];
        for (int32_t e = p->head[u]; e >= 0; e = p->next[e]) {
            int32_t v = p->to[e];
            if (p->cap[e] > 0 && p->lvl[v] < 0) {
                p->lvl[v] = p->lvl[u] + 1;
                p->queue[qt++] = v;
            }
        }
    }
    return p->lvl[t] >= 0;
}

/* Dinic: push a maximum flow from s to t; returns the amount. Afterwards lvl
 * marks (>= 0) what s reaches in the residual graph: the min cut's source side. */
EPXI_BAL int64_t epxi_bal_maxflow(epxi_bal_part *p, int32_t s, int32_t t) {
    int64_t total = 0;
    while (epxi_bal_bfs(p, s, t)) {
        for (int32_t v = 0; v < p->n; v++) p->iter[v] = p->head[v];
        for (;;) {
            int32_t u = s, d = 0, stuck = 0;
            while (u != t) {
                int32_t e = p->iter[u];
                while (e >= 0 && (p->cap[e] <= 0 || p->lvl[p->to[e]] != p->lvl[u] + 1))
                    e = p->next[e];
                p->iter[u] = e;
                if (e >= 0) {
                    p->path[d++] = e;
                    u = p->to[e];
                    continue;
                }
                if (u == s) {
                    stuck = 1;
                    break;
                }
                /* u is a dead end: retreat and move the parent past the edge */
                int32_t back = p->path[--d];
                u = p->to[back ^ 1];
                p->iter[u] = p->next[p->iter[u]];
            }
            if (stuck) break;
            int64_t f = INT64_MAX;
            for (int32_t k = 0; k < d; k++)
                if (p->cap[p->path[k]] < f) f = p->cap[p->path[k]];
            for (int32_t k = 0; k < d; k++) epxi_bal_push(p, p->path[k], f);
            total += f;
        }
    }
    return total;
}

/* t's forward edge out of node v (g -> t), or -1. */
EPXI_BAL int32_t epxi_bal_to_sink(const epxi_bal_part *p, int32_t v, int32_t t) {
    for (int32_t e = p->head[v]; e >= 0; e = p->next[e])
        if (!(e & 1) && p->to[e] == t) return e;
    return -1;
}

/* A flow to start the max-flow from, on a level graph (epxi_bal_build):
 * every source edge in s's list order sends what the sink edges behind it
 * still take, bases straight to their GPU and experts over their GPUs in
 * list order. Any flow is a start the augmenting paths complete, so the
 * maximum is the same; this one leaves them little to do (most batches fit
 * greedily), which is what the kernel's one thread per component needs.
 * Returns the flow pushed. Deterministic: the same on CPU and GPU. */
EPXI_BAL int64_t epxi_bal_greedy(epxi_bal_part *p, int32_t s, int32_t t) {
    int64_t total = 0;
    for (int32_t e = p->head[s]; e >= 0; e = p->next[e]) {
        if (e & 1) continue;
        const int32_t v = p->to[e];
        const int32_t vt = epxi_bal_to_sink(p, v, t);
        if (vt >= 0) { /* a base: s -> g -> t */
            const int64_t f = p->cap[e] < p->cap[vt] ? p->cap[e] : p->cap[vt];
            epxi_bal_push(p, e, f);
            epxi_bal_push(p, vt, f);
            total += f;
            continue;
        }
        for (int32_t x = p->head[v]; x >= 0 && p->cap[e] > 0; x = p->next[x]) {
            if (x & 1) continue;
            const int32_t gt = epxi_bal_to_sink(p, p->to[x], t);
            if (gt < 0) continue;
            const int64_t f = p->cap[e] < p->cap[gt] ? p->cap[e] : p->cap[gt];
            if (f <= 0) continue;
            epxi_bal_push(p, e, f);
            epxi_bal_push(p, x, f);
            epxi_bal_push(p, gt, f);
            total += f;
        }
    }
    return total;
}

/* mark[v] = 1 for every node that reaches t in the residual graph. */
EPXI_BAL void epxi_bal_reaches(epxi_bal_part *p, int32_t t) {
    for (int32_t v = 0; v < p->n; v++) p->mark[v] = 0;
    int32_t qh = 0, qt = 0;
    p->mark[t] = 1;
    p->queue[qt++] = t;
    while (qh < qt) {
        int32_t v = p->queue[qh++];
        for (int32_t e = p->head[v]; e >= 0; e = p->next[e]) {
            int32_t w = p->to[e];
            if (!p->mark[w] && p->cap[e ^ 1] > 0) {
                p->mark[w] = 1;
                p->queue[qt++] = w;
            }
        }
    }
}

/* ---- one component's levels ------------------------------------------------------ */

/* C(S) and |N(S)| over the component's unfixed GPUs, S = its flexible
 * experts with f_in and the bases of its GPUs with g_sin. */
EPXI_BAL void epxi_bal_ratio(epxi_bal *b, const epxi_bal_part *p, int64_t *a, int64_t *den) {
    int64_t c = 0, n = 0;
    int32_t D = b->D;
    for (int32_t gi = 0; gi < p->ng; gi++) b->g_in[p->gl[gi]] = 0;
    for (int32_t j = 0; j < p->nf; j++) {
        int32_t i = p->fl[j];
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
    for (int32_t gi = 0; gi < p->ng; gi++) {
        int32_t g = p->gl[gi];
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

/* The graph of the component's unfixed part at lambda = a / den: s -> e
 * (den c_e), e -> g (unbounded) to unfixed GPUs, s -> g (den base_g),
 * g -> t (a). Returns the flow that means feasible. */
EPXI_BAL int64_t epxi_bal_build(epxi_bal *b, epxi_bal_part *p, int64_t a, int64_t den) {
    int32_t D = b->D;
    epxi_bal_reset(p);
    for (int32_t gi = 0; gi < p->ng; gi++) b->g_graph[p->gl[gi]] = 0;
    int64_t need = 0;
    for (int32_t j = 0; j < p->nf; j++) {
        int32_t i = p->fl[j];
        if (b->f_level[i] != -1) continue;
        int32_t e = b->flex[i];
        epxi_bal_add(p, 0, EPXI_BAL_FN(j), den * b->cnt[e]);
        need += den * b->cnt[e];
        for (int32_t k = 0; k < b->eg_n[e]; k++) {
            int32_t g = b->eg_gpu[(size_t)e * (size_t)D + (size_t)k];
            int32_t *ed = b->f_edge + (size_t)i * (size_t)D + (size_t)k;
            *ed = -1;
            if (b->g_level[g] != -1) continue;
            *ed = epxi_bal_add(p, EPXI_BAL_FN(j), EPXI_BAL_GN(p, b->g_loc[g]), EPXI_BAL_INF);
            b->g_graph[g] = 1;
        }
    }
    for (int32_t gi = 0; gi < p->ng; gi++) {
        int32_t g = p->gl[gi];
        if (b->g_level[g] == -1 && b->base[g] > 0) {
            epxi_bal_add(p, 0, EPXI_BAL_GN(p, gi), den * b->base[g]);
            need += den * b->base[g];
            b->g_graph[g] = 1;
        }
    }
    for (int32_t gi = 0; gi < p->ng; gi++)
        if (b->g_graph[p->gl[gi]]) epxi_bal_add(p, EPXI_BAL_GN(p, gi), 1, a);
    return need;
}

/* One level: lambda of the unfixed part by Dinkelbach's iteration, then fix
 * its largest tight set. With the one-GPU experts merged into s -> g, an
 * unmerged expert on GPU g (count > 0) is reached from s exactly when g is
 * (its edge to g is unbounded; a saturated s -> e carries flow, whose
 * reverse leads back from g), so the cut's set S' takes g's base exactly
 * when s reaches g; and such experts reach t exactly when g does. */
EPXI_BAL int epxi_bal_level(epxi_bal *b, epxi_bal_part *p, int32_t lv) {
    int32_t D = b->D;
    for (int32_t j = 0; j < p->nf; j++) b->f_in[p->fl[j]] = b->f_level[p->fl[j]] == -1;
    for (int32_t gi = 0; gi < p->ng; gi++) {
        int32_t g = p->gl[gi];
        b->g_sin[g] = b->g_level[g] == -1 && b->base[g] > 0;
    }
    int64_t a, den, a_prev = 0, den_prev = 1;
    for (int32_t step = 0;; step++) {
        epxi_bal_ratio(b, p, &a, &den);
        if (den == 0 || step > p->ng + 1 || (step > 0 && a * den_prev <= a_prev * den))
            return EPXI_BAL_NO_ADVANCE;
        int64_t need = epxi_bal_build(b, p, a, den);
        const int64_t start = epxi_bal_greedy(p, 0, 1);
        if (start + epxi_bal_maxflow(p, 0, 1) == need) break;
        for (int32_t j = 0; j < p->nf; j++) {
            int32_t i = p->fl[j];
            b->f_in[i] = b->f_level[i] == -1 && p->lvl[EPXI_BAL_FN(j)] >= 0;
        }
        for (int32_t gi = 0; gi < p->ng; gi++) {
            int32_t g = p->gl[gi];
            b->g_sin[g] = b->g_level[g] == -1 && b->base[g] > 0 && p->lvl[EPXI_BAL_GN(p, gi)] >= 0;
        }
        a_prev = a;
        den_prev = den;
    }
    epxi_bal_reaches(p, 1);
    for (int32_t j = 0; j < p->nf; j++) {
        int32_t i = p->fl[j];
        if (b->f_level[i] != -1 || p->mark[EPXI_BAL_FN(j)]) continue;
        b->f_level[i] = lv;
        int32_t e = b->flex[i];
        for (int32_t k = 0; k < b->eg_n[e]; k++) {
            size_t x = (size_t)i * (size_t)D + (size_t)k;
            b->f_flow[x] = epxi_bal_on(p, b->f_edge[x]);
        }
    }
    int32_t fixed = 0;
    for (int32_t gi = 0; gi < p->ng; gi++) {
        int32_t g = p->gl[gi];
        if (b->g_graph[g] && !p->mark[EPXI_BAL_GN(p, gi)]) {
            b->g_level[g] = lv;
            fixed++;
        }
    }
    /* the tight set sends only to its own GPUs, which carry exactly a each */
    for (int32_t j = 0; j < p->nf; j++) {
        int32_t i = p->fl[j];
        if (b->f_level[i] != lv) continue;
        int32_t e = b->flex[i];
        for (int32_t k = 0; k < b->eg_n[e]; k++) {
            size_t x = (size_t)i * (size_t)D + (size_t)k;
            if (b->f_flow[x] > 0 && b->g_level[b->eg_gpu[(size_t)e * (size_t)D + (size_t)k]] != lv)
                fixed = 0;
        }
    }
    if (fixed == 0) return EPXI_BAL_NO_TIGHT;
    b->lv_num[lv] = a;
    b->lv_den[lv] = den;
    return EPXI_BAL_OK;
}

/* Integer flows within one token of the fractional ones, GPU loads within
 * one of theirs: a max-flow with lower bounds (balanced.c), per component. */
EPXI_BAL int epxi_bal_round(epxi_bal *b, epxi_bal_part *p) {
    int32_t D = b->D;
    epxi_bal_reset(p);
    int64_t need = 0, sum_lo = 0, total = 0;
    for (int32_t gi = 0; gi < p->ng; gi++) {
        int32_t g = p->gl[gi];
        b->gex[g] = b->base[g];
        total += b->base[g];
    }
    for (int32_t j = 0; j < p->nf; j++) {
        int32_t i = p->fl[j], e = b->flex[i];
        int64_t den = b->lv_den[b->f_level[i]], r = b->cnt[e];
        total += r;
        for (int32_t k = 0; k < b->eg_n[e]; k++) {
            size_t x = (size_t)i * (size_t)D + (size_t)k;
            int32_t g = b->eg_gpu[(size_t)e * (size_t)D + (size_t)k];
            int64_t lo = b->f_flow[x] / den;
            r -= lo;
            b->gex[g] += lo;
            b->f_edge[x] = b->f_flow[x] % den
                               ? epxi_bal_add(p, EPXI_BAL_FN(j), EPXI_BAL_GN(p, b->g_loc[g]), 1)
                               : -1;
        }
        if (r > 0) {
            epxi_bal_add(p, 0, EPXI_BAL_FN(j), r);
            need += r;
        }
    }
    for (int32_t gi = 0; gi < p->ng; gi++) {
        int32_t g = p->gl[gi], lv = b->g_level[g];
        int64_t lo = 0;
        if (lv >= 0) {
            lo = b->lv_num[lv] / b->lv_den[lv];
            if (b->lv_num[lv] % b->lv_den[lv]) epxi_bal_add(p, EPXI_BAL_GN(p, gi), 2, 1);
        }
        sum_lo += lo;
        int64_t x = b->gex[g] - lo;
        if (x > 0) {
            epxi_bal_add(p, 0, EPXI_BAL_GN(p, gi), x);
            need += x;
        } else if (x < 0) {
            epxi_bal_add(p, EPXI_BAL_GN(p, gi), 1, -x);
        }
    }
    if (total - sum_lo > 0) epxi_bal_add(p, 2, 1, total - sum_lo);
    if (epxi_bal_maxflow(p, 0, 1) != need) return EPXI_BAL_ROUNDING;
    for (int32_t j = 0; j < p->nf; j++) {
        int32_t i = p->fl[j], e = b->flex[i];
        int64_t den = b->lv_den[b->f_level[i]];
        for (int32_t k = 0; k < b->eg_n[e]; k++) {
            size_t x = (size_t)i * (size_t)D + (size_t)k;
            b->f_int[x] = b->f_flow[x] / den + epxi_bal_on(p, b->f_edge[x]);
        }
    }
    return EPXI_BAL_OK;
}

/* Component c: every level, then the rounding; sets c_levels[c] and
 * c_rc[c] and returns the latter. A lone GPU is its own level, no flow. */
EPXI_BAL int epxi_bal_solve_part(epxi_bal *b, int32_t c) {
    epxi_bal_part p = epxi_bal_view(b, c);
    int32_t left = p.nf, levels = 0, rc = EPXI_BAL_OK;
    for (int32_t j = 0; j < p.nf; j++) b->f_level[p.fl[j]] = -1;
    for (int32_t gi = 0; gi < p.ng; gi++) {
        b->g_level[p.gl[gi]] = -1;
        left += b->base[p.gl[gi]] > 0;
    }
    if (p.nf == 0) { /* one GPU with a base */
        b->g_level[p.gl[0]] = p.lv0;
        b->lv_num[p.lv0] = b->base[p.gl[0]];
        b->lv_den[p.lv0] = 1;
        b->c_levels[c] = 1;
        return b->c_rc[c] = EPXI_BAL_OK;
    }
    while (left > 0 && rc == EPXI_BAL_OK) {
        if (levels >= p.ng) {
            rc = EPXI_BAL_LEVELS;
            break;
        }
        rc = epxi_bal_level(b, &p, p.lv0 + levels);
        if (rc != EPXI_BAL_OK) break;
        levels++;
        left = 0;
        for (int32_t j = 0; j < p.nf; j++) left += b->f_level[p.fl[j]] == -1;
        for (int32_t gi = 0; gi < p.ng; gi++) {
            int32_t g = p.gl[gi];
            left += b->g_level[g] == -1 && b->base[g] > 0;
        }
    }
    if (rc == EPXI_BAL_OK) rc = epxi_bal_round(b, &p);
    b->c_levels[c] = levels;
    return b->c_rc[c] = rc;
}

/* ---- one component by its subsets (components of at most sub_max GPUs) -------- */

/* The same statements run by one thread (the CPU: lane 0 of nl = 1) or by
 * the 32 lanes of a warp (the kernel: nl = 32), each lane taking the
 * subsets V = lane, lane + nl, ...; the reductions are exact (integer
 * minima, and a maximum whose ties are merged by OR), so their order does
 * not matter and both give the same bits. */
#ifdef __CUDA_ARCH__
#define EPXI_BAL_SYNCWARP() __syncwarp()
#else
#define EPXI_BAL_SYNCWARP() ((void)0)
#endif

/* x / y and x % y, in 32 bits where both fit: the same values, but on the
 * GPU a 64-bit division is a subroutine of ~70 dependent instructions, on
 * the per-batch solve's sequential chains (the rounding, the outputs, the
 * summary). */
EPXI_BAL int64_t epxi_bal_div(int64_t x, int64_t y) {
    if (x >= 0 && y > 0 && x <= INT32_MAX && y <= INT32_MAX)
        return (int64_t)((uint32_t)x / (uint32_t)y);
    return x / y;
}
EPXI_BAL int64_t epxi_bal_mod(int64_t x, int64_t y) {
    if (x >= 0 && y > 0 && x <= INT32_MAX && y <= INT32_MAX)
        return (int64_t)((uint32_t)x % (uint32_t)y);
    return x % y;
}

EPXI_BAL int32_t epxi_bal_popc(uint32_t x) {
#ifdef __CUDA_ARCH__
    return __popc(x);
#else
    int32_t n = 0;
    for (; x; x &= x - 1) n++;
    return n;
#endif
}

EPXI_BAL void epxi_bal_add_to(int64_t *p, int64_t v) {
#ifdef __CUDA_ARCH__
    atomicAdd((unsigned long long *)p, (unsigned long long)v);
#else
    *p += v;
#endif
}

EPXI_BAL int64_t epxi_bal_min_lanes(int64_t v, int nl) {
#ifdef __CUDA_ARCH__
    if (nl > 1)
        for (int o = 16; o > 0; o >>= 1) {
            int64_t w = __shfl_xor_sync(0xffffffffu, v, o);
            v = w < v ? w : v;
        }
#else
    (void)nl;
#endif
    return v;
}

EPXI_BAL int epxi_bal_all_lanes(int ok, int nl) {
#ifdef __CUDA_ARCH__
    if (nl > 1) return __all_sync(0xffffffffu, ok);
#else
    (void)nl;
#endif
    return ok;
}

/* Keep the larger ratio num / den of (num, den, mask) and (n2, d2, m2);
 * on a tie the union of the masks (tight sets are closed under union). */
EPXI_BAL void epxi_bal_better(int64_t *num, int32_t *den, uint32_t *mask, int64_t n2, int32_t d2,
                              uint32_t m2) {
    int64_t l = n2 * *den, r = *num * d2;
    if (l > r) {
        *num = n2;
        *den = d2;
        *mask = m2;
    } else if (l == r) {
        *mask |= m2;
    }
}

EPXI_BAL uint32_t epxi_bal_best_lanes(int64_t num, int32_t den, uint32_t mask, int nl) {
#ifdef __CUDA_ARCH__
    if (nl > 1)
        for (int o = 16; o > 0; o >>= 1) {
            int64_t n2 = __shfl_xor_sync(0xffffffffu, num, o);
            int32_t d2 = __shfl_xor_sync(0xffffffffu, den, o);
            uint32_t m2 = __shfl_xor_sync(0xffffffffu, mask, o);
            epxi_bal_better(&num, &den, &mask, n2, d2, m2);
        }
#else
    (void)num;
    (void)den;
    (void)nl;
#endif
    return mask;
}

/* Is expert j of component view p one of level (X, U)'s: a GPU outside X,
 * none outside X | U? */
EPXI_BAL int epxi_bal_in_level(const epxi_bal *b, const epxi_bal_part *p, int32_t j, uint32_t X,
                               uint32_t U) {
    const uint32_t m = (uint32_t)b->f_mask[p->fl[j]];
    return (m & ~X) != 0 && (m & ~(X | U)) == 0;
}

/* Expert (r units, fractional GPUs F)'s terms in the two conditions at
 * subset v: max(0, r - |F \ v|) and min(r, |F & v|). */
EPXI_BAL int64_t epxi_bal_over(int64_t r, uint32_t F, uint32_t v) {
    int64_t x = r - epxi_bal_popc(F & ~v);
    return x > 0 ? x : 0;
}
EPXI_BAL int64_t epxi_bal_under(int64_t r, uint32_t F, uint32_t v) {
    int64_t x = epxi_bal_popc(F & v);
    return r < x ? r : x;
}

/* Round level (X, U) of a subset-solved component (load a / dn on each of
 * U's GPUs): every flow down to whole tokens, then the units left, r_e
 * for expert e, each to one of its GPUs with a fractional flow (F_e, at
 * most one each), so that GPU g takes between lo_g and hi_g of them (its
 * integer load the level's floor or ceiling). By Hoffman's circulation
 * theorem on s -> e -> g -> t (cut by cut) that is feasible iff for every
 * subset v of U: sum_e max(0, r_e - |F_e \ v|) <= hi(v) and sum_e min(r_e,
 * |F_e & v|) >= lo(v). The fractional split satisfies both, so a rounding
 * exists; the greedy walks each expert's fractional GPUs in order and
 * gives a unit where both still hold for every v after it (each lane its
 * subsets, then all lanes agree), else none, so what is left stays
 * feasible. su / sl: the two slacks per subset. */
EPXI_BAL void epxi_bal_subset_round(epxi_bal *b, const epxi_bal_part *p, int64_t *su, int64_t *sl,
                                    uint32_t X, uint32_t U, int64_t a, int32_t dn, int lane,
                                    int nl) {
    const int32_t D = b->D, k = p->ng;
    const uint32_t nv = 1u << k;
    const int64_t floor_l = epxi_bal_div(a, dn), ceil_l = epxi_bal_div(a + dn - 1, dn);
    for (int32_t j = lane; j < p->nf; j += nl) {
        if (!epxi_bal_in_level(b, p, j, X, U)) continue;
        const int32_t i = p->fl[j], e = b->flex[i];
        int64_t r = b->cnt[e];
        uint32_t F = 0;
        for (int32_t q = 0; q < b->eg_n[e]; q++) {
            const size_t x = (size_t)i * (size_t)D + (size_t)q;
            b->f_int[x] = epxi_bal_div(b->f_flow[x], dn);
            r -= b->f_int[x];
            if (epxi_bal_mod(b->f_flow[x], dn))
                F |= 1u << b->g_loc[b->eg_gpu[(size_t)e * (size_t)D + (size_t)q]];
        }
        b->f_frac[i] = (int32_t)F;
        b->f_units[i] = r;
    }
    EPXI_BAL_SYNCWARP();
    for (int32_t gi = lane; gi < k; gi += nl) {
        if (!(U >> gi & 1)) continue;
        const int32_t g = p->gl[gi];
        int64_t fixed = b->base[g];
        for (int32_t j = 0; j < p->nf; j++) {
            if (!epxi_bal_in_level(b, p, j, X, U)) continue;
            const int32_t i = p->fl[j], e = b->flex[i];
            for (int32_t q = 0; q < b->eg_n[e]; q++)
                if (b->eg_gpu[(size_t)e * (size_t)D + (size_t)q] == g)
                    fixed += b->f_int[(size_t)i * (size_t)D + (size_t)q];
        }
        b->gex[g] = ceil_l - fixed; /* hi_g */
        b->g_lo[g] = floor_l - fixed;
    }
    EPXI_BAL_SYNCWARP();
    for (uint32_t v = (uint32_t)lane; v < nv; v += (uint32_t)nl) {
        if ((v & ~U) != 0) continue;
        int64_t u = 0, l = 0;
        for (int32_t gi = 0; gi < k; gi++)
            if (v >> gi & 1) {
                u += b->gex[p->gl[gi]];
                l -= b->g_lo[p->gl[gi]];
            }
        for (int32_t j = 0; j < p->nf; j++) {
            if (!epxi_bal_in_level(b, p, j, X, U)) continue;
            const int32_t i = p->fl[j];
            u -= epxi_bal_over(b->f_units[i], (uint32_t)b->f_frac[i], v);
            l += epxi_bal_under(b->f_units[i], (uint32_t)b->f_frac[i], v);
        }
        su[v] = u;
        sl[v] = l;
    }
    EPXI_BAL_SYNCWARP();
    for (int32_t j = 0; j < p->nf; j++) { /* the level's experts, in order */
        if (!epxi_bal_in_level(b, p, j, X, U)) continue;
        const int32_t i = p->fl[j], e = b->flex[i];
        int64_t r = b->f_units[i];
        uint32_t F = (uint32_t)b->f_frac[i];
        for (int32_t q = 0; q < b->eg_n[e] && r > 0; q++) {
            const int32_t g = b->eg_gpu[(size_t)e * (size_t)D + (size_t)q], gb = b->g_loc[g];
            if (!(F >> gb & 1)) continue;
            const uint32_t F2 = F & ~(1u << gb);
            const int64_t lo_step = b->g_lo[g] > 0;
            int ok = 1;
            for (uint32_t v = (uint32_t)lane; v < nv && ok; v += (uint32_t)nl) {
                if ((v & ~U) != 0) continue;
                const int in = v >> gb & 1;
                /* give: r - 1 units over F2; hi_g and lo_g one lower */
                int64_t u = su[v] + epxi_bal_over(r, F, v) - epxi_bal_over(r - 1, F2, v) - in;
                int64_t l = sl[v] - epxi_bal_under(r, F, v) + epxi_bal_under(r - 1, F2, v) +
                            (in ? lo_step : 0);
                ok &= u >= 0 && l >= 0;
            }
            const int give = epxi_bal_all_lanes(ok, nl);
            const int64_t r2 = r - give;
            for (uint32_t v = (uint32_t)lane; v < nv; v += (uint32_t)nl) {
                if ((v & ~U) != 0) continue;
                const int in = v >> gb & 1;
                su[v] += epxi_bal_over(r, F, v) - epxi_bal_over(r2, F2, v) - (give ? in : 0);
                sl[v] += epxi_bal_under(r2, F2, v) - epxi_bal_under(r, F, v) +
                         (give && in ? lo_step : 0);
            }
            EPXI_BAL_SYNCWARP();
            if (lane == 0 && give) {
                b->f_int[(size_t)i * (size_t)D + (size_t)q] += 1;
                b->gex[g] -= 1;
                b->g_lo[g] -= lo_step;
            }
            EPXI_BAL_SYNCWARP();
            r = r2;
            F = F2;
        }
    }
}

/* The subset solve of component c (balanced.c states it): d[V] = the tokens
 * that must land inside V (bases of V's GPUs, flexible experts with every
 * GPU in V), for every subset V of the component's GPUs (bit i = its i-th
 * GPU), by a sum over subsets. With X the GPUs of the levels so far, the
 * next level is the largest V > X maximising (d[V] - d[X]) / |V \ X|; its
 * experts (GPUs inside V, not all inside X) are split by a greedy that
 * keeps every subset's slack s[W] = lambda |W| - (d[X | W] - d[X]) >= 0:
 * each of an expert's GPUs but its last takes the most it can, the
 * smallest slack of the subsets that holding it would shrink. Every lane
 * of the caller's warp calls this (all nl of them). */
EPXI_BAL int32_t epxi_bal_subset_levels(epxi_bal *b, const epxi_bal_part *p, int32_t c, int lane,
                                        int nl) {
    const int32_t k = p->ng, D = b->D;
    const uint32_t full = (1u << k) - 1, nv = 1u << k;
    int64_t *d = b->sub_d + b->c_soff[c], *s = b->sub_s + b->c_soff[c];
    for (int32_t j = lane; j < p->nf; j += nl) {
        int32_t i = p->fl[j], e = b->flex[i];
        uint32_t m = 0;
        for (int32_t q = 0; q < b->eg_n[e]; q++)
            m |= 1u << b->g_loc[b->eg_gpu[(size_t)e * (size_t)D + (size_t)q]];
        b->f_mask[i] = (int32_t)m;
        b->f_level[i] = -1;
    }
    for (int32_t gi = lane; gi < k; gi += nl) b->g_level[p->gl[gi]] = -1;
    for (uint32_t v = (uint32_t)lane; v < nv; v += (uint32_t)nl) d[v] = 0;
    EPXI_BAL_SYNCWARP();
    for (int32_t j = lane; j < p->nf; j += nl)
        epxi_bal_add_to(d + b->f_mask[p->fl[j]], b->cnt[b->flex[p->fl[j]]]);
    for (int32_t gi = lane; gi < k; gi += nl) epxi_bal_add_to(d + (1u << gi), b->base[p->gl[gi]]);
    EPXI_BAL_SYNCWARP();
    for (int32_t bit = 0; bit < k; bit++) {
        for (uint32_t v = (uint32_t)lane; v < nv; v += (uint32_t)nl)
            if (v >> bit & 1) d[v] += d[v ^ (1u << bit)];
        EPXI_BAL_SYNCWARP();
    }
    uint32_t X = 0;
    int32_t levels = 0;
    while (X != full && d[full] > d[X]) {
        int64_t num = -1;
        int32_t den = 1;
        uint32_t mask = 0;
        const int32_t nx = epxi_bal_popc(X);
        for (uint32_t v = (uint32_t)lane; v < nv; v += (uint32_t)nl)
            if ((v & X) == X && v != X)
                epxi_bal_better(&num, &den, &mask, d[v] - d[X], epxi_bal_popc(v) - nx, v);
        const uint32_t U = epxi_bal_best_lanes(num, den, mask, nl) & ~X;
        const int64_t a = d[X | U] - d[X];
        const int32_t dn = epxi_bal_popc(U), lid = p->lv0 + levels;
        if (lane == 0) {
            b->lv_num[lid] = a;
            b->lv_den[lid] = dn;
        }
        for (int32_t gi = lane; gi < k; gi += nl)
            if (U >> gi & 1) b->g_level[p->gl[gi]] = lid;
        for (uint32_t v = (uint32_t)lane; v < nv; v += (uint32_t)nl)
            if ((v & ~U) == 0) s[v] = a * epxi_bal_popc(v) - dn * (d[X | v] - d[X]);
        EPXI_BAL_SYNCWARP();
        for (int32_t j = 0; j < p->nf; j++) { /* this level's experts, in order */
            const int32_t i = p->fl[j], e = b->flex[i];
            const uint32_t m = (uint32_t)b->f_mask[i];
            if (!(m & ~X) || (m & ~(X | U))) continue;
            if (lane == 0) b->f_level[i] = lid;
            int64_t rem = dn * b->cnt[e];
            uint32_t N = m & U;
            for (int32_t q = 0; q < b->eg_n[e]; q++) {
                const size_t x = (size_t)i * (size_t)D + (size_t)q;
                const int32_t g = b->g_loc[b->eg_gpu[(size_t)e * (size_t)D + (size_t)q]];
                const uint32_t rest = N & ~(1u << g);
                int64_t take = 0;
                if ((N >> g & 1) && rest == 0) {
                    take = rem; /* the last GPU: what is left */
                } else if (N >> g & 1) {
                    int64_t lo = EPXI_BAL_INF;
                    for (uint32_t v = (uint32_t)lane; v < nv; v += (uint32_t)nl)
                        if ((v & ~U) == 0 && (v >> g & 1) && (v & rest) != rest)
                            lo = s[v] < lo ? s[v] : lo;
                    lo = epxi_bal_min_lanes(lo, nl);
                    take = rem < lo ? rem : lo;
                    for (uint32_t v = (uint32_t)lane; v < nv; v += (uint32_t)nl) {
                        if ((v & ~U) != 0) continue;
                        if (v >> g & 1) {
                            if ((v & rest) != rest) s[v] -= take;
                        } else if ((v & rest) == rest) {
                            s[v] -= rem - take;
                        }
                    }
                    EPXI_BAL_SYNCWARP();
                    N = rest;
                }
                if (lane == 0) b->f_flow[x] = take;
                rem -= take;
            }
        }
        EPXI_BAL_SYNCWARP();
        /* the level is split: its slack table s now serves the rounding */
        epxi_bal_subset_round(b, p, s, b->sub_l + b->c_soff[c], X, U, a, dn, lane, nl);
        X |= U;
        levels++;
    }
    EPXI_BAL_SYNCWARP();
    return levels;
}

/* Whether component view p is one flexible expert on every one of its
 * GPUs (epxi_bal_one_levels' case), from its lists alone: every lane of a
 * warp gets the same answer. */
EPXI_BAL int epxi_bal_one_expert(const epxi_bal *b, const epxi_bal_part *p) {
    if (!b->closed || p->nf != 1) return 0;
    const int32_t e = b->flex[p->fl[0]];
    uint32_t m = 0;
    for (int32_t q = 0; q < b->eg_n[e]; q++)
        m |= 1u << b->g_loc[b->eg_gpu[(size_t)e * (size_t)b->D + (size_t)q]];
    return m == (1u << p->ng) - 1;
}

/* Such a component in closed form, with the subset solve's results to the
 * bit (its levels, flows and rounding), on one thread. There the subsets'
 * demands are the bases, and the expert's c tokens on the whole set only,
 * so each level is either the remaining GPUs of the largest base (when
 * they stand above the water line, (bases + c) / GPUs) or all the rest,
 * which the expert's flows fill to that line: GPU g's flow, in 1 / dn
 * units, is a - dn b_g. Flooring leaves a mod dn units, one each to the
 * first GPUs in the expert's order (each may take one). Returns the
 * levels. */
EPXI_BAL int32_t epxi_bal_one_levels(epxi_bal *b, const epxi_bal_part *p) {
    const int32_t k = p->ng, D = b->D, i = p->fl[0], e = b->flex[i];
    const int64_t c = b->cnt[e];
    const uint32_t full = (1u << k) - 1;
    const int32_t *eg = b->eg_gpu + (size_t)e * (size_t)D;
    b->f_mask[i] = (int32_t)full;
    b->f_level[i] = -1;
    for (int32_t gi = 0; gi < k; gi++) b->g_level[p->gl[gi]] = -1;
    uint32_t X = 0;
    int32_t levels = 0;
    while (X != full) {
        int64_t top = -1, sum = 0;
        for (int32_t gi = 0; gi < k; gi++)
            if (!(X >> gi & 1)) {
                const int64_t bg = b->base[p->gl[gi]];
                sum += bg;
                top = bg > top ? bg : top;
            }
        const int32_t left = epxi_bal_popc(full & ~X);
        const int last = sum + c >= top * left; /* ties: the union, all the rest */
        uint32_t U = 0;
        for (int32_t gi = 0; gi < k; gi++)
            if (!(X >> gi & 1) && (last || b->base[p->gl[gi]] == top)) U |= 1u << gi;
        const int32_t dn = epxi_bal_popc(U), lid = p->lv0 + levels;
        const int64_t a = last ? sum + c : top * dn;
        b->lv_num[lid] = a;
        b->lv_den[lid] = dn;
        for (int32_t gi = 0; gi < k; gi++)
            if (U >> gi & 1) b->g_level[p->gl[gi]] = lid;
        if (last) {
            b->f_level[i] = lid;
            int64_t r = c;
            for (int32_t q = 0; q < b->eg_n[e]; q++) {
                const size_t x = (size_t)i * (size_t)D + (size_t)q;
                const int32_t gi = b->g_loc[eg[q]];
                b->f_flow[x] = U >> gi & 1 ? a - dn * b->base[eg[q]] : 0;
                b->f_int[x] = epxi_bal_div(b->f_flow[x], dn);
                r -= b->f_int[x];
            }
            for (int32_t q = 0; q < b->eg_n[e] && r > 0; q++) {
                const size_t x = (size_t)i * (size_t)D + (size_t)q;
                if (epxi_bal_mod(b->f_flow[x], dn)) {
                    b->f_int[x] += 1;
                    r--;
                }
            }
        }
        X |= U;
        levels++;
    }
    return levels;
}

/* Component c by whichever solve its size takes, then its rounding; every
 * lane of the caller's warp calls this (nl of them; the CPU: 0 of 1). The
 * max-flows run on lane 0 alone. Sets c_levels[c] and c_rc[c]. */
EPXI_BAL void epxi_bal_solve_comp(epxi_bal *b, int32_t c, int lane, int nl) {
    if (b->c_soff[c] < 0) {
        if (lane == 0) epxi_bal_solve_part(b, c);
        EPXI_BAL_SYNCWARP();
        return;
    }
    epxi_bal_part p = epxi_bal_view(b, c);
    int32_t levels = 0;
    if (epxi_bal_one_expert(b, &p)) {
        if (lane == 0) levels = epxi_bal_one_levels(b, &p);
    } else {
        levels = epxi_bal_subset_levels(b, &p, c, lane, nl);
    }
    if (lane == 0) {
        b->c_levels[c] = levels;
        b->c_rc[c] = EPXI_BAL_OK; /* rounded level by level */
    }
    EPXI_BAL_SYNCWARP();
}

/* Before the components: every GPU and expert unfixed (a GPU in no
 * component keeps -1: load 0), by lane `lane` of nl (the CPU: 0 of 1). */
EPXI_BAL void epxi_bal_unfix(epxi_bal *b, int lane, int nl) {
    for (int32_t i = lane; i < b->M; i += nl) b->f_level[i] = -1;
    for (int32_t g = lane; g < b->G; g += nl) b->g_level[g] = -1;
}

/* The sequential part, once grouped and classified: every component's
 * levels and rounding, in order. Returns EPXI_BAL_OK or the first broken
 * invariant; b->levels counts the levels of all components. */
EPXI_BAL int epxi_bal_solve(epxi_bal *b) {
    epxi_bal_unfix(b, 0, 1);
    epxi_bal_components(b);
    int rc = EPXI_BAL_OK;
    b->levels = 0;
    for (int32_t c = 0; c < b->C && rc == EPXI_BAL_OK; c++) {
        epxi_bal_solve_comp(b, c, 0, 1);
        rc = b->c_rc[c];
        b->levels += b->c_levels[c];
    }
    return rc;
}

/* ---- outputs -------------------------------------------------------------------- */

/* Expert e's row of shares and replica counts (each optional) and its
 * slots' counts (optional; slots no expert lists stay as the caller set
 * them). A GPU's k replicas of the expert split its integer count n as
 * n / k, the first n % k columns (in list order) taking one more. Shares:
 * an expert without tokens splits evenly; a one-GPU expert gives each
 * replica 1 / k; a flexible one flow / (den c k). pad: also the zeros of
 * the columns past the expert's list; 0 when the caller zeroed whole rows
 * (the kernel does: its thread per expert, writing all W columns, 33 on
 * Kimi-K2.5's layout, made one uncoalesced store per column). */
EPXI_BAL void epxi_bal_write_expert(const epxi_bal *b, const int32_t *replicas,
                                    const int32_t *num_valid, int32_t e, double *shares,
                                    int64_t *rcounts, int64_t *slot_counts, int pad) {
    int32_t W = b->W, D = b->D, n = epxi_bal_nvalid(b, num_valid, e);
    int kind = epxi_bal_kind(b, e);
    int32_t i = b->fidx[e];
    const int32_t *row = replicas + (size_t)e * (size_t)W;
    const int32_t *gl = b->eg_gpu + (size_t)e * (size_t)D;
    const double even = n > 0 ? 1.0 / (double)n : 0.0; /* kind 0's share, one division */
    for (int32_t j = 0; j < (pad ? W : n); j++) {
        double share = 0.0;
        int64_t cnt = 0;
        int32_t s = j < n ? row[j] : -1;
        if (j < n && kind == 0) share = even;
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
                cnt = epxi_bal_div(x, mult) + (nth < epxi_bal_mod(x, mult));
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

/* Level id lid (a position in c_gpus) is in use when it is among its
 * component's first c_levels ids; 0 if not. */
EPXI_BAL int epxi_bal_level_used(const epxi_bal *b, int32_t lid) {
    if (lid < 0 || b->C == 0 || lid >= b->c_goff[b->C]) return 0;
    int32_t c = b->g_comp[b->c_gpus[lid]];
    return lid - b->c_goff[c] < b->c_levels[c];
}

/* 1 when level lid is in use and no used level before it has the same
 * load: the count of such ids is the number of distinct load levels (two
 * components at one load are one level of the whole). */
EPXI_BAL int epxi_bal_level_new(const epxi_bal *b, int32_t lid) {
    if (!epxi_bal_level_used(b, lid)) return 0;
    for (int32_t k = 0; k < lid; k++)
        if (epxi_bal_level_used(b, k) &&
            b->lv_num[k] * b->lv_den[lid] == b->lv_num[lid] * b->lv_den[k])
            return 0;
    return 1;
}

/* out[0..3] for the largest level a / d (any representation of it: the
 * fraction is reduced here) and n distinct levels. */
EPXI_BAL void epxi_bal_summary_of(int64_t a, int64_t d, int64_t n, int64_t out[4]) {
    int64_t x = a, y = d;
    while (y) {
        int64_t t = epxi_bal_mod(x, y);
        x = y;
        y = t;
    }
    out[0] = epxi_bal_div(a, x);
    out[1] = epxi_bal_div(d, x);
    out[2] = epxi_bal_div(a + d - 1, d);
    out[3] = n;
}

/* The optimum as a reduced fraction, its ceiling and the number of
 * distinct levels: out[0..3] = num, den, ceil, levels. distinct < 0: count
 * them here (the kernel passes the count it made in parallel). */
EPXI_BAL void epxi_bal_summary(const epxi_bal *b, int64_t distinct, int64_t out[4]) {
    int64_t a = 0, d = 1, n = 0;
    int32_t L = b->C > 0 ? b->c_goff[b->C] : 0;
    for (int32_t lid = 0; lid < L; lid++) {
        if (!epxi_bal_level_used(b, lid)) continue;
        if (distinct < 0) n += epxi_bal_level_new(b, lid);
        if (b->lv_num[lid] * d > a * b->lv_den[lid]) {
            a = b->lv_num[lid];
            d = b->lv_den[lid];
        }
    }
    epxi_bal_summary_of(a, d, distinct < 0 ? n : distinct, out);
}

#endif /* EPX_DISPATCH_BALANCED_CORE_H */
