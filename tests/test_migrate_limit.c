/*
 * test_migrate_limit.c - planning with the cost of moving, without MPI:
 * epx_layout_limit_moves against exhaustive search on tiny cases, its
 * budget and report on random ones, move_price, failed GPUs, and the
 * planner hook (epxi_plan_constrained) driven by a small reference placer.
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "../src/plan/constrain.h"

/* ---- references ------------------------------------------------------------ */

/* Balancedness of one layer, straight from the definition. */
static double ref_layer_balance(const epx_shape *s, const int32_t *row, const double *load,
                                const uint8_t *failed) {
    const int32_t P = s->num_physical_experts, G = s->num_gpus, spg = P / G;
    double gpu[64] = {0}, total = 0, mx = 0;
    int cnt[256] = {0}, live = 0;
    for (int32_t p = 0; p < P; p++)
        if (!failed || !failed[p / spg]) cnt[row[p]]++;
    for (int32_t p = 0; p < P; p++)
        if (!failed || !failed[p / spg]) gpu[p / spg] += load[row[p]] / cnt[row[p]];
    for (int32_t g = 0; g < G; g++) {
        if (failed && failed[g]) continue;
        live++;
        total += gpu[g];
        if (gpu[g] > mx) mx = gpu[g];
    }
    return mx > 0 ? total / live / mx : 1.0;
}

static double ref_balance(const epx_shape *s, const int32_t *map, const double *load,
                          const uint8_t *failed) {
    double sum = 0;
    int n = 0;
    for (int32_t l = 0; l < s->num_layers; l++) {
        const double *ld = load + (size_t)l * s->num_logical_experts;
        double t = 0;
        for (int32_t e = 0; e < s->num_logical_experts; e++) t += ld[e];
        if (t <= 0) continue;
        sum += ref_layer_balance(s, map + (size_t)l * s->num_physical_experts, ld, failed);
        n++;
    }
    return n ? sum / n : 1.0;
}

static bool live_cover(const epx_shape *s, const int32_t *map, const uint8_t *failed) {
    const int32_t P = s->num_physical_experts, spg = P / s->num_gpus;
    for (int32_t l = 0; l < s->num_layers; l++)
        for (int32_t e = 0; e < s->num_logical_experts; e++) {
            bool found = false;
            for (int32_t p = 0; p < P; p++)
                found |= (!failed || !failed[p / spg]) && map[(size_t)l * P + p] == e;
            if (!found) return false;
        }
    return true;
}

static int64_t count_moves(const epx_shape *s, const int32_t *a, const int32_t *b,
                           const uint8_t *failed) {
    const int32_t P = s->num_physical_experts, spg = P / s->num_gpus;
    int64_t n = 0;
    for (size_t i = 0; i < (size_t)s->num_layers * P; i++)
        n += (!failed || !failed[(i % P) / spg]) && a[i] != b[i];
    return n;
}

/* ---- generators -------------------------------------------------------------- */

static void shuffle(tu_rng *r, int32_t *x, int32_t n) {
    for (int32_t i = n - 1; i > 0; i--) {
        int32_t j = (int32_t)tu_below(r, (uint32_t)i + 1), t = x[i];
        x[i] = x[j];
        x[j] = t;
    }
}

static int32_t *random_map(tu_rng *r, const epx_shape *s) {
    const int32_t P = s->num_physical_experts, E = s->num_logical_experts;
    int32_t *m = malloc(sizeof *m * (size_t)s->num_layers * P);
    for (int32_t l = 0; l < s->num_layers; l++) {
        for (int32_t p = 0; p < P; p++)
            m[(size_t)l * P + p] = p < E ? p : (int32_t)tu_below(r, (uint32_t)E);
        shuffle(r, m + (size_t)l * P, P);
    }
    return m;
}

static double *random_load(tu_rng *r, const epx_shape *s, bool dense_first) {
    const size_t n = (size_t)s->num_layers * s->num_logical_experts;
    double *ld = malloc(sizeof *ld * n);
    for (size_t i = 0; i < n; i++) {
        double u = tu_uniform(r);
        ld[i] = floor(1000.0 * u * u * u);
    }
    if (dense_first)
        for (int32_t e = 0; e < s->num_logical_experts; e++) ld[e] = 0;
    return ld;
}

static epx_counts *counts_of(const epx_shape *s, const double *load) {
    epx_counts *c = NULL;
    epx_error err = {0};
    assert_int_equal(epx_counts_create(1, s->num_layers, s->num_logical_experts, &c, &err), EPX_OK);
    memcpy(c->data, load, sizeof *load * (size_t)s->num_layers * s->num_logical_experts);
    return c;
}

/*
 * A small reference placer: one replica of every expert, the redundant
 * slots to the heaviest load per replica, then replicas heaviest first onto
 * the least loaded GPU with room. Even shares. Enough to exercise the hook.
 */
static epx_status ref_place(void *ctx, const epx_counts *counts, const epx_shape *s,
                            const epx_plan_opts *o, int32_t *map, double *share, double *load,
                            epx_error *err) {
    (void)err;
    if (load != NULL)
        memcpy(load, counts->data, sizeof *load * (size_t)s->num_layers * s->num_logical_experts);
    int *calls = ctx;
    (*calls)++;
    assert_null(o->current);
    assert_null(o->failed_gpus);
    assert_int_equal(o->max_moves, -1);
    const int32_t P = s->num_physical_experts, E = s->num_logical_experts, G = s->num_gpus;
    const int32_t spg = P / G;
    int32_t *reps = calloc((size_t)E, sizeof *reps), *fill = calloc((size_t)G, sizeof *fill);
    double *gl = calloc((size_t)G, sizeof *gl);
    uint8_t *done = calloc((size_t)P, 1);
    int32_t *item = calloc((size_t)P, sizeof *item);
    for (int32_t l = 0; l < s->num_layers; l++) {
        const double *ld = counts->data + (size_t)l * E;
        for (int32_t e = 0; e < E; e++) reps[e] = 1;
        for (int32_t k = E; k < P; k++) {
            int32_t best = 0;
            for (int32_t e = 1; e < E; e++)
                if (ld[e] / reps[e] > ld[best] / reps[best]) best = e;
            reps[best]++;
        }
        int32_t n = 0;
        for (int32_t e = 0; e < E; e++)
            for (int32_t k = 0; k < reps[e]; k++) item[n++] = e;
        memset(done, 0, (size_t)P);
        memset(fill, 0, sizeof *fill * (size_t)G);
        memset(gl, 0, sizeof *gl * (size_t)G);
        for (int32_t k = 0; k < P; k++) {
            int32_t bi = -1;
            for (int32_t i = 0; i < P; i++)
                if (!done[i] &&
                    (bi < 0 || ld[item[i]] / reps[item[i]] > ld[item[bi]] / reps[item[bi]]))
                    bi = i;
            done[bi] = 1;
            int32_t bg = -1;
            for (int32_t g = 0; g < G; g++)
                if (fill[g] < spg && (bg < 0 || gl[g] < gl[bg])) bg = g;
            const size_t p = (size_t)l * P + (size_t)(bg * spg + fill[bg]++);
            map[p] = item[bi];
            share[p] = 1.0 / reps[item[bi]];
            gl[bg] += ld[item[bi]] / reps[item[bi]];
        }
    }
    free(reps);
    free(fill);
    free(gl);
    free(done);
    free(item);
    return EPX_OK;
}

/* ---- tests ------------------------------------------------------------------ */

static void budget_extremes(void **state) {
    (void)state;
    tu_rng r = {tu_seed(91)};
    for (int iter = 0; iter < 100; iter++) {
        int32_t G = 1 + (int32_t)tu_below(&r, 6), E = 2 + (int32_t)tu_below(&r, 30);
        int32_t spg = (E + G - 1) / G + (int32_t)tu_below(&r, 3);
        epx_shape s = {1 + (int32_t)tu_below(&r, 4), E, spg * G, G, 1};
        int32_t *a = random_map(&r, &s), *b = random_map(&r, &s);
        double *ld = random_load(&r, &s, iter % 2);
        epx_counts *c = counts_of(&s, ld);
        epx_layout *cur = NULL, *tgt = NULL, *out = NULL;
        epx_error err = {0};
        assert_int_equal(epx_layout_create_from_map(&s, a, &cur, &err), EPX_OK);
        assert_int_equal(epx_layout_create_from_map(&s, b, &tgt, &err), EPX_OK);
        /* no budget: the relabelled target, which is the migration's layout */
        epx_move_budget bud = EPX_MOVE_BUDGET_INIT;
        epx_move_report rep;
        assert_int_equal(epx_layout_limit_moves(c, cur, tgt, &bud, &out, &rep, &err), EPX_OK);
        epx_migrate_opts mo = EPX_MIGRATE_OPTS_INIT;
        mo.expert_bytes = 1;
        epx_migration *m = NULL;
        assert_int_equal(epx_migration_plan(cur, tgt, &mo, &m, &err), EPX_OK);
        const size_t bytes = sizeof(int32_t) * (size_t)s.num_layers * s.num_physical_experts;
        const int32_t *rel = epx_layout_physical_to_logical(epx_migration_layout(m));
        assert_memory_equal(epx_layout_physical_to_logical(out), rel, bytes);
        assert_int_equal(rep.moves_wanted, rep.moves_made);
        assert_int_equal(rep.moves_made, count_moves(&s, a, rel, NULL));
        assert_true(fabs(rep.balance_wanted - ref_balance(&s, b, ld, NULL)) < 1e-12);
        assert_true(fabs(rep.balance_current - ref_balance(&s, a, ld, NULL)) < 1e-12);
        epx_layout_destroy(out);
        /* a cap of zero, or a price nothing can pay: the current layout */
        bud.max_moves = iter % 2 ? 0 : -1;
        bud.move_price = iter % 2 ? 0.0 : 10.0;
        assert_int_equal(epx_layout_limit_moves(c, cur, tgt, &bud, &out, &rep, &err), EPX_OK);
        assert_memory_equal(epx_layout_physical_to_logical(out), a, bytes);
        assert_int_equal(rep.moves_made, 0);
        assert_true(fabs(rep.balance_made - rep.balance_current) < 1e-12);
        epx_layout_destroy(out);
        epx_migration_destroy(m);
        epx_layout_destroy(cur);
        epx_layout_destroy(tgt);
        epx_counts_destroy(c);
        free(a);
        free(b);
        free(ld);
    }
}

/* Random budgets: the cap holds, the result is valid, the report is true. */
static void random_budgets(void **state) {
    (void)state;
    tu_rng r = {tu_seed(92)};
    for (int iter = 0; iter < 150; iter++) {
        int32_t N = 1 + (int32_t)tu_below(&r, 2);
        int32_t G = N * (1 + (int32_t)tu_below(&r, 4)), E = 2 + (int32_t)tu_below(&r, 40);
        int32_t spg = (E + G - 1) / G + (int32_t)tu_below(&r, 4);
        epx_shape s = {1 + (int32_t)tu_below(&r, 5), E, spg * G, G, N};
        int32_t *a = random_map(&r, &s), *b = random_map(&r, &s);
        double *ld = random_load(&r, &s, iter % 3 == 0);
        epx_counts *c = counts_of(&s, ld);
        epx_layout *cur = NULL, *tgt = NULL, *out = NULL;
        epx_error err = {0};
        assert_int_equal(epx_layout_create_from_map(&s, a, &cur, &err), EPX_OK);
        assert_int_equal(epx_layout_create_from_map(&s, b, &tgt, &err), EPX_OK);
        epx_move_budget bud = EPX_MOVE_BUDGET_INIT;
        epx_move_report rep;
        assert_int_equal(epx_layout_limit_moves(c, cur, tgt, &bud, &out, &rep, &err), EPX_OK);
        const int64_t wanted = rep.moves_wanted;
        epx_layout_destroy(out);
        bud.max_moves = (int32_t)tu_below(&r, (uint32_t)wanted + 1);
        if (iter % 2 == 1) bud.move_price = 0.001 * tu_uniform(&r);
        assert_int_equal(epx_layout_limit_moves(c, cur, tgt, &bud, &out, &rep, &err), EPX_OK);
        const int32_t *m = epx_layout_physical_to_logical(out);
        assert_true(rep.moves_made <= bud.max_moves);
        assert_int_equal(rep.moves_made, count_moves(&s, a, m, NULL));
        assert_int_equal(rep.moves_wanted, wanted);
        assert_int_equal(rep.moves_required, 0);
        assert_true(fabs(rep.balance_made - ref_balance(&s, m, ld, NULL)) < 1e-12);
        /* each GPU only swaps experts between the current and the target */
        const int32_t P = s.num_physical_experts;
        for (size_t i = 0; i < (size_t)s.num_layers * P; i++)
            if (m[i] != a[i]) {
                size_t l = i / P, g = (i % P) / spg;
                bool in_target = false;
                for (int32_t k = 0; k < spg; k++) in_target |= b[l * P + g * spg + k] == m[i];
                assert_true(in_target);
            }
        /* a layer without load keeps no move when moves have a price */
        if (iter % 3 == 0 && bud.move_price > 0)
            for (int32_t p = 0; p < P; p++) assert_int_equal(m[p], a[p]);
        epx_layout_destroy(out);
        epx_layout_destroy(cur);
        epx_layout_destroy(tgt);
        epx_counts_destroy(c);
        free(a);
        free(b);
        free(ld);
    }
}

/* Tiny cases: the greedy against every subset of undos. */
static void greedy_vs_exhaustive(void **state) {
    (void)state;
    tu_rng r = {tu_seed(93)};
    double ratio_sum = 0;
    int cases = 0, optimal = 0;
    for (int iter = 0; cases < 300 && iter < 5000; iter++) {
        int32_t G = 2 + (int32_t)tu_below(&r, 3), E = 3 + (int32_t)tu_below(&r, 5);
        int32_t spg = (E + G - 1) / G + (int32_t)tu_below(&r, 2);
        epx_shape s = {1, E, spg * G, G, 1};
        if (s.num_physical_experts > 14) continue;
        int32_t *a = random_map(&r, &s), *b = random_map(&r, &s);
        double *ld = random_load(&r, &s, false);
        epx_counts *c = counts_of(&s, ld);
        if (iter % 2) { /* half the targets planned for the load, as in service */
            double sh[16];
            epx_plan_opts po = EPX_PLAN_OPTS_INIT;
            int calls = 0;
            epx_error e0 = {0};
            assert_int_equal(ref_place(&calls, c, &s, &po, b, sh, NULL, &e0), EPX_OK);
        }
        epx_layout *cur = NULL, *tgt = NULL, *out = NULL;
        epx_error err = {0};
        assert_int_equal(epx_layout_create_from_map(&s, a, &cur, &err), EPX_OK);
        assert_int_equal(epx_layout_create_from_map(&s, b, &tgt, &err), EPX_OK);
        epx_move_budget bud = EPX_MOVE_BUDGET_INIT;
        epx_move_report rep;
        assert_int_equal(epx_layout_limit_moves(c, cur, tgt, &bud, &out, &rep, &err), EPX_OK);
        const int32_t P = s.num_physical_experts;
        int32_t rel[16], ch[16], n = 0;
        memcpy(rel, epx_layout_physical_to_logical(out), sizeof(int32_t) * (size_t)P);
        epx_layout_destroy(out);
        for (int32_t p = 0; p < P; p++)
            if (rel[p] != a[p]) ch[n++] = p;
        if (n < 3) goto next;
        bud.max_moves = (int32_t)tu_below(&r, (uint32_t)n);
        assert_int_equal(epx_layout_limit_moves(c, cur, tgt, &bud, &out, &rep, &err), EPX_OK);
        double best = -1;
        for (uint32_t mask = 0; mask < (1u << n); mask++) {
            if (__builtin_popcount(mask) > bud.max_moves) continue;
            int32_t t[16];
            memcpy(t, a, sizeof(int32_t) * (size_t)P);
            for (int32_t k = 0; k < n; k++)
                if (mask & (1u << k)) t[ch[k]] = rel[ch[k]];
            if (!live_cover(&s, t, NULL)) continue;
            double bal = ref_balance(&s, t, ld, NULL);
            if (bal > best) best = bal;
        }
        assert_true(best > 0);
        assert_true(rep.balance_made <= best + 1e-12);
        ratio_sum += rep.balance_made / best;
        optimal += rep.balance_made >= best - 1e-12;
        cases++;
        epx_layout_destroy(out);
    next:
        epx_layout_destroy(cur);
        epx_layout_destroy(tgt);
        epx_counts_destroy(c);
        free(a);
        free(b);
        free(ld);
    }
    print_message("greedy vs exhaustive: %d cases, %d optimal, mean ratio %.4f\n", cases, optimal,
                  ratio_sum / cases);
    assert_int_equal(cases, 300);
    assert_true(ratio_sum / cases > 0.98);
    assert_true(optimal >= 240);
}

static void options_checked(void **state) {
    (void)state;
    epx_shape s = {2, 4, 8, 4, 2}, other = {2, 4, 8, 2, 1};
    epx_layout *a = NULL, *b = NULL, *out = NULL;
    epx_error err = {0};
    assert_int_equal(epx_layout_create_trivial(&s, &a, &err), EPX_OK);
    assert_int_equal(epx_layout_create_trivial(&other, &b, &err), EPX_OK);
    double ld[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    epx_counts *c = counts_of(&s, ld);
    epx_move_budget bud = EPX_MOVE_BUDGET_INIT;
    assert_int_equal(epx_layout_limit_moves(c, a, b, &bud, &out, NULL, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "G=4", "G=2");
    bud.move_price = -1;
    assert_int_equal(epx_layout_limit_moves(c, a, a, &bud, &out, NULL, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "move_price (-1)");
    bud.move_price = NAN;
    assert_int_equal(epx_layout_limit_moves(c, a, a, &bud, &out, NULL, &err), EPX_ERR_INVALID_ARG);
    bud.move_price = 0;
    bud.version = 7;
    assert_int_equal(epx_layout_limit_moves(c, a, a, &bud, &out, NULL, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "EPX_MOVE_BUDGET_INIT");
    bud.version = EPX_MOVE_BUDGET_VERSION;
    /* a NaN or negative load balanced nothing and reported balance 1 */
    const double kept = c->data[3];
    c->data[3] = NAN;
    assert_int_equal(epx_layout_limit_moves(c, a, a, &bud, &out, NULL, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "counts[3] is nan", "finite and >= 0");
    c->data[3] = -5;
    assert_int_equal(epx_layout_limit_moves(c, a, a, &bud, &out, NULL, &err), EPX_ERR_INVALID_ARG);
    c->data[3] = kept;
    epx_counts *c3 = NULL;
    assert_int_equal(epx_counts_create(1, 2, 5, &c3, &err), EPX_OK);
    assert_int_equal(epx_layout_limit_moves(c3, a, a, &bud, &out, NULL, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "[1][2][5]", "4 logical");
    assert_null(out);

    /* the planner options */
    epx_plan_opts o = EPX_PLAN_OPTS_INIT;
    assert_false(epxi_plan_is_constrained(&o));
    o.max_moves = 3;
    assert_true(epxi_plan_is_constrained(&o));
    assert_int_equal(epxi_plan_constraints_check(&s, &o, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "max_moves (3)", "without a current layout", "--current");
    o.max_moves = -1;
    o.move_price = NAN; /* blamed the missing layout, not the NaN */
    assert_int_equal(epxi_plan_constraints_check(&s, &o, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "move_price (nan) must be a finite balancedness");
    o.move_price = 0;
    o.max_moves = 3;
    o.current = b;
    assert_int_equal(epxi_plan_constraints_check(&s, &o, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "current layout", "G=2", "G=4");
    o.current = a;
    o.move_price = -0.5;
    assert_int_equal(epxi_plan_constraints_check(&s, &o, &err), EPX_ERR_INVALID_ARG);
    o.move_price = 0;
    uint8_t dead[4] = {1, 1, 1, 0};
    o.failed_gpus = dead;
    assert_int_equal(epxi_plan_constraints_check(&s, &o, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "4 logical experts", "2 slots of the 1 surviving", "P >= 16");
    dead[3] = 1;
    assert_int_equal(epxi_plan_constraints_check(&s, &o, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "all 4 GPUs");
    dead[0] = dead[1] = 0;
    assert_int_equal(epxi_plan_constraints_check(&s, &o, &err), EPX_OK);
    epx_counts_destroy(c);
    epx_counts_destroy(c3);
    epx_layout_destroy(a);
    epx_layout_destroy(b);
}

static void log_capture(void *user, epx_log_level level, const char *msg) {
    (void)level;
    strncat((char *)user, msg, 1000 - strlen((char *)user));
}

/* The hook: failed GPUs and the layout in service. */
static void constrained_plans(void **state) {
    (void)state;
    tu_rng r = {tu_seed(94)};
    for (int iter = 0; iter < 120; iter++) {
        int32_t N = 1 + (int32_t)tu_below(&r, 2);
        int32_t G = N * (2 + (int32_t)tu_below(&r, 3)), E = 2 + (int32_t)tu_below(&r, 24);
        int32_t spg = (E + G - 1) / G + 1 + (int32_t)tu_below(&r, 3);
        epx_shape s = {1 + (int32_t)tu_below(&r, 3), E, spg * G, G, N};
        const int32_t P = s.num_physical_experts;
        const size_t cells = (size_t)s.num_layers * P;
        uint8_t *dead = calloc((size_t)G, 1);
        int ndead = 1 + (int)tu_below(&r, 2);
        for (int k = 0; k < ndead; k++) dead[tu_below(&r, (uint32_t)G)] = 1;
        int32_t live = 0;
        for (int32_t g = 0; g < G; g++) live += !dead[g];
        if ((int64_t)live * spg < E) {
            free(dead);
            continue;
        }
        int32_t *a = random_map(&r, &s);
        double *ld = random_load(&r, &s, false);
        epx_counts *c = counts_of(&s, ld);
        epx_layout *cur = NULL;
        epx_error err = {0};
        assert_int_equal(epx_layout_create_from_map(&s, a, &cur, &err), EPX_OK);
        epx_plan_opts o = EPX_PLAN_OPTS_INIT;
        char logbuf[1001] = "";
        o.log = log_capture;
        o.log_user = logbuf;
        o.failed_gpus = dead;
        o.current = iter % 2 ? cur : NULL;
        int32_t *map = calloc(cells, sizeof *map);
        double *share = calloc(cells, sizeof *share);
        int calls = 0;
        assert_int_equal(epxi_plan_constrained(c, &s, &o, ref_place, &calls, map, share, &err),
                         EPX_OK);
        assert_int_equal(calls, 1);
        assert_true(live_cover(&s, map, dead));
        for (int32_t l = 0; l < s.num_layers; l++)
            for (int32_t e = 0; e < E; e++) {
                double sum = 0;
                for (int32_t p = 0; p < P; p++) {
                    size_t i = (size_t)l * P + p;
                    if (dead[p / spg]) {
                        assert_true(share[i] == 0.0);
                        if (o.current) assert_int_equal(map[i], a[i]); /* nothing moves there */
                    }
                    if (map[i] == e) sum += share[i];
                }
                assert_true(fabs(sum - 1.0) < 1e-9);
            }
        if (o.current) {
            /* Any cap below what the lost experts force is refused with the
             * least cap; that cap works. */
            o.max_moves = 0;
            epx_status st = epxi_plan_constrained(c, &s, &o, ref_place, &calls, map, share, &err);
            if (st != EPX_OK) {
                assert_int_equal(st, EPX_ERR_INVALID_ARG);
                TU_MSG_HAS(err.msg, "max_moves (0) cannot be met", "failed GPUs");
                const char *ge = strstr(err.msg, ">= ");
                assert_non_null(ge);
                o.max_moves = atoi(ge + 3);
                assert_int_equal(
                    epxi_plan_constrained(c, &s, &o, ref_place, &calls, map, share, &err), EPX_OK);
                assert_true(count_moves(&s, a, map, dead) <= o.max_moves);
                assert_true(live_cover(&s, map, dead));
            } else {
                /* nothing was lost that a move must restore */
                assert_int_equal(count_moves(&s, a, map, dead), 0);
            }
        }
        /* unequal survivors per node: planned as one node, and said so */
        bool even = true;
        int32_t gpn = G / N, first = -1;
        for (int32_t k = 0; k < N; k++) {
            int32_t cnt = 0;
            for (int32_t g = k * gpn; g < (k + 1) * gpn; g++) cnt += !dead[g];
            if (cnt == 0) continue;
            if (first >= 0 && cnt != first) even = false;
            first = cnt;
        }
        if (!even) TU_MSG_HAS(logbuf, "as one node");
        free(map);
        free(share);
        free(dead);
        free(a);
        free(ld);
        epx_counts_destroy(c);
        epx_layout_destroy(cur);
    }
}

/* With the layout in service and no failures, the hook relabels (carrying
 * shares along) and honours the cap; a price of 0 and no cap moves only what
 * relabelling cannot save. */
static void constrained_current(void **state) {
    (void)state;
    tu_rng r = {tu_seed(95)};
    for (int iter = 0; iter < 60; iter++) {
        int32_t G = 2 + (int32_t)tu_below(&r, 4), E = 4 + (int32_t)tu_below(&r, 30);
        int32_t spg = (E + G - 1) / G + 1 + (int32_t)tu_below(&r, 2);
        epx_shape s = {2, E, spg * G, G, 1};
        const size_t cells = (size_t)2 * s.num_physical_experts;
        int32_t *a = random_map(&r, &s);
        double *ld = random_load(&r, &s, false);
        epx_counts *c = counts_of(&s, ld);
        epx_layout *cur = NULL;
        epx_error err = {0};
        assert_int_equal(epx_layout_create_from_map(&s, a, &cur, &err), EPX_OK);
        int calls = 0;
        int32_t *free_map = calloc(cells, sizeof *free_map), *map = calloc(cells, sizeof *map);
        double *free_share = calloc(cells, sizeof *free_share),
               *share = calloc(cells, sizeof *share);
        epx_plan_opts o = EPX_PLAN_OPTS_INIT;
        assert_int_equal(ref_place(&calls, c, &s, &o, free_map, free_share, NULL, &err), EPX_OK);
        o.current = cur;
        assert_int_equal(epxi_plan_constrained(c, &s, &o, ref_place, &calls, map, share, &err),
                         EPX_OK);
        /* the same plan, relabelled: same balance, same multiset per GPU */
        assert_true(fabs(ref_balance(&s, map, ld, NULL) - ref_balance(&s, free_map, ld, NULL)) <
                    1e-12);
        for (size_t i = 0; i < cells; i++) {
            /* shares travel with their expert */
            int32_t e = map[i];
            double want = 0;
            for (size_t j = i - i % s.num_physical_experts;
                 j < i - i % s.num_physical_experts + (size_t)s.num_physical_experts; j++)
                if (free_map[j] == e) want = free_share[j];
            assert_true(fabs(share[i] - want) < 1e-12);
        }
        const int64_t wanted = count_moves(&s, a, map, NULL);
        o.max_moves = (int32_t)(wanted / 2);
        assert_int_equal(epxi_plan_constrained(c, &s, &o, ref_place, &calls, map, share, &err),
                         EPX_OK);
        assert_true(count_moves(&s, a, map, NULL) <= o.max_moves);
        assert_true(live_cover(&s, map, NULL));
        free(free_map);
        free(map);
        free(free_share);
        free(share);
        free(a);
        free(ld);
        epx_counts_destroy(c);
        epx_layout_destroy(cur);
    }
}

/* The real planner with failed GPUs, then dispatch tables built from the
 * live replica lists: no token of a live rank is sent to a failed GPU. */
static void failed_gpus_end_to_end(void **state) {
    (void)state;
    tu_rng r = {tu_seed(96)};
    for (int iter = 0; iter < 40; iter++) {
        const int32_t N = 1 + (int32_t)tu_below(&r, 2), G = N * (2 + (int32_t)tu_below(&r, 3));
        const int32_t E = 4 * (1 + (int32_t)tu_below(&r, 6));
        const int32_t spg = (E + G - 2) / (G - 1) + (int32_t)tu_below(&r, 3);
        epx_shape s = {1 + (int32_t)tu_below(&r, 3), E, spg * G, G, N};
        uint8_t dead[8] = {0};
        dead[tu_below(&r, (uint32_t)G)] = 1;
        double *ld = random_load(&r, &s, false);
        epx_counts *c = counts_of(&s, ld);
        epx_plan_opts o = EPX_PLAN_OPTS_INIT;
        o.algorithm = iter % 2 ? EPX_ALGO_DEEPSEEK : EPX_ALGO_EPX;
        o.failed_gpus = dead;
        epx_plan *p = NULL;
        epx_error err = {0};
        if (epx_plan_compute(c, &s, &o, &p, &err) != EPX_OK) fail_msg("%s", err.msg);
        const epx_layout *lay = epx_plan_layout(p);
        const int32_t *map = epx_layout_physical_to_logical(lay);
        assert_true(live_cover(&s, map, dead));
        const double *w = epx_plan_replica_weights(p);
        for (int32_t i = 0; i < s.num_layers * s.num_physical_experts; i++)
            if (dead[(i % s.num_physical_experts) / spg]) assert_true(w[i] == 0.0);
        const int32_t W = s.num_physical_experts - E + 1;
        int32_t *rep = malloc(sizeof *rep * (size_t)s.num_layers * E * W);
        int32_t *nv = malloc(sizeof *nv * (size_t)s.num_layers * E);
        assert_int_equal(epx_layout_live_replicas(lay, dead, W, rep, nv, &err), EPX_OK);
        int32_t *table = malloc(sizeof *table * (size_t)G * s.num_layers * E);
        for (int algo = 0; algo < 2; algo++) {
            epx_table_opts to = EPX_TABLE_OPTS_INIT;
            to.algorithm = algo ? EPX_TABLE_EPX : EPX_TABLE_SGLANG;
            if (epx_dispatch_table_compute(&s, rep, W, &to, table, &err) != EPX_OK)
                fail_msg("%s", err.msg);
            for (int32_t g = 0; g < G; g++) {
                if (dead[g]) continue;
                for (int32_t i = 0; i < s.num_layers * E; i++) {
                    const int32_t slot = table[(size_t)g * s.num_layers * E + i];
                    assert_false(dead[slot / spg]);
                    assert_int_equal(map[(size_t)(i / E) * s.num_physical_experts + slot], i % E);
                }
            }
        }
        assert_int_equal(epx_layout_live_replicas(lay, dead, 0, rep, nv, &err),
                         EPX_ERR_INVALID_ARG);
        TU_MSG_HAS(err.msg, "width 0");
        free(rep);
        free(nv);
        free(table);
        epx_plan_destroy(p);
        epx_counts_destroy(c);
        free(ld);
    }
    /* the layout in service still has experts only the failed GPU held */
    epx_shape s = {2, 8, 8, 4, 1};
    epx_layout *t = NULL;
    epx_error err = {0};
    assert_int_equal(epx_layout_create_trivial(&s, &t, &err), EPX_OK);
    const uint8_t dead[4] = {0, 0, 1, 0};
    int32_t rep[2 * 8];
    assert_int_equal(epx_layout_live_replicas(t, dead, 1, rep, NULL, &err), EPX_ERR_INVALID_MAP);
    TU_MSG_HAS(err.msg, "layer 0", "logical expert 4", "only on failed GPUs");
    assert_int_equal(epx_layout_live_replicas(t, NULL, 1, rep, NULL, &err), EPX_OK);
    assert_int_equal(rep[5], 5);
    epx_layout_destroy(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(failed_gpus_end_to_end), cmocka_unit_test(budget_extremes),
        cmocka_unit_test(random_budgets),         cmocka_unit_test(greedy_vs_exhaustive),
        cmocka_unit_test(options_checked),        cmocka_unit_test(constrained_plans),
        cmocka_unit_test(constrained_current),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
