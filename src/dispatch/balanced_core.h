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
 * (epxi_bal_solve_part: its max-flows sequential, a level's loops over the
 * component's experts and GPUs shared by a warp's lanes in the kernel).
 *
 * Max-flow: a level's starts from a greedy flow (epxi_bal_greedy), then
 * Dinic's algorithm (BFS level graph, then augmenting paths found by an
 * iterative DFS with current-arc pointers, each path from s again), edges
 * tried in the reverse order of their addition. Deterministic.
 *
 * The files, each including the one it builds on:
 *   balanced_core.h     the workspace, its sizing, per-expert grouping, the
 *                       components and a component's view (this file);
 *   balanced_flows.h    a component by max-flows: levels, then rounding;
 *   balanced_subsets.h  a component by its subsets (or in closed form);
 *   balanced_solve.h    every component by its solve, then the outputs and
 *                       the summary: what balanced.c and the kernel include.
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

/* The max-flow solve's entry points, kept out of their callers on the host:
 * GCC inlined them into the CPU solve's one loop, and each change to the
 * max-flow code moved the subset solve beside it by 5-15 % (register and
 * code layout); on the GPU they are EPXI_BAL like the rest. */
#if defined(__CUDACC__)
#define EPXI_BAL_COLD EPXI_BAL
#elif defined(__GNUC__)
#define EPXI_BAL_COLD __attribute__((noinline)) static
#else
#define EPXI_BAL_COLD static
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
    EPXI_BAL_TOO_MANY = 5,   /* more flexible experts than P - E (a slot listed twice) */
    EPXI_BAL_SCALE = 6       /* a level's flows not k times those at its reduced lambda */
};

/* The workspace: pointers into one block carved by epxi_bal_carve (host
 * memory for the CPU, device memory for the kernel) and the scalars. */
typedef struct epxi_bal {
    int32_t E, W, P, G, per, D, maxM; /* D = min(W, G); maxM = min(E, P - E) */
    int32_t max_nodes, max_edges;     /* max_edges counts both directions    */
    int32_t M, C, levels;             /* per solve: flexible experts, components, levels */
    int32_t sub_max;                  /* components of 2..sub_max GPUs: the subset solve */
    int32_t closed;                   /* 1: one-expert components in closed form */
    int32_t dense;                    /* 1: max-flow levels start dense (epxi_bal_start) */
    int64_t sub_size;                 /* entries of sub_d / sub_s: every such table fits */
    int64_t hot;                      /* bytes before eg_mult, rc: what the solve reads */
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
    int32_t *c_say;                 /* [G] at a flows component's lv0: lane 0's word to its lanes */
    int32_t *f_mask;                /* [maxM] a flexible expert's GPUs, component bits */
    int32_t *f_frac;                /* [maxM] its GPUs with a fractional flow (rounding) */
    int64_t *f_units;               /* [maxM] its tokens left once flows round down */
    int64_t *g_lo;                  /* [G] rounding: units a GPU must still take */
    int64_t *sub_d, *sub_s, *sub_l; /* [sub_size] per subset: load inside, slacks */
    /* the flow graphs, each component's at its own offsets (epxi_bal_view) */
    int32_t *head, *lvl, *iter, *queue, *path; /* [max_nodes] */
    int32_t *sink;                             /* [max_nodes] a node's edge to t, or -1 */
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

/* EPX_BALANCED_DENSE_START=0 starts each max-flow level's ratio search from
 * the whole unfixed part instead of the densest GPU when that is denser
 * (epxi_bal_start: the same results, more max-flows; the switch is there
 * to compare them). Returns 0, or -1 with *bad = the value when it is not
 * 0 or 1. Host only. */
static inline int epxi_bal_dense_from_env(epxi_bal *b, const char **bad) {
    int on = b->dense;
    if (!epxi_env_switch("EPX_BALANCED_DENSE_START", &on, bad)) return -1;
    b->dense = on;
    return 0;
}
#define EPXI_BAL_DENSE_HELP                                                                        \
    "must be 0 (start from the whole part) or 1 (from the densest GPU when denser, the default)"

/* The solve knobs above, read when a balancer is created (CPU and GPU
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
    if (epxi_bal_dense_from_env(b, bad) != 0) {
        *name = "EPX_BALANCED_DENSE_START";
        *help = EPXI_BAL_DENSE_HELP;
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
    b->dense = 1;
}

/* Carve the arrays out of mem (NULL: only measure); returns the bytes and
 * sets b->hot. */
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
    EPXI_BAL_ARR(c_say, int32_t, G);
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
    EPXI_BAL_ARR(sink, int32_t, N);
    EPXI_BAL_ARR(mark, uint8_t, N);
    EPXI_BAL_ARR(next, int32_t, X);
    EPXI_BAL_ARR(to, int32_t, X);
    EPXI_BAL_ARR(cap, int64_t, X);
    /* The tail: read only by the per-expert phases (grouping, the outputs,
     * the ranking), all threads at once; the kernel keeps it in device
     * memory when the whole workspace does not fit in shared memory (at
     * W = 33 these two are 99 KB of DeepSeek-V3's 277). */
    b->hot = (int64_t)((off + 15) & ~(size_t)15);
    EPXI_BAL_ARR(eg_mult, int32_t, ED);
    EPXI_BAL_ARR(rc, int64_t, E * (size_t)b->W);
#undef EPXI_BAL_ARR
    return (off + 15) & ~(size_t)15;
}

/* The set bits of x (a GPU set as a mask). */
EPXI_BAL int32_t epxi_bal_popc(uint32_t x) {
#ifdef __CUDA_ARCH__
    return __popc(x);
#else
    int32_t n = 0;
    for (; x; x &= x - 1) n++;
    return n;
#endif
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

/* ---- a component's view ------------------------------------------------------- */

/* A component's view: its experts (indices into flex) and GPUs, the level
 * ids it owns, and its graph's nodes and edges, carved from the shared
 * arrays at offsets no other component uses. Nodes: 0 = s (S' while
 * rounding), 1 = t (T'), 2 = s and t merged while rounding, 3 unused, then
 * its experts, then its GPUs. */
typedef struct epxi_bal_part {
    int32_t nf, ng, lv0;
    const int32_t *fl, *gl;
    int32_t n, m, max_edges;
    int32_t *head, *lvl, *iter, *queue, *path, *sink;
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
    p.sink = b->sink + node0;
    p.mark = b->mark + node0;
    p.next = b->next + edge0;
    p.to = b->to + edge0;
    p.cap = b->cap + edge0;
    return p;
}

#endif /* EPX_DISPATCH_BALANCED_CORE_H */
