/*
 * comm_internal.h - what the comm room's engines share beyond the public
 * header. Not installed.
 */
#ifndef EPX_COMM_INTERNAL_H
#define EPX_COMM_INTERNAL_H

#ifdef __cplusplus
extern "C" {
#endif

#include "internal.h"
#include "epx_comm.h"

/* Mark a communicator failed with `st` (EPX_ERR_COMM or EPX_ERR_TIMEOUT)
 * found outside its own calls, e.g. by a kernel that waited for a peer's
 * flag in vain; later calls and epx_comm_health report `msg`. The first
 * failure stays. */
EPXI_HIDDEN void epxi_comm_poison(epx_comm *comm, epx_status st, const char *msg);

#ifdef __cplusplus
}
#endif
#endif /* EPX_COMM_INTERNAL_H */
