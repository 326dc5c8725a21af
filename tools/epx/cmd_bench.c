/*
 * cmd_bench.c - `epx bench comm`: EP dispatch, EP combine and the TP
 * all-reduce of one MoE layer, timed side by side over MPI (host buffers,
 * run under mpirun, one rank per process) or NCCL (device buffers; one
 * process and GPU, one thread per GPU with --gpus N, or one process per GPU
 * under mpirun, which then only carries NCCL's unique id).
 *
 * What is compared, per token count T (tokens per rank):
 *  - EP dispatch of T tokens per rank, top-k routed uniformly at random over
 *    the model's experts (K distinct experts per token, trivial placement:
 *    slot p holds expert p % E), records of x row + K (slot, weight);
 *  - EP combine of the same batch (identity experts), fp32 reduction;
 *  - the TP all-reduce of the same global batch: R * T rows of H.
 * Before any timing each T is checked: combine must return the expected
 * fixed-order sum of every token's weighted rows, bit for bit, and the
 * all-reduce must return the exact sum of a known pattern.
 * Times are per iteration the slowest rank's, and the median over
 * iterations. Bytes are what one rank sends to other ranks, the mean over
 * ranks (dispatch: records; combine: expert rows; all-reduce: a ring's
 * 2 (R-1)/R of the buffer); bus bandwidth is those bytes over the median
 * time. `--json` writes the table in the format `epx advise --measured`
 * reads (format "epx-bench-comm-1").
 */
#if defined(EPX_CLI_HAVE_MPI) && EPX_CLI_HAVE_MPI
#define BENCH_MPI 1
#include "epx_comm_mpi.h"
#else
#define BENCH_MPI 0
#endif
#if defined(EPX_CLI_HAVE_NCCL) && EPX_CLI_HAVE_NCCL
#define BENCH_NCCL 1
#include "epx_comm_nccl.h"
#else
#define BENCH_NCCL 0
#endif

#include <errno.h>
#include <sys/stat.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_comm.h"
#include "bench_runs.h"
#include "cli.h"
#include "epx_comm.h"

typedef struct bench_row {
    int64_t T;
    double us[3];      /* dispatch, combine, all-reduce: median of the slowest rank */
    double p99[3];     /* their 99th percentiles */
    double bytes[3];   /* to other ranks, mean over ranks */
    double inbytes[3]; /* received including from itself, mean over ranks */
} bench_row;

static const char *OPS[3] = {"dispatch", "combine", "allreduce"};

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* ---- what differs between host and device communicators ------------------- */

typedef struct dev_ops {
    int dev;            /* buffers live on the GPU */
    const char *device; /* its name, for the JSON lines */
} dev_ops;

static void *buf_alloc(const dev_ops *d, size_t bytes) {
#if BENCH_NCCL
    if (d->dev) {
        void *p = NULL;
        return cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
    }
#endif
    (void)d;
    return calloc(bytes ? bytes : 1, 1);
}

static void buf_free(const dev_ops *d, void *p) {
#if BENCH_NCCL
    if (d->dev) {
        cudaFree(p);
        return;
    }
#endif
    (void)d;
    free(p);
}

static int to_buf(const dev_ops *d, void *dst, const void *src, size_t bytes) {
#if BENCH_NCCL
    /* cudaMemcpy from pageable memory may return before the DMA lands; the
     * communicator's non-blocking stream would not wait for it. */
    if (d->dev)
        return cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess &&
                       cudaDeviceSynchronize() == cudaSuccess
                   ? 0
                   : -1;
#endif
    (void)d;
    memcpy(dst, src, bytes);
    return 0;
}

static int from_buf(const dev_ops *d, void *dst, const void *src, size_t bytes) {
#if BENCH_NCCL
    if (d->dev) return cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
#endif
    (void)d;
    memcpy(dst, src, bytes);
    return 0;
}

/* Sum int64 values over ranks (in place). */
static epx_status sum_i64(epx_comm *comm, const dev_ops *d, int64_t *v, int64_t n, epx_error *err) {
    if (!d->dev) return epx_comm_allreduce_sum(comm, v, v, n, EPX_DTYPE_I64, err);
    void *b = buf_alloc(d, (size_t)n * 8);
    if (b == NULL || to_buf(d, b, v, (size_t)n * 8) != 0) {
        buf_free(d, b);
        err->status = EPX_ERR_CUDA;
        snprintf(err->msg, sizeof err->msg, "device scratch for a reduction failed");
        return EPX_ERR_CUDA;
    }
    epx_status st = epx_comm_allreduce_sum(comm, b, b, n, EPX_DTYPE_I64, err);
    if (st == EPX_OK) st = epx_comm_wait(comm, err);
    if (st == EPX_OK && from_buf(d, v, b, (size_t)n * 8) != 0) st = EPX_ERR_CUDA;
    buf_free(d, b);
    return st;
}

/* The EP handle, host or device, behind four calls. */
typedef struct ep_any {
    epx_ep *h;
#if BENCH_NCCL
    epx_nccl_ep *g;
#endif
} ep_any;

static epx_status ep_make(epx_comm *comm, const dev_ops *d, const epx_ep_config *c, ep_any *ep,
                          epx_error *err) {
    memset(ep, 0, sizeof *ep);
#if BENCH_NCCL
    if (d->dev) return epx_nccl_ep_create(comm, c, NULL, 0, &ep->g, err);
#endif
    (void)d;
    return epx_ep_create(comm, c, NULL, 0, &ep->h, err);
}

static void ep_free(ep_any *ep) {
    epx_ep_destroy(ep->h);
#if BENCH_NCCL
    epx_nccl_ep_destroy(ep->g);
#endif
}

static epx_status ep_dispatch(ep_any *ep, int64_t T, const void *x, const int32_t *s,
                              const float *w, epx_ep_recv *rv, epx_error *err) {
#if BENCH_NCCL
    if (ep->g) return epx_nccl_ep_dispatch(ep->g, T, x, s, w, rv, err);
#endif
    return epx_ep_dispatch(ep->h, T, x, s, w, rv, err);
}

static epx_status ep_identity(ep_any *ep, const epx_ep_recv *rv, epx_error *err) {
#if BENCH_NCCL
    if (ep->g) return epx_nccl_ep_identity_experts(ep->g, rv, err);
#endif
    return epx_ep_identity_experts(ep->h, rv, err);
}

static epx_status ep_combine(ep_any *ep, float *out, epx_error *err) {
#if BENCH_NCCL
    if (ep->g) return epx_nccl_ep_combine(ep->g, out, err);
#endif
    return epx_ep_combine(ep->h, out, err);
}

static void ep_bytes(const ep_any *ep, int64_t *db, int64_t *cb) {
#if BENCH_NCCL
    if (ep->g) {
        epx_nccl_ep_last_bytes(ep->g, db, cb);
        return;
    }
#endif
    epx_ep_last_bytes(ep->h, db, cb);
}

/* ---- one rank's benchmark ------------------------------------------------- */

static epx_status fail_msg(epx_error *err, epx_status st, const char *msg) {
    err->status = st;
    snprintf(err->msg, sizeof err->msg, "%s", msg);
    return st;
}

static epx_status bench_rank(epx_comm *comm, const dev_ops *d, const bench_args *a, bench_row *rows,
                             epx_error *err) {
    const int32_t R = epx_comm_size(comm), me = epx_comm_rank(comm);
    const int32_t H = a->cfg.hidden, K = a->cfg.top_k, E = a->cfg.num_experts;
    int32_t P = E + a->redundant;
    P = (P + R - 1) / R * R;
    const int32_t spr = P / R;
    const int64_t Tmax = bench_max_tokens(a);
    const size_t esz = epx_dtype_size(a->dtype);
    epx_status st = EPX_OK;
    /* Host inputs: K distinct experts per token, uniformly; replica by token. */
    void *x = malloc((size_t)Tmax * H * esz);
    int32_t *slots = malloc((size_t)Tmax * K * 4), *perm = malloc((size_t)E * 4);
    float *w = malloc((size_t)Tmax * K * 4), *out = malloc((size_t)Tmax * H * 4),
          *o = malloc((size_t)H * 4);
    size_t tp_elems = (size_t)R * Tmax * H;
    void *tp_host = malloc(tp_elems * esz);
    double *times = malloc((size_t)(a->iters + a->warmup) * sizeof(double));
    int64_t *gather = malloc((size_t)R * (a->iters + 1) * sizeof(int64_t));
    void *dx = NULL, *dout = NULL, *dtp = NULL;
    int32_t *ds = NULL;
    float *dw = NULL;
    ep_any ep;
    memset(&ep, 0, sizeof ep);
    if (!x || !slots || !perm || !w || !out || !o || !tp_host || !times || !gather) {
        st = fail_msg(err, EPX_ERR_NOMEM, "out of host memory for the benchmark buffers");
        goto done;
    }
    bench_inputs(a, me, P, Tmax, x, slots, w);
    epx_ep_config c = bench_ep_config(a, P, Tmax, a->mode);
    st = ep_make(comm, d, &c, &ep, err);
    if (st != EPX_OK) goto done;
    if (d->dev) {
        dx = buf_alloc(d, (size_t)Tmax * H * esz);
        ds = buf_alloc(d, (size_t)Tmax * K * 4);
        dw = buf_alloc(d, (size_t)Tmax * K * 4);
        dout = buf_alloc(d, (size_t)Tmax * H * 4);
        dtp = buf_alloc(d, tp_elems * esz);
        if (!dx || !ds || !dw || !dout || !dtp || to_buf(d, dx, x, (size_t)Tmax * H * esz) ||
            to_buf(d, ds, slots, (size_t)Tmax * K * 4) || to_buf(d, dw, w, (size_t)Tmax * K * 4)) {
            st = fail_msg(err, EPX_ERR_CUDA, "device buffers for the benchmark failed");
            goto done;
        }
    } else {
        dx = x;
        ds = slots;
        dw = w;
        dout = out;
        dtp = tp_host;
    }
    for (int32_t ti = 0; ti < a->ntok && st == EPX_OK; ti++) {
        const int64_t T = a->tokens[ti];
        bench_row *row = &rows[ti];
        memset(row, 0, sizeof *row);
        row->T = T;
        epx_ep_recv rv;
        /* Check EP: identity experts give the fixed-order weighted sums. */
        st = ep_dispatch(&ep, T, dx, ds, dw, &rv, err);
        if (st == EPX_OK) st = ep_identity(&ep, &rv, err);
        if (st == EPX_OK) st = ep_combine(&ep, dout, err);
        if (st == EPX_OK) st = epx_comm_wait(comm, err);
        if (st != EPX_OK) break;
        if (from_buf(d, out, dout, (size_t)T * H * 4) != 0) {
            st = fail_msg(err, EPX_ERR_CUDA, "copying the combine result back failed");
            break;
        }
        int64_t bad[2] = {0, 0};
        for (int64_t t = 0; t < T; t++) {
            bench_expect_token(a, R, spr, x, slots, w, t, o);
            bad[0] += memcmp(o, out + t * H, (size_t)H * 4) != 0;
        }
        /* Check TP: the exact sum of a small-integer pattern. */
        const int64_t ne = (int64_t)R * T * H;
        for (int64_t i = 0; i < ne; i++) {
            float v = (float)((i * 31 + me) % 17 - 8);
            if (a->dtype == EPX_DTYPE_F32)
                ((float *)tp_host)[i] = v;
            else
                ((uint16_t *)tp_host)[i] = epx_bf16_from_f32(v);
        }
        if (to_buf(d, dtp, tp_host, (size_t)ne * esz) != 0) st = EPX_ERR_CUDA;
        if (st == EPX_OK) st = epx_comm_allreduce_sum(comm, dtp, dtp, ne, a->dtype, err);
        if (st == EPX_OK) st = epx_comm_wait(comm, err);
        if (st == EPX_OK && from_buf(d, tp_host, dtp, (size_t)ne * esz) != 0) st = EPX_ERR_CUDA;
        if (st != EPX_OK) break;
        for (int64_t i = 0; i < ne; i++) {
            float want = 0.0f;
            for (int32_t r = 0; r < R; r++) want += (float)((i * 31 + r) % 17 - 8);
            bad[1] += bench_xval(a, tp_host, (size_t)i) != want;
        }
        st = sum_i64(comm, d, bad, 2, err);
        if (st != EPX_OK) break;
        if (bad[0] || bad[1]) {
            char m[256];
            snprintf(m, sizeof m,
                     "check failed at %lld tokens: %lld tokens with a wrong combine, "
                     "%lld wrong all-reduce sums (over all ranks); nothing timed",
                     (long long)T, (long long)bad[0], (long long)bad[1]);
            st = fail_msg(err, EPX_ERR_INTERNAL, m);
            break;
        }
        /* Bytes: this batch's, the same every iteration. */
        int64_t db = 0, cb = 0;
        ep_bytes(&ep, &db, &cb);
        int64_t v[5] = {db, cb, rv.num_tokens * (int64_t)rv.x_stride, 0, 0};
        /* combine's received rows: TOPK one per (t, k) with a slot; RANK one per (t, rank) */
        for (int64_t t = 0; t < T; t++) {
            int32_t dd[64], nd = 0;
            for (int32_t k = 0; k < K; k++) {
                if (slots[t * K + k] < 0) continue;
                v[3]++;
                int32_t r = slots[t * K + k] / spr;
                bool dup = false;
                for (int32_t j = 0; j < nd; j++) dup |= dd[j] == r;
                if (!dup && nd < 64) dd[nd++] = r;
            }
            v[4] += nd;
        }
        v[3] = (a->combine == EPX_EP_COMBINE_TOPK ? v[3] : v[4]) * (int64_t)H * (int64_t)esz;
        v[4] = 0;
        st = sum_i64(comm, d, v, 5, err);
        if (st != EPX_OK) break;
        row->bytes[0] = (double)v[0] / R;
        row->bytes[1] = (double)v[1] / R;
        row->bytes[2] = R > 1 ? 2.0 * (R - 1) / R * (double)ne * esz : 0.0;
        row->inbytes[0] = (double)v[2] / R;
        row->inbytes[1] = (double)v[3] / R;
        row->inbytes[2] = (double)ne * esz;
        /* Time each operation. */
        for (int op = 0; op < 3 && st == EPX_OK; op++) {
            int n = a->warmup + a->iters;
            for (int it = 0; it < n && st == EPX_OK; it++) {
                if (op == 1) { /* a fresh dispatch before each timed combine */
                    st = ep_dispatch(&ep, T, dx, ds, dw, &rv, err);
                    if (st == EPX_OK) st = ep_identity(&ep, &rv, err);
                    if (st == EPX_OK) st = epx_comm_wait(comm, err);
                }
                if (st == EPX_OK) st = epx_comm_barrier(comm, err);
                if (st != EPX_OK) break;
                double t0 = now_us();
                if (op == 0)
                    st = ep_dispatch(&ep, T, dx, ds, dw, &rv, err);
                else if (op == 1)
                    st = ep_combine(&ep, dout, err);
                else
                    st = epx_comm_allreduce_sum(comm, dtp, dtp, ne, a->dtype, err);
                if (st == EPX_OK) st = epx_comm_wait(comm, err);
                times[it] = now_us() - t0;
            }
            if (st != EPX_OK) break;
            /* Slowest rank per iteration, then the median. */
            memset(gather, 0, (size_t)R * a->iters * sizeof(int64_t));
            for (int it = 0; it < a->iters; it++)
                gather[(size_t)me * a->iters + it] = (int64_t)(times[a->warmup + it] * 1000.0);
            st = sum_i64(comm, d, gather, (int64_t)R * a->iters, err);
            if (st != EPX_OK) break;
            for (int it = 0; it < a->iters; it++) {
                int64_t mx = 0;
                for (int32_t r = 0; r < R; r++)
                    if (gather[(size_t)r * a->iters + it] > mx)
                        mx = gather[(size_t)r * a->iters + it];
                times[it] = (double)mx / 1000.0;
            }
            bench_stats(times, a->iters, &row->us[op], &row->p99[op]);
        }
    }
done:
    ep_free(&ep);
    if (d->dev) {
        buf_free(d, dx);
        buf_free(d, ds);
        buf_free(d, dw);
        buf_free(d, dout);
        buf_free(d, dtp);
    }
    free(x), free(slots), free(perm), free(w), free(out), free(o), free(tp_host), free(times),
        free(gather);
    return st;
}

/* ---- output ----------------------------------------------------------------- */

static double gbps(double bytes, double us) {
    return us > 0 && bytes > 0 ? bytes / us * 1e-3 : 0.0;
}

static void print_table(FILE *f, const bench_args *a, int32_t R, const bench_row *rows) {
    fprintf(
        f,
        "epx bench comm: backend %s, %s mode, %d rank(s), model %s (H %d, top-%d, %d experts), %s, "
        "combine %s, %d iterations (median of the slowest rank), checked before timing\n",
        a->backend, a->mode == EPX_EP_MODE_LOW_LATENCY ? "low-latency" : "normal", R, a->model,
        a->cfg.hidden, a->cfg.top_k, a->cfg.num_experts,
        a->dtype == EPX_DTYPE_BF16 ? "bf16" : "fp32",
        a->combine == EPX_EP_COMBINE_TOPK ? "topk-order" : "rank-order", a->iters);
    fprintf(f,
            "bytes = sent to other ranks per rank (dispatch records, combine rows, ring "
            "all-reduce 2(R-1)/R of R*T rows); busbw = bytes / time; in = received incl. self\n\n");
    fprintf(f, "%8s  %-9s %10s %12s %9s %12s  %s\n", "tokens", "op", "us", "bytes", "busbw",
            "in bytes", "");
    for (int32_t i = 0; i < a->ntok; i++) {
        const bench_row *r = &rows[i];
        double ep = r->us[0] + r->us[1], tp = r->us[2];
        for (int op = 0; op < 3; op++) {
            char bw[32];
            double g = gbps(r->bytes[op], r->us[op]);
            if (g > 0)
                snprintf(bw, sizeof bw, "%.1f GB/s", g);
            else
                snprintf(bw, sizeof bw, "-");
            char verdict[64] = "";
            if (op == 2)
                snprintf(verdict, sizeof verdict, "EP %.1f us vs TP %.1f us: %s", ep, tp,
                         ep < tp ? "EP wins" : "TP wins");
            fprintf(f, "%8lld  %-9s %10.1f %12.0f %9s %12.0f  %s\n", (long long)r->T, OPS[op],
                    r->us[op], r->bytes[op], bw, r->inbytes[op], verdict);
        }
    }
}

static int write_json(FILE *f, const bench_args *a, int32_t R, const bench_row *rows) {
    fputs("{\"format\": \"epx-bench-comm-1\", \"backend\": ", f);
    cli_json_str(f, a->backend);
    fputs(", \"model\": ", f); /* a folder's name: any byte, escaped */
    cli_json_str(f, a->model);
    fprintf(
        f,
        ", \"ranks\": %d, "
        "\"hidden\": %d, \"top_k\": %d, \"experts\": %d, \"dtype\": \"%s\", \"combine\": \"%s\",\n"
        " \"bytes\": \"sent to other ranks per rank (mean)\", \"time\": \"median over iterations "
        "of the "
        "slowest rank, microseconds\",\n \"rows\": [",
        R, a->cfg.hidden, a->cfg.top_k, a->cfg.num_experts,
        a->dtype == EPX_DTYPE_BF16 ? "bf16" : "f32",
        a->combine == EPX_EP_COMBINE_TOPK ? "topk" : "rank");
    for (int32_t i = 0; i < a->ntok; i++) {
        const bench_row *r = &rows[i];
        fprintf(f, "%s\n  {\"tokens\": %lld", i ? "," : "", (long long)r->T);
        for (int op = 0; op < 3; op++) {
            fprintf(f, ", \"%s_us\": ", OPS[op]);
            cli_json_num(f, "%.3f", r->us[op]);
            fprintf(f, ", \"%s_bytes\": ", OPS[op]);
            cli_json_num(f, "%.0f", r->bytes[op]);
            fprintf(f, ", \"%s_in_bytes\": ", OPS[op]);
            cli_json_num(f, "%.0f", r->inbytes[op]);
        }
        fputc('}', f);
    }
    fputs("\n]}\n", f);
    return ferror(f) ? -1 : 0;
}

/* The rows as JSON lines (one per phase and token count). */
static int write_jsonl(FILE *f, const bench_args *a, int32_t R, const bench_row *rows,
                       const char *device) {
    const char *mode = a->mode == EPX_EP_MODE_LOW_LATENCY ? "low-latency" : "normal";
    for (int32_t i = 0; i < a->ntok; i++) {
        const bench_row *r = &rows[i];
        for (int op = 0; op < 4; op++) {
            /* round trip: the sum of the phases' medians (timed one by one) */
            bench_line l = {.backend = a->backend,
                            .mode = op == 2 ? "tp-allreduce" : mode,
                            .phase = op == 3 ? "round-trip" : OPS[op],
                            .device = device,
                            .dtype = a->dtype == EPX_DTYPE_BF16 ? "bf16" : "f32",
                            .ranks = R,
                            .hidden = a->cfg.hidden,
                            .topk = a->cfg.top_k,
                            .tokens = r->T,
                            .median_us = op == 3 ? r->us[0] + r->us[1] : r->us[op],
                            .p99_us = op == 3 ? r->p99[0] + r->p99[1] : r->p99[op],
                            .gbps = op == 3 ? -1.0 : gbps(r->bytes[op], r->us[op]),
                            .copy_pct = -1.0,
                            .launches = -1,
                            .link_pct = -1.0};
            if (bench_jsonl_write(f, &l) != 0) return -1;
        }
    }
    return 0;
}

/* --json appends, so a file that already holds something must be JSON
 * lines of earlier runs (what `epx advise --measured` reads) or blank
 * lines: anything else (a counts file, a report) would be spoilt by the
 * first line appended. A last line without its newline (an editor, a copy)
 * would run into the first appended one, so a->jsonl_newline asks for one
 * first. Returns -1 (go on), or the exit code after saying why not. */
static int jsonl_appendable(bench_args *a) {
    const char *path = a->jsonl;
    if (path == NULL || strcmp(path, "-") == 0) return -1;
    struct stat st;
    if (stat(path, &st) != 0 || st.st_size == 0) return -1; /* a new name or an empty file */
    char *text = NULL;
    size_t len = 0, bad = 0;
    epx_error err = {0};
    if (epx_file_read(path, EPX_MAX_INPUT_BYTES, "--json (EPX_MAX_INPUT_BYTES)", &text, &len,
                      &err) != EPX_OK) {
        fprintf(stderr, "epx bench comm: --json '%s': %s\n", path, err.msg);
        return CLI_EXIT_USAGE;
    }
    json_t *lines = cli_bench_lines(text, len, &bad);
    a->jsonl_newline = len > 0 && text[len - 1] != '\n';
    epx_free(text);
    json_decref(lines);
    if (bad == 0) return -1; /* earlier runs' lines, or blank lines only */
    fprintf(stderr,
            "epx bench comm: --json '%s' holds something other than the JSON lines of earlier "
            "runs (line %zu is not one); --json appends, which would spoil it: name a new file, "
            "or one this benchmark wrote\n",
            path, bad);
    return CLI_EXIT_USAGE;
}

/* Open --json's file for appending ("-": stdout), on a line of its own. */
static FILE *open_jsonl(const bench_args *a) {
    if (a->jsonl == NULL) return NULL;
    if (strcmp(a->jsonl, "-") == 0) return stdout;
    FILE *f = fopen(a->jsonl, "a"); /* checked to be a regular file or a new name */
    if (f == NULL)
        fprintf(stderr, "epx bench comm: cannot open --json '%s' for appending: %s\n", a->jsonl,
                strerror(errno));
    else if (a->jsonl_newline)
        fputc('\n', f);
    return f;
}

/* -o goes through the library's safe-output path (temp file, rename). */
typedef struct summary_ctx {
    const bench_args *a;
    int nranks;
    const bench_row *rows;
} summary_ctx;

static epx_status summary_body(FILE *f, const void *vctx, epx_error *err) {
    const summary_ctx *c = vctx;
    (void)err;
    return write_json(f, c->a, c->nranks, c->rows) == 0 ? EPX_OK : EPX_ERR_IO;
}

/* ---- the command ------------------------------------------------------------ */

/* Host memory one of R ranks touches at the largest token count, estimated
 * before any is allocated: its batch and result (T x H), the TP buffer of
 * every rank's rows (R x T x H), and what EP moves through its workspace:
 * records out and in, the expert outputs and combine's copy of them
 * (T x K rows each, routing being uniform), and the rows coming back. In
 * low latency every peer's fixed block arrives whole, so records in and
 * rows back grow with R. The rest of the workspace, sized for the worst
 * case, is never touched by the benchmark's routing and is not counted. */
static double rank_bytes(const bench_args *a, int32_t R) {
    const double T = (double)bench_max_tokens(a);
    const double esz = a->dtype == EPX_DTYPE_BF16 ? 2.0 : 4.0, H = a->cfg.hidden, K = a->cfg.top_k,
                 dmax = K < R ? K : R;
    const double rec = H * esz + K * 8.0 + 16.0, yrow = H * esz;
    const bool ll = a->mode == EPX_EP_MODE_LOW_LATENCY;
    const double back = ll ? R * T * K : a->combine == EPX_EP_COMBINE_TOPK ? T * K : T * dmax;
    return T * H * (esz + 4.0) + T * K * 8.0 + R * T * H * esz + T * dmax * rec +
           (ll ? R * (T + 1.0) : T * dmax) * rec + 2.0 * T * K * yrow + back * yrow;
}

/* Whether `local` ranks of R fit in this machine's memory (they share it);
 * says why not. */
static bool fits(cli_cmd *cmd, const bench_args *a, int32_t R, int local) {
    const int64_t Tmax = bench_max_tokens(a);
    char what[200];
    int n = snprintf(what, sizeof what, "--tokens %lld at hidden %d, top-%d", (long long)Tmax,
                     a->cfg.hidden, a->cfg.top_k);
    if (R > 1 && n > 0 && (size_t)n < sizeof what)
        snprintf(what + n, sizeof what - (size_t)n, " on %d ranks, %d of them on this machine,", R,
                 local);
    return cli_check_bytes(cmd, local * rank_bytes(a, R), what,
                           R > 1 ? "give fewer tokens per rank, or run fewer ranks per machine"
                                 : "give fewer tokens per rank");
}

static int parse_args(cli_cmd *cmd, bench_args *a) {
    memset(a, 0, sizeof *a);
    a->backend = cli_require(cmd, "--backend");
    a->model = cli_require(cmd, "--model");
    const char *toks = cli_require(cmd, "--tokens");
    if (!a->backend || !a->model || !toks) return CLI_EXIT_USAGE;
    if (strcmp(a->backend, "mpi") != 0 && strcmp(a->backend, "nccl") != 0) {
        fprintf(stderr, "epx bench comm: --backend must be 'mpi' or 'nccl', not '%s'\n",
                a->backend);
        return CLI_EXIT_USAGE;
    }
    epx_error err = {0};
    if (epx_moe_model_config(a->model, &a->cfg, &err) != EPX_OK) return cli_report(cmd, &err);
    if (!cli_int_list(cmd, "--tokens", 1, 1 << 20, "1,64,4096", &a->tokens, &a->ntok) ||
        !cli_list_distinct(cmd, "--tokens", a->tokens, a->ntok))
        return CLI_EXIT_USAGE;
    a->iters = 20;
    a->warmup = 3;
    a->redundant = 0;
    a->timeout_ms = 60000;
    int32_t seed = 1;
    if (!cli_int(cmd, "--iters", 1, 100000, &a->iters) ||
        !cli_int(cmd, "--warmup", 0, 100000, &a->warmup) ||
        !cli_int(cmd, "--redundant", 0, EPX_MAX_EXPERTS, &a->redundant) ||
        !cli_int(cmd, "--timeout-ms", 1, 3600000, &a->timeout_ms) ||
        !cli_int(cmd, "--seed", 0, INT32_MAX, &seed))
        return CLI_EXIT_USAGE;
    a->seed = (uint64_t)seed;
    static const char *const dtypes[] = {"bf16", "f32"};
    int dti = strcmp(a->backend, "mpi") == 0 ? 1 : 0;
    if (!cli_choice(cmd, "--dtype", dtypes, 2, &dti)) return CLI_EXIT_USAGE;
    a->dtype = dti == 0 ? EPX_DTYPE_BF16 : EPX_DTYPE_F32;
    if (strcmp(a->backend, "mpi") == 0 && a->dtype == EPX_DTYPE_BF16) {
        fprintf(stderr,
                "epx bench comm: MPI has no bf16 sum for the TP all-reduce; use --dtype f32 "
                "with --backend mpi (the default), so EP and TP move the same element type\n");
        return CLI_EXIT_USAGE;
    }
    static const char *const modes[] = {"normal", "low-latency"};
    static const char *const combines[] = {"topk", "rank"};
    int mi = 0, ci = 0;
    if (!cli_choice(cmd, "--mode", modes, 2, &mi) ||
        !cli_choice(cmd, "--combine", combines, 2, &ci))
        return CLI_EXIT_USAGE;
    a->mode = mi == 0 ? EPX_EP_MODE_NORMAL : EPX_EP_MODE_LOW_LATENCY;
    a->combine = ci == 0 ? EPX_EP_COMBINE_TOPK : EPX_EP_COMBINE_RANK;
    /* One rank alone here; under mpirun, ranks_fit counts them all. */
    if (!fits(cmd, a, 1, 1)) return CLI_EXIT_USAGE;
    if (a->mode == EPX_EP_MODE_LOW_LATENCY && a->combine != EPX_EP_COMBINE_TOPK) {
        fprintf(stderr, "epx bench comm: --mode low-latency combines in top-k order: drop "
                        "--combine rank\n");
        return CLI_EXIT_USAGE;
    }
    /* The GPU engine runs both modes over NCCL (normal mode's compact
     * receive unless --engine nccl or per-rank partials ask for the older
     * NCCL path, nccl_ep). */
    static const char *const engines[] = {"gpu", "nccl"};
    int ei = 0;
    if (!cli_choice(cmd, "--engine", engines, 2, &ei)) return CLI_EXIT_USAGE;
    const char *en = cli_get(cmd, "--engine");
    const bool partials = a->combine == EPX_EP_COMBINE_RANK;
    if (en != NULL && (a->mode != EPX_EP_MODE_NORMAL || strcmp(a->backend, "nccl") != 0)) {
        fprintf(stderr, "epx bench comm: --engine picks normal mode's GPU path: use it with "
                        "--backend nccl --mode normal\n");
        return CLI_EXIT_USAGE;
    }
    if (en != NULL && strcmp(en, "gpu") == 0 && partials) {
        fprintf(stderr, "epx bench comm: --engine gpu combines in top-k order: drop --combine "
                        "rank, or give --engine nccl\n");
        return CLI_EXIT_USAGE;
    }
    a->gpu_engine =
        strcmp(a->backend, "nccl") == 0 &&
        (a->mode == EPX_EP_MODE_LOW_LATENCY || (en != NULL ? strcmp(en, "gpu") == 0 : !partials));
    a->graph = cli_flag(cmd, "--graph");
    if (a->graph && !a->gpu_engine) {
        fprintf(stderr, "epx bench comm: --graph times CUDA-graph replays of the GPU engine: use "
                        "it with --backend nccl (not --engine nccl)\n");
        return CLI_EXIT_USAGE;
    }
    const char *tr = cli_get(cmd, "--transport");
    a->transport = EPX_BENCH_TRANSPORT_AUTO;
    if (tr != NULL) {
        if (!a->gpu_engine) {
            fprintf(stderr, "epx bench comm: --transport picks the GPU engine's transport: use "
                            "it with --backend nccl (not --engine nccl)\n");
            return CLI_EXIT_USAGE;
        }
        if (strcmp(tr, "auto") == 0)
            a->transport = EPX_BENCH_TRANSPORT_AUTO;
        else if (strcmp(tr, "peer") == 0 || strcmp(tr, "ipc") == 0)
            a->transport = EPX_BENCH_TRANSPORT_PEER;
        else if (strcmp(tr, "host") == 0)
            a->transport = EPX_BENCH_TRANSPORT_HOST;
        else if (strcmp(tr, "nccl") == 0)
            a->transport = EPX_BENCH_TRANSPORT_NCCL;
        else {
            fprintf(stderr,
                    "epx bench comm: --transport must be auto, peer (or ipc), host or nccl, not "
                    "'%s'\n",
                    tr);
            return CLI_EXIT_USAGE;
        }
    }
    const char *tb = cli_get(cmd, "--token-bound");
    a->bound_max = tb != NULL && strcmp(tb, "max") == 0;
    if (tb != NULL && strcmp(tb, "max") != 0 && strcmp(tb, "tokens") != 0) {
        fprintf(stderr,
                "epx bench comm: --token-bound is tokens (each batch's count, the default) or "
                "max (the largest --tokens), not '%s'\n",
                tb);
        return CLI_EXIT_USAGE;
    }
    if (tb != NULL && !a->gpu_engine) {
        fprintf(stderr, "epx bench comm: --token-bound sets the GPU engine's bound: use it with "
                        "--backend nccl (not --engine nccl)\n");
        return CLI_EXIT_USAGE;
    }
    a->max_blocks = 0;
    if (!cli_int(cmd, "--max-blocks", 1, 65535, &a->max_blocks)) return CLI_EXIT_USAGE;
    if (a->max_blocks > 0 && !a->gpu_engine) {
        fprintf(stderr, "epx bench comm: --max-blocks caps the GPU engine's launches: use it "
                        "with --backend nccl (not --engine nccl)\n");
        return CLI_EXIT_USAGE;
    }
    a->gpus = 0;
    if (!cli_int(cmd, "--gpus", 1, 1024, &a->gpus)) return CLI_EXIT_USAGE;
    a->fp8 = cli_flag(cmd, "--fp8");
    if (a->fp8 && (a->mode != EPX_EP_MODE_LOW_LATENCY || strcmp(a->backend, "nccl") != 0 ||
                   a->dtype != EPX_DTYPE_BF16 || a->cfg.hidden % 128 != 0)) {
        fprintf(stderr,
                "epx bench comm: --fp8 sends the GPU low-latency engine's dispatch as e4m3 with a "
                "scale per 128 values: use it with --backend nccl --mode low-latency, bf16 rows "
                "and a hidden size that is a multiple of 128 (this model's is %d)\n",
                a->cfg.hidden);
        return CLI_EXIT_USAGE;
    }
    if (a->gpus > 0 && strcmp(a->backend, "nccl") != 0) {
        fprintf(stderr,
                "epx bench comm: --gpus %d drives GPUs from one process over NCCL: use it "
                "with --backend nccl (MPI ranks are processes: mpirun -np %d)\n",
                a->gpus, a->gpus);
        return CLI_EXIT_USAGE;
    }
    a->jsonl = cli_get(cmd, "--json");
    if (!cli_json_only(cmd, "-o", cli_get(cmd, "-o"), "the summary") ||
        !cli_json_only(cmd, "--json", a->jsonl, "each run's lines"))
        return CLI_EXIT_USAGE;
    {
        /* Both outputs are checked before the run: -o is replaced, --json
         * appended to; neither may be a FIFO, a device or the other. */
        const cli_out outs[] = {{cli_get(cmd, "-o"), false}, {a->jsonl, true}};
        const char *model = cli_get(cmd, "--model"); /* a name or a config file */
        int rc = cli_outputs_check(cmd, &model, 1, outs, 2);
        if (rc >= 0) return rc;
    }
    return jsonl_appendable(a);
}

/* Run on one rank, print on rank 0. */
static int run_and_report(cli_cmd *cmd, epx_comm *comm, const dev_ops *d, const bench_args *a) {
    bench_row *rows = calloc((size_t)a->ntok, sizeof *rows);
    epx_error err = {0};
    epx_status st = rows ? bench_rank(comm, d, a, rows, &err) : EPX_ERR_NOMEM;
    int rc = CLI_EXIT_OK;
    if (st != EPX_OK) {
        fprintf(stderr, "epx %s: rank %d: %s\n", cmd->name, epx_comm_rank(comm),
                err.msg[0] ? err.msg : epx_status_str(st));
        rc = CLI_EXIT_FAIL;
    } else if (epx_comm_rank(comm) == 0) {
        const char *out = cli_get(cmd, "-o");
        FILE *jl = open_jsonl(a);
        if (a->jsonl != NULL && jl == NULL) rc = CLI_EXIT_FAIL;
        if (jl != NULL) {
            if (write_jsonl(jl, a, epx_comm_size(comm), rows, d->dev ? d->device : "cpu") != 0)
                rc = CLI_EXIT_FAIL;
            if (jl != stdout) fclose(jl);
        }
        if (jl != stdout) {
            print_table(stdout, a, epx_comm_size(comm), rows);
            if (out != NULL) {
                summary_ctx sc = {a, epx_comm_size(comm), rows};
                epx_error werr = {0};
                if (epx_file_write(out, summary_body, &sc, &werr) != EPX_OK) {
                    fprintf(stderr, "epx bench comm: cannot write '%s': %s\n", out,
                            werr.msg[0] ? werr.msg : epx_status_str(werr.status));
                    rc = CLI_EXIT_FAIL;
                }
                if (rc == CLI_EXIT_OK) printf("\nwrote %s (epx advise --measured reads it)\n", out);
            }
        }
    }
    free(rows);
    return rc;
}

#if BENCH_MPI
/* The ranks of one machine share its memory, and each holds more with more
 * ranks: the check while parsing counted one rank alone. Local rank 0 of
 * each machine checks its ranks together, and every rank learns whether
 * any machine refused. Returns -1 (go on) or the exit code. */
static int ranks_fit(cli_cmd *cmd, epx_comm *comm, const bench_args *a) {
    int local = 1, local_rank = 0;
    MPI_Comm node;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) ==
        MPI_SUCCESS) {
        MPI_Comm_size(node, &local);
        MPI_Comm_rank(node, &local_rank);
        MPI_Comm_free(&node);
    }
    int64_t refused = local_rank == 0 && !fits(cmd, a, epx_comm_size(comm), local);
    epx_error err = {0};
    if (epx_comm_allreduce_sum(comm, &refused, &refused, 1, EPX_DTYPE_I64, &err) != EPX_OK)
        return cli_report(cmd, &err);
    return refused > 0 ? CLI_EXIT_USAGE : -1;
}
#endif

static int bench_mpi(cli_cmd *cmd, bench_args *a, int argc, char **argv) {
#if BENCH_MPI
    MPI_Init(&argc, &argv);
    epx_comm_mpi_opts o = EPX_COMM_MPI_OPTS_INIT;
    o.timeout_ms = a->timeout_ms;
    epx_comm *comm = NULL;
    epx_error err = {0};
    int rc;
    if (epx_comm_mpi_create(MPI_COMM_WORLD, &o, &comm, &err) != EPX_OK) {
        rc = cli_report(cmd, &err);
    } else if ((rc = ranks_fit(cmd, comm, a)) < 0) {
        dev_ops d = {0, "cpu"};
        rc = run_and_report(cmd, comm, &d, a);
    }
    bool healthy = comm != NULL && epx_comm_health(comm, NULL) == EPX_OK;
    epx_comm_destroy(comm);
    if (!healthy) MPI_Abort(MPI_COMM_WORLD, rc ? rc : 1); /* a peer is gone: end the job */
    MPI_Finalize();
    return rc;
#else
    (void)a, (void)argc, (void)argv;
    (void)run_and_report; /* used by whichever backend is built */
    fprintf(stderr,
            "epx %s: this epx was built without MPI (Open MPI not found at configure time): "
            "install libopenmpi-dev and reconfigure for --backend mpi\n",
            cmd->name);
    return CLI_EXIT_FAIL;
#endif
}

#if BENCH_NCCL
/* One rank's run of the GPU low-latency engine (bench_ll_gpu), its JSON
 * lines written by rank 0. */
static int ll_rank(cli_cmd *cmd, epx_comm *comm, ncclComm_t nc, cudaStream_t s,
                   const bench_args *a) {
    epx_error err = {0};
    const bool first = epx_comm_rank(comm) == 0;
    FILE *jl = first ? open_jsonl(a) : NULL;
    epx_status st = first && a->jsonl != NULL && jl == NULL
                        ? EPX_ERR_IO
                        : bench_ll_gpu(comm, nc, s, a, jl, &err);
    if (jl != NULL && jl != stdout) fclose(jl);
    return st == EPX_OK ? CLI_EXIT_OK : st == EPX_ERR_IO ? CLI_EXIT_FAIL : cli_report(cmd, &err);
}

/* One rank of the NCCL benchmark: its GPU, its communicator from the job's
 * unique id, the run, the teardown. Called once per process, or from one
 * thread per GPU with --gpus. */
typedef struct nccl_rank_job {
    cli_cmd *cmd;
    const bench_args *a;
    int size, rank, device;
    ncclUniqueId id;
    int rc;
} nccl_rank_job;

static void *nccl_rank(void *vjob) {
    nccl_rank_job *j = vjob;
    const bench_args *a = j->a;
    j->rc = CLI_EXIT_FAIL;
    if (cudaSetDevice(j->device) != cudaSuccess) {
        fprintf(stderr, "epx %s: rank %d: cannot use GPU %d\n", j->cmd->name, j->rank, j->device);
        return NULL;
    }
    ncclComm_t nc = NULL;
    epx_error err = {0};
    cudaStream_t s = NULL;
    epx_comm *comm = NULL;
    if (epx_nccl_comm_init(j->size, j->rank, &j->id, a->timeout_ms, &nc, &err) != EPX_OK) {
        j->rc = cli_report(j->cmd, &err);
    } else {
        epx_comm_nccl_opts o = EPX_COMM_NCCL_OPTS_INIT;
        o.timeout_ms = a->timeout_ms;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        if (epx_comm_nccl_create(nc, s, &o, &comm, &err) != EPX_OK) {
            j->rc = cli_report(j->cmd, &err);
        } else {
            struct cudaDeviceProp prop;
            dev_ops d = {1, cudaGetDeviceProperties(&prop, j->device) == cudaSuccess ? prop.name
                                                                                     : "gpu"};
            if (a->gpu_engine) {
                j->rc = ll_rank(j->cmd, comm, nc, s, a);
            } else {
                j->rc = run_and_report(j->cmd, comm, &d, a);
            }
        }
    }
    bool healthy = comm != NULL && epx_comm_health(comm, NULL) == EPX_OK;
    epx_comm_destroy(comm);
    if (nc != NULL && healthy) ncclCommDestroy(nc);
    if (s) cudaStreamDestroy(s);
    return NULL;
}

/* --gpus N: every rank a thread of this process on its own GPU (0..N-1 of
 * the visible ones), so the measurement needs no MPI; same-process ranks
 * reach each other's buffers by pointer. */
static int nccl_threads(cli_cmd *cmd, const bench_args *a, const ncclUniqueId *id) {
    nccl_rank_job *jobs = calloc((size_t)a->gpus, sizeof *jobs);
    pthread_t *th = calloc((size_t)a->gpus, sizeof *th);
    int rc = CLI_EXIT_OK;
    if (jobs == NULL || th == NULL) {
        fprintf(stderr, "epx bench comm: out of memory for %d ranks\n", a->gpus);
        rc = CLI_EXIT_FAIL;
    }
    int32_t started = 0;
    for (; rc == CLI_EXIT_OK && started < a->gpus; started++) {
        jobs[started] = (nccl_rank_job){cmd, a, a->gpus, started, started, *id, CLI_EXIT_FAIL};
        if (pthread_create(&th[started], NULL, nccl_rank, &jobs[started]) != 0) {
            /* the ranks already started wait for this one in NCCL's init:
             * nothing can end them cleanly, so the process ends */
            fprintf(stderr, "epx bench comm: cannot start the thread of rank %d of %d\n", started,
                    a->gpus);
            exit(CLI_EXIT_FAIL);
        }
    }
    for (int32_t r = 0; r < started; r++) {
        pthread_join(th[r], NULL);
        if (jobs[r].rc != CLI_EXIT_OK && rc == CLI_EXIT_OK) rc = jobs[r].rc;
    }
    free(jobs);
    free(th);
    return rc;
}
#endif

#if BENCH_NCCL && BENCH_MPI
/* A launcher's count as a whole number >= 0, or `dflt`. */
static long env_count(const char *name, long dflt) {
    const char *v = getenv(name);
    char *end = NULL;
    errno = 0;
    long n = v ? strtol(v, &end, 10) : -1;
    return v && errno == 0 && end != v && *end == '\0' && n >= 0 && n <= INT32_MAX ? n : dflt;
}

/* One rank under mpirun where this host runs more ranks than it has GPUs:
 * NCCL takes one rank per GPU, so the low-latency engine bootstraps over
 * MPI instead and the ranks share GPUs as the engine's own tests do (CUDA
 * IPC or host memory). Its figures show the protocol and, over host
 * memory, the link with 2-4 ranks; not separate GPUs, and no TP figure. */
static int shared_gpu_rank(cli_cmd *cmd, const bench_args *a, int rank, int device, int local_size,
                           int ndev) {
    if (!a->gpu_engine || a->transport == EPX_BENCH_TRANSPORT_NCCL) {
        if (rank == 0)
            fprintf(stderr,
                    "epx bench comm: a host runs more ranks than it has GPUs (this one: %d ranks, "
                    "%d GPU(s)), and NCCL takes one rank per GPU: then only the GPU engine runs "
                    "(not --engine nccl), over --transport peer, host or auto (it bootstraps over "
                    "MPI); run at most one rank per GPU for the rest\n",
                    local_size, ndev);
        return CLI_EXIT_USAGE;
    }
    if (cudaSetDevice(device) != cudaSuccess) {
        fprintf(stderr, "epx bench comm: cannot use GPU %d\n", device);
        return CLI_EXIT_FAIL;
    }
    epx_comm_mpi_opts o = EPX_COMM_MPI_OPTS_INIT;
    o.timeout_ms = a->timeout_ms;
    epx_comm *comm = NULL;
    epx_error err = {0};
    cudaStream_t s = NULL;
    int rc = CLI_EXIT_FAIL;
    if (epx_comm_mpi_create(MPI_COMM_WORLD, &o, &comm, &err) != EPX_OK) {
        rc = cli_report(cmd, &err);
    } else if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        fprintf(stderr, "epx bench comm: cannot create a CUDA stream on GPU %d\n", device);
    } else {
        rc = ll_rank(cmd, comm, NULL, s, a);
    }
    bool healthy = comm != NULL && epx_comm_health(comm, NULL) == EPX_OK;
    epx_comm_destroy(comm);
    if (s) cudaStreamDestroy(s);
    if (!healthy) MPI_Abort(MPI_COMM_WORLD, rc ? rc : 1); /* a peer is gone: end the job */
    return rc;
}
#endif

static int bench_nccl(cli_cmd *cmd, bench_args *a, int argc, char **argv) {
#if BENCH_NCCL
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        fprintf(stderr, "epx bench comm: --backend nccl needs a CUDA GPU, and none is visible\n");
        return CLI_EXIT_FAIL;
    }
    if (a->gpus > ndev) {
        fprintf(stderr,
                "epx bench comm: --gpus %d asks for more GPUs than the %d this process sees "
                "(CUDA_VISIBLE_DEVICES selects them): give --gpus %d or fewer\n",
                a->gpus, ndev, ndev);
        return CLI_EXIT_USAGE;
    }
    nccl_rank_job one = {cmd, a, 1, 0, 0, {{0}}, CLI_EXIT_FAIL};
#if BENCH_MPI
    /* Under mpirun, MPI carries the unique id and nothing else. */
    bool use_mpi = getenv("OMPI_COMM_WORLD_SIZE") != NULL || getenv("PMI_SIZE") != NULL;
    if (use_mpi && a->gpus > 0) {
        fprintf(stderr, "epx bench comm: --gpus runs every rank in this one process; under "
                        "mpirun each process is one rank already: drop --gpus or mpirun\n");
        return CLI_EXIT_USAGE;
    }
    if (use_mpi) {
        MPI_Init(&argc, &argv);
        MPI_Comm_rank(MPI_COMM_WORLD, &one.rank);
        MPI_Comm_size(MPI_COMM_WORLD, &one.size);
        /* The launcher's local rank picks the GPU; anything but a whole
         * number >= 0 (never atoi's wrap or a negative device) falls back
         * to the rank. */
        const int local = (int)env_count("OMPI_COMM_WORLD_LOCAL_RANK", one.rank);
        one.device = local % ndev;
        /* Ranks on this host (any launcher), and whether some host has more
         * than GPUs: then every rank takes the shared path, or some would
         * wait in NCCL for ranks that never come. */
        MPI_Comm node;
        int local_size = 1, shared = 0, any_shared = 0;
        if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) ==
            MPI_SUCCESS) {
            MPI_Comm_size(node, &local_size);
            MPI_Comm_free(&node);
        }
        shared = local_size > ndev;
        MPI_Allreduce(&shared, &any_shared, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (any_shared) {
            int rc = shared_gpu_rank(cmd, a, one.rank, one.device, local_size, ndev);
            MPI_Finalize();
            return rc;
        }
        if (one.rank == 0) ncclGetUniqueId(&one.id);
        MPI_Bcast(&one.id, (int)sizeof one.id, MPI_BYTE, 0, MPI_COMM_WORLD);
    } else
#endif
    {
        (void)argc, (void)argv;
        ncclGetUniqueId(&one.id);
    }
    int rc;
    if (a->gpus > 0) {
        rc = nccl_threads(cmd, a, &one.id);
    } else {
        nccl_rank(&one);
        rc = one.rc;
    }
#if BENCH_MPI
    if (use_mpi) MPI_Finalize();
#endif
    return rc;
#else
    (void)a, (void)argc, (void)argv;
    fprintf(stderr,
            "epx %s: this epx was built without NCCL (needs nvcc and nccl.h/libnccl under "
            "/usr/local/cuda at configure time): rebuild there for --backend nccl\n",
            cmd->name);
    return CLI_EXIT_FAIL;
#endif
}

int cmd_bench(int argc, char **argv) {
    cli_opt opts[] = {
        {"--backend", "mpi|nccl",
         "communicator: MPI on host buffers (run under mpirun) or NCCL on GPUs", NULL},
        {"--model", "NAME|PATH",
         "model: a config.json or its folder, or a name (kimi-k2.5, deepseek-v3, qwen3-235b, ...)",
         NULL},
        {"--tokens", "LIST", "tokens per rank, comma-separated (e.g. 1,64,512,4096)", NULL},
        {"--iters", "N", "timed iterations per point (default 20)", NULL},
        {"--warmup", "N", "untimed iterations first (default 3)", NULL},
        {"--dtype", "bf16|f32",
         "element type of x, expert outputs and the all-reduce "
         "(default: f32 for mpi, bf16 for nccl)",
         NULL},
        {"--combine", "topk|rank",
         "combine order: per (token, k) rows in top-k order (default), "
         "or per-rank partial sums",
         NULL},
        {"--redundant", "R",
         "redundant expert slots, P = E + R rounded up to a multiple of the ranks", NULL},
        {"--timeout-ms", "MS", "per-operation timeout before a rank gives up (default 60000)",
         NULL},
        {"--seed", "S", "routing and data seed (default 1)", NULL},
        {"--mode", "normal|low-latency",
         "EP mode: counts first, dense sends (default), or "
         "fixed slots with in-band counts (decode)",
         NULL},
        {"--engine", "gpu|nccl",
         "normal mode over NCCL: the GPU engine's compact receive (gpu, the default with "
         "top-k combine) or the older NCCL send/recv path (nccl; also --combine rank)",
         NULL},
        {"--graph", NULL, "also time CUDA-graph replays (the GPU engine: --backend nccl)", NULL},
        {"--fp8", NULL,
         "dispatch in DeepEP's fp8 form: e4m3 values and one fp32 scale per 128 (--backend nccl "
         "--mode low-latency); combine stays bf16",
         NULL},
        {"--transport", "auto|peer|host|nccl",
         "the GPU engine's transport: device memory (peer: pointers or CUDA IPC), pinned "
         "host memory (host, for GPUs without peer access), NCCL send/recv (nccl, any topology), "
         "or auto (EPX_GPU_EP_TRANSPORT, else by peer access)",
         NULL},
        {"--token-bound", "tokens|max",
         "the GPU engine's promise of tokens per rank per call "
         "(epx_gpu_ep_set_token_bound): each batch's own count (default) or the largest "
         "--tokens; the nccl transport moves blocks of that many tokens",
         NULL},
        {"--max-blocks", "N",
         "the GPU engine's blocks per launch at most (default: as many as fit on the "
         "GPU); processes sharing one GPU under MPS need their launches to fit side by side",
         NULL},
        {"--gpus", "N",
         "NCCL: run N ranks as threads of this one process, one per visible GPU (no mpirun)", NULL},
        {"--json", "FILE", "append one JSON object per phase and token count to FILE (- = stdout)",
         NULL},
        {"-o", "FILE", "also write the summary JSON that epx advise --measured reads", NULL},
        {NULL, NULL, NULL, NULL},
    };
    /* Named with its one action from the start, so the parser's messages say
     * "epx bench comm:" as every later one does. */
    cli_cmd cmd = {"bench comm",
                   "epx bench comm --backend mpi|nccl --model NAME|PATH --tokens LIST [--mode "
                   "normal|low-latency]\n"
                   "       [--graph] [--json FILE] [-o FILE] [options]\n"
                   "       (MPI: mpirun -np R epx bench comm --backend mpi ...;\n"
                   "        NCCL: epx bench comm --backend nccl --gpus N ..., or under mpirun;\n"
                   "        more ranks than GPUs under mpirun: the GPU engine alone,\n"
                   "        its ranks sharing the GPUs, bootstrapped over MPI)",
                   "Time EP dispatch and combine against the TP all-reduce of the same MoE layer, "
                   "per token count, after checking their results.",
                   opts,
                   1,
                   {0},
                   0};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc >= 0) return rc;
    if (cmd.num_positional != 1 || strcmp(cmd.positional[0], "comm") != 0) {
        fprintf(stderr, "epx bench: the benchmark to run is 'comm' (epx bench comm ...)\n");
        return CLI_EXIT_USAGE;
    }
    bench_args a;
    rc = parse_args(&cmd, &a);
    if (rc >= 0) {
        free(a.tokens);
        return rc;
    }
    rc = strcmp(a.backend, "mpi") == 0 ? bench_mpi(&cmd, &a, argc, argv)
                                       : bench_nccl(&cmd, &a, argc, argv);
    free(a.tokens);
    return rc;
}
