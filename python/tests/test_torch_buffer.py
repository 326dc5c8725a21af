"""epx.torch.Buffer (DeepEP's low-latency API) on the CPU, in CI: the fp8
cast and the plain-torch references against independent loop/sort
formulations, EventOverlap, the refusal without a GPU, the handle exchange
over gloo (two processes, the engine faked), and the argument checks that
come before any GPU work (one process, the engine faked). The GPU half is
test_torch_buffer_gpu.py. Random cases are seeded; a failure names its seed."""
import datetime
import math
import os
import socket
import struct
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import epx  # noqa: E402
import epx.torch as et  # noqa: E402
from epx._native import EpxError, Status  # noqa: E402
from epx.torch import _gpu, _ll  # noqa: E402
from epx.torch import buffer as B  # noqa: E402

SEEDS = range(int(os.environ.get("EPX_TORCH_SEEDS", "12")))
FP8 = torch.float8_e4m3fn


# ---- per_token_cast_fp8 against a per-row, per-block loop ------------------------

def _f32(v):
    """v rounded to float32 (one rounding of a double: exact for +-*/)."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


def _f32_pow2_ceil_exp(v):
    """DeepEP's fast_log2_ceil of a positive float32: its exponent, plus one
    unless the mantissa is zero."""
    bits = struct.unpack("<I", struct.pack("<f", float(v)))[0]
    return ((bits >> 23) & 0xff) - 127 + (1 if bits & 0x7fffff else 0)


def check_cast_fp8(x, data, sc, round_scale=False, use_ue8m0=False, tag=""):
    """per_token_cast_fp8's (data, sc) of x [.., H] against DeepEP's kernel
    arithmetic, one row and one 128-value block at a time in numpy float32:
    amax = max(|x|, 1e-4); scale = amax * float32(1 / 448) and values
    x * (448 / amax), or with round_scale scale = 2**e, e = ceil(log2(that)),
    and values x * 2**-e; e4m3 saturating at 448; UE8M0: the exponent bytes
    of four blocks, little-endian in an int32."""
    H = x.shape[-1]
    rows = x.reshape(-1, H).float().numpy()
    n, S = rows.shape[0], H // 128
    want_d = torch.empty((n, H), dtype=FP8)
    scales = np.zeros((n, S), dtype=np.float32)
    for r in range(n):
        for b in range(S):
            blk = rows[r, b * 128:(b + 1) * 128]
            amax = max(np.abs(blk).max(), np.float32(1e-4))
            s = amax * np.float32(1 / 448)
            factor = np.float32(448) / amax
            if round_scale:
                e = _f32_pow2_ceil_exp(s)
                s, factor = np.float32(math.ldexp(1.0, e)), np.float32(math.ldexp(1.0, -e))
                assert s >= amax / np.float32(448)  # never below: nothing saturates
            scales[r, b] = s
            want_d[r, b * 128:(b + 1) * 128] = torch.from_numpy(
                np.clip(blk * factor, -448, 448)).to(FP8)
    assert torch.equal(_bits(data.reshape(n, H)), _bits(want_d)), tag + ": data"
    if not use_ue8m0:
        assert torch.equal(sc.reshape(n, S), torch.from_numpy(scales)), tag + ": scales"
        return
    packed = torch.empty((n, H // 512), dtype=torch.int32)
    for r in range(n):
        for j in range(H // 512):
            word = 0
            for i in range(4):
                v = float(scales[r, 4 * j + i])
                byte = math.frexp(v)[1] - 1 + 127  # the biased exponent of a power of two
                assert 0 < byte < 255 and v == math.ldexp(1.0, byte - 127)
                word |= byte << (8 * i)
            packed[r, j] = struct.unpack("<i", struct.pack("<I", word))[0]
    assert torch.equal(sc.reshape(n, H // 512), packed), tag + ": UE8M0 scales"


def _bits(t):
    return t.contiguous().view(torch.uint8)


CAST_CASES = [((5, 256), False, False), ((5, 256), True, False), ((3, 512), True, True),
              ((2, 3, 1024), True, True), ((2, 4, 384), False, False), ((0, 512), True, True),
              ((1, 128), False, False)]


@pytest.mark.parametrize("shape,round_scale,ue8m0", CAST_CASES)
@pytest.mark.parametrize("seed", SEEDS[:4])
def test_per_token_cast_fp8_is_the_block_loop(seed, shape, round_scale, ue8m0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    # Blocks of every magnitude, one all zeros (amax clamped at 1e-4), one tiny.
    x = x * torch.exp2(torch.randint(-20, 20, shape[:-1] + (shape[-1] // 128,),
                                     generator=g).float()).repeat_interleave(128, -1)
    if x.numel():
        x.view(-1, shape[-1])[0, :128] = 0
        x.view(-1, shape[-1])[-1, -128:] *= 1e-7
    x = x.to(torch.bfloat16)
    data, sc = B.per_token_cast_fp8(x, round_scale=round_scale, use_ue8m0=ue8m0)
    H = shape[-1]
    lead = tuple(shape[:-1])
    S = H // 512 if ue8m0 else H // 128
    assert data.dtype == FP8 and tuple(data.shape) == tuple(shape) and data.is_contiguous()
    assert sc.dtype == (torch.int32 if ue8m0 else torch.float32)
    assert tuple(sc.shape) == lead + (S,)
    if lead[-1] > 1 and S > 1:
        assert sc.stride(-2) == 1 and sc.stride(-1) == lead[-1], sc.stride()  # column-major
    check_cast_fp8(x, data, sc, round_scale, ue8m0, "seed %d" % seed)
    # dequantised: within e4m3's rounding (3 mantissa bits: 2**-4 relative;
    # subnormals: half of 2**-9 in scaled units) of the input
    if not ue8m0:
        blocks = sc.reshape(-1, S).repeat_interleave(128, -1)
        deq = data.reshape(-1, H).float() * blocks
        xf = x.reshape(-1, H).float()
        assert torch.all((deq - xf).abs() <= xf.abs() * 2**-4 + blocks * 2**-10), \
            "seed %d: dequantised values off" % seed
    amax = x.reshape(-1, S * (4 if ue8m0 else 1), 128).float().abs().amax(-1).clamp_min(1e-4)
    if round_scale and not ue8m0:  # a power of two, never below amax / 448
        s = sc.reshape(-1, S)
        assert torch.all(s >= amax / 448) and torch.all(torch.frexp(s).mantissa == 0.5)


def test_per_token_cast_fp8_scales_by_hand():
    # blocks of amax 3, 112, 1e-6 (clamped to 1e-4) and 896
    x = torch.tensor([[3.0] * 128 + [112.0] * 128 + [1e-6] * 128 + [-896.0] * 128])
    x = x.to(torch.bfloat16)
    data, sc = B.per_token_cast_fp8(x)
    # amax * float32(1 / 448), as DeepEP's kernel (not the nearest float to amax / 448)
    assert sc.flatten().tolist() == [_f32(3 * _f32(1 / 448)), 0.25,
                                     _f32(_f32(1e-4) * _f32(1 / 448)), 2.0]
    assert _f32(3 * _f32(1 / 448)) != _f32(3 / 448)
    data, sc = B.per_token_cast_fp8(x, round_scale=True)
    assert sc.flatten().tolist() == [2.0**-7, 2.0**-2, 2.0**-22, 2.0]
    assert data[0, 128:256].float().unique().tolist() == [448.0]
    assert data[0, 384:].float().unique().tolist() == [-448.0]
    assert data[0, :128].float().unique().tolist() == [384.0]  # 3 / 2**-7, rounded in e4m3
    _, packed = B.per_token_cast_fp8(x, round_scale=True, use_ue8m0=True)
    word = (127 - 7) | (127 - 2) << 8 | (127 - 22) << 16 | (127 + 1) << 24  # little-endian bytes
    assert packed.dtype == torch.int32 and packed.tolist() == [[word - 2**32]]


def test_per_token_cast_fp8_is_deepeps_kernel_formula():
    """Whole-tensor numpy float32, independent of the loop above; the same
    bits whatever torch's division by a scalar does on this machine."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn((64, 1024), generator=g).to(torch.bfloat16)
    xf = x.float().numpy().reshape(64, 8, 128)
    amax = np.maximum(np.abs(xf).max(-1), np.float32(1e-4)).astype(np.float32)
    scale_inv = amax * np.float32(1 / 448)  # float32 arithmetic, as the kernel's
    q = xf * (np.float32(448) / amax)[..., None]
    want_d = torch.from_numpy(np.clip(q, -448, 448).reshape(64, 1024)).to(FP8)
    data, sc = B.per_token_cast_fp8(x)
    assert torch.equal(sc, torch.from_numpy(scale_inv)), "scales"
    assert torch.equal(_bits(data), _bits(want_d)), "data"


def test_per_token_cast_fp8_refusals():
    with pytest.raises(ValueError, match="divisible by 128, not 200"):
        B.per_token_cast_fp8(torch.zeros(2, 200, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="round_scale"):
        B.per_token_cast_fp8(torch.zeros(2, 512, dtype=torch.bfloat16), use_ue8m0=True)
    with pytest.raises(ValueError, match="divisible by 512, not 256"):
        B.per_token_cast_fp8(torch.zeros(2, 256, dtype=torch.bfloat16), round_scale=True,
                             use_ue8m0=True)


# ---- reference_dispatch / reference_combine against brute force --------------------

def _ranks_case(seed, dup=True):
    """Every rank's (x, ids): ranks with 0 tokens, -1 holes, duplicate ids."""
    g = torch.Generator().manual_seed(seed)
    R = int(torch.randint(1, 5, (1,), generator=g))
    L = int(torch.randint(1, 5, (1,), generator=g))
    E, K = R * L, int(torch.randint(1, 7, (1,), generator=g))
    Tmax = int(torch.randint(1, 12, (1,), generator=g))
    # room for token 0's duplicates: one expert receives at most R * M entries
    M = Tmax + (K if dup else 0)
    H = int(torch.randint(1, 20, (1,), generator=g))
    Ts = [int(torch.randint(0, Tmax + 1, (1,), generator=g)) for _ in range(R)]
    if R > 1:
        Ts[seed % R] = 0
    xs, ids = [], []
    for T in Ts:
        xs.append(torch.randn((T, H), generator=g).to(torch.bfloat16))
        i = torch.randint(0, E, (T, K), generator=g)
        if dup and T:
            i[0, :] = i[0, 0]  # one token sends all its k to one expert
        i[torch.rand((T, K), generator=g) < 0.2] = -1
        ids.append(i)
    return dict(R=R, L=L, E=E, K=K, M=M, H=H, Ts=Ts, xs=xs, ids=ids, g=g)


def brute_dispatch(xs, ids, rank, E, M):
    """The entries (expert, source, token, k) sorted, sliced per local expert."""
    R = len(xs)
    L, H = E // R, xs[0].shape[1]
    entries = sorted((int(ids[s][t, k]), s, t, k) for s in range(R)
                     for t in range(ids[s].shape[0]) for k in range(ids[s].shape[1])
                     if rank * L <= int(ids[s][t, k]) < (rank + 1) * L)
    recv_x = torch.zeros((L, R * M, H), dtype=xs[0].dtype)
    src = torch.zeros((L, R * M), dtype=torch.int32)
    count = torch.zeros(L, dtype=torch.int32)
    per_src = np.zeros((L, R), dtype=np.int64)
    for e_gid, s, t, k in entries:
        e = e_gid - rank * L
        recv_x[e, int(count[e])] = xs[s][t]
        src[e, int(count[e])] = t
        count[e] += 1
        per_src[e, s] += 1
    begin = np.concatenate([np.zeros((L, 1), np.int64), per_src.cumsum(1)[:, :-1]], 1)
    layout = torch.from_numpy(begin * 2**32 + per_src)
    return recv_x, count, src, layout, entries


@pytest.mark.parametrize("seed", SEEDS)
def test_reference_dispatch_is_the_sorted_entries(seed):
    c = _ranks_case(seed)
    for rank in range(c["R"]):
        got = B.reference_dispatch(c["xs"], c["ids"], rank, c["E"], c["M"])
        want = brute_dispatch(c["xs"], c["ids"], rank, c["E"], c["M"])
        for name, a, b in zip(("recv_x", "recv_count", "src_info", "layout_range"), got, want):
            assert a.dtype == b.dtype and a.shape == b.shape, "seed %d: %s" % (seed, name)
            assert torch.equal(a, b), "seed %d rank %d: %s" % (seed, rank, name)
        recv_x, count, src, layout = got
        # the layout decodes to the counts; rows past the count are zeros
        for e in range(c["L"]):
            begins, ns = (layout[e] >> 32).tolist(), (layout[e] & 0xffffffff).tolist()
            assert sum(ns) == int(count[e])
            assert begins == [sum(ns[:s]) for s in range(c["R"])], "seed %d" % seed
            assert not recv_x[e, int(count[e]):].any() and not src[e, int(count[e]):].any()
        assert int(count.sum()) == len(want[4])


def test_reference_dispatch_order_and_encoding_by_hand():
    # 2 ranks, 2 experts each, M 3; rank 1 sends nothing; token 0 of rank 0 has expert 1 twice
    xs = [torch.arange(3 * 2, dtype=torch.float32).reshape(3, 2).to(torch.bfloat16),
          torch.empty((0, 2), dtype=torch.bfloat16)]
    ids = [torch.tensor([[1, 1, -1], [0, 1, 3], [-1, -1, -1]]), torch.empty((0, 3),
                                                                               dtype=torch.int64)]
    recv_x, count, src, layout = B.reference_dispatch(xs, ids, 0, 4, 3)
    assert count.tolist() == [1, 3]
    assert src[1, :3].tolist() == [0, 0, 1] and src[0, :1].tolist() == [1]
    assert torch.equal(recv_x[1, :3], xs[0][[0, 0, 1]])
    assert layout.tolist() == [[(0 << 32) | 1, (1 << 32) | 0], [(0 << 32) | 3, (3 << 32) | 0]]
    _, count1, _, layout1 = B.reference_dispatch(xs, ids, 1, 4, 3)
    assert count1.tolist() == [0, 1] and layout1.tolist() == [[0, 0], [1, 1 << 32]]


def _bf16_rne(a):
    """float32 array -> bfloat16 bits, round to nearest even (no NaN here)."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7fff + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def brute_combine(ys, ids, w):
    """numpy float32: acc = 0; acc = acc + w * y, k ascending; bf16 once."""
    T, K = ids.shape
    H = ys.shape[2]
    out = np.zeros((T, H), dtype=np.float32)
    for t in range(T):
        acc = np.zeros(H, dtype=np.float32)
        for k in range(K):
            if ids[t, k] >= 0:
                acc = acc + np.float32(w[t, k]) * ys[t, k]
        out[t] = acc
    return _bf16_rne(out)


@pytest.mark.parametrize("seed", SEEDS)
def test_reference_combine_is_the_k_ordered_fp32_sum(seed):
    c = _ranks_case(seed)
    g = c["g"]
    for r in range(c["R"]):
        ids, T, K, H = c["ids"][r], c["Ts"][r], c["K"], c["H"]
        if T:
            ids[-1] = -1  # a token routed nowhere
        w = torch.rand((T, K), generator=g) * 4 - 1
        ys = torch.randn((T, K, H), generator=g).to(torch.bfloat16)
        got = B.reference_combine(lambda t, k: ys[t, k], ids, w)
        want = brute_combine(ys.float().numpy(), ids.numpy(), w.numpy())
        if T and (ids >= 0).any():
            assert got.dtype == torch.bfloat16 and tuple(got.shape) == (T, H)
            assert np.array_equal(got.view(torch.int16).numpy().view(np.uint16), want), \
                "seed %d rank %d" % (seed, r)
        else:  # nothing routed: zeros, [T, 0] (expert_out never called: H is unknown)
            assert not got.float().any()


def test_reference_combine_rounds_each_step():
    # fp32 rounded at each step, k ascending: 1 + 2**-8, then the two 2**-24 are ties that
    # round back to it, and bf16 rounds that tie to even: 1.0. Summed exactly (or small
    # terms first) it is 1 + 2**-8 + 2**-23, above the tie: bf16 1 + 2**-7.
    ids = torch.tensor([[0, 1, 2, 3]])
    ys = torch.ones((1, 4, 1), dtype=torch.bfloat16)
    w = torch.tensor([[1.0, 2.0**-8, 2.0**-24, 2.0**-24]])
    assert B.reference_combine(lambda t, k: ys[t, k], ids, w).float().item() == 1.0
    w = torch.tensor([[2.0**-24, 2.0**-24, 2.0**-8, 1.0]])
    assert B.reference_combine(lambda t, k: ys[t, k], ids, w).float().item() == 1 + 2.0**-7
    assert B.reference_combine(lambda t, k: ys[t, k], torch.tensor([[0, -1, -1]]),
                               torch.tensor([[-0.5, 9.0, 9.0]])).float().item() == -0.5


# ---- EventOverlap -----------------------------------------------------------------

def test_event_overlap_without_an_event():
    ev = B.EventOverlap()
    assert ev.event is None and ev.extra_tensors is None
    with pytest.raises(AssertionError, match="no event"):
        ev.current_stream_wait()
    ran = []
    with ev:
        ran.append(1)
    with ev(release_handle=True) as inner:
        assert inner is ev
        ran.append(2)
    assert ran == [1, 2] and ev._release is False


def test_event_overlap_waits_runs_the_hook_once_and_releases(monkeypatch):
    waited = []

    class Stream:
        def wait_event(self, e):
            waited.append(e)

    monkeypatch.setattr(torch.cuda, "current_stream", lambda: Stream())
    marker = object()
    keep = (torch.zeros(1),)
    ev = B.EventOverlap(marker, keep)
    assert ev.extra_tensors is keep
    hooks = []
    ev.register_hook_after_wait(lambda: hooks.append("h"))
    with pytest.raises(AssertionError, match="already registered"):
        ev.register_hook_after_wait(lambda: None)
    ev.current_stream_wait()
    assert waited == [marker] and hooks == ["h"] and ev.event is marker
    ev.current_stream_wait()
    assert waited == [marker, marker] and hooks == ["h"]  # the hook ran once
    with ev:
        pass
    assert len(waited) == 3 and ev.event is marker
    with ev(release_handle=True):
        pass
    assert len(waited) == 4 and ev.event is None
    with ev:  # released: nothing to wait for
        pass
    assert len(waited) == 4


# ---- no GPU: a sentence, not a crash ------------------------------------------------

GPU_HERE = torch.cuda.is_available() and et.gpu_available() and _ll._open is not None


@pytest.mark.skipif(GPU_HERE, reason="a usable GPU is here: Buffer() would succeed")
def test_buffer_without_a_gpu_is_unsupported():
    for exc_type in (epx.EpxError, EpxError):
        with pytest.raises(exc_type) as ei:
            B.Buffer(None, low_latency_mode=True)
        assert ei.value.status == Status.UNSUPPORTED
        assert "epx.torch.Buffer needs" in ei.value.message and len(ei.value.message) > 40
    assert et.Buffer is B.Buffer and et.EventOverlap is B.EventOverlap



@pytest.mark.skipif(_ll._buffer_bytes is not None, reason="libepx_cuda.so computes the sizes here")
def test_size_hints_without_the_gpu_library_say_what_they_need():
    """The size hints said 'epx.torch got a CUDA tensor, but ...' where no
    tensor was given."""
    for call in (lambda: B.Buffer.get_low_latency_rdma_size_hint(128, 7168, 8, 256),
                 lambda: B.Config().get_nvl_buffer_size_hint(7168 * 2, 8)):
        with pytest.raises(EpxError, match="buffer size .* computed by libepx_cuda.so") as ei:
            call()
        assert ei.value.status == Status.UNSUPPORTED and "CUDA tensor" not in str(ei.value)


# ---- a faked engine: Buffer's own logic without a GPU -----------------------------------

def _blob(rank, hidden):
    return struct.pack("<ii", rank, hidden) + bytes([rank + 1]) * (_ll.INFO_BYTES - 8)


class FakeEngine:
    """_ll.Engine's interface on CPU tensors; records what Buffer asks of it.
    connect() reads R * INFO_BYTES bytes as the C engine does; on rank 0 a
    peer's different hidden is refused (the C engine names both configs)."""
    made = []
    fail_open_rank = None

    def __init__(self, cfg, rank, num_ranks, timeout_ms, mask=None):
        if rank == FakeEngine.fail_open_rank:
            raise EpxError(Status.CUDA, "fake open failed on rank %d" % rank)
        self.cfg, self.rank, self.num_ranks, self.timeout_ms = cfg, rank, num_ranks, timeout_ms
        self.mask = mask
        L, S, H = cfg.num_slots // num_ranks, num_ranks * cfg.max_tokens, cfg.hidden
        self.num_local = L
        self.recv_x = torch.zeros((L, S, H), dtype=torch.bfloat16)
        self.y = torch.zeros((L, S, H), dtype=torch.bfloat16)
        self.recv_count = torch.arange(1, L + 1, dtype=torch.int32)
        self.src_info = torch.zeros((L, S), dtype=torch.int32)
        self.layout_range = torch.zeros((L, num_ranks), dtype=torch.int64)
        if H % 128 == 0:  # the engine's fp8 receive views
            self.recv_fp8 = torch.zeros((L, S, H), dtype=torch.float8_e4m3fn)
            self.recv_scales = torch.zeros((L, H // 128, S)).transpose(1, 2)
            self.recv_scales_ue8m0 = torch.zeros((L, H // 512, S), dtype=torch.int32) \
                .transpose(1, 2) if H % 512 == 0 else None
        else:
            self.recv_fp8 = None
        self.calls, self.infos, self.destroyed = [], None, False
        self.generation = 0
        FakeEngine.made.append(self)

    def info(self):
        self.calls.append("info")
        return _blob(self.rank, self.cfg.hidden)

    def connect(self, infos):
        self.calls.append("connect")
        blob = b"".join(infos)
        # the C contract: every rank's INFO_BYTES, in rank order
        assert len(blob) == self.num_ranks * _ll.INFO_BYTES, \
            "connect got %d bytes of infos for %d ranks" % (len(blob), self.num_ranks)
        self.infos = list(infos)
        peers = [struct.unpack("<ii", blob[i * _ll.INFO_BYTES:i * _ll.INFO_BYTES + 8])
                 for i in range(self.num_ranks)]
        # shrink mode: an all-zero info is a rank that never opened (the C
        # engine masks it)
        absent = [self.mask is not None and i == bytes(_ll.INFO_BYTES) for i in infos]
        assert [r for i, (r, _) in enumerate(peers) if not absent[i]] == \
            [r for r in range(self.num_ranks) if not absent[r]], peers
        peers = [p for i, p in enumerate(peers) if not absent[i]]
        for r, h in peers:
            if h != self.cfg.hidden and self.rank == 0:
                raise EpxError(Status.INVALID_ARG, "fake connect: rank 0 has hidden %d, rank %d "
                               "has %d" % (self.cfg.hidden, r, h))

    def dispatch(self, parts, x, ids, stream=None):
        self.calls.append(("dispatch", parts, None if x is None else tuple(x.shape),
                           None if ids is None else ids.dtype))

    def combine(self, parts, y, weights, out, stream=None):
        self.calls.append(("combine", parts, y, None if weights is None else
                           tuple(weights.shape), None if out is None else tuple(out.shape)))

    def disconnect(self):
        self.calls.append("disconnect")

    def destroy(self):
        self.destroyed = True


def _fake_gpu(set_attr, engine=FakeEngine, need=1000):
    """What lets Buffer be built without a GPU: the GPU library and a device
    pretended, the engine faked."""
    set_attr(_gpu, "reason", lambda: None)
    set_attr(_ll, "_open", object())
    set_attr(torch.cuda, "is_available", lambda: True)
    set_attr(torch.cuda, "current_device", lambda: 0)
    set_attr(torch.cuda, "is_current_stream_capturing", lambda: False)
    set_attr(_ll, "buffer_bytes", lambda cfg, n: need)
    set_attr(_ll, "Engine", engine)
    set_attr(B, "_new_mask", lambda n: torch.zeros((n,), dtype=torch.int32))
    set_attr(torch.cuda, "synchronize", lambda *a: None)  # destroy() waits for the GPU
    set_attr(torch.cuda, "current_stream", lambda *a: types.SimpleNamespace(cuda_stream=0))
    FakeEngine.made = []
    FakeEngine.fail_open_rank = None


def _init_gloo(rank, world, store):
    """A gloo group met through a file (no TCP port to race for) on the
    loopback interface (no host name to resolve)."""
    import torch.distributed as dist
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    return dist


def _spawn(fn, nprocs, *args):
    """fn(rank, world, *args) in nprocs fresh processes over one gloo group;
    an exception or a non-zero exit in any of them fails the caller."""
    import tempfile
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_entry, args=(fn, nprocs, os.path.join(d, "store")) + args, nprocs=nprocs,
                 join=True)


def _entry(rank, fn, world, store, *args):
    dist = _init_gloo(rank, world, store)
    try:
        fn(rank, world, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Done: leave without the interpreter's teardown, where gloo's threads,
    # still referenced by the test's Buffers, can meet C++ static destructors
    # and abort the process ("terminate called without an active exception",
    # seen once in about ten runs).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _worker_exchange(rank, world):
    import torch.distributed as dist

    def set_attr(obj, name, value):
        setattr(obj, name, value)

    _fake_gpu(set_attr)
    buf = B.Buffer(dist.group.WORLD, num_rdma_bytes=1000, low_latency_mode=True,
                   explicitly_destroy=True, timeout_ms=1234)
    assert (buf.rank, buf.group_size, buf.device) == (rank, world, 0)
    # A: both connect; a second call of the shape gets the same engine back
    eng = buf._engine(64, 4, 8, 16)
    assert isinstance(eng, FakeEngine) and eng.rank == rank and eng.num_ranks == world
    assert eng.timeout_ms == 1234 and (eng.cfg.hidden, eng.cfg.top_k, eng.cfg.num_slots,
                                       eng.cfg.max_tokens) == (64, 4, 8, 16)
    assert eng.cfg.mode == _ll.MODE_LOW_LATENCY and eng.cfg.x_dtype == _ll.DTYPE_BF16
    assert eng.infos == [_blob(r, 64) for r in range(world)], "infos not in rank order"
    assert eng.calls == ["info", "connect"] and not eng.destroyed
    assert buf._engine(64, 4, 8, 16) is eng and len(FakeEngine.made) == 1
    other = buf._engine(64, 4, 8, 8)  # another shape: another engine, collectively
    assert other is not eng and len(FakeEngine.made) == 2
    # B: rank 0's connect refuses rank 1's hidden; both ranks raise, naming rank 0
    # (a shape neither rank has yet: the first call of a shape is the collective one)
    hidden = 64 if rank == 0 else 128
    with pytest.raises(EpxError, match="failed on rank 0") as ei:
        buf._engine(hidden, 4, 8, 32)
    assert "hidden 64" in str(ei.value) and "rank 1 has 128" in str(ei.value)
    failed = FakeEngine.made[-1]
    assert failed.cfg.hidden == hidden and failed.destroyed, "the failed engine was kept"
    assert (hidden, 4, 8, 32) not in buf._engines
    # sizes, checked before anything collective
    small = B.Buffer(dist.group.WORLD, num_rdma_bytes=999, low_latency_mode=True)
    with pytest.raises(ValueError, match=r"num_rdma_bytes \(999\) is below the 1000 bytes"):
        small._engine(64, 4, 8, 16)
    with pytest.raises(ValueError, match=r"num_experts \(3\) must be a multiple of the "
                       r"group's 2 ranks"):
        buf._engine(64, 4, 3, 16)
    n = len(FakeEngine.made)
    assert B.Buffer(dist.group.WORLD, num_rdma_bytes=0, low_latency_mode=True)._engine(
        64, 4, 8, 16) is not eng and len(FakeEngine.made) == n + 1  # 0: unchecked
    buf.destroy()
    assert all(e.destroyed for e in (eng, other)) and not buf._engines
    buf.destroy()  # twice: nothing more
    with pytest.raises(ValueError, match="destroyed"):
        buf.clean_low_latency_buffer(16, 64, 8)


def test_handle_exchange_over_gloo_two_processes():
    _spawn(_worker_exchange, 2)


def _worker_open_fails_on_one_rank(rank, world):
    import torch.distributed as dist

    def set_attr(obj, name, value):
        setattr(obj, name, value)

    _fake_gpu(set_attr)
    FakeEngine.fail_open_rank = 1
    buf = B.Buffer(dist.group.WORLD, low_latency_mode=True)
    with pytest.raises(EpxError, match="failed on rank 1.*fake open failed"):
        buf._engine(64, 4, 8, 16)
    if rank == 0:
        assert FakeEngine.made[0].destroyed
        # a rank whose peer could not open must not call connect with its empty info
        assert "connect" not in FakeEngine.made[0].calls


def test_open_failing_on_one_rank_fails_every_rank_without_connecting():
    _spawn(_worker_open_fails_on_one_rank, 2)


# ---- one process (gloo world of 1): argument checks before any GPU work --------------

class FakeCuda(torch.Tensor):
    """A CPU tensor that says it lives on cuda:0, so that the checks past the
    device's can be reached on a machine without a GPU."""

    @property
    def device(self):
        return torch.device("cuda", 0)


def cu(t):
    return t.as_subclass(FakeCuda)


@pytest.fixture(scope="module")
def world1(tmp_path_factory):
    import torch.distributed as dist
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    _init_gloo(0, 1, str(tmp_path_factory.mktemp("gloo") / "store"))
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.fixture
def buf(world1, monkeypatch):
    _fake_gpu(monkeypatch.setattr)
    return B.Buffer(world1, low_latency_mode=True, explicitly_destroy=True)


def _inputs(T=3, H=256, K=4, E=8, ids_dtype=torch.int64):
    x = cu(torch.randn((T, H)).to(torch.bfloat16))
    ids = cu(torch.randint(0, E, (T, K)).to(ids_dtype))
    return x, ids


def test_dispatch_argument_checks(buf):
    x, ids = _inputs()
    with pytest.raises(ValueError, match="x has dtype torch.float32.*torch.bfloat16"):
        buf.low_latency_dispatch(cu(torch.zeros(3, 256)), ids, 8, 8)
    with pytest.raises(ValueError, match=r"x is on cpu, but this Buffer's GPU is cuda:0"):
        buf.low_latency_dispatch(torch.zeros(3, 256, dtype=torch.bfloat16), ids, 8, 8)
    with pytest.raises(ValueError, match="topk_idx is on cpu"):
        buf.low_latency_dispatch(x, torch.zeros((3, 4), dtype=torch.int64), 8, 8)
    with pytest.raises(ValueError, match="topk_idx has dtype torch.float32"):
        buf.low_latency_dispatch(x, cu(torch.zeros(3, 4)), 8, 8)
    with pytest.raises(ValueError, match="x must be a torch.Tensor, not list"):
        buf.low_latency_dispatch([[0.0]], ids, 8, 8)
    with pytest.raises(ValueError, match="x must have 2 dimensions"):
        buf.low_latency_dispatch(cu(torch.zeros(3, 2, 128, dtype=torch.bfloat16)), ids, 8, 8)
    with pytest.raises(ValueError, match="contiguous"):
        buf.low_latency_dispatch(cu(torch.zeros(256, 3, dtype=torch.bfloat16).t()), ids, 8, 8)
    with pytest.raises(ValueError, match="topk_idx has 2 rows but x has 3 tokens"):
        buf.low_latency_dispatch(x, ids[:2], 8, 8)
    with pytest.raises(ValueError, match="x has 3 tokens, above num_max_dispatch_tokens_per_rank "
                       r"\(2\)"):
        buf.low_latency_dispatch(x, ids, 2, 8)
    with pytest.raises(ValueError, match="65 columns"):
        buf.low_latency_dispatch(x, cu(torch.zeros((3, 65), dtype=torch.int64)), 8, 8)
    with pytest.raises(ValueError, match="async_finish and return_recv_hook"):
        buf.low_latency_dispatch(x, ids, 8, 8, async_finish=True, return_recv_hook=True)
    with pytest.raises(ValueError, match="round_scale"):
        buf.low_latency_dispatch(x, ids, 8, 8, use_ue8m0=True)
    with pytest.raises(NotImplementedError, match="dispatch_wait_recv_cost_stats"):
        buf.low_latency_dispatch(x, ids, 8, 8, dispatch_wait_recv_cost_stats=cu(
            torch.zeros(1, dtype=torch.int64)))
    with pytest.raises(ValueError, match="num_max_dispatch_tokens_per_rank must be >= 1, not 0"):
        buf.low_latency_dispatch(x, ids, 0, 8)
    with pytest.raises(ValueError, match="num_experts must be an int"):
        buf.low_latency_dispatch(x, ids, 8, 8.0)
    # a world of 1 holds all 8 experts locally
    with pytest.raises(ValueError, match="has 3 entries, not the 8 local experts"):
        buf.low_latency_dispatch(x, ids, 8, 8, cumulative_local_expert_recv_stats=cu(
            torch.zeros(3, dtype=torch.int32)))
    assert FakeEngine.made == [], "a refused call created an engine"


def test_first_call_of_a_shape_under_capture_is_refused(buf, monkeypatch):
    x, ids = _inputs()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(ValueError, match="run one call before capturing"):
        buf.low_latency_dispatch(x, ids, 8, 8, use_fp8=False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    buf.low_latency_dispatch(x, ids, 8, 8, use_fp8=False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    buf.low_latency_dispatch(x, ids, 8, 8, use_fp8=False)  # the engine exists: fine
    assert len(FakeEngine.made) == 1


def test_constructor_checks(world1, monkeypatch):
    _fake_gpu(monkeypatch.setattr)
    with pytest.raises(ValueError, match="torch.distributed group"):
        B.Buffer(None, low_latency_mode=True)
    with pytest.raises(ValueError, match="mpi4py"):
        B.Buffer(None, low_latency_mode=True, comm=object())
    with pytest.raises(ValueError, match="num_rdma_bytes must be a non-negative int, not -1"):
        B.Buffer(world1, num_rdma_bytes=-1, low_latency_mode=True)
    with pytest.raises(ValueError, match="timeout_ms must be a non-negative int, not True"):
        B.Buffer(world1, low_latency_mode=True, timeout_ms=True)
    normal = B.Buffer(world1, low_latency_mode=False)
    x, ids = _inputs()
    with pytest.raises(ValueError, match="low_latency_mode=True"):
        normal.low_latency_dispatch(x, ids, 8, 8)
    with pytest.raises(ValueError, match="low_latency_mode=True"):
        normal.clean_low_latency_buffer(8, 256, 8)
    with pytest.raises(AssertionError, match="explicitly_destroy"):
        normal.destroy()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(EpxError, match="none is visible") as ei:
        B.Buffer(world1, low_latency_mode=True)
    assert ei.value.status == Status.UNSUPPORTED
    monkeypatch.setattr(_gpu, "reason", lambda: "the reason given")
    with pytest.raises(EpxError, match="the reason given"):
        B.Buffer(world1, low_latency_mode=True)
    monkeypatch.setattr(_gpu, "reason", lambda: None)
    monkeypatch.setattr(_ll, "_open", None)
    with pytest.raises(EpxError, match="this build lacks it"):
        B.Buffer(world1, low_latency_mode=True)


def record_engine_bytes(monkeypatch, value):
    """_ll.buffer_bytes answering `value`; returns the list of (hidden,
    top-k, slots, max tokens, ranks) it was asked for."""
    seen = []

    def bytes_of(cfg, n):
        seen.append((cfg.hidden, cfg.top_k, cfg.num_slots, cfg.max_tokens, n))
        return value

    monkeypatch.setattr(_ll, "buffer_bytes", bytes_of)
    return seen


def test_size_hint_rounds_the_engines_bytes_up_at_top_k_11(monkeypatch):
    seen = record_engine_bytes(monkeypatch, 1000)
    assert B.Buffer.get_low_latency_rdma_size_hint(128, 7168, 8, 256) == 1024
    assert seen == [(7168, 11, 256, 128, 8)]
    with pytest.raises(ValueError, match="hidden must be >= 1"):
        B.Buffer.get_low_latency_rdma_size_hint(128, 0, 8, 256)


def test_dispatch_and_combine_drive_the_engine_as_deepep(buf):
    x, ids = _inputs(T=3, H=256, K=4, E=8)
    stats = cu(torch.zeros(8, dtype=torch.int32))
    recv_x, cnt, handle, ev, hook = buf.low_latency_dispatch(
        x, ids, 8, 8, cumulative_local_expert_recv_stats=stats, use_fp8=False)
    eng, = FakeEngine.made
    assert eng.calls[-1] == ("dispatch", _ll.SEND | _ll.RECV, (3, 256), torch.int64)
    assert recv_x is eng.recv_x and cnt is eng.recv_count and hook is None
    assert ev.event is None and tuple(recv_x.shape) == (8, 8, 256)  # [L, R * M, H]
    assert handle[0] is eng.src_info and handle[1] is eng.layout_range
    assert handle[2:] == (8, 256, 8)
    assert stats.tolist() == list(range(1, 9))
    # return_recv_hook: the send half now, the receive half (and the stats) in the hook
    _, _, h2, _, hook = buf.low_latency_dispatch(
        x, ids.int(), 8, 8, cumulative_local_expert_recv_stats=stats, use_fp8=False,
        return_recv_hook=True)
    # int32 ids go as int64: every negative id means none, as DeepEP's
    assert eng.calls[-1] == ("dispatch", _ll.SEND, (3, 256), torch.int64)
    assert stats.tolist() == list(range(1, 9))
    hook()
    assert eng.calls[-1] == ("dispatch", _ll.RECV, None, None)
    assert stats.tolist() == [2 * i for i in range(1, 9)]
    # use_fp8: quantised by the engine's sending kernel, DeepEP's flags passed
    # on; the engine's fp8 views returned (the GPU test checks their bits
    # against per_token_cast_fp8)
    (d, s), _, handle, _, _ = buf.low_latency_dispatch(x, ids, 8, 8, round_scale=True)
    assert eng.calls[-1][:2] == ("dispatch", _ll.SEND | _ll.RECV | _ll.FP8 | _ll.ROUND_SCALE)
    assert d is eng.recv_fp8 and s is eng.recv_scales
    with pytest.raises(ValueError, match="hidden divisible by 512, not 256"):
        buf.low_latency_dispatch(x, ids, 8, 8, round_scale=True, use_ue8m0=True)
    (d, s), _, handle, _, hook = buf.low_latency_dispatch(
        x, ids, 8, 8, round_scale=True, return_recv_hook=True)
    assert eng.calls[-1][:2] == ("dispatch", _ll.SEND | _ll.FP8 | _ll.ROUND_SCALE)
    assert d is eng.recv_fp8 and s is eng.recv_scales  # handed out before the hook fills them
    hook()
    assert eng.calls[-1][:2] == ("dispatch", _ll.RECV)
    (d, s), _, handle, _, _ = buf.low_latency_dispatch(x, ids, 8, 8)  # DeepEP's default: fp8
    assert eng.calls[-1][:2] == ("dispatch", _ll.SEND | _ll.RECV | _ll.FP8)
    # combine: y is the caller's unless it is the engine's own (or zero_copy)
    w = cu(torch.rand(3, 4))
    out = cu(torch.empty(3, 256, dtype=torch.bfloat16))
    y = cu(torch.zeros(8, 8, 256, dtype=torch.bfloat16))
    # an earlier dispatch's handle: its rows were replaced (one dispatch per shape)
    with pytest.raises(ValueError, match="followed by another dispatch"):
        buf.low_latency_combine(y, ids, w, h2, out=out)
    got, ev, hook = buf.low_latency_combine(y, ids, w, handle, out=out)
    assert got is out and ev.event is None and hook is None
    assert eng.calls[-1] == ("combine", _ll.SEND | _ll.RECV, y, (3, 4), (3, 256))
    buf.low_latency_combine(cu(buf.get_next_low_latency_combine_buffer(handle)), ids, w, handle,
                            out=out)
    assert eng.calls[-1][2] is None
    buf.low_latency_combine(None, ids, w, handle, zero_copy=True, out=out)
    assert eng.calls[-1][:3] == ("combine", _ll.SEND | _ll.RECV, None)
    _, _, hook = buf.low_latency_combine(y, ids, w, handle, out=out, return_recv_hook=True)
    assert eng.calls[-1][:2] == ("combine", _ll.SEND)
    hook()
    assert eng.calls[-1] == ("combine", _ll.RECV, None, None, None)
    assert buf.get_next_low_latency_combine_buffer(handle) is eng.y
    buf.destroy()
    assert eng.destroyed and "disconnect" in eng.calls


def test_combine_argument_checks(buf, world1):
    x, ids = _inputs(T=3, H=256, K=4, E=8)
    _, _, handle, _, _ = buf.low_latency_dispatch(x, ids, 8, 8, use_fp8=False)
    w = cu(torch.rand(3, 4))
    y = cu(torch.zeros(8, 8, 256, dtype=torch.bfloat16))
    out = cu(torch.empty(3, 256, dtype=torch.bfloat16))
    other = B.Buffer(world1, low_latency_mode=True)
    _, _, other_handle, _, _ = other.low_latency_dispatch(x, ids, 8, 8, use_fp8=False)
    with pytest.raises(ValueError, match="does not come from a dispatch of this Buffer"):
        buf.low_latency_combine(y, ids, w, other_handle, out=out)
    with pytest.raises(ValueError, match="5-tuple"):
        buf.low_latency_combine(y, ids, w, list(handle), out=out)
    # an older shape's handle still finds its engine
    x2, ids2 = _inputs(T=2, H=128, K=2, E=8)
    buf.low_latency_dispatch(x2, ids2, 4, 8, use_fp8=False)
    buf.low_latency_combine(y, ids, w, handle, out=out)
    assert FakeEngine.made[0].calls[-1][0] == "combine"
    with pytest.raises(ValueError, match=r"x has shape \(8, 8, 128\); combine takes the "
                       r"dispatch's layout \(8, 8, 256\)"):
        buf.low_latency_combine(cu(torch.zeros(8, 8, 128, dtype=torch.bfloat16)), ids, w, handle,
                                out=out)
    with pytest.raises(ValueError, match="must both be \\[tokens, 4\\]"):
        buf.low_latency_combine(y, ids[:, :2].contiguous(), w[:, :2].contiguous(), handle,
                                out=out)
    with pytest.raises(ValueError, match="must both be"):
        buf.low_latency_combine(y, ids, w[:2], handle, out=out)
    with pytest.raises(ValueError, match="topk_weights has dtype torch.bfloat16"):
        buf.low_latency_combine(y, ids, w.to(torch.bfloat16), handle, out=out)
    with pytest.raises(ValueError, match=r"out has shape \(3, 128\)"):
        buf.low_latency_combine(y, ids, w, handle, out=cu(torch.empty(3, 128,
                                                                     dtype=torch.bfloat16)))
    with pytest.raises(ValueError, match="use_logfmt and zero_copy"):
        buf.low_latency_combine(y, ids, w, handle, out=out, use_logfmt=True, zero_copy=True)
    with pytest.raises(ValueError, match="async_finish and return_recv_hook"):
        buf.low_latency_combine(y, ids, w, handle, out=out, async_finish=True,
                                return_recv_hook=True)
    with pytest.raises(NotImplementedError, match="combine_wait_recv_cost_stats"):
        buf.low_latency_combine(y, ids, w, handle, out=out,
                                combine_wait_recv_cost_stats=cu(torch.zeros(1, dtype=torch.int64)))


def test_combine_refuses_a_token_count_other_than_the_dispatchs(buf):
    x, ids = _inputs(T=3, H=256, K=4, E=8)
    _, _, handle, _, _ = buf.low_latency_dispatch(x, ids, 8, 8, use_fp8=False)
    y = cu(torch.zeros(8, 8, 256, dtype=torch.bfloat16))
    # 2 rows of weights and out where the engine reads and writes 3
    with pytest.raises(ValueError, match="3"):
        buf.low_latency_combine(y, ids[:2], cu(torch.rand(2, 4)), handle,
                                out=cu(torch.empty(2, 256, dtype=torch.bfloat16)))


def test_health_asks_every_engine(buf, world1):
    x, ids = _inputs(T=3, H=256, K=4, E=8)
    buf.low_latency_dispatch(x, ids, 8, 8, use_fp8=False)
    eng, = FakeEngine.made
    asked = []
    eng.health = lambda: asked.append(True)
    buf.low_latency_health()
    assert asked == [True]


def test_shrink_mode_mask(world1, monkeypatch):
    """Shrink mode: the mask is shared with every engine of the Buffer;
    update/clean act on it, clean_low_latency_buffer runs an empty dispatch
    and combine on every engine (the barrier that masks an absent rank);
    without enable_shrink the mask calls refuse."""
    _fake_gpu(monkeypatch.setattr)
    buf = B.Buffer(world1, low_latency_mode=True, enable_shrink=True)
    assert buf.enable_shrink and buf.timeout_ms == 100000
    eng = buf._engine(64, 4, 8, 16)
    assert eng.mask is buf._mask and eng.mask.dtype == torch.int32 and eng.mask.shape == (1,)
    buf.low_latency_update_mask_buffer(0, True)
    assert eng.mask.tolist() == [1]
    buf.low_latency_clean_mask_buffer()
    assert eng.mask.tolist() == [0]
    with pytest.raises(ValueError, match="rank_to_mask 1 is outside the group's 1 ranks"):
        buf.low_latency_update_mask_buffer(1, True)
    with pytest.raises(ValueError, match="mask_status is on cpu"):
        buf.low_latency_query_mask_buffer(torch.zeros(1, dtype=torch.int32))
    gen = eng.generation
    eng.calls.clear()
    buf.clean_low_latency_buffer(16, 64, 8)
    assert [c[0] for c in eng.calls] == ["dispatch", "combine"] and eng.generation == gen + 1
    plain = B.Buffer(world1, low_latency_mode=True)
    assert plain._engine(64, 4, 8, 16).mask is None
    for call in (lambda: plain.low_latency_update_mask_buffer(0, True),
                 lambda: plain.low_latency_clean_mask_buffer(),
                 lambda: plain.low_latency_query_mask_buffer(torch.zeros(1, dtype=torch.int32))):
        with pytest.raises(ValueError, match="enable_shrink=True"):
            call()
    monkeypatch.setenv("EPX_GPU_EP_TIMEOUT_MS", "2500")
    assert B.Buffer(world1, low_latency_mode=True).timeout_ms == 2500
    monkeypatch.setenv("EPX_GPU_EP_TIMEOUT_MS", "soon")
    with pytest.raises(ValueError, match="EPX_GPU_EP_TIMEOUT_MS is 'soon'"):
        B.Buffer(world1, low_latency_mode=True)


def _worker_shrink_absent_rank(rank, world):
    """Shrink mode: rank 2 stops before the first call of a shape (DeepEP's
    --shrink-test stops rank 1 there); ranks 0 and 1 still create the engine
    within the timeout, with rank 2's info all zeros (the engine masks it), and
    a second shape sees rank 2 absent again; rank 2 makes its Buffer (as DeepEP's
    test does) and goes on to the end."""
    import time
    import torch.distributed as dist

    def set_attr(obj, name, value):
        setattr(obj, name, value)

    _fake_gpu(set_attr)
    buf = B.Buffer(dist.group.WORLD, low_latency_mode=True, enable_shrink=True,
                   explicitly_destroy=True, timeout_ms=1500)
    if rank == 2:
        return  # stopped: never calls the engine
    t0 = time.monotonic()
    eng = buf._engine(64, 4, 6, 16)
    assert 1.4 < time.monotonic() - t0 < 30, "the absent rank was not waited for, or too long"
    assert eng.infos == [_blob(0, 64), _blob(1, 64), bytes(_ll.INFO_BYTES)], eng.infos
    assert eng.calls == ["info", "connect"] and eng.mask is buf._mask
    other = buf._engine(64, 4, 6, 8)  # another shape: rank 2 absent again
    assert other.infos[2] == bytes(_ll.INFO_BYTES) and other is not eng


def test_shrink_mode_creation_leaves_out_a_stopped_rank():
    _spawn(_worker_shrink_absent_rank, 3)


def test_engine_sizes_past_int32_are_refused():
    # The kernels count entries and the combine's items in int32 (a 64-bit
    # division is a subroutine on the GPU): creation refuses sizes past that,
    # naming the product and what to lower, on any machine (no GPU needed).
    if _ll._buffer_bytes is None:
        pytest.skip("this libepx_cuda.so has no GPU EP engine")
    assert _ll.buffer_bytes(_ll.config(7168, 8, 8, 128), 1) > 0
    # (the combine's blocks of 256 threads take 4 * 256 bf16 values an item)
    with pytest.raises(EpxError, match=r"max_tokens \* ceil\(hidden / 1024\) = 2147483648 .*"
                                       r"lower max_tokens \(8388608\) or hidden \(262144\)"):
        _ll.buffer_bytes(_ll.config(262144, 1, 8, 1 << 23), 1)
    with pytest.raises(EpxError, match=r"exceed int32 indices: lower max_tokens \(268435456\)"):
        _ll.buffer_bytes(_ll.config(256, 8, 8, 1 << 28), 1)


def test_normal_mode_refuses_a_batch_bound_past_2_30():
    # Normal mode's first flag keeps bit 30 of its count for "the rows came
    # with it" (ll_dispatch.cuh's kRowsIn): max_tokens 2^30 is refused by
    # name, 2^30 - 1 is taken (K = 1 on one rank stays inside int32).
    if _ll._buffer_bytes is None:
        pytest.skip("this libepx_cuda.so has no GPU EP engine")
    cfg = _ll.config(16, 1, 1, (1 << 30) - 1)
    cfg.mode = 0  # EPX_EP_MODE_NORMAL
    assert _ll.buffer_bytes(cfg, 1) > 0
    cfg.max_tokens = 1 << 30
    with pytest.raises(EpxError, match=r"at most 2\^30 - 1 tokens a batch, not max_tokens "
                                       r"1073741824: lower max_tokens"):
        _ll.buffer_bytes(cfg, 1)
