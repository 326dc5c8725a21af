/*
 * main.c - the epx command line: a table of subcommands, each in its own
 * file (cmd_*.c) and using only the public API.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} subcommand;

static const subcommand COMMANDS[] = {
    {"demo", cmd_demo,
     "the main job: plan a synthetic trace with DeepSeek and epx, compare, report"},
    {"layout", cmd_layout, "write a layout (trivial) as an SGLang mapping file"},
    {"inspect", cmd_inspect, "validate a mapping file and summarise it"},
    {"convert", cmd_convert, "convert mapping and counts files between .pt and .json"},
    {"plan", cmd_plan,
     "plan a placement for a load (epx, DeepSeek's EPLB, SGLang's other EPLB algorithms)"},
    {"eval", cmd_eval, "balancedness of a placement on a load, per window, with the bound"},
    {"trace", cmd_trace, "synthesize an expert-load trace for a model shape (trace synth)"},
    {"stats", cmd_stats, "load metrics per window and layer, worst layers first"},
    {"bench", cmd_bench, "time EP dispatch/combine against the TP all-reduce (bench comm)"},
    {"advise", cmd_advise, "EP or TP for a model on G GPUs over a link: where EP starts to win"},
    {"migrate", cmd_migrate, "plan the weight moves between two placements, beside the naive plan"},
    {"dispatch-table", cmd_dispatch_table,
     "static dispatch tables per rank (SGLang-exact, or epx's load-aware)"},
};

static void usage(FILE *f) {
    fprintf(f,
            "epx %s - expert parallelism for MoE inference\n\nusage: epx COMMAND "
            "[options]\n\ncommands:\n",
            epx_version());
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        fprintf(f, "  %-16s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
    fputs("\nRun 'epx COMMAND --help' for a command's options.\n", f);
}

int main(int argc, char **argv) {
    /* A file-size limit (ulimit -f) would otherwise kill the process in the
     * middle of a write, leaving its temp file and no message; ignored, the
     * write fails with EFBIG, and the writer removes its temp and names the
     * file, as on a full disk (CPython does the same at startup). */
    signal(SIGXFSZ, SIG_IGN);
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(argv[1], "help") == 0 && argc > 2) { /* epx help plan = epx plan --help */
        for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
            if (strcmp(argv[2], COMMANDS[i].name) == 0) {
                char help[] = "--help";
                char *args[] = {argv[2], help, NULL};
                return COMMANDS[i].run(2, args);
            }
        fprintf(stderr, "epx: unknown command '%s'; run 'epx --help' for the list\n", argv[2]);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("epx %s\n", epx_version());
        return CLI_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        if (strcmp(argv[1], COMMANDS[i].name) == 0) return COMMANDS[i].run(argc - 1, argv + 1);
    fprintf(stderr, "epx: unknown command '%s'; run 'epx --help' for the list\n", argv[1]);
    return CLI_EXIT_USAGE;
}
