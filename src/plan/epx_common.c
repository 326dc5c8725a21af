/*
 * epx_common.c - small helpers the epx_* files share: a stable index sort.
 * (The GPU loads of one layer are core's epxi_layer_gpu_loads, which the
 * metrics use too.)
 */
#include "epx_algo.h"

#include <string.h>

void epxi_sort_desc(const double *key, int32_t *idx, int32_t n, int32_t *tmp) {
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
