/*
 * dispatch_table.c - bench_dispatch_table: how evenly a static dispatch
 * table spreads the load, SGLang's against epx's, on every trace in
 * shared/traces, and how long each table takes to compute.
 *
 * A static table sends all of rank r's tokens of expert e to one replica;
 * with tokens arriving evenly from every rank (uniform token origin), GPU
 * g then receives sum over (r, e) with table[r][l][e] on g of load[l][e]/G
 * (epx_dispatch_table_gpu_load). Balancedness = mean over loaded layers of
 * mean GPU load / max GPU load. The even split over replicas (what dynamic
 * dispatch gives on average) is printed beside it as the reference.
 *
 * Placements are planned on windows 0..3 of each trace; the tables are
 * judged on windows 0..3 (in sample) and 4..7 (the traffic that follows).
 * Two placements: DeepSeek's EPLB (SGLang's `auto`), whose replica-rank
 * order SGLang's init_by_eplb passes to its table, and epx's planner with
 * its replica weights. Tables: SGLang's (replica-rank and ascending
 * order), epx's with no load, and epx's with the planning load (and the
 * planner's weights). Also printed: the share of the load that crosses
 * nodes (rank and chosen GPU on different nodes), and the time to compute
 * the table (one thread). Before anything is printed, every table is
 * checked: each entry holds its expert, and the same-GPU rule holds.
 * Usage: bench_dispatch_table [--shared DIR]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "epx.h"

typedef struct setup {
    const char *trace;
    int32_t G, N, P, groups;
} setup;

static const setup SETUPS[] = {
    {"kimi_k2", 8, 1, 416, 1},      {"kimi_k2", 16, 2, 448, 1},   {"deepseek_v3", 32, 4, 288, 8},
    {"deepseek_v3", 64, 8, 320, 8}, {"qwen3_235b", 8, 1, 160, 1}, {"gpt_oss_120b", 8, 1, 160, 1},
    {"mixtral_8x7b", 8, 1, 16, 1},
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what, const epx_error *err) {
    fprintf(stderr, "bench_dispatch_table: %s: %s\n", what, err->msg);
    exit(1);
}

/* Balancedness of per-layer GPU loads [L][G] (the library's definition). */
static double balance(const double *gl, int32_t L, int32_t G) {
    double b = 1.0;
    epx_error err = {0};
    if (epx_gpu_loads_balance(gl, L, G, &b, NULL, &err) != EPX_OK) die("balance", &err);
    return b;
}

/* Balancedness of a table on a load, after checking the table; *xnode
 * gets the share of the load a rank sends to a GPU on another node. */
static double table_balance(const epx_shape *s, const epx_layout *lay, const int32_t *table,
                            const double *load, double *gl, double *xnode) {
    const int32_t *p2l = epx_layout_physical_to_logical(lay);
    int32_t L = s->num_layers, E = s->num_logical_experts, G = s->num_gpus,
            P = s->num_physical_experts;
    int32_t per = P / G, gpn = G / s->num_nodes;
    double cross = 0.0, all = 0.0;
    for (int32_t g = 0; g < G; g++)
        for (int32_t l = 0; l < L; l++)
            for (int32_t e = 0; e < E; e++) {
                int32_t p = table[((size_t)g * (size_t)L + (size_t)l) * (size_t)E + (size_t)e];
                double v = load[(size_t)l * (size_t)E + (size_t)e];
                all += v;
                if (p / per / gpn != g / gpn) cross += v;
                if (p2l[(size_t)l * (size_t)P + (size_t)p] != e ||
                    (epx_layout_replicas_on_gpu(lay, l, g, e) > 0 && p / per != g)) {
                    fprintf(stderr,
                            "bench_dispatch_table: table entry [%d][%d][%d] = %d is wrong\n", g, l,
                            e, p);
                    exit(1);
                }
            }
    *xnode = all > 0.0 ? cross / all : 0.0;
    epx_error err = {0};
    if (epx_dispatch_table_gpu_load(s, table, load, gl, &err) != EPX_OK) die("gpu load", &err);
    return balance(gl, L, G);
}

/* Balancedness of the even split over replicas (weights NULL) or by weights. */
static double split_balance(const epx_shape *s, const epx_layout *lay, const double *weights,
                            const double *load, double *gl) {
    int32_t L = s->num_layers, E = s->num_logical_experts, G = s->num_gpus,
            P = s->num_physical_experts;
    const int32_t *p2l = epx_layout_physical_to_logical(lay), *nv = epx_layout_num_valid(lay);
    memset(gl, 0, sizeof *gl * (size_t)L * (size_t)G);
    for (int32_t l = 0; l < L; l++)
        for (int32_t p = 0; p < P; p++) {
            int32_t e = p2l[(size_t)l * (size_t)P + (size_t)p];
            double share = weights ? weights[(size_t)l * (size_t)P + (size_t)p]
                                   : 1.0 / nv[(size_t)l * (size_t)E + (size_t)e];
            gl[(size_t)l * (size_t)G + (size_t)(p / (P / G))] +=
                load[(size_t)l * (size_t)E + (size_t)e] * share;
        }
    return balance(gl, L, G);
}

int main(int argc, char **argv) {
    const char *shared = getenv("EPX_SHARED");
    if (argc > 2 && strcmp(argv[1], "--shared") == 0) shared = argv[2];
    if (shared == NULL) shared = "../shared";
    printf("%-13s %3s %2s %4s %-8s %-26s %8s %8s %7s %9s\n", "trace", "G", "N", "P", "placer",
           "table", "in-samp", "next", "x-node", "ms/table");
    for (size_t si = 0; si < sizeof SETUPS / sizeof SETUPS[0]; si++) {
        const setup *su = &SETUPS[si];
        char path[1024];
        snprintf(path, sizeof path, "%s/traces/%s.json", shared, su->trace);
        epx_error err = {0};
        epx_counts *c = NULL;
        if (epx_counts_read(path, &c, &err) != EPX_OK) die(path, &err);
        int32_t L = c->num_layers, E = c->num_experts, S = c->num_windows;
        if (S < 8) {
            fprintf(stderr, "bench_dispatch_table: %s has %d windows, 8 needed\n", path, S);
            return 1;
        }
        size_t LE = (size_t)L * (size_t)E;
        double *plan_load = malloc(sizeof(double) * LE), *next_load = malloc(sizeof(double) * LE);
        if (epx_counts_sum_windows(c, 0, 4, plan_load, &err) != EPX_OK) die("sum", &err);
        if (epx_counts_sum_windows(c, 4, 4, next_load, &err) != EPX_OK) die("sum", &err);
        epx_counts *first = NULL;
        if (epx_counts_create(4, L, E, &first, &err) != EPX_OK) die("counts", &err);
        memcpy(first->data, c->data, sizeof(double) * 4 * LE);
        epx_shape s = {L, E, su->P, su->G, su->N};
        int32_t G = su->G, P = su->P;
        int32_t *table = malloc(sizeof(int32_t) * (size_t)G * LE);
        double *gl = malloc(sizeof(double) * (size_t)L * (size_t)G);

        /* DeepSeek's placement with its replica-rank lists */
        float *w = malloc(sizeof(float) * LE);
        for (size_t i = 0; i < LE; i++) w[i] = (float)plan_load[i];
        int32_t *p2l = malloc(sizeof(int32_t) * (size_t)L * (size_t)P);
        int32_t W = P - E + 1;
        int32_t *l2p = malloc(sizeof(int32_t) * LE * (size_t)W);
        int hier = su->groups > 1 && su->groups % su->N == 0 && su->N > 1;
        if (epx_plan_deepseek(w, L, E, P, su->groups, su->N, G, hier, p2l, l2p, NULL, &err) !=
            EPX_OK)
            die("deepseek", &err);
        epx_layout *ds = NULL;
        if (epx_layout_create_from_map(&s, p2l, &ds, &err) != EPX_OK) die("layout", &err);
        /* epx's placement and weights */
        epx_plan_opts po = EPX_PLAN_OPTS_INIT;
        po.num_groups = su->groups;
        epx_plan *plan = NULL;
        if (epx_plan_compute(first, &s, &po, &plan, &err) != EPX_OK) die("epx plan", &err);
        const epx_layout *ep = epx_plan_layout(plan);
        const double *pw = epx_plan_replica_weights(plan);

        struct {
            const char *placer;
            const epx_layout *lay;
            const double *weights;
        } placements[2] = {{"deepseek", ds, NULL}, {"epx", ep, pw}};
        for (int pi = 0; pi < 2; pi++) {
            const epx_layout *lay = placements[pi].lay;
            printf("%-13s %3d %2d %4d %-8s %-26s %8.4f %8.4f %7s %9s\n", su->trace, G, su->N, P,
                   placements[pi].placer,
                   placements[pi].weights ? "(weighted split)" : "(even split)",
                   split_balance(&s, lay, placements[pi].weights, plan_load, gl),
                   split_balance(&s, lay, placements[pi].weights, next_load, gl), "-", "-");
            for (int ti = 0; ti < 4; ti++) {
                epx_table_opts o = EPX_TABLE_OPTS_INIT;
                const char *name = NULL;
                const int32_t *reps = NULL;
                int32_t width = 0;
                if (ti == 0) {
                    if (pi != 0) continue; /* replica-rank order exists for DeepSeek's plan */
                    name = "sglang replica-rank";
                    reps = l2p;
                    width = W;
                } else if (ti == 1) {
                    name = "sglang ascending";
                } else if (ti == 2) {
                    name = "epx (no load)";
                    o.algorithm = EPX_TABLE_EPX;
                } else {
                    name = placements[pi].weights ? "epx (load + weights)" : "epx (load)";
                    o.algorithm = EPX_TABLE_EPX;
                    o.expected_load = plan_load;
                    o.replica_weights = placements[pi].weights;
                }
                double t0 = now();
                epx_status st = reps ? epx_dispatch_table_compute(&s, reps, width, &o, table, &err)
                                     : epx_dispatch_table_from_layout(lay, &o, table, &err);
                double ms = (now() - t0) * 1e3;
                if (st != EPX_OK) die(name, &err);
                double xi, xn;
                double bi = table_balance(&s, lay, table, plan_load, gl, &xi);
                double bn = table_balance(&s, lay, table, next_load, gl, &xn);
                printf("%-13s %3d %2d %4d %-8s %-26s %8.4f %8.4f %7.3f %9.2f\n", su->trace, G,
                       su->N, P, placements[pi].placer, name, bi, bn, xn, ms);
            }
        }
        epx_plan_destroy(plan);
        epx_layout_destroy(ds);
        free(w);
        free(p2l);
        free(l2p);
        free(table);
        free(gl);
        free(plan_load);
        free(next_load);
        epx_counts_destroy(first);
        epx_counts_destroy(c);
    }
    return 0;
}
