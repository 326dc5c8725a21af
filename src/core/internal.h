/*
 * internal.h - helpers shared by every room of libepx and not exported: the
 * error-reporting function and macros, checked size arithmetic, and file
 * reading. Cross-file internal symbols use the prefix epxi_ so the shared
 * library's export list (epx_*) never picks them up.
 */
#ifndef EPX_INTERNAL_H
#define EPX_INTERNAL_H

#include "epx.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>

#if defined(__GNUC__)
#define EPXI_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define EPXI_HIDDEN __attribute__((visibility("hidden")))
#else
#define EPXI_PRINTF(a, b)
#define EPXI_HIDDEN
#endif

/* Record `st` and a formatted message in err (when non-NULL); returns st so a
 * caller can write `return epxi_fail(err, EPX_ERR_SHAPE, "...", ...);`. */
EPXI_HIDDEN epx_status epxi_fail(epx_error *err, epx_status st, const char *fmt, ...)
    EPXI_PRINTF(3, 4);

/* Prefix err's message with a formatted context ("reading FILE: ..."). */
EPXI_HIDDEN void epxi_error_prefix(epx_error *err, const char *fmt, ...) EPXI_PRINTF(2, 3);

/* Propagate a non-OK status. */
#define EPX_TRY(expr)                                                                              \
    do {                                                                                           \
        epx_status epx_try_st_ = (expr);                                                           \
        if (epx_try_st_ != EPX_OK) return epx_try_st_;                                             \
    } while (0)

/* Propagate to a cleanup label, keeping the status in `st`. */
#define EPX_TRY_GOTO(st, expr, label)                                                              \
    do {                                                                                           \
        (st) = (expr);                                                                             \
        if ((st) != EPX_OK) goto label;                                                            \
    } while (0)

/* n * size with overflow detection; false when it would overflow. */
static inline bool epxi_mul_size(size_t n, size_t size, size_t *out) {
    if (size != 0 && n > (size_t)-1 / size) return false;
    *out = n * size;
    return true;
}

/* An on/off environment switch `var`: "1" or "0" sets *on; unset or empty
 * leaves it as the caller set it (the default). Returns false, *on as it
 * was and *bad = the value, for any other value: the caller refuses it by
 * name (from this one read of the environment). */
static inline bool epxi_env_switch(const char *var, int *on, const char **bad) {
    const char *v = getenv(var);
    if (v == NULL || *v == '\0') return true;
    if ((v[0] != '0' && v[0] != '1') || v[1] != '\0') {
        *bad = v;
        return false;
    }
    *on = v[0] == '1';
    return true;
}

/* A whole-number environment setting `var`: digits only (no sign, no
 * space) from lo to hi (hi below 2^59) sets *out; unset or empty leaves
 * *out as the caller set it (the default). Returns false, *out as it was
 * and *bad = the value, for anything else: the caller refuses it by name. */
static inline bool epxi_env_whole(const char *var, int64_t lo, int64_t hi, int64_t *out,
                                  const char **bad) {
    const char *v = getenv(var);
    if (v == NULL || *v == '\0') return true;
    int64_t n = 0;
    for (const char *c = v; *c; c++) {
        if (*c < '0' || *c > '9' || n > hi) {
            *bad = v;
            return false;
        }
        n = n * 10 + (*c - '0');
    }
    if (n < lo || n > hi) {
        *bad = v;
        return false;
    }
    *out = n;
    return true;
}

/* calloc of n elements of `size` bytes, reporting overflow and NOMEM in err.
 * `what` names the buffer in the message. */
EPXI_HIDDEN void *epxi_calloc(size_t n, size_t size, const char *what, epx_error *err);

/* The one safe-output path (epx_file_write in epx.h): resolve symlinks,
 * refuse non-regular targets, write DIR/.BASE.epx-tmp.PID, rename over the
 * target. epx_file_write is this function. */
/* Length of the valid UTF-8 sequence at p (n bytes left), or 0: the one
 * check every text writer uses (the CLI's JSON, the SVG report), each
 * writing U+FFFD for a byte it refuses. */
EPXI_HIDDEN size_t epxi_utf8_len(const unsigned char *p, size_t n);
EPXI_HIDDEN epx_status epxi_write_atomically(const char *path, epx_write_fn body, const void *ctx,
                                             epx_error *err);

/* Case-sensitive suffix test: epxi_has_suffix("a.json", ".json"). */
EPXI_HIDDEN bool epxi_has_suffix(const char *s, const char *suffix);

/* Emit a log line through an optional callback. */
EPXI_HIDDEN void epxi_log(epx_log_fn fn, void *user, epx_log_level lvl, const char *fmt, ...)
    EPXI_PRINTF(4, 5);

/* The options-struct convention (include/epx.h): `version` is the size of
 * the struct the caller compiled against, written by its EPX_..._INIT macro.
 * Fails with a message naming the struct and the macro to use, e.g.
 * epxi_check_version(o->version, EPX_PLAN_OPTS_VERSION, "epx_plan_opts",
 * "EPX_PLAN_OPTS_INIT", err). */
EPXI_HIDDEN epx_status epxi_check_version(uint32_t version, uint32_t expected, const char *type,
                                          const char *init, epx_error *err);

/* An SGLang release string, MAJOR.MINOR.PATCH[.postN] with an optional
 * leading 'v', as four numbers (release.c). The one parser for every room
 * that follows SGLang release by release (dispatch's table rules, plan's
 * EPLB). EPX_ERR_INVALID_ARG names the string and the form, and refuses
 * pre-releases (which rule they carry is unknown); *newer (optional) is
 * true when the release is newer than EPX_SGLANG_DEFAULT_VERSION. */
EPXI_HIDDEN epx_status epxi_sglang_release(const char *release, long v[4], bool *newer,
                                           epx_error *err);
/* <0, 0, >0 as release a is older than, equal to, newer than b. */
EPXI_HIDDEN int epxi_release_cmp(const long a[4], const long b[4]);

/* A model's shape from the text of a config.json (model_config.c): the one
 * reader behind epx_model_from_config and the built-in table (models.c).
 * path names the text in messages; info->name and info->model.name are left
 * empty for the caller. */
EPXI_HIDDEN epx_status epxi_model_read(const char *text, size_t len, const char *path,
                                       epx_model_info *info, epx_error *err);

/* ---- shapes and loads: one definition each, for every room --------------- */

/* A shape in messages: printf("layout " EPXI_SHAPE_FMT, EPXI_SHAPE_ARGS(s)). */
#define EPXI_SHAPE_FMT "L=%d E=%d P=%d G=%d N=%d"
#define EPXI_SHAPE_ARGS(s)                                                                         \
    (s)->num_layers, (s)->num_logical_experts, (s)->num_physical_experts, (s)->num_gpus,           \
        (s)->num_nodes

/* True when two shapes agree in every count. */
EPXI_HIDDEN bool epxi_shape_equal(const epx_shape *a, const epx_shape *b);

/* EPX_OK when two shapes agree; else EPX_ERR_SHAPE with the message
 * head, a's shape, mid, b's shape, tail, e.g. ("the layout (", ") is not of
 * the plan's shape (", ")"). The one shape comparison of every room. */
EPXI_HIDDEN epx_status epxi_check_same_shape(const epx_shape *a, const epx_shape *b,
                                             const char *head, const char *mid, const char *tail,
                                             epx_error *err);

/* The most bytes one array sized from the caller's shape may take, 1 TiB:
 * a layout's replica map (epx_shape_check), a counts tensor
 * (epx_counts_create) and a balancer's tables; past it the shape is
 * refused before anything is allocated. */
#define EPXI_MAX_ARRAY_BYTES ((size_t)1 << 40)

/* The largest total of a counts tensor's loads that readers accept: 2^63,
 * what SGLang's int64 logical_count holds. Every sum, mean and ratio the
 * rooms take of loads then stays finite (1e308 each once gave NaN
 * balancedness with exit 0). */
#define EPXI_MAX_LOAD_TOTAL 0x1p63

/* EPX_OK when a sum of loads is at most EPXI_MAX_LOAD_TOTAL, else `status`
 * with "the <what> sum to ..., above 2^63 ...: scale them down". The one
 * wording of that refusal, for every check below and the rooms' own. */
EPXI_HIDDEN epx_status epxi_check_load_total(double total, const char *what, epx_status status,
                                             epx_error *err);

/* EPX_OK when the loads of c sum to at most EPXI_MAX_LOAD_TOTAL, else
 * EPX_ERR_PARSE naming the total and the fix. What every counts reader
 * checks last. */
EPXI_HIDDEN epx_status epxi_counts_check_total(const epx_counts *c, epx_error *err);

/* A counts struct a caller may have filled by hand: not NULL, data not
 * NULL, every dimension >= 1 and within epx_counts_create's limits, so
 * S * L * E is its data's length. EPX_ERR_INVALID_ARG or EPX_ERR_SHAPE
 * naming `fn` and the shape; the loads themselves are the caller's check. */
EPXI_HIDDEN epx_status epxi_counts_valid(const epx_counts *c, const char *fn, epx_error *err);

/* Loads handed to the API ([n] doubles named `what`, e.g. "load" or
 * "expected_load"): each finite and >= 0, the sum at most
 * EPXI_MAX_LOAD_TOTAL; else EPX_ERR_INVALID_ARG naming the entry or the
 * total. The functions that sum loads call it first. */
EPXI_HIDDEN epx_status epxi_check_loads(const double *w, size_t n, const char *what,
                                        epx_error *err);

/* The load of one cell (l * E + e) of counts summed over windows
 * [first, first + n), added in window order from 0.0: every room that sums
 * windows goes through here, so they all round alike. Arguments are trusted
 * (callers checked the range). */
static inline double epxi_window_sum(const epx_counts *c, int32_t first, int32_t n, size_t cell) {
    const size_t le = (size_t)c->num_layers * (size_t)c->num_experts;
    double x = 0.0;
    for (int32_t s = first; s < first + n; s++) x += c->data[(size_t)s * le + cell];
    return x;
}

/* Counts' windows summed into a new [L][E] array (the caller frees it);
 * NULL (with err set) when it cannot be allocated. */
EPXI_HIDDEN double *epxi_sum_load(const epx_counts *counts, epx_error *err);

/*
 * GPU loads of one layer; returns the largest (0.0 when there is none).
 * row [P] physical_to_logical; load [E] the layer's expert loads. Each
 * expert's load goes to its slots by share [P] when share is not NULL, else
 * evenly over its replicas: replicas [E] when the caller knows them (a
 * layout's num_valid; then failed must be NULL), else counted into cnt [E]
 * (scratch) over live GPUs. failed [G] (may be NULL): nonzero = lost, its
 * load is 0. gpu [G] (out). Arguments are trusted; allocates nothing.
 */
EPXI_HIDDEN double epxi_layer_gpu_loads(const int32_t *row, const double *load, const double *share,
                                        const int32_t *replicas, const uint8_t *failed, int32_t E,
                                        int32_t P, int32_t G, int32_t *cnt, double *gpu);

/* Sum, maximum (the first GPU attaining it) and count of the live GPUs'
 * loads gpu [G] (failed [G] may be NULL). */
typedef struct epxi_gpu_summary {
    double total;    /* the live GPUs' loads, added in GPU order */
    double max;      /* -1.0 when no GPU is live */
    int32_t max_gpu; /* the lowest GPU with the max */
    int32_t live;
} epxi_gpu_summary;
EPXI_HIDDEN epxi_gpu_summary epxi_gpu_summarize(const double *gpu, int32_t G,
                                                const uint8_t *failed);

/* Balancedness of one layer: mean live GPU load / max GPU load; 1.0 for a
 * layer without load. The one definition every room uses. */
static inline double epxi_balancedness(const epxi_gpu_summary *s) {
    if (s->max <= 0.0 || s->live == 0) return 1.0;
    return s->total / (double)s->live / s->max;
}

/* Threads for `items` independent pieces of work: EPX_THREADS if set (1 =
 * none), else one per online CPU; at most `items` and 64. The library's only
 * threads come from epxi_parallel (today: SGLang's cut dispatch table;
 * DeepSeek's layers on threads were measured slower on the 2-core VM at the
 * planning shapes, bench/RESULTS.md, and are not used). EPX_ERR_INVALID_ARG
 * for an EPX_THREADS that is not a whole number from 1, naming it. */
EPXI_HIDDEN epx_status epxi_threads(int64_t items, int32_t *threads, epx_error *err);

/* Run fn(ctx, t, n) for t = 0 .. n - 1, each on its own thread, t = 0 on
 * the calling thread; returns when all are done. A thread that cannot
 * start leaves its share to the caller, which runs it after its own. */
EPXI_HIDDEN void epxi_parallel(int32_t n, void (*fn)(void *ctx, int32_t t, int32_t n), void *ctx);

#endif /* EPX_INTERNAL_H */
