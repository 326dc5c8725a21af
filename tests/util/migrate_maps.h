/*
 * migrate_maps.h - random placements for the migration tests
 * (test_migrate_plan.c, test_migrate_exec.c), and the targets a plan made
 * around failed GPUs gives: every expert keeps a replica on a live GPU.
 */
#ifndef EPX_TEST_MIGRATE_MAPS_H
#define EPX_TEST_MIGRATE_MAPS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "testutil.h"

/* A random valid map [L][P]: every expert once, the rest random, shuffled. */
static inline int32_t *mm_random_map(tu_rng *r, const epx_shape *s) {
    const int32_t L = s->num_layers, P = s->num_physical_experts, E = s->num_logical_experts;
    int32_t *m = malloc(sizeof *m * (size_t)L * (size_t)P);
    for (int32_t l = 0; l < L; l++) {
        int32_t *row = m + (size_t)l * P;
        for (int32_t p = 0; p < P; p++) row[p] = p < E ? p : (int32_t)tu_below(r, (uint32_t)E);
        for (int32_t p = P - 1; p > 0; p--) {
            int32_t q = (int32_t)tu_below(r, (uint32_t)p + 1), t = row[p];
            row[p] = row[q];
            row[q] = t;
        }
    }
    return m;
}

/* Replicas of expert e in layer row that are on no failed GPU. */
static inline int32_t mm_live_count(const epx_shape *s, const int32_t *row, const uint8_t *failed,
                                    int32_t e) {
    const int32_t spg = s->num_physical_experts / s->num_gpus;
    int32_t n = 0;
    for (int32_t p = 0; p < s->num_physical_experts; p++) n += row[p] == e && !failed[p / spg];
    return n;
}

/* What a plan made with failed_gpus gives: every expert of target b keeps a
 * replica off the failed GPUs (one held only there takes the first live
 * slot of an expert with two live ones). False when that cannot be done. */
static inline bool mm_keep_live(const epx_shape *s, int32_t *b, const uint8_t *failed) {
    const int32_t P = s->num_physical_experts, spg = P / s->num_gpus;
    for (int32_t l = 0; l < s->num_layers; l++) {
        int32_t *row = b + (size_t)l * P;
        for (int32_t e = 0; e < s->num_logical_experts; e++) {
            if (mm_live_count(s, row, failed, e) > 0) continue;
            int32_t p = 0;
            while (p < P && (failed[p / spg] || mm_live_count(s, row, failed, row[p]) < 2)) p++;
            if (p == P) return false;
            row[p] = e;
        }
    }
    return true;
}

/* Whether some expert of target b has no replica off the failed GPUs. */
static inline bool mm_loses_an_expert(const epx_shape *s, const int32_t *b, const uint8_t *failed) {
    for (int32_t l = 0; l < s->num_layers; l++)
        for (int32_t e = 0; e < s->num_logical_experts; e++)
            if (mm_live_count(s, b + (size_t)l * s->num_physical_experts, failed, e) == 0)
                return true;
    return false;
}

#endif
