/*
 * batches.c - per-batch balancedness, shared by `epx demo` and `epx eval
 * --routing`. A window's figure is balance on average; a batch at decode is
 * small and lumpy. So batches of T tokens are drawn from a load (each token
 * choosing top-k distinct experts in proportion to a layer's counts) and
 * routed to slots by one of the per-token rules a server can run:
 *
 *   static          SGLang's dispatch table (epx_dispatch_table_from_layout,
 *                   the default release's rule), token t sent from rank t mod G
 *   dynamic         uniform over the expert's replicas (Philox draws)
 *   weighted        by per-slot replica weights (Philox draws, thresholds)
 *   balanced        the exact per-batch min-max split (epx_dispatch_balanced_topk)
 *   rank-invariant  SGLang 0.5.23's row rule: replica t mod num_valid
 *
 * Per-batch balancedness = mean / max GPU load of the batch in (token,
 * expert) pairs, averaged over the batches. Every case (layout and rule)
 * sees the same batches, so their figures compare directly.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

const char *const cli_routing_names[CLI_NUM_ROUTES] = {"static", "dynamic", "weighted", "balanced",
                                                       "rank-invariant"};

bool cli_routing_get(const cli_cmd *cmd, const char *name, cli_routing *out) {
    const char *v = cli_get(cmd, name);
    if (v == NULL) return true;
    for (int i = 0; i < CLI_NUM_ROUTES; i++)
        if (strcmp(v, cli_routing_names[i]) == 0) {
            *out = (cli_routing)i;
            return true;
        }
    fprintf(stderr,
            "epx %s: %s '%s' is not a routing: use static, dynamic, weighted, balanced or "
            "rank-invariant\n",
            cmd->name, name, v);
    return false;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* T tokens, each choosing k distinct experts with probability proportional
 * to cdf's increments (cdf [E], running sums; k at most the experts with
 * load). A draw that repeats an expert is drawn again, a few times, then
 * the token takes the next unused expert with load. */
static void draw_batch(uint64_t *rng, const double *cdf, int32_t E, int32_t T, int32_t k,
                       int32_t *ids) {
    for (int32_t t = 0; t < T; t++)
        for (int32_t j = 0; j < k; j++) {
            int32_t e = -1;
            for (int tries = 0; tries < 32 && e < 0; tries++) {
                const double u = (double)(splitmix(rng) >> 11) * 0x1p-53 * cdf[E - 1];
                int32_t lo = 0, hi = E - 1;
                while (lo < hi) {
                    const int32_t mid = (lo + hi) / 2;
                    if (cdf[mid] > u)
                        hi = mid;
                    else
                        lo = mid + 1;
                }
                e = lo;
                for (int32_t i = 0; i < j && e >= 0; i++)
                    if (ids[t * k + i] == e) e = -1;
            }
            for (int32_t c = 0; e < 0 && c < E; c++) {
                bool used = (c ? cdf[c] - cdf[c - 1] : cdf[0]) <= 0;
                for (int32_t i = 0; i < j && !used; i++) used = ids[t * k + i] == c;
                if (!used) e = c;
            }
            ids[t * k + j] = e;
        }
}

/* mean / max GPU load of one routed batch (pairs). */
static double batch_balance(const int32_t *phys, int32_t n, int32_t spg, int32_t G, int64_t *load) {
    memset(load, 0, (size_t)G * sizeof *load);
    int64_t sum = 0, mx = 0;
    for (int32_t i = 0; i < n; i++)
        if (phys[i] >= 0) load[phys[i] / spg]++, sum++;
    for (int32_t g = 0; g < G; g++) mx = load[g] > mx ? load[g] : mx;
    return mx ? (double)sum / G / (double)mx : 1.0;
}

/* What one case needs beside its layout: a static table [G][L][E] or
 * weighted thresholds [L][E][W], computed once for every layer. */
static epx_status case_prepare(const cli_batch_case *c, int32_t W, int32_t **table,
                               uint32_t **thresholds, epx_error *err) {
    const epx_shape *s = epx_layout_shape(c->layout);
    const size_t LE = (size_t)s->num_layers * (size_t)s->num_logical_experts;
    if (c->routing == CLI_ROUTE_STATIC) {
        if ((*table = malloc((size_t)s->num_gpus * LE * sizeof **table)) == NULL) goto nomem;
        return epx_dispatch_table_from_layout(c->layout, NULL, *table, err);
    }
    if (c->routing == CLI_ROUTE_WEIGHTED) {
        if ((*thresholds = malloc(LE * (size_t)W * sizeof **thresholds)) == NULL) goto nomem;
        return epx_dispatch_thresholds(epx_layout_logical_to_all_physical(c->layout, &W),
                                       epx_layout_num_valid(c->layout), s->num_layers,
                                       s->num_logical_experts, W, c->weights,
                                       s->num_physical_experts, *thresholds, err);
    }
    return EPX_OK;
nomem:
    snprintf(err->msg, sizeof err->msg, "out of memory for the per-batch figures");
    return err->status = EPX_ERR_NOMEM;
}

/* Route one batch of layer l by case c into phys; its balancedness. */
static epx_status route(const cli_batch_case *c, const int32_t *table, const uint32_t *th,
                        epx_balancer *b, int32_t l, const int32_t *ids, int32_t T, int32_t k,
                        uint64_t seed, uint32_t pass, int32_t *phys, int64_t *gl, double *out,
                        epx_error *err) {
    const epx_shape *s = epx_layout_shape(c->layout);
    const int32_t L = s->num_layers, E = s->num_logical_experts, G = s->num_gpus;
    int32_t W = 0;
    const int32_t *rep = epx_layout_logical_to_all_physical(c->layout, &W) + (size_t)l * E * W;
    const int32_t *nv = epx_layout_num_valid(c->layout) + (size_t)l * E;
    epx_status st = EPX_OK;
    if (c->routing == CLI_ROUTE_STATIC) {
        for (int32_t x = 0; x < T * k; x++)
            phys[x] =
                table[((size_t)((x / k) % G) * (size_t)L + (size_t)l) * (size_t)E + (size_t)ids[x]];
    } else if (c->routing == CLI_ROUTE_BALANCED) {
        st = epx_dispatch_balanced_topk(b, rep, nv, ids, T, k, phys, NULL, err);
    } else {
        static const epx_dispatch_mode modes[CLI_NUM_ROUTES] = {
            [CLI_ROUTE_DYNAMIC] = EPX_DISPATCH_DYNAMIC,
            [CLI_ROUTE_WEIGHTED] = EPX_DISPATCH_WEIGHTED,
            [CLI_ROUTE_RANK_INVARIANT] = EPX_DISPATCH_ROW};
        const epx_dispatch_spec spec = {.mode = modes[c->routing],
                                        .num_experts = E,
                                        .num_physical = s->num_physical_experts,
                                        .width = W,
                                        .replicas = rep,
                                        .num_valid = nv,
                                        .thresholds = th ? th + (size_t)l * E * W : NULL,
                                        .seed = seed,
                                        .pass = pass,
                                        .layer = (uint32_t)l};
        st = epx_dispatch_map_ids(&spec, ids, T, k, phys, err);
    }
    *out = batch_balance(phys, T * k, s->num_physical_experts / G, G, gl);
    return st;
}

epx_status cli_per_batch(const double *load, int32_t num_windows, const cli_batch_opts *o,
                         cli_batch_case *cases, int num_cases, epx_error *err) {
    const epx_shape *s = epx_layout_shape(cases[0].layout);
    const int32_t L = s->num_layers, E = s->num_logical_experts;
    int32_t TMAX = 1, W = 0;
    for (int32_t i = 0; i < o->num_sizes; i++) TMAX = o->tokens[i] > TMAX ? o->tokens[i] : TMAX;
    (void)epx_layout_logical_to_all_physical(cases[0].layout, &W);
    epx_status st = EPX_OK;
    epx_balancer *b = NULL;
    int32_t **tables = calloc((size_t)num_cases, sizeof *tables);
    uint32_t **th = calloc((size_t)num_cases, sizeof *th);
    double *sum = calloc((size_t)num_cases, sizeof *sum);
    int32_t *ids = malloc((size_t)TMAX * (size_t)o->top_k * sizeof *ids);
    int32_t *phys = malloc((size_t)TMAX * (size_t)o->top_k * sizeof *phys);
    int64_t *gl = malloc((size_t)s->num_gpus * sizeof *gl);
    double *cdf = malloc((size_t)E * sizeof *cdf);
    if (!tables || !th || !sum || !ids || !phys || !gl || !cdf) {
        snprintf(err->msg, sizeof err->msg, "out of memory for the per-batch figures");
        st = err->status = EPX_ERR_NOMEM;
        goto done;
    }
    for (int i = 0; i < num_cases && st == EPX_OK; i++)
        st = case_prepare(&cases[i], W, &tables[i], &th[i], err);
    if (st == EPX_OK)
        st = epx_dispatch_balanced_create(E, W, s->num_physical_experts, s->num_gpus, &b, err);
    for (int32_t ti = 0; st == EPX_OK && ti < o->num_sizes; ti++) {
        const int32_t T = o->tokens[ti];
        uint64_t rng = o->seed * 0x100000001b3ull + (uint64_t)ti;
        memset(sum, 0, (size_t)num_cases * sizeof *sum);
        int64_t n = 0;
        for (int32_t l = 0; st == EPX_OK && l < L; l++) {
            for (int32_t r = 0; st == EPX_OK && r < o->batches; r++) {
                /* one window draws every batch (the demo's); else each its own */
                const int32_t w =
                    num_windows > 1 ? (int32_t)(splitmix(&rng) % (uint64_t)num_windows) : 0;
                const double *row = load + ((size_t)w * (size_t)L + (size_t)l) * (size_t)E;
                double acc = 0.0;
                int32_t loaded = 0;
                for (int32_t e = 0; e < E; e++) {
                    cdf[e] = acc += row[e];
                    loaded += row[e] > 0;
                }
                if (loaded == 0) continue; /* a dense layer, or no load in this window */
                const int32_t k = o->top_k < loaded ? o->top_k : loaded;
                draw_batch(&rng, cdf, E, T, k, ids);
                for (int i = 0; st == EPX_OK && i < num_cases; i++) {
                    double x = 0.0;
                    st = route(&cases[i], tables[i], th[i], b, l, ids, T, k, o->seed, (uint32_t)n,
                               phys, gl, &x, err);
                    sum[i] += x;
                }
                n++;
            }
            if (o->progress != NULL)
                o->progress(o->progress_user, "layers routed", (int64_t)ti * L + l + 1,
                            (int64_t)o->num_sizes * L);
        }
        for (int i = 0; i < num_cases; i++)
            cases[i].balancedness[ti] = n ? sum[i] / (double)n : 1.0;
    }
done:
    epx_dispatch_balanced_destroy(b);
    for (int i = 0; tables && th && i < num_cases; i++) {
        free(tables[i]);
        free(th[i]);
    }
    free(tables);
    free(th);
    free(sum);
    free(ids);
    free(phys);
    free(gl);
    free(cdf);
    return st;
}
