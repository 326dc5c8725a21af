/*
 * test_plan_elastic.c - elastic EP in epx's own planner (issue 27 item 3):
 * plans on 1..G-1 survivors of random small shapes, with the layout in
 * service, checked against brute force:
 *   - every expert keeps a live replica and no lost GPU takes tokens;
 *   - the slots kept are the most any hand-out of the planned GPU sets to
 *     the survivors keeps (every permutation of the live GPUs a node may
 *     trade among);
 *   - the migration's bytes (over links, copied on a GPU, loaded) equal a
 *     count made slot by slot from the two maps;
 *   - the repair (a budget of exactly the moves the loss forces) moves one
 *     slot per (layer, expert) that only lost GPUs held, loads each, and
 *     sends nothing over links.
 * The seed is printed (EPX_TEST_SEED reproduces a run).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

enum { MAXG = 6, MAXP = 32, MAXE = 32 };

/* Which GPUs may trade planned sets: the live ones of a node when every
 * node with a survivor has as many, else all live ones (-1: lost). */
static void groups_of(int32_t G, int32_t N, const uint8_t *failed, int32_t *group) {
    const int32_t gpn = G / N;
    int32_t per = -1;
    bool even = true;
    for (int32_t k = 0; k < N; k++) {
        int32_t c = 0;
        for (int32_t g = k * gpn; g < (k + 1) * gpn; g++) c += !failed[g];
        if (c == 0) continue;
        if (per >= 0 && c != per) even = false;
        per = c;
    }
    for (int32_t g = 0; g < G; g++) group[g] = failed[g] ? -1 : even ? g / gpn : 0;
}

/* Slots two expert multisets share: sum_e min(count in a, count in b). */
static int32_t overlap(const int32_t *a, const int32_t *b, int32_t n) {
    int32_t cnt[MAXE] = {0}, k = 0;
    for (int32_t i = 0; i < n; i++) cnt[a[i]]++;
    for (int32_t i = 0; i < n; i++)
        if (cnt[b[i]] > 0) cnt[b[i]]--, k++;
    return k;
}

/* The most slots kept over every permutation of the live GPUs that keeps
 * each in its group: GPU live[i] takes the planned set of GPU live[pi[i]]. */
static int32_t best_kept(const int32_t *old, const int32_t *neu, int32_t spg, const int32_t *live,
                         int32_t n, const int32_t *group, int32_t *pi, int32_t i, bool *used) {
    if (i == n) {
        int32_t k = 0;
        for (int32_t j = 0; j < n; j++)
            k += overlap(old + live[j] * spg, neu + live[pi[j]] * spg, spg);
        return k;
    }
    int32_t best = -1;
    for (int32_t j = 0; j < n; j++) {
        if (used[j] || group[live[j]] != group[live[i]]) continue;
        used[j] = true;
        pi[i] = j;
        int32_t k = best_kept(old, neu, spg, live, n, group, pi, i + 1, used);
        best = k > best ? k : best;
        used[j] = false;
    }
    return best;
}

typedef struct counted {
    int64_t kept, link, local, loaded;
} counted;

/* The migration's slots by kind, counted from the maps alone: a live GPU's
 * changed slots of expert e number max(0, new - old count of e there); if
 * the GPU held e they are local copies, else the first arrives over a link
 * (some live GPU held e) or is loaded (none did), the rest are copied. */
static counted count_moves(const epx_shape *s, const int32_t *old, const int32_t *neu,
                           const uint8_t *failed) {
    const int32_t P = s->num_physical_experts, G = s->num_gpus, spg = P / G;
    counted c = {0, 0, 0, 0};
    for (int32_t l = 0; l < s->num_layers; l++) {
        const int32_t *o = old + (size_t)l * P, *n = neu + (size_t)l * P;
        bool held[MAXE] = {false};
        for (int32_t p = 0; p < P; p++)
            if (!failed[p / spg]) held[o[p]] = true;
        for (int32_t g = 0; g < G; g++) {
            if (failed[g]) continue;
            int32_t co[MAXE] = {0}, cn[MAXE] = {0};
            for (int32_t j = 0; j < spg; j++) co[o[g * spg + j]]++, cn[n[g * spg + j]]++;
            for (int32_t j = 0; j < spg; j++) c.kept += o[g * spg + j] == n[g * spg + j];
            for (int32_t e = 0; e < s->num_logical_experts; e++) {
                int32_t extra = cn[e] - co[e];
                if (extra <= 0) continue;
                if (co[e] > 0) {
                    c.local += extra;
                    continue;
                }
                if (held[e])
                    c.link++;
                else
                    c.loaded++;
                c.local += extra - 1;
            }
        }
    }
    return c;
}

/* (layer, expert) pairs held only on lost GPUs. */
static int64_t orphans(const epx_shape *s, const int32_t *old, const uint8_t *failed) {
    const int32_t P = s->num_physical_experts, spg = P / s->num_gpus;
    int64_t k = 0;
    for (int32_t l = 0; l < s->num_layers; l++) {
        bool held[MAXE] = {false};
        for (int32_t p = 0; p < P; p++)
            if (!failed[p / spg]) held[old[(size_t)l * P + p]] = true;
        for (int32_t e = 0; e < s->num_logical_experts; e++) k += !held[e];
    }
    return k;
}

static void check_migration(const epx_layout *cur, const epx_layout *to, const uint8_t *failed,
                            const counted *want, int32_t live_slots) {
    const size_t B = 1000;
    epx_migrate_opts mo = EPX_MIGRATE_OPTS_INIT;
    mo.expert_bytes = B;
    mo.failed_gpus = failed;
    epx_migration *m = NULL;
    epx_error err = {0};
    assert_int_equal(epx_migration_plan(cur, to, &mo, &m, &err), EPX_OK);
    epx_migration_stats st;
    epx_migration_get_stats(m, &st);
    assert_int_equal(st.slots, live_slots);
    assert_int_equal(st.kept, want->kept);
    assert_int_equal(st.bytes_moved, (uint64_t)want->link * B);
    assert_int_equal(st.bytes_local, (uint64_t)want->local * B);
    assert_int_equal(st.bytes_loaded, (uint64_t)want->loaded * B);
    assert_int_equal(st.received + st.relayed, want->link);
    epx_migration_destroy(m);
}

static void elastic_on_survivors(void **state) {
    (void)state;
    tu_rng r = {tu_seed(2727)};
    int cases = 0, repairs = 0;
    for (int trial = 0; trial < 60; trial++) {
        const int32_t N = trial % 3 == 2 ? 2 : 1;
        const int32_t G = N == 2 ? 4 + 2 * (int32_t)tu_below(&r, 2) : 3 + (int32_t)tu_below(&r, 4);
        const int32_t spg = 2 + (int32_t)tu_below(&r, 3), P = G * spg;
        const int32_t E = 2 + (int32_t)tu_below(&r, (uint32_t)(P - 1)); /* 2..P */
        const int32_t L = 2, S = 2;
        const epx_shape s = {L, E, P, G, N};
        epx_layout *cur = tu_random_layout(&r, L, E, P, G, N, 0);
        const int32_t *old = epx_layout_physical_to_logical(cur);
        epx_counts *c = NULL;
        epx_error err = {0};
        assert_int_equal(epx_counts_create(S, L, E, &c, &err), EPX_OK);
        for (size_t i = 0; i < (size_t)S * L * E; i++)
            c->data[i] = tu_below(&r, 4) == 0 ? 0.0 : (double)tu_below(&r, 1000);
        for (int32_t A = 1; A < G; A++) {
            uint8_t failed[MAXG] = {0};
            for (int32_t k = 0; k < G - A;) {
                int32_t g = (int32_t)tu_below(&r, (uint32_t)G);
                if (!failed[g]) failed[g] = 1, k++;
            }
            for (int a = 0; a < 2; a++) {
                epx_plan_opts o = EPX_PLAN_OPTS_INIT;
                o.algorithm = a ? EPX_ALGO_DEEPSEEK : EPX_ALGO_EPX;
                o.current = cur;
                o.failed_gpus = failed;
                epx_plan *plan = NULL;
                epx_status st = epx_plan_compute(c, &s, &o, &plan, &err);
                if (A * spg < E) {
                    /* the survivors cannot hold every expert */
                    assert_int_equal(st, EPX_ERR_SHAPE);
                    TU_MSG_HAS(err.msg, "do not fit", "surviving GPUs");
                    continue;
                }
                if (st != EPX_OK) fail_msg("G %d P %d E %d A %d: %s", G, P, E, A, err.msg);
                cases++;
                const epx_layout *lay = epx_plan_layout(plan);
                const int32_t *neu = epx_layout_physical_to_logical(lay);
                const double *w = epx_plan_replica_weights(plan);
                for (int32_t l = 0; l < L; l++) {
                    bool live[MAXE] = {false};
                    double sum[MAXE] = {0};
                    for (int32_t p = 0; p < P; p++) {
                        const size_t i = (size_t)l * P + (size_t)p;
                        if (failed[p / spg]) {
                            assert_true(w[i] == 0.0); /* a lost GPU takes no tokens */
                            continue;
                        }
                        live[neu[i]] = true;
                        sum[neu[i]] += w[i];
                    }
                    for (int32_t e = 0; e < E; e++) {
                        assert_true(live[e]);
                        assert_true(sum[e] > 1.0 - 1e-9 && sum[e] < 1.0 + 1e-9);
                    }
                }
                /* kept slots: the best hand-out of the planned sets */
                int32_t group[MAXG], lv[MAXG], n = 0, pi[MAXG];
                bool used[MAXG] = {false};
                groups_of(G, N, failed, group);
                for (int32_t g = 0; g < G; g++)
                    if (!failed[g]) lv[n++] = g;
                int64_t best = 0;
                for (int32_t l = 0; l < L; l++)
                    best += best_kept(old + (size_t)l * P, neu + (size_t)l * P, spg, lv, n, group,
                                      pi, 0, used);
                const counted want = count_moves(&s, old, neu, failed);
                if (want.kept != best)
                    fail_msg("G %d N %d P %d E %d A %d algo %d: %lld slots kept, %lld possible", G,
                             N, P, E, A, a, (long long)want.kept, (long long)best);
                check_migration(cur, lay, failed, &want, L * A * spg);

                /* the repair: exactly the forced moves, each a load */
                if (a == 0) {
                    epx_move_budget b = EPX_MOVE_BUDGET_INIT;
                    b.failed_gpus = failed;
                    epx_move_report rep;
                    epx_layout *all = NULL, *fix = NULL;
                    assert_int_equal(epx_layout_limit_moves(c, cur, lay, &b, &all, &rep, &err),
                                     EPX_OK);
                    const int64_t need = orphans(&s, old, failed);
                    assert_int_equal(rep.moves_required, need);
                    b.max_moves = (int32_t)need;
                    st = epx_layout_limit_moves(c, cur, lay, &b, &fix, &rep, &err);
                    if (st != EPX_OK)
                        fail_msg("repair G %d P %d E %d A %d: %s", G, P, E, A, err.msg);
                    assert_int_equal(rep.moves_made, need);
                    const counted rc =
                        count_moves(&s, old, epx_layout_physical_to_logical(fix), failed);
                    assert_int_equal(rc.loaded, need);
                    assert_int_equal(rc.link, 0);
                    assert_int_equal(rc.local, 0);
                    assert_int_equal(rc.kept, (int64_t)L * A * spg - need);
                    check_migration(cur, fix, failed, &rc, L * A * spg);
                    epx_layout_destroy(all);
                    epx_layout_destroy(fix);
                    repairs++;
                }
                epx_plan_destroy(plan);
            }
        }
        epx_counts_destroy(c);
        epx_layout_destroy(cur);
    }
    /* the random shapes must exercise the planner, not only the refusals */
    assert_true(cases >= 60);
    assert_true(repairs >= 30);
}

/* A plan that fits already is left as it is: with nothing lost and the
 * current layout the plan itself, no slot moves. */
static void matching_keeps_a_fitting_plan(void **state) {
    (void)state;
    tu_rng r = {tu_seed(2728)};
    const epx_shape s = {3, 12, 16, 4, 1};
    epx_counts *c = NULL;
    epx_error err = {0};
    assert_int_equal(epx_counts_create(1, 3, 12, &c, &err), EPX_OK);
    for (size_t i = 0; i < 36; i++) c->data[i] = 1.0 + tu_below(&r, 100);
    epx_plan_opts o = EPX_PLAN_OPTS_INIT;
    epx_plan *p0 = NULL, *p1 = NULL;
    assert_int_equal(epx_plan_compute(c, &s, &o, &p0, &err), EPX_OK);
    o.current = epx_plan_layout(p0);
    assert_int_equal(epx_plan_compute(c, &s, &o, &p1, &err), EPX_OK);
    assert_memory_equal(epx_layout_physical_to_logical(epx_plan_layout(p0)),
                        epx_layout_physical_to_logical(epx_plan_layout(p1)), 48 * sizeof(int32_t));
    epx_plan_destroy(p0);
    epx_plan_destroy(p1);
    epx_counts_destroy(c);
}

/* Lists the planner refuses, each with a sentence. */
static void refusals(void **state) {
    (void)state;
    tu_rng r = {tu_seed(2729)};
    const epx_shape s = {1, 8, 12, 4, 1};
    epx_counts *c = NULL;
    epx_error err = {0};
    assert_int_equal(epx_counts_create(1, 1, 8, &c, &err), EPX_OK);
    for (int i = 0; i < 8; i++) c->data[i] = 1.0 + i;
    epx_layout *cur = tu_random_layout(&r, 1, 8, 12, 4, 1, 0);
    epx_plan_opts o = EPX_PLAN_OPTS_INIT;
    o.current = cur;
    epx_plan *plan = NULL;
    uint8_t all[4] = {1, 1, 1, 1}, two[4] = {0, 1, 1, 0};
    o.failed_gpus = all;
    assert_int_equal(epx_plan_compute(c, &s, &o, &plan, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "all 4 GPUs are marked failed", "at least one must survive");
    o.failed_gpus = two; /* 2 GPUs x 3 slots = 6 < 8 experts */
    assert_int_equal(epx_plan_compute(c, &s, &o, &plan, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "8 logical experts do not fit in the 6 slots of the 2 surviving GPUs",
               "P >= 16");
    assert_null(plan);
    epx_layout_destroy(cur);
    epx_counts_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(elastic_on_survivors),
        cmocka_unit_test(matching_keeps_a_fitting_plan),
        cmocka_unit_test(refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
