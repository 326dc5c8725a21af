/*
 * nccl_comm.c - the NCCL backend of epx_comm: device buffers, work on the
 * caller's stream, and waits that cannot hang.
 *
 * NCCL blocks inside kernels when a peer is missing, so a plain
 * cudaStreamSynchronize could wait forever. Every wait here polls
 * cudaStreamQuery together with ncclCommGetAsyncError against a deadline;
 * on an asynchronous error or at the deadline it calls ncclCommAbort, which
 * releases the stuck kernels, and returns an error. Communicators made with
 * epx_nccl_comm_init are non-blocking (config.blocking = 0), so even their
 * creation and every enqueue that returns ncclInProgress is waited out the
 * same way. All-to-all is a group of ncclSend/ncclRecv pairs, which is how
 * NCCL itself builds one.
 */
#include "epx_comm_nccl.h"
#include "nccl_internal.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void pause_step(long spin) {
    if (spin < 2000) {
        sched_yield();
    } else {
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
}

static void do_abort(epxi_nccl_ctx *c) {
    if (!c->aborted) {
        c->aborted = true;
        ncclCommAbort(c->comm);
    }
}

static epx_status nccl_fail(epxi_nccl_ctx *c, ncclResult_t r, const char *what, epx_error *err) {
    const char *last = c->aborted ? "" : ncclGetLastError(c->comm);
    epxi_fail(err, EPX_ERR_COMM, "NCCL %s failed on rank %d: %s%s%s", what, c->rank,
              ncclGetErrorString(r), last && last[0] ? ": " : "", last ? last : "");
    do_abort(c);
    return EPX_ERR_COMM;
}

epx_status epxi_nccl_check(epxi_nccl_ctx *c, ncclResult_t r, const char *what, epx_error *err) {
    if (r == ncclSuccess) return EPX_OK;
    if (r != ncclInProgress) return nccl_fail(c, r, what, err);
    double deadline = now_ms() + c->timeout_ms;
    for (long spin = 0;; spin++) {
        ncclResult_t a = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(c->comm, &a);
        if (q != ncclSuccess) return nccl_fail(c, q, what, err);
        if (a == ncclSuccess) return EPX_OK;
        if (a != ncclInProgress) return nccl_fail(c, a, what, err);
        if (now_ms() > deadline) {
            do_abort(c);
            return epxi_fail(err, EPX_ERR_TIMEOUT,
                             "NCCL %s on rank %d did not finish within %d ms; the communicator "
                             "was aborted",
                             what, c->rank, c->timeout_ms);
        }
        pause_step(spin);
    }
}

epx_status epxi_nccl_wait(epxi_nccl_ctx *c, const char *what, epx_error *err) {
    if (c->aborted)
        return epxi_fail(err, EPX_ERR_COMM, "NCCL %s: the communicator was aborted earlier", what);
    double deadline = now_ms() + c->timeout_ms;
    for (long spin = 0;; spin++) {
        cudaError_t q = cudaStreamQuery(c->stream);
        ncclResult_t a = ncclSuccess;
        ncclResult_t g = ncclCommGetAsyncError(c->comm, &a);
        if (g != ncclSuccess) return nccl_fail(c, g, what, err);
        if (a != ncclSuccess && a != ncclInProgress) return nccl_fail(c, a, what, err);
        if (q == cudaSuccess) return EPX_OK;
        if (q != cudaErrorNotReady) {
            do_abort(c);
            return epxi_cuda_fail(q, what, err);
        }
        if (now_ms() > deadline) {
            do_abort(c);
            return epxi_fail(err, EPX_ERR_TIMEOUT,
                             "NCCL %s on rank %d: the stream did not finish within %d ms (a peer "
                             "died or stopped?); the communicator was aborted",
                             what, c->rank, c->timeout_ms);
        }
        pause_step(spin);
    }
}

epxi_nccl_ctx *epxi_nccl_ctx_of(const epx_comm *comm) {
    if (comm == NULL || strcmp(epx_comm_name(comm), "nccl") != 0) return NULL;
    epxi_nccl_ctx *c = epx_comm_backend_ctx(comm);
    return c != NULL && c->magic == EPXI_NCCL_MAGIC ? c : NULL;
}

/* ---- the ops table ------------------------------------------------------ */

static epx_status n_alltoallv(void *ctx, const void *send, const int64_t *send_counts,
                              const int64_t *send_displs, void *recv, const int64_t *recv_counts,
                              const int64_t *recv_displs, size_t elem_bytes, epx_error *err) {
    epxi_nccl_ctx *c = ctx;
    EPX_TRY(epxi_nccl_check(c, ncclGroupStart(), "group start", err));
    ncclResult_t r = ncclSuccess;
    for (int32_t p = 0; p < c->size && r == ncclSuccess; p++) {
        if (send_counts[p] > 0)
            r = ncclSend((const char *)send + (size_t)send_displs[p] * elem_bytes,
                         (size_t)send_counts[p] * elem_bytes, ncclUint8, p, c->comm, c->stream);
        if (r == ncclSuccess && recv_counts[p] > 0)
            r = ncclRecv((char *)recv + (size_t)recv_displs[p] * elem_bytes,
                         (size_t)recv_counts[p] * elem_bytes, ncclUint8, p, c->comm, c->stream);
    }
    ncclResult_t e = ncclGroupEnd();
    if (r != ncclSuccess) return nccl_fail(c, r, "send/recv", err);
    return epxi_nccl_check(c, e, "alltoallv", err);
}

static epx_status n_allreduce(void *ctx, const void *send, void *recv, int64_t count,
                              epx_dtype dtype, epx_error *err) {
    epxi_nccl_ctx *c = ctx;
    ncclDataType_t t = dtype == EPX_DTYPE_F32    ? ncclFloat32
                       : dtype == EPX_DTYPE_BF16 ? ncclBfloat16
                                                 : ncclInt64;
    return epxi_nccl_check(c,
                           ncclAllReduce(send, recv, (size_t)count, t, ncclSum, c->comm, c->stream),
                           "allreduce", err);
}

static epx_status n_wait(void *ctx, epx_error *err) { return epxi_nccl_wait(ctx, "wait", err); }

static epx_status n_barrier(void *ctx, epx_error *err) {
    epxi_nccl_ctx *c = ctx;
    EPX_TRY(epxi_nccl_check(
        c, ncclAllReduce(c->scratch, c->scratch, 1, ncclInt64, ncclSum, c->comm, c->stream),
        "barrier", err));
    return epxi_nccl_wait(c, "barrier", err);
}

static void n_abort(void *ctx) { do_abort(ctx); }

static void n_destroy(void *ctx) {
    epxi_nccl_ctx *c = ctx;
    if (c == NULL) return;
    if (c->scratch != NULL) cudaFree(c->scratch);
    free(c);
}

epx_status epx_comm_nccl_create(ncclComm_t comm, cudaStream_t stream,
                                const epx_comm_nccl_opts *opts, epx_comm **out, epx_error *err) {
    epx_comm_nccl_opts o = EPX_COMM_NCCL_OPTS_INIT;
    if (opts != NULL) {
        if (opts->version != EPX_COMM_NCCL_OPTS_VERSION)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "NCCL options version %u is not %u: initialise them from "
                             "EPX_COMM_NCCL_OPTS_INIT",
                             opts->version, EPX_COMM_NCCL_OPTS_VERSION);
        o = *opts;
    }
    if (comm == NULL || out == NULL || o.timeout_ms < 1)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "NCCL communicator needs a ncclComm_t, an out pointer and timeout_ms "
                         ">= 1 (got %d)",
                         o.timeout_ms);
    epxi_nccl_ctx *c = epxi_calloc(1, sizeof *c, "NCCL communicator", err);
    if (c == NULL) return EPX_ERR_NOMEM;
    c->magic = EPXI_NCCL_MAGIC;
    c->comm = comm;
    c->stream = stream;
    c->timeout_ms = o.timeout_ms;
    int rank = 0, size = 0;
    ncclResult_t r = ncclCommUserRank(comm, &rank);
    if (r == ncclSuccess) r = ncclCommCount(comm, &size);
    if (r != ncclSuccess) {
        free(c);
        return epxi_fail(err, EPX_ERR_COMM, "NCCL rank/count query failed: %s",
                         ncclGetErrorString(r));
    }
    c->rank = rank;
    c->size = size;
    cudaError_t ce = cudaMalloc((void **)&c->scratch, sizeof(int64_t));
    if (ce == cudaSuccess) ce = cudaMemsetAsync(c->scratch, 0, sizeof(int64_t), stream);
    if (ce != cudaSuccess) {
        n_destroy(c);
        return epxi_cuda_fail(ce, "NCCL communicator scratch", err);
    }
    static const epx_comm_ops ops = {EPX_COMM_OPS_VERSION,
                                     "nccl",
                                     EPX_COMM_MEMORY_DEVICE,
                                     n_alltoallv,
                                     n_allreduce,
                                     n_barrier,
                                     n_wait,
                                     n_abort,
                                     n_destroy};
    return epx_comm_create(&ops, c, rank, size, out, err);
}

/* ---- creation helpers ----------------------------------------------------- */

epx_status epx_nccl_comm_init(int32_t nranks, int32_t rank, const ncclUniqueId *id,
                              int32_t timeout_ms, ncclComm_t *out, epx_error *err) {
    if (id == NULL || out == NULL || nranks < 1 || rank < 0 || rank >= nranks || timeout_ms < 1)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "NCCL init of rank %d of %d needs an id, an out pointer and a timeout "
                         ">= 1 ms",
                         rank, nranks);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, *id, rank, &cfg);
    epxi_nccl_ctx tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.comm = comm;
    tmp.rank = rank;
    tmp.timeout_ms = timeout_ms;
    if (comm == NULL && r != ncclSuccess && r != ncclInProgress)
        return epxi_fail(err, EPX_ERR_COMM, "ncclCommInitRankConfig failed on rank %d: %s", rank,
                         ncclGetErrorString(r));
    epx_status st = epxi_nccl_check(&tmp, r, "communicator init", err);
    if (st != EPX_OK) return st; /* already aborted */
    *out = comm;
    return EPX_OK;
}

epx_status epx_nccl_id_exchange_file(const char *path, int32_t rank, int32_t timeout_ms,
                                     ncclUniqueId *id, epx_error *err) {
    if (path == NULL || id == NULL || rank < 0 || timeout_ms < 1)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "NCCL id exchange needs a path, an id, rank >= 0 "
                         "and timeout_ms >= 1");
    if (rank == 0) {
        ncclResult_t r = ncclGetUniqueId(id);
        if (r != ncclSuccess)
            return epxi_fail(err, EPX_ERR_COMM, "ncclGetUniqueId failed: %s",
                             ncclGetErrorString(r));
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
        FILE *f = fopen(tmp, "wb");
        if (f == NULL)
            return epxi_fail(err, EPX_ERR_IO, "cannot write NCCL id file '%s': %s", tmp,
                             strerror(errno));
        size_t n = fwrite(id, sizeof *id, 1, f);
        if (fclose(f) != 0 || n != 1 || rename(tmp, path) != 0) {
            remove(tmp);
            return epxi_fail(err, EPX_ERR_IO, "cannot write NCCL id file '%s'", path);
        }
        return EPX_OK;
    }
    double deadline = now_ms() + timeout_ms;
    for (;;) {
        FILE *f = fopen(path, "rb");
        if (f != NULL) {
            size_t n = fread(id, sizeof *id, 1, f);
            fclose(f);
            if (n == 1) return EPX_OK;
        }
        if (now_ms() > deadline)
            return epxi_fail(err, EPX_ERR_TIMEOUT,
                             "rank %d: NCCL id file '%s' did not appear within %d ms: is rank 0 "
                             "running, with the same path?",
                             rank, path, timeout_ms);
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
}
