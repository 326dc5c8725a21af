/*
 * layout_internal.h - what the rooms above may ask of the layout room besides
 * the public API: a constructor for callers that checked the shape already.
 * Internal.
 */
#ifndef EPX_LAYOUT_INTERNAL_H
#define EPX_LAYOUT_INTERNAL_H

#include "internal.h"

/* epx_layout_create_from_map for a shape that passed epx_shape_check (the
 * public entry points check a shape once; internal calls trust it). The map
 * is still checked: it is what the caller computed. map and out non-NULL. */
EPXI_HIDDEN epx_status epxi_layout_create_checked(const epx_shape *shape, const int32_t *map,
                                                  epx_layout **out, epx_error *err);

#endif
