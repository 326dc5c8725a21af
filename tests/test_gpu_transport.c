/*
 * test_gpu_transport.c - what the low-latency engine's transports decide and
 * keep without a GPU (src/comm/gpu/transport.h, shm_segment.h):
 *   - the transport a rank opens with (option, EPX_GPU_EP_TRANSPORT, the
 *     peer-access rule) and the refusals naming the value and the choices;
 *   - connect's check over faked ranks: a mix of transports, another host,
 *     GPUs without peer access under the peer transport;
 *   - the host transport's shared segments: data shared across processes,
 *     the name gone once every user counted in, gone after the owner closes,
 *     and a dead owner's leftover swept by the next creation; no litter in
 *     /dev/shm from this process at the end.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/comm/gpu/transport.h"
#include "testutil.h"

static bool shm_exists(const char *name) {
    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    return access(path, F_OK) == 0;
}

static void resolve_rules(void **state) {
    (void)state;
    epx_error err = {0};
    int32_t kind = -1;
    /* an explicit option wins over the environment */
    assert_int_equal(epxi_transport_resolve(EPXI_TR_HOST, "peer", -1, &kind, &err), EPX_OK);
    assert_int_equal(kind, EPXI_TR_HOST);
    assert_int_equal(epxi_transport_resolve(EPXI_TR_PEER, NULL, 3, &kind, &err), EPX_OK);
    assert_int_equal(kind, EPXI_TR_PEER);
    /* AUTO: the environment, in any case, then the peer-access rule */
    const struct {
        const char *env;
        int unreachable;
        int32_t want;
    } ok[] = {
        {"host", -1, EPXI_TR_HOST}, {"HOST", -1, EPXI_TR_HOST}, {"ipc", 2, EPXI_TR_PEER},
        {"peer", 2, EPXI_TR_PEER},  {"auto", 1, EPXI_TR_HOST},  {"", -1, EPXI_TR_PEER},
        {NULL, -1, EPXI_TR_PEER},   {NULL, 0, EPXI_TR_HOST},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        kind = -1;
        assert_int_equal(
            epxi_transport_resolve(EPXI_TR_AUTO, ok[i].env, ok[i].unreachable, &kind, &err),
            EPX_OK);
        assert_int_equal(kind, ok[i].want);
    }
    assert_int_equal(epxi_transport_resolve(0, "nvlink", -1, &kind, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "EPX_GPU_EP_TRANSPORT='nvlink'", "peer", "host");
    assert_int_equal(epxi_transport_resolve(7, NULL, -1, &kind, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "transport 7", "EPX_GPU_EP_TRANSPORT_AUTO", "_HOST");
    assert_int_equal(epxi_transport_resolve(-1, NULL, -1, &kind, &err), EPX_ERR_INVALID_ARG);
    assert_int_equal(epxi_transport_resolve(0, "nccl", -1, &kind, &err), EPX_ERR_UNSUPPORTED);
    TU_MSG_HAS(err.msg, "nccl", "epx_gpu_ep_create_nccl");
    assert_int_equal(epxi_transport_resolve(EPXI_TR_NCCL, NULL, -1, &kind, &err),
                     EPX_ERR_UNSUPPORTED);
    assert_string_equal(epxi_transport_kind_name(EPXI_TR_HOST), "host");
    assert_string_equal(epxi_transport_kind_name(42), "unknown");
}

/* Four ranks of one host on two GPUs, each seen by the checker. */
static void four_ranks(epxi_tr_rank t[4], int32_t kind) {
    memset(t, 0, 4 * sizeof *t);
    for (int r = 0; r < 4; r++) {
        t[r].kind = kind;
        t[r].host = 77;
        t[r].device = r % 2;
        t[r].same_gpu = r % 2 == 0;
        t[r].reach = 1;
    }
}

static void check_rules(void **state) {
    (void)state;
    epx_error err = {0};
    epxi_tr_rank t[4];
    four_ranks(t, EPXI_TR_PEER);
    assert_int_equal(epxi_transport_check(4, 0, t, &err), EPX_OK);
    t[3].reach = -1; /* not visible here: CUDA IPC will say */
    assert_int_equal(epxi_transport_check(4, 0, t, &err), EPX_OK);
    t[3].reach = 0; /* no peer access under the peer transport */
    assert_int_equal(epxi_transport_check(4, 0, t, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "GPU 0 (rank 0)", "GPU 1 (rank 3)", "cudaDeviceCanAccessPeer",
               "EPX_GPU_EP_TRANSPORT=host");
    /* the same GPUs under the host transport are fine */
    four_ranks(t, EPXI_TR_HOST);
    t[1].reach = t[3].reach = 0;
    assert_int_equal(epxi_transport_check(4, 2, t, &err), EPX_OK);
    /* a rank on another host: neither transport reaches it */
    t[2].host = 78;
    assert_int_equal(epxi_transport_check(4, 0, t, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "rank 2 runs on another host", "host transport", "NCCL");
    /* ranks that opened with different transports */
    four_ranks(t, EPXI_TR_PEER);
    t[1].kind = EPXI_TR_HOST;
    assert_int_equal(epxi_transport_check(4, 3, t, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "rank 3 opened with the peer transport", "rank 1 with host",
               "same value on every rank");
    /* one rank alone is always fine */
    assert_int_equal(epxi_transport_check(1, 0, t + 3, &err), EPX_OK);
    assert_int_equal(epxi_host_id(), epxi_host_id());
}

/* A child that maps the segment, checks the owner's bytes, writes its own,
 * counts in and exits 0; 10 + n on failure n. */
static int child_user(const char *name, size_t bytes, int idx) {
    epx_error err = {0};
    epxi_shm s;
    if (epxi_shm_attach(name, bytes, &s, &err) != EPX_OK) return 11;
    unsigned char *d = epxi_shm_data(&s);
    if (d[0] != 0xab) return 12;
    d[1 + idx] = (unsigned char)(0x10 + idx);
    epxi_shm_count_in(s.map, s.name);
    epxi_shm_close(&s);
    return 0;
}

static void segment_shared_and_removed(void **state) {
    (void)state;
    epx_error err = {0};
    epxi_shm s;
    const size_t bytes = 10000; /* not a whole number of pages */
    assert_int_equal(epxi_shm_create(bytes, 3, &s, &err), EPX_OK);
    assert_true(shm_exists(s.name));
    unsigned char *d = epxi_shm_data(&s);
    for (size_t i = 0; i < bytes; i++) assert_int_equal(d[i], 0); /* zeroed: flags at epoch 0 */
    d[0] = 0xab;
    pid_t kids[2];
    for (int i = 0; i < 2; i++) {
        kids[i] = fork();
        assert_true(kids[i] >= 0);
        if (kids[i] == 0) _exit(child_user(s.name, bytes, i));
    }
    for (int i = 0; i < 2; i++) {
        int ws = 0;
        assert_int_equal(waitpid(kids[i], &ws, 0), kids[i]);
        assert_true(WIFEXITED(ws));
        assert_int_equal(WEXITSTATUS(ws), 0);
    }
    assert_int_equal(d[1], 0x10);
    assert_int_equal(d[2], 0x11);
    assert_true(shm_exists(s.name)); /* two of three counted in */
    assert_true(epxi_shm_count_in(s.map, s.name));
    assert_false(shm_exists(s.name)); /* the last one removed the name ... */
    assert_int_equal(d[1], 0x10);     /* ... the memory lives on while mapped */
    epxi_shm_close(&s);
    assert_null(s.map);

    /* the owner closing before every user counted in removes the name */
    assert_int_equal(epxi_shm_create(64, 2, &s, &err), EPX_OK);
    char name[EPXI_SHM_NAME_BYTES];
    memcpy(name, s.name, sizeof name);
    epxi_shm_close(&s);
    assert_false(shm_exists(name));
    epxi_shm_close(&s); /* twice is harmless */
}

static void segment_of_a_dead_owner_is_swept(void **state) {
    (void)state;
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t kid = fork();
    assert_true(kid >= 0);
    if (kid == 0) {
        /* create, tell the parent the name, die without cleaning up */
        epx_error err = {0};
        epxi_shm s;
        if (epxi_shm_create(4096, 4, &s, &err) != EPX_OK) _exit(1);
        if (write(fd[1], s.name, sizeof s.name) != (ssize_t)sizeof s.name) _exit(2);
        _exit(0);
    }
    char name[EPXI_SHM_NAME_BYTES] = {0};
    assert_int_equal(read(fd[0], name, sizeof name), (ssize_t)sizeof name);
    int ws = 0;
    assert_int_equal(waitpid(kid, &ws, 0), kid);
    assert_int_equal(WEXITSTATUS(ws), 0);
    close(fd[0]);
    close(fd[1]);
    assert_true(shm_exists(name)); /* the crash left it */
    /* the next creation sweeps it; the live owner's (ours) stays */
    epx_error err = {0};
    epxi_shm mine;
    assert_int_equal(epxi_shm_create(128, 1, &mine, &err), EPX_OK);
    assert_false(shm_exists(name));
    assert_true(shm_exists(mine.name));
    assert_int_equal(epxi_shm_sweep(), 0);
    assert_true(shm_exists(mine.name));
    /* A dead-looking pid of another pid namespace (a container sharing
     * /dev/shm) is not ours to judge: its segment stays. */
    const char *foreign = "/epx-ll-1-999999999-00000000-0";
    int ffd = shm_open(foreign, O_RDWR | O_CREAT, 0600);
    assert_true(ffd >= 0);
    close(ffd);
    epxi_shm_sweep();
    assert_true(shm_exists(foreign));
    shm_unlink(foreign);
    epxi_shm_close(&mine);
    assert_false(shm_exists(mine.name));
}

static void segment_refusals(void **state) {
    (void)state;
    epx_error err = {0};
    epxi_shm s, t;
    assert_int_equal(epxi_shm_attach("/epx-ll-1-deadbeef-999", 64, &t, &err), EPX_ERR_IO);
    TU_MSG_HAS(err.msg, "/epx-ll-1-deadbeef-999", "/dev/shm", "--ipc=host");
    assert_int_equal(epxi_shm_attach("/etc-passwd", 64, &t, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, "'/etc-passwd'", "not the name of an epx segment");
    assert_int_equal(epxi_shm_attach("/epx-ll-1/../x", 64, &t, &err), EPX_ERR_INVALID_ARG);
    assert_int_equal(epxi_shm_attach(NULL, 64, &t, &err), EPX_ERR_INVALID_ARG);
    assert_int_equal(epxi_shm_create(0, 1, &s, &err), EPX_ERR_INVALID_ARG);
    assert_int_equal(epxi_shm_create(64, 0, &s, &err), EPX_ERR_INVALID_ARG);
    assert_int_equal(epxi_shm_create(8192, 2, &s, &err), EPX_OK);
    /* another config's size */
    assert_int_equal(epxi_shm_attach(s.name, 100000, &t, &err), EPX_ERR_INVALID_ARG);
    TU_MSG_HAS(err.msg, s.name, "configs differ");
    /* same pages, another claimed size inside them */
    assert_int_equal(epxi_shm_attach(s.name, 8000, &t, &err), EPX_ERR_INVALID_ARG);
    assert_int_equal(epxi_shm_attach(s.name, 8192, &t, &err), EPX_OK);
    epxi_shm_close(&t); /* not the owner: the name stays */
    assert_true(shm_exists(s.name));
    epxi_shm_close(&s);
    assert_false(shm_exists(s.name));
}

/* Nothing of this process is left in /dev/shm. */
static void no_litter(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "ls /dev/shm 2>/dev/null | grep -q '^epx-ll-[0-9]*-%d-'",
             (int)getpid());
    assert_int_not_equal(system(cmd), 0);
}

int main(void) {
    if (access("/dev/shm", W_OK) != 0) {
        printf("skipped: /dev/shm is not writable here\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(resolve_rules),
        cmocka_unit_test(check_rules),
        cmocka_unit_test(segment_shared_and_removed),
        cmocka_unit_test(segment_of_a_dead_owner_is_swept),
        cmocka_unit_test(segment_refusals),
        cmocka_unit_test(no_litter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
