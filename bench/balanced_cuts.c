/*
 * balanced_cuts.c - bench_balanced_cuts: a probe for issue 27's next design
 * step, not a solver epx uses. The balanced split's levels (the GPU loads
 * of the lexicographic optimum, balanced.c) are found today one level
 * after another, each by max-flows on everything not yet fixed: on
 * DeepSeek-V3's 32-GPU component that is a chain of tens of max-flows on
 * one GPU lane (bench/RESULTS.md). This probe finds the same levels by
 * cuts that split a part into independent parts:
 *
 *   a part (GPUs N, experts S, each expert's edges to its GPUs in N) at
 *   lambda = its average load is one level iff a max-flow saturates every
 *   expert with every GPU capped at lambda (then every GPU carries exactly
 *   lambda); otherwise the minimal min cut (what the source still reaches)
 *   holds the experts and GPUs above lambda, no flow crosses it, and the two
 *   sides are solved apart, side by side.
 *
 * "probes 0" probes each part at its average; "probes P" also asks P
 * max-flows of the part at once, at the P quantiles of its GPUs'
 * even-split loads, and cuts it into up to P + 2 bands (the minimal cuts of
 * a parametric flow are nested). Every max-flow of a round is independent
 * of the others: on the GPU a warp each. Printed per shape and batch size:
 * the reference's levels, and for each form whether every GPU's level
 * equals the reference's gpu_load (1e-9 relative; exit 1 if not), the
 * rounds (its parallel depth in max-flows), the max-flows in all, the most
 * in one round and the max-flows' nodes + edges summed (thousands). The
 * layers and batches are bench_balanced_shapes' (balanced_place.h), its
 * DeepSeek-V3 on 256 GPUs included.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epx.h"

#include "balanced_place.h"

enum { LAYERS = 16, K = 8 };
static const int64_t kInf = (int64_t)1 << 60;

/* ---- Dinic's max-flow ----------------------------------------------------------
 * The probe's own, plain and allocating, rather than balanced_flows.h's: it
 * is checked against that solver's results, so it shares none of its code. */

typedef struct {
    int32_t to, next;
    int64_t cap;
} edge;
typedef struct {
    int32_t n, m, cap_m;
    int32_t *head, *level, *it, *queue;
    edge *e;
} net;

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "bench_balanced_cuts: out of memory\n");
        exit(1);
    }
    return p;
}

static void net_init(net *g, int32_t n, int32_t edges) {
    g->n = n;
    g->m = 0;
    g->cap_m = 2 * edges;
    g->head = xmalloc(sizeof(int32_t) * (size_t)n);
    g->level = xmalloc(sizeof(int32_t) * (size_t)n);
    g->it = xmalloc(sizeof(int32_t) * (size_t)n);
    g->queue = xmalloc(sizeof(int32_t) * (size_t)n);
    g->e = xmalloc(sizeof(edge) * (size_t)g->cap_m);
    for (int32_t i = 0; i < n; i++) g->head[i] = -1;
}

static void net_free(net *g) {
    free(g->head);
    free(g->level);
    free(g->it);
    free(g->queue);
    free(g->e);
}

static void add_edge(net *g, int32_t u, int32_t v, int64_t c) {
    g->e[g->m] = (edge){v, g->head[u], c};
    g->head[u] = g->m++;
    g->e[g->m] = (edge){u, g->head[v], 0};
    g->head[v] = g->m++;
}

/* BFS levels from s over edges with room; 1 when t is reached. */
static int bfs(net *g, int32_t s, int32_t t) {
    for (int32_t i = 0; i < g->n; i++) g->level[i] = -1;
    int32_t qh = 0, qt = 0;
    g->level[s] = 0;
    g->queue[qt++] = s;
    while (qh < qt) {
        int32_t u = g->queue[qh++];
        for (int32_t k = g->head[u]; k >= 0; k = g->e[k].next)
            if (g->e[k].cap > 0 && g->level[g->e[k].to] < 0) {
                g->level[g->e[k].to] = g->level[u] + 1;
                g->queue[qt++] = g->e[k].to;
            }
    }
    return g->level[t] >= 0;
}

static int64_t dfs(net *g, int32_t u, int32_t t, int64_t f) {
    if (u == t) return f;
    for (; g->it[u] >= 0; g->it[u] = g->e[g->it[u]].next) {
        edge *a = &g->e[g->it[u]];
        if (a->cap > 0 && g->level[a->to] == g->level[u] + 1) {
            int64_t d = dfs(g, a->to, t, f < a->cap ? f : a->cap);
            if (d > 0) {
                a->cap -= d;
                g->e[g->it[u] ^ 1].cap += d;
                return d;
            }
        }
    }
    return 0;
}

static int64_t maxflow(net *g, int32_t s, int32_t t) {
    int64_t flow = 0;
    while (bfs(g, s, t)) {
        for (int32_t i = 0; i < g->n; i++) g->it[i] = g->head[i];
        for (int64_t f; (f = dfs(g, s, t, kInf)) > 0;) flow += f;
    }
    return flow;
}

/* ---- the reduced problem and its parts ------------------------------------------- */

typedef struct {
    int32_t G, M, D; /* GPUs; flexible experts (tokens on two GPUs or more); list width */
    int64_t *base;   /* [G] tokens of experts with one GPU */
    int64_t *cnt;    /* [M] */
    int32_t *deg;    /* [M] an expert's distinct GPUs */
    int32_t *gl;     /* [M][D] them, ascending */
} problem;

typedef struct {
    int32_t ng, ne;
    int32_t *g, *e; /* GPU ids, expert ids */
} part;

typedef struct {
    int64_t rounds, flows, widest, work; /* work: the max-flows' nodes + edges, summed */
} tally;

/* The max-flow of part p with every GPU capped at num / den; marks in
 * up_g / up_e (indexed by GPU and expert id) what the source still reaches
 * (the minimal min cut's source side) and GPUs whose base alone is above
 * the cap. loc [G]: -1, and back to -1 after. Returns 1 when every expert
 * is saturated. */
static int probe(const problem *pr, const part *p, int64_t num, int64_t den, uint8_t *up_g,
                 uint8_t *up_e, int32_t *loc, tally *ty) {
    const int32_t s = 0, t = 1, n = 2 + p->ne + p->ng;
    for (int32_t j = 0; j < p->ng; j++) loc[p->g[j]] = j;
    int32_t edges = p->ne + p->ng;
    for (int32_t i = 0; i < p->ne; i++)
        for (int32_t k = 0; k < pr->deg[p->e[i]]; k++)
            edges += loc[pr->gl[(size_t)p->e[i] * pr->D + k]] >= 0;
    net g;
    net_init(&g, n, edges);
    int64_t want = 0;
    for (int32_t i = 0; i < p->ne; i++) {
        add_edge(&g, s, 2 + i, den * pr->cnt[p->e[i]]);
        want += den * pr->cnt[p->e[i]];
        for (int32_t k = 0; k < pr->deg[p->e[i]]; k++) {
            const int32_t j = loc[pr->gl[(size_t)p->e[i] * pr->D + k]];
            if (j >= 0) add_edge(&g, 2 + i, 2 + p->ne + j, kInf);
        }
    }
    int over = 0;
    for (int32_t j = 0; j < p->ng; j++) {
        int64_t room = num - den * pr->base[p->g[j]];
        over |= room < 0;
        add_edge(&g, 2 + p->ne + j, t, room > 0 ? room : 0);
    }
    int64_t got = maxflow(&g, s, t);
    ty->flows++;
    ty->work += g.n + g.m;
    for (int32_t j = 0; j < p->ng; j++) loc[p->g[j]] = -1;
    (void)bfs(&g, s, t); /* levels = reach from s in the residual graph */
    for (int32_t i = 0; i < p->ne; i++) up_e[p->e[i]] = g.level[2 + i] >= 0;
    for (int32_t j = 0; j < p->ng; j++)
        up_g[p->g[j]] = g.level[2 + p->ne + j] >= 0 || num < den * pr->base[p->g[j]];
    net_free(&g);
    return got == want && !over;
}

static int64_t part_total(const problem *pr, const part *p) {
    int64_t tot = 0;
    for (int32_t j = 0; j < p->ng; j++) tot += pr->base[p->g[j]];
    for (int32_t i = 0; i < p->ne; i++) tot += pr->cnt[p->e[i]];
    return tot;
}

/* The parts of p by band (band_g / band_e per id, 0 .. nb - 1), each
 * expert keeping its GPUs of its own band; appended to out. */
static void split(const part *p, const int32_t *band_g, const int32_t *band_e, int32_t nb,
                  part *out, int32_t *nout) {
    for (int32_t b = 0; b < nb; b++) {
        part q = {0, 0, xmalloc(sizeof(int32_t) * (size_t)p->ng),
                  xmalloc(sizeof(int32_t) * (size_t)(p->ne + 1))};
        for (int32_t j = 0; j < p->ng; j++)
            if (band_g[p->g[j]] == b) q.g[q.ng++] = p->g[j];
        for (int32_t i = 0; i < p->ne; i++)
            if (band_e[p->e[i]] == b) q.e[q.ne++] = p->e[i];
        if (q.ng > 0) {
            out[(*nout)++] = q;
        } else {
            free(q.g);
            free(q.e);
        }
    }
}

/* Every GPU's level (as num / den) by rounds of cuts; nprobe = 0: each part
 * at its average, else nprobe quantiles of its even-split loads too. */
static int levels_by_cuts(const problem *pr, int32_t nprobe, double *level, tally *ty) {
    const int32_t G = pr->G;
    part *cur = xmalloc(sizeof(part) * (size_t)G), *next = xmalloc(sizeof(part) * (size_t)G);
    int32_t ncur = 1;
    cur[0] = (part){G, pr->M, xmalloc(sizeof(int32_t) * (size_t)G),
                    xmalloc(sizeof(int32_t) * (size_t)(pr->M + 1))};
    for (int32_t g = 0; g < G; g++) cur[0].g[g] = g;
    for (int32_t i = 0; i < pr->M; i++) cur[0].e[i] = i;
    uint8_t *up_g = xmalloc((size_t)G), *up_e = xmalloc((size_t)pr->M + 1);
    int32_t *band_g = xmalloc(sizeof(int32_t) * (size_t)G);
    int32_t *band_e = xmalloc(sizeof(int32_t) * (size_t)(pr->M + 1));
    double *even = xmalloc(sizeof(double) * (size_t)G);
    int32_t *loc = xmalloc(sizeof(int32_t) * (size_t)G);
    for (int32_t g = 0; g < G; g++) loc[g] = -1;
    memset(ty, 0, sizeof *ty);
    int rc = 0;
    while (ncur > 0 && rc == 0) {
        int32_t nnext = 0, in_round = 0;
        ty->rounds++;
        for (int32_t c = 0; c < ncur && rc == 0; c++) {
            part *p = &cur[c];
            const int64_t tot = part_total(pr, p);
            in_round++;
            if (probe(pr, p, tot, p->ng, up_g, up_e, loc, ty)) { /* one level */
                for (int32_t j = 0; j < p->ng; j++) level[p->g[j]] = (double)tot / (double)p->ng;
                continue;
            }
            for (int32_t j = 0; j < p->ng; j++) band_g[p->g[j]] = up_g[p->g[j]];
            for (int32_t i = 0; i < p->ne; i++) band_e[p->e[i]] = up_e[p->e[i]];
            int32_t nb = 2;
            if (nprobe > 0 && p->ng > 2) {
                /* the even split's loads, sorted: their quantiles are the probes */
                for (int32_t j = 0; j < p->ng; j++) even[j] = (double)pr->base[p->g[j]];
                for (int32_t j = 0; j < p->ng; j++) loc[p->g[j]] = j;
                for (int32_t i = 0; i < p->ne; i++) {
                    const int32_t *gs = pr->gl + (size_t)p->e[i] * pr->D;
                    int32_t deg = 0;
                    for (int32_t k = 0; k < pr->deg[p->e[i]]; k++) deg += loc[gs[k]] >= 0;
                    for (int32_t k = 0; k < pr->deg[p->e[i]]; k++)
                        if (loc[gs[k]] >= 0) even[loc[gs[k]]] += (double)pr->cnt[p->e[i]] / deg;
                }
                for (int32_t j = 0; j < p->ng; j++) loc[p->g[j]] = -1;
                for (int32_t a = 1; a < p->ng; a++) /* insertion sort */
                    for (int32_t b = a; b > 0 && even[b - 1] > even[b]; b--) {
                        double x = even[b];
                        even[b] = even[b - 1];
                        even[b - 1] = x;
                    }
                const int64_t Q = (int64_t)1 << 20;
                for (int32_t k = 1; k <= nprobe; k++) {
                    double lam = even[(int64_t)k * (p->ng - 1) / (nprobe + 1)];
                    in_round++;
                    (void)probe(pr, p, (int64_t)llround(lam * (double)Q), Q, up_g, up_e, loc, ty);
                    for (int32_t j = 0; j < p->ng; j++) band_g[p->g[j]] += up_g[p->g[j]];
                    for (int32_t i = 0; i < p->ne; i++) band_e[p->e[i]] += up_e[p->e[i]];
                }
                nb = nprobe + 2;
            }
            int32_t before = nnext;
            split(p, band_g, band_e, nb, next, &nnext);
            if (nnext - before < 2) rc = 1; /* a cut that splits nothing: not a decomposition */
        }
        if (in_round > ty->widest) ty->widest = in_round;
        for (int32_t c = 0; c < ncur; c++) {
            free(cur[c].g);
            free(cur[c].e);
        }
        part *sw = cur;
        cur = next;
        next = sw;
        ncur = rc == 0 ? nnext : 0;
    }
    free(cur);
    free(next);
    free(up_g);
    free(up_e);
    free(band_g);
    free(band_e);
    free(even);
    free(loc);
    return rc;
}

/* The reduced problem of one batch: experts on one GPU folded into its base. */
static void reduce(int32_t E, int32_t W, int32_t per, int32_t G, const int32_t *rep,
                   const int32_t *nv, const int64_t *cnt, problem *pr) {
    pr->G = G;
    pr->M = 0;
    pr->D = W;
    memset(pr->base, 0, sizeof(int64_t) * (size_t)G);
    for (int32_t e = 0; e < E; e++) {
        if (cnt[e] == 0) continue;
        int32_t *gs = pr->gl + (size_t)pr->M * W, d = 0;
        for (int32_t j = 0; j < nv[e]; j++) { /* distinct GPUs, ascending */
            int32_t g = rep[e * W + j] / per, k = d;
            while (k > 0 && gs[k - 1] > g) k--;
            if (k > 0 && gs[k - 1] == g) continue;
            memmove(gs + k + 1, gs + k, sizeof(int32_t) * (size_t)(d - k));
            gs[k] = g;
            d++;
        }
        if (d == 1) {
            pr->base[gs[0]] += cnt[e];
        } else {
            pr->cnt[pr->M] = cnt[e];
            pr->deg[pr->M++] = d;
        }
    }
}

int main(void) {
    static const int32_t Ts[] = {1, 16, 128, 512, 1024, 4096};
    static const int32_t probes[] = {0, 3, 7};
    printf("%-12s %5s %7s", "shape", "T", "levels");
    for (size_t k = 0; k < sizeof probes / sizeof probes[0]; k++)
        printf("   probes %d: rounds flows widest kwork", probes[k]);
    printf("\n");
    int status = 0; /* 1: some form's levels differ from the reference's */
    /* bench_balanced_shapes' shapes in its order (so the same draws), the
     * last DeepSeek-V3 on 256 GPUs with its 512 slots anywhere */
    static const struct bal_shape wide = {"ds-v3-256", 256, 512, 256, 1};
    for (size_t si = 0; si <= BAL_SHAPES; si++) {
        const struct bal_shape *shp = si < BAL_SHAPES ? &bal_shapes[si] : &wide;
        const int32_t E = shp->E, P = shp->P, G = shp->G, W = P - E + 1;
        int32_t *rep = xmalloc(4 * (size_t)E * W), *nv = xmalloc(4 * (size_t)E);
        make_place(E, P, W, shp->nodes, rep, nv);
        epx_balancer *bal = NULL;
        epx_error err = {0};
        if (epx_dispatch_balanced_create(E, W, P, G, &bal, &err) != EPX_OK) {
            fprintf(stderr, "bench_balanced_cuts: %s\n", err.msg);
            return 1;
        }
        double *ref = xmalloc(sizeof(double) * (size_t)G), *mine = xmalloc(sizeof(double) * G);
        problem pr = {G,
                      0,
                      W,
                      xmalloc(8 * (size_t)G),
                      xmalloc(8 * (size_t)E),
                      xmalloc(4 * (size_t)E),
                      xmalloc(4 * (size_t)E * (size_t)W)};
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            const int32_t T = Ts[ti];
            const size_t n = (size_t)T * K;
            int32_t *ids = xmalloc(4 * n * LAYERS);
            int64_t *cnt = xmalloc(8 * (size_t)E * LAYERS);
            for (size_t i = 0; i < n * LAYERS; i++) { /* as bench/balanced.cu draws them */
                double u = unif();
                ids[i] = (int32_t)((double)E * u * u);
            }
            double lv = 0, sum[3][4] = {{0}};
            int ok[3] = {1, 1, 1};
            for (int l = 0; l < LAYERS; l++) {
                int64_t *c = cnt + (size_t)l * E;
                epx_balanced_out o = {0};
                o.gpu_load = ref;
                if (epx_dispatch_count_ids(ids + (size_t)l * n, T, K, E, c, &err) != EPX_OK ||
                    epx_dispatch_balanced_solve(bal, rep, nv, c, &o, &err) != EPX_OK) {
                    fprintf(stderr, "bench_balanced_cuts: %s\n", err.msg);
                    return 1;
                }
                lv += o.num_levels;
                reduce(E, W, P / G, G, rep, nv, c, &pr);
                for (size_t k = 0; k < 3; k++) {
                    tally ty;
                    if (levels_by_cuts(&pr, probes[k], mine, &ty) != 0) ok[k] = 0;
                    for (int32_t g = 0; g < G; g++)
                        if (fabs(mine[g] - ref[g]) > 1e-9 * (1.0 + fabs(ref[g]))) ok[k] = 0;
                    sum[k][0] += (double)ty.rounds;
                    sum[k][1] += (double)ty.flows;
                    sum[k][2] += (double)ty.widest;
                    sum[k][3] += (double)ty.work / 1000.0;
                }
            }
            printf("%-12s %5d %7.1f", shp->name, T, lv / LAYERS);
            for (size_t k = 0; k < 3; k++)
                printf("   %9s %6.1f %5.1f %6.1f %5.1f", ok[k] ? "equal" : "DIFFERENT",
                       sum[k][0] / LAYERS, sum[k][1] / LAYERS, sum[k][2] / LAYERS,
                       sum[k][3] / LAYERS);
            printf("\n");
            free(ids);
            free(cnt);
            if (!ok[0] || !ok[1] || !ok[2]) status = 1;
        }
        epx_dispatch_balanced_destroy(bal);
        free(rep);
        free(nv);
        free(ref);
        free(mine);
        free(pr.base);
        free(pr.cnt);
        free(pr.deg);
        free(pr.gl);
    }
    return status;
}
