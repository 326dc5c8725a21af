/*
 * thread_comm.h - an in-process communicator for tests: R threads, one rank
 * each, exchanging through shared pointers between two barriers. It lets
 * the multi-rank EP and TP paths run in ordinary (and ASan) test binaries
 * without MPI. It also shows that a backend is a page of code: the ops
 * table of epx_comm.h is the whole contract. Header-only, static inline.
 * With tc_run_timed, a rank that stops calling makes the others' next
 * collective fail with EPX_ERR_TIMEOUT after timeout_ms, as the MPI backend
 * does (fault tests); tc_run waits forever.
 */
#ifndef EPX_THREAD_COMM_H
#define EPX_THREAD_COMM_H

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "epx_comm.h"

typedef struct tc_post {
    const void *send;
    const int64_t *counts, *displs;
    size_t elem;
} tc_post;

typedef struct tc_world {
    int32_t R;
    pthread_barrier_t bar;
    tc_post post[64];
    /* timed barrier (timeout_ms > 0): generation count under a mutex */
    int32_t timeout_ms;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t arrived, broken;
    uint64_t gen;
} tc_world;

/* Wait for every rank. Timed: fails once any wait timed out (sticky). */
static inline epx_status tc_wait(tc_world *w, epx_error *err) {
    if (w->timeout_ms <= 0) {
        pthread_barrier_wait(&w->bar);
        return EPX_OK;
    }
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += w->timeout_ms / 1000;
    dl.tv_nsec += (long)(w->timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&w->mu);
    const uint64_t gen = w->gen;
    if (!w->broken && ++w->arrived == w->R) {
        w->arrived = 0;
        w->gen++;
        pthread_cond_broadcast(&w->cv);
    }
    while (gen == w->gen && !w->broken)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &dl) == ETIMEDOUT) {
            w->broken = 1;
            pthread_cond_broadcast(&w->cv);
        }
    const int ok = gen != w->gen;
    pthread_mutex_unlock(&w->mu);
    if (ok) return EPX_OK;
    if (err) {
        err->status = EPX_ERR_TIMEOUT;
        snprintf(err->msg, sizeof err->msg, "thread comm: a rank did not arrive within %d ms",
                 w->timeout_ms);
    }
    return EPX_ERR_TIMEOUT;
}

typedef struct tc_ctx {
    tc_world *w;
    int32_t rank;
} tc_ctx;

static inline epx_status tc_alltoallv(void *ctx, const void *send, const int64_t *send_counts,
                                      const int64_t *send_displs, void *recv,
                                      const int64_t *recv_counts, const int64_t *recv_displs,
                                      size_t elem_bytes, epx_error *err) {
    tc_ctx *c = ctx;
    tc_world *w = c->w;
    tc_post p = {send, send_counts, send_displs, elem_bytes};
    w->post[c->rank] = p;
    if (tc_wait(w, err) != EPX_OK) return EPX_ERR_TIMEOUT;
    epx_status st = EPX_OK;
    for (int32_t s = 0; s < w->R; s++) {
        const tc_post *q = &w->post[s];
        if (q->counts[c->rank] != recv_counts[s] || q->elem != elem_bytes) {
            if (err) {
                err->status = EPX_ERR_COMM;
                snprintf(err->msg, sizeof err->msg,
                         "thread comm: rank %d expects %lld from %d, "
                         "which sends %lld",
                         c->rank, (long long)recv_counts[s], s, (long long)q->counts[c->rank]);
            }
            st = EPX_ERR_COMM;
            continue;
        }
        if (recv_counts[s] > 0)
            memcpy((char *)recv + (size_t)recv_displs[s] * elem_bytes,
                   (const char *)q->send + (size_t)q->displs[c->rank] * elem_bytes,
                   (size_t)recv_counts[s] * elem_bytes);
    }
    if (tc_wait(w, err) != EPX_OK) return EPX_ERR_TIMEOUT;
    return st;
}

static inline epx_status tc_allreduce(void *ctx, const void *send, void *recv, int64_t count,
                                      epx_dtype dtype, epx_error *err) {
    tc_ctx *c = ctx;
    tc_world *w = c->w;
    tc_post p = {send, NULL, NULL, 0};
    w->post[c->rank] = p;
    if (tc_wait(w, err) != EPX_OK) return EPX_ERR_TIMEOUT;
    size_t es = epx_dtype_size(dtype);
    void *tmp = malloc((size_t)(count > 0 ? count : 1) * es);
    for (int64_t i = 0; i < count; i++) {
        if (dtype == EPX_DTYPE_F32) {
            float acc = 0.0f;
            for (int32_t s = 0; s < w->R; s++) acc += ((const float *)w->post[s].send)[i];
            ((float *)tmp)[i] = acc;
        } else {
            int64_t acc = 0;
            for (int32_t s = 0; s < w->R; s++) acc += ((const int64_t *)w->post[s].send)[i];
            ((int64_t *)tmp)[i] = acc;
        }
    }
    epx_status st = tc_wait(w, err);
    if (st == EPX_OK && count > 0) memcpy(recv, tmp, (size_t)count * es);
    free(tmp);
    return st;
}

static inline epx_status tc_barrier(void *ctx, epx_error *err) {
    return tc_wait(((tc_ctx *)ctx)->w, err);
}

static inline void tc_destroy(void *ctx) { free(ctx); }

static inline epx_comm *tc_comm(tc_world *w, int32_t rank) {
    static const epx_comm_ops ops = {EPX_COMM_OPS_VERSION,
                                     "threads",
                                     EPX_COMM_MEMORY_HOST,
                                     tc_alltoallv,
                                     tc_allreduce,
                                     tc_barrier,
                                     NULL,
                                     NULL,
                                     tc_destroy};
    tc_ctx *c = malloc(sizeof *c);
    c->w = w;
    c->rank = rank;
    epx_comm *comm = NULL;
    epx_error err = {0};
    if (epx_comm_create(&ops, c, rank, w->R, &comm, &err) != EPX_OK) return NULL;
    return comm;
}

/* Run fn(rank, arg) on R threads, each with its own communicator. */
typedef void (*tc_fn)(epx_comm *comm, void *arg);
typedef struct tc_job {
    tc_world *w;
    int32_t rank;
    tc_fn fn;
    void *arg;
} tc_job;

static inline void *tc_main(void *p) {
    tc_job *j = p;
    epx_comm *comm = tc_comm(j->w, j->rank);
    j->fn(comm, j->arg);
    epx_comm_destroy(comm);
    return NULL;
}

static inline void tc_run_timed(int32_t R, tc_fn fn, void *arg, int32_t timeout_ms) {
    tc_world w;
    memset(&w, 0, sizeof w);
    w.R = R;
    w.timeout_ms = timeout_ms;
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    pthread_barrier_init(&w.bar, NULL, (unsigned)R);
    pthread_t th[64];
    tc_job jobs[64];
    for (int32_t r = 0; r < R; r++) {
        tc_job j = {&w, r, fn, arg};
        jobs[r] = j;
        pthread_create(&th[r], NULL, tc_main, &jobs[r]);
    }
    for (int32_t r = 0; r < R; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&w.bar);
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
}

static inline void tc_run(int32_t R, tc_fn fn, void *arg) { tc_run_timed(R, fn, arg, 0); }

#endif /* EPX_THREAD_COMM_H */
