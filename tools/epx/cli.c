/*
 * cli.c - option parsing and error reporting shared by the subcommands.
 *
 * Options are declared, not scanned for: a typo (--gpu for --gpus) is an
 * error that lists the valid options instead of a silently ignored flag.
 */
#include "cli.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static void print_help(const cli_cmd *cmd, FILE *f) {
    fprintf(f, "usage: %s\n\n%s\n", cmd->usage, cmd->summary);
    if (cmd->opts[0].name != NULL) fputs("\noptions:\n", f);
    for (const cli_opt *o = cmd->opts; o->name != NULL; o++) {
        char left[64];
        snprintf(left, sizeof left, "%s%s%s", o->name, o->metavar ? " " : "",
                 o->metavar ? o->metavar : "");
        fprintf(f, "  %-24s %s\n", left, o->help);
    }
    fprintf(f, "  %-24s %s\n", "-h, --help", "show this help");
}

int cli_parse(cli_cmd *cmd, int argc, char **argv) {
    cmd->num_positional = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            print_help(cmd, stdout);
            return CLI_EXIT_OK;
        }
        if (a[0] == '-' && a[1] != '\0' && !(a[1] >= '0' && a[1] <= '9')) {
            const char *eq = strchr(a, '=');
            size_t len = eq ? (size_t)(eq - a) : strlen(a);
            cli_opt *o = cmd->opts;
            for (; o->name != NULL; o++)
                if (strlen(o->name) == len && strncmp(o->name, a, len) == 0) break;
            if (o->name == NULL) {
                fprintf(stderr, "epx %s: unknown option '%.*s'; run 'epx %s --help'\n", cmd->name,
                        (int)len, a, cmd->name);
                return CLI_EXIT_USAGE;
            }
            if (o->value != NULL) {
                fprintf(stderr, "epx %s: %s given twice\n", cmd->name, o->name);
                return CLI_EXIT_USAGE;
            }
            if (o->metavar == NULL) {
                if (eq) {
                    fprintf(stderr, "epx %s: %s takes no value\n", cmd->name, o->name);
                    return CLI_EXIT_USAGE;
                }
                o->value = "1";
            } else if (eq) {
                o->value = eq + 1;
            } else if (i + 1 < argc) {
                o->value = argv[++i];
            } else {
                fprintf(stderr, "epx %s: %s needs a value (%s)\n", cmd->name, o->name, o->metavar);
                return CLI_EXIT_USAGE;
            }
            continue;
        }
        if (cmd->num_positional >= cmd->max_positional) {
            fprintf(stderr, "epx %s: unexpected argument '%s'; run 'epx %s --help'\n", cmd->name, a,
                    cmd->name);
            return CLI_EXIT_USAGE;
        }
        cmd->positional[cmd->num_positional++] = a;
    }
    return -1;
}

const char *cli_get(const cli_cmd *cmd, const char *name) {
    for (const cli_opt *o = cmd->opts; o->name != NULL; o++)
        if (strcmp(o->name, name) == 0) return o->value;
    return NULL;
}

bool cli_flag(const cli_cmd *cmd, const char *name) { return cli_get(cmd, name) != NULL; }

bool cli_choice(const cli_cmd *cmd, const char *name, const char *const *choices, int n, int *out) {
    const char *v = cli_get(cmd, name);
    if (v == NULL) return true;
    for (int i = 0; i < n; i++)
        if (strcmp(v, choices[i]) == 0) {
            *out = i;
            return true;
        }
    fprintf(stderr, "epx %s: %s must be ", cmd->name, name);
    for (int i = 0; i < n; i++)
        fprintf(stderr, "%s%s", choices[i], i + 2 < n ? ", " : i + 2 == n ? " or " : "");
    fprintf(stderr, ", not '%s'\n", v);
    return false;
}

/*
 * Numbers. Every numeric option of every subcommand is read by one of the
 * functions below, all built on two recognisers (a whole number; a decimal
 * number), so every option accepts the same spellings and refuses a value
 * with the same three things: the option, the value, and the range to use.
 * Accepted: an optional sign and decimal digits ("+8", "0012"), and for
 * real numbers a fraction and an exponent ("0.5", "1e-3"). Refused: an
 * empty value, spaces, hex ("0x10", also hex floats), trailing junk ("8x",
 * "1.5" for a whole number), NaN and infinities; a value past the range,
 * including one past 64 bits, is "above the limit", never wrapped.
 */

/* [+-]digits, nothing else. */
static bool whole_text(const char *v) {
    const char *p = v + (*v == '+' || *v == '-');
    if (*p == '\0') return false;
    for (; *p; p++)
        if (*p < '0' || *p > '9') return false;
    return true;
}

/* [+-](digits[.digits]|.digits)[(e|E)[+-]digits], nothing else. */
static bool real_text(const char *v) {
    const char *p = v + (*v == '+' || *v == '-');
    size_t digits = 0;
    for (; *p >= '0' && *p <= '9'; p++) digits++;
    if (*p == '.')
        for (p++; *p >= '0' && *p <= '9'; p++) digits++;
    if (digits == 0) return false;
    if (*p == 'e' || *p == 'E') {
        p++;
        p += *p == '+' || *p == '-';
        if (*p < '0' || *p > '9') return false;
        while (*p >= '0' && *p <= '9') p++;
    }
    return *p == '\0';
}

/* "nan", "-inf", "Infinity": what strtod reads as non-finite. */
static bool nonfinite_text(const char *v) {
    const char *p = v + (*v == '+' || *v == '-');
    return strncasecmp(p, "nan", 3) == 0 || strncasecmp(p, "inf", 3) == 0;
}

/* The messages, shared by every kind; lo and hi come formatted. */
static void say_junk(const cli_cmd *cmd, const char *name, const char *v, const char *kind,
                     const char *lo, const char *hi) {
    fprintf(stderr, "epx %s: %s '%s' is not a %s: give one from %s to %s\n", cmd->name, name, v,
            kind, lo, hi);
}

static void say_range(const cli_cmd *cmd, const char *name, const char *v, bool low, const char *lo,
                      const char *hi) {
    fprintf(stderr, "epx %s: %s %s is %s the %s %s: use %s %s\n", cmd->name, name, v,
            low ? "below" : "above", low ? "minimum" : "limit", low ? lo : hi,
            low ? "at least" : "at most", low ? lo : hi);
}

/* A whole number in [lo, hi] (lo >= 0 when hi > INT64_MAX). 0 ok, 1 junk,
 * 2 below, 3 above. */
static int read_whole(const char *v, uint64_t lo_u, uint64_t hi_u, bool is_signed, int64_t lo_s,
                      int64_t hi_s, uint64_t *out_u, int64_t *out_s) {
    if (!whole_text(v)) return 1;
    errno = 0;
    if (v[0] == '-') {
        long long x = strtoll(v, NULL, 10);
        if (errno == ERANGE) return 2;
        if (!is_signed) {
            if (x == 0 && lo_u == 0) return *out_u = 0, 0;
            return 2;
        }
        if (x < lo_s) return 2;
        if (x > hi_s) return 3;
        return *out_s = x, 0;
    }
    unsigned long long x = strtoull(v, NULL, 10);
    if (errno == ERANGE) return 3;
    if (is_signed) {
        if (x > (unsigned long long)INT64_MAX || (int64_t)x > hi_s) return 3;
        if ((int64_t)x < lo_s) return 2;
        return *out_s = (int64_t)x, 0;
    }
    if (x < lo_u) return 2;
    if (x > hi_u) return 3;
    return *out_u = x, 0;
}

static bool parse_int(const cli_cmd *cmd, const char *name, const char *v, int64_t lo, int64_t hi,
                      int64_t *out) {
    char los[24], his[24];
    snprintf(los, sizeof los, "%lld", (long long)lo);
    snprintf(his, sizeof his, "%lld", (long long)hi);
    uint64_t unused = 0;
    int r = read_whole(v, 0, 0, true, lo, hi, &unused, out);
    if (r == 1) say_junk(cmd, name, v, "whole number", los, his);
    if (r >= 2) say_range(cmd, name, v, r == 2, los, his);
    return r == 0;
}

bool cli_int(const cli_cmd *cmd, const char *name, int64_t lo, int64_t hi, int32_t *out) {
    /* The result is an int32_t: a wider range would wrap. */
    assert(lo >= INT32_MIN && hi <= INT32_MAX && lo <= hi);
    const char *v = cli_get(cmd, name);
    int64_t x = 0;
    if (v == NULL) return true;
    if (!parse_int(cmd, name, v, lo, hi, &x)) return false;
    *out = (int32_t)x;
    return true;
}

bool cli_u64(const cli_cmd *cmd, const char *name, uint64_t lo, uint64_t hi, uint64_t *out) {
    const char *v = cli_get(cmd, name);
    if (v == NULL) return true;
    char los[24], his[24];
    snprintf(los, sizeof los, "%llu", (unsigned long long)lo);
    snprintf(his, sizeof his, "%llu", (unsigned long long)hi);
    int64_t unused = 0;
    int r = read_whole(v, lo, hi, false, 0, 0, out, &unused);
    if (r == 1) say_junk(cmd, name, v, "whole number", los, his);
    if (r >= 2) say_range(cmd, name, v, r == 2, los, his);
    return r == 0;
}

/* A decimal number in [lo, hi]; `name` and `v` as the message shows them. */
static bool read_real(const cli_cmd *cmd, const char *name, const char *v, double lo, double hi,
                      double *out) {
    char los[32], his[32];
    snprintf(los, sizeof los, "%g", lo);
    snprintf(his, sizeof his, "%g", hi);
    if (nonfinite_text(v)) {
        say_junk(cmd, name, v, "finite number", los, his);
        return false;
    }
    if (!real_text(v)) {
        say_junk(cmd, name, v, "number", los, his);
        return false;
    }
    errno = 0;
    double x = strtod(v, NULL);
    /* Past DBL_MAX is past any limit; below DBL_MIN rounds towards 0. */
    if (isinf(x)) {
        say_junk(cmd, name, v, "finite number", los, his);
        return false;
    }
    if (!(x >= lo && x <= hi)) {
        say_range(cmd, name, v, x < lo, los, his);
        return false;
    }
    *out = x;
    return true;
}

bool cli_double(const cli_cmd *cmd, const char *name, double lo, double hi, double *out) {
    const char *v = cli_get(cmd, name);
    return v == NULL || read_real(cmd, name, v, lo, hi, out);
}

bool cli_range(const cli_cmd *cmd, const char *name, double lo, double hi, double *a, double *b) {
    const char *v = cli_get(cmd, name);
    if (v == NULL) return true;
    /* The split comes first: strtod would read "2." out of "2..1". */
    const char *dots = strstr(v, "..");
    char first[64], label[80];
    if (dots == NULL) {
        snprintf(label, sizeof label, "%s (A..B or A)", name);
        if (!read_real(cmd, label, v, lo, hi, a)) return false;
        *b = *a;
        return true;
    }
    /* "1...2" would read as 1 and .2 and be called backwards: a third dot
     * (or a second "..") makes it no A..B at all. */
    if (dots[2] == '.' || strstr(dots + 2, "..") != NULL) {
        fprintf(stderr,
                "epx %s: %s '%.40s' is malformed: write A..B, two numbers with exactly two dots "
                "between them (e.g. 1..2), from %g to %g\n",
                cmd->name, name, v, lo, hi);
        return false;
    }
    if ((size_t)(dots - v) >= sizeof first) {
        fprintf(stderr, "epx %s: %s '%.40s...' is not A..B: give two numbers from %g to %g\n",
                cmd->name, name, v, lo, hi);
        return false;
    }
    memcpy(first, v, (size_t)(dots - v));
    first[dots - v] = '\0';
    snprintf(label, sizeof label, "%s (A of A..B)", name);
    if (!read_real(cmd, label, first, lo, hi, a)) return false;
    snprintf(label, sizeof label, "%s (B of A..B)", name);
    if (!read_real(cmd, label, dots + 2, lo, hi, b)) return false;
    if (*a > *b) {
        fprintf(stderr, "epx %s: %s %s runs backwards: write the smaller first (%s..%.*s)\n",
                cmd->name, name, v, dots + 2, (int)(dots - v), v);
        return false;
    }
    return true;
}

bool cli_check_slots(const cli_cmd *cmd, const char *what, int32_t E, int32_t P, int32_t G) {
    const int64_t limit = (int64_t)CLI_MAX_SLOTS_PER_EXPERT * ((int64_t)E + G);
    if (P <= limit) return true;
    fprintf(stderr,
            "epx %s: %s gives %d slots per layer, above the limit %lld (%d x (%d experts + %d "
            "GPUs)): use at most %lld redundant slots\n",
            cmd->name, what, P, (long long)limit, CLI_MAX_SLOTS_PER_EXPERT, E, G,
            (long long)(limit - E));
    return false;
}

bool cli_check_bytes(const cli_cmd *cmd, double bytes, const char *what, const char *fix) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const double ram = pages > 0 && page > 0 ? (double)pages * (double)page : 8.0 * (1 << 30);
    if (bytes <= ram / 2) return true;
    fprintf(stderr,
            "epx %s: %s needs about %.1f GB, above the limit of %.1f GB (half of this machine's "
            "memory): %s\n",
            cmd->name, what, bytes / 1e9, ram / 2e9, fix);
    return false;
}

bool cli_check_memory(const cli_cmd *cmd, const epx_shape *s, int copies, const char *fix) {
    const double L = s->num_layers, E = s->num_logical_experts, P = s->num_physical_experts;
    const double bytes = copies * 4.0 * (L * P + L * E * (P - E + 1) + L * E);
    char what[160];
    snprintf(what, sizeof what, "%d layers x %d experts on %d slots and %d GPUs", s->num_layers,
             s->num_logical_experts, s->num_physical_experts, s->num_gpus);
    return cli_check_bytes(cmd, bytes, what, fix);
}

/* Rank-entries (a pass's ranks times its layers and experts) a table may
 * take: ~7-17 ns each on the development VM's core (bench/RESULTS.md). */
#define CLI_MAX_TABLE_WORK 34359738368.0 /* 2^35 */

bool cli_check_table_work(const cli_cmd *cmd, const epx_shape *s, int tables, int32_t passes,
                          const char *fix) {
    const double work =
        (double)tables * passes * s->num_gpus * (double)s->num_layers * s->num_logical_experts;
    if (work <= CLI_MAX_TABLE_WORK) return true;
    fprintf(stderr,
            "epx %s: SGLang's static dispatch table on %d GPUs is %d per-rank pass%s of %d ranks "
            "x %d layers x %d experts%s: %.3g rank-entries, above the limit %.3g (minutes on one "
            "core; the work grows with the GPUs squared): %s\n",
            cmd->name, s->num_gpus, passes, passes == 1 ? "" : "es", s->num_gpus, s->num_layers,
            s->num_logical_experts, tables > 1 ? ", per layout" : "", work, CLI_MAX_TABLE_WORK,
            fix);
    return false;
}

double cli_json_width(double x) {
    double digits = 1;
    for (x = fabs(x); x >= 10 && digits < 20; x /= 10) digits++;
    return digits + 2;
}

bool cli_check_json_size(const cli_cmd *cmd, const char *path, double numbers, double width,
                         const char *fix) {
    const double bytes = numbers * width, limit = (double)EPX_MAX_INPUT_BYTES;
    if (cli_is_pt(path) || bytes <= limit) return true;
    fprintf(stderr,
            "epx %s: %s would be about %.1f GB of JSON (%.0f numbers), above the %.0f GiB that "
            "epx reads back (EPX_MAX_INPUT_BYTES): %s\n",
            cmd->name, path, bytes / 1e9, numbers, limit / (1 << 30), fix);
    return false;
}

const char *cli_require(const cli_cmd *cmd, const char *name) {
    const char *v = cli_get(cmd, name);
    if (v == NULL)
        fprintf(stderr, "epx %s: %s is required; run 'epx %s --help'\n", cmd->name, name,
                cmd->name);
    return v;
}

bool cli_map_of_counts(const cli_cmd *cmd, const char *what, const int32_t *map, int32_t L,
                       int32_t P, int32_t E) {
    for (size_t i = 0; i < (size_t)L * (size_t)P; i++)
        if (map[i] >= E) {
            fprintf(stderr,
                    "epx %s: %s holds logical expert %d (layer %zu, slot %zu), but the counts "
                    "have %d experts per layer: they are for different models; give the "
                    "placement and the counts of one model\n",
                    cmd->name, what, map[i], i / (size_t)P, i % (size_t)P, E);
            return false;
        }
    return true;
}

int cli_report(const cli_cmd *cmd, const epx_error *err) {
    fprintf(stderr, "epx %s: %s\n", cmd->name,
            err->msg[0] ? err->msg : epx_status_str(err->status));
    switch (err->status) {
    case EPX_ERR_NOMEM:
    case EPX_ERR_COMM:
    case EPX_ERR_CUDA:
    case EPX_ERR_TIMEOUT:
    case EPX_ERR_INTERNAL: return CLI_EXIT_FAIL;
    default: return CLI_EXIT_USAGE;
    }
}

int cli_model(const cli_cmd *cmd, const char *arg, epx_model_info *info) {
    epx_error err = {0};
    if (epx_model_resolve(arg, info, &err) != EPX_OK) return cli_report(cmd, &err);
    return -1;
}

bool cli_int_list(const cli_cmd *cmd, const char *name, int64_t lo, int64_t hi, const char *example,
                  int32_t **out, int32_t *n) {
    assert(lo >= INT32_MIN && hi <= INT32_MAX && lo <= hi);
    *out = NULL;
    *n = 0;
    const char *s = cli_get(cmd, name);
    if (s == NULL) return true;
    /* At most one element per two characters, so this bounds the list. */
    const size_t len = strlen(s), cap = len / 2 + 1;
    int32_t *v = malloc(cap * sizeof *v), cnt = 0;
    char item[256];
    if (v == NULL) {
        fprintf(stderr, "epx %s: out of memory\n", cmd->name);
        return false;
    }
    for (const char *p = s;; p++) {
        const char *comma = strchr(p, ',');
        const size_t ilen = comma ? (size_t)(comma - p) : strlen(p);
        if (ilen == 0 || ilen >= sizeof item) {
            fprintf(stderr,
                    "epx %s: %s '%.64s%s' is not a comma-separated list of whole numbers from %lld "
                    "to %lld (e.g. %s)\n",
                    cmd->name, name, s, len > 64 ? "..." : "", (long long)lo, (long long)hi,
                    example);
            free(v);
            return false;
        }
        memcpy(item, p, ilen);
        item[ilen] = '\0';
        int64_t x = 0;
        uint64_t unused = 0;
        const int r = read_whole(item, 0, 0, true, lo, hi, &unused, &x);
        if (r != 0) {
            fprintf(stderr, "epx %s: %s '%.64s%s': item %d ", cmd->name, name, s,
                    len > 64 ? "..." : "", cnt + 1);
            if (r == 1)
                fprintf(stderr, "'%s' is not a whole number: give numbers from %lld to %lld\n",
                        item, (long long)lo, (long long)hi);
            else
                fprintf(stderr, "(%s) is %s the %s %lld: use %s %lld\n", item,
                        r == 2 ? "below" : "above", r == 2 ? "minimum" : "limit",
                        (long long)(r == 2 ? lo : hi), r == 2 ? "at least" : "at most",
                        (long long)(r == 2 ? lo : hi));
            free(v);
            return false;
        }
        v[cnt++] = (int32_t)x;
        if (comma == NULL) break;
        p = comma;
    }
    *out = v;
    *n = cnt;
    return true;
}

/* Items by value, then position: equal values next to each other, the
 * earlier first. */
static int by_value_then_item(const void *a, const void *b) {
    const int64_t *x = a, *y = b;
    return x[0] != y[0] ? (x[0] > y[0]) - (x[0] < y[0]) : (x[1] > y[1]) - (x[1] < y[1]);
}

bool cli_list_distinct(const cli_cmd *cmd, const char *name, const int32_t *v, int32_t n) {
    int64_t(*kv)[2] = malloc((n > 0 ? (size_t)n : 1) * sizeof *kv);
    if (kv == NULL) {
        fprintf(stderr, "epx %s: out of memory\n", cmd->name);
        return false;
    }
    for (int32_t i = 0; i < n; i++) kv[i][0] = v[i], kv[i][1] = i;
    qsort(kv, (size_t)n, sizeof *kv, by_value_then_item);
    int64_t first = -1, again = -1; /* the repeat that comes first in the list */
    for (int32_t i = 1; i < n; i++)
        if (kv[i][0] == kv[i - 1][0] && (again < 0 || kv[i][1] < again))
            again = kv[i][1], first = kv[i - 1][1];
    free(kv);
    if (again < 0) return true;
    const char *s = cli_get(cmd, name);
    fprintf(stderr, "epx %s: %s '%.64s%s': item %lld (%d) repeats item %lld: give each once\n",
            cmd->name, name, s, strlen(s) > 64 ? "..." : "", (long long)again + 1, v[again],
            (long long)first + 1);
    return false;
}

void cli_progress(void *user, const char *what, int64_t done, int64_t total) {
    static int tty = -1;
    static struct timespec start;
    static int64_t last = INT64_MAX;
    if (tty < 0) tty = isatty(STDERR_FILENO);
    if (!tty) return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    /* The clock starts at a run's first call: one not above the call before.
     * (Not "done <= 1": work on threads may first tell 2, and the clock then
     * ran from the boot.) */
    if (done <= last) start = now;
    last = done;
    double elapsed =
        (double)(now.tv_sec - start.tv_sec) + 1e-9 * (double)(now.tv_nsec - start.tv_nsec);
    /* Work that ends within a quarter second needs no progress line. */
    if (elapsed < 0.25) return;
    fprintf(stderr, "\repx %s: %s %lld/%lld (%.1f s)", ((const cli_cmd *)user)->name, what,
            (long long)done, (long long)total, elapsed);
    if (done >= total) fputc('\n', stderr);
    fflush(stderr);
}

bool cli_read_opts(cli_cmd *cmd, epx_read_opts *o) {
    o->progress = cli_progress;
    o->progress_user = cmd;
    if (!cli_int(cmd, "--window-passes", 1, 1 << 24, &o->window_passes)) return false;
    const char *v = cli_get(cmd, "--stat-rows");
    if (v == NULL || strcmp(v, "sum") == 0) return true;
    if (strcmp(v, "windows") == 0) {
        o->stat_rows = EPX_STAT_ROWS_WINDOWS;
        return true;
    }
    fprintf(stderr, "epx %s: --stat-rows '%s' is not sum or windows\n", cmd->name, v);
    return false;
}
