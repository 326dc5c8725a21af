/*
 * test_dispatch_token.c - the per-batch CPU path: Philox known answers;
 * static, dynamic, weighted and row mapping (valid replicas only, frequencies
 * that follow the weights, reproducible per (seed, pass, layer, token, k);
 * row: replica t mod num_valid);
 * the token layout against a naive sort-based construction on random
 * batches of many shapes (T = 0, K = 1, one-replica experts, -1 ids); the
 * row scatter and the weighted combine (round trip, fixed order, bf16
 * rounding); and the error messages of each entry point.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "../src/dispatch/dispatch_common.h"

/* Random123's published known-answer vectors for philox4x32-10. */
static void philox_known_answers(void **state) {
    (void)state;
    static const uint32_t ctr[3][4] = {{0, 0, 0, 0},
                                       {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                                       {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}};
    static const uint32_t key[3][2] = {
        {0, 0}, {0xffffffffu, 0xffffffffu}, {0xa4093822u, 0x299f31d0u}};
    static const uint32_t want[3][4] = {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
                                        {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
                                        {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}};
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        epxi_philox4x32_10(ctr[i], key[i], out);
        assert_memory_equal(out, want[i], sizeof out);
    }
    /* the public word is the same function of its five keys */
    uint32_t c[4] = {7, 3, 11, 5}, k[2] = {0x9abcdef0u, 0x12345678u}, o[4];
    epxi_philox4x32_10(c, k, o);
    assert_int_equal(epx_dispatch_random(0x123456789abcdef0ull, 5, 11, 7, 3), o[0]);
}

/* Skewed replication: the redundant slots go to the 4 hottest experts. */
static epx_layout *random_layout(tu_rng *r, int32_t L, int32_t E, int32_t P, int32_t G, int32_t N) {
    return tu_random_layout(r, L, E, P, G, N, 4);
}

static void random_ids(tu_rng *r, int32_t *ids, int32_t T, int32_t K, int32_t E, int minus1) {
    for (int32_t t = 0; t < T; t++)
        for (int32_t k = 0; k < K; k++)
            ids[t * K + k] =
                minus1 && tu_below(r, 10) == 0 ? -1 : (int32_t)tu_below(r, (uint32_t)E);
}

static void map_modes(void **state) {
    (void)state;
    tu_rng r = {tu_seed(77)};
    int32_t L = 2, E = 12, P = 24, G = 4, T = 3000, K = 4;
    epx_layout *lay = random_layout(&r, L, E, P, G, 1);
    const int32_t *p2l = epx_layout_physical_to_logical(lay);
    int32_t W = 0;
    const int32_t *rep = epx_layout_logical_to_all_physical(lay, &W);
    const int32_t *nv = epx_layout_num_valid(lay);
    int32_t *table = malloc(sizeof(int32_t) * (size_t)(G * L * E));
    epx_error err = {0};
    assert_int_equal(epx_dispatch_table_from_layout(lay, NULL, table, &err), EPX_OK);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * K));
    int32_t *a = malloc(sizeof(int32_t) * (size_t)(T * K)),
            *b = malloc(sizeof(int32_t) * (size_t)(T * K));
    random_ids(&r, ids, T, K, E, 1);
    int32_t l = 1, rank = 2;

    epx_dispatch_spec s = {
        EPX_DISPATCH_STATIC, E, P, W, table + (rank * L + l) * E, NULL, NULL, NULL, 0, 0,
        (uint32_t)l};
    assert_int_equal(epx_dispatch_map_ids(&s, ids, T, K, a, &err), EPX_OK);
    for (int32_t i = 0; i < T * K; i++)
        assert_int_equal(a[i], ids[i] < 0 ? -1 : table[(rank * L + l) * E + ids[i]]);

    s.mode = EPX_DISPATCH_DYNAMIC;
    s.table = NULL;
    s.replicas = rep + (size_t)l * (size_t)E * (size_t)W;
    s.num_valid = nv + l * E;
    s.seed = 99;
    assert_int_equal(epx_dispatch_map_ids(&s, ids, T, K, a, &err), EPX_OK);
    assert_int_equal(epx_dispatch_map_ids(&s, ids, T, K, b, &err), EPX_OK);
    assert_memory_equal(a, b, sizeof(int32_t) * (size_t)(T * K));
    int64_t *hits = calloc((size_t)P, sizeof *hits), *tot = calloc((size_t)E, sizeof *tot);
    for (int32_t i = 0; i < T * K; i++) {
        if (ids[i] < 0) {
            assert_int_equal(a[i], -1);
            continue;
        }
        assert_int_equal(p2l[l * P + a[i]], ids[i]); /* a replica of that expert */
        hits[a[i]]++;
        tot[ids[i]]++;
        /* any single choice can be recomputed from its keys alone */
        int32_t t = i / K, k = i % K, e = ids[i];
        uint32_t w = epx_dispatch_random(99, 0, (uint32_t)l, (uint32_t)t, (uint32_t)k);
        int32_t j = (int32_t)(((uint64_t)w * (uint32_t)nv[l * E + e]) >> 32);
        assert_int_equal(a[i], rep[((size_t)l * (size_t)E + (size_t)e) * (size_t)W + (size_t)j]);
    }
    for (int32_t p = 0; p < P; p++) { /* uniform within 6 sigma */
        int32_t e = p2l[l * P + p];
        double want = (double)tot[e] / nv[l * E + e];
        assert_true(fabs((double)hits[p] - want) <= 6.0 * sqrt(want) + 1.0);
    }
    s.pass = 1;
    assert_int_equal(epx_dispatch_map_ids(&s, ids, T, K, b, &err), EPX_OK);
    assert_true(memcmp(a, b, sizeof(int32_t) * (size_t)(T * K)) != 0);

    /* weighted: the first replica of each expert gets weight 0, the others
     * 1, 2, 3, ...; frequencies follow */
    double *wts = calloc((size_t)(L * P), sizeof *wts);
    for (int32_t ll = 0; ll < L; ll++)
        for (int32_t e = 0; e < E; e++)
            for (int32_t j = 0; j < nv[ll * E + e]; j++)
                wts[ll * P + rep[((size_t)ll * (size_t)E + (size_t)e) * (size_t)W + (size_t)j]] = j;
    uint32_t *thr = malloc(sizeof(uint32_t) * (size_t)(L * E * W));
    assert_int_equal(epx_dispatch_thresholds(rep, nv, L, E, W, wts, P, thr, &err), EPX_OK);
    s.mode = EPX_DISPATCH_WEIGHTED;
    s.thresholds = thr + (size_t)l * (size_t)E * (size_t)W;
    memset(hits, 0, sizeof *hits * (size_t)P);
    assert_int_equal(epx_dispatch_map_ids(&s, ids, T, K, a, &err), EPX_OK);
    for (int32_t i = 0; i < T * K; i++)
        if (ids[i] >= 0) {
            assert_int_equal(p2l[l * P + a[i]], ids[i]);
            hits[a[i]]++;
        }
    for (int32_t e = 0; e < E; e++) {
        int32_t n = nv[l * E + e];
        const int32_t *row = rep + ((size_t)l * (size_t)E + (size_t)e) * (size_t)W;
        double sum = n * (n - 1) / 2.0;
        for (int32_t j = 0; j < n; j++) {
            double want = n == 1 ? (double)tot[e] : (double)tot[e] * j / sum;
            if (n > 1 && j == 0) assert_int_equal(hits[row[0]], 0); /* weight 0: never */
            assert_true(fabs((double)hits[row[j]] - want) <= 6.0 * sqrt(want) + 1.0);
        }
    }
    /* row (SGLang 0.5.23's rank_invariant): replica t mod num_valid, no
     * draw, so seed, pass and layer change nothing */
    s.mode = EPX_DISPATCH_ROW;
    s.thresholds = NULL;
    assert_int_equal(epx_dispatch_map_ids(&s, ids, T, K, a, &err), EPX_OK);
    s.seed = 1234;
    s.pass = 7;
    assert_int_equal(epx_dispatch_map_ids(&s, ids, T, K, b, &err), EPX_OK);
    assert_memory_equal(a, b, sizeof(int32_t) * (size_t)(T * K));
    for (int32_t i = 0; i < T * K; i++) {
        int32_t t = i / K, e = ids[i];
        if (e < 0) {
            assert_int_equal(a[i], -1);
            continue;
        }
        int32_t j = t % nv[l * E + e];
        assert_int_equal(a[i], rep[((size_t)l * (size_t)E + (size_t)e) * (size_t)W + (size_t)j]);
    }
    free(wts);
    free(thr);
    free(hits);
    free(tot);
    free(ids);
    free(a);
    free(b);
    free(table);
    epx_layout_destroy(lay);
}

static void map_errors(void **state) {
    (void)state;
    int32_t table[3] = {0, 1, 2}, ids[2] = {1, 3}, out[2];
    epx_error err = {0};
    epx_dispatch_spec s = {EPX_DISPATCH_STATIC, 3, 4, 1, table, NULL, NULL, NULL, 0, 0, 0};
    assert_int_equal(epx_dispatch_map_ids(&s, ids, 1, 2, out, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "topk_ids[0][1] = 3", "[-1, 3)");
    ids[1] = -2;
    assert_int_equal(epx_dispatch_map_ids(&s, ids, 1, 2, out, &err), EPX_ERR_INVALID_ARG);
    ids[1] = 2;
    table[2] = 4;
    assert_int_equal(epx_dispatch_map_ids(&s, ids, 1, 2, out, &err), EPX_ERR_INVALID_MAP);
    TU_MSG_HAS(err.msg, "expert 2 maps to slot 4");
    s.table = NULL;
    assert_int_equal(epx_dispatch_map_ids(&s, ids, 1, 2, out, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "spec.table");
    s.mode = EPX_DISPATCH_WEIGHTED;
    assert_int_equal(epx_dispatch_map_ids(&s, ids, 1, 2, out, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "thresholds");
    s.mode = EPX_DISPATCH_ROW;
    assert_int_equal(epx_dispatch_map_ids(&s, ids, 1, 2, out, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "row dispatch need spec.replicas");
    {
        /* expert 2's list is {-1, 3} with num_valid 2: row 0 lands on the -1 */
        int32_t r3[3 * 2] = {0, 1, 2, -1, -1, 3}, n3[3] = {2, 1, 2}, ids2[2] = {2, 1}, o2[2];
        epx_dispatch_spec row = {EPX_DISPATCH_ROW, 3, 4, 2, NULL, r3, n3, NULL, 0, 0, 0};
        assert_int_equal(epx_dispatch_map_ids(&row, ids2, 1, 2, o2, &err), EPX_ERR_INVALID_MAP);
        TU_MSG_HAS(err.msg, "replicas[2][0] = -1 is outside [0, 4) while num_valid[2] = 2",
                   "-1 padding only after them");
        /* a bad entry fails whatever the draw picks: weighted thresholds that
         * never pick replica 0 (slot 99) once went on with EPX_OK */
        int32_t r4[3 * 2] = {99, 1, 2, -1, 0, 3}, n4[3] = {2, 1, 2}, ids0[2] = {0, 0};
        uint32_t th[3 * 2] = {0, UINT32_MAX, UINT32_MAX, 0, 0, UINT32_MAX};
        for (int mode = 0; mode < 3; mode++) {
            const epx_dispatch_mode m[3] = {EPX_DISPATCH_WEIGHTED, EPX_DISPATCH_DYNAMIC,
                                            EPX_DISPATCH_ROW};
            epx_dispatch_spec w = {m[mode], 3, 4, 2, NULL, r4, n4, th, 0, 0, 0};
            assert_int_equal(epx_dispatch_map_ids(&w, ids0, 1, 2, o2, &err), EPX_ERR_INVALID_MAP);
            TU_MSG_HAS(err.msg, "replicas[0][0] = 99 is outside [0, 4)");
        }
        n3[2] = 3;
        assert_int_equal(epx_dispatch_map_ids(&row, ids2, 1, 2, o2, &err), EPX_ERR_INVALID_MAP);
        TU_MSG_HAS(err.msg, "num_valid[2] = 3 is outside [1, 2]");
        r3[4] = 3, r3[5] = -1, n3[2] = 1;
        assert_int_equal(epx_dispatch_map_ids(&row, ids2, 1, 2, o2, &err), EPX_OK);
        assert_int_equal(o2[0], 3);
        assert_int_equal(o2[1], 2);
    }
    s.mode = (epx_dispatch_mode)9;
    assert_int_equal(epx_dispatch_map_ids(&s, ids, 1, 2, out, &err), EPX_ERR_INVALID_ARG);
    /* thresholds: a negative weight and a bad num_valid are named */
    int32_t rep[2] = {0, 1}, nv[1] = {2};
    double w[2] = {1.0, -1.0};
    uint32_t thr[2];
    assert_int_equal(epx_dispatch_thresholds(rep, nv, 1, 1, 2, w, 2, thr, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "weights[0][1] is -1");
    w[1] = 3.0;
    assert_int_equal(epx_dispatch_thresholds(rep, nv, 1, 1, 2, w, 2, thr, &err), EPX_OK);
    assert_int_equal(thr[0], 1u << 30); /* 1/4 of 2^32 */
    assert_int_equal(thr[1], UINT32_MAX);
    w[0] = w[1] = 0.0; /* all zero: an even split */
    assert_int_equal(epx_dispatch_thresholds(rep, nv, 1, 1, 2, w, 2, thr, &err), EPX_OK);
    assert_int_equal(thr[0], 1u << 31);
    nv[0] = 3;
    assert_int_equal(epx_dispatch_thresholds(rep, nv, 1, 1, 2, w, 2, thr, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "num_valid[0][0] = 3");
}

/* ---- layout against a naive construction --------------------------------- */

typedef struct entry {
    int32_t a, b, c; /* sort keys */
    int32_t id;
} entry;

static int by_keys(const void *x, const void *y) {
    const entry *p = x, *q = y;
    if (p->a != q->a) return p->a < q->a ? -1 : 1;
    if (p->b != q->b) return p->b < q->b ? -1 : 1;
    return (p->c > q->c) - (p->c < q->c);
}

static void check_layout(const int32_t *phys, int32_t T, int32_t K, int32_t P, int32_t G) {
    int32_t per = P / G;
    size_t TK = (size_t)T * (size_t)K;
    epx_token_layout o = {
        malloc(sizeof(int64_t) * (size_t)G),       malloc(sizeof(int64_t) * (size_t)P),
        malloc((size_t)T * (size_t)G + 1),         malloc(sizeof(int32_t) * (size_t)(G + 1)),
        malloc(sizeof(int32_t) * (TK + 1)),        malloc(sizeof(int32_t) * (TK + 1)),
        malloc(sizeof(int32_t) * (size_t)(P + 1)), malloc(sizeof(int32_t) * (TK + 1)),
        malloc(sizeof(int32_t) * (TK + 1))};
    epx_error err = {0};
    assert_int_equal(epx_token_layout_compute(phys, T, K, P, G, &o, &err), EPX_OK);

    /* slot order: every valid pair, sorted by (slot, token, k) */
    entry *es = malloc(sizeof(entry) * (TK + 1)),
          *er = malloc(sizeof(entry) * ((size_t)T * (size_t)G + 1));
    size_t ns = 0, nr = 0;
    for (int32_t t = 0; t < T; t++)
        for (int32_t k = 0; k < K; k++)
            if (phys[t * K + k] >= 0) es[ns++] = (entry){phys[t * K + k], t, k, t * K + k};
    qsort(es, ns, sizeof *es, by_keys);
    assert_int_equal(o.slot_offsets[P], (int32_t)ns);
    for (size_t i = 0; i < ns; i++) {
        assert_int_equal(o.slot_perm[i], es[i].id);
        assert_int_equal(o.pair_slot_pos[es[i].id], (int32_t)i);
    }
    for (int32_t p = 0; p < P; p++) {
        int64_t c = 0;
        for (size_t i = 0; i < ns; i++) c += es[i].a == p;
        assert_int_equal(o.tokens_per_slot[p], c);
        assert_int_equal(o.slot_offsets[p + 1] - o.slot_offsets[p], c);
    }
    /* rank order: each (token, rank) once, by (rank, lowest slot there, token) */
    for (int32_t t = 0; t < T; t++)
        for (int32_t g = 0; g < G; g++) {
            int32_t lo = -1, lok = -1;
            for (int32_t k = 0; k < K; k++) {
                int32_t p = phys[t * K + k];
                if (p >= 0 && p / per == g && (lo < 0 || p < lo)) lo = p, lok = k;
            }
            assert_int_equal(o.is_token_in_rank[(size_t)t * (size_t)G + (size_t)g], lo >= 0);
            if (lo >= 0) er[nr++] = (entry){g, lo, t, t * K + lok};
        }
    qsort(er, nr, sizeof *er, by_keys);
    assert_int_equal(o.rank_offsets[G], (int32_t)nr);
    int32_t *want_pos = malloc(sizeof(int32_t) * (TK + 1));
    for (size_t i = 0; i < TK; i++) want_pos[i] = -1;
    for (size_t i = 0; i < nr; i++) {
        assert_int_equal(o.rank_perm[i], er[i].c);
        want_pos[er[i].id] = (int32_t)i;
    }
    for (size_t i = 0; i < TK; i++) {
        assert_int_equal(o.pair_rank_pos[i], want_pos[i]);
        if (phys[i] < 0) assert_int_equal(o.pair_slot_pos[i], -1);
    }
    for (int32_t g = 0; g < G; g++) {
        int64_t c = 0;
        for (size_t i = 0; i < nr; i++) c += er[i].a == g;
        assert_int_equal(o.tokens_per_rank[g], c);
        assert_int_equal(o.rank_offsets[g + 1] - o.rank_offsets[g], c);
    }
    free(want_pos);
    free(es);
    free(er);
    free(o.tokens_per_rank);
    free(o.tokens_per_slot);
    free(o.is_token_in_rank);
    free(o.rank_offsets);
    free(o.rank_perm);
    free(o.pair_rank_pos);
    free(o.slot_offsets);
    free(o.slot_perm);
    free(o.pair_slot_pos);
}

static void layout_random(void **state) {
    (void)state;
    tu_rng r = {tu_seed(4242)};
    for (int iter = 0; iter < 200; iter++) {
        int32_t G = 1 + (int32_t)tu_below(&r, 8), per = 1 + (int32_t)tu_below(&r, 6), P = G * per;
        int32_t K = 1 + (int32_t)tu_below(&r, 9);
        int32_t T = iter % 7 == 0 ? 0 : (int32_t)tu_below(&r, 300);
        int32_t *phys = malloc(sizeof(int32_t) * ((size_t)T * (size_t)K + 1));
        for (int32_t i = 0; i < T * K; i++) {
            uint32_t u = tu_below(&r, 20);
            /* -1 ids, hot slots, and (rarely) the same slot twice in a token */
            phys[i] = u == 0  ? -1
                      : u < 6 ? (int32_t)tu_below(&r, (uint32_t)(P < 3 ? P : 3))
                              : (int32_t)tu_below(&r, (uint32_t)P);
        }
        check_layout(phys, T, K, P, G);
        free(phys);
    }
}

static void layout_errors(void **state) {
    (void)state;
    int32_t phys[4] = {0, 1, 5, -1};
    int64_t cnt[4];
    epx_token_layout o = {0};
    o.tokens_per_slot = cnt;
    epx_error err = {0};
    assert_int_equal(epx_token_layout_compute(phys, 2, 2, 4, 2, &o, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "phys[1][0] = 5", "[-1, 4)");
    assert_int_equal(epx_token_layout_compute(phys, 2, 2, 5, 2, &o, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "num_physical (5)", "num_gpus (2)");
    assert_int_equal(epx_token_layout_compute(phys, 2, 0, 4, 2, &o, &err), EPX_ERR_SHAPE);
    phys[2] = 3;
    assert_int_equal(epx_token_layout_compute(phys, 2, 2, 4, 2, &o, &err), EPX_OK);
    assert_int_equal(cnt[0] + cnt[1] + cnt[2] + cnt[3], 3);
}

/* ---- rows --------------------------------------------------------------- */

static void permute_combine(void **state) {
    (void)state;
    tu_rng r = {tu_seed(31337)};
    for (int iter = 0; iter < 40; iter++) {
        int32_t G = 1 + (int32_t)tu_below(&r, 4), P = G * (1 + (int32_t)tu_below(&r, 4));
        int32_t K = 1 + (int32_t)tu_below(&r, 8), T = (int32_t)tu_below(&r, 50);
        int64_t H = 1 + (int64_t)tu_below(&r, 40);
        epx_row_dtype dt = iter % 2 ? EPX_ROW_BF16 : EPX_ROW_F32;
        size_t es = dt == EPX_ROW_BF16 ? 2 : 4, TK = (size_t)T * (size_t)K;
        int32_t *phys = malloc(sizeof(int32_t) * (TK + 1)),
                *pos = malloc(sizeof(int32_t) * (TK + 1));
        float *w = malloc(sizeof(float) * (TK + 1));
        for (size_t i = 0; i < TK; i++) {
            phys[i] = tu_below(&r, 8) == 0 ? -1 : (int32_t)tu_below(&r, (uint32_t)P);
            w[i] = (float)tu_uniform(&r);
        }
        epx_token_layout o = {0};
        o.pair_slot_pos = pos;
        o.slot_offsets = malloc(sizeof(int32_t) * (size_t)(P + 1));
        epx_error err = {0};
        assert_int_equal(epx_token_layout_compute(phys, T, K, P, G, &o, &err), EPX_OK);
        int32_t rows = o.slot_offsets[P];
        unsigned char *x = malloc((size_t)T * (size_t)H * es + 1);
        unsigned char *y = malloc((size_t)rows * (size_t)H * es + 1);
        unsigned char *z = malloc((size_t)T * (size_t)H * es + 1);
        for (int64_t i = 0; i < T * H; i++) {
            float v = (float)(tu_uniform(&r) * 4.0 - 2.0);
            if (dt == EPX_ROW_BF16)
                ((uint16_t *)x)[i] = epxi_f32_to_bf16(v);
            else
                ((float *)x)[i] = v;
        }
        memset(y, 0xab, (size_t)rows * (size_t)H * es);
        assert_int_equal(epx_permute_rows(x, dt, T, H, pos, K, rows, y, &err), EPX_OK);
        for (size_t i = 0; i < TK; i++) /* every written row is its token's row */
            if (pos[i] >= 0)
                assert_memory_equal(y + (size_t)pos[i] * (size_t)H * es,
                                    x + i / (size_t)K * (size_t)H * es, (size_t)H * es);
        assert_int_equal(epx_combine_rows(y, dt, rows, H, pos, w, T, K, z, &err), EPX_OK);
        for (int32_t t = 0; t < T; t++) {
            double ws = 0.0;
            for (int32_t k = 0; k < K; k++) ws += pos[t * K + k] >= 0 ? w[t * K + k] : 0.0;
            for (int64_t h = 0; h < H; h++) {
                size_t i = (size_t)t * (size_t)H + (size_t)h;
                double xv =
                    dt == EPX_ROW_BF16 ? epxi_bf16_to_f32(((uint16_t *)x)[i]) : ((float *)x)[i];
                double zv =
                    dt == EPX_ROW_BF16 ? epxi_bf16_to_f32(((uint16_t *)z)[i]) : ((float *)z)[i];
                double tol = (dt == EPX_ROW_BF16 ? 1.0 / 128 : 1e-6) * fabs(xv * ws) + 1e-30;
                assert_true(fabs(zv - xv * ws) <= tol);
            }
        }
        /* the fixed order: an explicit fmaf chain, term by term */
        for (int32_t t = 0; t < T && dt == EPX_ROW_F32; t++)
            for (int64_t h = 0; h < H; h++) {
                float acc = 0.0f;
                for (int32_t k = 0; k < K; k++)
                    if (pos[t * K + k] >= 0)
                        acc =
                            fmaf(w[t * K + k],
                                 ((float *)y)[(size_t)pos[t * K + k] * (size_t)H + (size_t)h], acc);
                float got = ((float *)z)[(size_t)t * (size_t)H + (size_t)h];
                assert_memory_equal(&got, &acc, sizeof acc);
            }
        free(x);
        free(y);
        free(z);
        free(phys);
        free(pos);
        free(w);
        free(o.slot_offsets);
    }
}

/* The gather over a send order equals the scatter into a zeroed buffer of
 * the order's full capacity (T*K rows, -1 tail), for both orders. */
static void gather_is_the_scatter(void **state) {
    (void)state;
    tu_rng r = {tu_seed(4242)};
    for (int iter = 0; iter < 40; iter++) {
        int32_t G = 1 + (int32_t)tu_below(&r, 4), P = G * (1 + (int32_t)tu_below(&r, 4));
        int32_t K = 1 + (int32_t)tu_below(&r, 8), T = (int32_t)tu_below(&r, 50);
        int64_t H = 1 + (int64_t)tu_below(&r, 40);
        epx_row_dtype dt = iter % 2 ? EPX_ROW_BF16 : EPX_ROW_F32;
        size_t es = dt == EPX_ROW_BF16 ? 2 : 4, TK = (size_t)T * (size_t)K, rowb = (size_t)H * es;
        int32_t *phys = malloc(4 * (TK + 1));
        for (size_t i = 0; i < TK; i++)
            phys[i] = tu_below(&r, 8) == 0 ? -1 : (int32_t)tu_below(&r, (uint32_t)P);
        int32_t *rank_perm = malloc(4 * (TK + 1)), *slot_perm = malloc(4 * (TK + 1));
        int32_t *rank_pos = malloc(4 * (TK + 1)), *slot_pos = malloc(4 * (TK + 1));
        for (size_t i = 0; i < TK; i++) rank_perm[i] = slot_perm[i] = -1; /* the tails */
        epx_token_layout o = {0};
        o.rank_perm = rank_perm;
        o.slot_perm = slot_perm;
        o.pair_rank_pos = rank_pos;
        o.pair_slot_pos = slot_pos;
        epx_error err = {0};
        assert_int_equal(epx_token_layout_compute(phys, T, K, P, G, &o, &err), EPX_OK);
        unsigned char *x = malloc((size_t)T * rowb + 1), *a = malloc(TK * rowb + 1),
                      *b = malloc(TK * rowb + 1);
        for (size_t i = 0; i < (size_t)T * rowb; i++) x[i] = (unsigned char)tu_below(&r, 256);
        for (int order = 0; order < 2; order++) {
            memset(a, 0, TK * rowb);
            memset(b, 0xab, TK * rowb);
            assert_int_equal(
                epx_permute_rows(x, dt, T, H, order ? slot_pos : rank_pos, K, (int64_t)TK, a, &err),
                EPX_OK);
            assert_int_equal(epx_gather_rows(x, dt, T, H, order ? slot_perm : rank_perm,
                                             (int64_t)TK, order ? K : 1, b, &err),
                             EPX_OK);
            if (TK) assert_memory_equal(a, b, TK * rowb);
        }
        free(x);
        free(a);
        free(b);
        free(phys);
        free(rank_perm);
        free(slot_perm);
        free(rank_pos);
        free(slot_pos);
    }
    float x[4] = {1, 2, 3, 4}, y[4];
    int32_t order[2] = {3, 0};
    epx_error err = {0};
    assert_int_equal(epx_gather_rows(x, EPX_ROW_F32, 2, 2, order, 2, 1, y, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "order[0] = 3", "[-1, 2)");
    assert_int_equal(epx_gather_rows(x, EPX_ROW_F32, 2, 2, order, 2, 2, y, &err), EPX_OK);
    assert_true(y[0] == 3.0f && y[1] == 4.0f && y[2] == 1.0f && y[3] == 2.0f);
    assert_int_equal(epx_gather_rows(x, EPX_ROW_F32, 2, 2, order, 2, 0, y, &err), EPX_ERR_SHAPE);
    /* hidden 0: rows of no bytes, x and out may be NULL; nothing is copied
     * (memcpy and memset were handed NULL, undefined under UBSan) */
    int32_t pos[4] = {1, 0, 3, 2};
    assert_int_equal(epx_permute_rows(NULL, EPX_ROW_F32, 2, 0, pos, 2, 4, NULL, &err), EPX_OK);
    int32_t order2[2] = {-1, 0};
    assert_int_equal(epx_gather_rows(NULL, EPX_ROW_F32, 1, 0, order2, 2, 1, NULL, &err), EPX_OK);
}

static void rows_errors(void **state) {
    (void)state;
    float x[4] = {1, 2, 3, 4}, y[4];
    int32_t pos[2] = {0, 2};
    epx_error err = {0};
    assert_int_equal(epx_permute_rows(x, EPX_ROW_F32, 2, 2, pos, 1, 2, y, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "pos[1][0] = 2", "[-1, 2)");
    assert_int_equal(epx_combine_rows(x, (epx_row_dtype)7, 2, 2, pos, NULL, 2, 1, y, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "dtype 7");
    pos[1] = -1;
    assert_int_equal(epx_combine_rows(x, EPX_ROW_F32, 2, 2, pos, NULL, 2, 1, y, &err), EPX_OK);
    assert_true(y[0] == 1.0f && y[1] == 2.0f && y[2] == 0.0f && y[3] == 0.0f);
    /* a row width whose bytes wrap size_t: H * 4 wrapped to 0 (EPX_OK, nothing
     * copied) or to a negative memcpy size */
    int32_t ord[4] = {0, 1, 0, 1};
    assert_int_equal(epx_permute_rows(x, EPX_ROW_F32, 2, (int64_t)1 << 62, pos, 1, 2, y, &err),
                     EPX_ERR_OVERFLOW);
    TU_MSG_HAS(err.msg, "epx_permute_rows", "4611686018427387904", "hidden size");
    assert_int_equal(epx_gather_rows(x, EPX_ROW_F32, 2, INT64_MAX, ord, 4, 1, y, &err),
                     EPX_ERR_OVERFLOW);
    assert_int_equal(epx_combine_rows(x, EPX_ROW_BF16, 2, INT64_MAX / 2, pos, NULL, 2, 1, y, &err),
                     EPX_ERR_OVERFLOW);
}

static void bf16_rounding(void **state) {
    (void)state;
    assert_int_equal(epxi_f32_to_bf16(1.0f), 0x3f80);
    /* 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even wins (1.0) */
    assert_int_equal(epxi_f32_to_bf16(1.00390625f), 0x3f80);
    /* 1 + 3 * 2^-8 ties between 1 + 2^-7 and 1 + 2^-6: even is 0x3f82 */
    assert_int_equal(epxi_f32_to_bf16(1.01171875f), 0x3f82);
    assert_int_equal(epxi_f32_to_bf16(-NAN) & 0x7fff, 0x7fc0);
    assert_int_equal(epxi_f32_to_bf16(INFINITY), 0x7f80);
    assert_true(epxi_bf16_to_f32(0xc040) == -3.0f);
}

/* numeric.h's e4m3 against a search over all 256 codes (ties to the even
 * code), on every code's value, the midpoints between neighbours and a
 * dense sweep of [-448, 448]; and the scale rules on known values. */
static float e4m3_ref_value(int c) {
    const int e = (c >> 3) & 15, m = c & 7;
    const float a = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), e - 10);
    return (c & 0x80) ? -a : a;
}
static int e4m3_ref(float v) {
    int best = 0;
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) continue;
        const float d = fabsf(e4m3_ref_value(c) - v), bd = fabsf(e4m3_ref_value(best) - v);
        if (d < bd || (d == bd && (c & 1) == 0 && e4m3_ref_value(c) != e4m3_ref_value(best)))
            best = c;
    }
    if (e4m3_ref_value(best) == 0.0f) best = signbit(v) ? 0x80 : 0;
    return best;
}
static void fp8_e4m3(void **state) {
    (void)state;
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) continue;
        const float v = e4m3_ref_value(c);
        assert_true(epxi_e4m3_to_f32((uint8_t)c) == v);
        assert_int_equal(epxi_f32_to_e4m3(v), c == 0x80 ? 0x80 : c);
        if ((c & 0x7f) < 0x7e) { /* the midpoint to the next code up: ties to even */
            const float mid = 0.5f * (v + e4m3_ref_value(c + 1));
            assert_int_equal(epxi_f32_to_e4m3(mid), e4m3_ref(mid));
        }
    }
    uint64_t rng = 12345;
    for (int i = 0; i < 200000; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        const float v = ((float)(rng >> 40) / 16777216.0f * 2.0f - 1.0f) *
                        ldexpf(448.0f, -(int)((rng >> 20) % 14));
        if (epxi_f32_to_e4m3(v) != e4m3_ref(v))
            fail_msg("e4m3 of %.9g: %d, expected %d (seed 12345, draw %d)", (double)v,
                     epxi_f32_to_e4m3(v), e4m3_ref(v), i);
    }
    float scale, factor;
    epxi_fp8_scale(448.0f, 0, &scale, &factor);
    assert_true(scale == 448.0f * (float)(1.0 / 448.0) && factor == 1.0f);
    epxi_fp8_scale(0.0f, 0, &scale, &factor); /* amax at least 1e-4 */
    assert_true(factor == 448.0f / 1e-4f);
    epxi_fp8_scale(3.0f, 1, &scale, &factor); /* 3/448 -> 2^-7 */
    assert_true(scale == 0.0078125f && factor == 128.0f);
    epxi_fp8_scale(448.0f * 0.0078125f, 1, &scale, &factor); /* exactly 2^-7 stays */
    assert_true(scale == 0.0078125f);
    assert_int_equal(epxi_fp8_quantize(1000.0f, 1.0f), 0x7e); /* clamped to 448 */
    assert_int_equal(epxi_fp8_quantize(-1000.0f, 1.0f), 0xfe);
}

/* epx_fp8_cast_rows / _back_rows: the bits of the oracle above, and the
 * error against the fp32 row bounded: within half an e4m3 step of each
 * value (|x| / 16) or, below the normal range, half a subnormal step
 * (scale / 1024). */
static void fp8_rows(void **state) {
    (void)state;
    const int64_t R = 5, H = 384, G = H / 128;
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)(R * H));
    uint8_t *d = malloc((size_t)(R * H));
    float *sc = malloc(sizeof(float) * (size_t)(R * G)),
          *back = malloc(sizeof(float) * (size_t)(R * H));
    const uint64_t seed = tu_seed(20261203);
    uint64_t rng = seed;
    for (int round = 0; round < 2; round++) {
        for (int64_t i = 0; i < R * H; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            const float mag = ldexpf(1.0f, (int)((rng >> 50) % 24) - 12); /* wide spread */
            x[i] = epxi_f32_to_bf16(((float)(rng >> 40) / 16777216.0f - 0.5f) * mag);
        }
        epx_error err = {0};
        assert_int_equal(epx_fp8_cast_rows(x, R, H, round, d, sc, &err), EPX_OK);
        assert_int_equal(epx_fp8_cast_back_rows(d, sc, R, H, back, &err), EPX_OK);
        double worst = 0.0;
        for (int64_t r = 0; r < R; r++)
            for (int64_t g = 0; g < G; g++) {
                float amax = 0.0f;
                for (int i = 0; i < 128; i++)
                    amax = fmaxf(amax, fabsf(epxi_bf16_to_f32(x[r * H + g * 128 + i])));
                const float scale = sc[r * G + g],
                            factor = round ? 1.0f / scale : 448.0f / fmaxf(amax, 1e-4f);
                for (int i = 0; i < 128; i++) {
                    const int64_t at = r * H + g * 128 + i;
                    const float v = epxi_bf16_to_f32(x[at]);
                    const float q = fminf(fmaxf(v * factor, -448.0f), 448.0f);
                    if (d[at] != e4m3_ref(q))
                        fail_msg("row %lld value %lld: e4m3 %d, expected %d (seed %llu)",
                                 (long long)r, (long long)(g * 128 + i), d[at], e4m3_ref(q),
                                 (unsigned long long)seed);
                    const double e = fabs((double)back[at] - v);
                    const double bound = fmax(fabs(v) / 16.0, scale / 1024.0) * (1 + 1e-6);
                    if (e > bound)
                        fail_msg("row %lld value %lld: |%.9g - %.9g| above %.3g (seed %llu)",
                                 (long long)r, (long long)(g * 128 + i), (double)back[at],
                                 (double)v, bound, (unsigned long long)seed);
                    if (e / fmax(fabs(v), 1e-30) > worst && fabs(v) * factor >= 0.015625)
                        worst = e / fabs(v);
                }
            }
        print_message("fp8 rows (round_scale %d): worst relative error on normal values %.4f\n",
                      round, worst);
    }
    epx_error err = {0};
    assert_int_equal(epx_fp8_cast_rows(x, R, 200, 0, d, sc, &err), EPX_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "hidden 200"));
    free(x), free(d), free(sc), free(back);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(philox_known_answers),
        cmocka_unit_test(map_modes),
        cmocka_unit_test(map_errors),
        cmocka_unit_test(layout_random),
        cmocka_unit_test(layout_errors),
        cmocka_unit_test(permute_combine),
        cmocka_unit_test(rows_errors),
        cmocka_unit_test(bf16_rounding),
        cmocka_unit_test(fp8_e4m3),
        cmocka_unit_test(fp8_rows),
        cmocka_unit_test(gather_is_the_scatter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
