/*
 * epx/moe.h - a reference Mixture-of-Experts layer on the CPU, in fp32: the
 * router (softmax top-k; DeepSeek/Kimi sigmoid scoring with grouped top-k and
 * a routed scaling factor; softmax over the chosen top-k), SwiGLU experts
 * (gate, up, down) and optional shared experts, plus the tensor-parallel
 * slice of the same layer. It exists to check the EP and TP communication
 * paths of epx_comm.h bit for bit, and to give benchmarks real work.
 *
 * Fixed order, on purpose: every sum below runs in one documented order, so
 * two computations that follow the same order give the same bits. A token's
 * routed output is acc = 0; for k = 0..K-1: acc += w[k] * expert_k(x), in
 * the router's top-k order (descending score, ties to the lower expert id);
 * the shared experts' output is added after. Each expert's outputs depend on
 * one row of x only, never on which other rows share the batch. The library
 * is compiled as ISO C (floating contraction off), so no FMA changes a bit.
 *
 * Weights are row-major fp32 arrays the caller owns; the functions only read
 * them. Include epx.h, not this file.
 */
#ifndef EPX_MOE_H
#define EPX_MOE_H

/* How router logits become expert scores. */
typedef enum epx_moe_scoring {
    /* softmax over all E logits, top-k of it (Qwen3, Mixtral) */
    EPX_MOE_SCORING_SOFTMAX = 0,
    /* sigmoid per logit; the choice adds a per-expert bias and may be grouped
     * (DeepSeek-V3, Kimi-K2: "noaux_tc"); weights are the unbiased sigmoids */
    EPX_MOE_SCORING_SIGMOID = 1,
    /* top-k of the logits, then softmax over those k (gpt-oss) */
    EPX_MOE_SCORING_SOFTMAX_TOPK = 2
} epx_moe_scoring;

/*
 * One MoE layer's shape and routing rule. Initialise from EPX_MOE_CONFIG_INIT
 * (or epx_moe_model_config) and set the fields.
 */
typedef struct epx_moe_config {
    uint32_t version;     /* set by EPX_MOE_CONFIG_INIT */
    int32_t hidden;       /* H >= 1 */
    int32_t intermediate; /* I >= 1: each routed expert's inner width */
    int32_t num_experts;  /* E >= 1 routed experts */
    int32_t top_k;        /* 1 <= K <= min(E, EPX_MOE_MAX_TOP_K) */
    epx_moe_scoring scoring;
    int32_t n_group;             /* groups of experts for grouped top-k; 1 = none; divides E */
    int32_t topk_group;          /* groups kept, 1..n_group; their experts must hold K */
    float routed_scaling_factor; /* weights are multiplied by this; 1 = none */
    int32_t norm_topk_prob;      /* nonzero: the K weights are divided by their sum
                                   * (before the scaling factor); SOFTMAX and SIGMOID */
    int32_t shared_intermediate; /* inner width of the shared experts, merged into one
                                   * SwiGLU (DeepSeek: n_shared * moe_intermediate); 0 = none */
} epx_moe_config;

#define EPX_MOE_MAX_TOP_K 64
#define EPX_MOE_CONFIG_VERSION ((uint32_t)sizeof(epx_moe_config))
#define EPX_MOE_CONFIG_INIT                                                                        \
    { EPX_MOE_CONFIG_VERSION, 0, 0, 0, 0, EPX_MOE_SCORING_SOFTMAX, 1, 1, 1.0f, 0, 0 }

/*
 * Check a configuration: sizes positive, K within E and the limit, groups
 * dividing E and the kept groups holding at least K experts, a finite
 * positive scaling factor, and H*I*E small enough to index.
 * Returns: EPX_OK, EPX_ERR_INVALID_ARG (wrong version, unknown scoring),
 *          EPX_ERR_SHAPE (sizes; the message names the value and the fix),
 *          EPX_ERR_OVERFLOW.
 */
EPX_API epx_status epx_moe_config_check(const epx_moe_config *cfg, epx_error *err);

/*
 * The MoE layer of a built-in model: its shape from epx_model_lookup (same
 * names and aliases: "kimi-k2.5", "deepseek-v3", "qwen3-235b", ...) and its
 * routing rule (scoring, scaling factor, normalisation) from the models'
 * config.json files. Shared experts merge into one SwiGLU of width
 * shared_experts * moe_intermediate. name may also be a config.json path
 * (epx_model_resolve): the rule is then the config's own (scoring_func,
 * routed_scaling_factor, norm_topk_prob, the family's default).
 * Args:    name (in); cfg (out).
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG for an unknown name (the message
 *          lists the known ones); EPX_ERR_UNSUPPORTED for a model whose
 *          routing rule is not tabled yet (or a config whose rule epx's
 *          MoE layer lacks: Llama-4); the statuses of epx_model_from_config.
 */
EPX_API epx_status epx_moe_model_config(const char *name, epx_moe_config *cfg, epx_error *err);

/*
 * Router logits: logits[t][e] = dot(router[e], x[t]), the dot product summed
 * over h ascending in fp32.
 * Args:    cfg (in) checked; router (in) [E][H] fp32; x (in) [T][H] fp32;
 *          T >= 0; logits (out) [T][E] fp32, caller-owned.
 * Returns: EPX_OK, EPX_ERR_INVALID_ARG (NULL pointer with T > 0), or the
 *          statuses of epx_moe_config_check.
 * Thread:  any thread; reentrant.
 */
EPX_API epx_status epx_moe_router_logits(const epx_moe_config *cfg, const float *router,
                                         const float *x, int64_t T, float *logits, epx_error *err);

/*
 * Choose each token's K experts and weights from its logits, by cfg->scoring:
 *  - SOFTMAX: p = softmax(logits); the K largest p; if norm_topk_prob the K
 *    weights are divided by their sum; times routed_scaling_factor.
 *  - SIGMOID: s = 1 / (1 + exp(-logit)); choice score c = s + bias[e] (bias
 *    may be NULL: 0). With n_group > 1, each group scores the sum of its two
 *    largest c (its one c when a group has a single expert), the topk_group
 *    best groups are kept and the others excluded; then the K largest c among
 *    the kept experts. Weights are the unbiased s of the chosen experts,
 *    normalised when norm_topk_prob (sum + 1e-20), times the scaling factor.
 *  - SOFTMAX_TOPK: the K largest logits, then softmax over those K.
 * Ids come out in descending score; equal scores go to the lower id, so the
 * choice is deterministic. This K-order is the order of every reduction.
 * Args:    cfg (in) checked; logits (in) [T][E] fp32; bias (in) [E] fp32 or
 *          NULL (used by SIGMOID only); T >= 0;
 *          topk_ids (out) [T][K] int32; topk_weights (out) [T][K] fp32.
 * Returns: EPX_OK, EPX_ERR_INVALID_ARG, EPX_ERR_NOMEM (an O(E) scratch row).
 * Thread:  any thread; reentrant.
 */
EPX_API epx_status epx_moe_route(const epx_moe_config *cfg, const float *logits, const float *bias,
                                 int64_t T, int32_t *topk_ids, float *topk_weights, epx_error *err);

/*
 * A view of one SwiGLU expert, or of a tensor-parallel slice of one:
 * y = down · (silu(gate · x) * (up · x)). `rows` inner rows are held:
 * gate and up are [rows][H] with row stride H; down is [H][rows] with row
 * stride ld_down (= the full I for a slice of columns [i0, i0+rows) taken
 * as `down + i0`). A slice is a view, not a copy.
 */
typedef struct epx_moe_expert {
    const float *gate; /* [rows][H] */
    const float *up;   /* [rows][H] */
    const float *down; /* [H][ld_down], columns 0..rows-1 used */
    int32_t rows;      /* >= 1 */
    int32_t ld_down;   /* >= rows */
} epx_moe_expert;

/*
 * Run one expert on n rows: for row i, x_i = x + (idx ? idx[i] : i) * x_stride
 * floats; h[r] = silu(dot(gate_r, x_i)) * dot(up_r, x_i) (silu(a) =
 * a / (1 + exp(-a))), then y_i[j] = sum over r ascending of down[j][r] * h[r],
 * written to y + i * H. Dots run over h ascending. Each output row depends on
 * its own input row only.
 * Args:    ex (in) a valid view; H >= 1; x (in) rows of >= H floats;
 *          x_stride (floats, >= H); idx (in) [n] row numbers or NULL; n >= 0;
 *          y (out) [n][H] fp32; work (scratch) >= ex->rows floats.
 * Returns: EPX_OK, EPX_ERR_INVALID_ARG.
 * Thread:  any thread; reentrant.
 */
EPX_API epx_status epx_moe_expert_forward(const epx_moe_expert *ex, int32_t H, const float *x,
                                          int64_t x_stride, const int32_t *idx, int64_t n, float *y,
                                          float *work, epx_error *err);

/*
 * A whole layer's weights, fp32, caller-owned. Experts are stored one after
 * another: expert e's gate is gate + e*I*H, and so on.
 */
typedef struct epx_moe_weights {
    const float *router;      /* [E][H] */
    const float *router_bias; /* [E] or NULL: SIGMOID's e_score_correction_bias */
    const float *gate;        /* [E][I][H] */
    const float *up;          /* [E][I][H] */
    const float *down;        /* [E][H][I] */
    const float *shared_gate; /* [Is][H] (Is = shared_intermediate; NULL when 0) */
    const float *shared_up;   /* [Is][H] */
    const float *shared_down; /* [H][Is] */
} epx_moe_weights;

/* The view of routed expert e, or of its inner slice [i0, i1). */
EPX_API epx_moe_expert epx_moe_weights_expert(const epx_moe_config *cfg, const epx_moe_weights *w,
                                              int32_t e, int32_t i0, int32_t i1);

/*
 * The tensor-parallel split of an inner width `width` over `ranks`: rank r
 * holds [*i0, *i1), the first width % ranks ranks one row more. Requires
 * 1 <= ranks <= width and 0 <= rank < ranks (else *i0 = *i1 = 0).
 */
EPX_API void epx_moe_tp_split(int32_t width, int32_t rank, int32_t ranks, int32_t *i0, int32_t *i1);

/*
 * The layer's output for T tokens whose routing is given, computed on one
 * rank (the single-rank reference), or one tensor-parallel rank's partial
 * sum when tp_ranks > 1: every routed expert and the shared expert restricted
 * to this rank's inner slice (epx_moe_tp_split), so that summing the partials
 * of all ranks gives the layer's output up to rounding.
 * out[t] = sum over k ascending of topk_weights[t][k] * expert(x[t]) (ids
 * -1 are skipped), then += shared(x[t]) (when Is > 0 and with_shared).
 * Args:    cfg (in) checked; w (in); x (in) [T][H]; topk_ids/topk_weights
 *          (in) [T][K] from epx_moe_route (or any ids in [-1, E));
 *          tp_rank/tp_ranks: 0/1 for the whole layer; with_shared: add the
 *          shared experts; out (out) [T][H] fp32.
 * Returns: EPX_OK, EPX_ERR_INVALID_ARG (an id outside [-1, E) names the
 *          token, k and id; bad TP rank), EPX_ERR_NOMEM (O(H + I) scratch).
 * Thread:  any thread; reentrant.
 */
EPX_API epx_status epx_moe_forward(const epx_moe_config *cfg, const epx_moe_weights *w,
                                   const float *x, int64_t T, const int32_t *topk_ids,
                                   const float *topk_weights, int32_t tp_rank, int32_t tp_ranks,
                                   int with_shared, float *out, epx_error *err);

/*
 * Add the shared experts' output (or its TP slice) to out: out[t] +=
 * shared(x[t]). The same additions epx_moe_forward makes last, so an EP
 * rank that adds its own tokens' shared output after combine gets the bits
 * of the single-rank reference.
 * Args:    as epx_moe_forward; no-op when shared_intermediate is 0.
 */
EPX_API epx_status epx_moe_shared_add(const epx_moe_config *cfg, const epx_moe_weights *w,
                                      const float *x, int64_t T, int32_t tp_rank, int32_t tp_ranks,
                                      float *out, epx_error *err);

#endif /* EPX_MOE_H */
