/*
 * mpi.c - the MPI backend of epx_comm: host buffers over a private duplicate
 * of the caller's communicator.
 *
 * No call here blocks inside MPI. Each operation starts a non-blocking
 * collective and polls MPI_Test against a deadline, so a peer that died or
 * stopped turns into EPX_ERR_TIMEOUT after opts.timeout_ms instead of a
 * hang; MPI_ERRORS_RETURN on the duplicate turns MPI's own failures into
 * EPX_ERR_COMM with MPI's message. A request that timed out cannot be
 * cancelled (MPI forbids cancelling collectives): it is abandoned with its
 * buffers, and the handle is poisoned by the layer above.
 *
 * Counts travel as MPI ints in units of a contiguous datatype of the
 * element size, so a payload of many gigabytes stays within int counts; the
 * few element sizes in use are committed once and cached. An all-reduce
 * sums elements, so it cannot take that route: past EPX_MPI_MAX_COUNT
 * elements (INT_MAX unless set lower) it runs as several calls.
 */
#include "internal.h"
#include "epx_comm_mpi.h"

#include <limits.h>
#include <sched.h>
#include <string.h>
#include <time.h>

#define TYPE_CACHE 8

typedef struct mpi_ctx {
    MPI_Comm comm;
    int32_t rank, size, timeout_ms;
    bool broken; /* a request was abandoned: do not free the comm */
    struct {
        size_t bytes;
        MPI_Datatype type;
    } types[TYPE_CACHE];
    int ntypes;
    int *ibuf;         /* [4][size] int counts and displacements */
    int64_t max_count; /* the most elements one all-reduce call takes */
} mpi_ctx;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static epx_status mpi_fail(int rank, int rc, const char *what, epx_error *err) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "code %d", rc);
    return epxi_fail(err, EPX_ERR_COMM, "MPI %s failed on rank %d: %s", what, rank, msg);
}

/* Poll a request until it completes or the deadline passes. MPI makes
 * progress only inside MPI calls (a large message moves fragment by
 * fragment as both sides poll), so the loop keeps calling MPI_Test with
 * sched_yield between calls (oversubscribed ranks must let their peers run)
 * for the first SPIN_MS, and only then sleeps in short steps: a rank that
 * waits that long is waiting for a peer, not for bandwidth. */
#define SPIN_MS 100.0
static epx_status wait_request(mpi_ctx *c, MPI_Request *req, const char *what, epx_error *err) {
    double start = now_ms(), deadline = start + c->timeout_ms;
    for (;;) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            c->broken = true;
            return mpi_fail(c->rank, rc, what, err);
        }
        if (done) return EPX_OK;
        double t = now_ms();
        if (t > deadline) {
            c->broken = true;
            return epxi_fail(err, EPX_ERR_TIMEOUT,
                             "MPI %s on rank %d: no answer from the other %d rank(s) within "
                             "%d ms; a rank has died or stopped, or the timeout is too short",
                             what, c->rank, c->size - 1, c->timeout_ms);
        }
        if (t - start < SPIN_MS) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
}

static epx_status elem_type(mpi_ctx *c, size_t bytes, MPI_Datatype *out, epx_error *err) {
    for (int i = 0; i < c->ntypes; i++)
        if (c->types[i].bytes == bytes) {
            *out = c->types[i].type;
            return EPX_OK;
        }
    if (bytes > INT_MAX)
        return epxi_fail(err, EPX_ERR_OVERFLOW, "MPI element of %zu bytes exceeds INT_MAX", bytes);
    MPI_Datatype t;
    int rc = MPI_Type_contiguous((int)bytes, MPI_BYTE, &t);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&t);
    if (rc != MPI_SUCCESS) return mpi_fail(c->rank, rc, "Type_contiguous", err);
    if (c->ntypes == TYPE_CACHE) { /* evict the oldest; keeps the cache bounded */
        MPI_Type_free(&c->types[0].type);
        memmove(&c->types[0], &c->types[1], sizeof c->types[0] * (TYPE_CACHE - 1));
        c->ntypes--;
    }
    c->types[c->ntypes].bytes = bytes;
    c->types[c->ntypes].type = t;
    c->ntypes++;
    *out = t;
    return EPX_OK;
}

static epx_status to_int(int64_t v, int *out, const char *what, epx_error *err) {
    if (v > INT_MAX)
        return epxi_fail(err, EPX_ERR_OVERFLOW,
                         "MPI alltoallv %s of %lld elements exceeds INT_MAX: send fewer tokens "
                         "per batch",
                         what, (long long)v);
    *out = (int)v;
    return EPX_OK;
}

static epx_status mpi_alltoallv(void *ctx, const void *send, const int64_t *send_counts,
                                const int64_t *send_displs, void *recv, const int64_t *recv_counts,
                                const int64_t *recv_displs, size_t elem_bytes, epx_error *err) {
    mpi_ctx *c = ctx;
    MPI_Datatype t = MPI_BYTE;
    EPX_TRY(elem_type(c, elem_bytes, &t, err));
    int *sc = c->ibuf, *sd = sc + c->size, *rc_ = sd + c->size, *rd = rc_ + c->size;
    for (int32_t r = 0; r < c->size; r++) {
        EPX_TRY(to_int(send_counts[r], &sc[r], "send count", err));
        EPX_TRY(to_int(send_displs[r], &sd[r], "send displacement", err));
        EPX_TRY(to_int(recv_counts[r], &rc_[r], "receive count", err));
        EPX_TRY(to_int(recv_displs[r], &rd[r], "receive displacement", err));
    }
    /* MPI wants non-NULL buffers even for empty exchanges on some builds, and
     * Open MPI treats equal send and receive pointers as an in-place exchange
     * (which then deadlocks), so the two stand-ins must differ. */
    static char dummy_send[16], dummy_recv[16];
    MPI_Request req;
    int rc = MPI_Ialltoallv(send ? send : dummy_send, sc, sd, t, recv ? recv : dummy_recv, rc_, rd,
                            t, c->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(c->rank, rc, "Ialltoallv", err);
    return wait_request(c, &req, "alltoallv", err);
}

static epx_status mpi_allreduce(void *ctx, const void *send, void *recv, int64_t count,
                                epx_dtype dtype, epx_error *err) {
    mpi_ctx *c = ctx;
    MPI_Datatype t;
    if (dtype == EPX_DTYPE_F32)
        t = MPI_FLOAT;
    else if (dtype == EPX_DTYPE_I64)
        t = MPI_INT64_T;
    else
        return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                         "MPI allreduce of dtype %d: MPI has no bf16 sum; reduce in F32",
                         (int)dtype);
    /* in calls of at most max_count elements (every rank cuts the same
     * count the same way: the ranks agreed on the bound at creation), one
     * after the other; elementwise sums, so the result is the one call's */
    const size_t esize = dtype == EPX_DTYPE_F32 ? 4 : 8;
    for (int64_t done = 0; done < count;) {
        const int64_t n = count - done < c->max_count ? count - done : c->max_count;
        const size_t at = (size_t)done * esize;
        MPI_Request req;
        int rc = MPI_Iallreduce(send == recv ? MPI_IN_PLACE : (const char *)send + at,
                                (char *)recv + at, (int)n, t, MPI_SUM, c->comm, &req);
        if (rc != MPI_SUCCESS) return mpi_fail(c->rank, rc, "Iallreduce", err);
        EPX_TRY(wait_request(c, &req, "allreduce", err));
        done += n;
    }
    return EPX_OK;
}

static epx_status mpi_barrier(void *ctx, epx_error *err) {
    mpi_ctx *c = ctx;
    MPI_Request req;
    int rc = MPI_Ibarrier(c->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(c->rank, rc, "Ibarrier", err);
    return wait_request(c, &req, "barrier", err);
}

static void mpi_abort_op(void *ctx) {
    /* MPI has no way to abort one communicator without ending the job;
     * marking it broken keeps destroy from touching it. */
    ((mpi_ctx *)ctx)->broken = true;
}

static void mpi_destroy(void *ctx) {
    mpi_ctx *c = ctx;
    if (c == NULL) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin && !c->broken) {
        for (int i = 0; i < c->ntypes; i++) MPI_Type_free(&c->types[i].type);
        if (c->comm != MPI_COMM_NULL) MPI_Comm_free(&c->comm);
    }
    free(c->ibuf);
    free(c);
}

epx_status epx_comm_mpi_create(MPI_Comm comm, const epx_comm_mpi_opts *opts, epx_comm **out,
                               epx_error *err) {
    epx_comm_mpi_opts o = EPX_COMM_MPI_OPTS_INIT;
    if (opts != NULL) {
        if (opts->version != EPX_COMM_MPI_OPTS_VERSION)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "MPI options version %u is not %u: initialise them from "
                             "EPX_COMM_MPI_OPTS_INIT",
                             opts->version, EPX_COMM_MPI_OPTS_VERSION);
        o = *opts;
    }
    if (o.timeout_ms < 1)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "MPI timeout_ms (%d) must be >= 1",
                         o.timeout_ms);
    if (out == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "out must not be NULL");
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (!inited || fin)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "MPI is not initialised (or already finalised): call MPI_Init first");
    /* Checked here, not by MPI: its answer would go to the error handler
     * of MPI_COMM_WORLD, which ends the job by default. */
    if (comm == MPI_COMM_NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "MPI communicator is MPI_COMM_NULL (what MPI_Comm_split gives a rank "
                         "with color MPI_UNDEFINED): create the epx communicator only on ranks "
                         "that belong to one");
    int inter = 0;
    if (MPI_Comm_test_inter(comm, &inter) == MPI_SUCCESS && inter)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "MPI communicator is an intercommunicator, whose collectives go to the "
                         "remote group: give an intracommunicator (MPI_Intercomm_merge makes one)");
    /* EPX_MPI_MAX_COUNT: a smaller bound for MPI stacks that fail on large
     * messages (MPI counts are ints, hence the default) */
    int64_t max_count = INT_MAX;
    const char *bad = NULL;
    if (!epxi_env_whole("EPX_MPI_MAX_COUNT", 1, INT_MAX, &max_count, &bad))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "EPX_MPI_MAX_COUNT = '%.64s': must be a whole number of elements from 1 "
                         "to %d (the most one MPI all-reduce call takes; unset: %d)",
                         bad, INT_MAX, INT_MAX);
    mpi_ctx *c = epxi_calloc(1, sizeof *c, "MPI communicator", err);
    if (c == NULL) return EPX_ERR_NOMEM;
    c->max_count = max_count;
    c->comm = MPI_COMM_NULL;
    c->timeout_ms = o.timeout_ms;
    int rank = 0, size = 0, rc = MPI_Comm_rank(comm, &rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(comm, &size);
    if (rc != MPI_SUCCESS) {
        free(c);
        return mpi_fail(rank, rc, "Comm_rank/size", err);
    }
    c->rank = rank;
    c->size = size;
    c->ibuf = epxi_calloc((size_t)4 * (size_t)size, sizeof(int), "MPI count buffer", err);
    if (c->ibuf == NULL) {
        free(c);
        return EPX_ERR_NOMEM;
    }
    MPI_Request req;
    rc = MPI_Comm_idup(comm, &c->comm, &req);
    if (rc != MPI_SUCCESS) {
        mpi_destroy(c);
        return mpi_fail(rank, rc, "Comm_idup", err);
    }
    epx_status st = wait_request(c, &req, "Comm_idup", err);
    if (st == EPX_OK) {
        rc = MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
        if (rc != MPI_SUCCESS) st = mpi_fail(rank, rc, "Comm_set_errhandler", err);
    }
    if (st == EPX_OK) { /* one bound for all: the smallest any rank asks for */
        rc = MPI_Iallreduce(MPI_IN_PLACE, &c->max_count, 1, MPI_INT64_T, MPI_MIN, c->comm, &req);
        st = rc != MPI_SUCCESS ? mpi_fail(rank, rc, "Iallreduce", err)
                               : wait_request(c, &req, "the all-reduce bound", err);
    }
    if (st != EPX_OK) {
        mpi_destroy(c);
        return st;
    }
    static const epx_comm_ops ops = {
        EPX_COMM_OPS_VERSION, "mpi", EPX_COMM_MEMORY_HOST, mpi_alltoallv, mpi_allreduce,
        mpi_barrier,          NULL,  mpi_abort_op,         mpi_destroy};
    return epx_comm_create(&ops, c, rank, size, out, err);
}
