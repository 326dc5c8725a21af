/*
 * test_dispatch_golden.c - SGLang's static dispatch tables reproduced entry
 * for entry. For every golden case in ../shared/golden/eplb (and the copies
 * and crafted cases in tests/data/dispatch, which run without shared/):
 *  - from DeepSeek's logical_to_physical_map (replica-rank order) the table
 *    must equal rank_dispatch_from_eplb;
 *  - from physical_to_logical_map through a layout (ascending order, as
 *    SGLang's init_by_mapping builds it) it must equal
 *    rank_dispatch_from_mapping, and the layout's ascending map must equal
 *    logical_to_all_physical_map_from_mapping.
 * The crafted cases (gen_extra_cases.py) reach CPython sample()'s set
 * method, which no shared golden does.
 */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

typedef struct ivec {
    int32_t *v;
    size_t n, cap;
    int64_t dims[4];
    int rank;
} ivec;

static void flatten(const json_t *a, ivec *out, int depth) {
    if (json_is_array(a)) {
        if (depth < 4 && (out->rank <= depth)) {
            out->dims[depth] = (int64_t)json_array_size(a);
            out->rank = depth + 1;
        }
        size_t i;
        const json_t *x;
        json_array_foreach(a, i, x) flatten(x, out, depth + 1);
        return;
    }
    assert_true(json_is_integer(a));
    if (out->n == out->cap) { /* geometric growth: ASan's realloc always copies */
        out->cap = out->cap ? 2 * out->cap : 1024;
        out->v = realloc(out->v, out->cap * sizeof *out->v);
        assert_non_null(out->v);
    }
    out->v[out->n++] = (int32_t)json_integer_value(a);
}

static ivec get(const json_t *root, const char *key) {
    ivec r = {0};
    const json_t *a = json_object_get(root, key);
    if (a == NULL) fail_msg("golden case has no '%s'", key);
    flatten(a, &r, 0);
    return r;
}

static int32_t geti(const json_t *root, const char *key) {
    const json_t *a = json_object_get(root, key);
    if (!json_is_integer(a)) fail_msg("golden case has no integer '%s'", key);
    return (int32_t)json_integer_value(a);
}

static void expect_table(const int32_t *got, const ivec *want, const char *name, const char *which,
                         int32_t G, int32_t L, int32_t E) {
    assert_int_equal(want->n, (size_t)G * (size_t)L * (size_t)E);
    for (size_t i = 0; i < want->n; i++)
        if (got[i] != want->v[i])
            fail_msg("%s, %s: rank %zu layer %zu expert %zu is %d, SGLang gives %d", name, which,
                     i / ((size_t)L * (size_t)E), i / (size_t)E % (size_t)L, i % (size_t)E, got[i],
                     want->v[i]);
}

/* Check one case file; returns 1 when it ran. */
static int run_case(const char *path) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (root == NULL) fail_msg("cannot parse %s: %s", path, je.text);
    const char *name = json_string_value(json_object_get(root, "name"));
    if (name == NULL) name = path;
    epx_shape s = {geti(root, "num_layers"), geti(root, "num_logical_experts"),
                   geti(root, "num_physical_experts"), geti(root, "num_gpus"),
                   geti(root, "num_nodes")};
    int32_t L = s.num_layers, E = s.num_logical_experts, G = s.num_gpus;
    size_t n = (size_t)G * (size_t)L * (size_t)E;
    int32_t *out = malloc(n * sizeof *out);
    epx_error err = {0};
    /* these goldens are SGLang <= 0.5.2's (tests/test_sglang_versions.c has
     * the later releases) */
    epx_table_opts v052 = EPX_TABLE_OPTS_INIT;
    v052.sglang_version = "0.5.2";

    /* 1. replica-rank order, straight from DeepSeek's map */
    ivec l2p = get(root, "logical_to_physical_map");
    assert_int_equal(l2p.rank, 3);
    assert_int_equal(l2p.dims[0], L);
    assert_int_equal(l2p.dims[1], E);
    ivec want = get(root, "rank_dispatch_from_eplb");
    epx_status st = epx_dispatch_table_compute(&s, l2p.v, (int32_t)l2p.dims[2], &v052, out, &err);
    if (st != EPX_OK) fail_msg("%s: %s", name, err.msg);
    expect_table(out, &want, name, "from logical_to_physical_map", G, L, E);
    free(want.v);
    free(l2p.v);

    /* 2. ascending order through a layout built from the mapping */
    ivec p2l = get(root, "physical_to_logical_map");
    epx_layout *lay = NULL;
    if (epx_layout_create_from_map(&s, p2l.v, &lay, &err) != EPX_OK)
        fail_msg("%s: %s", name, err.msg);
    ivec asc = get(root, "logical_to_all_physical_map_from_mapping");
    int32_t W = 0;
    const int32_t *mine = epx_layout_logical_to_all_physical(lay, &W);
    int32_t X = (int32_t)asc.dims[2];
    for (size_t le = 0; le < (size_t)L * (size_t)E; le++)
        for (int32_t j = 0; j < (W > X ? W : X); j++) {
            int32_t a = j < W ? mine[le * (size_t)W + (size_t)j] : -1;
            int32_t b = j < X ? asc.v[le * (size_t)X + (size_t)j] : -1;
            if (a != b)
                fail_msg("%s: ascending map of layer %zu expert %zu differs at %d", name,
                         le / (size_t)E, le % (size_t)E, j);
        }
    want = get(root, "rank_dispatch_from_mapping");
    if (epx_dispatch_table_from_layout(lay, &v052, out, &err) != EPX_OK)
        fail_msg("%s: %s", name, err.msg);
    expect_table(out, &want, name, "from physical_to_logical_map", G, L, E);
    /* the raw entry point with SGLang's own ascending map gives the same */
    memset(out, 0xff, n * sizeof *out);
    assert_int_equal(epx_dispatch_table_compute(&s, asc.v, X, &v052, out, &err), EPX_OK);
    expect_table(out, &want, name, "from logical_to_all_physical_map_from_mapping", G, L, E);
    free(want.v);
    free(asc.v);
    free(p2l.v);
    epx_layout_destroy(lay);
    free(out);
    json_decref(root);
    return 1;
}

static void shared_goldens(void **state) {
    (void)state;
    const char *sh = tu_shared_dir();
    if (sh == NULL) skip();
    char path[4600];
    snprintf(path, sizeof path, "%s/golden/eplb/index.json", sh);
    json_error_t je;
    json_t *idx = json_load_file(path, 0, &je);
    assert_non_null(idx);
    const json_t *cases = json_object_get(idx, "cases");
    size_t i;
    const json_t *c;
    int ran = 0;
    json_array_foreach(cases, i, c) {
        snprintf(path, sizeof path, "%s/golden/eplb/%s.json", sh, json_string_value(c));
        ran += run_case(path);
    }
    fprintf(stderr, "%d shared golden cases reproduced from both orders\n", ran);
    assert_int_equal(ran, 134);
    json_decref(idx);
}

static void local_cases(void **state) {
    (void)state;
    const char *dir = "data/dispatch";
    DIR *d = opendir(dir);
    if (d == NULL) fail_msg("tests/%s is missing (the test runs from tests/)", dir);
    struct dirent *de;
    int ran = 0, crafted = 0;
    while ((de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name);
        if (n < 6 || strcmp(de->d_name + n - 5, ".json") != 0) continue;
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        ran += run_case(path);
        crafted += strncmp(de->d_name, "set_method", 10) == 0;
    }
    closedir(d);
    fprintf(stderr, "%d local cases reproduced (%d crafted for sample's set method)\n", ran,
            crafted);
    assert_true(ran >= 9);
    assert_int_equal(crafted, 2);
}

/* A changed seed changes the table (the seed is really used) and the same
 * seed gives the same table (no hidden state). */
static void seed_is_used(void **state) {
    (void)state;
    epx_shape s = {4, 16, 32, 8, 1};
    epx_layout *lay = NULL;
    epx_error err = {0};
    assert_int_equal(epx_layout_create_trivial(&s, &lay, &err), EPX_OK);
    size_t n = 8 * 4 * 16;
    int32_t *a = malloc(n * 4), *b = malloc(n * 4), *c = malloc(n * 4);
    epx_table_opts o = EPX_TABLE_OPTS_INIT;
    assert_int_equal(epx_dispatch_table_from_layout(lay, &o, a, &err), EPX_OK);
    assert_int_equal(epx_dispatch_table_from_layout(lay, &o, b, &err), EPX_OK);
    assert_memory_equal(a, b, n * 4);
    o.seed = 43;
    assert_int_equal(epx_dispatch_table_from_layout(lay, &o, c, &err), EPX_OK);
    assert_true(memcmp(a, c, n * 4) != 0);
    free(a);
    free(b);
    free(c);
    epx_layout_destroy(lay);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(local_cases),
        cmocka_unit_test(shared_goldens),
        cmocka_unit_test(seed_is_used),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
