/*
 * bench_comm.h - what the parts of `epx bench comm` share: the parsed
 * arguments, the batch every rank generates, the expected combine of a
 * token, statistics over iterations and the JSON-lines rows.
 */
#ifndef EPX_BENCH_COMM_H
#define EPX_BENCH_COMM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "epx_comm.h"

/* epx_gpu_ep_transport's values, without its CUDA header (checked in bench_ll.c). */
enum {
    EPX_BENCH_TRANSPORT_AUTO = 0,
    EPX_BENCH_TRANSPORT_PEER = 1,
    EPX_BENCH_TRANSPORT_HOST = 2,
    EPX_BENCH_TRANSPORT_NCCL = 3
};

typedef struct bench_args {
    const char *backend, *model;
    epx_moe_config cfg;
    int32_t *tokens, ntok, iters, warmup, redundant, timeout_ms;
    epx_dtype dtype;
    epx_ep_combine_mode combine;
    epx_ep_mode mode;
    bool gpu_engine;    /* --backend nccl in low latency, or normal mode's --engine gpu */
    bool graph;         /* also time CUDA-graph replays (GPU low latency) */
    int32_t transport;  /* GPU low latency: EPX_BENCH_TRANSPORT_* (--transport) */
    int32_t gpus;       /* --gpus N: N ranks as threads of this process (0: not given) */
    bool fp8;           /* GPU low latency: dispatch in DeepEP's fp8 form (--fp8) */
    bool bound_max;     /* GPU low latency: token bound stays max_tokens (--token-bound max) */
    int32_t max_blocks; /* GPU low latency: blocks per launch at most (--max-blocks; 0: fill) */
    const char *jsonl;  /* --json FILE ("-" = stdout), or NULL */
    bool jsonl_newline; /* --json's file ends without a newline: write one first */
    uint64_t seed;
} bench_args;

/* Propagate a failed status (the CLI sees only the public API). */
#define EPX_TRY_CLI(expr)                                                                          \
    do {                                                                                           \
        epx_status try_st_ = (expr);                                                               \
        if (try_st_ != EPX_OK) return try_st_;                                                     \
    } while (0)

/* Rank me's batch of Tmax tokens: K distinct experts per token uniformly
 * at random, the replica by token (slot e + E * j holds expert e), random
 * positive weights and rows in [-2, 2) stored as a->dtype. */
void bench_inputs(const bench_args *a, int32_t me, int32_t P, int64_t Tmax, void *x, int32_t *slots,
                  float *w);

/* The largest of --tokens (at least 1). */
int64_t bench_max_tokens(const bench_args *a);

/* The EP config of the benchmark's layer in `mode`, for Tmax tokens. */
epx_ep_config bench_ep_config(const bench_args *a, int32_t P, int64_t Tmax, epx_ep_mode mode);

/* Element i of a row buffer of a->dtype, as fp32. */
float bench_xval(const bench_args *a, const void *x, size_t i);

/* The combine of token t with identity experts, in the library's order. */
void bench_expect_token(const bench_args *a, int32_t R, int32_t spr, const void *x,
                        const int32_t *s, const float *w, int64_t t, float *o);

/* Median and 99th percentile of n times (sorts t). */
void bench_stats(double *t, int n, double *median, double *p99);

/* One JSON line of the benchmark file: a phase of a mode at T tokens.
 * launches < 0, gbps < 0 and copy_pct < 0 are written as null. Sites name
 * the fields they set (designated initializers): one left out is 0, NULL or
 * false, so a field added here needs no change where it does not apply. */
typedef struct bench_line {
    const char *backend, *mode, *phase, *device, *dtype;
    int32_t ranks, hidden, topk;
    int64_t tokens;
    double median_us, p99_us, gbps, copy_pct;
    int32_t launches;
    bool graph;
    const char *floor; /* mode "floor": which probe ("bare", "flag"); NULL otherwise */
    /* GPU low latency: the engine's transport (NULL: neither is written) and,
     * for the host transport, two pinned copies of the phase's bytes (device
     * to host, host to device) over the phase's time (< 0: null) */
    const char *transport;
    double link_pct;
    int64_t row_bytes;  /* bytes one row takes on the wire in this phase (<= 0: not written) */
    int32_t graph_reps; /* graph figures: iterations per timed replay (0: not written) */
    int64_t
        token_bound; /* the engine's token bound (epx_gpu_ep_set_token_bound; <= 0: not written) */
    /* the ranks were processes sharing GPUs (more ranks on a host than GPUs):
     * their bytes crossed no link between GPUs ("shared_gpu": true) */
    bool shared_gpu;
} bench_line;
int bench_jsonl_write(FILE *f, const bench_line *l);

#if defined(EPX_CLI_HAVE_NCCL) && EPX_CLI_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
/* The GPU low-latency engine on `comm` (the engine's bootstrap: an NCCL
 * communicator on stream s, or an MPI one where ranks share a GPU, nc
 * NULL): check, then time dispatch, combine and the round trip launched
 * (and as graph replays with a->graph), the device copy of the same bytes,
 * and, over NCCL, the TP all-reduce of the same layer; a table on rank 0's
 * stdout and JSON lines to `jl` (rank 0, may be NULL). */
epx_status bench_ll_gpu(epx_comm *comm, ncclComm_t nc, cudaStream_t s, const bench_args *a,
                        FILE *jl, epx_error *err);
#endif

#endif /* EPX_BENCH_COMM_H */
