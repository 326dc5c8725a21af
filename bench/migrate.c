/*
 * migrate.c - what rebalancing moves, on the consecutive windows of every
 * trace in shared/traces: epx against moving every changed slot.
 *
 * For each trace (8 windows) the cluster serves window w + 1 with the plan
 * made after window w, from windows 0..w (what a recorder has by then). The
 * first plan (w = 0) is free; rebalances w = 1..6 are counted (each has a
 * next window to serve). Policies, each a chain of layouts in service:
 *   naive         plan from scratch every time and move every slot whose
 *                 expert changed (SGLang's and vLLM's rebalance), whole;
 *   relabel       the same plans, relabelled against the layout in service
 *                 and moved by epx's migration plan (local copies, one
 *                 transfer per GPU and expert, same node first): the same
 *                 balance for fewer bytes;
 *   max_moves=M   epx_plan_compute with current and a cap of M moved slots
 *                 per rebalance (over all layers);
 *   price=X       ... with move_price X (balancedness of its layer a moved
 *                 slot must buy);
 *   stale         max_moves = 0: the first plan serves every window (what
 *                 rebalancing buys at all).
 * Figures per policy, summed or averaged over the 6 rebalances: GB over
 * links (bytes_moved of epx's migration plan; naive: changed slots times
 * expert bytes), the busiest GPU's GB received, balancedness (even split,
 * loaded layers) on the window planned from (w) and on the window served
 * (w + 1), the balance given up against naive on the served window, and
 * the next-window balance gained per GB moved. Expert bytes: gate, up and
 * down projections in bf16, 3 * hidden * moe_intermediate * 2 (models.json).
 *
 * Checks before any figure is printed: every layout is valid (the library
 * builds it), the cap holds, bytes_moved equals the sum of per-GPU received
 * bytes and never exceeds the naive bytes of the same two layouts, and a
 * relabelled plan has exactly the balance of the plan it relabels. A
 * violation is printed and the exit status is 1.
 *
 * Usage: bench_migrate [--shared DIR] [--quick]
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "epx.h"
#include "epx/metrics.h"

typedef struct model {
    const char *trace;
    int32_t G, N, R, groups;
    size_t expert_bytes;
} model;

static const model MODELS[] = {
    {"kimi_k2", 8, 1, 32, 0, (size_t)3 * 7168 * 2048 * 2},
    {"deepseek_v3", 16, 2, 32, 8, (size_t)3 * 7168 * 2048 * 2},
    {"qwen3_235b", 8, 1, 16, 0, (size_t)3 * 4096 * 1536 * 2},
    {"gpt_oss_120b", 8, 1, 16, 0, (size_t)3 * 2880 * 2880 * 2},
    {"mixtral_8x7b", 8, 1, 8, 0, (size_t)3 * 4096 * 14336 * 2},
};
#define NMODELS (int)(sizeof MODELS / sizeof MODELS[0])

enum { POL_NAIVE, POL_RELABEL, POL_CAP, POL_PRICE };
typedef struct policy {
    int kind;
    double param; /* CAP: share of L * P slots; PRICE: move_price */
    char name[32];
} policy;

static int g_fail = 0;
#define CHECK(c, ...)                                                                              \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "bench_migrate: check failed: ");                                      \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            g_fail = 1;                                                                            \
        }                                                                                          \
    } while (0)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what, const epx_error *e) {
    fprintf(stderr, "bench_migrate: %s: %s\n", what, e->msg);
    exit(2);
}

/* Windows [0, n) as a view (a prefix of the data). */
static epx_counts prefix(const epx_counts *c, int32_t n) {
    epx_counts v = *c;
    v.num_windows = n;
    return v;
}

/* Window w alone as a view. */
static epx_counts window(const epx_counts *c, int32_t w) {
    epx_counts v = *c;
    v.num_windows = 1;
    v.data = c->data + (size_t)w * (size_t)c->num_layers * (size_t)c->num_experts;
    return v;
}

static double balance(const epx_layout *lay, const epx_counts *win) {
    epx_balance b;
    epx_error err = {0};
    if (epx_balance_compute(lay, win->data, NULL, &b, NULL, &err) != EPX_OK) die("balance", &err);
    return b.balancedness;
}

static epx_plan *plan(const epx_counts *c, const epx_shape *s, const model *m,
                      const epx_layout *current, int32_t max_moves, double price, double *secs) {
    epx_plan_opts o = EPX_PLAN_OPTS_INIT;
    o.num_groups = m->groups;
    o.current = current;
    o.max_moves = max_moves;
    o.move_price = price;
    epx_plan *p = NULL;
    epx_error err = {0};
    double t0 = now();
    if (epx_plan_compute(c, s, &o, &p, &err) != EPX_OK) die("plan", &err);
    *secs += now() - t0;
    return p;
}

typedef struct totals {
    double gb, naive_gb, inter_gb, max_rank_gb, bal_plan, bal_next, gain_per_gb_num, secs;
    int64_t changed;
    int n;
} totals;

/* The migration from `from` to `to`: checked, and its figures added. */
static void add_migration(totals *t, const epx_layout *from, const epx_layout *to, size_t B,
                          bool naive) {
    epx_migrate_opts o = EPX_MIGRATE_OPTS_INIT;
    o.expert_bytes = B;
    o.relabel = naive ? 0 : 1;
    epx_migration *mig = NULL;
    epx_error err = {0};
    if (epx_migration_plan(from, to, &o, &mig, &err) != EPX_OK) die("migration", &err);
    epx_migration_stats st;
    epx_migration_get_stats(mig, &st);
    const int32_t G = epx_layout_shape(from)->num_gpus;
    uint64_t *recv = calloc((size_t)G, sizeof *recv), sum = 0;
    epx_migration_rank_bytes(mig, NULL, recv);
    for (int32_t g = 0; g < G; g++) sum += recv[g];
    free(recv);
    CHECK(sum == st.bytes_moved, "per-GPU bytes %llu != bytes_moved %llu", (unsigned long long)sum,
          (unsigned long long)st.bytes_moved);
    CHECK(st.bytes_moved <= st.naive_bytes_moved, "epx moves more than naive");
    if (naive) {
        t->gb += (double)st.naive_bytes_moved / 1e9;
        t->inter_gb += (double)st.naive_bytes_inter_node / 1e9;
        t->changed += st.naive_changed; /* the busiest GPU: naive_max_rank_gb */
    } else {
        t->gb += (double)st.bytes_moved / 1e9;
        t->inter_gb += (double)st.bytes_inter_node / 1e9;
        t->changed += st.changed;
        t->max_rank_gb += (double)st.max_rank_recv / 1e9;
    }
    t->naive_gb += (double)st.naive_bytes_moved / 1e9;
    epx_migration_destroy(mig);
}

/* The busiest GPU under the naive plan: changed slots of each GPU, whole. */
static double naive_max_rank_gb(const epx_layout *from, const epx_layout *to, size_t B) {
    const epx_shape *s = epx_layout_shape(from);
    const int32_t P = s->num_physical_experts, spg = P / s->num_gpus;
    const int32_t *a = epx_layout_physical_to_logical(from),
                  *b = epx_layout_physical_to_logical(to);
    int64_t most = 0;
    for (int32_t g = 0; g < s->num_gpus; g++) {
        int64_t n = 0;
        for (int32_t l = 0; l < s->num_layers; l++)
            for (int32_t k = 0; k < spg; k++) {
                size_t i = (size_t)l * P + (size_t)(g * spg + k);
                n += a[i] != b[i];
            }
        if (n > most) most = n;
    }
    return (double)most * (double)B / 1e9;
}

static int64_t moves_between(const epx_layout *a, const epx_layout *b) {
    const epx_shape *s = epx_layout_shape(a);
    const size_t n = (size_t)s->num_layers * (size_t)s->num_physical_experts;
    const int32_t *x = epx_layout_physical_to_logical(a), *y = epx_layout_physical_to_logical(b);
    int64_t m = 0;
    for (size_t i = 0; i < n; i++) m += x[i] != y[i];
    return m;
}

static void run_policy(const model *m, const epx_counts *c, const epx_shape *s, const policy *pol,
                       int32_t rebalances, totals *t) {
    memset(t, 0, sizeof *t);
    const int32_t LP = s->num_layers * s->num_physical_experts;
    const int32_t cap = pol->kind == POL_CAP ? (int32_t)lround(pol->param * LP) : -1;
    const double price = pol->kind == POL_PRICE ? pol->param : 0.0;
    double secs = 0;
    epx_counts first = prefix(c, 1);
    epx_plan *served = plan(&first, s, m, NULL, -1, 0.0, &secs);
    epx_layout *in_service = NULL;
    epx_error err = {0};
    if (epx_layout_clone(epx_plan_layout(served), &in_service, &err) != EPX_OK) die("clone", &err);
    epx_plan_destroy(served);
    secs = 0;
    for (int32_t w = 1; w <= rebalances; w++) {
        epx_counts hist = prefix(c, w + 1), planned = window(c, w), next = window(c, w + 1);
        epx_plan *p;
        if (pol->kind == POL_NAIVE || pol->kind == POL_RELABEL) {
            p = plan(&hist, s, m, NULL, -1, 0.0, &secs);
        } else {
            p = plan(&hist, s, m, in_service, cap, price, &secs);
            CHECK(cap < 0 || moves_between(in_service, epx_plan_layout(p)) <= cap,
                  "%s %s: %lld moves above the cap %d", m->trace, pol->name,
                  (long long)moves_between(in_service, epx_plan_layout(p)), cap);
        }
        const epx_layout *target = epx_plan_layout(p);
        epx_layout *next_service = NULL;
        if (pol->kind == POL_RELABEL) {
            /* relabel the fresh plan against the layout in service */
            epx_migrate_opts o = EPX_MIGRATE_OPTS_INIT;
            o.expert_bytes = m->expert_bytes;
            epx_migration *mig = NULL;
            if (epx_migration_plan(in_service, target, &o, &mig, &err) != EPX_OK)
                die("relabel", &err);
            if (epx_layout_clone(epx_migration_layout(mig), &next_service, &err) != EPX_OK)
                die("clone", &err);
            epx_migration_destroy(mig);
            CHECK(fabs(balance(next_service, &next) - balance(target, &next)) < 1e-12,
                  "relabelling changed the balance");
        } else if (epx_layout_clone(target, &next_service, &err) != EPX_OK) {
            die("clone", &err);
        }
        const double b_before = balance(in_service, &next);
        add_migration(t, in_service, next_service, m->expert_bytes, pol->kind == POL_NAIVE);
        if (pol->kind == POL_NAIVE)
            t->max_rank_gb += naive_max_rank_gb(in_service, next_service, m->expert_bytes);
        t->bal_plan += balance(next_service, &planned);
        const double b_after = balance(next_service, &next);
        t->bal_next += b_after;
        t->gain_per_gb_num += b_after - b_before;
        t->n++;
        epx_layout_destroy(in_service);
        in_service = next_service;
        epx_plan_destroy(p);
    }
    t->secs = secs;
    epx_layout_destroy(in_service);
}

int main(int argc, char **argv) {
    const char *shared = getenv("EPX_SHARED") ? getenv("EPX_SHARED") : "../shared";
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--shared") == 0 && i + 1 < argc)
            shared = argv[++i];
        else if (strcmp(argv[i], "--quick") == 0)
            quick = true;
        else {
            fprintf(stderr, "usage: bench_migrate [--shared DIR] [--quick]\n");
            return 2;
        }
    }
    policy pols[] = {
        {POL_NAIVE, 0, "naive"},
        {POL_RELABEL, 0, "relabel"},
        {POL_CAP, 0.10, "max_moves=10%"},
        {POL_CAP, 0.05, "max_moves=5%"},
        {POL_CAP, 0.02, "max_moves=2%"},
        {POL_CAP, 0.01, "max_moves=1%"},
        {POL_PRICE, 1e-3, "price=0.001"},
        {POL_PRICE, 1e-4, "price=0.0001"},
        {POL_CAP, 0.0, "stale (no moves)"},
    };
    const int npol = (int)(sizeof pols / sizeof pols[0]);
    printf("| model | G x N | policy | moves | GB over links | %% of naive | inter-node GB | "
           "busiest GPU GB | bal. planned window | bal. next window | given up (next) | "
           "gain per GB (next) | plan s |\n");
    printf("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
           "---: |\n");
    for (int mi = 0; mi < NMODELS; mi++) {
        const model *m = &MODELS[mi];
        char path[4096];
        snprintf(path, sizeof path, "%s/traces/%s.json", shared, m->trace);
        epx_counts *c = NULL;
        epx_error err = {0};
        if (epx_counts_read(path, &c, &err) != EPX_OK) die(path, &err);
        const int32_t E = c->num_experts;
        epx_shape s = {c->num_layers, E, E + m->R, m->G, m->N};
        const int32_t rebalances = quick ? 2 : c->num_windows - 2;
        totals naive = {0};
        for (int pi = 0; pi < npol; pi++) {
            totals t;
            run_policy(m, c, &s, &pols[pi], rebalances, &t);
            if (pi == 0) naive = t;
            const double n = t.n;
            printf("| %s | %d x %d | %s | %lld | %.1f | %.1f | %.1f | %.2f | %.4f | %.4f | %.4f | "
                   "%.5f | %.2f |\n",
                   m->trace, m->G, m->N, pols[pi].name, (long long)t.changed, t.gb,
                   naive.gb > 0 ? 100.0 * t.gb / naive.gb : 0.0, t.inter_gb, t.max_rank_gb / n,
                   t.bal_plan / n, t.bal_next / n, (naive.bal_next - t.bal_next) / n,
                   t.gb > 0 ? t.gain_per_gb_num / t.gb : 0.0, t.secs);
            fflush(stdout);
        }
        epx_counts_destroy(c);
    }
    if (g_fail) fprintf(stderr, "bench_migrate: checks FAILED\n");
    return g_fail;
}
