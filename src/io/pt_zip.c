/*
 * pt_zip.c - the zip container of a torch.save file, through libzip.
 *
 * torch.save (since torch 1.6) writes a zip whose entries all sit in one
 * folder, the "archive" (torch takes its name from the first entry):
 * data.pkl is the pickle, data/<key> the raw bytes of each storage,
 * byteorder says "little" or "big", version the format. Entries are stored
 * uncompressed.
 *
 * A zip's directory states each entry's sizes, and a hostile file can state
 * anything: a stored entry is only accepted when its size equals its
 * compressed size and fits in the archive, a deflated one when its size is
 * within what deflate can expand to, and buffers grow with the bytes that
 * actually arrive, so no claim alone causes an allocation. libzip checks
 * each entry's CRC when it is read to the end, which this reader always
 * does. Storages are read lazily, only when the pickle refers to them, and
 * once each.
 */
#include <fcntl.h>
#include <unistd.h>
#include <string.h>
#include <sys/stat.h>
#include <zip.h>

#include "pt_internal.h"

typedef struct zip_ctx {
    zip_t *za;
    char prefix[256]; /* "<archive>/" */
    uint64_t archive_len;
    zip_int64_t num_entries;
    const void **cache_data; /* per entry index: bytes read so far, or NULL */
    size_t *cache_len;
} zip_ctx;

static epx_status zip_code_fail(epx_error *err, epx_status st, int code, const char *what) {
    zip_error_t ze;
    zip_error_init_with_code(&ze, code);
    epxi_fail(err, st, "%s: %s", what, zip_error_strerror(&ze));
    zip_error_fini(&ze);
    return st;
}

/* Read entry `idx` whole, checking its claimed sizes first. */
static epx_status read_entry(zip_ctx *z, zip_uint64_t idx, uint8_t **out, size_t *out_len,
                             epx_error *err) {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(z->za, idx, 0, &st) != 0)
        return epxi_fail(err, EPX_ERR_PARSE, "zip entry %llu cannot be described: %s",
                         (unsigned long long)idx, zip_strerror(z->za));
    const char *name = (st.valid & ZIP_STAT_NAME) ? st.name : "?";
    const zip_uint64_t want = ZIP_STAT_SIZE | ZIP_STAT_COMP_SIZE | ZIP_STAT_COMP_METHOD;
    if ((st.valid & want) != want)
        return epxi_fail(err, EPX_ERR_PARSE, "zip entry '%.200s' has no sizes", name);
    if ((st.valid & ZIP_STAT_ENCRYPTION_METHOD) && st.encryption_method != ZIP_EM_NONE)
        return epxi_fail(err, EPX_ERR_UNSUPPORTED, "zip entry '%.200s' is encrypted", name);
    if (st.comp_size > z->archive_len)
        return epxi_fail(err, EPX_ERR_PARSE,
                         "zip entry '%.200s' claims %llu compressed bytes in an archive of "
                         "%llu",
                         name, (unsigned long long)st.comp_size,
                         (unsigned long long)z->archive_len);
    if (st.comp_method == ZIP_CM_STORE) {
        if (st.size != st.comp_size)
            return epxi_fail(err, EPX_ERR_PARSE,
                             "stored zip entry '%.200s' claims %llu bytes but occupies %llu", name,
                             (unsigned long long)st.size, (unsigned long long)st.comp_size);
    } else if (st.comp_method == ZIP_CM_DEFLATE) {
        /* deflate expands at most ~1032:1 */
        if (st.size / 1032 > st.comp_size + 1)
            return epxi_fail(err, EPX_ERR_PARSE,
                             "deflated zip entry '%.200s' claims %llu bytes from %llu: more "
                             "than deflate can produce",
                             name, (unsigned long long)st.size, (unsigned long long)st.comp_size);
    } else {
        return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                         "zip entry '%.200s' uses compression method %d; torch.save stores "
                         "entries uncompressed",
                         name, (int)st.comp_method);
    }
    if (st.size >= (zip_uint64_t)(SIZE_MAX / 2))
        return epxi_fail(err, EPX_ERR_OVERFLOW, "zip entry '%.200s' is too large", name);

    zip_file_t *zf = zip_fopen_index(z->za, idx, 0);
    if (zf == NULL)
        return epxi_fail(err, EPX_ERR_PARSE, "cannot open zip entry '%.200s': %s", name,
                         zip_strerror(z->za));
    const size_t size = (size_t)st.size;
    size_t cap = st.comp_method == ZIP_CM_STORE ? size : (size < 65536 ? size : 65536);
    uint8_t *buf = epxi_calloc(cap ? cap : 1, 1, "zip entry", err);
    if (buf == NULL) {
        zip_fclose(zf);
        return EPX_ERR_NOMEM;
    }
    size_t got = 0;
    epx_status rc = EPX_OK;
    while (got < size) {
        if (got == cap) {
            size_t nc = cap * 2 < size ? cap * 2 : size;
            uint8_t *nb = realloc(buf, nc);
            if (nb == NULL) {
                rc = epxi_fail(err, EPX_ERR_NOMEM, "out of memory reading '%.200s'", name);
                break;
            }
            buf = nb;
            cap = nc;
        }
        zip_int64_t n = zip_fread(zf, buf + got, cap - got);
        if (n < 0) {
            rc = epxi_fail(err, EPX_ERR_PARSE, "zip entry '%.200s' is corrupt: %s", name,
                           zip_error_strerror(zip_file_get_error(zf)));
            break;
        }
        if (n == 0) {
            rc = epxi_fail(err, EPX_ERR_PARSE, "zip entry '%.200s' ends after %zu of its %zu bytes",
                           name, got, size);
            break;
        }
        got += (size_t)n;
    }
    /* Read to the end so libzip verifies the CRC (and no extra byte hides). */
    if (rc == EPX_OK) {
        uint8_t extra;
        zip_int64_t n = zip_fread(zf, &extra, 1);
        if (n != 0)
            rc = epxi_fail(err, EPX_ERR_PARSE, "zip entry '%.200s' is corrupt: %s", name,
                           n < 0 ? zip_error_strerror(zip_file_get_error(zf))
                                 : "more data than its size");
    }
    zip_fclose(zf);
    if (rc != EPX_OK) {
        free(buf);
        return rc;
    }
    *out = buf;
    *out_len = size;
    return EPX_OK;
}

static epx_status locate(zip_ctx *z, const char *suffix, size_t suffix_len, zip_int64_t *idx,
                         epx_error *err) {
    char name[400];
    size_t plen = strlen(z->prefix);
    if (plen + suffix_len + 1 > sizeof name)
        return epxi_fail(err, EPX_ERR_PARSE, "zip entry name too long");
    memcpy(name, z->prefix, plen);
    memcpy(name + plen, suffix, suffix_len);
    name[plen + suffix_len] = '\0';
    *idx = zip_name_locate(z->za, name, 0);
    return EPX_OK;
}

/* The storage resolver the unpickler calls: bytes of <archive>/data/<key>. */
static epx_status resolve_storage(void *vctx, epx_pt_file *f, const char *key, size_t key_len,
                                  uint64_t claimed, const void **data, size_t *nbytes,
                                  epx_error *err) {
    zip_ctx *z = vctx;
    (void)claimed; /* the entry's real size is what counts */
    char suffix[80];
    if (key_len > 64) return epxi_fail(err, EPX_ERR_PARSE, "storage key too long");
    memcpy(suffix, "data/", 5);
    memcpy(suffix + 5, key, key_len);
    zip_int64_t idx = -1;
    EPX_TRY(locate(z, suffix, 5 + key_len, &idx, err));
    if (idx < 0 || idx >= z->num_entries)
        return epxi_fail(err, EPX_ERR_PARSE,
                         "the pickle refers to storage '%.64s' but the archive has no "
                         "%sdata/%.64s",
                         key, z->prefix, key);
    if (z->cache_data[idx] == NULL) {
        uint8_t *buf = NULL;
        size_t n = 0;
        EPX_TRY(read_entry(z, (zip_uint64_t)idx, &buf, &n, err));
        EPX_TRY(epxi_pt_file_own(f, buf, err));
        z->cache_data[idx] = buf;
        z->cache_len[idx] = n;
    }
    *data = z->cache_data[idx];
    *nbytes = z->cache_len[idx];
    return EPX_OK;
}

/* Everything after the zip is open: find the archive, check byteorder,
 * unpickle. */
static epx_status load_archive(zip_ctx *z, epx_pt_file *f, epx_error *err) {
    z->num_entries = zip_get_num_entries(z->za, 0);
    if (z->num_entries <= 0)
        return epxi_fail(err, EPX_ERR_PARSE, "the zip archive is empty: not a torch.save file");
    const char *first = zip_get_name(z->za, 0, ZIP_FL_ENC_RAW);
    const char *slash = first ? strchr(first, '/') : NULL;
    if (slash == NULL || slash == first || (size_t)(slash - first) + 2 > sizeof z->prefix)
        return epxi_fail(err, EPX_ERR_PARSE,
                         "the zip's first entry is not inside an archive folder "
                         "(<archive>/data.pkl): not a torch.save file");
    size_t plen = (size_t)(slash - first) + 1;
    memcpy(z->prefix, first, plen);
    z->prefix[plen] = '\0';
    z->cache_data = epxi_calloc((size_t)z->num_entries, sizeof *z->cache_data, "zip cache", err);
    z->cache_len = z->cache_data
                       ? epxi_calloc((size_t)z->num_entries, sizeof *z->cache_len, "zip cache", err)
                       : NULL;
    if (z->cache_len == NULL) return EPX_ERR_NOMEM;

    zip_int64_t idx = -1;
    EPX_TRY(locate(z, "byteorder", 9, &idx, err));
    if (idx >= 0) {
        uint8_t *bo = NULL;
        size_t n = 0;
        EPX_TRY(read_entry(z, (zip_uint64_t)idx, &bo, &n, err));
        bool little = n == 6 && memcmp(bo, "little", 6) == 0;
        bool big = n == 3 && memcmp(bo, "big", 3) == 0;
        free(bo);
        if (big)
            return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                             "the file was written on a big-endian machine (byteorder 'big'); "
                             "epx reads little-endian storages: re-save it on a little-endian "
                             "host");
        if (!little)
            return epxi_fail(err, EPX_ERR_PARSE, "%sbyteorder is neither 'little' nor 'big'",
                             z->prefix);
    }
    EPX_TRY(locate(z, "data.pkl", 8, &idx, err));
    if (idx < 0)
        return epxi_fail(err, EPX_ERR_PARSE,
                         "the archive has no %sdata.pkl: not a torch.save file (a TorchScript "
                         "archive keeps code, which epx does not read)",
                         z->prefix);
    uint8_t *pkl = NULL;
    size_t pkl_len = 0;
    EPX_TRY(read_entry(z, (zip_uint64_t)idx, &pkl, &pkl_len, err));
    epx_status st = epxi_pt_unpickle(f, pkl, pkl_len, resolve_storage, z, err);
    free(pkl);
    return st;
}

/* Open `src` (taking it over), load, and clean up on every path. */
static epx_status load_source(zip_source_t *src, uint64_t archive_len, const char *name,
                              const uint8_t *head, size_t head_len, epx_pt_file **out,
                              epx_error *err) {
    zip_error_t ze;
    zip_error_init(&ze);
    zip_t *za = zip_open_from_source(src, ZIP_RDONLY | ZIP_CHECKCONS, &ze);
    if (za == NULL) {
        int code = zip_error_code_zip(&ze);
        zip_error_fini(&ze);
        zip_source_free(src);
        if (head_len >= 1 && head[0] == 0x80)
            return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                             "this is a bare pickle (torch's legacy format or pickle.dump), "
                             "not a torch.save zip: re-save it with a current torch.save");
        if (code == ZIP_ER_MEMORY)
            return epxi_fail(err, EPX_ERR_NOMEM, "out of memory opening the zip");
        return zip_code_fail(err, EPX_ERR_PARSE, code, "not a readable zip archive");
    }
    zip_error_fini(&ze);
    zip_ctx z = {0};
    z.za = za;
    z.archive_len = archive_len;
    epx_pt_file *f = NULL;
    epx_status st = epxi_pt_file_new(name, &f, err);
    if (st == EPX_OK) st = load_archive(&z, f, err);
    zip_discard(za);
    free(z.cache_data);
    free(z.cache_len);
    if (st != EPX_OK) {
        epx_pt_file_destroy(f);
        return st;
    }
    *out = f;
    return EPX_OK;
}

epx_status epx_pt_load_buffer(const void *data, size_t len, const char *name, epx_pt_file **out,
                              epx_error *err) {
    if ((data == NULL && len > 0) || out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    zip_error_t ze;
    zip_error_init(&ze);
    zip_source_t *src = zip_source_buffer_create(data, len, 0, &ze);
    if (src == NULL) {
        zip_error_fini(&ze);
        return epxi_fail(err, EPX_ERR_NOMEM, "out of memory opening a buffer");
    }
    zip_error_fini(&ze);
    epx_status st = load_source(src, len, name, data, len, out, err);
    if (st != EPX_OK && name != NULL) epxi_error_prefix(err, "'%.256s'", name);
    return st;
}

int epx_pt_sniff(const char *path) {
    struct stat sb;
    if (path == NULL || stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) return 0;
    uint8_t m[4] = {0};
    size_t n = fread(m, 1, sizeof m, fp);
    fclose(fp);
    return n == 4 && m[0] == 'P' && m[1] == 'K' &&
           ((m[2] == 3 && m[3] == 4) || (m[2] == 5 && m[3] == 6));
}

epx_status epx_pt_load(const char *path, epx_pt_file **out, epx_error *err) {
    if (path == NULL || out == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    struct stat sb;
    /* A FIFO, device or socket is refused before it is opened (it would
     * block or never end), and the open cannot block (epx_file_read). */
    EPX_TRY(epx_file_input_check(path, err));
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    FILE *fp = fd < 0 ? NULL : fdopen(fd, "rb");
    if (fp == NULL && fd >= 0) close(fd);
    if (fp == NULL || fstat(fileno(fp), &sb) != 0) {
        if (fp) fclose(fp);
        return epxi_fail(err, EPX_ERR_IO, "cannot open '%.256s'", path);
    }
    if (!S_ISREG(sb.st_mode)) {
        fclose(fp);
        return epxi_fail(err, EPX_ERR_IO, "'%.256s' is not a regular file", path);
    }
    uint8_t head[2] = {0};
    size_t head_len = fread(head, 1, sizeof head, fp);
    fclose(fp);
    zip_error_t ze;
    zip_error_init(&ze);
    zip_source_t *src = zip_source_file_create(path, 0, -1, &ze);
    if (src == NULL) {
        epx_status st = zip_code_fail(err, EPX_ERR_IO, zip_error_code_zip(&ze), "cannot open");
        zip_error_fini(&ze);
        epxi_error_prefix(err, "'%.256s'", path);
        return st;
    }
    zip_error_fini(&ze);
    epx_status st = load_source(src, (uint64_t)sb.st_size, path, head, head_len, out, err);
    if (st != EPX_OK) epxi_error_prefix(err, "'%.256s'", path);
    return st;
}
