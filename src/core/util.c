/*
 * util.c - checked allocation, whole-file reading and small string helpers
 * used across the library. Allocation sizes are computed with overflow
 * checks so a hostile size in a file becomes an error, not a wrap-around.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <stdint.h>
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

/* ---- safe inputs -----------------------------------------------------
 * Every file epx reads as text goes through here (epx_file_read). What must
 * stay true: a FIFO, device or socket is refused from stat() before it is
 * opened (a FIFO would block, /dev/zero would never end); the open is
 * non-blocking, and the opened file is checked again (a name swapped for a
 * FIFO in between cannot block); a regular file above the limit is refused
 * from its size, before a byte is read; and at most limit + 1 bytes are ever
 * read (a file that grows while read). */

static const char *file_kind(mode_t m);

static epx_status too_big(const char *path, size_t max, const char *what, epx_error *err) {
    return epxi_fail(err, EPX_ERR_INVALID_ARG,
                     "'%.256s' is larger than %zu bytes, the limit for %s: give the file "
                     "itself, not something padded or generated",
                     path, max, what ? what : "an input file");
}

/* path names a regular file (stat in *st): not empty, not missing, not a
 * directory, FIFO, device or socket (which could block or never end). */
static epx_status regular_input(const char *path, struct stat *st, epx_error *err) {
    if (path[0] == '\0')
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "an input path is empty: give a file name");
    if (stat(path, st) != 0)
        return epxi_fail(err, EPX_ERR_IO, "cannot open '%.256s': %s", path, strerror(errno));
    if (S_ISDIR(st->st_mode))
        return epxi_fail(err, EPX_ERR_IO, "'%.256s' is a directory: give a file", path);
    if (!S_ISREG(st->st_mode))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "input '%.256s' is %s; epx reads only regular files: give a file path",
                         path, file_kind(st->st_mode));
    return EPX_OK;
}

epx_status epx_file_read(const char *path, size_t max_bytes, const char *what, char **data,
                         size_t *len, epx_error *err) {
    if (path == NULL || data == NULL || len == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "epx_file_read: NULL argument");
    struct stat st;
    EPX_TRY(regular_input(path, &st, err));
    if (max_bytes >= ((size_t)-1) / 2) max_bytes = ((size_t)-1) / 2 - 1;
    if ((uint64_t)st.st_size > (uint64_t)max_bytes) return too_big(path, max_bytes, what, err);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return epxi_fail(err, EPX_ERR_IO, "cannot open '%.256s': %s", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "input '%.256s' changed into %s while opened; epx reads only regular "
                         "files: give a file path",
                         path, file_kind(st.st_mode));
    }
    size_t cap = (size_t)st.st_size + 2, n = 0;
    if (cap < 4096) cap = 4096;
    if (cap > max_bytes + 2) cap = max_bytes + 2;
    char *buf = malloc(cap);
    if (buf == NULL) {
        close(fd);
        return epxi_fail(err, EPX_ERR_NOMEM, "out of memory reading '%.256s' (%zu bytes)", path,
                         cap);
    }
    for (;;) {
        if (n + 1 >= cap) { /* full: grow, up to the limit + 1 byte */
            size_t ncap = cap * 2 > max_bytes + 2 ? max_bytes + 2 : cap * 2;
            if (ncap <= cap) break;
            char *nb = realloc(buf, ncap);
            if (nb == NULL) {
                free(buf);
                close(fd);
                return epxi_fail(err, EPX_ERR_NOMEM, "out of memory reading '%.256s'", path);
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t got = read(fd, buf + n, cap - 1 - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return epxi_fail(err, EPX_ERR_IO, "error reading '%.256s': %s", path, strerror(e));
        }
        if (got == 0) break;
        n += (size_t)got;
        if (n > max_bytes) break;
    }
    close(fd);
    if (n > max_bytes) {
        free(buf);
        return too_big(path, max_bytes, what, err);
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return EPX_OK;
}

epx_status epx_file_input_check(const char *path, epx_error *err) {
    struct stat st;
    if (path == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "epx_file_input_check: NULL path");
    return regular_input(path, &st, err);
}

/* ---- safe outputs ----------------------------------------------------
 * Every output goes through here (epx_file_write). What must stay true: the
 * target itself is never opened (a FIFO would block, a device would be
 * written), only a fresh temp file beside it, created with O_EXCL and
 * O_NOFOLLOW; the rename happens only over a regular file or a new name; a
 * symlink is resolved so the rename replaces its target, not the link. */

static const char *file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

epx_status epx_file_output_check(const char *path, char **target, epx_error *err) {
    if (path == NULL || path[0] == '\0')
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "an output path is empty: give a file name");
    char *cur = strdup(path);
    if (cur == NULL) return epxi_fail(err, EPX_ERR_NOMEM, "out of memory");
    for (int hops = 0;; hops++) {
        struct stat st;
        if (lstat(cur, &st) != 0) {
            if (errno != ENOENT) {
                epx_status r =
                    epxi_fail(err, EPX_ERR_IO, "cannot use output '%s': %s", path, strerror(errno));
                free(cur);
                return r;
            }
            break; /* a new name: the folder is checked below */
        }
        if (S_ISLNK(st.st_mode)) {
            if (hops >= 40) {
                free(cur);
                return epxi_fail(err, EPX_ERR_INVALID_ARG,
                                 "output '%s': too many symlinks (a loop?): give a plain file",
                                 path);
            }
            char link[4096];
            ssize_t n = readlink(cur, link, sizeof link - 1);
            if (n < 0 || (size_t)n >= sizeof link - 1) {
                free(cur);
                return epxi_fail(err, EPX_ERR_INVALID_ARG, "output '%s': cannot read its symlink",
                                 path);
            }
            link[n] = '\0';
            char *next;
            const char *slash = strrchr(cur, '/');
            if (link[0] == '/' || slash == NULL) {
                next = strdup(link);
            } else { /* relative to the link's folder */
                size_t d = (size_t)(slash - cur) + 1, m = d + (size_t)n + 1;
                next = malloc(m);
                if (next != NULL) snprintf(next, m, "%.*s%s", (int)d, cur, link);
            }
            free(cur);
            if (next == NULL) return epxi_fail(err, EPX_ERR_NOMEM, "out of memory");
            cur = next;
            continue;
        }
        if (!S_ISREG(st.st_mode)) {
            epx_status r = epxi_fail(err, EPX_ERR_INVALID_ARG,
                                     "output '%s' is %s; epx writes only regular files: give a "
                                     "file path",
                                     path, file_kind(st.st_mode));
            free(cur);
            return r;
        }
        break;
    }
    /* The folder must exist and be a folder. */
    const char *slash = strrchr(cur, '/');
    char dir[4096];
    if (slash == NULL)
        snprintf(dir, sizeof dir, ".");
    else
        snprintf(dir, sizeof dir, "%.*s", slash == cur ? 1 : (int)(slash - cur), cur);
    struct stat ds;
    if (stat(dir, &ds) != 0 || !S_ISDIR(ds.st_mode)) {
        epx_status r = epxi_fail(err, EPX_ERR_IO, "output '%s': folder '%s' %s: create it first",
                                 path, dir, errno == ENOENT ? "does not exist" : "is not a folder");
        free(cur);
        return r;
    }
    if (target != NULL)
        *target = cur;
    else
        free(cur);
    return EPX_OK;
}

/* DIR/.BASE.epx-tmp.PID for a resolved target. A BASE too long for that
 * to be a file name (a legal name of ~236-255 bytes) is cut, and the cut
 * marked with a hash of the whole BASE, DIR/.PREFIX~HASH.epx-tmp.PID, so
 * two long names of one prefix written by one process never share a temp. */
static epx_status temp_name(const char *target, char *buf, size_t cap, epx_error *err) {
    const char *slash = strrchr(target, '/');
    const char *base = slash ? slash + 1 : target;
    int dlen = slash ? (int)(slash - target) + 1 : 0;
    char pid[24];
    snprintf(pid, sizeof pid, ".epx-tmp.%ld", (long)getpid());
    const size_t blen = strlen(base), room = 255 - 1 - strlen(pid); /* NAME_MAX, the dot */
    int n;
    if (blen <= room) {
        n = snprintf(buf, cap, "%.*s.%s%s", dlen, target, base, pid);
    } else {
        uint32_t h = 2166136261u; /* FNV-1a */
        for (size_t i = 0; i < blen; i++) h = (h ^ (unsigned char)base[i]) * 16777619u;
        n = snprintf(buf, cap, "%.*s.%.*s~%08x%s", dlen, target, (int)(room - 9), base, (unsigned)h,
                     pid);
    }
    if (n < 0 || (size_t)n >= cap)
        return epxi_fail(err, EPX_ERR_OVERFLOW, "output '%s': path too long", target);
    return EPX_OK;
}

epx_status epx_file_temp_path(const char *path, char *buf, size_t cap, epx_error *err) {
    if (buf == NULL || cap == 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_file_temp_path: buf is NULL or cap is 0: give a buffer for the "
                         "name");
    char *target = NULL;
    EPX_TRY(epx_file_output_check(path, &target, err));
    epx_status st = temp_name(target, buf, cap, err);
    free(target);
    return st;
}

epx_status epxi_write_atomically(const char *path, epx_write_fn body, const void *ctx,
                                 epx_error *err) {
    char *target = NULL;
    EPX_TRY(epx_file_output_check(path, &target, err));
    char tmp[4096 + 64];
    epx_status st = temp_name(target, tmp, sizeof tmp, err);
    if (st != EPX_OK) {
        free(target);
        return st;
    }
    /* Keep the mode of a file we replace; a new file gets 0666 & ~umask. */
    struct stat ts;
    const bool replacing = stat(target, &ts) == 0;
    mode_t mode = replacing ? (ts.st_mode & 0777) : 0666;
    (void)unlink(tmp); /* a leftover of a killed run with our pid */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) {
        st = epxi_fail(err, EPX_ERR_IO, "cannot create a temp file beside '%s': %s", path,
                       strerror(errno));
        free(target);
        return st;
    }
    /* open() applied the umask; a replaced file keeps its own mode. */
    if (replacing && fchmod(fd, mode) != 0) mode = 0; /* best effort */
    FILE *f = fdopen(fd, "w");
    if (f == NULL) {
        st = epxi_fail(err, EPX_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
        close(fd);
        unlink(tmp);
        free(target);
        return st;
    }
    errno = 0;
    st = body(f, ctx, err);
    const int body_errno = errno;
    const bool ferror_seen = ferror(f) != 0;
    int werr = ferror_seen && body_errno != 0 ? body_errno : 0;
    if ((fflush(f) != 0 || ferror(f)) && werr == 0) werr = errno ? errno : EIO;
    if (fclose(f) != 0 && werr == 0) werr = errno ? errno : EIO;
    if (st != EPX_OK && werr == 0 && ferror_seen) werr = EIO;
    /* A body that failed without a word (a writer that only saw ferror)
     * and a failed flush or close both become one message naming the file. */
    if ((st == EPX_OK && werr != 0) ||
        (st != EPX_OK && (err == NULL || err->status == EPX_OK || err->msg[0] == '\0')))
        st = epxi_fail(err, werr != 0 || st == EPX_ERR_IO ? EPX_ERR_IO : st,
                       "cannot write '%s': %s", path,
                       strerror(werr != 0          ? werr
                                : st == EPX_ERR_IO ? EIO
                                                   : EINVAL));
    if (st == EPX_OK && rename(tmp, target) != 0)
        st = epxi_fail(err, EPX_ERR_IO, "cannot write '%s': rename failed: %s", path,
                       strerror(errno));
    if (st != EPX_OK) unlink(tmp);
    free(target);
    return st;
}

epx_status epx_file_write(const char *path, epx_write_fn body, const void *ctx, epx_error *err) {
    if (body == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "epx_file_write: body is NULL");
    return epxi_write_atomically(path, body, ctx, err);
}

size_t epxi_utf8_len(const unsigned char *p, size_t n) {
    const unsigned char c = p[0];
    size_t len;
    unsigned min;
    unsigned cp;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2, min = 0x80, cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3, min = 0x800, cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4, min = 0x10000, cp = c & 0x07;
    } else {
        return 0;
    }
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}
