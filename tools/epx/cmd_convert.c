/*
 * cmd_convert.c - `epx convert IN OUT`: SGLang's mapping and counts files
 * between .pt and .json, chosen by extension, so a user can hand SGLang
 * either format and read its dumps without Python.
 *
 * IN is a mapping ({"physical_to_logical_map"}) or counts (init files with
 * "logical_count", stat dumps, per_pass dumps, which become [S][L][E]
 * counts). Counts are read as epx plan and epx stats read them (one reader,
 * epx_counts_read_with): a stat dump's ring-buffer rows summed into one
 * window unless --stat-rows windows, per_pass dumps one window per forward
 * pass unless --window-passes N, so planning on OUT is planning on IN.
 * Several per-rank per_pass dumps are
 * given as a comma-separated list or a directory of .pt files. --tree writes
 * the whole object tree of a .pt file as JSON (tensors as nested lists),
 * for looking inside any torch.save file without running its pickle.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

#define EPX_TRY_CLI(expr)                                                                          \
    do {                                                                                           \
        epx_status try_st_ = (expr);                                                               \
        if (try_st_ != EPX_OK) return try_st_;                                                     \
    } while (0)

static int has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

static int is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* IN holds a mapping and counts: the mapping is converted, and the counts
 * are not, which the user should hear rather than find out. */
static void both_forms_note(const char *in) {
    fprintf(stderr,
            "epx convert: note: '%s' holds both physical_to_logical_map and logical_count; the "
            "mapping is converted, as SGLang's --init-expert-location takes it first (the counts "
            "are left out)\n",
            in);
}

/* ---- --tree: a .pt object tree as JSON ----------------------------------- */

/* A JSON string literal, escaped (json_out.c). */
static void json_string(FILE *f, const char *s, size_t n) { cli_json_strn(f, s, n); }

static void json_double(FILE *f, double x) {
    if (x != x || x - x != 0)
        fputs("null", f); /* NaN and infinities have no JSON form */
    else
        fprintf(f, "%.17g", x);
}

/* Elements [at, at + count) of dims[d..] of a row-major copy. */
static void json_tensor_rec(FILE *f, const epx_pt_tensor *t, const double *x, const int64_t *xi,
                            int d, size_t *at) {
    if (d == t->ndim) {
        if (t->dtype == EPX_PT_DTYPE_BOOL)
            fputs(xi[*at] ? "true" : "false", f);
        else if (xi != NULL)
            fprintf(f, "%lld", (long long)xi[*at]);
        else
            json_double(f, x[*at]);
        (*at)++;
        return;
    }
    fputc('[', f);
    for (int64_t i = 0; i < t->shape[d]; i++) {
        if (i) fputs(", ", f);
        json_tensor_rec(f, t, x, xi, d + 1, at);
    }
    fputc(']', f);
}

static int is_int_dtype(epx_pt_dtype dt) {
    return dt == EPX_PT_DTYPE_INT64 || dt == EPX_PT_DTYPE_INT32 || dt == EPX_PT_DTYPE_INT16 ||
           dt == EPX_PT_DTYPE_INT8 || dt == EPX_PT_DTYPE_UINT8 || dt == EPX_PT_DTYPE_BOOL;
}

static epx_status json_tensor(FILE *f, const epx_pt_value *v, epx_error *err) {
    epx_pt_tensor t;
    int64_t numel = 0;
    EPX_TRY_CLI(epx_pt_value_tensor(v, &t, err));
    EPX_TRY_CLI(epx_pt_tensor_numel(&t, &numel, err));
    size_t n = (size_t)numel;
    double *x = NULL;
    int64_t *xi = NULL;
    epx_status st;
    if (is_int_dtype(t.dtype)) {
        xi = malloc((n ? n : 1) * sizeof *xi);
        st = xi ? epx_pt_tensor_to_i64(&t, xi, n, err) : EPX_ERR_NOMEM;
    } else {
        x = malloc((n ? n : 1) * sizeof *x);
        st = x ? epx_pt_tensor_to_f64(&t, x, n, err) : EPX_ERR_NOMEM;
    }
    if (st == EPX_ERR_NOMEM && err->msg[0] == '\0') {
        err->status = st;
        snprintf(err->msg, sizeof err->msg, "out of memory copying a tensor of %zu elements", n);
    }
    if (st == EPX_OK) {
        size_t at = 0;
        json_tensor_rec(f, &t, x, xi, 0, &at);
    }
    free(x);
    free(xi);
    return st;
}

static epx_status json_value(FILE *f, const epx_pt_value *v, epx_error *err);

/* Key k of a dict as JSON writes it: a string as it is, a scalar as
 * json.dumps writes it (5 -> "5", None -> "null"), escaped. */
static void json_key(FILE *f, const epx_pt_value *key, size_t k) {
    int64_t i = 0;
    double x = 0;
    size_t len = 0;
    switch (epx_pt_value_kind(key)) {
    case EPX_PT_STRING: {
        const char *s = epx_pt_value_string(key, &len);
        json_string(f, s, len);
        return;
    }
    case EPX_PT_NONE: fputs("\"null\"", f); return;
    case EPX_PT_BOOL:
        epx_pt_value_int(key, &i, NULL);
        fputs(i ? "\"true\"" : "\"false\"", f);
        return;
    case EPX_PT_INT:
        epx_pt_value_int(key, &i, NULL);
        fprintf(f, "\"%lld\"", (long long)i);
        return;
    case EPX_PT_FLOAT:
        epx_pt_value_float(key, &x, NULL);
        fprintf(f, "\"%.17g\"", x);
        return;
    default: fprintf(f, "\"<%s %zu>\"", epx_pt_kind_str(epx_pt_value_kind(key)), k); return;
    }
}

static int text_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A dict whose keys JSON would write alike (5 and '5', None and 'null') is
 * refused: the file would hold one key twice, which epx's own reader
 * refuses and Python's json reads as the last value alone. Otherwise its
 * keys and values, in order. */
static epx_status json_dict(FILE *f, const epx_pt_value *v, epx_error *err) {
    const size_t n = epx_pt_value_len(v);
    char **text = calloc(n ? n : 1, sizeof *text), **sorted = calloc(n ? n : 1, sizeof *sorted);
    epx_status st = text && sorted ? EPX_OK : EPX_ERR_NOMEM;
    for (size_t k = 0; k < n && st == EPX_OK; k++) {
        size_t len = 0;
        FILE *m = open_memstream(&text[k], &len);
        if (m == NULL) {
            st = EPX_ERR_NOMEM;
            break;
        }
        json_key(m, epx_pt_dict_key(v, k), k);
        if (fclose(m) != 0 || text[k] == NULL) st = EPX_ERR_NOMEM;
        sorted[k] = text[k];
    }
    if (st == EPX_ERR_NOMEM) {
        err->status = st;
        snprintf(err->msg, sizeof err->msg, "out of memory for a dict of %zu keys", n);
    }
    if (st == EPX_OK) {
        qsort(sorted, n, sizeof *sorted, text_cmp);
        for (size_t k = 1; k < n && st == EPX_OK; k++)
            if (strcmp(sorted[k - 1], sorted[k]) == 0) {
                st = err->status = EPX_ERR_PARSE;
                snprintf(err->msg, sizeof err->msg,
                         "a dict holds two keys that JSON writes alike, %.200s (JSON keys are "
                         "strings: 5 and '5', None and 'null' collide), so --tree cannot write "
                         "it as JSON",
                         sorted[k]);
            }
    }
    if (st == EPX_OK) {
        fputc('{', f);
        for (size_t k = 0; k < n && st == EPX_OK; k++) {
            fprintf(f, "%s%s: ", k ? ", " : "", text[k]);
            st = json_value(f, epx_pt_dict_value(v, k), err);
        }
        fputc('}', f);
    }
    for (size_t k = 0; text && k < n; k++) free(text[k]);
    free(text);
    free(sorted);
    return st;
}

static epx_status json_value(FILE *f, const epx_pt_value *v, epx_error *err) {
    int64_t i = 0;
    double x = 0;
    size_t len = 0;
    const char *s;
    switch (epx_pt_value_kind(v)) {
    case EPX_PT_NONE: fputs("null", f); return EPX_OK;
    case EPX_PT_BOOL:
        epx_pt_value_int(v, &i, NULL);
        fputs(i ? "true" : "false", f);
        return EPX_OK;
    case EPX_PT_INT:
        epx_pt_value_int(v, &i, NULL);
        fprintf(f, "%lld", (long long)i);
        return EPX_OK;
    case EPX_PT_FLOAT:
        epx_pt_value_float(v, &x, NULL);
        json_double(f, x);
        return EPX_OK;
    case EPX_PT_STRING:
        s = epx_pt_value_string(v, &len);
        json_string(f, s, len);
        return EPX_OK;
    case EPX_PT_LIST:
    case EPX_PT_TUPLE:
        fputc('[', f);
        for (size_t k = 0; k < epx_pt_value_len(v); k++) {
            if (k) fputs(", ", f);
            EPX_TRY_CLI(json_value(f, epx_pt_value_item(v, k), err));
        }
        fputc(']', f);
        return EPX_OK;
    case EPX_PT_DICT: return json_dict(f, v, err);
    case EPX_PT_TENSOR: return json_tensor(f, v, err);
    }
    return EPX_OK;
}

static epx_status tree_body(FILE *f, const void *ctx, epx_error *err) {
    epx_status st = json_value(f, epx_pt_file_root(ctx), err);
    fputc('\n', f);
    return st;
}

static int write_tree(const cli_cmd *cmd, const char *in, const char *out) {
    epx_error err = {0};
    epx_pt_file *pf = NULL;
    if (epx_pt_load(in, &pf, &err) != EPX_OK) return cli_report(cmd, &err);
    epx_status st = epx_file_write(out, tree_body, pf, &err);
    epx_pt_file_destroy(pf);
    if (st != EPX_OK) return cli_write_failed(cmd, &err);
    printf("wrote %s: the object tree of %s\n", out, in);
    return CLI_EXIT_OK;
}

/* ---- mapping and counts ------------------------------------------------- */

static int write_mapping(const cli_cmd *cmd, int32_t *map, int32_t L, int32_t P, const char *dtype,
                         const char *out) {
    if (dtype != NULL) {
        epx_free(map);
        fprintf(stderr, "epx convert: --dtype is for counts; a mapping is always written as "
                        "int64\n");
        return CLI_EXIT_USAGE;
    }
    int32_t E = 0;
    for (size_t i = 0; i < (size_t)L * (size_t)P; i++)
        if (map[i] + 1 > E) E = map[i] + 1;
    /* A layout validates the map (every expert has a slot); one GPU, since
     * the file does not say how many the map was made for. */
    if (!cli_check_json_size(cmd, out, (double)L * P, cli_json_width(E - 1), "write a .pt file")) {
        epx_free(map);
        return CLI_EXIT_USAGE;
    }
    epx_shape shape = {L, E, P, 1, 1};
    epx_error err = {0};
    epx_layout *lay = NULL;
    epx_status st = epx_layout_create_from_map(&shape, map, &lay, &err);
    epx_free(map);
    if (st != EPX_OK) return cli_report(cmd, &err);
    st = has_suffix(out, ".pt") ? epx_layout_write_pt(lay, out, &err)
                                : epx_layout_write_json(lay, out, &err);
    epx_layout_destroy(lay);
    if (st != EPX_OK) return cli_write_failed(cmd, &err);
    printf("wrote %s: physical_to_logical_map [%d][%d] (%d logical experts)\n", out, L, P, E);
    return CLI_EXIT_OK;
}

static int write_counts(const cli_cmd *cmd, epx_counts *c, const char *out, epx_pt_dtype dt) {
    /* A .pt can hold more than the 1 GiB of JSON epx reads back: the JSON
     * is sized from the mean figure (and 20 bytes a figure with fractions)
     * before it is written. */
    const size_t n = (size_t)c->num_windows * (size_t)c->num_layers * (size_t)c->num_experts;
    double sum = 0;
    bool whole = true;
    for (size_t i = 0; i < n; i++) {
        sum += c->data[i];
        whole = whole && c->data[i] == floor(c->data[i]);
    }
    if (!cli_check_json_size(cmd, out, (double)n, whole ? cli_json_width(sum / (double)n) : 20,
                             "convert to .pt, or cut the windows")) {
        epx_counts_destroy(c);
        return CLI_EXIT_USAGE;
    }
    epx_error err = {0};
    epx_status st = has_suffix(out, ".pt") ? epx_counts_write_pt(c, out, dt, &err)
                                           : epx_counts_write_json(c, out, &err);
    if (st == EPX_OK)
        printf("wrote %s: logical_count [%d][%d][%d]\n", out, c->num_windows, c->num_layers,
               c->num_experts);
    epx_counts_destroy(c);
    return st == EPX_OK ? CLI_EXIT_OK : cli_write_failed(cmd, &err);
}

/* --stat-rows and --window-passes read counts; on a mapping they would do
 * nothing. True after saying so. */
static bool write_counts_opts_unused(const cli_cmd *cmd, bool given) {
    if (given)
        fprintf(stderr,
                "epx convert: --stat-rows and --window-passes are for counts; '%s' is a "
                "mapping: drop them\n",
                cmd->positional[0]);
    return given;
}

static int parse_dtype(const char *s, epx_pt_dtype *dt) {
    static const struct {
        const char *name;
        epx_pt_dtype dt;
    } names[] = {{"auto", EPX_PT_DTYPE_AUTO},
                 {"int64", EPX_PT_DTYPE_INT64},
                 {"int32", EPX_PT_DTYPE_INT32},
                 {"float32", EPX_PT_DTYPE_FLOAT32},
                 {"float64", EPX_PT_DTYPE_FLOAT64}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0) {
            *dt = names[i].dt;
            return 1;
        }
    return 0;
}

int cmd_convert(int argc, char **argv) {
    cli_opt opts[] = {
        {"--dtype", "T",
         "counts dtype in a .pt output: auto (int64 when integral, else "
         "float64), int64, int32, float32, float64; a count the dtype cannot hold exactly (a "
         "whole number above 2^24 in float32, 2^31 or more in int32) is refused",
         NULL},
        {"--tree", NULL, "write the whole object tree of a .pt file as JSON", NULL},
        CLI_READ_OPTS_HELP,
        {NULL, NULL, NULL, NULL},
    };
    cli_cmd cmd = {"convert",
                   "epx convert IN OUT [--dtype T] [--stat-rows sum|windows] [--window-passes "
                   "N] | epx convert --tree IN.pt OUT.json",
                   "Convert SGLang mapping and counts files between .pt and .json (by "
                   "extension). IN may be a mapping, counts, a stat dump or per_pass dumps "
                   "(several ranks: a comma-separated list or a directory of .pt files), "
                   "which become [S][L][E] counts as epx plan and epx stats read them: a stat "
                   "dump's rows summed into one window (--stat-rows windows: each row a "
                   "window), one window per forward pass (--window-passes N: N a window).",
                   opts,
                   2,
                   {0},
                   0};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc >= 0) return rc;
    if (cmd.num_positional != 2) {
        fprintf(stderr, "epx convert: give IN and OUT; run 'epx convert --help'\n");
        return CLI_EXIT_USAGE;
    }
    const char *in = cmd.positional[0], *out = cmd.positional[1];
    if (!has_suffix(out, ".json") && !has_suffix(out, ".pt")) {
        fprintf(stderr,
                "epx convert: OUT '%s' must end in .json or .pt (the format follows the "
                "extension)\n",
                out);
        return CLI_EXIT_USAGE;
    }
    {
        const cli_out outs[] = {{out, false}};
        if ((rc = cli_outputs_check(&cmd, &in, 1, outs, 1)) >= 0) return rc;
    }
    epx_pt_dtype dt = EPX_PT_DTYPE_AUTO;
    const char *dts = cli_get(&cmd, "--dtype");
    if (dts != NULL && (!parse_dtype(dts, &dt) || !has_suffix(out, ".pt"))) {
        fprintf(stderr, "epx convert: --dtype takes auto, int64, int32, float32 or float64, and "
                        "only for a .pt OUT\n");
        return CLI_EXIT_USAGE;
    }
    /* The reader follows the content: a zip is .pt whatever its name. */
    const int in_file_pt = epx_pt_sniff(in);
    const int in_pt = in_file_pt || strchr(in, ',') != NULL || is_dir(in) ||
                      (has_suffix(in, ".pt") && access(in, F_OK) != 0);
    if (cli_flag(&cmd, "--tree")) {
        /* Any one existing file goes to the reader, which names what a
         * non-zip is (a legacy torch pickle, say); only the shape of the
         * call is refused here. */
        if (access(in, F_OK) != 0 || is_dir(in) || !has_suffix(out, ".json") || dts != NULL) {
            fprintf(stderr, "epx convert: --tree reads one .pt file and writes .json\n");
            return CLI_EXIT_USAGE;
        }
        return write_tree(&cmd, in, out);
    }

    epx_error err = {0};
    int32_t *map = NULL, L = 0, P = 0;
    epx_counts *c = NULL;
    char how[512] = "";
    epx_read_opts ro = EPX_READ_OPTS_INIT;
    ro.how = how;
    ro.how_cap = sizeof how;
    if (!cli_read_opts(&cmd, &ro)) return CLI_EXIT_USAGE;
    const bool read_opts = cli_get(&cmd, "--stat-rows") || cli_get(&cmd, "--window-passes");
    if (in_pt) {
        /* One .pt file: its keys say which it is. Several: per-rank dumps. */
        if (in_file_pt) {
            epx_pt_file *pf = NULL;
            if (epx_pt_load(in, &pf, &err) != EPX_OK) return cli_report(&cmd, &err);
            const epx_pt_value *root = epx_pt_file_root(pf);
            /* The mapping first, as SGLang's --init-expert-location and
             * epx_layout_init take it (the JSON path below too). */
            int is_map = epx_pt_dict_get(root, "physical_to_logical_map") != NULL &&
                         epx_pt_dict_get(root, "records") == NULL;
            if (is_map && epx_pt_dict_get(root, "logical_count") != NULL) both_forms_note(in);
            epx_status st = is_map ? epx_mapping_from_pt(pf, &map, &L, &P, &err) : EPX_OK;
            epx_pt_file_destroy(pf);
            if (st != EPX_OK) return cli_report(&cmd, &err);
            if (is_map) {
                if (write_counts_opts_unused(&cmd, read_opts)) {
                    epx_free(map); /* refused: the map read is not written */
                    return CLI_EXIT_USAGE;
                }
                return write_mapping(&cmd, map, L, P, dts, out);
            }
        }
        if (epx_counts_read_with(in, &ro, &c, &err) != EPX_OK) {
            /* A list or folder is read as counts: a mapping in it is
             * converted on its own (the reader's message cannot say so). */
            if (!in_file_pt && strstr(err.msg, "it is a placement") != NULL) {
                fprintf(stderr,
                        "epx convert: %s; a comma list or folder is read as counts or "
                        "per-rank dumps: convert each mapping on its own ('epx convert "
                        "MAP.pt MAP.json')\n",
                        err.msg);
                return CLI_EXIT_USAGE;
            }
            return cli_report(&cmd, &err);
        }
        printf("input: %s\n", how);
        return write_counts(&cmd, c, out, dt);
    }
    /* JSON: a mapping, else counts; when neither reads, say both reasons. */
    if (epx_mapping_read(in, &map, &L, &P, &err) == EPX_OK) {
        epx_counts *also = NULL;
        epx_error ignored = {0};
        if (epx_counts_read(in, &also, &ignored) == EPX_OK) both_forms_note(in);
        epx_counts_destroy(also);
        if (write_counts_opts_unused(&cmd, read_opts)) {
            epx_free(map);
            return CLI_EXIT_USAGE;
        }
        return write_mapping(&cmd, map, L, P, dts, out);
    }
    if (err.status == EPX_ERR_IO) return cli_report(&cmd, &err);
    epx_error err2 = {0};
    if (epx_counts_read_with(in, &ro, &c, &err2) == EPX_OK) {
        printf("input: %s\n", how);
        return write_counts(&cmd, c, out, dt);
    }
    /* A refused option is the answer, not "neither". */
    if (err2.status == EPX_ERR_INVALID_ARG) return cli_report(&cmd, &err2);
    fprintf(stderr, "epx convert: '%s' is neither a mapping (%s) nor counts (%s)\n", in, err.msg,
            err2.msg);
    return CLI_EXIT_USAGE;
}
