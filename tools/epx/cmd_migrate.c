/*
 * cmd_migrate.c - `epx migrate plan`: what moving from one placement to
 * another costs, epx's plan beside the naive one (every slot whose expert
 * changed moved whole), and the helpers `epx plan` uses for --current and
 * --failed-gpus (cli.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* One list option into the failed mask: --failed-gpus names the lost GPUs,
 * --active-ranks the ones still serving (its complement). A rank named
 * twice, or a list that leaves no GPU, is refused naming the value. */
static bool read_mask(const cli_cmd *cmd, const char *opt, int32_t G, bool active, uint8_t **mask) {
    const char *s = cli_get(cmd, opt);
    const char *noun = active ? "rank" : "GPU";
    int32_t *ids = NULL, n = 0;
    /* an index with a sign is no index: "+1" may mean "one more GPU" */
    for (const char *item = s; item != NULL;) {
        if (*item == '+') {
            fprintf(stderr,
                    "epx %s: %s '%.64s' has a signed item '%.*s': %ss are numbered 0 to %d; "
                    "list them as plain numbers (e.g. %s)\n",
                    cmd->name, opt, s, (int)strcspn(item, ","), item, noun, G - 1,
                    active ? "0,1,2,4" : "3 or 1,5");
            return false;
        }
        const char *comma = strchr(item, ',');
        item = comma ? comma + 1 : NULL;
    }
    if (!cli_int_list(cmd, opt, 0, (int64_t)G - 1, active ? "0,1,2,4" : "3 or 1,5", &ids, &n))
        return false;
    *mask = malloc((size_t)G);
    if (*mask == NULL) {
        free(ids);
        fprintf(stderr, "epx %s: out of memory\n", cmd->name);
        return false;
    }
    memset(*mask, active ? 1 : 0, (size_t)G);
    for (int32_t i = 0; i < n; i++) {
        if ((*mask)[ids[i]] == (active ? 0 : 1)) {
            fprintf(stderr,
                    "epx %s: %s '%.64s' names %s %d twice (item %d repeats it): list each %s "
                    "once\n",
                    cmd->name, opt, s, noun, ids[i], i + 1, noun);
            free(ids);
            free(*mask);
            *mask = NULL;
            return false;
        }
        (*mask)[ids[i]] = active ? 0 : 1;
    }
    free(ids);
    if (!active && n == G) {
        fprintf(stderr,
                "epx %s: --failed-gpus '%.64s' marks all %d GPUs failed: at least one must "
                "survive to hold the experts; list only the GPUs that were lost\n",
                cmd->name, s, G);
        free(*mask);
        *mask = NULL;
        return false;
    }
    return true;
}

bool cli_failed_gpus(const cli_cmd *cmd, int32_t G, uint8_t **mask) {
    *mask = NULL;
    const char *failed = cli_get(cmd, "--failed-gpus"), *active = cli_get(cmd, "--active-ranks");
    if (failed != NULL && active != NULL) {
        fprintf(stderr,
                "epx %s: give --active-ranks or --failed-gpus, not both (one is the "
                "other's complement)\n",
                cmd->name);
        return false;
    }
    if (failed == NULL && active == NULL) return true;
    return read_mask(cmd, failed ? "--failed-gpus" : "--active-ranks", G, active != NULL, mask);
}

bool cli_check_survivors(const cli_cmd *cmd, const uint8_t *failed, int32_t G, int32_t E,
                         int32_t P) {
    if (failed == NULL || P % G != 0) return true; /* no list; or the shape check speaks */
    const bool active = cli_get(cmd, "--active-ranks") != NULL;
    const char *opt = active ? "--active-ranks" : "--failed-gpus";
    int32_t A = 0;
    for (int32_t g = 0; g < G; g++) A += !failed[g];
    const int32_t spg = P / G, need = (E + spg - 1) / spg;
    if ((int64_t)A * spg >= E) return true;
    const int32_t per = (E + A - 1) / A;
    fprintf(stderr,
            "epx %s: %s '%.64s' leaves %d %s with %d slots each, %d slots for %d experts: every "
            "expert needs a slot on a live GPU; give at least %d %s, or more slots per GPU "
            "(P >= %lld: %d per GPU)\n",
            cmd->name, opt, cli_get(cmd, opt), A, active ? "rank(s)" : "surviving GPU(s)", spg,
            A * spg, E, need, active ? "active ranks" : "surviving GPUs", (long long)per * G, per);
    return false;
}

/* The experts a map implies, max id + 1 (epx_mapping_read keeps every id
 * below EPX_MAX_EXPERTS, so the sum cannot overflow). */
static int32_t infer_experts(const int32_t *map, int32_t L, int32_t P) {
    int32_t top = 0;
    for (size_t i = 0; i < (size_t)L * (size_t)P; i++) top = map[i] > top ? map[i] : top;
    return top + 1;
}

/* A mapping file as a layout; E = 0 infers it as max id + 1. */
static epx_status read_layout(const char *spec, int32_t G, int32_t N, int32_t E, epx_layout **out,
                              epx_error *err) {
    int32_t *map = NULL, L = 0, P = 0;
    epx_status st = epx_mapping_read(spec, &map, &L, &P, err);
    if (st != EPX_OK) return st;
    if (E == 0) E = infer_experts(map, L, P);
    epx_shape s = {L, E, P, G, N};
    st = epx_layout_create_from_map(&s, map, out, err);
    epx_free(map);
    if (st != EPX_OK && err != NULL) {
        char msg[EPX_ERRMSG_MAX + 256];
        snprintf(msg, sizeof msg, "%.200s: %s", spec, err->msg);
        memcpy(err->msg, msg, sizeof err->msg - 1);
        err->msg[sizeof err->msg - 1] = '\0';
    }
    return st;
}

int cli_read_current(const char *cmd, const char *spec, const epx_shape *shape, epx_layout **out) {
    epx_error err = {0};
    /* E is the counts' here (plan has no --experts): an id past it means
     * the map is another model's, which the layout's message cannot say. */
    {
        int32_t *map = NULL, L = 0, P = 0;
        if (epx_mapping_read(spec, &map, &L, &P, &err) != EPX_OK) {
            fprintf(stderr, "epx %s: --current %s\n", cmd, err.msg);
            return CLI_EXIT_USAGE;
        }
        char what[256];
        snprintf(what, sizeof what, "--current %.200s", spec);
        const cli_cmd c = {.name = cmd};
        const bool ok = cli_map_of_counts(&c, what, map, L, P, shape->num_logical_experts);
        epx_free(map);
        if (!ok) return CLI_EXIT_USAGE;
    }
    if (read_layout(spec, shape->num_gpus, shape->num_nodes, shape->num_logical_experts, out,
                    &err) != EPX_OK) {
        fprintf(stderr, "epx %s: --current %s\n", cmd, err.msg);
        return CLI_EXIT_USAGE;
    }
    const epx_shape *c = epx_layout_shape(*out);
    if (c->num_layers != shape->num_layers ||
        c->num_physical_experts != shape->num_physical_experts) {
        fprintf(stderr,
                "epx %s: --current %s has %d layers x %d slots, the plan %d x %d: give the "
                "placement in service for this model and --physical/--redundant\n",
                cmd, spec, c->num_layers, c->num_physical_experts, shape->num_layers,
                shape->num_physical_experts);
        epx_layout_destroy(*out);
        *out = NULL;
        return CLI_EXIT_USAGE;
    }
    return -1;
}

static double gb(uint64_t b) { return (double)b / 1e9; }

/* The share of the load (the windows summed; the repair's even load is
 * counts of ones) on experts that no live GPU holds in `layout`: served by
 * no one, so the balancedness of that layout on its live GPUs leaves it
 * out. -1 when out of memory. */
static double lost_load_share(const epx_counts *counts, const epx_layout *layout,
                              const uint8_t *failed) {
    const epx_shape *sh = epx_layout_shape(layout);
    const int32_t L = sh->num_layers, P = sh->num_physical_experts, E = sh->num_logical_experts;
    const int32_t spg = P / sh->num_gpus;
    const int32_t *map = epx_layout_physical_to_logical(layout);
    uint8_t *held = malloc((size_t)E);
    if (held == NULL) return -1.0;
    double lost = 0.0, total = 0.0;
    for (int32_t l = 0; l < L; l++) {
        memset(held, 0, (size_t)E);
        for (int32_t p = 0; p < P; p++)
            if (!failed[p / spg]) held[map[(size_t)l * (size_t)P + (size_t)p]] = 1;
        for (int32_t e = 0; e < E; e++) {
            double w = 0.0;
            for (int32_t s = 0; s < counts->num_windows; s++) w += epx_counts_row(counts, s, l)[e];
            total += w;
            if (!held[e]) lost += w;
        }
    }
    free(held);
    return total > 0.0 ? lost / total : 0.0;
}

/* " (x % of the load ...)" after an in-service balancedness, or "". */
static const char *lost_note(const epx_counts *counts, const epx_layout *layout,
                             const uint8_t *failed, char *buf, size_t n) {
    const double share = failed ? lost_load_share(counts, layout, failed) : 0.0;
    if (share <= 0.0) return "";
    snprintf(buf, n, " (%.1f %% of the load is on experts only the lost GPUs held: not served)",
             100.0 * share);
    return buf;
}

int cli_print_moves(const char *cmd, const epx_counts *counts, const epx_layout *current,
                    const epx_layout *planned, const uint8_t *failed, size_t expert_bytes) {
    epx_migrate_opts o = EPX_MIGRATE_OPTS_INIT;
    o.expert_bytes = expert_bytes ? expert_bytes : 1;
    o.failed_gpus = failed;
    epx_migration *m = NULL;
    epx_layout *same = NULL;
    epx_error err = {0};
    /* No budget: the planned layout itself, and balancedness on live GPUs. */
    epx_move_budget nb = EPX_MOVE_BUDGET_INIT;
    nb.failed_gpus = failed;
    epx_move_report rep;
    if (epx_layout_limit_moves(counts, current, planned, &nb, &same, &rep, &err) != EPX_OK ||
        epx_migration_plan(current, planned, &o, &m, &err) != EPX_OK) {
        epx_layout_destroy(same);
        cli_cmd c = {.name = cmd};
        return cli_report(&c, &err); /* bad input 2, runtime failure 1 */
    }
    epx_layout_destroy(same);
    epx_migration_stats st;
    epx_migration_get_stats(m, &st);
    printf("moves from --current: %" PRId64 " of %" PRId64 " live slots change (%" PRId64
           " received, %" PRId64 " relayed, %" PRId64 " copied on their GPU, %" PRId64
           " loaded: no live GPU holds them)\n",
           st.changed, st.slots, st.received, st.relayed, st.local_copies, st.loaded);
    char note[160];
    printf("balancedness (live GPUs, even split) in service %.4f%s -> planned %.4f\n",
           rep.balance_current, lost_note(counts, current, failed, note, sizeof note),
           rep.balance_made);
    if (rep.moves_required > 0)
        printf("the lost GPUs force %" PRId64 " of these moves (one per layer and expert only "
               "they held); --max-moves %" PRId64 " moves those alone, 'epx migrate plan "
               "--failed-gpus' without --to plans that repair\n",
               rep.moves_required, rep.moves_required);
    if (expert_bytes > 0) {
        printf("moving it: %.3f GB over links, %.3f GB of them between nodes, %.3f GB loaded\n",
               gb(st.bytes_moved), gb(st.bytes_inter_node), gb(st.bytes_loaded));
        if (st.bytes_moved > 0)
            printf("balance gained per GB moved: %.6f\n",
                   (rep.balance_made - rep.balance_current) / gb(st.bytes_moved));
    }
    epx_migration_destroy(m);
    return -1;
}

static void json_u64(FILE *f, const char *key, uint64_t v, bool comma) {
    fprintf(f, "  \"%s\": %" PRIu64 "%s\n", key, v, comma ? "," : "");
}

static void print_json(const epx_migration *m, const epx_migration_stats *st, int32_t G,
                       int64_t forced) {
    uint64_t *sent = calloc((size_t)G, sizeof *sent), *recv = calloc((size_t)G, sizeof *recv);
    if (sent != NULL && recv != NULL) epx_migration_rank_bytes(m, sent, recv);
    printf("{\n");
    json_u64(stdout, "expert_bytes", st->expert_bytes, true);
    json_u64(stdout, "slots", (uint64_t)st->slots, true);
    json_u64(stdout, "kept", (uint64_t)st->kept, true);
    json_u64(stdout, "changed", (uint64_t)st->changed, true);
    json_u64(stdout, "local_copies", (uint64_t)st->local_copies, true);
    json_u64(stdout, "received", (uint64_t)st->received, true);
    json_u64(stdout, "relayed", (uint64_t)st->relayed, true);
    json_u64(stdout, "loaded", (uint64_t)st->loaded, true);
    json_u64(stdout, "bytes_moved", st->bytes_moved, true);
    json_u64(stdout, "bytes_intra_node", st->bytes_intra_node, true);
    json_u64(stdout, "bytes_inter_node", st->bytes_inter_node, true);
    json_u64(stdout, "bytes_local", st->bytes_local, true);
    json_u64(stdout, "bytes_loaded", st->bytes_loaded, true);
    json_u64(stdout, "max_rank_send", st->max_rank_send, true);
    json_u64(stdout, "max_rank_recv", st->max_rank_recv, true);
    json_u64(stdout, "naive_changed", (uint64_t)st->naive_changed, true);
    json_u64(stdout, "naive_bytes_moved", st->naive_bytes_moved, true);
    json_u64(stdout, "naive_bytes_inter_node", st->naive_bytes_inter_node, true);
    json_u64(stdout, "naive_loaded", (uint64_t)epx_migration_naive_loaded(m), true);
    if (forced >= 0) json_u64(stdout, "repair_forced_moves", (uint64_t)forced, true);
    printf("  \"per_gpu\": [");
    for (int32_t g = 0; sent != NULL && recv != NULL && g < G; g++)
        printf("%s{\"sent\": %" PRIu64 ", \"received\": %" PRIu64 "}", g ? ", " : "", sent[g],
               recv[g]);
    printf("]\n}\n");
    free(sent);
    free(recv);
}

static void row(const char *what, int64_t epx, int64_t naive) {
    printf("  %-26s %14" PRId64 " %14" PRId64 "\n", what, epx, naive);
}

static void row_bytes(const char *what, uint64_t epx, uint64_t naive) {
    printf("  %-26s %14.3f %14.3f\n", what, gb(epx), gb(naive));
}

static void print_text(const epx_migration *m, const epx_migration_stats *st) {
    const epx_shape *s = epx_layout_shape(epx_migration_layout(m));
    /* the naive plan's slots whose expert no live GPU holds are loaded,
     * as epx's are: neither plan sends them over a link */
    const int64_t naive_loaded = epx_migration_naive_loaded(m);
    const uint64_t naive_links =
        st->naive_bytes_moved - (uint64_t)naive_loaded * (uint64_t)st->expert_bytes;
    printf("migration of %d layers x %d slots on %d GPUs (%d node(s)), %zu bytes per expert\n",
           s->num_layers, s->num_physical_experts, s->num_gpus, s->num_nodes, st->expert_bytes);
    printf("  %-26s %14s %14s\n", "", "epx", "naive");
    row("slots kept", st->kept, st->slots - st->naive_changed);
    row("slots changed", st->changed, st->naive_changed);
    row("  copied on the GPU", st->local_copies, 0);
    row("  received", st->received, st->naive_changed - naive_loaded);
    row("  relayed in the node", st->relayed, 0);
    row("  loaded (no live holder)", st->loaded, naive_loaded);
    row_bytes("GB over links", st->bytes_moved, naive_links);
    row_bytes("  of which inter-node", st->bytes_inter_node, st->naive_bytes_inter_node);
    row_bytes("GB copied on the GPU", st->bytes_local, 0);
    printf("  most GB into one GPU %20.3f\n", gb(st->max_rank_recv));
    if (naive_links > 0)
        printf("epx moves %.1f%% of the naive plan's bytes over links\n",
               100.0 * (double)st->bytes_moved / (double)naive_links);
}

/* "deepseek-v3 (61 layers, 256 experts)" with every built-in model of that
 * size ("kimi-k2 or kimi-k2.5 (...)"), else the sizes alone. */
static void describe_model(int32_t L, int32_t E, char *buf, size_t cap) {
    int32_t n = 0;
    const epx_model *m = epx_model_list(&n);
    size_t k = 0;
    buf[0] = '\0';
    for (int32_t i = 0; i < n && k < cap; i++)
        if (m[i].num_layers == L && m[i].num_experts == E)
            k += (size_t)snprintf(buf + k, cap - k, "%s%s", k ? " or " : "", m[i].name);
    if (k > 0 && k < cap)
        snprintf(buf + k, cap - k, " (%d layers, %d experts)", L, E);
    else
        snprintf(buf, cap, "a model of %d layers and %d experts", L, E);
}

/*
 * The repair after a failure, with the fewest bytes: from the layout in
 * service, each (layer, expert) that only lost GPUs held takes one slot of
 * a spare replica on a survivor (one load each; nothing else moves). Which
 * spares give way is the planner's choice under a move budget of exactly
 * those forced moves: epx plans the survivors for `counts` with `current`,
 * epx_layout_limit_moves counts the forced moves, and a second call keeps
 * only as many, the ones that buy the most balance on `counts`.
 */
static epx_status repair_target(const epx_layout *cur, const epx_counts *counts,
                                const uint8_t *failed, epx_layout **out, epx_move_report *made,
                                epx_error *err) {
    epx_plan_opts po = EPX_PLAN_OPTS_INIT;
    po.current = cur;
    po.failed_gpus = failed;
    epx_plan *plan = NULL;
    epx_status st = epx_plan_compute(counts, epx_layout_shape(cur), &po, &plan, err);
    if (st != EPX_OK) return st;
    epx_move_budget b = EPX_MOVE_BUDGET_INIT;
    b.failed_gpus = failed;
    epx_move_report rep;
    epx_layout *all = NULL;
    st = epx_layout_limit_moves(counts, cur, epx_plan_layout(plan), &b, &all, &rep, err);
    epx_layout_destroy(all);
    if (st == EPX_OK) {
        b.max_moves = rep.moves_required > INT32_MAX ? INT32_MAX : (int32_t)rep.moves_required;
        st = epx_layout_limit_moves(counts, cur, epx_plan_layout(plan), &b, out, made, err);
    }
    epx_plan_destroy(plan);
    return st;
}

/* --counts for the repair, or an even load (one window of ones). */
static epx_status repair_counts(const char *path, const epx_shape *s, epx_counts **out,
                                epx_error *err) {
    if (path != NULL) {
        epx_status st = epx_counts_read(path, out, err);
        if (st == EPX_OK && ((*out)->num_layers != s->num_layers ||
                             (*out)->num_experts != s->num_logical_experts)) {
            snprintf(err->msg, sizeof err->msg,
                     "--counts %.200s holds %d layers x %d experts, the placement %d x %d: give "
                     "the load of the model in service",
                     path, (*out)->num_layers, (*out)->num_experts, s->num_layers,
                     s->num_logical_experts);
            epx_counts_destroy(*out);
            *out = NULL;
            return err->status = EPX_ERR_SHAPE;
        }
        return st;
    }
    epx_status st = epx_counts_create(1, s->num_layers, s->num_logical_experts, out, err);
    if (st != EPX_OK) return st;
    for (size_t i = 0; i < (size_t)s->num_layers * (size_t)s->num_logical_experts; i++)
        (*out)->data[i] = 1.0;
    return EPX_OK;
}

int cmd_migrate(int argc, char **argv) {
    cli_opt opts[] = {
        {"--from", "FILE", "the placement in service (SGLang mapping .json/.pt)", NULL},
        {"--to", "FILE",
         "the placement wanted; without it (and with --failed-gpus) the repair: each expert "
         "only lost GPUs held takes one spare slot on a survivor, nothing else moves",
         NULL},
        {"--gpus", "G", "GPUs (EP ranks)", NULL},
        {"--nodes", "N", "nodes (default 1)", NULL},
        {"--experts", "E", "logical experts (default: max id + 1 over both files)", NULL},
        {"--expert-bytes", "B", "bytes of one expert's weights in one layer", NULL},
        {"--failed-gpus", "LIST", "GPUs lost (e.g. 3 or 1,5): they send and receive nothing", NULL},
        {"--counts", "FILE",
         "repair only: the load that decides which spare replicas give way (default: even)", NULL},
        {"--no-relabel", NULL, "keep the target's slot order (what SGLang and vLLM do)", NULL},
        {"--no-relay", NULL, "every GPU pulls its experts itself, no relays inside a node", NULL},
        {"-o", "FILE", "write the relabelled target: the mapping to put in service", NULL},
        {"--json", NULL, "print one JSON object instead of the table", NULL},
        {NULL, NULL, NULL, NULL},
    };
    /* Named with its one action from the start, so the parser's messages say
     * "epx migrate plan:" as every later one does. */
    cli_cmd cmd = {"migrate plan",
                   "epx migrate plan --from A.json (--to B.json | --failed-gpus LIST [--counts "
                   "FILE]) --gpus G [--nodes N] --expert-bytes B [--failed-gpus LIST] "
                   "[-o FILE] [--json]",
                   "Plan the weight moves from one placement to another: slots kept, local "
                   "copies, bytes over each link, beside the naive plan that moves every slot "
                   "whose expert changed. Without --to, after a failure: the repair with the "
                   "fewest bytes.",
                   opts,
                   1,
                   {0},
                   0};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc >= 0) return rc;
    if (cmd.num_positional != 1 || strcmp(cmd.positional[0], "plan") != 0) {
        fprintf(stderr,
                "epx migrate: the only action is 'plan' (epx migrate plan --from A --to B ...)\n");
        return CLI_EXIT_USAGE;
    }
    const char *from = cli_require(&cmd, "--from");
    if (from == NULL) return CLI_EXIT_USAGE;
    const char *to = cli_get(&cmd, "--to"), *counts_path = cli_get(&cmd, "--counts");
    const bool repair = to == NULL;
    if (repair && cli_get(&cmd, "--failed-gpus") == NULL) {
        fprintf(stderr, "epx migrate plan: --to is required (or give --failed-gpus LIST "
                        "alone to plan the repair after a failure)\n");
        return CLI_EXIT_USAGE;
    }
    if (!repair && counts_path != NULL) {
        fprintf(stderr, "epx migrate plan: --counts chooses the repair's spare replicas: "
                        "leave out --to for the repair, or --counts for a given target\n");
        return CLI_EXIT_USAGE;
    }
    if (!cli_require(&cmd, "--gpus") || !cli_require(&cmd, "--expert-bytes")) return CLI_EXIT_USAGE;
    const char *out = cli_get(&cmd, "-o");
    {
        const char *in[] = {from, repair ? counts_path : to};
        const cli_out outs[] = {{out, false}};
        if ((rc = cli_outputs_check(&cmd, in, in[1] ? 2 : 1, outs, 1)) >= 0) return rc;
    }
    int32_t G = 0, N = 1, E = 0;
    uint64_t bytes = 0;
    if (!cli_int(&cmd, "--gpus", 1, EPX_MAX_GPUS, &G) ||
        !cli_int(&cmd, "--nodes", 1, EPX_MAX_GPUS, &N) ||
        !cli_int(&cmd, "--experts", 1, EPX_MAX_EXPERTS, &E) ||
        !cli_u64(&cmd, "--expert-bytes", 1, CLI_MAX_EXPERT_BYTES, &bytes))
        return CLI_EXIT_USAGE;
    epx_error err = {0};
    epx_layout *a = NULL, *b = NULL;
    epx_migration *m = NULL;
    epx_counts *counts = NULL;
    uint8_t *failed = NULL;
    epx_move_report made = {0, 0, -1, 0.0, 0.0, 0.0};
    rc = CLI_EXIT_OK;
    if (!cli_failed_gpus(&cmd, G, &failed)) return CLI_EXIT_USAGE;
    if (repair) {
        if (read_layout(from, G, N, E, &a, &err) != EPX_OK) {
            rc = cli_report(&cmd, &err);
            goto done;
        }
        const epx_shape *sa = epx_layout_shape(a);
        if (!cli_check_survivors(&cmd, failed, G, sa->num_logical_experts,
                                 sa->num_physical_experts)) {
            rc = CLI_EXIT_USAGE;
            goto done;
        }
        if (repair_counts(counts_path, sa, &counts, &err) != EPX_OK ||
            repair_target(a, counts, failed, &b, &made, &err) != EPX_OK) {
            rc = cli_report(&cmd, &err);
            goto done;
        }
    }
    if (E == 0 && !repair) {
        /* infer E over both files, so a map missing the last expert still
         * reads as what it is */
        int32_t *map = NULL, L = 0, P = 0, fl[2] = {0, 0}, fe[2] = {0, 0}, fp[2] = {0, 0};
        for (int f = 0; f < 2; f++) {
            if (epx_mapping_read(f ? to : from, &map, &L, &P, &err) != EPX_OK) {
                rc = cli_report(&cmd, &err);
                goto done;
            }
            fl[f] = L;
            fp[f] = P;
            fe[f] = infer_experts(map, L, P);
            epx_free(map);
            if (fe[f] > E) E = fe[f];
        }
        /* Two models: say so, naming both, rather than blame P < E. */
        if (fl[0] != fl[1] || fe[0] > fp[1] || fe[1] > fp[0]) {
            char da[128], db[128];
            describe_model(fl[0], fe[0], da, sizeof da);
            describe_model(fl[1], fe[1], db, sizeof db);
            fprintf(stderr,
                    "epx migrate plan: --from '%s' is %s, --to '%s' is %s: a migration moves "
                    "experts within one model; give two placements of the same model\n",
                    from, da, to, db);
            rc = CLI_EXIT_USAGE;
            goto done;
        }
    }
    if (!repair && (read_layout(from, G, N, E, &a, &err) != EPX_OK ||
                    read_layout(to, G, N, E, &b, &err) != EPX_OK)) {
        rc = cli_report(&cmd, &err);
        goto done;
    }
    epx_migrate_opts o = EPX_MIGRATE_OPTS_INIT;
    o.expert_bytes = (size_t)bytes;
    o.relabel = !cli_flag(&cmd, "--no-relabel");
    o.relay = !cli_flag(&cmd, "--no-relay");
    o.failed_gpus = failed;
    if (epx_migration_plan(a, b, &o, &m, &err) != EPX_OK) {
        rc = cli_report(&cmd, &err);
        goto done;
    }
    if (out != NULL &&
        (cli_is_pt(out) ? epx_layout_write_pt(epx_migration_layout(m), out, &err)
                        : epx_layout_write_json(epx_migration_layout(m), out, &err)) != EPX_OK) {
        rc = cli_write_failed(&cmd, &err);
        goto done;
    }
    epx_migration_stats st;
    epx_migration_get_stats(m, &st);
    if (cli_flag(&cmd, "--json")) {
        print_json(m, &st, G, made.moves_required);
    } else {
        char note[160];
        if (repair)
            printf("repair after losing GPU(s) %s: %" PRId64 " (layer, expert) pairs were held "
                   "only there and take one spare slot each on a survivor; nothing else "
                   "moves; balancedness on the live GPUs (%s load): in service %.4f%s, repaired "
                   "%.4f\n",
                   cli_get(&cmd, "--failed-gpus"), made.moves_required,
                   counts_path ? "--counts" : "even", made.balance_current,
                   lost_note(counts, a, failed, note, sizeof note), made.balance_made);
        print_text(m, &st);
    }
    if (out != NULL && !cli_flag(&cmd, "--json")) printf("wrote %s\n", out);
done:
    epx_migration_destroy(m);
    epx_layout_destroy(a);
    epx_layout_destroy(b);
    epx_counts_destroy(counts);
    free(failed);
    return rc;
}
