/*
 * models.c - the MoE shapes of public models, built in (declared in
 * include/epx/model.h), and their lookup by name.
 *
 * The shapes are copied from shared/models.json so that the library never
 * needs shared/ at run time. They are core's because every room above may
 * name a model: the trace generator, the MoE reference layer, the CLI.
 */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* ---- the model table ----------------------------------------------------- */

static const epx_model MODELS[] = {
    /* name             L  dense   E  K grp tg sh hidden inter */
    {"kimi-k2", 61, 1, 384, 8, 1, 1, 1, 7168, 2048},
    {"kimi-k2.5", 61, 1, 384, 8, 1, 1, 1, 7168, 2048},
    {"deepseek-v3", 61, 3, 256, 8, 8, 4, 1, 7168, 2048},
    {"qwen3-235b-a22b", 94, 0, 128, 8, 1, 1, 0, 4096, 1536},
    {"qwen3-30b-a3b", 48, 0, 128, 8, 1, 1, 0, 2048, 768},
    {"mixtral-8x7b", 32, 0, 8, 2, 1, 1, 0, 4096, 14336},
    {"gpt-oss-120b", 36, 0, 128, 4, 1, 1, 0, 2880, 2880},
    {"glm-4.5", 92, 3, 160, 8, 1, 1, 1, 5120, 1536},
};
#define NUM_MODELS ((int32_t)(sizeof MODELS / sizeof MODELS[0]))

static const struct {
    const char *alias, *name;
} ALIASES[] = {
    {"qwen3-235b", "qwen3-235b-a22b"}, {"qwen3-30b", "qwen3-30b-a3b"}, {"mixtral", "mixtral-8x7b"},
    {"gpt-oss", "gpt-oss-120b"},       {"glm4.5", "glm-4.5"},
};

const epx_model *epx_model_list(int32_t *count) {
    if (count != NULL) *count = NUM_MODELS;
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

epx_status epx_model_lookup(const char *name, const epx_model **out, epx_error *err) {
    if (name == NULL || out == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    const char *canon = name;
    for (size_t i = 0; i < sizeof ALIASES / sizeof ALIASES[0]; i++)
        if (same_name(name, ALIASES[i].alias)) canon = ALIASES[i].name;
    for (int32_t i = 0; i < NUM_MODELS; i++)
        if (same_name(canon, MODELS[i].name)) {
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
