/*
 * pt_build.h - building torch.save-shaped files in tests, byte by byte: a
 * tiny pickle emitter (the opcodes torch.save uses, plus whatever a hostile
 * test wants to inject) and a zip writer over libzip, to a file or to
 * memory. Header-only (static inline) so each test and fuzz seed generator
 * takes what it uses. Test code only: never compiled into libepx.
 */
#ifndef EPX_PT_BUILD_H
#define EPX_PT_BUILD_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zip.h>

typedef struct ptb {
    uint8_t *p;
    size_t n, cap;
} ptb;

static inline void ptb_raw(ptb *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n) nc *= 2;
        b->p = realloc(b->p, nc);
        if (b->p == NULL) abort(); /* test helper: out of memory ends the test */
        b->cap = nc;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static inline void ptb_op(ptb *b, uint8_t op) { ptb_raw(b, &op, 1); }

static inline void ptb_le(ptb *b, uint64_t x, size_t n) {
    for (size_t i = 0; i < n; i++) ptb_op(b, (uint8_t)(x >> (8 * i)));
}

static inline void ptb_proto(ptb *b) {
    ptb_op(b, 0x80);
    ptb_op(b, 2);
}

static inline void ptb_strn(ptb *b, const char *s, size_t n) {
    ptb_op(b, 'X');
    ptb_le(b, n, 4);
    ptb_raw(b, s, n);
}

static inline void ptb_str(ptb *b, const char *s) { ptb_strn(b, s, strlen(s)); }

static inline void ptb_int(ptb *b, int64_t v) {
    if (v >= 0 && v < 256) {
        ptb_op(b, 'K');
        ptb_op(b, (uint8_t)v);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        ptb_op(b, 'J');
        ptb_le(b, (uint64_t)v, 4);
    } else {
        ptb_op(b, 0x8a);
        ptb_op(b, 8);
        ptb_le(b, (uint64_t)v, 8);
    }
}

static inline void ptb_float(ptb *b, double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    ptb_op(b, 'G');
    for (int i = 7; i >= 0; i--) ptb_op(b, (uint8_t)(bits >> (8 * i)));
}

static inline void ptb_global(ptb *b, const char *mod, const char *name) {
    ptb_op(b, 'c');
    ptb_raw(b, mod, strlen(mod));
    ptb_op(b, '\n');
    ptb_raw(b, name, strlen(name));
    ptb_op(b, '\n');
}

static inline void ptb_tuple_of(ptb *b, const int64_t *v, int n) {
    ptb_op(b, '(');
    for (int i = 0; i < n; i++) ptb_int(b, v[i]);
    ptb_op(b, 't');
}

/* torch._utils._rebuild_tensor_v2((storage pid), offset, shape, stride,
 * False, OrderedDict()) exactly as torch.save lays it out. */
static inline void ptb_tensor(ptb *b, const char *storage_class, const char *key, int64_t numel,
                              int64_t offset, const int64_t *shape, const int64_t *stride,
                              int ndim) {
    ptb_global(b, "torch._utils", "_rebuild_tensor_v2");
    ptb_op(b, '(');
    ptb_op(b, '(');
    ptb_str(b, "storage");
    ptb_global(b, "torch", storage_class);
    ptb_str(b, key);
    ptb_str(b, "cpu");
    ptb_int(b, numel);
    ptb_op(b, 't');
    ptb_op(b, 'Q');
    ptb_int(b, offset);
    ptb_tuple_of(b, shape, ndim);
    ptb_tuple_of(b, stride, ndim);
    ptb_op(b, 0x89);
    ptb_global(b, "collections", "OrderedDict");
    ptb_op(b, ')');
    ptb_op(b, 'R');
    ptb_op(b, 't');
    ptb_op(b, 'R');
}

/* A contiguous tensor of `ndim` dims over storage `key`. */
static inline void ptb_dense(ptb *b, const char *storage_class, const char *key,
                             const int64_t *shape, int ndim) {
    int64_t stride[16], n = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        stride[d] = n;
        n *= shape[d];
    }
    ptb_tensor(b, storage_class, key, n, 0, shape, stride, ndim);
}

/* Little-endian storage bytes of n values as int64 / int32 / float32. */
static inline uint8_t *ptb_storage_i64(const int64_t *v, size_t n) {
    uint8_t *p = malloc(n * 8 + 1);
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 8; k++) p[8 * i + (size_t)k] = (uint8_t)((uint64_t)v[i] >> (8 * k));
    return p;
}
static inline uint8_t *ptb_storage_i32(const int64_t *v, size_t n) {
    uint8_t *p = malloc(n * 4 + 1);
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++) p[4 * i + (size_t)k] = (uint8_t)((uint64_t)v[i] >> (8 * k));
    return p;
}

typedef struct ptb_entry {
    const char *name; /* full name inside the zip, e.g. "archive/data/0" */
    const void *data;
    size_t len;
} ptb_entry;

static inline int ptb_add_all(zip_t *za, const ptb_entry *e, size_t n) {
    for (size_t i = 0; i < n; i++) {
        zip_source_t *s = zip_source_buffer(za, e[i].data, e[i].len, 0);
        if (s == NULL) return -1;
        zip_int64_t idx = zip_file_add(za, e[i].name, s, ZIP_FL_ENC_UTF_8 | ZIP_FL_OVERWRITE);
        if (idx < 0) {
            zip_source_free(s);
            return -1;
        }
        zip_set_file_compression(za, (zip_uint64_t)idx, ZIP_CM_STORE, 0);
    }
    return 0;
}

/* Write entries as a stored zip at `path`; 0 on success. */
static inline int ptb_write_zip(const char *path, const ptb_entry *e, size_t n) {
    int zerr = 0;
    zip_t *za = zip_open(path, ZIP_CREATE | ZIP_TRUNCATE, &zerr);
    if (za == NULL) return -1;
    if (ptb_add_all(za, e, n) != 0) {
        zip_discard(za);
        return -1;
    }
    return zip_close(za) == 0 ? 0 : -1;
}

/* The same into a malloc'd buffer (*len bytes); NULL on failure. */
static inline uint8_t *ptb_zip_buffer(const ptb_entry *e, size_t n, size_t *len) {
    zip_error_t ze;
    zip_error_init(&ze);
    zip_source_t *src = zip_source_buffer_create(NULL, 0, 0, &ze);
    zip_error_fini(&ze);
    if (src == NULL) return NULL;
    zip_t *za = zip_open_from_source(src, ZIP_TRUNCATE, NULL);
    if (za == NULL) {
        zip_source_free(src);
        return NULL;
    }
    zip_source_keep(src);
    if (ptb_add_all(za, e, n) != 0 || zip_close(za) != 0) {
        zip_discard(za);
        zip_source_free(src);
        return NULL;
    }
    zip_stat_t st;
    uint8_t *out = NULL;
    if (zip_source_stat(src, &st) == 0 && zip_source_open(src) == 0) {
        out = malloc(st.size ? st.size : 1);
        zip_int64_t got = out ? zip_source_read(src, out, st.size) : -1;
        zip_source_close(src);
        if (got < 0 || (zip_uint64_t)got != st.size) {
            free(out);
            out = NULL;
        } else {
            *len = (size_t)st.size;
        }
    }
    zip_source_free(src);
    return out;
}

/* A torch.save-shaped archive "archive/" around a pickle and storages
 * data/0 .. data/(nstor-1), in memory. */
static inline uint8_t *ptb_archive(const ptb *pkl, const uint8_t *const *stor,
                                   const size_t *stor_len, size_t nstor, size_t *len) {
    ptb_entry e[3 + 64];
    char names[64][32];
    size_t n = 0;
    e[n++] = (ptb_entry){"archive/data.pkl", pkl->p, pkl->n};
    e[n++] = (ptb_entry){"archive/byteorder", "little", 6};
    for (size_t i = 0; i < nstor && i < 64; i++) {
        snprintf(names[i], sizeof names[i], "archive/data/%zu", i);
        e[n++] = (ptb_entry){names[i], stor[i], stor_len[i]};
    }
    e[n++] = (ptb_entry){"archive/version", "3\n", 2};
    return ptb_zip_buffer(e, n, len);
}

#endif
