/*
 * test_mpi_migrate.c - migrations between real MPI processes.
 *
 *   test_mpi_migrate run              random migrations, then corrupt blocks
 *   test_mpi_migrate kill OUTDIR C    rank 1 dies (SIGKILL) in the middle of
 *                                     a migration moved C layers at a time
 *
 * Every rank builds the same random cases from the same seeds, holds the
 * weights of its own GPU (the bytes of a function of layer and expert), and
 * checks after each migration that every slot holds its new expert's bytes,
 * that its layout is the plan's and that it sent and received what the plan
 * says. In the corrupt phase one rank flips a byte of one block it sends
 * (tests/util/corrupt_comm.h): every rank must refuse to commit and keep its
 * old weights and layout. In kill mode the survivors write OUTDIR/rank.N:
 * "<status> <layers committed> consistent|INCONSISTENT <message>", which
 * tests/mpi/migrate_kill.sh judges; a rank that died cannot report.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "corrupt_comm.h"
#include "epx_comm_mpi.h"

static int failures = 0;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %d: check failed at line %d: ", g_rank, __LINE__);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)
static int g_rank = 0;

static uint64_t mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint32_t below(uint64_t *s, uint32_t n) { return (uint32_t)((*s = mix(*s)) % n); }

static uint8_t byte_of(int32_t layer, int32_t expert, size_t i) {
    return (uint8_t)(mix(((uint64_t)layer << 40) ^ ((uint64_t)expert << 20) ^ (i / 8)) >>
                     (8 * (i % 8)));
}

static int32_t *random_map(uint64_t *s, const epx_shape *sh) {
    const int32_t P = sh->num_physical_experts, E = sh->num_logical_experts;
    int32_t *m = malloc(sizeof *m * (size_t)sh->num_layers * P);
    for (int32_t l = 0; l < sh->num_layers; l++) {
        int32_t *row = m + (size_t)l * P;
        for (int32_t p = 0; p < P; p++) row[p] = p < E ? p : (int32_t)below(s, (uint32_t)E);
        for (int32_t p = P - 1; p > 0; p--) {
            int32_t q = (int32_t)below(s, (uint32_t)p + 1), t = row[p];
            row[p] = row[q];
            row[q] = t;
        }
    }
    return m;
}

typedef struct mcase {
    epx_shape sh;
    int32_t *old_map, *new_map;
    epx_layout *layout; /* this rank's, starts as old */
    epx_migration *mig;
    size_t B;
    unsigned char *w, *stage;
    size_t stage_bytes;
} mcase;

static void fill(const mcase *c, int32_t g, const int32_t *map) {
    const int32_t P = c->sh.num_physical_experts, spg = P / c->sh.num_gpus;
    for (int32_t l = 0; l < c->sh.num_layers; l++)
        for (int32_t s = 0; s < spg; s++)
            for (size_t i = 0; i < c->B; i++)
                c->w[((size_t)l * spg + s) * c->B + i] =
                    byte_of(l, map[(size_t)l * P + (size_t)(g * spg + s)], i);
}

/* Does layer l of this GPU's weights hold `map`'s experts? */
static bool holds(const mcase *c, int32_t g, int32_t l, const int32_t *map) {
    const int32_t P = c->sh.num_physical_experts, spg = P / c->sh.num_gpus;
    for (int32_t s = 0; s < spg; s++)
        for (size_t i = 0; i < c->B; i++)
            if (c->w[((size_t)l * spg + s) * c->B + i] !=
                byte_of(l, map[(size_t)l * P + (size_t)(g * spg + s)], i))
                return false;
    return true;
}

static void make(mcase *c, uint64_t seed, int32_t R, int32_t chunk) {
    memset(c, 0, sizeof *c);
    uint64_t s = seed;
    int32_t N = (R % 2 == 0 && below(&s, 2)) ? 2 : 1;
    int32_t E = 1 + (int32_t)below(&s, 20);
    int32_t spg = (E + R - 1) / R + (int32_t)below(&s, 3);
    c->sh = (epx_shape){1 + (int32_t)below(&s, 4), E, spg * R, R, N};
    c->old_map = random_map(&s, &c->sh);
    c->new_map = random_map(&s, &c->sh);
    c->B = 1 + below(&s, 5000);
    epx_error err = {0};
    epx_layout *tgt = NULL;
    epx_layout_create_from_map(&c->sh, c->old_map, &c->layout, &err);
    epx_layout_create_from_map(&c->sh, c->new_map, &tgt, &err);
    epx_migrate_opts o = EPX_MIGRATE_OPTS_INIT;
    o.expert_bytes = c->B;
    if (epx_migration_plan(c->layout, tgt, &o, &c->mig, &err) != EPX_OK) {
        fprintf(stderr, "rank %d: plan: %s\n", g_rank, err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    epx_layout_destroy(tgt);
    c->w = malloc((size_t)c->sh.num_layers * (size_t)spg * c->B);
    fill(c, g_rank, c->old_map);
    epx_migration_staging_bytes(c->mig, g_rank, chunk, &c->stage_bytes, &err);
    c->stage = malloc(c->stage_bytes ? c->stage_bytes : 1);
}

static void release(mcase *c) {
    epx_layout_destroy(c->layout);
    epx_migration_destroy(c->mig);
    free(c->old_map);
    free(c->new_map);
    free(c->w);
    free(c->stage);
}

/* Layers below `committed` wholly new, the rest wholly old. */
static bool consistent(const mcase *c, int32_t committed) {
    const int32_t P = c->sh.num_physical_experts;
    const int32_t *have = epx_layout_physical_to_logical(c->layout);
    const int32_t *newm = epx_layout_physical_to_logical(epx_migration_layout(c->mig));
    for (int32_t l = 0; l < c->sh.num_layers; l++) {
        const int32_t *want = l < committed ? newm : c->old_map;
        if (memcmp(have + (size_t)l * P, want + (size_t)l * P, sizeof(int32_t) * (size_t)P) != 0)
            return false;
        if (!holds(c, g_rank, l, want)) return false;
    }
    return true;
}

static int run_mode(epx_comm *comm) {
    const int32_t R = epx_comm_size(comm);
    epx_error err = {0};
    uint64_t *sent = calloc((size_t)R, sizeof *sent), *recv = calloc((size_t)R, sizeof *recv);
    for (int iter = 0; iter < 40; iter++) {
        mcase c;
        const int32_t chunk = iter % 3;
        make(&c, 1000 + (uint64_t)iter, R, chunk);
        epx_migrate_exec_opts o = EPX_MIGRATE_EXEC_OPTS_INIT;
        o.chunk_layers = chunk;
        epx_migrate_result res;
        epx_status st = epx_migration_execute(c.mig, comm, c.w, c.layout, c.stage, c.stage_bytes,
                                              &o, &res, &err);
        CHECK(st == EPX_OK, "case %d: %s", iter, err.msg);
        CHECK(consistent(&c, c.sh.num_layers), "case %d: slots or layout wrong after commit", iter);
        epx_migration_rank_bytes(c.mig, sent, recv);
        CHECK(res.bytes_sent == sent[g_rank] && res.bytes_received == recv[g_rank],
              "case %d: sent %llu received %llu, plan %llu %llu", iter,
              (unsigned long long)res.bytes_sent, (unsigned long long)res.bytes_received,
              (unsigned long long)sent[g_rank], (unsigned long long)recv[g_rank]);
        release(&c);
    }
    /* corrupt phase: rank (iter % R) corrupts its first block that exists */
    int corrupt_cases = 0;
    for (int iter = 0; iter < 40; iter++) {
        mcase c;
        make(&c, 5000 + (uint64_t)iter, R, 0);
        epx_migration_rank_bytes(c.mig, sent, NULL);
        const int32_t bad = iter % R;
        if (sent[bad] == 0) {
            release(&c);
            continue;
        }
        corrupt_cases++;
        cc_state cs = {comm, 1 + (int64_t)(iter % (int)(sent[bad] / c.B)), 0};
        epx_comm *use = comm, *wrap = NULL;
        if (g_rank == bad) use = wrap = cc_wrap(&cs);
        epx_migrate_result res;
        epx_status st = epx_migration_execute(c.mig, use, c.w, c.layout, c.stage, c.stage_bytes,
                                              NULL, &res, &err);
        CHECK(st == EPX_ERR_COMM, "corrupt case %d: returned %s (%s)", iter, epx_status_str(st),
              err.msg);
        CHECK(strstr(err.msg, "not committed") != NULL, "corrupt case %d: message '%s'", iter,
              err.msg);
        CHECK(res.failed_layer >= 0 && res.failed_slot >= 0 && res.failed_source >= 0,
              "corrupt case %d: the failed transfer is not named", iter);
        CHECK(consistent(&c, 0), "corrupt case %d: old weights or layout changed", iter);
        CHECK(res.layers_committed == 0, "corrupt case %d: committed %d", iter,
              res.layers_committed);
        epx_comm_destroy(wrap);
        release(&c);
    }
    CHECK(corrupt_cases >= 20, "only %d corrupt cases", corrupt_cases);
    free(sent);
    free(recv);
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0) printf("%s: %d failures over %d ranks\n", total ? "FAIL" : "ok", total, R);
    return total ? 1 : 0;
}

/* A backend over MPI that kills this process at its n-th all-to-all. */
typedef struct dying {
    epx_comm *inner;
    int calls, at;
} dying;
static epx_status d_alltoallv(void *ctx, const void *send, const int64_t *sc, const int64_t *sd,
                              void *recv, const int64_t *rc, const int64_t *rd, size_t eb,
                              epx_error *err) {
    dying *d = ctx;
    if (++d->calls == d->at) raise(SIGKILL);
    return epx_comm_alltoallv(d->inner, send, sc, sd, recv, rc, rd, eb, err);
}
static epx_status d_allreduce(void *ctx, const void *s, void *r, int64_t n, epx_dtype t,
                              epx_error *err) {
    return epx_comm_allreduce_sum(((dying *)ctx)->inner, s, r, n, t, err);
}
static epx_status d_barrier(void *ctx, epx_error *err) {
    return epx_comm_barrier(((dying *)ctx)->inner, err);
}

static int kill_mode(epx_comm *comm, const char *outdir, int32_t chunk) {
    const int32_t R = epx_comm_size(comm);
    /* a case where rank 1 sends in every layer, so its death stops every chunk */
    mcase c;
    uint64_t seed = 77;
    for (;; seed++) {
        make(&c, seed, R, chunk);
        bool ok = c.sh.num_layers >= 3 && c.sh.num_nodes == 1;
        const int32_t P = c.sh.num_physical_experts, spg = P / R;
        for (int32_t l = 0; l < c.sh.num_layers && ok; l++) {
            bool sends = false;
            for (int32_t p = 0; p < P; p++) {
                const size_t i = (size_t)l * P + p;
                sends |= epx_migration_kinds(c.mig)[i] == EPX_MOVE_RECV &&
                         epx_migration_sources(c.mig)[i] / spg == 1;
            }
            ok = sends;
        }
        if (ok) break;
        release(&c);
    }
    /* rank 1 dies in the exchange of the second chunk (or of the only one) */
    dying d = {comm, 0, chunk > 0 ? 2 : 1};
    static const epx_comm_ops ops = {EPX_COMM_OPS_VERSION,
                                     "dying",
                                     EPX_COMM_MEMORY_HOST,
                                     d_alltoallv,
                                     d_allreduce,
                                     d_barrier,
                                     NULL,
                                     NULL,
                                     NULL};
    epx_comm *use = comm;
    epx_error err = {0};
    if (g_rank == 1 && epx_comm_create(&ops, &d, 1, R, &use, &err) != EPX_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);
    epx_migrate_exec_opts o = EPX_MIGRATE_EXEC_OPTS_INIT;
    o.chunk_layers = chunk;
    epx_migrate_result res;
    epx_status st =
        epx_migration_execute(c.mig, use, c.w, c.layout, c.stage, c.stage_bytes, &o, &res, &err);
    const bool ok = consistent(&c, res.layers_committed);
    char path[4096];
    snprintf(path, sizeof path, "%s/rank.%d", outdir, g_rank);
    FILE *f = fopen(path, "w");
    if (f != NULL) {
        fprintf(f, "%s %d %s %s\n", epx_status_str(st), res.layers_committed,
                ok ? "consistent" : "INCONSISTENT", err.msg);
        fclose(f);
    }
    fprintf(stderr, "rank %d: %s, %d layers committed, %s: %s\n", g_rank, epx_status_str(st),
            res.layers_committed, ok ? "consistent" : "INCONSISTENT", err.msg);
    _exit(0); /* MPI_Finalize could wait for the dead rank */
}

int main(int argc, char **argv) {
    const bool kill = argc == 4 && strcmp(argv[1], "kill") == 0;
    if (!kill && !(argc == 2 && strcmp(argv[1], "run") == 0)) {
        fprintf(stderr, "usage: test_mpi_migrate run | kill OUTDIR CHUNK_LAYERS\n");
        return 2;
    }
    MPI_Init(&argc, &argv);
    epx_comm_mpi_opts mo = EPX_COMM_MPI_OPTS_INIT;
    mo.timeout_ms = kill ? 2000 : 20000;
    epx_comm *comm = NULL;
    epx_error err = {0};
    if (epx_comm_mpi_create(MPI_COMM_WORLD, &mo, &comm, &err) != EPX_OK) {
        fprintf(stderr, "%s\n", err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    g_rank = epx_comm_rank(comm);
    int rc = kill ? kill_mode(comm, argv[2], atoi(argv[3])) : run_mode(comm);
    epx_comm_destroy(comm);
    MPI_Finalize();
    return rc;
}
