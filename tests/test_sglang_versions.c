/*
 * test_sglang_versions.c - SGLang's static dispatch tables, release by
 * release. tests/data/sglang_tables holds what each release's own code
 * computes (tools/sglang_tables.py ran compute_logical_to_rank_dispatch_
 * physical_map and _compute_logical_to_all_physical_map of 0.5.2 ... 0.5.23
 * on each rank) for placements on 1, 2, 4 and 8 nodes; for every case and
 * release, epx's tables must equal them entry for entry:
 *  - from logical_to_physical_map (init_by_eplb, never cut):
 *    rank_dispatch_from_eplb;
 *  - from physical_to_logical_map through a layout (init_by_mapping, cut
 *    per rank from 0.5.4.post2): rank_dispatch_from_mapping;
 *  - each rank's replica lists from that layout (epx_dispatch_rank_lists_*):
 *    logical_to_all_physical_map_from_mapping, [G][L][E][X], X the widest
 *    list of any rank; from logical_to_physical_map every rank keeps the
 *    lists as given (init_by_eplb cuts nothing).
 * Also: release strings map to the rules the header names.
 */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* Flatten a nested integer array; returns the count. */
static size_t flat(const json_t *a, int32_t *out, size_t at) {
    if (!json_is_array(a)) {
        assert_true(json_is_integer(a));
        out[at] = (int32_t)json_integer_value(a);
        return at + 1;
    }
    size_t i;
    const json_t *x;
    json_array_foreach(a, i, x) at = flat(x, out, at);
    return at;
}

static int32_t geti(const json_t *root, const char *key) {
    const json_t *a = json_object_get(root, key);
    if (!json_is_integer(a)) fail_msg("case has no integer '%s'", key);
    return (int32_t)json_integer_value(a);
}

static void expect(const int32_t *got, const json_t *want, size_t n, const char *name,
                   const char *ver, const char *what) {
    int32_t *w = malloc(n * sizeof *w);
    assert_non_null(w);
    assert_int_equal(flat(want, w, 0), n);
    for (size_t i = 0; i < n; i++)
        if (got[i] != w[i])
            fail_msg("%s, SGLang %s, %s: entry %zu is %d, SGLang's %d", name, ver, what, i, got[i],
                     w[i]);
    free(w);
}

/* The per-rank lists of one release: from the layout (cut as init_by_mapping)
 * equal to SGLang's, the size query first; from DeepSeek's lists (no cut)
 * every rank holds the valid entries as given, in order. */
static void check_rank_lists(const epx_shape *s, const epx_layout *lay, const int32_t *l2p,
                             int32_t X, const epx_table_opts *o, const json_t *want,
                             const char *name, const char *ver) {
    int32_t L = s->num_layers, E = s->num_logical_experts, G = s->num_gpus;
    int32_t WX =
        (int32_t)json_array_size(json_array_get(json_array_get(json_array_get(want, 0), 0), 0));
    epx_error err = {0};
    int32_t need = -1;
    if (epx_dispatch_rank_lists_from_layout(lay, o, 0, NULL, &need, &err) != EPX_OK)
        fail_msg("%s %s: %s", name, ver, err.msg);
    if (need != WX) fail_msg("%s, SGLang %s: widest list %d, SGLang's %d", name, ver, need, WX);
    size_t n = (size_t)G * (size_t)L * (size_t)E * (size_t)WX;
    int32_t *got = malloc(n * sizeof *got);
    assert_non_null(got);
    memset(got, 0x7f, n * sizeof *got);
    if (epx_dispatch_rank_lists_from_layout(lay, o, WX, got, NULL, &err) != EPX_OK)
        fail_msg("%s %s: %s", name, ver, err.msg);
    expect(got, want, n, name, ver, "per-rank replica lists");
    /* one column short is refused, naming both widths, and writes nothing */
    if (WX > 1) {
        memset(got, 0x7f, n * sizeof *got);
        assert_int_equal(epx_dispatch_rank_lists_from_layout(lay, o, WX - 1, got, NULL, &err),
                         EPX_ERR_INVALID_ARG);
        char w1[32], w2[32];
        snprintf(w1, sizeof w1, "out_width is %d", WX - 1);
        snprintf(w2, sizeof w2, "[G][L][E][%d]", WX);
        TU_MSG_HAS(err.msg, w1, w2);
        assert_int_equal(got[0], 0x7f7f7f7f);
    }
    free(got);
    /* replica-rank order (init_by_eplb): nothing is cut, on any rank */
    need = -1;
    assert_int_equal(epx_dispatch_rank_lists_compute(s, l2p, X, o, 0, NULL, &need, &err), EPX_OK);
    size_t m = (size_t)G * (size_t)L * (size_t)E * (size_t)need;
    got = malloc(m * sizeof *got);
    assert_non_null(got);
    assert_int_equal(epx_dispatch_rank_lists_compute(s, l2p, X, o, need, got, NULL, &err), EPX_OK);
    for (int32_t g = 0; g < G; g++)
        for (size_t le = 0; le < (size_t)L * (size_t)E; le++) {
            const int32_t *row = l2p + le * (size_t)X;
            const int32_t *mine = got + ((size_t)g * (size_t)L * (size_t)E + le) * (size_t)need;
            int32_t k = 0;
            for (int32_t j = 0; j < X; j++)
                if (row[j] >= 0) assert_int_equal(mine[k++], row[j]);
            for (; k < need; k++) assert_int_equal(mine[k], -1);
        }
    free(got);
}

/* Runs every release of one case; returns the number of releases. */
static int run_case(const char *path, const char *name) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (root == NULL) fail_msg("%s: %s", path, je.text);
    epx_shape s = {geti(root, "num_layers"), geti(root, "num_logical_experts"),
                   geti(root, "num_physical_experts"), geti(root, "num_gpus"),
                   geti(root, "num_nodes")};
    int32_t L = s.num_layers, E = s.num_logical_experts, G = s.num_gpus, P = s.num_physical_experts;
    const json_t *l2pj = json_object_get(root, "logical_to_physical_map");
    int32_t X = (int32_t)json_array_size(json_array_get(json_array_get(l2pj, 0), 0));
    int32_t *l2p = malloc(sizeof *l2p * (size_t)L * (size_t)E * (size_t)X);
    int32_t *p2l = malloc(sizeof *p2l * (size_t)L * (size_t)P);
    size_t n = (size_t)G * (size_t)L * (size_t)E;
    int32_t *out = malloc(n * sizeof *out);
    assert_true(l2p && p2l && out);
    assert_int_equal(flat(l2pj, l2p, 0), (size_t)L * (size_t)E * (size_t)X);
    assert_int_equal(flat(json_object_get(root, "physical_to_logical_map"), p2l, 0),
                     (size_t)L * (size_t)P);
    epx_layout *lay = NULL;
    epx_error err = {0};
    if (epx_layout_create_from_map(&s, p2l, &lay, &err) != EPX_OK) fail_msg("%s", err.msg);
    json_t *rel = json_object_get(root, "sglang"), *r;
    const char *ver;
    int ran = 0;
    json_object_foreach(rel, ver, r) {
        epx_table_opts o = EPX_TABLE_OPTS_INIT;
        o.sglang_version = ver;
        memset(out, 0xff, n * sizeof *out);
        if (epx_dispatch_table_compute(&s, l2p, X, &o, out, &err) != EPX_OK)
            fail_msg("%s %s: %s", name, ver, err.msg);
        expect(out, json_object_get(r, "rank_dispatch_from_eplb"), n, name, ver,
               "from logical_to_physical_map");
        memset(out, 0xff, n * sizeof *out);
        if (epx_dispatch_table_from_layout(lay, &o, out, &err) != EPX_OK)
            fail_msg("%s %s: %s", name, ver, err.msg);
        expect(out, json_object_get(r, "rank_dispatch_from_mapping"), n, name, ver,
               "from physical_to_logical_map");
        /* the raw entry point with the ascending lists and init_by_mapping */
        int32_t W = 0;
        const int32_t *asc = epx_layout_logical_to_all_physical(lay, &W);
        o.init_by_mapping = 1;
        memset(out, 0xff, n * sizeof *out);
        assert_int_equal(epx_dispatch_table_compute(&s, asc, W, &o, out, &err), EPX_OK);
        expect(out, json_object_get(r, "rank_dispatch_from_mapping"), n, name, ver,
               "from the ascending lists with init_by_mapping");
        o.init_by_mapping = 0;
        check_rank_lists(&s, lay, l2p, X, &o,
                         json_object_get(r, "logical_to_all_physical_map_"
                                            "from_mapping"),
                         name, ver);
        ran++;
    }
    epx_layout_destroy(lay);
    free(out);
    free(p2l);
    free(l2p);
    json_decref(root);
    return ran;
}

static void release_goldens(void **state) {
    (void)state;
    const char *dir = "data/sglang_tables";
    DIR *d = opendir(dir);
    if (d == NULL) fail_msg("tests/%s is missing (the test runs from tests/)", dir);
    struct dirent *de;
    int cases = 0, runs = 0;
    while ((de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name);
        if (n < 6 || strcmp(de->d_name + n - 5, ".json") != 0) continue;
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        runs += run_case(path, de->d_name);
        cases++;
    }
    closedir(d);
    fprintf(stderr, "%d cases x releases reproduced (%d cases)\n", runs, cases);
    assert_true(cases >= 13);
    assert_int_equal(runs, cases * 9);
}

/* The per-rank passes of a cut table run on threads: the goldens again with
 * one thread, and with three (a count that divides no rank count here). */
static void release_goldens_any_threads(void **state) {
    static const char *counts[] = {"1", "3"};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        setenv("EPX_THREADS", counts[i], 1);
        release_goldens(state);
    }
    unsetenv("EPX_THREADS");
}

/* EPX_THREADS that is not a whole number from 1 is refused by name, not read
 * as a number it happens to start with (a table with a cut runs on threads). */
static void threads_refused(void **state) {
    (void)state;
    const epx_shape s = {1, 4, 6, 2, 1};
    const int32_t p2l[6] = {0, 1, 2, 3, 0, 1};
    epx_layout *lay = NULL;
    epx_error err = {0};
    assert_int_equal(epx_layout_create_from_map(&s, p2l, &lay, &err), EPX_OK);
    epx_table_opts o = EPX_TABLE_OPTS_INIT;
    o.sglang_version = "0.5.23";
    int32_t out[2 * 4];
    char *was = getenv("EPX_THREADS") ? strdup(getenv("EPX_THREADS")) : NULL;
    static const char *bad[] = {"abc", "0", "000", "4x", "-2", " 8", "8 "};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("EPX_THREADS", bad[i], 1);
        memset(&err, 0, sizeof err);
        assert_int_equal(epx_dispatch_table_from_layout(lay, &o, out, &err), EPX_ERR_INVALID_ARG);
        char want[64];
        snprintf(want, sizeof want, "EPX_THREADS=%s:", bad[i]);
        if (strstr(err.msg, want) == NULL) fail_msg("EPX_THREADS=%s: %s", bad[i], err.msg);
    }
    static const char *good[] = {"", "1", "3", "007", "500", "1234567890123"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        setenv("EPX_THREADS", good[i], 1);
        if (epx_dispatch_table_from_layout(lay, &o, out, &err) != EPX_OK)
            fail_msg("EPX_THREADS=%s: %s", good[i], err.msg);
    }
    if (was != NULL)
        setenv("EPX_THREADS", was, 1);
    else
        unsetenv("EPX_THREADS");
    free(was);
    epx_layout_destroy(lay);
}

static void release_strings(void **state) {
    (void)state;
    static const struct {
        const char *s;
        epx_sglang_rule rule;
        int32_t newer;
    } ok[] = {
        {"0.5.2.post3", EPX_SGLANG_RULE_0_5_2, 0},  {"v0.5.2", EPX_SGLANG_RULE_0_5_2, 0},
        {"0.5.2", EPX_SGLANG_RULE_0_5_2, 0},        {"0.5.2.post1", EPX_SGLANG_RULE_0_5_2, 0},
        {"v0.5.3", EPX_SGLANG_RULE_0_5_3, 0},       {"0.5.4", EPX_SGLANG_RULE_0_5_3, 0},
        {"0.5.4.post1", EPX_SGLANG_RULE_0_5_3, 0},  {"0.5.4.post2", EPX_SGLANG_RULE_0_5_4_POST2, 0},
        {"0.5.15", EPX_SGLANG_RULE_0_5_4_POST2, 0}, {"0.5.16", EPX_SGLANG_RULE_0_5_16, 0},
        {"0.5.23", EPX_SGLANG_RULE_0_5_16, 0},      {"0.5.24", EPX_SGLANG_RULE_0_5_16, 1},
        {"0.6.0", EPX_SGLANG_RULE_0_5_16, 1},       {"1.0.0", EPX_SGLANG_RULE_0_5_16, 1},
    };
    epx_error err = {0};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        epx_sglang_rule rule = EPX_SGLANG_RULE_0_5_2;
        int32_t newer = -1;
        if (epx_sglang_table_rule(ok[i].s, &rule, &newer, &err) != EPX_OK)
            fail_msg("%s: %s", ok[i].s, err.msg);
        if (rule != ok[i].rule || newer != ok[i].newer)
            fail_msg("%s: rule %d newer %d, want %d %d", ok[i].s, rule, newer, ok[i].rule,
                     ok[i].newer);
    }
    static const char *bad[] = {
        "",       "0",      "latest",    "0.5.16rc1",  "0.5.x",        "0.5.4.post",
        "0..5",   "0.5",    "0.5.post1", "1.0",        "0.5.2 ",       "0.5.2junk",
        "0.05.2", "+0.5.2", " 0.5.2",    "0.5.2.post", "0.5.2.post-1", "0.5.1234567"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        epx_sglang_rule rule;
        assert_int_equal(epx_sglang_table_rule(bad[i], &rule, NULL, &err), EPX_ERR_INVALID_ARG);
        TU_MSG_HAS(err.msg, "MAJOR.MINOR");
    }
    /* older than the oldest release epx reproduces: refused, naming it */
    static const char *old[] = {"0.4.0", "0.0.0", "0.5.1", "0.5.1.post9", "v0.4.10"};
    for (size_t i = 0; i < sizeof old / sizeof old[0]; i++) {
        epx_sglang_rule rule;
        assert_int_equal(epx_sglang_table_rule(old[i], &rule, NULL, &err), EPX_ERR_INVALID_ARG);
        TU_MSG_HAS(err.msg, "older than " EPX_SGLANG_OLDEST_VERSION, "oldest release");
        epx_eplb_rule erule;
        assert_int_equal(epx_sglang_eplb_rule(old[i], &erule, NULL, &err), EPX_ERR_INVALID_ARG);
        TU_MSG_HAS(err.msg, "older than " EPX_SGLANG_OLDEST_VERSION);
    }
    /* the options carry it; a bad one is refused there too */
    epx_shape s = {1, 2, 4, 2, 1};
    int32_t rep[] = {0, 2, 1, 3}, out[4];
    epx_table_opts o = EPX_TABLE_OPTS_INIT;
    o.sglang_version = "next";
    assert_int_equal(epx_dispatch_table_compute(&s, rep, 2, &o, out, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "'next'");
}

/* The lists' options and sizes are checked before anything is written. */
static void rank_lists_refusals(void **state) {
    (void)state;
    epx_shape s = {1, 2, 4, 2, 1};
    int32_t rep[] = {0, 2, 1, 3}, out[16], need = 0;
    epx_error err = {0};
    epx_table_opts o = EPX_TABLE_OPTS_INIT;
    o.algorithm = EPX_TABLE_EPX;
    assert_int_equal(epx_dispatch_rank_lists_compute(&s, rep, 2, &o, 2, out, NULL, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "EPX_TABLE_SGLANG");
    o = (epx_table_opts)EPX_TABLE_OPTS_INIT;
    o.sglang_version = "0.5.16rc1";
    assert_int_equal(epx_dispatch_rank_lists_compute(&s, rep, 2, &o, 2, out, NULL, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "'0.5.16rc1'");
    o = (epx_table_opts)EPX_TABLE_OPTS_INIT;
    double load[2] = {1, 1};
    o.expected_load = load;
    assert_int_equal(epx_dispatch_rank_lists_compute(&s, rep, 2, &o, 2, out, NULL, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "expected_load");
    int32_t bad[] = {0, 4, 1, 3};
    assert_int_equal(epx_dispatch_rank_lists_compute(&s, bad, 2, NULL, 2, out, NULL, &err),
                     EPX_ERR_INVALID_MAP);
    TU_MSG_HAS(err.msg, "slot 4");
    /* NULL opts: no cut, both rows whole on both ranks */
    assert_int_equal(epx_dispatch_rank_lists_compute(&s, rep, 2, NULL, 0, NULL, &need, &err),
                     EPX_OK);
    assert_int_equal(need, 2);
    assert_int_equal(epx_dispatch_rank_lists_compute(&s, rep, 2, NULL, 3, out, NULL, &err), EPX_OK);
    static const int32_t want[] = {0, 2, -1, 1, 3, -1, 0, 2, -1, 1, 3, -1};
    for (size_t i = 0; i < 12; i++) assert_int_equal(out[i], want[i]);
    /* init_by_mapping from 0.5.4.post2: each rank keeps its own GPU's replica */
    o = (epx_table_opts)EPX_TABLE_OPTS_INIT;
    o.init_by_mapping = 1;
    assert_int_equal(epx_dispatch_rank_lists_compute(&s, rep, 2, &o, 1, out, &need, &err), EPX_OK);
    assert_int_equal(need, 1);
    static const int32_t cut[] = {0, 1, 2, 3};
    for (size_t i = 0; i < 4; i++) assert_int_equal(out[i], cut[i]);
    o.sglang_version = "0.5.4.post1"; /* before the cut */
    assert_int_equal(epx_dispatch_rank_lists_compute(&s, rep, 2, &o, 0, NULL, &need, &err), EPX_OK);
    assert_int_equal(need, 2);
    assert_int_equal(epx_dispatch_rank_lists_from_layout(NULL, NULL, 0, NULL, &need, &err),
                     EPX_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(release_strings), cmocka_unit_test(rank_lists_refusals),
        cmocka_unit_test(release_goldens), cmocka_unit_test(release_goldens_any_threads),
        cmocka_unit_test(threads_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
