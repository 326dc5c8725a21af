/*
 * cmd_demo.c - `epx demo`, the main job: on an embedded default (a
 * synthetic Kimi-K2 trace, 8 GPUs, 32 redundant experts) it plans with
 * DeepSeek's EPLB and with epx's default algorithm, scores both and the
 * trivial layout in-sample and on the next window, prints a comparison,
 * and leaves placement.json (for SGLang's --init-expert-location),
 * placement_deepseek.json and trace.json (the baseline and its input),
 * report.json (every figure) and report.svg (the picture) in a folder.
 *
 * The last window is held out: plans see windows 0..S-2, and "next window"
 * scores them on window S-1, which is how a placement is used in serving.
 *
 * A window's figure is balance on average; a batch at decode is small and
 * lumpy. So beside it the demo draws batches from the held-out window's
 * load (T tokens, each choosing top-k distinct experts in proportion to
 * that layer's counts; T = 1, 32, 512, 4096; a few per layer) and routes
 * each on every layout two ways: static (SGLang's dispatch table, token t
 * sent from rank t mod G) and balanced (epx_dispatch_balanced_topk, the
 * exact per-batch min-max split). Per-batch balancedness = mean / max GPU
 * load of the batch in (token, expert) pairs, averaged over the batches.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

enum { LAY_TRIVIAL, LAY_DEEPSEEK, LAY_EPX, NUM_LAYOUTS };

/* Per-batch balancedness: batch sizes, and batches drawn per layer and size. */
static const int32_t BATCH_TOKENS[] = {1, 32, 512, 4096};
enum { NUM_BATCH_SIZES = sizeof BATCH_TOKENS / sizeof BATCH_TOKENS[0], BATCHES_PER_LAYER = 4 };

typedef struct demo_result {
    const char *name;
    const epx_layout *layout;
    const double *weights; /* replica weights, NULL = even split */
    double plan_seconds;
    epx_balance in_sample, next;
    epx_layer_balance *next_layers; /* [L] */
    double *next_gpu_load;          /* [L][G] */
    double batch_static[NUM_BATCH_SIZES], batch_balanced[NUM_BATCH_SIZES];
} demo_result;

/* ---- per-batch balancedness -------------------------------------------------- */

/* Fill every result's batch_static / batch_balanced (batches.c): the same
 * batches for every layout, drawn from `load` [L][E] with top-k `K`. */
static epx_status per_batch(cli_cmd *cmd, int32_t K, const double *load, uint64_t seed,
                            demo_result *res, epx_error *err) {
    cli_batch_case cases[2 * NUM_LAYOUTS];
    for (int i = 0; i < NUM_LAYOUTS; i++) {
        cases[2 * i] = (cli_batch_case){res[i].layout, CLI_ROUTE_STATIC, NULL, res[i].batch_static};
        cases[2 * i + 1] =
            (cli_batch_case){res[i].layout, CLI_ROUTE_BALANCED, NULL, res[i].batch_balanced};
    }
    const cli_batch_opts o = {
        K, BATCH_TOKENS, NUM_BATCH_SIZES, BATCHES_PER_LAYER, seed, cli_progress, cmd};
    return cli_per_batch(load, 1, &o, cases, 2 * NUM_LAYOUTS, err);
}

/* Copy windows [first, first + n) into a new counts tensor. */
static epx_status counts_slice(const epx_counts *c, int32_t first, int32_t n, epx_counts **out,
                               epx_error *err) {
    epx_status st = epx_counts_create(n, c->num_layers, c->num_experts, out, err);
    if (st != EPX_OK) return st;
    size_t le = (size_t)c->num_layers * (size_t)c->num_experts;
    memcpy((*out)->data, c->data + (size_t)first * le, (size_t)n * le * sizeof(double));
    return EPX_OK;
}

static epx_status score(demo_result *r, const double *in_load, const double *next_load, int32_t L,
                        int32_t G, epx_error *err) {
    epx_status st = epx_balance_compute(r->layout, in_load, r->weights, &r->in_sample, NULL, err);
    if (st != EPX_OK) return st;
    r->next_layers = calloc((size_t)L, sizeof *r->next_layers);
    r->next_gpu_load = calloc((size_t)L * (size_t)G, sizeof *r->next_gpu_load);
    if (r->next_layers == NULL || r->next_gpu_load == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return err->status = EPX_ERR_NOMEM;
    }
    st = epx_balance_compute(r->layout, next_load, r->weights, &r->next, r->next_layers, err);
    if (st != EPX_OK) return st;
    return epx_gpu_loads(r->layout, next_load, r->weights, r->next_gpu_load, err);
}

static void json_balance(FILE *f, const char *key, const epx_balance *b) {
    fprintf(f, "\"%s\": {\"balancedness\": ", key);
    cli_json_num(f, "%.6f", b->balancedness);
    fputs(", \"balancedness_sglang\": ", f);
    cli_json_num(f, "%.6f", b->balancedness_sglang);
    fputs(", \"bound\": ", f);
    cli_json_num(f, "%.6f", b->bound);
    fputs(", \"gap\": ", f);
    cli_json_num(f, "%.6f", b->gap);
    fprintf(f, ", \"worst_layer\": %d}", b->worst_layer);
}

typedef struct report_ctx {
    const epx_model *m;
    const epx_shape *s;
    const epx_trace_opts *to;
    const demo_result *r;
} report_ctx;

static epx_status report_body(FILE *f, const void *vctx, epx_error *err) {
    const report_ctx *c = vctx;
    const epx_model *m = c->m;
    const epx_shape *s = c->s;
    const epx_trace_opts *to = c->to;
    const demo_result *r = c->r;
    (void)err;
    fprintf(f, "{\n  \"model\": ");
    cli_json_str(f, m->name);
    fprintf(f,
            ",\n  \"shape\": {\"layers\": %d, \"logical_experts\": %d, "
            "\"physical_slots\": %d, \"gpus\": %d, \"nodes\": %d, \"groups\": %d},\n",
            s->num_layers, s->num_logical_experts, s->num_physical_experts, s->num_gpus,
            s->num_nodes, m->num_groups);
    fprintf(f,
            "  \"trace\": {\"windows\": %d, \"tokens_per_window\": %lld, \"seed\": %llu, "
            "\"planned_on_windows\": [0, %d], \"scored_next_window\": %d},\n",
            to->num_windows, (long long)to->tokens, (unsigned long long)to->seed,
            to->num_windows - 2, to->num_windows - 1);
    fprintf(f,
            "  \"per_batch\": {\"drawn_from_window\": %d, \"top_k\": %d, "
            "\"batches_per_layer\": %d, \"tokens\": [",
            to->num_windows - 1, m->top_k, BATCHES_PER_LAYER);
    for (int i = 0; i < NUM_BATCH_SIZES; i++) fprintf(f, "%s%d", i ? ", " : "", BATCH_TOKENS[i]);
    fputs("], \"routing\": {\"static\": \"SGLang's dispatch table, token t from rank t mod G\", "
          "\"balanced\": \"epx_dispatch_balanced_topk\"}},\n",
          f);
    fputs("  \"layouts\": [\n", f);
    for (int i = 0; i < NUM_LAYOUTS; i++) {
        fputs("    {\"name\": ", f);
        cli_json_str(f, r[i].name);
        fputs(", \"plan_seconds\": ", f);
        cli_json_num(f, "%.6f", r[i].plan_seconds);
        fputs(", ", f);
        json_balance(f, "in_sample", &r[i].in_sample);
        fputs(", ", f);
        json_balance(f, "next_window", &r[i].next);
        fputs(",\n     \"per_batch_static\": [", f);
        for (int t = 0; t < NUM_BATCH_SIZES; t++) {
            if (t) fputs(", ", f);
            cli_json_num(f, "%.6f", r[i].batch_static[t]);
        }
        fputs("], \"per_batch_balanced\": [", f);
        for (int t = 0; t < NUM_BATCH_SIZES; t++) {
            if (t) fputs(", ", f);
            cli_json_num(f, "%.6f", r[i].batch_balanced[t]);
        }
        fputs("],\n     \"next_window_per_layer\": [", f);
        for (int32_t l = 0; l < s->num_layers; l++) {
            if (l) fputs(", ", f);
            cli_json_num(f, "%.6f", r[i].next_layers[l].balancedness);
        }
        fprintf(f, "]}%s\n", i + 1 < NUM_LAYOUTS ? "," : "");
    }
    fputs("  ]\n}\n", f);
    return ferror(f) ? EPX_ERR_IO : EPX_OK;
}

/* ---- the output folder ----------------------------------------------------
 * The demo makes DIR/../.NAME.epx-tmp.PID before any work (so an --out that
 * cannot be made fails at once), writes its files there and renames that
 * folder to NAME when every file is there, so an interrupted or failed demo
 * never leaves a half-written folder. An existing NAME is replaced only when
 * it is a folder holding nothing but the demo's own files. */
static const char *const DEMO_FILES[] = {"placement.json", "placement_deepseek.json", "trace.json",
                                         "report.json", "report.svg"};
enum { NUM_DEMO_FILES = sizeof DEMO_FILES / sizeof DEMO_FILES[0] };

static void remove_demo_folder(const char *dir) {
    char p[4400];
    for (int i = 0; i < NUM_DEMO_FILES; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, DEMO_FILES[i]);
        (void)unlink(p);
    }
    (void)rmdir(dir);
}

/* -1 when `dir` may be (re)placed, else an exit code after saying why. */
static int check_out_dir(const char *dir) {
    struct stat st;
    if (lstat(dir, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "epx demo: --out '%s' exists and is not a folder: give a new name\n", dir);
        return CLI_EXIT_USAGE;
    }
    DIR *d = opendir(dir);
    if (d == NULL) {
        fprintf(stderr, "epx demo: cannot read folder '%s': %s\n", dir, strerror(errno));
        return CLI_EXIT_USAGE;
    }
    int rc = -1;
    for (struct dirent *e; rc < 0 && (e = readdir(d)) != NULL;) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        bool ours = false;
        for (int i = 0; i < NUM_DEMO_FILES; i++)
            ours = ours || strcmp(e->d_name, DEMO_FILES[i]) == 0;
        if (!ours) {
            fprintf(stderr,
                    "epx demo: --out '%s' holds '%s', which the demo did not write; give a new "
                    "folder name\n",
                    dir, e->d_name);
            rc = CLI_EXIT_USAGE;
        }
    }
    closedir(d);
    return rc;
}

/* -1 unless the --model file is one of the files in `dir` that the demo
 * replaces (then an exit code after saying so). */
static int check_model_outside(const char *model, const char *dir) {
    struct stat ms, st;
    if (stat(model, &ms) != 0) return -1; /* a model name, or missing: cli_model says */
    for (int i = 0; i < NUM_DEMO_FILES; i++) {
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", dir, DEMO_FILES[i]);
        if (stat(p, &st) == 0 && st.st_dev == ms.st_dev && st.st_ino == ms.st_ino) {
            fprintf(stderr,
                    "epx demo: --model '%s' is '%s', which the demo replaces with its own; "
                    "move the config out of '%s' or give another --out\n",
                    model, p, dir);
            return CLI_EXIT_USAGE;
        }
    }
    return -1;
}

/* Move the finished temp folder to `dir`, replacing an old demo folder. */
static int publish_dir(const char *tmp, const char *dir, const char *old) {
    struct stat st;
    bool had = lstat(dir, &st) == 0;
    if (had && rename(dir, old) != 0) {
        fprintf(stderr, "epx demo: cannot move the old '%s' aside: %s\n", dir, strerror(errno));
        return CLI_EXIT_FAIL;
    }
    if (rename(tmp, dir) != 0) {
        fprintf(stderr, "epx demo: cannot rename the finished folder to '%s': %s\n", dir,
                strerror(errno));
        if (had) (void)rename(old, dir);
        return CLI_EXIT_FAIL;
    }
    if (had) remove_demo_folder(old);
    return -1;
}

static int write_svg(const char *path, const epx_model *m, const epx_shape *s, const demo_result *r,
                     epx_error *err) {
    const int32_t L = s->num_layers;
    double *bal = calloc((size_t)NUM_LAYOUTS * (size_t)L, sizeof *bal);
    double *bound = calloc((size_t)L, sizeof *bound);
    if (bal == NULL || bound == NULL) {
        free(bal);
        free(bound);
        return -1;
    }
    epx_report_series series[NUM_LAYOUTS];
    for (int i = 0; i < NUM_LAYOUTS; i++) {
        for (int32_t l = 0; l < L; l++) {
            const epx_layer_balance *lb = &r[i].next_layers[l];
            bal[(size_t)i * (size_t)L + (size_t)l] = lb->loaded ? lb->balancedness : -1;
            if (i == 0) bound[l] = lb->loaded ? lb->bound : -1;
        }
        series[i] = (epx_report_series){r[i].name, r[i].next_gpu_load, bal + (size_t)i * (size_t)L,
                                        r[i].next.balancedness};
    }
    char title[256], sub[256];
    snprintf(title, sizeof title, "%s on %d GPUs: load per GPU on the next window", m->name,
             s->num_gpus);
    snprintf(sub, sizeof sub,
             "%d layers, %d experts, %d slots (%d redundant), %d node(s); plans made on earlier "
             "windows, scored on the held-out one",
             L, s->num_logical_experts, s->num_physical_experts,
             s->num_physical_experts - s->num_logical_experts, s->num_nodes);
    epx_status st =
        epx_report_write_svg(path, L, s->num_gpus, series, NUM_LAYOUTS, bound, title, sub, err);
    free(bal);
    free(bound);
    return st == EPX_OK ? 0 : -1;
}

int cmd_demo(int argc, char **argv) {
    cli_opt opts[] = {
        {"--model", "NAME|PATH",
         "built-in model or a config.json or its folder (default kimi-k2; see 'epx trace synth "
         "--help')",
         NULL},
        {"--gpus", "G", "GPUs (default 8)", NULL},
        {"--nodes", "N", "nodes (default 1)", NULL},
        {"--redundant", "R", "redundant expert slots (default 32, rounded so P % G == 0)", NULL},
        {"--windows", "S", "trace windows; the last is held out (default 8)", NULL},
        {"--tokens", "T", "tokens per window (default 65536)", NULL},
        {"--seed", "N", "trace seed (default 1)", NULL},
        {"--out", "DIR", "output folder (default epx-demo)", NULL},
        {NULL, NULL, NULL, NULL},
    };
    cli_cmd cmd = {
        "demo",
        "epx demo [--model NAME|PATH] [--gpus G] [--nodes N] [--redundant R] [--windows S] "
        "[--tokens T] [--seed N] [--out DIR]",
        "Plan a synthetic trace with DeepSeek's EPLB and with epx, compare them on the "
        "held-out next window, and write placement.json (epx's), placement_deepseek.json, "
        "trace.json, report.json and report.svg.",
        opts,
        0,
        {0},
        0};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc >= 0) return rc;
    const char *model_name = cli_get(&cmd, "--model") ? cli_get(&cmd, "--model") : "kimi-k2";
    const char *out_dir = cli_get(&cmd, "--out") ? cli_get(&cmd, "--out") : "epx-demo";
    int32_t G = 8, N = 1, R = 32, S = 8, seed = 1, tokens = 65536;
    if (!cli_int(&cmd, "--gpus", 1, EPX_MAX_GPUS, &G) ||
        !cli_int(&cmd, "--nodes", 1, EPX_MAX_GPUS, &N) ||
        !cli_int(&cmd, "--redundant", 0, EPX_MAX_EXPERTS, &R) ||
        !cli_int(&cmd, "--windows", 2, 4096, &S) ||
        !cli_int(&cmd, "--tokens", 1, 1 << 30, &tokens) ||
        !cli_int(&cmd, "--seed", 0, INT32_MAX, &seed))
        return CLI_EXIT_USAGE;

    /* The folder is checked, and its temp names registered for the
     * signals, before any work. */
    char out_buf[4096], tmp_dir[4200], old_dir[4200], parent[4096];
    if (out_dir[0] == '\0') {
        fprintf(stderr, "epx demo: --out is empty: give a folder name (default epx-demo)\n");
        return CLI_EXIT_USAGE;
    }
    if (strlen(out_dir) >= sizeof out_buf) {
        /* Cut short, the name would be another folder's. */
        fprintf(stderr,
                "epx demo: --out is %zu bytes long, above the limit of %zu: give a "
                "shorter path\n",
                strlen(out_dir), sizeof out_buf - 1);
        return CLI_EXIT_USAGE;
    }
    snprintf(out_buf, sizeof out_buf, "%s", out_dir);
    for (size_t n = strlen(out_buf); n > 1 && out_buf[n - 1] == '/'; n--) out_buf[n - 1] = '\0';
    out_dir = out_buf;
    {
        const char *slash = strrchr(out_dir, '/');
        int dlen = slash ? (int)(slash - out_dir) + 1 : 0;
        const char *base = slash ? slash + 1 : out_dir;
        snprintf(tmp_dir, sizeof tmp_dir, "%.*s.%s.epx-tmp.%ld", dlen, out_dir, base,
                 (long)getpid());
        snprintf(old_dir, sizeof old_dir, "%.*s.%s.epx-old.%ld", dlen, out_dir, base,
                 (long)getpid());
        snprintf(parent, sizeof parent, "%.*s", dlen ? dlen : 1, dlen ? out_dir : ".");
        if ((rc = check_out_dir(out_dir)) >= 0) return rc;
        if ((rc = check_model_outside(model_name, out_dir)) >= 0) return rc;
        cli_temp_register(tmp_dir, true);
        for (int i = 0; i < NUM_DEMO_FILES; i++) {
            char p[4400];
            snprintf(p, sizeof p, "%s/%s", tmp_dir, DEMO_FILES[i]);
            cli_temp_register(p, false);
            snprintf(p, sizeof p, "%s/.%s.epx-tmp.%ld", tmp_dir, DEMO_FILES[i], (long)getpid());
            cli_temp_register(p, false);
        }
    }

    epx_error err = {0};
    epx_model_info info;
    if ((rc = cli_model(&cmd, model_name, &info)) >= 0) return rc;
    const epx_model *m = &info.model;
    /* Round P up to a multiple of G, and say so, rather than refuse; but
     * only once the rounded shape is within the limits. E and R are at most
     * 2^20 each and G at most 2^16, so P + G fits an int32_t. */
    const int32_t P0 = m->num_experts + R;
    const int32_t P = P0 % G == 0 ? P0 : (P0 / G + 1) * G;
    epx_shape shape = {m->num_layers, m->num_experts, P, G, N};
    {
        char what[48];
        snprintf(what, sizeof what, "--redundant %d%s", R,
                 cli_get(&cmd, "--redundant") ? "" : " (the default)");
        if (!cli_check_slots(&cmd, what, m->num_experts, P, G) ||
            !cli_check_memory(&cmd, &shape, 6,
                              "use fewer --gpus or --redundant, or a smaller --model") ||
            !cli_check_bytes(&cmd, 8.0 * S * m->num_layers * m->num_experts * 2, "the trace",
                             "use fewer --windows, or a smaller --model") ||
            !cli_check_json_size(&cmd, "trace.json", (double)S * m->num_layers * m->num_experts,
                                 cli_json_width((double)tokens * m->top_k / m->num_experts),
                                 "use fewer --windows or --tokens, or a smaller --model") ||
            !cli_check_table_work(&cmd, &shape, NUM_LAYOUTS, G,
                                  "use fewer --gpus (the per-batch figures route by SGLang's "
                                  "static table as well as the balanced rule)"))
            return CLI_EXIT_USAGE;
    }
    if (P != P0)
        fprintf(stderr, "epx demo: %d + %d slots do not divide over %d GPUs; using %d redundant\n",
                m->num_experts, R, G, P - m->num_experts);
    if (epx_shape_check(&shape, &err) != EPX_OK) return cli_report(&cmd, &err);
    /* The temp folder is made before any work, so an --out that cannot be
     * made fails now, not after the planning (access() on the parent could
     * not tell: it says yes to root in /proc). An existing --out is not
     * touched until the finished folder replaces it. */
    if (mkdir(tmp_dir, 0777) != 0) {
        fprintf(stderr,
                "epx demo: cannot create --out '%s': no folder can be made in '%s' (%s); give "
                "another --out\n",
                out_dir, parent, strerror(errno));
        return CLI_EXIT_USAGE;
    }
    bool made_tmp = true;

    epx_trace_opts to = EPX_TRACE_OPTS_INIT;
    to.num_windows = S;
    to.tokens = tokens;
    to.seed = (uint64_t)seed;
    epx_counts *trace = NULL, *plan_on = NULL;
    epx_layout *trivial = NULL;
    epx_plan *plans[2] = {NULL, NULL};
    demo_result res[NUM_LAYOUTS];
    memset(res, 0, sizeof res);
    double *in_load = NULL;
    int exit_code = CLI_EXIT_FAIL;
    const int32_t L = shape.num_layers, E = shape.num_logical_experts;

    if (epx_trace_synth(m, &to, &trace, &err) != EPX_OK ||
        counts_slice(trace, 0, S - 1, &plan_on, &err) != EPX_OK ||
        epx_layout_create_trivial(&shape, &trivial, &err) != EPX_OK) {
        exit_code = cli_report(&cmd, &err);
        goto done;
    }
    in_load = calloc((size_t)L * (size_t)E, sizeof *in_load);
    if (in_load == NULL || epx_counts_sum_windows(plan_on, 0, S - 1, in_load, &err) != EPX_OK)
        goto done;
    const double *next_load = epx_counts_row(trace, S - 1, 0);

    const epx_algorithm algos[2] = {EPX_ALGO_AUTO, EPX_ALGO_EPX};
    for (int i = 0; i < 2; i++) {
        epx_plan_opts po = EPX_PLAN_OPTS_INIT;
        po.algorithm = algos[i];
        po.num_groups = m->num_groups;
        po.progress = cli_progress;
        po.progress_user = &cmd;
        if (epx_plan_compute(plan_on, &shape, &po, &plans[i], &err) != EPX_OK) {
            exit_code = cli_report(&cmd, &err);
            goto done;
        }
    }
    res[LAY_TRIVIAL] = (demo_result){.name = "trivial", .layout = trivial};
    res[LAY_DEEPSEEK] = (demo_result){.name = "DeepSeek EPLB",
                                      .layout = epx_plan_layout(plans[0]),
                                      .plan_seconds = epx_plan_seconds(plans[0])};
    res[LAY_EPX] = (demo_result){.name = "epx",
                                 .layout = epx_plan_layout(plans[1]),
                                 .weights = epx_plan_replica_weights(plans[1]),
                                 .plan_seconds = epx_plan_seconds(plans[1])};
    for (int i = 0; i < NUM_LAYOUTS; i++)
        if (score(&res[i], in_load, next_load, L, G, &err) != EPX_OK) {
            exit_code = cli_report(&cmd, &err);
            goto done;
        }
    if (per_batch(&cmd, m->top_k, next_load, (uint64_t)seed, res, &err) != EPX_OK) {
        exit_code = cli_report(&cmd, &err);
        goto done;
    }

    char path[4400];
    snprintf(path, sizeof path, "%s/placement.json", tmp_dir);
    if (epx_layout_write_json(res[LAY_EPX].layout, path, &err) != EPX_OK) {
        exit_code = cli_write_failed(&cmd, &err);
        goto done;
    }
    snprintf(path, sizeof path, "%s/placement_deepseek.json", tmp_dir);
    if (epx_layout_write_json(res[LAY_DEEPSEEK].layout, path, &err) != EPX_OK) {
        exit_code = cli_write_failed(&cmd, &err);
        goto done;
    }
    snprintf(path, sizeof path, "%s/trace.json", tmp_dir);
    if (epx_counts_write_json(trace, path, &err) != EPX_OK) {
        exit_code = cli_write_failed(&cmd, &err);
        goto done;
    }
    snprintf(path, sizeof path, "%s/report.json", tmp_dir);
    report_ctx rctx = {m, &shape, &to, res};
    if (epx_file_write(path, report_body, &rctx, &err) != EPX_OK) {
        exit_code = cli_write_failed(&cmd, &err);
        goto done;
    }
    snprintf(path, sizeof path, "%s/report.svg", tmp_dir);
    if (write_svg(path, m, &shape, res, &err) != 0) {
        exit_code = cli_write_failed(&cmd, &err);
        goto done;
    }
    if ((exit_code = publish_dir(tmp_dir, out_dir, old_dir)) >= 0) goto done;
    made_tmp = false;

    printf("epx demo: %s, %d layers x %d experts -> %d slots on %d GPU(s), %d node(s)\n", m->name,
           L, E, P, G, N);
    printf("synthetic trace: %d windows of %d tokens (seed %d); plans see windows 0-%d, window %d "
           "is held out\n\n",
           S, tokens, seed, S - 2, S - 1);
    printf("%-15s %12s %12s %12s %10s\n", "layout", "in-sample", "next window", "bound (next)",
           "plan ms");
    for (int i = 0; i < NUM_LAYOUTS; i++)
        printf("%-15s %12.4f %12.4f %12.4f %10.2f\n", res[i].name, res[i].in_sample.balancedness,
               res[i].next.balancedness, res[i].next.bound, res[i].plan_seconds * 1e3);
    printf("\nbalancedness = mean GPU load / max GPU load over MoE layers (1.0 is perfect).\n");
    printf("epx vs DeepSeek on the next window: %+.4f (max GPU load %.1f%% lower)\n",
           res[LAY_EPX].next.balancedness - res[LAY_DEEPSEEK].next.balancedness,
           100.0 * (1.0 - res[LAY_DEEPSEEK].next.balancedness / res[LAY_EPX].next.balancedness));
    printf("\nper batch, on the next window: batches of T tokens x top-%d drawn from its load "
           "(%d per layer),\nrouted by SGLang's static table or balanced (epx's exact per-batch "
           "min-max split):\n",
           m->top_k, BATCHES_PER_LAYER);
    printf("%-15s %-9s", "layout", "routing");
    for (int t = 0; t < NUM_BATCH_SIZES; t++) {
        char h[24];
        snprintf(h, sizeof h, "T=%d", BATCH_TOKENS[t]);
        printf(" %8s", h);
    }
    printf(" %12s\n", "next window");
    for (int i = 0; i < NUM_LAYOUTS; i++)
        for (int k = 0; k < 2; k++) {
            printf("%-15s %-9s", k ? "" : res[i].name, k ? "balanced" : "static");
            for (int t = 0; t < NUM_BATCH_SIZES; t++)
                printf(" %8.4f", k ? res[i].batch_balanced[t] : res[i].batch_static[t]);
            printf(" %12.4f\n", res[i].next.balancedness);
        }
    printf("\nwrote %s/placement.json (SGLang: --init-expert-location %s/placement.json "
           "--ep-num-redundant-experts %d)\n      %s/report.json, %s/report.svg, "
           "%s/placement_deepseek.json, %s/trace.json\n",
           out_dir, out_dir, P - E, out_dir, out_dir, out_dir, out_dir);
    exit_code = CLI_EXIT_OK;

done:
    if (made_tmp) remove_demo_folder(tmp_dir);
    for (int i = 0; i < NUM_LAYOUTS; i++) {
        free(res[i].next_layers);
        free(res[i].next_gpu_load);
    }
    free(in_load);
    epx_plan_destroy(plans[0]);
    epx_plan_destroy(plans[1]);
    epx_layout_destroy(trivial);
    epx_counts_destroy(plan_on);
    epx_counts_destroy(trace);
    return exit_code;
}
