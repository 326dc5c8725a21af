/*
 * global_timer.cuh - the GPU's global nanosecond timer, which the engine's
 * timeouts and stamps (ll_device.cuh) and the floor probes (ll_floor.cu)
 * read; one definition for the CUDA sources of src/comm/gpu/.
 */
#pragma once

namespace {

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

} // namespace
