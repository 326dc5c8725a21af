/*
 * release.c - SGLang release strings. epx follows SGLang release by release
 * in two rooms (dispatch's static table rules, plan's EPLB rules); both
 * read the release here, so they accept and refuse the same strings.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* One number of a release: digits, at most 6, no leading zero. */
static bool parse_num(const char **s, long *v) {
    const char *p = *s;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9')) return false;
    long x = 0;
    for (int n = 0; *p >= '0' && *p <= '9'; n++, p++) {
        if (n >= 6) return false;
        x = x * 10 + (*p - '0');
    }
    *v = x;
    *s = p;
    return true;
}

/* Parse MAJOR.MINOR.PATCH[.postN] (a leading 'v' allowed) into four numbers;
 * anything else (two numbers, a pre-release, a suffix) is not a release. */
static bool parse_release(const char *s, long v[4]) {
    v[0] = v[1] = v[2] = v[3] = 0;
    if (*s == 'v') s++;
    for (int i = 0; i < 3; i++) {
        if (i > 0 && *s++ != '.') return false;
        if (!parse_num(&s, &v[i])) return false;
    }
    if (*s == '\0') return true;
    if (strncmp(s, ".post", 5) != 0) return false;
    s += 5;
    return parse_num(&s, &v[3]) && *s == '\0';
}

const char *epx_sglang_newest_verified(void) { return EPX_SGLANG_DEFAULT_VERSION; }

int epxi_release_cmp(const long a[4], const long b[4]) {
    for (int i = 0; i < 4; i++)
        if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
    return 0;
}

const char *epx_sglang_oldest_verified(void) { return EPX_SGLANG_OLDEST_VERSION; }

epx_status epxi_sglang_release(const char *release, long v[4], bool *newer, epx_error *err) {
    if (release == NULL || !parse_release(release, v))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "SGLang release '%.64s' is not MAJOR.MINOR.PATCH[.postN] "
                         "(e.g. " EPX_SGLANG_OLDEST_VERSION
                         ", 0.5.4.post2, " EPX_SGLANG_DEFAULT_VERSION
                         "); pre-releases and shortened or suffixed releases are refused, as "
                         "which rule they carry is unknown",
                         release ? release : "(null)");
    long newest[4], oldest[4];
    parse_release(EPX_SGLANG_DEFAULT_VERSION, newest);
    parse_release(EPX_SGLANG_OLDEST_VERSION, oldest);
    if (epxi_release_cmp(v, oldest) < 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "SGLang release '%.64s' is older than " EPX_SGLANG_OLDEST_VERSION
                         ", the oldest release epx reproduces: give " EPX_SGLANG_OLDEST_VERSION
                         " or newer",
                         release);
    if (newer) *newer = epxi_release_cmp(v, newest) > 0;
    return EPX_OK;
}
