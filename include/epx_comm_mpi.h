/*
 * epx_comm_mpi.h - the MPI communicator: host buffers, any number of
 * processes on one machine or many (library epx_mpi, built when MPI is
 * found). The caller initialises MPI and owns its communicator; epx works
 * on a private duplicate of it, with MPI_ERRORS_RETURN, so epx's traffic
 * and error handling never touch the caller's.
 *
 * Every operation is a non-blocking MPI call (MPI_Ialltoallv, MPI_Iallreduce,
 * MPI_Ibarrier) polled until done or until the timeout passes, so a peer
 * that died or stopped makes the others return EPX_ERR_TIMEOUT (or
 * EPX_ERR_COMM when MPI reports the failure) instead of hanging. After that
 * the communicator is poisoned (epx_comm.h); the MPI job itself cannot be
 * repaired from inside epx and should end (MPI_Abort, or exit). Under
 * Open MPI, run with `mpirun --enable-recovery` for the survivors of a killed
 * rank to see the error at all: without it mpirun kills them first.
 */
#ifndef EPX_COMM_MPI_H
#define EPX_COMM_MPI_H

#include <mpi.h>

#include "epx_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct epx_comm_mpi_opts {
    uint32_t version;   /* EPX_COMM_MPI_OPTS_VERSION */
    int32_t timeout_ms; /* per operation, >= 1 (default 30000) */
} epx_comm_mpi_opts;

#define EPX_COMM_MPI_OPTS_VERSION ((uint32_t)sizeof(epx_comm_mpi_opts))
#define EPX_COMM_MPI_OPTS_INIT                                                                     \
    { EPX_COMM_MPI_OPTS_VERSION, 30000 }

/*
 * Make an epx communicator over `comm` (e.g. MPI_COMM_WORLD).
 * Args:    comm (in) borrowed; duplicated with MPI_Comm_idup (polled with the
 *          timeout), so the caller may free its own afterwards;
 *          opts (in) or NULL for the defaults; out (out) epx_comm_destroy
 *          frees the duplicate.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG (MPI not initialised, bad options,
 *          comm MPI_COMM_NULL or an intercommunicator);
 *          EPX_ERR_COMM (an MPI call failed: the message carries MPI's
 *          error string); EPX_ERR_TIMEOUT; EPX_ERR_NOMEM.
 * Collective: yes, over comm. Thread: MPI must be initialised with a thread
 *          level that allows the calling thread to call MPI.
 */
EPX_API epx_status epx_comm_mpi_create(MPI_Comm comm, const epx_comm_mpi_opts *opts, epx_comm **out,
                                       epx_error *err);

#ifdef __cplusplus
}
#endif
#endif /* EPX_COMM_MPI_H */
