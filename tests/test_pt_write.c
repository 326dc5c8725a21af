/*
 * test_pt_write.c - the .pt writers: random counts and maps read back
 * exactly (float32 as its rounding), the zip layout matches torch.save's
 * (entry names and order, stored, every entry's data 64-byte aligned), the
 * dtype rules, and failures that leave nothing behind. Loading by torch
 * itself is tests/cli/pt_torch.sh (skipped where torch is not installed).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

static epx_pt_dtype stored_dtype(const char *path, const char *key, int *ndim) {
    epx_pt_file *f = NULL;
    epx_error err = {0};
    if (epx_pt_load(path, &f, &err) != EPX_OK) fail_msg("%s", err.msg);
    epx_pt_tensor t;
    assert_int_equal(epx_pt_value_tensor(epx_pt_dict_get(epx_pt_file_root(f), key), &t, &err),
                     EPX_OK);
    assert_int_equal(epx_pt_value_len(epx_pt_file_root(f)), 1); /* that one key only */
    *ndim = t.ndim;
    epx_pt_file_destroy(f);
    return t.dtype;
}

static void counts_round_trip(void **state) {
    (void)state;
    tu_rng r = {tu_seed(31337)};
    const epx_pt_dtype dts[] = {EPX_PT_DTYPE_INT64, EPX_PT_DTYPE_INT32, EPX_PT_DTYPE_FLOAT32,
                                EPX_PT_DTYPE_FLOAT64, EPX_PT_DTYPE_AUTO};
    char *path = tu_tmp_path(".pt");
    for (int iter = 0; iter < 40; iter++) {
        int32_t S = 1 + (int32_t)tu_below(&r, 3), L = 1 + (int32_t)tu_below(&r, 5),
                E = 1 + (int32_t)tu_below(&r, 40);
        int integral = iter % 2 == 0;
        epx_counts *c = NULL;
        epx_error err = {0};
        assert_int_equal(epx_counts_create(S, L, E, &c, &err), EPX_OK);
        size_t n = (size_t)S * (size_t)L * (size_t)E;
        for (size_t i = 0; i < n; i++)
            c->data[i] = integral ? (double)tu_below(&r, 1u << 30) : tu_uniform(&r) * 1e6;
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
            epx_status st = epx_counts_write_pt(c, path, dts[d], &err);
            int is_int = dts[d] == EPX_PT_DTYPE_INT64 || dts[d] == EPX_PT_DTYPE_INT32;
            if (is_int && !integral) {
                assert_int_equal(st, EPX_ERR_INVALID_ARG);
                TU_MSG_HAS(err.msg, "[0][0][0]", "float32 or float64");
                continue;
            }
            /* a whole count float32 would round is refused, not rounded */
            size_t inexact = n;
            for (size_t i = n; i-- > 0;)
                if (integral && (double)(float)c->data[i] != c->data[i]) inexact = i;
            if (dts[d] == EPX_PT_DTYPE_FLOAT32 && inexact < n) {
                assert_int_equal(st, EPX_ERR_INVALID_ARG);
                TU_MSG_HAS(err.msg, "float32 cannot hold exactly", "2^24", "int64 or float64");
                continue;
            }
            if (st != EPX_OK) fail_msg("%s", err.msg);
            int ndim = 0;
            epx_pt_dtype got = stored_dtype(path, "logical_count", &ndim);
            epx_pt_dtype want = dts[d] != EPX_PT_DTYPE_AUTO ? dts[d]
                                : integral                  ? EPX_PT_DTYPE_INT64
                                                            : EPX_PT_DTYPE_FLOAT64;
            assert_int_equal(got, want);
            assert_int_equal(ndim, S == 1 ? 2 : 3); /* [L][E] for one window */
            epx_counts *back = NULL;
            if (epx_counts_read(path, &back, &err) != EPX_OK) fail_msg("%s", err.msg);
            assert_int_equal(back->num_windows, S);
            assert_int_equal(back->num_layers, L);
            assert_int_equal(back->num_experts, E);
            for (size_t i = 0; i < n; i++) {
                double w = want == EPX_PT_DTYPE_FLOAT32 ? (double)(float)c->data[i] : c->data[i];
                if (back->data[i] != w)
                    fail_msg("[%zu]: %.17g read back as %.17g", i, w, back->data[i]);
            }
            epx_counts_destroy(back);
        }
        epx_counts_destroy(c);
    }
    unlink(path);
    free(path);
}

static void mapping_round_trip(void **state) {
    (void)state;
    tu_rng r = {tu_seed(4242)};
    char *path = tu_tmp_path(".pt");
    for (int iter = 0; iter < 30; iter++) {
        int32_t G = 1 + (int32_t)tu_below(&r, 8), E = 1 + (int32_t)tu_below(&r, 64);
        int32_t P = ((E + G - 1) / G + (int32_t)tu_below(&r, 3)) * G,
                L = 1 + (int32_t)tu_below(&r, 6);
        int32_t *map = malloc(sizeof *map * (size_t)(L * P));
        for (int32_t l = 0; l < L; l++)
            for (int32_t p = 0; p < P; p++)
                map[l * P + p] = p < E ? (p + 3 * l) % E : (int32_t)tu_below(&r, (uint32_t)E);
        epx_shape s = {L, E, P, G, 1};
        epx_layout *lay = NULL;
        epx_error err = {0};
        if (epx_layout_create_from_map(&s, map, &lay, &err) != EPX_OK) fail_msg("%s", err.msg);
        assert_int_equal(epx_layout_write_pt(lay, path, &err), EPX_OK);
        int ndim = 0;
        assert_int_equal(stored_dtype(path, "physical_to_logical_map", &ndim), EPX_PT_DTYPE_INT64);
        int32_t *back = NULL, BL = 0, BP = 0;
        if (epx_mapping_read(path, &back, &BL, &BP, &err) != EPX_OK) fail_msg("%s", err.msg);
        assert_int_equal(BL, L);
        assert_int_equal(BP, P);
        assert_memory_equal(back, map, sizeof *map * (size_t)(L * P));
        /* and the init entry point builds the same layout from it */
        epx_init_opts o = EPX_INIT_OPTS_INIT;
        o.num_gpus = G;
        o.num_logical_experts = E;
        epx_layout *lay2 = NULL;
        if (epx_layout_init(path, &o, &lay2, &err) != EPX_OK) fail_msg("%s", err.msg);
        assert_memory_equal(epx_layout_physical_to_logical(lay2), map,
                            sizeof *map * (size_t)(L * P));
        epx_layout_destroy(lay2);
        epx_free(back);
        epx_layout_destroy(lay);
        free(map);
    }
    unlink(path);
    free(path);
}

static uint32_t rd16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t rd32(const uint8_t *p) { return rd16(p) | rd16(p + 2) << 16; }

/* Walk the local headers: names in torch's order, stored, data aligned. */
static void archive_layout(void **state) {
    (void)state;
    char dir[] = "/tmp/epx-ptw-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/my counts.pt", dir);
    /* an existing non-zip file is replaced */
    FILE *old = fopen(path, "w");
    fputs("{\"logical_count\": [[1]]}", old);
    fclose(old);
    epx_counts *c = NULL;
    epx_error err = {0};
    assert_int_equal(epx_counts_create(2, 3, 5, &c, &err), EPX_OK);
    for (int i = 0; i < 30; i++) c->data[i] = i;
    assert_int_equal(epx_counts_write_pt(c, path, EPX_PT_DTYPE_INT32, &err), EPX_OK);
    size_t len = 0;
    uint8_t *z = (uint8_t *)tu_read_file(path, &len);
    assert_non_null(z);
    static const char *const names[] = {
        "data.pkl", ".format_version", ".storage_alignment",    "byteorder",
        "data/0",   "version",         ".data/serialization_id"};
    size_t at = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        assert_true(at + 30 <= len);
        assert_int_equal(rd32(z + at), 0x04034b50); /* local file header */
        assert_int_equal(rd16(z + at + 6) & 8, 0);  /* no data descriptor */
        assert_int_equal(rd16(z + at + 8), 0);      /* stored */
        uint32_t csize = rd32(z + at + 18), nlen = rd16(z + at + 26), xlen = rd16(z + at + 28);
        char want[64];
        snprintf(want, sizeof want, "my_counts/%s", names[i]); /* the stem, sanitised */
        assert_int_equal(nlen, strlen(want));
        assert_memory_equal(z + at + 30, want, nlen);
        size_t data = at + 30 + nlen + xlen;
        if (data % 64 != 0) fail_msg("%s starts at %zu, not 64-byte aligned", want, data);
        if (strcmp(names[i], "data/0") == 0) assert_int_equal(csize, 30 * 4);
        if (strcmp(names[i], "byteorder") == 0) assert_memory_equal(z + data, "little", 6);
        if (strcmp(names[i], "version") == 0) assert_memory_equal(z + data, "3\n", 2);
        at = data + csize;
    }
    assert_int_equal(rd32(z + at), 0x02014b50); /* then the central directory */
    /* same content, same bytes: the serialization id is a content hash */
    assert_int_equal(epx_counts_write_pt(c, path, EPX_PT_DTYPE_INT32, &err), EPX_OK);
    size_t len2 = 0;
    uint8_t *z2 = (uint8_t *)tu_read_file(path, &len2);
    assert_int_equal(len2, len);
    assert_memory_equal(z2, z, len);
    free(z2);
    free(z);
    epx_counts_destroy(c);
    unlink(path);
    rmdir(dir);
}

static void write_errors(void **state) {
    (void)state;
    epx_counts *c = NULL;
    epx_error err = {0};
    assert_int_equal(epx_counts_create(1, 1, 2, &c, &err), EPX_OK);
    c->data[0] = 1;
    c->data[1] = 0x1p40;
    char *path = tu_tmp_path(".pt");
    assert_int_equal(epx_counts_write_pt(c, path, EPX_PT_DTYPE_INT32, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "[0][0][1] is 1099511627776", "int32", "int64 or float64");
    /* float32 rounds whole numbers above 2^24: 16777217 read back as 16777216 */
    c->data[1] = 16777217;
    assert_int_equal(epx_counts_write_pt(c, path, EPX_PT_DTYPE_FLOAT32, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "[0][0][1] is 16777217", "float32 cannot hold exactly", "int64 or float64");
    assert_int_equal(access(path, F_OK), -1);
    c->data[1] = 16777216; /* 2^24 and 2^40 float32 holds exactly */
    assert_int_equal(epx_counts_write_pt(c, path, EPX_PT_DTYPE_FLOAT32, &err), EPX_OK);
    unlink(path);
    c->data[1] = 0x1p40;
    assert_int_equal(epx_counts_write_pt(c, path, EPX_PT_DTYPE_FLOAT32, &err), EPX_OK);
    unlink(path);
    assert_int_equal(access(path, F_OK), -1); /* nothing written */
    assert_int_equal(epx_counts_write_pt(c, path, EPX_PT_DTYPE_BFLOAT16, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "bfloat16");
    /* only loads the readers take back: finite, >= 0, at most 2^63 in all
     * (NaN was written as bare nan in JSON, 1e39 as float32 inf) */
    const double bad[] = {NAN, -3.0, 1e39, 1e19};
    const char *say[] = {"counts[1] is nan", "counts[1] is -3", "above 2^63", "above 2^63"};
    for (int k = 0; k < 4; k++) {
        c->data[1] = bad[k];
        assert_int_equal(epx_counts_write_pt(c, path, EPX_PT_DTYPE_FLOAT32, &err),
                         EPX_ERR_INVALID_ARG);
        TU_MSG_HAS(err.msg, say[k]);
        assert_int_equal(epx_counts_write_json(c, path, &err), EPX_ERR_INVALID_ARG);
        TU_MSG_HAS(err.msg, say[k]);
        assert_int_equal(access(path, F_OK), -1);
    }
    c->data[1] = 0x1p40;
    assert_int_equal(epx_counts_write_pt(c, "/nonexistent-dir/x.pt", EPX_PT_DTYPE_AUTO, &err),
                     EPX_ERR_IO);
    TU_MSG_HAS(err.msg, "/nonexistent-dir/x.pt");
    assert_int_equal(epx_counts_write_pt(NULL, path, EPX_PT_DTYPE_AUTO, &err), EPX_ERR_INVALID_ARG);
    assert_int_equal(epx_layout_write_pt(NULL, path, &err), EPX_ERR_INVALID_ARG);
    /* large integral counts keep every bit in int64 */
    c->data[1] = 0x1p60 + 1024;
    assert_int_equal(epx_counts_write_pt(c, path, EPX_PT_DTYPE_AUTO, &err), EPX_OK);
    epx_counts *back = NULL;
    assert_int_equal(epx_counts_read(path, &back, &err), EPX_OK);
    assert_true(back->data[1] == 0x1p60 + 1024);
    epx_counts_destroy(back);
    unlink(path);
    free(path);
    epx_counts_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(counts_round_trip),
        cmocka_unit_test(mapping_round_trip),
        cmocka_unit_test(archive_layout),
        cmocka_unit_test(write_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
