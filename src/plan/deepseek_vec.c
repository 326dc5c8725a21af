/*
 * deepseek_vec.c - SGLang's `deepseek_vec` and `deepseek_vec_hierarchical`
 * EPLB algorithms (sglang/srt/eplb/eplb_algorithms/deepseek_vec.py, the
 * same file in every release from 0.5.2 to 0.5.23), reproduced from a
 * reading of the release, for epx plan --algorithm deepseek-vec[-hierarchical].
 *
 * Where DeepSeek's EPLB plans for the sum of the steps, this one keeps the
 * series [S][L][E]: each redundant slot goes to the expert that most lowers
 * the sum over steps of each step's largest per-replica load. Per slot and
 * step it finds the step's most loaded expert (first index on ties), the
 * step's maximum if that expert got the slot, and sums over the steps; the
 * expert with the smallest sum (first index on ties) gets the slot. The
 * hierarchical form first packs whole expert groups onto nodes (heaviest
 * group first, into the lightest node with room) and then plans each node's
 * share of slots as a chunk. Then, per chunk, the slots are sorted by
 * per-replica load (torch's unstable sort: torch_sort.c) and dealt to the
 * GPUs in a snake: round j goes left to right when j is even, right to left
 * when odd.
 *
 * Arithmetic is float32, as torch computes it on the CPU (SGLang runs the
 * global form on the tensor's device; on a GPU its sums add in another
 * order, which this file does not claim): each step's count is a float32,
 * the tie-breaker e * 1e-4 is float32, quotients are float32, and the sums
 * over steps are torch's CPU sums (torch_sum.c). Counts that are all whole
 * numbers are SGLang's integer dump (stat mode records int32): then the
 * global form's slot sort uses the exact integer sum, rounded to float32;
 * other counts are a float32 tensor, summed as torch sums it. The
 * hierarchical form converts to float32 first, as the release does.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "plan_internal.h"

typedef struct {
    int32_t S, L, E, P, C, Ppc, Epc, Rpc, nloc;
    const float *x;   /* [S][L][E] the series, in the chunks' expert order */
    const float *tok; /* [L][E] the sum over steps, for the slot sort */
    /* scratch */
    float *M, *NM, *seq; /* [S] each step's max, its max after the slot, one column */
    int32_t *arg;        /* [S] each step's most loaded expert */
    int32_t *seen;       /* [E] stamp: an expert is some step's argmax */
    int32_t *cnt;        /* [E] replicas so far */
    float *off;          /* [E] e * 1e-4 */
    float *score;        /* [P] */
    int32_t *ord;        /* [P] */
    int32_t *p2m, *rk;   /* [P] before the GPU packing */
} vec_ws;

/* The slots of chunk c of layer l: Rpc redundant slots, one at a time. */
static void replicate_chunk(vec_ws *w, int32_t l, int32_t c) {
    const int32_t S = w->S, E = w->E, Epc = w->Epc, e0 = c * w->Epc;
    const int64_t cols = (int64_t)w->L * E, base = (int64_t)l * E;
    for (int32_t i = 0; i < w->Rpc; i++) {
        const int32_t stamp = l * w->C * w->Rpc + c * w->Rpc + i + 1;
        for (int32_t s = 0; s < S; s++) {
            const float *xs = w->x + ((size_t)s * (size_t)w->L + (size_t)l) * (size_t)E + e0;
            int32_t m = 0;
            float best = (xs[0] + w->off[e0]) / (float)w->cnt[e0];
            for (int32_t e = 1; e < Epc; e++) {
                const float v = (xs[e] + w->off[e0 + e]) / (float)w->cnt[e0 + e];
                if (v > best) {
                    best = v;
                    m = e;
                }
            }
            /* the step's max once expert m has one replica more */
            float nm = xs[m] / (float)(w->cnt[e0 + m] + 1);
            for (int32_t e = 0; e < Epc; e++) {
                if (e == m) continue;
                const float v = (xs[e] + w->off[e0 + e]) / (float)w->cnt[e0 + e];
                if (v > nm) nm = v;
            }
            w->M[s] = best;
            w->NM[s] = nm;
            w->arg[s] = m;
            w->seen[e0 + m] = stamp;
        }
        /* An expert that is no step's argmax sums the maxima alone; its
         * column's form of sum is all that tells two of them apart. */
        float plain[3];
        bool have[3] = {false, false, false};
        int32_t r = -1;
        float rbest = 0.0f;
        for (int32_t e = 0; e < Epc; e++) {
            const int64_t col = base + e0 + e;
            const epxi_torch_sum_kind kind = epxi_torch_sum_outer_kind(col, cols);
            float v;
            if (w->seen[e0 + e] == stamp) {
                for (int32_t s = 0; s < S; s++) w->seq[s] = w->arg[s] == e ? w->NM[s] : w->M[s];
                v = epxi_torch_sum(w->seq, S, 1, kind);
            } else {
                if (!have[kind]) {
                    plain[kind] = epxi_torch_sum(w->M, S, 1, kind);
                    have[kind] = true;
                }
                v = plain[kind];
            }
            if (r < 0 || v < rbest) {
                rbest = v;
                r = e;
            }
        }
        const int32_t slot = c * w->Ppc + Epc + i;
        w->p2m[slot] = e0 + r;
        w->rk[slot] = w->cnt[e0 + r]++;
    }
}

/* One layer: out_map/out_rank [P] in the chunks' expert order. */
static void plan_layer(vec_ws *w, int32_t l, int32_t *out_map, int32_t *out_rank) {
    const int32_t E = w->E, P = w->P;
    for (int32_t e = 0; e < E; e++) w->cnt[e] = 1;
    for (int32_t c = 0; c < w->C; c++) {
        for (int32_t j = 0; j < w->Epc; j++) {
            w->p2m[c * w->Ppc + j] = c * w->Epc + j;
            w->rk[c * w->Ppc + j] = 0;
        }
        replicate_chunk(w, l, c);
    }
    if (w->nloc == 1) {
        memcpy(out_map, w->p2m, (size_t)P * sizeof *out_map);
        memcpy(out_rank, w->rk, (size_t)P * sizeof *out_rank);
        return;
    }
    /* The GPU packing: sort each chunk's slots by per-replica load, deal
     * them round by round in a snake. */
    const float *tok = w->tok + (size_t)l * (size_t)E;
    for (int32_t p = 0; p < P; p++) w->score[p] = tok[w->p2m[p]] / (float)w->cnt[w->p2m[p]];
    const int32_t ngc = w->Ppc / w->nloc;
    for (int32_t c = 0; c < w->C; c++) {
        const int32_t at = c * w->Ppc;
        epxi_sort_desc_torch(w->score + at, w->Ppc, w->ord);
        for (int32_t g = 0; g < ngc; g++)
            for (int32_t j = 0; j < w->nloc; j++) {
                const int32_t from = at + w->ord[j * ngc + ((j & 1) ? ngc - 1 - g : g)];
                out_map[at + g * w->nloc + j] = w->p2m[from];
                out_rank[at + g * w->nloc + j] = w->rk[from];
            }
    }
}

/* pack_groups: the groups of one layer onto nodes; perm [K] (out) each
 * group's place in the node-major order. */
static void pack_groups(const float *tpg, int32_t K, int32_t N, int32_t *ord, float *node_tok,
                        int32_t *node_n, int32_t *perm) {
    const int32_t per = K / N;
    epxi_sort_desc_torch(tpg, K, ord);
    for (int32_t n = 0; n < N; n++) {
        node_tok[n] = 0.0f;
        node_n[n] = 0;
    }
    for (int32_t i = 0; i < K; i++) {
        const int32_t g = ord[i];
        int32_t b = -1;
        for (int32_t n = 0; n < N; n++)
            if (node_n[n] < per && (b < 0 || node_tok[n] < node_tok[b])) b = n;
        perm[g] = b * per + node_n[b];
        node_tok[b] += tpg[g];
        node_n[b]++;
    }
}

epx_status epxi_deepseek_vec(const epx_counts *counts, const epx_shape *shape, int32_t groups,
                             bool hier, int32_t *map, int32_t *rank, epx_error *err) {
    const int32_t S = counts->num_windows, L = shape->num_layers, E = shape->num_logical_experts,
                  P = shape->num_physical_experts, N = shape->num_nodes;
    const size_t SLE = (size_t)S * (size_t)L * (size_t)E, LE = (size_t)L * (size_t)E;
    vec_ws w = {0};
    w.S = S;
    w.L = L;
    w.E = E;
    w.P = P;
    w.C = hier ? N : 1;
    w.Ppc = P / w.C;
    w.Epc = E / w.C;
    w.Rpc = (P - E) / w.C;
    w.nloc = P / shape->num_gpus;
    const int32_t K = hier ? groups : 1;
    epx_status st = EPX_ERR_NOMEM;
    float *x = epxi_calloc(SLE, sizeof *x, "the float32 series", err);
    float *xm = hier && x ? epxi_calloc(SLE, sizeof *xm, "the series by node", err) : x;
    float *tok = xm ? epxi_calloc(LE, sizeof *tok, "load sums", err) : NULL;
    /* float scratch: M, NM, seq [S], off [E], score [P], node loads [N];
     * int32 scratch: arg [S], seen, cnt [E], ord, p2m, rk [P], the group
     * order and places [K], node fill [N] */
    float *fs = tok ? epxi_calloc(3 * (size_t)S + (size_t)E + (size_t)P + (size_t)N, sizeof(float),
                                  "scratch", err)
                    : NULL;
    int32_t *is =
        fs ? epxi_calloc((size_t)S + 2 * (size_t)E + 3 * (size_t)P + 2 * (size_t)K + (size_t)N,
                         sizeof(int32_t), "scratch", err)
           : NULL;
    int32_t *lmap = is ? epxi_calloc(2 * (size_t)P, sizeof *lmap, "layer map", err) : NULL;
    if (lmap == NULL) goto done;
    w.M = fs;
    w.NM = w.M + S;
    w.seq = w.NM + S;
    w.off = w.seq + S;
    w.score = w.off + E;
    float *node_tok = w.score + P;
    w.arg = is;
    w.seen = w.arg + S;
    w.cnt = w.seen + E;
    w.ord = w.cnt + E;
    w.p2m = w.ord + P;
    w.rk = w.p2m + P;
    int32_t *gord = w.rk + P, *perm = gord + K, *node_n = perm + K;
    int32_t *lrank = lmap + P;

    bool whole = true;
    for (size_t i = 0; i < SLE; i++) {
        const double v = counts->data[i];
        if (v > FLT_MAX) {
            st = epxi_fail(err, EPX_ERR_INVALID_ARG,
                           "counts entry [window %zu][layer %zu][expert %zu] is %g, beyond "
                           "float32 (deepseek_vec computes in float32): scale the counts down",
                           i / LE, (i % LE) / (size_t)E, i % (size_t)E, v);
            goto done;
        }
        x[i] = (float)v;
        whole = whole && v == floor(v);
    }
    for (int32_t e = 0; e < E; e++) w.off[e] = (float)e * 1e-4f;

    if (hier) {
        /* group loads: the sum over steps, then over each group's experts */
        const int32_t gs = E / K;
        for (size_t j = 0; j < LE; j++)
            tok[j] = epxi_torch_sum(x + j, S, (int64_t)LE,
                                    epxi_torch_sum_outer_kind((int64_t)j, (int64_t)LE));
        float *tpg = epxi_calloc((size_t)L * (size_t)K, sizeof *tpg, "group loads", err);
        if (tpg == NULL) goto done;
        epxi_torch_sum_rows(tok, (int64_t)L * K, gs, tpg);
        /* per layer: the expert order by node, and the series in it */
        int32_t *l2m_all = epxi_calloc(2 * LE, sizeof *l2m_all, "expert orders", err);
        if (l2m_all == NULL) {
            free(tpg);
            goto done;
        }
        for (int32_t l = 0; l < L; l++) {
            pack_groups(tpg + (size_t)l * (size_t)K, K, N, gord, node_tok, node_n, perm);
            int32_t *l2m = l2m_all + (size_t)l * (size_t)E, *m2l = l2m_all + LE + (size_t)l * E;
            for (int32_t e = 0; e < E; e++) {
                l2m[e] = perm[e / gs] * gs + e % gs;
                m2l[l2m[e]] = e;
            }
            for (int32_t s = 0; s < S; s++) {
                const size_t row = ((size_t)s * (size_t)L + (size_t)l) * (size_t)E;
                for (int32_t m = 0; m < E; m++) xm[row + (size_t)m] = x[row + (size_t)m2l[m]];
            }
        }
        free(tpg);
        /* the slot sort's loads: torch's sum of the series by node */
        for (size_t j = 0; j < LE; j++)
            tok[j] = epxi_torch_sum(xm + j, S, (int64_t)LE,
                                    epxi_torch_sum_outer_kind((int64_t)j, (int64_t)LE));
        w.x = xm;
        w.tok = tok;
        for (int32_t l = 0; l < L; l++) {
            plan_layer(&w, l, lmap, lrank);
            const int32_t *m2l = l2m_all + LE + (size_t)l * E;
            for (int32_t p = 0; p < P; p++) {
                map[(size_t)l * (size_t)P + (size_t)p] = m2l[lmap[p]];
                rank[(size_t)l * (size_t)P + (size_t)p] = lrank[p];
            }
        }
        free(l2m_all);
    } else {
        for (size_t j = 0; j < LE; j++) {
            if (whole) {
                /* an integer tensor: the exact int64 sum, then float32 */
                tok[j] = (float)epxi_window_sum(counts, 0, S, j);
            } else {
                tok[j] = epxi_torch_sum(x + j, S, (int64_t)LE,
                                        epxi_torch_sum_outer_kind((int64_t)j, (int64_t)LE));
            }
        }
        w.x = x;
        w.tok = tok;
        for (int32_t l = 0; l < L; l++)
            plan_layer(&w, l, map + (size_t)l * (size_t)P, rank + (size_t)l * (size_t)P);
    }
    st = EPX_OK;
done:
    if (xm != x) free(xm);
    free(x);
    free(tok);
    free(fs);
    free(is);
    free(lmap);
    return st;
}
