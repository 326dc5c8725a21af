/*
 * fuzz_util.h - what the fuzz targets share: the libFuzzer entry point's
 * prototype, a CHECK that traps (so libFuzzer records the input), and two
 * temporary files per process for round trips through the writers, removed
 * at exit. Header-only: each target is its own program.
 */
#ifndef EPX_FUZZ_UTIL_H
#define EPX_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) __builtin_trap();                                                             \
    } while (0)

static char json_path[64], pt_path[64];

static void remove_temp(void) {
    unlink(json_path);
    unlink(pt_path);
}

/* Name json_path and pt_path once, after the target's tag ("counts"). */
static inline void temp_paths(const char *tag) {
    if (json_path[0]) return;
    atexit(remove_temp);
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(json_path, sizeof json_path, "%s/epx-fuzz-%s-%d.json", dir, tag, (int)getpid());
    snprintf(pt_path, sizeof pt_path, "%s/epx-fuzz-%s-%d.pt", dir, tag, (int)getpid());
}

#endif
