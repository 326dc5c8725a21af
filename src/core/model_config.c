/*
 * model_config.c - the reader of HuggingFace config.json text: a model's
 * MoE shape (epx_model_info) from the file a user already has. It is the
 * one reader: epx_model_from_config (models.c, for --model PATH) and the
 * built-in table (models.c, config.json texts) both go through
 * epxi_model_read, so a name and its config cannot disagree. It names
 * nothing and looks nothing up, so the table can be built with it.
 *
 * Each family names the same quantities with its own keys (DeepSeek's
 * n_routed_experts is Qwen's num_experts and Mixtral's num_local_experts),
 * so a family is a small table of key names plus the rules for the layers
 * that have no experts. A key the shape needs and the config lacks is an
 * error naming the key and the family, never a default: a silently wrong
 * expert count would make every plan wrong.
 */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "json_tensor.h"

/* How one family spells its fields. NULL: the family has no such key. */
typedef struct family {
    const char *name;     /* "deepseek": in messages and epx_model_info.family */
    const char *types[6]; /* model_type values, NULL-terminated */
    const char *arch;     /* a substring of architectures[0] */
    const char *experts;  /* routed experts per MoE layer */
    const char *inter;    /* one routed expert's intermediate size */
    int32_t scoring;      /* default epx_moe_scoring; -1: none of epx's */
    int32_t norm;         /* default norm_topk_prob */
} family;

static const family FAMILIES[] = {
    {"deepseek",
     {"deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_k25", "glm4_moe", NULL},
     "Deepseek",
     "n_routed_experts",
     "moe_intermediate_size",
     0,
     0},
    {"qwen-moe",
     {"qwen2_moe", "qwen3_moe", "qwen3_next", NULL},
     "Qwen",
     "num_experts",
     "moe_intermediate_size",
     0,
     0},
    {"mixtral", {"mixtral", NULL}, "Mixtral", "num_local_experts", "intermediate_size", 0, 1},
    {"gpt-oss", {"gpt_oss", NULL}, "GptOss", "num_local_experts", "intermediate_size", 2, 0},
    {"llama4",
     {"llama4", "llama4_text", NULL},
     "Llama4",
     "num_local_experts",
     "intermediate_size",
     -1,
     0},
};
enum { DEEPSEEK, QWEN, MIXTRAL, GPT_OSS, LLAMA4, NUM_FAMILIES };

/* What the messages need to say where a value came from. */
typedef struct reader {
    const json_t *obj; /* the language model's object */
    const json_t *top; /* the whole config (obj, or holding it as text_config) */
    const char *path;  /* the file read */
    const char *where; /* "" or " (under text_config)" */
    const family *fam; /* the family it was read as */
    const char *how;   /* how the family was chosen: "model_type 'x'" */
    epx_error *err;
} reader;

static epx_status missing(const reader *r, const char *key) {
    return epxi_fail(r->err, EPX_ERR_PARSE,
                     "'%.200s' has no '%s'%s, which the model shape needs (read as a %s config "
                     "from %s): add it, or name a built-in model",
                     r->path, key, r->where, r->fam->name, r->how);
}

/* An integer field in [lo, hi] (limit names where hi comes from, or NULL).
 * Absent: *out keeps its default unless required. The message says what
 * the value is (a string, a boolean, a fraction, a whole number written as a
 * real such as 8.0 or 1e10, or an integer out of range)
 * and the range. */
static epx_status get_int_in(const reader *r, const char *key, bool required, int32_t lo,
                             int32_t hi, const char *limit, int32_t *out) {
    const json_t *v = json_object_get(r->obj, key);
    if (v == NULL || json_is_null(v)) return required ? missing(r, key) : EPX_OK;
    if (json_is_integer(v) && json_integer_value(v) >= lo && json_integer_value(v) <= hi) {
        *out = (int32_t)json_integer_value(v);
        return EPX_OK;
    }
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    const char *kind = json_is_integer(v)   ? "an integer out of range"
                       : json_is_boolean(v) ? "a boolean"
                       : json_is_real(v)    ? (fmod(json_real_value(v), 1.0) == 0.0
                                                   ? "a real number, with a point or an exponent"
                                                   : "a fraction")
                       : json_is_string(v)  ? "a string"
                                            : "not a number";
    epx_status st =
        epxi_fail(r->err, EPX_ERR_PARSE,
                  "'%s'%s in '%.200s' is %.60s (%s), not an integer in [%d, %d]%s%s%s "
                  "(read as a %s config): write a plain JSON integer in that range",
                  key, r->where, r->path, text ? text : "(unprintable)", kind, lo, hi,
                  limit ? " (" : "", limit ? limit : "", limit ? ")" : "", r->fam->name);
    free(text);
    return st;
}

static epx_status get_int(const reader *r, const char *key, bool required, int32_t lo,
                          int32_t *out) {
    return get_int_in(r, key, required, lo, INT32_MAX, NULL, out);
}

/* A boolean flag: true/false, or 0/1 as some configs write it. */
static epx_status get_bool(const reader *r, const char *key, int32_t *out) {
    const json_t *v = json_object_get(r->obj, key);
    if (v == NULL || json_is_null(v)) return EPX_OK;
    if (json_is_boolean(v)) {
        *out = json_is_true(v) ? 1 : 0;
        return EPX_OK;
    }
    if (json_is_integer(v) && (json_integer_value(v) == 0 || json_integer_value(v) == 1)) {
        *out = (int32_t)json_integer_value(v);
        return EPX_OK;
    }
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    epx_status st = epxi_fail(r->err, EPX_ERR_PARSE,
                              "'%s'%s in '%.200s' is %.60s, not a boolean (read as a %s config): "
                              "write true or false",
                              key, r->where, r->path, text ? text : "(unprintable)", r->fam->name);
    free(text);
    return st;
}

/* The family: model_type of the language model, then of the top level,
 * then architectures[0], then whichever expert-count key is present. */
static const family *find_family(const json_t *top, const json_t *lm, char *how, size_t cap) {
    const json_t *objs[2] = {lm, top};
    for (int o = 0; o < 2; o++) {
        const char *t = json_string_value(json_object_get(objs[o], "model_type"));
        if (t == NULL) continue;
        for (int f = 0; f < NUM_FAMILIES; f++)
            for (int i = 0; FAMILIES[f].types[i] != NULL; i++)
                if (strcmp(t, FAMILIES[f].types[i]) == 0) {
                    snprintf(how, cap, "model_type '%.40s'", t);
                    return &FAMILIES[f];
                }
    }
    for (int o = 0; o < 2; o++) {
        const char *a =
            json_string_value(json_array_get(json_object_get(objs[o], "architectures"), 0));
        if (a == NULL) continue;
        for (int f = 0; f < NUM_FAMILIES; f++)
            if (strstr(a, FAMILIES[f].arch) != NULL) {
                snprintf(how, cap, "architectures '%.40s'", a);
                return &FAMILIES[f];
            }
    }
    /* The fallback: the key that holds the expert count. Mixtral's key is
     * also gpt-oss's and Llama-4's; their shapes are read the same way. */
    static const int ORDER[] = {DEEPSEEK, QWEN, MIXTRAL};
    for (size_t i = 0; i < sizeof ORDER / sizeof ORDER[0]; i++)
        if (json_object_get(lm, FAMILIES[ORDER[i]].experts) != NULL) {
            snprintf(how, cap, "its key '%s' (model_type unknown)", FAMILIES[ORDER[i]].experts);
            return &FAMILIES[ORDER[i]];
        }
    snprintf(how, cap, "no model_type, architectures or expert-count key epx knows");
    return &FAMILIES[DEEPSEEK];
}

/* Leading dense layers from Qwen's mlp_only_layers: they must be 0..k-1. */
static epx_status qwen_dense(const reader *r, int32_t layers, int32_t *first_k_dense) {
    const json_t *a = json_object_get(r->obj, "mlp_only_layers");
    if (a == NULL || json_is_null(a)) return EPX_OK;
    if (!json_is_array(a))
        return epxi_fail(r->err, EPX_ERR_PARSE,
                         "'mlp_only_layers'%s in '%.200s' is not a list (read as a %s config): "
                         "write it as a list of layer indices such as []",
                         r->where, r->path, r->fam->name);
    size_t n = json_array_size(a);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v)) {
            char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
            epx_status st =
                epxi_fail(r->err, EPX_ERR_PARSE,
                          "'mlp_only_layers'%s in '%.200s' has %.60s at index %zu, "
                          "not a layer index (read as a %s config): write plain JSON "
                          "integers such as [0, 1]",
                          r->where, r->path, text ? text : "(unprintable)", i, r->fam->name);
            free(text);
            return st;
        }
        if (json_integer_value(v) != (json_int_t)i || (json_int_t)i >= layers)
            return epxi_fail(r->err, EPX_ERR_UNSUPPORTED,
                             "'mlp_only_layers'%s in '%.200s' has %lld at index %zu: epx "
                             "describes dense layers only as a leading run 0..k-1 (read as a %s "
                             "config)",
                             r->where, r->path, (long long)json_integer_value(v), i, r->fam->name);
    }
    *first_k_dense = (int32_t)n;
    return EPX_OK;
}

static epx_status only_one(const reader *r, const char *key) {
    int32_t step = 1;
    EPX_TRY(get_int(r, key, false, 1, &step));
    if (step != 1)
        return epxi_fail(r->err, EPX_ERR_UNSUPPORTED,
                         "'%s'%s in '%.200s' is %d: MoE layers every %d layers cannot be "
                         "described yet (epx's shape has dense layers only as a leading run; "
                         "read as a %s config)",
                         key, r->where, r->path, step, step, r->fam->name);
    return EPX_OK;
}

/* DeepSeek-V3's code and its descendants' (Kimi-K2, GLM-4.5) route by
 * sigmoid whatever the config says or omits: GLM-4.5's config names no
 * scoring_func. DeepSeek-V2's default is softmax, the family's. */
static int32_t deepseek_scoring(const reader *r) {
    static const char *SIGMOID[] = {"deepseek_v3", "kimi_k2", "kimi_k25", "glm4_moe"};
    const char *t = json_string_value(json_object_get(r->obj, "model_type"));
    if (t == NULL) t = json_string_value(json_object_get(r->top, "model_type"));
    for (size_t i = 0; t != NULL && i < sizeof SIGMOID / sizeof SIGMOID[0]; i++)
        if (strcmp(t, SIGMOID[i]) == 0) return 1;
    return r->fam->scoring;
}

static epx_status read_shape(const reader *r, epx_model_info *info) {
    const family *f = r->fam;
    epx_model *m = &info->model;
    const int fi = (int)(f - FAMILIES);
    m->first_k_dense = 0;
    m->num_groups = 1;
    m->topk_group = 1;
    m->shared_experts = fi == LLAMA4 ? 1 : 0;
    /* The README's limits, checked here, before anything is sized from them. */
    EPX_TRY(get_int_in(r, "num_hidden_layers", true, 1, EPX_MAX_LAYERS, "EPX_MAX_LAYERS",
                       &m->num_layers));
    EPX_TRY(get_int(r, "hidden_size", true, 1, &m->hidden));
    EPX_TRY(
        get_int_in(r, f->experts, true, 1, EPX_MAX_EXPERTS, "EPX_MAX_EXPERTS", &m->num_experts));
    m->top_k = 0;
    if (fi == GPT_OSS) EPX_TRY(get_int(r, "experts_per_token", false, 1, &m->top_k));
    int32_t per_tok = 0;
    EPX_TRY(get_int(r, "num_experts_per_tok", m->top_k == 0, 1, &per_tok));
    if (m->top_k != 0 && per_tok != 0 && per_tok != m->top_k)
        return epxi_fail(r->err, EPX_ERR_PARSE,
                         "'%.200s' has 'experts_per_token' %d and 'num_experts_per_tok' %d%s: "
                         "they name the same top-k and disagree (read as a %s config): keep one",
                         r->path, m->top_k, per_tok, r->where, f->name);
    if (per_tok != 0) m->top_k = per_tok;
    EPX_TRY(get_int(r, f->inter, true, 1, &m->moe_intermediate));

    info->scoring = f->scoring;
    info->norm_topk_prob = f->norm;
    info->routed_scaling_factor = 1.0f;
    EPX_TRY(get_bool(r, "norm_topk_prob", &info->norm_topk_prob));
    if (fi == DEEPSEEK) {
        EPX_TRY(get_int(r, "first_k_dense_replace", false, 0, &m->first_k_dense));
        EPX_TRY(only_one(r, "moe_layer_freq"));
        EPX_TRY(get_int(r, "n_group", false, 1, &m->num_groups));
        EPX_TRY(get_int(r, "topk_group", false, 1, &m->topk_group));
        EPX_TRY(get_int(r, "n_shared_experts", false, 0, &m->shared_experts));
        /* Routing keys only matter to the MoE layer (bench comm): a rule epx
         * lacks is -1 there, not an error for the shape. */
        info->scoring = deepseek_scoring(r);
        const char *sf = json_string_value(json_object_get(r->obj, "scoring_func"));
        if (sf != NULL)
            info->scoring = strcmp(sf, "sigmoid") == 0 ? 1 : strcmp(sf, "softmax") == 0 ? 0 : -1;
        const json_t *rs = json_object_get(r->obj, "routed_scaling_factor");
        if (json_is_number(rs)) {
            /* checked as the double it is: 1e39 is not +inf, 1e-50 is not 0 */
            const double x = json_number_value(rs);
            if (!(x >= FLT_MIN && x <= FLT_MAX))
                return epxi_fail(r->err, EPX_ERR_PARSE,
                                 "'routed_scaling_factor'%s in '%.200s' is %g: it must be in "
                                 "[%g, %g], a positive float32 (read as a %s config)",
                                 r->where, r->path, x, (double)FLT_MIN, (double)FLT_MAX, f->name);
            info->routed_scaling_factor = (float)x;
        } else if (rs != NULL && !json_is_null(rs)) {
            return epxi_fail(r->err, EPX_ERR_PARSE,
                             "'routed_scaling_factor'%s in '%.200s' is not a number (read as a %s "
                             "config): write it as a JSON number such as 2.5",
                             r->where, r->path, f->name);
        }
    } else if (fi == QWEN) {
        EPX_TRY(only_one(r, "decoder_sparse_step"));
        EPX_TRY(qwen_dense(r, m->num_layers, &m->first_k_dense));
        int32_t shared = 0;
        EPX_TRY(get_int(r, "shared_expert_intermediate_size", false, 0, &shared));
        /* Qwen2-MoE's one shared expert is as wide as n routed ones; the
         * shape counts it that way (rounded up when it does not divide). */
        m->shared_experts =
            (int32_t)(((int64_t)shared + m->moe_intermediate - 1) / m->moe_intermediate);
    } else if (fi == LLAMA4) {
        EPX_TRY(only_one(r, "interleave_moe_layer_step"));
    }

    if (m->first_k_dense >= m->num_layers)
        return epxi_fail(r->err, EPX_ERR_SHAPE,
                         "'%.200s' has %d dense layers of %d: no MoE layer is left (read as a %s "
                         "config)",
                         r->path, m->first_k_dense, m->num_layers, f->name);
    if (m->top_k > m->num_experts)
        return epxi_fail(r->err, EPX_ERR_SHAPE,
                         "'%.200s' routes each token to %d experts of %d: num_experts_per_tok "
                         "must be at most '%s' (read as a %s config)",
                         r->path, m->top_k, m->num_experts, f->experts, f->name);
    if (m->num_experts % m->num_groups != 0 || m->topk_group > m->num_groups)
        return epxi_fail(r->err, EPX_ERR_SHAPE,
                         "'%.200s' has n_group %d and topk_group %d for %d experts: n_group must "
                         "divide the experts and topk_group be at most n_group (read as a %s "
                         "config)",
                         r->path, m->num_groups, m->topk_group, m->num_experts, f->name);
    if (!(info->routed_scaling_factor > 0.0f))
        return epxi_fail(r->err, EPX_ERR_PARSE,
                         "'routed_scaling_factor' in '%.200s' is %g: it must be > 0 (read as a %s "
                         "config)",
                         r->path, (double)info->routed_scaling_factor, f->name);
    return EPX_OK;
}

/* The bounds of a config.json, counted on the text before jansson builds a
 * tree of it: EPX_MAX_CONFIG_BYTES, EPX_MAX_CONFIG_DEPTH levels of nesting,
 * EPX_MAX_CONFIG_VALUES values (array elements, keys, containers), so a
 * padded config is refused in one pass over at most 1 MiB. */
static epx_status config_bounds(const char *text, size_t len, const char *path, epx_error *err) {
    if (len > EPX_MAX_CONFIG_BYTES)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "'%.200s' is larger than %u bytes, the limit for a config.json "
                         "(EPX_MAX_CONFIG_BYTES): give the model's own config.json",
                         path, (unsigned)EPX_MAX_CONFIG_BYTES);
    size_t values = 0;
    int depth = 0;
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        const char c = text[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = false;
            continue;
        }
        if (c == '"') {
            in_str = true;
        } else if (c == '[' || c == '{') {
            if (++depth > EPX_MAX_CONFIG_DEPTH)
                return epxi_fail(err, EPX_ERR_PARSE,
                                 "'%.200s' nests JSON deeper than %d levels, the limit for a "
                                 "config.json (EPX_MAX_CONFIG_DEPTH): give the model's own "
                                 "config.json",
                                 path, EPX_MAX_CONFIG_DEPTH);
            values++;
        } else if (c == ']' || c == '}') {
            depth--;
        } else if (c == ',' || c == ':') {
            values++;
        }
        if (values > EPX_MAX_CONFIG_VALUES)
            return epxi_fail(err, EPX_ERR_PARSE,
                             "'%.200s' holds more than %u JSON values (elements and keys), the "
                             "limit for a config.json (EPX_MAX_CONFIG_VALUES): give the model's "
                             "own config.json",
                             path, (unsigned)EPX_MAX_CONFIG_VALUES);
    }
    return EPX_OK;
}

/* The reader proper (declared in internal.h). The name is the caller's:
 * naming a file looks it up in the built-in table, itself built with this. */
epx_status epxi_model_read(const char *text, size_t len, const char *path, epx_model_info *info,
                           epx_error *err) {
    char what[300];
    snprintf(what, sizeof what, "model config '%.200s'", path);
    EPX_TRY(config_bounds(text, len, path, err));
    json_t *top = NULL;
    EPX_TRY(epxi_json_parse_object(text, len, what, &top, err));

    memset(info, 0, sizeof *info);
    const json_t *lm = top;
    const char *where = "";
    const json_t *tc = json_object_get(top, "text_config");
    if (json_is_object(tc)) {
        lm = tc;
        where = " (under text_config)";
    }
    char how[96];
    reader r = {lm, top, path, where, find_family(top, lm, how, sizeof how), how, err};
    epx_status s = read_shape(&r, info);
    if (s == EPX_OK) {
        snprintf(info->family, sizeof info->family, "%s", r.fam->name);
        info->from_config = 1;
    }
    json_decref(top);
    return s;
}
