/*
 * epx_fallback.c - TEMPORARY stand-in for epx's own placement algorithm.
 *
 * It exists only so that EPX_ALGO_EPX (the default) links and plans
 * something valid until epx's algorithm lands in src/plan/epx_*.c; the
 * session that writes it deletes this file. It runs DeepSeek's global policy
 * on the windows' sum, ignores the epx-only options (node_local, estimate,
 * cross_node_budget), splits tokens evenly over replicas, and says so
 * through the log callback, so no figure measured with it can be mistaken
 * for epx's.
 */
#include "plan_internal.h"

epx_status epxi_plan_epx(const epx_counts *counts, const epx_shape *shape,
                         const epx_plan_opts *opts, int32_t *map_out, double *share_out,
                         epx_error *err) {
    epxi_log(opts->log, opts->log_user, EPX_LOG_WARN,
             "epx algorithm not built yet: --algorithm epx falls back to DeepSeek's global "
             "policy (src/plan/epx_fallback.c)");
    const int32_t L = shape->num_layers, E = shape->num_logical_experts;
    const int32_t P = shape->num_physical_experts;
    float *w = epxi_calloc((size_t)L * (size_t)E, sizeof *w, "float32 load", err);
    int32_t *cnt = w ? epxi_calloc((size_t)E, sizeof *cnt, "replica counts", err) : NULL;
    if (cnt == NULL) {
        free(w);
        return err ? err->status : EPX_ERR_NOMEM;
    }
    epxi_deepseek *ws = NULL;
    epx_status st = epxi_plan_load_f32(counts, w, err);
    if (st == EPX_OK)
        st = epxi_deepseek_create(E, P, 1, 1, shape->num_gpus, false, &ws, err);
    for (int32_t l = 0; st == EPX_OK && l < L; l++) {
        int32_t *row = map_out + (size_t)l * (size_t)P;
        epxi_deepseek_layer(ws, w + (size_t)l * (size_t)E, row, NULL, cnt);
        for (int32_t p = 0; p < P; p++)
            share_out[(size_t)l * (size_t)P + (size_t)p] = 1.0 / (double)cnt[row[p]];
    }
    epxi_deepseek_destroy(ws);
    free(cnt);
    free(w);
    return st;
}
