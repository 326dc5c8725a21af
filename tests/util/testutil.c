/* testutil.c - shared test helpers; see testutil.h. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *tu_shared_dir(void) {
    static char path[4096];
    const char *env = getenv("EPX_SHARED");
    if (env == NULL) env = "../../shared";
    snprintf(path, sizeof path, "%s", env);
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/golden/README.md", path);
    if (access(probe, R_OK) != 0) {
        fprintf(stderr, "note: shared/ not found at %s; tests that need it are skipped\n", path);
        return NULL;
    }
    return path;
}

char *tu_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf == NULL || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[n] = '\0';
    if (len) *len = (size_t)n;
    return buf;
}

uint64_t tu_seed(uint64_t fallback) {
    const char *env = getenv("EPX_TEST_SEED");
    uint64_t s = env ? strtoull(env, NULL, 0) : fallback;
    fprintf(stderr, "test seed: %llu (set EPX_TEST_SEED to reproduce)\n", (unsigned long long)s);
    return s;
}

uint64_t tu_next(tu_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint32_t tu_below(tu_rng *r, uint32_t n) { return (uint32_t)(tu_next(r) % n); }
double tu_uniform(tu_rng *r) { return (double)(tu_next(r) >> 11) * 0x1.0p-53; }

void tu_assert_msg_has(const char *msg, ...) {
    va_list ap;
    va_start(ap, msg);
    const char *needle;
    while ((needle = va_arg(ap, const char *)) != NULL) {
        if (strstr(msg, needle) == NULL) {
            va_end(ap);
            fail_msg("message \"%s\" does not contain \"%s\"", msg, needle);
        }
    }
    va_end(ap);
}

char *tu_tmp_path(const char *suffix) {
    static int counter;
    char *p = malloc(256);
    snprintf(p, 256, "/tmp/epx-test-%d-%d%s", (int)getpid(), counter++, suffix);
    return p;
}

epx_layout *tu_random_layout(tu_rng *r, int32_t L, int32_t E, int32_t P, int32_t G, int32_t N,
                             int32_t hot) {
    if (hot <= 0 || hot > E) hot = E;
    int32_t *map = malloc(sizeof(int32_t) * (size_t)L * (size_t)P);
    assert_non_null(map);
    for (int32_t l = 0; l < L; l++) {
        int32_t *m = map + (size_t)l * (size_t)P;
        for (int32_t p = 0; p < P; p++) m[p] = p < E ? p : (int32_t)tu_below(r, (uint32_t)hot);
        for (int32_t p = P - 1; p > 0; p--) {
            int32_t q = (int32_t)tu_below(r, (uint32_t)p + 1), t = m[p];
            m[p] = m[q];
            m[q] = t;
        }
    }
    epx_shape s = {L, E, P, G, N};
    epx_layout *lay = NULL;
    epx_error err = {0};
    if (epx_layout_create_from_map(&s, map, &lay, &err) != EPX_OK)
        fail_msg("random layout refused: %s", err.msg);
    free(map);
    return lay;
}
