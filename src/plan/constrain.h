/*
 * constrain.h - what a plan's constraints need, shared by the planner's
 * entry point (plan.c), the constraint files (plan_constrained.c, relabel.c,
 * limit.c) and, from the engine room above, migration plans: relabelling
 * against the layout in service, live GPUs, move limits, and the hook that
 * serves current, max_moves, move_price and failed_gpus. Internal.
 *
 * Constraints are planner inputs, so they live in src/plan; the engine's
 * migration code uses them, and nothing here calls the engine.
 */
#ifndef EPX_PLAN_CONSTRAIN_H
#define EPX_PLAN_CONSTRAIN_H

#include "internal.h"

/*
 * Relabel the slots of every GPU in every layer of `map` ([L][P], in/out) so
 * that as many slots as possible hold what `old` ([L][P]) holds there. Each
 * GPU keeps its multiset of experts. perm (out, may be NULL) [L][P]: new
 * slot p holds what map's slot perm[p] held. Deterministic: a kept expert
 * stays in the lowest old slots holding it; the rest fill the remaining
 * slots in their original order.
 */
EPXI_HIDDEN epx_status epxi_relabel_map(const epx_shape *shape, const int32_t *old, int32_t *map,
                                        int32_t *perm, epx_error *err);

/*
 * Hand each GPU's planned set of experts, in every layer, to the GPU of its
 * group that keeps the most slots against `old` ([L][P]): per group and
 * layer an exact assignment (Hungarian method, O(n^3) for n GPUs), ties
 * to the planned GPU. Balance is unchanged when the GPUs of a group are
 * interchangeable (one node's). group (in) [G]: a group id in [0, G), or
 * -1 for a GPU left as it is (a failed one). map (in/out) [L][P]; share
 * (in/out, may be NULL) [L][P] moves with its slots. Slot order inside a
 * GPU is kept: relabel afterwards.
 */
EPXI_HIDDEN epx_status epxi_match_gpus(const epx_shape *shape, const int32_t *old,
                                       const int32_t *group, int32_t *map, double *share,
                                       epx_error *err);

/* Check a failed-GPU mask ([G] or NULL) and count live GPUs; fails with
 * EPX_ERR_INVALID_ARG when every GPU is marked failed. */
EPXI_HIDDEN epx_status epxi_count_live(const epx_shape *shape, const uint8_t *failed,
                                       int32_t *num_live, epx_error *err);

/* Balancedness of one layer of `row` [P] for `load` [E] (an expert's load
 * split evenly over its live replicas): mean / max over live GPUs. 1.0 for
 * a layer without load. scratch: >= G + E doubles. */
EPXI_HIDDEN double epxi_layer_balance(const epx_shape *shape, const int32_t *row,
                                      const double *load, const uint8_t *failed, double *scratch);

/*
 * Limit moves in place: `map` [L][P] (in/out) is the target, already
 * relabelled against `old`; reverts changes under `budget`. `load` [L][E]
 * (summed windows). share (in/out, may be NULL) [L][P]: replica weights;
 * experts whose set of slots changed get even shares over live slots.
 */
EPXI_HIDDEN epx_status epxi_limit_moves(const epx_shape *shape, const double *load,
                                        const int32_t *old, int32_t *map, double *share,
                                        const epx_move_budget *budget, epx_move_report *report,
                                        epx_error *err);

/*
 * The planner hook. The planner proper (`place`) fills map/share [L][P]
 * for a shape with opts' algorithm and must ignore current, max_moves,
 * move_price and failed_gpus; when `load` is not NULL it also fills it
 * [L][E] with the load it planned for (its estimate from the windows),
 * which is what moves are valued on. epxi_plan_constrained runs it on the
 * shape of the surviving GPUs when some failed (spreading the result back,
 * dead slots duplicating live experts with share 0), then relabels against
 * opts->current and reverts moves under max_moves / move_price.
 */
typedef epx_status (*epxi_place_fn)(void *ctx, const epx_counts *counts, const epx_shape *shape,
                                    const epx_plan_opts *opts, int32_t *map, double *share,
                                    double *load, epx_error *err);

/* True when opts use an option epxi_plan_constrained serves. */
EPXI_HIDDEN bool epxi_plan_is_constrained(const epx_plan_opts *opts);

/* Check those options against `shape` (names the value and the fix). */
EPXI_HIDDEN epx_status epxi_plan_constraints_check(const epx_shape *shape,
                                                   const epx_plan_opts *opts, epx_error *err);

EPXI_HIDDEN epx_status epxi_plan_constrained(const epx_counts *counts, const epx_shape *shape,
                                             const epx_plan_opts *opts, epxi_place_fn place,
                                             void *place_ctx, int32_t *map, double *share,
                                             epx_error *err);

#endif
