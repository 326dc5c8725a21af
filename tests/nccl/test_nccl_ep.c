/*
 * test_nccl_ep.c - the GPU path on one GPU: NCCL communicator (one rank,
 * made non-blockingly), EP dispatch/combine kernels, the cuBLAS MoE layer.
 * Skipped (exit 77) where no GPU is visible, as in CI.
 *
 * Oracles:
 *  - the GPU router on given logits chooses the CPU router's experts, with
 *    weights within 1e-5 relative;
 *  - with identity experts, GPU dispatch delivers exactly the host path's
 *    entries (counts, slot offsets, rows, weights) and GPU combine returns
 *    the host path's bits, in both combine modes;
 *  - the whole layer (router weights, cuBLAS experts in bf16, shared expert)
 *    through EP matches the CPU fp32 reference within bf16 error: the
 *    weights and inputs are bf16 values, so the only differences are the
 *    bf16 rounding of SwiGLU's output and of the expert outputs (2^-9
 *    relative each) and fp32 summation order: |gpu - ref| <= 2^-7 * S,
 *    where S sums the magnitudes of every term (moe_case.h).
 */
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epx_comm_nccl.h"
#include "moe_case.h"

static epx_comm *g_comm;
static cudaStream_t g_stream;

#define CK(call) assert_int_equal((int)(call), 0)

static void *dev_copy(const void *h, size_t bytes) {
    void *d = NULL;
    CK(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes) CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    /* A pageable cudaMemcpy may return before its DMA lands, and the
     * non-blocking stream does not wait for the legacy one. */
    CK(cudaDeviceSynchronize());
    return d;
}

static void host_copy(void *h, const void *d, size_t bytes) {
    CK(cudaStreamSynchronize(g_stream));
    if (bytes) CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

/* Round every weight and input to a bf16 value, so bf16 uploads are exact. */
static void round_bf16(float *v, size_t n) {
    for (size_t i = 0; i < n; i++) v[i] = epx_bf16_to_f32(epx_bf16_from_f32(v[i]));
}

static mc_layer make_layer(tu_rng *r, int32_t H, int32_t I, int32_t E, int32_t K, int32_t Is,
                           epx_moe_scoring sc, int32_t groups, int32_t extra_slots) {
    mc_layer L;
    memset(&L, 0, sizeof L);
    epx_moe_config c = EPX_MOE_CONFIG_INIT;
    c.hidden = H;
    c.intermediate = I;
    c.num_experts = E;
    c.top_k = K;
    c.scoring = sc;
    c.n_group = groups;
    c.topk_group = groups > 1 ? groups / 2 : 1;
    c.routed_scaling_factor = sc == EPX_MOE_SCORING_SIGMOID ? 2.5f : 1.0f;
    c.norm_topk_prob = 1;
    c.shared_intermediate = Is;
    L.cfg = c;
    float sx = 1.0f / sqrtf((float)H), si = 1.0f / sqrtf((float)I);
    L.router = mc_randv(r, (size_t)E * H, sx);
    L.bias = mc_randv(r, (size_t)E, 0.05f);
    L.gate = mc_randv(r, (size_t)E * I * H, sx);
    L.up = mc_randv(r, (size_t)E * I * H, sx);
    L.down = mc_randv(r, (size_t)E * H * I, si);
    L.sgate = Is ? mc_randv(r, (size_t)Is * H, sx) : NULL;
    L.sup = Is ? mc_randv(r, (size_t)Is * H, sx) : NULL;
    L.sdown = Is ? mc_randv(r, (size_t)H * Is, 1.0f / sqrtf((float)(Is ? Is : 1))) : NULL;
    round_bf16(L.router, (size_t)E * H);
    round_bf16(L.gate, (size_t)E * I * H);
    round_bf16(L.up, (size_t)E * I * H);
    round_bf16(L.down, (size_t)E * H * I);
    if (Is) {
        round_bf16(L.sgate, (size_t)Is * H);
        round_bf16(L.sup, (size_t)Is * H);
        round_bf16(L.sdown, (size_t)H * Is);
    }
    epx_moe_weights w = {L.router, sc == EPX_MOE_SCORING_SIGMOID ? L.bias : NULL,
                         L.gate,   L.up,
                         L.down,   L.sgate,
                         L.sup,    L.sdown};
    L.w = w;
    L.R = 1;
    L.P = E + extra_slots;
    L.p2l = malloc((size_t)L.P * sizeof(int32_t));
    for (int32_t p = 0; p < L.P; p++)
        L.p2l[p] = p < E ? (p * 7) % E /* 7 is coprime to E = 32: a permutation */
                         : (int32_t)tu_below(r, (uint32_t)E);
    L.reps = malloc((size_t)E * L.P * sizeof(int32_t));
    L.nrep = calloc((size_t)E, sizeof(int32_t));
    for (int32_t p = 0; p < L.P; p++) L.reps[(size_t)L.p2l[p] * L.P + L.nrep[L.p2l[p]]++] = p;
    return L;
}

static void router_matches_cpu(void **state) {
    (void)state;
    tu_rng r = {tu_seed(9101)};
    for (int mode = 0; mode < 3; mode++) {
        epx_moe_scoring sc = (epx_moe_scoring)mode;
        mc_layer L = make_layer(&r, 64, 32, 32, 8, 0, sc, sc == EPX_MOE_SCORING_SIGMOID ? 4 : 1, 0);
        const int64_t T = 1000;
        const int32_t E = 32, K = 8;
        float *logits = mc_randv(&r, (size_t)T * E, 3.0f);
        int32_t *ids = malloc((size_t)T * K * 4), *gids = malloc((size_t)T * K * 4);
        float *w = malloc((size_t)T * K * 4), *gw = malloc((size_t)T * K * 4);
        epx_error err = {0};
        assert_int_equal(epx_moe_route(&L.cfg, logits, L.w.router_bias, T, ids, w, &err), EPX_OK);
        int32_t zero = 0;
        epx_cuda_moe *moe = NULL;
        assert_int_equal(epx_cuda_moe_create(&L.cfg, &L.w, 1, &zero, T, g_stream, &moe, &err),
                         EPX_OK);
        float *dl = dev_copy(logits, (size_t)T * E * 4), *dw;
        int32_t *di;
        CK(cudaMalloc((void **)&di, (size_t)T * K * 4));
        CK(cudaMalloc((void **)&dw, (size_t)T * K * 4));
        assert_int_equal(epx_cuda_moe_route_logits(moe, dl, T, di, dw, &err), EPX_OK);
        host_copy(gids, di, (size_t)T * K * 4);
        host_copy(gw, dw, (size_t)T * K * 4);
        int64_t id_diff = 0;
        double wmax = 0;
        for (int64_t i = 0; i < T * K; i++) {
            id_diff += ids[i] != gids[i];
            double rel = fabs((double)gw[i] - w[i]) / (fabs((double)w[i]) + 1e-30);
            if (rel > wmax) wmax = rel;
        }
        printf("router mode %d: %lld of %lld ids differ, max weight rel error %.3g\n", mode,
               (long long)id_diff, (long long)(T * K), wmax);
        assert_int_equal(id_diff, 0);
        assert_true(wmax < 1e-5);
        cudaFree(dl), cudaFree(dw), cudaFree(di);
        epx_cuda_moe_destroy(moe);
        free(logits), free(ids), free(gids), free(w), free(gw);
        mc_layer_free(&L);
    }
}

/* Identity experts: the GPU path against the host path, bit for bit. */
static void dispatch_combine_match_host(void **state) {
    (void)state;
    tu_rng r = {tu_seed(9102)};
    for (int it = 0; it < 6; it++) {
        int32_t H = it < 3 ? 7168 : 1 + (int32_t)tu_below(&r, 300),
                K = 1 + (int32_t)tu_below(&r, 8);
        int32_t P = 8 + (int32_t)tu_below(&r, 60);
        int64_t Tmax = 1 + (int64_t)tu_below(&r, 700),
                T = (int64_t)tu_below(&r, (uint32_t)Tmax + 1);
        epx_ep_combine_mode mode = (epx_ep_combine_mode)(it % 2);
        epx_ep_config c = EPX_EP_CONFIG_INIT;
        c.hidden = H;
        c.top_k = K;
        c.num_slots = P;
        c.max_tokens = Tmax;
        c.x_dtype = EPX_DTYPE_BF16;
        c.y_dtype = EPX_DTYPE_BF16;
        c.combine = mode;
        size_t n = (size_t)(T ? T : 1);
        uint16_t *x = malloc(n * H * 2);
        int32_t *slots = malloc(n * K * 4);
        float *w = malloc(n * K * 4), *out = malloc(n * H * 4), *gout = malloc(n * H * 4);
        for (size_t i = 0; i < (size_t)T * H; i++)
            x[i] = epx_bf16_from_f32((float)(tu_uniform(&r) * 4 - 2));
        for (size_t i = 0; i < (size_t)T * K; i++) {
            slots[i] = tu_below(&r, 7) == 0 ? -1 : (int32_t)tu_below(&r, (uint32_t)P);
            w[i] = (float)tu_uniform(&r);
        }
        /* host path */
        epx_comm *local = NULL;
        epx_error err = {0};
        assert_int_equal(epx_comm_create_local(&local, &err), EPX_OK);
        epx_ep *hep = NULL;
        assert_int_equal(epx_ep_create(local, &c, NULL, 0, &hep, &err), EPX_OK);
        epx_ep_recv hr;
        assert_int_equal(epx_ep_dispatch(hep, T, x, slots, w, &hr, &err), EPX_OK);
        for (int64_t e = 0; e < hr.num_entries; e++)
            memcpy((uint16_t *)hr.y + e * H,
                   (const char *)hr.x + (size_t)hr.entry_token[e] * hr.x_stride, (size_t)H * 2);
        /* GPU path */
        epx_nccl_ep *gep = NULL;
        if (epx_nccl_ep_create(g_comm, &c, NULL, 0, &gep, &err) != EPX_OK) fail_msg("%s", err.msg);
        void *dx = dev_copy(x, n * H * 2), *ds = dev_copy(slots, n * K * 4),
             *dwt = dev_copy(w, n * K * 4);
        float *dout;
        CK(cudaMalloc((void **)&dout, n * H * 4));
        epx_ep_recv gr;
        if (epx_nccl_ep_dispatch(gep, T, dx, ds, dwt, &gr, &err) != EPX_OK) fail_msg("%s", err.msg);
        assert_int_equal(gr.num_tokens, hr.num_tokens);
        assert_int_equal(gr.num_entries, hr.num_entries);
        int64_t *so = malloc((size_t)(P + 1) * 8);
        int32_t *et = malloc((size_t)(hr.num_entries + 1) * 4);
        float *ew = malloc((size_t)(hr.num_entries + 1) * 4);
        host_copy(so, gr.slot_offsets, (size_t)(P + 1) * 8);
        host_copy(et, gr.entry_token, (size_t)hr.num_entries * 4);
        host_copy(ew, gr.entry_weight, (size_t)hr.num_entries * 4);
        assert_memory_equal(so, hr.slot_offsets, (size_t)(P + 1) * 8);
        if (hr.num_entries) {
            assert_memory_equal(et, hr.entry_token, (size_t)hr.num_entries * 4);
            assert_memory_equal(ew, hr.entry_weight, (size_t)hr.num_entries * 4);
        }
        for (int64_t e = 0; e < gr.num_entries; e++)
            CK(cudaMemcpyAsync((uint16_t *)gr.y + e * H,
                               (const char *)gr.x + (size_t)et[e] * gr.x_stride, (size_t)H * 2,
                               cudaMemcpyDeviceToDevice, g_stream));
        assert_int_equal(epx_ep_combine(hep, out, &err), EPX_OK);
        if (epx_nccl_ep_combine(gep, dout, &err) != EPX_OK) fail_msg("%s", err.msg);
        assert_int_equal(epx_comm_wait(g_comm, &err), EPX_OK);
        host_copy(gout, dout, (size_t)T * H * 4);
        if (T > 0 && memcmp(out, gout, (size_t)T * H * 4) != 0)
            fail_msg("iteration %d (H %d K %d P %d T %lld mode %d): GPU combine differs from the "
                     "host bits",
                     it, H, K, P, (long long)T, (int)mode);
        printf("identity EP H=%d K=%d P=%d T=%lld mode=%d: %lld entries, host == GPU bitwise\n", H,
               K, P, (long long)T, (int)mode, (long long)hr.num_entries);
        free(so), free(et), free(ew), free(x), free(slots), free(w), free(out), free(gout);
        cudaFree(dx), cudaFree(ds), cudaFree(dwt), cudaFree(dout);
        epx_nccl_ep_destroy(gep);
        epx_ep_destroy(hep);
        epx_comm_destroy(local);
    }
    /* A bad slot is an error, and the communicator stays usable. */
    epx_ep_config c = EPX_EP_CONFIG_INIT;
    c.hidden = 8;
    c.top_k = 2;
    c.num_slots = 4;
    c.max_tokens = 2;
    epx_nccl_ep *gep = NULL;
    epx_error err = {0};
    assert_int_equal(epx_nccl_ep_create(g_comm, &c, NULL, 0, &gep, &err), EPX_OK);
    int32_t bad[4] = {0, 1, 9, 2};
    float xz[16] = {0}, wz[4] = {0};
    void *dx = dev_copy(xz, sizeof xz), *ds = dev_copy(bad, sizeof bad),
         *dwt = dev_copy(wz, sizeof wz);
    epx_ep_recv gr;
    assert_int_equal(epx_nccl_ep_dispatch(gep, 2, dx, ds, dwt, &gr, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "topk_slots[1][0] = 9");
    assert_int_equal(epx_comm_health(g_comm, NULL), EPX_OK);
    cudaFree(dx), cudaFree(ds), cudaFree(dwt);
    epx_nccl_ep_destroy(gep);
}

/* The whole layer through EP on the GPU against the CPU fp32 reference. */
static void layer_matches_reference(void **state) {
    (void)state;
    tu_rng r = {tu_seed(9103)};
    for (int it = 0; it < 2; it++) {
        epx_ep_combine_mode mode = (epx_ep_combine_mode)it;
        const int32_t H = 512, I = 256, E = 32, K = 8, Is = 256;
        const int64_t T = 300;
        mc_layer L = make_layer(&r, H, I, E, K, Is, EPX_MOE_SCORING_SIGMOID, 4, 8);
        float *x = malloc((size_t)T * H * 4), *w = malloc((size_t)T * K * 4);
        int32_t *ids = malloc((size_t)T * K * 4), *slots = malloc((size_t)T * K * 4);
        mc_batch(&r, &L, T, 1, x, ids, w);
        round_bf16(x, (size_t)T * H);
        /* route again on the rounded inputs so both sides agree */
        float *logits = malloc((size_t)T * E * 4);
        epx_error err = {0};
        assert_int_equal(epx_moe_router_logits(&L.cfg, L.router, x, T, logits, &err), EPX_OK);
        assert_int_equal(epx_moe_route(&L.cfg, logits, L.w.router_bias, T, ids, w, &err), EPX_OK);
        mc_slots(&L, T, ids, 0, slots);
        float *ref = malloc((size_t)T * H * 4), *gout = malloc((size_t)T * H * 4);
        assert_int_equal(epx_moe_forward(&L.cfg, &L.w, x, T, ids, w, 0, 1, 1, ref, &err), EPX_OK);
        double *S = malloc((size_t)T * H * sizeof(double));
        mc_abs_sums(&L, T, x, ids, w, S);
        /* GPU */
        epx_ep_config c = EPX_EP_CONFIG_INIT;
        c.hidden = H;
        c.top_k = K;
        c.num_slots = L.P;
        c.max_tokens = T;
        c.x_dtype = EPX_DTYPE_BF16;
        c.y_dtype = EPX_DTYPE_BF16;
        c.combine = mode;
        epx_nccl_ep *gep = NULL;
        if (epx_nccl_ep_create(g_comm, &c, NULL, 0, &gep, &err) != EPX_OK) fail_msg("%s", err.msg);
        epx_cuda_moe *moe = NULL;
        if (epx_cuda_moe_create(&L.cfg, &L.w, L.P, L.p2l, T * K, g_stream, &moe, &err) != EPX_OK)
            fail_msg("%s", err.msg);
        uint16_t *xb = malloc((size_t)T * H * 2);
        for (size_t i = 0; i < (size_t)T * H; i++) xb[i] = epx_bf16_from_f32(x[i]);
        void *dx = dev_copy(xb, (size_t)T * H * 2), *ds = dev_copy(slots, (size_t)T * K * 4),
             *dwt = dev_copy(w, (size_t)T * K * 4);
        float *dout, *dlog;
        int32_t *dids;
        float *dw2;
        CK(cudaMalloc((void **)&dout, (size_t)T * H * 4));
        CK(cudaMalloc((void **)&dlog, (size_t)T * E * 4));
        CK(cudaMalloc((void **)&dids, (size_t)T * K * 4));
        CK(cudaMalloc((void **)&dw2, (size_t)T * K * 4));
        /* The GPU router's logits agree with the CPU's (bf16 values, fp32 sums). */
        assert_int_equal(epx_cuda_moe_router(moe, dx, T, dlog, dids, dw2, &err), EPX_OK);
        float *glog = malloc((size_t)T * E * 4);
        host_copy(glog, dlog, (size_t)T * E * 4);
        double lmax = 0;
        for (size_t i = 0; i < (size_t)T * E; i++) {
            double d = fabs((double)glog[i] - logits[i]);
            if (d > lmax) lmax = d;
        }
        printf("router logits: max |GPU - CPU| = %.3g\n", lmax);
        assert_true(lmax < 1e-4);
        epx_ep_recv gr;
        if (epx_nccl_ep_dispatch(gep, T, dx, ds, dwt, &gr, &err) != EPX_OK) fail_msg("%s", err.msg);
        if (epx_cuda_moe_run_experts(moe, &gr, c.x_dtype, c.y_dtype, &err) != EPX_OK)
            fail_msg("%s", err.msg);
        if (epx_nccl_ep_combine(gep, dout, &err) != EPX_OK) fail_msg("%s", err.msg);
        assert_int_equal(epx_cuda_moe_shared_add(moe, dx, T, dout, &err), EPX_OK);
        assert_int_equal(epx_comm_wait(g_comm, &err), EPX_OK);
        host_copy(gout, dout, (size_t)T * H * 4);
        double worst = 0, maxrel = 0, maxabs = 0;
        for (size_t i = 0; i < (size_t)T * H; i++) {
            double d = fabs((double)gout[i] - ref[i]);
            double q = d / (0x1p-7 * S[i] + 1e-6);
            if (q > worst) worst = q;
            if (d > maxabs) maxabs = d;
            double rel = d / (fabs((double)ref[i]) + 1e-3);
            if (rel > maxrel) maxrel = rel;
        }
        printf("layer (mode %d, GEMM path %s): max |GPU - CPU| = %.3g, max error / bound = %.3f, "
               "max relative error %.3g\n",
               (int)mode, epx_cuda_moe_gemm_path(moe), maxabs, worst, maxrel);
        assert_true(worst <= 1.0);
        free(glog), free(xb), free(x), free(w), free(ids), free(slots), free(logits), free(ref),
            free(gout), free(S);
        cudaFree(dx), cudaFree(ds), cudaFree(dwt), cudaFree(dout), cudaFree(dlog), cudaFree(dids),
            cudaFree(dw2);
        epx_cuda_moe_destroy(moe);
        epx_nccl_ep_destroy(gep);
        mc_layer_free(&L);
    }
}

int main(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        printf("no CUDA device: the NCCL/GPU tests are skipped\n");
        return 77;
    }
    ncclUniqueId id;
    ncclComm_t nc = NULL;
    epx_error err = {0};
    if (ncclGetUniqueId(&id) != ncclSuccess ||
        epx_nccl_comm_init(1, 0, &id, 30000, &nc, &err) != EPX_OK) {
        fprintf(stderr, "NCCL init failed: %s\n", err.msg);
        return 1;
    }
    cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking);
    if (epx_comm_nccl_create(nc, g_stream, NULL, &g_comm, &err) != EPX_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(router_matches_cpu),
        cmocka_unit_test(dispatch_combine_match_host),
        cmocka_unit_test(layer_matches_reference),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    epx_comm_destroy(g_comm);
    ncclCommDestroy(nc);
    cudaStreamDestroy(g_stream);
    return failed;
}
