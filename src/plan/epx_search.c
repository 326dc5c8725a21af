/*
 * epx_search.c - the per-layer engine of epx's placement: replica counts and
 * their packing onto GPUs chosen together, by local search on the max GPU
 * load (each expert's load split evenly over its replicas).
 *
 * Why not DeepSeek's two steps: its replica counts minimise the largest load
 * per replica, and its packing then puts largest replicas first onto the
 * lightest GPU with room. Neither step sees the other, so the max GPU load
 * is often set by an unlucky combination that a different count (one more
 * replica for a hot expert on the worst GPU, one less for a lukewarm one
 * elsewhere) or a single exchange of two replicas would fix; and its packing
 * may put two replicas of one expert on one GPU, which wastes a slot.
 *
 * The state is a map slot -> expert with, per expert, a linked list of its
 * slots (replica counts are small, so "does GPU g hold e" walks that list),
 * and the GPU loads, updated incrementally. Moves, all centred on the most
 * loaded GPU gmax (it is the one that sets the objective):
 *  - swap: exchange a replica on gmax with a lighter one on another GPU h;
 *    the best pair brings both loads nearest their mean. GPUs h are tried
 *    lightest first, and a GPU whose best possible outcome, (L_max + L_h)/2,
 *    cannot beat the best move found is skipped.
 *  - split: an expert x on gmax gains a replica in a slot on another GPU
 *    whose expert y has >= 2 replicas (y loses one): every GPU holding x
 *    gets lighter, those holding y heavier.
 *  - merge: a slot on gmax whose expert y has >= 2 replicas is given to the
 *    expert with the smallest load per replica after the change.
 * A move is taken only when every GPU it touches ends strictly below the
 * current max, so the max never rises and each move either lowers it or
 * removes one GPU from the set that reaches it: the search cannot cycle.
 * No move creates two replicas of one expert on a GPU. Partners are tried
 * lightest first and the first that yields an improving swap is used
 * (first improvement: cheaper per move, and measured no worse than the
 * best partner). Re-counts are searched only when no swap helps.
 *
 * Speed: GPUs are kept ordered by load, and each GPU's slots by replica
 * load (and by constraint load when there is one), updated per move rather
 * than re-sorted; a table [E][G] answers "does GPU g hold e" in one load.
 * A second load (the constraint) lets the caller optimise an estimate of
 * the next window while the summed load stays within DeepSeek's max: then
 * the partner search looks up replicas by constraint load, the condition
 * that binds.
 *
 * Node locality: each expert may have a home node (its group's). Replicas
 * off it are "foreign"; at most `budget` of them may exist (0 = strict) and
 * every expert keeps at least one replica at home.
 */
#include "epx_algo.h"

#include <assert.h>
#include <math.h>
#include <string.h>

struct epxi_search {
    int32_t E, P, G, K, N, gpn;
    const double *w;
    const int32_t *home;
    int32_t budget, foreign;
    bool recount;      /* re-count moves allowed (off only to measure them) */
    double target;     /* improve stops once the max GPU load is <= target */
    int32_t *slot;     /* [P] expert in each slot */
    int32_t *gpu;      /* [P] GPU of each slot, p / K (a load, not a division) */
    int32_t *gnode;    /* [G] node of each GPU, g / gpn (likewise) */
    int32_t *xs;       /* [2 K] best_swap's lists of gmax's slots: 0..K-1, then those
                          free to leave the node */
    int32_t *cnt;      /* [E] replica count */
    int32_t *first;    /* [E] first slot of each expert's list, -1 */
    int32_t *next;     /* [P] next slot of the same expert, -1 */
    int32_t *home_cnt; /* [E] replicas on the home node */
    uint16_t *eg;      /* [E][G] replicas of each expert on each GPU, or NULL when
                          E * G is too large (then the lists are walked) */
    double *load;      /* [G] */
    const double *w2;  /* [E] constraint load, or NULL */
    double cap2;       /* every GPU's constraint load stays <= cap2 */
    double *load2;     /* [G] constraint loads */
    double *delta;     /* [G] scratch for evaluating re-counts */
    double *delta2;    /* [G] the same for the constraint load */
    int32_t *stamp;    /* [G] which evaluation delta[g] belongs to */
    int32_t *tlist;    /* [G] GPUs touched by the evaluation */
    int32_t ntouch, cur_stamp;
    int32_t *fill;           /* [G] slots used while packing */
    int32_t *idx, *tmp;      /* [P] sort scratch */
    double *key;             /* [P] sort keys */
    int32_t *heap;           /* [E] max-heap for replica counts */
    int32_t *multi;          /* [P] slots whose expert has >= 2 replicas */
    int32_t *cand;           /* [E] experts by load per replica (merge targets) */
    int32_t *cand_mark;      /* [E] stamp: expert is on gmax */
    int32_t *top_mark;       /* [E] stamp: best_recount's top1/top2 of the expert are current */
    int32_t *top_slot;       /* [E] the slot on the GPU of top1 (and of top1_2) */
    double *top1, *top2;     /* [E] the largest two loads of the expert's GPUs (a multiset) */
    int32_t *top_slot2;      /* [E] */
    double *top1_2, *top2_2; /* [E] the same under the constraint load */
    int32_t *sorted;         /* [P] per GPU, its slots by ascending replica load */
    int32_t *sorted2;        /* [P] the same by constraint load (only with w2) */
    double *rl;              /* [P] replica load of each slot, valid where sorted is */
    double *rl2;             /* [P] the same under the constraint load */
    int32_t dups;            /* slots sharing their GPU with another replica of their expert */
    uint8_t *sorted_ok;      /* [G] whether the GPU's entries in sorted/rl are current */
    int32_t *gorder;         /* [G] GPUs by ascending load (ties: lower id first) */
    bool gorder_ok;
    int32_t *hp;    /* [G] per-node min-heaps of GPUs with room (packing) */
    int32_t *hsize; /* [N] */
};

epx_status epxi_search_create(int32_t E, int32_t P, int32_t G, int32_t N, epxi_search **out,
                              epx_error *err) {
    epxi_search *s = epxi_calloc(1, sizeof *s, "placement search state", err);
    if (s == NULL) return EPX_ERR_NOMEM;
    s->E = E, s->P = P, s->G = G, s->K = P / G, s->N = N, s->gpn = G / N;
    size_t e = (size_t)E, p = (size_t)P, g = (size_t)G;
    s->slot = epxi_calloc(p, sizeof(int32_t), "placement search slots", err);
    s->gpu = epxi_calloc(p, sizeof(int32_t), "placement search slot GPUs", err);
    s->gnode = epxi_calloc(g, sizeof(int32_t), "placement search GPU nodes", err);
    s->xs = epxi_calloc(2 * (size_t)s->K, sizeof(int32_t), "placement search slot lists", err);
    s->cnt = epxi_calloc(e, sizeof(int32_t), "placement search counts", err);
    s->first = epxi_calloc(e, sizeof(int32_t), "placement search lists", err);
    s->next = epxi_calloc(p, sizeof(int32_t), "placement search lists", err);
    s->home_cnt = epxi_calloc(e, sizeof(int32_t), "placement search home counts", err);
    if (e * g <= ((size_t)1 << 22) && P <= UINT16_MAX)
        s->eg = epxi_calloc(e * g, sizeof(uint16_t), "placement search replica table", err);
    s->load = epxi_calloc(g, sizeof(double), "placement search loads", err);
    s->delta = epxi_calloc(g, sizeof(double), "placement search deltas", err);
    s->load2 = epxi_calloc(g, sizeof(double), "placement search loads", err);
    s->delta2 = epxi_calloc(g, sizeof(double), "placement search deltas", err);
    s->stamp = epxi_calloc(g, sizeof(int32_t), "placement search stamps", err);
    s->tlist = epxi_calloc(g, sizeof(int32_t), "placement search touched GPUs", err);
    s->fill = epxi_calloc(g, sizeof(int32_t), "placement search fill", err);
    s->idx = epxi_calloc(p, sizeof(int32_t), "placement search sort index", err);
    s->tmp = epxi_calloc(p, sizeof(int32_t), "placement search sort scratch", err);
    s->key = epxi_calloc(p, sizeof(double), "placement search sort keys", err);
    s->heap = epxi_calloc(e, sizeof(int32_t), "placement search heap", err);
    s->multi = epxi_calloc(p, sizeof(int32_t), "placement search multi-replica slots", err);
    s->cand = epxi_calloc(e, sizeof(int32_t), "placement search candidates", err);
    s->cand_mark = epxi_calloc(e, sizeof(int32_t), "placement search candidates", err);
    s->top_mark = epxi_calloc(e, sizeof(int32_t), "placement search expert maxima", err);
    s->top_slot = epxi_calloc(e, sizeof(int32_t), "placement search expert maxima", err);
    s->top_slot2 = epxi_calloc(e, sizeof(int32_t), "placement search expert maxima", err);
    s->top1 = epxi_calloc(e, sizeof(double), "placement search expert maxima", err);
    s->top2 = epxi_calloc(e, sizeof(double), "placement search expert maxima", err);
    s->top1_2 = epxi_calloc(e, sizeof(double), "placement search expert maxima", err);
    s->top2_2 = epxi_calloc(e, sizeof(double), "placement search expert maxima", err);
    s->sorted = epxi_calloc(p, sizeof(int32_t), "placement search order", err);
    s->sorted2 = epxi_calloc(p, sizeof(int32_t), "placement search order", err);
    s->rl = epxi_calloc(p, sizeof(double), "placement search replica loads", err);
    s->rl2 = epxi_calloc(p, sizeof(double), "placement search replica loads", err);
    s->sorted_ok = epxi_calloc(g, sizeof(uint8_t), "placement search order flags", err);
    s->gorder = epxi_calloc(g, sizeof(int32_t), "placement search GPU order", err);
    s->hp = epxi_calloc(g, sizeof(int32_t), "placement search GPU heap", err);
    s->hsize = epxi_calloc((size_t)N, sizeof(int32_t), "placement search GPU heap", err);
    if (!s->slot || !s->gpu || !s->gnode || !s->xs || !s->cnt || !s->first || !s->next ||
        !s->home_cnt || !s->load || !s->delta || !s->load2 || !s->delta2 || !s->stamp ||
        !s->tlist || !s->fill || !s->idx || !s->tmp || !s->key || !s->heap || !s->multi ||
        !s->cand || !s->cand_mark || !s->top_mark || !s->top_slot || !s->top_slot2 || !s->top1 ||
        !s->top2 || !s->top1_2 || !s->top2_2 || !s->sorted || !s->sorted2 || !s->rl || !s->rl2 ||
        !s->sorted_ok || !s->gorder || !s->hp || !s->hsize) {
        epxi_search_destroy(s);
        return EPX_ERR_NOMEM;
    }
    for (int32_t q = 0; q < P; q++) s->gpu[q] = q / s->K;
    for (int32_t q = 0; q < G; q++) s->gnode[q] = q / s->gpn;
    for (int32_t i = 0; i < s->K; i++) s->xs[i] = i;
    *out = s;
    return EPX_OK;
}

void epxi_search_destroy(epxi_search *s) {
    if (s == NULL) return;
    free(s->slot), free(s->gpu), free(s->gnode), free(s->xs), free(s->eg), free(s->cnt),
        free(s->first), free(s->next), free(s->home_cnt);
    free(s->load), free(s->delta), free(s->load2), free(s->delta2), free(s->stamp), free(s->tlist),
        free(s->fill);
    free(s->idx), free(s->tmp), free(s->key), free(s->heap), free(s->multi), free(s->cand);
    free(s->sorted), free(s->sorted2), free(s->rl), free(s->rl2), free(s->sorted_ok),
        free(s->cand_mark);
    free(s->top_mark), free(s->top_slot), free(s->top_slot2), free(s->top1), free(s->top2),
        free(s->top1_2), free(s->top2_2);
    free(s->gorder), free(s->hp), free(s->hsize);
    free(s);
}

void epxi_search_begin(epxi_search *s, const double *w, const int32_t *home, int32_t budget) {
    s->w = w;
    s->w2 = NULL;
    s->cap2 = 0.0;
    s->recount = true;
    s->target = -HUGE_VAL;
    s->home = home;
    s->budget = home ? budget : 0;
}

/* ---- small queries ---------------------------------------------------------- */

static inline int32_t gpu_of(const epxi_search *s, int32_t slot) { return s->gpu[slot]; }

static inline bool at_home(const epxi_search *s, int32_t e, int32_t g) {
    return s->home == NULL || s->gnode[g] == s->home[e];
}

static inline double per_replica(const epxi_search *s, int32_t e) { return s->w[e] / s->cnt[e]; }

static inline double per_replica2(const epxi_search *s, int32_t e) { return s->w2[e] / s->cnt[e]; }

/* GPU a is lighter than b: by load, then by id. */
static inline bool lighter(const epxi_search *s, int32_t a, int32_t b) {
    const double la = s->load[a], lb = s->load[b];
    return (la < lb) | ((la == lb) & (a < b)); /* no branches of its own */
}

/* Replicas of e on GPU g. */
static inline int32_t on_gpu(const epxi_search *s, int32_t e, int32_t g) {
    if (s->eg) return s->eg[(size_t)e * s->G + g];
    int32_t n = 0;
    for (int32_t q = s->first[e]; q >= 0; q = s->next[q]) n += gpu_of(s, q) == g;
    return n;
}

static void list_remove(epxi_search *s, int32_t e, int32_t slot) {
    if (s->eg) s->eg[(size_t)e * s->G + s->gpu[slot]]--;
    int32_t *pp = &s->first[e];
    while (*pp != slot) pp = &s->next[*pp];
    *pp = s->next[slot];
}

static void list_push(epxi_search *s, int32_t e, int32_t slot) {
    if (s->eg) s->eg[(size_t)e * s->G + s->gpu[slot]]++;
    s->next[slot] = s->first[e];
    s->first[e] = slot;
}

/* Zero the replica table where the current slots have entries (cheaper
 * than clearing all of it; the table always matches s->slot between
 * calls). */
static void eg_clear(epxi_search *s) {
    if (s->eg == NULL) return;
    for (int32_t p = 0; p < s->P; p++) s->eg[(size_t)s->slot[p] * s->G + s->gpu[p]] = 0;
}

static void recompute_loads(epxi_search *s);

/* Rebuild lists, counts, home counts and loads from s->slot. */
static void rebuild(epxi_search *s) {
    eg_clear(s);
    for (int32_t e = 0; e < s->E; e++) s->cnt[e] = 0, s->first[e] = -1, s->home_cnt[e] = 0;
    s->foreign = 0;
    for (int32_t p = s->P - 1; p >= 0; p--) {
        int32_t e = s->slot[p];
        s->cnt[e]++;
        list_push(s, e, p);
        if (at_home(s, e, gpu_of(s, p)))
            s->home_cnt[e]++;
        else
            s->foreign++;
    }
    s->dups = 0;
    for (int32_t p = 0; p < s->P; p++)
        for (int32_t q = s->next[p]; q >= 0; q = s->next[q]) /* lists ascend by slot */
            if (q / s->K == p / s->K) s->dups++;
    for (int32_t g = 0; g < s->G; g++) s->sorted_ok[g] = 0;
    recompute_loads(s);
}

/* Exact GPU loads from the slots; the GPU order must be rebuilt. */
static void recompute_loads(epxi_search *s) {
    for (int32_t g = 0; g < s->G; g++) {
        double l = 0.0, l2 = 0.0;
        for (int32_t k = 0; k < s->K; k++) {
            l += per_replica(s, s->slot[g * s->K + k]);
            if (s->w2) l2 += per_replica2(s, s->slot[g * s->K + k]);
        }
        s->load[g] = l;
        s->load2[g] = l2;
    }
    s->gorder_ok = false;
}

void epxi_search_allow_recount(epxi_search *s, bool on) { s->recount = on; }

void epxi_search_set_target(epxi_search *s, double target) { s->target = target; }

void epxi_search_constrain(epxi_search *s, const double *w2, double cap2) {
    s->w2 = w2;
    s->cap2 = cap2;
    for (int32_t g = 0; g < s->G; g++) {
        double l2 = 0.0;
        for (int32_t k = 0; k < s->K; k++) l2 += per_replica2(s, s->slot[g * s->K + k]);
        s->load2[g] = l2;
        s->sorted_ok[g] = 0; /* rl2 of the cached orders is stale */
    }
}

double epxi_search_max_load(const epxi_search *s) {
    double mx = 0.0;
    for (int32_t g = 0; g < s->G; g++)
        if (s->load[g] > mx) mx = s->load[g];
    return mx;
}

double epxi_search_max_load2(const epxi_search *s) {
    double mx = 0.0;
    for (int32_t g = 0; g < s->G; g++)
        if (s->load2[g] > mx) mx = s->load2[g];
    return mx;
}

/* ---- initial solutions ------------------------------------------------------- */

/* Max-heap of experts keyed by load per replica (v[e], cached), ties to
 * the lower id. */
static inline bool heap_above(const double *v, int32_t a, int32_t b) {
    const double va = v[a], vb = v[b];
    return (va > vb) | ((va == vb) & (a < b));
}

static void heap_down(const double *v, int32_t *h, int32_t n, int32_t i) {
    for (;;) {
        const int32_t l = 2 * i + 1;
        if (l >= n) return;
        /* the larger child (the left on a tie, as before), then the test */
        const int32_t c = l + ((l + 1 < n) && heap_above(v, h[l + 1], h[l]));
        if (!heap_above(v, h[c], h[i])) return;
        const int32_t t = h[i];
        h[i] = h[c], h[c] = t, i = c;
    }
}

/* Give `extra` more replicas to the experts in h[0..n) (counts already 1),
 * each to the one with the largest load per replica. s->key (indexed by
 * expert, E <= P) caches the loads per replica. */
static void assign_counts(epxi_search *s, int32_t *h, int32_t n, int32_t extra) {
    double *v = s->key;
    for (int32_t i = 0; i < n; i++) v[h[i]] = s->w[h[i]];
    for (int32_t i = n / 2 - 1; i >= 0; i--) heap_down(v, h, n, i);
    for (int32_t r = 0; r < extra; r++) {
        const int32_t e = h[0];
        s->cnt[e]++;
        v[e] = s->w[e] / s->cnt[e];
        heap_down(v, h, n, 0);
    }
}

/* Min-heap of GPUs keyed by (load, id). */
static void heap_push_gpu(const epxi_search *s, int32_t *h, int32_t *n, int32_t g) {
    int32_t i = (*n)++;
    while (i > 0) {
        int32_t up = (i - 1) / 2;
        if (!lighter(s, g, h[up])) break;
        h[i] = h[up], i = up;
    }
    h[i] = g;
}

static int32_t heap_pop_gpu(const epxi_search *s, int32_t *h, int32_t *n) {
    const int32_t top = h[0], last = h[--(*n)];
    int32_t i = 0;
    for (;;) {
        const int32_t l = 2 * i + 1;
        if (l >= *n) break;
        const int32_t m = l + ((l + 1 < *n) && lighter(s, h[l + 1], h[l]));
        if (!lighter(s, h[m], last)) break;
        h[i] = h[m], i = m;
    }
    if (*n > 0) h[i] = last;
    return top;
}

void epxi_search_init_lpt(epxi_search *s) {
    const int32_t E = s->E, P = s->P, G = s->G, K = s->K;
    for (int32_t e = 0; e < E; e++) s->cnt[e] = 1;
    if (s->home == NULL) {
        for (int32_t e = 0; e < E; e++) s->heap[e] = e;
        assign_counts(s, s->heap, E, P - E);
    } else {
        for (int32_t n = 0; n < s->N; n++) {
            int32_t m = 0;
            for (int32_t e = 0; e < E; e++)
                if (s->home[e] == n) s->heap[m++] = e;
            int32_t extra = s->gpn * K - m;
            if (m > 0 && extra > 0) assign_counts(s, s->heap, m, extra);
        }
    }
    eg_clear(s); /* s->slot is reused as scratch below */
    /* Replicas, largest load per replica first (ties: lower expert id). */
    int32_t q = 0;
    for (int32_t e = 0; e < E; e++)
        for (int32_t r = 0; r < s->cnt[e]; r++)
            s->idx[q] = q, s->key[q] = per_replica(s, e), s->slot[q++] = e;
    epxi_sort_desc(s->key, s->idx, P, s->tmp);
    /* s->slot holds the replica list for now; tmp gets the expert order. */
    for (int32_t i = 0; i < P; i++) s->tmp[i] = s->slot[s->idx[i]];
    /* One min-heap of GPUs with room per node (one for all without homes),
     * keyed by (load, id): the top is the GPU a linear scan would pick. */
    const int32_t nh = s->home ? s->N : 1, per = G / nh;
    for (int32_t g = 0; g < G; g++) s->fill[g] = 0, s->load[g] = 0.0, s->hp[g] = g;
    for (int32_t n = 0; n < nh; n++) s->hsize[n] = per; /* all loads 0: ids ascending is a heap */
    for (int32_t e = 0; e < E; e++) s->first[e] = -1;
    for (int32_t i = 0; i < P; i++) {
        const int32_t e = s->tmp[i], n = s->home ? s->home[e] : 0;
        int32_t *h = s->hp + (size_t)n * per;
        /* Pop until a GPU without a replica of e; put the others back. A
         * replica count above the node's GPU count forces a duplicate. */
        int32_t popped = 0, g = -1;
        while (s->hsize[n] > 0) {
            int32_t top = heap_pop_gpu(s, h, &s->hsize[n]);
            if (on_gpu(s, e, top) == 0) {
                g = top;
                break;
            }
            s->multi[popped++] = top;
        }
        if (g < 0) g = s->multi[0]; /* every GPU with room holds e: unavoidable */
        for (int32_t j = 0; j < popped; j++)
            if (s->multi[j] != g) heap_push_gpu(s, h, &s->hsize[n], s->multi[j]);
        int32_t p = g * K + s->fill[g]++;
        s->idx[p] = e;
        list_push(s, e, p);
        s->load[g] += per_replica(s, e);
        if (s->fill[g] < K) heap_push_gpu(s, h, &s->hsize[n], g);
    }
    memcpy(s->slot, s->idx, (size_t)P * sizeof *s->slot);
    rebuild(s);
}

void epxi_search_retarget(epxi_search *s, const double *w, const int32_t *home, int32_t budget) {
    s->w = w;
    s->home = home;
    s->budget = home ? budget : 0;
    s->w2 = NULL;
    s->cap2 = 0.0;
    s->recount = true;
    s->target = -HUGE_VAL;
    s->foreign = 0;
    for (int32_t e = 0; e < s->E; e++) s->home_cnt[e] = 0;
    for (int32_t p = 0; p < s->P; p++) {
        if (at_home(s, s->slot[p], gpu_of(s, p)))
            s->home_cnt[s->slot[p]]++;
        else
            s->foreign++;
    }
    for (int32_t g = 0; g < s->G; g++) s->sorted_ok[g] = 0; /* replica loads changed */
    recompute_loads(s);
}

void epxi_search_init_map(epxi_search *s, const int32_t *map) {
    eg_clear(s);
    memcpy(s->slot, map, (size_t)s->P * sizeof *s->slot);
    rebuild(s);
}

/* ---- GPUs by load ------------------------------------------------------------- */

/* Build gorder from scratch (after a rebuild). */
static void order_gpus(epxi_search *s) {
    for (int32_t g = 0; g < s->G; g++) s->gorder[g] = g, s->key[g] = -s->load[g];
    epxi_sort_desc(s->key, s->gorder, s->G, s->tmp); /* ties keep the lower id first */
    s->gorder_ok = true;
}

/* Add delta to GPU g's load and move g to its place in gorder; returns
 * that place (-1 while there is no order). at: g's place now, when the
 * caller knows it (the search does: gmax is last, the partner where the
 * scan found it), else -1. The others are in order, so g's place before
 * and after is unique: counted over the loads up to 64 GPUs (no branches),
 * else found by bisection (with hundreds of GPUs a swap moves one far, and
 * a table of positions would cost as much to keep as the shift); the GPUs
 * between shift by one. */
static int32_t add_load(epxi_search *s, int32_t g, double delta, int32_t at) {
    const double old = s->load[g];
    s->load[g] += delta;
    if (!s->gorder_ok) return -1;
    int32_t *o = s->gorder;
    const double now = s->load[g];
    int32_t from = at, to;
    if (s->G <= 64) {
        /* a place is the count of GPUs before it, (load, id) below g's
         * (g's own term in the old count, now < old, is taken out) */
        int32_t before_old = 0, before_now = 0;
        for (int32_t m = 0; m < s->G; m++) {
            const double l = s->load[m];
            const int32_t first = m < g;
            before_old += (l < old) | ((l == old) & first);
            before_now += (l < now) | ((l == now) & first);
        }
        if (from < 0) from = before_old - (now < old);
        to = before_now;
    } else {
        if (from < 0) {
            int32_t lo = 0, hi = s->G - 1;
            while (lo < hi) { /* the first GPU not lighter than (old, g) */
                const int32_t mid = lo + (hi - lo) / 2, m = o[mid];
                if (m == g) {
                    lo = mid;
                    break;
                }
                if (s->load[m] < old || (s->load[m] == old && m < g))
                    lo = mid + 1;
                else
                    hi = mid;
            }
            from = lo;
        }
        int32_t lo, hi;
        if (from > 0 && lighter(s, g, o[from - 1])) {
            lo = 0, hi = from - 1; /* the first GPU that g is lighter than */
            while (lo < hi) {
                const int32_t mid = lo + (hi - lo) / 2;
                if (lighter(s, g, o[mid]))
                    hi = mid;
                else
                    lo = mid + 1;
            }
            to = lo;
        } else if (from + 1 < s->G && lighter(s, o[from + 1], g)) {
            lo = from + 1, hi = s->G - 1; /* the last GPU lighter than g */
            while (lo < hi) {
                const int32_t mid = hi - (hi - lo) / 2;
                if (lighter(s, o[mid], g))
                    lo = mid;
                else
                    hi = mid - 1;
            }
            to = lo;
        } else {
            to = from;
        }
    }
    assert(o[from] == g);
    if (to > from)
        memmove(o + from, o + from + 1, (size_t)(to - from) * sizeof *o);
    else if (to < from)
        memmove(o + to + 1, o + to, (size_t)(from - to) * sizeof *o);
    o[to] = g;
    return to;
}

/* ---- moves ------------------------------------------------------------------- */

static void reposition(epxi_search *s, int32_t p);

/* Is exchanging slots a and b allowed (no duplicate, node rules)? */
static bool swap_ok(const epxi_search *s, int32_t a, int32_t b) {
    const int32_t x = s->slot[a], y = s->slot[b], ga = gpu_of(s, a), gb = gpu_of(s, b);
    if (x == y || on_gpu(s, x, gb) > 0 || on_gpu(s, y, ga) > 0) return false;
    if (s->home == NULL) return true;
    int32_t hx = at_home(s, x, gb) - at_home(s, x, ga);
    int32_t hy = at_home(s, y, ga) - at_home(s, y, gb);
    if (s->home_cnt[x] + hx < 1 || s->home_cnt[y] + hy < 1) return false;
    return s->foreign - hx - hy <= s->budget;
}

/* Exchange slots a and b. pa, pb: their GPUs' places in gorder where the
 * caller knows them, else -1. */
static void apply_swap(epxi_search *s, int32_t a, int32_t b, int32_t pa, int32_t pb) {
    const int32_t x = s->slot[a], y = s->slot[b], ga = gpu_of(s, a), gb = gpu_of(s, b);
    const double rx = per_replica(s, x), ry = per_replica(s, y);
    /* One GPU at a time: add_load assumes every other GPU is in place; the
     * GPUs between ga's two places shifted by one, gb among them maybe. */
    const int32_t na = add_load(s, ga, ry - rx, pa);
    if (pa >= 0 && pb >= 0) pb += (na <= pb && pb < pa) - (pa < pb && pb <= na);
    add_load(s, gb, rx - ry, pb);
    if (s->w2) {
        const double d2 = per_replica2(s, x) - per_replica2(s, y);
        s->load2[ga] -= d2;
        s->load2[gb] += d2;
    }
    if (s->home) {
        int32_t hx = at_home(s, x, gb) - at_home(s, x, ga);
        int32_t hy = at_home(s, y, ga) - at_home(s, y, gb);
        s->home_cnt[x] += hx, s->home_cnt[y] += hy;
        s->foreign -= hx + hy;
    }
    list_remove(s, x, a), list_remove(s, y, b);
    list_push(s, y, a), list_push(s, x, b);
    s->slot[a] = y, s->slot[b] = x;
    reposition(s, a);
    reposition(s, b);
}

/* Is giving slot b (expert y) to expert x allowed? */
static bool recount_ok(const epxi_search *s, int32_t b, int32_t x) {
    const int32_t y = s->slot[b], gb = gpu_of(s, b);
    if (x == y || s->cnt[y] < 2 || on_gpu(s, x, gb) > 0) return false;
    if (s->home == NULL) return true;
    if (at_home(s, y, gb) && s->home_cnt[y] < 2) return false;
    int32_t df = !at_home(s, x, gb) - !at_home(s, y, gb);
    return s->foreign + df <= s->budget;
}

static void touch(epxi_search *s, int32_t g, double d, double d2) {
    if (s->stamp[g] != s->cur_stamp) {
        s->stamp[g] = s->cur_stamp;
        s->delta[g] = 0.0;
        s->delta2[g] = 0.0;
        s->tlist[s->ntouch++] = g;
    }
    s->delta[g] += d;
    s->delta2[g] += d2;
}

/* The max over the GPUs that giving slot b to x would touch, after it;
 * +inf when the constraint load of one of them would exceed its cap. */
static double eval_recount(epxi_search *s, int32_t b, int32_t x, double bound) {
    const int32_t y = s->slot[b], gb = gpu_of(s, b);
    const double ry = per_replica(s, y), ry1 = s->w[y] / (s->cnt[y] - 1);
    const double rx = per_replica(s, x), rx1 = s->w[x] / (s->cnt[x] + 1);
    double dy2 = 0.0, dx2 = 0.0, dg2 = 0.0;
    if (s->w2) {
        dy2 = s->w2[y] / (s->cnt[y] - 1) - per_replica2(s, y);
        dx2 = s->w2[x] / (s->cnt[x] + 1) - per_replica2(s, x);
        dg2 = s->w2[x] / (s->cnt[x] + 1) - per_replica2(s, y);
    }
    s->cur_stamp++;
    s->ntouch = 0;
    touch(s, gb, rx1 - ry, dg2);
    for (int32_t q = s->first[y]; q >= 0; q = s->next[q])
        if (q != b) touch(s, gpu_of(s, q), ry1 - ry, dy2);
    for (int32_t q = s->first[x]; q >= 0; q = s->next[q]) touch(s, gpu_of(s, q), rx1 - rx, dx2);
    double mx = -HUGE_VAL;
    for (int32_t i = 0; i < s->ntouch; i++) {
        int32_t g = s->tlist[i];
        double v = s->load[g] + s->delta[g];
        if (v > mx) mx = v;
        if (mx >= bound) return mx; /* cannot win: stop early */
        if (s->w2 && s->load2[g] + s->delta2[g] > s->cap2) return HUGE_VAL;
    }
    return mx;
}

static void apply_recount(epxi_search *s, int32_t b, int32_t x) {
    const int32_t y = s->slot[b], gb = gpu_of(s, b);
    (void)eval_recount(s, b, x, HUGE_VAL);
    for (int32_t i = 0; i < s->ntouch; i++) {
        (void)add_load(s, s->tlist[i], s->delta[s->tlist[i]], -1);
        s->load2[s->tlist[i]] += s->delta2[s->tlist[i]];
    }
    if (s->home) {
        if (at_home(s, y, gb))
            s->home_cnt[y]--;
        else
            s->foreign--;
        if (at_home(s, x, gb))
            s->home_cnt[x]++;
        else
            s->foreign++;
    }
    list_remove(s, y, b);
    list_push(s, x, b);
    s->slot[b] = x;
    s->cnt[y]--, s->cnt[x]++;
    /* Every replica of x and y changed load (b among x's now). */
    for (int32_t q = s->first[x]; q >= 0; q = s->next[q]) reposition(s, q);
    for (int32_t q = s->first[y]; q >= 0; q = s->next[q]) reposition(s, q);
}

/* ---- the search ------------------------------------------------------------------ */

/* Does exchanging slots a (on GPU ga) and b (on gb) keep both GPUs'
 * constraint loads capped? Both GPUs' rl2 entries must be current. */
static inline bool swap_fits2(const epxi_search *s, int32_t a, int32_t b, int32_t ga, int32_t gb) {
    if (s->w2 == NULL) return true;
    const double d2 = s->rl2[a] - s->rl2[b];
    return s->load2[ga] - d2 <= s->cap2 && s->load2[gb] + d2 <= s->cap2;
}

/* GPU h's slots by ascending replica load. Built by a sort after a
 * rebuild, then kept in order by reposition() as moves change loads. */
static void sorted_build(epxi_search *s, int32_t h) {
    const int32_t K = s->K;
    int32_t *ord = s->sorted + (size_t)h * K;
    {
        for (int32_t j = 0; j < K; j++) {
            int32_t p = h * K + j;
            s->rl[p] = -per_replica(s, s->slot[p]); /* descending sort of -r */
            ord[j] = p;
        }
        epxi_sort_desc(s->rl, ord, K, s->tmp);
        for (int32_t j = 0; j < K; j++) {
            const int32_t p = h * K + j;
            s->rl[p] = -s->rl[p];
            s->rl2[p] = s->w2 ? -per_replica2(s, s->slot[p]) : 0.0;
        }
        if (s->w2) {
            int32_t *ord2 = s->sorted2 + (size_t)h * K;
            for (int32_t j = 0; j < K; j++) ord2[j] = h * K + j;
            epxi_sort_desc(s->rl2, ord2, K, s->tmp);
            for (int32_t j = 0; j < K; j++) s->rl2[h * K + j] = -s->rl2[h * K + j];
        }
        s->sorted_ok[h] = 1;
    }
}

static inline const int32_t *sorted_slots(epxi_search *s, int32_t h) {
    if (!s->sorted_ok[h]) sorted_build(s, h);
    return s->sorted + (size_t)h * s->K;
}

/* Slot p's replica load changed: move it to its place in its GPU's order. */
static void reposition(epxi_search *s, int32_t p) {
    const int32_t K = s->K, g = gpu_of(s, p);
    if (!s->sorted_ok[g]) return;
    int32_t *ord = s->sorted + (size_t)g * K;
    const double r = per_replica(s, s->slot[p]);
    int32_t i = 0;
    while (ord[i] != p) i++;
    s->rl[p] = r;
    while (i > 0 && s->rl[ord[i - 1]] > r) ord[i] = ord[i - 1], i--;
    while (i + 1 < K && s->rl[ord[i + 1]] < r) ord[i] = ord[i + 1], i++;
    ord[i] = p;
    if (s->w2) {
        int32_t *ord2 = s->sorted2 + (size_t)g * K;
        const double r2 = per_replica2(s, s->slot[p]);
        i = 0;
        while (ord2[i] != p) i++;
        s->rl2[p] = r2;
        while (i > 0 && s->rl2[ord2[i - 1]] > r2) ord2[i] = ord2[i - 1], i--;
        while (i + 1 < K && s->rl2[ord2[i + 1]] < r2) ord2[i] = ord2[i + 1], i++;
        ord2[i] = p;
    }
}

/* Best swap between gmax and any other GPU that ends below `best`. For a
 * partner h with gap D = L_max - L_h, exchanging x (on gmax) for y (on h)
 * gives max(L_max - d, L_h + d), d = r_x - r_y, best at d = D / 2 and worse
 * the farther d is from it. So h's replicas are sorted by load once, and
 * for each x the search starts at r_y = r_x - D / 2 and walks outward in
 * both directions only until the first admissible pair or until the value
 * can no longer beat `best`. */
enum { WALK_MAX = 4, WINDOW_MAX = 16, FEW = 4 };

/* The first position i in ord[0..n) (sorted by r ascending) with
 * r[ord[i]] >= x, n if none. With few slots, the count of entries below x:
 * independent loads and no branches on the data (a bisection's branches
 * are coin flips, a quarter of the search's time on 9 slots; a bisection
 * by conditional moves is one long chain of loads, slower still). */
static inline int32_t lower_bound(const double *r, const int32_t *ord, int32_t n, double x) {
    if (n <= 16) {
        int32_t below = 0;
        for (int32_t i = 0; i < n; i++) below += r[ord[i]] < x;
        return below;
    }
    int32_t lo = 0, hi = n;
    while (lo < hi) {
        const int32_t mid = (lo + hi) / 2;
        if (r[ord[mid]] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* best_swap with at most FEW slots per GPU: every pair, no search. With
 * hundreds of GPUs and loads that are close, most partners have no pair
 * that could improve (DeepSeek-V3 on 256 GPUs: 89 partners looked at per
 * move), and the scan over them is where the time goes. So the scan
 * (scan_few) puts each partner's pairs through two of the tests a pair must
 * pass, d > 0 and L_h + d < best, computed as below and without branches or
 * lookups; only a partner with a pair that passes both is looked at pair by
 * pair as before. Same partners, same pairs, same order: the same move. */

/* The first position >= t in gorder whose GPU has a pair that passes the
 * two tests with gmax's replica loads xr, or G where the scan stops (the
 * partners from there on are too heavy). Inlined with a constant K at each
 * call, so the pair loops unroll. */
static inline int32_t scan_few(epxi_search *s, int32_t gmax, int32_t t, const double *xr,
                               const int32_t K, double Lmax, double start) {
    const int32_t G = s->G;
    for (; t < G; t++) {
        const int32_t h = s->gorder[t];
        if (h == gmax) continue;
        const double Lh = s->load[h];
        if (0.5 * (Lmax + Lh) >= start) return G; /* heavier partners cannot beat it */
        if (!s->sorted_ok[h]) sorted_build(s, h); /* rl[] of h current */
        const double *yr = s->rl + (size_t)h * K;
        int any = 0;
        for (int32_t i = 0; i < K; i++)
            for (int32_t j = 0; j < K; j++) {
                const double d = xr[i] - yr[j];
                any |= (d > 0.0) & (Lh + d < start);
            }
        if (any) return t;
    }
    return G;
}

static bool best_swap_few(epxi_search *s, int32_t gmax, double *best, int32_t *ma, int32_t *mb,
                          int32_t *at) {
    const int32_t K = s->K, G = s->G, node = s->gnode[gmax];
    const double Lmax = s->load[gmax], start = *best;
    double xr[FEW];
    bool pinned[FEW];
    if (!s->sorted_ok[gmax]) sorted_build(s, gmax); /* rl[] of gmax current */
    for (int32_t i = 0; i < K; i++) {
        const int32_t x = s->slot[gmax * K + i];
        xr[i] = s->rl[gmax * K + i];
        pinned[i] = s->home && s->home[x] == node && s->home_cnt[x] < 2;
    }
    for (int32_t t = 0;; t++) { /* lightest partner first */
        switch (K) {
        case 1: t = scan_few(s, gmax, t, xr, 1, Lmax, start); break;
        case 2: t = scan_few(s, gmax, t, xr, 2, Lmax, start); break;
        case 3: t = scan_few(s, gmax, t, xr, 3, Lmax, start); break;
        default: t = scan_few(s, gmax, t, xr, FEW, Lmax, start); break;
        }
        if (t >= G) return false;
        const int32_t h = s->gorder[t];
        const double Lh = s->load[h], D = Lmax - Lh;
        const double *yr = s->rl + (size_t)h * K;
        const bool away = s->home && s->gnode[h] != node;
        bool found = false;
        for (int32_t i = 0; i < K; i++) {
            if (away && pinned[i]) continue;
            const int32_t a = gmax * K + i;
            for (int32_t j = 0; j < K; j++) {
                const int32_t b = h * K + j;
                const double d = xr[i] - yr[j];
                if (d <= 0.0 || d >= D) continue;
                const double v = Lmax - d > Lh + d ? Lmax - d : Lh + d;
                if (v >= *best || !swap_fits2(s, a, b, gmax, h) || !swap_ok(s, a, b)) continue;
                *best = v, *ma = a, *mb = b, found = true;
            }
        }
        if (found) { /* first improving partner: cheaper, and no worse */
            *at = t;
            return true;
        }
    }
}

/* One step of best_swap's walk from x (slot a, load rx) to slot b: stop
 * (farther candidates only get worse), refused by swap_ok, or taken as the
 * new best. */
enum { WALK_STOP, WALK_REFUSED, WALK_TAKEN };
static inline int32_t walk_step(const epxi_search *s, int32_t a, int32_t b, double rx, double Lmax,
                                double Lh, double *best, int32_t *ma, int32_t *mb) {
    const double d = rx - s->rl[b];
    if (d <= 0.0) return WALK_STOP; /* larger r_y only gets worse */
    const double v = Lmax - d > Lh + d ? Lmax - d : Lh + d;
    if (v >= *best) return WALK_STOP;
    if (!swap_ok(s, a, b)) return WALK_REFUSED;
    *best = v, *ma = a, *mb = b;
    return WALK_TAKEN;
}

/* at: the partner's place in gorder, when one is found. */
static bool best_swap(epxi_search *s, int32_t gmax, double *best, int32_t *ma, int32_t *mb,
                      int32_t *at) {
    const int32_t K = s->K, G = s->G;
    if (K <= FEW) return best_swap_few(s, gmax, best, ma, mb, at);
    const double Lmax = s->load[gmax];
    bool found = false;
    (void)sorted_slots(s, gmax); /* rl[] of gmax's slots */
    /* A replica that is its expert's only one at home cannot go to another
     * node (swap_ok refuses every such pair): with a cross-node partner its
     * candidates are not looked at. Skipping them changes nothing else, as
     * the walk of one x touches no state until a pair is accepted. The
     * slots tried with a partner, ascending: all K, or (xs + K) the mobile. */
    const int32_t node = s->gnode[gmax];
    int32_t mobile = K;
    if (s->home) {
        mobile = 0;
        for (int32_t i = 0; i < K; i++) {
            const int32_t x = s->slot[gmax * K + i];
            if (!(s->home[x] == node && s->home_cnt[x] < 2)) s->xs[K + mobile++] = i;
        }
    }
    for (int32_t t = 0; t < G; t++) { /* lightest partner first */
        const int32_t h = s->gorder[t];
        if (h == gmax) continue;
        const double Lh = s->load[h];
        if (0.5 * (Lmax + Lh) >= *best) break; /* heavier partners cannot beat it */
        if (found) break;                      /* first improving partner: cheaper, and no worse */
        const int32_t *ord = sorted_slots(s, h); /* also makes rl[] of h current */
        const bool away = s->home && s->gnode[h] != node;
        const int32_t *xs = away ? s->xs + K : s->xs, nx = away ? mobile : K;
        if (nx == 0) continue;
        const double D = Lmax - Lh;
        if (s->w2) {
            /* Under a constraint the binding condition is usually the
             * constraint load: r2_y must lie in a narrow window around r2_x
             * (both GPUs stay <= cap2), so search h's replicas by r2. */
            const int32_t *ord2 = s->sorted2 + (size_t)h * K;
            const double lo2 = s->load2[gmax] - s->cap2, hi2 = s->cap2 - s->load2[h];
            for (int32_t u = 0; u < nx; u++) {
                const int32_t a = gmax * K + xs[u];
                const double rx = s->rl[a], r2x = s->rl2[a];
                const double from = r2x - hi2, to = r2x - lo2;
                const int32_t lo = lower_bound(s->rl2, ord2, K, from); /* first r2 >= from */
                for (int32_t j = lo, n = 0; j < K && n < WINDOW_MAX; j++, n++) {
                    const int32_t b = ord2[j];
                    if (s->rl2[b] > to) break;
                    const double d = rx - s->rl[b];
                    if (d <= 0.0 || d >= D) continue;
                    const double v = Lmax - d > Lh + d ? Lmax - d : Lh + d;
                    if (v >= *best || !swap_ok(s, a, b)) continue;
                    *best = v, *ma = a, *mb = b, *at = t, found = true;
                }
            }
            continue;
        }
        for (int32_t u = 0; u < nx; u++) {
            const int32_t a = gmax * K + xs[u];
            const double rx = s->rl[a], target = rx - 0.5 * D;
            /* first position with r >= target */
            const int32_t lo = lower_bound(s->rl, ord, K, target);
            /* Down from lo, then up from it; a few refused candidates per
             * direction, then give up: under a tight constraint most are
             * refused and the walk would be long. */
            for (int32_t j = lo - 1, refused = 0; j >= 0 && refused < WALK_MAX; j--) {
                const int32_t step = walk_step(s, a, ord[j], rx, Lmax, Lh, best, ma, mb);
                if (step == WALK_STOP) break;
                if (step == WALK_TAKEN) {
                    found = true, *at = t;
                    break;
                }
                refused++;
            }
            for (int32_t j = lo, refused = 0; j < K && refused < WALK_MAX; j++) {
                const int32_t step = walk_step(s, a, ord[j], rx, Lmax, Lh, best, ma, mb);
                if (step == WALK_STOP) break;
                if (step == WALK_TAKEN) {
                    found = true, *at = t;
                    break;
                }
                refused++;
            }
        }
    }
    return found;
}

/* The `want` experts lightest per replica after gaining one (in s->cand,
 * ascending), among those with no replica on GPU g and, with node rules,
 * at home on g's node (a slot handed over should not start cross-node
 * traffic); g < 0: among all experts. Returns how many were found. */
enum { MERGE_CANDIDATES = 4, DUP_CANDIDATES = 16 };
static int32_t lightest_candidates(epxi_search *s, int32_t g, int32_t want) {
    const int32_t K = s->K;
    int32_t ncand = 0;
    s->cur_stamp++;
    if (g >= 0)
        for (int32_t i = 0; i < K; i++) s->cand_mark[s->slot[g * K + i]] = s->cur_stamp;
    for (int32_t e = 0; e < s->E; e++) {
        if (s->cand_mark[e] == s->cur_stamp) continue;
        if (g >= 0 && s->home && s->home[e] != s->gnode[g]) continue;
        const double v = s->w[e] / (s->cnt[e] + 1);
        int32_t pos;
        if (ncand < want) {
            pos = ncand++;
        } else {
            const int32_t last = s->cand[want - 1];
            if (v >= s->w[last] / (s->cnt[last] + 1)) continue;
            pos = want - 1;
        }
        while (pos > 0 && s->w[s->cand[pos - 1]] / (s->cnt[s->cand[pos - 1]] + 1) > v) {
            s->cand[pos] = s->cand[pos - 1];
            pos--;
        }
        s->cand[pos] = e;
    }
    return ncand;
}

/* Best split or merge centred on gmax that ends below `best`. */
static bool best_recount(epxi_search *s, int32_t gmax, double *best, int32_t *mb, int32_t *mx) {
    const int32_t K = s->K, P = s->P;
    const double Lmax = s->load[gmax];
    bool found = false;
    /* Slots that can give up their replica, with what that costs the other
     * replicas' GPUs regardless of who takes the slot: their largest load
     * afterwards (key), or a skip when a constraint load would break. */
    /* The largest load over the other replicas' GPUs is the largest of the
     * expert's two largest (top1 unless p is where it is); as rounding is
     * monotone, that load + up is the largest of the sums, the key. The
     * two are found once per expert, at its first slot. */
    int32_t nmulti = 0;
    s->cur_stamp++;
    for (int32_t p = 0; p < P; p++) {
        const int32_t y = s->slot[p];
        if (s->cnt[y] < 2 || gpu_of(s, p) == gmax) continue;
        if (s->top_mark[y] != s->cur_stamp) {
            s->top_mark[y] = s->cur_stamp;
            double a1 = -HUGE_VAL, a2 = -HUGE_VAL, b1 = -HUGE_VAL, b2 = -HUGE_VAL;
            int32_t qa = -1, qb = -1;
            for (int32_t q = s->first[y]; q >= 0; q = s->next[q]) {
                const int32_t g = gpu_of(s, q);
                const double l = s->load[g], l2 = s->w2 ? s->load2[g] : 0.0;
                if (l > a1)
                    a2 = a1, a1 = l, qa = q;
                else if (l > a2)
                    a2 = l;
                if (l2 > b1)
                    b2 = b1, b1 = l2, qb = q;
                else if (l2 > b2)
                    b2 = l2;
            }
            s->top1[y] = a1, s->top2[y] = a2, s->top_slot[y] = qa;
            s->top1_2[y] = b1, s->top2_2[y] = b2, s->top_slot2[y] = qb;
        }
        const double up = s->w[y] / (s->cnt[y] - 1) - per_replica(s, y);
        const double worst = (p == s->top_slot[y] ? s->top2[y] : s->top1[y]) + up;
        if (s->w2) {
            const double up2 = s->w2[y] / (s->cnt[y] - 1) - per_replica2(s, y);
            if ((p == s->top_slot2[y] ? s->top2_2[y] : s->top1_2[y]) + up2 > s->cap2) continue;
        }
        if (worst >= *best) continue;
        s->key[nmulti] = worst;
        s->multi[nmulti++] = p;
    }
    /* split: an expert x on gmax takes slot b elsewhere. */
    for (int32_t i = 0; i < K; i++) {
        int32_t x = s->slot[gmax * K + i];
        double rx = per_replica(s, x), rx1 = s->w[x] / (s->cnt[x] + 1);
        const double rx1_2 = s->w2 ? s->w2[x] / (s->cnt[x] + 1) : 0.0;
        if (Lmax - (rx - rx1) >= *best) continue; /* gmax cannot drop enough */
        for (int32_t j = 0; j < nmulti; j++) {
            int32_t b = s->multi[j];
            const int32_t gb = gpu_of(s, b), y = s->slot[b];
            double lb = s->load[gb] - per_replica(s, y) + rx1;
            if (lb >= *best || s->key[j] >= *best) continue;
            if (s->w2 && s->load2[gb] - per_replica2(s, y) + rx1_2 > s->cap2) continue;
            if (!recount_ok(s, b, x)) continue;
            double v = eval_recount(s, b, x, *best);
            if (v < *best) *best = v, *mb = b, *mx = x, found = true;
        }
    }
    /* merge: a slot on gmax whose expert has >= 2 replicas goes to the
     * expert lightest per replica after the change, among those not on
     * gmax already (a few candidates, in case node rules refuse some). */
    bool any = false;
    for (int32_t i = 0; i < K && !any; i++) any = s->cnt[s->slot[gmax * K + i]] >= 2;
    const int32_t ncand = any ? lightest_candidates(s, gmax, MERGE_CANDIDATES) : 0;
    for (int32_t i = 0; i < K; i++) {
        int32_t b = gmax * K + i, y = s->slot[b];
        if (s->cnt[y] < 2) continue;
        for (int32_t c = 0; c < ncand; c++) {
            int32_t x = s->cand[c];
            if (Lmax - per_replica(s, y) + s->w[x] / (s->cnt[x] + 1) >= *best) break;
            if (!recount_ok(s, b, x)) continue;
            double v = eval_recount(s, b, x, *best);
            if (v < *best) *best = v, *mb = b, *mx = x, found = true;
        }
    }
    return found;
}

int64_t epxi_search_improve(epxi_search *s, int64_t max_iters) {
    int64_t it = 0;
    for (; it < max_iters; it++) {
        if (!s->gorder_ok) order_gpus(s);
        const int32_t gmax = s->gorder[s->G - 1];
        const double Lmax = s->load[gmax];
        if (!(Lmax > 0.0) || Lmax <= s->target) break;
        /* A move must end every touched GPU clearly below the max, so float
         * noise in the incremental loads cannot make it cycle. */
        double best = Lmax * (1.0 - 1e-12);
        int32_t a = -1, b = -1, x = -1;
        /* Swaps first: they are cheap to find and keep the counts; a
         * re-count is looked for only when no swap helps. */
        int32_t at = -1;
        if (best_swap(s, gmax, &best, &a, &b, &at)) {
            apply_swap(s, a, b, s->G - 1, at);
            continue;
        }
        if (s->recount && best_recount(s, gmax, &best, &b, &x)) {
            apply_recount(s, b, x);
            continue;
        }
        break;
    }
    /* Incremental updates drift by rounding: recompute the loads exactly
     * (lists, counts and slot orders are exact and stay). */
    recompute_loads(s);
    return it;
}

/* ---- duplicates ---------------------------------------------------------------- */

int32_t epxi_search_fix_duplicates(epxi_search *s, bool keep_max) {
    const int32_t K = s->K, G = s->G;
    int32_t left = 0;
    if (s->dups == 0) return 0; /* moves never create duplicates */
    bool changed = false;
    int32_t nc = -1;
    for (int32_t g = 0; g < G; g++) {
        for (int32_t i = 0; i < K; i++) {
            int32_t a = g * K + i, x = s->slot[a];
            if (on_gpu(s, x, g) < 2) continue;
            const double limit = keep_max ? epxi_search_max_load(s) : HUGE_VAL;
            double best = HUGE_VAL;
            int32_t kind = 0, mb = -1, mx = -1;
            /* Move this replica away by a swap that keeps both GPUs at or
             * below the max. */
            const double rx = per_replica(s, x), r2x = s->w2 ? per_replica2(s, x) : 0.0;
            for (int32_t b = 0; b < s->P; b++) {
                const int32_t h = gpu_of(s, b), y = s->slot[b];
                if (h == g) continue;
                const double d = rx - per_replica(s, y);
                const double v = s->load[g] - d > s->load[h] + d ? s->load[g] - d : s->load[h] + d;
                if (v > limit || v >= best) continue;
                if (s->w2) {
                    const double d2 = r2x - per_replica2(s, y);
                    if (s->load2[g] - d2 > s->cap2 || s->load2[h] + d2 > s->cap2) continue;
                }
                if (!swap_ok(s, a, b)) continue;
                best = v, kind = 1, mb = b;
            }
            /* Or hand the slot to one of the experts lightest per replica
             * (chosen once per call; those already on g are skipped). */
            if (nc < 0) nc = lightest_candidates(s, -1, DUP_CANDIDATES);
            for (int32_t c = 0; c < nc; c++) {
                const int32_t e = s->cand[c];
                if (s->home && s->home[e] != s->gnode[g]) continue;
                if (!recount_ok(s, a, e)) continue;
                double v = eval_recount(s, a, e, best);
                if (v <= limit && v < best) best = v, kind = 2, mx = e;
            }
            if (kind == 1)
                apply_swap(s, a, mb, -1, -1);
            else if (kind == 2)
                apply_recount(s, a, mx);
            else
                left++;
            changed |= kind != 0;
        }
    }
    if (changed)
        rebuild(s); /* exact loads again, and the duplicate count */
    else
        s->dups = left;
    return left;
}

/* ---- export ---------------------------------------------------------------------- */

void epxi_search_export(const epxi_search *s, int32_t *map) {
    memcpy(map, s->slot, (size_t)s->P * sizeof *map);
}

/* ---- groups to nodes ---------------------------------------------------------------- */

void epxi_groups_to_nodes(const double *w, int32_t E, int32_t ng, int32_t N, int32_t node_slots,
                          int32_t *home, int32_t *scratch, double *dscratch) {
    const int32_t gs = E / ng, per = ng / N;
    int32_t *node = scratch, *idx = scratch + ng, *nfill = scratch + 2 * ng;
    double *gl = dscratch, *nl = dscratch + ng;
    for (int32_t k = 0; k < ng; k++) {
        double t = 0.0;
        for (int32_t e = k * gs; e < (k + 1) * gs; e++) t += w[e];
        gl[k] = t, idx[k] = k;
    }
    /* DeepSeek's start: largest group to the lightest node with room. The
     * sort scratch borrows `home` (E >= 2 * ng is not guaranteed, so use
     * the first ng entries of home only). */
    epxi_sort_desc(gl, idx, ng, home);
    for (int32_t n = 0; n < N; n++) nl[n] = 0.0, nfill[n] = 0;
    for (int32_t i = 0; i < ng; i++) {
        int32_t k = idx[i], best = -1;
        for (int32_t n = 0; n < N; n++)
            if (nfill[n] < per && (best < 0 || nl[n] < nl[best])) best = n;
        node[k] = best, nl[best] += gl[k], nfill[best]++;
    }
    /* Improve: move a group off the heaviest node, or swap one of its groups
     * with a lighter one elsewhere, while the pair's max drops. Bounded:
     * each step lowers the heaviest node or the number at the maximum. */
    for (int32_t it = 0; it < 4 * ng * N; it++) {
        int32_t nmax = 0;
        for (int32_t n = 1; n < N; n++)
            if (nl[n] > nl[nmax]) nmax = n;
        double best = nl[nmax] * (1.0 - 1e-12);
        int32_t bk = -1, bj = -1, bn = -1;
        for (int32_t k = 0; k < ng; k++) {
            if (node[k] != nmax) continue;
            for (int32_t n = 0; n < N; n++) {
                if (n == nmax) continue;
                /* move k to n */
                if ((nfill[n] + 1) * gs <= node_slots && nfill[nmax] > 1) {
                    double v = nl[n] + gl[k] > nl[nmax] - gl[k] ? nl[n] + gl[k] : nl[nmax] - gl[k];
                    if (v < best) best = v, bk = k, bj = -1, bn = n;
                }
                /* swap k with each group j on n */
                for (int32_t j = 0; j < ng; j++) {
                    if (node[j] != n || gl[j] >= gl[k]) continue;
                    double d = gl[k] - gl[j];
                    double v = nl[n] + d > nl[nmax] - d ? nl[n] + d : nl[nmax] - d;
                    if (v < best) best = v, bk = k, bj = j, bn = n;
                }
            }
        }
        if (bk < 0) break;
        if (bj < 0) {
            node[bk] = bn, nl[bn] += gl[bk], nl[nmax] -= gl[bk], nfill[bn]++, nfill[nmax]--;
        } else {
            double d = gl[bk] - gl[bj];
            node[bk] = bn, node[bj] = nmax, nl[bn] += d, nl[nmax] -= d;
        }
    }
    for (int32_t e = 0; e < E; e++) home[e] = node[e / gs];
}
