/*
 * test_io_mapping.c - SGLang mapping and counts files: JSON round trips,
 * inline JSON, and every malformed input with the message it must give;
 * plus the --init-expert-location entry point.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static epx_status parse(const char *json, int32_t **map, int32_t *L, int32_t *P, epx_error *err) {
    return epx_mapping_parse_json(json, strlen(json), map, L, P, err);
}

static void mapping_round_trip(void **state) {
    (void)state;
    tu_rng r = {tu_seed(7)};
    for (int iter = 0; iter < 20; iter++) {
        int32_t G = 1 + (int32_t)tu_below(&r, 8), E = G * (1 + (int32_t)tu_below(&r, 6));
        int32_t P = E + G * (int32_t)tu_below(&r, 3), L = 1 + (int32_t)tu_below(&r, 5);
        int32_t *map = malloc(sizeof(int32_t) * (size_t)(L * P));
        for (int i = 0; i < L * P; i++)
            map[i] = (i % P) < E ? i % P : (int32_t)tu_below(&r, (uint32_t)E);
        epx_shape s = {L, E, P, G, 1};
        epx_layout *lay = NULL;
        epx_error err = {0};
        assert_int_equal(epx_layout_create_from_map(&s, map, &lay, &err), EPX_OK);
        char *path = tu_tmp_path(".json");
        assert_int_equal(epx_layout_write_json(lay, path, &err), EPX_OK);
        /* The file holds exactly one key, as SGLang requires. */
        char *text = tu_read_file(path, NULL);
        assert_non_null(text);
        assert_non_null(strstr(text, "\"physical_to_logical_map\""));
        assert_null(strstr(text, "\"logical"));
        int32_t *back = NULL, L2 = 0, P2 = 0;
        assert_int_equal(epx_mapping_read(path, &back, &L2, &P2, &err), EPX_OK);
        assert_int_equal(L2, L);
        assert_int_equal(P2, P);
        assert_memory_equal(back, map, sizeof(int32_t) * (size_t)(L * P));
        /* And the same text inline. */
        epx_free(back);
        assert_int_equal(epx_mapping_read(text, &back, &L2, &P2, &err), EPX_OK);
        assert_memory_equal(back, map, sizeof(int32_t) * (size_t)(L * P));
        epx_free(back);
        free(text);
        remove(path);
        free(path);
        epx_layout_destroy(lay);
        free(map);
    }
}

static void mapping_errors_explain(void **state) {
    (void)state;
    int32_t *m = NULL, L, P;
    epx_error err = {0};
    assert_int_equal(parse("{\"physical_to_logical_map\": [[0,1],[0]]}", &m, &L, &P, &err),
                     EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "[1]", "ragged");
    assert_int_equal(parse("{\"physical_to_logical_map\": [[0,1.5]]}", &m, &L, &P, &err),
                     EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "[0][1]", "1.5", "not an integer");
    assert_int_equal(parse("{\"physical_to_logical_map\": [[0,\"x\"]]}", &m, &L, &P, &err),
                     EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "[0][1]", "not an integer");
    assert_int_equal(parse("{\"physical_to_logical_map\": [[0,-3]]}", &m, &L, &P, &err),
                     EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "-3");
    assert_int_equal(parse("{\"physical_to_logical_map\": [[0,99999999999]]}", &m, &L, &P, &err),
                     EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "99999999999");
    /* an id an int32 holds but past EPX_MAX_EXPERTS: named where it stands
     * (max id + 1 overflowed and blamed "-2147483648 experts") */
    assert_int_equal(
        parse("{\"physical_to_logical_map\": [[0,1],[2,2147483647]]}", &m, &L, &P, &err),
        EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "layer 1, slot 1", "2147483647", "1048576");
    assert_int_equal(parse("{\"physical_to_logical_map\": [[0,1]", &m, &L, &P, &err),
                     EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "line 1", "not valid JSON");
    assert_int_equal(parse("{\"physical_to_logical_map\": [0,1]}", &m, &L, &P, &err),
                     EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "must be a nested list of depth 2, got a list of depth 1");
    /* null, not "depth 2 (2, got depth 0" */
    assert_int_equal(parse("{\"physical_to_logical_map\": null}", &m, &L, &P, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "must be a nested list of depth 2, got null");
    assert_null(strstr(err.msg, "(2"));
    /* a whole real: how it is written, not "is 3, not an integer" */
    assert_int_equal(parse("{\"physical_to_logical_map\": [[0,3e0]]}", &m, &L, &P, &err),
                     EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "[0][1] is written as a real number", "write it as 3");
    assert_int_equal(parse("{\"physical_to_logical_map\": [[[0]]]}", &m, &L, &P, &err),
                     EPX_ERR_PARSE);
    assert_int_equal(parse("{\"physical_to_logical_map\": []}", &m, &L, &P, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "empty");
    assert_int_equal(parse("{\"other\": 1}", &m, &L, &P, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "physical_to_logical_map");
    assert_int_equal(parse("{\"logical_count\": [[1,2]]}", &m, &L, &P, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "counts file");
    assert_int_equal(parse("[1,2]", &m, &L, &P, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "JSON object");
    assert_int_equal(epx_mapping_read("/nonexistent/x.json", &m, &L, &P, &err), EPX_ERR_IO);
    TU_MSG_HAS(err.msg, "/nonexistent/x.json");
    /* Other keys are ignored, as SGLang ignores them. */
    assert_int_equal(parse("{\"physical_to_logical_map\": [[1,0]], \"x\": 3}", &m, &L, &P, &err),
                     EPX_OK);
    assert_int_equal(m[0], 1);
    epx_free(m);
}

/* A ragged list whose first row is long is refused as ragged before
 * anything is sized from that row: 2^21 entries then 65,535 rows of one
 * (4.4 MB of text) asked calloc for 512 GiB (NOMEM, or an abort under
 * ASan) before the walk that finds the ragged row. */
static void ragged_rows_before_sizes(void **state) {
    (void)state;
    const size_t first = (size_t)1 << 21, rows = 65536;
    const char *head = "{\"physical_to_logical_map\": [[";
    char *text = malloc(strlen(head) + 2 * first + 4 * rows + 8);
    assert_non_null(text);
    size_t n = (size_t)sprintf(text, "%s", head);
    for (size_t i = 0; i < first; i++) n += (size_t)sprintf(text + n, i ? ",0" : "0");
    n += (size_t)sprintf(text + n, "]");
    for (size_t r = 1; r < rows; r++) n += (size_t)sprintf(text + n, ",[0]");
    sprintf(text + n, "]}");
    int32_t *m = NULL, L = 0, P = 0;
    epx_error err = {0};
    assert_int_equal(parse(text, &m, &L, &P, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "ragged rows", "[1] has 1 entries");
    assert_null(m);
    free(text);
}

static void counts_read_and_write(void **state) {
    (void)state;
    epx_counts *c = NULL;
    epx_error err = {0};
    assert_int_equal(
        epx_counts_read("{\"logical_count\": [[1, 2.5], [0, 3]], \"rank\": 0}", &c, &err), EPX_OK);
    assert_int_equal(c->num_windows, 1);
    assert_int_equal(c->num_layers, 2);
    assert_int_equal(c->num_experts, 2);
    assert_true(c->data[1] == 2.5);
    char *path = tu_tmp_path(".json");
    assert_int_equal(epx_counts_write_json(c, path, &err), EPX_OK);
    epx_counts *d = NULL;
    assert_int_equal(epx_counts_read(path, &d, &err), EPX_OK);
    assert_memory_equal(c->data, d->data, 4 * sizeof(double));
    epx_counts_destroy(d);
    epx_counts_destroy(c);
    assert_int_equal(
        epx_counts_read("{\"logical_count\": [[[1,2],[3,4]],[[5,6],[7,8]],[[0,0],[0,1]]]}", &c,
                        &err),
        EPX_OK);
    assert_int_equal(c->num_windows, 3);
    assert_true(epx_counts_row(c, 2, 1)[1] == 1.0);
    double sum[4];
    assert_int_equal(epx_counts_sum_windows(c, 0, 3, sum, &err), EPX_OK);
    assert_true(sum[0] == 6.0 && sum[3] == 13.0);
    assert_int_equal(epx_counts_sum_windows(c, 2, 2, sum, &err), EPX_ERR_INVALID_ARG);
    assert_int_equal(epx_counts_write_json(c, path, &err), EPX_OK);
    assert_int_equal(epx_counts_read(path, &d, &err), EPX_OK);
    assert_int_equal(d->num_windows, 3);
    assert_memory_equal(c->data, d->data, 12 * sizeof(double));
    epx_counts_destroy(d);
    epx_counts_destroy(c);
    remove(path);
    free(path);
    assert_int_equal(epx_counts_read("{\"logical_count\": [[1, -2]]}", &c, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "[0][1]", "-2", "non-negative");
    assert_int_equal(epx_counts_read("{\"logical_count\": [[1, \"a\"]]}", &c, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "not a number");
    /* past 2^53 a count must be a double's value, or it would come back
     * changed: 2^53 + 2 is one, 2^53 + 1 is not (it would read as 2^53) */
    assert_int_equal(epx_counts_read("{\"logical_count\": [[1, 9007199254740994]]}", &c, &err),
                     EPX_OK);
    assert_true(c->data[1] == 0x1p53 + 2);
    c->data[0] = 0x1p60; /* written back as integers, digit for digit */
    char *big = tu_tmp_path(".json");
    assert_int_equal(epx_counts_write_json(c, big, &err), EPX_OK);
    char *text = tu_read_file(big, NULL);
    TU_MSG_HAS(text, "[1152921504606846976, 9007199254740994]");
    free(text);
    remove(big);
    free(big);
    epx_counts_destroy(c);
    assert_int_equal(epx_counts_read("{\"logical_count\": [[1, 9007199254740993]]}", &c, &err),
                     EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "[0][1]", "9007199254740993", "9007199254740992", "2^53");
    assert_int_equal(epx_counts_read("{\"physical_to_logical_map\": [[1, 0]]}", &c, &err),
                     EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "placement");
}

static void init_entry_point(void **state) {
    (void)state;
    epx_init_opts o = EPX_INIT_OPTS_INIT;
    epx_layout *lay = NULL;
    epx_error err = {0};
    /* No GPUs given: an explained error, never a missing layout. */
    assert_int_equal(epx_layout_init("trivial", &o, &lay, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "num_gpus");
    assert_null(lay);
    o.num_gpus = 4;
    assert_int_equal(epx_layout_init("trivial", &o, &lay, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "num_layers", "num_logical_experts");
    o.num_layers = 3;
    o.num_logical_experts = 8;
    o.num_redundant = 4;
    assert_int_equal(epx_layout_init("trivial", &o, &lay, &err), EPX_OK);
    assert_int_equal(epx_layout_shape(lay)->num_physical_experts, 12);
    epx_layout_destroy(lay);
    lay = NULL;
    epx_init_opts m = EPX_INIT_OPTS_INIT;
    m.num_gpus = 2;
    assert_int_equal(
        epx_layout_init("{\"physical_to_logical_map\": [[0,1,2,3],[3,2,1,0]]}", &m, &lay, &err),
        EPX_OK);
    assert_int_equal(epx_layout_shape(lay)->num_logical_experts, 4); /* inferred */
    epx_layout_destroy(lay);
    lay = NULL;
    m.num_gpus = 3;
    assert_int_equal(epx_layout_init("{\"physical_to_logical_map\": [[0,1,2,3]]}", &m, &lay, &err),
                     EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "(4)", "(3)");
    m.num_gpus = 2;
    m.num_layers = 5;
    assert_int_equal(epx_layout_init("{\"physical_to_logical_map\": [[0,1,2,3]]}", &m, &lay, &err),
                     EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "1 layers", "5");
    epx_init_opts bad = EPX_INIT_OPTS_INIT;
    bad.version = 99;
    assert_int_equal(epx_layout_init("trivial", &bad, &lay, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "EPX_INIT_OPTS_INIT");
    assert_int_equal(epx_layout_init("/nonexistent.json", &m, &lay, &err), EPX_ERR_IO);
    assert_null(lay);
}

/* Options that are negative, unknown, contradictory or overflow P are
 * refused by name, for every form of the spec (never ignored). */
static void init_options_checked(void **state) {
    (void)state;
    const char *map = "{\"physical_to_logical_map\": [[0,1,2,3],[3,2,1,0]]}";
    const char *cnt = "{\"logical_count\": [[5,1,2,3],[3,2,1,9]]}";
    epx_layout *lay = NULL;
    epx_error err = {0};
    epx_init_opts o = EPX_INIT_OPTS_INIT;
    o.num_gpus = 2;
    o.num_layers = 2;
    o.num_logical_experts = 4;
    o.num_redundant = INT32_MAX; /* 4 + 2^31 - 1 overflowed int32 */
    assert_int_equal(epx_layout_init("trivial", &o, &lay, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "num_redundant 2147483647", "above the limit");
    assert_int_equal(epx_layout_init(cnt, &o, &lay, &err), EPX_ERR_SHAPE);
    o.num_redundant = 4;
    o.num_physical = 6; /* 4 + 4 is 8 */
    assert_int_equal(epx_layout_init("trivial", &o, &lay, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "num_physical (6) and num_redundant (4) disagree", "8 slots");
    assert_int_equal(epx_layout_init(cnt, &o, &lay, &err), EPX_ERR_INVALID_ARG);
    o.num_physical = 8;
    assert_int_equal(epx_layout_init("trivial", &o, &lay, &err), EPX_OK);
    epx_layout_destroy(lay);
    lay = NULL;
    epx_init_opts m = EPX_INIT_OPTS_INIT;
    m.num_gpus = 2;
    m.num_redundant = 3; /* the mapping has 4 slots for 4 experts: was ignored */
    assert_int_equal(epx_layout_init(map, &m, &lay, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "num_redundant 3 asks for 7", "--ep-num-redundant-experts 0");
    const char *names[] = {"num_nodes", "num_logical_experts", "num_layers", "num_physical",
                           "num_groups"};
    for (int i = 0; i < 5; i++) {
        epx_init_opts n = EPX_INIT_OPTS_INIT;
        n.num_gpus = 2;
        int32_t *f[] = {&n.num_nodes, &n.num_logical_experts, &n.num_layers, &n.num_physical,
                        &n.num_groups};
        *f[i] = -5;
        assert_int_equal(epx_layout_init(map, &n, &lay, &err), EPX_ERR_INVALID_ARG);
        TU_MSG_HAS(err.msg, names[i], "(-5) must be >= 0");
        assert_null(lay);
    }
    epx_init_opts a = EPX_INIT_OPTS_INIT;
    a.num_gpus = 2;
    a.algorithm = (epx_algorithm)77;
    assert_int_equal(epx_layout_init(map, &a, &lay, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "algorithm 77 is unknown");
    a.algorithm = EPX_ALGO_DEEPSEEK;
    a.sglang_version = "garbage";
    assert_int_equal(epx_layout_init(map, &a, &lay, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "garbage");
    a.sglang_version = "0.5.23";
    assert_int_equal(epx_layout_init(map, &a, &lay, &err), EPX_OK);
    epx_layout_destroy(lay);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mapping_round_trip),       cmocka_unit_test(mapping_errors_explain),
        cmocka_unit_test(ragged_rows_before_sizes), cmocka_unit_test(counts_read_and_write),
        cmocka_unit_test(init_entry_point),         cmocka_unit_test(init_options_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
