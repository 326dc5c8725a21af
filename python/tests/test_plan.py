"""The full planner through epx.plan(...) / epx.evaluate(...), and the
drop-in's algorithm="epx" keyword."""
import numpy as np
import pytest

import epx


def _needs(symbol):
    if not epx.has(symbol):
        pytest.skip("this libepx has no %s (its room has not landed)" % symbol)


def _counts(seed=1, S=3, L=4, E=64):
    rng = np.random.default_rng(seed)
    pop = rng.lognormal(0, 1.2, size=(L, E))
    return rng.poisson(pop[None] * 500, size=(S, L, E)).astype(float)


def test_plan_deepseek_equals_drop_in():
    _needs("epx_plan_compute")
    c = _counts()
    p = epx.plan(c, num_gpus=8, num_redundant=16, algorithm="deepseek")
    assert p.algorithm == "deepseek" and p.seconds >= 0
    p2l, _, cnt = epx.rebalance_experts(c.sum(axis=0), 80, 1, 1, 8, False)
    np.testing.assert_array_equal(p.physical_to_logical_map, p2l)
    np.testing.assert_array_equal(p.layout.num_valid, cnt)
    w = p.replica_weights
    assert w.shape == (4, 80)
    np.testing.assert_allclose(w, 1.0 / cnt[np.arange(4)[:, None], p2l])


def test_plan_auto_resolves_like_sglang():
    _needs("epx_plan_compute")
    c = _counts(E=64)
    assert epx.plan(c, 8, num_redundant=16, num_nodes=2, num_groups=8,
                    algorithm="auto").algorithm == "deepseek-hierarchical"
    assert epx.plan(c, 8, num_redundant=16, num_nodes=2, algorithm="auto").algorithm == "deepseek"


def test_epx_plan_is_valid_and_not_worse_than_deepseek():
    _needs("epx_plan_compute")
    _needs("epx_balance_compute")
    c = _counts(seed=5)
    mine = epx.plan(c, num_gpus=8, num_redundant=16)
    assert mine.algorithm == "epx"
    ds = epx.plan(c, num_gpus=8, num_redundant=16, algorithm="deepseek")
    load = c.sum(axis=0)
    e_mine, e_ds = epx.evaluate(mine, load), epx.evaluate(ds, load)
    assert e_mine.balancedness >= e_ds.balancedness - 1e-9
    assert 0 < e_mine.balancedness <= e_mine.bound + 1e-12 <= 1 + 1e-9
    w = mine.replica_weights
    p2l = mine.physical_to_logical_map
    for l in range(p2l.shape[0]):  # shares of one expert's replicas sum to 1
        np.testing.assert_allclose(np.bincount(p2l[l], weights=w[l], minlength=64), 1.0)


def test_drop_in_with_epx_algorithm():
    _needs("epx_plan_compute")
    c = _counts(seed=9)
    p2l, l2p, cnt = epx.rebalance_experts(c.sum(axis=0), 80, 1, 1, 8, False, algorithm="epx")
    assert p2l.dtype == l2p.dtype == cnt.dtype == np.int64
    assert p2l.shape == (4, 80) and l2p.shape == (4, 64, cnt.max())
    for l in range(4):
        for e in range(64):
            slots = np.flatnonzero(p2l[l] == e)
            k = cnt[l, e]
            assert len(slots) == k and (l2p[l, e, :k] == slots).all()  # ascending
            assert (l2p[l, e, k:] == -1).all()
    out = epx.rebalance_experts_from_windows(c, 80, 10, None, 1, "epx")
    assert out[0].shape == (4, 80)
    full = epx.rebalance_experts(c.sum(axis=0), 80, 1, 1, 8, False, algorithm="epx",
                                 log2phy_width="full")
    assert full[1].shape == (4, 64, 17)
    np.testing.assert_array_equal(full[1][:, :, :cnt.max()], l2p)
    assert (full[1][:, :, cnt.max():] == -1).all()
    with pytest.raises(ValueError, match="log2phy_width"):
        epx.rebalance_experts(c.sum(axis=0), 80, 1, 1, 8, False, algorithm="epx",
                              log2phy_width="wide")


def test_plan_is_freed_without_the_cycle_collector():
    """A Plan and its Layout form no reference cycle: the plan (16 MB of
    replica lists at DeepSeek-V3's 256-GPU shape) goes when its last user
    does, not when gc next runs; a Layout taken from it keeps it alive."""
    import gc
    import weakref
    _needs("epx_plan_compute")
    gc.disable()
    try:
        p = epx.plan(_counts(), num_gpus=8, num_redundant=16)
        ref = weakref.ref(p)
        lay = p.layout
        want = p.physical_to_logical_map
        del p
        assert ref() is not None  # the layout holds it
        np.testing.assert_array_equal(lay.physical_to_logical_map, want)
        del lay
        assert ref() is None
    finally:
        gc.enable()


def test_plan_option_errors():
    _needs("epx_plan_compute")
    c = _counts()
    with pytest.raises(ValueError):
        epx.plan(c, 8, algorithm="nope")
    with pytest.raises(epx.EpxError) as ei:
        epx.plan(c, 8, num_physical_experts=70)
    assert ei.value.status == epx.Status.SHAPE
    with pytest.raises(epx.EpxError) as ei:
        epx.plan(c, 8, num_redundant=16, algorithm="deepseek", estimate="recency")
    assert ei.value.status == epx.Status.INVALID_ARG


def test_num_physical_experts_and_num_redundant_must_agree():
    """Both given and disagreeing: num_redundant was dropped without a word."""
    _needs("epx_plan_compute")
    w = np.ones((2, 8))
    with pytest.raises(ValueError, match=r"num_physical_experts = 16 and num_redundant = 4 "
                                         r"disagree: with 8 experts P = E \+ num_redundant = 12"):
        epx.plan(w, num_gpus=4, num_physical_experts=16, num_redundant=4)
    p = epx.plan(w, num_gpus=4, num_physical_experts=12, num_redundant=4)  # agreeing: fine
    assert p.layout.num_physical_experts == 12


@pytest.mark.parametrize("estimate, param", [("sum", 5), ("minmax", 0), ("recency", 0),
                                             ("default", 0)])
def test_estimate_param_that_is_not_read_refused(estimate, param):
    """sum and minmax have no parameter; a half-life of 0 was taken as the default."""
    _needs("epx_plan_compute")
    with pytest.raises(ValueError, match=r"estimate_param = %d (does not apply|is no half-life)"
                       % param):
        epx.plan(np.ones((2, 2, 8)), 4, num_redundant=8, estimate=estimate,
                 estimate_param=param)
    for estimate, param in (("recency", 2), ("mean-std", 0), ("sum", -1)):  # read: fine
        epx.plan(np.ones((2, 2, 8)), 4, num_redundant=8, estimate=estimate, estimate_param=param)


@pytest.mark.parametrize("flags", [["0", "0", "1", "0"], [0.0, 0.0, 1.0, 0.0], [None] * 4])
def test_failed_gpus_must_be_booleans_or_integers(flags):
    """A string is truthy: ["0", "0", "1", "0"] marked every GPU failed and the
    message blamed the slots."""
    _needs("epx_plan_compute")
    with pytest.raises(TypeError, match=r"failed_gpus must hold booleans or integers"):
        epx.plan(np.ones((2, 8)), 4, num_redundant=8, algorithm="elasticity-aware",
                 failed_gpus=flags)
    a = epx.plan(np.ones((2, 8)), 4, num_redundant=8, algorithm="elasticity-aware",
                 failed_gpus=[0, 0, 2, 0])
    b = epx.plan(np.ones((2, 8)), 4, num_redundant=8, algorithm="elasticity-aware",
                 failed_gpus=[False, False, True, False])
    np.testing.assert_array_equal(a.physical_to_logical_map, b.physical_to_logical_map)
    with pytest.raises(TypeError, match=r"active_ranks must hold booleans or integers"):
        epx.sglang.rebalance_experts_from_windows(np.ones((1, 2, 8)), 16, 4, None, 1,
                                                  "elasticity_aware",
                                                  active_ranks=["1", "1", "0", "1"])
