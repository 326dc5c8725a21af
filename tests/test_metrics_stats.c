/*
 * test_metrics_stats.c - imbalance by rank and by slot and the inter-node
 * traffic share (epx/stats.h) on a hand-computed placement, with and without
 * replica weights, and against a naive per-source-GPU reference on random
 * placements; by-rank imbalance against epx/metrics.h's balancedness.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define CLOSE(a, b) assert_true(fabs((a) - (b)) < 1e-12)

/*
 * L = 3, E = 4, P = 8, G = 4, N = 2: slots 2g, 2g+1 on GPU g; GPUs 0, 1 on
 * node 0, GPUs 2, 3 on node 1.
 *   layer 0: map 0 1 2 3 0 1 2 3  load 8 4 2 2  (every expert on both nodes)
 *   layer 1: map 0 1 0 2 3 1 3 3  load 6 4 5 7
 *   layer 2: map 0 1 2 3 0 1 2 3  load 0 (dense)
 * Layer 0: slot loads 4 2 1 1 4 2 1 1, GPU loads 6 2 6 2: mean 4, max 6:
 *   rank (6-4)/4 = 1/2; slot mean 2, max 4: 1. GPU_LOCAL: a source GPU
 *   without the expert (one per node) sends half its tokens off-node:
 *   (0.5 + 0.5) / 4 = 1/4 for every expert. NODE_LOCAL: 0.
 * Layer 1: slots 3 2 3 5 7/3 2 7/3 7/3, GPU loads 5 8 13/3 14/3: mean 5.5,
 *   max 8: rank 2.5/5.5 = 5/11; slot mean 2.75, max 5: 9/11.
 *   GPU_LOCAL per expert: e0 (g0, g1) 1/2, e1 (g0, g2) 1/4, e2 (g1) 1/2,
 *   e3 (g2, g3) 1/2: (3 + 1 + 2.5 + 3.5) / 22 = 5/11.
 *   NODE_LOCAL: e0, e2, e3 miss a node: (6 + 5 + 7) / 2 / 22 = 9/22.
 * Overall: GPU_LOCAL (16/4 + 10) / 38 = 7/19; NODE_LOCAL 9/38; UNIFORM 1/2.
 */
static const int32_t MAP[24] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 0, 2,
                                3, 1, 3, 3, 0, 1, 2, 3, 0, 1, 2, 3};
static const double LOAD[12] = {8, 4, 2, 2, 6, 4, 5, 7, 0, 0, 0, 0};

static epx_layout *hand_layout(void) {
    epx_shape s = {3, 4, 8, 4, 2};
    epx_layout *lay = NULL;
    epx_error err = {0};
    assert_int_equal(epx_layout_create_from_map(&s, MAP, &lay, &err), EPX_OK);
    return lay;
}

static void imbalance_ratio(void **state) {
    (void)state;
    double v[3] = {1, 2, 3}, z[2] = {0, 0}, one[1] = {7};
    CLOSE(epx_imbalance_ratio(v, 3), 0.5);
    CLOSE(epx_imbalance_ratio(z, 2), 0.0);
    CLOSE(epx_imbalance_ratio(one, 1), 0.0);
    CLOSE(epx_imbalance_ratio(v, 0), 0.0);
    CLOSE(epx_imbalance_ratio(NULL, 3), 0.0);
}

static void hand_computed(void **state) {
    (void)state;
    epx_layout *lay = hand_layout();
    epx_layer_stats ls[3];
    epx_load_stats st;
    epx_error err = {0};
    assert_int_equal(epx_load_stats_compute(lay, LOAD, NULL, EPX_TRAFFIC_GPU_LOCAL, &st, ls, &err),
                     EPX_OK);
    CLOSE(ls[0].total, 16);
    CLOSE(ls[0].rank_imbalance, 0.5);
    CLOSE(ls[0].slot_imbalance, 1.0);
    CLOSE(ls[0].internode_share, 0.25);
    CLOSE(ls[1].total, 22);
    CLOSE(ls[1].rank_imbalance, 5.0 / 11);
    CLOSE(ls[1].slot_imbalance, 9.0 / 11);
    CLOSE(ls[1].internode_share, 5.0 / 11);
    CLOSE(ls[2].total, 0);
    CLOSE(ls[2].rank_imbalance, 0);
    CLOSE(ls[2].slot_imbalance, 0);
    CLOSE(ls[2].internode_share, 0);
    assert_int_equal(st.num_loaded_layers, 2);
    CLOSE(st.rank_imbalance, (0.5 + 5.0 / 11) / 2);
    CLOSE(st.slot_imbalance, (1.0 + 9.0 / 11) / 2);
    CLOSE(st.max_rank_imbalance, 0.5);
    assert_int_equal(st.worst_layer, 0);
    CLOSE(st.internode_share, 7.0 / 19);

    assert_int_equal(epx_load_stats_compute(lay, LOAD, NULL, EPX_TRAFFIC_NODE_LOCAL, &st, ls, &err),
                     EPX_OK);
    CLOSE(ls[0].internode_share, 0.0);
    CLOSE(ls[1].internode_share, 9.0 / 22);
    CLOSE(st.internode_share, 9.0 / 38);
    /* UNIFORM: 1 - 1/N whatever the placement. */
    assert_int_equal(epx_load_stats_compute(lay, LOAD, NULL, EPX_TRAFFIC_UNIFORM, &st, NULL, &err),
                     EPX_OK);
    CLOSE(st.internode_share, 0.5);

    /* By-rank imbalance is 1 / balancedness - 1, layer by layer. */
    epx_balance b;
    epx_layer_balance lb[3];
    assert_int_equal(epx_balance_compute(lay, LOAD, NULL, &b, lb, &err), EPX_OK);
    CLOSE(lb[0].balancedness, 2.0 / 3);
    CLOSE(1.0 / lb[1].balancedness - 1.0, 5.0 / 11);
    epx_layout_destroy(lay);
}

/*
 * Replica weights move load between replicas: layer 0 expert 0 takes 3/4
 * on slot 0 and 1/4 on slot 4 (slots 6 2 1 1 2 2 1 1, GPU loads 8 2 4 2:
 * rank (8-4)/4 = 1, slot (6-2)/2 = 2); layer 1 expert 1 all on slot 1,
 * expert 3 split 1/2, 1/4, 1/4 (slots 3 4 3 5 3.5 0 1.75 1.75, GPU loads
 * 7 8 3.5 3.5: rank 5/11, slot 9/11). GPU_LOCAL for layer 0 expert 0: the
 * GPU of node 0 without it sends 1/4 off-node, node 1's sends 3/4: 1/4.
 * Layer 1 expert 1: node 0 holds all the weight, g1 sends 0 off-node, g3
 * sends everything: 1/4, as without weights.
 */
static void with_replica_weights(void **state) {
    (void)state;
    epx_layout *lay = hand_layout();
    const double w[24] = {0.75, 0.5, 0.5,  0.5,  0.25, 0.5, 0.5, 0.5, 0.5, 1.0, 0.5, 1.0,
                          0.5,  0.0, 0.25, 0.25, 0.5,  0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5};
    epx_layer_stats ls[3];
    epx_load_stats st;
    epx_error err = {0};
    assert_int_equal(epx_load_stats_compute(lay, LOAD, w, EPX_TRAFFIC_GPU_LOCAL, &st, ls, &err),
                     EPX_OK);
    CLOSE(ls[0].rank_imbalance, 1.0);
    CLOSE(ls[0].slot_imbalance, 2.0);
    CLOSE(ls[0].internode_share, 0.25);
    CLOSE(ls[1].rank_imbalance, 5.0 / 11);
    CLOSE(ls[1].slot_imbalance, 9.0 / 11);
    CLOSE(ls[1].internode_share, 5.0 / 11);
    assert_int_equal(epx_load_stats_compute(lay, LOAD, w, EPX_TRAFFIC_UNIFORM, &st, ls, &err),
                     EPX_OK);
    CLOSE(ls[1].internode_share, 0.5);
    /* Shares of an expert that do not sum to 1 are refused by epx_gpu_loads. */
    double bad[24];
    memcpy(bad, w, sizeof bad);
    bad[0] = 0.9;
    assert_int_equal(epx_load_stats_compute(lay, LOAD, bad, EPX_TRAFFIC_UNIFORM, &st, ls, &err),
                     EPX_ERR_INVALID_ARG);
    epx_layout_destroy(lay);
}

static void errors(void **state) {
    (void)state;
    epx_layout *lay = hand_layout();
    epx_load_stats st;
    epx_error err = {0};
    assert_int_equal(epx_load_stats_compute(lay, LOAD, NULL, (epx_traffic_model)3, &st, NULL, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "traffic model 3");
    double neg[12];
    memcpy(neg, LOAD, sizeof neg);
    neg[5] = -1;
    assert_int_equal(epx_load_stats_compute(lay, neg, NULL, EPX_TRAFFIC_UNIFORM, &st, NULL, &err),
                     EPX_ERR_INVALID_ARG);
    assert_int_equal(epx_load_stats_compute(lay, NULL, NULL, EPX_TRAFFIC_UNIFORM, &st, NULL, &err),
                     EPX_ERR_INVALID_ARG);
    epx_layout_destroy(lay);
}

/* Naive reference: every source GPU, every replica, explicitly. */
static double naive_share(const epx_layout *lay, const double *load, const double *w, int model,
                          int32_t l) {
    const epx_shape *s = epx_layout_shape(lay);
    const int32_t E = s->num_logical_experts, P = s->num_physical_experts, G = s->num_gpus;
    const int32_t spg = P / G, gpn = G / s->num_nodes;
    const int32_t *map = epx_layout_physical_to_logical(lay) + (size_t)l * (size_t)P;
    const int32_t *nv = epx_layout_num_valid(lay) + (size_t)l * (size_t)E;
    double cross = 0, total = 0;
    for (int32_t e = 0; e < E; e++) {
        double we = load[(size_t)l * (size_t)E + (size_t)e];
        total += we;
        for (int32_t g = 0; g < G; g++) {
            int local = 0;
            for (int32_t p = 0; p < P; p++) {
                if (map[p] != e) continue;
                if (model == 1 && p / spg == g) local = 1;
                if (model == 2 && p / spg / gpn == g / gpn) local = 1;
            }
            if (local) continue;
            for (int32_t p = 0; p < P; p++) {
                if (map[p] != e || p / spg / gpn == g / gpn) continue;
                double sh = w ? w[(size_t)l * (size_t)P + (size_t)p] : 1.0 / nv[e];
                cross += we * sh / G;
            }
        }
    }
    return total > 0 ? cross / total : 0.0;
}

static void random_vs_naive(void **state) {
    (void)state;
    tu_rng r = {tu_seed(777)};
    for (int iter = 0; iter < 200; iter++) {
        int32_t N = 1 + (int32_t)tu_below(&r, 4), gpn = 1 + (int32_t)tu_below(&r, 3);
        int32_t G = N * gpn, E = 1 + (int32_t)tu_below(&r, 24);
        int32_t spg = (E + G - 1) / G + (int32_t)tu_below(&r, 3), P = spg * G;
        int32_t L = 1 + (int32_t)tu_below(&r, 3);
        int32_t *map = malloc(sizeof(int32_t) * (size_t)(L * P));
        double *load = malloc(sizeof(double) * (size_t)(L * E));
        double *w = malloc(sizeof(double) * (size_t)(L * P));
        for (int32_t l = 0; l < L; l++) {
            int32_t *m = map + l * P;
            for (int32_t p = 0; p < P; p++) m[p] = p < E ? p : (int32_t)tu_below(&r, (uint32_t)E);
            for (int32_t p = P - 1; p > 0; p--) {
                int32_t q = (int32_t)tu_below(&r, (uint32_t)p + 1), t = m[p];
                m[p] = m[q];
                m[q] = t;
            }
            for (int32_t e = 0; e < E; e++)
                load[l * E + e] = tu_below(&r, 4) ? floor(tu_uniform(&r) * 100) : 0;
            /* random shares per expert, normalised */
            for (int32_t p = 0; p < P; p++) w[l * P + p] = 0.1 + tu_uniform(&r);
            for (int32_t e = 0; e < E; e++) {
                double sum = 0;
                for (int32_t p = 0; p < P; p++)
                    if (m[p] == e) sum += w[l * P + p];
                for (int32_t p = 0; p < P; p++)
                    if (m[p] == e) w[l * P + p] /= sum;
            }
        }
        epx_shape s = {L, E, P, G, N};
        epx_layout *lay = NULL;
        epx_error err = {0};
        assert_int_equal(epx_layout_create_from_map(&s, map, &lay, &err), EPX_OK);
        epx_layer_stats *ls = malloc(sizeof *ls * (size_t)L);
        epx_layer_balance *lb = malloc(sizeof *lb * (size_t)L);
        epx_balance b;
        for (int model = 0; model < 3; model++)
            for (int weighted = 0; weighted < 2; weighted++) {
                const double *ww = weighted ? w : NULL;
                epx_load_stats st;
                assert_int_equal(
                    epx_load_stats_compute(lay, load, ww, (epx_traffic_model)model, &st, ls, &err),
                    EPX_OK);
                assert_int_equal(epx_balance_compute(lay, load, ww, &b, lb, &err), EPX_OK);
                for (int32_t l = 0; l < L; l++) {
                    double want = naive_share(lay, load, ww, model, l);
                    if (fabs(ls[l].internode_share - want) > 1e-9)
                        fail_msg("iter %d model %d weighted %d layer %d: share %.12f, naive %.12f",
                                 iter, model, weighted, l, ls[l].internode_share, want);
                    if (lb[l].loaded)
                        assert_true(fabs(ls[l].rank_imbalance - (1 / lb[l].balancedness - 1)) <
                                    1e-9);
                }
                if (model == 0 && st.num_loaded_layers > 0)
                    assert_true(fabs(st.internode_share - (1.0 - 1.0 / N)) < 1e-9);
            }
        free(ls);
        free(lb);
        free(map);
        free(load);
        free(w);
        epx_layout_destroy(lay);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(imbalance_ratio),      cmocka_unit_test(hand_computed),
        cmocka_unit_test(with_replica_weights), cmocka_unit_test(errors),
        cmocka_unit_test(random_vs_naive),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
