/*
 * metrics.c - imbalance by rank and by slot, and the inter-node traffic
 * share of a placement for a logical load (definitions in epx/stats.h).
 * GPU loads come from epx_gpu_loads (epx/metrics.h), so "the load of a GPU"
 * means the same thing here as in balancedness and the bound, and the input
 * checks (finite, non-negative loads; replica shares summing to 1) happen
 * in one place.
 *
 * The traffic share needs, per expert, how its replica shares sit over
 * nodes and which GPUs hold a replica. Under the uniform-source assumption
 * the per-expert cross-node probability has a closed form in those, so the
 * cost is O(replicas) per expert, O(L * P) for the whole placement.
 */
#include <math.h>
#include <string.h>

#include "internal.h"

double epx_imbalance_ratio(const double *v, int32_t n) {
    if (v == NULL || n < 1) return 0.0;
    double sum = 0.0, mx = v[0];
    for (int32_t i = 0; i < n; i++) {
        sum += v[i];
        if (v[i] > mx) mx = v[i];
    }
    if (!(sum > 0.0)) return 0.0;
    double mean = sum / n;
    return (mx - mean) / mean;
}

/*
 * Probability that one token of expert e crosses nodes, under `model`,
 * with the token's source GPU uniform over G (stats.h). share[] is the
 * expert's replica shares, W_m the share held on node m:
 *   UNIFORM     1 - (1/G) sum_g W_node(g)                    = 1 - 1/N
 *   GPU_LOCAL   (1/G) sum over GPUs without a replica of (1 - W_node(g))
 *   NODE_LOCAL  (1/G) sum over GPUs on nodes without a replica of 1
 * node_w is [N] scratch, zero on entry and left zero on return.
 */
static double cross_node_probability(const int32_t *slots, const double *share, int32_t nrep,
                                     int32_t slots_per_gpu, int32_t gpus_per_node, int32_t G,
                                     int32_t N, epx_traffic_model model, double *node_w) {
    const int32_t slots_per_node = slots_per_gpu * gpus_per_node;
    for (int32_t i = 0; i < nrep; i++) node_w[slots[i] / slots_per_node] += share[i];
    double cross;
    if (model == EPX_TRAFFIC_UNIFORM) {
        double s = 0.0;
        for (int32_t m = 0; m < N; m++) s += node_w[m] * gpus_per_node;
        cross = 1.0 - s / G;
    } else if (model == EPX_TRAFFIC_GPU_LOCAL) {
        /* Start from every GPU lacking a replica, then remove the GPUs that
         * hold one (replicas are ascending, so one GPU's are adjacent). */
        double s = 0.0;
        for (int32_t m = 0; m < N; m++) s += (1.0 - node_w[m]) * gpus_per_node;
        int32_t last_gpu = -1;
        for (int32_t i = 0; i < nrep; i++) {
            int32_t g = slots[i] / slots_per_gpu;
            if (g == last_gpu) continue;
            last_gpu = g;
            s -= 1.0 - node_w[g / gpus_per_node];
        }
        cross = s / G;
    } else {
        int32_t empty = N, last_node = -1;
        for (int32_t i = 0; i < nrep; i++) {
            int32_t m = slots[i] / slots_per_node;
            if (m != last_node) empty--;
            last_node = m;
        }
        cross = (double)empty / N;
    }
    for (int32_t i = 0; i < nrep; i++) node_w[slots[i] / slots_per_node] = 0.0;
    return cross < 0.0 ? 0.0 : cross; /* rounding in the sums above */
}

epx_status epx_load_stats_compute(const epx_layout *layout, const double *load,
                                  const double *weights, epx_traffic_model traffic,
                                  epx_load_stats *out, epx_layer_stats *layers, epx_error *err) {
    if (layout == NULL || load == NULL || out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    if (traffic != EPX_TRAFFIC_UNIFORM && traffic != EPX_TRAFFIC_GPU_LOCAL &&
        traffic != EPX_TRAFFIC_NODE_LOCAL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "traffic model %d is not UNIFORM (0), GPU_LOCAL (1) or NODE_LOCAL (2)",
                         (int)traffic);
    const epx_shape *s = epx_layout_shape(layout);
    const int32_t L = s->num_layers, E = s->num_logical_experts, P = s->num_physical_experts;
    const int32_t G = s->num_gpus, N = s->num_nodes, spg = P / G, gpn = G / N;
    int32_t W = 0;
    const int32_t *l2p = epx_layout_logical_to_all_physical(layout, &W);
    const int32_t *nv = epx_layout_num_valid(layout);
    const int32_t *map = epx_layout_physical_to_logical(layout);

    /* Scratch: GPU loads [L][G], slot loads [P], node shares [N], replica
     * shares [W]. */
    size_t cells = (size_t)L * (size_t)G + (size_t)P + (size_t)N + (size_t)W;
    double *gpu = epxi_calloc(cells, sizeof(double), "load stats scratch", err);
    if (gpu == NULL) return EPX_ERR_NOMEM;
    double *slot = gpu + (size_t)L * (size_t)G, *node_w = slot + P, *share = node_w + N;
    epx_status st = epx_gpu_loads(layout, load, weights, gpu, err);
    if (st != EPX_OK) {
        free(gpu);
        return st;
    }

    epx_load_stats sum = {0.0, 0.0, 0.0, -1, 0, 0.0};
    double cross_total = 0.0, load_total = 0.0;
    for (int32_t l = 0; l < L; l++) {
        const double *w = load + (size_t)l * (size_t)E;
        const double *rw = weights ? weights + (size_t)l * (size_t)P : NULL;
        epx_layer_stats ls = {0.0, 0.0, 0.0, 0.0};
        for (int32_t e = 0; e < E; e++) ls.total += w[e];
        if (ls.total > 0.0) {
            ls.rank_imbalance = epx_imbalance_ratio(gpu + (size_t)l * (size_t)G, G);
            const int32_t *m = map + (size_t)l * (size_t)P;
            for (int32_t p = 0; p < P; p++)
                slot[p] = rw ? w[m[p]] * rw[p] : w[m[p]] / nv[(size_t)l * (size_t)E + (size_t)m[p]];
            ls.slot_imbalance = epx_imbalance_ratio(slot, P);
            double cross = 0.0;
            for (int32_t e = 0; e < E; e++) {
                if (w[e] <= 0.0) continue;
                const int32_t n = nv[(size_t)l * (size_t)E + (size_t)e];
                const int32_t *reps = l2p + ((size_t)l * (size_t)E + (size_t)e) * (size_t)W;
                for (int32_t i = 0; i < n; i++) share[i] = rw ? rw[reps[i]] : 1.0 / n;
                cross +=
                    w[e] * cross_node_probability(reps, share, n, spg, gpn, G, N, traffic, node_w);
            }
            ls.internode_share = cross / ls.total;
            cross_total += cross;
            load_total += ls.total;
            sum.rank_imbalance += ls.rank_imbalance;
            sum.slot_imbalance += ls.slot_imbalance;
            if (sum.worst_layer < 0 || ls.rank_imbalance > sum.max_rank_imbalance) {
                sum.max_rank_imbalance = ls.rank_imbalance;
                sum.worst_layer = l;
            }
            sum.num_loaded_layers++;
        }
        if (layers != NULL) layers[l] = ls;
    }
    if (sum.num_loaded_layers > 0) {
        sum.rank_imbalance /= sum.num_loaded_layers;
        sum.slot_imbalance /= sum.num_loaded_layers;
        sum.internode_share = cross_total / load_total;
    }
    free(gpu);
    *out = sum;
    return EPX_OK;
}
