/*
 * ll_dispatch.cuh - the GPU engine's dispatch (part of ll_ep.cu's one
 * translation unit, after ll_device.cuh): the sender's per-slot counts and
 * positions (a block per item, or for a batch past the staged ids a table of
 * earlier tokens and a warp per item), DeepEP's fp8 form, and the receiver:
 * expert-major rows placed where their counts say, a host inbox read once
 * per row, or normal mode's compact receive (entries name their inbox row).
 */
#pragma once

namespace {

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
 * in shared memory), by threads first, first + step, ... Eight ids per
 * thread are loaded before any is counted: one trip to memory per eight,
 * not one per id (the dependent form cost a 4,096-token batch ~20 us per
 * block, ncu). */
__device__ void count_ids(int32_t *tab, const void *slots, int ids64, int32_t q0, int32_t q1,
                          int32_t P, int32_t first, int32_t step) {
    constexpr int U = 8;
    int32_t q = q0 + first;
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

/* The same by the whole block. */
__device__ void count_ids(int32_t *tab, const void *slots, int ids64, int32_t q0, int32_t q1,
                          int32_t P) {
    count_ids(tab, slots, ids64, q0, q1, P, (int32_t)threadIdx.x, (int32_t)blockDim.x);
}

/* ids [0, q1) counted by the whole block in 16-byte words (four int32 ids
 * or two int64 a load, four loads in flight): the ids before a normal-mode
 * meta block's run, up to the whole batch in the last one (~32,768 at 4,096
 * tokens), counted before its first meta. Unaligned ids go one at a time. */
__device__ void count_ids_wide(int32_t *tab, const void *slots, int ids64, int32_t q1, int32_t P) {
    if ((uintptr_t)slots % 16 != 0) {
        count_ids(tab, slots, ids64, 0, q1, P, (int32_t)threadIdx.x, (int32_t)blockDim.x);
        return;
    }
    constexpr int U = 4;
    const int per = ids64 ? 2 : 4;
    const int32_t nwords = q1 / per, step = (int32_t)blockDim.x;
    const int4 *w = (const int4 *)slots;
    auto add = [&](const int4 &v) {
        if (ids64) {
            const long long s0 = ((long long)v.y << 32) | (unsigned)v.x;
            const long long s1 = ((long long)v.w << 32) | (unsigned)v.z;
            if (s0 >= 0 && s0 < P) atomicAdd(&tab[s0], 1);
            if (s1 >= 0 && s1 < P) atomicAdd(&tab[s1], 1);
        } else {
            if (v.x >= 0 && v.x < P) atomicAdd(&tab[v.x], 1);
            if (v.y >= 0 && v.y < P) atomicAdd(&tab[v.y], 1);
            if (v.z >= 0 && v.z < P) atomicAdd(&tab[v.z], 1);
            if (v.w >= 0 && v.w < P) atomicAdd(&tab[v.w], 1);
        }
    };
    int32_t i = (int32_t)threadIdx.x;
    for (; i + (U - 1) * step < nwords; i += U * step) {
        int4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = __ldg(&w[i + u * step]);
#pragma unroll
        for (int u = 0; u < U; u++) add(v[u]);
    }
    for (; i < nwords; i += step) add(__ldg(&w[i]));
    count_ids(tab, slots, ids64, nwords * per, q1, P, (int32_t)threadIdx.x, (int32_t)blockDim.x);
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
            const int32_t dst = epxi_div(sl, a.spr_div), l = sl - dst * a.spr;
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

/* Word w of a bf16 row (8 values; raw, where ok) quantised into rec: the
 * 16 lanes that hold a group's 128 values (words 16 q .. 16 q + 15, on 16
 * consecutive lanes) agree on its largest |value| over shuffles, so every
 * lane of the warp calls it, ok or not. */
__device__ __forceinline__ void quantize_word(const Args &a, unsigned char *rec, int w, bool ok,
                                              int4 raw, int round_scale) {
    float f[8], m = 0.0f;
    if (ok) {
        const uint32_t u[4] = {(uint32_t)raw.x, (uint32_t)raw.y, (uint32_t)raw.z, (uint32_t)raw.w};
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
        ((uint2 *)rec)[w] = make_uint2(epxi_e4m3x4(f, factor), epxi_e4m3x4(f + 4, factor));
        if (w % 16 == 0) ((float *)(rec + a.H))[w / 16] = scale;
    }
}

/* The bf16 row src (16-byte aligned, H % 128 == 0) quantised into rec by
 * the block, word w by thread w % blockDim.x. */
__device__ void quantize_row(const Args &a, unsigned char *rec, const unsigned char *src,
                             int round_scale) {
    const int nw = a.H / 8, span = (nw + 31) / 32 * 32;
    for (int base = 0; base < span; base += blockDim.x) {
        const int w = base + (int)threadIdx.x;
        const bool ok = w < nw;
        quantize_word(a, rec, w, ok, ok ? ((const int4 *)src)[w] : make_int4(0, 0, 0, 0),
                      round_scale);
    }
}

/* ... and from the block's registers (regs_load: word w = threadIdx.x + i *
 * blockDim.x in v[i]; blockDim.x a multiple of 32, so a group's 16 words
 * are 16 consecutive lanes), the same bits: the lean dispatch's fp8 send,
 * which reads the row from memory once, under the routing, as bf16 does. */
template <int N>
__device__ void quantize_regs(const Args &a, unsigned char *rec, const int4 (&v)[N],
                              int round_scale) {
    const int nw = a.H / 8;
#pragma unroll
    for (int i = 0; i < N; i++) {
        if (i * (int)blockDim.x >= nw) break; /* the same for the whole block */
        const int w = (int)threadIdx.x + i * (int)blockDim.x;
        quantize_word(a, rec, w, w < nw, v[i], round_scale);
    }
}

/* The bytes of an fp8 record's row part: H e4m3 values, then H / 128 fp32
 * scales, rounded up to whole 16-byte words (the record's row part is
 * xrow = 2 H bytes, so the rounding stays inside it). */
__device__ __forceinline__ size_t fp8_rec_bytes(const Args &a) {
    return ((size_t)a.H + (size_t)a.H / EPXI_FP8_GROUP * 4 + 15) / 16 * 16;
}

/* The fp8 receive's scales (after the data of every entry row). */
__device__ __forceinline__ unsigned char *fp8_scales(const Args &a) {
    return a.rx + (size_t)a.spr * (size_t)a.RM * (size_t)a.H;
}

/* Four fp32 scales (their bits) as UE8M0: each one's exponent byte, scale j
 * in byte j of one int32. */
__device__ __forceinline__ int32_t ue8m0_pack(const uint32_t (&bits)[4]) {
    uint32_t packed = 0;
    for (int j = 0; j < 4; j++) packed |= ((bits[j] >> 23) & 0xffu) << (8 * j);
    return (int32_t)packed;
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
        const uint32_t bits[4] = {__float_as_uint(sc[4 * q]), __float_as_uint(sc[4 * q + 1]),
                                  __float_as_uint(sc[4 * q + 2]), __float_as_uint(sc[4 * q + 3])};
        out[((size_t)l * (G / 4) + q) * (size_t)a.RM + (size_t)s] = ue8m0_pack(bits);
    }
}

/* ... and from a record held in the block's registers (regs_load of
 * fp8_rec_bytes): its data words to the entry's row, its scale words (four
 * scales each) into the scale tensor, the same bytes as place_fp8. Entry e
 * is (slot l, row s) of the expert-major receive, e = l * RM + s, as the
 * placing thread found it: every thread dividing e by RM here was among the
 * receive's hottest lines (ncu, H200, bench/RESULTS.md), and a divisor for
 * R * M in Args made every kernel's parameters 8 bytes larger and the bf16
 * round trip 0.27 us slower at one token (H100). */
template <int N>
__device__ void place_fp8_regs(const Args &a, const int4 (&v)[N], int64_t e, uint32_t l, uint32_t s,
                               int ue8m0) {
    const int dw = a.H / 16, G = a.H / EPXI_FP8_GROUP;
    unsigned char *const row = a.rx + (size_t)e * (size_t)a.H;
#pragma unroll
    for (int i = 0; i < N; i++) {
        const int w = (int)threadIdx.x + i * (int)blockDim.x;
        if (w < dw) {
            ((int4 *)row)[w] = v[i];
        } else if (w < dw + (ue8m0 ? G / 4 : (G + 3) / 4)) {
            const int q = w - dw; /* scales 4 q .. 4 q + 3 */
            const uint32_t u[4] = {(uint32_t)v[i].x, (uint32_t)v[i].y, (uint32_t)v[i].z,
                                   (uint32_t)v[i].w};
            if (ue8m0) {
                ((int32_t *)fp8_scales(a))[((size_t)l * (G / 4) + q) * (size_t)a.RM + s] =
                    ue8m0_pack(u);
            } else {
                float *out = (float *)fp8_scales(a);
                for (int j = 0; j < 4 && 4 * q + j < G; j++)
                    out[((size_t)l * G + 4 * q + j) * (size_t)a.RM + s] = __uint_as_float(u[j]);
            }
        }
    }
}

/*
 * Where entry (source s, token t, k) of meta m goes in the expert-major
 * receive, or with so in the compact one (its slot's offset for sources
 * below s, from their counts, plus its position); -1 for a meta of an older
 * batch or out of range. live [R]: the sources that
 * count (shrink mode gives up on some).
 */
__device__ int64_t entry_at(const Args &a, uint32_t epoch, const Meta &m, int s,
                            const uint8_t *live, const int32_t *so = nullptr) {
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
    return e;
}
/* ... and that entry recorded for the combine (its weight, source pair and
 * token) with the item's Work. */
__device__ int64_t place_entry(const Args &a, uint32_t epoch, const Meta &m, int s, int64_t t,
                               int k, const uint8_t *live, int32_t item,
                               const int32_t *so = nullptr) {
    const int64_t e = entry_at(a, epoch, m, s, live, so);
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

/*
 * Receive for a host-memory inbox in the lean instance: every received row
 * read across the link once and stored to its K places, and where the rows
 * are fewer than the placing blocks, in S slices read by as many blocks.
 * One SM has too few reads in flight to fill the link (bench/host_link.cu:
 * 5-7 GB/s for one block), so one block reading a whole 14 KB row waits
 * about two round trips for it (bench/RESULTS.md). Unit u is slice u % S of
 * row u / S; the slice-0 block records the row's entries (place_entry), the
 * others only work out where they go. Each block asks for the metas first
 * and its words right after, before anything waits. rowloc(row, &s, &t):
 * the row's source and token, called by whole warps alike. Rows are whole
 * 16-byte words within kPre per thread (row_fits_registers, checked on the
 * host for this instance).
 */
template <typename Loc>
__device__ void place_row_slices(const Args &a, uint32_t epoch, int32_t rows, int32_t placing,
                                 const uint8_t *live, Loc rowloc) {
    __shared__ int64_t place[kMaxK];
    const int K = a.K;
    const int32_t W = (int32_t)(a.xrow / 16);
    /* S = min(kMaxSlices, placing / rows), at least 1: the c <= kMaxSlices
     * with c * rows <= placing, counted side by side; with the divisions by S
     * below (Args::slice_div), no division waits on the receive's path. */
    int32_t S = 1;
#pragma unroll
    for (int32_t c = 2; c <= kMaxSlices; c++) S += c * rows <= placing;
    if ((a.variant & 16384) || rows <= 0) S = 1;
    const int32_t per = epxi_div(W + S - 1, a.slice_div[S]), units = rows * S;
    for (int32_t u = blockIdx.x; u < units && (int32_t)blockIdx.x < placing; u += placing) {
        const int32_t row = epxi_div(u, a.slice_div[S]), slice = u - row * S;
        int s = 0;
        int32_t t = 0;
        rowloc(row, &s, &t);
        const unsigned char *rec = rec_at(a, a.base, epoch, s, t);
        Meta m = {-1, 0.0f, 0, 0};
        if (threadIdx.x < K) m = ((const Meta *)(rec + a.meta_off))[threadIdx.x];
        const int32_t lo = slice * per, n = W - lo < per ? W - lo : per; /* n <= 0: none */
        const size_t bytes = n > 0 ? (size_t)n * 16 : 0;
        int4 v[kPre];
        regs_load(v, rec + (size_t)lo * 16, bytes);
        if (threadIdx.x < K) {
            const int k = threadIdx.x;
            place[k] = slice == 0 ? place_entry(a, epoch, m, s, t, k, live, row * K + k)
                                  : entry_at(a, epoch, m, s, live);
        }
        __syncthreads();
        STAMP(a, 24);
        for (int k = 0; k < K; k++)
            if (place[k] >= 0)
                regs_store(a.rx + (size_t)place[k] * a.xrow + (size_t)lo * 16, v, bytes);
        __syncthreads(); /* place[] is the next unit's */
    }
}

/* One token's routing by a warp, lane k holding choice k (K <= 32, given
 * as the lanes' values sv and wv): its slot as given and as kept (-1: none
 * or out of range), its weight, its
 * destination rank (INT_MAX: none), its place among the token's ascending
 * destinations (-1: none; with more than 32 ranks only the first lane of
 * each rank has it), and
 * how many of the token's earlier k name its slot. */
struct WarpRoute {
    int32_t sv, kept;
    float wv;
    int r, place, twin;
};
__device__ WarpRoute route_lanes(const Args &a, int32_t sv, float wv) {
    const int lane = threadIdx.x % 32, K = a.K;
    const bool in = lane < K;
    WarpRoute w;
    w.sv = in ? sv : -1;
    w.wv = in ? wv : 0.0f;
    w.kept = in && w.sv >= 0 && w.sv < a.P ? w.sv : -1;
    w.r = w.kept >= 0 ? epxi_div(w.kept, a.spr_div) : INT_MAX;
    if (a.R <= 32) { /* every lane of a rank gets its place (dispatch_kernel says why) */
        const unsigned ranks = __reduce_or_sync(0xffffffffu, w.r != INT_MAX ? 1u << w.r : 0u);
        w.place = w.r != INT_MAX ? __popc(ranks & ((1u << w.r) - 1u)) : -1;
    } else {
        const unsigned same = __match_any_sync(0xffffffffu, w.r);
        const bool first = w.r != INT_MAX && lane == __ffs(same) - 1;
        const unsigned firsts = __ballot_sync(0xffffffffu, first);
        int place = 0;
        for (int jj = 0; jj < K; jj++) {
            const int rj = __shfl_sync(0xffffffffu, w.r, jj);
            place += ((firsts >> jj) & 1u) && rj < w.r;
        }
        w.place = first ? place : -1;
    }
    const unsigned twins = __match_any_sync(0xffffffffu, w.kept >= 0 ? w.kept : -2 - lane);
    w.twin = __popc(twins & ((1u << lane) - 1u));
    return w;
}
/* ... of token t, read from the batch's ids and weights. */
__device__ WarpRoute warp_route(const Args &a, const void *slots, int ids64, const float *weights,
                                int32_t t) {
    const int lane = threadIdx.x % 32, K = a.K;
    const bool in = lane < K;
    return route_lanes(a, in ? slot_at(slots, t * K + lane, ids64) : -1,
                       in && weights ? weights[t * K + lane] : 0.0f);
}

/* The rank of a token's j-th destination (warp_route's places), or -1:
 * none, or masked. By the whole warp. */
__device__ __forceinline__ int route_dest(const WarpRoute &w, int j, const uint8_t *live) {
    const unsigned hit = __ballot_sync(0xffffffffu, w.place == j);
    const int d = hit ? __shfl_sync(0xffffffffu, w.r, __ffs(hit) - 1) : -1;
    return d >= 0 && live[d] ? d : -1;
}

/* Item (token, j-th destination) of a batch past the staged ids sent by
 * one warp: its row to the destination's inbox. */
__device__ __forceinline__ void send_item_row(const Args &a, unsigned char *const *peer,
                                              uint32_t epoch, int32_t item, int dmax,
                                              const unsigned char *x, const void *slots, int ids64,
                                              const float *weights, const uint8_t *live) {
    const int lane = threadIdx.x % 32;
    const int32_t t = epxi_div(item, a.dmax_div);
    const WarpRoute w = warp_route(a, slots, ids64, weights, t);
    const int dst = route_dest(w, item - t * dmax, live);
    if (dst >= 0)
        copy_words<int4>(rec_at(a, peer[dst], epoch, filed_as(a, dst), t), x + (size_t)t * a.xrow,
                         a.xrow, lane, 32);
}

/* Lane k's meta of token t (routed as w) in the record sent to rank dst:
 * its slot there and weight, or -1 where choice k goes elsewhere. */
__device__ __forceinline__ void put_meta(const Args &a, unsigned char *const *peer, uint32_t epoch,
                                         const WarpRoute &w, int dst, int32_t t, int32_t pos) {
    unsigned char *rec = rec_at(a, peer[dst], epoch, filed_as(a, dst), t);
    const bool here = w.kept >= 0 && w.r == dst;
    Meta m;
    m.slot = here ? w.kept - dst * a.spr : -1;
    m.weight = here ? w.wv : 0.0f;
    m.pos = here ? pos : 0;
    m.tag = epoch;
    ((Meta *)(rec + a.meta_off))[threadIdx.x % 32] = m;
}

/* A token's bad or repeated slots marked (bad_slot; Ctl, read by the last
 * block after the counters), and its slots and weights kept for the
 * combine where item (t, 0) is this block's. Lane k: choice k. */
__device__ __forceinline__ void mark_token(const Args &a, const WarpRoute &w, int32_t t,
                                           bool first_item, int &bad_slot) {
    const int lane = threadIdx.x % 32, K = a.K;
    const bool in = lane < K;
    if (in && (w.sv < -1 || w.sv >= a.P)) {
        bad_slot = 1;
        a.ctl->bad = 1;
    }
    if (in && w.twin > 0) {
        bad_slot = 1;
        a.ctl->dup = 1;
    }
    if (in && first_item) {
        a.slots[t * K + lane] = w.sv;
        a.weights[t * K + lane] = w.wv;
    }
}

/* Lane k's position among its slot's entries, for token t routed as w: the
 * count of the ids before run0 (tab) plus the entries of the slot among ids
 * [run0, t * K) (ballots over them) plus the token's earlier k. By the
 * whole warp. */
__device__ __forceinline__ int32_t token_pos(const Args &a, const WarpRoute &w, int32_t t,
                                             int32_t run0, const void *slots, int ids64,
                                             const int32_t *tab) {
    const int lane = threadIdx.x % 32, K = a.K;
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
    return pos;
}

/* ... and its metas, by one warp (lane k: choice k): positions from tab
 * holding the count of the tokens before the block's run (run0 ids).
 * Marks bad and repeated slots (bad_slot, Ctl). */
__device__ void send_item_metas(const Args &a, unsigned char *const *peer, uint32_t epoch,
                                int32_t item, int dmax, int32_t run0, const void *slots, int ids64,
                                const float *weights, const int32_t *tab, const uint8_t *live,
                                int &bad_slot) {
    const int lane = threadIdx.x % 32, K = a.K;
    const int32_t t = epxi_div(item, a.dmax_div);
    const int j = item - t * dmax;
    const WarpRoute w = warp_route(a, slots, ids64, weights, t);
    const bool in = lane < K;
    mark_token(a, w, t, j == 0, bad_slot);
    const int dst = route_dest(w, j, live);
    if (dst < 0) return;
    const int32_t pos = token_pos(a, w, t, run0, slots, ids64, tab);
    if (in) put_meta(a, peer, epoch, w, dst, t, pos);
}

/* ... the same for a token's destinations j_lo .. j_hi - 1 at once (normal
 * mode's meta blocks): its routing, marks and positions once, not once per
 * destination. */
__device__ void send_token_metas(const Args &a, unsigned char *const *peer, uint32_t epoch,
                                 int32_t t, int j_lo, int j_hi, int32_t run0, const void *slots,
                                 int ids64, const float *weights, const int32_t *tab,
                                 const uint8_t *live, int &bad_slot) {
    const WarpRoute w = warp_route(a, slots, ids64, weights, t);
    mark_token(a, w, t, j_lo == 0, bad_slot);
    const int32_t pos = token_pos(a, w, t, run0, slots, ids64, tab);
    for (int j = j_lo; j < j_hi; j++) {
        const int dst = route_dest(w, j, live);
        if (dst >= 0 && (int)(threadIdx.x % 32) < a.K) put_meta(a, peer, epoch, w, dst, t, pos);
    }
}

/* Warps of nw that count the `before` ids ahead of a block's run (of
 * `total`) while the others send rows: in proportion, at least one, at
 * most half the block. */
__device__ __forceinline__ int meta_warps(int nw, int32_t before, int32_t total) {
    return min(nw / 2, max(1, (int)((int64_t)(nw / 2) * before / max(1, total))));
}

/*
 * The lean send of a batch past the staged ids (kBig, K <= 32): the
 * block's run of items [i_lo, i_hi) spread over its warps, one (token,
 * destination) item per warp at a time, so a block has as many rows in
 * flight as warps. Every row goes out while tab gets the per-slot counts
 * of the tokens before the run; then each warp writes its items'
 * metas (send_item_metas). No barrier between items. With all_counts (the
 * run ends the batch) tab ends holding every token's counts, for
 * send_counts.
 */
__device__ void send_run_warps(const Args &a, unsigned char *const *peer, uint32_t epoch,
                               int32_t i_lo, int32_t i_hi, int dmax, int32_t Tn,
                               const unsigned char *x, const void *slots, int ids64,
                               const float *weights, int32_t *tab, const uint8_t *live,
                               bool all_counts, int &bad_slot) {
    const int warp = threadIdx.x / 32, nw = blockDim.x / 32;
    const int K = a.K;
    const int32_t run0 = epxi_div(i_lo, a.dmax_div) * K; /* the ids before the run's first token */
    /* The tokens before the run are counted while the rows go out, by nc
     * warps in proportion to their number (up to half the block; none for
     * the first block): the last block's pass over ~32,768 ids at 4,096
     * tokens took ~11 us after its rows, on the dispatch's critical path.
     * Variant 64: every warp sends, then the block counts (the order
     * before; bench/RESULTS.md compares them). */
    const bool beside = !(a.variant & 64) && run0 > 0 && nw > 1;
    const int nc = beside ? meta_warps(nw, run0, Tn * K) : 0;
    if (warp >= nw - nc) {
        count_ids(tab, slots, ids64, 0, run0, a.P, (int32_t)threadIdx.x - (nw - nc) * 32, nc * 32);
    } else {
        for (int32_t item = i_lo + warp; item < i_hi; item += nw - nc)
            send_item_row(a, peer, epoch, item, dmax, x, slots, ids64, weights, live);
    }
    if (!beside) count_ids(tab, slots, ids64, 0, run0, a.P);
    __syncthreads();
    for (int32_t item = i_lo + warp; item < i_hi; item += nw)
        send_item_metas(a, peer, epoch, item, dmax, run0, slots, ids64, weights, tab, live,
                        bad_slot);
    if (all_counts) { /* the run's own tokens join the table: every token's counts */
        __syncthreads();
        count_ids(tab, slots, ids64, run0, Tn * K, a.P);
    }
}

/* Normal mode's large batch with roles (dispatch_kernel): how many of the
 * grid's blocks are meta blocks. Five eighths: their counting, metas and
 * placing outlast the rows' copy with fewer (Kimi-K2.5's layer on an H100,
 * dispatch at 1,024 / 2,048 / 4,096 tokens: a quarter 17.1 / 33.5 / 55.4 us,
 * half 16.9 / 31.8 / 53.6, five eighths 17.2 / 31.1 / 51.5; thirteenth
 * session, bench/RESULTS.md). Variant bits 32768 (a quarter) and 65536
 * (half) keep the others measurable. */
__device__ __forceinline__ int32_t meta_share(int variant, int32_t grid) {
    if (variant & 32768) return grid / 4;
    if (variant & 65536) return grid / 2;
    return grid * 5 / 8;
}

/*
 * Normal mode's large batch with roles (dispatch_kernel): a row block's
 * share of the rows, every row_blocks-th item from its index a warp each
 * (block-minor: each row block holds the same share); the metas are the
 * meta blocks' (send_run_metas).
 */
__device__ void send_rows_strided(const Args &a, unsigned char *const *peer, uint32_t epoch,
                                  int dmax, int32_t nitems, int32_t row_blocks,
                                  const unsigned char *x, const void *slots, int ids64,
                                  const float *weights, const uint8_t *live) {
    const int warp = threadIdx.x / 32, nw = blockDim.x / 32;
    for (int32_t item = warp * row_blocks + (int32_t)blockIdx.x; item < nitems;
         item += nw * row_blocks)
        send_item_row(a, peer, epoch, item, dmax, x, slots, ids64, weights, live);
}

/* ... and a meta block's: the per-slot counts of the ids before its run of
 * items [i_lo, i_hi), then the run's metas, in rounds of one token a warp:
 * an item's position is the table's count (every token before the round)
 * plus ballots over the round's earlier tokens, and each round's tokens join
 * the table behind a barrier. A meta block's run is 8/5 of a block's share
 * of the batch (meta_share), so ballots over all the run's earlier tokens,
 * as send_run_warps takes them, would grow with its square. tab ends holding
 * the counts of every token up to the run's last, i.e. of every token in
 * the block whose run ends the batch (send_counts). */
__device__ void send_run_metas(const Args &a, unsigned char *const *peer, uint32_t epoch,
                               int32_t i_lo, int32_t i_hi, int dmax, const void *slots, int ids64,
                               const float *weights, int32_t *tab, const uint8_t *live,
                               int &bad_slot) {
    if (i_lo >= i_hi) return; /* a trailing meta block without items counts nothing */
    const int warp = threadIdx.x / 32, nw = blockDim.x / 32, lane = threadIdx.x % 32;
    const int K = a.K;
    const int32_t t_lo = epxi_div(i_lo, a.dmax_div), t_hi = epxi_div(i_hi - 1, a.dmax_div);
    count_ids_wide(tab, slots, ids64, t_lo * K, a.P); /* the ids before the run */
    __syncthreads();
    for (int32_t g0 = t_lo; g0 <= t_hi; g0 += nw) {
        const int32_t t = g0 + warp;
        if (t <= t_hi) /* this warp's token, to its destinations in the run */
            send_token_metas(a, peer, epoch, t, max(i_lo - t * dmax, 0), min(i_hi - t * dmax, dmax),
                             g0 * K, slots, ids64, weights, tab, live, bad_slot);
        __syncthreads(); /* every position of the round read from tab */
        if (t <= t_hi && lane < K) {
            const int32_t sl = slot_at(slots, t * K + lane, ids64);
            if (sl >= 0 && sl < a.P) atomicAdd(&tab[sl], 1);
        }
        __syncthreads();
    }
}

/* The last sender's flags: (epoch, T) to every live rank, or a refusal
 * code where a block marked a bad or repeated slot (only a marked batch
 * reads the words that say which; the usual one goes straight to its
 * flags). Release stores: a reader that acquires one sees every block's
 * writes that the counting-in ordered before it. */
constexpr int kRowsFlag = 1, kMetasFlag = 2; /* which flags publish_dispatch releases */
/* In a first flag's count: the rows came with it (a sender without roles
 * publishes both flags at once), so a receiver that sees this bit on every
 * source's first flag does not wait for the rows' (normal mode's batches stay
 * below 2^30 tokens: check_normal). */
constexpr uint32_t kRowsIn = 1u << 30;
template <int kWhich>
__device__ void publish_dispatch(const Args &a, unsigned char *const *peer, uint32_t epoch,
                                 int32_t T, const uint8_t *live, bool marked) {
    const bool bad = marked && ld_volatile(&a.ctl->bad) != 0;
    const bool dup = marked && ld_volatile(&a.ctl->dup) != 0;
    if (marked) a.ctl->bad = a.ctl->dup = 0;
    if (a.skip_flags) return;
    const uint32_t c = bad ? EPXI_LL_BAD : dup ? kLLDup : (uint32_t)T;
    const uint64_t v = epxi_ll_flag(epoch, c);
    if (kWhich == kRowsFlag) {
        release_flags(a, live, v,
                      [&](int r) { return dflag_at(a, peer[r], epoch, filed_as(a, r)); });
        return;
    }
    /* normal mode: one release for both kinds (no staging: filed_as is me) */
    const uint64_t vm = (kWhich & kRowsFlag) && !bad && !dup ? epxi_ll_flag(epoch, c | kRowsIn) : v;
    release_each(a, live, [&](int r, int var) {
        st_relaxed(mflag_at(a, peer[r], epoch, a.me), vm, var);
        if (kWhich & kRowsFlag) st_relaxed(dflag_at(a, peer[r], epoch, a.me), v, var);
    });
}

/* From the flags' counts (flag_cnt [R]): first_row [R + 1], the rows of
 * the sources below each; returned, the first source that refused the
 * batch (-1: none) with its fault code. One thread. */
struct Refusal {
    int r;
    uint32_t code;
    bool rows_in; /* normal mode: every source's first flag said its rows came with it */
};
__device__ Refusal sources_rows(const Args &a, const uint32_t *flag_cnt, int32_t *first_row,
                                bool compact) {
    Refusal no = {-1, 0, true};
    int32_t acc = 0;
    for (int r = 0; r < a.R; r++) {
        uint32_t c = flag_cnt[r];
        const bool refuse = c == EPXI_LL_BAD || c == kLLDup;
        if (refuse && no.r < 0) {
            no.r = r;
            no.code = c == kLLDup ? F_DUP_SLOT : F_BAD_SLOT;
        }
        if (compact && !refuse) {
            no.rows_in = no.rows_in && (c & kRowsIn) != 0;
            c &= ~kRowsIn;
        }
        first_row[r] = acc;
        acc += refuse ? 0 : (int32_t)c;
    }
    first_row[a.R] = acc;
    return no;
}

/* What the combine and the host learn of a received batch (one thread):
 * refused (nobody runs an expert on it; the combine yields zeros, the host
 * is told which source and why) and its items, the combine's work list. */
__device__ void batch_verdict(const Args &a, uint32_t epoch, int any_bad, uint32_t bad_code,
                              int32_t items) {
    a.ctl->refused = any_bad >= 0;
    if (any_bad >= 0) raise_refused(a, bad_code, (uint32_t)any_bad, epoch);
    a.ctl->ditems = items;
}

/* Per local slot: its count and each source's range of rows (a.count,
 * a.range), by one block. A thread's slots (up to kRangeSlots) and sources
 * (kRangeSources at a time) are loaded before any is stored: the stores
 * might alias the counts for all the compiler knows, so a loop that stored
 * between its loads made one trip to memory per slot and source (two for
 * Kimi's 416 slots on 256 threads; over a host inbox, each trip crosses the
 * link). Two by two: wider batches spilled registers all over the kernel.
 * Variant 2048: that loop (for comparing). */
constexpr int kRangeSlots = 2, kRangeSources = 2;
__device__ void slot_ranges(const Args &a, uint32_t epoch, const uint8_t *live, bool refused) {
    if (a.variant & 2048) {
        for (int64_t l = threadIdx.x; l < a.spr; l += blockDim.x) {
            int64_t acc = 0;
            for (int s = 0; s < a.R; s++) {
                const int64_t c =
                    refused || !live[s] ? 0 : *cnt_at(a, a.base, epoch, s, (int32_t)l);
                a.range[l * a.R + s] = (acc << 32) | c;
                acc += c;
            }
            a.count[l] = (int32_t)acc;
        }
        return;
    }
    const int32_t step = (int32_t)blockDim.x;
    for (int32_t l0 = threadIdx.x; l0 < a.spr; l0 += kRangeSlots * step) {
        int64_t acc[kRangeSlots] = {};
        for (int s0 = 0; s0 < a.R; s0 += kRangeSources) {
            int32_t c[kRangeSlots][kRangeSources];
#pragma unroll
            for (int u = 0; u < kRangeSlots; u++)
#pragma unroll
                for (int j = 0; j < kRangeSources; j++) {
                    const int32_t l = l0 + u * step;
                    const int s = s0 + j;
                    c[u][j] = l < a.spr && s < a.R && !refused && live[s]
                                  ? *cnt_at(a, a.base, epoch, s, l)
                                  : 0;
                }
#pragma unroll
            for (int u = 0; u < kRangeSlots; u++) {
                const int32_t l = l0 + u * step;
                if (l >= a.spr) continue;
#pragma unroll
                for (int j = 0; j < kRangeSources; j++) {
                    if (s0 + j >= a.R) break;
                    a.range[(int64_t)l * a.R + s0 + j] = (acc[u] << 32) | (int64_t)c[u][j];
                    acc[u] += c[u][j];
                }
            }
        }
#pragma unroll
        for (int u = 0; u < kRangeSlots; u++)
            if (l0 + u * step < a.spr) a.count[l0 + u * step] = (int32_t)acc[u];
    }
}

/*
 * Normal mode's receive (Args::compact), by the blocks from first_block on
 * (every block, or a large batch's meta blocks) once the first flags are
 * in: the slots' first entries (each block sums the sources' counts and
 * scans them in `so`, shared memory of spr + 1 ints; the range block also
 * stores them in offs), then the block's run of (row, k) items, one per
 * thread: its entry's index, weight, pair and token, and its row's place in
 * the inbox. No row is copied: the experts read them where the senders
 * wrote them.
 */
__device__ void receive_compact(const Args &a, uint32_t epoch, const int32_t *first_row,
                                int32_t items, const uint8_t *live, int32_t *so, bool range_block,
                                int32_t first_block) {
    const bool stamps = (a.variant & 8) && blockIdx.x == 0 && threadIdx.x == 0;
    const int K = a.K;
    /* Each block a run of items, rounded to whole warps: the placing's
     * scattered stores spread over every SM (grid-stride, variant 128,
     * left the items to the first blocks: 20.2 against 18.6 us at 1,024
     * tokens, H200). A thread's items: i0, i0 + step, ... below i1. */
    const int32_t nb = (int32_t)gridDim.x - first_block, b = (int32_t)blockIdx.x - first_block;
    auto run = [&](int32_t *i0, int32_t *i1, int32_t *step) {
        const int32_t chunk = ((items + nb - 1) / nb + 31) & ~31;
        *i0 = min(b * chunk, items) + (int32_t)threadIdx.x;
        *i1 = min(b * chunk + chunk, items);
        *step = (int32_t)blockDim.x;
        if (a.variant & 128) {
            *i0 = b * (int32_t)blockDim.x + (int32_t)threadIdx.x, *i1 = items;
            *step = nb * (int32_t)blockDim.x;
        }
    };
    /* Item (row, k)'s source, token and k. */
    auto locate = [&](int32_t item, int *s_out, int32_t *t_out, int *k_out) {
        const int32_t vrow = epxi_div(item, a.K_div);
        int s = 0;
        while (first_row[s + 1] <= vrow) s++;
        *s_out = s;
        *t_out = vrow - first_row[s];
        *k_out = item - vrow * K;
    };
    auto meta_at = [&](int s, int32_t t, int k) {
        return ((const Meta *)(rec_at(a, a.base, epoch, s, t) + a.meta_off))[k];
    };
    /* A thread's first meta is asked for before the slots' counts, so the
     * two trips to memory overlap (at 4,096 tokens most threads hold one
     * item or none). Only the meta and whether there was one stay live
     * across the scan (the run is worked out again after it: registers the
     * whole kernel would otherwise spill). Variant 8192: after the scan, as
     * before. */
    Meta m0 = {-1, 0.0f, 0, 0};
    bool early = false;
    if (!(a.variant & 8192)) {
        int32_t i0, i1, step;
        run(&i0, &i1, &step);
        if (i0 < i1) {
            int s, k;
            int32_t t;
            locate(i0, &s, &t, &k);
            m0 = meta_at(s, t, k);
            early = true;
        }
    }
    for (int l = threadIdx.x; l < a.spr; l += blockDim.x) {
        int32_t c = 0;
        for (int s = 0; s < a.R; s++)
            if (live[s]) c += *cnt_at(a, a.base, epoch, s, l);
        so[l] = c;
    }
    __syncthreads();
    if (stamps) a.ctl->stamp[16] = global_ns();
    block_scan_smem(so, a.spr);
    if (stamps) a.ctl->stamp[22] = global_ns();
    if (range_block)
        for (int l = threadIdx.x; l <= a.spr; l += blockDim.x) a.offs[l] = so[l];
    const int64_t area = (int64_t)parity(a, epoch) * a.R; /* this dispatch's rows in the inbox */
    int32_t i0, i1, step;
    run(&i0, &i1, &step);
    for (int32_t item = i0; item < i1; item += step) {
        int s, k;
        int32_t t;
        locate(item, &s, &t, &k);
        const Meta m = early && item == i0 ? m0 : meta_at(s, t, k);
        if (stamps) {
            asm volatile("" ::"r"(m.pos)); /* the stamp after the meta's load, not its issue */
            a.ctl->stamp[23] = global_ns();
        }
        const int64_t e = place_entry(a, epoch, m, s, t, k, live, item, so);
        if (e >= 0) a.etok[e] = (int32_t)((area + s) * a.M + t);
    }
}

/* Normal mode's wait for every source's rows flag (dflag_at), within a
 * timeout of its own (so a fault after the first flags is raised within two
 * timeouts); a timeout or an earlier fault as wait_flags has them. Normal
 * mode has no shrink mode and no relay, so this is wait_flags' poll alone,
 * in less code; a receive from senders without roles (every small batch)
 * never calls it, and its start's clock read stays off that path. (Out of
 * line, its call spilled ~500 bytes a thread in every dispatch instance.)
 * Returns with the block synchronised. */
__device__ bool wait_rows(const Args &a, uint32_t epoch) {
    const unsigned long long since = global_ns();
    __shared__ int ok;
    if (threadIdx.x == 0) ok = 1;
    __syncthreads();
    for (int i = threadIdx.x; i < a.R; i += blockDim.x) {
        const uint64_t *f = dflag_at(a, a.base, epoch, i);
        while ((uint32_t)(ld_acquire(f, scope(a)) >> 32) != epoch) {
            if (ld_volatile(&a.ctl->fault[0]) != F_NONE) {
                ok = 0;
                break;
            }
            if (global_ns() - since > a.timeout_ns) {
                raise_fault(a, F_TIMEOUT, PH_DISPATCH, (uint32_t)i, epoch);
                ok = 0;
                break;
            }
            if (!(a.variant & 4)) __nanosleep(64);
        }
    }
    __syncthreads();
    return ok != 0;
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
 * kHostRows (with kLean, not kBig): the lean instance over a host-memory
 * inbox, each received row read across the link once (place_row_slices);
 * the general instance's place_rows, with its spilled registers, took
 * ~5 us for one 14 KB row on the H100 where the lean reads take ~2.
 *
 * kFp8 (with kLean, not kBig or kHostRows): the lean instance's fp8 form
 * (DeepEP's, the flags in parts): the bf16 row held in registers is
 * quantised from there (quantize_regs) and a received record's data and
 * scales are read into registers once and stored to every place
 * (place_fp8_regs). Through the general instance, which reads the row from
 * memory after the routing, an fp8 dispatch took 1.5x bf16's time at 128
 * tokens (H100, bench/RESULTS.md).
 *
 * kBig: a batch past the staged ids (T * K > kSmemIds): positions from a
 * per-slot table of earlier tokens (P <= kSmemIds), sent a warp per item
 * by the lean instance (send_run_warps), a block per item with the next
 * item's loads issued early by the general one. Its own instance, since
 * that code cost small batches 0.2-0.5 us in the lean one (H200,
 * bench/RESULTS.md).
 */
template <bool kLean, bool kBig, int kT = kDispatchThreads, bool kHostRows = false,
          bool kFp8 = false>
__global__ void __launch_bounds__(kT, dispatch_blocks_per_sm(kT, kHostRows, kFp8))
    dispatch_kernel(Args a, int64_t T, const unsigned char *x, const void *slots,
                    const float *weights, uint32_t nwork, int parts) {
    epxi_pdl_wait(); /* first: src/core/pdl.cuh */
    const int ids64 = (parts & 4) != 0;
    const int fp8 = kLean && !kFp8 ? 0 : parts & (kFP8 | kRoundScale | kUE8M0);
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
        const int32_t t = epxi_div(item, a.dmax_div);
        if (pre) regs_load(v, x + (size_t)t * a.xrow, a.xrow);
        if (threadIdx.x < K) {
            sv = slot_at(slots, t * K + threadIdx.x, ids64);
            wv = weights ? weights[t * K + threadIdx.x] : 0.0f;
        }
    };
    const bool sending = (parts & 1) != 0;
    const bool compact = a.compact;
    /* Normal mode's two flags (the first flag's metas and counts, then the
     * rows'), in every instance the host may pick for it: the small, fp8
     * and host-rows ones, never given a compact receive (the host's small,
     * lean_fp8 and host_rows), keep one flag, so their code and spills stay
     * as they were (with the second flag's code the fp8 and host-rows
     * stacks grew from 40 and 24 to 72 and 40 bytes a thread, the small
     * bf16 instance from 5,424 to 6,280 instructions). */
    constexpr bool kSmall = small_dispatch(kT);
    const bool two_flags = !kSmall && !kFp8 && !kHostRows && compact;
    /* Normal mode's large batch (the lean kBig instance over a compact
     * receive) gives its blocks roles: the last five eighths ("meta
     * blocks", meta_share) count, write the metas and the per-slot counts,
     * publish the first flags (mflag_at) and place the entries as soon as
     * every source's are in, while the others ("row blocks") send the rows,
     * publish the rows' flags and end. The meta blocks end once every
     * source's rows are in. So the receive's entries are placed while the
     * rows stream, not after them (the receive took ~5-6 us after the flags
     * at 4,096 tokens: stamps, bench/RESULTS.md, twelfth session). */
    const bool roles = kLean && kBig && compact && gridDim.x >= 2 && !a.host_inbox && !a.staging;
    const int32_t meta_blocks = roles ? max(1, meta_share(a.variant, (int32_t)gridDim.x)) : 0;
    const int32_t row_blocks = (int32_t)gridDim.x - meta_blocks; /* roles: the first ones */
    const bool meta_block = roles && (int32_t)blockIdx.x >= row_blocks;
    /* A block's send items (token, j-th destination): every gridDim-th one
     * from its index, or (kBig) one contiguous run [i_lo, i_hi), so a large
     * batch's positions carry from one token to the next (tabled below);
     * with roles, the meta blocks hold the runs. */
    const int32_t nitems = sending ? Tn * dmax : 0;
    const int32_t run_blocks = roles ? meta_blocks : (int32_t)gridDim.x;
    const int32_t run_of = roles ? (int32_t)blockIdx.x - row_blocks : (int32_t)blockIdx.x;
    const int32_t per_block = kBig ? (nitems + run_blocks - 1) / run_blocks : 1;
    const int32_t i_lo = !kBig        ? (int32_t)blockIdx.x
                         : run_of < 0 ? nitems
                                      : min(run_of * per_block, nitems);
    const int32_t i_hi = kBig ? min(i_lo + per_block, nitems) : nitems;
    const int32_t i_step = kBig ? 1 : (int32_t)gridDim.x;
    /* The first item's loads are issued before the fault check, so the
     * two trips to memory overlap (not by the lean large-batch send, whose
     * warps read their rows themselves: send_run_warps). */
    const bool early_row = !(kLean && kBig);
    /* The fp8 instance's thread 0 asks for the epoch (take_epoch) before the
     * row: its send quantises before it stores, so the row is not the first
     * thing it waits for, and with the word's operation first its dispatch
     * took 0.15-0.35 us less at 1-128 tokens (0.05-0.1 once its registers
     * stopped spilling); the bf16 ones, whose send stores the row as soon
     * as it is routed, lost 0.1-1.4 us so (H100, bench/RESULTS.md,
     * thirteenth and fourteenth sessions). */
    const uint32_t epoch_fp8 =
        kFp8 && threadIdx.x == 0 ? take_epoch(&a.ctl->de_started, sending) : 0u;
    if (i_lo < i_hi && early_row) load_item(i_lo);
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
    const bool all_counts = tabled && run_of == (nitems - 1) / per_block;
    __shared__ int s_dead;
    __shared__ unsigned char *peer[kMaxRanks]; /* the peer table, read once */
    __shared__ int32_t hist[kCountInts];       /* this block's per-slot counts (send_counts) */
    STAMP(a, 5);
    STAMP_CLOCK(a, 6);
    /* Every load before the first barrier is asked for before any answer is
     * used: the fault word, each thread's first kIdsAhead staged ids and its
     * peer pointer, then thread 0's epoch word (an atomic), and only then
     * the stores. Issued in order, thread 0 waited for each in turn (the
     * epoch, the fault word, its ids, its peer: four trips to memory before
     * the barrier; stamps in bench/RESULTS.md). */
    const bool lead = threadIdx.x == 0;
    const uint32_t fault0 = lead ? ld_volatile(&a.ctl->fault[0]) : (uint32_t)F_NONE;
    int32_t idv[kIdsAhead];
#pragma unroll
    for (int u = 0; u < kIdsAhead; u++) {
        const int32_t q = (int32_t)threadIdx.x + u * (int32_t)blockDim.x;
        idv[u] = staged && q < Tn * K ? slot_at(slots, q, ids64) : 0;
    }
    unsigned char *const peer0 = (int)threadIdx.x < a.R ? a.peers[threadIdx.x] : nullptr;
    const uint32_t epoch0 = kFp8 ? epoch_fp8 : lead ? take_epoch(&a.ctl->de_started, sending) : 0u;
    /* The first nwork blocks send this rank's counts of the slots [clo, chi):
     * the first pass's histogram is zeroed here and counted after the first
     * barrier, off the send's own path. P * blocks is below 2^32 when P <
     * 2^16 (grids stay below 2^16). Worked out while the loads above are in
     * flight: before them, its two divisions and the zeroing delayed every
     * load of the prologue (machine code, bench/RESULTS.md). */
    const bool counting = sending && (roles || blockIdx.x < nwork);
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
    if (lead) {
        s_epoch = epoch0;
        s_dead = fault0 != F_NONE;
    }
    if (staged) {
#pragma unroll
        for (int u = 0; u < kIdsAhead; u++) {
            const int32_t q = (int32_t)threadIdx.x + u * (int32_t)blockDim.x;
            if (q < Tn * K) ids[q] = idv[u];
        }
        for (int32_t q = threadIdx.x + kIdsAhead * blockDim.x; q < Tn * K; q += blockDim.x)
            ids[q] = slot_at(slots, q, ids64);
    }
    stage_peers(a, peer, peer0);
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
        count_ids(tab, slots, ids64, 0, epxi_div(i_lo, a.dmax_div) * K, a.P);
    live_ranks(a, live); /* its barrier orders the counts before send_counts reads them */
    STAMP(a, 0);
    if (warp_send && meta_block)
        send_run_metas(a, peer, epoch, i_lo, i_hi, dmax, slots, ids64, weights, tab, live,
                       bad_slot);
    else if (warp_send && roles)
        send_rows_strided(a, peer, epoch, dmax, nitems, row_blocks, x, slots, ids64, weights, live);
    else if (warp_send)
        send_run_warps(a, peer, epoch, i_lo, i_hi, dmax, Tn, x, slots, ids64, weights, tab, live,
                       all_counts, bad_slot);
    int32_t fetched = -1; /* the item whose loads were issued early (below) */
    for (int32_t item = i_lo; !warp_send && item < i_hi; item += i_step) {
        const int32_t t = epxi_div(item, a.dmax_div);
        const int j = item - t * dmax;
        if ((item != i_lo || !early_row) && (!kBig || item != fetched)) load_item(item);
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
                /* Destinations ascending, without a serial scan. Up to 32
                 * ranks: one OR of the lanes' rank bits is the set, and lane
                 * L writes rank L at the count of the set's bits below it,
                 * a few instructions on the one warp that routes a token
                 * instead of the K-step shuffle loop below (which also made
                 * the host instance spill: bench/RESULTS.md). More ranks:
                 * each first occurrence counts the smaller ones. */
                const int r = kept >= 0 ? epxi_div(kept, a.spr_div) : INT_MAX;
                if (a.R <= 32) {
                    const unsigned ranks =
                        __reduce_or_sync(0xffffffffu, r != INT_MAX ? 1u << r : 0u);
                    if ((ranks >> lane) & 1u) d[__popc(ranks & ((1u << lane) - 1u))] = lane;
                    if (lane == 0) nd = __popc(ranks);
                } else {
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
                }
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
            if (fp8 && pre)
                quantize_regs(a, rec, v, fp8 & kRoundScale);
            else if (fp8)
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
                const bool here = sk[k] >= 0 && epxi_div(sk[k], a.spr_div) == dst;
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
        /* With roles the meta blocks count in for the first flags and the
         * row blocks for the rows'; otherwise normal mode publishes both
         * at once. */
        if (meta_block)
            arrive(&a.ctl->arrive_m, (uint32_t)meta_blocks, bad_slot, scope(a), [&](bool marked) {
                publish_dispatch<kMetasFlag>(a, peer, epoch, Tn, live, marked);
            });
        else if (two_flags && !roles)
            arrive(&a.ctl->arrive_d, nwork, bad_slot, scope(a), [&](bool marked) {
                publish_dispatch<kRowsFlag | kMetasFlag>(a, peer, epoch, Tn, live, marked);
            });
        else
            arrive(&a.ctl->arrive_d, roles ? (uint32_t)row_blocks : nwork, bad_slot, scope(a),
                   [&](bool marked) {
                       publish_dispatch<kRowsFlag>(a, peer, epoch, Tn, live, marked);
                   });
    }
    if (!(parts & 2) || (roles && !meta_block)) {
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
    __shared__ bool s_rows_in;
    /* Normal mode: the first flags (metas and counts) now, the rows' after
     * the entries are placed. The general instances wait for the rows first
     * (every normal-mode sender publishes their flags), so their receive has
     * one wait after this one: a second wait after the placing made them
     * spill ~90 bytes more a thread. */
    if (!kLean && two_flags && !wait_rows(a, epoch)) return;
    if (!wait_flags(a, two_flags ? mflag_at(a, a.base, epoch, 0) : dflag_at(a, a.base, epoch, 0),
                    two_flags ? sizeof(uint64_t) : dflag_stride(a), a.R, epoch, PH_DISPATCH, live,
                    a.decided, a.host_inbox ? a.ctl->relay[0] : nullptr, flag_cnt))
        return;
    STAMP(a, 3);
    /* The sources' rows: which flag refused the batch, and the prefix of the
     * rows. Lean with R <= 32: every warp works them out in registers from
     * its lanes (lane r: source r), with no barrier and no shared result
     * (item_rec reads them by shuffles); otherwise thread 0 writes
     * first_row for the block. */
    const bool warp_rows = kLean && a.R <= 32 && !compact;
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
            const Refusal no = sources_rows(a, flag_cnt, first_row, two_flags);
            s_any_bad = no.r;
            s_bad_code = no.code;
            s_rows_in = no.rows_in;
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
    /* Received row `row`'s source and token (whole warps alike, as above). */
    auto row_source = [&](int32_t row, int *s_out, int32_t *t_out) {
        int s = 0;
        int32_t below = 0; /* rows of the sources below s */
        if (warp_rows) {
            s = __popc(__ballot_sync(0xffffffffu, lane < a.R && row_incl <= row));
            below = __shfl_sync(0xffffffffu, row_excl, s);
        } else {
            while (first_row[s + 1] <= row) s++;
            below = first_row[s];
        }
        *s_out = s;
        *t_out = row - below;
    };
    auto item_rec = [&](int32_t item, int *s_out, int32_t *t_out, int *k_out) {
        const int32_t vrow = epxi_div(item, a.K_div);
        row_source(vrow, s_out, t_out);
        *k_out = item - vrow * K;
        return rec_at(a, a.base, epoch, *s_out, *t_out);
    };
    STAMP(a, 19);
    Meta first_meta = {-1, 0.0f, 0, 0};
    int s0 = 0, k0 = 0;
    int32_t t0 = 0;
    const unsigned char *rec0 = nullptr;
    if ((int32_t)blockIdx.x < items && (int32_t)blockIdx.x < placing && !kHostRows &&
        (kLean || !a.host_inbox) && !compact) {
        rec0 = item_rec(blockIdx.x, &s0, &t0, &k0);
        if (threadIdx.x == 0) first_meta = ((const Meta *)(rec0 + a.meta_off))[k0];
        if (pre) regs_load(v, rec0, fp8 ? fp8_rec_bytes(a) : a.xrow);
    }
    if ((int32_t)blockIdx.x == (roles ? row_blocks : 0) && threadIdx.x == 0)
        batch_verdict(a, epoch, any_bad, bad_code, items);
    /* The slot ranges by the range block alone (the host launches one block
     * more than the items need), so no placing block carries this trip to
     * memory. */
    if (range_block) slot_ranges(a, epoch, live, refused);
    STAMP(a, 20);
    if (refused) {
        advance();
        return;
    }
    if (compact) {
        receive_compact(a, epoch, first_row, items, live, ids, range_block, roles ? row_blocks : 0);
        STAMP(a, 4);
        /* The rows: every source's flag, unless every first flag said the
         * rows came with it (senders without roles publish both at once). */
        if (kLean && two_flags && !s_rows_in && !wait_rows(a, s_epoch)) return;
        advance();
        return;
    }
    if (kHostRows) {
        place_row_slices(a, epoch, rows_total, placing, live, row_source);
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
    __shared__ uint32_t dst_l, dst_s; /* kFp8: dst_row's slot and row in it */
    for (int32_t item = blockIdx.x; item < items && (int32_t)blockIdx.x < placing;
         item += placing) {
        const bool first = item == (int32_t)blockIdx.x;
        int s = s0, k = k0;
        int32_t t = t0;
        const unsigned char *rec = first ? rec0 : item_rec(item, &s, &t, &k);
        if (pre && !first) regs_load(v, rec, fp8 ? fp8_rec_bytes(a) : a.xrow);
        if (threadIdx.x == 0) {
            const Meta m = first ? first_meta : ((const Meta *)(rec + a.meta_off))[k];
            dst_row = place_entry(a, epoch, m, s, t, k, live, item);
            if (kFp8 && dst_row >= 0) { /* expert-major: dst_row = m.slot * RM + row */
                dst_l = (uint32_t)m.slot;
                dst_s = (uint32_t)(dst_row - (int64_t)m.slot * a.RM);
            }
        }
        __syncthreads();
        STAMP(a, 21);
        const int64_t e = dst_row;
        if (kFp8 && e >= 0) {
            place_fp8_regs(a, v, e, dst_l, dst_s, fp8 & kUE8M0);
        } else if (e >= 0 && fp8) {
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

} // namespace
