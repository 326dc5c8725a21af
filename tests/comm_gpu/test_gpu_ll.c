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
 * communicator's health report it). The staging transports' protocol (the
 * NCCL transport's blocks, flags and strides) on 2-4 ranks in this process,
 * through a test transport that copies each rank's outbox blocks into its
 * peers' inboxes: NCCL takes one rank per GPU, so no NCCL run here can
 * show it. Seed: EPX_TEST_SEED (printed).
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, for proc_comm.h */
#include <cuda_runtime.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "epx_comm_gpu.h"
#include "epx_comm_nccl.h"
#include "proc_comm.h"
#include "staging.h" /* the staging interface (src/comm/gpu) */

void epxi_gpu_ep_inject_silence(epx_gpu_ep *ep, int on);
int epxi_gpu_ep_epochs(epx_gpu_ep *ep, uint32_t *de, uint32_t *ce);
int epxi_gpu_ep_set_epochs(epx_gpu_ep *ep, uint32_t epoch);
void epxi_gpu_ep_variant(epx_gpu_ep *ep, int bits);

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

/* A low-latency layer's config. */
static epx_ep_config ll_config(int32_t H, int32_t K, int32_t P, int64_t M, epx_dtype xd,
                               epx_dtype yd) {
    epx_ep_config cfg = EPX_EP_CONFIG_INIT;
    cfg.hidden = H;
    cfg.top_k = K;
    cfg.num_slots = P;
    cfg.max_tokens = M;
    cfg.x_dtype = xd;
    cfg.y_dtype = yd;
    cfg.mode = EPX_EP_MODE_LOW_LATENCY;
    return cfg;
}

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
    bool graph;    /* every batch replays one captured graph (fixed T per rank) */
    int fp8;       /* EPX_GPU_EP_FP8 [| _ROUND_SCALE [| _UE8M0]]: dispatch in fp8 (bf16 x) */
    int64_t bound; /* > 0: epx_gpu_ep_set_token_bound(bound), every batch at most that */
    bool normal;   /* EPX_EP_MODE_NORMAL: the compact receive (rows stay in the inbox) */
    int variant;   /* epxi_gpu_ep_variant bits (64: a large batch's rows before its table;
                      1024: a small batch's combine in the usual blocks; 2048: the slot
                      ranges' old loop; 8192: normal mode's
                      first meta after the scan) */
    bool ids64;    /* the top-k ids as int64 (EPX_GPU_EP_IDS64), as torch and DeepEP pass them */
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

/* ---- the fp8 oracle: DeepEP's definition, written out independently of
 * the library (the e4m3 value by searching all 256 codes) ---- */
static float e4m3_value(int c) {
    const int e = (c >> 3) & 15, m = c & 7;
    const float a = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), e - 10);
    return (c & 0x80) ? -a : a;
}
static uint8_t e4m3_nearest(float v) { /* v in [-448, 448]; ties to the even code */
    static float val[256];
    if (val[1] == 0.0f)
        for (int c = 0; c < 256; c++) val[c] = e4m3_value(c);
    int best = 0;
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) continue; /* NaN */
        const float d = fabsf(val[c] - v), bd = fabsf(val[best] - v);
        if (d < bd || (d == bd && (c & 1) == 0 && val[c] != val[best])) best = c;
    }
    if (val[best] == 0.0f) best = signbit(v) ? 0x80 : 0;
    return (uint8_t)best;
}
/* Group g of row x (bf16): its e4m3 bytes (128) and scale. */
static float fp8_group(const shape *c, const void *x, int64_t t, int g, uint8_t *q) {
    float amax = 0.0f;
    for (int i = 0; i < 128; i++)
        amax = fmaxf(amax, fabsf(xval(c, x, (size_t)(t * c->H + g * 128 + i))));
    if (amax < 1e-4f) amax = 1e-4f;
    float scale = amax * (float)(1.0 / 448.0), factor = 448.0f / amax;
    if (c->fp8 & EPX_GPU_EP_ROUND_SCALE) {
        int e;
        const float fr = frexpf(scale, &e); /* scale = fr * 2^e, fr in [0.5, 1) */
        scale = ldexpf(1.0f, fr == 0.5f ? e - 1 : e);
        factor = 1.0f / scale;
    }
    for (int i = 0; q != NULL && i < 128; i++) {
        const float v = xval(c, x, (size_t)(t * c->H + g * 128 + i)) * factor;
        q[i] = e4m3_nearest(fminf(fmaxf(v, -448.0f), 448.0f));
    }
    return scale;
}

/* The values identity experts put in y for token t: x converted to
 * y_dtype (fp8: the dequantised values, data * scale). */
static void yvals(const shape *c, const void *x, int64_t t, float *y) {
    for (int h = 0; h < c->H; h += 128) {
        uint8_t q[128];
        const float scale = c->fp8 ? fp8_group(c, x, t, h / 128, q) : 0.0f;
        for (int i = h; i < c->H && i < h + 128; i++) {
            float v = c->fp8 ? e4m3_value(q[i - h]) * scale : xval(c, x, (size_t)(t * c->H + i));
            y[i] = c->yd == EPX_DTYPE_BF16 ? epx_bf16_to_f32(epx_bf16_from_f32(v)) : v;
        }
    }
}

static void make_batch(const shape *c, int b, int32_t r, int64_t fixed_T, batch *o) {
    uint64_t s = g_seed * 1000003u + (uint64_t)b * 7919u + (uint64_t)r * 104729u + 1;
    size_t xs = epx_dtype_size(c->xd);
    const int64_t most = c->bound > 0 ? c->bound : c->M;
    o->T =
        fixed_T >= 0 ? fixed_T : (below(&s, 5) == 0 ? 0 : (int64_t)below(&s, (uint32_t)most + 1));
    /* a large shape is there for its large batches (past the staged ids) */
    if (fixed_T < 0 && most > 512) o->T = most - (int64_t)below(&s, (uint32_t)(most / 8));
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
    /* Distinct slots per token (the engine refuses a repeated one). */
    for (int64_t i = 0; i < o->T * c->K; i++) {
        int32_t v = -1;
        for (int tries = 0; below(&s, 6) != 0 && tries < 8 && v < 0; tries++) {
            v = (int32_t)below(&s, (uint32_t)(to_rank0 ? spr : c->P));
            for (int64_t j = i - i % c->K; j < i; j++)
                if (o->s[j] == v) v = -1;
        }
        o->s[i] = v;
        o->w[i] = unif(&s);
    }
}

static void free_batch(batch *o) {
    free(o->x);
    free(o->s);
    free(o->w);
}

/* What rank me's views hold after a dispatch (host copies). Normal mode:
 * rx is the inbox (rows of xstride bytes), etok each entry's row there and
 * offs [spr + 1] the slots' first entries. */
typedef struct got {
    int32_t *count, *srctok, *etok;
    int64_t *range, *offs;
    float *ew;
    unsigned char *rx;
    size_t xstride;
} got;

/* The host copies of a rank's views: spr slots on R ranks, `rows` entry
 * rows, `xbytes` of received data whose rows are `xstride` apart. */
static got got_alloc(int32_t spr, int32_t R, size_t rows, size_t xbytes, size_t xstride) {
    return (got){.count = malloc((size_t)spr * 4),
                 .srctok = malloc(rows * 4 + 4),
                 .etok = malloc(rows * 4 + 4),
                 .offs = malloc((size_t)(spr + 1) * 8),
                 .range = malloc((size_t)spr * (size_t)R * 8),
                 .ew = malloc(rows * 4 + 4),
                 .rx = malloc(xbytes + 1),
                 .xstride = xstride};
}
static void got_free(got *g) {
    free(g->count), free(g->srctok), free(g->etok), free(g->offs), free(g->range), free(g->ew);
    free(g->rx);
}

/* Entry row e of an fp8 receive (g->rx: data, then the column-major scales)
 * against token t of batch src: every byte and scale. */
static int check_fp8_row(const shape *c, const got *g, int64_t e, const batch *src, int64_t t) {
    const int64_t RM = (int64_t)c->R * c->M, spr = c->P / c->R, l = e / RM, s = e % RM;
    const int G = c->H / 128;
    const unsigned char *sc = g->rx + (size_t)(spr * RM) * (size_t)c->H;
    for (int gi = 0; gi < G; gi++) {
        uint8_t q[128];
        const float scale = fp8_group(c, src->x, t, gi, q);
        if (memcmp(g->rx + (size_t)e * (size_t)c->H + (size_t)gi * 128, q, 128) != 0) return 1;
        if (c->fp8 & EPX_GPU_EP_UE8M0) {
            uint32_t w;
            memcpy(&w, sc + 4 * ((size_t)(l * (G / 4) + gi / 4) * (size_t)RM + (size_t)s), 4);
            uint32_t sb;
            memcpy(&sb, &scale, 4);
            if (((w >> (8 * (gi % 4))) & 0xffu) != ((sb >> 23) & 0xffu)) return 1;
        } else {
            float have;
            memcpy(&have, sc + 4 * ((size_t)(l * G + gi) * (size_t)RM + (size_t)s), 4);
            if (memcmp(&have, &scale, 4) != 0) return 1;
        }
    }
    return 0;
}

/* Rank's views after a batch, copied to the host (spr local slots, R
 * ranks, rows entry rows of xrow bytes). */
static int fetch_views(const epx_gpu_ep_views *vw, const epx_ep_recv *rv, int32_t spr, int32_t R,
                       size_t rows, size_t xbytes, got *g) {
    CK(cudaMemcpy(g->count, vw->counts, (size_t)spr * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(g->srctok, vw->src_token, rows * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(g->range, vw->layout_range, (size_t)spr * R * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(g->ew, vw->entry_weight, rows * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(g->rx, vw->x, xbytes, cudaMemcpyDeviceToHost));
    if (rv->slot_offsets != NULL) {
        CK(cudaMemcpy(g->etok, rv->entry_token, rows * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(g->offs, rv->slot_offsets, (size_t)(spr + 1) * 8, cudaMemcpyDeviceToHost));
    }
    return 0;
}

/* Check rank me's expert-major view and combined output for batch b: local
 * slot l's rows are its entries in (source, token, k) order, each a copy of
 * the token's row, with its weight (when dispatched with weights), source
 * token and each source's range; the combine is the fixed-order sum over k
 * of w * y(x) in fp32 (rounded once to bf16 when out_bf16), bit for bit. */
static int check(const shape *c, int32_t me, const batch *all, const got *g, const void *out,
                 bool weighted, bool out_bf16, int b, uint32_t drop) {
    const int32_t spr = c->P / c->R, K = c->K;
    const int64_t RM = (int64_t)c->R * c->M;
    const size_t xrow = (size_t)c->H * epx_dtype_size(c->xd);
    int64_t total = 0; /* normal mode: entries before slot l */
    for (int32_t l = 0; l < spr; l++) {
        int64_t i = 0;
        if (c->normal && g->offs[l] != total)
            FAILF("rank %d batch %d: slot %d starts at entry %lld, expected %lld", me, b, l,
                  (long long)g->offs[l], (long long)total);
        /* normal mode: entry e's row is where its sender wrote it */
        const int64_t room = c->normal ? g->offs[l + 1] - g->offs[l] : RM;
        for (int32_t src = 0; src < c->R; src++) {
            const int64_t begin = i;
            for (int64_t t = 0; t < all[src].T; t++)
                for (int32_t k = 0; k < K; k++) {
                    if (all[src].s[t * K + k] != me * spr + l) continue;
                    const int64_t e = c->normal ? g->offs[l] + i : l * RM + i;
                    const unsigned char *row = c->normal && i < room
                                                   ? g->rx + (size_t)g->etok[e] * g->xstride
                                                   : g->rx + (size_t)e * xrow;
                    if (i >= room || g->srctok[e] != t ||
                        (weighted && memcmp(&g->ew[e], &all[src].w[t * K + k], 4) != 0))
                        FAILF("rank %d batch %d: slot %d row %lld is (token %d, w %g), expected "
                              "(token %lld of rank %d, w %g)",
                              me, b, l, (long long)i, g->srctok[e], (double)g->ew[e], (long long)t,
                              src, (double)all[src].w[t * K + k]);
                    if (c->fp8) {
                        if (check_fp8_row(c, g, e, &all[src], t) != 0)
                            FAILF("rank %d batch %d: slot %d row %lld is not token %lld of rank "
                                  "%d in fp8 (flags %d)",
                                  me, b, l, (long long)i, (long long)t, src, c->fp8);
                    } else if (memcmp(row, (const unsigned char *)all[src].x + t * xrow, xrow) != 0)
                        FAILF("rank %d batch %d: slot %d row %lld does not hold token %lld of "
                              "rank %d",
                              me, b, l, (long long)i, (long long)t, src);
                    i++;
                }
            const int64_t lr = g->range[(size_t)l * c->R + src];
            if ((lr >> 32) != begin || (lr & 0xffffffff) != i - begin)
                FAILF("rank %d batch %d: layout_range[%d][%d] = (%lld, %lld), expected (%lld, "
                      "%lld)",
                      me, b, l, src, (long long)(lr >> 32), (long long)(lr & 0xffffffff),
                      (long long)begin, (long long)(i - begin));
        }
        if (g->count[l] != i || (c->normal && room != i))
            FAILF("rank %d batch %d: slot %d counts %d entries (%lld between its offsets), "
                  "expected %lld",
                  me, b, l, g->count[l], (long long)room, (long long)i);
        total += i;
    }
    if (c->normal && g->offs[spr] != total)
        FAILF("rank %d batch %d: slot_offsets ends at %lld, expected %lld entries", me, b,
              (long long)g->offs[spr], (long long)total);
    const batch *mine = &all[me];
    float *yv = malloc(sizeof(float) * (size_t)c->H);
    for (int64_t t = 0; t < mine->T; t++) {
        yvals(c, mine->x, t, yv);
        for (int32_t h = 0; h < c->H; h++) {
            float acc = 0.0f;
            for (int32_t k = 0; k < K; k++) {
                const int32_t sl = mine->s[t * K + k];
                if (sl >= 0 && !((drop >> (sl / spr)) & 1u)) /* drop: masked ranks' experts */
                    acc += mine->w[t * K + k] * yv[h];
            }
            float o;
            if (out_bf16) {
                uint16_t want = epx_bf16_from_f32(acc),
                         have = ((const uint16_t *)out)[t * c->H + h];
                if (want == have) continue;
                o = epx_bf16_to_f32(have);
            } else {
                o = ((const float *)out)[t * c->H + h];
                if (memcmp(&acc, &o, 4) == 0) continue;
            }
            free(yv);
            FAILF("rank %d batch %d token %lld h %d: combine %.9g, expected %.9g (bitwise%s)", me,
                  b, (long long)t, h, (double)o, (double)acc, out_bf16 ? ", bf16" : "");
        }
    }
    free(yv);
    return 0;
}

/* Run c's batches on one rank of `boot`. Batches cycle through four ways
 * to combine (plain graphs use the first): the handle's y and weights; no
 * weights at dispatch, the caller's at combine, bf16 output; the caller's
 * own copy of y; that copy in two halves, overwritten between them (a
 * receive hook's caller may reuse y once the send has run). */
/* The transport under test: EPX_GPU_EP_TRANSPORT=host runs every case over
 * host memory, =nccl the one-rank cases over NCCL send/receive to itself
 * (NCCL takes one rank per GPU; scripts/gpu_check.sh runs all three). */
static bool transport_is(const char *name) {
    const char *t = getenv("EPX_GPU_EP_TRANSPORT");
    return t != NULL && strcmp(t, name) == 0;
}
static bool transport_is_host(void) { return transport_is("host"); }

/* This process's one-rank NCCL communicator, made once. */
static ncclComm_t one_rank_nccl(void) {
    static ncclComm_t c = NULL;
    if (c == NULL) {
        ncclUniqueId id;
        if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&c, 1, id, 0) != ncclSuccess)
            c = NULL;
    }
    return c;
}

/* The engine of the transport under test, on `boot`'s ranks. */
static epx_status make_engine(epx_comm *boot, const epx_ep_config *cfg, cudaStream_t st,
                              const epx_gpu_ep_opts *o, epx_gpu_ep **ep, epx_error *err) {
    if (transport_is("nccl")) return epx_gpu_ep_create_nccl(one_rank_nccl(), cfg, st, o, ep, err);
    return epx_gpu_ep_create(boot, cfg, st, o, ep, err);
}

static int run_rank(epx_comm *boot, const shape *c) {
    epx_error err = {0};
    const int32_t me = epx_comm_rank(boot), R = c->R, spr = c->P / R, K = c->K;
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    epx_ep_config cfg = ll_config(c->H, K, c->P, c->M, c->xd, c->yd);
    if (c->normal) cfg.mode = EPX_EP_MODE_NORMAL;
    epx_gpu_ep_opts o = EPX_GPU_EP_OPTS_INIT;
    o.timeout_ms = 60000; /* processes time-slice the GPU */
    epx_gpu_ep *ep = NULL;
    EK(make_engine(boot, &cfg, st, &o, &ep, &err));
    if (c->bound > 0) EK(epx_gpu_ep_set_token_bound(ep, c->bound, &err));
    if (c->variant) epxi_gpu_ep_variant(ep, c->variant);
    const char *tn = epx_gpu_ep_transport_name(ep);
    if ((strcmp(tn, "host") == 0) != transport_is_host() ||
        (strcmp(tn, "nccl") == 0) != transport_is("nccl"))
        FAILF("rank %d: transport %s, but EPX_GPU_EP_TRANSPORT is %s", me, tn,
              getenv("EPX_GPU_EP_TRANSPORT") ? getenv("EPX_GPU_EP_TRANSPORT") : "unset");
    epx_gpu_ep_views vw;
    EK(epx_gpu_ep_get_views(ep, &vw, &err));
    const size_t xs = epx_dtype_size(c->xd), M = (size_t)c->M;
    /* entry rows: expert-major, or normal mode's most entries (R * M tokens
     * of min(K, spr) entries each) */
    const size_t rows =
        c->normal ? (size_t)R * M * (size_t)(K < spr ? K : spr) : (size_t)spr * (size_t)R * M;
    const size_t xrow = (size_t)c->H * xs, yrow = (size_t)c->H * epx_dtype_size(c->yd);
    const int64_t stride = c->normal ? 0 : (int64_t)R * c->M;
    if (vw.slot_stride != stride || vw.num_local_slots != spr)
        FAILF("rank %d: views of stride %lld and %d slots, expected %lld and %d", me,
              (long long)vw.slot_stride, vw.num_local_slots, (long long)stride, spr);
    /* normal mode's x: the inbox, both parities of R * M records (a row, then
     * K 16-byte metas) */
    const size_t rec = (xrow + 15) / 16 * 16 + (size_t)K * 16;
    const size_t xbytes = c->normal ? 2 * (size_t)R * M * rec : rows * xrow;
    void *dx, *dy2;
    int32_t *ds;
    float *dw, *dout;
    CK(cudaMalloc(&dx, M * (size_t)c->H * xs));
    CK(cudaMalloc(&dy2, rows * yrow + 1));
    CK(cudaMalloc((void **)&ds, M * (size_t)K * (c->ids64 ? 8 : 4)));
    int64_t *s64 = c->ids64 ? malloc(M * (size_t)K * 8 + 8) : NULL; /* the ids widened */
    const int ids = c->ids64 ? EPX_GPU_EP_IDS64 : 0;
    CK(cudaMalloc((void **)&dw, M * (size_t)K * 4));
    CK(cudaMalloc((void **)&dout, M * (size_t)c->H * 4));
    got g = got_alloc(spr, R, rows, xbytes, rec);
    void *out = malloc(M * (size_t)c->H * 4 + 4);
    batch all[PC_MAX_RANKS];
    cudaGraphExec_t exec = NULL;
    epx_ep_recv rv;
    int rc = 0;
    for (int b = 0; b < c->batches && rc == 0; b++) {
        const int how = c->graph ? 0 : b % 4;
        for (int32_t r = 0; r < R; r++)
            make_batch(c, b, r,
                       c->graph ? (int64_t)((r * 7 + 3) % ((c->bound > 0 ? c->bound : c->M) + 1))
                                : -1,
                       &all[r]);
        const batch *my = &all[me];
        CK(cudaMemcpyAsync(dx, my->x, (size_t)my->T * (size_t)c->H * xs, cudaMemcpyHostToDevice,
                           st));
        if (c->ids64) {
            for (int64_t q = 0; q < my->T * K; q++) s64[q] = my->s[q];
            CK(cudaMemcpyAsync(ds, s64, (size_t)my->T * (size_t)K * 8, cudaMemcpyHostToDevice, st));
            CK(cudaStreamSynchronize(st)); /* s64 is rewritten by the next batch */
        } else {
            CK(cudaMemcpyAsync(ds, my->s, (size_t)my->T * (size_t)K * 4, cudaMemcpyHostToDevice,
                               st));
        }
        CK(cudaMemcpyAsync(dw, my->w, (size_t)my->T * (size_t)K * 4, cudaMemcpyHostToDevice, st));
        if (c->graph) {
            if (exec == NULL) {
                cudaGraph_t gr;
                CK(cudaStreamSynchronize(st));
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
                EK(epx_gpu_ep_dispatch_parts(ep, EPX_GPU_EP_SEND | EPX_GPU_EP_RECV | c->fp8 | ids,
                                             my->T, dx, ds, dw, &rv, &err));
                EK(epx_gpu_ep_identity_experts(ep, &err));
                EK(epx_gpu_ep_combine(ep, dout, &err));
                CK(cudaStreamEndCapture(st, &gr));
                CK(cudaGraphInstantiate(&exec, gr, 0));
                CK(cudaGraphDestroy(gr));
            }
            CK(cudaGraphLaunch(exec, st));
        } else {
            EK(epx_gpu_ep_dispatch_parts(ep, EPX_GPU_EP_SEND | EPX_GPU_EP_RECV | c->fp8 | ids,
                                         my->T, dx, ds, how == 1 ? NULL : dw, &rv, &err));
            if (rv.num_entries != -1 || rv.num_local_slots != spr || rv.slot_stride != stride ||
                rv.slot_counts != vw.counts || rv.x != vw.x ||
                (rv.slot_offsets != NULL) != c->normal || (rv.entry_token != NULL) != c->normal ||
                rv.x_stride != (c->normal ? rec : xrow))
                FAILF("rank %d: the recv view's host fields are off", me);
            EK(epx_gpu_ep_identity_experts(ep, &err));
            if (how == 0) {
                EK(epx_gpu_ep_combine(ep, dout, &err));
            } else if (how == 1) {
                EK(epx_gpu_ep_combine_ex(ep, NULL, dw, dout, EPX_DTYPE_BF16, &err));
            } else {
                CK(cudaMemcpyAsync(dy2, vw.y, rows * yrow, cudaMemcpyDeviceToDevice, st));
                CK(cudaMemsetAsync(vw.y, 0xff, rows * yrow, st)); /* must not be read */
                if (how == 2) {
                    EK(epx_gpu_ep_combine_ex(ep, dy2, NULL, dout, EPX_DTYPE_F32, &err));
                } else { /* in halves, y reused once sent (DeepEP's receive hook allows it) */
                    EK(epx_gpu_ep_combine_parts(ep, EPX_GPU_EP_SEND, dy2, NULL, dout, EPX_DTYPE_F32,
                                                &err));
                    CK(cudaMemsetAsync(dy2, 0xff, rows * yrow, st));
                    EK(epx_gpu_ep_combine_parts(ep, EPX_GPU_EP_RECV, NULL, NULL, NULL,
                                                EPX_DTYPE_F32, &err));
                }
            }
        }
        EK(epx_gpu_ep_sync(ep, &err));
        if (fetch_views(&vw, &rv, spr, R, rows, xbytes, &g) != 0) return 1;
        CK(cudaMemcpy(out, dout, (size_t)my->T * (size_t)c->H * 4, cudaMemcpyDeviceToHost));
        rc = check(c, me, all, &g, out, how != 1, how == 1, b, 0);
        for (int32_t r = 0; r < R; r++) free_batch(&all[r]);
    }
    if (exec) cudaGraphExecDestroy(exec);
    epx_gpu_ep_destroy(ep);
    cudaFree(dx), cudaFree(dy2), cudaFree(ds), cudaFree(dw), cudaFree(dout);
    free(s64);
    got_free(&g);
    free(out);
    cudaStreamDestroy(st);
    return rc;
}

static void random_shape(uint64_t *s, int32_t R, shape *c) {
    *c = (shape){0}; /* low latency, variant 0, int32 ids: the fields not drawn below */
    c->R = R;
    c->H = (1 + (int32_t)below(s, 48)) * (below(s, 2) ? 8 : 1);
    c->K = 1 + (int32_t)below(s, 8);
    c->P = R * (1 + (int32_t)below(s, 6));
    c->M = 1 + (int64_t)below(s, 24);
    c->xd = below(s, 2) ? EPX_DTYPE_BF16 : EPX_DTYPE_F32;
    c->yd = below(s, 2) ? EPX_DTYPE_BF16 : EPX_DTYPE_F32;
    c->batches = 5;
}

/* An fp8 dispatch of c (bf16 x, hidden a multiple of 512): flags by `pick`. */
static void make_fp8(shape *c, int pick) {
    static const int flags[3] = {EPX_GPU_EP_FP8, EPX_GPU_EP_FP8 | EPX_GPU_EP_ROUND_SCALE,
                                 EPX_GPU_EP_FP8 | EPX_GPU_EP_ROUND_SCALE | EPX_GPU_EP_UE8M0};
    c->xd = EPX_DTYPE_BF16;
    c->H = 512 * (1 + c->H % 2);
    c->fp8 = flags[pick % 3];
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

/* One rank fails to open (its opts are refused): every rank's create must
 * return an error naming it, none may wait at a collective in vain. */
static int proc_open_fails(int32_t rank, int32_t R, pc_world *w, void *arg) {
    (void)R, (void)arg;
    epx_comm *boot = pc_comm(w, rank);
    if (boot == NULL) return 1;
    epx_error err = {0};
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    epx_ep_config cfg = ll_config(64, 2, 6, 4, EPX_DTYPE_BF16, EPX_DTYPE_BF16);
    epx_gpu_ep_opts o = EPX_GPU_EP_OPTS_INIT;
    if (rank == 1) o.timeout_ms = 0; /* refused by open, on this rank only */
    epx_gpu_ep *ep = NULL;
    epx_status rc = epx_gpu_ep_create(boot, &cfg, st, &o, &ep, &err);
    epx_comm_destroy(boot);
    if (rc == EPX_OK || ep != NULL) FAILF("rank %d: create succeeded beside a failed rank", rank);
    if (rank != 1 && strstr(err.msg, "rank 1 could not open") == NULL)
        FAILF("rank %d: the failed rank is not named: '%s'", rank, err.msg);
    return 0;
}

/*
 * Shrink mode on 3 processes: rank 1 stops before batch 1's dispatch, rank
 * 2 after batch 2's dispatch (before its combine). The survivors mask each
 * within the timeout and go on: a dispatch has no entries from a masked
 * source, a combine drops the shares of a masked rank's experts, the mask
 * reads {1} then {1, 2}; rank 0 runs batch 3 alone. Stopped ranks wait in
 * destroy (collective), as a failed process would be reaped.
 */
static int proc_shrink(int32_t rank, int32_t R, pc_world *w, void *arg) {
    (void)arg;
    epx_comm *boot = pc_comm(w, rank);
    if (boot == NULL) return 1;
    epx_error err = {0};
    shape c = {R, 64, 4, 2 * R, 8, EPX_DTYPE_BF16, EPX_DTYPE_BF16, 4, false, 0, 0, false, 0, false};
    const int32_t spr = c.P / R, K = c.K;
    const size_t rows = (size_t)spr * (size_t)R * (size_t)c.M, xrow = (size_t)c.H * 2;
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    epx_ep_config cfg = ll_config(c.H, K, c.P, c.M, c.xd, c.yd);
    epx_gpu_ep_opts o = EPX_GPU_EP_OPTS_INIT;
    o.timeout_ms = 4000; /* long enough for processes time-slicing the GPU */
    o.shrink = 1;
    epx_gpu_ep *ep = NULL;
    EK(make_engine(boot, &cfg, st, &o, &ep, &err));
    epx_gpu_ep_views vw;
    EK(epx_gpu_ep_get_views(ep, &vw, &err));
    void *dx;
    int32_t *ds, *dmask;
    float *dw, *dout;
    CK(cudaMalloc(&dx, (size_t)c.M * xrow));
    CK(cudaMalloc((void **)&ds, (size_t)c.M * K * 4));
    CK(cudaMalloc((void **)&dw, (size_t)c.M * K * 4));
    CK(cudaMalloc((void **)&dout, (size_t)c.M * c.H * 4));
    CK(cudaMalloc((void **)&dmask, (size_t)R * 4));
    got g = got_alloc(spr, R, rows, rows * xrow, 0);
    void *out = malloc((size_t)c.M * c.H * 4);
    batch all[PC_MAX_RANKS];
    int rc = 0;
    epx_ep_recv rv;
    for (int b = 0; b < c.batches && rc == 0; b++) {
        if ((rank == 1 && b >= 1) || (rank == 2 && b >= 3)) break; /* stopped */
        /* masked at this batch's dispatch, and at its combine */
        const uint32_t at_d = b == 0 ? 0u : b <= 2 ? 2u : 6u, at_c = b <= 1 ? at_d : 6u;
        for (int32_t r = 0; r < R; r++) {
            make_batch(&c, b, r, -1, &all[r]);
            if ((at_d >> r) & 1u) all[r].T = 0; /* a masked source sends nothing */
        }
        const batch *my = &all[rank];
        CK(cudaMemcpyAsync(dx, my->x, (size_t)my->T * xrow, cudaMemcpyHostToDevice, st));
        CK(cudaMemcpyAsync(ds, my->s, (size_t)my->T * K * 4, cudaMemcpyHostToDevice, st));
        CK(cudaMemcpyAsync(dw, my->w, (size_t)my->T * K * 4, cudaMemcpyHostToDevice, st));
        EK(epx_gpu_ep_dispatch(ep, my->T, dx, ds, dw, &rv, &err));
        if (rank == 2 && b == 2) { /* dispatched, stops before combining */
            EK(epx_gpu_ep_sync(ep, &err));
            break;
        }
        EK(epx_gpu_ep_identity_experts(ep, &err));
        EK(epx_gpu_ep_combine(ep, dout, &err));
        EK(epx_gpu_ep_mask_query(ep, dmask, &err));
        EK(epx_gpu_ep_sync(ep, &err));
        if (fetch_views(&vw, &rv, spr, R, rows, rows * xrow, &g) != 0) return 1;
        CK(cudaMemcpy(out, dout, (size_t)my->T * c.H * 4, cudaMemcpyDeviceToHost));
        int32_t hmask[PC_MAX_RANKS];
        CK(cudaMemcpy(hmask, dmask, (size_t)R * 4, cudaMemcpyDeviceToHost));
        for (int32_t r = 0; r < R && rc == 0; r++)
            if ((hmask[r] != 0) != ((at_c >> r) & 1u)) {
                fprintf(stderr, "rank %d batch %d: mask[%d] = %d, expected %u\n", rank, b, r,
                        hmask[r], (at_c >> r) & 1u);
                rc = 1;
            }
        if (rc == 0) rc = check(&c, rank, all, &g, out, true, false, b, at_c);
        for (int32_t r = 0; r < R; r++) free_batch(&all[r]);
    }
    if (rc == 0 && rank == 0) { /* clean unmasks; update masks in stream order */
        int32_t hmask[PC_MAX_RANKS];
        EK(epx_gpu_ep_mask_clean(ep, &err));
        EK(epx_gpu_ep_mask_update(ep, 2, 1, &err));
        EK(epx_gpu_ep_mask_query(ep, dmask, &err));
        EK(epx_gpu_ep_sync(ep, &err));
        CK(cudaMemcpy(hmask, dmask, (size_t)R * 4, cudaMemcpyDeviceToHost));
        if (hmask[0] != 0 || hmask[1] != 0 || hmask[2] != 1)
            FAILF("after clean and update(2): mask (%d, %d, %d)", hmask[0], hmask[1], hmask[2]);
        if (epx_gpu_ep_mask_update(ep, 3, 1, &err) != EPX_ERR_INVALID_ARG ||
            strstr(err.msg, "rank 3 is outside [0, 3)") == NULL)
            FAILF("mask_update of rank 3 of 3: '%s'", err.msg);
    }
    epx_gpu_ep_destroy(ep);
    epx_comm_destroy(boot);
    cudaFree(dx), cudaFree(ds), cudaFree(dw), cudaFree(dout), cudaFree(dmask);
    got_free(&g);
    free(out);
    cudaStreamDestroy(st);
    return rc;
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
    for (int i = 0; i < 6; i++) { /* fp8 dispatch, every form, launched and as graphs */
        shape c;
        random_shape(&s, 1, &c);
        make_fp8(&c, i);
        c.graph = i >= 3;
        if (run_rank(local, &c) != 0)
            FAILF("one rank, fp8 case %d (flags %d) failed (seed %llu)", i, c.fp8,
                  (unsigned long long)g_seed);
    }
    for (int i = 0; i < 8; i++) { /* a token bound below max_tokens: the blocks shrink */
        shape c;
        random_shape(&s, 1, &c);
        c.bound = 1 + (int64_t)below(&s, (uint32_t)c.M);
        c.graph = i % 2 == 1;
        if (run_rank(local, &c) != 0)
            FAILF("one rank, token bound case %d (bound %lld of %lld) failed (seed %llu)", i,
                  (long long)c.bound, (long long)c.M, (unsigned long long)g_seed);
    }
    for (int i = 0; i < 12 && !transport_is("nccl") && !transport_is_host(); i++) {
        shape c; /* normal mode: the compact receive, launched and as graphs */
        random_shape(&s, 1, &c);
        c.normal = true;
        c.graph = i % 3 == 2;
        if (run_rank(local, &c) != 0)
            FAILF("one rank, normal mode case %d failed (seed %llu)", i,
                  (unsigned long long)g_seed);
    }
    /* Batches past the staged ids (T * K > 4096): positions from the per-slot
     * table, each block's run of items crossing tokens; both modes; the
     * lean send with every row sent before the table (variant 64, cases 6
     * and 7); int64 ids in cases 1, 2 and 7. */
    for (int i = 0; i < 8; i++) {
        shape c = {1,     40, 8, 48,    700, EPX_DTYPE_BF16, EPX_DTYPE_F32, 3,
                   false, 0,  0, false, 0,   false};
        c.graph = i % 2 == 1;
        c.normal = i == 2 || i == 3 || i == 5 || i == 7;
        if (i == 4 || i == 5) c.H = 37; /* rows off 16 bytes: the general instance's block send */
        if (i >= 6) c.variant = 64;
        c.ids64 = i == 1 || i == 2 || i == 7;
        if (c.normal && (transport_is("nccl") || transport_is_host())) continue;
        if (run_rank(local, &c) != 0)
            FAILF("one rank, %d tokens of top-8 (%s mode%s) failed (seed %llu)", (int)c.M,
                  c.normal ? "normal" : "low-latency", c.graph ? ", graph" : "",
                  (unsigned long long)g_seed);
    }
    shape big = {1,     7168, 8, 48,    32, EPX_DTYPE_BF16, EPX_DTYPE_BF16, 3,
                 false, 0,    0, false, 0,  false};
    if (run_rank(local, &big) != 0) FAILF("one rank, H=7168 failed");
    big.graph = true;
    if (run_rank(local, &big) != 0) FAILF("one rank, H=7168 graph failed");
    big.fp8 = EPX_GPU_EP_FP8; /* the benchmark's shape in DeepEP's two fp8 forms */
    if (run_rank(local, &big) != 0) FAILF("one rank, H=7168 fp8 graph failed");
    big.graph = false;
    big.fp8 = EPX_GPU_EP_FP8 | EPX_GPU_EP_ROUND_SCALE | EPX_GPU_EP_UE8M0;
    if (run_rank(local, &big) != 0) FAILF("one rank, H=7168 fp8 UE8M0 failed");
    /* the lean fp8 form in 512-thread blocks (variant 512) and the general
     * instance's fp8 path (4096), each in both scale forms */
    static const int fp8_variants[] = {512, 4096};
    for (size_t i = 0; i < 4; i++) {
        big.variant = fp8_variants[i / 2];
        big.fp8 = i % 2 ? EPX_GPU_EP_FP8 | EPX_GPU_EP_ROUND_SCALE | EPX_GPU_EP_UE8M0
                        : EPX_GPU_EP_FP8 | EPX_GPU_EP_ROUND_SCALE;
        big.graph = i % 2 == 0;
        if (run_rank(local, &big) != 0)
            FAILF("one rank, H=7168 fp8 (flags %d), variant %d failed", big.fp8, big.variant);
    }
    big.variant = 0;
    big.fp8 = 0;
    big.graph = true;
    big.bound = 5; /* the benchmark's shape at a small batch, as the bench runs it */
    if (run_rank(local, &big) != 0) FAILF("one rank, H=7168 graph, token bound 5 failed");
    big.bound = 0;
    /* the forms before, one at a time, for the benchmark's comparisons: the
     * small batch's combine in the usual blocks and the slot ranges' loop
     * that stores between its loads */
    static const int olds[] = {1024, 2048};
    for (size_t i = 0; i < sizeof olds / sizeof olds[0]; i++) {
        big.variant = olds[i];
        if (run_rank(local, &big) != 0) FAILF("one rank, H=7168 graph, variant %d failed", olds[i]);
    }
    big.variant = 0;
    /* more local slots than a block has threads: each thread's second slot
     * of the slot ranges (Kimi-K2.5's 416 on 256 threads), in the small
     * dispatch, the 512-thread one and the old loop */
    static const int many_variants[] = {0, 512, 2048};
    for (size_t i = 0; i < sizeof many_variants / sizeof many_variants[0]; i++) {
        shape many = {1, 40,     8, 600, 16,    EPX_DTYPE_BF16,   EPX_DTYPE_F32,
                      3, i == 1, 0, 0,   false, many_variants[i], false};
        if (run_rank(local, &many) != 0)
            FAILF("one rank, 600 local slots, variant %d failed (seed %llu)", many_variants[i],
                  (unsigned long long)g_seed);
    }
    big.normal = true;
    if (!transport_is("nccl") && !transport_is_host() && run_rank(local, &big) != 0)
        FAILF("one rank, H=7168 normal mode graph failed");
    big.variant = 8192; /* the receive's first meta after the scan, as before */
    if (!transport_is("nccl") && !transport_is_host() && run_rank(local, &big) != 0)
        FAILF("one rank, H=7168 normal mode graph, variant 8192 failed");
    big.variant = 0;
    epx_comm_destroy(local);
    return 0;
}

/* Batches across the epochs' wrap (2^32 - 1, then 2: consecutive launches
 * alternate parity, the areas' double buffer): exact results, and the
 * epochs each launch took. */
static int epoch_wrap_cases(void) {
    enum { H = 64, K = 2, P = 4, M = 8 };
    epx_error err = {0};
    epx_comm *local = NULL;
    EK(epx_comm_create_local(&local, &err));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    epx_ep_config cfg = ll_config(H, K, P, M, EPX_DTYPE_BF16, EPX_DTYPE_F32);
    epx_gpu_ep *ep = NULL;
    EK(make_engine(local, &cfg, st, NULL, &ep, &err));
    uint16_t hx[M * H];
    int32_t hs[M * K];
    float hw[M * K], hout[M * H];
    for (int i = 0; i < M * H; i++) hx[i] = epx_bf16_from_f32((float)(i % 89));
    for (int i = 0; i < M * K; i++) {
        hs[i] = (i / K + i % K) % P; /* two distinct slots a token */
        hw[i] = 0.5f;
    }
    void *dx;
    int32_t *ds;
    float *dw, *dout;
    CK(cudaMalloc(&dx, sizeof hx));
    CK(cudaMalloc((void **)&ds, sizeof hs));
    CK(cudaMalloc((void **)&dw, sizeof hw));
    CK(cudaMalloc((void **)&dout, sizeof hout));
    CK(cudaMemcpy(dx, hx, sizeof hx, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ds, hs, sizeof hs, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, hw, sizeof hw, cudaMemcpyHostToDevice));
    if (epxi_gpu_ep_set_epochs(ep, 0xfffffffeu) != 0) FAILF("could not set the epochs");
    static const uint32_t want[3] = {0xffffffffu, 2u, 3u};
    epx_ep_recv rv;
    for (int b = 0; b < 3; b++) {
        EK(epx_gpu_ep_dispatch(ep, M, dx, ds, dw, &rv, &err));
        EK(epx_gpu_ep_identity_experts(ep, &err));
        EK(epx_gpu_ep_combine(ep, dout, &err));
        EK(epx_gpu_ep_sync(ep, &err));
        uint32_t de = 0, ce = 0;
        if (epxi_gpu_ep_epochs(ep, &de, &ce) != 0) FAILF("could not read the epochs");
        if (de != want[b] || ce != want[b])
            FAILF("batch %d across the wrap: epochs %u / %u, expected %u", b, de, ce, want[b]);
        CK(cudaMemcpy(hout, dout, sizeof hout, cudaMemcpyDeviceToHost));
        for (int i = 0; i < M * H; i++)
            if (hout[i] != (float)(i % 89)) /* two halves of the row */
                FAILF("batch %d across the wrap: element %d = %g, expected %d", b, i,
                      (double)hout[i], i % 89);
    }
    epx_gpu_ep_destroy(ep);
    epx_comm_destroy(local);
    cudaFree(dx), cudaFree(ds), cudaFree(dw), cudaFree(dout);
    cudaStreamDestroy(st);
    return 0;
}

/* The token bound's refusals: out of range, a dispatch above it, between a
 * phase's halves, and a combine across a new bound (a fresh dispatch needed). */
static int bound_cases(void) {
    epx_error err = {0};
    epx_comm *local = NULL;
    EK(epx_comm_create_local(&local, &err));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    epx_ep_config cfg = ll_config(64, 2, 4, 8, EPX_DTYPE_BF16, EPX_DTYPE_BF16);
    epx_gpu_ep *ep = NULL;
    EK(make_engine(local, &cfg, st, NULL, &ep, &err));
    int32_t hs[16];
    float hw[16];
    for (int i = 0; i < 16; i++) {
        hs[i] = i % 2; /* slots 0 and 1: distinct within each token */
        hw[i] = 0.5f;
    }
    void *dx;
    int32_t *ds;
    float *dw, *dout;
    CK(cudaMalloc(&dx, 8 * 64 * 2));
    CK(cudaMemset(dx, 0, 8 * 64 * 2));
    CK(cudaMalloc((void **)&ds, sizeof hs));
    CK(cudaMalloc((void **)&dw, sizeof hw));
    CK(cudaMalloc((void **)&dout, 8 * 64 * 4));
    CK(cudaMemcpy(ds, hs, sizeof hs, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, hw, sizeof hw, cudaMemcpyHostToDevice));
    const int both = EPX_GPU_EP_SEND | EPX_GPU_EP_RECV;
    epx_ep_recv rv;
    if (epx_gpu_ep_set_token_bound(ep, 0, &err) != EPX_ERR_INVALID_ARG ||
        strstr(err.msg, "token bound 0 is outside [1, max_tokens 8]") == NULL)
        FAILF("token bound 0: '%s'", err.msg);
    if (epx_gpu_ep_set_token_bound(ep, 9, &err) != EPX_ERR_INVALID_ARG ||
        strstr(err.msg, "token bound 9 is outside") == NULL)
        FAILF("token bound 9 of max_tokens 8: '%s'", err.msg);
    if (transport_is("nccl")) { /* the ranks' bounds are compared: not inside a capture */
        cudaGraph_t gr = NULL;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        const epx_status cst = epx_gpu_ep_set_token_bound(ep, 3, &err);
        CK(cudaStreamEndCapture(st, &gr));
        if (gr) cudaGraphDestroy(gr);
        if (cst != EPX_ERR_INVALID_ARG || strstr(err.msg, "being captured") == NULL)
            FAILF("a token bound set inside a capture over nccl: '%s'", err.msg);
    }
    EK(epx_gpu_ep_set_token_bound(ep, 3, &err));
    if (epx_gpu_ep_dispatch_parts(ep, both, 4, dx, ds, dw, &rv, &err) != EPX_ERR_INVALID_ARG ||
        strstr(err.msg, "4 tokens is above the token bound 3") == NULL)
        FAILF("a dispatch above the bound: '%s'", err.msg);
    EK(epx_gpu_ep_dispatch_parts(ep, both, 3, dx, ds, dw, &rv, &err));
    EK(epx_gpu_ep_identity_experts(ep, &err));
    EK(epx_gpu_ep_combine(ep, dout, &err));
    EK(epx_gpu_ep_set_token_bound(ep, 2, &err));
    if (epx_gpu_ep_combine(ep, dout, &err) != EPX_ERR_INVALID_ARG ||
        strstr(err.msg, "token bound set") == NULL)
        FAILF("a combine across a new bound: '%s'", err.msg);
    EK(epx_gpu_ep_dispatch_parts(ep, EPX_GPU_EP_SEND, 2, dx, ds, dw, NULL, &err));
    if (epx_gpu_ep_set_token_bound(ep, 8, &err) != EPX_ERR_INVALID_ARG ||
        strstr(err.msg, "receive half") == NULL)
        FAILF("a bound between a dispatch's halves: '%s'", err.msg);
    EK(epx_gpu_ep_dispatch_parts(ep, EPX_GPU_EP_RECV, 2, dx, ds, dw, &rv, &err));
    EK(epx_gpu_ep_identity_experts(ep, &err));
    EK(epx_gpu_ep_combine(ep, dout, &err));
    EK(epx_gpu_ep_sync(ep, &err));
    epx_gpu_ep_destroy(ep);
    cudaFree(dx), cudaFree(ds), cudaFree(dw), cudaFree(dout);
    cudaStreamDestroy(st);
    epx_comm_destroy(local);
    return 0;
}

static int normal_refusals(epx_ep_config *cfg);

/* Normal mode's large batch (T * K > 4096: positions from the per-slot
 * table, the compact receive): a bad slot and a repeated one refused, a
 * good batch after them exact, and a silent rank timed out. */
static int normal_big_fault_cases(void) {
    enum { H = 64, K = 8, P = 16, T = 600 };
    epx_error err = {0};
    epx_comm *local = NULL;
    EK(epx_comm_create_local(&local, &err));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    epx_ep_config cfg = ll_config(H, K, P, T, EPX_DTYPE_BF16, EPX_DTYPE_F32);
    cfg.mode = EPX_EP_MODE_NORMAL;
    epx_gpu_ep_opts o = EPX_GPU_EP_OPTS_INIT;
    o.timeout_ms = 300;
    epx_gpu_ep *ep = NULL;
    EK(make_engine(local, &cfg, st, &o, &ep, &err));
    uint16_t *hx = malloc(sizeof(uint16_t) * T * H);
    float *hw = malloc(sizeof(float) * T * K), *hout = malloc(sizeof(float) * T * H);
    int32_t *hs = malloc(sizeof(int32_t) * T * K);
    if (!hx || !hw || !hout || !hs) FAILF("out of memory");
    for (int i = 0; i < T * H; i++) hx[i] = epx_bf16_from_f32((float)(i % 97));
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            hs[t * K + k] = (t + 3 * k) % P; /* distinct within a token (P = 16, K = 8) */
            hw[t * K + k] = 0.5f;
        }
    void *dx;
    float *dw, *dout;
    int32_t *ds;
    CK(cudaMalloc(&dx, sizeof(uint16_t) * T * H));
    CK(cudaMalloc((void **)&dw, sizeof(float) * T * K));
    CK(cudaMalloc((void **)&dout, sizeof(float) * T * H));
    CK(cudaMalloc((void **)&ds, sizeof(int32_t) * T * K));
    CK(cudaMemcpy(dx, hx, sizeof(uint16_t) * T * H, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, hw, sizeof(float) * T * K, cudaMemcpyHostToDevice));
    epx_ep_recv rv;
    const char *want[2] = {"outside [-1, 16)", "twice"};
    for (int c = 0; c < 3; c++) { /* a bad slot, a repeated one, then the good batch */
        int32_t keep = hs[417 * K + 5];
        if (c == 0) hs[417 * K + 5] = 99;
        if (c == 1) hs[417 * K + 5] = hs[417 * K + 2];
        CK(cudaMemcpy(ds, hs, sizeof(int32_t) * T * K, cudaMemcpyHostToDevice));
        hs[417 * K + 5] = keep;
        EK(epx_gpu_ep_dispatch(ep, T, dx, ds, dw, &rv, &err));
        EK(epx_gpu_ep_identity_experts(ep, &err));
        EK(epx_gpu_ep_combine(ep, dout, &err));
        epx_status rc = epx_gpu_ep_sync(ep, &err);
        CK(cudaMemcpy(hout, dout, sizeof(float) * T * H, cudaMemcpyDeviceToHost));
        for (int i = 0; i < T * H; i++) {
            const float expect = c < 2 ? 0.0f : 4.0f * (float)(i % 97); /* 8 halves */
            if (hout[i] != expect)
                FAILF("normal mode, %d tokens, case %d: element %d = %g, expected %g", T, c, i,
                      (double)hout[i], (double)expect);
        }
        if (c < 2 && (rc != EPX_ERR_INVALID_ARG || strstr(err.msg, want[c]) == NULL))
            FAILF("normal mode, %d tokens: expected a refusal with '%s', got '%s'", T, want[c],
                  err.msg);
        if (c == 2 && rc != EPX_OK) FAILF("normal mode, %d tokens: '%s'", T, err.msg);
    }
    epxi_gpu_ep_inject_silence(ep, 1);
    EK(epx_gpu_ep_dispatch(ep, T, dx, ds, dw, &rv, &err));
    EK(epx_gpu_ep_identity_experts(ep, &err));
    EK(epx_gpu_ep_combine(ep, dout, &err));
    if (epx_gpu_ep_sync(ep, &err) != EPX_ERR_TIMEOUT || strstr(err.msg, "300 ms") == NULL)
        FAILF("normal mode, a silent rank: expected EPX_ERR_TIMEOUT after 300 ms, got '%s'",
              err.msg);
    epx_gpu_ep_destroy(ep);
    epx_comm_destroy(local);
    cudaFree(dx), cudaFree(dw), cudaFree(dout), cudaFree(ds);
    free(hx), free(hw), free(hout), free(hs);
    cudaStreamDestroy(st);
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
    epx_ep_config cfg = ll_config(16, 2, 4, 4, EPX_DTYPE_F32, EPX_DTYPE_F32);
    epx_gpu_ep_opts o = EPX_GPU_EP_OPTS_INIT;
    o.timeout_ms = 300;
    epx_gpu_ep *ep = NULL;
    EK(make_engine(local, &cfg, st, &o, &ep, &err));
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
    /* A token naming one slot twice: refused the same way. */
    int32_t dup[8] = {0, 1, 2, 3, 1, 1, 2, 3};
    CK(cudaMemcpy(ds, dup, sizeof dup, cudaMemcpyHostToDevice));
    EK(epx_gpu_ep_dispatch(ep, 4, dx, ds, dw, &rv, &err));
    EK(epx_gpu_ep_identity_experts(ep, &err));
    EK(epx_gpu_ep_combine(ep, dout, &err));
    if (epx_gpu_ep_sync(ep, &err) != EPX_ERR_INVALID_ARG || strstr(err.msg, "twice") == NULL)
        FAILF("a repeated slot: expected EPX_ERR_INVALID_ARG saying so, got '%s'", err.msg);
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
    /* Two dispatches in a row (double-buffered): the combine serves the
     * second, here with weights 2 where the first had 1. */
    float hw2[8] = {2, 2, 2, 2, 2, 2, 2, 2};
    float *dw2;
    CK(cudaMalloc((void **)&dw2, sizeof hw2));
    CK(cudaMemcpy(dw2, hw2, sizeof hw2, cudaMemcpyHostToDevice));
    EK(epx_gpu_ep_dispatch(ep, 4, dx, ds, dw, &rv, &err));
    EK(epx_gpu_ep_dispatch(ep, 4, dx, ds, dw2, &rv, &err));
    EK(epx_gpu_ep_identity_experts(ep, &err));
    EK(epx_gpu_ep_combine(ep, dout, &err));
    EK(epx_gpu_ep_sync(ep, &err));
    CK(cudaMemcpy(hout, dout, sizeof hout, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 64; i++)
        if (hout[i] != 4.0f * hx[i])
            FAILF("dispatch, dispatch, combine: element %d = %g, expected %g", i, (double)hout[i],
                  4.0 * hx[i]);
    /* The same dispatch combined again (DeepEP's test does so): the same
     * result. */
    CK(cudaMemset(dout, 0, sizeof hout));
    EK(epx_gpu_ep_combine(ep, dout, &err));
    EK(epx_gpu_ep_sync(ep, &err));
    CK(cudaMemcpy(hout, dout, sizeof hout, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 64; i++)
        if (hout[i] != 4.0f * hx[i])
            FAILF("combined again: element %d = %g, expected %g", i, (double)hout[i], 4.0 * hx[i]);
    /* In halves (DeepEP's receive hook): nothing else between the halves. */
    EK(epx_gpu_ep_dispatch_parts(ep, EPX_GPU_EP_SEND, 4, dx, ds, dw, NULL, &err));
    if (epx_gpu_ep_dispatch(ep, 4, dx, ds, dw, &rv, &err) != EPX_ERR_INVALID_ARG ||
        strstr(err.msg, "receive half") == NULL)
        FAILF("a dispatch between the halves must be refused: '%s'", err.msg);
    EK(epx_gpu_ep_dispatch_parts(ep, EPX_GPU_EP_RECV, 0, NULL, NULL, NULL, &rv, &err));
    EK(epx_gpu_ep_identity_experts(ep, &err));
    EK(epx_gpu_ep_combine_parts(ep, EPX_GPU_EP_SEND, NULL, dw2, dout, EPX_DTYPE_F32, &err));
    if (epx_gpu_ep_dispatch(ep, 4, dx, ds, dw, &rv, &err) != EPX_ERR_INVALID_ARG)
        FAILF("a dispatch between a combine's halves must be refused");
    EK(epx_gpu_ep_combine_parts(ep, EPX_GPU_EP_RECV, NULL, NULL, NULL, EPX_DTYPE_F32, &err));
    EK(epx_gpu_ep_sync(ep, &err));
    CK(cudaMemcpy(hout, dout, sizeof hout, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 64; i++)
        if (hout[i] != 4.0f * hx[i])
            FAILF("in halves: element %d = %g, expected %g", i, (double)hout[i], 4.0 * hx[i]);
    cudaFree(dw2);
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
    if (!transport_is("nccl") && epx_comm_health(local, &e2) != EPX_ERR_TIMEOUT)
        FAILF("the bootstrap communicator must report the timeout");
    if (epx_gpu_ep_dispatch(ep, 4, dx, ds, dw, &rv, &err) != EPX_ERR_TIMEOUT)
        FAILF("a dispatch after a timeout must refuse");
    epx_gpu_ep_destroy(ep);
    /* Configs the engine refuses, with the fix in the message. */
    size_t bytes;
    if (normal_refusals(&cfg) != 0) return 1;
    cfg.combine = EPX_EP_COMBINE_RANK;
    if (epx_gpu_ep_buffer_bytes(&cfg, 1, &bytes, &err) != EPX_ERR_INVALID_ARG ||
        strstr(err.msg, "TOPK") == NULL)
        FAILF("rank-order combine must be refused: '%s'", err.msg);
    cudaFree(dx), cudaFree(dw), cudaFree(dout), cudaFree(ds);
    cudaStreamDestroy(st);
    epx_comm_destroy(local);
    return 0;
}

/* What normal mode refuses, each naming the fix: a bounded receive, per-rank
 * partials, shrink mode, fp8; the host and nccl transports (where the test
 * runs over them, the case itself is refused). cfg comes back unchanged. */
static int normal_refusals(epx_ep_config *cfg) {
    epx_error err = {0};
    const epx_ep_config keep = *cfg;
    size_t bytes;
    cfg->mode = EPX_EP_MODE_NORMAL;
    cfg->max_recv_entries = 8;
    if (epx_gpu_ep_buffer_bytes(cfg, 1, &bytes, &err) != EPX_ERR_INVALID_ARG ||
        strstr(err.msg, "max_recv_entries (8)") == NULL)
        FAILF("normal mode with a bounded receive must be refused: '%s'", err.msg);
    cfg->max_recv_entries = 0;
    cfg->combine = EPX_EP_COMBINE_RANK;
    if (epx_gpu_ep_buffer_bytes(cfg, 1, &bytes, &err) != EPX_ERR_INVALID_ARG ||
        strstr(err.msg, "EPX_EP_COMBINE_TOPK") == NULL)
        FAILF("normal mode with per-rank partials must be refused: '%s'", err.msg);
    cfg->combine = EPX_EP_COMBINE_TOPK;
    EK(epx_gpu_ep_buffer_bytes(cfg, 1, &bytes, &err));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    epx_comm *local = NULL;
    EK(epx_comm_create_local(&local, &err));
    epx_gpu_ep_opts o = EPX_GPU_EP_OPTS_INIT;
    o.shrink = 1;
    epx_gpu_ep *ep = NULL;
    if (!transport_is("nccl") &&
        (make_engine(local, cfg, st, &o, &ep, &err) == EPX_OK || strstr(err.msg, "shrink") == NULL))
        FAILF("normal mode in shrink mode must be refused: '%s'", err.msg);
    const epx_status made = make_engine(local, cfg, st, NULL, &ep, &err);
    if (transport_is("nccl") || transport_is_host()) {
        if (made == EPX_OK || strstr(err.msg, transport_is("nccl") ? "nccl" : "host") == NULL)
            FAILF("normal mode over this transport must be refused: '%s'", err.msg);
    } else {
        EK(made);
        void *dx;
        CK(cudaMalloc(&dx, 16 * (size_t)cfg->hidden * 4));
        epx_ep_recv rv;
        if (epx_gpu_ep_dispatch_parts(ep, EPX_GPU_EP_SEND | EPX_GPU_EP_RECV | EPX_GPU_EP_FP8, 0, dx,
                                      NULL, NULL, &rv, &err) != EPX_ERR_UNSUPPORTED ||
            strstr(err.msg, "normal mode") == NULL)
            FAILF("an fp8 dispatch in normal mode must be refused: '%s'", err.msg);
        cudaFree(dx);
        epx_gpu_ep_destroy(ep);
    }
    epx_comm_destroy(local);
    cudaStreamDestroy(st);
    *cfg = keep;
    return 0;
}

/* The three-step creation (open, info, connect) that bindings use: two
 * ranks in this process, a launch before connect refused, a rank whose
 * config differs refused at connect naming both, infos out of order
 * refused; then the pair works as one two-rank engine. */
static int connect_cases(void) {
    epx_error err = {0};
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    epx_ep_config cfg = ll_config(64, 2, 4, 4, EPX_DTYPE_BF16, EPX_DTYPE_BF16);
    /* Each rank's kernels wait for the other's flags: two streams. */
    cudaStream_t st1;
    CK(cudaStreamCreate(&st1));
    epx_gpu_ep *e0 = NULL, *e1 = NULL, *odd = NULL;
    EK(epx_gpu_ep_open(&cfg, 0, 2, st, NULL, &e0, &err));
    EK(epx_gpu_ep_open(&cfg, 1, 2, st1, NULL, &e1, &err));
    epx_ep_config other = cfg;
    other.hidden = 128;
    EK(epx_gpu_ep_open(&other, 1, 2, st, NULL, &odd, &err));
    unsigned char infos[2 * EPX_GPU_EP_INFO_BYTES], swapped[2 * EPX_GPU_EP_INFO_BYTES];
    EK(epx_gpu_ep_info(e0, infos, &err));
    EK(epx_gpu_ep_info(odd, infos + EPX_GPU_EP_INFO_BYTES, &err));
    epx_ep_recv rv;
    if (epx_gpu_ep_dispatch(e0, 0, NULL, NULL, NULL, &rv, &err) != EPX_ERR_INVALID_ARG ||
        strstr(err.msg, "before epx_gpu_ep_connect") == NULL)
        FAILF("a dispatch before connect must be refused: '%s'", err.msg);
    if (epx_gpu_ep_connect(e0, infos, &err) != EPX_ERR_INVALID_ARG ||
        strstr(err.msg, "hidden 64") == NULL || strstr(err.msg, "hidden 128") == NULL)
        FAILF("a rank with another config must be refused naming both: '%s'", err.msg);
    EK(epx_gpu_ep_info(e1, infos + EPX_GPU_EP_INFO_BYTES, &err));
    memcpy(swapped, infos + EPX_GPU_EP_INFO_BYTES, EPX_GPU_EP_INFO_BYTES);
    memcpy(swapped + EPX_GPU_EP_INFO_BYTES, infos, EPX_GPU_EP_INFO_BYTES);
    if (epx_gpu_ep_connect(e0, swapped, &err) != EPX_ERR_INVALID_ARG ||
        strstr(err.msg, "rank order") == NULL)
        FAILF("infos out of rank order must be refused: '%s'", err.msg);
    /* (into its own pointer: a refused open clears it, and odd still holds a
     * handle whose host-memory segment only its destroy removes) */
    epx_gpu_ep *refused = NULL;
    if (epx_gpu_ep_open(&cfg, 2, 2, st, NULL, &refused, &err) != EPX_ERR_INVALID_ARG ||
        refused != NULL)
        FAILF("rank 2 of 2 must be refused");
    { /* a launch form that does not exist is refused by name, the caller's kept */
        const char *was = getenv("EPX_GPU_EP_PDL");
        char keep[16] = "";
        if (was != NULL) snprintf(keep, sizeof keep, "%s", was);
        setenv("EPX_GPU_EP_PDL", "3", 1);
        const epx_status bad = epx_gpu_ep_open(&cfg, 0, 2, st, NULL, &refused, &err);
        if (was != NULL)
            setenv("EPX_GPU_EP_PDL", keep, 1);
        else
            unsetenv("EPX_GPU_EP_PDL");
        if (bad != EPX_ERR_INVALID_ARG || refused != NULL ||
            strstr(err.msg, "EPX_GPU_EP_PDL=3") == NULL)
            FAILF("EPX_GPU_EP_PDL=3 must be refused naming it: '%s'", err.msg);
    }
    /* A rank that opened with the other transport is refused, naming both. */
    const bool host = transport_is_host();
    epx_gpu_ep_opts mix_o = EPX_GPU_EP_OPTS_INIT;
    mix_o.transport = host ? EPX_GPU_EP_TRANSPORT_PEER : EPX_GPU_EP_TRANSPORT_HOST;
    epx_gpu_ep *mix = NULL;
    unsigned char mixed[2 * EPX_GPU_EP_INFO_BYTES];
    EK(epx_gpu_ep_open(&cfg, 1, 2, st, &mix_o, &mix, &err));
    memcpy(mixed, infos, EPX_GPU_EP_INFO_BYTES);
    EK(epx_gpu_ep_info(mix, mixed + EPX_GPU_EP_INFO_BYTES, &err));
    if (epx_gpu_ep_connect(e0, mixed, &err) != EPX_ERR_INVALID_ARG ||
        strstr(err.msg, "opened with the") == NULL || strstr(err.msg, "rank 1 with") == NULL)
        FAILF("ranks of different transports must be refused: '%s'", err.msg);
    epx_gpu_ep_destroy(mix);
    mix_o.transport = 9;
    if (epx_gpu_ep_open(&cfg, 1, 2, st, &mix_o, &refused, &err) != EPX_ERR_INVALID_ARG ||
        strstr(err.msg, "transport 9") == NULL)
        FAILF("transport 9 must be refused naming it: '%s'", err.msg);
    if (strcmp(epx_gpu_ep_transport_name(e0), "none") != 0)
        FAILF("before connect the transport is 'none', not '%s'", epx_gpu_ep_transport_name(e0));
    EK(epx_gpu_ep_connect(e0, infos, &err));
    EK(epx_gpu_ep_connect(e1, infos, &err));
    if (strcmp(epx_gpu_ep_transport_name(e0), host ? "host" : "pointers") != 0)
        FAILF("two ranks of one process use '%s'", epx_gpu_ep_transport_name(e0));
    /* Rank 1 sends nothing; rank 0 one token to slot 3 (rank 1's) and 0. */
    uint16_t hx[64];
    for (int i = 0; i < 64; i++) hx[i] = epx_bf16_from_f32((float)i);
    int32_t hs[2] = {3, 0};
    float hw[2] = {0.5f, 0.25f}, hout[64];
    void *dx;
    int32_t *ds;
    float *dw, *dout0, *dout1;
    CK(cudaMalloc(&dx, sizeof hx));
    CK(cudaMalloc((void **)&ds, sizeof hs));
    CK(cudaMalloc((void **)&dw, sizeof hw));
    CK(cudaMalloc((void **)&dout0, sizeof hout));
    CK(cudaMalloc((void **)&dout1, sizeof hout));
    CK(cudaMemcpy(dx, hx, sizeof hx, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ds, hs, sizeof hs, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, hw, sizeof hw, cudaMemcpyHostToDevice));
    epx_gpu_ep_destroy(odd);
    EK(epx_gpu_ep_dispatch(e0, 1, dx, ds, dw, &rv, &err));
    EK(epx_gpu_ep_dispatch(e1, 0, NULL, NULL, NULL, &rv, &err));
    EK(epx_gpu_ep_identity_experts(e0, &err));
    EK(epx_gpu_ep_identity_experts(e1, &err));
    EK(epx_gpu_ep_combine(e0, dout0, &err));
    EK(epx_gpu_ep_combine(e1, dout1, &err));
    EK(epx_gpu_ep_sync(e0, &err));
    EK(epx_gpu_ep_sync(e1, &err));
    CK(cudaMemcpy(hout, dout0, sizeof hout, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 64; i++)
        if (hout[i] != 0.75f * (float)i)
            FAILF("two ranks in one process: element %d = %g, expected %g", i, (double)hout[i],
                  0.75 * i);
    epx_gpu_ep_destroy(e0);
    epx_gpu_ep_destroy(e1);
    /* Shrink mode: a rank that never opened is an all-zero info, masked at
     * connect; rank 0 goes on alone (its token's share on rank 1 dropped).
     * Without shrink mode the zeros are refused. */
    epx_gpu_ep_opts so = EPX_GPU_EP_OPTS_INIT;
    so.shrink = 1;
    so.timeout_ms = 2000;
    epx_gpu_ep *alone = NULL, *strict = NULL;
    EK(epx_gpu_ep_open(&cfg, 0, 2, st, &so, &alone, &err));
    EK(epx_gpu_ep_open(&cfg, 0, 2, st, NULL, &strict, &err));
    unsigned char part[2 * EPX_GPU_EP_INFO_BYTES] = {0};
    EK(epx_gpu_ep_info(strict, part, &err));
    if (epx_gpu_ep_connect(strict, part, &err) != EPX_ERR_INVALID_ARG ||
        strstr(err.msg, "entry 1 of the infos") == NULL)
        FAILF("an all-zero info outside shrink mode must be refused: '%s'", err.msg);
    epx_gpu_ep_destroy(strict);
    EK(epx_gpu_ep_info(alone, part, &err));
    EK(epx_gpu_ep_connect(alone, part, &err));
    int32_t *dmask, hmask[2];
    CK(cudaMalloc((void **)&dmask, sizeof hmask));
    EK(epx_gpu_ep_dispatch(alone, 1, dx, ds, dw, &rv, &err));
    EK(epx_gpu_ep_identity_experts(alone, &err));
    EK(epx_gpu_ep_combine(alone, dout0, &err));
    EK(epx_gpu_ep_mask_query(alone, dmask, &err));
    EK(epx_gpu_ep_sync(alone, &err));
    CK(cudaMemcpy(hmask, dmask, sizeof hmask, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hout, dout0, sizeof hout, cudaMemcpyDeviceToHost));
    if (hmask[0] != 0 || hmask[1] != 1)
        FAILF("an absent rank 1: mask (%d, %d), expected (0, 1)", hmask[0], hmask[1]);
    for (int i = 0; i < 64; i++)
        if (hout[i] != 0.25f * (float)i)
            FAILF("rank 0 alone: element %d = %g, expected %g (slot 0's share only)", i,
                  (double)hout[i], 0.25 * i);
    epx_gpu_ep_destroy(alone);
    cudaFree(dmask);
    cudaFree(dx), cudaFree(ds), cudaFree(dw), cudaFree(dout0), cudaFree(dout1);
    cudaStreamDestroy(st);
    cudaStreamDestroy(st1);
    return 0;
}

/* ---- the staging protocol on several ranks, in this process ------------------ */

/* Every rank's outbox and inbox, for the test transport's copies. */
typedef struct stage_net {
    int32_t R;
    unsigned char *out[PC_MAX_RANKS], *in[PC_MAX_RANKS];
} stage_net;
typedef struct stage_ctx { /* one per rank; its engine frees it */
    stage_net *net;
    int32_t me;
} stage_ctx;

/* The test transport's phase: rank me's block for each peer p, from its
 * outbox into p's inbox under me, on me's stream (the caller orders the
 * peers' streams: every rank's send, then a device synchronisation, then
 * every receive). */
static epx_status stage_exchange(void *ctx, const epxi_ll_phase_blocks *b, void *stream,
                                 epx_error *err) {
    const stage_ctx *c = ctx;
    for (int32_t p = 0; p < b->R; p++)
        if (cudaMemcpyAsync(c->net->in[p] + b->off + (size_t)c->me * b->stride,
                            b->outbox + b->off + (size_t)p * b->stride, b->bytes,
                            cudaMemcpyDeviceToDevice, (cudaStream_t)stream) != cudaSuccess) {
            err->status = EPX_ERR_CUDA;
            snprintf(err->msg, sizeof err->msg, "test staging: a block's copy failed");
            return EPX_ERR_CUDA;
        }
    return EPX_OK;
}

/* Every rank of this process sets the same bound: nothing to compare. */
static epx_status stage_agree(void *ctx, int64_t value, const char *what, void *stream,
                              epx_error *err) {
    (void)ctx, (void)value, (void)what, (void)stream, (void)err;
    return EPX_OK;
}

/* Shape c (low latency) on c->R ranks over the test transport: each batch
 * every rank's dispatch send, then every receive, the identity experts,
 * every combine send, every receive; each rank's views and output checked
 * against the oracle as the processes' cases check them. */
static int staged_ranks(const shape *c) {
    epx_error err = {0};
    const int32_t R = c->R, spr = c->P / R, K = c->K;
    const size_t xs = epx_dtype_size(c->xd), M = (size_t)c->M;
    const size_t rows = (size_t)spr * (size_t)R * M, xrow = (size_t)c->H * xs;
    epx_ep_config cfg = ll_config(c->H, K, c->P, c->M, c->xd, c->yd);
    epx_gpu_ep_opts o = EPX_GPU_EP_OPTS_INIT;
    o.timeout_ms = 5000; /* the peers' blocks are in before any receive */
    stage_net net = {.R = R};
    epx_gpu_ep *ep[PC_MAX_RANKS] = {NULL};
    cudaStream_t st[PC_MAX_RANKS];
    void *dx[PC_MAX_RANKS];
    int32_t *ds[PC_MAX_RANKS];
    float *dw[PC_MAX_RANKS], *dout[PC_MAX_RANKS];
    epx_gpu_ep_views vw[PC_MAX_RANKS];
    for (int32_t r = 0; r < R; r++) {
        CK(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking));
        stage_ctx *ctx = malloc(sizeof *ctx);
        if (ctx == NULL) FAILF("staged ranks: no memory");
        *ctx = (stage_ctx){&net, r};
        const epxi_ll_staging ops = {stage_exchange, stage_agree, ctx};
        EK(epxi_gpu_ep_open_staging(&cfg, r, R, st[r], &o, &ops, &ep[r], &err));
        epxi_gpu_ep_staged_boxes(ep[r], &net.out[r], &net.in[r]);
        EK(epx_gpu_ep_get_views(ep[r], &vw[r], &err));
        CK(cudaMalloc(&dx[r], M * (size_t)c->H * xs));
        CK(cudaMalloc((void **)&ds[r], M * (size_t)K * 4));
        CK(cudaMalloc((void **)&dw[r], M * (size_t)K * 4));
        CK(cudaMalloc((void **)&dout[r], M * (size_t)c->H * 4));
    }
    got g = got_alloc(spr, R, rows, rows * xrow, xrow);
    void *out = malloc(M * (size_t)c->H * 4 + 4);
    batch all[PC_MAX_RANKS];
    epx_ep_recv rv[PC_MAX_RANKS];
    int rc = 0;
    for (int b = 0; b < c->batches && rc == 0; b++) {
        for (int32_t r = 0; r < R; r++) {
            make_batch(c, b, r, -1, &all[r]);
            const int64_t T = all[r].T;
            CK(cudaMemcpy(dx[r], all[r].x, (size_t)T * (size_t)c->H * xs, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(ds[r], all[r].s, (size_t)T * (size_t)K * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dw[r], all[r].w, (size_t)T * (size_t)K * 4, cudaMemcpyHostToDevice));
        }
        for (int32_t r = 0; r < R; r++)
            EK(epx_gpu_ep_dispatch_parts(ep[r], EPX_GPU_EP_SEND | c->fp8, all[r].T, dx[r], ds[r],
                                         dw[r], NULL, &err));
        CK(cudaDeviceSynchronize());
        for (int32_t r = 0; r < R; r++)
            EK(epx_gpu_ep_dispatch_parts(ep[r], EPX_GPU_EP_RECV, all[r].T, dx[r], ds[r], dw[r],
                                         &rv[r], &err));
        for (int32_t r = 0; r < R; r++) EK(epx_gpu_ep_identity_experts(ep[r], &err));
        CK(cudaDeviceSynchronize());
        for (int32_t r = 0; r < R; r++)
            EK(epx_gpu_ep_combine_parts(ep[r], EPX_GPU_EP_SEND, NULL, NULL, dout[r], EPX_DTYPE_F32,
                                        &err));
        CK(cudaDeviceSynchronize());
        for (int32_t r = 0; r < R; r++)
            EK(epx_gpu_ep_combine_parts(ep[r], EPX_GPU_EP_RECV, NULL, NULL, NULL, EPX_DTYPE_F32,
                                        &err));
        for (int32_t r = 0; r < R && rc == 0; r++) {
            EK(epx_gpu_ep_sync(ep[r], &err));
            if (fetch_views(&vw[r], &rv[r], spr, R, rows, rows * xrow, &g) != 0) return 1;
            CK(cudaMemcpy(out, dout[r], (size_t)all[r].T * (size_t)c->H * 4,
                          cudaMemcpyDeviceToHost));
            rc = check(c, r, all, &g, out, true, false, b, 0);
        }
        for (int32_t r = 0; r < R; r++) free_batch(&all[r]);
    }
    for (int32_t r = 0; r < R; r++) {
        epx_gpu_ep_destroy(ep[r]);
        cudaFree(dx[r]), cudaFree(ds[r]), cudaFree(dw[r]), cudaFree(dout[r]);
        cudaStreamDestroy(st[r]);
    }
    got_free(&g);
    free(out);
    return rc;
}

/* Random low-latency shapes on 2-4 ranks, one of them fp8, over the test
 * staging transport. */
static int staged_ranks_cases(void) {
    uint64_t s = g_seed * 31 + 7;
    for (int32_t R = 2; R <= 4; R++)
        for (int i = 0; i < 3; i++) {
            shape c;
            random_shape(&s, R, &c);
            c.batches = 4;
            if (i == 2) make_fp8(&c, R);
            if (staged_ranks(&c) != 0) {
                fprintf(stderr, "staged ranks: R %d, case %d (H %d, K %d, P %d, M %lld) failed\n",
                        R, i, c.H, c.K, c.P, (long long)c.M);
                return 1;
            }
        }
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
    /* Ranks as processes first: they must fork before this process uses CUDA.
     * (Not over NCCL, which takes one rank per GPU: its cases are one rank's.) */
    uint64_t s = g_seed * 17 + 3;
    for (int32_t R = 2; R <= 4 && !transport_is("nccl"); R++) {
        proc_job j;
        memset(&j, 0, sizeof j);
        j.ncases = transport_is_host() ? 5 : 7; /* normal mode: over CUDA IPC only */
        for (int i = 0; i < j.ncases; i++) {
            random_shape(&s, R, &j.c[i]);
            j.c[i].graph = i == 3 || i == 6;
            if (i == 1) make_fp8(&j.c[i], R); /* one fp8 case on every rank count */
            if (i == 2) j.c[i].bound = 1 + j.c[i].M / 2;
            if (i == 4) { /* past the staged ids: the per-slot table, runs across tokens */
                j.c[i].M = 640;
                j.c[i].K = 7;
                j.c[i].H = 24;
                j.c[i].batches = 2;
                j.c[i].ids64 = true;
            }
            j.c[i].normal = i >= 5 || (i == 4 && !transport_is_host());
        }
        int failed = pc_run(R, proc_rank, &j, 240);
        printf("%d ranks as processes over %s: %s\n", R,
               transport_is_host() ? "host memory" : "CUDA IPC", failed ? "FAILED" : "ok");
        if (failed) return 1;
    }
    if (!transport_is("nccl")) {
        int failed = pc_run(3, proc_open_fails, NULL, 120);
        printf("one rank of 3 fails to open: %s\n", failed ? "FAILED" : "ok (every rank told)");
        if (failed) return 1;
        failed = pc_run(3, proc_shrink, NULL, 120);
        printf("shrink mode, 3 processes, ranks 1 and 2 stop: %s\n",
               failed ? "FAILED" : "ok (masked, survivors exact)");
        if (failed) return 1;
    }
    if (single_rank_cases() != 0) return 1;
    printf("one rank: ok\n");
    if (bound_cases() != 0) return 1;
    printf("token bound refusals: ok\n");
    if (epoch_wrap_cases() != 0) return 1;
    printf("batches across the epochs' wrap: ok\n");
    if (fault_cases() != 0) return 1;
    printf("faults: ok\n");
    if (!transport_is("nccl") && !transport_is_host()) {
        if (normal_big_fault_cases() != 0) return 1;
        printf("normal mode's large batch, faults: ok\n");
    }
    if (transport_is("nccl")) {
        /* the engine over NCCL maps nothing: info and connect refuse */
        epx_error err = {0};
        epx_gpu_ep *ep = NULL;
        cudaStream_t st;
        CK(cudaStreamCreate(&st));
        epx_ep_config cfg = ll_config(64, 2, 4, 4, EPX_DTYPE_BF16, EPX_DTYPE_BF16);
        EK(make_engine(NULL, &cfg, st, NULL, &ep, &err));
        unsigned char info[EPX_GPU_EP_INFO_BYTES];
        if (epx_gpu_ep_info(ep, info, &err) != EPX_ERR_INVALID_ARG ||
            strstr(err.msg, "maps no peers") == NULL)
            FAILF("info of an nccl engine: '%s'", err.msg);
        if (epx_gpu_ep_launches(ep, "dispatch") != 2)
            FAILF("an nccl engine launches twice a phase");
        epx_gpu_ep_destroy(ep);
        cudaStreamDestroy(st);
        printf("nccl transport, info refused: ok\n");
        return 0;
    }
    if (connect_cases() != 0) return 1;
    printf("open, info, connect: ok\n");
    if (!transport_is_host()) {
        if (staged_ranks_cases() != 0) return 1;
        printf("staging transports' blocks on 2-4 ranks in this process: ok\n");
    }
    /* Every segment's name went once all ranks counted in, or at destroy. */
    if (system("ls /dev/shm 2>/dev/null | grep -q '^epx-ll-'") == 0) {
        printf("FAILED: shared memory left in /dev/shm (epx-ll-*)\n");
        return 1;
    }
    return 0;
}
