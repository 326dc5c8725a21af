/*
 * parallel.c - the library's threads: how many (epxi_threads) and running a
 * function on them (epxi_parallel). Used where pieces of work are
 * independent and their results do not depend on the split: SGLang's cut
 * dispatch table (one pass per rank).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

epx_status epxi_threads(int64_t items, int32_t *threads, epx_error *err) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    const char *env = getenv("EPX_THREADS");
    if (env != NULL && *env != '\0') {
        /* digits only, so "4x", "-2" or " 8" are refused, not read as 4, 1 or 8;
         * past 9 significant digits it is past 64 in any case */
        const char *d = env + strspn(env, "0");
        const size_t len = strspn(d, "0123456789");
        n = d[len] != '\0' ? -1 : len > 9 ? 64 : strtol(d, NULL, 10); /* "000": 0 */
        if (n < 1)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "EPX_THREADS=%s: give a whole number of threads from 1 (1 = the "
                             "calling thread only; more than 64 counts as 64), or leave it unset "
                             "for one per online CPU",
                             env);
    }
    if (n < 1) n = 1;
    if (n > 64) n = 64;
    *threads = items < n ? (int32_t)(items < 1 ? 1 : items) : (int32_t)n;
    return EPX_OK;
}

typedef struct job {
    void (*fn)(void *ctx, int32_t t, int32_t n);
    void *ctx;
    int32_t t, n;
} job;

static void *run_job(void *arg) {
    const job *j = arg;
    j->fn(j->ctx, j->t, j->n);
    return NULL;
}

void epxi_parallel(int32_t n, void (*fn)(void *ctx, int32_t t, int32_t n), void *ctx) {
    if (n > 64) n = 64;
    if (n <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    job jobs[64];
    pthread_t tid[64];
    int32_t started = 0;
    for (int32_t t = 0; t < n; t++) jobs[t] = (job){fn, ctx, t, n};
    for (int32_t t = 1; t < n; t++) {
        if (pthread_create(&tid[t], NULL, run_job, &jobs[t]) != 0) break;
        started = t;
    }
    fn(ctx, 0, n);
    for (int32_t t = started + 1; t < n; t++) fn(ctx, t, n);
    for (int32_t t = 1; t <= started; t++) pthread_join(tid[t], NULL);
}
