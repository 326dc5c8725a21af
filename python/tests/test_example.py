"""examples/sglang_rebalance_hook.py: install() patches an engine's modules
in place, the patched functions answer like the engine's, and the demo runs."""
import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import epx

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sglang_rebalance_hook.py"


@pytest.fixture
def hook():
    spec = importlib.util.spec_from_file_location("sglang_rebalance_hook", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def fake_sglang(monkeypatch):
    """sglang.srt.eplb.{eplb_algorithms.deepseek, expert_location} as empty shells."""
    def sentinel(*a, **k):
        raise AssertionError("the engine's own function ran")
    names = ["sglang", "sglang.srt", "sglang.srt.eplb", "sglang.srt.eplb.eplb_algorithms",
             "sglang.srt.eplb.eplb_algorithms.deepseek", "sglang.srt.eplb.expert_location"]
    mods = {n: types.ModuleType(n) for n in names}
    mods["sglang.srt.eplb.eplb_algorithms.deepseek"].rebalance_experts = sentinel
    mods["sglang.srt.eplb.expert_location"].compute_logical_to_rank_dispatch_physical_map = \
        sentinel
    for n, m in mods.items():
        monkeypatch.setitem(sys.modules, n, m)
    return mods, sentinel


def test_install_patches_and_uninstall_restores(hook, fake_sglang):
    mods, sentinel = fake_sglang
    replaced = hook.install(verbose=False)
    ds = mods["sglang.srt.eplb.eplb_algorithms.deepseek"]
    loc = mods["sglang.srt.eplb.expert_location"]
    assert set(replaced) == {"sglang.srt.eplb.eplb_algorithms.deepseek.rebalance_experts",
                             "sglang.srt.eplb.expert_location."
                             "compute_logical_to_rank_dispatch_physical_map"}
    w = np.random.default_rng(0).random((3, 16)).astype(np.float32)
    got = ds.rebalance_experts(weight=w, num_replicas=24, num_groups=4, num_nodes=2,
                               num_gpus=4, enable_hierarchical=True)
    want = epx.rebalance_experts(w, 24, 4, 2, 4, True)
    for g, x in zip(got, want):
        np.testing.assert_array_equal(g, x)
    table = loc.compute_logical_to_rank_dispatch_physical_map(got[1], 4, 24, 2)
    if epx.has("epx_dispatch_table_compute"):
        assert table.shape == (3, 16)
    hook.uninstall(replaced)
    assert ds.rebalance_experts is sentinel and \
        loc.compute_logical_to_rank_dispatch_physical_map is sentinel


def test_epx_algorithm_from_the_environment(hook, fake_sglang, monkeypatch):
    if not epx.has("epx_plan_compute"):
        pytest.skip("this libepx has no planner")
    mods, _ = fake_sglang
    monkeypatch.setenv("EPX_EPLB_ALGORITHM", "epx")
    replaced = hook.install(verbose=False)
    w = np.random.default_rng(1).random((2, 16))
    p2l, l2p, cnt = mods["sglang.srt.eplb.eplb_algorithms.deepseek"].rebalance_experts(
        w, 24, 1, 1, 4, False)
    want = epx.rebalance_experts(w, 24, 1, 1, 4, False, algorithm="epx")
    np.testing.assert_array_equal(p2l, want[0])
    hook.uninstall(replaced)


def test_a_wrong_algorithm_is_refused_at_install(hook, fake_sglang, monkeypatch):
    monkeypatch.setenv("EPX_EPLB_ALGORITHM", "eplb2")
    with pytest.raises(ValueError, match="EPLB algorithm 'eplb2' \\(EPX_EPLB_ALGORITHM"):
        hook.install(verbose=False)


def test_demo_runs_standalone(hook, capsys):
    if not (epx.has("epx_balance_compute") and epx.has("epx_trace_synth")):
        pytest.skip("this libepx has no metrics or traces")
    assert hook.main(["--demo", "--model", "mixtral", "--gpus", "4", "--redundant", "4"]) == 0
    out = capsys.readouterr().out
    assert "after the hook" in out and "balancedness" in out


def test_dispatch_table_in_the_installed_releases_shape(hook, fake_sglang, monkeypatch):
    """The hook installs the dispatch-table function in the call shape of the
    SGLang release installed: 0.5.16's takes server_args first."""
    import inspect
    mods, _ = fake_sglang
    monkeypatch.setattr(hook, "installed_sglang_version", lambda: "0.5.16")
    replaced = hook.install(verbose=False)
    fn = mods["sglang.srt.eplb.expert_location"].compute_logical_to_rank_dispatch_physical_map
    assert list(inspect.signature(fn).parameters)[0] == "server_args"
    hook.uninstall(replaced)
    monkeypatch.setattr(hook, "installed_sglang_version", lambda: "0.5.23")
    replaced = hook.install(verbose=False)
    fn = mods["sglang.srt.eplb.expert_location"].compute_logical_to_rank_dispatch_physical_map
    assert list(inspect.signature(fn).parameters)[:2] == ["logical_to_all_physical_map",
                                                         "ep_size"]
    hook.uninstall(replaced)
