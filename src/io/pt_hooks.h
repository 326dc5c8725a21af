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

/* How counts are read: epx_read_opts resolved (the old entry points read a
 * stat dump's rows as windows and one window per forward pass). */
typedef struct epxi_read_cfg {
    int32_t window_passes;     /* per_pass: passes per window, 0 = one */
    bool stat_rows_as_windows; /* stat dumps: rows as windows, not summed */
    epx_progress_fn progress;
    void *progress_user;
    char *how; /* optional: the sentence saying how the input was read */
    size_t how_cap;
    /* epx_read_opts given: a window_passes > 0 on an input with no per_pass
     * dump is refused (it was ignored), and one that does not divide the
     * passes recorded. */
    bool strict;
    /* EPX_STAT_ROWS_WINDOWS asked: refused on an input with no stat dump
     * (EPX_STAT_ROWS_WINDOWS_IF_STAT reads rows as windows without it: a
     * caller that wants the series whatever it reads, as epx plan does for
     * deepseek-vec). */
    bool stat_rows_asked;
} epxi_read_cfg;

/* The refusal strict asks for, once the input's kind is known: EPX_OK or
 * EPX_ERR_INVALID_ARG naming the option. */
EPXI_HIDDEN epx_status epxi_read_cfg_applies(const epxi_read_cfg *cfg, bool per_pass, bool stat,
                                             epx_error *err);

/* {"logical_count": [L][E] | [S][L][E]} init files, and SGLang's stat and
 * per_pass dumps, from a torch .pt file. */
EPXI_HIDDEN epx_status epxi_pt_read_counts(const char *path, const epxi_read_cfg *cfg,
                                           epx_counts **out, epx_error *err);

#endif
