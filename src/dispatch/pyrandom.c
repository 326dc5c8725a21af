/*
 * pyrandom.c - CPython's random.Random, reproduced draw for draw.
 *
 * The generator is MT19937 with the reference code's seeding
 * (init_genrand(19650218) then init_by_array) and tempering, which is what
 * Modules/_randommodule.c runs. The layers above it follow Lib/random.py:
 * `_randbelow` rejects getrandbits(n.bit_length()) draws until one is below n
 * (so n = 1 still consumes a word per call), `shuffle` walks from the end, and
 * `sample` switches between its pool and set methods by the size rule written
 * in pyrandom.h. Any deviation, even one extra word drawn, changes every later
 * choice of SGLang's static dispatch table, so the golden tests compare whole
 * tables and known CPython outputs.
 */
#include "pyrandom.h"

#include <math.h>
#include <string.h>

#define MT_M 397
#define MATRIX_A 0x9908b0dfu
#define UPPER_MASK 0x80000000u
#define LOWER_MASK 0x7fffffffu

static void init_genrand(epxi_pyrandom *r, uint32_t s) {
    r->mt[0] = s;
    for (int i = 1; i < EPXI_MT_N; i++)
        r->mt[i] = 1812433253u * (r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) + (uint32_t)i;
    r->index = EPXI_MT_N;
}

void epxi_pyrandom_init_by_array(epxi_pyrandom *r, const uint32_t *key, size_t n) {
    init_genrand(r, 19650218u);
    size_t i = 1, j = 0;
    size_t k = EPXI_MT_N > n ? EPXI_MT_N : n;
    for (; k; k--) {
        r->mt[i] =
            (r->mt[i] ^ ((r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) * 1664525u)) + key[j] + (uint32_t)j;
        i++;
        j++;
        if (i >= EPXI_MT_N) {
            r->mt[0] = r->mt[EPXI_MT_N - 1];
            i = 1;
        }
        if (j >= n) j = 0;
    }
    for (k = EPXI_MT_N - 1; k; k--) {
        r->mt[i] = (r->mt[i] ^ ((r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) * 1566083941u)) - (uint32_t)i;
        i++;
        if (i >= EPXI_MT_N) {
            r->mt[0] = r->mt[EPXI_MT_N - 1];
            i = 1;
        }
    }
    r->mt[0] = 0x80000000u; /* MSB is 1, assuring a non-zero initial array */
    r->index = EPXI_MT_N;
}

void epxi_pyrandom_seed(epxi_pyrandom *r, uint64_t seed) {
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    epxi_pyrandom_init_by_array(r, key, key[1] != 0 ? 2 : 1);
}

static void regenerate(epxi_pyrandom *r) {
    uint32_t *mt = r->mt;
    int kk = 0;
    for (; kk < EPXI_MT_N - MT_M; kk++) {
        uint32_t y = (mt[kk] & UPPER_MASK) | (mt[kk + 1] & LOWER_MASK);
        mt[kk] = mt[kk + MT_M] ^ (y >> 1) ^ ((y & 1u) ? MATRIX_A : 0u);
    }
    for (; kk < EPXI_MT_N - 1; kk++) {
        uint32_t y = (mt[kk] & UPPER_MASK) | (mt[kk + 1] & LOWER_MASK);
        mt[kk] = mt[kk + (MT_M - EPXI_MT_N)] ^ (y >> 1) ^ ((y & 1u) ? MATRIX_A : 0u);
    }
    uint32_t y = (mt[EPXI_MT_N - 1] & UPPER_MASK) | (mt[0] & LOWER_MASK);
    mt[EPXI_MT_N - 1] = mt[MT_M - 1] ^ (y >> 1) ^ ((y & 1u) ? MATRIX_A : 0u);
    r->index = 0;
}

uint32_t epxi_pyrandom_u32(epxi_pyrandom *r) {
    if (r->index >= EPXI_MT_N) regenerate(r);
    uint32_t y = r->mt[r->index++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

uint64_t epxi_pyrandom_getrandbits64(epxi_pyrandom *r, int k) {
    if (k <= 0) return 0;
    if (k <= 32) return epxi_pyrandom_u32(r) >> (32 - k);
    uint32_t w[2];
    epxi_pyrandom_getrandbits_words(r, k, w);
    return (uint64_t)w[0] | ((uint64_t)w[1] << 32);
}

void epxi_pyrandom_getrandbits_words(epxi_pyrandom *r, int64_t k, uint32_t *words) {
    /* CPython: for (i = 0; i < words; i++, k -= 32) { r = genrand_uint32();
     * if (k < 32) r >>= (32 - k); wordarray[i] = r; } -- least significant
     * digit first, so the word drawn last holds the top bits. */
    for (int64_t i = 0; k > 0; i++, k -= 32) {
        uint32_t w = epxi_pyrandom_u32(r);
        if (k < 32) w >>= (32 - k);
        words[i] = w;
    }
}

static int bit_length(uint64_t n) {
    int b = 0;
    while (n) {
        b++;
        n >>= 1;
    }
    return b;
}

uint64_t epxi_pyrandom_randbelow(epxi_pyrandom *r, uint64_t n) {
    int k = bit_length(n);
    uint64_t v = epxi_pyrandom_getrandbits64(r, k);
    while (v >= n) v = epxi_pyrandom_getrandbits64(r, k);
    return v;
}

/* CPython's sample() threshold: an n-list is cheaper than a k-set when
 * n <= 21 + 4 ** ceil(log(3k, 4)) (the second term only for k > 5). The log
 * is math.log(x, 4) = log(x) / log(4), computed in double as Python does;
 * 3k is never a power of 4, so rounding of the quotient cannot move ceil. */
static bool sample_uses_pool(size_t n, size_t k) {
    double setsize = 21.0;
    if (k > 5) setsize += pow(4.0, ceil(log((double)k * 3.0) / log(4.0)));
    return (double)n <= setsize;
}

void epxi_pyrandom_sample(epxi_pyrandom *r, const int32_t *population, size_t n, size_t k,
                          int32_t *out, void *scratch) {
    if (sample_uses_pool(n, k)) {
        /* Invariant: the items not yet selected are pool[0 .. n - i). */
        int32_t *pool = scratch;
        memcpy(pool, population, n * sizeof *pool);
        for (size_t i = 0; i < k; i++) {
            size_t j = (size_t)epxi_pyrandom_randbelow(r, (uint64_t)(n - i));
            out[i] = pool[j];
            pool[j] = pool[n - i - 1];
        }
    } else {
        /* Set method: redraw an index until it is one not yet selected. */
        unsigned char *selected = (unsigned char *)scratch + n * sizeof(int32_t);
        memset(selected, 0, n);
        for (size_t i = 0; i < k; i++) {
            size_t j = (size_t)epxi_pyrandom_randbelow(r, (uint64_t)n);
            while (selected[j]) j = (size_t)epxi_pyrandom_randbelow(r, (uint64_t)n);
            selected[j] = 1;
            out[i] = population[j];
        }
    }
}

void epxi_pyrandom_shuffle(epxi_pyrandom *r, int32_t *x, size_t n) {
    for (size_t i = n; i-- > 1;) {
        size_t j = (size_t)epxi_pyrandom_randbelow(r, (uint64_t)(i + 1));
        int32_t t = x[i];
        x[i] = x[j];
        x[j] = t;
    }
}
