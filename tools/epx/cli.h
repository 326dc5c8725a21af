/*
 * cli.h - what every epx subcommand shares: a small declarative option
 * parser (every option is declared with its help, so --help is generated and
 * unknown or repeated options are errors), number parsing that rejects
 * junk, and the exit-code convention:
 *   0 success, 1 runtime failure, 2 bad input or usage.
 */
#ifndef EPX_CLI_H
#define EPX_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "epx.h"

#define CLI_EXIT_OK 0
#define CLI_EXIT_FAIL 1
#define CLI_EXIT_USAGE 2

typedef struct cli_opt {
    const char *name;    /* "--gpus" */
    const char *metavar; /* "G", or NULL for a flag */
    const char *help;
    const char *value; /* filled by cli_parse: the argument, "1" for a set flag, else NULL */
} cli_opt;

typedef struct cli_cmd {
    const char *name;    /* "plan" */
    const char *usage;   /* "epx plan --counts FILE --gpus G [...]" */
    const char *summary; /* one line */
    cli_opt *opts;       /* terminated by {NULL} */
    int max_positional;  /* positional arguments allowed */
    const char *positional[8];
    int num_positional;
} cli_cmd;

/* Parse argv (argv[0] is the subcommand name). Returns -1 to continue, or an
 * exit code (0 after --help, 2 after a usage error, printed to stderr). */
int cli_parse(cli_cmd *cmd, int argc, char **argv);

/* The value of an option, or NULL. */
const char *cli_get(const cli_cmd *cmd, const char *name);
bool cli_flag(const cli_cmd *cmd, const char *name);

/* Option `name` as the index of its value among choices[0 .. n) into *out
 * (kept when absent); false after printing "epx CMD: NAME must be A, B or
 * C, not 'VALUE'". */
bool cli_choice(const cli_cmd *cmd, const char *name, const char *const *choices, int n, int *out);

/* Numbers (cli.c): every numeric option of every subcommand goes through
 * one of these, so all accept the same spellings (decimal digits with an
 * optional sign; for real numbers a fraction and an exponent) and refuse
 * junk, spaces, hex, NaN, infinities, and values out of [lo, hi] or past
 * 64 bits with one message naming the option, the value and the range.
 * *out keeps its default when the option is absent; false after the
 * message. */
bool cli_int(const cli_cmd *cmd, const char *name, int64_t lo, int64_t hi, int32_t *out);
bool cli_u64(const cli_cmd *cmd, const char *name, uint64_t lo, uint64_t hi, uint64_t *out);
bool cli_double(const cli_cmd *cmd, const char *name, double lo, double hi, double *out);
/* "A..B" (or "A", meaning A..A), both in [lo, hi] and A <= B. */
bool cli_range(const cli_cmd *cmd, const char *name, double lo, double hi, double *a, double *b);
/* "a,b,c", each a whole number in [lo, hi], into a malloc'd array (caller
 * frees; NULL and 0 when the option is absent); a bad item is named by its
 * position. `example` is shown for a malformed list ("1,64,4096"). */
bool cli_int_list(const cli_cmd *cmd, const char *name, int64_t lo, int64_t hi, const char *example,
                  int32_t **out, int32_t *n);
/* Refuses (false, said) a list from cli_int_list that gives a value twice,
 * naming the item that repeats: a batch size or token count given twice
 * would print its row twice. */
bool cli_list_distinct(const cli_cmd *cmd, const char *name, const int32_t *v, int32_t n);

/* A required option: prints "epx NAME: --opt is required" and returns NULL
 * when absent. */
const char *cli_require(const cli_cmd *cmd, const char *name);

/* --model NAME|PATH: a built-in name or a HuggingFace config.json (or a
 * folder holding one), resolved into *info (epx_model_resolve; use
 * &info->model, which lives as long as info). Returns -1 when resolved,
 * else the exit code after printing why (2 for a bad name or config). */
int cli_model(const cli_cmd *cmd, const char *arg, epx_model_info *info);

/* Print "epx CMD: MESSAGE" for a failed library call, return the exit code:
 * CLI_EXIT_USAGE for input errors, CLI_EXIT_FAIL otherwise. */
int cli_report(const cli_cmd *cmd, const epx_error *err);

/* An epx_progress_fn for long work: on a terminal it redraws one status
 * line on stderr ("epx plan: layers planned 30/61") once the work has run
 * for a moment, and ends it when done; when stderr is not a terminal it
 * prints nothing. `user` is the cli_cmd running. */
void cli_progress(void *user, const char *what, int64_t done, int64_t total);

/* Size limits, checked before any work (README "Limits"). Slots per layer:
 * P <= CLI_MAX_SLOTS_PER_EXPERT * (E + G): about three redundant replicas
 * per expert on average, or up to four slots per GPU for models with few
 * experts, and always room to round P up to a multiple of G.
 * Memory: the shape's layout maps (L x E x (P - E + 1) replica lists, the
 * largest) times `copies` (layouts and workspaces the command holds at
 * once) must fit in half of this machine's memory. Both print the value,
 * the limit and the fix, and return false. `what` names the option that
 * set P ("--redundant 12800"). */
#define CLI_MAX_SLOTS_PER_EXPERT 4
/* --expert-bytes: up to 10^15 bytes (a PB) per expert and layer. */
#define CLI_MAX_EXPERT_BYTES 1000000000000000ull
bool cli_check_slots(const cli_cmd *cmd, const char *what, int32_t E, int32_t P, int32_t G);
/* `fix` says what to lower for this command ("use fewer --layers or
 * --experts"). */
bool cli_check_memory(const cli_cmd *cmd, const epx_shape *s, int copies, const char *fix);
/* SGLang's static dispatch table from a mapping (what epx_dispatch_table_
 * from_layout computes, a cut table from 0.5.4.post2): G per-rank passes,
 * each drawing for up to G ranks per (layer, expert), so its work grows
 * with G^2 L E (256 GPUs of DeepSeek-V3: ~8 s on one core; 4,096 GPUs of
 * Kimi-K2: hours). tables: how many the command computes; passes: G for a
 * whole cut table, 1 for one rank's row or a table without the cut. false
 * (after saying so, naming the estimate and `fix`) above ~6 minutes of one
 * core. */
bool cli_check_table_work(const cli_cmd *cmd, const epx_shape *s, int tables, int32_t passes,
                          const char *fix);
/* The same budget for any estimate: `what` says what needs `bytes`, `fix`
 * what to lower ("fewer --windows"). */
bool cli_check_bytes(const cli_cmd *cmd, double bytes, const char *what, const char *fix);
/* A JSON output must be one epx can read back: at most EPX_MAX_INPUT_BYTES,
 * the limit of its JSON readers. Estimated before any work from `numbers`
 * values of `width` bytes each (digits and the ", " after them; see
 * cli_json_width); above the limit, prints the bytes, the limit and `fix`
 * ("use fewer --windows, or write a .pt file") and returns false. A .pt path (binary, read
 * without that limit) passes: memory bounds it. */
bool cli_check_json_size(const cli_cmd *cmd, const char *path, double numbers, double width,
                         const char *fix);
/* Bytes a whole number near x takes in a JSON list: its digits and ", ". */
double cli_json_width(double x);

/* Outputs (out.c). An output: a path to replace (written with
 * epx_file_write) or, with append, a file opened for appending. */
typedef struct cli_out {
    const char *path; /* NULL: skipped; "-": standard output, append outputs only */
    bool append;
} cli_out;

/* Check every output before anything is written: each must resolve to a
 * regular file or a new name in a writable folder, and be none of the
 * inputs (same device and inode, whatever the spelling; an input that is a
 * folder or a comma list, as --counts takes per-pass dumps, is checked file
 * by file) nor another output.
 * Registers the temp names for the signal handler. Returns -1 when all can
 * be written, else CLI_EXIT_USAGE after printing why. NULL inputs are
 * skipped, and so are inputs that do not exist (the reader reports them). */
int cli_outputs_check(const cli_cmd *cmd, const char *const *in, int nin, const cli_out *out,
                      int nout);

/* True when an output path ends in ".pt": the writer follows the extension
 * (a PyTorch zip), anything else is JSON. */
bool cli_is_pt(const char *path);

/* An output written as JSON whatever its name (a report, a table, a
 * summary): false after saying so when `path` ends in ".pt". */
bool cli_json_only(const cli_cmd *cmd, const char *opt, const char *path, const char *what);

/* JSON output (json_out.c), the one writer of strings and numbers into every
 * JSON the CLI writes: a string quoted and escaped ('"', '\\', control bytes;
 * a byte that is not valid UTF-8 as U+FFFD), so any name gives valid JSON;
 * a number with printf format fmt, or null when it is not finite. */
void cli_json_str(FILE *f, const char *s);
void cli_json_strn(FILE *f, const char *s, size_t n);
void cli_json_num(FILE *f, const char *fmt, double x);

/* Remember a temp file (or folder) that SIGINT/TERM/HUP must remove. */
void cli_temp_register(const char *path, bool is_dir);

/* Report a failed write after cli_outputs_check passed: an I/O error is a
 * runtime failure (exit 1, with the system's reason), others as cli_report. */
int cli_write_failed(const cli_cmd *cmd, const epx_error *err);

/* Per-batch balancedness (batches.c), shared by demo and eval: batches of
 * T tokens drawn from a load, routed by a per-token rule, scored by mean /
 * max GPU load in (token, expert) pairs and averaged. */
typedef enum cli_routing {
    CLI_ROUTE_STATIC,         /* SGLang's dispatch table, token t from rank t mod G */
    CLI_ROUTE_DYNAMIC,        /* uniform over the replicas (Philox)                 */
    CLI_ROUTE_WEIGHTED,       /* by replica weights (Philox, thresholds)            */
    CLI_ROUTE_BALANCED,       /* the exact per-batch min-max split                  */
    CLI_ROUTE_RANK_INVARIANT, /* SGLang 0.5.23's row rule                          */
    CLI_NUM_ROUTES
} cli_routing;
/* The option spellings, by cli_routing: "static" .. "rank-invariant". */
extern const char *const cli_routing_names[CLI_NUM_ROUTES];
/* Option `name` as a routing into *out (kept when absent); false after
 * printing a message that names the value and the choices. */
bool cli_routing_get(const cli_cmd *cmd, const char *name, cli_routing *out);

typedef struct cli_batch_case {
    const epx_layout *layout; /* every case of one call has the same shape */
    cli_routing routing;
    const double *weights; /* CLI_ROUTE_WEIGHTED: [L][P] replica weights */
    double *balancedness;  /* out: [num_sizes], the mean over the batches */
} cli_batch_case;

typedef struct cli_batch_opts {
    int32_t top_k;         /* experts per token (fewer where fewer carry load) */
    const int32_t *tokens; /* [num_sizes] tokens per batch */
    int32_t num_sizes;
    int32_t batches; /* batches per layer and size */
    uint64_t seed;   /* the draws, and dynamic/weighted routing's key */
    /* optional: told after each layer of each size ("layers routed"), as
     * cli_progress shows it; 64 batches of 65,536 tokens on 61 layers run
     * for minutes */
    epx_progress_fn progress;
    void *progress_user;
} cli_batch_opts;

/* Fill every case's balancedness from load [S][L][E] (num_windows S): each
 * batch is drawn from one window (chosen at random when S > 1), the same
 * batches for every case. */
epx_status cli_per_batch(const double *load, int32_t num_windows, const cli_batch_opts *o,
                         cli_batch_case *cases, int num_cases, epx_error *err);

/* --weights FILE (weights_in.c): "replica_weights" [L][P], finite and >= 0,
 * for placement map [L][P] (the report's own map, when it has one, must be
 * it; every expert needs a replica of positive weight), into a malloc'd
 * *out (caller frees). Returns -1 when read, else the exit
 * code after a message naming the file and the bad entry. */
int cli_read_weights(const cli_cmd *cmd, const char *path, const int32_t *map, int32_t L, int32_t P,
                     double **out);

/* The library's UTF-8 check (src/core/util.c: epx_cli links the static
 * library, so its internal functions are there): the length of the valid
 * sequence at p (n bytes left), or 0. */
size_t epxi_utf8_len(const unsigned char *p, size_t n);

/* Every subcommand. */
int cmd_demo(int argc, char **argv);
int cmd_layout(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_stats(int argc, char **argv);
int cmd_dispatch_table(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_advise(int argc, char **argv);
int cmd_migrate(int argc, char **argv);

/* cmd_migrate.c, for `epx plan --current/--failed-gpus`: a [G] mask from
 * --failed-gpus "1,5" or its complement --active-ranks "0,2,3" where the
 * command has that option (neither: *mask = NULL; both, a GPU named twice
 * or none left: false after a message); whether the survivors of a mask
 * have the E experts' slots (false after a message naming the list and the
 * fix); the layout in service checked against the plan's shape (-1 = ok,
 * else an exit code); the moves it takes to the planned layout (-1 = ok,
 * else an exit code). */
bool cli_failed_gpus(const cli_cmd *cmd, int32_t G, uint8_t **mask);
bool cli_check_survivors(const cli_cmd *cmd, const uint8_t *failed, int32_t G, int32_t E,
                         int32_t P);
int cli_read_current(const char *cmd, const char *spec, const epx_shape *shape, epx_layout **out);
int cli_print_moves(const char *cmd, const epx_counts *counts, const epx_layout *current,
                    const epx_layout *planned, const uint8_t *failed, size_t expert_bytes);

/* --window-passes N and --stat-rows sum|windows (epx plan, epx stats, epx
 * convert) into read options, with progress on `cmd`; false after a message
 * on stderr. The reader refuses each on an input it does not apply to. */
#define CLI_READ_OPTS_HELP                                                                         \
    {"--window-passes", "N",                                                                       \
     "per_pass dumps: N forward passes per window (default 1); N must divide the passes", NULL},   \
    {                                                                                              \
        "--stat-rows", "HOW",                                                                      \
            "stat dumps: sum (default: the ring buffer's rows as one window) or windows (each "    \
            "row a window)",                                                                       \
            NULL                                                                                   \
    }
bool cli_read_opts(cli_cmd *cmd, epx_read_opts *o);

/* A placement map [L][P] read beside counts of E experts: false after a
 * message naming `what` (the option and file) and its first id >= E (the
 * library's message cannot name the fix: the counts say E, no option). */
bool cli_map_of_counts(const cli_cmd *cmd, const char *what, const int32_t *map, int32_t L,
                       int32_t P, int32_t E);

#endif
