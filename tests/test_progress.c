/*
 * test_progress.c - long work reports progress through the callback it is
 * given: planning once per layer (every algorithm), reading dump files once
 * per file, SGLang's cut dispatch table per rank's pass (on the caller's
 * thread, whatever runs the passes); counts rise to the total and end there.
 */
#include <pthread.h>
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

/* The caller's thread: a table's passes run on threads, its progress is
 * told on this one only. */
static pthread_t caller;
static int other_thread;

static void record_here(void *user, const char *what, int64_t done, int64_t total) {
    other_thread |= !pthread_equal(pthread_self(), caller);
    record(user, what, done, total);
}

static void cut_table_reports_its_passes(void **state) {
    (void)state;
    epx_shape shape = {3, 8, 24, 12, 2};
    epx_layout *lay = NULL;
    epx_error err = {0};
    assert_int_equal(epx_layout_create_trivial(&shape, &lay, &err), EPX_OK);
    const size_t cells = (size_t)12 * 3 * 8;
    int32_t *want = malloc(cells * sizeof *want), *got = malloc(cells * sizeof *got);
    assert_non_null(want);
    assert_non_null(got);
    epx_table_opts o = EPX_TABLE_OPTS_INIT; /* 0.5.23: a mapping's lists are cut per rank */
    assert_int_equal(epx_dispatch_table_from_layout(lay, &o, want, &err), EPX_OK);
    caller = pthread_self();
    const char *threads[] = {"1", "3", "12"};
    for (int i = 0; i < 3; i++) {
        setenv("EPX_THREADS", threads[i], 1);
        seen s = {0, 0, 0, 1, ""};
        other_thread = 0;
        o.progress = record_here;
        o.progress_user = &s;
        assert_int_equal(epx_dispatch_table_from_layout(lay, &o, got, &err), EPX_OK);
        assert_memory_equal(got, want, cells * sizeof *got);
        assert_true(s.monotone);
        assert_int_equal(s.last, 12); /* the last call: every rank's pass done */
        assert_int_equal(s.total, 12);
        assert_true(s.calls >= 1 && s.calls <= 12);
        assert_string_equal(s.what, "ranks computed");
        assert_false(other_thread);
    }
    unsetenv("EPX_THREADS");
    /* one pass, nothing to tell: the lists as given (no cut) */
    seen s = {0, 0, 0, 1, ""};
    o.progress_user = &s;
    int32_t width = 0;
    const int32_t *l2p = epx_layout_logical_to_all_physical(lay, &width);
    assert_int_equal(epx_dispatch_table_compute(&shape, l2p, width, &o, got, &err), EPX_OK);
    assert_int_equal(s.calls, 0);
    free(want);
    free(got);
    epx_layout_destroy(lay);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(planning_reports_every_layer),
        cmocka_unit_test(reading_dumps_reports_every_file),
        cmocka_unit_test(cut_table_reports_its_passes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
