/*
 * pyrandom.h - a faithful C model of CPython's `random.Random`: the Mersenne
 * Twister MT19937 as Modules/_randommodule.c runs it (int seeds go through
 * init_by_array), `getrandbits` built from 32-bit words the way CPython builds
 * its long integers, `_randbelow` by rejection, and Lib/random.py's `sample`
 * (pool and set methods, with CPython's rule for choosing between them) and
 * `shuffle`. SGLang's static dispatch table depends on every draw of
 * `random.Random(42)`, so each function here consumes exactly the words its
 * Python counterpart does, in the same order. Internal to libepx.
 */
#ifndef EPX_PYRANDOM_H
#define EPX_PYRANDOM_H

#include "internal.h"

#define EPXI_MT_N 624

typedef struct epxi_pyrandom {
    uint32_t mt[EPXI_MT_N];
    int32_t index; /* next word of mt to temper; EPXI_MT_N = regenerate first */
} epxi_pyrandom;

/* random.Random(seed) for a non-negative int seed: the seed's 32-bit words,
 * least significant first (one word for seeds below 2**32, and [0] for 0),
 * fed to init_by_array. */
EPXI_HIDDEN void epxi_pyrandom_seed(epxi_pyrandom *r, uint64_t seed);

/* The MT19937 reference init_by_array(key, n); n >= 1. */
EPXI_HIDDEN void epxi_pyrandom_init_by_array(epxi_pyrandom *r, const uint32_t *key, size_t n);

/* One tempered 32-bit output (genrand_uint32). */
EPXI_HIDDEN uint32_t epxi_pyrandom_u32(epxi_pyrandom *r);

/* getrandbits(k) for 0 <= k <= 64: k <= 32 takes one word's top k bits; above
 * that CPython fills 32-bit digits from least to most significant, each a new
 * word, the last one shifted right to keep its top (k mod 32) bits. */
EPXI_HIDDEN uint64_t epxi_pyrandom_getrandbits64(epxi_pyrandom *r, int k);

/* getrandbits(k) for any k >= 0 into ceil(k/32) little-endian words (the
 * int's value is sum(words[i] << 32*i)); draws exactly as CPython does. */
EPXI_HIDDEN void epxi_pyrandom_getrandbits_words(epxi_pyrandom *r, int64_t k, uint32_t *words);

/* _randbelow(n) for 1 <= n < 2**63: draw getrandbits(n.bit_length()) until
 * the value is below n. */
EPXI_HIDDEN uint64_t epxi_pyrandom_randbelow(epxi_pyrandom *r, uint64_t n);

/* Scratch that sample() needs for n population items: n int32 (pool) and n
 * bytes (the set method's membership), as one caller-owned block. */
static inline size_t epxi_pyrandom_sample_scratch_bytes(size_t n) {
    return n * (sizeof(int32_t) + 1);
}

/* sample(population[0..n), k) into out[0..k), 0 <= k <= n. Uses the pool
 * method when n <= 21 + (k > 5 ? 4 ** ceil(log(3k, 4)) : 0), else the set
 * method, as CPython does; `scratch` holds epxi_pyrandom_sample_scratch_bytes(n). */
EPXI_HIDDEN void epxi_pyrandom_sample(epxi_pyrandom *r, const int32_t *population, size_t n,
                                      size_t k, int32_t *out, void *scratch);

/* shuffle(x[0..n)) in place: for i from n-1 down to 1 swap x[i] with
 * x[_randbelow(i + 1)]. */
EPXI_HIDDEN void epxi_pyrandom_shuffle(epxi_pyrandom *r, int32_t *x, size_t n);

#endif /* EPX_PYRANDOM_H */
