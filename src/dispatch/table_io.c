/*
 * table_io.c - the files around static dispatch tables: reading DeepSeek's
 * logical_to_physical_map (replica-rank order) from a golden case or an epx
 * plan report, and writing {"logical_to_rank_dispatch_physical_map": ...}
 * and SGLang's per-rank {"logical_to_all_physical_map": ...}.
 * Reading goes through the io room's JSON tensor helpers; writing is plain
 * fprintf of integers into a temp file that is renamed into place.
 */
#include <stdio.h>

#include "json_tensor.h"

static const char L2P_KEY[] = "logical_to_physical_map";
static const char TABLE_KEY[] = "logical_to_rank_dispatch_physical_map";
static const char LISTS_KEY[] = "logical_to_all_physical_map";

epx_status epx_replica_map_read(const char *spec, int32_t **map, int32_t *num_layers,
                                int32_t *num_experts, int32_t *width, epx_error *err) {
    if (spec == NULL || map == NULL || num_layers == NULL || num_experts == NULL || width == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "epx_replica_map_read: NULL argument");
    json_t *root = NULL;
    EPX_TRY(epxi_json_load_spec(spec, &root, err));
    epx_status st = EPX_OK;
    int32_t *out = NULL;
    const json_t *arr = json_object_get(root, L2P_KEY);
    if (arr == NULL) {
        st = epxi_fail(err, EPX_ERR_PARSE,
                       "no '%s' key: replica-rank order needs a file that carries DeepSeek's "
                       "replica lists (a golden case or an epx plan report)%s",
                       L2P_KEY,
                       json_object_get(root, "physical_to_logical_map")
                           ? "; this is a mapping file, whose order is ascending "
                             "(--order ascending)"
                           : "");
        goto done;
    }
    epxi_json_tensor t;
    EPX_TRY_GOTO(st, epxi_json_measure(arr, 3, 3, L2P_KEY, &t, err), done);
    if (t.dims[0] > EPX_MAX_LAYERS || t.dims[1] > EPX_MAX_EXPERTS ||
        t.dims[2] > 2 * EPX_MAX_EXPERTS) {
        st = epxi_fail(err, EPX_ERR_SHAPE, "'%s' is [%lld][%lld][%lld], above the limits", L2P_KEY,
                       (long long)t.dims[0], (long long)t.dims[1], (long long)t.dims[2]);
        goto done;
    }
    out = epxi_calloc(t.count, sizeof *out, L2P_KEY, err);
    if (out == NULL) {
        st = EPX_ERR_NOMEM;
        goto done;
    }
    EPX_TRY_GOTO(st, epxi_json_flatten_i32(arr, &t, EPXI_JSON_INDEX_M1, L2P_KEY, out, err), done);
    *map = out;
    out = NULL;
    *num_layers = (int32_t)t.dims[0];
    *num_experts = (int32_t)t.dims[1];
    *width = (int32_t)t.dims[2];
done:
    free(out);
    json_decref(root);
    return st;
}

/* A table [ranks][L][E] (X == 0) or per-rank lists [ranks][L][E][X]. */
typedef struct table_ctx {
    const char *key;
    const int32_t *table;
    int32_t ranks, L, E, X; /* ranks == 0: one rank's [L][E] or [L][E][X] */
} table_ctx;

/* One rank's [L][E] integers, or [L][E][X] lists with X >= 1, one layer a line. */
static epx_status write_le(FILE *f, const int32_t *t, int32_t L, int32_t E, int32_t X) {
    size_t per = X ? (size_t)X : 1;
    fputc('[', f);
    for (int32_t l = 0; l < L; l++) {
        fputs(l ? ",\n  [" : "\n  [", f);
        for (int32_t e = 0; e < E; e++) {
            const int32_t *v = t + ((size_t)l * (size_t)E + (size_t)e) * per;
            if (e) fputc(',', f);
            if (X == 0) {
                fprintf(f, "%d", v[0]);
                continue;
            }
            fputc('[', f);
            for (int32_t x = 0; x < X; x++) fprintf(f, x ? ",%d" : "%d", v[x]);
            fputc(']', f);
        }
        fputc(']', f);
    }
    fputc(']', f);
    return ferror(f) ? EPX_ERR_IO : EPX_OK;
}

static epx_status write_table(FILE *f, const void *vctx, epx_error *err) {
    (void)err;
    const table_ctx *c = vctx;
    size_t rank = (size_t)c->L * (size_t)c->E * (c->X ? (size_t)c->X : 1);
    fprintf(f, "{\"%s\": ", c->key);
    if (c->ranks == 0) {
        EPX_TRY(write_le(f, c->table, c->L, c->E, c->X));
    } else {
        fputc('[', f);
        for (int32_t r = 0; r < c->ranks; r++) {
            if (r) fputs(",\n ", f);
            EPX_TRY(write_le(f, c->table + (size_t)r * rank, c->L, c->E, c->X));
        }
        fputc(']', f);
    }
    fputs("}\n", f);
    return ferror(f) ? EPX_ERR_IO : EPX_OK;
}

epx_status epx_dispatch_table_write_json(const char *path, const int32_t *table, int32_t num_ranks,
                                         int32_t num_layers, int32_t num_experts, epx_error *err) {
    if (path == NULL || table == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "epx_dispatch_table_write_json: NULL argument");
    if (num_ranks < 0 || num_layers < 1 || num_experts < 1)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "table of %d ranks x %d layers x %d experts: ranks must be >= 0 "
                         "(0 = one rank's [L][E]), layers and experts >= 1",
                         num_ranks, num_layers, num_experts);
    table_ctx c = {TABLE_KEY, table, num_ranks, num_layers, num_experts, 0};
    return epxi_write_atomically(path, write_table, &c, err);
}

epx_status epx_dispatch_rank_lists_write_json(const char *path, const int32_t *lists,
                                              int32_t num_ranks, int32_t num_layers,
                                              int32_t num_experts, int32_t width, epx_error *err) {
    if (path == NULL || lists == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_dispatch_rank_lists_write_json: NULL argument");
    if (num_ranks < 0 || num_layers < 1 || num_experts < 1 || width < 1)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "lists of %d ranks x %d layers x %d experts x %d slots: ranks must be "
                         ">= 0 (0 = one rank's [L][E][X]), layers, experts and slots >= 1",
                         num_ranks, num_layers, num_experts, width);
    table_ctx c = {LISTS_KEY, lists, num_ranks, num_layers, num_experts, width};
    return epxi_write_atomically(path, write_table, &c, err);
}
