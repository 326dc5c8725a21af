/*
 * moe.c - the reference MoE layer in fp32: router scoring and top-k, SwiGLU
 * experts, shared experts, and the tensor-parallel slice of each.
 *
 * This is the yardstick the EP and TP communication paths are checked
 * against, so its one job is to be obviously right and to sum in a fixed,
 * documented order (see epx/moe.h): plain loops, no blocking across rows,
 * no reassociation. Speed matters only enough for tests to stay quick.
 */
#include "internal.h"

#include <math.h>
#include <string.h>

epx_status epx_moe_config_check(const epx_moe_config *cfg, epx_error *err) {
    if (cfg == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "moe config is NULL");
    EPX_TRY(epxi_check_version(cfg->version, EPX_MOE_CONFIG_VERSION, "epx_moe_config",
                               "EPX_MOE_CONFIG_INIT (or fill it with epx_moe_model_config)", err));
    if (cfg->hidden < 1 || cfg->intermediate < 1 || cfg->num_experts < 1)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "moe hidden (%d), intermediate (%d) and num_experts (%d) must all be "
                         ">= 1",
                         cfg->hidden, cfg->intermediate, cfg->num_experts);
    if (cfg->num_experts > EPX_MAX_EXPERTS)
        return epxi_fail(err, EPX_ERR_SHAPE, "moe num_experts (%d) is above the limit %d",
                         cfg->num_experts, EPX_MAX_EXPERTS);
    if (cfg->top_k < 1 || cfg->top_k > cfg->num_experts || cfg->top_k > EPX_MOE_MAX_TOP_K)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "moe top_k (%d) must be in [1, min(num_experts %d, %d)]", cfg->top_k,
                         cfg->num_experts, EPX_MOE_MAX_TOP_K);
    if (cfg->scoring != EPX_MOE_SCORING_SOFTMAX && cfg->scoring != EPX_MOE_SCORING_SIGMOID &&
        cfg->scoring != EPX_MOE_SCORING_SOFTMAX_TOPK)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "moe scoring %d is unknown: use EPX_MOE_SCORING_SOFTMAX, _SIGMOID or "
                         "_SOFTMAX_TOPK",
                         (int)cfg->scoring);
    if (cfg->n_group < 1 || cfg->num_experts % cfg->n_group != 0)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "moe n_group (%d) must be >= 1 and divide num_experts (%d)", cfg->n_group,
                         cfg->num_experts);
    if (cfg->n_group > 1 && cfg->scoring != EPX_MOE_SCORING_SIGMOID)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "moe n_group %d > 1 needs SIGMOID scoring (grouped top-k is "
                         "DeepSeek's noaux_tc rule); set n_group = 1",
                         cfg->n_group);
    if (cfg->topk_group < 1 || cfg->topk_group > cfg->n_group)
        return epxi_fail(err, EPX_ERR_SHAPE, "moe topk_group (%d) must be in [1, n_group %d]",
                         cfg->topk_group, cfg->n_group);
    int32_t kept = cfg->topk_group * (cfg->num_experts / cfg->n_group);
    if (kept < cfg->top_k)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "moe topk_group %d of %d groups keeps %d experts, fewer than top_k %d: "
                         "raise topk_group",
                         cfg->topk_group, cfg->n_group, kept, cfg->top_k);
    if (!(cfg->routed_scaling_factor > 0.0f) || !isfinite(cfg->routed_scaling_factor))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "moe routed_scaling_factor (%g) must be finite and > 0 (1 = none)",
                         (double)cfg->routed_scaling_factor);
    if (cfg->shared_intermediate < 0)
        return epxi_fail(err, EPX_ERR_SHAPE, "moe shared_intermediate (%d) must be >= 0",
                         cfg->shared_intermediate);
    /* Expert weights are indexed with size_t: E*I*H must fit comfortably. */
    double elems = (double)cfg->num_experts * cfg->intermediate * cfg->hidden;
    if (elems > 9.0e15)
        return epxi_fail(err, EPX_ERR_OVERFLOW, "moe weights of %g elements are too many to index",
                         elems);
    return EPX_OK;
}

/* ---- the model table ---------------------------------------------------- */

/* The routing rule of each built-in model (epx_model_lookup holds the
 * shapes), from the models' config.json files (shared/models.json). */
typedef struct route_rule {
    const char *name; /* canonical name in epx_model_list */
    epx_moe_scoring scoring;
    float scale;
    int32_t norm;
} route_rule;

static const route_rule RULES[] = {
    {"deepseek-v3", EPX_MOE_SCORING_SIGMOID, 2.5f, 1},
    {"kimi-k2", EPX_MOE_SCORING_SIGMOID, 2.827f, 1},
    {"kimi-k2.5", EPX_MOE_SCORING_SIGMOID, 2.827f, 1},
    {"glm-4.5", EPX_MOE_SCORING_SIGMOID, 2.5f, 1},
    {"qwen3-235b-a22b", EPX_MOE_SCORING_SOFTMAX, 1.0f, 1},
    {"qwen3-30b-a3b", EPX_MOE_SCORING_SOFTMAX, 1.0f, 1},
    {"mixtral-8x7b", EPX_MOE_SCORING_SOFTMAX, 1.0f, 1},
    {"gpt-oss-120b", EPX_MOE_SCORING_SOFTMAX_TOPK, 1.0f, 0},
};

epx_status epx_moe_model_config(const char *name, epx_moe_config *cfg, epx_error *err) {
    if (name == NULL || cfg == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "model name and config must not be NULL");
    epx_model_info info;
    EPX_TRY(epx_model_resolve(name, &info, err));
    const epx_model *m = &info.model;
    route_rule from_config = {info.name, (epx_moe_scoring)info.scoring, info.routed_scaling_factor,
                              info.norm_topk_prob};
    const route_rule *rule = NULL;
    if (info.from_config) {
        if (info.scoring < 0)
            return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                             "model '%s' (a %s config) routes by a rule epx's MoE layer does not "
                             "have (Llama-4's sigmoid of the top-k logits, or a scoring_func "
                             "other than softmax or sigmoid): only its shape can be used",
                             info.name, info.family);
        rule = &from_config;
    }
    for (size_t i = 0; rule == NULL && i < sizeof RULES / sizeof RULES[0]; i++)
        if (strcmp(RULES[i].name, m->name) == 0) rule = &RULES[i];
    if (rule == NULL)
        return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                         "model '%s' has a shape but no routing rule in the MoE table: add it "
                         "to RULES in src/engine/moe.c",
                         m->name);
    epx_moe_config c = EPX_MOE_CONFIG_INIT;
    c.hidden = m->hidden;
    c.intermediate = m->moe_intermediate;
    c.num_experts = m->num_experts;
    c.top_k = m->top_k;
    c.scoring = rule->scoring;
    c.n_group = m->num_groups;
    c.topk_group = m->topk_group;
    c.routed_scaling_factor = rule->scale;
    c.norm_topk_prob = rule->norm;
    c.shared_intermediate = m->shared_experts * m->moe_intermediate;
    *cfg = c;
    return EPX_OK;
}

/* ---- router --------------------------------------------------------------- */

epx_status epx_moe_router_logits(const epx_moe_config *cfg, const float *router, const float *x,
                                 int64_t T, float *logits, epx_error *err) {
    EPX_TRY(epx_moe_config_check(cfg, err));
    if (T < 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "token count %lld is negative", (long long)T);
    if (T > 0 && (router == NULL || x == NULL || logits == NULL))
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "router, x and logits must not be NULL");
    const int64_t H = cfg->hidden, E = cfg->num_experts;
    for (int64_t t = 0; t < T; t++) {
        const float *xt = x + t * H;
        for (int64_t e = 0; e < E; e++) {
            const float *we = router + e * H;
            float acc = 0.0f;
            for (int64_t h = 0; h < H; h++) acc += we[h] * xt[h];
            logits[t * E + e] = acc;
        }
    }
    return EPX_OK;
}

/* a beats b: higher score, or the same score and a lower id. NaN scores
 * lose to everything so a poisoned logit cannot be chosen over a real one. */
static bool beats(float sa, int32_t a, float sb, int32_t b) {
    if (isnan(sb)) return !isnan(sa) || a < b;
    if (isnan(sa)) return false;
    return sa > sb || (sa == sb && a < b);
}

/* The k best of score[0..n) (entries with keep[i] == 0 are skipped), in
 * descending order, into ids[0..k). Selection by insertion: k is small. */
static void top_k(const float *score, const uint8_t *keep, int32_t n, int32_t k, int32_t *ids) {
    int32_t have = 0;
    for (int32_t i = 0; i < n; i++) {
        if (keep != NULL && !keep[i]) continue;
        if (have == k && !beats(score[i], i, score[ids[k - 1]], ids[k - 1])) continue;
        int32_t pos = have < k ? have++ : k - 1;
        while (pos > 0 && beats(score[i], i, score[ids[pos - 1]], ids[pos - 1])) {
            ids[pos] = ids[pos - 1];
            pos--;
        }
        ids[pos] = i;
    }
    for (int32_t j = have; j < k; j++) ids[j] = -1;
}

static float sigmoidf(float a) { return 1.0f / (1.0f + expf(-a)); }

epx_status epx_moe_route(const epx_moe_config *cfg, const float *logits, const float *bias,
                         int64_t T, int32_t *topk_ids, float *topk_weights, epx_error *err) {
    EPX_TRY(epx_moe_config_check(cfg, err));
    if (T < 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "token count %lld is negative", (long long)T);
    if (T > 0 && (logits == NULL || topk_ids == NULL || topk_weights == NULL))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "logits, topk_ids and topk_weights must not be NULL");
    const int32_t E = cfg->num_experts, K = cfg->top_k, G = cfg->n_group;
    const int32_t per_group = E / G;
    /* a non-finite logit or bias has no softmax or sigmoid weight (an
     * infinite one made every weight NaN) */
    for (int64_t i = 0; i < T * E; i++)
        if (!isfinite(logits[i]))
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "logits[%lld][%lld] is %g: router logits must be finite",
                             (long long)(i / E), (long long)(i % E), (double)logits[i]);
    for (int32_t e = 0; bias != NULL && e < E; e++)
        if (!isfinite(bias[e]))
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "bias[%d] is %g: the correction bias must be finite", e,
                             (double)bias[e]);
    /* score [E] | choice [E] | group score [G] | keep [E] bytes | group ids [G] */
    float *score =
        epxi_calloc((size_t)2 * (size_t)E + (size_t)G, sizeof(float), "router scratch", err);
    uint8_t *keep = epxi_calloc((size_t)E, 1, "router scratch", err);
    int32_t *gids = epxi_calloc((size_t)G, sizeof(int32_t), "router scratch", err);
    if (score == NULL || keep == NULL || gids == NULL) {
        free(score);
        free(keep);
        free(gids);
        return EPX_ERR_NOMEM;
    }
    float *choice = score + E, *gscore = score + 2 * E;
    for (int64_t t = 0; t < T; t++) {
        const float *l = logits + t * E;
        int32_t *ids = topk_ids + t * K;
        float *w = topk_weights + t * K;
        if (cfg->scoring == EPX_MOE_SCORING_SOFTMAX) {
            /* softmax is monotone, so choosing on logits chooses the same
             * experts with no ties introduced by rounding of exp. */
            top_k(l, NULL, E, K, ids);
            float mx = l[ids[0]], sum = 0.0f;
            for (int32_t e = 0; e < E; e++) sum += expf(l[e] - mx);
            float wsum = 0.0f;
            for (int32_t j = 0; j < K; j++) {
                w[j] = expf(l[ids[j]] - mx) / sum;
                wsum += w[j];
            }
            if (cfg->norm_topk_prob)
                for (int32_t j = 0; j < K; j++) w[j] /= wsum;
        } else if (cfg->scoring == EPX_MOE_SCORING_SOFTMAX_TOPK) {
            top_k(l, NULL, E, K, ids);
            float mx = l[ids[0]], sum = 0.0f;
            for (int32_t j = 0; j < K; j++) {
                w[j] = expf(l[ids[j]] - mx);
                sum += w[j];
            }
            for (int32_t j = 0; j < K; j++) w[j] /= sum;
        } else {
            for (int32_t e = 0; e < E; e++) {
                score[e] = sigmoidf(l[e]);
                choice[e] = score[e] + (bias ? bias[e] : 0.0f);
                keep[e] = 1;
            }
            if (G > 1) {
                for (int32_t g = 0; g < G; g++) {
                    int32_t best[2] = {-1, -1};
                    top_k(choice + (size_t)g * per_group, NULL, per_group, per_group >= 2 ? 2 : 1,
                          best);
                    gscore[g] = choice[g * per_group + best[0]];
                    if (per_group >= 2) gscore[g] += choice[g * per_group + best[1]];
                }
                top_k(gscore, NULL, G, cfg->topk_group, gids);
                memset(keep, 0, (size_t)E);
                for (int32_t j = 0; j < cfg->topk_group; j++)
                    memset(keep + (size_t)gids[j] * per_group, 1, (size_t)per_group);
            }
            top_k(choice, keep, E, K, ids);
            float wsum = 0.0f;
            for (int32_t j = 0; j < K; j++) {
                w[j] = score[ids[j]];
                wsum += w[j];
            }
            if (cfg->norm_topk_prob)
                for (int32_t j = 0; j < K; j++) w[j] /= (wsum + 1e-20f);
        }
        if (cfg->routed_scaling_factor != 1.0f)
            for (int32_t j = 0; j < K; j++) w[j] *= cfg->routed_scaling_factor;
    }
    free(score);
    free(keep);
    free(gids);
    return EPX_OK;
}

/* ---- experts ------------------------------------------------------------- */

epx_status epx_moe_expert_forward(const epx_moe_expert *ex, int32_t H, const float *x,
                                  int64_t x_stride, const int32_t *idx, int64_t n, float *y,
                                  float *work, epx_error *err) {
    if (n == 0) return EPX_OK;
    if (ex == NULL || ex->gate == NULL || ex->up == NULL || ex->down == NULL || ex->rows < 1 ||
        ex->ld_down < ex->rows || H < 1 || x == NULL || y == NULL || work == NULL || n < 0 ||
        x_stride < H)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "expert forward needs a valid expert view (rows >= 1, ld_down >= rows), "
                         "x_stride >= H (%lld vs %d), n >= 0 and non-NULL buffers",
                         (long long)x_stride, H);
    const int64_t R = ex->rows, ld = ex->ld_down;
    for (int64_t i = 0; i < n; i++) {
        const float *xi = x + (idx ? (int64_t)idx[i] : i) * x_stride;
        for (int64_t r = 0; r < R; r++) {
            const float *g = ex->gate + r * H, *u = ex->up + r * H;
            float a = 0.0f, b = 0.0f;
            for (int64_t h = 0; h < H; h++) {
                a += g[h] * xi[h];
                b += u[h] * xi[h];
            }
            work[r] = a / (1.0f + expf(-a)) * b;
        }
        float *yi = y + i * H;
        for (int64_t j = 0; j < H; j++) {
            const float *d = ex->down + j * ld;
            float acc = 0.0f;
            for (int64_t r = 0; r < R; r++) acc += d[r] * work[r];
            yi[j] = acc;
        }
    }
    return EPX_OK;
}

epx_moe_expert epx_moe_weights_expert(const epx_moe_config *cfg, const epx_moe_weights *w,
                                      int32_t e, int32_t i0, int32_t i1) {
    const size_t H = (size_t)cfg->hidden, I = (size_t)cfg->intermediate;
    epx_moe_expert ex = {w->gate + (size_t)e * I * H + (size_t)i0 * H,
                         w->up + (size_t)e * I * H + (size_t)i0 * H,
                         w->down + (size_t)e * H * I + (size_t)i0, i1 - i0, (int32_t)I};
    return ex;
}

void epx_moe_tp_split(int32_t width, int32_t rank, int32_t ranks, int32_t *i0, int32_t *i1) {
    if (ranks < 1 || ranks > width || rank < 0 || rank >= ranks) {
        *i0 = *i1 = 0;
        return;
    }
    int32_t base = width / ranks, extra = width % ranks;
    *i0 = rank * base + (rank < extra ? rank : extra);
    *i1 = *i0 + base + (rank < extra ? 1 : 0);
}

static epx_status check_tp(const epx_moe_config *cfg, int32_t tp_rank, int32_t tp_ranks,
                           epx_error *err) {
    int32_t narrowest = cfg->intermediate;
    if (cfg->shared_intermediate > 0 && cfg->shared_intermediate < narrowest)
        narrowest = cfg->shared_intermediate;
    if (tp_ranks < 1 || tp_rank < 0 || tp_rank >= tp_ranks || tp_ranks > narrowest)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "tensor-parallel rank %d of %d is invalid: need 0 <= rank < ranks <= "
                         "the narrowest inner width (%d)",
                         tp_rank, tp_ranks, narrowest);
    return EPX_OK;
}

epx_status epx_moe_shared_add(const epx_moe_config *cfg, const epx_moe_weights *w, const float *x,
                              int64_t T, int32_t tp_rank, int32_t tp_ranks, float *out,
                              epx_error *err) {
    EPX_TRY(epx_moe_config_check(cfg, err));
    EPX_TRY(check_tp(cfg, tp_rank, tp_ranks, err));
    const int32_t Is = cfg->shared_intermediate, H = cfg->hidden;
    if (Is == 0 || T == 0) return EPX_OK;
    if (w == NULL || w->shared_gate == NULL || w->shared_up == NULL || w->shared_down == NULL ||
        x == NULL || out == NULL || T < 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "shared experts (shared_intermediate %d) need shared_gate, shared_up, "
                         "shared_down, x and out",
                         Is);
    int32_t s0, s1;
    epx_moe_tp_split(Is, tp_rank, tp_ranks, &s0, &s1);
    epx_moe_expert ex = {w->shared_gate + (size_t)s0 * H, w->shared_up + (size_t)s0 * H,
                         w->shared_down + s0, s1 - s0, Is};
    float *buf = epxi_calloc((size_t)H + (size_t)Is, sizeof(float), "shared expert scratch", err);
    if (buf == NULL) return EPX_ERR_NOMEM;
    epx_status st = EPX_OK;
    for (int64_t t = 0; t < T && st == EPX_OK; t++) {
        st = epx_moe_expert_forward(&ex, H, x + t * H, H, NULL, 1, buf, buf + H, err);
        for (int32_t j = 0; j < H; j++) out[t * H + j] += buf[j];
    }
    free(buf);
    return st;
}

epx_status epx_moe_forward(const epx_moe_config *cfg, const epx_moe_weights *w, const float *x,
                           int64_t T, const int32_t *topk_ids, const float *topk_weights,
                           int32_t tp_rank, int32_t tp_ranks, int with_shared, float *out,
                           epx_error *err) {
    EPX_TRY(epx_moe_config_check(cfg, err));
    EPX_TRY(check_tp(cfg, tp_rank, tp_ranks, err));
    if (T < 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "token count %lld is negative", (long long)T);
    if (T == 0) return EPX_OK;
    if (w == NULL || w->gate == NULL || w->up == NULL || w->down == NULL || x == NULL ||
        topk_ids == NULL || topk_weights == NULL || out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "moe forward needs weights (gate, up, down), x, topk_ids, topk_weights "
                         "and out");
    const int32_t H = cfg->hidden, K = cfg->top_k, E = cfg->num_experts;
    for (int64_t i = 0; i < T * K; i++)
        if (topk_ids[i] < -1 || topk_ids[i] >= E)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "topk_ids[%lld][%d] = %d is outside [-1, %d)", (long long)(i / K),
                             (int)(i % K), topk_ids[i], E);
    /* the shared experts' weights too, before the routed output is written */
    if (with_shared && cfg->shared_intermediate > 0 &&
        (w->shared_gate == NULL || w->shared_up == NULL || w->shared_down == NULL))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "with_shared: shared experts (shared_intermediate %d) need shared_gate, "
                         "shared_up and shared_down",
                         cfg->shared_intermediate);
    int32_t i0, i1;
    epx_moe_tp_split(cfg->intermediate, tp_rank, tp_ranks, &i0, &i1);
    float *buf = epxi_calloc((size_t)H + (size_t)cfg->intermediate, sizeof(float),
                             "moe forward scratch", err);
    if (buf == NULL) return EPX_ERR_NOMEM;
    epx_status st = EPX_OK;
    for (int64_t t = 0; t < T && st == EPX_OK; t++) {
        float *o = out + t * H;
        for (int32_t j = 0; j < H; j++) o[j] = 0.0f;
        for (int32_t k = 0; k < K && st == EPX_OK; k++) {
            int32_t e = topk_ids[t * K + k];
            if (e < 0) continue;
            epx_moe_expert ex = epx_moe_weights_expert(cfg, w, e, i0, i1);
            st = epx_moe_expert_forward(&ex, H, x + t * H, H, NULL, 1, buf, buf + H, err);
            float wk = topk_weights[t * K + k];
            for (int32_t j = 0; j < H; j++) o[j] += wk * buf[j];
        }
    }
    free(buf);
    if (st == EPX_OK && with_shared)
        st = epx_moe_shared_add(cfg, w, x, T, tp_rank, tp_ranks, out, err);
    return st;
}
