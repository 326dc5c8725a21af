/*
 * epx_estimate.c - the load a plan is made for. A plan serves the windows
 * that come after it, not the ones it was computed from, so epx treats the
 * [S][L][E] counts as a time series and plans for an estimate of the next
 * window. Every estimate here is scaled like the sum of the S windows (what
 * DeepSeek's modes plan for), so loads and maxima compare across estimates.
 *
 *  SUM       the windows summed, as SGLang and DeepSeek do;
 *  RECENCY   window s weighted 2^(-(S-1-s)/h): the newest counts most, a
 *            window h older half as much (h = half-life in windows);
 *  MEAN_STD  per expert, mean + z * stddev over the windows: experts whose
 *            load swings get headroom (more replicas) in proportion.
 * MINMAX (choose among plans by the sum of per-window maxima) is a choice of
 * plan rather than of load, and lives in epx_plan.c. Which one is the
 * default was settled by back-testing on shared/traces: docs/PLACEMENT.md.
 */
#include "epx_algo.h"

#include <math.h>

void epxi_estimate_layer(const epx_counts *counts, int32_t layer, epx_estimate kind, double param,
                         double *out) {
    const int32_t S = counts->num_windows, E = counts->num_experts;
    for (int32_t e = 0; e < E; e++) out[e] = 0.0;
    if (kind == EPX_ESTIMATE_RECENCY && S > 1) {
        const double h = param > 0.0 ? param : EPXI_RECENCY_HALF_LIFE;
        double wsum = 0.0;
        for (int32_t s = 0; s < S; s++) wsum += exp2(-(double)(S - 1 - s) / h);
        for (int32_t s = 0; s < S; s++) {
            const double a = exp2(-(double)(S - 1 - s) / h) * S / wsum;
            const double *row = epx_counts_row(counts, s, layer);
            for (int32_t e = 0; e < E; e++) out[e] += a * row[e];
        }
        return;
    }
    for (int32_t s = 0; s < S; s++) {
        const double *row = epx_counts_row(counts, s, layer);
        for (int32_t e = 0; e < E; e++) out[e] += row[e];
    }
    if (kind == EPX_ESTIMATE_MEAN_STD && S > 1) {
        const double z = param >= 0.0 ? param : EPXI_MEAN_STD_Z;
        for (int32_t e = 0; e < E; e++) {
            const double mean = out[e] / S;
            double var = 0.0;
            for (int32_t s = 0; s < S; s++) {
                double d = epx_counts_row(counts, s, layer)[e] - mean;
                var += d * d;
            }
            out[e] = S * (mean + z * sqrt(var / S));
        }
    }
}
