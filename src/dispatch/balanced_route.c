/*
 * balanced_route.c - the token side of balanced dispatch (epx/dispatch.h,
 * part 4): counting a batch's tokens per expert, and routing topk_ids to
 * slots by integer replica counts (each expert's pairs, in (t, k) order,
 * fill its replica columns in order), and the one-call form.
 */
#include <string.h>

#include "balanced_internal.h"

static epx_status check_ids_shape(int64_t num_tokens, int32_t topk, const char *fn,
                                  epx_error *err) {
    if (num_tokens < 0 || num_tokens > INT32_MAX || topk < 1 ||
        num_tokens * (int64_t)topk > INT32_MAX)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "%s: topk_ids is [%lld][%d]: T >= 0, K >= 1 and T*K must stay below "
                         "2^31",
                         fn, (long long)num_tokens, topk);
    return EPX_OK;
}

epx_status epx_dispatch_count_ids(const int32_t *topk_ids, int64_t num_tokens, int32_t topk,
                                  int32_t num_experts, int64_t *counts, epx_error *err) {
    EPX_TRY(check_ids_shape(num_tokens, topk, "epx_dispatch_count_ids", err));
    if (num_experts < 1)
        return epxi_fail(err, EPX_ERR_SHAPE, "epx_dispatch_count_ids: E = %d must be >= 1",
                         num_experts);
    if (counts == NULL || (num_tokens > 0 && topk_ids == NULL))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_dispatch_count_ids: topk_ids and counts are required");
    /* First (an error leaves counts as they were): the ids' range by a
     * minimum and maximum, a loop the compiler vectorises (an early exit
     * per id does not); only a batch out of range is walked for its first
     * offender. */
    const int64_t n = num_tokens * topk;
    int32_t lo = -1, hi = -1;
    for (int64_t i = 0; i < n; i++) {
        lo = topk_ids[i] < lo ? topk_ids[i] : lo;
        hi = topk_ids[i] > hi ? topk_ids[i] : hi;
    }
    if (lo < -1 || hi >= num_experts)
        for (int64_t i = 0; i < n; i++)
            if (topk_ids[i] < -1 || topk_ids[i] >= num_experts)
                return epxi_fail(err, EPX_ERR_INVALID_ARG,
                                 "topk_ids[%lld][%d] = %d is outside [-1, %d) (E)",
                                 (long long)(i / topk), (int)(i % topk), topk_ids[i], num_experts);
    memset(counts, 0, (size_t)num_experts * sizeof *counts);
    for (int64_t i = 0; i < n; i++)
        if (topk_ids[i] >= 0) counts[topk_ids[i]]++;
    return EPX_OK;
}

/* map_ids once b->cnt holds topk_ids' counts (counted and checked by
 * epx_dispatch_count_ids): the one-call form counts them once, for the
 * solve and the mapping both (two passes over the ids fewer). */
static epx_status map_counted(epx_balancer *b, const int32_t *replicas, const int32_t *num_valid,
                              const int64_t *replica_counts, const int32_t *topk_ids,
                              int64_t num_tokens, int32_t topk, int32_t *phys, epx_error *err) {
    int32_t E = b->E, W = b->W;
    for (int32_t e = 0; e < E; e++) {
        int32_t n = num_valid[e];
        if (n < 1 || n > W)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "num_valid[%d] = %d is outside [1, %d] (the width)", e, n, W);
        const int64_t *rc = replica_counts + (size_t)e * (size_t)W;
        int64_t sum = 0;
        for (int32_t j = 0; j < n; j++) {
            int32_t s = replicas[(size_t)e * (size_t)W + (size_t)j];
            if (s < 0 || s >= b->P)
                return epxi_fail(err, EPX_ERR_INVALID_MAP,
                                 "replicas[%d][%d] = %d is outside [0, %d) (P)", e, j, s, b->P);
            if (rc[j] < 0)
                return epxi_fail(err, EPX_ERR_INVALID_ARG, "replica_counts[%d][%d] = %lld < 0", e,
                                 j, (long long)rc[j]);
            /* before adding: a huge count overflowed the sum (int64, UB) */
            if (rc[j] > b->cnt[e] - sum)
                return epxi_fail(err, EPX_ERR_INVALID_ARG,
                                 "replica_counts[%d][%d] = %lld takes expert %d past the %lld "
                                 "tokens topk_ids hold of it: the counts are for another batch",
                                 e, j, (long long)rc[j], e, (long long)b->cnt[e]);
            sum += rc[j];
        }
        if (sum != b->cnt[e])
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "replica_counts of expert %d sum to %lld but topk_ids hold %lld of "
                             "its tokens: the counts are for another batch",
                             e, (long long)sum, (long long)b->cnt[e]);
        b->col[e] = 0;
        b->left[e] = rc[0];
    }
    for (int64_t i = 0; i < num_tokens * topk; i++) {
        int32_t e = topk_ids[i];
        if (e < 0) {
            phys[i] = -1;
            continue;
        }
        const int64_t *rc = replica_counts + (size_t)e * (size_t)W;
        while (b->left[e] == 0) b->left[e] = rc[++b->col[e]];
        b->left[e]--;
        phys[i] = replicas[(size_t)e * (size_t)W + (size_t)b->col[e]];
    }
    return EPX_OK;
}

epx_status epx_dispatch_balanced_map_ids(epx_balancer *b, const int32_t *replicas,
                                         const int32_t *num_valid, const int64_t *replica_counts,
                                         const int32_t *topk_ids, int64_t num_tokens, int32_t topk,
                                         int32_t *phys, epx_error *err) {
    if (b == NULL || replicas == NULL || num_valid == NULL || replica_counts == NULL ||
        (num_tokens > 0 && (topk_ids == NULL || phys == NULL)))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_dispatch_balanced_map_ids: the balancer, replicas, num_valid, "
                         "replica_counts, topk_ids and phys are required");
    EPX_TRY(check_ids_shape(num_tokens, topk, "epx_dispatch_balanced_map_ids", err));
    EPX_TRY(epx_dispatch_count_ids(topk_ids, num_tokens, topk, b->E, b->cnt, err));
    return map_counted(b, replicas, num_valid, replica_counts, topk_ids, num_tokens, topk, phys,
                       err);
}

epx_status epx_dispatch_balanced_topk(epx_balancer *b, const int32_t *replicas,
                                      const int32_t *num_valid, const int32_t *topk_ids,
                                      int64_t num_tokens, int32_t topk, int32_t *phys,
                                      epx_balanced_out *out, epx_error *err) {
    if (b == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "epx_dispatch_balanced_topk: b is NULL");
    EPX_TRY(check_ids_shape(num_tokens, topk, "epx_dispatch_balanced_topk", err));
    if (num_tokens > 0 && (topk_ids == NULL || phys == NULL))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_dispatch_balanced_topk: topk_ids and phys are required");
    epx_balanced_out mine = {0};
    if (out != NULL) mine = *out;
    if (mine.replica_counts == NULL) mine.replica_counts = b->rc;
    EPX_TRY(epx_dispatch_count_ids(topk_ids, num_tokens, topk, b->E, b->cnt, err));
    /* solve only reads b->cnt, which the mapping then uses as counted */
    EPX_TRY(epx_dispatch_balanced_solve(b, replicas, num_valid, b->cnt, &mine, err));
    if (out != NULL) {
        int64_t *rc = out->replica_counts;
        *out = mine;
        out->replica_counts = rc;
    }
    return map_counted(b, replicas, num_valid, mine.replica_counts, topk_ids, num_tokens, topk,
                       phys, err);
}
