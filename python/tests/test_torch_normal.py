"""epx.torch.Buffer's normal mode (DeepEP's dispatch/combine) on the CPU, in
CI: the rows epx.torch._normal packs, the receive the engine makes of them
(built here by the engine's documented rule: a rank gets the rows whose
columns name it, in (source, token) order) and what is unpacked from it,
against the plain-torch definition, on random multi-rank batches; then the
Buffer's own logic on one rank with a loopback engine (handles, cached and
worst-case dispatches, a combine after another dispatch, the refusals). The
GPU half is test_torch_buffer_gpu.py and DeepEP's own test_intranode.py
(tools/deepep_ll_check.py --test intranode). A failure names its seed."""
import ctypes
import os

import pytest

torch = pytest.importorskip("torch")
import epx.torch as et  # noqa: E402
from epx.torch import _ll  # noqa: E402
from epx.torch import _normal as N  # noqa: E402
from epx.torch import buffer as B  # noqa: E402

import test_torch_buffer as TB  # noqa: E402  (its fake GPU, gloo world and FakeCuda)

SEEDS = range(int(os.environ.get("EPX_TORCH_SEEDS", "12")))
world1 = TB.world1


def _batch(g, R, H, K, E, T):
    """One source's inputs: x bf16, distinct top-k ids (some -1), weights,
    and DeepEP's layout of them."""
    x = torch.randn((T, H), generator=g).to(torch.bfloat16)
    scores = torch.rand((T, E), generator=g)
    ids = torch.topk(scores, K, dim=1).indices
    ids[torch.rand((T, K), generator=g) < 0.15] = -1
    w = torch.randn((T, K), generator=g)
    per_rank, _, per_expert, in_rank, _ = et.get_dispatch_layout(ids, E, num_ranks=R)
    return x, ids, w, per_rank, per_expert, in_rank


def _cast_fp8(x):
    """DeepEP's per-token cast (e4m3, one fp32 scale per 128 values)."""
    return B.per_token_cast_fp8(x)


def engine_receive(stages, columns, Ts, rank, M):
    """The engine's receive at `rank` (one slot per rank): the rows whose
    columns name it, source by source, token by token (count rows included),
    in [R * M, W] rows; layout_range [R] as (first << 32) | count; src_info."""
    R, W = len(stages), stages[0].shape[1]
    recv = torch.full((R * M, W), float("nan"), dtype=torch.bfloat16)
    src = torch.full((R * M,), -7, dtype=torch.int32)
    layout = torch.zeros(R, dtype=torch.int64)
    n = 0
    for s in range(R):
        picks = (columns[s][:Ts[s] + 1] == rank).any(1).nonzero().flatten()
        recv[n:n + picks.numel()] = stages[s][picks]
        src[n:n + picks.numel()] = picks.to(torch.int32)
        layout[s] = (n << 32) | picks.numel()
        n += picks.numel()
    return recv, layout, src


def engine_combine(ys, columns, rows_of, s, T, W):
    """The engine's combine at source s: token t's rows from every rank its
    columns name, weight 1, summed in fp32 in column order (unrounded)."""
    out = torch.zeros((T + 1, W), dtype=torch.float32)
    for t in range(T + 1):
        for r in range(len(ys)):
            if int(columns[s][t, r]) >= 0:
                out[t] += ys[r][rows_of[r][(s, t)]].float()
    return out


def _world(seed, R, H, K, LPR, fp8):
    g = torch.Generator().manual_seed(seed)
    E = max(LPR, -(-K // R)) * R  # room for K distinct experts
    M = 12
    Ts = [int(torch.randint(0, M, (1,), generator=g)) for _ in range(R)]
    if R > 1:
        Ts[int(torch.randint(0, R, (1,), generator=g))] = 0  # a rank with no token
    srcs = [_batch(g, R, H, K, E, T) for T in Ts]
    W = N.row_width(H, E, R)
    stages, columns, xs = [], [], []
    for (x, ids, w, per_rank, per_expert, in_rank) in srcs:
        stage = torch.full((M, W), float("nan"), dtype=torch.bfloat16)
        cols = torch.full((M, R), -5, dtype=torch.int32)
        xin = _cast_fp8(x) if fp8 else x
        xs.append(xin)
        N.pack(stage, cols, xin[0] if fp8 else xin, xin[1] if fp8 else None, ids, w, in_rank,
               per_rank, per_expert)
        stages.append(stage)
        columns.append(cols)
    return g, E, M, Ts, srcs, W, stages, columns, xs


@pytest.mark.parametrize("seed", SEEDS)
def test_dispatch_and_combine_rows_are_deepeps_definition(seed):
    R = 1 + seed % 4
    H, K, LPR = (256, 4, 3) if seed % 2 else (384, 6, 2)
    fp8 = seed % 3 == 1
    g, E, M, Ts, srcs, W, stages, columns, xs = _world(seed, R, H, K, LPR, fp8)
    L = E // R
    rows_of, ys, ws, ins = [], [], [], [s[5] for s in srcs]
    received = [engine_receive(stages, columns, Ts, r, M) for r in range(R)]
    for r in range(R):
        recv, layout, src_info = received[r]
        rows, valid, real, count_rows = N.row_map(layout)
        per_rank, per_expert = N.counts_of(recv, count_rows, R, E)
        x, ids, w = N.unpack(recv, rows, valid, H, fp8, K, r, L)
        rx, rids, rw, rsrc, rprefix, rcounts = N.reference_dispatch(
            xs, ins, [s[1] for s in srcs], [s[2] for s in srcs], [s[4] for s in srcs], r)
        msg = "seed %d, rank %d of %d" % (seed, r, R)
        if fp8:
            assert torch.equal(x[0].view(torch.uint8), rx[0].view(torch.uint8)), msg
            assert torch.equal(x[1], rx[1]), msg
        else:
            assert torch.equal(x.view(torch.int16), rx.view(torch.int16)), msg
        assert torch.equal(ids, rids) and ids.dtype == torch.int64, msg
        assert torch.equal(w, rw) and w.dtype == torch.float32, msg
        assert torch.equal(src_info.index_select(0, rows), rsrc), msg
        assert torch.equal(torch.cumsum(per_rank, 0, dtype=torch.int32), rprefix), msg
        assert per_expert.sum(0)[r * L:(r + 1) * L].tolist() == rcounts, msg
        # worst case: n fixed above what came, padding zeros / -1 / 0
        n = rows.numel()
        wrows, wvalid, _, _ = N.row_map(layout, n + 3)
        assert torch.equal(wrows[:n], rows) and wvalid[:n].all() and not wvalid[n:].any(), msg
        wx, wids, ww = N.unpack(recv, wrows, wvalid, H, fp8, K, r, L)
        wx = wx[0].view(torch.uint8) if fp8 else wx.view(torch.int16)
        assert not wx[n:].any() and (wids[n:] == -1).all() and not ww[n:].any(), msg
        # the experts' outputs, and weights owned here only (as dispatched)
        y_r = torch.randn((n, H), generator=g).to(torch.bfloat16)
        w_r = torch.where(rids >= 0, torch.randn(rids.shape, generator=g), 0.0)
        ys.append(y_r)
        ws.append(w_r)
        y = torch.full((R * M, W), float("nan"), dtype=torch.bfloat16)
        N.fill_combine(y, rows, y_r, w_r)
        rows_of.append(y)
    for s in range(R):
        T = Ts[s]
        # where each rank keeps (s, t): its receive's rows, count rows included
        where = []
        for r in range(R):
            _, layout, src_info = received[r]
            first, cnt = int(layout[s]) >> 32, int(layout[s]) & 0xFFFFFFFF
            where.append({(s, int(src_info[first + i])): first + i for i in range(cnt)})
        out = engine_combine(rows_of, columns, where, s, T, W)
        cx, cw = N.combined(out, T, H, K, (None,))
        rx, rw = N.reference_combine(ys, ws, ins, s)
        msg = "seed %d, source %d of %d" % (seed, s, R)
        assert torch.equal(cx, rx), msg
        # one rank owns each (t, k): the three-part sum gives the weight exactly
        assert torch.equal(cw, rw), msg


@pytest.mark.parametrize("seed", SEEDS)
def test_three_part_split_sums_back(seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(4096, generator=g) * torch.exp2(torch.randint(-60, 60, (4096,), generator=g))
    hi, mid, lo = N.split3(w)
    assert torch.equal((hi.float() + mid.float()) + lo.float(), w), "seed %d" % seed
    # several ranks' parts summed apart stay within fp32's rounding of the sum
    ws = torch.randn((3, 512), generator=g)
    parts = [N.split3(v) for v in ws]
    got = sum(p[0].float() for p in parts) + sum(p[1].float() for p in parts) + \
        sum(p[2].float() for p in parts)
    assert torch.allclose(got, ws.sum(0), rtol=1e-6, atol=1e-7), "seed %d" % seed


def test_row_width_holds_the_tail_and_the_count_row():
    assert N.row_width(7168, 256, 8) == 7168 + N.META_COLS
    assert N.row_width(64, 384, 8) == 2 * (384 + 8)
    assert N.row_width(100, 4, 2) % 8 == 0


# ---- the Buffer on one rank, with a loopback engine ------------------------------


class LoopEngine(TB.FakeEngine):
    """One rank's engine: dispatch keeps the rows whose column names rank 0,
    combine sums them back with their weights in fp32."""

    def dispatch(self, parts, x, ids, stream=None):
        super().dispatch(parts, x, ids, stream)
        sel = (ids[:, 0] == 0).nonzero().flatten()
        n = sel.numel()
        self.recv_x[0, :n] = x[sel]
        self.src_info[0, :n] = sel.to(torch.int32)
        self.layout_range[0, 0] = n
        self.recv_count[0] = n
        self.sel = sel

    def combine(self, parts, y, weights, out, stream=None, out_dtype=_ll.DTYPE_BF16):
        assert y is None and out.dtype == (torch.float32 if out_dtype == _ll.DTYPE_F32
                                           else torch.bfloat16)
        self.calls.append(("combine", parts, out.dtype))
        sums = torch.zeros(out.shape)
        n = self.sel.numel()
        sums[self.sel] = weights[self.sel, :1] * self.y[0, :n].float()
        out.copy_(sums)  # bf16: the fp32 sum rounded once


@pytest.fixture
def nbuf(world1, monkeypatch):
    TB._fake_gpu(monkeypatch.setattr, engine=LoopEngine)
    monkeypatch.setattr(_ll, "buffer_bytes", lambda cfg, n: 1000 * cfg.max_tokens)
    return B.Buffer(world1, num_nvl_bytes=64000, explicitly_destroy=True)


def _one_rank(seed, T=5, H=256, K=4, E=8):
    g = torch.Generator().manual_seed(seed)
    x, ids, w, per_rank, per_expert, in_rank = _batch(g, 1, H, K, E, T)
    return [TB.cu(t) for t in (x, ids, w, per_rank, per_expert, in_rank)]


def _dispatch(buf, x, ids, w, per_rank, per_expert, in_rank, **kw):
    return buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                        num_tokens_per_expert=per_expert, topk_idx=ids, topk_weights=w, **kw)


@pytest.mark.parametrize("seed", range(4))
def test_buffer_round_trip_on_one_rank(nbuf, seed):
    x, ids, w, per_rank, per_expert, in_rank = _one_rank(seed)
    T, E = x.shape[0], per_expert.numel()
    rx, rids, rw, counts, handle, ev = _dispatch(nbuf, x, ids, w, per_rank, per_expert, in_rank,
                                                 expert_alignment=4)
    assert ev.event is None and len(handle) == 6
    ref = N.reference_dispatch([x], [in_rank], [ids], [w], [per_expert], 0)
    assert torch.equal(rx, ref[0]) and torch.equal(rids, ref[1]) and torch.equal(rw, ref[2])
    assert counts == [(c + 3) // 4 * 4 for c in ref[5]] and len(counts) == E
    assert torch.equal(handle[0], ref[4]) and torch.equal(handle[3], ref[3])
    eng = LoopEngine.made[-1]
    assert (eng.cfg.hidden, eng.cfg.top_k, eng.cfg.num_slots, eng.cfg.max_tokens) == \
        (N.row_width(256, E, 1), 1, 1, 64)
    # cached: same rows, DeepEP's outputs
    cx, a, b, c, d, _ = nbuf.dispatch(x, handle=handle)
    assert torch.equal(cx, rx) and (a, b, c, d) == (None, None, None, None)
    # worst case: padded, no count list
    wx, wids, ww, empty, _, _ = _dispatch(nbuf, x, ids, w, per_rank, per_expert, in_rank,
                                          num_worst_tokens=T + 2)
    assert empty == [] and wx.shape[0] == T + 2 and torch.equal(wx[:rx.shape[0]], rx)
    assert (wids[rx.shape[0]:] == -1).all()
    # combine: one rank, so each token's row and weights come back as they are
    bias = TB.cu(torch.randn(x.shape).to(torch.bfloat16))
    out, ow, _ = nbuf.combine(TB.cu(rx), handle, topk_weights=TB.cu(rw), bias=bias)
    keep = in_rank[:, 0].unsqueeze(1)
    assert torch.equal(out, torch.where(keep, (x.float() + bias.float()).to(torch.bfloat16),
                                        bias.float().to(torch.bfloat16)))
    expect = torch.zeros(ow.shape)
    expect[ref[3].long()] = rw
    assert torch.equal(ow, expect)


def test_a_wrong_normal_kernels_switch_is_refused_by_name(nbuf, monkeypatch):
    x, ids, w, per_rank, per_expert, in_rank = _one_rank(0)
    monkeypatch.setenv("EPX_TORCH_NORMAL_KERNELS", "yes")
    with pytest.raises(ValueError, match="EPX_TORCH_NORMAL_KERNELS is 'yes': give 1"):
        _dispatch(nbuf, x, ids, w, per_rank, per_expert, in_rank)
    made = len(LoopEngine.made)
    monkeypatch.setenv("EPX_TORCH_NORMAL_KERNELS", "0")  # the same engine works afterwards
    rx = _dispatch(nbuf, x, ids, w, per_rank, per_expert, in_rank)[0]
    assert len(LoopEngine.made) == made
    ref = N.reference_dispatch([x], [in_rank], [ids], [w], [per_expert], 0)
    assert torch.equal(rx, ref[0])


def test_a_combine_after_another_dispatch_resends_its_columns(nbuf):
    a = _one_rank(1)
    b = _one_rank(2)
    ra = _dispatch(nbuf, *a)
    eng = LoopEngine.made[-1]
    _dispatch(nbuf, *b)
    eng.calls.clear()
    out, _, _ = nbuf.combine(TB.cu(ra[0]), ra[4])
    kinds = [c[0] for c in eng.calls]
    assert kinds == ["dispatch", "combine"], eng.calls
    assert torch.equal(out, torch.where(a[5][:, :1], a[0], torch.zeros((), dtype=a[0].dtype)))
    eng.calls.clear()
    nbuf.combine(TB.cu(ra[0]), ra[4])  # the engine holds its layout now: no resend
    assert eng.calls == [("combine", 3, torch.bfloat16)]  # no weights: bf16 sums
    nbuf.dispatch(a[0], handle=ra[4])  # a cached dispatch keeps the layout too
    eng.calls.clear()
    nbuf.combine(TB.cu(ra[0]), ra[4])
    assert [c[0] for c in eng.calls] == ["combine"]


def test_normal_mode_refusals(nbuf, world1, monkeypatch):
    x, ids, w, per_rank, per_expert, in_rank = _one_rank(0)
    with pytest.raises(ValueError, match="needs num_tokens_per_rank, is_token_in_rank"):
        nbuf.dispatch(x)
    with pytest.raises(ValueError, match="x has dtype torch.float32"):
        _dispatch(nbuf, TB.cu(torch.zeros(5, 256)), ids, w, per_rank, per_expert, in_rank)
    with pytest.raises(ValueError, match="is_token_in_rank has 4 rows; x has 5 tokens"):
        _dispatch(nbuf, x, ids, w, per_rank, per_expert, in_rank[:4])
    with pytest.raises(ValueError, match="topk_idx has 33 columns"):
        _dispatch(nbuf, x, TB.cu(torch.zeros((5, 33), dtype=torch.int64)), None, per_rank,
                  per_expert, in_rank)
    with pytest.raises(ValueError, match="topk_weights needs topk_idx"):
        _dispatch(nbuf, x, None, w, per_rank, per_expert, in_rank)
    with pytest.raises(ValueError, match="x has 64 tokens; this Buffer's num_nvl_bytes "
                       r"\(64000\) holds 63 per rank"):
        big = TB.cu(torch.zeros((64, 256), dtype=torch.bfloat16))
        nbuf.dispatch(big, num_tokens_per_rank=per_rank, is_token_in_rank=TB.cu(
            torch.ones((64, 1), dtype=torch.bool)), num_tokens_per_expert=per_expert)
    with pytest.raises(ValueError, match="fp8 x has hidden 200"):
        nbuf.dispatch((TB.cu(torch.zeros((5, 200), dtype=torch.float8_e4m3fn)),
                       TB.cu(torch.zeros((5, 1)))), num_tokens_per_rank=per_rank,
                      is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
    with pytest.raises(ValueError, match="handle must be the handle a dispatch"):
        nbuf.combine(x, (1, 2, 3, 4, 5, 6))
    h = _dispatch(nbuf, x, ids, w, per_rank, per_expert, in_rank)[4]
    with pytest.raises(ValueError, match="takes no topk_idx"):
        nbuf.dispatch(x, handle=h, topk_idx=ids)
    with pytest.raises(ValueError, match=r"x has 0 rows; the handle's dispatch received \d+ tokens"):
        nbuf.combine(x[:0], h)
    with pytest.raises(ValueError, match="positive even int"):
        B.Buffer.set_num_sms(7)
    none = B.Buffer(world1, num_nvl_bytes=0, explicitly_destroy=True)
    with pytest.raises(ValueError, match="num_nvl_bytes=...\\) above 0"):
        _dispatch(none, x, ids, w, per_rank, per_expert, in_rank)


def test_config_and_the_static_calls():
    c = B.Buffer.get_dispatch_config(8)
    assert isinstance(c, et.Config) and c.num_sms == B.Buffer.num_sms
    assert B.Buffer.is_sm90_compiled() is True
    assert c.get_rdma_buffer_size_hint(14336, 8) == 0


@pytest.mark.parametrize("shape", [(3, 16), (5, 12), (2, 6)])
def test_word_copies_keep_every_bit(shape):
    g = torch.Generator().manual_seed(shape[1])
    src = torch.randint(-2**15, 2**15, shape, generator=g, dtype=torch.int16).view(torch.bfloat16)
    wide = torch.zeros((shape[0], shape[1] + 8), dtype=torch.bfloat16)
    N.copy_rows(wide[:, :shape[1]], src)  # NaN patterns included: bits, not values
    assert torch.equal(wide[:, :shape[1]].view(torch.int16), src.view(torch.int16))
    assert N.words(src).dtype == (torch.int64 if shape[1] % 4 == 0 else torch.bfloat16)
    odd = torch.zeros(40, dtype=torch.bfloat16)[1:33].view(2, 16)  # offset of 2 bytes
    assert N.words(odd).dtype == torch.bfloat16


def test_tokens_past_num_worst_tokens_are_reported_once(nbuf):
    from epx._native import EpxError
    x, ids, w, per_rank, per_expert, in_rank = _one_rank(3, T=6)
    came = int(in_rank.sum())
    assert came >= 2
    out = _dispatch(nbuf, x, ids, w, per_rank, per_expert, in_rank, num_worst_tokens=came - 1)
    assert out[0].shape[0] == came - 1
    with pytest.raises(EpxError, match="1 received token\\(s\\) did not fit num_worst_tokens"):
        nbuf.normal_health()
    nbuf.normal_health()  # reported once
    _dispatch(nbuf, x, ids, w, per_rank, per_expert, in_rank, num_worst_tokens=came)
    nbuf.normal_health()  # all fit


@pytest.mark.parametrize("hidden_bytes, ranks, needle", [
    (7168 * 2, 0, "num_ranks = 0 is outside"), (0, 8, "hidden_bytes = 0 is outside"),
    (7168 * 2, 2.5, "num_ranks must be an integer")])
def test_nvl_size_hint_names_a_bad_argument(hidden_bytes, ranks, needle):
    # num_ranks 0 was reported as "top_k (0)" by the engine's config check
    with pytest.raises((TypeError, ValueError)) as e:
        B.Buffer.get_dispatch_config(8).get_nvl_buffer_size_hint(hidden_bytes, ranks)
    assert needle in str(e.value)


def test_nvl_size_hint_is_the_engine_for_the_hint_tokens(monkeypatch):
    seen = TB.record_engine_bytes(monkeypatch, 12345)
    assert B.Buffer.get_dispatch_config(8).get_nvl_buffer_size_hint(7168 * 2, 8) == 12345
    assert seen == [(N.row_width(7168, 256, 8), 8, 8, B.NORMAL_HINT_TOKENS + 1, 8)]
    # an engine sized by num_nvl_bytes = the hint holds the hint's tokens
    monkeypatch.setattr(_ll, "buffer_bytes", lambda cfg, n: 1000 * cfg.max_tokens)
    assert B._normal_tokens(100, 2, 1000 * (B.NORMAL_HINT_TOKENS + 1)) == \
        B.NORMAL_HINT_TOKENS + 1


# ---- the epx_normal_* kernels' host side (no GPU needed: checks come before launches) ----

from epx.torch import _gpu, _normal_gpu as NG  # noqa: E402

KERNELS = pytest.mark.skipif(not NG.available(), reason="libepx_cuda.so with epx_normal_* is "
                             "not built here (no nvcc at install)")


@KERNELS
def test_kernels_and_torch_agree_on_the_row_width():
    width = _gpu._lib.epx_normal_row_width
    width.restype, width.argtypes = ctypes.c_int32, [ctypes.c_int32] * 3
    for H in (1, 7, 64, 100, 128, 2048, 7168):
        for E, R in ((8, 1), (256, 8), (384, 8), (4096, 64)):
            assert width(H, E, R) == N.row_width(H, E, R), (H, E, R)


@KERNELS
def test_kernels_refuse_bad_arguments_by_name():
    from epx._native import EpxError
    null = ctypes.c_void_p(0)
    stream = ctypes.c_void_p(0)

    def call(f, *args):
        with pytest.raises(EpxError) as ei:
            _gpu.call(f, *args, stream)
        return str(ei.value)

    good = NG.NormalRows(256, N.row_width(256, 8, 2), 2, 8)
    bad_width = NG.NormalRows(256, 300, 2, 8)
    bad_experts = NG.NormalRows(256, N.row_width(256, 9, 2), 2, 9)
    many = NG.NormalRows(256, N.row_width(256, 65, 65), 65, 65)
    for f in (bad_width, bad_experts, many):
        msg = call(NG._counts, ctypes.byref(f), null, null, 0, 1, null, null)
        assert "epx_normal_counts: rows of hidden 256" in msg and "width" in msg, msg
    msg = call(NG._pack, ctypes.byref(good), -1, 0, null, 0, null, 0, 0, null, 0, 0, null, null,
               null, null, null, null)
    assert "epx_normal_pack: T = -1" in msg, msg
    msg = call(NG._pack, ctypes.byref(good), 4, 1, ctypes.c_void_p(8), 256, null, 0, 0, null, 0,
               0, null, ctypes.c_void_p(8), null, null, ctypes.c_void_p(8), ctypes.c_void_p(8))
    assert "scales for fp8" in msg, msg  # fp8 without scales
    msg = call(NG._pack, ctypes.byref(good), 1, 0, ctypes.c_void_p(8), 256, null, 0, 0,
               ctypes.c_void_p(8), 1, 33, null, ctypes.c_void_p(8), null, null,
               ctypes.c_void_p(8), ctypes.c_void_p(8))
    assert "top-k 33 outside 0..32" in msg, msg
    msg = call(NG._counts, ctypes.byref(good), ctypes.c_void_p(8), ctypes.c_void_p(8), 2, 1,
               ctypes.c_void_p(8), ctypes.c_void_p(8))
    assert "rank 2 of 2" in msg, msg
    msg = call(NG._unpack, ctypes.byref(good), 0, null, null, null, 0, 3, 0, null, null, null,
               null, null, null)
    assert "are required" in msg, msg
    msg = call(NG._fill, ctypes.byref(good), null, null, 2, null, null, 0, null)
    assert "y, rows and x are required" in msg, msg
    msg = call(NG._combined, ctypes.byref(good), null, 2, null, null, 4, null, null)
    assert "out and x (and weights for top-k) required" in msg, msg
    # nothing to do is no error, and launches nothing
    _gpu.call(NG._unpack, ctypes.byref(good), 0, null, null, null, 0, 0, 0, null, null, null,
              null, null, null, stream)
    _gpu.call(NG._fill, ctypes.byref(good), null, null, 0, null, null, 0, null, stream)
    _gpu.call(NG._combined, ctypes.byref(good), null, 0, null, null, 0, null, null, stream)


def test_combine_refusals_name_the_handle(nbuf):
    x, ids, w, per_rank, per_expert, in_rank = _one_rank(5)
    rx, _, rw, _, h, _ = _dispatch(nbuf, x, ids, w, per_rank, per_expert, in_rank)
    rx, rw = TB.cu(rx), TB.cu(rw)
    T = x.shape[0]
    with pytest.raises(ValueError, match=r"bias has 2 rows; the handle's dispatch sent %d" % T):
        nbuf.combine(rx, h, bias=TB.cu(torch.zeros((2, x.shape[1]), dtype=torch.bfloat16)))
    with pytest.raises(ValueError, match="bias is one tensor or a tuple of two"):
        nbuf.combine(rx, h, bias=(None, None, None))
    with pytest.raises(ValueError, match="topk_weights has 0 rows; the handle's dispatch"):
        nbuf.combine(rx, h, topk_weights=rw[:0])
    with pytest.raises(ValueError, match="x has hidden 128; the handle's dispatch sent 256"):
        nbuf.combine(TB.cu(torch.zeros((rx.shape[0], 128), dtype=torch.bfloat16)), h)
    with pytest.raises(ValueError, match="allocate_on_comm_stream needs previous_event"):
        nbuf.combine(rx, h, allocate_on_comm_stream=True)


def test_combine_resends_where_a_cuda_graph_leaves_the_engine_unknown(nbuf, monkeypatch):
    a = _one_rank(1)
    ra = _dispatch(nbuf, *a)
    eng = LoopEngine.made[-1]
    kinds = []

    def combine_kinds(h, capturing):
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing)
        eng.calls.clear()
        nbuf.combine(TB.cu(ra[0]), h)
        kinds.append([c[0] for c in eng.calls])

    combine_kinds(ra[4], False)  # eager, no graph yet: the engine holds ra's dispatch
    combine_kinds(ra[4], True)  # captured apart from its dispatch: resend inside the graph
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    rb = _dispatch(nbuf, *a)  # a dispatch captured: replays now move the engine
    combine_kinds(rb[4], True)  # captured with its dispatch: routed as captured
    combine_kinds(ra[4], False)  # eager after a capture: always resend
    combine_kinds(ra[4], False)
    assert kinds == [["combine"], ["dispatch", "combine"], ["combine"],
                     ["dispatch", "combine"], ["dispatch", "combine"]]


def test_dispatch_follows_deepeps_shapes_and_dtypes(nbuf):
    x, ids, w, per_rank, per_expert, in_rank = _one_rank(6)
    out = _dispatch(nbuf, x, TB.cu(ids.to(torch.int32)), w, per_rank, per_expert, in_rank)
    assert out[1].dtype == torch.int32  # recv_topk_idx in topk_idx's dtype
    with pytest.raises(ValueError, match="x has hidden 12; DeepEP's rows need a multiple of 8"):
        _dispatch(nbuf, TB.cu(torch.zeros((5, 12), dtype=torch.bfloat16)), ids, w, per_rank,
                  per_expert, in_rank)
    h = out[4]
    with pytest.raises(ValueError, match="bias has hidden 128, not the dispatch's 256"):
        nbuf.combine(TB.cu(out[0]), h, bias=TB.cu(torch.zeros((5, 128), dtype=torch.bfloat16)))
