/*
 * test_e4m3.cu - numeric.h's epxi_e4m3x4 in device code (the hardware's
 * paired e4m3 conversion on sm_89 and later, which the engine's fp8 dispatch
 * uses) against epxi_fp8_quantize (the portable form, the CPU reference's),
 * on every 32-bit pattern read as a value: factor 1, so the product is the
 * value itself; NaN, infinities, subnormals and both zeros included. Four
 * consecutive patterns per call, as the kernels pass a word's four values.
 * Exits 77 without a GPU.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda_exit.h"
#include "numeric.h"

/* Every group of four patterns 4 q .. 4 q + 3, q < 2^30: the mismatches
 * counted, the smallest mismatching pattern kept. */
__global__ void compare(unsigned long long *bad, unsigned *first) {
    const uint64_t groups = (uint64_t)1 << 30, step = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t q = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; q < groups; q += step) {
        float f[4];
        uint32_t want = 0;
        for (int j = 0; j < 4; j++) {
            f[j] = __uint_as_float((uint32_t)(4 * q) + (uint32_t)j);
            want |= (uint32_t)epxi_fp8_quantize(f[j], 1.0f) << (8 * j);
        }
        const uint32_t got = epxi_e4m3x4(f, 1.0f);
        if (got != want) {
            atomicAdd(bad, 1ull);
            for (int j = 0; j < 4; j++)
                if (((got ^ want) >> (8 * j) & 0xffu) != 0) atomicMin(first, (unsigned)(4 * q) + j);
        }
    }
}

int main(void) {
    if (cx_no_gpu()) return 77;
    unsigned long long *bad = NULL;
    unsigned *first = NULL;
    CK(cudaMalloc((void **)&bad, sizeof *bad));
    CK(cudaMalloc((void **)&first, sizeof *first));
    CK(cudaMemset(bad, 0, sizeof *bad));
    CK(cudaMemset(first, 0xff, sizeof *first));
    compare<<<1024, 256>>>(bad, first);
    CK(cudaGetLastError());
    unsigned long long nbad = 0;
    unsigned at = 0;
    CK(cudaMemcpy(&nbad, bad, sizeof nbad, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&at, first, sizeof at, cudaMemcpyDeviceToHost));
    CK(cudaFree(bad));
    CK(cudaFree(first));
    if (nbad != 0) {
        float v;
        memcpy(&v, &at, sizeof v);
        printf("FAIL: epxi_e4m3x4 differs from epxi_fp8_quantize on %llu groups of four "
               "patterns; the first at 0x%08x (%.9g)\n",
               nbad, at, (double)v);
        return 1;
    }
    printf("ok: epxi_e4m3x4 equals epxi_fp8_quantize on all 2^32 patterns\n");
    return 0;
}
