/*
 * cmd_stats.c - `epx stats FILE`: load metrics per window and layer (being
 * written; this placeholder keeps the CLI building meanwhile).
 */
#include <stdio.h>

#include "cli.h"

int cmd_stats(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "epx stats: not implemented yet\n");
    return CLI_EXIT_FAIL;
}
