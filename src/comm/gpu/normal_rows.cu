/*
 * normal_rows.cu - DeepEP's normal mode over the GPU engine: the kernels
 * that pack a sender's rows (token, top-k tail, count row) and turn a
 * receiver's rows into DeepEP's tensors, and back for the combine
 * (include/epx_comm_gpu.h, "DeepEP's normal mode over the engine").
 *
 * One launch each, a block per row, so epx.torch.Buffer's dispatch is four
 * launches (pack, engine, counts, unpack) where the same steps in plain torch
 * were about fifty (python/epx/torch/_normal.py keeps them: the reference
 * these kernels are tested against, bit for bit, and the path without this
 * library).
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "epx_comm_gpu.h"
extern "C" {
#include "internal.h" /* C linkage: epxi_fail lives in the C library */
}
#include "cuda_check.h"

namespace {

constexpr int kThreads = 128;
constexpr int kMaxRanks = 64; /* the engine's top-k bound: one column per rank */

/* n bytes from src to dst by the block, 16 at a time where both allow. */
__device__ void copy_bytes(void *dst, const void *src, int64_t n) {
    if ((((uintptr_t)dst | (uintptr_t)src | (uintptr_t)n) & 15) == 0) {
        for (int64_t i = threadIdx.x; i < n / 16; i += blockDim.x)
            ((uint4 *)dst)[i] = ((const uint4 *)src)[i];
    } else {
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            ((uint8_t *)dst)[i] = ((const uint8_t *)src)[i];
    }
}

__device__ void zero_bytes(void *dst, int64_t n) {
    if ((((uintptr_t)dst | (uintptr_t)n) & 15) == 0) {
        for (int64_t i = threadIdx.x; i < n / 16; i += blockDim.x)
            ((uint4 *)dst)[i] = make_uint4(0, 0, 0, 0);
    } else {
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ((uint8_t *)dst)[i] = 0;
    }
}

struct Rows {
    int32_t H, W, R, E;
    __device__ int64_t row_bytes() const { return (int64_t)W * 2; }
    __device__ int64_t ids_at() const { return (int64_t)H * 2; }                     /* bytes */
    __device__ int64_t w_at() const { return (int64_t)H * 2 + 4 * EPX_NORMAL_KCAP; } /* bytes */
};

__global__ void pack_kernel(Rows f, int64_t T, int fp8, const uint8_t *x, int64_t x_stride,
                            const float *scales, int64_t s_t, int64_t s_g, const void *topk_idx,
                            int ids64, int32_t K, const float *topk_w, const uint8_t *in_rank,
                            const int32_t *per_rank, const int32_t *per_expert, uint8_t *stage,
                            int32_t *columns) {
    int64_t t = blockIdx.x;
    uint8_t *row = stage + t * f.row_bytes();
    int32_t *cols = columns + t * f.R;
    if (t == T) { /* the count row: to every rank */
        for (int r = threadIdx.x; r < f.R; r += blockDim.x) cols[r] = r;
        if (per_rank != NULL) {
            int32_t *c = (int32_t *)row;
            for (int j = threadIdx.x; j < f.R + f.E; j += blockDim.x)
                c[j] = j < f.R ? per_rank[j] : per_expert[j - f.R];
        }
        return;
    }
    for (int r = threadIdx.x; r < f.R; r += blockDim.x) cols[r] = in_rank[t * f.R + r] ? r : -1;
    if (fp8) {
        copy_bytes(row, x + t * x_stride, f.H);
        float *s = (float *)(row + f.H);
        for (int g = threadIdx.x; g < f.H / 128; g += blockDim.x) s[g] = scales[t * s_t + g * s_g];
    } else {
        copy_bytes(row, x + t * x_stride * 2, (int64_t)f.H * 2);
    }
    if (topk_idx != NULL) {
        int32_t *ids = (int32_t *)(row + f.ids_at());
        float *w = (float *)(row + f.w_at());
        for (int k = threadIdx.x; k < K; k += blockDim.x) {
            ids[k] = ids64 ? (int32_t)((const int64_t *)topk_idx)[t * K + k]
                           : ((const int32_t *)topk_idx)[t * K + k];
            w[k] = topk_w != NULL ? topk_w[t * K + k] : 0.0f;
        }
    }
}

/* Where source s's rows begin and how many there are (its count row last). */
__device__ int64_t first_of(const int64_t *lr, int s) { return lr[s] >> 32; }
__device__ int64_t rows_of(const int64_t *lr, int s) { return lr[s] & 0xFFFFFFFF; }
__device__ int64_t real_of(const int64_t *lr, int s) {
    int64_t n = rows_of(lr, s);
    return n > 0 ? n - 1 : 0;
}

/* The engine row of the i-th token received from sources in order, or -1
 * past them. */
__device__ int64_t row_of(const int64_t *lr, int R, int64_t i) {
    int64_t before = 0;
    for (int s = 0; s < R; s++) {
        int64_t n = real_of(lr, s);
        if (i < before + n) return first_of(lr, s) + (i - before);
        before += n;
    }
    return -1;
}

__global__ void counts_kernel(Rows f, const uint8_t *recv, const int64_t *lr, int32_t rank,
                              int32_t alignment, int32_t *prefix, int32_t *counts) {
    int L = f.E / f.R;
    for (int j = threadIdx.x; j < f.R; j += blockDim.x) { /* column j, sources in order */
        int32_t acc = 0;
        for (int s = 0; s < f.R; s++) {
            const int32_t *c =
                (const int32_t *)(recv + (first_of(lr, s) + rows_of(lr, s) - 1) * f.row_bytes());
            acc += c[j];
            prefix[s * f.R + j] = acc;
        }
    }
    for (int l = threadIdx.x; l <= L; l += blockDim.x) {
        int64_t acc = 0;
        for (int s = 0; s < f.R; s++) {
            if (l == 0) {
                acc += real_of(lr, s);
                continue;
            }
            const int32_t *c =
                (const int32_t *)(recv + (first_of(lr, s) + rows_of(lr, s) - 1) * f.row_bytes());
            acc += c[f.R + rank * L + l - 1];
        }
        counts[l] =
            l == 0 ? (int32_t)acc : (int32_t)((acc + alignment - 1) / alignment * alignment);
    }
}

__global__ void unpack_kernel(Rows f, int fp8, const uint8_t *recv, const int64_t *lr,
                              const int32_t *src_info, int32_t rank, int32_t K, uint8_t *x,
                              float *scales, int64_t *ids, float *weights, int32_t *src,
                              int64_t *rows) {
    __shared__ int64_t row_s;
    __shared__ int valid_s;
    int64_t i = blockIdx.x;
    if (threadIdx.x == 0) {
        int64_t row = row_of(lr, f.R, i);
        valid_s = row >= 0;
        row_s = row >= 0 ? row : first_of(lr, f.R - 1) + rows_of(lr, f.R - 1) - 1;
    }
    __syncthreads();
    int64_t row = row_s;
    bool valid = valid_s;
    const uint8_t *in = recv + row * f.row_bytes();
    int64_t xbytes = fp8 ? f.H : (int64_t)f.H * 2;
    if (valid)
        copy_bytes(x + i * xbytes, in, xbytes);
    else
        zero_bytes(x + i * xbytes, xbytes);
    if (fp8) {
        const float *s = (const float *)(in + f.H);
        for (int g = threadIdx.x; g < f.H / 128; g += blockDim.x)
            scales[i * (f.H / 128) + g] = valid ? s[g] : 0.0f;
    }
    if (K > 0) {
        int L = f.E / f.R;
        const int32_t *gid = (const int32_t *)(in + f.ids_at());
        const float *w = (const float *)(in + f.w_at());
        for (int k = threadIdx.x; k < K; k += blockDim.x) {
            int64_t local = (int64_t)gid[k] - (int64_t)rank * L;
            bool mine = valid && local >= 0 && local < L;
            ids[i * K + k] = mine ? local : -1;
            weights[i * K + k] = mine ? w[k] : 0.0f;
        }
    }
    if (threadIdx.x == 0) {
        src[i] = valid ? src_info[row] : -1;
        rows[i] = row;
    }
}

/* Blocks past the n rows given: zero the rows of the tokens received past
 * them (num_worst_tokens too small), so their combine sums zeros and not
 * an earlier batch's rows. */
constexpr int kSweepBlocks = 32;

__global__ void fill_kernel(Rows f, uint8_t *y, const int64_t *rows, int64_t n, const uint8_t *x,
                            const float *weights, int32_t K, const int64_t *lr) {
    if (blockIdx.x >= n) {
        for (int64_t i = n + (blockIdx.x - n); lr != NULL; i += gridDim.x - n) {
            int64_t row = row_of(lr, f.R, i);
            if (row < 0) return;
            zero_bytes(y + row * f.row_bytes(), ((int64_t)f.H + 3 * K) * 2);
        }
        return;
    }
    int64_t i = blockIdx.x;
    uint8_t *out = y + rows[i] * f.row_bytes();
    copy_bytes(out, x + i * (int64_t)f.H * 2, (int64_t)f.H * 2);
    if (weights == NULL) return;
    __nv_bfloat16 *tail = (__nv_bfloat16 *)(out + (int64_t)f.H * 2);
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
        float w = weights[i * K + k];
        __nv_bfloat16 hi = __float2bfloat16_rn(w);
        float r = __fsub_rn(w, __bfloat162float(hi));
        __nv_bfloat16 mid = __float2bfloat16_rn(r);
        tail[k] = hi;
        tail[K + k] = mid;
        tail[2 * K + k] = __float2bfloat16_rn(__fsub_rn(r, __bfloat162float(mid)));
    }
}

__global__ void combined_kernel(Rows f, const float *out, const __nv_bfloat16 *bias0,
                                const __nv_bfloat16 *bias1, int32_t K, __nv_bfloat16 *x,
                                float *weights) {
    int64_t t = blockIdx.x;
    const float *in = out + t * f.W;
    for (int h = threadIdx.x; h < f.H; h += blockDim.x) {
        float v = in[h];
        if (bias0 != NULL) v = __fadd_rn(v, __bfloat162float(bias0[t * f.H + h]));
        if (bias1 != NULL) v = __fadd_rn(v, __bfloat162float(bias1[t * f.H + h]));
        x[t * f.H + h] = __float2bfloat16_rn(v);
    }
    for (int k = threadIdx.x; k < K; k += blockDim.x)
        weights[t * K + k] =
            __fadd_rn(__fadd_rn(in[f.H + k], in[f.H + K + k]), in[f.H + 2 * K + k]);
}

/* The format's own checks, shared by every entry point. */
epx_status check_rows(const epx_normal_rows *f, const char *who, epx_error *err) {
    if (f == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "%s: the row format is required", who);
    if (f->hidden < 1 || f->num_ranks < 1 || f->num_ranks > kMaxRanks || f->num_experts < 1 ||
        f->num_experts % f->num_ranks ||
        f->width != epx_normal_row_width(f->hidden, f->num_experts, f->num_ranks))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "%s: rows of hidden %d, %d experts over %d ranks, width %d: hidden >= 1, "
                         "1..%d ranks, experts a multiple of the ranks, width "
                         "epx_normal_row_width's (%d)",
                         who, f->hidden, f->num_experts, f->num_ranks, f->width, kMaxRanks,
                         f->hidden >= 1 && f->num_ranks >= 1
                             ? epx_normal_row_width(f->hidden, f->num_experts, f->num_ranks)
                             : 0);
    return EPX_OK;
}

epx_status check_k(int32_t K, const char *who, epx_error *err) {
    if (K < 0 || K > EPX_NORMAL_KCAP)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "%s: top-k %d outside 0..%d", who, K,
                         EPX_NORMAL_KCAP);
    return EPX_OK;
}

Rows rows_of_format(const epx_normal_rows *f) {
    return Rows{f->hidden, f->width, f->num_ranks, f->num_experts};
}

} // namespace

extern "C" int32_t epx_normal_row_width(int32_t hidden, int32_t num_experts, int32_t num_ranks) {
    int64_t w = (int64_t)hidden + 4 * EPX_NORMAL_KCAP;
    int64_t c = 2 * ((int64_t)num_ranks + num_experts);
    if (c > w) w = c;
    w = (w + 7) / 8 * 8;
    return w > INT32_MAX ? -1 : (int32_t)w;
}

extern "C" epx_status epx_normal_pack(const epx_normal_rows *f, int64_t T, int fp8, const void *x,
                                      int64_t x_stride, const float *scales, int64_t s_t,
                                      int64_t s_g, const void *topk_idx, int ids64, int32_t K,
                                      const float *topk_weights, const uint8_t *in_rank,
                                      const int32_t *per_rank, const int32_t *per_expert,
                                      void *stage, int32_t *columns, cudaStream_t stream,
                                      epx_error *err) {
    const char *who = "epx_normal_pack";
    EPX_TRY(check_rows(f, who, err));
    EPX_TRY(check_k(topk_idx != NULL ? K : 0, who, err));
    if (T < 0 || T >= INT32_MAX || stage == NULL || columns == NULL ||
        (T > 0 && (x == NULL || in_rank == NULL || (fp8 && scales == NULL))) ||
        (per_rank == NULL) != (per_expert == NULL) || (fp8 && f->hidden % 128))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "%s: T = %lld, fp8 %d, hidden %d: T in [0, 2^31 - 1), stage, columns, "
                         "x, in_rank (and scales for fp8, hidden a multiple of 128) required, "
                         "per_rank and per_expert both or neither",
                         who, (long long)T, fp8, f->hidden);
    pack_kernel<<<(unsigned)(T + 1), kThreads, 0, stream>>>(
        rows_of_format(f), T, fp8, (const uint8_t *)x, x_stride, scales, s_t, s_g, topk_idx, ids64,
        K, topk_weights, in_rank, per_rank, per_expert, (uint8_t *)stage, columns);
    EPXI_CUDA_TRY(cudaGetLastError(), "epx_normal_pack's launch");
    return EPX_OK;
}

extern "C" epx_status epx_normal_counts(const epx_normal_rows *f, const void *recv,
                                        const int64_t *layout_range, int32_t rank,
                                        int32_t alignment, int32_t *prefix, int32_t *counts,
                                        cudaStream_t stream, epx_error *err) {
    const char *who = "epx_normal_counts";
    EPX_TRY(check_rows(f, who, err));
    if (recv == NULL || layout_range == NULL || prefix == NULL || counts == NULL || rank < 0 ||
        rank >= f->num_ranks || alignment < 1)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "%s: rank %d of %d, alignment %d: recv, layout_range, prefix and counts "
                         "required, alignment >= 1",
                         who, rank, f->num_ranks, alignment);
    counts_kernel<<<1, kThreads, 0, stream>>>(rows_of_format(f), (const uint8_t *)recv,
                                              layout_range, rank, alignment, prefix, counts);
    EPXI_CUDA_TRY(cudaGetLastError(), "epx_normal_counts's launch");
    return EPX_OK;
}

extern "C" epx_status epx_normal_unpack(const epx_normal_rows *f, int fp8, const void *recv,
                                        const int64_t *layout_range, const int32_t *src_info,
                                        int32_t rank, int64_t n, int32_t K, void *x, float *scales,
                                        int64_t *ids, float *weights, int32_t *src, int64_t *rows,
                                        cudaStream_t stream, epx_error *err) {
    const char *who = "epx_normal_unpack";
    EPX_TRY(check_rows(f, who, err));
    EPX_TRY(check_k(K, who, err));
    if (n < 0 || n >= INT32_MAX || rank < 0 || rank >= f->num_ranks || (fp8 && f->hidden % 128))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "%s: n = %lld, rank %d of %d, fp8 %d, hidden %d: n in [0, 2^31 - 1), "
                         "fp8 needs hidden a multiple of 128",
                         who, (long long)n, rank, f->num_ranks, fp8, f->hidden);
    if (n == 0) return EPX_OK;
    if (recv == NULL || layout_range == NULL || src_info == NULL || x == NULL || src == NULL ||
        rows == NULL || (fp8 && scales == NULL) || (K > 0 && (ids == NULL || weights == NULL)))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "%s: recv, layout_range, src_info, x, src and rows are required (and "
                         "scales for fp8, ids and weights for top-k)",
                         who);
    unpack_kernel<<<(unsigned)n, kThreads, 0, stream>>>(
        rows_of_format(f), fp8, (const uint8_t *)recv, layout_range, src_info, rank, K,
        (uint8_t *)x, scales, ids, weights, src, rows);
    EPXI_CUDA_TRY(cudaGetLastError(), "epx_normal_unpack's launch");
    return EPX_OK;
}

extern "C" epx_status epx_normal_fill(const epx_normal_rows *f, void *y, const int64_t *rows,
                                      int64_t n, const void *x, const float *weights, int32_t K,
                                      const int64_t *layout_range, cudaStream_t stream,
                                      epx_error *err) {
    const char *who = "epx_normal_fill";
    EPX_TRY(check_rows(f, who, err));
    EPX_TRY(check_k(weights != NULL ? K : 0, who, err));
    if (n < 0 || n >= INT32_MAX)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "%s: n = %lld outside [0, 2^31 - 1)", who,
                         (long long)n);
    if (n == 0 && layout_range == NULL) return EPX_OK;
    if (y == NULL || (n > 0 && (rows == NULL || x == NULL)))
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "%s: y, rows and x are required", who);
    unsigned grid = (unsigned)n + (layout_range != NULL ? kSweepBlocks : 0);
    fill_kernel<<<grid, kThreads, 0, stream>>>(rows_of_format(f), (uint8_t *)y, rows, n,
                                               (const uint8_t *)x, weights, K, layout_range);
    EPXI_CUDA_TRY(cudaGetLastError(), "epx_normal_fill's launch");
    return EPX_OK;
}

extern "C" epx_status epx_normal_combined(const epx_normal_rows *f, const float *out, int64_t T,
                                          const void *bias0, const void *bias1, int32_t K, void *x,
                                          float *weights, cudaStream_t stream, epx_error *err) {
    const char *who = "epx_normal_combined";
    EPX_TRY(check_rows(f, who, err));
    EPX_TRY(check_k(K, who, err));
    if (T < 0 || T >= INT32_MAX)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "%s: T = %lld outside [0, 2^31 - 1)", who,
                         (long long)T);
    if (T == 0) return EPX_OK;
    if (out == NULL || x == NULL || (K > 0 && weights == NULL))
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "%s: out and x (and weights for top-k) required",
                         who);
    combined_kernel<<<(unsigned)T, kThreads, 0, stream>>>(
        rows_of_format(f), out, (const __nv_bfloat16 *)bias0, (const __nv_bfloat16 *)bias1, K,
        (__nv_bfloat16 *)x, weights);
    EPXI_CUDA_TRY(cudaGetLastError(), "epx_normal_combined's launch");
    return EPX_OK;
}
