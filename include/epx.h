/*
 * epx.h - the core C API of epx, expert parallelism for Mixture-of-Experts
 * inference: expert placement, dispatch tables, load statistics and the
 * SGLang / DeepSeek file formats.
 *
 * This header is plain C11: no CUDA, NCCL or MPI types appear here. GPU entry
 * points live in epx_cuda.h and communicators in epx_comm.h.
 *
 * Conventions, for every function below:
 *  - Fallible functions return an epx_status; EPX_OK is 0. Results come back
 *    through out-parameters, which are left untouched on error.
 *  - The last argument `err` (may be NULL) receives a sentence that names the
 *    offending value, the limit and the fix. There is no global last error.
 *  - The library never prints, exits or aborts. Logging goes through the
 *    epx_log_fn an options struct carries.
 *  - Destructors accept NULL.
 *  - Options structs, one convention for all (epx_plan_opts, epx_comm_ops
 *    and every other struct with a `version`):
 *      version  the first field; EPX_<NAME>_VERSION is ((uint32_t)sizeof the
 *               struct), so a caller built against another layout is told
 *               so instead of read past the end. Any other value is an
 *               error that names the struct and its INIT macro.
 *      INIT     EPX_<NAME>_INIT writes the version and every default:
 *               `epx_plan_opts o = EPX_PLAN_OPTS_INIT;` then change fields.
 *      defaults one sentinel rule, by the kind of field: a pointer is
 *               optional when NULL; a count or size that is otherwise >= 1
 *               takes 0 for "derive it" (num_physical 0 = E + redundant,
 *               chunk_layers 0 = all layers); a number whose valid values
 *               start at 0 takes any negative value for "default" or "no
 *               limit" (estimate_param, cross_node_budget, max_moves); an
 *               enum that lets the library choose has a *_DEFAULT member, 0.
 *               Each field's comment names its default.
 *    Unknown or contradictory options are an error, never silently clamped.
 *
 * Each function is documented in one shape:
 *   summary; Args (direction, shape, dtype, ownership); Returns; Thread rules.
 */
#ifndef EPX_H
#define EPX_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EPX_VERSION_MAJOR 0
#define EPX_VERSION_MINOR 1
#define EPX_VERSION_PATCH 0

#if defined(__GNUC__)
#define EPX_API __attribute__((visibility("default")))
#else
#define EPX_API
#endif

/* Status codes. Append-only: a code is never renumbered or reused. */
typedef enum epx_status {
    EPX_OK = 0,
    EPX_ERR_INVALID_ARG = 1, /* an argument or option has a wrong value    */
    EPX_ERR_SHAPE = 2,       /* sizes disagree or do not divide            */
    EPX_ERR_PARSE = 3,       /* a file or string is not what it claims     */
    EPX_ERR_IO = 4,          /* a file could not be opened, read, written  */
    EPX_ERR_NOMEM = 5,       /* an allocation failed                       */
    EPX_ERR_OVERFLOW = 6,    /* a size computation would overflow          */
    EPX_ERR_UNSUPPORTED = 7, /* valid request this build cannot serve yet  */
    EPX_ERR_REFUSED = 8,     /* input asked for something unsafe (pickle)  */
    EPX_ERR_INVALID_MAP = 9, /* a placement map breaks an invariant        */
    EPX_ERR_COMM = 10,       /* a communication backend call failed        */
    EPX_ERR_CUDA = 11,       /* a CUDA runtime / cuBLAS call failed        */
    EPX_ERR_TIMEOUT = 12,    /* a peer did not answer in time              */
    EPX_ERR_INTERNAL = 13,   /* an invariant of epx itself broke (a bug)   */
    EPX_STATUS_COUNT_        /* not a status: one past the last code */
} epx_status;

/* The name of a status ("EPX_ERR_SHAPE"), never NULL. */
EPX_API const char *epx_status_str(epx_status st);

/* Library version as "MAJOR.MINOR.PATCH", never NULL. */
EPX_API const char *epx_version(void);

/* A caller-owned error buffer. Functions fill `status` and `msg` on failure
 * and leave it untouched on success. Zero-initialise it: epx_error e = {0}; */
#define EPX_ERRMSG_MAX 512
typedef struct epx_error {
    epx_status status;
    char msg[EPX_ERRMSG_MAX];
} epx_error;

/* Log levels and the callback type carried by option structs. */
typedef enum epx_log_level {
    EPX_LOG_ERROR = 0,
    EPX_LOG_WARN = 1,
    EPX_LOG_INFO = 2,
    EPX_LOG_DEBUG = 3
} epx_log_level;
typedef void (*epx_log_fn)(void *user, epx_log_level level, const char *msg);

/* Progress of long work: `done` of `total` units of `what` ("layers
 * planned", "dump files read"). Called on the calling thread, at most once
 * per unit; a CLI shows it on a terminal and stays quiet otherwise. */
typedef void (*epx_progress_fn)(void *user, const char *what, int64_t done, int64_t total);

/* Element types of buffers: hidden-state rows (fp32, or bf16 stored as
 * uint16_t), and what communicators move. The one dtype enum of the API. */
typedef enum epx_dtype {
    EPX_DTYPE_F32 = 0,
    EPX_DTYPE_BF16 = 1,
    EPX_DTYPE_I32 = 2,
    EPX_DTYPE_I64 = 3,
    EPX_DTYPE_U8 = 4
} epx_dtype;

/* Bytes of one element of `dt`; 0 for an unknown type. */
EPX_API size_t epx_dtype_size(epx_dtype dt);

/* fp32 <-> bf16 (stored as uint16_t), round to nearest even; a NaN becomes
 * the quiet NaN of its sign (0x7fc0 / 0xffc0). */
EPX_API uint16_t epx_bf16_from_f32(float f);
EPX_API float epx_bf16_to_f32(uint16_t b);

/*
 * The shape of a model under expert parallelism, in SGLang's vocabulary.
 * L layers (every decoder layer; dense layers carry no load), E logical
 * experts per layer, P physical slots (E + redundant), G GPUs (EP ranks),
 * N nodes. Slot p lives on GPU p / (P/G); GPU g is on node g / (G/N).
 */
typedef struct epx_shape {
    int32_t num_layers;           /* L >= 1 */
    int32_t num_logical_experts;  /* E >= 1 */
    int32_t num_physical_experts; /* P >= E, P % G == 0 */
    int32_t num_gpus;             /* G >= 1, G % N == 0 */
    int32_t num_nodes;            /* N >= 1 */
} epx_shape;

/* Upper bounds that keep every derived size far from overflow. */
#define EPX_MAX_LAYERS 65536
#define EPX_MAX_EXPERTS (1 << 20)
#define EPX_MAX_GPUS (1 << 16)

/*
 * Check that a shape is usable: all counts positive and within the limits
 * above, P >= E, P % G == 0, G % N == 0, and L * P * (P - E + 1) fits.
 * Args:    shape (in) the shape to check.
 * Returns: EPX_OK, EPX_ERR_SHAPE or EPX_ERR_OVERFLOW with a message that
 *          names the values and a fix (e.g. the nearest valid P).
 */
EPX_API epx_status epx_shape_check(const epx_shape *shape, epx_error *err);

/* Slots per GPU, P / G, for a valid shape (0 for NULL or no GPUs). */
EPX_API int32_t epx_shape_slots_per_gpu(const epx_shape *shape);

/*
 * Safe output files. Every file epx writes goes through one path: the bytes
 * go to a temp file in the target's folder (see epx_file_temp_path), which is
 * renamed over the target only when complete, so readers never see half a
 * file and a failed write leaves the old one. The target is resolved first: a
 * symlink is written through to its final target (the link stays); an
 * existing target that is not a regular file (directory, FIFO, device,
 * socket) is refused before anything is opened, so a FIFO never blocks.
 */

/* Resolve an output path: follow symlinks (at most 40) to the file that
 * would be written and check that it is a regular file or a new name in an
 * existing folder.
 * Args:    path (in) the output as given; target (out) malloc'd resolved path,
 *          free with epx_free; may be NULL to only check.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG for a non-regular file or a symlink
 *          loop; EPX_ERR_IO for a missing folder; each with the value and
 *          the fix. */
EPX_API epx_status epx_file_output_check(const char *path, char **target, epx_error *err);

/* The temp name epx writes `path` through: "DIR/.BASE.epx-tmp.PID" beside the
 * resolved target, so a caller can remove it on a signal (a BASE too long
 * for that to be a file name is cut and marked: ".PREFIX~HASH.epx-tmp.PID").
 * Writes at most cap bytes (NUL included). Returns: EPX_OK, EPX_ERR_INVALID_ARG as
 * epx_file_output_check, EPX_ERR_OVERFLOW when cap is too small. */
EPX_API epx_status epx_file_temp_path(const char *path, char *buf, size_t cap, epx_error *err);

/* Write `path` safely (above) with `body`, which writes the bytes to f and
 * returns EPX_OK or an error it has recorded in err.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG for a path it refuses; EPX_ERR_IO with
 *          the system's reason (e.g. "No space left on device"); body's
 *          status. The temp file never outlives a failed call. */
typedef epx_status (*epx_write_fn)(FILE *f, const void *ctx, epx_error *err);
EPX_API epx_status epx_file_write(const char *path, epx_write_fn body, const void *ctx,
                                  epx_error *err);

/*
 * Safe input files. Every file epx reads as text (config.json, JSON counts
 * and maps, epx advise --measured) goes through epx_file_read: the path is
 * stat()ed first and anything but a regular file (FIFO, device, socket,
 * directory) is refused before it is opened, so `--model /dev/zero` or a FIFO
 * never blocks or runs away; a file above the caller's byte limit is refused
 * from its size before a byte is read, and at most limit + 1 bytes are read.
 */
#define EPX_MAX_CONFIG_BYTES (1u << 20)       /* a HuggingFace config.json: 1 MiB */
#define EPX_MAX_CONFIG_DEPTH 64               /* its JSON nesting */
#define EPX_MAX_CONFIG_VALUES (1u << 18)      /* its JSON values (elements + keys) */
#define EPX_MAX_INPUT_BYTES ((size_t)1 << 30) /* a JSON counts/map/measured file: 1 GiB */

/* Read a whole regular file into a malloc'd, NUL-terminated buffer.
 * Args:    path (in); max_bytes the most bytes accepted; what (in, may be
 *          NULL) names the limit in the message ("a config.json"); data
 *          (out) free with epx_free; len (out) bytes read (NUL excluded).
 * Returns: EPX_OK; EPX_ERR_IO for a missing or unreadable file or a folder;
 *          EPX_ERR_INVALID_ARG for a FIFO, device or socket, or a file above
 *          max_bytes, each naming the path (and the limit); EPX_ERR_NOMEM. */
EPX_API epx_status epx_file_read(const char *path, size_t max_bytes, const char *what, char **data,
                                 size_t *len, epx_error *err);

/* The check epx_file_read makes before opening: path names an existing
 * regular file (symlinks followed). Returns: EPX_OK, EPX_ERR_IO (missing, a
 * folder) or EPX_ERR_INVALID_ARG (FIFO, device, socket), naming the path. */
EPX_API epx_status epx_file_input_check(const char *path, epx_error *err);

/* The newest SGLang release epx was checked against, release by release
 * (tools/sglang_tables.py, tools/sglang_eplb.py). Every SGLang rule epx
 * follows (static tables, EPLB) knows the releases up to this
 * one; a newer release is accepted with a warning and gets this one's rule. */
#define EPX_SGLANG_DEFAULT_VERSION "0.5.23"

/* EPX_SGLANG_DEFAULT_VERSION as the library was built, for bindings. */
EPX_API const char *epx_sglang_newest_verified(void);

/* The oldest SGLang release epx reproduces; an older release, and any string
 * that is not MAJOR.MINOR.PATCH[.postN], is refused by every rule that takes
 * a release (epx_sglang_table_rule, epx_sglang_eplb_rule). */
#define EPX_SGLANG_OLDEST_VERSION "0.5.2"

/* EPX_SGLANG_OLDEST_VERSION as the library was built, for bindings. */
EPX_API const char *epx_sglang_oldest_verified(void);

/* The rooms of the core API, one header each. */
#include "epx/layout.h"
#include "epx/counts.h"
#include "epx/model.h"
#include "epx/plan.h" /* before io.h: epx_init_opts names an epx_algorithm */
#include "epx/io.h"
#include "epx/pt.h"
#include "epx/metrics.h"
#include "epx/stats.h"
#include "epx/trace.h"
#include "epx/dispatch.h"
#include "epx/migrate.h"
#include "epx/moe.h"
#include "epx/report.h"

#ifdef __cplusplus
}
#endif
#endif /* EPX_H */
