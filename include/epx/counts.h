/*
 * epx/counts.h - expert load: tokens (or any non-negative load) routed to each
 * logical expert, as SGLang's `logical_count`, over S windows or passes.
 * Include epx.h, not this file.
 */
#ifndef EPX_COUNTS_H
#define EPX_COUNTS_H

/*
 * A load tensor [S][L][E], row-major. A plain descriptor: its fields may be
 * read and `data` written directly. Owned by whoever created it; release with
 * epx_counts_destroy. An [L][E] file reads as S = 1.
 */
typedef struct epx_counts {
    int32_t num_windows; /* S >= 1 */
    int32_t num_layers;  /* L >= 1 */
    int32_t num_experts; /* E >= 1 */
    double *data;        /* [S][L][E], every entry finite and >= 0 */
} epx_counts;

/*
 * Allocate a zeroed [S][L][E] load tensor.
 * Returns: EPX_OK, EPX_ERR_SHAPE (a size < 1 or above the limits),
 *          EPX_ERR_OVERFLOW, EPX_ERR_NOMEM.
 */
EPX_API epx_status epx_counts_create(int32_t num_windows, int32_t num_layers, int32_t num_experts,
                                     epx_counts **out, epx_error *err);

/* Release a load tensor. Accepts NULL. */
EPX_API void epx_counts_destroy(epx_counts *counts);

/* Pointer to window s, layer l: E doubles. No range check beyond debug. */
static inline double *epx_counts_row(const epx_counts *c, int32_t s, int32_t l) {
    return c->data + ((size_t)s * (size_t)c->num_layers + (size_t)l) * (size_t)c->num_experts;
}

/* Sum windows [first, first + n) into out [L][E] (caller-owned).
 * Returns EPX_ERR_INVALID_ARG when the range is empty or outside [0, S). */
EPX_API epx_status epx_counts_sum_windows(const epx_counts *counts, int32_t first, int32_t n,
                                          double *out, epx_error *err);

#endif /* EPX_COUNTS_H */
