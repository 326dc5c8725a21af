/*
 * transport_nccl.cu - the NCCL transport (transport.h, staging): the
 * engine files each phase's sends in its outbox by destination, and this
 * file moves the blocks with ncclSend/ncclRecv in one group on the stream,
 * between the phase's sending and receiving kernels. Fixed-size blocks (the
 * counts travel in band, so the sizes are known on the host without a
 * synchronisation), so a captured graph replays the same calls. Built into
 * epx_nccl only (it needs NCCL); the engine itself stays NCCL-free.
 */
#include <cstdio>
#include <cstring>
#include <ctime>
#include <cuda_runtime.h>
#include <nccl.h>

/* first: it declares the core functions with C linkage */
#include "transport.h"
#include "staging.h"
#include "cuda_check.h"
#include "epx_comm_nccl.h"

namespace {

struct Ctx {
    ncclComm_t comm;
};

epx_status nccl_fail(ncclResult_t r, const char *what, epx_error *err) {
    return epxi_fail(err, EPX_ERR_COMM, "GPU EP nccl transport: %s failed: %s", what,
                     ncclGetErrorString(r));
}

/* A communicator made non-blocking (epx_nccl_comm_init) answers a group
 * or collective with ncclInProgress while it is still being enqueued: wait
 * for that (not for the transfer) against a deadline. */
ncclResult_t settle(ncclComm_t comm, ncclResult_t r) {
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (r == ncclInProgress) {
        if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) return ncclInternalError;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (r == ncclInProgress && now.tv_sec - t0.tv_sec > 60) return ncclInternalError;
    }
    return r;
}

} // namespace

/* One phase's blocks to and from every peer in one send/receive group on
 * `s` (a cudaStream_t), laid out as epxi_ll_phase_blocks describes (plain
 * arguments, so that the benchmark's NCCL floor, tools/epx/bench_ll.c,
 * moves its bytes exactly as the transport does without this room's
 * headers). */
extern "C" EPXI_HIDDEN ncclResult_t epxi_nccl_swap(ncclComm_t comm, const unsigned char *outbox,
                                                   unsigned char *inbox, int32_t R, size_t off,
                                                   size_t stride, size_t bytes, void *s) {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;
    for (int32_t p = 0; p < R && r == ncclSuccess; p++) {
        const size_t at = off + (size_t)p * stride;
        r = ncclSend(outbox + at, bytes, ncclUint8, p, comm, (cudaStream_t)s);
        if (r == ncclSuccess) r = ncclRecv(inbox + at, bytes, ncclUint8, p, comm, (cudaStream_t)s);
    }
    const ncclResult_t e = settle(comm, ncclGroupEnd());
    return r != ncclSuccess ? r : e;
}

namespace {

epx_status exchange(void *ctx, const epxi_ll_phase_blocks *b, void *stream, epx_error *err) {
    const ncclResult_t r = epxi_nccl_swap(((const Ctx *)ctx)->comm, b->outbox, b->inbox, b->R,
                                          b->off, b->stride, b->bytes, stream);
    return r == ncclSuccess ? EPX_OK : nccl_fail(r, "a phase's ncclSend/ncclRecv group", err);
}

/* Every rank's `bytes` of `mine` through the communicator into `all` (host,
 * R * bytes, rank order), waited for on s. */
epx_status gather(ncclComm_t comm, int32_t R, const void *mine, size_t bytes, void *all,
                  const char *what, cudaStream_t s, epx_error *err) {
    void *d = NULL;
    epx_status st = EPX_OK;
    EPXI_CUDA_GOTO(st, cudaMalloc(&d, (size_t)(R + 1) * bytes), what, done);
    EPXI_CUDA_GOTO(st, cudaMemcpy(d, mine, bytes, cudaMemcpyHostToDevice), what, done);
    {
        ncclResult_t r =
            settle(comm, ncclAllGather(d, (unsigned char *)d + bytes, bytes, ncclUint8, comm, s));
        if (r != ncclSuccess) {
            st = nccl_fail(r, what, err);
            goto done;
        }
    }
    EPX_TRY_GOTO(st, epxi_cuda_stream_wait(s, 60000, what, err), done);
    EPXI_CUDA_GOTO(
        st, cudaMemcpy(all, (unsigned char *)d + bytes, (size_t)R * bytes, cudaMemcpyDeviceToHost),
        what, done);
done:
    cudaFree(d);
    return st;
}

/* Every rank's shape through the communicator: a rank with another config
 * would post sends of other sizes, which NCCL cannot tell from a hang. */
epx_status same_config(ncclComm_t comm, int32_t R, int32_t me, const epx_ep_config *cfg,
                       cudaStream_t s, epx_error *err) {
    const epxi_ll_shape mine = epxi_ll_shape_of(cfg, R);
    epxi_ll_shape *all =
        (epxi_ll_shape *)epxi_calloc((size_t)R, sizeof(epxi_ll_shape), "GPU EP nccl configs", err);
    if (all == NULL) return EPX_ERR_NOMEM;
    epx_status st = gather(comm, R, &mine, sizeof mine, all, "GPU EP nccl configs", s, err);
    for (int32_t r = 0; r < R && st == EPX_OK; r++) {
        char a_s[160], b_s[160];
        epxi_ll_shape_describe(&mine, a_s, sizeof a_s);
        epxi_ll_shape_describe(&all[r], b_s, sizeof b_s);
        if (strcmp(a_s, b_s) != 0)
            st = epxi_fail(err, EPX_ERR_INVALID_ARG,
                           "GPU EP over nccl: rank %d has %s but rank %d has %s; every rank "
                           "must create the engine with the same config",
                           me, a_s, r, b_s);
    }
    free(all);
    return st;
}

/* The staged blocks' size must be one on every rank, or a send would meet
 * a receive of another length (a hang NCCL cannot report). */
epx_status agree(void *ctx, int64_t value, const char *what, void *stream, epx_error *err) {
    const Ctx *c = (const Ctx *)ctx;
    int R = 0, me = 0;
    ncclResult_t r = ncclCommCount(c->comm, &R);
    if (r == ncclSuccess) r = ncclCommUserRank(c->comm, &me);
    if (r != ncclSuccess) return nccl_fail(r, "ncclCommCount/UserRank", err);
    int64_t *all = (int64_t *)epxi_calloc((size_t)R, sizeof(int64_t), what, err);
    if (all == NULL) return EPX_ERR_NOMEM;
    epx_status st = gather(c->comm, R, &value, sizeof value, all, what, (cudaStream_t)stream, err);
    for (int32_t p = 0; p < R && st == EPX_OK; p++)
        if (all[p] != value)
            st = epxi_fail(err, EPX_ERR_INVALID_ARG,
                           "GPU EP over nccl: %s got %lld on rank %d but %lld on rank %d; every "
                           "rank must pass the same value",
                           what, (long long)value, me, (long long)all[p], p);
    free(all);
    return st;
}

} // namespace

extern "C" epx_status epx_gpu_ep_create_nccl(ncclComm_t comm, const epx_ep_config *cfg,
                                             cudaStream_t stream, const epx_gpu_ep_opts *opts,
                                             epx_gpu_ep **out, epx_error *err) {
    if (comm == NULL || cfg == NULL || out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_gpu_ep_create_nccl needs a communicator, a config and an out "
                         "pointer");
    *out = NULL;
    int R = 0, me = 0;
    ncclResult_t r = ncclCommCount(comm, &R);
    if (r == ncclSuccess) r = ncclCommUserRank(comm, &me);
    if (r != ncclSuccess) return nccl_fail(r, "ncclCommCount/UserRank", err);
    EPX_TRY(same_config(comm, R, me, cfg, stream, err));
    Ctx *c = (Ctx *)epxi_calloc(1, sizeof(Ctx), "GPU EP nccl transport", err);
    if (c == NULL) return EPX_ERR_NOMEM;
    c->comm = comm;
    const epxi_ll_staging ops = {exchange, agree, c};
    return epxi_gpu_ep_open_staging(cfg, me, R, stream, opts, &ops, out, err);
}
