/*
 * test_file_write.c - the library's one safe-output path (epx_file_write):
 * a new file and a replaced file (its mode kept), a symlink written through
 * to its target (absolute, relative, chained) with the link kept, FIFOs,
 * devices and folders refused before anything is opened, a missing folder,
 * a failing body that leaves the old file and no temp, and the temp name.
 * The .pt writer goes through the same path (a FIFO refused there too).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

static epx_status body_text(FILE *f, const void *ctx, epx_error *err) {
    (void)err;
    fputs((const char *)ctx, f);
    return EPX_OK;
}

static epx_status body_fail(FILE *f, const void *ctx, epx_error *err) {
    (void)ctx;
    fputs("partial", f);
    snprintf(err->msg, sizeof err->msg, "body gave up");
    return err->status = EPX_ERR_PARSE;
}

static char *slurp(const char *path) {
    char *buf = calloc(1, 256);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, 255, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void expect_text(const char *path, const char *want) {
    char *got = slurp(path);
    assert_string_equal(got, want);
    free(got);
}

/* Make a fresh folder for one test; returns its path (caller frees). */
static char *fresh_dir(void) {
    char *d = tu_tmp_path(".d");
    assert_int_equal(mkdir(d, 0777), 0);
    return d;
}

static void count_temps(const char *dir, int want) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "test $(ls -a '%s' | grep -c epx-tmp) -eq %d", dir, want);
    assert_int_equal(system(cmd), 0);
}

static void regular_and_symlinks(void **state) {
    (void)state;
    char *d = fresh_dir();
    char p[512], l[512], l2[512];
    epx_error err = {0};
    snprintf(p, sizeof p, "%s/a.txt", d);
    assert_int_equal(epx_file_write(p, body_text, "one", &err), EPX_OK);
    expect_text(p, "one");
    chmod(p, 0640);
    assert_int_equal(epx_file_write(p, body_text, "two", &err), EPX_OK);
    expect_text(p, "two");
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0640); /* a replaced file keeps its mode */

    /* relative symlink, then a chain of two: the target is rewritten */
    snprintf(l, sizeof l, "%s/link.txt", d);
    assert_int_equal(symlink("a.txt", l), 0);
    assert_int_equal(epx_file_write(l, body_text, "three", &err), EPX_OK);
    assert_int_equal(lstat(l, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    expect_text(p, "three");
    snprintf(l2, sizeof l2, "%s/link2.txt", d);
    assert_int_equal(symlink(l, l2), 0); /* absolute, to a link */
    assert_int_equal(epx_file_write(l2, body_text, "four", &err), EPX_OK);
    expect_text(p, "four");
    assert_int_equal(lstat(l2, &st), 0);
    assert_true(S_ISLNK(st.st_mode));

    /* a failing body: the old file stays, no temp is left */
    assert_int_equal(epx_file_write(p, body_fail, NULL, &err), EPX_ERR_PARSE);
    TU_MSG_HAS(err.msg, "body gave up");
    expect_text(p, "four");
    count_temps(d, 0);

    /* the temp name is beside the target, hidden, with the pid */
    char tmp[600], want[600];
    assert_int_equal(epx_file_temp_path(l2, tmp, sizeof tmp, &err), EPX_OK);
    snprintf(want, sizeof want, "%s/.a.txt.epx-tmp.%ld", d, (long)getpid());
    assert_string_equal(tmp, want);
    assert_int_equal(epx_file_temp_path(l2, tmp, 8, &err), EPX_ERR_OVERFLOW);

    /* a symlink loop is refused */
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/loop1", d);
    snprintf(b, sizeof b, "%s/loop2", d);
    assert_int_equal(symlink(b, a), 0);
    assert_int_equal(symlink(a, b), 0);
    assert_int_equal(epx_file_write(a, body_text, "x", &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "symlinks");

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    assert_int_equal(system(cmd), 0);
    free(d);
}

static void non_regular_refused(void **state) {
    (void)state;
    char *d = fresh_dir();
    char fifo[512], link[512];
    epx_error err = {0};
    snprintf(fifo, sizeof fifo, "%s/fifo", d);
    assert_int_equal(mkfifo(fifo, 0666), 0);
    /* refused before opening: this would block forever otherwise */
    assert_int_equal(epx_file_write(fifo, body_text, "x", &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "fifo", "a FIFO", "regular");
    snprintf(link, sizeof link, "%s/to-fifo.pt", d);
    assert_int_equal(symlink(fifo, link), 0);
    assert_int_equal(epx_file_write(link, body_text, "x", &err), EPX_ERR_INVALID_ARG);
    struct stat st;
    assert_int_equal(stat(fifo, &st), 0);
    assert_true(S_ISFIFO(st.st_mode));

    epx_layout *lay = NULL;
    epx_shape s = {2, 4, 4, 2, 1};
    assert_int_equal(epx_layout_create_trivial(&s, &lay, &err), EPX_OK);
    assert_int_equal(epx_layout_write_pt(lay, link, &err), EPX_ERR_INVALID_ARG);
    assert_int_equal(epx_layout_write_json(lay, "/dev/null", &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "/dev/null", "device");
    assert_int_equal(epx_layout_write_json(lay, d, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "a directory");
    char missing[512];
    snprintf(missing, sizeof missing, "%s/no/such.json", d);
    assert_int_equal(epx_layout_write_json(lay, missing, &err), EPX_ERR_IO);
    TU_MSG_HAS(err.msg, "does not exist");
    assert_int_equal(epx_file_output_check("", NULL, &err), EPX_ERR_INVALID_ARG);
    epx_layout_destroy(lay);
    count_temps(d, 0);

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    assert_int_equal(system(cmd), 0);
    free(d);
}

/* A legal name of 236-255 bytes is written: its temp name is cut to a file
 * name (at most 255 bytes), the cut marked by a hash, so two such names of
 * one prefix get two temps. */
static void long_names(void **state) {
    (void)state;
    char *d = fresh_dir();
    char a[600], b[600], ta[700], tb[700];
    epx_error err = {0};
    memset(a, 0, sizeof a);
    snprintf(a, sizeof a, "%s/", d);
    size_t at = strlen(a);
    memset(a + at, 'x', 250);
    snprintf(a + at + 250, sizeof a - at - 250, ".json"); /* a 255-byte name */
    snprintf(b, sizeof b, "%s", a);
    b[strlen(b) - 6] = 'y'; /* the same prefix, another name */
    assert_int_equal(epx_file_write(a, body_text, "long", &err), EPX_OK);
    expect_text(a, "long");
    assert_int_equal(epx_file_temp_path(a, ta, sizeof ta, &err), EPX_OK);
    assert_int_equal(epx_file_temp_path(b, tb, sizeof tb, &err), EPX_OK);
    assert_true(strlen(strrchr(ta, '/') + 1) <= 255 && strlen(strrchr(tb, '/') + 1) <= 255);
    assert_string_not_equal(ta, tb);
    TU_MSG_HAS(ta, ".epx-tmp.");
    count_temps(d, 0);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    assert_int_equal(system(cmd), 0);
    free(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(regular_and_symlinks),
        cmocka_unit_test(non_regular_refused),
        cmocka_unit_test(long_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
