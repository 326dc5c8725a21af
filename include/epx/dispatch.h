/*
 * epx/dispatch.h - which physical slot each token's expert choice goes to,
 * and how a batch of tokens is laid out for the all-to-all. Three layers:
 *
 *  1. Static dispatch tables [G][L][E]: for every rank, the one replica its
 *     tokens of each logical expert go to. EPX_TABLE_SGLANG reproduces
 *     SGLang's compute_logical_to_rank_dispatch_physical_map bit for bit
 *     (CPython's random.Random(42) included); EPX_TABLE_EPX is epx's own,
 *     deterministic and load-aware.
 *  2. Per-token dispatch of topk_ids [T][K] to physical slots: static (a
 *     table row), dynamic (uniform over the replicas) or weighted (by the
 *     planner's replica weights). Random choices come from a counter-based
 *     generator keyed by (seed, pass, layer, token, k), so the CPU reference
 *     here and the CUDA kernels of epx_cuda.h give identical slots and any
 *     token's choice can be recomputed alone (epx_dispatch_random).
 *  3. The token layout for the all-to-all (DeepEP's "dispatch layout") and
 *     the row permutations built on it: tokens per rank and per slot,
 *     is_token_in_rank, two send orders with their inverses, and the scatter
 *     of hidden states into those orders and the weighted combine back.
 *
 * The functions here are the plain-C references; epx_cuda.h runs steps 2-3
 * on the GPU with the same definitions. Include epx.h, not this file.
 */
#ifndef EPX_DISPATCH_H
#define EPX_DISPATCH_H

/* ---- 1. static dispatch tables ------------------------------------------ */

typedef enum epx_table_algorithm {
    EPX_TABLE_SGLANG = 0, /* SGLang's: same-GPU replica, else CPython "fair choices" */
    EPX_TABLE_EPX = 1     /* same-GPU, then same-node, then the least-loaded replica */
} epx_table_algorithm;

/*
 * SGLang changed its static table rule several times; each rule below is
 * read from the releases' own compute_logical_to_rank_dispatch_physical_map,
 * _find_nearest_expert and _compute_logical_to_all_physical_map
 * (tools/sglang_tables.py runs them; tests/data/sglang_tables holds their
 * output). "Node of slot p" is p / (P/G * G/N), the node of rank g is g / (G/N).
 */
typedef enum epx_sglang_rule {
    /* <= 0.5.2: a GPU holding replicas takes its first; the others share
     * the replicas by fair choices. No nodes. */
    EPX_SGLANG_RULE_0_5_2 = 0,
    /* 0.5.3 - 0.5.4.post1: a GPU with no replica of its own takes the first
     * replica on its node before any draw. */
    EPX_SGLANG_RULE_0_5_3 = 1,
    /* 0.5.4.post2 - 0.5.15: "nearest replica": a lone replica is taken by
     * every rank with no draw, then the first on the GPU, then the first on
     * the node. init_by_mapping also cuts each rank's lists to its nearest
     * replica, and each rank computes the whole table from its own cut lists
     * and keeps its row (the cut changes the draws). */
    EPX_SGLANG_RULE_0_5_4_POST2 = 2,
    /* 0.5.16 and later: as 0.5.4.post2, but the node's first replica is
     * taken only when the node holds some, not all, of the replicas.
     * (0.5.17 cuts only with an a2a backend, which "static" requires.) */
    EPX_SGLANG_RULE_0_5_16 = 3
} epx_sglang_rule;

/* The release epx's SGLang tables default to is EPX_SGLANG_DEFAULT_VERSION
 * (epx.h): the newest verified one. */

/*
 * The rule of an SGLang release string: "0.5.2", "v0.5.4.post2", "0.5.16".
 * Args:    release (in); rule (out); newer (out, optional) 1 when the
 *          release is newer than EPX_SGLANG_DEFAULT_VERSION (the newest
 *          verified; its rule is used, but nothing checked it), else 0.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG for a string that is not
 *          MAJOR.MINOR.PATCH[.postN] (pre-releases, "0.5" and suffixes are
 *          refused: which rule they carry is not known) or a release older
 *          than EPX_SGLANG_OLDEST_VERSION (named in the message).
 */
EPX_API epx_status epx_sglang_table_rule(const char *release, epx_sglang_rule *rule, int32_t *newer,
                                         epx_error *err);

typedef struct epx_table_opts {
    uint32_t version; /* EPX_TABLE_OPTS_VERSION */
    epx_table_algorithm algorithm;
    uint64_t seed;                 /* SGLANG: random.Random(seed); SGLang uses 42 */
    const double *expected_load;   /* EPX: optional [L][E] tokens per logical expert
                                      (e.g. summed logical_count); NULL = 1 each */
    const double *replica_weights; /* EPX: optional [L][P] share of its expert's tokens
                                      each slot should take (epx_plan_replica_weights);
                                      NULL = an even split over the replicas */
    const char *sglang_version;    /* SGLANG: the release whose rule applies
                                      (epx_sglang_table_rule); NULL =
                                      EPX_SGLANG_DEFAULT_VERSION */
    int32_t init_by_mapping;       /* SGLANG: nonzero when `replicas` are the
                                      ascending lists init_by_mapping builds, which
                                      releases >= 0.5.4.post2 cut per rank;
                                      epx_dispatch_table_from_layout sets it */
    epx_progress_fn progress;      /* optional: the cut table's G passes (minutes
                                      at 1,024 GPUs), told on the calling thread
                                      as they end ("ranks computed", done of G),
                                      the last call with done = G */
    void *progress_user;
    int32_t rank_only; /* nonzero: only rank `rank`'s row [L][E] of
                                      out is computed (other rows: unspecified),
                                      so a cut table takes one pass, not G: what
                                      one serving rank needs of its own table */
    int32_t rank;      /* that rank, in [0, G) */
} epx_table_opts;
#define EPX_TABLE_OPTS_VERSION ((uint32_t)sizeof(epx_table_opts))
#define EPX_TABLE_OPTS_INIT                                                                        \
    { EPX_TABLE_OPTS_VERSION, EPX_TABLE_SGLANG, 42u, NULL, NULL, NULL, 0, NULL, NULL, 0, 0 }

/*
 * Compute the static dispatch table of every rank.
 *
 * EPX_TABLE_SGLANG, exactly as the SGLang release opts->sglang_version
 * (epx_sglang_rule says what changed): one random.Random(seed) for the whole
 * table, layers then experts in order; per (layer, expert) each GPU takes
 * the replica the release's rule gives it with no draw (<= 0.5.2: the first
 * on its GPU); the k remaining GPUs, ascending, get q = k / n copies of the
 * n replicas followed by sample(replicas, k % n), shuffled. With
 * init_by_mapping set, releases >= 0.5.4.post2 first cut rank r's lists to
 * its nearest replica and rank r's row comes from a table over its own cut
 * lists (G passes over the table, as every SGLang rank computes a whole
 * table: 256 GPUs x 61 layers x 256 experts take ~8 s of CPU, which runs
 * on one thread per online CPU, or $EPX_THREADS (1 = this thread only); a
 * table with no cut takes ~0.3 s). shape->num_nodes counts from 0.5.3 on.
 * The replica order matters:
 * pass DeepSeek's logical_to_physical_map (replica-rank order, as SGLang's
 * init_by_eplb does) or the ascending map of a layout (as init_by_mapping
 * and init_trivial do; see epx_dispatch_table_from_layout).
 *
 * EPX_TABLE_EPX, deterministic (no generator): a GPU holding a replica
 * takes it, and an expert with one replica takes that; the other ranks are
 * assigned heaviest expert first (expected_load, ties by lower id), each
 * to the replica furthest below its share of the expert's G ranks (G x its
 * replica weight share, or G / n), ties going to the replica whose GPU is
 * furthest below the load the placement expects it to carry (expected_load
 * split by the shares, summed over the GPU's slots), then to the earlier
 * in `replicas`. A replica on the rank's own node is preferred while that
 * keeps it within half a rank of its share, so traffic stays on the node
 * without piling an expert onto one node's replicas. Loads assume each
 * rank sends 1/G of an expert's tokens (uniform token origin), as
 * epx_dispatch_table_gpu_load does. On shared/traces this matches SGLang's
 * balance (within +-0.01) and cuts cross-node traffic (bench/RESULTS.md).
 *
 * Args:    shape (in) L, E, P, G, N (N is used by EPX_TABLE_EPX only);
 *          replicas (in) [L][E][width] slot ids, -1 padding anywhere; every
 *            (layer, expert) needs at least one slot in [0, P);
 *          width (in) >= 1; opts (in) EPX_TABLE_OPTS_INIT plus changes, or
 *            NULL for SGLang's table with seed 42;
 *          out (out) [G][L][E] int32, caller-owned; rank r's table [L][E]
 *            starts at out + r * L * E.
 * Returns: EPX_OK; EPX_ERR_SHAPE; EPX_ERR_INVALID_ARG (bad options, negative
 *          or non-finite loads/weights, which name the index; an EPX_THREADS
 *          that is not a whole number from 1, when the table runs on threads;
 *          with rank_only, a rank outside [0, G));
 *          EPX_ERR_INVALID_MAP (a slot id outside [-1, P), or an expert with
 *          no replica: names layer and expert); EPX_ERR_NOMEM.
 * Thread:  any thread; no shared state; opts->progress is called on the
 *          calling thread only.
 */
EPX_API epx_status epx_dispatch_table_compute(const epx_shape *shape, const int32_t *replicas,
                                              int32_t width, const epx_table_opts *opts,
                                              int32_t *out, epx_error *err);

/* The same from a layout's ascending logical_to_all_physical map: SGLang's
 * table for a mapping file or the trivial layout (init_by_mapping is set
 * whatever opts says, as SGLang always cuts on that path). out [G][L][E]. */
EPX_API epx_status epx_dispatch_table_from_layout(const epx_layout *layout,
                                                  const epx_table_opts *opts, int32_t *out,
                                                  epx_error *err);

/*
 * The replica lists SGLang keeps on each rank: ExpertLocationMetadata's
 * logical_to_all_physical_map on rank r, for r = 0 .. G-1, [G][L][E][X].
 * It is what that rank's static table is computed from, and what SGLang's
 * dynamic dispatch and rank_invariant rule draw replicas from.
 *
 * With opts->init_by_mapping (a mapping file or the trivial layout: the
 * ascending lists; epx_dispatch_rank_lists_from_layout sets it), releases
 * from 0.5.4.post2 cut rank r's list of each (layer, expert) to the one
 * replica the release's nearest rule gives r (epx_sglang_rule: a lone
 * replica, else the first on r's GPU, else the first on r's node -- from
 * 0.5.16 only where the node holds some, not all, of them), and keep the
 * whole list where the rule gives none; older releases cut nothing.
 * Without init_by_mapping (init_by_eplb: DeepSeek's replica-rank lists) no
 * release cuts, and every rank holds the lists as given. These are the
 * lists of a rank with an all-to-all backend (which "static" dispatch
 * runs on; 0.5.17 and later cut only with one) and ep_join_mode "normal"
 * (releases that know "scale" drop the node step of the rule for it).
 *
 * Each list keeps the order of `replicas` with the -1 entries dropped, and
 * is -1 padded to out_width. SGLang pads each rank's tensor to that rank's
 * widest list, then to P columns; needed_width is the widest list of any
 * rank, so out_width = needed_width gives the narrowest [G][L][E][X] and
 * out_width = P SGLang's padded tensors.
 *
 * Args:    shape (in) L, E, P, G, N; replicas (in) [L][E][width] slot ids,
 *            -1 padding anywhere, as for epx_dispatch_table_compute;
 *          width (in) >= 1;
 *          opts (in) EPX_TABLE_OPTS_INIT plus sglang_version and
 *            init_by_mapping, or NULL (SGLang EPX_SGLANG_DEFAULT_VERSION, no
 *            cut); algorithm must be EPX_TABLE_SGLANG and the loads NULL;
 *            the seed is not used (the lists draw nothing), nor rank_only
 *            (every rank's lists are written: one cheap pass);
 *          out_width (in) columns of out, >= needed width (ignored when out
 *            is NULL);
 *          out (out, optional) [G][L][E][out_width] int32, caller-owned; rank
 *            r's lists start at out + r * L * E * out_width; NULL = only the
 *            size query;
 *          needed_width (out, optional) the widest list of any rank, 1 .. width.
 * Returns: EPX_OK; EPX_ERR_SHAPE; EPX_ERR_INVALID_ARG (bad options; an
 *          out_width below the needed width, both named); EPX_ERR_INVALID_MAP
 *          (as epx_dispatch_table_compute: names layer, expert and slot).
 * Thread:  any thread; no shared state; allocates nothing.
 */
EPX_API epx_status epx_dispatch_rank_lists_compute(const epx_shape *shape, const int32_t *replicas,
                                                   int32_t width, const epx_table_opts *opts,
                                                   int32_t out_width, int32_t *out,
                                                   int32_t *needed_width, epx_error *err);

/* The same from a layout's ascending logical_to_all_physical map, as
 * SGLang's init_by_mapping builds them (init_by_mapping is set whatever opts
 * says): the lists that go with epx_dispatch_table_from_layout's tables. */
EPX_API epx_status epx_dispatch_rank_lists_from_layout(const epx_layout *layout,
                                                       const epx_table_opts *opts,
                                                       int32_t out_width, int32_t *out,
                                                       int32_t *needed_width, epx_error *err);

/*
 * Write {"logical_to_all_physical_map": lists} atomically: [num_ranks][L][E][X]
 * with num_ranks >= 1, or one rank's [L][E][X] with num_ranks == 0.
 * Returns: EPX_OK, EPX_ERR_INVALID_ARG (sizes), EPX_ERR_IO.
 */
EPX_API epx_status epx_dispatch_rank_lists_write_json(const char *path, const int32_t *lists,
                                                      int32_t num_ranks, int32_t num_layers,
                                                      int32_t num_experts, int32_t width,
                                                      epx_error *err);

/*
 * The token load each GPU receives under a static table when every rank
 * sends 1/G of each expert's tokens: gpu_load[l][g] = sum over ranks r and
 * experts e with table[r][l][e] on GPU g of load[l][e] / G.
 * Args:    shape (in); table (in) [G][L][E]; load (in) [L][E] >= 0;
 *          gpu_load (out) [L][G] doubles, caller-owned.
 * Returns: EPX_OK; EPX_ERR_INVALID_MAP for a table entry outside [0, P);
 *          EPX_ERR_INVALID_ARG for a load not finite, negative, or loads
 *          summing above 2^63.
 */
EPX_API epx_status epx_dispatch_table_gpu_load(const epx_shape *shape, const int32_t *table,
                                               const double *load, double *gpu_load,
                                               epx_error *err);

/*
 * Read {"logical_to_physical_map": [L][E][X]} (DeepSeek's replica-rank
 * order, -1 padded) from a .json path or inline JSON: what a golden case or
 * an epx plan report carries. Other keys are ignored.
 * Args:    spec (in); map (out) [L][E][X] int32, release with epx_free;
 *          num_layers, num_experts, width (out) L, E, X.
 * Returns: EPX_OK; EPX_ERR_IO; EPX_ERR_PARSE (a missing key names the keys a
 *          mapping file has instead; ragged rows; ids below -1); EPX_ERR_NOMEM.
 */
EPX_API epx_status epx_replica_map_read(const char *spec, int32_t **map, int32_t *num_layers,
                                        int32_t *num_experts, int32_t *width, epx_error *err);

/*
 * Write {"logical_to_rank_dispatch_physical_map": table} atomically. With
 * num_ranks >= 1 the table is [num_ranks][L][E]; with num_ranks == 0 it is
 * one rank's [L][E] (what SGLang keeps on each rank).
 * Returns: EPX_OK, EPX_ERR_INVALID_ARG (sizes), EPX_ERR_IO.
 */
EPX_API epx_status epx_dispatch_table_write_json(const char *path, const int32_t *table,
                                                 int32_t num_ranks, int32_t num_layers,
                                                 int32_t num_experts, epx_error *err);

/* ---- 2. per-token dispatch ------------------------------------------------ */

typedef enum epx_dispatch_mode {
    EPX_DISPATCH_PHYSICAL = 0, /* ids are already physical slots: nothing to map */
    EPX_DISPATCH_STATIC = 1,   /* slot = table[e]                                */
    EPX_DISPATCH_DYNAMIC = 2,  /* uniform over the expert's replicas             */
    EPX_DISPATCH_WEIGHTED = 3, /* by per-replica weights (thresholds)            */
    EPX_DISPATCH_ROW = 4       /* replica (token row mod num_valid): SGLang's
                                  rank_invariant dynamic rule (see below)       */
} epx_dispatch_mode;

/*
 * How one layer's logical ids become slots: a plain descriptor. The CPU
 * functions read host pointers; epx_cuda.h's functions read the same fields
 * as device pointers. Tables are read, never written or retained.
 */
typedef struct epx_dispatch_spec {
    epx_dispatch_mode mode;
    int32_t num_experts;        /* E: ids in [0, E) are mapped, -1 passes through */
    int32_t num_physical;       /* P: every slot id is in [0, P)                   */
    int32_t width;              /* W: columns of replicas and thresholds           */
    const int32_t *table;       /* STATIC: [E], this rank's row of a static table
                                     for this layer (table + (r*L + l)*E)           */
    const int32_t *replicas;    /* DYNAMIC, WEIGHTED, ROW: [E][W] slots, the valid
                                     ones first (a layout's logical_to_all_physical
                                     row)                                           */
    const int32_t *num_valid;   /* DYNAMIC, WEIGHTED, ROW: [E] replicas per expert,
                                     1..W                                          */
    const uint32_t *thresholds; /* WEIGHTED: [E][W] from epx_dispatch_thresholds    */
    uint64_t seed;              /* the generator's key                            */
    uint32_t pass;              /* forward-pass counter: new draws every pass      */
    uint32_t layer;             /* layer index: new draws every layer              */
} epx_dispatch_spec;

/*
 * The random word behind a dynamic or weighted choice: Philox-4x32-10 with
 * key (seed low, seed high) and counter (token, k, layer, pass), first output
 * word. A dynamic choice is replica (word * num_valid) >> 32; a weighted one
 * the first replica j < num_valid - 1 with word < thresholds[j], else the
 * last. The CUDA kernels compute the same words.
 */
EPX_API uint32_t epx_dispatch_random(uint64_t seed, uint32_t pass, uint32_t layer, uint32_t token,
                                     uint32_t k);

/*
 * Turn per-slot replica weights into the integer thresholds weighted
 * dispatch compares against, so CPU and GPU choose alike: for expert e with
 * replicas s_0..s_{n-1} (num_valid n), thresholds[j] = floor(2^32 x
 * (w_0 + .. + w_j) / (w_0 + .. + w_{n-1})), capped at 2^32 - 1; columns from
 * n - 1 on hold 2^32 - 1. An expert whose weights are all 0 is split evenly.
 * Args:    replicas (in) [L][E][W], num_valid (in) [L][E];
 *          weights (in) [L][P] finite, >= 0; out (out) [L][E][W] uint32.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (a negative or non-finite weight, a
 *          num_valid outside [1, W]: names the index); EPX_ERR_INVALID_MAP
 *          (a replica slot outside [0, P)).
 */
EPX_API epx_status epx_dispatch_thresholds(const int32_t *replicas, const int32_t *num_valid,
                                           int32_t num_layers, int32_t num_experts, int32_t width,
                                           const double *weights, int32_t num_physical,
                                           uint32_t *out, epx_error *err);

/*
 * Map topk_ids [T][K] of one layer to slots phys [T][K] (CPU reference).
 * Ids of -1 give -1. Token t's k-th choice uses epx_dispatch_random(seed,
 * pass, layer, t, k).
 *
 * EPX_DISPATCH_ROW draws nothing: token t's choice of expert e is
 * replicas[e][t % num_valid[e]], t being the row of topk_ids in this batch
 * (0 .. T-1, every k of a row alike). That is SGLang 0.5.23's "dynamic"
 * dispatch with rank_invariant set (no all-to-all backend: every EP rank
 * runs the same tokens and must pick the same replica). SGLang then keeps
 * the whole, uncut lists on every rank: pass a layout's ascending
 * logical_to_all_physical row (init_by_mapping, init_trivial) or DeepSeek's
 * logical_to_physical_map row (init_by_eplb), -1 padding at the tail, with
 * num_valid the count of entries != -1. Seed, pass and layer are not read.
 * Args:    spec (in) host pointers; topk_ids (in) [T][K] int32;
 *          T >= 0 (below 2^31), K >= 1; phys (out) [T][K] int32.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG for an id outside [-1, E) (PHYSICAL:
 *          [-1, P)), naming token, k and id, or a spec field missing for its
 *          mode; EPX_ERR_INVALID_MAP for a table slot outside [0, P), a
 *          num_valid outside [1, W], or any of a used expert's first num_valid
 *          replicas outside [0, P) (whichever the draw would pick). The GPU
 *          kernels cannot report these:
 *          they map bad ids to -1 and trust the tables.
 */
EPX_API epx_status epx_dispatch_map_ids(const epx_dispatch_spec *spec, const int32_t *topk_ids,
                                        int64_t num_tokens, int32_t topk, int32_t *phys,
                                        epx_error *err);

/* ---- 3. token layout and row permutations ---------------------------------- */

/*
 * Where a batch goes, computed from phys [T][K] (slot p on GPU p / (P/G)).
 * Every pointer is optional (NULL = not wanted). Two send orders:
 *
 *  - rank order, each (token, rank) pair once: sorted by rank, then by the
 *    token's lowest slot on that rank, then token index. A token's entry for
 *    rank g is carried by its "representative" pair: the pair with the
 *    lowest slot on g (lowest k among equal slots). Rank g's tokens are
 *    rank_perm[rank_offsets[g] .. rank_offsets[g+1]).
 *  - slot order, each valid (token, k) pair once: sorted by slot, then token,
 *    then k. Slot p's pairs are slot_perm[slot_offsets[p] .. slot_offsets[p+1]).
 *
 * Grouping a rank's tokens by lowest slot lets the receiver find each local
 * expert's first tokens contiguous, and token order inside a group keeps the
 * layout deterministic and equal on CPU and GPU.
 */
typedef struct epx_token_layout {
    int64_t *tokens_per_rank;  /* [G]   tokens with at least one pair on rank g       */
    int64_t *tokens_per_slot;  /* [P]   pairs routed to slot p: what
                                  epx_recorder_add_slot_counts takes               */
    uint8_t *is_token_in_rank; /* [T][G] 1 when token t has a pair on rank g, else 0 */
    int32_t *rank_offsets;     /* [G+1] exclusive scan of tokens_per_rank            */
    int32_t *rank_perm;        /* [T*K] capacity: token ids in rank order            */
    int32_t *pair_rank_pos;    /* [T][K] position in rank order of a representative
                                  pair, -1 for other pairs and invalid ones         */
    int32_t *slot_offsets;     /* [P+1] exclusive scan of tokens_per_slot            */
    int32_t *slot_perm;        /* [T*K] capacity: pair ids t*K + k in slot order     */
    int32_t *pair_slot_pos;    /* [T][K] position in slot order, -1 for invalid pairs */
} epx_token_layout;

/*
 * Compute the layout of a batch (CPU reference of the fused GPU kernel).
 * Args:    phys (in) [T][K] slots in [-1, P); T >= 0 (below 2^31), K >= 1;
 *          num_physical P, num_gpus G with P % G == 0;
 *          out (in) the caller-owned arrays to fill (see epx_token_layout).
 * Returns: EPX_OK; EPX_ERR_SHAPE; EPX_ERR_INVALID_ARG for a slot outside
 *          [-1, P) (names token, k and slot).
 */
EPX_API epx_status epx_token_layout_compute(const int32_t *phys, int64_t num_tokens, int32_t topk,
                                            int32_t num_physical, int32_t num_gpus,
                                            const epx_token_layout *out, epx_error *err);

/* Element types of hidden-state rows: the core epx_dtype (epx.h), F32 or
 * BF16. The older names stay as aliases. */
typedef epx_dtype epx_row_dtype;
#define EPX_ROW_F32 EPX_DTYPE_F32
#define EPX_ROW_BF16 EPX_DTYPE_BF16

/*
 * Scatter rows of x [T][H] into a send order: out[pos[t][k]] = x[t] for every
 * pos[t][k] >= 0. With pair_rank_pos each token lands once per destination
 * rank; with pair_slot_pos once per slot. Rows nobody writes are untouched.
 * Args:    x (in) [T][H] of dtype; pos (in) [T][K]; out (out) [num_rows][H].
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (a position >= num_rows or < -1,
 *          named; a bad dtype or size).
 */
EPX_API epx_status epx_permute_rows(const void *x, epx_row_dtype dtype, int64_t num_tokens,
                                    int64_t hidden, const int32_t *pos, int32_t topk,
                                    int64_t num_rows, void *out, epx_error *err);

/*
 * The same scatter written as a gather over a send order, so every output
 * row is written exactly once and nothing needs clearing first: out[i] =
 * x[order[i] / per_token] for order[i] >= 0, a zero row for order[i] == -1.
 * order = rank_perm (token ids) with per_token 1, or slot_perm (pair ids
 * t*K + k) with per_token K; their -1 tails become zero rows. Equal to
 * epx_permute_rows into a zeroed buffer of num_rows rows.
 * Args:    x (in) [T][H] of dtype; order (in) [num_rows], entries in
 *          [-1, T * per_token); per_token >= 1; out (out) [num_rows][H].
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (an entry out of range, named; a bad
 *          dtype); EPX_ERR_SHAPE (a negative size); EPX_ERR_OVERFLOW
 *          (rows x H bytes past size_t).
 */
EPX_API epx_status epx_gather_rows(const void *x, epx_row_dtype dtype, int64_t num_tokens,
                                   int64_t hidden, const int32_t *order, int64_t num_rows,
                                   int32_t per_token, void *out, epx_error *err);

/*
 * The weighted combine back into token order: for every token t and column
 * h, acc = 0.0f, then for k = 0 .. K-1 with pos[t][k] >= 0,
 * acc = fmaf(w[t][k], y[pos[t][k]][h], acc) (w = 1 when weights is NULL);
 * out[t][h] = acc, rounded to nearest-even for bf16. The fixed order and the
 * single fused multiply-add per term make the result bitwise reproducible and
 * equal to the GPU's. Tokens with no valid pair get zeros.
 * Args:    y (in) [num_rows][H] of dtype; pos (in) [T][K]; weights (in)
 *          optional [T][K] fp32; out (out) [T][H] of dtype.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG as for epx_permute_rows.
 */
EPX_API epx_status epx_combine_rows(const void *y, epx_row_dtype dtype, int64_t num_rows,
                                    int64_t hidden, const int32_t *pos, const float *weights,
                                    int64_t num_tokens, int32_t topk, void *out, epx_error *err);

/*
 * DeepEP's fp8 form of bf16 rows (the GPU engine's EPX_GPU_EP_FP8 dispatch;
 * python/epx/torch's per_token_cast_fp8): per group of 128 values, scale =
 * amax * (float)(1 / 448) with amax at least 1e-4 (round_scale: raised to
 * the next power of two), data = e4m3(clamp(x * (448 / amax), +-448)),
 * rounded to nearest even; the same bits as the kernels. cast_back gives
 * data * scale in fp32 (DeepEP's per_token_cast_back).
 * Args:    x (in) [rows][hidden] bf16 bits, hidden a multiple of 128;
 *          data (out) [rows][hidden] e4m3 bits; scales (out)
 *          [rows][hidden / 128] fp32, row-major; out (out) [rows][hidden].
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (NULL pointers, hidden not a
 *          multiple of 128, rows < 0).
 */
EPX_API epx_status epx_fp8_cast_rows(const uint16_t *x, int64_t rows, int64_t hidden,
                                     int round_scale, uint8_t *data, float *scales, epx_error *err);
EPX_API epx_status epx_fp8_cast_back_rows(const uint8_t *data, const float *scales, int64_t rows,
                                          int64_t hidden, float *out, epx_error *err);

/* ---- 4. balanced per-batch dispatch --------------------------------------- */

/*
 * "Balanced" routing looks at the batch: given one layer's placement and the
 * batch's tokens per logical expert c_e, it splits each expert's tokens over
 * its replicas so that the largest GPU load of the batch (tokens routed to a
 * GPU's slots; slot p is on GPU p / (P/G)) is the least any split can reach:
 * the optimum of SGLang 0.5.23's `--ep-dispatch-algorithm lp`, computed
 * exactly (over GPU subsets, or with max-flows for groups of more than 10
 * linked GPUs) instead of with an LP solver (balanced.c states the
 * algorithm). Beyond the largest load, the GPU loads are lexicographically
 * minimal (the second largest is as small as the largest allows, and so
 * on), which makes the GPU load vector unique.
 *
 * Guarantees of epx_dispatch_balanced_solve, for counts c_e >= 0:
 *  - max_load_num / max_load_den is the optimum max GPU load, exactly (a
 *    reduced fraction; den <= G); the shares realise it up to double
 *    rounding.
 *  - replica_counts n_ej are integers with sum_j n_ej = c_e and
 *    |n_ej - c_e * share_ej| < 1 (the fractional count rounded down or up),
 *    and every GPU's integer load is its fractional load rounded down or up;
 *    so the largest integer GPU load is ceil(optimum), which no integer
 *    split beats.
 *  - deterministic: the same inputs give the same outputs, bit for bit.
 *
 * The solver keeps its workspace in a handle sized once for (E, W, P, G), so
 * the per-batch calls allocate nothing; one handle serves every layer (the
 * replica lists are arguments), one thread at a time.
 */
typedef struct epx_balancer epx_balancer;

/* Size a balancer for E experts, replica lists of width W, P slots on G
 * GPUs (P % G == 0, G <= 4096). Returns EPX_OK; EPX_ERR_SHAPE; EPX_ERR_NOMEM. */
EPX_API epx_status epx_dispatch_balanced_create(int32_t num_experts, int32_t width,
                                                int32_t num_physical, int32_t num_gpus,
                                                epx_balancer **out, epx_error *err);
EPX_API void epx_dispatch_balanced_destroy(epx_balancer *b);

/* What a solve gives; every array is caller-owned and optional (NULL = not
 * wanted); the scalars are always written. */
typedef struct epx_balanced_out {
    double *shares;          /* [E][W] share of expert e's tokens for replica column j:
                                SGLang's log2phy_prob row for these replica lists; 0 past
                                num_valid; an expert with no tokens splits evenly   */
    int64_t *replica_counts; /* [E][W] integer tokens per replica column (0 past
                                num_valid): what epx_dispatch_balanced_map_ids takes */
    int64_t *slot_counts;    /* [P] integer tokens per slot                         */
    double *gpu_load;        /* [G] fractional tokens per GPU under the shares      */
    int64_t max_load_num;    /* the optimum max GPU load is num / den, exactly       */
    int64_t max_load_den;
    int64_t max_load_int; /* the largest integer GPU load: ceil(num / den)       */
    int32_t num_levels;   /* distinct GPU load levels of the lexicographic optimum */
} epx_balanced_out;

/*
 * Tokens per logical expert of one layer's batch: counts[e] = number of
 * pairs (t, k) with topk_ids[t][k] == e; ids of -1 are skipped.
 * Returns: EPX_OK; EPX_ERR_SHAPE; EPX_ERR_INVALID_ARG for an id outside
 * [-1, E), naming token, k and id.
 */
EPX_API epx_status epx_dispatch_count_ids(const int32_t *topk_ids, int64_t num_tokens, int32_t topk,
                                          int32_t num_experts, int64_t *counts, epx_error *err);

/*
 * The balanced split of one layer's batch (see the guarantees above).
 * Args:    b (in/out) the balancer; replicas (in) [E][W] slots, the valid ones
 *            first (a layout's logical_to_all_physical row for the layer, or
 *            SGLang's logical_to_all_physical_map[layer], any order); a slot
 *            may appear once in the whole table; num_valid (in) [E] in
 *            [1, W]; counts (in) [E] tokens per logical expert, >= 0, at most
 *            2^40 in all; out (out) the results wanted.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (a negative count or a total above
 *          2^40, a num_valid outside [1, W]: names the expert);
 *          EPX_ERR_INVALID_MAP (a slot outside [0, P), or a slot listed
 *          twice: names expert, column and slot).
 */
EPX_API epx_status epx_dispatch_balanced_solve(epx_balancer *b, const int32_t *replicas,
                                               const int32_t *num_valid, const int64_t *counts,
                                               epx_balanced_out *out, epx_error *err);

/*
 * Route topk_ids [T][K] to slots phys [T][K] by integer replica counts:
 * expert e's pairs, in (t, k) order, fill its replica columns in order,
 * n_e0 pairs to column 0, the next n_e1 to column 1, and so on; -1 stays -1.
 * So slot p receives exactly its count.
 * Args:    replica_counts (in) [E][W] from epx_dispatch_balanced_solve for
 *            these ids' counts; the other arguments as in solve and map_ids.
 * Returns: EPX_OK; EPX_ERR_SHAPE; EPX_ERR_INVALID_ARG (an id outside
 *          [-1, E); counts that do not sum to expert e's pairs: names e and
 *          both numbers); EPX_ERR_INVALID_MAP as solve.
 */
EPX_API epx_status epx_dispatch_balanced_map_ids(epx_balancer *b, const int32_t *replicas,
                                                 const int32_t *num_valid,
                                                 const int64_t *replica_counts,
                                                 const int32_t *topk_ids, int64_t num_tokens,
                                                 int32_t topk, int32_t *phys, epx_error *err);

/*
 * Count, solve and route in one call: phys [T][K] as map_ids gives it for
 * the balanced counts of topk_ids. out (optional) receives the solve's
 * results; its replica_counts may be NULL (the balancer keeps its own).
 */
EPX_API epx_status epx_dispatch_balanced_topk(epx_balancer *b, const int32_t *replicas,
                                              const int32_t *num_valid, const int32_t *topk_ids,
                                              int64_t num_tokens, int32_t topk, int32_t *phys,
                                              epx_balanced_out *out, epx_error *err);

#endif /* EPX_DISPATCH_H */
