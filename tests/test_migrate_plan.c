/*
 * test_migrate_plan.c - migration plans without any communication: the
 * relabelling against augmenting-path matching, every action replayed on a
 * model of slot contents, byte totals recounted from the actions, the naive
 * plan recounted, crafted cases for same-node sources, relays, failed GPUs,
 * and the checksum.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "migrate_maps.h"

/* A target near `old`: each layer swaps a few slots across GPUs and
 * re-targets a few redundant ones, then shuffles inside each GPU, so that
 * relabelling has work to do. */
static int32_t *perturbed_map(tu_rng *r, const epx_shape *s, const int32_t *old) {
    const int32_t L = s->num_layers, P = s->num_physical_experts, E = s->num_logical_experts;
    const int32_t spg = P / s->num_gpus;
    int32_t *m = malloc(sizeof *m * (size_t)L * (size_t)P);
    memcpy(m, old, sizeof *m * (size_t)L * (size_t)P);
    int32_t *cnt = calloc((size_t)E, sizeof *cnt);
    for (int32_t l = 0; l < L; l++) {
        int32_t *row = m + (size_t)l * P;
        int32_t swaps = (int32_t)tu_below(r, (uint32_t)P / 2 + 1);
        for (int32_t i = 0; i < swaps; i++) {
            int32_t a = (int32_t)tu_below(r, (uint32_t)P), b = (int32_t)tu_below(r, (uint32_t)P);
            int32_t t = row[a];
            row[a] = row[b];
            row[b] = t;
        }
        memset(cnt, 0, sizeof *cnt * (size_t)E);
        for (int32_t p = 0; p < P; p++) cnt[row[p]]++;
        int32_t retarget = (int32_t)tu_below(r, (uint32_t)(P - E) + 1);
        for (int32_t i = 0; i < retarget; i++) {
            int32_t p = (int32_t)tu_below(r, (uint32_t)P);
            if (cnt[row[p]] < 2) continue;
            cnt[row[p]]--;
            row[p] = (int32_t)tu_below(r, (uint32_t)E);
            cnt[row[p]]++;
        }
        for (int32_t g = 0; g < s->num_gpus; g++)
            for (int32_t i = spg - 1; i > 0; i--) {
                int32_t j = (int32_t)tu_below(r, (uint32_t)i + 1), t = row[g * spg + i];
                row[g * spg + i] = row[g * spg + j];
                row[g * spg + j] = t;
            }
    }
    free(cnt);
    return m;
}

static epx_shape random_shape(tu_rng *r) {
    int32_t N = 1 + (int32_t)tu_below(r, 3);
    int32_t G = N * (1 + (int32_t)tu_below(r, 4));
    int32_t E = 1 + (int32_t)tu_below(r, 24);
    int32_t spg = (E + G - 1) / G + (int32_t)tu_below(r, 4);
    epx_shape s = {1 + (int32_t)tu_below(r, 3), E, spg * G, G, N};
    return s;
}

/* Kuhn's augmenting paths on one GPU: the reference maximum matching. */
static int kuhn_try(int32_t n, const int32_t *old, const int32_t *neu, int32_t j, int32_t *match,
                    uint8_t *seen) {
    for (int32_t i = 0; i < n; i++) {
        if (old[i] != neu[j] || seen[i]) continue;
        seen[i] = 1;
        if (match[i] < 0 || kuhn_try(n, old, neu, match[i], match, seen)) {
            match[i] = j;
            return 1;
        }
    }
    return 0;
}

static int32_t kuhn_max_matching(int32_t n, const int32_t *old, const int32_t *neu) {
    int32_t *match = malloc(sizeof *match * (size_t)n), total = 0;
    uint8_t *seen = malloc((size_t)n);
    for (int32_t i = 0; i < n; i++) match[i] = -1;
    for (int32_t j = 0; j < n; j++) {
        memset(seen, 0, (size_t)n);
        total += kuhn_try(n, old, neu, j, match, seen);
    }
    free(match);
    free(seen);
    return total;
}

static epx_layout *make(const epx_shape *s, const int32_t *map) {
    epx_layout *lay = NULL;
    epx_error err = {0};
    assert_int_equal(epx_layout_create_from_map(s, map, &lay, &err), EPX_OK);
    return lay;
}

static void relabel_is_maximum_matching(void **state) {
    (void)state;
    tu_rng r = {tu_seed(81)};
    for (int iter = 0; iter < 300; iter++) {
        epx_shape s = random_shape(&r);
        int32_t *a = mm_random_map(&r, &s);
        int32_t *b = iter % 2 ? mm_random_map(&r, &s) : perturbed_map(&r, &s, a);
        epx_layout *cur = make(&s, a), *tgt = make(&s, b);
        epx_migrate_opts o = EPX_MIGRATE_OPTS_INIT;
        o.expert_bytes = 10;
        epx_migration *m = NULL;
        epx_error err = {0};
        assert_int_equal(epx_migration_plan(cur, tgt, &o, &m, &err), EPX_OK);
        const int32_t P = s.num_physical_experts, spg = P / s.num_gpus;
        const int32_t *rel = epx_layout_physical_to_logical(epx_migration_layout(m));
        const int32_t *perm = epx_migration_permutation(m);
        int64_t want_kept = 0, kept = 0;
        for (int32_t l = 0; l < s.num_layers; l++)
            for (int32_t g = 0; g < s.num_gpus; g++) {
                size_t o0 = (size_t)l * P + (size_t)g * spg;
                want_kept += kuhn_max_matching(spg, a + o0, b + o0);
                uint8_t *used = calloc((size_t)spg, 1);
                for (int32_t i = 0; i < spg; i++) {
                    int32_t q = perm[o0 + i];
                    assert_true(q >= g * spg && q < (g + 1) * spg); /* stays on its GPU */
                    assert_false(used[q - g * spg]);
                    used[q - g * spg] = 1;
                    assert_int_equal(rel[o0 + i], b[(size_t)l * P + q]);
                    kept += rel[o0 + i] == a[o0 + i];
                }
                free(used);
            }
        epx_migration_stats st;
        epx_migration_get_stats(m, &st);
        assert_int_equal(kept, want_kept);
        assert_int_equal(st.kept, want_kept);
        epx_migration_destroy(m);
        epx_layout_destroy(cur);
        epx_layout_destroy(tgt);
        free(a);
        free(b);
    }
}

/*
 * Replay a plan on slot contents (expert ids) and recount its bytes.
 * Rounds: recv and local read the old contents; relay and recv-copy read
 * slots written in this migration, which must have been filled by a recv
 * (relay: on another GPU of the same node, from another node) or by any
 * earlier action of the same GPU (recv-copy).
 */
static void replay(const epx_shape *s, const int32_t *old, const int32_t *rel,
                   const uint8_t *failed, const epx_migration *m, size_t B) {
    const int32_t L = s->num_layers, P = s->num_physical_experts, G = s->num_gpus;
    const int32_t spg = P / G, gpn = G / s->num_nodes;
    const uint8_t *kind = epx_migration_kinds(m);
    const int32_t *src = epx_migration_sources(m);
    uint64_t *sent = calloc((size_t)G, sizeof *sent), *recv = calloc((size_t)G, sizeof *recv);
    uint64_t *link = calloc((size_t)G * G, sizeof *link);
    uint64_t intra = 0, inter = 0, local = 0, loaded = 0;
    int64_t kept = 0, changed = 0, naive = 0;
    for (int32_t l = 0; l < L; l++) {
        const int32_t *o = old + (size_t)l * P, *t = rel + (size_t)l * P;
        const uint8_t *k = kind + (size_t)l * P;
        const int32_t *sr = src + (size_t)l * P;
        int32_t *have = malloc(sizeof *have * (size_t)P);
        for (int32_t p = 0; p < P; p++) have[p] = -1;
        for (int pass = 0; pass < 3; pass++)
            for (int32_t p = 0; p < P; p++) {
                const int32_t g = p / spg, q = sr[p];
                const bool live = failed == NULL || !failed[g];
                if (pass == 0) {
                    if (!live) {
                        assert_int_equal(k[p], EPX_MOVE_DEAD);
                        continue;
                    }
                    assert_int_not_equal(k[p], EPX_MOVE_DEAD);
                    if (k[p] == EPX_MOVE_KEEP) {
                        assert_int_equal(o[p], t[p]);
                        assert_int_equal(q, p);
                        have[p] = o[p];
                        kept++;
                    } else if (k[p] == EPX_MOVE_LOCAL || k[p] == EPX_MOVE_RECV) {
                        assert_true(q >= 0 && q < P);
                        assert_true(failed == NULL || !failed[q / spg]);
                        if (k[p] == EPX_MOVE_LOCAL)
                            assert_int_equal(q / spg, g);
                        else
                            assert_int_not_equal(q / spg, g);
                        assert_int_equal(o[q], t[p]);
                        have[p] = o[q];
                    } else if (k[p] == EPX_MOVE_LOAD) {
                        /* nobody live holds it */
                        for (int32_t x = 0; x < P; x++)
                            if (failed == NULL || !failed[x / spg])
                                assert_int_not_equal(o[x], t[p]);
                        have[p] = t[p];
                        loaded += B;
                    }
                } else if (pass == 1 && k[p] == EPX_MOVE_RELAY) {
                    assert_int_equal(k[q], EPX_MOVE_RECV);
                    assert_int_not_equal(q / spg, g);
                    assert_int_equal(q / spg / gpn, g / gpn);
                    assert_int_not_equal(sr[q] / spg / gpn, g / gpn); /* came from afar */
                    have[p] = have[q];
                } else if (pass == 2 && k[p] == EPX_MOVE_RECV_COPY) {
                    assert_int_equal(q / spg, g);
                    assert_true(q < p);
                    assert_true(k[q] == EPX_MOVE_RECV || k[q] == EPX_MOVE_RELAY ||
                                k[q] == EPX_MOVE_LOAD);
                    have[p] = have[q];
                }
            }
        for (int32_t p = 0; p < P; p++) {
            const int32_t g = p / spg, q = sr[p];
            if (failed != NULL && failed[g]) continue;
            assert_int_equal(have[p], t[p]);
            changed += k[p] != EPX_MOVE_KEEP;
            if (k[p] == EPX_MOVE_RECV || k[p] == EPX_MOVE_RELAY) {
                sent[q / spg] += B;
                recv[g] += B;
                link[(size_t)(q / spg) * G + g] += B;
                if (q / spg / gpn == g / gpn)
                    intra += B;
                else
                    inter += B;
            } else if (k[p] == EPX_MOVE_LOCAL || k[p] == EPX_MOVE_RECV_COPY) {
                local += B;
                link[(size_t)g * G + g] += B;
            }
        }
        free(have);
    }
    (void)naive;
    epx_migration_stats st;
    epx_migration_get_stats(m, &st);
    assert_int_equal(st.kept, kept);
    assert_int_equal(st.changed, changed);
    assert_int_equal(st.bytes_intra_node, intra);
    assert_int_equal(st.bytes_inter_node, inter);
    assert_int_equal(st.bytes_moved, intra + inter);
    assert_int_equal(st.bytes_local, local);
    assert_int_equal(st.bytes_loaded, loaded);
    uint64_t *s2 = calloc((size_t)G, sizeof *s2), *r2 = calloc((size_t)G, sizeof *r2);
    uint64_t *l2 = calloc((size_t)G * G, sizeof *l2);
    epx_migration_rank_bytes(m, s2, r2);
    epx_migration_link_bytes(m, l2);
    assert_memory_equal(s2, sent, sizeof *s2 * (size_t)G);
    assert_memory_equal(r2, recv, sizeof *r2 * (size_t)G);
    assert_memory_equal(l2, link, sizeof *l2 * (size_t)G * G);
    free(s2);
    free(r2);
    free(l2);
    free(sent);
    free(recv);
    free(link);
}

/* The naive plan recounted from the maps as given. */
static void check_naive(const epx_shape *s, const int32_t *old, const int32_t *given,
                        const uint8_t *failed, const epx_migration *m, size_t B) {
    const int32_t P = s->num_physical_experts, spg = P / s->num_gpus;
    const int32_t gpn = s->num_gpus / s->num_nodes;
    int64_t changed = 0, loaded = 0;
    uint64_t inter = 0;
    for (int32_t l = 0; l < s->num_layers; l++)
        for (int32_t p = 0; p < P; p++) {
            size_t i = (size_t)l * P + p;
            if ((failed && failed[p / spg]) || old[i] == given[i]) continue;
            changed++;
            bool near = false, anywhere = false; /* a live holder on p's node, on any */
            for (int32_t q = 0; q < P; q++) {
                const bool held =
                    (!failed || !failed[q / spg]) && old[(size_t)l * P + q] == given[i];
                anywhere |= held;
                near |= held && q / spg / gpn == p / spg / gpn;
            }
            if (!anywhere)
                loaded++; /* loaded by the caller: no link, inter-node or not */
            else if (!near)
                inter += B;
        }
    epx_migration_stats st;
    epx_migration_get_stats(m, &st);
    assert_int_equal(epx_migration_naive_loaded(m), loaded);
    assert_int_equal(st.naive_changed, changed);
    assert_int_equal(st.naive_bytes_moved, (uint64_t)changed * B);
    assert_int_equal(st.naive_bytes_inter_node, inter);
    assert_true(st.bytes_moved <= st.naive_bytes_moved);
    assert_true(st.changed <= st.naive_changed);
}

static void random_plans_replay(void **state) {
    (void)state;
    tu_rng r = {tu_seed(82)};
    int refusals = 0, live_plans = 0;
    for (int iter = 0; iter < 400; iter++) {
        epx_shape s = random_shape(&r);
        int32_t *a = mm_random_map(&r, &s);
        int32_t *b = iter % 3 ? perturbed_map(&r, &s, a) : mm_random_map(&r, &s);
        uint8_t *failed = NULL;
        if (iter % 4 == 3 && s.num_gpus > 1) {
            failed = calloc((size_t)s.num_gpus, 1);
            failed[tu_below(&r, (uint32_t)s.num_gpus)] = 1;
        }
        /* a target that leaves an expert only on the failed GPU is refused
         * by name; otherwise it is made to keep one, as a plan would */
        bool refused = failed != NULL && iter % 8 == 7 && mm_loses_an_expert(&s, b, failed);
        if (failed != NULL && !refused && !mm_keep_live(&s, b, failed)) {
            free(failed);
            failed = NULL;
        }
        epx_layout *cur = make(&s, a), *tgt = make(&s, b);
        epx_migrate_opts o = EPX_MIGRATE_OPTS_INIT;
        o.expert_bytes = 1 + tu_below(&r, 1000);
        o.relabel = (iter % 5) != 4;
        o.relay = (iter % 7) != 6;
        o.failed_gpus = failed;
        epx_migration *m = NULL;
        epx_error err = {0};
        if (refused) {
            assert_int_equal(epx_migration_plan(cur, tgt, &o, &m, &err), EPX_ERR_INVALID_MAP);
            TU_MSG_HAS(err.msg, "the target: layer ", "has replicas only on failed GPUs (GPU ",
                       "epx plan --failed-gpus");
            epx_layout_destroy(cur);
            epx_layout_destroy(tgt);
            free(a);
            free(b);
            free(failed);
            refusals++;
            continue;
        }
        assert_int_equal(epx_migration_plan(cur, tgt, &o, &m, &err), EPX_OK);
        live_plans += failed != NULL;
        const int32_t *rel = epx_layout_physical_to_logical(epx_migration_layout(m));
        if (!o.relabel)
            assert_memory_equal(rel, b, sizeof *b * (size_t)s.num_layers * s.num_physical_experts);
        replay(&s, a, rel, failed, m, o.expert_bytes);
        check_naive(&s, a, b, failed, m, o.expert_bytes);
        if (!o.relay) {
            epx_migration_stats st;
            epx_migration_get_stats(m, &st);
            assert_int_equal(st.relayed, 0);
        }
        epx_migration_destroy(m);
        epx_layout_destroy(cur);
        epx_layout_destroy(tgt);
        free(a);
        free(b);
        free(failed);
    }
    assert_true(refusals > 0 && live_plans > 0); /* both kinds of case ran */
}

/* 2 nodes x 2 GPUs x 2 slots, E = 6. Expert 5 lives only on node 0 (GPU 0);
 * both GPUs of node 1 need it: one crosses the network, the other relays.
 * Expert 4 lives on GPU 1 (node 0) and GPU 3 (node 1); GPU 2 receives it
 * from GPU 3, its own node. */
static void crafted_same_node_and_relay(void **state) {
    (void)state;
    epx_shape s = {1, 6, 8, 4, 2};
    const int32_t old[8] = {5, 0, 1, 4, 2, 3, 4, 2};
    const int32_t neu[8] = {5, 0, 1, 3, 4, 5, 2, 5};
    epx_layout *cur = make(&s, old), *tgt = make(&s, neu);
    epx_migrate_opts o = EPX_MIGRATE_OPTS_INIT;
    o.expert_bytes = 100;
    epx_migration *m = NULL;
    epx_error err = {0};
    assert_int_equal(epx_migration_plan(cur, tgt, &o, &m, &err), EPX_OK);
    const int32_t *rel = epx_layout_physical_to_logical(epx_migration_layout(m));
    const uint8_t *k = epx_migration_kinds(m);
    const int32_t *src = epx_migration_sources(m);
    /* GPU 1 had {1, 4}, gets {1, 3}: 1 stays in slot 2; 3 comes from GPU 2,
     * node 1 (the only holder). */
    assert_int_equal(rel[2], 1);
    assert_int_equal(k[2], EPX_MOVE_KEEP);
    assert_int_equal(rel[3], 3);
    assert_int_equal(k[3], EPX_MOVE_RECV);
    assert_int_equal(src[3], 5);
    /* GPU 2 had {2, 3}, gets {4, 5}: 4 from GPU 3 (same node, not GPU 1);
     * 5 from GPU 0 across the network. */
    assert_int_equal(rel[4], 4);
    assert_int_equal(k[4], EPX_MOVE_RECV);
    assert_int_equal(src[4], 6);
    assert_int_equal(rel[5], 5);
    assert_int_equal(k[5], EPX_MOVE_RECV);
    assert_int_equal(src[5], 0);
    /* GPU 3 had {4, 2}, gets {2, 5}: 2 kept in slot 7 -> relabelled there;
     * 5 relayed from GPU 2's new slot 5. */
    assert_int_equal(rel[7], 2);
    assert_int_equal(k[7], EPX_MOVE_KEEP);
    assert_int_equal(rel[6], 5);
    assert_int_equal(k[6], EPX_MOVE_RELAY);
    assert_int_equal(src[6], 5);
    epx_migration_stats st;
    epx_migration_get_stats(m, &st);
    assert_int_equal(st.bytes_inter_node, 200); /* 3 to GPU 1, 5 to GPU 2 */
    assert_int_equal(st.bytes_intra_node, 200); /* 4 to GPU 2, relay to GPU 3 */
    epx_migration_destroy(m);
    /* Without relays GPU 3 pulls expert 5 across the network itself. */
    o.relay = 0;
    assert_int_equal(epx_migration_plan(cur, tgt, &o, &m, &err), EPX_OK);
    epx_migration_get_stats(m, &st);
    assert_int_equal(st.bytes_inter_node, 300);
    assert_int_equal(epx_migration_kinds(m)[6], EPX_MOVE_RECV);
    epx_migration_destroy(m);
    epx_layout_destroy(cur);
    epx_layout_destroy(tgt);
}

/* Copies inside a GPU: a second replica of a received expert is copied, not
 * received twice; an expert the GPU already holds is copied locally. */
static void crafted_local_copies(void **state) {
    (void)state;
    epx_shape s = {1, 4, 8, 2, 1};
    const int32_t old[8] = {0, 1, 2, 3, 0, 1, 2, 3};
    const int32_t neu[8] = {0, 0, 3, 3, 1, 2, 1, 0}; /* GPU 0: 0,0,3,3  GPU 1: 1,2,1,0 */
    epx_layout *cur = make(&s, old), *tgt = make(&s, neu);
    epx_migrate_opts o = EPX_MIGRATE_OPTS_INIT;
    o.expert_bytes = 8;
    epx_migration *m = NULL;
    epx_error err = {0};
    assert_int_equal(epx_migration_plan(cur, tgt, &o, &m, &err), EPX_OK);
    const int32_t *rel = epx_layout_physical_to_logical(epx_migration_layout(m));
    const uint8_t *k = epx_migration_kinds(m);
    /* GPU 0: 0 kept at 0, 3 kept at 3, the second 0 and 3 copied locally. */
    assert_int_equal(rel[0], 0);
    assert_int_equal(rel[3], 3);
    assert_int_equal(k[1], EPX_MOVE_LOCAL);
    assert_int_equal(k[2], EPX_MOVE_LOCAL);
    /* GPU 1 had 0,1,2,3 and gets 1,2,1,0: 0, 1, 2 kept, the second 1 local. */
    assert_int_equal(k[4], EPX_MOVE_KEEP);
    assert_int_equal(k[5], EPX_MOVE_KEEP);
    assert_int_equal(k[6], EPX_MOVE_KEEP);
    assert_int_equal(k[7], EPX_MOVE_LOCAL);
    epx_migration_stats st;
    epx_migration_get_stats(m, &st);
    assert_int_equal(st.bytes_moved, 0);
    assert_int_equal(st.bytes_local, 24);
    assert_int_equal(st.naive_changed, 6); /* all but slots 0 and 3 differ as given */
    epx_migration_destroy(m);
    epx_layout_destroy(cur);
    epx_layout_destroy(tgt);

    /* GPU 1 gets two replicas of an expert only GPU 0 holds: one transfer. */
    const int32_t old2[4] = {0, 1, 2, 2};
    const int32_t neu2[4] = {0, 2, 1, 1};
    epx_shape s2 = {1, 3, 4, 2, 1};
    cur = make(&s2, old2);
    tgt = make(&s2, neu2);
    assert_int_equal(epx_migration_plan(cur, tgt, &o, &m, &err), EPX_OK);
    k = epx_migration_kinds(m);
    assert_int_equal(k[2], EPX_MOVE_RECV);
    assert_int_equal(k[3], EPX_MOVE_RECV_COPY);
    assert_int_equal(epx_migration_sources(m)[3], 2);
    assert_int_equal(k[1], EPX_MOVE_RECV);
    epx_migration_get_stats(m, &st);
    assert_int_equal(st.bytes_moved, 16);
    assert_int_equal(st.naive_bytes_moved, 24);
    epx_migration_destroy(m);
    epx_layout_destroy(cur);
    epx_layout_destroy(tgt);
}

static void failed_gpu_sources(void **state) {
    (void)state;
    /* GPU 1 failed. Expert 3 lived only there: GPU 0 must load it. */
    epx_shape s = {1, 4, 6, 3, 1};
    const int32_t old[6] = {0, 1, 2, 3, 2, 1};
    const int32_t neu[6] = {0, 3, 2, 3, 2, 1};
    const uint8_t failed[3] = {0, 1, 0};
    epx_layout *cur = make(&s, old), *tgt = make(&s, neu);
    epx_migrate_opts o = EPX_MIGRATE_OPTS_INIT;
    o.expert_bytes = 4;
    o.failed_gpus = failed;
    epx_migration *m = NULL;
    epx_error err = {0};
    assert_int_equal(epx_migration_plan(cur, tgt, &o, &m, &err), EPX_OK);
    const uint8_t *k = epx_migration_kinds(m);
    assert_int_equal(k[1], EPX_MOVE_LOAD);
    assert_int_equal(epx_migration_sources(m)[1], -1);
    assert_int_equal(k[2], EPX_MOVE_DEAD);
    assert_int_equal(k[3], EPX_MOVE_DEAD);
    epx_migration_stats st;
    epx_migration_get_stats(m, &st);
    assert_int_equal(st.loaded, 1);
    assert_int_equal(st.slots, 4);
    epx_migration_destroy(m);
    epx_layout_destroy(cur);
    epx_layout_destroy(tgt);
}

static void errors_name_the_problem(void **state) {
    (void)state;
    epx_shape a = {2, 4, 8, 2, 1}, b = {2, 4, 8, 4, 1};
    epx_layout *x = NULL, *y = NULL;
    epx_error err = {0};
    assert_int_equal(epx_layout_create_trivial(&a, &x, &err), EPX_OK);
    assert_int_equal(epx_layout_create_trivial(&b, &y, &err), EPX_OK);
    epx_migrate_opts o = EPX_MIGRATE_OPTS_INIT;
    o.expert_bytes = 1;
    epx_migration *m = NULL;
    assert_int_equal(epx_migration_plan(x, y, &o, &m, &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "G=2", "G=4", "differ in shape");
    assert_null(m);
    o.expert_bytes = 0;
    assert_int_equal(epx_migration_plan(x, x, &o, &m, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "expert_bytes is 0");
    o.expert_bytes = SIZE_MAX / 4;
    assert_int_equal(epx_migration_plan(x, x, &o, &m, &err), EPX_ERR_OVERFLOW);
    o.expert_bytes = 1;
    o.relabel = 2;
    assert_int_equal(epx_migration_plan(x, x, &o, &m, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "relabel (2)");
    o.relabel = 1;
    const uint8_t all[2] = {1, 1};
    o.failed_gpus = all;
    assert_int_equal(epx_migration_plan(x, x, &o, &m, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "all 2 GPUs");
    o.failed_gpus = NULL;
    o.version = 99;
    assert_int_equal(epx_migration_plan(x, x, &o, &m, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "EPX_MIGRATE_OPTS_INIT");
    /* The same layout: nothing moves. */
    o.version = EPX_MIGRATE_OPTS_VERSION;
    assert_int_equal(epx_migration_plan(x, x, &o, &m, &err), EPX_OK);
    epx_migration_stats st;
    epx_migration_get_stats(m, &st);
    assert_int_equal(st.kept, 16);
    assert_int_equal(st.bytes_moved + st.bytes_local + st.naive_bytes_moved, 0);
    epx_migration_destroy(m);
    epx_migration_destroy(NULL);
    assert_string_equal(epx_move_kind_name(EPX_MOVE_RELAY), "relay");
    assert_string_equal(epx_move_kind_name(99), "?");
    epx_layout_destroy(x);
    epx_layout_destroy(y);
}

static void checksum_properties(void **state) {
    (void)state;
    tu_rng r = {tu_seed(83)};
    unsigned char buf[300];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)tu_below(&r, 256);
    /* every prefix length gives a different sum; any single bit flip changes it */
    uint64_t seen[301];
    for (size_t n = 0; n <= 300; n++) {
        seen[n] = epx_checksum64(buf, n, 7);
        for (size_t j = 0; j < n; j++) assert_true(seen[j] != seen[n]);
        assert_true(epx_checksum64(buf, n, 7) == seen[n]);
        assert_true(epx_checksum64(buf, n, 8) != seen[n]);
    }
    for (int t = 0; t < 2000; t++) {
        size_t n = 1 + tu_below(&r, 300), bit = tu_below(&r, (uint32_t)n * 8);
        uint64_t before = epx_checksum64(buf, n, 0);
        buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        assert_true(epx_checksum64(buf, n, 0) != before);
        buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
    }
    /* Pinned values: the sum must not change between hosts and releases
     * (it is compared across ranks). */
    const char *text = "expert parallelism moves weights";
    assert_true(epx_checksum64(text, strlen(text), 0) == 0x7b9b2ad8cfd8adf4ull);
    assert_true(epx_checksum64(text, 5, 1) == epx_checksum64("exper", 5, 1));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(relabel_is_maximum_matching), cmocka_unit_test(random_plans_replay),
        cmocka_unit_test(crafted_same_node_and_relay), cmocka_unit_test(crafted_local_copies),
        cmocka_unit_test(failed_gpu_sources),          cmocka_unit_test(errors_name_the_problem),
        cmocka_unit_test(checksum_properties),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
