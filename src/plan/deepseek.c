/*
 * deepseek.c - DeepSeek's EPLB (deepseek-ai/EPLB, rebalance_experts), exactly,
 * and fast.
 *
 * The reference runs three greedy steps per layer in PyTorch:
 *   1. pack expert groups onto nodes, heaviest group first, each into the
 *      lightest node that still has room (skipped when each node takes one
 *      group, and in the global policy, which is groups = nodes = 1);
 *   2. inside each node, hand the redundant slots out one by one, each to the
 *      expert whose per-replica load (load / replicas) is the largest;
 *   3. inside each node, pack the replicas onto GPUs as in step 1.
 * Every load, sum and quotient is float32, as torch computes them, and the
 * comparisons are made on those float32 values, so the result depends on the
 * rounding of each step: float32 is kept here on purpose, never widened.
 * Two engine copies are the exceptions, each asked for by its rule. SGLang
 * from 0.5.11 (EPX_EPLB_RULE_SGLANG_F64) adds the float32 items of its
 * packing as Python floats, so pack loads are float64 there (pack_f64
 * below); the SGLang rules also order tied loads as torch's sort does
 * (torch_sort.c) instead of by index. vLLM from 0.14.0
 * (EPX_EPLB_RULE_VLLM_F64) runs in numpy: group loads are numpy's pairwise
 * float32 sums (sum_numpy_pairwise), per-replica loads float64 quotients and
 * pack loads float64 sums (replicate_f64, balanced_packing_f64); its ties
 * go to the lowest index, as here.
 *
 * The reference sorts with an unstable sort and takes argmin/argmax over
 * Python lists; where loads tie it is arbitrary. Here every tie goes to the
 * lowest index: a stable descending sort, the lightest pack with the lowest
 * index, the expert with the lowest index among equal per-replica loads.
 * That meets every parity rule of shared/golden/README.md.
 *
 * Speed: the reference's inner loops are linear scans in Python (the pack
 * choice) and a full tensor max per redundant slot. Here both choices are
 * tournament trees (min over packs, max over experts) whose ties go to the
 * left, i.e. to the lowest index, so each choice is exactly the element the
 * reference's scan picks, in log2(m) branch-free steps. The descending sort
 * is a stable LSD radix sort on the float bits (insertion sort for short
 * rows). All scratch lives in one workspace allocated per call, so the
 * per-layer loop allocates nothing.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "plan_internal.h"

struct epxi_deepseek {
    /* Parameters, as rebalance_experts_hierarchical takes them. */
    int32_t E, P, groups, nodes, gpus;
    /* Derived sizes. */
    int32_t group_size;       /* E / groups                */
    int32_t groups_per_node;  /* groups / nodes            */
    int32_t experts_per_node; /* E / nodes                */
    int32_t slots_per_node;   /* P / nodes                 */
    int32_t slots_per_gpu;    /* P / gpus                  */
    int32_t gpus_per_node;    /* gpus / nodes              */
    bool pack_f64;            /* EPX_EPLB_RULE_SGLANG_F64: pack loads in float64 */
    bool torch_order;         /* SGLang rules: ties in torch.sort's order */
    bool vllm_f64;            /* EPX_EPLB_RULE_VLLM_F64: numpy sums, float64 quotients */
    /* Scratch, carved out of one block. */
    float *group_load;                /* [groups] */
    int32_t *group_pack, *group_rank; /* [groups] */
    int32_t *log2mlog, *mlog2log;     /* [E] */
    int32_t *mlogcnt;                 /* [E], node-major */
    float *row;                       /* [experts_per_node] */
    float *slot_ratio;                /* [experts_per_node] load / replicas */
    int32_t *phy2mlog, *phyrank;      /* [slots_per_node] */
    float *slot_load;                 /* [slots_per_node] */
    int32_t *pack, *rank;             /* [max(groups, slots_per_node)] */
    int32_t *order;                   /* [max(...)] sort output */
    uint64_t *sort_a, *sort_b;        /* [max(...)] radix sort buffers */
    uint64_t *node;                   /* [2 * tree] tournament tree, tree = the power of
                                         two >= max(experts_per_node, nodes, gpus_per_node) */
    float *pack_load;                 /* [tree] */
    double *pack_load64;              /* [tree], the _F64 rules */
    double *item64;                   /* [max(...)] float64 item weights, the _F64 rules */
    double *ratio64;                  /* [experts_per_node] load / replicas, VLLM_F64 */
    int32_t *pack_items;              /* [tree] */
    void *block;
};

/* ---- stable descending sort ------------------------------------------- */

/* The bits of a non-negative float order like the floats (+inf included).
 * -0 would not (its bits are the largest), so every load is normalised with
 * `+ 0.0f` (which turns -0 into +0 and changes nothing else) where it enters
 * a layer; sums, quotients and pack loads of such values are never -0. */
static inline uint32_t fbits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float bits_to_float(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* order[0..n) = indices of w sorted by descending value, equal values by
 * ascending index (a stable sort of the identity permutation). */
static void sort_desc(epxi_deepseek *ws, const float *w, int32_t n, int32_t *order) {
    if (n <= 48) {
        /* Insertion sort: strict comparison keeps equal values in index order. */
        for (int32_t i = 0; i < n; i++) {
            int32_t j = i;
            while (j > 0 && w[order[j - 1]] < w[i]) {
                order[j] = order[j - 1];
                j--;
            }
            order[j] = i;
        }
        return;
    }
    /* LSD radix sort on (key << 32 | index), 8 bits of the key per pass:
     * one load and one store per element and pass. The key is complemented,
     * so ascending keys are descending loads; equal keys keep index order. */
    uint32_t hist[4][256];
    memset(hist, 0, sizeof hist);
    uint64_t *a = ws->sort_a, *b = ws->sort_b;
    for (int32_t i = 0; i < n; i++) {
        const uint32_t k = ~fbits(w[i]);
        a[i] = ((uint64_t)k << 32) | (uint32_t)i;
        hist[0][k & 255u]++;
        hist[1][(k >> 8) & 255u]++;
        hist[2][(k >> 16) & 255u]++;
        hist[3][k >> 24]++;
    }
    for (int d = 0; d < 4; d++) {
        const unsigned shift = 32u + 8u * (unsigned)d;
        uint32_t *h = hist[d];
        /* A byte that every key shares moves nothing: skip its pass. */
        if (h[(a[0] >> shift) & 255u] == (uint32_t)n) continue;
        uint32_t sum = 0;
        for (int v = 0; v < 256; v++) {
            const uint32_t c = h[v];
            h[v] = sum;
            sum += c;
        }
        for (int32_t i = 0; i < n; i++) b[h[(a[i] >> shift) & 255u]++] = a[i];
        uint64_t *t = a;
        a = b;
        b = t;
    }
    for (int32_t i = 0; i < n; i++) order[i] = (int32_t)(uint32_t)a[i];
}

/* ---- tournament trees ----------------------------------------------------- */

/*
 * Both greedy choices are "the best of m candidates, lowest index on ties",
 * with one candidate changing per step. A tournament (winner) tree answers
 * that in log2(m) branch-free steps per change: leaves are the candidates,
 * each inner node holds the better of its two children.
 *
 * A node is one uint64: the candidate's key in the high half, its index in
 * the low half, so comparing nodes compares keys and breaks ties by index
 * with no indirection. Keys are the float32 values' bits, which for
 * non-negative floats order as the values (zero is mapped to 0, so -0 and +0
 * tie). In the min-tree over packs the low half is the pack id (ties: lowest
 * id is smallest) and a full pack gets key DEAD, above every float's bits. In
 * the max-tree over experts the low half is the complemented expert id
 * (ties: lowest id is largest).
 */
#define DEAD 0xFFFFFFFFu
/* Up to this many packs, balanced_packing scans instead of using a tree. */
#define SCAN_PACKS 16

static int32_t tree_width(int32_t n) {
    int32_t m = 1;
    while (m < n) m *= 2;
    return m;
}

static inline uint64_t node_min(uint64_t a, uint64_t b) { return b < a ? b : a; }

/* The scans' pairwise minimum trees are log2(W) deep only if the compiler
 * keeps them trees; GCC otherwise folds them into one serial chain. An empty
 * asm that "may change" a value stops that, and costs no instruction. */
#if defined(__GNUC__)
#define KEEP(x) __asm__("" : "+r"(x))
#else
#define KEEP(x) ((void)0)
#endif
static inline uint64_t tree_min(uint64_t a, uint64_t b) {
    uint64_t m = node_min(a, b);
    KEEP(m);
    return m;
}
static inline uint64_t node_max(uint64_t a, uint64_t b) { return b > a ? b : a; }

/* Leaves node[m .. 2m) are set; fill the inner nodes. */
static void tree_build(uint64_t *node, int32_t m, bool max_tree) {
    for (int32_t i = m - 1; i >= 1; i--)
        node[i] = max_tree ? node_max(node[2 * i], node[2 * i + 1])
                           : node_min(node[2 * i], node[2 * i + 1]);
}

static inline void tree_set_min(uint64_t *node, int32_t m, int32_t leaf, uint64_t v) {
    int32_t i = m + leaf;
    node[i] = v;
    for (i >>= 1; i >= 1; i >>= 1) node[i] = node_min(node[2 * i], node[2 * i + 1]);
}

static inline void tree_set_max(uint64_t *node, int32_t m, int32_t leaf, uint64_t v) {
    int32_t i = m + leaf;
    node[i] = v;
    for (i >>= 1; i >= 1; i >>= 1) node[i] = node_max(node[2 * i], node[2 * i + 1]);
}

static inline uint64_t pack_node(uint32_t key, int32_t pack) {
    return ((uint64_t)key << 32) | (uint32_t)pack;
}

static inline uint64_t expert_node(uint32_t key, int32_t id) {
    return ((uint64_t)key << 32) | (uint32_t) ~(uint32_t)id;
}

/* ---- the three steps ---------------------------------------------------- */

/*
 * Packing onto few packs (the GPUs of a node) without memory round trips:
 * each pack is one uint64 (load bits << 32 | pack << 24 | items) in a local
 * the compiler keeps in a register; the minimum of those words (a pairwise
 * tree, log2(W) deep) is the lightest live pack with the lowest id, and it
 * carries the winner's load and item count with it. A full pack's key
 * becomes DEAD. Items per pack stay below 2^24 (P <= 2^21). Written out for
 * W = 8 and 16: the packs are listed by X-macros, the shared step is one
 * inline function, and the 16-wide tree is two 8-wide ones under one more
 * minimum (the same tree, so the same winner).
 */
/* The packs as X-macro lists, so both scans are written once per line. */
#define PACKS8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define PACKS16(X) PACKS8(X) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
#define PACK_DECL(i) uint64_t c##i = (i) < num_packs ? (uint64_t)(i) << 24 : UINT64_MAX;
#define PACK_PUT(i) c##i = p == (i) ? v : c##i;

/* The minimum of eight pack words as a pairwise tree, three levels deep. */
static inline uint64_t min8(uint64_t c0, uint64_t c1, uint64_t c2, uint64_t c3, uint64_t c4,
                            uint64_t c5, uint64_t c6, uint64_t c7) {
    const uint64_t m0 = tree_min(c0, c1), m1 = tree_min(c2, c3);
    const uint64_t m2 = tree_min(c4, c5), m3 = tree_min(c6, c7);
    return tree_min(tree_min(m0, m1), tree_min(m2, m3));
}

/* One greedy choice: item `it` joins the pack that `best` names (writing
 * pack[it] and rank[it] and *p), and the pack's new word comes back. */
static inline uint64_t pack_take(uint64_t best, const float *w, int32_t it, int32_t per,
                                 int32_t *pack, int32_t *rank, int32_t *p) {
    *p = (int32_t)((best >> 24) & 0xFFu);
    const int32_t items = (int32_t)(best & 0xFFFFFFu);
    pack[it] = *p;
    rank[it] = items;
    const float load = bits_to_float((uint32_t)(best >> 32)) + w[it];
    const uint64_t key = items + 1 == per ? DEAD : fbits(load);
    return key << 32 | (uint64_t)*p << 24 | (uint64_t)(items + 1);
}

static void pack_scan8(const float *w, const int32_t *order, int32_t n, int32_t num_packs,
                       int32_t per, int32_t *pack, int32_t *rank) {
    PACKS8(PACK_DECL)
    for (int32_t k = 0; k < n; k++) {
        const uint64_t best = min8(c0, c1, c2, c3, c4, c5, c6, c7);
        int32_t p;
        const uint64_t v = pack_take(best, w, order[k], per, pack, rank, &p);
        PACKS8(PACK_PUT)
    }
}

static void pack_scan16(const float *w, const int32_t *order, int32_t n, int32_t num_packs,
                        int32_t per, int32_t *pack, int32_t *rank) {
    PACKS16(PACK_DECL)
    for (int32_t k = 0; k < n; k++) {
        const uint64_t best = tree_min(min8(c0, c1, c2, c3, c4, c5, c6, c7),
                                       min8(c8, c9, c10, c11, c12, c13, c14, c15));
        int32_t p;
        const uint64_t v = pack_take(best, w, order[k], per, pack, rank, &p);
        PACKS16(PACK_PUT)
    }
}

/*
 * SGLang >= 0.5.11 and vLLM >= 0.14.0: the same greedy choice, but each
 * pack's load is float64 (SGLang: a Python float; vLLM: a float64 array;
 * items are the float32 loads widened, or vLLM's float64 quotients). A
 * linear scan: the lightest pack with room, the lowest index on ties
 * (Python's min, np.argmin with full packs at inf); the trees above key on
 * 32-bit float bits, which a double does not fit, and these rules are only
 * asked for by name.
 */
static void pack_f64(epxi_deepseek *ws, const double *w, const int32_t *order, int32_t n,
                     int32_t num_packs, int32_t per, int32_t *pack, int32_t *rank) {
    double *load = ws->pack_load64;
    int32_t *items = ws->pack_items;
    for (int32_t p = 0; p < num_packs; p++) {
        load[p] = 0.0;
        items[p] = 0;
    }
    for (int32_t k = 0; k < n; k++) {
        const int32_t it = order[k];
        int32_t best = -1;
        for (int32_t p = 0; p < num_packs; p++)
            if (items[p] < per && (best < 0 || load[p] < load[best])) best = p;
        pack[it] = best;
        rank[it] = items[best]++;
        load[best] = load[best] + w[it];
    }
}

/* order[0..n) = indices of the float64 w by descending value, equal values
 * by ascending index: insertion sort for short rows, else a bottom-up merge
 * sort (through sort_a) that takes from the right run only when strictly
 * larger. */
static void sort_desc_f64(epxi_deepseek *ws, const double *w, int32_t n, int32_t *order) {
    if (n <= 48) {
        for (int32_t i = 0; i < n; i++) {
            int32_t j = i;
            while (j > 0 && w[order[j - 1]] < w[i]) {
                order[j] = order[j - 1];
                j--;
            }
            order[j] = i;
        }
        return;
    }
    int32_t *a = order, *b = (int32_t *)(void *)ws->sort_a; /* sort_a holds 2 * items int32 */
    for (int32_t i = 0; i < n; i++) a[i] = i;
    for (int32_t width = 1; width < n; width *= 2) {
        for (int32_t lo = 0; lo < n; lo += 2 * width) {
            const int32_t mid = lo + width < n ? lo + width : n;
            const int32_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            int32_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) b[k++] = w[a[j]] > w[a[i]] ? a[j++] : a[i++];
            while (i < mid) b[k++] = a[i++];
            while (j < hi) b[k++] = a[j++];
        }
        int32_t *t = a;
        a = b;
        b = t;
    }
    if (a != order) memcpy(order, a, (size_t)n * sizeof *order);
}

/* balanced_packing of vLLM >= 0.14.0's GPU step: float64 items (the
 * quotients), sorted stably, packed with float64 loads. */
static void balanced_packing_f64(epxi_deepseek *ws, const double *w, int32_t n, int32_t num_packs,
                                 int32_t *pack, int32_t *rank) {
    const int32_t per = n / num_packs;
    if (per == 1) {
        for (int32_t i = 0; i < n; i++) {
            pack[i] = i;
            rank[i] = 0;
        }
        return;
    }
    sort_desc_f64(ws, w, n, ws->order);
    pack_f64(ws, w, ws->order, n, num_packs, per, pack, rank);
}

/*
 * balanced_packing: n items of weight w into num_packs packs of n / num_packs
 * items each. Heaviest item first, into the lightest pack with room (lowest
 * index on ties); pack loads accumulate in float32 (float64 for
 * EPX_EPLB_RULE_SGLANG_F64). Items of equal weight come in index order, or
 * in torch's for the SGLang rules.
 */
static void balanced_packing(epxi_deepseek *ws, const float *w, int32_t n, int32_t num_packs,
                             int32_t *pack, int32_t *rank) {
    const int32_t per = n / num_packs;
    if (per == 1) {
        for (int32_t i = 0; i < n; i++) {
            pack[i] = i;
            rank[i] = 0;
        }
        return;
    }
    int32_t *order = ws->order, *items = ws->pack_items;
    float *load = ws->pack_load;
    uint64_t *node = ws->node;
    if (ws->torch_order)
        epxi_sort_desc_torch(w, n, order);
    else
        sort_desc(ws, w, n, order);
    if (ws->pack_f64) {
        for (int32_t i = 0; i < n; i++) ws->item64[i] = (double)w[i];
        pack_f64(ws, ws->item64, order, n, num_packs, per, pack, rank);
        return;
    }
    if (num_packs <= 8) {
        pack_scan8(w, order, n, num_packs, per, pack, rank);
        return;
    }
    if (num_packs <= SCAN_PACKS) {
        pack_scan16(w, order, n, num_packs, per, pack, rank);
        return;
    }
    const int32_t m = tree_width(num_packs);
    for (int32_t p = 0; p < m; p++) {
        load[p] = 0.0f;
        items[p] = 0;
        node[m + p] = pack_node(p < num_packs ? 0u : DEAD, p);
    }
    tree_build(node, m, false);
    for (int32_t k = 0; k < n; k++) {
        const int32_t it = order[k], p = (int32_t)(uint32_t)node[1];
        pack[it] = p;
        rank[it] = items[p]++;
        load[p] = load[p] + w[it];
        tree_set_min(node, m, p, pack_node(items[p] == per ? DEAD : fbits(load[p]), p));
    }
}

/*
 * replicate_experts: n experts of load w get num_phy slots; slot i < n holds
 * expert i, each further slot the expert with the largest float32 load /
 * replicas (lowest id on ties). phy2log, phyrank [num_phy]; cnt [n].
 * (Only the first num_phy - n experts in load order can ever be picked, but
 * selecting them first costs more than building the tree over all n.)
 */
static void replicate(epxi_deepseek *ws, const float *w, int32_t n, int32_t num_phy,
                      int32_t *phy2log, int32_t *phyrank, int32_t *cnt) {
    for (int32_t e = 0; e < n; e++) {
        phy2log[e] = e;
        phyrank[e] = 0;
        cnt[e] = 1;
    }
    if (num_phy == n) return;
    uint64_t *node = ws->node;
    const int32_t m = tree_width(n);
    /* Padding leaves are 0, below every real node (whose low half is ~id). */
    for (int32_t e = 0; e < m; e++) node[m + e] = e < n ? expert_node(fbits(w[e]), e) : 0u;
    tree_build(node, m, true);
    for (int32_t i = n; i < num_phy; i++) {
        const int32_t e = (int32_t) ~(uint32_t)node[1];
        phy2log[i] = e;
        phyrank[i] = cnt[e]++;
        tree_set_max(node, m, e, expert_node(fbits(w[e] / (float)cnt[e]), e));
    }
}

/*
 * vLLM >= 0.14.0's replicate_experts: the quotient load / replicas is
 * float64 (numpy's float32 / int64), recomputed for the chosen expert; the
 * first largest wins (np.argmax). A linear scan, as in pack_f64. Leaves
 * ratio64[e] = w[e] / cnt[e] for every expert, the GPU step's item weights.
 */
static void replicate_f64(epxi_deepseek *ws, const float *w, int32_t n, int32_t num_phy,
                          int32_t *phy2log, int32_t *phyrank, int32_t *cnt) {
    double *q = ws->ratio64;
    for (int32_t e = 0; e < n; e++) {
        phy2log[e] = e;
        phyrank[e] = 0;
        cnt[e] = 1;
        q[e] = (double)w[e];
    }
    for (int32_t i = n; i < num_phy; i++) {
        int32_t best = 0;
        for (int32_t e = 1; e < n; e++)
            if (q[e] > q[best]) best = e;
        phy2log[i] = best;
        phyrank[i] = cnt[best]++;
        q[best] = (double)w[best] / (double)cnt[best];
    }
}

/*
 * numpy's float32 sum of a[0..n) (pairwise_sum, numpy/_core/src/umath/
 * loops_utils.h.src), as vLLM's weight.reshape(...).sum(axis=-1) adds a
 * group: under 8 items one running sum; up to 128, eight running sums over
 * items i, i + 8, ..., combined pairwise, then the items past the last full
 * eight one by one; above 128, the two halves (the first a multiple of 8
 * long) apart. All in float32. The reduction starts from 0 (numpy's
 * identity), which turns a -0 sum into +0.
 */
static float sum_numpy_pairwise(const float *a, int32_t n) {
    if (n < 8) {
        float s = 0.0f;
        for (int32_t i = 0; i < n; i++) s = s + a[i];
        return s;
    }
    if (n <= 128) {
        float r[8];
        for (int j = 0; j < 8; j++) r[j] = a[j];
        int32_t i;
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] = r[j] + a[i + j];
        float s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) s = s + a[i];
        return s;
    }
    int32_t n2 = n / 2;
    n2 -= n2 % 8;
    return sum_numpy_pairwise(a, n2) + sum_numpy_pairwise(a + n2, n - n2);
}

void epxi_deepseek_layer(epxi_deepseek *ws, const float *w, int32_t *p2l, int32_t *prank,
                         int32_t *logcnt) {
    const int32_t E = ws->E, gs = ws->group_size, gpn = ws->groups_per_node;
    const int32_t epn = ws->experts_per_node, ppn = ws->slots_per_node;
    const int32_t ppg = ws->slots_per_gpu;

    /* Step 1: groups to nodes; log2mlog numbers experts node-major. */
    if (gpn == 1) {
        for (int32_t e = 0; e < E; e++) ws->log2mlog[e] = e;
    } else {
        for (int32_t g = 0; g < ws->groups; g++) {
            float s = 0.0f;
            if (ws->vllm_f64)
                s = s + sum_numpy_pairwise(w + (size_t)g * (size_t)gs, gs);
            else
                for (int32_t e = g * gs; e < (g + 1) * gs; e++) s = s + w[e];
            ws->group_load[g] = s;
        }
        balanced_packing(ws, ws->group_load, ws->groups, ws->nodes, ws->group_pack, ws->group_rank);
        for (int32_t e = 0; e < E; e++) {
            const int32_t g = e / gs;
            ws->log2mlog[e] = (ws->group_pack[g] * gpn + ws->group_rank[g]) * gs + e % gs;
        }
    }
    for (int32_t e = 0; e < E; e++) ws->mlog2log[ws->log2mlog[e]] = e;

    for (int32_t n = 0; n < ws->nodes; n++) {
        const int32_t *m2l = ws->mlog2log + (size_t)n * (size_t)epn;
        int32_t *cnt = ws->mlogcnt + (size_t)n * (size_t)epn;
        for (int32_t j = 0; j < epn; j++) ws->row[j] = w[m2l[j]] + 0.0f;
        int32_t *out = p2l + (size_t)n * (size_t)ppn;
        int32_t *out_rank = prank ? prank + (size_t)n * (size_t)ppn : NULL;
        if (ws->vllm_f64) {
            /* Steps 2 and 3 with float64 quotients and pack loads. */
            replicate_f64(ws, ws->row, epn, ppn, ws->phy2mlog, ws->phyrank, cnt);
            for (int32_t p = 0; p < ppn; p++) ws->item64[p] = ws->ratio64[ws->phy2mlog[p]];
            balanced_packing_f64(ws, ws->item64, ppn, ws->gpus_per_node, ws->pack, ws->rank);
            for (int32_t p = 0; p < ppn; p++) {
                const int32_t q = ws->pack[p] * ppg + ws->rank[p];
                out[q] = m2l[ws->phy2mlog[p]];
                if (out_rank) out_rank[q] = ws->phyrank[p];
            }
            continue;
        }
        /* Step 2: replicas within the node. */
        replicate(ws, ws->row, epn, ppn, ws->phy2mlog, ws->phyrank, cnt);
        /* Step 3: replicas to the node's GPUs. */
        /* Load per replica: x / 1 == x, so only replicated experts divide.
         * Slot p < epn holds expert p. */
        float *ratio = ws->slot_ratio;
        memcpy(ratio, ws->row, (size_t)epn * sizeof *ratio);
        for (int32_t p = epn; p < ppn; p++) {
            const int32_t m = ws->phy2mlog[p];
            ratio[m] = ws->row[m] / (float)cnt[m];
        }
        for (int32_t p = 0; p < epn; p++) ws->slot_load[p] = ratio[p];
        for (int32_t p = epn; p < ppn; p++) ws->slot_load[p] = ratio[ws->phy2mlog[p]];
        balanced_packing(ws, ws->slot_load, ppn, ws->gpus_per_node, ws->pack, ws->rank);
        for (int32_t p = 0; p < ppn; p++) {
            const int32_t q = ws->pack[p] * ppg + ws->rank[p];
            out[q] = m2l[ws->phy2mlog[p]];
            if (out_rank) out_rank[q] = ws->phyrank[p];
        }
    }
    if (logcnt)
        for (int32_t e = 0; e < E; e++) logcnt[e] = ws->mlogcnt[ws->log2mlog[e]];
}

/* ---- workspace ---------------------------------------------------------- */

static int32_t max3(int32_t a, int32_t b, int32_t c) {
    int32_t m = a > b ? a : b;
    return m > c ? m : c;
}

epx_status epxi_deepseek_check(int32_t E, int32_t P, int32_t groups, int32_t nodes, int32_t gpus,
                               bool hierarchical, epx_error *err) {
    (void)P, (void)gpus; /* the shape's part, checked by the caller */
    if (!hierarchical) return EPX_OK;
    if (groups < 1)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "the hierarchical policy needs the number of expert groups (%d given): "
                         "pass the model's n_group (DeepSeek-V3: 8)",
                         groups);
    if (E % groups != 0)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "%d experts do not split into %d equal groups: the group count must "
                         "divide the expert count (the model's n_group)",
                         E, groups);
    if (groups % nodes != 0)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "the hierarchical policy packs whole expert groups onto nodes, but %d "
                         "groups do not split evenly over %d nodes: use a node count that "
                         "divides %d, or the global policy (--algorithm deepseek)",
                         groups, nodes, groups);
    return EPX_OK;
}

epx_status epxi_deepseek_create(int32_t E, int32_t P, int32_t groups, int32_t nodes, int32_t gpus,
                                bool hierarchical, epxi_deepseek **out, epx_error *err) {
    if (!hierarchical) groups = nodes = 1;
    epxi_deepseek *ws = epxi_calloc(1, sizeof *ws, "DeepSeek workspace", err);
    if (ws == NULL) return err ? err->status : EPX_ERR_NOMEM;
    ws->E = E;
    ws->P = P;
    ws->groups = groups;
    ws->nodes = nodes;
    ws->gpus = gpus;
    ws->group_size = E / groups;
    ws->groups_per_node = groups / nodes;
    ws->experts_per_node = E / nodes;
    ws->slots_per_node = P / nodes;
    ws->slots_per_gpu = P / gpus;
    ws->gpus_per_node = gpus / nodes;
    const size_t G = (size_t)groups, Ex = (size_t)E, epn = (size_t)ws->experts_per_node;
    const size_t ppn = (size_t)ws->slots_per_node;
    const size_t items = (size_t)max3(groups, ws->slots_per_node, 1);
    const size_t tree = (size_t)tree_width(max3(ws->experts_per_node, nodes, ws->gpus_per_node));
    /* Every array is 4-byte elements: count them, allocate once, carve. */
    /* 8-byte arrays first, so every carve stays aligned. */
    const size_t words = 2 * 2 * tree + 2 * 2 * items + 2 * tree + 2 * items + 2 * epn + G * 3 +
                         Ex * 3 + epn * 2 + ppn * 3 + items * 3 + tree * 2;
    uint32_t *block = epxi_calloc(words, sizeof(uint32_t), "DeepSeek workspace", err);
    if (block == NULL) {
        free(ws);
        return err ? err->status : EPX_ERR_NOMEM;
    }
    ws->block = block;
    uint32_t *cur = block;
#define EPXI_CARVE(field, type, n) (ws->field = (type *)(void *)cur, cur += (n))
    EPXI_CARVE(node, uint64_t, 2 * 2 * tree);
    EPXI_CARVE(sort_a, uint64_t, 2 * items);
    EPXI_CARVE(sort_b, uint64_t, 2 * items);
    EPXI_CARVE(pack_load64, double, 2 * tree);
    EPXI_CARVE(item64, double, 2 * items);
    EPXI_CARVE(ratio64, double, 2 * epn);
    EPXI_CARVE(group_load, float, G);
    EPXI_CARVE(group_pack, int32_t, G);
    EPXI_CARVE(group_rank, int32_t, G);
    EPXI_CARVE(log2mlog, int32_t, Ex);
    EPXI_CARVE(mlog2log, int32_t, Ex);
    EPXI_CARVE(mlogcnt, int32_t, Ex);
    EPXI_CARVE(row, float, epn);
    EPXI_CARVE(slot_ratio, float, epn);
    EPXI_CARVE(phy2mlog, int32_t, ppn);
    EPXI_CARVE(phyrank, int32_t, ppn);
    EPXI_CARVE(slot_load, float, ppn);
    EPXI_CARVE(pack, int32_t, items);
    EPXI_CARVE(rank, int32_t, items);
    EPXI_CARVE(order, int32_t, items);
    EPXI_CARVE(pack_load, float, tree);
    EPXI_CARVE(pack_items, int32_t, tree);
#undef EPXI_CARVE
    *out = ws;
    return EPX_OK;
}

void epxi_deepseek_set_rule(epxi_deepseek *ws, epx_eplb_rule rule) {
    ws->pack_f64 = rule == EPX_EPLB_RULE_SGLANG_F64 || rule == EPX_EPLB_RULE_VLLM_F64;
    ws->torch_order = rule == EPX_EPLB_RULE_SGLANG_F32 || rule == EPX_EPLB_RULE_SGLANG_F64;
    ws->vllm_f64 = rule == EPX_EPLB_RULE_VLLM_F64;
}

void epxi_deepseek_destroy(epxi_deepseek *ws) {
    if (ws == NULL) return;
    free(ws->block);
    free(ws);
}

/* ---- the public entry point -------------------------------------------- */

epx_status epx_plan_deepseek(const float *weight, int32_t L, int32_t E, int32_t P,
                             int32_t num_groups, int32_t num_nodes, int32_t num_gpus,
                             int hierarchical, int32_t *phys_to_log, int32_t *log_to_phys,
                             int32_t *logical_count, epx_error *err) {
    return epx_plan_deepseek_rule(weight, L, E, P, num_groups, num_nodes, num_gpus, hierarchical,
                                  EPX_EPLB_RULE_DEEPSEEK, phys_to_log, log_to_phys, logical_count,
                                  err);
}

epx_status epx_plan_deepseek_rule(const float *weight, int32_t L, int32_t E, int32_t P,
                                  int32_t num_groups, int32_t num_nodes, int32_t num_gpus,
                                  int hierarchical, epx_eplb_rule rule, int32_t *phys_to_log,
                                  int32_t *log_to_phys, int32_t *logical_count, epx_error *err) {
    if (weight == NULL || phys_to_log == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_plan_deepseek: weight and phys_to_log must not be NULL");
    if ((int)rule < EPX_EPLB_RULE_DEEPSEEK || (int)rule > EPX_EPLB_RULE_VLLM_F64)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "EPLB rule %d is unknown: use EPX_EPLB_RULE_DEEPSEEK (0; also vLLM "
                         "<= 0.13.0), EPX_EPLB_RULE_SGLANG_F32 (1, SGLang <= 0.5.10.post1), "
                         "EPX_EPLB_RULE_SGLANG_F64 (2, SGLang >= 0.5.11) or "
                         "EPX_EPLB_RULE_VLLM_F64 (3, vLLM >= 0.14.0); "
                         "epx_sglang_eplb_rule maps an SGLang release to its rule",
                         (int)rule);
    epx_shape s = {L, E, P, num_gpus, hierarchical ? num_nodes : 1};
    EPX_TRY(epx_shape_check(&s, err));
    const size_t le = (size_t)L * (size_t)E;
    for (size_t i = 0; i < le; i++)
        if (!(weight[i] >= 0.0f) || !isfinite(weight[i]))
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "weight of layer %zu, expert %zu is %g: loads must be finite and "
                             ">= 0",
                             i / (size_t)E, i % (size_t)E, (double)weight[i]);
    EPX_TRY(epxi_deepseek_check(E, P, num_groups, num_nodes, num_gpus, hierarchical != 0, err));
    epxi_deepseek *ws = NULL;
    EPX_TRY(
        epxi_deepseek_create(E, P, num_groups, num_nodes, num_gpus, hierarchical != 0, &ws, err));
    epxi_deepseek_set_rule(ws, rule);
    const int32_t X = P - E + 1;
    int32_t *rank = epxi_calloc((size_t)P, sizeof *rank, "replica ranks", err);
    if (rank == NULL) {
        epxi_deepseek_destroy(ws);
        return err ? err->status : EPX_ERR_NOMEM;
    }
    for (int32_t l = 0; l < L; l++) {
        int32_t *p2l = phys_to_log + (size_t)l * (size_t)P;
        int32_t *cnt = logical_count ? logical_count + (size_t)l * (size_t)E : NULL;
        epxi_deepseek_layer(ws, weight + (size_t)l * (size_t)E, p2l, rank, cnt);
        if (log_to_phys != NULL) {
            int32_t *l2p = log_to_phys + (size_t)l * (size_t)E * (size_t)X;
            for (size_t i = 0; i < (size_t)E * (size_t)X; i++) l2p[i] = -1;
            for (int32_t p = 0; p < P; p++) l2p[(size_t)p2l[p] * (size_t)X + (size_t)rank[p]] = p;
        }
    }
    free(rank);
    epxi_deepseek_destroy(ws);
    return EPX_OK;
}

/* DeepSeek plans for float32 loads: the windows summed, then rounded. Here,
 * not in plan.c, so that epx_plan.c (which plans from the same baseline)
 * and plan.c both call down into this file and never into each other. */
epx_status epxi_plan_load_f32(const epx_counts *c, float *out, epx_error *err) {
    const size_t le = (size_t)c->num_layers * (size_t)c->num_experts;
    for (size_t i = 0; i < le; i++) {
        /* Sum in double: token counts stay exact up to 2^53, as SGLang's
         * int64 sum, and only the total is rounded to float32. */
        const double x = epxi_window_sum(c, 0, c->num_windows, i);
        if (x > FLT_MAX)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "the load of layer %zu, expert %zu summed over windows is %g, "
                             "beyond float32 (DeepSeek's EPLB computes in float32): scale the "
                             "counts down",
                             i / (size_t)c->num_experts, i % (size_t)c->num_experts, x);
        out[i] = (float)x;
    }
    return EPX_OK;
}

/* SGLang's EPLB copy changed once, at 0.5.11 (epx_eplb_rule in plan.h). */
epx_status epx_sglang_eplb_rule(const char *release, epx_eplb_rule *rule, int32_t *newer,
                                epx_error *err) {
    long v[4];
    bool is_newer = false;
    if (rule == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "epx_sglang_eplb_rule: rule is required");
    EPX_TRY(epxi_sglang_release(release, v, &is_newer, err));
    static const long r0511[4] = {0, 5, 11, 0};
    *rule = epxi_release_cmp(v, r0511) < 0 ? EPX_EPLB_RULE_SGLANG_F32 : EPX_EPLB_RULE_SGLANG_F64;
    if (newer) *newer = is_newer;
    return EPX_OK;
}
