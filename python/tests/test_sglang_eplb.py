"""SGLang's copy of DeepSeek's EPLB, release by release (issue 18), through
the Python helpers: tests/data/sglang_eplb holds what each release's own
rebalance_experts placed (tools/sglang_eplb.py). With sglang_version=V,
epx.sglang.rebalance_experts_from_windows, epx.plan and
epx.init_expert_location must place as release V does, replica-rank lists
and torch's sort order of tied loads included."""
import json
import warnings

import numpy as np
import pytest

import epx
from conftest import REPO

DATA = REPO / "tests" / "data" / "sglang_eplb"
CASES = sorted(DATA.glob("*.json"))


def load(path):
    return json.loads(path.read_text())


def windows(case):
    c = np.asarray(case["logical_count"], dtype=np.float64)
    return c if c.ndim == 3 else c[None]


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_rebalance_experts_as_each_release(path):
    case = load(path)
    G, N, P = case["num_gpus"], case["num_nodes"], case["num_physical_experts"]
    for v, want in case["sglang"].items():
        p2l, l2p, cnt = epx.sglang.rebalance_experts_from_windows(
            windows(case), P, P // G, case["num_groups"] or None, N, want["algorithm"],
            sglang_version=v)
        assert cnt.tolist() == want["logical_count"], v
        assert l2p.tolist() == want["logical_to_physical_map"], v
        assert p2l.tolist() == want["physical_to_logical_map"], v


def test_the_releases_part_and_plan_follows_them():
    parting = [load(p) for p in CASES if p.stem.startswith("parting_")]
    assert len(parting) >= 4
    for case in parting:
        assert case["releases_differ"] and not case["ties"]
        G, N, P = case["num_gpus"], case["num_nodes"], case["num_physical_experts"]
        for v, want in case["sglang"].items():
            p = epx.plan(windows(case), num_gpus=G, num_nodes=N, num_physical_experts=P,
                         algorithm=case["algorithm"], num_groups=case["num_groups"],
                         sglang_version=v)
            assert p.physical_to_logical_map.tolist() == want["physical_to_logical_map"], v
            assert p.replica_rank_order
            l2p = p.logical_to_physical_map
            assert l2p.shape == np.asarray(want["logical_to_physical_map"]).shape
            # the plan's lists are the raw entry point's replica-rank lists
            _, raw, _ = epx.sglang.rebalance_experts(
                windows(case).sum(axis=0), P, case["num_groups"] or 1, N, G,
                want["algorithm"] == "deepseek_hierarchical", sglang_version=v)
            assert np.array_equal(l2p, raw), v
        # no release = DeepSeek's original = the last float32 release
        p = epx.plan(windows(case), num_gpus=G, num_nodes=N, num_physical_experts=P,
                     algorithm=case["algorithm"], num_groups=case["num_groups"])
        assert p.physical_to_logical_map.tolist() == \
            case["sglang"]["0.5.10.post1"]["physical_to_logical_map"]


def test_init_from_counts_runs_deepseek_as_sglang(tmp_path):
    case = load(DATA / "parting_2_g8_n2.json")
    G, N, P, K = (case[k] for k in ("num_gpus", "num_nodes", "num_physical_experts",
                                    "num_groups"))
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"logical_count": case["logical_count"]}))
    for v in ("0.5.10.post1", "0.5.11"):
        lay = epx.init_expert_location(str(f), num_gpus=G, num_nodes=N, num_physical=P,
                                       num_groups=K, sglang_version=v)
        assert lay.physical_to_logical_map.tolist() == \
            case["sglang"][v]["physical_to_logical_map"], v
    # epx's planner when asked for
    lay = epx.init_expert_location(str(f), num_gpus=G, num_nodes=N, num_physical=P,
                                   num_groups=K, algorithm="epx")
    mine = epx.plan(windows(case), num_gpus=G, num_nodes=N, num_physical_experts=P,
                    num_groups=K)
    assert np.array_equal(lay.physical_to_logical_map, mine.physical_to_logical_map)
    with pytest.raises(epx.EpxError, match="applies to the DeepSeek modes"):
        epx.init_expert_location(str(f), num_gpus=G, num_physical=P, algorithm="epx",
                                 sglang_version="0.5.11")


def test_release_strings():
    w = np.arange(1, 17, dtype=np.float32).reshape(2, 8)
    with pytest.raises(epx.EpxError, match=r"'0\.5\.x' is not MAJOR\.MINOR"):
        epx.sglang.rebalance_experts(w, 12, 1, 1, 4, False, sglang_version="0.5.x")
    with pytest.raises(epx.EpxError, match="'latest'"):
        epx.plan(w, num_gpus=4, num_redundant=4, algorithm="deepseek", sglang_version="latest")
    with pytest.raises(ValueError, match="applies to algorithm='deepseek'"):
        epx.sglang.rebalance_experts(w, 12, 1, 1, 4, False, algorithm="epx",
                                     sglang_version="0.5.11")
    with pytest.raises(epx.EpxError, match="applies to the DeepSeek modes"):
        epx.plan(w, num_gpus=4, num_redundant=4, sglang_version="0.5.11")
    newest = epx.planner.SGLANG_NEWEST_VERIFIED
    assert newest == "0.5.23"
    with pytest.warns(UserWarning, match="0.9.1 is newer than the newest release epx "
                                         "verified \\(%s\\)" % newest):
        a = epx.sglang.rebalance_experts(w, 12, 1, 1, 4, False, sglang_version="0.9.1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b = epx.sglang.rebalance_experts(w, 12, 1, 1, 4, False, sglang_version=newest)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


# SGLang 0.5.23's deepseek_vec(_hierarchical) and elasticity_aware(_hierarchical)
# (tests/data/sglang_eplb_0523), in 0.5.23's call shape of rebalance_experts:
# the tensor as the release got it (int32 or float32 steps), the active ranks
# as a tensor where its state manager keeps them.
CASES_0523 = sorted((REPO / "tests" / "data" / "sglang_eplb_0523").glob("*.json"))


@pytest.mark.parametrize("path", CASES_0523, ids=[p.stem for p in CASES_0523])
def test_rebalance_experts_0523(path):
    case = load(path)
    G, N, P = case["num_gpus"], case["num_nodes"], case["num_physical_experts"]
    want = case["sglang"]["0.5.23"]
    t = np.asarray(case["logical_count"], dtype={"int32": np.int32, "float32": np.float32,
                                                 "float64": np.float64}[case["dtype"]])
    active = case.get("active_ranks")
    kw = {} if active is None else {"active_ranks": np.asarray(active, dtype=np.int32)}
    p2l, l2p, cnt = epx.sglang.rebalance_experts_from_windows(
        t if t.ndim == 3 else t[None], P, P // G, case["num_groups"] or None, N,
        case["algorithm"], sglang_version="0.5.23", **kw)
    assert cnt.tolist() == want["logical_count"]
    assert l2p.tolist() == want["logical_to_physical_map"]
    assert p2l.tolist() == want["physical_to_logical_map"]


def test_active_ranks_errors():
    t = np.ones((2, 1, 8))
    f = epx.sglang.rebalance_experts_from_windows
    with pytest.raises(ValueError, match="one entry per EP rank"):
        f(t, 8, 2, None, 1, "elasticity_aware", active_ranks=[1, 1])
    with pytest.raises(ValueError, match="elasticity_aware"):
        f(t, 8, 2, None, 1, "deepseek_vec", active_ranks=[1, 1, 1, 1])
    with pytest.raises(epx.EpxError, match="slots"):
        f(t, 8, 2, None, 1, "elasticity_aware", active_ranks=[1, 0, 0, 0])


def test_windows_summed_in_their_dtype_as_sglang():
    """SGLang's rebalance_experts gives deepseek tokens_per_expert.sum(dim=0):
    float32 windows summed in float32 (2^24 + 1 + 1 stays 2^24 there, an exact
    float64 sum made it 2^24 + 2 and the plan replicated another expert)."""
    torch = pytest.importorskip("torch")
    t = torch.tensor([[[16777216., 16777216.]], [[1., 2.]], [[1., 0.]]])
    got = epx.rebalance_experts_from_windows(t, 3, 1, 1, 1, "deepseek")
    want = epx.rebalance_experts(t.sum(dim=0), 3, 1, 1, 3, False)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert got[0].tolist() == [[0, 1, 1]]
    # numpy windows: summed by numpy in their dtype, the same here
    got = epx.rebalance_experts_from_windows(t.numpy(), 3, 1, 1, 1, "deepseek")
    assert got[0].tolist() == [[0, 1, 1]]
