/*
 * test_numeric.c - src/core/numeric.h's division by a fixed divisor against
 * C's own, on every divisor up to 2^12, powers of two and their neighbours,
 * the largest divisors, and random ones (seeded, the seed printed on a
 * failure); for each, the numerators where a quotient changes (k * d - 1,
 * k * d), the ends (0, 2^31 - 1) and random ones.
 */
#include <stdio.h>

#include "testutil.h"
#include "../src/core/numeric.h"

static int check_divisor(tu_rng *r, int32_t d) {
    const epxi_divisor_t v = epxi_divisor(d);
    int32_t probe[40];
    int np = 0;
    probe[np++] = 0;
    probe[np++] = 1;
    probe[np++] = INT32_MAX;
    probe[np++] = INT32_MAX - 1;
    const int32_t top = INT32_MAX / d; /* the largest quotient */
    const int32_t ks[] = {1, 2, 3, top / 2, top - 1, top};
    for (int i = 0; i < 6; i++) {
        const int64_t at = (int64_t)ks[i] * d;
        if (ks[i] < 1 || at > INT32_MAX) continue;
        probe[np++] = (int32_t)at;
        probe[np++] = (int32_t)(at - 1);
    }
    for (int i = 0; i < 20; i++) probe[np++] = (int32_t)tu_below(r, 0x80000000u);
    for (int i = 0; i < np; i++) {
        const int32_t n = probe[i];
        if (epxi_div(n, v) != n / d) {
            fprintf(stderr, "epxi_div(%d, %d) = %d, want %d (m %u, s %u)\n", n, d, epxi_div(n, v),
                    n / d, v.m, v.s);
            return 1;
        }
    }
    return 0;
}

static void divisions_equal_c(void **state) {
    (void)state;
    tu_rng r = {tu_seed(20261205)};
    int bad = 0;
    for (int32_t d = 1; d <= 4096 && !bad; d++) bad |= check_divisor(&r, d);
    for (int b = 1; b < 31 && !bad; b++) {
        const int32_t p = (int32_t)1 << b;
        bad |= check_divisor(&r, p) | check_divisor(&r, p - 1) | check_divisor(&r, p + 1);
    }
    bad |= check_divisor(&r, INT32_MAX) | check_divisor(&r, INT32_MAX - 1);
    for (int i = 0; i < 20000 && !bad; i++)
        bad |= check_divisor(&r, (int32_t)tu_below(&r, 0x7fffffffu) + 1);
    assert_int_equal(bad, 0);
}

/* Every small numerator of the divisors a kernel meets (slots per rank, top-k,
 * destinations per token): all of them, exhaustively. */
static void small_numerators_exhaustive(void **state) {
    (void)state;
    for (int32_t d = 1; d <= 64; d++) {
        const epxi_divisor_t v = epxi_divisor(d);
        for (int32_t n = 0; n < 1 << 20; n++)
            if (epxi_div(n, v) != n / d) {
                fprintf(stderr, "epxi_div(%d, %d) = %d, want %d\n", n, d, epxi_div(n, v), n / d);
                fail();
            }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(divisions_equal_c),
        cmocka_unit_test(small_numerators_exhaustive),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
