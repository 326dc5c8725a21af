/*
 * plan_internal.h - the seam between the planner's public entry point
 * (plan.c, DeepSeek parity) and epx's own algorithm (epx_*.c). Internal.
 */
#ifndef EPX_PLAN_INTERNAL_H
#define EPX_PLAN_INTERNAL_H

#include "internal.h"

/*
 * epx's own placement for all layers.
 * Args: counts [S][L][E] (windows kept: the estimate is chosen inside);
 *       shape validated; opts validated by the caller (algorithm == EPX);
 *       map_out [L][P] physical_to_logical; share_out [L][P] replica weights.
 * Must never be worse than DeepSeek's placement on the same load and
 * constraints (it may run epxi_deepseek_layer below as a baseline).
 */
EPXI_HIDDEN epx_status epxi_plan_epx(const epx_counts *counts, const epx_shape *shape,
                                     const epx_plan_opts *opts, int32_t *map_out, double *share_out,
                                     epx_error *err);

/*
 * DeepSeek EPLB (deepseek.c), one layer at a time, for the public entry
 * points and as the baseline epx's algorithm must never lose to.
 * A workspace holds every scratch array for one parameter set, so planning
 * L layers allocates once. hierarchical = false is the global policy
 * (groups and nodes ignored, as rebalance_experts_hierarchical(.., 1, 1, ..)).
 */
typedef struct epxi_deepseek epxi_deepseek;

/* Check the parameters as the reference asserts them, with explanations:
 * the groups and nodes of the hierarchical policy. The shape they come from
 * ({1, E, P, gpus, nodes}) must have passed epx_shape_check: the public entry
 * points check it once and internal calls trust it. */
EPXI_HIDDEN epx_status epxi_deepseek_check(int32_t E, int32_t P, int32_t groups, int32_t nodes,
                                           int32_t gpus, bool hierarchical, epx_error *err);
/* A workspace for parameters that passed epxi_deepseek_check. */
EPXI_HIDDEN epx_status epxi_deepseek_create(int32_t E, int32_t P, int32_t groups, int32_t nodes,
                                            int32_t gpus, bool hierarchical, epxi_deepseek **out,
                                            epx_error *err);
EPXI_HIDDEN void epxi_deepseek_destroy(epxi_deepseek *ws);
/* Follow a rule other than DeepSeek's original (the default of a new
 * workspace): the SGLang rules order ties as torch.sort does, and
 * EPX_EPLB_RULE_SGLANG_F64 packs with float64 loads; EPX_EPLB_RULE_VLLM_F64
 * adds groups as numpy does and divides and packs in float64. */
EPXI_HIDDEN void epxi_deepseek_set_rule(epxi_deepseek *ws, epx_eplb_rule rule);

/* order[0..n) = the indices of w [n] (finite, >= 0) in the order
 * torch.sort(descending=True) returns them on the CPU (torch_sort.c). */
EPXI_HIDDEN void epxi_sort_desc_torch(const float *w, int32_t n, int32_t *order);

/*
 * Plan one layer. weight [E] float32, finite, >= 0 (not checked here).
 * p2l [P] (out) physical_to_logical; prank [P] (out, may be NULL) the replica
 * rank of each slot (0 for the first replica of an expert); logcnt [E] (out,
 * may be NULL) replicas per expert. Allocates nothing; not thread-safe on one
 * workspace.
 */
EPXI_HIDDEN void epxi_deepseek_layer(epxi_deepseek *ws, const float *weight, int32_t *p2l,
                                     int32_t *prank, int32_t *logcnt);

/* The load DeepSeek's modes plan for: counts [S][L][E] summed over the S
 * windows (in double, so token counts stay exact, as SGLang's int64 sum) and
 * rounded to float32 into out [L][E]. EPX_ERR_INVALID_ARG when a sum is
 * beyond float32. Counts must have been checked (finite, >= 0). */
EPXI_HIDDEN epx_status epxi_plan_load_f32(const epx_counts *counts, float *out, epx_error *err);

/* torch's CPU float32 sums (torch_sum.c), as SGLang's deepseek_vec gets
 * them. An outer reduction (tensor.sum(0) of a contiguous [rows][cols])
 * adds column `col` in the form epxi_torch_sum_outer_kind names;
 * epxi_torch_sum adds n items a[0], a[stride], .. in that form (INNER:
 * contiguous items, stride ignored). epxi_torch_sum_rows is sum(-1) of a
 * contiguous [rows][n] into out [rows]. */
typedef enum {
    EPXI_TORCH_SUM_CASCADE,
    EPXI_TORCH_SUM_ROW,
    EPXI_TORCH_SUM_INNER
} epxi_torch_sum_kind;
EPXI_HIDDEN epxi_torch_sum_kind epxi_torch_sum_outer_kind(int64_t col, int64_t cols);
EPXI_HIDDEN float epxi_torch_sum(const float *a, int64_t n, int64_t stride,
                                 epxi_torch_sum_kind kind);
EPXI_HIDDEN void epxi_torch_sum_rows(const float *a, int64_t rows, int64_t n, float *out);

/*
 * SGLang's deepseek_vec (deepseek_vec.c): plans on the per-step series
 * counts [S][L][E] (the windows are the steps), global (hier false: one
 * chunk of all P slots) or hierarchical (groups onto nodes first; groups
 * >= 1 must divide E and be a multiple of the nodes, checked by the
 * caller). map [L][P] (out) physical_to_logical; rank [L][P] (out) each
 * slot's position in its expert's logical_to_physical list. Counts must be
 * checked (finite, >= 0). EPX_ERR_INVALID_ARG for a count beyond float32;
 * EPX_ERR_NOMEM.
 */
EPXI_HIDDEN epx_status epxi_deepseek_vec(const epx_counts *counts, const epx_shape *shape,
                                         int32_t groups, bool hier, int32_t *map, int32_t *rank,
                                         epx_error *err);

/*
 * SGLang's elasticity_aware (elastic.c) on the float32 load w [L][E]: with
 * every rank active (failed NULL or all zero) DeepSeek's EPLB under `rule`
 * (global, or hierarchical when hier); with failed ranks, the global policy
 * on the active ranks' slots, each failed rank's slots then holding expert
 * 0 with rank -1 (listed nowhere). groups as epxi_deepseek_check takes
 * them; the caller checked the shape, the mask and that the active slots
 * hold every expert. map, rank [L][P] (out) as for epxi_deepseek_vec.
 */
EPXI_HIDDEN epx_status epxi_elasticity_aware(const float *w, const epx_shape *shape, int32_t groups,
                                             bool hier, const uint8_t *failed, epx_eplb_rule rule,
                                             int32_t *map, int32_t *rank, epx_error *err);

#endif
