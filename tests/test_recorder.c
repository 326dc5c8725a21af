/*
 * test_recorder.c - the load recorder against a naive count: random physical
 * topk ids (both counting paths, -1 mixed in) and precomputed slot counts
 * over random layouts; the stat ring wrapping; per_pass capacity; bad ids
 * and bad counts rejected with nothing counted; dump, reset, discard,
 * set_layout; and the balancedness moving averages on hand-computed passes.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* Redundant slots go to any expert. */
static epx_layout *random_layout(tu_rng *r, int32_t L, int32_t E, int32_t P, int32_t G, int32_t N) {
    return tu_random_layout(r, L, E, P, G, N, E);
}

static epx_recorder *make(const epx_layout *lay, epx_record_mode mode, int32_t cap) {
    epx_recorder_opts o = EPX_RECORDER_OPTS_INIT;
    o.mode = mode;
    o.capacity = cap;
    epx_recorder *rec = NULL;
    epx_error err = {0};
    assert_int_equal(epx_recorder_create(lay, &o, &rec, &err), EPX_OK);
    return rec;
}

/* A skewed id: hot slots often, -1 sometimes. */
static int32_t random_id(tu_rng *r, int32_t P) {
    uint32_t u = tu_below(r, 100);
    if (u < 5) return -1;
    if (u < 50) return (int32_t)tu_below(r, (uint32_t)(P < 3 ? P : 3));
    return (int32_t)tu_below(r, (uint32_t)P);
}

/* Random passes, random call sizes (both paths), compared with a naive
 * logical count through the map. */
static void random_vs_naive(void **state) {
    (void)state;
    tu_rng r = {tu_seed(20240601)};
    for (int iter = 0; iter < 30; iter++) {
        int32_t G = 1 + (int32_t)tu_below(&r, 8), N = 1;
        if (G % 2 == 0 && tu_below(&r, 2)) N = 2;
        int32_t E = 1 + (int32_t)tu_below(&r, 64);
        int32_t spg = (E + G - 1) / G + (int32_t)tu_below(&r, 3), P = spg * G;
        int32_t L = 1 + (int32_t)tu_below(&r, 5), cap = 1 + (int32_t)tu_below(&r, 4);
        int32_t passes = 1 + (int32_t)tu_below(&r, 6);
        epx_layout *lay = random_layout(&r, L, E, P, G, N);
        const int32_t *map = epx_layout_physical_to_logical(lay);
        epx_recorder *rec = make(lay, EPX_RECORD_STAT, cap);
        size_t LE = (size_t)L * (size_t)E;
        double *want = calloc((size_t)passes * LE, sizeof(double));
        for (int32_t s = 0; s < passes; s++) {
            for (int32_t l = 0; l < L; l++) {
                int calls = (int)tu_below(&r, 3);
                for (int c = 0; c < calls; c++) {
                    int32_t K = 1 + (int32_t)tu_below(&r, 8);
                    int64_t T = tu_below(&r, 2) ? tu_below(&r, 40) : 100 + tu_below(&r, 3000);
                    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * K + 1));
                    for (int64_t i = 0; i < T * K; i++) {
                        ids[i] = random_id(&r, P);
                        if (ids[i] >= 0)
                            want[(size_t)s * LE + (size_t)l * (size_t)E +
                                 (size_t)map[(size_t)l * (size_t)P + (size_t)ids[i]]] += 1;
                    }
                    epx_error err = {0};
                    assert_int_equal(epx_recorder_add_topk(rec, l, ids, T, K, &err), EPX_OK);
                    free(ids);
                }
                if (tu_below(&r, 2)) {
                    int64_t *cnt = malloc(sizeof(int64_t) * (size_t)P);
                    for (int32_t p = 0; p < P; p++) {
                        cnt[p] = tu_below(&r, 1000);
                        want[(size_t)s * LE + (size_t)l * (size_t)E +
                             (size_t)map[(size_t)l * (size_t)P + (size_t)p]] += (double)cnt[p];
                    }
                    epx_error err = {0};
                    assert_int_equal(epx_recorder_add_slot_counts(rec, l, cnt, &err), EPX_OK);
                    free(cnt);
                }
            }
            epx_error err = {0};
            assert_int_equal(epx_recorder_end_pass(rec, &err), EPX_OK);
        }
        int32_t held = passes < cap ? passes : cap;
        assert_int_equal(epx_recorder_num_passes(rec), held);
        epx_counts *c = NULL;
        epx_error err = {0};
        assert_int_equal(epx_recorder_dump(rec, &c, &err), EPX_OK);
        assert_int_equal(c->num_windows, held);
        assert_int_equal(c->num_layers, L);
        assert_int_equal(c->num_experts, E);
        /* The ring keeps the last `held` passes, oldest first. */
        for (int32_t s = 0; s < held; s++)
            for (size_t i = 0; i < LE; i++)
                if (c->data[(size_t)s * LE + i] != want[(size_t)(passes - held + s) * LE + i])
                    fail_msg("iter %d: window %d cell %zu is %g, want %g", iter, s, i,
                             c->data[(size_t)s * LE + i],
                             want[(size_t)(passes - held + s) * LE + i]);
        epx_counts_destroy(c);
        free(want);
        epx_recorder_destroy(rec);
        epx_layout_destroy(lay);
    }
}

/* A 2-layer, 4-slot trivial layout on 2 GPUs: slot p holds expert p. */
static epx_layout *tiny(void) {
    epx_shape s = {2, 4, 4, 2, 1};
    epx_layout *lay = NULL;
    epx_error err = {0};
    assert_int_equal(epx_layout_create_trivial(&s, &lay, &err), EPX_OK);
    return lay;
}

/* One pass putting `n` tokens on slot `slot` of layer 0. */
static void pass_with(epx_recorder *rec, int32_t slot, int32_t n) {
    int32_t ids[64];
    for (int32_t i = 0; i < n; i++) ids[i] = slot;
    epx_error err = {0};
    assert_int_equal(epx_recorder_add_topk(rec, 0, ids, n, 1, &err), EPX_OK);
    assert_int_equal(epx_recorder_end_pass(rec, &err), EPX_OK);
}

static void ring_wraps(void **state) {
    (void)state;
    epx_layout *lay = tiny();
    epx_recorder *rec = make(lay, EPX_RECORD_STAT, 3);
    for (int32_t i = 1; i <= 5; i++) pass_with(rec, i % 4, i); /* pass i: i tokens on slot i%4 */
    epx_counts *c = NULL;
    epx_error err = {0};
    assert_int_equal(epx_recorder_dump(rec, &c, &err), EPX_OK);
    assert_int_equal(c->num_windows, 3);
    for (int32_t s = 0; s < 3; s++) {
        int32_t i = s + 3; /* passes 3, 4, 5 */
        for (int32_t e = 0; e < 4; e++)
            assert_true(epx_counts_row(c, s, 0)[e] == (e == i % 4 ? (double)i : 0.0));
        for (int32_t e = 0; e < 4; e++) assert_true(epx_counts_row(c, s, 1)[e] == 0.0);
    }
    epx_counts_destroy(c);
    epx_recorder_destroy(rec);
    epx_layout_destroy(lay);
}

static void per_pass_capacity(void **state) {
    (void)state;
    epx_layout *lay = tiny();
    epx_recorder *rec = make(lay, EPX_RECORD_PER_PASS, 2);
    pass_with(rec, 0, 1);
    pass_with(rec, 1, 2);
    int32_t ids[3] = {2, 2, 2};
    epx_error err = {0};
    assert_int_equal(epx_recorder_add_topk(rec, 0, ids, 3, 1, &err), EPX_OK);
    assert_int_equal(epx_recorder_end_pass(rec, &err), EPX_ERR_OVERFLOW);
    TU_MSG_HAS(err.msg, "capacity of 2", "dump and reset");
    epx_counts *c = NULL;
    assert_int_equal(epx_recorder_dump(rec, &c, &err), EPX_OK);
    assert_int_equal(c->num_windows, 2);
    assert_true(epx_counts_row(c, 0, 0)[0] == 1.0 && epx_counts_row(c, 1, 0)[1] == 2.0);
    epx_counts_destroy(c);
    /* Reset keeps the open pass, which now ends fine. */
    epx_recorder_reset(rec);
    assert_int_equal(epx_recorder_num_passes(rec), 0);
    assert_int_equal(epx_recorder_end_pass(rec, &err), EPX_OK);
    assert_int_equal(epx_recorder_dump(rec, &c, &err), EPX_OK);
    assert_int_equal(c->num_windows, 1);
    assert_true(epx_counts_row(c, 0, 0)[2] == 3.0);
    epx_counts_destroy(c);
    epx_recorder_destroy(rec);
    epx_layout_destroy(lay);
}

static void minus_one_ignored(void **state) {
    (void)state;
    epx_layout *lay = tiny();
    epx_recorder *rec = make(lay, EPX_RECORD_STAT, 4);
    int32_t big[2000];
    for (int i = 0; i < 2000; i++) big[i] = i % 3 == 0 ? 3 : -1; /* large path */
    int32_t small[6] = {-1, -1, 1, -1, 1, -1};                   /* small path */
    epx_error err = {0};
    assert_int_equal(epx_recorder_add_topk(rec, 1, big, 250, 8, &err), EPX_OK);
    assert_int_equal(epx_recorder_add_topk(rec, 1, small, 3, 2, &err), EPX_OK);
    assert_int_equal(epx_recorder_add_topk(rec, 0, NULL, 0, 8, &err), EPX_OK);
    assert_int_equal(epx_recorder_end_pass(rec, &err), EPX_OK);
    epx_counts *c = NULL;
    assert_int_equal(epx_recorder_dump(rec, &c, &err), EPX_OK);
    const double *row = epx_counts_row(c, 0, 1);
    assert_true(row[0] == 0.0 && row[1] == 2.0 && row[2] == 0.0 && row[3] == 667.0);
    for (int e = 0; e < 4; e++) assert_true(epx_counts_row(c, 0, 0)[e] == 0.0);
    epx_counts_destroy(c);
    epx_recorder_destroy(rec);
    epx_layout_destroy(lay);
}

/* A bad id fails the whole call, on both paths: nothing reaches the pass. */
static void bad_ids_rejected(void **state) {
    (void)state;
    epx_layout *lay = tiny();
    epx_recorder *rec = make(lay, EPX_RECORD_STAT, 4);
    int32_t ok[2] = {0, 1};
    epx_error err = {0};
    assert_int_equal(epx_recorder_add_topk(rec, 0, ok, 1, 2, &err), EPX_OK);
    const int32_t bad_values[] = {4, -2, INT32_MIN, INT32_MAX};
    for (size_t b = 0; b < sizeof bad_values / sizeof bad_values[0]; b++) {
        int32_t small[8] = {0, 1, 2, 3, 0, 1, 2, 3};
        small[5] = bad_values[b];
        memset(&err, 0, sizeof err);
        assert_int_equal(epx_recorder_add_topk(rec, 0, small, 2, 4, &err), EPX_ERR_INVALID_ARG);
        TU_MSG_HAS(err.msg, "topk_ids[1][1]", "outside [-1, 4)", "nothing");
        int32_t big[4000];
        for (int i = 0; i < 4000; i++) big[i] = i % 4;
        big[3999] = bad_values[b];
        assert_int_equal(epx_recorder_add_topk(rec, 0, big, 500, 8, &err), EPX_ERR_INVALID_ARG);
        TU_MSG_HAS(err.msg, "topk_ids[499][7]");
    }
    assert_int_equal(epx_recorder_add_topk(rec, 2, ok, 1, 2, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "layer 2", "[0, 2)");
    assert_int_equal(epx_recorder_add_topk(rec, 0, ok, 1, 0, &err), EPX_ERR_INVALID_ARG);
    assert_int_equal(epx_recorder_add_topk(rec, 0, ok, -1, 2, &err), EPX_ERR_INVALID_ARG);
    assert_int_equal(epx_recorder_add_topk(rec, 0, NULL, 1, 2, &err), EPX_ERR_INVALID_ARG);
    int64_t cnt[4] = {1, 2, -3, 4};
    assert_int_equal(epx_recorder_add_slot_counts(rec, 0, cnt, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "counts[2] is -3");
    /* counts that each fit but whose layer sum would pass 2^63 - 1 (a GPU's
     * or an expert's sum overflowed at end_pass), in one call and over two */
    int64_t huge[4] = {INT64_MAX, INT64_MAX, 0, 0};
    assert_int_equal(epx_recorder_add_slot_counts(rec, 1, huge, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "layer 1: counts[1] is 9223372036854775807", "within 2^63 - 1");
    int64_t most[4] = {INT64_MAX - 3, 0, 0, 0}, one[4] = {0, 0, 0, 4};
    assert_int_equal(epx_recorder_add_slot_counts(rec, 1, most, &err), EPX_OK);
    assert_int_equal(epx_recorder_add_slot_counts(rec, 1, one, &err), EPX_ERR_INVALID_ARG);
    const int32_t four[4] = {0, 1, 2, 3};
    assert_int_equal(epx_recorder_add_topk(rec, 1, four, 2, 2, &err), EPX_ERR_OVERFLOW);
    TU_MSG_HAS(err.msg, "layer 1: 4 more ids", "past 2^63 - 1", "nothing of this call");
    epx_recorder_discard_pass(rec); /* and the layer's sum with it */
    assert_int_equal(epx_recorder_add_topk(rec, 0, ok, 1, 2, &err), EPX_OK);
    assert_int_equal(epx_recorder_add_slot_counts(rec, 1, most, &err), EPX_OK);
    assert_int_equal(epx_recorder_end_pass(rec, &err), EPX_OK);
    assert_int_equal(epx_recorder_add_slot_counts(rec, 1, most, &err), EPX_OK); /* a new pass */
    epx_recorder_discard_pass(rec);
    assert_int_equal(epx_recorder_add_topk(rec, 0, ok, 1, 2, &err), EPX_OK);
    assert_int_equal(epx_recorder_end_pass(rec, &err), EPX_OK);
    epx_counts *c = NULL;
    assert_int_equal(epx_recorder_dump(rec, &c, &err), EPX_OK);
    const double *row = epx_counts_row(c, 0, 0);
    assert_true(row[0] == 1.0 && row[1] == 1.0 && row[2] == 0.0 && row[3] == 0.0);
    epx_counts_destroy(c);
    epx_recorder_destroy(rec);
    epx_layout_destroy(lay);
}

static void dump_reset_discard_set_layout(void **state) {
    (void)state;
    epx_layout *lay = tiny();
    epx_recorder *rec = make(lay, EPX_RECORD_STAT, 4);
    epx_counts *c = NULL;
    epx_error err = {0};
    double b = 0;
    assert_int_equal(epx_recorder_dump(rec, &c, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "holds no pass");
    assert_int_equal(epx_recorder_balancedness(rec, 10, EPX_RECORDER_BALANCEDNESS, &b, &err),
                     EPX_ERR_INVALID_ARG);
    pass_with(rec, 0, 5);
    epx_recorder_reset(rec);
    assert_int_equal(epx_recorder_num_passes(rec), 0);
    assert_int_equal(epx_recorder_dump(rec, &c, &err), EPX_ERR_INVALID_ARG);
    assert_int_equal(epx_recorder_balancedness(rec, 10, EPX_RECORDER_BALANCEDNESS, &b, &err),
                     EPX_ERR_INVALID_ARG);

    /* discard drops the open pass. */
    int32_t ids[2] = {3, 3};
    assert_int_equal(epx_recorder_add_topk(rec, 0, ids, 2, 1, &err), EPX_OK);
    epx_recorder_discard_pass(rec);
    assert_int_equal(epx_recorder_end_pass(rec, &err), EPX_OK);

    /* A new layout converts the passes ended after it: slot 3 now holds
     * expert 0 (map 3 1 2 0 is a valid permutation). */
    int32_t map2[8] = {3, 1, 2, 0, 0, 1, 2, 3};
    epx_shape s = {2, 4, 4, 2, 1};
    epx_layout *lay2 = NULL;
    assert_int_equal(epx_layout_create_from_map(&s, map2, &lay2, &err), EPX_OK);
    assert_int_equal(epx_recorder_add_topk(rec, 0, ids, 2, 1, &err), EPX_OK);
    assert_int_equal(epx_recorder_set_layout(rec, lay2, &err), EPX_OK);
    assert_int_equal(epx_recorder_end_pass(rec, &err), EPX_OK);
    assert_int_equal(epx_recorder_dump(rec, &c, &err), EPX_OK);
    assert_int_equal(c->num_windows, 2);
    for (int e = 0; e < 4; e++) assert_true(epx_counts_row(c, 0, 0)[e] == 0.0);
    assert_true(epx_counts_row(c, 1, 0)[0] == 2.0 && epx_counts_row(c, 1, 0)[3] == 0.0);
    epx_counts_destroy(c);

    epx_shape s3 = {2, 4, 6, 2, 1};
    epx_layout *lay3 = NULL;
    assert_int_equal(epx_layout_create_trivial(&s3, &lay3, &err), EPX_OK);
    assert_int_equal(epx_recorder_set_layout(rec, lay3, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "P=6", "P=4");
    epx_layout_destroy(lay3);
    epx_layout_destroy(lay2);
    epx_recorder_destroy(rec);
    epx_layout_destroy(lay);
    epx_recorder_destroy(NULL);
}

/*
 * Moving averages on hand-computed passes. tiny(): slots 0,1 on GPU 0 and
 * 2,3 on GPU 1; only layer 0 gets tokens.
 *   pass A: 3 tokens on slot 0, 1 on slot 2: GPU loads 3, 1: mean 2, max 3:
 *           epx 2/3; SGLang ((2 + 1e-5)/(3 + 1e-5) + 1) / 2 (layer 1 idle: 1).
 *   pass B: 2 on slot 1, 2 on slot 3: loads 2, 2: epx 1; SGLang 1.
 *   pass C: nothing: epx 1 (no loaded layer); SGLang 1.
 */
static void balancedness_moving_averages(void **state) {
    (void)state;
    epx_layout *lay = tiny();
    epx_recorder *rec = make(lay, EPX_RECORD_STAT, 2);
    int32_t a[4] = {0, 0, 0, 2}, bb[4] = {1, 1, 3, 3};
    epx_error err = {0};
    const double A = 2.0 / 3.0;
    const double As = (double)((((float)2 + 1e-5f) / ((float)3 + 1e-5f) + 1.0f) / 2.0f);
    /* 7 passes: A B A B A C A (most recent last). */
    const char seq[] = "ABABACA";
    for (const char *q = seq; *q; q++) {
        if (*q == 'A') assert_int_equal(epx_recorder_add_topk(rec, 0, a, 4, 1, &err), EPX_OK);
        if (*q == 'B') assert_int_equal(epx_recorder_add_topk(rec, 0, bb, 2, 2, &err), EPX_OK);
        assert_int_equal(epx_recorder_end_pass(rec, &err), EPX_OK);
    }
    double v = 0;
    assert_int_equal(epx_recorder_balancedness(rec, 1, EPX_RECORDER_BALANCEDNESS, &v, &err),
                     EPX_OK);
    assert_true(fabs(v - A) < 1e-15);
    assert_int_equal(epx_recorder_balancedness(rec, 3, EPX_RECORDER_BALANCEDNESS, &v, &err),
                     EPX_OK);
    assert_true(fabs(v - (A + 1 + A) / 3) < 1e-15); /* A C A */
    assert_int_equal(epx_recorder_balancedness(rec, 10, EPX_RECORDER_BALANCEDNESS, &v, &err),
                     EPX_OK);
    assert_true(fabs(v - (4 * A + 3) / 7) < 1e-15); /* fewer than 10 passes: all 7 */
    assert_int_equal(
        epx_recorder_balancedness(rec, 1000, EPX_RECORDER_BALANCEDNESS_SGLANG, &v, &err), EPX_OK);
    assert_true(fabs(v - (4 * As + 3) / 7) < 1e-12);
    assert_true(fabs(As - (A + 1) / 2) < 1e-5); /* the 1e-5 terms barely move it */
    assert_int_equal(epx_recorder_balancedness(rec, 0, EPX_RECORDER_BALANCEDNESS, &v, &err),
                     EPX_ERR_INVALID_ARG);
    assert_int_equal(epx_recorder_balancedness(rec, 1001, EPX_RECORDER_BALANCEDNESS, &v, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "[1, 1000]");
    assert_int_equal(epx_recorder_balancedness(rec, 5, (epx_recorder_metric)7, &v, &err),
                     EPX_ERR_INVALID_ARG);

    /* More than 1000 passes: the history keeps the last 1000, so after
     * 1000 B passes every window averages to exactly 1. */
    for (int i = 0; i < 1000; i++) {
        assert_int_equal(epx_recorder_add_topk(rec, 0, bb, 2, 2, &err), EPX_OK);
        assert_int_equal(epx_recorder_end_pass(rec, &err), EPX_OK);
    }
    assert_int_equal(epx_recorder_balancedness(rec, 1000, EPX_RECORDER_BALANCEDNESS, &v, &err),
                     EPX_OK);
    assert_true(v == 1.0);
    /* One more A: the last 10 average (9 + A) / 10. */
    assert_int_equal(epx_recorder_add_topk(rec, 0, a, 4, 1, &err), EPX_OK);
    assert_int_equal(epx_recorder_end_pass(rec, &err), EPX_OK);
    assert_int_equal(epx_recorder_balancedness(rec, 10, EPX_RECORDER_BALANCEDNESS, &v, &err),
                     EPX_OK);
    assert_true(fabs(v - (9 + A) / 10) < 1e-15);
    epx_recorder_destroy(rec);
    epx_layout_destroy(lay);
}

static void options_and_memory(void **state) {
    (void)state;
    epx_layout *lay = tiny();
    epx_recorder *rec = NULL;
    epx_error err = {0};
    epx_recorder_opts o = EPX_RECORDER_OPTS_INIT;
    assert_int_equal(o.capacity, 1000);
    o.capacity = 0;
    assert_int_equal(epx_recorder_create(lay, &o, &rec, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "capacity (0)");
    o = (epx_recorder_opts)EPX_RECORDER_OPTS_INIT;
    o.version = 9;
    assert_int_equal(epx_recorder_create(lay, &o, &rec, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "EPX_RECORDER_OPTS_INIT");
    o = (epx_recorder_opts)EPX_RECORDER_OPTS_INIT;
    o.mode = (epx_record_mode)5;
    assert_int_equal(epx_recorder_create(lay, &o, &rec, &err), EPX_ERR_INVALID_ARG);
    assert_null(rec);

    /* Kimi-K2 on 8 GPUs, 1000 passes: the ring dominates (61 x 384 x 8 B
     * a pass). */
    epx_shape kimi = {61, 384, 416, 8, 1};
    size_t bytes = 0;
    o = (epx_recorder_opts)EPX_RECORDER_OPTS_INIT;
    assert_int_equal(epx_recorder_memory(&kimi, &o, &bytes, &err), EPX_OK);
    size_t ring = (size_t)1000 * 61 * 384 * 8;
    assert_true(bytes > ring && bytes < ring + 400000);
    o.capacity = -1;
    assert_int_equal(epx_recorder_memory(&kimi, &o, &bytes, &err), EPX_ERR_INVALID_ARG);
    epx_layout_destroy(lay);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(random_vs_naive),
        cmocka_unit_test(ring_wraps),
        cmocka_unit_test(per_pass_capacity),
        cmocka_unit_test(minus_one_ignored),
        cmocka_unit_test(bad_ids_rejected),
        cmocka_unit_test(dump_reset_discard_set_layout),
        cmocka_unit_test(balancedness_moving_averages),
        cmocka_unit_test(options_and_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
