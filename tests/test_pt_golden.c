/*
 * test_pt_golden.c - every torch-written fixture reads to exactly what its
 * expected.json says: shared/golden/pt (all of them, when shared/ is
 * present) and the copies in tests/data/pt (always). The per_pass dump is
 * also checked against a reference conversion written here from the tree
 * values; evil_reduce.pt must be refused, naming what it asked for.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static json_t *load_expected(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/expected.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (root == NULL) fail_msg("cannot read %s: %s", path, je.text);
    return root;
}

/* Flatten a nested JSON list of numbers; returns the count. */
static size_t flatten(const json_t *a, double *out, size_t cap) {
    if (json_is_number(a)) {
        assert_true(cap >= 1);
        out[0] = json_number_value(a);
        return 1;
    }
    assert_true(json_is_array(a));
    size_t n = 0;
    for (size_t i = 0; i < json_array_size(a); i++)
        n += flatten(json_array_get(a, i), out + n, cap - n);
    return n;
}

static void assert_equal_to_json(const double *got, size_t n, const json_t *want,
                                 const char *what) {
    double *w = malloc((n + 1) * sizeof *w);
    size_t m = flatten(want, w, n + 1);
    if (m != n) fail_msg("%s: %zu values, expected.json has %zu", what, n, m);
    for (size_t i = 0; i < n; i++)
        if (got[i] != w[i]) fail_msg("%s[%zu] = %.17g, expected %.17g", what, i, got[i], w[i]);
    free(w);
}

static double *tensor_f64(const epx_pt_value *v, epx_pt_tensor *t, size_t *n) {
    epx_error err = {0};
    assert_int_equal(epx_pt_value_tensor(v, t, &err), EPX_OK);
    int64_t numel = 0;
    assert_int_equal(epx_pt_tensor_numel(t, &numel, &err), EPX_OK);
    double *x = malloc((size_t)(numel + 1) * sizeof *x);
    assert_int_equal(epx_pt_tensor_to_f64(t, x, (size_t)numel, &err), EPX_OK);
    *n = (size_t)numel;
    return x;
}

static void check_mapping(const char *path, const json_t *exp) {
    int32_t *map = NULL, L = 0, P = 0;
    epx_error err = {0};
    if (epx_mapping_read(path, &map, &L, &P, &err) != EPX_OK) fail_msg("%s", err.msg);
    const json_t *want = json_object_get(exp, "physical_to_logical_map");
    assert_int_equal(L, (int)json_array_size(want));
    assert_int_equal(P, (int)json_array_size(json_array_get(want, 0)));
    double *got = malloc(sizeof *got * (size_t)(L * P));
    for (int i = 0; i < L * P; i++) got[i] = map[i];
    assert_equal_to_json(got, (size_t)(L * P), want, path);
    free(got);
    epx_free(map);
    /* A mapping is not a load: the counts reader says so. */
    epx_counts *c = NULL;
    assert_int_equal(epx_counts_read(path, &c, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "physical_to_logical_map", "placement");
}

static void check_init_counts(const char *path, const json_t *exp) {
    epx_counts *c = NULL;
    epx_error err = {0};
    if (epx_counts_read(path, &c, &err) != EPX_OK) fail_msg("%s", err.msg);
    const json_t *want = json_object_get(exp, "logical_count");
    assert_int_equal(c->num_windows, 1);
    assert_int_equal(c->num_layers, (int)json_array_size(want));
    assert_int_equal(c->num_experts, (int)json_array_size(json_array_get(want, 0)));
    assert_equal_to_json(c->data, (size_t)c->num_layers * (size_t)c->num_experts, want, path);
    epx_counts_destroy(c);
    /* and the mapping reader calls it a counts file, which init.c relies on */
    int32_t *map = NULL, L, P;
    assert_int_equal(epx_mapping_read(path, &map, &L, &P, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "it is a counts file");
}

static void check_scalars(const epx_pt_value *root, const json_t *exp) {
    int64_t rank = -1;
    epx_error err = {0};
    assert_int_equal(epx_pt_value_int(epx_pt_dict_get(root, "rank"), &rank, &err), EPX_OK);
    assert_int_equal(rank, json_integer_value(json_object_get(exp, "rank")));
    const json_t *u = json_object_get(exp, "average_utilization_rate_over_window");
    const epx_pt_value *v = epx_pt_dict_get(root, "average_utilization_rate_over_window");
    if (json_is_null(u)) {
        assert_non_null(v);
        assert_int_equal(epx_pt_value_kind(v), EPX_PT_NONE);
    } else {
        double x = 0;
        assert_int_equal(epx_pt_value_float(v, &x, &err), EPX_OK);
        assert_true(x == json_number_value(u));
    }
}

static void check_stat_dump(const char *path, const json_t *exp) {
    epx_counts *c = NULL;
    epx_error err = {0};
    if (epx_counts_read(path, &c, &err) != EPX_OK) fail_msg("%s", err.msg);
    const size_t n = (size_t)c->num_windows * (size_t)c->num_layers * (size_t)c->num_experts;
    if (json_object_get(exp, "logical_count")) {
        const json_t *want = json_object_get(exp, "logical_count");
        assert_int_equal(c->num_windows, (int)json_array_size(want));
        assert_equal_to_json(c->data, n, want, path);
    } else {
        const json_t *shape = json_object_get(exp, "shape");
        assert_int_equal(c->num_windows, json_integer_value(json_array_get(shape, 0)));
        assert_int_equal(c->num_layers, json_integer_value(json_array_get(shape, 1)));
        assert_int_equal(c->num_experts, json_integer_value(json_array_get(shape, 2)));
        double sum = 0;
        for (size_t i = 0; i < n; i++) sum += c->data[i];
        assert_true(sum == json_number_value(json_object_get(exp, "sum")));
        const json_t *row = json_object_get(exp, "first_row_layer1");
        assert_equal_to_json(epx_counts_row(c, 0, 1), json_array_size(row), row, path);
    }
    epx_counts_destroy(c);
    epx_pt_file *f = NULL;
    assert_int_equal(epx_pt_load(path, &f, &err), EPX_OK);
    check_scalars(epx_pt_file_root(f), exp);
    epx_pt_file_destroy(f);
}

/* The reference: SGLang's scatter-add of slot counts onto their experts,
 * written directly from the tree's values. */
static void check_per_pass(const char *path, const json_t *exp) {
    epx_pt_file *f = NULL;
    epx_error err = {0};
    if (epx_pt_load(path, &f, &err) != EPX_OK) fail_msg("%s", err.msg);
    const epx_pt_value *root = epx_pt_file_root(f);
    const epx_pt_value *recs = epx_pt_dict_get(root, "records");
    const size_t R = epx_pt_value_len(recs);
    assert_int_equal(R, json_integer_value(json_object_get(exp, "num_records")));
    const json_t *ids = json_object_get(exp, "forward_pass_ids");
    for (size_t r = 0; r < R; r++) {
        int64_t id = -1;
        assert_int_equal(
            epx_pt_value_int(epx_pt_dict_get(epx_pt_value_item(recs, r), "forward_pass_id"), &id,
                             &err),
            EPX_OK);
        assert_int_equal(id, json_integer_value(json_array_get(ids, r)));
        size_t klen = 0;
        const char *gk =
            epx_pt_value_string(epx_pt_dict_get(epx_pt_value_item(recs, r), "gatherer_key"), &klen);
        assert_non_null(gk);
        assert_string_equal(gk, "primary");
    }
    epx_pt_tensor t, tm;
    size_t n = 0, nm = 0;
    double *g0 =
        tensor_f64(epx_pt_dict_get(epx_pt_value_item(recs, 0), "global_physical_count"), &t, &n);
    assert_equal_to_json(g0, n, json_object_get(exp, "global_physical_count_0"), "gpc_0");
    free(g0);
    double *map = tensor_f64(epx_pt_dict_get(root, "last_physical_to_logical_map"), &tm, &nm);
    const json_t *row0 = json_object_get(exp, "last_physical_to_logical_map_row0");
    assert_equal_to_json(map, json_array_size(row0), row0, "map row 0");
    const int64_t L = tm.shape[0], P = tm.shape[1];
    int64_t E = 0;
    for (size_t i = 0; i < nm; i++)
        if ((int64_t)map[i] + 1 > E) E = (int64_t)map[i] + 1;

    epx_counts *c = NULL;
    if (epx_counts_read(path, &c, &err) != EPX_OK) fail_msg("%s", err.msg);
    assert_int_equal(c->num_windows, (int)R); /* one rank: one window per record */
    assert_int_equal(c->num_layers, L);
    assert_int_equal(c->num_experts, E);
    double *ref = calloc((size_t)(L * E), sizeof *ref);
    for (size_t r = 0; r < R; r++) {
        double *g = tensor_f64(epx_pt_dict_get(epx_pt_value_item(recs, r), "global_physical_count"),
                               &t, &n);
        memset(ref, 0, sizeof *ref * (size_t)(L * E));
        for (int64_t l = 0; l < L; l++)
            for (int64_t p = 0; p < P; p++) ref[l * E + (int64_t)map[l * P + p]] += g[l * P + p];
        for (int64_t l = 0; l < L; l++)
            for (int64_t e = 0; e < E; e++)
                if (epx_counts_row(c, (int32_t)r, (int32_t)l)[e] != ref[l * E + e])
                    fail_msg("pass %zu layer %lld expert %lld: %g, reference %g", r, (long long)l,
                             (long long)e, epx_counts_row(c, (int32_t)r, (int32_t)l)[e],
                             ref[l * E + e]);
        free(g);
    }
    free(ref);
    free(map);
    epx_counts_destroy(c);
    epx_pt_file_destroy(f);
}

static void check_refused(const char *path) {
    epx_error err = {0};
    epx_pt_file *f = NULL;
    assert_int_equal(epx_pt_load(path, &f, &err), EPX_ERR_REFUSED);
    assert_null(f);
    /* torch's fixture pickles os.system, which CPython spells posix.system */
    TU_MSG_HAS(err.msg, "posix.system", "refused", "nothing was executed");
    epx_counts *c = NULL;
    assert_int_equal(epx_counts_read(path, &c, &err), EPX_ERR_REFUSED);
    TU_MSG_HAS(err.msg, "posix.system");
    int32_t *map = NULL, L, P;
    assert_int_equal(epx_mapping_read(path, &map, &L, &P, &err), EPX_ERR_REFUSED);
}

/* Check every entry of DIR/expected.json; returns how many. */
static int check_dir(const char *dir) {
    json_t *all = load_expected(dir);
    const char *name;
    json_t *exp;
    int n = 0;
    json_object_foreach(all, name, exp) {
        char path[4300];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        const char *kind = json_string_value(json_object_get(exp, "kind"));
        assert_non_null(kind);
        fprintf(stderr, "  %s (%s)\n", path, kind);
        if (strcmp(kind, "init_mapping") == 0)
            check_mapping(path, exp);
        else if (strcmp(kind, "init_counts") == 0)
            check_init_counts(path, exp);
        else if (strcmp(kind, "stat_dump") == 0)
            check_stat_dump(path, exp);
        else if (strcmp(kind, "per_pass") == 0)
            check_per_pass(path, exp);
        else if (strcmp(kind, "must_refuse") == 0)
            check_refused(path);
        else
            fail_msg("%s: unknown fixture kind '%s': teach this test about it", path, kind);
        n++;
    }
    json_decref(all);
    return n;
}

static void shared_fixtures(void **state) {
    (void)state;
    const char *shared = tu_shared_dir();
    if (shared == NULL) skip();
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/golden/pt", shared);
    assert_true(check_dir(dir) >= 8);
}

static void local_fixtures(void **state) {
    (void)state;
    assert_int_equal(check_dir("data/pt"), 4);
}

/* Loading from memory gives the same tree as loading from the file. */
static void buffer_equals_file(void **state) {
    (void)state;
    size_t len = 0;
    char *bytes = tu_read_file("data/pt/strided_counts.pt", &len);
    assert_non_null(bytes);
    epx_pt_file *a = NULL, *b = NULL;
    epx_error err = {0};
    assert_int_equal(epx_pt_load("data/pt/strided_counts.pt", &a, &err), EPX_OK);
    assert_int_equal(epx_pt_load_buffer(bytes, len, "mem", &b, &err), EPX_OK);
    free(bytes); /* the loaded file keeps its own copies */
    epx_pt_tensor ta, tb;
    size_t na, nb;
    double *xa = tensor_f64(epx_pt_dict_get(epx_pt_file_root(a), "logical_count"), &ta, &na);
    double *xb = tensor_f64(epx_pt_dict_get(epx_pt_file_root(b), "logical_count"), &tb, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(xa, xb, na * sizeof *xa);
    /* the fixture is stored transposed: strides (1, L) */
    assert_int_equal(ta.ndim, 2);
    assert_int_equal(ta.strides[0], 1);
    assert_int_equal(ta.strides[1], ta.shape[0]);
    assert_int_equal(ta.dtype, EPX_PT_DTYPE_INT32);
    assert_string_equal(epx_pt_file_name(b), "mem");
    free(xa);
    free(xb);
    epx_pt_file_destroy(a);
    epx_pt_file_destroy(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(local_fixtures),
        cmocka_unit_test(shared_fixtures),
        cmocka_unit_test(buffer_equals_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
