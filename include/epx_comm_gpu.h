/*
 * epx_comm_gpu.h - the low-latency EP engine on GPUs: dispatch and combine
 * of one MoE layer as one kernel launch each, with no host synchronisation
 * and no allocation per batch, so a whole dispatch -> experts -> combine
 * step can be captured in a CUDA graph and replayed (library epx_nccl,
 * built when CUDA is found).
 *
 * The kernels write straight into the peers' buffers through pointers: each
 * rank allocates one buffer at creation, and the ranks exchange handles to
 * them over a bootstrap communicator (any epx_comm: MPI, local, NCCL). Peers
 * in other processes are mapped with CUDA IPC (NVLink, or PCIe with P2P;
 * several processes sharing one GPU also work, which is how the protocol is
 * tested on one GPU); peers in the same process use their pointers directly.
 *
 * The protocol is the low-latency mode of epx_comm.h (EPX_EP_MODE_LOW_LATENCY),
 * the same layout and order as the CPU path epx_ep_* uses on host
 * communicators, so the two agree bit for bit:
 *   dispatch: rank s writes token t into row s * (M + 1) + t of each
 *     destination (M = max_tokens), tagged with the batch's epoch; after a
 *     system-scope fence the last block writes the flag (epoch, T) into row
 *     s * (M + 1) + M. One block of each receiver waits for every source's
 *     flag and groups the tagged rows' entries by local slot, in (source,
 *     token, k) order.
 *   combine: the output of entry (s, t, k) goes to row t * K + k of rank s,
 *     then a flag per peer; every block waits for all flags and reduces its
 *     tokens in fp32 in k order (the formula of the host path).
 * The epoch lives in device memory and advances inside the kernels, so a
 * captured graph replays correctly.
 *
 * Faults. A wait that sees no flag within timeout_ms gives up: the kernel
 * records the failure (which peer, which phase) in device and host-mapped
 * memory, skips its remaining work, and every later launch of the handle
 * returns at once. The host learns it without a synchronisation at the next
 * call (EPX_ERR_TIMEOUT), or from epx_gpu_ep_sync / epx_gpu_ep_health; the
 * bootstrap communicator is then marked failed (epx_comm_health reports it).
 * A slot outside [-1, P) on any rank travels in band: every rank's receiver
 * sees it, runs no expert for that batch and reports EPX_ERR_INVALID_ARG.
 */
#ifndef EPX_COMM_GPU_H
#define EPX_COMM_GPU_H

#include <cuda_runtime.h>

#include "epx_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct epx_gpu_ep_opts {
    uint32_t version;   /* EPX_GPU_EP_OPTS_VERSION */
    int32_t timeout_ms; /* a peer's flag not seen within this fails the batch (>= 1) */
    int32_t max_blocks; /* blocks per launch at most (capped at 65535); 0 = four per SM */
} epx_gpu_ep_opts;

#define EPX_GPU_EP_OPTS_VERSION ((uint32_t)sizeof(epx_gpu_ep_opts))
#define EPX_GPU_EP_OPTS_INIT                                                                       \
    { EPX_GPU_EP_OPTS_VERSION, 10000, 0 }

typedef struct epx_gpu_ep epx_gpu_ep;

/*
 * Device bytes one rank's buffer takes for cfg on num_ranks ranks (the
 * peer-visible rows plus the receiver's own grouping and outputs).
 * Returns: EPX_OK, EPX_ERR_INVALID_ARG / EPX_ERR_SHAPE (config: mode must be
 *          EPX_EP_MODE_LOW_LATENCY), EPX_ERR_OVERFLOW.
 */
EPX_API epx_status epx_gpu_ep_buffer_bytes(const epx_ep_config *cfg, int32_t num_ranks,
                                           size_t *bytes, epx_error *err);

/*
 * Create the engine on the calling thread's current device.
 * Args:    bootstrap (in) borrowed for the handle's lifetime; its ranks are
 *          the EP ranks; used to exchange buffer handles here and in
 *          destroy, never per batch. cfg (in) with mode LOW_LATENCY;
 *          stream (in) borrowed, every launch goes there; opts (in) or NULL.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (config, opts); EPX_ERR_SHAPE;
 *          EPX_ERR_CUDA (allocation, IPC mapping: a peer GPU this one cannot
 *          reach by load/store); the bootstrap's EPX_ERR_COMM/_TIMEOUT.
 * Collective: yes, over bootstrap.
 */
EPX_API epx_status epx_gpu_ep_create(epx_comm *bootstrap, const epx_ep_config *cfg,
                                     cudaStream_t stream, const epx_gpu_ep_opts *opts,
                                     epx_gpu_ep **out, epx_error *err);

/* Release: waits for the stream, then (collectively, when the bootstrap is
 * healthy) makes sure no peer still maps this rank's buffer before freeing
 * it. Accepts NULL. */
EPX_API void epx_gpu_ep_destroy(epx_gpu_ep *ep);

/*
 * Dispatch a batch: one kernel launch on the stream, nothing else.
 * Args:    T: 0 <= T <= max_tokens (checked here, before any launch);
 *          x [T][H] x_dtype, topk_slots [T][K] int32, topk_weights [T][K]
 *          fp32, all device memory, read by the kernel; recv (out) device
 *          views; num_entries is -1 (the count is slot_offsets[spr] on the
 *          device), num_tokens the row space R * (M + 1).
 * Dispatch and combine alternate: a dispatch before the last batch's
 * combine is refused (the peers may still be reading their rows of it).
 * Returns: EPX_OK (enqueued); EPX_ERR_INVALID_ARG; EPX_ERR_CUDA (launch);
 *          EPX_ERR_TIMEOUT / EPX_ERR_INVALID_ARG found by an earlier batch's
 *          kernels (then nothing is launched).
 * Collective: yes. Capturable in a CUDA graph.
 */
EPX_API epx_status epx_gpu_ep_dispatch(epx_gpu_ep *ep, int64_t T, const void *x,
                                       const int32_t *topk_slots, const float *topk_weights,
                                       epx_ep_recv *recv, epx_error *err);

/* Identity experts (y[e] = x of entry e, converted to y_dtype): one launch
 * over the device-side entry count. For tests and benchmarks. */
EPX_API epx_status epx_gpu_ep_identity_experts(epx_gpu_ep *ep, epx_error *err);

/*
 * Combine the last dispatch: one kernel launch; out [T][H] fp32 device
 * (that dispatch's T), bitwise the host path's result for the same expert
 * outputs. Collective: yes. Capturable.
 */
EPX_API epx_status epx_gpu_ep_combine(epx_gpu_ep *ep, float *out, epx_error *err);

/* Wait for the stream (polling, up to the timeout), then report any fault
 * the kernels recorded. Returns EPX_OK, EPX_ERR_TIMEOUT, EPX_ERR_INVALID_ARG
 * (a bad slot on some rank), EPX_ERR_CUDA. Not collective. */
EPX_API epx_status epx_gpu_ep_sync(epx_gpu_ep *ep, epx_error *err);

/* The first fault the kernels recorded so far, without waiting. */
EPX_API epx_status epx_gpu_ep_health(epx_gpu_ep *ep, epx_error *err);

/* Kernel launches of one phase: dispatch, combine (1 each). */
EPX_API int32_t epx_gpu_ep_launches(const epx_gpu_ep *ep, const char *phase);

#ifdef __cplusplus
}
#endif
#endif /* EPX_COMM_GPU_H */
