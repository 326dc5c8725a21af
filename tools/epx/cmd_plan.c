/*
 * cmd_plan.c - `epx plan`: plan a placement for a recorded load and write it
 * as the SGLang mapping file (`--init-expert-location` takes it as it is),
 * optionally with a JSON report: the algorithm that ran, balancedness on the
 * planning load (the windows' sum), the bound and the gap, the per-replica
 * dispatch weights, the seconds the placement computation took, and the
 * placement in both of SGLang's forms: physical_to_logical_map and
 * logical_to_physical_map in the order SGLang builds for it (replica-rank
 * order for a DeepSeek plan, as init_by_eplb; ascending otherwise, as
 * init_by_mapping reads the mapping file), so `epx dispatch-table
 * --placement REPORT --order replica-rank` gives init_by_eplb's table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void log_stderr(void *user, epx_log_level level, const char *msg) {
    (void)user;
    if (level <= EPX_LOG_WARN)
        fprintf(stderr, "epx plan: %s: %s\n", level == EPX_LOG_ERROR ? "error" : "warning", msg);
}

static bool parse_node_local(const char *v, epx_node_local *out) {
    if (v == NULL) return true;
    if (strcmp(v, "strict") == 0)
        *out = EPX_NODE_LOCAL_STRICT;
    else if (strcmp(v, "relaxed") == 0)
        *out = EPX_NODE_LOCAL_RELAXED;
    else if (strcmp(v, "off") == 0)
        *out = EPX_NODE_LOCAL_OFF;
    else {
        fprintf(stderr, "epx plan: --node-local '%s' is not one of strict, relaxed, off\n", v);
        return false;
    }
    return true;
}

typedef struct report_ctx {
    const char *counts_path;
    const epx_counts *counts;
    const epx_plan *plan;
    epx_algorithm requested;
    int32_t groups;
    const epx_balance *bal;      /* with the plan's replica weights */
    const epx_balance *bal_even; /* split evenly */
    const epx_layer_balance *layers;
    double cross_node_share; /* load served off its group's home node */
    const uint8_t *failed;   /* --failed-gpus / --active-ranks, or NULL */
    double live_bal;         /* balancedness on the live GPUs (with failed) */
    const char *input;       /* how the counts were read */
    const char *sglang;      /* --sglang-version, or NULL */
} report_ctx;

/* A JSON value or null. */
static void json_string_or_null(FILE *f, const char *s) {
    if (s == NULL)
        fputs("null", f);
    else
        cli_json_str(f, s);
}

/* physical_to_logical_map [L][P] and logical_to_physical_map [L][E][X]:
 * X is the largest replica count of any expert, as SGLang's
 * rebalance_experts returns it; -1 pads. */
static epx_status report_maps(FILE *f, const epx_plan *plan, epx_error *err) {
    const epx_layout *lay = epx_plan_layout(plan);
    const epx_shape *s = epx_layout_shape(lay);
    const int32_t L = s->num_layers, E = s->num_logical_experts, P = s->num_physical_experts;
    const int32_t *p2l = epx_layout_physical_to_logical(lay), *nv = epx_layout_num_valid(lay);
    int32_t W = 0, rank = 0, X = 1;
    const int32_t *l2p = epx_plan_logical_to_physical(plan, &W, &rank);
    if (l2p == NULL) {
        err->status = EPX_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg,
                 "plan --report: out of memory building the logical_to_physical_map");
        return EPX_ERR_NOMEM;
    }
    for (size_t i = 0; i < (size_t)L * (size_t)E; i++) X = nv[i] > X ? nv[i] : X;
    fputs("  \"physical_to_logical_map\": [\n", f);
    for (int32_t l = 0; l < L; l++) {
        fputs("    [", f);
        for (int32_t p = 0; p < P; p++)
            fprintf(f, "%s%d", p ? ", " : "", p2l[(size_t)l * (size_t)P + (size_t)p]);
        fputs(l + 1 < L ? "],\n" : "]\n", f);
    }
    fprintf(f, "  ],\n  \"logical_to_physical_order\": \"%s\",\n",
            rank ? "replica-rank" : "ascending");
    fputs("  \"logical_to_physical_map\": [\n", f);
    for (int32_t l = 0; l < L; l++) {
        fputs("    [", f);
        for (int32_t e = 0; e < E; e++) {
            const int32_t *row = l2p + ((size_t)l * (size_t)E + (size_t)e) * (size_t)W;
            fputs(e ? ", [" : "[", f);
            for (int32_t k = 0; k < X; k++) fprintf(f, "%s%d", k ? ", " : "", row[k]);
            fputc(']', f);
        }
        fputs(l + 1 < L ? "],\n" : "]\n", f);
    }
    fputs("  ],\n", f);
    return EPX_OK;
}

/* `  "key": x,` with x null when not finite (strict JSON). */
static void num_line(FILE *f, const char *key, const char *fmt, double x) {
    fprintf(f, "  \"%s\": ", key);
    cli_json_num(f, fmt, x);
    fputs(",\n", f);
}

static epx_status report_body(FILE *f, const void *ctx, epx_error *err) {
    const report_ctx *r = ctx;
    const epx_layout *lay = epx_plan_layout(r->plan);
    const epx_shape *s = epx_layout_shape(lay);
    fputs("{\n  \"algorithm\": ", f);
    cli_json_str(f, epx_algorithm_name(epx_plan_algorithm(r->plan)));
    fputs(",\n  \"algorithm_requested\": ", f);
    cli_json_str(f, epx_algorithm_name(r->requested));
    fputs(",\n  \"sglang_version\": ", f);
    json_string_or_null(f, r->sglang);
    fputs(",\n  \"counts\": ", f);
    cli_json_str(f, r->counts_path);
    fputs(",\n  \"input\": ", f);
    cli_json_str(f, r->input);
    fprintf(f,
            ",\n  \"num_windows\": %d,\n  \"num_layers\": %d,\n  \"num_logical_experts\": %d,"
            "\n  \"num_physical_experts\": %d,\n  \"num_gpus\": %d,\n  \"num_nodes\": %d,"
            "\n  \"num_groups\": %d,\n",
            r->counts->num_windows, s->num_layers, s->num_logical_experts, s->num_physical_experts,
            s->num_gpus, s->num_nodes, r->groups);
    num_line(f, "plan_seconds", "%.9g", epx_plan_seconds(r->plan));
    fputs("  \"planning_load\": \"the sum of the windows\",\n", f);
    num_line(f, "balancedness", "%.17g", r->bal->balancedness);
    num_line(f, "balancedness_even_split", "%.17g", r->bal_even->balancedness);
    num_line(f, "balancedness_sglang", "%.17g", r->bal->balancedness_sglang);
    num_line(f, "bound", "%.17g", r->bal->bound);
    num_line(f, "gap", "%.17g", r->bal->gap);
    num_line(f, "cross_node_share", "%.17g", r->cross_node_share);
    /* With lost GPUs: which GPUs serve, and the balancedness among them. */
    fputs("  \"live_gpus\": ", f);
    if (r->failed == NULL) {
        fputs("null,\n", f);
    } else {
        fputc('[', f);
        for (int32_t g = 0, n = 0; g < s->num_gpus; g++)
            if (!r->failed[g]) fprintf(f, "%s%d", n++ ? ", " : "", g);
        fputs("],\n", f);
    }
    fputs("  \"balancedness_live_gpus\": ", f);
    cli_json_num(f, "%.17g", r->failed ? r->live_bal : r->bal->balancedness);
    fputs(",\n", f);
    fprintf(f, "  \"num_loaded_layers\": %d,\n  \"worst_layer\": %d,\n", r->bal->num_loaded_layers,
            r->bal->worst_layer);
    fputs("  \"per_layer_balancedness\": [", f);
    for (int32_t l = 0; l < s->num_layers; l++) {
        if (l) fputs(", ", f);
        cli_json_num(f, "%.17g", r->layers[l].balancedness);
    }
    fputs("],\n  \"per_layer_bound\": [", f);
    for (int32_t l = 0; l < s->num_layers; l++) {
        if (l) fputs(", ", f);
        cli_json_num(f, "%.17g", r->layers[l].bound);
    }
    fputs("],\n", f);
    epx_status st = report_maps(f, r->plan, err);
    if (st != EPX_OK) return st;
    fputs("  \"replica_weights\": [\n", f);
    const double *w = epx_plan_replica_weights(r->plan);
    const int32_t P = s->num_physical_experts;
    for (int32_t l = 0; l < s->num_layers; l++) {
        fputs("    [", f);
        for (int32_t p = 0; p < P; p++) {
            if (p) fputs(", ", f);
            cli_json_num(f, "%.17g", w[(size_t)l * (size_t)P + (size_t)p]);
        }
        fputs(l + 1 < s->num_layers ? "],\n" : "]\n", f);
    }
    fputs("  ]\n}\n", f);
    return ferror(f) ? EPX_ERR_IO : EPX_OK;
}

/* Balancedness on the live GPUs alone (a lost GPU's zero load would pull
 * the mean down): the plan's GPU loads with the failed columns left out. */
static epx_status live_balance(const epx_layout *lay, const double *load, const double *w,
                               const uint8_t *failed, double *out, epx_error *err) {
    const epx_shape *s = epx_layout_shape(lay);
    const int32_t L = s->num_layers, G = s->num_gpus;
    double *gl = malloc((size_t)L * (size_t)G * sizeof *gl);
    if (gl == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return err->status = EPX_ERR_NOMEM;
    }
    epx_status st = epx_gpu_loads(lay, load, w, gl, err);
    int32_t A = 0;
    for (int32_t l = 0; st == EPX_OK && l < L; l++) {
        A = 0;
        for (int32_t g = 0; g < G; g++)
            if (!failed[g])
                gl[(size_t)l * (size_t)G + (size_t)A++] = gl[(size_t)l * (size_t)G + (size_t)g];
    }
    /* rows of A live loads, packed */
    for (int32_t l = 1; st == EPX_OK && l < L; l++)
        memmove(gl + (size_t)l * (size_t)A, gl + (size_t)l * (size_t)G, (size_t)A * sizeof *gl);
    if (st == EPX_OK) st = epx_gpu_loads_balance(gl, L, A, out, NULL, err);
    free(gl);
    return st;
}

int cmd_plan(int argc, char **argv) {
    cli_opt opts[] = {
        {"--counts", "FILE", "load: {\"logical_count\": [L][E] | [S][L][E]} (.json, .pt, inline)",
         NULL},
        {"--gpus", "G", "GPUs (EP ranks)", NULL},
        {"--nodes", "N", "nodes (default 1)", NULL},
        {"--groups", "K", "expert groups of the model (DeepSeek-V3: 8; default 0: none)", NULL},
        {"--redundant", "R", "redundant slots: P = E + R", NULL},
        {"--physical", "P", "physical slots per layer (default E)", NULL},
        {"--algorithm", "A",
         "epx (default), deepseek, deepseek-hierarchical or auto; SGLang's deepseek-vec, "
         "deepseek-vec-hierarchical (on the per-step series: the windows, a stat dump's rows), "
         "elasticity-aware or elasticity-aware-hierarchical (with --active-ranks)",
         NULL},
        {"--node-local", "MODE", "epx only: strict, relaxed (default with --nodes > 1) or off",
         NULL},
        {"--sglang-version", "V",
         "deepseek modes: plan as SGLang release V's copy of EPLB does, ties included "
         "(float64 pack sums from 0.5.11; default: DeepSeek's original, ties to the lowest "
         "index); deepseek-vec and elasticity-aware: as release V (default the newest; "
         "elasticity-aware from 0.5.23). Verified on 0.5.2 - " EPX_SGLANG_DEFAULT_VERSION
         "; a newer V warns and uses the newest rule",
         NULL},
        {"-o", "FILE", "output: the SGLang mapping {\"physical_to_logical_map\": [L][P]}", NULL},
        {"--report", "FILE",
         "also write a JSON report (balancedness, bound, weights, time, and the placement with "
         "logical_to_physical_map in the order SGLang builds)",
         NULL},
        {"--current", "FILE", "the placement in service: keep its slots where it costs no balance",
         NULL},
        {"--max-moves", "M", "with --current: at most M slots change, over all layers", NULL},
        {"--move-price", "X",
         "with --current: each moved slot must buy X of its layer's balancedness", NULL},
        {"--expert-bytes", "B", "with --current: bytes per expert, to report GB moved", NULL},
        {"--failed-gpus", "LIST",
         "GPUs lost (e.g. 3 or 1,5): plan on the survivors, the lost GPUs hold nothing (with "
         "--current: keep what the survivors hold where it costs no balance)",
         NULL},
        {"--active-ranks", "LIST",
         "the EP ranks still serving (e.g. 0,1,2,4; default all): every other GPU is lost, as "
         "--failed-gpus; elasticity-aware takes it as SGLang's active_ranks",
         NULL},
        CLI_READ_OPTS_HELP,
        {NULL, NULL, NULL, NULL},
    };
    cli_cmd cmd = {
        "plan",
        "epx plan --counts FILE --gpus G [--nodes N] [--groups K] "
        "[--redundant R | --physical P] [--algorithm A] [--node-local MODE] [--sglang-version V] "
        "-o PLACEMENT.json [--report REPORT.json] [--current FILE [--max-moves M] "
        "[--move-price X] [--expert-bytes B]] [--failed-gpus LIST] "
        "[--active-ranks LIST] [--window-passes N] [--stat-rows HOW]",
        "Plan a placement for a load and write it as an SGLang mapping file. DeepSeek "
        "modes plan for the sum of the windows, as SGLang does.",
        opts,
        0,
        {0},
        0};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc >= 0) return rc;
    const char *counts_path = cli_require(&cmd, "--counts");
    const char *out = counts_path ? cli_require(&cmd, "-o") : NULL;
    if (out == NULL || !cli_require(&cmd, "--gpus")) return CLI_EXIT_USAGE;
    const char *report = cli_get(&cmd, "--report");
    if (!cli_json_only(&cmd, "--report", report, "the report")) return CLI_EXIT_USAGE;
    {
        const char *in[] = {counts_path, cli_get(&cmd, "--current")};
        const cli_out outs[] = {{out, false}, {report, false}};
        if ((rc = cli_outputs_check(&cmd, in, 2, outs, 2)) >= 0) return rc;
    }
    int32_t G = 0, N = 1, K = 0, R = -1, P = -1;
    if (!cli_int(&cmd, "--gpus", 1, EPX_MAX_GPUS, &G) ||
        !cli_int(&cmd, "--nodes", 1, EPX_MAX_GPUS, &N) ||
        /* 0 is the default, none: what the groups message offers */
        !cli_int(&cmd, "--groups", 0, EPX_MAX_EXPERTS, &K) ||
        !cli_int(&cmd, "--redundant", 0, EPX_MAX_EXPERTS, &R) ||
        !cli_int(&cmd, "--physical", 1, 2 * EPX_MAX_EXPERTS, &P))
        return CLI_EXIT_USAGE;
    if (R >= 0 && P >= 0) {
        fprintf(stderr, "epx plan: give --redundant or --physical, not both (P = E + R)\n");
        return CLI_EXIT_USAGE;
    }
    epx_plan_opts o = EPX_PLAN_OPTS_INIT;
    o.num_groups = K;
    o.log = log_stderr;
    o.progress = cli_progress;
    o.progress_user = &cmd;
    epx_error err = {0};
    const char *algo = cli_get(&cmd, "--algorithm");
    if (algo != NULL && epx_algorithm_parse(algo, &o.algorithm, &err) != EPX_OK)
        return cli_report(&cmd, &err);
    /* The global policies plan as if there were one group: --groups would
     * change nothing there (SGLang's calls pass it and ignore it too). */
    if (K > 0 && (o.algorithm == EPX_ALGO_DEEPSEEK || o.algorithm == EPX_ALGO_DEEPSEEK_VEC ||
                  o.algorithm == EPX_ALGO_ELASTICITY_AWARE)) {
        fprintf(stderr,
                "epx plan: --groups %d changes nothing under --algorithm %s, a global policy "
                "(one group): drop --groups, or use the hierarchical form (%s-hierarchical), auto "
                "or epx, which place the groups by node\n",
                K, algo, algo);
        return CLI_EXIT_USAGE;
    }
    if (!parse_node_local(cli_get(&cmd, "--node-local"), &o.node_local)) return CLI_EXIT_USAGE;
    /* A newer release is warned about by the planner, through o.log; a
     * malformed one is refused here, before the counts are read. */
    o.sglang_version = cli_get(&cmd, "--sglang-version");
    epx_eplb_rule rule;
    if (o.sglang_version && epx_sglang_eplb_rule(o.sglang_version, &rule, NULL, &err) != EPX_OK)
        return cli_report(&cmd, &err);

    /* Every number before the counts are read. The move options price moves
     * away from the layout in service, so they need it. */
    uint8_t *failed = NULL; /* --failed-gpus: cmd_migrate.c */
    double price = 0.0;
    uint64_t ebytes = 0;
    const char *cur_path = cli_get(&cmd, "--current");
    if (!cli_int(&cmd, "--max-moves", 0, INT32_MAX, &o.max_moves) ||
        !cli_double(&cmd, "--move-price", 0.0, 1.0, &price) ||
        !cli_u64(&cmd, "--expert-bytes", 1, CLI_MAX_EXPERT_BYTES, &ebytes))
        return CLI_EXIT_USAGE;
    static const char *const with_current[] = {"--max-moves", "--move-price", "--expert-bytes"};
    for (int i = 0; i < 3 && cur_path == NULL; i++)
        if (cli_get(&cmd, with_current[i]) != NULL) {
            fprintf(stderr,
                    "epx plan: %s counts moves from the placement in service: give it with "
                    "--current FILE\n",
                    with_current[i]);
            return CLI_EXIT_USAGE;
        }
    epx_counts *counts = NULL;
    char how[512] = "";
    epx_read_opts ro = EPX_READ_OPTS_INIT;
    ro.how = how;
    ro.how_cap = sizeof how;
    if (!cli_read_opts(&cmd, &ro) || !cli_failed_gpus(&cmd, G, &failed)) return CLI_EXIT_USAGE;
    const bool elastic = o.algorithm == EPX_ALGO_ELASTICITY_AWARE ||
                         o.algorithm == EPX_ALGO_ELASTICITY_AWARE_HIERARCHICAL;
    /* SGLang's own algorithms plan as a release: the newest verified
     * unless --sglang-version names one (the report says which) */
    const bool sglang_only = elastic || o.algorithm == EPX_ALGO_DEEPSEEK_VEC ||
                             o.algorithm == EPX_ALGO_DEEPSEEK_VEC_HIERARCHICAL;
    if (sglang_only && o.sglang_version == NULL) o.sglang_version = epx_sglang_newest_verified();
    /* deepseek-vec plans on the series: a stat dump's ring rows unless
     * --stat-rows says otherwise */
    if ((o.algorithm == EPX_ALGO_DEEPSEEK_VEC ||
         o.algorithm == EPX_ALGO_DEEPSEEK_VEC_HIERARCHICAL) &&
        cli_get(&cmd, "--stat-rows") == NULL)
        ro.stat_rows = EPX_STAT_ROWS_WINDOWS_IF_STAT;
    if (epx_counts_read_with(counts_path, &ro, &counts, &err) != EPX_OK) {
        free(failed);
        return cli_report(&cmd, &err);
    }
    printf("input: %s\n", how);
    const int32_t E = counts->num_experts;
    if (P < 0) P = R >= 0 ? E + R : E;
    if (!cli_check_survivors(&cmd, failed, G, E, P)) {
        epx_counts_destroy(counts);
        free(failed);
        return CLI_EXIT_USAGE;
    }
    epx_shape shape = {counts->num_layers, E, P, G, N};
    {
        /* Limits before any work: slots per layer, then memory. */
        char what[64];
        snprintf(what, sizeof what, "%s %s", R >= 0 ? "--redundant" : "--physical",
                 cli_get(&cmd, R >= 0 ? "--redundant" : "--physical"));
        if ((cli_get(&cmd, "--redundant") || cli_get(&cmd, "--physical")) &&
            !cli_check_slots(&cmd, what, E, P, G)) {
            epx_counts_destroy(counts);
            free(failed);
            return CLI_EXIT_USAGE;
        }
        if (!cli_check_json_size(&cmd, out, (double)shape.num_layers * P, cli_json_width(E - 1),
                                 "use fewer redundant slots, or write a .pt file") ||
            !cli_check_memory(&cmd, &shape, 4, "use fewer GPUs or redundant slots")) {
            epx_counts_destroy(counts);
            free(failed);
            return CLI_EXIT_USAGE;
        }
    }
    epx_plan *plan = NULL;
    double *load = NULL;
    epx_layer_balance *layers = NULL;
    epx_layout *current = NULL; /* --current: cmd_migrate.c */
    rc = CLI_EXIT_OK;
    if (cur_path != NULL && (rc = cli_read_current("plan", cur_path, &shape, &current)) >= 0)
        goto done;
    rc = CLI_EXIT_OK;
    o.current = current;
    o.move_price = price;
    o.failed_gpus = failed;
    if (epx_plan_compute(counts, &shape, &o, &plan, &err) != EPX_OK) {
        rc = cli_report(&cmd, &err);
        goto done;
    }
    const epx_layout *lay = epx_plan_layout(plan);
    /* Quality on the planning load: the sum of the windows. */
    const size_t LE = (size_t)shape.num_layers * (size_t)E;
    load = malloc(LE * sizeof *load);
    layers = malloc((size_t)shape.num_layers * sizeof *layers);
    if (load == NULL || layers == NULL) {
        fprintf(stderr, "epx plan: out of memory\n");
        rc = CLI_EXIT_FAIL;
        goto done;
    }
    epx_balance bal, even;
    if (epx_counts_sum_windows(counts, 0, counts->num_windows, load, &err) != EPX_OK ||
        epx_balance_compute(lay, load, epx_plan_replica_weights(plan), &bal, layers, &err) !=
            EPX_OK ||
        epx_balance_compute(lay, load, NULL, &even, NULL, &err) != EPX_OK) {
        rc = cli_report(&cmd, &err);
        goto done;
    }
    printf("planned %d layers x %d slots (%d experts + %d redundant) on %d GPUs, %d node(s) "
           "with %s in %.3f ms\n",
           shape.num_layers, P, E, P - E, G, N, epx_algorithm_name(epx_plan_algorithm(plan)),
           1e3 * epx_plan_seconds(plan));
    printf("balancedness %.4f (bound %.4f, gap %.4f) on the sum of %d window(s)", bal.balancedness,
           bal.bound, bal.gap, counts->num_windows);
    if (bal.worst_layer >= 0)
        printf("; worst layer %d\n", bal.worst_layer);
    else
        printf("; no layer has load\n");
    double live_bal = -1.0;
    if (failed != NULL) {
        int32_t A = 0;
        for (int32_t g = 0; g < G; g++) A += !failed[g];
        if (live_balance(lay, load, epx_plan_replica_weights(plan), failed, &live_bal, &err) !=
            EPX_OK) {
            rc = cli_report(&cmd, &err);
            goto done;
        }
        printf("balancedness on the %d live GPUs %.4f (the figures above also count the %d lost "
               "GPU(s), which hold nothing)\n",
               A, live_bal, G - A);
    }
    /* The traffic price of the placement: load served off its group's home
     * node (0 when everything stays node-local). */
    double xshare = 0.0;
    if (epx_plan_cross_node_share(lay, epx_plan_replica_weights(plan), counts, K > 0 ? K : 1, NULL,
                                  &xshare, &err) != EPX_OK) {
        rc = cli_report(&cmd, &err);
        goto done;
    }
    if (N > 1)
        printf("cross-node share of the routed load: %.3f (served off its expert group's home "
               "node)\n",
               xshare);
    if (current != NULL) {
        if ((rc = cli_print_moves("plan", counts, current, lay, failed, (size_t)ebytes)) >= 0)
            goto done;
        rc = CLI_EXIT_OK;
    }
    /* Outputs last, once everything they hold is computed. */
    if ((cli_is_pt(out) ? epx_layout_write_pt(lay, out, &err)
                        : epx_layout_write_json(lay, out, &err)) != EPX_OK) {
        rc = cli_write_failed(&cmd, &err);
        goto done;
    }
    printf("wrote %s\n", out);
    if (report != NULL) {
        report_ctx r = {counts_path,     counts, plan,   o.algorithm, K,        &bal,
                        &even,           layers, xshare, failed,      live_bal, how,
                        o.sglang_version};
        if (epx_file_write(report, report_body, &r, &err) != EPX_OK) {
            rc = cli_write_failed(&cmd, &err);
            goto done;
        }
        printf("wrote %s\n", report);
    }
done:
    free(load);
    free(layers);
    epx_plan_destroy(plan);
    epx_counts_destroy(counts);
    epx_layout_destroy(current);
    free(failed);
    return rc;
}
