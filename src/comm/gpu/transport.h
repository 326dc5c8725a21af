/*
 * transport.h - the one small interface between the low-latency kernels
 * (ll_ep.cu) and how a peer's memory is reached. The kernels see only base
 * pointers: this rank's peer-written area and every peer's, as mapped here.
 * A transport allocates that area, describes it in a handle the peers get in
 * the rank's info, maps a peer's area from its handle, and releases both:
 *   transport_peer.cu  device memory; pointers in a process, CUDA IPC across
 *   transport_host.cu  pinned POSIX shared memory (shm_segment.c)
 * transport_choice.c picks one (epx_gpu_ep_transport in epx_comm_gpu.h) and
 * checks the ranks' choices against each other; it is plain C so CI tests
 * it with faked GPUs.
 */
#ifndef EPX_LL_TRANSPORT_H
#define EPX_LL_TRANSPORT_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shm_segment.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "internal.h"
#include "epx_comm.h"

#define EPXI_TR_HANDLE_BYTES 96

/* The values of epx_gpu_ep_transport (epx_comm_gpu.h; ll_ep.cu checks they
 * agree), here without that header's CUDA types so plain C can use them. */
enum { EPXI_TR_AUTO = 0, EPXI_TR_PEER = 1, EPXI_TR_HOST = 2, EPXI_TR_NCCL = 3 };

/* One rank's peer-written area, as this process holds it. */
typedef struct epxi_area {
    unsigned char *dev; /* what the kernels here use */
    size_t bytes;
    void *host;    /* the host mapping (HOST), else NULL */
    epxi_shm shm;  /* HOST: the segment */
    bool ipc_open; /* PEER: mapped here with cudaIpcOpenMemHandle */
    bool own;      /* allocated by this rank (else a peer's, mapped) */
} epxi_area;

typedef struct epxi_transport_ops {
    const char *name;
    /* this rank's area, zeroed; `users` ranks will map it */
    epx_status (*alloc)(size_t bytes, int32_t users, epxi_area *a, epx_error *err);
    /* the handle peers in other processes map it by */
    epx_status (*handle)(const epxi_area *a, unsigned char h[EPXI_TR_HANDLE_BYTES], epx_error *err);
    /* count in on an area: its own rank and every peer does it once at
     * connect, through its mapping here (NULL: one in this process; HOST
     * removes the segment's name when all have) */
    void (*count_in)(const epxi_area *mapped, const unsigned char h[EPXI_TR_HANDLE_BYTES]);
    /* map a peer's area (another process) */
    epx_status (*map)(const unsigned char h[EPXI_TR_HANDLE_BYTES], size_t bytes, int32_t rank,
                      epxi_area *peer, epx_error *err);
    /* unmap a peer's area, or free this rank's own */
    void (*release)(epxi_area *a);
} epxi_transport_ops;

EPXI_HIDDEN extern const epxi_transport_ops epxi_transport_peer;
EPXI_HIDDEN extern const epxi_transport_ops epxi_transport_host;

/*
 * A staging transport (transport_nccl.cu) maps nothing: every send of a
 * phase is filed in this rank's outbox by destination, and the transport
 * moves the blocks on the stream between the phase's sending and receiving
 * kernels. Peer r's block is outbox + off + r * stride (filed for r) and
 * inbox + off + r * stride (from r), bytes long.
 */
typedef struct epxi_ll_phase_blocks {
    unsigned char *outbox, *inbox;
    int32_t R;
    size_t off, stride, bytes;
} epxi_ll_phase_blocks;
/* Move one phase's blocks, enqueued on `stream` (a cudaStream_t). */
typedef epx_status (*epxi_ll_exchange_fn)(void *ctx, const epxi_ll_phase_blocks *b, void *stream,
                                          epx_error *err);
/* Collective: EPX_OK when every rank passed the same `value`, else an
 * EPX_ERR_INVALID_ARG naming two ranks that differ and their values (`what`
 * names the value). Waits for the answer on `stream`. */
typedef epx_status (*epxi_ll_agree_fn)(void *ctx, int64_t value, const char *what, void *stream,
                                       epx_error *err);
/* A staging transport's operations and their context (freed with the handle). */
typedef struct epxi_ll_staging {
    epxi_ll_exchange_fn exchange;
    epxi_ll_agree_fn agree;
    void *ctx;
} epxi_ll_staging;

/* What every rank of one engine must share, as the ranks compare it. */
typedef struct epxi_ll_shape {
    int32_t ranks, hidden, top_k, num_slots, x_dtype, y_dtype;
    int64_t max_tokens;
    int32_t mode, pad; /* epx_ep_mode: normal mode's receive differs */
} epxi_ll_shape;
/* cfg's shape on R ranks. */
EPXI_HIDDEN epxi_ll_shape epxi_ll_shape_of(const epx_ep_config *cfg, int32_t R);
/* "hidden H, top_k K, ..." for messages that name both ranks' shapes. */
EPXI_HIDDEN void epxi_ll_shape_describe(const epxi_ll_shape *p, char *out, size_t n);

/* The name a transport is written as in EPX_GPU_EP_TRANSPORT and reports. */
EPXI_HIDDEN const char *epxi_transport_kind_name(int32_t kind);

/*
 * The transport a rank opens with: `requested` (epx_gpu_ep_opts.transport)
 * unless AUTO, then `env` (EPX_GPU_EP_TRANSPORT; NULL or "" = unset), then
 * HOST when `unreachable_gpu` >= 0 (a GPU this process sees that its own
 * cannot reach by peer access), else PEER. Returns EPX_OK,
 * EPX_ERR_INVALID_ARG (a value that names no transport: the value and the
 * choices), EPX_ERR_UNSUPPORTED (NCCL: not built yet).
 */
EPXI_HIDDEN epx_status epxi_transport_resolve(int32_t requested, const char *env,
                                              int unreachable_gpu, int32_t *kind, epx_error *err);

/* What connect knows of each rank for the check. */
typedef struct epxi_tr_rank {
    int32_t kind;     /* the transport the rank opened with */
    uint64_t host;    /* the machine (boot id), equal for ranks of one host */
    int32_t device;   /* the GPU's ordinal in its process, for messages */
    uint8_t same_gpu; /* runs on the checking rank's GPU (by UUID) */
    int8_t reach;     /* checking rank's GPU -> this one: 1 peer access, 0 none, -1 unknown
                          (not visible in this process) */
} epxi_tr_rank;

/*
 * Check, on rank `me`, that every rank opened with the same transport and
 * that it can reach every rank: PEER and HOST need one host; PEER needs
 * peer access between different GPUs (unknown is allowed: CUDA IPC's own
 * error names the rank then). Returns EPX_OK or EPX_ERR_INVALID_ARG naming
 * the ranks, their GPUs and transports, and what to set.
 */
EPXI_HIDDEN epx_status epxi_transport_check(int32_t R, int32_t me, const epxi_tr_rank *ranks,
                                            epx_error *err);

/* This machine's id: a hash of its boot id (ranks of one host share it). */
EPXI_HIDDEN uint64_t epxi_host_id(void);

#ifdef __cplusplus
}
#endif
#endif /* EPX_LL_TRANSPORT_H */
