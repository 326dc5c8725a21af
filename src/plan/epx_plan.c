/*
 * epx_plan.c - epx's own placement (`--algorithm epx`, the default), layer
 * by layer:
 *
 *  1. the baseline: DeepSeek's placement of the summed load under the same
 *     constraints (hierarchical for the node-local modes, global for off),
 *     and its max GPU load U on that load;
 *  2. node locality: with nodes > 1 and expert groups that divide over
 *     them, each group gets a home node (DeepSeek's group packing, then
 *     improved by swapping groups); `strict` keeps every replica at home,
 *     `relaxed` lets a budget of replicas of hot experts sit elsewhere;
 *     `off` places globally;
 *  3. phase 1 (epx_search.c): greedy counts and packing without duplicate
 *     replicas, then local search on the summed load's max GPU load. If it
 *     does not get to U, the search runs again from DeepSeek's own map,
 *     which cannot end worse; DeepSeek's map is the last resort. With an
 *     estimate to follow, phase 1 stops as soon as it reaches U;
 *  4. phase 2, when the counts have several windows: the search continues
 *     on the estimate of the next window (epx_estimate.c; MINMAX picks
 *     among estimates by the sum of per-window maxima), with a constraint:
 *     no GPU's summed load may exceed U. So the plan serves the next window
 *     better and stays at least as balanced as DeepSeek's in-sample;
 *  5. replica shares for the chosen map (epx_shares.c), fitted to the
 *     estimate and pulled back toward the even split just enough that the
 *     summed load's max stays <= U.
 * Every step is deterministic: the same input gives the same plan.
 */
#include "epx_algo.h"
#include "plan_internal.h"

#include <math.h>
#include <string.h>

/* The estimate EPX_ESTIMATE_DEFAULT resolves to; chosen by back-testing on
 * shared/traces (docs/PLACEMENT.md has the figures). */
#define EPXI_ESTIMATE_DEFAULT EPX_ESTIMATE_RECENCY

typedef struct plan_ws {
    epxi_deepseek *ds; /* DeepSeek under the same constraints */
    float *load32;     /* [L][E] the summed load in float32, as DeepSeek's modes */
    float *est32;      /* [E] an estimate in float32 */
    epxi_search *search;
    epxi_shares_ws *shares;
    double *sum, *est, *alt;              /* [E] */
    double *gload, *gload2;               /* [G] */
    int32_t *cnt;                         /* [E] */
    int32_t *home, *home2;                /* [E] */
    int32_t *best_home;                   /* [E] the homes of w->best */
    double *even_share, *fit_share;       /* [P] */
    bool search_holds_best;               /* the search state's map is w->best */
    double last_max;                      /* max GPU load of search_once's result, exact */
    int32_t *ds_map, *cand, *best, *pick; /* [P] */
    int32_t *gscratch;                    /* [2 E + N] */
    double *gdscratch;                    /* [E + N] */
} plan_ws;

static void ws_free(plan_ws *w) {
    epxi_deepseek_destroy(w->ds);
    free(w->load32), free(w->est32);
    epxi_search_destroy(w->search);
    epxi_shares_ws_destroy(w->shares);
    free(w->sum), free(w->est), free(w->alt), free(w->gload), free(w->gload2), free(w->cnt);
    free(w->home), free(w->home2), free(w->best_home), free(w->even_share), free(w->fit_share),
        free(w->ds_map), free(w->cand), free(w->best), free(w->pick);
    free(w->gscratch), free(w->gdscratch);
}

static epx_status ws_alloc(plan_ws *w, const epx_counts *counts, const epx_shape *sh,
                           int32_t ds_groups, int32_t ds_nodes, bool ds_hier, epx_error *err) {
    const int32_t E = sh->num_logical_experts, P = sh->num_physical_experts;
    const int32_t G = sh->num_gpus, N = sh->num_nodes;
    memset(w, 0, sizeof *w);
    size_t e = (size_t)E, p = (size_t)P, g = (size_t)G;
    /* The baseline's groups and nodes are derived here, not given by the
     * caller, so they are checked here (the shape was, at the entry). */
    epx_status st = epxi_deepseek_check(E, P, ds_groups, ds_nodes, G, ds_hier, err);
    if (st == EPX_OK) st = epxi_deepseek_create(E, P, ds_groups, ds_nodes, G, ds_hier, &w->ds, err);
    if (st == EPX_OK) {
        w->load32 = epxi_calloc((size_t)sh->num_layers * e, sizeof(float), "float32 load", err);
        w->est32 = epxi_calloc(e, sizeof(float), "float32 estimate", err);
        if (w->load32 == NULL || w->est32 == NULL) return EPX_ERR_NOMEM;
        st = epxi_plan_load_f32(counts, w->load32, err);
    }
    if (st == EPX_OK) st = epxi_search_create(E, P, G, N, &w->search, err);
    if (st == EPX_OK) st = epxi_shares_ws_create(E, P, G, &w->shares, err);
    if (st != EPX_OK) return st;
    w->sum = epxi_calloc(e, sizeof(double), "planning load", err);
    w->est = epxi_calloc(e, sizeof(double), "planning estimate", err);
    w->alt = epxi_calloc(e, sizeof(double), "planning estimate", err);
    w->gload = epxi_calloc(g, sizeof(double), "GPU loads", err);
    w->gload2 = epxi_calloc(g, sizeof(double), "GPU loads", err);
    w->cnt = epxi_calloc(e, sizeof(int32_t), "replica counts", err);
    w->home = epxi_calloc(e, sizeof(int32_t), "home nodes", err);
    w->home2 = epxi_calloc(e, sizeof(int32_t), "home nodes", err);
    w->best_home = epxi_calloc(e, sizeof(int32_t), "home nodes", err);
    w->even_share = epxi_calloc(p, sizeof(double), "replica shares", err);
    w->fit_share = epxi_calloc(p, sizeof(double), "replica shares", err);
    w->ds_map = epxi_calloc(p, sizeof(int32_t), "baseline map", err);
    w->cand = epxi_calloc(p, sizeof(int32_t), "candidate map", err);
    w->best = epxi_calloc(p, sizeof(int32_t), "candidate map", err);
    w->pick = epxi_calloc(p, sizeof(int32_t), "candidate map", err);
    w->gscratch = epxi_calloc(2 * e + (size_t)N, sizeof(int32_t), "group scratch", err);
    w->gdscratch = epxi_calloc(e + (size_t)N, sizeof(double), "group scratch", err);
    if (!w->sum || !w->est || !w->alt || !w->gload || !w->gload2 || !w->cnt || !w->home ||
        !w->home2 || !w->best_home || !w->even_share || !w->fit_share || !w->ds_map || !w->cand ||
        !w->best || !w->pick || !w->gscratch || !w->gdscratch)
        return EPX_ERR_NOMEM;
    return EPX_OK;
}

typedef struct layer_cfg {
    const epx_shape *shape;
    const epxi_knobs *k;
    bool node_local; /* home nodes in use */
    int32_t ng;      /* expert groups */
    int32_t budget;  /* foreign replicas allowed */
    int64_t iters;   /* move budget per search */
    int64_t iters2;  /* ... for the estimate (phase 2) */
    double target;   /* phase 1 may stop at this max (DeepSeek's, when an
                         estimate follows: more is not needed); -inf = no */
} layer_cfg;

static double even_max(plan_ws *w, const layer_cfg *c, const int32_t *map, const double *load) {
    const epx_shape *s = c->shape;
    return epxi_layer_gpu_loads(map, load, NULL, NULL, NULL, s->num_logical_experts,
                                s->num_physical_experts, s->num_gpus, w->cnt, w->gload);
}

/* Run the search for load `load` and write its map to `out`; start 0 is the
 * greedy start, 1 the given map `from` with its duplicates removed at any
 * cost to the max first, 2 the same keeping its max (so the result cannot
 * end above it). home may be NULL. */
static int64_t search_once(plan_ws *w, const layer_cfg *c, const double *load, const int32_t *home,
                           int32_t start, const int32_t *from, int32_t *out, int32_t *dups) {
    epxi_search *s = w->search;
    epxi_search_begin(s, load, home, c->budget);
    epxi_search_allow_recount(s, c->k->recount);
    epxi_search_set_target(s, c->target);
    if (start >= 1)
        epxi_search_init_map(s, from);
    else
        epxi_search_init_lpt(s);
    int64_t moves = 0;
    if (c->k->search) {
        /* Duplicates first; from the greedy start at any cost to the max
         * (the search that follows never creates one, and rebalances). */
        (void)epxi_search_fix_duplicates(s, start == 2);
        moves = epxi_search_improve(s, c->iters);
    }
    *dups = epxi_search_fix_duplicates(s, true);
    epxi_search_export(s, out);
    w->last_max = epxi_search_max_load(s); /* exact: see epxi_search_max_load */
    return moves;
}

/* The home node of each expert in a node-local map (where its first
 * replica is). */
static void homes_of_map(const layer_cfg *c, const int32_t *map, int32_t *home) {
    const int32_t E = c->shape->num_logical_experts, P = c->shape->num_physical_experts;
    const int32_t ppn = P / c->shape->num_nodes;
    for (int32_t e = 0; e < E; e++) home[e] = -1;
    for (int32_t p = 0; p < P; p++)
        if (home[map[p]] < 0) home[map[p]] = p / ppn;
}

/* Plan one layer for load `load` from scratch (the knobs' starts); the
 * result goes to w->best, its home nodes to w->best_home, its max GPU load
 * (even split, on `load`) to *best_max. Returns the number of moves. */
static int64_t plan_for(plan_ws *w, const layer_cfg *c, const double *load, int32_t *dups,
                        double *best_max) {
    const epx_shape *s = c->shape;
    const int32_t E = s->num_logical_experts, P = s->num_physical_experts;
    int64_t moves = 0;
    if (c->node_local)
        epxi_groups_to_nodes(load, E, c->ng, s->num_nodes, P / s->num_nodes, w->home, w->gscratch,
                             w->gdscratch);
    *best_max = -1.0;
    /* Auto: node-local plans start greedy from epx's own home nodes; global
     * ones from DeepSeek's map, which the baseline computes anyway. */
    const int32_t want = c->k->start == 3 ? (c->node_local ? 0 : 1) : c->k->start;
    for (int32_t start = 0; start < 2; start++) {
        if (want != 2 && start != want) continue;
        const int32_t *home = c->node_local ? w->home : NULL;
        if (start == 1) {
            /* DeepSeek's map for this load (the baseline's, for the summed
             * load), and the homes it implies. */
            if (load == w->sum) {
                memcpy(w->cand, w->ds_map, (size_t)P * sizeof *w->cand);
            } else {
                for (int32_t e = 0; e < E; e++) w->est32[e] = (float)load[e];
                epxi_deepseek_layer(w->ds, w->est32, w->cand, NULL, NULL);
            }
            if (c->node_local) {
                homes_of_map(c, w->cand, w->home2);
                home = w->home2;
            }
        }
        int32_t d = 0;
        moves += search_once(w, c, load, home, start, w->cand, w->cand, &d);
        double m = w->last_max;
        w->search_holds_best = false;
        if (*best_max < 0.0 || m < *best_max) {
            *best_max = m;
            *dups = d;
            memcpy(w->best, w->cand, (size_t)P * sizeof *w->best);
            if (home) memcpy(w->best_home, home, (size_t)E * sizeof *home);
            w->search_holds_best = true;
        }
    }
    return moves;
}

/* Phase 2: from w->best (homes w->best_home), improve the max GPU load
 * under `est` while no GPU's summed load exceeds cap (DeepSeek's max).
 * The result replaces w->best only if an exact check confirms the cap. */
static int64_t refine_for(plan_ws *w, const layer_cfg *c, const double *est, double cap,
                          int32_t *dups) {
    const int32_t P = c->shape->num_physical_experts;
    epxi_search *s = w->search;
    const int32_t *home = c->node_local ? w->best_home : NULL;
    if (w->search_holds_best) {
        epxi_search_retarget(s, est, home, c->budget); /* same map: keep the lists */
    } else {
        epxi_search_begin(s, est, home, c->budget);
        epxi_search_init_map(s, w->best);
    }
    epxi_search_allow_recount(s, c->k->recount);
    epxi_search_constrain(s, w->sum, cap);
    const double start_max = epxi_search_max_load(s); /* exact, the map w->best */
    /* DeepSeek's map may have duplicates: remove them even where that lifts
     * the estimate's max (the summed-load cap still holds; the search then
     * rebalances, and the result is kept only if no worse than the start). */
    (void)epxi_search_fix_duplicates(s, false);
    int64_t moves = epxi_search_improve(s, c->iters2);
    int32_t d = epxi_search_fix_duplicates(s, true);
    epxi_search_export(s, w->cand);
    if (epxi_search_max_load2(s) <= cap && epxi_search_max_load(s) <= start_max) {
        memcpy(w->best, w->cand, (size_t)P * sizeof *w->best);
        *dups = d;
        w->search_holds_best = true;
    } else {
        w->search_holds_best = false;
    }
    return moves;
}

/* Sum over the windows of each window's max GPU load (even split). */
static double sum_of_maxima(plan_ws *w, const layer_cfg *c, const epx_counts *counts, int32_t layer,
                            const int32_t *map) {
    double t = 0.0;
    for (int32_t s = 0; s < counts->num_windows; s++)
        t += even_max(w, c, map, epx_counts_row(counts, s, layer));
    return t;
}

/* Shares for `map` fitted to `est`, pulled back toward the even split just
 * enough that the summed load's max stays <= cap. Loads are linear in the
 * shares, so each GPU's load along the segment even -> fitted is linear and
 * the max convex: the largest admissible step is found by bisection, and
 * every point of the segment is at least as good as even under `est`. */
static void shares_for(plan_ws *w, const layer_cfg *c, const int32_t *map, const double *est,
                       double cap, double *share) {
    const epx_shape *s = c->shape;
    const int32_t E = s->num_logical_experts, P = s->num_physical_experts, G = s->num_gpus;
    const double even = epxi_layer_gpu_loads(map, est, NULL, NULL, NULL, E, P, G, w->cnt, w->gload);
    for (int32_t p = 0; p < P; p++) w->even_share[p] = 1.0 / w->cnt[map[p]];
    memcpy(share, w->even_share, (size_t)P * sizeof *share);
    if (!c->k->shares) return;
    double fit = epxi_shares_compute(w->shares, map, est, E, P, G, c->k->max_sweeps, w->fit_share);
    if (!(fit < even)) return;
    /* Each GPU's summed load is linear along the segment: L_g(t) = e_g +
     * t (f_g - e_g); the largest t in [0, 1] with every L_g(t) <= cap is a
     * minimum over GPUs (e_g <= cap holds: the map itself meets the cap). */
    double *fl = w->gload2;
    (void)epxi_layer_gpu_loads(map, w->sum, w->even_share, NULL, NULL, 0, P, G, NULL, w->gload);
    (void)epxi_layer_gpu_loads(map, w->sum, w->fit_share, NULL, NULL, 0, P, G, NULL, fl);
    double hi = 1.0;
    for (int32_t g = 0; g < G; g++)
        if (fl[g] > cap && fl[g] > w->gload[g]) {
            double t = (cap - w->gload[g]) / (fl[g] - w->gload[g]);
            t = t > 0.0 ? t * (1.0 - 1e-12) : 0.0; /* a hair inside, against rounding */
            if (t < hi) hi = t;
        }
    for (int32_t p = 0; p < P; p++)
        share[p] = w->even_share[p] + hi * (w->fit_share[p] - w->even_share[p]);
    /* Shares of one expert sum to 1 at both ends, hence along the segment.
     * Rounding aside the cap holds; check it, and keep the even split if
     * rounding ever tipped a GPU over it. */
    if (hi < 1.0 &&
        epxi_layer_gpu_loads(map, w->sum, share, NULL, NULL, 0, P, G, NULL, w->gload) > cap)
        memcpy(share, w->even_share, (size_t)P * sizeof *share);
}

/* Every load a layer is planned on must be finite: entries are checked at
 * the entry point, but a sum over many windows of huge counts can still
 * overflow. Such a load is an error naming layer and expert, never a plan. */
static epx_status check_finite(const double *x, int32_t E, int32_t layer, const char *what,
                               epx_error *err) {
    for (int32_t e = 0; e < E; e++)
        if (!isfinite(x[e]))
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "the %s of layer %d, expert %d is %g: the counts are too large to "
                             "sum in double precision; scale them down",
                             what, layer, e, x[e]);
    return EPX_OK;
}

static epx_status resolve(const epx_counts *counts, const epx_shape *shape,
                          const epx_plan_opts *opts, const epxi_knobs *k, layer_cfg *c,
                          epx_node_local *mode_out, epx_estimate *est_out, epx_error *err) {
    const int32_t E = shape->num_logical_experts, P = shape->num_physical_experts;
    const int32_t N = shape->num_nodes;
    if (counts->num_layers != shape->num_layers || counts->num_experts != E)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "counts are [%d][%d] (layers x experts) but the shape has %d layers "
                         "of %d experts: pass counts recorded for this model",
                         counts->num_layers, counts->num_experts, shape->num_layers, E);
    if (opts->current != NULL || opts->failed_gpus != NULL)
        return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                         "epx's algorithm does not take a current layout or failed GPUs yet: "
                         "leave opts.current and opts.failed_gpus NULL");
    const int32_t ng = opts->num_groups > 0 ? opts->num_groups : 1;
    if (E % ng != 0)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "num_groups (%d) does not divide the %d experts: use a divisor of %d", ng,
                         E, E);
    const bool groups_fit = N > 1 && ng % N == 0;
    epx_node_local mode = opts->node_local;
    if (mode == EPX_NODE_LOCAL_DEFAULT)
        mode = groups_fit ? EPX_NODE_LOCAL_RELAXED : EPX_NODE_LOCAL_OFF;
    if ((mode == EPX_NODE_LOCAL_STRICT || mode == EPX_NODE_LOCAL_RELAXED) && N > 1 && !groups_fit)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "node-local %s needs expert groups that divide evenly over the nodes, "
                         "but num_groups (%d) %% num_nodes (%d) != 0: pass a group count that "
                         "is a multiple of %d, or node-local off",
                         mode == EPX_NODE_LOCAL_STRICT ? "strict" : "relaxed", ng, N, N);
    if (mode != EPX_NODE_LOCAL_STRICT && mode != EPX_NODE_LOCAL_RELAXED &&
        mode != EPX_NODE_LOCAL_OFF)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "node_local (%d) is not a known mode",
                         (int)mode);
    double frac = opts->cross_node_budget < 0.0 ? k->budget : opts->cross_node_budget;
    if (!(frac >= 0.0 && frac <= 1.0))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "cross_node_budget (%g) is a share of the redundant slots: use a "
                         "value in [0, 1], or < 0 for the default (%g)",
                         opts->cross_node_budget, k->budget);
    epx_estimate est =
        opts->estimate == EPX_ESTIMATE_DEFAULT ? EPXI_ESTIMATE_DEFAULT : opts->estimate;
    if (est != EPX_ESTIMATE_SUM && est != EPX_ESTIMATE_RECENCY && est != EPX_ESTIMATE_MEAN_STD &&
        est != EPX_ESTIMATE_MINMAX)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "estimate (%d) is not a known estimate",
                         (int)est);
    c->shape = shape;
    c->k = k;
    c->ng = ng;
    c->node_local = N > 1 && mode != EPX_NODE_LOCAL_OFF;
    c->budget = mode == EPX_NODE_LOCAL_RELAXED ? (int32_t)(frac * (P - E)) : 0;
    c->iters = k->max_iters >= 0 ? k->max_iters : 8 * (int64_t)shape->num_gpus + 64;
    c->iters2 = k->max_iters2 >= 0 ? k->max_iters2
                                   : (shape->num_gpus > 8 ? 2 * (int64_t)shape->num_gpus : 16);
    c->target = -HUGE_VAL;
    *mode_out = N > 1 ? mode : EPX_NODE_LOCAL_OFF;
    *est_out = est;
    return EPX_OK;
}

epx_status epxi_plan_epx_knobs(const epx_counts *counts, const epx_shape *shape,
                               const epx_plan_opts *opts, const epxi_knobs *k, int32_t *map_out,
                               double *share_out, epxi_plan_info *info, epx_error *err) {
    layer_cfg c;
    memset(&c, 0, sizeof c);
    epx_node_local mode = EPX_NODE_LOCAL_OFF;
    epx_estimate kind = EPX_ESTIMATE_SUM;
    EPX_TRY(resolve(counts, shape, opts, k, &c, &mode, &kind, err));
    const int32_t L = shape->num_layers, E = shape->num_logical_experts;
    const int32_t P = shape->num_physical_experts, G = shape->num_gpus, N = shape->num_nodes;
    const int32_t S = counts->num_windows;
    double track_h = 0.0;
    if (k->track > 0 && S > 1 && kind == EPX_ESTIMATE_RECENCY &&
        opts->estimate == EPX_ESTIMATE_DEFAULT) {
        /* Where the load moves, the summed history is the wrong target and
         * its cap holds the plan back: plan for the estimate as if it were
         * the whole load (DeepSeek's map of the estimate is then the guard). */
        bool shifted = false;
        double h = k->track_h > 0.0 ? k->track_h : epxi_choose_half_life(counts, &shifted);
        if (!shifted && h < k->min_h) h = k->min_h;
        if (k->track == 2 || (k->track == 1 && h < k->moved_h) || (k->track == 3 && shifted)) {
            epx_counts *one = NULL;
            EPX_TRY(epx_counts_create(1, counts->num_layers, counts->num_experts, &one, err));
            for (int32_t l = 0; l < counts->num_layers; l++)
                epxi_estimate_layer(counts, l, isinf(h) ? EPX_ESTIMATE_SUM : EPX_ESTIMATE_RECENCY,
                                    h, epx_counts_row(one, 0, l));
            epx_status st1 =
                epxi_plan_epx_knobs(one, shape, opts, k, map_out, share_out, info, err);
            epx_counts_destroy(one);
            if (st1 == EPX_OK && info != NULL) info->half_life = h, info->tracked = true;
            return st1;
        }
        track_h = h;
    }
    plan_ws w;
    epx_status st = ws_alloc(&w, counts, shape, c.node_local ? c.ng : 1, c.node_local ? N : 1,
                             c.node_local, err);
    if (st != EPX_OK) {
        ws_free(&w);
        return st;
    }
    epxi_plan_info inf;
    memset(&inf, 0, sizeof inf);
    inf.node_local = mode;
    inf.estimate = kind;
    inf.budget = c.budget;
    inf.half_life = track_h;
    for (int32_t l = 0; l < L; l++) {
        /* Progress counts finished layers; the dense-layer path continues early. */
        if (opts->progress && l > 0) opts->progress(opts->progress_user, "layers planned", l, L);
        int32_t *map = map_out + (size_t)l * P;
        double *share = share_out + (size_t)l * P;
        epxi_estimate_layer(counts, l, EPX_ESTIMATE_SUM, 0.0, w.sum);
        if ((st = check_finite(w.sum, E, l, "summed load", err)) != EPX_OK) break;
        double top = 0.0;
        for (int32_t e = 0; e < E; e++)
            if (w.sum[e] > top) top = w.sum[e];
        /* DeepSeek's placement of the summed load: the baseline. */
        epxi_deepseek_layer(w.ds, w.load32 + (size_t)l * E, w.ds_map, NULL, NULL);
        if (!(top > 0.0)) { /* a dense layer: nothing to balance */
            memcpy(map, w.ds_map, (size_t)P * sizeof *map);
            (void)epxi_layer_gpu_loads(map, w.sum, NULL, NULL, NULL, E, P, G, w.cnt, w.gload);
            for (int32_t p = 0; p < P; p++) share[p] = 1.0 / w.cnt[map[p]];
            continue;
        }
        const double ds_max = even_max(&w, &c, w.ds_map, w.sum);
        int32_t dups = 0;
        double m = 0.0;
        const bool with_est = S > 1 && kind != EPX_ESTIMATE_SUM;
        if (!k->phase1 && with_est) {
            /* DeepSeek's map is where the estimate's search starts. */
            memcpy(w.best, w.ds_map, (size_t)P * sizeof *w.best);
            if (c.node_local) homes_of_map(&c, w.ds_map, w.best_home);
            w.search_holds_best = false;
            m = ds_max;
        } else {
            /* Phase 1: the summed load, at least as balanced as DeepSeek.
             * When the estimate's search follows a global plan, reaching
             * DeepSeek's max is enough (that search may use only the slack
             * up to it). Node-local plans search on: the hierarchical
             * baseline is weak, and the better start pays off in-sample. */
            c.target = with_est && !c.node_local ? ds_max : -HUGE_VAL;
            inf.moves += plan_for(&w, &c, w.sum, &dups, &m);
            c.target = -HUGE_VAL;
        }
        if (k->baseline && m > ds_max) {
            /* Search from DeepSeek's own map instead, which cannot end worse. */
            const int32_t *home = NULL;
            if (c.node_local) {
                homes_of_map(&c, w.ds_map, w.best_home);
                home = w.best_home;
            }
            int32_t d = 0;
            inf.moves += search_once(&w, &c, w.sum, home, 2, w.ds_map, w.cand, &d);
            if (w.last_max <= ds_max) {
                memcpy(w.best, w.cand, (size_t)P * sizeof *w.best);
                dups = d;
                w.search_holds_best = true;
                inf.layers_fallback_sum++;
            } else {
                memcpy(w.best, w.ds_map, (size_t)P * sizeof *w.best);
                dups = 0;
                w.search_holds_best = false;
                inf.layers_kept_baseline++;
            }
        }
        /* The cap phase 2 and the shares respect: DeepSeek's max on the
         * summed load (or, without the guard, phase 1's). */
        const double cap = k->baseline ? ds_max : even_max(&w, &c, w.best, w.sum);
        const double *est = w.sum;
        if (with_est) {
            /* Phase 2: plan for the next window within that cap. */
            if (kind == EPX_ESTIMATE_MINMAX) {
                /* Refine for each estimate; keep the map whose maxima over
                 * the windows sum lowest (phase 1's map competes too). */
                static const epx_estimate kinds[2] = {EPX_ESTIMATE_RECENCY, EPX_ESTIMATE_MEAN_STD};
                memcpy(map, w.best, (size_t)P * sizeof *map);
                memcpy(w.pick, w.best, (size_t)P * sizeof *w.pick);
                double best_obj = sum_of_maxima(&w, &c, counts, l, w.best);
                memcpy(w.est, w.sum, (size_t)E * sizeof *w.est);
                for (int32_t i = 0; i < 2; i++) {
                    epxi_estimate_layer(counts, l, kinds[i], -1.0, w.alt);
                    if ((st = check_finite(w.alt, E, l, "estimated load", err)) != EPX_OK) break;
                    memcpy(w.best, w.pick, (size_t)P * sizeof *w.best);
                    w.search_holds_best = false;
                    int32_t d = dups;
                    inf.moves += refine_for(&w, &c, w.alt, cap, &d);
                    double obj = sum_of_maxima(&w, &c, counts, l, w.best);
                    if (obj < best_obj) {
                        best_obj = obj;
                        memcpy(map, w.best, (size_t)P * sizeof *map);
                        memcpy(w.est, w.alt, (size_t)E * sizeof *w.est);
                    }
                }
                if (st != EPX_OK) break;
                memcpy(w.best, map, (size_t)P * sizeof *w.best);
            } else {
                epxi_estimate_layer(counts, l, kind,
                                    k->track == 3 && track_h > 0.0 && !isinf(track_h)
                                        ? track_h
                                        : opts->estimate_param,
                                    w.est);
                if ((st = check_finite(w.est, E, l, "estimated load", err)) != EPX_OK) break;
                inf.moves += refine_for(&w, &c, w.est, cap, &dups);
            }
            est = w.est;
        }
        memcpy(map, w.best, (size_t)P * sizeof *map);
        inf.duplicates_left += dups;
        shares_for(&w, &c, map, est, cap, share);
    }
    if (st != EPX_OK) {
        ws_free(&w);
        return st;
    }
    if (opts->progress) opts->progress(opts->progress_user, "layers planned", L, L);
    if (opts->log)
        epxi_log(opts->log, opts->log_user, EPX_LOG_INFO,
                 "epx placement: %d layers, %lld moves, %d kept DeepSeek's map, %d planned on "
                 "the summed load, %d duplicate replicas left",
                 L, (long long)inf.moves, inf.layers_kept_baseline, inf.layers_fallback_sum,
                 inf.duplicates_left);
    if (info) *info = inf;
    ws_free(&w);
    return EPX_OK;
}

epx_status epxi_plan_epx(const epx_counts *counts, const epx_shape *shape,
                         const epx_plan_opts *opts, int32_t *map_out, double *share_out,
                         epx_error *err) {
    static const epxi_knobs k = EPXI_KNOBS_DEFAULT;
    return epxi_plan_epx_knobs(counts, shape, opts, &k, map_out, share_out, NULL, err);
}
