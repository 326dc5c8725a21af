/*
 * epx/report.h - the visual report: one self-contained SVG that shows, for
 * several layouts side by side, a heatmap of load per GPU per layer (each
 * on its own colour scale, with a max-load strip on one shared scale), and
 * balancedness per layer with the bound. Include epx.h,
 * not this file.
 */
#ifndef EPX_REPORT_H
#define EPX_REPORT_H

/* One layout to draw. */
typedef struct epx_report_series {
    const char *name;           /* legend label, e.g. "DeepSeek EPLB" */
    const double *gpu_load;     /* [L][G] load per GPU per layer */
    const double *balancedness; /* [L] per layer; < 0 for layers without load */
    double overall;             /* the summary figure printed in the panel title */
} epx_report_series;

/*
 * Write the report as SVG to `path` (atomically).
 * Args:    L, G: layers and GPUs; series (in) [n], 1 <= n <= 6;
 *          bound (in, optional) [L]: the best balancedness any placement can
 *          reach per layer (mean load / lower bound on max load), < 0 where
 *          undefined; title (in) the headline; subtitle (in, optional).
 * Heatmap cells are a GPU's load divided by the layer's mean GPU load, so
 * 1.0 is perfect balance. Each panel has a scale of its own (0 .. its
 * hottest cell, drawn under it), so a nearly balanced layout still shows
 * where its load sits; beside each panel a max-load strip (per layer, the
 * hottest GPU / mean) is on one scale shared by every strip, so the strips
 * compare the layouts.
 * Returns: EPX_OK, EPX_ERR_INVALID_ARG, EPX_ERR_IO, EPX_ERR_NOMEM.
 */
EPX_API epx_status epx_report_write_svg(const char *path, int32_t num_layers, int32_t num_gpus,
                                        const epx_report_series *series, int32_t num_series,
                                        const double *bound, const char *title,
                                        const char *subtitle, epx_error *err);

#endif /* EPX_REPORT_H */
