/*
 * nccl_ep.cu - EP dispatch and combine on the GPU over NCCL: the same
 * protocol, record layout and reduction order as the host path (ep.c), with
 * the bookkeeping done by kernels and CUB instead of loops.
 *
 * Dispatch:
 *   1. count: per (destination rank r, token t) a packed word
 *      (entries of t on r) << 32 | 1 when t goes to r, in an [R][T] array;
 *   2. one inclusive scan (CUB) of that array gives, for every (r, t), the
 *      token's row in the send buffer (low half: tokens before it, r-major)
 *      and where its outputs will come back (high half: entries before it);
 *      the per-rank totals are differences of the scan;
 *   3. pack: one block per token copies its row into each destination's
 *      record and writes the (slot, weight) list;
 *   4. counts travel (2 int64 per peer, a negative count flags bad input on
 *      the sender so every rank fails together), come to the host, and the
 *      records follow as one group of ncclSend/ncclRecv;
 *   5. the receiver sorts its (row, k) entries by local slot with a stable
 *      radix sort (CUB), so each slot's entries keep (source, token, k)
 *      order, exactly the host path's.
 * Combine sends the expert rows back (one per entry, or one pre-reduced row
 * per token and rank) and reduces each token in fp32 with __fmul_rn /
 * __fadd_rn, so no FMA contraction makes it differ from the host's bits.
 */
#include <cub/cub.cuh>
#include <cuda_bf16.h>

#include "epx_comm_nccl.h"
#include "ep_common.h"
#include "nccl_internal.h"

namespace {

constexpr int MAXK = EPX_MOE_MAX_TOP_K;

/* "No bad slot yet": the byte pattern cudaMemsetAsync(0x7f) writes, so the
 * reset is an asynchronous memset rather than a copy from host memory. */
constexpr int32_t NO_BAD = 0x7f7f7f7f;

__global__ void k_count(const int32_t *slots, int T, int K, int spr, int P, uint64_t *flag,
                        int32_t *bad) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const int32_t *s = slots + (size_t)t * K;
    for (int k = 0; k < K; k++)
        if (s[k] < -1 || s[k] >= P) {
            atomicMin(&bad[0], t * K + k);
            atomicExch(&bad[1], s[k]);
            return;
        }
    int32_t d[MAXK];
    int nd = epxi_ep_token_dests(s, K, spr, d);
    for (int j = 0; j < nd; j++) {
        uint64_t ent = 0;
        for (int k = 0; k < K; k++) ent += s[k] >= 0 && s[k] / spr == d[j];
        flag[(size_t)d[j] * T + t] = (ent << 32) | 1u;
    }
}

__global__ void k_totals(const uint64_t *scan, int T, int R, const int32_t *bad, int64_t *sendc) {
    for (int r = threadIdx.x; r < R; r += blockDim.x) {
        uint64_t end = T > 0 ? scan[(size_t)r * T + T - 1] : 0;
        uint64_t start = (r > 0 && T > 0) ? scan[(size_t)r * T - 1] : 0;
        uint64_t dlt = end - start;
        bool invalid = bad[0] != NO_BAD;
        sendc[2 * r] = invalid ? -1 : (int64_t)(dlt & 0xffffffffu);
        sendc[2 * r + 1] = invalid ? -1 : (int64_t)(dlt >> 32);
    }
}

__global__ void k_pack(const unsigned char *x, const int32_t *slots, const float *w, int T, int K,
                       int spr, const uint64_t *flag, const uint64_t *scan, unsigned char *send,
                       size_t rec, size_t meta_off, size_t xrow, int32_t *ret_pos,
                       int32_t *tok_ndest, int32_t *tok_dpos, int dmax, int topk_mode,
                       const int32_t *bad) {
    int t = blockIdx.x;
    if (bad[0] != NO_BAD) return; /* a slot is out of range: the batch is refused */
    __shared__ int32_t d[MAXK];
    __shared__ int64_t pos[MAXK], ebase[MAXK];
    __shared__ int nd;
    const int32_t *s = slots + (size_t)t * K;
    if (threadIdx.x == 0) {
        nd = epxi_ep_token_dests(s, K, spr, d);
        for (int j = 0; j < nd; j++) {
            size_t i = (size_t)d[j] * T + t;
            uint64_t ex = scan[i] - flag[i];
            pos[j] = (int64_t)(ex & 0xffffffffu);
            ebase[j] = (int64_t)(ex >> 32);
        }
    }
    __syncthreads();
    const unsigned char *row = x + (size_t)t * xrow;
    for (int j = 0; j < nd; j++) {
        unsigned char *dst = send + (size_t)pos[j] * rec;
        if (xrow % 4 == 0) {
            for (size_t b = threadIdx.x; b < xrow / 4; b += blockDim.x)
                ((uint32_t *)dst)[b] = ((const uint32_t *)row)[b];
        } else {
            for (size_t b = threadIdx.x; b < xrow; b += blockDim.x) dst[b] = row[b];
        }
        epxi_ep_meta *m = (epxi_ep_meta *)(dst + meta_off);
        for (int k = threadIdx.x; k < K; k += blockDim.x) {
            bool here = s[k] >= 0 && s[k] / spr == d[j];
            m[k].slot = here ? s[k] - d[j] * spr : -1;
            m[k].weight = here ? w[(size_t)t * K + k] : 0.0f;
        }
    }
    if (threadIdx.x == 0) {
        tok_ndest[t] = nd;
        if (topk_mode) {
            int64_t run[MAXK];
            for (int j = 0; j < nd; j++) run[j] = ebase[j];
            for (int k = 0; k < K; k++) {
                int32_t p = -1;
                if (s[k] >= 0)
                    for (int j = 0; j < nd; j++)
                        if (d[j] == s[k] / spr) p = (int32_t)run[j]++;
                ret_pos[(size_t)t * K + k] = p;
            }
        } else {
            for (int j = 0; j < nd; j++) tok_dpos[(size_t)t * dmax + j] = (int32_t)pos[j];
        }
    }
}

__global__ void k_keys(const unsigned char *recv, int64_t n, int K, int spr, size_t rec,
                       size_t meta_off, int32_t *keys, int32_t *vals, int32_t *bad) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n * K) return;
    const epxi_ep_meta *m = (const epxi_ep_meta *)(recv + (size_t)(idx / K) * rec + meta_off);
    int32_t s = m[idx % K].slot;
    if (s < -1 || s >= spr) atomicExch(&bad[2], 1);
    keys[idx] = s >= 0 && s < spr ? s : spr;
    vals[idx] = (int32_t)idx;
}

__global__ void k_entries(int64_t ne, int K, const int32_t *vals, const unsigned char *recv,
                          size_t rec, size_t meta_off, int32_t *entry_token, float *entry_weight,
                          int32_t *row_entries) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= ne) return;
    int32_t v = vals[e];
    int32_t i = v / K, k = v % K;
    const epxi_ep_meta *m = (const epxi_ep_meta *)(recv + (size_t)i * rec + meta_off);
    entry_token[e] = i;
    entry_weight[e] = m[k].weight;
    row_entries[v] = (int32_t)e;
}

__global__ void k_slot_offsets(const int32_t *keys, int64_t n, int spr, int64_t *so) {
    for (int s = threadIdx.x; s <= spr; s += blockDim.x) {
        int64_t lo = 0, hi = n; /* first index with keys[i] >= s */
        while (lo < hi) {
            int64_t mid = (lo + hi) / 2;
            if (keys[mid] < s)
                lo = mid + 1;
            else
                hi = mid;
        }
        so[s] = lo;
    }
}

__global__ void k_valid(const int32_t *row_entries, int64_t n, int32_t *flag) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) flag[i] = row_entries[i] >= 0;
}

__global__ void k_cpack(const int32_t *row_entries, const int32_t *cpos, int K,
                        const unsigned char *y, unsigned char *csend, size_t yrow) {
    int64_t i = blockIdx.x;
    for (int k = 0; k < K; k++) {
        int32_t e = row_entries[i * K + k];
        if (e < 0) continue;
        const uint32_t *src = (const uint32_t *)(y + (size_t)e * yrow);
        uint32_t *dst = (uint32_t *)(csend + (size_t)cpos[i * K + k] * yrow);
        if (yrow % 4 == 0) {
            for (size_t b = threadIdx.x; b < yrow / 4; b += blockDim.x) dst[b] = src[b];
        } else {
            for (size_t b = threadIdx.x; b < yrow; b += blockDim.x)
                ((unsigned char *)dst)[b] = ((const unsigned char *)src)[b];
        }
    }
}

/* One block per token (or received row): its K rows and weights in shared
 * memory, then the one combine formula (ep_common.h) per element. */
__device__ void reduce_row(const unsigned char *const *rows, const float *w, int n, int H, int bf16,
                           unsigned char *dst, float *out) {
    for (int h = threadIdx.x; h < H; h += blockDim.x) {
        float acc = epxi_ep_combine_elem(rows, w, n, h, bf16);
        if (out)
            out[h] = acc;
        else
            epxi_row_store(dst, h, acc, bf16);
    }
}

__global__ void k_partial(const int32_t *row_entries, const float *entry_weight, int K, int H,
                          const unsigned char *y, unsigned char *csend, size_t yrow, int bf16) {
    __shared__ const unsigned char *rows[MAXK];
    __shared__ float w[MAXK];
    int64_t i = blockIdx.x;
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
        int32_t e = row_entries[i * K + k];
        rows[k] = e < 0 ? nullptr : y + (size_t)e * yrow;
        w[k] = e < 0 ? 0.0f : entry_weight[e];
    }
    __syncthreads();
    reduce_row(rows, w, K, H, bf16, csend + (size_t)i * yrow, nullptr);
}

__global__ void k_reduce_topk(const int32_t *ret_pos, const float *w, int K, int H,
                              const unsigned char *crecv, size_t yrow, int bf16, float *out) {
    __shared__ const unsigned char *rows[MAXK];
    int64_t t = blockIdx.x;
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
        int32_t p = ret_pos[t * K + k];
        rows[k] = p < 0 ? nullptr : crecv + (size_t)p * yrow;
    }
    __syncthreads();
    reduce_row(rows, w + t * K, K, H, bf16, nullptr, out + t * H);
}

__global__ void k_reduce_rank(const int32_t *tok_ndest, const int32_t *tok_dpos, int dmax, int H,
                              const unsigned char *crecv, size_t yrow, int bf16, float *out) {
    __shared__ const unsigned char *rows[MAXK];
    int64_t t = blockIdx.x;
    for (int j = threadIdx.x; j < tok_ndest[t]; j += blockDim.x)
        rows[j] = crecv + (size_t)tok_dpos[t * dmax + j] * yrow;
    __syncthreads();
    reduce_row(rows, nullptr, tok_ndest[t], H, bf16, nullptr, out + t * H);
}

__global__ void k_identity(const unsigned char *x, size_t stride, int xbf16, const int32_t *rows,
                           int H, unsigned char *y, size_t yrow, int ybf16) {
    int64_t e = blockIdx.x;
    const unsigned char *src = x + (size_t)rows[e] * stride;
    for (int h = threadIdx.x; h < H; h += blockDim.x)
        epxi_row_store(y + (size_t)e * yrow, h, epxi_row_load(src, h, xbf16), ybf16);
}

unsigned grid_for(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

} // namespace

/* Device buffers inside the workspace (byte offsets). */
struct nep_layout {
    size_t send_rec, recv_rec, y, csend, crecv, weights, ret_pos, tok_ndest, tok_dpos, entry_token,
        entry_weight, slot_offsets, row_entries, flag, scan, keys_in, keys_out, vals_in, vals_out,
        counts, bad, temp, total;
    size_t temp_bytes;
};

struct epx_nccl_ep {
    epx_comm *comm;
    epxi_nccl_ctx *nc;
    epxi_ep_geom g;
    int32_t me, sort_bits;
    nep_layout lay;
    unsigned char *ws;
    bool own_ws;
    int64_t *hcounts; /* pinned: [2R] sent, [2R] received, then bad[4] as int32 */
    int64_t *ntok, *nent, *rtok, *rent, *stokoff, *rtokoff, *coff, *rentoff; /* host [R] */
    int64_t T, nrecv_tok, nrecv_ent;
    bool dispatched;
    int64_t last_dispatch_bytes, last_combine_bytes;
};

template <typename T> static T *dws(const epx_nccl_ep *ep, size_t off) {
    return reinterpret_cast<T *>(ep->ws + off);
}

static epx_status plan(epx_nccl_ep *ep, const epx_ep_config *cfg, int32_t R, epx_error *err) {
    if (cfg != NULL && cfg->version == EPX_EP_CONFIG_VERSION && cfg->mode != EPX_EP_MODE_NORMAL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_nccl_ep_* runs normal mode; the GPU low-latency engine is "
                         "epx_gpu_ep_create (epx_comm_gpu.h)");
    EPX_TRY(epxi_ep_geom_init(cfg, R, &ep->g, err));
    const epxi_ep_geom *g = &ep->g;
    const double K = g->K, T = (double)g->M;
    ep->sort_bits = 1;
    while ((1 << ep->sort_bits) <= g->spr) ep->sort_bits++;
    /* CUB scratch: the larger of the scans and the sort at their largest. */
    size_t t1 = 0, t2 = 0, t3 = 0;
    int n_flag = (int)(R * g->M), n_ent = (int)(g->cap_tok * g->K);
    cub::DeviceScan::InclusiveSum(nullptr, t1, (uint64_t *)nullptr, (uint64_t *)nullptr, n_flag);
    cub::DeviceRadixSort::SortPairs(nullptr, t2, (int32_t *)nullptr, (int32_t *)nullptr,
                                    (int32_t *)nullptr, (int32_t *)nullptr, n_ent, 0,
                                    ep->sort_bits);
    cub::DeviceScan::ExclusiveSum(nullptr, t3, (int32_t *)nullptr, (int32_t *)nullptr, n_ent);
    ep->lay.temp_bytes = t1 > t2 ? (t1 > t3 ? t1 : t3) : (t2 > t3 ? t2 : t3);
    const double csend_rows = (double)(g->topk_mode ? g->cap_ent : g->cap_tok);
    const double tok = (double)g->cap_tok, ent = (double)g->cap_ent;
    nep_layout *l = &ep->lay;
    epxi_ws_part parts[] = {
        {&l->send_rec, T * g->dmax, (double)g->rec},
        {&l->recv_rec, tok, (double)g->rec},
        {&l->y, ent, (double)g->yrow},
        {&l->csend, csend_rows, (double)g->yrow},
        {&l->crecv, (double)g->cap_back, (double)g->yrow},
        {&l->weights, T * K, 4},
        {&l->ret_pos, T * K, 4},
        {&l->tok_ndest, T, 4},
        {&l->tok_dpos, T * g->dmax, 4},
        {&l->entry_token, ent, 4},
        {&l->entry_weight, ent, 4},
        {&l->slot_offsets, (double)g->spr + 1, 8},
        {&l->row_entries, tok * K, 4},
        {&l->flag, (double)R * T, 8},
        {&l->scan, (double)R * T, 8},
        {&l->keys_in, tok * K, 4},
        {&l->keys_out, tok * K, 4},
        {&l->vals_in, tok * K, 4},
        {&l->vals_out, tok * K, 4},
        {&l->counts, (double)4 * R, 8},
        {&l->bad, 4, 4},
        {&l->temp, (double)l->temp_bytes, 1},
    };
    return epxi_ws_carve(parts, sizeof parts / sizeof parts[0], 256, &l->total, "NCCL EP", err);
}

extern "C" epx_status epx_nccl_ep_workspace_bytes(const epx_ep_config *cfg, int32_t num_ranks,
                                                  size_t *bytes, epx_error *err) {
    if (bytes == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "bytes must not be NULL");
    epx_nccl_ep tmp;
    memset(&tmp, 0, sizeof tmp);
    EPX_TRY(plan(&tmp, cfg, num_ranks, err));
    *bytes = tmp.lay.total;
    return EPX_OK;
}

extern "C" void epx_nccl_ep_destroy(epx_nccl_ep *ep) {
    if (ep == NULL) return;
    if (ep->nc != NULL && !ep->nc->aborted) cudaStreamSynchronize(ep->nc->stream);
    if (ep->own_ws) cudaFree(ep->ws);
    if (ep->hcounts) cudaFreeHost(ep->hcounts);
    free(ep->ntok);
    free(ep);
}

extern "C" epx_status epx_nccl_ep_create(epx_comm *comm, const epx_ep_config *cfg, void *workspace,
                                         size_t workspace_bytes, epx_nccl_ep **out,
                                         epx_error *err) {
    epxi_nccl_ctx *nc = epxi_nccl_ctx_of(comm);
    if (nc == NULL || out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_nccl_ep_create needs a communicator from epx_comm_nccl_create (got "
                         "'%s') and an out pointer",
                         epx_comm_name(comm));
    epx_nccl_ep *ep = (epx_nccl_ep *)epxi_calloc(1, sizeof *ep, "NCCL EP handle", err);
    if (ep == NULL) return EPX_ERR_NOMEM;
    epx_status st = plan(ep, cfg, epx_comm_size(comm), err);
    if (st != EPX_OK) {
        free(ep);
        return st;
    }
    ep->comm = comm;
    ep->nc = nc;
    ep->me = epx_comm_rank(comm);
    int32_t R = ep->g.R;
    ep->ntok = (int64_t *)epxi_calloc((size_t)8 * R, sizeof(int64_t), "NCCL EP counts", err);
    if (ep->ntok == NULL) {
        free(ep);
        return EPX_ERR_NOMEM;
    }
    ep->nent = ep->ntok + R;
    ep->rtok = ep->nent + R;
    ep->rent = ep->rtok + R;
    ep->stokoff = ep->rent + R;
    ep->rtokoff = ep->stokoff + R;
    ep->coff = ep->rtokoff + R;
    ep->rentoff = ep->coff + R;
    cudaError_t ce = cudaMallocHost((void **)&ep->hcounts, (size_t)4 * R * 8 + 16);
    if (ce != cudaSuccess) {
        epx_nccl_ep_destroy(ep);
        return epxi_cuda_fail(ce, "NCCL EP pinned counts", err);
    }
    if (workspace != NULL) {
        if (workspace_bytes < ep->lay.total || (uintptr_t)workspace % 256 != 0) {
            size_t need = ep->lay.total;
            epx_nccl_ep_destroy(ep);
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "NCCL EP workspace of %zu bytes is too small or not 256-byte "
                             "aligned: it needs %zu (epx_nccl_ep_workspace_bytes)",
                             workspace_bytes, need);
        }
        ep->ws = (unsigned char *)workspace;
    } else {
        ce = cudaMalloc((void **)&ep->ws, ep->lay.total);
        if (ce != cudaSuccess) {
            epx_nccl_ep_destroy(ep);
            return epxi_cuda_fail(ce, "NCCL EP workspace", err);
        }
        ep->own_ws = true;
    }
    *out = ep;
    return EPX_OK;
}

static void prefix(const int64_t *n, int64_t *off, int32_t R) {
    int64_t acc = 0;
    for (int32_t r = 0; r < R; r++) {
        off[r] = acc;
        acc += n[r];
    }
}

/* One group of sends and receives of rows of `row` bytes. */
static epx_status exchange(epx_nccl_ep *ep, const unsigned char *send, const int64_t *sc,
                           const int64_t *so, unsigned char *recv, const int64_t *rc,
                           const int64_t *ro, size_t row, const char *what, epx_error *err) {
    epxi_nccl_ctx *c = ep->nc;
    EPX_TRY(epxi_nccl_check(c, ncclGroupStart(), what, err));
    ncclResult_t r = ncclSuccess;
    for (int32_t p = 0; p < ep->g.R && r == ncclSuccess; p++) {
        if (sc[p] > 0)
            r = ncclSend(send + (size_t)so[p] * row, (size_t)sc[p] * row, ncclUint8, p, c->comm,
                         c->stream);
        if (r == ncclSuccess && rc[p] > 0)
            r = ncclRecv(recv + (size_t)ro[p] * row, (size_t)rc[p] * row, ncclUint8, p, c->comm,
                         c->stream);
    }
    ncclResult_t e = ncclGroupEnd();
    EPX_TRY(epxi_nccl_check(c, r, what, err));
    return epxi_nccl_check(c, e, what, err);
}

#define LAUNCH_CHECK(what)                                                                         \
    do {                                                                                           \
        cudaError_t le_ = cudaGetLastError();                                                      \
        if (le_ != cudaSuccess) return epxi_cuda_fail(le_, (what), err);                           \
    } while (0)

extern "C" epx_status epx_nccl_ep_dispatch(epx_nccl_ep *ep, int64_t T, const void *x,
                                           const int32_t *topk_slots, const float *topk_weights,
                                           epx_ep_recv *recv, epx_error *err) {
    if (ep == NULL || recv == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "NCCL EP dispatch needs a handle and a recv view");
    EPX_TRY(epx_comm_health(ep->comm, err));
    const int32_t R = ep->g.R, K = ep->g.K, spr = ep->g.spr;
    if (T < 0 || T > ep->g.M)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "NCCL EP dispatch of %lld tokens is outside [0, max_tokens %lld]",
                         (long long)T, (long long)ep->g.M);
    if (T > 0 && (x == NULL || topk_slots == NULL || topk_weights == NULL))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "NCCL EP dispatch needs x, topk_slots, topk_weights");
    cudaStream_t s = ep->nc->stream;
    ep->dispatched = false;
    ep->T = T;
    const bool topk_mode = ep->g.cfg.combine == EPX_EP_COMBINE_TOPK;
    uint64_t *flag = dws<uint64_t>(ep, ep->lay.flag), *scan = dws<uint64_t>(ep, ep->lay.scan);
    int64_t *sendc = dws<int64_t>(ep, ep->lay.counts), *recvc = sendc + 2 * R;
    int32_t *bad = dws<int32_t>(ep, ep->lay.bad);
    EPXI_CUDA_TRY(cudaMemsetAsync(bad, 0x7f, 4 * sizeof(int32_t), s), "NCCL EP dispatch: reset");
    if (T > 0) {
        EPXI_CUDA_TRY(cudaMemcpyAsync(dws<float>(ep, ep->lay.weights), topk_weights,
                                      (size_t)T * K * 4, cudaMemcpyDeviceToDevice, s),
                      "NCCL EP dispatch: weights");
        EPXI_CUDA_TRY(cudaMemsetAsync(flag, 0, (size_t)R * T * 8, s), "NCCL EP dispatch: flags");
        k_count<<<grid_for(T, 128), 128, 0, s>>>(topk_slots, (int)T, K, spr, ep->g.P, flag, bad);
        LAUNCH_CHECK("NCCL EP count kernel");
        size_t tb = ep->lay.temp_bytes;
        EPXI_CUDA_TRY(
            cub::DeviceScan::InclusiveSum(ep->ws + ep->lay.temp, tb, flag, scan, (int)(R * T), s),
            "NCCL EP scan");
        k_pack<<<(unsigned)T, 128, 0, s>>>(
            (const unsigned char *)x, topk_slots, topk_weights, (int)T, K, spr, flag, scan,
            dws<unsigned char>(ep, ep->lay.send_rec), ep->g.rec, ep->g.meta_off, ep->g.xrow,
            dws<int32_t>(ep, ep->lay.ret_pos), dws<int32_t>(ep, ep->lay.tok_ndest),
            dws<int32_t>(ep, ep->lay.tok_dpos), ep->g.dmax, topk_mode, bad);
        LAUNCH_CHECK("NCCL EP pack kernel");
    }
    k_totals<<<1, 128, 0, s>>>(scan, (int)T, R, bad, sendc);
    LAUNCH_CHECK("NCCL EP totals kernel");

    /* Exchange 1: counts; then they come to the host. */
    int64_t *h = ep->hcounts;
    for (int32_t r = 0; r < R; r++) {
        ep->coff[r] = 2 * (int64_t)r; /* borrowed as displacements */
        ep->stokoff[r] = 2;
    }
    EPX_TRY(exchange(ep, (const unsigned char *)sendc, ep->stokoff, ep->coff,
                     (unsigned char *)recvc, ep->stokoff, ep->coff, 8, "EP dispatch (counts)",
                     err));
    EPXI_CUDA_TRY(cudaMemcpyAsync(h, sendc, (size_t)4 * R * 8, cudaMemcpyDeviceToHost, s),
                  "NCCL EP counts to host");
    EPXI_CUDA_TRY(cudaMemcpyAsync(h + 4 * R, bad, 16, cudaMemcpyDeviceToHost, s),
                  "NCCL EP flags to host");
    epx_status st = epxi_nccl_wait(ep->nc, "EP dispatch (counts)", err);
    if (st != EPX_OK) {
        epx_comm_abort(ep->comm);
        return st;
    }
    const int32_t *hbad = (const int32_t *)(h + 4 * R);
    int64_t got_tok = 0, got_ent = 0;
    int32_t bad_rank = -1;
    for (int32_t r = 0; r < R; r++) {
        ep->ntok[r] = h[2 * r];
        ep->nent[r] = h[2 * r + 1];
        ep->rtok[r] = h[2 * R + 2 * r];
        ep->rent[r] = h[2 * R + 2 * r + 1];
        if (ep->rtok[r] < 0 && bad_rank < 0) bad_rank = r;
        got_tok += ep->rtok[r];
        got_ent += ep->rent[r];
    }
    if (hbad[0] != NO_BAD)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "topk_slots[%d][%d] = %d is outside [-1, %d) (num_slots); every rank "
                         "returns an error for this batch",
                         hbad[0] / K, hbad[0] % K, hbad[1], ep->g.P);
    if (bad_rank >= 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "rank %d passed a slot outside [-1, %d) in this batch; no data moved",
                         bad_rank, ep->g.P);
    bool over = got_tok > ep->g.cap_tok || got_ent > ep->g.cap_ent;
    if (ep->g.checked_caps) {
        int64_t *dflag = dws<int64_t>(ep, ep->lay.counts); /* sendc is free again */
        int64_t one = over;
        EPXI_CUDA_TRY(cudaMemcpyAsync(dflag, &one, 8, cudaMemcpyHostToDevice, s), "NCCL EP flag");
        EPX_TRY(epxi_nccl_check(ep->nc,
                                ncclAllReduce(dflag, dflag, 1, ncclInt64, ncclSum, ep->nc->comm, s),
                                "EP dispatch (capacity check)", err));
        EPXI_CUDA_TRY(cudaMemcpyAsync(h, dflag, 8, cudaMemcpyDeviceToHost, s), "NCCL EP flag");
        st = epxi_nccl_wait(ep->nc, "EP dispatch (capacity check)", err);
        if (st != EPX_OK) return st;
        if (h[0] > 0)
            return epxi_fail(err, EPX_ERR_OVERFLOW,
                             "NCCL EP dispatch: %lld rank(s) would receive more than their bound "
                             "(this one %lld tokens / %lld entries; max_recv_tokens %lld, "
                             "max_recv_entries %lld): raise the bounds or set them to 0",
                             (long long)h[0], (long long)got_tok, (long long)got_ent,
                             (long long)ep->g.cfg.max_recv_tokens,
                             (long long)ep->g.cfg.max_recv_entries);
    } else if (over) {
        return epxi_fail(err, EPX_ERR_COMM,
                         "NCCL EP dispatch: rank %d would receive %lld tokens, above R * "
                         "max_tokens = %lld: do all ranks use the same config?",
                         ep->me, (long long)got_tok, (long long)ep->g.cap_tok);
    }
    prefix(ep->ntok, ep->stokoff, R);
    prefix(ep->rtok, ep->rtokoff, R);
    prefix(topk_mode ? ep->nent : ep->ntok, ep->coff, R);

    /* Exchange 2: the records. */
    unsigned char *recv_rec = dws<unsigned char>(ep, ep->lay.recv_rec);
    EPX_TRY(exchange(ep, dws<unsigned char>(ep, ep->lay.send_rec), ep->ntok, ep->stokoff, recv_rec,
                     ep->rtok, ep->rtokoff, ep->g.rec, "EP dispatch (records)", err));

    /* Group entries by local slot (stable sort keeps (row, k) order). */
    int64_t *so = dws<int64_t>(ep, ep->lay.slot_offsets);
    int32_t *row_entries = dws<int32_t>(ep, ep->lay.row_entries);
    if (got_tok > 0) {
        int64_t n = got_tok * K;
        int32_t *kin = dws<int32_t>(ep, ep->lay.keys_in),
                *kout = dws<int32_t>(ep, ep->lay.keys_out);
        int32_t *vin = dws<int32_t>(ep, ep->lay.vals_in),
                *vout = dws<int32_t>(ep, ep->lay.vals_out);
        k_keys<<<grid_for(n, 256), 256, 0, s>>>(recv_rec, got_tok, K, spr, ep->g.rec,
                                                ep->g.meta_off, kin, vin, bad);
        LAUNCH_CHECK("NCCL EP keys kernel");
        size_t tb = ep->lay.temp_bytes;
        EPXI_CUDA_TRY(cub::DeviceRadixSort::SortPairs(ep->ws + ep->lay.temp, tb, kin, kout, vin,
                                                      vout, (int)n, 0, ep->sort_bits, s),
                      "NCCL EP sort");
        EPXI_CUDA_TRY(cudaMemsetAsync(row_entries, 0xff, (size_t)n * 4, s), "NCCL EP row entries");
        if (got_ent > 0) {
            k_entries<<<grid_for(got_ent, 256), 256, 0, s>>>(
                got_ent, K, vout, recv_rec, ep->g.rec, ep->g.meta_off,
                dws<int32_t>(ep, ep->lay.entry_token), dws<float>(ep, ep->lay.entry_weight),
                row_entries);
            LAUNCH_CHECK("NCCL EP entries kernel");
        }
        k_slot_offsets<<<1, 256, 0, s>>>(kout, got_ent, spr, so);
        LAUNCH_CHECK("NCCL EP slot offsets kernel");
    } else {
        EPXI_CUDA_TRY(cudaMemsetAsync(so, 0, (size_t)(spr + 1) * 8, s), "NCCL EP slot offsets");
    }

    ep->nrecv_tok = got_tok;
    ep->nrecv_ent = got_ent;
    int64_t sent = 0;
    for (int32_t r = 0; r < R; r++)
        if (r != ep->me) sent += ep->ntok[r];
    ep->last_dispatch_bytes = sent * (int64_t)ep->g.rec;
    ep->dispatched = true;
    recv->num_tokens = got_tok;
    recv->x = recv_rec;
    recv->x_stride = ep->g.rec;
    recv->num_entries = got_ent;
    recv->first_slot = ep->me * spr;
    recv->num_local_slots = spr;
    recv->slot_offsets = so;
    recv->entry_token = dws<int32_t>(ep, ep->lay.entry_token);
    recv->entry_weight = dws<float>(ep, ep->lay.entry_weight);
    recv->y = ep->ws + ep->lay.y;
    return EPX_OK;
}

extern "C" epx_status epx_nccl_ep_combine(epx_nccl_ep *ep, float *out, epx_error *err) {
    if (ep == NULL || !ep->dispatched)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "NCCL EP combine without a successful dispatch");
    EPX_TRY(epx_comm_health(ep->comm, err));
    const int32_t R = ep->g.R, K = ep->g.K, H = ep->g.H;
    const int64_t T = ep->T;
    if (T > 0 && out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "NCCL EP combine of %lld tokens needs out",
                         (long long)T);
    cudaStream_t s = ep->nc->stream;
    const bool topk_mode = ep->g.cfg.combine == EPX_EP_COMBINE_TOPK;
    const int bf16 = ep->g.cfg.y_dtype == EPX_DTYPE_BF16;
    const unsigned char *y = ep->ws + ep->lay.y;
    unsigned char *csend = ep->ws + ep->lay.csend, *crecv = ep->ws + ep->lay.crecv;
    const int32_t *row_entries = dws<int32_t>(ep, ep->lay.row_entries);
    int64_t back = 0;
    const int64_t nt = ep->nrecv_tok;
    if (topk_mode) {
        prefix(ep->rent, ep->rentoff, R);
        if (nt > 0 && ep->nrecv_ent > 0) {
            int64_t n = nt * K;
            int32_t *vf = dws<int32_t>(ep, ep->lay.keys_in),
                    *cpos = dws<int32_t>(ep, ep->lay.keys_out);
            k_valid<<<grid_for(n, 256), 256, 0, s>>>(row_entries, n, vf);
            LAUNCH_CHECK("NCCL EP valid kernel");
            size_t tb = ep->lay.temp_bytes;
            EPXI_CUDA_TRY(
                cub::DeviceScan::ExclusiveSum(ep->ws + ep->lay.temp, tb, vf, cpos, (int)n, s),
                "NCCL EP combine scan");
            k_cpack<<<(unsigned)nt, 128, 0, s>>>(row_entries, cpos, K, y, csend, ep->g.yrow);
            LAUNCH_CHECK("NCCL EP combine pack kernel");
        }
        EPX_TRY(exchange(ep, csend, ep->rent, ep->rentoff, crecv, ep->nent, ep->coff, ep->g.yrow,
                         "EP combine", err));
        for (int32_t r = 0; r < R; r++)
            if (r != ep->me) back += ep->rent[r];
    } else {
        if (nt > 0) {
            k_partial<<<(unsigned)nt, 256, 0, s>>>(row_entries,
                                                   dws<float>(ep, ep->lay.entry_weight), K, H, y,
                                                   csend, ep->g.yrow, bf16);
            LAUNCH_CHECK("NCCL EP partial kernel");
        }
        EPX_TRY(exchange(ep, csend, ep->rtok, ep->rtokoff, crecv, ep->ntok, ep->stokoff, ep->g.yrow,
                         "EP combine", err));
        for (int32_t r = 0; r < R; r++)
            if (r != ep->me) back += ep->rtok[r];
    }
    ep->last_combine_bytes = back * (int64_t)ep->g.yrow;
    if (T > 0) {
        if (topk_mode)
            k_reduce_topk<<<(unsigned)T, 256, 0, s>>>(dws<int32_t>(ep, ep->lay.ret_pos),
                                                      dws<float>(ep, ep->lay.weights), K, H, crecv,
                                                      ep->g.yrow, bf16, out);
        else
            k_reduce_rank<<<(unsigned)T, 256, 0, s>>>(dws<int32_t>(ep, ep->lay.tok_ndest),
                                                      dws<int32_t>(ep, ep->lay.tok_dpos),
                                                      ep->g.dmax, H, crecv, ep->g.yrow, bf16, out);
        LAUNCH_CHECK("NCCL EP reduce kernel");
    }
    ep->dispatched = false;
    return EPX_OK;
}

extern "C" epx_status epx_nccl_ep_identity_experts(epx_nccl_ep *ep, const epx_ep_recv *recv,
                                                   epx_error *err) {
    if (ep == NULL || recv == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "identity experts need the handle and a recv view");
    if (recv->num_entries == 0) return EPX_OK;
    k_identity<<<(unsigned)recv->num_entries, 256, 0, ep->nc->stream>>>(
        (const unsigned char *)recv->x, recv->x_stride, ep->g.cfg.x_dtype == EPX_DTYPE_BF16,
        recv->entry_token, ep->g.H, (unsigned char *)recv->y, ep->g.yrow,
        ep->g.cfg.y_dtype == EPX_DTYPE_BF16);
    LAUNCH_CHECK("NCCL EP identity kernel");
    return EPX_OK;
}

extern "C" void epx_nccl_ep_last_bytes(const epx_nccl_ep *ep, int64_t *dispatch_bytes,
                                       int64_t *combine_bytes) {
    if (dispatch_bytes) *dispatch_bytes = ep ? ep->last_dispatch_bytes : 0;
    if (combine_bytes) *combine_bytes = ep ? ep->last_combine_bytes : 0;
}
