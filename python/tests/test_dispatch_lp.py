"""Balanced dispatch in SGLang 0.5.23's form (epx.dispatch.balanced_log2phy_prob,
epx.sglang.LPLBSolver): log2phy_prob [E][X] as SGLang's LP path builds it.

Always: the max GPU load it implies equals the optimum of SGLang's LP (its
variables and constraints, solved by scipy's linprog) on seeded random
placements and batches; rows hold each expert's fraction of the batch;
cut lists gather the LP's slot fractions as SGLang does; the drop-in solver
all-reduces through ep_group.

With SGLang 0.5.23's sources (EPX_SGLANG_SRC: a folder holding the unpacked
wheel's sglang/; `pip download --no-deps sglang==0.5.23` and unzip it), its
own code runs on them: _topk_ids_logical_to_physical_probability refuses
CPU tensors (it calls a JIT CUDA kernel), so the draw runs through
sglang.test.kernels.lplb.dispatch_probability_torch_reference, the pure-torch
twin SGLang ships and tests that kernel against; and LPLBSolver itself runs
on the CPU with its three CUDA kernels replaced by SGLang's torch IPM
reference and the torch formulas its kernel headers state."""
import importlib.util
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import epx
from epx import dispatch

SEED = int(os.environ.get("EPX_TEST_SEED", "2708"))
SGLANG_SRC = os.environ.get("EPX_SGLANG_SRC")


def _random_case(rng, E, G, per, scale):
    """phy2log [P] (every expert once, the rest random), the uncut ascending
    lists [E][X] P wide as SGLang pads them, and skewed counts with zeros."""
    P = G * per
    p2l = np.concatenate([np.arange(E), rng.integers(0, E, P - E)])
    rng.shuffle(p2l)
    l2p = -np.ones((E, P), np.int64)
    for e in range(E):
        s = np.nonzero(p2l == e)[0]
        l2p[e, :len(s)] = s
    kind = rng.integers(0, 6, E)
    counts = np.where(kind == 0, 0, np.where(kind == 5, rng.integers(0, 8 * scale + 1, E),
                                             rng.integers(0, scale + 1, E)))
    return p2l, l2p, P, counts


def _sglang_lp(p2l, G, counts):
    """SGLang's LP (lplb_solver.py) by linprog: variables x per slot of a
    replicated expert, then M; for each replicated expert its x sum to its
    fraction of the batch; each GPU's x plus its single-copy experts'
    fractions <= M. Returns the optimum M."""
    from scipy.optimize import linprog
    E, P = len(counts), len(p2l)
    per = P // G
    frac = counts / max(counts.sum(), 1.0)
    cnt = np.bincount(p2l, minlength=E)
    red = np.nonzero(cnt[p2l] > 1)[0]
    base = np.zeros(G)
    for p in np.nonzero(cnt[p2l] == 1)[0]:
        base[p // per] += frac[p2l[p]]
    n = len(red) + 1
    c = np.zeros(n)
    c[-1] = 1
    logs = np.unique(p2l[red])
    a_eq = np.zeros((len(logs), n))
    for i, p in enumerate(red):
        a_eq[np.searchsorted(logs, p2l[p]), i] = 1
    a_ub = np.zeros((G, n))
    for i, p in enumerate(red):
        a_ub[p // per, i] = 1
    a_ub[:, -1] = -1
    res = linprog(c, A_ub=a_ub, b_ub=-base, A_eq=a_eq if len(logs) else None,
                  b_eq=frac[logs] if len(logs) else None, bounds=[(0, None)] * n,
                  method="highs")
    assert res.status == 0, res.message
    return res.fun


def _gpu_loads(prob, l2p, P, G):
    """GPU loads (fractions of the batch) a log2phy_prob puts on each GPU."""
    out = np.zeros(G)
    valid = l2p >= 0
    np.add.at(out, l2p[valid] // (P // G), prob[valid].astype(np.float64))
    return out


def test_optimum_equals_sglang_lp():
    pytest.importorskip("scipy.optimize", reason="scipy is not installed: no LP reference")
    rng = np.random.default_rng(SEED)
    for it in range(120):
        G = int(rng.integers(1, 9))
        per = int(rng.integers(1, 4))
        E = int(rng.integers(1, G * per + 1))
        p2l, l2p, P, counts = _random_case(rng, E, G, per, 3 if it % 3 == 0 else 50)
        prob = dispatch.balanced_log2phy_prob(counts, replicas=l2p, num_physical=P, num_gpus=G)
        assert prob.dtype == np.float32 and prob.shape == l2p.shape
        assert (prob[l2p < 0] == 0).all() and (prob >= 0).all()
        frac = counts / max(counts.sum(), 1)
        np.testing.assert_allclose(prob.sum(1), frac, rtol=1e-6, atol=1e-7,
                                   err_msg="seed %d it %d" % (SEED, it))
        assert (prob[counts == 0] == 0).all(), (SEED, it)
        z = _sglang_lp(p2l, G, counts)
        got = _gpu_loads(prob, l2p, P, G).max()
        assert abs(got - z) <= 1e-6 * max(z, 1e-3), ("seed", SEED, it, got, z)


def test_cut_lists_gather_the_slot_fractions():
    """A rank whose lists SGLang cut to one replica reads that slot's fraction."""
    lay = epx.Layout.from_map(np.array([[0, 1, 0, 2, 0, 3]]), num_gpus=3)
    counts = np.array([30, 1, 1, 1])
    full = lay.logical_to_all_physical_map(lay.max_replicas)[0]
    prob = dispatch.balanced_log2phy_prob(counts, lay, 0)
    cut = np.array([[2], [1], [3], [5]])
    got = dispatch.balanced_log2phy_prob(counts, lay, 0, log2phy=cut)
    np.testing.assert_array_equal(got[:, 0], [prob[0, list(full[0]).index(2)], prob[1, 0],
                                              prob[2, 0], prob[3, 0]])
    with pytest.raises(ValueError, match=r"log2phy\[1\]\[0\] = 7"):
        dispatch.balanced_log2phy_prob(counts, lay, 0, log2phy=np.array([[0], [7], [3], [5]]))


def test_drop_in_solver_all_reduces():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(SEED + 1)
    p2l, l2p, P, _ = _random_case(rng, 16, 4, 6, 1)
    ids = torch.from_numpy(rng.integers(0, 16, size=(200, 4))).to(torch.int32)

    class TwoRanks:  # every rank saw this batch: the sum is twice it
        def all_reduce(self, t):
            assert t.dtype == torch.float32
            return t * 2

    for group, mult in ((None, 1), (TwoRanks(), 2)):
        s = epx.sglang.LPLBSolver(torch.from_numpy(p2l), torch.from_numpy(l2p), 4, group)
        got = s.solve(ids)
        counts = mult * np.bincount(ids.numpy().ravel(), minlength=16)
        want = dispatch.balanced_log2phy_prob(counts, replicas=l2p, num_physical=P, num_gpus=4)
        assert got.dtype == torch.float32 and tuple(got.shape) == l2p.shape
        np.testing.assert_array_equal(got.numpy(), want)
    empty = s.solve(torch.empty((0, 4), dtype=torch.int32))
    assert (empty.numpy() == 0).all()
    with pytest.raises(ValueError, match="not a multiple of num_gpus"):
        epx.sglang.LPLBSolver(p2l, l2p, 5)


# ---- SGLang 0.5.23's own code -------------------------------------------------

def _sglang_file(rel):
    if not SGLANG_SRC:
        pytest.skip("EPX_SGLANG_SRC is not set: no SGLang 0.5.23 sources to run (unpack "
                    "`pip download --no-deps sglang==0.5.23` and point it at the folder)")
    path = Path(SGLANG_SRC) / rel
    if not path.is_file():
        pytest.skip("%s is missing: EPX_SGLANG_SRC must hold an unpacked SGLang 0.5.23 wheel"
                    % path)
    ver = Path(SGLANG_SRC) / "sglang" / "_version.py"
    if ver.is_file() and "0.5.23" not in ver.read_text():
        pytest.skip("EPX_SGLANG_SRC is not SGLang 0.5.23 (%s)" % ver)
    return path


def _load(rel, name, monkeypatch, stubs=()):
    """Import one SGLang source file on its own, its sglang imports stubbed."""
    for mod, attrs in stubs:
        m = types.ModuleType(mod)
        m.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, mod, m)
    spec = importlib.util.spec_from_file_location(name, _sglang_file(rel))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sglang_draw_realises_the_shares(monkeypatch):
    torch = pytest.importorskip("torch")
    disp = _load("sglang/srt/eplb/expert_location_dispatch.py", "sgl_dispatch", monkeypatch, [
        ("sglang.srt.eplb.expert_location", {"get_global_expert_location_metadata": None}),
        ("sglang.srt.runtime_context", {"get_exec": None})])
    ref = _load("sglang/test/kernels/lplb.py", "sgl_lplb_ref", monkeypatch)
    rng = np.random.default_rng(SEED + 2)
    gen = torch.Generator().manual_seed(SEED + 2)
    for it in range(6):
        E, G, per = 12, 4, 5
        p2l, l2p, P, counts = _random_case(rng, E, G, per, 40)
        ids = np.repeat(np.arange(E), counts)  # the batch behind the counts, one id a row
        prob = dispatch.balanced_log2phy_prob(counts, replicas=l2p, num_physical=P, num_gpus=G)
        info = disp.ExpertLocationDispatchInfo(
            ep_dispatch_algorithm="lp", partial_logical_to_rank_dispatch_physical_map=None,
            partial_logical_to_all_physical_map=torch.from_numpy(l2p).to(torch.int32),
            partial_logical_to_all_physical_map_num_valid=torch.from_numpy((l2p >= 0).sum(1)),
            num_physical_experts=P)
        t_ids = torch.from_numpy(ids[:, None]).to(torch.int32)
        with pytest.raises(RuntimeError, match="requires CUDA tensors"):
            disp.topk_ids_logical_to_physical(t_ids, info, torch.from_numpy(prob))
        # SGLang's kernel twin, many draws of the same batch: mean load -> shares
        draws, hits = 400, np.zeros(P)
        for _ in range(draws):
            u = torch.rand(len(ids), generator=gen)
            phys = ref.dispatch_probability_torch_reference(
                t_ids, torch.from_numpy(prob), info.partial_logical_to_all_physical_map, u)
            phys = phys.numpy().ravel()
            assert (p2l[phys] == ids).all(), (SEED, it)
            hits += np.bincount(phys, minlength=P)
        split = dispatch.balanced_split(counts, replicas=l2p, num_physical=P, num_gpus=G)
        want = np.zeros(P)
        valid = l2p >= 0
        want[l2p[valid]] = (split.shares * counts[:, None])[valid]
        sd = np.sqrt(want * draws + 1) / draws  # binomial spread of the mean
        assert (np.abs(hits / draws - want) <= 6 * sd).all(), (SEED, it)


def _sglang_solver_on_cpu(monkeypatch):
    """SGLang's LPLBSolver class, its CUDA kernels replaced on the CPU by its
    torch IPM reference and the formulas lp_prep.cuh / lp_post.cuh state."""
    torch = pytest.importorskip("torch")
    ref = _load("sglang/test/kernels/lplb.py", "sgl_lplb_ref2", monkeypatch)

    def prep(A_full, b, t1, counts, log_single, log_replicated, B1, row_sum):
        norm = counts / counts.sum().clamp(min=1.0)
        t1.copy_(norm[log_single])
        b.copy_(torch.cat([norm[log_replicated], -(B1 @ t1).flatten()]))
        A_full[:, -1] = b - row_sum

    def solve(A, b, c, result=None):
        result.copy_(ref.solve_ipm_torch_reference(A, b, c))

    def post(out, x, t1, phy_single, phy_replicated, log2phy):
        phy = torch.zeros(len(phy_single) + len(phy_replicated) + 1)
        phy[phy_replicated] = x[:len(phy_replicated)].clamp(min=0)
        phy[phy_single] = t1
        out.copy_(torch.take(phy, log2phy))

    cuda = {"prep_lp_inputs": prep, "solve_ipm": solve, "extract_log2phy_prob": post}
    mod = _load("sglang/srt/eplb/lplb_solver.py", "sgl_lplb", monkeypatch, [
        ("sglang.srt.runtime_context", {"get_resources": None}),
        ("sglang.kernels.ops.lplb.torch_solver", {"warmup": lambda *a, **k: None}),
        ("sglang.kernels.ops.lplb.cuda_solver", cuda),
        ("sglang.kernels.ops.lplb", {"cuda_solver": types.SimpleNamespace(**cuda)})])
    return mod.LPLBSolver


def test_sglang_lp_never_beats_the_exact_optimum(monkeypatch):
    """SGLang's LP (5 IPM iterations in float32) against epx's exact split,
    the max GPU load its log2phy_prob implies, on the same inputs."""
    torch = pytest.importorskip("torch")
    solver_cls = _sglang_solver_on_cpu(monkeypatch)
    rng = np.random.default_rng(SEED + 3)
    worse = []
    for it in range(20):
        E, G, per = 32, 8, 5
        p2l, l2p, P, counts = _random_case(rng, E, G, per, 30)
        s = solver_cls(torch.from_numpy(p2l), torch.from_numpy(l2p), G, None,
                       torch.from_numpy((l2p >= 0).sum(1)))
        sg = s._solve(torch.from_numpy(counts).float()).numpy()
        ours = dispatch.balanced_log2phy_prob(counts, replicas=l2p, num_physical=P, num_gpus=G)
        frac = counts / max(counts.sum(), 1)
        # what SGLang's draw makes of each row: its fractions normalised to the
        # expert's share (a zero row falls back to uniform over the replicas)
        rows = sg.sum(1, keepdims=True)
        uni = (l2p >= 0) / (l2p >= 0).sum(1, keepdims=True)
        sg_eff = np.where(rows > 0, sg / np.where(rows > 0, rows, 1), uni) * frac[:, None]
        z_sg = _gpu_loads(sg_eff, l2p, P, G).max()
        z = _gpu_loads(ours, l2p, P, G).max()
        assert z <= z_sg + 1e-6, (SEED, it, z, z_sg)
        worse.append(z_sg / z if z > 0 else 1.0)
    print("SGLang 0.5.23's LP max GPU load / epx's exact optimum: median %.4f, max %.4f"
          % (np.median(worse), max(worse)))
