/*
 * epx/pt.h - PyTorch .pt files, read safely and written for SGLang.
 *
 * A .pt file as torch.save writes it is a zip archive: <archive>/data.pkl (a
 * pickle, protocol 2) describes the object, and every tensor's storage is
 * the raw little-endian bytes of <archive>/data/<key>. A pickle is a small
 * program that may call any Python function; this reader never calls
 * anything. It is a restricted unpickler, like torch.load(weights_only=True):
 * it builds tensors (torch._utils._rebuild_tensor_v2 over a storage named by
 * a persistent id), dicts (also collections.OrderedDict), lists, tuples,
 * ints, floats, strings, booleans and None, and refuses every other global
 * with EPX_ERR_REFUSED and a message naming the module.name it asked for.
 *
 * Every size a file claims (storage element counts, shapes and strides,
 * string lengths, memo indices, entry sizes in the zip directory) is checked
 * against the bytes actually present before anything is allocated or read,
 * nesting is limited to EPX_PT_MAX_DEPTH and a tree's expanded size to
 * EPX_PT_MAX_NODES, so a hostile file ends in an error, never in a huge
 * allocation, an out-of-bounds read, a deep recursion or an endless walk.
 *
 * A loaded file (epx_pt_file) owns every value of its object tree and the
 * tensor bytes; values are borrowed pointers, valid until the file is
 * destroyed. A pickle may share one object in several places (its memo), so
 * the tree is a directed acyclic graph: reading it is safe, it has no
 * cycles, and nothing in it is ever freed on its own.
 *
 * SGLang's files on top of that: --init-expert-location files
 * ({"physical_to_logical_map": [L][P]} or {"logical_count": [L][E] or
 * [S][L][E]}) and expert-distribution dumps (stat mode: {"rank",
 * "logical_count" [B][L][E], "average_utilization_rate_over_window"};
 * per_pass mode: {"records": [{"forward_pass_id", "rank", "gatherer_key",
 * "global_physical_count" [L][P]}, ...], "last_physical_to_logical_map"},
 * one file per rank).
 *
 * Thread rules: functions here share no state; one epx_pt_file may be read
 * from several threads at once.
 * Include epx.h, not this file.
 */
#ifndef EPX_PT_H
#define EPX_PT_H

/* A loaded .pt file: owns its object tree. Opaque. */
typedef struct epx_pt_file epx_pt_file;
/* One node of the object tree, borrowed from its epx_pt_file. Opaque. */
typedef struct epx_pt_value epx_pt_value;

/* What a value is. Append-only. Tuples and lists are separate kinds (a
 * tensor's shape is a tuple); collections.OrderedDict reads as a dict. */
typedef enum epx_pt_kind {
    EPX_PT_NONE = 0,   /* Python None (and what a NULL value reports) */
    EPX_PT_BOOL = 1,   /* True / False                                */
    EPX_PT_INT = 2,    /* an integer that fits int64                  */
    EPX_PT_FLOAT = 3,  /* a double                                    */
    EPX_PT_STRING = 4, /* a str, as UTF-8 bytes                       */
    EPX_PT_LIST = 5,
    EPX_PT_TUPLE = 6,
    EPX_PT_DICT = 7, /* keys in insertion order                     */
    EPX_PT_TENSOR = 8
} epx_pt_kind;

/* Element types of tensors, as torch's storage classes name them
 * (torch.FloatStorage is EPX_PT_DTYPE_FLOAT32 ...). Append-only. */
typedef enum epx_pt_dtype {
    EPX_PT_DTYPE_AUTO = -1,    /* writers only: int64 when every value is integral, else float64 */
    EPX_PT_DTYPE_FLOAT64 = 0,  /* DoubleStorage   */
    EPX_PT_DTYPE_FLOAT32 = 1,  /* FloatStorage    */
    EPX_PT_DTYPE_FLOAT16 = 2,  /* HalfStorage     */
    EPX_PT_DTYPE_BFLOAT16 = 3, /* BFloat16Storage */
    EPX_PT_DTYPE_INT64 = 4,    /* LongStorage     */
    EPX_PT_DTYPE_INT32 = 5,    /* IntStorage      */
    EPX_PT_DTYPE_INT16 = 6,    /* ShortStorage    */
    EPX_PT_DTYPE_INT8 = 7,     /* CharStorage     */
    EPX_PT_DTYPE_UINT8 = 8,    /* ByteStorage     */
    EPX_PT_DTYPE_BOOL = 9,     /* BoolStorage     */
    EPX_PT_DTYPE_COUNT_        /* not a dtype: one past the last */
} epx_pt_dtype;

/* Most dimensions a tensor may have, deepest nesting of containers, and
 * most values a walk of the whole tree may meet (a value shared through the
 * pickle's memo counts once per place it appears), so walking a loaded tree
 * recursively is always bounded. */
#define EPX_PT_MAX_DIMS 16
#define EPX_PT_MAX_DEPTH 100
#define EPX_PT_MAX_NODES ((uint64_t)1 << 27)

/*
 * A tensor as stored: a strided view of a storage. A plain descriptor,
 * filled by epx_pt_value_tensor; `storage` points into the epx_pt_file and
 * lives as long as it does. Element (i0, i1, ...) sits at storage element
 * storage_offset + sum(i_k * strides[k]), little-endian.
 */
typedef struct epx_pt_tensor {
    epx_pt_dtype dtype;
    int32_t ndim;                     /* 0 (a scalar) .. EPX_PT_MAX_DIMS */
    int64_t shape[EPX_PT_MAX_DIMS];   /* each >= 0 */
    int64_t strides[EPX_PT_MAX_DIMS]; /* in elements, each >= 0 */
    int64_t storage_offset;           /* in elements */
    int64_t storage_numel;            /* elements the storage holds */
    const void *storage;              /* storage_numel elements of dtype */
} epx_pt_tensor;

/*
 * Load a .pt file written by torch.save (the zip format of torch >= 1.6).
 * Args:    path (in) the file; out (out) the loaded file, release with
 *          epx_pt_file_destroy; untouched on error.
 * Returns: EPX_OK; EPX_ERR_IO (cannot open or read); EPX_ERR_PARSE (not a
 *          zip, no <archive>/data.pkl, a malformed pickle or one whose sizes
 *          disagree with the data: the message names the offset or entry);
 *          EPX_ERR_REFUSED (the pickle asks for a global other than the
 *          tensor, storage and OrderedDict ones: the message names it, and
 *          nothing was executed); EPX_ERR_UNSUPPORTED (the legacy non-zip
 *          format, a big-endian file, a pickle opcode or dtype torch.save
 *          does not write for plain tensors); EPX_ERR_OVERFLOW; EPX_ERR_NOMEM.
 * Thread:  safe; allocates.
 */
EPX_API epx_status epx_pt_load(const char *path, epx_pt_file **out, epx_error *err);

/* Whether `path` is a .pt file by its content, whatever its name: a regular
 * file that starts with a zip signature ("PK\3\4", or "PK\5\6" for an empty
 * archive). The readers use it to choose between .pt and JSON, so
 * "dump.pt.bak" reads as .pt and "x.pt" holding JSON reads as JSON.
 * Returns 1 for a zip, 0 otherwise (missing, unreadable, not a file). */
EPX_API int epx_pt_sniff(const char *path);

/* The same from `len` bytes in memory (read during the call only; the file
 * keeps its own copies). `name` (may be NULL) names it in messages. */
EPX_API epx_status epx_pt_load_buffer(const void *data, size_t len, const char *name,
                                      epx_pt_file **out, epx_error *err);

/* Release a loaded file and every value and tensor of it. Accepts NULL. */
EPX_API void epx_pt_file_destroy(epx_pt_file *file);

/* The object torch.save was given (usually a dict). Never NULL for a loaded
 * file. */
EPX_API const epx_pt_value *epx_pt_file_root(const epx_pt_file *file);

/* The path or name the file was loaded from, never NULL. */
EPX_API const char *epx_pt_file_name(const epx_pt_file *file);

/* ---- reading the tree: accessors never fail on a wrong kind, they answer
 *      NULL / 0 / a status, so a caller checks once where it matters. ---- */

/* The kind of a value; EPX_PT_NONE for NULL. */
EPX_API epx_pt_kind epx_pt_value_kind(const epx_pt_value *v);

/* "none", "bool", "int", ... "tensor"; never NULL. */
EPX_API const char *epx_pt_kind_str(epx_pt_kind kind);

/*
 * Scalars. epx_pt_value_int takes INT and BOOL; epx_pt_value_float takes
 * FLOAT, INT and BOOL. *out is untouched on error.
 * Returns: EPX_OK, or EPX_ERR_PARSE naming the kind found.
 */
EPX_API epx_status epx_pt_value_int(const epx_pt_value *v, int64_t *out, epx_error *err);
EPX_API epx_status epx_pt_value_float(const epx_pt_value *v, double *out, epx_error *err);

/* A string's bytes (NUL-terminated; `len` may be NULL and excludes the NUL,
 * which the bytes may also contain), or NULL when v is not a string. */
EPX_API const char *epx_pt_value_string(const epx_pt_value *v, size_t *len);

/* Items of a list or tuple, entries of a dict; 0 for anything else. */
EPX_API size_t epx_pt_value_len(const epx_pt_value *v);

/* Item i of a list or tuple; NULL when out of range or not a sequence. */
EPX_API const epx_pt_value *epx_pt_value_item(const epx_pt_value *v, size_t i);

/* Key / value of dict entry i in insertion order; NULL when out of range. */
EPX_API const epx_pt_value *epx_pt_dict_key(const epx_pt_value *v, size_t i);
EPX_API const epx_pt_value *epx_pt_dict_value(const epx_pt_value *v, size_t i);

/* The value under string key `key` (NUL-terminated), or NULL when v is not
 * a dict or has no such key. */
EPX_API const epx_pt_value *epx_pt_dict_get(const epx_pt_value *v, const char *key);

/*
 * Describe a tensor value.
 * Args:    v (in) a value; out (out) its descriptor, pointing into the file.
 * Returns: EPX_OK, or EPX_ERR_PARSE when v is not a tensor.
 */
EPX_API epx_status epx_pt_value_tensor(const epx_pt_value *v, epx_pt_tensor *out, epx_error *err);

/* Bytes per element of a dtype (1, 2, 4 or 8); 0 for an invalid dtype. */
EPX_API size_t epx_pt_dtype_size(epx_pt_dtype dtype);

/* "float32", "int64", ...; never NULL. */
EPX_API const char *epx_pt_dtype_str(epx_pt_dtype dtype);

/*
 * Check a descriptor (dims, non-negative sizes and strides, every element
 * inside the storage) and count its elements. A view may repeat storage
 * elements (stride 0, as tensor.expand makes), but describe more elements
 * than its storage holds only up to 2^20, so a tiny file cannot ask for a
 * huge dense copy.
 * Returns: EPX_OK with *numel set; EPX_ERR_PARSE or EPX_ERR_OVERFLOW naming
 *          the dimension at fault; EPX_ERR_UNSUPPORTED for a larger expanded
 *          view.
 */
EPX_API epx_status epx_pt_tensor_numel(const epx_pt_tensor *t, int64_t *numel, epx_error *err);

/*
 * Copy a tensor out, row-major (the last index fastest), whatever its
 * strides. `out` (caller-owned) holds exactly `n` == numel elements.
 * epx_pt_tensor_to_f64 converts every dtype (int64 above 2^53 rounds);
 * epx_pt_tensor_to_i64 takes integer and bool dtypes, and floating ones whose
 * every value is integral and within int64.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG when n differs from numel (names
 *          both); the statuses of epx_pt_tensor_numel; EPX_ERR_PARSE for a
 *          non-integral value in _to_i64 (names the flat index).
 */
EPX_API epx_status epx_pt_tensor_to_f64(const epx_pt_tensor *t, double *out, size_t n,
                                        epx_error *err);
EPX_API epx_status epx_pt_tensor_to_i64(const epx_pt_tensor *t, int64_t *out, size_t n,
                                        epx_error *err);

/* ---- SGLang's files ---------------------------------------------------- */

/*
 * The physical_to_logical_map [L][P] of a loaded init file: a tensor of
 * integer ids in [0, 2^31) (float tensors of integral values are accepted).
 * Args:    file (in); map (out) [L][P] int32, release with epx_free; L, P (out).
 * Returns: EPX_OK; EPX_ERR_PARSE when the root is not a dict, the key is
 *          missing (a counts file says "it is a counts file"), the value is
 *          not a 2-d tensor, or an id is out of range (names layer, slot and
 *          value); EPX_ERR_SHAPE above the limits of epx_mapping_read;
 *          EPX_ERR_NOMEM.
 */
EPX_API epx_status epx_mapping_from_pt(const epx_pt_file *file, int32_t **map, int32_t *num_layers,
                                       int32_t *num_physical, epx_error *err);

/*
 * Load counts [S][L][E] from loaded files, which must all be of one kind:
 *  - "logical_count" files (init files, [L][E] or [S][L][E], and stat
 *    dumps, [B][L][E]): windows are concatenated in the order given;
 *  - per_pass dumps (one per rank): records are summed over ranks per
 *    forward pass, passes sorted by id (S = distinct passes), and physical
 *    slots converted to logical experts with last_physical_to_logical_map,
 *    as SGLang's _convert_global_physical_count_to_logical_count does
 *    (E = largest id + 1). Every file must carry the same map, and a
 *    (pass, rank) pair may appear once.
 * Loads must be finite and non-negative.
 * Args:    files (in) nfiles >= 1 loaded files; out (out) release with
 *          epx_counts_destroy.
 * Returns: EPX_OK; EPX_ERR_PARSE (a missing key, a wrong kind, mixed file
 *          kinds, a duplicate (pass, rank), differing maps: named);
 *          EPX_ERR_SHAPE (shapes disagree between records or files, a slot
 *          id outside the map); EPX_ERR_INVALID_ARG; EPX_ERR_NOMEM.
 */
EPX_API epx_status epx_counts_from_pt(const epx_pt_file *const *files, size_t nfiles,
                                      epx_counts **out, epx_error *err);

/*
 * Read counts from .pt files named by `spec`: one path, a comma-separated
 * list of paths ("r0.pt,r1.pt"), or a directory (every file in it whose name
 * ends in .pt, in byte order of the names, as SGLang's reader sorts them). A
 * spec that exists is one path even with commas in its name.
 * epx_counts_read sends specs ending in .pt here.
 * Returns: the statuses of epx_pt_load and epx_counts_from_pt, with the
 *          file named; EPX_ERR_IO for an empty directory; EPX_ERR_PARSE when
 *          the loads sum above 2^63 (what SGLang's int64 counts hold) or an
 *          int64 count past 2^53 is not a double's value (it would read
 *          rounded; named by value).
 */
EPX_API epx_status epx_counts_read_pt(const char *spec, epx_counts **out, epx_error *err);

/*
 * Write {"physical_to_logical_map": int64 tensor [L][P]} as a .pt file that
 * torch.load(path, weights_only=True) reads, in torch.save's zip layout
 * (<stem>/data.pkl, data/0, version, byteorder, ...), replacing `path`
 * atomically (temp file + rename).
 * Returns: EPX_OK, EPX_ERR_INVALID_ARG, EPX_ERR_IO, EPX_ERR_NOMEM.
 */
EPX_API epx_status epx_layout_write_pt(const epx_layout *layout, const char *path, epx_error *err);

/*
 * Write {"logical_count": tensor} ([L][E] when S == 1, else [S][L][E]) the
 * same way, as `dtype`: EPX_PT_DTYPE_INT64, _INT32, _FLOAT32, _FLOAT64, or
 * _AUTO (int64 when every load is integral, else float64).
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG for another dtype, a load the
 *          readers would refuse (not finite, negative, or a total above
 *          2^63), or a load that does not fit an integer dtype (names the
 *          index and value); EPX_ERR_IO; EPX_ERR_NOMEM.
 */
EPX_API epx_status epx_counts_write_pt(const epx_counts *counts, const char *path,
                                       epx_pt_dtype dtype, epx_error *err);

#endif /* EPX_PT_H */
