/*
 * ll_ep.cu - the GPU EP engine (epx_comm_gpu.h): one kernel per phase over
 * peer pointers, DeepEP's expert-major receive layout (low latency) or a
 * compact one (normal mode), the entries and combine formula of
 * ep_common.h. One translation unit in four files: the device pieces both
 * phases share (ll_device.cuh), the dispatch (ll_dispatch.cuh), the
 * identity experts and the combine (ll_combine.cuh), and here the host
 * side: the buffer's plan, creation and connection, and the calls.
 *
 * One device buffer per rank, carved as:
 *   rows    2 x R * M records  peers write their token rows here, once per
 *                              destination rank: [x row | K x Meta]
 *   cnt     2 x R * spr int32  peers' entry counts per local slot
 *   dflag   2 x R flags        (epoch, T) per source
 *           (twice: by the parity of the epoch, so a rank may dispatch
 *           again before combining, as DeepEP's double buffer allows)
 *   comb    2 x M * K rows     expert outputs of this rank's (t, k)
 *   cflag   2 x R flags        (twice: by the parity of the combine's epoch)
 *   ------------------------------ (above: written by peers)
 *   rx, y   spr * R * M rows   expert-major received rows and outputs
 *   count, pair, srctok, ew, range   per slot / per entry row
 *   work                       the dispatch's items (row, k): entry and pair,
 *                              the combine's list of rows to send
 *   weights, slots             this rank's routing of the running batch
 *   ctl                        epochs, arrival counters, the fault record
 * The peer table (R base pointers, this rank's own among them) sits at the
 * end. Only the kernels touch the buffer per batch. A staging transport
 * (NCCL) lays the peer-written part out by peer instead, one buffer and a
 * block per peer and phase ([flag | counts | rows], [flag | comb rows]:
 * Args::dblk), so each phase moves one piece per peer.
 *
 * Why this layout (issue 24): the first engine grouped the received rows
 * in one block after the exchange (~3.5 us at any batch size). Here the
 * sender computes each entry's position among its own entries of a slot,
 * which needs nothing from other ranks, and sends its counts per slot; so
 * every receiving block can place its rows as soon as the flags are in:
 * row (s, t, k) goes to l * R * M + (entries of l from sources < s) +
 * position. That is (source, token, k) order, the CPU path's, with no
 * grouping pass and no scan across blocks; a token crosses the wire once
 * per destination rank and is copied per entry on the receiver only.
 *
 * Ordering: a block writes its rows and counts with plain stores, then
 * counts itself in with an acquire-release atomic; the last block to arrive
 * publishes the flags (one fence, then a relaxed store each: a release of
 * each); a waiter polls them with acquire loads, so the rows are visible
 * once the flag is. Buffers are
 * reused without clearing, by parity: a rank's dispatch n + 2 writes the
 * areas of dispatch n only after its dispatch n + 1 saw every peer's flag of
 * n + 1, i.e. after every peer's dispatch n finished reading them (one
 * stream per handle keeps a rank's launches in order); combines likewise by
 * their own epochs. Rows a sender did not write this time carry an older
 * tag. A launch's epoch is taken by one atomic per block and advanced by
 * block 0 only once every block has taken it (take_epoch, advance_epoch).
 */
#include <climits>
#include <cstddef>
#include <cstdio>
#include <ctime>
#include <cuda_runtime.h>
#include <pthread.h>
#include <unistd.h>
#include <utility>

#include "comm_internal.h"
#include "ep_common.h"
#include "epx_comm_gpu.h"
#include "cuda_check.h"
#include "pdl.cuh"
#include "transport.h"
#include "staging.h"

#include "ll_device.cuh"
#include "ll_dispatch.cuh"
#include "ll_combine.cuh"

/* What ranks tell each other at creation (EPX_GPU_EP_INFO_BYTES). */
struct PeerInfo {
    char magic[8]; /* kMagic */
    int32_t rank, pid, device;
    uint64_t ptr;        /* the peer-written area as its own process's kernels see it */
    epxi_ll_shape shape; /* the config every rank must share */
    int32_t transport;   /* EPX_GPU_EP_TRANSPORT_PEER or _HOST */
    unsigned char handle[EPXI_TR_HANDLE_BYTES]; /* the transport's (transport.h) */
    unsigned char uuid[16]; /* the GPU's, the same in every process that sees it */
    uint64_t process;       /* this process's random id: pids repeat across hosts and containers */
    uint64_t host;          /* this machine's id (epxi_host_id) */
};
static_assert(sizeof(PeerInfo) <= EPX_GPU_EP_INFO_BYTES, "PeerInfo fits its bytes");
static const char kMagic[8] = "epx-ll5"; /* bump when PeerInfo or the inbox layout changes */
static_assert((int)EPXI_TR_AUTO == (int)EPX_GPU_EP_TRANSPORT_AUTO &&
                  (int)EPXI_TR_PEER == (int)EPX_GPU_EP_TRANSPORT_PEER &&
                  (int)EPXI_TR_HOST == (int)EPX_GPU_EP_TRANSPORT_HOST &&
                  (int)EPXI_TR_NCCL == (int)EPX_GPU_EP_TRANSPORT_NCCL,
              "transport.h's values are epx_gpu_ep_transport's");

/* A random id for this process, drawn once: ranks with the same id share an
 * address space (their pointers work as they are). */
static uint64_t g_process_id;
static void draw_process_id(void) {
    uint64_t v = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (f == NULL || fread(&v, sizeof v, 1, f) != 1) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v = ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20);
    }
    if (f != NULL) fclose(f);
    g_process_id = v | 1; /* never 0 */
}
static uint64_t process_id(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, draw_process_id);
    return g_process_id;
}

struct epx_gpu_ep {
    epx_comm *boot; /* NULL when opened without one (epx_gpu_ep_open) */
    epxi_ep_geom g;
    cudaStream_t stream;
    int32_t timeout_ms;
    int32_t wait_blocks;      /* dispatch blocks: all that wait for flags must be resident */
    int32_t comb_blocks;      /* the same for the combine's (smaller) blocks */
    int32_t small_blocks;     /* and for the small lean dispatch's (kSmallDispatchThreads), */
    int32_t small_fp8;        /* its fp8 form's (dispatch_blocks_per_sm: each its own registers) */
    int32_t host_rows_blocks; /* and the host inbox's one-read receive (kHostRows) */
    int32_t small_comb;       /* ... and the small batch's combine (kSmallCombineThreads) */
    int32_t sms;              /* the GPU's SMs: a combine with fewer items takes the small blocks */
    int pdl;                  /* EPX_GPU_EP_PDL: 1 programmatic dependent launch, 0 plain */
    size_t off_rx, off_y, off_count, off_pair, off_work, off_self, off_srctok, off_ew, off_etok,
        off_offs, off_range, off_weights, off_slots, off_ctl, off_peers, off_mask, off_decided,
        total, inbox_total;
    unsigned char *buf; /* this rank's work area (device memory) */
    /* The peer-written areas (transport.h): this rank's, and the peers' as
     * mapped here (ranks of this process are used through their pointers). */
    const epxi_transport_ops *tr;
    int32_t kind;           /* EPX_GPU_EP_TRANSPORT_PEER or _HOST */
    epxi_area inbox;        /* this rank's */
    epxi_area *areas;       /* host [R]: peers' areas mapped here (none for this process's) */
    unsigned char **mapped; /* host [R]: every rank's area as the kernels here see it */
    bool one_process;       /* every rank in this process (the peer transport's "pointers") */
    bool connected;
    bool was_connected; /* once: the host transport's segment names are gone after it */
    /* staging transports (NCCL): the outbox, the blocks of each phase and
     * the function that moves them (its context is owned here) */
    unsigned char *outbox;
    epxi_ll_phase_blocks wire[2];
    epxi_ll_exchange_fn exchange;
    epxi_ll_agree_fn agree;
    void *exchange_ctx;
    /* tokens per rank a dispatch carries at most (epx_gpu_ep_set_token_bound;
     * max_tokens until set): what a staged block holds, the rest unsent */
    int64_t bound;
    cudaEvent_t chain; /* orders launches across a change of stream (set_stream) */
    uint32_t *host_fault, *host_fault_dev;
    Args a;
    int64_t T;
    /* Where the calls stand: a dispatch may follow a dispatch or a combine
     * (double-buffered), a combine only a whole dispatch; a half sent must
     * be received before anything else. */
    enum { IDLE, D_SENT, DISPATCHED, C_SENT } state;
    int fp8; /* the last dispatch's fp8 bits (kFP8 | ...), for its receive and the experts */
    /* a split combine's receive reuses its send's arguments */
    const float *c_w;
    void *c_out;
    int c_bf16;
    bool reported;
};

/* EPX_GPU_EP_PDL: 1 (unset: the default) launches the kernels with
 * programmatic dependent launch (src/core/pdl.cuh), 0 plainly. */
static epx_status pdl_from_env(int *pdl, epx_error *err) {
    const char *bad = NULL;
    *pdl = 1;
    if (epxi_env_switch("EPX_GPU_EP_PDL", pdl, &bad)) return EPX_OK;
    return epxi_fail(err, EPX_ERR_INVALID_ARG,
                     "EPX_GPU_EP_PDL=%s: give 1 (programmatic dependent launch, the default) "
                     "or 0 (plain launches), or leave it unset",
                     bad);
}

/* One of the engine's kernels on its stream, grid blocks of `threads`, with
 * programmatic dependent launch where ep->pdl asks for it. */
template <typename... P, typename... A>
static cudaError_t launch(const epx_gpu_ep *ep, void (*kernel)(P...), unsigned grid, int threads,
                          A &&...args) {
    return epxi_launch_pdl(ep->pdl, kernel, grid, (unsigned)threads, 0, ep->stream,
                           std::forward<A>(args)...);
}

/* Tokens per rank at most from now on, and so the staged blocks' bytes: a
 * source's records are filed at its token index t (rec_at) and the rows it
 * gets back at t * K + k (comb_at), after the flag and counts, so a block's
 * first bytes up to `bound` of each cover every rank's. */
static void set_bound(epx_gpu_ep *ep, int64_t bound) {
    ep->bound = bound;
    ep->wire[0].bytes = ep->a.drows + (size_t)bound * ep->a.rec;
    ep->wire[1].bytes = kFlagBytes + (size_t)bound * ep->g.K * ep->g.yrow;
}

/* What normal mode (EPX_EP_MODE_NORMAL: the compact receive) does not do
 * yet, refused by name: a bounded receive, per-rank partial sums, more
 * local slots than a block scans in shared memory, and the staging (nccl)
 * transport, whose blocks do not keep the rows at one stride. */
static epx_status check_normal(const epxi_ep_geom *g, bool staging, epx_error *err) {
    const epx_ep_config *c = &g->cfg;
    if (c->max_recv_tokens != 0 || c->max_recv_entries != 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "the GPU engine's normal mode holds the worst case (R * max_tokens "
                         "tokens): set max_recv_tokens (%lld) and max_recv_entries (%lld) to 0, "
                         "or use epx_nccl_ep_create for a bounded receive",
                         (long long)c->max_recv_tokens, (long long)c->max_recv_entries);
    if (c->combine != EPX_EP_COMBINE_TOPK)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "the GPU engine's normal mode combines in top-k order: set combine to "
                         "EPX_EP_COMBINE_TOPK, or use epx_nccl_ep_create for per-rank partials");
    if (g->spr > kMaxLocal)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "the GPU engine's normal mode groups at most %d local slots per rank, "
                         "not %d (num_slots %d / %d ranks): use more ranks or epx_nccl_ep_create",
                         kMaxLocal, g->spr, g->P, g->R);
    if (staging)
        return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                         "the GPU engine's normal mode runs over the peer transport only, not "
                         "nccl: use epx_nccl_ep_create across nodes");
    if (c->max_tokens >= (1ll << 30)) /* a flag's count keeps bit 30 (ll_dispatch.cuh's kRowsIn) */
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "the GPU engine's normal mode takes at most 2^30 - 1 tokens a batch, "
                         "not max_tokens %lld: lower max_tokens",
                         (long long)c->max_tokens);
    return EPX_OK;
}

/* The buffer layout, shared by the size query and creation. */
static epx_status plan(epx_gpu_ep *ep, const epx_ep_config *cfg, int32_t R, bool staging,
                       epx_error *err) {
    EPX_TRY(epxi_ep_geom_init(cfg, R, &ep->g, err));
    const epxi_ep_geom *g = &ep->g;
    if (R > kMaxRanks - 1)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "the GPU low-latency engine serves at most %d ranks, not %d",
                         kMaxRanks - 1, R);
    /* Normal mode: the same protocol with a compact receive (Args::compact). */
    const bool compact = !g->low_latency;
    if (compact) EPX_TRY(check_normal(g, staging, err));
    const double M = (double)g->M, K = g->K, RM = (double)R * M, spr = g->spr;
    /* Entry rows: normal mode holds the most this rank can receive, R *
     * max_tokens tokens of min(top_k, local slots) entries each. */
    const double NE = compact ? RM * (K < spr ? K : spr) : spr * RM;
    if (compact && 2.0 * RM >= 2147483647.0)
        return epxi_fail(err, EPX_ERR_OVERFLOW,
                         "the GPU engine's normal mode indexes 2 * R * max_tokens = %.0f inbox "
                         "rows in int32: lower max_tokens (%lld)",
                         2.0 * RM, (long long)g->M);
    /* Entry rows are int32 (pair = (source * M + token) * K + k). */
    if (RM * K >= 2147483647.0 || RM * spr >= 9.0e15)
        return epxi_fail(err, EPX_ERR_OVERFLOW,
                         "the GPU low-latency engine indexes R * max_tokens * top_k = %.0f "
                         "entries in int32: lower max_tokens (%lld)",
                         RM * K, (long long)g->M);
    /* The combine's items (token, chunk of 4 * kCombineThreads values or more) are int32 too. */
    const double chunks = (double)((g->H + 4 * kCombineThreads - 1) / (4 * kCombineThreads));
    if (M * chunks >= 2147483647.0)
        return epxi_fail(err, EPX_ERR_OVERFLOW,
                         "the GPU low-latency engine counts max_tokens * ceil(hidden / %d) = "
                         "%.0f combine items in int32: lower max_tokens (%lld) or hidden (%d)",
                         4 * kCombineThreads, M * chunks, (long long)g->M, g->H);
    const size_t meta_off = (g->xrow + 15) / 16 * 16, rec = meta_off + (size_t)K * sizeof(Meta);
    size_t off_rows = 0, off_cnt = 0, off_dflag = 0, off_comb = 0, off_cflag = 0, off_mflag = 0;
    /* A staging transport's blocks per peer (Args::dblk), 256-byte aligned. */
    const size_t drows = kFlagBytes + ((size_t)g->spr * sizeof(int32_t) + 15) / 16 * 16;
    const size_t dblk = (drows + (size_t)g->M * rec + 255) / 256 * 256;
    const size_t cblk = (kFlagBytes + (size_t)g->M * g->K * g->yrow + 255) / 256 * 256;
    /* What peers write, where the transport puts it (a.base). */
    epxi_ws_part inbox[] = {
        /* the dispatch areas twice: by the parity of the epoch (dflag_at) */
        {&off_rows, 2 * RM, (double)rec},
        {&off_cnt, 2.0 * R * spr, sizeof(int32_t)},
        {&off_dflag, 2.0 * R, sizeof(uint64_t)},
        {&off_mflag, compact ? 2.0 * R : 0.0, sizeof(uint64_t)}, /* normal mode's first flags */
        /* the combine areas twice: by the parity of the combine's epoch */
        {&off_comb, 2.0 * M * K, (double)g->yrow},
        {&off_cflag, 2.0 * R, sizeof(uint64_t)},
    };
    /* Staging: one buffer (no parity), a block per peer and phase. */
    epxi_ws_part staged[] = {
        {&off_dflag, (double)R, (double)dblk},
        {&off_cflag, (double)R, (double)cblk},
    };
    if (staging)
        EPX_TRY(epxi_ws_carve(staged, 2, 256, &ep->inbox_total, "GPU low-latency EP", err));
    else
        EPX_TRY(epxi_ws_carve(inbox, sizeof inbox / sizeof inbox[0], 256, &ep->inbox_total,
                              "GPU low-latency EP", err));
    /* What only this rank's kernels touch: always device memory. */
    epxi_ws_part parts[] = {
        {&ep->off_rx, compact ? 0.0 : spr * RM, (double)g->xrow}, /* normal mode: none */
        {&ep->off_y, NE, (double)g->yrow},
        {&ep->off_count, spr, sizeof(int32_t)},
        {&ep->off_pair, NE, sizeof(int32_t)},
        {&ep->off_work, RM * K, sizeof(Work)},   /* the dispatch's items, for the combine */
        {&ep->off_self, M * K, sizeof(int64_t)}, /* own entries' rows, for the combine */
        {&ep->off_srctok, NE, sizeof(int32_t)},
        {&ep->off_ew, NE, sizeof(float)},
        {&ep->off_etok, compact ? NE : 0.0, sizeof(int32_t)}, /* normal mode's entry rows */
        {&ep->off_offs, spr + 1, sizeof(int64_t)},
        {&ep->off_range, spr * R, sizeof(int64_t)},
        {&ep->off_weights, M * K, sizeof(float)},
        {&ep->off_slots, M * K, sizeof(int32_t)},
        {&ep->off_ctl, 1, sizeof(Ctl)},
        {&ep->off_peers, (double)R, sizeof(void *)},
        /* shrink mode: the handle's own mask, and its decisions per phase */
        {&ep->off_mask, (double)R, sizeof(int32_t)},
        {&ep->off_decided, 2.0 * R, sizeof(unsigned long long)},
    };
    EPX_TRY(epxi_ws_carve(parts, sizeof parts / sizeof parts[0], 256, &ep->total,
                          "GPU low-latency EP", err));
    Args &a = ep->a;
    a.R = R;
    a.K = g->K;
    a.H = g->H;
    a.spr = g->spr;
    a.spr_div = epxi_divisor(g->spr);
    a.K_div = epxi_divisor(g->K);
    a.dmax_div = epxi_divisor(g->K < R ? g->K : R);
    a.MK_div = epxi_divisor((int32_t)(g->M * g->K));
    for (int32_t d = 1; d <= kMaxSlices; d++) a.slice_div[d] = epxi_divisor(d);
    a.P = g->P;
    a.M = g->M;
    a.RM = (int64_t)R * g->M;
    a.compact = compact;
    a.NE = (int64_t)NE;
    a.rec = rec;
    a.xrow = g->xrow;
    a.yrow = g->yrow;
    a.meta_off = meta_off;
    a.off_rows = off_rows;
    a.off_cnt = off_cnt;
    a.off_dflag = off_dflag;
    a.off_mflag = off_mflag;
    a.off_comb = off_comb;
    a.off_cflag = off_cflag;
    a.dblk = dblk;
    a.drows = drows;
    a.cblk = cblk;
    a.xbf16 = g->cfg.x_dtype == EPX_DTYPE_BF16;
    a.ybf16 = g->cfg.y_dtype == EPX_DTYPE_BF16;
    a.staging = staging;
    /* A staging transport's block per peer and phase, peer r at off + r *
     * stride: one send and one receive per peer (bytes: set_bound). */
    epxi_ll_phase_blocks *d = &ep->wire[0], *c = &ep->wire[1];
    d->R = c->R = R;
    d->off = off_dflag, d->stride = dblk;
    c->off = off_cflag, c->stride = cblk;
    set_bound(ep, g->M);
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_buffer_bytes(const epx_ep_config *cfg, int32_t num_ranks,
                                              size_t *bytes, epx_error *err) {
    if (bytes == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "bytes must not be NULL");
    epx_gpu_ep tmp{};
    EPX_TRY(plan(&tmp, cfg, num_ranks, false, err));
    *bytes = tmp.total + tmp.inbox_total;
    return EPX_OK;
}

/* Every rank's info, over the bootstrap communicator (host or device
 * memory). */
static epx_status allgather_info(epx_comm *comm, const void *mine, void *all, epx_error *err) {
    const int32_t R = epx_comm_size(comm);
    const size_t n = EPX_GPU_EP_INFO_BYTES;
    int64_t *cnt = (int64_t *)epxi_calloc((size_t)2 * R, sizeof(int64_t), "EP bootstrap", err);
    unsigned char *send = (unsigned char *)epxi_calloc((size_t)R, n, "EP bootstrap", err);
    epx_status st = cnt && send ? EPX_OK : EPX_ERR_NOMEM;
    void *dsend = NULL, *drecv = NULL;
    for (int32_t r = 0; st == EPX_OK && r < R; r++) {
        cnt[r] = 1;
        cnt[R + r] = r;
        memcpy(send + (size_t)r * n, mine, n);
    }
    if (st == EPX_OK && epx_comm_memory_kind(comm) == EPX_COMM_MEMORY_DEVICE) {
        EPXI_CUDA_GOTO(st, cudaMalloc(&dsend, (size_t)R * n), "EP bootstrap buffer", done);
        EPXI_CUDA_GOTO(st, cudaMalloc(&drecv, (size_t)R * n), "EP bootstrap buffer", done);
        EPXI_CUDA_GOTO(st, cudaMemcpy(dsend, send, (size_t)R * n, cudaMemcpyHostToDevice),
                       "EP bootstrap copy", done);
        EPX_TRY_GOTO(st, epx_comm_alltoallv(comm, dsend, cnt, cnt + R, drecv, cnt, cnt + R, n, err),
                     done);
        EPX_TRY_GOTO(st, epx_comm_wait(comm, err), done);
        EPXI_CUDA_GOTO(st, cudaMemcpy(all, drecv, (size_t)R * n, cudaMemcpyDeviceToHost),
                       "EP bootstrap copy", done);
    } else if (st == EPX_OK) {
        st = epx_comm_alltoallv(comm, send, cnt, cnt + R, all, cnt, cnt + R, n, err);
    }
done:
    cudaFree(dsend);
    cudaFree(drecv);
    free(cnt);
    free(send);
    return st;
}

/* Release the peers' areas mapped here (connect undone). */
static void unmap_peers(epx_gpu_ep *ep) {
    for (int32_t r = 0; ep->areas != NULL && r < ep->a.R; r++) {
        if (ep->areas[r].dev != NULL) ep->tr->release(&ep->areas[r]);
        ep->mapped[r] = NULL;
    }
}

extern "C" void epx_gpu_ep_destroy(epx_gpu_ep *ep) {
    if (ep == NULL) return;
    cudaStreamSynchronize(ep->stream);
    epx_error err = {};
    /* No peer may write into, or still map, a buffer that is freed. */
    bool healthy = ep->boot != NULL && epx_comm_health(ep->boot, NULL) == EPX_OK;
    if (healthy) healthy = epx_comm_barrier(ep->boot, &err) == EPX_OK;
    unmap_peers(ep);
    if (healthy) epx_comm_barrier(ep->boot, &err);
    if (ep->chain) cudaEventDestroy(ep->chain);
    if (ep->tr != NULL) ep->tr->release(&ep->inbox);
    cudaFree(ep->outbox);
    free(ep->exchange_ctx);
    cudaFree(ep->buf);
    if (ep->host_fault) cudaFreeHost(ep->host_fault);
    free(ep->mapped);
    free(ep->areas);
    free(ep);
}

/* A GPU this process sees that `dev` cannot reach by peer access, or -1:
 * AUTO then picks host memory (epxi_transport_resolve). */
static int unreachable_gpu(int dev) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    for (int d = 0; d < n; d++) {
        int can = 1;
        if (d != dev && cudaDeviceCanAccessPeer(&can, dev, d) == cudaSuccess && !can) return d;
    }
    (void)cudaGetLastError();
    return -1;
}

/* epx_gpu_ep_open, or with `exchange` a staging transport's engine. */
static epx_status open_engine(const epx_ep_config *cfg, int32_t rank, int32_t num_ranks,
                              cudaStream_t stream, const epx_gpu_ep_opts *opts,
                              epxi_ll_exchange_fn exchange, epx_gpu_ep **out, epx_error *err) {
    if (out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "epx_gpu_ep_open needs an out pointer");
    *out = NULL;
    if (num_ranks < 1 || rank < 0 || rank >= num_ranks)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP rank %d of %d ranks: need 0 <= rank < num_ranks and num_ranks "
                         ">= 1",
                         rank, num_ranks);
    epx_gpu_ep_opts o = EPX_GPU_EP_OPTS_INIT;
    if (opts != NULL) {
        if (opts->version != EPX_GPU_EP_OPTS_VERSION)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "GPU EP opts version %u is not %u: initialise them from "
                             "EPX_GPU_EP_OPTS_INIT",
                             opts->version, EPX_GPU_EP_OPTS_VERSION);
        o = *opts;
    }
    if (o.timeout_ms < 1 || o.max_blocks < 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP timeout_ms (%d) must be >= 1 and max_blocks (%d) >= 0 (0 = as "
                         "many as fit on the GPU at once)",
                         o.timeout_ms, o.max_blocks);
    if (o.shrink != 0 && o.shrink != 1)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP shrink is %d: give 1 (mask a peer that times out and go on) or 0",
                         o.shrink);
    if (!o.shrink && o.mask != NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP mask is given but shrink is 0: the mask is shrink mode's; set "
                         "shrink = 1 or drop the mask");
    if (o.shrink && exchange != NULL)
        return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                         "GPU EP shrink mode needs the peer or host transport: the nccl "
                         "transport's send/receive cannot skip a peer that stopped");
    epx_gpu_ep *ep = (epx_gpu_ep *)epxi_calloc(1, sizeof *ep, "GPU EP handle", err);
    if (ep == NULL) return EPX_ERR_NOMEM;
    ep->stream = stream;
    ep->timeout_ms = o.timeout_ms;
    epx_status st = pdl_from_env(&ep->pdl, err);
    if (st != EPX_OK) {
        free(ep);
        return st;
    }
    st = plan(ep, cfg, num_ranks, exchange != NULL, err);
    const int32_t R = num_ranks;
    int dev = 0, sms = 0;
    if (st != EPX_OK) goto fail;
    ep->a.me = rank;
    EPXI_CUDA_GOTO(st, cudaGetDevice(&dev), "GPU EP: current device", fail);
    EPXI_CUDA_GOTO(st, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
                   "GPU EP: SM count", fail);
    ep->sms = sms;
    {
        /* Every block of both kernels waits for flags, so all must be
         * resident at once, or the ones still queued could never publish
         * theirs: per kernel, its instances' fewest blocks an SM times the
         * SMs. At most 65535: blocks count in on 16 bits (arrive). */
        const void *dispatches[5] = {
            (const void *)dispatch_kernel<false, false>, (const void *)dispatch_kernel<true, false>,
            (const void *)dispatch_kernel<false, true>, (const void *)dispatch_kernel<true, true>,
            (const void *)dispatch_kernel<true, false, kDispatchThreads, false, true>};
        const void *host_rows[1] = {
            (const void *)dispatch_kernel<true, false, kDispatchThreads, true>};
        const void *combines[2] = {(const void *)combine_kernel<false>,
                                   (const void *)combine_kernel<true>};
        const void *smalls[1] = {(const void *)dispatch_kernel<true, false, kSmallDispatchThreads>};
        const void *small_fp8s[1] = {
            (const void *)dispatch_kernel<true, false, kSmallDispatchThreads, false, true>};
        const void *small_combines[2] = {(const void *)combine_kernel<false, kSmallCombineThreads>,
                                         (const void *)combine_kernel<true, kSmallCombineThreads>};
        const struct {
            const void *const *k;
            int n, threads;
            int32_t *cap;
        } kinds[6] = {{dispatches, 5, kDispatchThreads, &ep->wait_blocks},
                      {host_rows, 1, kDispatchThreads, &ep->host_rows_blocks},
                      {combines, 2, kCombineThreads, &ep->comb_blocks},
                      {smalls, 1, kSmallDispatchThreads, &ep->small_blocks},
                      {small_fp8s, 1, kSmallDispatchThreads, &ep->small_fp8},
                      {small_combines, 2, kSmallCombineThreads, &ep->small_comb}};
        for (const auto &kind : kinds) {
            int per_sm = INT_MAX;
            for (int i = 0; i < kind.n; i++) {
                int n = 0;
                EPXI_CUDA_GOTO(
                    st,
                    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kind.k[i], kind.threads, 0),
                    "GPU EP: occupancy", fail);
                if (n < per_sm) per_sm = n;
            }
            int cap = per_sm * sms;
            if (o.max_blocks > 0 && o.max_blocks < cap) cap = o.max_blocks;
            if (cap > 0xffff) cap = 0xffff;
            *kind.cap = cap < 1 ? 1 : cap;
        }
    }
    EPXI_CUDA_GOTO(st, cudaEventCreateWithFlags(&ep->chain, cudaEventDisableTiming), "GPU EP event",
                   fail);
    if (exchange != NULL)
        ep->kind = EPX_GPU_EP_TRANSPORT_NCCL;
    else
        st = epxi_transport_resolve(o.transport, getenv("EPX_GPU_EP_TRANSPORT"),
                                    unreachable_gpu(dev), &ep->kind, err);
    if (st != EPX_OK) goto fail;
    if (ep->a.compact && (ep->kind == EPX_GPU_EP_TRANSPORT_HOST || o.shrink)) {
        st = epxi_fail(err, EPX_ERR_UNSUPPORTED,
                       "the GPU engine's normal mode runs over the peer transport without shrink "
                       "mode only (%s asked for): use low-latency mode, or epx_nccl_ep_create",
                       o.shrink ? "shrink" : "the host transport");
        goto fail;
    }
    ep->tr = ep->kind == EPX_GPU_EP_TRANSPORT_HOST ? &epxi_transport_host : &epxi_transport_peer;
    ep->a.host_inbox = ep->kind == EPX_GPU_EP_TRANSPORT_HOST;
    st = ep->tr->alloc(ep->inbox_total, R, &ep->inbox, err);
    if (st != EPX_OK) goto fail;
    if (exchange != NULL) {
        /* sends filed by destination, then moved by the transport */
        EPXI_CUDA_GOTO(st, cudaMalloc((void **)&ep->outbox, ep->inbox_total), "GPU EP outbox",
                       fail);
        EPXI_CUDA_GOTO(st, cudaMemset(ep->outbox, 0, ep->inbox_total), "GPU EP outbox", fail);
        ep->exchange = exchange;
        for (int i = 0; i < 2; i++) {
            ep->wire[i].outbox = ep->outbox;
            ep->wire[i].inbox = ep->inbox.dev;
        }
    }
    EPXI_CUDA_GOTO(st, cudaMalloc((void **)&ep->buf, ep->total), "GPU EP buffer", fail);
    EPXI_CUDA_GOTO(st, cudaMemset(ep->buf, 0, ep->total), "GPU EP buffer", fail);
    EPXI_CUDA_GOTO(
        st, cudaHostAlloc((void **)&ep->host_fault, 8 * sizeof(uint32_t), cudaHostAllocMapped),
        "GPU EP fault word", fail);
    memset(ep->host_fault, 0, 8 * sizeof(uint32_t));
    EPXI_CUDA_GOTO(st, cudaHostGetDevicePointer((void **)&ep->host_fault_dev, ep->host_fault, 0),
                   "GPU EP fault word", fail);
    ep->mapped = (unsigned char **)epxi_calloc((size_t)R, sizeof(void *), "GPU EP peers", err);
    ep->areas = (epxi_area *)epxi_calloc((size_t)R, sizeof(epxi_area), "GPU EP peers", err);
    if (ep->mapped == NULL || ep->areas == NULL) {
        st = EPX_ERR_NOMEM;
        goto fail;
    }
    {
        Args &a = ep->a;
        a.base = ep->inbox.dev;
        a.peers = (unsigned char *const *)(ep->buf + ep->off_peers);
        a.rx = ep->buf + ep->off_rx;
        a.y = ep->buf + ep->off_y;
        a.count = (int32_t *)(ep->buf + ep->off_count);
        a.pair = (int32_t *)(ep->buf + ep->off_pair);
        a.work = (Work *)(ep->buf + ep->off_work);
        a.self_e = (int64_t *)(ep->buf + ep->off_self);
        a.srctok = (int32_t *)(ep->buf + ep->off_srctok);
        a.ew = (float *)(ep->buf + ep->off_ew);
        a.etok = (int32_t *)(ep->buf + ep->off_etok);
        a.offs = (int64_t *)(ep->buf + ep->off_offs);
        a.range = (int64_t *)(ep->buf + ep->off_range);
        a.weights = (float *)(ep->buf + ep->off_weights);
        a.slots = (int32_t *)(ep->buf + ep->off_slots);
        a.ctl = (Ctl *)(ep->buf + ep->off_ctl);
        a.host_fault = ep->host_fault_dev;
        a.timeout_ns = (unsigned long long)ep->timeout_ms * 1000000ull;
        a.shrink = o.shrink;
        a.mask = o.mask != NULL ? o.mask : (int32_t *)(ep->buf + ep->off_mask);
        a.decided = (unsigned long long *)(ep->buf + ep->off_decided);
    }
    *out = ep;
    return EPX_OK;
fail:
    epx_gpu_ep_destroy(ep);
    return st;
}

extern "C" epx_status epx_gpu_ep_open(const epx_ep_config *cfg, int32_t rank, int32_t num_ranks,
                                      cudaStream_t stream, const epx_gpu_ep_opts *opts,
                                      epx_gpu_ep **out, epx_error *err) {
    return open_engine(cfg, rank, num_ranks, stream, opts, NULL, out, err);
}

/* A staging transport's engine, connected at once: every peer pointer is
 * the outbox, and `ops->exchange(ctx, ...)` moves each phase's blocks (ctx
 * is freed with the handle). GPU scope suffices: the flags are read only after
 * the transport's copy, in stream order. For transport_nccl.cu. */
extern "C" EPXI_HIDDEN epx_status epxi_gpu_ep_open_staging(const epx_ep_config *cfg, int32_t rank,
                                                           int32_t num_ranks, cudaStream_t stream,
                                                           const epx_gpu_ep_opts *opts,
                                                           const epxi_ll_staging *ops,
                                                           epx_gpu_ep **out, epx_error *err) {
    epx_gpu_ep *ep = NULL;
    epx_status st = open_engine(cfg, rank, num_ranks, stream, opts, ops->exchange, &ep, err);
    if (st != EPX_OK) {
        free(ops->ctx);
        return st;
    }
    ep->exchange_ctx = ops->ctx;
    ep->agree = ops->agree;
    for (int32_t r = 0; r < num_ranks; r++) ep->mapped[r] = ep->outbox;
    const cudaError_t ce = cudaMemcpy(ep->buf + ep->off_peers, ep->mapped,
                                      (size_t)num_ranks * sizeof(void *), cudaMemcpyHostToDevice);
    if (ce != cudaSuccess) {
        st = epxi_cuda_fail(ce, "GPU EP peer table", err);
        epx_gpu_ep_destroy(ep);
        return st;
    }
    ep->a.one_gpu = 1;
    ep->connected = ep->was_connected = true;
    *out = ep;
    return EPX_OK;
}

/* Move a phase's staged blocks (staging transports), between its kernels. */
static epx_status exchange_phase(epx_gpu_ep *ep, int phase, epx_error *err) {
    if (ep->exchange == NULL) return EPX_OK;
    return ep->exchange(ep->exchange_ctx, &ep->wire[phase], (void *)ep->stream, err);
}

extern "C" epx_status epx_gpu_ep_info(const epx_gpu_ep *ep, void *info, epx_error *err) {
    if (ep == NULL || info == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP info needs a handle and a buffer");
    if (ep->exchange != NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP info: an engine of the nccl transport maps no peers (it was "
                         "connected when epx_gpu_ep_create_nccl created it)");
    PeerInfo p;
    memset(&p, 0, sizeof p);
    memcpy(p.magic, kMagic, sizeof p.magic);
    p.rank = ep->a.me;
    p.pid = (int32_t)getpid();
    p.process = process_id();
    cudaPointerAttributes at;
    EPXI_CUDA_TRY(cudaPointerGetAttributes(&at, ep->buf), "GPU EP: the buffer's device");
    p.device = at.device;
    cudaDeviceProp prop;
    EPXI_CUDA_TRY(cudaGetDeviceProperties(&prop, at.device), "GPU EP: the GPU's UUID");
    memcpy(p.uuid, prop.uuid.bytes, sizeof p.uuid);
    p.ptr = (uint64_t)(uintptr_t)ep->inbox.dev;
    p.transport = ep->kind;
    p.host = epxi_host_id();
    p.shape = epxi_ll_shape_of(&ep->g.cfg, ep->a.R);
    EPX_TRY(ep->tr->handle(&ep->inbox, p.handle, err));
    memset(info, 0, EPX_GPU_EP_INFO_BYTES);
    memcpy(info, &p, sizeof p);
    return EPX_OK;
}

/* Every rank opened with this rank's transport, and it reaches them all. */
/* Shrink mode: an info of all zero bytes stands for a rank that never
 * opened (it stopped before creating the engine); it is masked at connect. */
static bool absent_info(const epx_gpu_ep *ep, const void *infos, int32_t r) {
    const unsigned char *b = (const unsigned char *)infos + (size_t)r * EPX_GPU_EP_INFO_BYTES;
    if (!ep->a.shrink || r == ep->a.me) return false;
    for (size_t i = 0; i < EPX_GPU_EP_INFO_BYTES; i++)
        if (b[i] != 0) return false;
    return true;
}

static epx_status check_transport(const epx_gpu_ep *ep, const void *infos, const PeerInfo *mine,
                                  int dev, epx_error *err) {
    const int32_t R = ep->a.R;
    epxi_tr_rank *t = (epxi_tr_rank *)epxi_calloc((size_t)R, sizeof *t, "GPU EP peers", err);
    if (t == NULL) return EPX_ERR_NOMEM;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    for (int32_t r = 0; r < R; r++) {
        PeerInfo p;
        /* an absent rank is checked as this one (nothing of it is mapped) */
        memcpy(&p,
               absent_info(ep, infos, r)
                   ? (const void *)mine
                   : (const unsigned char *)infos + (size_t)r * EPX_GPU_EP_INFO_BYTES,
               sizeof p);
        t[r].kind = p.transport;
        t[r].host = p.host;
        t[r].device = p.device;
        t[r].same_gpu = memcmp(p.uuid, mine->uuid, sizeof p.uuid) == 0;
        t[r].reach = -1; /* a GPU this process does not see */
        for (int d = 0; d < n && !t[r].same_gpu; d++) {
            cudaDeviceProp prop;
            int can = 0;
            if (cudaGetDeviceProperties(&prop, d) == cudaSuccess &&
                memcmp(prop.uuid.bytes, p.uuid, sizeof p.uuid) == 0 &&
                cudaDeviceCanAccessPeer(&can, dev, d) == cudaSuccess)
                t[r].reach = (int8_t)(can != 0);
        }
    }
    (void)cudaGetLastError();
    epx_status st = epxi_transport_check(R, ep->a.me, t, err);
    free(t);
    return st;
}

extern "C" epx_status epx_gpu_ep_connect(epx_gpu_ep *ep, const void *infos, epx_error *err) {
    if (ep == NULL || infos == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP connect needs a handle and the infos");
    if (ep->connected)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP connect: this handle is connected (engines of the nccl "
                         "transport are, from their creation)");
    if (ep->was_connected && ep->kind == EPX_GPU_EP_TRANSPORT_HOST)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP connect: under the host transport a handle connects once (the "
                         "shared segments' names went once every rank had mapped them): destroy "
                         "it and open a new one");
    const int32_t R = ep->a.R;
    unsigned char mine_b[EPX_GPU_EP_INFO_BYTES];
    EPX_TRY(epx_gpu_ep_info(ep, mine_b, err));
    PeerInfo mine, p;
    memcpy(&mine, mine_b, sizeof mine);
    int dev = 0;
    EPXI_CUDA_TRY(cudaGetDevice(&dev), "GPU EP: current device");
    for (int32_t r = 0; r < R; r++) {
        if (absent_info(ep, infos, r)) continue;
        memcpy(&p, (const unsigned char *)infos + (size_t)r * EPX_GPU_EP_INFO_BYTES, sizeof p);
        char a_s[160], b_s[160];
        if (memcmp(p.magic, kMagic, sizeof p.magic) != 0 || p.rank != r)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "GPU EP connect: entry %d of the infos is not rank %d's "
                             "epx_gpu_ep_info of this epx version (pass every rank's info in "
                             "rank order)",
                             r, r);
        if (r == ep->a.me && (p.process != mine.process || p.ptr != mine.ptr))
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "GPU EP connect: entry %d of the infos is not this handle's own "
                             "(rank %d): pass every rank's info in rank order",
                             r, r);
        epxi_ll_shape_describe(&mine.shape, a_s, sizeof a_s);
        epxi_ll_shape_describe(&p.shape, b_s, sizeof b_s);
        if (strcmp(a_s, b_s) != 0)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "GPU EP connect: rank %d has %s but rank %d has %s; every rank "
                             "must create the engine with the same config",
                             ep->a.me, a_s, r, b_s);
    }
    EPX_TRY(check_transport(ep, infos, &mine, dev, err));
    epx_status st = EPX_OK;
    bool one_process = true;
    for (int32_t r = 0; r < R && st == EPX_OK; r++) {
        if (absent_info(ep, infos, r)) { /* masked from the start: never sent to or waited for */
            const int32_t one = 1;
            ep->mapped[r] = NULL;
            EPXI_CUDA_GOTO(st, cudaMemcpy(ep->a.mask + r, &one, sizeof one, cudaMemcpyHostToDevice),
                           "GPU EP mask", undo);
            continue;
        }
        memcpy(&p, (const unsigned char *)infos + (size_t)r * EPX_GPU_EP_INFO_BYTES, sizeof p);
        if (p.process == mine.process) {
            /* this process: the pointer as it is (peer access for another GPU) */
            ep->mapped[r] = (unsigned char *)(uintptr_t)p.ptr;
            if (p.device != dev && ep->kind == EPX_GPU_EP_TRANSPORT_PEER) {
                cudaError_t pe = cudaDeviceEnablePeerAccess(p.device, 0);
                if (pe != cudaSuccess && pe != cudaErrorPeerAccessAlreadyEnabled)
                    st = epxi_fail(err, EPX_ERR_CUDA,
                                   "GPU EP: GPU %d cannot reach GPU %d (rank %d) by load/store: "
                                   "%s. The peer transport needs peer access (NVLink, or PCIe "
                                   "with P2P): set EPX_GPU_EP_TRANSPORT=host otherwise",
                                   dev, p.device, r, cudaGetErrorString(pe));
                (void)cudaGetLastError();
            }
            continue;
        }
        one_process = false;
        st = ep->tr->map(p.handle, ep->inbox_total, r, &ep->areas[r], err);
        if (st == EPX_OK) ep->mapped[r] = ep->areas[r].dev;
    }
    if (st == EPX_OK)
        EPXI_CUDA_GOTO(st,
                       cudaMemcpy(ep->buf + ep->off_peers, ep->mapped, (size_t)R * sizeof(void *),
                                  cudaMemcpyHostToDevice),
                       "GPU EP peer table", undo);
    if (st == EPX_OK) {
        bool one = true;
        for (int32_t r = 0; r < R; r++) {
            if (absent_info(ep, infos, r)) continue;
            memcpy(&p, (const unsigned char *)infos + (size_t)r * EPX_GPU_EP_INFO_BYTES, sizeof p);
            one = one && memcmp(p.uuid, mine.uuid, sizeof p.uuid) == 0;
            /* Every rank counts in once on every area (the host transport
             * removes a segment's name when all have: nothing is left in
             * /dev/shm whoever crashes later). */
            ep->tr->count_in(ep->areas[r].dev != NULL ? &ep->areas[r]
                             : r == ep->a.me          ? &ep->inbox
                                                      : NULL,
                             p.handle);
        }
        /* Flags at GPU scope only where device memory and every rank share
         * this GPU; host memory keeps the system scope a PCIe box needs. */
        ep->a.one_gpu = one && ep->kind == EPX_GPU_EP_TRANSPORT_PEER;
        ep->one_process = one_process;
        ep->connected = ep->was_connected = true;
        return EPX_OK;
    }
undo:
    unmap_peers(ep);
    return st;
}

extern "C" epx_status epx_gpu_ep_create(epx_comm *bootstrap, const epx_ep_config *cfg,
                                        cudaStream_t stream, const epx_gpu_ep_opts *opts,
                                        epx_gpu_ep **out, epx_error *err) {
    if (bootstrap == NULL || out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_gpu_ep_create needs a bootstrap communicator and an out pointer");
    epx_gpu_ep *ep = NULL;
    const int32_t R = epx_comm_size(bootstrap);
    unsigned char *all =
        (unsigned char *)epxi_calloc((size_t)R, EPX_GPU_EP_INFO_BYTES, "GPU EP peers", err);
    if (all == NULL) return EPX_ERR_NOMEM;
    /* Each step that one rank alone may fail (open, connect) is followed by
     * an exchange every rank reaches, so a failure anywhere becomes an error
     * everywhere, never peers waiting at the next collective in vain. A rank
     * that failed sends zeros (no magic). */
    unsigned char mine[EPX_GPU_EP_INFO_BYTES] = {0};
    epx_status st = epx_gpu_ep_open(cfg, epx_comm_rank(bootstrap), R, stream, opts, &ep, err);
    if (st == EPX_OK) st = epx_gpu_ep_info(ep, mine, err);
    if (st != EPX_OK) memset(mine, 0, sizeof mine);
    epx_error gerr = {};
    epx_status gst = allgather_info(bootstrap, mine, all, &gerr);
    for (int32_t r = 0; gst == EPX_OK && st == EPX_OK && r < R; r++)
        if (memcmp(all + (size_t)r * EPX_GPU_EP_INFO_BYTES, kMagic, sizeof kMagic) != 0)
            st = epxi_fail(err, EPX_ERR_INVALID_ARG,
                           "GPU EP create: rank %d could not open its engine (its own error says "
                           "why), so no rank connects",
                           r);
    if (gst == EPX_OK && st == EPX_OK) st = epx_gpu_ep_connect(ep, all, err);
    if (gst == EPX_OK) {
        /* did every rank connect? */
        memset(mine, 0, sizeof mine);
        mine[0] = st == EPX_OK;
        gst = allgather_info(bootstrap, mine, all, &gerr);
        for (int32_t r = 0; gst == EPX_OK && st == EPX_OK && r < R; r++)
            if (all[(size_t)r * EPX_GPU_EP_INFO_BYTES] != 1)
                st = epxi_fail(err, EPX_ERR_INVALID_ARG,
                               "GPU EP create: rank %d could not connect to its peers (its own "
                               "error says why)",
                               r);
    }
    if (gst != EPX_OK && st == EPX_OK) {
        st = gst;
        if (err != NULL) *err = gerr;
    }
    /* Every peer has mapped every buffer before anyone launches. */
    if (st == EPX_OK) st = epx_comm_barrier(bootstrap, err);
    free(all);
    if (st != EPX_OK) {
        epx_gpu_ep_destroy(ep); /* no collective teardown after a failed collective setup */
        return st;
    }
    ep->boot = bootstrap;
    *out = ep;
    return EPX_OK;
}

/* The first fault the kernels recorded, as a status and message; poisons
 * the bootstrap communicator for communication faults. A refused batch is
 * reported (and forgotten) only where asked: dispatch and combine must
 * launch whenever the peers do, or they would wait for us in vain. */
static epx_status fault_status(epx_gpu_ep *ep, bool report_refused, epx_error *err) {
    volatile uint32_t *f = ep->host_fault;
    if (report_refused && f[0] == F_NONE && f[4] == F_DUP_SLOT) {
        f[4] = F_NONE;
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP dispatch of batch %u: a token of rank %u names one slot twice; "
                         "the expert-major receive holds one row per token and slot (DeepEP's "
                         "rule: distinct experts per token), so every rank refused that batch "
                         "(no expert ran, combine wrote zeros)",
                         f[7], f[6]);
    }
    if (report_refused && f[0] == F_NONE && f[4] == F_BAD_SLOT) {
        f[4] = F_NONE;
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP dispatch of batch %u: rank %u passed a slot outside [-1, %d); "
                         "every rank refused that batch (no expert ran, combine wrote zeros)",
                         f[7], f[6], ep->a.P);
    }
    uint32_t code = f[0];
    if (code == F_NONE) return EPX_OK;
    const char *phase = f[1] == PH_DISPATCH ? "dispatch" : "combine";
    epx_status st = epxi_fail(err, EPX_ERR_TIMEOUT,
                              "GPU EP %s of batch %u: rank %u's flag did not arrive within %d "
                              "ms (a peer died, stopped, or made different calls); the kernels "
                              "gave up and the handle refuses later batches",
                              phase, f[3], f[2], ep->timeout_ms);
    if (!ep->reported && ep->boot != NULL) {
        epxi_comm_poison(ep->boot, EPX_ERR_TIMEOUT, err ? err->msg : "GPU EP timeout");
        ep->reported = true;
    }
    return st;
}

extern "C" epx_status epx_gpu_ep_health(epx_gpu_ep *ep, epx_error *err) {
    if (ep == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP health needs a handle");
    return fault_status(ep, true, err);
}

/* ---- shrink mode's mask ---------------------------------------------------- */

namespace {
__global__ void set_mask_kernel(int32_t *mask, int32_t rank, int32_t v) { mask[rank] = v; }
} // namespace

static epx_status shrink_handle(const epx_gpu_ep *ep, const char *what, epx_error *err) {
    if (ep == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP %s needs a handle", what);
    if (!ep->a.shrink)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP %s: this handle was opened without shrink mode (set "
                         "epx_gpu_ep_opts.shrink = 1)",
                         what);
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_mask_update(epx_gpu_ep *ep, int32_t rank, int masked,
                                             epx_error *err) {
    EPX_TRY(shrink_handle(ep, "mask_update", err));
    if (rank < 0 || rank >= ep->a.R)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP mask_update: rank %d is outside [0, %d)",
                         rank, ep->a.R);
    /* a kernel, not a copy from host memory: it is captured by value */
    set_mask_kernel<<<1, 1, 0, ep->stream>>>(ep->a.mask, rank, masked != 0);
    EPXI_CUDA_TRY(cudaGetLastError(), "GPU EP mask_update");
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_mask_query(epx_gpu_ep *ep, int32_t *out, epx_error *err) {
    EPX_TRY(shrink_handle(ep, "mask_query", err));
    if (out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP mask_query needs a device int32[%d]",
                         ep->a.R);
    EPXI_CUDA_TRY(cudaMemcpyAsync(out, ep->a.mask, (size_t)ep->a.R * sizeof(int32_t),
                                  cudaMemcpyDeviceToDevice, ep->stream),
                  "GPU EP mask_query");
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_mask_clean(epx_gpu_ep *ep, epx_error *err) {
    EPX_TRY(shrink_handle(ep, "mask_clean", err));
    EPXI_CUDA_TRY(cudaMemsetAsync(ep->a.mask, 0, (size_t)ep->a.R * sizeof(int32_t), ep->stream),
                  "GPU EP mask_clean");
    return EPX_OK;
}

static unsigned blocks_for(int64_t items, int32_t cap) {
    int64_t b = items < 1 ? 1 : items;
    return (unsigned)(b < cap ? b : cap);
}

static epx_status ready(epx_gpu_ep *ep, const char *what, epx_error *err) {
    if (ep == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP %s needs a handle", what);
    if (!ep->connected)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP %s before epx_gpu_ep_connect: the peers are not mapped yet", what);
    return fault_status(ep, false, err);
}

static const char *state_name(int st) {
    return st == epx_gpu_ep::D_SENT       ? "a dispatch whose receive half has not run"
           : st == epx_gpu_ep::C_SENT     ? "a combine whose receive half has not run"
           : st == epx_gpu_ep::DISPATCHED ? "a dispatch"
                                          : "no dispatch since the handle was made or its token "
                                            "bound set";
}

static epx_status bad_order(epx_gpu_ep *ep, const char *what, const char *fix, epx_error *err) {
    return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP %s after %s: %s", what,
                     state_name(ep->state), fix);
}

static_assert(EPX_GPU_EP_FP8 == kFP8 && EPX_GPU_EP_ROUND_SCALE == kRoundScale &&
                  EPX_GPU_EP_UE8M0 == kUE8M0,
              "the kernels take the public fp8 bits as they are");

/* An fp8 dispatch's preconditions (DeepEP's, and the kernel's alignment). */
static epx_status check_fp8(const epx_gpu_ep *ep, int fp8, const void *x, epx_error *err) {
    if (fp8 == 0) return EPX_OK;
    const epxi_ep_geom *g = &ep->g;
    if (ep->a.compact)
        return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                         "GPU EP fp8 dispatch is low-latency mode's: the handle is in normal mode "
                         "(its experts read the rows where the senders wrote them, bf16 or fp32)");
    if (!(fp8 & EPX_GPU_EP_FP8))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP dispatch: EPX_GPU_EP_ROUND_SCALE / _UE8M0 shape an fp8 dispatch: "
                         "add EPX_GPU_EP_FP8");
    if ((fp8 & EPX_GPU_EP_UE8M0) && !(fp8 & EPX_GPU_EP_ROUND_SCALE))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP dispatch: UE8M0 scales are powers of two: add "
                         "EPX_GPU_EP_ROUND_SCALE (DeepEP's rule)");
    if (g->cfg.x_dtype != EPX_DTYPE_BF16)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP fp8 dispatch quantises bf16 rows: create the handle with x_dtype "
                         "EPX_DTYPE_BF16");
    const int32_t unit = (fp8 & EPX_GPU_EP_UE8M0) ? 4 * EPXI_FP8_GROUP : EPXI_FP8_GROUP;
    if (g->H % unit != 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP fp8 dispatch: hidden %d is not a multiple of %d (one scale per "
                         "128 values%s)",
                         g->H, unit, unit > EPXI_FP8_GROUP ? ", four packed per int32" : "");
    if ((uintptr_t)x % 16 != 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP fp8 dispatch reads x in 16-byte words: x (%p) must be 16-byte "
                         "aligned",
                         x);
    return EPX_OK;
}

/* The recv view of a dispatch: expert-major (low latency) or compact
 * (normal mode: entries in slot order at slot_offsets, their rows in the
 * inbox, both parities, so one view serves every dispatch of a graph). */
static void fill_recv(const epx_gpu_ep *ep, epx_ep_recv *recv) {
    const epxi_ep_geom *g = &ep->g;
    const Args &a = ep->a;
    memset(recv, 0, sizeof *recv);
    recv->num_entries = -1; /* on the device: counts, or slot_offsets[num_local_slots] */
    recv->first_slot = a.me * g->spr;
    recv->num_local_slots = g->spr;
    recv->entry_weight = a.ew;
    recv->y = a.y;
    recv->slot_counts = a.count;
    if (a.compact) {
        recv->num_tokens = 2 * a.RM;
        recv->x = a.base + a.off_rows;
        recv->x_stride = a.rec;
        recv->slot_offsets = a.offs;
        recv->entry_token = a.etok;
    } else {
        recv->num_tokens = (int64_t)g->spr * a.RM;
        recv->x = a.rx;
        recv->x_stride = g->xrow;
        recv->slot_stride = a.RM;
    }
}

extern "C" epx_status epx_gpu_ep_dispatch_parts(epx_gpu_ep *ep, int parts, int64_t T, const void *x,
                                                const int32_t *topk_slots,
                                                const float *topk_weights, epx_ep_recv *recv,
                                                epx_error *err) {
    EPX_TRY(ready(ep, "dispatch", err));
    const int ids64 = parts & EPX_GPU_EP_IDS64;
    const int fp8 = parts & (EPX_GPU_EP_FP8 | EPX_GPU_EP_ROUND_SCALE | EPX_GPU_EP_UE8M0);
    parts &= ~(EPX_GPU_EP_IDS64 | EPX_GPU_EP_FP8 | EPX_GPU_EP_ROUND_SCALE | EPX_GPU_EP_UE8M0);
    if (parts < EPX_GPU_EP_SEND || parts > (EPX_GPU_EP_SEND | EPX_GPU_EP_RECV))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP dispatch parts %d: give EPX_GPU_EP_SEND, EPX_GPU_EP_RECV or both "
                         "(and EPX_GPU_EP_IDS64 for int64 ids)",
                         parts);
    const epxi_ep_geom *g = &ep->g;
    if (parts & EPX_GPU_EP_SEND) {
        if (ep->state == epx_gpu_ep::D_SENT || ep->state == epx_gpu_ep::C_SENT)
            return bad_order(ep, "dispatch", "run its receive half first", err);
        if (T < 0 || T > g->M)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "GPU EP dispatch of %lld tokens is outside [0, max_tokens %lld]: the "
                             "low-latency buffers hold max_tokens per rank; raise it when "
                             "creating the handle",
                             (long long)T, (long long)g->M);
        if (T > ep->bound)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "GPU EP dispatch of %lld tokens is above the token bound %lld that "
                             "epx_gpu_ep_set_token_bound set: every rank raises it together "
                             "(at most max_tokens %lld)",
                             (long long)T, (long long)ep->bound, (long long)g->M);
        if (T > 0 && (x == NULL || topk_slots == NULL))
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "GPU EP dispatch of %lld tokens needs x and topk_slots", (long long)T);
        EPX_TRY(check_fp8(ep, fp8, x, err));
        ep->T = T;
        ep->fp8 = fp8;
    } else if (ep->state != epx_gpu_ep::D_SENT) {
        return bad_order(ep, "dispatch receive", "send a dispatch first", err);
    }
    /* Blocks: this rank's (token, destination) items, and as many as the
     * rows (and k) a receiver is likely to place: R * T * K. */
    const int64_t dmax = g->K < g->R ? g->K : g->R, sends = (parts & 1) ? ep->T * dmax : 0;
    int64_t places = (parts & 2) ? (int64_t)g->R * ep->T * g->K : 0;
    if (ep->a.compact) /* a thread per (row, k) */
        places = (places + kDispatchThreads - 1) / kDispatchThreads;
    if (ep->exchange != NULL && parts == (EPX_GPU_EP_SEND | EPX_GPU_EP_RECV)) {
        /* staging: the halves as two launches, the transport between them */
        EPX_TRY(epx_gpu_ep_dispatch_parts(ep, EPX_GPU_EP_SEND | ids64 | fp8, T, x, topk_slots,
                                          topk_weights, NULL, err));
        return epx_gpu_ep_dispatch_parts(ep, EPX_GPU_EP_RECV, T, x, topk_slots, topk_weights, recv,
                                         err);
    }
    /* The lean instance when nothing needs the others' paths (dispatch_kernel). */
    const bool lean_rows =
        ep->fp8 == 0 && g->K <= 32 && row_fits_registers(g->xrow, x, kDispatchThreads);
    const bool lean = lean_rows && (!ep->a.host_inbox || (ep->a.variant & 32));
    /* Positions from the per-slot table where the ids are past staging. */
    const bool big = (parts & EPX_GPU_EP_SEND) && ep->T * g->K > kSmemIds && g->P <= kSmemIds;
    /* ... and its fp8 form (kFp8) for a batch it would take in bf16: a
     * device-memory inbox, staged ids, entries below 2^31 (place_fp8_regs) */
    const bool lean_fp8 = ep->fp8 != 0 && !(ep->a.variant & 4096) && g->K <= 32 &&
                          row_fits_registers(g->xrow, x, kDispatchThreads) && !ep->a.host_inbox &&
                          !big && !ep->a.compact &&
                          (double)g->spr * (double)ep->a.RM < 2147483648.0;
    /* ... and its form that reads a host inbox's rows once (kHostRows) */
    const bool host_rows =
        lean_rows && ep->a.host_inbox && !(ep->a.variant & 32) && !big && !ep->a.compact;
    /* ... in smaller blocks for low latency's usual batch (kSmallDispatchThreads) */
    const bool small = (lean || lean_fp8) && !big && !ep->a.compact && ep->T * g->K <= kSmemIds &&
                       !(ep->a.variant & 512) &&
                       row_fits_registers(g->xrow, x, kSmallDispatchThreads);
    /* The instance, and its grid's cap: every block waits for flags, so all
     * must be resident (open_engine's occupancy, per instance). */
    auto kern = dispatch_kernel<false, false>;
    int32_t cap = ep->wait_blocks;
    if (small && lean_fp8) {
        kern = dispatch_kernel<true, false, kSmallDispatchThreads, false, true>;
        cap = ep->small_fp8;
    } else if (small) {
        kern = dispatch_kernel<true, false, kSmallDispatchThreads>;
        cap = ep->small_blocks;
    } else if (lean_fp8) {
        kern = dispatch_kernel<true, false, kDispatchThreads, false, true>;
    } else if (host_rows) {
        kern = dispatch_kernel<true, false, kDispatchThreads, true>;
        cap = ep->host_rows_blocks;
    } else if (lean) {
        kern = big ? dispatch_kernel<true, true> : dispatch_kernel<true, false>;
    } else if (big) {
        kern = dispatch_kernel<false, true>;
    }
    const int threads = small ? kSmallDispatchThreads : kDispatchThreads;
    /* ... and one more block for the slot ranges (dispatch_kernel's range block) */
    const unsigned grid =
        blocks_for((sends > places ? sends : places) + ((parts & 2) ? 1 : 0), cap);
    const uint32_t nwork = (uint32_t)(sends < 1 ? 1 : sends < grid ? sends : grid);
    EPXI_CUDA_TRY(launch(ep, kern, grid, threads, ep->a, ep->T, (const unsigned char *)x,
                         topk_slots, topk_weights, nwork, parts | (ids64 ? 4 : 0) | ep->fp8),
                  "GPU EP dispatch kernel");
    if (parts & EPX_GPU_EP_SEND) EPX_TRY(exchange_phase(ep, 0, err));
    ep->state = (parts & EPX_GPU_EP_RECV) ? epx_gpu_ep::DISPATCHED : epx_gpu_ep::D_SENT;
    if (recv != NULL) fill_recv(ep, recv);
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_dispatch(epx_gpu_ep *ep, int64_t T, const void *x,
                                          const int32_t *topk_slots, const float *topk_weights,
                                          epx_ep_recv *recv, epx_error *err) {
    if (recv == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP dispatch needs a recv view");
    return epx_gpu_ep_dispatch_parts(ep, EPX_GPU_EP_SEND | EPX_GPU_EP_RECV, T, x, topk_slots,
                                     topk_weights, recv, err);
}

extern "C" epx_status epx_gpu_ep_identity_experts(epx_gpu_ep *ep, epx_error *err) {
    if (ep == NULL || ep->state != epx_gpu_ep::DISPATCHED)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP identity experts need a whole dispatch first");
    identity_kernel<<<(unsigned)ep->wait_blocks, kDispatchThreads, 0, ep->stream>>>(ep->a, ep->fp8);
    EPXI_CUDA_TRY(cudaGetLastError(), "GPU EP identity kernel");
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_combine_parts(epx_gpu_ep *ep, int parts, const void *y,
                                               const float *topk_weights, void *out,
                                               epx_dtype out_dtype, epx_error *err) {
    EPX_TRY(ready(ep, "combine", err));
    if (parts < EPX_GPU_EP_SEND || parts > (EPX_GPU_EP_SEND | EPX_GPU_EP_RECV))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP combine parts %d: give EPX_GPU_EP_SEND, EPX_GPU_EP_RECV or both",
                         parts);
    const epxi_ep_geom *g = &ep->g;
    if (parts & EPX_GPU_EP_SEND) {
        if (ep->state != epx_gpu_ep::DISPATCHED)
            return bad_order(ep, "combine", "combine follows a whole dispatch", err);
        if (out_dtype != EPX_DTYPE_F32 && out_dtype != EPX_DTYPE_BF16)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "GPU EP combine writes F32 or BF16 output, not dtype %d",
                             (int)out_dtype);
        if (ep->T > 0 && out == NULL)
            return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP combine of %lld tokens needs out",
                             (long long)ep->T);
        ep->c_w = topk_weights ? topk_weights : ep->a.weights;
        ep->c_out = out;
        ep->c_bf16 = out_dtype == EPX_DTYPE_BF16;
    } else if (ep->state != epx_gpu_ep::C_SENT) {
        return bad_order(ep, "combine receive", "send a combine first", err);
    }
    /* Enough blocks for the entries this rank may hold, and for its tokens'
     * chunks of the reduction: in small blocks where the usual ones would
     * leave SMs without one (kSmallCombineThreads). */
    const int64_t lanes = g->cfg.y_dtype == EPX_DTYPE_BF16 ? 8 : 4;
    const int64_t per = lanes * kCombineThreads;
    const bool small =
        (parts & 2) && !(ep->a.variant & 1024) && ep->T * ((g->H + per - 1) / per) < ep->sms;
    const int64_t block_per = small ? lanes * kSmallCombineThreads : per; /* values a block sums */
    const int64_t items = (parts & 2) ? ep->T * ((g->H + block_per - 1) / block_per) : 0;
    const int64_t sends = (parts & 1) ? (int64_t)g->R * ep->T * g->K : 0;
    if (ep->exchange != NULL && parts == (EPX_GPU_EP_SEND | EPX_GPU_EP_RECV)) {
        EPX_TRY(
            epx_gpu_ep_combine_parts(ep, EPX_GPU_EP_SEND, y, topk_weights, out, out_dtype, err));
        return epx_gpu_ep_combine_parts(ep, EPX_GPU_EP_RECV, y, topk_weights, out, out_dtype, err);
    }
    const unsigned char *ysrc = y ? (const unsigned char *)y : ep->a.y;
    /* The lean instance for bf16 outputs in whole 16-byte lanes (combine_kernel). */
    const bool lean = g->cfg.y_dtype == EPX_DTYPE_BF16 && g->H % 8 == 0 && g->yrow % 16 == 0 &&
                      (uintptr_t)ysrc % 16 == 0;
    /* the kernel's chunks of a row, as the kernel's V * blockDim values */
    ep->a.chunks = (int32_t)((g->H + block_per - 1) / block_per);
    ep->a.chunks_div = epxi_divisor(ep->a.chunks);
    auto kern = small  ? (lean ? combine_kernel<true, kSmallCombineThreads>
                               : combine_kernel<false, kSmallCombineThreads>)
                : lean ? combine_kernel<true>
                       : combine_kernel<false>;
    EPXI_CUDA_TRY(
        launch(ep, kern,
               blocks_for(items > sends ? items : sends, small ? ep->small_comb : ep->comb_blocks),
               small ? kSmallCombineThreads : kCombineThreads, ep->a, ep->T, ysrc, ep->c_w,
               (void *)ep->c_out, ep->c_bf16, parts),
        "GPU EP combine kernel");
    if (parts & EPX_GPU_EP_SEND) EPX_TRY(exchange_phase(ep, 1, err));
    /* the dispatch stays valid: it may be combined again (DeepEP allows it) */
    ep->state = (parts & EPX_GPU_EP_RECV) ? epx_gpu_ep::DISPATCHED : epx_gpu_ep::C_SENT;
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_combine_ex(epx_gpu_ep *ep, const void *y,
                                            const float *topk_weights, void *out,
                                            epx_dtype out_dtype, epx_error *err) {
    return epx_gpu_ep_combine_parts(ep, EPX_GPU_EP_SEND | EPX_GPU_EP_RECV, y, topk_weights, out,
                                    out_dtype, err);
}

extern "C" epx_status epx_gpu_ep_combine(epx_gpu_ep *ep, float *out, epx_error *err) {
    return epx_gpu_ep_combine_ex(ep, NULL, NULL, out, EPX_DTYPE_F32, err);
}

extern "C" epx_status epx_gpu_ep_set_stream(epx_gpu_ep *ep, cudaStream_t stream, epx_error *err) {
    if (ep == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP set_stream needs a handle");
    if (stream == ep->stream) return EPX_OK;
    /* The handle's launches stay in order across streams: the new stream
     * waits for what the old one holds. Not where either stream is being
     * captured (a capture must not depend on outside work; torch's capture
     * stream already waits for the stream it was entered from). */
    cudaStreamCaptureStatus a = cudaStreamCaptureStatusNone, b = cudaStreamCaptureStatusNone;
    EPXI_CUDA_TRY(cudaStreamIsCapturing(ep->stream, &a), "GPU EP: the old stream's capture");
    EPXI_CUDA_TRY(cudaStreamIsCapturing(stream, &b), "GPU EP: the new stream's capture");
    if (a == cudaStreamCaptureStatusNone && b == cudaStreamCaptureStatusNone) {
        EPXI_CUDA_TRY(cudaEventRecord(ep->chain, ep->stream), "GPU EP: stream change");
        EPXI_CUDA_TRY(cudaStreamWaitEvent(stream, ep->chain, 0), "GPU EP: stream change");
    }
    ep->stream = stream;
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_set_token_bound(epx_gpu_ep *ep, int64_t bound, epx_error *err) {
    EPX_TRY(ready(ep, "set_token_bound", err));
    const epxi_ep_geom *g = &ep->g;
    if (bound < 1 || bound > g->M)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP token bound %lld is outside [1, max_tokens %lld]: give the most "
                         "tokens any rank dispatches per call",
                         (long long)bound, (long long)g->M);
    if (ep->state == epx_gpu_ep::D_SENT || ep->state == epx_gpu_ep::C_SENT)
        return bad_order(ep, "set_token_bound", "run its receive half first", err);
    if (ep->agree != NULL) {
        /* the ranks' bounds are compared on the stream and waited for */
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        EPXI_CUDA_TRY(cudaStreamIsCapturing(ep->stream, &cs), "GPU EP set_token_bound");
        if (cs != cudaStreamCaptureStatusNone)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "GPU EP set_token_bound while its stream is being captured: over "
                             "nccl the ranks compare their bounds and wait for the answer; set "
                             "it before the capture");
        EPX_TRY(ep->agree(ep->exchange_ctx, bound, "epx_gpu_ep_set_token_bound", ep->stream, err));
    }
    set_bound(ep, bound);
    /* A combine may return the last dispatch again, but not across a new
     * bound (its rows may not fit the blocks): every rank starts afresh. */
    if (ep->state == epx_gpu_ep::DISPATCHED) ep->state = epx_gpu_ep::IDLE;
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_disconnect(epx_gpu_ep *ep, epx_error *err) {
    if (ep == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP disconnect needs a handle");
    EPX_TRY(epxi_cuda_stream_wait(ep->stream, 2 * (int64_t)ep->timeout_ms + 1000, "GPU EP", err));
    unmap_peers(ep);
    ep->connected = false;
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_get_views(const epx_gpu_ep *ep, epx_gpu_ep_views *v,
                                           epx_error *err) {
    if (ep == NULL || v == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP views need a handle and an out struct");
    /* normal mode: the inbox's rows (entry_token of the recv view indexes them) */
    v->x = ep->a.compact ? ep->a.base + ep->a.off_rows : ep->a.rx;
    v->x_scales = ep->g.H % EPXI_FP8_GROUP == 0 && !ep->a.compact
                      ? ep->a.rx + (size_t)ep->a.spr * ep->a.RM * ep->g.H
                      : NULL;
    v->y = ep->a.y;
    v->counts = ep->a.count;
    v->src_token = ep->a.srctok;
    v->layout_range = ep->a.range;
    v->entry_weight = ep->a.ew;
    v->slot_stride = ep->a.compact ? 0 : ep->a.RM;
    v->num_local_slots = ep->a.spr;
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_sync(epx_gpu_ep *ep, epx_error *err) {
    if (ep == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP sync needs a handle");
    /* The kernels give up after timeout_ms per wait; allow a margin. */
    EPX_TRY(epxi_cuda_stream_wait(ep->stream, 2 * (int64_t)ep->timeout_ms + 1000, "GPU EP", err));
    return fault_status(ep, true, err);
}

extern "C" const char *epx_gpu_ep_transport_name(const epx_gpu_ep *ep) {
    if (ep == NULL || !ep->connected) return "none";
    if (ep->kind == EPX_GPU_EP_TRANSPORT_HOST) return "host";
    if (ep->kind == EPX_GPU_EP_TRANSPORT_NCCL) return "nccl";
    return ep->one_process ? "pointers" : "ipc";
}

extern "C" int32_t epx_gpu_ep_launches(const epx_gpu_ep *ep, const char *phase) {
    const bool known =
        phase != NULL && (strcmp(phase, "dispatch") == 0 || strcmp(phase, "combine") == 0);
    /* a staging transport runs each phase as two kernels around its copy */
    return !known ? 0 : ep != NULL && ep->exchange != NULL ? 2 : 1;
}

/* Measuring: the stamps of the last dispatch and combine (variant 8), in
 * microseconds after each kernel's start: [0..4] dispatch (1 sent and
 * counted, 2 arrived, 3 waited, 4 placed), [8..14] combine (13, 14: block
 * 0's first rows in, its sum done); the finer ones [16..31] dispatch's but
 * 25 and 26 (the combine's first send, its first reduce's barrier passed),
 * [32..47] the combine's. */
extern "C" EPXI_HIDDEN int epxi_gpu_ep_stamps(epx_gpu_ep *ep, double *us) {
    Ctl c;
    if (ep == NULL || cudaMemcpy(&c, ep->a.ctl, sizeof c, cudaMemcpyDeviceToHost) != cudaSuccess)
        return -1;
    /* From block 0's entry into each kernel (stamps 5 and 15); us[6] is the
     * SM clock in MHz over the dispatch (cycles 6 -> 7 over ns 5 -> 4). */
    for (int i = 0; i < 48; i++) {
        const bool disp = i < 8 || (i >= 16 && i < 32 && i != 25 && i != 26);
        unsigned long long base = c.stamp[disp ? 5 : 15];
        us[i] = c.stamp[i] >= base && base ? (double)(c.stamp[i] - base) * 1e-3 : -1.0;
    }
    const double ns = (double)(c.stamp[4] - c.stamp[5]);
    us[6] = c.stamp[7] > c.stamp[6] && ns > 0 ? (double)(c.stamp[7] - c.stamp[6]) / ns * 1e3 : -1;
    return 0;
}

/* Testing: the launches' epochs (the last dispatch's and combine's), read
 * and set between batches, so a test can cross the epochs' wrap. */
extern "C" EPXI_HIDDEN int epxi_gpu_ep_epochs(epx_gpu_ep *ep, uint32_t *de, uint32_t *ce) {
    Ctl c;
    if (ep == NULL || cudaStreamSynchronize(ep->stream) != cudaSuccess ||
        cudaMemcpy(&c, ep->a.ctl, sizeof c, cudaMemcpyDeviceToHost) != cudaSuccess)
        return -1;
    *de = (uint32_t)(c.de_started >> 32);
    *ce = (uint32_t)(c.ce_started >> 32);
    return 0;
}
extern "C" EPXI_HIDDEN int epxi_gpu_ep_set_epochs(epx_gpu_ep *ep, uint32_t epoch) {
    const unsigned long long w[2] = {(unsigned long long)epoch << 32,
                                     (unsigned long long)epoch << 32};
    static_assert(offsetof(Ctl, ce_started) == offsetof(Ctl, de_started) + sizeof w[0],
                  "the two epoch words sit together");
    if (ep == NULL || cudaStreamSynchronize(ep->stream) != cudaSuccess ||
        cudaMemcpy(&ep->a.ctl->de_started, w, sizeof w, cudaMemcpyHostToDevice) != cudaSuccess)
        return -1;
    return 0;
}

/* Measuring: kernel variants (their bits: the list above STAMP in ll_device.cuh); 0 = the default. */
extern "C" EPXI_HIDDEN void epxi_gpu_ep_variant(epx_gpu_ep *ep, int bits) {
    if (ep != NULL) ep->a.variant = bits;
}

/* Measuring: the bytes a staging transport moves per peer in phase 0
 * (dispatch) or 1 (combine) at the current token bound; 0 for a transport
 * that maps its peers. The benchmark's NCCL floor exchanges as many. */
extern "C" EPXI_HIDDEN size_t epxi_gpu_ep_staged_bytes(const epx_gpu_ep *ep, int phase) {
    if (ep == NULL || ep->exchange == NULL || phase < 0 || phase > 1) return 0;
    return ep->wire[phase].bytes;
}

/* Testing: a staging transport's outbox and inbox (its test transport
 * copies between several ranks' boxes in one process). */
extern "C" EPXI_HIDDEN void epxi_gpu_ep_staged_boxes(const epx_gpu_ep *ep, unsigned char **outbox,
                                                     unsigned char **inbox) {
    *outbox = ep != NULL ? ep->wire[0].outbox : NULL;
    *inbox = ep != NULL ? ep->wire[0].inbox : NULL;
}

/* Testing: the next dispatches publish no flags (a peer that never writes). */
extern "C" EPXI_HIDDEN void epxi_gpu_ep_inject_silence(epx_gpu_ep *ep, int on) {
    if (ep != NULL) ep->a.skip_flags = on;
}
