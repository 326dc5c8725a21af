/*
 * ll_combine.cuh - the GPU engine's identity experts and combine (part of
 * ll_ep.cu's one translation unit, after ll_dispatch.cuh): the entries'
 * outputs sent back to their tokens' ranks, and each token's fixed-order
 * fp32 sum of its k rows (ep_common.h's formula), in 16-byte lanes.
 */
#pragma once

namespace {

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
__global__ void __launch_bounds__(kDispatchThreads) identity_kernel(Args a, int fp8) {
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
template <bool kLean, int kT = kCombineThreads>
__global__ void __launch_bounds__(kT, blocks_per_sm(kT))
    combine_kernel(Args a, int64_t T, const unsigned char *ysrc, const float *wsrc, void *out,
                   int out_bf16, int parts) {
    /* The epoch, the fault word, the peer table, the dispatch's item count
     * and this block's first item are loaded before the first barrier, so
     * the trips to memory overlap. */
    __shared__ uint32_t s_epoch;
    __shared__ int s_dead;
    __shared__ int32_t s_items;
    __shared__ Work s_first;
    epxi_pdl_wait(); /* first: src/core/pdl.cuh */
    STAMP(a, 15);
    /* All of them asked for before any answer is used, the epoch's atomic
     * last (dispatch_kernel's prologue says why). */
    const bool lead = threadIdx.x == 0, sending = (parts & 1) != 0;
    const uint32_t fault0 = lead ? ld_volatile(&a.ctl->fault[0]) : (uint32_t)F_NONE;
    const int32_t items0 = lead && sending ? a.ctl->ditems : 0;
    const bool has_first = lead && sending && (int64_t)blockIdx.x < a.RM * a.K;
    const Work first0 = has_first ? a.work[blockIdx.x] : Work{-1, 0, 0};
    const bool refused = a.ctl->refused != 0; /* set by this rank's dispatch, before us */
    unsigned char *const peer0 = (int)threadIdx.x < a.R ? a.peers[threadIdx.x] : nullptr;
    const uint32_t epoch0 = lead ? take_epoch(&a.ctl->ce_started, sending) : 0u;
    if (lead) {
        s_epoch = epoch0;
        s_dead = fault0 != F_NONE;
        s_items = items0;
        if (has_first) s_first = first0;
    }
    __shared__ unsigned char *peer[kMaxRanks]; /* the peer table, read once */
    __shared__ uint8_t live[kMaxRanks];        /* ranks sent to, then sources received from */
    stage_peers(a, peer, peer0);
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
            const int32_t src = epxi_div(w.pair, a.MK_div), tk = w.pair - src * MK;
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
                release_flags(a, live, epxi_ll_flag(epoch, 0),
                              [&](int r) { return cflag_at(a, peer[r], epoch, filed_as(a, r)); });
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
    const int32_t Tn = (int32_t)T, per = V * (int32_t)blockDim.x, chunks = a.chunks;
    const size_t orow = (size_t)a.H * (out_bf16 ? 2 : 4);
    __shared__ const unsigned char *rows[kMaxK];
    __shared__ float wk[kMaxK];
    auto stage = [&](int32_t t) {
        for (int k = threadIdx.x; k < K; k += blockDim.x) {
            const int32_t sl = a.slots[t * K + k];
            const int r = sl >= 0 ? epxi_div(sl, a.spr_div) : -1;
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
    const int32_t first_t =
        (int32_t)blockIdx.x < Tn * chunks ? epxi_div((int32_t)blockIdx.x, a.chunks_div) : -1;
    if (first_t >= 0) stage(first_t); /* wait_flags synchronises the block */
    if (!wait_flags(a, cflag_at(a, a.base, epoch, 0), cflag_stride(a), a.R, epoch, PH_COMBINE, live,
                    a.decided ? a.decided + a.R : nullptr,
                    a.host_inbox ? a.ctl->relay[1] : nullptr))
        return;
    const unsigned long long started = (parts & 1) ? prefetch_started(&a.ctl->ce_started) : 0;
    if (a.shrink && first_t >= 0) { /* live[] may have lost a rank while waiting */
        stage(first_t);
        __syncthreads();
    }
    STAMP(a, 11);
    for (int32_t item = blockIdx.x; item < Tn * chunks; item += gridDim.x) {
        const int32_t t = epxi_div(item, a.chunks_div),
                      h0 = (item - t * chunks) * per + (int32_t)threadIdx.x * V;
        if (item != blockIdx.x) stage(t);
        __syncthreads();
        STAMP(a, 26);
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
            a.ctl->stamp[32 + threadIdx.x / 32] = global_ns();
        __syncthreads();
    }
    STAMP(a, 12);
    if (parts & 1) advance_epoch(a, &a.ctl->ce_started, epoch, PH_COMBINE, started);
}

} // namespace
