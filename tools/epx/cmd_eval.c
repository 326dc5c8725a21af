/*
 * cmd_eval.c - `epx eval`: how well a placement balances a recorded load.
 * For every window of the counts: balancedness (mean GPU load / max GPU
 * load, loads split evenly over replicas, mean over layers with load) and
 * the bound (the best balancedness any placement of the shape could reach);
 * their means; SGLang's variant; and the worst layers. --json prints one
 * object with keys balancedness, per_window, bound (and a few more).
 * With --routing, per-batch balancedness too (batches.c): batches of
 * --batch-tokens tokens drawn from the windows' loads, routed by that rule.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define WORST_SHOWN 5
#define MAX_BATCH_TOKENS 65536
#define MAX_TOP_K 1024
#define MAX_BATCHES 1024
#define MAX_BATCH_PAIRS 2147483648.0 /* 2^31 (token, expert) pairs: batch_work_check */

static const int32_t DEFAULT_TOKENS[] = {1, 32, 512, 4096};

/* --routing's per-batch figures. */
typedef struct batch_result {
    bool on;
    cli_routing routing;
    cli_batch_opts o;
    double *balancedness; /* [o.num_sizes] */
    int32_t *tokens;      /* --batch-tokens, when given (o.tokens points here) */
} batch_result;

typedef struct eval_result {
    int32_t S, L;
    double *per_window, *per_window_bound, *per_window_sglang; /* [S] */
    double *layer_mean;   /* [L] mean balancedness over the windows that load the layer */
    int32_t *layer_loads; /* [L] windows in which the layer carries load */
    double mean, bound, sglang, of_sum;
    int32_t worst[WORST_SHOWN], num_worst;
} eval_result;

static void result_free(eval_result *r) {
    free(r->per_window);
    free(r->per_window_bound);
    free(r->per_window_sglang);
    free(r->layer_mean);
    free(r->layer_loads);
}

static epx_status evaluate(const epx_layout *lay, const epx_counts *c, eval_result *r,
                           epx_error *err) {
    const int32_t S = c->num_windows, L = c->num_layers;
    r->S = S;
    r->L = L;
    r->per_window = calloc((size_t)S, sizeof(double));
    r->per_window_bound = calloc((size_t)S, sizeof(double));
    r->per_window_sglang = calloc((size_t)S, sizeof(double));
    r->layer_mean = calloc((size_t)L, sizeof(double));
    r->layer_loads = calloc((size_t)L, sizeof(int32_t));
    epx_layer_balance *lb = calloc((size_t)L, sizeof *lb);
    double *sum = calloc((size_t)L * (size_t)c->num_experts, sizeof(double));
    epx_status st = EPX_OK;
    if (!r->per_window || !r->per_window_bound || !r->per_window_sglang || !r->layer_mean ||
        !r->layer_loads || !lb || !sum) {
        err->status = st = EPX_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg, "out of memory");
        goto out;
    }
    for (int32_t s = 0; s < S && st == EPX_OK; s++) {
        epx_balance b;
        st = epx_balance_compute(lay, epx_counts_row(c, s, 0), NULL, &b, lb, err);
        if (st != EPX_OK) break;
        r->per_window[s] = b.balancedness;
        r->per_window_bound[s] = b.bound;
        r->per_window_sglang[s] = b.balancedness_sglang;
        r->mean += b.balancedness / S;
        r->bound += b.bound / S;
        r->sglang += b.balancedness_sglang / S;
        for (int32_t l = 0; l < L; l++)
            if (lb[l].loaded) {
                r->layer_mean[l] += lb[l].balancedness;
                r->layer_loads[l]++;
            }
    }
    if (st != EPX_OK) goto out;
    epx_balance all;
    if ((st = epx_counts_sum_windows(c, 0, S, sum, err)) != EPX_OK ||
        (st = epx_balance_compute(lay, sum, NULL, &all, NULL, err)) != EPX_OK)
        goto out;
    r->of_sum = all.balancedness;
    for (int32_t l = 0; l < L; l++)
        if (r->layer_loads[l]) r->layer_mean[l] /= r->layer_loads[l];
    /* The WORST_SHOWN loaded layers of lowest mean balancedness. */
    for (r->num_worst = 0; r->num_worst < WORST_SHOWN; r->num_worst++) {
        int32_t pick = -1;
        for (int32_t l = 0; l < L; l++) {
            if (!r->layer_loads[l]) continue;
            bool taken = false;
            for (int32_t k = 0; k < r->num_worst; k++) taken |= r->worst[k] == l;
            if (!taken && (pick < 0 || r->layer_mean[l] < r->layer_mean[pick])) pick = l;
        }
        if (pick < 0) break;
        r->worst[r->num_worst] = pick;
    }
out:
    free(lb);
    free(sum);
    return st;
}

static void print_array(const double *v, int32_t n) {
    putchar('[');
    for (int32_t i = 0; i < n; i++) {
        if (i) fputs(", ", stdout);
        cli_json_num(stdout, "%.17g", v[i]);
    }
    putchar(']');
}

static void print_json(const eval_result *r, const epx_shape *s, const batch_result *b) {
    /* Strict JSON: a figure that is not finite (loads near DBL_MAX) is null. */
    fputs("{\"balancedness\": ", stdout);
    cli_json_num(stdout, "%.17g", r->mean);
    fputs(", \"per_window\": ", stdout);
    print_array(r->per_window, r->S);
    fputs(", \"bound\": ", stdout);
    cli_json_num(stdout, "%.17g", r->bound);
    fputs(", \"per_window_bound\": ", stdout);
    print_array(r->per_window_bound, r->S);
    fputs(", \"gap\": ", stdout);
    cli_json_num(stdout, "%.17g", r->bound - r->mean > 0 ? r->bound - r->mean : 0.0);
    fputs(", \"balancedness_sglang\": ", stdout);
    cli_json_num(stdout, "%.17g", r->sglang);
    fputs(", \"balancedness_of_sum\": ", stdout);
    cli_json_num(stdout, "%.17g", r->of_sum);
    printf(", \"num_windows\": %d, \"num_layers\": %d, \"num_logical_experts\": %d, "
           "\"num_physical_experts\": %d, \"num_gpus\": %d, \"worst_layers\": [",
           r->S, s->num_layers, s->num_logical_experts, s->num_physical_experts, s->num_gpus);
    for (int32_t k = 0; k < r->num_worst; k++) {
        printf("%s{\"layer\": %d, \"balancedness\": ", k ? ", " : "", r->worst[k]);
        cli_json_num(stdout, "%.17g", r->layer_mean[r->worst[k]]);
        putchar('}');
    }
    putchar(']');
    if (b->on) {
        fputs(", \"per_batch\": {\"routing\": ", stdout);
        cli_json_str(stdout, cli_routing_names[b->routing]);
        printf(", \"top_k\": %d, \"batches_per_layer\": %d, \"seed\": %llu, \"tokens\": [",
               b->o.top_k, b->o.batches, (unsigned long long)b->o.seed);
        for (int32_t i = 0; i < b->o.num_sizes; i++) printf("%s%d", i ? ", " : "", b->o.tokens[i]);
        fputs("], \"balancedness\": ", stdout);
        print_array(b->balancedness, b->o.num_sizes);
        putchar('}');
    }
    printf("}\n");
}

static void print_text(const eval_result *r, const epx_shape *s, const batch_result *b) {
    printf("placement: %d layers x %d slots, %d logical experts, %d GPUs (%d slots each)\n",
           s->num_layers, s->num_physical_experts, s->num_logical_experts, s->num_gpus,
           s->num_physical_experts / s->num_gpus);
    printf("%-8s %-13s %-8s %s\n", "window", "balancedness", "bound", "sglang");
    for (int32_t w = 0; w < r->S; w++)
        printf("%-8d %-13.4f %-8.4f %.4f\n", w, r->per_window[w], r->per_window_bound[w],
               r->per_window_sglang[w]);
    printf("%-8s %-13.4f %-8.4f %.4f\n", "mean", r->mean, r->bound, r->sglang);
    printf("balancedness on the sum of the windows: %.4f\n", r->of_sum);
    printf("worst layers (mean over windows):");
    for (int32_t k = 0; k < r->num_worst; k++)
        printf(" %d (%.4f)", r->worst[k], r->layer_mean[r->worst[k]]);
    printf(r->num_worst ? "\n" : " none carries load\n");
    if (!b->on) return;
    printf("per batch, routing %s: batches of T tokens x top-%d drawn from the windows' loads "
           "(%d per layer and size), mean of mean/max GPU load:\n",
           cli_routing_names[b->routing], b->o.top_k, b->o.batches);
    for (int32_t i = 0; i < b->o.num_sizes; i++)
        printf("  T=%-7d %.4f\n", b->o.tokens[i], b->balancedness[i]);
}

/* Read --routing and its options into *b; -1 to go on, else the exit code.
 * Options of the per-batch figures without --routing are refused: they
 * would change nothing. */
static int batch_options(const cli_cmd *cmd, batch_result *b) {
    static const char *const needs[] = {"--top-k", "--batch-tokens", "--batches", "--seed",
                                        "--weights"};
    b->on = cli_get(cmd, "--routing") != NULL;
    for (size_t i = 0; !b->on && i < sizeof needs / sizeof needs[0]; i++)
        if (cli_get(cmd, needs[i])) {
            fprintf(stderr,
                    "epx eval: %s is for the per-batch figures: add --routing "
                    "static|dynamic|weighted|balanced|rank-invariant\n",
                    needs[i]);
            return CLI_EXIT_USAGE;
        }
    if (!b->on) return -1;
    int32_t seed = 0, n = 0;
    b->o = (cli_batch_opts){8, DEFAULT_TOKENS, 4, 4, 0, NULL, NULL};
    if (!cli_routing_get(cmd, "--routing", &b->routing) ||
        !cli_int(cmd, "--top-k", 1, MAX_TOP_K, &b->o.top_k) ||
        !cli_int(cmd, "--batches", 1, MAX_BATCHES, &b->o.batches) ||
        !cli_int(cmd, "--seed", 0, INT32_MAX, &seed) ||
        !cli_int_list(cmd, "--batch-tokens", 1, MAX_BATCH_TOKENS, "1,32,512,4096", &b->tokens,
                      &n) ||
        !cli_list_distinct(cmd, "--batch-tokens", b->tokens, n))
        return CLI_EXIT_USAGE;
    b->o.seed = (uint64_t)seed;
    if (b->tokens) b->o.tokens = b->tokens, b->o.num_sizes = n;
    if ((b->routing == CLI_ROUTE_WEIGHTED) != (cli_get(cmd, "--weights") != NULL)) {
        fprintf(stderr, b->routing == CLI_ROUTE_WEIGHTED
                            ? "epx eval: --routing weighted needs --weights FILE (the "
                              "\"replica_weights\" [L][P] of epx plan --report)\n"
                            : "epx eval: --weights is for --routing weighted only\n");
        return CLI_EXIT_USAGE;
    }
    b->balancedness = calloc((size_t)b->o.num_sizes, sizeof *b->balancedness);
    if (b->balancedness == NULL) {
        fprintf(stderr, "epx eval: out of memory\n");
        return CLI_EXIT_FAIL;
    }
    return -1;
}

/* The per-batch figures draw and route every (token, expert) pair of
 * L x --batches batches of each size, ~100 ns a pair on one core: at the
 * options' maxima on a 61-layer model that is 33 billion pairs, most of an
 * hour. Refused before any work above MAX_BATCH_PAIRS (a few minutes),
 * naming the count and what to lower. Returns -1 to go on, else the exit
 * code. */
static int batch_work_check(const batch_result *b, int32_t L) {
    double tokens = 0.0;
    for (int32_t i = 0; i < b->o.num_sizes; i++) tokens += b->o.tokens[i];
    const double pairs = (double)L * b->o.batches * tokens * b->o.top_k;
    if (pairs <= MAX_BATCH_PAIRS) return -1;
    fprintf(stderr,
            "epx eval: the per-batch figures would draw %.3g (token, expert) pairs (%d layers x "
            "--batches %d x %.0f tokens over --batch-tokens x --top-k %d), above the limit %.3g "
            "(a few minutes on one core): lower --batches or --batch-tokens\n",
            pairs, L, b->o.batches, tokens, b->o.top_k, (double)MAX_BATCH_PAIRS);
    return CLI_EXIT_USAGE;
}

int cmd_eval(int argc, char **argv) {
    cli_opt opts[] = {
        {"--placement", "FILE",
         "placement: {\"physical_to_logical_map\": [L][P]} (.json, .pt, inline)", NULL},
        {"--counts", "FILE", "load: {\"logical_count\": [L][E] | [S][L][E]}", NULL},
        {"--gpus", "G", "GPUs (EP ranks) the placement is for", NULL},
        {"--nodes", "N", "nodes (default 1)", NULL},
        {"--json", NULL, "print one JSON object (balancedness, per_window, bound, ...)", NULL},
        {"--routing", "static|dynamic|weighted|balanced|rank-invariant",
         "also per-batch balancedness of batches drawn from the windows, routed by this rule "
         "(static: SGLang's table; balanced: epx's exact per-batch split; rank-invariant: "
         "SGLang 0.5.23's row rule)",
         NULL},
        {"--top-k", "K", "with --routing: experts per token (default 8)", NULL},
        {"--batch-tokens", "LIST", "with --routing: tokens per batch (default 1,32,512,4096)",
         NULL},
        {"--batches", "N", "with --routing: batches per layer and size (default 4)", NULL},
        {"--seed", "S", "with --routing: seed of the draws and of dynamic/weighted (default 0)",
         NULL},
        {"--weights", "FILE",
         "with --routing weighted: \"replica_weights\" [L][P] (epx plan "
         "--report)",
         NULL},
        {NULL, NULL, NULL, NULL},
    };
    cli_cmd cmd = {"eval",
                   "epx eval --placement FILE --counts FILE --gpus G [--nodes N] [--json] "
                   "[--routing R [--top-k K] [--batch-tokens LIST] [--batches N] [--seed S] "
                   "[--weights FILE]]",
                   "Balancedness of a placement on every window of a load, its mean, the bound "
                   "any placement could reach, and the worst layers.",
                   opts,
                   0,
                   {0},
                   0};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc >= 0) return rc;
    const char *pl = cli_require(&cmd, "--placement");
    const char *cp = pl ? cli_require(&cmd, "--counts") : NULL;
    if (cp == NULL || !cli_require(&cmd, "--gpus")) return CLI_EXIT_USAGE;
    int32_t G = 0, N = 1;
    if (!cli_int(&cmd, "--gpus", 1, EPX_MAX_GPUS, &G) ||
        !cli_int(&cmd, "--nodes", 1, EPX_MAX_GPUS, &N))
        return CLI_EXIT_USAGE;
    batch_result br = {0};
    if ((rc = batch_options(&cmd, &br)) >= 0) goto early;
    double *weights = NULL;
    epx_error err = {0};
    int32_t *map = NULL, L = 0, P = 0;
    epx_counts *c = NULL;
    if (epx_mapping_read(pl, &map, &L, &P, &err) != EPX_OK) {
        rc = cli_report(&cmd, &err);
        goto early;
    }
    if (epx_counts_read(cp, &c, &err) != EPX_OK) {
        epx_free(map);
        rc = cli_report(&cmd, &err);
        goto early;
    }
    epx_layout *lay = NULL;
    eval_result r;
    memset(&r, 0, sizeof r);
    rc = CLI_EXIT_OK;
    if (c->num_layers != L) {
        fprintf(stderr,
                "epx eval: the counts have %d layers but the placement has %d: they are for "
                "different models (every decoder layer counts, dense ones included)\n",
                c->num_layers, L);
        rc = CLI_EXIT_USAGE;
        goto done;
    }
    int32_t max_id = -1;
    for (size_t i = 0; i < (size_t)L * (size_t)P; i++)
        if (map[i] > max_id) max_id = map[i];
    if (max_id >= c->num_experts) {
        fprintf(stderr,
                "epx eval: the placement holds logical expert %d but the counts have %d experts "
                "per layer: they are for different models\n",
                max_id, c->num_experts);
        rc = CLI_EXIT_USAGE;
        goto done;
    }
    if (br.on && br.o.top_k > c->num_experts) {
        /* a token picks K distinct experts: more than E cannot be drawn */
        fprintf(stderr,
                "epx eval: --top-k %d is more than the counts' %d experts per layer: give "
                "--top-k %d or fewer\n",
                br.o.top_k, c->num_experts, c->num_experts);
        rc = CLI_EXIT_USAGE;
        goto done;
    }
    if (br.on && (rc = batch_work_check(&br, L)) >= 0) goto done;
    epx_shape s = {L, c->num_experts, P, G, N};
    if (br.on && br.routing == CLI_ROUTE_STATIC &&
        !cli_check_table_work(&cmd, &s, 1, G, "route by another rule, or use fewer --gpus")) {
        rc = CLI_EXIT_USAGE;
        goto done;
    }
    if (br.routing == CLI_ROUTE_WEIGHTED &&
        (rc = cli_read_weights(&cmd, cli_get(&cmd, "--weights"), map, L, P, &weights)) >= 0)
        goto done;
    rc = CLI_EXIT_OK;
    if (epx_layout_create_from_map(&s, map, &lay, &err) != EPX_OK ||
        evaluate(lay, c, &r, &err) != EPX_OK) {
        rc = cli_report(&cmd, &err);
        goto done;
    }
    cli_batch_case bc = {lay, br.routing, weights, br.balancedness};
    br.o.progress = cli_progress;
    br.o.progress_user = &cmd;
    if (br.on && cli_per_batch(c->data, c->num_windows, &br.o, &bc, 1, &err) != EPX_OK) {
        rc = cli_report(&cmd, &err);
        goto done;
    }
    if (cli_flag(&cmd, "--json"))
        print_json(&r, &s, &br);
    else
        print_text(&r, &s, &br);
done:
    result_free(&r);
    epx_layout_destroy(lay);
    epx_counts_destroy(c);
    epx_free(map);
    free(weights);
early:
    free(br.tokens);
    free(br.balancedness);
    return rc;
}
