/*
 * ll_ep.cu - the low-latency EP engine (epx_comm_gpu.h): one kernel per
 * phase over peer pointers, DeepEP's expert-major receive layout, the
 * entries and combine formula of ep_common.h.
 *
 * One device buffer per rank, carved as:
 *   rows    2 x R * M records  peers write their token rows here, once per
 *                              destination rank: [x row | K x Meta]
 *   cnt     2 x R * spr int32  peers' entry counts per local slot
 *   dflag   2 x R flags        (epoch, T) per source
 *           (twice: by the parity of the epoch, so a rank may dispatch
 *           again before combining, as DeepEP's double buffer allows)
 *   comb    2 x M * K rows     expert outputs of this rank's (t, k)
 *   cflag   2 x R flags        (twice: by the parity of the combine's epoch)
 *   ------------------------------ (above: written by peers)
 *   rx, y   spr * R * M rows   expert-major received rows and outputs
 *   count, pair, srctok, ew, range   per slot / per entry row
 *   work                       the dispatch's items (row, k): entry and pair,
 *                              the combine's list of rows to send
 *   weights, slots             this rank's routing of the running batch
 *   ctl                        epochs, arrival counters, the fault record
 * The peer table (R base pointers, this rank's own among them) sits at the
 * end. Only the kernels touch the buffer per batch. A staging transport
 * (NCCL) lays the peer-written part out by peer instead, one buffer and a
 * block per peer and phase ([flag | counts | rows], [flag | comb rows]:
 * Args::dblk), so each phase moves one piece per peer.
 *
 * Why this layout (issue 24): the first engine grouped the received rows
 * in one block after the exchange (~3.5 us at any batch size). Here the
 * sender computes each entry's position among its own entries of a slot,
 * which needs nothing from other ranks, and sends its counts per slot; so
 * every receiving block can place its rows as soon as the flags are in:
 * row (s, t, k) goes to l * R * M + (entries of l from sources < s) +
 * position. That is (source, token, k) order, the CPU path's, with no
 * grouping pass and no scan across blocks; a token crosses the wire once
 * per destination rank and is copied per entry on the receiver only.
 *
 * Ordering: a block writes its rows and counts with plain stores, then
 * counts itself in with an acquire-release atomic; the last block to arrive
 * publishes the flags with release stores; a waiter reads flags with
 * acquire loads, so the rows are visible once the flag is. Buffers are
 * reused without clearing, by parity: a rank's dispatch n + 2 writes the
 * areas of dispatch n only after its dispatch n + 1 saw every peer's flag of
 * n + 1, i.e. after every peer's dispatch n finished reading them (one
 * stream per handle keeps a rank's launches in order); combines likewise by
 * their own epochs. Rows a sender did not write this time carry an older
 * tag. A launch's epoch is taken by one atomic per block and advanced by
 * block 0 only once every block has taken it (take_epoch, advance_epoch).
 */
#include <climits>
#include <cstdio>
#include <ctime>
#include <cuda_runtime.h>
#include <pthread.h>
#include <unistd.h>

#include "comm_internal.h"
#include "ep_common.h"
#include "epx_comm_gpu.h"
#include "cuda_check.h"
#include "transport.h"

namespace {

constexpr int kThreads = 512;
constexpr int kMaxK = EPX_MOE_MAX_TOP_K;
/* Shared-memory ints of one pass of the per-slot counts a sender writes. */
constexpr int kCountInts = 4096;
/* A batch's ids are staged in shared memory up to this many (T * K). */
constexpr int kSmemIds = 4096;
/* Most ranks (per-source counts live in shared memory) and local slots
 * (the combine's scan of the counts lives there too). */
constexpr int kMaxRanks = 1024;
constexpr int kMaxLocal = EPXI_LL_MAX_LOCAL_SLOTS;
static_assert(kMaxK <= kThreads, "a block's threads hold one token's K choices");
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
    int64_t M, RM; /* max_tokens; R * M, the rows of one local slot */
    size_t rec, xrow, yrow, meta_off;
    size_t off_rows, off_cnt, off_dflag, off_comb, off_cflag;
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
    int variant;    /* measurement variants (ld_acquire's comment) */
    int one_gpu;    /* every rank on this GPU: flags at GPU scope (scope()) */
    /* A staging transport (NCCL): every peer pointer is this rank's outbox,
     * sends are filed by destination there and the transport moves each
     * phase's blocks between the kernels; one buffer, no parity (nothing
     * writes into the inbox but this rank's own stream). */
    int staging;
    /* This rank's inbox is host memory (the host transport): every load from
     * it crosses the link, so each received row is read once and stored to
     * all its K places (place_rows), not once per (row, k). */
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

__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Variant bits (bench and tests only, epxi_gpu_ep_variant): 1 = blocks
 * count in at GPU scope (arrive); 2 = flags at GPU scope (one GPU
 * only; both are the default when every rank is on this GPU, scope());
 * 4 = poll without sleeping; 8 = block 0 stamps the global timer at each
 * step (Ctl::stamp, read with epxi_gpu_ep_stamps); 16 = system scope even
 * on one GPU; 32 = a host inbox received by the lean dispatch (each row read
 * once per entry, not once: place_rows). */
#define STAMP(a, i)                                                                                \
    do {                                                                                           \
        if (((a).variant & 8) && blockIdx.x == 0 && threadIdx.x == 0)                              \
            (a).ctl->stamp[i] = now_ns();                                                          \
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
        unsigned long long t0 = now_ns();
        uint64_t v = 0;
        bool came = !masked(a, i);
        while (came && (uint32_t)((v = ld_acquire(poll, var)) >> 32) != epoch) {
            if (ld_volatile(&a.ctl->fault[0]) != F_NONE) {
                ok = 0;
                break;
            }
            if (masked(a, i)) { /* another block gave up on it, or the host masked it */
                came = false;
                break;
            }
            if (now_ns() - t0 > a.timeout_ns) {
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
__device__ int32_t *cnt_at(const Args &a, unsigned char *buf, uint32_t epoch, int src, int32_t l) {
    if (a.staging) return (int32_t *)(buf + a.off_dflag + (size_t)src * a.dblk + kFlagBytes) + l;
    return (int32_t *)(buf + a.off_cnt) + (parity(a, epoch) * a.R + src) * a.spr + l;
}
__device__ unsigned char *rec_at(const Args &a, unsigned char *buf, uint32_t epoch, int src,
                                 int64_t t) {
    if (a.staging) return buf + a.off_dflag + (size_t)src * a.dblk + a.drows + (size_t)t * a.rec;
    return buf + a.off_rows + ((parity(a, epoch) * a.R + src) * a.M + (size_t)t) * a.rec;
}

/* Whether the handle is dead, read by thread 0 into *faulted and shared, so
 * every thread of the block takes the same branch (threads reading it each
 * could split a block at a later barrier when another block raises a fault
 * meanwhile). The kernels read it beside their epoch, in one trip to memory,
 * before their first barrier. */
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
 * marks flags never written). */
__device__ __forceinline__ uint32_t next_epoch(uint32_t last) {
    return last + 1 == 0 ? 1 : last + 1;
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
    const unsigned long long t0 = now_ns();
    while ((uint32_t)*p < gridDim.x) {
        if (now_ns() - t0 > a.timeout_ns) {
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

/* v[0..n) -> exclusive prefix sums in place, v[n] = the total, by the whole
 * block (n <= blockDim.x * per thread, any n): each thread sums a
 * contiguous chunk, chunk sums are scanned with warp shuffles. */
__device__ void block_scan_smem(int32_t *v, int n) {
    __shared__ int32_t warp_total[kThreads / 32];
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

/*
 * Sender: this rank's entry counts per slot [lo, hi) of the global slots,
 * written into each destination's cnt[me][local slot], in passes of
 * kCountInts slots through shared memory.
 */
__device__ void count_pass(int32_t *hist, const void *slots, int ids64, int32_t nent, int32_t c0,
                           int32_t c1) {
    for (int32_t j = threadIdx.x; j < nent; j += blockDim.x) {
        const int32_t s = slot_at(slots, j, ids64);
        if (s >= c0 && s < c1) atomicAdd(&hist[s - c0], 1);
    }
}
/* tab[s] += the entries of slot s among ids [q0, q1) (slots in [0, P); tab
 * in shared memory), by the block. Eight ids per thread are loaded before
 * any is counted: one trip to memory per eight, not one per id (the
 * dependent form cost a 4,096-token batch ~20 us per block, ncu). */
__device__ void count_ids(int32_t *tab, const void *slots, int ids64, int32_t q0, int32_t q1,
                          int32_t P) {
    constexpr int U = 8;
    const int32_t step = (int32_t)blockDim.x;
    int32_t q = q0 + (int32_t)threadIdx.x;
    for (; q + (U - 1) * step < q1; q += U * step) {
        int32_t sl[U];
#pragma unroll
        for (int u = 0; u < U; u++) sl[u] = slot_at(slots, q + u * step, ids64);
#pragma unroll
        for (int u = 0; u < U; u++)
            if (sl[u] >= 0 && sl[u] < P) atomicAdd(&tab[sl[u]], 1);
    }
    for (; q < q1; q += step) {
        const int32_t sl = slot_at(slots, q, ids64);
        if (sl >= 0 && sl < P) atomicAdd(&tab[sl], 1);
    }
}

/* hist [kCountInts] (shared): with `first_counted` its first pass [lo, lo +
 * kCountInts) was zeroed and counted already, early in the kernel (the
 * block's barriers since then order it), so the usual single pass costs no
 * barrier of its own. int32 throughout: slots < P and entries < 2^31. */
__device__ void send_counts(const Args &a, unsigned char *const *peer, int32_t *hist,
                            uint32_t epoch, const void *slots, int ids64, int32_t nent, int32_t lo,
                            int32_t hi, const uint8_t *live, bool first_counted) {
    for (int32_t c0 = lo; c0 < hi; c0 += kCountInts) {
        const int32_t c1 = c0 + kCountInts < hi ? c0 + kCountInts : hi;
        if (!(first_counted && c0 == lo)) {
            for (int32_t i = threadIdx.x; i < c1 - c0; i += blockDim.x) hist[i] = 0;
            __syncthreads();
            count_pass(hist, slots, ids64, nent, c0, c1);
            __syncthreads();
        }
        for (int32_t sl = c0 + threadIdx.x; sl < c1; sl += blockDim.x) {
            const int32_t dst = sl / a.spr, l = sl - dst * a.spr;
            if (live[dst]) *cnt_at(a, peer[dst], epoch, filed_as(a, dst), l) = hist[sl - c0];
        }
        if (c1 < hi) __syncthreads(); /* the next pass reuses hist */
    }
}

/* ---- fp8 dispatch (DeepEP's form; numeric.h holds the arithmetic) ------------
 * Kernel parts bits, as the public EPX_GPU_EP_FP8 / _ROUND_SCALE / _UE8M0. A
 * record's x part then holds the row's H e4m3 bytes and its H / 128 fp32
 * scales; the receive holds the data [spr][RM][H] at rx and the scales
 * after it, column-major as DeepEP returns them: fp32 [spr][H / 128][RM],
 * or with UE8M0 the scales' exponent bytes four to an int32 [spr][H / 512][RM]. */
constexpr int kFP8 = 8, kRoundScale = 16, kUE8M0 = 32;

/* The bf16 row src (16-byte aligned, H % 128 == 0) quantised into rec by
 * the block: 16 threads hold a group's 128 values, 8 each, and agree on
 * its largest |value| over shuffles (every lane of a warp takes part). */
__device__ void quantize_row(const Args &a, unsigned char *rec, const unsigned char *src,
                             int round_scale) {
    const int nw = a.H / 8, span = (nw + 31) / 32 * 32;
    for (int base = 0; base < span; base += blockDim.x) {
        const int w = base + (int)threadIdx.x;
        const bool ok = w < nw;
        float f[8], m = 0.0f;
        if (ok) {
            const int4 raw = ((const int4 *)src)[w];
            const uint32_t u[4] = {(uint32_t)raw.x, (uint32_t)raw.y, (uint32_t)raw.z,
                                   (uint32_t)raw.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                f[2 * j] = epxi_bf16_to_f32((uint16_t)(u[j] & 0xffffu));
                f[2 * j + 1] = epxi_bf16_to_f32((uint16_t)(u[j] >> 16));
            }
#pragma unroll
            for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(f[j]));
        }
        for (int o = 8; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o, 16));
        if (ok) {
            float scale, factor;
            epxi_fp8_scale(m, round_scale, &scale, &factor);
            uint32_t lo = 0, hi = 0;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                lo |= (uint32_t)epxi_fp8_quantize(f[j], factor) << (8 * j);
                hi |= (uint32_t)epxi_fp8_quantize(f[4 + j], factor) << (8 * j);
            }
            ((uint2 *)rec)[w] = make_uint2(lo, hi);
            if (w % 16 == 0) ((float *)(rec + a.H))[w / 16] = scale;
        }
    }
}

/* The fp8 receive's scales (after the data of every entry row). */
__device__ __forceinline__ unsigned char *fp8_scales(const Args &a) {
    return a.rx + (size_t)a.spr * (size_t)a.RM * (size_t)a.H;
}

/* Entry e's fp8 row from its record, by the block: the data, then its
 * scales into the column-major scale tensor (UE8M0: exponent bytes packed). */
__device__ void place_fp8(const Args &a, const unsigned char *rec, int64_t e, int ue8m0) {
    block_copy(a.rx + (size_t)e * (size_t)a.H, rec, (size_t)a.H);
    const int G = a.H / EPXI_FP8_GROUP;
    const int64_t l = e / a.RM, s = e - l * a.RM;
    const float *sc = (const float *)(rec + a.H);
    if (!ue8m0) {
        float *out = (float *)fp8_scales(a);
        for (int g = threadIdx.x; g < G; g += blockDim.x)
            out[((size_t)l * G + g) * (size_t)a.RM + (size_t)s] = sc[g];
        return;
    }
    int32_t *out = (int32_t *)fp8_scales(a);
    for (int q = threadIdx.x; q < G / 4; q += blockDim.x) {
        uint32_t packed = 0;
        for (int j = 0; j < 4; j++)
            packed |= ((__float_as_uint(sc[4 * q + j]) >> 23) & 0xffu) << (8 * j);
        out[((size_t)l * (G / 4) + q) * (size_t)a.RM + (size_t)s] = (int32_t)packed;
    }
}

/*
 * Where entry (source s, token t, k) of meta m goes in the expert-major
 * receive, or with so in the compact one (its slot's offset for sources
 * below s, from their counts, plus its position), with its weight, source
 * pair and token recorded there; -1
 * for a meta of an older batch or out of range. live [R]: the sources that
 * count (shrink mode gives up on some).
 */
__device__ int64_t place_entry(const Args &a, uint32_t epoch, const Meta &m, int s, int64_t t,
                               int k, const uint8_t *live, int32_t item,
                               const int32_t *so = nullptr) {
    int64_t e = -1;
    if (m.tag == epoch && m.slot >= 0 && m.slot < a.spr) {
        int64_t off = 0;
        for (int s2 = 0; s2 < s; s2++)
            if (live[s2]) off += *cnt_at(a, a.base, epoch, s2, m.slot);
        /* so (normal mode): the slots' first entries in the compact receive */
        const int64_t first = so ? so[m.slot] : (int64_t)m.slot * a.RM;
        const int64_t room = so ? so[m.slot + 1] - so[m.slot] : a.RM;
        if (m.pos >= 0 && off + m.pos < room) e = first + off + m.pos;
    }
    const int32_t pair = (int32_t)(((int64_t)s * a.M + t) * a.K + k);
    if (e >= 0) {
        a.ew[e] = m.weight;
        a.pair[e] = pair;
        a.srctok[e] = (int32_t)t;
    }
    if (s == a.me && m.tag == epoch) a.self_e[t * a.K + k] = e;
    Work w;
    w.e = e;
    w.pair = pair;
    w.pad = 0;
    a.work[item] = w;
    return e;
}

/* Rows held in registers: up to kPre 16-byte words per thread. */
constexpr int kPre = 4;

/* Whether a row of `xrow` bytes at x is read into registers (regs_load):
 * whole 16-byte words, aligned, at most kPre per thread. The kernel asks it
 * for its `pre` path and the host for the lean instance, which assumes it. */
__host__ __device__ inline bool row_fits_registers(size_t xrow, const void *x, unsigned threads) {
    return xrow % 16 == 0 && xrow / 16 <= (size_t)kPre * threads && (uintptr_t)x % 16 == 0;
}

/*
 * Receive for a host-memory inbox: items are received rows; thread k reads
 * the row's meta k and finds its place (its source's offset summed from the
 * counts), then the block reads the row once (into registers, asked for
 * with the meta, where it fits; else in 16-byte words where the rows allow)
 * and stores it to every place. first_row [R + 1]: rows of the sources
 * below s (shared memory).
 */
__device__ void place_rows(const Args &a, uint32_t epoch, const int32_t *first_row, int64_t rows,
                           const uint8_t *live, int fp8) {
    __shared__ int64_t place[kMaxK];
    __shared__ int nplace;
    const int K = a.K;
    const bool wide = a.xrow % 16 == 0;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        int s = 0;
        while (first_row[s + 1] <= row) s++;
        const int64_t t = row - first_row[s];
        const unsigned char *rec = rec_at(a, a.base, epoch, s, t);
        /* The whole row is asked for with the meta, so over the host link the
         * block waits for one round trip, not one per word sweep after it. */
        const bool pre = !fp8 && row_fits_registers(a.xrow, rec, blockDim.x);
        int4 v[kPre];
        if (pre) regs_load(v, rec, a.xrow);
        if (threadIdx.x == 0) nplace = 0;
        __syncthreads();
        if (threadIdx.x < K) {
            const int k = threadIdx.x;
            const int64_t e = place_entry(a, epoch, ((const Meta *)(rec + a.meta_off))[k], s, t, k,
                                          live, (int32_t)(row * K + k));
            if (e >= 0) place[atomicAdd(&nplace, 1)] = e;
        }
        __syncthreads();
        const int n = nplace;
        if (fp8) {
            for (int i = 0; i < n; i++) place_fp8(a, rec, place[i], fp8 & kUE8M0);
        } else if (pre) {
            for (int i = 0; i < n; i++) regs_store(a.rx + (size_t)place[i] * a.xrow, v, a.xrow);
        } else if (wide) {
            const int4 *src = (const int4 *)rec;
            for (size_t w = threadIdx.x; w < a.xrow / 16; w += blockDim.x) {
                const int4 word = src[w];
                for (int i = 0; i < n; i++) ((int4 *)(a.rx + (size_t)place[i] * a.xrow))[w] = word;
            }
        } else {
            for (int i = 0; i < n; i++) block_copy(a.rx + (size_t)place[i] * a.xrow, rec, a.xrow);
        }
        __syncthreads();
    }
}

/* One token's routing by a warp, lane k holding choice k (K <= 32): its slot
 * as given and as kept (-1: none or out of range), its weight, its
 * destination rank (INT_MAX: none), its place among the token's ascending
 * destinations where it is the first lane of its rank (-1 otherwise), and
 * how many of the token's earlier k name its slot. */
struct WarpRoute {
    int32_t sv, kept;
    float wv;
    int r, place, twin;
};
__device__ WarpRoute warp_route(const Args &a, const void *slots, int ids64, const float *weights,
                                int32_t t) {
    const int lane = threadIdx.x % 32, K = a.K;
    const bool in = lane < K;
    WarpRoute w;
    w.sv = in ? slot_at(slots, t * K + lane, ids64) : -1;
    w.wv = in && weights ? weights[t * K + lane] : 0.0f;
    w.kept = in && w.sv >= 0 && w.sv < a.P ? w.sv : -1;
    w.r = w.kept >= 0 ? w.kept / a.spr : INT_MAX;
    const unsigned same = __match_any_sync(0xffffffffu, w.r);
    const bool first = w.r != INT_MAX && lane == __ffs(same) - 1;
    const unsigned firsts = __ballot_sync(0xffffffffu, first);
    int place = 0;
    for (int jj = 0; jj < K; jj++) {
        const int rj = __shfl_sync(0xffffffffu, w.r, jj);
        place += ((firsts >> jj) & 1u) && rj < w.r;
    }
    w.place = first ? place : -1;
    const unsigned twins = __match_any_sync(0xffffffffu, w.kept >= 0 ? w.kept : -2 - lane);
    w.twin = __popc(twins & ((1u << lane) - 1u));
    return w;
}

/*
 * The lean send of a batch past the staged ids (kBig, K <= 32): the
 * block's run of items [i_lo, i_hi) spread over its warps, one (token,
 * destination) item per warp at a time, so a block has as many rows in
 * flight as warps. First every row goes out; then tab gets the per-slot
 * counts of the tokens before the run; then each warp writes its items'
 * metas, a position being that count plus the run's earlier tokens'
 * entries of the slot (ballots over their ids) plus the token's earlier k.
 * No barrier between items. With all_counts (the run ends the batch) tab
 * ends holding every token's counts, for send_counts.
 */
__device__ void send_run_warps(const Args &a, unsigned char *const *peer, uint32_t epoch,
                               int32_t i_lo, int32_t i_hi, int dmax, int32_t Tn,
                               const unsigned char *x, const void *slots, int ids64,
                               const float *weights, int32_t *tab, const uint8_t *live,
                               bool all_counts, int &bad_slot) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    const int K = a.K;
    const int32_t run0 = i_lo / dmax * K; /* the ids before the run's first token */
    /* The rank of the token's j-th destination, or -1: none, or masked. */
    auto dest = [&](const WarpRoute &w, int j) {
        const unsigned hit = __ballot_sync(0xffffffffu, w.place == j);
        const int d = hit ? __shfl_sync(0xffffffffu, w.r, __ffs(hit) - 1) : -1;
        return d >= 0 && live[d] ? d : -1;
    };
    for (int32_t item = i_lo + warp; item < i_hi; item += nw) {
        const int32_t t = item / dmax;
        const WarpRoute w = warp_route(a, slots, ids64, weights, t);
        const int dst = dest(w, item - t * dmax);
        if (dst >= 0)
            copy_words<int4>(rec_at(a, peer[dst], epoch, filed_as(a, dst), t),
                             x + (size_t)t * a.xrow, a.xrow, lane, 32);
    }
    count_ids(tab, slots, ids64, 0, run0, a.P);
    __syncthreads();
    for (int32_t item = i_lo + warp; item < i_hi; item += nw) {
        const int32_t t = item / dmax;
        const int j = item - t * dmax;
        const WarpRoute w = warp_route(a, slots, ids64, weights, t);
        const bool in = lane < K;
        if (in && (w.sv < -1 || w.sv >= a.P)) {
            bad_slot = 1;
            a.ctl->bad = 1; /* read by the last block, after the counters */
        }
        if (in && w.twin > 0) {
            bad_slot = 1;
            a.ctl->dup = 1;
        }
        if (in && j == 0) {
            a.slots[t * K + lane] = w.sv;
            a.weights[t * K + lane] = w.wv;
        }
        const int dst = dest(w, j);
        if (dst < 0) continue;
        int32_t pos = w.twin + (w.kept >= 0 ? tab[w.kept] : 0);
        for (int32_t q0 = run0; q0 < t * K; q0 += 32) {
            const int32_t q = q0 + lane;
            const int32_t s2 = q < t * K ? slot_at(slots, q, ids64) : -1;
            for (int kk = 0; kk < K; kk++) {
                const int32_t want = __shfl_sync(0xffffffffu, w.kept, kk);
                const int c = __popc(__ballot_sync(0xffffffffu, want >= 0 && s2 == want));
                if (lane == kk) pos += c;
            }
        }
        if (in) {
            unsigned char *rec = rec_at(a, peer[dst], epoch, filed_as(a, dst), t);
            const bool here = w.kept >= 0 && w.r == dst;
            Meta m;
            m.slot = here ? w.kept - dst * a.spr : -1;
            m.weight = here ? w.wv : 0.0f;
            m.pos = here ? pos : 0;
            m.tag = epoch;
            ((Meta *)(rec + a.meta_off))[lane] = m;
        }
    }
    if (all_counts) { /* the run's own tokens join the table: every token's counts */
        __syncthreads();
        count_ids(tab, slots, ids64, run0, Tn * K, a.P);
    }
}

/*
 * Normal mode's receive (Args::compact), by every block once the flags are
 * in: the slots' first entries (each block sums the sources' counts and
 * scans them in `so`, shared memory of spr + 1 ints; the range block also
 * stores them in offs), then one (row, k) item per thread: its entry's
 * index, weight, pair and token, and its row's place in the inbox. No row
 * is copied: the experts read them where the senders wrote them.
 */
__device__ void receive_compact(const Args &a, uint32_t epoch, const int32_t *first_row,
                                int32_t items, const uint8_t *live, int32_t *so, bool range_block) {
    for (int l = threadIdx.x; l < a.spr; l += blockDim.x) {
        int32_t c = 0;
        for (int s = 0; s < a.R; s++)
            if (live[s]) c += *cnt_at(a, a.base, epoch, s, l);
        so[l] = c;
    }
    __syncthreads();
    block_scan_smem(so, a.spr);
    if (range_block)
        for (int l = threadIdx.x; l <= a.spr; l += blockDim.x) a.offs[l] = so[l];
    const int K = a.K;
    const int64_t area = (int64_t)parity(a, epoch) * a.R; /* this dispatch's rows in the inbox */
    const int32_t stride = (int32_t)(gridDim.x * blockDim.x);
    for (int32_t item = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x); item < items;
         item += stride) {
        const int32_t vrow = item / K;
        int s = 0;
        while (first_row[s + 1] <= vrow) s++;
        const int32_t t = vrow - first_row[s];
        const int k = item - vrow * K;
        const Meta m = ((const Meta *)(rec_at(a, a.base, epoch, s, t) + a.meta_off))[k];
        const int64_t e = place_entry(a, epoch, m, s, t, k, live, item, so);
        if (e >= 0) a.etok[e] = (int32_t)((area + s) * a.M + t);
    }
}

/*
 * Dispatch, one launch (named so profilers' "::dispatch" finds it, as
 * DeepEP's benchmark does). parts: 1 = send, 2 = receive (both: 3). Send work
 * items are (token, j-th destination rank); the first `nwork` blocks also
 * write the counts, count in, and the last of them publishes the flags.
 * Receive: every block waits for the R flags, then places received rows
 * by (row, k) items. Blocks must all be resident (the launch caps them).
 *
 * kLean: the instance for the usual case, bf16 or fp32 rows that fit the
 * registers, 16-byte aligned, no fp8, a device-memory inbox, top-k <= 32
 * (epx_gpu_ep_dispatch_parts decides on the host). It holds none of the
 * other paths' code: 3,704 instructions instead of 7,504. A launch runs on
 * SMs whose instruction cache the combine just filled, so every cold
 * stretch of code is a trip to memory on the critical path (ncu: "no
 * instruction" is the first stall after the barriers).
 *
 * kBig: a batch past the staged ids (T * K > kSmemIds): positions from a
 * per-slot table of earlier tokens (P <= kSmemIds), sent a warp per item
 * by the lean instance (send_run_warps), a block per item with the next
 * item's loads issued early by the general one. Its own instance, since
 * that code cost small batches 0.2-0.5 us in the lean one (H200,
 * bench/RESULTS.md).
 */
template <bool kLean, bool kBig>
__global__ void __launch_bounds__(kThreads, 2)
    dispatch_kernel(Args a, int64_t T, const unsigned char *x, const void *slots,
                    const float *weights, uint32_t nwork, int parts) {
    const int ids64 = (parts & 4) != 0;
    const int fp8 = kLean ? 0 : parts & (kFP8 | kRoundScale | kUE8M0);
    const int K = a.K, dmax = K < a.R ? K : a.R;
    __shared__ int32_t d[kMaxK], sk[kMaxK], pk[kMaxK];
    __shared__ float wk[kMaxK];
    __shared__ int nd;
    /* The x row is read into registers while the routing is worked out, so
     * the two reads overlap; rows too large for that are copied directly. */
    const bool pre = kLean || (!fp8 && row_fits_registers(a.xrow, x, blockDim.x));
    int4 v[kPre];
    int32_t sv = -1; /* this thread's (slot, weight) of the item's token, k = threadIdx.x */
    float wv = 0.0f;
    int bad_slot = 0; /* this thread saw a slot outside [-1, P) */
    /* Token and item counters are int32 (T * K <= R * max_tokens * top_k <
     * 2^31, checked at creation): a 64-bit division costs a subroutine of
     * ~70 dependent instructions, on every block's critical path. */
    const int32_t Tn = (int32_t)T;
    auto load_item = [&](int32_t item) {
        const int32_t t = item / dmax;
        if (pre) regs_load(v, x + (size_t)t * a.xrow, a.xrow);
        if (threadIdx.x < K) {
            sv = slot_at(slots, t * K + threadIdx.x, ids64);
            wv = weights ? weights[t * K + threadIdx.x] : 0.0f;
        }
    };
    const bool sending = (parts & 1) != 0;
    /* A block's send items (token, j-th destination): every gridDim-th one
     * from its index, or (kBig) one contiguous run [i_lo, i_hi), so a large
     * batch's positions carry from one token to the next (tabled below). */
    const int32_t nitems = sending ? Tn * dmax : 0;
    const int32_t per_block = kBig ? (nitems + (int32_t)gridDim.x - 1) / (int32_t)gridDim.x : 1;
    const int32_t i_lo = kBig ? min((int32_t)blockIdx.x * per_block, nitems) : (int32_t)blockIdx.x;
    const int32_t i_hi = kBig ? min(i_lo + per_block, nitems) : nitems;
    const int32_t i_step = kBig ? 1 : (int32_t)gridDim.x;
    /* The first item's loads are issued before the fault check, so the
     * two trips to memory overlap. */
    if (i_lo < i_hi) load_item(i_lo);
    /* The epoch: a sending launch takes the next one and advances Ctl::de
     * at its end, once every block has read it (Ctl::started); a
     * receive-only launch (the second half of a split dispatch) reads it. */
    __shared__ uint32_t s_epoch;
    /* the batch's slots, when T * K fits; normal mode's slot starts after the send */
    __shared__ int32_t ids[kSmemIds];
    static_assert(kMaxLocal + 1 <= kSmemIds, "normal mode's slot starts fit the ids' room");
    __shared__ uint8_t live[kMaxRanks]; /* ranks sent to, then sources received from */
    const bool staged = sending && Tn * K <= kSmemIds;
    /* A batch too large to stage keeps per-slot counts of the tokens before
     * the current one there instead (P <= kSmemIds): counted once over the
     * tokens before the block's run, then a token at a time, so an entry's
     * position costs a lookup, not a pass over every earlier token. */
    const bool tabled = kBig && sending && !staged && a.P <= kSmemIds;
    int32_t *const tab = ids;
    /* ... and the block of the last item ends with every token in its table:
     * it alone sends the per-slot counts, so no block makes a pass over the
     * whole batch for them (the others count in with an empty range). */
    const bool all_counts = tabled && (int32_t)blockIdx.x == (nitems - 1) / per_block;
    __shared__ int s_dead;
    __shared__ unsigned char *peer[kMaxRanks]; /* the peer table, read once */
    __shared__ int32_t hist[kCountInts];       /* this block's per-slot counts (send_counts) */
    STAMP(a, 5);
    /* The first nwork blocks send this rank's counts of the slots [clo, chi):
     * the first pass's histogram is zeroed here and counted after the first
     * barrier, off the send's own path. P * blocks is below 2^32 when P <
     * 2^16 (grids stay below 2^16). */
    const bool counting = sending && blockIdx.x < nwork;
    const uint32_t cb = blockIdx.x;
    const int32_t clo = !counting || tabled ? 0
                        : a.P < 65536       ? (int32_t)((uint32_t)a.P * cb / nwork)
                                            : (int32_t)((int64_t)a.P * cb / nwork);
    const int32_t chi = !counting || tabled ? (all_counts ? a.P : 0)
                        : a.P < 65536       ? (int32_t)((uint32_t)a.P * (cb + 1) / nwork)
                                            : (int32_t)((int64_t)a.P * (cb + 1) / nwork);
    const int32_t c1 = chi - clo < kCountInts ? chi : clo + kCountInts;
    for (int32_t i = threadIdx.x; i < c1 - clo; i += blockDim.x) hist[i] = 0;
    if (tabled)
        for (int32_t i = threadIdx.x; i < a.P; i += blockDim.x) tab[i] = 0;
    STAMP_CLOCK(a, 6);
    if (threadIdx.x == 0) {
        s_epoch = take_epoch(&a.ctl->de_started, sending);
        read_fault(a, &s_dead);
    }
    if (staged)
        for (int32_t q = threadIdx.x; q < Tn * K; q += blockDim.x)
            ids[q] = slot_at(slots, q, ids64);
    for (int r = threadIdx.x; r < a.R; r += blockDim.x) peer[r] = a.peers[r];
    __syncthreads();
    const uint32_t epoch = s_epoch;
    auto id_at = [&](int32_t q) { return staged ? ids[q] : slot_at(slots, q, ids64); };
    unsigned long long started = 0; /* block 0: the epoch word, read early (advance_epoch) */
    auto advance = [&]() {
        if (sending) advance_epoch(a, &a.ctl->de_started, epoch, PH_DISPATCH, started);
    };
    if (s_dead) return;
    if (counting && !tabled)
        count_pass(hist, staged ? (const void *)ids : slots, staged ? 0 : ids64, Tn * K, clo, c1);
    /* The lean instance sends a large batch a warp per item (send_run_warps). */
    const bool warp_send = kLean && tabled;
    if (tabled && !warp_send) /* the entries of the tokens before this block's run, per slot */
        count_ids(tab, slots, ids64, 0, i_lo / dmax * K, a.P);
    live_ranks(a, live); /* its barrier orders the counts before send_counts reads them */
    STAMP(a, 0);
    if (warp_send)
        send_run_warps(a, peer, epoch, i_lo, i_hi, dmax, Tn, x, slots, ids64, weights, tab, live,
                       all_counts, bad_slot);
    int32_t fetched = -1; /* the item whose loads were issued early (below) */
    for (int32_t item = i_lo; !warp_send && item < i_hi; item += i_step) {
        const int32_t t = item / dmax;
        const int j = item - t * dmax;
        if (item != i_lo && (!kBig || item != fetched)) load_item(item);
        if (kLean || K <= 32) {
            /* Warp 0 alone (lane k holds choice k of the token): the slots
             * kept, the distinct destination ranks and each k's position
             * among the token's earlier k with its slot, from warp votes, so
             * the block meets one barrier here, not two. */
            if (threadIdx.x < 32) {
                const int lane = threadIdx.x;
                const bool in = lane < K;
                int32_t kept = -1;
                if (in) {
                    if (sv < -1 || sv >= a.P) {
                        bad_slot = 1;
                        a.ctl->bad = 1; /* read by the last block, after the counters */
                    }
                    kept = sv >= 0 && sv < a.P ? sv : -1;
                    sk[lane] = kept;
                    wk[lane] = wv;
                    if (j == 0) {
                        a.slots[t * K + lane] = sv;
                        a.weights[t * K + lane] = wv;
                    }
                }
                /* Destinations ascending, without a serial scan: each first
                 * occurrence counts the smaller ones. */
                const int r = kept >= 0 ? kept / a.spr : INT_MAX;
                const unsigned same = __match_any_sync(0xffffffffu, r);
                const bool first = r != INT_MAX && lane == __ffs(same) - 1;
                int pos = 0;
                for (int jj = 0; jj < K; jj++) {
                    const int rj = __shfl_sync(0xffffffffu, r, jj);
                    const int fj = __shfl_sync(0xffffffffu, (int)first, jj);
                    pos += fj && rj < r;
                }
                if (first) d[pos] = r;
                const unsigned firsts = __ballot_sync(0xffffffffu, first);
                if (lane == 0) nd = __popc(firsts);
                /* Position among the token's earlier k of the same slot (a
                 * lane without a slot matches no other: its key is unique). */
                const unsigned twins = __match_any_sync(0xffffffffu, kept >= 0 ? kept : -2 - lane);
                const int32_t p = __popc(twins & ((1u << lane) - 1u));
                if (in) {
                    pk[lane] = p;
                    if (p > 0) {
                        a.ctl->dup = 1; /* read by the last block, after the counters */
                        bad_slot = 1;   /* marks the block: the last one reads dup and bad */
                    }
                }
            }
        } else {
            if (threadIdx.x < K) { /* K <= kMaxK < blockDim.x */
                const int k = threadIdx.x;
                if (sv < -1 || sv >= a.P) {
                    bad_slot = 1;
                    a.ctl->bad = 1; /* read by the last block, after the counters */
                }
                sk[k] = sv >= 0 && sv < a.P ? sv : -1;
                wk[k] = wv;
                if (j == 0) {
                    a.slots[t * K + k] = sv;
                    a.weights[t * K + k] = wv;
                }
            }
            __syncthreads();
            if (threadIdx.x == 0) nd = epxi_ep_token_dests(sk, K, a.spr, d);
            /* Position of (t, k) among the token's earlier k with that slot. */
            if (threadIdx.x < K) {
                int32_t p = 0;
                for (int k2 = 0; k2 < (int)threadIdx.x; k2++) p += sk[k2] == sv && sv >= 0;
                pk[threadIdx.x] = p;
                if (p > 0) {
                    a.ctl->dup = 1; /* read by the last block, after the counters */
                    bad_slot = 1;   /* marks the block: the last one reads dup and bad */
                }
            }
        }
        __syncthreads();
        STAMP(a, 17);
        if (j < nd && live[d[j]]) {
            /* Then every earlier token's entries of the slot: from the table
             * (thread k reads and then writes pk[k] itself: no barrier), or
             * counted by the whole block (none before the first token). */
            if (tabled) {
                if (threadIdx.x < K && sk[threadIdx.x] >= 0)
                    pk[threadIdx.x] += tab[sk[threadIdx.x]];
            } else if (t > 0) {
                for (int32_t q = threadIdx.x; q < t * K; q += blockDim.x) {
                    const int32_t s = id_at(q);
                    for (int k = 0; k < K; k++)
                        if (s == sk[k] && s >= 0) atomicAdd(&pk[k], 1);
                }
                __syncthreads();
            }
            const int dst = d[j];
            unsigned char *rec = rec_at(a, peer[dst], epoch, filed_as(a, dst), t);
            if (fp8)
                quantize_row(a, rec, x + (size_t)t * a.xrow, fp8 & kRoundScale);
            else if (pre)
                regs_store(rec, v, a.xrow);
            else
                block_copy(rec, x + (size_t)t * a.xrow, a.xrow);
            /* The registers are free again (the routing read its slots before
             * the barrier): the next item's loads go out now, under the
             * metadata stores and the barrier. */
            if (kBig && pre && !fp8 && item + 1 < i_hi) {
                load_item(item + 1);
                fetched = item + 1;
            }
            for (int k = threadIdx.x; k < K; k += blockDim.x) {
                const bool here = sk[k] >= 0 && sk[k] / a.spr == dst;
                Meta m;
                m.slot = here ? sk[k] - dst * a.spr : -1;
                m.weight = here ? wk[k] : 0.0f;
                m.pos = here ? pk[k] : 0;
                m.tag = epoch;
                ((Meta *)(rec + a.meta_off))[k] = m;
            }
        }
        __syncthreads();
        STAMP(a, 18);
        /* The token is done: its entries join the table (thread k owns sk[k]
         * until warp 0 rewrites it for the next token; the barrier at the
         * next item's routing orders these before any read). */
        if (tabled && j == dmax - 1 && threadIdx.x < K && sk[threadIdx.x] >= 0)
            atomicAdd(&tab[sk[threadIdx.x]], 1);
    }
    if (counting) {
        /* This block's share of the per-slot counts, then count in (tabled:
         * the last item's block sends all of them from its table, whose last
         * token's entries the barrier makes visible). */
        if (tabled) __syncthreads();
        send_counts(a, peer, all_counts ? tab : hist, epoch, staged ? (const void *)ids : slots,
                    staged ? 0 : ids64, Tn * K, clo, chi, live, true);
        STAMP(a, 1);
        arrive(&a.ctl->arrive_d, nwork, bad_slot, scope(a), [&](bool marked) {
            /* Only a marked batch (a bad or repeated slot somewhere) reads the
             * words that say which; the usual one goes straight to its flags. */
            const bool bad = marked && ld_volatile(&a.ctl->bad) != 0;
            const bool dup = marked && ld_volatile(&a.ctl->dup) != 0;
            if (marked) a.ctl->bad = a.ctl->dup = 0;
            if (a.skip_flags) return;
            const uint32_t c = bad ? EPXI_LL_BAD : dup ? kLLDup : (uint32_t)T;
            uint64_t flag = epxi_ll_flag(epoch, c);
            for (int r = 0; r < a.R; r++)
                if (live[r])
                    st_release(dflag_at(a, peer[r], epoch, filed_as(a, r)), flag, scope(a));
        });
    }
    if (!(parts & 2)) {
        advance();
        return;
    }
    /* Receive: every block waits for every source. */
    STAMP(a, 2);
    __shared__ int32_t first_row[kMaxRanks + 1]; /* rows of sources below s, then the total */
    /* the flags' counts, as wait_flags saw them, where the send's histogram
     * was (done with: the send counted in behind a barrier) */
    static_assert(kMaxRanks <= kCountInts, "the flags' counts fit the histogram's room");
    uint32_t *flag_cnt = (uint32_t *)hist;
    __shared__ int s_any_bad;
    __shared__ uint32_t s_bad_code;
    if (!wait_flags(a, dflag_at(a, a.base, epoch, 0), sizeof(uint64_t), a.R, epoch, PH_DISPATCH,
                    live, a.decided, a.host_inbox ? a.ctl->relay[0] : nullptr, flag_cnt))
        return;
    STAMP(a, 3);
    /* The sources' rows: which flag refused the batch, and the prefix of the
     * rows. Lean with R <= 32: every warp works them out in registers from
     * its lanes (lane r: source r), with no barrier and no shared result
     * (item_rec reads them by shuffles); otherwise thread 0 writes
     * first_row for the block. */
    const bool warp_rows = kLean && a.R <= 32 && !a.compact;
    const int lane = threadIdx.x % 32;
    int any_bad = -1;
    uint32_t bad_code = 0;
    int32_t row_incl = 0, row_excl = 0, rows_total = 0; /* warp_rows: lane r's, and the sum */
    if (warp_rows) {
        const uint32_t c = lane < a.R ? flag_cnt[lane] : 0;
        const bool refuse = lane < a.R && (c == EPXI_LL_BAD || c == kLLDup);
        const unsigned bad = __ballot_sync(0xffffffffu, refuse);
        if (bad != 0) {
            any_bad = __ffs(bad) - 1;
            bad_code = __shfl_sync(0xffffffffu, c, any_bad) == kLLDup ? F_DUP_SLOT : F_BAD_SLOT;
        }
        const int32_t own = refuse || lane >= a.R ? 0 : (int32_t)c;
        row_incl = own;
        for (int d = 1; d < 32; d *= 2) {
            const int32_t up = __shfl_up_sync(0xffffffffu, row_incl, d);
            if (lane >= d) row_incl += up;
        }
        row_excl = row_incl - own;
        rows_total = __shfl_sync(0xffffffffu, row_incl, 31);
    } else {
        if (threadIdx.x == 0) {
            int bad_r = -1;
            uint32_t code = 0;
            int32_t acc = 0;
            for (int r = 0; r < a.R; r++) {
                const uint32_t c = flag_cnt[r];
                const bool refuse = c == EPXI_LL_BAD || c == kLLDup;
                if (refuse && bad_r < 0) {
                    bad_r = r;
                    code = c == kLLDup ? F_DUP_SLOT : F_BAD_SLOT;
                }
                first_row[r] = acc;
                acc += refuse ? 0 : (int32_t)c;
            }
            first_row[a.R] = acc;
            s_any_bad = bad_r;
            s_bad_code = code;
        }
        __syncthreads();
        any_bad = s_any_bad;
        bad_code = s_bad_code;
        rows_total = first_row[a.R];
    }
    const bool refused = any_bad >= 0;
    if (sending) started = prefetch_started(&a.ctl->de_started);
    /* The meta and the row of this block's first item are loaded before the
     * counts are summed, so the trips to memory overlap. */
    /* items: (received row, k), int32 (rows * K <= R * max_tokens * top_k).
     * The last block is the range block (the slot ranges below) and the
     * others place; a grid of one does both. */
    const int32_t items = refused ? 0 : rows_total * K;
    const int32_t placing = gridDim.x > 1 ? (int32_t)gridDim.x - 1 : 1;
    const bool range_block = blockIdx.x == gridDim.x - 1;
    /* Item (row, k)'s source, token and k; called by whole warps alike (the
     * warp_rows form votes over the lanes). */
    auto item_rec = [&](int32_t item, int *s_out, int32_t *t_out, int *k_out) {
        const int32_t vrow = item / K;
        int s = 0;
        int32_t below = 0; /* rows of the sources below s */
        if (warp_rows) {
            s = __popc(__ballot_sync(0xffffffffu, lane < a.R && row_incl <= vrow));
            below = __shfl_sync(0xffffffffu, row_excl, s);
        } else {
            while (first_row[s + 1] <= vrow) s++;
            below = first_row[s];
        }
        *s_out = s;
        *t_out = vrow - below;
        *k_out = item - vrow * K;
        return rec_at(a, a.base, epoch, s, *t_out);
    };
    STAMP(a, 19);
    Meta first_meta = {-1, 0.0f, 0, 0};
    int s0 = 0, k0 = 0;
    int32_t t0 = 0;
    const unsigned char *rec0 = nullptr;
    if ((int32_t)blockIdx.x < items && (int32_t)blockIdx.x < placing && (kLean || !a.host_inbox) &&
        !a.compact) {
        rec0 = item_rec(blockIdx.x, &s0, &t0, &k0);
        if (threadIdx.x == 0) first_meta = ((const Meta *)(rec0 + a.meta_off))[k0];
        if (pre) regs_load(v, rec0, a.xrow);
    }
    if (refused && blockIdx.x == 0 && threadIdx.x == 0) {
        /* Nobody runs an expert on a refused batch; combine yields zeros. */
        a.ctl->refused = 1;
        raise_refused(a, bad_code, (uint32_t)any_bad, epoch);
    } else if (!refused && blockIdx.x == 0 && threadIdx.x == 0) {
        a.ctl->refused = 0;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) a.ctl->ditems = items; /* the combine's work list */
    /* Per local slot: its count and each source's range of rows, by the
     * range block alone (the host launches one block more than the items
     * need), so no placing block carries this trip to memory. */
    for (int64_t l = range_block ? threadIdx.x : a.spr; l < a.spr; l += blockDim.x) {
        int64_t acc = 0;
        for (int s = 0; s < a.R; s++) {
            const int64_t c = refused || !live[s] ? 0 : *cnt_at(a, a.base, epoch, s, (int32_t)l);
            a.range[l * a.R + s] = (acc << 32) | c;
            acc += c;
        }
        a.count[l] = (int32_t)acc;
    }
    STAMP(a, 20);
    if (refused) {
        advance();
        return;
    }
    if (a.compact) {
        receive_compact(a, epoch, first_row, items, live, ids, range_block);
        STAMP(a, 4);
        advance();
        return;
    }
    if (!kLean && a.host_inbox) {
        place_rows(a, epoch, first_row, (int64_t)first_row[a.R], live, fp8);
        STAMP(a, 4);
        STAMP_CLOCK(a, 7);
        advance();
        return;
    }
    /* Place: items (received row, k), over the placing blocks. */
    __shared__ int64_t dst_row;
    for (int32_t item = blockIdx.x; item < items && (int32_t)blockIdx.x < placing;
         item += placing) {
        const bool first = item == (int32_t)blockIdx.x;
        int s = s0, k = k0;
        int32_t t = t0;
        const unsigned char *rec = first ? rec0 : item_rec(item, &s, &t, &k);
        if (pre && !first) regs_load(v, rec, a.xrow);
        if (threadIdx.x == 0) {
            const Meta m = first ? first_meta : ((const Meta *)(rec + a.meta_off))[k];
            dst_row = place_entry(a, epoch, m, s, t, k, live, item);
        }
        __syncthreads();
        STAMP(a, 21);
        const int64_t e = dst_row;
        if (e >= 0 && fp8) {
            place_fp8(a, rec, e, fp8 & kUE8M0);
        } else if (e >= 0) {
            unsigned char *out = a.rx + (size_t)e * a.xrow;
            if (pre)
                regs_store(out, v, a.xrow);
            else
                block_copy(out, rec, a.xrow);
        }
        __syncthreads();
    }
    STAMP(a, 4);
    STAMP_CLOCK(a, 7);
    advance();
}

/* The entries of this rank, by the whole block: so[0..spr] in shared
 * memory, the exclusive prefix of the per-slot counts. */
__device__ void entry_starts(const Args &a, int32_t *so) {
    for (int l = threadIdx.x; l < a.spr; l += blockDim.x) so[l] = a.count[l];
    __syncthreads();
    block_scan_smem(so, a.spr);
}

/* Identity experts: y = x of each entry row, in y's dtype (normal mode: of
 * each entry's inbox row); after an fp8
 * dispatch (fp8: its kernel bits) the dequantised row, data * scale as
 * DeepEP's per_token_cast_back. */
__global__ void __launch_bounds__(kThreads) identity_kernel(Args a, int fp8) {
    __shared__ int32_t so[kMaxLocal + 1];
    if (block_faulted(a)) return;
    entry_starts(a, so);
    const int32_t n = so[a.spr];
    const int G = a.H / EPXI_FP8_GROUP;
    for (int32_t j = blockIdx.x; j < n; j += gridDim.x) {
        const int l = upper_index(so, a.spr, j);
        /* normal mode: entry j is row j, its x where its sender wrote it */
        const int64_t e = a.compact ? j : (int64_t)l * a.RM + (j - so[l]);
        const unsigned char *src =
            a.compact ? a.base + a.off_rows + (size_t)a.etok[j] * a.rec : a.rx + (size_t)e * a.xrow;
        unsigned char *dst = a.y + (size_t)e * a.yrow;
        if (fp8) {
            const int64_t s = e - (int64_t)l * a.RM;
            const unsigned char *data = a.rx + (size_t)e * (size_t)a.H;
            for (int h = threadIdx.x; h < a.H; h += blockDim.x) {
                const int g = h / EPXI_FP8_GROUP;
                float scale;
                if (fp8 & kUE8M0) {
                    const uint32_t w = ((const uint32_t *)fp8_scales(
                        a))[((size_t)l * (G / 4) + g / 4) * (size_t)a.RM + (size_t)s];
                    scale = __uint_as_float(((w >> (8 * (g % 4))) & 0xffu) << 23);
                } else {
                    scale = ((const float *)fp8_scales(
                        a))[((size_t)l * G + g) * (size_t)a.RM + (size_t)s];
                }
                epxi_row_store(dst, h, epxi_e4m3_to_f32(data[h]) * scale, a.ybf16);
            }
        } else if (a.xbf16 == a.ybf16) {
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
 * w[k] are staged in shared memory; out is fp32 or bf16 (rounded once);
 * the 16-byte loads of eight rows are issued before any is summed, so a
 * top-8 token costs one trip to memory (held raw, 32 registers, and widened
 * as summed).
 */
template <int BF16, bool kWhole = false>
__device__ void reduce_lanes(const Args &a, const unsigned char *const *rows, const float *w,
                             int64_t h0, void *out, int out_bf16) {
    constexpr int V = Lanes<BF16>::V, B = 8;
    const int K = a.K;
    /* The row's tail (or unaligned rows): element by element. kWhole: the
     * caller knows every lane is whole (H % V == 0, aligned rows). */
    if (!kWhole && !(h0 + V <= a.H && a.yrow % 16 == 0)) {
        for (int64_t h = h0; h < h0 + V && h < a.H; h++)
            epxi_row_store(out, h, epxi_ep_combine_elem(rows, w, K, h, BF16), out_bf16);
        return;
    }
    {
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
        for (int j = 0; j < V; j++) epxi_row_store(out, h0 + j, acc[j], out_bf16);
    }
}

/*
 * Combine. parts & 1 (send): every block finds this rank's entries from the
 * per-slot counts, sends its share of them (entry (s, t, k)'s output row to
 * row t * K + k of rank s) and counts in; the last block publishes the
 * flags. parts & 2 (receive): every block waits for all flags and reduces
 * its share of this rank's tokens. ysrc [spr][RM] rows and wsrc [T][K] are
 * the caller's or the handle's own. Combines count their own epochs.
 * kLean: bf16 outputs, H % 8 == 0, 16-byte aligned rows (epx_gpu_ep_combine_parts
 * decides on the host): the
 * instance without the other widths' code (dispatch_kernel says why).
 */
template <bool kLean>
__global__ void __launch_bounds__(kThreads, 2)
    combine_kernel(Args a, int64_t T, const unsigned char *ysrc, const float *wsrc, void *out,
                   int out_bf16, int parts) {
    /* The epoch, the fault word, the peer table, the dispatch's item count
     * and this block's first item are loaded before the first barrier, so
     * the trips to memory overlap. */
    __shared__ uint32_t s_epoch;
    __shared__ int s_dead;
    __shared__ int32_t s_items;
    __shared__ Work s_first;
    STAMP(a, 15);
    if (threadIdx.x == 0) {
        s_epoch = take_epoch(&a.ctl->ce_started, (parts & 1) != 0);
        read_fault(a, &s_dead);
        s_items = (parts & 1) ? a.ctl->ditems : 0;
        if ((parts & 1) && (int64_t)blockIdx.x < a.RM * a.K) s_first = a.work[blockIdx.x];
    }
    const bool refused = a.ctl->refused != 0;  /* set by this rank's dispatch, before us */
    __shared__ unsigned char *peer[kMaxRanks]; /* the peer table, read once */
    __shared__ uint8_t live[kMaxRanks];        /* ranks sent to, then sources received from */
    for (int r = threadIdx.x; r < a.R; r += blockDim.x) peer[r] = a.peers[r];
    __syncthreads();
    const uint32_t epoch = s_epoch;
    if (s_dead) return;
    live_ranks(a, live);
    STAMP(a, 8);
    const int K = a.K;
    /* Sent and received in one launch, this rank's own rows are read from
     * ysrc where they are. Split in two (a receive hook, a staging
     * transport), they are copied like the others': the caller may reuse y
     * once the send has run, as DeepEP's hook allows. */
    const bool own_direct = (parts & 3) == 3;
    if (parts & 1) {
        /* The dispatch's items (Work), a block's share by stride; int32
         * counters (items and pairs < R * max_tokens * top_k < 2^31). */
        const int32_t n = s_items;
        const int32_t MK = (int32_t)a.M * K;
        for (int32_t item = blockIdx.x; item < n; item += gridDim.x) {
            const Work w = item == (int32_t)blockIdx.x ? s_first : a.work[item];
            if (w.e < 0) continue; /* no entry here (another rank's k, or none) */
            const int64_t e = w.e;
            const int32_t src = w.pair / MK, tk = w.pair - src * MK;
            if (!live[src] || (own_direct && src == a.me)) continue;
            unsigned char *dst = comb_at(a, peer[src], epoch, (int)src) + (size_t)tk * a.yrow;
            if (kLean)
                copy_words<int4>(dst, ysrc + (size_t)e * a.yrow, a.yrow);
            else
                block_copy(dst, ysrc + (size_t)e * a.yrow, a.yrow);
            STAMP(a, 25);
        }
        STAMP(a, 9);
        const uint32_t nwork = (uint32_t)(n < 1 ? 1 : n < gridDim.x ? n : gridDim.x);
        if (blockIdx.x < nwork)
            arrive(&a.ctl->arrive_c, nwork, 0, scope(a), [&](bool) {
                for (int r = 0; r < a.R; r++)
                    if (live[r])
                        st_release(cflag_at(a, peer[r], epoch, filed_as(a, r)),
                                   epxi_ll_flag(epoch, 0), scope(a));
            });
    }
    if (!(parts & 2)) {
        if (parts & 1) advance_epoch(a, &a.ctl->ce_started, epoch, PH_COMBINE);
        return;
    }
    STAMP(a, 10);
    /* Every block waits for every peer, then reduces its share: items of
     * (token, chunk of V * blockDim elements). The routing of a block's
     * first token is this rank's own, so it is staged before the wait and
     * only the rows are read after it. */
    const int V = kLean || a.ybf16 ? Lanes<1>::V : Lanes<0>::V;
    const int32_t Tn = (int32_t)T, per = V * (int32_t)blockDim.x, chunks = (a.H + per - 1) / per;
    const size_t orow = (size_t)a.H * (out_bf16 ? 2 : 4);
    __shared__ const unsigned char *rows[kMaxK];
    __shared__ float wk[kMaxK];
    auto stage = [&](int32_t t) {
        for (int k = threadIdx.x; k < K; k += blockDim.x) {
            const int32_t sl = a.slots[t * K + k];
            const int r = sl >= 0 ? sl / a.spr : -1;
            /* no row from a rank given up on (shrink mode): its experts' share
             * is dropped; this rank's own experts' rows are read from y
             * when the send ran in this launch (own_direct) */
            const bool direct = own_direct && r == a.me;
            const int64_t e = direct ? a.self_e[t * K + k] : -1;
            rows[k] = sl < 0 || refused || !live[r] ? nullptr
                      : !direct ? comb_at(a, a.base, epoch, r) + (size_t)(t * K + k) * a.yrow
                      : e >= 0  ? ysrc + (size_t)e * a.yrow
                                : nullptr;
            wk[k] = wsrc[t * K + k];
        }
    };
    const int32_t first_t = (int32_t)blockIdx.x < Tn * chunks ? (int32_t)blockIdx.x / chunks : -1;
    if (first_t >= 0) stage(first_t); /* wait_flags synchronises the block */
    if (!wait_flags(a, cflag_at(a, a.base, epoch, 0), sizeof(uint64_t), a.R, epoch, PH_COMBINE,
                    live, a.decided ? a.decided + a.R : nullptr,
                    a.host_inbox ? a.ctl->relay[1] : nullptr))
        return;
    const unsigned long long started = (parts & 1) ? prefetch_started(&a.ctl->ce_started) : 0;
    if (a.shrink && first_t >= 0) { /* live[] may have lost a rank while waiting */
        stage(first_t);
        __syncthreads();
    }
    STAMP(a, 11);
    for (int32_t item = blockIdx.x; item < Tn * chunks; item += gridDim.x) {
        const int32_t t = item / chunks, h0 = (item - t * chunks) * per + (int32_t)threadIdx.x * V;
        if (item != blockIdx.x) stage(t);
        __syncthreads();
        unsigned char *o = (unsigned char *)out + (size_t)t * orow;
        if (h0 < a.H) {
            if (kLean)
                reduce_lanes<1, true>(a, rows, wk, h0, o, out_bf16);
            else if (a.ybf16)
                reduce_lanes<1>(a, rows, wk, h0, o, out_bf16);
            else
                reduce_lanes<0>(a, rows, wk, h0, o, out_bf16);
        }
        if ((a.variant & 8) && blockIdx.x == 0 && threadIdx.x % 32 == 0 && threadIdx.x < 512)
            a.ctl->stamp[32 + threadIdx.x / 32] = now_ns();
        __syncthreads();
    }
    STAMP(a, 12);
    if (parts & 1) advance_epoch(a, &a.ctl->ce_started, epoch, PH_COMBINE, started);
}

} // namespace

/* What ranks tell each other at creation (EPX_GPU_EP_INFO_BYTES). */
struct PeerInfo {
    char magic[8]; /* kMagic */
    int32_t rank, pid, device;
    uint64_t ptr;        /* the peer-written area as its own process's kernels see it */
    epxi_ll_shape shape; /* the config every rank must share */
    int32_t transport;   /* EPX_GPU_EP_TRANSPORT_PEER or _HOST */
    unsigned char handle[EPXI_TR_HANDLE_BYTES]; /* the transport's (transport.h) */
    unsigned char uuid[16]; /* the GPU's, the same in every process that sees it */
    uint64_t process;       /* this process's random id: pids repeat across hosts and containers */
    uint64_t host;          /* this machine's id (epxi_host_id) */
};
static_assert(sizeof(PeerInfo) <= EPX_GPU_EP_INFO_BYTES, "PeerInfo fits its bytes");
static const char kMagic[8] = "epx-ll4"; /* bump when PeerInfo changes */
static_assert((int)EPXI_TR_AUTO == (int)EPX_GPU_EP_TRANSPORT_AUTO &&
                  (int)EPXI_TR_PEER == (int)EPX_GPU_EP_TRANSPORT_PEER &&
                  (int)EPXI_TR_HOST == (int)EPX_GPU_EP_TRANSPORT_HOST &&
                  (int)EPXI_TR_NCCL == (int)EPX_GPU_EP_TRANSPORT_NCCL,
              "transport.h's values are epx_gpu_ep_transport's");

/* A random id for this process, drawn once: ranks with the same id share an
 * address space (their pointers work as they are). */
static uint64_t g_process_id;
static void draw_process_id(void) {
    uint64_t v = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (f == NULL || fread(&v, sizeof v, 1, f) != 1) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v = ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20);
    }
    if (f != NULL) fclose(f);
    g_process_id = v | 1; /* never 0 */
}
static uint64_t process_id(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, draw_process_id);
    return g_process_id;
}

struct epx_gpu_ep {
    epx_comm *boot; /* NULL when opened without one (epx_gpu_ep_open) */
    epxi_ep_geom g;
    cudaStream_t stream;
    int32_t timeout_ms;
    int32_t wait_blocks; /* blocks that wait for flags must all be resident */
    size_t off_rx, off_y, off_count, off_pair, off_work, off_self, off_srctok, off_ew, off_etok,
        off_offs, off_range, off_weights, off_slots, off_ctl, off_peers, off_mask, off_decided,
        total, inbox_total;
    unsigned char *buf; /* this rank's work area (device memory) */
    /* The peer-written areas (transport.h): this rank's, and the peers' as
     * mapped here (ranks of this process are used through their pointers). */
    const epxi_transport_ops *tr;
    int32_t kind;           /* EPX_GPU_EP_TRANSPORT_PEER or _HOST */
    epxi_area inbox;        /* this rank's */
    epxi_area *areas;       /* host [R]: peers' areas mapped here (none for this process's) */
    unsigned char **mapped; /* host [R]: every rank's area as the kernels here see it */
    bool one_process;       /* every rank in this process (the peer transport's "pointers") */
    bool connected;
    bool was_connected; /* once: the host transport's segment names are gone after it */
    /* staging transports (NCCL): the outbox, the blocks of each phase and
     * the function that moves them (its context is owned here) */
    unsigned char *outbox;
    epxi_ll_phase_blocks wire[2];
    epxi_ll_exchange_fn exchange;
    epxi_ll_agree_fn agree;
    void *exchange_ctx;
    /* tokens per rank a dispatch carries at most (epx_gpu_ep_set_token_bound;
     * max_tokens until set): what a staged block holds, the rest unsent */
    int64_t bound;
    cudaEvent_t chain; /* orders launches across a change of stream (set_stream) */
    uint32_t *host_fault, *host_fault_dev;
    Args a;
    int64_t T;
    /* Where the calls stand: a dispatch may follow a dispatch or a combine
     * (double-buffered), a combine only a whole dispatch; a half sent must
     * be received before anything else. */
    enum { IDLE, D_SENT, DISPATCHED, C_SENT } state;
    int fp8; /* the last dispatch's fp8 bits (kFP8 | ...), for its receive and the experts */
    /* a split combine's receive reuses its send's arguments */
    const float *c_w;
    void *c_out;
    int c_bf16;
    bool reported;
};

/* Tokens per rank at most from now on, and so the staged blocks' bytes: a
 * source's records are filed at its token index t (rec_at) and the rows it
 * gets back at t * K + k (comb_at), after the flag and counts, so a block's
 * first bytes up to `bound` of each cover every rank's. */
static void set_bound(epx_gpu_ep *ep, int64_t bound) {
    ep->bound = bound;
    ep->wire[0].bytes[0] = ep->a.drows + (size_t)bound * ep->a.rec;
    ep->wire[1].bytes[0] = kFlagBytes + (size_t)bound * ep->g.K * ep->g.yrow;
}

/* What normal mode (EPX_EP_MODE_NORMAL: the compact receive) does not do
 * yet, refused by name: a bounded receive, per-rank partial sums, more
 * local slots than a block scans in shared memory, and the staging (nccl)
 * transport, whose blocks do not keep the rows at one stride. */
static epx_status check_normal(const epxi_ep_geom *g, bool staging, epx_error *err) {
    const epx_ep_config *c = &g->cfg;
    if (c->max_recv_tokens != 0 || c->max_recv_entries != 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "the GPU engine's normal mode holds the worst case (R * max_tokens "
                         "tokens): set max_recv_tokens (%lld) and max_recv_entries (%lld) to 0, "
                         "or use epx_nccl_ep_create for a bounded receive",
                         (long long)c->max_recv_tokens, (long long)c->max_recv_entries);
    if (c->combine != EPX_EP_COMBINE_TOPK)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "the GPU engine's normal mode combines in top-k order: set combine to "
                         "EPX_EP_COMBINE_TOPK, or use epx_nccl_ep_create for per-rank partials");
    if (g->spr > kMaxLocal)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "the GPU engine's normal mode groups at most %d local slots per rank, "
                         "not %d (num_slots %d / %d ranks): use more ranks or epx_nccl_ep_create",
                         kMaxLocal, g->spr, g->P, g->R);
    if (staging)
        return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                         "the GPU engine's normal mode runs over the peer transport only, not "
                         "nccl: use epx_nccl_ep_create across nodes");
    return EPX_OK;
}

/* The buffer layout, shared by the size query and creation. */
static epx_status plan(epx_gpu_ep *ep, const epx_ep_config *cfg, int32_t R, bool staging,
                       epx_error *err) {
    EPX_TRY(epxi_ep_geom_init(cfg, R, &ep->g, err));
    const epxi_ep_geom *g = &ep->g;
    if (R > kMaxRanks - 1)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "the GPU low-latency engine serves at most %d ranks, not %d",
                         kMaxRanks - 1, R);
    /* Normal mode: the same protocol with a compact receive (Args::compact). */
    const bool compact = !g->low_latency;
    if (compact) EPX_TRY(check_normal(g, staging, err));
    const double M = (double)g->M, K = g->K, RM = (double)R * M, spr = g->spr;
    /* Entry rows: normal mode holds the most this rank can receive, R *
     * max_tokens tokens of min(top_k, local slots) entries each. */
    const double NE = compact ? RM * (K < spr ? K : spr) : spr * RM;
    if (compact && 2.0 * RM >= 2147483647.0)
        return epxi_fail(err, EPX_ERR_OVERFLOW,
                         "the GPU engine's normal mode indexes 2 * R * max_tokens = %.0f inbox "
                         "rows in int32: lower max_tokens (%lld)",
                         2.0 * RM, (long long)g->M);
    /* Entry rows are int32 (pair = (source * M + token) * K + k). */
    if (RM * K >= 2147483647.0 || RM * spr >= 9.0e15)
        return epxi_fail(err, EPX_ERR_OVERFLOW,
                         "the GPU low-latency engine indexes R * max_tokens * top_k = %.0f "
                         "entries in int32: lower max_tokens (%lld)",
                         RM * K, (long long)g->M);
    /* The combine's items (token, chunk of 4 * kThreads values or more) are int32 too. */
    const double chunks = (double)((g->H + 4 * kThreads - 1) / (4 * kThreads));
    if (M * chunks >= 2147483647.0)
        return epxi_fail(err, EPX_ERR_OVERFLOW,
                         "the GPU low-latency engine counts max_tokens * ceil(hidden / %d) = "
                         "%.0f combine items in int32: lower max_tokens (%lld) or hidden (%d)",
                         4 * kThreads, M * chunks, (long long)g->M, g->H);
    const size_t meta_off = (g->xrow + 15) / 16 * 16, rec = meta_off + (size_t)K * sizeof(Meta);
    size_t off_rows = 0, off_cnt = 0, off_dflag = 0, off_comb = 0, off_cflag = 0;
    /* A staging transport's blocks per peer (Args::dblk), 256-byte aligned. */
    const size_t drows = kFlagBytes + ((size_t)g->spr * sizeof(int32_t) + 15) / 16 * 16;
    const size_t dblk = (drows + (size_t)g->M * rec + 255) / 256 * 256;
    const size_t cblk = (kFlagBytes + (size_t)g->M * g->K * g->yrow + 255) / 256 * 256;
    /* What peers write, where the transport puts it (a.base). */
    epxi_ws_part inbox[] = {
        /* the dispatch areas twice: by the parity of the epoch (dflag_at) */
        {&off_rows, 2 * RM, (double)rec},
        {&off_cnt, 2.0 * R * spr, sizeof(int32_t)},
        {&off_dflag, 2.0 * R, sizeof(uint64_t)},
        /* the combine areas twice: by the parity of the combine's epoch */
        {&off_comb, 2.0 * M * K, (double)g->yrow},
        {&off_cflag, 2.0 * R, sizeof(uint64_t)},
    };
    /* Staging: one buffer (no parity), a block per peer and phase. */
    epxi_ws_part staged[] = {
        {&off_dflag, (double)R, (double)dblk},
        {&off_cflag, (double)R, (double)cblk},
    };
    if (staging)
        EPX_TRY(epxi_ws_carve(staged, 2, 256, &ep->inbox_total, "GPU low-latency EP", err));
    else
        EPX_TRY(epxi_ws_carve(inbox, sizeof inbox / sizeof inbox[0], 256, &ep->inbox_total,
                              "GPU low-latency EP", err));
    /* What only this rank's kernels touch: always device memory. */
    epxi_ws_part parts[] = {
        {&ep->off_rx, compact ? 0.0 : spr * RM, (double)g->xrow}, /* normal mode: none */
        {&ep->off_y, NE, (double)g->yrow},
        {&ep->off_count, spr, sizeof(int32_t)},
        {&ep->off_pair, NE, sizeof(int32_t)},
        {&ep->off_work, RM * K, sizeof(Work)},   /* the dispatch's items, for the combine */
        {&ep->off_self, M * K, sizeof(int64_t)}, /* own entries' rows, for the combine */
        {&ep->off_srctok, NE, sizeof(int32_t)},
        {&ep->off_ew, NE, sizeof(float)},
        {&ep->off_etok, compact ? NE : 0.0, sizeof(int32_t)}, /* normal mode's entry rows */
        {&ep->off_offs, spr + 1, sizeof(int64_t)},
        {&ep->off_range, spr * R, sizeof(int64_t)},
        {&ep->off_weights, M * K, sizeof(float)},
        {&ep->off_slots, M * K, sizeof(int32_t)},
        {&ep->off_ctl, 1, sizeof(Ctl)},
        {&ep->off_peers, (double)R, sizeof(void *)},
        /* shrink mode: the handle's own mask, and its decisions per phase */
        {&ep->off_mask, (double)R, sizeof(int32_t)},
        {&ep->off_decided, 2.0 * R, sizeof(unsigned long long)},
    };
    EPX_TRY(epxi_ws_carve(parts, sizeof parts / sizeof parts[0], 256, &ep->total,
                          "GPU low-latency EP", err));
    Args &a = ep->a;
    a.R = R;
    a.K = g->K;
    a.H = g->H;
    a.spr = g->spr;
    a.P = g->P;
    a.M = g->M;
    a.RM = (int64_t)R * g->M;
    a.compact = compact;
    a.NE = (int64_t)NE;
    a.rec = rec;
    a.xrow = g->xrow;
    a.yrow = g->yrow;
    a.meta_off = meta_off;
    a.off_rows = off_rows;
    a.off_cnt = off_cnt;
    a.off_dflag = off_dflag;
    a.off_comb = off_comb;
    a.off_cflag = off_cflag;
    a.dblk = dblk;
    a.drows = drows;
    a.cblk = cblk;
    a.xbf16 = g->cfg.x_dtype == EPX_DTYPE_BF16;
    a.ybf16 = g->cfg.y_dtype == EPX_DTYPE_BF16;
    a.staging = staging;
    /* A staging transport's block per peer and phase, peer r at off + r *
     * stride: one send and one receive per peer (bytes: set_bound). */
    epxi_ll_phase_blocks *d = &ep->wire[0], *c = &ep->wire[1];
    d->R = c->R = R;
    d->nparts = c->nparts = 1;
    d->off[0] = off_dflag, d->stride[0] = dblk;
    c->off[0] = off_cflag, c->stride[0] = cblk;
    set_bound(ep, g->M);
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_buffer_bytes(const epx_ep_config *cfg, int32_t num_ranks,
                                              size_t *bytes, epx_error *err) {
    if (bytes == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "bytes must not be NULL");
    epx_gpu_ep tmp{};
    EPX_TRY(plan(&tmp, cfg, num_ranks, false, err));
    *bytes = tmp.total + tmp.inbox_total;
    return EPX_OK;
}

/* Every rank's info, over the bootstrap communicator (host or device
 * memory). */
static epx_status allgather_info(epx_comm *comm, const void *mine, void *all, epx_error *err) {
    const int32_t R = epx_comm_size(comm);
    const size_t n = EPX_GPU_EP_INFO_BYTES;
    int64_t *cnt = (int64_t *)epxi_calloc((size_t)2 * R, sizeof(int64_t), "EP bootstrap", err);
    unsigned char *send = (unsigned char *)epxi_calloc((size_t)R, n, "EP bootstrap", err);
    epx_status st = cnt && send ? EPX_OK : EPX_ERR_NOMEM;
    void *dsend = NULL, *drecv = NULL;
    for (int32_t r = 0; st == EPX_OK && r < R; r++) {
        cnt[r] = 1;
        cnt[R + r] = r;
        memcpy(send + (size_t)r * n, mine, n);
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
    cudaFree(dsend);
    cudaFree(drecv);
    free(cnt);
    free(send);
    return st;
}

/* Release the peers' areas mapped here (connect undone). */
static void unmap_peers(epx_gpu_ep *ep) {
    for (int32_t r = 0; ep->areas != NULL && r < ep->a.R; r++) {
        if (ep->areas[r].dev != NULL) ep->tr->release(&ep->areas[r]);
        ep->mapped[r] = NULL;
    }
}

extern "C" void epx_gpu_ep_destroy(epx_gpu_ep *ep) {
    if (ep == NULL) return;
    cudaStreamSynchronize(ep->stream);
    epx_error err = {};
    /* No peer may write into, or still map, a buffer that is freed. */
    bool healthy = ep->boot != NULL && epx_comm_health(ep->boot, NULL) == EPX_OK;
    if (healthy) healthy = epx_comm_barrier(ep->boot, &err) == EPX_OK;
    unmap_peers(ep);
    if (healthy) epx_comm_barrier(ep->boot, &err);
    if (ep->chain) cudaEventDestroy(ep->chain);
    if (ep->tr != NULL) ep->tr->release(&ep->inbox);
    cudaFree(ep->outbox);
    free(ep->exchange_ctx);
    cudaFree(ep->buf);
    if (ep->host_fault) cudaFreeHost(ep->host_fault);
    free(ep->mapped);
    free(ep->areas);
    free(ep);
}

/* A GPU this process sees that `dev` cannot reach by peer access, or -1:
 * AUTO then picks host memory (epxi_transport_resolve). */
static int unreachable_gpu(int dev) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    for (int d = 0; d < n; d++) {
        int can = 1;
        if (d != dev && cudaDeviceCanAccessPeer(&can, dev, d) == cudaSuccess && !can) return d;
    }
    (void)cudaGetLastError();
    return -1;
}

/* epx_gpu_ep_open, or with `exchange` a staging transport's engine. */
static epx_status open_engine(const epx_ep_config *cfg, int32_t rank, int32_t num_ranks,
                              cudaStream_t stream, const epx_gpu_ep_opts *opts,
                              epxi_ll_exchange_fn exchange, epx_gpu_ep **out, epx_error *err) {
    if (out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "epx_gpu_ep_open needs an out pointer");
    *out = NULL;
    if (num_ranks < 1 || rank < 0 || rank >= num_ranks)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP rank %d of %d ranks: need 0 <= rank < num_ranks and num_ranks "
                         ">= 1",
                         rank, num_ranks);
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
                         "GPU EP timeout_ms (%d) must be >= 1 and max_blocks (%d) >= 0 (0 = as "
                         "many as fit on the GPU at once)",
                         o.timeout_ms, o.max_blocks);
    if (o.shrink != 0 && o.shrink != 1)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP shrink is %d: give 1 (mask a peer that times out and go on) or 0",
                         o.shrink);
    if (!o.shrink && o.mask != NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP mask is given but shrink is 0: the mask is shrink mode's; set "
                         "shrink = 1 or drop the mask");
    if (o.shrink && exchange != NULL)
        return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                         "GPU EP shrink mode needs the peer or host transport: the nccl "
                         "transport's send/receive cannot skip a peer that stopped");
    epx_gpu_ep *ep = (epx_gpu_ep *)epxi_calloc(1, sizeof *ep, "GPU EP handle", err);
    if (ep == NULL) return EPX_ERR_NOMEM;
    ep->stream = stream;
    ep->timeout_ms = o.timeout_ms;
    epx_status st = plan(ep, cfg, num_ranks, exchange != NULL, err);
    const int32_t R = num_ranks;
    int dev = 0, sms = 0;
    if (st != EPX_OK) goto fail;
    ep->a.me = rank;
    EPXI_CUDA_GOTO(st, cudaGetDevice(&dev), "GPU EP: current device", fail);
    EPXI_CUDA_GOTO(st, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
                   "GPU EP: SM count", fail);
    {
        /* Every block of both kernels waits for flags, so all must be
         * resident at once, or the ones still queued could never publish
         * theirs. At most 65535: blocks count in on 16 bits (arrive). */
        const void *kernels[6] = {
            (const void *)combine_kernel<false>,         (const void *)combine_kernel<true>,
            (const void *)dispatch_kernel<false, false>, (const void *)dispatch_kernel<true, false>,
            (const void *)dispatch_kernel<false, true>,  (const void *)dispatch_kernel<true, true>};
        int per_sm = INT_MAX;
        for (const void *k : kernels) {
            int n = 0;
            EPXI_CUDA_GOTO(st, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, kThreads, 0),
                           "GPU EP: occupancy", fail);
            if (n < per_sm) per_sm = n;
        }
        int cap = per_sm * sms;
        if (o.max_blocks > 0 && o.max_blocks < cap) cap = o.max_blocks;
        if (cap > 0xffff) cap = 0xffff;
        ep->wait_blocks = cap < 1 ? 1 : cap;
    }
    EPXI_CUDA_GOTO(st, cudaEventCreateWithFlags(&ep->chain, cudaEventDisableTiming), "GPU EP event",
                   fail);
    if (exchange != NULL)
        ep->kind = EPX_GPU_EP_TRANSPORT_NCCL;
    else
        st = epxi_transport_resolve(o.transport, getenv("EPX_GPU_EP_TRANSPORT"),
                                    unreachable_gpu(dev), &ep->kind, err);
    if (st != EPX_OK) goto fail;
    if (ep->a.compact && (ep->kind == EPX_GPU_EP_TRANSPORT_HOST || o.shrink)) {
        st = epxi_fail(err, EPX_ERR_UNSUPPORTED,
                       "the GPU engine's normal mode runs over the peer transport without shrink "
                       "mode only (%s asked for): use low-latency mode, or epx_nccl_ep_create",
                       o.shrink ? "shrink" : "the host transport");
        goto fail;
    }
    ep->tr = ep->kind == EPX_GPU_EP_TRANSPORT_HOST ? &epxi_transport_host : &epxi_transport_peer;
    ep->a.host_inbox = ep->kind == EPX_GPU_EP_TRANSPORT_HOST;
    st = ep->tr->alloc(ep->inbox_total, R, &ep->inbox, err);
    if (st != EPX_OK) goto fail;
    if (exchange != NULL) {
        /* sends filed by destination, then moved by the transport */
        EPXI_CUDA_GOTO(st, cudaMalloc((void **)&ep->outbox, ep->inbox_total), "GPU EP outbox",
                       fail);
        EPXI_CUDA_GOTO(st, cudaMemset(ep->outbox, 0, ep->inbox_total), "GPU EP outbox", fail);
        ep->exchange = exchange;
        for (int i = 0; i < 2; i++) {
            ep->wire[i].outbox = ep->outbox;
            ep->wire[i].inbox = ep->inbox.dev;
        }
    }
    EPXI_CUDA_GOTO(st, cudaMalloc((void **)&ep->buf, ep->total), "GPU EP buffer", fail);
    EPXI_CUDA_GOTO(st, cudaMemset(ep->buf, 0, ep->total), "GPU EP buffer", fail);
    EPXI_CUDA_GOTO(
        st, cudaHostAlloc((void **)&ep->host_fault, 8 * sizeof(uint32_t), cudaHostAllocMapped),
        "GPU EP fault word", fail);
    memset(ep->host_fault, 0, 8 * sizeof(uint32_t));
    EPXI_CUDA_GOTO(st, cudaHostGetDevicePointer((void **)&ep->host_fault_dev, ep->host_fault, 0),
                   "GPU EP fault word", fail);
    ep->mapped = (unsigned char **)epxi_calloc((size_t)R, sizeof(void *), "GPU EP peers", err);
    ep->areas = (epxi_area *)epxi_calloc((size_t)R, sizeof(epxi_area), "GPU EP peers", err);
    if (ep->mapped == NULL || ep->areas == NULL) {
        st = EPX_ERR_NOMEM;
        goto fail;
    }
    {
        Args &a = ep->a;
        a.base = ep->inbox.dev;
        a.peers = (unsigned char *const *)(ep->buf + ep->off_peers);
        a.rx = ep->buf + ep->off_rx;
        a.y = ep->buf + ep->off_y;
        a.count = (int32_t *)(ep->buf + ep->off_count);
        a.pair = (int32_t *)(ep->buf + ep->off_pair);
        a.work = (Work *)(ep->buf + ep->off_work);
        a.self_e = (int64_t *)(ep->buf + ep->off_self);
        a.srctok = (int32_t *)(ep->buf + ep->off_srctok);
        a.ew = (float *)(ep->buf + ep->off_ew);
        a.etok = (int32_t *)(ep->buf + ep->off_etok);
        a.offs = (int64_t *)(ep->buf + ep->off_offs);
        a.range = (int64_t *)(ep->buf + ep->off_range);
        a.weights = (float *)(ep->buf + ep->off_weights);
        a.slots = (int32_t *)(ep->buf + ep->off_slots);
        a.ctl = (Ctl *)(ep->buf + ep->off_ctl);
        a.host_fault = ep->host_fault_dev;
        a.timeout_ns = (unsigned long long)ep->timeout_ms * 1000000ull;
        a.shrink = o.shrink;
        a.mask = o.mask != NULL ? o.mask : (int32_t *)(ep->buf + ep->off_mask);
        a.decided = (unsigned long long *)(ep->buf + ep->off_decided);
    }
    *out = ep;
    return EPX_OK;
fail:
    epx_gpu_ep_destroy(ep);
    return st;
}

extern "C" epx_status epx_gpu_ep_open(const epx_ep_config *cfg, int32_t rank, int32_t num_ranks,
                                      cudaStream_t stream, const epx_gpu_ep_opts *opts,
                                      epx_gpu_ep **out, epx_error *err) {
    return open_engine(cfg, rank, num_ranks, stream, opts, NULL, out, err);
}

/* A staging transport's engine, connected at once: every peer pointer is
 * the outbox, and `ops->exchange(ctx, ...)` moves each phase's blocks (ctx
 * is freed with the handle). GPU scope suffices: the flags are read only after
 * the transport's copy, in stream order. For transport_nccl.cu. */
extern "C" EPXI_HIDDEN epx_status epxi_gpu_ep_open_staging(const epx_ep_config *cfg, int32_t rank,
                                                           int32_t num_ranks, cudaStream_t stream,
                                                           const epx_gpu_ep_opts *opts,
                                                           const epxi_ll_staging *ops,
                                                           epx_gpu_ep **out, epx_error *err) {
    epx_gpu_ep *ep = NULL;
    epx_status st = open_engine(cfg, rank, num_ranks, stream, opts, ops->exchange, &ep, err);
    if (st != EPX_OK) {
        free(ops->ctx);
        return st;
    }
    ep->exchange_ctx = ops->ctx;
    ep->agree = ops->agree;
    for (int32_t r = 0; r < num_ranks; r++) ep->mapped[r] = ep->outbox;
    const cudaError_t ce = cudaMemcpy(ep->buf + ep->off_peers, ep->mapped,
                                      (size_t)num_ranks * sizeof(void *), cudaMemcpyHostToDevice);
    if (ce != cudaSuccess) {
        st = epxi_cuda_fail(ce, "GPU EP peer table", err);
        epx_gpu_ep_destroy(ep);
        return st;
    }
    ep->a.one_gpu = 1;
    ep->connected = ep->was_connected = true;
    *out = ep;
    return EPX_OK;
}

/* Move a phase's staged blocks (staging transports), between its kernels. */
static epx_status exchange_phase(epx_gpu_ep *ep, int phase, epx_error *err) {
    if (ep->exchange == NULL) return EPX_OK;
    return ep->exchange(ep->exchange_ctx, &ep->wire[phase], (void *)ep->stream, err);
}

extern "C" epx_status epx_gpu_ep_info(const epx_gpu_ep *ep, void *info, epx_error *err) {
    if (ep == NULL || info == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP info needs a handle and a buffer");
    if (ep->exchange != NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP info: an engine of the nccl transport maps no peers (it was "
                         "connected when epx_gpu_ep_create_nccl created it)");
    PeerInfo p;
    memset(&p, 0, sizeof p);
    memcpy(p.magic, kMagic, sizeof p.magic);
    p.rank = ep->a.me;
    p.pid = (int32_t)getpid();
    p.process = process_id();
    cudaPointerAttributes at;
    EPXI_CUDA_TRY(cudaPointerGetAttributes(&at, ep->buf), "GPU EP: the buffer's device");
    p.device = at.device;
    cudaDeviceProp prop;
    EPXI_CUDA_TRY(cudaGetDeviceProperties(&prop, at.device), "GPU EP: the GPU's UUID");
    memcpy(p.uuid, prop.uuid.bytes, sizeof p.uuid);
    p.ptr = (uint64_t)(uintptr_t)ep->inbox.dev;
    p.transport = ep->kind;
    p.host = epxi_host_id();
    p.shape = epxi_ll_shape_of(&ep->g.cfg, ep->a.R);
    EPX_TRY(ep->tr->handle(&ep->inbox, p.handle, err));
    memset(info, 0, EPX_GPU_EP_INFO_BYTES);
    memcpy(info, &p, sizeof p);
    return EPX_OK;
}

/* Every rank opened with this rank's transport, and it reaches them all. */
/* Shrink mode: an info of all zero bytes stands for a rank that never
 * opened (it stopped before creating the engine); it is masked at connect. */
static bool absent_info(const epx_gpu_ep *ep, const void *infos, int32_t r) {
    const unsigned char *b = (const unsigned char *)infos + (size_t)r * EPX_GPU_EP_INFO_BYTES;
    if (!ep->a.shrink || r == ep->a.me) return false;
    for (size_t i = 0; i < EPX_GPU_EP_INFO_BYTES; i++)
        if (b[i] != 0) return false;
    return true;
}

static epx_status check_transport(const epx_gpu_ep *ep, const void *infos, const PeerInfo *mine,
                                  int dev, epx_error *err) {
    const int32_t R = ep->a.R;
    epxi_tr_rank *t = (epxi_tr_rank *)epxi_calloc((size_t)R, sizeof *t, "GPU EP peers", err);
    if (t == NULL) return EPX_ERR_NOMEM;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    for (int32_t r = 0; r < R; r++) {
        PeerInfo p;
        /* an absent rank is checked as this one (nothing of it is mapped) */
        memcpy(&p,
               absent_info(ep, infos, r)
                   ? (const void *)mine
                   : (const unsigned char *)infos + (size_t)r * EPX_GPU_EP_INFO_BYTES,
               sizeof p);
        t[r].kind = p.transport;
        t[r].host = p.host;
        t[r].device = p.device;
        t[r].same_gpu = memcmp(p.uuid, mine->uuid, sizeof p.uuid) == 0;
        t[r].reach = -1; /* a GPU this process does not see */
        for (int d = 0; d < n && !t[r].same_gpu; d++) {
            cudaDeviceProp prop;
            int can = 0;
            if (cudaGetDeviceProperties(&prop, d) == cudaSuccess &&
                memcmp(prop.uuid.bytes, p.uuid, sizeof p.uuid) == 0 &&
                cudaDeviceCanAccessPeer(&can, dev, d) == cudaSuccess)
                t[r].reach = (int8_t)(can != 0);
        }
    }
    (void)cudaGetLastError();
    epx_status st = epxi_transport_check(R, ep->a.me, t, err);
    free(t);
    return st;
}

extern "C" epx_status epx_gpu_ep_connect(epx_gpu_ep *ep, const void *infos, epx_error *err) {
    if (ep == NULL || infos == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP connect needs a handle and the infos");
    if (ep->connected)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP connect: this handle is connected (engines of the nccl "
                         "transport are, from their creation)");
    if (ep->was_connected && ep->kind == EPX_GPU_EP_TRANSPORT_HOST)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP connect: under the host transport a handle connects once (the "
                         "shared segments' names went once every rank had mapped them): destroy "
                         "it and open a new one");
    const int32_t R = ep->a.R;
    unsigned char mine_b[EPX_GPU_EP_INFO_BYTES];
    EPX_TRY(epx_gpu_ep_info(ep, mine_b, err));
    PeerInfo mine, p;
    memcpy(&mine, mine_b, sizeof mine);
    int dev = 0;
    EPXI_CUDA_TRY(cudaGetDevice(&dev), "GPU EP: current device");
    for (int32_t r = 0; r < R; r++) {
        if (absent_info(ep, infos, r)) continue;
        memcpy(&p, (const unsigned char *)infos + (size_t)r * EPX_GPU_EP_INFO_BYTES, sizeof p);
        char a_s[160], b_s[160];
        if (memcmp(p.magic, kMagic, sizeof p.magic) != 0 || p.rank != r)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "GPU EP connect: entry %d of the infos is not rank %d's "
                             "epx_gpu_ep_info of this epx version (pass every rank's info in "
                             "rank order)",
                             r, r);
        if (r == ep->a.me && (p.process != mine.process || p.ptr != mine.ptr))
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "GPU EP connect: entry %d of the infos is not this handle's own "
                             "(rank %d): pass every rank's info in rank order",
                             r, r);
        epxi_ll_shape_describe(&mine.shape, a_s, sizeof a_s);
        epxi_ll_shape_describe(&p.shape, b_s, sizeof b_s);
        if (strcmp(a_s, b_s) != 0)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "GPU EP connect: rank %d has %s but rank %d has %s; every rank "
                             "must create the engine with the same config",
                             ep->a.me, a_s, r, b_s);
    }
    EPX_TRY(check_transport(ep, infos, &mine, dev, err));
    epx_status st = EPX_OK;
    bool one_process = true;
    for (int32_t r = 0; r < R && st == EPX_OK; r++) {
        if (absent_info(ep, infos, r)) { /* masked from the start: never sent to or waited for */
            const int32_t one = 1;
            ep->mapped[r] = NULL;
            EPXI_CUDA_GOTO(st, cudaMemcpy(ep->a.mask + r, &one, sizeof one, cudaMemcpyHostToDevice),
                           "GPU EP mask", undo);
            continue;
        }
        memcpy(&p, (const unsigned char *)infos + (size_t)r * EPX_GPU_EP_INFO_BYTES, sizeof p);
        if (p.process == mine.process) {
            /* this process: the pointer as it is (peer access for another GPU) */
            ep->mapped[r] = (unsigned char *)(uintptr_t)p.ptr;
            if (p.device != dev && ep->kind == EPX_GPU_EP_TRANSPORT_PEER) {
                cudaError_t pe = cudaDeviceEnablePeerAccess(p.device, 0);
                if (pe != cudaSuccess && pe != cudaErrorPeerAccessAlreadyEnabled)
                    st = epxi_fail(err, EPX_ERR_CUDA,
                                   "GPU EP: GPU %d cannot reach GPU %d (rank %d) by load/store: "
                                   "%s. The peer transport needs peer access (NVLink, or PCIe "
                                   "with P2P): set EPX_GPU_EP_TRANSPORT=host otherwise",
                                   dev, p.device, r, cudaGetErrorString(pe));
                (void)cudaGetLastError();
            }
            continue;
        }
        one_process = false;
        st = ep->tr->map(p.handle, ep->inbox_total, r, &ep->areas[r], err);
        if (st == EPX_OK) ep->mapped[r] = ep->areas[r].dev;
    }
    if (st == EPX_OK)
        EPXI_CUDA_GOTO(st,
                       cudaMemcpy(ep->buf + ep->off_peers, ep->mapped, (size_t)R * sizeof(void *),
                                  cudaMemcpyHostToDevice),
                       "GPU EP peer table", undo);
    if (st == EPX_OK) {
        bool one = true;
        for (int32_t r = 0; r < R; r++) {
            if (absent_info(ep, infos, r)) continue;
            memcpy(&p, (const unsigned char *)infos + (size_t)r * EPX_GPU_EP_INFO_BYTES, sizeof p);
            one = one && memcmp(p.uuid, mine.uuid, sizeof p.uuid) == 0;
            /* Every rank counts in once on every area (the host transport
             * removes a segment's name when all have: nothing is left in
             * /dev/shm whoever crashes later). */
            ep->tr->count_in(ep->areas[r].dev != NULL ? &ep->areas[r]
                             : r == ep->a.me          ? &ep->inbox
                                                      : NULL,
                             p.handle);
        }
        /* Flags at GPU scope only where device memory and every rank share
         * this GPU; host memory keeps the system scope a PCIe box needs. */
        ep->a.one_gpu = one && ep->kind == EPX_GPU_EP_TRANSPORT_PEER;
        ep->one_process = one_process;
        ep->connected = ep->was_connected = true;
        return EPX_OK;
    }
undo:
    unmap_peers(ep);
    return st;
}

extern "C" epx_status epx_gpu_ep_create(epx_comm *bootstrap, const epx_ep_config *cfg,
                                        cudaStream_t stream, const epx_gpu_ep_opts *opts,
                                        epx_gpu_ep **out, epx_error *err) {
    if (bootstrap == NULL || out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_gpu_ep_create needs a bootstrap communicator and an out pointer");
    epx_gpu_ep *ep = NULL;
    const int32_t R = epx_comm_size(bootstrap);
    unsigned char *all =
        (unsigned char *)epxi_calloc((size_t)R, EPX_GPU_EP_INFO_BYTES, "GPU EP peers", err);
    if (all == NULL) return EPX_ERR_NOMEM;
    /* Each step that one rank alone may fail (open, connect) is followed by
     * an exchange every rank reaches, so a failure anywhere becomes an error
     * everywhere, never peers waiting at the next collective in vain. A rank
     * that failed sends zeros (no magic). */
    unsigned char mine[EPX_GPU_EP_INFO_BYTES] = {0};
    epx_status st = epx_gpu_ep_open(cfg, epx_comm_rank(bootstrap), R, stream, opts, &ep, err);
    if (st == EPX_OK) st = epx_gpu_ep_info(ep, mine, err);
    if (st != EPX_OK) memset(mine, 0, sizeof mine);
    epx_error gerr = {};
    epx_status gst = allgather_info(bootstrap, mine, all, &gerr);
    for (int32_t r = 0; gst == EPX_OK && st == EPX_OK && r < R; r++)
        if (memcmp(all + (size_t)r * EPX_GPU_EP_INFO_BYTES, kMagic, sizeof kMagic) != 0)
            st = epxi_fail(err, EPX_ERR_INVALID_ARG,
                           "GPU EP create: rank %d could not open its engine (its own error says "
                           "why), so no rank connects",
                           r);
    if (gst == EPX_OK && st == EPX_OK) st = epx_gpu_ep_connect(ep, all, err);
    if (gst == EPX_OK) {
        /* did every rank connect? */
        memset(mine, 0, sizeof mine);
        mine[0] = st == EPX_OK;
        gst = allgather_info(bootstrap, mine, all, &gerr);
        for (int32_t r = 0; gst == EPX_OK && st == EPX_OK && r < R; r++)
            if (all[(size_t)r * EPX_GPU_EP_INFO_BYTES] != 1)
                st = epxi_fail(err, EPX_ERR_INVALID_ARG,
                               "GPU EP create: rank %d could not connect to its peers (its own "
                               "error says why)",
                               r);
    }
    if (gst != EPX_OK && st == EPX_OK) {
        st = gst;
        if (err != NULL) *err = gerr;
    }
    /* Every peer has mapped every buffer before anyone launches. */
    if (st == EPX_OK) st = epx_comm_barrier(bootstrap, err);
    free(all);
    if (st != EPX_OK) {
        epx_gpu_ep_destroy(ep); /* no collective teardown after a failed collective setup */
        return st;
    }
    ep->boot = bootstrap;
    *out = ep;
    return EPX_OK;
}

/* The first fault the kernels recorded, as a status and message; poisons
 * the bootstrap communicator for communication faults. A refused batch is
 * reported (and forgotten) only where asked: dispatch and combine must
 * launch whenever the peers do, or they would wait for us in vain. */
static epx_status fault_status(epx_gpu_ep *ep, bool report_refused, epx_error *err) {
    volatile uint32_t *f = ep->host_fault;
    if (report_refused && f[0] == F_NONE && f[4] == F_DUP_SLOT) {
        f[4] = F_NONE;
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP dispatch of batch %u: a token of rank %u names one slot twice; "
                         "the expert-major receive holds one row per token and slot (DeepEP's "
                         "rule: distinct experts per token), so every rank refused that batch "
                         "(no expert ran, combine wrote zeros)",
                         f[7], f[6]);
    }
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
    if (!ep->reported && ep->boot != NULL) {
        epxi_comm_poison(ep->boot, EPX_ERR_TIMEOUT, err ? err->msg : "GPU EP timeout");
        ep->reported = true;
    }
    return st;
}

extern "C" epx_status epx_gpu_ep_health(epx_gpu_ep *ep, epx_error *err) {
    if (ep == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP health needs a handle");
    return fault_status(ep, true, err);
}

/* ---- shrink mode's mask ---------------------------------------------------- */

namespace {
__global__ void set_mask_kernel(int32_t *mask, int32_t rank, int32_t v) { mask[rank] = v; }
} // namespace

static epx_status shrink_handle(const epx_gpu_ep *ep, const char *what, epx_error *err) {
    if (ep == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP %s needs a handle", what);
    if (!ep->a.shrink)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP %s: this handle was opened without shrink mode (set "
                         "epx_gpu_ep_opts.shrink = 1)",
                         what);
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_mask_update(epx_gpu_ep *ep, int32_t rank, int masked,
                                             epx_error *err) {
    EPX_TRY(shrink_handle(ep, "mask_update", err));
    if (rank < 0 || rank >= ep->a.R)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP mask_update: rank %d is outside [0, %d)",
                         rank, ep->a.R);
    /* a kernel, not a copy from host memory: it is captured by value */
    set_mask_kernel<<<1, 1, 0, ep->stream>>>(ep->a.mask, rank, masked != 0);
    EPXI_CUDA_TRY(cudaGetLastError(), "GPU EP mask_update");
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_mask_query(epx_gpu_ep *ep, int32_t *out, epx_error *err) {
    EPX_TRY(shrink_handle(ep, "mask_query", err));
    if (out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP mask_query needs a device int32[%d]",
                         ep->a.R);
    EPXI_CUDA_TRY(cudaMemcpyAsync(out, ep->a.mask, (size_t)ep->a.R * sizeof(int32_t),
                                  cudaMemcpyDeviceToDevice, ep->stream),
                  "GPU EP mask_query");
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_mask_clean(epx_gpu_ep *ep, epx_error *err) {
    EPX_TRY(shrink_handle(ep, "mask_clean", err));
    EPXI_CUDA_TRY(cudaMemsetAsync(ep->a.mask, 0, (size_t)ep->a.R * sizeof(int32_t), ep->stream),
                  "GPU EP mask_clean");
    return EPX_OK;
}

static unsigned blocks_for(int64_t items, int32_t cap) {
    int64_t b = items < 1 ? 1 : items;
    return (unsigned)(b < cap ? b : cap);
}

static epx_status ready(epx_gpu_ep *ep, const char *what, epx_error *err) {
    if (ep == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP %s needs a handle", what);
    if (!ep->connected)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP %s before epx_gpu_ep_connect: the peers are not mapped yet", what);
    return fault_status(ep, false, err);
}

static const char *state_name(int st) {
    return st == epx_gpu_ep::D_SENT       ? "a dispatch whose receive half has not run"
           : st == epx_gpu_ep::C_SENT     ? "a combine whose receive half has not run"
           : st == epx_gpu_ep::DISPATCHED ? "a dispatch"
                                          : "no dispatch since the handle was made or its token "
                                            "bound set";
}

static epx_status bad_order(epx_gpu_ep *ep, const char *what, const char *fix, epx_error *err) {
    return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP %s after %s: %s", what,
                     state_name(ep->state), fix);
}

static_assert(EPX_GPU_EP_FP8 == kFP8 && EPX_GPU_EP_ROUND_SCALE == kRoundScale &&
                  EPX_GPU_EP_UE8M0 == kUE8M0,
              "the kernels take the public fp8 bits as they are");

/* An fp8 dispatch's preconditions (DeepEP's, and the kernel's alignment). */
static epx_status check_fp8(const epx_gpu_ep *ep, int fp8, const void *x, epx_error *err) {
    if (fp8 == 0) return EPX_OK;
    const epxi_ep_geom *g = &ep->g;
    if (ep->a.compact)
        return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                         "GPU EP fp8 dispatch is low-latency mode's: the handle is in normal mode "
                         "(its experts read the rows where the senders wrote them, bf16 or fp32)");
    if (!(fp8 & EPX_GPU_EP_FP8))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP dispatch: EPX_GPU_EP_ROUND_SCALE / _UE8M0 shape an fp8 dispatch: "
                         "add EPX_GPU_EP_FP8");
    if ((fp8 & EPX_GPU_EP_UE8M0) && !(fp8 & EPX_GPU_EP_ROUND_SCALE))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP dispatch: UE8M0 scales are powers of two: add "
                         "EPX_GPU_EP_ROUND_SCALE (DeepEP's rule)");
    if (g->cfg.x_dtype != EPX_DTYPE_BF16)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP fp8 dispatch quantises bf16 rows: create the handle with x_dtype "
                         "EPX_DTYPE_BF16");
    const int32_t unit = (fp8 & EPX_GPU_EP_UE8M0) ? 4 * EPXI_FP8_GROUP : EPXI_FP8_GROUP;
    if (g->H % unit != 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP fp8 dispatch: hidden %d is not a multiple of %d (one scale per "
                         "128 values%s)",
                         g->H, unit, unit > EPXI_FP8_GROUP ? ", four packed per int32" : "");
    if ((uintptr_t)x % 16 != 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP fp8 dispatch reads x in 16-byte words: x (%p) must be 16-byte "
                         "aligned",
                         x);
    return EPX_OK;
}

/* The recv view of a dispatch: expert-major (low latency) or compact
 * (normal mode: entries in slot order at slot_offsets, their rows in the
 * inbox, both parities, so one view serves every dispatch of a graph). */
static void fill_recv(const epx_gpu_ep *ep, epx_ep_recv *recv) {
    const epxi_ep_geom *g = &ep->g;
    const Args &a = ep->a;
    memset(recv, 0, sizeof *recv);
    recv->num_entries = -1; /* on the device: counts, or slot_offsets[num_local_slots] */
    recv->first_slot = a.me * g->spr;
    recv->num_local_slots = g->spr;
    recv->entry_weight = a.ew;
    recv->y = a.y;
    recv->slot_counts = a.count;
    if (a.compact) {
        recv->num_tokens = 2 * a.RM;
        recv->x = a.base + a.off_rows;
        recv->x_stride = a.rec;
        recv->slot_offsets = a.offs;
        recv->entry_token = a.etok;
    } else {
        recv->num_tokens = (int64_t)g->spr * a.RM;
        recv->x = a.rx;
        recv->x_stride = g->xrow;
        recv->slot_stride = a.RM;
    }
}

extern "C" epx_status epx_gpu_ep_dispatch_parts(epx_gpu_ep *ep, int parts, int64_t T, const void *x,
                                                const int32_t *topk_slots,
                                                const float *topk_weights, epx_ep_recv *recv,
                                                epx_error *err) {
    EPX_TRY(ready(ep, "dispatch", err));
    const int ids64 = parts & EPX_GPU_EP_IDS64;
    const int fp8 = parts & (EPX_GPU_EP_FP8 | EPX_GPU_EP_ROUND_SCALE | EPX_GPU_EP_UE8M0);
    parts &= ~(EPX_GPU_EP_IDS64 | EPX_GPU_EP_FP8 | EPX_GPU_EP_ROUND_SCALE | EPX_GPU_EP_UE8M0);
    if (parts < EPX_GPU_EP_SEND || parts > (EPX_GPU_EP_SEND | EPX_GPU_EP_RECV))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP dispatch parts %d: give EPX_GPU_EP_SEND, EPX_GPU_EP_RECV or both "
                         "(and EPX_GPU_EP_IDS64 for int64 ids)",
                         parts);
    const epxi_ep_geom *g = &ep->g;
    if (parts & EPX_GPU_EP_SEND) {
        if (ep->state == epx_gpu_ep::D_SENT || ep->state == epx_gpu_ep::C_SENT)
            return bad_order(ep, "dispatch", "run its receive half first", err);
        if (T < 0 || T > g->M)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "GPU EP dispatch of %lld tokens is outside [0, max_tokens %lld]: the "
                             "low-latency buffers hold max_tokens per rank; raise it when "
                             "creating the handle",
                             (long long)T, (long long)g->M);
        if (T > ep->bound)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "GPU EP dispatch of %lld tokens is above the token bound %lld that "
                             "epx_gpu_ep_set_token_bound set: every rank raises it together "
                             "(at most max_tokens %lld)",
                             (long long)T, (long long)ep->bound, (long long)g->M);
        if (T > 0 && (x == NULL || topk_slots == NULL))
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "GPU EP dispatch of %lld tokens needs x and topk_slots", (long long)T);
        EPX_TRY(check_fp8(ep, fp8, x, err));
        ep->T = T;
        ep->fp8 = fp8;
    } else if (ep->state != epx_gpu_ep::D_SENT) {
        return bad_order(ep, "dispatch receive", "send a dispatch first", err);
    }
    /* Blocks: this rank's (token, destination) items, and as many as the
     * rows (and k) a receiver is likely to place: R * T * K. */
    const int64_t dmax = g->K < g->R ? g->K : g->R, sends = (parts & 1) ? ep->T * dmax : 0;
    int64_t places = (parts & 2) ? (int64_t)g->R * ep->T * g->K : 0;
    if (ep->a.compact) places = (places + kThreads - 1) / kThreads; /* a thread per (row, k) */
    if (ep->exchange != NULL && parts == (EPX_GPU_EP_SEND | EPX_GPU_EP_RECV)) {
        /* staging: the halves as two launches, the transport between them */
        EPX_TRY(epx_gpu_ep_dispatch_parts(ep, EPX_GPU_EP_SEND | ids64 | fp8, T, x, topk_slots,
                                          topk_weights, NULL, err));
        return epx_gpu_ep_dispatch_parts(ep, EPX_GPU_EP_RECV, T, x, topk_slots, topk_weights, recv,
                                         err);
    }
    /* ... and one more for the slot ranges (dispatch_kernel's range block) */
    const unsigned grid =
        blocks_for((sends > places ? sends : places) + ((parts & 2) ? 1 : 0), ep->wait_blocks);
    const uint32_t nwork = (uint32_t)(sends < 1 ? 1 : sends < grid ? sends : grid);
    /* The lean instance when nothing needs the others' paths (dispatch_kernel). */
    const bool lean = ep->fp8 == 0 && (!ep->a.host_inbox || (ep->a.variant & 32)) && g->K <= 32 &&
                      row_fits_registers(g->xrow, x, kThreads);
    /* Positions from the per-slot table where the ids are past staging. */
    const bool big = (parts & EPX_GPU_EP_SEND) && ep->T * g->K > kSmemIds && g->P <= kSmemIds;
    auto kern = lean ? (big ? dispatch_kernel<true, true> : dispatch_kernel<true, false>)
                     : (big ? dispatch_kernel<false, true> : dispatch_kernel<false, false>);
    kern<<<grid, kThreads, 0, ep->stream>>>(ep->a, ep->T, (const unsigned char *)x, topk_slots,
                                            topk_weights, nwork, parts | (ids64 ? 4 : 0) | ep->fp8);
    EPXI_CUDA_TRY(cudaGetLastError(), "GPU EP dispatch kernel");
    if (parts & EPX_GPU_EP_SEND) EPX_TRY(exchange_phase(ep, 0, err));
    ep->state = (parts & EPX_GPU_EP_RECV) ? epx_gpu_ep::DISPATCHED : epx_gpu_ep::D_SENT;
    if (recv != NULL) fill_recv(ep, recv);
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_dispatch(epx_gpu_ep *ep, int64_t T, const void *x,
                                          const int32_t *topk_slots, const float *topk_weights,
                                          epx_ep_recv *recv, epx_error *err) {
    if (recv == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP dispatch needs a recv view");
    return epx_gpu_ep_dispatch_parts(ep, EPX_GPU_EP_SEND | EPX_GPU_EP_RECV, T, x, topk_slots,
                                     topk_weights, recv, err);
}

extern "C" epx_status epx_gpu_ep_identity_experts(epx_gpu_ep *ep, epx_error *err) {
    if (ep == NULL || ep->state != epx_gpu_ep::DISPATCHED)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP identity experts need a whole dispatch first");
    identity_kernel<<<(unsigned)ep->wait_blocks, kThreads, 0, ep->stream>>>(ep->a, ep->fp8);
    EPXI_CUDA_TRY(cudaGetLastError(), "GPU EP identity kernel");
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_combine_parts(epx_gpu_ep *ep, int parts, const void *y,
                                               const float *topk_weights, void *out,
                                               epx_dtype out_dtype, epx_error *err) {
    EPX_TRY(ready(ep, "combine", err));
    if (parts < EPX_GPU_EP_SEND || parts > (EPX_GPU_EP_SEND | EPX_GPU_EP_RECV))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP combine parts %d: give EPX_GPU_EP_SEND, EPX_GPU_EP_RECV or both",
                         parts);
    const epxi_ep_geom *g = &ep->g;
    if (parts & EPX_GPU_EP_SEND) {
        if (ep->state != epx_gpu_ep::DISPATCHED)
            return bad_order(ep, "combine", "combine follows a whole dispatch", err);
        if (out_dtype != EPX_DTYPE_F32 && out_dtype != EPX_DTYPE_BF16)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "GPU EP combine writes F32 or BF16 output, not dtype %d",
                             (int)out_dtype);
        if (ep->T > 0 && out == NULL)
            return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP combine of %lld tokens needs out",
                             (long long)ep->T);
        ep->c_w = topk_weights ? topk_weights : ep->a.weights;
        ep->c_out = out;
        ep->c_bf16 = out_dtype == EPX_DTYPE_BF16;
    } else if (ep->state != epx_gpu_ep::C_SENT) {
        return bad_order(ep, "combine receive", "send a combine first", err);
    }
    /* Enough blocks for the entries this rank may hold, and for its tokens'
     * chunks of the reduction. */
    const int64_t per = (int64_t)(g->cfg.y_dtype == EPX_DTYPE_BF16 ? 8 : 4) * kThreads;
    const int64_t items = (parts & 2) ? ep->T * ((g->H + per - 1) / per) : 0;
    const int64_t sends = (parts & 1) ? (int64_t)g->R * ep->T * g->K : 0;
    if (ep->exchange != NULL && parts == (EPX_GPU_EP_SEND | EPX_GPU_EP_RECV)) {
        EPX_TRY(
            epx_gpu_ep_combine_parts(ep, EPX_GPU_EP_SEND, y, topk_weights, out, out_dtype, err));
        return epx_gpu_ep_combine_parts(ep, EPX_GPU_EP_RECV, y, topk_weights, out, out_dtype, err);
    }
    const unsigned char *ysrc = y ? (const unsigned char *)y : ep->a.y;
    /* The lean instance for bf16 outputs in whole 16-byte lanes (combine_kernel). */
    const bool lean = g->cfg.y_dtype == EPX_DTYPE_BF16 && g->H % 8 == 0 && g->yrow % 16 == 0 &&
                      (uintptr_t)ysrc % 16 == 0;
    auto kern = lean ? combine_kernel<true> : combine_kernel<false>;
    kern<<<blocks_for(items > sends ? items : sends, ep->wait_blocks), kThreads, 0, ep->stream>>>(
        ep->a, ep->T, ysrc, ep->c_w, ep->c_out, ep->c_bf16, parts);
    EPXI_CUDA_TRY(cudaGetLastError(), "GPU EP combine kernel");
    if (parts & EPX_GPU_EP_SEND) EPX_TRY(exchange_phase(ep, 1, err));
    /* the dispatch stays valid: it may be combined again (DeepEP allows it) */
    ep->state = (parts & EPX_GPU_EP_RECV) ? epx_gpu_ep::DISPATCHED : epx_gpu_ep::C_SENT;
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_combine_ex(epx_gpu_ep *ep, const void *y,
                                            const float *topk_weights, void *out,
                                            epx_dtype out_dtype, epx_error *err) {
    return epx_gpu_ep_combine_parts(ep, EPX_GPU_EP_SEND | EPX_GPU_EP_RECV, y, topk_weights, out,
                                    out_dtype, err);
}

extern "C" epx_status epx_gpu_ep_combine(epx_gpu_ep *ep, float *out, epx_error *err) {
    return epx_gpu_ep_combine_ex(ep, NULL, NULL, out, EPX_DTYPE_F32, err);
}

extern "C" epx_status epx_gpu_ep_set_stream(epx_gpu_ep *ep, cudaStream_t stream, epx_error *err) {
    if (ep == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP set_stream needs a handle");
    if (stream == ep->stream) return EPX_OK;
    /* The handle's launches stay in order across streams: the new stream
     * waits for what the old one holds. Not where either stream is being
     * captured (a capture must not depend on outside work; torch's capture
     * stream already waits for the stream it was entered from). */
    cudaStreamCaptureStatus a = cudaStreamCaptureStatusNone, b = cudaStreamCaptureStatusNone;
    EPXI_CUDA_TRY(cudaStreamIsCapturing(ep->stream, &a), "GPU EP: the old stream's capture");
    EPXI_CUDA_TRY(cudaStreamIsCapturing(stream, &b), "GPU EP: the new stream's capture");
    if (a == cudaStreamCaptureStatusNone && b == cudaStreamCaptureStatusNone) {
        EPXI_CUDA_TRY(cudaEventRecord(ep->chain, ep->stream), "GPU EP: stream change");
        EPXI_CUDA_TRY(cudaStreamWaitEvent(stream, ep->chain, 0), "GPU EP: stream change");
    }
    ep->stream = stream;
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_set_token_bound(epx_gpu_ep *ep, int64_t bound, epx_error *err) {
    EPX_TRY(ready(ep, "set_token_bound", err));
    const epxi_ep_geom *g = &ep->g;
    if (bound < 1 || bound > g->M)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP token bound %lld is outside [1, max_tokens %lld]: give the most "
                         "tokens any rank dispatches per call",
                         (long long)bound, (long long)g->M);
    if (ep->state == epx_gpu_ep::D_SENT || ep->state == epx_gpu_ep::C_SENT)
        return bad_order(ep, "set_token_bound", "run its receive half first", err);
    if (ep->agree != NULL) {
        /* the ranks' bounds are compared on the stream and waited for */
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        EPXI_CUDA_TRY(cudaStreamIsCapturing(ep->stream, &cs), "GPU EP set_token_bound");
        if (cs != cudaStreamCaptureStatusNone)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "GPU EP set_token_bound while its stream is being captured: over "
                             "nccl the ranks compare their bounds and wait for the answer; set "
                             "it before the capture");
        EPX_TRY(ep->agree(ep->exchange_ctx, bound, "epx_gpu_ep_set_token_bound", ep->stream, err));
    }
    set_bound(ep, bound);
    /* A combine may return the last dispatch again, but not across a new
     * bound (its rows may not fit the blocks): every rank starts afresh. */
    if (ep->state == epx_gpu_ep::DISPATCHED) ep->state = epx_gpu_ep::IDLE;
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_disconnect(epx_gpu_ep *ep, epx_error *err) {
    if (ep == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP disconnect needs a handle");
    EPX_TRY(epxi_cuda_stream_wait(ep->stream, 2 * (int64_t)ep->timeout_ms + 1000, "GPU EP", err));
    unmap_peers(ep);
    ep->connected = false;
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_get_views(const epx_gpu_ep *ep, epx_gpu_ep_views *v,
                                           epx_error *err) {
    if (ep == NULL || v == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP views need a handle and an out struct");
    /* normal mode: the inbox's rows (entry_token of the recv view indexes them) */
    v->x = ep->a.compact ? ep->a.base + ep->a.off_rows : ep->a.rx;
    v->x_scales = ep->g.H % EPXI_FP8_GROUP == 0 && !ep->a.compact
                      ? ep->a.rx + (size_t)ep->a.spr * ep->a.RM * ep->g.H
                      : NULL;
    v->y = ep->a.y;
    v->counts = ep->a.count;
    v->src_token = ep->a.srctok;
    v->layout_range = ep->a.range;
    v->entry_weight = ep->a.ew;
    v->slot_stride = ep->a.compact ? 0 : ep->a.RM;
    v->num_local_slots = ep->a.spr;
    return EPX_OK;
}

extern "C" epx_status epx_gpu_ep_sync(epx_gpu_ep *ep, epx_error *err) {
    if (ep == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU EP sync needs a handle");
    /* The kernels give up after timeout_ms per wait; allow a margin. */
    EPX_TRY(epxi_cuda_stream_wait(ep->stream, 2 * (int64_t)ep->timeout_ms + 1000, "GPU EP", err));
    return fault_status(ep, true, err);
}

extern "C" const char *epx_gpu_ep_transport_name(const epx_gpu_ep *ep) {
    if (ep == NULL || !ep->connected) return "none";
    if (ep->kind == EPX_GPU_EP_TRANSPORT_HOST) return "host";
    if (ep->kind == EPX_GPU_EP_TRANSPORT_NCCL) return "nccl";
    return ep->one_process ? "pointers" : "ipc";
}

extern "C" int32_t epx_gpu_ep_launches(const epx_gpu_ep *ep, const char *phase) {
    const bool known =
        phase != NULL && (strcmp(phase, "dispatch") == 0 || strcmp(phase, "combine") == 0);
    /* a staging transport runs each phase as two kernels around its copy */
    return !known ? 0 : ep != NULL && ep->exchange != NULL ? 2 : 1;
}

/* Measuring: the stamps of the last dispatch and combine (variant 8), in
 * microseconds after each kernel's start: [0..4] dispatch (1 sent and
 * counted, 2 arrived, 3 waited, 4 placed), [8..14] combine (13, 14: block
 * 0's first rows in, its sum done). */
extern "C" EPXI_HIDDEN int epxi_gpu_ep_stamps(epx_gpu_ep *ep, double *us) {
    Ctl c;
    if (ep == NULL || cudaMemcpy(&c, ep->a.ctl, sizeof c, cudaMemcpyDeviceToHost) != cudaSuccess)
        return -1;
    /* From block 0's entry into each kernel (stamps 5 and 15); us[6] is the
     * SM clock in MHz over the dispatch (cycles 6 -> 7 over ns 5 -> 4). */
    for (int i = 0; i < 48; i++) {
        const bool disp = i < 8 || (i >= 16 && i < 24);
        unsigned long long base = c.stamp[disp ? 5 : 15];
        us[i] = c.stamp[i] >= base && base ? (double)(c.stamp[i] - base) * 1e-3 : -1.0;
    }
    const double ns = (double)(c.stamp[4] - c.stamp[5]);
    us[6] = c.stamp[7] > c.stamp[6] && ns > 0 ? (double)(c.stamp[7] - c.stamp[6]) / ns * 1e3 : -1;
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
