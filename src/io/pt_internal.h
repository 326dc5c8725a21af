/*
 * pt_internal.h - what the pieces of the .pt reader share: the value tree
 * with its arena (pt_value.c), the unpickler (pt_unpickle.c), which gets
 * storage bytes through a resolver so the zip container (pt_zip.c) and the
 * fuzz harness can each supply them, and the SGLang interpretation
 * (pt_sglang.c). Internal to libepx.
 */
#ifndef EPX_PT_INTERNAL_H
#define EPX_PT_INTERNAL_H

#include "internal.h"

/* Kinds beyond the public ones: they exist only while unpickling, as the
 * arguments of REDUCE and BINPERSID, and never in a finished tree. */
enum {
    EPXI_PT_GLOBAL = 100, /* an allowed callable or class (epxi_pt_global) */
    EPXI_PT_STORAGE = 101 /* a storage, from a persistent id               */
};

/* The globals a pickle may name: everything else is refused. */
typedef enum epxi_pt_global {
    EPXI_PT_G_REBUILD_TENSOR_V2 = 0, /* torch._utils._rebuild_tensor_v2          */
    EPXI_PT_G_ORDERED_DICT = 1,      /* collections.OrderedDict                  */
    EPXI_PT_G_STORAGE = 2            /* torch.<X>Storage; dtype in the value     */
} epxi_pt_global;

/* A value is 48 bytes, carved from slabs of the file's arena: with the
 * 8-byte slot a container keeps for it, a pickle of millions of small values
 * costs at most 64 bytes per value (it was about 330). So the header is
 * packed, dict sizes are 32-bit (a dict is capped below 2^30 entries) and a
 * tensor's 288-byte descriptor lives in its own allocation, paid by tensors
 * only. pt_value.c asserts the size. */
struct epx_pt_value {
    uint32_t nodes;           /* values reachable counting shared ones each time
                                  (<= EPX_PT_MAX_NODES = 2^27) */
    uint16_t depth;           /* 0 for a scalar, 1 + deepest child otherwise */
    uint8_t kind;             /* epx_pt_kind or EPXI_PT_* */
    uint8_t sealed : 1;       /* inside a container: may no longer be mutated */
    uint8_t has_internal : 1; /* an EPXI_PT_* kind is reachable from here */
    union {
        int64_t i; /* INT, BOOL */
        double f;  /* FLOAT */
        struct {
            char *bytes; /* NUL-terminated copy */
            size_t len;
        } str;
        struct { /* LIST, TUPLE */
            struct epx_pt_value **items;
            size_t n, cap;
        } seq;
        struct { /* DICT */
            struct epx_pt_value **keys, **vals;
            uint32_t *index; /* open addressing over entries, slot = entry + 1 */
            uint32_t n, cap;
            uint32_t index_cap;
        } dict;
        struct {              /* TENSOR: the descriptor is complete and checked */
            epx_pt_tensor *t; /* owned: allocated with the value */
        } tensor;
        struct { /* EPXI_PT_GLOBAL */
            epxi_pt_global which;
            epx_pt_dtype dtype; /* for EPXI_PT_G_STORAGE */
        } global;
        struct { /* EPXI_PT_STORAGE */
            epx_pt_dtype dtype;
            int64_t numel;
            const void *bytes;
        } storage;
    } u;
};

/* The arena: values are carved from slabs, newest slab first. */
typedef struct epxi_pt_slab {
    struct epxi_pt_slab *prev;
    size_t used, cap;
    struct epx_pt_value v[];
} epxi_pt_slab;

struct epx_pt_file {
    epxi_pt_slab *slabs; /* arena: every value */
    void **blobs;        /* owned buffers (storage bytes) */
    size_t num_blobs, cap_blobs;
    const struct epx_pt_value *root;
    char name[256];
};

/* A new empty file named `name` (may be NULL). */
EPXI_HIDDEN epx_status epxi_pt_file_new(const char *name, epx_pt_file **out, epx_error *err);

/* Hand a malloc'd buffer to the file, which frees it on destroy. On failure
 * the buffer is freed here. */
EPXI_HIDDEN epx_status epxi_pt_file_own(epx_pt_file *f, void *blob, epx_error *err);

/* A new value of `kind` in the file's arena (zeroed payload). */
EPXI_HIDDEN epx_pt_value *epxi_pt_new(epx_pt_file *f, int kind, epx_error *err);

/* A string value holding a copy of `len` bytes. */
EPXI_HIDDEN epx_pt_value *epxi_pt_new_string(epx_pt_file *f, const char *s, size_t len,
                                             epx_error *err);

/* Append to an unsealed list or tuple under construction; seals `item`. */
EPXI_HIDDEN epx_status epxi_pt_seq_push(epx_pt_value *seq, epx_pt_value *item, epx_error *err);

/* d[key] = val on an unsealed dict (a key already present keeps its place
 * and takes the new value, as in Python); seals both. */
EPXI_HIDDEN epx_status epxi_pt_dict_set(epx_pt_value *d, epx_pt_value *key, epx_pt_value *val,
                                        epx_error *err);

/* Storage bytes for the key of a persistent id ('storage', class, key,
 * location, numel): *data stays valid for the file's lifetime, *nbytes is
 * the size actually present. `claimed` is numel * element size as the
 * pickle states it, for resolvers that synthesise data (the fuzz harness);
 * a real archive ignores it and the unpickler compares the two. */
typedef epx_status (*epxi_pt_storage_fn)(void *ctx, epx_pt_file *f, const char *key, size_t key_len,
                                         uint64_t claimed, const void **data, size_t *nbytes,
                                         epx_error *err);

/*
 * Run the restricted unpickler over `len` bytes of data.pkl, setting
 * f->root on success. Nothing named by the pickle is ever called: the only
 * effects are values in f's arena and the resolver's storage reads.
 */
EPXI_HIDDEN epx_status epxi_pt_unpickle(epx_pt_file *f, const uint8_t *pkl, size_t len,
                                        epxi_pt_storage_fn resolve, void *ctx, epx_error *err);

/* The storage class torch names `name` ("FloatStorage"), or -1. */
EPXI_HIDDEN int epxi_pt_storage_dtype(const char *name, size_t len);
/* The class name of a dtype's storage ("LongStorage"). */
EPXI_HIDDEN const char *epxi_pt_storage_name(epx_pt_dtype dt);

#endif
