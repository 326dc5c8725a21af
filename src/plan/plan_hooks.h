/*
 * plan_hooks.h - what the initialisation entry point needs from the planner:
 * a layout planned from a load, without a copy. Internal.
 */
#ifndef EPX_PLAN_HOOKS_H
#define EPX_PLAN_HOOKS_H

#include "internal.h"

/* Plan a layout of `shape` for `counts` ([S][L][E], E and L must match the
 * shape) with opts (checked by epx_plan_compute) and hand the layout over. */
EPXI_HIDDEN epx_status epxi_plan_layout(const epx_counts *counts, const epx_shape *shape,
                                        const epx_plan_opts *opts, epx_layout **out,
                                        epx_error *err);

#endif
