/*
 * test_sglang_eplb.c - `plan --algorithm deepseek* --sglang-version V`
 * against SGLang's own copy of DeepSeek's EPLB, release by release.
 * tests/data/sglang_eplb holds what each release's rebalance_experts
 * returned (tools/sglang_eplb.py ran 0.5.2, 0.5.10.post1, 0.5.11 and
 * 0.5.23 as init_by_eplb calls them) on 1, 2, 4 and 8 nodes, with single
 * replicas, ties, and loads where float32 and float64 pack sums part.
 * For every case and release, epx_plan_compute with sglang_version = V must
 * give the same algorithm, physical_to_logical_map and replica-rank
 * logical_to_physical_map, ties included (the SGLang rules order ties as
 * torch's sort does). Without a release (DeepSeek's rule, ties to the
 * lowest index) the replica counts and per-layer max GPU load must equal
 * the float32 release's everywhere, and the placement where nothing ties.
 */
#include <dirent.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static size_t flat(const json_t *a, int32_t *out, size_t at, size_t cap) {
    if (!json_is_array(a)) {
        assert_true(json_is_integer(a));
        assert_true(at < cap);
        out[at] = (int32_t)json_integer_value(a);
        return at + 1;
    }
    size_t i;
    const json_t *x;
    json_array_foreach(a, i, x) at = flat(x, out, at, cap);
    return at;
}

static int32_t geti(const json_t *root, const char *key) {
    const json_t *a = json_object_get(root, key);
    if (!json_is_integer(a)) fail_msg("case has no integer '%s'", key);
    return (int32_t)json_integer_value(a);
}

typedef struct tally {
    int runs, exact, parted; /* plan runs; compared slot for slot; on parting loads */
    int ties;                /* release runs on cases with tied loads */
} tally;

/* The per-layer max GPU loads of a map under load (even split). */
static void max_loads(const epx_shape *s, const int32_t *p2l, const double *load, double *out) {
    epx_layout *lay = NULL;
    epx_error err = {0};
    if (epx_layout_create_from_map(s, p2l, &lay, &err) != EPX_OK) fail_msg("%s", err.msg);
    epx_layer_balance *lb = calloc((size_t)s->num_layers, sizeof *lb);
    epx_balance b;
    assert_non_null(lb);
    assert_int_equal(epx_balance_compute(lay, load, NULL, &b, lb, &err), EPX_OK);
    for (int32_t l = 0; l < s->num_layers; l++) out[l] = lb[l].max_gpu_load;
    free(lb);
    epx_layout_destroy(lay);
}

/* One release of one case: sglang_version = ver (NULL: DeepSeek's rule,
 * compared with release `ver`, exactly only where the case has no ties). */
static void run_release(const char *name, const char *ver, bool with_version, const json_t *r,
                        const json_t *root, const epx_counts *c, const epx_shape *s, bool ties,
                        tally *t) {
    const int32_t L = s->num_layers, E = s->num_logical_experts, P = s->num_physical_experts;
    epx_plan_opts o = EPX_PLAN_OPTS_INIT;
    epx_error err = {0};
    if (epx_algorithm_parse(json_string_value(json_object_get(root, "algorithm")), &o.algorithm,
                            &err) != EPX_OK)
        fail_msg("%s: %s", name, err.msg);
    o.num_groups = geti(root, "num_groups");
    o.sglang_version = with_version ? ver : NULL;
    const char *who = with_version ? ver : "none (DeepSeek's rule)";
    epx_plan *plan = NULL;
    if (epx_plan_compute(c, s, &o, &plan, &err) != EPX_OK)
        fail_msg("%s %s: %s", name, who, err.msg);
    epx_algorithm want;
    assert_int_equal(
        epx_algorithm_parse(json_string_value(json_object_get(r, "algorithm")), &want, &err),
        EPX_OK);
    if (epx_plan_algorithm(plan) != want) fail_msg("%s %s: algorithm differs", name, who);
    const epx_layout *lay = epx_plan_layout(plan);
    const int32_t *got = epx_layout_physical_to_logical(lay);
    const size_t LP = (size_t)L * (size_t)P, LE = (size_t)L * (size_t)E;
    int32_t *p2l = malloc(LP * sizeof *p2l), *cnt = malloc(LE * sizeof *cnt);
    double *load = malloc(LE * sizeof *load), *ml_got = malloc((size_t)L * sizeof(double));
    double *ml_want = malloc((size_t)L * sizeof(double));
    assert_true(p2l && cnt && load && ml_got && ml_want);
    assert_int_equal(flat(json_object_get(r, "physical_to_logical_map"), p2l, 0, LP), LP);
    assert_int_equal(flat(json_object_get(r, "logical_count"), cnt, 0, LE), LE);
    const int32_t *nv = epx_layout_num_valid(lay);
    for (size_t i = 0; i < LE; i++)
        if (nv[i] != cnt[i])
            fail_msg("%s, SGLang %s: expert %zu of layer %zu has %d replicas, SGLang's %d", name,
                     who, i % (size_t)E, i / (size_t)E, nv[i], cnt[i]);
    assert_int_equal(epx_counts_sum_windows(c, 0, c->num_windows, load, &err), EPX_OK);
    max_loads(s, got, load, ml_got);
    max_loads(s, p2l, load, ml_want);
    for (int32_t l = 0; l < L; l++)
        if (ml_got[l] != ml_want[l])
            fail_msg("%s, SGLang %s: layer %d max GPU load %.17g, SGLang's %.17g", name, who, l,
                     ml_got[l], ml_want[l]);
    if (with_version || !ties) {
        for (size_t i = 0; i < LP; i++)
            if (got[i] != p2l[i])
                fail_msg("%s, SGLang %s: slot %zu of layer %zu holds %d, SGLang's %d", name, who,
                         i % (size_t)P, i / (size_t)P, got[i], p2l[i]);
        t->exact++;
        t->parted += json_is_true(json_object_get(root, "releases_differ"));
    }
    if (with_version) {
        /* replica-rank order, as init_by_eplb keeps it, torch's order of
         * one expert's equally loaded replicas included */
        const json_t *l2pj = json_object_get(r, "logical_to_physical_map");
        const size_t X = json_array_size(json_array_get(json_array_get(l2pj, 0), 0));
        int32_t W = 0, rank = 0;
        const int32_t *l2p = epx_plan_logical_to_physical(plan, &W, &rank);
        assert_int_equal(rank, 1);
        int32_t *want_l2p = malloc(LE * X * sizeof *want_l2p);
        assert_non_null(want_l2p);
        assert_int_equal(flat(l2pj, want_l2p, 0, LE * X), LE * X);
        for (size_t i = 0; i < LE; i++)
            for (size_t k = 0; k < (size_t)W; k++) {
                const int32_t w = k < X ? want_l2p[i * X + k] : -1;
                if (l2p[i * (size_t)W + k] != w)
                    fail_msg("%s, SGLang %s: replica %zu of expert %zu, layer %zu is slot %d, "
                             "SGLang's %d",
                             name, who, k, i % (size_t)E, i / (size_t)E, l2p[i * (size_t)W + k], w);
            }
        free(want_l2p);
        t->ties += ties;
    }
    t->runs++;
    free(p2l);
    free(cnt);
    free(load);
    free(ml_got);
    free(ml_want);
    epx_plan_destroy(plan);
}

static void run_case(const char *path, const char *name, tally *t) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (root == NULL) fail_msg("%s: %s", path, je.text);
    epx_shape s = {geti(root, "num_layers"), geti(root, "num_logical_experts"),
                   geti(root, "num_physical_experts"), geti(root, "num_gpus"),
                   geti(root, "num_nodes")};
    epx_counts *c = NULL;
    epx_error err = {0};
    if (epx_counts_read(path, &c, &err) != EPX_OK) fail_msg("%s: %s", path, err.msg);
    const bool ties = json_is_true(json_object_get(root, "ties"));
    const json_t *r;
    const char *ver;
    json_object_foreach(json_object_get(root, "sglang"), ver, r)
        run_release(name, ver, true, r, root, c, &s, ties, t);
    const json_t *f32 = json_object_get(json_object_get(root, "sglang"), "0.5.10.post1");
    if (f32 == NULL) fail_msg("%s: no 0.5.10.post1 output", name);
    run_release(name, "0.5.10.post1", false, f32, root, c, &s, ties, t);
    epx_counts_destroy(c);
    json_decref(root);
}

static void release_goldens(void **state) {
    (void)state;
    const char *dir = "data/sglang_eplb";
    DIR *d = opendir(dir);
    if (d == NULL) fail_msg("tests/%s is missing (the test runs from tests/)", dir);
    struct dirent *de;
    int cases = 0;
    tally t = {0, 0, 0, 0};
    while ((de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name);
        if (n < 6 || strcmp(de->d_name + n - 5, ".json") != 0) continue;
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        run_case(path, de->d_name, &t);
        cases++;
    }
    closedir(d);
    fprintf(stderr,
            "%d plans of %d cases (4 releases and DeepSeek's rule each): %d slot for slot, %d "
            "of them on loads where the releases part, %d release runs with tied loads\n",
            t.runs, cases, t.exact, t.parted, t.ties);
    assert_true(cases >= 30);
    assert_int_equal(t.runs, cases * 5);
    assert_true(t.parted >= 4 * 5);
    assert_true(t.ties >= 8 * 4);
}

/* One case of SGLang 0.5.23's deepseek_vec / elasticity_aware
 * (tests/data/sglang_eplb_0523): the same algorithm, physical_to_logical_map,
 * replica counts and replica-rank lists. counts [S][L][E] are the steps. */
static void run_case_0523(const char *path, const char *name, int *per_algo) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (root == NULL) fail_msg("%s: %s", path, je.text);
    epx_shape s = {geti(root, "num_layers"), geti(root, "num_logical_experts"),
                   geti(root, "num_physical_experts"), geti(root, "num_gpus"),
                   geti(root, "num_nodes")};
    const int32_t L = s.num_layers, E = s.num_logical_experts, P = s.num_physical_experts;
    epx_counts *c = NULL;
    epx_error err = {0};
    if (epx_counts_read(path, &c, &err) != EPX_OK) fail_msg("%s: %s", path, err.msg);
    assert_int_equal(c->num_windows, geti(root, "num_steps"));
    epx_plan_opts o = EPX_PLAN_OPTS_INIT;
    if (epx_algorithm_parse(json_string_value(json_object_get(root, "algorithm")), &o.algorithm,
                            &err) != EPX_OK)
        fail_msg("%s: %s", name, err.msg);
    o.num_groups = geti(root, "num_groups");
    o.sglang_version = "0.5.23";
    uint8_t failed[64] = {0};
    const json_t *active = json_object_get(root, "active_ranks");
    if (active != NULL) {
        assert_true(s.num_gpus <= 64 && json_array_size(active) == (size_t)s.num_gpus);
        for (int32_t g = 0; g < s.num_gpus; g++)
            failed[g] = json_integer_value(json_array_get(active, (size_t)g)) == 0;
        o.failed_gpus = failed;
    }
    const json_t *r = json_object_get(json_object_get(root, "sglang"), "0.5.23");
    epx_plan *plan = NULL;
    if (epx_plan_compute(c, &s, &o, &plan, &err) != EPX_OK) fail_msg("%s: %s", name, err.msg);
    epx_algorithm want;
    assert_int_equal(
        epx_algorithm_parse(json_string_value(json_object_get(r, "algorithm")), &want, &err),
        EPX_OK);
    if (epx_plan_algorithm(plan) != want) fail_msg("%s: algorithm differs", name);
    per_algo[want]++;
    const size_t LP = (size_t)L * (size_t)P, LE = (size_t)L * (size_t)E;
    int32_t *p2l = malloc(LP * sizeof *p2l), *cnt = malloc(LE * sizeof *cnt);
    assert_true(p2l && cnt);
    assert_int_equal(flat(json_object_get(r, "physical_to_logical_map"), p2l, 0, LP), LP);
    assert_int_equal(flat(json_object_get(r, "logical_count"), cnt, 0, LE), LE);
    const int32_t *got = epx_layout_physical_to_logical(epx_plan_layout(plan));
    for (size_t i = 0; i < LP; i++)
        if (got[i] != p2l[i])
            fail_msg("%s: slot %zu of layer %zu holds %d, SGLang's %d", name, i % (size_t)P,
                     i / (size_t)P, got[i], p2l[i]);
    const json_t *l2pj = json_object_get(r, "logical_to_physical_map");
    const size_t X = json_array_size(json_array_get(json_array_get(l2pj, 0), 0));
    int32_t W = 0, rank = 0;
    const int32_t *l2p = epx_plan_logical_to_physical(plan, &W, &rank);
    assert_int_equal(rank, 1);
    assert_true(X <= (size_t)W);
    int32_t *want_l2p = malloc(LE * X * sizeof *want_l2p);
    assert_non_null(want_l2p);
    assert_int_equal(flat(l2pj, want_l2p, 0, LE * X), LE * X);
    const double *share = epx_plan_replica_weights(plan);
    for (size_t i = 0; i < LE; i++) {
        int32_t n = 0;
        for (size_t k = 0; k < (size_t)W; k++) {
            const int32_t w = k < X ? want_l2p[i * X + k] : -1;
            const int32_t g = l2p[i * (size_t)W + k];
            if (g != w)
                fail_msg("%s: replica %zu of expert %zu, layer %zu is slot %d, SGLang's %d", name,
                         k, i % (size_t)E, i / (size_t)E, g, w);
            if (g >= 0) {
                n++;
                /* the listed replicas share the expert's tokens evenly */
                assert_true(share[(i / (size_t)E) * (size_t)P + (size_t)g] * cnt[i] == 1.0);
            }
        }
        if (n != cnt[i])
            fail_msg("%s: expert %zu of layer %zu lists %d replicas, SGLang counts %d", name,
                     i % (size_t)E, i / (size_t)E, n, cnt[i]);
    }
    free(want_l2p);
    free(p2l);
    free(cnt);
    epx_plan_destroy(plan);
    epx_counts_destroy(c);
    json_decref(root);
}

static void release_0523_goldens(void **state) {
    (void)state;
    const char *dir = "data/sglang_eplb_0523";
    DIR *d = opendir(dir);
    if (d == NULL) fail_msg("tests/%s is missing (the test runs from tests/)", dir);
    struct dirent *de;
    int cases = 0, per_algo[8] = {0};
    while ((de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name);
        if (n < 6 || strcmp(de->d_name + n - 5, ".json") != 0) continue;
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        run_case_0523(path, de->d_name, per_algo);
        cases++;
    }
    closedir(d);
    fprintf(stderr,
            "SGLang 0.5.23: %d cases slot for slot: deepseek_vec %d, deepseek_vec_hierarchical "
            "%d, elasticity_aware %d, elasticity_aware_hierarchical %d\n",
            cases, per_algo[EPX_ALGO_DEEPSEEK_VEC], per_algo[EPX_ALGO_DEEPSEEK_VEC_HIERARCHICAL],
            per_algo[EPX_ALGO_ELASTICITY_AWARE], per_algo[EPX_ALGO_ELASTICITY_AWARE_HIERARCHICAL]);
    for (int a = EPX_ALGO_DEEPSEEK_VEC; a <= EPX_ALGO_ELASTICITY_AWARE_HIERARCHICAL; a++)
        assert_true(per_algo[a] >= 10);
}

static void release_strings(void **state) {
    (void)state;
    static const struct {
        const char *s;
        epx_eplb_rule rule;
        int32_t newer;
    } ok[] = {
        {"0.5.2.post1", EPX_EPLB_RULE_SGLANG_F32, 0}, {"0.5.2", EPX_EPLB_RULE_SGLANG_F32, 0},
        {"v0.5.10", EPX_EPLB_RULE_SGLANG_F32, 0},     {"0.5.10.post1", EPX_EPLB_RULE_SGLANG_F32, 0},
        {"0.5.11", EPX_EPLB_RULE_SGLANG_F64, 0},      {"0.5.23", EPX_EPLB_RULE_SGLANG_F64, 0},
        {"0.5.24", EPX_EPLB_RULE_SGLANG_F64, 1},      {"1.0.0", EPX_EPLB_RULE_SGLANG_F64, 1},
    };
    epx_error err = {0};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        epx_eplb_rule rule = EPX_EPLB_RULE_SGLANG_F32;
        int32_t newer = -1;
        if (epx_sglang_eplb_rule(ok[i].s, &rule, &newer, &err) != EPX_OK)
            fail_msg("%s: %s", ok[i].s, err.msg);
        if (rule != ok[i].rule || newer != ok[i].newer)
            fail_msg("%s: rule %d newer %d, want %d %d", ok[i].s, rule, newer, ok[i].rule,
                     ok[i].newer);
    }
    epx_eplb_rule rule;
    assert_int_equal(epx_sglang_eplb_rule("0.5.11rc1", &rule, NULL, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "'0.5.11rc1'", "MAJOR.MINOR");
}

static void count_warnings(void *user, epx_log_level level, const char *msg) {
    if (level == EPX_LOG_WARN && strstr(msg, "0.9.0") && strstr(msg, "newer")) ++*(int *)user;
}

/* The option is checked before any work, and names the value and the fix. */
static void plan_option(void **state) {
    (void)state;
    epx_counts *c = NULL;
    epx_error err = {0};
    assert_int_equal(epx_counts_create(1, 2, 8, &c, &err), EPX_OK);
    for (int i = 0; i < 16; i++) c->data[i] = 1 + i % 5;
    epx_shape s = {2, 8, 12, 4, 1};
    epx_plan_opts o = EPX_PLAN_OPTS_INIT;
    epx_plan *plan = NULL;
    o.sglang_version = "0.5.11";
    assert_int_equal(epx_plan_compute(c, &s, &o, &plan, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "'0.5.11'", "deepseek");
    o.algorithm = EPX_ALGO_DEEPSEEK;
    o.sglang_version = "newest";
    assert_int_equal(epx_plan_compute(c, &s, &o, &plan, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "'newest'", "MAJOR.MINOR");
    int warned = 0;
    o.sglang_version = "0.9.0";
    o.log = count_warnings;
    o.log_user = &warned;
    assert_int_equal(epx_plan_compute(c, &s, &o, &plan, &err), EPX_OK);
    assert_int_equal(warned, 1);
    /* an epx plan lists replicas ascending, as init_by_mapping builds them */
    epx_plan_destroy(plan);
    o = (epx_plan_opts)EPX_PLAN_OPTS_INIT;
    assert_int_equal(epx_plan_compute(c, &s, &o, &plan, &err), EPX_OK);
    int32_t W = 0, rank = 1;
    const int32_t *l2p = epx_plan_logical_to_physical(plan, &W, &rank);
    assert_int_equal(W, 12 - 8 + 1);
    assert_int_equal(rank, 0);
    int32_t LW = 0;
    const int32_t *asc = epx_layout_logical_to_all_physical(epx_plan_layout(plan), &LW);
    assert_int_equal(LW, W);
    assert_memory_equal(l2p, asc, (size_t)2 * 8 * (size_t)W * sizeof *l2p);
    epx_plan_destroy(plan);
    /* the raw entry point refuses an unknown rule */
    float w[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t p2l[12];
    assert_int_equal(
        epx_plan_deepseek_rule(w, 1, 8, 12, 1, 1, 4, 0, (epx_eplb_rule)7, p2l, NULL, NULL, &err),
        EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "7", "EPX_EPLB_RULE_SGLANG_F64");
    epx_counts_destroy(c);
}

/* SGLang's --init-expert-location with counts: init_by_eplb's plan. */
static void init_from_counts(void **state) {
    (void)state;
    const char *path = "data/sglang_eplb/parting_2_g8_n2.json";
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (root == NULL) fail_msg("%s: %s", path, je.text);
    epx_init_opts io = EPX_INIT_OPTS_INIT;
    io.num_gpus = geti(root, "num_gpus");
    io.num_nodes = geti(root, "num_nodes");
    io.num_groups = geti(root, "num_groups");
    io.num_physical = geti(root, "num_physical_experts");
    io.algorithm = EPX_ALGO_AUTO;
    const size_t LP = (size_t)geti(root, "num_layers") * (size_t)io.num_physical;
    int32_t *want = malloc(LP * sizeof *want);
    assert_non_null(want);
    static const char *vers[] = {"0.5.10.post1", "0.5.11"};
    epx_error err = {0};
    for (int i = 0; i < 2; i++) {
        io.sglang_version = vers[i];
        epx_layout *lay = NULL;
        if (epx_layout_init(path, &io, &lay, &err) != EPX_OK) fail_msg("%s", err.msg);
        const json_t *r = json_object_get(json_object_get(root, "sglang"), vers[i]);
        assert_int_equal(flat(json_object_get(r, "physical_to_logical_map"), want, 0, LP), LP);
        assert_memory_equal(epx_layout_physical_to_logical(lay), want, LP * sizeof *want);
        epx_layout_destroy(lay);
    }
    /* epx's planner takes no release */
    io.algorithm = EPX_ALGO_EPX;
    epx_layout *lay = NULL;
    assert_int_equal(epx_layout_init(path, &io, &lay, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "'0.5.11'", "DeepSeek modes");
    free(want);
    json_decref(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(release_strings),      cmocka_unit_test(plan_option),
        cmocka_unit_test(init_from_counts),     cmocka_unit_test(release_goldens),
        cmocka_unit_test(release_0523_goldens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
