/*
 * test_gpu_ll.c - the low-latency GPU EP engine (epx_comm_gpu.h) against
 * exact oracles, on one GPU: one rank in this process, and 2-4 ranks as
 * forked processes sharing the GPU over CUDA IPC (tests/util/proc_comm.h).
 * Plain C without cmocka (the GPU machine has none); exit 77 without a GPU.
 *
 * Every rank derives every rank's batch from (seed, batch, rank), so each
 * knows exactly what it must receive: its entries per local slot in
 * (source, token, k) order with their rows and weights, and, with identity
 * experts, the combined output of its own tokens, sum over k of w * y(x) in
 * fp32, bit for bit. Cases: dtypes fp32/bf16 both ways, -1 slots, empty
 * ranks, several batches on one handle (stale rows), CUDA-graph capture and
 * replay with new data, a bad slot (refused on every rank, then recovery),
 * and a silent peer (the kernels time out; sync and the bootstrap
 * communicator's health report it). Seed: EPX_TEST_SEED (printed).
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, for proc_comm.h */
#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "epx_comm_gpu.h"
#include "proc_comm.h"

void epxi_gpu_ep_inject_silence(epx_gpu_ep *ep, int on);

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)
#define EK(call)                                                                                   \
    do {                                                                                           \
        epx_status s_ = (call);                                                                    \
        if (s_ != EPX_OK) {                                                                        \
            fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call, epx_status_str(s_),  \
                    err.msg);                                                                      \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)
#define FAILF(...)                                                                                 \
    do {                                                                                           \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        return 1;                                                                                  \
    } while (0)

static uint64_t g_seed;

static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static uint32_t below(uint64_t *s, uint32_t n) { return (uint32_t)(mix(s) % n); }
static float unif(uint64_t *s) { return (float)((mix(s) >> 40) * (1.0 / 16777216.0)); }

/* One layer's shape, the same on every rank. */
typedef struct shape {
    int32_t R, H, K, P;
    int64_t M;
    epx_dtype xd, yd;
    int batches;
    bool graph; /* every batch replays one captured graph (fixed T per rank) */
} shape;

/* One rank's batch: x as stored (fp32 or bf16 bits), slots, weights. */
typedef struct batch {
    int64_t T;
    void *x;
    int32_t *s;
    float *w;
} batch;

static float xval(const shape *c, const void *x, size_t i) {
    return c->xd == EPX_DTYPE_BF16 ? epx_bf16_to_f32(((const uint16_t *)x)[i])
                                   : ((const float *)x)[i];
}

/* The value identity experts put in y: x converted to y_dtype. */
static float yval(const shape *c, const void *x, size_t i) {
    float v = xval(c, x, i);
    return c->yd == EPX_DTYPE_BF16 ? epx_bf16_to_f32(epx_bf16_from_f32(v)) : v;
}

static void make_batch(const shape *c, int b, int32_t r, int64_t fixed_T, batch *o) {
    uint64_t s = g_seed * 1000003u + (uint64_t)b * 7919u + (uint64_t)r * 104729u + 1;
    size_t xs = epx_dtype_size(c->xd);
    o->T =
        fixed_T >= 0 ? fixed_T : (below(&s, 5) == 0 ? 0 : (int64_t)below(&s, (uint32_t)c->M + 1));
    size_t n = (size_t)c->M;
    o->x = calloc(n * (size_t)c->H, xs);
    o->s = calloc(n * (size_t)c->K, sizeof(int32_t));
    o->w = calloc(n * (size_t)c->K, sizeof(float));
    bool to_rank0 = below(&s, 4) == 0; /* then other ranks receive nothing from us */
    for (int64_t i = 0; i < o->T * c->H; i++) {
        float v = unif(&s) * 4.0f - 2.0f;
        if (c->xd == EPX_DTYPE_BF16)
            ((uint16_t *)o->x)[i] = epx_bf16_from_f32(v);
        else
            ((float *)o->x)[i] = v;
    }
    int32_t spr = c->P / c->R;
    for (int64_t i = 0; i < o->T * c->K; i++) {
        o->s[i] = below(&s, 6) == 0 ? -1 : (int32_t)below(&s, (uint32_t)(to_rank0 ? spr : c->P));
        o->w[i] = unif(&s);
    }
}

static void free_batch(batch *o) {
    free(o->x);
    free(o->s);
    free(o->w);
}

/* Check rank me's received view and combined output for batch b. */
static int check(const shape *c, int32_t me, const batch *all, const int64_t *so,
                 const int32_t *etok, const float *ew, const float *out, int b) {
    const int32_t spr = c->P / c->R, K = c->K;
    int64_t e = 0;
    for (int32_t l = 0; l < spr; l++) {
        if (so[l] != e)
            FAILF("rank %d batch %d: slot_offsets[%d] = %lld, expected %lld", me, b, l,
                  (long long)so[l], (long long)e);
        for (int32_t src = 0; src < c->R; src++)
            for (int64_t t = 0; t < all[src].T; t++)
                for (int32_t k = 0; k < K; k++) {
                    if (all[src].s[t * K + k] != me * spr + l) continue;
                    int32_t row = (int32_t)(src * (c->M + 1) + t);
                    if (etok[e] != row || memcmp(&ew[e], &all[src].w[t * K + k], 4) != 0)
                        FAILF("rank %d batch %d: entry %lld is (row %d, w %g), expected (row %d, w "
                              "%g)",
                              me, b, (long long)e, etok[e], (double)ew[e], row,
                              (double)all[src].w[t * K + k]);
                    e++;
                }
    }
    if (so[spr] != e)
        FAILF("rank %d batch %d: %lld entries, expected %lld", me, b, (long long)so[spr],
              (long long)e);
    const batch *mine = &all[me];
    for (int64_t t = 0; t < mine->T; t++)
        for (int32_t h = 0; h < c->H; h++) {
            float acc = 0.0f;
            for (int32_t k = 0; k < K; k++)
                if (mine->s[t * K + k] >= 0)
                    acc += mine->w[t * K + k] * yval(c, mine->x, (size_t)(t * c->H + h));
            if (memcmp(&acc, &out[t * c->H + h], 4) != 0)
                FAILF("rank %d batch %d token %lld h %d: combine %.9g, expected %.9g (bitwise)", me,
                      b, (long long)t, h, (double)out[t * c->H + h], (double)acc);
        }
    return 0;
}

/* Run c's batches on one rank of `boot`. */
static int run_rank(epx_comm *boot, const shape *c) {
    epx_error err = {0};
    const int32_t me = epx_comm_rank(boot), R = c->R, spr = c->P / R, K = c->K;
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    epx_ep_config cfg = EPX_EP_CONFIG_INIT;
    cfg.hidden = c->H;
    cfg.top_k = K;
    cfg.num_slots = c->P;
    cfg.max_tokens = c->M;
    cfg.x_dtype = c->xd;
    cfg.y_dtype = c->yd;
    cfg.mode = EPX_EP_MODE_LOW_LATENCY;
    epx_gpu_ep_opts o = EPX_GPU_EP_OPTS_INIT;
    o.timeout_ms = 60000; /* processes time-slice the GPU */
    epx_gpu_ep *ep = NULL;
    EK(epx_gpu_ep_create(boot, &cfg, st, &o, &ep, &err));
    const size_t xs = epx_dtype_size(c->xd), M = (size_t)c->M;
    void *dx;
    int32_t *ds;
    float *dw, *dout;
    CK(cudaMalloc(&dx, M * (size_t)c->H * xs));
    CK(cudaMalloc((void **)&ds, M * (size_t)K * 4));
    CK(cudaMalloc((void **)&dw, M * (size_t)K * 4));
    CK(cudaMalloc((void **)&dout, M * (size_t)c->H * 4));
    int64_t *so = malloc((size_t)(spr + 1) * 8);
    size_t cap = (size_t)R * M * (size_t)K + 1;
    int32_t *etok = malloc(cap * 4);
    float *ew = malloc(cap * 4), *out = malloc(M * (size_t)c->H * 4 + 4);
    batch all[PC_MAX_RANKS];
    cudaGraphExec_t exec = NULL;
    epx_ep_recv rv;
    int rc = 0;
    for (int b = 0; b < c->batches && rc == 0; b++) {
        for (int32_t r = 0; r < R; r++)
            make_batch(c, b, r, c->graph ? (int64_t)((r * 7 + 3) % (c->M + 1)) : -1, &all[r]);
        const batch *my = &all[me];
        CK(cudaMemcpyAsync(dx, my->x, (size_t)my->T * (size_t)c->H * xs, cudaMemcpyHostToDevice,
                           st));
        CK(cudaMemcpyAsync(ds, my->s, (size_t)my->T * (size_t)K * 4, cudaMemcpyHostToDevice, st));
        CK(cudaMemcpyAsync(dw, my->w, (size_t)my->T * (size_t)K * 4, cudaMemcpyHostToDevice, st));
        if (c->graph) {
            if (exec == NULL) {
                cudaGraph_t g;
                CK(cudaStreamSynchronize(st));
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
                EK(epx_gpu_ep_dispatch(ep, my->T, dx, ds, dw, &rv, &err));
                EK(epx_gpu_ep_identity_experts(ep, &err));
                EK(epx_gpu_ep_combine(ep, dout, &err));
                CK(cudaStreamEndCapture(st, &g));
                CK(cudaGraphInstantiate(&exec, g, 0));
                CK(cudaGraphDestroy(g));
            }
            CK(cudaGraphLaunch(exec, st));
        } else {
            EK(epx_gpu_ep_dispatch(ep, my->T, dx, ds, dw, &rv, &err));
            if (rv.num_entries != -1 || rv.num_local_slots != spr ||
                rv.num_tokens != (int64_t)R * (c->M + 1))
                FAILF("rank %d: the recv view's host fields are off", me);
            EK(epx_gpu_ep_identity_experts(ep, &err));
            EK(epx_gpu_ep_combine(ep, dout, &err));
        }
        EK(epx_gpu_ep_sync(ep, &err));
        CK(cudaMemcpy(so, rv.slot_offsets, (size_t)(spr + 1) * 8, cudaMemcpyDeviceToHost));
        int64_t n = so[spr] >= 0 && (size_t)so[spr] < cap ? so[spr] : 0;
        CK(cudaMemcpy(etok, rv.entry_token, (size_t)n * 4 + 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(ew, rv.entry_weight, (size_t)n * 4 + 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(out, dout, (size_t)my->T * (size_t)c->H * 4, cudaMemcpyDeviceToHost));
        rc = check(c, me, all, so, etok, ew, out, b);
        for (int32_t r = 0; r < R; r++) free_batch(&all[r]);
    }
    if (exec) cudaGraphExecDestroy(exec);
    epx_gpu_ep_destroy(ep);
    cudaFree(dx), cudaFree(ds), cudaFree(dw), cudaFree(dout);
    free(so), free(etok), free(ew), free(out);
    cudaStreamDestroy(st);
    return rc;
}

static void random_shape(uint64_t *s, int32_t R, shape *c) {
    c->R = R;
    c->H = (1 + (int32_t)below(s, 48)) * (below(s, 2) ? 8 : 1);
    c->K = 1 + (int32_t)below(s, 8);
    c->P = R * (1 + (int32_t)below(s, 6));
    c->M = 1 + (int64_t)below(s, 24);
    c->xd = below(s, 2) ? EPX_DTYPE_BF16 : EPX_DTYPE_F32;
    c->yd = below(s, 2) ? EPX_DTYPE_BF16 : EPX_DTYPE_F32;
    c->batches = 4;
    c->graph = false;
}

/* ---- processes: R ranks on the one GPU ------------------------------------ */

typedef struct proc_job {
    shape c[8];
    int ncases;
} proc_job;

static int proc_rank(int32_t rank, int32_t R, pc_world *w, void *arg) {
    proc_job *j = (proc_job *)arg;
    epx_comm *boot = pc_comm(w, rank);
    if (boot == NULL) return 1;
    (void)R;
    for (int i = 0; i < j->ncases; i++)
        if (run_rank(boot, &j->c[i]) != 0) {
            fprintf(stderr, "rank %d: case %d failed (seed %llu)\n", rank, i,
                    (unsigned long long)g_seed);
            return 1;
        }
    epx_comm_destroy(boot);
    return 0;
}

/* ---- one rank in this process --------------------------------------------- */

static int single_rank_cases(void) {
    epx_error err = {0};
    epx_comm *local = NULL;
    EK(epx_comm_create_local(&local, &err));
    uint64_t s = g_seed * 31 + 5;
    for (int i = 0; i < 40; i++) {
        shape c;
        random_shape(&s, 1, &c);
        c.graph = i % 4 == 3;
        if (run_rank(local, &c) != 0)
            FAILF("one rank, case %d failed (seed %llu)", i, (unsigned long long)g_seed);
    }
    /* The shape of the benchmarks: Kimi-K2 on 8 GPUs seen from one rank. */
    shape big = {1, 7168, 8, 48, 32, EPX_DTYPE_BF16, EPX_DTYPE_BF16, 3, false};
    if (run_rank(local, &big) != 0) FAILF("one rank, H=7168 failed");
    big.graph = true;
    if (run_rank(local, &big) != 0) FAILF("one rank, H=7168 graph failed");
    epx_comm_destroy(local);
    return 0;
}

/* A bad slot: the batch is refused (sync says so, output zeros), the next
 * one goes through. Then a silent rank: sync times out, health and the
 * bootstrap communicator report it, later calls refuse at once. */
static int fault_cases(void) {
    epx_error err = {0};
    epx_comm *local = NULL;
    EK(epx_comm_create_local(&local, &err));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    epx_ep_config cfg = EPX_EP_CONFIG_INIT;
    cfg.hidden = 16;
    cfg.top_k = 2;
    cfg.num_slots = 4;
    cfg.max_tokens = 4;
    cfg.mode = EPX_EP_MODE_LOW_LATENCY;
    epx_gpu_ep_opts o = EPX_GPU_EP_OPTS_INIT;
    o.timeout_ms = 300;
    epx_gpu_ep *ep = NULL;
    EK(epx_gpu_ep_create(local, &cfg, st, &o, &ep, &err));
    float hx[64], hw[8] = {1, 1, 1, 1, 1, 1, 1, 1}, hout[64];
    int32_t bad[8] = {0, 1, 2, 9, 0, 1, 2, 3}, good[8] = {0, 1, 2, 3, 0, 1, 2, 3};
    for (int i = 0; i < 64; i++) hx[i] = (float)i;
    float *dx, *dw, *dout;
    int32_t *ds;
    CK(cudaMalloc((void **)&dx, sizeof hx));
    CK(cudaMalloc((void **)&dw, sizeof hw));
    CK(cudaMalloc((void **)&dout, sizeof hout));
    CK(cudaMalloc((void **)&ds, sizeof bad));
    CK(cudaMemcpy(dx, hx, sizeof hx, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, hw, sizeof hw, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ds, bad, sizeof bad, cudaMemcpyHostToDevice));
    epx_ep_recv rv;
    EK(epx_gpu_ep_dispatch(ep, 4, dx, ds, dw, &rv, &err));
    EK(epx_gpu_ep_identity_experts(ep, &err));
    EK(epx_gpu_ep_combine(ep, dout, &err));
    if (epx_gpu_ep_sync(ep, &err) != EPX_ERR_INVALID_ARG ||
        strstr(err.msg, "outside [-1, 4)") == NULL)
        FAILF("a bad slot: expected EPX_ERR_INVALID_ARG naming the range, got '%s'", err.msg);
    CK(cudaMemcpy(hout, dout, sizeof hout, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 64; i++)
        if (hout[i] != 0.0f)
            FAILF("a refused batch must combine to zeros (element %d = %g)", i, (double)hout[i]);
    CK(cudaMemcpy(ds, good, sizeof good, cudaMemcpyHostToDevice));
    EK(epx_gpu_ep_dispatch(ep, 4, dx, ds, dw, &rv, &err));
    EK(epx_gpu_ep_identity_experts(ep, &err));
    EK(epx_gpu_ep_combine(ep, dout, &err));
    EK(epx_gpu_ep_sync(ep, &err));
    CK(cudaMemcpy(hout, dout, sizeof hout, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 64; i++)
        if (hout[i] != 2.0f * hx[i])
            FAILF("after a refused batch: element %d = %g, expected %g", i, (double)hout[i],
                  2.0 * hx[i]);
    /* Dispatch and combine alternate. */
    EK(epx_gpu_ep_dispatch(ep, 4, dx, ds, dw, &rv, &err));
    if (epx_gpu_ep_dispatch(ep, 4, dx, ds, dw, &rv, &err) != EPX_ERR_INVALID_ARG ||
        strstr(err.msg, "epx_gpu_ep_combine first") == NULL)
        FAILF("a second dispatch before combine must be refused: '%s'", err.msg);
    EK(epx_gpu_ep_identity_experts(ep, &err));
    EK(epx_gpu_ep_combine(ep, dout, &err));
    EK(epx_gpu_ep_sync(ep, &err));
    /* Over capacity: refused on the host, nothing launched. */
    if (epx_gpu_ep_dispatch(ep, 5, dx, ds, dw, &rv, &err) != EPX_ERR_INVALID_ARG ||
        strstr(err.msg, "max_tokens 4") == NULL)
        FAILF("5 tokens on max_tokens 4: '%s'", err.msg);
    /* Silence: our own flag never comes. */
    epxi_gpu_ep_inject_silence(ep, 1);
    EK(epx_gpu_ep_dispatch(ep, 4, dx, ds, dw, &rv, &err));
    EK(epx_gpu_ep_identity_experts(ep, &err));
    EK(epx_gpu_ep_combine(ep, dout, &err));
    if (epx_gpu_ep_sync(ep, &err) != EPX_ERR_TIMEOUT || strstr(err.msg, "300 ms") == NULL)
        FAILF("a silent rank: expected EPX_ERR_TIMEOUT after 300 ms, got '%s'", err.msg);
    epx_error e2 = {0};
    if (epx_comm_health(local, &e2) != EPX_ERR_TIMEOUT)
        FAILF("the bootstrap communicator must report the timeout");
    if (epx_gpu_ep_dispatch(ep, 4, dx, ds, dw, &rv, &err) != EPX_ERR_TIMEOUT)
        FAILF("a dispatch after a timeout must refuse");
    epx_gpu_ep_destroy(ep);
    /* Configs the engine refuses, with the fix in the message. */
    cfg.mode = EPX_EP_MODE_NORMAL;
    size_t bytes;
    if (epx_gpu_ep_buffer_bytes(&cfg, 1, &bytes, &err) != EPX_ERR_INVALID_ARG ||
        strstr(err.msg, "LOW_LATENCY") == NULL)
        FAILF("normal mode must be refused: '%s'", err.msg);
    cfg.mode = EPX_EP_MODE_LOW_LATENCY;
    cfg.combine = EPX_EP_COMBINE_RANK;
    if (epx_gpu_ep_buffer_bytes(&cfg, 1, &bytes, &err) != EPX_ERR_INVALID_ARG ||
        strstr(err.msg, "TOPK") == NULL)
        FAILF("rank-order combine must be refused: '%s'", err.msg);
    cudaFree(dx), cudaFree(dw), cudaFree(dout), cudaFree(ds);
    cudaStreamDestroy(st);
    epx_comm_destroy(local);
    return 0;
}

/* Whether a GPU is usable, asked in a child so this process forks clean. */
static bool have_gpu(void) {
    pid_t p = fork();
    if (p == 0) {
        int n = 0;
        _exit(cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? 0 : 1);
    }
    int status = 0;
    waitpid(p, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int main(void) {
    const char *env = getenv("EPX_TEST_SEED");
    g_seed = env ? strtoull(env, NULL, 10) : 8101;
    printf("test seed: %llu (set EPX_TEST_SEED to reproduce)\n", (unsigned long long)g_seed);
    if (!have_gpu()) {
        printf("skipped: no CUDA GPU visible\n");
        return 77;
    }
    /* Ranks as processes first: they must fork before this process uses CUDA. */
    uint64_t s = g_seed * 17 + 3;
    for (int32_t R = 2; R <= 4; R++) {
        proc_job j;
        memset(&j, 0, sizeof j);
        j.ncases = 4;
        for (int i = 0; i < j.ncases; i++) {
            random_shape(&s, R, &j.c[i]);
            j.c[i].graph = i == 3;
        }
        int failed = pc_run(R, proc_rank, &j, 240);
        printf("%d ranks as processes over CUDA IPC: %s\n", R, failed ? "FAILED" : "ok");
        if (failed) return 1;
    }
    if (single_rank_cases() != 0) return 1;
    printf("one rank: ok\n");
    if (fault_cases() != 0) return 1;
    printf("faults: ok\n");
    return 0;
}
