/*
 * epx/migrate.h - rebalancing: moving expert weights from the layout in
 * service to a new one with the fewest bytes, and trading balance against
 * the cost of moving.
 *
 * A migration is planned from two layouts of one shape. First the new
 * layout's slots are relabelled inside each GPU so that as many slots as
 * possible keep the expert they already hold (a maximum matching of two
 * multisets per GPU: it changes no GPU's set of experts, so no balance).
 * Then every slot gets one action (epx_move_kind): keep; copy from another
 * slot of the same GPU; receive from a GPU that holds the expert now (same
 * node first); relay from a GPU of the same node that receives it in this
 * migration (one inter-node transfer per node and expert); copy a second
 * replica from a slot of the same GPU that receives it; or load it through
 * the caller when no live GPU holds it (after a GPU failure).
 *
 * epx_migration_execute runs a plan over a communicator (epx_comm.h; make
 * one with epx_comm_mpi_create or any backend): only `struct epx_comm`
 * appears here, so this header stays plain C11. Include epx.h, not this
 * file.
 */
#ifndef EPX_MIGRATE_H
#define EPX_MIGRATE_H

/* What happens to one slot (the values of epx_migration_kinds). */
typedef enum epx_move_kind {
    EPX_MOVE_KEEP = 0,      /* the slot already holds its expert: nothing moves            */
    EPX_MOVE_LOCAL = 1,     /* copy the old contents of slot `source`, same GPU (no link)  */
    EPX_MOVE_RECV = 2,      /* receive the old contents of slot `source` of another GPU     */
    EPX_MOVE_RELAY = 3,     /* receive from target slot `source`, a GPU of the same node that
                               gets the expert by EPX_MOVE_RECV in this migration           */
    EPX_MOVE_RECV_COPY = 4, /* copy target slot `source` of the same GPU once it has arrived */
    EPX_MOVE_LOAD = 5,      /* no live GPU holds the expert: the caller loads its weights   */
    EPX_MOVE_DEAD = 6       /* the slot is on a failed GPU: nothing is done                 */
} epx_move_kind;

/* Options of a migration plan. Initialise with EPX_MIGRATE_OPTS_INIT. */
typedef struct epx_migrate_opts {
    uint32_t version;           /* EPX_MIGRATE_OPTS_VERSION */
    size_t expert_bytes;        /* bytes of one expert's weights in one layer, > 0 */
    int32_t relabel;            /* 1 (default): relabel the target inside each GPU; 0: as given */
    int32_t relay;              /* 1 (default): one inter-node transfer per node and expert,
                                   the node's other GPUs relay it; 0: every GPU receives */
    const uint8_t *failed_gpus; /* optional [G]: nonzero = lost; it sends and receives nothing */
} epx_migrate_opts;
#define EPX_MIGRATE_OPTS_VERSION ((uint32_t)sizeof(epx_migrate_opts))
#define EPX_MIGRATE_OPTS_INIT                                                                      \
    { EPX_MIGRATE_OPTS_VERSION, 0, 1, 1, NULL }

/*
 * Totals of a migration plan and of the naive plan beside it. Counts are
 * over the slots of live GPUs in all layers. Byte totals are uint64_t, not
 * size_t, because sums over a cluster may pass 4 GiB on a 32-bit host.
 * The naive plan is what SGLang and vLLM do in spirit: no relabelling, and
 * every slot whose expert changed is written with one expert's bytes.
 */
typedef struct epx_migration_stats {
    int64_t slots;        /* live slots, L * live GPUs * P/G */
    int64_t kept;         /* EPX_MOVE_KEEP */
    int64_t local_copies; /* EPX_MOVE_LOCAL + EPX_MOVE_RECV_COPY */
    int64_t received;     /* EPX_MOVE_RECV */
    int64_t relayed;      /* EPX_MOVE_RELAY */
    int64_t loaded;       /* EPX_MOVE_LOAD */
    int64_t changed;      /* slots not kept (after relabelling) */
    size_t expert_bytes;
    uint64_t bytes_moved;            /* over links: bytes_intra_node + bytes_inter_node */
    uint64_t bytes_intra_node;       /* GPU to GPU inside a node (RECV from the node, RELAY) */
    uint64_t bytes_inter_node;       /* between nodes (RECV from another node) */
    uint64_t bytes_local;            /* copies inside one GPU: no link */
    uint64_t bytes_loaded;           /* EPX_MOVE_LOAD: read by the caller, no link */
    uint64_t max_rank_recv;          /* most bytes any one GPU receives over links */
    uint64_t max_rank_send;          /* most bytes any one GPU sends over links */
    int64_t naive_changed;           /* slots whose expert differs in the target as given */
    uint64_t naive_bytes_moved;      /* naive_changed * expert_bytes */
    uint64_t naive_bytes_inter_node; /* of those, slots whose expert no live GPU of their
                                        node holds now but one elsewhere does (the least a
                                        naive plan sends between nodes; an expert no live GPU
                                        holds is loaded: epx_migration_naive_loaded) */
} epx_migration_stats;

/* A planned migration: the relabelled target and one action per slot. */
typedef struct epx_migration epx_migration;

/*
 * Plan how to move from `current` to `target`.
 * Args:    current (in) the layout in service; target (in) the layout wanted,
 *          same shape (every field); both only read, not kept;
 *          opts (in) EPX_MIGRATE_OPTS_INIT with expert_bytes set;
 *          out (out) owned by the caller (epx_migration_destroy).
 * Returns: EPX_OK; EPX_ERR_SHAPE (the shapes differ, named); EPX_ERR_INVALID_ARG
 *          (expert_bytes 0, a bad version, relabel/relay not 0 or 1, every GPU
 *          failed); EPX_ERR_INVALID_MAP (with failed_gpus: a target that leaves
 *          an expert's every replica on failed GPUs, which no token could
 *          reach: the layer, expert and GPU named; plan it with failed_gpus);
 *          EPX_ERR_OVERFLOW (expert_bytes times slots); EPX_ERR_NOMEM.
 *          An expert no live GPU holds in `current` is not an error: its slots get
 *          EPX_MOVE_LOAD (see epx_migration_stats.loaded).
 * Thread:  any thread; the result is immutable and may be shared.
 * Cost:    O(L * P log(P/G)) time, O(L * P) memory.
 */
EPX_API epx_status epx_migration_plan(const epx_layout *current, const epx_layout *target,
                                      const epx_migrate_opts *opts, epx_migration **out,
                                      epx_error *err);

/* Release a migration plan. Accepts NULL. */
EPX_API void epx_migration_destroy(epx_migration *mig);

/* The relabelled target: same experts per GPU as `target`, owned by the
 * plan. This, not the target as given, is the layout to put in service. */
EPX_API const epx_layout *epx_migration_layout(const epx_migration *mig);

/* The relabelling, [L][P]: relabelled slot p holds what target slot
 * perm[p] held (perm[p] is on p's GPU). Apply it to any per-slot data
 * planned with the target, such as epx_plan_replica_weights. */
EPX_API const int32_t *epx_migration_permutation(const epx_migration *mig);

/* Per slot [L][P]: the action (an epx_move_kind) and its source slot (see
 * epx_move_kind; the slot itself for KEEP, -1 for LOAD and DEAD). NULL for
 * a NULL plan, as epx_migration_layout. */
EPX_API const uint8_t *epx_migration_kinds(const epx_migration *mig);
EPX_API const int32_t *epx_migration_sources(const epx_migration *mig);

/* The totals of the plan and of the naive plan (zeros for a NULL plan;
 * nothing written for a NULL out). Never fails. */
EPX_API void epx_migration_get_stats(const epx_migration *mig, epx_migration_stats *out);

/* Of the naive plan's changed slots (naive_changed), those whose expert no
 * live GPU holds: after a failure the caller loads them, as epx's plan
 * loads its EPX_MOVE_LOAD slots, so they cross no link. 0 without failed
 * GPUs, and for NULL. */
EPX_API int64_t epx_migration_naive_loaded(const epx_migration *mig);

/*
 * Bytes each GPU sends and receives over links (local copies excluded).
 * Args:    sent, received (out, may be NULL) [G] caller-owned; nothing is
 *          written for a NULL plan.
 */
EPX_API void epx_migration_rank_bytes(const epx_migration *mig, uint64_t *sent, uint64_t *received);

/*
 * Bytes over each ordered GPU pair: out[src * G + dst], caller-owned [G][G].
 * The diagonal holds each GPU's local copies. Nothing is written for a NULL
 * plan or out.
 */
EPX_API void epx_migration_link_bytes(const epx_migration *mig, uint64_t *out);

/* The name of a kind as the CLI prints it ("keep", "local", "recv", "relay",
 * "recv-copy", "load", "dead"); "?" for other values. */
EPX_API const char *epx_move_kind_name(int kind);

/*
 * Planning with the cost of moving.
 *
 * A move is a slot of a live GPU whose expert changes (after relabelling).
 * epx_layout_limit_moves starts from the relabelled target and reverts the
 * changes that buy the least balance per moved slot, back to what `current`
 * holds there, until the budget holds. A revert that would leave an expert
 * without a live replica is taken together with the changes that keep it
 * alive (a chain of slots, valued per slot). Balance is SGLang's
 * balancedness per layer (mean / max GPU load, an expert's load split evenly
 * over its replicas, summed over the load's windows); a layer without load
 * gains nothing from a move, so its changes are reverted first.
 */
typedef struct epx_move_budget {
    uint32_t version;           /* EPX_MOVE_BUDGET_VERSION */
    int32_t max_moves;          /* most moves over all layers together; < 0 = no cap */
    double move_price;          /* balancedness of its own layer each move must buy
                                   (0.001 = a tenth of a point); 0 = moves are free */
    const uint8_t *failed_gpus; /* optional [G]: nonzero = lost; its slots are no moves,
                                   and every expert keeps a replica on a live GPU */
} epx_move_budget;
#define EPX_MOVE_BUDGET_VERSION ((uint32_t)sizeof(epx_move_budget))
#define EPX_MOVE_BUDGET_INIT                                                                       \
    { EPX_MOVE_BUDGET_VERSION, -1, 0.0, NULL }

/* What a limited plan gave and gave up (balancedness: mean over layers with
 * load, live GPUs only). */
typedef struct epx_move_report {
    int64_t moves_wanted;   /* moves of the relabelled target */
    int64_t moves_made;     /* moves left after the budget */
    int64_t moves_required; /* moves failed GPUs force: one per (layer, expert) only they held */
    double balance_current; /* the layout in service */
    double balance_wanted;  /* the relabelled target */
    double balance_made;    /* the result */
} epx_move_report;

/*
 * Limit the moves from `current` to `target` under `budget`.
 * Args:    counts (in) [S][L][E], the load the target was planned for;
 *          current, target (in) same shape; budget (in) EPX_MOVE_BUDGET_INIT
 *          plus changes; out (out) the result, relabelled, owned by the caller;
 *          report (out, may be NULL).
 * Returns: EPX_OK; EPX_ERR_SHAPE; EPX_ERR_INVALID_ARG (move_price < 0 or not
 *          finite, a bad version, every GPU failed, or max_moves below the
 *          moves that failed GPUs force: the message gives the least cap that
 *          works); EPX_ERR_INVALID_MAP (target leaves an expert with no
 *          replica on a live GPU); EPX_ERR_NOMEM.
 *          With a budget the search also runs the other way, from `current`
 *          toward the target (after giving each expert that only failed GPUs
 *          held one slot of a duplicated expert), and keeps the better.
 * Thread:  any thread.
 */
EPX_API epx_status epx_layout_limit_moves(const epx_counts *counts, const epx_layout *current,
                                          const epx_layout *target, const epx_move_budget *budget,
                                          epx_layout **out, epx_move_report *report,
                                          epx_error *err);

/*
 * Executing a migration.
 *
 * Each rank holds the weights of its own P/G slots of every layer: opaque
 * blocks of expert_bytes, slot s of layer l at
 *   weights + l * layer_stride + s * slot_stride.
 * The layers are moved chunk by chunk. For one chunk every rank
 *   1. checks its inputs (its layout is the plan's current one, staging is
 *      large enough, a loader exists where needed) and sums the checksums of
 *      the blocks it will send, all in one all-reduce: a rank that cannot go
 *      on stops every rank before any weight moves;
 *   2. receives into staging, never into live weights: one all-to-all for
 *      the direct transfers, a second for the relays of the chunk when it
 *      has any; local copies and loads land in staging too;
 *   3. verifies every staged block against the sender's checksum and votes
 *      (one more all-reduce);
 *   4. only when every rank's every block arrived intact, commits: copies
 *      staging into the slots and updates its layout in place
 *      (epx_layout_update on the chunk's layers).
 * A failure anywhere before the commit leaves the old weights and the old
 * layout of that chunk and every later one intact and in service; the error
 * names the transfer (layer, slot, source rank). Earlier chunks stay
 * committed: each layer's weights always match its layout row. With
 * chunk_layers = 0 the whole migration is one chunk, and a failure commits
 * nothing at all.
 */

struct epx_comm; /* epx_comm.h */

/* Loads the weights of an expert no live GPU holds (EPX_MOVE_LOAD) into
 * dst, bytes long, e.g. from the checkpoint. Returns EPX_OK or an error
 * with a message in err. */
typedef epx_status (*epx_expert_load_fn)(void *user, int32_t layer, int32_t expert, void *dst,
                                         size_t bytes, epx_error *err);

typedef struct epx_migrate_exec_opts {
    uint32_t version;        /* EPX_MIGRATE_EXEC_OPTS_VERSION */
    int32_t chunk_layers;    /* layers moved and committed together; 0 = all at once */
    size_t slot_stride;      /* bytes from one slot to the next; 0 = expert_bytes */
    size_t layer_stride;     /* bytes from one layer to the next; 0 = P/G * slot_stride */
    epx_expert_load_fn load; /* needed when this rank has EPX_MOVE_LOAD slots */
    void *load_user;
} epx_migrate_exec_opts;
#define EPX_MIGRATE_EXEC_OPTS_VERSION ((uint32_t)sizeof(epx_migrate_exec_opts))
#define EPX_MIGRATE_EXEC_OPTS_INIT                                                                 \
    { EPX_MIGRATE_EXEC_OPTS_VERSION, 0, 0, 0, NULL, NULL }

/* What one rank did. */
typedef struct epx_migrate_result {
    int32_t layers_committed; /* layers whose weights and layout now match the target */
    uint64_t bytes_sent;      /* to other ranks (epx_migration_rank_bytes' figure) */
    uint64_t bytes_received;  /* from other ranks */
    uint64_t bytes_local;     /* staged by local copies and loads */
    int32_t failed_layer;     /* the transfer that failed: layer, slot, source */
    int32_t failed_slot;      /*   rank (-1 each when nothing failed, or when */
    int32_t failed_source;    /*   the failure was no transfer's, e.g. an input) */
    int32_t failed_rank;      /* the rank that found the failure, or -1 */
} epx_migrate_result;

/*
 * Bytes of staging `gpu` needs for a chunk size (the largest chunk's
 * received and local blocks plus its largest send pack).
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (gpu or chunk_layers out of range);
 *          EPX_ERR_OVERFLOW.
 */
EPX_API epx_status epx_migration_staging_bytes(const epx_migration *mig, int32_t gpu,
                                               int32_t chunk_layers, size_t *bytes, epx_error *err);

/*
 * Run a migration on this rank.
 * Args:    mig (in) the same plan on every rank; comm (in/out) host memory,
 *          size G (rank = GPU; a failed GPU's rank sends and receives
 *          nothing) or the number of live GPUs (rank i = the i-th live GPU);
 *          weights (in/out) this rank's slots, see above (NULL only on a
 *          failed GPU); layout (in/out) this rank's layout in service, equal
 *          to the plan's current layout on the moved layers, updated in
 *          place as chunks commit; staging (scratch) >= staging_bytes from
 *          epx_migration_staging_bytes; opts (in) or NULL for the defaults;
 *          result (out, may be NULL).
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (arguments; a layout that is not the
 *          plan's current one: names layer and slot); EPX_ERR_UNSUPPORTED
 *          (a device communicator: device buffers are not moved yet);
 *          EPX_ERR_COMM (a block failed its checksum on some rank, or the
 *          communicator failed); EPX_ERR_TIMEOUT; the loader's status.
 *          On error nothing of the failed chunk is committed, on any rank.
 * Collective: yes, every rank of comm with the same plan and chunk_layers.
 *          Argument errors found before the first collective return at
 *          once, so the other ranks time out: check inputs first.
 */
EPX_API epx_status epx_migration_execute(const epx_migration *mig, struct epx_comm *comm,
                                         void *weights, epx_layout *layout, void *staging,
                                         size_t staging_bytes, const epx_migrate_exec_opts *opts,
                                         epx_migrate_result *result, epx_error *err);

/*
 * Dispatch around failed GPUs. A plan made with failed_gpus leaves each
 * failed GPU's slots holding copies of live experts (so the layout stays
 * valid and its slots need no weights), with replica weight 0, which
 * weighted dispatch never picks. Static tables and dynamic dispatch read a
 * replica list instead: build it with this function, which drops the slots
 * of failed GPUs, and pass it to epx_dispatch_table_compute (as `replicas`,
 * -1 padding is allowed anywhere) or as a dispatch spec's replicas and
 * num_valid.
 * Args:    layout (in); failed_gpus (in) [G], nonzero = failed, or NULL;
 *          width (in) >= the most live replicas of any expert (the layout's
 *          W = P - E + 1 always suffices);
 *          replicas (out) [L][E][width] live slots ascending, -1 padded;
 *          num_valid (out, may be NULL) [L][E] live replicas per expert.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (width too small: names the least);
 *          EPX_ERR_INVALID_MAP (an expert with no live replica: names layer
 *          and expert; plan with failed_gpus first).
 */
EPX_API epx_status epx_layout_live_replicas(const epx_layout *layout, const uint8_t *failed_gpus,
                                            int32_t width, int32_t *replicas, int32_t *num_valid,
                                            epx_error *err);

/*
 * The 64-bit checksum a migration verifies each expert with: a four-lane
 * multiply-rotate hash of epx's own (about memory speed), seeded, so equal
 * bytes give equal sums on every host (it reads bytes little-endian).
 */
EPX_API uint64_t epx_checksum64(const void *data, size_t bytes, uint64_t seed);

#endif /* EPX_MIGRATE_H */
