/*
 * balanced_subsets.h - one component of the balanced split by its GPU subsets
 * (components of at most sub_max GPUs; one lone flexible expert in closed
 * form), on the lanes of a warp. Part of the solver balanced_core.h
 * describes.
 */
#ifndef EPX_DISPATCH_BALANCED_SUBSETS_H
#define EPX_DISPATCH_BALANCED_SUBSETS_H

#include "balanced_core.h"

/* ---- one component by its subsets (components of at most sub_max GPUs) -------- */

/* The same statements run by one thread (the CPU: lane 0 of nl = 1) or by
 * the 32 lanes of a warp (the kernel: nl = 32), each lane taking the
 * subsets V = lane, lane + nl, ...; the reductions are exact (integer
 * minima, and a maximum whose ties are merged by OR), so their order does
 * not matter and both give the same bits. */
#ifdef __CUDA_ARCH__
#define EPXI_BAL_SYNCWARP() __syncwarp()
#elif defined(EPXI_BAL_LANES)
/* A test's build (tests/test_balanced_lanes.c defines EPXI_BAL_LANES and
 * these): the nl = 32 statements on 32 host threads, one per lane, so that
 * the lanes' split of the subsets, their reductions and their barriers are
 * checked without a GPU. On a thread that is no lane (nl = 1) each is the
 * plain host form. */
void epxi_bal_lanes_sync(int line);
int64_t epxi_bal_lanes_min(int64_t v);
int epxi_bal_lanes_all(int ok);
uint32_t epxi_bal_lanes_or(uint32_t m);
uint32_t epxi_bal_lanes_best(int64_t num, int32_t den, uint32_t mask);
int32_t epxi_bal_lanes_first(int64_t num, int32_t den, int32_t idx);
int64_t epxi_bal_lanes_sum(int64_t v);
int64_t epxi_bal_lanes_from(int64_t v, int src);
/* ... and, called by lane 0, the lanes' graph build, greedy start and BFS
 * checked against the serial forms on the same graph (balanced_flows.h) */
struct epxi_bal;
struct epxi_bal_part;
void epxi_bal_lanes_built(struct epxi_bal *b, struct epxi_bal_part *p, int64_t a, int64_t den,
                          int64_t need);
void epxi_bal_lanes_keep(const struct epxi_bal_part *p);
void epxi_bal_lanes_greedy(struct epxi_bal_part *p, int64_t start);
void epxi_bal_lanes_bfs(struct epxi_bal_part *p, int reached);
#define EPXI_BAL_SYNCWARP() epxi_bal_lanes_sync(__LINE__)
#else
#define EPXI_BAL_SYNCWARP() ((void)0)
#endif

/* Where a profile build marks the subset solve's steps (src/cuda/balanced.cu
 * with EPX_BAL_PROFILE: lane 0 adds the global timer's time since its last
 * mark to step k's total, printed on the kernel's balprof line); nothing in
 * every other build. k: 0 the subset sums, 1 a level's best subset, 2 its
 * split, 3 its rounding. */
#ifndef EPXI_BAL_MARK
#define EPXI_BAL_MARK(k, lane) ((void)0)
#endif

/* x / y and x % y, in 32 bits where both fit: the same values, but on the
 * GPU a 64-bit division is a subroutine of ~70 dependent instructions, on
 * the per-batch solve's sequential chains (the rounding, the outputs, the
 * summary). */
EPXI_BAL int64_t epxi_bal_div(int64_t x, int64_t y) {
    if (x >= 0 && y > 0 && x <= INT32_MAX && y <= INT32_MAX)
        return (int64_t)((uint32_t)x / (uint32_t)y);
    return x / y;
}
EPXI_BAL int64_t epxi_bal_mod(int64_t x, int64_t y) {
    if (x >= 0 && y > 0 && x <= INT32_MAX && y <= INT32_MAX)
        return (int64_t)((uint32_t)x % (uint32_t)y);
    return x % y;
}

/* The greatest common divisor of a >= 0 and d > 0 (Euclid's), which
 * reduces a level's a / d: the max-flow levels' ends and the summary. */
EPXI_BAL int64_t epxi_bal_gcd(int64_t a, int64_t d) {
    while (d != 0) {
        const int64_t t = epxi_bal_mod(a, d);
        a = d;
        d = t;
    }
    return a;
}

EPXI_BAL void epxi_bal_add_to(int64_t *p, int64_t v) {
#ifdef __CUDA_ARCH__
    atomicAdd((unsigned long long *)p, (unsigned long long)v);
#elif defined(EPXI_BAL_LANES)
    __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
#else
    *p += v;
#endif
}

/* The warp's minimum: one redux.sync on the values clamped to int32, exact
 * when the result lies strictly inside int32's range (a clamped value is
 * then no smaller than the true minimum, which is itself unclamped); else
 * the 64-bit butterfly (the result is the same in every lane, so the
 * branch is too). */
EPXI_BAL int64_t epxi_bal_min_lanes(int64_t v, int nl) {
#ifdef __CUDA_ARCH__
    if (nl <= 1) return v;
    const int32_t c = v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : (int32_t)v;
    const int32_t m = __reduce_min_sync(0xffffffffu, c);
    if (m > INT32_MIN && m < INT32_MAX) return m;
    for (int o = 16; o > 0; o >>= 1) {
        int64_t w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w < v ? w : v;
    }
#elif defined(EPXI_BAL_LANES)
    if (nl > 1) v = epxi_bal_lanes_min(v);
#else
    (void)nl;
#endif
    return v;
}

/* The warp's sum (integers: any order gives the same). */
EPXI_BAL int64_t epxi_bal_sum_lanes(int64_t v, int nl) {
#ifdef __CUDA_ARCH__
    if (nl > 1)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
#elif defined(EPXI_BAL_LANES)
    if (nl > 1) v = epxi_bal_lanes_sum(v);
#else
    (void)nl;
#endif
    return v;
}

/* Lane src's v, on every lane (a shuffle). */
EPXI_BAL int64_t epxi_bal_from_lane(int64_t v, int src, int nl) {
#ifdef __CUDA_ARCH__
    if (nl > 1) v = __shfl_sync(0xffffffffu, v, src);
#elif defined(EPXI_BAL_LANES)
    if (nl > 1) v = epxi_bal_lanes_from(v, src);
#else
    (void)src;
    (void)nl;
#endif
    return v;
}

EPXI_BAL uint32_t epxi_bal_or_lanes(uint32_t m, int nl) {
#ifdef __CUDA_ARCH__
    if (nl > 1) m = __reduce_or_sync(0xffffffffu, m);
#elif defined(EPXI_BAL_LANES)
    if (nl > 1) m = epxi_bal_lanes_or(m);
#else
    (void)nl;
#endif
    return m;
}

/* The index of x's lowest set bit (x != 0). */
EPXI_BAL int32_t epxi_bal_ctz(uint32_t x) {
#ifdef __CUDA_ARCH__
    return __ffs((int)x) - 1;
#else
    int32_t n = 0;
    for (; !(x & 1u); x >>= 1) n++;
    return n;
#endif
}

EPXI_BAL int epxi_bal_all_lanes(int ok, int nl) {
#ifdef __CUDA_ARCH__
    if (nl > 1) return __all_sync(0xffffffffu, ok);
#elif defined(EPXI_BAL_LANES)
    if (nl > 1) return epxi_bal_lanes_all(ok);
#else
    (void)nl;
#endif
    return ok;
}

/* Keep the larger ratio num / den of (num, den, mask) and (n2, d2, m2);
 * on a tie the union of the masks (tight sets are closed under union). */
EPXI_BAL void epxi_bal_better(int64_t *num, int32_t *den, uint32_t *mask, int64_t n2, int32_t d2,
                              uint32_t m2) {
    int64_t l = n2 * *den, r = *num * d2;
    if (l > r) {
        *num = n2;
        *den = d2;
        *mask = m2;
    } else if (l == r) {
        *mask |= m2;
    }
}

/* Whether candidate (n2, d2, i2) comes before (n1, d1, i1) in a scan that
 * keeps the first strictly larger ratio: a larger ratio, or an equal one at
 * a smaller index; index -1 is no candidate. */
EPXI_BAL int epxi_bal_first_before(int64_t n2, int32_t d2, int32_t i2, int64_t n1, int32_t d1,
                                   int32_t i1) {
    if (i2 < 0) return 0;
    if (i1 < 0) return 1;
    const int64_t l = n2 * d1, r = n1 * d2;
    return l > r || (l == r && i2 < i1);
}

/* The lanes' first best candidate (each lane's own first best in, the
 * warp's out, the same on every lane): what one thread scanning all the
 * candidates in index order would keep. Returns its index, -1 for none. */
EPXI_BAL int32_t epxi_bal_first_lanes(int64_t num, int32_t den, int32_t idx, int nl) {
#ifdef __CUDA_ARCH__
    if (nl > 1)
        for (int o = 16; o > 0; o >>= 1) {
            const int64_t n2 = __shfl_xor_sync(0xffffffffu, num, o);
            const int32_t d2 = __shfl_xor_sync(0xffffffffu, den, o);
            const int32_t i2 = __shfl_xor_sync(0xffffffffu, idx, o);
            if (epxi_bal_first_before(n2, d2, i2, num, den, idx)) {
                num = n2;
                den = d2;
                idx = i2;
            }
        }
#elif defined(EPXI_BAL_LANES)
    if (nl > 1) return epxi_bal_lanes_first(num, den, idx);
#else
    (void)num;
    (void)den;
    (void)nl;
#endif
    return idx;
}

EPXI_BAL uint32_t epxi_bal_best_lanes(int64_t num, int32_t den, uint32_t mask, int nl) {
#ifdef __CUDA_ARCH__
    if (nl > 1)
        for (int o = 16; o > 0; o >>= 1) {
            int64_t n2 = __shfl_xor_sync(0xffffffffu, num, o);
            int32_t d2 = __shfl_xor_sync(0xffffffffu, den, o);
            uint32_t m2 = __shfl_xor_sync(0xffffffffu, mask, o);
            epxi_bal_better(&num, &den, &mask, n2, d2, m2);
        }
#elif defined(EPXI_BAL_LANES)
    if (nl > 1) return epxi_bal_lanes_best(num, den, mask);
#else
    (void)num;
    (void)den;
    (void)nl;
#endif
    return mask;
}

/* Is expert j of component view p one of level (X, U)'s: a GPU outside X,
 * none outside X | U? */
EPXI_BAL int epxi_bal_in_level(const epxi_bal *b, const epxi_bal_part *p, int32_t j, uint32_t X,
                               uint32_t U) {
    const uint32_t m = (uint32_t)b->f_mask[p->fl[j]];
    return (m & ~X) != 0 && (m & ~(X | U)) == 0;
}

/* Which of experts t0 .. t0 + 31 of view p are level (X, U)'s: bit q for
 * expert t0 + q, each lane testing its own, the same mask on every lane.
 * The loops over a level's experts in order walk these bits (a level
 * holds a few of a component's experts), not every expert's test. */
EPXI_BAL uint32_t epxi_bal_level_run(const epxi_bal *b, const epxi_bal_part *p, int32_t t0,
                                     uint32_t X, uint32_t U, int lane, int nl) {
    uint32_t m = 0;
    for (int32_t q = lane; q < 32 && t0 + q < p->nf; q += nl)
        if (epxi_bal_in_level(b, p, t0 + q, X, U)) m |= 1u << q;
    return epxi_bal_or_lanes(m, nl);
}

/* Expert (r units, fractional GPUs F)'s terms in the two conditions at
 * subset v: max(0, r - |F \ v|) and min(r, |F & v|). */
EPXI_BAL int64_t epxi_bal_over(int64_t r, uint32_t F, uint32_t v) {
    int64_t x = r - epxi_bal_popc(F & ~v);
    return x > 0 ? x : 0;
}
EPXI_BAL int64_t epxi_bal_under(int64_t r, uint32_t F, uint32_t v) {
    int64_t x = epxi_bal_popc(F & v);
    return r < x ? r : x;
}

/* The split on registers: on a warp (nl = 32) solving a component of at
 * most 8 GPUs whose tokens stay below 2^26 (epxi_bal_split_regs), lane l
 * holds the slacks of subsets v = l + 32 j, j < 8, in 32 bits (they lie
 * within [-2^30, 2^30] then), and a step's subsets are chosen by 8-bit
 * masks over j: v's low 5 bits are the lane's, its high 3 bits j's. A step
 * of the table form runs a test, a 64-bit minimum and an update per subset,
 * one dependent chain on one warp (~1,200 cycles a step); here two masks,
 * eight selects and one warp minimum: the split at Kimi-K2.5's 128 tokens
 * about halved (bench/RESULTS.md, seventeenth session). */
EPXI_BAL int epxi_bal_split_regs(uint32_t k, int nl, int64_t total) {
    return nl == 32 && k <= 8 && total < ((int64_t)1 << 26);
}
/* The lane's subsets holding GPU bit g */
EPXI_BAL uint32_t epxi_bal_jm_has(int lane, int32_t g) {
    if (g < 5) return (lane >> g & 1) ? 0xffu : 0u;
    return g == 5 ? 0xaau : g == 6 ? 0xccu : 0xf0u;
}
/* ... holding every GPU of r */
EPXI_BAL uint32_t epxi_bal_jm_sup(int lane, uint32_t r) {
    uint32_t m = ((uint32_t)lane & r & 31u) == (r & 31u) ? 0xffu : 0u;
    if (r >> 5 & 1) m &= 0xaau;
    if (r >> 6 & 1) m &= 0xccu;
    if (r >> 7 & 1) m &= 0xf0u;
    return m;
}
/* ... inside U (so below 2^k: U is a subset of the component's k GPUs) */
EPXI_BAL uint32_t epxi_bal_jm_in(int lane, uint32_t U) {
    uint32_t m = ((uint32_t)lane & ~U & 31u) == 0 ? 0xffu : 0u;
    if (!(U >> 5 & 1)) m &= 0x55u;
    if (!(U >> 6 & 1)) m &= 0x33u;
    if (!(U >> 7 & 1)) m &= 0x0fu;
    return m;
}
/* The warp's minimum of 32-bit values (nl = 32). */
EPXI_BAL int32_t epxi_bal_min32_lanes(int32_t v) {
#ifdef __CUDA_ARCH__
    return __reduce_min_sync(0xffffffffu, v);
#elif defined(EPXI_BAL_LANES)
    return (int32_t)epxi_bal_lanes_min(v);
#else
    return v;
#endif
}
#ifdef __CUDA_ARCH__
#define EPXI_BAL_UNROLL _Pragma("unroll") /* a register array needs constant indices */
#else
#define EPXI_BAL_UNROLL
#endif

/* Round level (X, U) of a subset-solved component (load a / dn on each of
 * U's GPUs): every flow down to whole tokens, then the units left, r_e
 * for expert e, each to one of its GPUs with a fractional flow (F_e, at
 * most one each), so that GPU g takes between lo_g and hi_g of them (its
 * integer load the level's floor or ceiling). By Hoffman's circulation
 * theorem on s -> e -> g -> t (cut by cut) that is feasible iff for every
 * subset v of U: sum_e max(0, r_e - |F_e \ v|) <= hi(v) and sum_e min(r_e,
 * |F_e & v|) >= lo(v). The fractional split satisfies both, so a rounding
 * exists; the greedy walks each expert's fractional GPUs in order and
 * gives a unit where both still hold for every v after it (each lane its
 * subsets, then all lanes agree), else none, so what is left stays
 * feasible. su / sl: the two slacks per subset. */
EPXI_BAL void epxi_bal_subset_round(epxi_bal *b, const epxi_bal_part *p, int64_t *su, int64_t *sl,
                                    uint32_t X, uint32_t U, int64_t a, int32_t dn, int lane,
                                    int nl) {
    const int32_t D = b->D, k = p->ng;
    const uint32_t nv = 1u << k;
    const int64_t floor_l = epxi_bal_div(a, dn), ceil_l = epxi_bal_div(a + dn - 1, dn);
    int units = 0; /* this lane's experts leave units over */
    for (int32_t j = lane; j < p->nf; j += nl) {
        if (!epxi_bal_in_level(b, p, j, X, U)) continue;
        const int32_t i = p->fl[j], e = b->flex[i];
        int64_t r = b->cnt[e];
        uint32_t F = 0;
        for (int32_t q = 0; q < b->eg_n[e]; q++) {
            const size_t x = (size_t)i * (size_t)D + (size_t)q;
            b->f_int[x] = epxi_bal_div(b->f_flow[x], dn);
            r -= b->f_int[x];
            if (epxi_bal_mod(b->f_flow[x], dn))
                F |= 1u << b->g_loc[b->eg_gpu[(size_t)e * (size_t)D + (size_t)q]];
        }
        b->f_frac[i] = (int32_t)F;
        b->f_units[i] = r;
        units |= r > 0;
    }
    EPXI_BAL_SYNCWARP();
    /* No expert of the level has a unit over (most levels: the split's
     * flows are whole tokens but for a few experts): the floors are the
     * rounding, and the bounds and slack tables below would decide
     * nothing. Every lane takes the same branch (a vote). */
    if (epxi_bal_all_lanes(!units, nl)) return;
    /* hi_g and lo_g: the level's floor and ceiling less GPU g's base and
     * the whole tokens the level's experts give it (integer sums: their
     * order does not matter) */
    for (int32_t gi = lane; gi < k; gi += nl) {
        if (!(U >> gi & 1)) continue;
        const int32_t g = p->gl[gi];
        b->gex[g] = ceil_l - b->base[g];
        b->g_lo[g] = floor_l - b->base[g];
    }
    EPXI_BAL_SYNCWARP();
    for (int32_t t0 = 0; t0 < p->nf; t0 += 32)
        for (uint32_t run = epxi_bal_level_run(b, p, t0, X, U, lane, nl); run; run &= run - 1) {
            const int32_t i = p->fl[t0 + epxi_bal_ctz(run)], e = b->flex[i];
            for (int32_t q = lane; q < b->eg_n[e]; q += nl) {
                const int32_t g = b->eg_gpu[(size_t)e * (size_t)D + (size_t)q];
                const int64_t x = b->f_int[(size_t)i * (size_t)D + (size_t)q];
                if (!(U >> b->g_loc[g] & 1) || x == 0) continue;
                epxi_bal_add_to(b->gex + g, -x);
                epxi_bal_add_to(b->g_lo + g, -x);
            }
        }
    EPXI_BAL_SYNCWARP();
    for (uint32_t v = (uint32_t)lane; v < nv; v += (uint32_t)nl) {
        if ((v & ~U) != 0) continue;
        int64_t u = 0, l = 0;
        for (int32_t gi = 0; gi < k; gi++)
            if (v >> gi & 1) {
                u += b->gex[p->gl[gi]];
                l -= b->g_lo[p->gl[gi]];
            }
        su[v] = u;
        sl[v] = l;
    }
    /* the experts' terms: only those with units over have any (both are 0
     * at r = 0), so each expert is tested once, not once per subset, and
     * its lane's subsets are passed only when it counts; each lane updates
     * its own entries, so no barrier between experts */
    for (int32_t t0 = 0; t0 < p->nf; t0 += 32)
        for (uint32_t run = epxi_bal_level_run(b, p, t0, X, U, lane, nl); run; run &= run - 1) {
            const int32_t i = p->fl[t0 + epxi_bal_ctz(run)];
            const int64_t r = b->f_units[i];
            const uint32_t F = (uint32_t)b->f_frac[i];
            for (uint32_t v = (uint32_t)lane; v < nv && r > 0; v += (uint32_t)nl) {
                if ((v & ~U) != 0) continue;
                su[v] -= epxi_bal_over(r, F, v);
                sl[v] += epxi_bal_under(r, F, v);
            }
        }
    EPXI_BAL_SYNCWARP();
    for (int32_t t0 = 0; t0 < p->nf; t0 += 32) /* the level's experts, in order */
        for (uint32_t run = epxi_bal_level_run(b, p, t0, X, U, lane, nl); run; run &= run - 1) {
            const int32_t i = p->fl[t0 + epxi_bal_ctz(run)], e = b->flex[i];
            int64_t r = b->f_units[i];
            uint32_t F = (uint32_t)b->f_frac[i];
            for (int32_t q = 0; q < b->eg_n[e] && r > 0; q++) {
                const int32_t g = b->eg_gpu[(size_t)e * (size_t)D + (size_t)q], gb = b->g_loc[g];
                if (!(F >> gb & 1)) continue;
                const uint32_t F2 = F & ~(1u << gb);
                const int64_t lo_step = b->g_lo[g] > 0;
                int ok = 1;
                for (uint32_t v = (uint32_t)lane; v < nv && ok; v += (uint32_t)nl) {
                    if ((v & ~U) != 0) continue;
                    const int in = v >> gb & 1;
                    /* give: r - 1 units over F2; hi_g and lo_g one lower */
                    int64_t u = su[v] + epxi_bal_over(r, F, v) - epxi_bal_over(r - 1, F2, v) - in;
                    int64_t l = sl[v] - epxi_bal_under(r, F, v) + epxi_bal_under(r - 1, F2, v) +
                                (in ? lo_step : 0);
                    ok &= u >= 0 && l >= 0;
                }
                const int give = epxi_bal_all_lanes(ok, nl);
                const int64_t r2 = r - give;
                for (uint32_t v = (uint32_t)lane; v < nv; v += (uint32_t)nl) {
                    if ((v & ~U) != 0) continue;
                    const int in = v >> gb & 1;
                    su[v] += epxi_bal_over(r, F, v) - epxi_bal_over(r2, F2, v) - (give ? in : 0);
                    sl[v] += epxi_bal_under(r2, F2, v) - epxi_bal_under(r, F, v) +
                             (give && in ? lo_step : 0);
                }
                EPXI_BAL_SYNCWARP();
                if (lane == 0 && give) {
                    b->f_int[(size_t)i * (size_t)D + (size_t)q] += 1;
                    b->gex[g] -= 1;
                    b->g_lo[g] -= lo_step;
                }
                EPXI_BAL_SYNCWARP();
                r = r2;
                F = F2;
            }
        }
}

/* The subset solve of component c (balanced.c states it): d[V] = the tokens
 * that must land inside V (bases of V's GPUs, flexible experts with every
 * GPU in V), for every subset V of the component's GPUs (bit i = its i-th
 * GPU), by a sum over subsets. With X the GPUs of the levels so far, the
 * next level is the largest V > X maximising (d[V] - d[X]) / |V \ X|; its
 * experts (GPUs inside V, not all inside X) are split by a greedy that
 * keeps every subset's slack s[W] = lambda |W| - (d[X | W] - d[X]) >= 0:
 * each of an expert's GPUs but its last takes the most it can, the
 * smallest slack of the subsets that holding it would shrink. Every lane
 * of the caller's warp calls this (all nl of them). */
EPXI_BAL int32_t epxi_bal_subset_levels(epxi_bal *b, const epxi_bal_part *p, int32_t c, int lane,
                                        int nl) {
    const int32_t k = p->ng, D = b->D;
    const uint32_t full = (1u << k) - 1, nv = 1u << k;
    int64_t *d = b->sub_d + b->c_soff[c], *s = b->sub_s + b->c_soff[c];
    for (int32_t j = lane; j < p->nf; j += nl) {
        int32_t i = p->fl[j], e = b->flex[i];
        uint32_t m = 0;
        for (int32_t q = 0; q < b->eg_n[e]; q++)
            m |= 1u << b->g_loc[b->eg_gpu[(size_t)e * (size_t)D + (size_t)q]];
        b->f_mask[i] = (int32_t)m;
        b->f_level[i] = -1;
    }
    for (int32_t gi = lane; gi < k; gi += nl) b->g_level[p->gl[gi]] = -1;
    for (uint32_t v = (uint32_t)lane; v < nv; v += (uint32_t)nl) d[v] = 0;
    EPXI_BAL_SYNCWARP();
    for (int32_t j = lane; j < p->nf; j += nl)
        epxi_bal_add_to(d + b->f_mask[p->fl[j]], b->cnt[b->flex[p->fl[j]]]);
    for (int32_t gi = lane; gi < k; gi += nl) epxi_bal_add_to(d + (1u << gi), b->base[p->gl[gi]]);
    EPXI_BAL_SYNCWARP();
    for (int32_t bit = 0; bit < k; bit++) {
        for (uint32_t v = (uint32_t)lane; v < nv; v += (uint32_t)nl)
            if (v >> bit & 1) d[v] += d[v ^ (1u << bit)];
        EPXI_BAL_SYNCWARP();
    }
    EPXI_BAL_MARK(0, lane);
    uint32_t X = 0;
    int32_t levels = 0;
    while (X != full && d[full] > d[X]) {
        int64_t num = -1;
        int32_t den = 1;
        uint32_t mask = 0;
        const int32_t nx = epxi_bal_popc(X);
        for (uint32_t v = (uint32_t)lane; v < nv; v += (uint32_t)nl)
            if ((v & X) == X && v != X)
                epxi_bal_better(&num, &den, &mask, d[v] - d[X], epxi_bal_popc(v) - nx, v);
        const uint32_t U = epxi_bal_best_lanes(num, den, mask, nl) & ~X;
        const int64_t a = d[X | U] - d[X];
        const int32_t dn = epxi_bal_popc(U), lid = p->lv0 + levels;
        if (lane == 0) {
            b->lv_num[lid] = a;
            b->lv_den[lid] = dn;
        }
        for (int32_t gi = lane; gi < k; gi += nl)
            if (U >> gi & 1) b->g_level[p->gl[gi]] = lid;
        EPXI_BAL_MARK(1, lane);
        const int regs = epxi_bal_split_regs((uint32_t)k, nl, d[full]);
        const uint32_t in = regs ? epxi_bal_jm_in(lane, U) : 0u;
        int32_t sr[8];
        EPXI_BAL_UNROLL
        for (int j = 0; j < 8; j++) {
            const uint32_t v = (uint32_t)lane + 32u * (uint32_t)j;
            sr[j] = in >> j & 1 ? (int32_t)(a * epxi_bal_popc(v) - dn * (d[X | v] - d[X])) : 0;
        }
        for (uint32_t v = (uint32_t)lane; v < nv && !regs; v += (uint32_t)nl)
            if ((v & ~U) == 0) s[v] = a * epxi_bal_popc(v) - dn * (d[X | v] - d[X]);
        EPXI_BAL_SYNCWARP();
        for (int32_t t0 = 0; t0 < p->nf; t0 += 32) /* this level's experts, in order */
            for (uint32_t run = epxi_bal_level_run(b, p, t0, X, U, lane, nl); run; run &= run - 1) {
                const int32_t i = p->fl[t0 + epxi_bal_ctz(run)], e = b->flex[i];
                const uint32_t m = (uint32_t)b->f_mask[i];
                if (lane == 0) b->f_level[i] = lid;
                int64_t rem = dn * b->cnt[e];
                uint32_t N = m & U;
                for (int32_t q = 0; q < b->eg_n[e]; q++) {
                    const size_t x = (size_t)i * (size_t)D + (size_t)q;
                    const int32_t g = b->g_loc[b->eg_gpu[(size_t)e * (size_t)D + (size_t)q]];
                    const uint32_t rest = N & ~(1u << g);
                    int64_t take = 0;
                    if ((N >> g & 1) && rest == 0) {
                        take = rem; /* the last GPU: what is left */
                    } else if ((N >> g & 1) && regs) {
                        /* the table form's statements below, on the masks:
                         * bound = v holds g but not all of rest; other = v
                         * holds all of rest but not g */
                        const uint32_t hg = epxi_bal_jm_has(lane, g);
                        const uint32_t sp = epxi_bal_jm_sup(lane, rest);
                        const uint32_t bound = in & hg & ~sp, other = in & ~hg & sp;
                        int32_t lo = INT32_MAX;
                        EPXI_BAL_UNROLL
                        for (int j = 0; j < 8; j++)
                            if (bound >> j & 1) lo = sr[j] < lo ? sr[j] : lo;
                        lo = epxi_bal_min32_lanes(lo);
                        take = rem < lo ? rem : lo;
                        const int32_t t32 = (int32_t)take, r32 = (int32_t)(rem - take);
                        EPXI_BAL_UNROLL
                        for (int j = 0; j < 8; j++)
                            sr[j] -= bound >> j & 1 ? t32 : other >> j & 1 ? r32 : 0;
                        N = rest;
                    } else if (N >> g & 1) {
                        int64_t lo = EPXI_BAL_INF;
                        for (uint32_t v = (uint32_t)lane; v < nv; v += (uint32_t)nl)
                            if ((v & ~U) == 0 && (v >> g & 1) && (v & rest) != rest)
                                lo = s[v] < lo ? s[v] : lo;
                        lo = epxi_bal_min_lanes(lo, nl);
                        take = rem < lo ? rem : lo;
                        for (uint32_t v = (uint32_t)lane; v < nv; v += (uint32_t)nl) {
                            if ((v & ~U) != 0) continue;
                            if (v >> g & 1) {
                                if ((v & rest) != rest) s[v] -= take;
                            } else if ((v & rest) == rest) {
                                s[v] -= rem - take;
                            }
                        }
                        EPXI_BAL_SYNCWARP();
                        N = rest;
                    }
                    if (lane == 0) b->f_flow[x] = take;
                    rem -= take;
                }
            }
        EPXI_BAL_SYNCWARP();
        EPXI_BAL_MARK(2, lane);
        /* the level is split: its slack table s now serves the rounding */
        epxi_bal_subset_round(b, p, s, b->sub_l + b->c_soff[c], X, U, a, dn, lane, nl);
        EPXI_BAL_MARK(3, lane);
        X |= U;
        levels++;
    }
    EPXI_BAL_SYNCWARP();
    return levels;
}

/* Whether component view p is one flexible expert on every one of its
 * GPUs (epxi_bal_one_levels' case), from its lists alone: every lane of a
 * warp gets the same answer. */
EPXI_BAL int epxi_bal_one_expert(const epxi_bal *b, const epxi_bal_part *p) {
    if (!b->closed || p->nf != 1) return 0;
    const int32_t e = b->flex[p->fl[0]];
    uint32_t m = 0;
    for (int32_t q = 0; q < b->eg_n[e]; q++)
        m |= 1u << b->g_loc[b->eg_gpu[(size_t)e * (size_t)b->D + (size_t)q]];
    return m == (1u << p->ng) - 1;
}

/* Such a component in closed form, with the subset solve's results to the
 * bit (its levels, flows and rounding), on one thread. There the subsets'
 * demands are the bases, and the expert's c tokens on the whole set only,
 * so each level is either the remaining GPUs of the largest base (when
 * they stand above the water line, (bases + c) / GPUs) or all the rest,
 * which the expert's flows fill to that line: GPU g's flow, in 1 / dn
 * units, is a - dn b_g. Flooring leaves a mod dn units, one each to the
 * first GPUs in the expert's order (each may take one). Returns the
 * levels. */
EPXI_BAL int32_t epxi_bal_one_levels(epxi_bal *b, const epxi_bal_part *p) {
    const int32_t k = p->ng, D = b->D, i = p->fl[0], e = b->flex[i];
    const int64_t c = b->cnt[e];
    const uint32_t full = (1u << k) - 1;
    const int32_t *eg = b->eg_gpu + (size_t)e * (size_t)D;
    b->f_mask[i] = (int32_t)full;
    b->f_level[i] = -1;
    for (int32_t gi = 0; gi < k; gi++) b->g_level[p->gl[gi]] = -1;
    uint32_t X = 0;
    int32_t levels = 0;
    while (X != full) {
        int64_t top = -1, sum = 0;
        for (int32_t gi = 0; gi < k; gi++)
            if (!(X >> gi & 1)) {
                const int64_t bg = b->base[p->gl[gi]];
                sum += bg;
                top = bg > top ? bg : top;
            }
        const int32_t left = epxi_bal_popc(full & ~X);
        const int last = sum + c >= top * left; /* ties: the union, all the rest */
        uint32_t U = 0;
        for (int32_t gi = 0; gi < k; gi++)
            if (!(X >> gi & 1) && (last || b->base[p->gl[gi]] == top)) U |= 1u << gi;
        const int32_t dn = epxi_bal_popc(U), lid = p->lv0 + levels;
        const int64_t a = last ? sum + c : top * dn;
        b->lv_num[lid] = a;
        b->lv_den[lid] = dn;
        for (int32_t gi = 0; gi < k; gi++)
            if (U >> gi & 1) b->g_level[p->gl[gi]] = lid;
        if (last) {
            b->f_level[i] = lid;
            int64_t r = c;
            for (int32_t q = 0; q < b->eg_n[e]; q++) {
                const size_t x = (size_t)i * (size_t)D + (size_t)q;
                const int32_t gi = b->g_loc[eg[q]];
                b->f_flow[x] = U >> gi & 1 ? a - dn * b->base[eg[q]] : 0;
                b->f_int[x] = epxi_bal_div(b->f_flow[x], dn);
                r -= b->f_int[x];
            }
            for (int32_t q = 0; q < b->eg_n[e] && r > 0; q++) {
                const size_t x = (size_t)i * (size_t)D + (size_t)q;
                if (epxi_bal_mod(b->f_flow[x], dn)) {
                    b->f_int[x] += 1;
                    r--;
                }
            }
        }
        X |= U;
        levels++;
    }
    return levels;
}

#endif /* EPX_DISPATCH_BALANCED_SUBSETS_H */
