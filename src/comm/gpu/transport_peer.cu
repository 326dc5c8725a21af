/*
 * transport_peer.cu - the peer transport (transport.h): a rank's
 * peer-written area in its own device memory; peers in other processes map
 * it with CUDA IPC (NVLink, PCIe with P2P, or processes sharing the GPU).
 */
#include <cstring>
#include <cuda_runtime.h>

/* first: it declares the core functions with C linkage */
#include "transport.h"
#include "cuda_check.h"

static epx_status peer_alloc(size_t bytes, int32_t users, epxi_area *a, epx_error *err) {
    (void)users;
    memset(a, 0, sizeof *a);
    void *p = NULL;
    EPXI_CUDA_TRY(cudaMalloc(&p, bytes), "GPU EP peer-written buffer (device memory)");
    a->dev = (unsigned char *)p;
    a->bytes = bytes;
    a->own = true;
    /* Flags start at epoch 0, which no batch uses. */
    EPXI_CUDA_TRY(cudaMemset(p, 0, bytes), "GPU EP peer-written buffer");
    return EPX_OK;
}

static epx_status peer_handle(const epxi_area *a, unsigned char h[EPXI_TR_HANDLE_BYTES],
                              epx_error *err) {
    static_assert(sizeof(cudaIpcMemHandle_t) <= EPXI_TR_HANDLE_BYTES, "an IPC handle fits");
    cudaIpcMemHandle_t ih;
    EPXI_CUDA_TRY(cudaIpcGetMemHandle(&ih, a->dev), "GPU EP: IPC handle");
    memset(h, 0, EPXI_TR_HANDLE_BYTES);
    memcpy(h, &ih, sizeof ih);
    return EPX_OK;
}

static void peer_count_in(const epxi_area *mapped, const unsigned char h[EPXI_TR_HANDLE_BYTES]) {
    (void)mapped; /* device memory lives until its owner frees it */
    (void)h;
}

static epx_status peer_map(const unsigned char h[EPXI_TR_HANDLE_BYTES], size_t bytes, int32_t rank,
                           epxi_area *peer, epx_error *err) {
    memset(peer, 0, sizeof *peer);
    cudaIpcMemHandle_t ih;
    memcpy(&ih, h, sizeof ih);
    void *q = NULL;
    cudaError_t e = cudaIpcOpenMemHandle(&q, ih, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return epxi_fail(err, EPX_ERR_CUDA,
                         "GPU EP: cannot map rank %d's buffer here with CUDA IPC: %s. The peer "
                         "transport needs GPUs that reach each other by load/store (NVLink, or "
                         "PCIe with P2P); set EPX_GPU_EP_TRANSPORT=host on every rank otherwise",
                         rank, cudaGetErrorString(e));
    }
    peer->dev = (unsigned char *)q;
    peer->bytes = bytes;
    peer->ipc_open = true;
    return EPX_OK;
}

static void peer_release(epxi_area *a) {
    if (a->own && a->dev != NULL) cudaFree(a->dev);
    if (a->ipc_open) cudaIpcCloseMemHandle(a->dev);
    memset(a, 0, sizeof *a);
}

const epxi_transport_ops epxi_transport_peer = {"peer",        peer_alloc, peer_handle,
                                                peer_count_in, peer_map,   peer_release};
