/*
 * dispatch.cu - the per-batch dispatch path on the GPU: logical ids to
 * slots, the fused map + count + layout kernel, and the row scatter and
 * weighted combine. Each kernel computes what its CPU reference in
 * src/dispatch/token.c computes; the shared arithmetic (Philox, replica
 * choice, bf16 rounding) is the same source, dispatch_common.h.
 *
 * The layout kernel runs as ONE cluster of 8 blocks (Hopper thread block
 * clusters). Block b owns a contiguous eighth of the tokens, and warp w of a
 * block a contiguous piece of that, so "token order" inside every bucket of
 * the two send orders is just the order of (block, warp, round, lane):
 *   A. each lane maps one token's K ids, writes phys and is_token_in_rank,
 *      marks the token's representative pair per rank (lowest slot there),
 *      and counts pairs and representatives per slot into its warp's
 *      histogram (one 32-bit word per slot: pairs in the low 16 bits,
 *      representatives in the high 16);
 *   B. the warp histograms become per-warp prefixes; the blocks read each
 *      other's totals through distributed shared memory (cluster barrier),
 *      so every block knows the totals, the offsets (a block-wide scan over
 *      slots) and the counts of the blocks before it;
 *   C. each warp walks its pairs again in index order, 32 at a time, and
 *      ranks equal slots inside the round with __match_any_sync; the warp's
 *      running counters advance by the group sizes.
 * No global workspace, no atomics on global memory, and nothing depends on
 * scheduling order, so the layout is deterministic and equal to the CPU's.
 */
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epx.h"
extern "C" {
#include "internal.h" /* C linkage: epxi_fail lives in the C library */
}
#include "cuda_check.h"
#include "dispatch_cuda.h"
#include "../dispatch/dispatch_common.h"

namespace cg = cooperative_groups;

namespace {

constexpr int kCluster = 8;   /* blocks of the layout cluster        */
constexpr int kMaxWarps = 16; /* warps of a layout block, at most    */

struct MapArgs {
    int mode;
    int32_t E, P, W;
    const int32_t *table, *replicas, *num_valid;
    const uint32_t *thresholds;
    uint64_t seed;
    uint32_t pass, layer;
};

MapArgs map_args(const epx_dispatch_spec *s) {
    MapArgs a;
    a.mode = (int)s->mode;
    a.E = s->num_experts;
    a.P = s->num_physical;
    a.W = s->width;
    a.table = s->table;
    a.replicas = s->replicas;
    a.num_valid = s->num_valid;
    a.thresholds = s->thresholds;
    a.seed = s->seed;
    a.pass = s->pass;
    a.layer = s->layer;
    return a;
}

/* One id to one slot; bad ids become -1 (the CPU reference rejects them). */
__device__ __forceinline__ int32_t map_one(const MapArgs &a, int32_t e, uint32_t t, uint32_t k) {
    if (a.mode == EPX_DISPATCH_PHYSICAL) return e >= 0 && e < a.P ? e : -1;
    if (e < 0 || e >= a.E) return -1;
    if (a.mode == EPX_DISPATCH_STATIC) return __ldg(a.table + e);
    int32_t n = __ldg(a.num_valid + e);
    if (a.mode == EPX_DISPATCH_ROW) /* SGLang's rank_invariant: the token's row */
        return __ldg(a.replicas + (size_t)e * (size_t)a.W + (size_t)(t % (uint32_t)n));
    uint32_t word = epxi_dispatch_word(a.seed, a.pass, a.layer, t, k);
    int32_t j = a.mode == EPX_DISPATCH_DYNAMIC
                    ? epxi_uniform_index(word, n)
                    : epxi_weighted_index(word, a.thresholds + (size_t)e * (size_t)a.W, n);
    return __ldg(a.replicas + (size_t)e * (size_t)a.W + (size_t)j);
}

__global__ void map_kernel(MapArgs a, const int32_t *__restrict__ ids, int64_t n, int32_t K,
                           int32_t *__restrict__ phys) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / K;
        phys[i] = map_one(a, __ldg(ids + i), (uint32_t)t, (uint32_t)(i - t * K));
    }
}

struct LayoutArgs {
    MapArgs map;
    const int32_t *ids;
    int32_t T, K, P, G, per;
    int32_t chunk;     /* tokens per block: ceil(T / 8)            */
    int32_t wchunk;    /* tokens per token warp: ceil(chunk / nw)  */
    int32_t nw;        /* token warps (histograms) per block       */
    int in_rank_words; /* is_token_in_rank rows as 32-bit words */
    int phys_smem;     /* keep the block's phys in shared memory for phase C */
    int need_pos;      /* any send-order output wanted (else phase C is skipped) */
    int32_t *phys;
    int64_t *tokens_per_rank, *tokens_per_slot;
    uint8_t *in_rank;
    int32_t *rank_offsets, *rank_perm, *pair_rank_pos;
    int32_t *slot_offsets, *slot_perm, *pair_slot_pos;
};

__device__ __forceinline__ uint32_t lanemask_lt() {
    uint32_t m;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
    return m;
}

/* Exclusive scan of a[0..n) and b[0..n) in place, a[n] and b[n] = totals,
 * by all threads of the block. ws holds 2 * 32 ints. */
__device__ void block_scan2(int32_t *a, int32_t *b, int32_t n, int32_t *ws) {
    int nt = blockDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int32_t ipt = (n + nt - 1) / nt, lo = tid * ipt, hi = min(n, lo + ipt);
    int32_t sa = 0, sb = 0;
    for (int32_t i = lo; i < hi; i++) sa += a[i], sb += b[i];
    int32_t ia = sa, ib = sb; /* inclusive within the warp */
    for (int d = 1; d < 32; d <<= 1) {
        int32_t xa = __shfl_up_sync(0xffffffffu, ia, d), xb = __shfl_up_sync(0xffffffffu, ib, d);
        if (lane >= d) ia += xa, ib += xb;
    }
    if (lane == 31) ws[warp] = ia, ws[32 + warp] = ib;
    __syncthreads();
    if (warp == 0) {
        int nwarps = nt >> 5;
        int32_t va = lane < nwarps ? ws[lane] : 0, vb = lane < nwarps ? ws[32 + lane] : 0;
        for (int d = 1; d < 32; d <<= 1) {
            int32_t xa = __shfl_up_sync(0xffffffffu, va, d),
                    xb = __shfl_up_sync(0xffffffffu, vb, d);
            if (lane >= d) va += xa, vb += xb;
        }
        if (lane < nwarps) ws[lane] = va, ws[32 + lane] = vb; /* inclusive */
    }
    __syncthreads();
    int32_t ea = (warp ? ws[warp - 1] : 0) + ia - sa, eb = (warp ? ws[32 + warp - 1] : 0) + ib - sb;
    for (int32_t i = lo; i < hi; i++) {
        int32_t x = a[i], y = b[i];
        a[i] = ea;
        b[i] = eb;
        ea += x;
        eb += y;
    }
    if (tid == nt - 1) a[n] = ws[(nt >> 5) - 1], b[n] = ws[32 + (nt >> 5) - 1];
    __syncthreads();
}

/* Phase A for one token: map its K ids, write phys (and the block's shared
 * copy), is_token_in_rank, and its representative mask. */
/* Both layout kernels' output pointers, from the caller's layout. */
template <typename Args> void set_outputs(Args &a, const epx_token_layout *out) {
    a.tokens_per_rank = out->tokens_per_rank;
    a.tokens_per_slot = out->tokens_per_slot;
    a.in_rank = out->is_token_in_rank;
    a.rank_offsets = out->rank_offsets;
    a.rank_perm = out->rank_perm;
    a.pair_rank_pos = out->pair_rank_pos;
    a.slot_offsets = out->slot_offsets;
    a.slot_perm = out->slot_perm;
    a.pair_slot_pos = out->pair_slot_pos;
}

/* What both layout kernels publish from the block's exclusive sums
 * (sum_s over slots, sum_r over ranks with `per` entries a rank): the slot
 * and rank offsets and the tokens per rank. */
template <typename Args>
__device__ void publish_offsets(const Args &a, const int32_t *sum_s, const int32_t *sum_r,
                                int32_t P, int32_t per, int32_t tid, int32_t nt) {
    if (a.slot_offsets)
        for (int32_t q = tid; q <= P; q += nt) a.slot_offsets[q] = sum_s[q];
    for (int32_t q = tid; q <= a.G; q += nt) {
        if (a.rank_offsets) a.rank_offsets[q] = sum_r[q * per];
        if (a.tokens_per_rank && q < a.G)
            a.tokens_per_rank[q] = sum_r[(q + 1) * per] - sum_r[q * per];
    }
}

template <int KMAX>
__device__ __forceinline__ void map_token(const LayoutArgs &a, int32_t t, int32_t t0, int32_t *p,
                                          uint32_t &rep, int32_t *sphys, uint32_t *repmask) {
    const int32_t K = a.K, per = a.per;
    int32_t g[KMAX];
#pragma unroll
    for (int k = 0; k < KMAX; k++) {
        p[k] = -1;
        if (k < K)
            p[k] = map_one(a.map, __ldg(a.ids + (size_t)t * K + k), (uint32_t)t, (uint32_t)k);
    }
    rep = 0;
    uint64_t present = 0;
#pragma unroll
    for (int k = 0; k < KMAX; k++) {
        g[k] = p[k] >= 0 ? p[k] / per : -1;
        if (k < K) {
            a.phys[(size_t)t * K + k] = p[k];
            if (sphys) sphys[(size_t)(t - t0) * K + k] = p[k];
        }
    }
#pragma unroll
    for (int k = 0; k < KMAX; k++) {
        bool r = k < K && p[k] >= 0;
#pragma unroll
        for (int j = 0; j < KMAX; j++)
            if (j != k && j < K && g[j] == g[k] && (p[j] < p[k] || (p[j] == p[k] && j < k)))
                r = false;
        if (r) {
            rep |= 1u << k;
            if (g[k] < 64) present |= 1ull << g[k];
        }
    }
    repmask[t - t0] = rep;
    if (a.in_rank) {
        uint8_t *row = a.in_rank + (size_t)t * a.G;
        if (a.G <= 64 && a.in_rank_words) {
            for (int32_t q = 0; q < a.G / 4; q++) {
                uint32_t m = (uint32_t)(present >> (4 * q)) & 0xfu;
                ((uint32_t *)row)[q] =
                    (m & 1u) | ((m >> 1 & 1u) << 8) | ((m >> 2 & 1u) << 16) | ((m >> 3 & 1u) << 24);
            }
        } else if (a.G <= 64) {
            for (int32_t q = 0; q < a.G; q++) row[q] = (uint8_t)(present >> q & 1u);
        } else {
            for (int32_t q = 0; q < a.G; q++) row[q] = 0;
#pragma unroll
            for (int k = 0; k < KMAX; k++)
                if (rep >> k & 1u) row[g[k]] = 1;
        }
    }
}

/* Count one token's pairs (low half) and representatives (high half). */
template <int KMAX>
__device__ __forceinline__ void count_token(uint32_t *h, const int32_t *p, uint32_t rep,
                                            int32_t K) {
#pragma unroll
    for (int k = 0; k < KMAX; k++)
        if (k < K && p[k] >= 0) atomicAdd(&h[p[k]], (rep >> k & 1u) ? 0x10001u : 1u);
}

template <int KMAX>
__global__ void __launch_bounds__(32 * kMaxWarps, 1) layout_kernel(LayoutArgs a) {
    extern __shared__ uint32_t smem[];
    cg::cluster_group cluster = cg::this_cluster();
    const int32_t P = a.P, K = a.K, per = a.per, nw = a.nw;
    const int rank = (int)cluster.block_rank(), ncl = (int)cluster.num_blocks();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nt = blockDim.x;
    uint32_t *hist = smem;                           /* [nw][P] packed     */
    uint32_t *tot = hist + (size_t)nw * P;           /* [P] packed totals  */
    int32_t *base_s = (int32_t *)(tot + P);          /* [P]                */
    int32_t *base_r = base_s + P;                    /* [P]                */
    int32_t *sum_s = base_r + P;                     /* [P + 1]            */
    int32_t *sum_r = sum_s + P + 1;                  /* [P + 1]            */
    uint32_t *repmask = (uint32_t *)(sum_r + P + 1); /* [chunk]            */
    int32_t *ws = (int32_t *)(repmask + a.chunk);    /* [64]               */
    int32_t *sphys = a.phys_smem ? ws + 64 : NULL;   /* [chunk][K]         */

    const int32_t t0 = rank * a.chunk, t1 = min(a.T, t0 + a.chunk);
    const int32_t wb = min(t1, t0 + warp * a.wchunk), we = min(t1, wb + a.wchunk);

    /* A. map, is_token_in_rank, representatives, warp histograms. The first
     * token of each lane is mapped before the histograms are cleared, so
     * its loads overlap the clearing and the barrier. */
    int32_t p[KMAX];
    uint32_t rep = 0;
    const int32_t ta = wb + lane;
    const bool first = warp < nw && ta < we;
    if (first) map_token<KMAX>(a, ta, t0, p, rep, sphys, repmask);
    for (int32_t i = tid; i < nw * P; i += nt) hist[i] = 0;
    __syncthreads();
    if (first) {
        count_token<KMAX>(hist + warp * P, p, rep, K);
        for (int32_t t = ta + 32; t < we; t += 32) {
            map_token<KMAX>(a, t, t0, p, rep, sphys, repmask);
            count_token<KMAX>(hist + warp * P, p, rep, K);
        }
    }
    __syncthreads();

    /* B. warp prefixes, block totals, cluster exchange, offsets */
    for (int32_t q = tid; q < P; q += nt) {
        uint32_t run = 0;
        for (int w = 0; w < nw; w++) {
            uint32_t v = hist[w * P + q];
            hist[w * P + q] = run;
            run += v;
        }
        tot[q] = run;
    }
    cluster.sync();
    for (int32_t q = tid; q < P; q += nt) {
        int32_t s = 0, r = 0, ts = 0, tr = 0;
        for (int b = 0; b < ncl; b++) {
            uint32_t v = cluster.map_shared_rank(tot, b)[q];
            int32_t lo = (int32_t)(v & 0xffffu), hi = (int32_t)(v >> 16);
            if (b < rank) s += lo, r += hi;
            ts += lo;
            tr += hi;
        }
        base_s[q] = s;
        base_r[q] = r;
        sum_s[q] = ts;
        sum_r[q] = tr;
        if (rank == 0 && a.tokens_per_slot) a.tokens_per_slot[q] = ts;
    }
    /* Remote reads are done: let the other blocks go on (and, eventually,
     * exit); wait for them only at the very end. */
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    __syncthreads();
    block_scan2(sum_s, sum_r, P, ws);
    for (int32_t q = tid; q < P; q += nt) base_s[q] += sum_s[q], base_r[q] += sum_r[q];
    if (rank == 0) publish_offsets(a, sum_s, sum_r, P, per, tid, nt);
    __syncthreads();

    /* C. positions, in pair index order within each warp's range */
    if (warp < nw && a.need_pos) {
        uint32_t *h = hist + warp * P;
        const int64_t ib = (int64_t)wb * K, ie = (int64_t)we * K;
        const uint32_t lt = lanemask_lt();
        for (int64_t i0 = ib; i0 < ie; i0 += 32) {
            int64_t i = i0 + lane;
            bool valid = i < ie;
            int32_t p = !valid ? -1 : sphys ? sphys[i - (int64_t)t0 * K] : a.phys[i];
            int32_t t = (int32_t)(i / K), k = (int32_t)(i - (int64_t)t * K);
            bool rep = p >= 0 && (repmask[t - t0] >> k & 1u);
            uint32_t ms = __match_any_sync(0xffffffffu, p);
            uint32_t mr = __match_any_sync(0xffffffffu, rep ? p : -1);
            int32_t ps = -1, pr = -1;
            if (p >= 0) {
                uint32_t hv = h[p];
                ps = base_s[p] + (int32_t)(hv & 0xffffu) + __popc(ms & lt);
                if (rep) pr = base_r[p] + (int32_t)(hv >> 16) + __popc(mr & lt);
            }
            __syncwarp();
            if (p >= 0 && (ms & lt) == 0) atomicAdd(&h[p], (uint32_t)__popc(ms));
            if (rep && (mr & lt) == 0) atomicAdd(&h[p], (uint32_t)__popc(mr) << 16);
            __syncwarp();
            if (valid) {
                if (a.pair_slot_pos) a.pair_slot_pos[i] = ps;
                if (a.pair_rank_pos) a.pair_rank_pos[i] = pr;
                if (ps >= 0 && a.slot_perm) a.slot_perm[ps] = (int32_t)i;
                if (pr >= 0 && a.rank_perm) a.rank_perm[pr] = t;
            }
        }
    }
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

/* ---- the compact layout kernel (the default) ------------------------------
 * Same outputs as layout_kernel, organised for a short critical path and a
 * small instruction footprint (layout_kernel<8> is ~96 KB of machine code:
 * the map, Philox included, is unrolled per k and inlined twice):
 *   1. one pair per thread: map, write phys and the block's shared copy;
 *   2. one token per thread: representatives (flagged in bit 30 of the shared
 *      copy) and is_token_in_rank;
 *   3. each ranking warp walks a contiguous range of pairs, 32 at a time,
 *      ranks equal slots inside the round (match_any or bit ballots) and
 *      keeps running per-slot counters (pairs low 16 bits, representatives
 *      high 16): the local rank of every pair, and the warp's totals;
 *   4. exclusive prefix of the warp totals per slot (one warp scan per slot);
 *      with several blocks, each block PUSHES its totals into every block's
 *      shared memory and one cluster barrier follows, so no remote read and
 *      no second barrier before exit;
 *   5. one warp scans the slot totals into the offsets;
 *   6. every thread turns local ranks into positions and writes the orders.
 * A batch of one block is launched without cluster attributes. */
struct FastArgs {
    MapArgs map;
    const int32_t *ids;
    int32_t T, K, P, G, per;
    int32_t chunk;  /* tokens per block                      */
    int32_t nw;     /* ranking warps (histograms) per block  */
    int32_t wshift; /* log2 of the pairs per ranking warp    */
    int32_t nbits;  /* P <= 1 << nbits                       */
    int in_rank_words, need_pos;
    int32_t *phys;
    int64_t *tokens_per_rank, *tokens_per_slot;
    uint8_t *in_rank;
    int32_t *rank_offsets, *rank_perm, *pair_rank_pos;
    int32_t *slot_offsets, *slot_perm, *pair_slot_pos;
};

constexpr int32_t kRepFlag = 0x40000000;
/* AUTO uses the compact kernel only for tiny batches (T * K <=
 * kAutoCompactPairs), where the H200 variant table (bench/RESULTS.md) has it
 * faster: 5.7 against 7.9 us at T = 1 (8 pairs). At T = 64 (512 pairs) the
 * old cluster kernel wins (9.8 against 12.3 us), and from T = 512 up by
 * 1.4-3x, so larger batches stay on layout_kernel. The threshold of 64 pairs
 * lies between the measured points. Both kernels pass the same GPU test. */
constexpr int64_t kAutoCompactPairs = 64;
constexpr bool kAutoBallot = true;

/* is_token_in_rank row of one token from its representatives' ranks. */
__device__ __forceinline__ void write_in_rank(const FastArgs &a, int32_t t, uint64_t present,
                                              const int32_t *row, uint32_t rep) {
    uint8_t *out = a.in_rank + (size_t)t * a.G;
    if (a.G <= 64 && a.in_rank_words) {
        for (int32_t q = 0; q < a.G / 4; q++) {
            uint32_t m = (uint32_t)(present >> (4 * q)) & 0xfu;
            ((uint32_t *)out)[q] =
                (m & 1u) | ((m >> 1 & 1u) << 8) | ((m >> 2 & 1u) << 16) | ((m >> 3 & 1u) << 24);
        }
    } else if (a.G <= 64) {
        for (int32_t q = 0; q < a.G; q++) out[q] = (uint8_t)(present >> q & 1u);
    } else {
        for (int32_t q = 0; q < a.G; q++) out[q] = 0;
        for (int32_t k = 0; k < a.K; k++)
            if (rep >> k & 1u) out[row[k] / a.per] = 1;
    }
}

template <bool CL, bool BALLOT>
__global__ void __launch_bounds__(1024, 1) fast_layout_kernel(FastArgs a) {
    extern __shared__ uint32_t smem[];
    const int32_t P = a.P, K = a.K, nw = a.nw, per = a.per;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nt = blockDim.x,
              nwarps = nt >> 5;
    int rank = 0, ncl = 1;
    if constexpr (CL) {
        cg::cluster_group cluster = cg::this_cluster();
        rank = (int)cluster.block_rank();
        ncl = (int)cluster.num_blocks();
        /* every block must have started before others write into its shared
         * memory: arrive now, wait just before the push (phase 4) */
        asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    }
    const int32_t nmax = a.chunk * K;
    int32_t *skey = (int32_t *)smem;                         /* [nmax]      */
    uint32_t *sloc = (uint32_t *)(skey + nmax);              /* [nmax]      */
    uint32_t *hist = sloc + nmax;                            /* [nw][P]     */
    uint32_t *tot = hist + (size_t)nw * P;                   /* [P]         */
    uint32_t *recv = tot + P;                                /* [ncl][P]    */
    int32_t *sum_s = (int32_t *)(recv + (CL ? ncl * P : 0)); /* [P + 1]     */
    int32_t *sum_r = sum_s + P + 1;                          /* [P + 1]     */
    int32_t *st_s = sum_r + P + 1;                           /* [P]         */
    int32_t *st_r = st_s + P;                                /* [P]         */

    const int32_t t0 = min(a.T, rank * a.chunk), t1 = min(a.T, t0 + a.chunk);
    const int32_t ntok = t1 - t0, n = ntok * K, g0 = t0 * K;

    /* 1. map, one pair per thread */
#pragma unroll 1
    for (int32_t i = tid; i < n; i += nt) {
        int32_t tl = i / K;
        int32_t p =
            map_one(a.map, __ldg(a.ids + g0 + i), (uint32_t)(t0 + tl), (uint32_t)(i - tl * K));
        skey[i] = p;
        a.phys[g0 + i] = p;
    }
    for (int32_t i = tid; i < nw * P; i += nt) hist[i] = 0;
    __syncthreads();

    /* 2. representatives and is_token_in_rank, one token per thread */
#pragma unroll 1
    for (int32_t tl = tid; tl < ntok; tl += nt) {
        int32_t *row = skey + (size_t)tl * K;
        uint32_t rep = 0;
        uint64_t present = 0;
        if (K <= 8) {
            int32_t p[8], g[8];
#pragma unroll
            for (int k = 0; k < 8; k++) {
                p[k] = k < K ? row[k] : -1;
                g[k] = p[k] >= 0 ? p[k] / per : -1;
            }
#pragma unroll
            for (int k = 0; k < 8; k++) {
                bool r = p[k] >= 0;
#pragma unroll
                for (int j = 0; j < 8; j++)
                    if (j != k && g[j] == g[k] && (p[j] < p[k] || (p[j] == p[k] && j < k)))
                        r = false;
                if (r) {
                    rep |= 1u << k;
                    if (g[k] < 64) present |= 1ull << g[k];
                }
            }
        } else {
            for (int32_t k = 0; k < K; k++) {
                int32_t pk = row[k];
                if (pk < 0) continue;
                int32_t gk = pk / per;
                bool r = true;
                for (int32_t j = 0; j < K && r; j++) {
                    int32_t q = row[j];
                    if (j == k || q < 0 || q / per != gk) continue;
                    if (q < pk || (q == pk && j < k)) r = false;
                }
                if (r) {
                    rep |= 1u << k;
                    if (gk < 64) present |= 1ull << gk;
                }
            }
        }
        if (a.in_rank) write_in_rank(a, t0 + tl, present, row, rep);
        for (int32_t k = 0; k < K; k++)
            if (rep >> k & 1u) row[k] |= kRepFlag;
    }
    __syncthreads();

    /* 3. local ranks, per ranking warp in pair order */
    const int32_t wpairs = 1 << a.wshift;
    if (warp < nw) {
        uint32_t *h = hist + (size_t)warp * P;
        const uint32_t lt = lanemask_lt();
        const int32_t wb = warp * wpairs, we = min(n, wb + wpairs);
        for (int32_t i0 = wb; i0 < we; i0 += 32) {
            const int32_t i = i0 + lane;
            const int32_t key = i < we ? skey[i] : -1;
            const bool valid = key >= 0, rep = valid && (key & kRepFlag);
            const int32_t p = key & ~kRepFlag;
            uint32_t ms;
            if constexpr (BALLOT) {
                ms = __ballot_sync(0xffffffffu, valid);
                for (int b = 0; b < a.nbits; b++) {
                    bool bit = (p >> b) & 1;
                    uint32_t v = __ballot_sync(0xffffffffu, bit);
                    ms &= bit ? v : ~v;
                }
            } else {
                ms = __match_any_sync(0xffffffffu, valid ? p : -1);
            }
            const uint32_t mr = ms & __ballot_sync(0xffffffffu, rep);
            const uint32_t hv = valid ? h[p] : 0u;
            __syncwarp();
            if (valid) {
                uint32_t ls = (hv & 0xffffu) + (uint32_t)__popc(ms & lt);
                uint32_t lr = (hv >> 16) + (uint32_t)__popc(mr & lt);
                sloc[i] = ls | (rep ? (lr + 1u) << 16 : 0u);
                if ((ms & lt) == 0) h[p] = hv + (uint32_t)__popc(ms) + ((uint32_t)__popc(mr) << 16);
            }
            __syncwarp();
        }
    }
    __syncthreads();

    /* 4. warp prefixes and block totals per slot */
    if (nw == 1) {
        for (int32_t q = tid; q < P; q += nt) {
            tot[q] = hist[q];
            hist[q] = 0;
        }
    } else {
        for (int32_t q = warp; q < P; q += nwarps) {
            uint32_t v = lane < nw ? hist[(size_t)lane * P + q] : 0u, x = v;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                uint32_t y = __shfl_up_sync(0xffffffffu, x, d);
                if (lane >= d) x += y;
            }
            if (lane < nw) hist[(size_t)lane * P + q] = x - v;
            if (lane == 31) tot[q] = x;
        }
    }
    __syncthreads();
    if constexpr (CL) {
        cg::cluster_group cluster = cg::this_cluster();
        asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
        for (int32_t q = tid; q < P; q += nt) {
            uint32_t v = tot[q];
            for (int b = 0; b < ncl; b++) cluster.map_shared_rank(recv, b)[rank * P + q] = v;
        }
        cluster.sync();
    }
    for (int32_t q = tid; q < P; q += nt) {
        int32_t s = 0, r = 0, ts, tr;
        if constexpr (CL) {
            ts = 0;
            tr = 0;
            for (int b = 0; b < ncl; b++) {
                uint32_t v = recv[b * P + q];
                int32_t lo = (int32_t)(v & 0xffffu), hi = (int32_t)(v >> 16);
                if (b < rank) s += lo, r += hi;
                ts += lo;
                tr += hi;
            }
        } else {
            ts = (int32_t)(tot[q] & 0xffffu);
            tr = (int32_t)(tot[q] >> 16);
        }
        st_s[q] = s;
        st_r[q] = r;
        sum_s[q] = ts;
        sum_r[q] = tr;
        if (rank == 0 && a.tokens_per_slot) a.tokens_per_slot[q] = ts;
    }
    __syncthreads();

    /* 5. offsets: one warp scans the slot totals */
    if (warp == 0) {
        int32_t ipt = (P + 31) / 32, lo = min(P, lane * ipt), hi = min(P, lo + ipt);
        int32_t xs = 0, xr = 0;
        for (int32_t q = lo; q < hi; q++) xs += sum_s[q], xr += sum_r[q];
        int32_t is = xs, ir = xr;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            int32_t ys = __shfl_up_sync(0xffffffffu, is, d),
                    yr = __shfl_up_sync(0xffffffffu, ir, d);
            if (lane >= d) is += ys, ir += yr;
        }
        int32_t es = is - xs, er = ir - xr;
        for (int32_t q = lo; q < hi; q++) {
            int32_t vs = sum_s[q], vr = sum_r[q];
            sum_s[q] = es;
            sum_r[q] = er;
            st_s[q] += es;
            st_r[q] += er;
            es += vs;
            er += vr;
        }
        if (lane == 31) sum_s[P] = is, sum_r[P] = ir;
    }
    __syncthreads();
    if (rank == 0) publish_offsets(a, sum_s, sum_r, P, per, tid, nt);

    /* 6. positions and the two send orders */
    if (a.need_pos) {
#pragma unroll 1
        for (int32_t i = tid; i < n; i += nt) {
            const int32_t key = skey[i], gi = g0 + i;
            int32_t ps = -1, pr = -1;
            if (key >= 0) {
                const int32_t p = key & ~kRepFlag;
                const uint32_t hv = hist[(size_t)(i >> a.wshift) * P + p], lc = sloc[i];
                ps = st_s[p] + (int32_t)(hv & 0xffffu) + (int32_t)(lc & 0xffffu);
                if (lc >> 16) pr = st_r[p] + (int32_t)(hv >> 16) + (int32_t)(lc >> 16) - 1;
            }
            if (a.pair_slot_pos) a.pair_slot_pos[gi] = ps;
            if (a.pair_rank_pos) a.pair_rank_pos[gi] = pr;
            if (ps >= 0 && a.slot_perm) a.slot_perm[ps] = gi;
            if (pr >= 0 && a.rank_perm) a.rank_perm[pr] = t0 + i / K;
        }
    }
}

/* Row scatter: one block per token, each row read once (read-only path)
 * and stored to every destination. V is the access type (16, 4 or 2 B). */
template <typename V, int UNROLL>
__global__ void permute_kernel(const V *__restrict__ x, int64_t nvec,
                               const int32_t *__restrict__ pos, int32_t K, V *__restrict__ out) {
    const int64_t t = blockIdx.x;
    const int32_t *pt = pos + t * K;
    for (int64_t base = 0; base < nvec; base += (int64_t)blockDim.x * UNROLL) {
        V v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int64_t j = base + (int64_t)u * blockDim.x + threadIdx.x;
            if (j < nvec) v[u] = __ldg(x + t * nvec + j);
        }
        for (int32_t k = 0; k < K; k++) {
            int32_t p = __ldg(pt + k);
            if (p < 0) continue;
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                int64_t j = base + (int64_t)u * blockDim.x + threadIdx.x;
                if (j < nvec) out[(int64_t)p * nvec + j] = v[u];
            }
        }
    }
}

/* Row gather: one block per output row, written exactly once (a zero row
 * for order -1 or an entry out of range, which the host cannot check). */
template <typename V, int UNROLL>
__global__ void gather_kernel(const V *__restrict__ x, int64_t nvec,
                              const int32_t *__restrict__ order, int32_t per_token, int64_t limit,
                              V *__restrict__ out) {
    const int64_t i = blockIdx.x;
    const int32_t o = __ldg(order + i);
    const bool zero = o < 0 || o >= limit;
    const V *src = x + (zero ? 0 : (int64_t)(o / per_token)) * nvec;
    V *dst = out + i * nvec;
    for (int64_t base = 0; base < nvec; base += (int64_t)blockDim.x * UNROLL) {
        V v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int64_t j = base + (int64_t)u * blockDim.x + threadIdx.x;
            if (j < nvec) v[u] = zero ? V{} : __ldg(src + j);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int64_t j = base + (int64_t)u * blockDim.x + threadIdx.x;
            if (j < nvec) dst[j] = v[u];
        }
    }
}

/* Elements of one 16-byte vector, as floats, and back. */
template <int BF16> struct Vec;
template <> struct Vec<1> {
    static constexpr int N = 8;
    __device__ static void load(const uint4 &v, float *f) {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
    __device__ static uint4 store(const float *f) {
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            w[i] = (uint32_t)epxi_f32_to_bf16(f[2 * i]) |
                   ((uint32_t)epxi_f32_to_bf16(f[2 * i + 1]) << 16);
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
};
template <> struct Vec<0> {
    static constexpr int N = 4;
    __device__ static void load(const uint4 &v, float *f) {
        f[0] = __uint_as_float(v.x);
        f[1] = __uint_as_float(v.y);
        f[2] = __uint_as_float(v.z);
        f[3] = __uint_as_float(v.w);
    }
    __device__ static uint4 store(const float *f) {
        return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                          __float_as_uint(f[3]));
    }
};

/* Combine, 16-byte vectors: one block per token; per vector, acc = 0 then
 * fmaf(w_k, y_k, acc) for k in order -- the CPU's exact sequence. */
template <int BF16, int UNROLL>
__global__ void combine_kernel(const uint4 *__restrict__ y, int64_t nvec,
                               const int32_t *__restrict__ pos, const float *__restrict__ wts,
                               int32_t K, uint4 *__restrict__ out) {
    using VT = Vec<BF16>;
    const int64_t t = blockIdx.x;
    for (int64_t base = 0; base < nvec; base += (int64_t)blockDim.x * UNROLL) {
        float acc[UNROLL][VT::N];
#pragma unroll
        for (int u = 0; u < UNROLL; u++)
#pragma unroll
            for (int e = 0; e < VT::N; e++) acc[u][e] = 0.0f;
        for (int32_t k = 0; k < K; k++) {
            int32_t p = __ldg(pos + t * K + k);
            if (p < 0) continue;
            float w = wts ? __ldg(wts + t * K + k) : 1.0f;
            uint4 v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                int64_t j = base + (int64_t)u * blockDim.x + threadIdx.x;
                if (j < nvec) v[u] = __ldg(y + (int64_t)p * nvec + j);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                float f[VT::N];
                VT::load(v[u], f);
#pragma unroll
                for (int e = 0; e < VT::N; e++) acc[u][e] = fmaf(w, f[e], acc[u][e]);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int64_t j = base + (int64_t)u * blockDim.x + threadIdx.x;
            if (j < nvec) out[t * nvec + j] = VT::store(acc[u]);
        }
    }
}

/* Combine for rows that are not a multiple of 16 bytes: one element at a time. */
template <int BF16>
__global__ void
combine_scalar_kernel(const void *__restrict__ y, int64_t H, const int32_t *__restrict__ pos,
                      const float *__restrict__ wts, int32_t K, void *__restrict__ out) {
    const int64_t t = blockIdx.x;
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
        float acc = 0.0f;
        for (int32_t k = 0; k < K; k++) {
            int32_t p = __ldg(pos + t * K + k);
            if (p < 0) continue;
            float w = wts ? __ldg(wts + t * K + k) : 1.0f;
            float v = BF16 ? epxi_bf16_to_f32(__ldg((const unsigned short *)y + (int64_t)p * H + h))
                           : __ldg((const float *)y + (int64_t)p * H + h);
            acc = fmaf(w, v, acc);
        }
        if (BF16)
            ((uint16_t *)out)[t * H + h] = epxi_f32_to_bf16(acc);
        else
            ((float *)out)[t * H + h] = acc;
    }
}

} /* namespace */

extern "C" epx_status epx_cuda_dispatch_map_ids(const epx_dispatch_spec *spec,
                                                const int32_t *topk_ids, int64_t num_tokens,
                                                int32_t topk, int32_t *phys, cudaStream_t stream,
                                                epx_error *err) {
    EPX_TRY(epxi_dispatch_check_spec(spec, "device", err));
    if (num_tokens < 0 || num_tokens > INT32_MAX || topk < 1)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "topk_ids is [%lld][%d]: T must be in [0, 2^31), K >= 1",
                         (long long)num_tokens, topk);
    if (num_tokens == 0) return EPX_OK;
    if (topk_ids == NULL || phys == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_cuda_dispatch_map_ids: topk_ids and phys are required");
    int64_t n = num_tokens * topk;
    int threads = 256;
    int64_t blocks = (n + threads - 1) / threads;
    if (blocks > 4096) blocks = 4096;
    map_kernel<<<(unsigned)blocks, threads, 0, stream>>>(map_args(spec), topk_ids, n, topk, phys);
    EPXI_CUDA_TRY(cudaGetLastError(), "cudaGetLastError");
    return EPX_OK;
}

/* Blocks of the layout cluster for a batch: one block up to 64 tokens, else
 * all 8. Measured on an H200 (bench/RESULTS.md): at T = 512 eight blocks
 * took 10.5 us against 18.9 for one, at T = 4096 20.2 against 112; at
 * T <= 64 the sizes tie (8.0 to 9.6 us, the kernel's fixed cost). */
static int default_cluster(int32_t T) { return T <= 64 ? 1 : kCluster; }

/* The layout launch with a chosen cluster size (1, 2, 4 or 8); 0 picks
 * default_cluster. The result does not depend on it. Internal: the public
 * entry point passes 0; bench_dispatch times the sizes side by side. */
/* The compact kernel's launch shape for a batch: cluster size, threads,
 * ranking warps and their pairs, shared memory. False when no cluster size
 * up to 8 fits (the caller then uses layout_kernel). */
struct FastPlan {
    int cl, nt, nw, wshift, nbits;
    int32_t chunk;
    size_t smem;
};

static bool fast_plan(int32_t T, int32_t K, int32_t P, int cluster, int ppw, int optin,
                      FastPlan *f) {
    int cl = cluster;
    for (; cl <= kCluster; cl *= 2) {
        int32_t chunk = (T + cl - 1) / cl;
        int64_t n = (int64_t)chunk * K;
        if (n > 65535) continue;
        int nt = n <= 256 ? 256 : (int)(n >= 1024 ? 1024 : (n + 31) / 32 * 32);
        int nwarps = nt / 32, ws = 5;
        while ((1 << ws) < ppw) ws++;
        while ((n + (1 << ws) - 1) >> ws > nwarps) ws++;
        int nw = (int)((n + (1 << ws) - 1) >> ws);
        if (nw < 1) nw = 1;
        size_t words = 2 * (size_t)n + (size_t)nw * P + P + (cl > 1 ? (size_t)cl * P : 0) +
                       2 * ((size_t)P + 1) + 2 * (size_t)P;
        if (4 * words > (size_t)optin) continue;
        int nb = 0;
        while ((1 << nb) < P) nb++;
        f->cl = cl;
        f->nt = nt;
        f->nw = nw;
        f->wshift = ws;
        f->nbits = nb;
        f->chunk = chunk;
        f->smem = 4 * words;
        return true;
    }
    return false;
}

/* Blocks for the compact kernel: one up to 1024 pairs, then more. */
static int fast_default_cluster(int32_t T, int32_t K) {
    int64_t n = (int64_t)T * K;
    return n <= 1024 ? 1 : n <= 4096 ? 2 : n <= 8192 ? 4 : kCluster;
}

static epx_status launch_fast(const epx_dispatch_spec *spec, const int32_t *topk_ids, int32_t T,
                              int32_t K, int32_t P, int32_t G, int32_t *phys,
                              const epx_token_layout *out, const FastPlan &f, bool ballot,
                              cudaStream_t stream, epx_error *err) {
    FastArgs a;
    a.map = map_args(spec);
    a.ids = topk_ids;
    a.T = T;
    a.K = K;
    a.P = P;
    a.G = G;
    a.per = P / G;
    a.chunk = f.chunk;
    a.nw = f.nw;
    a.wshift = f.wshift;
    a.nbits = f.nbits;
    a.in_rank_words = G % 4 == 0 && ((uintptr_t)out->is_token_in_rank % 4) == 0;
    a.need_pos = out->rank_perm || out->pair_rank_pos || out->slot_perm || out->pair_slot_pos;
    a.phys = phys;
    set_outputs(a, out);
    void (*kernel)(FastArgs) =
        f.cl > 1 ? (ballot ? fast_layout_kernel<true, true> : fast_layout_kernel<true, false>)
                 : (ballot ? fast_layout_kernel<false, true> : fast_layout_kernel<false, false>);
    if (f.smem > 48 * 1024)
        EPXI_CUDA_TRY(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)f.smem),
            "cudaFuncSetAttribute");
    if (f.cl == 1) {
        kernel<<<1, f.nt, f.smem, stream>>>(a);
    } else {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = (unsigned)f.cl;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.gridDim = dim3((unsigned)f.cl);
        cfg.blockDim = dim3((unsigned)f.nt);
        cfg.dynamicSmemBytes = f.smem;
        cfg.stream = stream;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        EPXI_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, a), "cudaLaunchKernelEx");
    }
    EPXI_CUDA_TRY(cudaGetLastError(), "cudaGetLastError");
    return EPX_OK;
}

extern "C" epx_status epxi_cuda_dispatch_layout_cluster(const epx_dispatch_spec *spec,
                                                        const int32_t *topk_ids, int64_t num_tokens,
                                                        int32_t topk, int32_t num_physical,
                                                        int32_t num_gpus, int32_t *phys,
                                                        const epx_token_layout *out, int cluster,
                                                        cudaStream_t stream, epx_error *err) {
    return epxi_cuda_dispatch_layout_variant(spec, topk_ids, num_tokens, topk, num_physical,
                                             num_gpus, phys, out, EPXI_LAYOUT_AUTO, cluster, 0,
                                             stream, err);
}

extern "C" epx_status epxi_cuda_dispatch_layout_variant(
    const epx_dispatch_spec *spec, const int32_t *topk_ids, int64_t num_tokens, int32_t topk,
    int32_t num_physical, int32_t num_gpus, int32_t *phys, const epx_token_layout *out, int variant,
    int cluster, int ppw, cudaStream_t stream, epx_error *err) {
    EPX_TRY(epxi_dispatch_check_spec(spec, "device", err));
    if (out == NULL || (num_tokens > 0 && (topk_ids == NULL || phys == NULL)))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_cuda_dispatch_layout: topk_ids, phys and out are required");
    if (num_tokens < 0 || num_tokens > INT32_MAX || topk < 1 || topk > 32 ||
        num_tokens * (int64_t)topk > INT32_MAX)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "topk_ids is [%lld][%d]: T >= 0, 1 <= K <= 32 and T*K below 2^31",
                         (long long)num_tokens, topk);
    if (num_physical < 1 || num_gpus < 1 || num_physical % num_gpus != 0 ||
        (spec->mode == EPX_DISPATCH_PHYSICAL && spec->num_physical != num_physical))
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "num_physical (%d) must be a positive multiple of num_gpus (%d) and "
                         "equal spec.num_physical (%d)",
                         num_physical, num_gpus, spec->num_physical);
    if (num_tokens == 0) {
        /* An empty batch (a rank with no tokens this step): zero counts and
         * offsets, nothing else to write; no kernel needed. */
        const struct {
            void *p;
            size_t bytes;
        } zero[] = {{out->tokens_per_rank, 8 * (size_t)num_gpus},
                    {out->tokens_per_slot, 8 * (size_t)num_physical},
                    {out->rank_offsets, 4 * ((size_t)num_gpus + 1)},
                    {out->slot_offsets, 4 * ((size_t)num_physical + 1)}};
        for (size_t i = 0; i < sizeof zero / sizeof zero[0]; i++)
            if (zero[i].p != NULL)
                EPXI_CUDA_TRY(cudaMemsetAsync(zero[i].p, 0, zero[i].bytes, stream),
                              "cudaMemsetAsync");
        return EPX_OK;
    }
    if (cluster != 0 && cluster != 1 && cluster != 2 && cluster != 4 && cluster != kCluster)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "layout cluster size %d is not 1, 2, 4 or 8",
                         cluster);
    if (variant < EPXI_LAYOUT_AUTO || variant > EPXI_LAYOUT_BALLOT)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "layout variant %d is not 0 .. 3", variant);
    int dev = 0, optin = 0;
    EPXI_CUDA_TRY(cudaGetDevice(&dev), "cudaGetDevice");
    EPXI_CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
                  "cudaDeviceGetAttribute");
    if (variant == EPXI_LAYOUT_MATCH || variant == EPXI_LAYOUT_BALLOT ||
        (variant == EPXI_LAYOUT_AUTO && (int64_t)num_tokens * topk <= kAutoCompactPairs)) {
        FastPlan f;
        int cl0 = cluster ? cluster : fast_default_cluster((int32_t)num_tokens, topk);
        if (fast_plan((int32_t)num_tokens, topk, num_physical, cl0, ppw > 0 ? ppw : 64, optin, &f))
            return launch_fast(
                spec, topk_ids, (int32_t)num_tokens, topk, num_physical, num_gpus, phys, out, f,
                variant == EPXI_LAYOUT_BALLOT || (variant == EPXI_LAYOUT_AUTO && kAutoBallot),
                stream, err);
    }
    if (cluster == 0) cluster = default_cluster((int32_t)num_tokens);
    LayoutArgs a;
    a.map = map_args(spec);
    a.ids = topk_ids;
    a.T = (int32_t)num_tokens;
    a.K = topk;
    a.P = num_physical;
    a.G = num_gpus;
    a.per = num_physical / num_gpus;
    /* the 16-bit counter halves bound the pairs of one block */
    while (cluster < kCluster && (int64_t)((a.T + cluster - 1) / cluster) * topk > 65535)
        cluster *= 2;
    a.chunk = (a.T + cluster - 1) / cluster;
    if ((int64_t)a.chunk * topk > 65535)
        return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                         "a batch of %d tokens x top-%d is too large for one layout launch: "
                         "ceil(T / 8) * K must be at most 65535; split the batch (at most %d "
                         "tokens at this K)",
                         a.T, topk, 65535 / topk * kCluster);
    /* About 16 tokens per token warp: small batches use few warps, so
     * zeroing and scanning the per-warp histograms stays cheap. */
    a.nw = (a.chunk + 15) / 16;
    if (a.nw < 1) a.nw = 1;
    if (a.nw > kMaxWarps) a.nw = kMaxWarps;
    /* words: hist nw*P, tot P, base 2P, sums 2(P+1), repmask chunk, scan 64,
     * and the block's phys (chunk*K) when it fits */
    size_t fixed = 4 * ((size_t)a.P * 5 + 2 + (size_t)a.chunk + 64);
    size_t physb = 4 * (size_t)a.chunk * (size_t)topk;
    a.phys_smem = fixed + 4 * (size_t)a.nw * a.P + physb <= (size_t)optin;
    if (!a.phys_smem) physb = 0;
    while (a.nw > 1 && fixed + physb + 4 * (size_t)a.nw * a.P > (size_t)optin) a.nw--;
    size_t smem = fixed + physb + 4 * (size_t)a.nw * a.P;
    if (smem > (size_t)optin)
        return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                         "the layout kernel needs %zu bytes of shared memory for P = %d slots and "
                         "%d tokens per block, above this device's %d: use fewer slots or "
                         "smaller batches",
                         smem, a.P, a.chunk, optin);
    a.wchunk = (a.chunk + a.nw - 1) / a.nw;
    a.phys = phys;
    set_outputs(a, out);
    a.in_rank_words = a.G % 4 == 0 && ((uintptr_t)out->is_token_in_rank % 4) == 0;
    a.need_pos = out->rank_perm || out->pair_rank_pos || out->slot_perm || out->pair_slot_pos;

    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)cluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.gridDim = dim3((unsigned)cluster);
    cfg.blockDim = dim3(32u * (unsigned)(a.nw < 8 ? 8 : a.nw));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    void (*kernel)(LayoutArgs) = topk <= 8 ? layout_kernel<8> : layout_kernel<32>;
    EPXI_CUDA_TRY(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
        "cudaFuncSetAttribute");
    EPXI_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, a), "cudaLaunchKernelEx");
    EPXI_CUDA_TRY(cudaGetLastError(), "cudaGetLastError");
    return EPX_OK;
}

extern "C" epx_status epx_cuda_dispatch_layout(const epx_dispatch_spec *spec,
                                               const int32_t *topk_ids, int64_t num_tokens,
                                               int32_t topk, int32_t num_physical, int32_t num_gpus,
                                               int32_t *phys, const epx_token_layout *out,
                                               cudaStream_t stream, epx_error *err) {
    return epxi_cuda_dispatch_layout_cluster(spec, topk_ids, num_tokens, topk, num_physical,
                                             num_gpus, phys, out, 0, stream, err);
}

namespace {

epx_status check_rows(const void *src, const void *dst, epx_row_dtype dtype, int64_t T, int64_t H,
                      const int32_t *pos, int32_t K, const char *fn, epx_error *err) {
    if (dtype != EPX_ROW_F32 && dtype != EPX_ROW_BF16)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "%s: dtype %d is not F32 (0) or BF16 (1)", fn,
                         (int)dtype);
    if (T < 0 || T > INT32_MAX || H < 0 || K < 1)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "%s: T = %lld, H = %lld, K = %d: T in [0, 2^31), H >= 0, K >= 1", fn,
                         (long long)T, (long long)H, K);
    if (T > 0 && H > 0 && (src == NULL || dst == NULL || pos == NULL))
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "%s: input, pos and output are required", fn);
    return EPX_OK;
}

bool aligned(const void *p, size_t a) { return ((uintptr_t)p % a) == 0; }

} /* namespace */

extern "C" epx_status epx_cuda_permute_rows(const void *x, epx_row_dtype dtype, int64_t num_tokens,
                                            int64_t hidden, const int32_t *pos, int32_t topk,
                                            void *out, cudaStream_t stream, epx_error *err) {
    EPX_TRY(check_rows(x, out, dtype, num_tokens, hidden, pos, topk, "epx_cuda_permute_rows", err));
    if (num_tokens == 0 || hidden == 0) return EPX_OK;
    size_t bytes = (size_t)hidden * (dtype == EPX_ROW_BF16 ? 2 : 4);
    unsigned grid = (unsigned)num_tokens;
    if (bytes % 16 == 0 && aligned(x, 16) && aligned(out, 16))
        permute_kernel<uint4, 8><<<grid, 128, 0, stream>>>((const uint4 *)x, (int64_t)(bytes / 16),
                                                           pos, topk, (uint4 *)out);
    else if (bytes % 4 == 0 && aligned(x, 4) && aligned(out, 4))
        permute_kernel<uint32_t, 8><<<grid, 128, 0, stream>>>(
            (const uint32_t *)x, (int64_t)(bytes / 4), pos, topk, (uint32_t *)out);
    else
        permute_kernel<unsigned short, 8><<<grid, 128, 0, stream>>>(
            (const unsigned short *)x, (int64_t)(bytes / 2), pos, topk, (unsigned short *)out);
    EPXI_CUDA_TRY(cudaGetLastError(), "cudaGetLastError");
    return EPX_OK;
}

extern "C" epx_status epx_cuda_gather_rows(const void *x, epx_row_dtype dtype, int64_t num_tokens,
                                           int64_t hidden, const int32_t *order, int64_t num_rows,
                                           int32_t per_token, void *out, cudaStream_t stream,
                                           epx_error *err) {
    if (dtype != EPX_ROW_F32 && dtype != EPX_ROW_BF16)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_cuda_gather_rows: dtype %d is not F32 (0) or BF16 (1)", (int)dtype);
    if (num_tokens < 0 || num_tokens > INT32_MAX || hidden < 0 || num_rows < 0 ||
        num_rows > INT32_MAX || per_token < 1 || num_tokens * per_token > INT32_MAX)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "epx_cuda_gather_rows: T = %lld, H = %lld, rows = %lld, per_token = %d: "
                         "sizes >= 0 (per_token >= 1), T * per_token and rows below 2^31",
                         (long long)num_tokens, (long long)hidden, (long long)num_rows, per_token);
    if (num_rows == 0 || hidden == 0) return EPX_OK;
    if (order == NULL || out == NULL || (x == NULL && num_tokens > 0))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_cuda_gather_rows: x, order and out are required");
    size_t bytes = (size_t)hidden * (dtype == EPX_ROW_BF16 ? 2 : 4);
    unsigned grid = (unsigned)num_rows;
    int64_t limit = num_tokens * per_token;
    if (bytes % 16 == 0 && aligned(x, 16) && aligned(out, 16))
        gather_kernel<uint4, 4><<<grid, 128, 0, stream>>>((const uint4 *)x, (int64_t)(bytes / 16),
                                                          order, per_token, limit, (uint4 *)out);
    else if (bytes % 4 == 0 && aligned(x, 4) && aligned(out, 4))
        gather_kernel<uint32_t, 8><<<grid, 128, 0, stream>>>(
            (const uint32_t *)x, (int64_t)(bytes / 4), order, per_token, limit, (uint32_t *)out);
    else
        gather_kernel<unsigned short, 8>
            <<<grid, 128, 0, stream>>>((const unsigned short *)x, (int64_t)(bytes / 2), order,
                                       per_token, limit, (unsigned short *)out);
    EPXI_CUDA_TRY(cudaGetLastError(), "cudaGetLastError");
    return EPX_OK;
}

extern "C" epx_status epx_cuda_combine_rows(const void *y, epx_row_dtype dtype, int64_t hidden,
                                            const int32_t *pos, const float *weights,
                                            int64_t num_tokens, int32_t topk, void *out,
                                            cudaStream_t stream, epx_error *err) {
    EPX_TRY(check_rows(y, out, dtype, num_tokens, hidden, pos, topk, "epx_cuda_combine_rows", err));
    if (num_tokens == 0 || hidden == 0) return EPX_OK;
    size_t bytes = (size_t)hidden * (dtype == EPX_ROW_BF16 ? 2 : 4);
    unsigned grid = (unsigned)num_tokens;
    bool vec = bytes % 16 == 0 && aligned(y, 16) && aligned(out, 16);
    if (vec && dtype == EPX_ROW_BF16)
        combine_kernel<1, 8><<<grid, 128, 0, stream>>>((const uint4 *)y, (int64_t)(bytes / 16), pos,
                                                       weights, topk, (uint4 *)out);
    else if (vec)
        combine_kernel<0, 8><<<grid, 128, 0, stream>>>((const uint4 *)y, (int64_t)(bytes / 16), pos,
                                                       weights, topk, (uint4 *)out);
    else if (dtype == EPX_ROW_BF16)
        combine_scalar_kernel<1><<<grid, 256, 0, stream>>>(y, hidden, pos, weights, topk, out);
    else
        combine_scalar_kernel<0><<<grid, 256, 0, stream>>>(y, hidden, pos, weights, topk, out);
    EPXI_CUDA_TRY(cudaGetLastError(), "cudaGetLastError");
    return EPX_OK;
}
