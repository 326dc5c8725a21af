"""Balanced per-batch dispatch through the binding: the optimum max GPU load
against scipy's linprog (SGLang 0.5.23's LP: min z, sum_j x_ej = c_e,
GPU loads <= z) on random placements and batches (seeded), the shares an
optimal LP point, the integer counts and the routing within the stated
bounds, and determinism."""
import os

import numpy as np
import pytest

import epx
from epx import dispatch

SEED = int(os.environ.get("EPX_TEST_SEED", "2706"))


@pytest.fixture(autouse=True)
def _needs_balanced():
    if not epx.has("epx_dispatch_balanced_solve"):
        pytest.skip("this libepx has no balanced dispatch")


def _random_case(rng, E, G, per, scale):
    """A placement: every expert once, the rest random (two replicas on one
    GPU allowed), lists -1 padded; counts skewed with zeros."""
    P = G * per
    p2l = np.concatenate([np.arange(E), rng.integers(0, E, P - E)])
    rng.shuffle(p2l)
    W = P - E + 1
    rep = -np.ones((E, W), np.int64)
    for e in range(E):
        slots = np.nonzero(p2l == e)[0]
        rng.shuffle(slots)
        rep[e, :len(slots)] = slots
    kind = rng.integers(0, 8, E)
    counts = np.where(kind == 0, 0, np.where(kind == 7, rng.integers(0, 8 * scale + 1, E),
                                             rng.integers(0, scale + 1, E)))
    return rep, P, counts


def _lp_optimum(rep, P, G, counts):
    from scipy.optimize import linprog
    per = P // G
    cols = [(e, j) for e in range(rep.shape[0]) for j in range(rep.shape[1]) if rep[e, j] >= 0]
    n = len(cols) + 1  # x per replica column, then z
    c = np.zeros(n)
    c[-1] = 1.0
    a_eq = np.zeros((rep.shape[0], n))
    a_ub = np.zeros((G, n))
    for i, (e, j) in enumerate(cols):
        a_eq[e, i] = 1.0
        a_ub[rep[e, j] // per, i] = 1.0
    a_ub[:, -1] = -1.0
    res = linprog(c, A_ub=a_ub, b_ub=np.zeros(G), A_eq=a_eq, b_eq=counts.astype(float),
                  bounds=[(0, None)] * n, method="highs")
    assert res.status == 0, res.message
    return res.fun


def _check_split(rep, P, G, counts, split):
    per = P // G
    valid = rep >= 0
    sh = split.shares
    assert (sh[~valid] == 0).all() and (split.replica_counts[~valid] == 0).all()
    np.testing.assert_allclose(sh.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(split.replica_counts.sum(axis=1), counts)
    frac = np.zeros(G)
    ints = np.zeros(G, np.int64)
    for e, j in zip(*np.nonzero(valid)):
        g = rep[e, j] // per
        frac[g] += sh[e, j] * counts[e]
        ints[g] += split.replica_counts[e, j]
        assert split.slot_counts[rep[e, j]] == split.replica_counts[e, j]
        assert abs(split.replica_counts[e, j] - sh[e, j] * counts[e]) < 1 + 1e-9 * counts[e]
    np.testing.assert_allclose(frac, split.gpu_load, rtol=1e-9, atol=1e-9)
    assert abs(frac.max() - float(split.max_load)) <= 1e-9 * (1 + float(split.max_load))
    # every GPU's integer load is its fractional load rounded down or up
    assert (ints > split.gpu_load - 1 - 1e-9).all() and (ints < split.gpu_load + 1 + 1e-9).all()
    ceil = -(-split.max_load.numerator // split.max_load.denominator)
    assert ints.max() == split.max_load_int == ceil


def test_optimum_equals_linprog():
    pytest.importorskip("scipy.optimize", reason="scipy is not installed: no LP reference")
    rng = np.random.default_rng(SEED)
    for it in range(150):
        G = int(rng.integers(1, 9))
        per = int(rng.integers(1, 4))
        E = int(rng.integers(1, G * per + 1))
        rep, P, counts = _random_case(rng, E, G, per, 3 if it % 3 == 0 else 60)
        split = dispatch.balanced_split(counts, replicas=rep, num_physical=P, num_gpus=G)
        _check_split(rep, P, G, counts, split)
        z = _lp_optimum(rep, P, G, counts)
        assert abs(float(split.max_load) - z) <= 1e-6 * max(1.0, z), (SEED, it)


def test_kimi_and_deepseek_layers_against_linprog():
    pytest.importorskip("scipy.optimize", reason="scipy is not installed: no LP reference")
    rng = np.random.default_rng(SEED + 1)
    for E, G, per in ((384, 8, 52), (256, 32, 9)):
        rep, P, _ = _random_case(rng, E, G, per, 1)
        b = dispatch.Balancer(E, rep.shape[1], P, G)
        for T in (1, 7, 64, 512, 4096):
            u = rng.random((T, 8))
            ids = (E * u ** 3).astype(np.int64)
            counts = dispatch.count_ids(ids, E)
            split = b.solve(rep, counts)
            _check_split(rep, P, G, counts, split)
            z = _lp_optimum(rep, P, G, counts)
            assert abs(float(split.max_load) - z) <= 1e-6 * max(1.0, z), (SEED, E, T)


def test_routing_realises_the_counts_and_is_deterministic():
    rng = np.random.default_rng(SEED + 2)
    m = np.array([[0, 1, 2, 3, 0, 0, 1, 2], [3, 2, 1, 0, 3, 3, 3, 2]])
    lay = epx.Layout.from_map(m, num_gpus=4)
    ids = rng.integers(-1, 4, size=(1000, 2))
    for layer in range(2):
        slots, split = dispatch.balanced_topk(ids, lay, layer)
        assert ((m[layer][slots] == ids) | (ids < 0)).all()
        assert (slots[ids < 0] == -1).all()
        np.testing.assert_array_equal(np.bincount(slots[slots >= 0], minlength=8),
                                      split.slot_counts)
        again = epx.dispatch_topk(ids, lay, layer, mode="balanced")
        np.testing.assert_array_equal(slots, again)


def test_errors_name_the_problem():
    b = dispatch.Balancer(2, 2, 4, 2)
    with pytest.raises(epx.EpxError, match="slot 1 is listed twice"):
        b.solve(np.array([[0, 1], [1, -1]]), [1, 1])
    with pytest.raises(epx.EpxError, match=r"counts\[1\] = -3"):
        b.solve(np.array([[0, 1], [2, -1]]), [1, -3])
    with pytest.raises(ValueError, match=r"replicas\[1\] has a -1 before slot 2"):
        b.solve(np.array([[0, 1], [-1, 2]]), [1, 1])
    with pytest.raises(epx.EpxError, match="sum to"):
        b.route(np.array([[0, 1], [2, -1]]), np.array([[1, 0], [0, 0]]), [[0, 1]])
