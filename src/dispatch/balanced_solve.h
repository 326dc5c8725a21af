/*
 * balanced_solve.h - the balanced split's driver and outputs: every component by
 * the solve its size takes (balanced_flows.h, balanced_subsets.h), then each
 * expert's shares and counts and the summary. What the CPU reference
 * (balanced.c) and the CUDA kernel (src/cuda/balanced.cu) include.
 */
#ifndef EPX_DISPATCH_BALANCED_SOLVE_H
#define EPX_DISPATCH_BALANCED_SOLVE_H

#include "balanced_flows.h"
#include "balanced_subsets.h"

/* ---- every component ---------------------------------------------------------- */

/* Component c by whichever solve its size takes, then its rounding; every
 * lane of the caller's warp calls this (nl of them; the CPU: 0 of 1). The
 * max-flows run on lane 0 alone. Sets c_levels[c] and c_rc[c]. */
EPXI_BAL void epxi_bal_solve_comp(epxi_bal *b, int32_t c, int lane, int nl) {
    if (b->c_soff[c] < 0) {
        epxi_bal_solve_part(b, c, lane, nl);
        return;
    }
    epxi_bal_part p = epxi_bal_view(b, c);
    int32_t levels = 0;
    if (epxi_bal_one_expert(b, &p)) {
        if (lane == 0) levels = epxi_bal_one_levels(b, &p);
    } else {
        levels = epxi_bal_subset_levels(b, &p, c, lane, nl);
    }
    if (lane == 0) {
        b->c_levels[c] = levels;
        b->c_rc[c] = EPXI_BAL_OK; /* rounded level by level */
    }
    EPXI_BAL_SYNCWARP();
}

/* Before the components: every GPU and expert unfixed (a GPU in no
 * component keeps -1: load 0), by lane `lane` of nl (the CPU: 0 of 1). */
EPXI_BAL void epxi_bal_unfix(epxi_bal *b, int lane, int nl) {
    for (int32_t i = lane; i < b->M; i += nl) b->f_level[i] = -1;
    for (int32_t g = lane; g < b->G; g += nl) b->g_level[g] = -1;
}

/* The sequential part, once grouped and classified: every component's
 * levels and rounding, in order. Returns EPXI_BAL_OK or the first broken
 * invariant; b->levels counts the levels of all components. */
EPXI_BAL int epxi_bal_solve(epxi_bal *b) {
    epxi_bal_unfix(b, 0, 1);
    epxi_bal_components(b);
    int rc = EPXI_BAL_OK;
    b->levels = 0;
    for (int32_t c = 0; c < b->C && rc == EPXI_BAL_OK; c++) {
        epxi_bal_solve_comp(b, c, 0, 1);
        rc = b->c_rc[c];
        b->levels += b->c_levels[c];
    }
    return rc;
}

/* ---- outputs -------------------------------------------------------------------- */

/* Expert e's row of shares and replica counts (each optional) and its
 * slots' counts (optional; slots no expert lists stay as the caller set
 * them), its listed columns only: the callers zero whole rows first (the
 * kernel's thread per expert writing all W columns, 33 on Kimi-K2.5's
 * layout, made one uncoalesced store per column; on the CPU, column by
 * column, they were most of a small batch's solve). A GPU's k replicas of
 * the expert split its integer count n as n / k, the first n % k columns
 * (in list order) taking one more. Shares: an expert without tokens splits
 * evenly; a one-GPU expert gives each replica 1 / k; a flexible one flow /
 * (den c k). */
EPXI_BAL void epxi_bal_write_expert(const epxi_bal *b, const int32_t *replicas,
                                    const int32_t *num_valid, int32_t e, double *shares,
                                    int64_t *rcounts, int64_t *slot_counts) {
    int32_t W = b->W, D = b->D, n = epxi_bal_nvalid(b, num_valid, e);
    int kind = epxi_bal_kind(b, e);
    int32_t i = b->fidx[e];
    const int32_t *row = replicas + (size_t)e * (size_t)W;
    const int32_t *gl = b->eg_gpu + (size_t)e * (size_t)D;
    const double even = n > 0 ? 1.0 / (double)n : 0.0; /* kind 0's share, one division */
    for (int32_t j = 0; j < n; j++) {
        double share = 0.0;
        int64_t cnt = 0;
        int32_t s = row[j];
        if (kind == 0) share = even;
        if (kind != 0 && s >= 0 && s < b->P && !(kind == 2 && (i < 0 || b->f_level[i] < 0))) {
            int32_t g = s / b->per, k = 0, nth = 0;
            while (k < b->eg_n[e] && gl[k] != g) k++;
            for (int32_t jj = 0; jj < j; jj++) {
                int32_t sj = row[jj];
                nth += sj >= 0 && sj < b->P && sj / b->per == g;
            }
            if (k < b->eg_n[e]) { /* else only with a slot listed twice */
                int64_t mult = b->eg_mult[(size_t)e * (size_t)D + (size_t)k], x;
                if (kind == 1) {
                    share = 1.0 / (double)mult;
                    x = b->cnt[e];
                } else {
                    size_t f = (size_t)i * (size_t)D + (size_t)k;
                    share = (double)b->f_flow[f] /
                            ((double)b->lv_den[b->f_level[i]] * (double)b->cnt[e] * (double)mult);
                    x = b->f_int[f];
                }
                cnt = epxi_bal_div(x, mult) + (nth < epxi_bal_mod(x, mult));
            }
        }
        if (slot_counts && s >= 0 && s < b->P) slot_counts[s] = cnt;
        if (shares) shares[(size_t)e * (size_t)W + (size_t)j] = share;
        if (rcounts) rcounts[(size_t)e * (size_t)W + (size_t)j] = cnt;
    }
}

/* GPU g's load under the shares: its level, or 0. */
EPXI_BAL double epxi_bal_gpu_load(const epxi_bal *b, int32_t g) {
    int32_t lv = b->g_level[g];
    return lv < 0 ? 0.0 : (double)b->lv_num[lv] / (double)b->lv_den[lv];
}

/* Level id lid (a position in c_gpus) is in use when it is among its
 * component's first c_levels ids; 0 if not. */
EPXI_BAL int epxi_bal_level_used(const epxi_bal *b, int32_t lid) {
    if (lid < 0 || b->C == 0 || lid >= b->c_goff[b->C]) return 0;
    int32_t c = b->g_comp[b->c_gpus[lid]];
    return lid - b->c_goff[c] < b->c_levels[c];
}

/* 1 when level lid is in use and no used level before it has the same
 * load: the count of such ids is the number of distinct load levels (two
 * components at one load are one level of the whole). */
EPXI_BAL int epxi_bal_level_new(const epxi_bal *b, int32_t lid) {
    if (!epxi_bal_level_used(b, lid)) return 0;
    for (int32_t k = 0; k < lid; k++)
        if (epxi_bal_level_used(b, k) &&
            b->lv_num[k] * b->lv_den[lid] == b->lv_num[lid] * b->lv_den[k])
            return 0;
    return 1;
}

/* out[0..3] for the largest level a / d (any representation of it: the
 * fraction is reduced here) and n distinct levels. */
EPXI_BAL void epxi_bal_summary_of(int64_t a, int64_t d, int64_t n, int64_t out[4]) {
    const int64_t x = epxi_bal_gcd(a, d);
    out[0] = epxi_bal_div(a, x);
    out[1] = epxi_bal_div(d, x);
    out[2] = epxi_bal_div(a + d - 1, d);
    out[3] = n;
}

/* The optimum as a reduced fraction, its ceiling and the number of
 * distinct levels: out[0..3] = num, den, ceil, levels. distinct < 0: count
 * them here (the kernel passes the count it made in parallel). */
EPXI_BAL void epxi_bal_summary(const epxi_bal *b, int64_t distinct, int64_t out[4]) {
    int64_t a = 0, d = 1, n = 0;
    int32_t L = b->C > 0 ? b->c_goff[b->C] : 0;
    for (int32_t lid = 0; lid < L; lid++) {
        if (!epxi_bal_level_used(b, lid)) continue;
        if (distinct < 0) n += epxi_bal_level_new(b, lid);
        if (b->lv_num[lid] * d > a * b->lv_den[lid]) {
            a = b->lv_num[lid];
            d = b->lv_den[lid];
        }
    }
    epxi_bal_summary_of(a, d, distinct < 0 ? n : distinct, out);
}

#endif /* EPX_DISPATCH_BALANCED_SOLVE_H */
