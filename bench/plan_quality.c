/*
 * plan_quality.c - placement quality and speed, DeepSeek vs epx, on every
 * trace in shared/traces and a sweep of cluster shapes.
 *
 * For each trace (SGLang logical_count, S windows) and shape (GPUs/nodes,
 * P = G * ceil((E + max(G, 32)) / G) slots, DeepSeek-V3 with its 8 groups):
 *  - in-sample: plan on all S windows, balancedness on their sum;
 *  - next-window: plan on windows 0..w, balancedness on window w + 1,
 *    averaged over w = 0..S-2 (a plan serves the traffic after it);
 *  - time per plan (all S windows, one thread, best of 3);
 *  - cross-node share of the load (epx_plan_cross_node_share).
 * DeepSeek runs as SGLang's `auto` (hierarchical where the groups divide
 * over the nodes), epx with its defaults; epx's balancedness uses its
 * replica weights, DeepSeek's the even split its dispatch does.
 * Results are checked before anything is timed: every plan is a valid
 * layout (epx_plan_compute builds it; a failure exits 2). epx below DeepSeek
 * in-sample is marked "(<deepseek)": since issue 16 the default plans for
 * its estimate alone where the load moves, and the sum is not its target.
 *
 * Extra sections (the measurements behind docs/PLACEMENT.md):
 *   --estimates  next-window balancedness per estimate (the default's choice)
 *   --ablate     each lever of epx's algorithm switched off in turn
 *   --budget     relaxed mode's cross-node budget against balance and traffic
 *   --timing     only the two timing targets of issue 3
 *   --grid       next-window back-test on synthetic traces (wider skew,
 *                drift 0.3, shifts) against DeepSeek on the last window and
 *                on the summed history, tuning seeds then held-out seeds
 *                (--grid-seeds 1..2,11..13 by default)
 * Usage: bench_plan_quality [--shared DIR] [--estimates] [--ablate] [--budget]
 *                           [--timing] [--grid [--grid-seeds A..B,C..D]]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "epx.h"
#include "epx/metrics.h"
#include "../src/plan/epx_algo.h"

static const char *TRACES[] = {"deepseek_v3", "kimi_k2", "qwen3_235b", "gpt_oss_120b",
                               "mixtral_8x7b"};
#define NTRACES (int)(sizeof TRACES / sizeof TRACES[0])

typedef struct shape_def {
    int32_t G, N;
} shape_def;
static const shape_def SHAPES[] = {{8, 1}, {16, 2}, {32, 4}, {64, 8}};
#define NSHAPES (int)(sizeof SHAPES / sizeof SHAPES[0])

static int g_failures = 0;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what, const epx_error *e) {
    fprintf(stderr, "bench_plan_quality: %s: %s\n", what, e->msg);
    exit(2);
}

static int32_t slots_for(int32_t E, int32_t G) {
    int32_t R = G > 32 ? G : 32;
    return G * ((E + R + G - 1) / G);
}

/* A view of the first n windows (they are a prefix of the data). */
static epx_counts prefix(const epx_counts *c, int32_t n) {
    epx_counts v = *c;
    v.num_windows = n;
    return v;
}

/* A planner: the public API (algo) or epx's internals with knobs. */
typedef struct planner {
    const char *name;
    epx_algorithm algo;
    const epxi_knobs *knobs; /* non-NULL: epxi_plan_epx_knobs */
    epx_node_local node_local;
    epx_estimate estimate;
    double estimate_param;
    double budget;
} planner;

typedef struct planned {
    epx_layout *layout;
    double *weights; /* [L][P], owned */
    double seconds;
} planned;

static void planned_free(planned *p) {
    epx_layout_destroy(p->layout);
    free(p->weights);
    memset(p, 0, sizeof *p);
}

static epx_plan_opts opts_for(const planner *pl, int32_t groups) {
    epx_plan_opts o = EPX_PLAN_OPTS_INIT;
    o.algorithm = pl->algo;
    o.num_groups = groups;
    if (pl->algo == EPX_ALGO_EPX) {
        o.node_local = pl->node_local;
        o.estimate = pl->estimate;
        o.estimate_param = pl->estimate_param;
        o.cross_node_budget = pl->budget;
    }
    return o;
}

static planned run_plan(const planner *pl, const epx_counts *c, const epx_shape *s,
                        int32_t groups) {
    planned out = {0};
    epx_error e = {0};
    epx_plan_opts o = opts_for(pl, groups);
    size_t LP = (size_t)s->num_layers * (size_t)s->num_physical_experts;
    out.weights = malloc(LP * sizeof(double));
    if (pl->knobs == NULL) {
        epx_plan *plan = NULL;
        if (epx_plan_compute(c, s, &o, &plan, &e) != EPX_OK) die("epx_plan_compute", &e);
        if (epx_layout_clone(epx_plan_layout(plan), &out.layout, &e) != EPX_OK) die("clone", &e);
        memcpy(out.weights, epx_plan_replica_weights(plan), LP * sizeof(double));
        out.seconds = epx_plan_seconds(plan);
        epx_plan_destroy(plan);
    } else {
        int32_t *map = malloc(LP * sizeof(int32_t));
        double t0 = now();
        if (epxi_plan_epx_knobs(c, s, &o, pl->knobs, map, out.weights, NULL, &e) != EPX_OK)
            die("epxi_plan_epx_knobs", &e);
        out.seconds = now() - t0;
        if (epx_layout_create_from_map(s, map, &out.layout, &e) != EPX_OK) die("layout", &e);
        free(map);
    }
    return out;
}

/* Balancedness of a plan on load [L][E]; weights NULL = even split. */
static double balance(const planned *p, const double *load, bool weighted) {
    epx_balance b;
    epx_error e = {0};
    if (epx_balance_compute(p->layout, load, weighted ? p->weights : NULL, &b, NULL, &e) != EPX_OK)
        die("epx_balance_compute", &e);
    return b.balancedness;
}

typedef struct quality {
    double in_sample, in_sample_even, next, next_even, seconds, cross;
} quality;

static quality measure(const planner *pl, const epx_counts *c, const epx_shape *s, int32_t groups,
                       int reps) {
    quality q = {0};
    const int32_t S = c->num_windows, L = c->num_layers, E = c->num_experts;
    double *sum = malloc((size_t)L * (size_t)E * sizeof(double));
    epx_error e = {0};
    if (epx_counts_sum_windows(c, 0, S, sum, &e) != EPX_OK) die("sum", &e);
    q.seconds = HUGE_VAL;
    for (int r = 0; r < reps; r++) {
        planned p = run_plan(pl, c, s, groups);
        if (p.seconds < q.seconds) q.seconds = p.seconds;
        if (r == 0) {
            q.in_sample = balance(&p, sum, true);
            q.in_sample_even = balance(&p, sum, false);
            if (epx_plan_cross_node_share(p.layout, p.weights, c, groups > 0 ? groups : 1, NULL,
                                          &q.cross, &e) != EPX_OK)
                die("cross-node share", &e);
        }
        planned_free(&p);
    }
    for (int32_t w = 0; w + 1 < S; w++) {
        epx_counts v = prefix(c, w + 1);
        planned p = run_plan(pl, &v, s, groups);
        const double *next = epx_counts_row(c, w + 1, 0);
        q.next += balance(&p, next, true) / (S - 1);
        q.next_even += balance(&p, next, false) / (S - 1);
        planned_free(&p);
    }
    free(sum);
    return q;
}

static epx_counts *load_trace(const char *shared, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/traces/%s.json", shared, name);
    epx_counts *c = NULL;
    epx_error e = {0};
    if (epx_counts_read(path, &c, &e) != EPX_OK) die(path, &e);
    return c;
}

static epx_shape make_shape(const epx_counts *c, int32_t G, int32_t N) {
    epx_shape s = {c->num_layers, c->num_experts, slots_for(c->num_experts, G), G, N};
    return s;
}

static int32_t groups_of(const char *trace) { return strcmp(trace, "deepseek_v3") == 0 ? 8 : 0; }

static const planner DS = {"deepseek(auto)",     EPX_ALGO_AUTO, NULL, EPX_NODE_LOCAL_DEFAULT,
                           EPX_ESTIMATE_DEFAULT, -1.0,          -1.0};
static const planner EPX = {"epx", EPX_ALGO_EPX, NULL, EPX_NODE_LOCAL_DEFAULT, EPX_ESTIMATE_DEFAULT,
                            -1.0,  -1.0};

static void main_table(const char *shared) {
    printf("## in-sample and next-window balancedness, time per plan (one thread)\n\n");
    printf("| trace | GPUs/nodes | P | deepseek in | epx in | deepseek next | epx next (even) |"
           " deepseek ms | epx ms | epx cross-node |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (int t = 0; t < NTRACES; t++) {
        epx_counts *c = load_trace(shared, TRACES[t]);
        for (int k = 0; k < NSHAPES; k++) {
            epx_shape s = make_shape(c, SHAPES[k].G, SHAPES[k].N);
            int32_t gr = groups_of(TRACES[t]);
            quality d = measure(&DS, c, &s, gr, 3), x = measure(&EPX, c, &s, gr, 3);
            /* Below DeepSeek in-sample is allowed since issue 16: where the
             * load moves, the default plans for the estimate, not the sum. */
            bool bad = x.in_sample < d.in_sample - 1e-12;
            printf(
                "| %s | %d/%d | %d | %.4f | %.4f%s | %.4f | %.4f (%.4f) | %.2f | %.2f | %.3f |\n",
                TRACES[t], s.num_gpus, s.num_nodes, s.num_physical_experts, d.in_sample,
                x.in_sample, bad ? " (<deepseek)" : "", d.next, x.next, x.next_even,
                1e3 * d.seconds, 1e3 * x.seconds, x.cross);
            fflush(stdout);
        }
        epx_counts_destroy(c);
    }
    printf("\n");
}

static void timing(const char *shared) {
    printf("## timing targets (issue 3): epx <= 10 ms (Kimi-K2 8 GPUs/416), <= 100 ms "
           "(DeepSeek-V3 256 GPUs/32 nodes/512)\n\n");
    printf("| case | deepseek ms | epx ms | deepseek in | epx in | deepseek next | epx next |\n");
    printf("|---|---|---|---|---|---|---|\n");
    struct {
        const char *trace;
        int32_t G, N, P, groups;
    } cases[] = {{"kimi_k2", 8, 1, 416, 0},
                 {"deepseek_v3", 32, 4, 288, 8},
                 {"deepseek_v3", 64, 8, 320, 8},
                 {"deepseek_v3", 256, 32, 512, 8}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        epx_counts *c = load_trace(shared, cases[i].trace);
        epx_shape s = {c->num_layers, c->num_experts, cases[i].P, cases[i].G, cases[i].N};
        quality d = measure(&DS, c, &s, cases[i].groups, 5);
        quality x = measure(&EPX, c, &s, cases[i].groups, 5);
        printf("| %s %d GPUs/%d nodes/%d | %.2f | %.2f | %.4f | %.4f | %.4f | %.4f |\n",
               cases[i].trace, s.num_gpus, s.num_nodes, s.num_physical_experts, 1e3 * d.seconds,
               1e3 * x.seconds, d.in_sample, x.in_sample, d.next, x.next);
        fflush(stdout);
        epx_counts_destroy(c);
    }
    printf("\n");
}

/* Mean over traces and shapes of next-window (and in-sample) balancedness. */
static int g_only_shape = -1; /* sweep: only this SHAPES index (budget section) */

static void sweep(const char *shared, const planner *pls, int n, const char *title,
                  bool only_multinode_ds) {
    printf("## %s\n\n| variant | in-sample | next-window | next (even split) | cross-node |"
           " ms |\n|---|---|---|---|---|---|\n",
           title);
    epx_counts *cs[NTRACES];
    for (int t = 0; t < NTRACES; t++) cs[t] = load_trace(shared, TRACES[t]);
    for (int i = 0; i < n; i++) {
        double in = 0, nx = 0, nxe = 0, cr = 0, ms = 0;
        int cnt = 0;
        for (int t = 0; t < NTRACES; t++) {
            if (only_multinode_ds && groups_of(TRACES[t]) == 0) continue;
            for (int k = 0; k < NSHAPES; k++) {
                if (only_multinode_ds && SHAPES[k].N == 1) continue;
                if (g_only_shape >= 0 && k != g_only_shape) continue;
                epx_shape s = make_shape(cs[t], SHAPES[k].G, SHAPES[k].N);
                quality q = measure(&pls[i], cs[t], &s, groups_of(TRACES[t]), 1);
                in += q.in_sample, nx += q.next, nxe += q.next_even, cr += q.cross;
                ms += 1e3 * q.seconds, cnt++;
            }
        }
        printf("| %s | %.4f | %.4f | %.4f | %.3f | %.2f |\n", pls[i].name, in / cnt, nx / cnt,
               nxe / cnt, cr / cnt, ms / cnt);
        fflush(stdout);
    }
    for (int t = 0; t < NTRACES; t++) epx_counts_destroy(cs[t]);
    printf("\n");
}

static const epxi_knobs K_DEFAULT = EPXI_KNOBS_DEFAULT;

static void estimates(const char *shared) {
    static planner p[] = {
        {"deepseek(auto), sum", EPX_ALGO_AUTO, NULL, 0, 0, -1, -1},
        {"epx sum", EPX_ALGO_EPX, &K_DEFAULT, 0, EPX_ESTIMATE_SUM, -1, -1},
        {"epx recency h=0.25", EPX_ALGO_EPX, &K_DEFAULT, 0, EPX_ESTIMATE_RECENCY, 0.25, -1},
        {"epx recency h=0.5", EPX_ALGO_EPX, &K_DEFAULT, 0, EPX_ESTIMATE_RECENCY, 0.5, -1},
        {"epx recency h=1", EPX_ALGO_EPX, &K_DEFAULT, 0, EPX_ESTIMATE_RECENCY, 1.0, -1},
        {"epx recency h=2", EPX_ALGO_EPX, &K_DEFAULT, 0, EPX_ESTIMATE_RECENCY, 2.0, -1},
        {"epx recency h=4", EPX_ALGO_EPX, &K_DEFAULT, 0, EPX_ESTIMATE_RECENCY, 4.0, -1},
        {"epx mean+0.5sd", EPX_ALGO_EPX, &K_DEFAULT, 0, EPX_ESTIMATE_MEAN_STD, 0.5, -1},
        {"epx mean+1sd", EPX_ALGO_EPX, &K_DEFAULT, 0, EPX_ESTIMATE_MEAN_STD, 1.0, -1},
        {"epx mean+2sd", EPX_ALGO_EPX, &K_DEFAULT, 0, EPX_ESTIMATE_MEAN_STD, 2.0, -1},
        {"epx minmax", EPX_ALGO_EPX, &K_DEFAULT, 0, EPX_ESTIMATE_MINMAX, -1, -1},
    };
    sweep(shared, p, (int)(sizeof p / sizeof p[0]),
          "estimates: mean over 5 traces x 4 shapes (back-test: plan on windows <= w, score "
          "w + 1)",
          false);
}

/* The default before and after tracking (issue 16) on shared/traces. */
static void tracking(const char *shared) {
    static epxi_knobs old;
    old = K_DEFAULT;
    old.track = 0;
    static epxi_knobs t3;
    t3 = K_DEFAULT;
    t3.track = 3;
    static epxi_knobs t6;
    t6 = K_DEFAULT;
    t6.min_h = 0.5;
    static planner p[] = {
        {"deepseek(auto), sum", EPX_ALGO_AUTO, NULL, 0, 0, -1, -1},
        {"old default: recency h=0.5 under the summed cap", EPX_ALGO_EPX, &old, 0, 0, -1, -1},
        {"default: tracking (chosen half-life, no cap when moved)", EPX_ALGO_EPX, NULL, 0, 0, -1,
         -1},
        {"track on a shift only, else chosen h under the cap", EPX_ALGO_EPX, &t3, 0, 0, -1, -1},
        {"tracking, h >= 0.5 unless shifted", EPX_ALGO_EPX, &t6, 0, 0, -1, -1},
    };
    sweep(shared, p, (int)(sizeof p / sizeof p[0]),
          "the default before and after tracking: mean over 5 traces x 4 shapes", false);
}

/* Replicas that share a GPU with another replica of their expert. */
static int64_t duplicates(const epx_layout *lay) {
    const epx_shape *s = epx_layout_shape(lay);
    const int32_t K = s->num_physical_experts / s->num_gpus;
    const int32_t *m = epx_layout_physical_to_logical(lay);
    int64_t n = 0;
    for (int32_t l = 0; l < s->num_layers; l++)
        for (int32_t g = 0; g < s->num_gpus; g++) {
            const int32_t *row = m + (size_t)l * s->num_physical_experts + (size_t)g * K;
            for (int32_t i = 0; i < K; i++)
                for (int32_t j = 0; j < i; j++)
                    if (row[i] == row[j]) {
                        n++;
                        break;
                    }
        }
    return n;
}

/* In-sample levers: each trace summed into one window (no estimate), so
 * only the search itself is measured. */
static void sweep_one_window(const char *shared, const planner *pls, int n, const char *title) {
    printf("## %s\n\n| variant | balancedness | even split | duplicate replicas / plan | ms |\n"
           "|---|---|---|---|---|\n",
           title);
    epx_counts *cs[NTRACES];
    for (int t = 0; t < NTRACES; t++) {
        epx_counts *c = load_trace(shared, TRACES[t]);
        epx_error e = {0};
        if (epx_counts_create(1, c->num_layers, c->num_experts, &cs[t], &e) != EPX_OK)
            die("counts", &e);
        if (epx_counts_sum_windows(c, 0, c->num_windows, cs[t]->data, &e) != EPX_OK) die("sum", &e);
        epx_counts_destroy(c);
    }
    for (int i = 0; i < n; i++) {
        double in = 0, ine = 0, ms = 0, dups = 0;
        int cnt = 0;
        for (int t = 0; t < NTRACES; t++)
            for (int k = 0; k < NSHAPES; k++) {
                epx_shape s = make_shape(cs[t], SHAPES[k].G, SHAPES[k].N);
                planned p = run_plan(&pls[i], cs[t], &s, groups_of(TRACES[t]));
                in += balance(&p, cs[t]->data, true);
                ine += balance(&p, cs[t]->data, false);
                dups += (double)duplicates(p.layout);
                ms += 1e3 * p.seconds, cnt++;
                planned_free(&p);
            }
        printf("| %s | %.4f | %.4f | %.1f | %.2f |\n", pls[i].name, in / cnt, ine / cnt, dups / cnt,
               ms / cnt);
        fflush(stdout);
    }
    for (int t = 0; t < NTRACES; t++) epx_counts_destroy(cs[t]);
    printf("\n");
}

static void ablate(const char *shared) {
    static epxi_knobs k[12];
    for (int i = 0; i < 12; i++) k[i] = K_DEFAULT;
    for (int i = 0; i < 4; i++) k[i].start = 0; /* the levers on top of the greedy start */
    k[0].search = false, k[0].shares = false, k[0].baseline = false;  /* greedy only */
    k[1].recount = false, k[1].shares = false, k[1].baseline = false; /* + swaps */
    k[2].shares = false, k[2].baseline = false;                       /* + re-counts */
    k[3].baseline = false;                                            /* + shares */
    k[4].start = 0;                                                   /* greedy start */
    k[5].start = 2;                                                   /* both starts */
    k[6].max_iters = 1000000;                                         /* no move cap */
    k[7].phase1 = false;                                              /* est. from DS map */
    k[8].shares = false;                                              /* even split */
    k[9].max_iters2 = 1000000;                                        /* no phase-2 cap */
    k[10].recount = false;                                            /* swaps only */
    static planner one[] = {
        {"deepseek(auto)", EPX_ALGO_AUTO, NULL, 0, 0, -1, -1},
        {"greedy: DeepSeek's counts, largest first, no duplicates", EPX_ALGO_EPX, &k[0], 0, 0, -1,
         -1},
        {"+ swap search", EPX_ALGO_EPX, &k[1], 0, 0, -1, -1},
        {"+ re-count moves", EPX_ALGO_EPX, &k[2], 0, 0, -1, -1},
        {"+ replica shares", EPX_ALGO_EPX, &k[3], 0, 0, -1, -1},
        {"+ DeepSeek guard (= default)", EPX_ALGO_EPX, &K_DEFAULT, 0, 0, -1, -1},
        {"default, greedy start everywhere", EPX_ALGO_EPX, &k[4], 0, 0, -1, -1},
        {"default, both starts", EPX_ALGO_EPX, &k[5], 0, 0, -1, -1},
        {"default, no move cap", EPX_ALGO_EPX, &k[6], 0, 0, -1, -1},
    };
    sweep_one_window(shared, one, (int)(sizeof one / sizeof one[0]),
                     "ablation, in-sample: each trace summed into one window, 5 traces x 4 "
                     "shapes");
    static planner nxt[] = {
        {"deepseek(auto)", EPX_ALGO_AUTO, NULL, 0, 0, -1, -1},
        {"epx, plan for the sum (no estimate)", EPX_ALGO_EPX, &K_DEFAULT, 0, EPX_ESTIMATE_SUM, -1,
         -1},
        {"epx default (its estimate after phase 1)", EPX_ALGO_EPX, &K_DEFAULT, 0, 0, -1, -1},
        {"estimate search from DeepSeek's map (no phase 1)", EPX_ALGO_EPX, &k[7], 0, 0, -1, -1},
        {"default without replica shares", EPX_ALGO_EPX, &k[8], 0, 0, -1, -1},
        {"default without re-count moves", EPX_ALGO_EPX, &k[10], 0, 0, -1, -1},
        {"default, no move cap for the estimate", EPX_ALGO_EPX, &k[9], 0, 0, -1, -1},
    };
    sweep(shared, nxt, (int)(sizeof nxt / sizeof nxt[0]),
          "ablation, next window: 5 traces x 4 shapes", false);
}

static void budget(const char *shared) {
    static planner p[] = {
        {"deepseek(auto) = hierarchical", EPX_ALGO_AUTO, NULL, 0, 0, -1, -1},
        {"deepseek global", EPX_ALGO_DEEPSEEK, NULL, 0, 0, -1, -1},
        {"epx strict", EPX_ALGO_EPX, NULL, EPX_NODE_LOCAL_STRICT, 0, -1, -1},
        {"epx relaxed 0.05", EPX_ALGO_EPX, NULL, EPX_NODE_LOCAL_RELAXED, 0, -1, 0.05},
        {"epx relaxed 0.10", EPX_ALGO_EPX, NULL, EPX_NODE_LOCAL_RELAXED, 0, -1, 0.10},
        {"epx relaxed 0.25", EPX_ALGO_EPX, NULL, EPX_NODE_LOCAL_RELAXED, 0, -1, 0.25},
        {"epx relaxed 0.50 (default)", EPX_ALGO_EPX, NULL, EPX_NODE_LOCAL_RELAXED, 0, -1, 0.50},
        {"epx relaxed 1.00", EPX_ALGO_EPX, NULL, EPX_NODE_LOCAL_RELAXED, 0, -1, 1.00},
        {"epx off (global)", EPX_ALGO_EPX, NULL, EPX_NODE_LOCAL_OFF, 0, -1, -1},
    };
    for (int k = 0; k < NSHAPES; k++) {
        if (SHAPES[k].N == 1) continue;
        char title[160];
        snprintf(title, sizeof title,
                 "node-local modes: DeepSeek-V3 trace (8 groups), %d GPUs / "
                 "%d nodes",
                 SHAPES[k].G, SHAPES[k].N);
        g_only_shape = k;
        sweep(shared, p, (int)(sizeof p / sizeof p[0]), title, true);
    }
    g_only_shape = -1;
}

/* ---- the next-window grid (issue 16) ------------------------------------
 * Synthetic traces the planners were never tuned on: wider skew, stronger
 * drift, workload shifts. Each cell: plan on windows 0..w, score on w + 1,
 * for w = GRID_FIRST..S-2, averaged over seeds. Two baselines, both
 * DeepSeek as SGLang runs it (`auto`): planned on the last window alone,
 * and on the summed history (what SGLang's rebalance does). Parameters of
 * epx are chosen on the tuning seeds; the table reports the held-out ones. */
typedef struct grid_trace {
    const char *label;
    double lo, hi, drift;
    int32_t shift;
} grid_trace;
static const grid_trace GRID_TRACES[] = {
    {"σ 0.8-1.3, drift 0.1", 0.8, 1.3, 0.1, 0},
    {"σ 0.8-1.3, drift 0.3", 0.8, 1.3, 0.3, 0},
    {"σ 1.2-1.6, drift 0.1", 1.2, 1.6, 0.1, 0},
    {"σ 1.2-1.6, drift 0.3", 1.2, 1.6, 0.3, 0},
    {"σ 0.8-1.3, drift 0.1, shift@5", 0.8, 1.3, 0.1, 5},
    {"σ 1.2-1.6, drift 0.3, shift@5", 1.2, 1.6, 0.3, 5},
};
#define NGRID_TRACES (int)(sizeof GRID_TRACES / sizeof GRID_TRACES[0])

typedef struct grid_shape {
    const char *model;
    int32_t G, N, P, groups;
    epx_node_local mode;
} grid_shape;
static const grid_shape GRID_SHAPES[] = {
    {"kimi-k2", 8, 1, 416, 0, EPX_NODE_LOCAL_OFF},
    {"kimi-k2", 8, 1, 384, 0, EPX_NODE_LOCAL_OFF},
    {"qwen3-235b", 16, 2, 160, 0, EPX_NODE_LOCAL_OFF},
    {"deepseek-v3", 32, 4, 288, 8, EPX_NODE_LOCAL_RELAXED},
    {"deepseek-v3", 32, 4, 288, 8, EPX_NODE_LOCAL_STRICT},
    {"deepseek-v3", 64, 8, 320, 8, EPX_NODE_LOCAL_RELAXED},
    {"deepseek-v3", 64, 8, 320, 8, EPX_NODE_LOCAL_STRICT},
};
#define NGRID_SHAPES (int)(sizeof GRID_SHAPES / sizeof GRID_SHAPES[0])
#define GRID_WINDOWS 8
#define GRID_FIRST 2
#define GRID_TOKENS 16384

static const char *mode_name(epx_node_local m) {
    return m == EPX_NODE_LOCAL_STRICT ? "strict" : m == EPX_NODE_LOCAL_RELAXED ? "relaxed" : "off";
}

/* Next-window balancedness of one planner on one trace, mean over w. */
static double grid_next(const planner *pl, const epx_counts *c, const epx_shape *s, int32_t groups,
                        bool last_only) {
    double t = 0.0;
    int n = 0;
    for (int32_t w = GRID_FIRST; w + 1 < c->num_windows; w++) {
        epx_counts v = prefix(c, w + 1);
        if (last_only) { /* the last window alone */
            v.num_windows = 1;
            v.data = epx_counts_row(c, w, 0);
        }
        planned p = run_plan(pl, &v, s, groups);
        t += balance(&p, epx_counts_row(c, w + 1, 0), pl->algo == EPX_ALGO_EPX);
        n++;
        planned_free(&p);
    }
    return t / n;
}

/* Plan once (on windows 0..GRID_FIRST), then only re-fit the shares to each
 * window w (epx_plan_refit_shares) and score w + 1: no weight moves after
 * the first plan. */
static double grid_refit(const planner *pl, const epx_counts *c, const epx_shape *s,
                         int32_t groups) {
    epx_counts v = prefix(c, GRID_FIRST + 1);
    planned p = run_plan(pl, &v, s, groups);
    double t = 0.0;
    int n = 0;
    epx_error e = {0};
    for (int32_t w = GRID_FIRST; w + 1 < c->num_windows; w++) {
        if (epx_plan_refit_shares(p.layout, epx_counts_row(c, w, 0), p.weights, &e) != EPX_OK)
            die("refit", &e);
        t += balance(&p, epx_counts_row(c, w + 1, 0), true);
        n++;
    }
    planned_free(&p);
    return t / n;
}

static epxi_knobs g_grid_knobs[8];
static planner g_grid_variants[8];
static int g_grid_nvariants = 0;

/* The epx variants the grid compares: the default first. */
static void grid_variants(bool all) {
    static const epxi_knobs def = EPXI_KNOBS_DEFAULT;
    static const char *names[] = {"epx",
                                  "old default (summed cap)",
                                  "estimate h=0.5",
                                  "estimate, chosen h",
                                  "estimate when moved (h<4)",
                                  "estimate on a shift, else chosen h under the cap",
                                  "estimate when moved, h >= 0.5 unless shifted"};
    const int n = all ? 7 : 1;
    for (int i = 0; i < n; i++) {
        g_grid_knobs[i] = def;
        g_grid_variants[i] = EPX;
        g_grid_variants[i].name = names[i];
        g_grid_variants[i].knobs = &g_grid_knobs[i];
    }
    g_grid_variants[0].knobs = NULL; /* the public default */
    if (all) {
        g_grid_knobs[1].track = 0;
        g_grid_knobs[2].track = 2, g_grid_knobs[2].track_h = 0.5;
        g_grid_knobs[3].track = 2, g_grid_knobs[3].track_h = 0.0;
        g_grid_knobs[4].track = 1, g_grid_knobs[4].track_h = 0.0, g_grid_knobs[4].moved_h = 4.0;
        g_grid_knobs[5].track = 3, g_grid_knobs[5].track_h = 0.0;
        g_grid_knobs[6].min_h = 0.5;
    }
    g_grid_nvariants = n;
}

static void grid(int seed_lo, int seed_hi, const char *which) {
    printf("## next-window grid, %s seeds %d-%d: %d windows of %d tokens, plan on 0..w, score "
           "w + 1 for w = %d..%d\n\n",
           which, seed_lo, seed_hi, GRID_WINDOWS, GRID_TOKENS, GRID_FIRST, GRID_WINDOWS - 2);
    const bool refit = g_grid_nvariants > 1;
    printf("| trace | model | GPUs/nodes/P | epx mode | DS last | DS sum |");
    for (int v = 0; v < g_grid_nvariants; v++) printf(" %s |", g_grid_variants[v].name);
    if (refit) printf(" epx planned once, shares re-fit each window |");
    printf(" epx - best baseline |\n|---|---|---|---|---|---|");
    for (int v = 0; v <= g_grid_nvariants + refit; v++) printf("---|");
    printf("\n");
    double worst[8], mean_delta[8];
    int losses[8], cells = 0;
    for (int v = 0; v < 8; v++) worst[v] = HUGE_VAL, mean_delta[v] = 0.0, losses[v] = 0;
    for (int k = 0; k < NGRID_SHAPES; k++) {
        const grid_shape *g = &GRID_SHAPES[k];
        const epx_model *m = NULL;
        epx_error e = {0};
        if (epx_model_lookup(g->model, &m, &e) != EPX_OK) die("model", &e);
        for (int t = 0; t < NGRID_TRACES; t++) {
            const grid_trace *gt = &GRID_TRACES[t];
            double dl = 0, dsum = 0, x[8] = {0}, rf = 0;
            for (int seed = seed_lo; seed <= seed_hi; seed++) {
                epx_trace_opts o = EPX_TRACE_OPTS_INIT;
                o.num_windows = GRID_WINDOWS;
                o.tokens = GRID_TOKENS;
                o.seed = (uint64_t)seed;
                o.skew_lo = gt->lo, o.skew_hi = gt->hi, o.drift = gt->drift;
                o.shift_window = gt->shift;
                epx_counts *c = NULL;
                if (epx_trace_synth(m, &o, &c, &e) != EPX_OK) die("trace", &e);
                epx_shape s = {c->num_layers, c->num_experts, g->P, g->G, g->N};
                dl += grid_next(&DS, c, &s, g->groups, true);
                dsum += grid_next(&DS, c, &s, g->groups, false);
                for (int v = 0; v < g_grid_nvariants; v++) {
                    planner xp = g_grid_variants[v];
                    xp.node_local = g->mode;
                    x[v] += grid_next(&xp, c, &s, g->groups, false);
                }
                if (refit) {
                    planner xp = EPX;
                    xp.node_local = g->mode;
                    rf += grid_refit(&xp, c, &s, g->groups);
                }
                epx_counts_destroy(c);
            }
            const int ns = seed_hi - seed_lo + 1;
            dl /= ns, dsum /= ns;
            const double best = dl > dsum ? dl : dsum;
            printf("| %s | %s | %d/%d/%d | %s | %.4f | %.4f |", gt->label, g->model, g->G, g->N,
                   g->P, mode_name(g->mode), dl, dsum);
            for (int v = 0; v < g_grid_nvariants; v++) {
                x[v] /= ns;
                const double d = x[v] - best;
                if (d < worst[v]) worst[v] = d;
                mean_delta[v] += d;
                losses[v] += d < 0.0;
                printf(" %.4f |", x[v]);
            }
            if (refit) printf(" %.4f |", rf / ns);
            printf(" %+.4f%s |\n", x[0] - best, x[0] - best < 0.0 ? " LOSS" : "");
            cells++;
            fflush(stdout);
        }
    }
    printf("\n");
    for (int v = 0; v < g_grid_nvariants; v++)
        printf("%s: below the better baseline in %d of %d cells; mean - best %+.4f, worst "
               "%+.4f\n",
               g_grid_variants[v].name, losses[v], cells, mean_delta[v] / cells, worst[v]);
    printf("\n");
}

int main(int argc, char **argv) {
    const char *shared = getenv("EPX_SHARED");
    if (shared == NULL) shared = "../shared";
    bool est = false, abl = false, bud = false, only_timing = false, grd = false, grid_all = false,
         trk = false;
    int tune_lo = 1, tune_hi = 2, held_lo = 11, held_hi = 13;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--shared") == 0 && i + 1 < argc)
            shared = argv[++i];
        else if (strcmp(argv[i], "--estimates") == 0)
            est = true;
        else if (strcmp(argv[i], "--ablate") == 0)
            abl = true;
        else if (strcmp(argv[i], "--budget") == 0)
            bud = true;
        else if (strcmp(argv[i], "--timing") == 0)
            only_timing = true;
        else if (strcmp(argv[i], "--tracking") == 0)
            trk = true;
        else if (strcmp(argv[i], "--grid") == 0)
            grd = true;
        else if (strcmp(argv[i], "--grid-variants") == 0)
            grd = grid_all = true;
        else if (strcmp(argv[i], "--grid-seeds") == 0 && i + 1 < argc &&
                 sscanf(argv[i + 1], "%d..%d,%d..%d", &tune_lo, &tune_hi, &held_lo, &held_hi) == 4)
            i++;
        else {
            fprintf(stderr,
                    "usage: %s [--shared DIR] [--estimates] [--ablate] [--budget] "
                    "[--timing] [--grid [--grid-seeds A..B,C..D]]\n",
                    argv[0]);
            return 2;
        }
    }
    if (grd) { /* synthetic: needs no shared traces */
        grid_variants(grid_all);
        grid(tune_lo, tune_hi, "tuning");
        grid(held_lo, held_hi, "held-out");
        return g_failures ? 1 : 0;
    }
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/traces/kimi_k2.json", shared);
    FILE *f = fopen(probe, "r");
    if (f == NULL) {
        fprintf(stderr, "bench_plan_quality: no traces under %s (set EPX_SHARED or --shared)\n",
                shared);
        return 2;
    }
    fclose(f);
    if (trk) {
        tracking(shared);
        return 0;
    }
    timing(shared);
    if (!only_timing && !est && !abl && !bud) main_table(shared);
    if (est) estimates(shared);
    if (abl) ablate(shared);
    if (bud) budget(shared);
    if (g_failures)
        fprintf(stderr, "bench_plan_quality: %d cases where epx < deepseek in-sample\n",
                g_failures);
    return g_failures ? 1 : 0;
}
