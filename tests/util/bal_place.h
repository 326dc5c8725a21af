/*
 * bal_place.h - random placements for the balanced-dispatch tests
 * (test_dispatch_balanced.c, test_balanced_lanes.c) in SGLang's [E][W]
 * replica-list form.
 */
#ifndef EPX_TEST_BAL_PLACE_H
#define EPX_TEST_BAL_PLACE_H

#include <stdint.h>
#include <stdlib.h>

#include "testutil.h"

typedef struct place {
    int32_t E, P, G, W, per;
    int32_t *rep; /* [E][W], -1 past an expert's list */
    int32_t *nv;  /* [E] */
} place;

/* Node by node (nodes divides E and G; 1: the whole layer is one node):
 * each of the node's experts one of its slots, the node's other slots to
 * random experts of the node (two on one GPU allowed; hot > 0: half of
 * them to the node's first `hot` experts, so a few hold several
 * replicas), the node's slots shuffled, then each expert's list in random
 * order. With nodes > 1 every expert's replicas stay on its node, as
 * hierarchical EPLB places them, so components have at most a node's GPUs. */
static inline place bal_random_place(tu_rng *r, int32_t E, int32_t G, int32_t per, int32_t hot,
                                     int32_t nodes) {
    place p = {E, G * per, G, G * per - E + 1, per, NULL, NULL};
    int32_t *p2l = malloc(sizeof(int32_t) * (size_t)p.P);
    const int32_t ne = E / nodes, ns = p.P / nodes;
    for (int32_t n = 0; n < nodes; n++) {
        int32_t *s0 = p2l + (size_t)n * (size_t)ns, e0 = n * ne;
        for (int32_t s = 0; s < ns; s++)
            s0[s] = e0 + (s < ne                           ? s
                          : hot > 0 && tu_below(r, 2) == 0 ? (int32_t)tu_below(r, (uint32_t)hot)
                                                           : (int32_t)tu_below(r, (uint32_t)ne));
        for (int32_t s = ns - 1; s > 0; s--) {
            int32_t j = (int32_t)tu_below(r, (uint32_t)s + 1), t = s0[s];
            s0[s] = s0[j];
            s0[j] = t;
        }
    }
    p.rep = malloc(sizeof(int32_t) * (size_t)E * (size_t)p.W);
    p.nv = calloc((size_t)E, sizeof(int32_t));
    for (int32_t i = 0; i < E * p.W; i++) p.rep[i] = -1;
    for (int32_t s = 0; s < p.P; s++) {
        int32_t e = p2l[s];
        p.rep[e * p.W + p.nv[e]++] = s;
    }
    for (int32_t e = 0; e < E; e++)
        for (int32_t j = p.nv[e] - 1; j > 0; j--) {
            int32_t k = (int32_t)tu_below(r, (uint32_t)j + 1), t = p.rep[e * p.W + j];
            p.rep[e * p.W + j] = p.rep[e * p.W + k];
            p.rep[e * p.W + k] = t;
        }
    free(p2l);
    return p;
}

static inline void bal_free_place(place *p) {
    free(p->rep);
    free(p->nv);
}

/* Skewed counts: some zero, a few heavy (up to 8 scale). */
static inline void bal_random_counts(tu_rng *r, int64_t *c, int32_t E, uint32_t scale) {
    for (int32_t e = 0; e < E; e++) {
        uint32_t k = tu_below(r, 8);
        c[e] = k == 0 ? 0 : k == 7 ? (int64_t)tu_below(r, 8 * scale + 1) : tu_below(r, scale + 1);
    }
}

#endif
