/*
 * moe_case.h - random MoE layers and batches for the EP/TP tests, shared by
 * the single-process tests and the MPI ones (header-only: every function is
 * static inline, so a test that uses part of it gets no unused warnings).
 *
 * A case is a random layer (shape, scoring rule, groups, shared expert,
 * weights), a random placement of its E experts on P = E + redundant slots
 * over R ranks (every expert has a replica), and per rank a random batch
 * whose routing comes from the layer's own router, with a few k set to -1.
 * Every rank builds the same layer from the same seed.
 */
#ifndef EPX_MOE_CASE_H
#define EPX_MOE_CASE_H

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "epx_comm.h"
#include "testutil.h"

typedef struct mc_layer {
    epx_moe_config cfg;
    float *router, *bias, *gate, *up, *down, *sgate, *sup, *sdown;
    epx_moe_weights w;
    int32_t R, P;
    int32_t *p2l;  /* [P] logical expert of each slot */
    int32_t *reps; /* [E][P] slots of each expert, ascending */
    int32_t *nrep; /* [E] */
} mc_layer;

static inline float *mc_randv(tu_rng *r, size_t n, float scale) {
    float *v = malloc((n ? n : 1) * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = (float)((tu_uniform(r) * 2.0 - 1.0) * scale);
    return v;
}

/* A random layer for R ranks. `concentrate`: place experts so that rank 0
 * holds most slots and high ranks may hold only redundant copies (ranks that
 * receive little or nothing). */
static inline void mc_layer_random(tu_rng *r, int32_t R, mc_layer *L) {
    memset(L, 0, sizeof *L);
    epx_moe_config c = EPX_MOE_CONFIG_INIT;
    c.hidden = 1 + (int32_t)tu_below(r, 24);
    c.intermediate = R + (int32_t)tu_below(r, 12);
    c.num_experts = 1 + (int32_t)tu_below(r, 12);
    c.top_k = 1 + (int32_t)tu_below(r, (uint32_t)(c.num_experts < 4 ? c.num_experts : 4));
    c.scoring = (epx_moe_scoring)tu_below(r, 3);
    if (c.scoring == EPX_MOE_SCORING_SIGMOID && c.num_experts % 2 == 0 && tu_below(r, 2)) {
        c.n_group = 2;
        c.topk_group = c.top_k <= c.num_experts / 2 ? 1 + (int32_t)tu_below(r, 2) : 2;
        c.routed_scaling_factor = 2.5f;
    }
    c.norm_topk_prob = (int32_t)tu_below(r, 2);
    c.shared_intermediate = tu_below(r, 2) ? R + (int32_t)tu_below(r, 6) : 0;
    L->cfg = c;
    size_t H = (size_t)c.hidden, I = (size_t)c.intermediate, E = (size_t)c.num_experts;
    size_t Is = (size_t)c.shared_intermediate;
    float sx = 1.0f / sqrtf((float)H), si = 1.0f / sqrtf((float)I);
    L->router = mc_randv(r, E * H, sx);
    L->bias = mc_randv(r, E, 0.1f);
    L->gate = mc_randv(r, E * I * H, sx);
    L->up = mc_randv(r, E * I * H, sx);
    L->down = mc_randv(r, E * H * I, si);
    L->sgate = Is ? mc_randv(r, Is * H, sx) : NULL;
    L->sup = Is ? mc_randv(r, Is * H, sx) : NULL;
    L->sdown = Is ? mc_randv(r, H * Is, 1.0f / sqrtf((float)Is)) : NULL;
    epx_moe_weights w = {L->router, c.scoring == EPX_MOE_SCORING_SIGMOID ? L->bias : NULL,
                         L->gate,   L->up,
                         L->down,   L->sgate,
                         L->sup,    L->sdown};
    L->w = w;
    /* Placement: P a multiple of R, >= E; every expert once, the rest random. */
    int32_t spr = (c.num_experts + R - 1) / R + (int32_t)tu_below(r, 2);
    L->R = R;
    L->P = spr * R;
    L->p2l = malloc((size_t)L->P * sizeof(int32_t));
    for (int32_t p = 0; p < L->P; p++)
        L->p2l[p] = p < c.num_experts ? p : (int32_t)tu_below(r, (uint32_t)c.num_experts);
    for (int32_t p = L->P - 1; p > 0; p--) { /* shuffle */
        int32_t q = (int32_t)tu_below(r, (uint32_t)p + 1), tmp = L->p2l[p];
        L->p2l[p] = L->p2l[q];
        L->p2l[q] = tmp;
    }
    L->reps = malloc(E * (size_t)L->P * sizeof(int32_t));
    L->nrep = calloc(E, sizeof(int32_t));
    for (int32_t p = 0; p < L->P; p++) {
        int32_t e = L->p2l[p];
        L->reps[(size_t)e * L->P + L->nrep[e]++] = p;
    }
}

static inline void mc_layer_free(mc_layer *L) {
    free(L->router);
    free(L->bias);
    free(L->gate);
    free(L->up);
    free(L->down);
    free(L->sgate);
    free(L->sup);
    free(L->sdown);
    free(L->p2l);
    free(L->reps);
    free(L->nrep);
}

/* A batch: x [T][H] random, routed by the layer's router; about one k in
 * eight set to -1 when drop != 0. */
static inline void mc_batch(tu_rng *r, const mc_layer *L, int64_t T, int drop, float *x,
                            int32_t *ids, float *w) {
    const epx_moe_config *c = &L->cfg;
    for (int64_t i = 0; i < T * c->hidden; i++) x[i] = (float)(tu_uniform(r) * 2.0 - 1.0);
    float *logits = malloc((size_t)(T > 0 ? T : 1) * (size_t)c->num_experts * sizeof(float));
    epx_error err = {0};
    assert_int_equal(epx_moe_router_logits(c, L->router, x, T, logits, &err), EPX_OK);
    assert_int_equal(epx_moe_route(c, logits, L->w.router_bias, T, ids, w, &err), EPX_OK);
    free(logits);
    if (drop)
        for (int64_t i = 0; i < T * c->top_k; i++)
            if (tu_below(r, 8) == 0) ids[i] = -1;
}

/* Logical ids -> slots with the dispatch room's per-token dynamic dispatch
 * (epx_dispatch_map_ids: a uniform replica per (token, k), keyed by the
 * rank so ranks choose differently). Must run outside worker threads: it
 * asserts. */
static inline void mc_slots(const mc_layer *L, int64_t T, const int32_t *ids, int32_t rank,
                            int32_t *slots) {
    epx_dispatch_spec spec;
    memset(&spec, 0, sizeof spec);
    spec.mode = EPX_DISPATCH_DYNAMIC;
    spec.num_experts = L->cfg.num_experts;
    spec.num_physical = L->P;
    spec.width = L->P;
    spec.replicas = L->reps;
    spec.num_valid = L->nrep;
    spec.seed = 0x5eed0000u + (uint64_t)rank;
    epx_error err = {0};
    if (epx_dispatch_map_ids(&spec, ids, T, L->cfg.top_k, slots, &err) != EPX_OK)
        fail_msg("epx_dispatch_map_ids: %s", err.msg);
}

/* The views of this rank's local slots (as epx_ep_run_experts wants). */
static inline epx_moe_expert *mc_local_experts(const mc_layer *L, int32_t rank) {
    int32_t spr = L->P / L->R;
    epx_moe_expert *ex = malloc((size_t)spr * sizeof *ex);
    for (int32_t s = 0; s < spr; s++)
        ex[s] =
            epx_moe_weights_expert(&L->cfg, &L->w, L->p2l[rank * spr + s], 0, L->cfg.intermediate);
    return ex;
}

/* EP forward of one batch over comm: dispatch, local experts, combine, and
 * the shared expert on this rank's own tokens. Returns the first failure. */
static inline epx_status mc_ep_forward(epx_comm *comm, const mc_layer *L, int64_t Tmax, int64_t T,
                                       const float *x, const int32_t *slots, const float *w,
                                       epx_ep_combine_mode mode, epx_ep_mode ep_mode, float *out,
                                       epx_error *err) {
    epx_ep_config ec = EPX_EP_CONFIG_INIT;
    ec.mode = ep_mode;
    ec.hidden = L->cfg.hidden;
    ec.top_k = L->cfg.top_k;
    ec.num_slots = L->P;
    ec.max_tokens = Tmax;
    ec.combine = mode;
    epx_ep *ep = NULL;
    epx_status st = epx_ep_create(comm, &ec, NULL, 0, &ep, err);
    if (st != EPX_OK) return st;
    epx_moe_expert *ex = mc_local_experts(L, epx_comm_rank(comm));
    float *work = malloc((size_t)L->cfg.intermediate * sizeof(float));
    epx_ep_recv rv;
    st = epx_ep_dispatch(ep, T, x, slots, w, &rv, err);
    if (st == EPX_OK) st = epx_ep_run_experts(ep, &rv, ex, work, err);
    if (st == EPX_OK) st = epx_ep_combine(ep, out, err);
    if (st == EPX_OK) st = epx_moe_shared_add(&L->cfg, &L->w, x, T, 0, 1, out, err);
    free(work);
    free(ex);
    epx_ep_destroy(ep);
    return st;
}

/* For TP tolerances: S[t][j] = sum_k |w_k| sum_i |down_k[j][i] h_k[i]| plus
 * the shared expert's sum, the magnitude any reordering of the layer's sums
 * can err by, times n * eps. */
static inline void mc_abs_sums(const mc_layer *L, int64_t T, const float *x, const int32_t *ids,
                               const float *w, double *S) {
    const epx_moe_config *c = &L->cfg;
    int32_t H = c->hidden, I = c->intermediate, K = c->top_k, Is = c->shared_intermediate;
    int32_t wmax = I > Is ? I : Is;
    double *h = malloc((size_t)wmax * sizeof(double));
    for (int64_t t = 0; t < T; t++) {
        const float *xt = x + t * H;
        for (int32_t j = 0; j < H; j++) S[t * H + j] = 0.0;
        for (int32_t k = 0; k <= K; k++) {
            const float *g, *u, *d;
            int32_t width;
            double wk;
            if (k < K) {
                int32_t e = ids[t * K + k];
                if (e < 0) continue;
                g = L->gate + (size_t)e * I * H;
                u = L->up + (size_t)e * I * H;
                d = L->down + (size_t)e * H * I;
                width = I;
                wk = fabs((double)w[t * K + k]);
            } else {
                if (Is == 0) continue;
                g = L->sgate;
                u = L->sup;
                d = L->sdown;
                width = Is;
                wk = 1.0;
            }
            for (int32_t i = 0; i < width; i++) {
                double a = 0, b = 0;
                for (int32_t q = 0; q < H; q++) {
                    a += (double)g[(size_t)i * H + q] * xt[q];
                    b += (double)u[(size_t)i * H + q] * xt[q];
                }
                h[i] = fabs(a / (1.0 + exp(-a)) * b);
            }
            for (int32_t j = 0; j < H; j++)
                for (int32_t i = 0; i < width; i++)
                    S[t * H + j] += wk * fabs((double)d[(size_t)j * width + i]) * h[i];
        }
    }
    free(h);
}

#endif /* EPX_MOE_CASE_H */
