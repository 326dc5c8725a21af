/*
 * bench_common.c - the parts of `epx bench comm` every backend and mode
 * shares (bench_comm.h).
 */
#include "bench_comm.h"
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void bench_inputs(const bench_args *a, int32_t me, int32_t P, int64_t Tmax, void *x, int32_t *slots,
                  float *w) {
    const int32_t H = a->cfg.hidden, K = a->cfg.top_k, E = a->cfg.num_experts;
    int32_t *perm = malloc((size_t)E * sizeof(int32_t));
    if (perm == NULL) abort();
    uint64_t rng = a->seed * 1000003u + (uint64_t)me;
    for (int32_t e = 0; e < E; e++) perm[e] = e;
    for (int64_t t = 0; t < Tmax; t++) {
        for (int32_t k = 0; k < K; k++) { /* partial Fisher-Yates: K distinct */
            int32_t j = k + (int32_t)(mix(&rng) % (uint64_t)(E - k)), tmp = perm[k];
            perm[k] = perm[j];
            perm[j] = tmp;
            int32_t e = perm[k], nrep = (P - 1 - e) / E + 1; /* slots e, e+E, ... */
            slots[t * K + k] = e + E * (int32_t)((t + k + me) % nrep);
            w[t * K + k] = (float)((mix(&rng) >> 11) * 0x1.0p-53) + 1e-3f;
        }
        for (int32_t h = 0; h < H; h++) {
            float v = (float)((mix(&rng) >> 11) * 0x1.0p-53 * 4.0 - 2.0);
            if (a->dtype == EPX_DTYPE_F32)
                ((float *)x)[t * H + h] = v;
            else
                ((uint16_t *)x)[t * H + h] = epx_bf16_from_f32(v);
        }
    }
    free(perm);
}

int64_t bench_max_tokens(const bench_args *a) {
    int64_t Tmax = 1;
    for (int32_t i = 0; i < a->ntok; i++)
        if (a->tokens[i] > Tmax) Tmax = a->tokens[i];
    return Tmax;
}

epx_ep_config bench_ep_config(const bench_args *a, int32_t P, int64_t Tmax, epx_ep_mode mode) {
    epx_ep_config c = EPX_EP_CONFIG_INIT;
    c.hidden = a->cfg.hidden;
    c.top_k = a->cfg.top_k;
    c.num_slots = P;
    c.max_tokens = Tmax;
    c.x_dtype = a->dtype;
    c.y_dtype = a->dtype;
    c.combine = a->combine;
    c.mode = mode;
    return c;
}

float bench_xval(const bench_args *a, const void *x, size_t i) {
    return a->dtype == EPX_DTYPE_F32 ? ((const float *)x)[i]
                                     : epx_bf16_to_f32(((const uint16_t *)x)[i]);
}

void bench_expect_token(const bench_args *a, int32_t R, int32_t spr, const void *x,
                        const int32_t *s, const float *w, int64_t t, float *o) {
    const int32_t H = a->cfg.hidden, K = a->cfg.top_k;
    const bool bf16 = a->dtype == EPX_DTYPE_BF16;
    for (int32_t h = 0; h < H; h++) {
        float acc = 0.0f, xv = bench_xval(a, x, (size_t)t * H + h);
        if (a->combine == EPX_EP_COMBINE_TOPK) {
            for (int32_t k = 0; k < K; k++)
                if (s[t * K + k] >= 0) acc += w[t * K + k] * xv;
        } else {
            for (int32_t r = 0; r < R; r++) {
                float p = 0.0f;
                bool any = false;
                for (int32_t k = 0; k < K; k++)
                    if (s[t * K + k] >= 0 && s[t * K + k] / spr == r) {
                        p += w[t * K + k] * xv;
                        any = true;
                    }
                if (any) acc += bf16 ? epx_bf16_to_f32(epx_bf16_from_f32(p)) : p;
            }
        }
        o[h] = acc;
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void bench_stats(double *t, int n, double *median, double *p99) {
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    *median = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    int i = (int)(0.99 * (n - 1) + 0.5);
    *p99 = t[i < n ? i : n - 1];
}

static void num_or_null(FILE *f, const char *key, double v) {
    fprintf(f, ", \"%s\": ", key);
    cli_json_num(f, "%.3f", v < 0 ? NAN : v);
}

int bench_jsonl_write(FILE *f, const bench_line *l) {
    char date[32];
    time_t now = time(NULL);
    struct tm tmv;
    gmtime_r(&now, &tmv);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tmv);
    fprintf(f,
            "{\"backend\": \"%s\", \"mode\": \"%s\", \"ranks\": %d, \"tokens\": %lld, "
            "\"hidden\": %d, \"topk\": %d, \"dtype\": \"%s\", \"phase\": \"%s\"",
            l->backend, l->mode, l->ranks, (long long)l->tokens, l->hidden, l->topk, l->dtype,
            l->phase);
    fputs(", \"median_us\": ", f);
    cli_json_num(f, "%.3f", l->median_us);
    fputs(", \"p99_us\": ", f);
    cli_json_num(f, "%.3f", l->p99_us);
    if (l->launches < 0)
        fprintf(f, ", \"launches\": null");
    else
        fprintf(f, ", \"launches\": %d", l->launches);
    fprintf(f, ", \"graph\": %s", l->graph ? "true" : "false");
    if (l->graph && l->graph_reps > 0) fprintf(f, ", \"graph_reps\": %d", l->graph_reps);
    if (l->floor != NULL) {
        fputs(", \"floor\": ", f);
        cli_json_str(f, l->floor);
    }
    num_or_null(f, "gbps", l->gbps);
    num_or_null(f, "copy_pct", l->copy_pct);
    if (l->transport != NULL) {
        fputs(", \"transport\": ", f);
        cli_json_str(f, l->transport);
        num_or_null(f, "link_pct", l->link_pct);
    }
    if (l->row_bytes > 0) fprintf(f, ", \"row_bytes\": %lld", (long long)l->row_bytes);
    if (l->token_bound > 0) fprintf(f, ", \"token_bound\": %lld", (long long)l->token_bound);
    if (l->shared_gpu) fputs(", \"shared_gpu\": true", f);
    fputs(", \"device\": ", f);
    cli_json_str(f, l->device);
    fprintf(f, ", \"date\": \"%s\"}\n", date);
    return ferror(f) ? -1 : 0;
}
