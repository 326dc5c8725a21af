/*
 * test_plan_api.c - epx_plan_compute: option checks (every rejected option
 * names itself and the fix), SGLang's auto rule, the DeepSeek modes' window
 * sum and replica weights, the plan accessors, the default algorithm, and
 * epx_layout_init planning from logical_count.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static epx_counts *random_counts(tu_rng *r, int32_t S, int32_t L, int32_t E) {
    epx_counts *c = NULL;
    epx_error err = {0};
    assert_int_equal(epx_counts_create(S, L, E, &c, &err), EPX_OK);
    for (size_t i = 0; i < (size_t)S * (size_t)L * (size_t)E; i++)
        c->data[i] = (double)tu_below(r, 1000);
    return c;
}

static epx_status plan(const epx_counts *c, epx_shape s, const epx_plan_opts *o, epx_plan **out,
                       epx_error *err) {
    return epx_plan_compute(c, &s, o, out, err);
}

static void algorithm_names(void **state) {
    (void)state;
    epx_error err = {0};
    const epx_algorithm all[] = {EPX_ALGO_EPX,
                                 EPX_ALGO_DEEPSEEK,
                                 EPX_ALGO_DEEPSEEK_HIERARCHICAL,
                                 EPX_ALGO_AUTO,
                                 EPX_ALGO_DEEPSEEK_VEC,
                                 EPX_ALGO_DEEPSEEK_VEC_HIERARCHICAL,
                                 EPX_ALGO_ELASTICITY_AWARE,
                                 EPX_ALGO_ELASTICITY_AWARE_HIERARCHICAL};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        epx_algorithm a;
        assert_int_equal(epx_algorithm_parse(epx_algorithm_name(all[i]), &a, &err), EPX_OK);
        assert_int_equal(a, all[i]);
    }
    epx_algorithm a;
    assert_int_equal(epx_algorithm_parse("elasticity_aware_hierarchical", &a, &err), EPX_OK);
    assert_int_equal(a, EPX_ALGO_ELASTICITY_AWARE_HIERARCHICAL);
    assert_int_equal(epx_algorithm_parse("deepseek_hierarchical", &a, &err), EPX_OK);
    assert_int_equal(a, EPX_ALGO_DEEPSEEK_HIERARCHICAL);
    assert_int_equal(epx_algorithm_parse("greedy", &a, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "greedy", "deepseek-hierarchical", "auto");
    assert_string_equal(epx_algorithm_name((epx_algorithm)42), "unknown");
}

static void option_errors(void **state) {
    (void)state;
    tu_rng r = {tu_seed(5)};
    epx_counts *c = random_counts(&r, 2, 3, 16);
    epx_shape s = {3, 16, 24, 4, 2};
    epx_plan *p = NULL;
    epx_error err = {0};
    epx_plan_opts o = EPX_PLAN_OPTS_INIT;

    o.version = 99;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "99", "EPX_PLAN_OPTS_INIT");
    o = (epx_plan_opts)EPX_PLAN_OPTS_INIT;
    /* an infinite z made every estimate NaN, and the counts were blamed */
    o.estimate = EPX_ESTIMATE_MEAN_STD;
    o.estimate_param = INFINITY;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "estimate_param is inf", "finite");
    o = (epx_plan_opts)EPX_PLAN_OPTS_INIT;
    o.algorithm = (epx_algorithm)8;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "algorithm 8");
    o = (epx_plan_opts)EPX_PLAN_OPTS_INIT;
    o.node_local = (epx_node_local)9;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "node_local 9");
    o = (epx_plan_opts)EPX_PLAN_OPTS_INIT;
    o.estimate = (epx_estimate)-1;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "estimate -1");
    o = (epx_plan_opts)EPX_PLAN_OPTS_INIT;
    o.num_groups = -2;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "num_groups (-2)");
    o = (epx_plan_opts)EPX_PLAN_OPTS_INIT;
    o.cross_node_budget = 1.5;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "1.5", "[0, 1]");

    /* groups that do not divide the experts: any algorithm */
    o = (epx_plan_opts)EPX_PLAN_OPTS_INIT;
    o.num_groups = 3;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "16 experts", "3 equal groups");
    /* hierarchical: 2 groups over 4 nodes */
    epx_shape s4 = {3, 16, 24, 4, 4};
    o.algorithm = EPX_ALGO_DEEPSEEK_HIERARCHICAL;
    o.num_groups = 2;
    assert_int_equal(plan(c, s4, &o, &p, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "2 groups", "4 nodes", "--algorithm deepseek");
    /* hierarchical on 2 nodes without groups */
    o.num_groups = 0;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "no groups", "n_group");
    /* options DeepSeek does not take */
    o = (epx_plan_opts)EPX_PLAN_OPTS_INIT;
    o.algorithm = EPX_ALGO_DEEPSEEK;
    o.node_local = EPX_NODE_LOCAL_RELAXED;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "relaxed", "deepseek", "off");
    o.node_local = EPX_NODE_LOCAL_OFF; /* what it does anyway: accepted */
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_OK);
    epx_plan_destroy(p);
    p = NULL;
    o.node_local = EPX_NODE_LOCAL_DEFAULT;
    o.estimate = EPX_ESTIMATE_RECENCY;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "sum of the windows");
    o.estimate = EPX_ESTIMATE_DEFAULT;
    o.cross_node_budget = 0.5;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "cross_node_budget");

    /* moving costs and failed GPUs (src/plan/plan_constrained.c; tests/test_migrate_limit.c) */
    epx_layout *cur = NULL;
    assert_int_equal(epx_layout_create_trivial(&s, &cur, &err), EPX_OK);
    uint8_t failed[4] = {0, 1, 0, 0};
    o = (epx_plan_opts)EPX_PLAN_OPTS_INIT;
    o.max_moves = 10;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "max_moves (10)", "without a current layout");
    o = (epx_plan_opts)EPX_PLAN_OPTS_INIT;
    o.move_price = 0.1;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_ERR_INVALID_ARG);
    o.current = cur;
    o.move_price = -0.1;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_ERR_INVALID_ARG);
    o.move_price = 0;
    o.max_moves = 10;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_OK);
    const int32_t *cm = epx_layout_physical_to_logical(cur);
    const int32_t *pm = epx_layout_physical_to_logical(epx_plan_layout(p));
    int moved = 0;
    for (int i = 0; i < s.num_layers * s.num_physical_experts; i++) moved += cm[i] != pm[i];
    assert_true(moved <= 10);
    epx_plan_destroy(p);
    p = NULL;
    o = (epx_plan_opts)EPX_PLAN_OPTS_INIT;
    o.failed_gpus = failed;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_OK);
    const int32_t spg = s.num_physical_experts / s.num_gpus;
    for (int l = 0; l < s.num_layers; l++)
        for (int k = 0; k < spg; k++)
            assert_true(epx_plan_replica_weights(p)[l * s.num_physical_experts + spg + k] == 0.0);
    epx_plan_destroy(p);
    p = NULL;
    /* node-local strict by name keeps the nodes or is refused: GPU 1 lost
     * leaves node 0 one survivor and node 1 two (the default warns and plans
     * them as one node); losing GPUs 1 and 3 keeps one on each node */
    o.algorithm = EPX_ALGO_EPX;
    o.num_groups = 2;
    o.node_local = EPX_NODE_LOCAL_STRICT;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "node 0 keeps 1 of its 2 GPUs", "node 1 keeps 2", "relaxed or off");
    assert_null(p);
    o.node_local = EPX_NODE_LOCAL_RELAXED;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_OK);
    epx_plan_destroy(p);
    p = NULL;
    failed[3] = 1; /* 8 slots a GPU, so that two survivors hold the 16 experts */
    o.node_local = EPX_NODE_LOCAL_STRICT;
    assert_int_equal(plan(c, (epx_shape){3, 16, 32, 4, 2}, &o, &p, &err), EPX_OK);
    epx_plan_destroy(p);
    p = NULL;
    failed[3] = 0;
    epx_layout_destroy(cur);

    /* counts against the shape */
    o = (epx_plan_opts)EPX_PLAN_OPTS_INIT;
    epx_shape bad = {4, 16, 24, 4, 2};
    assert_int_equal(plan(c, bad, &o, &p, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "[3 layers][16 experts]", "4 layers");
    bad = (epx_shape){3, 12, 24, 4, 2};
    assert_int_equal(plan(c, bad, &o, &p, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "12 logical experts");
    bad = (epx_shape){3, 16, 26, 4, 2};
    assert_int_equal(plan(c, bad, &o, &p, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "26", "28");
    c->data[17] = -3.0;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "[window 0][layer 1][expert 1]", "-3");
    c->data[17] = NAN;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_ERR_INVALID_ARG);
    c->data[17] = 1e39; /* beyond float32, which DeepSeek computes in */
    o.algorithm = EPX_ALGO_DEEPSEEK;
    assert_int_equal(plan(c, s, &o, &p, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "float32");
    assert_null(p);
    assert_int_equal(epx_plan_compute(c, &s, NULL, &p, &err), EPX_ERR_INVALID_ARG);
    assert_int_equal(epx_plan_compute(NULL, &s, &o, &p, &err), EPX_ERR_INVALID_ARG);
    epx_counts_destroy(c);
}

/* SGLang's auto: hierarchical when groups divide over nodes, else global;
 * no groups (0, SGLang's None) is global. */
static void auto_rule(void **state) {
    (void)state;
    tu_rng r = {tu_seed(11)};
    epx_counts *c = random_counts(&r, 1, 2, 32);
    epx_error err = {0};
    struct {
        int32_t groups, nodes;
        epx_algorithm want;
    } cases[] = {
        {8, 4, EPX_ALGO_DEEPSEEK_HIERARCHICAL},
        {8, 1, EPX_ALGO_DEEPSEEK_HIERARCHICAL},
        {4, 8, EPX_ALGO_DEEPSEEK},
        {0, 1, EPX_ALGO_DEEPSEEK},
        {0, 2, EPX_ALGO_DEEPSEEK},
        {1, 1, EPX_ALGO_DEEPSEEK_HIERARCHICAL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        epx_shape s = {2, 32, 48, 8, cases[i].nodes};
        epx_plan_opts o = EPX_PLAN_OPTS_INIT;
        o.algorithm = EPX_ALGO_AUTO;
        o.num_groups = cases[i].groups;
        epx_plan *p = NULL;
        assert_int_equal(epx_plan_compute(c, &s, &o, &p, &err), EPX_OK);
        assert_int_equal(epx_plan_algorithm(p), cases[i].want);
        /* and it is exactly the resolved algorithm's plan */
        epx_plan_opts o2 = o;
        o2.algorithm = cases[i].want;
        epx_plan *q = NULL;
        assert_int_equal(epx_plan_compute(c, &s, &o2, &q, &err), EPX_OK);
        assert_memory_equal(epx_layout_physical_to_logical(epx_plan_layout(p)),
                            epx_layout_physical_to_logical(epx_plan_layout(q)),
                            sizeof(int32_t) * 2 * 48);
        epx_plan_destroy(p);
        epx_plan_destroy(q);
    }
    epx_counts_destroy(c);
}

/* DeepSeek modes plan for the windows' sum; replica weights are 1/replicas. */
static void deepseek_sums_windows(void **state) {
    (void)state;
    tu_rng r = {tu_seed(3)};
    const int32_t S = 4, L = 5, E = 64, P = 80, G = 8, N = 2;
    epx_counts *c = random_counts(&r, S, L, E), *sum = NULL;
    epx_error err = {0};
    assert_int_equal(epx_counts_create(1, L, E, &sum, &err), EPX_OK);
    assert_int_equal(epx_counts_sum_windows(c, 0, S, sum->data, &err), EPX_OK);
    float *w = malloc(sizeof(float) * (size_t)(L * E));
    for (int i = 0; i < L * E; i++) w[i] = (float)sum->data[i];
    int32_t *ref = malloc(sizeof(int32_t) * (size_t)(L * P));
    for (int hier = 0; hier < 2; hier++) {
        epx_shape s = {L, E, P, G, N};
        epx_plan_opts o = EPX_PLAN_OPTS_INIT;
        o.algorithm = hier ? EPX_ALGO_DEEPSEEK_HIERARCHICAL : EPX_ALGO_DEEPSEEK;
        o.num_groups = 8;
        epx_plan *p = NULL;
        assert_int_equal(epx_plan_compute(c, &s, &o, &p, &err), EPX_OK);
        assert_int_equal(epx_plan_deepseek(w, L, E, P, 8, N, G, hier, ref, NULL, NULL, &err),
                         EPX_OK);
        const epx_layout *lay = epx_plan_layout(p);
        assert_memory_equal(epx_layout_physical_to_logical(lay), ref,
                            sizeof(int32_t) * (size_t)(L * P));
        const double *wt = epx_plan_replica_weights(p);
        const int32_t *nv = epx_layout_num_valid(lay);
        for (int l = 0; l < L; l++)
            for (int q = 0; q < P; q++)
                assert_true(wt[l * P + q] == 1.0 / nv[l * E + ref[l * P + q]]);
        assert_true(epx_plan_seconds(p) >= 0.0 && epx_plan_seconds(p) < 10.0);
        assert_int_equal(epx_plan_algorithm(p), o.algorithm);
        const epx_shape *ls = epx_layout_shape(lay);
        assert_int_equal(ls->num_nodes, N);
        epx_plan_destroy(p);
    }
    free(w);
    free(ref);
    epx_counts_destroy(c);
    epx_counts_destroy(sum);
}

/* The default algorithm: a valid layout whose shares sum to 1 per expert,
 * and never less balanced than DeepSeek's global policy on the same load. */
static void default_algorithm(void **state) {
    (void)state;
    tu_rng r = {tu_seed(17)};
    for (int iter = 0; iter < 10; iter++) {
        const int32_t G = 2 + (int32_t)tu_below(&r, 7), E = G * (2 + (int32_t)tu_below(&r, 6));
        const int32_t P = E + G * (int32_t)tu_below(&r, 3), L = 1 + (int32_t)tu_below(&r, 3);
        epx_counts *c = random_counts(&r, 1, L, E);
        epx_shape s = {L, E, P, G, 1};
        epx_plan_opts o = EPX_PLAN_OPTS_INIT;
        epx_plan *p = NULL, *d = NULL;
        epx_error err = {0};
        assert_int_equal(epx_plan_compute(c, &s, &o, &p, &err), EPX_OK);
        assert_int_equal(epx_plan_algorithm(p), EPX_ALGO_EPX);
        o.algorithm = EPX_ALGO_DEEPSEEK;
        assert_int_equal(epx_plan_compute(c, &s, &o, &d, &err), EPX_OK);
        epx_balance bp, bd;
        assert_int_equal(epx_balance_compute(epx_plan_layout(p), c->data,
                                             epx_plan_replica_weights(p), &bp, NULL, &err),
                         EPX_OK);
        assert_int_equal(epx_balance_compute(epx_plan_layout(d), c->data, NULL, &bd, NULL, &err),
                         EPX_OK);
        assert_true(bp.balancedness >= bd.balancedness - 1e-12);
        epx_plan_destroy(p);
        epx_plan_destroy(d);
        epx_counts_destroy(c);
    }
}

/* --init-expert-location with logical_count plans a layout. */
static void init_from_counts(void **state) {
    (void)state;
    epx_init_opts o = EPX_INIT_OPTS_INIT;
    o.num_gpus = 2;
    o.num_redundant = 2;
    epx_layout *lay = NULL;
    epx_error err = {0};
    assert_int_equal(
        epx_layout_init("{\"logical_count\": [[10, 1, 1, 1], [0, 0, 0, 9]]}", &o, &lay, &err),
        EPX_OK);
    const epx_shape *s = epx_layout_shape(lay);
    assert_int_equal(s->num_physical_experts, 6);
    assert_int_equal(s->num_layers, 2);
    /* the hot expert of each layer got the redundant slots */
    const int32_t *nv = epx_layout_num_valid(lay);
    assert_true(nv[0] >= 2);
    assert_true(nv[4 + 3] >= 2);
    epx_layout_destroy(lay);
    /* a bad shape is explained, not asserted */
    o.num_redundant = 1;
    assert_int_equal(epx_layout_init("{\"logical_count\": [[10, 1, 1, 1]]}", &o, &lay, &err),
                     EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "5", "2");
}

/* Getters on a NULL handle answer NULL, 0 or nothing, as their siblings
 * (epx_layout_max_replicas, epx_plan_seconds, epx_migration_kinds) did;
 * five of them dereferenced it. */
static void null_handles(void **state) {
    (void)state;
    int32_t w = 7, rr = 7;
    epx_migration_stats st;
    memset(&st, 0xff, sizeof st);
    uint64_t b[4] = {9, 9, 9, 9};
    assert_null(epx_layout_shape(NULL));
    assert_null(epx_layout_physical_to_logical(NULL));
    assert_null(epx_layout_num_valid(NULL));
    assert_null(epx_layout_logical_to_all_physical(NULL, &w));
    assert_int_equal(w, 0);
    assert_null(epx_plan_layout(NULL));
    assert_null(epx_plan_replica_weights(NULL));
    w = 7;
    assert_null(epx_plan_logical_to_physical(NULL, &w, &rr));
    assert_true(w == 0 && rr == 0);
    assert_null(epx_migration_permutation(NULL));
    epx_migration_get_stats(NULL, &st);
    assert_int_equal(st.expert_bytes, 0);
    epx_migration_get_stats(NULL, NULL);
    epx_migration_rank_bytes(NULL, b, b);
    epx_migration_link_bytes(NULL, b);
    assert_true(b[0] == 9 && b[3] == 9);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(algorithm_names),       cmocka_unit_test(option_errors),
        cmocka_unit_test(null_handles),          cmocka_unit_test(auto_rule),
        cmocka_unit_test(deepseek_sums_windows), cmocka_unit_test(default_algorithm),
        cmocka_unit_test(init_from_counts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
