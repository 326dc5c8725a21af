/*
 * balance.c - balancedness, the lower bound on the max GPU load, and the gap
 * (definitions in include/epx/metrics.h).
 *
 * Everything is double. The bound's per-replica term is computed exactly by
 * the greedy that DeepSeek's replica step uses: each further slot goes to the
 * expert with the largest load / replicas. That greedy is optimal for the max
 * per-replica load (each step lowers the current maximum as far as one slot
 * can, and no other assignment of the same slots has a lower maximum), so the
 * term is the true optimum, not an estimate. A max-heap keeps it at
 * O((P - E) log E) per layer.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* Max-heap of experts by (ratio, -id). */
static inline bool above(const double *r, int32_t a, int32_t b) {
    return r[a] > r[b] || (r[a] == r[b] && a < b);
}

static void sift_down(int32_t *heap, int32_t n, const double *r, int32_t i) {
    int32_t x = heap[i];
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && above(r, heap[c + 1], heap[c])) c++;
        if (!above(r, heap[c], x)) break;
        heap[i] = heap[c];
        i = c;
    }
    heap[i] = x;
}

/* Optimal max per-replica load of one layer; cnt [E], ratio [E], heap [E]
 * are scratch (cnt holds the counts afterwards). */
static double opt_max_per_replica(const double *w, int32_t E, int32_t P, int32_t *cnt,
                                  double *ratio, int32_t *heap) {
    for (int32_t e = 0; e < E; e++) {
        cnt[e] = 1;
        ratio[e] = w[e];
        heap[e] = e;
    }
    for (int32_t i = E / 2 - 1; i >= 0; i--) sift_down(heap, E, ratio, i);
    for (int32_t i = E; i < P; i++) {
        const int32_t e = heap[0];
        cnt[e]++;
        ratio[e] = w[e] / (double)cnt[e];
        sift_down(heap, E, ratio, 0);
    }
    return ratio[heap[0]];
}

static epx_status check_load_row(const double *w, int32_t E, int32_t layer, epx_error *err) {
    double total = 0.0;
    for (int32_t e = 0; e < E; e++) {
        if (!(w[e] >= 0.0) || !isfinite(w[e]))
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "load of layer %d, expert %d is %g: loads must be finite and >= 0",
                             layer, e, w[e]);
        total += w[e];
    }
    /* the readers' bound, per layer: beyond it the figures overflow to NaN */
    char what[48];
    snprintf(what, sizeof what, "loads of layer %d", layer);
    return epxi_check_load_total(total, what, EPX_ERR_INVALID_ARG, err);
}

/* Shares of one layer: finite, >= 0, summing to 1 per expert. */
static epx_status check_shares(const epx_layout *lay, int32_t l, const double *share,
                               epx_error *err) {
    const epx_shape *s = epx_layout_shape(lay);
    const int32_t E = s->num_logical_experts;
    int32_t W = 0;
    const int32_t *l2p =
        epx_layout_logical_to_all_physical(lay, &W) + (size_t)l * (size_t)E * (size_t)W;
    const int32_t *nv = epx_layout_num_valid(lay) + (size_t)l * (size_t)E;
    for (int32_t e = 0; e < E; e++) {
        double sum = 0.0;
        for (int32_t k = 0; k < nv[e]; k++) {
            const int32_t p = l2p[(size_t)e * (size_t)W + (size_t)k];
            const double x = share[p];
            if (!(x >= 0.0) || !isfinite(x))
                return epxi_fail(err, EPX_ERR_INVALID_ARG,
                                 "replica weight of layer %d, slot %d (expert %d) is %g: weights "
                                 "must be finite and >= 0",
                                 l, p, e, x);
            sum += x;
        }
        if (!(fabs(sum - 1.0) <= 1e-6))
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "the replica weights of layer %d, expert %d sum to %.17g: the "
                             "shares of one expert's replicas must sum to 1",
                             l, e, sum);
    }
    return EPX_OK;
}

/* Every layer's loads and shares, before anything is written: an error
 * leaves the outputs as they were (epx.h). */
static epx_status check_layers(const epx_layout *lay, const double *load, const double *share,
                               epx_error *err) {
    const epx_shape *s = epx_layout_shape(lay);
    const int32_t E = s->num_logical_experts, P = s->num_physical_experts;
    for (int32_t l = 0; l < s->num_layers; l++) {
        EPX_TRY(check_load_row(load + (size_t)l * (size_t)E, E, l, err));
        if (share != NULL) EPX_TRY(check_shares(lay, l, share + (size_t)l * (size_t)P, err));
    }
    return EPX_OK;
}

/* GPU loads of layer l into g [G] (inputs checked by check_layers). */
static void layer_gpu_loads(const epx_layout *lay, int32_t l, const double *w, const double *share,
                            double *g) {
    const epx_shape *s = epx_layout_shape(lay);
    const int32_t E = s->num_logical_experts, P = s->num_physical_experts, G = s->num_gpus;
    const int32_t *p2l = epx_layout_physical_to_logical(lay) + (size_t)l * (size_t)P;
    if (share != NULL) share += (size_t)l * (size_t)P;
    const int32_t *nv = epx_layout_num_valid(lay) + (size_t)l * (size_t)E;
    (void)epxi_layer_gpu_loads(p2l, w, share, nv, NULL, E, P, G, NULL, g);
}

epx_status epx_gpu_loads(const epx_layout *lay, const double *load, const double *share,
                         double *gpu_load, epx_error *err) {
    if (lay == NULL || load == NULL || gpu_load == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "epx_gpu_loads: NULL argument");
    const epx_shape *s = epx_layout_shape(lay);
    EPX_TRY(check_layers(lay, load, share, err));
    for (int32_t l = 0; l < s->num_layers; l++)
        layer_gpu_loads(lay, l, load + (size_t)l * (size_t)s->num_logical_experts, share,
                        gpu_load + (size_t)l * (size_t)s->num_gpus);
    return EPX_OK;
}

epx_status epx_balance_compute(const epx_layout *lay, const double *load, const double *share,
                               epx_balance *out, epx_layer_balance *layers, epx_error *err) {
    if (lay == NULL || load == NULL || out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "epx_balance_compute: NULL argument");
    const epx_shape *s = epx_layout_shape(lay);
    const int32_t L = s->num_layers, E = s->num_logical_experts, P = s->num_physical_experts;
    const int32_t G = s->num_gpus;
    EPX_TRY(check_layers(lay, load, share, err));
    /* Scratch: G GPU loads, E ratios (doubles); E counts, E heap slots (ints). */
    double *dbuf = epxi_calloc((size_t)G + (size_t)E, sizeof *dbuf, "balance scratch", err);
    int32_t *ibuf = dbuf ? epxi_calloc(2 * (size_t)E, sizeof *ibuf, "balance scratch", err) : NULL;
    if (ibuf == NULL) {
        free(dbuf);
        return err ? err->status : EPX_ERR_NOMEM;
    }
    double *g = dbuf, *ratio = dbuf + G;
    epx_balance sum = {0.0, 0.0, 0.0, 0.0, 0, -1};
    double worst = 2.0;
    for (int32_t l = 0; l < L; l++) {
        const double *w = load + (size_t)l * (size_t)E;
        layer_gpu_loads(lay, l, w, share, g);
        epx_layer_balance b;
        memset(&b, 0, sizeof b);
        double tot = 0.0;
        for (int32_t e = 0; e < E; e++) tot += w[e];
        b.total = tot;
        const epxi_gpu_summary gsum = epxi_gpu_summarize(g, G, NULL);
        b.max_gpu_load = gsum.max;
        b.max_gpu = gsum.max_gpu;
        b.mean_gpu_load = gsum.total / (double)G;
        b.loaded = tot > 0.0; /* then some GPU has load: the same as gsum.max > 0 */
        b.balancedness = epxi_balancedness(&gsum);
        b.balancedness_sglang = (b.mean_gpu_load + 1e-5) / (b.max_gpu_load + 1e-5);
        b.max_per_replica_opt = opt_max_per_replica(w, E, P, ibuf, ratio, ibuf + E);
        b.bound_max_load =
            b.mean_gpu_load > b.max_per_replica_opt ? b.mean_gpu_load : b.max_per_replica_opt;
        b.bound = b.loaded ? b.mean_gpu_load / b.bound_max_load : 1.0;
        if (layers != NULL) layers[l] = b;
        sum.balancedness_sglang += b.balancedness_sglang;
        if (b.loaded) {
            sum.num_loaded_layers++;
            sum.balancedness += b.balancedness;
            sum.bound += b.bound;
            if (b.balancedness < worst) {
                worst = b.balancedness;
                sum.worst_layer = l;
            }
        }
    }
    free(dbuf);
    free(ibuf);
    const int32_t n = sum.num_loaded_layers;
    sum.balancedness = n ? sum.balancedness / n : 1.0;
    sum.bound = n ? sum.bound / n : 1.0;
    sum.gap = sum.bound - sum.balancedness;
    if (sum.gap < 0.0) sum.gap = 0.0; /* rounding only: the bound is a true bound */
    sum.balancedness_sglang /= (double)L;
    *out = sum;
    return EPX_OK;
}

epx_status epx_bound_max_load(const double *load, int32_t E, int32_t P, int32_t G,
                              double *bound_max_load, double *max_per_replica, int32_t *replicas,
                              epx_error *err) {
    if (load == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "epx_bound_max_load: load is NULL");
    epx_shape s = {1, E, P, G, 1};
    EPX_TRY(epx_shape_check(&s, err));
    EPX_TRY(check_load_row(load, E, 0, err));
    double *ratio = epxi_calloc((size_t)E, sizeof *ratio, "bound scratch", err);
    int32_t *ibuf = ratio ? epxi_calloc(2 * (size_t)E, sizeof *ibuf, "bound scratch", err) : NULL;
    if (ibuf == NULL) {
        free(ratio);
        return err ? err->status : EPX_ERR_NOMEM;
    }
    const double opt = opt_max_per_replica(load, E, P, ibuf, ratio, ibuf + E);
    double tot = 0.0;
    for (int32_t e = 0; e < E; e++) tot += load[e];
    const double mean = tot / (double)G;
    if (bound_max_load) *bound_max_load = mean > opt ? mean : opt;
    if (max_per_replica) *max_per_replica = opt;
    if (replicas) memcpy(replicas, ibuf, (size_t)E * sizeof *replicas);
    free(ratio);
    free(ibuf);
    return EPX_OK;
}

epx_status epx_gpu_loads_balance(const double *gpu_load, int32_t num_layers, int32_t num_gpus,
                                 double *balancedness, int32_t *num_loaded, epx_error *err) {
    if (gpu_load == NULL || balancedness == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_gpu_loads_balance: gpu_load and balancedness must not be NULL");
    if (num_layers < 1 || num_gpus < 1)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "epx_gpu_loads_balance: %d layers of %d GPUs: both must be >= 1",
                         num_layers, num_gpus);
    EPX_TRY(epxi_check_loads(gpu_load, (size_t)num_layers * (size_t)num_gpus, "gpu_load", err));
    double sum = 0.0;
    int32_t used = 0;
    for (int32_t l = 0; l < num_layers; l++) {
        const epxi_gpu_summary s =
            epxi_gpu_summarize(gpu_load + (size_t)l * (size_t)num_gpus, num_gpus, NULL);
        if (s.max > 0.0) sum += epxi_balancedness(&s), used++;
    }
    *balancedness = used ? sum / used : 1.0;
    if (num_loaded != NULL) *num_loaded = used;
    return EPX_OK;
}
