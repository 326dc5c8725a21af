"""epx.sglang.compute_logical_to_rank_dispatch_physical_map in each SGLang
release's call shape: <= 0.5.2 (num_gpus, no nodes), 0.5.3 - 0.5.16
(server_args), >= 0.5.17 (the node count from SGLang's runtime context), each
checked against the tables SGLang's own code computed
(tests/data/sglang_tables, from tools/sglang_tables.py)."""
import inspect
import json
import sys
import types

import numpy as np
import pytest

import epx
from conftest import REPO

TABLES = REPO / "tests" / "data" / "sglang_tables"
CASES = ["crafted_101_g8_n2", "crafted_104_g16_n2", "crafted_107_g4_n2", "crafted_100_g8_n1"]


def _case(name):
    path = TABLES / (name + ".json")
    if not path.exists():
        pytest.skip("tests/data/sglang_tables not found")
    return json.loads(path.read_text())


def _server_args(ep_size, nnodes, ep_join_mode=None):
    return types.SimpleNamespace(ep_size=ep_size, nnodes=nnodes, ep_join_mode=ep_join_mode)


@pytest.fixture
def runtime_context(monkeypatch):
    """A stand-in for sglang.srt.runtime_context (and the elastic-EP check)
    holding what SGLang >= 0.5.17 reads: get_parallel().ep_size / .nnodes,
    get_exec().moe.ep_join_mode. Returns a setter."""
    par = types.SimpleNamespace(ep_size=1, nnodes=1)
    moe = types.SimpleNamespace(ep_join_mode="normal")
    elastic = {"on": False}
    rc = types.ModuleType("sglang.srt.runtime_context")
    rc.get_parallel = lambda: par
    rc.get_exec = lambda: types.SimpleNamespace(moe=moe)
    el = types.ModuleType("sglang.srt.elastic_ep.elastic_ep")
    el.elastic_expanded_world_enabled = lambda: elastic["on"]
    for name in ["sglang", "sglang.srt", "sglang.srt.elastic_ep"]:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.runtime_context", rc)
    monkeypatch.setitem(sys.modules, "sglang.srt.elastic_ep.elastic_ep", el)

    def set_(ep_size, nnodes, join_mode="normal", expanded=False):
        par.ep_size, par.nnodes, moe.ep_join_mode = ep_size, nnodes, join_mode
        elastic["on"] = expanded
    return set_


@pytest.mark.parametrize("name", CASES)
def test_server_args_shape_of_0516(name):
    """0.5.16's call, by keyword as SGLang and its unit test call it, and
    positionally (server_args first): SGLang 0.5.16's own table, rank by rank."""
    d = _case(name)
    G, N, P = d["num_gpus"], d["num_nodes"], d["num_physical_experts"]
    l2p = np.array(d["logical_to_physical_map"])
    want = d["sglang"]["0.5.16"]["rank_dispatch_from_eplb"]
    sa = _server_args(G, N)
    f016 = epx.sglang.dispatch_map_for("0.5.16")
    for r in range(G):
        got = epx.sglang.compute_logical_to_rank_dispatch_physical_map(
            server_args=sa, logical_to_all_physical_map=l2p, ep_size=G,
            num_physical_experts=P, ep_rank=r)
        np.testing.assert_array_equal(got, want[r])
        np.testing.assert_array_equal(
            epx.sglang.compute_logical_to_rank_dispatch_physical_map(sa, l2p, G, P, r), want[r])
        np.testing.assert_array_equal(f016(sa, l2p, G, P, r), want[r])
        np.testing.assert_array_equal(
            f016(server_args=sa, logical_to_all_physical_map=l2p, ep_size=G,
                 num_physical_experts=P, ep_rank=r, seed=42), want[r])


@pytest.mark.parametrize("name", CASES)
def test_runtime_context_shape_of_0523(name, runtime_context):
    """0.5.23's call: no server_args, the node count read from SGLang's
    runtime context as that release reads it."""
    d = _case(name)
    G, N, P = d["num_gpus"], d["num_nodes"], d["num_physical_experts"]
    l2p = np.array(d["logical_to_physical_map"])
    want = d["sglang"]["0.5.23"]["rank_dispatch_from_eplb"]
    runtime_context(G, N)
    f023 = epx.sglang.dispatch_map_for("0.5.23")
    for r in range(G):
        np.testing.assert_array_equal(f023(l2p, G, P, r), want[r])
        np.testing.assert_array_equal(
            f023(logical_to_all_physical_map=l2p, ep_size=G, num_physical_experts=P,
                 ep_rank=r), want[r])
        np.testing.assert_array_equal(
            epx.sglang.compute_logical_to_rank_dispatch_physical_map(
                l2p, G, P, r, sglang_version="0.5.23"), want[r])


def test_plain_shape_of_052_unchanged():
    d = _case("crafted_101_g8_n2")
    G, P = d["num_gpus"], d["num_physical_experts"]
    l2p = np.array(d["logical_to_physical_map"])
    want = d["sglang"]["0.5.2"]["rank_dispatch_from_eplb"]
    np.testing.assert_array_equal(
        epx.sglang.compute_logical_to_rank_dispatch_physical_map(l2p, G, P, None), want)
    np.testing.assert_array_equal(epx.sglang.dispatch_map_for("0.5.2")(l2p, G, P, 3), want[3])


def test_signatures_are_the_releases():
    names = lambda f: list(inspect.signature(f).parameters)  # noqa: E731
    assert names(epx.sglang.dispatch_map_for("0.5.2")) == [
        "logical_to_all_physical_map", "num_gpus", "num_physical_experts", "ep_rank", "seed"]
    assert names(epx.sglang.dispatch_map_for("0.5.16")) == [
        "server_args", "logical_to_all_physical_map", "ep_size", "num_physical_experts",
        "ep_rank", "seed"]
    assert names(epx.sglang.dispatch_map_for("0.5.23")) == [
        "logical_to_all_physical_map", "ep_size", "num_physical_experts", "ep_rank", "seed"]
    assert epx.sglang.dispatch_map_for("0.5.4.post2").__name__ == \
        "compute_logical_to_rank_dispatch_physical_map"


def test_scale_joiner_and_expanded_world_have_no_node_preference(runtime_context):
    """ep_join_mode == "scale" (server_args, or the runtime context) and an
    expanded elastic world: SGLang drops the same-node preference, as one node."""
    d = _case("crafted_101_g8_n2")
    G, N, P = d["num_gpus"], d["num_nodes"], d["num_physical_experts"]
    l2p = np.array(d["logical_to_physical_map"])
    run = epx.sglang.compute_logical_to_rank_dispatch_physical_map
    for v in ["0.5.16", "0.5.23"]:
        one = run(l2p, G, P, None, sglang_version=v, nnodes=1)
        two = run(l2p, G, P, None, sglang_version=v, nnodes=N)
        assert not np.array_equal(one, two)  # the case does tell them apart
        if v == "0.5.16":
            np.testing.assert_array_equal(
                run(l2p, G, P, None, server_args=_server_args(G, N, "scale")), one)
            np.testing.assert_array_equal(
                run(l2p, G, P, None, server_args=_server_args(G, N)), two)
        else:
            runtime_context(G, N, "scale")
            np.testing.assert_array_equal(run(l2p, G, P, None, sglang_version=v), one)
            runtime_context(G, N, "normal", expanded=True)
            np.testing.assert_array_equal(run(l2p, G, P, None, sglang_version=v), one)
            runtime_context(G, N)
            np.testing.assert_array_equal(run(l2p, G, P, None, sglang_version=v), two)
            # epx's nnodes= overrides the context
            np.testing.assert_array_equal(run(l2p, G, P, None, sglang_version=v, nnodes=1), one)


def test_without_sglang_runtime_is_one_node(monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang.srt.runtime_context", None)  # import fails
    d = _case("crafted_101_g8_n2")
    G, P = d["num_gpus"], d["num_physical_experts"]
    l2p = np.array(d["logical_to_physical_map"])
    run = epx.sglang.compute_logical_to_rank_dispatch_physical_map
    np.testing.assert_array_equal(run(l2p, G, P, None, sglang_version="0.5.23"),
                                  run(l2p, G, P, None, sglang_version="0.5.23", nnodes=1))


def test_call_shape_errors():
    d = _case("crafted_101_g8_n2")
    G, N, P = d["num_gpus"], d["num_nodes"], d["num_physical_experts"]
    l2p = np.array(d["logical_to_physical_map"])
    run = epx.sglang.compute_logical_to_rank_dispatch_physical_map
    sa = _server_args(G, N)
    with pytest.raises(TypeError, match="runtime context"):
        run(l2p, G, P, 0, server_args=sa, sglang_version="0.5.23")
    with pytest.raises(TypeError, match="no server_args"):
        run(sa, l2p, G, P, 0, sglang_version="0.5.2")
    with pytest.raises(TypeError, match="unexpected keyword"):
        run(l2p, G, P, 0, nodes=2)
    with pytest.raises(TypeError, match="disagree"):
        run(l2p, G, P, 0, ep_size=G // 2)
    with pytest.raises(TypeError, match="needs"):
        run(l2p, G)
    with pytest.raises(epx.EpxError, match="nnodes"):
        run(l2p, G, P, 0, server_args=_server_args(G, 3))
    # one release parser for the CLI and Python (issue 29): the library's
    for bad in ("five", "0.5", "0.5.16rc1", "0.5.16+local"):
        with pytest.raises(epx.EpxError, match="is not MAJOR.MINOR.PATCH"):
            epx.sglang.dispatch_map_for(bad)
    with pytest.raises(epx.EpxError, match="older than 0.5.2"):
        epx.sglang.dispatch_map_for("0.4.0")


# ---- _compute_logical_to_all_physical_map, as SGLang 0.5.23's -----------------

def _all_physical(p2l, E):
    """What SGLang's loops build: each expert's slots in slot order, every
    list -1 padded to the longest."""
    lists = [[[p for p, x in enumerate(row) if x == e] for e in range(E)] for row in p2l]
    X = max(len(li) for layer in lists for li in layer)
    return [[li + [-1] * (X - len(li)) for li in layer] for layer in lists]


def test_all_physical_map_pads_experts_with_no_slot():
    """num_logical_experts above the ids present: SGLang gives -1 rows (epx
    raised INVALID_MAP)."""
    f = epx.compute_logical_to_all_physical_map
    assert f([[0, 1, 0, 1]], 3).tolist() == [[[0, 2], [1, 3], [-1, -1]]]
    rng = np.random.default_rng(5)
    for _ in range(50):
        L, P, E = rng.integers(1, 4), rng.integers(1, 12), rng.integers(1, 9)
        m = rng.integers(0, E, size=(L, P))
        got = f(m, E)
        assert got.dtype == np.int64
        assert got.tolist() == _all_physical(m.tolist(), E)


@pytest.mark.parametrize("m, E, kind, needle", [
    ([[0, 3]], 3, IndexError, r"physical_to_logical_map\[0\]\[1\] = 3 is outside \[0, 3\)"),
    ([[0, -1]], 3, IndexError, r"physical_to_logical_map\[0\]\[1\] = -1 is outside"),
    # SGLang 0.5.23 indexes an empty list: an IndexError (and a ValueError)
    ([[0, 1]], 0, IndexError, r"physical_to_logical_map\[0\]\[0\] = 0 is outside \[0, 0\)"),
    ([[0, 1]], 0, ValueError, "outside"),
    (np.zeros((1, 0), int), 0, ValueError, "no slot and no expert"),
    (np.zeros((0, 4), int), 2, ValueError, "no layer"),
    ([[0.0, 1.0]], 2, TypeError, "holds floats"),
    ([[0, 1]], 2.0, TypeError, "num_logical_experts must be an integer"),
])
def test_all_physical_map_errors_as_sglang(m, E, kind, needle):
    with pytest.raises(kind, match=needle):
        epx.compute_logical_to_all_physical_map(m, E)


def test_all_physical_map_stays_on_the_input_device(monkeypatch):
    torch = pytest.importorskip("torch")
    t = torch.tensor([[0, 1, 0, 1]])
    out = epx.compute_logical_to_all_physical_map(t, 3)
    assert out.device == t.device and out.dtype == torch.int64
    assert out.tolist() == [[[0, 2], [1, 3], [-1, -1]]]
    seen = []  # the device is handed to the tensor's maker (a CUDA input: CUDA out)
    real = epx._arrays.wrap
    monkeypatch.setattr(epx._arrays, "wrap", lambda a, tt, device=None:
                        seen.append(device) or real(a, tt, device))
    epx.compute_logical_to_all_physical_map(t, 2)
    assert seen == [t.device]


@pytest.mark.parametrize("nnodes", [2.5, "2", 2.0])
def test_server_args_nnodes_must_be_an_integer(nnodes):
    """int() cut 2.5 to 2 and parsed "2"; SGLang's argparse gives an int."""
    l2p = np.array([[[0, 4], [1, 5], [2, 6], [3, 7]]])
    run = epx.sglang.compute_logical_to_rank_dispatch_physical_map
    with pytest.raises(TypeError, match=r"server_args nnodes must be an integer, not"):
        run(l2p, 4, 8, 0, server_args=_server_args(4, nnodes))
    run(l2p, 4, 8, 0, server_args=_server_args(4, 2))
