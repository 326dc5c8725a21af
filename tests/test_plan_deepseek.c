/*
 * test_plan_deepseek.c - epx_plan_deepseek against a slow, obviously literal
 * reference written here (a transliteration of shared/tools/eplb_model.py:
 * linear scans, selection sort, float32 arithmetic, lowest index on ties),
 * on random shapes and loads with and without ties: the maps, ranks and
 * counts must be identical, slot for slot. Also the input errors.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* ---- the slow reference ------------------------------------------------ */

static void ref_packing(const float *w, int n, int packs, int *pack, int *rank) {
    int per = n / packs;
    if (per == 1) {
        for (int i = 0; i < n; i++) pack[i] = i, rank[i] = 0;
        return;
    }
    int *used = calloc((size_t)n, sizeof *used), *items = calloc((size_t)packs, sizeof *items);
    float *pw = calloc((size_t)packs, sizeof *pw);
    for (int k = 0; k < n; k++) {
        /* next item: the heaviest unused one, lowest index on ties */
        int g = -1;
        for (int i = 0; i < n; i++)
            if (!used[i] && (g < 0 || w[i] > w[g])) g = i;
        used[g] = 1;
        int best = -1;
        for (int p = 0; p < packs; p++)
            if (items[p] < per && (best < 0 || pw[p] < pw[best])) best = p;
        pack[g] = best;
        rank[g] = items[best]++;
        pw[best] = pw[best] + w[g];
    }
    free(used);
    free(items);
    free(pw);
}

static void ref_replicate(const float *w, int n, int num_phy, int *p2l, int *rk, int *cnt) {
    for (int i = 0; i < n; i++) p2l[i] = i, rk[i] = 0, cnt[i] = 1;
    for (int i = n; i < num_phy; i++) {
        int best = 0;
        float bv = w[0] / (float)cnt[0];
        for (int e = 1; e < n; e++) {
            float v = w[e] / (float)cnt[e];
            if (v > bv) best = e, bv = v;
        }
        p2l[i] = best;
        rk[i] = cnt[best]++;
    }
}

/* One layer of rebalance_experts_hierarchical(w, P, groups, nodes, gpus). */
static void ref_layer(const float *w, int E, int P, int groups, int nodes, int gpus, int *p2l,
                      int *prank, int *logcnt) {
    int gs = E / groups, gpn = groups / nodes, ppg = P / gpus, epn = E / nodes, ppn = P / nodes;
    float *tpg = calloc((size_t)groups, sizeof *tpg);
    int *gp = calloc((size_t)groups, sizeof *gp), *gr = calloc((size_t)groups, sizeof *gr);
    for (int g = 0; g < groups; g++) {
        float s = 0.0f;
        for (int e = g * gs; e < (g + 1) * gs; e++) s = s + w[e];
        tpg[g] = s;
    }
    ref_packing(tpg, groups, nodes, gp, gr);
    int *l2m = calloc((size_t)E, sizeof *l2m), *m2l = calloc((size_t)E, sizeof *m2l);
    for (int e = 0; e < E; e++) l2m[e] = (gp[e / gs] * gpn + gr[e / gs]) * gs + e % gs;
    for (int e = 0; e < E; e++) m2l[l2m[e]] = e;
    float *row = calloc((size_t)epn, sizeof *row), *tpp = calloc((size_t)ppn, sizeof *tpp);
    int *ph = calloc((size_t)ppn, sizeof *ph), *rk = calloc((size_t)ppn, sizeof *rk);
    int *mcnt = calloc((size_t)E, sizeof *mcnt);
    int *pk = calloc((size_t)ppn, sizeof *pk), *rp = calloc((size_t)ppn, sizeof *rp);
    for (int n = 0; n < nodes; n++) {
        for (int j = 0; j < epn; j++) row[j] = w[m2l[n * epn + j]];
        ref_replicate(row, epn, ppn, ph, rk, mcnt + n * epn);
        for (int p = 0; p < ppn; p++) tpp[p] = row[ph[p]] / (float)mcnt[n * epn + ph[p]];
        ref_packing(tpp, ppn, gpus / nodes, pk, rp);
        for (int p = 0; p < ppn; p++) {
            int q = n * ppn + pk[p] * ppg + rp[p];
            p2l[q] = m2l[n * epn + ph[p]];
            prank[q] = rk[p];
        }
    }
    for (int e = 0; e < E; e++) logcnt[e] = mcnt[l2m[e]];
    free(tpg), free(gp), free(gr), free(l2m), free(m2l), free(row), free(tpp);
    free(ph), free(rk), free(mcnt), free(pk), free(rp);
}

/* ---- random comparison --------------------------------------------------- */

static float random_weight(tu_rng *r, int kind) {
    switch (kind) {
    case 0: return (float)(tu_uniform(r) * 1000.0);                        /* float, no ties  */
    case 1: return (float)tu_below(r, 6);                                  /* heavy ties      */
    case 2: return tu_below(r, 3) == 0 ? (float)tu_below(r, 50000) : 0.0f; /* sparse */
    default: return (float)(1 + tu_below(r, 20000));                       /* token counts    */
    }
}

static void compare_shape(tu_rng *r, int L, int E, int P, int groups, int nodes, int G, int hier,
                          int kind) {
    const int X = P - E + 1;
    float *w = malloc(sizeof(float) * (size_t)(L * E));
    for (int i = 0; i < L * E; i++) w[i] = random_weight(r, kind);
    int32_t *p2l = malloc(sizeof(int32_t) * (size_t)(L * P)),
            *cnt = malloc(sizeof(int32_t) * (size_t)(L * E));
    int32_t *l2p = malloc(sizeof(int32_t) * (size_t)(L * E * X));
    epx_error err = {0};
    epx_status st = epx_plan_deepseek(w, L, E, P, groups, nodes, G, hier, p2l, l2p, cnt, &err);
    if (st != EPX_OK)
        fprintf(stderr, "L=%d E=%d P=%d groups=%d nodes=%d G=%d: %s\n", L, E, P, groups, nodes, G,
                err.msg);
    assert_int_equal(st, EPX_OK);
    int *rp2l = malloc(sizeof(int) * (size_t)P), *rrank = malloc(sizeof(int) * (size_t)P);
    int *rcnt = malloc(sizeof(int) * (size_t)E);
    for (int l = 0; l < L; l++) {
        ref_layer(w + l * E, E, P, hier ? groups : 1, hier ? nodes : 1, G, rp2l, rrank, rcnt);
        for (int p = 0; p < P; p++) {
            if (p2l[l * P + p] != rp2l[p])
                fprintf(stderr,
                        "L=%d E=%d P=%d groups=%d nodes=%d G=%d hier=%d kind=%d: layer %d slot %d: "
                        "%d vs reference %d\n",
                        L, E, P, groups, nodes, G, hier, kind, l, p, p2l[l * P + p], rp2l[p]);
            assert_int_equal(p2l[l * P + p], rp2l[p]);
            /* replica rank order: slot p is replica rrank[p] of its expert */
            assert_int_equal(l2p[(l * E + rp2l[p]) * X + rrank[p]], p);
        }
        for (int e = 0; e < E; e++) assert_int_equal(cnt[l * E + e], rcnt[e]);
    }
    free(w), free(p2l), free(cnt), free(l2p), free(rp2l), free(rrank), free(rcnt);
}

static void random_vs_reference(void **state) {
    (void)state;
    tu_rng r = {tu_seed(20250611)};
    for (int iter = 0; iter < 3000; iter++) {
        const int nodes = 1 + (int)tu_below(&r, 4);
        const int G = nodes * (1 + (int)tu_below(&r, 4));
        const int groups = nodes * (1 + (int)tu_below(&r, 4));
        const int E = groups * (1 + (int)tu_below(&r, 6));
        /* P >= E, a multiple of G; sometimes no redundancy, sometimes a lot */
        int P = ((E + G - 1) / G) * G + G * (int)tu_below(&r, 4);
        const int L = 1 + (int)tu_below(&r, 3);
        const int hier = (int)tu_below(&r, 2);
        compare_shape(&r, L, E, P, groups, nodes, G, hier, (int)tu_below(&r, 4));
    }
    /* Larger rows: the radix sort (> 48 items) and deep heaps. */
    for (int iter = 0; iter < 12; iter++) {
        const int kind = iter % 4;
        compare_shape(&r, 2, 384, 416, 1, 1, 8, 0, kind);
        compare_shape(&r, 2, 256, 320, 8, 8, 64, 1, kind);
        compare_shape(&r, 1, 256, 288, 8, 4, 32, 1, kind);
        compare_shape(&r, 1, 256, 512, 8, 2, 4, 1, kind);
        compare_shape(&r, 1, 128, 256, 1, 1, 2, 0, kind);
    }
}

/* Loads that tie exactly everywhere: every choice is a tie, lowest index wins. */
static void all_equal_loads(void **state) {
    (void)state;
    float w[8] = {5, 5, 5, 5, 5, 5, 5, 5};
    int32_t p2l[12], cnt[8];
    epx_error err = {0};
    assert_int_equal(epx_plan_deepseek(w, 1, 8, 12, 1, 1, 4, 0, p2l, NULL, cnt, &err), EPX_OK);
    /* Redundant slots go to experts 0..3; every count is 1 or 2. */
    for (int e = 0; e < 8; e++) assert_int_equal(cnt[e], e < 4 ? 2 : 1);
    int rp2l[12], rrank[12], rcnt[8];
    ref_layer(w, 8, 12, 1, 1, 4, rp2l, rrank, rcnt);
    for (int p = 0; p < 12; p++) assert_int_equal(p2l[p], rp2l[p]);
    /* All zero: still a valid placement. */
    float z[8] = {0};
    assert_int_equal(epx_plan_deepseek(z, 1, 8, 12, 1, 1, 4, 0, p2l, NULL, cnt, &err), EPX_OK);
    ref_layer(z, 8, 12, 1, 1, 4, rp2l, rrank, rcnt);
    for (int p = 0; p < 12; p++) assert_int_equal(p2l[p], rp2l[p]);
}

static void input_errors(void **state) {
    (void)state;
    float w[16];
    for (int i = 0; i < 16; i++) w[i] = (float)i;
    int32_t p2l[64];
    epx_error err = {0};
    assert_int_equal(epx_plan_deepseek(NULL, 1, 16, 16, 1, 1, 4, 0, p2l, NULL, NULL, &err),
                     EPX_ERR_INVALID_ARG);
    /* 18 slots over 4 GPUs */
    assert_int_equal(epx_plan_deepseek(w, 1, 16, 18, 1, 1, 4, 0, p2l, NULL, NULL, &err),
                     EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "18", "4", "20");
    /* fewer slots than experts */
    assert_int_equal(epx_plan_deepseek(w, 1, 16, 12, 1, 1, 4, 0, p2l, NULL, NULL, &err),
                     EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "12", "16");
    /* hierarchical: 3 groups do not divide 16 experts */
    assert_int_equal(epx_plan_deepseek(w, 1, 16, 16, 3, 1, 4, 1, p2l, NULL, NULL, &err),
                     EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "16", "3", "groups");
    /* hierarchical: 4 groups do not split over 8 nodes */
    assert_int_equal(epx_plan_deepseek(w, 1, 16, 16, 4, 8, 8, 1, p2l, NULL, NULL, &err),
                     EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "4 groups", "8 nodes", "--algorithm deepseek");
    assert_int_equal(epx_plan_deepseek(w, 1, 16, 16, 0, 1, 4, 1, p2l, NULL, NULL, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "groups");
    /* ...while the global policy ignores groups and nodes, as the reference does */
    assert_int_equal(epx_plan_deepseek(w, 1, 16, 16, 3, 8, 4, 0, p2l, NULL, NULL, &err), EPX_OK);
    w[5] = -1.0f;
    assert_int_equal(epx_plan_deepseek(w, 1, 16, 16, 1, 1, 4, 0, p2l, NULL, NULL, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "expert 5", "-1");
    w[5] = NAN;
    assert_int_equal(epx_plan_deepseek(w, 1, 16, 16, 1, 1, 4, 0, p2l, NULL, NULL, &err),
                     EPX_ERR_INVALID_ARG);
    w[5] = INFINITY;
    assert_int_equal(epx_plan_deepseek(w, 1, 16, 16, 1, 1, 4, 0, p2l, NULL, NULL, &err),
                     EPX_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(random_vs_reference),
        cmocka_unit_test(all_equal_loads),
        cmocka_unit_test(input_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
