/*
 * ll_device.cuh - the GPU engine's device pieces that both phases share
 * (part of ll_ep.cu's one translation unit, included there after its
 * headers; ll_ep.cu's head comment states the buffer layout and protocol):
 * the limits, the control block (Ctl), a sender's word per entry (Meta),
 * the dispatch's items for the combine (Work), everything a kernel needs
 * (Args); flags at GPU or system scope, faults, the row copies, shrink
 * mode's decisions, waiting for flags and counting in, where each area of a
 * buffer is, the epochs, a block-wide scan and a batch's ids.
 */
#pragma once

#include "global_timer.cuh"

namespace {

/* Threads a block: 512 for the dispatch (and the identity experts), 256 for
 * the combine, each with as many blocks an SM as keep 64 registers a thread.
 * At 256 the combine's tokens split into twice the chunks, on twice the
 * resident blocks: -15 % at 1 token, -20 % at 4,096 (H200); the dispatch
 * at 256 gained 0.3 us at 1 token but lost 20-30 % on normal mode's large
 * batches (bench/RESULTS.md). Build-time choices, for measuring
 * (-DEPX_LL_THREADS, -DEPX_LL_COMBINE_THREADS). */
#ifndef EPX_LL_THREADS
#define EPX_LL_THREADS 512
#endif
#ifndef EPX_LL_COMBINE_THREADS
#define EPX_LL_COMBINE_THREADS 256
#endif
#ifndef EPX_LL_SMALL_THREADS
#define EPX_LL_SMALL_THREADS 256
#endif
#ifndef EPX_LL_SMALL_COMBINE_THREADS
#define EPX_LL_SMALL_COMBINE_THREADS 128
#endif
constexpr int kDispatchThreads = EPX_LL_THREADS;
/* ... except the lean dispatch of a batch within the staged ids and not in
 * normal mode (low latency's usual case): its blocks copy one row each and
 * meet a barrier per step, cheaper in fewer warps (variant 512: 512 too) */
constexpr int kSmallDispatchThreads = EPX_LL_SMALL_THREADS;
constexpr int kCombineThreads = EPX_LL_COMBINE_THREADS;
/* ... and the combine of a batch whose chunks at kCombineThreads leave SMs
 * without a block (1 token: 4 chunks of a 7,168-wide row on 132 SMs): in
 * smaller blocks its rows are read by more SMs at once (-0.7 us at 1 token;
 * at 128 threads for every batch, +0.4 us at 128 tokens; variant 1024:
 * kCombineThreads always) */
constexpr int kSmallCombineThreads = EPX_LL_SMALL_COMBINE_THREADS;
constexpr int kMaxThreads = kDispatchThreads > kCombineThreads ? kDispatchThreads : kCombineThreads;
constexpr int blocks_per_sm(int threads) { return 1024 / threads; }
/* The dispatch instances' blocks an SM (__launch_bounds__'s second
 * argument, so 65,536 / (threads * blocks) registers a thread at most).
 * The host caps each instance's grid at what its occupancy allows
 * (open_engine), so fewer blocks an SM buy registers with the grid of a
 * large batch. At 1024 / threads (64 registers) the small lean instances
 * spilled 24 (bf16) and 40 (fp8) bytes a thread and the host-rows one 24,
 * on the chain one block runs at one token; bf16 at three blocks (78 of
 * 80 registers used), fp8 at two (90 of 128) and host rows at one (86 of
 * 128) spill nothing: the dispatch 5 % (bf16) and 12 % (fp8) faster at 128
 * tokens, the host transport's 3 % at 32 (bench/RESULTS.md, "The
 * dispatch's registers"; host rows not timed past 128 tokens). */
constexpr int kSmallBf16BlocksPerSm = 3, kSmallFp8BlocksPerSm = 2, kHostRowsBlocksPerSm = 1;
/* Whether a dispatch instance of `threads` is the small lean one (told
 * apart by its size alone, so not where both sizes are one). */
__host__ __device__ constexpr bool small_dispatch(int threads) {
    return threads == kSmallDispatchThreads && threads != kDispatchThreads;
}
/* (never more than 1024 / threads: other EPX_LL_*_THREADS builds keep at
 * least the 64 registers every instance had) */
constexpr int dispatch_blocks_per_sm(int threads, bool host_rows, bool fp8) {
    const int chosen = host_rows                  ? kHostRowsBlocksPerSm
                       : !small_dispatch(threads) ? blocks_per_sm(threads)
                       : fp8                      ? kSmallFp8BlocksPerSm
                                                  : kSmallBf16BlocksPerSm;
    return chosen < blocks_per_sm(threads) ? chosen : blocks_per_sm(threads);
}
static_assert(kDispatchThreads % 32 == 0 && kDispatchThreads >= 64 && kDispatchThreads <= 1024 &&
                  kCombineThreads % 32 == 0 && kCombineThreads >= 64 && kCombineThreads <= 1024 &&
                  kSmallDispatchThreads % 32 == 0 && kSmallDispatchThreads >= 64 &&
                  kSmallDispatchThreads <= kDispatchThreads && kSmallCombineThreads % 32 == 0 &&
                  kSmallCombineThreads >= 64 && kSmallCombineThreads <= kCombineThreads,
              "whole warps, two or more, at most 1024 threads");
constexpr int kMaxK = EPX_MOE_MAX_TOP_K;
/* Shared-memory ints of one pass of the per-slot counts a sender writes. */
constexpr int kCountInts = 4096;
/* A batch's ids are staged in shared memory up to this many (T * K). */
constexpr int kSmemIds = 4096;
/* Most ranks (per-source counts live in shared memory) and local slots
 * (the combine's scan of the counts lives there too). */
constexpr int kMaxRanks = 1024;
constexpr int kMaxLocal = EPXI_LL_MAX_LOCAL_SLOTS;
/* Most blocks one received row is read by (place_row_slices): 14 KB rows
 * in slices of ~1.8 KB, each one trip across the link. */
constexpr int32_t kMaxSlices = 8;
static_assert(kMaxK <= kSmallDispatchThreads && kMaxK <= kSmallCombineThreads,
              "a block's threads hold one token's K choices");
/* A staged block's flag, padded so what follows stays 16-byte aligned. */
constexpr size_t kFlagBytes = 16;

/* Fault codes: fault[0] (sticky: the kernels stop) and fault[4] (a refused
 * batch, reported once). */
enum : uint32_t { F_NONE = 0, F_TIMEOUT = 1, F_BAD_SLOT = 2, F_DUP_SLOT = 3 };
/* A flag's count for a batch refused because a token names one slot twice:
 * the expert-major receive holds one row per (token, slot), DeepEP's rule. */
constexpr uint32_t kLLDup = EPXI_LL_BAD - 1;
/* Phases in Ctl::fault[1]. */
enum : uint32_t { PH_DISPATCH = 1, PH_COMBINE = 2 };

struct Ctl {
    /* The epoch of the last dispatch (high half, advanced at its end) and
     * how many blocks of the running dispatch read it (low half): one
     * atomic per block reads the one and counts the other. */
    unsigned long long de_started;
    unsigned long long ce_started; /* the same for combines (one dispatch may have several) */
    uint32_t arrive_d;             /* blocks of the running dispatch that finished sending */
    uint32_t arrive_m;             /* ... normal mode's meta blocks that sent their metas */
    uint32_t arrive_c;             /* same for combine */
    uint32_t refused;              /* the last dispatch was refused: combine writes zeros */
    int32_t ditems;                /* its receive's items (rows * K): Args::work's length */
    uint32_t dup;                  /* a block of the running dispatch saw a slot twice in a token */
    uint32_t bad;                  /* ... or a slot outside [-1, P) (both read only when marked) */
    uint32_t fault[4];             /* code, phase, peer, epoch */
    /* variant 8: block 0's clock at each step: 0-7 dispatch, 8-15 combine,
     * 16-23 and 24-31 finer steps of each, 32-47 each warp's end of the
     * combine's reduction */
    unsigned long long stamp[48];
    /* Host-memory inbox: the flags as block 0 saw them, [dispatch,
     * combine][source], for the other blocks to poll here (wait_flags) */
    uint64_t relay[2][kMaxRanks];
};

/* What a sender says about one (token, k) on the receiving rank: 16 bytes.
 * A sender writes only the rows of tokens that reach
 * the receiver, so the others hold an older batch's: the tag tells them
 * apart (the receiver reads every row t < T of each source). */
struct Meta {
    int32_t slot; /* local slot on the receiver, or -1 */
    float weight;
    int32_t pos;  /* rank among the sender's entries of that slot, (token, k) order */
    uint32_t tag; /* the epoch of the batch that wrote it */
};

/* What the dispatch's receive did with item (row, k) of the running batch,
 * for the combine: the entry row (-1: none here) and its (source, token, k)
 * pair. The combine's blocks read their items from this list instead of
 * scanning the per-slot counts and searching them (a scan, a binary search
 * and a dependent load of pair[e] before the first row could move). */
struct Work {
    int64_t e;
    int32_t pair;
    int32_t pad;
};

/* Offsets of one rank's buffer and everything the kernels need. */
struct Args {
    int32_t R, me, K, H, spr, P;
    /* spr, K and a token's most destinations min(K, R) as divisors
     * (numeric.h's epxi_div): the routing's divisions without the ~20
     * dependent instructions of a division by an unknown value */
    epxi_divisor_t spr_div, K_div, dmax_div;
    epxi_divisor_t MK_div;                    /* M * K: a combine's Work pair -> (source, row) */
    epxi_divisor_t slice_div[kMaxSlices + 1]; /* [1 .. kMaxSlices]: place_row_slices */
    /* A combine's chunks of a token's row (one per block's V * blockDim
     * values), set by the host before each combine launch */
    int32_t chunks;
    epxi_divisor_t chunks_div;
    int64_t M, RM; /* max_tokens; R * M, the rows of one local slot */
    size_t rec, xrow, yrow, meta_off;
    size_t off_rows, off_cnt, off_dflag, off_comb, off_cflag;
    size_t off_mflag; /* normal mode: the metas' and counts' flags, before the rows' (dflag) */
    /* Staging: one block per peer and phase, so the transport moves one piece
     * per peer (plan, set_bound): dispatch [flag | counts | rows] of dblk bytes
     * from off_dflag, the rows at drows; combine [flag | rows] of cblk bytes
     * from off_cflag, the rows at kFlagBytes. */
    size_t dblk, drows, cblk;
    unsigned char *base;         /* this rank's buffer */
    unsigned char *const *peers; /* [R] device: every rank's buffer, mapped here */
    unsigned char *rx, *y;       /* [spr][RM] rows */
    int32_t *count, *pair, *srctok;
    Work *work; /* [R * M * K]: the dispatch's items (Work) */
    /* [M][K]: the entry row of this rank's own (t, k) where its slot is
     * here: a combine sent and received in one launch reads those rows from
     * y where they are, and copies only the other ranks' */
    int64_t *self_e;
    int64_t *range;
    float *ew;
    float *weights; /* [M][K] this rank's batch: weights given to dispatch */
    int32_t *slots; /* [M][K] and slots */
    Ctl *ctl;
    uint32_t *host_fault; /* host-mapped [8]: ctl->fault, then a refused batch */
    unsigned long long timeout_ns;
    int xbf16, ybf16;
    int skip_flags; /* fault injection: dispatch publishes no flags */
    int variant;    /* measurement variants (their bits: the list above STAMP) */
    int one_gpu;    /* every rank on this GPU: flags at GPU scope (scope()) */
    /* A staging transport (NCCL): every peer pointer is this rank's outbox,
     * sends are filed by destination there and the transport moves each
     * phase's blocks between the kernels; one buffer, no parity (nothing
     * writes into the inbox but this rank's own stream). */
    int staging;
    /* This rank's inbox is host memory (the host transport): every load from
     * it crosses the link, so each received row is read once and stored to
     * all its K places (place_row_slices, or the general instance's
     * place_rows), not once per (row, k). */
    int host_inbox;
    /* Shrink mode (DeepEP's): a peer whose flag does not come within the
     * timeout is masked, not a fault; masked ranks are neither sent to nor
     * waited for, and their rows count as absent. mask [R]: nonzero =
     * masked (the caller's, shareable between handles, or the handle's
     * own); decided [2][R]: per source, (epoch << 1 | masked) of the last
     * launch that decided it, dispatch then combine (decide_live). */
    int shrink;
    int32_t *mask;
    unsigned long long *decided;
    /* Normal mode (a compact receive, EPX_EP_MODE_NORMAL): rows stay in the
     * inbox and entry e, the e-th of this rank's entries in (local slot,
     * source, token, k) order, is its row's index there (etok [NE], rows of
     * rec bytes from off_rows, both parities: (parity * R + source) * M +
     * token); y, ew, pair and srctok hold NE entry rows, and offs [spr + 1]
     * the slots' first entries (offs[spr]: the total). Expert-major
     * otherwise: entry rows are l * RM + position, NE = spr * RM. */
    int compact;
    int64_t NE;
    int32_t *etok;
    int64_t *offs;
};

/* Variant bits (bench and tests only, epxi_gpu_ep_variant): 1 = blocks
 * count in at GPU scope (arrive); 2 = flags at GPU scope (one GPU
 * only; both are the default when every rank is on this GPU, scope());
 * 4 = poll without sleeping; 8 = block 0 stamps the global timer at each
 * step (Ctl::stamp, read with epxi_gpu_ep_stamps); 16 = system scope even
 * on one GPU; 32 = a host inbox received by the lean dispatch (each row read
 * once per entry, not once: place_rows); 64 = a large batch's lean send
 * counts the tokens before a block's run after its rows, not beside them
 * (send_run_warps); 128 = normal mode's receive spreads its items over
 * the grid a thread each, not a run per block (receive_compact); 256 =
 * (`epx bench comm` only) a dispatch launched as its send and its
 * receive; 512 = the lean small dispatch in blocks of kDispatchThreads,
 * not kSmallDispatchThreads; 1024 = every combine in blocks of
 * kCombineThreads, a small batch's too (not kSmallCombineThreads); 2048 =
 * the slot ranges stored between their loads (slot_ranges);
 * 4096 = an fp8 dispatch through the general instance, not the lean
 * one's fp8 form (dispatch_kernel's kFp8);
 * 8192 = normal mode's receive asks for its first meta after the slots'
 * scan, not before their counts (receive_compact); 16384 = a host inbox's
 * received rows read whole by one block each, not in slices by several
 * (place_row_slices); 32768 = normal mode's large batch gives a quarter
 * of its grid the metas, not five eighths, and 65536 half (meta_share). */
#define STAMP(a, i)                                                                                \
    do {                                                                                           \
        if (((a).variant & 8) && blockIdx.x == 0 && threadIdx.x == 0)                              \
            (a).ctl->stamp[i] = global_ns();                                                       \
    } while (0)
/* The SM's cycle counter beside them (stamps 6 and 7: the clock rate). */
#define STAMP_CLOCK(a, i)                                                                          \
    do {                                                                                           \
        if (((a).variant & 8) && blockIdx.x == 0 && threadIdx.x == 0)                              \
            (a).ctl->stamp[i] = (unsigned long long)clock64();                                     \
    } while (0)

/* The variant bits the flags use: GPU scope (1 | 2) when every rank runs on
 * this GPU, where the system scope orders nothing more (variant 16 forces
 * the system scope, for measuring); system scope otherwise (NVLink, PCIe,
 * host memory). */
__device__ __forceinline__ int scope(const Args &a) {
    return a.variant | (a.one_gpu && !(a.variant & 16) ? 3 : 0);
}

__device__ __forceinline__ uint64_t ld_acquire(const uint64_t *p, int var) {
    uint64_t v;
    if (var & 2)
        asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    else
        asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void fence_acq_rel(int var) {
    if (var & 2)
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
    else
        asm volatile("fence.acq_rel.sys;" ::: "memory");
}

__device__ __forceinline__ void st_release(uint64_t *p, uint64_t v, int var) {
    if (var & 2)
        asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
    else
        asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* A strong relaxed store: after fence_acq_rel at the same scope, a release
 * (the PTX model's release pattern), so one fence serves several flags. */
__device__ __forceinline__ void st_relaxed(uint64_t *p, uint64_t v, int var) {
    if (var & 2)
        asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
    else
        asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* One fence at the flags' scope, then store(r, scope) for every live rank
 * r, by one thread: relaxed stores after the fence are releases (the PTX
 * model's release pattern). Release stores one after another would each
 * wait for the one before to be acknowledged, at system scope a trip
 * across the link per peer (one GPU cannot show it: R = 1 there, or every
 * flag at GPU scope). */
template <typename Store>
__device__ void release_each(const Args &a, const uint8_t *live, Store store) {
    const int var = scope(a);
    fence_acq_rel(var);
    for (int r = 0; r < a.R; r++)
        if (live[r]) store(r, var);
}
/* ... flag value v to at(r) */
template <typename At>
__device__ void release_flags(const Args &a, const uint8_t *live, uint64_t v, At at) {
    release_each(a, live, [&](int r, int var) { st_relaxed(at(r), v, var); });
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

/* A refused batch (a bad or repeated slot on rank `peer`): reported once
 * by the host, not sticky. */
__device__ void raise_refused(const Args &a, uint32_t code, uint32_t peer, uint32_t epoch) {
    a.host_fault[5] = PH_DISPATCH;
    a.host_fault[6] = peer;
    a.host_fault[7] = epoch;
    __threadfence_system();
    *(volatile uint32_t *)&a.host_fault[4] = code;
}

/* Copy `bytes` from src to dst with the block's threads, in the widest
 * words that the addresses and the length allow (rows of an odd number of
 * bf16 values are only 2-byte aligned). */
template <typename W>
__device__ __forceinline__ void copy_words(unsigned char *__restrict__ dst,
                                           const unsigned char *__restrict__ src, size_t bytes,
                                           size_t first, size_t step) {
    const W *__restrict__ s = (const W *)src;
    W *__restrict__ d = (W *)dst;
    const size_t n = bytes / sizeof(W);
    size_t i = first;
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
/* The same by the block's threads. */
template <typename W>
__device__ __forceinline__ void copy_words(unsigned char *__restrict__ dst,
                                           const unsigned char *__restrict__ src, size_t bytes) {
    copy_words<W>(dst, src, bytes, threadIdx.x, blockDim.x);
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

/* A row of `bytes` (16-byte aligned, at most kPre * 16 * blockDim) held in
 * the block's registers: loaded once, stored to one or several places. */
template <int N>
__device__ __forceinline__ void regs_load(int4 (&v)[N], const unsigned char *src, size_t bytes) {
#pragma unroll
    for (int i = 0; i < N; i++) {
        const size_t w = threadIdx.x + (size_t)i * blockDim.x;
        if (w < bytes / 16) v[i] = ((const int4 *)src)[w];
    }
}
template <int N>
__device__ __forceinline__ void regs_store(unsigned char *dst, const int4 (&v)[N], size_t bytes) {
#pragma unroll
    for (int i = 0; i < N; i++) {
        const size_t w = threadIdx.x + (size_t)i * blockDim.x;
        if (w < bytes / 16) ((int4 *)dst)[w] = v[i];
    }
}

/* Shrink mode: source r's fate in one launch, the same in every block.
 * The first block to decide (it saw r's flag, or gave up on r, or found r
 * masked) records (epoch, outcome) with a CAS; every later block takes the
 * recorded outcome, so no two blocks place rows by different counts. */
__device__ bool decide_live(unsigned long long *w, uint32_t epoch, bool live) {
    const unsigned long long mine = ((unsigned long long)epoch << 1) | (live ? 0ull : 1ull);
    unsigned long long cur = *(volatile unsigned long long *)w;
    while ((uint32_t)(cur >> 1) != epoch) {
        const unsigned long long prev = atomicCAS(w, cur, mine);
        if (prev == cur) return live;
        cur = prev;
    }
    return (cur & 1ull) == 0;
}

/* Whether rank r is masked now (shrink mode; never otherwise). */
__device__ __forceinline__ bool masked(const Args &a, int r) {
    return a.shrink && *(const volatile int32_t *)&a.mask[r] != 0;
}

/* The ranks this launch sends to: live[r] = 0 for a masked rank (shrink
 * mode), by the whole block; synchronises it. */
__device__ void live_ranks(const Args &a, uint8_t *live) {
    for (int r = threadIdx.x; r < a.R; r += blockDim.x) live[r] = !masked(a, r);
    __syncthreads();
}

/* Spin (threads < n) until flag i reads `epoch` in its high half; false on
 * timeout or an earlier fault. Returns with the block synchronised.
 * Shrink mode (`decided`: the phase's [R] decisions): a source that is
 * masked, or whose flag does not come in time, is masked and given up on,
 * with live[i] = 0 and low[i] = 0 (no rows); live[i] = 1 otherwise.
 * relay [n] (device memory; nullptr: every block polls the flags): block 0
 * alone polls the flags and stores each value it saw there, the other
 * blocks poll relay. For flags in host memory: every poll there is a read
 * across the host link, and with every block of a launch polling, the
 * launch took ~3.7 us per polling block (stamps and ncu, H200, 1-32
 * tokens). Ordering: the writer's system-scope release, block 0's acquire,
 * its GPU-scope release of relay[i] and a block's acquire of it form one
 * causality chain, so that block sees the writer's rows. */
__device__ bool wait_flags(const Args &a, const uint64_t *flag0, size_t stride, int n,
                           uint32_t epoch, uint32_t phase, uint8_t *live,
                           unsigned long long *decided, uint64_t *relay, uint32_t *low = nullptr) {
    __shared__ int ok;
    if (threadIdx.x == 0) ok = 1;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const uint64_t *f = (const uint64_t *)((const unsigned char *)flag0 + (size_t)i * stride);
        const bool relayed = relay != nullptr && blockIdx.x != 0;
        const uint64_t *poll = relayed ? relay + i : f;
        const int var = relayed ? 3 : scope(a); /* the relay: GPU scope */
        unsigned long long t0 = global_ns();
        uint64_t v = 0;
        bool came = !masked(a, i);
        /* Each pass an acquire load of the flag, then the fault word and the
         * mask. (Polling with relaxed loads, the fault word every 8 passes and
         * one fence at the pass that saw the flag was slower on the H200:
         * +0.15 us a dispatch, +0.3-0.5 us a round trip, bench/RESULTS.md.) */
        while (came && (uint32_t)((v = ld_acquire(poll, var)) >> 32) != epoch) {
            if (ld_volatile(&a.ctl->fault[0]) != F_NONE) {
                ok = 0;
                break;
            }
            if (masked(a, i)) { /* another block gave up on it, or the host masked it */
                came = false;
                break;
            }
            if (global_ns() - t0 > a.timeout_ns) {
                if (a.shrink) {
                    came = false;
                    break;
                }
                raise_fault(a, F_TIMEOUT, phase, (uint32_t)i, epoch);
                ok = 0;
                break;
            }
            if (!(a.variant & 4)) __nanosleep(64);
        }
        if (relay != nullptr && blockIdx.x == 0 && came) st_release(relay + i, v, 3);
        if (a.shrink && ok) {
            const bool keep = decide_live(&decided[i], epoch, came);
            if (keep && !came) /* another block saw the flag: it is there to be read */
                while ((uint32_t)((v = ld_acquire(f, scope(a))) >> 32) != epoch &&
                       ld_volatile(&a.ctl->fault[0]) == F_NONE) {
                }
            if (!keep) {
                atomicExch(&a.mask[i], 1);
                v = 0;
            }
            live[i] = keep;
        } else {
            live[i] = 1;
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

/* Count this block in, one of n that do, with `mark` (nonzero in any
 * thread) carried along; the last block runs publish(marked: some block
 * was marked). Ordering
 * without a separate fence: the block's barrier, then thread 0's
 * acquire-release atomic, whose release covers the block's writes (through
 * the barrier) and whose acquire, in the last block, covers every earlier
 * block's; publish's flags are release stores, so a reader that acquires a
 * flag sees every block's writes. Blocks count in the low 16 bits of the
 * counter (grids stay below 2^16: max_blocks), marks above them. */
template <typename F>
__device__ void arrive(uint32_t *counter, uint32_t n, int mark, int var, F publish) {
    const int marked = __syncthreads_or(mark);
    if (threadIdx.x == 0) {
        const uint32_t add = 1u + (marked ? 0x10000u : 0u);
        if (n == 1) { /* alone: nobody to count */
            publish(marked != 0);
        } else {
            const uint32_t total = atom_add_acq_rel(counter, add, var) + add;
            if ((total & 0xffffu) == n) {
                *counter = 0;
                publish((total >> 16) != 0);
            }
        }
    }
}

/* The peer-written dispatch areas come twice, by the parity of the epoch,
 * so a rank may dispatch again before combining (DeepEP's double buffer):
 * its batch n + 2 reuses batch n's area only after batch n + 1 saw every
 * peer's flag, i.e. after every peer finished reading batch n. */
__device__ __forceinline__ size_t parity(const Args &a, uint32_t epoch) {
    return a.staging ? 0 : (size_t)(epoch & 1);
}
/* Where a send to rank dst is filed: under this rank's index in dst's
 * inbox, or under dst's in this rank's outbox (staging). */
__device__ __forceinline__ int filed_as(const Args &a, int dst) { return a.staging ? dst : a.me; }
__device__ uint64_t *dflag_at(const Args &a, unsigned char *buf, uint32_t epoch, int src) {
    if (a.staging) return (uint64_t *)(buf + a.off_dflag + (size_t)src * a.dblk);
    return (uint64_t *)(buf + a.off_dflag) + parity(a, epoch) * a.R + src;
}
/* Normal mode's first flag from src (the compact receive: peer transport,
 * no staging): its metas and counts are in, its rows may still come. */
__device__ uint64_t *mflag_at(const Args &a, unsigned char *buf, uint32_t epoch, int src) {
    return (uint64_t *)(buf + a.off_mflag) + parity(a, epoch) * a.R + src;
}
__device__ int32_t *cnt_at(const Args &a, unsigned char *buf, uint32_t epoch, int src, int32_t l) {
    if (a.staging) return (int32_t *)(buf + a.off_dflag + (size_t)src * a.dblk + kFlagBytes) + l;
    return (int32_t *)(buf + a.off_cnt) + (parity(a, epoch) * a.R + src) * a.spr + l;
}
__device__ unsigned char *rec_at(const Args &a, unsigned char *buf, uint32_t epoch, int src,
                                 int64_t t) {
    if (a.staging) return buf + a.off_dflag + (size_t)src * a.dblk + a.drows + (size_t)t * a.rec;
    return buf + a.off_rows + ((parity(a, epoch) * a.R + src) * a.M + (size_t)t) * a.rec;
}

/* The peer table into shared memory, thread r's entry given as peer0
 * (loaded by the caller with its other loads, before any is used). */
__device__ __forceinline__ void stage_peers(const Args &a, unsigned char **peer,
                                            unsigned char *peer0) {
    if ((int)threadIdx.x < a.R) peer[threadIdx.x] = peer0;
    for (int r = threadIdx.x + blockDim.x; r < a.R; r += blockDim.x) peer[r] = a.peers[r];
}
/* Staged ids each thread loads with the prologue's other loads (the rest after). */
constexpr int kIdsAhead = 4;

/* Whether the handle is dead, read by thread 0 into *faulted and shared, so
 * every thread of the block takes the same branch (threads reading it each
 * could split a block at a later barrier when another block raises a fault
 * meanwhile). The dispatch and combine kernels read the word the same way
 * but themselves, with their prologue's other loads (their s_dead). */
__device__ __forceinline__ void read_fault(const Args &a, int *faulted) {
    *faulted = ld_volatile(&a.ctl->fault[0]) != F_NONE;
}
__device__ bool block_faulted(const Args &a) {
    __shared__ int faulted;
    if (threadIdx.x == 0) read_fault(a, &faulted);
    __syncthreads();
    return faulted != 0;
}

/* The epoch a dispatch sends with: the one after the last dispatch's (0
 * marks flags never written). Past 2^32 - 1, which is odd, it goes on at
 * 2, not 1: consecutive launches must alternate parity (the double buffer
 * above), and 1 would have put two in a row in the odd area (a server
 * dispatching 6,000 times a second gets there in about eight days). */
__device__ __forceinline__ uint32_t next_epoch(uint32_t last) {
    return last + 1 == 0 ? 2 : last + 1;
}

/* A launch's epoch from a word (epoch << 32 | blocks started), by thread 0
 * of each block: a sending launch takes the next epoch and counts its block
 * (one atomic); a receive-only launch (a split phase's second half) reads
 * the epoch its sending half advanced. */
__device__ uint32_t take_epoch(unsigned long long *word, bool sending) {
    const unsigned long long w =
        sending ? atomicAdd(word, 1ull) : *(volatile unsigned long long *)word;
    return sending ? next_epoch((uint32_t)(w >> 32)) : (uint32_t)(w >> 32);
}

/* Block 0 of a sending launch advances the epoch once every block has read
 * it (the blocks are all resident, so they all get there; a launch that
 * shares the word with another in flight, which the host's stream chaining
 * prevents, would be stuck: it gives up after the timeout as a wait does). */
__device__ void advance_epoch(const Args &a, unsigned long long *word, uint32_t epoch,
                              uint32_t phase, unsigned long long seen = 0) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    volatile unsigned long long *p = (volatile unsigned long long *)word;
    /* seen: the word as block 0 read it earlier (prefetch_started), so in
     * the usual case, every block long started, no trip to memory is left
     * at the kernel's end. */
    if (next_epoch((uint32_t)(seen >> 32)) == epoch && (uint32_t)seen >= gridDim.x) {
        *p = (unsigned long long)epoch << 32;
        return;
    }
    const unsigned long long t0 = global_ns();
    while ((uint32_t)*p < gridDim.x) {
        if (global_ns() - t0 > a.timeout_ns) {
            raise_fault(a, F_TIMEOUT, phase, (uint32_t)a.me, epoch);
            return;
        }
    }
    *p = (unsigned long long)epoch << 32;
}

/* Block 0's early read of a launch's epoch word, for advance_epoch (0
 * elsewhere: nothing read). The load is issued here and waited for only
 * where the value is used. */
__device__ __forceinline__ unsigned long long prefetch_started(const unsigned long long *word) {
    return blockIdx.x == 0 && threadIdx.x == 0 ? *(const volatile unsigned long long *)word : 0ull;
}

/* The combine areas, twice by the parity of the combine's epoch: a rank
 * may combine one dispatch again (DeepEP allows it) only after its last
 * combine saw every peer's flag, i.e. after every peer started it. Staging
 * keeps one area per peer instead (`peer`: the rank whose experts wrote
 * the rows on the receiving side, the destination on the sending side):
 * the transport moves whole blocks, so the senders' rows cannot share one. */
__device__ unsigned char *comb_at(const Args &a, unsigned char *buf, uint32_t ce, int peer) {
    if (a.staging) return buf + a.off_cflag + (size_t)peer * a.cblk + kFlagBytes;
    return buf + a.off_comb + (size_t)(ce & 1) * (size_t)a.M * a.K * a.yrow;
}
__device__ uint64_t *cflag_at(const Args &a, unsigned char *buf, uint32_t ce, int src) {
    if (a.staging) return (uint64_t *)(buf + a.off_cflag + (size_t)src * a.cblk);
    return (uint64_t *)(buf + a.off_cflag) + parity(a, ce) * a.R + src;
}
/* The bytes from one source's flag to the next, for wait_flags: adjacent
 * words, or a staging transport's blocks (each flag heads its source's). */
__device__ __forceinline__ size_t dflag_stride(const Args &a) {
    return a.staging ? a.dblk : sizeof(uint64_t);
}
__device__ __forceinline__ size_t cflag_stride(const Args &a) {
    return a.staging ? a.cblk : sizeof(uint64_t);
}

/* v[0..n) -> exclusive prefix sums in place, v[n] = the total, by the whole
 * block (n <= blockDim.x * per thread, any n): each thread sums a
 * contiguous chunk, chunk sums are scanned with warp shuffles. */
__device__ void block_scan_smem(int32_t *v, int n) {
    __shared__ int32_t warp_total[kMaxThreads / 32];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nwarps = blockDim.x / 32;
    const int per = (n + blockDim.x - 1) / blockDim.x;
    const int lo = tid * per < n ? tid * per : n, hi = lo + per < n ? lo + per : n;
    int32_t sum = 0;
    for (int i = lo; i < hi; i++) sum += v[i];
    int32_t inc = sum;
    for (int d = 1; d < 32; d *= 2) {
        int32_t up = __shfl_up_sync(0xffffffffu, inc, d);
        if (lane >= d) inc += up;
    }
    if (lane == 31) warp_total[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        int32_t wt = lane < nwarps ? warp_total[lane] : 0, winc = wt;
        for (int d = 1; d < 32; d *= 2) {
            int32_t up = __shfl_up_sync(0xffffffffu, winc, d);
            if (lane >= d) winc += up;
        }
        if (lane < nwarps) warp_total[lane] = winc - wt;
    }
    __syncthreads();
    int32_t run = warp_total[warp] + inc - sum;
    for (int i = lo; i < hi; i++) {
        const int32_t vi = v[i];
        v[i] = run;
        run += vi;
    }
    if (tid == (int)blockDim.x - 1) v[n] = run;
    __syncthreads();
}

/* Slot q of a batch's ids: int32, or int64 (ids64) where every negative
 * id means "none" (DeepEP's rule) and ids past int32 stay out of range. */
__device__ __forceinline__ int32_t slot_at(const void *slots, int64_t q, int ids64) {
    if (!ids64) return ((const int32_t *)slots)[q];
    const int64_t v = ((const int64_t *)slots)[q];
    return v < 0 ? -1 : v > INT_MAX ? INT_MAX : (int32_t)v;
}

/* The largest i in [0, n) with so[i] <= j (so ascending, so[0] = 0). */
__device__ __forceinline__ int upper_index(const int32_t *so, int n, int32_t j) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (so[mid] <= j)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

} // namespace
