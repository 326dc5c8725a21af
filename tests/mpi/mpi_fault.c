/*
 * mpi_fault.c - a rank fails in the middle of an EP exchange; the others
 * must return an error within the timeout instead of hanging.
 *
 *   mpi_fault kill|stop OUTDIR
 *
 * After one good batch, rank 1 reaches the record exchange of the second
 * batch (the counts are already exchanged) and then either dies
 * (raise(SIGKILL)) or stops answering (sleeps past the timeout). Every other
 * rank writes OUTDIR/rank.N with the status its dispatch returned and how
 * long it took, then leaves at once with _exit (MPI_Finalize could wait for
 * the dead peer). tests/mpi/fault.sh runs this under
 * `mpirun --enable-recovery` (so Open MPI lets the survivors run on) and
 * judges by those files, not by mpirun's exit status, which reports the
 * killed rank.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "epx_comm_mpi.h"

#define TIMEOUT_MS 2000

/* A backend wrapping MPI that makes this rank fail at its n-th alltoallv. */
typedef struct dying {
    epx_comm *inner;
    int calls, at, kill;
} dying;

static epx_status d_alltoallv(void *ctx, const void *send, const int64_t *sc, const int64_t *sd,
                              void *recv, const int64_t *rc, const int64_t *rd, size_t eb,
                              epx_error *err) {
    dying *d = ctx;
    if (++d->calls == d->at) {
        if (d->kill) raise(SIGKILL);
        sleep(3 * TIMEOUT_MS / 1000); /* stopped: answers nobody past the timeout */
        _exit(0);
    }
    return epx_comm_alltoallv(d->inner, send, sc, sd, recv, rc, rd, eb, err);
}
static epx_status d_allreduce(void *ctx, const void *s, void *r, int64_t n, epx_dtype t,
                              epx_error *err) {
    return epx_comm_allreduce_sum(((dying *)ctx)->inner, s, r, n, t, err);
}
static epx_status d_barrier(void *ctx, epx_error *err) {
    return epx_comm_barrier(((dying *)ctx)->inner, err);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

int main(int argc, char **argv) {
    bool ll = argc == 4 && strcmp(argv[3], "low-latency") == 0;
    if ((argc != 3 && !ll) || (strcmp(argv[1], "kill") != 0 && strcmp(argv[1], "stop") != 0)) {
        fprintf(stderr, "usage: mpi_fault kill|stop OUTDIR [low-latency]\n");
        return 2;
    }
    MPI_Init(&argc, &argv);
    epx_comm_mpi_opts o = EPX_COMM_MPI_OPTS_INIT;
    o.timeout_ms = TIMEOUT_MS;
    epx_error err = {0};
    epx_comm *mpi = NULL, *comm = NULL;
    if (epx_comm_mpi_create(MPI_COMM_WORLD, &o, &mpi, &err) != EPX_OK) {
        fprintf(stderr, "%s\n", err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int32_t rank = epx_comm_rank(mpi), R = epx_comm_size(mpi);
    /* Die in batch 2's records: after the config check before the first
     * batch, call 6 in normal mode (counts, records, combine per batch),
     * call 4 in low latency (one exchange per phase). */
    dying d = {mpi, 0, ll ? 4 : 6, strcmp(argv[1], "kill") == 0};
    static const epx_comm_ops ops = {EPX_COMM_OPS_VERSION,
                                     "dying",
                                     EPX_COMM_MEMORY_HOST,
                                     d_alltoallv,
                                     d_allreduce,
                                     d_barrier,
                                     NULL,
                                     NULL,
                                     NULL};
    comm = mpi;
    if (rank == 1 && epx_comm_create(&ops, &d, rank, R, &comm, &err) != EPX_OK) {
        fprintf(stderr, "%s\n", err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    enum { H = 64, K = 4, T = 16 };
    epx_ep_config c = EPX_EP_CONFIG_INIT;
    c.hidden = H;
    c.top_k = K;
    c.num_slots = 4 * R;
    c.max_tokens = T;
    c.mode = ll ? EPX_EP_MODE_LOW_LATENCY : EPX_EP_MODE_NORMAL;
    epx_ep *ep = NULL;
    if (epx_ep_create(comm, &c, NULL, 0, &ep, &err) != EPX_OK) {
        fprintf(stderr, "%s\n", err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    static float x[T * H], w[T * K], out[T * H];
    static int32_t slots[T * K];
    for (int i = 0; i < T * K; i++) {
        slots[i] = (i * 7 + rank) % c.num_slots; /* everyone talks to everyone */
        w[i] = 0.25f;
    }
    epx_ep_recv rv;
    epx_status st = epx_ep_dispatch(ep, T, x, slots, w, &rv, &err);
    if (st == EPX_OK) {
        memset(rv.y, 0, (size_t)rv.num_entries * H * sizeof(float));
        st = epx_ep_combine(ep, out, &err);
    }
    if (st != EPX_OK) {
        fprintf(stderr, "rank %d: the good batch failed: %s\n", rank, err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    double t0 = now_ms();
    st = epx_ep_dispatch(ep, T, x, slots, w, &rv, &err);
    double ms = now_ms() - t0;
    char path[4096];
    snprintf(path, sizeof path, "%s/rank.%d", argv[2], rank);
    FILE *f = fopen(path, "w");
    if (f != NULL) {
        fprintf(f, "%s %.0f %s\n", epx_status_str(st), ms, err.msg);
        fclose(f);
    }
    fprintf(stderr, "rank %d: dispatch returned %s after %.0f ms: %s\n", rank, epx_status_str(st),
            ms, err.msg);
    _exit(0);
}
