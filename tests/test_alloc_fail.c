/*
 * test_alloc_fail.c - every reader under an allocator that fails the n-th
 * call, for n = 1 .. (allocations of a clean run): the result is either
 * the clean run's result or an error status with a message, never a crash,
 * and (under ASan's leak checker) nothing leaks on any of those paths.
 *
 * malloc, calloc and realloc are wrapped at link time (cmake/alloc_fail.cmake
 * adds -Wl,--wrap=...), which reaches every call from libepx's objects;
 * jansson's allocations are routed through the same counter with
 * json_set_alloc_funcs. libzip allocates inside its shared library, out of
 * reach: its own failures are its business.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);

static long g_calls;   /* allocations since counting started */
static long g_fail_at; /* 0: never fail */
static int g_counting;

static int should_fail(void) {
    if (!g_counting) return 0;
    g_calls++;
    return g_fail_at != 0 && g_calls == g_fail_at;
}

void *__wrap_malloc(size_t n) { return should_fail() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t size) { return should_fail() ? NULL : __real_calloc(n, size); }
void *__wrap_realloc(void *p, size_t n) { return should_fail() ? NULL : __real_realloc(p, n); }

static void *json_malloc(size_t n) { return __wrap_malloc(n); }

/* A reader under test: returns its status, and on success a digest of its
 * result (so a run that survived a failed allocation can be compared). */
typedef epx_status (*reader_fn)(uint64_t *digest, epx_error *err);

static uint64_t mix(uint64_t h, const void *p, size_t n) {
    const uint8_t *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t digest_counts(const epx_counts *c) {
    size_t n = (size_t)c->num_windows * (size_t)c->num_layers * (size_t)c->num_experts;
    uint64_t h = mix(0xcbf29ce484222325ull, &c->num_windows, sizeof c->num_windows);
    return mix(h, c->data, n * sizeof *c->data);
}

static const char MAP_TEXT[] =
    "{\"physical_to_logical_map\": [[0, 1, 2, 3, 0, 1], [3, 2, 1, 0, 3, 2], [1, 1, 0, 2, 3, 0]]}";
static const char COUNTS_TEXT[] =
    "{\"logical_count\": [[[1, 2.5, 3], [4, 5, 6]], [[0, 0, 7], [8, 9e9, 1e-3]]]}";
static char g_map_json[256], g_counts_json[256], g_out_pt[256];

static epx_status r_mapping_text(uint64_t *d, epx_error *err) {
    int32_t *map = NULL, L, P;
    epx_status st = epx_mapping_parse_json(MAP_TEXT, sizeof MAP_TEXT - 1, &map, &L, &P, err);
    if (st == EPX_OK) *d = mix(0, map, sizeof *map * (size_t)(L * P));
    epx_free(map);
    return st;
}

static epx_status r_mapping_path(const char *path, uint64_t *d, epx_error *err) {
    int32_t *map = NULL, L, P;
    epx_status st = epx_mapping_read(path, &map, &L, &P, err);
    if (st == EPX_OK) *d = mix(0, map, sizeof *map * (size_t)(L * P));
    epx_free(map);
    return st;
}

static epx_status r_mapping_json(uint64_t *d, epx_error *err) {
    return r_mapping_path(g_map_json, d, err);
}
static epx_status r_mapping_pt(uint64_t *d, epx_error *err) {
    return r_mapping_path("data/pt/init_mapping.pt", d, err);
}

static epx_status r_counts_spec(const char *spec, uint64_t *d, epx_error *err) {
    epx_counts *c = NULL;
    epx_status st = epx_counts_read(spec, &c, err);
    if (st == EPX_OK) *d = digest_counts(c);
    epx_counts_destroy(c);
    return st;
}

static epx_status r_counts_inline(uint64_t *d, epx_error *err) {
    return r_counts_spec(COUNTS_TEXT, d, err);
}
static epx_status r_counts_json(uint64_t *d, epx_error *err) {
    return r_counts_spec(g_counts_json, d, err);
}
static epx_status r_counts_strided(uint64_t *d, epx_error *err) {
    return r_counts_spec("data/pt/strided_counts.pt", d, err);
}
static epx_status r_counts_per_pass(uint64_t *d, epx_error *err) {
    return r_counts_spec("data/pt/per_pass_rank0.pt", d, err);
}
static epx_status r_counts_list(uint64_t *d, epx_error *err) {
    return r_counts_spec("data/pt/strided_counts.pt,data/pt/strided_counts.pt", d, err);
}
static epx_status r_counts_dir(uint64_t *d, epx_error *err) {
    epx_counts *c = NULL;
    epx_status st = epx_counts_read_pt("data/pt", &c, err); /* mixed kinds: an error */
    if (st == EPX_OK) *d = digest_counts(c);
    epx_counts_destroy(c);
    return st;
}
static epx_status r_evil(uint64_t *d, epx_error *err) {
    *d = 0;
    return r_counts_spec("data/pt/evil_reduce.pt", d, err);
}

static epx_status r_pt_tree(uint64_t *d, epx_error *err) {
    size_t len = 0;
    g_counting = 0;
    char *bytes = tu_read_file("data/pt/per_pass_rank0.pt", &len);
    g_counting = 1;
    epx_pt_file *f = NULL;
    epx_status st = epx_pt_load_buffer(bytes, len, "mem", &f, err);
    if (st == EPX_OK) *d = epx_pt_value_len(epx_pt_dict_get(epx_pt_file_root(f), "records"));
    epx_pt_file_destroy(f);
    g_counting = 0;
    free(bytes);
    g_counting = 1;
    return st;
}

static epx_status r_write_counts_pt(uint64_t *d, epx_error *err) {
    epx_counts *c = NULL;
    epx_status st = epx_counts_create(2, 3, 4, &c, err);
    if (st != EPX_OK) return st;
    for (int i = 0; i < 24; i++) c->data[i] = i * 3;
    st = epx_counts_write_pt(c, g_out_pt, EPX_PT_DTYPE_AUTO, err);
    epx_counts_destroy(c);
    *d = 1;
    return st;
}

static epx_status r_write_layout_pt(uint64_t *d, epx_error *err) {
    epx_shape s = {3, 4, 8, 2, 1};
    epx_layout *lay = NULL;
    epx_status st = epx_layout_create_trivial(&s, &lay, err);
    if (st == EPX_OK) st = epx_layout_write_pt(lay, g_out_pt, err);
    epx_layout_destroy(lay);
    *d = 2;
    return st;
}

static epx_status r_init_pt(uint64_t *d, epx_error *err) {
    epx_init_opts o = EPX_INIT_OPTS_INIT;
    o.num_gpus = 4;
    epx_layout *lay = NULL;
    epx_status st = epx_layout_init("data/pt/init_mapping.pt", &o, &lay, err);
    if (st == EPX_OK) {
        const epx_shape *s = epx_layout_shape(lay);
        *d = mix(0, epx_layout_physical_to_logical(lay),
                 sizeof(int32_t) * (size_t)s->num_layers * (size_t)s->num_physical_experts);
    }
    epx_layout_destroy(lay);
    return st;
}

/* Fail allocation n for every n a clean run makes; check every outcome. */
static void sweep(const char *name, reader_fn fn) {
    epx_error err = {0};
    uint64_t want = 0, got = 0;
    g_fail_at = 0;
    g_calls = 0;
    g_counting = 1;
    epx_status clean = fn(&want, &err);
    g_counting = 0;
    const long total = g_calls;
    assert_true(total > 0);
    long failed = 0;
    for (long n = 1; n <= total; n++) {
        epx_error e = {0};
        got = 0;
        g_fail_at = n;
        g_calls = 0;
        g_counting = 1;
        epx_status st = fn(&got, &e);
        g_counting = 0;
        if (st == clean && (st != EPX_OK || got == want)) continue; /* survived */
        if (st == EPX_OK) fail_msg("%s: allocation %ld failed, yet the result differs", name, n);
        if (e.msg[0] == '\0' || e.status != st)
            fail_msg("%s: allocation %ld failed with %s and no message", name, n,
                     epx_status_str(st));
        failed++;
    }
    g_fail_at = 0;
    fprintf(stderr, "  %-22s %4ld allocations, %4ld failures reported as errors (clean: %s)\n",
            name, total, failed, epx_status_str(clean));
}

static void write_text(char *path, size_t cap, const char *suffix, const char *text) {
    char *p = tu_tmp_path(suffix);
    snprintf(path, cap, "%s", p);
    free(p);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void all_readers(void **state) {
    (void)state;
    json_set_alloc_funcs(json_malloc, free);
    write_text(g_map_json, sizeof g_map_json, ".json", MAP_TEXT);
    write_text(g_counts_json, sizeof g_counts_json, ".json", COUNTS_TEXT);
    char *p = tu_tmp_path(".pt");
    snprintf(g_out_pt, sizeof g_out_pt, "%s", p);
    free(p);
    static const struct {
        const char *name;
        reader_fn fn;
    } cases[] = {
        {"mapping JSON text", r_mapping_text},
        {"mapping JSON file", r_mapping_json},
        {"mapping .pt", r_mapping_pt},
        {"counts inline JSON", r_counts_inline},
        {"counts JSON file", r_counts_json},
        {"counts .pt strided", r_counts_strided},
        {"counts .pt per_pass", r_counts_per_pass},
        {"counts .pt list", r_counts_list},
        {"counts .pt directory", r_counts_dir},
        {"evil .pt", r_evil},
        {".pt tree from memory", r_pt_tree},
        {"write counts .pt", r_write_counts_pt},
        {"write layout .pt", r_write_layout_pt},
        {"layout init from .pt", r_init_pt},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) sweep(cases[i].name, cases[i].fn);
    json_set_alloc_funcs(malloc, free);
    unlink(g_map_json);
    unlink(g_counts_json);
    unlink(g_out_pt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(all_readers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
