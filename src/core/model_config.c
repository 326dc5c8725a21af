/*
 * model_config.c - a model's MoE shape from a HuggingFace config.json
 * (declared in include/epx/model.h), so that --model takes the file a user
 * already has, not only a built-in name.
 *
 * Each family names the same quantities with its own keys (DeepSeek's
 * n_routed_experts is Qwen's num_experts and Mixtral's num_local_experts),
 * so a family is a small table of key names plus the rules for the layers
 * that have no experts. The built-in table (models.c) is config.json text
 * read by this same reader (epxi_model_read); tests/data/hf/ keeps full
 * configs of built-in models and the tests check that both give the same
 * epx_model. A key the shape needs and the
 * config lacks is an error naming the key and the family, never a default:
 * a silently wrong expert count would make every plan wrong.
 */
#define _XOPEN_SOURCE 700 /* realpath */
#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

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

/* An integer field in [lo, INT32_MAX]. Absent: *out keeps its default
 * unless required. JSON true/false count as 1/0 for the boolean flags. */
static epx_status get_int(const reader *r, const char *key, bool required, int32_t lo,
                          int32_t *out) {
    const json_t *v = json_object_get(r->obj, key);
    if (v == NULL || json_is_null(v)) return required ? missing(r, key) : EPX_OK;
    if (json_is_integer(v) && json_integer_value(v) >= lo && json_integer_value(v) <= INT32_MAX) {
        *out = (int32_t)json_integer_value(v);
        return EPX_OK;
    }
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    epx_status st = epxi_fail(r->err, EPX_ERR_PARSE,
                              "'%s'%s in '%.200s' is %.60s, not an integer in [%d, %d] (read as a "
                              "%s config): write it as a plain JSON integer such as 8",
                              key, r->where, r->path, text ? text : "(unprintable)", lo, INT32_MAX,
                              r->fam->name);
    free(text);
    return st;
}

static epx_status get_bool(const reader *r, const char *key, int32_t *out) {
    const json_t *v = json_object_get(r->obj, key);
    if (v == NULL || json_is_null(v)) return EPX_OK;
    if (json_is_boolean(v)) {
        *out = json_is_true(v) ? 1 : 0;
        return EPX_OK;
    }
    return get_int(r, key, false, 0, out);
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

/* The name: the folder holding config.json (or the file, less ".json"),
 * lower case, mapped to a built-in name when it is one or an alias. */
static void model_name(const char *file, epx_model_info *info) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", file);
    char *slash = strrchr(buf, '/');
    char *base = slash ? slash + 1 : buf;
    if (strcmp(base, "config.json") == 0) {
        if (slash == NULL) {
            snprintf(buf, sizeof buf, ".");
        } else {
            while (slash > buf && slash[-1] == '/') slash--;
            *slash = '\0';
        }
        char real[4096];
        if (realpath(buf, real) != NULL) snprintf(buf, sizeof buf, "%s", real);
        slash = strrchr(buf, '/');
        base = slash ? slash + 1 : buf;
    } else if (epxi_has_suffix(base, ".json")) {
        base[strlen(base) - 5] = '\0';
    }
    snprintf(info->name, sizeof info->name, "%.63s", base[0] ? base : "config");
    for (char *c = info->name; *c; c++) *c = (char)tolower((unsigned char)*c);
    const epx_model *m = NULL;
    if (epx_model_lookup(info->name, &m, NULL) == EPX_OK)
        snprintf(info->name, sizeof info->name, "%s", m->name);
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
        if (!json_is_integer(v) || json_integer_value(v) != (json_int_t)i ||
            (json_int_t)i >= layers)
            return epxi_fail(r->err, EPX_ERR_UNSUPPORTED,
                             "'mlp_only_layers'%s in '%.200s' has %lld at index %zu: epx "
                             "describes dense layers only as a leading run 0..k-1 (read as a %s "
                             "config)",
                             r->where, r->path,
                             json_is_integer(v) ? (long long)json_integer_value(v) : -1LL, i,
                             r->fam->name);
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
    EPX_TRY(get_int(r, "num_hidden_layers", true, 1, &m->num_layers));
    EPX_TRY(get_int(r, "hidden_size", true, 1, &m->hidden));
    EPX_TRY(get_int(r, f->experts, true, 1, &m->num_experts));
    m->top_k = 0;
    if (fi == GPT_OSS) EPX_TRY(get_int(r, "experts_per_token", false, 1, &m->top_k));
    EPX_TRY(get_int(r, "num_experts_per_tok", m->top_k == 0, 1, &m->top_k));
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
            info->routed_scaling_factor = (float)json_number_value(rs);
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

epx_status epx_model_from_config(const char *path, epx_model_info *info, epx_error *err) {
    if (path == NULL || info == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "path and info must not be NULL");
    struct stat st;
    if (stat(path, &st) != 0)
        return epxi_fail(err, EPX_ERR_IO,
                         "model '%.200s' is neither a built-in name nor an existing path: give a "
                         "config.json, a folder holding one, or a built-in name (epx trace synth "
                         "--help lists them)",
                         path);
    char file[4096];
    if (S_ISDIR(st.st_mode)) {
        size_t n = strlen(path);
        snprintf(file, sizeof file, "%s%sconfig.json", path, n && path[n - 1] == '/' ? "" : "/");
        if (stat(file, &st) != 0 || !S_ISREG(st.st_mode))
            return epxi_fail(err, EPX_ERR_IO,
                             "folder '%.200s' holds no config.json: give the folder of a "
                             "HuggingFace model (the one with config.json) or the file itself",
                             path);
    } else {
        snprintf(file, sizeof file, "%s", path);
    }
    char *text = NULL;
    size_t len = 0;
    EPX_TRY(epxi_read_file(file, &text, &len, err));
    epx_status s = epxi_model_read(text, len, file, info, err);
    free(text);
    if (s != EPX_OK) return s;
    model_name(file, info);
    info->model.name = info->name;
    return EPX_OK;
}

/* The reader proper, for a file and for the built-in table alike (models.c
 * runs its texts through here, so both give the same numbers by
 * construction). It leaves the name to the caller: naming a file looks the
 * name up in the built-in table, which the table's own build must not do. */
epx_status epxi_model_read(const char *text, size_t len, const char *path, epx_model_info *info,
                           epx_error *err) {
    char what[300];
    snprintf(what, sizeof what, "model config '%.200s'", path);
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

epx_status epx_model_resolve(const char *name_or_path, epx_model_info *info, epx_error *err) {
    if (name_or_path == NULL || info == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "name and info must not be NULL");
    const epx_model *m = NULL;
    struct stat st;
    bool path = strchr(name_or_path, '/') != NULL || epxi_has_suffix(name_or_path, ".json");
    if (!path && epx_model_lookup(name_or_path, &m, NULL) != EPX_OK && stat(name_or_path, &st) == 0)
        path = true;
    if (path) return epx_model_from_config(name_or_path, info, err);
    epx_status ls = epx_model_lookup(name_or_path, &m, err);
    if (ls != EPX_OK) {
        /* The same message, with the other way to name a model. */
        if (err != NULL) {
            size_t n = strlen(err->msg);
            if (n + 40 < sizeof err->msg)
                snprintf(err->msg + n, sizeof err->msg - n, "; or give a path to a config.json");
        }
        return ls;
    }
    memset(info, 0, sizeof *info);
    info->model = *m;
    snprintf(info->name, sizeof info->name, "%s", m->name);
    snprintf(info->family, sizeof info->family, "built-in");
    info->scoring = -1;
    info->routed_scaling_factor = 1.0f;
    return EPX_OK;
}
