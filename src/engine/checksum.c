/*
 * checksum.c - the 64-bit sum a migration checks every received expert
 * against.
 *
 * Four independent lanes each take one 8-byte word of every 32-byte stripe
 * (multiply by an odd constant, rotate, multiply), so the CPU overlaps the
 * multiplications and the loop runs near memory speed; the lanes, the tail
 * and the length are then folded and avalanched. It is not cryptographic:
 * it catches truncated, misrouted and corrupted transfers, which is what
 * a migration has to rule out before it commits. Words are read
 * little-endian so every host computes the same sum for the same bytes.
 */
#include "migrate_internal.h"

#include <string.h>

#define K1 0x9E3779B185EBCA87ull
#define K2 0xC2B2AE3D27D4EB4Full
#define K3 0x165667B19E3779F9ull
#define K4 0x85EBCA77C2B2AE63ull

static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t read64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint64_t lane(uint64_t acc, uint64_t word) { return rotl(acc + word * K2, 31) * K1; }

static inline uint64_t fold(uint64_t h, uint64_t acc) {
    h ^= lane(0, acc);
    return h * K1 + K4;
}

uint64_t epx_checksum64(const void *data, size_t bytes, uint64_t seed) {
    const unsigned char *p = data, *end = p + bytes;
    uint64_t h;
    if (bytes >= 32) {
        uint64_t a = seed + K1 + K2, b = seed + K2, c = seed, d = seed - K1;
        for (; end - p >= 32; p += 32) {
            a = lane(a, read64(p));
            b = lane(b, read64(p + 8));
            c = lane(c, read64(p + 16));
            d = lane(d, read64(p + 24));
        }
        h = rotl(a, 1) + rotl(b, 7) + rotl(c, 12) + rotl(d, 18);
        h = fold(h, a);
        h = fold(h, b);
        h = fold(h, c);
        h = fold(h, d);
    } else {
        h = seed + K3;
    }
    h += (uint64_t)bytes;
    for (; end - p >= 8; p += 8) h = rotl(h ^ lane(0, read64(p)), 27) * K1 + K4;
    for (; p < end; p++) h = rotl(h ^ (*p * K3), 11) * K1;
    h ^= h >> 33;
    h *= K2;
    h ^= h >> 29;
    h *= K3;
    h ^= h >> 32;
    return h;
}
