/*
 * trace.c - the synthetic load generator (the model is described in
 * include/epx/trace.h); the model shapes it draws for are core's
 * (src/core/models.c).
 *
 * The generator's defaults (skew 0.8..1.3,
 * drift 0.1) are those of the traces in shared/traces: bench/RESULTS.md
 * records the measured balancedness and skew of both side by side.
 *
 * Determinism is the point of a synthetic trace, so every draw comes from a
 * splitmix64 stream whose state is a hash of (seed, layer, window, purpose):
 * nothing depends on the order layers are generated in, and adding windows
 * never changes the earlier ones.
 */
#include <math.h>
#include <string.h>

#include "internal.h"

/* ---- random streams ------------------------------------------------------ */

typedef struct {
    uint64_t s;
    double spare; /* the second normal of a polar pair */
    bool has_spare;
} stream;

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Purposes of a stream: the layer's skew and first popularity, a drift
 * step, the sampling noise of one window. */
enum {
    PURPOSE_POPULARITY = 1,
    PURPOSE_DRIFT = 2,
    PURPOSE_SAMPLE = 3,
    PURPOSE_SHIFT = 4,
    PURPOSE_PASS = 5
};

static stream stream_for(uint64_t seed, int32_t layer, int32_t window, int purpose) {
    uint64_t h = mix64(seed ^ 0x6570782d74726163ull); /* "epx-trac" */
    h = mix64(h ^ ((uint64_t)(uint32_t)layer << 32 | (uint32_t)window));
    h = mix64(h + (uint64_t)purpose * 0x9E3779B97F4A7C15ull);
    stream st = {h, 0.0, false};
    return st;
}

static uint64_t next_u64(stream *r) { return mix64(r->s += 0x9E3779B97F4A7C15ull); }

/* Uniform in [0, 1) with 53 random bits. */
static double uniform(stream *r) { return (double)(next_u64(r) >> 11) * 0x1.0p-53; }

/* Standard normal by Marsaglia's polar method. */
static double normal(stream *r) {
    if (r->has_spare) {
        r->has_spare = false;
        return r->spare;
    }
    double u, v, s;
    do {
        u = 2.0 * uniform(r) - 1.0;
        v = 2.0 * uniform(r) - 1.0;
        s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    double f = sqrt(-2.0 * log(s) / s);
    r->spare = v * f;
    r->has_spare = true;
    return u * f;
}

/*
 * Binomial(n, q). Exact inversion when the smaller tail's mean is below 30
 * (expected work ~ that mean); otherwise a rounded normal with the same mean
 * and variance, clamped to [0, n]. The normal branch only runs where the
 * binomial is already close to normal, which is all a load trace needs.
 */
static int64_t binomial(stream *r, int64_t n, double q) {
    if (n <= 0 || q <= 0.0) return 0;
    if (q >= 1.0) return n;
    bool flip = q > 0.5;
    double p = flip ? 1.0 - q : q;
    double mean = (double)n * p;
    int64_t k;
    if (mean < 30.0) {
        double u = uniform(r);
        double prob = exp((double)n * log1p(-p)); /* P(X = 0) */
        double cdf = prob, ratio = p / (1.0 - p);
        k = 0;
        while (u > cdf && k < n) {
            prob *= ratio * (double)(n - k) / (double)(k + 1);
            k++;
            cdf += prob;
            if (prob < 1e-300 && (double)k > mean) break; /* the tail is exhausted */
        }
    } else {
        double x = nearbyint(mean + sqrt(mean * (1.0 - p)) * normal(r));
        k = x < 0.0 ? 0 : x > (double)n ? n : (int64_t)x;
    }
    return flip ? n - k : k;
}

/* ---- the generator -------------------------------------------------------- */

static epx_status check_inputs(const epx_model *m, const epx_trace_opts *o, epx_error *err) {
    if (m == NULL || o == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    EPX_TRY(epxi_check_version(o->version, EPX_TRACE_OPTS_VERSION, "epx_trace_opts",
                               "EPX_TRACE_OPTS_INIT", err));
    if (m->num_layers < 1 || m->num_layers > EPX_MAX_LAYERS)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "model num_layers (%d) must be in [1, %d]",
                         m->num_layers, EPX_MAX_LAYERS);
    if (m->num_experts < 1 || m->num_experts > EPX_MAX_EXPERTS)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "model num_experts (%d) must be in [1, %d]",
                         m->num_experts, EPX_MAX_EXPERTS);
    if (m->top_k < 1 || m->top_k > m->num_experts)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "model top_k (%d) must be in [1, num_experts = %d]: a token picks "
                         "distinct experts",
                         m->top_k, m->num_experts);
    if (m->first_k_dense < 0 || m->first_k_dense > m->num_layers)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "model first_k_dense (%d) must be in [0, num_layers = %d]",
                         m->first_k_dense, m->num_layers);
    if (o->num_windows < 1 || o->num_windows > (1 << 24))
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "num_windows (%d) must be in [1, %d]",
                         o->num_windows, 1 << 24);
    if (o->tokens < 1 || o->tokens > ((int64_t)1 << 40))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "tokens (%lld) must be in [1, 2^40 = %lld] per window",
                         (long long)o->tokens, (long long)((int64_t)1 << 40));
    if (!(o->skew_lo >= 0.0 && o->skew_lo <= o->skew_hi && o->skew_hi <= 5.0))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "skew range %g..%g must satisfy 0 <= lo <= hi <= 5 (the sigma of log "
                         "popularity; shared/traces use 0.8..1.3)",
                         o->skew_lo, o->skew_hi);
    if (!(o->drift >= 0.0 && o->drift <= 5.0))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "drift %g must be in [0, 5] (the sd of the per-window log step; "
                         "shared/traces use 0.1)",
                         o->drift);
    if (o->shift_window < 0 || o->shift_window > (1 << 24))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "shift_window (%d) must be in [0, %d]: the window at which hot experts "
                         "move, 0 for never",
                         o->shift_window, 1 << 24);
    if (!(o->shift_layers >= 0.0 && o->shift_layers <= 1.0))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "shift_layers %g must be in [0, 1] (the share of layers that shift)",
                         o->shift_layers);
    if (o->per_pass < 1 || o->per_pass > (1 << 16))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "per_pass (%d) must be in [1, %d]: the rows written per window",
                         o->per_pass, 1 << 16);
    if ((int64_t)o->num_windows * o->per_pass > (1 << 24))
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "num_windows x per_pass (%d x %d) is above %d rows: fewer windows or "
                         "passes",
                         o->num_windows, o->per_pass, 1 << 24);
    return EPX_OK;
}

/*
 * Expected counts lam[e] = TK * w[e] / sum(w), capped at T by water-filling:
 * an expert whose share would exceed T is fixed at T and the rest is spread
 * again over the others. Returns how many experts sit at the cap (flagged
 * in capped[]). Each round caps at least one more expert, so at most E
 * rounds run; in practice one or two.
 */
static int32_t capped_expectations(const double *w, int32_t E, double T, double TK, double *lam,
                                   uint8_t *capped) {
    memset(capped, 0, (size_t)E);
    int32_t ncap = 0;
    for (;;) {
        double free_w = 0.0, free_mass = TK - T * (double)ncap;
        for (int32_t e = 0; e < E; e++)
            if (!capped[e]) free_w += w[e];
        bool changed = false;
        for (int32_t e = 0; e < E; e++) {
            if (capped[e]) {
                lam[e] = T;
                continue;
            }
            lam[e] = free_w > 0.0 ? free_mass * w[e] / free_w : 0.0;
            if (lam[e] >= T) {
                capped[e] = 1;
                ncap++;
                changed = true;
            }
        }
        if (!changed) return ncap;
    }
}

/* One window of one layer: a multinomial draw of TK assignments over lam,
 * with capped experts at exactly T and nobody above T. */
static void sample_row(stream *r, const double *lam, const uint8_t *capped, int32_t E, int64_t T,
                       int64_t TK, int32_t ncap, double *suffix, double *row) {
    int64_t left = TK - T * (int64_t)ncap;
    /* suffix[e] = sum of lam over uncapped experts e.. E-1 */
    double acc = 0.0;
    for (int32_t e = E - 1; e >= 0; e--) {
        if (!capped[e]) acc += lam[e];
        suffix[e] = acc;
    }
    int32_t last = -1;
    for (int32_t e = 0; e < E; e++)
        if (!capped[e]) last = e;
    for (int32_t e = 0; e < E; e++) {
        if (capped[e]) {
            row[e] = (double)T;
            continue;
        }
        int64_t c;
        if (e == last)
            c = left;
        else
            c = binomial(r, left, suffix[e] > 0.0 ? lam[e] / suffix[e] : 0.0);
        if (c > T) c = T; /* the excess stays with the experts after e */
        row[e] = (double)c;
        left -= c;
    }
    /* Only when the last uncapped expert hit the cap: give the rest to
     * experts with room, lowest index first. E * T >= TK, so room exists. */
    for (int32_t e = 0; e < E && left > 0; e++) {
        int64_t room = T - (int64_t)row[e];
        int64_t add = room < left ? room : left;
        row[e] += (double)add;
        left -= add;
    }
}

/* A window's row [E] (sums to T * K, each entry <= T) as N forward passes
 * of T / N tokens (the first T % N one more), rows first .. first + N - 1
 * of layer l: every pass of every layer sums to its tokens x K, no entry
 * passes its tokens (a token picks K distinct experts), and the N rows sum
 * to the window. Pass by pass, r_e of the window left: expert e takes at
 * least lo = r_e - (tokens after this pass) (else the rest could not hold
 * it) and at most hi = min(tokens, r_e); the units past the lows go expert
 * by expert, Binomial(units left, r_e / r of the experts left), clamped so
 * that the later experts' room still holds what is left. rem and room are
 * scratch [E]. */
static void split_passes(stream *ps, const double *row, int32_t E, int64_t T, int32_t K, int32_t N,
                         epx_counts *c, int32_t first, int32_t l, double *rem, double *room) {
    for (int32_t e = 0; e < E; e++) rem[e] = row[e];
    int64_t after = T; /* tokens of this pass and the ones after it */
    for (int32_t j = 0; j < N; j++) {
        const int64_t tj = T / N + (j < T % N), rest = after - tj;
        double *y = epx_counts_row(c, first + j, l);
        int64_t units = tj * K;
        double weight = 0.0, cap = 0.0;
        for (int32_t e = 0; e < E; e++) {
            const int64_t r = (int64_t)rem[e], lo = r > rest ? r - rest : 0;
            const int64_t hi = r < tj ? r : tj;
            y[e] = (double)lo;
            units -= lo;
            room[e] = (double)(hi - lo);
            cap += room[e];
            weight += rem[e];
        }
        for (int32_t e = 0; e < E && units > 0; e++) {
            cap -= room[e]; /* now the room of the experts after e */
            int64_t z = weight > 0.0 ? binomial(ps, units, rem[e] / weight) : 0;
            const int64_t need = units - (int64_t)cap, most = (int64_t)room[e];
            z = z < need ? need : z;
            z = z > most ? most : z;
            z = z > units ? units : z;
            weight -= rem[e];
            y[e] += (double)z;
            units -= z;
        }
        for (int32_t e = 0; e < E; e++) rem[e] -= y[e];
        after = rest;
    }
}

epx_status epx_trace_synth(const epx_model *m, const epx_trace_opts *o, epx_counts **out,
                           epx_error *err) {
    if (out == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    EPX_TRY(check_inputs(m, o, err));
    const int32_t S = o->num_windows, L = m->num_layers, E = m->num_experts, N = o->per_pass;
    const int64_t T = o->tokens, TK = o->tokens * m->top_k;

    epx_counts *c = NULL;
    EPX_TRY(epx_counts_create(S * N, L, E, &c, err));
    /* Scratch: log popularity, weights, expectations, suffix sums (E
     * doubles each) and the cap flags. */
    double *scratch = epxi_calloc((size_t)E, 4 * sizeof(double) + 1, "trace scratch", err);
    if (scratch == NULL) {
        epx_counts_destroy(c);
        return err ? err->status : EPX_ERR_NOMEM;
    }
    double *logw = scratch, *w = logw + E, *lam = w + E, *suffix = lam + E;
    uint8_t *capped = (uint8_t *)(suffix + E);

    for (int32_t l = m->first_k_dense; l < L; l++) {
        stream pop = stream_for(o->seed, l, 0, PURPOSE_POPULARITY);
        double sigma = o->skew_lo + (o->skew_hi - o->skew_lo) * uniform(&pop);
        for (int32_t e = 0; e < E; e++) logw[e] = sigma * normal(&pop);
        for (int32_t s = 0; s < S; s++) {
            if (s > 0 && o->drift > 0.0) {
                stream dr = stream_for(o->seed, l, s, PURPOSE_DRIFT);
                for (int32_t e = 0; e < E; e++) logw[e] += o->drift * normal(&dr);
            }
            if (s > 0 && s == o->shift_window) {
                /* The layer's popularities dealt out again (Fisher-Yates). */
                stream sh = stream_for(o->seed, l, s, PURPOSE_SHIFT);
                if (uniform(&sh) < o->shift_layers)
                    for (int32_t e = E - 1; e > 0; e--) {
                        int32_t q = (int32_t)(uniform(&sh) * (double)(e + 1));
                        double t = logw[e];
                        logw[e] = logw[q], logw[q] = t;
                    }
            }
            /* Subtract the max before exp so no weight overflows. */
            double mx = logw[0];
            for (int32_t e = 1; e < E; e++)
                if (logw[e] > mx) mx = logw[e];
            for (int32_t e = 0; e < E; e++) w[e] = exp(logw[e] - mx);
            int32_t ncap = capped_expectations(w, E, (double)T, (double)TK, lam, capped);
            stream smp = stream_for(o->seed, l, s, PURPOSE_SAMPLE);
            double *row = epx_counts_row(c, s * N, l);
            sample_row(&smp, lam, capped, E, T, TK, ncap, suffix, row);
            if (N > 1) {
                stream ps = stream_for(o->seed, l, s, PURPOSE_PASS);
                split_passes(&ps, row, E, T, m->top_k, N, c, s * N, l, lam, suffix);
            }
        }
    }
    free(scratch);
    *out = c;
    return EPX_OK;
}
