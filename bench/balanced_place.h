/*
 * balanced_place.h - the balanced-dispatch benchmarks' synthetic layers
 * (bench/balanced.cu on the GPU, bench/balanced_shapes.c on the CPU): the
 * same seeded generator, placements and batches, so both time the same
 * work. Static functions, C and CUDA C++ alike.
 */
#ifndef EPX_BENCH_BALANCED_PLACE_H
#define EPX_BENCH_BALANCED_PLACE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 27011ull;
static uint64_t next64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static int32_t below(int32_t n) { return (int32_t)(next64() % (uint64_t)n); }
static double unif(void) { return (double)(next64() >> 11) / 9007199254740992.0; }

/* Replicas [E][W] of a placement: every expert one slot, the extra slots
 * to hot experts (the first 2 (P - E) by the batches' skew). nodes = 1:
 * slots shuffled over all GPUs, so an expert's replicas land anywhere.
 * nodes > 1: as DeepSeek's hierarchical EPLB keeps them, every replica of
 * an expert on one node (expert e on node e % nodes, slots shuffled within
 * the node), so no component of the routing graph spans two nodes. */
static void make_place(int32_t E, int32_t P, int32_t W, int32_t nodes, int32_t *rep, int32_t *nv) {
    int32_t *p2l = (int32_t *)malloc(sizeof(int32_t) * (size_t)P);
    int32_t hot = 2 * (P - E) < E ? 2 * (P - E) : E, per_node = P / nodes;
    int32_t *fill = (int32_t *)calloc((size_t)nodes, sizeof(int32_t));
    for (int32_t e = 0; e < E; e++) { /* one slot each, on its node */
        int32_t nd = e % nodes;
        p2l[nd * per_node + fill[nd]++] = e;
    }
    for (int32_t nd = 0; nd < nodes; nd++)
        while (fill[nd] < per_node) { /* the node's extras: its own hot experts */
            int32_t h = below(hot > nodes ? hot / nodes : 1) * nodes + nd;
            p2l[nd * per_node + fill[nd]++] = h < E ? h : nd;
        }
    for (int32_t nd = 0; nd < nodes; nd++)
        for (int32_t s = per_node - 1; s > 0; s--) {
            int32_t j = below(s + 1), t = p2l[nd * per_node + s];
            p2l[nd * per_node + s] = p2l[nd * per_node + j];
            p2l[nd * per_node + j] = t;
        }
    free(fill);
    for (int32_t i = 0; i < E * W; i++) rep[i] = -1;
    memset(nv, 0, sizeof(int32_t) * (size_t)E);
    for (int32_t s = 0; s < P; s++) rep[p2l[s] * W + nv[p2l[s]]++] = s;
    free(p2l);
}

/* The table narrowed to the placement's own width, the most replicas any
 * expert has (SGLang pads logical_to_all_physical_map to that, not to
 * P - E + 1): rows repacked in place; returns the new width. Inline: the
 * CPU benchmark does not narrow. */
static inline int32_t narrow_place(int32_t E, int32_t W, int32_t *rep, const int32_t *nv) {
    int32_t w = 1;
    for (int32_t e = 0; e < E; e++) w = nv[e] > w ? nv[e] : w;
    for (int32_t e = 0; e < E; e++)
        for (int32_t j = 0; j < w; j++) rep[e * w + j] = rep[e * W + j];
    return w;
}

/* The benchmarks' layers: Kimi-K2.5 on 8 GPUs, DeepSeek-V3 on 32 with its
 * replicas on any GPU, and on one of 4 nodes (hierarchical EPLB's way). */
static const struct bal_shape {
    const char *name;
    int32_t E, P, G, nodes;
} bal_shapes[] = {{"kimi-k2.5", 384, 416, 8, 1},
                  {"deepseek-v3", 256, 288, 32, 1},
                  {"ds-v3-node", 256, 288, 32, 4}};
enum { BAL_SHAPES = sizeof bal_shapes / sizeof bal_shapes[0] };

#endif
