/*
 * testutil.h - what every epx test shares: cmocka, the path to shared/
 * (EPX_SHARED, set by CTest), a seeded generator whose seed is printed on
 * failure, and a check that an error message names what it must.
 */
#ifndef EPX_TESTUTIL_H
#define EPX_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka.h needs the includes above first. */
#include <cmocka.h>

#include "epx.h"

/* The folder ../shared, or NULL (with a message) when it is not present. */
const char *tu_shared_dir(void);

/* Read a whole file; NULL when missing. Caller frees. */
char *tu_read_file(const char *path, size_t *len);

/* A small seeded generator (splitmix64) for random test inputs. The seed is
 * taken from EPX_TEST_SEED when set, else the given default; it is printed
 * by tu_seed_report() when a test fails. */
typedef struct tu_rng {
    uint64_t s;
} tu_rng;
uint64_t tu_seed(uint64_t fallback);
uint64_t tu_next(tu_rng *r);
/* Uniform integer in [0, n). */
uint32_t tu_below(tu_rng *r, uint32_t n);
double tu_uniform(tu_rng *r);

/* A random valid layout of shape {L, E, P, G, N}: every expert once, the
 * P - E redundant slots drawn from the first `hot` experts (all E when
 * hot <= 0 or hot > E, so skew is the caller's choice), then each layer's
 * slots shuffled. Fails the test if the layout is refused. */
epx_layout *tu_random_layout(tu_rng *r, int32_t L, int32_t E, int32_t P, int32_t G, int32_t N,
                             int32_t hot);

/* Assert that `msg` contains every NULL-terminated needle (printing msg). */
void tu_assert_msg_has(const char *msg, ...);
#define TU_MSG_HAS(msg, ...) tu_assert_msg_has((msg), __VA_ARGS__, (const char *)NULL)

/* A fresh temporary file path under /tmp (caller frees). */
char *tu_tmp_path(const char *suffix);

#endif
