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
 * is raised): epxi_cuda_dispatch_layout_variant with AUTO. The result is
 * the same for every size. */
EPXI_HIDDEN epx_status epxi_cuda_dispatch_layout_cluster(
    const epx_dispatch_spec *spec, const int32_t *topk_ids, int64_t num_tokens, int32_t topk,
    int32_t num_physical, int32_t num_gpus, int32_t *phys, const epx_token_layout *out, int cluster,
    cudaStream_t stream, epx_error *err);

/* Layout kernels: AUTO = what epx_cuda_dispatch_layout uses (the compact
 * kernel for T * K <= 64 pairs, the cluster kernel above: the H200 variant
 * table in bench/RESULTS.md); CLUSTER = always the original
 * (layout_kernel); MATCH / BALLOT = the
 * compact kernel ranking equal slots with __match_any_sync or with bit
 * ballots (falling back to CLUSTER where it does not fit). */
enum {
    EPXI_LAYOUT_AUTO = 0,
    EPXI_LAYOUT_CLUSTER = 1,
    EPXI_LAYOUT_MATCH = 2,
    EPXI_LAYOUT_BALLOT = 3
};

/* epx_cuda_dispatch_layout with the kernel, the cluster size (0 = the
 * default for T; raised when too small for the 16-bit counters or shared
 * memory) and, for the compact kernel, the pairs per ranking warp (ppw, a
 * power of two >= 32 after rounding up; 0 = 64) chosen. Same result for
 * every choice. */
EPXI_HIDDEN epx_status epxi_cuda_dispatch_layout_variant(
    const epx_dispatch_spec *spec, const int32_t *topk_ids, int64_t num_tokens, int32_t topk,
    int32_t num_physical, int32_t num_gpus, int32_t *phys, const epx_token_layout *out, int variant,
    int cluster, int ppw, cudaStream_t stream, epx_error *err);

#ifdef __cplusplus
}
#endif
#endif
