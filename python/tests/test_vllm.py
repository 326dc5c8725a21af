"""epx.vllm against vLLM's own answers, release by release.

tests/data/vllm/eplb.json comes from tools/vllm_eplb.py, which ran each
release's own EPLB code (0.9.2 - 0.34.0, each side of every API change) on
every case three times: as released, with its sorts stable (equal loads in
ascending index order: epx's order) and with equal loads in descending index
order. So each case says whether a tie in vLLM's unstable sorts could change
the placement (`tie_free`), the replica counts or the per-GPU max load.
epx must equal the stable run slot for slot on every case and release
(float32 up to 0.13.0, float64 quotients and pack sums from 0.14.0), and
the release as released wherever no tie decided.
"""
import json

import numpy as np
import pytest

import epx
from conftest import REPO

GOLD = json.loads((REPO / "tests/data/vllm/eplb.json").read_text())
RUNS = [(c["name"], v) for c in GOLD["cases"] for v in c["vllm"]]
CASES = {c["name"]: c for c in GOLD["cases"]}


def _version(v):
    return tuple(int(x) for x in v.split("."))


# The one known departure (docs/TIES.md, Arithmetic): vLLM <= 0.13.0 adds a
# group's loads with torch's blocked CPU reduction, epx's float32 rule (as
# DeepSeek's own code is read) one by one; on float loads in groups of 16
# the two round apart. vLLM >= 0.14.0 sums with numpy, which epx reproduces.
def _torch_group_sums(name, version):
    return name == "numpy_group_sums_n2" and _version(version) < (0, 14, 0)


def call(case, version, weight=None, old=None):
    """vLLM `version`'s own call shape, against epx.vllm: (phy2log, log2phy|None)."""
    w = np.asarray(case["weight"], dtype=case["dtype"]) if weight is None else weight
    old = case["old"] if old is None else old
    args = (w, case["num_replicas"], case["num_groups"], case["num_nodes"], case["num_gpus"])
    if _version(version) < (0, 13, 0):
        p2l, l2p, cnt = epx.vllm.rebalance_experts(*args)
        return p2l, l2p, cnt
    policy = epx.vllm.policy_for(version)
    if old is None:
        out = policy.rebalance_experts(*args)
    else:
        out = policy.rebalance_experts(*args, old_global_expert_indices=np.asarray(old))
    if policy is epx.vllm.DefaultEplbPolicy:
        return out, None, None
    return out


def log2phy(p2l, rank, E):
    """vLLM's log2phy [L][E][P-E+1] from phy2log and each slot's replica rank."""
    L, P = p2l.shape
    out = np.full((L, E, P - E + 1), -1, dtype=np.int64)
    lay = np.broadcast_to(np.arange(L)[:, None], p2l.shape)
    out[lay, p2l, np.asarray(rank)] = np.arange(P)
    return out


def load_pairs(w, p2l):
    """Per layer, the sorted (load, replica count) pairs: experts of equal
    load may trade counts under another tie order, nothing else may."""
    E = w.shape[1]
    return [sorted(zip(w[l].tolist(), np.bincount(p2l[l], minlength=E).tolist()))
            for l in range(w.shape[0])]


def max_loads(w, p2l, G):
    L, P = p2l.shape
    cnt = np.stack([np.bincount(p2l[l], minlength=w.shape[1]) for l in range(L)])
    per = np.take_along_axis(w.astype(np.float64), p2l, 1) / np.take_along_axis(cnt, p2l, 1)
    return per.reshape(L, G, P // G).sum(axis=2).max(axis=1)


@pytest.mark.parametrize("name,version", RUNS)
def test_vllm_release_matches_its_own_code(name, version):
    case = CASES[name]
    gold = case["vllm"][version]
    w = np.asarray(case["weight"], dtype=case["dtype"])
    E, G = w.shape[1], case["num_gpus"]
    p2l, l2p, cnt = call(case, version)
    assert p2l.dtype == np.int64 and p2l.shape == (w.shape[0], case["num_replicas"])
    want = np.asarray(gold["phy2log"])
    # vLLM's code with stable sorts is epx's tie order, in the release's
    # arithmetic: equal on every case, slot for slot (but torch's group sums)
    exact = not _torch_group_sums(name, version)
    if exact:
        np.testing.assert_array_equal(p2l, np.asarray(gold.get("phy2log_stable", want)))
    if gold["tie_free"]:
        assert exact
        np.testing.assert_array_equal(p2l, want)
    if gold["counts_tie_free"]:
        assert load_pairs(w, p2l) == load_pairs(w, want)
    if gold["max_load_tie_free"]:
        np.testing.assert_allclose(max_loads(w, p2l, G), max_loads(w, want, G), rtol=1e-12)
    if "replica_rank" in gold:  # the 3-tuple releases
        assert l2p.shape == (w.shape[0], E, case["num_replicas"] - E + 1)
        np.testing.assert_array_equal(cnt, np.stack([np.bincount(r, minlength=E) for r in p2l]))
        stable = gold.get("replica_rank_stable", gold["replica_rank"])
        if exact:
            np.testing.assert_array_equal(l2p, log2phy(p2l, stable, E))
        if gold["tie_free"] and gold["rank_tie_free"]:
            np.testing.assert_array_equal(l2p, log2phy(want, gold["replica_rank"], E))


def test_every_case_has_ties_and_tie_free_runs():
    """The goldens exercise both sides: placements a tie decided, and not."""
    flags = [r["tie_free"] for c in GOLD["cases"] for r in c["vllm"].values()]
    assert any(flags) and not all(flags)
    nodes = {c["num_nodes"] for c in GOLD["cases"]}
    assert nodes >= {1, 2, 4, 8}
    assert "0.34.0" in GOLD["meta"]["versions"]


TIE_CASES = [n for n in CASES if n.startswith(("tie_", "float64_"))]


def test_float64_sums_part_from_float32():
    """docs/TIES.md, Arithmetic: on float64_sums_n1 vLLM 0.13.0 (float32) and
    vLLM >= 0.14.0 (float64 quotients and pack sums) place differently, and
    epx follows each release's arithmetic."""
    case = CASES["float64_sums_n1"]
    stable = {v: np.asarray(g.get("phy2log_stable", g["phy2log"]))
              for v, g in case["vllm"].items()}
    assert not (stable["0.13.0"] == stable["0.14.0"]).all()
    for version in ("0.13.0", "0.14.0", "0.18.1", "0.19.0", "0.34.0"):
        np.testing.assert_array_equal(call(case, version)[0], stable[version])
    # the rule by name, through epx.planner.deepseek
    w = np.asarray(case["weight"], dtype=np.float32)
    f32 = epx.planner.deepseek(w, 24, 4, 1, 4, True)[0]
    f64 = epx.planner.deepseek(w, 24, 4, 1, 4, True, rule="vllm-f64")[0]
    np.testing.assert_array_equal(f32, stable["0.13.0"])
    np.testing.assert_array_equal(f64, stable["0.34.0"])
    np.testing.assert_array_equal(epx.planner.deepseek(w, 24, 4, 1, 4, True, rule="deepseek")[0],
                                  f32)


def test_numpy_group_sums():
    """vLLM >= 0.14.0 adds a group's loads as numpy does (pairwise blocks of
    eight); on numpy_group_sums_n2 that orders groups 0 and 1 against a
    running float32 sum, no sort key ties, and epx equals the releases as
    released. The float32 releases sum with torch, whose blocked reduction
    makes the two groups tie: there epx (one by one) parts from them, with
    the same replica counts and max load (the parametrized test)."""
    case = CASES["numpy_group_sums_n2"]
    w = np.asarray(case["weight"], dtype=np.float32)
    for version in ("0.14.0", "0.18.1", "0.19.0", "0.34.0"):
        gold = case["vllm"][version]
        assert gold["tie_free"], version
        np.testing.assert_array_equal(call(case, version)[0], np.asarray(gold["phy2log"]))
    f32 = epx.planner.deepseek(w, 80, 4, 2, 8, True)[0]
    assert not (f32 == np.asarray(case["vllm"]["0.34.0"]["phy2log"])).all()
    for version in ("0.9.2", "0.13.0"):
        assert not case["vllm"][version]["tie_free"]
        assert not (call(case, version)[0] == np.asarray(case["vllm"][version]["phy2log"])).all()


def test_rule_argument_errors():
    w = np.arange(1, 17, dtype=np.float32)[None, :]
    with pytest.raises(ValueError, match="'vllm-f64'"):
        epx.planner.deepseek(w, 24, 4, 1, 4, True, rule="vllm")
    with pytest.raises(ValueError, match="rule must be one of"):
        epx.planner.deepseek(w, 24, 4, 1, 4, True, rule=3)
    with pytest.raises(ValueError, match="not both"):
        epx.planner.deepseek(w, 24, 4, 1, 4, True, sglang_version="0.5.11", rule="vllm-f64")
    assert epx.planner.EPLB_RULES["vllm-f64"] == 3


@pytest.mark.parametrize("name", TIE_CASES)
def test_built_ties_same_counts_and_max_load(name):
    """docs/TIES.md: on loads built to tie, epx's placement may differ from the
    release's (torch.sort, np.argsort), its replica counts and max load may not."""
    case = CASES[name]
    w = np.asarray(case["weight"], dtype=case["dtype"])
    for version, gold in case["vllm"].items():
        p2l = call(case, version)[0]
        want = np.asarray(gold["phy2log"])
        assert load_pairs(w, p2l) == load_pairs(w, want), version
        np.testing.assert_allclose(max_loads(w, p2l, case["num_gpus"]),
                                   max_loads(w, want, case["num_gpus"]), rtol=1e-12)


def test_built_ties_do_decide_placements():
    """The tie cases are real: vLLM's own runs part on them, for torch's sort
    (0.9.2) and numpy's (0.34.0) alike."""
    for version in ("0.9.2", "0.34.0"):
        assert any(not CASES[n]["vllm"][version]["tie_free"] for n in TIE_CASES), version


def test_policy_call_shape_of_vllm_034():
    """eplb_state's call: positional, the old map as the sixth argument."""
    case = CASES["old_prev_e32_p48_n4"]
    assert case["vllm"]["0.34.0"]["tie_free"]
    w = np.asarray(case["weight"], dtype=np.int64)
    old = np.asarray(case["old"], dtype=np.int64)
    pol = epx.vllm.DefaultEplbPolicy
    a = pol.rebalance_experts(w, 48, 8, 4, 8, old)
    b = pol.rebalance_experts(weight=w, num_replicas=48, num_groups=8, num_nodes=4,
                              num_ranks=8, old_global_expert_indices=old)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, np.asarray(case["vllm"]["0.34.0"]["phy2log"]))


def test_old_map_keeps_slots_on_each_gpu():
    """Experts that stay on a GPU keep their slots; only the order within a GPU moves."""
    case = CASES["old_prev_e16_p24_n1"]
    w = np.asarray(case["weight"], dtype=np.int64)
    old = np.asarray(case["old"])
    pol = epx.vllm.DefaultEplbPolicy
    free = pol.rebalance_experts(w, 24, 4, 1, 4)
    kept = pol.rebalance_experts(w, 24, 4, 1, 4, old)
    G, k = 4, 6
    for l in range(w.shape[0]):
        for g in range(G):
            s = slice(g * k, (g + 1) * k)
            assert sorted(free[l, s]) == sorted(kept[l, s])
            stay = set(old[l, s]) & set(kept[l, s])
            for j in range(g * k, (g + 1) * k):
                if old[l, j] in stay and list(old[l, s]).count(old[l, j]) == 1:
                    assert kept[l, j] == old[l, j]
    np.testing.assert_array_equal(pol.preserve_intragpu_slots(free, 4, old), kept)


def test_tuple_policy_moves_replica_ranks_with_slots():
    case = CASES["old_shuffled_n2"]
    w = np.asarray(case["weight"], dtype=np.int64)
    old = np.asarray(case["old"])
    p2l, l2p, cnt = epx.vllm.TupleEplbPolicy.rebalance_experts(w, 24, 4, 2, 4, old)
    L, E, X = l2p.shape
    for l in range(L):
        for e in range(E):
            slots = l2p[l, e][l2p[l, e] >= 0]
            assert len(slots) == cnt[l, e] and (p2l[l, slots] == e).all()
            assert (l2p[l, e, cnt[l, e]:] == -1).all()


def test_tuple_preserve_signature_of_014():
    """0.14 - 0.18's preserve_intragpu_slots(phy2log, phy_replicas_idx, num_ranks, old)."""
    case = CASES["old_shuffled_n2"]
    w = np.asarray(case["weight"], dtype=np.int64)
    old = np.asarray(case["old"])
    pol = epx.vllm.TupleEplbPolicy
    p2l, l2p, _ = pol.rebalance_experts(w, 24, 4, 2, 4)
    ridx = np.zeros_like(p2l)
    for l in range(p2l.shape[0]):
        for e in range(l2p.shape[1]):
            for r, p in enumerate(l2p[l, e]):
                if p >= 0:
                    ridx[l, p] = r
    kept, kept_ridx = pol.preserve_intragpu_slots(p2l, ridx, 4, old)
    want = pol.rebalance_experts(w, 24, 4, 2, 4, old)
    np.testing.assert_array_equal(kept, want[0])
    for l in range(p2l.shape[0]):
        np.testing.assert_array_equal(want[1][l, kept[l], kept_ridx[l]], np.arange(24))
    with pytest.raises(ValueError, match="phy_replicas_idx"):
        pol.preserve_intragpu_slots(p2l, ridx[:, :3], 4, old)


def test_policy_for_releases():
    assert epx.vllm.policy_for("0.34.0") is epx.vllm.DefaultEplbPolicy
    assert epx.vllm.policy_for("v0.19.1") is epx.vllm.DefaultEplbPolicy
    assert epx.vllm.policy_for("0.18.1") is epx.vllm.TupleEplbPolicy
    assert epx.vllm.policy_for("0.14.0") is epx.vllm.TupleEplbPolicy
    assert epx.vllm.policy_for("0.13.0") is epx.vllm.TupleEplbPolicy013
    assert epx.vllm.policy_for("v0.13.1") is epx.vllm.TupleEplbPolicy013
    assert epx.vllm.DefaultEplbPolicy.EPLB_RULE == "vllm-f64"
    assert epx.vllm.TupleEplbPolicy.EPLB_RULE == "vllm-f64"
    assert epx.vllm.TupleEplbPolicy013.EPLB_RULE == "deepseek"
    with pytest.raises(ValueError, match="rebalance_experts"):
        epx.vllm.policy_for("0.12.0")
    with pytest.raises(ValueError, match="0.9.2"):
        epx.vllm.policy_for("0.8.5")
    with pytest.raises(ValueError, match="MAJOR.MINOR"):
        epx.vllm.policy_for("latest")
    with pytest.warns(UserWarning, match="newer"):
        assert epx.vllm.policy_for("0.40.0") is epx.vllm.DefaultEplbPolicy


def test_old_map_errors_name_the_value():
    w = np.arange(1, 17, dtype=np.int64)[None, :]
    pol = epx.vllm.DefaultEplbPolicy
    with pytest.raises(ValueError, match="shape .*pass None"):
        pol.rebalance_experts(w, 24, 4, 1, 4, np.zeros((1, 16), dtype=np.int64))
    bad = np.tile(np.arange(24) % 16, (1, 1))
    bad[0, 3] = 16
    with pytest.raises(ValueError, match=r"\[0\]\[3\] = 16"):
        pol.rebalance_experts(w, 24, 4, 1, 4, bad)
    with pytest.raises(TypeError, match="integer"):
        pol.rebalance_experts(w, 24, 4, 1, 4, np.zeros((1, 24), dtype=np.float32))
    with pytest.raises(TypeError, match="num_groups"):
        pol.rebalance_experts(w, 24, 4.0, 1, 4)
    with pytest.raises(TypeError, match="num_replicas"):
        pol.rebalance_experts(w, 24.0, 4, 1, 4)
    with pytest.raises(ValueError, match="num_nodes"):
        pol.rebalance_experts(w, 24, 4, 0, 4)


def test_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    case = CASES["old_prev_e32_p48_n4"]
    w = torch.tensor(case["weight"], dtype=torch.int64)
    old = torch.tensor(case["old"], dtype=torch.int64)
    out = epx.vllm.DefaultEplbPolicy.rebalance_experts(w, 48, 8, 4, 8, old)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.int64
    assert out.device.type == "cpu"
    np.testing.assert_array_equal(out.numpy(), np.asarray(case["vllm"]["0.34.0"]["phy2log"]))
    t = epx.vllm.TupleEplbPolicy.rebalance_experts(w.float(), 48, 8, 4, 8, old)
    assert all(isinstance(x, torch.Tensor) and x.dtype == torch.int64 for x in t)
    # vLLM takes weight.float(): a bf16 load window works too
    b = epx.vllm.DefaultEplbPolicy.rebalance_experts(w.bfloat16(), 48, 8, 4, 8)
    assert b.shape == (w.shape[0], 48) and b.dtype == torch.int64


def test_policy_013_has_no_old_map():
    """0.13.0's rebalance_experts takes no map in service, as vLLM's."""
    case = CASES["float64_sums_n1"]
    w = np.asarray(case["weight"], dtype=np.int64)
    pol = epx.vllm.TupleEplbPolicy013
    old = np.asarray(case["vllm"]["0.13.0"]["phy2log"])
    with pytest.raises(TypeError, match="0.14.0"):
        pol.rebalance_experts(w, 24, 4, 1, 4, old)
    with pytest.raises(TypeError, match="TupleEplbPolicy"):
        pol.rebalance_experts(w, 24, 4, 1, 4, old_global_expert_indices=old)
    p2l, l2p, cnt = pol.rebalance_experts(w, 24, 4, 1, 4)
    assert l2p.shape == (2, 16, 9) and cnt.shape == (2, 16)


# Each impossible shape vLLM's own code asserts on (weight 4 experts): the
# arguments (num_replicas, num_groups, num_nodes, num_gpus) and a word the
# message must hold.
_ASSERTED_SHAPES = [
    ((7, 2, 2, 4), "7"),  # 7 replicas on 4 GPUs
    ((8, 3, 1, 4), "3"),  # 4 experts, 3 groups (hierarchical: 3 % 1 == 0)
    ((8, 2, 2, 3), "3"),  # 3 GPUs on 2 nodes (hierarchical: 2 % 2 == 0)
    ((2, 1, 1, 2), "2"),  # 2 replicas for 4 experts
]


@pytest.mark.parametrize("args,word", _ASSERTED_SHAPES)
@pytest.mark.parametrize("entry", ["function", "0.13.0", "0.18.1", "0.34.0"])
def test_impossible_shape_is_an_assertion_error_too(args, word, entry):
    """Where vLLM asserts, the drop-ins raise an EpxError that is also an
    AssertionError, so `except AssertionError` (and pytest.raises(AssertionError)
    in vLLM's own tests) catches it; the message still names the value."""
    w = np.array([[10, 20, 30, 40]], dtype=np.float32)
    if entry == "function":
        run = epx.vllm.rebalance_experts
    else:
        run = epx.vllm.policy_for(entry).rebalance_experts
    with pytest.raises(AssertionError) as ei:
        run(w, *args)
    e = ei.value
    assert isinstance(e, epx.EpxError) and isinstance(e, epx.EpxAssertionError)
    assert e.status == epx.Status.SHAPE and e.name == "EPX_ERR_SHAPE"
    assert word in e.message and str(e).startswith("EPX_ERR_SHAPE: ")


def test_possible_shapes_and_other_errors_are_not_assertions():
    w = np.array([[10, 20, 30, 40]], dtype=np.float32)
    # groups not divisible by nodes: vLLM falls back to the global policy
    assert epx.vllm.rebalance_experts(w, 8, 3, 2, 4)[0].shape == (1, 8)
    with pytest.raises(ValueError) as ei:  # a bad map in service stays a ValueError
        epx.vllm.DefaultEplbPolicy.rebalance_experts(w, 8, 1, 1, 4,
                                                     np.zeros((2, 8), dtype=np.int64))
    assert not isinstance(ei.value, AssertionError)
    with pytest.raises(epx.EpxError) as ei:  # epx's own planner is not vLLM's
        epx.plan(np.ones((1, 4)), num_gpus=4, num_physical_experts=7)
    assert not isinstance(ei.value, AssertionError)


def test_sglang_deepseek_asserts_too():
    w = np.array([[10, 20, 30, 40]], dtype=np.float32)
    with pytest.raises(AssertionError) as ei:
        epx.sglang.rebalance_experts(w, 7, 1, 1, 4, False)
    assert isinstance(ei.value, epx.EpxError) and "7" in ei.value.message
