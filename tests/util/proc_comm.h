/*
 * proc_comm.h - a host communicator between forked processes of one test,
 * through a shared anonymous mapping made before fork(): a process-shared
 * barrier and a staging area per rank. It lets GPU tests run R ranks as
 * processes sharing one GPU (each with its own CUDA context, so peers are
 * reached through CUDA IPC as on a real node) without MPI on the machine.
 * Header-only; small messages only (PC_STAGE bytes per rank and call).
 * Define _DEFAULT_SOURCE before the first system header (MAP_ANONYMOUS).
 */
#ifndef EPX_PROC_COMM_H
#define EPX_PROC_COMM_H

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "epx_comm.h"

#define PC_MAX_RANKS 16
#define PC_STAGE (256 * 1024)

typedef struct pc_world {
    int32_t R;
    pthread_barrier_t bar;
    int64_t counts[PC_MAX_RANKS][PC_MAX_RANKS], displs[PC_MAX_RANKS][PC_MAX_RANKS];
    size_t elem[PC_MAX_RANKS];
    unsigned char stage[PC_MAX_RANKS][PC_STAGE];
} pc_world;

typedef struct pc_ctx {
    pc_world *w;
    int32_t rank;
} pc_ctx;

static inline epx_status pc_fail(epx_error *err, epx_status st, const char *msg) {
    if (err) {
        err->status = st;
        snprintf(err->msg, sizeof err->msg, "proc comm: %s", msg);
    }
    return st;
}

static inline epx_status pc_alltoallv(void *ctx, const void *send, const int64_t *sc,
                                      const int64_t *sd, void *recv, const int64_t *rc,
                                      const int64_t *rd, size_t elem, epx_error *err) {
    pc_ctx *c = (pc_ctx *)ctx;
    pc_world *w = c->w;
    size_t at = 0;
    for (int32_t p = 0; p < w->R; p++) {
        size_t n = (size_t)sc[p] * elem;
        if (at + n > PC_STAGE) return pc_fail(err, EPX_ERR_COMM, "message above PC_STAGE");
        if (n) memcpy(w->stage[c->rank] + at, (const char *)send + (size_t)sd[p] * elem, n);
        w->counts[c->rank][p] = sc[p];
        w->displs[c->rank][p] = (int64_t)at;
        at += n;
    }
    w->elem[c->rank] = elem;
    pthread_barrier_wait(&w->bar);
    epx_status st = EPX_OK;
    for (int32_t s = 0; s < w->R; s++) {
        if (w->counts[s][c->rank] != rc[s] || w->elem[s] != elem) {
            st = pc_fail(err, EPX_ERR_COMM, "counts differ between ranks");
            continue;
        }
        if (rc[s])
            memcpy((char *)recv + (size_t)rd[s] * elem, w->stage[s] + w->displs[s][c->rank],
                   (size_t)rc[s] * elem);
    }
    pthread_barrier_wait(&w->bar);
    return st;
}

static inline epx_status pc_allreduce(void *ctx, const void *send, void *recv, int64_t count,
                                      epx_dtype dtype, epx_error *err) {
    (void)ctx, (void)send, (void)recv, (void)count, (void)dtype;
    return pc_fail(err, EPX_ERR_UNSUPPORTED, "no all-reduce (bootstrap only)");
}

static inline epx_status pc_barrier(void *ctx, epx_error *err) {
    (void)err;
    pthread_barrier_wait(&((pc_ctx *)ctx)->w->bar);
    return EPX_OK;
}

static inline void pc_destroy(void *ctx) { free(ctx); }

/* The shared world for R ranks; call before fork(). */
static inline pc_world *pc_world_create(int32_t R) {
    pc_world *w = (pc_world *)mmap(NULL, sizeof(pc_world), PROT_READ | PROT_WRITE,
                                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (w == MAP_FAILED) return NULL;
    w->R = R;
    pthread_barrierattr_t at;
    pthread_barrierattr_init(&at);
    pthread_barrierattr_setpshared(&at, PTHREAD_PROCESS_SHARED);
    pthread_barrier_init(&w->bar, &at, (unsigned)R);
    return w;
}

/* This process's communicator of rank `rank` in w (after fork()). */
static inline epx_comm *pc_comm(pc_world *w, int32_t rank) {
    static const epx_comm_ops ops = {EPX_COMM_OPS_VERSION,
                                     "proc",
                                     EPX_COMM_MEMORY_HOST,
                                     pc_alltoallv,
                                     pc_allreduce,
                                     pc_barrier,
                                     NULL,
                                     NULL,
                                     pc_destroy};
    pc_ctx *c = (pc_ctx *)calloc(1, sizeof *c);
    c->w = w;
    c->rank = rank;
    epx_comm *comm = NULL;
    epx_error err = {0};
    if (epx_comm_create(&ops, c, rank, w->R, &comm, &err) != EPX_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return NULL;
    }
    return comm;
}

/* Run fn(rank, arg) in R forked processes; returns how many failed
 * (nonzero exit, a signal, or still running after timeout_s: killed). */
typedef int (*pc_fn)(int32_t rank, int32_t R, pc_world *w, void *arg);
static inline int pc_run(int32_t R, pc_fn fn, void *arg, int timeout_s) {
    pc_world *w = pc_world_create(R);
    if (w == NULL) return R;
    pid_t pid[PC_MAX_RANKS];
    for (int32_t r = 0; r < R; r++) {
        pid[r] = fork();
        if (pid[r] == 0) _exit(fn(r, R, w, arg));
    }
    int failed = 0;
    time_t t0 = time(NULL);
    for (int32_t done = 0; done < R;) {
        int status = 0;
        pid_t p = waitpid(-1, &status, WNOHANG);
        if (p > 0) {
            done++;
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed++;
            continue;
        }
        if (time(NULL) - t0 > timeout_s) {
            fprintf(stderr, "proc comm: ranks still running after %d s: killed\n", timeout_s);
            for (int32_t r = 0; r < R; r++) kill(pid[r], SIGKILL);
            while (waitpid(-1, &status, 0) > 0) failed++;
            break;
        }
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    munmap(w, sizeof *w);
    return failed;
}

#endif /* EPX_PROC_COMM_H */
