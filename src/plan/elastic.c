/*
 * elastic.c - SGLang's `elasticity_aware` and `elasticity_aware_hierarchical`
 * EPLB algorithms (sglang/srt/eplb/eplb_algorithms/elasticity_aware.py of
 * 0.5.23), reproduced from a reading of the release, for epx plan
 * --algorithm elasticity-aware[-hierarchical] --active-ranks LIST.
 *
 * For elastic EP, where a GPU (an EP rank) may drop out: with every rank
 * active it is DeepSeek's EPLB as the release runs it (deepseek.c under the
 * release's rule; the hierarchical form when asked). With a rank down it
 * falls back to the global policy over the active ranks alone: the slots
 * of A active ranks (A * P/G of them) are planned as if the cluster had A
 * GPUs on one node, and the k-th active rank takes the k-th planned GPU's
 * slots. A failed rank's slots then hold logical expert 0 in
 * physical_to_logical_map (the release fills them with zeros) but appear in
 * no expert's logical_to_physical list and in no replica count: rank -1
 * here, so the plan's lists and shares (0) leave them out.
 */
#include <string.h>

#include "plan_internal.h"

epx_status epxi_elasticity_aware(const float *w, const epx_shape *shape, int32_t groups, bool hier,
                                 const uint8_t *failed, epx_eplb_rule rule, int32_t *map,
                                 int32_t *rank, epx_error *err) {
    const int32_t L = shape->num_layers, E = shape->num_logical_experts,
                  P = shape->num_physical_experts, G = shape->num_gpus, nloc = P / G;
    int32_t A = G;
    if (failed != NULL) {
        A = 0;
        for (int32_t g = 0; g < G; g++) A += failed[g] == 0;
    }
    const bool all = A == G;
    /* All active: the release's own policy; else global over A GPUs. */
    const int32_t Pa = all ? P : nloc * A;
    epxi_deepseek *ws = NULL;
    if (all)
        EPX_TRY(epxi_deepseek_create(E, P, groups, shape->num_nodes, G, hier, &ws, err));
    else
        EPX_TRY(epxi_deepseek_create(E, Pa, 1, 1, A, false, &ws, err));
    epxi_deepseek_set_rule(ws, rule);
    int32_t *p2l = epxi_calloc(2 * (size_t)Pa, sizeof *p2l, "active slots", err);
    if (p2l == NULL) {
        epxi_deepseek_destroy(ws);
        return EPX_ERR_NOMEM;
    }
    int32_t *prank = p2l + Pa;
    for (int32_t l = 0; l < L; l++) {
        int32_t *row = map + (size_t)l * (size_t)P, *rk = rank + (size_t)l * (size_t)P;
        if (all) {
            epxi_deepseek_layer(ws, w + (size_t)l * (size_t)E, row, rk, NULL);
            continue;
        }
        epxi_deepseek_layer(ws, w + (size_t)l * (size_t)E, p2l, prank, NULL);
        int32_t k = 0; /* the next planned GPU */
        for (int32_t g = 0; g < G; g++) {
            int32_t *dst = row + (size_t)g * (size_t)nloc, *dr = rk + (size_t)g * (size_t)nloc;
            if (failed[g]) {
                for (int32_t j = 0; j < nloc; j++) {
                    dst[j] = 0;
                    dr[j] = -1;
                }
                continue;
            }
            memcpy(dst, p2l + (size_t)k * (size_t)nloc, (size_t)nloc * sizeof *dst);
            memcpy(dr, prank + (size_t)k * (size_t)nloc, (size_t)nloc * sizeof *dr);
            k++;
        }
    }
    free(p2l);
    epxi_deepseek_destroy(ws);
    return EPX_OK;
}
