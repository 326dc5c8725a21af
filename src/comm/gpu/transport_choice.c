/*
 * transport_choice.c - which transport the low-latency engine uses, and the
 * check at connect that every rank agrees and can reach every other
 * (transport.h). No CUDA here: the GPU facts come in as arguments.
 */
#include "transport.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

const char *epxi_transport_kind_name(int32_t kind) {
    switch (kind) {
    case EPXI_TR_AUTO: return "auto";
    case EPXI_TR_PEER: return "peer";
    case EPXI_TR_HOST: return "host";
    case EPXI_TR_NCCL: return "nccl";
    default: return "unknown";
    }
}

static const char kChoices[] = "auto, peer (or ipc), host, nccl";

static epx_status unsupported_nccl(const char *where, epx_error *err) {
    return epxi_fail(err, EPX_ERR_UNSUPPORTED,
                     "GPU EP transport nccl (%s): the NCCL transport needs an ncclComm_t, so it "
                     "is created by epx_gpu_ep_create_nccl (epx_comm_nccl.h; epx bench comm "
                     "--transport nccl), not by epx_gpu_ep_open/create",
                     where);
}

epx_status epxi_transport_resolve(int32_t requested, const char *env, int unreachable_gpu,
                                  int32_t *kind, epx_error *err) {
    if (requested < EPXI_TR_AUTO || requested > EPXI_TR_NCCL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "GPU EP opts transport %d names no transport: use "
                         "EPX_GPU_EP_TRANSPORT_AUTO (0), _PEER (1), _HOST (2) or _NCCL (3)",
                         requested);
    if (requested == EPXI_TR_NCCL) return unsupported_nccl("opts.transport", err);
    if (requested != EPXI_TR_AUTO) {
        *kind = requested;
        return EPX_OK;
    }
    if (env != NULL && env[0] != '\0') {
        if (strcasecmp(env, "peer") == 0 || strcasecmp(env, "ipc") == 0) {
            *kind = EPXI_TR_PEER;
            return EPX_OK;
        }
        if (strcasecmp(env, "host") == 0) {
            *kind = EPXI_TR_HOST;
            return EPX_OK;
        }
        if (strcasecmp(env, "nccl") == 0) return unsupported_nccl("EPX_GPU_EP_TRANSPORT", err);
        if (strcasecmp(env, "auto") != 0)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "EPX_GPU_EP_TRANSPORT='%.64s' names no transport: use one of %s", env,
                             kChoices);
    }
    /* GPUs that cannot map each other: device memory would fail at connect
     * (or the first IPC mapping), host memory works. */
    *kind = unreachable_gpu >= 0 ? EPXI_TR_HOST : EPXI_TR_PEER;
    return EPX_OK;
}

epx_status epxi_transport_check(int32_t R, int32_t me, const epxi_tr_rank *ranks, epx_error *err) {
    const epxi_tr_rank *m = &ranks[me];
    for (int32_t r = 0; r < R; r++) {
        const epxi_tr_rank *p = &ranks[r];
        if (p->kind != m->kind)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "GPU EP connect: rank %d opened with the %s transport but rank %d "
                             "with %s (AUTO picks host where a process sees GPUs without peer "
                             "access): set EPX_GPU_EP_TRANSPORT (or opts.transport) to the same "
                             "value on every rank",
                             me, epxi_transport_kind_name(m->kind), r,
                             epxi_transport_kind_name(p->kind));
        if (p->host != m->host)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "GPU EP connect: rank %d runs on another host than rank %d: the %s "
                             "transport reaches only ranks of one host; across hosts create the "
                             "engine with the NCCL transport (epx_gpu_ep_create_nccl)",
                             r, me, epxi_transport_kind_name(m->kind));
        if (m->kind == EPXI_TR_PEER && !p->same_gpu && p->reach == 0)
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "GPU EP connect: GPU %d (rank %d) cannot reach GPU %d (rank %d) by "
                             "peer access (cudaDeviceCanAccessPeer is 0), so the peer transport "
                             "cannot work here: set EPX_GPU_EP_TRANSPORT=host (pinned host "
                             "memory) on every rank",
                             m->device, me, p->device, r);
    }
    return EPX_OK;
}

uint64_t epxi_host_id(void) {
    char buf[128] = {0};
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    size_t n = 0;
    if (f != NULL) {
        n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
    }
    if (n == 0 && gethostname(buf, sizeof buf - 1) != 0) buf[0] = '\0';
    /* FNV-1a: any stable hash; equal text gives an equal id */
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *c = (const unsigned char *)buf; *c; c++)
        h = (h ^ *c) * 1099511628211ull;
    return h;
}

epxi_ll_shape epxi_ll_shape_of(const epx_ep_config *c, int32_t R) {
    epxi_ll_shape p;
    memset(&p, 0, sizeof p); /* padding too: shapes travel as bytes */
    p.ranks = R;
    p.hidden = c->hidden;
    p.top_k = c->top_k;
    p.num_slots = c->num_slots;
    p.x_dtype = (int32_t)c->x_dtype;
    p.y_dtype = (int32_t)c->y_dtype;
    p.max_tokens = c->max_tokens;
    p.mode = (int32_t)c->mode;
    return p;
}

void epxi_ll_shape_describe(const epxi_ll_shape *p, char *out, size_t n) {
    snprintf(out, n,
             "hidden %d, top_k %d, num_slots %d, max_tokens %lld, dtypes %d/%d, %d ranks, %s mode",
             p->hidden, p->top_k, p->num_slots, (long long)p->max_tokens, p->x_dtype, p->y_dtype,
             p->ranks, p->mode == EPX_EP_MODE_LOW_LATENCY ? "low-latency" : "normal");
}
