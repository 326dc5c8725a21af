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
 * constraints (it may call epxi_plan_deepseek_layer as a baseline).
 */
EPXI_HIDDEN epx_status epxi_plan_epx(const epx_counts *counts, const epx_shape *shape,
                                     const epx_plan_opts *opts, int32_t *map_out,
                                     double *share_out, epx_error *err);

#endif
