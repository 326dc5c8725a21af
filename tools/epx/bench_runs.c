/*
 * bench_runs.c - which `epx bench comm` run each JSON line came from, for
 * `epx advise --measured`. `--json FILE` appends, so a file gathers runs:
 * of older builds, of other settings, of the machine before a driver update.
 * A fit over all of them mixes what is no longer true with what is. A run
 * is a stretch of consecutive lines whose dates ("date": "YYYY-MM-DDTHH:MM:SSZ",
 * which every line the benchmark writes carries) lie within CLI_RUN_GAP_S
 * of the line before: one benchmark call and the calls right after it, the
 * rule scripts/readme_figures.py applies to the README's figures.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "bench_runs.h"

/* Seconds since 1970 of a UTC date "YYYY-MM-DDTHH:MM:SSZ"; false for any
 * other text (days from the civil date, so no time zone is consulted). */
static bool utc_seconds(const char *s, double *out) {
    int y, mo, d, h, mi, se, n = 0;
    if (s == NULL || sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2dZ%n", &y, &mo, &d, &h, &mi, &se, &n) != 6 ||
        s[n] != '\0' || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || se > 60)
        return false;
    const int yy = y - (mo <= 2), era = (yy >= 0 ? yy : yy - 399) / 400;
    const int yoe = yy - era * 400, mp = (mo + 9) % 12;
    const int doy = (153 * mp + 2) / 5 + d - 1, doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    const double days = (double)era * 146097 + doe - 719468;
    *out = days * 86400.0 + h * 3600.0 + mi * 60.0 + se;
    return true;
}

double cli_bench_date(json_t *r) {
    double t;
    return utc_seconds(json_string_value(json_object_get(r, "date")), &t) ? t : CLI_UNDATED;
}

void cli_bench_runs(json_t *lines, int *run_of, double *when) {
    size_t i;
    json_t *r;
    int run = -1;
    double last = 0;
    json_array_foreach(lines, i, r) {
        const double t = cli_bench_date(r);
        if (t == CLI_UNDATED) {
            run_of[i] = -1;
            when[i] = t;
            continue;
        }
        if (run < 0 || fabs(t - last) > CLI_RUN_GAP_S) run++;
        run_of[i] = run;
        when[i] = t;
        last = t;
    }
}

json_t *cli_bench_lines(const char *text, size_t len, size_t *bad_line) {
    json_t *arr = json_array();
    size_t line = 0, bad = 0;
    for (size_t at = 0; bad == 0 && at < len;) {
        const char *nl = memchr(text + at, '\n', len - at);
        size_t n = nl ? (size_t)(nl - (text + at)) : len - at;
        line++;
        if (n > 0 && !(n == 1 && text[at] == '\r')) {
            json_t *o = json_loadb(text + at, n, 0, NULL);
            if (json_is_object(o) && json_object_get(o, "phase") != NULL)
                json_array_append_new(arr, o);
            else {
                json_decref(o);
                bad = line;
            }
        }
        at += n + 1;
    }
    if (bad_line) *bad_line = bad;
    if (bad != 0 || json_array_size(arr) == 0) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}
