"""epx.torch.Buffer on a GPU: R in {1, 2, 3} processes share cuda:0 over a
gloo group (CUDA IPC between them, as on one H200), and every call of
DeepEP's low-latency API is checked bit for bit against the plain-torch
references of epx.torch.buffer: dispatch (counts, layout, source tokens,
rows), combine of simulated experts, the fp8 cast, the receive hooks, two
dispatches before one combine, zero-copy combine, async_finish events, a
CUDA graph replayed with new data, and the cumulative expert statistics.
Skipped without a CUDA GPU or without the engine in libepx_cuda.so (CI);
run on the H200 (scripts/gpu_torch.sh). Every rank builds every rank's inputs
from the seed, so the references need no collective; a failure names its
rank and seed."""
import datetime
import os
import socket
import traceback

import pytest

torch = pytest.importorskip("torch")
import epx.torch as et  # noqa: E402
from epx.torch import _ll  # noqa: E402
from epx.torch import buffer as B  # noqa: E402


def _why_not():
    if not torch.cuda.is_available():
        return "no CUDA GPU visible"
    reason = et.gpu_unavailable_reason()
    if reason is not None:
        return reason
    if _ll._open is None:
        return "libepx_cuda.so lacks the low-latency engine (epx_gpu_ep_open)"
    return None


WHY_NOT = _why_not()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason="%s: epx.torch.Buffer's GPU tests "
                                "run on the H200 (scripts/gpu_torch.sh)" % WHY_NOT)

SEED = int(os.environ.get("EPX_TORCH_SEED", "1"))
# (hidden, top-k, experts per rank, max tokens per rank)
SHAPES = [(256, 4, 8, 16), (7168, 8, 16, 8)]
TIMEOUT_MS = 60000  # the ranks time-slice one GPU


# ---- inputs and references (CPU) -----------------------------------------------------

def make_inputs(seed, R, H, K, E, M, Ts=None):
    """Every rank's (x bf16 [T, H], topk_idx int64 [T, K], weights fp32 [T, K]):
    distinct experts per token from random scores, some -1; with R >= 2 one
    rank sends no token and another a full batch."""
    g = torch.Generator().manual_seed(seed)
    if Ts is None:
        Ts = [int(torch.randint(0, M + 1, (1,), generator=g)) for _ in range(R)]
        if R >= 2:
            z = int(torch.randint(0, R, (1,), generator=g))
            Ts[z], Ts[(z + 1) % R] = 0, M
        else:
            Ts[0] = max(Ts[0], 1)
    xs, ids, ws = [], [], []
    for T in Ts:
        i = torch.rand((T, E), generator=g).topk(K, dim=1).indices.to(torch.int64)
        i[torch.rand((T, K), generator=g) < 0.1] = -1
        ids.append(i)
        xs.append(torch.randn((T, H), generator=g).to(torch.bfloat16))
        ws.append(torch.rand((T, K), generator=g))
    return list(Ts), xs, ids, ws


def factor(gid):
    """The simulated expert gid scales its rows by 1 + gid / 64 (exact in fp32)."""
    return 1.0 + gid / 64.0


def experts_gpu(recv_x, rank, L):
    f = (1.0 + torch.arange(rank * L, (rank + 1) * L, device=recv_x.device).float() / 64.0)
    return (recv_x.float() * f[:, None, None]).to(torch.bfloat16)


def ref_combine(x, ids, w):
    """reference_combine of the simulated experts on this rank's tokens."""
    T, H = x.shape
    out = B.reference_combine(
        lambda t, k: (x[t].float() * torch.tensor(factor(int(ids[t, k])))).to(torch.bfloat16),
        ids, w)
    if out.shape != (T, H):  # no token routed anywhere: the reference cannot know H
        assert not out.float().any()
        out = torch.zeros((T, H), dtype=torch.bfloat16)
    return out


def bits(t):
    return t.contiguous().cpu().view(torch.uint8)


# ---- one rank's run ---------------------------------------------------------------

class Rank:
    def __init__(self, rank, R, group, buf):
        self.rank, self.R, self.group, self.buf = rank, R, group, buf

    def batch(self, seed, H, K, E, M, Ts=None):
        Ts, xs, ids, ws = make_inputs(seed, self.R, H, K, E, M, Ts)
        r = self.rank
        cuda = dict(x=xs[r].cuda(), ids=ids[r].cuda(), w=ws[r].cuda())
        ref = B.reference_dispatch(xs, ids, r, E, M)
        # x, ids, w: this rank's on the GPU; ref, comb: what it must receive and combine
        return dict(Ts=Ts, ref=ref, seed=seed, H=H, K=K, E=E, M=M,
                    comb=ref_combine(xs[r], ids[r], ws[r]), **cuda)

    def tag(self, b, what):
        return "rank %d of %d, seed %d, H %d K %d E %d M %d: %s" % (
            self.rank, self.R, b["seed"], b["H"], b["K"], b["E"], b["M"], what)

    def check_dispatch(self, b, recv_x, count, handle, fp8=None):
        rx, rc, rsrc, rlay = b["ref"]
        L = b["E"] // self.R
        assert handle[2:] == (b["M"], b["H"], b["E"]), self.tag(b, "handle")
        assert count.dtype == torch.int32 and tuple(count.shape) == (L,)
        assert torch.equal(count.cpu(), rc), self.tag(b, "recv_count %s, want %s" % (
            count.tolist(), rc.tolist()))
        assert handle[1].dtype == torch.int64 and tuple(handle[1].shape) == (L, self.R)
        assert torch.equal(handle[1].cpu(), rlay), self.tag(b, "layout_range")
        if fp8 is None:
            assert recv_x.dtype == torch.bfloat16
            assert tuple(recv_x.shape) == (L, self.R * b["M"], b["H"]), self.tag(b, "shape")
        for e in range(L):
            n = int(rc[e])
            assert torch.equal(handle[0][e, :n].cpu(), rsrc[e, :n]), self.tag(b, "src_info")
            if fp8 is None:
                assert torch.equal(bits(recv_x[e, :n]), bits(rx[e, :n])), \
                    self.tag(b, "recv_x of local expert %d" % e)
            else:
                data, scales = recv_x
                # the cast of the reference rows on the CPU: the same bits on
                # every device (test_torch_buffer.py checks it against DeepEP's
                # kernel arithmetic)
                want_d, want_s = B.per_token_cast_fp8(rx[e, :n], *fp8)
                assert torch.equal(bits(data[e, :n]), bits(want_d)), self.tag(b, "fp8 data")
                assert torch.equal(scales[e, :n].cpu(), want_s), self.tag(b, "fp8 scales")

    def check_combine(self, b, out):
        assert out.dtype == torch.bfloat16 and tuple(out.shape) == (b["Ts"][self.rank], b["H"])
        assert torch.equal(bits(out), bits(b["comb"])), self.tag(b, "combined_x")

    def step(self, b, **kw):
        """Plain dispatch, the experts, plain combine; checks both."""
        recv_x, count, handle, ev, hook = self.buf.low_latency_dispatch(
            b["x"], b["ids"], b["M"], b["E"], use_fp8=False, **kw)
        assert hook is None and ev.event is None
        self.check_dispatch(b, recv_x, count, handle)
        y = experts_gpu(recv_x, self.rank, b["E"] // self.R)
        out, ev, hook = self.buf.low_latency_combine(y, b["ids"], b["w"], handle)
        assert hook is None and ev.event is None
        self.check_combine(b, out)
        return handle


def run_shape(me, si, H, K, LPR, M):
    R, rank, buf = me.R, me.rank, me.buf
    E = LPR * R
    L = LPR
    seed = lambda i: SEED * 100003 + R * 1009 + si * 101 + i  # noqa: E731
    stats = torch.zeros(L, dtype=torch.int32, device="cuda")
    want_stats = torch.zeros(L, dtype=torch.int32)

    # plain, with the cumulative statistics (the first call creates the engine)
    b = me.batch(seed(0), H, K, E, M)
    me.step(b, cumulative_local_expert_recv_stats=stats)
    want_stats += b["ref"][1]

    # fp8: DeepEP's cast of the bf16 reference rows
    for j, fp8 in enumerate([(False, False), (True, False)] + ([(True, True)] if H % 512 == 0
                                                                else [])):
        b = me.batch(seed(1 + j), H, K, E, M)
        recv, count, handle, _, _ = buf.low_latency_dispatch(
            b["x"], b["ids"], M, E, cumulative_local_expert_recv_stats=stats, use_fp8=True,
            round_scale=fp8[0], use_ue8m0=fp8[1])
        want_stats += b["ref"][1]
        data, scales = recv
        assert data.dtype == torch.float8_e4m3fn and tuple(data.shape) == (L, R * M, H)
        assert scales.dtype == (torch.int32 if fp8[1] else torch.float32)
        assert scales.stride(-2) == 1, "scales column-major as DeepEP's"
        me.check_dispatch(b, recv, count, handle, fp8=fp8)

    # receive hooks: dispatch, then combine, each in two halves
    b = me.batch(seed(5), H, K, E, M)
    recv_x, count, handle, ev, hook = buf.low_latency_dispatch(
        b["x"], b["ids"], M, E, use_fp8=False, return_recv_hook=True)
    assert ev.event is None and callable(hook)
    hook()
    me.check_dispatch(b, recv_x, count, handle)
    y = experts_gpu(recv_x, rank, L)
    out, ev, hook = buf.low_latency_combine(y, b["ids"], b["w"], handle, return_recv_hook=True)
    hook()
    me.check_combine(b, out)
    # ... and the fp8 tensors handed out before the hook fills them
    b = me.batch(seed(6), H, K, E, M)
    recv, count, handle, _, hook = buf.low_latency_dispatch(
        b["x"], b["ids"], M, E, use_fp8=True, round_scale=True, return_recv_hook=True)
    hook()
    me.check_dispatch(b, recv, count, handle, fp8=(True, False))

    # two dispatches in a row, then one combine: the second batch's
    b1, b2 = me.batch(seed(7), H, K, E, M), me.batch(seed(8), H, K, E, M)
    buf.low_latency_dispatch(b1["x"], b1["ids"], M, E, use_fp8=False)
    recv_x, count, handle, _, _ = buf.low_latency_dispatch(b2["x"], b2["ids"], M, E,
                                                           use_fp8=False)
    me.check_dispatch(b2, recv_x, count, handle)
    out, _, _ = buf.low_latency_combine(experts_gpu(recv_x, rank, L), b2["ids"], b2["w"], handle)
    me.check_combine(b2, out)

    # zero copy: the experts write the engine's own buffer
    b = me.batch(seed(9), H, K, E, M)
    recv_x, count, handle, _, _ = buf.low_latency_dispatch(b["x"], b["ids"], M, E,
                                                           use_fp8=False)
    me.check_dispatch(b, recv_x, count, handle)
    zbuf = buf.get_next_low_latency_combine_buffer(handle)
    assert tuple(zbuf.shape) == (L, R * M, H) and zbuf.dtype == torch.bfloat16
    zbuf.copy_(experts_gpu(recv_x, rank, L))
    out, _, _ = buf.low_latency_combine(zbuf, b["ids"], b["w"], handle, zero_copy=True)
    me.check_combine(b, out)

    # async_finish: events the caller waits on
    b = me.batch(seed(10), H, K, E, M)
    recv_x, count, handle, ev, hook = buf.low_latency_dispatch(
        b["x"], b["ids"], M, E, use_fp8=False, async_finish=True)
    assert hook is None and ev.event is not None
    ev.current_stream_wait()
    me.check_dispatch(b, recv_x, count, handle)
    out, ev, _ = buf.low_latency_combine(experts_gpu(recv_x, rank, L), b["ids"], b["w"], handle,
                                         async_finish=True)
    assert ev.event is not None
    with ev:
        pass
    me.check_combine(b, out)

    # a CUDA graph of dispatch + experts + combine, replayed with new data
    b = me.batch(seed(11), H, K, E, M)
    sx, sids, sw = b["x"].clone(), b["ids"].clone(), b["w"].clone()
    me.step(b)  # the warm-up call of the captured shape

    def graph_step():
        rx, cnt, hd, _, _ = buf.low_latency_dispatch(sx, sids, M, E, use_fp8=False)
        o, _, _ = buf.low_latency_combine(experts_gpu(rx, rank, L), sids, sw, hd)
        return rx, cnt, hd, o

    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_recv, g_count, g_handle, g_out = graph_step()
    for trial in range(2):
        nb = me.batch(seed(12 + trial), H, K, E, M, Ts=b["Ts"])
        sx.copy_(nb["x"])
        sids.copy_(nb["ids"])
        sw.copy_(nb["w"])
        graph.replay()
        torch.cuda.synchronize()
        me.check_dispatch(nb, g_recv, g_count, g_handle)
        me.check_combine(nb, g_out)
    del graph
    # eager calls still right after the replays
    me.step(me.batch(seed(14), H, K, E, M))

    torch.cuda.synchronize()
    assert torch.equal(stats.cpu(), want_stats), "rank %d: cumulative stats %s, want %s" % (
        rank, stats.tolist(), want_stats.tolist())


def run_rank(rank, R, group):
    hint = max(B.Buffer.get_low_latency_rdma_size_hint(M, H, R, LPR * R)
               for H, K, LPR, M in SHAPES)
    buf = B.Buffer(group, num_rdma_bytes=hint, low_latency_mode=True,
                   num_qps_per_rank=SHAPES[0][2], explicitly_destroy=True, timeout_ms=TIMEOUT_MS)
    me = Rank(rank, R, group, buf)
    for si, (H, K, LPR, M) in enumerate(SHAPES):
        run_shape(me, si, H, K, LPR, M)
    # a handle from another Buffer is refused before anything is launched
    H, K, LPR, M = SHAPES[0]
    other = B.Buffer(group, low_latency_mode=True, explicitly_destroy=True,
                     timeout_ms=TIMEOUT_MS)
    b = me.batch(SEED * 7 + 3, H, K, LPR * R, M)
    recv_x, _, handle, _, _ = other.low_latency_dispatch(b["x"], b["ids"], M, LPR * R,
                                                         use_fp8=False)
    y = experts_gpu(recv_x, rank, LPR)
    try:
        buf.low_latency_combine(y, b["ids"], b["w"], handle)
    except ValueError as e:
        assert "does not come from a dispatch of this Buffer" in str(e), e
    else:
        raise AssertionError("a handle of another Buffer was accepted")
    out, _, _ = other.low_latency_combine(y, b["ids"], b["w"], handle)
    me.check_combine(b, out)
    other.destroy()
    buf.destroy()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, R, port):
    import torch.distributed as dist
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=R, timeout=datetime.timedelta(seconds=300))
    try:
        run_rank(rank, R, dist.group.WORLD)
    except BaseException:
        raise AssertionError("rank %d of %d failed (EPX_TORCH_SEED=%d):\n%s" % (
            rank, R, SEED, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("R", [1, 2, 3])
def test_buffer_matches_the_references_bit_for_bit(R):
    import torch.multiprocessing as mp
    mp.spawn(_worker, args=(R, _free_port()), nprocs=R, join=True)
