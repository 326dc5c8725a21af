/*
 * models.c - the MoE shapes of public models, built in, and a model named
 * as --model takes it: a built-in name (epx_model_lookup) or a config.json
 * path (epx_model_from_config, epx_model_resolve); declared in
 * include/epx/model.h. The reader of config.json text is model_config.c's.
 *
 * Each built-in model is data in the form a user's model is: the text of
 * its published config.json, cut to the keys the reader uses, with the real
 * values (shared/models.json lists the same numbers). The table is that
 * text run once through the reader behind --model PATH (epxi_model_read),
 * so a built-in name and its config.json give the same shape and a new
 * model is a few lines of JSON. (The routing rule of a built-in name --
 * scoring, scaling -- still comes from src/engine/moe.c's table; the texts
 * carry the real values for when that table goes.) The texts live here, not in files, so the library
 * never needs anything beside itself at run time. They are core's because
 * every room above may name a model: the trace generator, the MoE reference
 * layer, the CLI.
 */
#define _XOPEN_SOURCE 700 /* realpath */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"

/* ---- the model table ----------------------------------------------------- */

/* The tokens as JSON text: the preprocessor escapes the quotes. */
#define CONFIG(...) #__VA_ARGS__

static const struct builtin {
    const char *name;       /* canonical, lower case */
    const char *aliases[2]; /* shorter names, NULL-terminated */
    const char *config;     /* its config.json, the keys the reader uses */
} BUILTINS[] = {
    /* The formatter would set the JSON out as C, one key a line. */
    /* clang-format off */
    {"kimi-k2",
     {NULL},
     CONFIG({"model_type": "kimi_k2", "num_hidden_layers": 61, "hidden_size": 7168,
             "n_routed_experts": 384, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
             "moe_layer_freq": 1, "n_group": 1, "topk_group": 1, "n_shared_experts": 1,
             "moe_intermediate_size": 2048, "scoring_func": "sigmoid",
             "routed_scaling_factor": 2.827, "norm_topk_prob": true})},
    /* A multimodal release: the language model is nested, as in the real one. */
    {"kimi-k2.5",
     {NULL},
     CONFIG({"model_type": "kimi_k25",
             "text_config": {"model_type": "deepseek_v3", "num_hidden_layers": 61,
                             "hidden_size": 7168, "n_routed_experts": 384,
                             "num_experts_per_tok": 8, "first_k_dense_replace": 1,
                             "moe_layer_freq": 1, "n_group": 1, "topk_group": 1,
                             "n_shared_experts": 1, "moe_intermediate_size": 2048,
                             "scoring_func": "sigmoid", "routed_scaling_factor": 2.827,
                             "norm_topk_prob": true}})},
    {"deepseek-v3",
     {NULL},
     CONFIG({"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168,
             "n_routed_experts": 256, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
             "moe_layer_freq": 1, "n_group": 8, "topk_group": 4, "n_shared_experts": 1,
             "moe_intermediate_size": 2048, "scoring_func": "sigmoid",
             "routed_scaling_factor": 2.5, "norm_topk_prob": true})},
    {"qwen3-235b-a22b",
     {"qwen3-235b", NULL},
     CONFIG({"model_type": "qwen3_moe", "num_hidden_layers": 94, "hidden_size": 4096,
             "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
             "mlp_only_layers": [], "moe_intermediate_size": 1536, "norm_topk_prob": true})},
    {"qwen3-30b-a3b",
     {"qwen3-30b", NULL},
     CONFIG({"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048,
             "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
             "mlp_only_layers": [], "moe_intermediate_size": 768, "norm_topk_prob": true})},
    {"mixtral-8x7b",
     {"mixtral", NULL},
     CONFIG({"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096,
             "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 14336})},
    {"gpt-oss-120b",
     {"gpt-oss", NULL},
     CONFIG({"model_type": "gpt_oss", "num_hidden_layers": 36, "hidden_size": 2880,
             "num_local_experts": 128, "experts_per_token": 4, "num_experts_per_tok": 4,
             "intermediate_size": 2880})},
    /* GLM-4.5's config names no scoring_func (its code always uses sigmoid). */
    {"glm-4.5",
     {"glm4.5", NULL},
     CONFIG({"model_type": "glm4_moe", "num_hidden_layers": 92, "hidden_size": 5120,
             "n_routed_experts": 160, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
             "n_group": 1, "topk_group": 1, "n_shared_experts": 1,
             "moe_intermediate_size": 1536, "routed_scaling_factor": 2.5,
             "norm_topk_prob": true})},
    /* clang-format on */
};
#define NUM_MODELS ((int32_t)(sizeof BUILTINS / sizeof BUILTINS[0]))

/* The table callers see, built on first use (a library has no start-up
 * hook) exactly once whatever the threads (pthread_once), into static
 * storage: nothing to free. A built-in text the reader refuses is a bug in
 * this file; every call then reports it (tests/test_model_config.c reads
 * them all). */
static epx_model MODELS[sizeof BUILTINS / sizeof BUILTINS[0]];
static pthread_once_t BUILD_ONCE = PTHREAD_ONCE_INIT;
static epx_error BUILD_ERR;

static void build(void) {
    for (int32_t i = 0; i < NUM_MODELS; i++) {
        const struct builtin *b = &BUILTINS[i];
        char what[64];
        snprintf(what, sizeof what, "built-in %s", b->name);
        epx_model_info info;
        epx_error e = {0};
        if (epxi_model_read(b->config, strlen(b->config), what, &info, &e) != EPX_OK) {
            epxi_fail(&BUILD_ERR, EPX_ERR_INTERNAL,
                      "the built-in model table does not read (a bug in epx's "
                      "src/core/models.c): %s",
                      e.msg);
            return;
        }
        MODELS[i] = info.model;
        MODELS[i].name = b->name;
    }
}

/* EPX_OK once the table is built; else the internal error, into err. */
static epx_status built(epx_error *err) {
    pthread_once(&BUILD_ONCE, build);
    if (BUILD_ERR.status == EPX_OK) return EPX_OK;
    return epxi_fail(err, BUILD_ERR.status, "%s", BUILD_ERR.msg);
}

const epx_model *epx_model_list(int32_t *count) {
    /* No table (the bug above): an empty list, which names no model. */
    int32_t n = built(NULL) == EPX_OK ? NUM_MODELS : 0;
    if (count != NULL) *count = n;
    return MODELS;
}

/* Compare ignoring case and treating '_' as '-'. */
static bool same_name(const char *a, const char *b) {
    for (;; a++, b++) {
        int x = tolower((unsigned char)*a), y = tolower((unsigned char)*b);
        if (x == '_') x = '-';
        if (y == '_') y = '-';
        if (x != y) return false;
        if (x == '\0') return true;
    }
}

static bool names(const struct builtin *b, const char *name) {
    if (same_name(name, b->name)) return true;
    for (int a = 0; b->aliases[a] != NULL; a++)
        if (same_name(name, b->aliases[a])) return true;
    return false;
}

epx_status epx_model_lookup(const char *name, const epx_model **out, epx_error *err) {
    if (name == NULL || out == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    EPX_TRY(built(err));
    for (int32_t i = 0; i < NUM_MODELS; i++)
        if (names(&BUILTINS[i], name)) {
            *out = &MODELS[i];
            return EPX_OK;
        }
    char known[256];
    size_t n = 0;
    known[0] = '\0';
    for (int32_t i = 0; i < NUM_MODELS && n < sizeof known; i++)
        n += (size_t)snprintf(known + n, sizeof known - n, "%s%s", i ? ", " : "", MODELS[i].name);
    return epxi_fail(err, EPX_ERR_INVALID_ARG, "unknown model '%.64s': the built-in models are %s",
                     name, known);
}

/* ---- a model named by a path --------------------------------------------- */

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
    EPX_TRY(epx_file_read(file, EPX_MAX_CONFIG_BYTES, "a config.json (EPX_MAX_CONFIG_BYTES)", &text,
                          &len, err));
    epx_status s = epxi_model_read(text, len, file, info, err);
    free(text);
    if (s != EPX_OK) return s;
    model_name(file, info);
    info->model.name = info->name;
    return EPX_OK;
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
