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
#include <stdlib.h>

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

/* Candidate half-lives, the last being the plain sum. Each one predicts
 * window t from windows 0..t-1 for the last (up to) three t; the error is
 * the squared distance between the predicted and the actual share of each
 * expert, summed over layers and targets. Sampling noise adds the same to
 * every candidate, so what differs is how well each tracks the drift: a
 * workload that moved (recent windows unlike older ones) picks a short
 * half-life, a stationary one the sum. Pooling over layers keeps the choice
 * from fitting one layer's noise. */
static const double HALF_LIVES[] = {0.25, 0.5, 1.0, 2.0, 4.0, HUGE_VAL};
#define NHALF (int)(sizeof HALF_LIVES / sizeof HALF_LIVES[0])

double epxi_choose_half_life(const epx_counts *c, bool *shifted) {
    const int32_t S = c->num_windows, L = c->num_layers, E = c->num_experts;
    if (shifted) *shifted = false;
    if (S < 3) return HUGE_VAL; /* too short to tell a move from noise */
    double err[NHALF] = {0}, last[NHALF] = {0};
    const int32_t first = S - 3 > 1 ? S - 3 : 1;
    double *pred = malloc((size_t)E * sizeof *pred);
    if (pred == NULL) return EPXI_RECENCY_HALF_LIFE; /* no memory to choose: the default */
    for (int i = 0; i < NHALF; i++) {
        const double h = HALF_LIVES[i];
        for (int32_t t = first; t < S; t++)
            for (int32_t l = 0; l < L; l++) {
                const double *act = epx_counts_row(c, t, l);
                double at = 0.0, pt = 0.0;
                for (int32_t e = 0; e < E; e++) at += act[e], pred[e] = 0.0;
                for (int32_t s = 0; s < t; s++) {
                    const double a = isinf(h) ? 1.0 : exp2(-(double)(t - 1 - s) / h);
                    const double *row = epx_counts_row(c, s, l);
                    for (int32_t e = 0; e < E; e++) pred[e] += a * row[e];
                }
                for (int32_t e = 0; e < E; e++) pt += pred[e];
                if (!(at > 0.0) || !(pt > 0.0)) continue;
                for (int32_t e = 0; e < E; e++) {
                    const double d = pred[e] / pt - act[e] / at;
                    err[i] += d * d;
                    if (t == S - 1) last[i] += d * d;
                }
            }
    }
    free(pred);
    /* A shift: the newest window is far from what every half-life predicted
     * for it, much farther than the windows before it were from theirs.
     * Then only the newest window speaks for the next one. */
    const int32_t before = S - 1 - first;
    if (before >= 2) {        /* one earlier error is too noisy a yardstick */
        double lo = HUGE_VAL; /* the smallest ratio over the candidates */
        for (int i = 0; i < NHALF; i++) {
            const double prev = (err[i] - last[i]) / before;
            const double r = prev > 0.0 ? last[i] / prev : 0.0;
            if (r < lo) lo = r;
        }
        if (lo > EPXI_SHIFT_RATIO) {
            if (shifted) *shifted = true;
            return HALF_LIVES[0];
        }
    }
    int best = 0;
    for (int i = 1; i < NHALF; i++)
        if (err[i] < err[best]) best = i;
    return HALF_LIVES[best];
}
