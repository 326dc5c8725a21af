/*
 * balanced.cu - bench_balanced: balanced per-batch dispatch on one GPU
 * (epx_cuda_dispatch_balanced_topk: ids -> counts -> exact split -> integer
 * counts -> per-token slots, one launch; and _solve from counts per logical
 * expert), at the issue's two shapes: Kimi-K2.5 on 8 GPUs (E = 384, P =
 * 416) and DeepSeek-V3 on 32 GPUs (E = 256, P = 288; its replicas on any
 * GPU, and "ds-v3-node": each expert's replicas on one of 4 nodes, as
 * hierarchical EPLB places them), K = 8, T in {1, 16, 128, 512, 1024, 4096}
 * tokens drawn skewed toward a few experts, with placements whose extra
 * replicas favour hot experts. EPX_BALANCED_SUBSET_GPUS=0 times the
 * max-flow solve alone (the subset solve takes components of <= 10 GPUs).
 * Every layer's result is compared with the CPU reference before timing.
 * Times: CUDA events around replays of a CUDA graph holding LAYERS launches
 * (one per layer, each with its own batch); the median over ROUNDS replays
 * divided by LAYERS is the "per layer" figure (the issue's target: <= 10 us
 * at T <= 4096). The flow solve's work depends on the batch, so the table
 * also gives the CPU reference's median per layer on one core beside it.
 * Tables are P - E + 1 wide, the most replicas any expert could have;
 * --tight narrows them to the placement's own most (SGLang's width for
 * logical_to_all_physical_map), the shape named with it ("kimi-k2.5:w3").
 * --shape NAME and --tokens T keep one shape's rows and one batch size
 * (for a profiler; the other rows' batches are still drawn, so a kept row's
 * are the full run's).
 * Output: one table on stdout and the same rows as CSV (--csv FILE).
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "epx.h"
#include "epx_cuda.h"

#include "cuda_exit.h"
#include "balanced_place.h"

enum { LAYERS = 16, ROUNDS = 51, K = 8 };

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}
static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    FILE *csv = NULL;
    int tight = 0; /* --tight: tables as wide as the placement needs, not P - E + 1 */
    const char *only_shape = NULL; /* --shape NAME, --tokens T: one row (a profiler's run) */
    long only_T = 0;
    const char *tokens_arg = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc)
            csv = fopen(argv[++i], "w");
        else if (strcmp(argv[i], "--tight") == 0)
            tight = 1;
        else if (strcmp(argv[i], "--shape") == 0 && i + 1 < argc)
            only_shape = argv[++i];
        else if (strcmp(argv[i], "--tokens") == 0 && i + 1 < argc) {
            char *end = NULL;
            tokens_arg = argv[++i];
            only_T = strtol(tokens_arg, &end, 10); /* checked below against the sizes run */
            if (end == tokens_arg || *end != '\0' || only_T == 0) only_T = -1;
        } else {
            fprintf(stderr,
                    "bench_balanced: unknown argument '%s' (--csv FILE, --tight, --shape NAME, "
                    "--tokens T)\n",
                    argv[i]);
            return 2;
        }
    }
    int shape_known = only_shape == NULL;
    for (size_t si = 0; si < BAL_SHAPES; si++)
        shape_known |= only_shape != NULL && strcmp(only_shape, bal_shapes[si].name) == 0;
    if (!shape_known) {
        fprintf(stderr, "bench_balanced: --shape '%s': use one of", only_shape);
        for (size_t si = 0; si < BAL_SHAPES; si++) fprintf(stderr, " %s", bal_shapes[si].name);
        fprintf(stderr, "\n");
        return 2;
    }
    static const int32_t Ts[] = {1, 16, 128, 512, 1024, 4096};
    int T_known = only_T == 0;
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) T_known |= Ts[ti] == only_T;
    if (!T_known) {
        fprintf(stderr, "bench_balanced: --tokens '%s': use one of 1, 16, 128, 512, 1024, 4096\n",
                tokens_arg);
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("skip: no CUDA device\n");
        return 0;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    printf("%-10s %5s %5s %5s %6s %12s %12s %12s %8s\n", "shape", "E", "P", "G", "T", "ids us/lay",
           "counts us/lay", "cpu us/lay", "levels");
    if (csv) fprintf(csv, "shape,E,P,G,T,ids_us,counts_us,cpu_us,levels\n");
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (size_t si = 0; si < BAL_SHAPES; si++) {
        const int shape_kept = only_shape == NULL || strcmp(only_shape, bal_shapes[si].name) == 0;
        int32_t E = bal_shapes[si].E, P = bal_shapes[si].P, G = bal_shapes[si].G, W = P - E + 1;
        int32_t *rep = (int32_t *)malloc(4 * (size_t)E * (size_t)W),
                *nv = (int32_t *)malloc(4 * (size_t)E);
        make_place(E, P, W, bal_shapes[si].nodes, rep, nv);
        if (tight) W = narrow_place(E, W, rep, nv);
        const size_t EW = (size_t)E * (size_t)W;
        char name[40]; /* the shape, and the table's width when narrowed */
        if (tight)
            snprintf(name, sizeof name, "%s:w%d", bal_shapes[si].name, W);
        else
            snprintf(name, sizeof name, "%s", bal_shapes[si].name);
        epx_error er;
        memset(&er, 0, sizeof er);
        epx_balancer *cb = NULL;
        epx_cuda_balancer *gb = NULL;
        EK(epx_dispatch_balanced_create(E, W, P, G, &cb, &er));
        EK(epx_cuda_dispatch_balanced_create(E, W, P, G, &gb, &er));
        int32_t *d_rep, *d_nv;
        CK(cudaMalloc(&d_rep, 4 * EW));
        CK(cudaMalloc(&d_nv, 4 * (size_t)E));
        CK(cudaMemcpy(d_rep, rep, 4 * EW, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_nv, nv, 4 * (size_t)E, cudaMemcpyHostToDevice));
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            int32_t T = Ts[ti];
            size_t n = (size_t)T * K;
            int32_t *ids = (int32_t *)malloc(4 * n * LAYERS), *phys = (int32_t *)malloc(4 * n);
            int64_t *cnt = (int64_t *)malloc(8 * (size_t)E * LAYERS);
            int64_t *rc = (int64_t *)malloc(8 * EW), *rc_g = (int64_t *)malloc(8 * EW);
            int32_t *phys_g = (int32_t *)malloc(4 * n);
            for (size_t i = 0; i < n * LAYERS; i++) {
                double u = unif();
                ids[i] = (int32_t)((double)E * u * u);
            }
            if (!shape_kept || (only_T != 0 && T != only_T)) { /* drawn, not run */
                free(ids);
                free(phys);
                free(cnt);
                free(rc);
                free(rc_g);
                free(phys_g);
                continue;
            }
            for (int l = 0; l < LAYERS; l++)
                EK(epx_dispatch_count_ids(ids + (size_t)l * n, T, K, E, cnt + (size_t)l * E, &er));
            int32_t *d_ids, *d_phys;
            int64_t *d_cnt, *d_rc, *d_sum;
            CK(cudaMalloc(&d_ids, 4 * n * LAYERS));
            CK(cudaMalloc(&d_phys, 4 * n * LAYERS));
            CK(cudaMalloc(&d_cnt, 8 * (size_t)E * LAYERS));
            CK(cudaMalloc(&d_rc, 8 * EW * LAYERS));
            CK(cudaMalloc(&d_sum, 8 * 5 * LAYERS));
            CK(cudaMemcpy(d_ids, ids, 4 * n * LAYERS, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(d_cnt, cnt, 8 * (size_t)E * LAYERS, cudaMemcpyHostToDevice));
            /* check every layer against the CPU, and time the CPU reference */
            double cpu[LAYERS];
            int32_t levels = 0;
            for (int l = 0; l < LAYERS; l++) {
                epx_cuda_balanced_out go = {NULL, d_rc + (size_t)l * EW, NULL, NULL, d_sum + 5 * l};
                EK(epx_cuda_dispatch_balanced_topk(gb, d_rep, d_nv, d_ids + (size_t)l * n, T, K,
                                                   d_phys + (size_t)l * n, &go, st, &er));
                CK(cudaStreamSynchronize(st));
                epx_balanced_out o = {NULL, rc, NULL, NULL, 0, 0, 0, 0};
                double t0 = now_us();
                EK(epx_dispatch_balanced_topk(cb, rep, nv, ids + (size_t)l * n, T, K, phys, &o,
                                              &er));
                cpu[l] = now_us() - t0;
                if (o.num_levels > levels) levels = o.num_levels;
                CK(cudaMemcpy(rc_g, d_rc + (size_t)l * EW, 8 * EW, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(phys_g, d_phys + (size_t)l * n, 4 * n, cudaMemcpyDeviceToHost));
                if (memcmp(rc, rc_g, 8 * EW) || memcmp(phys, phys_g, 4 * n)) {
                    fprintf(stderr, "bench_balanced: %s T = %d layer %d differs from the CPU\n",
                            name, T, l);
                    return 1;
                }
            }
            qsort(cpu, LAYERS, sizeof cpu[0], cmp_d);
            /* one graph per entry point, LAYERS launches each */
            float us[2];
            for (int mode = 0; mode < 2; mode++) {
                cudaGraph_t g;
                cudaGraphExec_t ge;
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                for (int l = 0; l < LAYERS; l++) {
                    epx_cuda_balanced_out go = {NULL, d_rc + (size_t)l * EW, NULL, NULL,
                                                d_sum + 5 * l};
                    if (mode == 0)
                        EK(epx_cuda_dispatch_balanced_topk(gb, d_rep, d_nv, d_ids + (size_t)l * n,
                                                           T, K, d_phys + (size_t)l * n, &go, st,
                                                           &er));
                    else
                        EK(epx_cuda_dispatch_balanced_solve(gb, d_rep, d_nv, d_cnt + (size_t)l * E,
                                                            &go, st, &er));
                }
                CK(cudaStreamEndCapture(st, &g));
                CK(cudaGraphInstantiate(&ge, g, 0));
                CK(cudaGraphLaunch(ge, st)); /* warm-up */
                float ms[ROUNDS];
                for (int r = 0; r < ROUNDS; r++) {
                    CK(cudaEventRecord(e0, st));
                    CK(cudaGraphLaunch(ge, st));
                    CK(cudaEventRecord(e1, st));
                    CK(cudaEventSynchronize(e1));
                    CK(cudaEventElapsedTime(&ms[r], e0, e1));
                }
                qsort(ms, ROUNDS, sizeof ms[0], cmp_f);
                us[mode] = ms[ROUNDS / 2] * 1000.0f / LAYERS;
                CK(cudaGraphExecDestroy(ge));
                CK(cudaGraphDestroy(g));
            }
            printf("%-10s %5d %5d %5d %6d %12.2f %12.2f %12.2f %8d\n", name, E, P, G, T, us[0],
                   us[1], cpu[LAYERS / 2], levels);
            if (csv)
                fprintf(csv, "%s,%d,%d,%d,%d,%.3f,%.3f,%.3f,%d\n", name, E, P, G, T, us[0], us[1],
                        cpu[LAYERS / 2], levels);
            CK(cudaFree(d_ids));
            CK(cudaFree(d_phys));
            CK(cudaFree(d_cnt));
            CK(cudaFree(d_rc));
            CK(cudaFree(d_sum));
            free(ids);
            free(phys);
            free(phys_g);
            free(cnt);
            free(rc);
            free(rc_g);
        }
        CK(cudaFree(d_rep));
        CK(cudaFree(d_nv));
        epx_cuda_dispatch_balanced_destroy(gb);
        epx_dispatch_balanced_destroy(cb);
        free(rep);
        free(nv);
    }
    if (csv) fclose(csv);
    return 0;
}
