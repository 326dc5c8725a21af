/*
 * ep.c - expert-parallel dispatch and combine of one MoE layer on host
 * memory, over any host communicator (MPI, local): the CPU reference of both
 * modes. Records, sizes, grouping and the combine formula are ep_common.h's,
 * shared with the GPU paths.
 *
 * Normal mode, three collective exchanges per batch:
 *   1. counts: to every peer, the tokens and the (token, k) entries it will
 *      receive (two int64 per peer);
 *   2. dispatch: each token once per destination rank, as a record of its
 *      x row and its K (local slot, weight) pairs, -1 for the k that go
 *      elsewhere; the receiver groups the entries by local slot;
 *   3. combine: the expert outputs travel back, one row per entry
 *      (EPX_EP_COMBINE_TOPK) or one pre-reduced row per token and rank
 *      (EPX_EP_COMBINE_RANK), and each token is reduced in fp32 in a fixed
 *      order.
 * Low-latency mode, two fixed-size exchanges per batch and no counts: token
 * t goes to row t of the destination's block for this rank, tagged with the
 * batch's epoch, and the block's last row carries the flag (epoch, T); the
 * receiver keeps the rows whose tag is this batch's. Combine sends the
 * output of (t, k) to row t * K + k of the token's rank. The same protocol
 * and layout as the GPU engine (gpu/ll_ep.cu), so CI checks it on MPI ranks.
 *
 * Before a handle's first batch on more than one rank, the ranks compare
 * their configs in one exchange of a fixed size (shape_check).
 *
 * Everything a batch needs is carved out of one workspace at creation; the
 * per-batch path allocates nothing. The send streams are ordered by token,
 * and every position a later step needs (where (t, k)'s output comes back)
 * is recorded while packing, so combine needs no second exchange of counts.
 */
#include "internal.h"
#include "ep_common.h"

#include <stdint.h>
#include <string.h>

/* Where each buffer lives inside the workspace (byte offsets). */
typedef struct ep_layout {
    size_t send_rec, recv_rec, y, csend, crecv, weights, slots, ret_pos, tok_ndest, tok_dpos,
        entry_token, entry_weight, entry_pair, slot_offsets, row_entries, counts, shape, total;
} ep_layout;

/* The per-peer integer arrays: int64 rows of [R]; the counts exchange
 * buffers take two rows each ([R][2]). */
enum {
    C_NTOK,
    C_NENT,
    C_RTOK,
    C_RENT,
    C_STOKOFF,
    C_RTOKOFF,
    C_COFF,
    C_RENTOFF,
    C_CUR,
    C_XCNT,
    C_XDISPL,
    C_SENDC,
    C_RECVC = C_SENDC + 2,
    C_ROWS = C_RECVC + 2
};

/* What a rank announces to every peer, instead of its counts, for a batch
 * it refused (check_batch). */
#define REFUSED ((int64_t)-1)

/* The config fields every rank's handle must share, as the ranks compare
 * them before their first batch (shape_check). */
enum {
    F_HIDDEN,
    F_TOP_K,
    F_NUM_SLOTS,
    F_MAX_TOKENS,
    F_X_DTYPE,
    F_Y_DTYPE,
    F_COMBINE,
    F_MODE,
    F_MAX_RECV_TOKENS,
    F_MAX_RECV_ENTRIES,
    F_COUNT
};

struct epx_ep {
    epx_comm *comm;
    epxi_ep_geom g;
    int32_t me;
    unsigned char *ws;
    bool own_ws;
    ep_layout lay;
    uint32_t epoch;    /* low latency: the last batch's */
    bool shape_agreed; /* every rank's config was found equal to this one's */
    /* last batch */
    int64_t T;
    bool dispatched;
    int64_t nrecv_tok, nrecv_ent;
    int64_t last_dispatch_bytes, last_combine_bytes;
};

/* The workspace layout of either mode, shared by the size query and
 * creation so both agree to the byte. */
static epx_status plan_layout(epx_ep *ep, const epx_ep_config *cfg, int32_t R, epx_error *err) {
    EPX_TRY(epxi_ep_geom_init(cfg, R, &ep->g, err));
    const epxi_ep_geom *g = &ep->g;
    const double T = (double)g->M, K = g->K, rec = (double)g->rec, yrow = (double)g->yrow;
    ep_layout *l = &ep->lay;
    if (g->low_latency) {
        /* Fixed blocks per peer: M token rows + one flag row out, M * K
         * output rows back. */
        const double blk = (double)R * (T + 1);
        epxi_ws_part parts[] = {
            {&l->send_rec, blk, rec},
            {&l->recv_rec, blk, rec},
            {&l->y, (double)g->cap_ent, yrow},
            {&l->csend, R * T * K, yrow},
            {&l->crecv, R * T * K, yrow},
            {&l->weights, T * K, sizeof(float)},
            {&l->slots, T * K, sizeof(int32_t)},
            {&l->entry_token, (double)g->cap_ent, sizeof(int32_t)},
            {&l->entry_weight, (double)g->cap_ent, sizeof(float)},
            {&l->entry_pair, (double)g->cap_ent, sizeof(int32_t)},
            {&l->slot_offsets, (double)g->spr + 1, sizeof(int64_t)},
            {&l->counts, (double)C_ROWS * R, sizeof(int64_t)},
            {&l->shape, (double)F_COUNT * (R + 1), sizeof(int64_t)},
        };
        return epxi_ws_carve(parts, sizeof parts / sizeof parts[0], 64, &l->total, "EP", err);
    }
    const double csend_rows = (double)(g->topk_mode ? g->cap_ent : g->cap_tok);
    epxi_ws_part parts[] = {
        {&l->send_rec, T * g->dmax, rec},
        {&l->recv_rec, (double)g->cap_tok, rec},
        {&l->y, (double)g->cap_ent, yrow},
        {&l->csend, csend_rows, yrow},
        {&l->crecv, (double)g->cap_back, yrow},
        {&l->weights, T * K, sizeof(float)},
        {&l->ret_pos, T * K, sizeof(int32_t)},
        {&l->tok_ndest, T, sizeof(int32_t)},
        {&l->tok_dpos, T * g->dmax, sizeof(int32_t)},
        {&l->entry_token, (double)g->cap_ent, sizeof(int32_t)},
        {&l->entry_weight, (double)g->cap_ent, sizeof(float)},
        {&l->slot_offsets, (double)g->spr + 1, sizeof(int64_t)},
        {&l->row_entries, (double)g->cap_tok * K, sizeof(int32_t)},
        {&l->counts, (double)C_ROWS * R, sizeof(int64_t)},
        {&l->shape, (double)F_COUNT * (R + 1), sizeof(int64_t)},
    };
    return epxi_ws_carve(parts, sizeof parts / sizeof parts[0], 64, &l->total, "EP", err);
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
        /* Low latency tells stale rows by their tags: start from zero. */
        if (ep->g.low_latency) memset(workspace, 0, ep->lay.total);
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
    return WS(ep, counts, int64_t) + (size_t)row * (size_t)ep->g.R;
}

static void prefix(const int64_t *n, int64_t *off, int32_t R) {
    int64_t acc = 0;
    for (int32_t r = 0; r < R; r++) {
        off[r] = acc;
        acc += n[r];
    }
}

/* Arguments every dispatch checks before it sends anything. A batch that
 * fails them is still taken to the batch's first exchange, empty and
 * marked refused, so that every rank returns the error together
 * (refuse_batch) instead of the others waiting for this rank until the
 * timeout, or pairing this batch's exchanges with its next one's. */
static epx_status check_batch(const epx_ep *ep, int64_t T, const void *x, const int32_t *slots,
                              const float *weights, epx_error *err) {
    const int32_t K = ep->g.K, P = ep->g.P;
    if (T < 0 || T > ep->g.M)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "EP dispatch of %lld tokens is outside [0, max_tokens %lld]: raise "
                         "max_tokens when creating the handle",
                         (long long)T, (long long)ep->g.M);
    if (T > 0 && (x == NULL || slots == NULL || weights == NULL))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "EP dispatch of %lld tokens needs x, topk_slots and topk_weights",
                         (long long)T);
    for (int64_t i = 0; i < T * K; i++)
        if (slots[i] < -1 || slots[i] >= P)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "topk_slots[%lld][%d] = %d is outside [-1, %d) (num_slots)",
                             (long long)(i / K), (int)(i % K), slots[i], P);
    return EPX_OK;
}

/* A batch some rank refused: this rank's own reason, or the refusing rank's
 * number (`by`). Nothing was sent and no expert runs; the ranks stay in
 * step, so the next batch goes through. */
static epx_status refuse_batch(epx_status own_st, const epx_error *own, int32_t by,
                               epx_error *err) {
    if (own_st != EPX_OK)
        return epxi_fail(err, own_st, "%s; every rank returns an error for this batch", own->msg);
    return epxi_fail(err, EPX_ERR_INVALID_ARG,
                     "rank %d passed a batch it cannot dispatch (its error names the value); "
                     "every rank returns an error for this batch, no expert ran",
                     by);
}

/* Every rank compares its config with every other's, once, before the
 * handle's first batch. A rank with another shape sends records and rows
 * of another size: MPI then reports a truncation on some ranks only, or
 * nothing at all where the sizes round alike (other hidden sizes in one
 * record size), and the others go on with wrong rows or wait for a peer
 * that left. The exchange is of a fixed size whatever the configs, so
 * every rank sees every value and all refuse together, with the
 * communicator still healthy. */
static epx_status shape_check(epx_ep *ep, epx_error *err) {
    static const char *const names[F_COUNT] = {
        "hidden",  "top_k",   "num_slots", "max_tokens",      "x_dtype",
        "y_dtype", "combine", "mode",      "max_recv_tokens", "max_recv_entries"};
    const epx_ep_config *c = &ep->g.cfg;
    const int32_t R = ep->g.R;
    int64_t *mine = WS(ep, shape, int64_t), *all = mine + F_COUNT;
    const int64_t v[F_COUNT] = {c->hidden,          c->top_k,           c->num_slots, c->max_tokens,
                                c->x_dtype,         c->y_dtype,         c->combine,   c->mode,
                                c->max_recv_tokens, c->max_recv_entries};
    memcpy(mine, v, sizeof v);
    /* The same F_COUNT values to every peer (send blocks may overlap). */
    int64_t *cnt = crow(ep, C_XCNT), *sdispl = crow(ep, C_XDISPL), *rdispl = crow(ep, C_RTOKOFF);
    for (int32_t r = 0; r < R; r++) {
        cnt[r] = F_COUNT;
        sdispl[r] = 0;
        rdispl[r] = (int64_t)r * F_COUNT;
    }
    epx_status st =
        epx_comm_alltoallv(ep->comm, mine, cnt, sdispl, all, cnt, rdispl, sizeof(int64_t), err);
    if (st != EPX_OK) {
        epxi_error_prefix(err, "EP config check");
        return st;
    }
    for (int32_t r = 0; r < R; r++)
        for (int f = 0; f < F_COUNT; f++)
            if (all[(size_t)r * F_COUNT + f] != v[f])
                return epxi_fail(err, EPX_ERR_INVALID_ARG,
                                 "EP config differs between ranks: %s is %lld on rank %d but "
                                 "%lld on rank %d; create every rank's EP handle with the same "
                                 "config (no rank dispatched)",
                                 names[f], (long long)v[f], ep->me,
                                 (long long)all[(size_t)r * F_COUNT + f], r);
    ep->shape_agreed = true;
    return EPX_OK;
}

static void fill_recv(const epx_ep *ep, int64_t rows, int64_t entries, epx_ep_recv *recv) {
    recv->num_tokens = rows;
    recv->x = WS(ep, recv_rec, void);
    recv->x_stride = ep->g.rec;
    recv->num_entries = entries;
    recv->first_slot = ep->me * ep->g.spr;
    recv->num_local_slots = ep->g.spr;
    recv->slot_offsets = WS(ep, slot_offsets, int64_t);
    recv->entry_token = WS(ep, entry_token, int32_t);
    recv->entry_weight = WS(ep, entry_weight, float);
    recv->y = WS(ep, y, void);
}

static epx_status dispatch_normal(epx_ep *ep, int64_t T, const void *x, const int32_t *topk_slots,
                                  const float *topk_weights, epx_ep_recv *recv, epx_error *err) {
    const epxi_ep_geom *g = &ep->g;
    const int32_t R = g->R, K = g->K, spr = g->spr;
    epx_error own = {0};
    const epx_status verdict = check_batch(ep, T, x, topk_slots, topk_weights, &own);
    if (verdict != EPX_OK) T = 0; /* send nothing, but take part in the counts */
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
        int32_t nd = epxi_ep_token_dests(s, K, spr, d);
        for (int32_t j = 0; j < nd; j++) ntok[d[j]]++;
        for (int32_t k = 0; k < K; k++)
            if (s[k] >= 0) nent[s[k] / spr]++;
    }
    prefix(ntok, stokoff, R);
    prefix(g->topk_mode ? nent : ntok, coff, R);

    /* Pass 2: pack records in token order per destination, and note where
     * each output will come back. */
    for (int32_t r = 0; r < R; r++) cur[r] = stokoff[r];
    int64_t *ccur = xcnt; /* borrowed: xcnt is rebuilt before the first exchange */
    for (int32_t r = 0; r < R; r++) ccur[r] = coff[r];
    for (int64_t t = 0; t < T; t++) {
        const int32_t *s = topk_slots + t * K;
        int32_t nd = epxi_ep_token_dests(s, K, spr, d);
        for (int32_t j = 0; j < nd; j++) {
            int64_t pos = cur[d[j]]++;
            unsigned char *rec = epxi_ep_rec(g, send_rec, pos);
            memcpy(rec, (const unsigned char *)x + (size_t)t * g->xrow, g->xrow);
            epxi_ep_write_meta((epxi_ep_meta *)(void *)(rec + g->meta_off), s, topk_weights + t * K,
                               K, spr, d[j]);
            if (!g->topk_mode) tok_dpos[t * g->dmax + j] = (int32_t)pos;
        }
        tok_ndest[t] = nd;
        if (g->topk_mode)
            for (int32_t k = 0; k < K; k++)
                ret_pos[t * K + k] = s[k] >= 0 ? (int32_t)ccur[s[k] / spr]++ : -1;
    }

    /* Exchange 1: counts (tokens, entries) per peer. */
    int64_t *sendc = crow(ep, C_SENDC), *recvc = crow(ep, C_RECVC);
    for (int32_t r = 0; r < R; r++) {
        sendc[2 * r] = verdict == EPX_OK ? ntok[r] : REFUSED;
        sendc[2 * r + 1] = verdict == EPX_OK ? nent[r] : REFUSED;
        xcnt[r] = 2;
        xdispl[r] = 2 * (int64_t)r;
    }
    epx_status st = epx_comm_alltoallv(ep->comm, sendc, xcnt, xdispl, recvc, xcnt, xdispl,
                                       sizeof(int64_t), err);
    if (st != EPX_OK) {
        epxi_error_prefix(err, "EP dispatch (counts)");
        return st;
    }
    int32_t refused_by = -1;
    for (int32_t r = 0; r < R && refused_by < 0; r++)
        if (recvc[2 * r] == REFUSED) refused_by = r;
    if (verdict != EPX_OK || refused_by >= 0) return refuse_batch(verdict, &own, refused_by, err);
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
    int64_t over = got_tok > g->cap_tok || got_ent > g->cap_ent;
    if (g->checked_caps) {
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
                             (long long)any, (long long)g->cfg.max_recv_tokens,
                             (long long)g->cfg.max_recv_entries);
    }
    if (over)
        return epxi_fail(err, g->checked_caps ? EPX_ERR_OVERFLOW : EPX_ERR_COMM,
                         "EP dispatch: rank %d would receive %lld tokens / %lld entries, above "
                         "its capacity %lld / %lld: raise max_recv_tokens / max_recv_entries "
                         "(0 = worst case), or check that every rank uses the same max_tokens",
                         ep->me, (long long)got_tok, (long long)got_ent, (long long)g->cap_tok,
                         (long long)g->cap_ent);
    prefix(rtok, rtokoff, R);

    /* Exchange 2: the records. */
    unsigned char *recv_rec = WS(ep, recv_rec, unsigned char);
    st =
        epx_comm_alltoallv(ep->comm, send_rec, ntok, stokoff, recv_rec, rtok, rtokoff, g->rec, err);
    if (st != EPX_OK) {
        epxi_error_prefix(err, "EP dispatch (records)");
        return st;
    }

    /* Group the received entries by local slot: one dense run of rows. */
    const int64_t first = 0;
    int64_t seen = 0;
    EPX_TRY(epxi_ep_group_entries(g, recv_rec, 1, &first, &got_tok, 0,
                                  WS(ep, slot_offsets, int64_t), WS(ep, entry_token, int32_t),
                                  WS(ep, entry_weight, float), NULL, WS(ep, row_entries, int32_t),
                                  &seen, err));
    if (seen != got_ent)
        return epxi_fail(err, EPX_ERR_COMM,
                         "EP dispatch: %lld entries announced but %lld received: mismatched "
                         "configs across ranks?",
                         (long long)got_ent, (long long)seen);

    ep->nrecv_tok = got_tok;
    ep->nrecv_ent = got_ent;
    int64_t sent = 0;
    for (int32_t r = 0; r < R; r++)
        if (r != ep->me) sent += ntok[r];
    ep->last_dispatch_bytes = sent * (int64_t)g->rec;
    ep->dispatched = true;
    fill_recv(ep, got_tok, got_ent, recv);
    return EPX_OK;
}

/* Low latency: fixed blocks of M + 1 records per peer, no count exchange. */
static epx_status dispatch_ll(epx_ep *ep, int64_t T, const void *x, const int32_t *topk_slots,
                              const float *topk_weights, epx_ep_recv *recv, epx_error *err) {
    const epxi_ep_geom *g = &ep->g;
    const int32_t R = g->R, K = g->K, spr = g->spr;
    const int64_t M = g->M, S = M + 1;
    /* A bad batch is not refused here: the flag carries the verdict, so
     * every rank fails this batch together instead of waiting for us. */
    epx_error own = {0};
    const epx_status verdict = check_batch(ep, T, x, topk_slots, topk_weights, &own);
    if (verdict != EPX_OK) T = 0;
    ep->dispatched = false;
    ep->T = T;
    const uint32_t epoch = ep->epoch + 1;
    ep->epoch = epoch == 0 ? 1 : epoch; /* 0 marks rows never written */
    unsigned char *send_rec = WS(ep, send_rec, unsigned char);
    if (T > 0) {
        memcpy(WS(ep, weights, float), topk_weights, (size_t)(T * K) * sizeof(float));
        memcpy(WS(ep, slots, int32_t), topk_slots, (size_t)(T * K) * sizeof(int32_t));
    }
    int64_t sent = 0;
    int32_t d[EPX_MOE_MAX_TOP_K];
    for (int64_t t = 0; t < T; t++) {
        const int32_t *s = topk_slots + t * K;
        int32_t nd = epxi_ep_token_dests(s, K, spr, d);
        for (int32_t j = 0; j < nd; j++) {
            unsigned char *rec = epxi_ep_rec(g, send_rec, d[j] * S + t);
            memcpy(rec, (const unsigned char *)x + (size_t)t * g->xrow, g->xrow);
            epxi_ep_write_meta((epxi_ep_meta *)(void *)(rec + g->meta_off), s, topk_weights + t * K,
                               K, spr, d[j]);
            *epxi_ep_tag_of(g, rec) = ep->epoch;
            sent += d[j] != ep->me;
        }
    }
    for (int32_t r = 0; r < R; r++) {
        uint64_t flag = epxi_ll_flag(ep->epoch, verdict == EPX_OK ? (uint32_t)T : EPXI_LL_BAD);
        memcpy(epxi_ep_rec(g, send_rec, r * S + M), &flag, sizeof flag);
    }
    int64_t *cnt = crow(ep, C_XCNT), *displ = crow(ep, C_XDISPL);
    for (int32_t r = 0; r < R; r++) {
        cnt[r] = S;
        displ[r] = r * S;
    }
    unsigned char *recv_rec = WS(ep, recv_rec, unsigned char);
    epx_status st =
        epx_comm_alltoallv(ep->comm, send_rec, cnt, displ, recv_rec, cnt, displ, g->rec, err);
    if (st != EPX_OK) {
        epxi_error_prefix(err, "EP low-latency dispatch");
        return st;
    }
    /* The flags: this batch's epoch from every source, and its count. */
    int64_t *first = crow(ep, C_RTOKOFF), *rows = crow(ep, C_RTOK);
    int32_t bad_rank = -1;
    for (int32_t r = 0; r < R; r++) {
        uint64_t flag;
        memcpy(&flag, epxi_ep_crec(g, recv_rec, r * S + M), sizeof flag);
        uint32_t count = (uint32_t)flag;
        if ((uint32_t)(flag >> 32) != ep->epoch || (count != EPXI_LL_BAD && count > (uint64_t)M))
            return epxi_fail(err, EPX_ERR_COMM,
                             "EP low-latency dispatch: rank %d's flag (epoch %u, count %u) is "
                             "not batch %u's: do all ranks use the same config and make the "
                             "same calls?",
                             r, (unsigned)(flag >> 32), (unsigned)count, (unsigned)ep->epoch);
        if (count == EPXI_LL_BAD && bad_rank < 0) bad_rank = r;
        first[r] = r * S;
        rows[r] = count == EPXI_LL_BAD ? 0 : count;
    }
    if (verdict != EPX_OK || bad_rank >= 0) return refuse_batch(verdict, &own, bad_rank, err);
    int64_t got_ent = 0;
    EPX_TRY(epxi_ep_group_entries(g, recv_rec, R, first, rows, ep->epoch,
                                  WS(ep, slot_offsets, int64_t), WS(ep, entry_token, int32_t),
                                  WS(ep, entry_weight, float), WS(ep, entry_pair, int32_t), NULL,
                                  &got_ent, err));
    ep->nrecv_tok = R * S;
    ep->nrecv_ent = got_ent;
    ep->last_dispatch_bytes = sent * (int64_t)g->rec;
    ep->dispatched = true;
    fill_recv(ep, R * S, got_ent, recv);
    return EPX_OK;
}

epx_status epx_ep_dispatch(epx_ep *ep, int64_t T, const void *x, const int32_t *topk_slots,
                           const float *topk_weights, epx_ep_recv *recv, epx_error *err) {
    if (ep == NULL || recv == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "EP dispatch needs a handle and a recv view");
    if (!ep->shape_agreed && ep->g.R > 1) EPX_TRY(shape_check(ep, err));
    if (ep->g.low_latency) return dispatch_ll(ep, T, x, topk_slots, topk_weights, recv, err);
    return dispatch_normal(ep, T, x, topk_slots, topk_weights, recv, err);
}

/* out[t] from K rows (NULL where no expert) in the one combine formula. */
static void combine_token(const epxi_ep_geom *g, const unsigned char *const *rows, const float *w,
                          int32_t n, float *out) {
    const int bf16 = g->cfg.y_dtype == EPX_DTYPE_BF16;
    for (int64_t h = 0; h < g->H; h++) out[h] = epxi_ep_combine_elem(rows, w, n, h, bf16);
}

static epx_status combine_normal(epx_ep *ep, float *out, epx_error *err) {
    const epxi_ep_geom *g = &ep->g;
    const int32_t R = g->R, K = g->K, H = g->H;
    const int64_t T = ep->T;
    const int bf16 = g->cfg.y_dtype == EPX_DTYPE_BF16;
    int64_t *ntok = crow(ep, C_NTOK), *nent = crow(ep, C_NENT), *rtok = crow(ep, C_RTOK),
            *rent = crow(ep, C_RENT), *stokoff = crow(ep, C_STOKOFF),
            *rtokoff = crow(ep, C_RTOKOFF), *coff = crow(ep, C_COFF),
            *rentoff = crow(ep, C_RENTOFF);
    const unsigned char *y = WS(ep, y, unsigned char);
    unsigned char *csend = WS(ep, csend, unsigned char), *crecv = WS(ep, crecv, unsigned char);
    const int32_t *row_entries = WS(ep, row_entries, int32_t);
    const float *entry_weight = WS(ep, entry_weight, float);
    const unsigned char *rows[EPX_MOE_MAX_TOP_K];
    float wk[EPX_MOE_MAX_TOP_K];
    epx_status st;
    int64_t back = 0;
    if (g->topk_mode) {
        /* Rows are grouped by source in order, so one cursor lays out every
         * source's block at its prefix offset. */
        prefix(rent, rentoff, R);
        int64_t c = 0;
        for (int64_t i = 0; i < ep->nrecv_tok; i++)
            for (int32_t k = 0; k < K; k++) {
                int32_t e = row_entries[i * K + k];
                if (e >= 0)
                    memcpy(csend + (size_t)(c++) * g->yrow, y + (size_t)e * g->yrow, g->yrow);
            }
        st = epx_comm_alltoallv(ep->comm, csend, rent, rentoff, crecv, nent, coff, g->yrow, err);
        for (int32_t r = 0; r < R; r++)
            if (r != ep->me) back += rent[r];
    } else {
        /* Pre-reduce each received token over its local entries, k order,
         * rounded to y_dtype. */
        for (int64_t i = 0; i < ep->nrecv_tok; i++) {
            for (int32_t k = 0; k < K; k++) {
                int32_t e = row_entries[i * K + k];
                rows[k] = e < 0 ? NULL : y + (size_t)e * g->yrow;
                wk[k] = e < 0 ? 0.0f : entry_weight[e];
            }
            unsigned char *dst = csend + (size_t)i * g->yrow;
            for (int64_t h = 0; h < H; h++)
                epxi_row_store(dst, h, epxi_ep_combine_elem(rows, wk, K, h, bf16), bf16);
        }
        st = epx_comm_alltoallv(ep->comm, csend, rtok, rtokoff, crecv, ntok, stokoff, g->yrow, err);
        for (int32_t r = 0; r < R; r++)
            if (r != ep->me) back += rtok[r];
    }
    if (st != EPX_OK) {
        epxi_error_prefix(err, "EP combine");
        return st;
    }
    ep->last_combine_bytes = back * (int64_t)g->yrow;

    /* Reduce per token in the fixed order (out NULL: the exchange only). */
    const float *w = WS(ep, weights, float);
    const int32_t *ret_pos = WS(ep, ret_pos, int32_t), *tok_ndest = WS(ep, tok_ndest, int32_t),
                  *tok_dpos = WS(ep, tok_dpos, int32_t);
    for (int64_t t = 0; t < T && out != NULL; t++) {
        if (g->topk_mode) {
            for (int32_t k = 0; k < K; k++) {
                int32_t p = ret_pos[t * K + k];
                rows[k] = p < 0 ? NULL : crecv + (size_t)p * g->yrow;
            }
            combine_token(g, rows, w + t * K, K, out + t * H);
        } else {
            for (int32_t j = 0; j < tok_ndest[t]; j++)
                rows[j] = crecv + (size_t)tok_dpos[t * g->dmax + j] * g->yrow;
            combine_token(g, rows, NULL, tok_ndest[t], out + t * H);
        }
    }
    return EPX_OK;
}

/* Low latency: the output of (t, k) goes to row t * K + k of the token's
 * rank, in a fixed block of M * K rows per peer. */
static epx_status combine_ll(epx_ep *ep, float *out, epx_error *err) {
    const epxi_ep_geom *g = &ep->g;
    const int32_t R = g->R, K = g->K, spr = g->spr;
    const int64_t M = g->M, S = M + 1, T = ep->T;
    const unsigned char *y = WS(ep, y, unsigned char);
    unsigned char *csend = WS(ep, csend, unsigned char), *crecv = WS(ep, crecv, unsigned char);
    const int32_t *entry_pair = WS(ep, entry_pair, int32_t);
    int64_t back = 0;
    for (int64_t e = 0; e < ep->nrecv_ent; e++) {
        int64_t pair = entry_pair[e], row = pair / K, src = row / S, t = row % S;
        memcpy(csend + (size_t)(src * M * K + t * K + pair % K) * g->yrow, y + (size_t)e * g->yrow,
               g->yrow);
        back += src != ep->me;
    }
    int64_t *cnt = crow(ep, C_XCNT), *displ = crow(ep, C_XDISPL);
    for (int32_t r = 0; r < R; r++) {
        cnt[r] = M * K;
        displ[r] = r * M * K;
    }
    epx_status st =
        epx_comm_alltoallv(ep->comm, csend, cnt, displ, crecv, cnt, displ, g->yrow, err);
    if (st != EPX_OK) {
        epxi_error_prefix(err, "EP low-latency combine");
        return st;
    }
    ep->last_combine_bytes = back * (int64_t)g->yrow;
    const float *w = WS(ep, weights, float);
    const int32_t *slots = WS(ep, slots, int32_t);
    const unsigned char *rows[EPX_MOE_MAX_TOP_K];
    for (int64_t t = 0; t < T && out != NULL; t++) { /* out NULL: the exchange only */
        for (int32_t k = 0; k < K; k++) {
            int32_t s = slots[t * K + k];
            rows[k] = s < 0 ? NULL : crecv + (size_t)((s / spr) * M * K + t * K + k) * g->yrow;
        }
        combine_token(g, rows, w + t * K, K, out + t * g->H);
    }
    return EPX_OK;
}

epx_status epx_ep_combine(epx_ep *ep, float *out, epx_error *err) {
    if (ep == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "EP combine needs a handle");
    if (!ep->dispatched)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "EP combine without a successful dispatch before it");
    epx_status st = ep->g.low_latency ? combine_ll(ep, out, err) : combine_normal(ep, out, err);
    if (st == EPX_OK) ep->dispatched = false;
    /* Without out this rank's result has nowhere to go, but the exchange
     * above still ran: the other ranks' tokens need this rank's expert
     * outputs, and returning before it left them waiting to the timeout
     * and the communicator unusable. */
    if (st == EPX_OK && ep->T > 0 && out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "EP combine of %lld tokens needs out (this rank's result is dropped; "
                         "the other ranks got theirs)",
                         (long long)ep->T);
    return st;
}

epx_status epx_ep_identity_experts(epx_ep *ep, const epx_ep_recv *recv, epx_error *err) {
    if (ep == NULL || recv == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "identity experts need the handle and a recv view");
    const epxi_ep_geom *g = &ep->g;
    const int xbf = g->cfg.x_dtype == EPX_DTYPE_BF16, ybf = g->cfg.y_dtype == EPX_DTYPE_BF16;
    unsigned char *y = recv->y;
    for (int64_t e = 0; e < recv->num_entries; e++) {
        const unsigned char *src =
            (const unsigned char *)recv->x + (size_t)recv->entry_token[e] * recv->x_stride;
        unsigned char *dst = y + (size_t)e * g->yrow;
        if (xbf == ybf)
            memcpy(dst, src, g->yrow);
        else
            for (int64_t h = 0; h < g->H; h++)
                epxi_row_store(dst, h, epxi_row_load(src, h, xbf), ybf);
    }
    return EPX_OK;
}

const epxi_ep_geom *epxi_ep_geom_of(const epx_ep *ep) { return &ep->g; }

void epx_ep_last_bytes(const epx_ep *ep, int64_t *dispatch_bytes, int64_t *combine_bytes) {
    if (dispatch_bytes) *dispatch_bytes = ep ? ep->last_dispatch_bytes : 0;
    if (combine_bytes) *combine_bytes = ep ? ep->last_combine_bytes : 0;
}
