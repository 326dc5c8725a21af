/*
 * epx_algo.h - the pieces of epx's own placement algorithm (epx_*.c), shared
 * between its files and its tests. Internal: nothing here is exported.
 *
 *   epx_common.c    a stable index sort, GPU loads of a layer.
 *   epx_search.c    the per-layer engine: replica counts and packing chosen
 *                   together by local search under node-locality rules.
 *   epx_shares.c    per-replica dispatch weights for a fixed map (the split
 *                   of each expert's load that minimises the max GPU load).
 *   epx_estimate.c  the load a plan is made for, from the [S][L][E] windows.
 *   epx_plan.c      epxi_plan_epx: the layers, the modes, the selection
 *                   (DeepSeek's placement, deepseek.c, is the baseline).
 *   epx_crossnode.c epx_plan_cross_node_share, the traffic a plan implies.
 */
#ifndef EPX_ALGO_H
#define EPX_ALGO_H

#include "internal.h"

/* ---- helpers ------------------------------------------------------------ */

/* Sort idx[0..n) by key[idx[i]] descending; equal keys keep their order in
 * idx (stable), so indices given ascending break ties lowest first.
 * tmp: scratch of n entries. */
EPXI_HIDDEN void epxi_sort_desc(const double *key, int32_t *idx, int32_t n, int32_t *tmp);

/* GPU loads of one layer: epxi_layer_gpu_loads (src/core/internal.h), the
 * one definition the metrics use too. */

/* ---- the search engine (epx_search.c) --------------------------------------- */

typedef struct epxi_search epxi_search;

/* Scratch for one layer of E experts, P slots, G GPUs on N nodes. */
EPXI_HIDDEN epx_status epxi_search_create(int32_t E, int32_t P, int32_t G, int32_t N,
                                          epxi_search **out, epx_error *err);
EPXI_HIDDEN void epxi_search_destroy(epxi_search *s);

/*
 * Start a layer. w [E]: the load planned for (kept by pointer until the next
 * start). home [E]: the node each expert's replicas belong to, or NULL for
 * no node rule. budget: how many replicas may sit off their home node (0 =
 * strict); ignored without home.
 */
EPXI_HIDDEN void epxi_search_begin(epxi_search *s, const double *w, const int32_t *home,
                                   int32_t budget);

/* Allow or forbid re-count moves (allowed after begin; forbidding them is
 * only for measuring what they bring). */
EPXI_HIDDEN void epxi_search_allow_recount(epxi_search *s, bool on);

/* Let improve stop as soon as the max GPU load is <= target (after begin;
 * the default, -inf, never stops early). */
EPXI_HIDDEN void epxi_search_set_target(epxi_search *s, double target);

/* Add a constraint: from now on no move may lift a GPU's load under w2 [E]
 * (kept by pointer) above cap2. The current solution must satisfy it. Used
 * to plan for an estimate while keeping the summed load at least as
 * balanced as DeepSeek's. */
EPXI_HIDDEN void epxi_search_constrain(epxi_search *s, const double *w2, double cap2);

/* Initial solution: replica counts by largest load per replica (within each
 * home node), replicas packed largest first onto the least loaded allowed
 * GPU that has a free slot and no replica of the same expert yet. */
EPXI_HIDDEN void epxi_search_init_lpt(epxi_search *s);

/* Keep the current solution but search it under a new load w [E] (and
 * home / budget): what begin + init_map would do for the same map, without
 * rebuilding the replica lists. */
EPXI_HIDDEN void epxi_search_retarget(epxi_search *s, const double *w, const int32_t *home,
                                      int32_t budget);

/* Initial solution from a map [P] (it must respect home with 0 foreign
 * replicas, or home must be NULL). */
EPXI_HIDDEN void epxi_search_init_map(epxi_search *s, const int32_t *map);

/*
 * Improve the max GPU load by local search, at most max_iters accepted
 * moves: swaps of two replicas between the most loaded GPU and another,
 * and re-counts (one slot changes expert: a hot expert on the most loaded
 * GPU gains a replica, a multi-replica one loses one). No accepted move
 * raises the max GPU load or creates two replicas of one expert on a GPU.
 * Returns the number of moves made.
 */
EPXI_HIDDEN int64_t epxi_search_improve(epxi_search *s, int64_t max_iters);

/* Remove duplicate replicas (two of one expert on one GPU) by the swap or
 * re-count that leaves the two GPUs lightest; with keep_max, only where
 * that does not raise the max GPU load (before a search, any such move is
 * fine: the search rebalances). Returns how many remain. */
EPXI_HIDDEN int32_t epxi_search_fix_duplicates(epxi_search *s, bool keep_max);

/* The max GPU load of the current solution (even split), and the same
 * under the constraint load. After begin/init, improve and
 * fix_duplicates the loads are exact: summed in slot order as
 * epxi_layer_gpu_loads (core) does, so the values are bit for bit its own. */
EPXI_HIDDEN double epxi_search_max_load(const epxi_search *s);
EPXI_HIDDEN double epxi_search_max_load2(const epxi_search *s);

/* Write the map [P]. */
EPXI_HIDDEN void epxi_search_export(const epxi_search *s, int32_t *map);

/* ---- group to node assignment (epx_search.c) ---------------------------------- */

/*
 * Assign ng groups of E/ng experts to N nodes for node-local placement:
 * DeepSeek's balanced packing of group loads, then swaps and moves of whole
 * groups between the most loaded node and another while that lowers the
 * max node load and every node keeps at most node_slots experts.
 * home: [E] out, the node of each expert. scratch: [2 * ng + N] ints,
 * dscratch: [ng + N] doubles.
 */
EPXI_HIDDEN void epxi_groups_to_nodes(const double *w, int32_t E, int32_t ng, int32_t N,
                                      int32_t node_slots, int32_t *home, int32_t *scratch,
                                      double *dscratch);

/* ---- replica shares (epx_shares.c) ------------------------------------------ */

typedef struct epxi_shares_ws epxi_shares_ws;

EPXI_HIDDEN epx_status epxi_shares_ws_create(int32_t E, int32_t P, int32_t G, epxi_shares_ws **out,
                                             epx_error *err);
EPXI_HIDDEN void epxi_shares_ws_destroy(epxi_shares_ws *ws);

/*
 * Per-slot shares for map [P] under load w [E]: the split of each expert's
 * load over its GPUs that minimises the sum of squared GPU loads, found by
 * water-filling one expert at a time (block coordinate descent). On this
 * feasible set that point also minimises the max GPU load; every step keeps
 * the max from rising, so the result is never worse than the even split.
 * Replicas of one expert on one GPU share that GPU's part evenly; experts
 * with no load split evenly. share: [P] out. Returns the max GPU load.
 */
EPXI_HIDDEN double epxi_shares_compute(epxi_shares_ws *ws, const int32_t *map, const double *w,
                                       int32_t E, int32_t P, int32_t G, int32_t max_sweeps,
                                       double *share);

/* ---- estimates (epx_estimate.c) ---------------------------------------------- */

/* Default parameters of the estimates. */
#define EPXI_RECENCY_HALF_LIFE 0.5 /* windows */
#define EPXI_MEAN_STD_Z 1.0

/*
 * The load to plan layer `layer` for, from windows [0, S) of counts.
 * kind: SUM, RECENCY (param = half-life in windows), MEAN_STD (param = z);
 * MINMAX and DEFAULT are resolved by the caller. out: [E].
 */
EPXI_HIDDEN void epxi_estimate_layer(const epx_counts *counts, int32_t layer, epx_estimate kind,
                                     double param, double *out);

/* ---- the whole plan (epx_plan.c) ------------------------------------------------- */

/* The levers of epx's algorithm, each of which can be switched off so its
 * effect can be measured (bench/plan_quality.c, tests). epxi_plan_epx runs
 * with EPXI_KNOBS_DEFAULT. */
typedef struct epxi_knobs {
    bool search;        /* local search after the greedy start */
    bool recount;       /* ... including moves that change replica counts */
    bool shares;        /* weighted replica shares (else an even split) */
    bool baseline;      /* compare with DeepSeek per layer, keep the better */
    bool phase1;        /* with an estimate: search the summed load first (else
                           the estimate's search starts from DeepSeek's map) */
    int32_t start;      /* 0: greedy (LPT) start, 1: DeepSeek's map, 2: both,
                           3: greedy when node-local, else DeepSeek's map */
    int64_t max_iters;  /* accepted moves per layer, first search; < 0: automatic */
    int64_t max_iters2; /* ... for the estimate (phase 2); < 0: automatic */
    int32_t max_sweeps; /* water-filling sweeps for the shares */
    double budget;      /* relaxed mode default share of redundant slots */
    int32_t track;      /* default estimate: 0 plan phase 2 under the summed cap;
                           1 plan for the estimate itself (no summed cap) when
                           the history says the load moves; 2 always; 3 only
                           on a shift, else phase 2 with the chosen half-life */
    double track_h;     /* the estimate's half-life; <= 0: chosen from the
                           history (epxi_choose_half_life) */
    double moved_h;     /* track 1: the load moved when the chosen half-life
                           is below this */
    double min_h;       /* the chosen half-life is at least this, except on a
                           shift (against fitting the newest window's noise) */
} epxi_knobs;
#define EPXI_DEFAULT_CROSS_NODE_BUDGET 0.5
#define EPXI_KNOBS_DEFAULT                                                                         \
    {                                                                                              \
        true, true, true, true, true, 3, -1, -1, 16, EPXI_DEFAULT_CROSS_NODE_BUDGET, 1, 0.0, 4.0,  \
            0.0                                                                                    \
    }

/* The recency half-life (windows) that best predicts each of the last few
 * windows from the ones before it, pooled over the layers; HUGE_VAL when the
 * plain sum predicts best (the history looks stationary). */
EPXI_HIDDEN double epxi_choose_half_life(const epx_counts *counts, bool *shifted);
#define EPXI_SHIFT_RATIO 2.5 /* newest window's error / the earlier ones' */
#define EPXI_REFIT_SWEEPS 16 /* water-filling sweeps of epx_plan_refit_shares, as the planner's */

/* Per-run figures, for benchmarks and tests. */
typedef struct epxi_plan_info {
    int32_t layers_kept_baseline; /* layers where DeepSeek's map was kept */
    int32_t layers_fallback_sum;  /* layers planned on the summed load instead */
    int32_t duplicates_left;      /* replicas sharing a GPU with their expert */
    int64_t moves;                /* accepted local-search moves, all layers */
    epx_node_local node_local;    /* the mode that ran (DEFAULT resolved) */
    epx_estimate estimate;        /* the estimate that ran (DEFAULT resolved) */
    int32_t budget;               /* foreign replicas allowed per layer */
    double half_life;             /* default estimate: the half-life chosen from the
                                     history (HUGE_VAL: the sum), 0 if none was */
    bool tracked;                 /* planned for the estimate alone, without the summed cap */
} epxi_plan_info;

/* epxi_plan_epx with explicit knobs; info may be NULL. */
EPXI_HIDDEN epx_status epxi_plan_epx_knobs(const epx_counts *counts, const epx_shape *shape,
                                           const epx_plan_opts *opts, const epxi_knobs *knobs,
                                           int32_t *map_out, double *share_out,
                                           epxi_plan_info *info, epx_error *err);

#endif /* EPX_ALGO_H */
