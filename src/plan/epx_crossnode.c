/*
 * epx_crossnode.c - how much of the routed load a placement serves away from
 * its expert group's node: the traffic cost of relaxing node locality.
 *
 * With group-limited routing (DeepSeek-V3: 8 groups, a token uses at most 4
 * of them) and groups kept node-local, a token has to reach only the nodes
 * that hold its groups. A replica outside its group's home node sends the
 * tokens it takes to one more node. The home node of a group is taken as
 * the node that serves the largest part of that group's load (the lowest
 * such node on ties), so the figure is the least cross-node traffic the
 * placement implies: 0 for node-local (strict) placements, about
 * (N - 1) / N of the load when there is one group or placement is global.
 */
#include "internal.h"

#include <string.h>

epx_status epx_plan_cross_node_share(const epx_layout *layout, const double *weights,
                                     const epx_counts *counts, int32_t num_groups,
                                     double *per_layer, double *share, epx_error *err) {
    if (layout == NULL || counts == NULL || share == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_plan_cross_node_share: layout, counts and share must not be NULL");
    EPX_TRY(epxi_counts_valid(counts, "epx_plan_cross_node_share", err));
    const epx_shape *s = epx_layout_shape(layout);
    const int32_t L = s->num_layers, E = s->num_logical_experts, P = s->num_physical_experts;
    const int32_t N = s->num_nodes, ppn = P / N;
    if (counts->num_layers != L || counts->num_experts != E)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "counts are [%d][%d] (layers x experts) but the layout has %d layers of "
                         "%d experts: pass counts recorded for this model",
                         counts->num_layers, counts->num_experts, L, E);
    if (num_groups < 1 || E % num_groups != 0)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "num_groups (%d) must be >= 1 and divide the %d experts", num_groups, E);
    EPX_TRY(epxi_check_loads(counts->data, (size_t)counts->num_windows * (size_t)L * (size_t)E,
                             "counts", err));
    if (weights != NULL) EPX_TRY(epxi_check_loads(weights, (size_t)L * (size_t)P, "weights", err));
    const int32_t gs = E / num_groups;
    const int32_t *map = epx_layout_physical_to_logical(layout);
    const int32_t *nv = epx_layout_num_valid(layout);
    double *load = epxi_calloc((size_t)E, sizeof(double), "cross-node load", err);
    double *served =
        epxi_calloc((size_t)num_groups * (size_t)N, sizeof(double), "cross-node group loads", err);
    if (load == NULL || served == NULL) {
        free(load), free(served);
        return EPX_ERR_NOMEM;
    }
    double total = 0.0, off = 0.0;
    for (int32_t l = 0; l < L; l++) {
        for (int32_t e = 0; e < E; e++)
            load[e] =
                epxi_window_sum(counts, 0, counts->num_windows, (size_t)l * (size_t)E + (size_t)e);
        memset(served, 0, (size_t)num_groups * (size_t)N * sizeof *served);
        const int32_t *m = map + (size_t)l * P;
        double lt = 0.0;
        for (int32_t p = 0; p < P; p++) {
            int32_t e = m[p];
            double sh = weights ? weights[(size_t)l * P + p] : 1.0 / nv[(size_t)l * E + e];
            double v = load[e] * sh;
            served[(size_t)(e / gs) * N + p / ppn] += v;
            lt += v;
        }
        double lo = 0.0;
        for (int32_t g = 0; g < num_groups; g++) {
            const double *row = served + (size_t)g * N;
            double sum = 0.0, top = row[0];
            for (int32_t n = 0; n < N; n++) {
                sum += row[n];
                if (row[n] > top) top = row[n];
            }
            lo += sum - top;
        }
        if (per_layer) per_layer[l] = lt > 0.0 ? lo / lt : 0.0;
        total += lt, off += lo;
    }
    free(load), free(served);
    *share = total > 0.0 ? off / total : 0.0;
    return EPX_OK;
}
