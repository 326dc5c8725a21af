/*
 * cmd_inspect.c - `epx inspect FILE`: validate a placement mapping against a
 * cluster shape and summarise it. Exit 0 when valid, 2 with the reason on
 * stderr when not, so scripts can gate on it before SGLang sees the file.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"

static void print_summary(const epx_layout *lay, int inferred) {
    const epx_shape *s = epx_layout_shape(lay);
    const int32_t spg = epx_shape_slots_per_gpu(s);
    printf("shape: %d layers, %d logical experts%s, %d physical slots (%d redundant)\n",
           s->num_layers, s->num_logical_experts, inferred ? " (inferred as max id + 1)" : "",
           s->num_physical_experts, s->num_physical_experts - s->num_logical_experts);
    printf("cluster: %d GPUs on %d node(s), %d slots per GPU\n", s->num_gpus, s->num_nodes, spg);

    /* Histogram of replica counts over all (layer, expert). */
    const int32_t *nv = epx_layout_num_valid(lay);
    int32_t maxr = epx_layout_max_replicas(lay);
    int64_t *hist = calloc((size_t)maxr + 1, sizeof *hist);
    size_t cells = (size_t)s->num_layers * (size_t)s->num_logical_experts;
    if (hist != NULL) {
        for (size_t i = 0; i < cells; i++) hist[nv[i]]++;
        printf("replicas per expert (over all layers):");
        for (int32_t r = 1; r <= maxr; r++)
            if (hist[r]) printf(" %dx: %lld", r, (long long)hist[r]);
        printf("\n");
        free(hist);
    }

    /* Distinct experts per GPU, min/max over layers: duplicates on one GPU
     * waste a redundant slot, so they are worth seeing. */
    int32_t dup_min = spg, dup_max = 0;
    for (int32_t l = 0; l < s->num_layers; l++)
        for (int32_t g = 0; g < s->num_gpus; g++) {
            const int32_t *slots = epx_layout_gpu_slots(lay, l, g);
            int32_t distinct = 0;
            for (int32_t i = 0; i < spg; i++) {
                int seen = 0;
                for (int32_t j = 0; j < i && !seen; j++) seen = slots[j] == slots[i];
                distinct += !seen;
            }
            if (distinct < dup_min) dup_min = distinct;
            if (distinct > dup_max) dup_max = distinct;
        }
    printf("distinct experts per GPU: %d..%d of %d slots\n", dup_min, dup_max, spg);
    printf("layer 0 experts per GPU:\n");
    for (int32_t g = 0; g < s->num_gpus && g < 16; g++) {
        const int32_t *slots = epx_layout_gpu_slots(lay, 0, g);
        printf("  gpu %d:", g);
        for (int32_t i = 0; i < spg && i < 24; i++) printf(" %d", slots[i]);
        printf(spg > 24 ? " ...\n" : "\n");
    }
    if (s->num_gpus > 16) printf("  ... (%d more GPUs)\n", s->num_gpus - 16);
    printf("valid: yes\n");
}

int cmd_inspect(int argc, char **argv) {
    cli_opt opts[] = {
        {"--gpus", "G", "GPUs (EP ranks) the mapping is for", NULL},
        {"--nodes", "N", "nodes (default 1)", NULL},
        {"--experts", "E", "logical experts (default: max id + 1, reported as inferred)", NULL},
        {NULL, NULL, NULL, NULL},
    };
    cli_cmd cmd = {"inspect",
                   "epx inspect FILE --gpus G [--nodes N] [--experts E]",
                   "Validate a physical_to_logical_map (.json, .pt or inline JSON) and "
                   "summarise it. Exit 0 when valid, 2 when not.",
                   opts,
                   1,
                   {0},
                   0};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc >= 0) return rc;
    if (cmd.num_positional != 1) {
        fprintf(stderr, "epx inspect: give one mapping file; run 'epx inspect --help'\n");
        return CLI_EXIT_USAGE;
    }
    int32_t G = 0, N = 1, E = 0;
    if (!cli_require(&cmd, "--gpus") || !cli_int(&cmd, "--gpus", 1, EPX_MAX_GPUS, &G) ||
        !cli_int(&cmd, "--nodes", 1, EPX_MAX_GPUS, &N) ||
        !cli_int(&cmd, "--experts", 1, EPX_MAX_EXPERTS, &E))
        return CLI_EXIT_USAGE;
    epx_init_opts io = EPX_INIT_OPTS_INIT;
    io.num_gpus = G;
    io.num_nodes = N;
    io.num_logical_experts = E;
    epx_error err = {0};
    int32_t *map = NULL, L = 0, P = 0;
    if (epx_mapping_read(cmd.positional[0], &map, &L, &P, &err) != EPX_OK)
        return cli_report(&cmd, &err);
    epx_free(map);
    epx_layout *lay = NULL;
    if (epx_layout_init(cmd.positional[0], &io, &lay, &err) != EPX_OK) {
        /* The verdict after the command's prefix, where every message starts
         * "epx inspect:" (it once came first: "invalid: epx inspect: ..."). */
        epx_error verdict = err;
        snprintf(verdict.msg, sizeof verdict.msg, "invalid: %.*s",
                 (int)(sizeof verdict.msg - sizeof "invalid: "), err.msg);
        return cli_report(&cmd, &verdict);
    }
    print_summary(lay, E == 0);
    epx_layout_destroy(lay);
    return CLI_EXIT_OK;
}
