/*
 * epx/metrics.h - how well a placement balances a load: the GPU loads it
 * implies, balancedness as shared/DESIGN.md defines it (and SGLang's own
 * variant, named as such), the lower bound on the max GPU load that no
 * placement of the same shape can beat, and the gap between the two.
 * Include epx.h, not this file.
 *
 * Definitions used throughout (per layer, load w[e] >= 0 of each logical
 * expert, G GPUs, P slots):
 *  - GPU load: the sum over the GPU's slots of the load its replica takes.
 *    Without replica weights an expert's load splits evenly over its
 *    replicas (w[e] / replicas); with them, slot p takes w[e] * weight[p].
 *  - mean GPU load = (sum of the G GPU loads) / G; max GPU load = the largest.
 *  - balancedness = mean / max, in (0, 1], 1 is perfect; 1 for a layer that
 *    carries no load. The figure for a placement is the mean over the layers
 *    that carry load (dense layers and unused ones do not dilute it); 1 when
 *    no layer does.
 *  - SGLang's balancedness (its compute_utilization_rate): per layer
 *    (mean + 1e-5) / (max + 1e-5), averaged over ALL layers, dense ones
 *    included. SGLang evaluates it in float32; here it is double, so figures
 *    agree to float32 precision.
 *  - optimal max per-replica load: the least value of max_e w[e] / c[e] over
 *    replica counts c[e] >= 1 with sum c[e] = P. Giving each further slot to
 *    the expert with the largest w[e] / c[e] (DeepSeek's replica step)
 *    attains it; computed exactly that way, in double.
 *  - bound on the max GPU load = max(mean GPU load, optimal max per-replica
 *    load): every placement has a GPU at least as loaded as the mean, and a
 *    GPU holding the heaviest replica, which carries at least w[e] / c[e]
 *    however the expert's tokens are split.
 *  - bound (as a balancedness) = mean / bound on the max: the best
 *    balancedness any placement of this shape can reach on this load.
 *  - gap = bound - balancedness (both means over the loaded layers), >= 0:
 *    what a better placement could still win.
 */
#ifndef EPX_METRICS_H
#define EPX_METRICS_H

/* The balance of one layer. */
typedef struct epx_layer_balance {
    double total;               /* sum of the layer's loads                          */
    double mean_gpu_load;       /* sum of GPU loads / G                              */
    double max_gpu_load;        /* the largest GPU load                              */
    int32_t max_gpu;            /* the GPU carrying it (lowest id on ties)           */
    int32_t loaded;             /* 1 when the layer carries load (total > 0)         */
    double balancedness;        /* mean / max; 1 when not loaded                     */
    double balancedness_sglang; /* (mean + 1e-5) / (max + 1e-5)                      */
    double max_per_replica_opt; /* optimal max per-replica load for P slots          */
    double bound_max_load;      /* max(mean, max_per_replica_opt)                    */
    double bound;               /* mean / bound_max_load; 1 when not loaded          */
} epx_layer_balance;

/* The balance of a placement over all layers. */
typedef struct epx_balance {
    double balancedness;        /* mean over loaded layers; 1 when none is loaded    */
    double balancedness_sglang; /* SGLang's: mean over all layers                    */
    double bound;               /* mean of the per-layer bound over loaded layers    */
    double gap;                 /* bound - balancedness, >= 0                        */
    int32_t num_loaded_layers;  /* layers with load                                  */
    int32_t worst_layer;        /* loaded layer of lowest balancedness; -1 when none */
} epx_balance;

/*
 * GPU loads of every layer.
 * Args:    layout (in) the placement; load (in) [L][E] double, finite, >= 0;
 *          replica_weights (in, may be NULL) [L][P] shares of each slot (the
 *          shares of one expert's replicas sum to 1, as epx_plan_replica_weights
 *          gives them); NULL = split evenly over replicas;
 *          gpu_load (out) [L][G] double, caller-owned.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (NULL, a negative or non-finite load,
 *          shares that are negative or do not sum to 1 within 1e-6; the
 *          message names layer and expert).
 * Thread:  any thread; allocates nothing.
 */
EPX_API epx_status epx_gpu_loads(const epx_layout *layout, const double *load,
                                 const double *replica_weights, double *gpu_load, epx_error *err);

/*
 * Balancedness of GPU loads already computed (by epx_gpu_loads, or a
 * dispatch table's epx_dispatch_table_gpu_load): the mean over layers with
 * load of mean GPU load / max GPU load, by the same arithmetic as
 * epx_balance_compute.
 * Args:    gpu_load (in) [L][G] double, >= 0; num_layers L >= 1;
 *          num_gpus G >= 1; balancedness (out) 1.0 when no layer has load;
 *          num_loaded (out, may be NULL) the layers with load.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (NULL); EPX_ERR_SHAPE (L or G < 1).
 * Thread:  any thread; allocates nothing.
 */
EPX_API epx_status epx_gpu_loads_balance(const double *gpu_load, int32_t num_layers,
                                         int32_t num_gpus, double *balancedness,
                                         int32_t *num_loaded, epx_error *err);

/*
 * Balancedness, bound and gap of a placement for a load (definitions above).
 * Args:    layout (in); load (in) [L][E]; replica_weights (in, may be NULL)
 *          as for epx_gpu_loads; out (out) the summary;
 *          layers (out, may be NULL) [L] per-layer figures, caller-owned.
 * Returns: as epx_gpu_loads, plus EPX_ERR_NOMEM.
 * Thread:  any thread; one allocation of scratch per call.
 */
EPX_API epx_status epx_balance_compute(const epx_layout *layout, const double *load,
                                       const double *replica_weights, epx_balance *out,
                                       epx_layer_balance *layers, epx_error *err);

/*
 * The bound for one layer's load, without a placement.
 * Args:    load (in) [E] double, finite, >= 0; num_experts E; num_physical P
 *          (>= E); num_gpus G (P % G == 0);
 *          bound_max_load (out, may be NULL) max(mean GPU load, optimal max
 *          per-replica load); max_per_replica (out, may be NULL) the latter;
 *          replicas (out, may be NULL) [E] replica counts attaining it
 *          (ties to the lowest expert id, as DeepSeek's replica step).
 * Returns: EPX_OK; EPX_ERR_SHAPE; EPX_ERR_INVALID_ARG; EPX_ERR_NOMEM.
 * Thread:  any thread.
 */
EPX_API epx_status epx_bound_max_load(const double *load, int32_t num_experts, int32_t num_physical,
                                      int32_t num_gpus, double *bound_max_load,
                                      double *max_per_replica, int32_t *replicas, epx_error *err);

#endif /* EPX_METRICS_H */
