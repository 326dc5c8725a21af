/*
 * epx/layout.h - the expert layout handle: which logical expert each physical
 * slot holds, per layer, and the maps derived from it. This is what SGLang
 * calls ExpertLocationMetadata. physical_to_logical [L][P] is the single
 * source of truth; every other map is derived from it and kept in step.
 * Include epx.h, not this file.
 */
#ifndef EPX_LAYOUT_H
#define EPX_LAYOUT_H

typedef struct epx_layout epx_layout;

/*
 * Create the trivial layout: slot p of every layer holds logical expert
 * p % E (SGLang's init_trivial).
 * Args:    shape (in) validated with epx_shape_check;
 *          out   (out) the new layout, owned by the caller (epx_layout_destroy).
 * Returns: EPX_OK, EPX_ERR_SHAPE, EPX_ERR_OVERFLOW, EPX_ERR_NOMEM.
 * Thread:  any thread.
 */
EPX_API epx_status epx_layout_create_trivial(const epx_shape *shape, epx_layout **out,
                                             epx_error *err);

/*
 * Create a layout from a physical_to_logical map.
 * Args:    shape (in) L, E, P, G, N; validated first;
 *          physical_to_logical (in) [L][P] int32, row-major, copied;
 *          out (out) the new layout, owned by the caller.
 * Returns: EPX_OK; EPX_ERR_SHAPE for a bad shape; EPX_ERR_INVALID_MAP when a
 *          slot holds an id outside [0, E) (the message names layer, slot and
 *          id) or a logical expert has no replica (names layer and expert);
 *          EPX_ERR_NOMEM.
 */
EPX_API epx_status epx_layout_create_from_map(const epx_shape *shape,
                                              const int32_t *physical_to_logical, epx_layout **out,
                                              epx_error *err);

/* Release a layout and every view it handed out. Accepts NULL. */
EPX_API void epx_layout_destroy(epx_layout *layout);

/* A deep copy of `src` (same shape, same maps). */
EPX_API epx_status epx_layout_clone(const epx_layout *src, epx_layout **out, epx_error *err);

/*
 * Overwrite chosen layers of `dst` with those of `src`, in place: no buffer of
 * `dst` is reallocated, so views already handed out (and GPU copies captured
 * from them) stay valid and see the new contents.
 * Args:    dst (in/out); src (in) must have exactly dst's shape;
 *          layers (in) [L] bytes, nonzero = copy this layer; NULL = all layers.
 * Returns: EPX_OK, EPX_ERR_SHAPE (names both shapes).
 * Thread:  no reader of dst may run concurrently.
 */
EPX_API epx_status epx_layout_update(epx_layout *dst, const epx_layout *src, const uint8_t *layers,
                                     epx_error *err);

/* The layout's shape. Valid for the layout's lifetime; NULL for a NULL
 * layout (as the other getters below, whose width is then 0). */
EPX_API const epx_shape *epx_layout_shape(const epx_layout *layout);

/* Read-only views, valid for the layout's lifetime (updates change contents,
 * never addresses). */

/* physical_to_logical [L][P]: the logical expert held by each slot. */
EPX_API const int32_t *epx_layout_physical_to_logical(const epx_layout *layout);

/*
 * logical_to_all_physical [L][E][W]: the slots holding each logical expert,
 * ascending, padded with -1. W = P - E + 1, the most replicas any expert can
 * have while every expert has one; *width receives W. SGLang pads to P
 * instead: use epx_layout_export_logical_to_all_physical for that form.
 */
EPX_API const int32_t *epx_layout_logical_to_all_physical(const epx_layout *layout, int32_t *width);

/* num_valid [L][E]: replica count of each logical expert (>= 1). */
EPX_API const int32_t *epx_layout_num_valid(const epx_layout *layout);

/* Largest replica count over all layers and experts (0 for NULL). */
EPX_API int32_t epx_layout_max_replicas(const epx_layout *layout);

/*
 * Copy logical_to_all_physical padded with -1 to `width` columns (SGLang uses
 * width = P) into `out` [L][E][width], caller-owned.
 * Returns: EPX_OK, EPX_ERR_INVALID_ARG when width < epx_layout_max_replicas.
 */
EPX_API epx_status epx_layout_export_logical_to_all_physical(const epx_layout *layout,
                                                             int32_t width, int32_t *out,
                                                             epx_error *err);

/* The P/G slots of GPU `gpu` in layer `layer`: a pointer into
 * physical_to_logical. NULL when layer or gpu is out of range. */
EPX_API const int32_t *epx_layout_gpu_slots(const epx_layout *layout, int32_t layer, int32_t gpu);

/* The P/N slots of node `node` in layer `layer` (GPUs of a node are
 * contiguous). NULL when out of range. */
EPX_API const int32_t *epx_layout_node_slots(const epx_layout *layout, int32_t layer, int32_t node);

/* Number of replicas of logical expert `expert` on GPU `gpu` in `layer`;
 * -1 when an index is out of range. */
EPX_API int32_t epx_layout_replicas_on_gpu(const epx_layout *layout, int32_t layer, int32_t gpu,
                                           int32_t expert);

#endif /* EPX_LAYOUT_H */
