/*
 * plan_constrained.c - the planner options that concern the cluster as it
 * is: the layout in service (current), what moving may cost (max_moves,
 * move_price) and GPUs that were lost (failed_gpus).
 *
 * The planner proper stays unaware of them: src/plan hands its placement
 * function to epxi_plan_constrained, which
 *   1. with failed GPUs, plans the shape of the survivors (the same slots per
 *      GPU, G' live GPUs, the nodes kept when every node with a survivor has
 *      as many, else one node) and spreads the result back onto the live
 *      GPUs in order. The slots of a failed GPU then hold a copy of an
 *      expert that a live GPU also holds (what `current` had there, so
 *      nothing moves to a dead GPU, else p % E) with replica weight 0:
 *      weighted dispatch never picks them and static tables must skip dead
 *      ranks. Every logical expert keeps a replica on a live GPU because the
 *      survivors' plan covers every expert;
 *   2. with `current`, hands each planned GPU's set of experts to the GPU
 *      of its node (of the survivors, after a failure) that keeps the most
 *      slots (an exact assignment per layer, relabel.c), then relabels
 *      inside each GPU against it (neither changes balance), carrying the
 *      replica weights along, and
 *   3. undoes the moves that buy the least balance while more than
 *      max_moves slots change or a move buys less than move_price
 *      (limit.c). Replicas whose slot set changed get even weights.
 */
#include "constrain.h"

#include <math.h>
#include <string.h>

bool epxi_plan_is_constrained(const epx_plan_opts *o) {
    return o->current != NULL || o->max_moves >= 0 || o->move_price != 0.0 ||
           o->failed_gpus != NULL;
}

/* Survivors per node after the failures (failed NULL: none): nodes keep
 * their locality only when every node with a survivor has as many. Returns
 * -1 when they do, else the first node whose count differs from that of
 * the first node with any (*first, counts *first_c and *c). */
static int32_t uneven_node(const epx_shape *sh, const uint8_t *failed, int32_t *first,
                           int32_t *first_c, int32_t *c) {
    const int32_t gpn = sh->num_gpus / sh->num_nodes;
    *first = -1;
    *first_c = 0;
    for (int32_t k = 0; k < sh->num_nodes; k++) {
        *c = 0;
        for (int32_t g = k * gpn; g < (k + 1) * gpn; g++) *c += failed == NULL || !failed[g];
        if (*c == 0) continue;
        if (*first < 0) {
            *first = k;
            *first_c = *c;
        } else if (*c != *first_c) {
            return k;
        }
    }
    return -1;
}

/* Node-local strict asked for by name cannot be kept when the failures
 * leave the nodes unequal (survivors() plans them as one node): refused,
 * naming a node of each count, where the default only warns. */
static epx_status check_strict_nodes(const epx_shape *sh, const epx_plan_opts *o, epx_error *err) {
    if (o->node_local != EPX_NODE_LOCAL_STRICT || sh->num_nodes < 2) return EPX_OK;
    int32_t first, first_c, c;
    const int32_t k = uneven_node(sh, o->failed_gpus, &first, &first_c, &c);
    if (k < 0) return EPX_OK;
    return epxi_fail(err, EPX_ERR_INVALID_ARG,
                     "node-local strict with failed GPUs needs as many survivors on every node "
                     "that keeps any, but node %d keeps %d of its %d GPUs and node %d keeps %d: "
                     "use node-local relaxed or off (the survivors are then planned as one "
                     "node), or mark GPUs failed so that the nodes keep equal counts",
                     first, first_c, sh->num_gpus / sh->num_nodes, k, c);
}

epx_status epxi_plan_constraints_check(const epx_shape *sh, const epx_plan_opts *o,
                                       epx_error *err) {
    /* the value first: a NaN price is wrong with or without a current layout */
    if (!isfinite(o->move_price) || o->move_price < 0.0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "move_price (%g) must be a finite balancedness >= 0 (0 = moves are "
                         "free; 0.001 = each move must buy a tenth of a point)",
                         o->move_price);
    if (o->current != NULL) {
        const epx_shape *c = epx_layout_shape(o->current);
        EPX_TRY(epxi_check_same_shape(c, sh, "the current layout is of shape ",
                                      " but the plan is for ",
                                      ": plan for the shape in service (moves are counted "
                                      "slot by slot)",
                                      err));
    } else if (o->max_moves >= 0 || o->move_price != 0.0) {
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "max_moves (%d) or move_price (%g) is set without a current layout: "
                         "moves are counted from the layout in service, so pass it "
                         "(opts.current, epx plan --current FILE)",
                         o->max_moves, o->move_price);
    }
    if (o->failed_gpus != NULL) {
        int32_t live = 0;
        EPX_TRY(epxi_count_live(sh, o->failed_gpus, &live, err));
        const int32_t spg = sh->num_physical_experts / sh->num_gpus;
        if ((int64_t)live * spg < sh->num_logical_experts)
            return epxi_fail(err, EPX_ERR_SHAPE,
                             "%d logical experts do not fit in the %d slots of the %d surviving "
                             "GPUs (%d slots each): every expert needs a live replica; give "
                             "each GPU at least %d slots (P >= %d) or bring GPUs back",
                             sh->num_logical_experts, live * spg, live, spg,
                             (sh->num_logical_experts + live - 1) / live,
                             (sh->num_logical_experts + live - 1) / live * sh->num_gpus);
        EPX_TRY(check_strict_nodes(sh, o, err));
    }
    return EPX_OK;
}

/* Which GPUs may trade their planned sets (epxi_match_gpus): the live GPUs
 * of one node where the plan kept the nodes (no failure, or as many
 * survivors on every node that has any, as survivors() plans them), else
 * every live GPU; -1 for a failed GPU. */
static void trade_groups(const epx_shape *sh, const uint8_t *failed, int32_t *group) {
    const int32_t G = sh->num_gpus, gpn = G / sh->num_nodes;
    int32_t first, first_c, c;
    const bool even = uneven_node(sh, failed, &first, &first_c, &c) < 0;
    for (int32_t g = 0; g < G; g++)
        group[g] = failed != NULL && failed[g] ? -1 : even ? g / gpn : 0;
}

/* The survivors' shape; live[i] receives the i-th live GPU. */
static epx_shape survivors(const epx_shape *sh, const uint8_t *failed, int32_t *live,
                           const epx_plan_opts *o) {
    const int32_t G = sh->num_gpus, N = sh->num_nodes, gpn = G / N,
                  spg = sh->num_physical_experts / G;
    int32_t n = 0, nodes = 0;
    for (int32_t k = 0; k < N; k++) {
        const int32_t n0 = n;
        for (int32_t g = k * gpn; g < (k + 1) * gpn; g++)
            if (!failed[g]) live[n++] = g;
        nodes += n > n0;
    }
    int32_t first, first_c, c;
    const bool even = uneven_node(sh, failed, &first, &first_c, &c) < 0;
    epx_shape r = {sh->num_layers, sh->num_logical_experts, n * spg, n, even ? nodes : 1};
    if (!even)
        epxi_log(o->log, o->log_user, EPX_LOG_WARN,
                 "failed GPUs leave the nodes with unequal survivors: planning the %d survivors "
                 "as one node (node locality is not enforced)",
                 n);
    return r;
}

static epx_status place_survivors(const epx_counts *counts, const epx_shape *sh,
                                  const epx_plan_opts *ro, const uint8_t *failed,
                                  const epx_layout *current, epxi_place_fn place, void *ctx,
                                  int32_t *map, double *share, double *load, epx_error *err) {
    const int32_t G = sh->num_gpus, P = sh->num_physical_experts, spg = P / G;
    const int32_t E = sh->num_logical_experts;
    epx_status st = EPX_OK;
    int32_t *live = epxi_calloc((size_t)G, sizeof *live, "live GPUs", err);
    if (live == NULL) return EPX_ERR_NOMEM;
    const epx_shape rs = survivors(sh, failed, live, ro);
    const size_t rcells = (size_t)rs.num_layers * (size_t)rs.num_physical_experts;
    int32_t *rmap = epxi_calloc(rcells, sizeof *rmap, "survivors' map", err);
    double *rshare = rmap ? epxi_calloc(rcells, sizeof *rshare, "survivors' weights", err) : NULL;
    if (rshare == NULL) {
        st = EPX_ERR_NOMEM;
        goto done;
    }
    EPX_TRY_GOTO(st, epx_shape_check(&rs, err), done);
    st = place(ctx, counts, &rs, ro, rmap, rshare, load, err);
    if (st != EPX_OK) {
        epxi_error_prefix(err, "planning the %d surviving GPUs", rs.num_gpus);
        goto done;
    }
    const int32_t *cur = current ? epx_layout_physical_to_logical(current) : NULL;
    for (int32_t l = 0; l < sh->num_layers; l++) {
        const size_t o = (size_t)l * (size_t)P;
        for (int32_t p = 0; p < P; p++) {
            map[o + p] = cur ? cur[o + p] : p % E;
            share[o + p] = 0.0;
        }
        for (int32_t i = 0; i < rs.num_gpus; i++)
            for (int32_t s = 0; s < spg; s++) {
                size_t from = (size_t)l * (size_t)rs.num_physical_experts + (size_t)(i * spg + s);
                map[o + (size_t)(live[i] * spg + s)] = rmap[from];
                share[o + (size_t)(live[i] * spg + s)] = rshare[from];
            }
    }
done:
    free(live);
    free(rmap);
    free(rshare);
    return st;
}

epx_status epxi_plan_constrained(const epx_counts *counts, const epx_shape *sh,
                                 const epx_plan_opts *opts, epxi_place_fn place, void *place_ctx,
                                 int32_t *map, double *share, epx_error *err) {
    EPX_TRY(epxi_plan_constraints_check(sh, opts, err));
    epx_plan_opts ro = *opts;
    ro.current = NULL;
    ro.max_moves = -1;
    ro.move_price = 0.0;
    ro.failed_gpus = NULL;
    bool any_failed = false;
    if (opts->failed_gpus != NULL)
        for (int32_t g = 0; g < sh->num_gpus; g++) any_failed |= opts->failed_gpus[g] != 0;
    const int32_t P = sh->num_physical_experts;
    const size_t cells = (size_t)sh->num_layers * (size_t)P;
    epx_status st = EPX_OK;
    double *load = NULL, *tmp = NULL;
    int32_t *perm = NULL;
    if (opts->current != NULL) {
        load = epxi_calloc((size_t)sh->num_layers * (size_t)sh->num_logical_experts, sizeof *load,
                           "planned load", err);
        if (load == NULL) return EPX_ERR_NOMEM;
    }
    if (any_failed)
        st = place_survivors(counts, sh, &ro, opts->failed_gpus, opts->current, place, place_ctx,
                             map, share, load, err);
    else
        st = place(place_ctx, counts, sh, &ro, map, share, load, err);
    if (st != EPX_OK || opts->current == NULL) goto done;

    const int32_t *old = epx_layout_physical_to_logical(opts->current);
    perm = epxi_calloc(cells > (size_t)sh->num_gpus ? cells : (size_t)sh->num_gpus, sizeof *perm,
                       "relabelling", err);
    tmp = perm ? epxi_calloc(cells, sizeof *tmp, "relabelled weights", err) : NULL;
    if (tmp == NULL) {
        st = EPX_ERR_NOMEM;
        goto done;
    }
    trade_groups(sh, any_failed ? opts->failed_gpus : NULL, perm); /* perm: the groups, first */
    EPX_TRY_GOTO(st, epxi_match_gpus(sh, old, perm, map, share, err), done);
    EPX_TRY_GOTO(st, epxi_relabel_map(sh, old, map, perm, err), done);
    for (size_t i = 0; i < cells; i++) tmp[i] = share[i - i % (size_t)P + (size_t)perm[i]];
    memcpy(share, tmp, cells * sizeof *share);
    epx_move_budget b = EPX_MOVE_BUDGET_INIT;
    b.max_moves = opts->max_moves;
    b.move_price = opts->move_price;
    b.failed_gpus = any_failed ? opts->failed_gpus : NULL;
    epx_move_report rep;
    EPX_TRY_GOTO(st, epxi_limit_moves(sh, load, old, map, share, &b, &rep, err), done);
    epxi_log(opts->log, opts->log_user, EPX_LOG_INFO,
             "moves: %lld wanted, %lld made; balancedness %.4f in service, %.4f wanted, %.4f made",
             (long long)rep.moves_wanted, (long long)rep.moves_made, rep.balance_current,
             rep.balance_wanted, rep.balance_made);
done:
    free(perm);
    free(tmp);
    free(load);
    return st;
}
