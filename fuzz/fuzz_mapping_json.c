/*
 * fuzz_mapping_json.c - libFuzzer target for SGLang's mapping JSON reader
 * ({"physical_to_logical_map": [L][P]}, epx_mapping_parse_json).
 *
 * Oracles: the same bytes read twice give the same status, message and
 * map; every failure has a message; ids are non-negative; and a map that
 * makes a valid layout (one GPU, E = largest id + 1) survives both writers:
 * JSON and .pt read back to exactly the same map.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "epx.h"

#include "fuzz_util.h"

static void read_back(const char *path, const int32_t *map, int32_t L, int32_t P) {
    int32_t *m = NULL, l = 0, p = 0;
    epx_error err = {0};
    CHECK(epx_mapping_read(path, &m, &l, &p, &err) == EPX_OK);
    CHECK(l == L && p == P && memcmp(m, map, sizeof *m * (size_t)L * (size_t)P) == 0);
    epx_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1 << 20)) return 0;
    int32_t *a = NULL, *b = NULL, La = 0, Pa = 0, Lb = 0, Pb = 0;
    epx_error ea = {0}, eb = {0};
    epx_status sa = epx_mapping_parse_json((const char *)data, size, &a, &La, &Pa, &ea);
    epx_status sb = epx_mapping_parse_json((const char *)data, size, &b, &Lb, &Pb, &eb);
    CHECK(sa == sb && strcmp(ea.msg, eb.msg) == 0);
    if (sa != EPX_OK) {
        CHECK(a == NULL && ea.msg[0] != '\0');
        return 0;
    }
    const size_t n = (size_t)La * (size_t)Pa;
    CHECK(La == Lb && Pa == Pb && memcmp(a, b, n * sizeof *a) == 0);
    int32_t E = 0;
    for (size_t i = 0; i < n; i++) {
        CHECK(a[i] >= 0);
        if (a[i] + 1 > E) E = a[i] + 1;
    }
    epx_shape s = {La, E, Pa, 1, 1};
    epx_layout *lay = NULL;
    if (n <= (1 << 16) && epx_layout_create_from_map(&s, a, &lay, &ea) == EPX_OK) {
        temp_paths("map");
        CHECK(epx_layout_write_json(lay, json_path, &ea) == EPX_OK);
        read_back(json_path, a, La, Pa);
        CHECK(epx_layout_write_pt(lay, pt_path, &ea) == EPX_OK);
        read_back(pt_path, a, La, Pa);
        epx_layout_destroy(lay);
    }
    epx_free(a);
    epx_free(b);
    return 0;
}
