/*
 * pdl.cuh - programmatic dependent launch (Hopper) for libepx's kernels that
 * sit in a serving engine's stream between other kernels: the GPU EP
 * engine's dispatch and combine, the balanced-routing kernels. A kernel
 * launched with it (epxi_launch_pdl) may be scheduled while the kernel
 * ahead of it in the stream ends, so its launch overlaps that kernel's
 * last blocks; epxi_pdl_wait (griddepcontrol.wait) holds every thread
 * until that kernel has ended and its writes are visible, so it comes
 * before any global load or store, and returns at once in a launch
 * without the attribute. No kernel lets the next one launch early
 * (griddepcontrol.launch_dependents): blocks parked beside a running
 * kernel cost more than the launch they hid (bench/RESULTS.md), and on a
 * GPU shared by ranks could keep a peer's blocks off the SMs. CUDA
 * sources only; their on/off switches are read with epxi_env_switch.
 */
#ifndef EPX_PDL_CUH
#define EPX_PDL_CUH

#include <cuda_runtime.h>
#include <utility>

__device__ __forceinline__ void epxi_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* kernel<<<grid, threads, smem, stream>>>(args...), with programmatic
 * dependent launch when pdl is nonzero. */
template <typename... P, typename... A>
static cudaError_t epxi_launch_pdl(int pdl, void (*kernel)(P...), unsigned grid, unsigned threads,
                                   size_t smem, cudaStream_t stream, A &&...args) {
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3(grid);
    c.blockDim = dim3(threads);
    c.dynamicSmemBytes = smem;
    c.stream = stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    c.attrs = at;
    c.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&c, kernel, std::forward<A>(args)...);
}

#endif
