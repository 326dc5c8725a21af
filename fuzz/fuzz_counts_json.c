/*
 * fuzz_counts_json.c - libFuzzer target for SGLang's counts JSON reader
 * ({"logical_count": [L][E] | [S][L][E]}), through epx_counts_read's
 * inline-JSON form.
 *
 * Oracles: the same text read twice gives the same status, message and
 * values; every failure has a message; accepted loads are finite and
 * non-negative; and what was read survives both writers: JSON and .pt
 * (auto dtype) read back to exactly the same values.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "epx.h"

#include "fuzz_util.h"

static int same_counts(const epx_counts *a, const epx_counts *b) {
    if (a->num_windows != b->num_windows || a->num_layers != b->num_layers ||
        a->num_experts != b->num_experts)
        return 0;
    size_t n = (size_t)a->num_windows * (size_t)a->num_layers * (size_t)a->num_experts;
    return memcmp(a->data, b->data, n * sizeof *a->data) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* Inline JSON is a spec starting with '{'; anything else would be read
     * as a path, which is not what is fuzzed here. */
    if (size == 0 || size > (1 << 20) || data[0] != '{') return 0;
    char *text = malloc(size + 1);
    if (text == NULL) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    epx_counts *a = NULL, *b = NULL;
    epx_error ea = {0}, eb = {0};
    epx_status sa = epx_counts_read(text, &a, &ea);
    epx_status sb = epx_counts_read(text, &b, &eb);
    CHECK(sa == sb && strcmp(ea.msg, eb.msg) == 0);
    if (sa != EPX_OK) {
        CHECK(a == NULL && ea.msg[0] != '\0');
    } else {
        CHECK(same_counts(a, b));
        size_t n = (size_t)a->num_windows * (size_t)a->num_layers * (size_t)a->num_experts;
        for (size_t i = 0; i < n; i++) CHECK(isfinite(a->data[i]) && a->data[i] >= 0);
        if (n <= (1 << 16)) {
            temp_paths("counts");
            epx_counts *c = NULL;
            CHECK(epx_counts_write_json(a, json_path, &ea) == EPX_OK);
            CHECK(epx_counts_read(json_path, &c, &ea) == EPX_OK);
            CHECK(same_counts(a, c));
            epx_counts_destroy(c);
            c = NULL;
            CHECK(epx_counts_write_pt(a, pt_path, EPX_PT_DTYPE_AUTO, &ea) == EPX_OK);
            CHECK(epx_counts_read(pt_path, &c, &ea) == EPX_OK);
            CHECK(same_counts(a, c));
            epx_counts_destroy(c);
        }
    }
    epx_counts_destroy(a);
    epx_counts_destroy(b);
    free(text);
    return 0;
}
