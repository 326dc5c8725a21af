/*
 * ep_common.c - the host halves of ep_common.h: the one check of an EP
 * config, the sizes every EP implementation derives from it, workspace
 * carving, and the grouping of received entries by local slot.
 */
#include "internal.h"
#include "ep_common.h"

#include <string.h>

static size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* Most local slots a low-latency receiver groups in one pass of its
 * kernel (a shared-memory histogram). */

static epx_status check_config(const epx_ep_config *cfg, int32_t R, epx_error *err) {
    if (cfg == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "EP config is NULL");
    if (cfg->version != EPX_EP_CONFIG_VERSION)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "EP config version %u is not %u: initialise it from EPX_EP_CONFIG_INIT",
                         cfg->version, EPX_EP_CONFIG_VERSION);
    if (cfg->hidden < 1 || cfg->top_k < 1 || cfg->top_k > EPX_MOE_MAX_TOP_K)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "EP hidden (%d) must be >= 1 and top_k (%d) in [1, %d]", cfg->hidden,
                         cfg->top_k, EPX_MOE_MAX_TOP_K);
    if (R < 1) return epxi_fail(err, EPX_ERR_INVALID_ARG, "EP needs >= 1 rank, got %d", R);
    if (cfg->num_slots < 1 || cfg->num_slots % R != 0) {
        int32_t up = cfg->num_slots < R ? R : (cfg->num_slots + R - 1) / R * R;
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "EP num_slots (%d) is not a positive multiple of the %d ranks: use %d",
                         cfg->num_slots, R, up);
    }
    if (cfg->max_tokens < 1 || cfg->max_tokens > ((int64_t)1 << 30))
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "EP max_tokens (%lld) must be in [1, 2^30]",
                         (long long)cfg->max_tokens);
    if ((cfg->x_dtype != EPX_DTYPE_F32 && cfg->x_dtype != EPX_DTYPE_BF16) ||
        (cfg->y_dtype != EPX_DTYPE_F32 && cfg->y_dtype != EPX_DTYPE_BF16))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "EP x_dtype (%d) and y_dtype (%d) must be EPX_DTYPE_F32 or _BF16",
                         (int)cfg->x_dtype, (int)cfg->y_dtype);
    if (cfg->combine != EPX_EP_COMBINE_TOPK && cfg->combine != EPX_EP_COMBINE_RANK)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "EP combine mode %d is unknown: use EPX_EP_COMBINE_TOPK or _RANK",
                         (int)cfg->combine);
    if (cfg->max_recv_tokens < 0 || cfg->max_recv_entries < 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "EP max_recv_tokens (%lld) and max_recv_entries (%lld) must be >= 0 "
                         "(0 = worst case)",
                         (long long)cfg->max_recv_tokens, (long long)cfg->max_recv_entries);
    if (cfg->mode != EPX_EP_MODE_NORMAL && cfg->mode != EPX_EP_MODE_LOW_LATENCY)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "EP mode %d is unknown: use EPX_EP_MODE_NORMAL or _LOW_LATENCY",
                         (int)cfg->mode);
    if (cfg->mode == EPX_EP_MODE_LOW_LATENCY) {
        if (cfg->combine != EPX_EP_COMBINE_TOPK)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "EP low-latency mode combines in top-k order only: set combine "
                             "= EPX_EP_COMBINE_TOPK (or use EPX_EP_MODE_NORMAL for _RANK)");
        if (cfg->max_recv_tokens != 0 || cfg->max_recv_entries != 0)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "EP low-latency mode sizes its buffers from max_tokens alone: set "
                             "max_recv_tokens (%lld) and max_recv_entries (%lld) to 0",
                             (long long)cfg->max_recv_tokens, (long long)cfg->max_recv_entries);
        if (cfg->num_slots / R > EPXI_LL_MAX_LOCAL_SLOTS)
            return epxi_fail(err, EPX_ERR_SHAPE,
                             "EP low-latency mode groups at most %d local slots per rank, not "
                             "%d (num_slots %d / %d ranks): use more ranks or normal mode",
                             EPXI_LL_MAX_LOCAL_SLOTS, cfg->num_slots / R, cfg->num_slots, R);
    }
    return EPX_OK;
}

epx_status epxi_ep_geom_init(const epx_ep_config *cfg, int32_t R, epxi_ep_geom *g, epx_error *err) {
    EPX_TRY(check_config(cfg, R, err));
    memset(g, 0, sizeof *g);
    const int64_t K = cfg->top_k, M = cfg->max_tokens, H = cfg->hidden;
    g->cfg = *cfg;
    g->R = R;
    g->K = cfg->top_k;
    g->H = cfg->hidden;
    g->P = cfg->num_slots;
    g->M = M;
    g->spr = cfg->num_slots / R;
    g->dmax = (int32_t)(K < R ? K : R);
    g->low_latency = cfg->mode == EPX_EP_MODE_LOW_LATENCY;
    g->topk_mode = cfg->combine == EPX_EP_COMBINE_TOPK;
    g->xsz = epx_dtype_size(cfg->x_dtype);
    g->ysz = epx_dtype_size(cfg->y_dtype);
    g->xrow = (size_t)H * g->xsz;
    g->yrow = (size_t)H * g->ysz;
    g->meta_off = align_up(g->xrow, 16);
    g->tag_off = g->meta_off + (size_t)K * sizeof(epxi_ep_meta);
    g->rec = align_up(g->tag_off + (g->low_latency ? sizeof(uint32_t) : 0), 16);
    /* Entries one token can bring a rank: K, since nothing forbids two k of
     * a token naming the same slot. */
    const double worst_tok = (double)R * (double)M;
    g->cap_tok = cfg->max_recv_tokens ? cfg->max_recv_tokens : (int64_t)worst_tok;
    if (g->cap_tok > (int64_t)worst_tok) g->cap_tok = (int64_t)worst_tok;
    g->cap_ent = cfg->max_recv_entries ? cfg->max_recv_entries : g->cap_tok * K;
    if (g->cap_ent > g->cap_tok * K) g->cap_ent = g->cap_tok * K;
    g->checked_caps = cfg->max_recv_tokens != 0 || cfg->max_recv_entries != 0;
    g->cap_back = g->topk_mode ? M * K : M * g->dmax;
    /* Entry and position indices are int32. */
    if ((double)g->cap_tok * (double)K >= 2147483647.0 || (double)M * (double)K >= 2147483647.0)
        return epxi_fail(err, EPX_ERR_OVERFLOW,
                         "EP buffers of %lld received tokens x top_k %lld exceed int32 indices: "
                         "lower max_tokens (%lld)%s",
                         (long long)g->cap_tok, (long long)K, (long long)M,
                         g->low_latency ? "" : " or set max_recv_tokens");
    return EPX_OK;
}

epx_status epxi_ws_carve(const epxi_ws_part *parts, size_t nparts, size_t align, size_t *total,
                         const char *who, epx_error *err) {
    size_t off = 0;
    for (size_t i = 0; i < nparts; i++) {
        double bytes = parts[i].n * parts[i].size;
        if (bytes > (double)(SIZE_MAX / 4) || bytes > 1e15)
            return epxi_fail(err, EPX_ERR_OVERFLOW,
                             "%s workspace part %zu needs %.3g bytes: lower max_tokens", who, i,
                             bytes);
        *parts[i].at = off;
        off = align_up(off + (size_t)bytes, align);
    }
    *total = off;
    return EPX_OK;
}

epx_status epxi_ep_group_entries(const epxi_ep_geom *g, const unsigned char *recv, int32_t nruns,
                                 const int64_t *run_first, const int64_t *run_rows, uint32_t epoch,
                                 int64_t *so, int32_t *entry_token, float *entry_weight,
                                 int32_t *entry_pair, int32_t *row_entries, int64_t *num_entries,
                                 epx_error *err) {
    const int32_t K = g->K, spr = g->spr;
    for (int32_t s = 0; s <= spr; s++) so[s] = 0;
    int64_t seen = 0;
    for (int32_t r = 0; r < nruns; r++)
        for (int64_t i = run_first[r]; i < run_first[r] + run_rows[r]; i++) {
            const unsigned char *rec = epxi_ep_crec(g, recv, i);
            if (epoch != 0 && epxi_ep_tag(g, rec) != epoch) continue;
            const epxi_ep_meta *m = epxi_ep_meta_of(g, rec);
            for (int32_t k = 0; k < K; k++) {
                if (m[k].slot < -1 || m[k].slot >= spr)
                    return epxi_fail(err, EPX_ERR_COMM,
                                     "EP dispatch: received row %lld names local slot %d outside "
                                     "[-1, %d): corrupt record or mismatched configs",
                                     (long long)i, m[k].slot, spr);
                if (m[k].slot >= 0) {
                    so[m[k].slot + 1]++;
                    seen++;
                }
            }
        }
    for (int32_t s = 0; s < spr; s++) so[s + 1] += so[s];
    /* Place with a cursor per slot kept in the offsets themselves: so[s]
     * advances to so[s+1] while placing, and is shifted back afterwards. */
    for (int32_t r = 0; r < nruns; r++)
        for (int64_t i = run_first[r]; i < run_first[r] + run_rows[r]; i++) {
            const unsigned char *rec = epxi_ep_crec(g, recv, i);
            bool present = epoch == 0 || epxi_ep_tag(g, rec) == epoch;
            const epxi_ep_meta *m = epxi_ep_meta_of(g, rec);
            for (int32_t k = 0; k < K; k++) {
                int32_t s = present ? m[k].slot : -1;
                if (s < 0) {
                    if (row_entries) row_entries[i * K + k] = -1;
                    continue;
                }
                int64_t e = so[s]++;
                entry_token[e] = (int32_t)i;
                entry_weight[e] = m[k].weight;
                if (entry_pair) entry_pair[e] = (int32_t)(i * K + k);
                if (row_entries) row_entries[i * K + k] = (int32_t)e;
            }
        }
    for (int32_t s = spr; s > 0; s--) so[s] = so[s - 1];
    so[0] = 0;
    *num_entries = seen;
    return EPX_OK;
}
