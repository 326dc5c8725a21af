/*
 * dispatch_common.h - the arithmetic that the CPU reference (src/dispatch)
 * and the CUDA kernels (src/cuda) must do identically, written once: the
 * Philox-4x32-10 generator behind dynamic and weighted choices, the
 * replica choice from a random word (bf16 and the weighted sum are in
 * core/numeric.h). Everything
 * is a static inline function marked for both host and device, so the two
 * sides cannot drift. Internal to libepx; plain C11 and CUDA C++ alike.
 */
#ifndef EPX_DISPATCH_COMMON_H
#define EPX_DISPATCH_COMMON_H

#include <stdint.h>
#include <string.h>

#include "epx.h"

#include "numeric.h"

/* The one check of a dispatch spec, for the CPU path and the kernels
 * alike (token.c): the fields its mode reads are present. `memory` ("host"
 * or "device") names where the caller's pointers must live, in messages. */
#ifdef __cplusplus
extern "C"
#endif
    epx_status
    epxi_dispatch_check_spec(const epx_dispatch_spec *s, const char *memory, epx_error *err);

/* Philox-4x32-10 (Salmon et al., SC'11), the Random123 constants. */
#define EPXI_PHILOX_M0 0xD2511F53u
#define EPXI_PHILOX_M1 0xCD9E8D57u
#define EPXI_PHILOX_W0 0x9E3779B9u
#define EPXI_PHILOX_W1 0xBB67AE85u

EPXI_HD void epxi_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += EPXI_PHILOX_W0;
            k1 += EPXI_PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)EPXI_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)EPXI_PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The dispatch word of (seed, pass, layer, token, k): counter (token, k,
 * layer, pass), key (seed low, seed high), first output word. */
EPXI_HD uint32_t epxi_dispatch_word(uint64_t seed, uint32_t pass, uint32_t layer, uint32_t token,
                                    uint32_t k) {
    uint32_t ctr[4] = {token, k, layer, pass};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t out[4];
    epxi_philox4x32_10(ctr, key, out);
    return out[0];
}

/* Uniform replica index in [0, n) from a word: the high half of word * n
 * (bias below n / 2^32, far under any measurable load difference). */
EPXI_HD int32_t epxi_uniform_index(uint32_t word, int32_t n) {
    return (int32_t)(((uint64_t)word * (uint32_t)n) >> 32);
}

/* Weighted replica index: the first j < n - 1 with word < thr[j], else n - 1. */
EPXI_HD int32_t epxi_weighted_index(uint32_t word, const uint32_t *thr, int32_t n) {
    int32_t j = 0;
    while (j < n - 1 && word >= thr[j]) j++;
    return j;
}

#endif /* EPX_DISPATCH_COMMON_H */
