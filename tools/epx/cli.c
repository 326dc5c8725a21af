/*
 * cli.c - option parsing and error reporting shared by the subcommands.
 *
 * Options are declared, not scanned for: a typo (--gpu for --gpus) is an
 * error that lists the valid options instead of a silently ignored flag.
 */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* Every numeric option is read here, so every one says the same three
 * things when it refuses a value: the value, the rule, the fix. */
bool cli_int(const cli_cmd *cmd, const char *name, int64_t lo, int64_t hi, int32_t *out) {
    const char *v = cli_get(cmd, name);
    if (v == NULL) return true;
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end != '\0') {
        fprintf(stderr, "epx %s: %s '%s' is not a whole number: give one from %lld to %lld\n",
                cmd->name, name, v, (long long)lo, (long long)hi);
        return false;
    }
    if (errno == ERANGE || x < lo || x > hi) {
        const bool low = errno == ERANGE ? v[0] == '-' : x < lo;
        fprintf(stderr, "epx %s: %s %s is %s the %s %lld: use %s %lld\n", cmd->name, name, v,
                low ? "below" : "above", low ? "minimum" : "limit",
                low ? (long long)lo : (long long)hi, low ? "at least" : "at most",
                low ? (long long)lo : (long long)hi);
        return false;
    }
    *out = (int32_t)x;
    return true;
}

bool cli_double(const cli_cmd *cmd, const char *name, double lo, double hi, double *out) {
    const char *v = cli_get(cmd, name);
    if (v == NULL) return true;
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end != '\0') {
        fprintf(stderr, "epx %s: %s '%s' is not a number: give one from %g to %g\n", cmd->name,
                name, v, lo, hi);
        return false;
    }
    if (isnan(x) || isinf(x) || (errno == ERANGE && fabs(x) > 1.0)) {
        fprintf(stderr, "epx %s: %s '%s' is not a finite number: give one from %g to %g\n",
                cmd->name, name, v, lo, hi);
        return false;
    }
    if (!(x >= lo && x <= hi)) {
        const bool low = x < lo;
        fprintf(stderr, "epx %s: %s %s is %s the %s %g: use %s %g\n", cmd->name, name, v,
                low ? "below" : "above", low ? "minimum" : "limit", low ? lo : hi,
                low ? "at least" : "at most", low ? lo : hi);
        return false;
    }
    *out = x;
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

bool cli_check_memory(const cli_cmd *cmd, const epx_shape *s, int copies) {
    const double L = s->num_layers, E = s->num_logical_experts, P = s->num_physical_experts;
    const double bytes = copies * 4.0 * (L * P + L * E * (P - E + 1) + L * E);
    char what[160];
    snprintf(what, sizeof what, "%d layers x %d experts on %d slots and %d GPUs", s->num_layers,
             s->num_logical_experts, s->num_physical_experts, s->num_gpus);
    return cli_check_bytes(cmd, bytes, what, "use fewer GPUs or redundant slots");
}

const char *cli_require(const cli_cmd *cmd, const char *name) {
    const char *v = cli_get(cmd, name);
    if (v == NULL)
        fprintf(stderr, "epx %s: %s is required; run 'epx %s --help'\n", cmd->name, name,
                cmd->name);
    return v;
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

bool cli_int_list(const char *s, int64_t lo, int64_t hi, int32_t **out, int32_t *n) {
    int32_t cap = 8, cnt = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    if (v == NULL) return false;
    const char *p = s;
    while (*p) {
        char *end = NULL;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (errno != 0 || end == p || x < lo || x > hi || (*end != ',' && *end != '\0')) {
            free(v);
            return false;
        }
        if (cnt == cap) {
            int32_t *nv = realloc(v, (size_t)(cap *= 2) * sizeof *v);
            if (nv == NULL) {
                free(v);
                return false;
            }
            v = nv;
        }
        v[cnt++] = (int32_t)x;
        p = *end == ',' ? end + 1 : end;
    }
    if (cnt == 0) {
        free(v);
        return false;
    }
    *out = v;
    *n = cnt;
    return true;
}

void cli_progress(void *user, const char *what, int64_t done, int64_t total) {
    static int tty = -1;
    static struct timespec start;
    if (tty < 0) tty = isatty(STDERR_FILENO);
    if (!tty) return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (done <= 1) start = now;
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
