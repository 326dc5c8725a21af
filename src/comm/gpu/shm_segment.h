/*
 * shm_segment.h - POSIX shared memory that the host-memory transport puts
 * one rank's peer-written area in (transport_host.cu), with the lifetime
 * rules that leave nothing behind in /dev/shm:
 *   - the owner creates the segment (O_EXCL) with the number of users that
 *     will count in (every rank, itself included);
 *   - each user maps it and counts in once; the one that completes the count
 *     removes the name, so from then on the memory lives exactly as long as
 *     its mappings, and a crash of any rank leaves no name behind;
 *   - a segment whose owner died before every user counted in is removed by
 *     the next creation in the owner's pid namespace (epxi_shm_sweep: its
 *     name carries the namespace and the pid), and the owner removes it when
 *     it is destroyed.
 * Pure C and no CUDA, so CI tests the lifetime on a machine without GPU.
 */
#ifndef EPX_SHM_SEGMENT_H
#define EPX_SHM_SEGMENT_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "internal.h"

#define EPXI_SHM_NAME_BYTES 48
/* The header page before the data, so the data is page-aligned. */
#define EPXI_SHM_HEADER 4096

typedef struct epxi_shm {
    char name[EPXI_SHM_NAME_BYTES]; /* "/epx-ll-<pid namespace>-<pid>-<random>-<n>" */
    void *map;                      /* the whole mapping (header first), NULL when closed */
    size_t bytes;                   /* data bytes (after the header) */
    bool owner;
} epxi_shm;

/* The data of a mapped segment. */
static inline void *epxi_shm_data(const epxi_shm *s) {
    return s->map == NULL ? NULL : (unsigned char *)s->map + EPXI_SHM_HEADER;
}

/* Create a zeroed segment of `bytes` data bytes that `users` mappers will
 * count in to, after sweeping segments of dead owners. Returns EPX_OK,
 * EPX_ERR_INVALID_ARG, EPX_ERR_IO (shm_open/ftruncate/mmap, with the errno
 * text and the name). */
EPXI_HIDDEN epx_status epxi_shm_create(size_t bytes, int32_t users, epxi_shm *s, epx_error *err);
/* Map another process's segment by name and check its size. Returns EPX_OK,
 * EPX_ERR_IO (missing: the ranks must share /dev/shm), EPX_ERR_INVALID_ARG
 * (not an epx segment, or of another size). */
EPXI_HIDDEN epx_status epxi_shm_attach(const char *name, size_t bytes, epxi_shm *s, epx_error *err);
/* Count one user in on the segment whose mapping starts at `map` (mapped
 * here, or the owner's own mapping in this process); the last one removes
 * the name. Returns true when this call removed it. */
EPXI_HIDDEN bool epxi_shm_count_in(void *map, const char *name);
/* Unmap; the owner also removes the name if it is still there. */
EPXI_HIDDEN void epxi_shm_close(epxi_shm *s);
/* Remove the names of segments whose owner process is gone; returns how
 * many. Run by epxi_shm_create. */
EPXI_HIDDEN int epxi_shm_sweep(void);

#ifdef __cplusplus
}
#endif
#endif /* EPX_SHM_SEGMENT_H */
