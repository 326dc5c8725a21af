/*
 * cmd_trace.c - `epx trace synth`: write a synthetic expert-load trace for a
 * built-in model shape as SGLang logical_count JSON [S][L][E]. The file is a
 * pure function of the options: the same seed writes the same bytes.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* One number filling all of s[0, len); false on junk. */
static bool parse_number(const char *s, size_t len, double *out) {
    char buf[64];
    if (len == 0 || len >= sizeof buf) return false;
    memcpy(buf, s, len);
    buf[len] = '\0';
    char *end = NULL;
    errno = 0;
    *out = strtod(buf, &end);
    return errno == 0 && end == buf + len;
}

/* "A..B" or "A" (meaning A..A) into two numbers; false on junk. The split
 * comes first: strtod would read "2." out of "2..1". */
static bool parse_range(const char *s, double *lo, double *hi) {
    const char *dots = strstr(s, "..");
    if (dots == NULL) {
        if (!parse_number(s, strlen(s), lo)) return false;
        *hi = *lo;
        return true;
    }
    return parse_number(s, (size_t)(dots - s), lo) && parse_number(dots + 2, strlen(dots + 2), hi);
}

/* A whole number option in [lo, hi]; *out keeps its default when absent. */
static bool opt_u64(const cli_cmd *cmd, const char *name, uint64_t lo, uint64_t hi, uint64_t *out) {
    const char *v = cli_get(cmd, name);
    if (v == NULL) return true;
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || v[0] == '-' || x < lo || x > hi) {
        fprintf(stderr,
                "epx %s: %s '%s' is not a whole number from %llu to %llu: give one in that "
                "range\n",
                cmd->name, name, v, (unsigned long long)lo, (unsigned long long)hi);
        return false;
    }
    *out = x;
    return true;
}

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
        {"--shift-layers", "F", "share of the layers that shift (default 0.5)", NULL},
        {"--per-pass", "N",
         "write each window as N sparse forward-pass rows (S * N rows), as a recorder dump", NULL},
        {"-o", "FILE", "output JSON file (required)", NULL},
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
    if ((rc = cli_outputs_check(&cmd, NULL, 0, outs, 1)) >= 0) return rc;
    epx_error err = {0};
    epx_model_info info;
    if ((rc = cli_model(&cmd, name, &info)) >= 0) return rc;
    const epx_model *model = &info.model;

    epx_trace_opts to = EPX_TRACE_OPTS_INIT;
    uint64_t tokens = (uint64_t)to.tokens;
    if (!cli_int(&cmd, "--windows", 1, 1 << 24, &to.num_windows) ||
        !opt_u64(&cmd, "--tokens", 1, (uint64_t)1 << 40, &tokens) ||
        !opt_u64(&cmd, "--seed", 0, UINT64_MAX, &to.seed) ||
        !cli_double(&cmd, "--drift", 0, 5, &to.drift) ||
        !cli_int(&cmd, "--shift", 1, 1 << 24, &to.shift_window) ||
        !cli_double(&cmd, "--shift-layers", 0, 1, &to.shift_layers) ||
        !cli_int(&cmd, "--per-pass", 1, 1 << 16, &to.per_pass))
        return CLI_EXIT_USAGE;
    to.tokens = (int64_t)tokens;
    if (!cli_check_bytes(&cmd, 8.0 * to.num_windows * model->num_layers * model->num_experts,
                         "the trace ([S][L][E] doubles)", "use fewer --windows"))
        return CLI_EXIT_USAGE;
    const char *skew = cli_get(&cmd, "--skew");
    if (skew != NULL && !parse_range(skew, &to.skew_lo, &to.skew_hi)) {
        fprintf(stderr, "epx trace synth: --skew '%s' is not A..B (e.g. 0.8..1.3)\n", skew);
        return CLI_EXIT_USAGE;
    }
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
    FILE *f = argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) ? stdout
                                                                                          : stderr;
    fprintf(f, "usage: epx trace synth --model NAME|PATH [--windows S] [--tokens T] [--seed N] "
               "[--skew A..B] [--drift D] [--shift W] [--per-pass N] -o FILE\n"
               "Run 'epx trace synth --help' for the options.\n");
    return f == stdout ? CLI_EXIT_OK : CLI_EXIT_USAGE;
}
