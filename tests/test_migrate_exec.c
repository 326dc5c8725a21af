/*
 * test_migrate_exec.c - running migrations over a communicator, ranks as
 * threads (tests/util/thread_comm.h), so it also runs under ASan.
 *
 * Every slot's weights are the bytes of a function of (layer, expert), so
 * after a migration each slot must hold exactly its new expert's bytes, and
 * the padding between slots must be untouched. Faults: a backend wrapper
 * (tests/util/corrupt_comm.h) that corrupts the n-th block a rank sends
 * (the receiver's checksum must
 * catch it and no rank may commit), epx_comm_create_faulty (a collective
 * fails on one rank, the others time out), and bad inputs on one rank.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "migrate_maps.h"
#include "corrupt_comm.h"
#include "thread_comm.h"

#define PAD 0xAB
#define TIMEOUT_MS 200

static uint8_t byte_of(uint64_t seed, int32_t layer, int32_t expert, size_t i) {
    uint64_t z = seed ^ ((uint64_t)layer << 40) ^ ((uint64_t)expert << 20) ^ (uint64_t)(i / 8);
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (uint8_t)(z >> (8 * (i % 8)));
}

typedef struct rank_state {
    unsigned char *weights, *staging;
    size_t staging_bytes;
    epx_layout *layout;
    epx_status st;
    epx_error err;
    epx_migrate_result res;
} rank_state;

typedef struct scenario {
    epx_shape shape;
    const int32_t *old_map;
    const epx_migration *mig;
    const uint8_t *failed;
    size_t B, slot_stride, layer_stride;
    uint64_t seed;
    int32_t chunk_layers;
    int32_t comm_size; /* G, or the live GPUs */
    rank_state rs[16];
    /* faults */
    int32_t corrupt_rank; /* -1 = none */
    int64_t corrupt_nth;  /* 1-based block index among the rank's sends */
    int32_t faulty_rank;  /* -1 = none */
    int64_t faulty_at;
    int32_t bad_input_rank;     /* -1 = none: this rank gets a wrong layout */
    int32_t small_staging_rank; /* -1 = none */
} scenario;

static int32_t gpu_of(const scenario *sc, int32_t rank) {
    if (sc->comm_size == sc->shape.num_gpus) return rank;
    for (int32_t g = 0, r = 0; g < sc->shape.num_gpus; g++)
        if (!sc->failed || !sc->failed[g]) {
            if (r == rank) return g;
            r++;
        }
    return -1;
}

static unsigned char *slot_at(const scenario *sc, unsigned char *w, int32_t l, int32_t s) {
    return w + (size_t)l * sc->layer_stride + (size_t)s * sc->slot_stride;
}

static size_t weights_bytes(const scenario *sc) {
    return (size_t)sc->shape.num_layers * sc->layer_stride;
}

/* Fill a GPU's weights with the experts of `map` and the padding. */
static unsigned char *make_weights(const scenario *sc, int32_t g, const int32_t *map) {
    const int32_t P = sc->shape.num_physical_experts, spg = P / sc->shape.num_gpus;
    unsigned char *w = malloc(weights_bytes(sc));
    memset(w, PAD, weights_bytes(sc));
    for (int32_t l = 0; l < sc->shape.num_layers; l++)
        for (int32_t s = 0; s < spg; s++) {
            unsigned char *b = slot_at(sc, w, l, s);
            int32_t e = map[(size_t)l * P + (size_t)(g * spg + s)];
            for (size_t i = 0; i < sc->B; i++) b[i] = byte_of(sc->seed, l, e, i);
        }
    return w;
}

/* Layers of a GPU's weights equal to `map` (all bytes and padding). */
static bool layer_holds(const scenario *sc, int32_t g, const unsigned char *w, int32_t l,
                        const int32_t *map) {
    const int32_t P = sc->shape.num_physical_experts, spg = P / sc->shape.num_gpus;
    for (int32_t s = 0; s < spg; s++) {
        const unsigned char *b = w + (size_t)l * sc->layer_stride + (size_t)s * sc->slot_stride;
        int32_t e = map[(size_t)l * P + (size_t)(g * spg + s)];
        for (size_t i = 0; i < sc->B; i++)
            if (b[i] != byte_of(sc->seed, l, e, i)) return false;
        for (size_t i = sc->B; i < sc->slot_stride && s + 1 < spg; i++)
            if (b[i] != PAD) return false;
    }
    return true;
}

static epx_status loader(void *user, int32_t layer, int32_t expert, void *dst, size_t bytes,
                         epx_error *err) {
    (void)err;
    const scenario *sc = user;
    for (size_t i = 0; i < bytes; i++) ((uint8_t *)dst)[i] = byte_of(sc->seed, layer, expert, i);
    return EPX_OK;
}

static void run_rank(epx_comm *comm, void *arg) {
    scenario *sc = arg;
    const int32_t rank = epx_comm_rank(comm);
    rank_state *rs = &sc->rs[rank];
    epx_comm *use = comm, *wrap = NULL;
    cc_state cc = {comm, 0, 0};
    epx_error e0 = {0};
    /* no cmocka assertions on these threads (they longjmp): report instead */
    epx_status wst = EPX_OK;
    if (rank == sc->corrupt_rank) {
        cc.nth = sc->corrupt_nth;
        wrap = cc_wrap(&cc);
        if (wrap == NULL) wst = EPX_ERR_INTERNAL;
        use = wrap;
    } else if (rank == sc->faulty_rank) {
        wst = epx_comm_create_faulty(comm, sc->faulty_at, &wrap, &e0);
        use = wrap;
    }
    if (wst != EPX_OK) {
        rs->st = EPX_ERR_INTERNAL;
        rs->err = e0;
        return;
    }
    epx_migrate_exec_opts o = EPX_MIGRATE_EXEC_OPTS_INIT;
    o.chunk_layers = sc->chunk_layers;
    o.slot_stride = sc->slot_stride;
    o.layer_stride = sc->layer_stride;
    o.load = loader;
    o.load_user = sc;
    size_t staging = rs->staging_bytes;
    if (rank == sc->small_staging_rank && staging > 0) staging--;
    rs->st = epx_migration_execute(sc->mig, use, rs->weights, rs->layout, rs->staging, staging, &o,
                                   &rs->res, &rs->err);
    epx_comm_destroy(wrap);
}

/* Set up the ranks, run, and return the scenario's outcome in sc->rs. */
static void run(scenario *sc) {
    const int32_t R = sc->comm_size;
    epx_error err = {0};
    for (int32_t r = 0; r < R; r++) {
        rank_state *rs = &sc->rs[r];
        const int32_t g = gpu_of(sc, r);
        rs->weights = make_weights(sc, g, sc->old_map);
        assert_int_equal(
            epx_migration_staging_bytes(sc->mig, g, sc->chunk_layers, &rs->staging_bytes, &err),
            EPX_OK);
        rs->staging = malloc(rs->staging_bytes ? rs->staging_bytes : 1);
        int32_t *map = malloc(sizeof *map * (size_t)sc->shape.num_layers *
                              (size_t)sc->shape.num_physical_experts);
        memcpy(map, sc->old_map,
               sizeof *map * (size_t)sc->shape.num_layers * (size_t)sc->shape.num_physical_experts);
        if (r == sc->bad_input_rank) {
            /* swap two slots of the last layer: a layout the plan does not start from */
            int32_t *row =
                map + (size_t)(sc->shape.num_layers - 1) * sc->shape.num_physical_experts;
            int32_t t = row[0];
            for (int32_t p = 1; p < sc->shape.num_physical_experts; p++)
                if (row[p] != t) {
                    row[0] = row[p];
                    row[p] = t;
                    break;
                }
        }
        assert_int_equal(epx_layout_create_from_map(&sc->shape, map, &rs->layout, &err), EPX_OK);
        free(map);
    }
    tc_run_timed(R, run_rank, sc, TIMEOUT_MS);
}

static void release(scenario *sc) {
    for (int32_t r = 0; r < sc->comm_size; r++) {
        free(sc->rs[r].weights);
        free(sc->rs[r].staging);
        epx_layout_destroy(sc->rs[r].layout);
    }
    memset(sc->rs, 0, sizeof sc->rs);
}

/* Rank r: the layers it reports committed are wholly new (layout row and
 * bytes), every later one wholly old. */
static void check_consistent(const scenario *sc, int32_t r) {
    const int32_t *newm = epx_layout_physical_to_logical(epx_migration_layout(sc->mig));
    const int32_t *have = epx_layout_physical_to_logical(sc->rs[r].layout);
    const int32_t P = sc->shape.num_physical_experts, g = gpu_of(sc, r);
    const bool dead = sc->failed && sc->failed[g];
    const int32_t committed = sc->rs[r].res.layers_committed;
    assert_true(committed >= 0 && committed <= sc->shape.num_layers);
    for (int32_t l = 0; l < sc->shape.num_layers; l++) {
        const int32_t *want = l < committed ? newm : sc->old_map;
        assert_memory_equal(have + (size_t)l * P, want + (size_t)l * P, P * sizeof(int32_t));
        if (!dead) assert_true(layer_holds(sc, g, sc->rs[r].weights, l, want));
    }
}

/* A random case: shape, maps, failed GPUs, plan, layout of the weights. */
typedef struct rcase {
    epx_shape s;
    int32_t *a, *b;
    uint8_t failed[16];
    bool any_failed;
    epx_migration *m;
} rcase;

static void make_case(tu_rng *r, rcase *c, bool allow_failed) {
    memset(c, 0, sizeof *c);
    int32_t N = 1 + (int32_t)tu_below(r, 2);
    int32_t G = N * (1 + (int32_t)tu_below(r, 3));
    if (G < 2) G = 2, N = 1;
    int32_t E = 1 + (int32_t)tu_below(r, 12);
    int32_t spg = (E + G - 1) / G + (int32_t)tu_below(r, 3);
    c->s = (epx_shape){1 + (int32_t)tu_below(r, 4), E, spg * G, G, N};
    c->a = mm_random_map(r, &c->s);
    c->b = mm_random_map(r, &c->s);
    if (allow_failed && tu_below(r, 3) == 0) {
        c->failed[tu_below(r, (uint32_t)G)] = 1;
        /* the target keeps every expert live, as a plan around the loss does */
        c->any_failed = mm_keep_live(&c->s, c->b, c->failed);
        if (!c->any_failed) memset(c->failed, 0, sizeof c->failed);
    }
    epx_migrate_opts o = EPX_MIGRATE_OPTS_INIT;
    o.expert_bytes = 1 + tu_below(r, 300);
    o.relay = (int32_t)tu_below(r, 2);
    o.failed_gpus = c->any_failed ? c->failed : NULL;
    epx_layout *x = NULL, *y = NULL;
    epx_error err = {0};
    assert_int_equal(epx_layout_create_from_map(&c->s, c->a, &x, &err), EPX_OK);
    assert_int_equal(epx_layout_create_from_map(&c->s, c->b, &y, &err), EPX_OK);
    assert_int_equal(epx_migration_plan(x, y, &o, &c->m, &err), EPX_OK);
    epx_layout_destroy(x);
    epx_layout_destroy(y);
}

static void free_case(rcase *c) {
    epx_migration_destroy(c->m);
    free(c->a);
    free(c->b);
}

static void scenario_of(scenario *sc, const rcase *c, tu_rng *r) {
    memset(sc, 0, sizeof *sc);
    epx_migration_stats st;
    epx_migration_get_stats(c->m, &st);
    sc->shape = c->s;
    sc->old_map = c->a;
    sc->mig = c->m;
    sc->failed = c->any_failed ? c->failed : NULL;
    sc->B = st.expert_bytes;
    sc->slot_stride = sc->B + tu_below(r, 3) * 8;
    const int32_t spg = c->s.num_physical_experts / c->s.num_gpus;
    sc->layer_stride = (size_t)spg * sc->slot_stride + tu_below(r, 2) * 16;
    sc->seed = tu_next(r);
    sc->chunk_layers = (int32_t)tu_below(r, (uint32_t)c->s.num_layers + 1);
    sc->comm_size = c->s.num_gpus;
    if (c->any_failed && tu_below(r, 2)) sc->comm_size = c->s.num_gpus - 1;
    sc->corrupt_rank = sc->faulty_rank = sc->bad_input_rank = sc->small_staging_rank = -1;
}

/* Random migrations: every slot ends with its new expert's bytes, the
 * layouts are the plan's, and the bytes sent are the plan's. */
static void migrations_commit(void **state) {
    (void)state;
    tu_rng r = {tu_seed(101)};
    for (int iter = 0; iter < 120; iter++) {
        rcase c;
        make_case(&r, &c, true);
        scenario sc;
        scenario_of(&sc, &c, &r);
        run(&sc);
        const int32_t G = c.s.num_gpus;
        uint64_t *sent = calloc((size_t)G, sizeof *sent), *recv = calloc((size_t)G, sizeof *recv);
        epx_migration_rank_bytes(c.m, sent, recv);
        for (int32_t k = 0; k < sc.comm_size; k++) {
            rank_state *rs = &sc.rs[k];
            if (rs->st != EPX_OK) fail_msg("rank %d: %s", k, rs->err.msg);
            assert_int_equal(rs->res.layers_committed, c.s.num_layers);
            check_consistent(&sc, k);
            const int32_t g = gpu_of(&sc, k);
            assert_int_equal(rs->res.bytes_sent, sent[g]);
            assert_int_equal(rs->res.bytes_received, recv[g]);
            assert_int_equal(rs->res.failed_layer, -1);
        }
        free(sent);
        free(recv);
        release(&sc);
        free_case(&c);
    }
}

static void assert_all_old(const scenario *sc) {
    for (int32_t k = 0; k < sc->comm_size; k++) {
        const int32_t g = gpu_of(sc, k);
        assert_memory_equal(epx_layout_physical_to_logical(sc->rs[k].layout), sc->old_map,
                            sizeof(int32_t) * (size_t)sc->shape.num_layers *
                                (size_t)sc->shape.num_physical_experts);
        if (!(sc->failed && sc->failed[g]))
            for (int32_t l = 0; l < sc->shape.num_layers; l++)
                assert_true(layer_holds(sc, g, sc->rs[k].weights, l, sc->old_map));
        assert_int_equal(sc->rs[k].res.layers_committed, 0);
    }
}

/* One rank corrupts the n-th block it sends: every rank refuses to commit,
 * names the same transfer, and keeps its old weights and layout. */
static void corrupt_block_commits_nothing(void **state) {
    (void)state;
    tu_rng r = {tu_seed(102)};
    int done = 0;
    for (int iter = 0; iter < 400 && done < 60; iter++) {
        rcase c;
        make_case(&r, &c, true);
        uint64_t *sent = calloc((size_t)c.s.num_gpus, sizeof *sent);
        epx_migration_rank_bytes(c.m, sent, NULL);
        epx_migration_stats st;
        epx_migration_get_stats(c.m, &st);
        scenario sc;
        scenario_of(&sc, &c, &r);
        sc.chunk_layers = 0;
        int32_t k = -1;
        for (int32_t t = 0; t < sc.comm_size && k < 0; t++) {
            int32_t q = (int32_t)tu_below(&r, (uint32_t)sc.comm_size);
            if (sent[gpu_of(&sc, q)] > 0) k = q;
        }
        if (k < 0) {
            free(sent);
            free_case(&c);
            continue;
        }
        sc.corrupt_rank = k;
        sc.corrupt_nth = 1 + tu_below(&r, (uint32_t)(sent[gpu_of(&sc, k)] / st.expert_bytes));
        run(&sc);
        const epx_migrate_result *first = &sc.rs[0].res;
        for (int32_t q = 0; q < sc.comm_size; q++) {
            const rank_state *rs = &sc.rs[q];
            assert_int_equal(rs->st, EPX_ERR_COMM);
            TU_MSG_HAS(rs->err.msg, "not committed", "checksum");
            assert_int_equal(rs->res.failed_layer, first->failed_layer);
            assert_int_equal(rs->res.failed_slot, first->failed_slot);
            assert_int_equal(rs->res.failed_source, first->failed_source);
            assert_int_equal(rs->res.failed_rank, first->failed_rank);
        }
        /* the named transfer came from the corrupting rank, or relays what it sent */
        const int32_t P = c.s.num_physical_experts, spg = P / c.s.num_gpus;
        const int32_t l = first->failed_layer, p = first->failed_slot;
        assert_true(l >= 0 && p >= 0);
        const uint8_t kind = epx_migration_kinds(c.m)[(size_t)l * P + p];
        const int32_t src = epx_migration_sources(c.m)[(size_t)l * P + p];
        assert_true(kind == EPX_MOVE_RECV || kind == EPX_MOVE_RELAY);
        if (kind == EPX_MOVE_RECV) {
            assert_int_equal(gpu_of(&sc, first->failed_source), src / spg);
            assert_int_equal(first->failed_source, k);
        } else {
            const int32_t origin = epx_migration_sources(c.m)[(size_t)l * P + src];
            assert_true(first->failed_source == k || gpu_of(&sc, k) == origin / spg);
        }
        assert_all_old(&sc);
        release(&sc);
        free(sent);
        free_case(&c);
        done++;
    }
    assert_int_equal(done, 60);
}

/* A collective fails on one rank (the others time out): with chunk_layers
 * 0 nothing commits anywhere; with chunks, every layer on every rank is
 * wholly old or wholly new, and no rank commits a chunk another refused. */
static void failed_collective(void **state) {
    (void)state;
    tu_rng r = {tu_seed(103)};
    for (int iter = 0; iter < 24; iter++) {
        rcase c;
        make_case(&r, &c, false);
        scenario sc;
        scenario_of(&sc, &c, &r);
        if (iter % 2 == 0) sc.chunk_layers = 0;
        sc.faulty_rank = (int32_t)tu_below(&r, (uint32_t)sc.comm_size);
        /* 2 to 4 collectives per chunk */
        const int32_t chunks =
            sc.chunk_layers ? (c.s.num_layers + sc.chunk_layers - 1) / sc.chunk_layers : 1;
        sc.faulty_at = 1 + tu_below(&r, (uint32_t)(3 * chunks));
        run(&sc);
        int32_t failed_chunks_start = -1;
        for (int32_t q = 0; q < sc.comm_size; q++) {
            check_consistent(&sc, q);
            const int32_t committed = sc.rs[q].res.layers_committed;
            if (sc.rs[q].st == EPX_OK) {
                assert_int_equal(committed, c.s.num_layers);
            } else {
                assert_true(sc.rs[q].st == EPX_ERR_COMM || sc.rs[q].st == EPX_ERR_TIMEOUT);
                TU_MSG_HAS(sc.rs[q].err.msg, "layers");
            }
            if (q == sc.faulty_rank) failed_chunks_start = committed;
        }
        if (sc.chunk_layers == 0) {
            /* the faulty rank failed in the only chunk unless all its calls came first */
            if (sc.rs[sc.faulty_rank].st != EPX_OK) assert_all_old(&sc);
        }
        /* no rank is ahead of the faulty one by more than the chunk in flight */
        for (int32_t q = 0; q < sc.comm_size; q++)
            if (sc.rs[sc.faulty_rank].st != EPX_OK)
                assert_true(sc.rs[q].res.layers_committed <= failed_chunks_start);
        release(&sc);
        free_case(&c);
    }
}

/* One rank's inputs are wrong: it says why, the others say who, nobody
 * moves anything. */
static void bad_inputs_move_nothing(void **state) {
    (void)state;
    tu_rng r = {tu_seed(104)};
    for (int iter = 0; iter < 20; iter++) {
        rcase c;
        make_case(&r, &c, false);
        scenario sc;
        scenario_of(&sc, &c, &r);
        sc.chunk_layers = 0;
        int32_t k = (int32_t)tu_below(&r, (uint32_t)sc.comm_size);
        bool layout_case = iter % 2 == 0;
        if (layout_case) {
            sc.bad_input_rank = k;
        } else {
            size_t need = 0;
            epx_error err = {0};
            assert_int_equal(epx_migration_staging_bytes(c.m, gpu_of(&sc, k), 0, &need, &err),
                             EPX_OK);
            if (need == 0) {
                free_case(&c);
                continue;
            }
            sc.small_staging_rank = k;
        }
        /* a swap can leave a layer identical when every slot holds one expert */
        bool differs = true;
        if (layout_case) {
            const int32_t P = c.s.num_physical_experts;
            const int32_t *row = c.a + (size_t)(c.s.num_layers - 1) * P;
            differs = false;
            for (int32_t p = 1; p < P; p++) differs |= row[p] != row[0];
        }
        if (!differs) {
            free_case(&c);
            continue;
        }
        run(&sc);
        for (int32_t q = 0; q < sc.comm_size; q++) {
            assert_int_equal(sc.rs[q].st, EPX_ERR_INVALID_ARG);
            assert_int_equal(sc.rs[q].res.failed_rank, k);
            if (q == k)
                TU_MSG_HAS(sc.rs[q].err.msg, layout_case ? "plan starts from" : "staging");
            else
                TU_MSG_HAS(sc.rs[q].err.msg, "refused its inputs", "nothing moved");
            assert_int_equal(sc.rs[q].res.bytes_sent, 0);
        }
        for (int32_t q = 0; q < sc.comm_size; q++) {
            const int32_t g = gpu_of(&sc, q);
            for (int32_t l = 0; l < c.s.num_layers; l++)
                assert_true(layer_holds(&sc, g, sc.rs[q].weights, l, c.a));
        }
        release(&sc);
        free_case(&c);
    }
}

static epx_status dev_alltoallv(void *ctx, const void *send, const int64_t *sc, const int64_t *sd,
                                void *recv, const int64_t *rc, const int64_t *rd, size_t eb,
                                epx_error *err) {
    (void)ctx, (void)send, (void)sc, (void)sd, (void)recv, (void)rc, (void)rd, (void)eb, (void)err;
    return EPX_OK;
}
static epx_status dev_allreduce(void *ctx, const void *s, void *r, int64_t n, epx_dtype t,
                                epx_error *err) {
    (void)ctx, (void)s, (void)r, (void)n, (void)t, (void)err;
    return EPX_OK;
}
static epx_status dev_simple(void *ctx, epx_error *err) {
    (void)ctx, (void)err;
    return EPX_OK;
}

static void argument_errors(void **state) {
    (void)state;
    epx_shape s = {2, 4, 8, 2, 1};
    epx_layout *a = NULL;
    epx_error err = {0};
    assert_int_equal(epx_layout_create_trivial(&s, &a, &err), EPX_OK);
    epx_migrate_opts mo = EPX_MIGRATE_OPTS_INIT;
    mo.expert_bytes = 16;
    epx_migration *m = NULL;
    assert_int_equal(epx_migration_plan(a, a, &mo, &m, &err), EPX_OK);
    epx_comm *local = NULL;
    assert_int_equal(epx_comm_create_local(&local, &err), EPX_OK);
    /* a one-rank communicator for a two-GPU plan */
    unsigned char w[2 * 4 * 16];
    assert_int_equal(epx_migration_execute(m, local, w, a, NULL, 0, NULL, NULL, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "1 ranks", "2 GPUs");
    epx_migrate_exec_opts o = EPX_MIGRATE_EXEC_OPTS_INIT;
    o.slot_stride = 8;
    assert_int_equal(epx_migration_execute(m, local, w, a, NULL, 0, &o, NULL, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "slot_stride (8)", "expert_bytes (16)");
    o.slot_stride = 0;
    o.chunk_layers = -1;
    assert_int_equal(epx_migration_execute(m, local, w, a, NULL, 0, &o, NULL, &err),
                     EPX_ERR_INVALID_ARG);
    size_t bytes = 0;
    assert_int_equal(epx_migration_staging_bytes(m, 2, 0, &bytes, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "gpu (2)");
    static const epx_comm_ops dev = {EPX_COMM_OPS_VERSION, "fake-device", EPX_COMM_MEMORY_DEVICE,
                                     dev_alltoallv,        dev_allreduce, dev_simple,
                                     dev_simple,           NULL,          NULL};
    epx_comm *dc = NULL;
    assert_int_equal(epx_comm_create(&dev, NULL, 0, 2, &dc, &err), EPX_OK);
    assert_int_equal(epx_migration_execute(m, dc, w, a, NULL, 0, NULL, NULL, &err),
                     EPX_ERR_UNSUPPORTED);
    TU_MSG_HAS(err.msg, "fake-device", "host buffers");
    epx_comm_destroy(dc);
    epx_comm_destroy(local);
    epx_migration_destroy(m);

    /* one GPU, one rank: a local reshuffle through the local communicator */
    epx_shape s1 = {1, 3, 4, 1, 1};
    const int32_t m0[4] = {0, 1, 2, 2}, m1[4] = {1, 1, 0, 2};
    epx_layout *x = NULL, *y = NULL;
    assert_int_equal(epx_layout_create_from_map(&s1, m0, &x, &err), EPX_OK);
    assert_int_equal(epx_layout_create_from_map(&s1, m1, &y, &err), EPX_OK);
    mo.expert_bytes = 5;
    assert_int_equal(epx_migration_plan(x, y, &mo, &m, &err), EPX_OK);
    unsigned char w1[20];
    for (int p = 0; p < 4; p++) memset(w1 + 5 * p, 'a' + m0[p], 5);
    assert_int_equal(epx_migration_staging_bytes(m, 0, 0, &bytes, &err), EPX_OK);
    unsigned char *stage = malloc(bytes);
    assert_int_equal(epx_comm_create_local(&local, &err), EPX_OK);
    epx_migrate_result res;
    assert_int_equal(epx_migration_execute(m, local, w1, x, stage, bytes, NULL, &res, &err),
                     EPX_OK);
    const int32_t *now = epx_layout_physical_to_logical(x);
    for (int p = 0; p < 4; p++)
        for (int i = 0; i < 5; i++) assert_int_equal(w1[5 * p + i], 'a' + now[p]);
    assert_int_equal(res.bytes_sent, 0);
    assert_true(res.bytes_local > 0);
    /* the same plan again: the layout is no longer the plan's start */
    assert_int_equal(epx_migration_execute(m, local, w1, x, stage, bytes, NULL, &res, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "plan starts from");
    free(stage);
    epx_comm_destroy(local);
    epx_migration_destroy(m);
    epx_layout_destroy(x);
    epx_layout_destroy(y);
    epx_layout_destroy(a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(migrations_commit), cmocka_unit_test(corrupt_block_commits_nothing),
        cmocka_unit_test(failed_collective), cmocka_unit_test(bad_inputs_move_nothing),
        cmocka_unit_test(argument_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
