/*
 * test_balanced_gpu.c - the balanced-dispatch kernel (epx_cuda.h) against
 * its CPU reference (epx_dispatch_balanced_topk / _solve) on seeded random
 * placements and batches: tiny shapes, one GPU, many GPUs (up to 72),
 * parts of 5, 10 and 11 GPUs (the subset solve's edges),
 * experts with one replica and several on one GPU, skewed batches with ids
 * of -1, T = 0 .. 8192, and the Kimi-K2.5 (E = 384, P = 416, 8 GPUs) and
 * DeepSeek-V3 (E = 256, P = 288, 32 GPUs) layers. Both entry points (ids,
 * and counts per logical expert); every output must be equal: replica and
 * slot counts and slots exactly, shares and GPU loads bitwise (they are
 * computed by the same source from the same integers), the summary equal
 * to the CPU's scalars with status 0. Outputs are poisoned first, so an
 * unwritten entry cannot pass. Some cases run from a captured CUDA graph
 * replayed on new batches copied into the captured buffers; the others
 * route each batch again with fewer outputs (slot counts only, then none),
 * whose slots must still match. The ids entry point takes its grid form
 * (two launches on many blocks) from 4,096 (t, k) pairs up, about a
 * quarter of the cases here (the quick ones: the subset edges' three);
 * EPX_BALANCED_GRID_PAIRS=0 runs every case in it (scripts/gpu_check.sh
 * does both).
 *
 * A plain program rather than cmocka, like test_dispatch_gpu: exits 77 (a
 * CTest skip) when no GPU is present, 1 after any mismatch, naming it.
 * EPX_TEST_SEED sets the seed (printed); EPX_GPU_TEST_QUICK keeps the cases
 * small (for compute-sanitizer runs).
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epx.h"
#include "epx_cuda.h"

static int failures;

#include "cuda_exit.h"

static uint64_t rng_state;
static uint64_t next64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static int32_t below(int32_t n) { return (int32_t)(next64() % (uint64_t)n); }
static double unif(void) { return (double)(next64() >> 11) / 9007199254740992.0; }

static void *dalloc(size_t bytes) {
    void *p = NULL;
    CK(cudaMalloc(&p, bytes ? bytes : 1));
    CK(cudaMemset(p, 0xab, bytes ? bytes : 1)); /* poison */
    return p;
}
static void *hback(const void *d, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    if (bytes) CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    return h;
}
static void same(const char *what, const char *ctx, const void *d, const void *h, size_t bytes,
                 size_t elem) {
    void *x = hback(d, bytes);
    if (memcmp(x, h, bytes) != 0) {
        size_t i = 0;
        while (((const unsigned char *)x)[i] == ((const unsigned char *)h)[i]) i++;
        fprintf(stderr, "MISMATCH %s (%s): first difference at element %zu\n", what, ctx, i / elem);
        failures++;
    }
    free(x);
}

/* A placement: every expert one slot, the rest to random experts (several
 * on one GPU allowed), slots shuffled, each list in random order; width W =
 * P - E + 1 with -1 padding, as a layout's logical_to_all_physical. */
typedef struct place {
    int32_t E, P, G, W;
    int32_t *rep, *nv;
} place;

static place random_place(int32_t E, int32_t G, int32_t per) {
    place p = {E, G * per, G, G * per - E + 1, NULL, NULL};
    int32_t *p2l = malloc(sizeof(int32_t) * (size_t)p.P);
    int32_t hot = 1 + below(E < 8 ? E : 8); /* extra replicas favour a few experts */
    for (int32_t s = 0; s < p.P; s++) p2l[s] = s < E ? s : below(3) ? below(E) : below(hot);
    for (int32_t s = p.P - 1; s > 0; s--) {
        int32_t j = below(s + 1), t = p2l[s];
        p2l[s] = p2l[j];
        p2l[j] = t;
    }
    p.rep = malloc(sizeof(int32_t) * (size_t)E * (size_t)p.W);
    p.nv = calloc((size_t)E, sizeof(int32_t));
    for (int32_t i = 0; i < E * p.W; i++) p.rep[i] = -1;
    for (int32_t s = 0; s < p.P; s++) p.rep[p2l[s] * p.W + p.nv[p2l[s]]++] = s;
    for (int32_t e = 0; e < E; e++)
        for (int32_t j = p.nv[e] - 1; j > 0; j--) {
            int32_t k = below(j + 1), t = p.rep[e * p.W + j];
            p.rep[e * p.W + j] = p.rep[e * p.W + k];
            p.rep[e * p.W + k] = t;
        }
    free(p2l);
    return p;
}

/* Skewed ids (a cubic toward low experts), 1 in 16 of them -1. */
static void random_ids(int32_t *ids, int64_t n, int32_t E) {
    int skew = below(3);
    for (int64_t i = 0; i < n; i++) {
        double u = unif();
        if (skew) u = u * u * (skew == 2 ? u : 1.0);
        ids[i] = below(16) == 0 ? -1 : (int32_t)((double)E * u);
    }
}

typedef struct dev_out {
    epx_cuda_balanced_out d;
    int32_t *phys;
} dev_out;

static dev_out dev_out_alloc(const place *p, int64_t pairs) {
    size_t EW = (size_t)p->E * (size_t)p->W;
    dev_out o;
    o.d.shares = dalloc(8 * EW);
    o.d.replica_counts = dalloc(8 * EW);
    o.d.slot_counts = dalloc(8 * (size_t)p->P);
    o.d.gpu_load = dalloc(8 * (size_t)p->G);
    o.d.summary = dalloc(8 * 5);
    o.phys = dalloc(4 * (size_t)pairs);
    return o;
}
static void dev_out_free(dev_out *o) {
    cudaFree(o->d.shares);
    cudaFree(o->d.replica_counts);
    cudaFree(o->d.slot_counts);
    cudaFree(o->d.gpu_load);
    cudaFree(o->d.summary);
    cudaFree(o->phys);
}

/* The CPU reference's outputs for one batch. */
typedef struct ref {
    double *shares, *gpu_load;
    int64_t *rc, *slots, summary[5];
    int32_t *phys;
} ref;

static ref cpu_ref(epx_balancer *cb, const place *p, const int32_t *ids, int64_t T, int32_t K,
                   const int64_t *counts) {
    size_t EW = (size_t)p->E * (size_t)p->W;
    ref r;
    r.shares = malloc(8 * EW);
    r.rc = malloc(8 * EW);
    r.slots = malloc(8 * (size_t)p->P);
    r.gpu_load = malloc(8 * (size_t)p->G);
    r.phys = malloc(4 * (size_t)(T * K) + 4);
    epx_balanced_out o = {r.shares, r.rc, r.slots, r.gpu_load, 0, 0, 0, 0};
    epx_error er = {0};
    if (ids)
        EK(epx_dispatch_balanced_topk(cb, p->rep, p->nv, ids, T, K, r.phys, &o, &er));
    else
        EK(epx_dispatch_balanced_solve(cb, p->rep, p->nv, counts, &o, &er));
    r.summary[0] = o.max_load_num;
    r.summary[1] = o.max_load_den;
    r.summary[2] = o.max_load_int;
    r.summary[3] = o.num_levels;
    r.summary[4] = 0;
    return r;
}
static void free_ref(ref *r) {
    free(r->shares);
    free(r->rc);
    free(r->slots);
    free(r->gpu_load);
    free(r->phys);
}

static void compare(const dev_out *o, const ref *r, const place *p, int64_t pairs,
                    const char *ctx) {
    size_t EW = (size_t)p->E * (size_t)p->W;
    same("summary", ctx, o->d.summary, r->summary, 8 * 5, 8);
    same("replica_counts", ctx, o->d.replica_counts, r->rc, 8 * EW, 8);
    same("slot_counts", ctx, o->d.slot_counts, r->slots, 8 * (size_t)p->P, 8);
    same("shares", ctx, o->d.shares, r->shares, 8 * EW, 8);
    same("gpu_load", ctx, o->d.gpu_load, r->gpu_load, 8 * (size_t)p->G, 8);
    if (pairs > 0) same("phys", ctx, o->phys, r->phys, 4 * (size_t)pairs, 4);
}

/* One placement, `batches` batches of T tokens: the ids entry point (from a
 * graph when graph is set: captured once, replayed per batch), and the
 * counts entry point on the same batch. */
static void one_case(int32_t E, int32_t G, int32_t per, int64_t T, int32_t K, int batches,
                     int graph) {
    place p = random_place(E, G, per);
    char ctx[160];
    snprintf(ctx, sizeof ctx, "E=%d P=%d G=%d T=%lld K=%d%s", E, p.P, G, (long long)T, K,
             graph ? " graph" : "");
    epx_error er = {0};
    epx_balancer *cb = NULL;
    epx_cuda_balancer *gb = NULL;
    EK(epx_dispatch_balanced_create(E, p.W, p.P, G, &cb, &er));
    EK(epx_cuda_dispatch_balanced_create(E, p.W, p.P, G, &gb, &er));
    int64_t pairs = T * K;
    size_t EW = (size_t)E * (size_t)p.W;
    int32_t *d_rep = dalloc(4 * EW), *d_nv = dalloc(4 * (size_t)E);
    int32_t *d_ids = dalloc(4 * (size_t)pairs);
    int64_t *d_cnt = dalloc(8 * (size_t)E);
    CK(cudaMemcpy(d_rep, p.rep, 4 * EW, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_nv, p.nv, 4 * (size_t)E, cudaMemcpyHostToDevice));
    dev_out o = dev_out_alloc(&p, pairs), oc = dev_out_alloc(&p, 0), os = dev_out_alloc(&p, pairs);
    /* slots without the replica counts (the torch op's call): the grid
     * form keeps them in the balancer's own buffer; and with no outputs */
    epx_cuda_balanced_out slots_only = {NULL, NULL, os.d.slot_counts, NULL, NULL};
    int32_t *ids = malloc(4 * (size_t)pairs + 4);
    int64_t *cnt = malloc(8 * (size_t)E);
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cudaGraphExec_t ge = NULL;
    if (graph) {
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        EK(epx_cuda_dispatch_balanced_topk(gb, d_rep, d_nv, d_ids, T, K, o.phys, &o.d, st, &er));
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphDestroy(g));
    }
    for (int bi = 0; bi < batches; bi++) {
        random_ids(ids, pairs, E);
        CK(cudaMemcpy(d_ids, ids, 4 * (size_t)pairs, cudaMemcpyHostToDevice));
        if (graph)
            CK(cudaGraphLaunch(ge, st));
        else
            EK(epx_cuda_dispatch_balanced_topk(gb, d_rep, d_nv, d_ids, T, K, o.phys, &o.d, st,
                                               &er));
        EK(epx_dispatch_count_ids(ids, T, K, E, cnt, &er));
        CK(cudaMemcpyAsync(d_cnt, cnt, 8 * (size_t)E, cudaMemcpyHostToDevice, st));
        EK(epx_cuda_dispatch_balanced_solve(gb, d_rep, d_nv, d_cnt, &oc.d, st, &er));
        CK(cudaStreamSynchronize(st));
        ref r = cpu_ref(cb, &p, ids, T, K, NULL);
        compare(&o, &r, &p, pairs, ctx);
        compare(&oc, &r, &p, 0, ctx); /* the same counts, so the same split */
        if (!graph) {
            CK(cudaMemset(os.phys, 0xab, 4 * (size_t)pairs));
            CK(cudaMemset(os.d.slot_counts, 0xab, 8 * (size_t)p.P));
            EK(epx_cuda_dispatch_balanced_topk(gb, d_rep, d_nv, d_ids, T, K, os.phys,
                                               bi % 2 ? NULL : &slots_only, st, &er));
            CK(cudaStreamSynchronize(st));
            if (pairs > 0) same("phys (fewer outputs)", ctx, os.phys, r.phys, 4 * (size_t)pairs, 4);
            if (bi % 2 == 0)
                same("slot_counts (fewer outputs)", ctx, os.d.slot_counts, r.slots, 8 * (size_t)p.P,
                     8);
        }
        free_ref(&r);
        /* counts that no ids give (large, all-reduced-like) through the counts entry */
        for (int32_t e = 0; e < E; e++) cnt[e] = below(5) == 0 ? 0 : below(1 << 20);
        CK(cudaMemcpyAsync(d_cnt, cnt, 8 * (size_t)E, cudaMemcpyHostToDevice, st));
        EK(epx_cuda_dispatch_balanced_solve(gb, d_rep, d_nv, d_cnt, &oc.d, st, &er));
        CK(cudaStreamSynchronize(st));
        r = cpu_ref(cb, &p, NULL, 0, 1, cnt);
        compare(&oc, &r, &p, 0, ctx);
        free_ref(&r);
    }
    if (ge) CK(cudaGraphExecDestroy(ge));
    CK(cudaStreamDestroy(st));
    free(ids);
    free(cnt);
    dev_out_free(&o);
    dev_out_free(&oc);
    dev_out_free(&os);
    cudaFree(d_rep);
    cudaFree(d_nv);
    cudaFree(d_ids);
    cudaFree(d_cnt);
    epx_cuda_dispatch_balanced_destroy(gb);
    epx_dispatch_balanced_destroy(cb);
    free(p.rep);
    free(p.nv);
}

int main(void) {
    if (cx_no_gpu()) return 77;
    rng_state = cx_seed(20270127ull);
    int quick = getenv("EPX_GPU_TEST_QUICK") != NULL, cases = 0;
    static const int32_t Ts[] = {0, 1, 2, 31, 33, 100, 257, 1000, 4096, 8192};
    static const int32_t Ks[] = {1, 2, 4, 8, 9};
    static const int32_t Gs[] = {1, 2, 3, 8, 16, 32, 72};
    for (int c = 0; c < (quick ? 12 : 120); c++) {
        int32_t G = Gs[below((int32_t)(sizeof Gs / sizeof Gs[0]))],
                per = 1 + below(G >= 32 ? 4 : 12), P = G * per;
        int32_t E = below(4) == 0 ? P : 1 + below(P);
        int32_t T = Ts[below(quick ? 6 : 10)], K = Ks[below(5)];
        one_case(E, G, per, T, K, 2, c % 5 == 4);
        cases++;
    }
    /* the benchmark's shapes, and graph replays of them; DeepSeek-V3's
     * (W = 33) has a workspace too large for shared memory whose hot part
     * fits: the solve's arrays there, the tail in device memory */
    static const int32_t Tb[] = {1, 16, 128, 1024, 4096};
    for (size_t i = 0; i < (quick ? 2 : 5); i++) {
        one_case(384, 8, 52, Tb[i], 8, quick ? 2 : 6, i % 2);
        one_case(256, 32, 9, Tb[i], 8, quick ? 2 : 6, (i + 1) % 2);
        cases += 2;
    }
    /* the subset solve's edges: a part of 5 GPUs (its 32 subsets one per
     * lane), of 10 (the bound: 32 per lane) and of 11 (max-flows again);
     * few experts on many slots, so the GPUs form one part */
    static const int32_t Gb[] = {5, 10, 11};
    for (size_t i = 0; i < 3; i++) {
        one_case(Gb[i] + 2, Gb[i], 4, 1000, 8, quick ? 1 : 3, (int)i % 2);
        cases++;
    }
    /* a workspace too large for shared memory: the kernel keeps it in
     * global memory (and the ids entry point runs with fewer warps) */
    one_case(20000, 8, 2600, 1000, 8, 1, 0);
    cases++;
    { /* a launch form that does not exist is refused by name, the caller's kept */
        const char *was = getenv("EPX_BALANCED_PDL");
        char keep[16] = "";
        if (was != NULL) snprintf(keep, sizeof keep, "%s", was);
        setenv("EPX_BALANCED_PDL", "2", 1);
        epx_cuda_balancer *gb = NULL;
        epx_error er = {0};
        const epx_status st = epx_cuda_dispatch_balanced_create(8, 1, 8, 2, &gb, &er);
        if (was != NULL)
            setenv("EPX_BALANCED_PDL", keep, 1);
        else
            unsetenv("EPX_BALANCED_PDL");
        if (st != EPX_ERR_INVALID_ARG || gb != NULL ||
            strstr(er.msg, "EPX_BALANCED_PDL = '2'") == NULL) {
            printf("FAILED: EPX_BALANCED_PDL=2 must be refused naming it: '%s'\n", er.msg);
            failures++;
        }
        epx_cuda_dispatch_balanced_destroy(gb);
    }
    if (failures) {
        printf("FAILED: %d mismatches over %d cases\n", failures, cases);
        return 1;
    }
    printf("ok: %d cases, GPU equal to the CPU reference (counts and slots exactly, shares and "
           "loads bitwise)\n",
           cases);
    return 0;
}
