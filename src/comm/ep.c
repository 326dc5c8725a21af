/*
 * ep.c - expert-parallel dispatch and combine of one MoE layer on host
 * memory, over any host communicator (MPI, local).
 *
 * One batch is three collective exchanges:
 *   1. counts: to every peer, the tokens and the (token, k) entries it will
 *      receive (two int64 per peer);
 *   2. dispatch: each token once per destination rank, as a record of its
 *      x row and its K (local slot, weight) pairs, -1 for the k that go
 *      elsewhere; the receiver groups the entries by local slot;
 *   3. combine: the expert outputs travel back, one row per entry
 *      (EPX_EP_COMBINE_TOPK) or one pre-reduced row per token and rank
 *      (EPX_EP_COMBINE_RANK), and each token is reduced in fp32 in a fixed
 *      order.
 * Everything a batch needs is carved out of one workspace at creation and
 * sized for the worst case (or the caller's receive bound); the per-batch
 * path allocates nothing. The send streams are ordered by token, and every
 * position a later step needs (where (t, k)'s output comes back) is recorded
 * while packing, so combine needs no second exchange of counts.
 */
#include "internal.h"
#include "epx_comm.h"

#include <stdint.h>
#include <string.h>

/* Where each buffer lives inside the workspace (byte offsets). */
typedef struct ep_layout {
    size_t send_rec, recv_rec, y, csend, crecv, weights, ret_pos, tok_ndest, tok_dpos,
        entry_token, entry_weight, slot_offsets, row_entries, partial, counts, total;
} ep_layout;

/* The per-peer integer arrays: int64 rows of [R]; the counts exchange
 * buffers take two rows each ([R][2]). */
enum {
    C_NTOK, C_NENT, C_RTOK, C_RENT, C_STOKOFF, C_RTOKOFF, C_COFF, C_RENTOFF, C_CUR, C_XCNT,
    C_XDISPL, C_SENDC, C_RECVC = C_SENDC + 2, C_ROWS = C_RECVC + 2
};

struct epx_ep {
    epx_comm *comm;
    epx_ep_config cfg;
    int32_t R, me, spr, dmax; /* dmax = min(K, R): most destinations per token */
    size_t xsz, ysz, xrow, rec, yrow, meta_off;
    int64_t cap_tok, cap_ent, cap_back; /* receive bounds; rows coming back */
    bool checked_caps;                  /* caller set a bound: agree on overflow */
    unsigned char *ws;
    bool own_ws;
    ep_layout lay;
    /* last batch */
    int64_t T;
    bool dispatched;
    int64_t nrecv_tok, nrecv_ent;
    int64_t last_dispatch_bytes, last_combine_bytes;
};

/* Per (token, k) metadata inside a record. */
typedef struct ep_meta {
    int32_t slot; /* local slot on the receiver, or -1 */
    float weight;
} ep_meta;

static size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

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
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "EP max_tokens (%lld) must be in [1, 2^30]", (long long)cfg->max_tokens);
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
    return EPX_OK;
}

/* Derived sizes and the workspace layout, shared by the size query and
 * creation so both agree to the byte. */
static epx_status plan_layout(epx_ep *ep, const epx_ep_config *cfg, int32_t R, epx_error *err) {
    EPX_TRY(check_config(cfg, R, err));
    const int64_t K = cfg->top_k, T = cfg->max_tokens, H = cfg->hidden;
    ep->cfg = *cfg;
    ep->R = R;
    ep->spr = cfg->num_slots / R;
    ep->dmax = (int32_t)(K < R ? K : R);
    ep->xsz = epx_dtype_size(cfg->x_dtype);
    ep->ysz = epx_dtype_size(cfg->y_dtype);
    ep->xrow = (size_t)H * ep->xsz;
    ep->meta_off = align_up(ep->xrow, 16);
    ep->rec = ep->meta_off + align_up((size_t)K * sizeof(ep_meta), 16);
    ep->yrow = (size_t)H * ep->ysz;
    /* Entries one token can bring a rank: K, since nothing forbids two k of
     * a token naming the same slot. */
    const int64_t per_tok = K;
    double worst_tok = (double)R * (double)T;
    ep->cap_tok = cfg->max_recv_tokens ? cfg->max_recv_tokens : (int64_t)worst_tok;
    if (ep->cap_tok > (int64_t)worst_tok) ep->cap_tok = (int64_t)worst_tok;
    ep->cap_ent = cfg->max_recv_entries ? cfg->max_recv_entries : ep->cap_tok * per_tok;
    if (ep->cap_ent > ep->cap_tok * per_tok) ep->cap_ent = ep->cap_tok * per_tok;
    ep->checked_caps = cfg->max_recv_tokens != 0 || cfg->max_recv_entries != 0;
    ep->cap_back = cfg->combine == EPX_EP_COMBINE_TOPK ? T * K : T * ep->dmax;
    /* Entry and position indices are int32. */
    if ((double)ep->cap_tok * (double)K >= 2147483647.0 || (double)ep->cap_ent >= 2147483647.0 ||
        (double)T * (double)K >= 2147483647.0)
        return epxi_fail(err, EPX_ERR_OVERFLOW,
                         "EP buffers of %lld received tokens x top_k %lld exceed int32 indices: "
                         "lower max_tokens (%lld) or set max_recv_tokens",
                         (long long)ep->cap_tok, (long long)K, (long long)T);
    const int64_t csend_rows = cfg->combine == EPX_EP_COMBINE_TOPK ? ep->cap_ent : ep->cap_tok;
    struct {
        size_t *at;
        double n, size;
    } parts[] = {
        {&ep->lay.send_rec, (double)T * ep->dmax, (double)ep->rec},
        {&ep->lay.recv_rec, (double)ep->cap_tok, (double)ep->rec},
        {&ep->lay.y, (double)ep->cap_ent, (double)ep->yrow},
        {&ep->lay.csend, (double)csend_rows, (double)ep->yrow},
        {&ep->lay.crecv, (double)ep->cap_back, (double)ep->yrow},
        {&ep->lay.weights, (double)T * K, sizeof(float)},
        {&ep->lay.ret_pos, (double)T * K, sizeof(int32_t)},
        {&ep->lay.tok_ndest, (double)T, sizeof(int32_t)},
        {&ep->lay.tok_dpos, (double)T * ep->dmax, sizeof(int32_t)},
        {&ep->lay.entry_token, (double)ep->cap_ent, sizeof(int32_t)},
        {&ep->lay.entry_weight, (double)ep->cap_ent, sizeof(float)},
        {&ep->lay.slot_offsets, (double)ep->spr + 1, sizeof(int64_t)},
        {&ep->lay.row_entries, (double)ep->cap_tok * K, sizeof(int32_t)},
        {&ep->lay.partial, (double)H, sizeof(float)},
        {&ep->lay.counts, (double)C_ROWS * R, sizeof(int64_t)},
    };
    size_t off = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        double bytes = parts[i].n * parts[i].size;
        if (bytes > (double)(SIZE_MAX / 4))
            return epxi_fail(err, EPX_ERR_OVERFLOW,
                             "EP workspace part %zu needs %.3g bytes: lower max_tokens (%lld) or "
                             "set max_recv_tokens",
                             i, bytes, (long long)T);
        *parts[i].at = off;
        off = align_up(off + (size_t)bytes, 64);
    }
    ep->lay.total = off;
    return EPX_OK;
}

epx_status epx_ep_workspace_bytes(const epx_ep_config *cfg, int32_t num_ranks, size_t *bytes,
                                  epx_error *err) {
    epx_ep tmp;
    memset(&tmp, 0, sizeof tmp);
    if (bytes == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "bytes must not be NULL");
    EPX_TRY(plan_layout(&tmp, cfg, num_ranks, err));
    *bytes = tmp.lay.total;
    return EPX_OK;
}

epx_status epx_ep_create(epx_comm *comm, const epx_ep_config *cfg, void *workspace,
                         size_t workspace_bytes, epx_ep **out, epx_error *err) {
    if (comm == NULL || out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "EP needs a communicator and an out pointer");
    if (epx_comm_memory_kind(comm) != EPX_COMM_MEMORY_HOST)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "communicator '%s' moves device memory; the host EP path needs host "
                         "memory: use epx_nccl_ep_create (epx_comm_nccl.h)",
                         epx_comm_name(comm));
    epx_ep *ep = epxi_calloc(1, sizeof *ep, "EP handle", err);
    if (ep == NULL) return EPX_ERR_NOMEM;
    epx_status st = plan_layout(ep, cfg, epx_comm_size(comm), err);
    if (st != EPX_OK) {
        free(ep);
        return st;
    }
    ep->comm = comm;
    ep->me = epx_comm_rank(comm);
    if (workspace != NULL) {
        if (workspace_bytes < ep->lay.total || (uintptr_t)workspace % 64 != 0) {
            size_t need = ep->lay.total;
            free(ep);
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "EP workspace of %zu bytes at %p is too small or not 64-byte "
                             "aligned: it needs %zu bytes (epx_ep_workspace_bytes)",
                             workspace_bytes, workspace, need);
        }
        ep->ws = workspace;
    } else {
        /* Over-allocate so the carve-up can start 64-byte aligned. */
        ep->ws = epxi_calloc(ep->lay.total + 64, 1, "EP workspace", err);
        if (ep->ws == NULL) {
            free(ep);
            return EPX_ERR_NOMEM;
        }
        ep->own_ws = true;
    }
    *out = ep;
    return EPX_OK;
}

void epx_ep_destroy(epx_ep *ep) {
    if (ep == NULL) return;
    if (ep->own_ws) free(ep->ws);
    free(ep);
}

/* The aligned base of the workspace. */
static unsigned char *base(const epx_ep *ep) {
    uintptr_t p = (uintptr_t)ep->ws;
    return (unsigned char *)(p + (64 - p % 64) % 64);
}
#define WS(ep, field, type) ((type *)(void *)(base(ep) + (ep)->lay.field))

static int64_t *crow(const epx_ep *ep, int row) {
    return WS(ep, counts, int64_t) + (size_t)row * (size_t)ep->R;
}

/* The distinct destination ranks of one token's slots, ascending. */
static int32_t token_dests(const int32_t *slots, int32_t K, int32_t spr, int32_t *d) {
    int32_t nd = 0;
    for (int32_t k = 0; k < K; k++) {
        if (slots[k] < 0) continue;
        int32_t r = slots[k] / spr, pos = nd;
        bool dup = false;
        for (int32_t j = 0; j < nd; j++) dup |= d[j] == r;
        if (dup) continue;
        while (pos > 0 && d[pos - 1] > r) {
            d[pos] = d[pos - 1];
            pos--;
        }
        d[pos] = r;
        nd++;
    }
    return nd;
}

static void prefix(const int64_t *n, int64_t *off, int32_t R) {
    int64_t acc = 0;
    for (int32_t r = 0; r < R; r++) {
        off[r] = acc;
        acc += n[r];
    }
}

epx_status epx_ep_dispatch(epx_ep *ep, int64_t T, const void *x, const int32_t *topk_slots,
                           const float *topk_weights, epx_ep_recv *recv, epx_error *err) {
    if (ep == NULL || recv == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "EP dispatch needs a handle and a recv view");
    const int32_t R = ep->R, K = ep->cfg.top_k, spr = ep->spr, P = ep->cfg.num_slots;
    if (T < 0 || T > ep->cfg.max_tokens)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "EP dispatch of %lld tokens is outside [0, max_tokens %lld]: raise "
                         "max_tokens when creating the handle",
                         (long long)T, (long long)ep->cfg.max_tokens);
    if (T > 0 && (x == NULL || topk_slots == NULL || topk_weights == NULL))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "EP dispatch of %lld tokens needs x, topk_slots and topk_weights",
                         (long long)T);
    for (int64_t i = 0; i < T * K; i++)
        if (topk_slots[i] < -1 || topk_slots[i] >= P)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "topk_slots[%lld][%d] = %d is outside [-1, %d) (num_slots)",
                             (long long)(i / K), (int)(i % K), topk_slots[i], P);
    ep->dispatched = false;
    ep->T = T;
    int64_t *ntok = crow(ep, C_NTOK), *nent = crow(ep, C_NENT), *rtok = crow(ep, C_RTOK),
            *rent = crow(ep, C_RENT), *stokoff = crow(ep, C_STOKOFF),
            *rtokoff = crow(ep, C_RTOKOFF), *coff = crow(ep, C_COFF), *cur = crow(ep, C_CUR),
            *xcnt = crow(ep, C_XCNT), *xdispl = crow(ep, C_XDISPL);
    float *wcopy = WS(ep, weights, float);
    int32_t *ret_pos = WS(ep, ret_pos, int32_t), *tok_ndest = WS(ep, tok_ndest, int32_t),
            *tok_dpos = WS(ep, tok_dpos, int32_t);
    unsigned char *send_rec = WS(ep, send_rec, unsigned char);
    if (T > 0) memcpy(wcopy, topk_weights, (size_t)(T * K) * sizeof(float));

    /* Pass 1: tokens and entries per destination. */
    for (int32_t r = 0; r < R; r++) ntok[r] = nent[r] = 0;
    int32_t d[EPX_MOE_MAX_TOP_K];
    for (int64_t t = 0; t < T; t++) {
        const int32_t *s = topk_slots + t * K;
        int32_t nd = token_dests(s, K, spr, d);
        for (int32_t j = 0; j < nd; j++) ntok[d[j]]++;
        for (int32_t k = 0; k < K; k++)
            if (s[k] >= 0) nent[s[k] / spr]++;
    }
    prefix(ntok, stokoff, R);
    bool topk_mode = ep->cfg.combine == EPX_EP_COMBINE_TOPK;
    prefix(topk_mode ? nent : ntok, coff, R);

    /* Pass 2: pack records in token order per destination, and note where
     * each output will come back. */
    for (int32_t r = 0; r < R; r++) cur[r] = stokoff[r];
    int64_t *ccur = xcnt; /* borrowed: xcnt is rebuilt before the first exchange */
    for (int32_t r = 0; r < R; r++) ccur[r] = coff[r];
    for (int64_t t = 0; t < T; t++) {
        const int32_t *s = topk_slots + t * K;
        const float *w = topk_weights + t * K;
        int32_t nd = token_dests(s, K, spr, d);
        for (int32_t j = 0; j < nd; j++) {
            int64_t pos = cur[d[j]]++;
            unsigned char *rec = send_rec + (size_t)pos * ep->rec;
            memcpy(rec, (const unsigned char *)x + (size_t)t * ep->xrow, ep->xrow);
            ep_meta *m = (ep_meta *)(void *)(rec + ep->meta_off);
            for (int32_t k = 0; k < K; k++) {
                bool here = s[k] >= 0 && s[k] / spr == d[j];
                m[k].slot = here ? s[k] - d[j] * spr : -1;
                m[k].weight = here ? w[k] : 0.0f;
            }
            if (!topk_mode) tok_dpos[t * ep->dmax + j] = (int32_t)pos;
        }
        tok_ndest[t] = nd;
        if (topk_mode)
            for (int32_t k = 0; k < K; k++)
                ret_pos[t * K + k] = s[k] >= 0 ? (int32_t)ccur[s[k] / spr]++ : -1;
    }

    /* Exchange 1: counts (tokens, entries) per peer. */
    int64_t *sendc = crow(ep, C_SENDC), *recvc = crow(ep, C_RECVC);
    for (int32_t r = 0; r < R; r++) {
        sendc[2 * r] = ntok[r];
        sendc[2 * r + 1] = nent[r];
        xcnt[r] = 2;
        xdispl[r] = 2 * (int64_t)r;
    }
    epx_status st = epx_comm_alltoallv(ep->comm, sendc, xcnt, xdispl, recvc, xcnt, xdispl,
                                       sizeof(int64_t), err);
    if (st != EPX_OK) {
        epxi_error_prefix(err, "EP dispatch (counts)");
        return st;
    }
    int64_t got_tok = 0, got_ent = 0;
    bool bad = false;
    for (int32_t r = 0; r < R; r++) {
        rtok[r] = recvc[2 * r];
        rent[r] = recvc[2 * r + 1];
        bad |= rtok[r] < 0 || rent[r] < 0 || rent[r] < rtok[r] || rent[r] > rtok[r] * K;
        got_tok += rtok[r];
        got_ent += rent[r];
    }
    if (bad)
        return epxi_fail(err, EPX_ERR_COMM,
                         "EP dispatch: a peer announced inconsistent counts; do all ranks use "
                         "the same EP config (top_k %d)?",
                         K);
    int64_t over = got_tok > ep->cap_tok || got_ent > ep->cap_ent;
    if (ep->checked_caps) {
        /* The caller chose a bound below the worst case: agree on overflow,
         * so no rank starts an exchange another has to refuse. */
        int64_t any = over;
        st = epx_comm_allreduce_sum(ep->comm, &any, &any, 1, EPX_DTYPE_I64, err);
        if (st != EPX_OK) {
            epxi_error_prefix(err, "EP dispatch (capacity check)");
            return st;
        }
        if (any > 0 && !over)
            return epxi_fail(err, EPX_ERR_OVERFLOW,
                             "EP dispatch: %lld rank(s) would receive more than their bound "
                             "(max_recv_tokens %lld, max_recv_entries %lld): raise the bounds "
                             "or set them to 0 (worst case)",
                             (long long)any, (long long)ep->cfg.max_recv_tokens,
                             (long long)ep->cfg.max_recv_entries);
    }
    if (over)
        return epxi_fail(err, ep->checked_caps ? EPX_ERR_OVERFLOW : EPX_ERR_COMM,
                         "EP dispatch: rank %d would receive %lld tokens / %lld entries, above "
                         "its capacity %lld / %lld: raise max_recv_tokens / max_recv_entries "
                         "(0 = worst case), or check that every rank uses the same max_tokens",
                         ep->me, (long long)got_tok, (long long)got_ent, (long long)ep->cap_tok,
                         (long long)ep->cap_ent);
    prefix(rtok, rtokoff, R);

    /* Exchange 2: the records. */
    unsigned char *recv_rec = WS(ep, recv_rec, unsigned char);
    st = epx_comm_alltoallv(ep->comm, send_rec, ntok, stokoff, recv_rec, rtok, rtokoff, ep->rec,
                            err);
    if (st != EPX_OK) {
        epxi_error_prefix(err, "EP dispatch (records)");
        return st;
    }

    /* Group the received entries by local slot: count, prefix, place. The
     * placing pass walks rows (source rank, token) and k in order, so each
     * slot's entries come out in that order. */
    int64_t *so = WS(ep, slot_offsets, int64_t);
    int32_t *entry_token = WS(ep, entry_token, int32_t), *row_entries = WS(ep, row_entries, int32_t);
    float *entry_weight = WS(ep, entry_weight, float);
    for (int32_t s = 0; s <= spr; s++) so[s] = 0;
    int64_t seen = 0;
    for (int64_t i = 0; i < got_tok; i++) {
        const ep_meta *m = (const ep_meta *)(const void *)(recv_rec + (size_t)i * ep->rec + ep->meta_off);
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
    if (seen != got_ent)
        return epxi_fail(err, EPX_ERR_COMM,
                         "EP dispatch: %lld entries announced but %lld received: mismatched "
                         "configs across ranks?",
                         (long long)got_ent, (long long)seen);
    for (int32_t s = 0; s < spr; s++) so[s + 1] += so[s];
    /* Place with a cursor per slot kept in the offsets themselves: so[s]
     * advances to so[s+1] while placing, and is shifted back afterwards. */
    for (int64_t i = 0; i < got_tok; i++) {
        const ep_meta *m = (const ep_meta *)(const void *)(recv_rec + (size_t)i * ep->rec + ep->meta_off);
        for (int32_t k = 0; k < K; k++) {
            int32_t s = m[k].slot;
            if (s < 0) {
                row_entries[i * K + k] = -1;
                continue;
            }
            int64_t e = so[s]++;
            entry_token[e] = (int32_t)i;
            entry_weight[e] = m[k].weight;
            row_entries[i * K + k] = (int32_t)e;
        }
    }
    for (int32_t s = spr; s > 0; s--) so[s] = so[s - 1];
    so[0] = 0;

    ep->nrecv_tok = got_tok;
    ep->nrecv_ent = got_ent;
    int64_t sent = 0;
    for (int32_t r = 0; r < R; r++)
        if (r != ep->me) sent += ntok[r];
    ep->last_dispatch_bytes = sent * (int64_t)ep->rec;
    ep->dispatched = true;

    recv->num_tokens = got_tok;
    recv->x = recv_rec;
    recv->x_stride = ep->rec;
    recv->num_entries = got_ent;
    recv->first_slot = ep->me * spr;
    recv->num_local_slots = spr;
    recv->slot_offsets = so;
    recv->entry_token = entry_token;
    recv->entry_weight = entry_weight;
    recv->y = WS(ep, y, void);
    return EPX_OK;
}

/* Row r of a y-typed buffer as fp32, element j. */
static float y_at(const epx_ep *ep, const unsigned char *row, int32_t j) {
    if (ep->cfg.y_dtype == EPX_DTYPE_F32) {
        float f;
        memcpy(&f, row + (size_t)j * 4, 4);
        return f;
    }
    uint16_t b;
    memcpy(&b, row + (size_t)j * 2, 2);
    return epx_bf16_to_f32(b);
}

epx_status epx_ep_combine(epx_ep *ep, float *out, epx_error *err) {
    if (ep == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "EP combine needs a handle");
    if (!ep->dispatched)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "EP combine without a successful dispatch before it");
    const int32_t R = ep->R, K = ep->cfg.top_k, H = ep->cfg.hidden;
    const int64_t T = ep->T;
    if (T > 0 && out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "EP combine of %lld tokens needs out",
                         (long long)T);
    int64_t *ntok = crow(ep, C_NTOK), *nent = crow(ep, C_NENT), *rtok = crow(ep, C_RTOK),
            *rent = crow(ep, C_RENT), *stokoff = crow(ep, C_STOKOFF),
            *rtokoff = crow(ep, C_RTOKOFF), *coff = crow(ep, C_COFF),
            *rentoff = crow(ep, C_RENTOFF);
    const unsigned char *y = WS(ep, y, unsigned char);
    unsigned char *csend = WS(ep, csend, unsigned char), *crecv = WS(ep, crecv, unsigned char);
    const int32_t *row_entries = WS(ep, row_entries, int32_t);
    const float *entry_weight = WS(ep, entry_weight, float);
    const bool topk_mode = ep->cfg.combine == EPX_EP_COMBINE_TOPK;
    epx_status st;
    int64_t back = 0;
    if (topk_mode) {
        /* Rows are grouped by source in order, so one cursor lays out every
         * source's block at its prefix offset. */
        prefix(rent, rentoff, R);
        int64_t c = 0;
        for (int64_t i = 0; i < ep->nrecv_tok; i++)
            for (int32_t k = 0; k < K; k++) {
                int32_t e = row_entries[i * K + k];
                if (e >= 0) memcpy(csend + (size_t)(c++) * ep->yrow, y + (size_t)e * ep->yrow, ep->yrow);
            }
        st = epx_comm_alltoallv(ep->comm, csend, rent, rentoff, crecv, nent, coff, ep->yrow, err);
        for (int32_t r = 0; r < R; r++)
            if (r != ep->me) back += rent[r];
    } else {
        /* Pre-reduce each received token over its local entries, k order. */
        float *partial = WS(ep, partial, float);
        for (int64_t i = 0; i < ep->nrecv_tok; i++) {
            for (int32_t j = 0; j < H; j++) partial[j] = 0.0f;
            for (int32_t k = 0; k < K; k++) {
                int32_t e = row_entries[i * K + k];
                if (e < 0) continue;
                const unsigned char *ye = y + (size_t)e * ep->yrow;
                for (int32_t j = 0; j < H; j++) partial[j] += entry_weight[e] * y_at(ep, ye, j);
            }
            unsigned char *dst = csend + (size_t)i * ep->yrow;
            if (ep->cfg.y_dtype == EPX_DTYPE_F32) {
                memcpy(dst, partial, (size_t)H * sizeof(float));
            } else {
                for (int32_t j = 0; j < H; j++) {
                    uint16_t b = epx_bf16_from_f32(partial[j]);
                    memcpy(dst + (size_t)j * 2, &b, 2);
                }
            }
        }
        st = epx_comm_alltoallv(ep->comm, csend, rtok, rtokoff, crecv, ntok, stokoff, ep->yrow, err);
        for (int32_t r = 0; r < R; r++)
            if (r != ep->me) back += rtok[r];
    }
    if (st != EPX_OK) {
        epxi_error_prefix(err, "EP combine");
        return st;
    }
    ep->last_combine_bytes = back * (int64_t)ep->yrow;

    /* Reduce per token in the fixed order. */
    const float *w = WS(ep, weights, float);
    const int32_t *ret_pos = WS(ep, ret_pos, int32_t), *tok_ndest = WS(ep, tok_ndest, int32_t),
                  *tok_dpos = WS(ep, tok_dpos, int32_t);
    for (int64_t t = 0; t < T; t++) {
        float *o = out + t * H;
        for (int32_t j = 0; j < H; j++) o[j] = 0.0f;
        if (topk_mode) {
            for (int32_t k = 0; k < K; k++) {
                int32_t p = ret_pos[t * K + k];
                if (p < 0) continue;
                const unsigned char *row = crecv + (size_t)p * ep->yrow;
                float wk = w[t * K + k];
                if (ep->cfg.y_dtype == EPX_DTYPE_F32) {
                    const float *yr = (const float *)(const void *)row;
                    for (int32_t j = 0; j < H; j++) o[j] += wk * yr[j];
                } else {
                    for (int32_t j = 0; j < H; j++) o[j] += wk * y_at(ep, row, j);
                }
            }
        } else {
            for (int32_t j2 = 0; j2 < tok_ndest[t]; j2++) {
                const unsigned char *row = crecv + (size_t)tok_dpos[t * ep->dmax + j2] * ep->yrow;
                for (int32_t j = 0; j < H; j++) o[j] += y_at(ep, row, j);
            }
        }
    }
    ep->dispatched = false;
    return EPX_OK;
}

epx_status epx_ep_run_experts(epx_ep *ep, const epx_ep_recv *recv, const epx_moe_expert *experts,
                              float *work, epx_error *err) {
    if (ep == NULL || recv == NULL || (recv->num_entries > 0 && (experts == NULL || work == NULL)))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "EP run_experts needs the handle, the recv view, %d expert views and "
                         "scratch",
                         ep ? ep->spr : 0);
    if (ep->cfg.x_dtype != EPX_DTYPE_F32 || ep->cfg.y_dtype != EPX_DTYPE_F32)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "EP run_experts runs fp32 experts: x_dtype and y_dtype must be "
                         "EPX_DTYPE_F32");
    const int32_t H = ep->cfg.hidden;
    float *y = recv->y;
    for (int32_t s = 0; s < recv->num_local_slots; s++) {
        int64_t e0 = recv->slot_offsets[s], n = recv->slot_offsets[s + 1] - e0;
        if (n == 0) continue;
        EPX_TRY(epx_moe_expert_forward(&experts[s], H, recv->x,
                                       (int64_t)(recv->x_stride / sizeof(float)),
                                       recv->entry_token + e0, n, y + e0 * H, work, err));
    }
    return EPX_OK;
}

epx_status epx_ep_identity_experts(epx_ep *ep, const epx_ep_recv *recv, epx_error *err) {
    if (ep == NULL || recv == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "identity experts need the handle and a recv view");
    const int32_t H = ep->cfg.hidden;
    unsigned char *y = recv->y;
    for (int64_t e = 0; e < recv->num_entries; e++) {
        const unsigned char *src = (const unsigned char *)recv->x + (size_t)recv->entry_token[e] * recv->x_stride;
        unsigned char *dst = y + (size_t)e * ep->yrow;
        if (ep->cfg.x_dtype == ep->cfg.y_dtype) {
            memcpy(dst, src, ep->yrow);
        } else if (ep->cfg.x_dtype == EPX_DTYPE_F32) {
            for (int32_t j = 0; j < H; j++) {
                float f;
                memcpy(&f, src + (size_t)j * 4, 4);
                uint16_t b = epx_bf16_from_f32(f);
                memcpy(dst + (size_t)j * 2, &b, 2);
            }
        } else {
            for (int32_t j = 0; j < H; j++) {
                uint16_t b;
                memcpy(&b, src + (size_t)j * 2, 2);
                float f = epx_bf16_to_f32(b);
                memcpy(dst + (size_t)j * 4, &f, 4);
            }
        }
    }
    return EPX_OK;
}

void epx_ep_last_bytes(const epx_ep *ep, int64_t *dispatch_bytes, int64_t *combine_bytes) {
    if (dispatch_bytes) *dispatch_bytes = ep ? ep->last_dispatch_bytes : 0;
    if (combine_bytes) *combine_bytes = ep ? ep->last_combine_bytes : 0;
}
