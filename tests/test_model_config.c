/*
 * test_model_config.c - models read from HuggingFace config.json files
 * (epx_model_from_config, epx_model_resolve): the built-in table, which is
 * config.json text read by the same reader, gives the numbers it held as a
 * C table (kept here, and checked against shared/models.json) from any
 * number of threads at once; the configs under tests/data/hf/ give the
 * built-in entries field for field, and the same MoE routing rule; the three ways to name one (folder, folder/, file);
 * each family's special keys (text_config, mlp_only_layers, a Qwen2 shared
 * expert, Llama-4, the fallback on the expert-count key); and every refusal
 * with the key, the value and the family in its message.
 */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

static const char *FIXTURES[] = {"deepseek-v3",  "kimi-k2",         "kimi-k2.5",
                                 "glm-4.5",      "qwen3-235b-a22b", "qwen3-30b-a3b",
                                 "mixtral-8x7b", "gpt-oss-120b"};
static const char *FAMILY[] = {"deepseek", "deepseek", "deepseek", "deepseek",
                               "qwen-moe", "qwen-moe", "mixtral",  "gpt-oss"};

/* The oracle: the built-in table as it was a C struct table, before it
 * became config.json text, in its order. */
static const epx_model TODAY[] = {
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
#define NUM_TODAY ((int32_t)(sizeof TODAY / sizeof TODAY[0]))

static void assert_same_model(const epx_model *a, const epx_model *b) {
    assert_string_equal(a->name, b->name);
    assert_int_equal(a->num_layers, b->num_layers);
    assert_int_equal(a->first_k_dense, b->first_k_dense);
    assert_int_equal(a->num_experts, b->num_experts);
    assert_int_equal(a->top_k, b->top_k);
    assert_int_equal(a->num_groups, b->num_groups);
    assert_int_equal(a->topk_group, b->topk_group);
    assert_int_equal(a->shared_experts, b->shared_experts);
    assert_int_equal(a->hidden, b->hidden);
    assert_int_equal(a->moe_intermediate, b->moe_intermediate);
}

/* Many threads ask for the table at once, before anything else in this
 * process has: it is built once and every thread sees the same table. */
static void *list_in_thread(void *arg) {
    int32_t n = -1;
    const epx_model *m = epx_model_list(&n);
    const epx_model *k = NULL;
    epx_error err = {0};
    ((const void **)arg)[0] = epx_model_lookup("glm4.5", &k, &err) == EPX_OK ? k : NULL;
    ((const void **)arg)[1] = n == NUM_TODAY ? m : NULL;
    return NULL;
}

static void builtins_once_from_threads(void **state) {
    (void)state;
    enum { THREADS = 8 };
    pthread_t t[THREADS];
    const void *seen[THREADS][2];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, list_in_thread, seen[i]), 0);
    for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
    int32_t n = 0;
    const epx_model *list = epx_model_list(&n);
    for (int i = 0; i < THREADS; i++) {
        assert_ptr_equal(seen[i][0], &list[NUM_TODAY - 1]);
        assert_ptr_equal(seen[i][1], list);
    }
}

/* Every built-in text reads (a refusal would leave the list empty and make
 * lookups fail with EPX_ERR_INTERNAL), into today's numbers, names and
 * order; each name and alias finds its entry. */
static void builtins_read_as_today(void **state) {
    (void)state;
    int32_t n = 0;
    const epx_model *list = epx_model_list(&n);
    assert_int_equal(n, NUM_TODAY);
    for (int32_t i = 0; i < n; i++) {
        assert_same_model(&list[i], &TODAY[i]);
        const epx_model *m = NULL;
        epx_error err = {0};
        if (epx_model_lookup(TODAY[i].name, &m, &err) != EPX_OK) fail_msg("%s", err.msg);
        assert_ptr_equal(m, &list[i]);
    }
    const char *alias[][2] = {{"qwen3-235b", "qwen3-235b-a22b"},
                              {"QWEN3_30B", "qwen3-30b-a3b"},
                              {"mixtral", "mixtral-8x7b"},
                              {"gpt-oss", "gpt-oss-120b"},
                              {"GLM4.5", "glm-4.5"},
                              {"Kimi_K2.5", "kimi-k2.5"}};
    for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++) {
        const epx_model *m = NULL;
        epx_error err = {0};
        if (epx_model_lookup(alias[i][0], &m, &err) != EPX_OK) fail_msg("%s", err.msg);
        assert_string_equal(m->name, alias[i][1]);
    }
}

/* The integer models.json holds under key, or `null_as` for null. */
static int32_t shared_int(const json_t *entry, const char *name, const char *key, int32_t null_as) {
    const json_t *v = json_object_get(entry, key);
    if (json_is_null(v)) return null_as;
    if (!json_is_integer(v)) fail_msg("models.json: %s has no integer '%s'", name, key);
    return (int32_t)json_integer_value(v);
}

/* The same numbers as shared/models.json, the shapes' source: every model
 * there is built in and every field agrees (n_group null: no groups, 1). */
static void builtins_equal_shared(void **state) {
    (void)state;
    const char *dir = tu_shared_dir();
    if (dir == NULL) skip();
    char path[4200];
    snprintf(path, sizeof path, "%s/models.json", dir);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (root == NULL) fail_msg("%s: %s", path, jerr.text);
    json_t *models = json_object_get(root, "models");
    assert_true(json_is_object(models));
    int32_t n = 0;
    epx_model_list(&n);
    assert_int_equal((int32_t)json_object_size(models), n);
    const char *name;
    json_t *e;
    json_object_foreach(models, name, e) {
        const epx_model *m = NULL;
        epx_error err = {0};
        if (epx_model_lookup(name, &m, &err) != EPX_OK) fail_msg("%s", err.msg);
        epx_model want = {name,
                          shared_int(e, name, "layers", 0),
                          shared_int(e, name, "first_k_dense", 0),
                          shared_int(e, name, "routed_experts", 0),
                          shared_int(e, name, "top_k", 0),
                          shared_int(e, name, "n_group", 1),
                          shared_int(e, name, "topk_group", 1),
                          shared_int(e, name, "shared_experts", 0),
                          shared_int(e, name, "hidden", 0),
                          shared_int(e, name, "moe_intermediate", 0)};
        assert_same_model(m, &want);
    }
    json_decref(root);
}

static void fixtures_equal_builtin(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof FIXTURES / sizeof FIXTURES[0]; i++) {
        char path[128];
        snprintf(path, sizeof path, "data/hf/%s", FIXTURES[i]);
        const epx_model *b = NULL;
        epx_model_info info;
        epx_error err = {0};
        assert_int_equal(epx_model_lookup(FIXTURES[i], &b, &err), EPX_OK);
        if (epx_model_from_config(path, &info, &err) != EPX_OK) fail_msg("%s: %s", path, err.msg);
        assert_same_model(&info.model, b);
        assert_ptr_equal(info.model.name, info.name);
        assert_string_equal(info.family, FAMILY[i]);
        assert_int_equal(info.from_config, 1);

        /* The routing rule read from the config is the MoE table's. */
        epx_moe_config from_name, from_path;
        assert_int_equal(epx_moe_model_config(FIXTURES[i], &from_name, &err), EPX_OK);
        if (epx_moe_model_config(path, &from_path, &err) != EPX_OK)
            fail_msg("%s: %s", path, err.msg);
        assert_memory_equal(&from_name, &from_path, sizeof from_name);
    }
}

static void path_forms(void **state) {
    (void)state;
    const char *forms[] = {"data/hf/deepseek-v3", "data/hf/deepseek-v3/",
                           "data/hf/deepseek-v3/config.json",
                           "./data/hf//deepseek-v3//config.json"};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        epx_model_info info;
        epx_error err = {0};
        if (epx_model_resolve(forms[i], &info, &err) != EPX_OK)
            fail_msg("%s: %s", forms[i], err.msg);
        assert_string_equal(info.name, "deepseek-v3");
        assert_int_equal(info.model.num_experts, 256);
    }
    /* A built-in name stays a name; an alias resolves to the canonical one. */
    epx_model_info info;
    epx_error err = {0};
    assert_int_equal(epx_model_resolve("Qwen3_235B", &info, &err), EPX_OK);
    assert_string_equal(info.model.name, "qwen3-235b-a22b");
    assert_string_equal(info.family, "built-in");
    assert_int_equal(info.from_config, 0);
    assert_int_equal(epx_model_resolve("no-such-model", &info, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "no-such-model", "kimi-k2", "config.json");
}

/* A folder <tmp>/<name>/ holding config.json with `text`; returns the
 * folder (caller frees). */
static char *write_config(const char *name, const char *text) {
    char *root = tu_tmp_path("-hf");
    assert_int_equal(mkdir(root, 0700), 0);
    char *dir = malloc(512), file[600];
    snprintf(dir, 512, "%s/%s", root, name);
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(file, sizeof file, "%s/config.json", dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    free(root);
    return dir;
}

static void remove_config(char *dir) {
    char file[600];
    snprintf(file, sizeof file, "%s/config.json", dir);
    unlink(file);
    rmdir(dir);
    char *slash = strrchr(dir, '/');
    *slash = '\0';
    rmdir(dir);
    free(dir);
}

/* Read `text` as a config; returns the status, fills info and err. */
static epx_status read_config(const char *name, const char *text, epx_model_info *info,
                              epx_error *err) {
    char *dir = write_config(name, text);
    epx_status st = epx_model_from_config(dir, info, err);
    remove_config(dir);
    return st;
}

static void family_keys(void **state) {
    (void)state;
    epx_model_info info;
    epx_error err = {0};
    /* Qwen: mlp_only_layers as a dense lead; a shared expert 4x as wide. */
    assert_int_equal(read_config("Qwen1.5-MoE-A2.7B",
                                 "{\"model_type\": \"qwen2_moe\", \"num_hidden_layers\": 24, "
                                 "\"hidden_size\": 2048, \"num_experts\": 60, "
                                 "\"num_experts_per_tok\": 4, \"moe_intermediate_size\": 1408, "
                                 "\"shared_expert_intermediate_size\": 5632, "
                                 "\"decoder_sparse_step\": 1, \"mlp_only_layers\": [0, 1]}",
                                 &info, &err),
                     EPX_OK);
    assert_string_equal(info.name, "qwen1.5-moe-a2.7b");
    assert_string_equal(info.family, "qwen-moe");
    assert_int_equal(info.model.first_k_dense, 2);
    assert_int_equal(info.model.shared_experts, 4);
    assert_int_equal(info.norm_topk_prob, 0);

    /* Llama-4 nested under text_config: one shared expert, no routing rule
     * for the MoE layer. */
    assert_int_equal(read_config("scout",
                                 "{\"model_type\": \"llama4\", \"text_config\": {\"model_type\": "
                                 "\"llama4_text\", \"num_hidden_layers\": 48, \"hidden_size\": "
                                 "5120, \"num_local_experts\": 16, \"num_experts_per_tok\": 1, "
                                 "\"intermediate_size\": 8192, \"interleave_moe_layer_step\": 1}}",
                                 &info, &err),
                     EPX_OK);
    assert_string_equal(info.family, "llama4");
    assert_int_equal(info.model.shared_experts, 1);
    assert_int_equal(info.scoring, -1);
    char *dir = write_config("scout", "{\"model_type\": \"llama4_text\", \"num_hidden_layers\": 4, "
                                      "\"hidden_size\": 64, \"num_local_experts\": 4, "
                                      "\"num_experts_per_tok\": 1, \"intermediate_size\": 32}");
    epx_moe_config cfg;
    assert_int_equal(epx_moe_model_config(dir, &cfg, &err), EPX_ERR_UNSUPPORTED);
    TU_MSG_HAS(err.msg, "llama4", "shape");
    remove_config(dir);

    /* No model_type, no architectures: the expert-count key decides. */
    assert_int_equal(read_config("anon",
                                 "{\"num_hidden_layers\": 4, \"hidden_size\": 64, "
                                 "\"n_routed_experts\": 16, \"num_experts_per_tok\": 2, "
                                 "\"moe_intermediate_size\": 32, \"first_k_dense_replace\": 1}",
                                 &info, &err),
                     EPX_OK);
    assert_string_equal(info.family, "deepseek");
    assert_int_equal(info.model.first_k_dense, 1);
    /* architectures alone. */
    assert_int_equal(read_config("arch",
                                 "{\"architectures\": [\"MixtralForCausalLM\"], "
                                 "\"num_hidden_layers\": 4, \"hidden_size\": 64, "
                                 "\"num_local_experts\": 8, \"num_experts_per_tok\": 2, "
                                 "\"intermediate_size\": 32}",
                                 &info, &err),
                     EPX_OK);
    assert_string_equal(info.family, "mixtral");
    assert_int_equal(info.norm_topk_prob, 1);
    assert_int_equal(read_config("arch",
                                 "{\"architectures\": [\"Qwen2MoeForCausalLM\"], "
                                 "\"num_hidden_layers\": 4, \"hidden_size\": 64, "
                                 "\"num_experts\": 8, \"num_experts_per_tok\": 2, "
                                 "\"moe_intermediate_size\": 32}",
                                 &info, &err),
                     EPX_OK);
    assert_string_equal(info.family, "qwen-moe");

    /* No scoring_func: DeepSeek-V3's descendants route by sigmoid (GLM-4.5's
     * config names none), DeepSeek-V2 by softmax. */
    const char *types[][2] = {{"glm4_moe", "1"}, {"kimi_k2", "1"}, {"deepseek_v2", "0"}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        char text[300];
        snprintf(text, sizeof text,
                 "{\"model_type\": \"%s\", \"num_hidden_layers\": 4, \"hidden_size\": 64, "
                 "\"n_routed_experts\": 16, \"num_experts_per_tok\": 2, "
                 "\"moe_intermediate_size\": 32}",
                 types[i][0]);
        assert_int_equal(read_config("ds", text, &info, &err), EPX_OK);
        assert_int_equal(info.scoring, atoi(types[i][1]));
    }

    /* A scoring rule epx lacks: the shape reads, the MoE layer refuses. */
    dir = write_config("v4", "{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 4, "
                             "\"hidden_size\": 64, \"n_routed_experts\": 16, "
                             "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, "
                             "\"scoring_func\": \"sqrtsoftplus\"}");
    assert_int_equal(epx_model_from_config(dir, &info, &err), EPX_OK);
    assert_int_equal(info.scoring, -1);
    assert_int_equal(epx_moe_model_config(dir, &cfg, &err), EPX_ERR_UNSUPPORTED);
    TU_MSG_HAS(err.msg, "'v4'", "scoring_func");
    remove_config(dir);
}

static void refusals(void **state) {
    (void)state;
    epx_model_info info;
    epx_error err = {0};
    assert_int_equal(epx_model_from_config("data/hf/no-such-model", &info, &err), EPX_ERR_IO);
    TU_MSG_HAS(err.msg, "data/hf/no-such-model", "config.json");
    assert_int_equal(epx_model_resolve("data/hf", &info, &err), EPX_ERR_IO);
    TU_MSG_HAS(err.msg, "'data/hf'", "holds no config.json");
    assert_int_equal(epx_model_from_config(NULL, &info, &err), EPX_ERR_INVALID_ARG);

    struct {
        const char *text;
        epx_status st;
        const char *needle[3];
    } cases[] = {
        {"[1, 2]", EPX_ERR_PARSE, {"must be a JSON object", "config.json", NULL}},
        {"{\"model_type\": \"deepseek_v3\"", EPX_ERR_PARSE, {"not valid JSON", "line", NULL}},
        {"{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 61, \"hidden_size\": 7168, "
         "\"num_experts_per_tok\": 8, \"moe_intermediate_size\": 2048}",
         EPX_ERR_PARSE,
         {"no 'n_routed_experts'", "deepseek", "model_type 'deepseek_v3'"}},
        {"{\"model_type\": \"kimi_k25\", \"text_config\": {\"model_type\": \"kimi_k2\", "
         "\"num_hidden_layers\": 61, \"n_routed_experts\": 384}}",
         EPX_ERR_PARSE,
         {"no 'hidden_size' (under text_config)", "deepseek", NULL}},
        {"{\"model_type\": \"mixtral\", \"num_hidden_layers\": \"32\", \"hidden_size\": 4096}",
         EPX_ERR_PARSE,
         {"'num_hidden_layers'", "\"32\"", "plain JSON integer"}},
        {"{\"model_type\": \"mixtral\", \"num_hidden_layers\": 32, \"hidden_size\": -4096}",
         EPX_ERR_PARSE,
         {"'hidden_size'", "-4096", "mixtral"}},
        {"{\"model_type\": \"mixtral\", \"num_hidden_layers\": 32, \"hidden_size\": 4096.5}",
         EPX_ERR_PARSE,
         {"'hidden_size'", "4096.5", NULL}},
        {"{\"model_type\": \"mixtral\", \"num_hidden_layers\": 32, \"hidden_size\": 4096, "
         "\"num_local_experts\": 8, \"num_experts_per_tok\": 9, \"intermediate_size\": 1}",
         EPX_ERR_SHAPE,
         {"9 experts of 8", NULL, NULL}},
        {"{\"model_type\": \"deepseek_v2\", \"num_hidden_layers\": 4, \"hidden_size\": 64, "
         "\"n_routed_experts\": 16, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, "
         "\"moe_layer_freq\": 2}",
         EPX_ERR_UNSUPPORTED,
         {"'moe_layer_freq'", "is 2", NULL}},
        {"{\"model_type\": \"qwen3_moe\", \"num_hidden_layers\": 4, \"hidden_size\": 64, "
         "\"num_experts\": 16, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, "
         "\"mlp_only_layers\": [3]}",
         EPX_ERR_UNSUPPORTED,
         {"'mlp_only_layers'", "leading run", NULL}},
        {"{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 4, \"hidden_size\": 64, "
         "\"n_routed_experts\": 16, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, "
         "\"n_group\": 3}",
         EPX_ERR_SHAPE,
         {"n_group 3", NULL, NULL}},
        {"{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 4, \"hidden_size\": 64, "
         "\"n_routed_experts\": 16, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, "
         "\"first_k_dense_replace\": 4}",
         EPX_ERR_SHAPE,
         {"4 dense layers of 4", NULL, NULL}},
        {"{\"num_hidden_layers\": 4}", EPX_ERR_PARSE, {"no 'hidden_size'", "model_type", NULL}},
        {"{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 4, \"hidden_size\": 64, "
         "\"n_routed_experts\": 16, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, "
         "\"routed_scaling_factor\": \"2.5\"}",
         EPX_ERR_PARSE,
         {"'routed_scaling_factor'", "not a number", "2.5"}},
        /* issue 29: values checked as what they are, against the README's limits */
        {"{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 4, \"hidden_size\": 64, "
         "\"n_routed_experts\": 16, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, "
         "\"routed_scaling_factor\": 1e39}",
         EPX_ERR_PARSE,
         {"'routed_scaling_factor'", "1e+39", "positive float32"}},
        {"{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 4, \"hidden_size\": 64, "
         "\"n_routed_experts\": 16, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, "
         "\"routed_scaling_factor\": 1e-50}",
         EPX_ERR_PARSE,
         {"'routed_scaling_factor'", "1e-50", "positive float32"}},
        {"{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 65537, \"hidden_size\": 64, "
         "\"n_routed_experts\": 16, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32}",
         EPX_ERR_PARSE,
         {"'num_hidden_layers'", "65537", "[1, 65536] (EPX_MAX_LAYERS)"}},
        {"{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 4, \"hidden_size\": 64, "
         "\"n_routed_experts\": 1048577, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": "
         "32}",
         EPX_ERR_PARSE,
         {"'n_routed_experts'", "1048577", "(EPX_MAX_EXPERTS)"}},
        {"{\"model_type\": \"gpt_oss\", \"num_hidden_layers\": 4, \"hidden_size\": 64, "
         "\"num_local_experts\": 16, \"experts_per_token\": 2147483647, "
         "\"num_experts_per_tok\": 2, \"intermediate_size\": 32}",
         EPX_ERR_PARSE,
         {"'experts_per_token' 2147483647", "'num_experts_per_tok' 2", "disagree"}},
        {"{\"model_type\": \"qwen3_moe\", \"num_hidden_layers\": 4, \"hidden_size\": 64, "
         "\"num_experts\": 16, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, "
         "\"mlp_only_layers\": [\"0\"]}",
         EPX_ERR_PARSE,
         {"'mlp_only_layers'", "\"0\" at index 0", "not a layer index"}},
        {"{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 4, \"hidden_size\": 64, "
         "\"n_routed_experts\": 16, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, "
         "\"norm_topk_prob\": \"yes\"}",
         EPX_ERR_PARSE,
         {"'norm_topk_prob'", "not a boolean", "true or false"}},
        {"{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 4, \"hidden_size\": 64, "
         "\"n_routed_experts\": 16, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, "
         "\"n_group\": true}",
         EPX_ERR_PARSE,
         {"'n_group'", "is true (a boolean)", NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err = (epx_error){0};
        epx_status st = read_config("bad", cases[i].text, &info, &err);
        if (st != cases[i].st)
            fail_msg("case %zu: status %d, wanted %d: %s", i, (int)st, (int)cases[i].st, err.msg);
        for (int k = 0; k < 3 && cases[i].needle[k]; k++) TU_MSG_HAS(err.msg, cases[i].needle[k]);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        /* First: the table must not have been built yet. */
        cmocka_unit_test(builtins_once_from_threads),
        cmocka_unit_test(builtins_read_as_today),
        cmocka_unit_test(builtins_equal_shared),
        cmocka_unit_test(fixtures_equal_builtin),
        cmocka_unit_test(path_forms),
        cmocka_unit_test(family_keys),
        cmocka_unit_test(refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
