/*
 * test_layout.c - the layout handle: constructors, derived maps, views,
 * update in place, and every validation error with its message.
 */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static epx_shape shape(int32_t L, int32_t E, int32_t P, int32_t G, int32_t N) {
    epx_shape s = {L, E, P, G, N};
    return s;
}

static void trivial_matches_sglang(void **state) {
    (void)state;
    epx_shape s = shape(3, 10, 12, 4, 2);
    epx_layout *lay = NULL;
    epx_error err = {0};
    assert_int_equal(epx_layout_create_trivial(&s, &lay, &err), EPX_OK);
    const int32_t *m = epx_layout_physical_to_logical(lay);
    for (int l = 0; l < 3; l++)
        for (int p = 0; p < 12; p++) assert_int_equal(m[l * 12 + p], p % 10);
    int32_t W = 0;
    const int32_t *l2p = epx_layout_logical_to_all_physical(lay, &W);
    assert_int_equal(W, 3);
    /* expert 1: slots 1 and 11; expert 5: slot 5 only */
    assert_int_equal(l2p[1 * W + 0], 1);
    assert_int_equal(l2p[1 * W + 1], 11);
    assert_int_equal(l2p[1 * W + 2], -1);
    assert_int_equal(l2p[5 * W + 0], 5);
    assert_int_equal(l2p[5 * W + 1], -1);
    const int32_t *nv = epx_layout_num_valid(lay);
    assert_int_equal(nv[0], 2);
    assert_int_equal(nv[1], 2);
    assert_int_equal(nv[2], 1);
    assert_int_equal(epx_layout_max_replicas(lay), 2);
    /* views: GPU 2 of layer 1 holds slots 6..8, node 1 holds slots 6..11 */
    const int32_t *g = epx_layout_gpu_slots(lay, 1, 2);
    assert_int_equal(g[0], 6);
    assert_int_equal(g[2], 8);
    assert_int_equal(epx_layout_node_slots(lay, 1, 1)[5], 1);
    assert_null(epx_layout_gpu_slots(lay, 3, 0));
    assert_null(epx_layout_gpu_slots(lay, 0, 4));
    assert_int_equal(epx_layout_replicas_on_gpu(lay, 0, 3, 1), 1);
    assert_int_equal(epx_layout_replicas_on_gpu(lay, 0, 3, 2), 0);
    epx_layout_destroy(lay);
}

/* Random maps: the derived maps agree with a direct recomputation. */
static void derived_maps_random(void **state) {
    (void)state;
    tu_rng r = {tu_seed(1234)};
    for (int iter = 0; iter < 200; iter++) {
        int32_t G = 1 + (int32_t)tu_below(&r, 8), E = 1 + (int32_t)tu_below(&r, 40);
        int32_t spg = (E + G - 1) / G + (int32_t)tu_below(&r, 4);
        int32_t P = spg * G, L = 1 + (int32_t)tu_below(&r, 4);
        int32_t *map = malloc(sizeof(int32_t) * (size_t)(L * P));
        for (int l = 0; l < L; l++) {
            for (int p = 0; p < P; p++)
                map[l * P + p] = p < E ? p : (int32_t)tu_below(&r, (uint32_t)E);
            for (int p = P - 1; p > 0; p--) { /* shuffle */
                int q = (int)tu_below(&r, (uint32_t)p + 1);
                int32_t t = map[l * P + p];
                map[l * P + p] = map[l * P + q];
                map[l * P + q] = t;
            }
        }
        epx_shape s = shape(L, E, P, G, 1);
        epx_layout *lay = NULL;
        epx_error err = {0};
        assert_int_equal(epx_layout_create_from_map(&s, map, &lay, &err), EPX_OK);
        int32_t W;
        const int32_t *l2p = epx_layout_logical_to_all_physical(lay, &W);
        const int32_t *nv = epx_layout_num_valid(lay);
        assert_int_equal(W, P - E + 1);
        for (int l = 0; l < L; l++)
            for (int e = 0; e < E; e++) {
                int k = 0;
                for (int p = 0; p < P; p++)
                    if (map[l * P + p] == e) assert_int_equal(l2p[(l * E + e) * W + k++], p);
                assert_int_equal(nv[l * E + e], k);
                for (; k < W; k++) assert_int_equal(l2p[(l * E + e) * W + k], -1);
            }
        epx_layout_destroy(lay);
        free(map);
    }
}

static void update_in_place(void **state) {
    (void)state;
    epx_shape s = shape(2, 4, 4, 2, 1);
    int32_t m1[8] = {0, 1, 2, 3, 0, 1, 2, 3}, m2[8] = {3, 2, 1, 0, 3, 2, 1, 0};
    epx_layout *a = NULL, *b = NULL, *c = NULL;
    epx_error err = {0};
    assert_int_equal(epx_layout_create_from_map(&s, m1, &a, &err), EPX_OK);
    assert_int_equal(epx_layout_create_from_map(&s, m2, &b, &err), EPX_OK);
    const int32_t *view = epx_layout_physical_to_logical(a);
    uint8_t only1[2] = {0, 1};
    assert_int_equal(epx_layout_update(a, b, only1, &err), EPX_OK);
    assert_ptr_equal(view, epx_layout_physical_to_logical(a));
    assert_int_equal(view[0], 0);
    assert_int_equal(view[4], 3);
    int32_t W;
    assert_int_equal(epx_layout_logical_to_all_physical(a, &W)[(4 + 0) * W], 3);
    epx_shape s2 = shape(2, 4, 8, 2, 1);
    assert_int_equal(epx_layout_create_trivial(&s2, &c, &err), EPX_OK);
    assert_int_equal(epx_layout_update(a, c, NULL, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "P=4", "P=8", "shapes must agree");
    epx_layout_destroy(a);
    epx_layout_destroy(b);
    epx_layout_destroy(c);
}

static void shape_errors_explain(void **state) {
    (void)state;
    epx_error err = {0};
    epx_shape s = shape(61, 384, 390, 8, 1);
    assert_int_equal(epx_shape_check(&s, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "390", "8", "384", "392");
    /* no GPU count on 2 nodes divides 7 slots: the slots are the fix ("use
     * 1 GPUs" was offered, which 2 nodes cannot take) */
    s = shape(1, 7, 7, 4, 2);
    assert_int_equal(epx_shape_check(&s, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "no other GPU count on 2 node(s) divides it", "use 8 slots for 4 GPUs");
    s = shape(61, 384, 416, 6, 4);
    assert_int_equal(epx_shape_check(&s, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "num_gpus (6)", "num_nodes (4)");
    s = shape(0, 384, 416, 8, 1);
    assert_int_equal(epx_shape_check(&s, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "num_layers (0)");
    s = shape(61, 0, 416, 8, 1);
    assert_int_equal(epx_shape_check(&s, &err), EPX_ERR_SHAPE);
    s = shape(61, 384, 416, 0, 1);
    assert_int_equal(epx_shape_check(&s, &err), EPX_ERR_SHAPE);
    s = shape(61, 384, 380, 4, 1);
    assert_int_equal(epx_shape_check(&s, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "below num_logical_experts");
    s = shape(65536, 1 << 20, 2 << 20, 8, 1);
    assert_int_equal(epx_shape_check(&s, &err), EPX_ERR_OVERFLOW);
}

static void map_errors_explain(void **state) {
    (void)state;
    epx_error err = {0};
    epx_layout *lay = NULL;
    epx_shape s = shape(2, 4, 4, 2, 1);
    int32_t bad_id[8] = {0, 1, 2, 3, 0, 1, 400, 3};
    assert_int_equal(epx_layout_create_from_map(&s, bad_id, &lay, &err), EPX_ERR_INVALID_MAP);
    TU_MSG_HAS(err.msg, "layer 1", "slot 2", "400", "[0, 4)", "a model of more than 4 experts");
    /* no option named: the callers' (epx plan, epx stats) have no --experts */
    assert_null(strstr(err.msg, "--experts"));
    assert_null(lay);
    int32_t missing[8] = {0, 1, 2, 3, 0, 1, 1, 3};
    assert_int_equal(epx_layout_create_from_map(&s, missing, &lay, &err), EPX_ERR_INVALID_MAP);
    TU_MSG_HAS(err.msg, "layer 1", "logical expert 2", "no replica");
    int32_t neg[8] = {0, 1, 2, 3, -1, 1, 2, 3};
    assert_int_equal(epx_layout_create_from_map(&s, neg, &lay, &err), EPX_ERR_INVALID_MAP);
    TU_MSG_HAS(err.msg, "-1");
}

static void status_names(void **state) {
    (void)state;
    assert_string_equal(epx_status_str(EPX_OK), "EPX_OK");
    assert_string_equal(epx_status_str(EPX_ERR_INVALID_MAP), "EPX_ERR_INVALID_MAP");
    assert_string_equal(epx_status_str((epx_status)999), "EPX_ERR_UNKNOWN");
    for (int i = 0; i < EPX_STATUS_COUNT_; i++)
        assert_string_not_equal(epx_status_str((epx_status)i), "EPX_ERR_UNKNOWN");
    epx_layout_destroy(NULL);
}

/* Getters without an error channel answer a NULL handle with 0 or NULL, as
 * their siblings do (epx_layout_shape, epx_plan_layout), and the calls with
 * one refuse NULL outputs by name instead of storing through them. */
static void null_handles(void **state) {
    (void)state;
    assert_int_equal(epx_layout_max_replicas(NULL), 0);
    assert_null(epx_layout_gpu_slots(NULL, 0, 0));
    assert_null(epx_layout_node_slots(NULL, 0, 0));
    assert_int_equal(epx_layout_replicas_on_gpu(NULL, 0, 0, 0), -1);
    assert_true(epx_plan_seconds(NULL) == 0.0);
    assert_int_equal(epx_plan_algorithm(NULL), EPX_ALGO_EPX);
    assert_null(epx_migration_layout(NULL));
    assert_null(epx_migration_kinds(NULL));
    assert_null(epx_migration_sources(NULL));
    assert_int_equal(epx_shape_slots_per_gpu(NULL), 0);
    epx_shape no_gpus = {1, 4, 4, 0, 1};
    assert_int_equal(epx_shape_slots_per_gpu(&no_gpus), 0);
    epx_error err = {0};
    assert_int_equal(epx_counts_create(1, 1, 1, NULL, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "out is NULL");
    assert_int_equal(epx_file_temp_path("/tmp/x.json", NULL, 100, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "buf is NULL");
    epx_counts *c = NULL;
    assert_int_equal(epx_counts_create(3, 2, 2, &c, &err), EPX_OK);
    double out[4];
    assert_int_equal(epx_counts_sum_windows(c, 1, INT32_MAX, out, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "[1, 2147483648)", "outside the 3 windows");
    epx_counts_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(trivial_matches_sglang), cmocka_unit_test(derived_maps_random),
        cmocka_unit_test(update_in_place),        cmocka_unit_test(shape_errors_explain),
        cmocka_unit_test(map_errors_explain),     cmocka_unit_test(status_names),
        cmocka_unit_test(null_handles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
