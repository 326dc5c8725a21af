/*
 * relabel.c - put a new layout's experts into the slots that already hold
 * them.
 *
 * A placement algorithm decides which experts each GPU holds; the order of
 * the slots inside a GPU is arbitrary (DeepSeek's EPLB emits them sorted by
 * its packing, not by where they sat before). Reordering them inside a GPU
 * changes no GPU's load and so no balance, but every slot that ends up
 * holding the expert it held before is a slot whose weights need not move.
 *
 * Finding the best order is an assignment problem per GPU: a maximum
 * matching between old slots and new entries, an edge wherever the expert is
 * the same. Because edges join only equal labels the graph splits into one
 * complete bipartite part per expert, and the maximum is
 * sum_e min(old count of e, new count of e): sorting both sides by expert
 * and walking them together attains it. tests/test_migrate_plan.c checks it
 * against augmenting-path matching (Kuhn's algorithm) on random layouts.
 */
#include "constrain.h"

#include <string.h>

typedef struct {
    int32_t expert;
    int32_t slot; /* local index on the GPU */
} tagged;

static int tagged_cmp(const void *a, const void *b) {
    const tagged *x = a, *y = b;
    if (x->expert != y->expert) return x->expert < y->expert ? -1 : 1;
    return (x->slot > y->slot) - (x->slot < y->slot);
}

/* One GPU: spg old and new entries; writes out[spg] and perm[spg] (local
 * indices). taken[spg] marks old slots already given their expert. */
static void relabel_gpu(size_t n, const int32_t *old, const int32_t *neu, int32_t *out,
                        int32_t *perm, tagged *a, tagged *b, uint8_t *taken, uint8_t *placed) {
    const int32_t spg = (int32_t)n;
    for (int32_t i = 0; i < spg; i++) {
        a[i] = (tagged){old[i], i};
        b[i] = (tagged){neu[i], i};
    }
    qsort(a, n, sizeof *a, tagged_cmp);
    qsort(b, n, sizeof *b, tagged_cmp);
    memset(taken, 0, n);
    memset(placed, 0, n);
    /* Walk both sorted lists: equal experts pair up, lowest old slot first. */
    for (int32_t i = 0, j = 0; i < spg && j < spg;) {
        if (a[i].expert < b[j].expert) {
            i++;
        } else if (a[i].expert > b[j].expert) {
            j++;
        } else {
            out[a[i].slot] = b[j].expert;
            perm[a[i].slot] = b[j].slot;
            taken[a[i].slot] = 1;
            placed[b[j].slot] = 1;
            i++, j++;
        }
    }
    /* The unmatched new entries, in their original order, fill the free slots
     * in ascending order. */
    int32_t free_slot = 0;
    for (int32_t j = 0; j < spg; j++) {
        if (placed[j]) continue;
        while (taken[free_slot]) free_slot++;
        out[free_slot] = neu[j];
        perm[free_slot] = j;
        taken[free_slot] = 1;
    }
}

epx_status epxi_relabel_map(const epx_shape *shape, const int32_t *old, int32_t *map, int32_t *perm,
                            epx_error *err) {
    const int32_t P = shape->num_physical_experts, G = shape->num_gpus;
    const int32_t spg = P / G;
    const size_t n = (size_t)(uint32_t)spg; /* spg >= 1 for a valid shape */
    epx_status st = EPX_OK;
    tagged *a = epxi_calloc(2 * n, sizeof *a, "relabel scratch", err);
    int32_t *tmp = a ? epxi_calloc(2 * n, sizeof *tmp, "relabel scratch", err) : NULL;
    uint8_t *marks = tmp ? epxi_calloc(2, n, "relabel scratch", err) : NULL;
    if (marks == NULL) {
        st = EPX_ERR_NOMEM;
        goto done;
    }
    for (int32_t l = 0; l < shape->num_layers; l++) {
        for (int32_t g = 0; g < G; g++) {
            size_t o = (size_t)l * (size_t)P + (size_t)g * n;
            int32_t *out = tmp, *lperm = tmp + n;
            relabel_gpu(n, old + o, map + o, out, lperm, a, a + n, marks, marks + n);
            memcpy(map + o, out, n * sizeof *out);
            if (perm != NULL)
                for (size_t i = 0; i < n; i++) perm[o + i] = (int32_t)((size_t)g * n) + lperm[i];
        }
    }
done:
    free(a);
    free(tmp);
    free(marks);
    return st;
}

epx_status epxi_count_live(const epx_shape *shape, const uint8_t *failed, int32_t *num_live,
                           epx_error *err) {
    int32_t live = shape->num_gpus;
    if (failed != NULL)
        for (int32_t g = 0; g < shape->num_gpus; g++) live -= failed[g] != 0;
    if (live == 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "all %d GPUs are marked failed: at least one must survive to hold the "
                         "experts",
                         shape->num_gpus);
    *num_live = live;
    return EPX_OK;
}

double epxi_layer_balance(const epx_shape *shape, const int32_t *row, const double *load,
                          const uint8_t *failed, double *scratch) {
    const int32_t G = shape->num_gpus;
    double *gpu = scratch;
    int32_t *cnt = (int32_t *)(scratch + G); /* E ints fit in E doubles */
    (void)epxi_layer_gpu_loads(row, load, NULL, NULL, failed, shape->num_logical_experts,
                               shape->num_physical_experts, G, cnt, gpu);
    const epxi_gpu_summary s = epxi_gpu_summarize(gpu, G, failed);
    return epxi_balancedness(&s);
}
