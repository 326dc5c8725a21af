/*
 * token.c - the per-batch dispatch path on the CPU: logical ids to slots,
 * the token layout for the all-to-all, and the row scatter / weighted
 * combine. These are the references the CUDA kernels (src/cuda/dispatch.cu)
 * are tested against, so each is written as the plainest loop that states
 * the definition in epx/dispatch.h; the arithmetic both sides must share
 * (Philox, replica choice, bf16 rounding) lives in dispatch_common.h.
 */
#include <math.h>
#include <string.h>

#include "dispatch_common.h"
#include "internal.h"

uint32_t epx_dispatch_random(uint64_t seed, uint32_t pass, uint32_t layer, uint32_t token,
                             uint32_t k) {
    return epxi_dispatch_word(seed, pass, layer, token, k);
}

epx_status epx_dispatch_thresholds(const int32_t *replicas, const int32_t *num_valid,
                                   int32_t num_layers, int32_t num_experts, int32_t width,
                                   const double *weights, int32_t num_physical, uint32_t *out,
                                   epx_error *err) {
    if (replicas == NULL || num_valid == NULL || weights == NULL || out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_dispatch_thresholds: replicas, num_valid, weights and out are "
                         "required");
    if (num_layers < 1 || num_experts < 1 || width < 1 || num_physical < 1)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "epx_dispatch_thresholds: L = %d, E = %d, W = %d, P = %d must all "
                         "be >= 1",
                         num_layers, num_experts, width, num_physical);
    /* every list and weight first, so an error leaves out as it was (epx.h) */
    for (int32_t l = 0; l < num_layers; l++)
        for (int32_t e = 0; e < num_experts; e++) {
            size_t le = (size_t)l * (size_t)num_experts + (size_t)e;
            const int32_t *row = replicas + le * (size_t)width;
            const double *w = weights + (size_t)l * (size_t)num_physical;
            int32_t n = num_valid[le];
            if (n < 1 || n > width)
                return epxi_fail(err, EPX_ERR_INVALID_ARG,
                                 "num_valid[%d][%d] = %d is outside [1, %d] (the width)", l, e, n,
                                 width);
            for (int32_t j = 0; j < n; j++) {
                if (row[j] < 0 || row[j] >= num_physical)
                    return epxi_fail(err, EPX_ERR_INVALID_MAP,
                                     "replica %d of layer %d, expert %d is slot %d, outside "
                                     "[0, %d)",
                                     j, l, e, row[j], num_physical);
                double v = w[row[j]];
                if (!(v >= 0.0) || !isfinite(v))
                    return epxi_fail(err, EPX_ERR_INVALID_ARG,
                                     "weights[%d][%d] is %g: weights must be finite and >= 0", l,
                                     row[j], v);
            }
        }
    for (int32_t l = 0; l < num_layers; l++)
        for (int32_t e = 0; e < num_experts; e++) {
            size_t le = (size_t)l * (size_t)num_experts + (size_t)e;
            const int32_t *row = replicas + le * (size_t)width;
            const double *w = weights + (size_t)l * (size_t)num_physical;
            uint32_t *thr = out + le * (size_t)width;
            int32_t n = num_valid[le];
            double sum = 0.0;
            for (int32_t j = 0; j < n; j++) sum += w[row[j]];
            double cum = 0.0;
            for (int32_t j = 0; j < width; j++) {
                if (j >= n - 1) {
                    thr[j] = UINT32_MAX;
                    continue;
                }
                cum += sum > 0.0 ? w[row[j]] : 1.0;
                double f = floor(cum / (sum > 0.0 ? sum : (double)n) * 4294967296.0);
                thr[j] = f >= 4294967295.0 ? UINT32_MAX : (uint32_t)f;
            }
        }
    return EPX_OK;
}

/* Check that the fields a mode reads are present (dispatch_common.h). */
epx_status epxi_dispatch_check_spec(const epx_dispatch_spec *s, const char *memory,
                                    epx_error *err) {
    if (s == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "dispatch spec is NULL");
    if (s->num_physical < 1 || (s->mode != EPX_DISPATCH_PHYSICAL && s->num_experts < 1))
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "dispatch spec: num_experts = %d and num_physical = %d must be >= 1",
                         s->num_experts, s->num_physical);
    switch (s->mode) {
    case EPX_DISPATCH_PHYSICAL: return EPX_OK;
    case EPX_DISPATCH_STATIC:
        if (s->table == NULL)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "static dispatch needs spec.table, this rank's [E] row for the "
                             "layer (epx_dispatch_table_compute), in %s memory",
                             memory);
        return EPX_OK;
    case EPX_DISPATCH_WEIGHTED:
        if (s->thresholds == NULL)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "weighted dispatch needs spec.thresholds "
                             "(epx_dispatch_thresholds from the replica weights), in %s memory",
                             memory);
        /* fall through */
    case EPX_DISPATCH_DYNAMIC:
    case EPX_DISPATCH_ROW:
        if (s->replicas == NULL || s->num_valid == NULL || s->width < 1)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "dynamic, weighted and row dispatch need spec.replicas [E][W] and "
                             "spec.num_valid [E] in %s memory, and width >= 1 (width is %d)",
                             memory, s->width);
        return EPX_OK;
    }
    return epxi_fail(err, EPX_ERR_INVALID_ARG,
                     "dispatch mode %d is not PHYSICAL, STATIC, DYNAMIC, WEIGHTED or ROW",
                     (int)s->mode);
}

/* Id (t, k) = e of topk_ids can be mapped: e in [-1, lim); for a list mode
 * every listed replica of e in [0, P) (not only the one a draw picks, so a
 * bad entry fails whatever the draw); for the static mode the table's slot. */
static epx_status check_id(const epx_dispatch_spec *spec, int32_t e, int64_t t, int32_t k,
                           int32_t lim, epx_error *err) {
    const int32_t P = spec->num_physical, W = spec->width;
    if (e < -1 || e >= lim)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "topk_ids[%lld][%d] = %d is outside [-1, %d) (%s)", (long long)t, k, e,
                         lim, spec->mode == EPX_DISPATCH_PHYSICAL ? "P" : "E");
    if (e < 0 || spec->mode == EPX_DISPATCH_PHYSICAL) return EPX_OK;
    if (spec->mode == EPX_DISPATCH_STATIC) {
        const int32_t p = spec->table[e];
        if (p < 0 || p >= P)
            return epxi_fail(err, EPX_ERR_INVALID_MAP,
                             "expert %d maps to slot %d, outside [0, %d): the table or replica "
                             "map is not for this shape",
                             e, p, P);
        return EPX_OK;
    }
    const int32_t n = spec->num_valid[e];
    if (n < 1 || n > W)
        return epxi_fail(err, EPX_ERR_INVALID_MAP,
                         "num_valid[%d] = %d is outside [1, %d] (the width)", e, n, W);
    const int32_t *rep = spec->replicas + (size_t)e * (size_t)W;
    for (int32_t j = 0; j < n; j++)
        if (rep[j] < 0 || rep[j] >= P)
            return epxi_fail(err, EPX_ERR_INVALID_MAP,
                             "replicas[%d][%d] = %d is outside [0, %d) while num_valid[%d] = %d: "
                             "list an expert's valid slots first, -1 padding only after them",
                             e, j, rep[j], P, e, n);
    return EPX_OK;
}

epx_status epx_dispatch_map_ids(const epx_dispatch_spec *spec, const int32_t *topk_ids,
                                int64_t num_tokens, int32_t topk, int32_t *phys, epx_error *err) {
    if (spec == NULL || (num_tokens > 0 && (topk_ids == NULL || phys == NULL)))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_dispatch_map_ids: spec, topk_ids and phys are required");
    if (num_tokens < 0 || num_tokens > INT32_MAX || topk < 1)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "topk_ids is [%lld][%d]: T must be in [0, 2^31) and K >= 1",
                         (long long)num_tokens, topk);
    EPX_TRY(epxi_dispatch_check_spec(spec, "host", err));
    const int32_t W = spec->width;
    const int32_t lim =
        spec->mode == EPX_DISPATCH_PHYSICAL ? spec->num_physical : spec->num_experts;
    /* every id first, so an error leaves phys as it was (epx.h) */
    for (int64_t t = 0; t < num_tokens; t++)
        for (int32_t k = 0; k < topk; k++)
            EPX_TRY(check_id(spec, topk_ids[(size_t)t * (size_t)topk + (size_t)k], t, k, lim, err));
    for (int64_t t = 0; t < num_tokens; t++)
        for (int32_t k = 0; k < topk; k++) {
            const size_t i = (size_t)t * (size_t)topk + (size_t)k;
            const int32_t e = topk_ids[i];
            int32_t p = -1;
            if (e >= 0 && spec->mode == EPX_DISPATCH_PHYSICAL) {
                p = e;
            } else if (e >= 0 && spec->mode == EPX_DISPATCH_STATIC) {
                p = spec->table[e];
            } else if (e >= 0) {
                const int32_t n = spec->num_valid[e];
                const int32_t *rep = spec->replicas + (size_t)e * (size_t)W;
                int32_t j;
                if (spec->mode == EPX_DISPATCH_ROW) {
                    j = (int32_t)(t % n);
                } else {
                    uint32_t word = epxi_dispatch_word(spec->seed, spec->pass, spec->layer,
                                                       (uint32_t)t, (uint32_t)k);
                    j = spec->mode == EPX_DISPATCH_DYNAMIC
                            ? epxi_uniform_index(word, n)
                            : epxi_weighted_index(word, spec->thresholds + (size_t)e * (size_t)W,
                                                  n);
                }
                p = rep[j];
            }
            phys[i] = p;
        }
    return EPX_OK;
}

/* Pair k of a token is its representative on GPU p / per: the pair with the
 * lowest slot there, the lowest k among equal slots. */
static bool is_representative(const int32_t *row, int32_t K, int32_t k, int32_t per) {
    int32_t p = row[k];
    if (p < 0) return false;
    for (int32_t j = 0; j < K; j++) {
        int32_t q = row[j];
        if (j == k || q < 0 || q / per != p / per) continue;
        if (q < p || (q == p && j < k)) return false;
    }
    return true;
}

epx_status epx_token_layout_compute(const int32_t *phys, int64_t num_tokens, int32_t topk,
                                    int32_t num_physical, int32_t num_gpus,
                                    const epx_token_layout *out, epx_error *err) {
    if (out == NULL || (num_tokens > 0 && phys == NULL))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_token_layout_compute: phys and out are required");
    if (num_tokens < 0 || num_tokens > INT32_MAX || topk < 1 ||
        (int64_t)num_tokens * topk > INT32_MAX)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "phys is [%lld][%d]: T >= 0, K >= 1 and T*K must stay below 2^31",
                         (long long)num_tokens, topk);
    if (num_physical < 1 || num_gpus < 1 || num_physical % num_gpus != 0)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "num_physical (%d) must be a positive multiple of num_gpus (%d)",
                         num_physical, num_gpus);
    int32_t T = (int32_t)num_tokens, K = topk, P = num_physical, G = num_gpus, per = P / G;
    for (int32_t t = 0; t < T; t++)
        for (int32_t k = 0; k < K; k++) {
            int32_t p = phys[(size_t)t * (size_t)K + (size_t)k];
            if (p < -1 || p >= P)
                return epxi_fail(err, EPX_ERR_INVALID_ARG,
                                 "phys[%d][%d] = %d is outside [-1, %d) (P)", t, k, p, P);
        }
    /* counts[0][p]: pairs on slot p; counts[1][p]: representatives on p.
     * Turned into running write positions below. */
    int32_t *cnt = epxi_calloc(2 * (size_t)P + 2, sizeof *cnt, "token layout counts", err);
    if (cnt == NULL) return err ? err->status : EPX_ERR_NOMEM;
    int32_t *cs = cnt, *cr = cnt + P + 1;
    for (int32_t t = 0; t < T; t++) {
        const int32_t *row = phys + (size_t)t * (size_t)K;
        for (int32_t k = 0; k < K; k++) {
            if (row[k] < 0) continue;
            cs[row[k]]++;
            cr[row[k]] += is_representative(row, K, k, per);
        }
    }
    if (out->tokens_per_slot)
        for (int32_t p = 0; p < P; p++) out->tokens_per_slot[p] = cs[p];
    if (out->tokens_per_rank)
        for (int32_t g = 0; g < G; g++) {
            int64_t n = 0;
            for (int32_t p = g * per; p < (g + 1) * per; p++) n += cr[p];
            out->tokens_per_rank[g] = n;
        }
    /* exclusive scans, with the total in the extra last entry */
    for (int32_t p = 0, s = 0, r = 0; p <= P; p++) {
        int32_t a = cs[p], b = cr[p];
        cs[p] = s;
        cr[p] = r;
        s += a;
        r += b;
    }
    if (out->slot_offsets) memcpy(out->slot_offsets, cs, ((size_t)P + 1) * sizeof *cs);
    if (out->rank_offsets)
        for (int32_t g = 0; g <= G; g++) out->rank_offsets[g] = cr[g * per];
    /* Walking pairs in index order fills each bucket in (t, k) order. */
    for (int32_t t = 0; t < T; t++) {
        const int32_t *row = phys + (size_t)t * (size_t)K;
        for (int32_t k = 0; k < K; k++) {
            size_t i = (size_t)t * (size_t)K + (size_t)k;
            int32_t p = row[k];
            int32_t ps = -1, pr = -1;
            if (p >= 0) {
                ps = cs[p]++;
                if (is_representative(row, K, k, per)) pr = cr[p]++;
            }
            if (out->pair_slot_pos) out->pair_slot_pos[i] = ps;
            if (out->pair_rank_pos) out->pair_rank_pos[i] = pr;
            if (out->slot_perm && ps >= 0) out->slot_perm[ps] = (int32_t)i;
            if (out->rank_perm && pr >= 0) out->rank_perm[pr] = t;
        }
        if (out->is_token_in_rank) {
            uint8_t *in = out->is_token_in_rank + (size_t)t * (size_t)G;
            memset(in, 0, (size_t)G);
            for (int32_t k = 0; k < K; k++)
                if (row[k] >= 0) in[row[k] / per] = 1;
        }
    }
    free(cnt);
    return EPX_OK;
}

static size_t dtype_size(epx_row_dtype d) { return d == EPX_ROW_BF16 ? 2 : 4; }

/* n rows of H values must have a size in bytes: a product past size_t
 * wrapped to a small copy (or a negative memcpy size) and returned EPX_OK. */
static epx_status check_bytes(int64_t n, int64_t hidden, epx_row_dtype dtype, const char *what,
                              const char *fn, epx_error *err) {
    size_t cells, bytes;
    if (epxi_mul_size((size_t)n, (size_t)hidden, &cells) &&
        epxi_mul_size(cells, dtype_size(dtype), &bytes) && bytes <= (size_t)INT64_MAX)
        return EPX_OK;
    return epxi_fail(err, EPX_ERR_OVERFLOW,
                     "%s: %lld %s x H = %lld values of %zu bytes do not fit in memory's size "
                     "type: H is a row's width (the model's hidden size)",
                     fn, (long long)n, what, (long long)hidden, dtype_size(dtype));
}

static epx_status check_rows(const void *src, const void *dst, epx_row_dtype dtype,
                             int64_t num_tokens, int64_t hidden, const int32_t *pos, int32_t topk,
                             int64_t num_rows, const char *fn, epx_error *err) {
    if (dtype != EPX_ROW_F32 && dtype != EPX_ROW_BF16)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "%s: dtype %d is not F32 (0) or BF16 (1)", fn,
                         (int)dtype);
    if (num_tokens < 0 || hidden < 0 || num_rows < 0 || topk < 1 || num_tokens > INT32_MAX ||
        num_rows > INT32_MAX)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "%s: T = %lld, H = %lld, rows = %lld, K = %d: sizes must be >= 0 "
                         "(K >= 1) and T, rows below 2^31",
                         fn, (long long)num_tokens, (long long)hidden, (long long)num_rows, topk);
    EPX_TRY(check_bytes(num_tokens, hidden, dtype, "tokens", fn, err));
    EPX_TRY(check_bytes(num_rows, hidden, dtype, "rows", fn, err));
    if (num_tokens > 0 && (pos == NULL || (hidden > 0 && (src == NULL || dst == NULL))))
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "%s: input, pos and output are required", fn);
    for (int64_t i = 0; i < num_tokens * topk; i++)
        if (pos[i] < -1 || pos[i] >= num_rows)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "%s: pos[%lld][%d] = %d is outside [-1, %lld) (the row count)", fn,
                             (long long)(i / topk), (int)(i % topk), pos[i], (long long)num_rows);
    return EPX_OK;
}

epx_status epx_permute_rows(const void *x, epx_row_dtype dtype, int64_t num_tokens, int64_t hidden,
                            const int32_t *pos, int32_t topk, int64_t num_rows, void *out,
                            epx_error *err) {
    EPX_TRY(check_rows(x, out, dtype, num_tokens, hidden, pos, topk, num_rows, "epx_permute_rows",
                       err));
    size_t row = (size_t)hidden * dtype_size(dtype);
    if (row == 0) return EPX_OK; /* hidden 0: x and out may be NULL (check_rows) */
    for (int64_t t = 0; t < num_tokens; t++)
        for (int32_t k = 0; k < topk; k++) {
            int32_t p = pos[(size_t)t * (size_t)topk + (size_t)k];
            if (p >= 0)
                memcpy((unsigned char *)out + (size_t)p * row,
                       (const unsigned char *)x + (size_t)t * row, row);
        }
    return EPX_OK;
}

epx_status epx_gather_rows(const void *x, epx_row_dtype dtype, int64_t num_tokens, int64_t hidden,
                           const int32_t *order, int64_t num_rows, int32_t per_token, void *out,
                           epx_error *err) {
    if (dtype != EPX_ROW_F32 && dtype != EPX_ROW_BF16)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_gather_rows: dtype %d is not F32 (0) or BF16 (1)", (int)dtype);
    if (num_tokens < 0 || num_tokens > INT32_MAX || hidden < 0 || num_rows < 0 || per_token < 1 ||
        num_tokens * per_token > INT32_MAX || num_rows > INT32_MAX)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "epx_gather_rows: T = %lld, H = %lld, rows = %lld, per_token = %d: sizes "
                         "must be >= 0 (per_token >= 1) and T * per_token, rows below 2^31",
                         (long long)num_tokens, (long long)hidden, (long long)num_rows, per_token);
    EPX_TRY(check_bytes(num_tokens, hidden, dtype, "tokens", "epx_gather_rows", err));
    EPX_TRY(check_bytes(num_rows, hidden, dtype, "rows", "epx_gather_rows", err));
    if (num_rows > 0 &&
        (order == NULL || (hidden > 0 && (out == NULL || (x == NULL && num_tokens > 0)))))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_gather_rows: x, order and out are required");
    int64_t limit = num_tokens * per_token;
    for (int64_t i = 0; i < num_rows; i++)
        if (order[i] < -1 || order[i] >= limit)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "epx_gather_rows: order[%lld] = %d is outside [-1, %lld) (T * "
                             "per_token)",
                             (long long)i, order[i], (long long)limit);
    size_t row = (size_t)hidden * dtype_size(dtype);
    if (row == 0) return EPX_OK; /* hidden 0: x and out may be NULL (check_rows) */
    for (int64_t i = 0; i < num_rows; i++) {
        unsigned char *dst = (unsigned char *)out + (size_t)i * row;
        if (order[i] < 0)
            memset(dst, 0, row);
        else
            memcpy(dst, (const unsigned char *)x + (size_t)(order[i] / per_token) * row, row);
    }
    return EPX_OK;
}

epx_status epx_combine_rows(const void *y, epx_row_dtype dtype, int64_t num_rows, int64_t hidden,
                            const int32_t *pos, const float *weights, int64_t num_tokens,
                            int32_t topk, void *out, epx_error *err) {
    EPX_TRY(check_rows(y, out, dtype, num_tokens, hidden, pos, topk, num_rows, "epx_combine_rows",
                       err));
    size_t H = (size_t)hidden, K = (size_t)topk;
    for (size_t t = 0; t < (size_t)num_tokens; t++) {
        const int32_t *pt = pos + t * K;
        for (size_t h = 0; h < H; h++) {
            float acc = 0.0f;
            for (size_t k = 0; k < K; k++) {
                if (pt[k] < 0) continue;
                size_t src = (size_t)pt[k] * H + h;
                float v = dtype == EPX_ROW_BF16 ? epxi_bf16_to_f32(((const uint16_t *)y)[src])
                                                : ((const float *)y)[src];
                acc = fmaf(weights ? weights[t * K + k] : 1.0f, v, acc);
            }
            if (dtype == EPX_ROW_BF16)
                ((uint16_t *)out)[t * H + h] = epxi_f32_to_bf16(acc);
            else
                ((float *)out)[t * H + h] = acc;
        }
    }
    return EPX_OK;
}
