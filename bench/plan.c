/*
 * bench/plan.c - placement speed and quality, one thread.
 *
 * Speed: DeepSeek's EPLB (global and hierarchical) and epx's algorithm on
 * Kimi-K2 (61 x 384 -> 416 slots, 8 GPUs) and DeepSeek-V3 (256 experts in 8
 * groups; 32 GPUs / 4 nodes / 288 slots, 64 / 8 / 320, 256 / 32 / 512), on
 * the loads of shared/traces (a synthetic load of the same shape when the
 * trace is missing). Each configuration is checked before it is timed: the
 * plan must be a valid layout, and the DeepSeek modes of epx_plan_compute
 * must give exactly epx_plan_deepseek's map. Times are medians of many runs:
 * `core` is epx_plan_deepseek alone (float32 load in, maps out), `plan` is
 * epx_plan_compute end to end (window sum, planning, layout, weights); the
 * minimum of the runs is printed beside each median (on a shared machine it
 * is the run least disturbed by other work).
 *
 * Quality: for every trace in shared/traces on its model's usual shape,
 * balancedness in-sample (plan and score on the sum of all windows) and on
 * the next window (plan on windows <= w, score on window w + 1, mean over w).
 *
 * Usage: bench_plan [--quick]   (EPX_SHARED overrides the shared/ folder)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "epx.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v; *lo receives the minimum (the least disturbed run on a shared box). */
static double median(double *v, int n, double *lo) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    *lo = v[0];
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die(const char *what, const epx_error *err) {
    fprintf(stderr, "bench_plan: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

/* shared/: EPX_SHARED, else ../shared beside this source tree. */
static const char *shared_dir(void) {
    static char buf[4096];
    const char *env = getenv("EPX_SHARED");
    if (env) return env;
    snprintf(buf, sizeof buf, "%s", __FILE__);
    char *slash = strrchr(buf, '/');
    if (slash == NULL) return "../shared";
    *slash = '\0'; /* .../bench */
    slash = strrchr(buf, '/');
    if (slash == NULL) return "../shared";
    snprintf(slash, sizeof buf - (size_t)(slash - buf), "/../shared");
    return buf;
}

/* A synthetic load: lognormal expert popularity with per-window drift. */
static epx_counts *synthetic(int32_t S, int32_t L, int32_t E, uint64_t seed) {
    epx_counts *c = NULL;
    epx_error err = {0};
    if (epx_counts_create(S, L, E, &c, &err) != EPX_OK) die("counts", &err);
    uint64_t s = seed;
    for (size_t i = 0; i < (size_t)S * (size_t)L * (size_t)E; i++) {
        s += 0x9E3779B97F4A7C15ull;
        uint64_t z = s;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        double u1 = ((double)(z >> 11) + 0.5) / 9007199254740992.0;
        double u2 = ((double)((z * 0x2545F4914F6CDD1Dull) >> 11) + 0.5) / 9007199254740992.0;
        double g = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        c->data[i] = floor(1000.0 * exp(0.8 * g));
    }
    return c;
}

static epx_counts *load_trace(const char *name, int32_t L, int32_t E, int *synthetic_used) {
    char path[4300];
    snprintf(path, sizeof path, "%s/traces/%s.json", shared_dir(), name);
    epx_counts *c = NULL;
    epx_error err = {0};
    if (epx_counts_read(path, &c, &err) == EPX_OK && c->num_layers == L && c->num_experts == E) {
        *synthetic_used = 0;
        return c;
    }
    epx_counts_destroy(c);
    *synthetic_used = 1;
    return synthetic(8, L, E, 42);
}

typedef struct shape_case {
    const char *label, *trace;
    int32_t L, E, P, G, N, groups;
} shape_case;

static epx_plan *plan_or_die(const epx_counts *c, const shape_case *k, epx_algorithm a) {
    epx_shape s = {k->L, k->E, k->P, k->G, k->N};
    epx_plan_opts o = EPX_PLAN_OPTS_INIT;
    o.algorithm = a;
    o.num_groups = k->groups;
    epx_plan *p = NULL;
    epx_error err = {0};
    if (epx_plan_compute(c, &s, &o, &p, &err) != EPX_OK) die("epx_plan_compute", &err);
    return p;
}

static double balancedness(const epx_plan *p, const double *load) {
    epx_balance b;
    epx_error err = {0};
    if (epx_balance_compute(epx_plan_layout(p), load, epx_plan_replica_weights(p), &b, NULL,
                            &err) != EPX_OK)
        die("epx_balance_compute", &err);
    return b.balancedness;
}

/* ---- speed ----------------------------------------------------------------- */

static void speed(const shape_case *k, int runs) {
    int synth = 0;
    epx_counts *c = load_trace(k->trace, k->L, k->E, &synth);
    const size_t LE = (size_t)k->L * (size_t)k->E, LP = (size_t)k->L * (size_t)k->P;
    double *sum = malloc(LE * sizeof *sum);
    float *w = malloc(LE * sizeof *w);
    int32_t *map = malloc(LP * sizeof *map);
    int32_t *l2p = malloc(LE * (size_t)(k->P - k->E + 1) * sizeof *l2p);
    int32_t *cnt = malloc(LE * sizeof *cnt);
    double *t = malloc((size_t)runs * sizeof *t);
    epx_error err = {0};
    if (epx_counts_sum_windows(c, 0, c->num_windows, sum, &err) != EPX_OK) die("sum", &err);
    for (size_t i = 0; i < LE; i++) w[i] = (float)sum[i];
    const epx_algorithm algos[] = {EPX_ALGO_DEEPSEEK, EPX_ALGO_DEEPSEEK_HIERARCHICAL, EPX_ALGO_EPX};
    for (int ai = 0; ai < 3; ai++) {
        const epx_algorithm a = algos[ai];
        const int hier = a == EPX_ALGO_DEEPSEEK_HIERARCHICAL;
        if (hier && (k->groups == 0 || k->groups % k->N != 0)) {
            printf(
                "%-22s %-22s %10s %10s %10s %10s %12s  (%d groups do not divide over %d nodes)\n",
                k->label, epx_algorithm_name(a), "n/a", "n/a", "n/a", "n/a", "n/a", k->groups,
                k->N);
            continue;
        }
        /* Check first: a valid layout, and for DeepSeek the exact map. */
        epx_plan *p = plan_or_die(c, k, a);
        const double bal = balancedness(p, sum);
        double core = NAN, core_min = NAN;
        if (a != EPX_ALGO_EPX) {
            if (epx_plan_deepseek(w, k->L, k->E, k->P, k->groups ? k->groups : 1, k->N, k->G, hier,
                                  map, l2p, cnt, &err) != EPX_OK)
                die("epx_plan_deepseek", &err);
            if (memcmp(map, epx_layout_physical_to_logical(epx_plan_layout(p)), LP * sizeof *map) !=
                0)
                die("epx_plan_compute and epx_plan_deepseek disagree", NULL);
            for (int r = 0; r < runs; r++) {
                double t0 = now();
                epx_plan_deepseek(w, k->L, k->E, k->P, k->groups ? k->groups : 1, k->N, k->G, hier,
                                  map, l2p, cnt, &err);
                t[r] = now() - t0;
            }
            core = median(t, runs, &core_min);
        }
        epx_plan_destroy(p);
        int pruns = a == EPX_ALGO_EPX ? (runs / 4 > 5 ? runs / 4 : 5) : runs;
        for (int r = 0; r < pruns; r++) {
            epx_plan *q = plan_or_die(c, k, a);
            t[r] = epx_plan_seconds(q);
            epx_plan_destroy(q);
        }
        double full_min;
        const double full = median(t, pruns, &full_min);
        char core_s[32];
        if (isnan(core))
            snprintf(core_s, sizeof core_s, "%10s %10s", "-", "-");
        else
            snprintf(core_s, sizeof core_s, "%10.3f %10.3f", 1e3 * core, 1e3 * core_min);
        printf("%-22s %-22s %s %10.3f %10.3f %12.4f%s\n", k->label, epx_algorithm_name(a), core_s,
               1e3 * full, 1e3 * full_min, bal, synth ? "  (synthetic load: trace missing)" : "");
    }
    free(sum), free(w), free(map), free(l2p), free(cnt), free(t);
    epx_counts_destroy(c);
}

/* ---- quality --------------------------------------------------------------- */

static void quality(const shape_case *k) {
    int synth = 0;
    epx_counts *c = load_trace(k->trace, k->L, k->E, &synth);
    const int32_t S = c->num_windows;
    const size_t LE = (size_t)k->L * (size_t)k->E;
    double *sum = malloc(LE * sizeof *sum);
    epx_error err = {0};
    const epx_algorithm algos[] = {EPX_ALGO_DEEPSEEK, EPX_ALGO_AUTO, EPX_ALGO_EPX};
    for (int ai = 0; ai < 3; ai++) {
        epx_plan *p = plan_or_die(c, k, algos[ai]);
        if (epx_counts_sum_windows(c, 0, S, sum, &err) != EPX_OK) die("sum", &err);
        const double in = balancedness(p, sum);
        const char *ran = epx_algorithm_name(epx_plan_algorithm(p));
        epx_plan_destroy(p);
        double next = 0.0;
        int n = 0;
        for (int32_t w = 0; w + 1 < S; w++) {
            epx_counts *head = NULL;
            if (epx_counts_create(w + 1, k->L, k->E, &head, &err) != EPX_OK) die("counts", &err);
            memcpy(head->data, c->data, (size_t)(w + 1) * LE * sizeof *head->data);
            epx_plan *q = plan_or_die(head, k, algos[ai]);
            next += balancedness(q, epx_counts_row(c, w + 1, 0));
            n++;
            epx_plan_destroy(q);
            epx_counts_destroy(head);
        }
        printf("%-22s %-10s %-22s %12.4f %12.4f%s\n", k->label, epx_algorithm_name(algos[ai]), ran,
               in, n ? next / n : NAN, synth ? "  (synthetic)" : "");
    }
    free(sum);
    epx_counts_destroy(c);
}

int main(int argc, char **argv) {
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    const shape_case speed_cases[] = {
        {"kimi-k2 8gpu/416", "kimi_k2", 61, 384, 416, 8, 1, 0},
        {"dsv3 32gpu/4node/288", "deepseek_v3", 61, 256, 288, 32, 4, 8},
        {"dsv3 64gpu/8node/320", "deepseek_v3", 61, 256, 320, 64, 8, 8},
        {"dsv3 256gpu/32node/512", "deepseek_v3", 61, 256, 512, 256, 32, 8},
    };
    printf("epx %s bench_plan: one thread; times in ms, median of runs; balancedness on the sum of "
           "the windows\n",
           epx_version());
    printf("shared: %s\n\n", shared_dir());
    printf("%-22s %-22s %10s %10s %10s %10s %12s\n", "shape", "algorithm", "core_ms", "core_min",
           "plan_ms", "plan_min", "balancedness");
    for (size_t i = 0; i < sizeof speed_cases / sizeof speed_cases[0]; i++)
        speed(&speed_cases[i], quick ? 11 : 201);

    const shape_case quality_cases[] = {
        {"kimi-k2 8gpu/416", "kimi_k2", 61, 384, 416, 8, 1, 0},
        {"kimi-k2 16gpu/2node/416", "kimi_k2", 61, 384, 416, 16, 2, 0},
        {"dsv3 32gpu/4node/288", "deepseek_v3", 61, 256, 288, 32, 4, 8},
        {"dsv3 64gpu/8node/320", "deepseek_v3", 61, 256, 320, 64, 8, 8},
        {"dsv3 256gpu/32node/512", "deepseek_v3", 61, 256, 512, 256, 32, 8},
        {"qwen3-235b 8gpu/136", "qwen3_235b", 94, 128, 136, 8, 1, 0},
        {"gpt-oss-120b 8gpu/136", "gpt_oss_120b", 36, 128, 136, 8, 1, 0},
        {"mixtral-8x7b 8gpu/16", "mixtral_8x7b", 32, 8, 16, 8, 1, 0},
    };
    printf("\n%-22s %-10s %-22s %12s %12s\n", "shape", "requested", "ran", "in-sample",
           "next-window");
    for (size_t i = 0; i < sizeof quality_cases / sizeof quality_cases[0]; i++)
        quality(&quality_cases[i]);
    return 0;
}
