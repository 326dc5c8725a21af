/*
 * nccl_internal.h - what the NCCL backend's files share: the backend state
 * behind an epx_comm, and the checked wait that turns a dead peer into an
 * error. Not installed; C and CUDA C++ both include it.
 */
#ifndef EPX_NCCL_INTERNAL_H
#define EPX_NCCL_INTERNAL_H

#include <cuda_runtime.h>
#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "comm_internal.h"
#include "cuda_check.h"

#define EPXI_NCCL_MAGIC 0x6e63636cu /* "nccl" */

typedef struct epxi_nccl_ctx {
    uint32_t magic;
    ncclComm_t comm;
    cudaStream_t stream;
    int32_t rank, size, timeout_ms;
    bool aborted;     /* ncclCommAbort was called: never touch comm again */
    int64_t *scratch; /* one device int64 for the barrier */
} epxi_nccl_ctx;

/* The NCCL state of a communicator, or NULL when it is not an NCCL one. */
EPXI_HIDDEN epxi_nccl_ctx *epxi_nccl_ctx_of(const epx_comm *comm);

/* Check an NCCL return; ncclInProgress (non-blocking communicators) is
 * waited out against the timeout. Aborts the communicator on failure. */
EPXI_HIDDEN epx_status epxi_nccl_check(epxi_nccl_ctx *c, ncclResult_t r, const char *what,
                                       epx_error *err);

/* Wait for the stream, polling NCCL's asynchronous error; abort on timeout. */
EPXI_HIDDEN epx_status epxi_nccl_wait(epxi_nccl_ctx *c, const char *what, epx_error *err);

#ifdef __cplusplus
}
#endif
#endif /* EPX_NCCL_INTERNAL_H */
