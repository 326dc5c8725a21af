/*
 * test_dispatch_balanced.c - balanced per-batch dispatch (epx/dispatch.h,
 * part 4) on random placements and batches (seeded; the seed is printed):
 * the optimum max GPU load against a brute force over expert subsets (max
 * C(S) / |N(S)|, Hall's condition) and the whole lexicographic load vector
 * against a brute-force water-filling; the integer optimum against an
 * exhaustive search over integer splits on tiny cases; an optimality
 * certificate on Kimi-K2.5 and DeepSeek-V3 sized layers; the subset and
 * max-flow solves against each other on larger layers; the shares and
 * integer counts within the stated bounds; routing that realises the
 * counts; determinism; and the error messages.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, strdup */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "../src/dispatch/balanced_core.h" /* epxi_bal_subsets: the tables' sizing */
#include "bal_place.h"

/* outputs_pinned's hashes (main at 5f4368a gives the same) */
#define PINNED_DEFAULT 0xced6884208a07484ull
#define PINNED_FLOWS 0x37d192dd94937f76ull

static uint32_t gpu_mask(const place *p, int32_t e) {
    uint32_t m = 0;
    for (int32_t j = 0; j < p->nv[e]; j++) m |= 1u << (p->rep[e * p->W + j] / p->per);
    return m;
}

/* Brute-force water-filling: the largest max-ratio set of the remaining
 * experts over the remaining GPUs, fixed at its ratio, repeated. Gives each
 * GPU's load as num[g] / den[g]. Needs E <= 16, G <= 32. */
static void brute_levels(const place *p, const int64_t *c, int64_t *num, int64_t *den) {
    uint32_t left = 0, gfree = p->G == 32 ? 0xffffffffu : (1u << p->G) - 1;
    for (int32_t e = 0; e < p->E; e++)
        if (c[e] > 0) left |= 1u << e;
    for (int32_t g = 0; g < p->G; g++) num[g] = 0, den[g] = 1;
    while (left) {
        int64_t bn = -1, bd = 1;
        uint32_t best = 0;
        for (uint32_t S = left; S; S = (S - 1) & left) {
            int64_t cs = 0;
            uint32_t n = 0;
            for (int32_t e = 0; e < p->E; e++)
                if (S >> e & 1) cs += c[e], n |= gpu_mask(p, e);
            int64_t d = __builtin_popcount(n & gfree);
            assert_true(d > 0);
            /* larger ratio, or the same ratio and a larger set (the union of tight sets) */
            if (cs * bd > bn * d ||
                (cs * bd == bn * d && __builtin_popcount(S) > __builtin_popcount(best)))
                bn = cs, bd = d, best = S;
        }
        uint32_t n = 0;
        for (int32_t e = 0; e < p->E; e++)
            if (best >> e & 1) n |= gpu_mask(p, e);
        n &= gfree;
        for (int32_t g = 0; g < p->G; g++)
            if (n >> g & 1) num[g] = bn, den[g] = bd;
        gfree &= ~n;
        left &= ~best;
    }
}

/* The shares, counts and loads obey the header's guarantees; num / den per
 * GPU is the expected fractional load (NULL: use out.gpu_load). */
static void check_out(const place *p, const int64_t *c, const epx_balanced_out *o,
                      const int64_t *num, const int64_t *den) {
    int32_t E = p->E, W = p->W, G = p->G;
    double *frac = calloc((size_t)G, sizeof(double));
    int64_t *ig = calloc((size_t)G, sizeof(int64_t));
    for (int32_t e = 0; e < E; e++) {
        double sum = 0.0;
        int64_t isum = 0;
        for (int32_t j = 0; j < W; j++) {
            double s = o->shares[e * W + j];
            int64_t n = o->replica_counts[e * W + j];
            if (j >= p->nv[e]) {
                assert_true(s == 0.0 && n == 0);
                continue;
            }
            int32_t slot = p->rep[e * W + j];
            assert_true(s >= 0.0 && s <= 1.0 + 1e-12);
            assert_int_equal(o->slot_counts[slot], n);
            sum += s;
            isum += n;
            frac[slot / p->per] += s * (double)c[e];
            ig[slot / p->per] += n;
            /* |n - c * share| < 1 */
            assert_true(fabs((double)n - s * (double)c[e]) < 1.0 + 1e-9 * (double)(c[e] + 1));
        }
        assert_true(fabs(sum - 1.0) < 1e-12);
        assert_int_equal(isum, c[e]);
    }
    int64_t imax = 0;
    for (int32_t g = 0; g < G; g++) {
        double want = num ? (double)num[g] / (double)den[g] : o->gpu_load[g];
        assert_true(fabs(o->gpu_load[g] - want) <= 1e-12 * (want + 1));
        assert_true(fabs(frac[g] - want) <= 1e-9 * (want + 1));
        if (num) {
            /* integer load is the fractional one rounded down or up */
            int64_t lo = num[g] / den[g], hi = lo + (num[g] % den[g] != 0);
            assert_true(ig[g] >= lo && ig[g] <= hi);
        } else {
            assert_true((double)ig[g] > want - 1.0 - 1e-9 && (double)ig[g] < want + 1.0 + 1e-9);
        }
        if (ig[g] > imax) imax = ig[g];
    }
    assert_int_equal(imax, o->max_load_int);
    free(frac);
    free(ig);
}

typedef struct outs {
    double *shares, *gpu_load;
    int64_t *rc, *slots;
    epx_balanced_out o;
} outs;

static outs make_outs(const place *p) {
    outs r;
    r.shares = calloc((size_t)(p->E * p->W), sizeof(double));
    r.rc = calloc((size_t)(p->E * p->W), sizeof(int64_t));
    r.slots = calloc((size_t)p->P, sizeof(int64_t));
    r.gpu_load = calloc((size_t)p->G, sizeof(double));
    r.o = (epx_balanced_out){r.shares, r.rc, r.slots, r.gpu_load, 0, 0, 0, 0};
    return r;
}

static void free_outs(outs *r) {
    free(r->shares);
    free(r->rc);
    free(r->slots);
    free(r->gpu_load);
}

/* Every output of a and b (for layout p) equal to the bit. */
static int same_outs(const place *p, const outs *a, const outs *b) {
    const size_t n = (size_t)p->E * (size_t)p->W;
    return memcmp(a->shares, b->shares, n * sizeof(double)) == 0 &&
           memcmp(a->rc, b->rc, n * sizeof(int64_t)) == 0 &&
           memcmp(a->slots, b->slots, (size_t)p->P * sizeof(int64_t)) == 0 &&
           memcmp(a->gpu_load, b->gpu_load, (size_t)p->G * sizeof(double)) == 0 &&
           a->o.max_load_num == b->o.max_load_num && a->o.max_load_den == b->o.max_load_den &&
           a->o.max_load_int == b->o.max_load_int && a->o.num_levels == b->o.num_levels;
}

static void small_against_brute_force(void **state) {
    (void)state;
    tu_rng r = {tu_seed(2701)};
    epx_error err = {0};
    for (int it = 0; it < 400; it++) {
        int32_t G = 1 + (int32_t)tu_below(&r, 6), per = 1 + (int32_t)tu_below(&r, 3);
        int32_t E = 1 + (int32_t)tu_below(&r, (uint32_t)(G * per < 12 ? G * per : 12));
        place p = bal_random_place(&r, E, G, per, 0, 1);
        int64_t c[16], num[32], den[32];
        bal_random_counts(&r, c, E, it % 3 == 0 ? 3 : 50);
        epx_balancer *b = NULL;
        assert_int_equal(epx_dispatch_balanced_create(E, p.W, p.P, G, &b, &err), EPX_OK);
        outs o = make_outs(&p);
        assert_int_equal(epx_dispatch_balanced_solve(b, p.rep, p.nv, c, &o.o, &err), EPX_OK);
        brute_levels(&p, c, num, den);
        int64_t mn = 0, md = 1;
        for (int32_t g = 0; g < G; g++)
            if (num[g] * md > mn * den[g]) mn = num[g], md = den[g];
        /* the optimum, exactly */
        assert_true(o.o.max_load_num * md == mn * o.o.max_load_den);
        check_out(&p, c, &o.o, num, den);
        free_outs(&o);
        bal_free_place(&p);
        epx_dispatch_balanced_destroy(b);
    }
}

/* The least max integer load over every integer split, by enumeration. */
static int64_t brute_int(const place *p, const int64_t *c, int32_t e, int64_t *load) {
    if (e == p->E) {
        int64_t m = 0;
        for (int32_t g = 0; g < p->G; g++) m = load[g] > m ? load[g] : m;
        return m;
    }
    int32_t gs[8], n = 0;
    uint32_t mask = gpu_mask(p, e);
    for (int32_t g = 0; g < p->G; g++)
        if (mask >> g & 1) gs[n++] = g;
    int64_t best = INT64_MAX;
    /* compositions of c[e] over n GPUs */
    int64_t part[8] = {0};
    part[n - 1] = c[e];
    for (;;) {
        for (int32_t i = 0; i < n; i++) load[gs[i]] += part[i];
        int64_t v = brute_int(p, c, e + 1, load);
        best = v < best ? v : best;
        for (int32_t i = 0; i < n; i++) load[gs[i]] -= part[i];
        /* next composition: move one unit from the last nonzero (not the first) leftwards */
        int32_t i = n - 1;
        while (i > 0 && part[i] == 0) i--;
        if (i == 0) break;
        part[i - 1]++;
        int64_t rest = part[i] - 1;
        part[i] = 0;
        part[n - 1] = rest;
    }
    return best;
}

static void tiny_integer_optimum(void **state) {
    (void)state;
    tu_rng r = {tu_seed(2702)};
    epx_error err = {0};
    for (int it = 0; it < 300; it++) {
        int32_t G = 1 + (int32_t)tu_below(&r, 4), per = 1 + (int32_t)tu_below(&r, 2);
        int32_t E = 1 + (int32_t)tu_below(&r, (uint32_t)(G * per < 4 ? G * per : 4));
        place p = bal_random_place(&r, E, G, per, 0, 1);
        int64_t c[16] = {0}, load[8] = {0};
        for (int32_t e = 0; e < E; e++) c[e] = tu_below(&r, 7);
        epx_balancer *b = NULL;
        assert_int_equal(epx_dispatch_balanced_create(E, p.W, p.P, G, &b, &err), EPX_OK);
        outs o = make_outs(&p);
        assert_int_equal(epx_dispatch_balanced_solve(b, p.rep, p.nv, c, &o.o, &err), EPX_OK);
        assert_int_equal(o.o.max_load_int, brute_int(&p, c, 0, load));
        check_out(&p, c, &o.o, NULL, NULL);
        free_outs(&o);
        bal_free_place(&p);
        epx_dispatch_balanced_destroy(b);
    }
}

/* Large layers: no brute force, but a certificate. The experts whose GPUs
 * all carry the max form a set S with C(S) / |N(S)| = the max: no split
 * can do better (S's tokens must land on N(S)), and the shares reach it. */
static void large_certificate(int32_t E, int32_t G, int32_t per, uint64_t seed) {
    tu_rng r = {tu_seed(seed)};
    epx_error err = {0};
    place p = bal_random_place(&r, E, G, per, 0, 1);
    int64_t *c = calloc((size_t)E, sizeof(int64_t));
    epx_balancer *b = NULL;
    assert_int_equal(epx_dispatch_balanced_create(E, p.W, p.P, G, &b, &err), EPX_OK);
    outs o = make_outs(&p), o2 = make_outs(&p);
    uint8_t *top = calloc((size_t)G, 1);
    int32_t T = 4096, K = 8;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * K)),
            *phys = malloc(sizeof(int32_t) * (size_t)(T * K));
    int64_t *got = calloc((size_t)p.P, sizeof(int64_t));
    for (int it = 0; it < 30; it++) {
        /* a batch of Zipf-ish ids: hot experts draw more */
        int32_t t_n = 1 + (int32_t)tu_below(&r, (uint32_t)T);
        for (int32_t i = 0; i < t_n * K; i++) {
            double u = tu_uniform(&r);
            ids[i] = tu_below(&r, 10) == 0 ? -1 : (int32_t)((double)E * u * u * u);
        }
        assert_int_equal(epx_dispatch_balanced_topk(b, p.rep, p.nv, ids, t_n, K, phys, &o.o, &err),
                         EPX_OK);
        assert_int_equal(epx_dispatch_count_ids(ids, t_n, K, E, c, &err), EPX_OK);
        check_out(&p, c, &o.o, NULL, NULL);
        double mx = (double)o.o.max_load_num / (double)o.o.max_load_den;
        for (int32_t g = 0; g < G; g++) top[g] = o.o.gpu_load[g] == mx;
        int64_t cs = 0;
        uint8_t *n = calloc((size_t)G, 1);
        for (int32_t e = 0; e < E; e++) {
            if (c[e] == 0) continue;
            int all = 1;
            for (int32_t j = 0; j < p.nv[e]; j++) all &= top[p.rep[e * p.W + j] / per];
            if (!all) continue;
            cs += c[e];
            for (int32_t j = 0; j < p.nv[e]; j++) n[p.rep[e * p.W + j] / per] = 1;
        }
        int64_t d = 0;
        for (int32_t g = 0; g < G; g++) d += n[g];
        free(n);
        assert_true(d > 0 && cs * o.o.max_load_den == o.o.max_load_num * d);
        /* routing realises the counts */
        memset(got, 0, sizeof(int64_t) * (size_t)p.P);
        for (int32_t i = 0; i < t_n * K; i++) {
            if (ids[i] < 0) {
                assert_int_equal(phys[i], -1);
                continue;
            }
            int32_t s = phys[i], ok = 0;
            for (int32_t j = 0; j < p.nv[ids[i]]; j++) ok |= p.rep[ids[i] * p.W + j] == s;
            assert_true(ok);
            got[s]++;
        }
        assert_memory_equal(got, o.slots, sizeof(int64_t) * (size_t)p.P);
        /* deterministic, and solve alone gives the same as the one call */
        assert_int_equal(epx_dispatch_balanced_solve(b, p.rep, p.nv, c, &o2.o, &err), EPX_OK);
        assert_memory_equal(o.shares, o2.shares, sizeof(double) * (size_t)(E * p.W));
        assert_memory_equal(o.rc, o2.rc, sizeof(int64_t) * (size_t)(E * p.W));
    }
    free(top);
    free(ids);
    free(phys);
    free(got);
    free(c);
    free_outs(&o);
    free_outs(&o2);
    bal_free_place(&p);
    epx_dispatch_balanced_destroy(b);
}

static void kimi_k25_layer(void **state) {
    (void)state;
    large_certificate(384, 8, 52, 2703);
}

static void deepseek_v3_layer(void **state) {
    (void)state;
    large_certificate(256, 32, 9, 2704);
}

/* One balancer serves every layer: alternating placements give what a
 * fresh balancer gives, bit for bit. */
static void one_balancer_many_layers(void **state) {
    (void)state;
    tu_rng r = {tu_seed(2706)};
    epx_error err = {0};
    int32_t E = 40, G = 8, per = 6;
    place p[3];
    for (int i = 0; i < 3; i++) p[i] = bal_random_place(&r, E, G, per, 0, 1);
    epx_balancer *shared = NULL;
    assert_int_equal(epx_dispatch_balanced_create(E, p[0].W, p[0].P, G, &shared, &err), EPX_OK);
    outs a = make_outs(&p[0]), f = make_outs(&p[0]);
    int64_t c[40];
    for (int it = 0; it < 30; it++) {
        const place *q = &p[it % 3];
        bal_random_counts(&r, c, E, it % 2 ? 5 : 300);
        epx_balancer *fresh = NULL;
        assert_int_equal(epx_dispatch_balanced_create(E, q->W, q->P, G, &fresh, &err), EPX_OK);
        assert_int_equal(epx_dispatch_balanced_solve(shared, q->rep, q->nv, c, &a.o, &err), EPX_OK);
        assert_int_equal(epx_dispatch_balanced_solve(fresh, q->rep, q->nv, c, &f.o, &err), EPX_OK);
        assert_memory_equal(a.shares, f.shares, sizeof(double) * (size_t)(E * q->W));
        assert_memory_equal(a.rc, f.rc, sizeof(int64_t) * (size_t)(E * q->W));
        assert_memory_equal(a.gpu_load, f.gpu_load, sizeof(double) * (size_t)G);
        assert_true(a.o.max_load_num == f.o.max_load_num && a.o.num_levels == f.o.num_levels);
        check_out(q, c, &a.o, NULL, NULL);
        epx_dispatch_balanced_destroy(fresh);
    }
    free_outs(&a);
    free_outs(&f);
    for (int i = 0; i < 3; i++) bal_free_place(&p[i]);
    epx_dispatch_balanced_destroy(shared);
}

/* epx_dispatch_balanced_create for p with the environment variable var set
 * to value (NULL: unset); the variable is restored after. */
static epx_status create_env(const char *var, const char *value, const place *p, epx_balancer **b,
                             epx_error *err) {
    const char *was = getenv(var);
    char *keep = was ? strdup(was) : NULL;
    if (value)
        setenv(var, value, 1);
    else
        unsetenv(var);
    epx_status st = epx_dispatch_balanced_create(p->E, p->W, p->P, p->G, b, err);
    if (keep) {
        setenv(var, keep, 1);
        free(keep);
    } else {
        unsetenv(var);
    }
    return st;
}
static epx_status create_with(const char *value, const place *p, epx_balancer **b, epx_error *err) {
    return create_env("EPX_BALANCED_SUBSET_GPUS", value, p, b, err);
}

/* A balancer whose subset solve takes components of up to k GPUs (-1: the
 * default). */
static epx_balancer *balancer_with(int k, const place *p) {
    char v[16];
    snprintf(v, sizeof v, "%d", k);
    epx_balancer *b = NULL;
    epx_error err = {0};
    assert_int_equal(create_with(k < 0 ? NULL : v, p, &b, &err), EPX_OK);
    return b;
}

/* The two exact solves (subsets for components of up to 10 GPUs, and
 * max-flows) on layers too large for the brute force: the same unique
 * lexicographic load vector, hence the same optimum and levels, each
 * within the header's bounds; components larger than the subset bound
 * (G up to 14) mix both in one batch. */
static void subsets_and_flows_agree(void **state) {
    (void)state;
    tu_rng r = {tu_seed(2707)};
    epx_error err = {0};
    for (int it = 0; it < 60; it++) {
        int32_t G = 2 + (int32_t)tu_below(&r, 13), per = 2 + (int32_t)tu_below(&r, 12);
        int32_t E = G * per - (int32_t)tu_below(&r, (uint32_t)(G * per / 3 + 1));
        place p = bal_random_place(&r, E, G, per, 0, 1);
        int64_t *c = calloc((size_t)E, sizeof(int64_t));
        bal_random_counts(&r, c, E, it % 3 == 0 ? 4 : 500);
        epx_balancer *bs = balancer_with(-1, &p), *bf = balancer_with(0, &p);
        outs s = make_outs(&p), f = make_outs(&p);
        assert_int_equal(epx_dispatch_balanced_solve(bs, p.rep, p.nv, c, &s.o, &err), EPX_OK);
        assert_int_equal(epx_dispatch_balanced_solve(bf, p.rep, p.nv, c, &f.o, &err), EPX_OK);
        assert_memory_equal(s.gpu_load, f.gpu_load, sizeof(double) * (size_t)G);
        assert_true(s.o.max_load_num == f.o.max_load_num && s.o.max_load_den == f.o.max_load_den &&
                    s.o.max_load_int == f.o.max_load_int && s.o.num_levels == f.o.num_levels);
        check_out(&p, c, &s.o, NULL, NULL);
        check_out(&p, c, &f.o, NULL, NULL);
        free_outs(&s);
        free_outs(&f);
        epx_dispatch_balanced_destroy(bs);
        epx_dispatch_balanced_destroy(bf);
        free(c);
        bal_free_place(&p);
    }
}

/* Layout p solved with counts c by two balancers, var unset (the default)
 * and var = value: every output must be equal to the bit (case it of the
 * test seeded with seed, named on failure); the default's outputs are then
 * checked against the guarantees (check_out). */
static void same_under_knob(const char *var, const char *value, const place *p, const int64_t *c,
                            int it, uint64_t seed) {
    epx_error err = {0};
    epx_balancer *bd = NULL, *bk = NULL;
    assert_int_equal(create_env(var, NULL, p, &bd, &err), EPX_OK);
    assert_int_equal(create_env(var, value, p, &bk, &err), EPX_OK);
    outs a = make_outs(p), b = make_outs(p);
    assert_int_equal(epx_dispatch_balanced_solve(bd, p->rep, p->nv, c, &a.o, &err), EPX_OK);
    assert_int_equal(epx_dispatch_balanced_solve(bk, p->rep, p->nv, c, &b.o, &err), EPX_OK);
    if (!same_outs(p, &a, &b))
        fail_msg("case %d (E %d, G %d, per %d): %s=%s changes the outputs (seed %llu)", it, p->E,
                 p->G, p->per, var, value, (unsigned long long)seed);
    check_out(p, c, &a.o, NULL, NULL);
    free_outs(&a);
    free_outs(&b);
    epx_dispatch_balanced_destroy(bd);
    epx_dispatch_balanced_destroy(bk);
}

/* A component of one flexible expert in closed form (epxi_bal_one_levels)
 * against the subset solve it stands in for (EPX_BALANCED_CLOSED_FORM=0):
 * every output equal to the bit, on batches of a few tokens (where most
 * components are one expert on its GPUs, with other experts' tokens as
 * bases) and on larger ones, with and without a base above the water line. */
static void closed_form_equals_subsets(void **state) {
    (void)state;
    tu_rng r = {tu_seed(2711)};
    epx_error err = {0};
    int few_flexible = 0;
    for (int it = 0; it < 300; it++) {
        int32_t G = 2 + (int32_t)tu_below(&r, 9), per = 2 + (int32_t)tu_below(&r, 8);
        int32_t E = G * per - (int32_t)tu_below(&r, (uint32_t)(G * per / 3 + 1));
        place p = bal_random_place(&r, E, G, per, 0, 1);
        int64_t *c = calloc((size_t)E, sizeof(int64_t));
        if (it % 2 == 0) { /* a few tokens: each count from a handful of picks */
            int picks = 1 + (int)tu_below(&r, 12);
            for (int k = 0; k < picks; k++) c[tu_below(&r, (uint32_t)E)] += 1 + tu_below(&r, 9);
        } else {
            bal_random_counts(&r, c, E, it % 3 == 0 ? 4 : 300);
        }
        same_under_knob("EPX_BALANCED_CLOSED_FORM", "0", &p, c, it, tu_seed(2711));
        /* batches of a few tokens with a flexible expert (tokens on replicas
         * on two GPUs or more): where one-expert components come from */
        int flexible = 0;
        for (int32_t e = 0; e < E; e++)
            flexible |= c[e] > 0 && (gpu_mask(&p, e) & (gpu_mask(&p, e) - 1));
        few_flexible += it % 2 == 0 && flexible;
        free(c);
        bal_free_place(&p);
    }
    assert_true(few_flexible >= 50);
    /* a value other than 0 or 1 is refused, named */
    place p = bal_random_place(&r, 6, 3, 3, 0, 1);
    epx_balancer *bad = NULL;
    const char *no[] = {"2", "01", "yes", " 1"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(create_env("EPX_BALANCED_CLOSED_FORM", no[i], &p, &bad, &err),
                         EPX_ERR_INVALID_ARG);
        assert_null(bad);
        assert_non_null(strstr(err.msg, "EPX_BALANCED_CLOSED_FORM"));
        assert_non_null(strstr(err.msg, no[i]));
    }
    bal_free_place(&p);
}

/* A layer where the two starts end a max-flow level on different forms of
 * one ratio (the whole part's 3L / 3, the densest GPU's L / 1) and the
 * shares' doubles are inexact unless the form is reduced: counts near 2^40
 * and an expert with 5,997 replicas on one GPU, so lv_den c m passes 2^53.
 * GPUs A, B, C, D and a chain of 7 more (11: past the subset solve's 10);
 * expert X on B (5,997 slots) and C, Y on C and D, W0 on A and B, each
 * chained GPU a fixed expert and a link expert to the GPU before it; the
 * other slots to one fixed expert per GPU. (A review's counterexample.) */
static place huge_layer(int64_t **counts) {
    enum { PER = 6000, MX = 5997, EXTRA = 7 };
    place p = {7 + 2 * EXTRA, (4 + EXTRA) * PER, 4 + EXTRA, PER, PER, NULL, NULL};
    p.rep = malloc(sizeof(int32_t) * (size_t)p.E * (size_t)p.W);
    p.nv = calloc((size_t)p.E, sizeof(int32_t));
    for (int32_t i = 0; i < p.E * p.W; i++) p.rep[i] = -1;
#define PUT(e, s) (p.rep[(e)*p.W + p.nv[e]++] = (s))
    const int32_t w0 = 6 + 2 * EXTRA;
    for (int32_t s = 1; s < PER; s++) PUT(0, s); /* A: its fixed expert */
    PUT(w0, 0);
    PUT(w0, PER + PER - 1);
    for (int32_t s = 0; s < MX; s++) PUT(4, PER + s); /* B: X */
    for (int32_t s = MX; s < PER - 1; s++) PUT(1, PER + s);
    PUT(4, 2 * PER); /* C: X, Y and its fixed expert */
    PUT(5, 2 * PER + 1);
    for (int32_t s = 2; s < PER; s++) PUT(2, 2 * PER + s);
    PUT(5, 3 * PER); /* D: Y */
    int32_t last = 3;
    for (int32_t k = 0; k < EXTRA; k++) { /* the chain */
        const int32_t g = 4 + k, f = 6 + 2 * k, z = 7 + 2 * k;
        PUT(z, last * PER + PER - 1);
        PUT(z, g * PER);
        for (int32_t s = 1; s < PER; s++) PUT(f, g * PER + s);
        last = g;
    }
    for (int32_t s = 1; s < PER - 1; s++) PUT(3, 3 * PER + s);
    for (int32_t k = 0; k + 1 < EXTRA; k++) { /* a chained GPU's last slot went to the next link */
        const int32_t f = 6 + 2 * k;
        p.rep[f * p.W + --p.nv[f]] = -1;
    }
#undef PUT
    int64_t *c = calloc((size_t)p.E, sizeof(int64_t));
    const int64_t L = ((int64_t)1 << 40) / 3 - 7777;
    c[0] = L;
    c[1] = 1000;
    c[2] = 123456;
    c[3] = 5;
    c[4] = 2 * L - 124457;
    c[5] = 3;
    c[w0] = 1;
    for (int32_t k = 0; k < EXTRA; k++) {
        c[6 + 2 * k] = 7;
        c[7 + 2 * k] = 2;
    }
    *counts = c;
    return p;
}

/* The max-flow levels' dense start (epxi_bal_start) against the plain
 * start from the whole part (EPX_BALANCED_DENSE_START=0): every output
 * equal to the bit, on layers whose components go through max-flows (the
 * subset solve off, and large layers with replicas on any GPU), skewed and
 * flat batches. The start only saves max-flows; the level it reaches is the
 * same, and with its ratio reduced (epxi_bal_level) so is every output. */
static void dense_start_equals_plain(void **state) {
    (void)state;
    tu_rng r = {tu_seed(3307)};
    epx_error err = {0};
    for (int it = 0; it < 160; it++) {
        const int big = it % 4 == 3, huge = it % 16 == 15; /* DeepSeek-V3 on 32 or 64 GPUs */
        int32_t G = huge  ? 64
                    : big ? 32
                          : 2 + (int32_t)tu_below(&r, 15),
                per = huge  ? 5
                      : big ? 9
                            : 1 + (int32_t)tu_below(&r, 6);
        int32_t E = big ? 256 : G * per - (int32_t)tu_below(&r, (uint32_t)(G * per / 3 + 1));
        place p = bal_random_place(&r, E, G, per, it % 3 == 0 ? 4 : 0, 1);
        int64_t *c = calloc((size_t)E, sizeof(int64_t));
        bal_random_counts(&r, c, E, it % 2 ? 300 : 6);
        /* the subset solve off, so that every component of two GPUs or
         * more goes through max-flows (on the big layers too) */
        const char *was = getenv("EPX_BALANCED_SUBSET_GPUS");
        char *keep = was ? strdup(was) : NULL;
        setenv("EPX_BALANCED_SUBSET_GPUS", "0", 1);
        same_under_knob("EPX_BALANCED_DENSE_START", "0", &p, c, it, tu_seed(3307));
        if (keep) {
            setenv("EPX_BALANCED_SUBSET_GPUS", keep, 1);
            free(keep);
        } else {
            unsetenv("EPX_BALANCED_SUBSET_GPUS");
        }
        free(c);
        bal_free_place(&p);
    }
    { /* huge counts: equal only with each level's ratio reduced */
        int64_t *c = NULL;
        place p = huge_layer(&c);
        same_under_knob("EPX_BALANCED_DENSE_START", "0", &p, c, -1, 0);
        free(c);
        bal_free_place(&p);
    }
    place p = bal_random_place(&r, 6, 3, 3, 0, 1);
    epx_balancer *bad = NULL;
    assert_int_equal(create_env("EPX_BALANCED_DENSE_START", "2", &p, &bad, &err),
                     EPX_ERR_INVALID_ARG);
    assert_null(bad);
    assert_non_null(strstr(err.msg, "EPX_BALANCED_DENSE_START = '2'"));
    bal_free_place(&p);
}

/* FNV-1a over n bytes, continuing h. */
static uint64_t fnv(uint64_t h, const void *data, size_t n) {
    const unsigned char *c = data;
    for (size_t i = 0; i < n; i++) {
        h ^= c[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* Every output of the solve on a fixed set of layers (seeded here, never
 * by EPX_TEST_SEED), hashed, against the hash this source gave when it was
 * last changed on purpose: the solve's result is DEFINED by its code
 * (balanced_core.h), and a change meant to keep every output (a faster
 * step, a start, a cut) must leave it; one that changes the definition
 * updates the constants and says so. Both solves: by default, and
 * max-flows only. Shapes from 2 to 64 GPUs, node-local and not, skewed and
 * flat batches. */
static void outputs_pinned(void **state) {
    (void)state;
    static const uint64_t want[2] = {PINNED_DEFAULT, PINNED_FLOWS};
    static const int32_t Gs[] = {2, 3, 5, 8, 8, 11, 16, 32, 32, 64};
    for (int k = 0; k < 2; k++) {
        tu_rng r = {20261205ull};
        uint64_t h = 1469598103934665603ull;
        epx_error err = {0};
        for (int it = 0; it < 120; it++) {
            const int32_t G = Gs[tu_below(&r, 10)], per = 1 + (int32_t)tu_below(&r, 6);
            const int32_t nodes = G % 4 == 0 && it % 3 == 0 ? 4 : 1;
            const int32_t E =
                (G * per - (int32_t)tu_below(&r, (uint32_t)(G * per / 3 + 1))) / nodes * nodes;
            place p = bal_random_place(&r, E, G, per, it % 2 ? 4 : 0, nodes);
            int64_t *c = calloc((size_t)E, sizeof(int64_t));
            bal_random_counts(&r, c, E, it % 3 == 0 ? 5 : 400);
            epx_balancer *b = NULL;
            assert_int_equal(create_with(k ? "0" : NULL, &p, &b, &err), EPX_OK);
            outs o = make_outs(&p);
            assert_int_equal(epx_dispatch_balanced_solve(b, p.rep, p.nv, c, &o.o, &err), EPX_OK);
            const size_t n = (size_t)E * (size_t)p.W;
            h = fnv(h, o.shares, n * sizeof(double));
            h = fnv(h, o.rc, n * sizeof(int64_t));
            h = fnv(h, o.slots, (size_t)p.P * sizeof(int64_t));
            h = fnv(h, o.gpu_load, (size_t)G * sizeof(double));
            const int64_t sc[4] = {o.o.max_load_num, o.o.max_load_den, o.o.max_load_int,
                                   o.o.num_levels};
            h = fnv(h, sc, sizeof sc);
            free_outs(&o);
            epx_dispatch_balanced_destroy(b);
            free(c);
            bal_free_place(&p);
        }
        if (h != want[k])
            fail_msg("the %s solve's outputs hash to %016llx, pinned %016llx: a change to the "
                     "solve's results; if it is meant, update PINNED_%s and say why",
                     k ? "max-flow" : "default", (unsigned long long)h, (unsigned long long)want[k],
                     k ? "FLOWS" : "DEFAULT");
    }
}

/* The subset tables' size (epxi_bal_subsets) against the largest sum of
 * 2^n over disjoint parts of at most k GPUs out of G, by a recurrence over
 * G (best[g]: g GPUs left, each unused or in a part of n <= k): tight, so
 * every split the components can take fits and none is sized for more. */
static void subset_tables_sized_exactly(void **state) {
    (void)state;
    for (int32_t k = 2; k <= EPXI_BAL_SUBSET_MAX; k++) {
        int64_t best[97] = {0};
        for (int32_t g = 1; g <= 96; g++) {
            best[g] = best[g - 1];
            for (int32_t n = 1; n <= k && n <= g; n++)
                if (best[g - n] + ((int64_t)1 << n) > best[g])
                    best[g] = best[g - n] + ((int64_t)1 << n);
            epxi_bal b;
            memset(&b, 0, sizeof b);
            b.G = g;
            epxi_bal_subsets(&b, k);
            if (b.sub_size != best[g])
                fail_msg("G %d, parts of at most %d GPUs: tables of %lld entries, the most "
                         "any split needs is %lld",
                         g, k, (long long)b.sub_size, (long long)best[g]);
        }
    }
}

static void edge_cases(void **state) {
    (void)state;
    epx_error err = {0};
    tu_rng r = {tu_seed(2705)};
    place p = bal_random_place(&r, 6, 3, 3, 0, 1);
    epx_balancer *b = NULL;
    assert_int_equal(epx_dispatch_balanced_create(6, p.W, p.P, 3, &b, &err), EPX_OK);
    outs o = make_outs(&p);
    int64_t zero[6] = {0};
    assert_int_equal(epx_dispatch_balanced_solve(b, p.rep, p.nv, zero, &o.o, &err), EPX_OK);
    assert_int_equal(o.o.max_load_num, 0);
    assert_int_equal(o.o.max_load_den, 1);
    assert_int_equal(o.o.max_load_int, 0);
    assert_int_equal(o.o.num_levels, 0);
    for (int32_t e = 0; e < 6; e++) assert_true(fabs(o.shares[e * p.W] - 1.0 / p.nv[e]) < 1e-15);
    /* T = 0 through the one call; the out struct is optional */
    assert_int_equal(epx_dispatch_balanced_topk(b, p.rep, p.nv, NULL, 0, 8, NULL, NULL, &err),
                     EPX_OK);
    /* only the scalars wanted */
    epx_balanced_out bare = {0};
    int64_t one[6] = {5, 0, 0, 0, 0, 0};
    assert_int_equal(epx_dispatch_balanced_solve(b, p.rep, p.nv, one, &bare, &err), EPX_OK);
    /* one loaded expert: its 5 tokens spread evenly over its GPUs */
    int64_t k = __builtin_popcount(gpu_mask(&p, 0));
    assert_true(bare.max_load_num * k == 5 * bare.max_load_den && bare.num_levels == 1);
    free_outs(&o);
    bal_free_place(&p);
    epx_dispatch_balanced_destroy(b);
}

static void errors(void **state) {
    (void)state;
    epx_error err = {0};
    epx_balancer *b = NULL;
    assert_int_equal(epx_dispatch_balanced_create(4, 2, 6, 4, &b, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "P a multiple of G");
    /* lists wider than the slots, and tables past 1 TiB, before any allocation */
    assert_int_equal(epx_dispatch_balanced_create(4, 9, 8, 4, &b, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "W = 9", "W must be at most P");
    assert_int_equal(epx_dispatch_balanced_create(1 << 24, 1 << 16, 1 << 24, 4096, &b, &err),
                     EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "1 TiB");
    assert_null(b);
    assert_int_equal(epx_dispatch_balanced_create(4, 2, 6, 3, NULL, &err), EPX_ERR_INVALID_ARG);
    assert_int_equal(epx_dispatch_balanced_create(4, 3, 6, 3, &b, &err), EPX_OK);
    int32_t rep[12] = {0, 1, -1, 2, -1, -1, 3, -1, -1, 4, 5, -1};
    int32_t nv[4] = {2, 1, 1, 2};
    int64_t c[4] = {3, 1, 4, 1};
    epx_balanced_out o = {0};
    assert_int_equal(epx_dispatch_balanced_solve(b, rep, nv, c, &o, &err), EPX_OK);
    nv[1] = 0;
    assert_int_equal(epx_dispatch_balanced_solve(b, rep, nv, c, &o, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "num_valid[1] = 0");
    nv[1] = 1;
    rep[3] = 6;
    assert_int_equal(epx_dispatch_balanced_solve(b, rep, nv, c, &o, &err), EPX_ERR_INVALID_MAP);
    TU_MSG_HAS(err.msg, "replicas[1][0] = 6", "outside [0, 6)");
    rep[3] = 1;
    assert_int_equal(epx_dispatch_balanced_solve(b, rep, nv, c, &o, &err), EPX_ERR_INVALID_MAP);
    TU_MSG_HAS(err.msg, "slot 1 is listed twice", "expert 0", "expert 1");
    rep[3] = 2;
    c[2] = -4;
    assert_int_equal(epx_dispatch_balanced_solve(b, rep, nv, c, &o, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "counts[2] = -4");
    c[2] = (int64_t)1 << 40;
    assert_int_equal(epx_dispatch_balanced_solve(b, rep, nv, c, &o, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "2^40");
    c[2] = 4;
    assert_int_equal(epx_dispatch_balanced_solve(b, rep, nv, c, NULL, &err), EPX_ERR_INVALID_ARG);
    /* ids */
    int32_t ids[4] = {0, 1, 4, -1};
    int64_t cnt[4];
    assert_int_equal(epx_dispatch_count_ids(ids, 2, 2, 4, cnt, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "topk_ids[1][0] = 4", "[-1, 4)");
    const int32_t two_bad[4] = {0, -2, 9, 1}; /* the first offender is named, below and above */
    assert_int_equal(epx_dispatch_count_ids(two_bad, 2, 2, 4, cnt, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "topk_ids[0][1] = -2");
    assert_int_equal(epx_dispatch_count_ids(ids, -1, 2, 4, cnt, &err), EPX_ERR_SHAPE);
    ids[2] = 3;
    int64_t rc[12] = {1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0};
    int32_t phys[4];
    assert_int_equal(epx_dispatch_balanced_map_ids(b, rep, nv, rc, ids, 2, 2, phys, &err), EPX_OK);
    assert_int_equal(phys[0], 1 - 1);
    assert_int_equal(phys[1], 2);
    assert_int_equal(phys[2], 5);
    assert_int_equal(phys[3], -1);
    rc[0] = 2;
    assert_int_equal(epx_dispatch_balanced_map_ids(b, rep, nv, rc, ids, 2, 2, phys, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "replica_counts[0][0] = 2", "past the 1 tokens", "another batch");
    /* a huge count is refused before it is added (the int64 sum overflowed) */
    rc[0] = INT64_MAX;
    assert_int_equal(epx_dispatch_balanced_map_ids(b, rep, nv, rc, ids, 2, 2, phys, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "9223372036854775807", "another batch");
    rc[0] = 0; /* too few: the sum check after the columns */
    assert_int_equal(epx_dispatch_balanced_map_ids(b, rep, nv, rc, ids, 2, 2, phys, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "expert 0 sum to", "hold 1");
    epx_dispatch_balanced_destroy(b);
    /* the subset bound's knob: a bad value is named, not read as 0 */
    place p = {4, 6, 3, 3, 2, rep, nv};
    static const char *bad[] = {"abc", "13", "-1", "4x"};
    for (int i = 0; i < 4; i++) {
        b = NULL;
        assert_int_equal(create_with(bad[i], &p, &b, &err), EPX_ERR_INVALID_ARG);
        assert_null(b);
        TU_MSG_HAS(err.msg, "EPX_BALANCED_SUBSET_GPUS", bad[i], "from 0 (max-flows only) to 12");
    }
    assert_int_equal(create_with("12", &p, &b, &err), EPX_OK);
    epx_dispatch_balanced_destroy(b);
}

/* EPX_BALANCED_GRID_PAIRS, the GPU ids entry point's grid threshold (the
 * parse is host code in balanced_core.h, so it is checked here without a
 * GPU): unset or empty gives the default, digits their number (a huge one
 * saturates, still "never"), anything else is refused with the value. */
static void grid_pairs_env(void **state) {
    (void)state;
    const char *was = getenv("EPX_BALANCED_GRID_PAIRS");
    char *keep = was ? strdup(was) : NULL;
    int64_t n = -1;
    const char *bad = NULL;
    unsetenv("EPX_BALANCED_GRID_PAIRS");
    assert_int_equal(epxi_bal_grid_pairs_from_env(&n, &bad), 0);
    assert_int_equal(n, EPXI_BAL_GRID_PAIRS);
    static const struct {
        const char *v;
        int64_t n;
    } good[] = {
        {"", EPXI_BAL_GRID_PAIRS},    {"0", 0},   {"2048", 2048},
        {"2147483648", 2147483648ll}, {"007", 7}, {"99999999999999999999999999", (int64_t)1 << 40}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        setenv("EPX_BALANCED_GRID_PAIRS", good[i].v, 1);
        n = -1;
        assert_int_equal(epxi_bal_grid_pairs_from_env(&n, &bad), 0);
        if (good[i].n == (int64_t)1 << 40)
            assert_true(n >= good[i].n); /* saturated: past any T * K */
        else
            assert_int_equal(n, good[i].n);
    }
    static const char *wrong[] = {"-1", "abc", "4x", " 5", "+5", "1e6", "0x10"};
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        setenv("EPX_BALANCED_GRID_PAIRS", wrong[i], 1);
        bad = NULL;
        assert_int_equal(epxi_bal_grid_pairs_from_env(&n, &bad), -1);
        assert_string_equal(bad, wrong[i]);
    }
    /* what the GPU create says around the value */
    assert_non_null(strstr(EPXI_BAL_GRID_HELP, "0: all"));
    assert_non_null(strstr(EPXI_BAL_GRID_HELP, "default 4096"));
    if (keep) {
        setenv("EPX_BALANCED_GRID_PAIRS", keep, 1);
        free(keep);
    } else {
        unsetenv("EPX_BALANCED_GRID_PAIRS");
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(small_against_brute_force),
        cmocka_unit_test(tiny_integer_optimum),
        cmocka_unit_test(kimi_k25_layer),
        cmocka_unit_test(deepseek_v3_layer),
        cmocka_unit_test(one_balancer_many_layers),
        cmocka_unit_test(subsets_and_flows_agree),
        cmocka_unit_test(closed_form_equals_subsets),
        cmocka_unit_test(dense_start_equals_plain),
        cmocka_unit_test(outputs_pinned),
        cmocka_unit_test(subset_tables_sized_exactly),
        cmocka_unit_test(edge_cases),
        cmocka_unit_test(errors),
        cmocka_unit_test(grid_pairs_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
