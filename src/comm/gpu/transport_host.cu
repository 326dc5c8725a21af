/*
 * transport_host.cu - the host-memory transport (transport.h): a rank's
 * peer-written area in POSIX shared memory (shm_segment.c) that every rank
 * registers with CUDA and maps into its GPU's address space, so the same
 * kernels store into it and poll it across the host link. For GPUs that
 * cannot map each other; every byte crosses the link twice (store, then
 * the receiver's load).
 */
#include <cstring>
#include <cuda_runtime.h>

/* first: it declares the core functions with C linkage */
#include "transport.h"
#include "cuda_check.h"

/* What peers need: the segment's name; its owner's mapping serves ranks of
 * the owner's own process (they count in through it). */
struct HostHandle {
    char name[EPXI_SHM_NAME_BYTES];
    uint64_t owner_map;
};
static_assert(sizeof(HostHandle) <= EPXI_TR_HANDLE_BYTES, "a host handle fits");

/* Register the mapped segment's data with CUDA and find its device address. */
static epx_status register_data(epxi_area *a, epx_error *err) {
    void *data = epxi_shm_data(&a->shm);
    cudaError_t e =
        cudaHostRegister(data, a->bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return epxi_fail(err, EPX_ERR_CUDA,
                         "GPU EP host transport: cannot pin shared memory %s (%zu bytes) for the "
                         "GPU: %s (too little lockable memory? ulimit -l)",
                         a->shm.name, a->bytes, cudaGetErrorString(e));
    }
    a->host = data;
    void *d = NULL;
    EPXI_CUDA_TRY(cudaHostGetDevicePointer(&d, data, 0), "GPU EP host transport: device address");
    a->dev = (unsigned char *)d;
    return EPX_OK;
}

static void host_release(epxi_area *a) {
    if (a->host != NULL) cudaHostUnregister(a->host);
    epxi_shm_close(&a->shm);
    memset(a, 0, sizeof *a);
}

static epx_status host_alloc(size_t bytes, int32_t users, epxi_area *a, epx_error *err) {
    memset(a, 0, sizeof *a);
    EPX_TRY(epxi_shm_create(bytes, users, &a->shm, err)); /* zeroed: flags at epoch 0 */
    a->bytes = bytes;
    a->own = true;
    epx_status st = register_data(a, err);
    if (st != EPX_OK) host_release(a);
    return st;
}

static epx_status host_handle(const epxi_area *a, unsigned char h[EPXI_TR_HANDLE_BYTES],
                              epx_error *err) {
    (void)err;
    HostHandle hh;
    memset(&hh, 0, sizeof hh);
    memcpy(hh.name, a->shm.name, sizeof hh.name);
    hh.owner_map = (uint64_t)(uintptr_t)a->shm.map;
    memset(h, 0, EPXI_TR_HANDLE_BYTES);
    memcpy(h, &hh, sizeof hh);
    return EPX_OK;
}

static void host_count_in(const epxi_area *mapped, const unsigned char h[EPXI_TR_HANDLE_BYTES]) {
    HostHandle hh;
    memcpy(&hh, h, sizeof hh);
    void *map = mapped != NULL && mapped->shm.map != NULL ? mapped->shm.map
                                                          : (void *)(uintptr_t)hh.owner_map;
    epxi_shm_count_in(map, hh.name);
}

static epx_status host_map(const unsigned char h[EPXI_TR_HANDLE_BYTES], size_t bytes, int32_t rank,
                           epxi_area *peer, epx_error *err) {
    memset(peer, 0, sizeof *peer);
    HostHandle hh;
    memcpy(&hh, h, sizeof hh);
    hh.name[sizeof hh.name - 1] = '\0';
    epx_status st = epxi_shm_attach(hh.name, bytes, &peer->shm, err);
    if (st != EPX_OK) {
        epxi_error_prefix(err, "GPU EP connect, rank %d: ", rank);
        return st;
    }
    peer->bytes = bytes;
    st = register_data(peer, err);
    if (st != EPX_OK) host_release(peer);
    return st;
}

const epxi_transport_ops epxi_transport_host = {"host",        host_alloc, host_handle,
                                                host_count_in, host_map,   host_release};
