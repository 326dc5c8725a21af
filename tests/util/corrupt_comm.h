/*
 * corrupt_comm.h - a fault-injecting backend for tests: it forwards every
 * call to an inner communicator, but flips one byte of the n-th block (one
 * element of an all-to-all) this rank sends, counting blocks over all its
 * all-to-all calls in rank order. Unlike epx_comm_create_faulty it stays in
 * step with the other ranks, so it tests what the receiver checks, not
 * what a failed collective does. Header-only, static inline.
 *
 *   cc_state st = {inner, n, 0};
 *   epx_comm *bad = cc_wrap(&st);   // st must outlive bad
 */
#ifndef EPX_CORRUPT_COMM_H
#define EPX_CORRUPT_COMM_H

#include <stdlib.h>
#include <string.h>

#include "epx_comm.h"

typedef struct cc_state {
    epx_comm *inner;
    int64_t nth;  /* 1-based block to corrupt; 0 = none */
    int64_t seen; /* blocks sent so far */
} cc_state;

static inline epx_status cc_alltoallv(void *ctx, const void *send, const int64_t *sc,
                                      const int64_t *sd, void *recv, const int64_t *rc,
                                      const int64_t *rd, size_t eb, epx_error *err) {
    cc_state *c = ctx;
    const int32_t R = epx_comm_size(c->inner);
    int64_t total = 0, end = 0;
    for (int32_t r = 0; r < R; r++) {
        total += sc[r];
        if (sc[r] > 0 && sd[r] + sc[r] > end) end = sd[r] + sc[r];
    }
    const bool hit = c->nth > c->seen && c->nth <= c->seen + total;
    if (!hit) {
        c->seen += total;
        return epx_comm_alltoallv(c->inner, send, sc, sd, recv, rc, rd, eb, err);
    }
    unsigned char *copy = malloc((size_t)end * eb);
    if (copy == NULL) return EPX_ERR_NOMEM;
    memcpy(copy, send, (size_t)end * eb);
    int64_t k = c->nth - c->seen - 1;
    for (int32_t r = 0; r < R; r++) {
        if (k < sc[r]) {
            copy[(size_t)(sd[r] + k) * eb + eb / 2] ^= 0x40;
            break;
        }
        k -= sc[r];
    }
    c->seen += total;
    epx_status st = epx_comm_alltoallv(c->inner, copy, sc, sd, recv, rc, rd, eb, err);
    free(copy);
    return st;
}

static inline epx_status cc_allreduce(void *ctx, const void *s, void *r, int64_t n, epx_dtype t,
                                      epx_error *err) {
    return epx_comm_allreduce_sum(((cc_state *)ctx)->inner, s, r, n, t, err);
}

static inline epx_status cc_barrier(void *ctx, epx_error *err) {
    return epx_comm_barrier(((cc_state *)ctx)->inner, err);
}

/* The wrapping communicator (epx_comm_destroy it; `st` is not freed), or
 * NULL on failure. */
static inline epx_comm *cc_wrap(cc_state *st) {
    static const epx_comm_ops ops = {EPX_COMM_OPS_VERSION,
                                     "corrupt",
                                     EPX_COMM_MEMORY_HOST,
                                     cc_alltoallv,
                                     cc_allreduce,
                                     cc_barrier,
                                     NULL,
                                     NULL,
                                     NULL};
    epx_comm *out = NULL;
    epx_error err = {0};
    if (epx_comm_create(&ops, st, epx_comm_rank(st->inner), epx_comm_size(st->inner), &out, &err) !=
        EPX_OK)
        return NULL;
    return out;
}

#endif /* EPX_CORRUPT_COMM_H */
