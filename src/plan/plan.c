/*
 * plan.c - the planner's public entry point: option checks, SGLang's `auto`
 * rule, the DeepSeek modes (deepseek.c) and the hand-off to epx's own
 * algorithm (epx_*.c, behind plan_internal.h), and the plan object.
 *
 * Every option is checked here, before any work, so the algorithms can trust
 * their inputs. Planning relative to the layout in service (current,
 * max_moves, move_price) and around failed GPUs is src/plan/plan_constrained.c's
 * epxi_plan_constrained, which wraps place(); an option the chosen
 * algorithm does not take is an error,
 * unless it asks for what that algorithm does anyway (node_local OFF with
 * the global policy).
 */
#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "plan_hooks.h"
#include "epx_algo.h"
#include "plan_internal.h"
#include "constrain.h"
#include "../layout/layout_internal.h"

struct epx_plan {
    epx_layout *layout;
    double *weights; /* [L][P] */
    /* A DeepSeek plan's replica rank of every slot [L][P] (NULL for the
     * others); the [L][E][P - E + 1] lists in that order are built from it
     * on the first epx_plan_logical_to_physical call, not while planning:
     * at Kimi-K2's shape they are 3 MB that every plan zeroed and filled (a
     * third of parity mode's time, issue 30). */
    int32_t *rank;
    struct lazy_lists {
        _Atomic(int32_t *) l2p;
    } * lists; /* beside the plan, so a const plan can fill it */
    double seconds;
    epx_algorithm algorithm;
};

/* ---- names -------------------------------------------------------------- */

static const char *const ALGO_NAMES[] = {
    [EPX_ALGO_EPX] = "epx",
    [EPX_ALGO_DEEPSEEK] = "deepseek",
    [EPX_ALGO_DEEPSEEK_HIERARCHICAL] = "deepseek-hierarchical",
    [EPX_ALGO_AUTO] = "auto",
    [EPX_ALGO_DEEPSEEK_VEC] = "deepseek-vec",
    [EPX_ALGO_DEEPSEEK_VEC_HIERARCHICAL] = "deepseek-vec-hierarchical",
    [EPX_ALGO_ELASTICITY_AWARE] = "elasticity-aware",
    [EPX_ALGO_ELASTICITY_AWARE_HIERARCHICAL] = "elasticity-aware-hierarchical",
};
#define EPXI_NUM_ALGOS ((int)(sizeof ALGO_NAMES / sizeof ALGO_NAMES[0]))

const char *epx_algorithm_name(epx_algorithm algo) {
    if ((int)algo < 0 || (int)algo >= EPXI_NUM_ALGOS) return "unknown";
    return ALGO_NAMES[algo];
}

epx_status epx_algorithm_parse(const char *name, epx_algorithm *out, epx_error *err) {
    if (name == NULL || out == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    for (int a = 0; a < EPXI_NUM_ALGOS; a++)
        if (strcmp(name, ALGO_NAMES[a]) == 0) {
            *out = (epx_algorithm)a;
            return EPX_OK;
        }
    /* SGLang spells them with underscores. */
    for (int a = 0; a < EPXI_NUM_ALGOS; a++) {
        const char *n = ALGO_NAMES[a];
        size_t i = 0;
        while (n[i] != '\0' && (name[i] == n[i] || (n[i] == '-' && name[i] == '_'))) i++;
        if (n[i] == '\0' && name[i] == '\0') {
            *out = (epx_algorithm)a;
            return EPX_OK;
        }
    }
    return epxi_fail(err, EPX_ERR_INVALID_ARG,
                     "unknown algorithm '%.64s': use epx, deepseek, deepseek-hierarchical, auto, "
                     "deepseek-vec, deepseek-vec-hierarchical, elasticity-aware or "
                     "elasticity-aware-hierarchical",
                     name);
}

static const char *node_local_name(epx_node_local n) {
    switch (n) {
    case EPX_NODE_LOCAL_DEFAULT: return "default";
    case EPX_NODE_LOCAL_STRICT: return "strict";
    case EPX_NODE_LOCAL_RELAXED: return "relaxed";
    case EPX_NODE_LOCAL_OFF: return "off";
    }
    return "unknown";
}

/* ---- option checks -------------------------------------------------------- */

static bool is_vec(epx_algorithm a) {
    return a == EPX_ALGO_DEEPSEEK_VEC || a == EPX_ALGO_DEEPSEEK_VEC_HIERARCHICAL;
}
static bool is_elastic(epx_algorithm a) {
    return a == EPX_ALGO_ELASTICITY_AWARE || a == EPX_ALGO_ELASTICITY_AWARE_HIERARCHICAL;
}
/* DeepSeek's own modes, which take a missing group count as one group. */
static bool is_deepseek_only(epx_algorithm a) {
    return a == EPX_ALGO_DEEPSEEK || a == EPX_ALGO_DEEPSEEK_HIERARCHICAL;
}
static bool is_hierarchical(epx_algorithm a) {
    return a == EPX_ALGO_DEEPSEEK_HIERARCHICAL || a == EPX_ALGO_DEEPSEEK_VEC_HIERARCHICAL ||
           a == EPX_ALGO_ELASTICITY_AWARE_HIERARCHICAL;
}

/* The release an SGLang-only algorithm plans as, and its EPLB rule. */
static epx_status sglang_rule(const epx_plan_opts *o, epx_algorithm algo, epx_eplb_rule *rule,
                              epx_error *err) {
    if (!is_vec(algo) && !is_elastic(algo) && o->sglang_version == NULL) {
        *rule = EPX_EPLB_RULE_DEEPSEEK;
        return EPX_OK;
    }
    return epx_sglang_eplb_rule(o->sglang_version ? o->sglang_version : EPX_SGLANG_DEFAULT_VERSION,
                                rule, NULL, err);
}

/* The active ranks of an elasticity-aware plan: the live GPUs. */
static int32_t active_ranks(const epx_shape *s, const epx_plan_opts *o) {
    int32_t a = 0;
    for (int32_t g = 0; g < s->num_gpus; g++) a += o->failed_gpus == NULL || !o->failed_gpus[g];
    return a;
}

/* SGLang's compute_algorithm: hierarchical when the groups divide evenly over
 * the nodes; num_groups == 0 is SGLang's None (no groups), hence global. */
static epx_algorithm resolve_auto(const epx_plan_opts *o, const epx_shape *s) {
    if (o->algorithm != EPX_ALGO_AUTO) return o->algorithm;
    if (o->num_groups > 0 && o->num_groups % s->num_nodes == 0)
        return EPX_ALGO_DEEPSEEK_HIERARCHICAL;
    return EPX_ALGO_DEEPSEEK;
}

static epx_status check_deepseek_opts(const epx_plan_opts *o, epx_algorithm algo, epx_error *err) {
    const char *name = epx_algorithm_name(algo);
    const epx_node_local same = is_hierarchical(algo) ? EPX_NODE_LOCAL_STRICT : EPX_NODE_LOCAL_OFF;
    if (o->node_local != EPX_NODE_LOCAL_DEFAULT && o->node_local != same)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "node_local '%s' does not apply to %s, which is always '%s': the "
                         "node-local modes are epx's (--algorithm epx); leave node_local unset",
                         node_local_name(o->node_local), name, node_local_name(same));
    if (o->estimate != EPX_ESTIMATE_DEFAULT && o->estimate != EPX_ESTIMATE_SUM)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "estimate %d does not apply to %s, which plans for the sum of the "
                         "windows as SGLang does: the estimates are epx's (--algorithm epx)",
                         (int)o->estimate, name);
    if (o->estimate_param >= 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "estimate_param (%g) does not apply to %s: leave it < 0",
                         o->estimate_param, name);
    if (o->cross_node_budget >= 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "cross_node_budget (%g) does not apply to %s: it is epx's relaxed "
                         "node-local mode; leave it < 0",
                         o->cross_node_budget, name);
    return EPX_OK;
}

static epx_status check_counts(const epx_counts *c, const epx_shape *s, epx_error *err) {
    EPX_TRY(epxi_counts_valid(c, "epx_plan_compute", err));
    if (c->num_layers != s->num_layers || c->num_experts != s->num_logical_experts)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "the counts are [%d layers][%d experts] but the shape has %d layers "
                         "and %d logical experts: the counts were recorded for another model, "
                         "or the shape is wrong",
                         c->num_layers, c->num_experts, s->num_layers, s->num_logical_experts);
    const size_t le = (size_t)c->num_layers * (size_t)c->num_experts;
    const size_t n = (size_t)c->num_windows * le;
    for (size_t i = 0; i < n; i++) {
        const double x = c->data[i];
        if (!(x >= 0.0) || !isfinite(x))
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "counts entry [window %zu][layer %zu][expert %zu] is %g: loads "
                             "must be finite and >= 0",
                             i / le, (i % le) / (size_t)c->num_experts, i % (size_t)c->num_experts,
                             x);
    }
    return EPX_OK;
}

static epx_status check_opts(const epx_plan_opts *o, const epx_shape *s, epx_algorithm *algo,
                             epx_error *err) {
    if (o == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "plan options are NULL");
    EPX_TRY(epxi_check_version(o->version, EPX_PLAN_OPTS_VERSION, "epx_plan_opts",
                               "EPX_PLAN_OPTS_INIT", err));
    if ((int)o->algorithm < 0 || (int)o->algorithm >= EPXI_NUM_ALGOS)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "algorithm %d is unknown: use EPX_ALGO_EPX, EPX_ALGO_DEEPSEEK, "
                         "EPX_ALGO_DEEPSEEK_HIERARCHICAL, EPX_ALGO_AUTO, EPX_ALGO_DEEPSEEK_VEC(_"
                         "HIERARCHICAL) or EPX_ALGO_ELASTICITY_AWARE(_HIERARCHICAL)",
                         (int)o->algorithm);
    if ((int)o->node_local < EPX_NODE_LOCAL_DEFAULT || (int)o->node_local > EPX_NODE_LOCAL_OFF)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "node_local %d is unknown: use EPX_NODE_LOCAL_DEFAULT, _STRICT, "
                         "_RELAXED or _OFF",
                         (int)o->node_local);
    if ((int)o->estimate < EPX_ESTIMATE_DEFAULT || (int)o->estimate > EPX_ESTIMATE_MINMAX)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "estimate %d is unknown: use EPX_ESTIMATE_DEFAULT, _SUM, _RECENCY, "
                         "_MEAN_STD or _MINMAX",
                         (int)o->estimate);
    if (isnan(o->estimate_param) || isnan(o->cross_node_budget))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "estimate_param and cross_node_budget must be numbers (NaN given)");
    if (isinf(o->estimate_param))
        /* mean-std's z of +inf made every estimate NaN, blamed on the counts */
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "estimate_param is %g: give a finite half-life or z, or < 0 for the "
                         "default",
                         o->estimate_param);
    if (o->cross_node_budget > 1.0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "cross_node_budget (%g) is a share of the redundant slots: use a "
                         "value in [0, 1], or < 0 for the default",
                         o->cross_node_budget);
    if (o->num_groups < 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "num_groups (%d) must be >= 0 (0 = the model has no expert groups)",
                         o->num_groups);
    EPX_TRY(epx_shape_check(s, err));
    /* current, max_moves, move_price, failed_gpus: plan_constrained.c. */
    EPX_TRY(epxi_plan_constraints_check(s, o, err));
    const int32_t E = s->num_logical_experts;
    if (o->num_groups > 0 && E % o->num_groups != 0)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "%d experts do not split into %d equal groups: num_groups must divide "
                         "the expert count (use the model's n_group, or 0 for none)",
                         E, o->num_groups);
    *algo = resolve_auto(o, s);
    if (*algo == EPX_ALGO_EPX && o->sglang_version != NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "sglang_version (--sglang-version) '%.64s' applies to the DeepSeek modes "
                         "(SGLang's copy of "
                         "EPLB): use --algorithm deepseek, deepseek-hierarchical or auto, or "
                         "leave it unset for epx's planner",
                         o->sglang_version);
    if (*algo == EPX_ALGO_EPX) return EPX_OK;
    EPX_TRY(check_deepseek_opts(o, *algo, err));
    const char *name = epx_algorithm_name(*algo);
    if (o->sglang_version != NULL) {
        epx_eplb_rule rule;
        int32_t newer = 0;
        EPX_TRY(epx_sglang_eplb_rule(o->sglang_version, &rule, &newer, err));
        if (newer)
            epxi_log(o->log, o->log_user, EPX_LOG_WARN,
                     "SGLang %.64s is newer than the newest release epx verified "
                     "(" EPX_SGLANG_DEFAULT_VERSION "); planning with " EPX_SGLANG_DEFAULT_VERSION
                     "'s EPLB rule",
                     o->sglang_version);
        long v[4], v0523[4] = {0, 5, 23, 0};
        EPX_TRY(epxi_sglang_release(o->sglang_version, v, NULL, err));
        if (is_elastic(*algo) && epxi_release_cmp(v, v0523) < 0)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "%s is reproduced as SGLang 0.5.23 has it, and SGLang '%.64s' is "
                             "older: give --sglang-version 0.5.23 (or newer), or leave it unset",
                             name, o->sglang_version);
    }
    bool hier = is_hierarchical(*algo);
    if (is_elastic(*algo)) {
        if (o->current != NULL || o->max_moves >= 0 || o->move_price != 0.0)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "%s plans from scratch over the active ranks, as SGLang does: it "
                             "takes no current layout, max_moves or move_price (leave them "
                             "unset, or use --algorithm epx to plan around the layout in service)",
                             name);
        /* With a rank down the release falls back to the global policy on
         * the active ranks: A GPUs, one node, P/G slots each. */
        const int32_t A = active_ranks(s, o), nloc = s->num_physical_experts / s->num_gpus;
        if (A < s->num_gpus) return epxi_deepseek_check(E, nloc * A, 1, 1, A, false, err);
    }
    if (hier && o->num_groups == 0 && (s->num_nodes > 1 || !is_deepseek_only(*algo)))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "%s packs expert groups onto %d node(s), but no groups were given: "
                         "pass the model's n_group (a multiple of %d that divides %d), or use "
                         "the global form (drop -hierarchical)",
                         name, s->num_nodes, s->num_nodes, E);
    return epxi_deepseek_check(E, s->num_physical_experts, o->num_groups > 0 ? o->num_groups : 1,
                               s->num_nodes, s->num_gpus, hier, err);
}

/* ---- shared helpers ------------------------------------------------------- */

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* DeepSeek's placement of every layer into map [L][P]; with ranks (may be
 * NULL) also each slot's replica rank, [L][P]. */
static epx_status plan_deepseek_all(const epx_counts *c, const epx_shape *s, const epx_plan_opts *o,
                                    bool hier, int32_t *map, int32_t *ranks, epx_error *err) {
    const int32_t L = s->num_layers, E = s->num_logical_experts, P = s->num_physical_experts;
    epx_eplb_rule rule = EPX_EPLB_RULE_DEEPSEEK;
    if (o->sglang_version != NULL)
        EPX_TRY(epx_sglang_eplb_rule(o->sglang_version, &rule, NULL, err));
    float *w = epxi_calloc((size_t)L * (size_t)E, sizeof *w, "float32 load", err);
    int32_t *rank = w ? epxi_calloc((size_t)P, sizeof *rank, "replica ranks", err) : NULL;
    if (rank == NULL) {
        free(w);
        return err ? err->status : EPX_ERR_NOMEM;
    }
    epxi_deepseek *ws = NULL;
    epx_status st = epxi_plan_load_f32(c, w, err);
    if (st == EPX_OK)
        st = epxi_deepseek_create(E, P, o->num_groups > 0 ? o->num_groups : 1, s->num_nodes,
                                  s->num_gpus, hier, &ws, err);
    if (st == EPX_OK) epxi_deepseek_set_rule(ws, rule);
    if (st == EPX_OK)
        for (int32_t l = 0; l < L; l++) {
            int32_t *row = map + (size_t)l * (size_t)P;
            epxi_deepseek_layer(ws, w + (size_t)l * (size_t)E, row, rank, NULL);
            if (ranks != NULL)
                memcpy(ranks + (size_t)l * (size_t)P, rank, (size_t)P * sizeof *rank);
            if (o->progress) o->progress(o->progress_user, "layers planned", l + 1, L);
        }
    epxi_deepseek_destroy(ws);
    free(rank);
    free(w);
    return st;
}

/* Replica weights must be shares: finite, >= 0, summing to 1 per expert. The
 * DeepSeek modes make them so by construction; this guards epx's algorithm.
 * Each expert's shares are summed in ascending slot order (its replica
 * list's order) by one pass over the map: the lists themselves, [L][E][W],
 * are megabytes at a few hundred GPUs and would be read only for this. */
static epx_status check_shares(const epx_layout *lay, const double *share, epx_error *err) {
    const epx_shape *s = epx_layout_shape(lay);
    const int32_t E = s->num_logical_experts, P = s->num_physical_experts;
    const int32_t *map = epx_layout_physical_to_logical(lay);
    double *sum = epxi_calloc((size_t)E, sizeof *sum, "share sums", err);
    if (sum == NULL) return EPX_ERR_NOMEM;
    epx_status st = EPX_OK;
    for (int32_t l = 0; l < s->num_layers && st == EPX_OK; l++) {
        const int32_t *row = map + (size_t)l * (size_t)P;
        const double *sh = share + (size_t)l * (size_t)P;
        memset(sum, 0, (size_t)E * sizeof *sum);
        for (int32_t p = 0; p < P; p++) {
            const double x = sh[p];
            if (!(x >= 0.0) || !isfinite(x)) sum[row[p]] = NAN;
            sum[row[p]] += x;
        }
        for (int32_t e = 0; e < E; e++)
            if (!(fabs(sum[e] - 1.0) <= 1e-9)) {
                st = epxi_fail(err, EPX_ERR_INTERNAL,
                               "the planner gave layer %d, expert %d replica weights that sum "
                               "to %.17g, not 1: this is a bug in epx, please report it",
                               l, e, sum[e]);
                break;
            }
    }
    free(sum);
    return st;
}

/* The load a placement of `algo` is made for, [L][E]: what the planner's
 * estimate gives (epx: recency by default, as EPXI_ESTIMATE_DEFAULT in
 * epx_plan.c; MINMAX weighs every window alike, so the sum), and the sum of
 * the windows for DeepSeek, as SGLang. Moves are valued on it. */
static void planned_load(const epx_counts *counts, epx_algorithm algo, const epx_plan_opts *o,
                         double *load) {
    epx_estimate kind = algo == EPX_ALGO_EPX ? o->estimate : EPX_ESTIMATE_SUM;
    if (kind == EPX_ESTIMATE_DEFAULT) kind = EPX_ESTIMATE_RECENCY;
    if (kind == EPX_ESTIMATE_MINMAX) kind = EPX_ESTIMATE_SUM;
    for (int32_t l = 0; l < counts->num_layers; l++)
        epxi_estimate_layer(counts, l, kind, o->estimate_param,
                            load + (size_t)l * (size_t)counts->num_experts);
}

/* The placement for one shape (epxi_place_fn): the chosen algorithm and its
 * replica weights. The constrained path calls it on the survivors' shape. */
typedef struct {
    epx_algorithm algo;
    const epx_shape *checked; /* the shape check_opts checked */
    int32_t *ranks;           /* optional: DeepSeek's replica rank of every slot, [L][P] */
} place_ctx;

/* SGLang's deepseek_vec and elasticity_aware (deepseek_vec.c, elastic.c):
 * the map, each slot's place in its expert's list (into pc->ranks when the
 * plan keeps them), and even shares over the listed replicas (a failed
 * rank's slots, listed nowhere, get 0). */
static epx_status place_sglang(const place_ctx *pc, const epx_counts *counts,
                               const epx_shape *shape, const epx_plan_opts *opts, int32_t *map,
                               double *share, epx_error *err) {
    const int32_t L = shape->num_layers, E = shape->num_logical_experts,
                  P = shape->num_physical_experts;
    const int32_t groups = opts->num_groups > 0 ? opts->num_groups : 1;
    const bool hier = is_hierarchical(pc->algo);
    const size_t LP = (size_t)L * (size_t)P, LE = (size_t)L * (size_t)E;
    /* a constrained deepseek-vec plan (elasticity-aware is never) runs on
     * the survivors' shape, checked here */
    if (shape != pc->checked)
        EPX_TRY(epxi_deepseek_check(E, P, groups, shape->num_nodes, shape->num_gpus, hier, err));
    int32_t *rank = pc->ranks ? pc->ranks : epxi_calloc(LP, sizeof *rank, "replica ranks", err);
    int32_t *nv = rank ? epxi_calloc((size_t)E, sizeof *nv, "replica counts", err) : NULL;
    float *w = NULL;
    epx_status st = EPX_ERR_NOMEM;
    if (nv == NULL) goto done;
    if (is_vec(pc->algo)) {
        st = epxi_deepseek_vec(counts, shape, groups, hier, map, rank, err);
    } else {
        epx_eplb_rule rule;
        w = epxi_calloc(LE, sizeof *w, "float32 load", err);
        st = w ? sglang_rule(opts, pc->algo, &rule, err) : EPX_ERR_NOMEM;
        if (st == EPX_OK) st = epxi_plan_load_f32(counts, w, err);
        if (st == EPX_OK)
            st = epxi_elasticity_aware(w, shape, groups, hier, opts->failed_gpus, rule, map, rank,
                                       err);
    }
    if (st != EPX_OK) goto done;
    for (int32_t l = 0; l < L; l++) {
        const int32_t *row = map + (size_t)l * (size_t)P, *rk = rank + (size_t)l * (size_t)P;
        memset(nv, 0, (size_t)E * sizeof *nv);
        for (int32_t p = 0; p < P; p++) nv[row[p]] += rk[p] >= 0;
        for (int32_t p = 0; p < P; p++)
            share[(size_t)l * (size_t)P + (size_t)p] = rk[p] >= 0 ? 1.0 / nv[row[p]] : 0.0;
        if (opts->progress) opts->progress(opts->progress_user, "layers planned", l + 1, L);
    }
done:
    free(w);
    free(nv);
    if (rank != pc->ranks) free(rank);
    return st;
}

static epx_status place(void *ctx, const epx_counts *counts, const epx_shape *shape,
                        const epx_plan_opts *opts, int32_t *map, double *share, double *load,
                        epx_error *err) {
    const place_ctx *pc = ctx;
    const epx_algorithm algo = pc->algo;
    if (load != NULL) planned_load(counts, algo, opts, load);
    if (algo == EPX_ALGO_EPX) return epxi_plan_epx(counts, shape, opts, map, share, err);
    if (is_vec(algo) || is_elastic(algo))
        return place_sglang(pc, counts, shape, opts, map, share, err);
    const bool hier = algo == EPX_ALGO_DEEPSEEK_HIERARCHICAL;
    const int32_t E = shape->num_logical_experts, P = shape->num_physical_experts;
    /* check_opts checked the entry's shape; the survivors' shape of a plan
     * around failed GPUs (plan_constrained.c) is checked here. */
    if (shape != pc->checked)
        EPX_TRY(epxi_deepseek_check(E, P, opts->num_groups > 0 ? opts->num_groups : 1,
                                    shape->num_nodes, shape->num_gpus, hier, err));
    EPX_TRY(plan_deepseek_all(counts, shape, opts, hier, map, pc->ranks, err));
    /* DeepSeek's dispatch splits an expert's tokens evenly. */
    int32_t *nv = epxi_calloc((size_t)E, sizeof *nv, "replica counts", err);
    if (nv == NULL) return EPX_ERR_NOMEM;
    for (int32_t l = 0; l < shape->num_layers; l++) {
        const int32_t *row = map + (size_t)l * (size_t)P;
        memset(nv, 0, (size_t)E * sizeof *nv);
        for (int32_t p = 0; p < P; p++) nv[row[p]]++;
        for (int32_t p = 0; p < P; p++) share[(size_t)l * (size_t)P + (size_t)p] = 1.0 / nv[row[p]];
    }
    free(nv);
    return EPX_OK;
}

/* ---- the entry point -------------------------------------------------------- */

epx_status epx_plan_compute(const epx_counts *counts, const epx_shape *shape,
                            const epx_plan_opts *opts, epx_plan **out, epx_error *err) {
    if (shape == NULL || out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_plan_compute: shape and out must not be NULL");
    epx_algorithm algo = EPX_ALGO_EPX;
    EPX_TRY(check_opts(opts, shape, &algo, err));
    EPX_TRY(check_counts(counts, shape, err));

    const double t0 = now_seconds();
    const size_t LP = (size_t)shape->num_layers * (size_t)shape->num_physical_experts;
    epx_plan *plan = epxi_calloc(1, sizeof *plan, "plan", err);
    int32_t *map = plan ? epxi_calloc(LP, sizeof *map, "physical_to_logical map", err) : NULL;
    if (map != NULL) plan->weights = epxi_calloc(LP, sizeof *plan->weights, "replica weights", err);
    if (plan == NULL || map == NULL || plan->weights == NULL) {
        free(map);
        epx_plan_destroy(plan);
        return err ? err->status : EPX_ERR_NOMEM;
    }
    plan->algorithm = algo;
    /* elasticity-aware takes failed_gpus as its active ranks, itself */
    const bool constrained = !is_elastic(algo) && epxi_plan_is_constrained(opts);
    /* Replica ranks survive only an unconstrained DeepSeek plan: the
     * constrained path relabels slots inside each GPU. */
    if (algo != EPX_ALGO_EPX && !constrained) {
        plan->rank = epxi_calloc(LP, sizeof *plan->rank, "replica ranks", err);
        plan->lists = epxi_calloc(1, sizeof *plan->lists, "replica lists", err);
        if (plan->rank == NULL || plan->lists == NULL) {
            free(map);
            epx_plan_destroy(plan);
            return err ? err->status : EPX_ERR_NOMEM;
        }
    }
    place_ctx pc = {algo, shape, plan->rank};
    /* Planning around the layout in service or failed GPUs wraps place(). */
    epx_status st = constrained ? epxi_plan_constrained(counts, shape, opts, place, &pc, map,
                                                        plan->weights, err)
                                : place(&pc, counts, shape, opts, map, plan->weights, NULL, err);
    /* The map is checked (a guard against planner bugs); the shape was. */
    if (st == EPX_OK) st = epxi_layout_create_checked(shape, map, &plan->layout, err);
    free(map);
    if (st == EPX_OK) st = check_shares(plan->layout, plan->weights, err);
    if (st != EPX_OK) {
        epx_plan_destroy(plan);
        return st;
    }
    plan->seconds = now_seconds() - t0;
    *out = plan;
    return EPX_OK;
}

void epx_plan_destroy(epx_plan *plan) {
    if (plan == NULL) return;
    epx_layout_destroy(plan->layout);
    free(plan->weights);
    free(plan->rank);
    if (plan->lists != NULL) free(atomic_load(&plan->lists->l2p));
    free(plan->lists);
    free(plan);
}

const epx_layout *epx_plan_layout(const epx_plan *plan) { return plan ? plan->layout : NULL; }
const double *epx_plan_replica_weights(const epx_plan *plan) { return plan ? plan->weights : NULL; }
double epx_plan_seconds(const epx_plan *plan) { return plan ? plan->seconds : 0.0; }
epx_algorithm epx_plan_algorithm(const epx_plan *plan) {
    return plan ? plan->algorithm : EPX_ALGO_EPX;
}

const int32_t *epx_plan_logical_to_physical(const epx_plan *plan, int32_t *width,
                                            int32_t *replica_rank) {
    if (plan == NULL) {
        if (width) *width = 0;
        if (replica_rank) *replica_rank = 0;
        return NULL;
    }
    const epx_shape *s = epx_layout_shape(plan->layout);
    const int32_t L = s->num_layers, E = s->num_logical_experts, P = s->num_physical_experts;
    const size_t X = (size_t)(P - E + 1);
    if (width) *width = (int32_t)X;
    if (replica_rank) *replica_rank = plan->rank != NULL;
    /* Ascending, as init_by_mapping builds it: the layout's own lists (the
     * same width). */
    if (plan->rank == NULL) return epx_layout_logical_to_all_physical(plan->layout, NULL);
    int32_t *l2p = atomic_load(&plan->lists->l2p);
    if (l2p != NULL) return l2p;
    /* Built once; a thread that loses the race frees its copy. */
    l2p = malloc((size_t)L * (size_t)E * X * sizeof *l2p);
    if (l2p == NULL) return NULL;
    const int32_t *p2l = epx_layout_physical_to_logical(plan->layout);
    for (int32_t l = 0; l < L; l++) {
        int32_t *out = l2p + (size_t)l * (size_t)E * X;
        const int32_t *row = p2l + (size_t)l * (size_t)P, *rk = plan->rank + (size_t)l * (size_t)P;
        for (size_t i = 0; i < (size_t)E * X; i++) out[i] = -1;
        for (int32_t p = 0; p < P; p++)
            if (rk[p] >= 0) out[(size_t)row[p] * X + (size_t)rk[p]] = p;
    }
    int32_t *none = NULL;
    if (!atomic_compare_exchange_strong(&plan->lists->l2p, &none, l2p)) {
        free(l2p);
        return none;
    }
    return l2p;
}

/* ---- the hook epx_layout_init uses ------------------------------------------ */

epx_status epxi_plan_layout(const epx_counts *counts, const epx_shape *shape,
                            const epx_plan_opts *opts, epx_layout **out, epx_error *err) {
    epx_plan *plan = NULL;
    EPX_TRY(epx_plan_compute(counts, shape, opts, &plan, err));
    *out = plan->layout;
    plan->layout = NULL;
    epx_plan_destroy(plan);
    return EPX_OK;
}
