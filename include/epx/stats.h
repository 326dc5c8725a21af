/*
 * epx/stats.h - the load recorder (what SGLang's expert distribution
 * recorder does, in C and without allocating per pass) and the load metrics
 * that complement epx/metrics.h: by-rank and by-slot imbalance and the
 * inter-node traffic share. Balancedness, the lower bound and the gap to it
 * are defined in epx/metrics.h. Include epx.h, not this file.
 *
 * The recorder, per forward pass:
 *   for each MoE layer:  epx_recorder_add_topk (physical ids [T][K]) or
 *                        epx_recorder_add_slot_counts (counts [P], e.g. from
 *                        the fused token-layout kernel), any number of times;
 *   then once:           epx_recorder_end_pass.
 * end_pass turns the pass's physical counts into logical ones with the
 * recorder's current layout (epx_recorder_set_layout swaps it after a
 * rebalance), stores them, and appends the pass's balancedness to a history
 * of the last EPX_RECORDER_HISTORY passes. epx_recorder_dump hands out the
 * stored passes as epx_counts [S][L][E], oldest first; epx_recorder_reset
 * clears them.
 *
 * One recorder sees the tokens it is given. SGLang sums every rank's GPU
 * counts before it computes balancedness; to get the same global figure on
 * a multi-rank server, feed one recorder the all-reduced slot counts
 * (epx_recorder_add_slot_counts) rather than one recorder per rank.
 *
 * Differences from SGLang, on purpose: SGLang's stat mode stores physical
 * counts and converts them all at dump time with the map current then; epx
 * converts each pass with the layout that served it, so a rebalance during
 * recording does not misattribute earlier passes (the two agree when the
 * layout did not change). SGLang's dump returns the whole ring in storage
 * order with zeros for unused entries; epx returns only the passes it holds,
 * in time order. Their sum over passes, which planning uses, is the same.
 */
#ifndef EPX_STATS_H
#define EPX_STATS_H

/* ---- the recorder -------------------------------------------------------- */

typedef struct epx_recorder epx_recorder;

typedef enum epx_record_mode {
    EPX_RECORD_STAT = 0,    /* a ring of the last `capacity` passes (SGLang's "stat") */
    EPX_RECORD_PER_PASS = 1 /* every pass, up to `capacity`; then end_pass refuses     */
} epx_record_mode;

typedef struct epx_recorder_opts {
    uint32_t version;     /* EPX_RECORDER_OPTS_VERSION */
    epx_record_mode mode; /* default EPX_RECORD_STAT */
    int32_t capacity;     /* passes kept, >= 1 (default 1000, SGLang's buffer size) */
} epx_recorder_opts;
#define EPX_RECORDER_OPTS_VERSION ((uint32_t)sizeof(epx_recorder_opts))
#define EPX_RECORDER_OPTS_INIT                                                                     \
    { EPX_RECORDER_OPTS_VERSION, EPX_RECORD_STAT, 1000 }

/* Passes of balancedness history kept for the moving averages. */
#define EPX_RECORDER_HISTORY 1000

/* The two per-pass balancedness figures the recorder keeps, both from the
 * pass's physical counts (the tokens each GPU really received):
 *  - EPX_RECORDER_BALANCEDNESS: per layer mean GPU count / max GPU count,
 *    averaged over the layers that received tokens in that pass (1 when
 *    none did), as epx/metrics.h defines balancedness;
 *  - EPX_RECORDER_BALANCEDNESS_SGLANG: SGLang's current_pass_balancedness,
 *    per layer (mean + 1e-5) / (max + 1e-5) averaged over all layers, dense
 *    ones included, evaluated in float32 as SGLang does. */
typedef enum epx_recorder_metric {
    EPX_RECORDER_BALANCEDNESS = 0,
    EPX_RECORDER_BALANCEDNESS_SGLANG = 1
} epx_recorder_metric;

/*
 * Bytes a recorder of this shape and these options allocates (all of it at
 * creation; nothing afterwards).
 * Args:    shape (in) validated; opts (in); bytes (out).
 * Returns: EPX_OK, EPX_ERR_SHAPE, EPX_ERR_INVALID_ARG, EPX_ERR_OVERFLOW.
 */
EPX_API epx_status epx_recorder_memory(const epx_shape *shape, const epx_recorder_opts *opts,
                                       size_t *bytes, epx_error *err);

/*
 * Create a recorder for a layout's shape. Every buffer is sized here:
 * capacity * L * E int64 for the passes, plus O(L * P) scratch.
 * Args:    layout (in) borrowed: it must outlive the recorder or be replaced
 *          with epx_recorder_set_layout first. Updates made to it in place
 *          (epx_layout_update) are seen by the next end_pass;
 *          opts (in) EPX_RECORDER_OPTS_INIT plus changes;
 *          out (out) owned by the caller (epx_recorder_destroy).
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (NULL, bad version, capacity < 1, an
 *          unknown mode); EPX_ERR_OVERFLOW; EPX_ERR_NOMEM.
 * Thread:  a recorder is used by one thread at a time.
 */
EPX_API epx_status epx_recorder_create(const epx_layout *layout, const epx_recorder_opts *opts,
                                       epx_recorder **out, epx_error *err);

/* Release a recorder. Accepts NULL. */
EPX_API void epx_recorder_destroy(epx_recorder *rec);

/*
 * Convert passes ended from now on with `layout` (after a rebalance).
 * Args:    layout (in) borrowed, with exactly the shape of the current one.
 * Returns: EPX_OK; EPX_ERR_SHAPE (names both shapes); EPX_ERR_INVALID_ARG.
 */
EPX_API epx_status epx_recorder_set_layout(epx_recorder *rec, const epx_layout *layout,
                                           epx_error *err);

/*
 * Count one batch of routed tokens of a layer into the open pass.
 * Args:    layer (in) in [0, L);
 *          topk_ids (in) [num_tokens][top_k] int32 physical slot ids, row
 *          major; -1 means "not routed" and is skipped (SGLang's mask);
 *          num_tokens >= 0 (0 adds nothing; topk_ids may then be NULL);
 *          top_k >= 1.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG for a layer out of range, bad sizes,
 *          or an id outside [-1, P) (the message names token, k and id);
 *          EPX_ERR_OVERFLOW when the layer's count in the open pass would
 *          pass 2^63 - 1. On error nothing is counted: all or nothing.
 * Thread:  allocates nothing.
 */
EPX_API epx_status epx_recorder_add_topk(epx_recorder *rec, int32_t layer, const int32_t *topk_ids,
                                         int64_t num_tokens, int32_t top_k, epx_error *err);

/*
 * Add precomputed per-slot token counts of a layer to the open pass (the
 * dispatch room's fused token layout produces them).
 * Args:    layer (in) in [0, L); counts (in) [P] int64, each >= 0.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (layer, NULL, a negative count, or
 *          counts that take the layer's total in the open pass past 2^63 - 1,
 *          so that no GPU's or expert's sum could overflow: names slot and
 *          value). All or nothing.
 * Thread:  allocates nothing.
 */
EPX_API epx_status epx_recorder_add_slot_counts(epx_recorder *rec, int32_t layer,
                                                const int64_t *counts, epx_error *err);

/*
 * Close the open pass: convert its counts to logical with the current
 * layout, store them (stat mode overwrites the oldest pass when full),
 * append its balancedness to the history, and open an empty pass. A pass
 * with no counts is stored as zeros, as SGLang stores an idle pass.
 * Returns: EPX_OK; EPX_ERR_OVERFLOW in per_pass mode when `capacity` passes
 *          are held (the open pass stays open: dump and reset, then end it
 *          again).
 * Thread:  allocates nothing.
 */
EPX_API epx_status epx_recorder_end_pass(epx_recorder *rec, epx_error *err);

/* Drop the open pass's counts (a forward pass that was abandoned). */
EPX_API void epx_recorder_discard_pass(epx_recorder *rec);

/* Passes held now (<= capacity). */
EPX_API int32_t epx_recorder_num_passes(const epx_recorder *rec);

/*
 * The held passes as logical counts [S][L][E], S = epx_recorder_num_passes,
 * oldest first.
 * Args:    out (out) new counts owned by the caller (epx_counts_destroy).
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG when no pass is held; EPX_ERR_NOMEM.
 * Thread:  allocates the result only.
 */
EPX_API epx_status epx_recorder_dump(const epx_recorder *rec, epx_counts **out, epx_error *err);

/* Forget the held passes and the balancedness history (SGLang's reset).
 * The open pass is kept: reset drops what was recorded, not what is being
 * recorded (epx_recorder_discard_pass drops that). */
EPX_API void epx_recorder_reset(epx_recorder *rec);

/*
 * Moving average of a per-pass balancedness over the last `window` passes
 * ended since the last reset (fewer when fewer exist, as SGLang's deques
 * do). SGLang logs window = 10, 100 and 1000.
 * Args:    window (in) in [1, EPX_RECORDER_HISTORY]; metric (in); out (out).
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (window out of range, unknown metric,
 *          or no pass ended since the last reset).
 */
EPX_API epx_status epx_recorder_balancedness(const epx_recorder *rec, int32_t window,
                                             epx_recorder_metric metric, double *out,
                                             epx_error *err);

/* ---- imbalance and traffic of a logical load under a layout -------------- */

/*
 * How a token picks among the replicas of its expert, for the inter-node
 * traffic share. Every model assumes tokens originate uniformly over the G
 * GPUs (each GPU sends the same share of every expert's load, as with data-
 * parallel attention) and ignores the load shifts local-first choices cause.
 *  - UNIFORM: any replica, with probability = its share (replica weights, or
 *    1 / replicas). Then the share is 1 - 1/N for every placement: a
 *    placement cannot change it. It is the baseline the others are read
 *    against, and what dynamic dispatch does.
 *  - GPU_LOCAL: a replica on the source GPU when it holds one, else as
 *    UNIFORM. SGLang's static dispatch table behaves like this.
 *  - NODE_LOCAL: a replica on the source's node when the node holds one,
 *    else as UNIFORM (epx's static table: same GPU, then same node).
 */
typedef enum epx_traffic_model {
    EPX_TRAFFIC_UNIFORM = 0,
    EPX_TRAFFIC_GPU_LOCAL = 1,
    EPX_TRAFFIC_NODE_LOCAL = 2
} epx_traffic_model;

/* Figures of one layer. Imbalance is (max - mean) / mean, as TensorRT-LLM
 * reports it: 0 is perfect, 1 means the busiest unit carries twice the mean;
 * 0 for a layer without load. By rank it equals 1 / balancedness - 1. */
typedef struct epx_layer_stats {
    double total;           /* the layer's load                                   */
    double rank_imbalance;  /* over the G GPU loads (epx/metrics.h's GPU load)    */
    double slot_imbalance;  /* over the P slot loads: an expert's load split over */
                            /* its replicas evenly (or by replica weights)       */
    double internode_share; /* share of the layer's token-expert assignments     */
                            /* that cross nodes; 0 for a layer without load      */
} epx_layer_stats;

/* Figures over all layers. */
typedef struct epx_load_stats {
    double rank_imbalance;     /* mean over loaded layers; 0 when none          */
    double slot_imbalance;     /* mean over loaded layers; 0 when none          */
    double max_rank_imbalance; /* the worst layer's                             */
    int32_t worst_layer;       /* loaded layer of highest rank imbalance; -1    */
    int32_t num_loaded_layers;
    double internode_share; /* cross-node assignments / all, over all layers */
} epx_load_stats;

/*
 * Imbalance and inter-node share of a placement for a load.
 * Args:    layout (in); load (in) [L][E] double, finite, >= 0;
 *          replica_weights (in, may be NULL) [L][P], as epx_gpu_loads takes;
 *          traffic (in) the replica-choice model; out (out) the summary;
 *          layers (out, may be NULL) [L] per layer, caller-owned.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (as epx_gpu_loads, unknown traffic
 *          model); EPX_ERR_NOMEM.
 * Thread:  any thread; one allocation of scratch per call.
 */
EPX_API epx_status epx_load_stats_compute(const epx_layout *layout, const double *load,
                                          const double *replica_weights, epx_traffic_model traffic,
                                          epx_load_stats *out, epx_layer_stats *layers,
                                          epx_error *err);

/* (max - mean) / mean of n >= 1 values; 0 when they sum to 0 or n < 1. */
EPX_API double epx_imbalance_ratio(const double *values, int32_t n);

#endif /* EPX_STATS_H */
