/*
 * pt_io.c - reading SGLang's .pt files: how long epx takes to turn a stat
 * dump, an init mapping and a per_pass dump into counts or a map, at the
 * shapes of Kimi-K2 (61 layers, 384 experts, 416 slots on 8 GPUs).
 *
 * Each file is written first (by epx's writer, or for the per_pass dump by
 * the test builder in torch.save's exact layout), read back and checked
 * against what was written, and only then timed: best of 7 reads after a
 * warm-up. The files stay in DIR (default /tmp/epx-bench-pt) so
 * bench/pt_io_torch.py can time torch.load on the very same bytes.
 *
 * usage: bench_pt_io [DIR]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "../tests/util/pt_build.h"
#include "epx.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what, const epx_error *err) {
    fprintf(stderr, "bench_pt_io: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

static long file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

/* Best-of-7 time of reading counts from `path`, checked against `want`. */
static double time_counts(const char *path, const double *want, size_t n) {
    double best = 1e30;
    for (int rep = 0; rep < 8; rep++) {
        epx_counts *c = NULL;
        epx_error err = {0};
        double t0 = now();
        if (epx_counts_read(path, &c, &err) != EPX_OK) die(path, &err);
        double dt = now() - t0;
        size_t got = (size_t)c->num_windows * (size_t)c->num_layers * (size_t)c->num_experts;
        if (got != n || memcmp(c->data, want, n * sizeof *want) != 0)
            die("read-back differs", NULL);
        epx_counts_destroy(c);
        if (rep > 0 && dt < best) best = dt;
    }
    return best;
}

static void row(const char *name, const char *path, double secs) {
    long bytes = file_size(path);
    printf("| %-34s | %9.2f | %8.3f | %7.0f |\n", name, bytes / 1e6, secs * 1e3,
           bytes / 1e6 / secs);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/tmp/epx-bench-pt";
    mkdir(dir, 0755);
    const int32_t L = 61, E = 384, P = 416;
    uint64_t seed = 12345;
    printf("| file (Kimi-K2 shapes) | MB | epx read ms | MB/s |\n| --- | ---: | ---: | ---: |\n");
    char path[512];

    /* stat dumps: int32 [B][61][384] */
    const int32_t Bs[] = {1, 16, 128};
    for (size_t k = 0; k < sizeof Bs / sizeof Bs[0]; k++) {
        epx_counts *c = NULL;
        epx_error err = {0};
        if (epx_counts_create(Bs[k], L, E, &c, &err) != EPX_OK) die("create", &err);
        size_t n = (size_t)Bs[k] * (size_t)L * (size_t)E;
        for (size_t i = 0; i < n; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            c->data[i] = (double)((seed >> 33) % 20000);
        }
        snprintf(path, sizeof path, "%s/stat_dump_B%d.pt", dir, Bs[k]);
        if (epx_counts_write_pt(c, path, EPX_PT_DTYPE_INT32, &err) != EPX_OK) die(path, &err);
        char name[64];
        snprintf(name, sizeof name, "logical_count int32 [%d][61][384]", Bs[k]);
        row(name, path, time_counts(path, c->data, n));
        epx_counts_destroy(c);
    }

    /* an init mapping: int64 [61][416] */
    {
        epx_shape s = {L, E, P, 8, 1};
        epx_layout *lay = NULL;
        epx_error err = {0};
        if (epx_layout_create_trivial(&s, &lay, &err) != EPX_OK) die("layout", &err);
        snprintf(path, sizeof path, "%s/init_mapping.pt", dir);
        if (epx_layout_write_pt(lay, path, &err) != EPX_OK) die(path, &err);
        double best = 1e30;
        for (int rep = 0; rep < 8; rep++) {
            int32_t *map = NULL, ml, mp;
            double t0 = now();
            if (epx_mapping_read(path, &map, &ml, &mp, &err) != EPX_OK) die(path, &err);
            double dt = now() - t0;
            if (ml != L || mp != P ||
                memcmp(map, epx_layout_physical_to_logical(lay), sizeof *map * (size_t)(L * P)) !=
                    0)
                die("mapping read-back differs", NULL);
            epx_free(map);
            if (rep > 0 && dt < best) best = dt;
        }
        row("physical_to_logical_map int64 [61][416]", path, best);
        epx_layout_destroy(lay);
    }

    /* a per_pass dump of one rank: 128 records of int32 [61][416] */
    {
        const int NP = 63; /* the test builder holds 64 storages: 63 records + the map */
        int64_t *gpc = malloc(sizeof *gpc * (size_t)NP * (size_t)(L * P));
        int64_t *map = malloc(sizeof *map * (size_t)(L * P));
        double *want = calloc((size_t)NP * (size_t)(L * E), sizeof *want);
        for (int64_t j = 0; j < (int64_t)L * P; j++) map[j] = (j % P) % E;
        for (int64_t i = 0; i < (int64_t)NP * L * P; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            gpc[i] = (int64_t)((seed >> 33) % 5000);
            int64_t s = i / ((int64_t)L * P), j = i % ((int64_t)L * P);
            want[(s * L + j / P) * E + map[j]] += (double)gpc[i];
        }
        ptb b = {0};
        int64_t shape[2] = {L, P};
        ptb_proto(&b);
        ptb_op(&b, '}');
        ptb_op(&b, '(');
        ptb_str(&b, "records");
        ptb_op(&b, ']');
        ptb_op(&b, '(');
        const uint8_t *stor[64];
        size_t slen[64];
        for (int i = 0; i < NP; i++) {
            char key[16];
            snprintf(key, sizeof key, "%d", i);
            ptb_op(&b, '}');
            ptb_op(&b, '(');
            ptb_str(&b, "forward_pass_id");
            ptb_int(&b, i);
            ptb_str(&b, "rank");
            ptb_int(&b, 0);
            ptb_str(&b, "gatherer_key");
            ptb_str(&b, "primary");
            ptb_str(&b, "global_physical_count");
            ptb_dense(&b, "IntStorage", key, shape, 2);
            ptb_op(&b, 'u');
            stor[i] = ptb_storage_i32(gpc + (size_t)i * (size_t)(L * P), (size_t)(L * P));
            slen[i] = (size_t)(L * P) * 4;
        }
        ptb_op(&b, 'e');
        char key[16];
        snprintf(key, sizeof key, "%d", NP);
        ptb_str(&b, "last_physical_to_logical_map");
        ptb_dense(&b, "LongStorage", key, shape, 2);
        ptb_op(&b, 'u');
        ptb_op(&b, '.');
        stor[NP] = ptb_storage_i64(map, (size_t)(L * P));
        slen[NP] = (size_t)(L * P) * 8;
        size_t len = 0;
        uint8_t *zip = ptb_archive(&b, stor, slen, (size_t)NP + 1, &len);
        if (zip == NULL) die("building the per_pass dump", NULL);
        snprintf(path, sizeof path, "%s/per_pass_rank0.pt", dir);
        FILE *f = fopen(path, "wb");
        if (f == NULL || fwrite(zip, 1, len, f) != len) die(path, NULL);
        fclose(f);
        row("per_pass 63 x int32 [61][416] -> [63][61][384]", path,
            time_counts(path, want, (size_t)NP * (size_t)(L * E)));
        for (int i = 0; i <= NP; i++) free((void *)(uintptr_t)stor[i]);
        free(zip);
        free(b.p);
        free(gpc);
        free(map);
        free(want);
    }
    printf("\nfiles kept in %s (for bench/pt_io_torch.py)\n", dir);
    return 0;
}
