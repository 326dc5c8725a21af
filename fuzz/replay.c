/*
 * replay.c - runs a fuzz target's LLVMFuzzerTestOneInput over every file of
 * a corpus folder, so CI replays what fuzzing found without libFuzzer
 * (zstd's regression driver, SQLite's fuzzcheck). Exit 0 when every input
 * returns; a crash fails the test by itself.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    size_t got = buf ? fread(buf, 1, (size_t)(n > 0 ? n : 0), f) : 0;
    fclose(f);
    if (buf == NULL) return -1;
    LLVMFuzzerTestOneInput(buf, got);
    free(buf);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    DIR *d = opendir(argv[1]);
    if (d == NULL) {
        fprintf(stderr, "replay: cannot open corpus folder %s\n", argv[1]);
        return 1;
    }
    int count = 0;
    struct dirent *ent;
    char path[4096];
    while ((ent = readdir(d)) != NULL) {
        if (ent->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", argv[1], ent->d_name);
        if (replay_file(path) == 0) count++;
    }
    closedir(d);
    printf("replayed %d inputs from %s\n", count, argv[1]);
    return count > 0 ? 0 : 1;
}
