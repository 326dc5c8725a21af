/*
 * cmd_layout.c - `epx layout trivial`: write SGLang's trivial layout (slot p
 * holds logical expert p % E) as a mapping file SGLang loads as it is.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int cmd_layout(int argc, char **argv) {
    cli_opt opts[] = {
        {"--layers", "L", "decoder layers (dense ones included)", NULL},
        {"--experts", "E", "logical (routed) experts per layer", NULL},
        {"--gpus", "G", "GPUs (EP ranks)", NULL},
        {"--redundant", "R", "redundant slots: P = E + R (default 0)", NULL},
        {"-o", "FILE", "output mapping file: JSON, or a PyTorch .pt by its extension", NULL},
        {NULL, NULL, NULL, NULL},
    };
    /* Named with its one kind from the start, so the parser's messages say
     * "epx layout trivial:" as every later one does. */
    cli_cmd cmd = {"layout trivial",
                   "epx layout trivial --layers L --experts E --gpus G "
                   "[--redundant R] -o FILE",
                   "Write the trivial layout (slot p holds logical expert p % E) as "
                   "{\"physical_to_logical_map\": [L][P]}.",
                   opts,
                   1,
                   {0},
                   0};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc >= 0) return rc;
    if (cmd.num_positional != 1 || strcmp(cmd.positional[0], "trivial") != 0) {
        fprintf(stderr, "epx layout: the only layout kind is 'trivial' (epx layout trivial ...); "
                        "plan others with 'epx plan'\n");
        return CLI_EXIT_USAGE;
    }
    int32_t L = 0, E = 0, G = 0, R = 0;
    const char *out = cli_require(&cmd, "-o");
    if (!cli_require(&cmd, "--layers") || !cli_require(&cmd, "--experts") ||
        !cli_require(&cmd, "--gpus") || out == NULL)
        return CLI_EXIT_USAGE;
    if (!cli_int(&cmd, "--layers", 1, EPX_MAX_LAYERS, &L) ||
        !cli_int(&cmd, "--experts", 1, EPX_MAX_EXPERTS, &E) ||
        !cli_int(&cmd, "--gpus", 1, EPX_MAX_GPUS, &G) ||
        !cli_int(&cmd, "--redundant", 0, EPX_MAX_EXPERTS, &R))
        return CLI_EXIT_USAGE;
    const cli_out outs[] = {{out, false}};
    if ((rc = cli_outputs_check(&cmd, NULL, 0, outs, 1)) >= 0) return rc;
    epx_shape shape = {L, E, E + R, G, 1}; /* SGLang's init_trivial looks at no node */
    char what[48];
    snprintf(what, sizeof what, "--redundant %d", R);
    const char *fix = "use fewer --layers, --experts or --redundant";
    if (!cli_check_slots(&cmd, what, E, E + R, G) ||
        !cli_check_json_size(&cmd, out, (double)L * (E + R), cli_json_width(E - 1),
                             "use fewer --layers or --experts, or write a .pt file") ||
        !cli_check_memory(&cmd, &shape, 1, fix))
        return CLI_EXIT_USAGE;
    epx_error err = {0};
    epx_layout *lay = NULL;
    if (epx_layout_create_trivial(&shape, &lay, &err) != EPX_OK) return cli_report(&cmd, &err);
    epx_status st = cli_is_pt(out) ? epx_layout_write_pt(lay, out, &err)
                                   : epx_layout_write_json(lay, out, &err);
    epx_layout_destroy(lay);
    if (st != EPX_OK) return cli_write_failed(&cmd, &err);
    printf("wrote %s: %d layers x %d slots (%d experts + %d redundant), %d slots per GPU\n", out, L,
           E + R, E, R, (E + R) / G);
    return CLI_EXIT_OK;
}
