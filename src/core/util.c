/*
 * util.c - checked allocation, whole-file reading and small string helpers
 * used across the library. Allocation sizes are computed with overflow
 * checks so a hostile size in a file becomes an error, not a wrap-around.
 */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

void *epxi_calloc(size_t n, size_t size, const char *what, epx_error *err) {
    size_t bytes;
    if (!epxi_mul_size(n, size, &bytes)) {
        epxi_fail(err, EPX_ERR_OVERFLOW, "%s: %zu elements of %zu bytes overflow size_t", what, n,
                  size);
        return NULL;
    }
    void *p = calloc(bytes ? n : 1, bytes ? size : 1);
    if (p == NULL)
        epxi_fail(err, EPX_ERR_NOMEM, "%s: out of memory allocating %zu bytes", what, bytes);
    return p;
}

void epx_free(void *p) { free(p); }

bool epxi_has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

epx_status epxi_read_file(const char *path, char **data, size_t *len, epx_error *err) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return epxi_fail(err, EPX_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (buf == NULL) {
        fclose(f);
        return epxi_fail(err, EPX_ERR_NOMEM, "out of memory reading '%s'", path);
    }
    for (;;) {
        if (n + 1 >= cap) {
            if (cap > ((size_t)-1) / 2) break;
            char *nb = realloc(buf, cap * 2);
            if (nb == NULL) {
                free(buf);
                fclose(f);
                return epxi_fail(err, EPX_ERR_NOMEM, "out of memory reading '%s'", path);
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - 1 - n, f);
        n += got;
        if (got == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return epxi_fail(err, EPX_ERR_IO, "error reading '%s'", path);
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return EPX_OK;
}

/* Write to a temp file beside `path`, then rename, so readers never see a
 * half-written placement and a failed write loses nothing. */
epx_status epxi_write_atomically(const char *path, epxi_write_body_fn body, const void *ctx,
                                 epx_error *err) {
    size_t n = strlen(path) + 16;
    char *tmp = malloc(n);
    if (tmp == NULL) return epxi_fail(err, EPX_ERR_NOMEM, "out of memory");
    snprintf(tmp, n, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL) {
        free(tmp);
        return epxi_fail(err, EPX_ERR_IO, "cannot create '%s'", path);
    }
    epx_status st = body(f, ctx);
    if (fclose(f) != 0 && st == EPX_OK) st = EPX_ERR_IO;
    if (st == EPX_OK && rename(tmp, path) != 0) st = EPX_ERR_IO;
    if (st != EPX_OK) {
        remove(tmp);
        free(tmp);
        return epxi_fail(err, st, "cannot write '%s'", path);
    }
    free(tmp);
    return EPX_OK;
}
