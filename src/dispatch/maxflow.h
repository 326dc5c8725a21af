/*
 * maxflow.h - a small max-flow (Dinic) over int64 capacities, for the
 * balanced dispatch's feasibility tests (balanced.c). Every array is sized
 * once by epxi_flow_init; building and solving a graph allocates nothing.
 * Internal to the dispatch room.
 */
#ifndef EPX_DISPATCH_MAXFLOW_H
#define EPX_DISPATCH_MAXFLOW_H

#include <stdint.h>

#include "internal.h"

typedef struct epxi_flow {
    int32_t max_nodes, max_edges;  /* capacities; edges count both directions */
    int32_t n, m;                  /* nodes and edges of the current graph     */
    int32_t *head;                 /* [max_nodes] first edge out of a node     */
    int32_t *next;                 /* [max_edges] next edge out of its tail    */
    int32_t *to;                   /* [max_edges] head of the edge             */
    int64_t *cap;                  /* [max_edges] residual capacity            */
    int32_t *level, *iter, *queue; /* [max_nodes] Dinic's level graph, arcs, BFS */
} epxi_flow;

/* Size the arrays for graphs of up to max_nodes nodes and max_edges forward
 * edges. Returns EPX_OK or EPX_ERR_NOMEM / EPX_ERR_OVERFLOW. */
EPXI_HIDDEN epx_status epxi_flow_init(epxi_flow *f, int32_t max_nodes, int32_t max_edges,
                                      epx_error *err);
EPXI_HIDDEN void epxi_flow_free(epxi_flow *f);

/* Start an empty graph of n nodes (n <= max_nodes). */
EPXI_HIDDEN void epxi_flow_reset(epxi_flow *f, int32_t n);

/* Add u -> v with capacity cap >= 0; returns the edge's index (its reverse
 * is index ^ 1, whose residual capacity is the flow on the edge). The
 * caller sized the graph: adding beyond max_edges is a bug (returns -1). */
EPXI_HIDDEN int32_t epxi_flow_add(epxi_flow *f, int32_t u, int32_t v, int64_t cap);

/* The flow on forward edge e (its reverse edge's residual). */
static inline int64_t epxi_flow_on(const epxi_flow *f, int32_t e) { return f->cap[e ^ 1]; }

/* Push a maximum flow from s to t (adding to any flow already there);
 * returns the amount pushed by this call. */
EPXI_HIDDEN int64_t epxi_flow_max(epxi_flow *f, int32_t s, int32_t t);

/* mark[v] = 1 for every node that can reach t through edges with residual
 * capacity, else 0. */
EPXI_HIDDEN void epxi_flow_reaches(epxi_flow *f, int32_t t, uint8_t *mark);

#endif /* EPX_DISPATCH_MAXFLOW_H */
