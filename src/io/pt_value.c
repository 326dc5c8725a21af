/*
 * pt_value.c - the object tree of a loaded .pt file: its arena, the
 * container operations the unpickler performs, the public accessors, and
 * strided tensor copies.
 *
 * Every value lives in one arena chain owned by the epx_pt_file, because a
 * pickle's memo lets one object appear in many places: freeing by walking
 * the tree would free shared nodes twice. Two invariants keep the tree safe
 * to walk recursively: a container that has been placed inside another one
 * is sealed and can no longer be mutated, so no value can ever contain
 * itself (no cycles), and a container's depth is fixed when it is sealed and
 * capped at EPX_PT_MAX_DEPTH.
 *
 * Dict keys follow Python's equality where torch files can meet it: strings
 * by bytes; ints, bools and integral floats by numeric value (1, True and
 * 1.0 are one key); None equals None. Tensors and tuples compare by
 * identity (tensors do in Python too; tuple keys do not occur in torch
 * files). Lists and dicts are unhashable and refused as keys.
 */
#include "pt_internal.h"

#include <math.h>
#include <string.h>

/* ---- the file and its arena ------------------------------------------- */

epx_status epxi_pt_file_new(const char *name, epx_pt_file **out, epx_error *err) {
    epx_pt_file *f = epxi_calloc(1, sizeof *f, "pt file", err);
    if (f == NULL) return EPX_ERR_NOMEM;
    snprintf(f->name, sizeof f->name, "%s", name ? name : "<buffer>");
    *out = f;
    return EPX_OK;
}

epx_status epxi_pt_file_own(epx_pt_file *f, void *blob, epx_error *err) {
    if (f->num_blobs == f->cap_blobs) {
        size_t cap = f->cap_blobs ? f->cap_blobs * 2 : 8;
        size_t bytes;
        void **nb = epxi_mul_size(cap, sizeof *nb, &bytes) ? realloc(f->blobs, bytes) : NULL;
        if (nb == NULL) {
            free(blob);
            return epxi_fail(err, EPX_ERR_NOMEM, "out of memory keeping storage %zu", f->num_blobs);
        }
        f->blobs = nb;
        f->cap_blobs = cap;
    }
    f->blobs[f->num_blobs++] = blob;
    return EPX_OK;
}

static void free_payload(epx_pt_value *v) {
    switch (v->kind) {
    case EPX_PT_STRING: free(v->u.str.bytes); break;
    case EPX_PT_LIST:
    case EPX_PT_TUPLE: free(v->u.seq.items); break;
    case EPX_PT_TENSOR: free(v->u.tensor.t); break;
    case EPX_PT_DICT:
        free(v->u.dict.keys);
        free(v->u.dict.vals);
        free(v->u.dict.index);
        break;
    default: break;
    }
}

void epx_pt_file_destroy(epx_pt_file *f) {
    if (f == NULL) return;
    epxi_pt_slab *s = f->slabs;
    while (s != NULL) {
        epxi_pt_slab *prev = s->prev;
        for (size_t i = 0; i < s->used; i++) free_payload(&s->v[i]);
        free(s);
        s = prev;
    }
    for (size_t i = 0; i < f->num_blobs; i++) free(f->blobs[i]);
    free(f->blobs);
    free(f);
}

const epx_pt_value *epx_pt_file_root(const epx_pt_file *f) { return f ? f->root : NULL; }
const char *epx_pt_file_name(const epx_pt_file *f) { return f ? f->name : "<null>"; }

_Static_assert(sizeof(struct epx_pt_value) <= 48, "a pickle value must stay within 48 bytes");

/* Slabs double from 64 values up to 65536, so a small file allocates
 * little and a big one pays one malloc per 65536 values. */
static epx_pt_value *arena_take(epx_pt_file *f, epx_error *err) {
    epxi_pt_slab *s = f->slabs;
    if (s == NULL || s->used == s->cap) {
        size_t cap = s == NULL ? 64 : s->cap < 65536 ? s->cap * 2 : 65536;
        s = malloc(sizeof *s + cap * sizeof(epx_pt_value));
        if (s == NULL) {
            epxi_fail(err, EPX_ERR_NOMEM, "out of memory growing the pickle's values");
            return NULL;
        }
        s->prev = f->slabs;
        s->used = 0;
        s->cap = cap;
        f->slabs = s;
    }
    epx_pt_value *v = &s->v[s->used];
    memset(v, 0, sizeof *v);
    return v;
}

epx_pt_value *epxi_pt_new(epx_pt_file *f, int kind, epx_error *err) {
    epx_pt_tensor *t = NULL;
    if (kind == EPX_PT_TENSOR && (t = epxi_calloc(1, sizeof *t, "tensor", err)) == NULL)
        return NULL;
    epx_pt_value *v = arena_take(f, err);
    if (v == NULL) {
        free(t);
        return NULL;
    }
    f->slabs->used++; /* counted only once the value is whole */
    v->kind = (uint8_t)kind;
    if (t != NULL) v->u.tensor.t = t;
    v->has_internal = kind >= EPXI_PT_GLOBAL;
    v->nodes = 1;
    return v;
}

epx_pt_value *epxi_pt_new_string(epx_pt_file *f, const char *s, size_t len, epx_error *err) {
    if (len == (size_t)-1) {
        epxi_fail(err, EPX_ERR_OVERFLOW, "string length overflows");
        return NULL;
    }
    char *copy = epxi_calloc(len + 1, 1, "pickle string", err);
    if (copy == NULL) return NULL;
    epx_pt_value *v = epxi_pt_new(f, EPX_PT_STRING, err);
    if (v == NULL) {
        free(copy);
        return NULL;
    }
    if (len) memcpy(copy, s, len);
    v->u.str.bytes = copy;
    v->u.str.len = len;
    return v;
}

/* ---- containers --------------------------------------------------------- */

/* Account for `child` going into `parent`: depth, internal kinds, seal. */
static epx_status adopt(epx_pt_value *parent, epx_pt_value *child, epx_error *err) {
    if (child == parent)
        return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                         "a %s would contain itself: recursive objects are not supported",
                         epx_pt_kind_str((epx_pt_kind)parent->kind));
    if (child->depth + 1 > EPX_PT_MAX_DEPTH)
        return epxi_fail(err, EPX_ERR_PARSE,
                         "containers are nested deeper than %d levels: not a torch.save file "
                         "epx reads",
                         EPX_PT_MAX_DEPTH);
    /* Shared values count once per place they appear: that is the size a
     * walk of the tree (a JSON dump, a deep copy) meets, and a pickle that
     * doubles it at every level ("billion laughs") stops here. */
    if (parent->nodes + child->nodes > EPX_PT_MAX_NODES)
        return epxi_fail(err, EPX_ERR_PARSE,
                         "the object tree expands to more than %llu values through shared "
                         "references: refused as a decompression bomb",
                         (unsigned long long)EPX_PT_MAX_NODES);
    parent->nodes += child->nodes;
    if (child->depth + 1 > parent->depth) parent->depth = (uint16_t)(child->depth + 1);
    parent->has_internal |= child->has_internal;
    child->sealed = 1;
    return EPX_OK;
}

static epx_status grow_ptrs(epx_pt_value ***arr, size_t *cap, size_t need, epx_error *err) {
    if (need <= *cap) return EPX_OK;
    size_t nc = *cap ? *cap : 4;
    while (nc < need) {
        if (nc > ((size_t)-1) / 4) return epxi_fail(err, EPX_ERR_OVERFLOW, "container too large");
        nc *= 2;
    }
    size_t bytes;
    if (!epxi_mul_size(nc, sizeof **arr, &bytes))
        return epxi_fail(err, EPX_ERR_OVERFLOW, "container too large");
    epx_pt_value **na = realloc(*arr, bytes);
    if (na == NULL)
        return epxi_fail(err, EPX_ERR_NOMEM, "out of memory growing a container to %zu items", nc);
    *arr = na;
    *cap = nc;
    return EPX_OK;
}

epx_status epxi_pt_seq_push(epx_pt_value *seq, epx_pt_value *item, epx_error *err) {
    if (seq->sealed)
        return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                         "appending to a %s that is already inside another container: "
                         "recursive objects are not supported",
                         epx_pt_kind_str((epx_pt_kind)seq->kind));
    EPX_TRY(grow_ptrs(&seq->u.seq.items, &seq->u.seq.cap, seq->u.seq.n + 1, err));
    EPX_TRY(adopt(seq, item, err));
    seq->u.seq.items[seq->u.seq.n++] = item;
    return EPX_OK;
}

/* Numeric key normalisation: true with *i set for ints, bools and integral
 * floats within int64. */
static bool key_as_int(const epx_pt_value *k, int64_t *i) {
    if (k->kind == EPX_PT_INT || k->kind == EPX_PT_BOOL) {
        *i = k->u.i;
        return true;
    }
    if (k->kind == EPX_PT_FLOAT && k->u.f == floor(k->u.f) && k->u.f >= -0x1p63 &&
        k->u.f < 0x1p63) {
        *i = (int64_t)k->u.f;
        return true;
    }
    return false;
}

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t key_hash(const epx_pt_value *k) {
    int64_t i = 0;
    if (key_as_int(k, &i)) return mix64((uint64_t)i);
    switch (k->kind) {
    case EPX_PT_NONE: return 0x6e6f6e65ull;
    case EPX_PT_STRING: {
        uint64_t h = 0xcbf29ce484222325ull;
        for (size_t j = 0; j < k->u.str.len; j++)
            h = (h ^ (uint8_t)k->u.str.bytes[j]) * 0x100000001b3ull;
        return h;
    }
    case EPX_PT_FLOAT: {
        if (k->u.f != k->u.f) return mix64((uint64_t)(uintptr_t)k); /* NaN: identity */
        uint64_t bits;
        memcpy(&bits, &k->u.f, sizeof bits);
        return mix64(bits);
    }
    default: return mix64((uint64_t)(uintptr_t)k);
    }
}

static bool key_equal(const epx_pt_value *a, const epx_pt_value *b) {
    if (a == b) return true;
    int64_t x = 0, y = 0;
    bool ai = key_as_int(a, &x), bi = key_as_int(b, &y);
    if (ai || bi) return ai && bi && x == y;
    if (a->kind != b->kind) return false;
    switch (a->kind) {
    case EPX_PT_NONE: return true;
    case EPX_PT_FLOAT: return a->u.f == b->u.f;
    case EPX_PT_STRING:
        return a->u.str.len == b->u.str.len &&
               memcmp(a->u.str.bytes, b->u.str.bytes, a->u.str.len) == 0;
    default: return false; /* identity, checked above */
    }
}

/* Entry index of `key` in d, or -1. Small dicts scan; larger ones use the
 * open-addressing index so a pickle of many keys stays linear. */
static int64_t dict_find(const epx_pt_value *d, const epx_pt_value *key, uint64_t h) {
    size_t n = d->u.dict.n;
    if (d->u.dict.index == NULL) {
        for (size_t i = 0; i < n; i++)
            if (key_equal(d->u.dict.keys[i], key)) return (int64_t)i;
        return -1;
    }
    size_t mask = d->u.dict.index_cap - 1;
    for (size_t s = (size_t)h & mask;; s = (s + 1) & mask) {
        uint32_t e = d->u.dict.index[s];
        if (e == 0) return -1;
        if (key_equal(d->u.dict.keys[e - 1], key)) return (int64_t)e - 1;
    }
}

static void index_insert(epx_pt_value *d, size_t entry, uint64_t h) {
    size_t mask = d->u.dict.index_cap - 1;
    size_t s = (size_t)h & mask;
    while (d->u.dict.index[s] != 0) s = (s + 1) & mask;
    d->u.dict.index[s] = (uint32_t)(entry + 1);
}

/* Keep the index at most half full; build it once a dict has 8 entries. */
static epx_status index_reserve(epx_pt_value *d, size_t n_after, epx_error *err) {
    if (n_after < 8) return EPX_OK;
    if (n_after >= UINT32_MAX / 4)
        return epxi_fail(err, EPX_ERR_OVERFLOW, "a dict of %zu entries is too large", n_after);
    if (d->u.dict.index != NULL && n_after * 2 <= d->u.dict.index_cap) return EPX_OK;
    size_t cap = 16;
    while (cap < n_after * 2) cap *= 2;
    uint32_t *idx = epxi_calloc(cap, sizeof *idx, "dict index", err);
    if (idx == NULL) return EPX_ERR_NOMEM;
    free(d->u.dict.index);
    d->u.dict.index = idx;
    d->u.dict.index_cap = (uint32_t)cap;
    for (size_t i = 0; i < d->u.dict.n; i++) index_insert(d, i, key_hash(d->u.dict.keys[i]));
    return EPX_OK;
}

epx_status epxi_pt_dict_set(epx_pt_value *d, epx_pt_value *key, epx_pt_value *val, epx_error *err) {
    if (d->sealed)
        return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                         "setting an item of a dict that is already inside another container: "
                         "recursive objects are not supported");
    if (key->kind == EPX_PT_LIST || key->kind == EPX_PT_DICT)
        return epxi_fail(err, EPX_ERR_PARSE, "a %s cannot be a dict key (unhashable)",
                         epx_pt_kind_str((epx_pt_kind)key->kind));
    uint64_t h = key_hash(key);
    int64_t at = dict_find(d, key, h);
    if (at >= 0) {
        EPX_TRY(adopt(d, val, err));
        d->u.dict.vals[at] = val;
        return EPX_OK;
    }
    size_t n = d->u.dict.n;
    size_t kcap = d->u.dict.cap, vcap = d->u.dict.cap;
    EPX_TRY(grow_ptrs(&d->u.dict.keys, &kcap, n + 1, err));
    EPX_TRY(grow_ptrs(&d->u.dict.vals, &vcap, n + 1, err));
    d->u.dict.cap = (uint32_t)(kcap < vcap ? kcap : vcap);
    EPX_TRY(index_reserve(d, n + 1, err));
    EPX_TRY(adopt(d, key, err));
    EPX_TRY(adopt(d, val, err));
    d->u.dict.keys[n] = key;
    d->u.dict.vals[n] = val;
    d->u.dict.n = (uint32_t)(n + 1);
    if (d->u.dict.index != NULL) index_insert(d, n, h);
    return EPX_OK;
}

/* ---- accessors ---------------------------------------------------------- */

epx_pt_kind epx_pt_value_kind(const epx_pt_value *v) {
    return v ? (epx_pt_kind)v->kind : EPX_PT_NONE;
}

const char *epx_pt_kind_str(epx_pt_kind k) {
    switch ((int)k) {
    case EPX_PT_NONE: return "none";
    case EPX_PT_BOOL: return "bool";
    case EPX_PT_INT: return "int";
    case EPX_PT_FLOAT: return "float";
    case EPX_PT_STRING: return "string";
    case EPX_PT_LIST: return "list";
    case EPX_PT_TUPLE: return "tuple";
    case EPX_PT_DICT: return "dict";
    case EPX_PT_TENSOR: return "tensor";
    case EPXI_PT_GLOBAL: return "global";
    case EPXI_PT_STORAGE: return "storage";
    default: return "unknown";
    }
}

epx_status epx_pt_value_int(const epx_pt_value *v, int64_t *out, epx_error *err) {
    if (out == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "out is NULL");
    if (v == NULL || (v->kind != EPX_PT_INT && v->kind != EPX_PT_BOOL))
        return epxi_fail(err, EPX_ERR_PARSE, "expected an int, found a %s",
                         epx_pt_kind_str(epx_pt_value_kind(v)));
    *out = v->u.i;
    return EPX_OK;
}

epx_status epx_pt_value_float(const epx_pt_value *v, double *out, epx_error *err) {
    if (out == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "out is NULL");
    if (v != NULL && v->kind == EPX_PT_FLOAT)
        *out = v->u.f;
    else if (v != NULL && (v->kind == EPX_PT_INT || v->kind == EPX_PT_BOOL))
        *out = (double)v->u.i;
    else
        return epxi_fail(err, EPX_ERR_PARSE, "expected a number, found a %s",
                         epx_pt_kind_str(epx_pt_value_kind(v)));
    return EPX_OK;
}

const char *epx_pt_value_string(const epx_pt_value *v, size_t *len) {
    if (v == NULL || v->kind != EPX_PT_STRING) return NULL;
    if (len) *len = v->u.str.len;
    return v->u.str.bytes;
}

size_t epx_pt_value_len(const epx_pt_value *v) {
    if (v == NULL) return 0;
    if (v->kind == EPX_PT_LIST || v->kind == EPX_PT_TUPLE) return v->u.seq.n;
    if (v->kind == EPX_PT_DICT) return v->u.dict.n;
    return 0;
}

const epx_pt_value *epx_pt_value_item(const epx_pt_value *v, size_t i) {
    if (v == NULL || (v->kind != EPX_PT_LIST && v->kind != EPX_PT_TUPLE) || i >= v->u.seq.n)
        return NULL;
    return v->u.seq.items[i];
}

const epx_pt_value *epx_pt_dict_key(const epx_pt_value *v, size_t i) {
    if (v == NULL || v->kind != EPX_PT_DICT || i >= v->u.dict.n) return NULL;
    return v->u.dict.keys[i];
}

const epx_pt_value *epx_pt_dict_value(const epx_pt_value *v, size_t i) {
    if (v == NULL || v->kind != EPX_PT_DICT || i >= v->u.dict.n) return NULL;
    return v->u.dict.vals[i];
}

const epx_pt_value *epx_pt_dict_get(const epx_pt_value *v, const char *key) {
    if (v == NULL || v->kind != EPX_PT_DICT || key == NULL) return NULL;
    epx_pt_value probe;
    memset(&probe, 0, sizeof probe);
    probe.kind = EPX_PT_STRING;
    probe.u.str.bytes = (char *)(uintptr_t)key; /* read only */
    probe.u.str.len = strlen(key);
    int64_t at = dict_find(v, &probe, key_hash(&probe));
    return at >= 0 ? v->u.dict.vals[at] : NULL;
}

epx_status epx_pt_value_tensor(const epx_pt_value *v, epx_pt_tensor *out, epx_error *err) {
    if (out == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "out is NULL");
    if (v == NULL || v->kind != EPX_PT_TENSOR)
        return epxi_fail(err, EPX_ERR_PARSE, "expected a tensor, found a %s",
                         epx_pt_kind_str(epx_pt_value_kind(v)));
    *out = *v->u.tensor.t;
    return EPX_OK;
}

/* ---- dtypes ------------------------------------------------------------- */

static const struct {
    const char *storage, *name;
    size_t size;
} DTYPES[EPX_PT_DTYPE_COUNT_] = {
    [EPX_PT_DTYPE_FLOAT64] = {"DoubleStorage", "float64", 8},
    [EPX_PT_DTYPE_FLOAT32] = {"FloatStorage", "float32", 4},
    [EPX_PT_DTYPE_FLOAT16] = {"HalfStorage", "float16", 2},
    [EPX_PT_DTYPE_BFLOAT16] = {"BFloat16Storage", "bfloat16", 2},
    [EPX_PT_DTYPE_INT64] = {"LongStorage", "int64", 8},
    [EPX_PT_DTYPE_INT32] = {"IntStorage", "int32", 4},
    [EPX_PT_DTYPE_INT16] = {"ShortStorage", "int16", 2},
    [EPX_PT_DTYPE_INT8] = {"CharStorage", "int8", 1},
    [EPX_PT_DTYPE_UINT8] = {"ByteStorage", "uint8", 1},
    [EPX_PT_DTYPE_BOOL] = {"BoolStorage", "bool", 1},
};

static bool dtype_ok(epx_pt_dtype dt) { return (int)dt >= 0 && dt < EPX_PT_DTYPE_COUNT_; }

size_t epx_pt_dtype_size(epx_pt_dtype dt) { return dtype_ok(dt) ? DTYPES[dt].size : 0; }

const char *epx_pt_dtype_str(epx_pt_dtype dt) {
    if (dt == EPX_PT_DTYPE_AUTO) return "auto";
    return dtype_ok(dt) ? DTYPES[dt].name : "invalid";
}

int epxi_pt_storage_dtype(const char *name, size_t len) {
    for (int d = 0; d < EPX_PT_DTYPE_COUNT_; d++)
        if (strlen(DTYPES[d].storage) == len && memcmp(DTYPES[d].storage, name, len) == 0) return d;
    return -1;
}

const char *epxi_pt_storage_name(epx_pt_dtype dt) {
    return dtype_ok(dt) ? DTYPES[dt].storage : "?";
}

/* ---- tensors ------------------------------------------------------------ */

/* Views may repeat storage elements (stride 0, as tensor.expand makes);
 * beyond the storage's own size they may describe this many elements, so a
 * tiny file cannot ask for a huge dense copy. */
#define EXPANDED_VIEW_LIMIT ((int64_t)1 << 20)

epx_status epx_pt_tensor_numel(const epx_pt_tensor *t, int64_t *numel, epx_error *err) {
    if (t == NULL || numel == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    if (!dtype_ok(t->dtype))
        return epxi_fail(err, EPX_ERR_PARSE, "tensor dtype %d is not valid", (int)t->dtype);
    if (t->ndim < 0 || t->ndim > EPX_PT_MAX_DIMS)
        return epxi_fail(err, EPX_ERR_PARSE, "tensor has %d dimensions, outside [0, %d]", t->ndim,
                         EPX_PT_MAX_DIMS);
    if (t->storage_offset < 0 || t->storage_numel < 0)
        return epxi_fail(err, EPX_ERR_PARSE,
                         "tensor storage offset (%lld) and size (%lld) must be >= 0",
                         (long long)t->storage_offset, (long long)t->storage_numel);
    int64_t n = 1, last = t->storage_offset;
    for (int32_t d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0 || t->strides[d] < 0)
            return epxi_fail(err, EPX_ERR_PARSE,
                             "tensor dimension %d has size %lld and stride %lld: both must be "
                             ">= 0",
                             d, (long long)t->shape[d], (long long)t->strides[d]);
        if (__builtin_mul_overflow(n, t->shape[d], &n))
            return epxi_fail(err, EPX_ERR_OVERFLOW, "tensor element count overflows at dim %d", d);
    }
    if (n > 0) {
        for (int32_t d = 0; d < t->ndim; d++) {
            int64_t reach;
            if (__builtin_mul_overflow(t->shape[d] - 1, t->strides[d], &reach) ||
                __builtin_add_overflow(last, reach, &last))
                return epxi_fail(err, EPX_ERR_OVERFLOW, "tensor extent overflows at dim %d", d);
        }
        if (last >= t->storage_numel)
            return epxi_fail(err, EPX_ERR_PARSE,
                             "tensor reaches storage element %lld but its storage holds %lld: "
                             "shape, strides and offset claim more data than the file has",
                             (long long)last, (long long)t->storage_numel);
        if (t->storage == NULL)
            return epxi_fail(err, EPX_ERR_INVALID_ARG, "tensor storage is NULL");
        if (n > t->storage_numel && n > EXPANDED_VIEW_LIMIT)
            return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                             "tensor view has %lld elements over a storage of %lld: expanded "
                             "views above %lld elements are refused",
                             (long long)n, (long long)t->storage_numel,
                             (long long)EXPANDED_VIEW_LIMIT);
    }
    *numel = n;
    return EPX_OK;
}

/* Little-endian loads, independent of the host's byte order. */
static uint64_t load_le(const uint8_t *p, size_t size) {
    uint64_t x = 0;
    for (size_t i = 0; i < size; i++) x |= (uint64_t)p[i] << (8 * i);
    return x;
}

static double half_to_double(uint16_t h) {
    int sign = h >> 15, ex = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v;
    if (ex == 0)
        v = ldexp((double)man, -24);
    else if (ex == 31)
        v = man ? NAN : INFINITY;
    else
        v = ldexp((double)(man | 0x400), ex - 25);
    return sign ? -v : v;
}

/* Element `idx` as a double, and whether it is an integer dtype. */
static double elem_f64(const uint8_t *base, epx_pt_dtype dt, int64_t idx) {
    const size_t sz = DTYPES[dt].size;
    uint64_t bits = load_le(base + (size_t)idx * sz, sz);
    switch (dt) {
    case EPX_PT_DTYPE_FLOAT64: {
        double d;
        memcpy(&d, &bits, sizeof d);
        return d;
    }
    case EPX_PT_DTYPE_FLOAT32: {
        uint32_t b32 = (uint32_t)bits;
        float f;
        memcpy(&f, &b32, sizeof f);
        return f;
    }
    case EPX_PT_DTYPE_FLOAT16: return half_to_double((uint16_t)bits);
    case EPX_PT_DTYPE_BFLOAT16: {
        uint32_t b32 = (uint32_t)bits << 16;
        float f;
        memcpy(&f, &b32, sizeof f);
        return f;
    }
    case EPX_PT_DTYPE_INT64: return (double)(int64_t)bits;
    case EPX_PT_DTYPE_INT32: return (double)(int32_t)(uint32_t)bits;
    case EPX_PT_DTYPE_INT16: return (double)(int16_t)(uint16_t)bits;
    case EPX_PT_DTYPE_INT8: return (double)(int8_t)(uint8_t)bits;
    case EPX_PT_DTYPE_UINT8: return (double)(uint8_t)bits;
    case EPX_PT_DTYPE_BOOL: return bits != 0;
    default: return NAN;
    }
}

static bool dtype_is_int(epx_pt_dtype dt) {
    return dt == EPX_PT_DTYPE_INT64 || dt == EPX_PT_DTYPE_INT32 || dt == EPX_PT_DTYPE_INT16 ||
           dt == EPX_PT_DTYPE_INT8 || dt == EPX_PT_DTYPE_UINT8 || dt == EPX_PT_DTYPE_BOOL;
}

static int64_t elem_i64(const uint8_t *base, epx_pt_dtype dt, int64_t idx) {
    const size_t sz = DTYPES[dt].size;
    uint64_t bits = load_le(base + (size_t)idx * sz, sz);
    switch (dt) {
    case EPX_PT_DTYPE_INT64: return (int64_t)bits;
    case EPX_PT_DTYPE_INT32: return (int32_t)(uint32_t)bits;
    case EPX_PT_DTYPE_INT16: return (int16_t)(uint16_t)bits;
    case EPX_PT_DTYPE_INT8: return (int8_t)(uint8_t)bits;
    case EPX_PT_DTYPE_UINT8: return (uint8_t)bits;
    default: return bits != 0; /* BOOL */
    }
}

/*
 * Visit every element in row-major order with an odometer over the
 * dimensions, keeping the storage index incrementally. `fn` gets the flat
 * output index and the storage element index.
 */
typedef epx_status (*elem_fn)(void *ctx, size_t flat, int64_t at, epx_error *err);

static epx_status walk_tensor(const epx_pt_tensor *t, size_t n, elem_fn fn, void *ctx,
                              epx_error *err) {
    int64_t numel;
    EPX_TRY(epx_pt_tensor_numel(t, &numel, err));
    if ((uint64_t)numel != (uint64_t)n)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "output holds %zu elements but the tensor has %lld", n, (long long)numel);
    if (numel == 0) return EPX_OK;
    /* Unsigned arithmetic: a step past the last index of a dimension may
     * leave the range for a moment (a huge stride over a size-1 dimension)
     * and wraps back exactly, where signed arithmetic would be undefined. */
    int64_t idx[EPX_PT_MAX_DIMS] = {0};
    uint64_t at = (uint64_t)t->storage_offset;
    for (size_t flat = 0; flat < n; flat++) {
        EPX_TRY(fn(ctx, flat, (int64_t)at, err));
        for (int32_t d = t->ndim - 1; d >= 0; d--) {
            at += (uint64_t)t->strides[d];
            if (++idx[d] < t->shape[d]) break;
            at -= (uint64_t)t->strides[d] * (uint64_t)t->shape[d];
            idx[d] = 0;
        }
    }
    return EPX_OK;
}

typedef struct {
    const epx_pt_tensor *t;
    double *f64;
    int64_t *i64;
} copy_ctx;

static epx_status put_f64(void *vc, size_t flat, int64_t at, epx_error *err) {
    (void)err;
    copy_ctx *c = vc;
    c->f64[flat] = elem_f64(c->t->storage, c->t->dtype, at);
    return EPX_OK;
}

/* c->i64 NULL: check only (a float tensor's pass before the copy, so a
 * fraction found late leaves the output as it was). */
static epx_status put_i64(void *vc, size_t flat, int64_t at, epx_error *err) {
    copy_ctx *c = vc;
    if (dtype_is_int(c->t->dtype)) {
        if (c->i64) c->i64[flat] = elem_i64(c->t->storage, c->t->dtype, at);
        return EPX_OK;
    }
    double x = elem_f64(c->t->storage, c->t->dtype, at);
    if (!(x == floor(x) && x >= -0x1p63 && x < 0x1p63))
        return epxi_fail(err, EPX_ERR_PARSE, "element %zu of a %s tensor is %g, not an integer",
                         flat, epx_pt_dtype_str(c->t->dtype), x);
    if (c->i64) c->i64[flat] = (int64_t)x;
    return EPX_OK;
}

/* Row-major strides: the common case, copied without the odometer. The
 * running product may overflow for an empty tensor of huge dimensions
 * (0 x 2^40 x 2^40 is a valid zero-element shape): not contiguous then. */
static bool is_contiguous(const epx_pt_tensor *t) {
    int64_t expect = 1;
    for (int32_t d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->strides[d] != expect) return false;
        if (__builtin_mul_overflow(expect, t->shape[d], &expect)) return false;
    }
    return true;
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define EPXI_HOST_LE 1
#else
#define EPXI_HOST_LE 0
#endif

/* Contiguous storages of the plain dtypes on a little-endian host: one tight
 * loop per dtype (memcpy keeps unaligned loads defined). The tensor was
 * checked by the caller. Returns false when this path does not apply. */
#define FAST_COPY(T, OUT_T)                                                                        \
    do {                                                                                           \
        for (size_t i = 0; i < n; i++) {                                                           \
            T v_;                                                                                  \
            memcpy(&v_, base + i * sizeof(T), sizeof(T));                                          \
            out[i] = (OUT_T)v_;                                                                    \
        }                                                                                          \
    } while (0)

static bool fast_f64(const epx_pt_tensor *t, double *out, size_t n) {
    if (!EPXI_HOST_LE || n == 0 || !is_contiguous(t)) return false;
    const uint8_t *base =
        (const uint8_t *)t->storage + (size_t)t->storage_offset * DTYPES[t->dtype].size;
    switch (t->dtype) {
    case EPX_PT_DTYPE_FLOAT64: memcpy(out, base, n * sizeof *out); return true;
    case EPX_PT_DTYPE_FLOAT32: FAST_COPY(float, double); return true;
    case EPX_PT_DTYPE_INT64: FAST_COPY(int64_t, double); return true;
    case EPX_PT_DTYPE_INT32: FAST_COPY(int32_t, double); return true;
    case EPX_PT_DTYPE_INT16: FAST_COPY(int16_t, double); return true;
    default: return false;
    }
}

static bool fast_i64(const epx_pt_tensor *t, int64_t *out, size_t n) {
    if (!EPXI_HOST_LE || n == 0 || !is_contiguous(t)) return false;
    const uint8_t *base =
        (const uint8_t *)t->storage + (size_t)t->storage_offset * DTYPES[t->dtype].size;
    switch (t->dtype) {
    case EPX_PT_DTYPE_INT64: memcpy(out, base, n * sizeof *out); return true;
    case EPX_PT_DTYPE_INT32: FAST_COPY(int32_t, int64_t); return true;
    case EPX_PT_DTYPE_INT16: FAST_COPY(int16_t, int64_t); return true;
    default: return false;
    }
}

epx_status epx_pt_tensor_to_f64(const epx_pt_tensor *t, double *out, size_t n, epx_error *err) {
    if (t == NULL || (out == NULL && n > 0))
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    int64_t numel;
    EPX_TRY(epx_pt_tensor_numel(t, &numel, err));
    if ((uint64_t)numel == (uint64_t)n && fast_f64(t, out, n)) return EPX_OK;
    copy_ctx c = {t, out, NULL};
    return walk_tensor(t, n, put_f64, &c, err);
}

epx_status epx_pt_tensor_to_i64(const epx_pt_tensor *t, int64_t *out, size_t n, epx_error *err) {
    if (t == NULL || (out == NULL && n > 0))
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    int64_t numel;
    EPX_TRY(epx_pt_tensor_numel(t, &numel, err));
    if ((uint64_t)numel == (uint64_t)n && fast_i64(t, out, n)) return EPX_OK;
    if (!dtype_is_int(t->dtype)) {
        copy_ctx check = {t, NULL, NULL};
        EPX_TRY(walk_tensor(t, n, put_i64, &check, err));
    }
    copy_ctx c = {t, NULL, out};
    return walk_tensor(t, n, put_i64, &c, err);
}
