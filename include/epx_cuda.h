/*
 * epx_cuda.h - epx's GPU entry points (built when the CUDA toolkit is found;
 * link epx_cuda). Every function here:
 *  - takes device pointers (the descriptors themselves are host structs
 *    whose pointer fields point to device memory) and a cudaStream_t, and
 *    only enqueues work on that stream: no allocation, no host
 *    synchronisation, no device-wide state, so a call can be captured into a
 *    CUDA graph and replayed;
 *  - checks every CUDA call it makes and the launch itself
 *    (cudaGetLastError), returning EPX_ERR_CUDA with the CUDA error's name;
 *    errors inside a kernel surface at the caller's next synchronisation;
 *  - computes exactly what its CPU reference in epx/dispatch.h computes:
 *    integer outputs equal, float outputs bitwise equal (the reduction
 *    order is fixed). Inputs the CPU reference rejects cannot be reported
 *    from a kernel: ids outside [-1, E) map to -1, and tables are trusted.
 * Thread:  like CUDA itself: any host thread, one stream per concurrent use.
 */
#ifndef EPX_CUDA_H
#define EPX_CUDA_H

#include <cuda_runtime.h>

#include "epx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- dispatch (the CPU references are in epx/dispatch.h) ----------------- */

/*
 * Map topk_ids [T][K] of one layer to slots phys [T][K], as
 * epx_dispatch_map_ids: static gather, dynamic or weighted (Philox words
 * keyed by seed, pass, layer, token, k), or PHYSICAL (a copy that turns ids
 * outside [0, P) into -1). One launch.
 * Args:    spec (in) host struct with device pointers for its mode;
 *          topk_ids (in, device) [T][K] int32; T >= 0 (below 2^31), K >= 1;
 *          phys (out, device) [T][K] int32.
 * Returns: EPX_OK (T = 0 launches nothing); EPX_ERR_INVALID_ARG (a missing
 *          pointer or a bad mode); EPX_ERR_SHAPE; EPX_ERR_CUDA.
 */
EPX_API epx_status epx_cuda_dispatch_map_ids(const epx_dispatch_spec *spec, const int32_t *topk_ids,
                                             int64_t num_tokens, int32_t topk, int32_t *phys,
                                             cudaStream_t stream, epx_error *err);

/*
 * Map, count and lay out a batch in ONE launch: phys [T][K] as
 * epx_cuda_dispatch_map_ids, then every field of `out` that is non-NULL,
 * exactly as epx_token_layout_compute defines it (tokens per rank and slot,
 * is_token_in_rank, both send orders, their offsets and inverses). The
 * kernel runs as one thread block cluster (1 block up to 64 tokens, else 8)
 * whose blocks exchange their counts through distributed shared memory, so
 * it needs no global workspace and no second launch; tokens_per_slot feeds
 * epx_recorder_add_slot_counts. Leaving all four send-order fields NULL
 * (DeepEP's layout only) skips the ranking pass: about half the time at
 * T = 4096 (bench/RESULTS.md).
 * Args:    spec (in) as above (PHYSICAL when topk_ids are already slots);
 *          topk_ids (in, device) [T][K]; 1 <= K <= 32;
 *          num_physical P, num_gpus G with P % G == 0 (slot p on GPU p / (P/G));
 *          phys (out, device) [T][K] int32, required;
 *          out (in) host struct of device pointers, fields optional.
 * Limits:  ceil(T / 8) * K <= 65535 (per-block counters are 16-bit halves:
 *          T <= 65535 at K = 8), and one block's shared memory, 4 * (P *
 *          (w + 5) + c * (K + 1) + 67) bytes for c = ceil(T / 8) tokens and
 *          w <= 16 warps, within the device's opt-in limit (the c * K term
 *          is dropped, and phys re-read from global memory, when it does not
 *          fit; P up to about 9000). Beyond either, EPX_ERR_UNSUPPORTED
 *          names the limit.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG; EPX_ERR_SHAPE; EPX_ERR_UNSUPPORTED;
 *          EPX_ERR_CUDA.
 */
EPX_API epx_status epx_cuda_dispatch_layout(const epx_dispatch_spec *spec, const int32_t *topk_ids,
                                            int64_t num_tokens, int32_t topk, int32_t num_physical,
                                            int32_t num_gpus, int32_t *phys,
                                            const epx_token_layout *out, cudaStream_t stream,
                                            epx_error *err);

/*
 * Scatter rows of x [T][H] into a send order (out[pos[t][k]] = x[t]), as
 * epx_permute_rows: each row is read once and written to all of its
 * destinations. Rows are moved 16 bytes at a time when H * element size and
 * the pointers allow it.
 * Args:    x (in, device) [T][H] of dtype; pos (in, device) [T][K], entries
 *          in [-1, rows) (not checked); out (out, device) [rows][H].
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG; EPX_ERR_SHAPE; EPX_ERR_CUDA.
 */
EPX_API epx_status epx_cuda_permute_rows(const void *x, epx_row_dtype dtype, int64_t num_tokens,
                                         int64_t hidden, const int32_t *pos, int32_t topk,
                                         void *out, cudaStream_t stream, epx_error *err);

/*
 * The scatter as a gather over a send order, as epx_gather_rows: out[i] =
 * x[order[i] / per_token], zero rows for -1, every row written once (no
 * clearing pass), 16 bytes at a time where the rows allow. An entry outside
 * [-1, T * per_token) cannot be reported from the kernel; it gives a zero
 * row rather than a read out of bounds.
 * Args:    x (in, device) [T][H]; order (in, device) [num_rows] (rank_perm
 *          with per_token 1, slot_perm with per_token K); out (out, device)
 *          [num_rows][H].
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG; EPX_ERR_SHAPE; EPX_ERR_CUDA.
 */
EPX_API epx_status epx_cuda_gather_rows(const void *x, epx_row_dtype dtype, int64_t num_tokens,
                                        int64_t hidden, const int32_t *order, int64_t num_rows,
                                        int32_t per_token, void *out, cudaStream_t stream,
                                        epx_error *err);

/*
 * The weighted combine back into token order, as epx_combine_rows: fp32
 * accumulation by fmaf in k order, bitwise equal to the CPU.
 * Args:    y (in, device) [rows][H] of dtype; pos (in, device) [T][K];
 *          weights (in, device, optional) [T][K] fp32; out (out, device) [T][H].
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG; EPX_ERR_SHAPE; EPX_ERR_CUDA.
 */
EPX_API epx_status epx_cuda_combine_rows(const void *y, epx_row_dtype dtype, int64_t hidden,
                                         const int32_t *pos, const float *weights,
                                         int64_t num_tokens, int32_t topk, void *out,
                                         cudaStream_t stream, epx_error *err);

/* ---- balanced per-batch dispatch (the CPU reference: epx/dispatch.h part 4) */

/*
 * The GPU twin of epx_balancer: a device workspace sized once for (E, W, P,
 * G), so the per-batch calls below allocate nothing. One launch of one
 * thread block per call (two launches of many blocks for a large batch of
 * ids, see epx_cuda_dispatch_balanced_topk) computes exactly what
 * epx_dispatch_balanced_solve and epx_dispatch_balanced_topk compute: the same integer replica counts,
 * slot counts and slots, and bitwise the same shares and GPU loads (the
 * solver is one source for both, src/dispatch/balanced_solve.h). Inputs
 * the CPU reference rejects are not reported: ids outside [-1, E) are
 * skipped and map to -1, negative counts count as 0, and the tables are
 * trusted (a slot listed twice gives an unspecified but in-bounds result).
 * A handle serves every layer (the tables are arguments) but one stream at
 * a time: calls on one stream are ordered, calls on two would share the
 * workspace.
 */
typedef struct epx_cuda_balancer epx_cuda_balancer;

/* Size a GPU balancer on the current device (cudaMalloc of the workspace:
 * a few hundred kB at E = 384, and a zeroed counter, waited for on the
 * default stream); E, W, P, G as epx_dispatch_balanced_create. Its kernels
 * are launched with programmatic dependent launch (each may be scheduled
 * while the kernel before it in the stream ends, and waits for it before
 * touching memory); EPX_BALANCED_PDL=0 launches them plainly.
 * Returns: EPX_OK; EPX_ERR_SHAPE; EPX_ERR_INVALID_ARG (a malformed
 * EPX_BALANCED_SUBSET_GPUS, EPX_BALANCED_GRID_PAIRS,
 * EPX_BALANCED_CLOSED_FORM or EPX_BALANCED_PDL); EPX_ERR_NOMEM;
 * EPX_ERR_CUDA. */
EPX_API epx_status epx_cuda_dispatch_balanced_create(int32_t num_experts, int32_t width,
                                                     int32_t num_physical, int32_t num_gpus,
                                                     epx_cuda_balancer **out, epx_error *err);
/* Free the workspace (cudaFree: after the work that uses it). NULL is fine. */
EPX_API void epx_cuda_dispatch_balanced_destroy(epx_cuda_balancer *b);

/* What a GPU solve writes: device pointers, each optional (NULL = not
 * wanted); the fields as epx_balanced_out's arrays. summary [5] int64:
 * max_load_num, max_load_den, max_load_int, num_levels, and a status that
 * is 0 unless the solver met a broken invariant (never on valid input;
 * the CPU reference names it as EPX_ERR_INTERNAL). */
typedef struct epx_cuda_balanced_out {
    double *shares;          /* [E][W] */
    int64_t *replica_counts; /* [E][W] */
    int64_t *slot_counts;    /* [P]    */
    double *gpu_load;        /* [G]    */
    int64_t *summary;        /* [5]    */
} epx_cuda_balanced_out;

/*
 * The balanced split from tokens per logical expert (e.g. all-reduced
 * across ranks, as SGLang's lp dispatch does): epx_dispatch_balanced_solve
 * on the device. One launch, 1024 threads.
 * Args:    b (in/out) the GPU balancer; replicas (in, device) [E][W] int32;
 *          num_valid (in, device) [E] int32; counts (in, device) [E] int64
 *          (at most 2^40 in all); out (in) host struct of device pointers.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (a missing pointer); EPX_ERR_CUDA.
 */
EPX_API epx_status epx_cuda_dispatch_balanced_solve(epx_cuda_balancer *b, const int32_t *replicas,
                                                    const int32_t *num_valid, const int64_t *counts,
                                                    const epx_cuda_balanced_out *out,
                                                    cudaStream_t stream, epx_error *err);

/*
 * Count, solve and route one layer's batch in one launch: phys [T][K] as
 * epx_dispatch_balanced_topk gives it (expert e's pairs in (t, k) order
 * fill its replica columns in order by the integer counts), and `out`'s
 * fields as the solve above. From T * K = 4,096 pairs up (the environment
 * variable EPX_BALANCED_GRID_PAIRS, read by the create, moves that bound;
 * 0: always) the counting and routing run on many blocks, in two launches
 * on `stream`; the result is the same.
 * Args:    topk_ids (in, device) [T][K] int32, T * K below 2^31; phys (out,
 *          device) [T][K] int32; out (in, optional) host struct of device
 *          pointers; the rest as epx_cuda_dispatch_balanced_solve.
 * Limits:  the block keeps one row of E counters per warp in shared
 *          memory (up to 32 warps): E up to about 58000 on an H200, else
 *          EPX_ERR_UNSUPPORTED.
 * Returns: EPX_OK (T = 0 still writes the outputs); EPX_ERR_INVALID_ARG;
 *          EPX_ERR_SHAPE; EPX_ERR_UNSUPPORTED; EPX_ERR_CUDA.
 */
EPX_API epx_status epx_cuda_dispatch_balanced_topk(epx_cuda_balancer *b, const int32_t *replicas,
                                                   const int32_t *num_valid,
                                                   const int32_t *topk_ids, int64_t num_tokens,
                                                   int32_t topk, int32_t *phys,
                                                   const epx_cuda_balanced_out *out,
                                                   cudaStream_t stream, epx_error *err);

#ifdef __cplusplus
}
#endif
#endif /* EPX_CUDA_H */
