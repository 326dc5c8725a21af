/*
 * fuzz_sglang_release.c - libFuzzer target for the one parser of SGLang
 * release strings (core's release.c), through both rules that read it.
 *
 * Oracles: the table rule and the EPLB rule accept and refuse the same
 * strings with the same message; a refusal has a message; an accepted string
 * is MAJOR.MINOR.PATCH[.postN] (a leading 'v' allowed; numbers of 1 to 6
 * digits without a leading zero) at or above EPX_SGLANG_OLDEST_VERSION, as an
 * independent reading here says, and "newer" is set exactly when it is above
 * EPX_SGLANG_DEFAULT_VERSION; every string the independent reading accepts is
 * accepted.
 */
#include <stdbool.h>
#include <string.h>

#include "epx.h"

#include "fuzz_util.h"

/* The grammar, read a second way: split on '.', then check each part. */
static bool reference(const char *s, long v[4]) {
    v[0] = v[1] = v[2] = v[3] = 0;
    if (s[0] == 'v') s++;
    char buf[128];
    if (strlen(s) >= sizeof buf) return false;
    strcpy(buf, s);
    char *parts[6];
    int n = 0;
    for (char *p = buf;; n++) {
        if (n == 6) return false;
        parts[n] = p;
        char *dot = strchr(p, '.');
        if (dot == NULL) {
            n++;
            break;
        }
        *dot = '\0';
        p = dot + 1;
    }
    if (n != 3 && n != 4) return false;
    for (int i = 0; i < n; i++) {
        const char *d = parts[i];
        if (i == 3) {
            if (strncmp(d, "post", 4) != 0) return false;
            d += 4;
        }
        size_t len = strlen(d);
        if (len == 0 || len > 6 || (len > 1 && d[0] == '0')) return false;
        long x = 0;
        for (size_t k = 0; k < len; k++) {
            if (d[k] < '0' || d[k] > '9') return false;
            x = x * 10 + (d[k] - '0');
        }
        v[i] = x;
    }
    return true;
}

static int cmp(const long a[4], const long b[4]) {
    for (int i = 0; i < 4; i++)
        if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char s[96];
    if (size >= sizeof s) size = sizeof s - 1;
    memcpy(s, data, size);
    s[size] = '\0';
    epx_sglang_rule trule;
    epx_eplb_rule erule;
    int32_t tnew = -1, enew = -1;
    epx_error et = {0}, ee = {0};
    epx_status st = epx_sglang_table_rule(s, &trule, &tnew, &et);
    epx_status se = epx_sglang_eplb_rule(s, &erule, &enew, &ee);
    CHECK(st == se && strcmp(et.msg, ee.msg) == 0);
    long v[4], oldest[4], newest[4];
    const bool ok = reference(s, v);
    CHECK(reference(EPX_SGLANG_OLDEST_VERSION, oldest) &&
          reference(EPX_SGLANG_DEFAULT_VERSION, newest));
    const bool want = ok && cmp(v, oldest) >= 0;
    if (st != EPX_OK) {
        CHECK(!want && et.msg[0] != '\0');
        return 0;
    }
    CHECK(want);
    CHECK(tnew == enew && tnew == (cmp(v, newest) > 0));
    return 0;
}
