/*
 * plan_stub.c - placeholder until the planner lands: planning from counts is
 * a clear "not supported yet". Delete when src/plan implements plan_hooks.h.
 */
#include "plan_hooks.h"

epx_status epxi_plan_default(const epx_counts *counts, const epx_shape *shape, int32_t num_groups,
                             epx_layout **out, epx_error *err) {
    (void)counts, (void)shape, (void)num_groups, (void)out;
    return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                     "planning a placement from logical_count is not supported by this build "
                     "yet; pass a physical_to_logical_map");
}
