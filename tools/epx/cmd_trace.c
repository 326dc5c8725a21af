/*
 * cmd_trace.c - `epx trace synth`: write a synthetic expert-load trace for a
 * built-in model shape as SGLang logical_count JSON [S][L][E]. The file is a
 * pure function of the options: the same seed writes the same bytes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void list_models(FILE *f) {
    int32_t n = 0;
    const epx_model *m = epx_model_list(&n);
    fprintf(f, "\nbuilt-in models (layers, dense, experts, top-k):\n");
    for (int32_t i = 0; i < n; i++)
        fprintf(f, "  %-18s %3d layers (%d dense), %3d experts, top-%d\n", m[i].name,
                m[i].num_layers, m[i].first_k_dense, m[i].num_experts, m[i].top_k);
}

static int trace_synth(int argc, char **argv) {
    cli_opt opts[] = {
        {"--model", "NAME|PATH",
         "model shape: a name from the list below, or a config.json or its folder", NULL},
        {"--windows", "S", "windows (default 8)", NULL},
        {"--tokens", "T", "tokens per window (default 65536)", NULL},
        {"--seed", "N", "random seed (default 0); same seed, same file", NULL},
        {"--skew", "A..B", "per-layer sigma of log popularity, uniform in A..B (default 0.8..1.3)",
         NULL},
        {"--drift", "D", "sd of the per-window lognormal drift (default 0.1)", NULL},
        {"--shift", "W", "hot experts move at window W (in --shift-layers of the layers)", NULL},
        {"--shift-layers", "F",
         "share of the layers that shift, above 0 up to 1 (default 0.5; each layer shifts with "
         "chance F)",
         NULL},
        {"--per-pass", "N",
         "write each window as N sparse forward-pass rows (S * N rows of logical_count, the shape "
         "of epx's recorder dump; not SGLang's per_pass .pt, so --window-passes does not apply)",
         NULL},
        {"-o", "FILE", "output file (required): JSON, or a PyTorch .pt by its extension", NULL},
        {NULL, NULL, NULL, NULL},
    };
    cli_cmd cmd = {"trace synth",
                   "epx trace synth --model NAME|PATH [--windows S] [--tokens T] [--seed N] "
                   "[--skew A..B] [--drift D] [--shift W [--shift-layers F]] [--per-pass N] "
                   "-o FILE",
                   "Synthesize an expert-load trace (SGLang logical_count JSON, [S][L][E]): "
                   "lognormal popularity per layer, drift between windows, multinomial "
                   "sampling noise, optionally a workload shift; dense layers are rows of "
                   "zeros.",
                   opts,
                   0,
                   {0},
                   0};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc >= 0) {
        if (rc == CLI_EXIT_OK) list_models(stdout);
        return rc;
    }
    const char *name = cli_require(&cmd, "--model");
    const char *path = cli_require(&cmd, "-o");
    if (name == NULL || path == NULL) return CLI_EXIT_USAGE;
    const cli_out outs[] = {{path, false}};
    if ((rc = cli_outputs_check(&cmd, &name, 1, outs, 1)) >= 0)
        return rc; /* --model may be a file */
    epx_error err = {0};
    epx_model_info info;
    if ((rc = cli_model(&cmd, name, &info)) >= 0) return rc;
    const epx_model *model = &info.model;

    epx_trace_opts to = EPX_TRACE_OPTS_INIT;
    uint64_t tokens = (uint64_t)to.tokens;
    if (!cli_int(&cmd, "--windows", 1, 1 << 24, &to.num_windows) ||
        !cli_u64(&cmd, "--tokens", 1, (uint64_t)1 << 40, &tokens) ||
        !cli_u64(&cmd, "--seed", 0, UINT64_MAX, &to.seed) ||
        !cli_range(&cmd, "--skew", 0, 5, &to.skew_lo, &to.skew_hi) ||
        !cli_double(&cmd, "--drift", 0, 5, &to.drift) ||
        !cli_int(&cmd, "--shift", 1, 1 << 24, &to.shift_window) ||
        !cli_double(&cmd, "--shift-layers", 0, 1, &to.shift_layers) ||
        !cli_int(&cmd, "--per-pass", 1, 1 << 16, &to.per_pass))
        return CLI_EXIT_USAGE;
    to.tokens = (int64_t)tokens;
    const int32_t S = to.num_windows, N = to.per_pass;
    /* A shift at or after the last window, or a share of shifting layers
     * with no shift, would be accepted and do nothing. */
    if (to.shift_window >= S) {
        if (S < 2)
            fprintf(stderr, "epx trace synth: --shift %d needs at least 2 windows (--windows %d)\n",
                    to.shift_window, S);
        else
            fprintf(stderr,
                    "epx trace synth: --shift %d is not below --windows %d: the shift would come "
                    "after the last window; use --shift 1 to %d, or more --windows\n",
                    to.shift_window, S, S - 1);
        return CLI_EXIT_USAGE;
    }
    if (cli_get(&cmd, "--shift-layers") != NULL && cli_get(&cmd, "--shift") == NULL) {
        fprintf(stderr, "epx trace synth: --shift-layers applies to a shift: give --shift W too\n");
        return CLI_EXIT_USAGE;
    }
    /* No layer shifts at share 0: --shift would be accepted and do nothing. */
    if (cli_get(&cmd, "--shift") != NULL && to.shift_layers == 0.0) {
        fprintf(stderr,
                "epx trace synth: --shift-layers 0 shifts no layer, so --shift %d would change "
                "nothing: give a share above 0 (up to 1; default 0.5), or drop --shift\n",
                to.shift_window);
        return CLI_EXIT_USAGE;
    }
    if ((int64_t)S * N > (1 << 24)) {
        fprintf(stderr,
                "epx trace synth: --windows %d x --per-pass %d is %lld rows, above the limit %d: "
                "use fewer --windows or --per-pass\n",
                S, N, (long long)S * N, 1 << 24);
        return CLI_EXIT_USAGE;
    }
    /* The file and memory ([S * N][L][E] doubles; a .pt output holds a
     * second copy as it is written), both before any work. A row's typical
     * figure is T * top_k / E tokens over N passes. */
    const double rows = (double)S * N, cells = rows * model->num_layers * model->num_experts;
    const char *fix = N > 1 ? "use fewer --windows or --per-pass" : "use fewer --windows";
    const char *jfix = N > 1 ? "use fewer --windows or --per-pass, or write a .pt file"
                             : "use fewer --windows, or write a .pt file";
    const double loaded = (double)(model->num_layers - model->first_k_dense) / model->num_layers;
    const double mean = (double)to.tokens * model->top_k / model->num_experts / N;
    if (!cli_check_json_size(&cmd, path, cells,
                             loaded * cli_json_width(mean) + (1 - loaded) * cli_json_width(0),
                             jfix) ||
        !cli_check_bytes(&cmd, (cli_is_pt(path) ? 16.0 : 8.0) * cells,
                         "the trace ([S x per-pass][L][E] doubles)", fix))
        return CLI_EXIT_USAGE;
    epx_counts *c = NULL;
    if (epx_trace_synth(model, &to, &c, &err) != EPX_OK) return cli_report(&cmd, &err);
    epx_status st = cli_is_pt(path) ? epx_counts_write_pt(c, path, EPX_PT_DTYPE_AUTO, &err)
                                    : epx_counts_write_json(c, path, &err);
    epx_counts_destroy(c);
    if (st != EPX_OK) return cli_write_failed(&cmd, &err);
    return CLI_EXIT_OK;
}

int cmd_trace(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "synth") == 0) return trace_synth(argc - 1, argv + 1);
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: epx trace synth --model NAME|PATH [--windows S] [--tokens T] [--seed N] "
               "[--skew A..B] [--drift D] [--shift W [--shift-layers F]] [--per-pass N] -o FILE\n"
               "Run 'epx trace synth --help' for the options.\n");
        return CLI_EXIT_OK;
    }
    /* An error, worded as the other commands with one action word theirs */
    fprintf(stderr,
            "epx trace: the only action is 'synth' (epx trace synth --model NAME|PATH ... -o "
            "FILE); run 'epx trace synth --help' for the options\n");
    return CLI_EXIT_USAGE;
}
