/*
 * loads.c - per-GPU loads and balancedness, written once for every room:
 * the planner (its search, the move limits, the failed-GPU path), the
 * metrics of src/stats and, through epx_gpu_loads_balance, the CLI and the
 * benchmarks.
 *
 * What must stay true: every caller adds in the same order (a GPU's slots in
 * ascending order, from 0.0; GPUs in ascending order), so a figure computed
 * in the planner and the same figure computed by the metrics are equal to
 * the last bit, and moving a computation here changed no result.
 */
#include "internal.h"

double epxi_layer_gpu_loads(const int32_t *row, const double *load, const double *share,
                            const int32_t *replicas, const uint8_t *failed, int32_t E, int32_t P,
                            int32_t G, int32_t *cnt, double *gpu) {
    const int32_t spg = P / G;
    if (share == NULL && replicas == NULL) {
        /* Replicas on live GPUs; a dead slot carries no load. */
        for (int32_t e = 0; e < E; e++) cnt[e] = 0;
        for (int32_t p = 0; p < P; p++)
            if (failed == NULL || !failed[p / spg]) cnt[row[p]]++;
        replicas = cnt;
    }
    double mx = 0.0;
    for (int32_t g = 0; g < G; g++) {
        double s = 0.0;
        if (failed == NULL || !failed[g])
            for (int32_t p = g * spg; p < (g + 1) * spg; p++)
                s += share != NULL ? load[row[p]] * share[p]
                                   : load[row[p]] / (double)replicas[row[p]];
        gpu[g] = s;
        if (s > mx) mx = s;
    }
    return mx;
}

epxi_gpu_summary epxi_gpu_summarize(const double *gpu, int32_t G, const uint8_t *failed) {
    epxi_gpu_summary s = {0.0, -1.0, 0, 0};
    for (int32_t g = 0; g < G; g++) {
        if (failed != NULL && failed[g]) continue;
        s.live++;
        s.total += gpu[g];
        if (gpu[g] > s.max) {
            s.max = gpu[g];
            s.max_gpu = g;
        }
    }
    return s;
}
