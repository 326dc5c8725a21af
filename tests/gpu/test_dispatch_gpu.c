/*
 * test_dispatch_gpu.c - the CUDA dispatch kernels against their CPU
 * references on random inputs of many shapes: T = 0, 1, odd sizes, up to
 * 16384 tokens; K = 1 .. 32 (both kernel variants); one GPU, many GPUs and
 * more than 64; experts with one replica; ids of -1; static, dynamic,
 * weighted and physical mapping. Integer outputs must be equal, the
 * combine bitwise equal; outputs are poisoned first so an unwritten entry
 * cannot pass. The layout kernel runs with every cluster size (1, 2, 4 and
 * 8 blocks, and the default); some cases run from a captured CUDA graph.
 *
 * A plain program rather than cmocka: it runs on GPU machines that may
 * lack the test framework. Exits 77 (a CTest skip) with a message when no
 * GPU is present, as in CI; 1 on the first mismatch, naming it.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epx.h"
#include "epx_cuda.h"
#include "../../src/cuda/dispatch_cuda.h"

/* EK below: these calls take no `epx_error er` of the caller's */
#define EPX_CUDA_EXIT_OWN_EK
#include "cuda_exit.h"

static int failures;

#define EK(call)                                                                                   \
    do {                                                                                           \
        epx_error er_ = {0};                                                                       \
        epx_status s_ = (call);                                                                    \
        (void)er_;                                                                                 \
        if (s_ != EPX_OK) {                                                                        \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, epx_status_str(s_));     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static uint64_t rng_state;
static uint64_t next64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static int32_t below(int32_t n) { return (int32_t)(next64() % (uint64_t)n); }

static void *dalloc(size_t bytes) {
    void *p = NULL;
    CK(cudaMalloc(&p, bytes ? bytes : 1));
    CK(cudaMemset(p, 0xab, bytes ? bytes : 1)); /* poison */
    return p;
}
static void *dcopy(const void *h, size_t bytes) {
    void *p = dalloc(bytes);
    if (bytes) CK(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice));
    return p;
}
static void *hback(const void *d, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    if (bytes) CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    return h;
}

static int same(const char *what, const char *ctx, const void *a, const void *b, size_t bytes,
                size_t elem) {
    if (memcmp(a, b, bytes) == 0) return 1;
    size_t i = 0;
    while (i < bytes && ((const unsigned char *)a)[i] == ((const unsigned char *)b)[i]) i++;
    fprintf(stderr, "MISMATCH %s (%s): first difference at element %zu\n", what, ctx, i / elem);
    failures++;
    return 0;
}

/* The device copies of a layout's arrays, and what they hold. */
typedef struct dev_layout {
    epx_token_layout d; /* device pointers */
    size_t T, K, P, G;
} dev_layout;

static dev_layout dev_layout_alloc(size_t T, size_t K, size_t P, size_t G) {
    dev_layout l = {{0}, T, K, P, G};
    l.d.tokens_per_rank = dalloc(8 * G);
    l.d.tokens_per_slot = dalloc(8 * P);
    l.d.is_token_in_rank = dalloc(T * G);
    l.d.rank_offsets = dalloc(4 * (G + 1));
    l.d.rank_perm = dalloc(4 * T * K);
    l.d.pair_rank_pos = dalloc(4 * T * K);
    l.d.slot_offsets = dalloc(4 * (P + 1));
    l.d.slot_perm = dalloc(4 * T * K);
    l.d.pair_slot_pos = dalloc(4 * T * K);
    return l;
}

static void dev_layout_free(dev_layout *l) {
    cudaFree(l->d.tokens_per_rank);
    cudaFree(l->d.tokens_per_slot);
    cudaFree(l->d.is_token_in_rank);
    cudaFree(l->d.rank_offsets);
    cudaFree(l->d.rank_perm);
    cudaFree(l->d.pair_rank_pos);
    cudaFree(l->d.slot_offsets);
    cudaFree(l->d.slot_perm);
    cudaFree(l->d.pair_slot_pos);
}

/* Compare the device layout with the CPU's, field by field. */
static void compare_layout(const dev_layout *dl, const epx_token_layout *h, const char *ctx,
                           int counts_only) {
    size_t T = dl->T, K = dl->K, P = dl->P, G = dl->G;
    void *x;
    x = hback(dl->d.tokens_per_rank, 8 * G);
    same("tokens_per_rank", ctx, x, h->tokens_per_rank, 8 * G, 8);
    free(x);
    x = hback(dl->d.tokens_per_slot, 8 * P);
    same("tokens_per_slot", ctx, x, h->tokens_per_slot, 8 * P, 8);
    free(x);
    x = hback(dl->d.is_token_in_rank, T * G);
    same("is_token_in_rank", ctx, x, h->is_token_in_rank, T * G, 1);
    free(x);
    x = hback(dl->d.rank_offsets, 4 * (G + 1));
    same("rank_offsets", ctx, x, h->rank_offsets, 4 * (G + 1), 4);
    free(x);
    x = hback(dl->d.slot_offsets, 4 * (P + 1));
    same("slot_offsets", ctx, x, h->slot_offsets, 4 * (P + 1), 4);
    free(x);
    if (counts_only) return;
    size_t nr = (size_t)h->rank_offsets[G], ns = (size_t)h->slot_offsets[P];
    x = hback(dl->d.rank_perm, 4 * nr);
    same("rank_perm", ctx, x, h->rank_perm, 4 * nr, 4);
    free(x);
    x = hback(dl->d.slot_perm, 4 * ns);
    same("slot_perm", ctx, x, h->slot_perm, 4 * ns, 4);
    free(x);
    x = hback(dl->d.pair_rank_pos, 4 * T * K);
    same("pair_rank_pos", ctx, x, h->pair_rank_pos, 4 * T * K, 4);
    free(x);
    x = hback(dl->d.pair_slot_pos, 4 * T * K);
    same("pair_slot_pos", ctx, x, h->pair_slot_pos, 4 * T * K, 4);
    free(x);
}

/* A random placement of E experts over P slots (every expert at least
 * once, hot experts replicated) and its derived maps. */
static epx_layout *make_layout(int32_t E, int32_t P, int32_t G) {
    int32_t *map = malloc(sizeof(int32_t) * (size_t)P);
    for (int32_t p = 0; p < P; p++) map[p] = p < E ? p : below(E < 6 ? E : 6);
    for (int32_t p = P - 1; p > 0; p--) {
        int32_t q = below(p + 1), t = map[p];
        map[p] = map[q];
        map[q] = t;
    }
    epx_shape s = {1, E, P, G, 1};
    epx_layout *lay = NULL;
    EK(epx_layout_create_from_map(&s, map, &lay, &er_));
    free(map);
    return lay;
}

static void one_case(int32_t T, int32_t K, int32_t E, int32_t P, int32_t G, epx_dispatch_mode mode,
                     int graph) {
    static const int clusters[] = {0, 1, 2, 4, 8};
    int cl = clusters[below(5)], counts_only = below(5) == 0;
    char ctx[160];
    snprintf(ctx, sizeof ctx, "T=%d K=%d E=%d P=%d G=%d mode=%d cluster=%d%s%s", T, K, E, P, G,
             (int)mode, cl, graph ? " graph" : "", counts_only ? " counts-only" : "");
    if (mode == EPX_DISPATCH_PHYSICAL) E = P;
    epx_layout *lay = make_layout(mode == EPX_DISPATCH_PHYSICAL ? P : E, P, G);
    int32_t W = 0;
    const int32_t *rep = epx_layout_logical_to_all_physical(lay, &W);
    const int32_t *nv = epx_layout_num_valid(lay);
    size_t TK = (size_t)T * (size_t)K;
    int32_t *table = malloc(sizeof(int32_t) * (size_t)G * (size_t)E);
    EK(epx_dispatch_table_from_layout(lay, NULL, table, &er_));
    double *w = malloc(sizeof(double) * (size_t)P);
    for (int32_t p = 0; p < P; p++) w[p] = below(4) == 0 ? 0.0 : (double)(1 + below(9));
    uint32_t *thr = malloc(sizeof(uint32_t) * (size_t)E * (size_t)W);
    EK(epx_dispatch_thresholds(rep, nv, 1, E, W, w, P, thr, &er_));
    int32_t *ids = malloc(sizeof(int32_t) * (TK + 1));
    for (size_t i = 0; i < TK; i++) ids[i] = below(12) == 0 ? -1 : below(E);

    int32_t rank = G > 1 ? below(G) : 0;
    epx_dispatch_spec hs = {mode,
                            E,
                            P,
                            W,
                            table + (size_t)rank * (size_t)E,
                            rep,
                            nv,
                            thr,
                            next64(),
                            (uint32_t)below(100),
                            (uint32_t)below(61)};
    void *d_table = dcopy(hs.table, sizeof(int32_t) * (size_t)E);
    void *d_rep = dcopy(rep, sizeof(int32_t) * (size_t)E * (size_t)W);
    void *d_nv = dcopy(nv, sizeof(int32_t) * (size_t)E);
    void *d_thr = dcopy(thr, sizeof(uint32_t) * (size_t)E * (size_t)W);
    epx_dispatch_spec ds = hs;
    ds.table = d_table;
    ds.replicas = d_rep;
    ds.num_valid = d_nv;
    ds.thresholds = d_thr;

    /* CPU reference */
    int32_t *phys = malloc(sizeof(int32_t) * (TK + 1));
    EK(epx_dispatch_map_ids(&hs, ids, T, K, phys, &er_));
    epx_token_layout h = {
        malloc(8 * (size_t)G),       malloc(8 * (size_t)P), malloc((size_t)T * (size_t)G + 1),
        malloc(4 * ((size_t)G + 1)), malloc(4 * (TK + 1)),  malloc(4 * (TK + 1)),
        malloc(4 * ((size_t)P + 1)), malloc(4 * (TK + 1)),  malloc(4 * (TK + 1))};
    EK(epx_token_layout_compute(phys, T, K, P, G, &h, &er_));

    /* GPU: map alone, then the fused kernel */
    int32_t *d_ids = dcopy(ids, 4 * TK), *d_phys = dalloc(4 * TK), *d_phys2 = dalloc(4 * TK);
    dev_layout dl = dev_layout_alloc((size_t)T, (size_t)K, (size_t)P, (size_t)G);
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    EK(epx_cuda_dispatch_map_ids(&ds, d_ids, T, K, d_phys2, st, &er_));
    /* counts only: no send orders asked for, so the kernel skips phase C */
    epx_token_layout lay_arg = dl.d;
    if (counts_only)
        lay_arg.rank_perm = lay_arg.pair_rank_pos = lay_arg.slot_perm = lay_arg.pair_slot_pos =
            NULL;
    if (graph) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        EK(epxi_cuda_dispatch_layout_cluster(&ds, d_ids, T, K, P, G, d_phys, &lay_arg, cl, st,
                                             &er_));
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaGraphLaunch(ge, st)); /* replays give the same result */
        CK(cudaStreamSynchronize(st));
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
    } else if (cl == 0) {
        EK(epx_cuda_dispatch_layout(&ds, d_ids, T, K, P, G, d_phys, &lay_arg, st, &er_));
    } else {
        EK(epxi_cuda_dispatch_layout_cluster(&ds, d_ids, T, K, P, G, d_phys, &lay_arg, cl, st,
                                             &er_));
    }
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    void *x = hback(d_phys, 4 * TK);
    same("phys (fused)", ctx, x, phys, 4 * TK, 4);
    free(x);
    x = hback(d_phys2, 4 * TK);
    same("phys (map kernel)", ctx, x, phys, 4 * TK, 4);
    free(x);
    compare_layout(&dl, &h, ctx, counts_only);
    /* every kernel variant (original cluster kernel, compact kernel with
     * match_any or ballot ranking), random cluster size and warp share */
    for (int v = EPXI_LAYOUT_CLUSTER; v <= EPXI_LAYOUT_BALLOT; v++) {
        int vcl = clusters[below(5)], ppw = (int[]){0, 32, 128}[below(3)];
        char c3[220];
        snprintf(c3, sizeof c3, "%s variant=%d vcluster=%d ppw=%d", ctx, v, vcl, ppw);
        dev_layout_free(&dl);
        dl = dev_layout_alloc((size_t)T, (size_t)K, (size_t)P, (size_t)G);
        lay_arg = dl.d;
        if (counts_only)
            lay_arg.rank_perm = lay_arg.pair_rank_pos = lay_arg.slot_perm = lay_arg.pair_slot_pos =
                NULL;
        CK(cudaMemset(d_phys, 0xab, TK ? 4 * TK : 1));
        EK(epxi_cuda_dispatch_layout_variant(&ds, d_ids, T, K, P, G, d_phys, &lay_arg, v, vcl, ppw,
                                             st, &er_));
        CK(cudaStreamSynchronize(st));
        CK(cudaGetLastError());
        x = hback(d_phys, 4 * TK);
        same("phys (variant)", c3, x, phys, 4 * TK, 4);
        free(x);
        compare_layout(&dl, &h, c3, counts_only);
    }

    /* rows: scatter into both orders, combine back, bf16 and fp32 */
    if (T <= 2048 && !counts_only) {
        int64_t H = (int64_t[]){1, 7, 8, 24, 100, 512, 7168}[below(7)];
        for (int dt = 0; dt < 2; dt++) {
            size_t es = dt ? 2 : 4, rowb = (size_t)H * es;
            int32_t rows = h.slot_offsets[P];
            unsigned char *hx = malloc((size_t)T * rowb + 1);
            for (size_t i = 0; i < (size_t)T * (size_t)H; i++) {
                float v = (float)((int32_t)(next64() % 20001) - 10000) / 1000.0f;
                if (dt) {
                    uint32_t u;
                    memcpy(&u, &v, 4);
                    ((uint16_t *)hx)[i] = (uint16_t)(u >> 16);
                } else {
                    ((float *)hx)[i] = v;
                }
            }
            float *hw = malloc(4 * (TK + 1));
            for (size_t i = 0; i < TK; i++) hw[i] = (float)(next64() % 1000) / 997.0f;
            unsigned char *hy = malloc((size_t)rows * rowb + 1), *hz = malloc((size_t)T * rowb + 1);
            memset(hy, 0xab, (size_t)rows * rowb);
            EK(epx_permute_rows(hx, (epx_row_dtype)dt, T, H, h.pair_slot_pos, K, rows, hy, &er_));
            EK(epx_combine_rows(hy, (epx_row_dtype)dt, rows, H, h.pair_slot_pos, hw, T, K, hz,
                                &er_));
            void *dx = dcopy(hx, (size_t)T * rowb), *dy = dalloc((size_t)rows * rowb),
                 *dz = dalloc((size_t)T * rowb), *dw = dcopy(hw, 4 * TK);
            EK(epx_cuda_permute_rows(dx, (epx_row_dtype)dt, T, H, dl.d.pair_slot_pos, K, dy, st,
                                     &er_));
            EK(epx_cuda_combine_rows(dy, (epx_row_dtype)dt, H, dl.d.pair_slot_pos, dw, T, K, dz, st,
                                     &er_));
            CK(cudaStreamSynchronize(st));
            char c2[220];
            snprintf(c2, sizeof c2, "%s H=%lld %s", ctx, (long long)H, dt ? "bf16" : "fp32");
            x = hback(dy, (size_t)rows * rowb);
            same("permuted rows (slot order)", c2, x, hy, (size_t)rows * rowb, es);
            free(x);
            x = hback(dz, (size_t)T * rowb);
            same("combined rows (bitwise)", c2, x, hz, (size_t)T * rowb, es);
            free(x);
            /* rank order, unweighted */
            int32_t rrows = h.rank_offsets[G];
            unsigned char *hy2 = malloc((size_t)rrows * rowb + 1);
            memset(hy2, 0xab, (size_t)rrows * rowb);
            void *dy2 = dalloc((size_t)rrows * rowb);
            EK(epx_permute_rows(hx, (epx_row_dtype)dt, T, H, h.pair_rank_pos, K, rrows, hy2, &er_));
            EK(epx_combine_rows(hy2, (epx_row_dtype)dt, rrows, H, h.pair_rank_pos, NULL, T, K, hz,
                                &er_));
            EK(epx_cuda_permute_rows(dx, (epx_row_dtype)dt, T, H, dl.d.pair_rank_pos, K, dy2, st,
                                     &er_));
            EK(epx_cuda_combine_rows(dy2, (epx_row_dtype)dt, H, dl.d.pair_rank_pos, NULL, T, K, dz,
                                     st, &er_));
            CK(cudaStreamSynchronize(st));
            x = hback(dy2, (size_t)rrows * rowb);
            same("permuted rows (rank order)", c2, x, hy2, (size_t)rrows * rowb, es);
            free(x);
            x = hback(dz, (size_t)T * rowb);
            same("combined rows (rank order, no weights)", c2, x, hz, (size_t)T * rowb, es);
            free(x);
            /* the gather over each send order, at its full T*K capacity */
            unsigned char *hg = malloc(TK * rowb + 1);
            void *dg = dalloc(TK * rowb + 1);
            for (int ord = 0; ord < 2; ord++) {
                const int32_t *hperm = ord ? h.slot_perm : h.rank_perm;
                int32_t *tmp = malloc(4 * (TK + 1)); /* the host tail as -1, as the device's */
                memcpy(tmp, hperm, 4 * TK);
                int32_t used = ord ? h.slot_offsets[P] : h.rank_offsets[G];
                for (size_t i = (size_t)used; i < TK; i++) tmp[i] = -1;
                int32_t *dperm = dcopy(tmp, 4 * TK);
                EK(epx_gather_rows(hx, (epx_row_dtype)dt, T, H, tmp, (int64_t)TK, ord ? K : 1, hg,
                                   &er_));
                EK(epx_cuda_gather_rows(dx, (epx_row_dtype)dt, T, H, dperm, (int64_t)TK,
                                        ord ? K : 1, dg, st, &er_));
                CK(cudaStreamSynchronize(st));
                x = hback(dg, TK * rowb);
                same(ord ? "gathered rows (slot order)" : "gathered rows (rank order)", c2, x, hg,
                     TK * rowb, es);
                free(x);
                free(tmp);
                cudaFree(dperm);
            }
            free(hg);
            cudaFree(dg);
            cudaFree(dx);
            cudaFree(dy);
            cudaFree(dz);
            cudaFree(dw);
            cudaFree(dy2);
            free(hx);
            free(hy);
            free(hy2);
            free(hz);
            free(hw);
        }
    }
    CK(cudaStreamDestroy(st));
    dev_layout_free(&dl);
    cudaFree(d_ids);
    cudaFree(d_phys);
    cudaFree(d_phys2);
    cudaFree(d_table);
    cudaFree(d_rep);
    cudaFree(d_nv);
    cudaFree(d_thr);
    free(h.tokens_per_rank);
    free(h.tokens_per_slot);
    free(h.is_token_in_rank);
    free(h.rank_offsets);
    free(h.rank_perm);
    free(h.pair_rank_pos);
    free(h.slot_offsets);
    free(h.slot_perm);
    free(h.pair_slot_pos);
    free(phys);
    free(ids);
    free(thr);
    free(w);
    free(table);
    epx_layout_destroy(lay);
}

static void errors(void) {
    epx_error err = {0};
    int32_t table[4] = {0, 1, 2, 3};
    epx_dispatch_spec s = {EPX_DISPATCH_STATIC, 4, 4, 1, table, NULL, NULL, NULL, 0, 0, 0};
    epx_token_layout o = {0};
    int32_t *dummy = (int32_t *)table;
    if (epx_cuda_dispatch_layout(&s, dummy, 4, 33, 4, 2, dummy, &o, 0, &err) != EPX_ERR_SHAPE ||
        strstr(err.msg, "K <= 32") == NULL) {
        fprintf(stderr, "MISMATCH: K = 33 not refused: %s\n", err.msg);
        failures++;
    }
    if (epx_cuda_dispatch_layout(&s, dummy, 600000, 8, 4, 2, dummy, &o, 0, &err) !=
            EPX_ERR_UNSUPPORTED ||
        strstr(err.msg, "split the batch") == NULL) {
        fprintf(stderr, "MISMATCH: T = 600000 not refused: %s\n", err.msg);
        failures++;
    }
    s.table = NULL;
    if (epx_cuda_dispatch_map_ids(&s, dummy, 4, 1, dummy, 0, &err) != EPX_ERR_INVALID_ARG) {
        fprintf(stderr, "MISMATCH: static dispatch without a table not refused\n");
        failures++;
    }
}

int main(void) {
    if (cx_no_gpu()) return 77;
    rng_state = cx_seed(20261202ull);
    errors();
    static const int32_t Ts[] = {0, 1, 2, 31, 32, 33, 100, 257, 1000, 4096, 4099, 16384};
    static const int32_t Ks[] = {1, 2, 3, 8, 9, 16, 32};
    static const int32_t Gs[] = {1, 2, 3, 8, 16, 64, 72};
    /* EPX_GPU_TEST_QUICK: small cases only (for runs under compute-sanitizer) */
    int quick = getenv("EPX_GPU_TEST_QUICK") != NULL, cases = 0;
    for (size_t ti = 0; ti < (quick ? 8 : sizeof Ts / sizeof Ts[0]); ti++)
        for (int rep = 0; rep < 4; rep++) {
            int32_t T = Ts[ti], K = Ks[below(7)], G = Gs[below(7)];
            if (T >= 4096 && K > 8) K = 8;
            int32_t per = 1 + below(G >= 64 ? 3 : 13), P = G * per;
            int32_t E = rep == 3 ? P : 1 + below(P); /* rep 3: every expert one replica */
            epx_dispatch_mode mode = (epx_dispatch_mode)(rep == 0 ? below(5) : rep);
            one_case(T, K, E, P, G, mode, 0);
            cases++;
        }
    /* the benchmark's shape, every mode (EPX_DISPATCH_ROW too), one from a graph */
    for (int m = 0; m <= EPX_DISPATCH_ROW && !quick; m++)
        one_case(4096, 8, 384, 416, 8, (epx_dispatch_mode)m, m == 1);
    if (!quick) {
        one_case(16384, 8, 384, 416, 8, EPX_DISPATCH_DYNAMIC, 1);
        cases += EPX_DISPATCH_ROW + 2;
    }
    one_case(512, 8, 384, 416, 8, EPX_DISPATCH_WEIGHTED, 0);
    one_case(300, 8, 384, 416, 8, EPX_DISPATCH_ROW, 0); /* quick runs see SGLang's row rule */
    cases += 2;
    if (failures) {
        printf("FAILED: %d mismatches over %d cases\n", failures, cases);
        return 1;
    }
    printf("ok: %d cases, GPU equal to the CPU reference (integers exactly, combine bitwise)\n",
           cases);
    return 0;
}
