/*
 * release.c - SGLang release strings. epx follows SGLang release by release
 * in two rooms (dispatch's static table rules, plan's EPLB rules); both
 * read the release here, so they accept and refuse the same strings.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Parse MAJOR.MINOR[.PATCH][.postN] (a leading 'v' allowed) into four numbers. */
static bool parse_release(const char *s, long v[4]) {
    v[0] = v[1] = v[2] = v[3] = 0;
    if (*s == 'v') s++;
    for (int i = 0; i < 3; i++) {
        if (*s < '0' || *s > '9') return false;
        char *end = NULL;
        v[i] = strtol(s, &end, 10);
        s = end;
        if (*s == '\0') return i >= 1;
        if (*s != '.') return false;
        s++;
        if (i >= 1 && strncmp(s, "post", 4) == 0) break;
    }
    if (strncmp(s, "post", 4) != 0 || s[4] < '0' || s[4] > '9') return false;
    char *end = NULL;
    v[3] = strtol(s + 4, &end, 10);
    return *end == '\0';
}

const char *epx_sglang_newest_verified(void) { return EPX_SGLANG_DEFAULT_VERSION; }

int epxi_release_cmp(const long a[4], const long b[4]) {
    for (int i = 0; i < 4; i++)
        if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
    return 0;
}

epx_status epxi_sglang_release(const char *release, long v[4], bool *newer, epx_error *err) {
    if (release == NULL || !parse_release(release, v))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "SGLang release '%.64s' is not MAJOR.MINOR[.PATCH][.postN] (e.g. 0.5.2, "
                         "0.5.4.post2, " EPX_SGLANG_DEFAULT_VERSION
                         "); pre-releases are refused, as which rule they carry is unknown",
                         release ? release : "(null)");
    long newest[4];
    parse_release(EPX_SGLANG_DEFAULT_VERSION, newest);
    if (newer) *newer = epxi_release_cmp(v, newest) > 0;
    return EPX_OK;
}
