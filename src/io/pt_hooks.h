/*
 * pt_hooks.h - what the JSON-facing readers need from the .pt reader, so a
 * spec ending in .pt goes through the same entry points as .json. Internal.
 */
#ifndef EPX_PT_HOOKS_H
#define EPX_PT_HOOKS_H

#include "internal.h"

/* {"physical_to_logical_map": tensor [L][P]} from a torch .pt file. */
EPXI_HIDDEN epx_status epxi_pt_read_mapping(const char *path, int32_t **map, int32_t *num_layers,
                                            int32_t *num_physical, epx_error *err);

/* {"logical_count": [L][E] | [S][L][E]} init files, and SGLang's stat and
 * per_pass dumps, from a torch .pt file. */
EPXI_HIDDEN epx_status epxi_pt_read_counts(const char *path, epx_progress_fn progress,
                                           void *progress_user, epx_counts **out, epx_error *err);

#endif
