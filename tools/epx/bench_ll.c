/*
 * bench_ll.c - `epx bench comm --backend nccl` with the GPU engine
 * (epx_comm_gpu.h) in either mode: low latency (the expert-major receive)
 * or normal (the compact receive, --mode normal), timed on the stream with
 * CUDA events.
 *
 * Per token count T: check first (identity experts must give the fixed-order
 * weighted sum bit for bit on every rank), then time, each iteration after
 * a barrier on an idle stream:
 *   dispatch    events around the dispatch launch (or its graph);
 *   combine     after a dispatch and the identity experts, around combine;
 *   round-trip  around dispatch + combine back to back (no experts);
 * launched, and with --graph as replays of graphs captured once per T.
 * A graph holds kGraphReps iterations of its phase back to back and its
 * figure is the replay's time over kGraphReps: the cost of one iteration
 * inside a graph, as a serving engine's one graph per forward pass runs
 * it, not a graph's start-up from an idle GPU (a few us, paid once per
 * forward pass). The replay is queued behind a hold kernel that the host
 * releases once the events and the replay are enqueued (epxi_ll_hold), so
 * the host's cudaGraphLaunch is not timed either. Launched figures are one
 * iteration with the host's launches, as an eager caller pays them. The
 * same bytes moved by cudaMemcpyAsync device to device give the copy
 * ceiling (copy_pct); NCCL's all-reduce of the TP layer (R * T rows) is
 * timed the same way. Figures are the slowest rank's per iteration, then
 * the median and 99th percentile over iterations.
 *
 * Beside them, the floor (issue 24, ll_floor.cu): two bare kernels that
 * move the same round trip's bytes on this GPU, and the same two with a
 * minimal flag protocol, launched and as graphs (mode "floor"); the table
 * ends each token count with the engine's round trip as multiples of both.
 * Over the NCCL transport a third floor, "nccl" (issue 26), puts NCCL's own
 * part beside them: the bare kernels with, after the dispatch's and before
 * the combine's, one ncclSend/ncclRecv group to every rank of as many
 * bytes per peer as the engine's staged blocks (epxi_gpu_ep_staged_bytes),
 * between buffers of its own. The engine's staged phase is that plus its
 * second kernel, so the floor says how far NCCL alone leaves the engine
 * from the pointers.
 */
#include "bench_comm.h"

#if defined(EPX_CLI_HAVE_NCCL) && EPX_CLI_HAVE_NCCL
#include <stdlib.h>
#include <string.h>

#include "epx_comm_gpu.h"
#include "epx_comm_nccl.h"
#include "epx/dispatch.h"

_Static_assert((int)EPX_BENCH_TRANSPORT_AUTO == (int)EPX_GPU_EP_TRANSPORT_AUTO &&
                   (int)EPX_BENCH_TRANSPORT_PEER == (int)EPX_GPU_EP_TRANSPORT_PEER &&
                   (int)EPX_BENCH_TRANSPORT_HOST == (int)EPX_GPU_EP_TRANSPORT_HOST &&
                   (int)EPX_BENCH_TRANSPORT_NCCL == (int)EPX_GPU_EP_TRANSPORT_NCCL,
               "bench_comm.h's transports are epx_gpu_ep_transport's");

void epxi_gpu_ep_variant(epx_gpu_ep *ep, int bits);
int epxi_gpu_ep_stamps(epx_gpu_ep *ep, double *us);
typedef struct epxi_ll_floor epxi_ll_floor;
int epxi_ll_floor_create(int32_t H, int32_t K, int64_t M, cudaStream_t s, epxi_ll_floor **out);
int epxi_ll_floor_run(epxi_ll_floor *fl, int phase, int flag, int64_t T);
int epxi_ll_floor_fault(epxi_ll_floor *fl);
int epxi_ll_hold(cudaStream_t s, const int *gate);
void epxi_ll_floor_destroy(epxi_ll_floor *fl);
size_t epxi_gpu_ep_staged_bytes(const epx_gpu_ep *ep, int phase);
ncclResult_t epxi_nccl_swap(ncclComm_t comm, const unsigned char *outbox, unsigned char *inbox,
                            int32_t R, size_t off, size_t stride, size_t bytes, void *s);

typedef struct ll_run {
    epx_comm *comm;
    cudaStream_t s;
    const bench_args *a;
    epx_gpu_ep *ep;
    cudaEvent_t e0, e1;
    void *dx, *dtp, *csrc, *cdst;
    void *hpin;            /* pinned host bytes: the host transport's link ceiling (PH_LINK) */
    const char *transport; /* epx_gpu_ep_transport_name */
    int variant;           /* EPX_LL_VARIANT (ll_variant), 0 when unset */
    int split;             /* its bit 256: dispatch as its send, then its receive */
    int32_t *ds;
    float *dw, *dout;
    int64_t *dsum;
    double *t;
    cudaGraphExec_t g[4]; /* dispatch, identity, combine, round trip */
    epxi_ll_floor *fl;
    cudaGraphExec_t fg[3][3]; /* floor [bare, flag, nccl][dispatch, combine, round trip] */
    ncclComm_t nc;            /* the NCCL transport's communicator, else NULL */
    unsigned char *nbox;      /* the nccl floor's send and receive blocks */
    size_t nbox_bytes;
    volatile int *gate; /* host-mapped: opens the hold before a timed replay */
    const int *gate_dev;
    int64_t Tmax;  /* the engine's max_tokens: the largest --tokens */
    int64_t bound; /* its token bound for the batch size being timed */
} ll_run;

/* EPX_LL_VARIANT, the engine's measurement variants (docs/ENVIRONMENT.md):
 * unset or empty is 0; anything but a whole number from 0 is refused by
 * name rather than timed as some other variant. */
static epx_status ll_variant(int *variant, epx_error *err) {
    const char *v = getenv("EPX_LL_VARIANT");
    *variant = 0;
    if (v == NULL || *v == '\0') return EPX_OK;
    const size_t len = strspn(v, "0123456789");
    if (v[len] != '\0' || len > 9) {
        err->status = EPX_ERR_INVALID_ARG;
        snprintf(err->msg, sizeof err->msg,
                 "EPX_LL_VARIANT=%.32s: give the variant bits as a whole number (0, the default, "
                 "or e.g. 8 for block 0's stamps), or leave it unset",
                 v);
        return EPX_ERR_INVALID_ARG;
    }
    *variant = (int)strtol(v, NULL, 10);
    return EPX_OK;
}

enum { PH_DISPATCH, PH_COMBINE, PH_ROUND_TRIP, PH_ALLREDUCE, PH_COPY, PH_LINK };

/* Iterations of a phase in one timed graph (a dispatch may follow a
 * dispatch and a combine a combine: DeepEP's double buffer, which the
 * engine keeps). */
enum { kGraphReps = 8 };

#define CUDA_OR(call, what)                                                                        \
    do {                                                                                           \
        cudaError_t ce_ = (call);                                                                  \
        if (ce_ != cudaSuccess) {                                                                  \
            err->status = EPX_ERR_CUDA;                                                            \
            snprintf(err->msg, sizeof err->msg, "bench: %s: %s", what, cudaGetErrorString(ce_));   \
            return EPX_ERR_CUDA;                                                                   \
        }                                                                                          \
    } while (0)

/* Before a timed replay: close the gate and queue the hold on the stream. */
static epx_status hold(ll_run *b, epx_error *err) {
    *b->gate = 0;
    if (epxi_ll_hold(b->s, b->gate_dev) != 0) {
        err->status = EPX_ERR_CUDA;
        snprintf(err->msg, sizeof err->msg, "bench: the hold kernel failed to launch");
        return EPX_ERR_CUDA;
    }
    return EPX_OK;
}

/* A timed iteration starts: the hold (graph replays only) and the start
 * event. The caller queues the work and records b->e1 after it. */
static epx_status timed_begin(ll_run *b, bool graph, epx_error *err) {
    if (graph) EPX_TRY_CLI(hold(b, err));
    CUDA_OR(cudaEventRecord(b->e0, b->s), "event");
    return EPX_OK;
}

/* ... and ends: open the gate, wait for b->e1, µs per iteration (a graph
 * holds kGraphReps iterations). */
static epx_status timed_end(ll_run *b, bool graph, double *us, epx_error *err) {
    *b->gate = 1; /* everything is queued: the replay starts as the hold ends */
    CUDA_OR(cudaEventSynchronize(b->e1), "event");
    float ms = 0.0f;
    CUDA_OR(cudaEventElapsedTime(&ms, b->e0, b->e1), "event time");
    *us = (double)ms * 1000.0 / (graph ? kGraphReps : 1);
    return EPX_OK;
}

/* Sum int64 values over ranks, through the communicator: on the device for
 * NCCL's, in place for MPI's (ranks sharing a GPU, bench_ll_gpu). */
static epx_status sum_dev(ll_run *b, int64_t *v, int64_t n, epx_error *err) {
    if (epx_comm_memory_kind(b->comm) == EPX_COMM_MEMORY_HOST)
        return epx_comm_allreduce_sum(b->comm, v, v, n, EPX_DTYPE_I64, err);
    CUDA_OR(cudaMemcpy(b->dsum, v, (size_t)n * 8, cudaMemcpyHostToDevice), "sum upload");
    EPX_TRY_CLI(epx_comm_allreduce_sum(b->comm, b->dsum, b->dsum, n, EPX_DTYPE_I64, err));
    EPX_TRY_CLI(epx_comm_wait(b->comm, err));
    CUDA_OR(cudaMemcpy(v, b->dsum, (size_t)n * 8, cudaMemcpyDeviceToHost), "sum download");
    return EPX_OK;
}

/* One batch's work, launched or as graphs. */
static epx_status run_dispatch(ll_run *b, int64_t T, bool graph, epx_error *err) {
    epx_ep_recv rv;
    if (graph) {
        CUDA_OR(cudaGraphLaunch(b->g[0], b->s), "graph launch");
        return EPX_OK;
    }
    const int fp8 = b->a->fp8 ? EPX_GPU_EP_FP8 : 0;
    /* EPX_LL_VARIANT bit 256 (measuring): the send and the receive as two
     * launches, so the receive's own time shows apart from the send's */
    if (b->split) {
        EPX_TRY_CLI(epx_gpu_ep_dispatch_parts(b->ep, EPX_GPU_EP_SEND | fp8, T, b->dx, b->ds, b->dw,
                                              NULL, err));
        return epx_gpu_ep_dispatch_parts(b->ep, EPX_GPU_EP_RECV, T, b->dx, b->ds, b->dw, &rv, err);
    }
    return epx_gpu_ep_dispatch_parts(b->ep, EPX_GPU_EP_SEND | EPX_GPU_EP_RECV | fp8, T, b->dx,
                                     b->ds, b->dw, &rv, err);
}
static epx_status run_identity(ll_run *b, bool graph, epx_error *err) {
    if (graph) {
        CUDA_OR(cudaGraphLaunch(b->g[1], b->s), "graph launch");
        return EPX_OK;
    }
    return epx_gpu_ep_identity_experts(b->ep, err);
}
static epx_status run_combine(ll_run *b, bool graph, epx_error *err) {
    if (graph) {
        CUDA_OR(cudaGraphLaunch(b->g[2], b->s), "graph launch");
        return EPX_OK;
    }
    return epx_gpu_ep_combine(b->ep, b->dout, err);
}

/* Capture the four graphs of T tokens: dispatch, combine and round trip
 * kGraphReps times each, the identity experts once. */
static epx_status capture(ll_run *b, int64_t T, epx_error *err) {
    for (int i = 0; i < 4; i++) {
        cudaGraph_t g;
        CUDA_OR(cudaStreamBeginCapture(b->s, cudaStreamCaptureModeThreadLocal), "capture");
        epx_status st = EPX_OK;
        for (int rep = 0; rep < (i == 1 ? 1 : kGraphReps) && st == EPX_OK; rep++) {
            if (i == 0 || i == 3) st = run_dispatch(b, T, false, err);
            if (st == EPX_OK && i == 1) st = run_identity(b, false, err);
            if (st == EPX_OK && (i == 2 || i == 3)) st = run_combine(b, false, err);
        }
        cudaError_t ce = cudaStreamEndCapture(b->s, &g);
        if (st != EPX_OK) return st;
        CUDA_OR(ce, "end capture");
        if (b->g[i]) cudaGraphExecDestroy(b->g[i]);
        CUDA_OR(cudaGraphInstantiate(&b->g[i], g, 0), "graph instantiate");
        cudaGraphDestroy(g);
    }
    return EPX_OK;
}

/* Time one phase over warmup + iters iterations; the slowest rank's time
 * per iteration, then median and p99. */
static epx_status time_phase(ll_run *b, int phase, int64_t T, bool graph, size_t bytes,
                             double *median, double *p99, epx_error *err) {
    const bench_args *a = b->a;
    const int n = a->warmup + a->iters;
    const int64_t ne = (int64_t)epx_comm_size(b->comm) * T * a->cfg.hidden;
    for (int it = 0; it < n; it++) {
        EPX_TRY_CLI(epx_comm_barrier(b->comm, err));
        if (phase == PH_COMBINE) {
            EPX_TRY_CLI(run_dispatch(b, T, graph, err));
            EPX_TRY_CLI(run_identity(b, graph, err));
            EPX_TRY_CLI(epx_gpu_ep_sync(b->ep, err));
            EPX_TRY_CLI(epx_comm_barrier(b->comm, err));
        }
        EPX_TRY_CLI(timed_begin(b, graph, err));
        switch (phase) {
        case PH_DISPATCH: EPX_TRY_CLI(run_dispatch(b, T, graph, err)); break;
        case PH_COMBINE: EPX_TRY_CLI(run_combine(b, graph, err)); break;
        case PH_ROUND_TRIP:
            if (graph) {
                CUDA_OR(cudaGraphLaunch(b->g[3], b->s), "graph launch");
            } else {
                EPX_TRY_CLI(run_dispatch(b, T, false, err));
                EPX_TRY_CLI(run_combine(b, false, err));
            }
            break;
        case PH_ALLREDUCE:
            EPX_TRY_CLI(epx_comm_allreduce_sum(b->comm, b->dtp, b->dtp, ne, a->dtype, err));
            break;
        case PH_LINK: /* the host transport's two crossings, as pinned copies */
            CUDA_OR(cudaMemcpyAsync(b->hpin, b->csrc, bytes, cudaMemcpyDeviceToHost, b->s),
                    "pinned copy");
            CUDA_OR(cudaMemcpyAsync(b->cdst, b->hpin, bytes, cudaMemcpyHostToDevice, b->s),
                    "pinned copy");
            break;
        default:
            CUDA_OR(cudaMemcpyAsync(b->cdst, b->csrc, bytes, cudaMemcpyDeviceToDevice, b->s),
                    "copy");
        }
        CUDA_OR(cudaEventRecord(b->e1, b->s), "event");
        if (phase == PH_DISPATCH) { /* finish the batch: peers wait for our combine */
            EPX_TRY_CLI(run_identity(b, graph, err));
            EPX_TRY_CLI(run_combine(b, graph, err));
        }
        EPX_TRY_CLI(timed_end(b, graph, &b->t[it], err));
        EPX_TRY_CLI(epx_gpu_ep_sync(b->ep, err));
    }
    /* The slowest rank per iteration. */
    const int32_t R = epx_comm_size(b->comm), me = epx_comm_rank(b->comm);
    int64_t *ns = calloc((size_t)R * (size_t)a->iters, sizeof(int64_t));
    if (ns == NULL) return EPX_ERR_NOMEM;
    for (int it = 0; it < a->iters; it++)
        ns[(size_t)me * a->iters + it] = (int64_t)(b->t[a->warmup + it] * 1000.0);
    epx_status st = R > 1 ? sum_dev(b, ns, (int64_t)R * a->iters, err) : EPX_OK;
    for (int it = 0; it < a->iters && st == EPX_OK; it++) {
        int64_t mx = 0;
        for (int32_t r = 0; r < R; r++)
            if (ns[(size_t)r * a->iters + it] > mx) mx = ns[(size_t)r * a->iters + it];
        b->t[it] = (double)mx / 1000.0;
    }
    free(ns);
    if (st == EPX_OK) bench_stats(b->t, a->iters, median, p99);
    return st;
}

enum { FLOOR_BARE, FLOOR_FLAG, FLOOR_NCCL, FLOOR_KINDS };

/* The nccl floor's exchange of phase ph (0 dispatch, 1 combine): to and
 * from every rank, the engine's staged bytes per peer. */
static int nccl_floor_exchange(ll_run *b, int ph) {
    const int32_t R = epx_comm_size(b->comm);
    const size_t n = epxi_gpu_ep_staged_bytes(b->ep, ph);
    return epxi_nccl_swap(b->nc, b->nbox, b->nbox + (size_t)R * n, R, 0, n, n, b->s) != ncclSuccess;
}

/* One floor probe's phase (0 dispatch, 1 combine, 2 both) on the stream;
 * the nccl floor runs the bare kernels around its exchanges. */
static epx_status floor_launch(ll_run *b, int kind, int phase, int64_t T, bool graph,
                               epx_error *err) {
    if (graph) {
        CUDA_OR(cudaGraphLaunch(b->fg[kind][phase], b->s), "floor graph launch");
        return EPX_OK;
    }
    const int flag = kind == FLOOR_FLAG, nccl = kind == FLOOR_NCCL;
    int rc = 0;
    if (phase != 1) rc |= epxi_ll_floor_run(b->fl, 0, flag, T);
    if (phase != 1 && nccl) rc |= nccl_floor_exchange(b, 0);
    if (phase != 0 && nccl) rc |= nccl_floor_exchange(b, 1);
    if (phase != 0) rc |= epxi_ll_floor_run(b->fl, 1, flag, T);
    if (rc != 0) {
        err->status = EPX_ERR_CUDA;
        snprintf(err->msg, sizeof err->msg, "bench: a floor probe failed to launch");
        return EPX_ERR_CUDA;
    }
    return EPX_OK;
}

/* Time a floor probe like time_phase times the engine (this rank alone:
 * the bare and flag probes do not communicate; the nccl probe's groups
 * pair with the other ranks', which time theirs in the same steps). */
static epx_status time_floor(ll_run *b, int kind, int phase, int64_t T, bool graph, double *median,
                             double *p99, epx_error *err) {
    const bench_args *a = b->a;
    if (graph && b->fg[kind][phase] == NULL) {
        cudaGraph_t g;
        CUDA_OR(cudaStreamBeginCapture(b->s, cudaStreamCaptureModeThreadLocal), "floor capture");
        epx_status st = EPX_OK;
        for (int rep = 0; rep < kGraphReps && st == EPX_OK; rep++)
            st = floor_launch(b, kind, phase, T, false, err);
        cudaError_t ce = cudaStreamEndCapture(b->s, &g);
        if (st != EPX_OK) return st;
        CUDA_OR(ce, "floor end capture");
        ce = cudaGraphInstantiate(&b->fg[kind][phase], g, 0);
        cudaGraphDestroy(g);
        CUDA_OR(ce, "floor graph instantiate");
    }
    for (int it = 0; it < a->warmup + a->iters; it++) {
        EPX_TRY_CLI(timed_begin(b, graph, err));
        EPX_TRY_CLI(floor_launch(b, kind, phase, T, graph, err));
        CUDA_OR(cudaEventRecord(b->e1, b->s), "event");
        EPX_TRY_CLI(timed_end(b, graph, &b->t[it], err));
    }
    if (epxi_ll_floor_fault(b->fl)) {
        err->status = EPX_ERR_INTERNAL;
        snprintf(err->msg, sizeof err->msg, "bench: a flag floor probe timed out at %lld tokens",
                 (long long)T);
        return EPX_ERR_INTERNAL;
    }
    memmove(b->t, b->t + a->warmup, (size_t)a->iters * sizeof(double));
    bench_stats(b->t, a->iters, median, p99);
    return EPX_OK;
}

/* The nccl floor's blocks, 2 R times the larger phase's staged bytes, grown
 * when a larger token bound needs more (bench_floor has dropped the graphs
 * that held the old ones). */
static epx_status nccl_floor_boxes(ll_run *b, epx_error *err) {
    const size_t d = epxi_gpu_ep_staged_bytes(b->ep, 0), c = epxi_gpu_ep_staged_bytes(b->ep, 1);
    const size_t need = 2 * (size_t)epx_comm_size(b->comm) * (d > c ? d : c);
    if (need <= b->nbox_bytes) return EPX_OK;
    cudaFree(b->nbox);
    b->nbox = NULL;
    b->nbox_bytes = 0;
    CUDA_OR(cudaMalloc((void **)&b->nbox, need), "the nccl floor's blocks");
    CUDA_OR(cudaMemset(b->nbox, 0, need), "the nccl floor's blocks");
    b->nbox_bytes = need;
    return EPX_OK;
}

/* The floor rows of T tokens (JSON mode "floor") and the engine's round
 * trip as multiples of them; eng[g] is the engine's round trip median,
 * launched (g = 0) and as a graph (g = 1). */
static epx_status bench_floor(ll_run *b, int64_t T, const double *eng, FILE *jl, const char *device,
                              epx_error *err) {
    const bench_args *a = b->a;
    /* The probes' own bytes: T * K bf16 rows written (dispatch), read (combine). */
    const size_t moved = (size_t)T * (size_t)a->cfg.top_k * (size_t)a->cfg.hidden * 2;
    const size_t bytes[3] = {moved, moved, 2 * moved};
    const char *names[3] = {"dispatch", "combine", "round-trip"};
    const char *fname[FLOOR_KINDS] = {"bare", "flag", "nccl"};
    double rt[FLOOR_KINDS][2] = {{0, 0}, {0, 0}, {0, 0}};
    for (int i = 0; i < FLOOR_KINDS; i++)
        for (int j = 0; j < 3; j++) {
            if (b->fg[i][j]) cudaGraphExecDestroy(b->fg[i][j]);
            b->fg[i][j] = NULL;
        }
    const int kinds = b->nc != NULL ? FLOOR_KINDS : FLOOR_NCCL;
    if (b->nc != NULL) EPX_TRY_CLI(nccl_floor_boxes(b, err));
    for (int kind = 0; kind < kinds; kind++)
        for (int ph = 0; ph < 3; ph++)
            for (int gi = 0; gi < (a->graph ? 2 : 1); gi++) {
                double med = 0, p99 = 0;
                EPX_TRY_CLI(time_floor(b, kind, ph, T, gi == 1, &med, &p99, err));
                if (ph == 2) rt[kind][gi] = med;
                if (epx_comm_rank(b->comm) != 0) continue;
                printf("%8lld  %-10s %-6s %9.2f %9.2f %10.1f %8s  floor (%s)\n", (long long)T,
                       names[ph], gi ? "graph" : "launch", med, p99,
                       bytes[ph] > 0 ? (double)bytes[ph] / med * 1e-3 : 0.0, "-", fname[kind]);
                const int nccl = kind == FLOOR_NCCL;
                bench_line l = {.backend = a->backend,
                                .mode = "floor",
                                .phase = names[ph],
                                .device = device,
                                .dtype = "bf16",
                                .ranks = nccl ? epx_comm_size(b->comm) : 1,
                                .hidden = a->cfg.hidden,
                                .topk = a->cfg.top_k,
                                .tokens = T,
                                .median_us = med,
                                .p99_us = p99,
                                .gbps = bytes[ph] > 0 ? (double)bytes[ph] / med * 1e-3 : -1.0,
                                .copy_pct = -1.0,
                                .launches = (ph == 2 ? 2 : 1) * (nccl ? 2 : 1),
                                .graph = gi == 1,
                                .floor = fname[kind],
                                .transport = nccl ? "nccl" : NULL,
                                .link_pct = -1.0,
                                .graph_reps = gi == 1 ? kGraphReps : 0,
                                .token_bound = nccl ? b->bound : 0};
                if (jl != NULL && bench_jsonl_write(jl, &l) != 0) {
                    err->status = EPX_ERR_IO;
                    snprintf(err->msg, sizeof err->msg, "bench: writing the JSON lines failed");
                    return EPX_ERR_IO;
                }
            }
    if (epx_comm_rank(b->comm) == 0)
        for (int gi = 0; gi < (a->graph ? 2 : 1); gi++) {
            if (eng[gi] <= 0 || rt[FLOOR_BARE][gi] <= 0 || rt[FLOOR_FLAG][gi] <= 0) continue;
            printf("%8lld  round trip %-6s engine %.2f us = %.2fx the bare kernels, %.2fx the "
                   "flag protocol",
                   (long long)T, gi ? "graph" : "launch", eng[gi], eng[gi] / rt[FLOOR_BARE][gi],
                   eng[gi] / rt[FLOOR_FLAG][gi]);
            if (rt[FLOOR_NCCL][gi] > 0)
                printf(", %.2fx the bare kernels with NCCL's exchanges",
                       eng[gi] / rt[FLOOR_NCCL][gi]);
            printf("\n");
        }
    return EPX_OK;
}

/* x's first T rows (bf16) through DeepEP's fp8 cast and back, rounded to
 * bf16: what the identity experts of an fp8 dispatch return. NULL: no memory. */
static uint16_t *fp8_round_trip(const void *x, int64_t T, int32_t H) {
    const size_t n = (size_t)(T > 0 ? T : 1) * (size_t)H;
    uint8_t *d = malloc(n);
    float *sc = malloc(n / 128 * sizeof(float) + 4), *back = malloc(n * sizeof(float));
    uint16_t *q = malloc(n * sizeof(uint16_t));
    epx_error e = {0};
    if (d && sc && back && q && epx_fp8_cast_rows(x, T, H, 0, d, sc, &e) == EPX_OK &&
        epx_fp8_cast_back_rows(d, sc, T, H, back, &e) == EPX_OK) {
        for (size_t i = 0; i < (size_t)T * (size_t)H; i++) q[i] = epx_bf16_from_f32(back[i]);
    } else {
        free(q);
        q = NULL;
    }
    free(d), free(sc), free(back);
    return q;
}

/* The JSON lines' and messages' name of the engine's mode. */
static const char *mode_name(const bench_args *a) {
    return a->mode == EPX_EP_MODE_LOW_LATENCY ? "low-latency" : "normal";
}

/* Block 0's stamps of the last dispatch and combine (variant 8), `when`
 * saying which run left them ("" for the checked launch, "graph " after the
 * graph replays: the same steps under back-to-back launches). */
static void print_stamps(ll_run *b, int64_t T, const char *when) {
    double st_us[48];
    if (!(b->variant & 8) || epxi_gpu_ep_stamps(b->ep, st_us) != 0) return;
    /* the clock rate needs stamp 7, which not every dispatch instance writes */
    char mhz[24] = "unknown";
    if (st_us[6] > 0) snprintf(mhz, sizeof mhz, "%.0f MHz", st_us[6]);
    printf("%sstamps at %lld tokens (us from block 0's entry; SM clock %s): dispatch "
           "started %.2f sent and counted %.2f arrived %.2f waited %.2f placed %.2f; combine "
           "started %.2f sent %.2f arrived %.2f waited %.2f first rows %.2f summed %.2f "
           "reduced %.2f\n",
           when, (long long)T, mhz, st_us[0], st_us[1], st_us[2], st_us[3], st_us[4], st_us[8],
           st_us[9], st_us[10], st_us[11], st_us[13], st_us[14], st_us[12]);
    printf("  finer stamps:");
    for (int i = 16; i < 48; i++)
        if (st_us[i] >= 0) printf(" %d=%.2f", i, st_us[i]);
    printf("\n");
}

static epx_status bench_T(ll_run *b, int64_t T, const void *x, const int32_t *slots, const float *w,
                          int32_t P, FILE *jl, const char *device, epx_error *err) {
    const bench_args *a = b->a;
    const int32_t R = epx_comm_size(b->comm), me = epx_comm_rank(b->comm);
    const int32_t H = a->cfg.hidden, K = a->cfg.top_k, spr = P / R;
    const size_t esz = epx_dtype_size(a->dtype);
    /* Every rank times the same T, so each batch's count is a bound all share
     * (DeepEP's num_max_dispatch_tokens_per_rank); before any capture. */
    b->bound = a->bound_max ? b->Tmax : T > 0 ? T : 1;
    EPX_TRY_CLI(epx_gpu_ep_set_token_bound(b->ep, b->bound, err));
    /* Check: identity experts give the fixed-order weighted sums. */
    EPX_TRY_CLI(run_dispatch(b, T, false, err));
    EPX_TRY_CLI(run_identity(b, false, err));
    EPX_TRY_CLI(run_combine(b, false, err));
    EPX_TRY_CLI(epx_gpu_ep_sync(b->ep, err));
    float *out = malloc((size_t)(T > 0 ? T : 1) * H * 4), *o = malloc((size_t)H * 4);
    if (out == NULL || o == NULL) {
        free(out), free(o);
        return EPX_ERR_NOMEM;
    }
    cudaError_t ce = cudaMemcpy(out, b->dout, (size_t)T * H * 4, cudaMemcpyDeviceToHost);
    /* fp8: the experts saw the dequantised rows (bf16, as y) */
    uint16_t *xq = a->fp8 ? fp8_round_trip(x, T, H) : NULL;
    if (a->fp8 && xq == NULL) ce = cudaErrorMemoryAllocation;
    /* wrong tokens; (token, rank) pairs; entries; entries on other ranks */
    int64_t v[4] = {0, 0, 0, 0};
    for (int64_t t = 0; t < T && ce == cudaSuccess; t++) {
        bench_expect_token(a, R, spr, xq != NULL ? (const void *)xq : x, slots, w, t, o);
        v[0] += memcmp(o, out + t * H, (size_t)H * 4) != 0;
        int32_t seen[64], nd = 0;
        for (int32_t k = 0; k < K; k++) {
            if (slots[t * K + k] < 0) continue;
            int32_t r = slots[t * K + k] / spr;
            bool dup = false;
            for (int32_t j = 0; j < nd; j++) dup |= seen[j] == r;
            if (!dup && nd < 64) seen[nd++] = r;
            v[2]++;
            v[3] += r != me;
        }
        v[1] += nd;
    }
    free(out), free(o), free(xq);
    CUDA_OR(ce, "combine result download");
    int64_t bad = v[0];
    if (R > 1) EPX_TRY_CLI(sum_dev(b, &bad, 1, err));
    if (bad != 0) {
        err->status = EPX_ERR_INTERNAL;
        snprintf(err->msg, sizeof err->msg,
                 "%s check failed at %lld tokens: %lld tokens with a wrong combine over all "
                 "ranks; nothing timed",
                 mode_name(a), (long long)T, (long long)bad);
        return EPX_ERR_INTERNAL;
    }
    if (me == 0) print_stamps(b, T, "");
    if (a->graph) EPX_TRY_CLI(capture(b, T, err));
    /* Payload bytes of this rank's sends: rows, not record padding (fp8: the
     * e4m3 values and a 4-byte scale per 128). */
    const size_t drow = a->fp8 ? (size_t)H + (size_t)H / 32 : (size_t)H * esz;
    const size_t bytes[3] = {(size_t)v[1] * drow, (size_t)v[2] * H * esz,
                             (size_t)v[1] * drow + (size_t)v[2] * H * esz};
    /* What crosses the host link (host transport): every dispatched row, twice
     * (into the receiver's host inbox, then out); of the combine's rows only
     * the other ranks' (a combine in one launch reads this rank's own where
     * they are), so at one rank the combine has no link figure. */
    const size_t cross[3] = {bytes[0], (size_t)v[3] * H * esz, bytes[0] + (size_t)v[3] * H * esz};
    const char *names[4] = {"dispatch", "combine", "round-trip", "allreduce"};
    double eng_rt[2] = {-1.0, -1.0};
    /* No TP all-reduce where the ranks share GPUs (an MPI communicator): its
     * time there says nothing of separate GPUs. */
    const int last =
        epx_comm_memory_kind(b->comm) == EPX_COMM_MEMORY_HOST ? PH_ROUND_TRIP : PH_ALLREDUCE;
    for (int ph = PH_DISPATCH; ph <= last; ph++)
        for (int gi = 0; gi < (ph == PH_ALLREDUCE || !a->graph ? 1 : 2); gi++) {
            double med = 0, p99 = 0, cmed = -1, cp99 = 0, lmed = -1, lp99 = 0;
            EPX_TRY_CLI(time_phase(b, ph, T, gi == 1, 0, &med, &p99, err));
            if (ph == PH_ROUND_TRIP) eng_rt[gi] = med;
            if (ph == PH_ROUND_TRIP && gi == 1 && me == 0) print_stamps(b, T, "graph ");
            if (ph != PH_ALLREDUCE && bytes[ph] > 0)
                EPX_TRY_CLI(time_phase(b, PH_COPY, T, false, bytes[ph], &cmed, &cp99, err));
            if (ph != PH_ALLREDUCE && cross[ph] > 0 && b->hpin != NULL)
                EPX_TRY_CLI(time_phase(b, PH_LINK, T, false, cross[ph], &lmed, &lp99, err));
            if (me != 0) continue;
            const bool ar = ph == PH_ALLREDUCE;
            const size_t ar_bytes =
                R > 1 ? (size_t)(2.0 * (R - 1) / R * (double)R * T * H * esz) : 0;
            const size_t by = ar ? ar_bytes : bytes[ph];
            bench_line l = {.backend = a->backend,
                            .mode = ar ? "tp-allreduce" : mode_name(a),
                            .phase = names[ph],
                            .device = device,
                            .dtype = a->fp8 && ph != PH_COMBINE && !ar ? "fp8-e4m3"
                                     : a->dtype == EPX_DTYPE_BF16      ? "bf16"
                                                                       : "f32",
                            .ranks = R,
                            .hidden = H,
                            .topk = K,
                            .tokens = T,
                            .median_us = med,
                            .p99_us = p99,
                            .gbps = by > 0 ? (double)by / med * 1e-3 : -1.0,
                            .copy_pct = cmed > 0 ? 100.0 * cmed / med : -1.0,
                            .launches = ar ? 1
                                        : ph == PH_ROUND_TRIP
                                            ? 2
                                            : epx_gpu_ep_launches(b->ep, names[ph]),
                            .graph = gi == 1,
                            .transport = ar ? NULL : b->transport,
                            .link_pct = lmed > 0 ? 100.0 * lmed / med : -1.0,
                            .row_bytes = ar                 ? 0
                                         : ph == PH_COMBINE ? (int64_t)((size_t)H * esz)
                                                            : (int64_t)drow,
                            .graph_reps = gi == 1 ? kGraphReps : 0,
                            .token_bound = ar ? 0 : b->bound,
                            /* an MPI communicator: ranks sharing GPUs (shared_gpu_rank) */
                            .shared_gpu = epx_comm_memory_kind(b->comm) == EPX_COMM_MEMORY_HOST};
            char pct[16] = "-", lpct[16] = "-";
            if (l.copy_pct > 0) snprintf(pct, sizeof pct, "%.1f%%", l.copy_pct);
            if (l.link_pct > 0) snprintf(lpct, sizeof lpct, "%.1f%%", l.link_pct);
            printf("%8lld  %-10s %-6s %9.2f %9.2f %10.1f %8s %8s\n", (long long)T, names[ph],
                   gi ? "graph" : "launch", med, p99, l.gbps > 0 ? l.gbps : 0.0, pct, lpct);
            if (jl != NULL && bench_jsonl_write(jl, &l) != 0) {
                err->status = EPX_ERR_IO;
                snprintf(err->msg, sizeof err->msg, "bench: writing the JSON lines failed");
                return EPX_ERR_IO;
            }
        }
    if (b->fl == NULL) return EPX_OK;
    /* Every rank probes its own GPU; the barriers keep the ranks in step (a
     * probe's fault on one rank must not leave the others in a collective). */
    EPX_TRY_CLI(epx_comm_barrier(b->comm, err));
    epx_status fst = bench_floor(b, T, eng_rt, jl, device, err);
    int64_t fbad = fst != EPX_OK;
    if (R > 1) EPX_TRY_CLI(sum_dev(b, &fbad, 1, err));
    if (fst != EPX_OK) return fst;
    if (fbad != 0) {
        err->status = EPX_ERR_INTERNAL;
        snprintf(err->msg, sizeof err->msg, "bench: a floor probe failed on another rank");
        return EPX_ERR_INTERNAL;
    }
    return EPX_OK;
}

epx_status bench_ll_gpu(epx_comm *comm, ncclComm_t nc, cudaStream_t s, const bench_args *a,
                        FILE *jl, epx_error *err) {
    const int32_t R = epx_comm_size(comm), me = epx_comm_rank(comm);
    const int32_t H = a->cfg.hidden, K = a->cfg.top_k, E = a->cfg.num_experts;
    int32_t P = E + a->redundant;
    P = (P + R - 1) / R * R;
    int64_t Tmax = 1;
    for (int32_t i = 0; i < a->ntok; i++)
        if (a->tokens[i] > Tmax) Tmax = a->tokens[i];
    const size_t esz = epx_dtype_size(a->dtype);
    ll_run b;
    memset(&b, 0, sizeof b);
    b.comm = comm;
    b.s = s;
    b.a = a;
    b.Tmax = Tmax;
    void *x = malloc((size_t)Tmax * H * esz);
    int32_t *slots = malloc((size_t)Tmax * K * 4);
    float *w = malloc((size_t)Tmax * K * 4);
    b.t = malloc((size_t)(a->iters + a->warmup) * sizeof(double));
    epx_status st = x && slots && w && b.t ? EPX_OK : EPX_ERR_NOMEM;
    /* kernel variants for measurements (an internal hook; see ll_ep.cu) */
    if (st == EPX_OK) st = ll_variant(&b.variant, err);
    if (st == EPX_OK) bench_inputs(a, me, P, Tmax, x, slots, w);
    const size_t copy_max = (size_t)(Tmax * K * 2) * H * esz;
    if (st == EPX_OK &&
        (cudaMalloc(&b.dx, (size_t)Tmax * H * esz) != cudaSuccess ||
         cudaMalloc((void **)&b.ds, (size_t)Tmax * K * 4) != cudaSuccess ||
         cudaMalloc((void **)&b.dw, (size_t)Tmax * K * 4) != cudaSuccess ||
         cudaMalloc((void **)&b.dout, (size_t)Tmax * H * 4) != cudaSuccess ||
         cudaMalloc(&b.dtp, (size_t)R * Tmax * H * esz) != cudaSuccess ||
         cudaMalloc(&b.csrc, copy_max) != cudaSuccess ||
         cudaMalloc(&b.cdst, copy_max) != cudaSuccess ||
         cudaMalloc((void **)&b.dsum, (size_t)R * (a->iters + 1) * 8) != cudaSuccess ||
         cudaMemcpy(b.dx, x, (size_t)Tmax * H * esz, cudaMemcpyHostToDevice) != cudaSuccess ||
         cudaMemcpy(b.ds, slots, (size_t)Tmax * K * 4, cudaMemcpyHostToDevice) != cudaSuccess ||
         cudaMemcpy(b.dw, w, (size_t)Tmax * K * 4, cudaMemcpyHostToDevice) != cudaSuccess ||
         cudaMemset(b.dtp, 0, (size_t)R * Tmax * H * esz) != cudaSuccess ||
         cudaEventCreate(&b.e0) != cudaSuccess || cudaEventCreate(&b.e1) != cudaSuccess)) {
        err->status = st = EPX_ERR_CUDA;
        snprintf(err->msg, sizeof err->msg,
                 "bench: device buffers for the GPU engine's run failed");
    }
    void *gate = NULL, *gate_dev = NULL;
    if (st == EPX_OK && (cudaHostAlloc(&gate, sizeof(int), cudaHostAllocMapped) != cudaSuccess ||
                         cudaHostGetDevicePointer(&gate_dev, gate, 0) != cudaSuccess)) {
        err->status = st = EPX_ERR_CUDA;
        snprintf(err->msg, sizeof err->msg, "bench: the hold's mapped host word failed");
    }
    b.gate = (volatile int *)gate;
    b.gate_dev = (const int *)gate_dev;
    epx_ep_config c = bench_ep_config(a, P, Tmax, a->mode);
    epx_gpu_ep_opts o = EPX_GPU_EP_OPTS_INIT;
    o.timeout_ms = a->timeout_ms;
    o.transport = a->transport;
    o.max_blocks = a->max_blocks;
    if (st == EPX_OK && a->transport == EPX_BENCH_TRANSPORT_NCCL) {
        st = epx_gpu_ep_create_nccl(nc, &c, s, &o, &b.ep, err);
        b.nc = nc;
    } else if (st == EPX_OK)
        st = epx_gpu_ep_create(comm, &c, s, &o, &b.ep, err);
    /* Normal mode over a transport the GPU engine's compact receive does not
     * take (a PCIe box without peer access picks host): name the bench's fix. */
    if (st == EPX_ERR_UNSUPPORTED && a->mode == EPX_EP_MODE_NORMAL) {
        const size_t n = strlen(err->msg);
        snprintf(err->msg + n, sizeof err->msg - n,
                 " (epx bench comm: --engine nccl runs normal mode on the older NCCL path)");
    }
    if (st == EPX_OK) b.transport = epx_gpu_ep_transport_name(b.ep);
    if (st == EPX_OK && strcmp(b.transport, "host") == 0 &&
        cudaHostAlloc(&b.hpin, copy_max, cudaHostAllocDefault) != cudaSuccess) {
        err->status = st = EPX_ERR_CUDA;
        snprintf(err->msg, sizeof err->msg, "bench: pinned host bytes for the link ceiling failed");
    }
    /* The floor probes move bf16 rows, the engine's benchmark dtype. */
    if (st == EPX_OK && a->dtype == EPX_DTYPE_BF16 &&
        epxi_ll_floor_create(H, K, Tmax, s, &b.fl) != 0) {
        err->status = st = EPX_ERR_CUDA;
        snprintf(err->msg, sizeof err->msg, "bench: the floor probes' buffers failed");
    }
    if (st == EPX_OK && b.variant != 0) epxi_gpu_ep_variant(b.ep, b.variant);
    b.split = (b.variant & 256) != 0;
    struct cudaDeviceProp prop;
    int dev = 0;
    cudaGetDevice(&dev);
    const char *device = cudaGetDeviceProperties(&prop, dev) == cudaSuccess ? prop.name : "gpu";
    if (st == EPX_OK && me == 0)
        printf(
            "epx bench comm: GPU EP engine in %s mode, %d rank(s), transport %s, token bound %s, "
            "model %s (H %d, top-%d, %d slots), %s, %d iterations (median and p99 of the slowest "
            "rank, CUDA "
            "events; graph = %d iterations captured in one graph, queued behind a hold, per "
            "iteration), checked before timing; copy%% = a device copy of the same bytes over the "
            "phase's time; link%% (host transport) = the bytes that cross the host link (every "
            "dispatched row; the other ranks' combine rows) copied device to pinned host and "
            "back over the phase's time\n\n"
            "%8s  %-10s %-6s %9s %9s %10s %8s %8s\n",
            mode_name(a), R, b.transport,
            a->bound_max ? "max_tokens (the largest --tokens)" : "each batch's tokens", a->model, H,
            K, P,
            a->fp8 ? "fp8 dispatch (e4m3, a scale per 128 values; bf16 combine)"
            : a->dtype == EPX_DTYPE_BF16 ? "bf16"
                                         : "fp32",
            a->iters, (int)kGraphReps, "tokens", "phase", "how", "median us", "p99 us", "GB/s",
            "copy%", "link%");
    for (int32_t i = 0; i < a->ntok && st == EPX_OK; i++)
        st = bench_T(&b, a->tokens[i], x, slots, w, P, jl, device, err);
    for (int i = 0; i < 4; i++)
        if (b.g[i]) cudaGraphExecDestroy(b.g[i]);
    for (int i = 0; i < FLOOR_KINDS * 3; i++)
        if (b.fg[i / 3][i % 3]) cudaGraphExecDestroy(b.fg[i / 3][i % 3]);
    cudaFree(b.nbox);
    epxi_ll_floor_destroy(b.fl);
    epx_gpu_ep_destroy(b.ep);
    cudaFree(b.dx), cudaFree(b.ds), cudaFree(b.dw), cudaFree(b.dout), cudaFree(b.dtp);
    cudaFree(b.csrc), cudaFree(b.cdst), cudaFree(b.dsum);
    if (b.hpin) cudaFreeHost(b.hpin);
    if (gate) cudaFreeHost(gate);
    if (b.e0) cudaEventDestroy(b.e0);
    if (b.e1) cudaEventDestroy(b.e1);
    free(x), free(slots), free(w), free(b.t);
    return st;
}
#else
typedef int bench_ll_not_built; /* no CUDA: nothing here */
#endif
