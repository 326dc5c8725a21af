/*
 * test_progress.c - long work reports progress through the callback it is
 * given: planning once per layer (every algorithm), reading dump files once
 * per file; counts rise to the total and end there.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

typedef struct seen {
    int calls;
    int64_t last, total;
    int monotone;
    char what[64];
} seen;

static void record(void *user, const char *what, int64_t done, int64_t total) {
    seen *s = user;
    if (done < s->last || done > total) s->monotone = 0;
    s->last = done;
    s->total = total;
    s->calls++;
    snprintf(s->what, sizeof s->what, "%s", what);
}

static void planning_reports_every_layer(void **state) {
    (void)state;
    tu_rng r = {tu_seed(11)};
    const int32_t L = 7, E = 16, S = 3;
    epx_counts *c = NULL;
    epx_error err = {0};
    assert_int_equal(epx_counts_create(S, L, E, &c, &err), EPX_OK);
    for (size_t i = 0; i < (size_t)(S * L * E); i++)
        c->data[i] = (i / E) % L == 0 ? 0.0 : (double)tu_below(&r, 1000); /* layer 0 dense */
    epx_shape shape = {L, E, 24, 4, 1};
    const epx_algorithm algos[3] = {EPX_ALGO_EPX, EPX_ALGO_DEEPSEEK, EPX_ALGO_AUTO};
    for (int a = 0; a < 3; a++) {
        seen s = {0, 0, 0, 1, ""};
        epx_plan_opts o = EPX_PLAN_OPTS_INIT;
        o.algorithm = algos[a];
        o.progress = record;
        o.progress_user = &s;
        epx_plan *p = NULL;
        assert_int_equal(epx_plan_compute(c, &shape, &o, &p, &err), EPX_OK);
        assert_true(s.monotone);
        assert_int_equal(s.last, L);
        assert_int_equal(s.total, L);
        assert_true(s.calls >= L - 1 && s.calls <= L + 1);
        assert_string_equal(s.what, "layers planned");
        epx_plan_destroy(p);
    }
    epx_counts_destroy(c);
}

static void reading_dumps_reports_every_file(void **state) {
    (void)state;
    const char *src = getenv("EPX_SOURCE");
    char spec[2048];
    snprintf(spec, sizeof spec, "%s/tests/data/pt/per_pass_rank0.pt", src ? src : "..");
    seen s = {0, 0, 0, 1, ""};
    epx_counts *c = NULL;
    epx_error err = {0};
    assert_int_equal(epx_counts_read_progress(spec, record, &s, &c, &err), EPX_OK);
    assert_int_equal(s.calls, 1);
    assert_int_equal(s.last, 1);
    assert_string_equal(s.what, "dump files read");
    epx_counts_destroy(c);
    /* JSON needs no progress and gets none. */
    s.calls = 0;
    assert_int_equal(
        epx_counts_read_progress("{\"logical_count\": [[1, 2]]}", record, &s, &c, &err), EPX_OK);
    assert_int_equal(s.calls, 0);
    epx_counts_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(planning_reports_every_layer),
        cmocka_unit_test(reading_dumps_reports_every_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
