/*
 * test_vllm_eplb.c - EPX_EPLB_RULE_VLLM_F64, vLLM >= 0.14.0's arithmetic
 * (vllm/distributed/eplb/policy/default.py, 0.14.0 - 0.34.0): numpy's
 * pairwise float32 group sums, float64 quotients load / replicas, float64
 * pack loads, ties to the lowest index (vLLM's np.argsort made stable).
 *   - two placements vLLM itself returned (tests/data/vllm/eplb.json,
 *     tools/vllm_eplb.py) where float32 and float64 part: the rule must
 *     equal vLLM >= 0.14.0, the DeepSeek rule vLLM 0.13.0 (float32);
 *   - random shapes against a slow, literal reference written here
 *     (linear scans, selection sort, double arithmetic): maps, replica
 *     ranks and counts identical, slot for slot;
 *   - an unknown rule is refused with a message naming the rules.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* ---- the slow reference ------------------------------------------------ */

/* numpy's pairwise_sum over float32: < 8 items one running sum, <= 128
 * eight running sums combined pairwise plus the tail, else two halves. */
static float ref_numpy_sum(const float *a, int n) {
    if (n < 8) {
        float s = 0.0f;
        for (int i = 0; i < n; i++) s += a[i];
        return s;
    }
    if (n <= 128) {
        float r[8];
        memcpy(r, a, sizeof r);
        int i = 8;
        for (; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        float s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) s += a[i];
        return s;
    }
    int h = n / 2;
    h -= h % 8;
    return ref_numpy_sum(a, h) + ref_numpy_sum(a + h, n - h);
}

/* balanced_packing with float64 items and pack loads; the next item is the
 * heaviest unused (lowest index on ties), its pack the lightest with room. */
static void ref_packing(const double *w, int n, int packs, int *pack, int *rank) {
    int per = n / packs;
    if (per == 1) {
        for (int i = 0; i < n; i++) pack[i] = i, rank[i] = 0;
        return;
    }
    int *used = calloc((size_t)n, sizeof *used), *items = calloc((size_t)packs, sizeof *items);
    double *pw = calloc((size_t)packs, sizeof *pw);
    for (int k = 0; k < n; k++) {
        int g = -1;
        for (int i = 0; i < n; i++)
            if (!used[i] && (g < 0 || w[i] > w[g])) g = i;
        used[g] = 1;
        int best = -1;
        for (int p = 0; p < packs; p++)
            if (items[p] < per && (best < 0 || pw[p] < pw[best])) best = p;
        pack[g] = best;
        rank[g] = items[best]++;
        pw[best] += w[g];
    }
    free(used);
    free(items);
    free(pw);
}

static void ref_layer(const float *w, int E, int P, int groups, int nodes, int gpus, int *p2l,
                      int *prank, int *logcnt) {
    int gs = E / groups, gpn = groups / nodes, ppg = P / gpus, epn = E / nodes, ppn = P / nodes;
    double *tpg = calloc((size_t)groups, sizeof *tpg);
    int *gp = calloc((size_t)groups, sizeof *gp), *gr = calloc((size_t)groups, sizeof *gr);
    /* the group loads are float32 (numpy's sum), packed with float64 loads */
    for (int g = 0; g < groups; g++) tpg[g] = (double)ref_numpy_sum(w + g * gs, gs);
    ref_packing(tpg, groups, nodes, gp, gr);
    int *l2m = calloc((size_t)E, sizeof *l2m), *m2l = calloc((size_t)E, sizeof *m2l);
    for (int e = 0; e < E; e++) l2m[e] = (gp[e / gs] * gpn + gr[e / gs]) * gs + e % gs;
    for (int e = 0; e < E; e++) m2l[l2m[e]] = e;
    double *tpp = calloc((size_t)ppn, sizeof *tpp);
    int *ph = calloc((size_t)ppn, sizeof *ph), *rk = calloc((size_t)ppn, sizeof *rk);
    int *cnt = calloc((size_t)E, sizeof *cnt);
    int *pk = calloc((size_t)ppn, sizeof *pk), *rp = calloc((size_t)ppn, sizeof *rp);
    for (int n = 0; n < nodes; n++) {
        const int *m = m2l + n * epn;
        int *c = cnt + n * epn;
        for (int i = 0; i < epn; i++) ph[i] = i, rk[i] = 0, c[i] = 1;
        for (int i = epn; i < ppn; i++) {
            int best = 0;
            for (int e = 1; e < epn; e++)
                if ((double)w[m[e]] / c[e] > (double)w[m[best]] / c[best]) best = e;
            ph[i] = best;
            rk[i] = c[best]++;
        }
        for (int p = 0; p < ppn; p++) tpp[p] = (double)w[m[ph[p]]] / c[ph[p]];
        ref_packing(tpp, ppn, gpus / nodes, pk, rp);
        for (int p = 0; p < ppn; p++) {
            int q = n * ppn + pk[p] * ppg + rp[p];
            p2l[q] = m[ph[p]];
            prank[q] = rk[p];
        }
    }
    for (int e = 0; e < E; e++) logcnt[e] = cnt[l2m[e]];
    free(tpg), free(gp), free(gr), free(l2m), free(m2l), free(tpp);
    free(ph), free(rk), free(cnt), free(pk), free(rp);
}

/* ---- vLLM's own answers --------------------------------------------------- */

static void plan_rule(const float *w, int L, int E, int P, int groups, int nodes, int G,
                      epx_eplb_rule rule, int32_t *p2l) {
    epx_error err = {0};
    epx_status st =
        epx_plan_deepseek_rule(w, L, E, P, groups, nodes, G, 1, rule, p2l, NULL, NULL, &err);
    if (st != EPX_OK) fail_msg("%s", err.msg);
}

/* float64_sums_n1: loads 0 - 9 split over three replicas; GPU sums of
 * thirds that tie in float32 and not in float64. vLLM 0.13.0 and 0.34.0
 * with stable sorts (the same placements 0.14.0 - 0.19.0 return). */
static void float64_quotients_and_sums(void **state) {
    (void)state;
    const float w[2][16] = {{1, 2, 7, 0, 8, 0, 2, 2, 1, 0, 1, 4, 3, 8, 0, 0},
                            {0, 7, 8, 0, 0, 6, 2, 1, 1, 3, 6, 2, 6, 3, 2, 0}};
    const int32_t v013[2][24] = {
        {4, 4, 7, 12, 0, 15, 13, 13, 1, 12, 8, 3, 4, 2, 2, 11, 5, 14, 13, 2, 6, 11, 10, 9},
        {10, 10, 2, 6, 7, 3, 12, 12, 1, 1, 8, 0, 13, 5, 1, 11, 9, 15, 5, 2, 2, 14, 9, 4}};
    const int32_t v034[2][24] = {
        {4, 4, 7, 11, 5, 14, 13, 13, 1, 12, 0, 15, 4, 2, 2, 12, 8, 3, 13, 2, 6, 11, 10, 9},
        {10, 10, 2, 6, 8, 0, 12, 12, 1, 11, 9, 15, 13, 5, 1, 14, 9, 4, 5, 2, 2, 1, 7, 3}};
    int32_t p2l[2][24];
    plan_rule(&w[0][0], 2, 16, 24, 4, 1, 4, EPX_EPLB_RULE_VLLM_F64, &p2l[0][0]);
    assert_memory_equal(p2l, v034, sizeof p2l);
    plan_rule(&w[0][0], 2, 16, 24, 4, 1, 4, EPX_EPLB_RULE_DEEPSEEK, &p2l[0][0]);
    assert_memory_equal(p2l, v013, sizeof p2l);
}

/* 64 float loads in 4 groups of 16 on 2 nodes, 8 GPUs, 80 slots: groups 0
 * and 1 hold the same loads in another order, so their sums part only in
 * rounding, and numpy's pairwise sum orders them against the running sum.
 * No sort key ties here: vLLM 0.14.0 - 0.34.0 return this placement as
 * released; the DeepSeek rule (float32 running sums) swaps the groups. */
static void numpy_group_sums(void **state) {
    (void)state;
    const float w[64] = {
        960.179871f, 21.1358776f, 189.184753f, 423.007568f, 550.851135f, 778.428894f, 556.714355f,
        518.633423f, 239.263641f, 650.133057f, 582.367065f, 945.658325f, 189.754669f, 124.763519f,
        353.514221f, 325.620972f, 21.1358776f, 582.367065f, 239.263641f, 189.754669f, 945.658325f,
        650.133057f, 960.179871f, 325.620972f, 556.714355f, 423.007568f, 189.184753f, 353.514221f,
        550.851135f, 778.428894f, 124.763519f, 518.633423f, 755.226196f, 204.787781f, 148.293381f,
        467.114288f, 133.733551f, 845.634644f, 766.121887f, 751.341064f, 370.461761f, 708.142944f,
        352.564209f, 412.072388f, 95.5454559f, 33.6772728f, 603.368652f, 173.927383f, 860.780884f,
        508.502655f, 518.825989f, 805.051025f, 267.781769f, 9.70099354f, 197.753342f, 412.033936f,
        136.714417f, 252.654633f, 663.890808f, 339.238281f, 307.386963f, 210.22731f,  478.401764f,
        895.86853f};
    const int32_t vllm[80] = {21, 22, 25, 37, 38, 39, 27, 33, 47, 30, 46, 22, 20, 37, 38, 39,
                              42, 19, 26, 44, 17, 31, 20, 43, 32, 40, 41, 18, 34, 45, 24, 28,
                              35, 29, 29, 32, 41, 23, 36, 16, 10, 0,  63, 48, 55, 59, 15, 60,
                              2,  53, 6,  0,  62, 48, 51, 14, 9,  57, 61, 13, 4,  49, 11, 3,
                              51, 58, 58, 52, 54, 56, 50, 7,  11, 63, 5,  5,  9,  8,  12, 1};
    int32_t p2l[80];
    plan_rule(w, 1, 64, 80, 4, 2, 8, EPX_EPLB_RULE_VLLM_F64, p2l);
    assert_memory_equal(p2l, vllm, sizeof p2l);
    plan_rule(w, 1, 64, 80, 4, 2, 8, EPX_EPLB_RULE_DEEPSEEK, p2l);
    /* float32: group 1 is the heavier, so it takes node 0 */
    assert_int_equal(p2l[0], 9);
    assert_true(memcmp(p2l, vllm, sizeof p2l) != 0);
}

/* ---- random comparison --------------------------------------------------- */

static float random_weight(tu_rng *r, int kind) {
    switch (kind) {
    case 0: return (float)(tu_uniform(r) * 1000.0); /* float */
    case 1: return (float)tu_below(r, 10);          /* small: thirds, ties */
    case 2: return tu_below(r, 3) == 0 ? (float)tu_below(r, 50000) : 0.0f;
    default: return (float)(tu_uniform(r) * 1e7); /* large floats: group sums round */
    }
}

static void compare_shape(tu_rng *r, int L, int E, int P, int groups, int nodes, int G, int hier,
                          int kind) {
    const int X = P - E + 1;
    float *w = malloc(sizeof(float) * (size_t)(L * E));
    for (int i = 0; i < L * E; i++) w[i] = random_weight(r, kind);
    int32_t *p2l = malloc(sizeof(int32_t) * (size_t)(L * P));
    int32_t *cnt = malloc(sizeof(int32_t) * (size_t)(L * E));
    int32_t *l2p = malloc(sizeof(int32_t) * (size_t)(L * E * X));
    epx_error err = {0};
    epx_status st = epx_plan_deepseek_rule(w, L, E, P, groups, nodes, G, hier,
                                           EPX_EPLB_RULE_VLLM_F64, p2l, l2p, cnt, &err);
    if (st != EPX_OK) fail_msg("L=%d E=%d P=%d: %s", L, E, P, err.msg);
    int *rp2l = malloc(sizeof(int) * (size_t)P), *rrank = malloc(sizeof(int) * (size_t)P);
    int *rcnt = malloc(sizeof(int) * (size_t)E);
    for (int l = 0; l < L; l++) {
        ref_layer(w + l * E, E, P, hier ? groups : 1, hier ? nodes : 1, G, rp2l, rrank, rcnt);
        for (int p = 0; p < P; p++) {
            if (p2l[l * P + p] != rp2l[p])
                fail_msg("E=%d P=%d groups=%d nodes=%d G=%d hier=%d kind=%d: layer %d slot %d: "
                         "%d vs reference %d",
                         E, P, groups, nodes, G, hier, kind, l, p, p2l[l * P + p], rp2l[p]);
            assert_int_equal(l2p[(l * E + rp2l[p]) * X + rrank[p]], p);
        }
        for (int e = 0; e < E; e++) assert_int_equal(cnt[l * E + e], rcnt[e]);
    }
    free(w), free(p2l), free(cnt), free(l2p), free(rp2l), free(rrank), free(rcnt);
}

static void random_vs_reference(void **state) {
    (void)state;
    tu_rng r = {tu_seed(20261203)};
    for (int iter = 0; iter < 2000; iter++) {
        const int nodes = 1 + (int)tu_below(&r, 4);
        const int G = nodes * (1 + (int)tu_below(&r, 4));
        const int groups = nodes * (1 + (int)tu_below(&r, 4));
        const int E = groups * (1 + (int)tu_below(&r, 12));
        int P = ((E + G - 1) / G) * G + G * (int)tu_below(&r, 4);
        const int L = 1 + (int)tu_below(&r, 3);
        compare_shape(&r, L, E, P, groups, nodes, G, (int)tu_below(&r, 2), (int)tu_below(&r, 4));
    }
    /* Long rows: the merge sort (> 48 items) and numpy's blocks (groups of
     * 8 - 128 items and beyond 128, where it splits). */
    for (int iter = 0; iter < 8; iter++) {
        const int kind = iter % 4;
        compare_shape(&r, 2, 256, 320, 8, 8, 64, 1, kind);
        compare_shape(&r, 1, 256, 288, 8, 4, 32, 1, kind);
        compare_shape(&r, 1, 384, 416, 1, 1, 8, 0, kind);
        compare_shape(&r, 1, 600, 640, 2, 2, 8, 1, kind);
        compare_shape(&r, 1, 128, 256, 1, 1, 2, 0, kind);
    }
}

static void unknown_rule(void **state) {
    (void)state;
    float w[16];
    for (int i = 0; i < 16; i++) w[i] = (float)i;
    int32_t p2l[24];
    epx_error err = {0};
    assert_int_equal(
        epx_plan_deepseek_rule(w, 1, 16, 24, 4, 1, 4, 1, (epx_eplb_rule)4, p2l, NULL, NULL, &err),
        EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "rule 4", "EPX_EPLB_RULE_VLLM_F64", "vLLM >= 0.14.0");
    assert_int_equal(
        epx_plan_deepseek_rule(w, 1, 16, 24, 4, 1, 4, 1, (epx_eplb_rule)-1, p2l, NULL, NULL, &err),
        EPX_ERR_INVALID_ARG);
    /* the rule's own input checks are the DeepSeek ones */
    w[3] = -2.0f;
    assert_int_equal(epx_plan_deepseek_rule(w, 1, 16, 24, 4, 1, 4, 1, EPX_EPLB_RULE_VLLM_F64, p2l,
                                            NULL, NULL, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "expert 3");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(float64_quotients_and_sums),
        cmocka_unit_test(numpy_group_sums),
        cmocka_unit_test(random_vs_reference),
        cmocka_unit_test(unknown_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
