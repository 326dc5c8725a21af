/*
 * test_metrics_balance.c - balancedness, SGLang's variant, the bound and the
 * gap on hand-computed cases; the optimal max per-replica load against brute
 * force over every replica-count vector; the bound against random
 * placements (it must never exceed what a placement achieves); errors.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define NEAR(a, b) assert_true(fabs((a) - (b)) <= 1e-12 * (1.0 + fabs(b)))

/* L=2, E=4, P=6, G=3 (2 slots per GPU). Layer 0: GPUs {0,1} {2,0} {3,1}:
 * experts 0 and 1 have two replicas. Layer 1 carries no load. */
static const int32_t MAP[12] = {0, 1, 2, 0, 3, 1, 0, 1, 2, 3, 0, 1};
static const double LOAD[8] = {4, 2, 3, 1, 0, 0, 0, 0};

static epx_layout *hand_layout(void) {
    epx_shape s = {2, 4, 6, 3, 1};
    epx_layout *lay = NULL;
    epx_error err = {0};
    assert_int_equal(epx_layout_create_from_map(&s, MAP, &lay, &err), EPX_OK);
    return lay;
}

static void hand_even_split(void **state) {
    (void)state;
    epx_layout *lay = hand_layout();
    epx_error err = {0};
    double g[6];
    assert_int_equal(epx_gpu_loads(lay, LOAD, NULL, g, &err), EPX_OK);
    /* GPU 0: 4/2 + 2/2 = 3; GPU 1: 3 + 4/2 = 5; GPU 2: 1 + 2/2 = 2 */
    NEAR(g[0], 3.0);
    NEAR(g[1], 5.0);
    NEAR(g[2], 2.0);
    NEAR(g[3], 0.0);
    epx_layer_balance lb[2];
    epx_balance b;
    assert_int_equal(epx_balance_compute(lay, LOAD, NULL, &b, lb, &err), EPX_OK);
    NEAR(lb[0].total, 10.0);
    NEAR(lb[0].mean_gpu_load, 10.0 / 3.0);
    NEAR(lb[0].max_gpu_load, 5.0);
    assert_int_equal(lb[0].max_gpu, 1);
    assert_int_equal(lb[0].loaded, 1);
    NEAR(lb[0].balancedness, 2.0 / 3.0);
    NEAR(lb[0].balancedness_sglang, (10.0 / 3.0 + 1e-5) / (5.0 + 1e-5));
    /* Replicas: 4,2,3,1 plus 2 slots -> expert 0 (4/2 = 2), then expert 2
     * (3/2 = 1.5): the max per replica is 2; the mean 10/3 dominates. */
    NEAR(lb[0].max_per_replica_opt, 2.0);
    NEAR(lb[0].bound_max_load, 10.0 / 3.0);
    NEAR(lb[0].bound, 1.0);
    /* The empty layer: balanced by definition, left out of the mean. */
    assert_int_equal(lb[1].loaded, 0);
    NEAR(lb[1].balancedness, 1.0);
    NEAR(lb[1].balancedness_sglang, 1.0);
    NEAR(lb[1].bound, 1.0);
    NEAR(b.balancedness, 2.0 / 3.0);
    NEAR(b.balancedness_sglang, ((10.0 / 3.0 + 1e-5) / (5.0 + 1e-5) + 1.0) / 2.0);
    NEAR(b.bound, 1.0);
    NEAR(b.gap, 1.0 / 3.0);
    assert_int_equal(b.num_loaded_layers, 1);
    assert_int_equal(b.worst_layer, 0);
    epx_layout_destroy(lay);
}

static void hand_replica_weights(void **state) {
    (void)state;
    epx_layout *lay = hand_layout();
    epx_error err = {0};
    /* Expert 0: slot 0 takes 3/4, slot 3 1/4; expert 1 halves. */
    double w[12] = {0.75, 0.5, 1, 0.25, 1, 0.5, 1, 1, 1, 1, 1, 1};
    /* layer 1 has one replica of 2 and 3 and two of 0 and 1 */
    w[6] = 0.5, w[10] = 0.5, w[7] = 0.5, w[11] = 0.5;
    double g[6];
    assert_int_equal(epx_gpu_loads(lay, LOAD, w, g, &err), EPX_OK);
    NEAR(g[0], 4.0);
    NEAR(g[1], 4.0);
    NEAR(g[2], 2.0);
    epx_balance b;
    assert_int_equal(epx_balance_compute(lay, LOAD, w, &b, NULL, &err), EPX_OK);
    NEAR(b.balancedness, (10.0 / 3.0) / 4.0);
    /* Shares that do not sum to 1 are refused, naming the expert. */
    w[3] = 0.5;
    assert_int_equal(epx_balance_compute(lay, LOAD, w, &b, NULL, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "layer 0, expert 0", "1.25");
    w[3] = -0.25;
    w[0] = 1.25;
    assert_int_equal(epx_gpu_loads(lay, LOAD, w, g, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "slot 3", "-0.25");
    epx_layout_destroy(lay);
}

static void bound_hand(void **state) {
    (void)state;
    epx_error err = {0};
    double w[2] = {9, 1}, bound = 0, opt = 0;
    int32_t reps[2];
    /* P = 2, G = 2: no spare slot; the hot expert's one replica is 9. */
    assert_int_equal(epx_bound_max_load(w, 2, 2, 2, &bound, &opt, reps, &err), EPX_OK);
    NEAR(opt, 9.0);
    NEAR(bound, 9.0);
    /* P = 4: expert 0 takes both spare slots: 9/3 = 3 < mean 5. */
    assert_int_equal(epx_bound_max_load(w, 2, 4, 2, &bound, &opt, reps, &err), EPX_OK);
    NEAR(opt, 3.0);
    NEAR(bound, 5.0);
    assert_int_equal(reps[0], 3);
    assert_int_equal(reps[1], 1);
    /* A layout's bound agrees: mean 5 / bound 9. */
    epx_shape s = {1, 2, 2, 2, 1};
    int32_t map[2] = {0, 1};
    epx_layout *lay = NULL;
    assert_int_equal(epx_layout_create_from_map(&s, map, &lay, &err), EPX_OK);
    epx_balance b;
    epx_layer_balance lb;
    assert_int_equal(epx_balance_compute(lay, w, NULL, &b, &lb, &err), EPX_OK);
    NEAR(lb.bound, 5.0 / 9.0);
    NEAR(b.balancedness, 5.0 / 9.0);
    NEAR(b.gap, 0.0);
    epx_layout_destroy(lay);
    /* errors */
    assert_int_equal(epx_bound_max_load(w, 2, 3, 2, &bound, NULL, NULL, &err), EPX_ERR_SHAPE);
    w[1] = -1;
    assert_int_equal(epx_bound_max_load(w, 2, 4, 2, &bound, NULL, NULL, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "expert 1", "-1");
    assert_int_equal(epx_bound_max_load(NULL, 2, 4, 2, &bound, NULL, NULL, &err),
                     EPX_ERR_INVALID_ARG);
}

/* Brute force: the least max_e w[e]/c[e] over all c >= 1 with sum P. */
static double brute(const double *w, int E, int left, int e, int32_t *c) {
    if (e == E - 1) {
        c[e] = left;
        double m = 0;
        for (int i = 0; i < E; i++) m = fmax(m, w[i] / c[i]);
        return m;
    }
    double best = INFINITY;
    for (int k = 1; k <= left - (E - 1 - e); k++) {
        c[e] = k;
        best = fmin(best, brute(w, E, left - k, e + 1, c));
    }
    return best;
}

static void bound_vs_brute_force(void **state) {
    (void)state;
    tu_rng r = {tu_seed(99)};
    epx_error err = {0};
    for (int iter = 0; iter < 300; iter++) {
        int E = 1 + (int)tu_below(&r, 5), P = E + (int)tu_below(&r, 6);
        double w[8];
        for (int e = 0; e < E; e++) w[e] = tu_below(&r, 4) == 0 ? 0.0 : tu_uniform(&r) * 100;
        int32_t c[8];
        double want = brute(w, E, P, 0, c), opt = -1;
        assert_int_equal(epx_bound_max_load(w, E, P, 1, NULL, &opt, NULL, &err), EPX_OK);
        if (fabs(opt - want) > 1e-12 * (1 + want))
            fprintf(stderr, "E=%d P=%d: greedy %.17g, brute force %.17g\n", E, P, opt, want);
        NEAR(opt, want);
    }
}

/* No placement beats the bound; balancedness stays in (0, 1]; GPU loads
 * conserve the total. */
static void bound_holds_on_random_placements(void **state) {
    (void)state;
    tu_rng r = {tu_seed(2024)};
    for (int iter = 0; iter < 200; iter++) {
        int32_t G = 1 + (int32_t)tu_below(&r, 6), E = 1 + (int32_t)tu_below(&r, 20);
        int32_t spg = (E + G - 1) / G + (int32_t)tu_below(&r, 3), P = spg * G;
        int32_t L = 1 + (int32_t)tu_below(&r, 3);
        int32_t *map = malloc(sizeof(int32_t) * (size_t)(L * P));
        double *w = malloc(sizeof(double) * (size_t)(L * E));
        for (int l = 0; l < L; l++) {
            for (int p = 0; p < P; p++)
                map[l * P + p] = p < E ? p : (int32_t)tu_below(&r, (uint32_t)E);
            for (int p = P - 1; p > 0; p--) {
                int q = (int)tu_below(&r, (uint32_t)p + 1);
                int32_t t = map[l * P + p];
                map[l * P + p] = map[l * P + q];
                map[l * P + q] = t;
            }
            for (int e = 0; e < E; e++) w[l * E + e] = tu_below(&r, 3) ? tu_uniform(&r) * 50 : 0;
        }
        epx_shape s = {L, E, P, G, 1};
        epx_layout *lay = NULL;
        epx_error err = {0};
        assert_int_equal(epx_layout_create_from_map(&s, map, &lay, &err), EPX_OK);
        epx_layer_balance *lb = malloc(sizeof *lb * (size_t)L);
        double *g = malloc(sizeof(double) * (size_t)(L * G));
        epx_balance b;
        assert_int_equal(epx_balance_compute(lay, w, NULL, &b, lb, &err), EPX_OK);
        assert_int_equal(epx_gpu_loads(lay, w, NULL, g, &err), EPX_OK);
        for (int l = 0; l < L; l++) {
            double sum = 0;
            for (int k = 0; k < G; k++) sum += g[l * G + k];
            NEAR(sum, lb[l].total);
            assert_true(lb[l].max_gpu_load >= lb[l].bound_max_load * (1 - 1e-12));
            assert_true(lb[l].balancedness > 0 && lb[l].balancedness <= 1 + 1e-12);
            assert_true(lb[l].bound >= lb[l].balancedness - 1e-12);
            double bound = 0;
            assert_int_equal(epx_bound_max_load(w + l * E, E, P, G, &bound, NULL, NULL, &err),
                             EPX_OK);
            NEAR(bound, lb[l].bound_max_load);
        }
        assert_true(b.gap >= 0);
        epx_layout_destroy(lay);
        free(lb);
        free(g);
        free(map);
        free(w);
    }
}

static void errors(void **state) {
    (void)state;
    epx_layout *lay = hand_layout();
    epx_error err = {0};
    epx_balance b;
    double bad[8] = {4, 2, 3, 1, 0, 0, NAN, 0};
    assert_int_equal(epx_balance_compute(lay, bad, NULL, &b, NULL, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "layer 1, expert 2");
    assert_int_equal(epx_balance_compute(lay, NULL, NULL, &b, NULL, &err), EPX_ERR_INVALID_ARG);
    assert_int_equal(epx_balance_compute(NULL, LOAD, NULL, &b, NULL, &err), EPX_ERR_INVALID_ARG);
    assert_int_equal(epx_gpu_loads(lay, LOAD, NULL, NULL, &err), EPX_ERR_INVALID_ARG);
    epx_layout_destroy(lay);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hand_even_split),
        cmocka_unit_test(hand_replica_weights),
        cmocka_unit_test(bound_hand),
        cmocka_unit_test(bound_vs_brute_force),
        cmocka_unit_test(bound_holds_on_random_placements),
        cmocka_unit_test(errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
