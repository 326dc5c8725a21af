/*
 * epx_comm_nccl.h - the NCCL communicator (device buffers), EP dispatch and
 * combine on the GPU, and a reference MoE layer on the GPU with cuBLAS
 * (library epx_nccl, built when CUDA and NCCL are found).
 *
 * Ownership. The caller creates the ncclComm_t (one process per GPU, or one
 * thread per GPU in one process, each with its own communicator) and the
 * stream; epx borrows both. epx_nccl_comm_init is an optional helper that
 * creates a communicator the non-blocking way, so a peer that never shows
 * up is a timeout rather than a hang; the unique id travels however the
 * caller likes (MPI_Bcast, or epx_nccl_id_exchange_file below).
 *
 * Streams and waits. Work is enqueued on the communicator's stream; nothing
 * synchronises the device except where a host decision needs device data:
 * EP dispatch waits once, for the exchanged counts (the sizes of the
 * payload sends), and the MoE runner waits once, for the per-slot sizes its
 * grouped GEMM takes on the host. Those waits, and epx_comm_wait, poll
 * cudaStreamQuery and ncclCommGetAsyncError against the timeout; on timeout
 * or on an asynchronous NCCL error they call ncclCommAbort on the caller's
 * communicator and return EPX_ERR_TIMEOUT / EPX_ERR_COMM. After that the
 * caller must not use or destroy that ncclComm_t again. Not graph-capturable
 * for that reason (the counts come to the host), like DeepEP's normal mode.
 *
 * The epx_ep_recv a NCCL dispatch returns holds device pointers (x, the
 * offsets, entries, y), except for the counts num_tokens and num_entries.
 */
#ifndef EPX_COMM_NCCL_H
#define EPX_COMM_NCCL_H

#include <cuda_runtime.h>
#include <nccl.h>

#include "epx_comm.h"
#include "epx_comm_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct epx_comm_nccl_opts {
    uint32_t version;   /* EPX_COMM_NCCL_OPTS_VERSION */
    int32_t timeout_ms; /* for every wait, >= 1 (default 30000) */
} epx_comm_nccl_opts;

#define EPX_COMM_NCCL_OPTS_VERSION ((uint32_t)sizeof(epx_comm_nccl_opts))
#define EPX_COMM_NCCL_OPTS_INIT                                                                    \
    { EPX_COMM_NCCL_OPTS_VERSION, 30000 }

/*
 * Create an NCCL communicator non-blockingly and wait for it with a timeout.
 * Args:    nranks, rank; id (in) the same on every rank; timeout_ms >= 1;
 *          out (out) the communicator, owned by the caller (ncclCommDestroy).
 * Returns: EPX_OK; EPX_ERR_COMM (NCCL's message); EPX_ERR_TIMEOUT (the
 *          half-made communicator is aborted).
 * Collective: yes. The calling thread's current device is used.
 */
EPX_API epx_status epx_nccl_comm_init(int32_t nranks, int32_t rank, const ncclUniqueId *id,
                                      int32_t timeout_ms, ncclComm_t *out, epx_error *err);

/*
 * Share a unique id through a file: rank 0 creates the id and writes it to
 * `path` (atomically, by rename); other ranks wait up to timeout_ms for the
 * file to appear. For launchers without MPI.
 * Returns: EPX_OK, EPX_ERR_IO, EPX_ERR_TIMEOUT, EPX_ERR_COMM.
 */
EPX_API epx_status epx_nccl_id_exchange_file(const char *path, int32_t rank, int32_t timeout_ms,
                                             ncclUniqueId *id, epx_error *err);

/*
 * Wrap a caller's NCCL communicator.
 * Args:    comm (in) borrowed; stream (in) borrowed, the stream all work of
 *          this communicator runs on; opts (in) or NULL; out (out).
 * Returns: EPX_OK, EPX_ERR_INVALID_ARG, EPX_ERR_COMM, EPX_ERR_NOMEM.
 */
EPX_API epx_status epx_comm_nccl_create(ncclComm_t comm, cudaStream_t stream,
                                        const epx_comm_nccl_opts *opts, epx_comm **out,
                                        epx_error *err);

/* ---- the low-latency engine over NCCL ---------------------------------- */

/*
 * The GPU low-latency engine (epx_comm_gpu.h) with the NCCL transport, for
 * ranks that cannot map each other's memory at all (other hosts, or any
 * topology NCCL handles): each phase's sends are filed in this rank's
 * outbox by destination as fixed-size blocks (max_tokens rows per peer for
 * dispatch, max_tokens x top_k rows for combine, counts and flags in band),
 * moved with ncclSend/ncclRecv in one group on the stream, then received by
 * the same kernels. No host synchronisation; capturable in a CUDA graph
 * (NCCL's capture); every rank makes the same calls in the same order, as
 * with every transport. Same results, bit for bit, as the other transports.
 * Args:    comm (in) borrowed, one rank per GPU, must outlive the handle;
 *          cfg, stream, opts (opts->transport ignored) as epx_gpu_ep_create.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (config, ranks whose configs differ,
 *          named); EPX_ERR_SHAPE; EPX_ERR_CUDA; EPX_ERR_COMM (NCCL's words).
 * Collective: yes, over comm (the configs are compared once, here).
 * The handle takes every epx_gpu_ep_* call but info and connect (it maps no
 * peers); epx_gpu_ep_transport_name says "nccl".
 */
EPX_API epx_status epx_gpu_ep_create_nccl(ncclComm_t comm, const epx_ep_config *cfg,
                                          cudaStream_t stream, const epx_gpu_ep_opts *opts,
                                          epx_gpu_ep **out, epx_error *err);

/* ---- EP on the GPU ------------------------------------------------------ */

typedef struct epx_nccl_ep epx_nccl_ep;

/*
 * Device bytes an NCCL EP handle needs (the host side is a few [R] arrays).
 * Same layout rules as the host EP: records of x row + K (slot, weight),
 * capacity from max_tokens or the max_recv_* bounds.
 */
EPX_API epx_status epx_nccl_ep_workspace_bytes(const epx_ep_config *cfg, int32_t num_ranks,
                                               size_t *bytes, epx_error *err);

/*
 * Create a GPU EP handle on an NCCL communicator.
 * Args:    comm (in) from epx_comm_nccl_create, borrowed; cfg (in);
 *          workspace (in) device memory of epx_nccl_ep_workspace_bytes, 256-
 *          byte aligned, or NULL (the handle cudaMallocs it once); out (out).
 * Returns: EPX_OK, EPX_ERR_INVALID_ARG (not an NCCL communicator, config),
 *          EPX_ERR_SHAPE, EPX_ERR_OVERFLOW, EPX_ERR_CUDA, EPX_ERR_NOMEM.
 */
EPX_API epx_status epx_nccl_ep_create(epx_comm *comm, const epx_ep_config *cfg, void *workspace,
                                      size_t workspace_bytes, epx_nccl_ep **out, epx_error *err);

/* Release a GPU EP handle (synchronises its stream first). Accepts NULL. */
EPX_API void epx_nccl_ep_destroy(epx_nccl_ep *ep);

/*
 * Dispatch on the GPU: as epx_ep_dispatch, with x, topk_slots and
 * topk_weights in device memory (read on the stream). A slot outside
 * [-1, P) on any rank is reported on every rank (EPX_ERR_INVALID_ARG): the
 * counts message carries the verdict, so no rank is left waiting.
 * Collective: yes. Waits once on the stream (the counts).
 */
EPX_API epx_status epx_nccl_ep_dispatch(epx_nccl_ep *ep, int64_t T, const void *x,
                                        const int32_t *topk_slots, const float *topk_weights,
                                        epx_ep_recv *recv, epx_error *err);

/*
 * Combine on the GPU into out [T][H] fp32 (device), in the order of
 * cfg->combine, exactly the host path's arithmetic (no FMA contraction), so
 * the same expert outputs give the same bits as epx_ep_combine.
 * Collective: yes. Enqueues only; epx_comm_wait to wait.
 */
EPX_API epx_status epx_nccl_ep_combine(epx_nccl_ep *ep, float *out, epx_error *err);

/* Identity experts on the GPU (see epx_ep_identity_experts). Enqueues only. */
EPX_API epx_status epx_nccl_ep_identity_experts(epx_nccl_ep *ep, const epx_ep_recv *recv,
                                                epx_error *err);

/* Bytes sent to other ranks by the last dispatch and combine. */
EPX_API void epx_nccl_ep_last_bytes(const epx_nccl_ep *ep, int64_t *dispatch_bytes,
                                    int64_t *combine_bytes);

/* ---- a reference MoE layer on the GPU (cuBLAS, bf16 in, fp32 accumulate) - */

typedef struct epx_cuda_moe epx_cuda_moe;

/*
 * Upload a layer to the GPU in bf16: the router, the shared expert, and the
 * routed experts of `num_local` slots (slot_expert[s] = the logical expert
 * held by local slot s).
 * Args:    cfg (in) checked; w (in) fp32 host weights, read once; stream
 *          (in) borrowed; max_rows (in) the most expert rows one run sees
 *          (the EP receive capacity in entries, or T * K), sizes the scratch.
 * Returns: EPX_OK, EPX_ERR_INVALID_ARG, EPX_ERR_CUDA, EPX_ERR_NOMEM.
 */
EPX_API epx_status epx_cuda_moe_create(const epx_moe_config *cfg, const epx_moe_weights *w,
                                       int32_t num_local, const int32_t *slot_expert,
                                       int64_t max_rows, cudaStream_t stream, epx_cuda_moe **out,
                                       epx_error *err);

EPX_API void epx_cuda_moe_destroy(epx_cuda_moe *moe);

/*
 * Router on the GPU: logits [T][E] fp32 = x · router^T (cuBLAS, bf16 in,
 * fp32 accumulate); then epx_moe_route's rule on those logits.
 * Args:    x (in) [T][H] bf16 device; logits (out) [T][E] fp32 device;
 *          ids (out) [T][K] int32 device; weights (out) [T][K] fp32 device.
 *          epx_cuda_moe_route_logits takes logits instead of x (to compare
 *          with the CPU rule on the same logits).
 */
EPX_API epx_status epx_cuda_moe_router(epx_cuda_moe *moe, const uint16_t *x, int64_t T,
                                       float *logits, int32_t *ids, float *weights, epx_error *err);
EPX_API epx_status epx_cuda_moe_route_logits(epx_cuda_moe *moe, const float *logits, int64_t T,
                                             int32_t *ids, float *weights, epx_error *err);

/*
 * Run the local experts on what a NCCL dispatch delivered: gather each
 * slot's rows (bf16), one grouped GEMM for gate and up
 * (cublasGemmGroupedBatchedEx; a loop of cublasGemmEx where the grouped
 * call is unsupported), SwiGLU in fp32 rounded to bf16, one grouped GEMM for
 * down, into recv->y (y_dtype). Waits once on the stream (the slot sizes).
 * Args:    moe; recv (in) from epx_nccl_ep_dispatch; x_dtype, y_dtype the EP
 *          config's.
 */
EPX_API epx_status epx_cuda_moe_run_experts(epx_cuda_moe *moe, const epx_ep_recv *recv,
                                            epx_dtype x_dtype, epx_dtype y_dtype, epx_error *err);

/* out [T][H] fp32 (device) += shared expert (x [T][H] bf16 device). */
EPX_API epx_status epx_cuda_moe_shared_add(epx_cuda_moe *moe, const uint16_t *x, int64_t T,
                                           float *out, epx_error *err);

/* Which GEMM path the last run took: "grouped" or "loop". */
EPX_API const char *epx_cuda_moe_gemm_path(const epx_cuda_moe *moe);

#ifdef __cplusplus
}
#endif
#endif /* EPX_COMM_NCCL_H */
