/*
 * balanced_shapes.c - bench_balanced_shapes: the balanced split on one CPU
 * core (epx_dispatch_balanced_solve, counts -> shares and integer counts)
 * on bench/balanced.cu's synthetic layers (balanced_place.h: the same
 * seeded placements and batches): Kimi-K2.5 on 8 GPUs (E 384, P 416),
 * DeepSeek-V3 on 32 GPUs (E 256, P 288) with replicas on any GPU, and
 * ds-v3-node (each expert's replicas on one of 4 nodes); K = 8, T from 1 to
 * 4,096 tokens skewed toward a few experts, 16 layers each; and DeepSeek-V3
 * on 256 GPUs (P 512, replicas anywhere), on the CPU only. Two balancers
 * per shape, in one run: the max-flow levels' dense start (the default) and
 * EPX_BALANCED_DENSE_START=0, whose outputs must be equal to the bit
 * (checked on every layer before timing). Time per layer: the fastest of 5
 * solves; the table gives the median over the layers.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "epx.h"

#include "balanced_place.h"

enum { LAYERS = 16, REPEAT = 5, K = 8 };

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void check(epx_status st, const epx_error *err) {
    if (st != EPX_OK) {
        fprintf(stderr, "bench_balanced_shapes: %s\n", err->msg);
        exit(1);
    }
}

/* A balancer created with EPX_BALANCED_DENSE_START set to dense (the
 * caller's value, if any, put back). */
static epx_balancer *balancer(int32_t E, int32_t W, int32_t P, int32_t G, const char *dense) {
    epx_balancer *b = NULL;
    epx_error err = {0};
    const char *was = getenv("EPX_BALANCED_DENSE_START");
    char keep[16] = "";
    if (was != NULL) snprintf(keep, sizeof keep, "%s", was);
    setenv("EPX_BALANCED_DENSE_START", dense, 1);
    check(epx_dispatch_balanced_create(E, W, P, G, &b, &err), &err);
    if (was != NULL)
        setenv("EPX_BALANCED_DENSE_START", keep, 1);
    else
        unsetenv("EPX_BALANCED_DENSE_START");
    return b;
}

/* The median over the layers of each layer's fastest solve, in us. */
static double time_solves(epx_balancer *b, const int32_t *rep, const int32_t *nv,
                          const int64_t *cnt, int32_t E, epx_balanced_out *o) {
    double per[LAYERS];
    epx_error err = {0};
    for (int l = 0; l < LAYERS; l++) {
        per[l] = 1e30;
        for (int r = 0; r < REPEAT; r++) {
            double t0 = now_us();
            check(epx_dispatch_balanced_solve(b, rep, nv, cnt + (size_t)l * E, o, &err), &err);
            double dt = now_us() - t0;
            per[l] = dt < per[l] ? dt : per[l];
        }
    }
    qsort(per, LAYERS, sizeof per[0], cmp_d);
    return per[LAYERS / 2];
}

int main(void) {
    static const int32_t Ts[] = {1, 16, 128, 512, 1024, 4096};
    printf("%-12s %5s %7s %12s %12s %7s\n", "shape", "T", "levels", "dense us", "plain us",
           "ratio");
    /* bench_balanced's layers, then (last, so that theirs stay the same
     * draws) DeepSeek-V3 on 256 GPUs with its 512 slots anywhere, SGLang's
     * global policy at that size: too slow for the GPU bench's lane-0
     * max-flows, timed here on the CPU */
    static const struct bal_shape wide = {"ds-v3-256", 256, 512, 256, 1};
    for (size_t si = 0; si <= BAL_SHAPES; si++) {
        const struct bal_shape *shp = si < BAL_SHAPES ? &bal_shapes[si] : &wide;
        const int32_t E = shp->E, P = shp->P, G = shp->G, W = P - E + 1;
        const size_t EW = (size_t)E * (size_t)W;
        int32_t *rep = malloc(4 * EW), *nv = malloc(4 * (size_t)E);
        make_place(E, P, W, shp->nodes, rep, nv);
        epx_balancer *dense = balancer(E, W, P, G, "1"), *plain = balancer(E, W, P, G, "0");
        double *sh[2];
        int64_t *rc[2];
        epx_balanced_out o[2];
        for (int k = 0; k < 2; k++) {
            sh[k] = malloc(8 * EW);
            rc[k] = malloc(8 * EW);
            memset(&o[k], 0, sizeof o[k]);
            o[k].shares = sh[k];
            o[k].replica_counts = rc[k];
        }
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            const int32_t T = Ts[ti];
            const size_t n = (size_t)T * K;
            int32_t *ids = malloc(4 * n * LAYERS);
            int64_t *cnt = malloc(8 * (size_t)E * LAYERS);
            epx_error err = {0};
            for (size_t i = 0; i < n * LAYERS; i++) { /* as bench/balanced.cu draws them */
                double u = unif();
                ids[i] = (int32_t)((double)E * u * u);
            }
            for (int l = 0; l < LAYERS; l++)
                check(
                    epx_dispatch_count_ids(ids + (size_t)l * n, T, K, E, cnt + (size_t)l * E, &err),
                    &err);
            double levels = 0;
            for (int l = 0; l < LAYERS; l++) { /* the same bits from both starts */
                check(epx_dispatch_balanced_solve(dense, rep, nv, cnt + (size_t)l * E, &o[0], &err),
                      &err);
                check(epx_dispatch_balanced_solve(plain, rep, nv, cnt + (size_t)l * E, &o[1], &err),
                      &err);
                if (memcmp(sh[0], sh[1], 8 * EW) != 0 || memcmp(rc[0], rc[1], 8 * EW) != 0 ||
                    o[0].num_levels != o[1].num_levels) {
                    fprintf(stderr,
                            "bench_balanced_shapes: %s T = %d layer %d: the starts differ\n",
                            shp->name, T, l);
                    return 1;
                }
                levels += o[0].num_levels;
            }
            /* a discarded pass first (the first timings of a process ran
             * slow), then the two in turn, which first alternating */
            (void)time_solves(dense, rep, nv, cnt, E, &o[0]);
            double td, tp;
            if (ti % 2 == 0) {
                td = time_solves(dense, rep, nv, cnt, E, &o[0]);
                tp = time_solves(plain, rep, nv, cnt, E, &o[1]);
            } else {
                tp = time_solves(plain, rep, nv, cnt, E, &o[1]);
                td = time_solves(dense, rep, nv, cnt, E, &o[0]);
            }
            printf("%-12s %5d %7.1f %12.1f %12.1f %7.2f\n", shp->name, T, levels / LAYERS, td, tp,
                   td / tp);
            free(ids);
            free(cnt);
        }
        for (int k = 0; k < 2; k++) {
            free(sh[k]);
            free(rc[k]);
        }
        epx_dispatch_balanced_destroy(dense);
        epx_dispatch_balanced_destroy(plain);
        free(rep);
        free(nv);
    }
    return 0;
}
