/*
 * json_tensor.h - reading rectangular numeric arrays out of jansson values,
 * with errors that name the index and the value, shared by the mapping,
 * counts and dispatch-table readers. Internal to libepx.
 */
#ifndef EPX_JSON_TENSOR_H
#define EPX_JSON_TENSOR_H

#include <jansson.h>

#include "internal.h"

#define EPXI_JSON_MAX_RANK 4

typedef struct epxi_json_tensor {
    int rank; /* number of dimensions */
    int64_t dims[EPXI_JSON_MAX_RANK];
    size_t count; /* product of dims */
} epxi_json_tensor;

/* Which element values are acceptable. */
typedef enum epxi_json_kind {
    EPXI_JSON_INDEX,    /* integers in [0, INT32_MAX] (expert ids)           */
    EPXI_JSON_INDEX_M1, /* integers in [-1, INT32_MAX] (-1 = padding)        */
    EPXI_JSON_LOAD      /* finite non-negative reals or integers (loads)     */
} epxi_json_kind;

/*
 * Measure a nested array of rank in [min_rank, max_rank]: its rank comes from
 * descending first elements; every row must then have the same length.
 * `key` names the array in messages.
 */
EPXI_HIDDEN epx_status epxi_json_measure(const json_t *arr, int min_rank, int max_rank,
                                         const char *key, epxi_json_tensor *out, epx_error *err);

/* Flatten a measured array row-major into int32 (INDEX kinds) or double
 * (LOAD) storage of t->count elements. */
EPXI_HIDDEN epx_status epxi_json_flatten_i32(const json_t *arr, const epxi_json_tensor *t,
                                             epxi_json_kind kind, const char *key, int32_t *out,
                                             epx_error *err);
EPXI_HIDDEN epx_status epxi_json_flatten_f64(const json_t *arr, const epxi_json_tensor *t,
                                             const char *key, double *out, epx_error *err);

/* Parse JSON text into an object; the message gives line and column. */
EPXI_HIDDEN epx_status epxi_json_parse_object(const char *text, size_t len, const char *what,
                                              json_t **out, epx_error *err);

/* Load an object from a path, or from inline text when spec starts with '{'. */
EPXI_HIDDEN epx_status epxi_json_load_spec(const char *spec, json_t **out, epx_error *err);

#endif
