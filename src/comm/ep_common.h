/*
 * ep_common.h - the EP data path written once, for the CPU reference
 * (ep.c), the NCCL path (nccl/nccl_ep.cu) and the low-latency GPU engine
 * (gpu/ll_ep.cu): the checked configuration and the sizes derived from it,
 * the record a token travels in, a token's destination ranks, the grouping
 * of received entries by local slot, and the combine formula. Host/device
 * functions are inline and marked for both (numeric.h), so the kernels and
 * the CPU cannot drift. Internal to libepx.
 *
 * A record is one token as one rank receives it:
 *
 *   [ x row (H x dtype) | K x (local slot, weight) | tag ]
 *     0                  meta_off                    tag_off      rec
 *
 * slot -1 where that k goes to another rank. The tag (low-latency mode
 * only) holds the epoch of the batch that wrote the record, so a receiver
 * tells this batch's records from stale ones without clearing buffers.
 *
 * Low-latency layout (per receiving rank): row src * M + t holds token t of
 * rank src (M = max_tokens), so every sender knows where to write without
 * a count exchange; a per-source flag (epoch, T_src) follows the records.
 * Combine row t * K + k on the token's own rank holds (t, k)'s expert
 * output, written by the one rank that ran it.
 */
#ifndef EPX_EP_COMMON_H
#define EPX_EP_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "internal.h"
#include "epx_comm.h"
#include "numeric.h"

typedef struct epxi_ep_meta {
    int32_t slot; /* local slot on the receiver, or -1 */
    float weight;
} epxi_ep_meta;

/* Everything an EP implementation derives from (config, ranks). */
typedef struct epxi_ep_geom {
    epx_ep_config cfg;
    int32_t R, K, H, P, spr, dmax; /* dmax = min(K, R): most destinations of a token */
    int64_t M;                     /* max_tokens */
    bool low_latency, topk_mode;
    size_t xsz, ysz, xrow, yrow, meta_off, tag_off, rec;
    /* Receive bounds: rows (tokens), entries, and rows coming back to a
     * token's rank in combine. Low latency: R * M rows (sparse), R * M * K
     * entries, M * K rows back. */
    int64_t cap_tok, cap_ent, cap_back;
    bool checked_caps; /* the caller set a bound below the worst case */
} epxi_ep_geom;

/* The checked geometry of a host EP handle (ep.c), for the engine room's
 * expert runner. */
EPXI_HIDDEN const epxi_ep_geom *epxi_ep_geom_of(const epx_ep *ep);

/* The one check of an EP config (messages name the value and the fix) and
 * the one derivation of sizes from it. `who` names the caller in messages. */
EPXI_HIDDEN epx_status epxi_ep_geom_init(const epx_ep_config *cfg, int32_t R, epxi_ep_geom *g,
                                         epx_error *err);

/* A workspace carved into parts: part i starts at *at[i], n[i] elements of
 * size[i] bytes, each start aligned to `align`. Sets *total. */
typedef struct epxi_ws_part {
    size_t *at;
    double n, size;
} epxi_ws_part;
EPXI_HIDDEN epx_status epxi_ws_carve(const epxi_ws_part *parts, size_t nparts, size_t align,
                                     size_t *total, const char *who, epx_error *err);

/* Local slots a rank may hold in low-latency mode (the GPU engine keeps a
 * scan of them in shared memory). */
#define EPXI_LL_MAX_LOCAL_SLOTS 2048

/* The low-latency flag word: epoch in the high half, the sender's token
 * count (or EPXI_LL_BAD for a refused batch) in the low half. */
#define EPXI_LL_BAD 0xffffffffu
EPXI_HD uint64_t epxi_ll_flag(uint32_t epoch, uint32_t count) {
    return ((uint64_t)epoch << 32) | count;
}

/* The distinct destination ranks of one token's slots, ascending; returns
 * how many. d has room for K. */
EPXI_HD int32_t epxi_ep_token_dests(const int32_t *slots, int32_t K, int32_t spr, int32_t *d) {
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

/* Write the meta of token (slots s, weights w) for destination rank d. */
EPXI_HD void epxi_ep_write_meta(epxi_ep_meta *m, const int32_t *s, const float *w, int32_t K,
                                int32_t spr, int32_t d) {
    for (int32_t k = 0; k < K; k++) {
        bool here = s[k] >= 0 && s[k] / spr == d;
        m[k].slot = here ? s[k] - d * spr : -1;
        m[k].weight = here ? w[k] : 0.0f;
    }
}

/* The record of row i in a buffer of records, and its parts. */
EPXI_HD unsigned char *epxi_ep_rec(const epxi_ep_geom *g, void *base, int64_t i) {
    return (unsigned char *)base + (size_t)i * g->rec;
}
EPXI_HD const unsigned char *epxi_ep_crec(const epxi_ep_geom *g, const void *base, int64_t i) {
    return (const unsigned char *)base + (size_t)i * g->rec;
}
EPXI_HD const epxi_ep_meta *epxi_ep_meta_of(const epxi_ep_geom *g, const unsigned char *rec) {
    return (const epxi_ep_meta *)(const void *)(rec + g->meta_off);
}
EPXI_HD uint32_t *epxi_ep_tag_of(const epxi_ep_geom *g, unsigned char *rec) {
    return (uint32_t *)(void *)(rec + g->tag_off);
}
EPXI_HD uint32_t epxi_ep_tag(const epxi_ep_geom *g, const unsigned char *rec) {
    uint32_t tag;
    memcpy(&tag, rec + g->tag_off, sizeof tag);
    return tag;
}

/*
 * Group received entries by local slot, in (row, k) order within a slot:
 * count, prefix, place. Rows are `nrows` runs of records: run r has
 * run_rows[r] rows starting at row run_first[r] of `recv` (the normal path
 * has one dense run; low latency one run per source, T_src rows from
 * src * M). With epoch != 0 a row counts only when its tag equals epoch.
 * Writes so[spr + 1], entry_token/entry_weight/entry_pair [entries] (pair =
 * row * K + k) and, when row_entries != NULL, row_entries[row * K + k] = its
 * entry or -1 (for every row of every run). Returns EPX_ERR_COMM when a
 * record names a slot outside [-1, spr) (corrupt, or configs differ).
 * Host only: the kernels group with the same order in ll_ep.cu.
 */
EPXI_HIDDEN epx_status epxi_ep_group_entries(const epxi_ep_geom *g, const unsigned char *recv,
                                             int32_t nruns, const int64_t *run_first,
                                             const int64_t *run_rows, uint32_t epoch, int64_t *so,
                                             int32_t *entry_token, float *entry_weight,
                                             int32_t *entry_pair, int32_t *row_entries,
                                             int64_t *num_entries, epx_error *err);

/*
 * The combine formula, one token: out[h] = sum over k ascending of w[k] *
 * y_k[h] in fp32, y_k = rows[k] (NULL for a k with no expert, skipped).
 * EPX_EP_COMBINE_RANK adds pre-reduced rows with w == NULL.
 */
EPXI_HD float epxi_ep_combine_elem(const unsigned char *const *rows, const float *w, int32_t n,
                                   int64_t h, int bf16) {
    float acc = 0.0f;
    for (int32_t k = 0; k < n; k++) {
        if (rows[k] == NULL) continue;
        float y = epxi_row_load(rows[k], h, bf16);
        acc = w ? epxi_madd(acc, w[k], y) : acc + y;
    }
    return acc;
}

#ifdef __cplusplus
}
#endif
#endif /* EPX_EP_COMMON_H */
