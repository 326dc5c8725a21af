/*
 * test_trace.c - the built-in model table and the synthetic trace generator:
 * determinism (same seed, same bits; fewer windows, a prefix), shapes, dense
 * rows of zeros, exact row sums T * top_k, the per-expert cap T, the skew and
 * drift knobs doing what they say, option errors, and a JSON round trip.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static epx_counts *synth(const epx_model *m, int32_t S, int64_t T, uint64_t seed, double lo,
                         double hi, double drift) {
    epx_trace_opts o = EPX_TRACE_OPTS_INIT;
    o.num_windows = S;
    o.tokens = T;
    o.seed = seed;
    o.skew_lo = lo;
    o.skew_hi = hi;
    o.drift = drift;
    epx_counts *c = NULL;
    epx_error err = {0};
    epx_status st = epx_trace_synth(m, &o, &c, &err);
    if (st != EPX_OK) fail_msg("synth failed: %s", err.msg);
    return c;
}

static const epx_model *model(const char *name) {
    const epx_model *m = NULL;
    epx_error err = {0};
    assert_int_equal(epx_model_lookup(name, &m, &err), EPX_OK);
    return m;
}

static void lookup_names_and_aliases(void **state) {
    (void)state;
    assert_string_equal(model("kimi-k2")->name, "kimi-k2");
    assert_string_equal(model("Kimi_K2")->name, "kimi-k2");
    assert_string_equal(model("kimi-k2.5")->name, "kimi-k2.5");
    assert_string_equal(model("qwen3-235b")->name, "qwen3-235b-a22b");
    assert_string_equal(model("qwen3_30b")->name, "qwen3-30b-a3b");
    assert_string_equal(model("mixtral")->name, "mixtral-8x7b");
    assert_string_equal(model("gpt-oss")->name, "gpt-oss-120b");
    const epx_model *dsv3 = model("DeepSeek-V3");
    /* Numbers from shared/models.json. */
    assert_int_equal(dsv3->num_layers, 61);
    assert_int_equal(dsv3->first_k_dense, 3);
    assert_int_equal(dsv3->num_experts, 256);
    assert_int_equal(dsv3->top_k, 8);
    assert_int_equal(dsv3->num_groups, 8);
    assert_int_equal(dsv3->topk_group, 4);
    const epx_model *glm = model("glm-4.5");
    assert_int_equal(glm->num_layers, 92);
    assert_int_equal(glm->num_experts, 160);
    assert_int_equal(model("gpt-oss")->top_k, 4);
    assert_int_equal(model("mixtral")->num_experts, 8);

    int32_t n = 0;
    const epx_model *list = epx_model_list(&n);
    assert_int_equal(n, 8);
    for (int32_t i = 0; i < n; i++) assert_ptr_equal(model(list[i].name), &list[i]);

    const epx_model *m = NULL;
    epx_error err = {0};
    assert_int_equal(epx_model_lookup("llama-moe", &m, &err), EPX_ERR_INVALID_ARG);
    assert_null(m);
    TU_MSG_HAS(err.msg, "llama-moe", "kimi-k2", "glm-4.5");
}

/* Every built-in shape: dimensions, dense rows of zeros, exact sums, cap. */
static void shapes_sums_dense_rows(void **state) {
    (void)state;
    int32_t n = 0;
    const epx_model *list = epx_model_list(&n);
    for (int32_t i = 0; i < n; i++) {
        const epx_model *m = &list[i];
        const int64_t T = 4096;
        epx_counts *c = synth(m, 3, T, 7, 0.8, 1.3, 0.1);
        assert_int_equal(c->num_windows, 3);
        assert_int_equal(c->num_layers, m->num_layers);
        assert_int_equal(c->num_experts, m->num_experts);
        for (int32_t s = 0; s < 3; s++)
            for (int32_t l = 0; l < m->num_layers; l++) {
                const double *row = epx_counts_row(c, s, l);
                double sum = 0;
                for (int32_t e = 0; e < m->num_experts; e++) {
                    assert_true(row[e] >= 0 && row[e] <= (double)T);
                    assert_true(row[e] == floor(row[e]));
                    sum += row[e];
                }
                if (l < m->first_k_dense)
                    assert_true(sum == 0.0);
                else if (sum != (double)(T * m->top_k))
                    fail_msg("%s window %d layer %d sums to %.0f, not %lld", m->name, s, l, sum,
                             (long long)(T * m->top_k));
            }
        epx_counts_destroy(c);
    }
}

static void deterministic_and_prefix(void **state) {
    (void)state;
    const epx_model *m = model("deepseek-v3");
    epx_counts *a = synth(m, 5, 20000, 42, 0.8, 1.3, 0.1);
    epx_counts *b = synth(m, 5, 20000, 42, 0.8, 1.3, 0.1);
    epx_counts *p = synth(m, 2, 20000, 42, 0.8, 1.3, 0.1);
    epx_counts *d = synth(m, 5, 20000, 43, 0.8, 1.3, 0.1);
    size_t n = (size_t)5 * 61 * 256, np = (size_t)2 * 61 * 256;
    assert_memory_equal(a->data, b->data, n * sizeof(double));
    assert_memory_equal(a->data, p->data, np * sizeof(double));
    assert_true(memcmp(a->data, d->data, n * sizeof(double)) != 0);
    epx_counts_destroy(a);
    epx_counts_destroy(b);
    epx_counts_destroy(p);
    epx_counts_destroy(d);
}

/* Small T exercises the exact (inversion) binomial branch; sums stay exact. */
static void small_token_counts(void **state) {
    (void)state;
    const epx_model *m = model("kimi-k2");
    for (int64_t T = 1; T <= 33; T += 8) {
        epx_counts *c = synth(m, 2, T, (uint64_t)T, 1.0, 1.0, 0.2);
        for (int32_t s = 0; s < 2; s++)
            for (int32_t l = 1; l < 61; l++) {
                const double *row = epx_counts_row(c, s, l);
                double sum = 0;
                for (int32_t e = 0; e < 384; e++) {
                    assert_true(row[e] <= (double)T);
                    sum += row[e];
                }
                assert_true(sum == (double)(T * 8));
            }
        epx_counts_destroy(c);
    }
}

/* top_k == E: every token takes every expert, so each count is T. With
 * top_k = E - 1 and a heavy skew the cap is binding and still holds. */
static void cap_at_tokens(void **state) {
    (void)state;
    epx_model all = {"all", 3, 1, 4, 4, 1, 1, 0, 64, 64};
    epx_counts *c = synth(&all, 2, 1000, 1, 2.0, 2.0, 0.5);
    for (int32_t s = 0; s < 2; s++)
        for (int32_t l = 1; l < 3; l++)
            for (int32_t e = 0; e < 4; e++) assert_true(epx_counts_row(c, s, l)[e] == 1000.0);
    epx_counts_destroy(c);
    epx_model tight = {"tight", 4, 0, 16, 15, 1, 1, 0, 64, 64};
    c = synth(&tight, 4, 5000, 2, 3.0, 3.0, 0.3);
    int at_cap = 0;
    for (size_t i = 0; i < (size_t)4 * 4 * 16; i++) {
        assert_true(c->data[i] <= 5000.0);
        at_cap += c->data[i] == 5000.0;
    }
    assert_true(at_cap > 0); /* the cap really was binding */
    epx_counts_destroy(c);
}

/* The knobs: no skew gives near-uniform counts; a skew sigma shows up as the
 * spread of log counts; drift shows up as the spread of log ratios. */
static double sd(const double *x, int n) {
    double m = 0, v = 0;
    for (int i = 0; i < n; i++) m += x[i];
    m /= n;
    for (int i = 0; i < n; i++) v += (x[i] - m) * (x[i] - m);
    return sqrt(v / n);
}

static void skew_and_drift_knobs(void **state) {
    (void)state;
    epx_model flat = {"flat", 20, 0, 256, 8, 1, 1, 0, 64, 64};
    const int64_t T = 1 << 20;
    const double mean = (double)(T * 8) / 256.0;
    epx_counts *c = synth(&flat, 1, T, 3, 0.0, 0.0, 0.0);
    for (size_t i = 0; i < (size_t)20 * 256; i++)
        assert_true(fabs(c->data[i] - mean) < 6.0 * sqrt(mean)); /* multinomial noise only */
    epx_counts_destroy(c);

    double logs[256], ratios[256], skew_sum = 0, drift_sum = 0;
    c = synth(&flat, 2, T, 4, 1.0, 1.0, 0.5);
    for (int32_t l = 0; l < 20; l++) {
        const double *r0 = epx_counts_row(c, 0, l), *r1 = epx_counts_row(c, 1, l);
        for (int e = 0; e < 256; e++) {
            logs[e] = log(r0[e] + 1.0);
            ratios[e] = log((r1[e] + 1.0) / (r0[e] + 1.0));
        }
        skew_sum += sd(logs, 256);
        drift_sum += sd(ratios, 256);
    }
    /* 20 layers x 256 experts: the sample sds sit within a few percent. */
    assert_true(fabs(skew_sum / 20 - 1.0) < 0.12);
    assert_true(fabs(drift_sum / 20 - 0.5) < 0.08);
    epx_counts_destroy(c);

    /* Without drift, two windows share one popularity: ratios are noise. */
    c = synth(&flat, 2, T, 4, 1.0, 1.0, 0.0);
    drift_sum = 0;
    for (int32_t l = 0; l < 20; l++) {
        const double *r0 = epx_counts_row(c, 0, l), *r1 = epx_counts_row(c, 1, l);
        int k = 0;
        for (int e = 0; e < 256; e++)
            if (r0[e] > 1000 && r1[e] > 1000) ratios[k++] = log(r1[e] / r0[e]);
        drift_sum += sd(ratios, k);
    }
    assert_true(drift_sum / 20 < 0.05);
    epx_counts_destroy(c);
}

static int32_t argmax(const double *row, int32_t E) {
    int32_t best = 0;
    for (int32_t e = 1; e < E; e++)
        if (row[e] > row[best]) best = e;
    return best;
}

/* --shift W: windows before W are those of the trace without a shift, bit
 * for bit; at W the hottest expert moves in the layers that shift (all of
 * them with shift_layers 1, none with 0), and the skew stays. */
static void shift_moves_hot_experts(void **state) {
    (void)state;
    const epx_model *m = model("deepseek-v3");
    const int32_t E = m->num_experts, L = m->num_layers, W = 3;
    epx_trace_opts o = EPX_TRACE_OPTS_INIT;
    o.num_windows = 5;
    o.tokens = 1 << 20;
    o.drift = 0.0;
    o.seed = 5;
    epx_counts *base = NULL, *sh = NULL, *none = NULL;
    epx_error err = {0};
    assert_int_equal(epx_trace_synth(m, &o, &base, &err), EPX_OK);
    o.shift_window = W;
    o.shift_layers = 1.0;
    assert_int_equal(epx_trace_synth(m, &o, &sh, &err), EPX_OK);
    o.shift_layers = 0.0;
    assert_int_equal(epx_trace_synth(m, &o, &none, &err), EPX_OK);
    const size_t le = (size_t)L * (size_t)E;
    assert_memory_equal(base->data, sh->data, (size_t)W * le * sizeof(double));
    assert_memory_equal(base->data, none->data, 5 * le * sizeof(double));
    int32_t moved = 0, loaded = 0;
    for (int32_t l = m->first_k_dense; l < L; l++) {
        loaded++;
        int32_t before = argmax(epx_counts_row(sh, W - 1, l), E);
        int32_t after = argmax(epx_counts_row(sh, W, l), E);
        moved += before != after;
        /* after the shift, no further change without drift */
        assert_int_equal(after, argmax(epx_counts_row(sh, W + 1, l), E));
        /* the skew stays: the hottest count is about the same */
        double a = epx_counts_row(sh, W - 1, l)[before], b = epx_counts_row(sh, W, l)[after];
        assert_true(fabs(a - b) <= 0.05 * a);
    }
    assert_true(moved >= loaded * 9 / 10);
    epx_counts_destroy(base);
    epx_counts_destroy(sh);
    epx_counts_destroy(none);
}

/* --per-pass N: S * N rows; the N rows of a window sum to that window of the
 * trace written whole, and they are sparse when T / N is small. Each is a
 * forward pass a model can make: pass j's T / N tokens (the first T % N
 * passes one more) give every loaded layer tokens x top-k assignments, and
 * no expert more than one per token. */
static void per_pass_rows(void **state) {
    (void)state;
    const epx_model *m = model("qwen3-30b");
    const int32_t E = m->num_experts, L = m->num_layers, N = 16;
    epx_trace_opts o = EPX_TRACE_OPTS_INIT;
    o.num_windows = 3;
    o.tokens = 70; /* 16 passes of 4 or 5 tokens */
    epx_counts *whole = NULL, *rows = NULL;
    epx_error err = {0};
    assert_int_equal(epx_trace_synth(m, &o, &whole, &err), EPX_OK);
    o.per_pass = N;
    assert_int_equal(epx_trace_synth(m, &o, &rows, &err), EPX_OK);
    assert_int_equal(rows->num_windows, 3 * N);
    size_t zeros = 0, cells = 0;
    for (int32_t s = 0; s < 3; s++)
        for (int32_t l = 0; l < L; l++)
            for (int32_t e = 0; e < E; e++) {
                double sum = 0.0;
                for (int32_t j = 0; j < N; j++) {
                    double x = epx_counts_row(rows, s * N + j, l)[e];
                    assert_true(x >= 0.0 && x == floor(x));
                    zeros += x == 0.0;
                    cells++;
                    sum += x;
                }
                assert_true(sum == epx_counts_row(whole, s, l)[e]);
            }
    assert_true(zeros * 10 >= cells * 7); /* 4-5 tokens x top-8 over 128 experts a pass */
    for (int32_t s = 0; s < 3; s++)
        for (int32_t j = 0; j < N; j++) {
            const double tj = (double)(o.tokens / N + (j < o.tokens % N));
            for (int32_t l = m->first_k_dense; l < L; l++) {
                const double *y = epx_counts_row(rows, s * N + j, l);
                double sum = 0.0;
                for (int32_t e = 0; e < E; e++) {
                    assert_true(y[e] <= tj);
                    sum += y[e];
                }
                assert_true(sum == tj * m->top_k);
            }
        }
    epx_counts_destroy(whole);
    epx_counts_destroy(rows);
    o = (epx_trace_opts)EPX_TRACE_OPTS_INIT;
    o.per_pass = 0;
    assert_int_equal(epx_trace_synth(m, &o, &rows, &err), EPX_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "per_pass (0)"));
    o = (epx_trace_opts)EPX_TRACE_OPTS_INIT;
    o.shift_layers = 1.5;
    assert_int_equal(epx_trace_synth(m, &o, &rows, &err), EPX_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "shift_layers"));
}

static void option_errors(void **state) {
    (void)state;
    const epx_model *m = model("mixtral");
    epx_counts *c = NULL;
    epx_error err = {0};
    epx_trace_opts o = EPX_TRACE_OPTS_INIT;
    o.version = 0;
    assert_int_equal(epx_trace_synth(m, &o, &c, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "EPX_TRACE_OPTS_INIT");
    o = (epx_trace_opts)EPX_TRACE_OPTS_INIT;
    o.tokens = 0;
    assert_int_equal(epx_trace_synth(m, &o, &c, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "tokens (0)");
    o = (epx_trace_opts)EPX_TRACE_OPTS_INIT;
    o.skew_lo = 1.5;
    o.skew_hi = 1.0;
    assert_int_equal(epx_trace_synth(m, &o, &c, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "1.5..1", "lo <= hi");
    o = (epx_trace_opts)EPX_TRACE_OPTS_INIT;
    o.drift = NAN;
    assert_int_equal(epx_trace_synth(m, &o, &c, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "drift");
    o = (epx_trace_opts)EPX_TRACE_OPTS_INIT;
    o.num_windows = 0;
    assert_int_equal(epx_trace_synth(m, &o, &c, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "num_windows (0)");
    epx_model bad = {"bad", 4, 0, 8, 9, 1, 1, 0, 1, 1};
    o = (epx_trace_opts)EPX_TRACE_OPTS_INIT;
    assert_int_equal(epx_trace_synth(&bad, &o, &c, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "top_k (9)", "num_experts = 8");
    bad.top_k = 2;
    bad.first_k_dense = 5;
    assert_int_equal(epx_trace_synth(&bad, &o, &c, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "first_k_dense (5)");
    assert_null(c);
}

static void json_round_trip(void **state) {
    (void)state;
    epx_counts *c = synth(model("gpt-oss"), 3, 1000, 9, 0.8, 1.3, 0.1);
    char *path = tu_tmp_path(".json");
    epx_error err = {0};
    assert_int_equal(epx_counts_write_json(c, path, &err), EPX_OK);
    epx_counts *r = NULL;
    assert_int_equal(epx_counts_read(path, &r, &err), EPX_OK);
    assert_int_equal(r->num_windows, 3);
    assert_int_equal(r->num_layers, 36);
    assert_int_equal(r->num_experts, 128);
    assert_memory_equal(r->data, c->data, (size_t)3 * 36 * 128 * sizeof(double));
    remove(path);
    free(path);
    epx_counts_destroy(r);
    epx_counts_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(lookup_names_and_aliases),
        cmocka_unit_test(shapes_sums_dense_rows),
        cmocka_unit_test(deterministic_and_prefix),
        cmocka_unit_test(small_token_counts),
        cmocka_unit_test(cap_at_tokens),
        cmocka_unit_test(skew_and_drift_knobs),
        cmocka_unit_test(option_errors),
        cmocka_unit_test(shift_moves_hot_experts),
        cmocka_unit_test(per_pass_rows),
        cmocka_unit_test(json_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
