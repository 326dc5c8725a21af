/*
 * relabel.c - put a new layout's experts into the slots that already hold
 * them.
 *
 * A placement algorithm decides which experts each GPU holds; the order of
 * the slots inside a GPU is arbitrary (DeepSeek's EPLB emits them sorted by
 * its packing, not by where they sat before). Reordering them inside a GPU
 * changes no GPU's load and so no balance, but every slot that ends up
 * holding the expert it held before is a slot whose weights need not move.
 *
 * Finding the best order is an assignment problem per GPU: a maximum
 * matching between old slots and new entries, an edge wherever the expert is
 * the same. Because edges join only equal labels the graph splits into one
 * complete bipartite part per expert, and the maximum is
 * sum_e min(old count of e, new count of e): sorting both sides by expert
 * and walking them together attains it. tests/test_migrate_plan.c checks it
 * against augmenting-path matching (Kuhn's algorithm) on random layouts.
 */
#include "constrain.h"

#include <string.h>

typedef struct {
    int32_t expert;
    int32_t slot; /* local index on the GPU */
} tagged;

static int tagged_cmp(const void *a, const void *b) {
    const tagged *x = a, *y = b;
    if (x->expert != y->expert) return x->expert < y->expert ? -1 : 1;
    return (x->slot > y->slot) - (x->slot < y->slot);
}

/* One GPU: spg old and new entries; writes out[spg] and perm[spg] (local
 * indices). taken[spg] marks old slots already given their expert. */
static void relabel_gpu(size_t n, const int32_t *old, const int32_t *neu, int32_t *out,
                        int32_t *perm, tagged *a, tagged *b, uint8_t *taken, uint8_t *placed) {
    const int32_t spg = (int32_t)n;
    for (int32_t i = 0; i < spg; i++) {
        a[i] = (tagged){old[i], i};
        b[i] = (tagged){neu[i], i};
    }
    qsort(a, n, sizeof *a, tagged_cmp);
    qsort(b, n, sizeof *b, tagged_cmp);
    memset(taken, 0, n);
    memset(placed, 0, n);
    /* Walk both sorted lists: equal experts pair up, lowest old slot first. */
    for (int32_t i = 0, j = 0; i < spg && j < spg;) {
        if (a[i].expert < b[j].expert) {
            i++;
        } else if (a[i].expert > b[j].expert) {
            j++;
        } else {
            out[a[i].slot] = b[j].expert;
            perm[a[i].slot] = b[j].slot;
            taken[a[i].slot] = 1;
            placed[b[j].slot] = 1;
            i++, j++;
        }
    }
    /* The unmatched new entries, in their original order, fill the free slots
     * in ascending order. */
    int32_t free_slot = 0;
    for (int32_t j = 0; j < spg; j++) {
        if (placed[j]) continue;
        while (taken[free_slot]) free_slot++;
        out[free_slot] = neu[j];
        perm[free_slot] = j;
        taken[free_slot] = 1;
    }
}

epx_status epxi_relabel_map(const epx_shape *shape, const int32_t *old, int32_t *map, int32_t *perm,
                            epx_error *err) {
    const int32_t P = shape->num_physical_experts, G = shape->num_gpus;
    const int32_t spg = P / G;
    const size_t n = (size_t)(uint32_t)spg; /* spg >= 1 for a valid shape */
    epx_status st = EPX_OK;
    tagged *a = epxi_calloc(2 * n, sizeof *a, "relabel scratch", err);
    int32_t *tmp = a ? epxi_calloc(2 * n, sizeof *tmp, "relabel scratch", err) : NULL;
    uint8_t *marks = tmp ? epxi_calloc(2, n, "relabel scratch", err) : NULL;
    if (marks == NULL) {
        st = EPX_ERR_NOMEM;
        goto done;
    }
    for (int32_t l = 0; l < shape->num_layers; l++) {
        for (int32_t g = 0; g < G; g++) {
            size_t o = (size_t)l * (size_t)P + (size_t)g * n;
            int32_t *out = tmp, *lperm = tmp + n;
            relabel_gpu(n, old + o, map + o, out, lperm, a, a + n, marks, marks + n);
            memcpy(map + o, out, n * sizeof *out);
            if (perm != NULL)
                for (size_t i = 0; i < n; i++) perm[o + i] = (int32_t)((size_t)g * n) + lperm[i];
        }
    }
done:
    free(a);
    free(tmp);
    free(marks);
    return st;
}

epx_status epxi_count_live(const epx_shape *shape, const uint8_t *failed, int32_t *num_live,
                           epx_error *err) {
    int32_t live = shape->num_gpus;
    if (failed != NULL)
        for (int32_t g = 0; g < shape->num_gpus; g++) live -= failed[g] != 0;
    if (live == 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "all %d GPUs are marked failed: at least one must survive to hold the "
                         "experts",
                         shape->num_gpus);
    *num_live = live;
    return EPX_OK;
}

double epxi_layer_balance(const epx_shape *shape, const int32_t *row, const double *load,
                          const uint8_t *failed, double *scratch) {
    const int32_t G = shape->num_gpus;
    double *gpu = scratch;
    int32_t *cnt = (int32_t *)(scratch + G); /* E ints fit in E doubles */
    (void)epxi_layer_gpu_loads(row, load, NULL, NULL, failed, shape->num_logical_experts,
                               shape->num_physical_experts, G, cnt, gpu);
    const epxi_gpu_summary s = epxi_gpu_summarize(gpu, G, failed);
    return epxi_balancedness(&s);
}

/* ---- GPUs as a whole ---------------------------------------------------------
 * A plan's GPU numbering is as arbitrary as its slot order: the planner (or
 * the survivors' plan after a failure, spread onto the live GPUs in order)
 * could hand any GPU's set of experts to any other GPU of the same node at
 * no change in balance. Which GPU takes which set decides how many slots
 * stay put, so it is an assignment problem: maximise, over the one-to-one
 * maps of planned sets to GPUs, the sum of the slots relabel_gpu keeps
 * (sum_e min(old count, new count) per pair). The Hungarian method solves
 * it exactly in O(n^3) for the n GPUs of a group; among assignments that
 * keep as many slots, the one leaving the most GPUs their planned set wins
 * (so a plan that already fits is left as it is). tests/test_plan_elastic.c
 * checks the kept slots against every permutation on small shapes. */

/* Minimum-cost perfect assignment of an n x n cost matrix (row i to column
 * col[i]); the potentials method (Kuhn-Munkres, shortest augmenting paths).
 * u, v, minv: n + 1 int64; p, way: n + 1 int32; used: n + 1 bytes. */
static void hungarian(int32_t n, const int64_t *cost, int32_t *col, int64_t *u, int64_t *v,
                      int64_t *minv, int32_t *p, int32_t *way, uint8_t *used) {
    const int64_t inf = INT64_MAX / 4;
    for (int32_t j = 0; j <= n; j++) u[j] = v[j] = 0, p[j] = 0, way[j] = 0;
    for (int32_t i = 1; i <= n; i++) {
        p[0] = i;
        int32_t j0 = 0;
        for (int32_t j = 0; j <= n; j++) minv[j] = inf, used[j] = 0;
        do {
            used[j0] = 1;
            const int32_t i0 = p[j0];
            int64_t delta = inf;
            int32_t j1 = 0;
            for (int32_t j = 1; j <= n; j++) {
                if (used[j]) continue;
                const int64_t cur =
                    cost[(size_t)(i0 - 1) * (size_t)n + (size_t)(j - 1)] - u[i0] - v[j];
                if (cur < minv[j]) minv[j] = cur, way[j] = j0;
                if (minv[j] < delta) delta = minv[j], j1 = j;
            }
            for (int32_t j = 0; j <= n; j++)
                if (used[j])
                    u[p[j]] += delta, v[j] -= delta;
                else
                    minv[j] -= delta;
            j0 = j1;
        } while (p[j0] != 0);
        do {
            const int32_t j1 = way[j0];
            p[j0] = p[j1];
            j0 = j1;
        } while (j0 != 0);
    }
    for (int32_t j = 1; j <= n; j++) col[p[j] - 1] = j - 1;
}

epx_status epxi_match_gpus(const epx_shape *shape, const int32_t *old, const int32_t *group,
                           int32_t *map, double *share, epx_error *err) {
    const int32_t P = shape->num_physical_experts, G = shape->num_gpus,
                  E = shape->num_logical_experts;
    const size_t spg = (size_t)(P / G), ug = (size_t)G;
    epx_status st = EPX_OK;
    int32_t *ibuf = epxi_calloc((size_t)E + 5 * ug + 3, sizeof *ibuf, "GPU matching", err);
    int64_t *lbuf =
        ibuf ? epxi_calloc(ug * ug + 3 * (ug + 1), sizeof *lbuf, "GPU matching", err) : NULL;
    uint8_t *used = lbuf ? epxi_calloc(ug + 1 + spg, 1, "GPU matching", err) : NULL;
    int32_t *mrow = used ? epxi_calloc(spg * ug, sizeof *mrow, "GPU matching", err) : NULL;
    double *srow = mrow && share ? epxi_calloc(spg * ug, sizeof *srow, "GPU matching", err) : NULL;
    if (mrow == NULL || (share != NULL && srow == NULL)) {
        st = EPX_ERR_NOMEM;
        goto done;
    }
    int32_t *cnt = ibuf, *members = cnt + E, *col = members + G, *p = col + G, *way = p + G + 1;
    uint8_t *taken = used + ug + 1;
    int64_t *cost = lbuf, *u = cost + ug * ug, *v = u + ug + 1, *minv = v + ug + 1;
    for (int32_t grp = 0; grp < G; grp++) {
        int32_t n = 0;
        for (int32_t g = 0; g < G; g++)
            if (group[g] == grp) members[n++] = g;
        if (n < 2) continue;
        for (int32_t l = 0; l < shape->num_layers; l++) {
            const size_t o = (size_t)l * (size_t)P;
            /* cost[i][j] = -(slots kept if GPU members[j] takes planned set i),
             * scaled so that a tie prefers the planned GPU itself */
            for (int32_t j = 0; j < n; j++) {
                const int32_t *orow = old + o + (size_t)members[j] * spg;
                for (size_t s = 0; s < spg; s++) cnt[orow[s]]++;
                for (int32_t i = 0; i < n; i++) {
                    const int32_t *nrow = map + o + (size_t)members[i] * spg;
                    int64_t kept = 0;
                    for (size_t s = 0; s < spg; s++) {
                        taken[s] = cnt[nrow[s]] > 0;
                        cnt[nrow[s]] -= taken[s];
                        kept += taken[s];
                    }
                    for (size_t s = 0; s < spg; s++) cnt[nrow[s]] += taken[s];
                    cost[(size_t)i * (size_t)n + (size_t)j] = -(kept * (n + 1) + (i == j));
                }
                for (size_t s = 0; s < spg; s++) cnt[orow[s]] = 0;
            }
            hungarian(n, cost, col, u, v, minv, p, way, used);
            /* planned set i goes to GPU members[col[i]] */
            for (int32_t i = 0; i < n; i++) {
                memcpy(mrow + (size_t)col[i] * spg, map + o + (size_t)members[i] * spg,
                       spg * sizeof *mrow);
                if (share != NULL)
                    memcpy(srow + (size_t)col[i] * spg, share + o + (size_t)members[i] * spg,
                           spg * sizeof *srow);
            }
            for (int32_t j = 0; j < n; j++) {
                memcpy(map + o + (size_t)members[j] * spg, mrow + (size_t)j * spg,
                       spg * sizeof *mrow);
                if (share != NULL)
                    memcpy(share + o + (size_t)members[j] * spg, srow + (size_t)j * spg,
                           spg * sizeof *srow);
            }
        }
    }
done:
    free(ibuf);
    free(lbuf);
    free(used);
    free(mrow);
    free(srow);
    return st;
}
