/*
 * test_eplb_golden.c - DeepSeek EPLB parity on the golden vectors, by the
 * rules of shared/golden/README.md: logical_count identical in every case;
 * the sorted experts of every GPU identical in every `float` case; per-layer
 * balancedness within 1e-9 in every case. Runs the 134 cases of
 * ../shared/golden/eplb when shared/ is there, and always the handful copied
 * into tests/data/eplb, through epx_plan_deepseek and through
 * epx_plan_compute.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

typedef struct gcase {
    char name[128];
    int is_float;
    int32_t L, E, groups, nodes, G, P;
    float *w;     /* [L][E] */
    int32_t *p2l; /* [L][P] reference */
    int32_t *cnt; /* [L][E] reference */
} gcase;

static void case_free(gcase *c) {
    free(c->w);
    free(c->p2l);
    free(c->cnt);
}

#define CASE_CHECK(c, cond, ...)                                                                   \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "case %s: ", (c)->name);                                               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            fail();                                                                                \
        }                                                                                          \
    } while (0)

static int32_t get_int(const json_t *o, const char *k) {
    const json_t *v = json_object_get(o, k);
    assert_true(json_is_integer(v));
    return (int32_t)json_integer_value(v);
}

/* rows x cols numbers of a 2-D array into doubles. */
static void read_2d(const json_t *arr, int32_t rows, int32_t cols, double *out) {
    assert_true(json_is_array(arr));
    assert_int_equal(json_array_size(arr), (size_t)rows);
    for (int32_t r = 0; r < rows; r++) {
        const json_t *row = json_array_get(arr, (size_t)r);
        assert_int_equal(json_array_size(row), (size_t)cols);
        for (int32_t c = 0; c < cols; c++)
            out[(size_t)r * (size_t)cols + (size_t)c] =
                json_number_value(json_array_get(row, (size_t)c));
    }
}

static void load_case(const char *path, gcase *c) {
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (root == NULL) fprintf(stderr, "%s: %s (line %d)\n", path, jerr.text, jerr.line);
    assert_non_null(root);
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", json_string_value(json_object_get(root, "name")));
    c->is_float = strcmp(json_string_value(json_object_get(root, "weight_kind")), "float") == 0;
    c->L = get_int(root, "num_layers");
    c->E = get_int(root, "num_logical_experts");
    c->groups = get_int(root, "num_groups");
    c->nodes = get_int(root, "num_nodes");
    c->G = get_int(root, "num_gpus");
    c->P = get_int(root, "num_physical_experts");
    const size_t LE = (size_t)c->L * (size_t)c->E, LP = (size_t)c->L * (size_t)c->P;
    double *tmp = malloc(sizeof(double) * (LE > LP ? LE : LP));
    c->w = malloc(sizeof(float) * LE);
    c->cnt = malloc(sizeof(int32_t) * LE);
    c->p2l = malloc(sizeof(int32_t) * LP);
    read_2d(json_object_get(root, "weight"), c->L, c->E, tmp);
    for (size_t i = 0; i < LE; i++) c->w[i] = (float)tmp[i];
    read_2d(json_object_get(root, "logical_count"), c->L, c->E, tmp);
    for (size_t i = 0; i < LE; i++) c->cnt[i] = (int32_t)tmp[i];
    read_2d(json_object_get(root, "physical_to_logical_map"), c->L, c->P, tmp);
    for (size_t i = 0; i < LP; i++) c->p2l[i] = (int32_t)tmp[i];
    free(tmp);
    json_decref(root);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static epx_layout *layout_of(const gcase *c, const int32_t *map) {
    epx_shape s = {c->L, c->E, c->P, c->G, 1};
    epx_layout *lay = NULL;
    epx_error err = {0};
    epx_status st = epx_layout_create_from_map(&s, map, &lay, &err);
    CASE_CHECK(c, st == EPX_OK, "layout: %s", err.msg);
    return lay;
}

static void check_case(const gcase *c) {
    const int32_t L = c->L, E = c->E, P = c->P, G = c->G, X = P - E + 1, spg = P / G;
    const size_t LE = (size_t)L * (size_t)E, LP = (size_t)L * (size_t)P;
    int32_t *p2l = malloc(sizeof(int32_t) * LP), *cnt = malloc(sizeof(int32_t) * LE);
    int32_t *l2p = malloc(sizeof(int32_t) * LE * (size_t)X);
    epx_error err = {0};
    const int hier = c->groups % c->nodes == 0; /* the reference's own rule */
    epx_status st =
        epx_plan_deepseek(c->w, L, E, P, c->groups, c->nodes, G, hier, p2l, l2p, cnt, &err);
    CASE_CHECK(c, st == EPX_OK, "epx_plan_deepseek: %s", err.msg);

    /* logical_count: identical. */
    for (size_t i = 0; i < LE; i++)
        CASE_CHECK(c, cnt[i] == c->cnt[i], "logical_count[%zu][%zu] = %d, reference %d",
                   i / (size_t)E, i % (size_t)E, cnt[i], c->cnt[i]);

    /* log_to_phys agrees with phys_to_log and the counts. */
    for (int32_t l = 0; l < L; l++)
        for (int32_t e = 0; e < E; e++) {
            const int32_t *r = l2p + ((size_t)l * (size_t)E + (size_t)e) * (size_t)X;
            const int32_t n = cnt[(size_t)l * (size_t)E + (size_t)e];
            for (int32_t k = 0; k < X; k++) {
                if (k < n)
                    CASE_CHECK(
                        c, r[k] >= 0 && r[k] < P && p2l[(size_t)l * (size_t)P + (size_t)r[k]] == e,
                        "log_to_phys[%d][%d][%d] = %d does not hold expert %d", l, e, k, r[k], e);
                else
                    CASE_CHECK(c, r[k] == -1, "log_to_phys[%d][%d][%d] = %d, expected -1", l, e, k,
                               r[k]);
            }
        }

    /* The sorted experts of each GPU: identical in float cases. */
    if (c->is_float) {
        int32_t *a = malloc(sizeof(int32_t) * (size_t)spg),
                *b = malloc(sizeof(int32_t) * (size_t)spg);
        for (int32_t l = 0; l < L; l++)
            for (int32_t g = 0; g < G; g++) {
                memcpy(a, p2l + (size_t)l * (size_t)P + (size_t)g * (size_t)spg,
                       sizeof(int32_t) * (size_t)spg);
                memcpy(b, c->p2l + (size_t)l * (size_t)P + (size_t)g * (size_t)spg,
                       sizeof(int32_t) * (size_t)spg);
                qsort(a, (size_t)spg, sizeof *a, cmp_i32);
                qsort(b, (size_t)spg, sizeof *b, cmp_i32);
                CASE_CHECK(c, memcmp(a, b, sizeof(int32_t) * (size_t)spg) == 0,
                           "layer %d, GPU %d holds other experts than the reference", l, g);
            }
        free(a);
        free(b);
    }

    /* Balancedness per layer, within 1e-9. */
    double *load = malloc(sizeof(double) * LE);
    for (size_t i = 0; i < LE; i++) load[i] = (double)c->w[i];
    epx_layout *mine = layout_of(c, p2l), *ref = layout_of(c, c->p2l);
    epx_layer_balance *bm = malloc(sizeof *bm * (size_t)L), *br = malloc(sizeof *br * (size_t)L);
    epx_balance sm, sr;
    assert_int_equal(epx_balance_compute(mine, load, NULL, &sm, bm, &err), EPX_OK);
    assert_int_equal(epx_balance_compute(ref, load, NULL, &sr, br, &err), EPX_OK);
    for (int32_t l = 0; l < L; l++)
        CASE_CHECK(c, fabs(bm[l].balancedness - br[l].balancedness) <= 1e-9,
                   "layer %d balancedness %.12f, reference %.12f", l, bm[l].balancedness,
                   br[l].balancedness);
    CASE_CHECK(c, fabs(sm.balancedness - sr.balancedness) <= 1e-9, "balancedness %.12f vs %.12f",
               sm.balancedness, sr.balancedness);

    /* The same through the plan API, from a one-window load. */
    epx_counts *counts = NULL;
    assert_int_equal(epx_counts_create(1, L, E, &counts, &err), EPX_OK);
    memcpy(counts->data, load, sizeof(double) * LE);
    epx_shape shape = {L, E, P, G, hier ? c->nodes : 1};
    epx_plan_opts o = EPX_PLAN_OPTS_INIT;
    const int global = c->groups == 1 && c->nodes == 1;
    o.algorithm = global ? EPX_ALGO_DEEPSEEK : EPX_ALGO_DEEPSEEK_HIERARCHICAL;
    o.num_groups = global ? 0 : c->groups;
    epx_plan *plan = NULL;
    st = epx_plan_compute(counts, &shape, &o, &plan, &err);
    CASE_CHECK(c, st == EPX_OK, "epx_plan_compute: %s", err.msg);
    CASE_CHECK(c,
               memcmp(epx_layout_physical_to_logical(epx_plan_layout(plan)), p2l,
                      sizeof(int32_t) * LP) == 0,
               "epx_plan_compute and epx_plan_deepseek disagree");
    epx_plan_destroy(plan);
    /* The global policy is the hierarchical one with one group on one node. */
    if (global) {
        int32_t *p2 = malloc(sizeof(int32_t) * LP);
        assert_int_equal(epx_plan_deepseek(c->w, L, E, P, 1, 1, G, 0, p2, NULL, NULL, &err),
                         EPX_OK);
        CASE_CHECK(c, memcmp(p2, p2l, sizeof(int32_t) * LP) == 0,
                   "global and hierarchical(1, 1) differ");
        free(p2);
    }
    epx_counts_destroy(counts);
    epx_layout_destroy(mine);
    epx_layout_destroy(ref);
    free(bm);
    free(br);
    free(load);
    free(p2l);
    free(cnt);
    free(l2p);
}

/* Run every case listed in DIR/index.json; returns how many ran. */
static int run_dir(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/index.json", dir);
    json_error_t jerr;
    json_t *idx = json_load_file(path, 0, &jerr);
    if (idx == NULL) fprintf(stderr, "%s: %s\n", path, jerr.text);
    assert_non_null(idx);
    const json_t *cases = json_object_get(idx, "cases");
    assert_true(json_is_array(cases));
    int n = 0, n_float = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        snprintf(path, sizeof path, "%s/%s.json", dir, json_string_value(json_array_get(cases, i)));
        gcase c;
        load_case(path, &c);
        check_case(&c);
        n_float += c.is_float;
        case_free(&c);
        n++;
    }
    json_decref(idx);
    fprintf(stderr, "%s: %d cases (%d float) meet the parity rules\n", dir, n, n_float);
    return n;
}

static void golden_local(void **state) {
    (void)state;
    assert_true(run_dir("data/eplb") >= 6);
}

static void golden_shared(void **state) {
    (void)state;
    const char *shared = tu_shared_dir();
    if (shared == NULL) {
        fprintf(stderr, "skipping the 134 shared golden cases: shared/ not found\n");
        skip();
    }
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/golden/eplb", shared);
    assert_int_equal(run_dir(dir), 134);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(golden_local),
        cmocka_unit_test(golden_shared),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
