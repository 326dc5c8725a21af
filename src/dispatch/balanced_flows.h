/*
 * balanced_flows.h - one component of the balanced split by max-flows (components
 * larger than sub_max GPUs): its flow graph, Dinkelbach's levels, then the
 * rounding. In the kernel a component's warp shares each level's loops over
 * its experts and GPUs (epxi_bal_level, epxi_bal_start) and, in parts of at
 * most 32 experts and GPUs, the graph's build, the greedy start, each BFS
 * and the level's end (the *_lanes forms, each the serial form's result);
 * the blocking flows and the rounding run on one thread (lane 0). Part of
 * the solver balanced_core.h describes.
 */
#ifndef EPX_DISPATCH_BALANCED_FLOWS_H
#define EPX_DISPATCH_BALANCED_FLOWS_H

#include "balanced_core.h"
#include "balanced_subsets.h" /* the lanes' primitives */

/* ---- one component's max-flow graph ------------------------------------------ */

EPXI_BAL void epxi_bal_reset(epxi_bal_part *p) {
    p->n = 4 + p->nf + p->ng;
    p->m = 0;
    for (int32_t v = 0; v < p->n; v++) p->head[v] = p->sink[v] = -1;
}

/* Add u -> v (capacity c) and its reverse (e ^ 1); returns e. Sized at
 * carve time: -1 only if that sizing is wrong. An edge into node 1 (t) is
 * also u's entry in sink, which the greedy start reads. */
EPXI_BAL int32_t epxi_bal_add(epxi_bal_part *p, int32_t u, int32_t v, int64_t c) {
    if (p->m + 2 > p->max_edges) return -1;
    int32_t e = p->m;
    p->to[e] = v;
    p->cap[e] = c;
    p->next[e] = p->head[u];
    p->head[u] = e;
    p->to[e + 1] = u;
    p->cap[e + 1] = 0;
    p->next[e + 1] = p->head[v];
    p->head[v] = e + 1;
    p->m += 2;
    if (v == 1) p->sink[u] = e;
    return e;
}

/* The flow on forward edge e (its reverse's residual); 0 for e = -1. */
EPXI_BAL int64_t epxi_bal_on(const epxi_bal_part *p, int32_t e) {
    return e >= 0 ? p->cap[e ^ 1] : 0;
}

/* Push f along edge e (its reverse is e ^ 1). */
EPXI_BAL void epxi_bal_push(epxi_bal_part *p, int32_t e, int64_t f) {
    p->cap[e] -= f;
    p->cap[e ^ 1] += f;
}

/* Dinic's BFS from s in the residual graph: lvl[v] = v's distance, -1 if
 * not reached. It stops as soon as t is reached: every node nearer than t
 * has its level by then, and the ones it leaves at -1 (at t's distance or
 * beyond) cannot lead to t in the level graph, so the blocking flow's DFS,
 * which would only enter and leave them, finds the same paths in the same
 * order. When t is not reached the BFS is complete: lvl >= 0 is then what
 * s reaches, the min cut's source side epxi_bal_level reads. */
EPXI_BAL int epxi_bal_bfs(epxi_bal_part *p, int32_t s, int32_t t) {
    for (int32_t v = 0; v < p->n; v++) p->lvl[v] = -1;
    int32_t qh = 0, qt = 0;
    p->lvl[s] = 0;
    p->queue[qt++] = s;
    while (qh < qt) {
        int32_t u = p->queue[qh++];
        for (int32_t e = p->head[u]; e >= 0; e = p->next[e]) {
            int32_t v = p->to[e];
            if (p->cap[e] > 0 && p->lvl[v] < 0) {
                p->lvl[v] = p->lvl[u] + 1;
                if (v == t) return 1;
                p->queue[qt++] = v;
            }
        }
    }
    return 0;
}

/* One phase of Dinic's after a BFS that reached t: augmenting paths found
 * by an iterative DFS with current arcs, each from s again, until none is
 * left in the level graph; returns the flow pushed. */
EPXI_BAL int64_t epxi_bal_blocking(epxi_bal_part *p, int32_t s, int32_t t) {
    int64_t total = 0;
    for (int32_t v = 0; v < p->n; v++) p->iter[v] = p->head[v];
    for (;;) {
        int32_t u = s, d = 0, stuck = 0;
        while (u != t) {
            int32_t e = p->iter[u];
            while (e >= 0 && (p->cap[e] <= 0 || p->lvl[p->to[e]] != p->lvl[u] + 1)) e = p->next[e];
            p->iter[u] = e;
            if (e >= 0) {
                p->path[d++] = e;
                u = p->to[e];
                continue;
            }
            if (u == s) {
                stuck = 1;
                break;
            }
            /* u is a dead end: retreat and move the parent past the edge */
            int32_t back = p->path[--d];
            u = p->to[back ^ 1];
            p->iter[u] = p->next[p->iter[u]];
        }
        if (stuck) break;
        int64_t f = INT64_MAX;
        for (int32_t k = 0; k < d; k++)
            if (p->cap[p->path[k]] < f) f = p->cap[p->path[k]];
        for (int32_t k = 0; k < d; k++) epxi_bal_push(p, p->path[k], f);
        total += f;
    }
    return total;
}

/* Dinic: push a maximum flow from s to t; returns the amount. Afterwards lvl
 * marks (>= 0) what s reaches in the residual graph: the min cut's source side. */
EPXI_BAL int64_t epxi_bal_maxflow(epxi_bal_part *p, int32_t s, int32_t t) {
    int64_t total = 0;
    while (epxi_bal_bfs(p, s, t)) total += epxi_bal_blocking(p, s, t);
    return total;
}

/* A flow to start the max-flow from, on a level graph (epxi_bal_build):
 * every source edge in s's list order sends what the sink edges behind it
 * still take, bases straight to their GPU and experts over their GPUs in
 * list order. Any flow is a start the augmenting paths complete, so the
 * maximum is the same; this one leaves them little to do (most batches fit
 * greedily), which is what the kernel's one thread per component needs.
 * Returns the flow pushed. Deterministic: the same on CPU and GPU. */
EPXI_BAL int64_t epxi_bal_greedy(epxi_bal_part *p, int32_t s) {
    int64_t total = 0;
    for (int32_t e = p->head[s]; e >= 0; e = p->next[e]) {
        if (e & 1) continue;
        const int32_t v = p->to[e];
        const int32_t vt = p->sink[v];
        if (vt >= 0) { /* a base: s -> g -> t */
            const int64_t f = p->cap[e] < p->cap[vt] ? p->cap[e] : p->cap[vt];
            epxi_bal_push(p, e, f);
            epxi_bal_push(p, vt, f);
            total += f;
            continue;
        }
        for (int32_t x = p->head[v]; x >= 0 && p->cap[e] > 0; x = p->next[x]) {
            if (x & 1) continue;
            const int32_t gt = p->sink[p->to[x]];
            if (gt < 0) continue;
            const int64_t f = p->cap[e] < p->cap[gt] ? p->cap[e] : p->cap[gt];
            if (f <= 0) continue;
            epxi_bal_push(p, e, f);
            epxi_bal_push(p, x, f);
            epxi_bal_push(p, gt, f);
            total += f;
        }
    }
    return total;
}

/* mark[v] = 1 for every node that reaches t in the residual graph. */
EPXI_BAL void epxi_bal_reaches(epxi_bal_part *p, int32_t t) {
    for (int32_t v = 0; v < p->n; v++) p->mark[v] = 0;
    int32_t qh = 0, qt = 0;
    p->mark[t] = 1;
    p->queue[qt++] = t;
    while (qh < qt) {
        int32_t v = p->queue[qh++];
        for (int32_t e = p->head[v]; e >= 0; e = p->next[e]) {
            int32_t w = p->to[e];
            if (!p->mark[w] && p->cap[e ^ 1] > 0) {
                p->mark[w] = 1;
                p->queue[qt++] = w;
            }
        }
    }
}

/* ---- one component's levels ------------------------------------------------------ */

/* C(S) and |N(S)| over the component's unfixed GPUs, S = its flexible
 * experts with f_in and the bases of its GPUs with g_sin. */
EPXI_BAL void epxi_bal_ratio(epxi_bal *b, const epxi_bal_part *p, int64_t *a, int64_t *den) {
    int64_t c = 0, n = 0;
    int32_t D = b->D;
    for (int32_t gi = 0; gi < p->ng; gi++) b->g_in[p->gl[gi]] = 0;
    for (int32_t j = 0; j < p->nf; j++) {
        int32_t i = p->fl[j];
        if (!b->f_in[i]) continue;
        int32_t e = b->flex[i];
        c += b->cnt[e];
        for (int32_t k = 0; k < b->eg_n[e]; k++) {
            int32_t g = b->eg_gpu[(size_t)e * (size_t)D + (size_t)k];
            if (b->g_level[g] == -1 && !b->g_in[g]) {
                b->g_in[g] = 1;
                n++;
            }
        }
    }
    for (int32_t gi = 0; gi < p->ng; gi++) {
        int32_t g = p->gl[gi];
        if (!b->g_sin[g]) continue;
        c += b->base[g];
        if (!b->g_in[g]) {
            b->g_in[g] = 1;
            n++;
        }
    }
    *a = c;
    *den = n;
}

/* epxi_bal_ratio by the lanes, the same on every lane: in a part of at most
 * 32 GPUs each lane sums its experts' counts and bases and ORs their
 * unfixed GPUs as bits (integer sums and a union: the serial form's result
 * whatever the split); else lane 0 alone, saying it through level lv's
 * slots. */
EPXI_BAL void epxi_bal_ratio_lanes(epxi_bal *b, const epxi_bal_part *p, int32_t lv, int lane,
                                   int nl, int64_t *a, int64_t *den) {
    if (nl == 1 || p->ng > 32) {
        if (lane == 0) {
            epxi_bal_ratio(b, p, a, den);
            b->lv_num[lv] = *a;
            b->lv_den[lv] = *den;
        }
        EPXI_BAL_SYNCWARP();
        *a = b->lv_num[lv];
        *den = b->lv_den[lv];
        EPXI_BAL_SYNCWARP(); /* read before lane 0 says the next */
        return;
    }
    const int32_t D = b->D;
    int64_t c = 0;
    uint32_t m = 0;
    for (int32_t j = lane; j < p->nf; j += nl) {
        const int32_t i = p->fl[j];
        if (!b->f_in[i]) continue;
        const int32_t e = b->flex[i];
        c += b->cnt[e];
        for (int32_t k = 0; k < b->eg_n[e]; k++) {
            const int32_t g = b->eg_gpu[(size_t)e * (size_t)D + (size_t)k];
            if (b->g_level[g] == -1) m |= 1u << b->g_loc[g];
        }
    }
    for (int32_t gi = lane; gi < p->ng; gi += nl) {
        const int32_t g = p->gl[gi];
        if (!b->g_sin[g]) continue;
        c += b->base[g];
        m |= 1u << gi;
    }
    *a = epxi_bal_sum_lanes(c, nl);
    *den = epxi_bal_popc(epxi_bal_or_lanes(m, nl));
}

/* The graph of the component's unfixed part at lambda = a / den: s -> e
 * (den c_e), e -> g (unbounded) to unfixed GPUs, s -> g (den base_g),
 * g -> t (a). Returns the flow that means feasible. */
EPXI_BAL int64_t epxi_bal_build(epxi_bal *b, epxi_bal_part *p, int64_t a, int64_t den) {
    int32_t D = b->D;
    epxi_bal_reset(p);
    for (int32_t gi = 0; gi < p->ng; gi++) b->g_graph[p->gl[gi]] = 0;
    int64_t need = 0;
    for (int32_t j = 0; j < p->nf; j++) {
        int32_t i = p->fl[j];
        if (b->f_level[i] != -1) continue;
        int32_t e = b->flex[i];
        epxi_bal_add(p, 0, EPXI_BAL_FN(j), den * b->cnt[e]);
        need += den * b->cnt[e];
        for (int32_t k = 0; k < b->eg_n[e]; k++) {
            int32_t g = b->eg_gpu[(size_t)e * (size_t)D + (size_t)k];
            int32_t *ed = b->f_edge + (size_t)i * (size_t)D + (size_t)k;
            *ed = -1;
            if (b->g_level[g] != -1) continue;
            *ed = epxi_bal_add(p, EPXI_BAL_FN(j), EPXI_BAL_GN(p, b->g_loc[g]), EPXI_BAL_INF);
            b->g_graph[g] = 1;
        }
    }
    for (int32_t gi = 0; gi < p->ng; gi++) {
        int32_t g = p->gl[gi];
        if (b->g_level[g] == -1 && b->base[g] > 0) {
            epxi_bal_add(p, 0, EPXI_BAL_GN(p, gi), den * b->base[g]);
            need += den * b->base[g];
            b->g_graph[g] = 1;
        }
    }
    for (int32_t gi = 0; gi < p->ng; gi++)
        if (b->g_graph[p->gl[gi]]) epxi_bal_add(p, EPXI_BAL_GN(p, gi), 1, a);
    return need;
}

/* Pairs (an edge and its reverse) before expert j's in epxi_bal_build's
 * order: one for each earlier live expert's s -> e, and its GPUs, counted
 * from `live` and the bits of the GPU counts (ub[q]: experts whose count
 * has bit q). */
EPXI_BAL int32_t epxi_bal_pairs_before(uint32_t live, const uint32_t ub[6], int32_t j) {
    const uint32_t lt = (1u << j) - 1u;
    int32_t n = epxi_bal_popc(live & lt);
    for (int q = 0; q < 6; q++) n += epxi_bal_popc(ub[q] & lt) << q;
    return n;
}

/* ... of every live expert. */
EPXI_BAL int32_t epxi_bal_pairs_all(uint32_t live, const uint32_t ub[6]) {
    int32_t n = epxi_bal_popc(live);
    for (int q = 0; q < 6; q++) n += epxi_bal_popc(ub[q]) << q;
    return n;
}

/* The index of x's highest set bit (x != 0). */
EPXI_BAL int32_t epxi_bal_top(uint32_t x) {
#ifdef __CUDA_ARCH__
    return 31 - __clz((int)x);
#else
    int32_t n = 31;
    while (!(x >> n & 1u)) n--;
    return n;
#endif
}

/*
 * epxi_bal_build by the lanes, for a part of at most 32 experts and 32
 * GPUs: the same edges at the same indices, with the same lists (head,
 * next), sink entries, f_edge and g_graph, so the max-flows that follow run
 * exactly as after the serial build. Every edge's index follows from the
 * serial order (each live expert's s -> e, then its e -> g over its unfixed
 * GPUs ascending; then the bases' s -> g by GPU; then g -> t by GPU), as
 * counts of set bits: each lane writes its experts' s -> e and e -> g, and
 * its GPUs' lists, in which the reverse edges come in expert order, then
 * the base's reverse, then the edge to t. Lane 0 writes s's and t's heads.
 * Returns the flow that means feasible, on every lane; ends at a barrier.
 */
EPXI_BAL int64_t epxi_bal_build_lanes(epxi_bal *b, epxi_bal_part *p, int64_t a, int64_t den,
                                      int lane, int nl) {
    const int32_t D = b->D, nf = p->nf, ng = p->ng;
    /* each expert's unfixed GPUs (f_mask: the dense start's scratch, spent
     * by now) and the masks every lane needs */
    uint32_t live = 0, ub[6] = {0, 0, 0, 0, 0, 0}, any = 0, based = 0;
    int64_t need = 0;
    for (int32_t j = lane; j < nf; j += nl) {
        const int32_t i = p->fl[j], e = b->flex[i];
        uint32_t on = 0;
        if (b->f_level[i] == -1) {
            for (int32_t k = 0; k < b->eg_n[e]; k++) {
                const int32_t g = b->eg_gpu[(size_t)e * (size_t)D + (size_t)k];
                if (b->g_level[g] == -1) on |= 1u << b->g_loc[g];
            }
            live |= 1u << j;
            const int32_t u = epxi_bal_popc(on);
            for (int q = 0; q < 6; q++) ub[q] |= (uint32_t)(u >> q & 1) << j;
            need += den * b->cnt[e];
        }
        b->f_mask[i] = (int32_t)on;
        any |= on;
    }
    for (int32_t gi = lane; gi < ng; gi += nl) {
        const int32_t g = p->gl[gi];
        if (b->g_level[g] == -1 && b->base[g] > 0) {
            based |= 1u << gi;
            need += den * b->base[g];
        }
    }
    live = epxi_bal_or_lanes(live, nl);
    for (int q = 0; q < 6; q++) ub[q] = epxi_bal_or_lanes(ub[q], nl);
    any = epxi_bal_or_lanes(any, nl);
    based = epxi_bal_or_lanes(based, nl);
    need = epxi_bal_sum_lanes(need, nl);
    const uint32_t graph = any | based;
    const int32_t pe = epxi_bal_pairs_all(live, ub); /* the experts' pairs */
    const int32_t nb = epxi_bal_popc(based), m = 2 * (pe + nb + epxi_bal_popc(graph));
    p->n = 4 + nf + ng;
    p->m = m;
    /* the experts' s -> e and e -> g */
    for (int32_t j = lane; j < nf; j += nl) {
        const int32_t i = p->fl[j], e = b->flex[i], v = EPXI_BAL_FN(j);
        p->sink[v] = -1;
        if (!(live >> j & 1u)) {
            p->head[v] = -1;
            continue;
        }
        const int32_t x0 = 2 * epxi_bal_pairs_before(live, ub, j);
        const uint32_t prev = live & ((1u << j) - 1u);
        p->queue[v] = x0; /* for the GPUs' lists */
        p->to[x0] = v;
        p->cap[x0] = den * b->cnt[e];
        p->next[x0] = prev ? 2 * epxi_bal_pairs_before(live, ub, epxi_bal_top(prev)) : -1;
        p->to[x0 + 1] = 0;
        p->cap[x0 + 1] = 0;
        p->next[x0 + 1] = -1;
        int32_t x = x0 + 1; /* the list's head so far */
        for (int32_t k = 0; k < b->eg_n[e]; k++) {
            const int32_t g = b->eg_gpu[(size_t)e * (size_t)D + (size_t)k];
            int32_t *const ed = b->f_edge + (size_t)i * (size_t)D + (size_t)k;
            *ed = -1;
            if (b->g_level[g] != -1) continue;
            const int32_t y = x == x0 + 1 ? x0 + 2 : x + 2;
            p->to[y] = EPXI_BAL_GN(p, b->g_loc[g]);
            p->cap[y] = EPXI_BAL_INF;
            p->next[y] = x;
            *ed = y;
            x = y;
        }
        p->head[v] = x;
    }
    /* each GPU's live experts, by votes (its lane keeps them in queue) */
    for (int32_t gi = 0; gi < ng; gi++) {
        uint32_t mine = 0;
        for (int32_t j = lane; j < nf; j += nl)
            mine |= ((uint32_t)b->f_mask[p->fl[j]] >> gi & 1u) << j;
        mine = epxi_bal_or_lanes(mine, nl);
        if (gi % nl == lane) p->queue[EPXI_BAL_GN(p, gi)] = (int32_t)mine;
    }
    EPXI_BAL_SYNCWARP(); /* f_mask and the experts' first pairs, before the GPUs' lists */
    /* the GPUs' lists: reverse edges by expert, the base, the edge to t */
    const int32_t last_s = live ? 2 * epxi_bal_pairs_before(live, ub, epxi_bal_top(live)) : -1;
    for (int32_t gi = lane; gi < ng; gi += nl) {
        const int32_t g = p->gl[gi], v = EPXI_BAL_GN(p, gi);
        const uint32_t bit = 1u << gi, lt = bit - 1u;
        b->g_graph[g] = (graph & bit) != 0;
        int32_t h = -1;
        for (uint32_t r = (uint32_t)p->queue[v]; r != 0; r &= r - 1u) {
            const int32_t j = epxi_bal_ctz(r);
            const uint32_t on = (uint32_t)b->f_mask[p->fl[j]];
            const int32_t y = p->queue[EPXI_BAL_FN(j)] + 2 + 2 * epxi_bal_popc(on & lt);
            p->to[y + 1] = EPXI_BAL_FN(j);
            p->cap[y + 1] = 0;
            p->next[y + 1] = h;
            h = y + 1;
        }
        if (based & bit) {
            const int32_t y = 2 * (pe + epxi_bal_popc(based & lt));
            p->to[y] = v;
            p->cap[y] = den * b->base[g];
            p->next[y] = based & lt ? y - 2 : last_s;
            p->to[y + 1] = 0;
            p->cap[y + 1] = 0;
            p->next[y + 1] = h;
            h = y + 1;
        }
        p->sink[v] = -1;
        if (graph & bit) {
            const int32_t z = 2 * (pe + nb + epxi_bal_popc(graph & lt));
            p->to[z] = 1;
            p->cap[z] = a;
            p->next[z] = h;
            p->to[z + 1] = v;
            p->cap[z + 1] = 0;
            p->next[z + 1] = graph & lt ? z - 1 : -1;
            p->sink[v] = z;
            h = z;
        }
        p->head[v] = h;
    }
    if (lane == 0) {
        p->head[0] = nb ? 2 * (pe + nb - 1) : last_s;
        p->head[1] = graph ? 2 * (pe + nb + epxi_bal_popc(graph) - 1) + 1 : -1;
        p->head[2] = p->head[3] = -1;
        for (int32_t v = 0; v < 4; v++) p->sink[v] = -1;
    }
    EPXI_BAL_SYNCWARP(); /* the graph, before lane 0's max-flow */
    return need;
}

/* epxi_bal_recap's pairs first, first + step, ...: each capacity set again
 * as epxi_bal_build sets it; returns their part of the flow that means
 * feasible. */
EPXI_BAL int64_t epxi_bal_recap_pairs(const epxi_bal *b, epxi_bal_part *p, int64_t a, int64_t den,
                                      int32_t first, int32_t step) {
    int64_t need = 0;
    for (int32_t e = first; e < p->m; e += step) {
        const int32_t u = p->to[e + 1], v = p->to[e];
        int64_t c = EPXI_BAL_INF; /* e -> g */
        if (u == 0) {             /* s -> e (den c_e) or s -> g (den base_g) */
            c = v < 4 + p->nf ? den * b->cnt[b->flex[p->fl[v - 4]]]
                              : den * b->base[p->gl[v - 4 - p->nf]];
            need += c;
        } else if (v == 1) { /* g -> t */
            c = a;
        }
        p->cap[e] = c;
        p->cap[e + 1] = 0;
    }
    return need;
}

/* The graph epxi_bal_build made, at another lambda = a / den: the same
 * edges in the same order (within a level the unfixed part does not
 * change), every capacity set again as build sets it and every reverse
 * edge's to 0, so a max-flow on it runs exactly as on a fresh build.
 * Returns the flow that means feasible. */
EPXI_BAL int64_t epxi_bal_recap(const epxi_bal *b, epxi_bal_part *p, int64_t a, int64_t den) {
    return epxi_bal_recap_pairs(b, p, a, den, 0, 2);
}

/* epxi_bal_recap by the lanes (each takes pairs lane, lane + nl, ...): the
 * same capacities; returns the flow that means feasible on every lane. */
EPXI_BAL int64_t epxi_bal_recap_lanes(const epxi_bal *b, epxi_bal_part *p, int64_t a, int64_t den,
                                      int lane, int nl) {
    int64_t need = epxi_bal_recap_pairs(b, p, a, den, 2 * lane, 2 * nl);
    need = epxi_bal_sum_lanes(need, nl);
    EPXI_BAL_SYNCWARP(); /* the capacities, before the greedy start reads them */
    return need;
}

/*
 * epxi_bal_greedy by the lanes on a graph of epxi_bal_build_lanes' layout
 * (a part of at most 32 experts and 32 GPUs, nl >= its GPUs): the same
 * pushes, so the same flow. Lane gi keeps GPU gi's room to t in a register.
 * The bases come first in s's list, each on its own GPU's edge to t, so
 * their lanes push at once; then the experts one after another in s's list
 * order (descending index), each over its GPUs in its list's order
 * (descending), the GPU's lane taking what its room allows and telling the
 * others by a shuffle. Each expert's edges follow from its GPU mask (f_mask,
 * as the build left it) and its list's head. The serial form's walk of the
 * lists was a tenth of the 32-GPU shape's solve (ncu, bench/RESULTS.md).
 * Returns the flow pushed, on every lane; ends at a barrier.
 */
EPXI_BAL int64_t epxi_bal_greedy_lanes(const epxi_bal *b, epxi_bal_part *p, int lane, int nl) {
    const int32_t nf = p->nf, gi = lane;
    const int32_t sk = gi < p->ng ? p->sink[EPXI_BAL_GN(p, gi)] : -1;
    int64_t room = sk >= 0 ? p->cap[sk] : 0, base = 0;
    if (sk >= 0 && b->g_level[p->gl[gi]] == -1 && b->base[p->gl[gi]] > 0) {
        const int32_t sb = p->next[sk] - 1; /* s -> g: its reverse is the list's next */
        base = p->cap[sb] < room ? p->cap[sb] : room;
        epxi_bal_push(p, sb, base);
        room -= base;
    }
    int64_t total = epxi_bal_sum_lanes(base, nl);
    for (int32_t j = nf - 1; j >= 0; j--) {
        const int32_t i = p->fl[j];
        if (b->f_level[i] != -1) continue;
        const uint32_t on = (uint32_t)b->f_mask[i];
        const int32_t x0 = p->head[EPXI_BAL_FN(j)] - 2 * epxi_bal_popc(on); /* s -> e */
        int64_t rem = p->cap[x0], sent = 0;
        for (uint32_t r = on; r != 0 && rem > 0;) {
            const int32_t h = epxi_bal_top(r);
            r &= ~(1u << h);
            const int64_t f = epxi_bal_from_lane(rem < room ? rem : room, h, nl);
            if (f <= 0) continue;
            if (lane == h) {
                room -= f;
                epxi_bal_push(p, x0 + 2 + 2 * epxi_bal_popc(on & ((1u << h) - 1u)), f);
            }
            rem -= f;
            sent += f;
        }
        if (lane == 0 && sent > 0) epxi_bal_push(p, x0, sent);
        total += sent;
    }
    if (sk >= 0) epxi_bal_push(p, sk, p->cap[sk] - room);
    EPXI_BAL_SYNCWARP(); /* the flow, before lane 0's max-flow */
    return total;
}

/*
 * epxi_bal_bfs(p, 0, 1) by the lanes on a graph of epxi_bal_build_lanes'
 * layout (a part of at most nl experts and nl GPUs: lane L holds expert L
 * and GPU L), a level at a time over bit masks: s reaches the experts and
 * bases with room on their edge from s; an expert reaches all its GPUs (its
 * edges are unbounded), a GPU the experts that send it flow (queue holds
 * each GPU's experts since the build: the list BFS that used queue does not
 * run on such a graph) and t when its edge to t has room. The labels are
 * distances, as the serial BFS's, except that nodes at t's distance other
 * than t stay unlabelled where the serial BFS labels those it met before t:
 * dead ends either way for the blocking flow (nothing is labelled beyond t's
 * distance), which finds the same paths. When t is not reached every label
 * is the serial one, as epxi_bal_level's reading of the cut needs. Returns
 * whether t was reached, on every lane; ends at a barrier.
 */
EPXI_BAL int epxi_bal_bfs_lanes(const epxi_bal *b, epxi_bal_part *p, int lane, int nl) {
    const int32_t nf = p->nf, ng = p->ng;
    uint32_t on = 0, fin = 0, se = 0, sg = 0, tt = 0; /* this lane's expert and GPU */
    if (lane < nf && b->f_level[p->fl[lane]] == -1) {
        on = (uint32_t)b->f_mask[p->fl[lane]];
        if (p->cap[p->head[EPXI_BAL_FN(lane)] - 2 * epxi_bal_popc(on)] > 0) se = 1u << lane;
    }
    if (lane < ng) {
        const int32_t v = EPXI_BAL_GN(p, lane), sk = p->sink[v], g = p->gl[lane];
        const uint32_t lt = (1u << lane) - 1u;
        if (sk >= 0) {
            if (p->cap[sk] > 0) tt = 1u << lane;
            if (b->g_level[g] == -1 && b->base[g] > 0 && p->cap[p->next[sk] - 1] > 0)
                sg = 1u << lane;
            for (uint32_t r = (uint32_t)p->queue[v]; r != 0; r &= r - 1u) {
                const int32_t j = epxi_bal_ctz(r);
                const uint32_t oj = (uint32_t)b->f_mask[p->fl[j]];
                const int32_t x = p->head[EPXI_BAL_FN(j)] - 2 * epxi_bal_popc(oj) + 2 +
                                  2 * epxi_bal_popc(oj & lt); /* j -> this GPU */
                if (p->cap[x ^ 1] > 0) fin |= 1u << j;
            }
        }
    }
    uint32_t fe = epxi_bal_or_lanes(se, nl), fg = epxi_bal_or_lanes(sg, nl);
    tt = epxi_bal_or_lanes(tt, nl);
    uint32_t ve = fe, vg = fg;
    int32_t d = 1, le = fe >> lane & 1u ? 1 : -1, lg = fg >> lane & 1u ? 1 : -1;
    int reached = 0;
    while ((fe | fg) != 0) {
        if (fg & tt) { /* t at d + 1 */
            reached = 1;
            break;
        }
        const uint32_t ngp = epxi_bal_or_lanes(fe >> lane & 1u ? on : 0u, nl) & ~vg;
        const uint32_t nep = epxi_bal_or_lanes(fg >> lane & 1u ? fin : 0u, nl) & ~ve;
        d++;
        if (nep >> lane & 1u) le = d;
        if (ngp >> lane & 1u) lg = d;
        ve |= nep;
        vg |= ngp;
        fe = nep;
        fg = ngp;
    }
    if (lane < nf) p->lvl[EPXI_BAL_FN(lane)] = le;
    if (lane < ng) p->lvl[EPXI_BAL_GN(p, lane)] = lg;
    if (lane == 0) {
        p->lvl[0] = 0;
        p->lvl[1] = reached ? d + 1 : -1;
        p->lvl[2] = p->lvl[3] = -1;
    }
    EPXI_BAL_SYNCWARP(); /* the labels, before lane 0's blocking flow */
    return reached;
}

/* epxi_bal_maxflow(p, 0, 1) with the BFS by the lanes (epxi_bal_bfs_lanes)
 * and each phase's blocking flow on lane 0: the same flow. Returns the
 * amount on lane 0. */
EPXI_BAL int64_t epxi_bal_maxflow_lanes(const epxi_bal *b, epxi_bal_part *p, int lane, int nl) {
    int64_t total = 0;
    while (epxi_bal_bfs_lanes(b, p, lane, nl)) {
#ifdef EPXI_BAL_LANES
        if (lane == 0) epxi_bal_lanes_bfs(p, 1);
#endif
        if (lane == 0) total += epxi_bal_blocking(p, 0, 1);
        EPXI_BAL_SYNCWARP(); /* the flow, before the next BFS */
    }
#ifdef EPXI_BAL_LANES
    if (lane == 0) epxi_bal_lanes_bfs(p, 0);
    EPXI_BAL_SYNCWARP();
#endif
    return total;
}

/* The start of a component of more than 32 GPUs (no masks): the whole
 * unfixed part, or the first densest GPU closed (its base and the unfixed
 * experts with no other unfixed GPU), by one thread. */
EPXI_BAL_COLD void epxi_bal_start_gpus(epxi_bal *b, const epxi_bal_part *p) {
    const int32_t D = b->D;
    int64_t best_a, best_d;
    epxi_bal_ratio(b, p, &best_a, &best_d);
    for (int32_t gi = 0; gi < p->ng; gi++) b->gex[p->gl[gi]] = b->base[p->gl[gi]];
    for (int32_t j = 0; j < p->nf; j++) {
        const int32_t i = p->fl[j], e = b->flex[i];
        int32_t only = -1, n = 0; /* its unfixed GPUs: how many, the last */
        if (b->f_level[i] == -1)
            for (int32_t k = 0; k < b->eg_n[e]; k++) {
                const int32_t g = b->eg_gpu[(size_t)e * (size_t)D + (size_t)k];
                if (b->g_level[g] == -1) {
                    only = g;
                    n++;
                }
            }
        if (n == 1) b->gex[only] += b->cnt[e];
    }
    int32_t best = -1; /* the best single GPU, or -1 */
    for (int32_t gi = 0; gi < p->ng; gi++) {
        const int32_t g = p->gl[gi];
        if (b->g_level[g] == -1 && b->gex[g] * best_d > best_a) {
            best_a = b->gex[g];
            best_d = 1;
            best = g;
        }
    }
    if (best < 0) return;
    for (int32_t j = 0; j < p->nf; j++) {
        const int32_t i = p->fl[j], e = b->flex[i];
        int in = b->f_level[i] == -1, any = 0;
        for (int32_t k = 0; k < b->eg_n[e] && in; k++) {
            const int32_t g = b->eg_gpu[(size_t)e * (size_t)D + (size_t)k];
            if (b->g_level[g] == -1) {
                any = 1;
                in = g == best;
            }
        }
        b->f_in[i] = in && any;
    }
    for (int32_t gi = 0; gi < p->ng; gi++) {
        const int32_t g = p->gl[gi];
        b->g_sin[g] = g == best && b->base[g] > 0;
    }
}

/* Where Dinkelbach's iteration starts (epxi_bal_level): any set's ratio is
 * at most the level's lambda, and from a denser start fewer max-flows
 * reach it. The candidates: the whole unfixed part; each unfixed GPU
 * closed (its base and the unfixed experts with no other unfixed GPU,
 * ratio over 1); and, in components of at most 32 GPUs (GPU sets as bit
 * masks, in f_mask), each unfixed expert's unfixed GPUs closed (their
 * bases and every unfixed expert inside them). The first densest wins;
 * f_in and g_sin are set to it. On DeepSeek-V3's components of ~20 GPUs a
 * level then takes ~1.3 max-flows instead of ~3 (the GPUs alone: ~1.7;
 * bench/RESULTS.md, 2026-12-05). The level found is the same whatever the
 * start: its lambda, its largest tight set, and the last max-flow's flows,
 * which depend on lambda's value and scale with the form of its fraction
 * (k a / k d: k times the flows), a form epxi_bal_fix reduces. gex holds
 * each GPU's closed load (scratch until the rounding). By every lane of nl
 * (the CPU: 0 of 1); lv is the level (epxi_bal_ratio_lanes' slots). */
EPXI_BAL_COLD void epxi_bal_start(epxi_bal *b, const epxi_bal_part *p, int32_t lv, int lane,
                                  int nl) {
    const int32_t D = b->D;
    if (!b->dense) return; /* the whole unfixed part, as set */
    if (p->ng > 32) {      /* no masks: lane 0 alone, the GPUs as the only candidates */
        if (lane == 0) epxi_bal_start_gpus(b, p);
        EPXI_BAL_SYNCWARP();
        return;
    }
    /* The lanes share the candidates (GPUs gi, then experts x, in one index
     * space k < ng + nf), each keeping its first best, and the warp keeps
     * the first best of theirs: what one scan in index order keeps. The
     * whole part's ratio is where the scan starts; a candidate must beat it
     * strictly. */
    int64_t best_a, best_d;
    epxi_bal_ratio_lanes(b, p, lv, lane, nl, &best_a, &best_d);
    for (int32_t gi = lane; gi < p->ng; gi += nl) b->gex[p->gl[gi]] = b->base[p->gl[gi]];
    EPXI_BAL_SYNCWARP();
    for (int32_t j = lane; j < p->nf; j += nl) {
        const int32_t i = p->fl[j], e = b->flex[i];
        int32_t only = -1, n = 0; /* its unfixed GPUs: how many, the last */
        uint32_t m = 0;
        if (b->f_level[i] == -1)
            for (int32_t k = 0; k < b->eg_n[e]; k++) {
                const int32_t g = b->eg_gpu[(size_t)e * (size_t)D + (size_t)k];
                if (b->g_level[g] == -1) {
                    only = g;
                    n++;
                    m |= 1u << b->g_loc[g];
                }
            }
        b->f_mask[i] = (int32_t)m;
        if (n == 1) epxi_bal_add_to(&b->gex[only], b->cnt[e]); /* integer sums: any order */
    }
    EPXI_BAL_SYNCWARP();
    int64_t my_a = 0;
    int32_t my_d = 1, my_k = -1;
    for (int32_t k = lane; k < p->ng + p->nf; k += nl) {
        int64_t c = 0;
        int32_t d = 0;
        if (k < p->ng) { /* GPU gi = k closed */
            const int32_t g = p->gl[k];
            if (b->g_level[g] != -1) continue;
            c = b->gex[g];
            d = 1;
        } else { /* expert x's set of two GPUs or more, closed */
            const uint32_t N = (uint32_t)b->f_mask[p->fl[k - p->ng]];
            if ((N & (N - 1u)) == 0) continue;
            for (uint32_t t = N; t != 0; t &= t - 1u) /* N's bases, set bit by set bit */
                c += b->base[p->gl[epxi_bal_popc((t & (0u - t)) - 1u)]];
            for (int32_t j = 0; j < p->nf; j++) {
                const uint32_t m = (uint32_t)b->f_mask[p->fl[j]];
                if (m != 0 && (m & ~N) == 0) c += b->cnt[b->flex[p->fl[j]]];
            }
            d = epxi_bal_popc(N);
        }
        if (c * best_d > best_a * d && epxi_bal_first_before(c, d, k, my_a, my_d, my_k)) {
            my_a = c;
            my_d = d;
            my_k = k;
        }
    }
    const int32_t win = epxi_bal_first_lanes(my_a, my_d, my_k, nl);
    if (win >= 0) {
        const uint32_t set = win < p->ng ? 1u << win : (uint32_t)b->f_mask[p->fl[win - p->ng]];
        for (int32_t j = lane; j < p->nf; j += nl) {
            const uint32_t m = (uint32_t)b->f_mask[p->fl[j]];
            b->f_in[p->fl[j]] = m != 0 && (m & ~set) == 0;
        }
        for (int32_t gi = lane; gi < p->ng; gi += nl) {
            const int32_t g = p->gl[gi];
            b->g_sin[g] = b->g_level[g] == -1 && b->base[g] > 0 && (set >> gi & 1);
        }
    }
    EPXI_BAL_SYNCWARP();
}

/* The level's end, on lane 0: fix its largest tight set (what cannot reach t
 * at lambda = a / den), check it is tight, and store lambda reduced with
 * the set's flows. Returns EPXI_BAL_OK or the broken invariant. Inline (the
 * level's tail before it was split out): kept out of line on the host, it
 * cost the CPU solve 7-9 % on DeepSeek-V3's 32 GPUs (bench_balanced_shapes). */
EPXI_BAL int epxi_bal_fix(epxi_bal *b, epxi_bal_part *p, int32_t lv, int64_t a, int64_t den) {
    int32_t D = b->D;
    epxi_bal_reaches(p, 1);
    for (int32_t j = 0; j < p->nf; j++) {
        int32_t i = p->fl[j];
        if (b->f_level[i] != -1 || p->mark[EPXI_BAL_FN(j)]) continue;
        b->f_level[i] = lv;
        int32_t e = b->flex[i];
        for (int32_t k = 0; k < b->eg_n[e]; k++) {
            size_t x = (size_t)i * (size_t)D + (size_t)k;
            b->f_flow[x] = epxi_bal_on(p, b->f_edge[x]);
        }
    }
    int32_t fixed = 0;
    for (int32_t gi = 0; gi < p->ng; gi++) {
        int32_t g = p->gl[gi];
        if (b->g_graph[g] && !p->mark[EPXI_BAL_GN(p, gi)]) {
            b->g_level[g] = lv;
            fixed++;
        }
    }
    /* the tight set sends only to its own GPUs, which carry exactly a each */
    for (int32_t j = 0; j < p->nf; j++) {
        int32_t i = p->fl[j];
        if (b->f_level[i] != lv) continue;
        int32_t e = b->flex[i];
        for (int32_t k = 0; k < b->eg_n[e]; k++) {
            size_t x = (size_t)i * (size_t)D + (size_t)k;
            if (b->f_flow[x] > 0 && b->g_level[b->eg_gpu[(size_t)e * (size_t)D + (size_t)k]] != lv)
                fixed = 0;
        }
    }
    if (fixed == 0) return EPXI_BAL_NO_TIGHT;
    /* lambda as a reduced fraction and the level's flows divided with it:
     * which set's ratio gave lambda (the start's, epxi_bal_start) decides
     * its form, k a' / k d', and the max-flow's every capacity and flow
     * with it (k times those at a' / d', exactly), so only the reduced
     * form makes what is stored, and the shares computed from it in
     * doubles, the same whatever the start. The division is exact. */
    const int64_t k = epxi_bal_gcd(a, den);
    if (k > 1) {
        for (int32_t j = 0; j < p->nf; j++) {
            const int32_t i = p->fl[j], e = b->flex[i];
            if (b->f_level[i] != lv) continue;
            for (int32_t q = 0; q < b->eg_n[e]; q++) {
                const size_t x = (size_t)i * (size_t)D + (size_t)q;
                if (b->f_flow[x] % k != 0) return EPXI_BAL_SCALE;
                b->f_flow[x] /= k;
            }
        }
        a /= k;
        den /= k;
    }
    b->lv_num[lv] = a;
    b->lv_den[lv] = den;
    return EPXI_BAL_OK;
}

/* epxi_bal_fix by the lanes, for a part of at most 32 GPUs: the same
 * level, flows and status (every lane returns it). What reaches t is found
 * over GPU bit masks instead of a search of the residual graph: a GPU
 * whose edge to t is not saturated reaches t; an expert reaches t exactly
 * when one of its GPUs does (its edges to them are unbounded); a GPU also
 * does when it carries flow from an expert that does (the reverse edge).
 * s never does after a maximum flow, so nothing reaches t through it, and
 * the sets grow to the same fixed point the search reaches: what reaches t
 * is one set, however it is found. Each lane takes experts j = lane, lane
 * + nl, ... (their GPU masks in f_mask, flows in f_frac: the dense start's
 * and the subset rounding's scratch, free here) and GPUs gi = lane, ...;
 * the lanes agree through OR and AND votes. Lane 0's serial form was a
 * tenth of the 32-GPU shape's solve (ncu, bench/RESULTS.md). */
EPXI_BAL int epxi_bal_fix_lanes(epxi_bal *b, epxi_bal_part *p, int32_t lv, int64_t a, int64_t den,
                                int lane, int nl) {
    const int32_t D = b->D;
    uint32_t reach = 0; /* GPUs (part bits) that reach t */
    for (int32_t gi = lane; gi < p->ng; gi += nl) {
        const int32_t ed = p->sink[EPXI_BAL_GN(p, gi)];
        if (ed >= 0 && p->cap[ed] > 0) reach |= 1u << gi;
    }
    for (int32_t j = lane; j < p->nf; j += nl) {
        const int32_t i = p->fl[j], e = b->flex[i];
        uint32_t on = 0, pos = 0; /* its GPUs in the graph; those it sends flow to */
        if (b->f_level[i] == -1)
            for (int32_t k = 0; k < b->eg_n[e]; k++) {
                const int32_t ed = b->f_edge[(size_t)i * (size_t)D + (size_t)k];
                if (ed < 0) continue;
                const uint32_t bit = 1u << b->g_loc[b->eg_gpu[(size_t)e * (size_t)D + (size_t)k]];
                on |= bit;
                if (epxi_bal_on(p, ed) > 0) pos |= bit;
            }
        b->f_mask[i] = (int32_t)on;
        b->f_frac[i] = (int32_t)pos;
    }
    reach = epxi_bal_or_lanes(reach, nl);
    for (;;) { /* at most ng rounds: each adds a GPU or ends */
        uint32_t more = 0;
        for (int32_t j = lane; j < p->nf; j += nl) {
            const int32_t i = p->fl[j];
            if ((uint32_t)b->f_mask[i] & reach) more |= (uint32_t)b->f_frac[i];
        }
        more = epxi_bal_or_lanes(more, nl) & ~reach;
        if (more == 0) break;
        reach |= more;
    }
    /* the level: the unfixed experts and graph GPUs that do not reach t */
    for (int32_t j = lane; j < p->nf; j += nl) {
        const int32_t i = p->fl[j], e = b->flex[i];
        if (b->f_level[i] != -1 || ((uint32_t)b->f_mask[i] & reach)) continue;
        b->f_level[i] = lv;
        for (int32_t k = 0; k < b->eg_n[e]; k++) {
            const size_t x = (size_t)i * (size_t)D + (size_t)k;
            b->f_flow[x] = epxi_bal_on(p, b->f_edge[x]);
        }
    }
    uint32_t fixed = 0;
    for (int32_t gi = lane; gi < p->ng; gi += nl) {
        const int32_t g = p->gl[gi];
        if (b->g_graph[g] && !(reach >> gi & 1u)) {
            b->g_level[g] = lv;
            fixed |= 1u << gi;
        }
    }
    fixed = epxi_bal_or_lanes(fixed, nl);
    /* the tight set sends only to its own GPUs, which carry exactly a each */
    int tight = fixed != 0;
    for (int32_t j = lane; j < p->nf && tight; j += nl) {
        const int32_t i = p->fl[j];
        if (b->f_level[i] == lv && ((uint32_t)b->f_frac[i] & ~fixed)) tight = 0;
    }
    if (!epxi_bal_all_lanes(tight, nl)) return EPXI_BAL_NO_TIGHT;
    /* lambda reduced, the level's flows divided with it (epxi_bal_fix) */
    const int64_t k = epxi_bal_gcd(a, den);
    if (k > 1) {
        int whole = 1;
        for (int32_t j = lane; j < p->nf; j += nl) {
            const int32_t i = p->fl[j], e = b->flex[i];
            if (b->f_level[i] != lv) continue;
            for (int32_t q = 0; q < b->eg_n[e]; q++) {
                const size_t x = (size_t)i * (size_t)D + (size_t)q;
                whole &= b->f_flow[x] % k == 0;
                b->f_flow[x] /= k;
            }
        }
        if (!epxi_bal_all_lanes(whole, nl)) return EPXI_BAL_SCALE;
        a /= k;
        den /= k;
    }
    if (lane == 0) {
        b->lv_num[lv] = a;
        b->lv_den[lv] = den;
    }
    EPXI_BAL_SYNCWARP(); /* the level's marks and lambda, before the next level reads them */
    return EPXI_BAL_OK;
}

/* One level: lambda of the unfixed part by Dinkelbach's iteration, then fix
 * its largest tight set. With the one-GPU experts merged into s -> g, an
 * unmerged expert on GPU g (count > 0) is reached from s exactly when g is
 * (its edge to g is unbounded; a saturated s -> e carries flow, whose
 * reverse leads back from g), so the cut's set S' takes g's base exactly
 * when s reaches g; and such experts reach t exactly when g does. */
EPXI_BAL int epxi_bal_level(epxi_bal *b, epxi_bal_part *p, int32_t lv, int lane, int nl) {
    for (int32_t j = lane; j < p->nf; j += nl) b->f_in[p->fl[j]] = b->f_level[p->fl[j]] == -1;
    for (int32_t gi = lane; gi < p->ng; gi += nl) {
        int32_t g = p->gl[gi];
        b->g_sin[g] = b->g_level[g] == -1 && b->base[g] > 0;
    }
    EPXI_BAL_SYNCWARP();
    epxi_bal_start(b, p, lv, lane, nl);
    /* The lanes share lambda's fraction (epxi_bal_ratio_lanes), the sets'
     * updates and, in a small enough part, each step's graph, greedy start
     * and BFS; lane 0 runs the blocking flows and tells the lanes through
     * c_say whether lambda is the level's. */
    int32_t *const say = b->c_say + p->lv0;
    int64_t a, den, a_prev = 0, den_prev = 1;
    for (int32_t step = 0;; step++) {
        epxi_bal_ratio_lanes(b, p, lv, lane, nl, &a, &den);
        if (den == 0 || step > p->ng + 1 || (step > 0 && a * den_prev <= a_prev * den))
            return EPXI_BAL_NO_ADVANCE;
        /* the first step builds the level's graph (by the lanes where the
         * part allows it), the others reuse it */
        const int lanes = nl > 1 && p->nf <= 32 && p->ng <= 32 && p->ng <= nl;
        int64_t need = 0, start = 0;
        if (lanes) {
            need = step == 0 ? epxi_bal_build_lanes(b, p, a, den, lane, nl)
                             : epxi_bal_recap_lanes(b, p, a, den, lane, nl);
#ifdef EPXI_BAL_LANES /* the test's check of both against the serial forms */
            if (lane == 0 && step == 0) epxi_bal_lanes_built(b, p, a, den, need);
            if (lane == 0) epxi_bal_lanes_keep(p);
            EPXI_BAL_SYNCWARP();
#endif
            start = epxi_bal_greedy_lanes(b, p, lane, nl);
#ifdef EPXI_BAL_LANES
            if (lane == 0) epxi_bal_lanes_greedy(p, start);
            EPXI_BAL_SYNCWARP();
#endif
        }
        const int lanes_flow = lanes && p->nf <= nl;
        const int64_t flow = lanes_flow ? epxi_bal_maxflow_lanes(b, p, lane, nl) : 0;
        if (lane == 0) {
            if (!lanes) {
                need = step == 0 ? epxi_bal_build(b, p, a, den) : epxi_bal_recap(b, p, a, den);
                start = epxi_bal_greedy(p, 0);
            }
            *say = start + (lanes_flow ? flow : epxi_bal_maxflow(p, 0, 1)) == need;
        }
        EPXI_BAL_SYNCWARP();
        if (*say) break;
        for (int32_t j = lane; j < p->nf; j += nl) {
            int32_t i = p->fl[j];
            b->f_in[i] = b->f_level[i] == -1 && p->lvl[EPXI_BAL_FN(j)] >= 0;
        }
        for (int32_t gi = lane; gi < p->ng; gi += nl) {
            int32_t g = p->gl[gi];
            b->g_sin[g] = b->g_level[g] == -1 && b->base[g] > 0 && p->lvl[EPXI_BAL_GN(p, gi)] >= 0;
        }
        a_prev = a;
        den_prev = den;
        EPXI_BAL_SYNCWARP(); /* the sets, before lane 0's next ratio reads them */
    }
    EPXI_BAL_SYNCWARP(); /* every lane has read *say before lane 0 says the next */
    if (p->ng <= 32) return epxi_bal_fix_lanes(b, p, lv, a, den, lane, nl);
    if (lane == 0) *say = epxi_bal_fix(b, p, lv, a, den);
    EPXI_BAL_SYNCWARP();
    return *say;
}

/* Integer flows within one token of the fractional ones, GPU loads within
 * one of theirs: a max-flow with lower bounds (balanced.c), per component. */
EPXI_BAL int epxi_bal_round(epxi_bal *b, epxi_bal_part *p) {
    int32_t D = b->D;
    epxi_bal_reset(p);
    int64_t need = 0, sum_lo = 0, total = 0;
    for (int32_t gi = 0; gi < p->ng; gi++) {
        int32_t g = p->gl[gi];
        b->gex[g] = b->base[g];
        total += b->base[g];
    }
    for (int32_t j = 0; j < p->nf; j++) {
        int32_t i = p->fl[j], e = b->flex[i];
        int64_t den = b->lv_den[b->f_level[i]], r = b->cnt[e];
        total += r;
        for (int32_t k = 0; k < b->eg_n[e]; k++) {
            size_t x = (size_t)i * (size_t)D + (size_t)k;
            int32_t g = b->eg_gpu[(size_t)e * (size_t)D + (size_t)k];
            int64_t lo = b->f_flow[x] / den;
            r -= lo;
            b->gex[g] += lo;
            b->f_edge[x] = b->f_flow[x] % den
                               ? epxi_bal_add(p, EPXI_BAL_FN(j), EPXI_BAL_GN(p, b->g_loc[g]), 1)
                               : -1;
        }
        if (r > 0) {
            epxi_bal_add(p, 0, EPXI_BAL_FN(j), r);
            need += r;
        }
    }
    for (int32_t gi = 0; gi < p->ng; gi++) {
        int32_t g = p->gl[gi], lv = b->g_level[g];
        int64_t lo = 0;
        if (lv >= 0) {
            lo = b->lv_num[lv] / b->lv_den[lv];
            if (b->lv_num[lv] % b->lv_den[lv]) epxi_bal_add(p, EPXI_BAL_GN(p, gi), 2, 1);
        }
        sum_lo += lo;
        int64_t x = b->gex[g] - lo;
        if (x > 0) {
            epxi_bal_add(p, 0, EPXI_BAL_GN(p, gi), x);
            need += x;
        } else if (x < 0) {
            epxi_bal_add(p, EPXI_BAL_GN(p, gi), 1, -x);
        }
    }
    if (total - sum_lo > 0) epxi_bal_add(p, 2, 1, total - sum_lo);
    if (epxi_bal_maxflow(p, 0, 1) != need) return EPXI_BAL_ROUNDING;
    for (int32_t j = 0; j < p->nf; j++) {
        int32_t i = p->fl[j], e = b->flex[i];
        int64_t den = b->lv_den[b->f_level[i]];
        for (int32_t k = 0; k < b->eg_n[e]; k++) {
            size_t x = (size_t)i * (size_t)D + (size_t)k;
            b->f_int[x] = b->f_flow[x] / den + epxi_bal_on(p, b->f_edge[x]);
        }
    }
    return EPXI_BAL_OK;
}

/* Component c: every level, then the rounding; sets c_levels[c] and
 * c_rc[c] and returns the latter. A lone GPU is its own level, no flow. By
 * lane `lane` of nl, all of them (the CPU: 0 of 1): lane 0 runs the
 * max-flows, the lanes share the loops over the part's experts and GPUs
 * (epxi_bal_level), and every lane takes the same path, from what lane 0
 * wrote before a barrier. */
EPXI_BAL_COLD int epxi_bal_solve_part(epxi_bal *b, int32_t c, int lane, int nl) {
    epxi_bal_part p = epxi_bal_view(b, c);
    for (int32_t j = lane; j < p.nf; j += nl) b->f_level[p.fl[j]] = -1;
    for (int32_t gi = lane; gi < p.ng; gi += nl) b->g_level[p.gl[gi]] = -1;
    if (p.nf == 0) { /* one GPU with a base */
        if (lane == 0) {
            b->g_level[p.gl[0]] = p.lv0;
            b->lv_num[p.lv0] = b->base[p.gl[0]];
            b->lv_den[p.lv0] = 1;
            b->c_levels[c] = 1;
            b->c_rc[c] = EPXI_BAL_OK;
        }
        EPXI_BAL_SYNCWARP();
        return EPXI_BAL_OK;
    }
    EPXI_BAL_SYNCWARP();
    int32_t levels = 0;
    int rc = EPXI_BAL_OK;
    for (;;) {
        int32_t left = 0; /* the same count on every lane: reads after a barrier */
        for (int32_t j = 0; j < p.nf; j++) left += b->f_level[p.fl[j]] == -1;
        for (int32_t gi = 0; gi < p.ng; gi++) {
            int32_t g = p.gl[gi];
            left += b->g_level[g] == -1 && b->base[g] > 0;
        }
        if (left == 0) break;
        if (levels >= p.ng) {
            rc = EPXI_BAL_LEVELS;
            break;
        }
        rc = epxi_bal_level(b, &p, p.lv0 + levels, lane, nl);
        if (rc != EPXI_BAL_OK) break;
        levels++;
    }
    if (lane == 0) {
        if (rc == EPXI_BAL_OK) rc = epxi_bal_round(b, &p);
        b->c_levels[c] = levels;
        b->c_rc[c] = rc;
    }
    EPXI_BAL_SYNCWARP();
    return b->c_rc[c];
}

#endif /* EPX_DISPATCH_BALANCED_FLOWS_H */
