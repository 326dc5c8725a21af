/*
 * table_common.h - what the static dispatch table (static_table.c) and
 * SGLang's per-rank replica lists (rank_lists.c) share, written once: the
 * check of the replica lists both take, and SGLang's "nearest replica"
 * rule. The table takes a rank's nearest replica with no random draw;
 * releases from 0.5.4.post2 cut a mapping's lists to it. The two must
 * agree release for release, or a cut table and its lists drift apart.
 * Internal to libepx; the rule is static inline so the table's per-rank
 * scan stays a loop.
 */
#ifndef EPX_TABLE_COMMON_H
#define EPX_TABLE_COMMON_H

#include "internal.h"

/* Every entry of replicas [L][E][width] is -1 or a slot in [0, P), and
 * every (layer, expert) has at least one slot. Returns EPX_OK or
 * EPX_ERR_INVALID_MAP naming layer, expert and slot. */
EPXI_HIDDEN epx_status epxi_table_check_replicas(const epx_shape *s, const int32_t *replicas,
                                                 int32_t width, epx_error *err);

/* Where the rule looks: slots per GPU and per node, GPUs per node. */
typedef struct epxi_sg_geom {
    epx_sglang_rule rule;
    int32_t per_gpu, per_node, gpus_per_node;
} epxi_sg_geom;

/* The geometry of a shape (P % G == 0 and G % N == 0: epx_shape_check). */
static inline epxi_sg_geom epxi_sg_geom_of(const epx_shape *s, epx_sglang_rule rule) {
    int32_t per = s->num_physical_experts / s->num_gpus, gpn = s->num_gpus / s->num_nodes;
    epxi_sg_geom q = {rule, per, per * gpn, gpn};
    return q;
}

/* The replica rank g takes with no draw, or -1: from 0.5.4.post2 a lone
 * candidate; then the first on g's GPU; from 0.5.3 the first on g's node
 * (from 0.5.16 only when the node holds some, not all, of the candidates).
 * cand[0..n) are slot ids in the order SGLang lists them. */
static inline int32_t epxi_sg_nearest(const epxi_sg_geom *q, int32_t g, const int32_t *cand,
                                      int32_t n) {
    if (q->rule >= EPX_SGLANG_RULE_0_5_4_POST2 && n == 1) return cand[0];
    for (int32_t j = 0; j < n; j++)
        if (cand[j] / q->per_gpu == g) return cand[j];
    if (q->rule == EPX_SGLANG_RULE_0_5_2) return -1;
    int32_t node = g / q->gpus_per_node, first = -1, count = 0;
    for (int32_t j = 0; j < n; j++)
        if (cand[j] / q->per_node == node) {
            if (first < 0) first = cand[j];
            count++;
        }
    if (q->rule == EPX_SGLANG_RULE_0_5_16 && count == n) return -1;
    return first;
}

#endif
