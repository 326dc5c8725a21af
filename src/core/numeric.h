/*
 * numeric.h - arithmetic that host code and CUDA kernels must do bit for bit
 * alike, written once as inline functions marked for both: bf16 <-> fp32,
 * and the one multiply-add of every weighted reduction (no FMA contraction,
 * so a GPU sum equals the CPU's). Internal to libepx; plain C11 and CUDA C++.
 */
#ifndef EPX_NUMERIC_H
#define EPX_NUMERIC_H

#include <math.h>
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

/* Division of a non-negative int32 by a divisor fixed before the launch, as
 * one 64-bit multiply and a shift (Granlund and Montgomery, 1994): with l =
 * ceil(log2 d) and m = ceil(2^(31 + l) / d), n / d = (n * m) >> (31 + l)
 * for every 0 <= n < 2^31, and m < 2^32. A division by a value the compiler
 * does not know costs a kernel ~20 dependent instructions (a reciprocal on
 * the special-function unit, then corrections), on the critical path where
 * one warp routes a token. epxi_divisor(d) needs 1 <= d < 2^31. */
typedef struct {
    uint32_t m;
    uint32_t s; /* 31 + l */
} epxi_divisor_t;

EPXI_HD epxi_divisor_t epxi_divisor(int32_t d) {
    uint32_t l = 0;
    while (l < 31 && ((uint32_t)1 << l) < (uint32_t)d) l++;
    epxi_divisor_t v;
    const uint64_t p = (uint64_t)1 << (31 + l);
    v.m = (uint32_t)((p + (uint64_t)d - 1) / (uint64_t)d);
    v.s = 31 + l;
    return v;
}

EPXI_HD int32_t epxi_div(int32_t n, epxi_divisor_t v) {
    return (int32_t)(((uint64_t)(uint32_t)n * v.m) >> v.s);
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

/* ---- DeepEP's fp8 dispatch form: e4m3 values (the "fn" kind: no
 * infinities, 448 the largest) with one fp32 scale per 128 values, the
 * arithmetic of its kernels and of python/epx/torch/buffer.py's
 * per_token_cast_fp8, so host, device and torch agree bit for bit. ---- */
#define EPXI_FP8_MAX 448.0f
#define EPXI_FP8_GROUP 128

/* v with |v| <= 448 (the caller clamps) -> e4m3 bits, rounded to nearest
 * even, as torch's float8_e4m3fn cast rounds values in range. */
EPXI_HD uint8_t epxi_f32_to_e4m3(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    const uint8_t sign = (uint8_t)((b >> 24) & 0x80u);
    const float a = fabsf(v);
    if (a < 0.015625f) /* below 2^-6: subnormal steps of 2^-9; 8 steps is 2^-6's code */
        return (uint8_t)(sign | (uint8_t)rintf(a * 512.0f));
    int32_t e = (int32_t)((b >> 23) & 0xffu) - 127;
    uint32_t keep = (b & 0x7fffffu) >> 20, rest = b & 0xfffffu;
    if (rest > 0x80000u || (rest == 0x80000u && (keep & 1u))) keep++;
    if (keep == 8u) keep = 0, e++;
    return (uint8_t)(sign | (uint8_t)((uint32_t)(e + 7) << 3) | (uint8_t)keep);
}

EPXI_HD float epxi_e4m3_to_f32(uint8_t c) {
    const int32_t e = (c >> 3) & 15, m = c & 7;
    const float a = e == 0 ? (float)m * 0.001953125f : ldexpf((float)(8 + m), e - 10);
    return (c & 0x80u) ? -a : a;
}

/* A group's scale and the factor its values are multiplied by, from its
 * largest |value|: scale = amax * (float)(1 / 448), factor = 448 / amax
 * (amax at least 1e-4); round_scale: the scale raised to a power of two
 * (from its bits: log2 in float32 can round a scale just above a power of
 * two down to it), the factor its exact inverse. */
EPXI_HD void epxi_fp8_scale(float amax, int round_scale, float *scale, float *factor) {
    if (!(amax >= 1e-4f)) amax = 1e-4f;
    float s = amax * (float)(1.0 / 448.0), f = EPXI_FP8_MAX / amax;
    if (round_scale) {
        uint32_t b;
        memcpy(&b, &s, sizeof b);
        const int32_t e = (int32_t)((b >> 23) & 0xffu) - 127 + ((b & 0x7fffffu) != 0u);
        s = ldexpf(1.0f, e);
        f = 1.0f / s;
    }
    *scale = s;
    *factor = f;
}

/* One value at a group's factor, clamped to +-448: what both conversions
 * below round (NaN becomes -448). */
EPXI_HD float epxi_fp8_clamp(float x, float factor) {
    return fminf(fmaxf(x * factor, -EPXI_FP8_MAX), EPXI_FP8_MAX);
}

/* One value's e4m3 bits at a group's factor (clamped to +-448 first). */
EPXI_HD uint8_t epxi_fp8_quantize(float x, float factor) {
    return epxi_f32_to_e4m3(epxi_fp8_clamp(x, factor));
}

/* Four values at a group's factor as e4m3 bytes (value j in byte j), each
 * as epxi_fp8_quantize gives it. In device code for sm_89 and later the
 * clamped values go through the hardware's paired conversion
 * (cvt.rn.satfinite.e4m3x2: to nearest, ties to even, as epxi_f32_to_e4m3
 * rounds; the clamp first, so NaN takes the portable form's -448 too): two
 * instructions for four values where the portable form takes ~15 with a
 * branch for each. tests/gpu/test_e4m3.cu checks the two forms on every
 * 32-bit pattern. */
EPXI_HD uint32_t epxi_e4m3x4(const float *f, float factor) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    float c[4];
#pragma unroll
    for (int j = 0; j < 4; j++) c[j] = epxi_fp8_clamp(f[j], factor);
    uint16_t lo, hi; /* a conversion's first operand is its upper byte */
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(c[1]), "f"(c[0]));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(c[3]), "f"(c[2]));
    return (uint32_t)lo | (uint32_t)hi << 16;
#else
    uint32_t v = 0;
    for (int j = 0; j < 4; j++) v |= (uint32_t)epxi_fp8_quantize(f[j], factor) << (8 * j);
    return v;
#endif
}

#endif /* EPX_NUMERIC_H */
