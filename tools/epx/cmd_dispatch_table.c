/*
 * cmd_dispatch_table.c - `epx dispatch-table`: the static dispatch table of
 * every rank (or one), as SGLang computes it for ep_dispatch_algorithm
 * "static" or with epx's own load-aware rule, written as
 * {"logical_to_rank_dispatch_physical_map": [G][L][E]} ([L][E] with --rank).
 *
 * The replica order decides SGLang's table. A mapping file gives the
 * ascending order (what SGLang's init_by_mapping builds); replica-rank order
 * (what init_by_eplb passes on from DeepSeek's planner) needs a file that
 * also carries logical_to_physical_map, such as a golden case or an epx
 * plan report; its replica lists are checked against the mapping.
 *
 * --sglang-version V picks the release whose rule applies (default
 * EPX_SGLANG_DEFAULT_VERSION, the newest verified); --nodes counts from
 * 0.5.3, and from 0.5.4.post2 the ascending lists are cut per rank as
 * init_by_mapping cuts them (epx_sglang_rule in epx/dispatch.h).
 * --rank-lists FILE also writes those per-rank lists,
 * {"logical_to_all_physical_map": [G][L][E][X]} ([L][E][X] with --rank),
 * -1 padded to the widest list of any rank.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static int fail(const char *msg) {
    fprintf(stderr, "epx dispatch-table: %s\n", msg);
    return CLI_EXIT_USAGE;
}

/* Check that every replica-rank list is exactly its expert's slots: each
 * slot holding the expert once, in any order, then -1 padding (SGLang's
 * logical_to_physical_map); a list that repeats, misses or misplaces a
 * slot would be read as another placement. */
static int check_replicas(const int32_t *p2l, int32_t P, const int32_t *rep, int32_t L, int32_t E,
                          int32_t W) {
    int32_t *seen = malloc(sizeof *seen * (size_t)P), *held = calloc((size_t)E, sizeof *held);
    int rc = -1;
    if (seen == NULL || held == NULL) {
        fprintf(stderr, "epx dispatch-table: out of memory checking logical_to_physical_map\n");
        rc = CLI_EXIT_FAIL;
    }
    for (int32_t l = 0; l < L && rc < 0; l++) {
        const int32_t *row = p2l + (size_t)l * (size_t)P;
        memset(held, 0, sizeof *held * (size_t)E);
        for (int32_t p = 0; p < P; p++) {
            seen[p] = -1;
            if (row[p] >= 0 && row[p] < E) held[row[p]]++;
        }
        for (int32_t e = 0; e < E && rc < 0; e++) {
            const int32_t *list = rep + ((size_t)l * (size_t)E + (size_t)e) * (size_t)W;
            int32_t n = 0, pad = -1;
            for (int32_t j = 0; j < W && rc < 0; j++) {
                const int32_t p = list[j];
                const char *why = NULL;
                char what[96] = "";
                if (p < 0) {
                    if (pad < 0) pad = j;
                    continue;
                }
                if (pad >= 0) {
                    snprintf(what, sizeof what, "after the padding at column %d", pad);
                    why = "the -1 padding must come after the expert's slots";
                } else if (p >= P) {
                    snprintf(what, sizeof what, "outside [0, %d) (the slots per layer)", P);
                    why = "a slot must be one of the placement's";
                } else if (row[p] != e) {
                    snprintf(what, sizeof what, "but physical_to_logical_map puts expert %d there",
                             row[p]);
                    why = "the two maps disagree";
                } else if (seen[p] >= 0) {
                    snprintf(what, sizeof what, "twice (columns %d and %d)", seen[p], j);
                    why = "each replica must be listed once";
                }
                if (why != NULL) {
                    fprintf(stderr,
                            "epx dispatch-table: logical_to_physical_map[%d][%d] lists slot %d "
                            "%s: %s\n",
                            l, e, p, what, why);
                    rc = CLI_EXIT_USAGE;
                    continue;
                }
                seen[p] = j; /* p is one of this expert's slots here */
                n++;
            }
            if (rc < 0 && n != held[e]) {
                int32_t miss = 0;
                while (miss < P && !(row[miss] == e && seen[miss] < 0)) miss++;
                fprintf(stderr,
                        "epx dispatch-table: logical_to_physical_map[%d][%d] lists %d of the %d "
                        "slots physical_to_logical_map gives expert %d (slot %d is missing): "
                        "the two maps disagree\n",
                        l, e, n, held[e], e, miss);
                rc = CLI_EXIT_USAGE;
            }
        }
    }
    free(seen);
    free(held);
    return rc;
}

int cmd_dispatch_table(int argc, char **argv) {
    cli_opt opts[] = {
        {"--placement", "FILE",
         "placement: a mapping file (.json/.pt/inline) with physical_to_logical_map; for "
         "--order replica-rank a JSON that also has logical_to_physical_map (a golden case, an "
         "epx plan report)",
         NULL},
        {"--gpus", "G", "GPUs (EP ranks)", NULL},
        {"--nodes", "N",
         "nodes (default 1; SGLang >= 0.5.3 and epx's rule prefer same-node replicas; SGLang "
         "0.5.2's table is the same on any number, and says so)",
         NULL},
        {"--experts", "E",
         "logical experts (default: from logical_to_physical_map, else max id + 1)", NULL},
        {"--rank", "R",
         "write only rank R's [L][E] table (computed alone: one pass of SGLang's cut table, not "
         "G)",
         NULL},
        {"--order", "ORDER",
         "replica order: ascending (default; as init_by_mapping) or replica-rank (as init_by_eplb)",
         NULL},
        {"--algorithm", "ALGO",
         "sglang (default; bit-exact with SGLang) or epx (deterministic, load-aware)", NULL},
        {"--counts", "FILE",
         "epx only: logical_count [L][E] or [S][L][E] (windows summed) as the expected load", NULL},
        {"--seed", "S", "sglang only: random.Random seed (default 42, SGLang's)", NULL},
        {"--sglang-version", "V",
         "sglang only: the SGLang release whose rule applies (default " EPX_SGLANG_DEFAULT_VERSION
         "; verified against 0.5.2, 0.5.3, 0.5.4.post1, 0.5.4.post2, 0.5.5, 0.5.15, 0.5.16, "
         "0.5.17, 0.5.23; rules change at 0.5.3, 0.5.4.post2 and 0.5.16)",
         NULL},
        {"-o", "FILE", "output table (.json)", NULL},
        {"--rank-lists", "FILE",
         "sglang only: also write each rank's replica lists as SGLang keeps them "
         "(logical_to_all_physical_map [G][L][E][X], [L][E][X] with --rank; cut to the nearest "
         "replica from 0.5.4.post2 in ascending order, never in replica-rank order; -1 padded "
         "to the widest list) (.json)",
         NULL},
        {NULL, NULL, NULL, NULL},
    };
    cli_cmd cmd = {"dispatch-table",
                   "epx dispatch-table --placement FILE --gpus G [--nodes N] [--experts E] "
                   "[--rank R] [--order ascending|replica-rank] [--algorithm sglang|epx] "
                   "[--counts FILE] [--seed S] [--sglang-version V] [--rank-lists FILE] -o FILE",
                   "Write the static dispatch table {\"logical_to_rank_dispatch_physical_map\": "
                   "[G][L][E]} ([L][E] with --rank). From a mapping file the replica order is "
                   "ascending, as SGLang's init_by_mapping builds it (and, from SGLang "
                   "0.5.4.post2, cuts per rank to the nearest replica); --order replica-rank "
                   "(init_by_eplb, never cut) needs a JSON that carries logical_to_physical_map. "
                   "The SGLang table is SGLang " EPX_SGLANG_DEFAULT_VERSION
                   "'s unless --sglang-version names another release. --rank-lists FILE also "
                   "writes the replica lists each rank keeps beside its table "
                   "{\"logical_to_all_physical_map\": [G][L][E][X]}, what SGLang's dynamic "
                   "dispatch draws from.",
                   opts,
                   0,
                   {0},
                   0};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc >= 0) return rc;
    const char *placement = cli_require(&cmd, "--placement"), *out = cli_require(&cmd, "-o");
    const char *lists_out = cli_get(&cmd, "--rank-lists");
    if (placement == NULL || out == NULL || !cli_require(&cmd, "--gpus")) return CLI_EXIT_USAGE;
    if (!cli_json_only(&cmd, "-o", out, "a dispatch table") ||
        !cli_json_only(&cmd, "--rank-lists", lists_out, "the replica lists"))
        return CLI_EXIT_USAGE;
    {
        const char *in[] = {placement, cli_get(&cmd, "--counts")};
        const cli_out outs[] = {{out, false}, {lists_out, false}};
        if ((rc = cli_outputs_check(&cmd, in, 2, outs, lists_out ? 2 : 1)) >= 0) return rc;
    }
    int32_t G = 0, N = 1, E = 0, R = -1, seed = 42;
    if (!cli_int(&cmd, "--gpus", 1, EPX_MAX_GPUS, &G) ||
        !cli_int(&cmd, "--nodes", 1, EPX_MAX_GPUS, &N) ||
        !cli_int(&cmd, "--experts", 1, EPX_MAX_EXPERTS, &E) ||
        !cli_int(&cmd, "--rank", 0, EPX_MAX_GPUS - 1, &R) ||
        !cli_int(&cmd, "--seed", 0, INT32_MAX, &seed))
        return CLI_EXIT_USAGE;
    const char *order = cli_get(&cmd, "--order"), *algo = cli_get(&cmd, "--algorithm");
    bool replica_rank = false;
    if (order && strcmp(order, "replica-rank") == 0)
        replica_rank = true;
    else if (order && strcmp(order, "ascending") != 0)
        return fail("--order must be 'ascending' or 'replica-rank'");
    epx_table_opts topts = EPX_TABLE_OPTS_INIT;
    if (algo && strcmp(algo, "epx") == 0)
        topts.algorithm = EPX_TABLE_EPX;
    else if (algo && strcmp(algo, "sglang") != 0)
        return fail("--algorithm must be 'sglang' or 'epx'");
    const char *counts_path = cli_get(&cmd, "--counts");
    if (counts_path && topts.algorithm != EPX_TABLE_EPX)
        return fail("--counts is used by --algorithm epx only (SGLang's table ignores load)");
    if (cli_get(&cmd, "--seed") && topts.algorithm != EPX_TABLE_SGLANG)
        return fail(
            "--seed is used by --algorithm sglang only (epx's table draws no random numbers)");
    topts.seed = (uint64_t)seed;
    /* SGLang's cut table is G passes of the whole table: minutes at 1,024
     * GPUs; shown on a terminal as plan and demo show theirs */
    topts.progress = cli_progress;
    topts.progress_user = &cmd;
    const char *sgver = cli_get(&cmd, "--sglang-version");
    bool newer_than_verified = false; /* sgver's rule is the newest verified's */
    /* the rule of --sglang-version, else of the default release */
    epx_sglang_rule rule = EPX_SGLANG_RULE_0_5_2;
    if (sgver && topts.algorithm != EPX_TABLE_SGLANG)
        return fail("--sglang-version is used by --algorithm sglang only");
    if (lists_out && topts.algorithm != EPX_TABLE_SGLANG)
        return fail("--rank-lists is used by --algorithm sglang only (epx's table cuts no "
                    "list: every rank uses the placement's lists as they are)");
    if (topts.algorithm == EPX_TABLE_SGLANG) {
        int32_t newer = 0;
        epx_error verr = {0};
        if (epx_sglang_table_rule(sgver ? sgver : EPX_SGLANG_DEFAULT_VERSION, &rule, &newer,
                                  &verr) != EPX_OK)
            return fail(verr.msg);
        /* Worded as epx plan words it, naming the release whose rule runs
         * ("that release's rule" read as the newer one's). */
        if (newer)
            fprintf(stderr,
                    "epx dispatch-table: warning: SGLang %s is newer than the newest release epx "
                    "verified (" EPX_SGLANG_DEFAULT_VERSION "); using " EPX_SGLANG_DEFAULT_VERSION
                    "'s dispatch rule\n",
                    sgver);
        newer_than_verified = newer != 0;
        topts.sglang_version = sgver;
        /* SGLang 0.5.2's rule looks at the rank's own GPU only (the node step
         * came in 0.5.3; tests/data/sglang_tables' 0.5.2 tables on 2 nodes
         * equal those on 1): --nodes is valid there but changes nothing. */
        if (sgver && rule == EPX_SGLANG_RULE_0_5_2 && N > 1)
            fprintf(stderr,
                    "epx dispatch-table: note: SGLang %s's rule does not look at nodes (same-node "
                    "replicas are preferred from 0.5.3): --nodes %d gives the table of one "
                    "node\n",
                    sgver, N);
    }
    if (R >= G) {
        fprintf(stderr, "epx dispatch-table: --rank %d is not below --gpus %d\n", R, G);
        return CLI_EXIT_USAGE;
    }

    epx_error err = {0};
    int32_t *p2l = NULL, *rep = NULL, *table = NULL, *lists = NULL, L = 0, P = 0, RL = 0, RE = 0,
            RW = 0, X = 0;
    double *load = NULL, *gpu_load = NULL;
    epx_layout *lay = NULL;
    epx_counts *counts = NULL;
    int ret = CLI_EXIT_OK;
    if (epx_mapping_read(placement, &p2l, &L, &P, &err) != EPX_OK) goto report;
    if (replica_rank) {
        if (epx_replica_map_read(placement, &rep, &RL, &RE, &RW, &err) != EPX_OK) goto report;
        if (RL != L) {
            fprintf(stderr,
                    "epx dispatch-table: logical_to_physical_map has %d layers, "
                    "physical_to_logical_map %d\n",
                    RL, L);
            ret = CLI_EXIT_USAGE;
            goto done;
        }
        if (E == 0) E = RE;
        if (RE != E) {
            fprintf(stderr,
                    "epx dispatch-table: logical_to_physical_map has %d experts, "
                    "--experts says %d\n",
                    RE, E);
            ret = CLI_EXIT_USAGE;
            goto done;
        }
    }
    if (E == 0)
        for (size_t i = 0; i < (size_t)L * (size_t)P; i++) E = p2l[i] + 1 > E ? p2l[i] + 1 : E;
    epx_shape shape = {L, E, P, G, N};
    if (epx_layout_create_from_map(&shape, p2l, &lay, &err) != EPX_OK) goto report;
    if (rep && (ret = check_replicas(p2l, P, rep, L, E, RW)) >= 0) goto done;
    ret = CLI_EXIT_OK;
    if (counts_path) {
        if (epx_counts_read(counts_path, &counts, &err) != EPX_OK) goto report;
        if (counts->num_layers != L || counts->num_experts != E) {
            fprintf(stderr,
                    "epx dispatch-table: --counts is [%d][%d] (layers x experts), the "
                    "placement [%d][%d]: they are for different models; give the counts "
                    "recorded with this placement's model\n",
                    counts->num_layers, counts->num_experts, L, E);
            ret = CLI_EXIT_USAGE;
            goto done;
        }
        load = malloc(sizeof *load * (size_t)L * (size_t)E);
        if (load == NULL) goto nomem;
        if (epx_counts_sum_windows(counts, 0, counts->num_windows, load, &err) != EPX_OK)
            goto report;
        topts.expected_load = load;
    }
    {
        /* The table is [G][L][E] ids whatever --rank writes: memory and the
         * file are checked before it is computed. */
        char what[96];
        snprintf(what, sizeof what, "the table (%d ranks x %d layers x %d experts)", G, L, E);
        const double cells = (double)L * E;
        if (!cli_check_json_size(&cmd, out, (R >= 0 ? 1 : G) * cells, cli_json_width(P - 1),
                                 R >= 0 ? "use a smaller placement" : "write one --rank") ||
            !cli_check_bytes(&cmd, 4.0 * G * cells, what, "use fewer --gpus")) {
            ret = CLI_EXIT_USAGE;
            goto done;
        }
    }
    table = malloc(sizeof *table * (size_t)G * (size_t)L * (size_t)E);
    if (table == NULL) goto nomem;
    /* One rank's table alone is one pass of SGLang's cut table, not G (1,024
     * GPUs: a second, not minutes); the balance under --counts needs every
     * rank's row. */
    if (R >= 0 && load == NULL) {
        topts.rank_only = 1;
        topts.rank = R;
    }
    if (topts.algorithm == EPX_TABLE_SGLANG) {
        const bool cut = rep == NULL && rule >= EPX_SGLANG_RULE_0_5_4_POST2 && !topts.rank_only;
        if (!cli_check_table_work(&cmd, &shape, 1, cut ? G : 1,
                                  "write one rank's row with --rank R (what that SGLang rank "
                                  "computes itself), or use fewer --gpus")) {
            ret = CLI_EXIT_USAGE;
            goto done;
        }
    }
    if (rep) {
        if (epx_dispatch_table_compute(&shape, rep, RW, &topts, table, &err) != EPX_OK) goto report;
    } else if (epx_dispatch_table_from_layout(lay, &topts, table, &err) != EPX_OK) {
        goto report;
    }
    if (lists_out) { /* sized by the query, then filled: [G][L][E][X] */
        if (rep ? epx_dispatch_rank_lists_compute(&shape, rep, RW, &topts, 0, NULL, &X, &err)
                : epx_dispatch_rank_lists_from_layout(lay, &topts, 0, NULL, &X, &err))
            goto report;
        lists = malloc(sizeof *lists * (size_t)G * (size_t)L * (size_t)E * (size_t)X);
        if (lists == NULL) goto nomem;
        if (rep ? epx_dispatch_rank_lists_compute(&shape, rep, RW, &topts, X, lists, NULL, &err)
                : epx_dispatch_rank_lists_from_layout(lay, &topts, X, lists, NULL, &err))
            goto report;
    }
    const int32_t *what = R >= 0 ? table + (size_t)R * (size_t)L * (size_t)E : table;
    if (epx_dispatch_table_write_json(out, what, R >= 0 ? 0 : G, L, E, &err) != EPX_OK) {
        ret = cli_write_failed(&cmd, &err);
        goto done;
    }
    char whose[32];
    if (R >= 0)
        snprintf(whose, sizeof whose, "rank %d", R);
    else
        snprintf(whose, sizeof whose, "%d ranks", G);
    /* The release named is the one whose rule made the table. */
    char label[96] = "epx";
    if (topts.algorithm != EPX_TABLE_EPX && newer_than_verified)
        snprintf(label, sizeof label, "SGLang " EPX_SGLANG_DEFAULT_VERSION " (asked: %.32s)",
                 sgver);
    else if (topts.algorithm != EPX_TABLE_EPX)
        snprintf(label, sizeof label, "SGLang %.32s", sgver ? sgver : EPX_SGLANG_DEFAULT_VERSION);
    printf("wrote %s: %s table (%s order) for %s x %d layers x %d experts\n", out, label,
           replica_rank ? "replica-rank" : "ascending", whose, L, E);
    if (lists_out) {
        const int32_t *mine =
            R >= 0 ? lists + (size_t)R * (size_t)L * (size_t)E * (size_t)X : lists;
        if (epx_dispatch_rank_lists_write_json(lists_out, mine, R >= 0 ? 0 : G, L, E, X, &err) !=
            EPX_OK) {
            ret = cli_write_failed(&cmd, &err);
            goto done;
        }
        printf("wrote %s: SGLang's replica lists of %s %d (%s), at most %d slots each\n", lists_out,
               R >= 0 ? "rank" : "ranks 0 to", R >= 0 ? R : G - 1,
               rep ? "replica-rank order, never cut" : "ascending, cut as init_by_mapping", X);
    }
    if (load) {
        /* the balance the table implies for the given load */
        gpu_load = malloc(sizeof *gpu_load * (size_t)L * (size_t)G);
        if (gpu_load == NULL) goto nomem;
        if (epx_dispatch_table_gpu_load(&shape, table, load, gpu_load, &err) != EPX_OK) goto report;
        double bal = 1.0;
        int32_t used = 0;
        if (epx_gpu_loads_balance(gpu_load, L, G, &bal, &used, &err) != EPX_OK) goto report;
        printf("balancedness of the load under this table: %.4f (mean over %d layers with load)\n",
               bal, used);
    }
    goto done;
nomem:
    fprintf(stderr, "epx dispatch-table: out of memory\n");
    ret = CLI_EXIT_FAIL;
    goto done;
report:
    ret = cli_report(&cmd, &err);
done:
    free(gpu_load);
    free(lists);
    free(table);
    free(load);
    epx_counts_destroy(counts);
    epx_layout_destroy(lay);
    epx_free(rep);
    epx_free(p2l);
    return ret;
}
