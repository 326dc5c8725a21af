/*
 * maxflow.c - Dinic's algorithm (BFS level graph, blocking flow by DFS with
 * current-arc pointers) on int64 capacities. O(V^2 E) whatever the
 * capacities are; the graphs here have E + G + 4 nodes. Deterministic: edges
 * are tried in the reverse order of their addition (head-inserted lists).
 */
#include "maxflow.h"

#include <stdlib.h>

epx_status epxi_flow_init(epxi_flow *f, int32_t max_nodes, int32_t max_edges, epx_error *err) {
    *f = (epxi_flow){0};
    if (max_nodes < 1 || max_edges < 0 || max_edges > INT32_MAX / 2)
        return epxi_fail(err, EPX_ERR_OVERFLOW,
                         "max-flow graph of %d nodes and %d edges is too big", max_nodes,
                         max_edges);
    f->max_nodes = max_nodes;
    f->max_edges = 2 * max_edges;
    size_t n = (size_t)max_nodes, m = (size_t)f->max_edges + 1;
    f->head = epxi_calloc(n, sizeof *f->head, "max-flow heads", err);
    f->level = epxi_calloc(n, sizeof *f->level, "max-flow levels", err);
    f->iter = epxi_calloc(n, sizeof *f->iter, "max-flow arcs", err);
    f->queue = epxi_calloc(n, sizeof *f->queue, "max-flow queue", err);
    f->next = epxi_calloc(m, sizeof *f->next, "max-flow edges", err);
    f->to = epxi_calloc(m, sizeof *f->to, "max-flow edges", err);
    f->cap = epxi_calloc(m, sizeof *f->cap, "max-flow capacities", err);
    if (!f->head || !f->level || !f->iter || !f->queue || !f->next || !f->to || !f->cap) {
        epxi_flow_free(f);
        return EPX_ERR_NOMEM;
    }
    return EPX_OK;
}

void epxi_flow_free(epxi_flow *f) {
    free(f->head);
    free(f->level);
    free(f->iter);
    free(f->queue);
    free(f->next);
    free(f->to);
    free(f->cap);
    *f = (epxi_flow){0};
}

void epxi_flow_reset(epxi_flow *f, int32_t n) {
    f->n = n;
    f->m = 0;
    for (int32_t v = 0; v < n; v++) f->head[v] = -1;
}

int32_t epxi_flow_add(epxi_flow *f, int32_t u, int32_t v, int64_t cap) {
    if (f->m + 2 > f->max_edges) return -1;
    int32_t e = f->m;
    f->to[e] = v;
    f->cap[e] = cap;
    f->next[e] = f->head[u];
    f->head[u] = e;
    f->to[e + 1] = u;
    f->cap[e + 1] = 0;
    f->next[e + 1] = f->head[v];
    f->head[v] = e + 1;
    f->m += 2;
    return e;
}

static int bfs(epxi_flow *f, int32_t s, int32_t t) {
    for (int32_t v = 0; v < f->n; v++) f->level[v] = -1;
    int32_t qh = 0, qt = 0;
    f->level[s] = 0;
    f->queue[qt++] = s;
    while (qh < qt) {
        int32_t u = f->queue[qh++];
        for (int32_t e = f->head[u]; e >= 0; e = f->next[e]) {
            int32_t v = f->to[e];
            if (f->cap[e] > 0 && f->level[v] < 0) {
                f->level[v] = f->level[u] + 1;
                f->queue[qt++] = v;
            }
        }
    }
    return f->level[t] >= 0;
}

/* Depth is the BFS distance to t. In balanced.c's bipartite graphs a
 * shortest path visits each GPU at most once, so it stays below 2 G + 4
 * (G <= 4096 there). */
static int64_t dfs(epxi_flow *f, int32_t u, int32_t t, int64_t limit) {
    if (u == t) return limit;
    for (int32_t *e = &f->iter[u]; *e >= 0; *e = f->next[*e]) {
        int32_t v = f->to[*e];
        if (f->cap[*e] <= 0 || f->level[v] != f->level[u] + 1) continue;
        int64_t d = dfs(f, v, t, limit < f->cap[*e] ? limit : f->cap[*e]);
        if (d > 0) {
            f->cap[*e] -= d;
            f->cap[*e ^ 1] += d;
            return d;
        }
    }
    return 0;
}

int64_t epxi_flow_max(epxi_flow *f, int32_t s, int32_t t) {
    int64_t total = 0;
    while (bfs(f, s, t)) {
        for (int32_t v = 0; v < f->n; v++) f->iter[v] = f->head[v];
        int64_t d;
        while ((d = dfs(f, s, t, INT64_MAX)) > 0) total += d;
    }
    return total;
}

void epxi_flow_reaches(epxi_flow *f, int32_t t, uint8_t *mark) {
    for (int32_t v = 0; v < f->n; v++) mark[v] = 0;
    int32_t qh = 0, qt = 0;
    mark[t] = 1;
    f->queue[qt++] = t;
    while (qh < qt) {
        int32_t v = f->queue[qh++];
        /* edge e = v -> w; its reverse e ^ 1 = w -> v has residual cap[e ^ 1] */
        for (int32_t e = f->head[v]; e >= 0; e = f->next[e]) {
            int32_t w = f->to[e];
            if (!mark[w] && f->cap[e ^ 1] > 0) {
                mark[w] = 1;
                f->queue[qt++] = w;
            }
        }
    }
}
