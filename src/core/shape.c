/*
 * shape.c - validation of the model/cluster shape and the load tensor.
 *
 * The shape check is where most configuration mistakes surface, so each
 * message names the values and proposes the nearest valid alternative (the
 * error SGLang would raise as a bare assertion deep in a stack).
 */
#include "internal.h"

#include <math.h>
#include <stdio.h>

#include <string.h>

epx_status epx_shape_check(const epx_shape *s, epx_error *err) {
    if (s == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "shape is NULL");
    const int32_t L = s->num_layers, E = s->num_logical_experts, P = s->num_physical_experts;
    const int32_t G = s->num_gpus, N = s->num_nodes;
    if (L < 1 || L > EPX_MAX_LAYERS)
        return epxi_fail(err, EPX_ERR_SHAPE, "num_layers (%d) must be in [1, %d]", L,
                         EPX_MAX_LAYERS);
    if (E < 1 || E > EPX_MAX_EXPERTS)
        return epxi_fail(err, EPX_ERR_SHAPE, "num_logical_experts (%d) must be in [1, %d]", E,
                         EPX_MAX_EXPERTS);
    if (G < 1 || G > EPX_MAX_GPUS)
        return epxi_fail(err, EPX_ERR_SHAPE, "num_gpus (%d) must be in [1, %d]", G, EPX_MAX_GPUS);
    if (N < 1 || N > G)
        return epxi_fail(err, EPX_ERR_SHAPE, "num_nodes (%d) must be in [1, num_gpus = %d]", N, G);
    if (G % N != 0)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "num_gpus (%d) is not a multiple of num_nodes (%d): every node must "
                         "hold the same number of GPUs; use %d or %d GPUs, or a divisor of %d "
                         "as the node count",
                         G, N, (G / N) * N > 0 ? (G / N) * N : N, (G / N + 1) * N, G);
    if (P < 1 || P > 2 * EPX_MAX_EXPERTS)
        return epxi_fail(err, EPX_ERR_SHAPE, "num_physical_experts (%d) must be in [1, %d]", P,
                         2 * EPX_MAX_EXPERTS);
    if (P < E)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "num_physical_experts (%d) is below num_logical_experts (%d): every "
                         "logical expert needs a slot; use P >= %d (P = E + redundant)",
                         P, E, E);
    if (P < G)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "num_physical_experts (%d) is below num_gpus (%d): every GPU needs at "
                         "least one slot; use P >= %d or fewer GPUs",
                         P, G, G);
    if (P % G != 0) {
        /* P often comes from a file (a placement): name the GPU counts that
         * fit it first (divisors of P, multiples of N, nearest to G), then
         * the P that fits G. */
        int32_t below = 0, above = 0;
        for (int32_t d = G - 1; d >= N && below == 0; d--)
            if (P % d == 0 && d % N == 0) below = d;
        for (int32_t d = G + 1; d <= P && d <= EPX_MAX_GPUS && above == 0; d++)
            if (P % d == 0 && d % N == 0) above = d;
        char gpus[96];
        if (below && above)
            snprintf(gpus, sizeof gpus, "%d or %d GPUs", below, above);
        else
            snprintf(gpus, sizeof gpus, "%d GPUs", below ? below : above);
        int32_t lo = (P / G) * G, hi = lo + G;
        char slots[64];
        if (lo >= E)
            snprintf(slots, sizeof slots, "%d or %d", lo, hi);
        else
            snprintf(slots, sizeof slots, "%d", hi);
        if (!below && !above) /* "use 1 GPUs" was offered, on 2 nodes too */
            return epxi_fail(err, EPX_ERR_SHAPE,
                             "num_physical_experts (%d) is not a multiple of num_gpus (%d), and "
                             "no other GPU count on %d node(s) divides it: use %s slots for %d "
                             "GPUs",
                             P, G, N, slots, G);
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "num_physical_experts (%d) is not a multiple of num_gpus (%d): with %d "
                         "slots use %s (divisors of %d), or use %s slots for %d GPUs",
                         P, G, P, gpus, P, slots, G);
    }
    /* The largest derived map is logical_to_all_physical, L * E * (P - E + 1). */
    size_t a, b;
    if (!epxi_mul_size((size_t)L, (size_t)E, &a) || !epxi_mul_size(a, (size_t)(P - E + 1), &b) ||
        !epxi_mul_size(b, sizeof(int32_t), &a) || a > EPXI_MAX_ARRAY_BYTES)
        return epxi_fail(err, EPX_ERR_OVERFLOW,
                         "shape L=%d E=%d P=%d is too large: its replica map would need more "
                         "than 1 TiB",
                         L, E, P);
    return EPX_OK;
}

bool epxi_shape_equal(const epx_shape *a, const epx_shape *b) {
    return a->num_layers == b->num_layers && a->num_logical_experts == b->num_logical_experts &&
           a->num_physical_experts == b->num_physical_experts && a->num_gpus == b->num_gpus &&
           a->num_nodes == b->num_nodes;
}

epx_status epxi_check_same_shape(const epx_shape *a, const epx_shape *b, const char *head,
                                 const char *mid, const char *tail, epx_error *err) {
    if (epxi_shape_equal(a, b)) return EPX_OK;
    return epxi_fail(err, EPX_ERR_SHAPE, "%s" EPXI_SHAPE_FMT "%s" EPXI_SHAPE_FMT "%s", head,
                     EPXI_SHAPE_ARGS(a), mid, EPXI_SHAPE_ARGS(b), tail);
}

int32_t epx_shape_slots_per_gpu(const epx_shape *s) {
    if (s == NULL || s->num_gpus < 1) return 0; /* no shape: nothing to divide */
    return s->num_physical_experts / s->num_gpus;
}

static epx_status counts_shape(int32_t S, int32_t L, int32_t E, const char *fn, epx_error *err) {
    if (S < 1 || L < 1 || E < 1 || L > EPX_MAX_LAYERS || E > EPX_MAX_EXPERTS || S > (1 << 24))
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "%s: counts shape [S=%d][L=%d][E=%d] is invalid: each must be >= 1 "
                         "(S <= %d, L <= %d, E <= %d)",
                         fn, S, L, E, 1 << 24, EPX_MAX_LAYERS, EPX_MAX_EXPERTS);
    /* 2^24 windows of 65,536 layers of 2^20 experts, each within its
     * limit, asked calloc for 2^63 bytes */
    if ((size_t)S * (size_t)L * (size_t)E > EPXI_MAX_ARRAY_BYTES / sizeof(double))
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "%s: counts of [%d][%d][%d] would take %.3g TB, above the 1 TiB one "
                         "tensor may take: fewer windows, layers or experts",
                         fn, S, L, E, (double)S * L * E * 8 / 1e12);
    return EPX_OK;
}

epx_status epxi_counts_valid(const epx_counts *c, const char *fn, epx_error *err) {
    if (c == NULL || c->data == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "%s: the counts or their data are NULL", fn);
    return counts_shape(c->num_windows, c->num_layers, c->num_experts, fn, err);
}

epx_status epx_counts_create(int32_t S, int32_t L, int32_t E, epx_counts **out, epx_error *err) {
    if (out == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "epx_counts_create: out is NULL");
    EPX_TRY(counts_shape(S, L, E, "epx_counts_create", err));
    const size_t n = (size_t)S * (size_t)L * (size_t)E;
    epx_counts *c = epxi_calloc(1, sizeof *c, "counts", err);
    if (c == NULL) return err ? err->status : EPX_ERR_NOMEM;
    c->data = epxi_calloc(n, sizeof(double), "counts data", err);
    if (c->data == NULL) {
        free(c);
        return err ? err->status : EPX_ERR_NOMEM;
    }
    c->num_windows = S;
    c->num_layers = L;
    c->num_experts = E;
    *out = c;
    return EPX_OK;
}

epx_status epxi_check_load_total(double total, const char *what, epx_status status,
                                 epx_error *err) {
    if (total <= EPXI_MAX_LOAD_TOTAL) return EPX_OK;
    char sum[48];
    if (isfinite(total))
        snprintf(sum, sizeof sum, "%g", total);
    else
        snprintf(sum, sizeof sum, "more than a double holds");
    return epxi_fail(err, status,
                     "the %s sum to %s, above 2^63 (%g, what SGLang's int64 counts hold): "
                     "they are token counts; scale them down",
                     what, sum, EPXI_MAX_LOAD_TOTAL);
}

epx_status epxi_counts_check_total(const epx_counts *c, epx_error *err) {
    const size_t n = (size_t)c->num_windows * (size_t)c->num_layers * (size_t)c->num_experts;
    double total = 0.0;
    for (size_t i = 0; i < n; i++) total += c->data[i];
    return epxi_check_load_total(total, "loads", EPX_ERR_PARSE, err);
}

epx_status epxi_check_loads(const double *w, size_t n, const char *what, epx_error *err) {
    double total = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!(w[i] >= 0.0) || !isfinite(w[i]))
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "%s[%zu] is %g: loads must be finite and >= 0", what, i, w[i]);
        total += w[i];
    }
    char name[64];
    snprintf(name, sizeof name, "entries of %s", what);
    return epxi_check_load_total(total, name, EPX_ERR_INVALID_ARG, err);
}

void epx_counts_destroy(epx_counts *c) {
    if (c == NULL) return;
    free(c->data);
    free(c);
}

epx_status epx_counts_sum_windows(const epx_counts *c, int32_t first, int32_t n, double *out,
                                  epx_error *err) {
    if (out == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    EPX_TRY(epxi_counts_valid(c, "epx_counts_sum_windows", err));
    if (n < 1 || first < 0 || first > c->num_windows - n)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "window range [%d, %lld) is empty or outside the %d windows", first,
                         (long long)first + n, c->num_windows);
    const size_t le = (size_t)c->num_layers * (size_t)c->num_experts;
    for (size_t i = 0; i < le; i++) out[i] = epxi_window_sum(c, first, n, i);
    return EPX_OK;
}

double *epxi_sum_load(const epx_counts *counts, epx_error *err) {
    const size_t le = (size_t)counts->num_layers * (size_t)counts->num_experts;
    double *load = epxi_calloc(le, sizeof *load, "summed load", err);
    if (load == NULL) return NULL;
    for (size_t i = 0; i < le; i++) load[i] = epxi_window_sum(counts, 0, counts->num_windows, i);
    return load;
}
