/*
 * rank_lists.c - the replica lists SGLang keeps on each rank
 * (ExpertLocationMetadata.logical_to_all_physical_map), [G][L][E][X].
 *
 * From 0.5.4.post2, SGLang's init_by_mapping (a mapping file, or the
 * trivial layout) builds each expert's ascending list of slots and then,
 * on rank r, replaces it by the one replica the nearest rule gives r, where
 * the rule gives one: the lists differ from rank to rank. Each rank's
 * static table is computed from its own lists (static_table.c runs those
 * per-rank passes), and SGLang's dynamic dispatch and its rank_invariant
 * rule draw from them, so an engine that stands in for SGLang's needs them
 * as SGLang holds them. The rule is table_common.h's, the same code the
 * table applies, so lists and table cannot disagree about a cut.
 *
 * Two passes over the lists: the first measures the widest list of any
 * rank (the size query), the second writes, so nothing is written when the
 * caller's width is too small.
 */
#include "table_common.h"

/* The resolved options: the release's rule and whether lists are cut. */
typedef struct lists_rule {
    epxi_sg_geom geom;
    bool cut;
} lists_rule;

static epx_status resolve(const epx_shape *s, const epx_table_opts *opts, lists_rule *out,
                          epx_error *err) {
    epx_table_opts defaults = EPX_TABLE_OPTS_INIT;
    if (opts == NULL) opts = &defaults;
    EPX_TRY(epxi_check_version(opts->version, EPX_TABLE_OPTS_VERSION, "epx_table_opts",
                               "EPX_TABLE_OPTS_INIT", err));
    if (opts->algorithm != EPX_TABLE_SGLANG)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "table algorithm %d: the per-rank replica lists are SGLang's "
                         "(EPX_TABLE_SGLANG); epx's table cuts no list, so every rank uses the "
                         "layout's logical_to_all_physical map as it is",
                         (int)opts->algorithm);
    if (opts->expected_load || opts->replica_weights)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "expected_load and replica_weights are not used by SGLang's replica "
                         "lists (they ignore load): pass NULL");
    epx_sglang_rule rule = EPX_SGLANG_RULE_0_5_16;
    EPX_TRY(epx_sglang_table_rule(opts->sglang_version ? opts->sglang_version
                                                       : EPX_SGLANG_DEFAULT_VERSION,
                                  &rule, NULL, err));
    out->geom = epxi_sg_geom_of(s, rule);
    out->cut = opts->init_by_mapping != 0 && rule >= EPX_SGLANG_RULE_0_5_4_POST2;
    return EPX_OK;
}

/* One pass: the widest list of any rank, and with out != NULL every rank's
 * lists written, each -1 padded to out_width. cand [width] is scratch. */
static int32_t lists_pass(const epx_shape *s, const int32_t *replicas, int32_t width,
                          const lists_rule *q, int32_t *cand, int32_t out_width, int32_t *out) {
    int32_t L = s->num_layers, E = s->num_logical_experts, G = s->num_gpus, widest = 1;
    size_t LE = (size_t)L * (size_t)E;
    for (int32_t l = 0; l < L; l++)
        for (int32_t e = 0; e < E; e++) {
            size_t at = (size_t)l * (size_t)E + (size_t)e;
            const int32_t *row = replicas + at * (size_t)width;
            int32_t n = 0;
            for (int32_t j = 0; j < width; j++)
                if (row[j] >= 0) cand[n++] = row[j];
            for (int32_t r = 0; r < G; r++) {
                /* _compute_logical_to_all_physical_map's cut on rank r */
                int32_t near = q->cut ? epxi_sg_nearest(&q->geom, r, cand, n) : -1;
                const int32_t *list = near >= 0 ? &near : cand;
                int32_t m = near >= 0 ? 1 : n;
                if (m > widest) widest = m;
                if (out == NULL) continue;
                int32_t *dst = out + ((size_t)r * LE + at) * (size_t)out_width;
                for (int32_t k = 0; k < out_width; k++) dst[k] = k < m ? list[k] : -1;
            }
        }
    return widest;
}

epx_status epx_dispatch_rank_lists_compute(const epx_shape *shape, const int32_t *replicas,
                                           int32_t width, const epx_table_opts *opts,
                                           int32_t out_width, int32_t *out, int32_t *needed_width,
                                           epx_error *err) {
    if (shape == NULL || replicas == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_dispatch_rank_lists_compute: shape and replicas are required");
    EPX_TRY(epx_shape_check(shape, err));
    if (width < 1)
        return epxi_fail(err, EPX_ERR_SHAPE, "replica map width is %d: it must be >= 1", width);
    lists_rule q = {{EPX_SGLANG_RULE_0_5_16, 1, 1, 1}, false};
    EPX_TRY(resolve(shape, opts, &q, err));
    EPX_TRY(epxi_table_check_replicas(shape, replicas, width, err));
    int32_t *cand = epxi_calloc((size_t)width, sizeof *cand, "replica list scratch", err);
    if (cand == NULL) return err ? err->status : EPX_ERR_NOMEM;
    int32_t need = lists_pass(shape, replicas, width, &q, cand, 0, NULL);
    epx_status st = EPX_OK;
    if (out != NULL && out_width < need)
        st = epxi_fail(err, EPX_ERR_INVALID_ARG,
                       "out_width is %d but the widest replica list of a rank holds %d slots: "
                       "size out as [G][L][E][%d] (a NULL out asks for the width)",
                       out_width, need, need);
    else if (out != NULL)
        lists_pass(shape, replicas, width, &q, cand, out_width, out);
    free(cand);
    if (st == EPX_OK && needed_width) *needed_width = need;
    return st;
}

epx_status epx_dispatch_rank_lists_from_layout(const epx_layout *layout, const epx_table_opts *opts,
                                               int32_t out_width, int32_t *out,
                                               int32_t *needed_width, epx_error *err) {
    if (layout == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "epx_dispatch_rank_lists_from_layout: layout is NULL");
    epx_table_opts o = EPX_TABLE_OPTS_INIT;
    if (opts) {
        EPX_TRY(epxi_check_version(opts->version, EPX_TABLE_OPTS_VERSION, "epx_table_opts",
                                   "EPX_TABLE_OPTS_INIT", err));
        o = *opts;
    }
    o.init_by_mapping = 1; /* SGLang cuts the lists of a mapping */
    int32_t width = 0;
    const int32_t *l2p = epx_layout_logical_to_all_physical(layout, &width);
    return epx_dispatch_rank_lists_compute(epx_layout_shape(layout), l2p, width, &o, out_width, out,
                                           needed_width, err);
}
