/*
 * ep_experts.c - the reference MoE layer's experts on what an EP dispatch
 * delivered (epx_ep_run_experts): the composition of the EP path (comm)
 * and the MoE reference layer, so it lives in the engine room.
 */
#include "../comm/ep_common.h"

epx_status epx_ep_run_experts(epx_ep *ep, const epx_ep_recv *recv, const epx_moe_expert *experts,
                              float *work, epx_error *err) {
    if (ep == NULL || recv == NULL || (recv->num_entries > 0 && (experts == NULL || work == NULL)))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "EP run_experts needs the handle, the recv view, %d expert views and "
                         "scratch",
                         ep ? epxi_ep_geom_of(ep)->spr : 0);
    if (epxi_ep_geom_of(ep)->cfg.x_dtype != EPX_DTYPE_F32 ||
        epxi_ep_geom_of(ep)->cfg.y_dtype != EPX_DTYPE_F32)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "EP run_experts runs fp32 experts: x_dtype and y_dtype must be "
                         "EPX_DTYPE_F32");
    const int32_t H = epxi_ep_geom_of(ep)->H;
    float *y = recv->y;
    for (int32_t s = 0; s < recv->num_local_slots; s++) {
        int64_t e0 = recv->slot_offsets[s], n = recv->slot_offsets[s + 1] - e0;
        if (n == 0) continue;
        EPX_TRY(epx_moe_expert_forward(&experts[s], H, recv->x,
                                       (int64_t)(recv->x_stride / sizeof(float)),
                                       recv->entry_token + e0, n, y + e0 * H, work, err));
    }
    return EPX_OK;
}
