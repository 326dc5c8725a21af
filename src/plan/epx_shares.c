/*
 * epx_shares.c - per-replica dispatch weights: for a fixed map, the share of
 * each expert's tokens that each of its replicas should take so that the
 * most loaded GPU carries as little as possible.
 *
 * The loads a map allows form a base polytope (each expert's load may go to
 * any GPU that holds it), and on such a set one point minimises every
 * symmetric convex function of the GPU loads at once: the min-norm point is
 * also the min-max one, and the most even one below the max. So the shares
 * minimise the sum of squared GPU loads, by block coordinate descent: take
 * one multi-replica expert at a time, lift its load off its GPUs and pour it
 * back by water-filling (the lightest of its GPUs first, to a common level).
 * Each step is exact for its block and never raises the max over the GPUs
 * it touches, so the max is non-increasing from the even split on; sweeps
 * stop when no expert moves more than a 1e-12 share of the mean load, or at
 * the caller's cap. Experts with one replica are fixed and only shift the
 * base the others pour onto.
 */
#include "epx_algo.h"

#include <math.h>
#include <string.h>

struct epxi_shares_ws {
    int32_t *cnt;   /* [E] replicas per expert */
    int32_t *ridx;  /* [E] range of a multi-replica expert, -1 for the others */
    int32_t *multi; /* [E] the multi-replica experts with a load */
    int32_t *start; /* [E] first entry of each range in gpu/mult/x */
    int32_t *ndist; /* [E] distinct GPUs in each range */
    int32_t *gpu;   /* [P] distinct GPUs of each multi-replica expert */
    int32_t *mult;  /* [P] replicas of the expert on that GPU */
    double *x;      /* [P] load the expert puts on that GPU */
    double *b;      /* [P] scratch: base loads, sorted */
    double *load;   /* [G] */
};

epx_status epxi_shares_ws_create(int32_t E, int32_t P, int32_t G, epxi_shares_ws **out,
                                 epx_error *err) {
    epxi_shares_ws *ws = epxi_calloc(1, sizeof *ws, "replica share workspace", err);
    if (ws == NULL) return EPX_ERR_NOMEM;
    size_t e = (size_t)E, p = (size_t)P, g = (size_t)G;
    ws->cnt = epxi_calloc(e, sizeof(int32_t), "replica share counts", err);
    ws->ridx = epxi_calloc(e, sizeof(int32_t), "replica share ranges", err);
    ws->multi = epxi_calloc(e, sizeof(int32_t), "replica share experts", err);
    ws->start = epxi_calloc(e, sizeof(int32_t), "replica share ranges", err);
    ws->ndist = epxi_calloc(e, sizeof(int32_t), "replica share ranges", err);
    ws->gpu = epxi_calloc(p, sizeof(int32_t), "replica share GPUs", err);
    ws->mult = epxi_calloc(p, sizeof(int32_t), "replica share multiplicities", err);
    ws->x = epxi_calloc(p, sizeof(double), "replica share loads", err);
    ws->b = epxi_calloc(p, sizeof(double), "replica share scratch", err);
    ws->load = epxi_calloc(g, sizeof(double), "replica share GPU loads", err);
    if (!ws->cnt || !ws->ridx || !ws->multi || !ws->start || !ws->ndist || !ws->gpu || !ws->mult ||
        !ws->x || !ws->b || !ws->load) {
        epxi_shares_ws_destroy(ws);
        return EPX_ERR_NOMEM;
    }
    *out = ws;
    return EPX_OK;
}

void epxi_shares_ws_destroy(epxi_shares_ws *ws) {
    if (ws == NULL) return;
    free(ws->cnt), free(ws->ridx), free(ws->multi), free(ws->start), free(ws->ndist);
    free(ws->gpu), free(ws->mult), free(ws->x), free(ws->b), free(ws->load);
    free(ws);
}

/* Pour `total` onto bases b[0..k) (sorted ascending): the level lambda with
 * sum max(0, lambda - b_j) = total. */
static double water_level(const double *b, int32_t k, double total) {
    double sum = 0.0;
    for (int32_t t = 0; t < k; t++) {
        sum += b[t];
        double l = (total + sum) / (t + 1);
        if (t + 1 == k || l <= b[t + 1]) return l;
    }
    return b[k - 1]; /* not reached: the last t always returns */
}

static void sort_small(double *v, int32_t n) {
    for (int32_t i = 1; i < n; i++) { /* insertion sort: n is a replica count */
        double t = v[i];
        int32_t j = i;
        while (j > 0 && v[j - 1] > t) v[j] = v[j - 1], j--;
        v[j] = t;
    }
}

double epxi_shares_compute(epxi_shares_ws *ws, const int32_t *map, const double *w, int32_t E,
                           int32_t P, int32_t G, int32_t max_sweeps, double *share) {
    const int32_t K = P / G;
    memset(ws->cnt, 0, (size_t)E * sizeof *ws->cnt);
    for (int32_t p = 0; p < P; p++) ws->cnt[map[p]]++;
    double total = 0.0;
    for (int32_t g = 0; g < G; g++) {
        double l = 0.0;
        for (int32_t k = 0; k < K; k++) {
            int32_t e = map[g * K + k];
            l += w[e] / ws->cnt[e];
        }
        ws->load[g] = l;
        total += l;
    }
    /* One range per multi-replica expert with a load: its distinct GPUs. A
     * GPU's slots are contiguous, so a second replica of an expert on the
     * same GPU always follows the last GPU recorded for it. */
    int32_t nm = 0, pos = 0;
    for (int32_t e = 0; e < E; e++) {
        ws->ridx[e] = -1;
        if (ws->cnt[e] >= 2 && w[e] > 0.0) {
            ws->ridx[e] = nm;
            ws->multi[nm] = e;
            ws->start[nm] = pos;
            ws->ndist[nm] = 0;
            pos += ws->cnt[e];
            nm++;
        }
    }
    for (int32_t p = 0; p < P; p++) {
        int32_t i = ws->ridx[map[p]], g = p / K;
        if (i < 0) continue;
        int32_t at = ws->start[i], n = ws->ndist[i];
        if (n > 0 && ws->gpu[at + n - 1] == g) {
            ws->mult[at + n - 1]++;
        } else {
            ws->gpu[at + n] = g;
            ws->mult[at + n] = 1;
            ws->ndist[i] = n + 1;
        }
    }
    for (int32_t i = 0; i < nm; i++) {
        int32_t e = ws->multi[i];
        for (int32_t j = 0; j < ws->ndist[i]; j++) {
            int32_t at = ws->start[i] + j;
            ws->x[at] = w[e] * ws->mult[at] / ws->cnt[e];
        }
    }
    /* Coordinate descent: water-fill one expert at a time. */
    const double tol = 1e-9 * (total / G); /* a billionth of the mean GPU load */
    for (int32_t sweep = 0; sweep < max_sweeps; sweep++) {
        double moved = 0.0;
        for (int32_t i = 0; i < nm; i++) {
            const int32_t e = ws->multi[i], at = ws->start[i], k = ws->ndist[i];
            if (k < 2) continue; /* all replicas on one GPU: nothing to split */
            for (int32_t j = 0; j < k; j++) ws->b[j] = ws->load[ws->gpu[at + j]] - ws->x[at + j];
            sort_small(ws->b, k);
            const double level = water_level(ws->b, k, w[e]);
            for (int32_t j = 0; j < k; j++) {
                int32_t g = ws->gpu[at + j];
                double base = ws->load[g] - ws->x[at + j];
                double nx = level > base ? level - base : 0.0;
                double d = fabs(nx - ws->x[at + j]);
                if (d > moved) moved = d;
                ws->x[at + j] = nx;
                ws->load[g] = base + nx;
            }
        }
        if (moved <= tol) break;
    }
    /* Shares per slot, each GPU's part of the expert over what the expert
     * put down in all (b, P >= E entries, holds those totals). Not over
     * w[e]: a load far below the GPU loads it is poured onto (an expert
     * that is nearly idle under a recency estimate, a sparse per-pass row)
     * can round to nothing on every GPU, and 0 / 0 was the NaN that once
     * reached epx_plan_compute's share check. Such an expert, with nothing
     * left to split, keeps the even split. The loads are then recomputed
     * from the shares, exactly. */
    for (int32_t i = 0; i < nm; i++) {
        double put = 0.0;
        for (int32_t j = 0; j < ws->ndist[i]; j++) put += ws->x[ws->start[i] + j];
        ws->b[i] = put;
    }
    for (int32_t p = 0; p < P; p++) {
        int32_t e = map[p], i = ws->ridx[e];
        if (i < 0 || !(ws->b[i] > 0.0) || !isfinite(ws->b[i])) {
            share[p] = 1.0 / ws->cnt[e];
            continue;
        }
        int32_t g = p / K, at = ws->start[i], j = 0;
        while (ws->gpu[at + j] != g) j++;
        share[p] = ws->x[at + j] / (ws->b[i] * ws->mult[at + j]);
    }
    return epxi_layer_gpu_loads(map, w, share, NULL, NULL, 0, P, G, NULL, ws->load);
}

/* The public re-fit: the same water-filling, one layer at a time, over a
 * layout in service (issue 16: re-fit every window, re-plan less often). */
epx_status epx_plan_refit_shares(const epx_layout *layout, const double *load, double *share,
                                 epx_error *err) {
    if (layout == NULL || load == NULL || share == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    const epx_shape *s = epx_layout_shape(layout);
    const int32_t L = s->num_layers, E = s->num_logical_experts;
    const int32_t P = s->num_physical_experts, G = s->num_gpus;
    for (int32_t l = 0; l < L; l++)
        for (int32_t e = 0; e < E; e++) {
            const double x = load[(size_t)l * (size_t)E + (size_t)e];
            if (!(x >= 0.0) || !isfinite(x))
                return epxi_fail(err, EPX_ERR_INVALID_ARG,
                                 "load of layer %d, expert %d is %g: loads must be finite and "
                                 ">= 0",
                                 l, e, x);
        }
    epxi_shares_ws *ws = NULL;
    EPX_TRY(epxi_shares_ws_create(E, P, G, &ws, err));
    const int32_t *map = epx_layout_physical_to_logical(layout);
    for (int32_t l = 0; l < L; l++)
        (void)epxi_shares_compute(ws, map + (size_t)l * (size_t)P, load + (size_t)l * (size_t)E, E,
                                  P, G, EPXI_REFIT_SWEEPS, share + (size_t)l * (size_t)P);
    epxi_shares_ws_destroy(ws);
    return EPX_OK;
}
