/*
 * recorder.c - the expert load recorder: tokens per physical slot per layer
 * for each forward pass, kept as logical counts in a ring (stat mode) or a
 * bounded list (per_pass mode), with the per-pass balancedness history that
 * SGLang logs as last_{10,100,1000}_average_balancedness.
 *
 * Everything is allocated in epx_recorder_create; the per-pass calls only
 * write into those buffers. Counting is the hot path (T x K ids per layer,
 * 2M ids per Kimi-K2 pass at T = 4096). A first, vectorisable pass checks
 * every id against [-1, P), so a bad id leaves the recorder exactly as it
 * was; the counting pass then shifts ids by one so that -1 lands in a sink
 * bin 0 (no branch), and spreads them over four interleaved sub-histograms,
 * which breaks the store-to-load chains a hot expert's repeated increments
 * would otherwise form. bench/recorder.c measures it against the naive loop.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "internal.h"

/* Below this many ids a call counts straight into the pass row: clearing
 * and folding the sub-histograms would cost more than it saves. */
#define SMALL_CALL_IDS 512
/* Sub-histogram lanes are uint32: one chunk never exceeds 2^32 per bin. */
#define CHUNK_IDS ((size_t)1 << 30)
#define LANES 4

struct epx_recorder {
    const epx_layout *layout; /* borrowed */
    epx_shape shape;
    epx_record_mode mode;
    int32_t capacity;
    int32_t head;                         /* ring index the next pass is written to */
    int32_t held;                         /* passes held */
    int64_t *pass;                        /* [L][P] physical counts of the open pass */
    uint8_t *dirty;                       /* [L] layers of the open pass with counts */
    int64_t *sum;                         /* [L] the open pass's tokens per layer: every GPU's
                                             and expert's sum is part of it, so keeping it
                                             within int64 keeps them all */
    int64_t *ring;                        /* [capacity][L][E] logical counts */
    uint32_t *lanes;                      /* [LANES][P + 1] sub-histograms; bin 0 is the sink */
    double *gpu;                          /* [G] scratch: one layer's GPU counts */
    double hist[2][EPX_RECORDER_HISTORY]; /* per-pass balancedness, both metrics */
    int32_t hist_head, hist_held;
};

static size_t lane_bins(const epx_shape *s) { return (size_t)s->num_physical_experts + 1; }

/* Sizes of every buffer, with overflow checks. */
typedef struct {
    size_t pass, ring, lanes, gpu, total;
} sizes;

static epx_status check_opts(const epx_recorder_opts *o, epx_error *err) {
    if (o == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "recorder options are NULL");
    EPX_TRY(epxi_check_version(o->version, EPX_RECORDER_OPTS_VERSION, "epx_recorder_opts",
                               "EPX_RECORDER_OPTS_INIT", err));
    if (o->mode != EPX_RECORD_STAT && o->mode != EPX_RECORD_PER_PASS)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "recorder mode %d is neither EPX_RECORD_STAT (0) nor "
                         "EPX_RECORD_PER_PASS (1)",
                         (int)o->mode);
    if (o->capacity < 1)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "recorder capacity (%d) must be >= 1 pass (SGLang's buffer size is "
                         "1000)",
                         o->capacity);
    return EPX_OK;
}

static epx_status compute_sizes(const epx_shape *s, const epx_recorder_opts *o, sizes *z,
                                epx_error *err) {
    size_t LP = (size_t)s->num_layers * (size_t)s->num_physical_experts;
    size_t LE = (size_t)s->num_layers * (size_t)s->num_logical_experts, ring_cells;
    if (!epxi_mul_size(LE, (size_t)o->capacity, &ring_cells) ||
        !epxi_mul_size(ring_cells, sizeof(int64_t), &z->ring))
        return epxi_fail(err, EPX_ERR_OVERFLOW,
                         "a recorder of %d passes x %d layers x %d experts overflows size_t: "
                         "lower the capacity",
                         o->capacity, s->num_layers, s->num_logical_experts);
    z->pass = LP * sizeof(int64_t);
    z->lanes = LANES * lane_bins(s) * sizeof(uint32_t);
    z->gpu = (size_t)s->num_gpus * sizeof(double);
    z->total = sizeof(struct epx_recorder) + z->pass +
               (size_t)s->num_layers * (1 + sizeof(int64_t)) + z->lanes + z->gpu;
    if (z->ring > (size_t)-1 - z->total)
        return epxi_fail(err, EPX_ERR_OVERFLOW, "recorder size overflows size_t");
    z->total += z->ring;
    return EPX_OK;
}

epx_status epx_recorder_memory(const epx_shape *shape, const epx_recorder_opts *opts, size_t *bytes,
                               epx_error *err) {
    if (bytes == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    EPX_TRY(epx_shape_check(shape, err));
    EPX_TRY(check_opts(opts, err));
    sizes z;
    EPX_TRY(compute_sizes(shape, opts, &z, err));
    *bytes = z.total;
    return EPX_OK;
}

void epx_recorder_destroy(epx_recorder *rec) {
    if (rec == NULL) return;
    free(rec->pass);
    free(rec->dirty);
    free(rec->sum);
    free(rec->ring);
    free(rec->lanes);
    free(rec->gpu);
    free(rec);
}

epx_status epx_recorder_create(const epx_layout *layout, const epx_recorder_opts *opts,
                               epx_recorder **out, epx_error *err) {
    if (layout == NULL || out == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    EPX_TRY(check_opts(opts, err));
    const epx_shape *s = epx_layout_shape(layout);
    sizes z;
    EPX_TRY(compute_sizes(s, opts, &z, err));
    epx_recorder *r = epxi_calloc(1, sizeof *r, "recorder", err);
    if (r == NULL) return EPX_ERR_NOMEM;
    r->layout = layout;
    r->shape = *s;
    r->mode = opts->mode;
    r->capacity = opts->capacity;
    r->pass = epxi_calloc(z.pass, 1, "recorder pass counts", err);
    r->dirty = r->pass ? epxi_calloc((size_t)s->num_layers, 1, "recorder layer flags", err) : NULL;
    r->sum = r->dirty
                 ? epxi_calloc((size_t)s->num_layers, sizeof *r->sum, "recorder layer sums", err)
                 : NULL;
    r->ring = r->sum ? epxi_calloc(z.ring, 1, "recorder passes", err) : NULL;
    r->lanes = r->ring ? epxi_calloc(z.lanes, 1, "recorder histograms", err) : NULL;
    r->gpu = r->lanes ? epxi_calloc(z.gpu, 1, "recorder GPU scratch", err) : NULL;
    if (r->gpu == NULL) {
        epx_recorder_destroy(r);
        return EPX_ERR_NOMEM;
    }
    *out = r;
    return EPX_OK;
}

epx_status epx_recorder_set_layout(epx_recorder *rec, const epx_layout *layout, epx_error *err) {
    if (rec == NULL || layout == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    const epx_shape *a = &rec->shape, *b = epx_layout_shape(layout);
    EPX_TRY(epxi_check_same_shape(b, a, "the new layout is ", " but the recorder's is ",
                                  ": a recorder keeps one shape; create a new one for another",
                                  err));
    rec->layout = layout;
    return EPX_OK;
}

static epx_status check_layer(const epx_recorder *rec, int32_t layer, epx_error *err) {
    if (layer < 0 || layer >= rec->shape.num_layers)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "layer %d is outside [0, %d)", layer,
                         rec->shape.num_layers);
    return EPX_OK;
}

/* Report the first id outside [-1, P) of ids[0..n). */
static epx_status bad_id(const int32_t *ids, size_t n, int32_t top_k, int32_t P, int32_t layer,
                         epx_error *err) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < -1 || ids[i] >= P)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "layer %d: topk_ids[%zu][%zu] is %d, outside [-1, %d): ids must be "
                             "physical slots (map logical ids through the dispatch table first); "
                             "nothing of this call was counted",
                             layer, i / (size_t)top_k, i % (size_t)top_k, ids[i], P);
    return epxi_fail(err, EPX_ERR_INTERNAL, "layer %d: a bad id was flagged but not found", layer);
}

/* Nonzero when some id of ids[0..n) is outside [-1, P). One compare per id
 * with no early exit, so the compiler vectorises it. */
static uint32_t any_bad(const int32_t *ids, size_t n, uint32_t P) {
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) bad |= (uint32_t)ids[i] + 1u > P;
    return bad;
}

/* Count validated ids[0..n) into the four lanes (index id + 1, so -1 lands
 * in bin 0). n <= CHUNK_IDS keeps every bin below 2^32. */
static void count_lanes(const int32_t *ids, size_t n, size_t bins, uint32_t *lanes) {
    uint32_t *h0 = lanes, *h1 = h0 + bins, *h2 = h1 + bins, *h3 = h2 + bins;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        h0[(uint32_t)ids[i] + 1u]++;
        h1[(uint32_t)ids[i + 1] + 1u]++;
        h2[(uint32_t)ids[i + 2] + 1u]++;
        h3[(uint32_t)ids[i + 3] + 1u]++;
    }
    for (; i < n; i++) h0[(uint32_t)ids[i] + 1u]++;
}

epx_status epx_recorder_add_topk(epx_recorder *rec, int32_t layer, const int32_t *topk_ids,
                                 int64_t num_tokens, int32_t top_k, epx_error *err) {
    if (rec == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "recorder is NULL");
    EPX_TRY(check_layer(rec, layer, err));
    if (num_tokens < 0 || top_k < 1)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "num_tokens (%lld) must be >= 0 and top_k (%d) >= 1",
                         (long long)num_tokens, top_k);
    if (num_tokens == 0) return EPX_OK;
    if (topk_ids == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "topk_ids is NULL");
    size_t n;
    if ((uint64_t)num_tokens > SIZE_MAX || !epxi_mul_size((size_t)num_tokens, (size_t)top_k, &n))
        return epxi_fail(err, EPX_ERR_OVERFLOW, "num_tokens (%lld) x top_k (%d) overflows",
                         (long long)num_tokens, top_k);
    const int32_t P = rec->shape.num_physical_experts;
    int64_t *row = rec->pass + (size_t)layer * (size_t)P;
    /* Validate the whole call before counting anything: all or nothing. */
    if (any_bad(topk_ids, n, (uint32_t)P)) return bad_id(topk_ids, n, top_k, P, layer, err);
    if ((uint64_t)n > (uint64_t)(INT64_MAX - rec->sum[layer]))
        return epxi_fail(err, EPX_ERR_OVERFLOW,
                         "layer %d: %zu more ids would take the pass's count past 2^63 - 1 "
                         "(it holds %lld): end the pass first; nothing of this call was added",
                         layer, n, (long long)rec->sum[layer]);
    rec->sum[layer] += (int64_t)n; /* -1 ids too: an upper bound is all the check needs */
    if (n <= SMALL_CALL_IDS) {
        for (size_t i = 0; i < n; i++)
            if (topk_ids[i] >= 0) row[topk_ids[i]]++;
    } else {
        const size_t bins = (size_t)P + 1;
        for (size_t start = 0; start < n; start += CHUNK_IDS) {
            size_t len = n - start < CHUNK_IDS ? n - start : CHUNK_IDS;
            memset(rec->lanes, 0, LANES * bins * sizeof(uint32_t));
            count_lanes(topk_ids + start, len, bins, rec->lanes);
            const uint32_t *h = rec->lanes;
            for (int32_t p = 0; p < P; p++)
                row[p] +=
                    (int64_t)h[p + 1] + h[bins + p + 1] + h[2 * bins + p + 1] + h[3 * bins + p + 1];
        }
    }
    rec->dirty[layer] = 1;
    return EPX_OK;
}

epx_status epx_recorder_add_slot_counts(epx_recorder *rec, int32_t layer, const int64_t *counts,
                                        epx_error *err) {
    if (rec == NULL || counts == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    EPX_TRY(check_layer(rec, layer, err));
    const int32_t P = rec->shape.num_physical_experts;
    int64_t *row = rec->pass + (size_t)layer * (size_t)P;
    int64_t sum = rec->sum[layer];
    for (int32_t p = 0; p < P; p++) {
        if (counts[p] < 0 || counts[p] > INT64_MAX - sum)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "layer %d: counts[%d] is %lld: slot counts must be >= 0 and the "
                             "layer's pass total (%lld before it) must stay within 2^63 - 1, "
                             "so that every GPU's and expert's sum fits int64; nothing of this "
                             "call was added",
                             layer, p, (long long)counts[p], (long long)sum);
        sum += counts[p];
    }
    for (int32_t p = 0; p < P; p++) row[p] += counts[p];
    rec->sum[layer] = sum;
    rec->dirty[layer] = 1;
    return EPX_OK;
}

/* GPU counts of one layer's slot row: total and max, in double (epx's
 * figure) and in float32 (SGLang's, which converts the counts first). */
typedef struct {
    double total, max;
    float total_f, max_f;
} gpu_sums;

static gpu_sums layer_gpu_sums(const int64_t *row, int32_t G, int32_t spg) {
    gpu_sums r = {0.0, 0.0, 0.0f, 0.0f};
    for (int32_t g = 0; g < G; g++) {
        int64_t c = 0;
        for (int32_t i = 0; i < spg; i++) c += row[g * spg + i];
        const double x = (double)c;
        const float xf = (float)c;
        r.total += x;
        if (x > r.max) r.max = x;
        r.total_f += xf;
        if (xf > r.max_f) r.max_f = xf;
    }
    return r;
}

/*
 * One sweep over the layers converts the open pass to logical counts in the
 * ring, computes both balancedness figures (stats.h) and clears the pass.
 * The figures use the pass's physical counts, the tokens each GPU really
 * got: epx_balance_compute would split the logical load evenly over
 * replicas, which is not what the dispatch did. Layers without tokens are
 * not loaded (left out of epx's mean) and count 1e-5 / 1e-5 = 1 in SGLang's.
 * The SGLang figure follows compute_utilization_rate in float32 and then
 * torch.mean over layers, also in float32.
 */
epx_status epx_recorder_end_pass(epx_recorder *rec, epx_error *err) {
    if (rec == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "recorder is NULL");
    if (rec->mode == EPX_RECORD_PER_PASS && rec->held == rec->capacity)
        return epxi_fail(err, EPX_ERR_OVERFLOW,
                         "the per_pass recorder holds its capacity of %d passes: dump and "
                         "reset it, or create it with a larger capacity; the open pass is kept",
                         rec->capacity);
    const int32_t L = rec->shape.num_layers, E = rec->shape.num_logical_experts;
    const int32_t P = rec->shape.num_physical_experts, G = rec->shape.num_gpus, spg = P / G;
    const int32_t *map = epx_layout_physical_to_logical(rec->layout);
    int64_t *dst = rec->ring + (size_t)rec->head * (size_t)L * (size_t)E;
    double sum_epx = 0.0;
    int32_t loaded = 0;
    float sum_sg = 0.0f;
    for (int32_t l = 0; l < L; l++) {
        int64_t *out = dst + (size_t)l * (size_t)E;
        memset(out, 0, (size_t)E * sizeof *out);
        if (!rec->dirty[l]) {
            sum_sg += 1.0f;
            continue;
        }
        int64_t *row = rec->pass + (size_t)l * (size_t)P;
        const int32_t *m = map + (size_t)l * (size_t)P;
        for (int32_t p = 0; p < P; p++) out[m[p]] += row[p];
        const gpu_sums g = layer_gpu_sums(row, G, spg);
        if (g.total > 0.0) {
            sum_epx += (g.total / G) / g.max;
            loaded++;
        }
        sum_sg += (g.total_f / (float)G + 1e-5f) / (g.max_f + 1e-5f);
        memset(row, 0, (size_t)P * sizeof *row);
        rec->dirty[l] = 0;
        rec->sum[l] = 0;
    }
    rec->hist[EPX_RECORDER_BALANCEDNESS][rec->hist_head] = loaded ? sum_epx / loaded : 1.0;
    rec->hist[EPX_RECORDER_BALANCEDNESS_SGLANG][rec->hist_head] = (double)(sum_sg / (float)L);
    rec->hist_head = (rec->hist_head + 1) % EPX_RECORDER_HISTORY;
    if (rec->hist_held < EPX_RECORDER_HISTORY) rec->hist_held++;
    rec->head = (rec->head + 1) % rec->capacity;
    if (rec->held < rec->capacity) rec->held++;
    return EPX_OK;
}

void epx_recorder_discard_pass(epx_recorder *rec) {
    if (rec == NULL) return;
    const size_t P = (size_t)rec->shape.num_physical_experts;
    for (int32_t l = 0; l < rec->shape.num_layers; l++)
        if (rec->dirty[l]) {
            memset(rec->pass + (size_t)l * P, 0, P * sizeof(int64_t));
            rec->dirty[l] = 0;
            rec->sum[l] = 0;
        }
}

int32_t epx_recorder_num_passes(const epx_recorder *rec) { return rec ? rec->held : 0; }

epx_status epx_recorder_dump(const epx_recorder *rec, epx_counts **out, epx_error *err) {
    if (rec == NULL || out == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    if (rec->held == 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "the recorder holds no pass: call epx_recorder_end_pass after each "
                         "forward pass before dumping");
    const size_t LE = (size_t)rec->shape.num_layers * (size_t)rec->shape.num_logical_experts;
    epx_counts *c = NULL;
    EPX_TRY(epx_counts_create(rec->held, rec->shape.num_layers, rec->shape.num_logical_experts, &c,
                              err));
    int32_t first = (rec->head - rec->held + rec->capacity) % rec->capacity;
    for (int32_t s = 0; s < rec->held; s++) {
        const int64_t *src = rec->ring + (size_t)((first + s) % rec->capacity) * LE;
        double *dst = c->data + (size_t)s * LE;
        for (size_t i = 0; i < LE; i++) dst[i] = (double)src[i];
    }
    *out = c;
    return EPX_OK;
}

void epx_recorder_reset(epx_recorder *rec) {
    if (rec == NULL) return;
    rec->head = rec->held = 0;
    rec->hist_head = rec->hist_held = 0;
}

epx_status epx_recorder_balancedness(const epx_recorder *rec, int32_t window,
                                     epx_recorder_metric metric, double *out, epx_error *err) {
    if (rec == NULL || out == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    if (window < 1 || window > EPX_RECORDER_HISTORY)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "window (%d) must be in [1, %d] passes", window,
                         EPX_RECORDER_HISTORY);
    if (metric != EPX_RECORDER_BALANCEDNESS && metric != EPX_RECORDER_BALANCEDNESS_SGLANG)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "unknown recorder metric %d", (int)metric);
    if (rec->hist_held == 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "no pass ended since the recorder was created or reset");
    int32_t n = window < rec->hist_held ? window : rec->hist_held;
    double sum = 0.0;
    for (int32_t i = 1; i <= n; i++)
        sum +=
            rec->hist[metric][(rec->hist_head - i + EPX_RECORDER_HISTORY) % EPX_RECORDER_HISTORY];
    *out = sum / n;
    return EPX_OK;
}
