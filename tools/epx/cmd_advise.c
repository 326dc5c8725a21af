/*
 * cmd_advise.c - `epx advise`: EP or TP for a model on G GPUs over a given
 * link? A latency/bandwidth (alpha-beta) model of the communication of one
 * MoE layer under both schemes, at the model's shape, and the batch size
 * where EP starts to win (or the statement that it never does).
 *
 * The model (per layer, global batch B tokens, G GPUs, B/G tokens each):
 *   EP dispatch  t = 2 a_a2a + s_host + f * Bd / b_a2a
 *   EP combine   t =   a_a2a          + f * Bc / b_a2a
 *   TP           t =   a_ar           +     Bt / b_ar
 * with Bd = (B/G) d rec (records: x row + K (slot, weight)), d the expected
 * number of other GPUs a token reaches when its K distinct experts are
 * uniform over E experts spread evenly (d = (G-1)(1 - C(E-E/G, K)/C(E, K));
 * with G > E, one replica per GPU and one of each expert's used: K (G-1)/G),
 * Bc = (B/G) d H esz (combine per rank; K (G-1)/G per token in top-k
 * order), Bt = 2 (G-1)/G B H esz (a ring all-reduce), f the busiest GPU's
 * share of the mean (--imbalance). Both sides are linear in B, so the
 * crossover is one division. `--measured FILE` (from `epx bench comm
 * -o FILE` or `--json FILE`) replaces the assumed a and b by a least-squares
 * fit of measured time against measured bytes, operation by operation, each
 * on the newest run of JSON lines that has it (bench_runs.c).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_runs.h"
#include "cli.h"
#include "epx_comm.h"

typedef struct link_row {
    const char *name, *what;
    double a2a_us, a2a_gbps, ar_us, ar_gbps;
} link_row;

/* Assumed figures per GPU: achievable NCCL-like rates, not peak (stated in
 * the output; --measured replaces them). Bandwidths are bus bandwidths in
 * nccl-tests' sense: bytes a GPU puts on its link per second. */
static const link_row LINKS[] = {
    {"nvlink3", "A100 NVLink 3 (600 GB/s bidirectional per GPU)", 15, 200, 12, 230},
    {"nvlink4", "H100/H200 NVLink 4 (900 GB/s bidirectional per GPU)", 15, 300, 12, 360},
    {"nvlink5", "B200 NVLink 5 (1800 GB/s bidirectional per GPU)", 15, 600, 12, 700},
    {"pcie4", "PCIe Gen4 x16 per GPU, no NVLink (32 GB/s per direction peak)", 30, 18, 25, 20},
    {"pcie5", "PCIe Gen5 x16 per GPU, no NVLink (64 GB/s per direction peak)", 30, 36, 25, 40},
    {"ib-ndr", "across nodes, one 400 Gb/s InfiniBand NIC per GPU", 35, 40, 30, 45},
};
#define NLINKS (sizeof LINKS / sizeof LINKS[0])
#define HOST_SYNC_US 10.0 /* counts to the host and the sizes back, per dispatch */

typedef struct fit {
    double a_us, us_per_byte; /* t = a + bytes * us_per_byte */
    int measured;             /* 0 assumed, 1 latency measured, 2 both */
} fit;

/* Least squares t = a + c * bytes over the rows that have this op. Returns
 * 0, -1 when no row has it, -2 when every time is 0 (note says so). */
static int fit_op(json_t *rows, const char *op, fit *f, char *note, size_t note_n) {
    char kt[64], kb[64];
    snprintf(kt, sizeof kt, "%s_us", op);
    snprintf(kb, sizeof kb, "%s_bytes", op);
    double sx = 0, sy = 0, sxx = 0, sxy = 0, ymin = 1e300;
    int n = 0, npos = 0;
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) {
        json_t *jt = json_object_get(r, kt), *jb = json_object_get(r, kb);
        if (!json_is_number(jt) || !json_is_number(jb)) continue;
        double x = json_number_value(jb), y = json_number_value(jt);
        sx += x, sy += y, sxx += x * x, sxy += x * y, n++;
        npos += x > 0;
        if (y < ymin) ymin = y;
    }
    if (n == 0) return -1;
    if (sy == 0) { /* times are >= 0 (check_rows) */
        snprintf(note, note_n, "every %s of its %d row(s) is 0", kt, n);
        return -2;
    }
    double den = n * sxx - sx * sx;
    /* why no bandwidth is fitted, when none is */
    const char *why = npos == 0   ? "no point sends bytes to other ranks (one rank)"
                      : npos == 1 ? "one point sends bytes to other ranks"
                      : den <= 0  ? "every point moves the same bytes"
                                  : "time does not grow with bytes across the points";
    if (npos >= 2 && den > 0) {
        double c = (n * sxy - sx * sy) / den, a = (sy - c * sx) / n;
        if (c > 0) {
            f->a_us = a > 0 ? a : 0;
            f->us_per_byte = c;
            f->measured = 2;
            snprintf(note, note_n, "%s: fitted %.1f us + %.1f GB/s from %d points", op, f->a_us,
                     1e-3 / c, n);
            return 0;
        }
    }
    f->a_us = ymin;
    f->measured = 1;
    snprintf(note, note_n,
             "%s: %.1f us latency measured (%d points, no bandwidth to fit: %s), bandwidth "
             "assumed %.0f GB/s",
             op, ymin, n, why, 1e-3 / f->us_per_byte);
    return 0;
}

/* Most tokens per GPU the low-latency mode serves: its buffers grow with
 * ranks x tokens x top-k rows. */
#define LL_MAX_PER_GPU 256

/* EP's time per layer at B tokens per step: the cheaper mode that serves
 * B (low latency up to ll_max tokens). */
typedef struct ep_lines {
    double a, b, al, bl, ll_max;
} ep_lines;
static double ep_time(const ep_lines *e, double B, const char **mode) {
    double tn = e->a + e->b * B, tl = e->al + e->bl * B;
    bool ll = B <= e->ll_max && tl < tn;
    if (mode) *mode = ll ? "low-latency" : "normal";
    return ll ? tl : tn;
}

/* The GPU low-latency engine's transport a JSON line was measured over:
 * "host", "nccl", or "peer" (device memory: "pointers", "ipc", and lines
 * written before the engine had transports). */
static const char *line_transport(json_t *r) {
    const char *t = json_string_value(json_object_get(r, "transport"));
    if (t != NULL && strcmp(t, "host") == 0) return "host";
    return t != NULL && strcmp(t, "nccl") == 0 ? "nccl" : "peer";
}

/* The lines `keep` accepts (with ctx); takes `lines`, *left counts the rest. */
static json_t *keep_lines(json_t *lines, bool (*keep)(json_t *r, const void *ctx), const void *ctx,
                          size_t *left) {
    json_t *kept = json_array();
    size_t i;
    json_t *r;
    *left = 0;
    json_array_foreach(lines, i, r) {
        if (keep(r, ctx))
            json_array_append(kept, r);
        else
            (*left)++;
    }
    json_decref(lines);
    return kept;
}

/* A normal-mode line of the older NCCL path: it names no transport. */
static bool older_normal(json_t *r) {
    const char *m = json_string_value(json_object_get(r, "mode"));
    return m != NULL && strcmp(m, "normal") == 0 && json_object_get(r, "transport") == NULL;
}
static bool not_older_normal(json_t *r, const void *ctx) {
    (void)ctx;
    return !older_normal(r);
}

/* Normal mode's lines of one engine: the GPU engine's (they name their
 * transport; no host sync, rows read where they landed) where the file has
 * any, else the older NCCL path's (epx bench comm --engine nccl). Takes
 * `lines`; *older counts the older path's lines left out, *gpu says which. */
static json_t *one_normal_engine(json_t *lines, size_t *older, bool *gpu_out) {
    bool gpu = false;
    size_t i;
    json_t *r;
    json_array_foreach(lines, i, r) {
        const char *m = json_string_value(json_object_get(r, "mode"));
        gpu |= m != NULL && strcmp(m, "normal") == 0 && !older_normal(r);
    }
    *gpu_out = gpu;
    *older = 0;
    return gpu ? keep_lines(lines, not_older_normal, NULL, older) : lines;
}

/* A line of rank count *ctx, or one that names none. */
static bool of_ranks(json_t *r, const void *ctx) {
    json_t *rk = json_object_get(r, "ranks");
    return rk == NULL || json_integer_value(rk) == *(const json_int_t *)ctx;
}

/* The lines of one rank count, as one fit needs: --gpus's where the file
 * has them, else the newest line's that names one (a file may gather runs
 * on several machines, or processes sharing a GPU; cli_bench_date orders
 * them, the first of equals winning); lines without a count go with any.
 * Takes `lines`; *others counts the lines left out. */
static json_t *one_rank_count(json_t *lines, int G, size_t *others) {
    json_int_t want = 0, newest = 0;
    double newest_date = CLI_UNDATED;
    size_t i;
    json_t *r;
    json_array_foreach(lines, i, r) {
        json_int_t n = json_integer_value(json_object_get(r, "ranks"));
        const double d = cli_bench_date(r);
        if (n == G) want = n;
        if (n > 0 && (newest == 0 || d > newest_date)) {
            newest = n;
            newest_date = d;
        }
    }
    if (want == 0) want = newest;
    return keep_lines(lines, of_ranks, &want, others);
}

/* Whether a line was timed with the engine's token bound at the batch's own
 * size, the default (`epx bench comm --token-bound max` pads every batch to
 * the largest: another setting, not fitted with it). Lines without one
 * predate the bound. */
static bool own_bound(json_t *r) {
    json_t *b = json_object_get(r, "token_bound"), *t = json_object_get(r, "tokens");
    return b == NULL || !json_is_integer(b) || !json_is_integer(t) ||
           json_integer_value(b) == json_integer_value(t);
}

/* Whether JSON line r is one of `epx bench comm --json`'s of this mode and
 * phase (graph replays only where `graph`, else stream launches only;
 * low-latency lines of `transport` only, when not NULL; fp8 dispatch lines
 * only for an fp8 question; the default token bound). */
static bool line_of(json_t *r, const char *mode, const char *phase, bool graph,
                    const char *transport, bool fp8) {
    const char *m = json_string_value(json_object_get(r, "mode"));
    const char *ph = json_string_value(json_object_get(r, "phase"));
    const char *dt = json_string_value(json_object_get(r, "dtype"));
    return m && ph && strcmp(m, mode) == 0 && strcmp(ph, phase) == 0 &&
           json_is_number(json_object_get(r, "median_us")) &&
           (dt != NULL && strcmp(dt, "fp8-e4m3") == 0) == fp8 &&
           json_is_true(json_object_get(r, "graph")) == graph &&
           (transport == NULL || strcmp(line_transport(r), transport) == 0) && own_bound(r);
}

/* Least squares t = a + c * bytes over the lines line_of accepts, of the
 * newest run that has any (bench_runs.h: a file gathers runs, and older
 * builds' figures are not this one's); bytes = GB/s x time. local: the
 * lines' bytes crossed no link (one rank: its "peer" is its own memory), so
 * their rate is the GPU's memory's, not the link's: a is fitted and f's
 * bandwidth, the link's, kept. Returns the points used, or -1 when every
 * time is 0 (note says so). */
static int fit_lines(json_t *lines, const int *run_of, const double *when, const char *mode,
                     const char *phase, bool graph, const char *transport, bool fp8, bool local,
                     fit *f, char *note, size_t note_n) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0, ymin = 1e300, newest = -INFINITY;
    int n = 0, npos = 0, run = -2, older = 0;
    size_t i;
    json_t *r;
    json_array_foreach(lines, i, r) {
        if (line_of(r, mode, phase, graph, transport, fp8) && when[i] > newest) {
            newest = when[i];
            run = run_of[i];
        }
    }
    json_array_foreach(lines, i, r) {
        if (!line_of(r, mode, phase, graph, transport, fp8)) continue;
        if (run_of[i] != run) {
            older++;
            continue;
        }
        json_t *jg = json_object_get(r, "gbps");
        double y = json_number_value(json_object_get(r, "median_us")),
               x = json_is_number(jg) ? json_number_value(jg) * y * 1e3 : 0;
        sx += x, sy += y, sxx += x * x, sxy += x * y, n++;
        npos += x > 0;
        if (y < ymin) ymin = y;
    }
    if (n == 0) return 0;
    if (sy == 0) { /* times are >= 0 (check_lines) */
        snprintf(note, note_n, "every median_us of its %d %s %s%s line(s) is 0", n, mode, phase,
                 graph ? " (graph)" : "");
        return -1;
    }
    double den = n * sxx - sx * sx, c = npos >= 2 && den > 0 ? (n * sxy - sx * sy) / den : -1;
    if (c > 0) {
        double a = (sy - c * sx) / n;
        f->a_us = a > 0 ? a : 0;
        if (!local) f->us_per_byte = c;
        f->measured = local ? 1 : 2;
    } else {
        f->a_us = ymin;
        f->measured = 1;
    }
    char from[96] = "";
    if (older > 0)
        snprintf(from, sizeof from, " of the newest run; %d older line(s) left out", older);
    snprintf(note, note_n, "%s %s%s: %.1f us + %.1f GB/s (%s, %d points%s)", mode, phase,
             graph ? " (graph)" : "", f->a_us, 1e-3 / f->us_per_byte,
             f->measured == 2 ? "both fitted"
             : local          ? "latency measured, bandwidth the link's: no byte crossed a link"
                              : "latency measured, bandwidth assumed",
             n, from);
    return n;
}

/* Most a measured figure may say: a time of 1000 s per layer, 100 TB/s, a
 * petabyte per rank. Anything beyond is a broken file, not a measurement. */
#define MAX_FIGURE_US 1e9
#define MAX_FIGURE_GBPS 1e5
#define MAX_FIGURE_BYTES 1e15

/* One figure of --measured: absent or null is fine (the record does not
 * have it); present, it must be a finite number in [0, max]. Returns false
 * after saying which record, which key, the value, the rule and the fix. */
static bool check_figure(const char *path, size_t rec, json_t *row, const char *key, double max,
                         const char *unit) {
    json_t *v = json_object_get(row, key);
    if (v == NULL || json_is_null(v)) return true;
    double x = json_is_number(v) ? json_number_value(v) : NAN;
    if (json_is_number(v) && isfinite(x) && x >= 0 && x <= max) return true;
    char shown[64];
    if (json_is_number(v))
        snprintf(shown, sizeof shown, "%g", x);
    else
        snprintf(shown, sizeof shown, "not a number (a JSON %s)",
                 json_is_string(v)    ? "string"
                 : json_is_boolean(v) ? "boolean"
                                      : "object or array");
    fprintf(stderr,
            "epx advise: --measured '%s', record %zu: %s is %s; it must be a finite number "
            "from 0 to %g %s: re-measure with 'epx bench comm ... --json FILE'\n",
            path, rec + 1, key, shown, max, unit);
    return false;
}

/* A count of --measured (ranks, tokens): absent is fine; present, an
 * integer from 1 to max. Returns false after saying which record. */
static bool check_count(const char *path, size_t rec, json_t *row, const char *key,
                        json_int_t max) {
    json_t *v = json_object_get(row, key);
    if (v == NULL ||
        (json_is_integer(v) && json_integer_value(v) >= 1 && json_integer_value(v) <= max))
        return true;
    fprintf(stderr,
            "epx advise: --measured '%s', record %zu: %s must be an integer from 1 to %lld: "
            "re-measure with 'epx bench comm ... --json FILE'\n",
            path, rec + 1, key, (long long)max);
    return false;
}

/* Every figure advise fits, in every record, before any fit. */
static bool check_lines(const char *path, json_t *lines) {
    size_t i;
    json_t *r;
    json_array_foreach(lines, i, r) {
        if (!check_figure(path, i, r, "median_us", MAX_FIGURE_US, "us") ||
            !check_figure(path, i, r, "gbps", MAX_FIGURE_GBPS, "GB/s"))
            return false;
        if (!check_count(path, i, r, "ranks", EPX_MAX_GPUS) ||
            !check_count(path, i, r, "tokens", INT32_MAX))
            return false;
    }
    return true;
}

static bool check_rows(const char *path, json_t *rows) {
    static const char *const ops[] = {"dispatch", "combine", "allreduce"};
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) {
        for (int op = 0; op < 3; op++) {
            char kt[64], kb[64];
            snprintf(kt, sizeof kt, "%s_us", ops[op]);
            snprintf(kb, sizeof kb, "%s_bytes", ops[op]);
            if (!check_figure(path, i, r, kt, MAX_FIGURE_US, "us") ||
                !check_figure(path, i, r, kb, MAX_FIGURE_BYTES, "bytes"))
                return false;
        }
    }
    return true;
}

/* A fit whose every time is 0 would be an answer computed from nothing:
 * epx bench comm writes times to the nanosecond, so a timed operation is
 * never 0, and a zero-filled or hand-made file is no measurement. Says which
 * file, what it holds (`what`, the fit's note) and what to pass instead. */
static int refuse_untimed(const char *path, const char *what, const link_row *L) {
    fprintf(stderr,
            "epx advise: --measured '%s': %s: nothing was timed; pass the figures of a run "
            "of 'epx bench comm ... --json FILE' (or -o FILE), or leave --measured out for "
            "%s's assumed figures\n",
            path, what, L->name);
    return CLI_EXIT_USAGE;
}

/* What one mode's figures rest on: a fit pair's weaker half decides. */
static const char *fig_word(const fit *a, const fit *b) {
    const int m = a->measured < b->measured ? a->measured : b->measured;
    return m == 2 ? "measured" : m == 1 ? "latency measured, bandwidth assumed" : "assumed";
}

int cmd_advise(int argc, char **argv) {
    cli_opt opts[] = {
        {"--model", "NAME|PATH",
         "model shape: a config.json or its folder, or a name (kimi-k2.5, deepseek-v3, qwen3-235b, "
         "mixtral, ...)",
         NULL},
        {"--gpus", "G",
         "GPUs serving the layer (EP ranks = TP ranks), 2 or more (on one nothing crosses a "
         "link); more than the model's experts means one replica per GPU (redundant slots)",
         NULL},
        {"--link", "LINK", "nvlink3|nvlink4|nvlink5|pcie4|pcie5|ib-ndr", NULL},
        {"--measured", "FILE",
         "fit latency and bandwidth to 'epx bench comm' figures: its JSON lines "
         "(--json FILE, which appends: each figure from the newest run that has it) or its "
         "summary (-o FILE)",
         NULL},
        {"--dtype", "bf16|f32|fp8",
         "element type on the wire (default bf16); fp8: the low-latency dispatch as DeepEP's e4m3 "
         "with a scale per 128 values (--measured: from 'epx bench comm --fp8'), the rest bf16",
         NULL},
        {"--combine", "rank|topk",
         "EP combine: per (token, rank) partials (default, DeepEP's shape) or "
         "per (token, k) rows",
         NULL},
        {"--imbalance", "F", "busiest GPU's EP traffic over the mean, >= 1 (default 1)", NULL},
        {"--transport", "peer|host|nccl",
         "the low-latency engine's transport: peer (device memory over NVLink or PCIe P2P, the "
         "default), host (pinned host memory, for GPUs without peer access: every byte "
         "crosses the link twice) or nccl (NCCL send/recv, across hosts); --measured then uses "
         "that transport's figures",
         NULL},
        {"--json", NULL, "print the answer as JSON", NULL},
        {NULL, NULL, NULL, NULL},
    };
    cli_cmd cmd = {"advise",
                   "epx advise --model NAME|PATH --gpus G --link nvlink4|nvlink5|pcie4|pcie5|... "
                   "[--transport T] [--measured FILE] [--dtype D] [--combine C] [--imbalance F] "
                   "[--json]",
                   "EP or TP for one MoE layer's communication: an alpha-beta model at the model's "
                   "shape, and the batch size where EP starts to win.",
                   opts,
                   0,
                   {0},
                   0};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc >= 0) return rc;
    const char *model = cli_require(&cmd, "--model"), *link = cli_require(&cmd, "--link");
    if (!model || !link || !cli_require(&cmd, "--gpus")) return CLI_EXIT_USAGE;
    int32_t G = 0;
    double imb = 1.0;
    /* One GPU has no EP/TP question: nothing crosses a link under either. */
    if (!cli_int(&cmd, "--gpus", 2, EPX_MAX_GPUS, &G) ||
        !cli_double(&cmd, "--imbalance", 1.0, 1000.0, &imb))
        return CLI_EXIT_USAGE;
    const link_row *L = NULL;
    for (size_t i = 0; i < NLINKS; i++)
        if (strcmp(LINKS[i].name, link) == 0) L = &LINKS[i];
    if (L == NULL) {
        fprintf(stderr, "epx advise: unknown --link '%s'; known:", link);
        for (size_t i = 0; i < NLINKS; i++) fprintf(stderr, " %s", LINKS[i].name);
        fputc('\n', stderr);
        return CLI_EXIT_USAGE;
    }
    epx_model_info info;
    if ((rc = cli_model(&cmd, model, &info)) >= 0) return rc;
    const epx_model *m = &info.model;
    const char *tr = cli_get(&cmd, "--transport");
    if (tr == NULL) tr = "peer";
    if (strcmp(tr, "ipc") == 0) tr = "peer";
    if (strcmp(tr, "peer") != 0 && strcmp(tr, "host") != 0 && strcmp(tr, "nccl") != 0) {
        fprintf(stderr, "epx advise: --transport must be peer (or ipc), host or nccl, not '%s'\n",
                tr);
        return CLI_EXIT_USAGE;
    }
    const bool host_tr = strcmp(tr, "host") == 0;
    static const char *const dtypes[] = {"bf16", "f32", "fp8"};
    static const char *const combines[] = {"rank", "topk"};
    int dti = 0, ci = 0;
    if (!cli_choice(&cmd, "--dtype", dtypes, 3, &dti) ||
        !cli_choice(&cmd, "--combine", combines, 2, &ci))
        return CLI_EXIT_USAGE;
    const double esz = dti == 1 ? 4 : 2;
    const bool fp8 = dti == 2;
    bool topk = ci == 1; /* absent: the measured file's, below */
    const double H = m->hidden, K = m->top_k, E = m->num_experts;
    const int moe_layers = m->num_layers - m->first_k_dense;
    /* Expected other GPUs a token reaches: K distinct uniform experts, E/G per
     * GPU. With more GPUs than experts each GPU holds one replica and each
     * expert sits on G/E GPUs, of which the token uses one: it reaches K
     * GPUs, its own with chance K/G, so d = K (G - 1) / G (equal to the first
     * form at G = E; E/G < 1 in it once made a top-2 token reach 2.09). */
    double miss = 1.0, per = E / G;
    for (int i = 0; i < m->top_k; i++) miss *= (E - per - i) > 0 ? (E - per - i) / (E - i) : 0.0;
    const double d = G <= 1 ? 0.0 : G <= E ? (G - 1) * (1.0 - miss) : K * (G - 1) / G;
    const double rec = ceil(H * esz / 16) * 16 + ceil(K * 8 / 16) * 16;
    /* fp8: the low-latency dispatch's rows as e4m3 and a scale per 128 values */
    const double rec_ll = fp8 ? ceil((H + H / 32) / 16) * 16 + ceil(K * 8 / 16) * 16 : rec;
    /* bytes per GPU per global token (combine's once --measured has said
     * which order it measured) */
    const double bd = d * rec / G, bt = G > 1 ? 2.0 * (G - 1) / G * H * esz : 0.0;
    const double bd_ll = d * rec_ll / G;
    fit fd = {2 * L->a2a_us + HOST_SYNC_US, 1e-3 / L->a2a_gbps, 0};
    fit fc = {L->a2a_us, 1e-3 / L->a2a_gbps, 0};
    fit ft = {L->ar_us, 1e-3 / L->ar_gbps, 0};
    char notes[3][256] = {"", "", ""};
    char mnote[512] = "";
    /* Low-latency mode: one in-band exchange per phase, no host sync, top-k
     * combine rows; served up to LL_MAX_PER_GPU tokens per GPU. */
    /* The host transport stores into host memory and the receiver loads it
     * back: twice the bytes on the link. */
    fit ld = {L->a2a_us, 1e-3 / L->a2a_gbps * (host_tr ? 2.0 : 1.0), 0}, lc = ld;
    char llnotes[2][256] = {"", ""};
    /* --measured is read once, through the one safe reader (regular files
     * only, at most EPX_MAX_INPUT_BYTES). */
    char *mtext = NULL;
    size_t mlen = 0;
    if (cli_get(&cmd, "--measured") != NULL) {
        epx_error rerr = {0};
        if (epx_file_read(cli_get(&cmd, "--measured"), EPX_MAX_INPUT_BYTES,
                          "--measured (EPX_MAX_INPUT_BYTES)", &mtext, &mlen, &rerr) != EPX_OK)
            return cli_report(&cmd, &rerr);
    }
    json_t *lines = mtext ? cli_bench_lines(mtext, mlen, NULL) : NULL;
    json_error_t je;
    json_t *root = mtext && lines == NULL ? json_loadb(mtext, mlen, 0, &je) : NULL;
    epx_free(mtext);
    if (lines != NULL && !check_lines(cli_get(&cmd, "--measured"), lines)) {
        json_decref(lines);
        return CLI_EXIT_USAGE;
    }
    size_t others = 0, older = 0; /* lines of other rank counts, of the older normal path */
    if (lines != NULL) lines = one_rank_count(lines, G, &others);
    bool gpu_normal = false; /* the normal mode fitted is the GPU engine's: no host sync */
    /* Where --measured was timed ("mpi on cpu", "nccl on NVIDIA H100 ..."):
     * every --link is a GPU link, so CPU figures answer another question. */
    char msrc[160] = "";
    bool on_cpu = false;
    if (lines != NULL) lines = one_normal_engine(lines, &older, &gpu_normal);
    if (lines != NULL) {
        const char *path = cli_get(&cmd, "--measured");
        json_t *r0 = json_array_get(lines, 0);
        bool g = false; /* graph replays where the file has them */
        size_t i;
        json_t *r;
        json_array_foreach(lines, i, r) g |= json_is_true(json_object_get(r, "graph"));
        const size_t nl = json_array_size(lines);
        int *run_of = malloc((nl ? nl : 1) * sizeof *run_of);
        double *when = malloc((nl ? nl : 1) * sizeof *when);
        if (run_of == NULL || when == NULL) {
            free(run_of);
            free(when);
            json_decref(lines);
            fprintf(stderr, "epx advise: out of memory for the runs of '%s'\n", path);
            return CLI_EXIT_FAIL;
        }
        cli_bench_runs(lines, run_of, when);
        size_t newest = 0; /* the machine and backend named: the newest line's */
        for (size_t k = 1; k < nl; k++)
            if (when[k] > when[newest]) newest = k;
        r0 = json_array_get(lines, newest);
        /* One rank's bytes stay in its GPU's memory, and so do those of
         * ranks that were processes sharing GPUs ("shared_gpu"), except the
         * host transport's dispatch rows, which cross the host link and back
         * (link_pct). */
        const bool shared = json_is_true(json_object_get(r0, "shared_gpu"));
        const bool one = json_integer_value(json_object_get(r0, "ranks")) == 1 || shared;
        int n1 = fit_lines(lines, run_of, when, "low-latency", "dispatch", g, tr, fp8,
                           one && !host_tr, &ld, llnotes[0], sizeof llnotes[0]);
        int n2 = fit_lines(lines, run_of, when, "low-latency", "combine", g, tr, false, one, &lc,
                           llnotes[1], sizeof llnotes[1]);
        int n3 = fit_lines(lines, run_of, when, "normal", "dispatch", false, NULL, false, one, &fd,
                           notes[0], sizeof notes[0]);
        int n4 = fit_lines(lines, run_of, when, "normal", "combine", false, NULL, false, one, &fc,
                           notes[1], sizeof notes[1]);
        int n5 = fit_lines(lines, run_of, when, "tp-allreduce", "allreduce", false, NULL, false,
                           one, &ft, notes[2], sizeof notes[2]);
        if (one && n5 > 0) { /* NCCL's all-reduce of one rank communicates nothing */
            ft.a_us = L->ar_us;
            ft.measured = 0;
            snprintf(notes[2], sizeof notes[2],
                     "tp-allreduce allreduce: %.1f us + %.1f GB/s (both the link's: an "
                     "all-reduce that crosses no link communicates nothing; %d points not used)",
                     ft.a_us, 1e-3 / ft.us_per_byte, n5);
        }
        free(run_of);
        free(when);
        const int nfit[5] = {n1, n2, n3, n4, n5};
        const char *fnote[5] = {llnotes[0], llnotes[1], notes[0], notes[1], notes[2]};
        for (int k = 0; k < 5; k++)
            if (nfit[k] < 0) {
                json_decref(lines);
                return refuse_untimed(path, fnote[k], L);
            }
        /* Low-latency lines of another transport only: say which to ask for. */
        const char *other = NULL;
        json_array_foreach(lines, i, r) {
            const char *md = json_string_value(json_object_get(r, "mode"));
            if (md != NULL && strcmp(md, "low-latency") == 0 && strcmp(line_transport(r), tr) != 0)
                other = line_transport(r);
        }
        if (n1 == 0 && fp8 && n2 > 0) {
            fprintf(stderr,
                    "epx advise: '%s' has no fp8 low-latency dispatch figures for --dtype fp8: "
                    "measure them with 'epx bench comm --backend nccl --mode low-latency --fp8 "
                    "--json FILE'\n",
                    path);
            json_decref(lines);
            return CLI_EXIT_USAGE;
        }
        if (n1 == 0 && other != NULL) {
            fprintf(stderr,
                    "epx advise: '%s' has low-latency figures of the %s transport only, not of "
                    "%s: pass --transport %s, or measure %s with 'epx bench comm --backend nccl "
                    "--mode low-latency --transport %s --json FILE'\n",
                    path, other, tr, other, tr, tr);
            json_decref(lines);
            return CLI_EXIT_USAGE;
        }
        int ranks = (int)json_integer_value(json_object_get(r0, "ranks"));
        const char *lb = json_string_value(json_object_get(r0, "backend")),
                   *ldev = json_string_value(json_object_get(r0, "device"));
        on_cpu = ldev ? strcmp(ldev, "cpu") == 0 : lb != NULL && strcmp(lb, "mpi") == 0;
        snprintf(msrc, sizeof msrc, "%s on %s", lb ? lb : "?", ldev ? ldev : "?");
        char left[160] = "";
        if (others > 0)
            snprintf(left, sizeof left, "; %zu line(s) of other rank counts left out", others);
        if (older > 0)
            snprintf(left + strlen(left), sizeof left - strlen(left),
                     "; %zu normal-mode line(s) of the older NCCL path left out", older);
        snprintf(mnote, sizeof mnote, "measured by epx bench comm (%s, %d rank(s), %s)%s%s%s",
                 json_string_value(json_object_get(r0, "backend")), ranks,
                 json_string_value(json_object_get(r0, "device")),
                 one ? (shared ? "; ranks sharing GPUs" : "; one rank") : "",
                 one ? (host_tr ? ": EP's latencies carried over to --gpus (a floor: no link's "
                                  "latency in them), bandwidths the link's but the host "
                                  "dispatch's (its rows cross the host link)"
                                : ": EP's latencies carried over to --gpus (a floor: no link's "
                                  "latency in them), bandwidths the link's (no byte crossed a "
                                  "link)")
                 : ranks != G ? "; fitted at another rank count than --gpus: latencies and "
                                "bandwidths carried over as they are"
                              : "",
                 left);
        json_decref(lines);
        if (n5 == 0 || (n1 == 0 && n3 == 0) || (n1 > 0) != (n2 > 0) || (n3 > 0) != (n4 > 0)) {
            fprintf(stderr,
                    "epx advise: '%s' lacks the all-reduce, or a mode's dispatch or combine "
                    "figures, among its lines of %d rank(s): write it with 'epx bench comm ... "
                    "--json FILE'\n",
                    path, ranks);
            return CLI_EXIT_USAGE;
        }
        topk = topk || (n3 == 0); /* only low latency measured: its combine is top-k */
    } else if (cli_get(&cmd, "--measured") != NULL) {
        const char *path = cli_get(&cmd, "--measured");

        json_t *rows = root ? json_object_get(root, "rows") : NULL;
        const char *fmt = root ? json_string_value(json_object_get(root, "format")) : NULL;
        if (root == NULL || !json_is_array(rows) || fmt == NULL ||
            strcmp(fmt, "epx-bench-comm-1") != 0) {
            fprintf(stderr,
                    "epx advise: --measured '%s' is neither JSON lines of 'epx bench comm "
                    "--json FILE' nor an epx-bench-comm-1 summary (%s): write one with "
                    "'epx bench comm ... --json FILE'\n",
                    path, root ? "no format/rows" : je.text);
            json_decref(root);
            return CLI_EXIT_USAGE;
        }
        if (!check_rows(path, rows) || !check_count(path, 0, root, "ranks", EPX_MAX_GPUS)) {
            json_decref(root);
            return CLI_EXIT_USAGE;
        }
        int r1 = fit_op(rows, "dispatch", &fd, notes[0], sizeof notes[0]);
        int r2 = fit_op(rows, "combine", &fc, notes[1], sizeof notes[1]);
        int r3 = fit_op(rows, "allreduce", &ft, notes[2], sizeof notes[2]);
        int ranks = (int)json_integer_value(json_object_get(root, "ranks"));
        const char *mm = json_string_value(json_object_get(root, "model"));
        const char *mb = json_string_value(json_object_get(root, "backend"));
        on_cpu = mb != NULL && strcmp(mb, "mpi") == 0; /* the summary names no device */
        snprintf(msrc, sizeof msrc, "%s%s", mb ? mb : "?", on_cpu ? " on cpu" : "");
        if (cli_get(&cmd, "--combine") == NULL) {
            const char *fc_mode = json_string_value(json_object_get(root, "combine"));
            if (fc_mode && strcmp(fc_mode, "topk") == 0) topk = true;
        }
        snprintf(mnote, sizeof mnote, "measured by epx bench comm (%s, %d rank(s), model %s)%s",
                 mb ? mb : "?", ranks, mm ? mm : "?",
                 ranks != G
                     ? "; fitted at another rank count than --gpus: latencies and bandwidths "
                       "carried over as they are"
                     : "");
        json_decref(root);
        const int rfit[3] = {r1, r2, r3};
        for (int k = 0; k < 3; k++)
            if (rfit[k] == -2) return refuse_untimed(path, notes[k], L);
        if (r1 || r2 || r3) {
            fprintf(stderr, "epx advise: '%s' lacks dispatch, combine or allreduce figures\n",
                    path);
            return CLI_EXIT_USAGE;
        }
    }
    const double bc = (topk ? K * (G - 1.0) / G : d) * H * esz / G;
    const double ae = fd.a_us + fc.a_us, be = imb * (bd * fd.us_per_byte + bc * fc.us_per_byte);
    const double bc_ll = K * (G - 1.0) / G * H * esz / G; /* low latency combines in top-k order */
    const double al = ld.a_us + lc.a_us,
                 bl = imb * (bd_ll * ld.us_per_byte + bc_ll * lc.us_per_byte);
    const double at = ft.a_us, bt_us = bt * ft.us_per_byte;
    ep_lines ep = {ae, be, al, bl, (double)G * LL_MAX_PER_GPU};
    /* The first batch where the winner changes, on a geometric grid, then
     * bisected to the token. */
    char answer[512];
    double cross = -1;
    const char *cmode = "normal";
    {
        const bool ep_first = ep_time(&ep, 1, NULL) < at + bt_us;
        double lo = 1, hi = -1;
        for (double B = 1; B <= 16777216.0; B = ceil(B * 1.09)) {
            if ((ep_time(&ep, B, NULL) < at + bt_us * B) != ep_first) {
                hi = B;
                break;
            }
            lo = B;
        }
        while (hi > 0 && hi - lo > 1) {
            double mid = floor((lo + hi) / 2);
            if ((ep_time(&ep, mid, NULL) < at + bt_us * mid) == ep_first)
                lo = mid;
            else
                hi = mid;
        }
        if (hi > 0) {
            cross = hi;
            ep_time(&ep, ep_first ? lo : hi, &cmode);
        }
        const bool ll_mode = strcmp(cmode, "low-latency") == 0;
        if (ep_first && hi < 0) {
            snprintf(answer, sizeof answer,
                     "EP wins at every batch size (less latency and fewer bytes)");
            cross = 0;
        } else if (ep_first && hi <= G) {
            /* EP needs a token per GPU (attention runs data-parallel): a
             * lead below G tokens is no lead at all. */
            snprintf(answer, sizeof answer,
                     "EP never wins at one token per GPU or more: its lead ends at %.0f tokens "
                     "per step, fewer than one per GPU on %d GPUs; from there TP moves fewer "
                     "bytes",
                     hi, G);
        } else if (ep_first) {
            snprintf(answer, sizeof answer,
                     "EP wins only below %.0f tokens per step (%s mode); above it "
                     "TP moves fewer bytes",
                     hi, cmode);
        } else if (hi > 0 && hi <= G) {
            snprintf(answer, sizeof answer,
                     "EP wins at every batch that gives each of the %d GPUs a token, in %s mode: "
                     "the crossover (%.0f tokens per step) is below one token per GPU",
                     G, cmode, hi);
        } else if (hi > 0) {
            snprintf(answer, sizeof answer,
                     "EP starts to win at %.0f tokens per step (%.0f per GPU), in %s mode (%.1f us "
                     "fixed per layer: %s); below that TP's one all-reduce costs less",
                     hi, ceil(hi / G), cmode, ll_mode ? al : ae,
                     ll_mode || gpu_normal ? "two in-band exchanges, no host sync"
                                           : "two all-to-alls and a host sync");
        } else {
            snprintf(answer, sizeof answer,
                     "EP never wins: TP moves fewer bytes per GPU and has less latency");
        }
    }
    if (G > m->num_experts) {
        const size_t n = strlen(answer);
        snprintf(answer + n, sizeof answer - n,
                 " (%d redundant slots assumed: one replica per GPU)", G - m->num_experts);
    }
    /* With --measured, a mode the file has no figures for keeps the link's
     * assumed ones: the answer says which figures it rests on rather than
     * mixing the two silently. */
    const bool measured = cli_get(&cmd, "--measured") != NULL;
    const char *w_ep = fig_word(&fd, &fc), *w_ll = fig_word(&ld, &lc), *w_tp = fig_word(&ft, &ft);
    if (measured) {
        const size_t n = strlen(answer);
        snprintf(answer + n, sizeof answer - n,
                 "; figures: EP normal mode %s, EP low-latency mode %s, TP %s (measured: %s; "
                 "assumed: %s's)",
                 w_ep, w_ll, w_tp, msrc, L->name);
    }
    if (measured && on_cpu)
        fprintf(stderr,
                "epx advise: warning: --measured '%s' was timed on the CPU (%s), not on GPUs "
                "over %s: its figures are not that link's, and the answer mixes them with %s's "
                "assumed ones where the file has none; measure on the GPUs with 'epx bench comm "
                "--backend nccl ... --json FILE'\n",
                cli_get(&cmd, "--measured"), msrc, L->name, L->name);
    if (cli_flag(&cmd, "--json")) {
        /* Strings escaped (a model folder may be named with any byte) and
         * figures that are not finite as null: always valid JSON. */
        FILE *o = stdout;
        fputs("{\"model\": ", o);
        cli_json_str(o, m->name);
        fprintf(o, ", \"gpus\": %d, \"link\": ", G);
        cli_json_str(o, L->name);
        fprintf(o,
                ", \"measured\": %s, \"dtype\": \"%s\", \"combine\": \"%s\", \"transport\": "
                "\"%s\"",
                cli_get(&cmd, "--measured") ? "true" : "false",
                fp8        ? "fp8"
                : esz == 2 ? "bf16"
                           : "f32",
                topk ? "topk" : "rank", tr);
        const struct {
            const char *key;
            double a, b;
        } pairs[] = {{"ep_us", ae, be}, {"ep_low_latency_us", al, bl}, {"tp_us", at, bt_us}};
        for (int i = 0; i < 3; i++) {
            if (i == 2) {
                fputs(", \"low_latency_max_tokens\": ", o);
                cli_json_num(o, "%.0f", ep.ll_max);
            }
            fprintf(o, ", \"%s\": [", pairs[i].key);
            cli_json_num(o, "%.3f", pairs[i].a);
            fputs(", ", o);
            cli_json_num(o, "%.6f", pairs[i].b);
            fputc(']', o);
        }
        if (measured) {
            fputs(", \"figures\": {\"ep\": ", o);
            cli_json_str(o, w_ep);
            fputs(", \"ep_low_latency\": ", o);
            cli_json_str(o, w_ll);
            fputs(", \"tp\": ", o);
            cli_json_str(o, w_tp);
            fputs(", \"measured_on\": ", o);
            cli_json_str(o, msrc);
            fputc('}', o);
        }
        fprintf(o, ", \"redundant_slots_assumed\": %d",
                G > m->num_experts ? G - m->num_experts : 0);
        fputs(", \"crossover_tokens\": ", o);
        cli_json_num(o, "%.1f", cross);
        fputs(", \"ep_mode\": ", o);
        cli_json_str(o, cmode);
        fputs(", \"answer\": ", o);
        cli_json_str(o, answer);
        fputs("}\n", o);
        return CLI_EXIT_OK;
    }
    printf("epx advise: %s on %d GPUs over %s (%s), %s, combine %s\n", m->name, G, L->name, L->what,
           fp8        ? "fp8 low-latency dispatch, bf16 otherwise"
           : esz == 2 ? "bf16"
                      : "fp32",
           topk ? "top-k order" : "per-rank partials");
    printf("model: hidden %d, top-%d of %d routed experts, %d MoE layers\n\n", m->hidden, m->top_k,
           m->num_experts, moe_layers);
    printf("assumptions:\n");
    printf("  - communication of one MoE layer only: expert GEMMs, attention, and overlap of\n"
           "    communication with compute are not modelled; EP runs attention data-parallel, TP\n"
           "    all-reduces the whole batch after the layer\n");
    printf(
        "  - routing uniform over experts, a token's %d experts distinct: it reaches %.2f other\n"
        "    GPUs on average; the busiest GPU carries %.2fx the mean EP traffic (--imbalance)\n",
        m->top_k, d, imb);
    if (G > m->num_experts)
        printf("  - %d GPUs for %d experts: each GPU holds one replica, so %d redundant slots\n"
               "    (epx plan --redundant %d); a token uses one replica of each of its experts\n",
               G, m->num_experts, G - m->num_experts, G - m->num_experts);
    printf("  - EP dispatch sends one record per (token, GPU): x row + %d (slot, weight) = %.0f "
           "bytes;\n"
           "    combine returns %s of %.0f bytes\n",
           m->top_k, rec, topk ? "one row per (token, k)" : "one row per (token, GPU)", H * esz);
    if (fp8)
        printf(
            "  - fp8 low-latency dispatch: %.0f bytes a record (e4m3 row, a 4-byte scale per 128 "
            "values, the same (slot, weight) pairs)\n",
            rec_ll);
    printf("  - TP: ring all-reduce of the batch, 2(G-1)/G x B x %.0f bytes per GPU\n", H * esz);
    printf("  - EP in low-latency mode (up to %d tokens per GPU): one in-band exchange per phase,\n"
           "    no host sync, top-k combine rows; normal mode above that\n",
           LL_MAX_PER_GPU);
    printf("  - low-latency transport %s: %s\n", tr,
           strcmp(tr, "nccl") == 0
               ? "NCCL send/recv of fixed-size blocks between the phase's\n"
                 "    kernels (any topology); the assumed figures are the link's, padding aside"
           : strcmp(L->name, "ib-ndr") == 0
               ? "across nodes epx's low-latency engine runs over NCCL\n"
                 "    (--transport nccl in epx bench comm): measure it, these figures are a model"
           : host_tr ? "pinned host memory the ranks share (GPUs without\n"
                       "    peer access); every byte crosses the link twice (bandwidth halved)"
                     : "device memory the peers store into (NVLink, or PCIe\n"
                       "    with P2P); GPUs without peer access need --transport host");
    if (mnote[0]) {
        printf("  - %s\n", mnote);
        for (int i = 0; i < 3; i++)
            if (notes[i][0]) printf("    %s\n", notes[i]);
        for (int i = 0; i < 2; i++)
            if (llnotes[i][0]) printf("    %s\n", llnotes[i]);
    } else {
        printf("  - link %s, assumed figures: all-to-all %.0f us + %.0f GB/s per GPU, all-reduce "
               "%.0f us +\n"
               "    %.0f GB/s bus bandwidth, EP host sync %.0f us; measure yours with\n"
               "    'epx bench comm -o FILE' and pass --measured FILE\n",
               L->name, L->a2a_us, L->a2a_gbps, L->ar_us, L->ar_gbps, HOST_SYNC_US);
    }
    printf("\nper layer, by batch (tokens per step over all GPUs):\n");
    printf("%10s %9s %11s %-12s %11s %11s  %s\n", "batch", "per GPU", "EP us", "EP mode", "TP us",
           "EP/TP", "winner");
    const double batches[] = {8, 64, 256, 1024, 4096, 16384, 65536};
    for (size_t i = 0; i < sizeof batches / sizeof batches[0]; i++) {
        double B = batches[i];
        const char *mode = "normal";
        double te = ep_time(&ep, B, &mode), tt = at + bt_us * B;
        printf("%10.0f %9.0f %11.1f %-12s %11.1f %11.2f  %s\n", B, B / G, te, mode, tt,
               tt > 0 ? te / tt : 0, te < tt ? "EP" : "TP");
    }
    double B = 4096;
    printf("\nper forward step (%d MoE layers) at %0.f tokens: EP %.2f ms, TP %.2f ms\n",
           moe_layers, B, moe_layers * ep_time(&ep, B, NULL) * 1e-3,
           moe_layers * (at + bt_us * B) * 1e-3);
    printf("\nanswer: %s.\n", answer);
    return CLI_EXIT_OK;
}
