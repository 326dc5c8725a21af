/*
 * pt_write.c - .pt files SGLang loads with torch.load(weights_only=True):
 * a one-key dict holding one tensor, in torch.save's zip layout.
 *
 * The layout copies what torch.save writes (see shared/golden/pt): one
 * folder named after the file's stem holding data.pkl (pickle protocol 2),
 * .format_version ("1"), .storage_alignment ("64"), byteorder ("little"),
 * data/0 (the storage, little-endian), version ("3\n") and
 * .data/serialization_id (40 digits), every entry stored uncompressed and
 * every entry's bytes starting at a multiple of 64 in the file, as torch
 * aligns them for mmap loading. The alignment is made with a padding extra
 * field in each local header, so it depends on knowing libzip's local
 * header size (30 bytes + name + extra fields, no data descriptor when the
 * output is seekable); the tests check the offsets of a written file.
 *
 * The pickle uses the same opcodes torch.save emits for a dict of one
 * tensor, minus the memo (which the reader never needs for a tree without
 * shared objects). The archive is built in memory and written through
 * core's safe-output path, so a failed write leaves the old file in place.
 */
#include <math.h>
#include <string.h>
#include <zip.h>

#include "pt_internal.h"

/* ---- a growable byte buffer --------------------------------------------- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
    bool oom;
} bytes;

static void put(bytes *b, const void *src, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n) nc *= 2;
        uint8_t *np = realloc(b->p, nc);
        if (np == NULL) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_u8(bytes *b, uint8_t x) { put(b, &x, 1); }

static void put_le(bytes *b, uint64_t x, size_t n) {
    uint8_t t[8];
    for (size_t i = 0; i < n; i++) t[i] = (uint8_t)(x >> (8 * i));
    put(b, t, n);
}

static void pk_str(bytes *b, const char *s) {
    put_u8(b, 'X'); /* BINUNICODE */
    put_le(b, strlen(s), 4);
    put(b, s, strlen(s));
}

/* The smallest int opcode, as Python's pickler chooses it. */
static void pk_int(bytes *b, int64_t v) {
    if (v >= 0 && v < 256) {
        put_u8(b, 'K');
        put_u8(b, (uint8_t)v);
    } else if (v >= 0 && v < 65536) {
        put_u8(b, 'M');
        put_le(b, (uint64_t)v, 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        put_u8(b, 'J');
        put_le(b, (uint64_t)v, 4);
    } else {
        /* LONG1: little-endian two's complement, dropping high bytes that
         * only repeat the sign, as Python's pickler does. */
        uint8_t t[8];
        for (size_t i = 0; i < 8; i++) t[i] = (uint8_t)((uint64_t)v >> (8 * i));
        size_t n = 8;
        while (n > 1 && ((t[n - 1] == 0x00 && !(t[n - 2] & 0x80)) ||
                         (t[n - 1] == 0xff && (t[n - 2] & 0x80))))
            n--;
        put_u8(b, 0x8a);
        put_u8(b, (uint8_t)n);
        put(b, t, n);
    }
}

static void pk_global(bytes *b, const char *mod, const char *name) {
    put_u8(b, 'c');
    put(b, mod, strlen(mod));
    put_u8(b, '\n');
    put(b, name, strlen(name));
    put_u8(b, '\n');
}

static void pk_int_tuple(bytes *b, const int64_t *v, int n) {
    if (n == 0) {
        put_u8(b, ')');
        return;
    }
    if (n > 3) put_u8(b, '(');
    for (int i = 0; i < n; i++) pk_int(b, v[i]);
    put_u8(b, n == 1 ? 0x85 : n == 2 ? 0x86 : n == 3 ? 0x87 : 't');
}

/* {key: tensor(contiguous, shape, dtype) over storage '0'}. */
static void pickle_one_tensor(bytes *b, const char *key, epx_pt_dtype dt, const int64_t *shape,
                              int ndim) {
    int64_t stride[EPX_PT_MAX_DIMS], numel = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        stride[d] = numel;
        numel *= shape[d];
    }
    put_u8(b, 0x80); /* PROTO 2 */
    put_u8(b, 2);
    put_u8(b, '}'); /* EMPTY_DICT */
    pk_str(b, key);
    pk_global(b, "torch._utils", "_rebuild_tensor_v2");
    put_u8(b, '('); /* MARK: the arguments */
    put_u8(b, '('); /* MARK: the persistent id */
    pk_str(b, "storage");
    pk_global(b, "torch", epxi_pt_storage_name(dt));
    pk_str(b, "0");
    pk_str(b, "cpu");
    pk_int(b, numel);
    put_u8(b, 't'); /* TUPLE */
    put_u8(b, 'Q'); /* BINPERSID */
    pk_int(b, 0);   /* storage_offset */
    pk_int_tuple(b, shape, ndim);
    pk_int_tuple(b, stride, ndim);
    put_u8(b, 0x89); /* NEWFALSE: requires_grad */
    pk_global(b, "collections", "OrderedDict");
    put_u8(b, ')'); /* EMPTY_TUPLE */
    put_u8(b, 'R'); /* REDUCE: backward_hooks */
    put_u8(b, 't'); /* TUPLE */
    put_u8(b, 'R'); /* REDUCE: the tensor */
    put_u8(b, 's'); /* SETITEM */
    put_u8(b, '.'); /* STOP */
}

/* ---- the zip ------------------------------------------------------------ */

#define ALIGN 64
#define PAD_FIELD_ID 0x4246 /* "FB", the id torch's writer pads with */

typedef struct {
    char name[160];
    const void *data;
    size_t len;
} entry;

/* The archive folder: the file's stem, as torch.save names it. */
static void archive_stem(const char *path, char *out, size_t cap) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (n > 3 && strcmp(base + n - 3, ".pt") == 0) n -= 3;
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < cap && k < 100; i++) {
        char c = base[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '-';
        out[k++] = ok ? c : '_';
    }
    if (k == 0) k = (size_t)snprintf(out, cap, "archive");
    out[k] = '\0';
}

static epx_status zip_fail(epx_error *err, zip_t *za, const char *what, const char *path) {
    return epxi_fail(err, EPX_ERR_IO, "cannot write '%.256s' (%s): %s", path, what,
                     za ? zip_strerror(za) : "zip error");
}

/* The finished archive's bytes, handed to the safe-output body. */
typedef struct zip_bytes {
    zip_source_t *src;
    zip_uint64_t size;
    const char *path;
} zip_bytes;

static epx_status copy_zip(FILE *f, const void *vctx, epx_error *err) {
    const zip_bytes *z = vctx;
    if (zip_source_open(z->src) != 0)
        return epxi_fail(err, EPX_ERR_IO, "cannot write '%.256s': cannot reopen the archive",
                         z->path);
    char buf[1 << 15];
    zip_uint64_t left = z->size;
    epx_status st = EPX_OK;
    while (left > 0) {
        zip_int64_t n = zip_source_read(z->src, buf, left < sizeof buf ? left : sizeof buf);
        if (n <= 0) {
            st = epxi_fail(err, EPX_ERR_IO, "cannot write '%.256s': archive read failed", z->path);
            break;
        }
        if (fwrite(buf, 1, (size_t)n, f) != (size_t)n) break; /* the caller reports errno */
        left -= (zip_uint64_t)n;
    }
    zip_source_close(z->src);
    return st;
}

/* The archive is built in memory, then written through core's safe-output
 * path (temp file beside the target, rename), like every other output: a
 * symlink is written through and a FIFO or device is refused. */
static epx_status write_zip(const char *path, const entry *ents, size_t n, epx_error *err) {
    EPX_TRY(epx_file_output_check(path, NULL, err));
    zip_error_t ze;
    zip_error_init(&ze);
    zip_source_t *mem = zip_source_buffer_create(NULL, 0, 0, &ze);
    zip_t *za = mem ? zip_open_from_source(mem, ZIP_TRUNCATE, &ze) : NULL;
    if (za == NULL) {
        epx_status st =
            epxi_fail(err, EPX_ERR_IO, "cannot create '%.256s': %s", path, zip_error_strerror(&ze));
        zip_error_fini(&ze);
        if (mem) zip_source_free(mem);
        return st;
    }
    zip_error_fini(&ze);
    zip_source_keep(mem); /* survive zip_close: it holds the bytes */
    static const uint8_t PAD[ALIGN] = {0};
    uint64_t offset = 0; /* where the next local header starts */
    for (size_t i = 0; i < n; i++) {
        zip_source_t *src = zip_source_buffer(za, ents[i].data, ents[i].len, 0);
        if (src == NULL) {
            zip_discard(za);
            zip_source_free(mem);
            return zip_fail(err, NULL, "out of memory", path);
        }
        zip_int64_t idx = zip_file_add(za, ents[i].name, src, ZIP_FL_ENC_UTF_8);
        if (idx < 0) {
            zip_source_free(src);
            epx_status st = zip_fail(err, za, "adding an entry", path);
            zip_discard(za);
            zip_source_free(mem);
            return st;
        }
        size_t name_len = strlen(ents[i].name);
        uint64_t data_at = offset + 30 + name_len + 4;
        uint16_t pad = (uint16_t)((ALIGN - data_at % ALIGN) % ALIGN);
        if (zip_set_file_compression(za, (zip_uint64_t)idx, ZIP_CM_STORE, 0) != 0 ||
            zip_file_set_dostime(za, (zip_uint64_t)idx, 0, (1 << 5) | 1, 0) != 0 ||
            zip_file_extra_field_set(za, (zip_uint64_t)idx, PAD_FIELD_ID, ZIP_EXTRA_FIELD_NEW, PAD,
                                     pad, ZIP_FL_LOCAL) != 0) {
            epx_status st = zip_fail(err, za, "setting entry attributes", path);
            zip_discard(za);
            zip_source_free(mem);
            return st;
        }
        offset = data_at + pad + ents[i].len;
    }
    if (zip_close(za) != 0) {
        epx_status st = zip_fail(err, za, "closing", path);
        zip_discard(za);
        zip_source_free(mem);
        return st;
    }
    zip_stat_t zs;
    zip_stat_init(&zs);
    if (zip_source_stat(mem, &zs) != 0 || !(zs.valid & ZIP_STAT_SIZE)) {
        zip_source_free(mem);
        return epxi_fail(err, EPX_ERR_IO, "cannot write '%.256s': archive size unknown", path);
    }
    zip_bytes zb = {mem, zs.size, path};
    epx_status st = epxi_write_atomically(path, copy_zip, &zb, err);
    zip_source_free(mem);
    return st;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const uint8_t *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}

/* Write {key: tensor} where the storage bytes are already laid out. */
static epx_status write_tensor_file(const char *path, const char *key, epx_pt_dtype dt,
                                    const int64_t *shape, int ndim, const void *storage,
                                    size_t nbytes, epx_error *err) {
    bytes pkl = {0};
    pickle_one_tensor(&pkl, key, dt, shape, ndim);
    if (pkl.oom) {
        free(pkl.p);
        return epxi_fail(err, EPX_ERR_NOMEM, "out of memory building the pickle");
    }
    char stem[128];
    archive_stem(path, stem, sizeof stem);
    /* torch draws the id at random; a hash of the content keeps output
     * reproducible while still telling files apart. */
    uint64_t h1 = fnv1a(0xcbf29ce484222325ull, pkl.p, pkl.n);
    uint64_t h2 = fnv1a(h1 ^ 0x9e3779b97f4a7c15ull, storage, nbytes);
    char serial[48];
    snprintf(serial, sizeof serial, "%020llu%020llu",
             (unsigned long long)(h1 % 10000000000000000000ull),
             (unsigned long long)(h2 % 10000000000000000000ull));
    static const uint8_t EMPTY = 0;
    const struct {
        const char *suffix;
        const void *data;
        size_t len;
    } parts[] = {
        {"data.pkl", pkl.p, pkl.n},
        {".format_version", "1", 1},
        {".storage_alignment", "64", 2},
        {"byteorder", "little", 6},
        {"data/0", nbytes ? storage : &EMPTY, nbytes},
        {"version", "3\n", 2},
        {".data/serialization_id", serial, 40},
    };
    entry ents[sizeof parts / sizeof parts[0]];
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        snprintf(ents[i].name, sizeof ents[i].name, "%s/%s", stem, parts[i].suffix);
        ents[i].data = parts[i].data;
        ents[i].len = parts[i].len;
    }
    epx_status st = write_zip(path, ents, sizeof ents / sizeof ents[0], err);
    free(pkl.p);
    return st;
}

epx_status epx_layout_write_pt(const epx_layout *lay, const char *path, epx_error *err) {
    if (lay == NULL || path == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    const epx_shape *s = epx_layout_shape(lay);
    const int32_t *m = epx_layout_physical_to_logical(lay);
    const size_t n = (size_t)s->num_layers * (size_t)s->num_physical_experts;
    uint8_t *buf = epxi_calloc(n, 8, "mapping storage", err);
    if (buf == NULL) return EPX_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 8; k++)
            buf[8 * i + (size_t)k] = (uint8_t)((uint64_t)(int64_t)m[i] >> (8 * k));
    int64_t shape[2] = {s->num_layers, s->num_physical_experts};
    epx_status st = write_tensor_file(path, "physical_to_logical_map", EPX_PT_DTYPE_INT64, shape, 2,
                                      buf, n * 8, err);
    free(buf);
    return st;
}

epx_status epx_counts_write_pt(const epx_counts *c, const char *path, epx_pt_dtype dt,
                               epx_error *err) {
    if (path == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    EPX_TRY(epxi_counts_valid(c, "epx_counts_write_pt", err));
    const size_t n = (size_t)c->num_windows * (size_t)c->num_layers * (size_t)c->num_experts;
    EPX_TRY(epxi_check_loads(c->data, n, "counts", err)); /* what the readers take back */
    if (dt == EPX_PT_DTYPE_AUTO) {
        dt = EPX_PT_DTYPE_INT64;
        for (size_t i = 0; i < n && dt == EPX_PT_DTYPE_INT64; i++)
            if (!(c->data[i] == floor(c->data[i]) && fabs(c->data[i]) < 0x1p63))
                dt = EPX_PT_DTYPE_FLOAT64;
    }
    if (dt != EPX_PT_DTYPE_INT64 && dt != EPX_PT_DTYPE_INT32 && dt != EPX_PT_DTYPE_FLOAT32 &&
        dt != EPX_PT_DTYPE_FLOAT64)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "counts are written as int64, int32, float32 or float64, not %s",
                         epx_pt_dtype_str(dt));
    const size_t esz = epx_pt_dtype_size(dt);
    uint8_t *buf = epxi_calloc(n, esz, "counts storage", err);
    if (buf == NULL) return EPX_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        double x = c->data[i];
        uint64_t bits;
        /* (loads are at most 2^63 in all, so float32's range holds each one;
         * its 24-bit mantissa does not hold every whole number above 2^24,
         * and a count read back as another count is silent garbage) */
        const bool is_int = dt == EPX_PT_DTYPE_INT64 || dt == EPX_PT_DTYPE_INT32;
        const double hi = dt == EPX_PT_DTYPE_INT64 ? 0x1p63 : 0x1p31;
        const bool whole = x == floor(x);
        const char *fix = NULL;
        if (is_int && !whole)
            fix = "write float32 or float64";
        else if (is_int && x >= hi)
            fix = dt == EPX_PT_DTYPE_INT32 ? "write int64 or float64" : "write float64";
        else if (dt == EPX_PT_DTYPE_FLOAT32 && whole && (double)(float)x != x)
            fix = "float32 holds whole numbers exactly only up to 2^24 (16777216): write int64 "
                  "or float64";
        if (fix != NULL) {
            free(buf);
            size_t le = (size_t)c->num_layers * (size_t)c->num_experts;
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "load [%zu][%zu][%zu] is %.17g, which %s cannot hold%s: %s", i / le,
                             (i % le) / (size_t)c->num_experts, i % (size_t)c->num_experts, x,
                             epx_pt_dtype_str(dt), is_int ? "" : " exactly", fix);
        }
        if (is_int) {
            bits = (uint64_t)(int64_t)x;
        } else if (dt == EPX_PT_DTYPE_FLOAT32) {
            float f = (float)x;
            uint32_t b32;
            memcpy(&b32, &f, sizeof b32);
            bits = b32;
        } else {
            memcpy(&bits, &x, sizeof bits);
        }
        for (size_t k = 0; k < esz; k++) buf[esz * i + k] = (uint8_t)(bits >> (8 * k));
    }
    int64_t shape[3] = {c->num_windows, c->num_layers, c->num_experts};
    epx_status st =
        c->num_windows == 1
            ? write_tensor_file(path, "logical_count", dt, shape + 1, 2, buf, n * esz, err)
            : write_tensor_file(path, "logical_count", dt, shape, 3, buf, n * esz, err);
    free(buf);
    return st;
}
