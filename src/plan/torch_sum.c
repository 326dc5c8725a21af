/*
 * torch_sum.c - the float32 sums torch computes on the CPU, to the last bit.
 *
 * SGLang's deepseek_vec adds float32 values over the steps of a series
 * (tensor.sum(0)) and over the experts of a group (sum(-1)), then compares
 * the sums: which expert gets the next replica is an argmin over sums that
 * differ in their last bits. torch does not add in a fixed left-to-right
 * order. Its CPU sum (ATen's cascade sum, built for AVX2 on x86: the sum
 * kernels are not dispatched to AVX-512) adds
 *   - runs of at least 16 items into one accumulator, and the runs' sums
 *     into three more levels (the "cascade"), and
 *   - in its "row sum" form, four interleaved cascades (items 0, 4, 8, ..;
 *     1, 5, 9, ..), the leftover items into the first, then the four in turn.
 * Which form a column of a [rows][cols] outer reduction gets depends on the
 * column's index: whole blocks of 4 vectors of 8 floats (32 columns) take
 * the plain cascade, the columns after the last whole block the row sum;
 * with fewer than 8 columns, blocks of 4 columns. An inner (contiguous)
 * reduction of n >= 8 items sums each of the 8 vector lanes as a row sum,
 * then the leftover items, then the lanes. One thread is assumed: torch
 * splits an outer reduction of 32768 elements or more over its threads, and
 * each thread's columns restart the block count (torch.set_num_threads(1)
 * gives this order at any size). Checked against torch 2.11 on random data
 * (rows 1..300, columns 1..130) and through the deepseek_vec goldens.
 */
#include "plan_internal.h"

#define LEVELS 4

/* ceil(log2(x)), at least 1 (c10's CeilLog2). */
static int32_t ceil_log2(int64_t x) {
    if (x <= 2) return 1;
    int32_t b = 0;
    for (uint64_t v = (uint64_t)(x - 1); v != 0; v >>= 1) b++;
    return b;
}

/* The cascade over a[0], a[stride], ... (n items). */
static float cascade(const float *a, int64_t n, int64_t stride) {
    int32_t power = ceil_log2(n) / LEVELS;
    if (power < 4) power = 4;
    const int64_t step = (int64_t)1 << power, mask = step - 1;
    float acc[LEVELS] = {0.0f, 0.0f, 0.0f, 0.0f};
    int64_t i = 0;
    while (i + step <= n) {
        for (int64_t j = 0; j < step; j++, i++) acc[0] += a[i * stride];
        for (int k = 1; k < LEVELS; k++) {
            acc[k] += acc[k - 1];
            acc[k - 1] = 0.0f;
            if ((i & (mask << (k * power))) != 0) break;
        }
    }
    for (; i < n; i++) acc[0] += a[i * stride];
    for (int k = 1; k < LEVELS; k++) acc[0] += acc[k];
    return acc[0];
}

/* The row sum: four interleaved cascades, then the leftovers. */
static float row_sum(const float *a, int64_t n, int64_t stride) {
    const int64_t quads = n / 4;
    float part[4];
    for (int k = 0; k < 4; k++) part[k] = cascade(a + k * stride, quads, 4 * stride);
    for (int64_t i = quads * 4; i < n; i++) part[0] += a[i * stride];
    return ((part[0] + part[1]) + part[2]) + part[3];
}

/* An inner reduction of n contiguous items. */
static float inner_sum(const float *a, int64_t n) {
    enum { LANES = 8 };
    if (n < LANES) return row_sum(a, n, 1);
    const int64_t vecs = n / LANES;
    float acc = 0.0f;
    for (int64_t i = vecs * LANES; i < n; i++) acc += a[i];
    for (int l = 0; l < LANES; l++) acc += row_sum(a + l, vecs, LANES);
    return acc;
}

epxi_torch_sum_kind epxi_torch_sum_outer_kind(int64_t col, int64_t cols) {
    if (cols == 1) return EPXI_TORCH_SUM_INNER;
    const int64_t whole = cols >= 8 ? cols / 32 * 32 : cols / 4 * 4;
    return col < whole ? EPXI_TORCH_SUM_CASCADE : EPXI_TORCH_SUM_ROW;
}

float epxi_torch_sum(const float *a, int64_t n, int64_t stride, epxi_torch_sum_kind kind) {
    switch (kind) {
    case EPXI_TORCH_SUM_CASCADE: return cascade(a, n, stride);
    case EPXI_TORCH_SUM_ROW: return row_sum(a, n, stride);
    case EPXI_TORCH_SUM_INNER: break;
    }
    /* an inner reduction reads contiguous items */
    return inner_sum(a, n);
}

void epxi_torch_sum_rows(const float *a, int64_t rows, int64_t n, float *out) {
    for (int64_t r = 0; r < rows; r++) out[r] = inner_sum(a + r * n, n);
}
