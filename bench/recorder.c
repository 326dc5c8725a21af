/*
 * bench/recorder.c - cost of recording expert load on the CPU, at Kimi-K2's
 * shape (61 layers, 1 dense, 384 experts, 416 slots on 8 GPUs, top-8):
 * one forward pass of T tokens is 60 epx_recorder_add_topk calls of T x 8
 * physical ids plus epx_recorder_end_pass. Ids follow a skewed (lognormal
 * sigma 1) popularity, as real routing does, which is the hard case for a
 * histogram: hot slots repeat and chain their increments.
 *
 * Peer in the same run: the naive loop (check each id, increment an int64
 * row) that a straightforward C port of SGLang's scatter_add would be.
 * The recorder's dump is compared with that naive count before timing.
 *
 * Usage: bench_recorder [T ...]   (default T = 1 64 512 4096 16384)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "epx.h"

enum { L = 61, DENSE = 1, E = 384, P = 416, G = 8, K = 8 };

static uint64_t rng_state = 12345;
static uint64_t next(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double unif(void) { return (double)(next() >> 11) * 0x1.0p-53; }

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Physical ids for every MoE layer: popularity lognormal(0, 1) over the
 * logical experts, each token's k-th choice drawn from it, then a replica
 * of that expert picked uniformly. */
static void make_ids(const epx_layout *lay, int64_t T, int32_t *ids) {
    int32_t W = 0;
    const int32_t *l2p = epx_layout_logical_to_all_physical(lay, &W);
    const int32_t *nv = epx_layout_num_valid(lay);
    double cdf[E];
    for (int32_t l = DENSE; l < L; l++) {
        double acc = 0;
        for (int32_t e = 0; e < E; e++) {
            double u1 = unif() + 1e-300, u2 = unif();
            acc += exp(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
            cdf[e] = acc;
        }
        int32_t *out = ids + (size_t)(l - DENSE) * (size_t)T * K;
        for (int64_t i = 0; i < T * K; i++) {
            double u = unif() * acc;
            int32_t lo = 0, hi = E - 1;
            while (lo < hi) {
                int32_t mid = (lo + hi) / 2;
                if (cdf[mid] < u)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            const size_t cell = (size_t)l * E + (size_t)lo;
            out[i] = l2p[cell * (size_t)W + (size_t)(next() % (uint64_t)nv[cell])];
        }
    }
}

/* The peer: check and count each id into an int64 row, then map to logical. */
static int naive_pass(const epx_layout *lay, const int32_t *ids, int64_t T, int64_t *phys,
                      int64_t *logical) {
    const int32_t *map = epx_layout_physical_to_logical(lay);
    memset(phys, 0, sizeof(int64_t) * L * P);
    for (int32_t l = DENSE; l < L; l++) {
        const int32_t *in = ids + (size_t)(l - DENSE) * (size_t)T * K;
        int64_t *row = phys + (size_t)l * P;
        for (int64_t i = 0; i < T * K; i++) {
            int32_t id = in[i];
            if (id == -1) continue;
            if (id < -1 || id >= P) return -1;
            row[id]++;
        }
    }
    memset(logical, 0, sizeof(int64_t) * L * E);
    for (int32_t l = 0; l < L; l++)
        for (int32_t p = 0; p < P; p++) logical[l * E + map[l * P + p]] += phys[l * P + p];
    return 0;
}

static double end_pass_seconds; /* accumulated by epx_pass */

static int epx_pass(epx_recorder *rec, const int32_t *ids, int64_t T) {
    epx_error err = {0};
    for (int32_t l = DENSE; l < L; l++)
        if (epx_recorder_add_topk(rec, l, ids + (size_t)(l - DENSE) * (size_t)T * K, T, K, &err) !=
            EPX_OK) {
            fprintf(stderr, "bench_recorder: %s\n", err.msg);
            return -1;
        }
    double t0 = now();
    epx_status st = epx_recorder_end_pass(rec, &err);
    end_pass_seconds += now() - t0;
    if (st != EPX_OK) {
        fprintf(stderr, "bench_recorder: %s\n", err.msg);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    int64_t sizes[16] = {1, 64, 512, 4096, 16384};
    int nsizes = 5;
    if (argc > 1) {
        nsizes = 0;
        for (int i = 1; i < argc && nsizes < 16; i++) sizes[nsizes++] = atoll(argv[i]);
    }
    epx_shape s = {L, E, P, G, 1};
    epx_layout *lay = NULL;
    epx_error err = {0};
    if (epx_layout_create_trivial(&s, &lay, &err) != EPX_OK) {
        fprintf(stderr, "bench_recorder: %s\n", err.msg);
        return 1;
    }
    epx_recorder_opts o = EPX_RECORDER_OPTS_INIT;
    o.capacity = 64;
    epx_recorder *rec = NULL;
    if (epx_recorder_create(lay, &o, &rec, &err) != EPX_OK) {
        fprintf(stderr, "bench_recorder: %s\n", err.msg);
        return 1;
    }
    int64_t *phys = malloc(sizeof(int64_t) * L * P), *logical = malloc(sizeof(int64_t) * L * E);

    printf("# epx recorder, Kimi-K2 shape: %d layers (%d dense), E=%d, P=%d, G=%d, top-%d; "
           "one pass = %d add_topk calls + end_pass; skewed ids (lognormal sigma 1)\n",
           L, DENSE, E, P, G, K, L - DENSE);
    printf("%8s %12s %12s %12s %12s %10s %8s %12s\n", "T", "epx_us/pass", "naive_us", "epx_ns/tok",
           "naive_ns/tok", "epx_ns/id", "speedup", "end_pass_us");
    for (int si = 0; si < nsizes; si++) {
        const int64_t T = sizes[si];
        if (T < 1 || T > (1 << 20)) {
            fprintf(stderr, "bench_recorder: T must be in [1, 2^20]\n");
            return 2;
        }
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)(L - DENSE) * (size_t)T * K);
        make_ids(lay, T, ids);

        /* Check first: the recorder's dump equals the naive count. */
        epx_recorder_reset(rec);
        if (epx_pass(rec, ids, T) != 0 || naive_pass(lay, ids, T, phys, logical) != 0) return 1;
        epx_counts *c = NULL;
        if (epx_recorder_dump(rec, &c, &err) != EPX_OK) {
            fprintf(stderr, "bench_recorder: %s\n", err.msg);
            return 1;
        }
        for (size_t i = 0; i < (size_t)L * E; i++)
            if (c->data[i] != (double)logical[i]) {
                fprintf(stderr, "bench_recorder: T=%lld cell %zu: epx %g, naive %lld\n",
                        (long long)T, i, c->data[i], (long long)logical[i]);
                return 1;
            }
        epx_counts_destroy(c);

        /* Time: repeat passes for ~0.2 s per side, 7 rounds, report medians. */
        int reps = (int)(2e6 / (double)(T * K * (L - DENSE))) + 1;
        if (reps > 20000) reps = 20000;
        double te[7], tn[7], tend[7];
        for (int round = 0; round < 7; round++) {
            end_pass_seconds = 0;
            double t0 = now();
            for (int r = 0; r < reps; r++)
                if (epx_pass(rec, ids, T) != 0) return 1;
            double t1 = now();
            for (int r = 0; r < reps; r++)
                if (naive_pass(lay, ids, T, phys, logical) != 0) return 1;
            double t2 = now();
            te[round] = (t1 - t0) / reps;
            tend[round] = end_pass_seconds / reps;
            tn[round] = (t2 - t1) / reps;
        }
        qsort(te, 7, sizeof te[0], cmp_double);
        qsort(tn, 7, sizeof tn[0], cmp_double);
        qsort(tend, 7, sizeof tend[0], cmp_double);
        const double e = te[3], n = tn[3];
        printf("%8lld %12.2f %12.2f %12.2f %12.2f %10.3f %8.2f %12.2f\n", (long long)T, e * 1e6,
               n * 1e6, e * 1e9 / (double)T, n * 1e9 / (double)T,
               e * 1e9 / (double)(T * K * (L - DENSE)), n / e, tend[3] * 1e6);
        free(ids);
    }
    free(phys);
    free(logical);
    epx_recorder_destroy(rec);
    epx_layout_destroy(lay);
    return 0;
}
