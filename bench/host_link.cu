/*
 * host_link.cu - how fast the GPU reaches pinned host memory on this
 * machine, by three means, for the host-memory transport (issue 26):
 *   copy    cudaMemcpyAsync (the copy engines), device <-> host
 *   store   a kernel's 16-byte stores from the SMs into host memory
 *   load    a kernel's 16-byte loads from host memory into device memory
 * each into memory from cudaHostAlloc and into POSIX shared memory pinned
 * with cudaHostRegister (what transport_host.cu uses), at the byte counts
 * of one low-latency phase (Kimi-K2.5 rows: 14,336 bytes times T tokens
 * times top-8), with 1 to 132 blocks. The question it answers: are the SMs'
 * stores slow by nature here, or only into registered shared memory, or
 * only with few blocks in flight.
 *
 *   host_link [--iters N]   one line per (memory, means, bytes, blocks):
 *                           median µs and GB/s over N timed repetitions
 */
#include <cuda_runtime.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <stdint.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "host_link: %s: %s (%s:%d)\n", #call, cudaGetErrorString(e_),          \
                    __FILE__, __LINE__);                                                           \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Blocks stride over 16-byte words: consecutive threads, consecutive words. */
__global__ void store_words(int4 *__restrict__ dst, const int4 *__restrict__ src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
    /* what the transport does before its flag: the stores reach the host */
    __threadfence_system();
}

/* Whether `bytes` at host (or at dev, a device pointer) equal those at ref. */
static bool same_bytes(const void *host, const void *dev, const void *ref, size_t bytes) {
    std::vector<unsigned char> a(bytes), b(bytes);
    CK(cudaMemcpy(a.data(), ref, bytes, cudaMemcpyDeviceToHost));
    if (dev != nullptr)
        CK(cudaMemcpy(b.data(), dev, bytes, cudaMemcpyDeviceToHost));
    else
        memcpy(b.data(), host, bytes);
    return memcmp(a.data(), b.data(), bytes) == 0;
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char **argv) {
    int iters = 20;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
            iters = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: host_link [--iters N]\n");
            return 2;
        }
    }
    if (iters < 1) {
        fprintf(stderr, "host_link: --iters must be at least 1\n");
        return 2;
    }
    const size_t row = 14336, maxb = row * 128 * 8;
    void *dev_a, *dev_b;
    CK(cudaMalloc(&dev_a, maxb));
    CK(cudaMalloc(&dev_b, maxb));
    { /* a pattern that tells every 4-byte word from its neighbours */
        std::vector<uint32_t> pat(maxb / 4);
        for (size_t i = 0; i < pat.size(); i++) pat[i] = (uint32_t)i * 2654435761u;
        CK(cudaMemcpy(dev_a, pat.data(), maxb, cudaMemcpyHostToDevice));
    }
    CK(cudaMemset(dev_b, 0, maxb));
    void *alloc_h;
    CK(cudaHostAlloc(&alloc_h, maxb, cudaHostAllocMapped | cudaHostAllocPortable));
    /* shared memory as transport_host.cu pins it */
    char name[64];
    snprintf(name, sizeof name, "/epx-host-link-%d", (int)getpid());
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)maxb) != 0) {
        perror("host_link: shm");
        return 1;
    }
    void *shm_h = mmap(NULL, maxb, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    shm_unlink(name);
    if (shm_h == MAP_FAILED) {
        perror("host_link: mmap");
        return 1;
    }
    memset(shm_h, 0, maxb);
    CK(cudaHostRegister(shm_h, maxb, cudaHostRegisterMapped | cudaHostRegisterPortable));
    struct mem {
        const char *name;
        void *host;
    } mems[2] = {{"hostalloc", alloc_h}, {"shm", shm_h}};
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int tokens[] = {1, 8, 32, 128};
    const int blocks[] = {1, 8, 32, 132, 264};
    printf("memory     means  tokens      bytes  blocks   median_us    GB/s\n");
    for (const mem &m : mems) {
        void *mdev;
        CK(cudaHostGetDevicePointer(&mdev, m.host, 0));
        for (int t : tokens) {
            const size_t bytes = row * (size_t)t * 8;
            for (int means = 0; means < 4; means++) { /* copy d2h, copy h2d, store, load */
                const int nb = means < 2 ? 1 : (int)(sizeof blocks / sizeof blocks[0]);
                for (int bi = 0; bi < nb; bi++) {
                    std::vector<double> us;
                    for (int it = 0; it < iters + 2; it++) {
                        CK(cudaEventRecord(e0, s));
                        if (means == 0)
                            CK(cudaMemcpyAsync(m.host, dev_a, bytes, cudaMemcpyDeviceToHost, s));
                        else if (means == 1)
                            CK(cudaMemcpyAsync(dev_b, m.host, bytes, cudaMemcpyHostToDevice, s));
                        else if (means == 2)
                            store_words<<<blocks[bi], 512, 0, s>>>((int4 *)mdev,
                                                                   (const int4 *)dev_a, bytes / 16);
                        else
                            store_words<<<blocks[bi], 512, 0, s>>>((int4 *)dev_b,
                                                                   (const int4 *)mdev, bytes / 16);
                        CK(cudaGetLastError());
                        CK(cudaEventRecord(e1, s));
                        CK(cudaEventSynchronize(e1));
                        float ms = 0.0f;
                        CK(cudaEventElapsedTime(&ms, e0, e1));
                        if (it >= 2) us.push_back(ms * 1000.0);
                    }
                    /* checked before it counts: the destination holds dev_a's bytes
                     * (the host side was last written from dev_a too) */
                    if (!same_bytes(means == 0 || means == 2 ? m.host : nullptr,
                                    means == 1 || means == 3 ? dev_b : nullptr, dev_a, bytes)) {
                        fprintf(stderr, "host_link: %s %d bytes into %s: wrong bytes\n",
                                means == 0   ? "d2h"
                                : means == 1 ? "h2d"
                                : means == 2 ? "store"
                                             : "load",
                                (int)bytes, m.name);
                        return 1;
                    }
                    const double med = median(us);
                    static const char *names[] = {"d2h", "h2d", "store", "load"};
                    printf("%-10s %-6s %6d %10zu %7d %11.2f %7.2f\n", m.name, names[means], t,
                           bytes, means < 2 ? 0 : blocks[bi], med, bytes / med / 1e3);
                }
            }
        }
    }
    CK(cudaHostUnregister(shm_h));
    munmap(shm_h, maxb);
    CK(cudaFreeHost(alloc_h));
    CK(cudaFree(dev_a));
    CK(cudaFree(dev_b));
    return 0;
}
