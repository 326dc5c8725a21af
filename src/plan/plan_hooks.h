/*
 * plan_hooks.h - what the initialisation entry point needs from the planner:
 * a layout planned with epx's default algorithm from a load. Internal.
 */
#ifndef EPX_PLAN_HOOKS_H
#define EPX_PLAN_HOOKS_H

#include "internal.h"

/* Plan a layout of `shape` for `counts` ([S][L][E], E and L must match the
 * shape) with the default algorithm and default options. */
EPXI_HIDDEN epx_status epxi_plan_default(const epx_counts *counts, const epx_shape *shape,
                                         int32_t num_groups, epx_layout **out, epx_error *err);

#endif
