/*
 * dispatch_cuda.h - internal entry points of src/cuda/dispatch.cu that the
 * GPU tests and bench_dispatch use to exercise choices the public API makes
 * by itself. Not part of the installed API.
 */
#ifndef EPX_DISPATCH_CUDA_H
#define EPX_DISPATCH_CUDA_H

#include "epx_cuda.h"
#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* epx_cuda_dispatch_layout with the cluster size forced to 1, 2, 4 or 8
 * blocks (0 = the default for T; a size too small for the 16-bit counters
 * is raised). The result is the same for every size. */
EPXI_HIDDEN epx_status epxi_cuda_dispatch_layout_cluster(
    const epx_dispatch_spec *spec, const int32_t *topk_ids, int64_t num_tokens, int32_t topk,
    int32_t num_physical, int32_t num_gpus, int32_t *phys, const epx_token_layout *out, int cluster,
    cudaStream_t stream, epx_error *err);

#ifdef __cplusplus
}
#endif
#endif
