/*
 * pt_stub.c - placeholder until the .pt reader lands: every .pt request is a
 * clear "not supported yet", never a crash. Delete this file when
 * src/io/pt_*.c implements pt_hooks.h.
 */
#include "pt_hooks.h"

epx_status epxi_pt_read_mapping(const char *path, int32_t **map, int32_t *num_layers,
                                int32_t *num_physical, epx_error *err) {
    (void)map, (void)num_layers, (void)num_physical;
    return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                     "'%s': reading PyTorch .pt files is not supported by this build yet; "
                     "convert it to JSON",
                     path);
}

epx_status epxi_pt_read_counts(const char *path, epx_counts **out, epx_error *err) {
    (void)out;
    return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                     "'%s': reading PyTorch .pt files is not supported by this build yet; "
                     "convert it to JSON",
                     path);
}
