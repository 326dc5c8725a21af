/*
 * test_pt_dumps.c - SGLang's expert-distribution dumps, built here in the
 * exact shape its recorder writes: per_pass dumps of several ranks (summed
 * per pass, slots mapped to experts) against a direct reference, stat dumps
 * concatenated, the spec forms (comma list, directory), and every
 * inconsistency between files turned into a message.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pt_build.h"
#include "testutil.h"

typedef struct {
    uint8_t *zip;
    size_t len;
} blob;

/* A per_pass dump of one rank: npass records over [L][P] int32 counts and
 * the int64 map, storages data/0 .. data/npass. */
static blob per_pass_dump(int64_t rank, const int64_t *ids, int npass, const int64_t *gpc,
                          const int64_t *map, int64_t L, int64_t P, int map_present) {
    ptb b = {0};
    int64_t shape[2] = {L, P};
    ptb_proto(&b);
    ptb_op(&b, '}');
    ptb_op(&b, '(');
    ptb_str(&b, "records");
    ptb_op(&b, ']');
    if (npass > 0) {
        ptb_op(&b, '(');
        for (int i = 0; i < npass; i++) {
            char key[16];
            snprintf(key, sizeof key, "%d", i);
            ptb_op(&b, '}');
            ptb_op(&b, '(');
            ptb_str(&b, "forward_pass_id");
            ptb_int(&b, ids[i]);
            ptb_str(&b, "rank");
            ptb_int(&b, rank);
            ptb_str(&b, "gatherer_key");
            ptb_str(&b, "primary");
            ptb_str(&b, "global_physical_count");
            ptb_dense(&b, "IntStorage", key, shape, 2);
            ptb_op(&b, 'u');
        }
        ptb_op(&b, 'e');
    }
    if (map_present) {
        char key[16];
        snprintf(key, sizeof key, "%d", npass);
        ptb_str(&b, "last_physical_to_logical_map");
        ptb_dense(&b, "LongStorage", key, shape, 2);
    }
    ptb_op(&b, 'u');
    ptb_op(&b, '.');
    const uint8_t *stor[64];
    size_t slen[64];
    for (int i = 0; i < npass; i++) {
        stor[i] = ptb_storage_i32(gpc + (size_t)i * (size_t)(L * P), (size_t)(L * P));
        slen[i] = (size_t)(L * P) * 4;
    }
    stor[npass] = ptb_storage_i64(map, (size_t)(L * P));
    slen[npass] = (size_t)(L * P) * 8;
    blob out = {0};
    out.zip = ptb_archive(&b, stor, slen, (size_t)npass + 1, &out.len);
    assert_non_null(out.zip);
    for (int i = 0; i <= npass; i++) free((void *)(uintptr_t)stor[i]);
    free(b.p);
    return out;
}

/* A stat dump {"rank": 0, "logical_count": [B][L][E], "average_...": None},
 * its counts int64 when wide, else int32 (as SGLang's recorder keeps them). */
static blob stat_dump_as(const int64_t *lc, int64_t B, int64_t L, int64_t E, int wide) {
    ptb b = {0};
    int64_t shape[3] = {B, L, E};
    ptb_proto(&b);
    ptb_op(&b, '}');
    ptb_op(&b, '(');
    ptb_str(&b, "rank");
    ptb_int(&b, 0);
    ptb_str(&b, "logical_count");
    ptb_dense(&b, wide ? "LongStorage" : "IntStorage", "0", shape, 3);
    ptb_str(&b, "average_utilization_rate_over_window");
    ptb_op(&b, 'N');
    ptb_op(&b, 'u');
    ptb_op(&b, '.');
    const size_t n = (size_t)(B * L * E);
    const uint8_t *stor[1] = {wide ? ptb_storage_i64(lc, n) : ptb_storage_i32(lc, n)};
    size_t slen[1] = {n * (wide ? 8 : 4)};
    blob out = {0};
    out.zip = ptb_archive(&b, stor, slen, 1, &out.len);
    free((void *)(uintptr_t)stor[0]);
    free(b.p);
    return out;
}

static blob stat_dump(const int64_t *lc, int64_t B, int64_t L, int64_t E) {
    return stat_dump_as(lc, B, L, E, 0);
}

static epx_pt_file *load(blob bl, const char *name) {
    epx_pt_file *f = NULL;
    epx_error err = {0};
    if (epx_pt_load_buffer(bl.zip, bl.len, name, &f, &err) != EPX_OK) fail_msg("%s", err.msg);
    free(bl.zip);
    return f;
}

static void write_blob(blob bl, const char *path) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bl.zip, 1, bl.len, f), bl.len);
    fclose(f);
}

/* A random map in which every expert has a slot. */
static void random_map(tu_rng *r, int64_t *map, int64_t L, int64_t E, int64_t P) {
    for (int64_t l = 0; l < L; l++) {
        int64_t *row = map + l * P;
        for (int64_t p = 0; p < P; p++) row[p] = p < E ? p : (int64_t)tu_below(r, (uint32_t)E);
        for (int64_t p = P - 1; p > 0; p--) {
            int64_t q = (int64_t)tu_below(r, (uint32_t)p + 1), t = row[p];
            row[p] = row[q];
            row[q] = t;
        }
    }
}

/* Random ranks, each with a random subset of passes in random order: epx's
 * counts equal a direct sum-then-scatter reference. */
static void per_pass_random(void **state) {
    (void)state;
    tu_rng r = {tu_seed(777)};
    for (int iter = 0; iter < 60; iter++) {
        const int64_t L = 1 + tu_below(&r, 4), E = 1 + tu_below(&r, 7), P = E + tu_below(&r, 5);
        const int R = 1 + (int)tu_below(&r, 4), NP = 1 + (int)tu_below(&r, 6);
        int64_t *map = malloc(sizeof *map * (size_t)(L * P));
        random_map(&r, map, L, E, P);
        int64_t pass_id[8];
        for (int i = 0; i < NP; i++) pass_id[i] = 3 * i + (int64_t)tu_below(&r, 3); /* sparse ids */
        double *ref = calloc((size_t)(NP * L * E), sizeof *ref);
        int present[8] = {0};
        epx_pt_file *files[4];
        for (int k = 0; k < R; k++) {
            int64_t ids[8], *gpc = malloc(sizeof *gpc * (size_t)(NP * L * P));
            int n = 0;
            for (int i = 0; i < NP; i++) {
                if (k > 0 && tu_below(&r, 3) == 0) continue; /* rank k missed pass i */
                ids[n] = pass_id[i];
                present[i] = 1;
                for (int64_t j = 0; j < L * P; j++) {
                    int64_t x = tu_below(&r, 4) == 0 ? 0 : (int64_t)tu_below(&r, 100000);
                    gpc[n * L * P + j] = x;
                    ref[(i * L + j / P) * E + map[j]] += (double)x;
                }
                n++;
            }
            for (int i = n - 1; i > 0; i--) { /* records in any order */
                int q = (int)tu_below(&r, (uint32_t)i + 1);
                int64_t t = ids[i];
                ids[i] = ids[q];
                ids[q] = t;
                for (int64_t j = 0; j < L * P; j++) {
                    t = gpc[i * L * P + j];
                    gpc[i * L * P + j] = gpc[q * L * P + j];
                    gpc[q * L * P + j] = t;
                }
            }
            char name[32];
            snprintf(name, sizeof name, "rank%d.pt", k);
            files[k] = load(per_pass_dump(k, ids, n, gpc, map, L, P, 1), name);
            free(gpc);
        }
        epx_counts *c = NULL;
        epx_error err = {0};
        if (epx_counts_from_pt((const epx_pt_file *const *)files, (size_t)R, &c, &err) != EPX_OK)
            fail_msg("%s", err.msg);
        int S = 0;
        for (int i = 0; i < NP; i++) S += present[i];
        assert_int_equal(c->num_windows, S);
        assert_int_equal(c->num_layers, L);
        assert_int_equal(c->num_experts, E);
        int s = 0;
        for (int i = 0; i < NP; i++) {
            if (!present[i]) continue;
            for (int64_t l = 0; l < L; l++)
                for (int64_t e = 0; e < E; e++)
                    assert_true(epx_counts_row(c, s, (int32_t)l)[e] == ref[(i * L + l) * E + e]);
            s++;
        }
        epx_counts_destroy(c);
        for (int k = 0; k < R; k++) epx_pt_file_destroy(files[k]);
        free(ref);
        free(map);
    }
}

static epx_status counts_of(blob a, blob b, epx_error *err) {
    epx_pt_file *f[2] = {load(a, "a.pt"), load(b, "b.pt")};
    epx_counts *c = NULL;
    epx_status st = epx_counts_from_pt((const epx_pt_file *const *)f, 2, &c, err);
    epx_counts_destroy(c);
    epx_pt_file_destroy(f[0]);
    epx_pt_file_destroy(f[1]);
    return st;
}

static void per_pass_errors(void **state) {
    (void)state;
    int64_t map[4] = {0, 1, 1, 0}, map2[4] = {1, 0, 1, 0}, ids[2] = {0, 1};
    int64_t gpc[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    epx_error err = {0};
    /* the same pass of the same rank twice */
    assert_int_equal(counts_of(per_pass_dump(0, ids, 2, gpc, map, 2, 2, 1),
                               per_pass_dump(0, ids, 1, gpc, map, 2, 2, 1), &err),
                     EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "forward pass 0 of rank 0 is recorded twice", "a.pt", "b.pt");
    /* ranks that disagree on the placement */
    assert_int_equal(counts_of(per_pass_dump(0, ids, 2, gpc, map, 2, 2, 1),
                               per_pass_dump(1, ids, 2, gpc, map2, 2, 2, 1), &err),
                     EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "different", "last_physical_to_logical_map");
    /* a map of another shape */
    assert_int_equal(counts_of(per_pass_dump(0, ids, 2, gpc, map, 2, 2, 1),
                               per_pass_dump(1, ids, 2, gpc, map, 1, 4, 1), &err),
                     EPX_ERR_SHAPE);
    /* a per_pass dump mixed with a stat dump */
    int64_t lc[4] = {1, 2, 3, 4};
    assert_int_equal(
        counts_of(per_pass_dump(0, ids, 2, gpc, map, 2, 2, 1), stat_dump(lc, 1, 2, 2), &err),
        EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "one kind");
    /* no records at all, and no map */
    epx_pt_file *f = load(per_pass_dump(0, ids, 0, gpc, map, 2, 2, 1), "empty.pt");
    epx_counts *c = NULL;
    assert_int_equal(epx_counts_from_pt((const epx_pt_file *const *)&f, 1, &c, &err),
                     EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "no records");
    epx_pt_file_destroy(f);
    f = load(per_pass_dump(0, ids, 2, gpc, map, 2, 2, 0), "nomap.pt");
    assert_int_equal(epx_counts_from_pt((const epx_pt_file *const *)&f, 1, &c, &err),
                     EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "last_physical_to_logical_map", "nomap.pt");
    /* and it is not a mapping either: the mapping reader says it is counts */
    int32_t *m = NULL, L, P;
    assert_int_equal(epx_mapping_from_pt(f, &m, &L, &P, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "it is a counts file", "per_pass");
    epx_pt_file_destroy(f);
    /* counts must be non-negative: an int32 of -5 */
    int64_t neg[8] = {1, 2, -5, 4, 5, 6, 7, 8};
    f = load(per_pass_dump(0, ids, 2, neg, map, 2, 2, 1), "neg.pt");
    assert_int_equal(epx_counts_from_pt((const epx_pt_file *const *)&f, 1, &c, &err),
                     EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "is -5", "pass 0", "layer 1, slot 0");
    epx_pt_file_destroy(f);
    /* a map id outside the limits */
    int64_t wild[4] = {0, (int64_t)1 << 40, 1, 0};
    f = load(per_pass_dump(0, ids, 2, gpc, wild, 2, 2, 1), "wild.pt");
    assert_int_equal(epx_counts_from_pt((const epx_pt_file *const *)&f, 1, &c, &err),
                     EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "[0][1] is 1099511627776");
    epx_pt_file_destroy(f);
    /* NULL and empty arguments */
    assert_int_equal(epx_counts_from_pt(NULL, 1, &c, &err), EPX_ERR_INVALID_ARG);
    assert_int_equal(epx_counts_from_pt((const epx_pt_file *const *)&f, 0, &c, &err),
                     EPX_ERR_INVALID_ARG);
}

static void stat_dumps_concatenate(void **state) {
    (void)state;
    int64_t a[2 * 2 * 3], b[1 * 2 * 3];
    for (int i = 0; i < 12; i++) a[i] = i;
    for (int i = 0; i < 6; i++) b[i] = 100 + i;
    epx_pt_file *f[2] = {load(stat_dump(a, 2, 2, 3), "a.pt"), load(stat_dump(b, 1, 2, 3), "b.pt")};
    epx_counts *c = NULL;
    epx_error err = {0};
    assert_int_equal(epx_counts_from_pt((const epx_pt_file *const *)f, 2, &c, &err), EPX_OK);
    assert_int_equal(c->num_windows, 3);
    for (int i = 0; i < 12; i++) assert_true(c->data[i] == (double)i);
    for (int i = 0; i < 6; i++) assert_true(c->data[12 + i] == 100.0 + i);
    epx_counts_destroy(c);
    epx_pt_file_destroy(f[0]);
    epx_pt_file_destroy(f[1]);
    /* windows of another shape do not concatenate */
    assert_int_equal(counts_of(stat_dump(a, 1, 2, 3), stat_dump(a, 1, 3, 2), &err), EPX_ERR_SHAPE);
    TU_MSG_HAS(err.msg, "b.pt", "a.pt");
}

/* int64 counts past 2^53: one a double holds (2^53 + 2) reads exactly, one
 * it does not (2^53 + 1, read as 2^53) is refused by value. */
static void int64_counts_exact(void **state) {
    (void)state;
    int64_t lc[2 * 3] = {1, 2, 3, 4, 5, ((int64_t)1 << 53) + 2};
    epx_pt_file *f = load(stat_dump_as(lc, 1, 2, 3, 1), "w.pt");
    epx_counts *c = NULL;
    epx_error err = {0};
    assert_int_equal(epx_counts_from_pt((const epx_pt_file *const *)&f, 1, &c, &err), EPX_OK);
    assert_true(c->data[5] == 0x1p53 + 2 && c->data[4] == 5.0);
    epx_counts_destroy(c);
    epx_pt_file_destroy(f);
    lc[5] = ((int64_t)1 << 53) + 1;
    f = load(stat_dump_as(lc, 1, 2, 3, 1), "w.pt");
    assert_int_equal(epx_counts_from_pt((const epx_pt_file *const *)&f, 1, &c, &err),
                     EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "w.pt", "element 5", "9007199254740993", "2^53");
    epx_pt_file_destroy(f);
}

/* A stat dump as SGLang's ring buffer leaves it: wrapped (the newest passes
 * in the first rows) and with rows never written (zeros). Read for planning
 * it is one window, the sum of its rows, and it plans exactly like that sum
 * given as a one-window count; the sentence says how it was read. */
static void stat_dump_ring_buffer(void **state) {
    (void)state;
    enum { B = 6, L = 3, E = 8 };
    int64_t lc[B * L * E] = {0};
    tu_rng r = {tu_seed(16)};
    /* rows 0-1: passes 7-8 (wrapped); rows 2-3: zeros; rows 4-5: passes 5-6;
     * layer 2 of every row idle */
    const int rows[4] = {0, 1, 4, 5};
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < 2; l++)
            for (int t = 0; t < 3; t++) lc[(rows[k] * L + l) * E + tu_below(&r, E)] += 1;
    char dir[] = "/tmp/epx-stat-XXXXXX", path[128];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/stat.pt", dir);
    blob bl = stat_dump(lc, B, L, E);
    write_blob(bl, path);
    free(bl.zip);
    epx_read_opts o = EPX_READ_OPTS_INIT;
    char how[256];
    o.how = how;
    o.how_cap = sizeof how;
    epx_counts *c = NULL, *sum = NULL, *rows_c = NULL;
    epx_error err = {0};
    assert_int_equal(epx_counts_read_with(path, &o, &c, &err), EPX_OK);
    TU_MSG_HAS(how, "stat dump", "4 of 6 rows non-zero", "summed");
    assert_int_equal(c->num_windows, 1);
    assert_int_equal(epx_counts_create(1, L, E, &sum, &err), EPX_OK);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < L * E; i++) sum->data[i] += (double)lc[b * L * E + i];
    assert_memory_equal(c->data, sum->data, sizeof(double) * L * E);
    /* the rows as windows, on request (and by the old entry points) */
    o.stat_rows = EPX_STAT_ROWS_WINDOWS;
    assert_int_equal(epx_counts_read_with(path, &o, &rows_c, &err), EPX_OK);
    assert_int_equal(rows_c->num_windows, B);
    TU_MSG_HAS(how, "time-ordered windows");
    epx_counts_destroy(rows_c);
    assert_int_equal(epx_counts_read(path, &rows_c, &err), EPX_OK);
    assert_int_equal(rows_c->num_windows, B);
    /* plans like the sum: same map, same weights, all finite */
    const epx_shape shape = {L, E, E + 4, 4, 1};
    epx_plan *pa = NULL, *pb = NULL;
    epx_plan_opts po = EPX_PLAN_OPTS_INIT;
    assert_int_equal(epx_plan_compute(c, &shape, &po, &pa, &err), EPX_OK);
    assert_int_equal(epx_plan_compute(sum, &shape, &po, &pb, &err), EPX_OK);
    const size_t LP = (size_t)L * (size_t)(E + 4);
    assert_memory_equal(epx_layout_physical_to_logical(epx_plan_layout(pa)),
                        epx_layout_physical_to_logical(epx_plan_layout(pb)), LP * sizeof(int32_t));
    assert_memory_equal(epx_plan_replica_weights(pa), epx_plan_replica_weights(pb),
                        LP * sizeof(double));
    for (size_t i = 0; i < LP; i++) assert_true(isfinite(epx_plan_replica_weights(pa)[i]));
    epx_plan_destroy(pa);
    epx_plan_destroy(pb);
    /* the six sparse rows as windows plan too, without NaN */
    assert_int_equal(epx_plan_compute(rows_c, &shape, &po, &pa, &err), EPX_OK);
    for (size_t i = 0; i < LP; i++) assert_true(isfinite(epx_plan_replica_weights(pa)[i]));
    epx_plan_destroy(pa);
    epx_counts_destroy(rows_c);
    /* the same dump in JSON (epx convert --tree keeps every key) */
    char json[128];
    snprintf(json, sizeof json, "%s/stat.json", dir);
    FILE *f = fopen(json, "w");
    assert_non_null(f);
    fputs("{\"rank\": 0, \"average_utilization_rate_over_window\": null, \"logical_count\": [", f);
    for (int b = 0; b < B; b++) {
        fputs(b ? ", [" : "[", f);
        for (int l = 0; l < L; l++) {
            fputs(l ? ", [" : "[", f);
            for (int e = 0; e < E; e++)
                fprintf(f, e ? ", %lld" : "%lld", (long long)lc[(b * L + l) * E + e]);
            fputs("]", f);
        }
        fputs("]", f);
    }
    fputs("]}\n", f);
    fclose(f);
    o.stat_rows = EPX_STAT_ROWS_SUM;
    assert_int_equal(epx_counts_read_with(json, &o, &rows_c, &err), EPX_OK);
    assert_int_equal(rows_c->num_windows, 1);
    assert_memory_equal(rows_c->data, sum->data, sizeof(double) * L * E);
    TU_MSG_HAS(how, "stat dump", "4 of 6 rows non-zero");
    epx_counts_destroy(rows_c);
    /* the same dump twice (its path twice, or a copy) is refused: its
     * passes would count twice; beside a plain logical_count file too */
    char two[300];
    snprintf(two, sizeof two, "%s,%s", path, path);
    assert_int_equal(epx_counts_read_with(two, &o, &rows_c, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "hold the same stat dump");
    char plain[128];
    snprintf(plain, sizeof plain, "%s/plain.pt", dir);
    epx_counts *pc = NULL;
    assert_int_equal(epx_counts_create(1, L, E, &pc, &err), EPX_OK);
    assert_int_equal(epx_counts_write_pt(pc, plain, EPX_PT_DTYPE_AUTO, &err), EPX_OK);
    epx_counts_destroy(pc);
    snprintf(two, sizeof two, "%s,%s", path, plain);
    assert_int_equal(epx_counts_read_with(two, &o, &rows_c, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "is a stat dump but", "is a logical_count file (not a stat dump)");
    /* rows as windows asked of a file with no stat dump: refused */
    o.stat_rows = EPX_STAT_ROWS_WINDOWS;
    assert_int_equal(epx_counts_read_with(plain, &o, &rows_c, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "holds no stat dump");
    o.stat_rows = EPX_STAT_ROWS_SUM;
    unlink(plain);
    /* bad options */
    o.window_passes = -1;
    assert_int_equal(epx_counts_read_with(path, &o, &rows_c, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "window_passes (-1)");
    o.window_passes = 0;
    o.version = 1;
    assert_int_equal(epx_counts_read_with(path, &o, &rows_c, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "EPX_READ_OPTS_INIT");
    epx_counts_destroy(c);
    epx_counts_destroy(sum);
    unlink(path);
    unlink(json);
    rmdir(dir);
}

/* per_pass dumps grouped --window-passes at a time, in forward_pass_id order
 * whatever the order of the records: each window is the sum of its passes;
 * a group size that does not divide the passes is refused (it made a short
 * last window). */
static void per_pass_windows(void **state) {
    (void)state;
    enum { L = 2, E = 3, P = 4, NP = 6 };
    const int64_t map[L * P] = {0, 1, 2, 0, 2, 1, 0, 1};
    const int64_t ids[NP] = {40, 12, 30, 11, 50, 13}; /* any order, gaps */
    int64_t gpc[NP * L * P];
    for (int i = 0; i < NP * L * P; i++) gpc[i] = (i * 7919) % 13;
    char dir[] = "/tmp/epx-pass-XXXXXX", path[128];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/rank0.pt", dir);
    blob bl = per_pass_dump(0, ids, NP, gpc, map, L, P, 1);
    write_blob(bl, path);
    free(bl.zip);
    epx_counts *one = NULL, *grp = NULL;
    epx_error err = {0};
    assert_int_equal(epx_counts_read_pt(path, &one, &err), EPX_OK); /* a window per pass */
    assert_int_equal(one->num_windows, NP);
    epx_read_opts o = EPX_READ_OPTS_INIT;
    char how[256];
    o.how = how;
    o.how_cap = sizeof how;
    o.window_passes = 4;
    assert_int_equal(epx_counts_read_with(path, &o, &grp, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "(--window-passes 4) does not divide the 6 forward passes",
               "a divisor of 6 (1, 2, 3, 6)");
    o.window_passes = 12;
    assert_int_equal(epx_counts_read_with(path, &o, &grp, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "more than all of them");
    assert_null(grp);
    o.window_passes = 3;
    assert_int_equal(epx_counts_read_with(path, &o, &grp, &err), EPX_OK);
    assert_int_equal(grp->num_windows, 2); /* 3 + 3 passes */
    TU_MSG_HAS(how, "6 forward passes", "ids 11 to 50", "3 passes per window", "2 windows");
    for (int w = 0; w < 2; w++)
        for (int l = 0; l < L; l++)
            for (int e = 0; e < E; e++) {
                double ref = 0.0;
                for (int k = 3 * w; k < 3 * w + 3 && k < NP; k++)
                    ref += epx_counts_row(one, k, l)[e];
                assert_true(epx_counts_row(grp, w, l)[e] == ref);
            }
    epx_counts_destroy(grp);
    /* rows as windows of a stat dump asked of per_pass dumps: refused (it
     * did nothing); the series form reads them as they are */
    o.stat_rows = EPX_STAT_ROWS_WINDOWS;
    assert_int_equal(epx_counts_read_with(path, &o, &grp, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "holds no stat dump");
    o.stat_rows = EPX_STAT_ROWS_WINDOWS_IF_STAT;
    assert_int_equal(epx_counts_read_with(path, &o, &grp, &err), EPX_OK);
    assert_int_equal(grp->num_windows, 2);
    epx_counts_destroy(one);
    epx_counts_destroy(grp);
    unlink(path);
    rmdir(dir);
}

/* A directory is read in name order; a comma list in the order given. */
static void spec_forms(void **state) {
    (void)state;
    char dir[] = "/tmp/epx-dumps-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char p1[128], p2[128], p3[128], list[300];
    snprintf(p1, sizeof p1, "%s/b.pt", dir);
    snprintf(p2, sizeof p2, "%s/a.pt", dir);
    snprintf(p3, sizeof p3, "%s/notes.txt", dir);
    int64_t x[2] = {1, 2}, y[2] = {3, 4};
    blob bx = stat_dump(x, 1, 1, 2), by = stat_dump(y, 1, 1, 2);
    write_blob(bx, p1);
    write_blob(by, p2);
    free(bx.zip);
    free(by.zip);
    FILE *t = fopen(p3, "w");
    fputs("not a dump", t);
    fclose(t);
    epx_counts *c = NULL;
    epx_error err = {0};
    assert_int_equal(epx_counts_read_pt(dir, &c, &err), EPX_OK); /* a.pt (y) first */
    assert_int_equal(c->num_windows, 2);
    assert_true(c->data[0] == 3 && c->data[2] == 1);
    epx_counts_destroy(c);
    snprintf(list, sizeof list, "%s,%s", p1, p2); /* b.pt (x) first */
    assert_int_equal(epx_counts_read(list, &c, &err), EPX_OK);
    assert_true(c->data[0] == 1 && c->data[2] == 3);
    epx_counts_destroy(c);
    snprintf(list, sizeof list, "%s,,%s", p1, p2);
    assert_int_equal(epx_counts_read_pt(list, &c, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "empty name");
    snprintf(list, sizeof list, "%s,%s/missing.pt", p1, dir);
    assert_int_equal(epx_counts_read_pt(list, &c, &err), EPX_ERR_IO);
    TU_MSG_HAS(err.msg, "missing.pt");
    unlink(p1);
    unlink(p2);
    assert_int_equal(epx_counts_read_pt(dir, &c, &err), EPX_ERR_IO);
    TU_MSG_HAS(err.msg, "no .pt files");
    unlink(p3);
    rmdir(dir);
}

/* Init files: a map tensor of floats holding integers is accepted (torch
 * users save float maps), fractions, negatives and NaN loads are not. */
static void init_file_values(void **state) {
    (void)state;
    ptb b = {0};
    int64_t shape[2] = {1, 2};
    ptb_proto(&b);
    ptb_op(&b, '}');
    ptb_str(&b, "physical_to_logical_map");
    ptb_dense(&b, "DoubleStorage", "0", shape, 2);
    ptb_op(&b, 's');
    ptb_op(&b, '.');
    double vals[2] = {1.0, 0.0};
    const uint8_t *stor[1] = {(const uint8_t *)vals};
    size_t slen[1] = {16}, len = 0;
    uint8_t *zip = ptb_archive(&b, stor, slen, 1, &len);
    epx_pt_file *f = NULL;
    epx_error err = {0};
    assert_int_equal(epx_pt_load_buffer(zip, len, "fmap.pt", &f, &err), EPX_OK);
    int32_t *map = NULL, L = 0, P = 0;
    assert_int_equal(epx_mapping_from_pt(f, &map, &L, &P, &err), EPX_OK);
    assert_int_equal(L, 1);
    assert_int_equal(P, 2);
    assert_int_equal(map[0], 1);
    epx_free(map);
    epx_pt_file_destroy(f);
    free(zip);

    vals[1] = 0.5;
    zip = ptb_archive(&b, stor, slen, 1, &len);
    assert_int_equal(epx_pt_load_buffer(zip, len, "fmap.pt", &f, &err), EPX_OK);
    assert_int_equal(epx_mapping_from_pt(f, &map, &L, &P, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "not an integer", "fmap.pt");
    epx_pt_file_destroy(f);
    free(zip);

    vals[1] = -1;
    zip = ptb_archive(&b, stor, slen, 1, &len);
    assert_int_equal(epx_pt_load_buffer(zip, len, "fmap.pt", &f, &err), EPX_OK);
    assert_int_equal(epx_mapping_from_pt(f, &map, &L, &P, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "[0][1] is -1");
    epx_pt_file_destroy(f);
    free(zip);
    free(b.p);

    b = (ptb){0}; /* logical_count with a NaN */
    ptb_proto(&b);
    ptb_op(&b, '}');
    ptb_str(&b, "logical_count");
    ptb_dense(&b, "DoubleStorage", "0", shape, 2);
    ptb_op(&b, 's');
    ptb_op(&b, '.');
    vals[1] = NAN;
    zip = ptb_archive(&b, stor, slen, 1, &len);
    assert_int_equal(epx_pt_load_buffer(zip, len, "nan.pt", &f, &err), EPX_OK);
    epx_counts *c = NULL;
    assert_int_equal(epx_counts_from_pt((const epx_pt_file *const *)&f, 1, &c, &err),
                     EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "[0][0][1]", "finite");
    epx_pt_file_destroy(f);
    free(zip);
    free(b.p);

    b = (ptb){0}; /* a root that is not a dict, and a dict of neither key */
    ptb_proto(&b);
    ptb_op(&b, ']');
    ptb_op(&b, '.');
    zip = ptb_archive(&b, NULL, NULL, 0, &len);
    assert_int_equal(epx_pt_load_buffer(zip, len, "list.pt", &f, &err), EPX_OK);
    assert_int_equal(epx_counts_from_pt((const epx_pt_file *const *)&f, 1, &c, &err),
                     EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "holds a list, not a dict");
    epx_pt_file_destroy(f);
    free(zip);
    free(b.p);
    b = (ptb){0};
    ptb_proto(&b);
    ptb_op(&b, '}');
    ptb_str(&b, "state_dict");
    ptb_op(&b, '}');
    ptb_op(&b, 's');
    ptb_op(&b, '.');
    zip = ptb_archive(&b, NULL, NULL, 0, &len);
    assert_int_equal(epx_pt_load_buffer(zip, len, "model.pt", &f, &err), EPX_OK);
    assert_int_equal(epx_counts_from_pt((const epx_pt_file *const *)&f, 1, &c, &err),
                     EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "'state_dict'", "neither");
    assert_int_equal(epx_mapping_from_pt(f, &map, &L, &P, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "'state_dict'");
    epx_pt_file_destroy(f);
    free(zip);
    free(b.p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(per_pass_random),
        cmocka_unit_test(per_pass_errors),
        cmocka_unit_test(stat_dumps_concatenate),
        cmocka_unit_test(int64_counts_exact),
        cmocka_unit_test(spec_forms),
        cmocka_unit_test(init_file_values),
        cmocka_unit_test(stat_dump_ring_buffer),
        cmocka_unit_test(per_pass_windows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
