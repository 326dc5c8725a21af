/*
 * balanced.c - exact per-batch balanced routing (epx/dispatch.h, part 4).
 *
 * The problem. Expert e has c_e tokens and replicas on a set of GPUs N(e)
 * (several replicas on one GPU count as one edge and split its share
 * evenly). A split is a flow x_eg >= 0 with sum_g x_eg = c_e; GPU g's load
 * is L_g = sum_e x_eg. SGLang 0.5.23's LP minimises max_g L_g. By max-flow /
 * min-cut (Hall's condition), loads <= lambda are feasible iff every set S
 * of experts fits its neighbourhood: C(S) <= lambda |N(S)|, so the optimum
 * is lambda* = max_S C(S) / |N(S)|, a fraction with denominator <= G.
 *
 * The algorithm (Dinkelbach's iteration for that max ratio, one max-flow per
 * step, exact in integers). Start with S = all experts, lambda = a / b with
 * a = C(S), b = |N(S)|. Test lambda with a max-flow on s -> e (capacity
 * b c_e), e -> g (unbounded, g in N(e)), g -> t (capacity a): everything
 * scaled by b, so capacities stay integers. If the flow carries all b C,
 * lambda is feasible, and since S attains it, lambda = lambda*. If not, the
 * min cut's source side is a set S' with C(S') b > a |N(S')|: set
 * lambda = C(S') / |N(S')| and test again. |N(S)| falls at every step, so
 * there are at most G + 1 max-flows.
 *
 * The subset solve (components of at most sub_max GPUs, default 10: every
 * component of the benchmarks' 8-GPU nodes). The same optimum, read off all
 * 2^n subsets V of the component's n GPUs at once: d[V] = the tokens that
 * must land inside V (bases of V's GPUs, experts with every GPU in V), a
 * sum over subsets. By Hall's condition loads <= lambda are feasible iff
 * d[V] <= lambda |V| for every V, so lambda* = max d[V] / |V|, and the
 * union of the maximisers is the largest tight set (the maximisers of a
 * supermodular minus a modular function are closed under union). Later
 * levels are the same over supersets of the GPUs fixed so far, X:
 * (d[V] - d[X]) / |V \ X|. Within a level a greedy splits its experts in
 * order, keeping every subset's slack s[W] = lambda |W| - load confined to
 * W nonnegative (Hall again, so the rest stays feasible): an expert puts
 * on its next GPU g the most it can, min(what is left, min s[W] over W
 * holding g but not all its other GPUs), which takes that much from those
 * slacks and the remainder from the slacks of the W holding its other GPUs
 * but not g. Every step is a reduction over subsets: the kernel runs them
 * on a warp's 32 lanes, where the max-flows below run on one thread.
 *
 * Water-filling on top (the lexicographic optimum). At lambda* the experts
 * that cannot reach the sink in the residual graph form the largest tight
 * set T (C(T) = lambda* |N(T)|); their GPUs N(T) are full at lambda* and
 * take flow only from T, and T sends nothing elsewhere. Fix T and N(T) at
 * that level, drop them, and solve the rest the same way (its optimum is
 * lower). The levels give every GPU its load in the unique lexicographically
 * minimal load vector; at most G levels.
 *
 * Rounding. (A subset-solved component rounds each level over its subsets
 * instead, epxi_bal_subset_round: the same bounds, another valid choice.)
 * Each fixed x_eg = f / b is rounded to an integer n_eg in
 * {floor x_eg, ceil x_eg} with sum_g n_eg = c_e and every GPU's integer load
 * in {floor L_g, ceil L_g}: a feasible flow with those lower and upper
 * bounds exists (x is one) and a max-flow finds an integral one (the usual
 * reduction of lower bounds to a super source and sink, s and t merged).
 * A GPU's k replicas of one expert split n_eg as n/k, the first n % k
 * columns taking one more; each stays within one token of its share.
 *
 * Which optimal split. The levels (the GPU loads) are unique, the flows
 * that realise them are not: the result is defined as what
 * balanced_solve.h computes, the one source this file and the CUDA kernel
 * (src/cuda/balanced.cu) share. It folds the experts that sit on one GPU
 * into that GPU's base load and solves the rest component by component,
 * by subsets or max-flows as above, so the kernel runs the same statements
 * (a warp per component). This file checks
 * the inputs, which the kernel trusts, and calls the core in order.
 */
#include <stdlib.h>
#include <string.h>

#include "balanced_internal.h"

void epx_dispatch_balanced_destroy(epx_balancer *b) {
    if (b == NULL) return;
    free(b->mem);
    free(b->owner);
    free(b->cnt);
    free(b->rc);
    free(b->left);
    free(b->col);
    free(b);
}

epx_status epx_dispatch_balanced_create(int32_t num_experts, int32_t width, int32_t num_physical,
                                        int32_t num_gpus, epx_balancer **out, epx_error *err) {
    if (out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "epx_dispatch_balanced_create: out is NULL");
    *out = NULL;
    if (num_experts < 1 || width < 1 || num_physical < 1 || num_gpus < 1 || num_gpus > 4096 ||
        num_physical % num_gpus != 0)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "epx_dispatch_balanced_create: E = %d, W = %d, P = %d, G = %d: all must "
                         "be >= 1, G at most 4096 and P a multiple of G",
                         num_experts, width, num_physical, num_gpus);
    if (num_experts > (1 << 24) || width > (1 << 16) || num_physical > (1 << 24))
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "epx_dispatch_balanced_create: E = %d, W = %d or P = %d is too large",
                         num_experts, width, num_physical);
    /* a list holds each slot once, so W <= P; and E x W, the replica counts'
     * int64 table, within the 1 TiB epx sizes one array at (8.8 TB was asked) */
    if (width > num_physical ||
        (size_t)num_experts * (size_t)width * sizeof(int64_t) > EPXI_MAX_ARRAY_BYTES)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "epx_dispatch_balanced_create: W = %d lists for E = %d experts on P = %d "
                         "slots: W must be at most P, and E x W x 8 bytes at most 1 TiB",
                         width, num_experts, num_physical);
    epx_balancer *b = epxi_calloc(1, sizeof *b, "balancer", err);
    if (b == NULL) return EPX_ERR_NOMEM;
    size_t E = (size_t)num_experts, P = (size_t)num_physical;
    b->E = num_experts;
    b->W = width;
    b->P = num_physical;
    b->G = num_gpus;
    b->per = num_physical / num_gpus;
    epxi_bal_shape(&b->core, num_experts, width, num_physical, num_gpus);
    const char *name = NULL, *bad = NULL, *help = NULL;
    if (epxi_bal_env(&b->core, &name, &bad, &help) != 0) {
        free(b);
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "epx_dispatch_balanced_create: %s = '%s': %s",
                         name, bad, help);
    }
    if ((int64_t)b->core.maxM * (1 + (int64_t)b->core.D) > INT32_MAX / 4) {
        free(b);
        return epxi_fail(err, EPX_ERR_SHAPE, "epx_dispatch_balanced_create: graph too large");
    }
    size_t bytes = epxi_bal_carve(&b->core, NULL);
    b->mem = epxi_calloc(1, bytes, "balancer workspace", err);
    b->owner = epxi_calloc(P, sizeof *b->owner, "balancer slots", err);
    b->cnt = epxi_calloc(E, sizeof *b->cnt, "balancer counts", err);
    b->rc = epxi_calloc(E * (size_t)width, sizeof *b->rc, "balancer counts", err);
    b->left = epxi_calloc(E, sizeof *b->left, "balancer cursors", err);
    b->col = epxi_calloc(E, sizeof *b->col, "balancer cursors", err);
    if (!b->mem || !b->owner || !b->cnt || !b->rc || !b->left || !b->col) {
        epx_dispatch_balanced_destroy(b);
        return EPX_ERR_NOMEM;
    }
    epxi_bal_carve(&b->core, b->mem);
    *out = b;
    return EPX_OK;
}

/* Check the lists and counts (the kernel trusts them); copy the counts. */
static epx_status check_inputs(epx_balancer *b, const int32_t *replicas, const int32_t *num_valid,
                               const int64_t *counts, epx_error *err) {
    int32_t E = b->E, W = b->W, P = b->P;
    for (int32_t p = 0; p < P; p++) b->owner[p] = -1;
    int64_t sum = 0;
    for (int32_t e = 0; e < E; e++) {
        int32_t n = num_valid[e];
        if (n < 1 || n > W)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "num_valid[%d] = %d is outside [1, %d] (the width)", e, n, W);
        int64_t c = counts[e];
        if (c < 0 || c > BAL_MAX_TOTAL - sum)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "counts[%d] = %lld: counts must be >= 0 and sum to at most 2^40", e,
                             (long long)c);
        sum += c;
        b->core.cnt[e] = c;
        for (int32_t j = 0; j < n; j++) {
            int32_t s = replicas[(size_t)e * (size_t)W + (size_t)j];
            if (s < 0 || s >= P)
                return epxi_fail(err, EPX_ERR_INVALID_MAP,
                                 "replicas[%d][%d] = %d is outside [0, %d) (P); num_valid[%d] = "
                                 "%d",
                                 e, j, s, P, e, n);
            if (b->owner[s] >= 0)
                return epxi_fail(err, EPX_ERR_INVALID_MAP,
                                 "slot %d is listed twice: by expert %d and by expert %d (column "
                                 "%d)",
                                 s, b->owner[s], e, j);
            b->owner[s] = e;
        }
    }
    return EPX_OK;
}

static const char *core_failure(int rc) {
    switch (rc) {
    case EPXI_BAL_NO_ADVANCE: return "the ratio search did not advance";
    case EPXI_BAL_NO_TIGHT: return "a level found no consistent tight set";
    case EPXI_BAL_LEVELS: return "more than G levels";
    case EPXI_BAL_ROUNDING: return "the rounding flow fell short";
    case EPXI_BAL_SCALE: return "a level's flows did not divide by its ratio's common factor";
    default: return "more flexible experts than P - E";
    }
}

epx_status epx_dispatch_balanced_solve(epx_balancer *b, const int32_t *replicas,
                                       const int32_t *num_valid, const int64_t *counts,
                                       epx_balanced_out *out, epx_error *err) {
    if (b == NULL || replicas == NULL || num_valid == NULL || counts == NULL || out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_dispatch_balanced_solve: the balancer, replicas, num_valid, counts "
                         "and out are required");
    EPX_TRY(check_inputs(b, replicas, num_valid, counts, err));
    epxi_bal *c = &b->core;
    /* An expert without tokens is not grouped, as in the kernel: its kind
     * is 0 from its count alone and nothing reads its groups (at one token
     * 376 of Kimi-K2.5's 384 experts). */
    for (int32_t e = 0; e < b->E; e++)
        if (c->cnt[e] > 0) epxi_bal_group(c, replicas, num_valid, e);
    int rc = epxi_bal_classify(c);
    if (rc == EPXI_BAL_OK) rc = epxi_bal_solve(c);
    if (rc != EPXI_BAL_OK)
        return epxi_fail(err, EPX_ERR_INTERNAL, "balanced dispatch: %s (level %d)",
                         core_failure(rc), c->levels);
    /* The rows' zeros in bulk, then each expert's listed columns, as the
     * kernel writes them: column by column, the columns past a short list
     * (31 of Kimi-K2.5's 33 at W = P - E + 1) were most of a small batch's
     * solve (bench/RESULTS.md, fourteenth session). */
    const size_t cells = (size_t)b->E * (size_t)b->W;
    if (out->shares) memset(out->shares, 0, cells * sizeof *out->shares);
    if (out->replica_counts) memset(out->replica_counts, 0, cells * sizeof *out->replica_counts);
    if (out->slot_counts) memset(out->slot_counts, 0, (size_t)b->P * sizeof *out->slot_counts);
    for (int32_t e = 0; e < b->E; e++)
        epxi_bal_write_expert(c, replicas, num_valid, e, out->shares, out->replica_counts,
                              out->slot_counts);
    if (out->gpu_load)
        for (int32_t g = 0; g < b->G; g++) out->gpu_load[g] = epxi_bal_gpu_load(c, g);
    int64_t sum[4];
    epxi_bal_summary(c, -1, sum);
    out->max_load_num = sum[0];
    out->max_load_den = sum[1];
    out->max_load_int = sum[2];
    out->num_levels = (int32_t)sum[3];
    return EPX_OK;
}
