/*
 * test_untouched_on_error.c - epx.h's contract that a failed call leaves its
 * out-parameters as they were, held by the functions a sweep of the C API
 * (2026-12-05) found writing part of their output before the input error
 * they then reported: every input is checked before the first write. Each
 * case fills its output with a marker, passes one bad entry late in the
 * input (so a writer that checks as it goes has written the entries before
 * it) and wants the error and every marker back.
 */
#include <math.h>
#include <string.h>

#include "testutil.h"

#define MARK_I 0x5a5a5a5a

static void dispatch_outputs(void **state) {
    (void)state;
    epx_error err = {0};
    /* count_ids and map_ids: the bad id is the last */
    const int32_t ids[4] = {0, 1, 2, 9};
    int64_t counts[4] = {MARK_I, MARK_I, MARK_I, MARK_I};
    assert_int_equal(epx_dispatch_count_ids(ids, 2, 2, 4, counts, &err), EPX_ERR_INVALID_ARG);
    for (int i = 0; i < 4; i++) assert_int_equal(counts[i], MARK_I);
    const int32_t table[4] = {4, 5, 6, 7};
    epx_dispatch_spec s = {EPX_DISPATCH_STATIC, 4, 8, 1, table, NULL, NULL, NULL, 0, 0, 0};
    int32_t phys[4] = {MARK_I, MARK_I, MARK_I, MARK_I};
    assert_int_equal(epx_dispatch_map_ids(&s, ids, 2, 2, phys, &err), EPX_ERR_INVALID_ARG);
    for (int i = 0; i < 4; i++) assert_int_equal(phys[i], MARK_I);
    /* thresholds: a bad slot in layer 1 of 2 */
    const int32_t rep[2 * 2 * 2] = {0, 2, 1, 3, 0, 2, 1, 9};
    const int32_t nv[4] = {2, 2, 2, 2};
    const double w[2 * 4] = {1, 1, 1, 1, 1, 1, 1, 1};
    uint32_t thr[8];
    memset(thr, 0x5a, sizeof thr);
    assert_int_equal(epx_dispatch_thresholds(rep, nv, 2, 2, 2, w, 4, thr, &err),
                     EPX_ERR_INVALID_MAP);
    for (int i = 0; i < 8; i++) assert_int_equal(thr[i], (uint32_t)MARK_I);
    /* table_gpu_load: the last entry of the last rank is out of range */
    epx_shape sh = {1, 4, 8, 2, 1};
    int32_t tab[2 * 4] = {0, 1, 2, 3, 4, 5, 6, 8};
    const double load[4] = {1, 2, 3, 4};
    double gl[2] = {-7.0, -7.0};
    assert_int_equal(epx_dispatch_table_gpu_load(&sh, tab, load, gl, &err), EPX_ERR_INVALID_MAP);
    assert_true(gl[0] == -7.0 && gl[1] == -7.0);
}

static void metrics_outputs(void **state) {
    (void)state;
    epx_error err = {0};
    epx_layout *lay = NULL;
    const int32_t map[2 * 4] = {0, 1, 2, 3, 0, 1, 2, 3};
    epx_shape sh = {2, 4, 4, 2, 1};
    assert_int_equal(epx_layout_create_from_map(&sh, map, &lay, &err), EPX_OK);
    const double load[2 * 4] = {1, 2, 3, 4, 1, 2, 3, NAN}; /* NaN in layer 1 */
    double gl[4] = {-7, -7, -7, -7};
    assert_int_equal(epx_gpu_loads(lay, load, NULL, gl, &err), EPX_ERR_INVALID_ARG);
    for (int i = 0; i < 4; i++) assert_true(gl[i] == -7.0);
    epx_balance b;
    epx_layer_balance layers[2];
    memset(&b, 0x5a, sizeof b);
    memset(layers, 0x5a, sizeof layers);
    epx_layer_balance want;
    memset(&want, 0x5a, sizeof want);
    assert_int_equal(epx_balance_compute(lay, load, NULL, &b, layers, &err), EPX_ERR_INVALID_ARG);
    assert_memory_equal(&layers[0], &want, sizeof want);
    epx_layout_destroy(lay);
}

static void tensor_and_moe_outputs(void **state) {
    (void)state;
    epx_error err = {0};
    /* a float tensor read as int64: the fraction is the third element */
    const double vals[4] = {1, 2, 3.5, 4};
    epx_pt_tensor t = {EPX_PT_DTYPE_FLOAT64, 1, {4}, {1}, 0, 4, vals};
    int64_t out[4] = {-9, -9, -9, -9};
    assert_int_equal(epx_pt_tensor_to_i64(&t, out, 4, &err), EPX_ERR_PARSE);
    for (int i = 0; i < 4; i++) assert_int_equal(out[i], -9);
    /* moe forward with shared experts asked for but no shared weights */
    epx_moe_config c = EPX_MOE_CONFIG_INIT;
    c.hidden = 1;
    c.intermediate = 1;
    c.num_experts = 2;
    c.top_k = 1;
    c.shared_intermediate = 1;
    const float one[2] = {1, 1};
    epx_moe_weights wts = {one, NULL, one, one, one, NULL, NULL, NULL};
    const float x[1] = {1};
    const int32_t id[1] = {0};
    const float wk[1] = {1};
    float y[1] = {-7};
    assert_int_equal(epx_moe_forward(&c, &wts, x, 1, id, wk, 0, 1, 1, y, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "shared_gate");
    assert_true(y[0] == -7.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dispatch_outputs),
        cmocka_unit_test(metrics_outputs),
        cmocka_unit_test(tensor_and_moe_outputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
