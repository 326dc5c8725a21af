/*
 * json_tensor.c - rectangular numeric arrays from jansson values.
 *
 * SGLang's files are nested JSON lists. A malformed one (ragged rows, a
 * string where a number belongs, an id of 1e30) must fail here with the exact
 * index and value, not later as a shape mismatch somewhere else.
 */
#include "json_tensor.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static void format_index(char *buf, size_t cap, const int64_t *idx, int depth) {
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < depth && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "[%lld]", (long long)idx[i]);
}

static epx_status rows_even(const json_t *a, const epxi_json_tensor *t, int depth, int64_t *idx,
                            const char *key, epx_error *err);

epx_status epxi_json_measure(const json_t *arr, int min_rank, int max_rank, const char *key,
                             epxi_json_tensor *out, epx_error *err) {
    memset(out, 0, sizeof *out);
    const json_t *cur = arr;
    int rank = 0;
    while (json_is_array(cur)) {
        if (rank == max_rank)
            return epxi_fail(err, EPX_ERR_PARSE, "'%s' is nested deeper than %d levels", key,
                             max_rank);
        size_t n = json_array_size(cur);
        if (n == 0)
            return epxi_fail(err, EPX_ERR_PARSE, "'%s' has an empty list at depth %d", key, rank);
        out->dims[rank++] = (int64_t)n;
        cur = json_array_get(cur, 0);
    }
    if (rank < min_rank) {
        char depth[32] = "";
        if (min_rank != max_rank) snprintf(depth, sizeof depth, " to %d", max_rank);
        if (rank > 0)
            return epxi_fail(err, EPX_ERR_PARSE,
                             "'%s' must be a nested list of depth %d%s, got a list of depth %d",
                             key, min_rank, depth, rank);
        /* depth 0: say what stands there instead of "depth 0" */
        return epxi_fail(err, EPX_ERR_PARSE, "'%s' must be a nested list of depth %d%s, got %s",
                         key, min_rank, depth,
                         json_is_null(cur)     ? "null"
                         : json_is_number(cur) ? "a number"
                         : json_is_string(cur) ? "a string"
                         : json_is_object(cur) ? "an object"
                                               : "true or false");
    }
    out->rank = rank;
    /* a ragged list (2^21 entries in its first row, one in each other) was
     * sized from its first row: 512 GiB asked for before the walk found it */
    int64_t idx[EPXI_JSON_MAX_RANK] = {0};
    EPX_TRY(rows_even(arr, out, 0, idx, key, err));
    size_t count = 1;
    for (int i = 0; i < rank; i++) {
        if (!epxi_mul_size(count, (size_t)out->dims[i], &count))
            return epxi_fail(err, EPX_ERR_OVERFLOW, "'%s' is too large", key);
    }
    out->count = count;
    return EPX_OK;
}

/* a, at depth < t->rank, is a list of t->dims[depth] entries; else the
 * error naming where (idx[0..depth)) and what was expected. */
static epx_status row_ok(const json_t *a, const epxi_json_tensor *t, int depth, const int64_t *idx,
                         const char *key, epx_error *err) {
    char where[128];
    if (!json_is_array(a)) {
        format_index(where, sizeof where, idx, depth);
        return epxi_fail(err, EPX_ERR_PARSE, "'%s'%s should be a list of %lld entries", key, where,
                         (long long)t->dims[depth]);
    }
    if ((int64_t)json_array_size(a) != t->dims[depth]) {
        format_index(where, sizeof where, idx, depth);
        return epxi_fail(err, EPX_ERR_PARSE,
                         "'%s'%s has %zu entries but %s has %lld: rows must all have the same "
                         "length (ragged rows)",
                         key, where, json_array_size(a), depth == 0 ? "the first" : "row [0]",
                         (long long)t->dims[depth]);
    }
    return EPX_OK;
}

/* Every list above the leaves has its dimension's length: what makes
 * dims[] (read off the first entry of each level) the real shape, before
 * anything is sized from it. Visits the rows, not the leaves. */
static epx_status rows_even(const json_t *a, const epxi_json_tensor *t, int depth, int64_t *idx,
                            const char *key, epx_error *err) {
    EPX_TRY(row_ok(a, t, depth, idx, key, err));
    if (depth + 1 >= t->rank || depth + 1 >= EPXI_JSON_MAX_RANK) return EPX_OK;
    for (int64_t i = 0; i < t->dims[depth]; i++) {
        idx[depth] = i;
        EPX_TRY(rows_even(json_array_get(a, (size_t)i), t, depth + 1, idx, key, err));
    }
    return EPX_OK;
}

/* Walk every leaf in row-major order, checking each row's length. */
typedef epx_status (*leaf_fn)(const json_t *v, const int64_t *idx, int depth, size_t flat,
                              void *ctx, epx_error *err);

static epx_status walk(const json_t *a, const epxi_json_tensor *t, int depth, int64_t *idx,
                       size_t *flat, const char *key, leaf_fn fn, void *ctx, epx_error *err) {
    if (depth == t->rank) {
        epx_status st = fn(a, idx, depth, *flat, ctx, err);
        (*flat)++;
        return st;
    }
    EPX_TRY(row_ok(a, t, depth, idx, key, err));
    for (int64_t i = 0; i < t->dims[depth]; i++) {
        idx[depth] = i;
        EPX_TRY(walk(json_array_get(a, (size_t)i), t, depth + 1, idx, flat, key, fn, ctx, err));
    }
    return EPX_OK;
}

typedef struct {
    const char *key;
    epxi_json_kind kind;
    int32_t *i32;
    double *f64;
} leaf_ctx;

static epx_status leaf_number(const json_t *v, const int64_t *idx, int depth, size_t flat,
                              void *vctx, epx_error *err) {
    leaf_ctx *c = vctx;
    char where[128];
    if (c->kind == EPXI_JSON_LOAD) {
        double x;
        if (json_is_integer(v)) {
            const json_int_t n = json_integer_value(v);
            x = (double)n;
            /* Loads are doubles: past 2^53 not every integer is one, and a
             * count rounded on reading would come back changed. */
            if (x >= 0x1p63 || x <= -0x1p63 || (json_int_t)x != n) {
                format_index(where, sizeof where, idx, depth);
                return epxi_fail(err, EPX_ERR_PARSE,
                                 "'%s'%s is %lld, which epx's loads (doubles) cannot hold "
                                 "exactly (it would read as %.17g): counts above 2^53 must "
                                 "be scaled down",
                                 c->key, where, (long long)n, x);
            }
        } else if (json_is_real(v))
            x = json_real_value(v);
        else {
            format_index(where, sizeof where, idx, depth);
            return epxi_fail(err, EPX_ERR_PARSE, "'%s'%s is not a number", c->key, where);
        }
        if (!isfinite(x) || x < 0) {
            format_index(where, sizeof where, idx, depth);
            return epxi_fail(err, EPX_ERR_PARSE,
                             "'%s'%s is %g: loads must be finite and non-negative", c->key, where,
                             x);
        }
        /* -0.0 is a load of zero: store +0.0, so every writer (and a .pt
         * in int64) gives back exactly what was read. */
        c->f64[flat] = x == 0.0 ? 0.0 : x;
        return EPX_OK;
    }
    if (!json_is_integer(v)) {
        format_index(where, sizeof where, idx, depth);
        /* A whole real (3e0, 3.0) reads back as 3: "is 3, not an integer"
         * would contradict itself, so say how it is written. */
        if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)))
            return epxi_fail(err, EPX_ERR_PARSE,
                             "'%s'%s is written as a real number (with a decimal point or an "
                             "exponent), not an integer: write it as %.17g",
                             c->key, where, json_real_value(v));
        if (json_is_real(v))
            return epxi_fail(err, EPX_ERR_PARSE, "'%s'%s is %.17g, not an integer", c->key, where,
                             json_real_value(v));
        return epxi_fail(err, EPX_ERR_PARSE, "'%s'%s is not an integer", c->key, where);
    }
    json_int_t x = json_integer_value(v);
    json_int_t lo = c->kind == EPXI_JSON_INDEX_M1 ? -1 : 0;
    if (x < lo || x > INT32_MAX) {
        format_index(where, sizeof where, idx, depth);
        return epxi_fail(err, EPX_ERR_PARSE, "'%s'%s is %lld, outside [%lld, %d]", c->key, where,
                         (long long)x, (long long)lo, INT32_MAX);
    }
    c->i32[flat] = (int32_t)x;
    return EPX_OK;
}

epx_status epxi_json_flatten_i32(const json_t *arr, const epxi_json_tensor *t, epxi_json_kind kind,
                                 const char *key, int32_t *out, epx_error *err) {
    leaf_ctx c = {key, kind, out, NULL};
    int64_t idx[EPXI_JSON_MAX_RANK] = {0};
    size_t flat = 0;
    return walk(arr, t, 0, idx, &flat, key, leaf_number, &c, err);
}

epx_status epxi_json_flatten_f64(const json_t *arr, const epxi_json_tensor *t, const char *key,
                                 double *out, epx_error *err) {
    leaf_ctx c = {key, EPXI_JSON_LOAD, NULL, out};
    int64_t idx[EPXI_JSON_MAX_RANK] = {0};
    size_t flat = 0;
    return walk(arr, t, 0, idx, &flat, key, leaf_number, &c, err);
}

epx_status epxi_json_parse_object(const char *text, size_t len, const char *what, json_t **out,
                                  epx_error *err) {
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL)
        return epxi_fail(err, EPX_ERR_PARSE, "%s is not valid JSON (line %d, column %d): %s", what,
                         je.line, je.column, je.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return epxi_fail(err, EPX_ERR_PARSE, "%s must be a JSON object ({...})", what);
    }
    *out = root;
    return EPX_OK;
}

epx_status epxi_json_load_spec(const char *spec, json_t **out, epx_error *err) {
    const char *p = spec;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    if (*p == '{') return epxi_json_parse_object(spec, strlen(spec), "inline JSON", out, err);
    char *text = NULL;
    size_t len = 0;
    EPX_TRY(epx_file_read(spec, EPX_MAX_INPUT_BYTES, "a JSON input (EPX_MAX_INPUT_BYTES)", &text,
                          &len, err));
    char what[300];
    snprintf(what, sizeof what, "'%.256s'", spec);
    epx_status st = epxi_json_parse_object(text, len, what, out, err);
    free(text);
    return st;
}
