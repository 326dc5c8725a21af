/*
 * bench_runs.h - the runs of a file of `epx bench comm --json` lines
 * (bench_runs.c says what a run is), for `epx advise --measured`.
 */
#ifndef EPX_CLI_BENCH_RUNS_H
#define EPX_CLI_BENCH_RUNS_H

#include <jansson.h>
#include <stddef.h>

/* Lines further apart than this start a new run (scripts/readme_figures.py's
 * RUN_GAP_S, the same rule). */
#define CLI_RUN_GAP_S 300.0

/* A line without a date the benchmark writes: older than every dated one. */
#define CLI_UNDATED (-1e300)

/* The JSON lines of a file's text as an array (objects with a "phase", as
 * the benchmark writes them; blank lines skipped), or NULL when it is not
 * such a file or holds none; *bad_line (if given) is then the first line
 * that is not one (1-based; 0 when the text holds no line at all). */
json_t *cli_bench_lines(const char *text, size_t len, size_t *bad_line);

/* Line r's date in seconds since 1970, or CLI_UNDATED. */
double cli_bench_date(json_t *r);

/* run_of[i]: line i's run, numbered 0, 1, ... in file order (-1: undated);
 * when[i]: cli_bench_date of line i. Both [json_array_size(lines)]. */
void cli_bench_runs(json_t *lines, int *run_of, double *when);

#endif
