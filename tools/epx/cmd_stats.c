/*
 * cmd_stats.c - `epx stats FILE [--placement FILE --gpus G [--nodes N]]`:
 * how a placement (or, without one, the trivial layout with P = E) balances
 * the load in a counts file, per window and over all windows together (the
 * load a planner sees), with each window's worst layers first.
 *
 * Balancedness, the bound and the gap come from epx/metrics.h; imbalance
 * and the inter-node share from epx/stats.h. The text table is for people;
 * --json prints the same figures as one object for scripts, in strict JSON:
 * a figure that is not finite (no load to divide by) is null.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef struct {
    epx_balance bal;
    epx_load_stats st;
    epx_layer_balance *lb; /* [L] */
    epx_layer_stats *ls;   /* [L] */
    int32_t *order;        /* [L] layers, worst balancedness first */
    double tokens;         /* token-expert assignments in the window */
} window_figures;

static const epx_layer_balance *sort_lb; /* qsort has no context argument */

static int by_balancedness(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const epx_layer_balance *p = &sort_lb[x], *q = &sort_lb[y];
    if (p->loaded != q->loaded) return p->loaded ? -1 : 1; /* loaded layers first */
    if (p->balancedness != q->balancedness) return p->balancedness < q->balancedness ? -1 : 1;
    return x < y ? -1 : x > y;
}

static epx_status compute(const epx_layout *lay, const double *load, epx_traffic_model traffic,
                          window_figures *w, epx_error *err) {
    const epx_shape *s = epx_layout_shape(lay);
    const int32_t L = s->num_layers;
    epx_status st = epx_balance_compute(lay, load, NULL, &w->bal, w->lb, err);
    if (st == EPX_OK) st = epx_load_stats_compute(lay, load, NULL, traffic, &w->st, w->ls, err);
    if (st != EPX_OK) return st;
    w->tokens = 0;
    for (int32_t l = 0; l < L; l++) {
        w->tokens += w->ls[l].total;
        w->order[l] = l;
    }
    sort_lb = w->lb;
    qsort(w->order, (size_t)L, sizeof *w->order, by_balancedness);
    return EPX_OK;
}

static const char *traffic_name(epx_traffic_model t) {
    return t == EPX_TRAFFIC_UNIFORM     ? "uniform"
           : t == EPX_TRAFFIC_GPU_LOCAL ? "gpu-local"
                                        : "node-local";
}

static void print_row(const char *label, const window_figures *w) {
    printf("%-7s %14.0f %8.4f %8.4f %8.4f %8.4f %8.4f %8.4f %9.4f\n", label, w->tokens,
           w->bal.balancedness, w->bal.balancedness_sglang, w->bal.bound, w->bal.gap,
           w->st.rank_imbalance, w->st.slot_imbalance, w->st.internode_share);
}

static void print_worst(const char *label, const window_figures *w, int32_t top, int32_t L) {
    printf("\n%s, worst layers first:\n", label);
    printf("  %5s %12s %8s %8s %8s %8s %8s %8s %9s\n", "layer", "load", "balanced", "bound", "gap",
           "max/bnd", "rank-imb", "slot-imb", "internode");
    int32_t shown = 0;
    for (int32_t i = 0; i < L && (top == 0 || shown < top); i++) {
        const int32_t l = w->order[i];
        const epx_layer_balance *b = &w->lb[l];
        if (!b->loaded) break;
        printf("  %5d %12.0f %8.4f %8.4f %8.4f %8.4f %8.4f %8.4f %9.4f\n", l, b->total,
               b->balancedness, b->bound, b->bound - b->balancedness,
               b->max_gpu_load / b->bound_max_load, w->ls[l].rank_imbalance,
               w->ls[l].slot_imbalance, w->ls[l].internode_share);
        shown++;
    }
    if (shown == 0) printf("  (no layer carries load)\n");
}

/* A JSON string literal, escaped (json_out.c). */
static void json_str(const char *v) { cli_json_str(stdout, v); }

/* `"key": x`: strict JSON has no inf or nan, so a figure that is not finite
 * (an imbalance over a window with no load) is written as null. */
static void json_num(const char *sep, const char *key, double x) {
    if (isfinite(x))
        printf("%s\"%s\": %.17g", sep, key, x);
    else
        printf("%s\"%s\": null", sep, key);
}

static void json_window(const window_figures *w, int32_t top, int32_t L) {
    json_num("{", "tokens", w->tokens);
    json_num(", ", "balancedness", w->bal.balancedness);
    json_num(", ", "balancedness_sglang", w->bal.balancedness_sglang);
    json_num(", ", "bound", w->bal.bound);
    json_num(", ", "gap", w->bal.gap);
    json_num(", ", "rank_imbalance", w->st.rank_imbalance);
    json_num(", ", "slot_imbalance", w->st.slot_imbalance);
    json_num(", ", "internode_share", w->st.internode_share);
    printf(", \"worst_layers\": [");
    int32_t shown = 0;
    for (int32_t i = 0; i < L && (top == 0 || shown < top); i++) {
        const int32_t l = w->order[i];
        const epx_layer_balance *b = &w->lb[l];
        if (!b->loaded) break;
        printf("%s{\"layer\": %d", shown ? ", " : "", l);
        json_num(", ", "load", b->total);
        json_num(", ", "balancedness", b->balancedness);
        json_num(", ", "bound", b->bound);
        json_num(", ", "gap", b->bound - b->balancedness);
        json_num(", ", "rank_imbalance", w->ls[l].rank_imbalance);
        json_num(", ", "slot_imbalance", w->ls[l].slot_imbalance);
        json_num(", ", "internode_share", w->ls[l].internode_share);
        printf("}");
        shown++;
    }
    printf("]}");
}

/* The layout to score: the placement file, or the trivial one with P = E. */
static int make_layout(const cli_cmd *cmd, const epx_counts *c, int32_t G, int32_t N,
                       epx_layout **lay, epx_error *err) {
    const char *placement = cli_get(cmd, "--placement");
    if (placement == NULL) {
        epx_shape s = {c->num_layers, c->num_experts, c->num_experts, G, N};
        if (epx_shape_check(&s, err) != EPX_OK) {
            if (c->num_experts % G == 0) return cli_report(cmd, err);
            fprintf(stderr,
                    "epx stats: the trivial layout has P = E = %d slots, which %d GPUs cannot "
                    "share evenly: pass --gpus with a divisor of %d, or a --placement\n",
                    c->num_experts, G, c->num_experts);
            return CLI_EXIT_USAGE;
        }
        if (epx_layout_create_trivial(&s, lay, err) != EPX_OK) return cli_report(cmd, err);
        return -1;
    }
    int32_t *map = NULL, L = 0, P = 0;
    if (epx_mapping_read(placement, &map, &L, &P, err) != EPX_OK) return cli_report(cmd, err);
    int rc = -1;
    char what[256];
    snprintf(what, sizeof what, "--placement %.200s", placement);
    if (L != c->num_layers) {
        fprintf(stderr,
                "epx stats: the placement has %d layers but the counts have %d: they are for "
                "different models\n",
                L, c->num_layers);
        rc = CLI_EXIT_USAGE;
    } else if (!cli_map_of_counts(cmd, what, map, L, P, c->num_experts)) {
        rc = CLI_EXIT_USAGE;
    } else {
        epx_shape s = {L, c->num_experts, P, G, N};
        if (epx_layout_create_from_map(&s, map, lay, err) != EPX_OK) rc = cli_report(cmd, err);
    }
    epx_free(map);
    return rc;
}

int cmd_stats(int argc, char **argv) {
    cli_opt opts[] = {
        {"--placement", "FILE", "physical_to_logical_map to score (default: trivial, P = E)", NULL},
        {"--gpus", "G", "GPUs (EP ranks); required with --placement, default 8", NULL},
        {"--nodes", "N", "nodes (default 1)", NULL},
        {"--traffic", "MODEL",
         "replica choice for the inter-node share: gpu-local (default; SGLang's static "
         "table), node-local, uniform",
         NULL},
        {"--top", "K", "worst layers shown per window (default 5; 0 = all)", NULL},
        {"--json", NULL, "print one JSON object instead of tables (non-finite figures: null)",
         NULL},
        CLI_READ_OPTS_HELP,
        {NULL, NULL, NULL, NULL},
    };
    cli_cmd cmd = {"stats",
                   "epx stats FILE [--placement FILE --gpus G [--nodes N]] [--traffic MODEL] "
                   "[--top K] [--json] [--window-passes N] [--stat-rows HOW]",
                   "Load metrics of a counts file (SGLang logical_count, .json or .pt) under a "
                   "placement: balancedness (epx's and SGLang's), the bound and the gap to it, "
                   "imbalance by rank and by slot ((max - mean) / mean), and the share of "
                   "token-expert assignments that cross nodes (tokens originate uniformly over "
                   "GPUs). Per window, then over all windows summed, worst layers first.",
                   opts,
                   1,
                   {0},
                   0};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc >= 0) return rc;
    if (cmd.num_positional != 1) {
        fprintf(stderr, "epx stats: give one counts file; run 'epx stats --help'\n");
        return CLI_EXIT_USAGE;
    }
    int32_t G = 8, N = 1, top = 5;
    if (cli_get(&cmd, "--placement") != NULL && !cli_require(&cmd, "--gpus")) return CLI_EXIT_USAGE;
    if (!cli_int(&cmd, "--gpus", 1, EPX_MAX_GPUS, &G) ||
        !cli_int(&cmd, "--nodes", 1, EPX_MAX_GPUS, &N) ||
        !cli_int(&cmd, "--top", 0, EPX_MAX_LAYERS, &top))
        return CLI_EXIT_USAGE;
    epx_traffic_model traffic = EPX_TRAFFIC_GPU_LOCAL;
    const char *t = cli_get(&cmd, "--traffic");
    if (t != NULL) {
        if (strcmp(t, "gpu-local") == 0)
            traffic = EPX_TRAFFIC_GPU_LOCAL;
        else if (strcmp(t, "node-local") == 0)
            traffic = EPX_TRAFFIC_NODE_LOCAL;
        else if (strcmp(t, "uniform") == 0)
            traffic = EPX_TRAFFIC_UNIFORM;
        else {
            fprintf(stderr, "epx stats: --traffic '%s' is not gpu-local, node-local or uniform\n",
                    t);
            return CLI_EXIT_USAGE;
        }
    }
    const bool json = cli_flag(&cmd, "--json");

    epx_error err = {0};
    epx_counts *c = NULL;
    char how[512] = "";
    epx_read_opts ro = EPX_READ_OPTS_INIT;
    ro.how = how;
    ro.how_cap = sizeof how;
    if (!cli_read_opts(&cmd, &ro)) return CLI_EXIT_USAGE;
    if (epx_counts_read_with(cmd.positional[0], &ro, &c, &err) != EPX_OK)
        return cli_report(&cmd, &err);
    epx_layout *lay = NULL;
    rc = make_layout(&cmd, c, G, N, &lay, &err);
    if (rc >= 0) {
        epx_counts_destroy(c);
        return rc;
    }
    const int32_t S = c->num_windows, L = c->num_layers, E = c->num_experts;
    const epx_shape *s = epx_layout_shape(lay);

    /* S windows plus their sum, each with its per-layer figures. */
    const size_t nw = (size_t)S + 1;
    window_figures *w = calloc(nw, sizeof *w);
    epx_layer_balance *lb = calloc(nw * (size_t)L, sizeof *lb);
    epx_layer_stats *ls = calloc(nw * (size_t)L, sizeof *ls);
    int32_t *order = calloc(nw * (size_t)L, sizeof *order);
    double *sum = calloc((size_t)L * (size_t)E, sizeof *sum);
    if (w == NULL || lb == NULL || ls == NULL || order == NULL || sum == NULL) {
        fprintf(stderr, "epx stats: out of memory\n");
        rc = CLI_EXIT_FAIL;
        goto done;
    }
    if (epx_counts_sum_windows(c, 0, S, sum, &err) != EPX_OK) {
        rc = cli_report(&cmd, &err);
        goto done;
    }
    for (size_t i = 0; i < nw; i++) {
        w[i].lb = lb + i * (size_t)L;
        w[i].ls = ls + i * (size_t)L;
        w[i].order = order + i * (size_t)L;
        const double *load = i < (size_t)S ? epx_counts_row(c, (int32_t)i, 0) : sum;
        if (compute(lay, load, traffic, &w[i], &err) != EPX_OK) {
            rc = cli_report(&cmd, &err);
            goto done;
        }
    }

    if (json) {
        const char *pl = cli_get(&cmd, "--placement");
        printf("{\"file\": ");
        json_str(cmd.positional[0]);
        printf(", \"input\": ");
        json_str(how);
        printf(", \"windows\": %d, \"layers\": %d, \"experts\": %d, \"physical\": %d, "
               "\"gpus\": %d, \"nodes\": %d, \"placement\": ",
               S, L, E, s->num_physical_experts, s->num_gpus, s->num_nodes);
        json_str(pl ? pl : "trivial");
        printf(", \"traffic\": \"%s\", \"per_window\": [", traffic_name(traffic));
        for (int32_t i = 0; i < S; i++) {
            if (i) printf(", ");
            json_window(&w[i], top, L);
        }
        printf("], \"all_windows\": ");
        json_window(&w[S], top, L);
        printf("}\n");
    } else {
        printf("%s: %d window(s) x %d layers x %d experts, %d layer(s) with load\n",
               cmd.positional[0], S, L, E, w[S].bal.num_loaded_layers);
        printf("input: %s\n", how);
        printf("placement: %s, P = %d slots on %d GPU(s), %d node(s); inter-node share "
               "assumes tokens start uniformly over GPUs, replica choice %s\n",
               cli_get(&cmd, "--placement") ? cli_get(&cmd, "--placement") : "trivial (P = E)",
               s->num_physical_experts, s->num_gpus, s->num_nodes, traffic_name(traffic));
        printf("balanced: mean/max GPU load over loaded layers; sglang: SGLang's, with 1e-5 "
               "terms, all layers;\nbound: best balancedness any placement of this shape can "
               "reach; gap = bound - balanced;\nimbalance: (max - mean) / mean over GPUs "
               "(rank) or slots\n\n");
        printf("%-7s %14s %8s %8s %8s %8s %8s %8s %9s\n", "window", "assignments", "balanced",
               "sglang", "bound", "gap", "rank-imb", "slot-imb", "internode");
        for (int32_t i = 0; i < S; i++) {
            char label[16];
            snprintf(label, sizeof label, "%d", i);
            print_row(label, &w[i]);
        }
        if (S > 1) print_row("all", &w[S]);
        for (int32_t i = 0; i < S; i++) {
            char label[32];
            snprintf(label, sizeof label, "window %d", i);
            print_worst(label, &w[i], top, L);
        }
        if (S > 1) print_worst("all windows summed", &w[S], top, L);
    }
    rc = CLI_EXIT_OK;
done:
    free(w);
    free(lb);
    free(ls);
    free(order);
    free(sum);
    epx_layout_destroy(lay);
    epx_counts_destroy(c);
    return rc;
}
