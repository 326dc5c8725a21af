/*
 * cuda_exit.h - CK and EK for GPU tests and benchmarks that stop at the
 * first failed call: CK(cudaCall) and EK(epxCall) print the call, its line
 * and the error (EK: the message in the caller's `epx_error er`) and end
 * the program. A test whose calls have no `er` in scope defines
 * EPX_CUDA_EXIT_OWN_EK before including this and writes its own EK.
 * Also the GPU tests' start (they run where libcmocka and so testutil.c are
 * absent): cx_no_gpu() says why a machine has no GPU to test on (ctest's
 * skip code 77 follows), cx_seed() reads and prints EPX_TEST_SEED.
 */
#ifndef EPX_CUDA_EXIT_H
#define EPX_CUDA_EXIT_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

/* Nonzero, after printing "skip: ..." with the reason, when no CUDA device
 * is usable here. */
static inline int cx_no_gpu(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess && n > 0) return 0;
    printf("skip: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 1;
}

/* EPX_TEST_SEED, or `fallback`; printed so a failure can be reproduced. */
static inline uint64_t cx_seed(uint64_t fallback) {
    const char *env = getenv("EPX_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : fallback;
    printf("test seed: %llu (set EPX_TEST_SEED to reproduce)\n", (unsigned long long)seed);
    return seed;
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#ifndef EPX_CUDA_EXIT_OWN_EK
#define EK(call)                                                                                   \
    do {                                                                                           \
        epx_status s_ = (call);                                                                    \
        if (s_ != EPX_OK) {                                                                        \
            fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call, epx_status_str(s_), \
                    er.msg);                                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#endif

#endif /* EPX_CUDA_EXIT_H */
