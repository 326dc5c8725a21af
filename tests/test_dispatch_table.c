/*
 * test_dispatch_table.c - epx's own static table (every entry a replica of
 * its expert; same GPU, then same node, always taken when available; load
 * steering on a hand-made case; weights and loads used), the implied GPU
 * loads, the table and replica-map files, one rank's row alone, and the
 * error messages of the table entry points.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* Redundant slots go to the first 5 experts. */
static epx_layout *random_layout(tu_rng *r, int32_t L, int32_t E, int32_t P, int32_t G, int32_t N) {
    return tu_random_layout(r, L, E, P, G, N, 5);
}

/* Properties both algorithms share, and epx's node rule. */
static void rules_hold(void **state) {
    (void)state;
    tu_rng r = {tu_seed(555)};
    for (int iter = 0; iter < 60; iter++) {
        int32_t N = 1 + (int32_t)tu_below(&r, 3), G = N * (1 + (int32_t)tu_below(&r, 4));
        int32_t E = 1 + (int32_t)tu_below(&r, 30), per = (E + G - 1) / G + (int32_t)tu_below(&r, 3);
        int32_t P = per * G, L = 1 + (int32_t)tu_below(&r, 3), gpn = G / N;
        epx_layout *lay = random_layout(&r, L, E, P, G, N);
        const int32_t *p2l = epx_layout_physical_to_logical(lay);
        double *load = malloc(sizeof(double) * (size_t)(L * E));
        for (int32_t i = 0; i < L * E; i++) load[i] = tu_uniform(&r) * 100.0;
        size_t n = (size_t)G * (size_t)L * (size_t)E;
        int32_t *t = malloc(n * 4), *t2 = malloc(n * 4);
        epx_error err = {0};
        for (int algo = 0; algo < 2; algo++) {
            epx_table_opts o = EPX_TABLE_OPTS_INIT;
            o.algorithm = algo ? EPX_TABLE_EPX : EPX_TABLE_SGLANG;
            if (algo) o.expected_load = load;
            assert_int_equal(epx_dispatch_table_from_layout(lay, &o, t, &err), EPX_OK);
            for (int32_t g = 0; g < G; g++)
                for (int32_t l = 0; l < L; l++)
                    for (int32_t e = 0; e < E; e++) {
                        int32_t p = t[((size_t)g * (size_t)L + (size_t)l) * (size_t)E + (size_t)e];
                        assert_true(p >= 0 && p < P);
                        assert_int_equal(p2l[l * P + p], e);
                        bool here = false, node = false;
                        for (int32_t q = 0; q < P; q++)
                            if (p2l[l * P + q] == e) {
                                here |= q / per == g;
                                node |= q / per / gpn == g / gpn;
                            }
                        if (here) assert_int_equal(p / per, g);
                        /* epx leaves the node only when every replica there
                         * already holds its share of ranks (G / n, within half) */
                        if (algo && node && p / per / gpn != g / gpn) {
                            int32_t nrep = 0;
                            for (int32_t q = 0; q < P; q++) nrep += p2l[l * P + q] == e;
                            for (int32_t q = 0; q < P; q++) {
                                if (p2l[l * P + q] != e || q / per / gpn != g / gpn) continue;
                                int32_t chose = 0;
                                for (int32_t r2 = 0; r2 < G; r2++)
                                    chose += t[((size_t)r2 * (size_t)L + (size_t)l) * (size_t)E +
                                               (size_t)e] == q;
                                assert_true(chose + 1 - (double)G / nrep > 0.5);
                            }
                        }
                    }
            /* deterministic */
            assert_int_equal(epx_dispatch_table_from_layout(lay, &o, t2, &err), EPX_OK);
            assert_memory_equal(t, t2, n * 4);
        }
        free(t);
        free(t2);
        free(load);
        epx_layout_destroy(lay);
    }
}

/* G = 4 GPUs of 2 slots. Expert 0 is on GPUs 0 and 1 (slots 0 and 2), so
 * ranks 2 and 3 share its two replicas, one each (about G / n ranks per
 * replica, as SGLang's fair choices give) -- unless the replica weights say
 * slot 0 should take it all. With three replicas weighted 1:1:2 the
 * flexible rank goes to the one with the larger share. */
static void load_steering(void **state) {
    (void)state;
    int32_t map[8] = {0, 1, 0, 2, 3, 4, 5, 6};
    epx_shape s = {1, 7, 8, 4, 1};
    epx_layout *lay = NULL;
    epx_error err = {0};
    assert_int_equal(epx_layout_create_from_map(&s, map, &lay, &err), EPX_OK);
    double load[7] = {8, 40, 10, 10, 10, 10, 10};
    int32_t t[4 * 7];
    epx_table_opts o = EPX_TABLE_OPTS_INIT;
    o.algorithm = EPX_TABLE_EPX;
    o.expected_load = load;
    assert_int_equal(epx_dispatch_table_from_layout(lay, &o, t, &err), EPX_OK);
    assert_int_equal(t[0 * 7 + 0], 0); /* rank 0 holds slot 0 */
    assert_int_equal(t[1 * 7 + 0], 2); /* rank 1 holds slot 2 */
    assert_int_not_equal(t[2 * 7 + 0], t[3 * 7 + 0]);
    /* weights: slot 0 should take all of expert 0 (GPU 1 none) */
    double w[8] = {1, 1, 0, 1, 1, 1, 1, 1};
    o.replica_weights = w;
    assert_int_equal(epx_dispatch_table_from_layout(lay, &o, t, &err), EPX_OK);
    assert_int_equal(t[2 * 7 + 0], 0);
    assert_int_equal(t[3 * 7 + 0], 0);
    {
        int32_t m3[8] = {0, 1, 0, 2, 0, 3, 4, 5}; /* expert 0 on GPUs 0, 1, 2 */
        epx_shape s3 = {1, 6, 8, 4, 1};
        epx_layout *l3 = NULL;
        assert_int_equal(epx_layout_create_from_map(&s3, m3, &l3, &err), EPX_OK);
        double w3[8] = {1, 1, 1, 1, 2, 1, 1, 1};
        epx_table_opts o3 = EPX_TABLE_OPTS_INIT;
        o3.algorithm = EPX_TABLE_EPX;
        o3.replica_weights = w3;
        int32_t t3[4 * 6];
        assert_int_equal(epx_dispatch_table_from_layout(l3, &o3, t3, &err), EPX_OK);
        assert_int_equal(t3[3 * 6 + 0], 4); /* rank 3 -> the double-weight slot */
        epx_layout_destroy(l3);
    }
    /* implied loads: every rank's 1/4 of each expert lands somewhere */
    double gl[4], sum = 0.0;
    assert_int_equal(epx_dispatch_table_gpu_load(&s, t, load, gl, &err), EPX_OK);
    for (int g = 0; g < 4; g++) sum += gl[g];
    assert_true(sum > 97.9999 && sum < 98.0001);
    assert_true(gl[0] > 40.0 + 8.0 * 0.75 - 1e-9); /* 3 of 4 ranks' expert 0 + expert 1 */
    epx_layout_destroy(lay);
}

static void files_round_trip(void **state) {
    (void)state;
    int32_t t[2 * 2 * 3] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    char *path = tu_tmp_path(".json");
    epx_error err = {0};
    assert_int_equal(epx_dispatch_table_write_json(path, t, 2, 2, 3, &err), EPX_OK);
    char *text = tu_read_file(path, NULL);
    assert_non_null(text);
    assert_non_null(strstr(text, "{\"logical_to_rank_dispatch_physical_map\": [[\n  [0,1,2],\n  "
                                 "[3,4,5]],\n [\n  [6,7,8],\n  [9,10,11]]]}"));
    free(text);
    assert_int_equal(epx_dispatch_table_write_json(path, t, 0, 2, 3, &err), EPX_OK);
    text = tu_read_file(path, NULL);
    assert_non_null(
        strstr(text, "{\"logical_to_rank_dispatch_physical_map\": [\n  [0,1,2],\n  [3,4,5]]}"));
    free(text);
    assert_int_equal(epx_dispatch_table_write_json(path, t, -1, 2, 3, &err), EPX_ERR_INVALID_ARG);
    remove(path);

    int32_t *m = NULL, L, E, W;
    assert_int_equal(epx_replica_map_read("{\"logical_to_physical_map\": [[[0, -1], [1, 2]]]}", &m,
                                          &L, &E, &W, &err),
                     EPX_OK);
    assert_int_equal(L, 1);
    assert_int_equal(E, 2);
    assert_int_equal(W, 2);
    assert_int_equal(m[1], -1);
    assert_int_equal(m[3], 2);
    epx_free(m);
    assert_int_equal(
        epx_replica_map_read("{\"physical_to_logical_map\": [[0, 1]]}", &m, &L, &E, &W, &err),
        EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "logical_to_physical_map", "--order ascending");
    assert_int_equal(
        epx_replica_map_read("{\"logical_to_physical_map\": [[[0, -2]]]}", &m, &L, &E, &W, &err),
        EPX_ERR_PARSE);
    assert_int_equal(epx_replica_map_read("/nonexistent/x.json", &m, &L, &E, &W, &err), EPX_ERR_IO);
    free(path);
}

/* rank_only: rank r's row equals the whole table's row r, for SGLang's
 * table cut per rank (0.5.23 from a layout: one pass instead of G), uncut
 * (0.5.2, replica-rank lists) and epx's; the rows of other ranks are not
 * promised, so only row r is compared. */
static void one_rank_rows(void **state) {
    (void)state;
    tu_rng r = {tu_seed(808)};
    for (int iter = 0; iter < 40; iter++) {
        int32_t N = 1 + (int32_t)tu_below(&r, 3), G = N * (1 + (int32_t)tu_below(&r, 5));
        int32_t E = 1 + (int32_t)tu_below(&r, 24), per = (E + G - 1) / G + (int32_t)tu_below(&r, 3);
        int32_t P = per * G, L = 1 + (int32_t)tu_below(&r, 3);
        epx_layout *lay = random_layout(&r, L, E, P, G, N);
        size_t LE = (size_t)L * (size_t)E, n = (size_t)G * LE;
        int32_t *all = malloc(n * 4), *one = malloc(n * 4);
        epx_error err = {0};
        for (int kind = 0; kind < 3; kind++) {
            epx_table_opts o = EPX_TABLE_OPTS_INIT;
            o.algorithm = kind == 2 ? EPX_TABLE_EPX : EPX_TABLE_SGLANG;
            o.sglang_version = kind == 1 ? "0.5.2" : "0.5.23";
            assert_int_equal(epx_dispatch_table_from_layout(lay, &o, all, &err), EPX_OK);
            for (int32_t g = 0; g < G; g++) {
                memset(one, 0xff, n * 4);
                o.rank_only = 1;
                o.rank = g;
                assert_int_equal(epx_dispatch_table_from_layout(lay, &o, one, &err), EPX_OK);
                if (memcmp(all + (size_t)g * LE, one + (size_t)g * LE, LE * 4) != 0)
                    fail_msg("rank %d of %d, kind %d: its row alone differs from the whole "
                             "table's (seed %llu, iteration %d)",
                             g, G, kind, (unsigned long long)tu_seed(808), iter);
                o.rank_only = 0;
            }
        }
        free(all);
        free(one);
        epx_layout_destroy(lay);
    }
}

static void table_errors(void **state) {
    (void)state;
    epx_shape s = {1, 2, 4, 2, 1};
    int32_t rep[2 * 2] = {0, 1, -1, -1}, out[2 * 2];
    epx_error err = {0};
    assert_int_equal(epx_dispatch_table_compute(&s, rep, 2, NULL, out, &err), EPX_ERR_INVALID_MAP);
    TU_MSG_HAS(err.msg, "logical expert 1 of layer 0 has no replica");
    rep[2] = 4;
    assert_int_equal(epx_dispatch_table_compute(&s, rep, 2, NULL, out, &err), EPX_ERR_INVALID_MAP);
    TU_MSG_HAS(err.msg, "slot 4", "[0, 4)");
    rep[2] = 3;
    epx_table_opts o = EPX_TABLE_OPTS_INIT;
    double load[2] = {1, 2};
    o.expected_load = load;
    assert_int_equal(epx_dispatch_table_compute(&s, rep, 2, &o, out, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "EPX_TABLE_EPX");
    o.algorithm = EPX_TABLE_EPX;
    load[1] = -1;
    assert_int_equal(epx_dispatch_table_compute(&s, rep, 2, &o, out, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "expected_load[1] is -1");
    o.version = 7;
    assert_int_equal(epx_dispatch_table_compute(&s, rep, 2, &o, out, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "EPX_TABLE_OPTS_INIT");
    o.version = EPX_TABLE_OPTS_VERSION;
    o.algorithm = EPX_TABLE_SGLANG;
    o.expected_load = NULL;
    o.rank_only = 1;
    o.rank = 2; /* G = 2 */
    assert_int_equal(epx_dispatch_table_compute(&s, rep, 2, &o, out, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "rank 2 is outside [0, 2)", "rank_only = 0");
    o.rank = -1;
    assert_int_equal(epx_dispatch_table_compute(&s, rep, 2, &o, out, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "rank -1 is outside");
    epx_shape bad = {1, 2, 5, 2, 1};
    assert_int_equal(epx_dispatch_table_compute(&bad, rep, 2, NULL, out, &err), EPX_ERR_SHAPE);
    assert_int_equal(epx_dispatch_table_compute(&s, rep, 0, NULL, out, &err), EPX_ERR_SHAPE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rules_hold),       cmocka_unit_test(load_steering),
        cmocka_unit_test(files_round_trip), cmocka_unit_test(one_rank_rows),
        cmocka_unit_test(table_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
