/*
 * comm.c - the communicator handle over a backend's table of operations, the
 * one-rank local backend and a fault-injecting wrapper.
 *
 * The handle adds what every backend would otherwise repeat: argument
 * checks, and the sticky failure state. After a call fails with
 * EPX_ERR_COMM or EPX_ERR_TIMEOUT the peers no longer agree on where they
 * are in the sequence of collectives, so any further collective could pair
 * up the wrong messages; the handle refuses them and keeps naming the first
 * failure, which is the one worth reporting.
 */
#include "comm_internal.h"

#include <math.h>
#include <string.h>

struct epx_comm {
    epx_comm_ops ops;
    void *ctx;
    int32_t rank, size;
    epx_status failed; /* EPX_OK while healthy */
    char failure[EPX_ERRMSG_MAX];
};

epx_status epx_comm_create(const epx_comm_ops *ops, void *ctx, int32_t rank, int32_t size,
                           epx_comm **out, epx_error *err) {
    epx_status st = EPX_OK;
    if (ops == NULL || out == NULL) {
        st = epxi_fail(err, EPX_ERR_INVALID_ARG, "communicator ops and out must not be NULL");
    } else if (ops->version != EPX_COMM_OPS_VERSION) {
        st = epxi_fail(err, EPX_ERR_INVALID_ARG,
                       "communicator ops version %u is not %u: set version = "
                       "EPX_COMM_OPS_VERSION",
                       ops->version, EPX_COMM_OPS_VERSION);
    } else if (ops->alltoallv == NULL || ops->allreduce_sum == NULL || ops->barrier == NULL) {
        st = epxi_fail(err, EPX_ERR_INVALID_ARG,
                       "communicator '%s' lacks alltoallv, allreduce_sum or barrier: all three "
                       "are required",
                       ops->name ? ops->name : "?");
    } else if (size < 1 || size > EPX_MAX_GPUS || rank < 0 || rank >= size) {
        st = epxi_fail(err, EPX_ERR_INVALID_ARG,
                       "communicator rank %d of size %d is invalid: need 0 <= rank < size <= %d",
                       rank, size, EPX_MAX_GPUS);
    } else if (ops->memory == EPX_COMM_MEMORY_DEVICE && ops->wait == NULL) {
        st = epxi_fail(err, EPX_ERR_INVALID_ARG, "device communicator '%s' needs a wait operation",
                       ops->name ? ops->name : "?");
    }
    epx_comm *c = NULL;
    if (st == EPX_OK) {
        c = epxi_calloc(1, sizeof *c, "communicator", err);
        if (c == NULL) st = EPX_ERR_NOMEM;
    }
    if (st != EPX_OK) {
        if (ops != NULL && ops->destroy != NULL && ctx != NULL) ops->destroy(ctx);
        return st;
    }
    c->ops = *ops;
    if (c->ops.name == NULL) c->ops.name = "unnamed";
    c->ctx = ctx;
    c->rank = rank;
    c->size = size;
    *out = c;
    return EPX_OK;
}

void epx_comm_destroy(epx_comm *comm) {
    if (comm == NULL) return;
    if (comm->ops.destroy != NULL) comm->ops.destroy(comm->ctx);
    free(comm);
}

int32_t epx_comm_rank(const epx_comm *comm) { return comm ? comm->rank : -1; }
int32_t epx_comm_size(const epx_comm *comm) { return comm ? comm->size : 0; }
const char *epx_comm_name(const epx_comm *comm) { return comm ? comm->ops.name : "none"; }
epx_comm_memory epx_comm_memory_kind(const epx_comm *comm) {
    return comm ? comm->ops.memory : EPX_COMM_MEMORY_HOST;
}

void *epx_comm_backend_ctx(const epx_comm *comm) { return comm ? comm->ctx : NULL; }

epx_status epx_comm_health(const epx_comm *comm, epx_error *err) {
    if (comm == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "communicator is NULL");
    if (comm->failed != EPX_OK) return epxi_fail(err, comm->failed, "%s", comm->failure);
    return EPX_OK;
}

/* Before a collective: refuse on a poisoned handle. */
static epx_status precheck(const epx_comm *comm, const char *what, epx_error *err) {
    if (comm == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "%s: communicator is NULL", what);
    if (comm->failed != EPX_OK)
        return epxi_fail(err, EPX_ERR_COMM,
                         "%s on rank %d: the communicator failed earlier and cannot be used "
                         "again (%s)",
                         what, comm->rank, comm->failure);
    return EPX_OK;
}

/* After a collective: a communication failure poisons the handle. */
static epx_status record(epx_comm *comm, epx_status st, epx_error *err) {
    if (st == EPX_ERR_COMM || st == EPX_ERR_TIMEOUT) {
        comm->failed = st;
        snprintf(comm->failure, sizeof comm->failure, "%s",
                 err && err->msg[0] ? err->msg : epx_status_str(st));
    }
    return st;
}

void epxi_comm_poison(epx_comm *comm, epx_status st, const char *msg) {
    if (comm == NULL || comm->failed != EPX_OK) return;
    comm->failed = st;
    snprintf(comm->failure, sizeof comm->failure, "%s", msg);
}

epx_status epx_comm_alltoallv(epx_comm *comm, const void *send, const int64_t *send_counts,
                              const int64_t *send_displs, void *recv, const int64_t *recv_counts,
                              const int64_t *recv_displs, size_t elem_bytes, epx_error *err) {
    EPX_TRY(precheck(comm, "alltoallv", err));
    if (send_counts == NULL || send_displs == NULL || recv_counts == NULL || recv_displs == NULL ||
        elem_bytes == 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "alltoallv needs [size] counts and displacements and elem_bytes > 0");
    if (send != NULL && send == recv)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "alltoallv: send and receive buffers are the same (%p); the exchange "
                         "is not in place, give it a separate receive buffer",
                         send);
    int64_t nsend = 0, nrecv = 0;
    for (int32_t r = 0; r < comm->size; r++) {
        if (send_counts[r] < 0 || send_displs[r] < 0 || recv_counts[r] < 0 || recv_displs[r] < 0)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "alltoallv peer %d: counts and displacements must be >= 0 "
                             "(send %lld at %lld, recv %lld at %lld)",
                             r, (long long)send_counts[r], (long long)send_displs[r],
                             (long long)recv_counts[r], (long long)recv_displs[r]);
        nsend += send_counts[r];
        nrecv += recv_counts[r];
    }
    if ((nsend > 0 && send == NULL) || (nrecv > 0 && recv == NULL))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "alltoallv: NULL buffer with %lld elements to send, %lld to receive",
                         (long long)nsend, (long long)nrecv);
    return record(comm,
                  comm->ops.alltoallv(comm->ctx, send, send_counts, send_displs, recv, recv_counts,
                                      recv_displs, elem_bytes, err),
                  err);
}

epx_status epx_comm_allreduce_sum(epx_comm *comm, const void *send, void *recv, int64_t count,
                                  epx_dtype dtype, epx_error *err) {
    EPX_TRY(precheck(comm, "allreduce", err));
    if (count < 0 || (count > 0 && (send == NULL || recv == NULL)))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "allreduce: count %lld must be >= 0 with non-NULL buffers",
                         (long long)count);
    if (dtype != EPX_DTYPE_F32 && dtype != EPX_DTYPE_BF16 && dtype != EPX_DTYPE_I64)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "allreduce: dtype %d is not F32, BF16 or I64",
                         (int)dtype);
    return record(comm, comm->ops.allreduce_sum(comm->ctx, send, recv, count, dtype, err), err);
}

epx_status epx_comm_barrier(epx_comm *comm, epx_error *err) {
    EPX_TRY(precheck(comm, "barrier", err));
    return record(comm, comm->ops.barrier(comm->ctx, err), err);
}

epx_status epx_comm_wait(epx_comm *comm, epx_error *err) {
    EPX_TRY(precheck(comm, "wait", err));
    if (comm->ops.wait == NULL) return EPX_OK;
    return record(comm, comm->ops.wait(comm->ctx, err), err);
}

void epx_comm_abort(epx_comm *comm) {
    if (comm == NULL) return;
    if (comm->ops.abort != NULL) comm->ops.abort(comm->ctx);
    if (comm->failed == EPX_OK) {
        comm->failed = EPX_ERR_COMM;
        snprintf(comm->failure, sizeof comm->failure, "rank %d aborted its communicator",
                 comm->rank);
    }
}

/* ---- the local backend: one rank, host memory ----------------------------- */

static epx_status local_alltoallv(void *ctx, const void *send, const int64_t *send_counts,
                                  const int64_t *send_displs, void *recv,
                                  const int64_t *recv_counts, const int64_t *recv_displs,
                                  size_t elem_bytes, epx_error *err) {
    (void)ctx;
    if (send_counts[0] != recv_counts[0])
        return epxi_fail(err, EPX_ERR_COMM,
                         "local alltoallv: sending %lld elements to itself but expecting %lld",
                         (long long)send_counts[0], (long long)recv_counts[0]);
    if (send_counts[0] > 0)
        memmove((char *)recv + (size_t)recv_displs[0] * elem_bytes,
                (const char *)send + (size_t)send_displs[0] * elem_bytes,
                (size_t)send_counts[0] * elem_bytes);
    return EPX_OK;
}

static epx_status local_allreduce(void *ctx, const void *send, void *recv, int64_t count,
                                  epx_dtype dtype, epx_error *err) {
    (void)ctx;
    (void)err;
    if (send != recv && count > 0) memmove(recv, send, (size_t)count * epx_dtype_size(dtype));
    return EPX_OK;
}

static epx_status local_barrier(void *ctx, epx_error *err) {
    (void)ctx;
    (void)err;
    return EPX_OK;
}

epx_status epx_comm_create_local(epx_comm **out, epx_error *err) {
    static const epx_comm_ops ops = {EPX_COMM_OPS_VERSION,
                                     "local",
                                     EPX_COMM_MEMORY_HOST,
                                     local_alltoallv,
                                     local_allreduce,
                                     local_barrier,
                                     NULL,
                                     NULL,
                                     NULL};
    return epx_comm_create(&ops, NULL, 0, 1, out, err);
}

/* ---- the faulty wrapper ---------------------------------------------------- */

typedef struct faulty {
    epx_comm *inner;
    int64_t fail_at, calls;
} faulty;

static epx_status faulty_step(faulty *f, const char *what, epx_error *err) {
    f->calls++;
    if (f->fail_at > 0 && f->calls >= f->fail_at)
        return epxi_fail(err, EPX_ERR_COMM,
                         "injected fault: %s (collective call %lld, failing from call %lld on)",
                         what, (long long)f->calls, (long long)f->fail_at);
    return EPX_OK;
}

static epx_status faulty_alltoallv(void *ctx, const void *send, const int64_t *send_counts,
                                   const int64_t *send_displs, void *recv,
                                   const int64_t *recv_counts, const int64_t *recv_displs,
                                   size_t elem_bytes, epx_error *err) {
    faulty *f = ctx;
    EPX_TRY(faulty_step(f, "alltoallv", err));
    return epx_comm_alltoallv(f->inner, send, send_counts, send_displs, recv, recv_counts,
                              recv_displs, elem_bytes, err);
}

static epx_status faulty_allreduce(void *ctx, const void *send, void *recv, int64_t count,
                                   epx_dtype dtype, epx_error *err) {
    faulty *f = ctx;
    EPX_TRY(faulty_step(f, "allreduce", err));
    return epx_comm_allreduce_sum(f->inner, send, recv, count, dtype, err);
}

static epx_status faulty_barrier(void *ctx, epx_error *err) {
    faulty *f = ctx;
    EPX_TRY(faulty_step(f, "barrier", err));
    return epx_comm_barrier(f->inner, err);
}

static epx_status faulty_wait(void *ctx, epx_error *err) {
    faulty *f = ctx;
    return epx_comm_wait(f->inner, err);
}

static void faulty_destroy(void *ctx) { free(ctx); }

epx_status epx_comm_create_faulty(epx_comm *inner, int64_t fail_at, epx_comm **out,
                                  epx_error *err) {
    if (inner == NULL || fail_at < 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "faulty communicator needs an inner communicator and fail_at >= 0 "
                         "(got %lld)",
                         (long long)fail_at);
    faulty *f = epxi_calloc(1, sizeof *f, "faulty communicator", err);
    if (f == NULL) return EPX_ERR_NOMEM;
    f->inner = inner;
    f->fail_at = fail_at;
    epx_comm_ops ops = {EPX_COMM_OPS_VERSION,
                        "faulty",
                        inner->ops.memory,
                        faulty_alltoallv,
                        faulty_allreduce,
                        faulty_barrier,
                        inner->ops.wait ? faulty_wait : NULL,
                        NULL,
                        faulty_destroy};
    return epx_comm_create(&ops, f, inner->rank, inner->size, out, err);
}
