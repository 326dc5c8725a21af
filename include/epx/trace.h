/*
 * epx/trace.h - synthetic expert-load traces for the built-in models
 * (epx/model.h): what `epx trace synth` writes, what the demo and the tests
 * run on when no recorded load is at hand.
 *
 * The generator, per layer that has routed experts:
 *  - popularity: log w_e = sigma_l * z_e with z_e standard normal and the
 *    layer's skew sigma_l drawn uniformly from [skew_lo, skew_hi];
 *  - drift: before every window after the first, log w_e += drift * z'_e (a
 *    multiplicative lognormal random walk), so hot experts cool and cold
 *    ones warm up slowly, as in served traffic;
 *  - routing: each of T tokens picks top_k distinct experts, so no expert
 *    can take more than T tokens a window. Expected counts T * top_k * p_e
 *    (p = w normalised) are capped at T by water-filling, the excess going
 *    to the others in proportion to their weight;
 *  - shift (shift_window W > 0): at window W, in a share shift_layers of the
 *    loaded layers (each layer drawn with that probability), the experts'
 *    log popularities are dealt out again in a random order: the skew
 *    stays, the hot experts move, as when a deployment's traffic changes;
 *  - sampling noise: the counts of a window are one multinomial draw of
 *    T * top_k assignments over the capped expectations, drawn as a chain
 *    of conditional binomials (exact inversion when a binomial's mean is
 *    below 30, a rounded normal otherwise). Every row of a loaded layer sums
 *    to exactly T * top_k and no entry exceeds T.
 * With per_pass N > 1 each window is written as N consecutive rows, one per
 * forward pass, the shape of a recorder's per-pass dump: pass j holds T / N
 * tokens (the first T % N passes one more), so every loaded layer of it
 * sums to its tokens x top_k, as a real pass does, and no expert exceeds
 * its tokens; the window's counts are dealt out pass by pass in proportion
 * to what each expert has left (a capped draw: sparse when T / N is small),
 * and the N rows sum to the window exactly. The counts are then
 * [S * N][L][E].
 * Dense layers (the first first_k_dense) are rows of zeros, as SGLang's
 * logical_count has them. Every random draw comes from a stream keyed by
 * (seed, layer, window, purpose), so the same seed gives the same trace
 * bit for bit, and a trace of S windows is a prefix of one of S + 1.
 * Include epx.h, not this file.
 */
#ifndef EPX_TRACE_H
#define EPX_TRACE_H

/* What epx_trace_synth needs besides the model. */
typedef struct epx_trace_opts {
    uint32_t version;     /* EPX_TRACE_OPTS_VERSION */
    int32_t num_windows;  /* S >= 1 (default 8) */
    int64_t tokens;       /* T, tokens per window, in [1, 2^40] (default 65536) */
    uint64_t seed;        /* any value (default 0) */
    double skew_lo;       /* per-layer sigma of log popularity is uniform in */
    double skew_hi;       /*   [skew_lo, skew_hi]; 0 <= lo <= hi <= 5 (default 0.8..1.3) */
    double drift;         /* sd of the per-window log step, in [0, 5] (default 0.1) */
    int32_t shift_window; /* window at which hot experts move; 0 = never (default) */
    int32_t per_pass;     /* rows written per window, in [1, 2^16] (default 1) */
    double shift_layers;  /* share of loaded layers that shift, in [0, 1] (default 0.5) */
} epx_trace_opts;
#define EPX_TRACE_OPTS_VERSION ((uint32_t)sizeof(epx_trace_opts))
#define EPX_TRACE_OPTS_INIT                                                                        \
    { EPX_TRACE_OPTS_VERSION, 8, 65536, 0, 0.8, 1.3, 0.1, 0, 1, 0.5 }

/*
 * Synthesize a load trace for a model (see the top of this file).
 * Args:    model (in) from epx_model_lookup, or a caller-filled descriptor
 *          (1 <= top_k <= num_experts, 0 <= first_k_dense <= num_layers);
 *          opts (in) EPX_TRACE_OPTS_INIT plus changes;
 *          out (out) [S][L][E] counts (integers stored as doubles), owned by
 *          the caller (epx_counts_destroy).
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG for an option out of range (names it
 *          and the range) or a bad model descriptor; EPX_ERR_SHAPE,
 *          EPX_ERR_OVERFLOW, EPX_ERR_NOMEM from the allocation.
 * Thread:  any thread; no shared state.
 */
EPX_API epx_status epx_trace_synth(const epx_model *model, const epx_trace_opts *opts,
                                   epx_counts **out, epx_error *err);

#endif /* EPX_TRACE_H */
