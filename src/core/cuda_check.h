/*
 * cuda_check.h - the one way CUDA calls are checked in libepx: a failed
 * call becomes EPX_ERR_CUDA with the call's purpose and CUDA's own words,
 * and a stream wait polls against a deadline instead of blocking forever.
 * Included by CUDA sources and by C sources of the GPU libraries only; the
 * core library itself stays free of CUDA.
 */
#ifndef EPX_CUDA_CHECK_H
#define EPX_CUDA_CHECK_H

#include <cuda_runtime.h>
#include <time.h>

#include "internal.h"

/* A CUDA error as an epx error; `what` says what the call was for. */
static inline epx_status epxi_cuda_fail(cudaError_t e, const char *what, epx_error *err) {
    return epxi_fail(err, EPX_ERR_CUDA, "%s failed: %s (%s)", what, cudaGetErrorString(e),
                     cudaGetErrorName(e));
}

/* Return the epx error of a failed CUDA call (needs `err` in scope). */
#define EPXI_CUDA_TRY(call, what)                                                                  \
    do {                                                                                           \
        cudaError_t epxi_ce_ = (call);                                                             \
        if (epxi_ce_ != cudaSuccess) return epxi_cuda_fail(epxi_ce_, (what), err);                 \
    } while (0)

/* The same, to a cleanup label with the status in `st`. */
#define EPXI_CUDA_GOTO(st, call, what, label)                                                      \
    do {                                                                                           \
        cudaError_t epxi_ce_ = (call);                                                             \
        if (epxi_ce_ != cudaSuccess) {                                                             \
            (st) = epxi_cuda_fail(epxi_ce_, (what), err);                                          \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* Wait for `stream` by polling, up to timeout_ms: EPX_ERR_TIMEOUT names
 * `what` when the work is still running then. */
static inline epx_status epxi_cuda_stream_wait(cudaStream_t stream, int64_t timeout_ms,
                                               const char *what, epx_error *err) {
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        cudaError_t q = cudaStreamQuery(stream);
        if (q == cudaSuccess) return EPX_OK;
        if (q != cudaErrorNotReady) return epxi_cuda_fail(q, what, err);
        clock_gettime(CLOCK_MONOTONIC, &now);
        int64_t ms =
            (int64_t)(now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
        if (ms > timeout_ms)
            return epxi_fail(err, EPX_ERR_TIMEOUT,
                             "%s: the stream's work did not finish within %lld ms", what,
                             (long long)timeout_ms);
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
}

#endif /* EPX_CUDA_CHECK_H */
