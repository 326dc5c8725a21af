/*
 * balanced.cu - balanced per-batch dispatch on the GPU (epx_cuda.h): from a
 * batch's topk ids, or the all-reduced tokens per logical expert, to the
 * exact min-max split, integer replica counts and per-token slots, in ONE
 * launch of ONE thread block, or for a large batch of ids in the grid form
 * below (two launches). Nothing is allocated per call (the workspace is
 * sized by epx_cuda_dispatch_balanced_create), nothing waits for the host,
 * so the launches can be captured in a CUDA graph.
 *
 * The result equals the CPU reference (balanced.c) exactly because the
 * solver is the same source, balanced_solve.h and the parts it includes,
 * whose functions are __host__ __device__. The block splits the work as that header does:
 *   0. counts: from ids, each warp counts a contiguous chunk of the (t, k)
 *      pairs into its own shared-memory row (shared atomics: integer sums,
 *      so the order does not matter); the rows become per-warp exclusive
 *      prefixes, the column totals the counts;
 *   1. every thread groups some experts' replicas by GPU
 *      (epxi_bal_group), then the experts are classified: one-GPU experts'
 *      counts summed into their GPU's base (64-bit atomics, integers again)
 *      and the flexible experts compacted in ascending order (a ballot scan
 *      tile by tile), which is exactly the list epxi_bal_classify builds;
 *   2. warp 0 splits the reduced graph into its components (with G <= 32
 *      GPU sets as bit masks, components_warp; else thread 0 runs
 *      epxi_bal_components), then each warp solves components
 *      (epxi_bal_solve_comp): one of at most sub_max GPUs by its subsets
 *      and rounded over them, its 32 lanes sharing the subsets, reducing
 *      with shuffles and deciding with votes; a larger one by max-flows
 *      (levels and rounding) on lane 0, each level's loops over its
 *      experts and GPUs and its dense start on all 32 lanes. The
 *      distinct levels are counted and the largest found in parallel
 *      (summary_warp at G <= 32). With the workspace in shared memory
 *      (when it fits, else its hot part: carve_shared), the solves'
 *      dependent loads cost shared-memory latency, not L2's;
 *   3. every thread writes some experts' shares and counts
 *      (epxi_bal_write_expert, the listed columns; phase 0 stored the
 *      [E][W] rows' zeros, coalesced) and some GPUs' loads;
 *   4. from ids, each warp walks its chunk again, 32 pairs a round, and
 *      ranks the pairs of one expert with __match_any_sync on top of its
 *      row's prefix: the rank of a pair among its expert's pairs in (t, k)
 *      order, which picks its replica column from the cumulative counts,
 *      as epx_dispatch_balanced_map_ids fills the columns in order.
 * Ordering rules: every phase ends with __syncthreads, which also makes the
 * workspace's global-memory writes of one phase visible to the block in the
 * next; in phase 4 a warp reads its row before its group leaders advance it
 * (__syncwarp between).
 *
 * The grid form (ids entry point, T * K >= EPX_BALANCED_GRID_PAIRS, 4,096
 * by default). Phases 0 and 4 walk every pair; on the one block they cost
 * ~79 us of a 167 us launch at T = 4,096, K = 8 (H200), 10.6 us at T = 512
 * and 3.2 us at T = 128, where a second launch would cost about as much.
 * So a large batch is cut into NB chunks of >= 512 pairs (NB <= 128 and
 * the SM count), and:
 *   A. (balanced_grid_count, NB blocks) each block stores its share of the
 *      outputs' zeros and counts its chunk per warp, as phase 0 does, its
 *      totals to the row ghist[b][E] (device memory); the last block to
 *      finish (a counter: fence, atomicInc, fence) turns ghist's columns
 *      into exclusive prefixes and their totals into the counts, then runs
 *      phases 1-3 as the one block does (solve_phases, one source), the
 *      replica counts written to global memory (the rcounts output, else
 *      the device workspace's rc);
 *   B. (balanced_grid_rank, the same NB blocks) block b counts its chunk
 *      per warp again on top of ghist[b] and ranks its pairs as phase 4
 *      does (rank_pairs, one source), from those global replica counts.
 * The counts are integer sums and the ranks the same (t, k) order, so the
 * two forms' outputs are the same bits. No block waits for another, and
 * atomicInc returns the counter to 0, so graph replays need nothing more.
 */
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "epx.h"
extern "C" {
#include "internal.h" /* C linkage: epxi_fail lives in the C library */
}
#include "cuda_check.h"
#include "pdl.cuh"
#include "epx_cuda.h"
#ifdef EPX_BAL_PROFILE
/* The subset solve's step totals (EPXI_BAL_MARK, balanced_subsets.h), ns,
 * summed over the launch's levels by the solving warps' lane 0 (one warp
 * at a time on a one-component shape; several warps' marks interleave on
 * others, so their split is approximate there). */
__device__ unsigned long long epxi_bal_prof_step[4], epxi_bal_prof_last;
__host__ __device__ __forceinline__ void epxi_bal_mark(int k, int lane) {
#ifdef __CUDA_ARCH__ /* the solve's host form (same statements) marks nothing */
    if (lane != 0) return;
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    atomicAdd(&epxi_bal_prof_step[k], t - epxi_bal_prof_last);
    epxi_bal_prof_last = t;
#else
    (void)k;
    (void)lane;
#endif
}
#define EPXI_BAL_MARK(k, lane) epxi_bal_mark((k), (lane))
#endif
#include "../dispatch/balanced_solve.h"

struct epx_cuda_balancer {
    epxi_bal bal; /* shape and device pointers into mem */
    void *mem;
    int threads;   /* block size for the ids entry point: 32 * warps */
    size_t hist;   /* its counters: warps * E * 4 bytes of shared memory */
    int ws_shared; /* carve_shared's where: the workspace, its hot part or none in shared memory */
    size_t ws_shm; /* its bytes there: all of it, bal.hot, or 0 */
    /* the ids entry point's grid form (T * K >= grid_pairs): at most
     * nb_max blocks; ghist [nb_max][E] and the done counter in mem, after
     * the workspace */
    int64_t grid_pairs;
    int nb_max;
    int32_t *ghist;
    unsigned *done;
    int pdl; /* EPX_BALANCED_PDL: 1 programmatic dependent launch (pdl.cuh), 0 plain */
};

namespace {

/* 256 threads: the solve's sequential parts (components, max-flows, the
 * rounding) keep the workspace's pointers in registers (0 bytes spilled);
 * at 1024 threads (64 registers) they spilled 2.8 KB and every step of
 * those chains went through local memory (bench/RESULTS.md). */
constexpr int kMaxThreads = 256;

/* The grid form's blocks: at least kGridChunk pairs each (2 rounds of 32
 * per warp of 8 in launch B: its ranking is a few us, not the one block's
 * 128 rounds at 32,768 pairs), at most kGridMaxBlocks of them (and the SM
 * count) so that the last block's scan of ghist's columns stays short (8
 * steps of 16 rows' loads in flight); past 65,536 pairs the chunks grow. */
constexpr int64_t kGridChunk = 512;
constexpr int kGridMaxBlocks = 128;

struct BalArgs {
    epxi_bal bal;
    const int32_t *replicas, *num_valid;
    const int64_t *counts; /* counts entry point */
    const int32_t *ids;    /* ids entry point: T * K pairs */
    int64_t pairs;
    int from_ids;   /* 1: ids, one block; 2: ids, the grid form; 0: counts */
    int ws_shared;  /* carve the workspace from shared memory at ws_at (carve_shared) */
    uint32_t ws_at; /* its offset in dynamic shared memory */
    int32_t *phys;
    double *shares, *gpu_load;
    int64_t *rcounts, *slot_counts, *summary;
    /* the grid form: each block's pairs, the per-block counts [NB][E] (A's
     * last block rewrites them into prefixes), the blocks-done counter, the
     * replica counts phase 3 writes and launch B reads (global memory:
     * rcounts when given, else the device workspace's rc) */
    int64_t chunk;
    int32_t *ghist;
    unsigned *done;
    int64_t *grid_rc;
};

__device__ __forceinline__ uint32_t lanemask_lt() {
    uint32_t m;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
    return m;
}

/* epxi_bal_components on one warp when G <= 32 (lane g = GPU g), with the
 * same lists: GPU sets as bit masks, each GPU's component by doubling its
 * reach (ceil(log2 G) rounds of G shuffles cover any path of G GPUs), a
 * component's root its smallest GPU, components in the order of their
 * roots, GPUs and experts ascending within each. The sequential version's chains of dependent
 * loads cost thread 0 5-32 us (bench/RESULTS.md); this is a few rounds of
 * shuffles. The one difference it could have, a component whose subset
 * tables do not fit, cannot happen (epxi_bal_subsets sizes them for the
 * worst split), and the GPU test compares every output with the CPU's. */
__device__ void components_warp(epxi_bal &b, int lane) {
    const uint32_t full = 0xffffffffu, lt = lanemask_lt();
    const int32_t G = b.G, D = b.D, M = b.M;
    for (int32_t i = lane; i < M; i += 32) { /* each flexible expert's GPUs */
        int32_t e = b.flex[i];
        uint32_t m = 0;
        for (int32_t q = 0; q < b.eg_n[e]; q++)
            m |= 1u << b.eg_gpu[(size_t)e * (size_t)D + (size_t)q];
        b.f_mask[i] = (int32_t)m;
    }
    __syncwarp();
    const int32_t g = lane;
    uint32_t reach = 0;
    bool play = false;
    if (g < G) {
        play = b.base[g] > 0;
        for (int32_t i = 0; i < M; i++) {
            uint32_t m = (uint32_t)b.f_mask[i];
            if (m >> g & 1) {
                reach |= m;
                play = true;
            }
        }
        if (play) reach |= 1u << g;
    }
    for (int32_t span = 1; span < G; span <<= 1) { /* paths of up to 2 span GPUs */
        uint32_t grown = reach;
        for (int32_t h = 0; h < G; h++) {
            uint32_t rh = __shfl_sync(full, reach, h);
            if (reach >> h & 1) grown |= rh;
        }
        reach = grown;
    }
    const int32_t root = play ? __ffs(reach) - 1 : -1;
    const uint32_t roots = __ballot_sync(full, play && root == g);
    const int32_t C = __popc(roots);
    const int32_t comp = play ? __popc(roots & ((1u << root) - 1u)) : -1;
    /* a root's offset: the sizes of the components of smaller roots */
    int32_t goff = 0;
    for (int32_t h = 0; h < G; h++) {
        uint32_t rh = __shfl_sync(full, reach, h);
        if ((roots >> h & 1) && h < g) goff += __popc(rh);
    }
    const int32_t my_goff = __shfl_sync(full, goff, play ? root : 0);
    if (g < G) {
        b.g_comp[g] = comp;
        if (play) {
            b.g_loc[g] = __popc(reach & ((1u << g) - 1u));
            b.c_gpus[my_goff + b.g_loc[g]] = g;
        }
    }
    const uint32_t in_play = __ballot_sync(full, play);
    if (play && root == g) b.c_goff[comp] = goff;
    if (lane == 0) b.c_goff[C] = __popc(in_play);
    if (lane < C) b.c_rc[lane] = 0; /* per-component cursors */
    __syncwarp();
    /* experts: each one's place among its component's, in ascending order */
    for (int32_t t0 = 0; t0 < M; t0 += 32) {
        int32_t i = t0 + lane;
        int32_t c = i < M ? b.g_comp[b.eg_gpu[(size_t)b.flex[i] * (size_t)D]] : -1;
        uint32_t peers = __match_any_sync(full, c);
        int32_t pos = i < M ? b.c_rc[c] + __popc(peers & lt) : 0;
        __syncwarp();
        if (i < M) {
            b.f_mask[i] = pos; /* the masks are spent: the slot keeps the place */
            if ((peers >> lane) == 1u) b.c_rc[c] += __popc(peers);
        }
        __syncwarp();
    }
    /* per component (lane c < C): its experts' offset (a scan of their
     * counts) and its subset tables' (a scan of their sizes) */
    const int32_t nf = lane < C ? b.c_rc[lane] : 0;
    const int32_t ng = lane < C ? b.c_goff[lane + 1] - b.c_goff[lane] : 0;
    int32_t foff = nf;
    for (int o = 1; o < 32; o <<= 1) {
        int32_t v = __shfl_up_sync(full, foff, o);
        if (lane >= o) foff += v;
    }
    foff -= nf;
    const int32_t want = lane < C && nf > 0 && ng <= b.sub_max ? 1 << ng : 0;
    int32_t soff = want;
    for (int o = 1; o < 32; o <<= 1) {
        int32_t v = __shfl_up_sync(full, soff, o);
        if (lane >= o) soff += v;
    }
    soff -= want;
    if (lane < C) {
        b.c_foff[lane] = foff;
        b.c_levels[lane] = 0;
        b.c_soff[lane] = want > 0 && (int64_t)soff + want <= b.sub_size ? soff : -1;
    }
    if (lane == C - 1) b.c_foff[C] = foff + nf;
    if (C == 0 && lane == 0) b.c_foff[0] = 0;
    __syncwarp();
    for (int32_t i = lane; i < M; i += 32) {
        int32_t c = b.g_comp[b.eg_gpu[(size_t)b.flex[i] * (size_t)D]];
        b.c_flex[b.c_foff[c] + b.f_mask[i]] = i;
    }
    if (lane < C) b.c_rc[lane] = EPXI_BAL_OK;
    b.C = C;
    __syncwarp();
}

/* epxi_bal_summary and the count of distinct levels on one warp when
 * G <= 32 (lane = level id): the largest level by a max over lanes (its
 * fraction reduced, so which equal level wins does not matter), a level
 * new when no used level of a smaller id has its load. */
__device__ void summary_warp(const epxi_bal &b, int lane, int64_t out[4]) {
    const uint32_t full = 0xffffffffu;
    const int32_t L = b.C > 0 ? b.c_goff[b.C] : 0;
    const bool used = lane < L && epxi_bal_level_used(&b, lane);
    const int64_t num = used ? b.lv_num[lane] : 0, den = used ? b.lv_den[lane] : 1;
    bool fresh = used;
    int64_t a = num, d = den;
    for (int32_t k = 0; k < L; k++) { /* lanes from L on hold no level */
        int64_t nk = __shfl_sync(full, num, k), dk = __shfl_sync(full, den, k);
        bool uk = __shfl_sync(full, used, k);
        if (uk && k < lane && nk * den == num * dk) fresh = false;
        if (uk && nk * d > a * dk) {
            a = nk;
            d = dk;
        }
    }
    int32_t n = __popc(__ballot_sync(full, fresh));
    epxi_bal_summary_of(a, d, n, out);
}

/* Where the workspace lives: a.bal's pointers are the device memory's;
 * kWsShared moves all of it into shared memory (the solve's dependent loads
 * at shared-memory latency), kWsHot all but the tail that only the
 * per-expert phases read (eg_mult, rc: epxi_bal_carve), for shapes whose
 * whole workspace does not fit (DeepSeek-V3's 277 KB at W = 33). */
enum { kWsDevice = 0, kWsShared = 1, kWsHot = 2 };
__device__ __forceinline__ void carve_shared(epxi_bal &b, int where, unsigned char *at) {
    if (where == kWsDevice) return;
    int32_t *const eg_mult = b.eg_mult;
    int64_t *const rc = b.rc;
    epxi_bal_carve(&b, at);
    if (where == kWsHot) {
        b.eg_mult = eg_mult;
        b.rc = rc;
    }
}

/* The block's per-batch scalars (phases 1-3) in shared memory, and the
 * profile build's stamps. */
struct BalShared {
    int32_t warp_off[32];
    int32_t total, status, comps, distinct;
#ifdef EPX_BAL_PROFILE
    unsigned long long stamp[8];
#endif
};

/* Built with -DEPX_BAL_PROFILE (cmake -DEPX_BAL_PROFILE=ON), thread 0 reads
 * the global timer at the phases' ends and prints them per launch, ns:
 * "balprof from_ids M C" then clear-and-count, group, components, solve,
 * summary, outputs, per-pair slots, then the subset solve's steps summed
 * over its levels (EPXI_BAL_MARK: subset sums, best subsets, splits,
 * roundings). Where a launch's time goes, for bench_balanced. Off in every
 * normal build. In the grid form the line comes from launch A's last block
 * (first field 2, its count column from that block's start, no per-pair
 * column). */
#ifdef EPX_BAL_PROFILE
__device__ __forceinline__ unsigned long long bal_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#define BAL_STAMP(i)                                                                               \
    do {                                                                                           \
        if (threadIdx.x == 0) sh.stamp[i] = bal_ns();                                              \
    } while (0)
#define BAL_REPORT(n)                                                                              \
    do {                                                                                           \
        if (threadIdx.x == 0) {                                                                    \
            BAL_STAMP(n);                                                                          \
            printf("balprof %d %d %d %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu\n",    \
                   a.from_ids, b.M, b.C, sh.stamp[1] - sh.stamp[0], sh.stamp[2] - sh.stamp[1],     \
                   sh.stamp[3] - sh.stamp[2], sh.stamp[4] - sh.stamp[3],                           \
                   sh.stamp[5] - sh.stamp[4], sh.stamp[6] - sh.stamp[5],                           \
                   (n) == 7 ? sh.stamp[7] - sh.stamp[6] : 0ull, epxi_bal_prof_step[0],             \
                   epxi_bal_prof_step[1], epxi_bal_prof_step[2], epxi_bal_prof_step[3]);           \
        }                                                                                          \
    } while (0)
/* ... and the subset solve's step totals zeroed, its first mark's start
 * taken, just before the components are solved */
#define BAL_PROF_START()                                                                           \
    do {                                                                                           \
        if (threadIdx.x == 0) {                                                                    \
            for (int k = 0; k < 4; k++) epxi_bal_prof_step[k] = 0;                                 \
            epxi_bal_prof_last = bal_ns();                                                         \
        }                                                                                          \
    } while (0)
#else
#define BAL_STAMP(i) ((void)0)
#define BAL_REPORT(n) ((void)0)
#define BAL_PROF_START() ((void)0)
#endif

/* Phase 0's clearing of the solve's per-batch state (the barrier that ends
 * phase 0 orders it before phase 1). */
__device__ __forceinline__ void solve_clear(epxi_bal &b, BalShared &sh) {
    if (threadIdx.x == 0) {
        sh.total = 0;
        sh.status = EPXI_BAL_OK;
    }
    for (int32_t g = threadIdx.x; g < b.G; g += blockDim.x) b.base[g] = 0;
}

/* n 8-byte words at p zeroed by threads first, first + stride, ...: 16
 * bytes a store (the loop was ~22 % of a one-token launch's instructions
 * storing 8), a word before the first 16-byte boundary and an odd last
 * word by the thread with first == 0. */
__device__ __forceinline__ void zero_words(void *p, int64_t n, int64_t first, int64_t stride) {
    uint64_t *w = (uint64_t *)p;
    const int64_t head = ((uintptr_t)w & 15u) && n > 0 ? 1 : 0;
    const int64_t pairs = (n - head) / 2;
    uint4 *v = (uint4 *)(w + head);
    for (int64_t i = first; i < pairs; i += stride) v[i] = make_uint4(0u, 0u, 0u, 0u);
    if (first == 0) {
        if (head) w[0] = 0;
        if (head + 2 * pairs < n) w[n - 1] = 0;
    }
}

/* The [E][W] rows' zeros (shares and the replica counts rc, where given)
 * and the slot counts', coalesced and early (stores: nothing waits for
 * them); phase 3 writes the listed columns over them, after the block's
 * barriers (one block) or the grid's handoff. */
__device__ __forceinline__ void zero_outputs(const BalArgs &a, const epxi_bal &b, int64_t *rc,
                                             int64_t first, int64_t stride) {
    const int64_t n = (int64_t)b.E * b.W;
    if (rc) zero_words(rc, n, first, stride);
    if (a.shares) zero_words(a.shares, n, first, stride);
    if (a.slot_counts) zero_words(a.slot_counts, b.P, first, stride);
}

/* The calling warp's contiguous run of the block's pairs [lo, hi), for
 * phases 0 and 4 (empty, wlo >= whi, for the last warps of a short range). */
__device__ __forceinline__ void warp_span(int64_t lo, int64_t hi, int64_t &wlo, int64_t &whi) {
    const int nwarps = blockDim.x >> 5, warp = threadIdx.x >> 5;
    const int64_t chunk = epxi_bal_div(hi - lo + nwarps - 1, nwarps); /* 32-bit where it fits */
    wlo = lo + (int64_t)warp * chunk;
    whi = wlo + chunk < hi ? wlo + chunk : hi;
}

/* Phase 0's count of the block's pairs [lo, hi): each warp counts its run
 * into its own shared row of hist (shared atomics: integer sums, so the
 * order does not matter); then per expert the rows become exclusive
 * prefixes starting at start[e] (0 when start is NULL: the pairs before
 * lo) and the column's total, start included, goes to tot32 / tot64 where
 * given. Ids outside [0, E) are not counted. Every thread of the block
 * calls it (barriers inside; none after the prefixes). */
__device__ void count_pairs(int32_t *hist, const int32_t *ids, int64_t lo, int64_t hi, int32_t E,
                            const int32_t *start, int32_t *tot32, int64_t *tot64) {
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
    const int nwarps = nt >> 5;
    int64_t wlo, whi;
    warp_span(lo, hi, wlo, whi);
    for (int32_t i = tid; i < nwarps * E; i += nt) hist[i] = 0;
    __syncthreads();
    for (int64_t i = wlo + lane; i < whi; i += 32) {
        int32_t e = __ldg(ids + i);
        if (e >= 0 && e < E) atomicAdd(hist + (size_t)warp * (size_t)E + (size_t)e, 1);
    }
    __syncthreads();
    for (int32_t e = tid; e < E; e += nt) {
        int32_t run = start ? start[e] : 0;
        for (int w = 0; w < nwarps; w++) {
            int32_t h = hist[(size_t)w * (size_t)E + (size_t)e];
            hist[(size_t)w * (size_t)E + (size_t)e] = run;
            run += h;
        }
        if (tot32) tot32[e] = run;
        if (tot64) tot64[e] = run;
    }
}

/* Phases 1-3 on one block, from b.cnt (phase 0's counts, after a barrier;
 * solve_clear ran before it): the split, the summary, and the outputs,
 * the replica counts' listed columns into b.rc and to rc_copy when given.
 * Both forms' solving block calls it. */
__device__ void solve_phases(const BalArgs &a, epxi_bal &b, BalShared &sh, int64_t *rc_copy) {
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
    const int nwarps = nt >> 5;
    const int32_t E = b.E;

    /* 1. group, then classify: base sums and the ascending flexible list.
     * An expert without tokens is not grouped: epxi_bal_kind calls it kind
     * 0 from its count alone, and nothing reads a kind-0 expert's groups
     * (the CPU groups every expert; the outputs are the same). At one
     * token that is 376 of Kimi-K2.5's 384 experts, each a strided walk of
     * its replica row. */
    for (int32_t e = tid; e < E; e += nt)
        if (b.cnt[e] > 0) epxi_bal_group(&b, a.replicas, a.num_valid, e);
    __syncthreads();
    for (int32_t t0 = 0; t0 < E; t0 += nt) {
        int32_t e = t0 + tid;
        int kind = e < E ? epxi_bal_kind(&b, e) : 0;
        if (kind == 1)
            atomicAdd((unsigned long long *)(b.base + b.eg_gpu[(size_t)e * (size_t)b.D]),
                      (unsigned long long)b.cnt[e]);
        uint32_t vote = __ballot_sync(0xffffffffu, kind == 2);
        if (lane == 0) sh.warp_off[warp] = __popc(vote);
        __syncthreads();
        if (tid == 0) {
            int32_t run = sh.total;
            for (int w = 0; w < nwarps; w++) {
                int32_t c = sh.warp_off[w];
                sh.warp_off[w] = run;
                run += c;
            }
            sh.total = run;
        }
        __syncthreads();
        if (e < E) {
            int32_t idx = sh.warp_off[warp] + __popc(vote & lanemask_lt());
            b.fidx[e] = -1;
            if (kind == 2 && idx < b.maxM) {
                b.fidx[e] = idx;
                b.flex[idx] = e;
            } else if (kind == 2) {
                sh.status = EPXI_BAL_TOO_MANY;
            }
        }
        __syncthreads(); /* warp_off is rewritten by the next tile */
    }
    b.M = sh.total < b.maxM ? sh.total : b.maxM;
    BAL_STAMP(2);

    /* 2. the components (one thread), then each solved by one warp: the
     * subset solve on all its lanes, the max-flows of a larger component on
     * lane 0 (a max-flow is sequential) */
    const bool small = b.G <= 32; /* components and summary on warp 0 */
    if (small && warp == 0) {
        epxi_bal_unfix(&b, lane, 32);
        b.C = 0;
        if (sh.status == EPXI_BAL_OK) components_warp(b, lane);
        if (lane == 0) sh.comps = b.C;
    } else if (!small && tid == 0) {
        epxi_bal_unfix(&b, 0, 1);
        b.C = 0;
        if (sh.status == EPXI_BAL_OK) epxi_bal_components(&b);
        sh.comps = b.C;
        sh.distinct = 0;
    }
    __syncthreads();
    BAL_STAMP(3);
    BAL_PROF_START();
    b.C = sh.comps;
    for (int32_t c = warp; c < b.C; c += nwarps) epxi_bal_solve_comp(&b, c, lane, 32);
    __syncthreads();
    BAL_STAMP(4);
    if (!small) {
        for (int32_t lid = tid; lid < b.G; lid += nt)
            if (epxi_bal_level_new(&b, lid)) atomicAdd(&sh.distinct, 1);
        __syncthreads();
    }
    int64_t sum[4];
    if (small && warp == 0) summary_warp(b, lane, sum);
    if (tid == 0) {
        int rc = sh.status;
        for (int32_t c = 0; c < b.C && rc == EPXI_BAL_OK; c++) rc = b.c_rc[c];
        if (!small) epxi_bal_summary(&b, sh.distinct, sum);
        if (a.summary) {
            for (int k = 0; k < 4; k++) a.summary[k] = sum[k];
            a.summary[4] = rc;
        }
        sh.status = rc;
    }
    __syncthreads();
    BAL_STAMP(5);

    /* 3. outputs */
    /* the counts into b.rc, which phase 4 reads (the one-block form: the
     * workspace, shared memory when it fits; the grid form: grid_rc in
     * global memory, for launch B), its listed columns only: phase 4 reads
     * no other; the same columns to rc_copy, whose rows' zeros (every column
     * past an expert's list) were stored in phase 0, coalesced, as were the
     * shares' (the whole rows once went through b.rc and a copy-out) */
    for (int32_t e = tid; e < E; e += nt) {
        /* an expert without tokens has only its even shares to write: its
         * counts and slot counts are phase 0's zeros (where they are
         * outputs), and no pair reads its counts (at one token 376 of
         * Kimi-K2.5's 384 experts, each a walk of its replica row) */
        if (b.cnt[e] == 0 && !a.shares) continue;
        epxi_bal_write_expert(&b, a.replicas, a.num_valid, e, a.shares, b.rc, a.slot_counts);
        if (rc_copy)
            for (int32_t j = 0, n = epxi_bal_nvalid(&b, a.num_valid, e); j < n; j++)
                rc_copy[(size_t)e * b.W + j] = b.rc[(size_t)e * b.W + j];
    }
    if (a.gpu_load)
        for (int32_t g = tid; g < b.G; g += nt) a.gpu_load[g] = epxi_bal_gpu_load(&b, g);
}

/* Phase 4 on the calling warp's run of the block's pairs [lo, hi): each
 * pair's rank among its expert's pairs in (t, k) order, row[e] (the
 * warp's exclusive prefix from count_pairs) plus its place in the warp's
 * walk, 32 pairs a round, ranked within a round with __match_any_sync;
 * the rank picks the replica column from the cumulative counts rcounts,
 * as epx_dispatch_balanced_map_ids fills the columns in order. The warp
 * reads its row before its group leaders advance it (__syncwarp between). */
__device__ void rank_pairs(const BalArgs &a, const epxi_bal &b, const int64_t *rcounts,
                           int32_t *row, int64_t lo, int64_t hi) {
    const int lane = threadIdx.x & 31;
    const int32_t E = b.E;
    const uint32_t lt = lanemask_lt();
    int64_t wlo, whi;
    warp_span(lo, hi, wlo, whi);
    /* the next round's id is loaded a round ahead: the global load's
     * latency leaves the chain of each round (shared memory only) */
    int32_t e_next = wlo + lane < whi ? __ldg(a.ids + wlo + lane) : -1;
    for (int64_t base = wlo; base < whi; base += 32) {
        int64_t i = base + lane;
        int32_t e = e_next;
        e_next = i + 32 < whi ? __ldg(a.ids + i + 32) : -1;
        bool ok = e >= 0 && e < E;
        uint32_t peers = __match_any_sync(0xffffffffu, ok ? e : -1);
        int32_t slot = -1, rank = 0;
        if (ok) {
            rank = row[e] + __popc(peers & lt);
            const int64_t *rc = rcounts + (size_t)e * (size_t)b.W;
            const int32_t *rep = a.replicas + (size_t)e * (size_t)b.W;
            int32_t n = epxi_bal_nvalid(&b, a.num_valid, e);
            int64_t cum = 0;
            for (int32_t j = 0; j < n; j++) {
                cum += rc[j];
                if (rank < cum) {
                    slot = __ldg(rep + j);
                    break;
                }
            }
        }
        __syncwarp();
        /* the group's highest lane advances the row by the group's size */
        if (ok && (peers >> lane) == 1u) row[e] += __popc(peers);
        __syncwarp();
        if (i < whi) a.phys[i] = slot;
    }
}

/* The one-block form: phases 0-4 in one launch (both entry points; the
 * ids entry point below the grid threshold). */
__global__ void __launch_bounds__(kMaxThreads, 1) balanced_kernel(BalArgs a) {
    /* [warps][E] counters (ids entry point only), then the workspace when
     * it fits: the solve's dependent loads at shared-memory latency */
    extern __shared__ __align__(16) unsigned char dyn[];
    int32_t *hist = (int32_t *)dyn;
    __shared__ BalShared sh;
    epxi_pdl_wait(); /* first: src/core/pdl.cuh */
    BAL_STAMP(0);
    epxi_bal b = a.bal;
    carve_shared(b, a.ws_shared, dyn + a.ws_at);
    const int tid = threadIdx.x, nt = blockDim.x;
    const int32_t E = b.E;

    /* 0. clear, then count */
    solve_clear(b, sh);
    zero_outputs(a, b, a.rcounts, tid, nt);
    if (a.from_ids) {
        count_pairs(hist, a.ids, 0, a.pairs, E, NULL, NULL, b.cnt);
    } else {
        for (int32_t e = tid; e < E; e += nt) {
            int64_t c = __ldg(a.counts + e);
            b.cnt[e] = c < 0 ? 0 : c;
        }
    }
    __syncthreads();
    BAL_STAMP(1);

    /* 1-3. */
    solve_phases(a, b, sh, a.rcounts);
    if (!a.from_ids) {
        BAL_REPORT(6);
        return;
    }
    __syncthreads();
    BAL_STAMP(6);

    /* 4. per-pair slots */
    rank_pairs(a, b, b.rc, hist + (size_t)(tid >> 5) * (size_t)E, 0, a.pairs);
#ifdef EPX_BAL_PROFILE
    __syncthreads();
    BAL_REPORT(7);
#endif
}

/* The grid form's launch A (gridDim.x = NB blocks, block r on the pairs
 * [r chunk, (r + 1) chunk)): every block stores its share of the outputs'
 * zeros and its pairs' counts per expert, ghist[r][E]; the last block to
 * finish turns ghist's columns into exclusive prefixes (row r: expert e's
 * pairs in the blocks before r), their totals into the counts, and runs
 * phases 1-3 with the replica counts written to grid_rc (global), which
 * launch B reads. */
__global__ void __launch_bounds__(kMaxThreads, 1) balanced_grid_count(BalArgs a) {
    extern __shared__ __align__(16) unsigned char dyn[];
    int32_t *hist = (int32_t *)dyn;
    __shared__ BalShared sh;
    __shared__ int s_last;
    epxi_pdl_wait();
    BAL_STAMP(0);
    epxi_bal b = a.bal;
    const int tid = threadIdx.x, nt = blockDim.x, nb = (int)gridDim.x, r = (int)blockIdx.x;
    const int32_t E = b.E;
    int32_t *ghist = a.ghist;

    /* grid_rc's unlisted columns are zeroed only where they are the
     * caller's rcounts: phases 3-4 write and read the listed ones alone */
    zero_outputs(a, b, a.rcounts, (int64_t)r * nt + tid, (int64_t)nb * nt);
    const int64_t lo = (int64_t)r * a.chunk, hi = lo + a.chunk < a.pairs ? lo + a.chunk : a.pairs;
    count_pairs(hist, a.ids, lo, hi, E, NULL, ghist + (size_t)r * (size_t)E, NULL);

    /* The handoff, as cooperative groups' grid barrier orders it: the
     * block's stores (zeros, its ghist row), a barrier, thread 0's fence
     * (cumulative: it orders the stores the barrier made it observe) and
     * the counter; the block that takes it from NB - 1 fences again before
     * its barrier, so every other block's stores are visible to all its
     * threads. atomicInc wraps the counter back to 0 in that same step: the
     * next launch (a graph replay too) finds 0. No block waits for another,
     * so this needs no co-residency. */
    __syncthreads();
    if (tid == 0) {
        __threadfence();
        const unsigned last = (unsigned)nb - 1u;
        s_last = atomicInc(a.done, last) == last;
        if (s_last) __threadfence();
    }
    __syncthreads();
    if (!s_last) return;

    carve_shared(b, a.ws_shared, dyn + a.ws_at);
    b.rc = a.grid_rc;
    solve_clear(b, sh);
    /* ghist's columns: loads of up to 16 rows in flight at once, past L1
     * (other blocks wrote them), then the prefixes stored over them */
    constexpr int kRows = 16;
    for (int32_t e = tid; e < E; e += nt) {
        int32_t run = 0;
        for (int r0 = 0; r0 < nb; r0 += kRows) {
            int32_t h[kRows];
#pragma unroll
            for (int j = 0; j < kRows; j++)
                h[j] = r0 + j < nb ? __ldcg(ghist + (size_t)(r0 + j) * (size_t)E + (size_t)e) : 0;
#pragma unroll
            for (int j = 0; j < kRows; j++)
                if (r0 + j < nb) {
                    ghist[(size_t)(r0 + j) * (size_t)E + (size_t)e] = run;
                    run += h[j];
                }
        }
        b.cnt[e] = run;
    }
    __syncthreads();
    BAL_STAMP(1);
    solve_phases(a, b, sh, NULL);
    BAL_REPORT(6);
}

/* The grid form's launch B (the same NB blocks and chunks as A): block r
 * counts its pairs again per warp, on top of ghist[r] (A's prefixes), and
 * ranks them as phase 4 does, from the replica counts A left in grid_rc. */
__global__ void __launch_bounds__(kMaxThreads) balanced_grid_rank(BalArgs a) {
    extern __shared__ __align__(16) unsigned char dyn[];
    int32_t *hist = (int32_t *)dyn;
    epxi_pdl_wait();
    const int32_t E = a.bal.E;
    const int r = (int)blockIdx.x;
    const int64_t lo = (int64_t)r * a.chunk, hi = lo + a.chunk < a.pairs ? lo + a.chunk : a.pairs;
    count_pairs(hist, a.ids, lo, hi, E, a.ghist + (size_t)r * (size_t)E, NULL, NULL);
    __syncthreads();
    rank_pairs(a, a.bal, a.grid_rc, hist + (size_t)(threadIdx.x >> 5) * (size_t)E, lo, hi);
}

epx_status check_tables(const epx_cuda_balancer *b, const int32_t *replicas,
                        const int32_t *num_valid, const char *fn, epx_error *err) {
    if (b == NULL || replicas == NULL || num_valid == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "%s: the balancer, replicas and num_valid are "
                         "required",
                         fn);
    return EPX_OK;
}

void set_outputs(BalArgs &a, const epx_cuda_balanced_out *out) {
    a.shares = out ? out->shares : NULL;
    a.rcounts = out ? out->replica_counts : NULL;
    a.slot_counts = out ? out->slot_counts : NULL;
    a.gpu_load = out ? out->gpu_load : NULL;
    a.summary = out ? out->summary : NULL;
}

} /* namespace */

extern "C" void epx_cuda_dispatch_balanced_destroy(epx_cuda_balancer *b) {
    if (b == NULL) return;
    cudaFree(b->mem);
    free(b);
}

extern "C" epx_status epx_cuda_dispatch_balanced_create(int32_t num_experts, int32_t width,
                                                        int32_t num_physical, int32_t num_gpus,
                                                        epx_cuda_balancer **out, epx_error *err) {
    if (out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_cuda_dispatch_balanced_create: out is NULL");
    *out = NULL;
    if (num_experts < 1 || width < 1 || num_physical < 1 || num_gpus < 1 || num_gpus > 4096 ||
        num_physical % num_gpus != 0)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "epx_cuda_dispatch_balanced_create: E = %d, W = %d, P = %d, G = %d: all "
                         "must be >= 1, G at most 4096 and P a multiple of G",
                         num_experts, width, num_physical, num_gpus);
    if (num_experts > (1 << 24) || width > (1 << 16) || num_physical > (1 << 24))
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "epx_cuda_dispatch_balanced_create: E = %d, W = %d or P = %d is too "
                         "large",
                         num_experts, width, num_physical);
    epx_cuda_balancer *b = (epx_cuda_balancer *)calloc(1, sizeof *b);
    if (b == NULL)
        return epxi_fail(err, EPX_ERR_NOMEM, "epx_cuda_dispatch_balanced_create: out of memory");
    epxi_bal_shape(&b->bal, num_experts, width, num_physical, num_gpus);
    const char *name = NULL, *bad = NULL, *help = NULL;
    if (epxi_bal_env(&b->bal, &name, &bad, &help) != 0) {
        free(b);
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_cuda_dispatch_balanced_create: %s = '%s': %s", name, bad, help);
    }
    b->pdl = 1;
    if (!epxi_env_switch("EPX_BALANCED_PDL", &b->pdl, &bad)) {
        free(b);
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_cuda_dispatch_balanced_create: EPX_BALANCED_PDL = '%s': must be 1 "
                         "(programmatic dependent launch, the default) or 0 (plain launches)",
                         bad);
    }
    if (epxi_bal_grid_pairs_from_env(&b->grid_pairs, &bad) != 0) {
        free(b);
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_cuda_dispatch_balanced_create: EPX_BALANCED_GRID_PAIRS = "
                         "'%s': " EPXI_BAL_GRID_HELP,
                         bad);
    }
    if ((int64_t)b->bal.maxM * (1 + (int64_t)b->bal.D) > INT32_MAX / 4) {
        free(b);
        return epxi_fail(err, EPX_ERR_SHAPE, "epx_cuda_dispatch_balanced_create: graph too large");
    }
    epx_status st = EPX_OK;
    int dev = 0, optin = 0, sms = 0;
    size_t bytes = epxi_bal_carve(&b->bal, NULL), done_at = 0;
    EPXI_CUDA_GOTO(st, cudaGetDevice(&dev), "cudaGetDevice", fail);
    EPXI_CUDA_GOTO(st, cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
                   "cudaDeviceGetAttribute", fail);
    EPXI_CUDA_GOTO(st, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
                   "cudaDeviceGetAttribute", fail);
    {
        /* the grid form's table after the workspace: a row of E counters
         * per block, at most one block per SM and 64 MiB of rows (only a
         * huge E gets fewer blocks), then the done counter */
        int64_t nb = sms < kGridMaxBlocks ? sms : kGridMaxBlocks;
        int64_t cap = ((int64_t)64 << 20) / (4 * (int64_t)num_experts);
        nb = nb < cap ? nb : cap;
        b->nb_max = nb >= 1 ? (int)nb : 1;
        done_at = bytes + (((size_t)b->nb_max * (size_t)num_experts * 4 + 15) & ~(size_t)15);
    }
    EPXI_CUDA_GOTO(st, cudaMalloc(&b->mem, done_at + 16), "cudaMalloc (balancer workspace)", fail);
    epxi_bal_carve(&b->bal, b->mem);
    b->ghist = (int32_t *)((char *)b->mem + bytes);
    b->done = (unsigned *)((char *)b->mem + done_at);
    /* the counter starts at 0 (each grid launch leaves it there); the
     * synchronize keeps a non-blocking stream's first launch after it */
    EPXI_CUDA_GOTO(st, cudaMemset(b->done, 0, sizeof(unsigned)), "cudaMemset", fail);
    EPXI_CUDA_GOTO(st, cudaStreamSynchronize(0), "cudaStreamSynchronize", fail);
    {
        /* The workspace goes to shared memory when it fits beside at least
         * one warp's counters, else its hot part when that does; then
         * warps for the ids entry point, one shared row of E counters
         * each, in what is left. */
        int64_t room = (int64_t)optin - 1024, row = 4 * (int64_t)num_experts;
        const int64_t one_row = (row + 15) & ~(int64_t)15;
        b->ws_shared = (int64_t)bytes + one_row <= room ? kWsShared
                       : b->bal.hot + one_row <= room   ? kWsHot
                                                        : kWsDevice;
        b->ws_shm = b->ws_shared == kWsShared ? bytes
                    : b->ws_shared == kWsHot  ? (size_t)b->bal.hot
                                              : 0;
        room -= (int64_t)b->ws_shm;
        int64_t warps = room / row;
        while (warps > 0 && (((warps * row) + 15) & ~(int64_t)15) > room) warps--;
        if (warps > kMaxThreads / 32) warps = kMaxThreads / 32;
        b->threads = warps >= 1 ? (int)warps * 32 : 0;
        b->hist = warps >= 1 ? (size_t)((warps * row + 15) & ~(int64_t)15) : 0;
        size_t most = b->hist + b->ws_shm;
        /* always: the default 48 KiB covers static and dynamic shared
         * memory together, so 48 KiB of counters alone is already too much */
        if (most > 0) {
            EPXI_CUDA_GOTO(st,
                           cudaFuncSetAttribute(balanced_kernel,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)most),
                           "cudaFuncSetAttribute", fail);
            EPXI_CUDA_GOTO(st,
                           cudaFuncSetAttribute(balanced_grid_count,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)most),
                           "cudaFuncSetAttribute", fail);
        }
        if (b->hist > 0)
            EPXI_CUDA_GOTO(st,
                           cudaFuncSetAttribute(balanced_grid_rank,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)b->hist),
                           "cudaFuncSetAttribute", fail);
    }
    *out = b;
    return EPX_OK;
fail:
    epx_cuda_dispatch_balanced_destroy(b);
    return st;
}

extern "C" epx_status epx_cuda_dispatch_balanced_solve(
    epx_cuda_balancer *b, const int32_t *replicas, const int32_t *num_valid, const int64_t *counts,
    const epx_cuda_balanced_out *out, cudaStream_t stream, epx_error *err) {
    EPX_TRY(check_tables(b, replicas, num_valid, "epx_cuda_dispatch_balanced_solve", err));
    if (counts == NULL || out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_cuda_dispatch_balanced_solve: counts and out are required");
    BalArgs a = {};
    a.bal = b->bal;
    a.replicas = replicas;
    a.num_valid = num_valid;
    a.counts = counts;
    set_outputs(a, out);
    a.ws_shared = b->ws_shared;
    a.ws_at = 0;
    EPXI_CUDA_TRY(epxi_launch_pdl(b->pdl, balanced_kernel, 1, kMaxThreads, b->ws_shm, stream, a),
                  "the balanced kernel's launch");
    return EPX_OK;
}

extern "C" epx_status epx_cuda_dispatch_balanced_topk(epx_cuda_balancer *b, const int32_t *replicas,
                                                      const int32_t *num_valid,
                                                      const int32_t *topk_ids, int64_t num_tokens,
                                                      int32_t topk, int32_t *phys,
                                                      const epx_cuda_balanced_out *out,
                                                      cudaStream_t stream, epx_error *err) {
    EPX_TRY(check_tables(b, replicas, num_valid, "epx_cuda_dispatch_balanced_topk", err));
    if (num_tokens < 0 || num_tokens > INT32_MAX || topk < 1 ||
        num_tokens * (int64_t)topk > INT32_MAX)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "epx_cuda_dispatch_balanced_topk: topk_ids is [%lld][%d]: T >= 0, K >= 1 "
                         "and T*K must stay below 2^31",
                         (long long)num_tokens, topk);
    if (num_tokens > 0 && (topk_ids == NULL || phys == NULL))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_cuda_dispatch_balanced_topk: topk_ids and phys are required");
    if (b->threads == 0)
        return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                         "epx_cuda_dispatch_balanced_topk: E = %d needs %lld bytes of shared "
                         "memory per warp, more than this device gives a block",
                         b->bal.E, 4 * (long long)b->bal.E);
    BalArgs a = {};
    a.bal = b->bal;
    a.replicas = replicas;
    a.num_valid = num_valid;
    a.ids = topk_ids;
    a.pairs = num_tokens * topk;
    a.from_ids = 1;
    a.phys = phys;
    set_outputs(a, out);
    a.ws_shared = b->ws_shared;
    a.ws_at = (uint32_t)b->hist;
    const size_t shm = b->hist + b->ws_shm;
    if (a.pairs < b->grid_pairs) {
        EPXI_CUDA_TRY(epxi_launch_pdl(b->pdl, balanced_kernel, 1, b->threads, shm, stream, a),
                      "the balanced kernel's launch");
        return EPX_OK;
    }
    /* the grid form: NB blocks of chunk pairs (the last one short; one
     * block of none at T = 0), a multiple of 32 */
    int64_t chunk = (a.pairs + b->nb_max - 1) / b->nb_max;
    chunk = chunk > kGridChunk ? (chunk + 31) / 32 * 32 : kGridChunk;
    const int nb = a.pairs > 0 ? (int)((a.pairs + chunk - 1) / chunk) : 1;
    a.from_ids = 2;
    a.chunk = chunk;
    a.ghist = b->ghist;
    a.done = b->done;
    a.grid_rc = a.rcounts ? a.rcounts : b->bal.rc;
    EPXI_CUDA_TRY(epxi_launch_pdl(b->pdl, balanced_grid_count, nb, b->threads, shm, stream, a),
                  "the balanced grid form's launch A");
    EPXI_CUDA_TRY(epxi_launch_pdl(b->pdl, balanced_grid_rank, nb, b->threads, b->hist, stream, a),
                  "the balanced grid form's launch B");
    return EPX_OK;
}
