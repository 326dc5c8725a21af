/*
 * live.c - the replica lists dispatch reads, without the slots of failed
 * GPUs. A plan around failed GPUs keeps their slots filled (copies of live
 * experts, weight 0) so every layout invariant holds; what must not happen
 * is a token routed there. Weighted dispatch follows the weights; static
 * tables and uniform dynamic dispatch follow a replica list, which this
 * builds with the dead slots left out.
 */
#include "migrate_internal.h"

#include <string.h>

epx_status epxi_live_replicas_most(const epx_layout *layout, const uint8_t *failed,
                                   const char *what, int32_t *most, epx_error *err) {
    const epx_shape *s = epx_layout_shape(layout);
    const int32_t E = s->num_logical_experts, spg = s->num_physical_experts / s->num_gpus;
    int32_t W = 0;
    const int32_t *all = epx_layout_logical_to_all_physical(layout, &W);
    const int32_t *nv = epx_layout_num_valid(layout);
    *most = 0;
    for (size_t c = 0; c < (size_t)s->num_layers * (size_t)E; c++) {
        int32_t n = 0;
        for (int32_t k = 0; k < nv[c]; k++)
            n += failed == NULL || !failed[all[c * (size_t)W + (size_t)k] / spg];
        if (n == 0)
            return epxi_fail(err, EPX_ERR_INVALID_MAP,
                             "%s: layer %zu: logical expert %zu has replicas only on failed GPUs "
                             "(GPU %d): plan with failed_gpus (epx plan --failed-gpus) so that "
                             "every expert keeps a live replica",
                             what, c / (size_t)E, c % (size_t)E, all[c * (size_t)W] / spg);
        if (n > *most) *most = n;
    }
    return EPX_OK;
}

epx_status epx_layout_live_replicas(const epx_layout *layout, const uint8_t *failed, int32_t width,
                                    int32_t *replicas, int32_t *num_valid, epx_error *err) {
    if (layout == NULL || replicas == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "layout and replicas must not be NULL");
    const epx_shape *s = epx_layout_shape(layout);
    const int32_t L = s->num_layers, E = s->num_logical_experts, P = s->num_physical_experts;
    const int32_t spg = P / s->num_gpus;
    int32_t W = 0;
    const int32_t *all = epx_layout_logical_to_all_physical(layout, &W);
    const int32_t *nv = epx_layout_num_valid(layout);
    /* The most live replicas first, so a short width fails before any write. */
    int32_t most = 0;
    EPX_TRY(epxi_live_replicas_most(layout, failed, "the layout", &most, err));
    if (width < most)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "width %d is below the most live replicas of an expert (%d): use width "
                         ">= %d (W = P - E + 1 = %d always suffices)",
                         width, most, most, W);
    for (size_t c = 0; c < (size_t)L * (size_t)E; c++) {
        int32_t *out = replicas + c * (size_t)width, n = 0;
        for (int32_t k = 0; k < nv[c]; k++) {
            const int32_t p = all[c * (size_t)W + (size_t)k];
            if (failed == NULL || !failed[p / spg]) out[n++] = p;
        }
        if (num_valid != NULL) num_valid[c] = n;
        for (int32_t k = n; k < width; k++) out[k] = -1;
    }
    return EPX_OK;
}
