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

#endif /* EPX_MODEL_H */
