/*
 * test_report_svg.c - the visual report: valid XML, every panel present,
 * and (where rsvg-convert is installed) a rendering that is not blank.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

static int have(const char *tool) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", tool);
    return system(cmd) == 0;
}

static void svg_is_valid_and_not_blank(void **state) {
    (void)state;
    enum { L = 61, G = 8 };
    tu_rng r = {tu_seed(5)};
    static double load[3][L * G], bal[3][L], bound[L];
    const char *names[3] = {"trivial", "DeepSeek <EPLB>", "epx & co"};
    epx_report_series s[3];
    for (int k = 0; k < 3; k++) {
        for (int l = 0; l < L; l++) {
            double mx = 0, sum = 0;
            for (int g = 0; g < G; g++) {
                double v = l == 0 ? 0 : 100 + tu_uniform(&r) * 100 / (k + 1);
                load[k][l * G + g] = v;
                sum += v;
                if (v > mx) mx = v;
            }
            bal[k][l] = mx > 0 ? sum / G / mx : -1;
            bound[l] = l == 0 ? -1 : 0.99;
        }
        s[k] = (epx_report_series){names[k], load[k], bal[k], 0.5 + k * 0.2};
    }
    char *path = tu_tmp_path(".svg");
    epx_error err = {0};
    /* a title that is not UTF-8 (bytes 0xff 0xfe, and a cut sequence) must
     * still give a well-formed file: U+FFFD for each bad byte */
    assert_int_equal(epx_report_write_svg(path, L, G, s, 3, bound, "Kimi-K2 \xff\xfe on 8 GPUs",
                                          "61 layers, 384 experts \xc3", &err),
                     EPX_OK);
    char *text = tu_read_file(path, NULL);
    assert_non_null(text);
    TU_MSG_HAS(text, "<svg", "DeepSeek &lt;EPLB&gt;", "epx &amp; co", "Balancedness per layer",
               "load / mean", "layer", "GPU", "bound", "Kimi-K2 \xef\xbf\xbd\xef\xbf\xbd on 8 GPUs",
               "384 experts \xef\xbf\xbd");
    free(text);
    char cmd[512];
    if (have("xmllint")) {
        snprintf(cmd, sizeof cmd, "xmllint --noout %s", path);
        assert_int_equal(system(cmd), 0);
    } else {
        fprintf(stderr, "note: xmllint not installed; XML validity not checked\n");
    }
    if (have("rsvg-convert") && have("python3")) {
        const char *src = getenv("EPX_SOURCE");
        snprintf(cmd, sizeof cmd,
                 "rsvg-convert -o %s.png %s && python3 %s/tests/util/png_not_blank.py %s.png", path,
                 path, src ? src : "..", path);
        assert_int_equal(system(cmd), 0);
        snprintf(cmd, sizeof cmd, "%s.png", path);
        remove(cmd);
    } else {
        fprintf(stderr, "note: rsvg-convert or python3 not installed; rendering not checked\n");
    }
    if (getenv("EPX_TEST_KEEP") == NULL)
        remove(path);
    else
        fprintf(stderr, "kept %s\n", path);
    free(path);
    assert_int_equal(epx_report_write_svg("/tmp/x.svg", 0, G, s, 3, NULL, "t", NULL, &err),
                     EPX_ERR_INVALID_ARG);
    /* figures that would print as "nan", and loads no GPU can carry */
    remove("/tmp/x.svg");
    load[1][5] = NAN;
    assert_int_equal(epx_report_write_svg("/tmp/x.svg", L, G, s, 3, NULL, "t", NULL, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "series[1].gpu_load[5] is nan");
    load[1][5] = -2;
    assert_int_equal(epx_report_write_svg("/tmp/x.svg", L, G, s, 3, NULL, "t", NULL, &err),
                     EPX_ERR_INVALID_ARG);
    load[1][5] = 1;
    bal[2][3] = NAN;
    assert_int_equal(epx_report_write_svg("/tmp/x.svg", L, G, s, 3, NULL, "t", NULL, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "series 2's balancedness[3] is nan");
    bal[2][3] = 0.5;
    s[0].overall = INFINITY;
    assert_int_equal(epx_report_write_svg("/tmp/x.svg", L, G, s, 3, NULL, "t", NULL, &err),
                     EPX_ERR_INVALID_ARG);
    s[0].overall = 0.5;
    bound[7] = NAN;
    assert_int_equal(epx_report_write_svg("/tmp/x.svg", L, G, s, 3, bound, "t", NULL, &err),
                     EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "bound[7] is nan");
    assert_int_equal(access("/tmp/x.svg", F_OK), -1); /* nothing written */
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(svg_is_valid_and_not_blank)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
