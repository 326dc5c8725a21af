/*
 * weights_in.c - reading replica weights for `epx eval --routing weighted`:
 * the "replica_weights" [L][P] of a JSON object, what `epx plan --report`
 * writes (each slot's share of its expert's tokens). The file goes through
 * the one bounded input path (epx_file_read); every value must be a finite
 * number >= 0, the shape must match the placement, a report's own map must
 * be the placement's, and every expert needs a replica of positive weight,
 * each named in the message when it is not.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static int bad(const cli_cmd *cmd, const char *path, const char *what) {
    fprintf(stderr, "epx %s: %s: %s\n", cmd->name, path, what);
    return CLI_EXIT_USAGE;
}

/* The report's own "physical_to_logical_map", when it has one, must be the
 * placement's: weights are per slot, so another placement's would send
 * tokens by the shares of experts that are not in those slots. */
static int same_map(const cli_cmd *cmd, const char *path, json_t *root, const int32_t *map,
                    int32_t L, int32_t P) {
    json_t *m = json_object_get(root, "physical_to_logical_map");
    if (m == NULL) return -1;
    char msg[320];
    for (int32_t l = 0; l < L; l++) {
        json_t *row = json_array_get(m, (size_t)l);
        for (int32_t p = 0; p < P; p++) {
            json_t *v = json_array_get(row, (size_t)p);
            if (json_is_integer(v) &&
                json_integer_value(v) == map[(size_t)l * (size_t)P + (size_t)p])
                continue;
            snprintf(msg, sizeof msg,
                     "its physical_to_logical_map is not --placement's (layer %d, slot %d: %s "
                     "there, expert %d in the placement): the weights are another placement's; "
                     "pass the report written with this placement (epx plan --report)",
                     l, p, json_is_integer(v) ? "another expert" : "nothing of [L][P]",
                     map[(size_t)l * (size_t)P + (size_t)p]);
            return bad(cmd, path, msg);
        }
    }
    return -1;
}

/* Every expert that holds a slot needs a replica of positive weight, or
 * its tokens could go nowhere by these weights (an even split, the
 * fallback, would answer a question that was not asked). */
static int every_expert_weighed(const cli_cmd *cmd, const char *path, const double *w,
                                const int32_t *map, int32_t L, int32_t P) {
    int32_t E = 0;
    for (size_t i = 0; i < (size_t)L * (size_t)P; i++) E = map[i] + 1 > E ? map[i] + 1 : E;
    double *sum = calloc((size_t)E + 1, sizeof *sum);
    int8_t *held = calloc((size_t)E + 1, 1);
    if (sum == NULL || held == NULL) {
        free(sum);
        free(held);
        return bad(cmd, path, "out of memory for the weights' check");
    }
    int rc = -1;
    for (int32_t l = 0; l < L && rc < 0; l++) {
        memset(sum, 0, (size_t)E * sizeof *sum);
        memset(held, 0, (size_t)E);
        const int32_t *row = map + (size_t)l * (size_t)P;
        for (int32_t p = 0; p < P; p++)
            if (row[p] >= 0) {
                sum[row[p]] += w[(size_t)l * (size_t)P + (size_t)p];
                held[row[p]] = 1;
            }
        for (int32_t e = 0; e < E && rc < 0; e++)
            if (held[e] && !(sum[e] > 0)) {
                char msg[256];
                snprintf(msg, sizeof msg,
                         "replica_weights[%d]: every replica of expert %d weighs 0, so its "
                         "tokens could go nowhere: give at least one of its slots a weight > 0",
                         l, e);
                rc = bad(cmd, path, msg);
            }
    }
    free(sum);
    free(held);
    return rc;
}

int cli_read_weights(const cli_cmd *cmd, const char *path, const int32_t *map, int32_t L, int32_t P,
                     double **out) {
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
    int rc = same_map(cmd, path, root, map, L, P);
    if (rc >= 0) goto done;
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
    if (rc < 0) rc = every_expert_weighed(cmd, path, *out, map, L, P);
    if (rc >= 0) {
        free(*out);
        *out = NULL;
    }
done:
    json_decref(root);
    return rc;
}
