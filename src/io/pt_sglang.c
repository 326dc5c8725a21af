/*
 * pt_sglang.c - SGLang's .pt files on top of the generic reader: init files
 * (physical_to_logical_map or logical_count) and the expert-distribution
 * recorder's dumps, and the pt_hooks.h entry points the JSON-facing readers
 * call for a spec ending in .pt.
 *
 * SGLang's recorder (srt/eplb/expert_distribution.py) writes two dump
 * shapes. Stat mode: rank 0 writes {"rank", "logical_count" int32
 * [B][L][E] (already all-reduced over ranks), "average_utilization_rate_
 * over_window"}. per_pass mode: every rank writes {"records": [{forward_
 * pass_id, rank, gatherer_key, global_physical_count int32 [L][P], ...}],
 * "last_physical_to_logical_map" int64 [L][P]}; SGLang's own reader sums
 * the ranks of each pass and maps physical slots to logical experts with a
 * scatter-add over the map. Both are reproduced here, with the checks its
 * asserts would make turned into messages.
 *
 * A stat dump's rows are a ring buffer of per-pass counts, not windows: once
 * it wraps they are out of time order, and rows never written are zeros. So
 * for planning (epx_counts_read_with) a stat dump is one window, the sum of
 * its rows; per_pass dumps are ordered by forward_pass_id and may be grouped
 * several passes to a window. The older entry points keep reading rows and
 * passes as windows (lossless; epx convert reads as planning does, rows
 * as windows on request).
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "pt_hooks.h"
#include "pt_internal.h"

static const char MAP_KEY[] = "physical_to_logical_map";
static const char COUNT_KEY[] = "logical_count";
static const char RECORDS_KEY[] = "records";
static const char LAST_MAP_KEY[] = "last_physical_to_logical_map";

/* Up to a few of the root's string keys, for "no such key" messages. */
static void list_keys(const epx_pt_value *root, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < epx_pt_value_len(root) && i < 6 && n + 1 < cap; i++) {
        const char *k = epx_pt_value_string(epx_pt_dict_key(root, i), NULL);
        n += (size_t)snprintf(buf + n, cap - n, "%s'%.40s'", i ? ", " : "", k ? k : "?");
        if (n >= cap) n = cap - 1;
    }
    if (epx_pt_value_len(root) > 6 && n + 6 < cap) snprintf(buf + n, cap - n, ", ...");
    if (epx_pt_value_len(root) == 0) snprintf(buf, cap, "none, an empty dict");
}

static epx_status root_dict(const epx_pt_file *f, const epx_pt_value **root, epx_error *err) {
    *root = epx_pt_file_root(f);
    if (epx_pt_value_kind(*root) != EPX_PT_DICT)
        return epxi_fail(err, EPX_ERR_PARSE,
                         "'%s' holds a %s, not a dict: not an SGLang init file or dump",
                         epx_pt_file_name(f), epx_pt_kind_str(epx_pt_value_kind(*root)));
    return EPX_OK;
}

/* A tensor of rank in [lo, hi] under `key`, described into *t. */
static epx_status get_tensor(const epx_pt_file *f, const epx_pt_value *v, const char *key, int lo,
                             int hi, epx_pt_tensor *t, epx_error *err) {
    if (epx_pt_value_kind(v) != EPX_PT_TENSOR)
        return epxi_fail(err, EPX_ERR_PARSE, "'%s': '%s' is a %s, not a tensor",
                         epx_pt_file_name(f), key, epx_pt_kind_str(epx_pt_value_kind(v)));
    EPX_TRY(epx_pt_value_tensor(v, t, err));
    if (t->ndim < lo || t->ndim > hi)
        return epxi_fail(err, EPX_ERR_PARSE, "'%s': '%s' has %d dimensions, expected %d%s%d",
                         epx_pt_file_name(f), key, t->ndim, lo, lo == hi ? " (" : " to ", hi);
    for (int32_t d = 0; d < t->ndim; d++)
        if (t->shape[d] == 0)
            return epxi_fail(err, EPX_ERR_PARSE, "'%s': '%s' is empty (dimension %d is 0)",
                             epx_pt_file_name(f), key, d);
    return EPX_OK;
}

/* Ids of an [L][P] map tensor into int32, each in [0, limit). */
static epx_status map_ids(const epx_pt_file *f, const epx_pt_tensor *t, const char *key,
                          int64_t limit, int32_t *out, epx_error *err) {
    const int64_t L = t->shape[0], P = t->shape[1];
    if (L > EPX_MAX_LAYERS || P > 2 * EPX_MAX_EXPERTS)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "'%s': '%s' is [%lld][%lld], above the limits [%d][%d]",
                         epx_pt_file_name(f), key, (long long)L, (long long)P, EPX_MAX_LAYERS,
                         2 * EPX_MAX_EXPERTS);
    const size_t n = (size_t)L * (size_t)P;
    int64_t *tmp = epxi_calloc(n, sizeof *tmp, key, err);
    if (tmp == NULL) return EPX_ERR_NOMEM;
    epx_status st = epx_pt_tensor_to_i64(t, tmp, n, err);
    if (st != EPX_OK) epxi_error_prefix(err, "'%s': '%s'", epx_pt_file_name(f), key);
    for (size_t i = 0; st == EPX_OK && i < n; i++) {
        if (tmp[i] < 0 || tmp[i] >= limit)
            st = epxi_fail(err, EPX_ERR_PARSE, "'%s': '%s'[%zu][%zu] is %lld, outside [0, %lld]",
                           epx_pt_file_name(f), key, i / (size_t)P, i % (size_t)P,
                           (long long)tmp[i], (long long)limit - 1);
        else
            out[i] = (int32_t)tmp[i];
    }
    free(tmp);
    return st;
}

epx_status epx_mapping_from_pt(const epx_pt_file *f, int32_t **map, int32_t *L, int32_t *P,
                               epx_error *err) {
    if (f == NULL || map == NULL || L == NULL || P == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    const epx_pt_value *root;
    EPX_TRY(root_dict(f, &root, err));
    const epx_pt_value *v = epx_pt_dict_get(root, MAP_KEY);
    if (v == NULL) {
        if (epx_pt_dict_get(root, COUNT_KEY) != NULL)
            return epxi_fail(err, EPX_ERR_PARSE,
                             "'%s' holds '%s', not '%s': it is a counts file; plan a placement "
                             "from it (epx plan --counts)",
                             epx_pt_file_name(f), COUNT_KEY, MAP_KEY);
        if (epx_pt_dict_get(root, RECORDS_KEY) != NULL)
            return epxi_fail(err, EPX_ERR_PARSE,
                             "'%s' holds '%s', not '%s': it is a counts file (an SGLang "
                             "per_pass dump); plan a placement from it (epx plan --counts)",
                             epx_pt_file_name(f), RECORDS_KEY, MAP_KEY);
        char keys[256];
        list_keys(root, keys, sizeof keys);
        return epxi_fail(err, EPX_ERR_PARSE, "'%s' has no '%s' key (its keys: %s)",
                         epx_pt_file_name(f), MAP_KEY, keys);
    }
    epx_pt_tensor t;
    EPX_TRY(get_tensor(f, v, MAP_KEY, 2, 2, &t, err));
    if (t.shape[0] > EPX_MAX_LAYERS || t.shape[1] > 2 * EPX_MAX_EXPERTS)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "'%s': '%s' is [%lld][%lld], above the limits [%d][%d]",
                         epx_pt_file_name(f), MAP_KEY, (long long)t.shape[0], (long long)t.shape[1],
                         EPX_MAX_LAYERS, 2 * EPX_MAX_EXPERTS);
    int32_t *out = epxi_calloc((size_t)t.shape[0] * (size_t)t.shape[1], sizeof *out, MAP_KEY, err);
    if (out == NULL) return EPX_ERR_NOMEM;
    epx_status st = map_ids(f, &t, MAP_KEY, (int64_t)INT32_MAX + 1, out, err);
    if (st != EPX_OK) {
        free(out);
        return st;
    }
    *map = out;
    *L = (int32_t)t.shape[0];
    *P = (int32_t)t.shape[1];
    return EPX_OK;
}

/* ---- counts ------------------------------------------------------------- */

typedef enum { KIND_LOGICAL, KIND_PER_PASS, KIND_STAT } file_kind;

/* What a read found, for the sentence that says how the input was read. */
typedef struct {
    size_t files, stat_files, stat_rows, stat_nonzero, records;
    int64_t windows, passes, first_pass, last_pass;
} read_info;

/* A stat dump, as SGLang's recorder writes it in stat mode: logical_count
 * [B][L][E] beside "rank" and "average_utilization_rate_over_window". Its B
 * rows are a ring buffer of per-pass counts: once it wraps they are not in
 * time order, and rows never written are zeros. An init file's or epx's own
 * logical_count [S][L][E] lacks those keys and is S time-ordered windows. */
static bool is_stat_dump(const epx_pt_file *f) {
    const epx_pt_value *root = epx_pt_file_root(f);
    return epx_pt_dict_get(root, "rank") != NULL &&
           epx_pt_dict_get(root, "average_utilization_rate_over_window") != NULL;
}

static epx_status classify(const epx_pt_file *f, file_kind *kind, epx_error *err) {
    const epx_pt_value *root;
    EPX_TRY(root_dict(f, &root, err));
    if (epx_pt_dict_get(root, RECORDS_KEY) != NULL)
        *kind = KIND_PER_PASS;
    else if (epx_pt_dict_get(root, COUNT_KEY) != NULL)
        *kind = is_stat_dump(f) ? KIND_STAT : KIND_LOGICAL;
    else if (epx_pt_dict_get(root, MAP_KEY) != NULL)
        return epxi_fail(err, EPX_ERR_PARSE,
                         "'%s' holds '%s', not '%s': it is a placement, not a load; counts go "
                         "here",
                         epx_pt_file_name(f), MAP_KEY, COUNT_KEY);
    else {
        char keys[256];
        list_keys(root, keys, sizeof keys);
        return epxi_fail(err, EPX_ERR_PARSE,
                         "'%s' has neither '%s' (an init file or stat dump) nor '%s' (a "
                         "per_pass dump); its keys: %s",
                         epx_pt_file_name(f), COUNT_KEY, RECORDS_KEY, keys);
    }
    return EPX_OK;
}

static epx_status check_loads(const epx_pt_file *f, const char *key, const double *x, size_t n,
                              int64_t L, int64_t E, epx_error *err) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]) || x[i] < 0) {
            size_t le = (size_t)L * (size_t)E;
            return epxi_fail(err, EPX_ERR_PARSE,
                             "'%s': '%s'[%zu][%zu][%zu] is %g: loads must be finite and "
                             "non-negative",
                             epx_pt_file_name(f), key, i / le, (i % le) / (size_t)E, i % (size_t)E,
                             x[i]);
        }
    return EPX_OK;
}

/* An int64 count past 2^53 that the double x[i] does not hold exactly is
 * refused, naming it: the loads are doubles, and a count rounded on
 * reading would be written back changed. x[] came from t (n values). */
static epx_status check_exact(const epx_pt_file *f, const char *key, const epx_pt_tensor *t,
                              const double *x, size_t n, epx_error *err) {
    if (t->dtype != EPX_PT_DTYPE_INT64) return EPX_OK;
    size_t big = 0;
    while (big < n && x[big] < 0x1p53) big++;
    if (big == n) return EPX_OK; /* the usual case: nothing to re-read */
    int64_t *v = epxi_calloc(n, sizeof *v, key, err);
    if (v == NULL) return EPX_ERR_NOMEM;
    epx_status st = epx_pt_tensor_to_i64(t, v, n, err);
    for (size_t i = big; i < n && st == EPX_OK; i++)
        if (x[i] >= 0x1p63 || (int64_t)x[i] != v[i])
            st = epxi_fail(err, EPX_ERR_PARSE,
                           "'%s': '%s' element %zu is %lld, which epx's loads (doubles) cannot "
                           "hold exactly (it would read as %.17g): counts above 2^53 must be "
                           "scaled down",
                           epx_pt_file_name(f), key, i, (long long)v[i], x[i]);
    free(v);
    return st;
}

/* FNV-1a over a dump's rows (their bits and count): equal for the same
 * dump given twice (its path twice, or a copy), and 2^-64 likely for two
 * dumps that differ. */
static uint64_t rows_fingerprint(const double *x, size_t n) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)n;
    for (size_t i = 0; i < n; i++) {
        uint64_t b;
        memcpy(&b, &x[i], sizeof b);
        for (int k = 0; k < 8; k++) h = (h ^ ((b >> (8 * k)) & 0xff)) * 1099511628211ull;
    }
    return h;
}

/* Stat dump i (rows x[0..n)) against the stat dumps before it: fp[j] holds
 * their fingerprints (0 for files that are no stat dump). */
static epx_status check_repeat(const epx_pt_file *const *files, size_t i, uint64_t *fp,
                               const double *x, size_t n, epx_error *err) {
    fp[i] = rows_fingerprint(x, n) | 1; /* never 0 */
    for (size_t j = 0; j < i; j++)
        if (fp[j] == fp[i])
            return epxi_fail(err, EPX_ERR_PARSE,
                             "'%s' and '%s' hold the same stat dump (every row equal): its "
                             "passes would be counted twice; give each dump once",
                             epx_pt_file_name(files[j]), epx_pt_file_name(files[i]));
    return EPX_OK;
}

/* logical_count files: windows concatenated in the order given. A stat
 * dump is one window, the sum of its rows (its row order carries no time,
 * and zero rows add nothing), unless cfg asks for its rows as windows. */
static epx_status counts_logical(const epx_pt_file *const *files, size_t nf,
                                 const epxi_read_cfg *cfg, epx_counts **out, read_info *info,
                                 epx_error *err) {
    int64_t S = 0, L = 0, E = 0;
    for (size_t i = 0; i < nf; i++) {
        epx_pt_tensor t;
        EPX_TRY(get_tensor(files[i], epx_pt_dict_get(epx_pt_file_root(files[i]), COUNT_KEY),
                           COUNT_KEY, 2, 3, &t, err));
        int64_t s = t.ndim == 3 ? t.shape[0] : 1;
        if (is_stat_dump(files[i])) {
            info->stat_files++;
            info->stat_rows += (size_t)s;
            if (!cfg->stat_rows_as_windows) s = 1;
        }
        int64_t l = t.shape[t.ndim - 2], e = t.shape[t.ndim - 1];
        if (i == 0)
            L = l, E = e;
        else if (l != L || e != E)
            return epxi_fail(err, EPX_ERR_SHAPE,
                             "'%s': '%s' is [%lld][%lld] per window but '%s' has [%lld][%lld]",
                             epx_pt_file_name(files[i]), COUNT_KEY, (long long)l, (long long)e,
                             epx_pt_file_name(files[0]), (long long)L, (long long)E);
        S += s;
    }
    if (S > (1 << 24) || L > EPX_MAX_LAYERS || E > EPX_MAX_EXPERTS)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "'%s' is [%lld][%lld][%lld], above the limits [%d][%d][%d]", COUNT_KEY,
                         (long long)S, (long long)L, (long long)E, 1 << 24, EPX_MAX_LAYERS,
                         EPX_MAX_EXPERTS);
    epx_counts *c = NULL;
    EPX_TRY(epx_counts_create((int32_t)S, (int32_t)L, (int32_t)E, &c, err));
    const size_t le = (size_t)L * (size_t)E;
    double *rows = NULL; /* a stat dump's rows, before they are summed */
    size_t at = 0;
    epx_status st = EPX_OK;
    uint64_t *fp = epxi_calloc(nf, sizeof *fp, "stat dump fingerprints", err);
    if (fp == NULL) {
        epx_counts_destroy(c);
        return EPX_ERR_NOMEM;
    }
    for (size_t i = 0; i < nf && st == EPX_OK; i++) {
        epx_pt_tensor t;
        epx_pt_value_tensor(epx_pt_dict_get(epx_pt_file_root(files[i]), COUNT_KEY), &t, NULL);
        int64_t numel = 0;
        st = epx_pt_tensor_numel(&t, &numel, err);
        const bool sum = is_stat_dump(files[i]) && !cfg->stat_rows_as_windows;
        double *dst = c->data + at;
        if (st == EPX_OK && sum) {
            free(rows);
            if ((rows = epxi_calloc((size_t)numel, sizeof *rows, COUNT_KEY, err)) == NULL)
                st = EPX_ERR_NOMEM;
            dst = rows;
        }
        if (st == EPX_OK) st = epx_pt_tensor_to_f64(&t, dst, (size_t)numel, err);
        if (st != EPX_OK)
            epxi_error_prefix(err, "'%s': '%s'", epx_pt_file_name(files[i]), COUNT_KEY);
        if (st == EPX_OK) st = check_loads(files[i], COUNT_KEY, dst, (size_t)numel, L, E, err);
        if (st == EPX_OK) st = check_exact(files[i], COUNT_KEY, &t, dst, (size_t)numel, err);
        if (st == EPX_OK && is_stat_dump(files[i])) {
            /* The same dump twice would count its passes twice: SGLang's
             * stat dump is already summed over ranks, so no two dumps of
             * one recording hold the same rows (the per_pass reader refuses
             * a pass recorded twice likewise). */
            st = check_repeat(files, i, fp, dst, (size_t)numel, err);
        }
        if (st == EPX_OK && is_stat_dump(files[i]))
            for (size_t r = 0; r < (size_t)numel / le; r++) {
                bool any = false;
                for (size_t j = 0; j < le && !any; j++) any = dst[r * le + j] != 0.0;
                info->stat_nonzero += any;
            }
        if (st == EPX_OK && sum) {
            for (size_t r = 0; r < (size_t)numel / le; r++)
                for (size_t j = 0; j < le; j++) c->data[at + j] += rows[r * le + j];
            numel = (int64_t)le;
        }
        at += (size_t)numel;
    }
    free(rows);
    free(fp);
    if (st != EPX_OK) {
        epx_counts_destroy(c);
        return st;
    }
    info->windows = S;
    *out = c;
    return EPX_OK;
}

typedef struct {
    int64_t pass, rank;
    size_t file;
    const epx_pt_value *gpc;
} record_ref;

static int cmp_record(const void *a, const void *b) {
    const record_ref *x = a, *y = b;
    if (x->pass != y->pass) return x->pass < y->pass ? -1 : 1;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return (x->file > y->file) - (x->file < y->file);
}

static epx_status int_field(const epx_pt_file *f, const epx_pt_value *rec, size_t r,
                            const char *key, int64_t *out, epx_error *err) {
    if (epx_pt_value_int(epx_pt_dict_get(rec, key), out, NULL) != EPX_OK)
        return epxi_fail(err, EPX_ERR_PARSE, "'%s': records[%zu] has no int '%s'",
                         epx_pt_file_name(f), r, key);
    return EPX_OK;
}

/* Gather every record of every file, checking its shape against the map. */
static epx_status gather_records(const epx_pt_file *const *files, size_t nf, int64_t L, int64_t P,
                                 record_ref **out, size_t *nout, epx_error *err) {
    size_t total = 0;
    for (size_t i = 0; i < nf; i++) {
        const epx_pt_value *recs = epx_pt_dict_get(epx_pt_file_root(files[i]), RECORDS_KEY);
        if (epx_pt_value_kind(recs) != EPX_PT_LIST && epx_pt_value_kind(recs) != EPX_PT_TUPLE)
            return epxi_fail(err, EPX_ERR_PARSE, "'%s': '%s' is a %s, not a list",
                             epx_pt_file_name(files[i]), RECORDS_KEY,
                             epx_pt_kind_str(epx_pt_value_kind(recs)));
        total += epx_pt_value_len(recs);
    }
    if (total == 0)
        return epxi_fail(err, EPX_ERR_PARSE,
                         "the per_pass dump%s hold%s no records: nothing was recorded between "
                         "start and dump",
                         nf > 1 ? "s" : "", nf > 1 ? "" : "s");
    record_ref *refs = epxi_calloc(total, sizeof *refs, "records", err);
    if (refs == NULL) return EPX_ERR_NOMEM;
    size_t k = 0;
    epx_status st = EPX_OK;
    for (size_t i = 0; i < nf && st == EPX_OK; i++) {
        const epx_pt_value *recs = epx_pt_dict_get(epx_pt_file_root(files[i]), RECORDS_KEY);
        for (size_t r = 0; r < epx_pt_value_len(recs) && st == EPX_OK; r++) {
            const epx_pt_value *rec = epx_pt_value_item(recs, r);
            if (epx_pt_value_kind(rec) != EPX_PT_DICT) {
                st = epxi_fail(err, EPX_ERR_PARSE, "'%s': records[%zu] is a %s, not a dict",
                               epx_pt_file_name(files[i]), r,
                               epx_pt_kind_str(epx_pt_value_kind(rec)));
                break;
            }
            record_ref *x = &refs[k++];
            x->file = i;
            x->gpc = epx_pt_dict_get(rec, "global_physical_count");
            st = int_field(files[i], rec, r, "forward_pass_id", &x->pass, err);
            if (st == EPX_OK) st = int_field(files[i], rec, r, "rank", &x->rank, err);
            epx_pt_tensor t;
            if (st == EPX_OK)
                st = get_tensor(files[i], x->gpc, "global_physical_count", 2, 2, &t, err);
            if (st == EPX_OK && (t.shape[0] != L || t.shape[1] != P))
                st = epxi_fail(err, EPX_ERR_SHAPE,
                               "'%s': records[%zu].global_physical_count is [%lld][%lld] but "
                               "the map is [%lld][%lld]",
                               epx_pt_file_name(files[i]), r, (long long)t.shape[0],
                               (long long)t.shape[1], (long long)L, (long long)P);
        }
    }
    if (st != EPX_OK) {
        free(refs);
        return st;
    }
    qsort(refs, total, sizeof *refs, cmp_record);
    for (size_t i = 1; i < total; i++)
        if (refs[i].pass == refs[i - 1].pass && refs[i].rank == refs[i - 1].rank) {
            st = epxi_fail(err, EPX_ERR_PARSE,
                           "forward pass %lld of rank %lld is recorded twice ('%s' and '%s'): "
                           "give each rank's dump once",
                           (long long)refs[i].pass, (long long)refs[i].rank,
                           epx_pt_file_name(files[refs[i - 1].file]),
                           epx_pt_file_name(files[refs[i].file]));
            free(refs);
            return st;
        }
    *out = refs;
    *nout = total;
    return EPX_OK;
}

/* The shared map of per_pass files: every file must carry the same one. */
static epx_status per_pass_map(const epx_pt_file *const *files, size_t nf, int32_t **map,
                               int64_t *L, int64_t *P, epx_error *err) {
    int32_t *first = NULL, *other = NULL;
    epx_status st = EPX_OK;
    for (size_t i = 0; i < nf && st == EPX_OK; i++) {
        epx_pt_tensor t;
        const epx_pt_value *v = epx_pt_dict_get(epx_pt_file_root(files[i]), LAST_MAP_KEY);
        if (v == NULL) {
            st = epxi_fail(err, EPX_ERR_PARSE,
                           "'%s' has '%s' but no '%s': its slots cannot be mapped to experts",
                           epx_pt_file_name(files[i]), RECORDS_KEY, LAST_MAP_KEY);
            break;
        }
        st = get_tensor(files[i], v, LAST_MAP_KEY, 2, 2, &t, err);
        if (st != EPX_OK) break;
        if (i == 0) {
            *L = t.shape[0], *P = t.shape[1];
            if (*L > EPX_MAX_LAYERS || *P > 2 * EPX_MAX_EXPERTS) {
                st = epxi_fail(err, EPX_ERR_SHAPE, "'%s': '%s' is [%lld][%lld], above the limits",
                               epx_pt_file_name(files[i]), LAST_MAP_KEY, (long long)*L,
                               (long long)*P);
                break;
            }
        } else if (t.shape[0] != *L || t.shape[1] != *P) {
            st = epxi_fail(
                err, EPX_ERR_SHAPE, "'%s': '%s' is [%lld][%lld] but '%s' has [%lld][%lld]",
                epx_pt_file_name(files[i]), LAST_MAP_KEY, (long long)t.shape[0],
                (long long)t.shape[1], epx_pt_file_name(files[0]), (long long)*L, (long long)*P);
            break;
        }
        const size_t n = (size_t)*L * (size_t)*P;
        if (i == 0)
            first = epxi_calloc(n, sizeof *first, LAST_MAP_KEY, err);
        else if (other == NULL)
            other = epxi_calloc(n, sizeof *other, LAST_MAP_KEY, err);
        int32_t *dst = i == 0 ? first : other;
        if (dst == NULL) {
            st = EPX_ERR_NOMEM;
            break;
        }
        st = map_ids(files[i], &t, LAST_MAP_KEY, EPX_MAX_EXPERTS, dst, err);
        if (st == EPX_OK && i > 0 && memcmp(first, other, n * sizeof *first) != 0)
            st = epxi_fail(err, EPX_ERR_PARSE,
                           "'%s' and '%s' carry different '%s': the placement changed during "
                           "recording; convert the dumps of each placement separately",
                           epx_pt_file_name(files[0]), epx_pt_file_name(files[i]), LAST_MAP_KEY);
    }
    free(other);
    if (st != EPX_OK) {
        free(first);
        return st;
    }
    *map = first;
    return EPX_OK;
}

/* n's divisors in increasing order: "1, 2, 4, 8" (the first eight, then
 * "..., n"). */
static void list_divisors(size_t n, char *buf, size_t cap) {
    size_t at = 0, shown = 0;
    buf[0] = '\0';
    for (size_t d = 1; d <= n && at + 24 < cap; d++) {
        if (n % d != 0) continue;
        if (shown == 8 && d != n) {
            snprintf(buf + at, cap - at, ", ..., %zu", n);
            return;
        }
        at += (size_t)snprintf(buf + at, cap - at, "%s%zu", shown ? ", " : "", d);
        shown++;
    }
}

static epx_status counts_per_pass(const epx_pt_file *const *files, size_t nf,
                                  const epxi_read_cfg *cfg, epx_counts **out, read_info *info,
                                  epx_error *err) {
    int32_t *map = NULL;
    int64_t L = 0, P = 0;
    EPX_TRY(per_pass_map(files, nf, &map, &L, &P, err));
    record_ref *refs = NULL;
    size_t nrec = 0;
    epx_status st = gather_records(files, nf, L, P, &refs, &nrec, err);
    if (st != EPX_OK) {
        free(map);
        return st;
    }
    const size_t lp = (size_t)L * (size_t)P;
    int32_t E = 0;
    for (size_t i = 0; i < lp; i++)
        if (map[i] + 1 > E) E = map[i] + 1;
    size_t passes = 1;
    for (size_t i = 1; i < nrec; i++) passes += refs[i].pass != refs[i - 1].pass;
    /* Passes in forward_pass_id order, grouped window_passes at a time.
     * epx_read_opts' callers get equal windows only: a short last window
     * (or one window of fewer passes than asked) is not what was asked for.
     * The old entry points group nothing (one pass a window). */
    const size_t per = cfg->window_passes > 0 ? (size_t)cfg->window_passes : 1;
    if (cfg->strict && passes % per != 0) {
        char divs[160];
        list_divisors(passes, divs, sizeof divs);
        st = epxi_fail(err, EPX_ERR_INVALID_ARG,
                       "window_passes (--window-passes %zu) does not divide the %zu forward "
                       "passes recorded%s: give a divisor of %zu (%s)",
                       per, passes, per > passes ? " (it is more than all of them)" : "", passes,
                       divs);
        free(refs);
        free(map);
        return st;
    }
    const size_t S = (passes + per - 1) / per;
    info->records = nrec;
    info->passes = (int64_t)passes;
    info->first_pass = refs[0].pass;
    info->last_pass = refs[nrec - 1].pass;
    info->windows = (int64_t)S;
    epx_counts *c = NULL;
    double *gpc = NULL;
    if (S > (1u << 24))
        st = epxi_fail(err, EPX_ERR_SHAPE, "%zu forward passes are above the limit of %d", S,
                       1 << 24);
    if (st == EPX_OK) st = epx_counts_create((int32_t)S, (int32_t)L, E, &c, err);
    if (st == EPX_OK && (gpc = epxi_calloc(lp, sizeof *gpc, "global_physical_count", err)) == NULL)
        st = EPX_ERR_NOMEM;
    /* Sorted by pass: pass k collects every rank's record of one pass, and
     * goes to window k / per. */
    size_t k = 0, s = 0;
    for (size_t i = 0; i < nrec && st == EPX_OK; i++) {
        if (i > 0 && refs[i].pass != refs[i - 1].pass) k++;
        s = k / per;
        const epx_pt_file *f = files[refs[i].file];
        epx_pt_tensor t;
        epx_pt_value_tensor(refs[i].gpc, &t, NULL);
        st = epx_pt_tensor_to_f64(&t, gpc, lp, err);
        if (st == EPX_OK) st = check_exact(f, "global_physical_count", &t, gpc, lp, err);
        if (st != EPX_OK) {
            epxi_error_prefix(err, "'%s': global_physical_count of pass %lld", epx_pt_file_name(f),
                              (long long)refs[i].pass);
            break;
        }
        for (size_t j = 0; j < lp; j++)
            if (!isfinite(gpc[j]) || gpc[j] < 0) {
                st = epxi_fail(err, EPX_ERR_PARSE,
                               "'%s': global_physical_count of pass %lld, rank %lld, layer %zu, "
                               "slot %zu is %g: counts must be finite and non-negative",
                               epx_pt_file_name(f), (long long)refs[i].pass,
                               (long long)refs[i].rank, j / (size_t)P, j % (size_t)P, gpc[j]);
                break;
            }
        for (size_t j = 0; j < lp && st == EPX_OK; j++) {
            int32_t l = (int32_t)(j / (size_t)P);
            epx_counts_row(c, (int32_t)s, l)[map[j]] += gpc[j];
        }
    }
    free(gpc);
    free(refs);
    free(map);
    if (st != EPX_OK) {
        epx_counts_destroy(c);
        return st;
    }
    *out = c;
    return EPX_OK;
}

static const char *kind_str(file_kind k) {
    return k == KIND_PER_PASS ? "a per_pass dump"
           : k == KIND_STAT   ? "a stat dump"
                              : "a logical_count file (not a stat dump)";
}

static epx_status counts_from_pt(const epx_pt_file *const *files, size_t nf,
                                 const epxi_read_cfg *cfg, epx_counts **out, read_info *info,
                                 epx_error *err) {
    if (files == NULL || nf == 0 || out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "no files given (files NULL or nfiles 0)");
    file_kind k0 = KIND_LOGICAL;
    for (size_t i = 0; i < nf; i++) {
        if (files[i] == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "files[%zu] is NULL", i);
        file_kind k;
        EPX_TRY(classify(files[i], &k, err));
        if (i == 0)
            k0 = k;
        else if (k != k0)
            /* A stat dump's summed ring buffer beside time-ordered windows
             * (or per_pass passes) would be windows of two meanings. */
            return epxi_fail(
                err, EPX_ERR_PARSE, "'%s' is %s but '%s' is %s: give files of one kind",
                epx_pt_file_name(files[0]), kind_str(k0), epx_pt_file_name(files[i]), kind_str(k));
    }
    memset(info, 0, sizeof *info);
    info->files = nf;
    return k0 == KIND_PER_PASS ? counts_per_pass(files, nf, cfg, out, info, err)
                               : counts_logical(files, nf, cfg, out, info, err);
}

/* The public reader keeps its first meaning: rows as windows. */
epx_status epx_counts_from_pt(const epx_pt_file *const *files, size_t nf, epx_counts **out,
                              epx_error *err) {
    const epxi_read_cfg raw = {0, true, NULL, NULL, NULL, 0, false, false};
    read_info info;
    return counts_from_pt(files, nf, &raw, out, &info, err);
}

/* One sentence on how the files were read, for epx stats and plan --report. */
static void describe(const read_info *x, const epxi_read_cfg *cfg, char *buf, size_t cap) {
    if (buf == NULL || cap == 0) return;
    const char *s = x->files > 1 ? "s" : "";
    if (x->records > 0) {
        char grp[64];
        if (cfg->window_passes > 0)
            snprintf(grp, sizeof grp, "%d passes per window", cfg->window_passes);
        else
            snprintf(grp, sizeof grp, "one window per pass");
        snprintf(buf, cap,
                 "per_pass dump%s (%zu file%s, %zu records): %lld forward passes (ids %lld to "
                 "%lld) in forward_pass_id order, ranks summed per pass, %s: %lld window%s",
                 s, x->files, s, x->records, (long long)x->passes, (long long)x->first_pass,
                 (long long)x->last_pass, grp, (long long)x->windows, x->windows > 1 ? "s" : "");
    } else if (x->stat_files > 0 && !cfg->stat_rows_as_windows) {
        snprintf(buf, cap,
                 "stat dump%s (SGLang's ring buffer: row order carries no time): %zu of %zu "
                 "rows non-zero, summed into one window%s (zero rows were never "
                 "written): %lld window%s",
                 x->stat_files > 1 ? "s" : "", x->stat_nonzero, x->stat_rows,
                 x->stat_files > 1 ? " per dump" : "", (long long)x->windows,
                 x->windows > 1 ? "s" : "");
    } else if (x->stat_files > 0) {
        snprintf(buf, cap,
                 "stat dump%s read row by row as time-ordered windows (%zu of %zu rows "
                 "non-zero): %lld window%s",
                 x->stat_files > 1 ? "s" : "", x->stat_nonzero, x->stat_rows, (long long)x->windows,
                 x->windows > 1 ? "s" : "");
    } else {
        snprintf(buf, cap, "logical_count file%s: %lld time-ordered window%s in file order", s,
                 (long long)x->windows, x->windows > 1 ? "s" : "");
    }
}

/* ---- specs: a path, a comma list, a directory ---------------------------- */

#define MAX_SPEC_FILES 65536

typedef struct {
    char **paths;
    size_t n, cap;
} path_list;

static epx_status paths_add(path_list *pl, const char *s, size_t len, epx_error *err) {
    if (pl->n >= MAX_SPEC_FILES)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "more than %d files", MAX_SPEC_FILES);
    if (pl->n == pl->cap) {
        size_t nc = pl->cap ? pl->cap * 2 : 8;
        char **np = realloc(pl->paths, nc * sizeof *np);
        if (np == NULL) return epxi_fail(err, EPX_ERR_NOMEM, "out of memory listing files");
        pl->paths = np;
        pl->cap = nc;
    }
    char *p = epxi_calloc(len + 1, 1, "path", err);
    if (p == NULL) return EPX_ERR_NOMEM;
    memcpy(p, s, len);
    pl->paths[pl->n++] = p;
    return EPX_OK;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static epx_status list_dir(const char *dir, path_list *pl, epx_error *err) {
    DIR *d = opendir(dir);
    if (d == NULL) return epxi_fail(err, EPX_ERR_IO, "cannot open directory '%.256s'", dir);
    struct dirent *ent;
    epx_status st = EPX_OK;
    size_t dlen = strlen(dir);
    while (st == EPX_OK && (ent = readdir(d)) != NULL) {
        if (ent->d_name[0] == '.' || !epxi_has_suffix(ent->d_name, ".pt")) continue;
        size_t n = dlen + 1 + strlen(ent->d_name);
        char *full = epxi_calloc(n + 1, 1, "path", err);
        if (full == NULL) {
            st = EPX_ERR_NOMEM;
            break;
        }
        snprintf(full, n + 1, "%s/%s", dir, ent->d_name);
        st = paths_add(pl, full, n, err);
        free(full);
    }
    closedir(d);
    if (st != EPX_OK) return st;
    if (pl->n == 0) return epxi_fail(err, EPX_ERR_IO, "directory '%.256s' holds no .pt files", dir);
    qsort(pl->paths, pl->n, sizeof *pl->paths, cmp_str);
    return EPX_OK;
}

static epx_status split_spec(const char *spec, path_list *pl, epx_error *err) {
    struct stat sb;
    /* a path that exists is one name, commas and all ('runs,old/dump.pt') */
    if (strchr(spec, ',') == NULL || stat(spec, &sb) == 0) {
        if (stat(spec, &sb) == 0 && S_ISDIR(sb.st_mode)) return list_dir(spec, pl, err);
        return paths_add(pl, spec, strlen(spec), err);
    }
    for (const char *p = spec;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "'%.256s' has an empty name in its comma-separated list", spec);
        EPX_TRY(paths_add(pl, p, len, err));
        if (comma == NULL) break;
        p = comma + 1;
    }
    return EPX_OK;
}

static epx_status read_counts_pt(const char *spec, const epxi_read_cfg *cfg, epx_counts **out,
                                 epx_error *err) {
    if (spec == NULL || out == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    path_list pl = {0};
    epx_pt_file **files = NULL;
    size_t loaded = 0;
    epx_status st = split_spec(spec, &pl, err);
    if (st == EPX_OK && (files = epxi_calloc(pl.n, sizeof *files, "files", err)) == NULL)
        st = EPX_ERR_NOMEM;
    for (; st == EPX_OK && loaded < pl.n; loaded++) {
        st = epx_pt_load(pl.paths[loaded], &files[loaded], err);
        if (st == EPX_OK && cfg->progress != NULL)
            cfg->progress(cfg->progress_user, "dump files read", (int64_t)loaded + 1,
                          (int64_t)pl.n);
    }
    read_info info;
    if (st == EPX_OK)
        st = counts_from_pt((const epx_pt_file *const *)files, pl.n, cfg, out, &info, err);
    if (st == EPX_OK &&
        ((st = epxi_read_cfg_applies(cfg, info.records > 0, info.stat_files > 0, err)) != EPX_OK ||
         (st = epxi_counts_check_total(*out, err)) != EPX_OK)) {
        epxi_error_prefix(err, "'%.256s'", spec);
        epx_counts_destroy(*out);
        *out = NULL;
    }
    if (st == EPX_OK) describe(&info, cfg, cfg->how, cfg->how_cap);
    for (size_t i = 0; i < loaded && files; i++) epx_pt_file_destroy(files[i]);
    free(files);
    for (size_t i = 0; i < pl.n; i++) free(pl.paths[i]);
    free(pl.paths);
    return st;
}

/* ---- pt_hooks.h --------------------------------------------------------- */

epx_status epxi_read_cfg_applies(const epxi_read_cfg *cfg, bool per_pass, bool stat,
                                 epx_error *err) {
    if (cfg->strict && cfg->window_passes != 0 && !per_pass)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "window_passes (--window-passes %d) groups a per_pass dump's forward "
                         "passes into windows, and this input holds no per_pass dump: drop it",
                         cfg->window_passes);
    if (cfg->stat_rows_asked && !stat)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "stat_rows windows (--stat-rows windows) reads a stat dump's ring-buffer "
                         "rows as windows, and this input holds no stat dump (%s): drop it",
                         per_pass ? "per_pass dumps are windows of --window-passes passes"
                                  : "its logical_count windows are read as they are");
    return EPX_OK;
}

epx_status epxi_pt_read_mapping(const char *path, int32_t **map, int32_t *L, int32_t *P,
                                epx_error *err) {
    epx_pt_file *f = NULL;
    EPX_TRY(epx_pt_load(path, &f, err));
    epx_status st = epx_mapping_from_pt(f, map, L, P, err);
    epx_pt_file_destroy(f);
    return st;
}

epx_status epx_counts_read_pt(const char *spec, epx_counts **out, epx_error *err) {
    const epxi_read_cfg raw = {0, true, NULL, NULL, NULL, 0, false, false};
    return read_counts_pt(spec, &raw, out, err);
}

epx_status epxi_pt_read_counts(const char *path, const epxi_read_cfg *cfg, epx_counts **out,
                               epx_error *err) {
    return read_counts_pt(path, cfg, out, err);
}
