/*
 * epx_comm_gpu.h - the EP engine on GPUs: dispatch and combine
 * of one MoE layer as one kernel launch each, with no host synchronisation
 * and no allocation per batch, so a whole dispatch -> experts -> combine
 * step can be captured in a CUDA graph and replayed (library epx_nccl,
 * built when CUDA is found).
 *
 * The kernels write straight into the peers' buffers through pointers: each
 * rank allocates its buffers at creation, and the ranks exchange handles to
 * them over a bootstrap communicator (any epx_comm: MPI, local, NCCL). The
 * peer-written part lives where the transport puts it (epx_gpu_ep_transport
 * below): device memory used directly within a process or mapped with CUDA
 * IPC across processes (NVLink, or PCIe with P2P; several processes sharing
 * one GPU also work, which is how the protocol is tested on one GPU), or
 * pinned host memory shared between the processes of one host.
 *
 * The protocol is the low-latency mode of epx_comm.h (EPX_EP_MODE_LOW_LATENCY)
 * and gives the entries of the CPU path in the same order, bit for bit,
 * laid out as DeepEP's low-latency receive (expert-major):
 *   dispatch: rank s writes its token t once into row s * M + t of each
 *     destination rank (M = max_tokens), with the token's (local slot,
 *     weight, position) per k, where the position of (t, k) is its rank
 *     among rank s's entries of that slot in (token, k) order; it also
 *     writes its entry count per slot of the destination, and after the
 *     rows a flag (epoch, T) published with a release store. Every block
 *     of the receiver waits for the R flags and copies each received row
 *     straight to its entries' places: local slot l's entries are rows
 *     l * R * M + (entries of l from sources below s) + position of x_out,
 *     in (source, token, k) order -- no grouping pass, no global scan.
 *   combine: the output of entry (s, t, k) goes to row t * K + k of rank s,
 *     then a flag per peer; every block waits for all flags and reduces its
 *     tokens in fp32 in k order (the formula of the host path).
 * Counters and flags live in device memory and advance inside the kernels,
 * so a captured graph replays correctly.
 *
 * Normal mode (EPX_EP_MODE_NORMAL: prefill, large batches) is the same
 * protocol with a compact receive: no row is copied on the receiver. The
 * experts read each row where its sender wrote it (recv.x, rows of
 * recv.x_stride bytes: the inbox, both buffers of the double-buffered
 * areas, so one view serves every dispatch, also inside a graph); entry e,
 * e-th in (local slot, source, token, k) order -- the CPU path's -- reads row
 * recv.entry_token[e] and writes its output to y + e * H. Slot l's entries
 * are recv.slot_offsets[l] .. [l + 1] (device memory, int64; [num_local_slots]
 * is the total), and y holds the most a rank can receive, R * max_tokens *
 * min(top_k, local slots) rows. Nothing comes to the host, so normal mode is
 * capturable too. What it does not do yet, refused by name: a bounded
 * receive (max_recv_*), per-rank partials (combine RANK), fp8, shrink mode,
 * and transports other than PEER (epx_nccl_ep_create does those).
 *
 * Faults. A wait that sees no flag within timeout_ms gives up: the kernel
 * records the failure (which peer, which phase) in device and host-mapped
 * memory, skips its remaining work, and every later launch of the handle
 * returns at once. The host learns it without a synchronisation at the next
 * call (EPX_ERR_TIMEOUT), or from epx_gpu_ep_sync / epx_gpu_ep_health; the
 * bootstrap communicator (when there is one) is then marked failed. A slot
 * outside [-1, P), or a token naming one slot twice (the expert-major rows
 * hold one per token and slot; the CPU path allows it), on any rank travels
 * in band: every rank's receiver sees it, runs no expert for that batch,
 * combine writes zeros, and epx_gpu_ep_sync / epx_gpu_ep_health report
 * EPX_ERR_INVALID_ARG (dispatch and combine do not: they must launch
 * whenever the peers do).
 *
 * Residency. Every block of a launch may wait for flags, so all of a
 * launch's blocks must run at once: a launch takes up to max_blocks (default:
 * as many as fit on the GPU). Kernels running beside it on the same GPU
 * (another stream, other ranks' processes under MPS, several ranks of one
 * process) can keep some of its blocks from starting until the timeout;
 * give those setups a max_blocks that leaves room.
 */
#ifndef EPX_COMM_GPU_H
#define EPX_COMM_GPU_H

#include <cuda_runtime.h>

#include "epx_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Transports: where each rank's peer-written rows and flags live and how the
 * peers reach them. The kernels are the same for all; only the memory moves.
 *   PEER  device memory: the peers' pointers within one process, CUDA IPC
 *         across processes (NVLink, or PCIe with P2P; processes sharing a
 *         GPU). Fastest where the GPUs reach each other by load/store.
 *   HOST  pinned host memory shared between the processes of one host
 *         (POSIX shared memory registered with CUDA): for GPUs that cannot
 *         map each other (PCIe without P2P, different sockets, VMs). Every
 *         byte crosses the host link twice. Needs a shared /dev/shm.
 *   NCCL  ranks on several hosts, any topology NCCL handles: fixed-size
 *         blocks moved by ncclSend/ncclRecv between each phase's kernels;
 *         created by epx_gpu_ep_create_nccl (epx_comm_nccl.h) from an
 *         ncclComm_t (epx_gpu_ep_open/create refuse it: EPX_ERR_UNSUPPORTED).
 *   AUTO  the environment's EPX_GPU_EP_TRANSPORT (auto|peer|ipc|host|nccl)
 *         when set, else HOST when this process sees a GPU its own cannot
 *         reach by peer access (cudaDeviceCanAccessPeer), else PEER. Every
 *         rank must end with the same transport: connect refuses a mix,
 *         and an explicit choice that cannot work, naming both GPUs.
 */
typedef enum epx_gpu_ep_transport {
    EPX_GPU_EP_TRANSPORT_AUTO = 0,
    EPX_GPU_EP_TRANSPORT_PEER = 1,
    EPX_GPU_EP_TRANSPORT_HOST = 2,
    EPX_GPU_EP_TRANSPORT_NCCL = 3
} epx_gpu_ep_transport;

/*
 * Shrink mode (DeepEP's enable_shrink): a peer whose flag does not arrive
 * within timeout_ms is masked instead of failing the handle, and the
 * survivors go on. A masked rank is neither sent to nor waited for; on the
 * receiving side its rows count as absent (dispatch: no entries from it;
 * combine: the shares of its experts are dropped from each token's sum, as
 * if those top-k ids were -1). Every block of a launch takes the same
 * decision about a rank, and every survivor reaches it within a timeout of
 * the rank's silence. The mask is an int32 per rank in device memory,
 * nonzero = masked: the caller's (`mask`, which several handles of the same
 * ranks may share, so a rank masked by one is skipped by all) or the
 * handle's own; epx_gpu_ep_mask_update/_query/_clean reach it in stream
 * order. A masked rank that comes back must be unmasked by every rank at
 * the same point of the call sequence (DeepEP's rule too). Peer and host
 * transports only: NCCL's send/receive cannot skip a dead peer.
 */
typedef struct epx_gpu_ep_opts {
    uint32_t version;   /* EPX_GPU_EP_OPTS_VERSION */
    int32_t timeout_ms; /* a peer's flag not seen within this fails the batch (>= 1) */
    int32_t max_blocks; /* blocks per launch at most; 0 = as many as fit on the GPU at once */
    int32_t transport;  /* epx_gpu_ep_transport; AUTO by default */
    int32_t shrink;     /* 1: shrink mode (above); 0: a timeout is a fault for good */
    int32_t *mask;      /* shrink mode: device int32 [num_ranks], or NULL for the handle's own */
} epx_gpu_ep_opts;

#define EPX_GPU_EP_OPTS_VERSION ((uint32_t)sizeof(epx_gpu_ep_opts))
#define EPX_GPU_EP_OPTS_INIT                                                                       \
    { EPX_GPU_EP_OPTS_VERSION, 10000, 0, EPX_GPU_EP_TRANSPORT_AUTO, 0, NULL }

typedef struct epx_gpu_ep epx_gpu_ep;

/*
 * Device bytes one rank's buffer takes for cfg on num_ranks ranks (the
 * peer-visible rows plus the expert-major receive and output rows; in
 * normal mode the entries and their output rows).
 * Returns: EPX_OK, EPX_ERR_INVALID_ARG / EPX_ERR_SHAPE (config; normal
 *          mode's refusals above), EPX_ERR_OVERFLOW.
 */
EPX_API epx_status epx_gpu_ep_buffer_bytes(const epx_ep_config *cfg, int32_t num_ranks,
                                           size_t *bytes, epx_error *err);

/*
 * Create the engine on the calling thread's current device.
 * Args:    bootstrap (in) borrowed for the handle's lifetime; its ranks are
 *          the EP ranks; used to exchange buffer handles here and in
 *          destroy, never per batch. cfg (in), either mode;
 *          stream (in) borrowed, every launch goes there; opts (in) or NULL.
 *          The kernels are launched with programmatic dependent launch
 *          (each may be scheduled while the kernel before it in the stream
 *          ends, and waits for it before touching memory); the
 *          environment's EPX_GPU_EP_PDL=0 launches them plainly.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (config, opts, ranks whose configs
 *          differ, an EPX_GPU_EP_PDL other than 0 or 1); EPX_ERR_SHAPE;
 *          EPX_ERR_CUDA (allocation, IPC mapping: a peer GPU this one
 *          cannot reach by load/store); the bootstrap's EPX_ERR_COMM/_TIMEOUT.
 * Collective: yes, over bootstrap.
 */
EPX_API epx_status epx_gpu_ep_create(epx_comm *bootstrap, const epx_ep_config *cfg,
                                     cudaStream_t stream, const epx_gpu_ep_opts *opts,
                                     epx_gpu_ep **out, epx_error *err);

/*
 * The same in three steps, for callers that exchange the ranks' handles
 * themselves (torch.distributed, a launcher's key-value store):
 *   epx_gpu_ep_open     allocate this rank's buffer (not collective);
 *   epx_gpu_ep_info     its EPX_GPU_EP_INFO_BYTES bytes for the peers
 *                       (an IPC handle, the process and GPU, the config);
 *   epx_gpu_ep_connect  given every rank's info in rank order, map the
 *                       peers' buffers. A rank whose config or rank count
 *                       differs is refused here, naming both configs.
 *                       In shrink mode an info of EPX_GPU_EP_INFO_BYTES
 *                       zero bytes stands for a rank that never opened
 *                       (it stopped first): it is masked from the start.
 * The caller makes sure every rank connected before any launches; to tear
 * down, every rank disconnects (waits for its stream and unmaps the peers),
 * then after a barrier destroys (frees its buffer, which no peer maps then).
 */
#define EPX_GPU_EP_INFO_BYTES 256
EPX_API epx_status epx_gpu_ep_open(const epx_ep_config *cfg, int32_t rank, int32_t num_ranks,
                                   cudaStream_t stream, const epx_gpu_ep_opts *opts,
                                   epx_gpu_ep **out, epx_error *err);
EPX_API epx_status epx_gpu_ep_info(const epx_gpu_ep *ep, void *info, epx_error *err);
EPX_API epx_status epx_gpu_ep_connect(epx_gpu_ep *ep, const void *infos, epx_error *err);
EPX_API epx_status epx_gpu_ep_disconnect(epx_gpu_ep *ep, epx_error *err);

/* Release: waits for the stream, then (collectively, when created over a
 * healthy bootstrap) makes sure no peer still maps this rank's buffer
 * before freeing it. Accepts NULL. */
EPX_API void epx_gpu_ep_destroy(epx_gpu_ep *ep);

/*
 * Dispatch a batch: one kernel launch on the stream, nothing else.
 * Args:    T: 0 <= T <= max_tokens (checked here, before any launch);
 *          x [T][H] x_dtype, topk_slots [T][K] int32 in [-1, P),
 *          topk_weights [T][K] fp32 or NULL (then entry_weight holds zeros
 *          and combine needs weights), all device memory, read by the
 *          kernel; recv (out) the expert-major views (epx_ep_recv:
 *          slot_stride, slot_counts), or in normal mode the compact ones
 *          (slot_offsets, entry_token), valid until the next dispatch.
 * A dispatch may follow a combine or another dispatch (the peer-written
 * areas are double-buffered, as DeepEP's); a combine needs a whole
 * dispatch before it, and may combine that dispatch again (every rank the
 * same number of times).
 * Returns: EPX_OK (enqueued); EPX_ERR_INVALID_ARG; EPX_ERR_CUDA (launch);
 *          EPX_ERR_TIMEOUT found by an earlier batch's kernels (then nothing
 *          is launched).
 * Collective: yes. Capturable in a CUDA graph.
 */
EPX_API epx_status epx_gpu_ep_dispatch(epx_gpu_ep *ep, int64_t T, const void *x,
                                       const int32_t *topk_slots, const float *topk_weights,
                                       epx_ep_recv *recv, epx_error *err);

/*
 * The same in two halves, for overlapping other work with the exchange
 * (DeepEP's return_recv_hook): parts = EPX_GPU_EP_SEND launches the sending
 * half now, a later call with parts = EPX_GPU_EP_RECV (other arguments
 * ignored) the receiving half; SEND | RECV is epx_gpu_ep_dispatch. Between
 * the halves this handle takes no other call. recv may be NULL.
 */
#define EPX_GPU_EP_SEND 1
#define EPX_GPU_EP_RECV 2
/* Or'ed into dispatch parts: topk_slots points at int64 ids, where every
 * negative id means no expert (DeepEP's topk_idx). */
#define EPX_GPU_EP_IDS64 4
/* Or'ed into dispatch parts (with SEND): fp8 dispatch in DeepEP's form, for
 * bf16 x with hidden a multiple of 128: each row crosses the wire as e4m3
 * values and one fp32 scale per 128 values (amax / 448; ROUND_SCALE: the
 * next power of two; UE8M0, with ROUND_SCALE and hidden a multiple of 512:
 * the scales' exponent bytes, four packed in an int32). The receive then
 * holds, at views.x, the e4m3 rows [local slots][R * max_tokens][hidden]
 * (hidden bytes each) and at views.x_scales the scales column-major, fp32
 * [local slots][hidden / 128][R * max_tokens] (UE8M0: int32 [local
 * slots][hidden / 512][R * max_tokens]). Combine stays in y_dtype; the
 * identity experts dequantise. */
#define EPX_GPU_EP_FP8 8
#define EPX_GPU_EP_ROUND_SCALE 16
#define EPX_GPU_EP_UE8M0 32
EPX_API epx_status epx_gpu_ep_dispatch_parts(epx_gpu_ep *ep, int parts, int64_t T, const void *x,
                                             const int32_t *topk_slots, const float *topk_weights,
                                             epx_ep_recv *recv, epx_error *err);

/* Identity experts (y[e] = x of entry e, converted to y_dtype): one launch
 * over the device-side counts. For tests and benchmarks. */
EPX_API epx_status epx_gpu_ep_identity_experts(epx_gpu_ep *ep, epx_error *err);

/*
 * Combine the last dispatch: one kernel launch; out [T][H] fp32 device
 * (that dispatch's T), bitwise the host path's result for the same expert
 * outputs (the handle's own y, the dispatch's weights). Collective: yes.
 * Capturable.
 */
EPX_API epx_status epx_gpu_ep_combine(epx_gpu_ep *ep, float *out, epx_error *err);

/*
 * Combine with the caller's tensors (DeepEP's low_latency_combine): y (NULL:
 * the handle's own) [num_local_slots][slot_stride][H] y_dtype in the
 * dispatch's expert-major layout; topk_weights [T][K] fp32 (NULL: the
 * dispatch's); out [T][H] of out_dtype (F32, or BF16: the fp32 sum rounded
 * once). Same formula and order as epx_gpu_ep_combine.
 */
EPX_API epx_status epx_gpu_ep_combine_ex(epx_gpu_ep *ep, const void *y, const float *topk_weights,
                                         void *out, epx_dtype out_dtype, epx_error *err);

/* epx_gpu_ep_combine_ex in two halves (as epx_gpu_ep_dispatch_parts): the
 * receiving half writes the out given to the sending half. */
EPX_API epx_status epx_gpu_ep_combine_parts(epx_gpu_ep *ep, int parts, const void *y,
                                            const float *topk_weights, void *out,
                                            epx_dtype out_dtype, epx_error *err);

/* Device views beside the recv view, for bindings (epx.torch.Buffer): all
 * [num_local_slots] x [slot_stride] expert-major, valid for the handle's
 * life; contents belong to the last dispatch. Normal mode: x is the inbox
 * (recv.entry_token indexes it), the per-entry views are compact and
 * slot_stride is 0. */
typedef struct epx_gpu_ep_views {
    void *x;               /* received rows, x_dtype (after an fp8 dispatch: e4m3, see above) */
    void *y;               /* the expert outputs combine sends by default, y_dtype */
    int32_t *counts;       /* [num_local_slots] entries per local slot */
    int32_t *src_token;    /* token index on its source rank, per entry row */
    int64_t *layout_range; /* [num_local_slots][R]: (first row << 32) | entries, per source */
    float *entry_weight;   /* router weight per entry row */
    int64_t slot_stride;   /* R * max_tokens */
    int32_t num_local_slots;
    void *x_scales; /* an fp8 dispatch's scales (NULL where hidden % 128 != 0) */
} epx_gpu_ep_views;
EPX_API epx_status epx_gpu_ep_get_views(const epx_gpu_ep *ep, epx_gpu_ep_views *v, epx_error *err);

/* Launch on `stream` from now on (bindings follow the caller's current
 * stream, as under CUDA-graph capture). The handle's launches stay in order:
 * the new stream first waits for the old one's work (not where either is
 * being captured: there the caller orders them, as torch's capture does).
 * Not collective. */
EPX_API epx_status epx_gpu_ep_set_stream(epx_gpu_ep *ep, cudaStream_t stream, epx_error *err);

/*
 * Promise that no rank dispatches more than `bound` tokens per call from now
 * on (DeepEP's num_max_dispatch_tokens_per_rank, which every rank passes
 * alike): the nccl transport then moves blocks of `bound` tokens instead of
 * max_tokens, so a small batch stops paying for the largest (the other
 * transports move only what a batch holds and just check the promise). A
 * dispatch of more tokens is refused, naming both. Set it before capturing a
 * graph: a captured exchange keeps the size it was captured with. After it
 * a combine needs a new dispatch (the last one's rows may not fit).
 * Args:    1 <= bound <= max_tokens; not between a phase's two halves.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (the bound, the order, or, over nccl,
 *          ranks that set different bounds: every rank gets the error);
 *          EPX_ERR_TIMEOUT/_COMM/_CUDA (nccl: the ranks' check).
 * Collective: over nccl, every rank at the same point of its calls (the
 *          bounds are compared there, on the stream, which this waits for);
 *          otherwise not.
 */
EPX_API epx_status epx_gpu_ep_set_token_bound(epx_gpu_ep *ep, int64_t bound, epx_error *err);

/* Wait for the stream (polling, up to the timeout), then report any fault
 * the kernels recorded. Returns EPX_OK, EPX_ERR_TIMEOUT, EPX_ERR_INVALID_ARG
 * (a bad slot on some rank), EPX_ERR_CUDA. Not collective. */
EPX_API epx_status epx_gpu_ep_sync(epx_gpu_ep *ep, epx_error *err);

/* The first fault the kernels recorded so far, without waiting. */
EPX_API epx_status epx_gpu_ep_health(epx_gpu_ep *ep, epx_error *err);

/*
 * Shrink mode's mask (see epx_gpu_ep_opts), on the handle's stream, so
 * they order with the launches and can be captured in a CUDA graph:
 * update sets rank's entry (masked != 0: masked), query copies all
 * num_ranks entries to `out` (device int32), clean unmasks every rank.
 * Returns EPX_ERR_INVALID_ARG for a handle opened without shrink, a rank
 * outside [0, num_ranks) or a NULL out.
 */
EPX_API epx_status epx_gpu_ep_mask_update(epx_gpu_ep *ep, int32_t rank, int masked, epx_error *err);
EPX_API epx_status epx_gpu_ep_mask_query(epx_gpu_ep *ep, int32_t *out, epx_error *err);
EPX_API epx_status epx_gpu_ep_mask_clean(epx_gpu_ep *ep, epx_error *err);

/* The transport this handle uses: "pointers" (PEER, every rank in this
 * process), "ipc" (PEER across processes), "host", "nccl"; "none" before
 * connect. */
EPX_API const char *epx_gpu_ep_transport_name(const epx_gpu_ep *ep);
/* Kernel launches of one phase: dispatch, combine (1 each). */
EPX_API int32_t epx_gpu_ep_launches(const epx_gpu_ep *ep, const char *phase);

/*
 * DeepEP's normal mode over the engine (epx.torch.Buffer.dispatch/combine):
 * an engine with one slot per rank and top-k = R columns (column r names
 * rank r where the token goes there, else -1) sends each token once to
 * every rank it reaches, and what DeepEP sends beside a token travels in
 * its row's tail. Rows of `width` bf16 columns (python/epx/torch/_normal.py
 * holds the same format in plain torch, the reference these kernels are
 * tested against):
 *   [0, H)  x bf16; fp8: the e4m3 bytes in [0, H/2), fp32 scales per 128
 *           values in [H/2, H/2 + H/64)
 *   [H, H + 2 KCAP)  top-k ids as int32     [H + 2 KCAP, H + 4 KCAP)  weights fp32
 * and after a source's T tokens one count row, sent to every rank:
 * num_tokens_per_rank [R] then num_tokens_per_expert [E], int32.
 * Each call is one launch on `stream`, no host synchronisation.
 */
#define EPX_NORMAL_KCAP 32
typedef struct epx_normal_rows {
    int32_t hidden;      /* H: bf16 values of a token (fp8: its bytes) */
    int32_t width;       /* bf16 columns a row: epx_normal_row_width */
    int32_t num_ranks;   /* R */
    int32_t num_experts; /* E, a multiple of R */
} epx_normal_rows;

/* max(H + 4 KCAP, 2 (R + E)) rounded up to a multiple of 8. */
EPX_API int32_t epx_normal_row_width(int32_t hidden, int32_t num_experts, int32_t num_ranks);

/* The sender: rows stage[0 .. T] and columns[0 .. T][R] from x [T] rows of
 * x_stride elements (bf16; fp8: bytes, with scales[t * s_t + g * s_g]),
 * topk ids [T][K] (int64 when ids64, else int32; NULL: none) and weights
 * [T][K] (NULL: zeros), in_rank [T][R] bool, and per_rank / per_expert
 * for the count row (NULL: left as it is, a cached dispatch). */
EPX_API epx_status epx_normal_pack(const epx_normal_rows *f, int64_t T, int fp8, const void *x,
                                   int64_t x_stride, const float *scales, int64_t s_t, int64_t s_g,
                                   const void *topk_idx, int ids64, int32_t K,
                                   const float *topk_weights, const uint8_t *in_rank,
                                   const int32_t *per_rank, const int32_t *per_expert, void *stage,
                                   int32_t *columns, cudaStream_t stream, epx_error *err);

/* The receiver's counts, from the engine's receive `recv` [rows][width] and
 * layout_range [R] ((first row << 32) | rows, per source, its count row
 * last): prefix [R][R] int32 (DeepEP's rank_prefix_matrix) and counts
 * [1 + E / R] int32: the tokens received, then per local expert the tokens
 * its sources count for it, rounded up to `alignment`. One block. */
EPX_API epx_status epx_normal_counts(const epx_normal_rows *f, const void *recv,
                                     const int64_t *layout_range, int32_t rank, int32_t alignment,
                                     int32_t *prefix, int32_t *counts, cudaStream_t stream,
                                     epx_error *err);

/* The receiver's tensors for n rows (DeepEP's outputs, (source, token)
 * order): x [n][H] bf16 (fp8: bytes, and scales [n][H / 128] fp32), with
 * K > 0 ids [n][K] int64 (local expert, or -1) and weights [n][K] fp32 (0
 * where not local), src [n] int32 (token on its source, from src_info),
 * rows [n] int64 (each token's engine row). Past the tokens received (n
 * above them: DeepEP's num_worst_tokens) rows are zeros, ids -1, src -1,
 * and rows name the last count row. */
EPX_API epx_status epx_normal_unpack(const epx_normal_rows *f, int fp8, const void *recv,
                                     const int64_t *layout_range, const int32_t *src_info,
                                     int32_t rank, int64_t n, int32_t K, void *x, float *scales,
                                     int64_t *ids, float *weights, int32_t *src, int64_t *rows,
                                     cudaStream_t stream, epx_error *err);

/* The combine's rows: y[rows[i]] gets x[i] ([n][H] bf16) and, with weights
 * [n][K] fp32, each weight as three bf16 parts (hi, mid, lo: their fp32 sum
 * (hi + mid) + lo is the weight) in columns H + j K + k. With layout_range
 * (the dispatch's, still the engine's), the rows of tokens received past
 * the n returned (num_worst_tokens too small) are zeroed, so their combine
 * is zeros rather than an earlier batch's rows. */
EPX_API epx_status epx_normal_fill(const epx_normal_rows *f, void *y, const int64_t *rows,
                                   int64_t n, const void *x, const float *weights, int32_t K,
                                   const int64_t *layout_range, cudaStream_t stream,
                                   epx_error *err);

/* DeepEP's combine outputs from the engine's fp32 sums out [T + 1][width]:
 * x [T][H] bf16 = the sum plus bias0 and bias1 ([T][H] bf16 or NULL) in
 * fp32, rounded once; with K > 0 weights [T][K] fp32 = (hi + mid) + lo. */
EPX_API epx_status epx_normal_combined(const epx_normal_rows *f, const float *out, int64_t T,
                                       const void *bias0, const void *bias1, int32_t K, void *x,
                                       float *weights, cudaStream_t stream, epx_error *err);

#ifdef __cplusplus
}
#endif
#endif /* EPX_COMM_GPU_H */
