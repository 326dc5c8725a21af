/*
 * fuzz_pt.c - libFuzzer target for the .pt reader.
 *
 * An input that starts with "PK" is a whole file and goes through the zip
 * container (epx_pt_load_buffer). Anything else is taken as a bare data.pkl
 * and run through the unpickler directly, with storages served from a fixed
 * pool at whatever size the pickle claims: the zip's CRCs would otherwise
 * turn almost every mutation of a pickle into a checksum error, and the
 * unpickler would never see it.
 *
 * Oracles, beyond "no crash, no leak, no hang" under ASan/UBSan:
 *  - the same input read twice gives the same status, the same message and
 *    the same tree;
 *  - a failure always carries a message;
 *  - a loaded tree is walkable within its limits (depth, EPX_PT_MAX_NODES),
 *    and every tensor in it copies out (its geometry was checked at load);
 *  - SGLang readers on it give counts that are finite and non-negative, and
 *    maps whose ids are non-negative.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../src/io/pt_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) __builtin_trap();                                                             \
    } while (0)

static uint8_t POOL[1 << 16];

/* Storages for bare pickles: the pool, at the size claimed (capped), so the
 * unpickler's own size check decides; key "miss" is a missing entry. */
static epx_status pool_storage(void *ctx, epx_pt_file *f, const char *key, size_t key_len,
                               uint64_t claimed, const void **data, size_t *nbytes,
                               epx_error *err) {
    (void)ctx, (void)f;
    if (key_len == 4 && memcmp(key, "miss", 4) == 0)
        return epxi_fail(err, EPX_ERR_PARSE, "no storage 'miss'");
    *data = POOL;
    *nbytes = claimed < sizeof POOL ? (size_t)claimed : sizeof POOL;
    return EPX_OK;
}

static epx_status load(const uint8_t *data, size_t size, epx_pt_file **out, epx_error *err) {
    if (size >= 2 && data[0] == 'P' && data[1] == 'K')
        return epx_pt_load_buffer(data, size, "fuzz.pt", out, err);
    epx_pt_file *f = NULL;
    EPX_TRY(epxi_pt_file_new("fuzz.pkl", &f, err));
    epx_status st = epxi_pt_unpickle(f, data, size, pool_storage, NULL, err);
    if (st != EPX_OK) {
        epx_pt_file_destroy(f);
        return st;
    }
    *out = f;
    return EPX_OK;
}

static bool same_tensor(const epx_pt_value *a, const epx_pt_value *b) {
    epx_pt_tensor x, y;
    if (epx_pt_value_tensor(a, &x, NULL) != EPX_OK || epx_pt_value_tensor(b, &y, NULL) != EPX_OK)
        return false;
    if (x.dtype != y.dtype || x.ndim != y.ndim || x.storage_offset != y.storage_offset ||
        x.storage_numel != y.storage_numel)
        return false;
    for (int32_t d = 0; d < x.ndim; d++)
        if (x.shape[d] != y.shape[d] || x.strides[d] != y.strides[d]) return false;
    size_t bytes = (size_t)x.storage_numel * epx_pt_dtype_size(x.dtype);
    return bytes == 0 || memcmp(x.storage, y.storage, bytes) == 0;
}

/* Structural equality, visiting at most *budget values. */
static bool same(const epx_pt_value *a, const epx_pt_value *b, int depth, size_t *budget) {
    if (*budget == 0) return true;
    (*budget)--;
    CHECK(depth <= EPX_PT_MAX_DEPTH);
    epx_pt_kind k = epx_pt_value_kind(a);
    if (k != epx_pt_value_kind(b)) return false;
    int64_t i, j;
    double x, y;
    size_t la, lb;
    switch (k) {
    case EPX_PT_NONE: return true;
    case EPX_PT_BOOL:
    case EPX_PT_INT:
        return epx_pt_value_int(a, &i, NULL) == EPX_OK && epx_pt_value_int(b, &j, NULL) == EPX_OK &&
               i == j;
    case EPX_PT_FLOAT:
        epx_pt_value_float(a, &x, NULL);
        epx_pt_value_float(b, &y, NULL);
        return memcmp(&x, &y, sizeof x) == 0;
    case EPX_PT_STRING: {
        const char *s = epx_pt_value_string(a, &la), *t = epx_pt_value_string(b, &lb);
        return la == lb && memcmp(s, t, la) == 0 && s[la] == '\0';
    }
    case EPX_PT_LIST:
    case EPX_PT_TUPLE:
        if (epx_pt_value_len(a) != epx_pt_value_len(b)) return false;
        for (size_t n = 0; n < epx_pt_value_len(a); n++)
            if (!same(epx_pt_value_item(a, n), epx_pt_value_item(b, n), depth + 1, budget))
                return false;
        return true;
    case EPX_PT_DICT:
        if (epx_pt_value_len(a) != epx_pt_value_len(b)) return false;
        for (size_t n = 0; n < epx_pt_value_len(a); n++) {
            if (!same(epx_pt_dict_key(a, n), epx_pt_dict_key(b, n), depth + 1, budget) ||
                !same(epx_pt_dict_value(a, n), epx_pt_dict_value(b, n), depth + 1, budget))
                return false;
            /* a string key finds its own value */
            const char *s = epx_pt_value_string(epx_pt_dict_key(a, n), &la);
            if (s != NULL && strlen(s) == la) CHECK(epx_pt_dict_get(a, s) != NULL);
        }
        return true;
    case EPX_PT_TENSOR: return same_tensor(a, b);
    }
    return false;
}

/* Every tensor reachable within the budget copies out. */
static void use_tensors(const epx_pt_value *v, size_t *budget) {
    if (*budget == 0) return;
    (*budget)--;
    epx_pt_kind k = epx_pt_value_kind(v);
    if (k == EPX_PT_LIST || k == EPX_PT_TUPLE)
        for (size_t n = 0; n < epx_pt_value_len(v); n++)
            use_tensors(epx_pt_value_item(v, n), budget);
    if (k == EPX_PT_DICT)
        for (size_t n = 0; n < epx_pt_value_len(v); n++)
            use_tensors(epx_pt_dict_value(v, n), budget);
    if (k != EPX_PT_TENSOR) return;
    epx_pt_tensor t;
    int64_t numel = 0;
    epx_error err = {0};
    CHECK(epx_pt_value_tensor(v, &t, &err) == EPX_OK);
    CHECK(epx_pt_tensor_numel(&t, &numel, &err) == EPX_OK);
    if (numel > (1 << 16)) return;
    double *x = malloc(((size_t)numel + 1) * sizeof *x);
    int64_t *xi = malloc(((size_t)numel + 1) * sizeof *xi);
    if (x != NULL && xi != NULL) {
        CHECK(epx_pt_tensor_to_f64(&t, x, (size_t)numel, &err) == EPX_OK);
        epx_status st = epx_pt_tensor_to_i64(&t, xi, (size_t)numel, &err);
        CHECK(st == EPX_OK || (st == EPX_ERR_PARSE && err.msg[0] != '\0'));
        CHECK(epx_pt_tensor_to_f64(&t, x, (size_t)numel + 1, &err) == EPX_ERR_INVALID_ARG);
    }
    free(x);
    free(xi);
}

static void use_sglang(const epx_pt_file *f) {
    epx_error err = {0};
    int32_t *map = NULL, L = 0, P = 0;
    if (epx_mapping_from_pt(f, &map, &L, &P, &err) == EPX_OK) {
        for (size_t i = 0; i < (size_t)L * (size_t)P; i++) CHECK(map[i] >= 0);
        epx_free(map);
    } else {
        CHECK(err.msg[0] != '\0');
    }
    epx_counts *c = NULL;
    if (epx_counts_from_pt(&f, 1, &c, &err) == EPX_OK) {
        size_t n = (size_t)c->num_windows * (size_t)c->num_layers * (size_t)c->num_experts;
        for (size_t i = 0; i < n; i++) CHECK(isfinite(c->data[i]) && c->data[i] >= 0);
        epx_counts_destroy(c);
    } else {
        CHECK(err.msg[0] != '\0');
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (POOL[1] == 0)
        for (size_t i = 0; i < sizeof POOL; i++) POOL[i] = (uint8_t)((i * 2654435761u) >> 13);
    epx_pt_file *a = NULL, *b = NULL;
    epx_error ea = {0}, eb = {0};
    epx_status sa = load(data, size, &a, &ea);
    epx_status sb = load(data, size, &b, &eb);
    CHECK(sa == sb);
    CHECK(strcmp(ea.msg, eb.msg) == 0);
    if (sa == EPX_OK) {
        size_t budget = 1 << 16;
        CHECK(same(epx_pt_file_root(a), epx_pt_file_root(b), 0, &budget));
        budget = 1 << 16;
        use_tensors(epx_pt_file_root(a), &budget);
        use_sglang(a);
    } else {
        CHECK(a == NULL && ea.msg[0] != '\0' && ea.status == sa);
    }
    epx_pt_file_destroy(a);
    epx_pt_file_destroy(b);
    return 0;
}
