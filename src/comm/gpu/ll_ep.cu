/*
 * ll_ep.cu - the low-latency EP engine (epx_comm_gpu.h): one kernel per
 * phase over peer pointers, the protocol and layout of ep_common.h.
 *
 * One device buffer per rank, carved as:
 *   recv   R * (M + 1) records    peers write token rows and flags here
 *   comb   M * K rows + R flags   peers write expert outputs and flags here
 *   ------------------------------ (above: written by peers)
 *   y, entry_token/_weight/_pair   the grouped entries and their outputs
 *   slot_offsets, weights, slots   the receiver's view; this batch's routing
 *   ctl                            epoch, arrival counters, the fault record
 * The peer table (R base pointers, this rank's own among them) sits at the
 * end. Only the kernels touch the buffer per batch.
 *
 * Ordering: a block writes its rows with plain stores, fences at system
 * scope and counts itself in; the last block to arrive fences again and
 * publishes the flags with release stores; a waiter reads flags with
 * acquire loads, so the rows are visible once the flag is. Buffers are
 * reused safely without clearing: a rank starts batch n + 1's dispatch only
 * after its combine of batch n saw every peer's combine flag, which each
 * peer sets after its experts read its rows of batch n; stale rows carry an
 * older epoch tag.
 */
#include <climits>
#include <cuda_runtime.h>
#include <unistd.h>

#include "comm_internal.h"
#include "ep_common.h"
#include "epx_comm_gpu.h"
#include "cuda_check.h"

namespace {

constexpr int kThreads = 512;
constexpr int kMaxK = EPX_MOE_MAX_TOP_K;
/* Shared-memory ints for the per-warp slot histograms of the grouping (the
 * slot totals take one more row), and the most ranks (per-source counts
 * live in shared memory too). */
constexpr int kHistInts = 6144;
constexpr int kMaxRanks = 1024;
static_assert(kMaxK <= kThreads, "a block's threads hold one token's K choices");

/* Fault codes: fault[0] (sticky: the kernels stop) and fault[4] (a refused
 * batch, reported once). */
enum : uint32_t { F_NONE = 0, F_TIMEOUT = 1, F_BAD_SLOT = 2 };
/* Phases in Ctl::fault[1]. */
enum : uint32_t { PH_DISPATCH = 1, PH_COMBINE = 2 };

struct Ctl {
    uint32_t epoch;               /* the last dispatched batch's */
    uint32_t arrive_d;            /* blocks of the running dispatch that finished sending */
    uint32_t arrive_c;            /* same for combine */
    uint32_t refused;             /* the last dispatch was refused: combine writes zeros */
    uint32_t fault[4];            /* code, phase, peer, epoch */
    unsigned long long stamp[16]; /* variant 8: block 0's clock at each step */
};

/* Offsets of one rank's buffer and everything the kernels need. */
struct Args {
    int32_t R, me, K, H, spr, P;
    int64_t M;
    size_t rec, xrow, yrow, meta_off, tag_off;
    size_t off_recv, off_comb, off_cflag;
    unsigned char *base;         /* this rank's buffer */
    unsigned char *const *peers; /* [R] device: every rank's buffer, mapped here */
    unsigned char *y;
    int32_t *entry_token, *entry_pair;
    float *entry_weight;
    int64_t *so;
    float *weights;
    int32_t *slots;
    Ctl *ctl;
    uint32_t *host_fault; /* host-mapped [8]: ctl->fault, then a refused batch */
    unsigned long long timeout_ns;
    int xbf16, ybf16;
    int skip_flags; /* fault injection: dispatch publishes no flags */
    int variant;    /* measurement variants (ld_acquire's comment) */
};

__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Variant bits (bench and tests only, epxi_gpu_ep_variant): 1 = blocks
 * count in at GPU scope (arrive); 2 = flags at GPU scope (one GPU
 * only); 4 = poll without sleeping; 8 = block 0 stamps the global timer at
 * each step (Ctl::stamp, read with epxi_gpu_ep_stamps). */
#define STAMP(a, i)                                                                                \
    do {                                                                                           \
        if (((a).variant & 8) && blockIdx.x == 0 && threadIdx.x == 0)                              \
            (a).ctl->stamp[i] = now_ns();                                                          \
    } while (0)

__device__ __forceinline__ uint64_t ld_acquire(const uint64_t *p, int var) {
    uint64_t v;
    if (var & 2)
        asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    else
        asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release(uint64_t *p, uint64_t v, int var) {
    if (var & 2)
        asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
    else
        asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint32_t ld_volatile(const uint32_t *p) {
    return *(const volatile uint32_t *)p;
}

/* Record the first fault, here and in host-mapped memory. */
__device__ void raise_fault(const Args &a, uint32_t code, uint32_t phase, uint32_t peer,
                            uint32_t epoch) {
    if (atomicCAS(&a.ctl->fault[0], 0u, code) == 0u) {
        a.ctl->fault[1] = phase;
        a.ctl->fault[2] = peer;
        a.ctl->fault[3] = epoch;
        a.host_fault[1] = phase;
        a.host_fault[2] = peer;
        a.host_fault[3] = epoch;
        __threadfence_system();
        *(volatile uint32_t *)&a.host_fault[0] = code;
    }
}

/* A refused batch (a bad slot on rank `peer`): reported once by the host,
 * not sticky. */
__device__ void raise_refused(const Args &a, uint32_t peer, uint32_t epoch) {
    a.host_fault[5] = PH_DISPATCH;
    a.host_fault[6] = peer;
    a.host_fault[7] = epoch;
    __threadfence_system();
    *(volatile uint32_t *)&a.host_fault[4] = F_BAD_SLOT;
}

/* Copy `bytes` from src to dst with the block's threads, in the widest
 * words that the addresses and the length allow (rows of an odd number of
 * bf16 values are only 2-byte aligned). */
template <typename W>
__device__ __forceinline__ void copy_words(unsigned char *__restrict__ dst,
                                           const unsigned char *__restrict__ src, size_t bytes) {
    const W *__restrict__ s = (const W *)src;
    W *__restrict__ d = (W *)dst;
    const size_t n = bytes / sizeof(W), step = blockDim.x;
    size_t i = threadIdx.x;
    /* Four loads in flight per thread before their stores: one row is too
     * little work to hide the memory latency otherwise. */
    for (; i + 3 * step < n; i += 4 * step) {
        const W r0 = s[i], r1 = s[i + step], r2 = s[i + 2 * step], r3 = s[i + 3 * step];
        d[i] = r0;
        d[i + step] = r1;
        d[i + 2 * step] = r2;
        d[i + 3 * step] = r3;
    }
    for (; i < n; i += step) d[i] = s[i];
}
__device__ __forceinline__ void block_copy(unsigned char *dst, const unsigned char *src,
                                           size_t bytes) {
    const size_t al = ((uintptr_t)dst | (uintptr_t)src | bytes);
    if (al % 16 == 0)
        copy_words<int4>(dst, src, bytes);
    else if (al % 8 == 0)
        copy_words<uint2>(dst, src, bytes);
    else if (al % 4 == 0)
        copy_words<uint32_t>(dst, src, bytes);
    else if (al % 2 == 0)
        copy_words<uint16_t>(dst, src, bytes);
    else
        copy_words<unsigned char>(dst, src, bytes);
}

/* Spin (threads < n) until flag i reads `epoch` in its high half; false on
 * timeout or an earlier fault. Returns with the block synchronised. */
__device__ bool wait_flags(const Args &a, const uint64_t *flag0, size_t stride, int n,
                           uint32_t epoch, uint32_t phase, uint32_t *low = nullptr) {
    __shared__ int ok;
    if (threadIdx.x == 0) ok = 1;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const uint64_t *f = (const uint64_t *)((const unsigned char *)flag0 + (size_t)i * stride);
        unsigned long long t0 = now_ns();
        uint64_t v;
        while ((uint32_t)((v = ld_acquire(f, a.variant)) >> 32) != epoch) {
            if (ld_volatile(&a.ctl->fault[0]) != F_NONE) {
                ok = 0;
                break;
            }
            if (now_ns() - t0 > a.timeout_ns) {
                raise_fault(a, F_TIMEOUT, phase, (uint32_t)i, epoch);
                ok = 0;
                break;
            }
            if (!(a.variant & 4)) __nanosleep(64);
        }
        if (low != nullptr) low[i] = (uint32_t)v; /* spares the caller a second read */
    }
    __syncthreads();
    return ok != 0;
}

__device__ __forceinline__ uint32_t atom_add_acq_rel(uint32_t *p, uint32_t v, int var) {
    uint32_t old;
    if (var & 1)
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;"
                     : "=r"(old)
                     : "l"(p), "r"(v)
                     : "memory");
    else
        asm volatile("atom.acq_rel.sys.global.add.u32 %0, [%1], %2;"
                     : "=r"(old)
                     : "l"(p), "r"(v)
                     : "memory");
    return old;
}

/* Count this block in, with `mark` (nonzero in any thread) carried along;
 * the last block runs publish(marked: some block was marked). Ordering
 * without a separate fence: the block's barrier, then thread 0's
 * acquire-release atomic, whose release covers the block's writes (through
 * the barrier) and whose acquire, in the last block, covers every earlier
 * block's; publish's flags are release stores, so a reader that acquires a
 * flag sees every block's writes. Blocks count in the low 16 bits of the
 * counter (grids stay below 2^16: max_blocks), marks above them. */
template <typename F> __device__ void arrive(uint32_t *counter, int mark, int var, F publish) {
    const int marked = __syncthreads_or(mark);
    if (threadIdx.x == 0) {
        const uint32_t add = 1u + (marked ? 0x10000u : 0u);
        if (gridDim.x == 1) { /* alone: nobody to count */
            publish(marked != 0);
        } else {
            const uint32_t total = atom_add_acq_rel(counter, add, var) + add;
            if ((total & 0xffffu) == gridDim.x) {
                *counter = 0;
                publish((total >> 16) != 0);
            }
        }
    }
}

__device__ uint64_t *dflag_at(const Args &a, unsigned char *buf, int src) {
    return (uint64_t *)(buf + a.off_recv + ((size_t)src * (a.M + 1) + a.M) * a.rec);
}

/* so[0..n] = exclusive prefix sums of v[0..n) (so[n] = the total), by the
 * whole block: each thread sums a contiguous chunk, the chunk sums are
 * scanned with warp shuffles (lanes, then warp totals), then each chunk is
 * written -- to so (global, for the experts) and over v itself (shared, so
 * the block reads its starts back without a trip to memory). */
__device__ void block_exclusive_scan(int32_t *v, int n, int64_t *so) {
    __shared__ int64_t warp_total[kThreads / 32];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nwarps = blockDim.x / 32;
    const int per = (n + blockDim.x - 1) / blockDim.x;
    const int lo = tid * per < n ? tid * per : n, hi = lo + per < n ? lo + per : n;
    int64_t sum = 0;
    for (int i = lo; i < hi; i++) sum += v[i];
    int64_t inc = sum; /* inclusive scan within the warp */
    for (int d = 1; d < 32; d *= 2) {
        int64_t up = __shfl_up_sync(0xffffffffu, inc, d);
        if (lane >= d) inc += up;
    }
    if (lane == 31) warp_total[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        int64_t wt = lane < nwarps ? warp_total[lane] : 0, winc = wt;
        for (int d = 1; d < 32; d *= 2) {
            int64_t up = __shfl_up_sync(0xffffffffu, winc, d);
            if (lane >= d) winc += up;
        }
        if (lane < nwarps) warp_total[lane] = winc - wt; /* exclusive, per warp */
    }
    __syncthreads();
    int64_t run = warp_total[warp] + inc - sum; /* exclusive, this thread */
    for (int i = lo; i < hi; i++) {
        const int32_t vi = v[i];
        so[i] = run;
        v[i] = (int32_t)run;
        run += vi;
    }
    if (tid == (int)blockDim.x - 1) so[n] = run;
}

/*
 * The receiver's grouping, one block: entries of every tagged row of
 * sources 0..R-1 (rows t < T_src), by local slot, in (source, token, k)
 * order. Warps own contiguous ranges of (row, k) pairs; each counts its
 * range into its own histogram, one scan turns the histograms into start
 * positions, and each warp places its range in order, ranking equal slots
 * among its lanes with __match_any_sync.
 */
__device__ void group_entries(const Args &a, const int32_t *rows_of, uint32_t epoch) {
    __shared__ int32_t first_row[kMaxRanks + 1]; /* prefix of T_src over sources */
    extern __shared__ int32_t hist[];            /* [nw][spr + 1] */
    const int K = a.K, spr = a.spr;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int nwarps = blockDim.x / 32;
    int nw = kHistInts / (spr + 1) - 1;
    nw = nw < 1 ? 1 : (nw > nwarps ? nwarps : nw);
    if (threadIdx.x == 0) {
        int32_t acc = 0;
        for (int r = 0; r < a.R; r++) {
            first_row[r] = acc;
            acc += rows_of[r];
        }
        first_row[a.R] = acc;
    }
    __syncthreads();
    const int64_t npairs = (int64_t)first_row[a.R] * K;
    /* No more warps than 32-pair steps: a small batch clears and sums
     * fewer histograms. */
    if ((npairs + 31) / 32 < nw) nw = npairs > 0 ? (int)((npairs + 31) / 32) : 1;
    for (int i = threadIdx.x; i < nw * (spr + 1); i += blockDim.x) hist[i] = 0;
    __syncthreads();
    const int64_t chunk = (npairs + nw - 1) / nw;
    const unsigned char *recv = a.base + a.off_recv;
    /* The slot of pair q (or -1) and its row in the buffer. */
    auto key_of = [&](int64_t q, int64_t *row, float *w) -> int32_t {
        int64_t v = q / K;
        int r = 0;
        while (first_row[r + 1] <= v) r++;
        *row = (int64_t)r * (a.M + 1) + (v - first_row[r]);
        const unsigned char *rec = recv + (size_t)*row * a.rec;
        /* Tag and entry are loaded together (one trip to memory, not two);
         * the entry of a stale row is read but not used. */
        uint32_t tag;
        memcpy(&tag, rec + a.tag_off, 4);
        const epxi_ep_meta m = ((const epxi_ep_meta *)(rec + a.meta_off))[q % K];
        *w = m.weight;
        if (tag != epoch) return -1;
        return m.slot >= 0 && m.slot < spr ? m.slot : -1;
    };
    int32_t *h = hist + (size_t)warp * (spr + 1);
    const int64_t lo = (int64_t)warp * chunk, hi = lo + chunk < npairs ? lo + chunk : npairs;
    /* A lane's first pair is kept for the placement pass: at decode sizes
     * that is every pair, so the records are read once. */
    int32_t kept_s = -1;
    int64_t kept_row = 0;
    float kept_w = 0.0f;
    if (warp < nw)
        for (int64_t q = lo + lane; q < hi; q += 32) {
            int64_t row;
            float w;
            int32_t s = key_of(q, &row, &w);
            if (q == lo + lane) kept_s = s, kept_row = row, kept_w = w;
            if (s >= 0) atomicAdd(&h[s], 1);
        }
    __syncthreads();
    STAMP(a, 5);
    /* Start of (warp, slot) = entries of lower slots + this slot's entries
     * in lower warps: one thread per slot sums down the warps, then a
     * block-wide scan over the slots gives so[]. */
    int32_t *tot = hist + (size_t)nw * (spr + 1); /* [spr + 1] */
    for (int s = threadIdx.x; s < spr; s += blockDim.x) {
        int32_t acc = 0;
        for (int w = 0; w < nw; w++) {
            int32_t c = hist[(size_t)w * (spr + 1) + s];
            hist[(size_t)w * (spr + 1) + s] = acc;
            acc += c;
        }
        tot[s] = acc;
    }
    __syncthreads();
    block_exclusive_scan(tot, spr, a.so);
    __syncthreads();
    STAMP(a, 6);
    if (warp < nw)
        for (int64_t q0 = lo; q0 < hi; q0 += 32) {
            int64_t q = q0 + lane, row = kept_row;
            float w = kept_w;
            int32_t s = q >= hi ? -1 : q0 == lo ? kept_s : key_of(q, &row, &w);
            unsigned peers = __match_any_sync(0xffffffffu, s);
            if (s >= 0) {
                int rank = __popc(peers & ((1u << lane) - 1u));
                int64_t e = (int64_t)tot[s] + h[s] + rank;
                a.entry_token[e] = (int32_t)row;
                a.entry_weight[e] = w;
                a.entry_pair[e] = (int32_t)(row * K + q % K);
            }
            __syncwarp();
            if (s >= 0 && lane == __ffs(peers) - 1) h[s] += __popc(peers);
            __syncwarp();
        }
}

__global__ void __launch_bounds__(kThreads) k_dispatch(Args a, int64_t T, const unsigned char *x,
                                                       const int32_t *slots, const float *weights) {
    const int K = a.K, dmax = K < a.R ? K : a.R;
    __shared__ int32_t d[kMaxK], sk[kMaxK];
    __shared__ float wk[kMaxK];
    __shared__ int nd;
    /* The x row is read into registers while the routing is worked out, so
     * the two reads overlap; rows too large for that are copied directly. */
    constexpr int kPre = 4;
    const bool pre =
        a.xrow % 16 == 0 && a.xrow / 16 <= (size_t)kPre * blockDim.x && (uintptr_t)x % 16 == 0;
    int4 v[kPre];
    int32_t sv = -1; /* this thread's (slot, weight) of the item's token, k = threadIdx.x */
    float wv = 0.0f;
    int bad_slot = 0; /* this thread saw a slot outside [-1, P) */
    auto load_item = [&](int64_t item) {
        const int64_t t = item / dmax;
        if (pre)
#pragma unroll
            for (int i = 0; i < kPre; i++) {
                size_t w = threadIdx.x + (size_t)i * blockDim.x;
                if (w < a.xrow / 16) v[i] = ((const int4 *)(x + (size_t)t * a.xrow))[w];
            }
        if (threadIdx.x < K) {
            sv = slots[t * K + threadIdx.x];
            wv = weights[t * K + threadIdx.x];
        }
    };
    /* The first item's loads are issued before the fault check, so the
     * two trips to memory overlap. */
    if (blockIdx.x < T * dmax) load_item(blockIdx.x);
    uint32_t epoch = a.ctl->epoch + 1;
    if (ld_volatile(&a.ctl->fault[0]) != F_NONE) return;
    STAMP(a, 0);
    if (epoch == 0) epoch = 1; /* 0 marks rows never written */
    /* Send: work item (token, j-th destination). */
    for (int64_t item = blockIdx.x; item < T * dmax; item += gridDim.x) {
        const int64_t t = item / dmax;
        const int j = (int)(item % dmax);
        const unsigned char *xr = x + (size_t)t * a.xrow;
        if (item != blockIdx.x) load_item(item);
        if (threadIdx.x < K) { /* K <= kMaxK < blockDim.x */
            const int k = threadIdx.x;
            if (sv < -1 || sv >= a.P) bad_slot = 1;
            sk[k] = sv;
            wk[k] = wv;
            if (j == 0) {
                a.slots[t * K + k] = sv;
                a.weights[t * K + k] = wv;
            }
        }
        __syncthreads();
        if (K <= 32) {
            /* Warp 0: the distinct destination ranks, ascending, without a
             * serial scan: each first occurrence counts the smaller ones. */
            if (threadIdx.x < 32) {
                const int lane = threadIdx.x;
                const int r = lane < K && sk[lane] >= 0 ? sk[lane] / a.spr : INT_MAX;
                const unsigned same = __match_any_sync(0xffffffffu, r);
                const bool first = r != INT_MAX && lane == __ffs(same) - 1;
                int pos = 0;
                for (int j = 0; j < K; j++) {
                    const int rj = __shfl_sync(0xffffffffu, r, j);
                    const int fj = __shfl_sync(0xffffffffu, (int)first, j);
                    pos += fj && rj < r;
                }
                if (first) d[pos] = r;
                const unsigned firsts = __ballot_sync(0xffffffffu, first);
                if (lane == 0) nd = __popc(firsts);
            }
        } else if (threadIdx.x == 0) {
            nd = epxi_ep_token_dests(sk, K, a.spr, d);
        }
        __syncthreads();
        if (j < nd) {
            const int dst = d[j];
            unsigned char *rec =
                a.peers[dst] + a.off_recv + ((size_t)a.me * (a.M + 1) + (size_t)t) * a.rec;
            if (pre) {
#pragma unroll
                for (int i = 0; i < kPre; i++) {
                    size_t w = threadIdx.x + (size_t)i * blockDim.x;
                    if (w < a.xrow / 16) ((int4 *)rec)[w] = v[i];
                }
            } else {
                block_copy(rec, xr, a.xrow);
            }
            for (int k = threadIdx.x; k < K; k += blockDim.x) {
                bool here = sk[k] >= 0 && sk[k] / a.spr == dst;
                epxi_ep_meta m;
                m.slot = here ? sk[k] - dst * a.spr : -1;
                m.weight = here ? wk[k] : 0.0f;
                ((epxi_ep_meta *)(rec + a.meta_off))[k] = m;
            }
            if (threadIdx.x == 0) *(uint32_t *)(rec + a.tag_off) = epoch;
        }
        __syncthreads();
    }
    STAMP(a, 1);
    arrive(&a.ctl->arrive_d, bad_slot, a.variant, [&](bool bad) {
        a.ctl->epoch = epoch;
        if (a.skip_flags) return;
        uint64_t flag = epxi_ll_flag(epoch, bad ? EPXI_LL_BAD : (uint32_t)T);
        for (int r = 0; r < a.R; r++) st_release(dflag_at(a, a.peers[r], a.me), flag, a.variant);
    });
    /* Receive: block 0 waits for every source and groups. */
    if (blockIdx.x != 0) return;
    STAMP(a, 2);
    __shared__ int32_t rows_of[kMaxRanks + 1];
    __shared__ int any_bad;
    if (!wait_flags(a, dflag_at(a, a.base, 0), (size_t)(a.M + 1) * a.rec, a.R, epoch, PH_DISPATCH,
                    (uint32_t *)rows_of)) {
        for (int s = threadIdx.x; s <= a.spr; s += blockDim.x) a.so[s] = 0;
        return;
    }
    STAMP(a, 3);
    if (threadIdx.x == 0) {
        any_bad = -1;
        a.ctl->refused = 0;
    }
    __syncthreads();
    for (int r = threadIdx.x; r < a.R; r += blockDim.x) {
        const uint32_t c = (uint32_t)rows_of[r]; /* the flag's count, as wait_flags saw it */
        rows_of[r] = c == EPXI_LL_BAD ? 0 : (int32_t)c;
        if (c == EPXI_LL_BAD) atomicCAS(&any_bad, -1, r);
    }
    __syncthreads();
    if (any_bad >= 0) {
        /* Nobody runs an expert on a refused batch; combine yields zeros. */
        if (threadIdx.x == 0) {
            a.ctl->refused = 1;
            raise_refused(a, (uint32_t)any_bad, epoch);
        }
        for (int s = threadIdx.x; s <= a.spr; s += blockDim.x) a.so[s] = 0;
        return;
    }
    group_entries(a, rows_of, epoch);
    STAMP(a, 4);
}

__global__ void __launch_bounds__(kThreads) k_identity(Args a) {
    if (ld_volatile(&a.ctl->fault[0]) != F_NONE) return;
    const int64_t n = a.so[a.spr];
    const unsigned char *recv = a.base + a.off_recv;
    for (int64_t e = blockIdx.x; e < n; e += gridDim.x) {
        const unsigned char *src = recv + (size_t)a.entry_token[e] * a.rec;
        unsigned char *dst = a.y + (size_t)e * a.yrow;
        if (a.xbf16 == a.ybf16) {
            block_copy(dst, src, a.yrow);
        } else {
            for (int h = threadIdx.x; h < a.H; h += blockDim.x)
                epxi_row_store(dst, h, epxi_row_load(src, h, a.xbf16), a.ybf16);
        }
    }
}

/* Elements a thread reduces in combine: 16 bytes of its rows, loaded raw
 * and widened to floats only when they are summed. */
template <int BF16> struct Lanes;
template <> struct Lanes<1> {
    static constexpr int V = 8;
    __device__ static void widen(const int4 &v, float *y) {
        const uint32_t u[4] = {(uint32_t)v.x, (uint32_t)v.y, (uint32_t)v.z, (uint32_t)v.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            y[2 * j] = epxi_bf16_to_f32((uint16_t)(u[j] & 0xffffu));
            y[2 * j + 1] = epxi_bf16_to_f32((uint16_t)(u[j] >> 16));
        }
    }
};
template <> struct Lanes<0> {
    static constexpr int V = 4;
    __device__ static void widen(const int4 &v, float *y) {
        y[0] = __int_as_float(v.x), y[1] = __int_as_float(v.y), y[2] = __int_as_float(v.z),
        y[3] = __int_as_float(v.w);
    }
};

/*
 * out[t][h0 .. h0 + V) of one token: the combine formula of ep_common.h
 * (acc = 0; for k ascending with a slot: acc = acc + w[k] * y_k, rounded
 * after each step) on V elements at once. rows[k] (NULL: no expert) and
 * w[k] are staged in shared memory; the 16-byte loads of eight rows are
 * issued before any is summed, so a top-8 token costs one trip to memory
 * (held raw, 32 registers, and widened as summed).
 */
template <int BF16>
__device__ void reduce_lanes(const Args &a, const unsigned char *const *rows, const float *w,
                             int64_t h0, float *out) {
    constexpr int V = Lanes<BF16>::V, B = 8;
    const int K = a.K;
    if (h0 + V <= a.H && a.yrow % 16 == 0) {
        /* Every index below is a constant after unrolling, so acc and the
         * raw rows stay in registers. */
        float acc[V];
#pragma unroll
        for (int j = 0; j < V; j++) acc[j] = 0.0f;
        for (int k0 = 0; k0 < K; k0 += B) {
            int4 raw[B];
#pragma unroll
            for (int b = 0; b < B; b++)
                if (k0 + b < K && rows[k0 + b] != nullptr)
                    raw[b] = *(const int4 *)(rows[k0 + b] + (size_t)h0 * (BF16 ? 2 : 4));
#pragma unroll
            for (int b = 0; b < B; b++)
                if (k0 + b < K && rows[k0 + b] != nullptr) {
                    float y[V];
                    Lanes<BF16>::widen(raw[b], y);
#pragma unroll
                    for (int j = 0; j < V; j++) acc[j] = epxi_madd(acc[j], w[k0 + b], y[j]);
                }
            if (k0 == 0) STAMP(a, 13); /* the first rows arrived */
        }
        STAMP(a, 14);
#pragma unroll
        for (int j = 0; j < V; j++) out[h0 + j] = acc[j];
        return;
    }
    /* The row's tail (or unaligned rows): element by element. */
    for (int64_t h = h0; h < h0 + V && h < a.H; h++)
        out[h] = epxi_ep_combine_elem(rows, w, K, h, BF16);
}

__global__ void __launch_bounds__(kThreads) k_combine(Args a, int64_t T, float *out) {
    /* Loaded before the fault check so the trips to memory overlap. */
    const uint32_t epoch = a.ctl->epoch;
    const int64_t n = a.so[a.spr];
    const bool refused = a.ctl->refused != 0; /* set by this rank's dispatch, before us */
    if (ld_volatile(&a.ctl->fault[0]) != F_NONE) return;
    STAMP(a, 8);
    const int K = a.K;
    /* Send: each entry's output to row t * K + k of its token's rank. */
    for (int64_t e = blockIdx.x; e < n; e += gridDim.x) {
        const int64_t pair = a.entry_pair[e], row = pair / K;
        const int64_t src = row / (a.M + 1), t = row % (a.M + 1);
        unsigned char *dst = a.peers[src] + a.off_comb + (size_t)(t * K + pair % K) * a.yrow;
        block_copy(dst, a.y + (size_t)e * a.yrow, a.yrow);
    }
    STAMP(a, 9);
    arrive(&a.ctl->arrive_c, 0, a.variant, [&](bool) {
        for (int r = 0; r < a.R; r++)
            st_release((uint64_t *)(a.peers[r] + a.off_cflag) + a.me, epxi_ll_flag(epoch, 0),
                       a.variant);
    });
    STAMP(a, 10);
    /* Every block waits for every peer, then reduces its share: items of
     * (token, chunk of V * blockDim elements). The routing of a block's
     * first token is this rank's own (written by its dispatch), so it is
     * staged before the wait and only the rows are read after it. */
    const unsigned char *comb = a.base + a.off_comb;
    const int V = a.ybf16 ? Lanes<1>::V : Lanes<0>::V;
    const int64_t per = (int64_t)V * blockDim.x, chunks = (a.H + per - 1) / per;
    __shared__ const unsigned char *rows[kMaxK];
    __shared__ float wk[kMaxK];
    auto stage = [&](int64_t t) {
        for (int k = threadIdx.x; k < K; k += blockDim.x) {
            rows[k] =
                a.slots[t * K + k] >= 0 && !refused ? comb + (size_t)(t * K + k) * a.yrow : nullptr;
            wk[k] = a.weights[t * K + k];
        }
    };
    const int64_t first_t = blockIdx.x < T * chunks ? (int64_t)blockIdx.x / chunks : -1;
    if (first_t >= 0) stage(first_t); /* wait_flags synchronises the block */
    if (!wait_flags(a, (const uint64_t *)(a.base + a.off_cflag), sizeof(uint64_t), a.R, epoch,
                    PH_COMBINE))
        return;
    STAMP(a, 11);
    for (int64_t item = blockIdx.x; item < T * chunks; item += gridDim.x) {
        const int64_t t = item / chunks, h0 = (item % chunks) * per + (int64_t)threadIdx.x * V;
        if (item != blockIdx.x) stage(t);
        __syncthreads();
        if (h0 < a.H) {
            if (a.ybf16)
                reduce_lanes<1>(a, rows, wk, h0, out + t * a.H);
            else
                reduce_lanes<0>(a, rows, wk, h0, out + t * a.H);
        }
        __syncthreads();
    }
    STAMP(a, 12);
}

} // namespace

/* What ranks tell each other at creation. */
struct PeerInfo {
    int32_t pid, device;
    uint64_t ptr;
    cudaIpcMemHandle_t handle;
};

struct epx_gpu_ep {
    epx_comm *boot;
    epxi_ep_geom g;
    cudaStream_t stream;
    int32_t timeout_ms;
    int32_t max_blocks;  /* launches whose blocks do not wait for each other */
    int32_t wait_blocks; /* combine: every block waits, so all must be resident */
    size_t off_y, off_tok, off_w, off_pair, off_so, off_weights, off_slots, off_ctl, off_peers,
        total;
    size_t hist_bytes;
    unsigned char *buf;
    unsigned char **mapped; /* host [R]: peers' buffers as mapped here (own included) */
    bool *opened;           /* host [R]: mapped by cudaIpcOpenMemHandle */
    uint32_t *host_fault, *host_fault_dev;
    Args a;
    int64_t T;
    bool dispatched, reported;
};

/* The buffer layout, shared by the size query and creation. */
static epx_status plan(epx_gpu_ep *ep, const epx_ep_config *cfg, int32_t R, epx_error *err) {
    if (cfg != NULL && cfg->version == EPX_EP_CONFIG_VERSION &&
        cfg->mode != EPX_EP_MODE_LOW_LATENCY)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "the GPU low-latency engine needs mode = EPX_EP_MODE_LOW_LATENCY in "
                         "its config (normal mode on the GPU is epx_nccl_ep_create)");
    EPX_TRY(epxi_ep_geom_init(cfg, R, &ep->g, err));
    const epxi_ep_geom *g = &ep->g;
    const double M = (double)g->M, K = g->K;
    size_t off_recv = 0, off_comb = 0, off_cflag = 0;
    epxi_ws_part parts[] = {
        {&off_recv, R * (M + 1), (double)g->rec},
        {&off_comb, M * K, (double)g->yrow},
        {&off_cflag, (double)R, sizeof(uint64_t)},
        {&ep->off_y, (double)g->cap_ent, (double)g->yrow},
        {&ep->off_tok, (double)g->cap_ent, sizeof(int32_t)},
        {&ep->off_w, (double)g->cap_ent, sizeof(float)},
        {&ep->off_pair, (double)g->cap_ent, sizeof(int32_t)},
        {&ep->off_so, (double)g->spr + 1, sizeof(int64_t)},
        {&ep->off_weights, M * K, sizeof(float)},
        {&ep->off_slots, M * K, sizeof(int32_t)},
        {&ep->off_ctl, 1, sizeof(Ctl)},
        {&ep->off_peers, (double)R, sizeof(void *)},
    };
    EPX_TRY(epxi_ws_carve(parts, sizeof parts / sizeof parts[0], 256, &ep->total,
                          "GPU low-latency EP", err));
    if (R > kMaxRanks - 1)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "the GPU low-latency engine serves at most %d ranks, not %d",
                         kMaxRanks - 1, R);
    Args &a = ep->a;
    a.R = R;
    a.K = g->K;
    a.H = g->H;
    a.spr = g->spr;
    a.P = g->P;
    a.M = g->M;
    a.rec = g->rec;
    a.xrow = g->xrow;
    a.yrow = g->yrow;
    a.meta_off = g->meta_off;
    a.tag_off = g->tag_off;
    a.off_recv = off_recv;
    a.off_comb = off_comb;
    a.off_cflag = off_cflag;
    a.xbf16 = g->cfg.x_dtype == EPX_DTYPE_BF16;
    a.ybf16 = g->cfg.y_dtype == EPX_DTYPE_BF16;
    int nw = kHistInts / (g->spr + 1) - 1;
    nw = nw < 1 ? 1 : (nw > kThreads / 32 ? kThreads / 32 : nw);
    /* per-warp histograms, then the slot totals */
    ep->hist_bytes = (size_t)(nw + 1) * (size_t)(g->spr + 1) * sizeof(int32_t);
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_buffer_bytes(const epx_ep_config *cfg, int32_t num_ranks,
                                              size_t *bytes, epx_error *err) {
    if (bytes == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "bytes must not be NULL");
    epx_gpu_ep tmp{};
    EPX_TRY(plan(&tmp, cfg, num_ranks, err));
    *bytes = tmp.total;
    return EPX_OK;
}

/* Every rank's PeerInfo, over the bootstrap communicator (host or device
 * memory). */
static epx_status allgather_info(epx_comm *comm, cudaStream_t stream, const PeerInfo *mine,
                                 PeerInfo *all, epx_error *err) {
    const int32_t R = epx_comm_size(comm);
    const size_t n = sizeof(PeerInfo);
    int64_t *cnt = (int64_t *)epxi_calloc((size_t)2 * R, sizeof(int64_t), "EP bootstrap", err);
    PeerInfo *send = (PeerInfo *)epxi_calloc((size_t)R, n, "EP bootstrap", err);
    epx_status st = cnt && send ? EPX_OK : EPX_ERR_NOMEM;
    void *dsend = NULL, *drecv = NULL;
    for (int32_t r = 0; st == EPX_OK && r < R; r++) {
        cnt[r] = 1;
        cnt[R + r] = r;
        send[r] = *mine;
    }
    if (st == EPX_OK && epx_comm_memory_kind(comm) == EPX_COMM_MEMORY_DEVICE) {
        EPXI_CUDA_GOTO(st, cudaMalloc(&dsend, (size_t)R * n), "EP bootstrap buffer", done);
        EPXI_CUDA_GOTO(st, cudaMalloc(&drecv, (size_t)R * n), "EP bootstrap buffer", done);
        EPXI_CUDA_GOTO(st, cudaMemcpy(dsend, send, (size_t)R * n, cudaMemcpyHostToDevice),
                       "EP bootstrap copy", done);
        EPX_TRY_GOTO(st, epx_comm_alltoallv(comm, dsend, cnt, cnt + R, drecv, cnt, cnt + R, n, err),
                     done);
        EPX_TRY_GOTO(st, epx_comm_wait(comm, err), done);
        EPXI_CUDA_GOTO(st, cudaMemcpy(all, drecv, (size_t)R * n, cudaMemcpyDeviceToHost),
                       "EP bootstrap copy", done);
    } else if (st == EPX_OK) {
        st = epx_comm_alltoallv(comm, send, cnt, cnt + R, all, cnt, cnt + R, n, err);
    }
done:
    (void)stream;
    cudaFree(dsend);
    cudaFree(drecv);
    free(cnt);
    free(send);
    return st;
}

extern "C" void epx_gpu_ep_destroy(epx_gpu_ep *ep) {
    if (ep == NULL) return;
    cudaStreamSynchronize(ep->stream);
    epx_error err = {};
    /* No peer may write into, or still map, a buffer that is freed. */
    bool healthy = ep->boot != NULL && epx_comm_health(ep->boot, NULL) == EPX_OK;
    if (healthy) healthy = epx_comm_barrier(ep->boot, &err) == EPX_OK;
    for (int32_t r = 0; ep->mapped && r < ep->a.R; r++)
        if (ep->opened[r]) cudaIpcCloseMemHandle(ep->mapped[r]);
    if (healthy) epx_comm_barrier(ep->boot, &err);
    cudaFree(ep->buf);
    if (ep->host_fault) cudaFreeHost(ep->host_fault);
    free(ep->mapped);
    free(ep->opened);
    free(ep);
}

extern "C" epx_status epx_gpu_ep_create(epx_comm *bootstrap, const epx_ep_config *cfg,
                                        cudaStream_t stream, const epx_gpu_ep_opts *opts,
                                        epx_gpu_ep **out, epx_error *err) {
    if (bootstrap == NULL || out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_gpu_ep_create needs a bootstrap communicator and an out pointer");
    epx_gpu_ep_opts o = EPX_GPU_EP_OPTS_INIT;
    if (opts != NULL) {
        if (opts->version != EPX_GPU_EP_OPTS_VERSION)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "GPU EP opts version %u is not %u: initialise them from "
                             "EPX_GPU_EP_OPTS_INIT",
                             opts->version, EPX_GPU_EP_OPTS_VERSION);
        o = *opts;
    }
    if (o.timeout_ms < 1 || o.max_blocks < 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP timeout_ms (%d) must be >= 1 and max_blocks (%d) >= 0 (0 = one "
                         "per SM)",
                         o.timeout_ms, o.max_blocks);
    epx_gpu_ep *ep = (epx_gpu_ep *)epxi_calloc(1, sizeof *ep, "GPU EP handle", err);
    if (ep == NULL) return EPX_ERR_NOMEM;
    ep->boot = bootstrap;
    ep->stream = stream;
    ep->timeout_ms = o.timeout_ms;
    epx_status st = plan(ep, cfg, epx_comm_size(bootstrap), err);
    const int32_t R = ep->a.R;
    int dev = 0, sms = 0;
    PeerInfo mine, *all = NULL;
    memset(&mine, 0, sizeof mine);
    if (st != EPX_OK) goto fail;
    ep->a.me = epx_comm_rank(bootstrap);
    EPXI_CUDA_GOTO(st, cudaGetDevice(&dev), "GPU EP: current device", fail);
    EPXI_CUDA_GOTO(st, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
                   "GPU EP: SM count", fail);
    {
        /* Blocks that wait for flags must all be resident at once, or the
         * ones still queued could never publish theirs. */
        int per_sm = 0;
        EPXI_CUDA_GOTO(
            st, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_combine, kThreads, 0),
            "GPU EP: occupancy", fail);
        /* at most 65535: blocks count in on 16 bits (arrive) */
        int cap = o.max_blocks > 0 ? o.max_blocks : 4 * sms;
        if (cap > 0xffff) cap = 0xffff;
        ep->max_blocks = cap;
        ep->wait_blocks = per_sm * sms < cap ? per_sm * sms : cap;
        if (ep->wait_blocks < 1) ep->wait_blocks = 1;
    }
    EPXI_CUDA_GOTO(st, cudaMalloc((void **)&ep->buf, ep->total), "GPU EP buffer", fail);
    /* Tags and flags start at epoch 0, which no batch uses. */
    EPXI_CUDA_GOTO(st, cudaMemset(ep->buf, 0, ep->total), "GPU EP buffer", fail);
    EPXI_CUDA_GOTO(
        st, cudaHostAlloc((void **)&ep->host_fault, 8 * sizeof(uint32_t), cudaHostAllocMapped),
        "GPU EP fault word", fail);
    memset(ep->host_fault, 0, 8 * sizeof(uint32_t));
    EPXI_CUDA_GOTO(st, cudaHostGetDevicePointer((void **)&ep->host_fault_dev, ep->host_fault, 0),
                   "GPU EP fault word", fail);
    mine.pid = (int32_t)getpid();
    mine.device = dev;
    mine.ptr = (uint64_t)(uintptr_t)ep->buf;
    EPXI_CUDA_GOTO(st, cudaIpcGetMemHandle(&mine.handle, ep->buf), "GPU EP: IPC handle", fail);
    all = (PeerInfo *)epxi_calloc((size_t)R, sizeof *all, "GPU EP peers", err);
    ep->mapped = (unsigned char **)epxi_calloc((size_t)R, sizeof(void *), "GPU EP peers", err);
    ep->opened = (bool *)epxi_calloc((size_t)R, sizeof(bool), "GPU EP peers", err);
    if (all == NULL || ep->mapped == NULL || ep->opened == NULL) {
        st = EPX_ERR_NOMEM;
        goto fail;
    }
    EPX_TRY_GOTO(st, allgather_info(bootstrap, stream, &mine, all, err), fail);
    for (int32_t r = 0; r < R; r++) {
        if (all[r].pid == mine.pid) {
            ep->mapped[r] = (unsigned char *)(uintptr_t)all[r].ptr;
            if (all[r].device != dev) {
                cudaError_t pe = cudaDeviceEnablePeerAccess(all[r].device, 0);
                if (pe != cudaSuccess && pe != cudaErrorPeerAccessAlreadyEnabled) {
                    st = epxi_cuda_fail(pe, "GPU EP: peer access to a GPU of this process", err);
                    goto fail;
                }
                (void)cudaGetLastError();
            }
            continue;
        }
        void *p = NULL;
        cudaError_t ie = cudaIpcOpenMemHandle(&p, all[r].handle, cudaIpcMemLazyEnablePeerAccess);
        if (ie != cudaSuccess) {
            st = epxi_fail(err, EPX_ERR_CUDA,
                           "GPU EP: cannot map rank %d's buffer (process %d, GPU %d) here: %s. "
                           "The low-latency engine needs GPUs that reach each other by "
                           "load/store (NVLink, or PCIe with P2P); use normal mode otherwise",
                           r, all[r].pid, all[r].device, cudaGetErrorString(ie));
            goto fail;
        }
        ep->mapped[r] = (unsigned char *)p;
        ep->opened[r] = true;
    }
    EPXI_CUDA_GOTO(st,
                   cudaMemcpy(ep->buf + ep->off_peers, ep->mapped, (size_t)R * sizeof(void *),
                              cudaMemcpyHostToDevice),
                   "GPU EP peer table", fail);
    {
        Args &a = ep->a;
        a.base = ep->buf;
        a.peers = (unsigned char *const *)(ep->buf + ep->off_peers);
        a.y = ep->buf + ep->off_y;
        a.entry_token = (int32_t *)(ep->buf + ep->off_tok);
        a.entry_weight = (float *)(ep->buf + ep->off_w);
        a.entry_pair = (int32_t *)(ep->buf + ep->off_pair);
        a.so = (int64_t *)(ep->buf + ep->off_so);
        a.weights = (float *)(ep->buf + ep->off_weights);
        a.slots = (int32_t *)(ep->buf + ep->off_slots);
        a.ctl = (Ctl *)(ep->buf + ep->off_ctl);
        a.host_fault = ep->host_fault_dev;
        a.timeout_ns = (unsigned long long)ep->timeout_ms * 1000000ull;
    }
    if (ep->hist_bytes > 48 * 1024)
        EPXI_CUDA_GOTO(st,
                       cudaFuncSetAttribute(k_dispatch, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)ep->hist_bytes),
                       "GPU EP shared memory", fail);
    /* Every peer has mapped every buffer before anyone launches. */
    EPX_TRY_GOTO(st, epx_comm_barrier(bootstrap, err), fail);
    free(all);
    *out = ep;
    return EPX_OK;
fail:
    free(all);
    ep->boot = NULL; /* no collective teardown after a failed collective setup */
    epx_gpu_ep_destroy(ep);
    return st;
}

/* The first fault the kernels recorded, as a status and message; poisons
 * the bootstrap communicator for communication faults. A refused batch is
 * reported (and forgotten) only where asked: dispatch and combine must
 * launch whenever the peers do, or they would wait for us in vain. */
static epx_status fault_status(epx_gpu_ep *ep, bool report_refused, epx_error *err) {
    volatile uint32_t *f = ep->host_fault;
    if (report_refused && f[0] == F_NONE && f[4] == F_BAD_SLOT) {
        f[4] = F_NONE;
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP dispatch of batch %u: rank %u passed a slot outside [-1, %d); "
                         "every rank refused that batch (no expert ran, combine wrote zeros)",
                         f[7], f[6], ep->a.P);
    }
    uint32_t code = f[0];
    if (code == F_NONE) return EPX_OK;
    const char *phase = f[1] == PH_DISPATCH ? "dispatch" : "combine";
    epx_status st = epxi_fail(err, EPX_ERR_TIMEOUT,
                              "GPU EP %s of batch %u: rank %u's flag did not arrive within %d "
                              "ms (a peer died, stopped, or made different calls); the kernels "
                              "gave up and the handle refuses later batches",
                              phase, f[3], f[2], ep->timeout_ms);
    if (!ep->reported) {
        epxi_comm_poison(ep->boot, EPX_ERR_TIMEOUT, err ? err->msg : "GPU EP timeout");
        ep->reported = true;
    }
    return st;
}

extern "C" epx_status epx_gpu_ep_health(epx_gpu_ep *ep, epx_error *err) {
    if (ep == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP health needs a handle");
    return fault_status(ep, true, err);
}

static unsigned blocks_for(int64_t items, int32_t cap) {
    int64_t b = items < 1 ? 1 : items;
    return (unsigned)(b < cap ? b : cap);
}

extern "C" epx_status epx_gpu_ep_dispatch(epx_gpu_ep *ep, int64_t T, const void *x,
                                          const int32_t *topk_slots, const float *topk_weights,
                                          epx_ep_recv *recv, epx_error *err) {
    if (ep == NULL || recv == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP dispatch needs a handle and a recv view");
    EPX_TRY(fault_status(ep, false, err));
    const epxi_ep_geom *g = &ep->g;
    if (T < 0 || T > g->M)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP dispatch of %lld tokens is outside [0, max_tokens %lld]: the "
                         "low-latency buffers hold max_tokens per rank; raise it when creating "
                         "the handle",
                         (long long)T, (long long)g->M);
    if (T > 0 && (x == NULL || topk_slots == NULL || topk_weights == NULL))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP dispatch of %lld tokens needs x, topk_slots and topk_weights",
                         (long long)T);
    if (ep->dispatched)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP dispatch before the last batch was combined: peers may still "
                         "read their rows of it; call epx_gpu_ep_combine first");
    k_dispatch<<<blocks_for(T * (g->K < g->R ? g->K : g->R), ep->max_blocks), kThreads,
                 ep->hist_bytes, ep->stream>>>(ep->a, T, (const unsigned char *)x, topk_slots,
                                               topk_weights);
    EPXI_CUDA_TRY(cudaGetLastError(), "GPU EP dispatch kernel");
    ep->T = T;
    ep->dispatched = true;
    recv->num_tokens = (int64_t)g->R * (g->M + 1);
    recv->x = ep->buf + ep->a.off_recv;
    recv->x_stride = g->rec;
    recv->num_entries = -1;
    recv->first_slot = ep->a.me * g->spr;
    recv->num_local_slots = g->spr;
    recv->slot_offsets = ep->a.so;
    recv->entry_token = ep->a.entry_token;
    recv->entry_weight = ep->a.entry_weight;
    recv->y = ep->a.y;
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_identity_experts(epx_gpu_ep *ep, epx_error *err) {
    if (ep == NULL || !ep->dispatched)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP identity experts need a dispatch first");
    k_identity<<<(unsigned)ep->max_blocks, kThreads, 0, ep->stream>>>(ep->a);
    EPXI_CUDA_TRY(cudaGetLastError(), "GPU EP identity kernel");
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_combine(epx_gpu_ep *ep, float *out, epx_error *err) {
    if (ep == NULL || !ep->dispatched)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP combine without a dispatch before it");
    EPX_TRY(fault_status(ep, false, err));
    if (ep->T > 0 && out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP combine of %lld tokens needs out",
                         (long long)ep->T);
    const epxi_ep_geom *g = &ep->g;
    /* Enough blocks for the entries this rank may hold, and for its tokens'
     * chunks of the reduction. */
    const int64_t per = (int64_t)(g->cfg.y_dtype == EPX_DTYPE_BF16 ? 8 : 4) * kThreads;
    const int64_t items = ep->T * ((g->H + per - 1) / per), sends = (int64_t)g->R * ep->T * g->K;
    k_combine<<<blocks_for(items > sends ? items : sends, ep->wait_blocks), kThreads, 0,
                ep->stream>>>(ep->a, ep->T, out);
    EPXI_CUDA_TRY(cudaGetLastError(), "GPU EP combine kernel");
    ep->dispatched = false;
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_sync(epx_gpu_ep *ep, epx_error *err) {
    if (ep == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP sync needs a handle");
    /* The kernels give up after timeout_ms per wait; allow a margin. */
    EPX_TRY(epxi_cuda_stream_wait(ep->stream, 2 * (int64_t)ep->timeout_ms + 1000, "GPU EP", err));
    return fault_status(ep, true, err);
}

extern "C" int32_t epx_gpu_ep_launches(const epx_gpu_ep *ep, const char *phase) {
    (void)ep;
    return phase != NULL && (strcmp(phase, "dispatch") == 0 || strcmp(phase, "combine") == 0) ? 1
                                                                                              : 0;
}

/* Measuring: the stamps of the last dispatch and combine (variant 8), in
 * microseconds after each kernel's start: [0..6] dispatch (5, 6: the
 * grouping's count and scan), [8..14] combine (13, 14: block 0's first rows in,
 * its sum done). */
extern "C" EPXI_HIDDEN int epxi_gpu_ep_stamps(epx_gpu_ep *ep, double *us) {
    Ctl c;
    if (ep == NULL || cudaMemcpy(&c, ep->a.ctl, sizeof c, cudaMemcpyDeviceToHost) != cudaSuccess)
        return -1;
    for (int i = 0; i < 16; i++) {
        unsigned long long base = c.stamp[i < 8 ? 0 : 8];
        us[i] = c.stamp[i] >= base && base ? (double)(c.stamp[i] - base) * 1e-3 : -1.0;
    }
    return 0;
}

/* Measuring: kernel variants (ld_acquire's comment); 0 = the default. */
extern "C" EPXI_HIDDEN void epxi_gpu_ep_variant(epx_gpu_ep *ep, int bits) {
    if (ep != NULL) ep->a.variant = bits;
}

/* Testing: the next dispatches publish no flags (a peer that never writes). */
extern "C" EPXI_HIDDEN void epxi_gpu_ep_inject_silence(epx_gpu_ep *ep, int on) {
    if (ep != NULL) ep->a.skip_flags = on;
}
