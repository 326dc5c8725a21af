/*
 * fuzz_model_config.c - libFuzzer target for the HuggingFace config.json
 * reader (epx_model_from_config), through a temporary file as --model PATH
 * reads it.
 *
 * Oracles: the same bytes read twice give the same status, message and
 * model; every failure has a message; and an accepted model is a shape the
 * rest of epx can use: at least one MoE layer after the dense lead, top-k
 * within the experts, groups that divide the experts and a kept-group count
 * within them, positive sizes, a known scoring rule, and model.name naming
 * the info's own name.
 */
#include <stdio.h>
#include <string.h>

#include "epx.h"

#include "fuzz_util.h"

static epx_status read_config(const uint8_t *data, size_t size, epx_model_info *info,
                              epx_error *err) {
    FILE *f = fopen(json_path, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(data, 1, size, f) == size);
    CHECK(fclose(f) == 0);
    return epx_model_from_config(json_path, info, err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1 << 20)) return 0;
    temp_paths("model");
    epx_model_info a, b;
    epx_error ea = {0}, eb = {0};
    epx_status sa = read_config(data, size, &a, &ea);
    epx_status sb = read_config(data, size, &b, &eb);
    CHECK(sa == sb && strcmp(ea.msg, eb.msg) == 0);
    if (sa != EPX_OK) {
        CHECK(ea.msg[0] != '\0');
        return 0;
    }
    const epx_model *m = &a.model;
    CHECK(m->name == a.name && strcmp(a.name, b.name) == 0 && strcmp(a.family, b.family) == 0);
    CHECK(m->num_layers == b.model.num_layers && m->num_experts == b.model.num_experts);
    CHECK(m->num_layers >= 1 && m->first_k_dense >= 0 && m->first_k_dense < m->num_layers);
    CHECK(m->num_experts >= 1 && m->top_k >= 1 && m->top_k <= m->num_experts);
    CHECK(m->num_groups >= 1 && m->num_experts % m->num_groups == 0);
    CHECK(m->topk_group >= 1 && m->topk_group <= m->num_groups);
    CHECK(m->hidden >= 1 && m->moe_intermediate >= 1 && m->shared_experts >= 0);
    CHECK(a.from_config == 1 && a.scoring >= -1 && a.scoring <= 2);
    CHECK(a.routed_scaling_factor > 0.0f);
    return 0;
}
