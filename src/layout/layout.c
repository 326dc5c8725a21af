/*
 * layout.c - the expert layout handle (SGLang's ExpertLocationMetadata).
 *
 * physical_to_logical [L][P] is the one source of truth. The derived maps
 * (logical_to_all_physical [L][E][W] ascending and -1 padded, num_valid
 * [L][E]) are rebuilt from it layer by layer, inside buffers allocated once
 * at creation: W = P - E + 1 is the most replicas an expert can have while
 * every expert has one, so an update never needs a larger buffer, and every
 * view handed out stays valid for the handle's lifetime.
 */
#include "layout_internal.h"

#include <string.h>

struct epx_layout {
    epx_shape shape;
    int32_t width;        /* W = P - E + 1 */
    int32_t *phys_to_log; /* [L][P] */
    int32_t *log_to_phys; /* [L][E][W], ascending, -1 padded */
    int32_t *num_valid;   /* [L][E] */
};

static size_t layer_slots(const epx_layout *lay) { return (size_t)lay->shape.num_physical_experts; }
static size_t layer_cells(const epx_layout *lay) {
    return (size_t)lay->shape.num_logical_experts * (size_t)lay->width;
}

/*
 * Check one layer's row and, only when it is valid, rebuild its derived maps.
 * Validation happens first so a bad row never leaves half-written views.
 */
static epx_status check_layer_row(const epx_shape *s, int32_t layer, const int32_t *row,
                                  int32_t *count_scratch, epx_error *err) {
    const int32_t E = s->num_logical_experts, P = s->num_physical_experts;
    memset(count_scratch, 0, (size_t)E * sizeof *count_scratch);
    for (int32_t p = 0; p < P; p++) {
        int32_t id = row[p];
        if (id < 0 || id >= E)
            return epxi_fail(err, EPX_ERR_INVALID_MAP,
                             "layer %d, slot %d (GPU %d) holds logical expert %d, outside [0, %d): "
                             "the map is for a model of more than %d experts, or is damaged",
                             layer, p, p / (P / s->num_gpus), id, E, E);
        count_scratch[id]++;
    }
    for (int32_t e = 0; e < E; e++)
        if (count_scratch[e] == 0)
            return epxi_fail(err, EPX_ERR_INVALID_MAP,
                             "layer %d: logical expert %d has no replica in any of the %d slots: "
                             "every logical expert needs at least one slot (tokens routed to it "
                             "would have nowhere to go)",
                             layer, e, P);
    return EPX_OK;
}

static void derive_layer(epx_layout *lay, int32_t layer) {
    const int32_t E = lay->shape.num_logical_experts, P = lay->shape.num_physical_experts;
    const int32_t W = lay->width;
    const int32_t *row = lay->phys_to_log + (size_t)layer * layer_slots(lay);
    int32_t *l2p = lay->log_to_phys + (size_t)layer * layer_cells(lay);
    int32_t *nv = lay->num_valid + (size_t)layer * (size_t)E;
    memset(nv, 0, (size_t)E * sizeof *nv);
    for (size_t i = 0; i < (size_t)E * (size_t)W; i++) l2p[i] = -1;
    /* Ascending slot order falls out of scanning p upwards. */
    for (int32_t p = 0; p < P; p++) {
        int32_t e = row[p];
        l2p[(size_t)e * (size_t)W + (size_t)nv[e]] = p;
        nv[e]++;
    }
}

/* The shape must have passed epx_shape_check. */
static epx_status layout_alloc(const epx_shape *shape, epx_layout **out, epx_error *err) {
    epx_layout *lay = epxi_calloc(1, sizeof *lay, "layout", err);
    if (lay == NULL) return EPX_ERR_NOMEM;
    lay->shape = *shape;
    lay->width = shape->num_physical_experts - shape->num_logical_experts + 1;
    const size_t L = (size_t)shape->num_layers;
    lay->phys_to_log =
        epxi_calloc(L * layer_slots(lay), sizeof(int32_t), "physical_to_logical", err);
    lay->log_to_phys = lay->phys_to_log ? epxi_calloc(L * layer_cells(lay), sizeof(int32_t),
                                                      "logical_to_all_physical", err)
                                        : NULL;
    lay->num_valid = lay->log_to_phys ? epxi_calloc(L * (size_t)shape->num_logical_experts,
                                                    sizeof(int32_t), "num_valid", err)
                                      : NULL;
    if (lay->num_valid == NULL) {
        epx_layout_destroy(lay);
        return EPX_ERR_NOMEM;
    }
    *out = lay;
    return EPX_OK;
}

epx_status epx_layout_create_from_map(const epx_shape *shape, const int32_t *map, epx_layout **out,
                                      epx_error *err) {
    if (map == NULL || out == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "physical_to_logical map or out is NULL");
    EPX_TRY(epx_shape_check(shape, err));
    return epxi_layout_create_checked(shape, map, out, err);
}

epx_status epxi_layout_create_checked(const epx_shape *shape, const int32_t *map, epx_layout **out,
                                      epx_error *err) {
    epx_layout *lay = NULL;
    EPX_TRY(layout_alloc(shape, &lay, err));
    /* num_valid of layer 0 doubles as scratch for the checks: derive_layer
     * overwrites it afterwards. */
    for (int32_t l = 0; l < shape->num_layers; l++) {
        const int32_t *row = map + (size_t)l * layer_slots(lay);
        epx_status st = check_layer_row(shape, l, row, lay->num_valid, err);
        if (st != EPX_OK) {
            epx_layout_destroy(lay);
            return st;
        }
    }
    memcpy(lay->phys_to_log, map, (size_t)shape->num_layers * layer_slots(lay) * sizeof(int32_t));
    for (int32_t l = 0; l < shape->num_layers; l++) derive_layer(lay, l);
    *out = lay;
    return EPX_OK;
}

epx_status epx_layout_create_trivial(const epx_shape *shape, epx_layout **out, epx_error *err) {
    if (out == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "out is NULL");
    EPX_TRY(epx_shape_check(shape, err));
    epx_layout *lay = NULL;
    EPX_TRY(layout_alloc(shape, &lay, err));
    const int32_t P = shape->num_physical_experts, E = shape->num_logical_experts;
    for (int32_t l = 0; l < shape->num_layers; l++) {
        int32_t *row = lay->phys_to_log + (size_t)l * (size_t)P;
        for (int32_t p = 0; p < P; p++) row[p] = p % E;
        derive_layer(lay, l);
    }
    *out = lay;
    return EPX_OK;
}

void epx_layout_destroy(epx_layout *lay) {
    if (lay == NULL) return;
    free(lay->phys_to_log);
    free(lay->log_to_phys);
    free(lay->num_valid);
    free(lay);
}

epx_status epx_layout_clone(const epx_layout *src, epx_layout **out, epx_error *err) {
    if (src == NULL || out == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    return epx_layout_create_from_map(&src->shape, src->phys_to_log, out, err);
}

epx_status epx_layout_update(epx_layout *dst, const epx_layout *src, const uint8_t *layers,
                             epx_error *err) {
    if (dst == NULL || src == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL layout");
    const epx_shape *a = &dst->shape, *b = &src->shape;
    EPX_TRY(epxi_check_same_shape(a, b, "cannot update a layout of shape ", " from one of shape ",
                                  ": shapes must agree (an update swaps contents in place and "
                                  "never reallocates)",
                                  err));
    /* src was validated when it was built, so the copy cannot break dst. */
    for (int32_t l = 0; l < a->num_layers; l++) {
        if (layers != NULL && !layers[l]) continue;
        size_t o = (size_t)l * layer_slots(dst);
        memcpy(dst->phys_to_log + o, src->phys_to_log + o, layer_slots(dst) * sizeof(int32_t));
        o = (size_t)l * layer_cells(dst);
        memcpy(dst->log_to_phys + o, src->log_to_phys + o, layer_cells(dst) * sizeof(int32_t));
        o = (size_t)l * (size_t)a->num_logical_experts;
        memcpy(dst->num_valid + o, src->num_valid + o,
               (size_t)a->num_logical_experts * sizeof(int32_t));
    }
    return EPX_OK;
}

/* The getters answer NULL (and width 0) for a NULL handle, as their
 * siblings (epx_layout_max_replicas, epx_layout_gpu_slots) do. */
const epx_shape *epx_layout_shape(const epx_layout *lay) { return lay ? &lay->shape : NULL; }
const int32_t *epx_layout_physical_to_logical(const epx_layout *lay) {
    return lay ? lay->phys_to_log : NULL;
}
const int32_t *epx_layout_num_valid(const epx_layout *lay) { return lay ? lay->num_valid : NULL; }

const int32_t *epx_layout_logical_to_all_physical(const epx_layout *lay, int32_t *width) {
    if (width != NULL) *width = lay ? lay->width : 0;
    return lay ? lay->log_to_phys : NULL;
}

int32_t epx_layout_max_replicas(const epx_layout *lay) {
    if (lay == NULL) return 0;
    int32_t m = 0;
    size_t n = (size_t)lay->shape.num_layers * (size_t)lay->shape.num_logical_experts;
    for (size_t i = 0; i < n; i++)
        if (lay->num_valid[i] > m) m = lay->num_valid[i];
    return m;
}

epx_status epx_layout_export_logical_to_all_physical(const epx_layout *lay, int32_t width,
                                                     int32_t *out, epx_error *err) {
    if (lay == NULL || out == NULL) return epxi_fail(err, EPX_ERR_INVALID_ARG, "NULL argument");
    int32_t need = epx_layout_max_replicas(lay);
    if (width < need)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "width %d is below the largest replica count %d: use width >= %d "
                         "(SGLang uses P = %d)",
                         width, need, need, lay->shape.num_physical_experts);
    size_t cells = (size_t)lay->shape.num_layers * (size_t)lay->shape.num_logical_experts;
    for (size_t c = 0; c < cells; c++) {
        const int32_t *src = lay->log_to_phys + c * (size_t)lay->width;
        int32_t *dst = out + c * (size_t)width;
        for (int32_t x = 0; x < width; x++) dst[x] = x < lay->width ? src[x] : -1;
    }
    return EPX_OK;
}

const int32_t *epx_layout_gpu_slots(const epx_layout *lay, int32_t layer, int32_t gpu) {
    if (lay == NULL || layer < 0 || layer >= lay->shape.num_layers || gpu < 0 ||
        gpu >= lay->shape.num_gpus)
        return NULL;
    int32_t spg = epx_shape_slots_per_gpu(&lay->shape);
    return lay->phys_to_log + (size_t)layer * layer_slots(lay) + (size_t)gpu * (size_t)spg;
}

const int32_t *epx_layout_node_slots(const epx_layout *lay, int32_t layer, int32_t node) {
    if (lay == NULL || layer < 0 || layer >= lay->shape.num_layers || node < 0 ||
        node >= lay->shape.num_nodes)
        return NULL;
    int32_t spn = lay->shape.num_physical_experts / lay->shape.num_nodes;
    return lay->phys_to_log + (size_t)layer * layer_slots(lay) + (size_t)node * (size_t)spn;
}

int32_t epx_layout_replicas_on_gpu(const epx_layout *lay, int32_t layer, int32_t gpu,
                                   int32_t expert) {
    const int32_t *slots = epx_layout_gpu_slots(lay, layer, gpu);
    if (slots == NULL || expert < 0 || expert >= lay->shape.num_logical_experts) return -1;
    int32_t n = 0, spg = epx_shape_slots_per_gpu(&lay->shape);
    for (int32_t i = 0; i < spg; i++) n += slots[i] == expert;
    return n;
}
