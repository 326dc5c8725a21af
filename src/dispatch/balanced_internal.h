/*
 * balanced_internal.h - the balancer handle of epx/dispatch.h part 4,
 * shared by the solver (balanced.c) and the token routing
 * (balanced_route.c). Internal to the dispatch room.
 */
#ifndef EPX_DISPATCH_BALANCED_INTERNAL_H
#define EPX_DISPATCH_BALANCED_INTERNAL_H

#include "balanced_solve.h"
#include "internal.h"

#define BAL_MAX_TOTAL EPXI_BAL_MAX_TOTAL

struct epx_balancer {
    int32_t E, W, P, G, per;
    epxi_bal core;  /* the solver's workspace (balanced_core.h), in mem */
    void *mem;      /* one block for core's arrays */
    int32_t *owner; /* [P] the expert listing a slot, while checking */
    int64_t *cnt;   /* [E] counts for epx_dispatch_balanced_topk */
    int64_t *rc;    /* [E][W] replica counts for epx_dispatch_balanced_topk */
    int64_t *left;  /* [E] routing: tokens left in the current column */
    int32_t *col;   /* [E] routing: the current column */
};

#endif /* EPX_DISPATCH_BALANCED_INTERNAL_H */
