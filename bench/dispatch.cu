/*
 * dispatch.cu - bench_dispatch: the per-batch dispatch kernels on one GPU,
 * at the shape of Kimi-K2 on 8 GPUs (E = 384, P = 416, K = 8, H = 7168
 * bf16) for T in {1, 64, 512, 4096, 16384} tokens:
 *   map      epx_cuda_dispatch_map_ids, static / dynamic / weighted;
 *   layout   epx_cuda_dispatch_layout, map + count + layout in one launch;
 *   permute  epx_cuda_permute_rows into rank order and into slot order;
 *   combine  epx_cuda_combine_rows from slot order with weights;
 *   copy     cudaMemcpyAsync device to device, the bandwidth ceiling the
 *            issue names, and a 16-byte-vector copy kernel beside it.
 * The layout is also timed with only DeepEP's outputs (counts,
 * is_token_in_rank, offsets: no send orders) and with each cluster size.
 * Every result is compared with the CPU reference before it is timed.
 * Times: CUDA events around replays of a CUDA graph that holds REPS
 * launches of the op; the median over ROUNDS replays, divided by REPS.
 * Bandwidth counts the fewest bytes the op must move: each input row read
 * once and each output row written once (the ceiling counts read + write).
 * Output: one table on stdout and the same rows as CSV (--csv FILE).
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epx.h"
#include "epx_cuda.h"
#include "../src/cuda/dispatch_cuda.h"

#include "cuda_exit.h"

static const int E = 384, P = 416, G = 8, K = 8, H = 7168, ROUNDS = 31;
static epx_error er;
static uint64_t rs = 12345;
static uint64_t next64(void) {
    uint64_t z = (rs += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median microseconds per op: `op` enqueues one launch on `st`; a graph of
 * `reps` of them is replayed ROUNDS times. */
typedef void (*op_fn)(cudaStream_t st, void *ctx);
static double time_op(op_fn op, void *ctx, int reps, cudaStream_t st) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < reps; i++) op(st, ctx);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(ge, st)); /* warm up */
    float ms[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        CK(cudaEventRecord(a, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&ms[r], a, b));
    }
    qsort(ms, ROUNDS, sizeof ms[0], cmp_float);
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return ms[ROUNDS / 2] * 1000.0 / reps;
}

typedef struct ctx {
    epx_dispatch_spec spec;
    const int32_t *ids;
    int32_t T, *phys;
    epx_token_layout lay;
    const void *x;
    void *y, *z;
    const int32_t *pos;
    const float *w;
    size_t copy_bytes;
    void *src, *dst;
    int cluster, variant, ppw;
    epx_token_layout counts; /* lay without the send orders */
} ctx;

static void op_map(cudaStream_t st, void *v) {
    ctx *c = (ctx *)v;
    EK(epx_cuda_dispatch_map_ids(&c->spec, c->ids, c->T, K, c->phys, st, &er));
}
static void op_layout(cudaStream_t st, void *v) {
    ctx *c = (ctx *)v;
    EK(epx_cuda_dispatch_layout(&c->spec, c->ids, c->T, K, P, G, c->phys, &c->lay, st, &er));
}
static void op_layout_cluster(cudaStream_t st, void *v) {
    ctx *c = (ctx *)v;
    EK(epxi_cuda_dispatch_layout_cluster(&c->spec, c->ids, c->T, K, P, G, c->phys, &c->lay,
                                         c->cluster, st, &er));
}
static void op_layout_variant(cudaStream_t st, void *v) {
    ctx *c = (ctx *)v;
    EK(epxi_cuda_dispatch_layout_variant(&c->spec, c->ids, c->T, K, P, G, c->phys, &c->lay,
                                         c->variant, c->cluster, c->ppw, st, &er));
}
static void op_layout_variant_counts(cudaStream_t st, void *v) {
    ctx *c = (ctx *)v;
    EK(epxi_cuda_dispatch_layout_variant(&c->spec, c->ids, c->T, K, P, G, c->phys, &c->counts,
                                         c->variant, c->cluster, c->ppw, st, &er));
}
/* Launch-cost probes: an empty kernel, plain and as a cluster. */
__global__ void empty_kernel(int *p) {
    if (p && threadIdx.x == 1u << 30) *p = 0;
}
static void op_empty(cudaStream_t st, void *v) {
    ctx *c = (ctx *)v;
    if (c->cluster == 0) {
        empty_kernel<<<1, c->ppw, 0, st>>>(NULL);
    } else {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = (unsigned)c->cluster;
        attr[0].val.clusterDim.y = attr[0].val.clusterDim.z = 1;
        cfg.gridDim = dim3((unsigned)c->cluster);
        cfg.blockDim = dim3((unsigned)c->ppw);
        cfg.stream = st;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        CK(cudaLaunchKernelEx(&cfg, empty_kernel, (int *)NULL));
    }
    CK(cudaGetLastError());
}
static void op_layout_counts(cudaStream_t st, void *v) {
    ctx *c = (ctx *)v;
    EK(epx_cuda_dispatch_layout(&c->spec, c->ids, c->T, K, P, G, c->phys, &c->counts, st, &er));
}
/* The comparison copy: 16-byte vectors, four loads in flight per thread. */
__global__ void copy_kernel(const uint4 *__restrict__ s, uint4 *__restrict__ d, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x,
           i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = __ldg(s + i), b = __ldg(s + i + stride), c = __ldg(s + i + 2 * stride),
              e = __ldg(s + i + 3 * stride);
        d[i] = a;
        d[i + stride] = b;
        d[i + 2 * stride] = c;
        d[i + 3 * stride] = e;
    }
    for (; i < n; i += stride) d[i] = __ldg(s + i);
}
static void op_copy_kernel(cudaStream_t st, void *v) {
    ctx *c = (ctx *)v;
    copy_kernel<<<132 * 16, 256, 0, st>>>((const uint4 *)c->src, (uint4 *)c->dst,
                                          c->copy_bytes / 16);
    CK(cudaGetLastError());
}
static void op_permute(cudaStream_t st, void *v) {
    ctx *c = (ctx *)v;
    EK(epx_cuda_permute_rows(c->x, EPX_ROW_BF16, c->T, H, c->pos, K, c->y, st, &er));
}
static void op_combine(cudaStream_t st, void *v) {
    ctx *c = (ctx *)v;
    EK(epx_cuda_combine_rows(c->y, EPX_ROW_BF16, H, c->pos, c->w, c->T, K, c->z, st, &er));
}
static void op_copy(cudaStream_t st, void *v) {
    ctx *c = (ctx *)v;
    CK(cudaMemcpyAsync(c->dst, c->src, c->copy_bytes, cudaMemcpyDeviceToDevice, st));
}

static void *dalloc(size_t n) {
    void *p;
    CK(cudaMalloc(&p, n ? n : 1));
    return p;
}
static void *dcopy(const void *h, size_t n) {
    void *p = dalloc(n);
    CK(cudaMemcpy(p, h, n, cudaMemcpyHostToDevice));
    return p;
}
static void check_equal(const void *dev, const void *host, size_t n, const char *what, int T) {
    void *h = malloc(n ? n : 1);
    CK(cudaMemcpy(h, dev, n, cudaMemcpyDeviceToHost));
    if (memcmp(h, host, n) != 0) {
        fprintf(stderr, "bench_dispatch: %s at T = %d differs from the CPU reference\n", what, T);
        exit(1);
    }
    free(h);
}

int main(int argc, char **argv) {
    const char *csv_path = argc > 2 && strcmp(argv[1], "--csv") == 0 ? argv[2] : NULL;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("skip: no CUDA device\n");
        return 77;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
    if (csv) fprintf(csv, "op,T,us,GBps,pct_of_copy,rows\n");

    /* the ceiling: a 2 GiB device-to-device copy, read + write counted */
    ctx cc;
    memset(&cc, 0, sizeof cc);
    cc.copy_bytes = (size_t)2 << 30;
    cc.src = dalloc(cc.copy_bytes);
    cc.dst = dalloc(cc.copy_bytes);
    CK(cudaMemset(cc.src, 1, cc.copy_bytes));
    double copy_us = time_op(op_copy, &cc, 2, st);
    double copy_bw = 2.0 * (double)cc.copy_bytes / (copy_us * 1e-6) / 1e9;
    double kcopy_us = time_op(op_copy_kernel, &cc, 2, st);
    double kcopy_bw = 2.0 * (double)cc.copy_bytes / (kcopy_us * 1e-6) / 1e9;
    CK(cudaFree(cc.src));
    CK(cudaFree(cc.dst));
    printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
           prop.l2CacheSize >> 20);
    printf("copy ceiling: cudaMemcpyAsync D2D 2 GiB: %.1f us, %.0f GB/s (read + write)\n", copy_us,
           copy_bw);
    printf("copy kernel (16-byte vectors, 2 GiB): %.1f us, %.0f GB/s (read + write)\n", kcopy_us,
           kcopy_bw);
    if (csv) fprintf(csv, "copy_d2d_2GiB,0,%.3f,%.1f,100.0,0\n", copy_us, copy_bw);
    if (csv)
        fprintf(csv, "copy_kernel_2GiB,0,%.3f,%.1f,%.1f,0\n", kcopy_us, kcopy_bw,
                100.0 * kcopy_bw / copy_bw);

    /* launch-cost probes */
    {
        ctx pc;
        memset(&pc, 0, sizeof pc);
        int cls[] = {0, 1, 8, 0}, thr[] = {256, 256, 256, 1024};
        for (int i = 0; i < 4; i++) {
            pc.cluster = cls[i];
            pc.ppw = thr[i];
            double us = time_op(op_empty, &pc, 20, st);
            printf("empty kernel %s %d x %d threads: %.2f us per launch\n",
                   cls[i] ? "cluster" : "plain", cls[i] ? cls[i] : 1, thr[i], us);
            if (csv)
                fprintf(csv, "empty %s%d t%d,0,%.3f,,,\n", cls[i] ? "cluster" : "plain", cls[i],
                        thr[i], us);
        }
    }

    /* a skewed placement: 32 redundant slots on the hottest experts */
    int32_t map[P];
    for (int p = 0; p < P; p++) map[p] = p < E ? p : (p - E) % 32;
    for (int p = P - 1; p > 0; p--) {
        int q = (int)(next64() % (uint64_t)(p + 1)), t = map[p];
        map[p] = map[q];
        map[q] = t;
    }
    epx_shape shape = {1, E, P, G, 1};
    epx_layout *lay = NULL;
    EK(epx_layout_create_from_map(&shape, map, &lay, &er));
    int32_t W = 0;
    const int32_t *rep = epx_layout_logical_to_all_physical(lay, &W);
    const int32_t *nv = epx_layout_num_valid(lay);
    int32_t *table = (int32_t *)malloc(sizeof(int32_t) * G * E);
    EK(epx_dispatch_table_from_layout(lay, NULL, table, &er));
    double wts[P];
    for (int p = 0; p < P; p++) wts[p] = 1.0 + (double)(next64() % 4);
    uint32_t *thr = (uint32_t *)malloc(sizeof(uint32_t) * E * W);
    EK(epx_dispatch_thresholds(rep, nv, 1, E, W, wts, P, thr, &er));
    epx_dispatch_spec hspec = {EPX_DISPATCH_STATIC, E, P, W, table, rep, nv, thr, 7, 0, 3};
    epx_dispatch_spec dspec = hspec;
    dspec.table = (const int32_t *)dcopy(table, sizeof(int32_t) * E);
    dspec.replicas = (const int32_t *)dcopy(rep, sizeof(int32_t) * E * W);
    dspec.num_valid = (const int32_t *)dcopy(nv, sizeof(int32_t) * E);
    dspec.thresholds = (const uint32_t *)dcopy(thr, sizeof(uint32_t) * E * W);

    printf("\n%-22s %6s %10s %9s %8s %8s %8s\n", "op", "T", "us", "GB/s", "%memcpy", "%kcopy",
           "rows");
    static const int Ts[] = {1, 64, 512, 4096, 16384};
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        int T = Ts[ti];
        size_t TK = (size_t)T * K;
        int32_t *ids = (int32_t *)malloc(4 * TK);
        for (size_t t = 0; t < (size_t)T; t++) /* K distinct experts per token, Zipf-ish */
            for (int k = 0; k < K; k++) {
                int32_t e;
                int dup;
                do {
                    uint64_t u = next64();
                    e = (int32_t)((u % 3 == 0) ? (u >> 8) % 48 : (u >> 8) % E);
                    dup = 0;
                    for (int j = 0; j < k; j++) dup |= ids[t * K + j] == e;
                } while (dup);
                ids[t * K + k] = e;
            }
        ctx c;
        memset(&c, 0, sizeof c);
        c.T = T;
        c.ids = (const int32_t *)dcopy(ids, 4 * TK);
        c.phys = (int32_t *)dalloc(4 * TK);
        c.lay.tokens_per_rank = (int64_t *)dalloc(8 * G);
        c.lay.tokens_per_slot = (int64_t *)dalloc(8 * P);
        c.lay.is_token_in_rank = (uint8_t *)dalloc((size_t)T * G);
        c.lay.rank_offsets = (int32_t *)dalloc(4 * (G + 1));
        c.lay.rank_perm = (int32_t *)dalloc(4 * TK);
        c.lay.pair_rank_pos = (int32_t *)dalloc(4 * TK);
        c.lay.slot_offsets = (int32_t *)dalloc(4 * (P + 1));
        c.lay.slot_perm = (int32_t *)dalloc(4 * TK);
        c.lay.pair_slot_pos = (int32_t *)dalloc(4 * TK);
        c.counts = c.lay;
        c.counts.rank_perm = c.counts.pair_rank_pos = c.counts.slot_perm = c.counts.pair_slot_pos =
            NULL;

        /* CPU reference of the dynamic layout, checked before timing */
        int32_t *hphys = (int32_t *)malloc(4 * TK);
        epx_token_layout h = {(int64_t *)malloc(8 * G),         (int64_t *)malloc(8 * P),
                              (uint8_t *)malloc((size_t)T * G), (int32_t *)malloc(4 * (G + 1)),
                              (int32_t *)malloc(4 * TK),        (int32_t *)malloc(4 * TK),
                              (int32_t *)malloc(4 * (P + 1)),   (int32_t *)malloc(4 * TK),
                              (int32_t *)malloc(4 * TK)};
        for (int m = EPX_DISPATCH_STATIC; m <= EPX_DISPATCH_WEIGHTED; m++) {
            hspec.mode = dspec.mode = (epx_dispatch_mode)m;
            c.spec = dspec;
            EK(epx_dispatch_map_ids(&hspec, ids, T, K, hphys, &er));
            EK(epx_token_layout_compute(hphys, T, K, P, G, &h, &er));
            op_layout(st, &c);
            CK(cudaStreamSynchronize(st));
            check_equal(c.phys, hphys, 4 * TK, "phys", T);
            check_equal(c.lay.pair_slot_pos, h.pair_slot_pos, 4 * TK, "pair_slot_pos", T);
            check_equal(c.lay.pair_rank_pos, h.pair_rank_pos, 4 * TK, "pair_rank_pos", T);
            check_equal(c.lay.slot_perm, h.slot_perm, 4 * (size_t)h.slot_offsets[P], "slot_perm",
                        T);
            check_equal(c.lay.rank_perm, h.rank_perm, 4 * (size_t)h.rank_offsets[G], "rank_perm",
                        T);
            check_equal(c.lay.tokens_per_slot, h.tokens_per_slot, 8 * P, "tokens_per_slot", T);
            check_equal(c.lay.is_token_in_rank, h.is_token_in_rank, (size_t)T * G,
                        "is_token_in_rank", T);
            static const char *mname[] = {"", "static", "dynamic", "weighted"};
            char name[64];
            double us = time_op(op_map, &c, 20, st);
            snprintf(name, sizeof name, "map %s", mname[m]);
            printf("%-22s %6d %10.2f %9s %8s %8s\n", name, T, us, "-", "-", "-");
            if (csv) fprintf(csv, "%s,%d,%.3f,,,\n", name, T, us);
            us = time_op(op_layout, &c, 20, st);
            snprintf(name, sizeof name, "map+layout %s", mname[m]);
            printf("%-22s %6d %10.2f %9s %8s %8s\n", name, T, us, "-", "-", "-");
            if (csv) fprintf(csv, "%s,%d,%.3f,,,\n", name, T, us);
        }
        /* the static layout with DeepEP's outputs only, and per cluster size */
        hspec.mode = dspec.mode = EPX_DISPATCH_STATIC;
        c.spec = dspec;
        double us = time_op(op_layout_counts, &c, 20, st);
        printf("%-22s %6d %10.2f %9s %8s %8s\n", "map+counts static", T, us, "-", "-", "-");
        if (csv) fprintf(csv, "map+counts static,%d,%.3f,,,\n", T, us);
        for (int cl = 1; cl <= 8; cl *= 2) {
            if ((size_t)((T + cl - 1) / cl) * K > 65535 || (T < 512 && cl > 1)) continue;
            c.cluster = cl;
            us = time_op(op_layout_cluster, &c, 20, st);
            char name[64];
            snprintf(name, sizeof name, "map+layout static cl%d", cl);
            printf("%-22s %6d %10.2f %9s %8s %8s\n", name, T, us, "-", "-", "-");
            if (csv) fprintf(csv, "%s,%d,%.3f,,,\n", name, T, us);
        }
        /* layout kernel variants side by side (static, every output unless
         * noted), each checked against the CPU before it is timed */
        if (T <= 4096) {
            EK(epx_dispatch_map_ids(&hspec, ids, T, K, hphys, &er));
            EK(epx_token_layout_compute(hphys, T, K, P, G, &h, &er));
            struct {
                const char *name;
                int variant, cluster, ppw, counts;
            } vs[] = {
                {"old cluster kernel", EPXI_LAYOUT_CLUSTER, 0, 0, 0},
                {"match cl1", EPXI_LAYOUT_MATCH, 1, 0, 0},
                {"match cl2", EPXI_LAYOUT_MATCH, 2, 0, 0},
                {"match cl4", EPXI_LAYOUT_MATCH, 4, 0, 0},
                {"match cl8", EPXI_LAYOUT_MATCH, 8, 0, 0},
                {"ballot cl1", EPXI_LAYOUT_BALLOT, 1, 0, 0},
                {"ballot cl2", EPXI_LAYOUT_BALLOT, 2, 0, 0},
                {"ballot cl4", EPXI_LAYOUT_BALLOT, 4, 0, 0},
                {"ballot cl8", EPXI_LAYOUT_BALLOT, 8, 0, 0},
                {"ballot def ppw32", EPXI_LAYOUT_BALLOT, 0, 32, 0},
                {"ballot def ppw128", EPXI_LAYOUT_BALLOT, 0, 128, 0},
                {"ballot def ppw256", EPXI_LAYOUT_BALLOT, 0, 256, 0},
                {"auto (default)", EPXI_LAYOUT_AUTO, 0, 0, 0},
                {"auto counts only", EPXI_LAYOUT_AUTO, 0, 0, 1},
            };
            for (size_t v = 0; v < sizeof vs / sizeof vs[0]; v++) {
                c.variant = vs[v].variant;
                c.cluster = vs[v].cluster;
                c.ppw = vs[v].ppw;
                CK(cudaMemset(c.lay.pair_slot_pos, 0xab, 4 * TK));
                CK(cudaMemset(c.lay.pair_rank_pos, 0xab, 4 * TK));
                CK(cudaMemset(c.lay.tokens_per_slot, 0xab, 8 * P));
                op_fn fn = vs[v].counts ? op_layout_variant_counts : op_layout_variant;
                fn(st, &c);
                CK(cudaStreamSynchronize(st));
                check_equal(c.phys, hphys, 4 * TK, vs[v].name, T);
                check_equal(c.lay.tokens_per_slot, h.tokens_per_slot, 8 * P, vs[v].name, T);
                check_equal(c.lay.tokens_per_rank, h.tokens_per_rank, 8 * G, vs[v].name, T);
                check_equal(c.lay.slot_offsets, h.slot_offsets, 4 * (P + 1), vs[v].name, T);
                check_equal(c.lay.rank_offsets, h.rank_offsets, 4 * (G + 1), vs[v].name, T);
                check_equal(c.lay.is_token_in_rank, h.is_token_in_rank, (size_t)T * G, vs[v].name,
                            T);
                if (!vs[v].counts) {
                    check_equal(c.lay.pair_slot_pos, h.pair_slot_pos, 4 * TK, vs[v].name, T);
                    check_equal(c.lay.pair_rank_pos, h.pair_rank_pos, 4 * TK, vs[v].name, T);
                    check_equal(c.lay.slot_perm, h.slot_perm, 4 * (size_t)h.slot_offsets[P],
                                vs[v].name, T);
                    check_equal(c.lay.rank_perm, h.rank_perm, 4 * (size_t)h.rank_offsets[G],
                                vs[v].name, T);
                }
                double a1 = time_op(fn, &c, 20, st), a2 = time_op(fn, &c, 20, st);
                char name[64];
                snprintf(name, sizeof name, "V %s", vs[v].name);
                printf("%-22s %6d %10.2f %9.2f (second timing)\n", name, T, a1, a2);
                if (csv) fprintf(csv, "%s,%d,%.3f,,,\n", name, T, a1);
            }
            c.cluster = 0;
        }
        /* restore the weighted layout the rows use */
        hspec.mode = dspec.mode = EPX_DISPATCH_WEIGHTED;
        c.spec = dspec;
        op_layout(st, &c);
        CK(cudaStreamSynchronize(st));
        /* The variant table left the static reference in h: recompute it. */
        EK(epx_dispatch_map_ids(&hspec, ids, T, K, hphys, &er));
        EK(epx_token_layout_compute(hphys, T, K, P, G, &h, &er));
        check_equal(c.lay.pair_slot_pos, h.pair_slot_pos, 4 * TK, "pair_slot_pos (weighted, again)",
                    T);
        /* rows, from the weighted layout above (host copy h) */
        int32_t rows_s = h.slot_offsets[P], rows_r = h.rank_offsets[G];
        size_t rowb = (size_t)H * 2;
        uint16_t *hx = (uint16_t *)malloc((size_t)T * rowb);
        for (size_t i = 0; i < (size_t)T * H; i++)
            hx[i] = (uint16_t)(0x3c00u + (next64() & 0x3ffu)) ^ (uint16_t)(next64() & 0x8000u);
        float *hw = (float *)malloc(4 * TK);
        for (size_t i = 0; i < TK; i++) hw[i] = (float)(next64() % 1000) / 1000.0f;
        c.x = dcopy(hx, (size_t)T * rowb);
        c.y = dalloc((size_t)rows_s * rowb);
        c.z = dalloc((size_t)T * rowb);
        c.w = (const float *)dcopy(hw, 4 * TK);
        /* check: permute + combine equal the CPU's */
        uint16_t *hy = (uint16_t *)malloc((size_t)rows_s * rowb + 2),
                 *hz = (uint16_t *)malloc((size_t)T * rowb);
        EK(epx_permute_rows(hx, EPX_ROW_BF16, T, H, h.pair_slot_pos, K, rows_s, hy, &er));
        EK(epx_combine_rows(hy, EPX_ROW_BF16, rows_s, H, h.pair_slot_pos, hw, T, K, hz, &er));
        c.pos = c.lay.pair_slot_pos;
        op_permute(st, &c);
        op_combine(st, &c);
        CK(cudaStreamSynchronize(st));
        check_equal(c.y, hy, (size_t)rows_s * rowb, "permuted rows", T);
        check_equal(c.z, hz, (size_t)T * rowb, "combined rows", T);
        int reps = T >= 4096 ? 5 : 20;
        struct {
            const char *name;
            op_fn fn;
            const int32_t *pos;
            int32_t rows;
        } ops[] = {
            {"permute rank-order", op_permute, c.lay.pair_rank_pos, rows_r},
            {"permute slot-order", op_permute, c.lay.pair_slot_pos, rows_s},
            {"combine slot-order", op_combine, c.lay.pair_slot_pos, rows_s},
        };
        for (int o = 0; o < 3; o++) {
            c.pos = ops[o].pos;
            us = time_op(ops[o].fn, &c, reps, st);
            double bytes = ((double)T + ops[o].rows) * (double)rowb;
            double bw = bytes / (us * 1e-6) / 1e9;
            printf("%-22s %6d %10.2f %9.0f %7.1f%% %7.1f%% %8d\n", ops[o].name, T, us, bw,
                   100.0 * bw / copy_bw, 100.0 * bw / kcopy_bw, ops[o].rows);
            if (csv)
                fprintf(csv, "%s,%d,%.3f,%.1f,%.1f,%d\n", ops[o].name, T, us, bw,
                        100.0 * bw / copy_bw, ops[o].rows);
        }
        CK(cudaFree((void *)c.x));
        CK(cudaFree(c.y));
        CK(cudaFree(c.z));
        CK(cudaFree((void *)c.w));
        CK(cudaFree((void *)c.ids));
        CK(cudaFree(c.phys));
        void *lp[] = {c.lay.tokens_per_rank, c.lay.tokens_per_slot, c.lay.is_token_in_rank,
                      c.lay.rank_offsets,    c.lay.rank_perm,       c.lay.pair_rank_pos,
                      c.lay.slot_offsets,    c.lay.slot_perm,       c.lay.pair_slot_pos};
        void *hp[] = {h.tokens_per_rank, h.tokens_per_slot, h.is_token_in_rank,
                      h.rank_offsets,    h.rank_perm,       h.pair_rank_pos,
                      h.slot_offsets,    h.slot_perm,       h.pair_slot_pos};
        for (int i = 0; i < 9; i++) {
            CK(cudaFree(lp[i]));
            free(hp[i]);
        }
        free(hx);
        free(hy);
        free(hz);
        free(hw);
        free(hphys);
        free(ids);
    }
    printf("\nall results checked against the CPU reference before timing\n");
    if (csv) fclose(csv);
    epx_layout_destroy(lay);
    free(table);
    free(thr);
    CK(cudaStreamDestroy(st));
    return 0;
}
