"""epx.sglang's drop-ins on edge and invalid inputs, against what SGLang
0.5.23's own functions did with them (tests/data/sglang_edge_0523.json, from
tools/sglang_edge.py): where SGLang returns, the same values, dtype, shape
and device; where it raises, an exception that is an instance of every
standard class SGLang's was (so an engine test's pytest.raises(...) still
catches epx's), epx's own message kept. DELIBERATE lists the cases where
epx refuses what SGLang silently turns into nonsense."""
import builtins
import enum
import json
import sys
import types

import pytest

import epx
from conftest import REPO

torch = pytest.importorskip("torch", reason="torch is not installed (EPX_PY_TORCH=0)")

GOLDEN = REPO / "tests" / "data" / "sglang_edge_0523.json"
CASES = json.loads(GOLDEN.read_text())["cases"] if GOLDEN.exists() else []

# EplbAlgorithm's members by name, as the drop-in reads them (.name)
EplbAlgorithm = enum.Enum("EplbAlgorithm", [
    "deepseek", "deepseek_hierarchical", "deepseek_vec", "deepseek_vec_hierarchical",
    "elasticity_aware", "elasticity_aware_hierarchical"])

# case -> why epx deliberately differs from SGLang 0.5.23 there (the test
# requires that it still does: a case that agrees now leaves the list)
DELIBERATE = {
    "deepseek_negative_weight": "a negative load is no token count: epx refuses it, SGLang "
                                "plans on it",
    "deepseek_nan_weight": "a NaN load: epx refuses it, SGLang sorts it somewhere and plans",
    "deepseek_inf_weight": "an infinite load: epx refuses it, SGLang gives that expert every "
                           "spare slot",
    "windows_local_not_divisor": "12 slots, 5 a GPU: SGLang silently plans 2 GPUs of 6 slots "
                                 "(12 // 5), not the 5 a GPU it was given; epx refuses",
    "windows_algorithm_name": "epx also takes the algorithm's name (a str); SGLang's "
                              "dispatcher knows only EplbAlgorithm members",
    "l2a_zero_slots": "no slot at all: SGLang's empty table is float32 (torch.tensor of "
                      "empty lists); epx's is int64, as every other table",
    "l2a_negative_id": "SGLang files slot id -1 under expert E - 1 (list indexing) and "
                       "returns nonsense; epx raises IndexError",
    "l2a_bool_map": "a bool map is no expert-id map: SGLang reads True as expert 1, epx "
                    "refuses booleans",
    "table_rank_negative": "ep_rank is a rank: SGLang's tensor indexing gives -1 the last "
                           "rank's table, epx refuses it (ValueError)",
    "table_slots_not_multiple_of_gpus": "8 slots on 3 GPUs: SGLang's floor division (2 a "
                                        "GPU) puts slots on a GPU 3 that does not exist; "
                                        "epx refuses",
    "table_slot_out_of_range": "slot 7 of 6: SGLang dispatches to a slot that does not "
                               "exist; epx refuses",
    "l2a_rank_out_of_range": "moe_ep_rank 4 of 4 ranks: SGLang finds no replica near a rank "
                             "that does not exist and returns every list uncut; epx refuses",
}


def decode(v):
    """A golden's encoded argument as the call's (tools/sglang_edge.py's rule)."""
    if isinstance(v, dict) and "tensor" in v:
        dt, shape, layout = getattr(torch, v["dtype"]), v["shape"], v["layout"]
        base = torch.tensor(v["tensor"], dtype=torch.float64).reshape(shape)
        if layout == "contiguous":
            return base.to(dt).contiguous()
        if layout == "strided":
            wide = torch.zeros(list(shape[:-1]) + [2 * shape[-1]], dtype=torch.float64)
            wide[..., ::2] = base
            return wide.to(dt)[..., ::2]
        if layout == "transposed":
            return base.transpose(-1, -2).contiguous().to(dt).transpose(-1, -2)
        assert layout == "expanded", layout
        return base[:1].to(dt).expand(shape)
    if isinstance(v, dict) and "algorithm" in v:
        return EplbAlgorithm[v["algorithm"]]
    return v


@pytest.fixture
def runtime_context(monkeypatch):
    """SGLang's runtime context as 0.5.23's dispatch table reads it."""
    def install(ep_size, nnodes):
        par = types.SimpleNamespace(ep_size=ep_size, nnodes=nnodes)
        moe = types.SimpleNamespace(ep_join_mode="normal", moe_a2a_backend="deepep")
        rc = types.ModuleType("sglang.srt.runtime_context")
        rc.get_parallel = lambda: par
        rc.get_exec = lambda: types.SimpleNamespace(moe=moe)
        el = types.ModuleType("sglang.srt.elastic_ep.elastic_ep")
        el.elastic_expanded_world_enabled = lambda: False
        for name in ["sglang", "sglang.srt", "sglang.srt.elastic_ep"]:
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
        monkeypatch.setitem(sys.modules, "sglang.srt.runtime_context", rc)
        monkeypatch.setitem(sys.modules, "sglang.srt.elastic_ep.elastic_ep", el)
    return install


def epx_function(case, runtime_context):
    fn = case["fn"]
    if fn == "deepseek":
        return lambda *a, **k: epx.sglang.rebalance_experts(*a, **k, sglang_version="0.5.23")
    if fn == "windows":
        extra = {"sglang_version": "0.5.23"}
        if "active_ranks" in case:
            extra["active_ranks"] = case["active_ranks"]
        return lambda *a, **k: epx.sglang.rebalance_experts_from_windows(*a, **k, **extra)
    if fn == "l2a":
        return epx.sglang.compute_logical_to_all_physical_map
    if fn == "l2a_rank":  # the backend and nodes come from the runtime context, as in SGLang
        runtime_context(**case["context"])
        return epx.sglang.compute_logical_to_all_physical_map
    assert fn == "table", fn
    runtime_context(**case["context"])
    return epx.sglang.dispatch_map_for("0.5.23")


def run(case, runtime_context):
    f = epx_function(case, runtime_context)
    args = [decode(a) for a in case["args"]]
    kwargs = {k: decode(v) for k, v in case["kwargs"].items()}
    return f(*args, **kwargs)


def outcome(case, runtime_context):
    try:
        return "returns", run(case, runtime_context)
    except Exception as e:  # noqa: BLE001 - which one is the point
        return "raises", e


def differences(case, runtime_context):
    """How epx's outcome differs from SGLang's record ([] when it agrees)."""
    want = case["sglang"]
    kind, got = outcome(case, runtime_context)
    if "raises" in want:
        if kind == "returns":
            return ["SGLang raised %s; epx returned" % want["raises"]["class"]]
        missing = [b for b in want["raises"]["bases"]
                   if not isinstance(got, getattr(builtins, b))]
        return ["SGLang raised %s; epx's %s (%s) is no %s"
                % (want["raises"]["class"], type(got).__name__, got, ", ".join(missing))
                ] if missing else []
    if kind == "raises":
        return ["SGLang returned; epx raised %s: %s" % (type(got).__name__, got)]
    outs = list(got) if isinstance(got, tuple) else [got]
    if isinstance(got, tuple) != want["tuple"] or len(outs) != len(want["returns"]):
        return ["epx returned %d outputs (tuple: %s), SGLang %d (tuple: %s)"
                % (len(outs), isinstance(got, tuple), len(want["returns"]), want["tuple"])]
    diffs = []
    for i, (g, w) in enumerate(zip(outs, want["returns"])):
        if not isinstance(g, torch.Tensor):
            diffs.append("output %d is %s, not a tensor" % (i, type(g).__name__))
            continue
        have = {"dtype": str(g.dtype).replace("torch.", ""), "shape": list(g.shape),
                "device": str(g.device), "values": g.tolist()}
        diffs += ["output %d %s: epx %s, SGLang %s" % (i, k, have[k], w[k])
                  for k in ("dtype", "shape", "device", "values") if have[k] != w[k]]
    return diffs


@pytest.mark.skipif(not CASES, reason="tests/data/sglang_edge_0523.json not found")
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_as_sglang_0523(case, runtime_context):
    diffs = differences(case, runtime_context)
    if case["name"] in DELIBERATE:
        assert diffs, "%s agrees with SGLang now: drop it from DELIBERATE" % case["name"]
        return
    assert not diffs, "; ".join(diffs)


def test_the_golden_covers_each_function():
    if not CASES:
        pytest.skip("tests/data/sglang_edge_0523.json not found")
    assert {c["fn"] for c in CASES} == {"deepseek", "windows", "l2a", "l2a_rank", "table"}
    assert set(DELIBERATE) <= {c["name"] for c in CASES}
