/*
 * ll_floor.cu - the floor the low-latency engine is judged against (issue
 * 24), timed by `epx bench comm` beside every engine figure: two kernels
 * that move a round trip's bytes on one GPU and nothing else.
 *
 *   dispatch: copy T rows of H bf16 into a receive buffer K times each (the
 *             bytes of an expert-major receive, one row per (token, expert)),
 *             write a count;
 *   combine:  out[t] = bf16(sum over k of w[t][k] * y[t * K + k]) in fp32.
 *
 * "bare" is exactly that; "flag" adds the minimal protocol an exchange
 * needs: every block copies its share (combine: first the T * K rows into
 * a receive area), counts in with a fence and an atomic, the last block
 * publishes (epoch, T) with a system-scope release store, and every block
 * polls it with acquire loads before finishing (combine: before reducing).
 * A poll gives up after a second and records it, so a probe never hangs.
 *
 * Also the benchmark's hold (epxi_ll_hold): a kernel that keeps a stream
 * busy until the host opens a gate, so a graph replay queued behind it
 * starts the moment the hold ends and the events around it time the GPU's
 * work alone, not the host's cudaGraphLaunch (2-4 us that a serving
 * engine's one graph per forward pass pays once, not per kernel).
 * Internal to libepx (the CLI's benchmark is its only user).
 */
#include <cuda_runtime.h>

#include "internal.h"
#include "numeric.h"
#include "global_timer.cuh"

namespace {

constexpr int kThreads = 512;

/* Each probe reads its epoch at the start and block 0 advances it after
 * the wait, when every block has read it (all counted in first). */
struct FloorCtl {
    uint32_t epoch_d, epoch_c, arrive, fault;
    unsigned long long flag_d, flag_c;
    int64_t count;
};

struct F {
    int32_t H, K;
    uint16_t *xin, *recv, *yk, *comb, *out;
    float *w;
    FloorCtl *ctl;
};

__device__ void copy_row(uint16_t *dst, const uint16_t *src, int H) {
    if (H % 8 == 0) {
        const int4 *s = (const int4 *)src;
        int4 *d = (int4 *)dst;
        for (int i = threadIdx.x; i < H / 8; i += blockDim.x) d[i] = s[i];
    } else {
        for (int i = threadIdx.x; i < H; i += blockDim.x) dst[i] = src[i];
    }
}

/* Count in; the last of gridDim blocks publishes (epoch, T) to *flag; then
 * every block waits for it. */
__device__ void count_in_and_wait(FloorCtl *c, unsigned long long *flag, uint32_t epoch,
                                  int64_t T) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&c->arrive, 1u) == gridDim.x - 1) {
            c->arrive = 0;
            const unsigned long long v = ((unsigned long long)epoch << 32) | (uint32_t)T;
            asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(flag), "l"(v) : "memory");
        }
        const unsigned long long t0 = global_ns();
        for (;;) {
            unsigned long long v;
            asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(flag) : "memory");
            if ((uint32_t)(v >> 32) == epoch) break;
            if (global_ns() - t0 > 1000000000ull) {
                c->fault = 1;
                break;
            }
        }
    }
    __syncthreads();
}

__global__ void __launch_bounds__(kThreads) k_floor_dispatch(F f, int64_t T, int flag) {
    const uint32_t epoch = f.ctl->epoch_d + 1;
    /* Each token lands K times, once per expert, as in the expert-major
     * receive: the bytes a receiver writes (DeepEP's layout). */
    for (int64_t j = blockIdx.x; j < T * f.K; j += gridDim.x)
        copy_row(f.recv + (size_t)j * f.H, f.xin + (size_t)(j / f.K) * f.H, f.H);
    if (flag) count_in_and_wait(f.ctl, &f.ctl->flag_d, epoch, T);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        f.ctl->count = T;
        if (flag) f.ctl->epoch_d = epoch;
    }
}

__global__ void __launch_bounds__(kThreads) k_floor_combine(F f, int64_t T, int flag) {
    const uint32_t epoch = f.ctl->epoch_c + 1;
    const int K = f.K;
    const uint16_t *src = f.yk;
    if (flag) {
        for (int64_t j = blockIdx.x; j < T * K; j += gridDim.x)
            copy_row(f.comb + (size_t)j * f.H, f.yk + (size_t)j * f.H, f.H);
        count_in_and_wait(f.ctl, &f.ctl->flag_c, epoch, T);
        src = f.comb;
    }
    /* Items (token, chunk of 8 * blockDim elements); 8 bf16 per thread. */
    const int64_t per = 8 * (int64_t)blockDim.x, chunks = (f.H + per - 1) / per;
    for (int64_t item = blockIdx.x; item < T * chunks; item += gridDim.x) {
        const int64_t t = item / chunks, h0 = (item % chunks) * per + (int64_t)threadIdx.x * 8;
        if (h0 >= f.H) continue;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        const bool vec = h0 + 8 <= f.H && f.H % 8 == 0;
        /* Eight rows' loads issued before any is summed: one trip to memory
         * per eight rows, not one per row (a floor must be the best case). */
        for (int k0 = 0; k0 < K; k0 += 8) {
            int4 raw[8];
            float w[8];
#pragma unroll
            for (int b = 0; b < 8; b++)
                if (vec && k0 + b < K) {
                    raw[b] = *(const int4 *)(src + (size_t)(t * K + k0 + b) * f.H + h0);
                    w[b] = f.w[t * K + k0 + b];
                }
#pragma unroll
            for (int b = 0; b < 8; b++) {
                if (k0 + b >= K) break;
                const uint16_t *row = src + (size_t)(t * K + k0 + b) * f.H;
                const float wb = vec ? w[b] : f.w[t * K + k0 + b];
                if (vec) {
                    const uint32_t u[4] = {(uint32_t)raw[b].x, (uint32_t)raw[b].y,
                                           (uint32_t)raw[b].z, (uint32_t)raw[b].w};
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        acc[2 * j] = epxi_madd(acc[2 * j], wb, epxi_bf16_to_f32(u[j] & 0xffffu));
                        acc[2 * j + 1] =
                            epxi_madd(acc[2 * j + 1], wb, epxi_bf16_to_f32(u[j] >> 16));
                    }
                } else {
                    for (int j = 0; j < 8 && h0 + j < f.H; j++)
                        acc[j] = epxi_madd(acc[j], wb, epxi_bf16_to_f32(row[h0 + j]));
                }
            }
        }
        for (int j = 0; j < 8 && h0 + j < f.H; j++)
            f.out[(size_t)t * f.H + h0 + j] = epxi_f32_to_bf16(acc[j]);
    }
    if (flag && blockIdx.x == 0 && threadIdx.x == 0) f.ctl->epoch_c = epoch;
}

/* Spin until the host writes a nonzero *gate (host-mapped), for at most
 * limit_ns (a host that never opens it costs a timed-out figure, not a hang). */
__global__ void k_hold(const volatile int *gate, unsigned long long limit_ns) {
    const unsigned long long t0 = global_ns();
    while (*gate == 0 && global_ns() - t0 < limit_ns) __nanosleep(256);
}

} // namespace

/* Hold stream s until *gate (device view of host-mapped memory) is nonzero,
 * at most 100 ms; 0 or -1 (a launch error). */
extern "C" EPXI_HIDDEN int epxi_ll_hold(cudaStream_t s, const int *gate) {
    k_hold<<<1, 32, 0, s>>>(gate, 100000000ull);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

struct epxi_ll_floor {
    F f;
    int64_t M;
    int max_blocks;
    cudaStream_t s;
    void *mem;
};

extern "C" EPXI_HIDDEN void epxi_ll_floor_destroy(epxi_ll_floor *fl) {
    if (fl == NULL) return;
    cudaFree(fl->mem);
    free(fl);
}

/* Buffers for T <= M tokens of H bf16 and top-K on stream s; 0 or -1. */
extern "C" EPXI_HIDDEN int epxi_ll_floor_create(int32_t H, int32_t K, int64_t M, cudaStream_t s,
                                                epxi_ll_floor **out) {
    *out = NULL;
    epxi_ll_floor *fl = (epxi_ll_floor *)calloc(1, sizeof *fl);
    if (fl == NULL || H < 1 || K < 1 || M < 1) {
        free(fl);
        return -1;
    }
    const size_t row = (size_t)H * 2, rows = (size_t)M * (size_t)(2 + 3 * K);
    const size_t bytes = rows * row + (size_t)M * K * 4 + sizeof(FloorCtl) + 1024;
    int dev = 0, sms = 0, per_sm = 0, per_sm_d = 0;
    if (cudaMalloc(&fl->mem, bytes) != cudaSuccess ||
        cudaMemset(fl->mem, 0, bytes) != cudaSuccess || cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_floor_combine, kThreads, 0) !=
            cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_d, k_floor_dispatch, kThreads, 0) !=
            cudaSuccess) {
        epxi_ll_floor_destroy(fl);
        return -1;
    }
    unsigned char *p = (unsigned char *)fl->mem;
    F &f = fl->f;
    f.H = H;
    f.K = K;
    f.ctl = (FloorCtl *)p;
    p += 256;
    f.xin = (uint16_t *)p, p += (size_t)M * row;
    f.recv = (uint16_t *)p, p += (size_t)M * K * row;
    f.yk = (uint16_t *)p, p += (size_t)M * K * row;
    f.comb = (uint16_t *)p, p += (size_t)M * K * row;
    f.out = (uint16_t *)p, p += (size_t)M * row;
    f.w = (float *)p;
    fl->M = M;
    fl->s = s;
    if (per_sm_d < per_sm) per_sm = per_sm_d; /* both kinds of block wait: all resident */
    fl->max_blocks = per_sm * sms > 0 ? per_sm * sms : 1;
    *out = fl;
    return 0;
}

/* One launch: phase 0 dispatch, 1 combine; flag 0 bare, 1 with the flag
 * protocol. 0 or -1 (a launch error, or T out of range). */
extern "C" EPXI_HIDDEN int epxi_ll_floor_run(epxi_ll_floor *fl, int phase, int flag, int64_t T) {
    if (fl == NULL || T < 0 || T > fl->M) return -1;
    const int64_t per = 8 * kThreads, chunks = (fl->f.H + per - 1) / per;
    int64_t items = phase == 0 ? T * fl->f.K : T * chunks;
    if (phase == 1 && flag && T * fl->f.K > items) items = T * fl->f.K;
    if (items < 1) items = 1;
    /* The flag variants wait for each other: every block resident. */
    const unsigned grid = (unsigned)(items < fl->max_blocks ? items : fl->max_blocks);
    if (phase == 0)
        k_floor_dispatch<<<grid, kThreads, 0, fl->s>>>(fl->f, T, flag);
    else
        k_floor_combine<<<grid, kThreads, 0, fl->s>>>(fl->f, T, flag);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

/* 1 when a flag probe gave up waiting (then its figures mean nothing). */
extern "C" EPXI_HIDDEN int epxi_ll_floor_fault(epxi_ll_floor *fl) {
    FloorCtl c;
    if (fl == NULL || cudaMemcpy(&c, fl->f.ctl, sizeof c, cudaMemcpyDeviceToHost) != cudaSuccess)
        return 1;
    return c.fault != 0;
}
