/*
 * test_pt_hostile.c - the .pt reader against files that lie: globals that
 * would run code, sizes that claim more than is there, memo and string
 * lengths out of range, deep or recursive nesting, broken zips, and
 * thousands of mutated and truncated copies of the fixtures. Every one must
 * end in an error with a message (or, for a harmless mutation, a valid
 * tree), never a crash: the suite also runs under ASan/UBSan. A pickle of
 * a million small values costs at most 64 bytes per value once loaded.
 */
#include <malloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zip.h>

#include "pt_build.h"
#include "testutil.h"

/* Load `pkl` inside a torch-shaped archive with storages; returns status. */
static epx_status load_pickle(const ptb *pkl, const uint8_t *const *stor, const size_t *slen,
                              size_t nstor, epx_pt_file **out, epx_error *err) {
    size_t len = 0;
    uint8_t *zip = ptb_archive(pkl, stor, slen, nstor, &len);
    assert_non_null(zip);
    epx_pt_file *f = NULL;
    epx_status st = epx_pt_load_buffer(zip, len, "test.pt", &f, err);
    free(zip);
    if (st == EPX_OK) {
        assert_non_null(f);
        assert_non_null(epx_pt_file_root(f));
    } else {
        assert_null(f);
        assert_int_equal(err->status, st);
        assert_true(err->msg[0] != '\0');
    }
    if (out)
        *out = f;
    else
        epx_pt_file_destroy(f);
    return st;
}

/* Expect status `want` and a message containing `needle`. */
static void expect(const ptb *pkl, epx_status want, const char *needle) {
    static const uint8_t eight[8] = {1, 0, 0, 0, 2, 0, 0, 0};
    const uint8_t *stor[1] = {eight};
    size_t slen[1] = {8};
    epx_error err = {0};
    epx_status st = load_pickle(pkl, stor, slen, 1, NULL, &err);
    if (st != want)
        fail_msg("status %s, expected %s: %s", epx_status_str(st), epx_status_str(want), err.msg);
    if (needle) TU_MSG_HAS(err.msg, needle);
    free(pkl->p);
}

static void refuses_code(void **state) {
    (void)state;
    ptb b = {0};
    ptb_proto(&b); /* {'logical_count': posix.system('touch x')} */
    ptb_op(&b, '}');
    ptb_str(&b, "logical_count");
    ptb_global(&b, "posix", "system");
    ptb_str(&b, "touch /tmp/epx-should-not-exist");
    ptb_op(&b, 0x85);
    ptb_op(&b, 'R');
    ptb_op(&b, 's');
    ptb_op(&b, '.');
    expect(&b, EPX_ERR_REFUSED, "posix.system");

    b = (ptb){0}; /* protocol 4's STACK_GLOBAL names builtins.eval */
    ptb_op(&b, 0x80);
    ptb_op(&b, 4);
    ptb_op(&b, 0x8c);
    ptb_op(&b, 8);
    ptb_raw(&b, "builtins", 8);
    ptb_op(&b, 0x8c);
    ptb_op(&b, 4);
    ptb_raw(&b, "eval", 4);
    ptb_op(&b, 0x93);
    ptb_str(&b, "1+1");
    ptb_op(&b, 0x85);
    ptb_op(&b, 'R');
    ptb_op(&b, '.');
    expect(&b, EPX_ERR_REFUSED, "builtins.eval");

    b = (ptb){0}; /* INST builds os.system's class directly */
    ptb_proto(&b);
    ptb_op(&b, '(');
    ptb_str(&b, "id");
    ptb_op(&b, 'i');
    ptb_raw(&b, "os\nsystem\n", 10);
    ptb_op(&b, '.');
    expect(&b, EPX_ERR_REFUSED, "os.system");

    b = (ptb){0}; /* torch globals other than the three are refused too */
    ptb_proto(&b);
    ptb_global(&b, "torch._utils", "_rebuild_parameter");
    ptb_op(&b, '.');
    expect(&b, EPX_ERR_REFUSED, "torch._utils._rebuild_parameter");

    b = (ptb){0}; /* a hostile name cannot garble the message */
    ptb_proto(&b);
    ptb_global(&b, "os\x1b[2J", "system");
    ptb_op(&b, '.');
    expect(&b, EPX_ERR_REFUSED, "os?[2J.system");

    b = (ptb){0}; /* NEWOBJ of an allowed class still builds an instance */
    ptb_proto(&b);
    ptb_global(&b, "collections", "OrderedDict");
    ptb_op(&b, ')');
    ptb_op(&b, 0x81);
    ptb_op(&b, '.');
    expect(&b, EPX_ERR_REFUSED, "class instance");

    b = (ptb){0}; /* the extension registry names globals by number */
    ptb_proto(&b);
    ptb_op(&b, 0x82);
    ptb_op(&b, 1);
    ptb_op(&b, '.');
    expect(&b, EPX_ERR_REFUSED, "extension registry");

    b = (ptb){0}; /* a bare storage class is not data */
    ptb_proto(&b);
    ptb_global(&b, "torch", "FloatStorage");
    ptb_op(&b, '.');
    expect(&b, EPX_ERR_PARSE, "bare storage or class");

    b = (ptb){0}; /* nor is calling one */
    ptb_proto(&b);
    ptb_global(&b, "torch", "FloatStorage");
    ptb_op(&b, ')');
    ptb_op(&b, 'R');
    ptb_op(&b, '.');
    expect(&b, EPX_ERR_UNSUPPORTED, "FloatStorage");
}

/* One tensor {'t': tensor} over the 8-byte storage, with given geometry. */
static void tensor_case(const char *cls, int64_t numel, int64_t off, const int64_t *shape,
                        const int64_t *stride, int nd, epx_status want, const char *needle) {
    ptb b = {0};
    ptb_proto(&b);
    ptb_op(&b, '}');
    ptb_str(&b, "t");
    ptb_tensor(&b, cls, "0", numel, off, shape, stride, nd);
    ptb_op(&b, 's');
    ptb_op(&b, '.');
    expect(&b, want, needle);
}

/* An empty tensor of huge dimensions (0 x 2^40 x 2^40, strides that are
 * row-major for them) holds nothing: copying its zero elements is EPX_OK.
 * The contiguity test multiplied 2^40 by 2^40 in int64 first. */
static void empty_tensor_of_huge_dims(void **state) {
    (void)state;
    const double none[1] = {0};
    epx_pt_tensor t = {EPX_PT_DTYPE_FLOAT64,
                       3,
                       {0, (int64_t)1 << 40, (int64_t)1 << 40},
                       {0, (int64_t)1 << 40, 1},
                       0,
                       0,
                       none};
    int64_t numel = -1;
    epx_error err = {0};
    assert_int_equal(epx_pt_tensor_numel(&t, &numel, &err), EPX_OK);
    assert_int_equal(numel, 0);
    double out[1] = {7.0};
    int64_t outi[1] = {7};
    assert_int_equal(epx_pt_tensor_to_f64(&t, out, 0, &err), EPX_OK);
    t.dtype = EPX_PT_DTYPE_INT64;
    assert_int_equal(epx_pt_tensor_to_i64(&t, outi, 0, &err), EPX_OK);
    assert_true(out[0] == 7.0 && outi[0] == 7);
}

static void checks_tensor_sizes(void **state) {
    (void)state;
    int64_t s1[1] = {2}, st1[1] = {1};
    tensor_case("IntStorage", 2, 0, s1, st1, 1, EPX_OK, NULL);
    /* the storage claims more elements than data/0 holds */
    tensor_case("IntStorage", 1000, 0, s1, st1, 1, EPX_ERR_PARSE, "holds 8 bytes");
    tensor_case("LongStorage", 2, 0, s1, st1, 1, EPX_ERR_PARSE, "holds 8 bytes");
    tensor_case("IntStorage", -1, 0, s1, st1, 1, EPX_ERR_PARSE, "claims -1");
    /* the view reaches past the storage */
    int64_t s3[1] = {3};
    tensor_case("IntStorage", 2, 0, s3, st1, 1, EPX_ERR_PARSE, "reaches storage element 2");
    tensor_case("IntStorage", 2, 1, s1, st1, 1, EPX_ERR_PARSE, "reaches storage element 2");
    int64_t big[1] = {(int64_t)1 << 40};
    tensor_case("IntStorage", 2, 0, big, st1, 1, EPX_ERR_PARSE, "reaches storage element");
    /* an expanded view (stride 0) may not ask for a huge copy */
    int64_t zero[1] = {0};
    tensor_case("IntStorage", 2, 0, big, zero, 1, EPX_ERR_UNSUPPORTED, "expanded views");
    int64_t small[1] = {1000};
    tensor_case("IntStorage", 2, 0, small, zero, 1, EPX_OK, NULL);
    /* sizes whose product or extent overflows int64 */
    int64_t ov[2] = {(int64_t)1 << 62, 8}, ovs[2] = {1, 1};
    tensor_case("IntStorage", 2, 0, ov, ovs, 2, EPX_ERR_OVERFLOW, "overflows");
    int64_t one[2] = {2, 1}, huge[2] = {(int64_t)1 << 62, (int64_t)1 << 62};
    tensor_case("IntStorage", 2, 0, one, huge, 2, EPX_ERR_PARSE, "reaches");
    int64_t ex[2] = {3, 3}, exs[2] = {(int64_t)1 << 62, (int64_t)1 << 62};
    tensor_case("IntStorage", 2, 0, ex, exs, 2, EPX_ERR_OVERFLOW, "extent overflows");
    /* size and stride disagree; too many dims */
    tensor_case("IntStorage", 2, 0, s1, st1, 0, EPX_OK, NULL); /* a 0-d scalar */
    int64_t d17[17] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    tensor_case("IntStorage", 2, 0, d17, d17, 17, EPX_ERR_UNSUPPORTED, "dimensions");
    /* an empty tensor needs no data, whatever its strides */
    int64_t e0[2] = {0, (int64_t)1 << 40}, es[2] = {(int64_t)1 << 50, 1};
    tensor_case("IntStorage", 2, 0, e0, es, 2, EPX_OK, NULL);
    /* unknown storage class */
    tensor_case("ComplexFloatStorage", 1, 0, s1, st1, 1, EPX_ERR_REFUSED,
                "torch.ComplexFloatStorage");

    /* A large index would be out of range on 64-bit storage math if the
     * stride of a size-1 dimension were trusted; it is legal and harmless. */
    int64_t sh[2] = {1, 2}, sst[2] = {INT64_MAX, 1};
    tensor_case("IntStorage", 2, 0, sh, sst, 2, EPX_OK, NULL);
}

static void checks_pickle_lengths(void **state) {
    (void)state;
    ptb b = {0};
    ptb_proto(&b); /* a string claiming 2 GiB */
    ptb_op(&b, 'X');
    ptb_le(&b, 0x7fffffff, 4);
    ptb_raw(&b, "abc", 3);
    expect(&b, EPX_ERR_PARSE, "claims 2147483647 bytes");

    b = (ptb){0};
    ptb_proto(&b);
    ptb_op(&b, 0x8d); /* BINUNICODE8 claiming 2^63 */
    ptb_le(&b, (uint64_t)1 << 63, 8);
    expect(&b, EPX_ERR_PARSE, "claims");

    b = (ptb){0};
    ptb_proto(&b);
    ptb_op(&b, 0x8b); /* LONG4 claiming 4 GiB */
    ptb_le(&b, 0xffffffffu, 4);
    expect(&b, EPX_ERR_PARSE, "claims");

    b = (ptb){0};
    ptb_proto(&b);
    ptb_op(&b, 0x8a); /* LONG1 of 9 bytes that is really wider than 64 bits */
    ptb_op(&b, 9);
    ptb_raw(&b, "\x01\x00\x00\x00\x00\x00\x00\x00\x01", 9);
    ptb_op(&b, '.');
    expect(&b, EPX_ERR_UNSUPPORTED, "64 bits");

    b = (ptb){0};
    ptb_proto(&b);
    ptb_op(&b, 0x8a); /* ... and one that is sign extension only: fine (-2) */
    ptb_op(&b, 9);
    ptb_raw(&b, "\xfe\xff\xff\xff\xff\xff\xff\xff\xff", 9);
    ptb_op(&b, '.');
    expect(&b, EPX_OK, NULL);

    b = (ptb){0};
    ptb_proto(&b);
    ptb_op(&b, ']');
    ptb_op(&b, 'r'); /* LONG_BINPUT far beyond the pickle */
    ptb_le(&b, 0xfffffff0u, 4);
    ptb_op(&b, '.');
    expect(&b, EPX_ERR_PARSE, "memo index 4294967280");

    b = (ptb){0};
    ptb_proto(&b);
    ptb_op(&b, 'j'); /* LONG_BINGET of nothing */
    ptb_le(&b, 7, 4);
    ptb_op(&b, '.');
    expect(&b, EPX_ERR_PARSE, "never stored");

    b = (ptb){0};
    ptb_proto(&b);
    ptb_op(&b, 'c'); /* GLOBAL without its newline */
    for (int i = 0; i < 600; i++) ptb_op(&b, 'a');
    expect(&b, EPX_ERR_PARSE, "newline");

    b = (ptb){0};
    ptb_proto(&b);
    ptb_strn(&b, "\xc3\x28", 2); /* invalid UTF-8 */
    ptb_op(&b, '.');
    expect(&b, EPX_ERR_PARSE, "UTF-8");

    b = (ptb){0};
    ptb_proto(&b);
    ptb_op(&b, ']');
    expect(&b, EPX_ERR_PARSE, "without STOP");

    b = (ptb){0};
    ptb_op(&b, 0x80);
    ptb_op(&b, 6);
    expect(&b, EPX_ERR_UNSUPPORTED, "protocol 6");

    b = (ptb){0};
    ptb_proto(&b);
    ptb_op(&b, 0xff);
    expect(&b, EPX_ERR_UNSUPPORTED, "0xff");

    b = (ptb){0};
    ptb_proto(&b);
    ptb_op(&b, 'a'); /* APPEND on an empty stack */
    expect(&b, EPX_ERR_PARSE, "underflow");

    b = (ptb){0};
    ptb_proto(&b);
    ptb_op(&b, 'N');
    ptb_op(&b, '(');
    ptb_op(&b, 0x85); /* TUPLE1 cannot reach below the MARK */
    expect(&b, EPX_ERR_PARSE, "underflow");

    b = (ptb){0};
    ptb_proto(&b);
    ptb_op(&b, '(');
    ptb_op(&b, 'N');
    ptb_op(&b, 'e'); /* APPENDS with nothing below its MARK */
    expect(&b, EPX_ERR_PARSE, "no list below");

    b = (ptb){0};
    ptb_proto(&b);
    ptb_op(&b, '}');
    ptb_op(&b, '(');
    ptb_op(&b, 'N');
    ptb_op(&b, 'u'); /* SETITEMS with an odd count */
    expect(&b, EPX_ERR_PARSE, "odd");

    b = (ptb){0};
    ptb_proto(&b);
    ptb_op(&b, '}');
    ptb_op(&b, ']');
    ptb_op(&b, 'N');
    ptb_op(&b, 's'); /* a list as a key */
    expect(&b, EPX_ERR_PARSE, "unhashable");

    b = (ptb){0};
    ptb_proto(&b);
    ptb_op(&b, '}');
    ptb_op(&b, '}');
    ptb_str(&b, "x");
    ptb_op(&b, 'N');
    ptb_op(&b, 's');
    ptb_op(&b, 'b'); /* BUILD with a non-empty state */
    ptb_op(&b, '.');
    expect(&b, EPX_ERR_UNSUPPORTED, "BUILD");
}

static void checks_nesting(void **state) {
    (void)state;
    /* 100000 nested lists: an error at depth EPX_PT_MAX_DEPTH, no recursion */
    ptb b = {0};
    ptb_proto(&b);
    for (int i = 0; i < 100000; i++) ptb_op(&b, ']');
    for (int i = 0; i < 99999; i++) ptb_op(&b, 'a');
    ptb_op(&b, '.');
    expect(&b, EPX_ERR_PARSE, "nested deeper");

    b = (ptb){0}; /* exactly the limit is fine */
    ptb_proto(&b);
    for (int i = 0; i <= EPX_PT_MAX_DEPTH; i++) ptb_op(&b, ']');
    for (int i = 0; i < EPX_PT_MAX_DEPTH; i++) ptb_op(&b, 'a');
    ptb_op(&b, '.');
    expect(&b, EPX_OK, NULL);

    b = (ptb){0}; /* l_i = [l_(i-1), l_(i-1)]: 2^40 values through the memo */
    ptb_proto(&b);
    ptb_op(&b, ']');
    ptb_op(&b, 'q');
    ptb_op(&b, 0);
    for (int i = 1; i <= 40; i++) {
        ptb_op(&b, ']');
        ptb_op(&b, '(');
        ptb_op(&b, 'h');
        ptb_op(&b, (uint8_t)(i - 1));
        ptb_op(&b, 'h');
        ptb_op(&b, (uint8_t)(i - 1));
        ptb_op(&b, 'e');
        ptb_op(&b, 'q');
        ptb_op(&b, (uint8_t)i);
    }
    ptb_op(&b, '.');
    expect(&b, EPX_ERR_PARSE, "decompression bomb");

    b = (ptb){0}; /* l.append(l) */
    ptb_proto(&b);
    ptb_op(&b, ']');
    ptb_op(&b, '2');
    ptb_op(&b, 'a');
    ptb_op(&b, '.');
    expect(&b, EPX_ERR_UNSUPPORTED, "contain itself");

    b = (ptb){0}; /* a = []; b = [a]; a.append(b) through the memo */
    ptb_proto(&b);
    ptb_op(&b, ']');
    ptb_op(&b, 'q');
    ptb_op(&b, 0);
    ptb_op(&b, ']');
    ptb_op(&b, 'h');
    ptb_op(&b, 0);
    ptb_op(&b, 'a');
    ptb_op(&b, 'a');
    ptb_op(&b, '.');
    expect(&b, EPX_ERR_UNSUPPORTED, "recursive");

    b = (ptb){0}; /* d = {}; d['x'] = [d] */
    ptb_proto(&b);
    ptb_op(&b, '}');
    ptb_op(&b, 'q');
    ptb_op(&b, 0);
    ptb_str(&b, "x");
    ptb_op(&b, ']');
    ptb_op(&b, 'h');
    ptb_op(&b, 0);
    ptb_op(&b, 'a');
    ptb_op(&b, 's');
    ptb_op(&b, '.');
    expect(&b, EPX_ERR_UNSUPPORTED, "recursive");
}

/* Dicts: Python's key equality, many keys, and a shared (memoised) value. */
static void dict_semantics(void **state) {
    (void)state;
    ptb b = {0};
    ptb_proto(&b);
    ptb_op(&b, '}');
    ptb_op(&b, '(');
    ptb_str(&b, "a");
    ptb_int(&b, 1);
    ptb_str(&b, "a");
    ptb_int(&b, 2); /* overwrites, keeps its place */
    ptb_int(&b, 1);
    ptb_str(&b, "one");
    ptb_op(&b, 0x88); /* True == 1: same key */
    ptb_str(&b, "true");
    ptb_float(&b, 1.0); /* 1.0 == 1 too */
    ptb_str(&b, "float");
    ptb_op(&b, 'N');
    ptb_op(&b, 'N');
    ptb_op(&b, 'u');
    for (int i = 0; i < 3000; i++) { /* enough keys to use the hash index */
        char k[16];
        snprintf(k, sizeof k, "k%d", i);
        ptb_str(&b, k);
        ptb_int(&b, i);
        ptb_op(&b, 's');
    }
    ptb_op(&b, '.');
    epx_pt_file *f = NULL;
    epx_error err = {0};
    assert_int_equal(load_pickle(&b, NULL, NULL, 0, &f, &err), EPX_OK);
    const epx_pt_value *root = epx_pt_file_root(f);
    assert_int_equal(epx_pt_value_len(root), 3 + 3000);
    int64_t x = 0;
    assert_int_equal(epx_pt_value_int(epx_pt_dict_get(root, "a"), &x, &err), EPX_OK);
    assert_int_equal(x, 2);
    assert_string_equal(epx_pt_value_string(epx_pt_dict_key(root, 0), NULL), "a");
    assert_int_equal(epx_pt_value_kind(epx_pt_dict_key(root, 1)), EPX_PT_INT);
    assert_string_equal(epx_pt_value_string(epx_pt_dict_value(root, 1), NULL), "float");
    assert_int_equal(epx_pt_value_kind(epx_pt_dict_key(root, 2)), EPX_PT_NONE);
    for (int i = 0; i < 3000; i += 7) {
        char k[16];
        snprintf(k, sizeof k, "k%d", i);
        assert_int_equal(epx_pt_value_int(epx_pt_dict_get(root, k), &x, &err), EPX_OK);
        assert_int_equal(x, i);
    }
    assert_null(epx_pt_dict_get(root, "k3000"));
    assert_null(epx_pt_dict_get(root, "k"));
    /* wrong kinds answer without crashing */
    assert_int_equal(epx_pt_value_float(root, (double[1]){0}, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "dict");
    assert_null(epx_pt_value_item(root, 0));
    assert_null(epx_pt_value_string(root, NULL));
    assert_int_equal(epx_pt_value_kind(NULL), EPX_PT_NONE);
    assert_int_equal(epx_pt_value_len(NULL), 0);
    free(b.p);
    epx_pt_file_destroy(f);
}

/* Protocol 4 forms of the same data (SHORT_BINUNICODE, MEMOIZE, FRAME). */
static void protocol4_forms(void **state) {
    (void)state;
    ptb b = {0};
    ptb_op(&b, 0x80);
    ptb_op(&b, 4);
    ptb_op(&b, 0x95);
    ptb_le(&b, 20, 8);
    ptb_op(&b, '}');
    ptb_op(&b, 0x94);
    ptb_op(&b, 0x8c);
    ptb_op(&b, 1);
    ptb_op(&b, 'k');
    ptb_op(&b, 0x94);
    ptb_op(&b, ']');
    ptb_op(&b, 0x94);
    ptb_op(&b, 'h');
    ptb_op(&b, 1); /* the memoised 'k' */
    ptb_op(&b, 'a');
    ptb_op(&b, 's');
    ptb_op(&b, '.');
    epx_pt_file *f = NULL;
    epx_error err = {0};
    assert_int_equal(load_pickle(&b, NULL, NULL, 0, &f, &err), EPX_OK);
    const epx_pt_value *l = epx_pt_dict_get(epx_pt_file_root(f), "k");
    assert_int_equal(epx_pt_value_kind(l), EPX_PT_LIST);
    assert_string_equal(epx_pt_value_string(epx_pt_value_item(l, 0), NULL), "k");
    free(b.p);
    epx_pt_file_destroy(f);
}

/* ---- the container ------------------------------------------------------ */

static epx_status load_entries(const ptb_entry *e, size_t n, epx_error *err) {
    size_t len = 0;
    uint8_t *zip = ptb_zip_buffer(e, n, &len);
    assert_non_null(zip);
    epx_pt_file *f = NULL;
    epx_status st = epx_pt_load_buffer(zip, len, NULL, &f, err);
    free(zip);
    epx_pt_file_destroy(f);
    return st;
}

static void checks_container(void **state) {
    (void)state;
    static const uint8_t pkl[] = {0x80, 2, '}', '.'};
    epx_error err = {0};
    ptb_entry ok[] = {{"a/data.pkl", pkl, sizeof pkl}, {"a/byteorder", "little", 6}};
    assert_int_equal(load_entries(ok, 2, &err), EPX_OK);
    ptb_entry big[] = {{"a/data.pkl", pkl, sizeof pkl}, {"a/byteorder", "big", 3}};
    assert_int_equal(load_entries(big, 2, &err), EPX_ERR_UNSUPPORTED);
    TU_MSG_HAS(err.msg, "big-endian");
    ptb_entry odd[] = {{"a/data.pkl", pkl, sizeof pkl}, {"a/byteorder", "middle", 6}};
    assert_int_equal(load_entries(odd, 2, &err), EPX_ERR_PARSE);
    ptb_entry flat[] = {{"data.pkl", pkl, sizeof pkl}};
    assert_int_equal(load_entries(flat, 1, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "archive folder");
    ptb_entry none[] = {{"a/constants.pkl", pkl, sizeof pkl}};
    assert_int_equal(load_entries(none, 1, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "a/data.pkl");
    /* a storage the archive does not have, and one whose key climbs out */
    ptb b = {0};
    ptb_proto(&b);
    int64_t s1[1] = {2}, st1[1] = {1};
    ptb_tensor(&b, "IntStorage", "9", 2, 0, s1, st1, 1);
    ptb_op(&b, '.');
    ptb_entry miss[] = {{"a/data.pkl", b.p, b.n}};
    assert_int_equal(load_entries(miss, 1, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "a/data/9");
    free(b.p);
    b = (ptb){0};
    ptb_proto(&b);
    ptb_tensor(&b, "IntStorage", "../0", 2, 0, s1, st1, 1);
    ptb_op(&b, '.');
    ptb_entry climb[] = {{"a/data.pkl", b.p, b.n}, {"data/0", "12345678", 8}};
    assert_int_equal(load_entries(climb, 2, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "plain entry name");
    free(b.p);

    /* an empty file, junk, and torch's legacy format (a bare pickle) */
    epx_pt_file *f = NULL;
    assert_int_equal(epx_pt_load_buffer("", 0, NULL, &f, &err), EPX_ERR_PARSE);
    assert_int_equal(epx_pt_load_buffer("hello world", 11, NULL, &f, &err), EPX_ERR_PARSE);
    assert_int_equal(epx_pt_load_buffer(pkl, sizeof pkl, NULL, &f, &err), EPX_ERR_UNSUPPORTED);
    TU_MSG_HAS(err.msg, "legacy");
    assert_null(f);
    assert_int_equal(epx_pt_load("data/pt/no-such-file.pt", &f, &err), EPX_ERR_IO);
    assert_int_equal(epx_pt_load("data/pt", &f, &err), EPX_ERR_IO);

    /* a deflated archive (not what torch writes, but a valid zip) reads */
    size_t len = 0;
    char *fx = tu_read_file("data/pt/strided_counts.pt", &len);
    assert_non_null(fx);
    zip_source_t *src = zip_source_buffer_create(fx, len, 0, NULL);
    zip_t *za = zip_open_from_source(src, 0, NULL);
    assert_non_null(za);
    zip_source_keep(src);
    for (zip_int64_t i = 0; i < zip_get_num_entries(za, 0); i++)
        zip_set_file_compression(za, (zip_uint64_t)i, ZIP_CM_DEFLATE, 9);
    assert_int_equal(zip_close(za), 0);
    zip_stat_t zs;
    assert_int_equal(zip_source_stat(src, &zs), 0);
    uint8_t *deflated = malloc(zs.size);
    assert_int_equal(zip_source_open(src), 0);
    assert_int_equal(zip_source_read(src, deflated, zs.size), (zip_int64_t)zs.size);
    zip_source_close(src);
    zip_source_free(src);
    assert_true(zs.size < len);
    assert_int_equal(epx_pt_load_buffer(deflated, zs.size, NULL, &f, &err), EPX_OK);
    epx_pt_tensor t;
    assert_int_equal(
        epx_pt_value_tensor(epx_pt_dict_get(epx_pt_file_root(f), "logical_count"), &t, &err),
        EPX_OK);
    assert_int_equal(t.shape[0], 8);
    epx_pt_file_destroy(f);
    free(deflated);
    free(fx);
}

/* ---- mutations ---------------------------------------------------------- */

/* Every loaded result must be walkable; exercise the SGLang readers too. */
static void use_result(epx_pt_file *f) {
    epx_error err = {0};
    int32_t *map = NULL, L, P;
    if (epx_mapping_from_pt(f, &map, &L, &P, &err) == EPX_OK)
        epx_free(map);
    else
        assert_true(err.msg[0] != '\0');
    epx_counts *c = NULL;
    const epx_pt_file *one[1] = {f};
    if (epx_counts_from_pt(one, 1, &c, &err) == EPX_OK)
        epx_counts_destroy(c);
    else
        assert_true(err.msg[0] != '\0');
}

static void load_and_use(const uint8_t *p, size_t n) {
    epx_pt_file *f = NULL;
    epx_error err = {0};
    epx_status st = epx_pt_load_buffer(p, n, "mutant", &f, &err);
    if (st == EPX_OK) {
        use_result(f);
        epx_pt_file_destroy(f);
    } else {
        assert_null(f);
        assert_true(err.msg[0] != '\0');
    }
}

static const char *const FIXTURES[] = {"data/pt/init_mapping.pt", "data/pt/strided_counts.pt",
                                       "data/pt/per_pass_rank0.pt", "data/pt/evil_reduce.pt"};

/* Truncation at every length is an error (the zip directory is at the end);
 * random byte flips anywhere end in an error or a valid tree. */
static void mutated_files(void **state) {
    (void)state;
    tu_rng r = {tu_seed(20251202)};
    for (size_t k = 0; k < sizeof FIXTURES / sizeof FIXTURES[0]; k++) {
        size_t len = 0;
        char *orig = tu_read_file(FIXTURES[k], &len);
        assert_non_null(orig);
        uint8_t *buf = malloc(len);
        for (size_t cut = 0; cut < len; cut += 1 + cut / 64) {
            memcpy(buf, orig, cut);
            epx_pt_file *f = NULL;
            epx_error err = {0};
            if (epx_pt_load_buffer(buf, cut, "cut", &f, &err) == EPX_OK)
                fail_msg("%s truncated to %zu bytes loaded", FIXTURES[k], cut);
            assert_true(err.msg[0] != '\0');
        }
        for (int iter = 0; iter < 1500; iter++) {
            memcpy(buf, orig, len);
            int flips = 1 + (int)tu_below(&r, 4);
            for (int j = 0; j < flips; j++)
                buf[tu_below(&r, (uint32_t)len)] ^= (uint8_t)(1 + tu_below(&r, 255));
            load_and_use(buf, len);
        }
        free(buf);
        free(orig);
    }
}

/* Byte flips inside data.pkl would only meet libzip's CRC check; so mutate
 * the pickle and the storages themselves and rebuild a valid zip around
 * them, reaching the unpickler with every mutant. */
static void mutated_pickles(void **state) {
    (void)state;
    tu_rng r = {tu_seed(424242)};
    for (size_t k = 0; k < sizeof FIXTURES / sizeof FIXTURES[0]; k++) {
        size_t len = 0;
        char *orig = tu_read_file(FIXTURES[k], &len);
        zip_source_t *src = zip_source_buffer_create(orig, len, 0, NULL);
        zip_t *za = zip_open_from_source(src, ZIP_RDONLY, NULL);
        assert_non_null(za);
        zip_int64_t n = zip_get_num_entries(za, 0);
        assert_true(n > 0 && n < 32);
        ptb_entry ents[32];
        uint8_t *data[32];
        for (zip_int64_t i = 0; i < n; i++) {
            zip_stat_t st;
            zip_stat_index(za, (zip_uint64_t)i, 0, &st);
            data[i] = malloc(st.size + 64);
            zip_file_t *zf = zip_fopen_index(za, (zip_uint64_t)i, 0);
            assert_int_equal(zip_fread(zf, data[i], st.size), (zip_int64_t)st.size);
            zip_fclose(zf);
            char *name = malloc(strlen(st.name) + 1);
            strcpy(name, st.name);
            ents[i] = (ptb_entry){name, data[i], st.size};
        }
        zip_discard(za);
        assert_non_null(strstr(ents[0].name, "data.pkl")); /* torch writes it first */
        const size_t pkl_len = ents[0].len;
        uint8_t *pkl = malloc(pkl_len + 64);
        memcpy(pkl, data[0], pkl_len);
        for (int iter = 0; iter < 1500; iter++) {
            uint8_t *m = data[0];
            size_t mlen = pkl_len;
            memcpy(m, pkl, pkl_len);
            int kind = (int)tu_below(&r, 4);
            if (kind == 0) { /* flip a few bytes */
                for (int j = 0; j < 1 + (int)tu_below(&r, 3); j++)
                    m[tu_below(&r, (uint32_t)mlen)] ^= (uint8_t)(1 + tu_below(&r, 255));
            } else if (kind == 1) { /* set a byte to an interesting value */
                static const uint8_t vals[] = {0,   1,   0x7f, 0x80, 0xff, '(',
                                               't', 'R', 'Q',  'h',  'q'};
                m[tu_below(&r, (uint32_t)mlen)] = vals[tu_below(&r, sizeof vals)];
            } else if (kind == 2) { /* truncate */
                mlen = tu_below(&r, (uint32_t)mlen);
            } else { /* shift a run (delete bytes) */
                size_t at = tu_below(&r, (uint32_t)mlen), del = 1 + tu_below(&r, 8);
                if (at + del < mlen) {
                    memmove(m + at, m + at + del, mlen - at - del);
                    mlen -= del;
                }
            }
            ents[0].len = mlen;
            /* sometimes shorten a storage so sizes disagree */
            zip_int64_t victim = (zip_int64_t)tu_below(&r, (uint32_t)n);
            size_t saved = ents[victim].len;
            if (strstr(ents[victim].name, "/data/") && saved > 0 && tu_below(&r, 4) == 0)
                ents[victim].len--;
            size_t zlen = 0;
            uint8_t *zip = ptb_zip_buffer(ents, (size_t)n, &zlen);
            assert_non_null(zip);
            load_and_use(zip, zlen);
            free(zip);
            ents[victim].len = saved;
        }
        ents[0].len = pkl_len;
        free(pkl);
        for (zip_int64_t i = 0; i < n; i++) {
            free((void *)(uintptr_t)ents[i].name);
            free(data[i]);
        }
        free(orig);
    }
}

/* A list of a million small ints: the loaded tree holds at most 64 bytes
 * per value (48 for the value in the arena, 8 for the list's slot to it),
 * measured with glibc's mallinfo2 outside sanitizer builds. */
static void memory_per_value(void **state) {
    (void)state;
    enum { N = 1 << 20 };
    ptb b = {0};
    ptb_proto(&b);
    ptb_op(&b, ']'); /* EMPTY_LIST */
    ptb_op(&b, '('); /* MARK */
    for (int i = 0; i < N; i++) ptb_int(&b, i & 255);
    ptb_op(&b, 'e'); /* APPENDS */
    ptb_op(&b, '.');
    epx_error err = {0};
    epx_pt_file *f = NULL;
#if defined(__SANITIZE_ADDRESS__)
    const bool measure = false;
#else
    const bool measure = true;
#endif
    struct mallinfo2 before = mallinfo2();
    assert_int_equal(load_pickle(&b, NULL, NULL, 0, &f, &err), EPX_OK);
    struct mallinfo2 after = mallinfo2();
    assert_int_equal(epx_pt_value_len(epx_pt_file_root(f)), N);
    if (measure && after.uordblks > before.uordblks) {
        double per = (double)(after.uordblks - before.uordblks) / N;
        print_message("loaded tree: %.1f bytes per value\n", per);
        assert_true(per <= 64.0);
    }
    epx_pt_file_destroy(f);
    free(b.p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(refuses_code),
        cmocka_unit_test(checks_tensor_sizes),
        cmocka_unit_test(empty_tensor_of_huge_dims),
        cmocka_unit_test(checks_pickle_lengths),
        cmocka_unit_test(checks_nesting),
        cmocka_unit_test(dict_semantics),
        cmocka_unit_test(protocol4_forms),
        cmocka_unit_test(checks_container),
        cmocka_unit_test(mutated_files),
        cmocka_unit_test(mutated_pickles),
        cmocka_unit_test(memory_per_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
