/*
 * numeric.h - arithmetic that host code and CUDA kernels must do bit for bit
 * alike, written once as inline functions marked for both: bf16 <-> fp32,
 * and the one multiply-add of every weighted reduction (no FMA contraction,
 * so a GPU sum equals the CPU's). Internal to libepx; plain C11 and CUDA C++.
 */
#ifndef EPX_NUMERIC_H
#define EPX_NUMERIC_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define EPXI_HD __host__ __device__ __forceinline__
#else
#define EPXI_HD static inline
#endif

/* bf16 -> fp32 is exact: the bf16 bits are the top half of the float. */
EPXI_HD float epxi_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* fp32 -> bf16, round to nearest even; NaN becomes a quiet NaN of the same
 * sign (0x7fc0 / 0xffc0), so no NaN rounds into an infinity. */
EPXI_HD uint16_t epxi_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) & 0x8000u) | 0x7fc0u;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* acc + w * y, rounded after the product and after the sum. Host C11 code
 * is built without contraction (-std=c11 implies -ffp-contract=off); on the
 * device the intrinsics forbid it. */
EPXI_HD float epxi_madd(float acc, float w, float y) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(acc, __fmul_rn(w, y));
#else
    return acc + w * y;
#endif
}

/* Element j of a row of fp32 (bf16 == 0) or bf16 values, as fp32. */
EPXI_HD float epxi_row_load(const void *row, int64_t j, int bf16) {
    if (bf16) return epxi_bf16_to_f32(((const uint16_t *)row)[j]);
    return ((const float *)row)[j];
}

/* Store v as element j of an fp32 or bf16 row (bf16 rounded as above). */
EPXI_HD void epxi_row_store(void *row, int64_t j, float v, int bf16) {
    if (bf16)
        ((uint16_t *)row)[j] = epxi_f32_to_bf16(v);
    else
        ((float *)row)[j] = v;
}

#endif /* EPX_NUMERIC_H */
