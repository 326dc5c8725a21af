/*
 * epx_comm.h - communicators, and expert-parallel (EP) dispatch and combine
 * of one MoE layer over them.
 *
 * A communicator is a small table of function pointers (epx_comm_ops) over
 * an engine the caller already runs: MPI on host buffers (epx_comm_mpi.h,
 * library epx_mpi) or NCCL on device buffers (epx_comm_nccl.h, library
 * epx_nccl). epx never launches processes and never owns the caller's
 * MPI_Comm or ncclComm_t; it borrows them. This header is plain C11 and
 * names no MPI, NCCL or CUDA type, so the core library stays free of them.
 * Anyone can write a backend: fill an epx_comm_ops and call epx_comm_create.
 *
 * Failure model. Every collective call finishes, fails or times out; it never
 * waits forever on a peer that died or stopped. A call that fails with
 * EPX_ERR_COMM or EPX_ERR_TIMEOUT poisons the communicator: every later call
 * returns EPX_ERR_COMM naming the first failure, because the peers' states
 * no longer agree. Buffers handed to the failed call may still be written by
 * the engine afterwards; keep them until the process ends or the caller's
 * own engine has been torn down (MPI_Abort, ncclCommAbort).
 *
 * Collective calls: all ranks of the communicator must make the same
 * sequence of collective calls with matching arguments. One thread at a time
 * per communicator (and per EP handle).
 *
 * EP dispatch and combine (epx_ep_*): each rank holds its tokens x [T][H],
 * their physical slots topk_slots [T][K] (the logical->physical dispatch of
 * epx/dispatch.h, or any slot ids) and topk_weights [T][K]. Slot p lives on
 * rank p / (P / R). Dispatch first exchanges counts, then sends every token
 * once to every rank that holds one of its slots, as one record: the row of
 * x and its K (local slot, weight) pairs (slot -1 where that k goes
 * elsewhere). The receiver sees its entries grouped by local slot, runs its
 * experts, and writes one output row per entry; combine sends the outputs
 * back and reduces them per token in fp32 in a fixed order (see
 * epx_ep_combine_mode). Buffers are sized once, from the most tokens a rank
 * sends per batch; dispatch and combine allocate nothing.
 */
#ifndef EPX_COMM_H
#define EPX_COMM_H

#include "epx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types (epx_dtype) and bf16 helpers are in epx.h. */

/* Where a communicator's buffers live. */
typedef enum epx_comm_memory {
    EPX_COMM_MEMORY_HOST = 0,  /* ordinary host memory (MPI) */
    EPX_COMM_MEMORY_DEVICE = 1 /* CUDA device memory, work enqueued on a stream (NCCL) */
} epx_comm_memory;

/*
 * A backend: the operations every communicator provides. `ctx` is the
 * backend's own state, passed back to every call. Each operation is
 * collective and must return (EPX_OK, EPX_ERR_COMM or EPX_ERR_TIMEOUT) within
 * the backend's timeout even if a peer is gone. Device backends may return
 * before the work is done (it runs on their stream); `wait` blocks until it
 * is, with the same timeout rule. Host backends have wait == NULL.
 */
typedef struct epx_comm_ops {
    uint32_t version; /* EPX_COMM_OPS_VERSION */
    const char *name; /* "mpi", "nccl", "local", ... */
    epx_comm_memory memory;
    /*
     * All-to-all with per-peer counts: to peer r send send_counts[r] elements
     * of elem_bytes bytes from send + send_displs[r] * elem_bytes; receive
     * recv_counts[r] elements into recv + recv_displs[r] * elem_bytes. Counts
     * and displacements are [size], in elements. The counts must match the
     * peers' (the EP code exchanges them first).
     */
    epx_status (*alltoallv)(void *ctx, const void *send, const int64_t *send_counts,
                            const int64_t *send_displs, void *recv, const int64_t *recv_counts,
                            const int64_t *recv_displs, size_t elem_bytes, epx_error *err);
    /* recv[i] = sum over ranks of send[i], i < count; send == recv allowed.
     * dtype is EPX_DTYPE_F32, _BF16 (device backends) or _I64. */
    epx_status (*allreduce_sum)(void *ctx, const void *send, void *recv, int64_t count,
                                epx_dtype dtype, epx_error *err);
    epx_status (*barrier)(void *ctx, epx_error *err);
    /* Block until enqueued work is done (device backends), or NULL. */
    epx_status (*wait)(void *ctx, epx_error *err);
    /* Make this rank stop communicating at once: abort the engine's
     * communicator when the engine can (ncclCommAbort), else only mark it.
     * May be NULL. Not collective. */
    void (*abort)(void *ctx);
    /* Release ctx (not the caller's MPI_Comm / ncclComm_t). May be NULL. */
    void (*destroy)(void *ctx);
} epx_comm_ops;

#define EPX_COMM_OPS_VERSION ((uint32_t)sizeof(epx_comm_ops))

typedef struct epx_comm epx_comm;

/*
 * Wrap a backend in a communicator handle.
 * Args:    ops (in) copied; ctx (in) owned by the handle from now on: it is
 *          released with ops->destroy when the handle is destroyed, and also
 *          on failure of this call; rank/size: 0 <= rank < size <= EPX_MAX_GPUS;
 *          out (out) the handle (epx_comm_destroy).
 * Returns: EPX_OK, EPX_ERR_INVALID_ARG (version, missing operations, rank),
 *          EPX_ERR_NOMEM.
 * Thread:  any; not collective.
 */
EPX_API epx_status epx_comm_create(const epx_comm_ops *ops, void *ctx, int32_t rank, int32_t size,
                                   epx_comm **out, epx_error *err);

/* Release a communicator and its backend state. Accepts NULL. Not collective. */
EPX_API void epx_comm_destroy(epx_comm *comm);

/*
 * A one-rank communicator on host memory (copies send to recv). For single
 * process use, tests and the reference path.
 */
EPX_API epx_status epx_comm_create_local(epx_comm **out, epx_error *err);

/*
 * A communicator that forwards to `inner` and fails on purpose: its
 * fail_at-th collective call (1-based, counting alltoallv, allreduce_sum and
 * barrier) returns EPX_ERR_COMM without calling inner, as does every later
 * one. fail_at = 0 never fails. For testing error paths; `inner` stays
 * owned by the caller and must outlive the wrapper.
 */
EPX_API epx_status epx_comm_create_faulty(epx_comm *inner, int64_t fail_at, epx_comm **out,
                                          epx_error *err);

EPX_API int32_t epx_comm_rank(const epx_comm *comm);
EPX_API int32_t epx_comm_size(const epx_comm *comm);
EPX_API const char *epx_comm_name(const epx_comm *comm);
EPX_API epx_comm_memory epx_comm_memory_kind(const epx_comm *comm);

/* The backend state given to epx_comm_create (for a backend's own
 * extensions, such as the NCCL EP path), or NULL. */
EPX_API void *epx_comm_backend_ctx(const epx_comm *comm);

/* EPX_OK while healthy; else the status of the first failure, whose message
 * is copied into err (when non-NULL). */
EPX_API epx_status epx_comm_health(const epx_comm *comm, epx_error *err);

/*
 * The collective operations, with the rules of epx_comm_ops. Each checks
 * its arguments (non-negative counts and displacements; alltoallv's send and
 * receive buffers must differ) and the communicator's health first.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG; EPX_ERR_COMM (engine error, or the
 *          communicator failed earlier); EPX_ERR_TIMEOUT (a peer did not
 *          answer within the backend's timeout).
 * Collective: yes (wait: no).
 */
EPX_API epx_status epx_comm_alltoallv(epx_comm *comm, const void *send, const int64_t *send_counts,
                                      const int64_t *send_displs, void *recv,
                                      const int64_t *recv_counts, const int64_t *recv_displs,
                                      size_t elem_bytes, epx_error *err);
EPX_API epx_status epx_comm_allreduce_sum(epx_comm *comm, const void *send, void *recv,
                                          int64_t count, epx_dtype dtype, epx_error *err);
EPX_API epx_status epx_comm_barrier(epx_comm *comm, epx_error *err);
EPX_API epx_status epx_comm_wait(epx_comm *comm, epx_error *err);

/* Stop this rank's communication now (ops->abort) and poison the handle. */
EPX_API void epx_comm_abort(epx_comm *comm);

/* ---- EP dispatch and combine ------------------------------------------- */

/* The order in which combine reduces a token's expert outputs. */
typedef enum epx_ep_combine_mode {
    /*
     * Each (token, k) output row comes back to the token's rank, which sums
     * acc = 0; for k ascending: acc += w[k] * y[k] in fp32: the order of the
     * single-rank reference (epx_moe_forward), so the result is bitwise
     * equal to it when the experts compute the same rows. Sends one row per
     * remote entry back (up to K per token).
     */
    EPX_EP_COMBINE_TOPK = 0,
    /*
     * Each expert rank first sums its own entries of a token (k ascending,
     * weights applied, fp32), rounds the partial to y_dtype and sends one row
     * per token back; the token's rank adds the partials in ascending rank
     * order. Deterministic and as many bytes back as went out (DeepEP's
     * shape), but not the reference's order: equal to it within rounding.
     */
    EPX_EP_COMBINE_RANK = 1
} epx_ep_combine_mode;

/*
 * How a batch travels.
 *
 * NORMAL (throughput, prefill): counts are exchanged first, then each token
 * goes once to each destination rank, packed densely; buffers hold the
 * worst case or the caller's bound. On a device backend the counts come to
 * the host once per dispatch.
 *
 * LOW_LATENCY (decode): every buffer is sized once from max_tokens; rank
 * src writes its token t into row src * max_tokens + t of each destination,
 * and the counts travel in band with the data (a per-source flag word
 * carrying the batch's epoch), so there is no count exchange, no host
 * synchronisation and no allocation per batch: on the GPU a whole
 * dispatch -> experts -> combine step can be captured in a CUDA graph.
 * Combine is EPX_EP_COMBINE_TOPK; max_recv_* must be 0. On host
 * communicators the receive view's rows are sparse: with S = max_tokens +
 * 1, row i is token i % S of rank i / S (row S - 1 of each rank carries its
 * flag) and num_tokens is the row space R * S. The GPU engine
 * (epx_comm_gpu.h) delivers the expert-major view instead (slot_stride,
 * slot_counts below), with the same entries in the same order.
 */
typedef enum epx_ep_mode { EPX_EP_MODE_NORMAL = 0, EPX_EP_MODE_LOW_LATENCY = 1 } epx_ep_mode;

/* Shape of one EP layer. Initialise from EPX_EP_CONFIG_INIT. */
typedef struct epx_ep_config {
    uint32_t version;   /* set by EPX_EP_CONFIG_INIT */
    int32_t hidden;     /* H >= 1 */
    int32_t top_k;      /* 1 <= K <= EPX_MOE_MAX_TOP_K */
    int32_t num_slots;  /* P, a multiple of the communicator's size */
    int64_t max_tokens; /* most tokens one rank dispatches in a batch, >= 1 */
    epx_dtype x_dtype;  /* dispatched rows: F32 or BF16 */
    epx_dtype y_dtype;  /* expert outputs sent back: F32 or BF16 */
    epx_ep_combine_mode combine;
    /* Receive capacity. 0 = the worst case, R * max_tokens tokens and
     * R * max_tokens * K entries, which can never overflow. A
     * smaller bound saves memory; then dispatch adds one small all-reduce to
     * agree on overflow, and every rank returns EPX_ERR_OVERFLOW when any
     * would receive more. */
    int64_t max_recv_tokens;
    int64_t max_recv_entries;
    epx_ep_mode mode; /* NORMAL (default) or LOW_LATENCY */
} epx_ep_config;

#define EPX_EP_CONFIG_VERSION ((uint32_t)sizeof(epx_ep_config))
#define EPX_EP_CONFIG_INIT                                                                         \
    {                                                                                              \
        EPX_EP_CONFIG_VERSION, 0, 0, 0, 0, EPX_DTYPE_F32, EPX_DTYPE_F32, EPX_EP_COMBINE_TOPK, 0,   \
            0, EPX_EP_MODE_NORMAL                                                                  \
    }

/*
 * Bytes of workspace an EP handle needs for `cfg` on `num_ranks` ranks (host
 * memory for host communicators; the NCCL backend states its own split).
 * Returns: EPX_OK, EPX_ERR_INVALID_ARG / EPX_ERR_SHAPE (config), EPX_ERR_OVERFLOW.
 */
EPX_API epx_status epx_ep_workspace_bytes(const epx_ep_config *cfg, int32_t num_ranks,
                                          size_t *bytes, epx_error *err);

typedef struct epx_ep epx_ep;

/*
 * Create an EP handle on a host communicator.
 * Args:    comm (in) borrowed, must outlive the handle; host memory only;
 *          cfg (in) copied; workspace (in) caller memory of at least
 *          epx_ep_workspace_bytes bytes, 64-byte aligned, borrowed for the
 *          handle's lifetime, or NULL to let the handle allocate it once;
 *          out (out) the handle (epx_ep_destroy).
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (config; a device communicator: use
 *          epx_nccl_ep_create); EPX_ERR_SHAPE (P not a multiple of R);
 *          EPX_ERR_OVERFLOW; EPX_ERR_NOMEM.
 * Collective: no (but every rank needs the same cfg: the first dispatch
 *          compares the ranks' configs, and every rank returns
 *          EPX_ERR_INVALID_ARG naming the field when one differs).
 */
EPX_API epx_status epx_ep_create(epx_comm *comm, const epx_ep_config *cfg, void *workspace,
                                 size_t workspace_bytes, epx_ep **out, epx_error *err);

/* Release an EP handle (not its communicator). Accepts NULL. */
EPX_API void epx_ep_destroy(epx_ep *ep);

/*
 * What a rank received from dispatch: views into the handle, valid until the
 * next dispatch. Entries (one per (token, k) that chose a local slot) are
 * grouped by local slot, and within a slot ordered by source rank, token and
 * k. The expert runner computes, for entry e, the expert of local slot s
 * (slot_offsets[s] <= e < slot_offsets[s+1]) on row entry_token[e] and
 * writes the output into y + e * H (y_dtype).
 */
typedef struct epx_ep_recv {
    int64_t num_tokens; /* rows received */
    const void *x;      /* first row (x_dtype) */
    size_t x_stride;    /* bytes from one row to the next (a record) */
    int64_t num_entries;
    int32_t first_slot;          /* global slot of local slot 0: rank * P/R */
    int32_t num_local_slots;     /* P / R */
    const int64_t *slot_offsets; /* [num_local_slots + 1] into the entries */
    const int32_t *entry_token;  /* [num_entries] received row of each entry */
    const float *entry_weight;   /* [num_entries] its router weight */
    void *y;                     /* [num_entries][H] y_dtype: the expert outputs */
    /*
     * Expert-major views (the GPU low-latency engine, DeepEP's receive
     * layout): local slot s owns rows s * slot_stride .. + slot_counts[s] of
     * x (one copy of the token's row per entry, so a grouped GEMM reads it
     * as it is) and of y, and entry e is row e: entry_token[e] = e is not
     * stored (NULL), entry_weight is indexed by row, slot_offsets is NULL
     * and num_entries -1. slot_stride = R * max_tokens; slot_counts is
     * device memory [num_local_slots]. 0 / NULL for the other paths. The
     * GPU engine's normal mode is compact as above, with its counts on the
     * device: slot_offsets, entry_token, entry_weight and slot_counts are
     * device memory, num_entries -1 (slot_offsets[num_local_slots]) and
     * slot_stride 0 (epx_comm_gpu.h).
     */
    int64_t slot_stride;
    const int32_t *slot_counts;
} epx_ep_recv;

/*
 * Dispatch a batch: exchange counts, then send each token once per
 * destination rank with its (slot, weight) list.
 * Args:    ep (in/out); T: 0 <= T <= max_tokens (ranks may differ);
 *          x (in) [T][H] x_dtype; topk_slots (in) [T][K] int32 in [-1, P),
 *          -1 = no expert for that k; topk_weights (in) [T][K] fp32, copied
 *          for combine; recv (out) the received rows and entries.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (a slot outside [-1, P): names token,
 *          k and slot; T out of range; NULL buffers; configs that differ
 *          between ranks); EPX_ERR_OVERFLOW (a rank's receive capacity,
 *          when set below the worst case); the communicator's EPX_ERR_COMM
 *          / EPX_ERR_TIMEOUT. A batch one rank refuses (host communicators)
 *          still takes part in the first exchange, empty: every rank returns
 *          EPX_ERR_INVALID_ARG for it (the others naming that rank), nothing
 *          is sent, and the next batch goes through.
 * Collective: yes. Allocates nothing.
 */
EPX_API epx_status epx_ep_dispatch(epx_ep *ep, int64_t T, const void *x, const int32_t *topk_slots,
                                   const float *topk_weights, epx_ep_recv *recv, epx_error *err);

/*
 * Combine the batch of the last dispatch: send recv->y back and reduce each
 * token's outputs in fp32 in the order of cfg->combine.
 * Args:    ep (in/out), after epx_ep_dispatch and after the expert runner
 *          filled recv->y; out (out) [T][H] fp32 of that dispatch's T;
 *          tokens with no expert get zeros.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (no dispatch before; or out NULL
 *          with T > 0: the exchange still runs, so the other ranks get
 *          their results, and this rank's is dropped); the communicator's
 *          EPX_ERR_COMM / EPX_ERR_TIMEOUT.
 * Collective: yes. Allocates nothing.
 */
EPX_API epx_status epx_ep_combine(epx_ep *ep, float *out, epx_error *err);

/*
 * Run this rank's experts on what it received, on the CPU in fp32 (both
 * dtypes F32): for each local slot s, experts[s] on its entries' rows, into
 * recv->y (epx_moe_expert_forward's order, so the outputs are bitwise those
 * of the single-rank reference).
 * Args:    ep; recv (in) from the last dispatch; experts (in)
 *          [num_local_slots] views; work (scratch) >= max rows of the views
 *          floats.
 * Returns: EPX_OK, EPX_ERR_INVALID_ARG (dtypes not F32, NULL views).
 */
EPX_API epx_status epx_ep_run_experts(epx_ep *ep, const epx_ep_recv *recv,
                                      const epx_moe_expert *experts, float *work, epx_error *err);

/*
 * Identity experts, for benchmarks and tests of the transport alone: y[e] =
 * the received row entry_token[e], converted from x_dtype to y_dtype.
 * Returns: EPX_OK, EPX_ERR_INVALID_ARG.
 */
EPX_API epx_status epx_ep_identity_experts(epx_ep *ep, const epx_ep_recv *recv, epx_error *err);

/*
 * Bytes this rank sent to other ranks (not to itself) in the last dispatch
 * and combine: rows times row bytes (records for dispatch, y rows for
 * combine), the count of the "bytes moved" figure of `epx bench comm`.
 */
EPX_API void epx_ep_last_bytes(const epx_ep *ep, int64_t *dispatch_bytes, int64_t *combine_bytes);

#ifdef __cplusplus
}
#endif
#endif /* EPX_COMM_H */
