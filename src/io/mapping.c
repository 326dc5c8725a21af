/*
 * mapping.c - SGLang's placement mapping and counts files in JSON.
 *
 * SGLang's --init-expert-location takes a path (.json or .pt) or inline JSON
 * holding either "physical_to_logical_map" [L][P] or "logical_count"
 * [L][E] / [S][L][E]. Other keys are ignored on reading, as SGLang does; on
 * writing the mapping file holds that single key and nothing else, because
 * SGLang refuses extra keys there.
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "json_tensor.h"
#include "pt_hooks.h"

static const char MAP_KEY[] = "physical_to_logical_map";
static const char COUNT_KEY[] = "logical_count";

/* Every id below EPX_MAX_EXPERTS, so that callers may take max id + 1 as
 * the expert count: an id near INT32_MAX overflowed it, and the shape error
 * that followed blamed a count of -2^31 experts nobody gave. */
static epx_status check_map_ids(const int32_t *map, int32_t L, int32_t P, epx_error *err) {
    for (size_t i = 0; i < (size_t)L * (size_t)P; i++)
        if (map[i] >= EPX_MAX_EXPERTS)
            return epxi_fail(err, EPX_ERR_PARSE,
                             "layer %zu, slot %zu holds logical expert %d, past the %d experts "
                             "epx supports: the map is damaged, or not a physical_to_logical_map",
                             i / (size_t)P, i % (size_t)P, map[i], EPX_MAX_EXPERTS);
    return EPX_OK;
}

static epx_status mapping_from_object(const json_t *root, int32_t **map, int32_t *L, int32_t *P,
                                      epx_error *err) {
    const json_t *arr = json_object_get(root, MAP_KEY);
    if (arr == NULL) {
        if (json_object_get(root, COUNT_KEY) != NULL)
            return epxi_fail(err, EPX_ERR_PARSE,
                             "this holds '%s', not '%s': it is a counts file; plan a placement "
                             "from it (epx plan --counts)",
                             COUNT_KEY, MAP_KEY);
        return epxi_fail(err, EPX_ERR_PARSE, "no '%s' key in the JSON object", MAP_KEY);
    }
    epxi_json_tensor t;
    EPX_TRY(epxi_json_measure(arr, 2, 2, MAP_KEY, &t, err));
    if (t.dims[0] > EPX_MAX_LAYERS || t.dims[1] > 2 * EPX_MAX_EXPERTS)
        return epxi_fail(err, EPX_ERR_SHAPE, "'%s' is [%lld][%lld], above the limits [%d][%d]",
                         MAP_KEY, (long long)t.dims[0], (long long)t.dims[1], EPX_MAX_LAYERS,
                         2 * EPX_MAX_EXPERTS);
    int32_t *out = epxi_calloc(t.count, sizeof *out, MAP_KEY, err);
    if (out == NULL) return EPX_ERR_NOMEM;
    epx_status st = epxi_json_flatten_i32(arr, &t, EPXI_JSON_INDEX, MAP_KEY, out, err);
    if (st == EPX_OK) st = check_map_ids(out, (int32_t)t.dims[0], (int32_t)t.dims[1], err);
    if (st != EPX_OK) {
        free(out);
        return st;
    }
    *map = out;
    *L = (int32_t)t.dims[0];
    *P = (int32_t)t.dims[1];
    return EPX_OK;
}

epx_status epx_mapping_parse_json(const char *text, size_t len, int32_t **map, int32_t *L,
                                  int32_t *P, epx_error *err) {
    if (text == NULL || map == NULL || L == NULL || P == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    json_t *root = NULL;
    EPX_TRY(epxi_json_parse_object(text, len, "mapping", &root, err));
    epx_status st = mapping_from_object(root, map, L, P, err);
    json_decref(root);
    return st;
}

/* The reader follows the content (epx_pt_sniff); a name ending in .pt that
 * is no file (a comma list of ranks, a missing file) goes to the .pt reader,
 * which says what is wrong with it. */
static bool path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* epxi_json_load_spec, and for a name ending in .pt that is no zip archive
 * (so it was read as JSON) a message that says so, not only "not valid JSON". */
static epx_status load_json(const char *spec, json_t **root, epx_error *err) {
    epx_status st = epxi_json_load_spec(spec, root, err);
    if (st == EPX_OK || err == NULL || !epxi_has_suffix(spec, ".pt")) return st;
    char was[sizeof err->msg];
    snprintf(was, sizeof was, "%s", err->msg);
    return epxi_fail(err, st,
                     "'%.256s' is no PyTorch file (torch.save writes a zip archive), and read as "
                     "JSON: %s",
                     spec, was);
}

epx_status epx_mapping_read(const char *spec, int32_t **map, int32_t *L, int32_t *P,
                            epx_error *err) {
    if (spec == NULL || map == NULL || L == NULL || P == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    epx_status st;
    if (epx_pt_sniff(spec) || (epxi_has_suffix(spec, ".pt") && !path_exists(spec))) {
        st = epxi_pt_read_mapping(spec, map, L, P, err);
        if (st == EPX_OK && (st = check_map_ids(*map, *L, *P, err)) != EPX_OK) {
            epx_free(*map);
            *map = NULL;
            epxi_error_prefix(err, "'%.256s'", spec);
        }
        return st;
    }
    json_t *root = NULL;
    EPX_TRY(load_json(spec, &root, err));
    st = mapping_from_object(root, map, L, P, err);
    json_decref(root);
    if (st != EPX_OK && spec[0] != '{') epxi_error_prefix(err, "'%.256s'", spec);
    return st;
}

static epx_status write_mapping_body(FILE *f, const void *ctx, epx_error *err) {
    (void)err;
    const epx_layout *lay = ctx;
    const epx_shape *s = epx_layout_shape(lay);
    const int32_t *m = epx_layout_physical_to_logical(lay);
    fprintf(f, "{\"%s\": [\n", MAP_KEY);
    for (int32_t l = 0; l < s->num_layers; l++) {
        fputc('[', f);
        for (int32_t p = 0; p < s->num_physical_experts; p++)
            fprintf(f, p ? ", %d" : "%d",
                    m[(size_t)l * (size_t)s->num_physical_experts + (size_t)p]);
        fputs(l + 1 < s->num_layers ? "],\n" : "]\n", f);
    }
    fputs("]}\n", f);
    return ferror(f) ? EPX_ERR_IO : EPX_OK;
}

epx_status epx_layout_write_json(const epx_layout *lay, const char *path, epx_error *err) {
    if (lay == NULL || path == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    return epxi_write_atomically(path, write_mapping_body, lay, err);
}

/* A stat dump in JSON ("rank" and "average_utilization_rate_over_window"
 * beside logical_count [B][L][E], e.g. from epx convert --tree): its rows are
 * a ring buffer in no time order, read as one window, their sum, unless cfg
 * asks for rows as windows (the .pt reader does the same). */
static epx_status counts_from_object(const json_t *root, const epxi_read_cfg *cfg, epx_counts **out,
                                     epx_error *err) {
    const json_t *arr = json_object_get(root, COUNT_KEY);
    if (arr == NULL) {
        if (json_object_get(root, MAP_KEY) != NULL)
            return epxi_fail(err, EPX_ERR_PARSE,
                             "this holds '%s', not '%s': it is a placement, not a load; counts "
                             "go here",
                             MAP_KEY, COUNT_KEY);
        return epxi_fail(err, EPX_ERR_PARSE, "no '%s' key in the JSON object", COUNT_KEY);
    }
    epxi_json_tensor t;
    EPX_TRY(epxi_json_measure(arr, 2, 3, COUNT_KEY, &t, err));
    int64_t S = t.rank == 3 ? t.dims[0] : 1;
    int64_t L = t.dims[t.rank - 2], E = t.dims[t.rank - 1];
    if (S > (1 << 24) || L > EPX_MAX_LAYERS || E > EPX_MAX_EXPERTS)
        return epxi_fail(err, EPX_ERR_SHAPE, "'%s' shape is above the limits", COUNT_KEY);
    epx_counts *c = NULL;
    EPX_TRY(epx_counts_create((int32_t)S, (int32_t)L, (int32_t)E, &c, err));
    epx_status st = epxi_json_flatten_f64(arr, &t, COUNT_KEY, c->data, err);
    if (st != EPX_OK) {
        epx_counts_destroy(c);
        return st;
    }
    const bool stat = t.rank == 3 && (json_object_get(root, "rank") != NULL &&
                                      json_object_get(root, "average_utilization_rate_over_"
                                                            "window") != NULL);
    if ((st = epxi_read_cfg_applies(cfg, false, stat, err)) != EPX_OK) {
        epx_counts_destroy(c);
        return st;
    }
    const size_t le = (size_t)L * (size_t)E;
    size_t nonzero = 0;
    for (size_t r = 0; stat && r < (size_t)S; r++) {
        bool any = false;
        for (size_t j = 0; j < le && !any; j++) any = c->data[r * le + j] != 0.0;
        nonzero += any;
    }
    if (stat && !cfg->stat_rows_as_windows) {
        for (size_t r = 1; r < (size_t)S; r++)
            for (size_t j = 0; j < le; j++) c->data[j] += c->data[r * le + j];
        c->num_windows = 1;
    }
    if (cfg->how != NULL && cfg->how_cap > 0) {
        if (stat && !cfg->stat_rows_as_windows)
            snprintf(cfg->how, cfg->how_cap,
                     "stat dump (SGLang's ring buffer: row order carries no time): %zu of %lld "
                     "rows non-zero, summed into one window (zero rows were never written)",
                     nonzero, (long long)S);
        else if (stat)
            snprintf(cfg->how, cfg->how_cap,
                     "stat dump read row by row as time-ordered windows (%zu of %lld rows "
                     "non-zero): %lld windows",
                     nonzero, (long long)S, (long long)S);
        else
            snprintf(cfg->how, cfg->how_cap, "logical_count: %d time-ordered window%s",
                     c->num_windows, c->num_windows > 1 ? "s" : "");
    }
    *out = c;
    return EPX_OK;
}

epx_status epx_counts_read(const char *spec, epx_counts **out, epx_error *err) {
    return epx_counts_read_progress(spec, NULL, NULL, out, err);
}

static epx_status read_counts(const char *spec, const epxi_read_cfg *cfg, epx_counts **out,
                              epx_error *err);

epx_status epx_counts_read_with(const char *spec, const epx_read_opts *opts, epx_counts **out,
                                epx_error *err) {
    if (opts == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "opts is NULL");
    EPX_TRY(epxi_check_version(opts->version, EPX_READ_OPTS_VERSION, "epx_read_opts",
                               "EPX_READ_OPTS_INIT", err));
    if (opts->window_passes < 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "window_passes (%d) is negative: use 0 (one window per forward pass) "
                         "or the number of passes per window",
                         opts->window_passes);
    if (opts->stat_rows != EPX_STAT_ROWS_SUM && opts->stat_rows != EPX_STAT_ROWS_WINDOWS &&
        opts->stat_rows != EPX_STAT_ROWS_WINDOWS_IF_STAT)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "stat_rows (%d) is not a known mode",
                         (int)opts->stat_rows);
    const epxi_read_cfg cfg = {opts->window_passes,
                               opts->stat_rows != EPX_STAT_ROWS_SUM,
                               opts->progress,
                               opts->progress_user,
                               opts->how,
                               opts->how_cap,
                               true,
                               opts->stat_rows == EPX_STAT_ROWS_WINDOWS};
    if (opts->how != NULL && opts->how_cap > 0) opts->how[0] = '\0';
    return read_counts(spec, &cfg, out, err);
}

/* A folder holds one per_pass dump per rank. */
static bool is_directory(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The old entry points read rows as windows, one window per forward pass. */
epx_status epx_counts_read_progress(const char *spec, epx_progress_fn progress, void *user,
                                    epx_counts **out, epx_error *err) {
    const epxi_read_cfg raw = {0, true, progress, user, NULL, 0, false, false};
    return read_counts(spec, &raw, out, err);
}

static epx_status read_counts(const char *spec, const epxi_read_cfg *cfg, epx_counts **out,
                              epx_error *err) {
    if (spec == NULL || out == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    if (epx_pt_sniff(spec) || is_directory(spec) ||
        (epxi_has_suffix(spec, ".pt") && !path_exists(spec)))
        return epxi_pt_read_counts(spec, cfg, out, err);
    json_t *root = NULL;
    epx_status lst = load_json(spec, &root, err);
    if (lst == EPX_ERR_IO && strchr(spec, ',') != NULL && spec[0] != '{' && !path_exists(spec))
        /* a list of JSON files: say what a list may name */
        return epxi_fail(err, EPX_ERR_IO,
                         "cannot open '%.256s': no such file, and a comma list names SGLang's "
                         ".pt dumps (one per rank), each ending in .pt: give one JSON counts file",
                         spec);
    EPX_TRY(lst);
    epx_status st = counts_from_object(root, cfg, out, err);
    json_decref(root);
    if (st == EPX_OK && (st = epxi_counts_check_total(*out, err)) != EPX_OK) {
        epx_counts_destroy(*out);
        *out = NULL;
    }
    if (st != EPX_OK && spec[0] != '{') epxi_error_prefix(err, "'%.256s'", spec);
    return st;
}

static void write_load(FILE *f, double x) {
    /* Integral loads print as integers, so token counts round-trip exactly
     * and read back as integers (2^60 too: every integral double below 2^63
     * is an int64). The range test comes first: casting 1e300 to int64 is
     * undefined. */
    if (x > -0x1p63 && x < 0x1p63 && x == (double)(int64_t)x)
        fprintf(f, "%lld", (long long)x);
    else
        fprintf(f, "%.17g", x);
}

static epx_status write_counts_body(FILE *f, const void *ctx, epx_error *err) {
    (void)err;
    const epx_counts *c = ctx;
    fprintf(f, "{\"%s\": ", COUNT_KEY);
    if (c->num_windows > 1) fputs("[\n", f);
    for (int32_t s = 0; s < c->num_windows; s++) {
        fputs("[\n", f);
        for (int32_t l = 0; l < c->num_layers; l++) {
            const double *row = epx_counts_row(c, s, l);
            fputc('[', f);
            for (int32_t e = 0; e < c->num_experts; e++) {
                if (e) fputs(", ", f);
                write_load(f, row[e]);
            }
            fputs(l + 1 < c->num_layers ? "],\n" : "]\n", f);
        }
        fputs(s + 1 < c->num_windows ? "],\n" : "]", f);
    }
    if (c->num_windows > 1) fputs("\n]", f);
    fputs("}\n", f);
    return ferror(f) ? EPX_ERR_IO : EPX_OK;
}

epx_status epx_counts_write_json(const epx_counts *c, const char *path, epx_error *err) {
    if (path == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    /* a shape of no windows wrote {"logical_count": }, not JSON */
    EPX_TRY(epxi_counts_valid(c, "epx_counts_write_json", err));
    /* only what the readers take back: a NaN was written as bare nan (not
     * JSON), a negative load as one every reader refuses */
    EPX_TRY(epxi_check_loads(
        c->data, (size_t)c->num_windows * (size_t)c->num_layers * (size_t)c->num_experts, "counts",
        err));
    return epxi_write_atomically(path, write_counts_body, c, err);
}
