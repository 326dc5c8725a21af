/*
 * test_moe.c - the reference MoE layer: router rules on hand-worked cases,
 * experts against a double-precision recomputation, the TP split, the model
 * table, configuration errors, and the bf16 conversions.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "epx_comm.h"
#include "testutil.h"

static epx_moe_config cfg_of(int32_t H, int32_t I, int32_t E, int32_t K, epx_moe_scoring s) {
    epx_moe_config c = EPX_MOE_CONFIG_INIT;
    c.hidden = H;
    c.intermediate = I;
    c.num_experts = E;
    c.top_k = K;
    c.scoring = s;
    return c;
}

static void router_softmax(void **state) {
    (void)state;
    epx_moe_config c = cfg_of(1, 1, 4, 2, EPX_MOE_SCORING_SOFTMAX);
    float logits[4] = {1, 3, 2, 0};
    int32_t ids[2];
    float w[2];
    epx_error err = {0};
    assert_int_equal(epx_moe_route(&c, logits, NULL, 1, ids, w, &err), EPX_OK);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 2);
    double z = exp(1 - 3.0) + 1 + exp(2 - 3.0) + exp(0 - 3.0);
    assert_float_equal(w[0], 1 / z, 1e-6);
    assert_float_equal(w[1], exp(-1.0) / z, 1e-6);
    c.norm_topk_prob = 1;
    c.routed_scaling_factor = 2.0f;
    assert_int_equal(epx_moe_route(&c, logits, NULL, 1, ids, w, &err), EPX_OK);
    assert_float_equal(w[0], 2 / (1 + exp(-1.0)), 1e-6);
    assert_float_equal(w[0] + w[1], 2.0, 1e-6);
    /* ties go to the lower id */
    float tie[4] = {5, 5, 5, 1};
    assert_int_equal(epx_moe_route(&c, tie, NULL, 1, ids, w, &err), EPX_OK);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 1);
    /* a non-finite logit has no weight: it made every weight NaN */
    float inf[8] = {0, 1, 2, 3, INFINITY, 0, 0, 0};
    assert_int_equal(epx_moe_route(&c, inf, NULL, 2, ids, w, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "logits[1][0] is inf", "finite");
    float nan_bias[4] = {0, NAN, 0, 0};
    assert_int_equal(epx_moe_route(&c, logits, nan_bias, 1, ids, w, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "bias[1] is nan");
}

static void router_softmax_topk(void **state) {
    (void)state;
    epx_moe_config c = cfg_of(1, 1, 5, 2, EPX_MOE_SCORING_SOFTMAX_TOPK);
    float logits[5] = {0, 4, 1, 3, -2};
    int32_t ids[2];
    float w[2];
    assert_int_equal(epx_moe_route(&c, logits, NULL, 1, ids, w, NULL), EPX_OK);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 3);
    assert_float_equal(w[0], 1 / (1 + exp(-1.0)), 1e-6);
    assert_float_equal(w[1], exp(-1.0) / (1 + exp(-1.0)), 1e-6);
}

/* DeepSeek's noaux_tc: the bias steers the choice, not the weights; the
 * group score is the sum of a group's two best biased scores. */
static void router_sigmoid_grouped(void **state) {
    (void)state;
    epx_moe_config c = cfg_of(1, 1, 8, 2, EPX_MOE_SCORING_SIGMOID);
    c.n_group = 4;
    c.topk_group = 2;
    c.norm_topk_prob = 1;
    c.routed_scaling_factor = 2.5f;
    /* groups: {0,1} {2,3} {4,5} {6,7} */
    float logits[8] = {2.0f, -3.0f, 0.5f, 0.4f, 0.3f, 0.2f, -1.0f, 1.5f};
    float bias[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int32_t ids[2];
    float w[2];
    assert_int_equal(epx_moe_route(&c, logits, bias, 1, ids, w, NULL), EPX_OK);
    /* group sums: g0 = s(2)+s(-3) = .881+.047 = .928; g1 = .622+.599 = 1.221;
     * g2 = .574+.550 = 1.124; g3 = .269+.818 = 1.087 -> keep g1, g2; the best
     * two experts there are 2 and 3, although expert 0 scores highest. */
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[1], 3);
    double s2 = 1 / (1 + exp(-0.5)), s3 = 1 / (1 + exp(-0.4));
    assert_float_equal(w[0], 2.5 * s2 / (s2 + s3), 1e-5);
    assert_float_equal(w[1], 2.5 * s3 / (s2 + s3), 1e-5);
    /* A bias on expert 7 moves group 3 up and 7 into the choice, while the
     * weight stays its unbiased sigmoid. */
    bias[7] = 1.0f;
    assert_int_equal(epx_moe_route(&c, logits, bias, 1, ids, w, NULL), EPX_OK);
    assert_int_equal(ids[0], 7);
    assert_int_equal(ids[1], 2);
    double s7 = 1 / (1 + exp(-1.5));
    assert_float_equal(w[0], 2.5 * s7 / (s7 + s2), 1e-5);
    /* Ungrouped, no normalisation. */
    c.n_group = 1;
    c.topk_group = 1;
    c.norm_topk_prob = 0;
    c.routed_scaling_factor = 1.0f;
    assert_int_equal(epx_moe_route(&c, logits, NULL, 1, ids, w, NULL), EPX_OK);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 7);
    assert_float_equal(w[0], 1 / (1 + exp(-2.0)), 1e-6);
}

static void config_errors(void **state) {
    (void)state;
    epx_error err = {0};
    epx_moe_config c = cfg_of(8, 4, 6, 7, EPX_MOE_SCORING_SOFTMAX);
    assert_int_equal(epx_moe_config_check(&c, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "top_k (7)", "num_experts 6");
    c = cfg_of(8, 4, 6, 2, EPX_MOE_SCORING_SIGMOID);
    c.n_group = 4;
    assert_int_equal(epx_moe_config_check(&c, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "n_group (4)", "divide num_experts (6)");
    c.n_group = 3;
    c.topk_group = 1;
    c.top_k = 3;
    assert_int_equal(epx_moe_config_check(&c, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "keeps 2 experts", "raise topk_group");
    c = cfg_of(8, 4, 6, 2, EPX_MOE_SCORING_SOFTMAX);
    c.n_group = 2;
    assert_int_equal(epx_moe_config_check(&c, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "SIGMOID");
    c = cfg_of(8, 4, 6, 2, EPX_MOE_SCORING_SOFTMAX);
    c.routed_scaling_factor = 0.0f;
    assert_int_equal(epx_moe_config_check(&c, &err), EPX_ERR_INVALID_ARG);
    c.version = 0;
    assert_int_equal(epx_moe_config_check(&c, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "EPX_MOE_CONFIG_INIT");
    c = cfg_of(8, 4, 6, 2, EPX_MOE_SCORING_SOFTMAX);
    float x[8] = {0}, out[8];
    float g[4 * 8 * 6] = {0}, d[4 * 8 * 6] = {0};
    epx_moe_weights w = {NULL, NULL, g, g, d, NULL, NULL, NULL};
    int32_t ids[2] = {0, 6};
    float tw[2] = {1, 1};
    assert_int_equal(epx_moe_forward(&c, &w, x, 1, ids, tw, 0, 1, 1, out, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "topk_ids[0][1] = 6", "[-1, 6)");
    ids[1] = 0;
    assert_int_equal(epx_moe_forward(&c, &w, x, 1, ids, tw, 2, 5, 1, out, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "rank 2 of 5");
}

static void model_table(void **state) {
    (void)state;
    epx_moe_config c;
    epx_error err = {0};
    assert_int_equal(epx_moe_model_config("kimi-k2.5", &c, &err), EPX_OK);
    assert_int_equal(c.hidden, 7168);
    assert_int_equal(c.num_experts, 384);
    assert_int_equal(c.top_k, 8);
    assert_int_equal(c.scoring, EPX_MOE_SCORING_SIGMOID);
    assert_float_equal(c.routed_scaling_factor, 2.827, 1e-6);
    assert_int_equal(c.shared_intermediate, 2048);
    assert_int_equal(epx_moe_config_check(&c, &err), EPX_OK);
    assert_int_equal(epx_moe_model_config("deepseek-v3", &c, &err), EPX_OK);
    assert_int_equal(c.n_group, 8);
    assert_int_equal(c.topk_group, 4);
    assert_int_equal(epx_moe_model_config("qwen3-235b", &c, &err), EPX_OK);
    assert_int_equal(c.scoring, EPX_MOE_SCORING_SOFTMAX);
    assert_int_equal(c.shared_intermediate, 0);
    assert_int_equal(epx_moe_model_config("gpt-oss-120b", &c, &err), EPX_OK);
    assert_int_equal(c.scoring, EPX_MOE_SCORING_SOFTMAX_TOPK);
    /* every built-in shape has a routing rule and a valid config */
    int32_t n = 0;
    const epx_model *m = epx_model_list(&n);
    for (int32_t i = 0; i < n; i++) {
        assert_int_equal(epx_moe_model_config(m[i].name, &c, &err), EPX_OK);
        assert_int_equal(epx_moe_config_check(&c, &err), EPX_OK);
    }
    assert_int_equal(epx_moe_model_config("gpt-5", &c, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "gpt-5", "kimi-k2");
}

/* Experts and the whole forward against a double recomputation; the TP
 * slices of an expert add up to the whole one. */
static void expert_and_tp_slices(void **state) {
    (void)state;
    tu_rng r = {tu_seed(8101)};
    for (int it = 0; it < 50; it++) {
        int32_t H = 1 + (int32_t)tu_below(&r, 20), I = 1 + (int32_t)tu_below(&r, 20);
        size_t n = (size_t)H * I;
        float *g = malloc(n * 4), *u = malloc(n * 4), *d = malloc(n * 4),
              *x = malloc((size_t)H * 4);
        for (size_t i = 0; i < n; i++) {
            g[i] = (float)(tu_uniform(&r) - 0.5);
            u[i] = (float)(tu_uniform(&r) - 0.5);
            d[i] = (float)(tu_uniform(&r) - 0.5);
        }
        for (int32_t h = 0; h < H; h++) x[h] = (float)(tu_uniform(&r) * 2 - 1);
        epx_moe_expert ex = {g, u, d, I, I};
        float *y = malloc((size_t)H * 4), *ys = calloc((size_t)H, 4), *work = malloc((size_t)I * 4);
        assert_int_equal(epx_moe_expert_forward(&ex, H, x, H, NULL, 1, y, work, NULL), EPX_OK);
        for (int32_t j = 0; j < H; j++) {
            double acc = 0, mag = 0;
            for (int32_t i = 0; i < I; i++) {
                double a = 0, b = 0;
                for (int32_t h = 0; h < H; h++) {
                    a += (double)g[i * H + h] * x[h];
                    b += (double)u[i * H + h] * x[h];
                }
                double hv = a / (1 + exp(-a)) * b;
                acc += d[j * I + i] * hv;
                mag += fabs(d[j * I + i] * hv) + fabs(hv);
            }
            assert_true(fabs(y[j] - acc) <= 4.0 * (H + I) * FLT_EPSILON * (mag + 1e-3));
        }
        int32_t R = 1 + (int32_t)tu_below(&r, (uint32_t)(I < 4 ? I : 4));
        float *part = malloc((size_t)H * 4);
        for (int32_t q = 0; q < R; q++) {
            int32_t i0, i1;
            epx_moe_tp_split(I, q, R, &i0, &i1);
            assert_true(i1 > i0);
            epx_moe_expert sl = {g + (size_t)i0 * H, u + (size_t)i0 * H, d + i0, i1 - i0, I};
            assert_int_equal(epx_moe_expert_forward(&sl, H, x, H, NULL, 1, part, work, NULL),
                             EPX_OK);
            for (int32_t j = 0; j < H; j++) ys[j] += part[j];
        }
        for (int32_t j = 0; j < H; j++) assert_float_equal(ys[j], y[j], 1e-4);
        int32_t a0, a1;
        epx_moe_tp_split(10, 3, 4, &a0, &a1);
        assert_int_equal(a0, 8);
        assert_int_equal(a1, 10);
        epx_moe_tp_split(10, 0, 4, &a0, &a1);
        assert_int_equal(a1, 3);
        free(g), free(u), free(d), free(x), free(y), free(ys), free(work), free(part);
    }
}

static void bf16_round_trip(void **state) {
    (void)state;
    assert_int_equal(epx_bf16_from_f32(1.0f), 0x3f80);
    /* 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: even wins */
    assert_int_equal(epx_bf16_from_f32(1.0f + 0x1p-8f), 0x3f80);
    assert_int_equal(epx_bf16_from_f32(1.0f + 0x1p-8f + 0x1p-12f), 0x3f81);
    assert_int_equal(epx_bf16_from_f32(1.0f + 3 * 0x1p-8f), 0x3f82);
    assert_true(isnan(epx_bf16_to_f32(epx_bf16_from_f32(NAN))));
    assert_float_equal(epx_bf16_to_f32(epx_bf16_from_f32(-2.5f)), -2.5, 0);
    assert_int_equal(epx_dtype_size(EPX_DTYPE_BF16), 2);
    assert_int_equal(epx_dtype_size((epx_dtype)99), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(router_softmax),
        cmocka_unit_test(router_softmax_topk),
        cmocka_unit_test(router_sigmoid_grouped),
        cmocka_unit_test(config_errors),
        cmocka_unit_test(model_table),
        cmocka_unit_test(expert_and_tp_slices),
        cmocka_unit_test(bf16_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
