/*
 * dtype.c - the element types of the API and the bf16 conversions callers
 * see; the arithmetic itself is numeric.h's, shared with the kernels.
 */
#include "internal.h"
#include "numeric.h"

size_t epx_dtype_size(epx_dtype dt) {
    switch (dt) {
    case EPX_DTYPE_F32: return 4;
    case EPX_DTYPE_BF16: return 2;
    case EPX_DTYPE_I32: return 4;
    case EPX_DTYPE_I64: return 8;
    case EPX_DTYPE_U8: return 1;
    }
    return 0;
}

uint16_t epx_bf16_from_f32(float f) { return epxi_f32_to_bf16(f); }

float epx_bf16_to_f32(uint16_t b) { return epxi_bf16_to_f32(b); }
