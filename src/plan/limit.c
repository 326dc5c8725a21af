/*
 * limit.c - trade balance against moved weights.
 *
 * Input: the layout in service (old) and a target already relabelled
 * against it, so every changed slot is a real move. Output: the target with
 * the changes that buy the least balance undone, until at most max_moves
 * slots change and every remaining change buys at least move_price.
 *
 * Undoing slot p puts old[p] back: the target's expert x = cur[p] loses a
 * replica and old[p] gains one. When x had no other live replica the undo
 * alone is illegal, but old held x somewhere, at a slot q that the target
 * also changed (had q kept x, x would have two replicas); undoing q as well
 * restores x, and may in turn strand cur[q], and so on. Such a chain always
 * ends (each step takes a new slot; undoing every change gives back `old`,
 * which is valid), except where old held x only on failed GPUs: those moves
 * are required. A chain of k slots is one unit, valued at the balance it
 * costs divided by k.
 *
 * The search is greedy: each layer keeps its cheapest unit; the cheapest of
 * all layers is undone and that layer's units are valued again (a change in
 * one layer leaves every other layer's balance as it was). Valuing a unit
 * touches only the GPUs of the experts it changes, so a layer is revalued in
 * O(changed slots * (chain length * replicas + G)).
 *
 * Undoing alone is myopic where two changes only pay together (two GPUs tied
 * at the maximum). So, with a budget, the same machinery also runs the other
 * way, from the layout in service toward the target, taking the units that
 * buy the most balance per slot while they fit; the better result (sum of
 * balancedness less move_price per move) wins. On tiny cases checked against
 * every subset (tests/test_migrate_limit.c) the pair finds the optimum in
 * about nine cases of ten and averages over 0.98 of it.
 */
#include "constrain.h"

#include <math.h>
#include <string.h>

typedef struct {
    const epx_shape *sh;
    int32_t P, E, G, spg;
    const uint8_t *failed;
    int32_t live;
    /* the layer being worked on */
    const int32_t *old;
    int32_t *cur;
    const double *load;
    int32_t *cnt;            /* [E] live replicas in cur */
    double *gpu;             /* [G] load per GPU */
    double total;            /* sum of load */
    int32_t *ostart, *oslot; /* [E + 1], [P]: live slots of each expert in old */
    int32_t *cstart, *cslot; /* the same for cur */
    /* unit building */
    int32_t *dcnt;    /* [E] tentative replica change, zero between units */
    uint8_t *inchain; /* [P] */
    int32_t *chain;   /* [P] */
    int32_t *touched; /* [2P] experts with nonzero dcnt */
    double *tgpu;     /* [G] */
} lim_ctx;

typedef struct {
    double per_move; /* balance lost per undone slot; +inf when none */
    double spread;   /* tie-break: rise of the sum of squared GPU loads per slot */
    int32_t start;   /* first slot of the unit, -1 when none */
    int32_t stuck;   /* changed slots no chain can undo */
    int32_t len;     /* slots of the unit */
} layer_best;

static bool is_live(const lim_ctx *c, int32_t p) {
    return c->failed == NULL || !c->failed[p / c->spg];
}

static void csr(const lim_ctx *c, const int32_t *row, int32_t *start, int32_t *slot) {
    memset(start, 0, (size_t)(c->E + 1) * sizeof *start);
    for (int32_t p = 0; p < c->P; p++)
        if (is_live(c, p)) start[row[p] + 1]++;
    for (int32_t e = 0; e < c->E; e++) start[e + 1] += start[e];
    /* dcnt is all zero between units: borrow it as the fill cursor. */
    for (int32_t p = 0; p < c->P; p++)
        if (is_live(c, p)) slot[start[row[p]] + c->dcnt[row[p]]++] = p;
    memset(c->dcnt, 0, (size_t)c->E * sizeof *c->dcnt);
}

/* Rebuild counts, CSRs and GPU loads of the current layer from scratch, so
 * rounding never accumulates across undos. */
static void layer_setup(lim_ctx *c) {
    csr(c, c->cur, c->cstart, c->cslot);
    for (int32_t e = 0; e < c->E; e++) c->cnt[e] = c->cstart[e + 1] - c->cstart[e];
    memset(c->gpu, 0, (size_t)c->G * sizeof *c->gpu);
    c->total = 0.0;
    for (int32_t e = 0; e < c->E; e++) c->total += c->load[e];
    for (int32_t p = 0; p < c->P; p++)
        if (is_live(c, p)) c->gpu[p / c->spg] += c->load[c->cur[p]] / c->cnt[c->cur[p]];
}

static double balance_of(const lim_ctx *c, const double *gpu) {
    double mx = 0.0;
    for (int32_t g = 0; g < c->G; g++)
        if ((c->failed == NULL || !c->failed[g]) && gpu[g] > mx) mx = gpu[g];
    if (mx <= 0.0) return 1.0;
    return c->total / (double)c->live / mx;
}

static void touch(lim_ctx *c, int32_t *nt, int32_t e, int32_t d) {
    if (c->dcnt[e] == 0) c->touched[(*nt)++] = e;
    c->dcnt[e] += d;
}

static void unit_reset(lim_ctx *c, int32_t len, int32_t nt) {
    for (int32_t i = 0; i < len; i++) c->inchain[c->chain[i]] = 0;
    for (int32_t i = 0; i < nt; i++) c->dcnt[c->touched[i]] = 0;
}

/* Build the chain that undoes slot p (into c->chain); returns its length,
 * or 0 when no chain exists. *used receives the slots written to c->chain
 * and *nt the touched experts; the caller must unit_reset(c, *used, *nt). */
static int32_t build_chain(lim_ctx *c, int32_t p, int32_t *used, int32_t *nt) {
    int32_t len = 0;
    *nt = 0;
    for (;;) {
        c->chain[len++] = p;
        *used = len;
        c->inchain[p] = 1;
        const int32_t x = c->cur[p];
        touch(c, nt, x, -1);
        touch(c, nt, c->old[p], +1);
        if (c->cnt[x] + c->dcnt[x] >= 1) return len;
        /* x is stranded: undo a slot that held x in old. Prefer one whose
         * own expert survives the undo, which ends the chain. */
        int32_t next = -1;
        for (int32_t i = c->ostart[x]; i < c->ostart[x + 1]; i++) {
            int32_t q = c->oslot[i];
            if (c->inchain[q] || c->cur[q] == c->old[q]) continue;
            if (next < 0) next = q;
            int32_t y = c->cur[q];
            if (c->cnt[y] + c->dcnt[y] >= 2) {
                next = q;
                break;
            }
        }
        if (next < 0) return 0;
        p = next;
    }
}

static double sum_sq(const lim_ctx *c, const double *gpu) {
    double s = 0.0;
    for (int32_t g = 0; g < c->G; g++) s += gpu[g] * gpu[g];
    return s;
}

/* Balance of the layer with the chain undone; c->tgpu keeps its GPU loads. */
static double chain_balance(lim_ctx *c, int32_t len, int32_t nt) {
    memcpy(c->tgpu, c->gpu, (size_t)c->G * sizeof *c->tgpu);
    for (int32_t t = 0; t < nt; t++) {
        const int32_t e = c->touched[t];
        const int32_t after = c->cnt[e] + c->dcnt[e];
        if (c->dcnt[e] == 0 || c->load[e] == 0.0) continue;
        for (int32_t i = c->cstart[e]; i < c->cstart[e + 1]; i++)
            c->tgpu[c->cslot[i] / c->spg] -= c->load[e] / c->cnt[e];
        /* after >= 1 for a legal chain */
        const double share = c->load[e] / after;
        for (int32_t i = c->cstart[e]; i < c->cstart[e + 1]; i++)
            if (!c->inchain[c->cslot[i]]) c->tgpu[c->cslot[i] / c->spg] += share;
        for (int32_t k = 0; k < len; k++)
            if (c->old[c->chain[k]] == e) c->tgpu[c->chain[k] / c->spg] += share;
    }
    return balance_of(c, c->tgpu);
}

/* Balancedness looks at the busiest GPU only, so many undos cost exactly
 * nothing; among equals, undo first what spreads the load least (a smaller
 * rise of the sum of squares), which keeps the changes that even out the
 * other GPUs and so guard against the next window's drift. */
static bool better(double per, double spread, const layer_best *b) {
    if (per < b->per_move - 1e-12) return true;
    return per <= b->per_move + 1e-12 && spread < b->spread;
}

/* The cheapest unit of the bound layer among chains of at most max_len
 * slots. */
static layer_best value_layer(lim_ctx *c, int64_t max_len) {
    layer_best b = {INFINITY, INFINITY, -1, 0, 0};
    const double now = balance_of(c, c->gpu);
    const double sq = sum_sq(c, c->gpu), norm = c->total > 0.0 ? c->total * c->total : 1.0;
    for (int32_t p = 0; p < c->P; p++) {
        if (!is_live(c, p) || c->cur[p] == c->old[p]) continue;
        int32_t nt = 0, used = 0;
        int32_t len = build_chain(c, p, &used, &nt);
        if (len == 0) {
            b.stuck++;
        } else if (len <= max_len) {
            double per = (now - chain_balance(c, len, nt)) / len;
            double spread = (sum_sq(c, c->tgpu) - sq) / norm / len;
            if (better(per, spread, &b)) {
                b.per_move = per;
                b.spread = spread;
                b.start = p;
                b.len = len;
            }
        }
        unit_reset(c, used, nt);
    }
    return b;
}

/* Take the chain that starts at p (cur[q] = old[q] along it); returns its
 * length. */
static int32_t take_chain(lim_ctx *c, int32_t p) {
    int32_t nt = 0, used = 0;
    int32_t len = build_chain(c, p, &used, &nt);
    for (int32_t k = 0; k < len; k++) c->cur[c->chain[k]] = c->old[c->chain[k]];
    unit_reset(c, used, nt);
    return len;
}

static void bind_layer(lim_ctx *c, const int32_t *old, int32_t *cur, const double *load) {
    c->old = old;
    c->cur = cur;
    c->load = load;
    csr(c, old, c->ostart, c->oslot);
    layer_setup(c);
}

static bool layer_loaded(const double *load, int32_t E) {
    for (int32_t e = 0; e < E; e++)
        if (load[e] > 0.0) return true;
    return false;
}

/* Mean balancedness over loaded layers of map. */
static double map_balance(const epx_shape *sh, const int32_t *map, const double *load,
                          const uint8_t *failed, double *scratch) {
    double sum = 0.0;
    int32_t n = 0;
    const int32_t P = sh->num_physical_experts, E = sh->num_logical_experts;
    for (int32_t l = 0; l < sh->num_layers; l++) {
        const double *ld = load + (size_t)l * (size_t)E;
        if (!layer_loaded(ld, E)) continue;
        sum += epxi_layer_balance(sh, map + (size_t)l * (size_t)P, ld, failed, scratch);
        n++;
    }
    return n ? sum / n : 1.0;
}

/* Every expert must keep a live replica in the target. */
static epx_status check_live_cover(const epx_shape *sh, const int32_t *map, const uint8_t *failed,
                                   int32_t *cnt, epx_error *err) {
    const int32_t P = sh->num_physical_experts, E = sh->num_logical_experts;
    const int32_t spg = P / sh->num_gpus;
    for (int32_t l = 0; l < sh->num_layers; l++) {
        memset(cnt, 0, (size_t)E * sizeof *cnt);
        for (int32_t p = 0; p < P; p++)
            if (failed == NULL || !failed[p / spg]) cnt[map[(size_t)l * P + p]]++;
        for (int32_t e = 0; e < E; e++)
            if (cnt[e] == 0)
                return epxi_fail(err, EPX_ERR_INVALID_MAP,
                                 "layer %d: logical expert %d has no replica on a live GPU in the "
                                 "target: plan the target with the same failed GPUs",
                                 l, e);
    }
    return EPX_OK;
}

static void even_shares(const epx_shape *sh, const int32_t *before, const int32_t *map,
                        double *share, const uint8_t *failed, int32_t *cnt, uint8_t *dirty) {
    const int32_t P = sh->num_physical_experts, E = sh->num_logical_experts;
    const int32_t spg = P / sh->num_gpus;
    for (int32_t l = 0; l < sh->num_layers; l++) {
        const int32_t *b = before + (size_t)l * P, *m = map + (size_t)l * P;
        double *s = share + (size_t)l * P;
        memset(dirty, 0, (size_t)E);
        memset(cnt, 0, (size_t)E * sizeof *cnt);
        for (int32_t p = 0; p < P; p++) {
            if (b[p] != m[p]) dirty[b[p]] = dirty[m[p]] = 1;
            if (failed == NULL || !failed[p / spg]) cnt[m[p]]++;
        }
        for (int32_t p = 0; p < P; p++) {
            bool live = failed == NULL || !failed[p / spg];
            if (!live)
                s[p] = 0.0;
            else if (dirty[m[p]])
                s[p] = 1.0 / cnt[m[p]];
        }
    }
}

/* Undo, from the target in `map` toward `old`, the cheapest units while
 * more than max_moves slots change or a unit buys less than move_price. */
static void greedy_undo(lim_ctx *c, layer_best *best, const int32_t *old, int32_t *map,
                        const double *load, const epx_move_budget *bud, int64_t *total) {
    const int32_t L = c->sh->num_layers, P = c->P, E = c->E;
    for (int32_t l = 0; l < L; l++) {
        bind_layer(c, old + (size_t)l * P, map + (size_t)l * P, load + (size_t)l * E);
        best[l] = value_layer(c, INT32_MAX);
    }
    for (;;) {
        int32_t lb = -1;
        for (int32_t l = 0; l < L; l++)
            if (best[l].start >= 0 &&
                (lb < 0 || better(best[l].per_move, best[l].spread, &best[lb])))
                lb = l;
        if (lb < 0) break;
        bool over_cap = bud->max_moves >= 0 && *total > bud->max_moves;
        bool under_price = bud->move_price > 0.0 && best[lb].per_move < bud->move_price;
        if (!over_cap && !under_price) break;
        bind_layer(c, old + (size_t)lb * P, map + (size_t)lb * P, load + (size_t)lb * E);
        *total -= take_chain(c, best[lb].start);
        layer_setup(c);
        best[lb] = value_layer(c, INT32_MAX);
    }
}

/* Moves a chain would add: slots that differ from the layout in service
 * after it, less those that differed before (a chain may re-target a slot
 * that was already moved). */
static int64_t chain_moves(const lim_ctx *c, const int32_t *cur0, int32_t len) {
    int64_t d = 0;
    for (int32_t k = 0; k < len; k++) {
        const int32_t q = c->chain[k];
        d += (c->old[q] != cur0[q]) - (c->cur[q] != cur0[q]);
    }
    return d;
}

/* From `work` (the layout in service, or it repaired) toward the target,
 * apply the units that buy the most balance per slot while they fit in
 * max_moves and buy at least move_price (with no price: any gain, or an
 * even spread at no loss). The same chains as undoing, with the roles of
 * the two layouts swapped. *total counts slots differing from cur0. */
static void greedy_apply(lim_ctx *c, layer_best *best, const int32_t *target, int32_t *work,
                         const int32_t *cur0, const double *load, const epx_move_budget *bud,
                         int64_t *total) {
    const int32_t L = c->sh->num_layers, P = c->P, E = c->E;
    const int64_t cap = bud->max_moves >= 0 ? bud->max_moves : INT64_MAX;
    for (int32_t l = 0; l < L; l++) {
        bind_layer(c, target + (size_t)l * P, work + (size_t)l * P, load + (size_t)l * E);
        best[l] = value_layer(c, cap - *total);
    }
    for (;;) {
        const int64_t room = cap - *total;
        int32_t lb = -1;
        for (int32_t l = 0; l < L; l++) {
            if (best[l].start >= 0 && best[l].len > room) {
                bind_layer(c, target + (size_t)l * P, work + (size_t)l * P, load + (size_t)l * E);
                best[l] = value_layer(c, room);
            }
            if (best[l].start >= 0 &&
                (lb < 0 || better(best[l].per_move, best[l].spread, &best[lb])))
                lb = l;
        }
        if (lb < 0) break;
        const double gain = -best[lb].per_move;
        bool worth = bud->move_price > 0.0
                         ? gain >= bud->move_price
                         : gain > 1e-12 || (gain > -1e-12 && best[lb].spread < 0.0);
        if (!worth) break;
        const size_t o = (size_t)lb * P;
        bind_layer(c, target + o, work + o, load + (size_t)lb * E);
        int32_t nt = 0, used = 0;
        const int32_t len = build_chain(c, best[lb].start, &used, &nt);
        *total += chain_moves(c, cur0 + o, len);
        for (int32_t k = 0; k < len; k++) c->cur[c->chain[k]] = c->old[c->chain[k]];
        unit_reset(c, used, nt);
        layer_setup(c);
        best[lb] = value_layer(c, cap - *total);
    }
}

/*
 * Give every expert that only failed GPUs held a live replica, at the least
 * cost in moves: one slot per lost expert, taken from an expert that keeps
 * another live replica, heaviest lost expert first, on the slot whose GPU
 * ends least loaded. Live slots >= E (checked by the caller) guarantees
 * enough duplicates. Returns the slots changed.
 */
static int64_t repair_layer(lim_ctx *c, int32_t *work, const double *load) {
    int64_t moves = 0;
    for (;;) {
        memset(c->cnt, 0, (size_t)c->E * sizeof *c->cnt);
        for (int32_t p = 0; p < c->P; p++)
            if (is_live(c, p)) c->cnt[work[p]]++;
        int32_t x = -1;
        for (int32_t e = 0; e < c->E; e++)
            if (c->cnt[e] == 0 && (x < 0 || load[e] > load[x])) x = e;
        if (x < 0) return moves;
        memset(c->gpu, 0, (size_t)c->G * sizeof *c->gpu);
        for (int32_t p = 0; p < c->P; p++)
            if (is_live(c, p)) c->gpu[p / c->spg] += load[work[p]] / c->cnt[work[p]];
        int32_t best = -1;
        double best_load = INFINITY;
        for (int32_t p = 0; p < c->P; p++) {
            if (!is_live(c, p) || c->cnt[work[p]] < 2) continue;
            const double after = c->gpu[p / c->spg] - load[work[p]] / c->cnt[work[p]] + load[x];
            if (after < best_load) {
                best_load = after;
                best = p;
            }
        }
        if (best < 0) return moves; /* cannot happen with live slots >= E */
        work[best] = x;
        moves++;
    }
}

/* Sum over loaded layers of balancedness, less move_price per move: what
 * both directions maximise. */
static double objective(const epx_shape *sh, const int32_t *map, const double *load,
                        const uint8_t *failed, double *scratch, int64_t moves, double price) {
    double sum = 0.0;
    const int32_t P = sh->num_physical_experts, E = sh->num_logical_experts;
    for (int32_t l = 0; l < sh->num_layers; l++) {
        const double *ld = load + (size_t)l * (size_t)E;
        if (layer_loaded(ld, E))
            sum += epxi_layer_balance(sh, map + (size_t)l * (size_t)P, ld, failed, scratch);
    }
    return sum - price * (double)moves;
}

epx_status epxi_limit_moves(const epx_shape *sh, const double *load, const int32_t *old,
                            int32_t *map, double *share, const epx_move_budget *bud,
                            epx_move_report *report, epx_error *err) {
    const int32_t L = sh->num_layers, P = sh->num_physical_experts, E = sh->num_logical_experts;
    const int32_t G = sh->num_gpus;
    const size_t cells = (size_t)L * (size_t)P;
    lim_ctx c = {sh,   P,    E,    G,    P / G, bud->failed_gpus,
                 0,    NULL, NULL, NULL, NULL,  NULL,
                 0.0,  NULL, NULL, NULL, NULL,  NULL,
                 NULL, NULL, NULL, NULL};
    EPX_TRY(epxi_count_live(sh, bud->failed_gpus, &c.live, err));
    epx_status st = EPX_OK;
    layer_best *best = NULL;
    int32_t *before = NULL, *fwd = NULL, *ibuf = NULL;
    double *dbuf = NULL;
    uint8_t *bbuf = NULL;
    const size_t ni = (size_t)E * 4 + 3 + (size_t)P * 5;
    ibuf = epxi_calloc(ni, sizeof *ibuf, "move-limit scratch", err);
    dbuf = ibuf ? epxi_calloc((size_t)G * 2 + (size_t)E, sizeof *dbuf, "move-limit scratch", err)
                : NULL;
    bbuf = dbuf ? epxi_calloc((size_t)P + (size_t)E, 1, "move-limit scratch", err) : NULL;
    best = bbuf ? epxi_calloc((size_t)L, sizeof *best, "move-limit scratch", err) : NULL;
    before = best ? epxi_calloc(cells, sizeof *before, "move-limit copy", err) : NULL;
    fwd = before ? epxi_calloc(cells, sizeof *fwd, "move-limit copy", err) : NULL;
    if (fwd == NULL) {
        st = EPX_ERR_NOMEM;
        goto done;
    }
    c.cnt = ibuf;
    c.dcnt = c.cnt + E;
    c.ostart = c.dcnt + E;
    c.cstart = c.ostart + E + 1;
    c.oslot = c.cstart + E + 1;
    c.cslot = c.oslot + P;
    c.chain = c.cslot + P;
    c.touched = c.chain + P; /* 2P */
    c.gpu = dbuf;
    c.tgpu = dbuf + G;
    c.inchain = bbuf;
    EPX_TRY_GOTO(st, check_live_cover(sh, map, c.failed, c.cnt, err), done);
    memcpy(before, map, cells * sizeof *map);

    int64_t total = 0;
    for (size_t i = 0; i < cells; i++)
        if (is_live(&c, (int32_t)(i % (size_t)P)) && map[i] != old[i]) total++;
    const int64_t wanted = total;
    const bool capped = bud->max_moves >= 0;
    greedy_undo(&c, best, old, map, load, bud, &total);
    /* The other direction when there is a budget to spend: from the layout
     * in service (repaired first when experts were lost with failed GPUs:
     * undoing cannot move a lost expert to a cheaper slot, this can) toward
     * the target. Keep the better of the two that fit. */
    memcpy(fwd, old, cells * sizeof *fwd);
    int64_t forced = 0;
    for (int32_t l = 0; l < L; l++)
        forced += repair_layer(&c, fwd + (size_t)l * P, load + (size_t)l * E);
    if ((capped || bud->move_price > 0.0) && (!capped || forced <= bud->max_moves)) {
        int64_t ftotal = forced;
        greedy_apply(&c, best, before, fwd, old, load, bud, &ftotal);
        const bool rev_fits = !capped || total <= bud->max_moves;
        const double jr = objective(sh, map, load, c.failed, dbuf, total, bud->move_price);
        const double jf = objective(sh, fwd, load, c.failed, dbuf, ftotal, bud->move_price);
        if (!rev_fits || jf > jr + 1e-12 || (jf >= jr - 1e-12 && ftotal < total)) {
            memcpy(map, fwd, cells * sizeof *map);
            total = ftotal;
        }
    }
    const int64_t least = forced;
    if (capped && total > bud->max_moves) {
        st = epxi_fail(err, EPX_ERR_INVALID_ARG,
                       "max_moves (%d) cannot be met: %lld slots must change to give every "
                       "expert that only failed GPUs held a live replica; use max_moves >= %lld",
                       bud->max_moves, (long long)least, (long long)least);
        goto done;
    }
    if (share != NULL) even_shares(sh, before, map, share, c.failed, c.cnt, bbuf + P);
    if (report != NULL) {
        report->moves_wanted = wanted;
        report->moves_made = total;
        report->moves_required = forced;
        report->balance_current = map_balance(sh, old, load, c.failed, dbuf);
        report->balance_wanted = map_balance(sh, before, load, c.failed, dbuf);
        report->balance_made = map_balance(sh, map, load, c.failed, dbuf);
    }
done:
    free(ibuf);
    free(dbuf);
    free(bbuf);
    free(best);
    free(before);
    free(fwd);
    return st;
}

epx_status epx_layout_limit_moves(const epx_counts *counts, const epx_layout *current,
                                  const epx_layout *target, const epx_move_budget *budget,
                                  epx_layout **out, epx_move_report *report, epx_error *err) {
    if (counts == NULL || current == NULL || target == NULL || budget == NULL || out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_layout_limit_moves: counts, current, target, budget and out must "
                         "not be NULL");
    EPX_TRY(epxi_counts_valid(counts, "epx_layout_limit_moves", err));
    const epx_shape *sh = epx_layout_shape(current), *ts = epx_layout_shape(target);
    EPX_TRY(epxi_check_same_shape(sh, ts, "the current layout (", ") and the target (",
                                  ") differ in shape: both must be of one shape", err));
    if (counts->num_layers != sh->num_layers || counts->num_experts != sh->num_logical_experts)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "counts are [%d][%d][%d] but the layouts have %d layers and %d logical "
                         "experts: give the load of this model",
                         counts->num_windows, counts->num_layers, counts->num_experts,
                         sh->num_layers, sh->num_logical_experts);
    EPX_TRY(epxi_check_version(budget->version, EPX_MOVE_BUDGET_VERSION, "epx_move_budget",
                               "EPX_MOVE_BUDGET_INIT", err));
    if (!isfinite(budget->move_price) || budget->move_price < 0.0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "move_price (%g) must be a finite balancedness >= 0 (0 = moves are "
                         "free; 0.001 = each move must buy a tenth of a point)",
                         budget->move_price);
    EPX_TRY(epxi_check_loads(counts->data,
                             (size_t)counts->num_windows * (size_t)counts->num_layers *
                                 (size_t)counts->num_experts,
                             "counts", err));
    const size_t cells = (size_t)sh->num_layers * (size_t)sh->num_physical_experts;
    epx_status st = EPX_OK;
    double *load = epxi_sum_load(counts, err);
    int32_t *map = load ? epxi_calloc(cells, sizeof *map, "limited map", err) : NULL;
    if (map == NULL) {
        free(load);
        return EPX_ERR_NOMEM;
    }
    memcpy(map, epx_layout_physical_to_logical(target), cells * sizeof *map);
    const int32_t *old = epx_layout_physical_to_logical(current);
    EPX_TRY_GOTO(st, epxi_relabel_map(sh, old, map, NULL, err), done);
    EPX_TRY_GOTO(st, epxi_limit_moves(sh, load, old, map, NULL, budget, report, err), done);
    st = epx_layout_create_from_map(sh, map, out, err);
done:
    free(load);
    free(map);
    return st;
}
