/*
 * staging.h - how a staging transport opens the engine over its exchange
 * (transport_nccl.cu; test_gpu_ll's in-process stand-in), and the boxes
 * that stand-in copies between. Apart from transport.h, which stays free
 * of CUDA's headers for transport_choice.c.
 */
#ifndef EPX_LL_STAGING_H
#define EPX_LL_STAGING_H

#include "epx_comm_gpu.h"
#include "transport.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A staging transport's engine, connected at once: `ops->exchange` moves
 * each phase's blocks (ops->ctx is freed with the handle). ll_ep.cu. */
EPXI_HIDDEN epx_status epxi_gpu_ep_open_staging(const epx_ep_config *cfg, int32_t rank,
                                                int32_t num_ranks, cudaStream_t stream,
                                                const epx_gpu_ep_opts *opts,
                                                const epxi_ll_staging *ops, epx_gpu_ep **out,
                                                epx_error *err);
/* Testing: the outbox and inbox both phases' blocks live in. */
EPXI_HIDDEN void epxi_gpu_ep_staged_boxes(const epx_gpu_ep *ep, unsigned char **outbox,
                                          unsigned char **inbox);

#ifdef __cplusplus
}
#endif
#endif /* EPX_LL_STAGING_H */
