/*
 * balanced_internal.h - the balancer handle of epx/dispatch.h part 4,
 * shared by the solver (balanced.c) and the token routing
 * (balanced_route.c). Internal to the dispatch room.
 */
#ifndef EPX_DISPATCH_BALANCED_INTERNAL_H
#define EPX_DISPATCH_BALANCED_INTERNAL_H

#include "internal.h"
#include "maxflow.h"

#define BAL_MAX_TOTAL ((int64_t)1 << 40)
#define BAL_INF ((int64_t)1 << 62)

struct epx_balancer {
    int32_t E, W, P, G, per, D; /* D = min(W, G): distinct GPUs of an expert */
    epxi_flow flow;
    uint8_t *mark;            /* [nodes] reaches the sink */
    uint8_t *in_s;            /* [E] in the candidate set S */
    uint8_t *g_in;            /* [G] in N(S) */
    uint8_t *g_graph;         /* [G] in the current graph */
    int32_t *owner;           /* [P] the expert listing a slot */
    int32_t *eg_gpu;          /* [E][D] an expert's GPUs, ascending */
    int32_t *eg_mult;         /* [E][D] its replicas on each */
    int32_t *eg_n;            /* [E] how many GPUs */
    int32_t *eg_edge;         /* [E][D] edge in the current graph, -1 none */
    int32_t *seen;            /* [D] columns met per GPU, while writing outputs */
    int64_t *eg_flow;         /* [E][D] x_eg times its level's denominator */
    int64_t *eg_int;          /* [E][D] rounded */
    int32_t *e_level;         /* [E] its level; -1 not yet; -2 no tokens */
    int32_t *g_level;         /* [G] */
    int64_t *lv_num, *lv_den; /* [G] level loads num / den, not reduced */
    int64_t *gex;             /* [G] lower-bound excess while rounding */
    int64_t *cnt;             /* [E] counts for epx_dispatch_balanced_topk */
    int64_t *rc;              /* [E][W] replica counts for epx_dispatch_balanced_topk */
    int64_t *left;            /* [E] routing: tokens left in the current column */
    int32_t *col;             /* [E] routing: the current column */
};

#endif /* EPX_DISPATCH_BALANCED_INTERNAL_H */
