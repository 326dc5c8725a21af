/*
 * epx_common.c - small helpers the epx_* files share: a stable index sort
 * (radix from 64 keys, merge sort below).
 * (The GPU loads of one layer are core's epxi_layer_gpu_loads, which the
 * metrics use too.)
 */
#include "epx_algo.h"

#include <stdbool.h>
#include <string.h>

/* A double's place in descending order as an unsigned integer: the bits
 * with the sign flipped (all of them for negatives) order as the values do;
 * inverted, they order descending. -0.0 becomes +0.0 first, as the
 * comparison sort sees them equal. */
static inline uint64_t desc_bits(double x) {
    x += 0.0;
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    u ^= (u >> 63) ? ~(uint64_t)0 : (uint64_t)1 << 63;
    return ~u;
}

/* Stable LSD radix sort of idx by desc_bits(key[idx[i]]), a byte per pass,
 * skipping bytes all keys share (loads of one layer share their top bytes).
 * The same order as the merge sort below (stable, descending, ties in
 * input order) with no data-dependent branches: those, mispredicted, were
 * most of the merge sort's time on the few hundred replicas of a layer.
 * Returns false, with idx untouched, if a key is NaN (no order to keep). */
static bool radix_sort_desc(const double *key, int32_t *idx, int32_t n, int32_t *tmp) {
    uint32_t hist[8][256];
    memset(hist, 0, sizeof hist);
    for (int32_t i = 0; i < n; i++) {
        const double x = key[idx[i]];
        if (x != x) return false;
        const uint64_t u = desc_bits(x);
        for (int d = 0; d < 8; d++) hist[d][(u >> (8 * d)) & 255u]++;
    }
    int32_t *src = idx, *dst = tmp;
    for (int d = 0; d < 8; d++) {
        const unsigned shift = 8u * (unsigned)d;
        if (hist[d][(desc_bits(key[src[0]]) >> shift) & 255u] == (uint32_t)n) continue;
        uint32_t at = 0;
        for (int v = 0; v < 256; v++) {
            const uint32_t c = hist[d][v];
            hist[d][v] = at;
            at += c;
        }
        for (int32_t i = 0; i < n; i++)
            dst[hist[d][(desc_bits(key[src[i]]) >> shift) & 255u]++] = src[i];
        int32_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != idx) memcpy(idx, src, (size_t)n * sizeof *idx);
    return true;
}

void epxi_sort_desc(const double *key, int32_t *idx, int32_t n, int32_t *tmp) {
    if (n >= 64 && radix_sort_desc(key, idx, n, tmp)) return;
    /* Bottom-up merge sort: stable, O(n log n), no recursion. Runs of 16
     * are first sorted by insertion (fewer passes over the data), then
     * merged from idx into tmp and back, widths 16, 32, 64, ... */
    enum { RUN = 16 };
    for (int32_t lo = 0; lo < n; lo += RUN) {
        const int32_t hi = lo + RUN < n ? lo + RUN : n;
        for (int32_t i = lo + 1; i < hi; i++) {
            const int32_t v = idx[i];
            const double kv = key[v];
            int32_t j = i;
            while (j > lo && key[idx[j - 1]] < kv) idx[j] = idx[j - 1], j--;
            idx[j] = v;
        }
    }
    int32_t *src = idx, *dst = tmp;
    for (int32_t width = RUN; width < n; width *= 2) {
        for (int32_t lo = 0; lo < n; lo += 2 * width) {
            int32_t mid = lo + width < n ? lo + width : n;
            int32_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            int32_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) dst[k++] = key[src[j]] > key[src[i]] ? src[j++] : src[i++];
            while (i < mid) dst[k++] = src[i++];
            while (j < hi) dst[k++] = src[j++];
        }
        int32_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != idx) memcpy(idx, src, (size_t)n * sizeof *idx);
}
