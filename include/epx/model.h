/*
 * epx/model.h - the MoE shapes of public models, built in (core's model
 * table, src/core/models.c), and their lookup by name. The trace generator
 * (epx/trace.h), the MoE reference layer (epx/moe.h) and the CLI name models
 * through it. Include epx.h, not this file.
 */
#ifndef EPX_MODEL_H
#define EPX_MODEL_H

/*
 * The MoE shape of a public model, from its published config.json. A plain
 * descriptor; the built-in table lives for the process.
 */
typedef struct epx_model {
    const char *name;         /* canonical, lower case: "kimi-k2" */
    int32_t num_layers;       /* every decoder layer, dense ones included */
    int32_t first_k_dense;    /* leading layers without routed experts */
    int32_t num_experts;      /* routed (logical) experts per MoE layer, E */
    int32_t top_k;            /* experts per token */
    int32_t num_groups;       /* expert groups for group-limited routing; 1 if none */
    int32_t topk_group;       /* groups a token may use; 1 if none */
    int32_t shared_experts;   /* always-on experts (not placed by EP) */
    int32_t hidden;           /* hidden size */
    int32_t moe_intermediate; /* intermediate size of one routed expert */
} epx_model;

/*
 * Find a built-in model by name: case-insensitive, '_' and '-' alike, and
 * short aliases ("qwen3-235b" for "qwen3-235b-a22b", "mixtral", "gpt-oss").
 * Args:    name (in) NUL-terminated; out (out) points into the built-in table.
 * Returns: EPX_OK; EPX_ERR_INVALID_ARG for an unknown name (the message lists
 *          the known ones).
 * Thread:  any thread.
 */
EPX_API epx_status epx_model_lookup(const char *name, const epx_model **out, epx_error *err);

/* The built-in table: *count entries, canonical names, never NULL. */
EPX_API const epx_model *epx_model_list(int32_t *count);

/*
 * A model read from a HuggingFace config.json (or resolved by name): the
 * shape, the family it was read as and the routing rule its config states.
 * model.name points at name[] below (or into the built-in table), so copy
 * the whole struct only if you re-point model.name.
 */
typedef struct epx_model_info {
    epx_model model;
    char name[64];       /* canonical built-in name, or the folder / file name */
    char family[16];     /* "deepseek", "qwen-moe", "mixtral", "gpt-oss", "llama4",
                      * "built-in" for a name from the table */
    int32_t from_config; /* 1: read from a config.json; 0: the built-in table */
    /* The routing rule stated by the config (from_config only): scoring is
     * an epx_moe_scoring value (epx/moe.h: 0 softmax, 1 sigmoid, 2 softmax
     * over the top-k) or -1 when epx has no such rule (Llama-4, a
     * scoring_func other than softmax or sigmoid). */
    int32_t scoring;
    float routed_scaling_factor; /* 1 when the config names none */
    int32_t norm_topk_prob;      /* nonzero: top-k weights renormalised */
} epx_model_info;

/*
 * Read a model's MoE shape from a HuggingFace config.json. path is the file
 * or a folder holding config.json. The language model is read from
 * text_config when the top level nests it there (Kimi-K2.5, multimodal
 * releases). The family comes from model_type, then architectures, then the
 * expert-count key present:
 *   deepseek  (deepseek_v2/v3, kimi_k2/k25, glm4_moe): n_routed_experts,
 *             num_experts_per_tok, moe_intermediate_size; optional
 *             first_k_dense_replace, moe_layer_freq (must be 1), n_group,
 *             topk_group, n_shared_experts, scoring_func,
 *             routed_scaling_factor, norm_topk_prob;
 *   qwen-moe  (qwen2_moe, qwen3_moe, qwen3_next): num_experts, num_experts_per_tok,
 *             moe_intermediate_size; optional decoder_sparse_step (must be
 *             1), mlp_only_layers (must be 0..k-1: the dense lead),
 *             shared_expert_intermediate_size, norm_topk_prob;
 *   mixtral, gpt-oss: num_local_experts, num_experts_per_tok (gpt-oss also
 *             experts_per_token), intermediate_size;
 *   llama4    (llama4, llama4_text): as mixtral, plus one shared expert;
 *             interleave_moe_layer_step must be 1.
 * Every family needs num_hidden_layers and hidden_size. The name is the
 * folder's (or the file's, less .json), lower case, mapped to the built-in
 * name when it is one or an alias of one.
 * Args:    path (in) NUL-terminated; info (out) filled on EPX_OK.
 * Returns: EPX_OK; EPX_ERR_IO (no such path, a folder without config.json);
 *          EPX_ERR_PARSE (not JSON, not an object, a key missing or not a
 *          non-negative integer: the message names the key, the value, the
 *          family it was read as and the fix); EPX_ERR_SHAPE (values that
 *          disagree, e.g. top-k above the experts); EPX_ERR_UNSUPPORTED
 *          (interleaved MoE layers).
 * Thread:  any thread.
 */
EPX_API epx_status epx_model_from_config(const char *path, epx_model_info *info, epx_error *err);

/*
 * A built-in name or a config path, as the CLI's --model takes it: a
 * string with a '/', ending in ".json", or naming no built-in model but an
 * existing file or folder is a path (epx_model_from_config); anything else
 * is a name (epx_model_lookup, copied into info with from_config = 0).
 * Returns: the statuses of those two functions.
 */
EPX_API epx_status epx_model_resolve(const char *name_or_path, epx_model_info *info,
                                     epx_error *err);

#endif /* EPX_MODEL_H */
