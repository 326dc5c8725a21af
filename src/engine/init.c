/*
 * init.c - one entry point for SGLang's --init-expert-location argument.
 *
 * SGLang's compute_initial_expert_location_metadata accepts "trivial", a
 * path, or inline JSON, and may end up with no metadata at all, which then
 * fails as an assertion far away. Here every path ends in a layout or in an
 * error that says what was missing.
 */
#include <string.h>

#include "../plan/plan_hooks.h"
#include "json_tensor.h"
#include "../io/pt_hooks.h"

static epx_status check_opts(const epx_init_opts *o, epx_error *err) {
    if (o == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "init options are NULL");
    EPX_TRY(epxi_check_version(o->version, EPX_INIT_OPTS_VERSION, "epx_init_opts",
                               "EPX_INIT_OPTS_INIT", err));
    if (o->num_gpus < 1)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "num_gpus (%d) must be set: the layout depends on the EP size",
                         o->num_gpus);
    if (o->num_redundant < 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "num_redundant (%d) must be >= 0",
                         o->num_redundant);
    /* 0 means "infer" or "default" for these; a negative one is no count */
    const struct {
        const char *name;
        int32_t v;
    } counts[] = {{"num_nodes", o->num_nodes},
                  {"num_logical_experts", o->num_logical_experts},
                  {"num_layers", o->num_layers},
                  {"num_physical", o->num_physical},
                  {"num_groups", o->num_groups}};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        if (counts[i].v < 0)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "%s (%d) must be >= 0 (0: inferred, or the default)", counts[i].name,
                             counts[i].v);
    if (strcmp(epx_algorithm_name(o->algorithm), "unknown") == 0)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "algorithm %d is unknown: use one of epx_algorithm's EPX_ALGO_* values",
                         (int)o->algorithm);
    if (o->sglang_version != NULL) {
        long v[4];
        EPX_TRY(epxi_sglang_release(o->sglang_version, v, NULL, err));
    }
    return EPX_OK;
}

/* P for E experts: num_physical, else E + num_redundant; both given must
 * agree (they are two ways to say one thing), and the sum must fit. */
static epx_status slots_for(const epx_init_opts *o, int32_t E, int32_t *P, epx_error *err) {
    const int64_t sum = (int64_t)E + o->num_redundant;
    if (o->num_physical > 0 && o->num_redundant > 0 && o->num_physical != sum)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "num_physical (%d) and num_redundant (%d) disagree: %d experts + %d "
                         "redundant is %lld slots; give one of them",
                         o->num_physical, o->num_redundant, E, o->num_redundant, (long long)sum);
    if (o->num_physical > 0) {
        *P = o->num_physical;
        return EPX_OK;
    }
    if (sum > EPX_MAX_EXPERTS)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "%d experts + num_redundant %d is %lld slots per layer, above the "
                         "limit %d: use fewer redundant slots",
                         E, o->num_redundant, (long long)sum, EPX_MAX_EXPERTS);
    *P = (int32_t)sum;
    return EPX_OK;
}

/* E from the options, or inferred from a map as max id + 1. */
static int32_t experts_for_map(const epx_init_opts *o, const int32_t *map, size_t n) {
    if (o->num_logical_experts > 0) return o->num_logical_experts;
    int32_t m = -1;
    for (size_t i = 0; i < n; i++)
        if (map[i] > m) m = map[i];
    return m + 1;
}

static epx_status init_from_map(const int32_t *map, int32_t L, int32_t P, const epx_init_opts *o,
                                epx_layout **out, epx_error *err) {
    epx_shape s = {L, experts_for_map(o, map, (size_t)L * (size_t)P), P, o->num_gpus,
                   o->num_nodes > 0 ? o->num_nodes : 1};
    if (o->num_layers > 0 && o->num_layers != L)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "the mapping has %d layers but the model has %d: it was made for "
                         "another model",
                         L, o->num_layers);
    if (o->num_physical > 0 && o->num_physical != P)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "the mapping has %d physical slots per layer but %d were asked for "
                         "(E + redundant): pass --ep-num-redundant-experts %d",
                         P, o->num_physical, P - s.num_logical_experts);
    if (o->num_redundant > 0 && (int64_t)s.num_logical_experts + o->num_redundant != P)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "the mapping has %d physical slots per layer for %d experts but "
                         "num_redundant %d asks for %lld: pass --ep-num-redundant-experts %d",
                         P, s.num_logical_experts, o->num_redundant,
                         (long long)s.num_logical_experts + o->num_redundant,
                         P - s.num_logical_experts);
    return epx_layout_create_from_map(&s, map, out, err);
}

static epx_status init_from_counts(const epx_counts *c, const epx_init_opts *o, epx_layout **out,
                                   epx_error *err) {
    if (o->num_logical_experts > 0 && o->num_logical_experts != c->num_experts)
        return epxi_fail(err, EPX_ERR_SHAPE,
                         "logical_count has %d experts per layer but the model has %d",
                         c->num_experts, o->num_logical_experts);
    if (o->num_layers > 0 && o->num_layers != c->num_layers)
        return epxi_fail(err, EPX_ERR_SHAPE, "logical_count has %d layers but the model has %d",
                         c->num_layers, o->num_layers);
    int32_t P = 0;
    EPX_TRY(slots_for(o, c->num_experts, &P, err));
    epx_shape s = {c->num_layers, c->num_experts, P, o->num_gpus,
                   o->num_nodes > 0 ? o->num_nodes : 1};
    EPX_TRY(epx_shape_check(&s, err));
    epx_plan_opts po = EPX_PLAN_OPTS_INIT;
    po.algorithm = o->algorithm;
    /* init's 0 and 1 both mean "no groups"; the planner's word for that is 0
     * (SGLang's None, so its auto rule picks the global policy). */
    po.num_groups = o->num_groups > 1 ? o->num_groups : 0;
    po.sglang_version = o->sglang_version;
    po.log = o->log;
    po.log_user = o->log_user;
    return epxi_plan_layout(c, &s, &po, out, err);
}

epx_status epx_layout_init(const char *spec, const epx_init_opts *o, epx_layout **out,
                           epx_error *err) {
    if (spec == NULL || out == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    EPX_TRY(check_opts(o, err));
    if (strcmp(spec, "trivial") == 0) {
        if (o->num_layers < 1 || o->num_logical_experts < 1)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "a trivial layout needs num_layers (%d) and num_logical_experts "
                             "(%d) from the model config",
                             o->num_layers, o->num_logical_experts);
        int32_t P = 0;
        EPX_TRY(slots_for(o, o->num_logical_experts, &P, err));
        epx_shape s = {o->num_layers, o->num_logical_experts, P, o->num_gpus,
                       o->num_nodes > 0 ? o->num_nodes : 1};
        return epx_layout_create_trivial(&s, out, err);
    }
    /* Try the mapping form first; a counts file says so in its message. */
    int32_t *map = NULL, L = 0, P = 0;
    epx_error probe = {0};
    epx_status st = epx_mapping_read(spec, &map, &L, &P, &probe);
    if (st == EPX_OK) {
        st = init_from_map(map, L, P, o, out, err);
        free(map);
        return st;
    }
    /* A stat dump is planned as the sum of its ring buffer's rows (its row
     * order carries no time), as SGLang's own init does. */
    epx_counts *c = NULL;
    epx_error probe2 = {0};
    const epx_read_opts ro = EPX_READ_OPTS_INIT;
    if (epx_counts_read_with(spec, &ro, &c, &probe2) == EPX_OK) {
        st = init_from_counts(c, o, out, err);
        epx_counts_destroy(c);
        return st;
    }
    /* Neither form: report the mapping reader's error, which is the more
     * specific one unless the input clearly held counts. */
    if (strstr(probe.msg, "it is a counts file") != NULL) {
        if (err) *err = probe2;
        return probe2.status;
    }
    if (err) *err = probe;
    return st;
}
