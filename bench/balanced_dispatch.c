/*
 * balanced_dispatch.c - bench_balanced_dispatch: per-batch balancedness of
 * static, dynamic, weighted and balanced routing on the same placement, and
 * the time balanced routing takes per layer on one CPU core.
 *
 * For each setup, epx's planner places the trace's windows 0..3; batches
 * are drawn from windows 4..7 (the traffic that follows): T tokens, each
 * choosing K distinct experts with probability proportional to that
 * window's and layer's counts. Every batch is routed four ways: static
 * (SGLang's table for the layout, token t sent from rank t % G), dynamic
 * (uniform over replicas), weighted (the planner's replica weights) and
 * balanced (epx_dispatch_balanced_topk). Balancedness of a batch = mean GPU
 * load / max GPU load in (token, expert) pairs, averaged over the batches;
 * "optimum" is mean / the exact fractional optimum (no split beats it).
 * Before anything is timed each balanced batch is checked: every pair on a
 * replica of its expert, the largest GPU load ceil(optimum). Times: count +
 * solve + route per layer (median and 99th percentile over the batches of
 * the fastest of 5 runs each, so a shared machine's preemptions drop out),
 * and solve alone (median).
 * Usage: bench_balanced_dispatch [--shared DIR]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "epx.h"

typedef struct setup {
    const char *trace;
    int32_t G, N, P, groups, K;
} setup;

static const setup SETUPS[] = {{"kimi_k2", 8, 1, 416, 1, 8}, {"deepseek_v3", 32, 4, 288, 8, 8}};
static const int32_t TOKENS[] = {1, 16, 128, 1024, 4096};
enum { MODES = 4, TMAX = 4096, REPEAT = 5 };

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what, const epx_error *err) {
    fprintf(stderr, "bench_balanced_dispatch: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

static uint64_t next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* T tokens, K distinct experts each, drawn from cdf [E] (total cdf[E-1]). */
static void draw_ids(uint64_t *rng, const double *cdf, int32_t E, int32_t T, int32_t K,
                     int32_t *ids) {
    for (int32_t t = 0; t < T; t++)
        for (int32_t k = 0; k < K; k++) {
            int32_t e = -1;
            for (int tries = 0; tries < 1000 && e < 0; tries++) {
                double u = (double)(next(rng) >> 11) * 0x1p-53 * cdf[E - 1];
                int32_t lo = 0, hi = E - 1;
                while (lo < hi) {
                    int32_t mid = (lo + hi) / 2;
                    if (cdf[mid] > u)
                        hi = mid;
                    else
                        lo = mid + 1;
                }
                e = lo;
                for (int32_t j = 0; j < k; j++)
                    if (ids[t * K + j] == e) e = -1;
            }
            ids[t * K + k] = e;
        }
}

static double batch_balance(const int32_t *phys, int32_t n, int32_t per, int32_t G, int64_t *load) {
    memset(load, 0, sizeof(int64_t) * (size_t)G);
    int64_t sum = 0, mx = 0;
    for (int32_t i = 0; i < n; i++)
        if (phys[i] >= 0) load[phys[i] / per]++, sum++;
    for (int32_t g = 0; g < G; g++) mx = load[g] > mx ? load[g] : mx;
    return mx ? (double)sum / G / (double)mx : 1.0;
}

int main(int argc, char **argv) {
    const char *shared = getenv("EPX_SHARED") ? getenv("EPX_SHARED") : "../shared";
    if (argc == 3 && strcmp(argv[1], "--shared") == 0) shared = argv[2];
    printf("%-12s %5s %5s | %8s %8s %8s %8s %8s | %9s %9s %9s\n", "trace", "T", "n", "static",
           "dynamic", "weighted", "balanced", "optimum", "us med", "us p99", "solve us");
    for (size_t si = 0; si < sizeof SETUPS / sizeof SETUPS[0]; si++) {
        const setup *su = &SETUPS[si];
        char path[1024];
        snprintf(path, sizeof path, "%s/traces/%s.json", shared, su->trace);
        epx_error err = {0};
        epx_counts *c = NULL;
        if (epx_counts_read(path, &c, &err) != EPX_OK) die(path, &err);
        int32_t L = c->num_layers, E = c->num_experts, G = su->G, P = su->P, K = su->K;
        int32_t per = P / G;
        if (c->num_windows < 8) die("a trace with 8 windows is needed", NULL);
        size_t LE = (size_t)L * (size_t)E;
        epx_counts *first = NULL;
        if (epx_counts_create(4, L, E, &first, &err) != EPX_OK) die("counts", &err);
        memcpy(first->data, c->data, sizeof(double) * 4 * LE);
        epx_shape s = {L, E, P, G, su->N};
        epx_plan_opts po = EPX_PLAN_OPTS_INIT;
        po.num_groups = su->groups;
        epx_plan *plan = NULL;
        if (epx_plan_compute(first, &s, &po, &plan, &err) != EPX_OK) die("plan", &err);
        const epx_layout *lay = epx_plan_layout(plan);
        int32_t W = 0;
        const int32_t *rep = epx_layout_logical_to_all_physical(lay, &W);
        const int32_t *nv = epx_layout_num_valid(lay);
        int32_t *table = malloc(sizeof(int32_t) * (size_t)G * LE);
        if (epx_dispatch_table_from_layout(lay, NULL, table, &err) != EPX_OK) die("table", &err);
        uint32_t *thr = malloc(sizeof(uint32_t) * LE * (size_t)W);
        if (epx_dispatch_thresholds(rep, nv, L, E, W, epx_plan_replica_weights(plan), P, thr,
                                    &err) != EPX_OK)
            die("thresholds", &err);
        epx_balancer *b = NULL;
        if (epx_dispatch_balanced_create(E, W, P, G, &b, &err) != EPX_OK) die("balancer", &err);
        int32_t *ids = malloc(sizeof(int32_t) * TMAX * (size_t)K);
        int32_t *phys = malloc(sizeof(int32_t) * TMAX * (size_t)K);
        int64_t *cnt = malloc(sizeof(int64_t) * (size_t)E), *load = malloc(sizeof(int64_t) * G);
        double *cdf = malloc(sizeof(double) * (size_t)E);
        size_t cap = 4 * (size_t)L;
        double *times = malloc(sizeof(double) * cap), *stimes = malloc(sizeof(double) * cap);
        for (size_t ti = 0; ti < sizeof TOKENS / sizeof TOKENS[0]; ti++) {
            int32_t T = TOKENS[ti];
            uint64_t rng = 27u + ti;
            double bal[MODES] = {0}, opt = 0.0;
            size_t n = 0;
            for (int32_t w = 4; w < 8; w++)
                for (int32_t l = 0; l < L; l++) {
                    const double *ld = c->data + ((size_t)w * L + l) * E;
                    double acc = 0.0;
                    for (int32_t e = 0; e < E; e++) cdf[e] = acc += ld[e];
                    if (acc <= 0.0) continue; /* a dense layer */
                    draw_ids(&rng, cdf, E, T, K, ids);
                    const int32_t *rl = rep + (size_t)l * E * W, *nl = nv + (size_t)l * E;
                    for (int32_t i = 0; i < T * K; i++)
                        phys[i] =
                            ids[i] < 0 ? -1 : table[((size_t)((i / K) % G) * L + l) * E + ids[i]];
                    bal[0] += batch_balance(phys, T * K, per, G, load);
                    for (int m = 1; m <= 2; m++) {
                        epx_dispatch_spec sp = {m == 1 ? EPX_DISPATCH_DYNAMIC
                                                       : EPX_DISPATCH_WEIGHTED,
                                                E,
                                                P,
                                                W,
                                                NULL,
                                                rl,
                                                nl,
                                                thr + (size_t)l * E * W,
                                                1,
                                                (uint32_t)w,
                                                (uint32_t)l};
                        if (epx_dispatch_map_ids(&sp, ids, T, K, phys, &err) != EPX_OK)
                            die("map", &err);
                        bal[m] += batch_balance(phys, T * K, per, G, load);
                    }
                    epx_balanced_out o = {0};
                    times[n] = 1e9;
                    for (int r = 0; r < REPEAT; r++) {
                        double t0 = now();
                        if (epx_dispatch_balanced_topk(b, rl, nl, ids, T, K, phys, &o, &err) !=
                            EPX_OK)
                            die("balanced", &err);
                        t0 = now() - t0;
                        times[n] = t0 < times[n] ? t0 : times[n];
                    }
                    bal[3] += batch_balance(phys, T * K, per, G, load);
                    int64_t mx = 0;
                    for (int32_t g = 0; g < G; g++) mx = load[g] > mx ? load[g] : mx;
                    for (int32_t i = 0; i < T * K; i++) {
                        if (ids[i] < 0) continue;
                        int ok = 0;
                        for (int32_t j = 0; j < nl[ids[i]]; j++)
                            ok |= rl[ids[i] * W + j] == phys[i];
                        if (!ok) die("a pair off its expert's replicas", NULL);
                    }
                    if (mx != o.max_load_int) die("the largest load is not ceil(optimum)", NULL);
                    int64_t sum = 0;
                    for (int32_t g = 0; g < G; g++) sum += load[g];
                    opt += (double)sum / G * (double)o.max_load_den / (double)o.max_load_num;
                    if (epx_dispatch_count_ids(ids, T, K, E, cnt, &err) != EPX_OK)
                        die("count", &err);
                    stimes[n] = 1e9;
                    for (int r = 0; r < REPEAT; r++) {
                        double t0 = now();
                        if (epx_dispatch_balanced_solve(b, rl, nl, cnt, &o, &err) != EPX_OK)
                            die("solve", &err);
                        t0 = now() - t0;
                        stimes[n] = t0 < stimes[n] ? t0 : stimes[n];
                    }
                    n++;
                }
            qsort(times, n, sizeof *times, cmp_double);
            qsort(stimes, n, sizeof *stimes, cmp_double);
            printf("%-12s %5d %5zu | %8.3f %8.3f %8.3f %8.3f %8.3f | %9.1f %9.1f %9.1f\n",
                   su->trace, T, n, bal[0] / n, bal[1] / n, bal[2] / n, bal[3] / n, opt / n,
                   1e6 * times[n / 2], 1e6 * times[(size_t)(0.99 * (double)(n - 1))],
                   1e6 * stimes[n / 2]);
            fflush(stdout);
        }
        free(times);
        free(stimes);
        free(cdf);
        free(cnt);
        free(load);
        free(ids);
        free(phys);
        free(thr);
        free(table);
        epx_dispatch_balanced_destroy(b);
        epx_plan_destroy(plan);
        epx_counts_destroy(first);
        epx_counts_destroy(c);
    }
    return 0;
}
