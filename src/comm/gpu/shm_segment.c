/*
 * shm_segment.c - the host-memory transport's shared segments and their
 * lifetime (shm_segment.h says the rules).
 */
#define _GNU_SOURCE
#include "shm_segment.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PREFIX "epx-ll-"
static const uint64_t kMagic = 0x65707873686d3031ull; /* "epxshm01" */

/* The header page: written by the owner before anyone else can know the name. */
typedef struct header {
    uint64_t magic;
    uint64_t bytes;
    int32_t owner_pid;
    int32_t users;
    int32_t counted; /* users that counted in so far (atomic) */
} header;

static uint64_t g_instance; /* segments this process created (atomic) */

/* This process's pid namespace (the inode of /proc/self/ns/pid), 0 where
 * unknown: a pid means something only within its namespace, and containers
 * that share /dev/shm (docker --ipc=host) often have namespaces of their own. */
static unsigned long long pid_namespace(void) {
    struct stat sb;
    return stat("/proc/self/ns/pid", &sb) == 0 ? (unsigned long long)sb.st_ino : 0ull;
}

static size_t total_bytes(size_t bytes) {
    const size_t page = EPXI_SHM_HEADER;
    return EPXI_SHM_HEADER + (bytes + page - 1) / page * page;
}

int epxi_shm_sweep(void) {
    DIR *d = opendir("/dev/shm");
    if (d == NULL) return 0;
    int removed = 0;
    const unsigned long long ns = pid_namespace();
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, PREFIX, strlen(PREFIX)) != 0) continue;
        /* "<pid namespace>-<pid>-...": only our namespace's pids can be asked */
        char *end = NULL;
        unsigned long long owner_ns = strtoull(e->d_name + strlen(PREFIX), &end, 10);
        if (end == NULL || *end != '-' || owner_ns != ns || ns == 0) continue;
        long pid = strtol(end + 1, &end, 10);
        if (end == NULL || *end != '-' || pid <= 0 || pid > INT32_MAX) continue;
        /* Only a process that no longer exists gives up its names: a live
         * owner (or a pid we may not signal) keeps them. */
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        char name[EPXI_SHM_NAME_BYTES + 2];
        if (snprintf(name, sizeof name, "/%s", e->d_name) >= (int)sizeof name) continue;
        if (shm_unlink(name) == 0) removed++;
    }
    closedir(d);
    return removed;
}

static epx_status map_fd(int fd, size_t total, const char *name, const char *what, void **out,
                         epx_error *err) {
    void *m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        return epxi_fail(err, EPX_ERR_IO, "host-memory EP: cannot map %s %s (%zu bytes): %s", what,
                         name, total, strerror(errno));
    *out = m;
    return EPX_OK;
}

epx_status epxi_shm_create(size_t bytes, int32_t users, epxi_shm *s, epx_error *err) {
    memset(s, 0, sizeof *s);
    if (bytes == 0 || bytes > ((size_t)1 << 46) || users < 1)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "host-memory EP: a segment of %zu bytes for %d users (need 1 byte to "
                         "64 TiB and at least one user)",
                         bytes, users);
    epxi_shm_sweep();
    /* The random part keeps names apart across pid namespaces sharing /dev/shm. */
    uint64_t rnd = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)(uintptr_t)s;
    FILE *f = fopen("/dev/urandom", "rb");
    if (f != NULL) {
        if (fread(&rnd, sizeof rnd, 1, f) != 1) rnd ^= (uint64_t)clock();
        fclose(f);
    }
    const uint64_t n = __atomic_fetch_add(&g_instance, 1, __ATOMIC_RELAXED);
    snprintf(s->name, sizeof s->name, "/" PREFIX "%llu-%d-%08x-%llu", pid_namespace(),
             (int)getpid(), (unsigned)(rnd & 0xffffffffu), (unsigned long long)n);
    const size_t total = total_bytes(bytes);
    int fd = shm_open(s->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return epxi_fail(err, EPX_ERR_IO,
                         "host-memory EP: cannot create shared memory %s: %s (is /dev/shm "
                         "mounted and writable?)",
                         s->name, strerror(errno));
    epx_status st = EPX_OK;
    if (ftruncate(fd, (off_t)total) != 0)
        st = epxi_fail(err, EPX_ERR_IO,
                       "host-memory EP: cannot size shared memory %s to %zu bytes: %s (/dev/shm "
                       "too small? docker: --shm-size or --ipc=host)",
                       s->name, total, strerror(errno));
    if (st == EPX_OK) st = map_fd(fd, total, s->name, "shared memory", &s->map, err);
    close(fd);
    if (st != EPX_OK) {
        shm_unlink(s->name);
        s->map = NULL;
        return st;
    }
    /* ftruncate zeroes the pages; only the header is written. */
    header *h = (header *)s->map;
    h->bytes = bytes;
    h->owner_pid = (int32_t)getpid();
    h->users = users;
    h->counted = 0;
    __atomic_store_n(&h->magic, kMagic, __ATOMIC_RELEASE);
    s->bytes = bytes;
    s->owner = true;
    return EPX_OK;
}

epx_status epxi_shm_attach(const char *name, size_t bytes, epxi_shm *s, epx_error *err) {
    memset(s, 0, sizeof *s);
    if (name == NULL || strncmp(name, "/" PREFIX, strlen(PREFIX) + 1) != 0 ||
        strlen(name) >= sizeof s->name || strchr(name + 1, '/') != NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "host-memory EP: '%s' is not the name of an epx segment (/" PREFIX "...)",
                         name == NULL ? "(null)" : name);
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0)
        return epxi_fail(err, EPX_ERR_IO,
                         "host-memory EP: cannot open a peer's shared memory %s: %s (the ranks "
                         "must share /dev/shm: one host, one IPC namespace, e.g. docker "
                         "--ipc=host; and every rank must connect before any rank is destroyed)",
                         name, strerror(errno));
    struct stat sb;
    const size_t total = total_bytes(bytes);
    epx_status st = EPX_OK;
    if (fstat(fd, &sb) != 0 || (size_t)sb.st_size != total)
        st = epxi_fail(err, EPX_ERR_INVALID_ARG,
                       "host-memory EP: shared memory %s holds %lld bytes, not the %zu this "
                       "config needs: the ranks' configs differ",
                       name, (long long)sb.st_size, total);
    if (st == EPX_OK) st = map_fd(fd, total, name, "a peer's shared memory", &s->map, err);
    close(fd);
    if (st != EPX_OK) return st;
    const header *h = (const header *)s->map;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != kMagic || h->bytes != bytes) {
        munmap(s->map, total);
        s->map = NULL;
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "host-memory EP: %s is not an epx segment of %zu bytes", name, bytes);
    }
    snprintf(s->name, sizeof s->name, "%s", name);
    s->bytes = bytes;
    return EPX_OK;
}

bool epxi_shm_count_in(void *map, const char *name) {
    header *h = (header *)map;
    const int32_t now = __atomic_add_fetch(&h->counted, 1, __ATOMIC_ACQ_REL);
    if (now != h->users) return false;
    return shm_unlink(name) == 0;
}

void epxi_shm_close(epxi_shm *s) {
    if (s == NULL || s->map == NULL) return;
    if (s->owner) shm_unlink(s->name); /* ENOENT once every user counted in */
    munmap(s->map, total_bytes(s->bytes));
    s->map = NULL;
}
