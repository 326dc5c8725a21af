/*
 * error.c - status names, the caller-owned error buffer, and logging.
 *
 * Messages are written into the caller's epx_error, never into a global, so
 * two threads working on different handles never see each other's errors.
 */
#include "internal.h"

#include <stdio.h>
#include <string.h>

const char *epx_status_str(epx_status st) {
    static const char *const names[EPX_STATUS_COUNT_] = {
        [EPX_OK] = "EPX_OK",
        [EPX_ERR_INVALID_ARG] = "EPX_ERR_INVALID_ARG",
        [EPX_ERR_SHAPE] = "EPX_ERR_SHAPE",
        [EPX_ERR_PARSE] = "EPX_ERR_PARSE",
        [EPX_ERR_IO] = "EPX_ERR_IO",
        [EPX_ERR_NOMEM] = "EPX_ERR_NOMEM",
        [EPX_ERR_OVERFLOW] = "EPX_ERR_OVERFLOW",
        [EPX_ERR_UNSUPPORTED] = "EPX_ERR_UNSUPPORTED",
        [EPX_ERR_REFUSED] = "EPX_ERR_REFUSED",
        [EPX_ERR_INVALID_MAP] = "EPX_ERR_INVALID_MAP",
        [EPX_ERR_COMM] = "EPX_ERR_COMM",
        [EPX_ERR_CUDA] = "EPX_ERR_CUDA",
        [EPX_ERR_TIMEOUT] = "EPX_ERR_TIMEOUT",
        [EPX_ERR_INTERNAL] = "EPX_ERR_INTERNAL",
    };
    if ((int)st < 0 || st >= EPX_STATUS_COUNT_ || names[st] == NULL) return "EPX_ERR_UNKNOWN";
    return names[st];
}

const char *epx_version(void) {
#define EPXI_STR2(x) #x
#define EPXI_STR(x) EPXI_STR2(x)
    return EPXI_STR(EPX_VERSION_MAJOR) "." EPXI_STR(EPX_VERSION_MINOR) "." EPXI_STR(
        EPX_VERSION_PATCH);
}

epx_status epxi_fail(epx_error *err, epx_status st, const char *fmt, ...) {
    if (err != NULL) {
        va_list ap;
        va_start(ap, fmt);
        err->status = st;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

void epxi_error_prefix(epx_error *err, const char *fmt, ...) {
    if (err == NULL) return;
    char prefix[EPX_ERRMSG_MAX];
    char old[EPX_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    old[sizeof old - 1] = '\0';
    /* Truncation is acceptable: the start of the message matters most. */
    size_t n = strlen(prefix);
    if (n > sizeof err->msg - 3) n = sizeof err->msg - 3;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 2);
    size_t rest = sizeof err->msg - n - 3;
    size_t m = strlen(old);
    if (m > rest) m = rest;
    memcpy(err->msg + n + 2, old, m);
    err->msg[n + 2 + m] = '\0';
}

void epxi_log(epx_log_fn fn, void *user, epx_log_level lvl, const char *fmt, ...) {
    if (fn == NULL) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fn(user, lvl, line);
}

epx_status epxi_check_version(uint32_t version, uint32_t expected, const char *type,
                              const char *init, epx_error *err) {
    if (version == expected) return EPX_OK;
    return epxi_fail(err, EPX_ERR_INVALID_ARG,
                     "%s.version is %u, this library knows %u (its size in bytes): "
                     "initialise the struct with %s",
                     type, version, expected, init);
}
