/*
 * epx/plan.h - placement: which logical experts go into which physical slots,
 * with how many replicas, from a load. DeepSeek's EPLB reproduced exactly
 * (global and hierarchical policies, SGLang's auto rule) and epx's own
 * algorithm, the default. Include epx.h, not this file.
 */
#ifndef EPX_PLAN_H
#define EPX_PLAN_H

typedef enum epx_algorithm {
    EPX_ALGO_EPX = 0,                   /* epx's own placement (default)      */
    EPX_ALGO_DEEPSEEK = 1,              /* DeepSeek EPLB, global policy       */
    EPX_ALGO_DEEPSEEK_HIERARCHICAL = 2, /* DeepSeek EPLB, hierarchical policy */
    EPX_ALGO_AUTO = 3,                  /* SGLang's rule: hierarchical when groups % nodes == 0 */
    /* SGLang's other EPLB algorithms, as release sglang_version runs them
     * (NULL: EPX_SGLANG_DEFAULT_VERSION): */
    EPX_ALGO_DEEPSEEK_VEC = 4,                 /* deepseek_vec: on the per-step series      */
    EPX_ALGO_DEEPSEEK_VEC_HIERARCHICAL = 5,    /* deepseek_vec_hierarchical (needs groups)  */
    EPX_ALGO_ELASTICITY_AWARE = 6,             /* elasticity_aware: over the active ranks   */
    EPX_ALGO_ELASTICITY_AWARE_HIERARCHICAL = 7 /* elasticity_aware_hierarchical          */
} epx_algorithm;

/*
 * SGLang's deepseek_vec (EPX_ALGO_DEEPSEEK_VEC[_HIERARCHICAL]) plans on the
 * series, not its sum: each window of the counts is one step (a stat
 * dump's ring rows, or a trace's windows). Each redundant slot goes to the
 * expert that most lowers the sum over steps of the step's largest
 * per-replica load; the slots are then dealt to GPUs by per-replica load
 * in a snake. Reproduced as torch computes it on the CPU in float32 (sums
 * over steps in torch's own order, single-threaded; whole-number counts as
 * SGLang's integer dump, others as a float32 tensor), ties as torch orders
 * them. The release runs the global form on the tensor's device; on a GPU
 * its sums may round apart from these.
 *
 * SGLang's elasticity_aware (EPX_ALGO_ELASTICITY_AWARE[_HIERARCHICAL])
 * takes the active ranks as the complement of failed_gpus (NULL: all
 * active). All active: DeepSeek's EPLB under the release's rule (global or
 * hierarchical). Some failed: the global policy on the active ranks' slots,
 * the k-th active GPU taking the k-th planned GPU's slots; a failed GPU's
 * slots hold expert 0 with replica weight 0 and are in no replica list, as
 * the release leaves them. It takes neither current, max_moves nor
 * move_price (the release plans from scratch).
 */

/* How strictly epx's algorithm keeps an expert's replicas inside the node
 * that holds its group (only meaningful with nodes > 1). */
typedef enum epx_node_local {
    EPX_NODE_LOCAL_DEFAULT = 0, /* relaxed when nodes > 1, else off           */
    EPX_NODE_LOCAL_STRICT = 1,  /* DeepSeek's constraint, better packed        */
    EPX_NODE_LOCAL_RELAXED = 2, /* a budget of cross-node replicas for hot ones */
    EPX_NODE_LOCAL_OFF = 3      /* global placement                             */
} epx_node_local;

/* How epx's algorithm turns [S][L][E] windows into the load it plans for.
 * DeepSeek modes always sum the windows, as SGLang does. */
typedef enum epx_estimate {
    EPX_ESTIMATE_DEFAULT = 0,  /* the back-tested choice, see docs */
    EPX_ESTIMATE_SUM = 1,      /* sum of all windows                */
    EPX_ESTIMATE_RECENCY = 2,  /* exponentially recency-weighted    */
    EPX_ESTIMATE_MEAN_STD = 3, /* mean + z * stddev per expert     */
    EPX_ESTIMATE_MINMAX = 4    /* minimise the sum of per-window maxima */
} epx_estimate;

/*
 * SGLang ships its own copy of DeepSeek's EPLB (sglang/srt/eplb/
 * eplb_algorithms/deepseek.py). Read release by release from 0.5.2 to
 * 0.5.23 (tools/sglang_eplb.py runs each side of the change; the goldens
 * are tests/data/sglang_eplb), it changed once: from 0.5.11 its
 * balanced_packing adds the pack loads as Python floats (float64) where
 * DeepSeek's original and SGLang <= 0.5.10.post1 add float32 tensors.
 * Everything else (the float32 loads and per-replica quotients, the sort,
 * the auto rule, replicate_experts) is the same in every release.
 * Both run torch.sort, which is not stable: where loads tie, the SGLang
 * rules take the order torch's CPU sort leaves them in (src/plan/
 * torch_sort.c), so they place as the release does, ties included; epx's
 * own DeepSeek rule sends ties to the lowest index.
 */
typedef enum epx_eplb_rule {
    EPX_EPLB_RULE_DEEPSEEK = 0,   /* DeepSeek's EPLB: float32, ties to the lowest index */
    EPX_EPLB_RULE_SGLANG_F32 = 1, /* SGLang <= 0.5.10.post1: float32, torch's tie order */
    EPX_EPLB_RULE_SGLANG_F64 = 2, /* SGLang >= 0.5.11: float64 pack sums, torch's tie order */
    EPX_EPLB_RULE_VLLM_F64 = 3    /* vLLM >= 0.14.0: float64 quotients and pack sums (below) */
} epx_eplb_rule;

/*
 * vLLM's copy (vllm/distributed/eplb/policy/default.py, read from 0.14.0 to
 * 0.34.0; the arithmetic is the same in every release of that span) runs
 * DeepSeek's EPLB in numpy on the float32 load (weight.float()):
 *   - a group's load is numpy's float32 sum (pairwise: eight running sums
 *     over blocks of up to 128 items, rounded in float32);
 *   - the per-replica load, load / replicas, is float64 (float32 / int64),
 *     both where the redundant slots are handed out (argmax) and as the
 *     item weights of the GPU packing;
 *   - pack loads are float64 sums (groups onto nodes and replicas onto GPUs).
 * Its sorts are np.argsort (not torch's), not stable; EPX_EPLB_RULE_VLLM_F64
 * sends ties to the lowest index (a stable sort), as the DeepSeek rule does.
 * vLLM <= 0.13.0 computes in float32: EPX_EPLB_RULE_DEEPSEEK.
 */

/*
 * The EPLB rule of an SGLang release string ("0.5.10", "v0.5.11").
 * Args:    release (in); rule (out); newer (out, optional) 1 when the
 *          release is newer than EPX_SGLANG_DEFAULT_VERSION (its rule is
 *          that release's, but nothing checked it), else 0.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG for a string that is not
 *          MAJOR.MINOR.PATCH[.postN] or a release older than
 *          EPX_SGLANG_OLDEST_VERSION (the same parser as
 *          epx_sglang_table_rule).
 */
EPX_API epx_status epx_sglang_eplb_rule(const char *release, epx_eplb_rule *rule, int32_t *newer,
                                        epx_error *err);

typedef struct epx_plan_opts {
    uint32_t version; /* EPX_PLAN_OPTS_VERSION */
    epx_algorithm algorithm;
    int32_t num_groups; /* expert groups (DeepSeek-V3: 8); 0 = none, i.e. one
                                    group (AUTO then picks the global policy, as SGLang
                                    does for n_group = None) */
    epx_node_local node_local;
    double cross_node_budget; /* relaxed mode: share of redundant slots that may sit
                                    off their group's node; < 0 = default */
    epx_estimate estimate;
    double estimate_param;      /* recency half-life in windows, or z; < 0 = default */
    const epx_layout *current;  /* optional: the layout in service (cost of moving) */
    int32_t max_moves;          /* with current: most slots that may change; < 0 = no cap */
    double move_price;          /* with current: balance a moved expert must buy; 0 = free */
    const uint8_t *failed_gpus; /* optional [G]: nonzero = GPU lost, gets no experts
                                    (elasticity-aware: the ranks not active) */
    epx_log_fn log;             /* optional diagnostics */
    void *log_user;
    epx_progress_fn progress; /* optional: called once per layer planned */
    void *progress_user;
    const char *sglang_version; /* DeepSeek modes: plan as this SGLang release's copy
                                    of EPLB does, ties included
                                    (epx_sglang_eplb_rule); NULL = DeepSeek's
                                    original, ties to the lowest index. EPX
                                    refuses it. deepseek-vec and
                                    elasticity-aware: NULL = the newest
                                    release verified; elasticity-aware takes
                                    0.5.23 or newer. */
} epx_plan_opts;
#define EPX_PLAN_OPTS_VERSION ((uint32_t)sizeof(epx_plan_opts))
#define EPX_PLAN_OPTS_INIT                                                                         \
    {                                                                                              \
        EPX_PLAN_OPTS_VERSION, EPX_ALGO_EPX, 0, EPX_NODE_LOCAL_DEFAULT, -1.0,                      \
            EPX_ESTIMATE_DEFAULT, -1.0, NULL, -1, 0.0, NULL, NULL, NULL, NULL, NULL, NULL          \
    }

/* A computed placement: the layout, per-replica dispatch weights, timing. */
typedef struct epx_plan epx_plan;

/*
 * Plan a placement of `shape` for a load.
 * Args:    counts (in) [S][L][E]; L and E must equal the shape's;
 *          shape (in) L, E, P, G, N; opts (in) EPX_PLAN_OPTS_INIT plus changes;
 *          out (out) owned by the caller (epx_plan_destroy).
 *          DeepSeek modes plan for the sum of the S windows (as SGLang does),
 *          with replica weights 1 / replicas; EPX chooses its own estimate.
 * Returns: EPX_OK; EPX_ERR_SHAPE (counts vs shape, groups vs experts/nodes);
 *          EPX_ERR_INVALID_ARG (unknown enum values, options the chosen
 *          algorithm does not take, negative or non-finite loads; max_moves
 *          or move_price without current; a max_moves below what failed
 *          GPUs force, naming the least that works); EPX_ERR_NOMEM.
 *          With current: each planned GPU's set of experts goes to the GPU
 *          of its node (of the survivors, with failed_gpus) that keeps the
 *          most slots (an exact assignment per layer; a plan that fits
 *          already stays as it is), the plan is relabelled inside each GPU to
 *          keep what the current layout holds, then its least valuable moves are
 *          undone under max_moves (over all layers) and move_price (the
 *          balancedness of its layer a moved slot must buy); see
 *          epx_layout_limit_moves. With failed_gpus: planned on the
 *          survivors; a failed GPU's slots duplicate live experts (what
 *          current held there, else p % E) with replica weight 0, so
 *          dispatch must skip them (weighted dispatch does by its weights).
 * Thread:  any thread; no shared state.
 */
EPX_API epx_status epx_plan_compute(const epx_counts *counts, const epx_shape *shape,
                                    const epx_plan_opts *opts, epx_plan **out, epx_error *err);

/* Release a plan. Accepts NULL. */
EPX_API void epx_plan_destroy(epx_plan *plan);

/* The planned layout, owned by the plan. */
EPX_API const epx_layout *epx_plan_layout(const epx_plan *plan);

/* Per-slot dispatch weights [L][P]: the share of its logical expert's tokens
 * each slot should take (the shares of one expert's replicas sum to 1). */
EPX_API const double *epx_plan_replica_weights(const epx_plan *plan);

/* Seconds spent in the placement computation alone (no I/O; 0 for NULL). */
EPX_API double epx_plan_seconds(const epx_plan *plan);

/* The algorithm that ran (AUTO resolved; EPX_ALGO_EPX for NULL). */
EPX_API epx_algorithm epx_plan_algorithm(const epx_plan *plan);

/*
 * Each expert's slots [L][E][width] (-1 padded), in the order SGLang builds
 * its logical_to_all_physical_map for this plan: a DeepSeek mode without
 * current or failed_gpus lists them in replica-rank order (DeepSeek's
 * logical_to_physical_map, what SGLang's init_by_eplb uses when it plans
 * from the same counts); any other plan in ascending slot order (what
 * init_by_mapping builds from the written mapping file). *replica_rank
 * (optional) says which. width (out) = P - E + 1. Owned by the plan; the
 * replica-rank lists are built at the first call (safe from any thread), so
 * that call may return NULL when memory runs out.
 */
EPX_API const int32_t *epx_plan_logical_to_physical(const epx_plan *plan, int32_t *width,
                                                    int32_t *replica_rank);

/* Parse / name algorithms as the CLI spells them ("epx", "deepseek",
 * "deepseek-hierarchical", "auto", "deepseek-vec", "deepseek-vec-hierarchical",
 * "elasticity-aware", "elasticity-aware-hierarchical"; parse also takes
 * SGLang's spelling with underscores). */
EPX_API epx_status epx_algorithm_parse(const char *name, epx_algorithm *out, epx_error *err);
EPX_API const char *epx_algorithm_name(epx_algorithm algo);

/*
 * Re-fit the replica shares of a placement to a window's load, without
 * moving any weights: per layer, the split of each expert's load over its
 * replicas that minimises the most loaded GPU under `load` (the water-filling
 * the planner's own shares use). A dispatcher that takes weights can re-fit
 * them every window from the recorder's counts and re-plan less often.
 * Args:    layout (in); load (in) [L][E] of the layout's shape, entries
 *          finite and >= 0 (e.g. one window of counts, or an estimate);
 *          share (out) [L][P], caller-owned: per-slot shares, those of one
 *          expert's replicas summing to 1; an expert without load, and every
 *          expert of a layer without load, gets the even split.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (NULL, or a load entry that is not
 *          finite and >= 0: the message names layer and expert);
 *          EPX_ERR_NOMEM.
 * Thread:  any thread; no shared state. Deterministic.
 */
EPX_API epx_status epx_plan_refit_shares(const epx_layout *layout, const double *load,
                                         double *share, epx_error *err);

/*
 * The share of the routed load a placement serves off its expert group's
 * home node: the cross-node traffic that relaxing node locality implies
 * (with group-limited routing, a token needs only its groups' nodes while
 * groups stay node-local). A group's home node is the node serving the
 * largest part of its load, so strict node-local plans give 0 and global
 * ones about (N - 1) / N.
 * Args:    layout (in); weights (in) [L][P] per-slot shares as
 *          epx_plan_replica_weights returns, or NULL for an even split;
 *          counts (in) [S][L][E], windows summed; L and E must match;
 *          num_groups (in) >= 1, dividing E (1 = no groups);
 *          per_layer (out, optional) [L], caller-owned; share (out) the
 *          load-weighted share over all layers, in [0, 1].
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (NULL); EPX_ERR_SHAPE (counts vs
 *          layout, groups vs experts); EPX_ERR_NOMEM.
 * Thread:  any thread.
 */
EPX_API epx_status epx_plan_cross_node_share(const epx_layout *layout, const double *weights,
                                             const epx_counts *counts, int32_t num_groups,
                                             double *per_layer, double *share, epx_error *err);

/*
 * DeepSeek's EPLB, exactly: deepseek-ai/EPLB rebalance_experts for one load,
 * as SGLang calls it (SGLang's `deepseek` = global, `deepseek_hierarchical` =
 * hierarchical). The global policy replicates over all slots and packs the
 * replicas onto GPUs; the hierarchical one first packs whole expert groups
 * onto nodes, then replicates and packs inside each node. All arithmetic is
 * float32 as in the reference; ties go to the lowest index (a stable
 * descending sort), which meets the parity rules of shared/golden/README.md.
 * Args:    weight (in) [L][E] float32 loads, finite and >= 0;
 *          num_layers L, num_logical E, num_physical P (>= E, P % G == 0);
 *          num_groups (hierarchical only) expert groups, dividing E and a
 *          multiple of num_nodes; num_nodes (hierarchical only) N, G % N == 0;
 *          num_gpus G; hierarchical nonzero for the hierarchical policy;
 *          phys_to_log (out) [L][P] int32, caller-owned: the logical expert
 *          of each slot (slot p on GPU p / (P/G));
 *          log_to_phys (out, may be NULL) [L][E][P - E + 1] int32: the slots
 *          of each expert in replica-rank order (the reference's
 *          logical_to_physical_map, columns beyond the largest replica
 *          count included), -1 padded;
 *          logical_count (out, may be NULL) [L][E] int32 replicas per expert.
 * Returns: EPX_OK; EPX_ERR_SHAPE (sizes that do not divide; the message
 *          gives a fix); EPX_ERR_INVALID_ARG (NULL, a negative or non-finite
 *          weight, no groups for the hierarchical policy); EPX_ERR_NOMEM.
 *          Outputs are unspecified on error.
 * Thread:  any thread; no shared state. One allocation of scratch per call.
 */
EPX_API epx_status epx_plan_deepseek(const float *weight, int32_t num_layers, int32_t num_logical,
                                     int32_t num_physical, int32_t num_groups, int32_t num_nodes,
                                     int32_t num_gpus, int hierarchical, int32_t *phys_to_log,
                                     int32_t *log_to_phys, int32_t *logical_count, epx_error *err);

/* The same as a given rule runs it: EPX_EPLB_RULE_DEEPSEEK is
 * epx_plan_deepseek; the SGLang rules take torch's order of tied loads, and
 * _F64 sums pack loads in float64 as SGLang >= 0.5.11 does
 * (epx_sglang_eplb_rule maps a release to its rule); EPX_EPLB_RULE_VLLM_F64
 * is vLLM >= 0.14.0's arithmetic (float64 quotients and pack sums, numpy's
 * group sums) with ties to the lowest index. EPX_ERR_INVALID_ARG for an
 * unknown rule. */
EPX_API epx_status epx_plan_deepseek_rule(const float *weight, int32_t num_layers,
                                          int32_t num_logical, int32_t num_physical,
                                          int32_t num_groups, int32_t num_nodes, int32_t num_gpus,
                                          int hierarchical, epx_eplb_rule rule,
                                          int32_t *phys_to_log, int32_t *log_to_phys,
                                          int32_t *logical_count, epx_error *err);

#endif /* EPX_PLAN_H */
