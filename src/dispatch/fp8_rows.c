/*
 * fp8_rows.c - DeepEP's fp8 form of bf16 rows on the CPU (epx/dispatch.h,
 * part 3): the reference of the GPU engine's fp8 dispatch, with the
 * arithmetic numeric.h shares with the kernels.
 */
#include "dispatch_common.h"
#include "internal.h"

static epx_status check_rows(const void *a, const void *b, const void *c, int64_t rows,
                             int64_t hidden, const char *who, epx_error *err) {
    if (a == NULL || b == NULL || c == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "%s: NULL rows, data or scales", who);
    if (rows < 0 || hidden < EPXI_FP8_GROUP || hidden % EPXI_FP8_GROUP != 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "%s: %lld rows of hidden %lld: need rows >= 0 and hidden a multiple of "
                         "%d (one scale per %d values)",
                         who, (long long)rows, (long long)hidden, EPXI_FP8_GROUP, EPXI_FP8_GROUP);
    return EPX_OK;
}

epx_status epx_fp8_cast_rows(const uint16_t *x, int64_t rows, int64_t hidden, int round_scale,
                             uint8_t *data, float *scales, epx_error *err) {
    EPX_TRY(check_rows(x, data, scales, rows, hidden, "epx_fp8_cast_rows", err));
    const int64_t G = hidden / EPXI_FP8_GROUP;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < G; g++) {
            const size_t at = (size_t)(r * hidden + g * EPXI_FP8_GROUP);
            float amax = 0.0f;
            for (int i = 0; i < EPXI_FP8_GROUP; i++)
                amax = fmaxf(amax, fabsf(epxi_bf16_to_f32(x[at + (size_t)i])));
            float scale, factor;
            epxi_fp8_scale(amax, round_scale != 0, &scale, &factor);
            for (int i = 0; i < EPXI_FP8_GROUP; i++)
                data[at + (size_t)i] =
                    epxi_fp8_quantize(epxi_bf16_to_f32(x[at + (size_t)i]), factor);
            scales[r * G + g] = scale;
        }
    return EPX_OK;
}

epx_status epx_fp8_cast_back_rows(const uint8_t *data, const float *scales, int64_t rows,
                                  int64_t hidden, float *out, epx_error *err) {
    EPX_TRY(check_rows(data, scales, out, rows, hidden, "epx_fp8_cast_back_rows", err));
    const int64_t G = hidden / EPXI_FP8_GROUP;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t h = 0; h < hidden; h++)
            out[r * hidden + h] =
                epxi_e4m3_to_f32(data[r * hidden + h]) * scales[r * G + h / EPXI_FP8_GROUP];
    return EPX_OK;
}
