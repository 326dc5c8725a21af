/*
 * weights_in.c - reading replica weights for `epx eval --routing weighted`:
 * the "replica_weights" [L][P] of a JSON object, what `epx plan --report`
 * writes (each slot's share of its expert's tokens). The file goes through
 * the one bounded input path (epx_file_read); every value must be a finite
 * number >= 0, and the shape must match the placement, each named in the
 * message when it is not.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"

static int bad(const cli_cmd *cmd, const char *path, const char *what) {
    fprintf(stderr, "epx %s: %s: %s\n", cmd->name, path, what);
    return CLI_EXIT_USAGE;
}

int cli_read_weights(const cli_cmd *cmd, const char *path, int32_t L, int32_t P, double **out) {
    char *text = NULL, msg[256];
    size_t len = 0;
    epx_error err = {0};
    if (epx_file_read(path, EPX_MAX_INPUT_BYTES, "--weights (EPX_MAX_INPUT_BYTES)", &text, &len,
                      &err) != EPX_OK)
        return cli_report(cmd, &err);
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    epx_free(text);
    if (root == NULL) {
        snprintf(msg, sizeof msg, "not JSON (line %d: %s)", je.line, je.text);
        return bad(cmd, path, msg);
    }
    json_t *w = json_object_get(root, "replica_weights");
    int rc = -1;
    if (!json_is_array(w) || json_array_size(w) != (size_t)L) {
        snprintf(msg, sizeof msg,
                 "needs \"replica_weights\": [L][P] = [%d][%d] (epx plan --report writes it)", L,
                 P);
        rc = bad(cmd, path, msg);
        goto done;
    }
    if ((*out = malloc((size_t)L * (size_t)P * sizeof **out)) == NULL) {
        rc = bad(cmd, path, "out of memory for the weights");
        goto done;
    }
    for (int32_t l = 0; l < L && rc < 0; l++) {
        json_t *row = json_array_get(w, (size_t)l);
        if (!json_is_array(row) || json_array_size(row) != (size_t)P) {
            snprintf(msg, sizeof msg, "replica_weights[%d] must hold %d numbers (one per slot)", l,
                     P);
            rc = bad(cmd, path, msg);
        }
        for (int32_t p = 0; p < P && rc < 0; p++) {
            json_t *v = json_array_get(row, (size_t)p);
            const double x = json_number_value(v);
            if (!json_is_number(v) || !isfinite(x) || x < 0) {
                snprintf(msg, sizeof msg, "replica_weights[%d][%d] must be a number >= 0", l, p);
                rc = bad(cmd, path, msg);
            }
            (*out)[(size_t)l * (size_t)P + (size_t)p] = x;
        }
    }
    if (rc >= 0) {
        free(*out);
        *out = NULL;
    }
done:
    json_decref(root);
    return rc;
}
