/*
 * moe_cuda.cu - the reference MoE layer on the GPU: bf16 weights and
 * activations, fp32 accumulation, cuBLAS for every matrix product.
 *
 * The experts of one EP rank run as two grouped GEMMs (one group per local
 * slot that received rows): [n_s x H] x [H x 2I] for gate and up together,
 * SwiGLU in fp32 rounded to bf16, then [n_s x I] x [I x H] for down.
 * cublasGemmGroupedBatchedEx takes the group sizes on the host, so the slot
 * offsets come to the host once per run; where the grouped call is not
 * supported (older cuBLAS, other types) the same products run as a loop of
 * cublasGemmEx and epx_cuda_moe_gemm_path says so. Row-major matrices are
 * handed to column-major cuBLAS as their transposes: C^T = W^T' X^T, i.e.
 * op(A) = T on the weight, op(B) = N on the activations.
 *
 * The router is a GEMM to fp32 logits and one thread per token applying
 * epx_moe_route's rule (same tie-breaking, same order of sums).
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <math.h>
#include <string.h>

#include "epx_comm_nccl.h"
#include "../comm/nccl/nccl_internal.h"

namespace {

__device__ bool beats(float sa, int a, float sb, int b) {
    if (isnan(sb)) return !isnan(sa) || a < b;
    if (isnan(sa)) return false;
    return sa > sb || (sa == sb && a < b);
}

/* Insert candidate i with score sc into the descending list ids/sv of size have<=k. */
__device__ void offer(int i, float sc, int k, int *ids, float *sv, int *have) {
    if (*have == k && !beats(sc, i, sv[k - 1], ids[k - 1])) return;
    int pos = *have < k ? (*have)++ : k - 1;
    while (pos > 0 && beats(sc, i, sv[pos - 1], ids[pos - 1])) {
        ids[pos] = ids[pos - 1];
        sv[pos] = sv[pos - 1];
        pos--;
    }
    ids[pos] = i;
    sv[pos] = sc;
}

__device__ float sigm(float a) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-a))); }

constexpr int MAXK = EPX_MOE_MAX_TOP_K;
constexpr int MAXG = 64;

__global__ void k_route(const float *logits, const float *bias, int T, int E, int K, int scoring,
                        int G, int topk_group, int norm, float scale, int32_t *ids_out,
                        float *w_out) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const float *l = logits + (size_t)t * E;
    int ids[MAXK];
    float sv[MAXK];
    int have = 0;
    float *w = w_out + (size_t)t * K;
    if (scoring == EPX_MOE_SCORING_SOFTMAX || scoring == EPX_MOE_SCORING_SOFTMAX_TOPK) {
        for (int e = 0; e < E; e++) offer(e, l[e], K, ids, sv, &have);
        float mx = l[ids[0]], sum = 0.0f, wsum = 0.0f;
        if (scoring == EPX_MOE_SCORING_SOFTMAX) {
            for (int e = 0; e < E; e++) sum = __fadd_rn(sum, expf(__fsub_rn(l[e], mx)));
            for (int j = 0; j < K; j++) {
                w[j] = __fdiv_rn(expf(__fsub_rn(l[ids[j]], mx)), sum);
                wsum = __fadd_rn(wsum, w[j]);
            }
            if (norm)
                for (int j = 0; j < K; j++) w[j] = __fdiv_rn(w[j], wsum);
        } else {
            for (int j = 0; j < K; j++) {
                w[j] = expf(__fsub_rn(l[ids[j]], mx));
                sum = __fadd_rn(sum, w[j]);
            }
            for (int j = 0; j < K; j++) w[j] = __fdiv_rn(w[j], sum);
        }
    } else {
        int per = E / G;
        unsigned long long keep = ~0ull;
        if (G > 1) {
            float gs[MAXG];
            for (int g = 0; g < G; g++) {
                int bi[2];
                float bs[2];
                int hv = 0;
                for (int e = g * per; e < (g + 1) * per; e++)
                    offer(e, __fadd_rn(sigm(l[e]), bias ? bias[e] : 0.0f), per >= 2 ? 2 : 1, bi, bs,
                          &hv);
                gs[g] = per >= 2 ? __fadd_rn(bs[0], bs[1]) : bs[0];
            }
            int gi[MAXG];
            float gv[MAXG];
            int gh = 0;
            for (int g = 0; g < G; g++) offer(g, gs[g], topk_group, gi, gv, &gh);
            keep = 0;
            for (int j = 0; j < topk_group; j++) keep |= 1ull << gi[j];
        }
        for (int e = 0; e < E; e++)
            if (G == 1 || ((keep >> (e / per)) & 1ull))
                offer(e, __fadd_rn(sigm(l[e]), bias ? bias[e] : 0.0f), K, ids, sv, &have);
        float wsum = 0.0f;
        for (int j = 0; j < K; j++) {
            w[j] = sigm(l[ids[j]]);
            wsum = __fadd_rn(wsum, w[j]);
        }
        if (norm)
            for (int j = 0; j < K; j++) w[j] = __fdiv_rn(w[j], __fadd_rn(wsum, 1e-20f));
    }
    if (scale != 1.0f)
        for (int j = 0; j < K; j++) w[j] = __fmul_rn(w[j], scale);
    for (int j = 0; j < K; j++) ids_out[(size_t)t * K + j] = j < have ? ids[j] : -1;
}

__global__ void k_gather(const unsigned char *x, size_t stride, int f32, const int32_t *rows,
                         int64_t n, int H, __nv_bfloat16 *out) {
    int64_t e = blockIdx.x;
    if (e >= n) return;
    const unsigned char *src = x + (size_t)rows[e] * stride;
    for (int h = threadIdx.x; h < H; h += blockDim.x)
        out[e * H + h] =
            f32 ? __float2bfloat16_rn(((const float *)src)[h]) : ((const __nv_bfloat16 *)src)[h];
}

__global__ void k_swiglu(const float *g1, int64_t n, int I, __nv_bfloat16 *h) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n * I) return;
    int64_t e = idx / I, i = idx % I;
    float a = g1[e * 2 * I + i], b = g1[e * 2 * I + I + i];
    h[idx] = __float2bfloat16_rn(a / (1.0f + expf(-a)) * b);
}

__global__ void k_to_bf16(const float *src, size_t n, __nv_bfloat16 *dst) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = __float2bfloat16_rn(src[i]);
}

const char *cublas_name(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "alloc failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "arch mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "error";
    }
}

} // namespace

struct epx_cuda_moe {
    epx_moe_config cfg;
    int32_t num_local, wmax; /* wmax = max(I, Is) */
    int64_t max_rows;
    cudaStream_t stream;
    cublasHandle_t blas;
    __nv_bfloat16 *w1, *w2, *router, *sw1,
        *sw2; /* [L][2I][H], [L][H][I], [E][H], [2Is][H], [H][Is] */
    float *bias;
    __nv_bfloat16 *xperm, *hbuf; /* [max_rows][H], [max_rows][wmax] */
    float *g1;                   /* [max_rows][2 wmax] */
    const void **dptr;           /* device pointer arrays: 3 x num_local */
    const void **hptr;           /* pinned host copy */
    int64_t *hso;                /* pinned [num_local + 1] */
    int *gm, *gn, *gk, *glda, *gldb, *gldc, *gsize;
    cublasOperation_t *ta, *tb;
    float *alpha, *beta;
    const char *path;
};

static epx_status blas_fail(cublasStatus_t s, const char *what, epx_error *err) {
    return epxi_fail(err, EPX_ERR_CUDA, "cuBLAS %s failed: %s (%d)", what, cublas_name(s), (int)s);
}

/* Upload n fp32 host values as bf16 device values at dst. */
static epx_status upload_bf16(const float *src, size_t n, __nv_bfloat16 *dst, cudaStream_t s,
                              float *stage, size_t stage_n, epx_error *err) {
    for (size_t off = 0; off < n; off += stage_n) {
        size_t m = n - off < stage_n ? n - off : stage_n;
        EPXI_CUDA_TRY(cudaMemcpyAsync(stage, src + off, m * 4, cudaMemcpyHostToDevice, s),
                      "weight upload");
        k_to_bf16<<<(unsigned)((m + 255) / 256), 256, 0, s>>>(stage, m, dst + off);
        EPXI_CUDA_TRY(cudaGetLastError(), "bf16 conversion kernel");
        EPXI_CUDA_TRY(cudaStreamSynchronize(s), "weight upload");
    }
    return EPX_OK;
}

extern "C" void epx_cuda_moe_destroy(epx_cuda_moe *m) {
    if (m == NULL) return;
    if (m->stream) cudaStreamSynchronize(m->stream);
    if (m->blas) cublasDestroy(m->blas);
    void *dev[] = {m->w1,   m->w2,    m->router, m->sw1, m->sw2,
                   m->bias, m->xperm, m->hbuf,   m->g1,  m->dptr};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) cudaFree(dev[i]);
    if (m->hptr) cudaFreeHost(m->hptr);
    if (m->hso) cudaFreeHost(m->hso);
    free(m->gm);
    free(m);
}

extern "C" epx_status epx_cuda_moe_create(const epx_moe_config *cfg, const epx_moe_weights *w,
                                          int32_t num_local, const int32_t *slot_expert,
                                          int64_t max_rows, cudaStream_t stream, epx_cuda_moe **out,
                                          epx_error *err) {
    EPX_TRY(epx_moe_config_check(cfg, err));
    if (w == NULL || out == NULL || num_local < 0 || (num_local > 0 && slot_expert == NULL) ||
        max_rows < 1 || w->router == NULL || w->gate == NULL || w->up == NULL || w->down == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU MoE needs weights (router, gate, up, down), out, num_local >= 0 with "
                         "slot_expert, and max_rows >= 1");
    for (int32_t s = 0; s < num_local; s++)
        if (slot_expert[s] < 0 || slot_expert[s] >= cfg->num_experts)
            return epxi_fail(err, EPX_ERR_INVALID_ARG, "slot_expert[%d] = %d is outside [0, %d)", s,
                             slot_expert[s], cfg->num_experts);
    if (cfg->n_group > 64)
        return epxi_fail(err, EPX_ERR_UNSUPPORTED, "GPU router handles n_group <= 64, got %d",
                         cfg->n_group);
    epx_cuda_moe *m = (epx_cuda_moe *)epxi_calloc(1, sizeof *m, "GPU MoE", err);
    if (m == NULL) return EPX_ERR_NOMEM;
    m->cfg = *cfg;
    m->num_local = num_local;
    m->max_rows = max_rows;
    m->stream = stream;
    m->path = "none";
    const size_t H = (size_t)cfg->hidden, I = (size_t)cfg->intermediate,
                 E = (size_t)cfg->num_experts;
    const size_t Is = (size_t)cfg->shared_intermediate;
    m->wmax = (int32_t)(I > Is ? I : Is);
    const size_t L = (size_t)(num_local > 0 ? num_local : 1);
    epx_status st = EPX_OK;
    cudaError_t ce = cudaSuccess;
    float *stage = NULL;
    const size_t stage_n = (size_t)1 << 22;
    cublasStatus_t bs = cublasCreate(&m->blas);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        st = blas_fail(bs, "create", err);
        goto fail;
    }
    bs = cublasSetStream(m->blas, stream);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        st = blas_fail(bs, "set stream", err);
        goto fail;
    }
#define DMALLOC(p, bytes)                                                                          \
    do {                                                                                           \
        ce = cudaMalloc((void **)&(p), (bytes));                                                   \
        if (ce != cudaSuccess) {                                                                   \
            st = epxi_cuda_fail(ce, "GPU MoE allocation", err);                                    \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)
    DMALLOC(m->w1, L * 2 * I * H * 2);
    DMALLOC(m->w2, L * H * I * 2);
    DMALLOC(m->router, E * H * 2);
    if (Is > 0) {
        DMALLOC(m->sw1, 2 * Is * H * 2);
        DMALLOC(m->sw2, H * Is * 2);
    }
    if (w->router_bias != NULL) DMALLOC(m->bias, E * 4);
    DMALLOC(m->xperm, (size_t)max_rows * H * 2);
    DMALLOC(m->hbuf, (size_t)max_rows * m->wmax * 2);
    DMALLOC(m->g1, (size_t)max_rows * 2 * m->wmax * 4);
    DMALLOC(m->dptr, 3 * L * sizeof(void *));
    DMALLOC(stage, stage_n * 4);
    ce = cudaMallocHost((void **)&m->hptr, 3 * L * sizeof(void *));
    if (ce == cudaSuccess) ce = cudaMallocHost((void **)&m->hso, (L + 1) * sizeof(int64_t));
    if (ce != cudaSuccess) {
        st = epxi_cuda_fail(ce, "GPU MoE pinned buffers", err);
        goto fail;
    }
    /* The per-group argument arrays of the grouped GEMM, in one block. */
    {
        size_t bytes =
            L * 7 * sizeof(int) + L * 2 * sizeof(cublasOperation_t) + L * 2 * sizeof(float);
        void *blk = epxi_calloc(bytes, 1, "GPU MoE group arrays", err);
        if (blk == NULL) {
            st = EPX_ERR_NOMEM;
            goto fail;
        }
        m->gm = (int *)blk;
        m->gn = m->gm + L;
        m->gk = m->gn + L;
        m->glda = m->gk + L;
        m->gldb = m->glda + L;
        m->gldc = m->gldb + L;
        m->gsize = m->gldc + L;
        m->ta = (cublasOperation_t *)(void *)(m->gsize + L);
        m->tb = m->ta + L;
        m->alpha = (float *)(void *)(m->tb + L);
        m->beta = m->alpha + L;
        for (size_t i = 0; i < L; i++) {
            m->ta[i] = CUBLAS_OP_T;
            m->tb[i] = CUBLAS_OP_N;
            m->alpha[i] = 1.0f;
            m->beta[i] = 0.0f;
            m->gsize[i] = 1;
        }
    }
    /* Weights: per local slot, gate rows then up rows as one [2I][H]. */
    for (int32_t s = 0; s < num_local && st == EPX_OK; s++) {
        size_t e = (size_t)slot_expert[s];
        st = upload_bf16(w->gate + e * I * H, I * H, m->w1 + (size_t)s * 2 * I * H, stream, stage,
                         stage_n, err);
        if (st == EPX_OK)
            st = upload_bf16(w->up + e * I * H, I * H, m->w1 + (size_t)s * 2 * I * H + I * H,
                             stream, stage, stage_n, err);
        if (st == EPX_OK)
            st = upload_bf16(w->down + e * H * I, H * I, m->w2 + (size_t)s * H * I, stream, stage,
                             stage_n, err);
    }
    if (st == EPX_OK) st = upload_bf16(w->router, E * H, m->router, stream, stage, stage_n, err);
    if (st == EPX_OK && Is > 0) {
        if (w->shared_gate == NULL || w->shared_up == NULL || w->shared_down == NULL) {
            st = epxi_fail(err, EPX_ERR_INVALID_ARG, "shared_intermediate %zu needs shared weights",
                           Is);
        } else {
            st = upload_bf16(w->shared_gate, Is * H, m->sw1, stream, stage, stage_n, err);
            if (st == EPX_OK)
                st =
                    upload_bf16(w->shared_up, Is * H, m->sw1 + Is * H, stream, stage, stage_n, err);
            if (st == EPX_OK)
                st = upload_bf16(w->shared_down, H * Is, m->sw2, stream, stage, stage_n, err);
        }
    }
    if (st == EPX_OK && m->bias != NULL) {
        /* On the handle's stream and waited for: a plain cudaMemcpy from
         * pageable memory may return before its DMA lands, and kernels on a
         * non-blocking stream do not wait for the legacy stream. */
        ce = cudaMemcpyAsync(m->bias, w->router_bias, E * 4, cudaMemcpyHostToDevice, stream);
        if (ce == cudaSuccess) ce = cudaStreamSynchronize(stream);
        if (ce != cudaSuccess) st = epxi_cuda_fail(ce, "router bias upload", err);
    }
    if (st != EPX_OK) goto fail;
    cudaFree(stage);
    *out = m;
    return EPX_OK;
fail:
    if (stage) cudaFree(stage);
    epx_cuda_moe_destroy(m);
    return st;
#undef DMALLOC
}

/* C [n][m] (row-major, ctype) = X [n][k] (bf16) . W^T where W is [m][k]
 * bf16 row-major; beta = 0 or 1. */
static cublasStatus_t gemm(epx_cuda_moe *m, int M, int N, int Kd, const void *W, const void *X,
                           void *C, cudaDataType_t ctype, float beta) {
    float alpha = 1.0f;
    return cublasGemmEx(m->blas, CUBLAS_OP_T, CUBLAS_OP_N, M, N, Kd, &alpha, W, CUDA_R_16BF, Kd, X,
                        CUDA_R_16BF, Kd, &beta, C, ctype, M, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT);
}

extern "C" epx_status epx_cuda_moe_route_logits(epx_cuda_moe *m, const float *logits, int64_t T,
                                                int32_t *ids, float *weights, epx_error *err) {
    if (m == NULL || T < 0 || (T > 0 && (logits == NULL || ids == NULL || weights == NULL)))
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU route needs logits, ids and weights");
    if (T == 0) return EPX_OK;
    const epx_moe_config *c = &m->cfg;
    k_route<<<(unsigned)((T + 127) / 128), 128, 0, m->stream>>>(
        logits, c->scoring == EPX_MOE_SCORING_SIGMOID ? m->bias : NULL, (int)T, c->num_experts,
        c->top_k, (int)c->scoring, c->n_group, c->topk_group, c->norm_topk_prob,
        c->routed_scaling_factor, ids, weights);
    EPXI_CUDA_TRY(cudaGetLastError(), "GPU route kernel");
    return EPX_OK;
}

extern "C" epx_status epx_cuda_moe_router(epx_cuda_moe *m, const uint16_t *x, int64_t T,
                                          float *logits, int32_t *ids, float *weights,
                                          epx_error *err) {
    if (m == NULL || T < 0 || (T > 0 && (x == NULL || logits == NULL)))
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU router needs x and logits");
    if (T == 0) return EPX_OK;
    cublasStatus_t bs =
        gemm(m, m->cfg.num_experts, (int)T, m->cfg.hidden, m->router, x, logits, CUDA_R_32F, 0.0f);
    if (bs != CUBLAS_STATUS_SUCCESS) return blas_fail(bs, "router GEMM", err);
    return epx_cuda_moe_route_logits(m, logits, T, ids, weights, err);
}

/* One grouped product over the non-empty slots, or a loop of GEMMs. */
static epx_status grouped(epx_cuda_moe *m, int groups, const void *const *A, const void *const *B,
                          void *const *C, cudaDataType_t ctype, epx_error *err) {
    const void **hp = m->hptr;
    for (int g = 0; g < groups; g++) {
        hp[g] = A[g];
        hp[groups + g] = B[g];
        hp[2 * groups + g] = C[g];
    }
    EPXI_CUDA_TRY(cudaMemcpyAsync(m->dptr, hp, 3 * (size_t)groups * sizeof(void *),
                                  cudaMemcpyHostToDevice, m->stream),
                  "GPU MoE pointer arrays");
    cublasStatus_t bs = cublasGemmGroupedBatchedEx(
        m->blas, m->ta, m->tb, m->gm, m->gn, m->gk, m->alpha, m->dptr, CUDA_R_16BF, m->glda,
        m->dptr + groups, CUDA_R_16BF, m->gldb, m->beta, (void *const *)(m->dptr + 2 * groups),
        ctype, m->gldc, groups, m->gsize, CUBLAS_COMPUTE_32F);
    if (bs == CUBLAS_STATUS_SUCCESS) {
        m->path = "grouped";
        /* The pinned pointer arrays are reused by the next call. */
        EPXI_CUDA_TRY(cudaStreamSynchronize(m->stream), "GPU MoE grouped GEMM");
        return EPX_OK;
    }
    if (bs != CUBLAS_STATUS_NOT_SUPPORTED && bs != CUBLAS_STATUS_INVALID_VALUE)
        return blas_fail(bs, "grouped GEMM", err);
    m->path = "loop";
    for (int g = 0; g < groups; g++) {
        float alpha = 1.0f, beta = 0.0f;
        bs = cublasGemmEx(m->blas, CUBLAS_OP_T, CUBLAS_OP_N, m->gm[g], m->gn[g], m->gk[g], &alpha,
                          A[g], CUDA_R_16BF, m->glda[g], B[g], CUDA_R_16BF, m->gldb[g], &beta, C[g],
                          ctype, m->gldc[g], CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (bs != CUBLAS_STATUS_SUCCESS) return blas_fail(bs, "GEMM", err);
    }
    return EPX_OK;
}

extern "C" epx_status epx_cuda_moe_run_experts(epx_cuda_moe *m, const epx_ep_recv *recv,
                                               epx_dtype x_dtype, epx_dtype y_dtype,
                                               epx_error *err) {
    if (m == NULL || recv == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU MoE run needs the handle and a recv view");
    if (recv->num_local_slots != m->num_local)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU MoE holds %d local slots but the dispatch delivered %d", m->num_local,
                         recv->num_local_slots);
    const int64_t ne = recv->num_entries;
    if (ne < 0 || recv->slot_offsets == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU MoE runs on the grouped entries of a normal-mode dispatch; this "
                         "recv view is the low-latency engine's expert-major one (num_entries "
                         "%lld, slot_stride %lld): run the experts on its per-slot rows instead",
                         (long long)ne, (long long)recv->slot_stride);
    if (ne == 0) return EPX_OK;
    if (ne > m->max_rows)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU MoE scratch holds %lld rows but %lld entries arrived: raise max_rows",
                         (long long)m->max_rows, (long long)ne);
    const int H = m->cfg.hidden, I = m->cfg.intermediate, L = m->num_local;
    cudaStream_t s = m->stream;
    EPXI_CUDA_TRY(
        cudaMemcpyAsync(m->hso, recv->slot_offsets, (size_t)(L + 1) * 8, cudaMemcpyDeviceToHost, s),
        "GPU MoE slot offsets");
    k_gather<<<(unsigned)ne, 128, 0, s>>>((const unsigned char *)recv->x, recv->x_stride,
                                          x_dtype == EPX_DTYPE_F32, recv->entry_token, ne, H,
                                          m->xperm);
    EPXI_CUDA_TRY(cudaGetLastError(), "GPU MoE gather kernel");
    EPXI_CUDA_TRY(cudaStreamSynchronize(s), "GPU MoE slot offsets");
    const void *A[1024], *B[1024];
    void *C[1024];
    if (L > 1024)
        return epxi_fail(err, EPX_ERR_UNSUPPORTED, "GPU MoE runs at most 1024 local slots, got %d",
                         L);
    cudaDataType_t yt = y_dtype == EPX_DTYPE_F32 ? CUDA_R_32F : CUDA_R_16BF;
    size_t ysz = y_dtype == EPX_DTYPE_F32 ? 4 : 2;
    /* gate + up */
    int groups = 0;
    for (int sl = 0; sl < L; sl++) {
        int64_t e0 = m->hso[sl], n = m->hso[sl + 1] - e0;
        if (n == 0) continue;
        m->gm[groups] = 2 * I;
        m->gn[groups] = (int)n;
        m->gk[groups] = H;
        m->glda[groups] = H;
        m->gldb[groups] = H;
        m->gldc[groups] = 2 * I;
        A[groups] = m->w1 + (size_t)sl * 2 * I * H;
        B[groups] = m->xperm + (size_t)e0 * H;
        C[groups] = m->g1 + (size_t)e0 * 2 * I;
        groups++;
    }
    EPX_TRY(grouped(m, groups, A, B, C, CUDA_R_32F, err));
    k_swiglu<<<(unsigned)((ne * I + 255) / 256), 256, 0, s>>>(m->g1, ne, I, m->hbuf);
    EPXI_CUDA_TRY(cudaGetLastError(), "GPU MoE SwiGLU kernel");
    groups = 0;
    for (int sl = 0; sl < L; sl++) {
        int64_t e0 = m->hso[sl], n = m->hso[sl + 1] - e0;
        if (n == 0) continue;
        m->gm[groups] = H;
        m->gn[groups] = (int)n;
        m->gk[groups] = I;
        m->glda[groups] = I;
        m->gldb[groups] = I;
        m->gldc[groups] = H;
        A[groups] = m->w2 + (size_t)sl * H * I;
        B[groups] = m->hbuf + (size_t)e0 * I;
        C[groups] = (unsigned char *)recv->y + (size_t)e0 * H * ysz;
        groups++;
    }
    return grouped(m, groups, A, B, C, yt, err);
}

extern "C" epx_status epx_cuda_moe_shared_add(epx_cuda_moe *m, const uint16_t *x, int64_t T,
                                              float *out, epx_error *err) {
    if (m == NULL || T < 0 || (T > 0 && (x == NULL || out == NULL)))
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "GPU shared expert needs x and out");
    const int Is = m->cfg.shared_intermediate, H = m->cfg.hidden;
    if (Is == 0 || T == 0) return EPX_OK;
    if (T > m->max_rows)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU shared expert: %lld tokens above max_rows %lld", (long long)T,
                         (long long)m->max_rows);
    cublasStatus_t bs = gemm(m, 2 * Is, (int)T, H, m->sw1, x, m->g1, CUDA_R_32F, 0.0f);
    if (bs != CUBLAS_STATUS_SUCCESS) return blas_fail(bs, "shared GEMM", err);
    k_swiglu<<<(unsigned)((T * Is + 255) / 256), 256, 0, m->stream>>>(m->g1, T, Is, m->hbuf);
    EPXI_CUDA_TRY(cudaGetLastError(), "GPU shared SwiGLU kernel");
    bs = gemm(m, H, (int)T, Is, m->sw2, m->hbuf, out, CUDA_R_32F, 1.0f);
    if (bs != CUBLAS_STATUS_SUCCESS) return blas_fail(bs, "shared down GEMM", err);
    return EPX_OK;
}

extern "C" const char *epx_cuda_moe_gemm_path(const epx_cuda_moe *m) {
    return m ? m->path : "none";
}
