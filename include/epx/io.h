/*
 * epx/io.h - SGLang's files: placement mappings, counts, and the one entry
 * point that turns an `--init-expert-location` argument into a layout.
 * JSON goes through jansson; .pt files through epx/pt.h's restricted reader.
 * Include epx.h, not this file.
 */
#ifndef EPX_IO_H
#define EPX_IO_H

/* Free memory that an epx function returned to the caller (maps, strings).
 * Accepts NULL. */
EPX_API void epx_free(void *p);

/*
 * Read {"physical_to_logical_map": [L][P]} from a .json file, a .pt file, or
 * an inline JSON string (a spec starting with '{', as SGLang accepts). Other
 * keys are ignored, as SGLang ignores them.
 * Args:    spec (in) path or inline JSON;
 *          map (out) [L][P] int32, release with epx_free; L, P (out).
 * Returns: EPX_OK; EPX_ERR_IO; EPX_ERR_PARSE for malformed JSON (line and
 *          column), a missing key, ragged rows (names the row and both
 *          lengths), non-integers, negative ids or ids of EPX_MAX_EXPERTS and
 *          above (names layer, slot, value), so max id + 1 is a valid expert
 *          count; EPX_ERR_NOMEM.
 */
EPX_API epx_status epx_mapping_read(const char *spec, int32_t **map, int32_t *num_layers,
                                    int32_t *num_physical, epx_error *err);

/* The same from JSON text of `len` bytes (need not be NUL-terminated). */
EPX_API epx_status epx_mapping_parse_json(const char *text, size_t len, int32_t **map,
                                          int32_t *num_layers, int32_t *num_physical,
                                          epx_error *err);

/*
 * Write {"physical_to_logical_map": [L][P]} and nothing else (SGLang rejects
 * other keys) to `path`, replacing it atomically (temp file + rename).
 * Returns: EPX_OK, EPX_ERR_IO, EPX_ERR_NOMEM.
 */
EPX_API epx_status epx_layout_write_json(const epx_layout *layout, const char *path,
                                         epx_error *err);

/*
 * Read SGLang counts {"logical_count": [L][E] | [S][L][E]} from .json, .pt
 * or inline JSON; other keys ignored. Entries: finite non-negative numbers.
 * A spec ending in .pt (also a comma-separated list of them) goes to
 * epx_counts_read_pt (epx/pt.h), which also reads SGLang's stat and per_pass
 * dumps; a directory of dumps is read by epx_counts_read_pt itself.
 * Returns: EPX_OK, EPX_ERR_IO, EPX_ERR_PARSE (names the index and value;
 *          also loads whose total is above 2^63, what SGLang's int64 counts
 *          hold, and an integer past 2^53 that a double does not hold
 *          exactly), EPX_ERR_NOMEM; for .pt also those of epx_counts_read_pt.
 */
EPX_API epx_status epx_counts_read(const char *spec, epx_counts **out, epx_error *err);

/* epx_counts_read with progress: for several dump files (a folder or a
 * comma list), `progress` is called after each file is read. */
EPX_API epx_status epx_counts_read_progress(const char *spec, epx_progress_fn progress,
                                            void *progress_user, epx_counts **out, epx_error *err);

/* How epx_counts_read_with reads a stat dump's rows. */
typedef enum epx_stat_rows {
    EPX_STAT_ROWS_SUM = 0,            /* one window, the sum of the rows (the default) */
    EPX_STAT_ROWS_WINDOWS = 1,        /* each row a window, in row order; an input with
                                  no stat dump is refused (nothing to apply to) */
    EPX_STAT_ROWS_WINDOWS_IF_STAT = 2 /* WINDOWS where the input has a stat dump,
                                         nothing elsewhere (a caller that wants the
                                         per-step series whatever it reads) */
} epx_stat_rows;

/* What epx_counts_read_with needs besides the spec. */
typedef struct epx_read_opts {
    uint32_t version;         /* EPX_READ_OPTS_VERSION */
    int32_t window_passes;    /* per_pass dumps: forward passes per window, 0 = one */
    epx_stat_rows stat_rows;  /* stat dumps: EPX_STAT_ROWS_SUM by default */
    epx_progress_fn progress; /* optional: called after each dump file is read */
    void *progress_user;
    char *how;      /* optional, caller-owned: receives one sentence saying how */
    size_t how_cap; /* the input was read (its kind, rows, passes, windows) */
} epx_read_opts;
#define EPX_READ_OPTS_VERSION ((uint32_t)sizeof(epx_read_opts))
#define EPX_READ_OPTS_INIT                                                                         \
    { EPX_READ_OPTS_VERSION, 0, EPX_STAT_ROWS_SUM, NULL, NULL, NULL, 0 }

/*
 * Read counts as SGLang writes them, for planning. Like epx_counts_read, but:
 *  - a stat dump (logical_count [B][L][E] beside "rank" and
 *    "average_utilization_rate_over_window", .pt or JSON) is SGLang's ring
 *    buffer of per-pass rows: not in time order once it wraps, zero rows
 *    never written. It becomes one window, the sum of its rows (one window
 *    per dump for several dumps), unless opts->stat_rows says otherwise;
 *  - per_pass dumps are ordered by forward_pass_id (ranks summed per pass)
 *    and grouped opts->window_passes passes per window, which must divide
 *    the passes recorded (equal windows);
 *  - the same stat dump twice (its every row equal), and stat dumps beside
 *    other logical_count files or per_pass dumps, are refused;
 *  - other logical_count files are time-ordered windows, as before.
 * opts->how (if given) receives a sentence saying which of these applied.
 * Returns: those of epx_counts_read; EPX_ERR_INVALID_ARG for bad options
 *          (negative window_passes, unknown stat_rows, a version that is not
 *          EPX_READ_OPTS_VERSION), for window_passes > 0 on an input
 *          holding no per_pass dump (it has no passes to group) or one that
 *          does not divide its passes, and for EPX_STAT_ROWS_WINDOWS on an
 *          input holding no stat dump; also
 *          EPX_ERR_PARSE when the loads sum above 2^63.
 */
EPX_API epx_status epx_counts_read_with(const char *spec, const epx_read_opts *opts,
                                        epx_counts **out, epx_error *err);

/* Write counts as {"logical_count": [S][L][E]} ([L][E] when S == 1): only
 * loads the readers take back (finite, >= 0, at most 2^63 in all), else
 * EPX_ERR_INVALID_ARG naming the entry or the total. */
EPX_API epx_status epx_counts_write_json(const epx_counts *counts, const char *path,
                                         epx_error *err);

/* What epx_layout_init needs besides the spec. */
typedef struct epx_init_opts {
    uint32_t version;            /* EPX_INIT_OPTS_VERSION */
    int32_t num_gpus;            /* G, required */
    int32_t num_nodes;           /* N, default 1 */
    int32_t num_logical_experts; /* E; 0 = infer from a mapping (max id + 1) */
    int32_t num_layers;          /* L; required for "trivial" */
    int32_t num_physical;        /* P; 0 = E + num_redundant */
    int32_t num_redundant;       /* redundant slots for "trivial" and counts */
    int32_t num_groups;          /* expert groups for hierarchical planning; 0 = 1 */
    epx_log_fn log;              /* optional */
    void *log_user;
    epx_algorithm algorithm;    /* how logical_count is planned: EPX_ALGO_EPX (default),
                                   or SGLang's choice, EPX_ALGO_AUTO (its
                                   --eplb-algorithm default), EPX_ALGO_DEEPSEEK... */
    const char *sglang_version; /* DeepSeek modes: the SGLang release whose EPLB to
                                   follow (epx_plan_opts.sglang_version); NULL =
                                   DeepSeek's original */
} epx_init_opts;
#define EPX_INIT_OPTS_VERSION ((uint32_t)sizeof(epx_init_opts))
#define EPX_INIT_OPTS_INIT                                                                         \
    { EPX_INIT_OPTS_VERSION, 0, 1, 0, 0, 0, 0, 0, NULL, NULL, EPX_ALGO_EPX, NULL }

/*
 * Turn what SGLang's --init-expert-location takes into a layout: "trivial",
 * a .json or .pt path, or an inline JSON string, holding either a
 * physical_to_logical_map (built directly and validated) or logical_count
 * (planned with opts->algorithm: epx's by default; EPX_ALGO_AUTO is what
 * SGLang's init_by_eplb runs). Never returns EPX_OK without a
 * layout: every missing piece is an explained error.
 * Returns: EPX_OK; the statuses of the readers, of epx_layout_create_from_map
 *          and of the planner; EPX_ERR_INVALID_ARG for bad options (a
 *          negative count, an unknown algorithm, a malformed sglang_version,
 *          num_physical and num_redundant that disagree), checked whatever
 *          the spec holds; EPX_ERR_SHAPE for E + num_redundant past
 *          EPX_MAX_EXPERTS or a num_redundant the mapping's P contradicts.
 */
EPX_API epx_status epx_layout_init(const char *spec, const epx_init_opts *opts, epx_layout **out,
                                   epx_error *err);

#endif /* EPX_IO_H */
