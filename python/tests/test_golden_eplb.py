"""The drop-in rebalance_experts against shared/golden/eplb, as the golden
README defines agreement: logical_count identical in every case; the sorted
experts of every GPU identical in every `float` case; balancedness identical
to 1e-9 in every case; and the output shaped, typed and padded as SGLang's."""
import numpy as np
import pytest

import epx
from conftest import eplb_cases

CASES = eplb_cases() or [None]


def balancedness(weight, p2l, num_gpus):
    """Reference metric, per layer: mean GPU load / max GPU load, an expert's
    load split evenly over its replicas; NaN for layers without load."""
    w = np.asarray(weight, dtype=np.float32).astype(np.float64)
    L, E = w.shape
    P = p2l.shape[1]
    out = np.full(L, np.nan)
    for l in range(L):
        cnt = np.bincount(p2l[l], minlength=E)
        slot = w[l, p2l[l]] / cnt[p2l[l]]
        gpu = slot.reshape(num_gpus, P // num_gpus).sum(axis=1)
        if gpu.max() > 0:
            out[l] = gpu.mean() / gpu.max()
    return out


def check_log2phy(p2l, l2p, cnt):
    """l2p [L][E][X]: X = max count; row e lists exactly the slots holding e
    (each once), then -1s."""
    L, E, X = l2p.shape
    assert X == cnt.max()
    for l in range(L):
        for e in range(E):
            row = l2p[l, e]
            k = cnt[l, e]
            assert (row[k:] == -1).all(), (l, e, row)
            assert sorted(row[:k].tolist()) == np.flatnonzero(p2l[l] == e).tolist(), (l, e)


@pytest.mark.parametrize("name", CASES)
def test_rebalance_experts_matches_golden(name, golden_case):
    if name is None:
        pytest.skip("shared/golden/eplb not found")
    d = golden_case(name)
    L, E, P = d["num_layers"], d["num_logical_experts"], d["num_physical_experts"]
    G, N, groups = d["num_gpus"], d["num_nodes"], d["num_groups"]
    weight = np.array(d["weight"], dtype=np.float32)
    hierarchical = groups > 1 or N > 1
    p2l, l2p, cnt = epx.rebalance_experts(weight, P, groups, N, G, hierarchical)

    assert p2l.dtype == l2p.dtype == cnt.dtype == np.int64
    assert p2l.shape == (L, P) and cnt.shape == (L, E)
    ref_p2l = np.array(d["physical_to_logical_map"])
    ref_l2p = np.array(d["logical_to_physical_map"])
    assert l2p.shape == ref_l2p.shape  # same padding width as the reference
    np.testing.assert_array_equal(cnt, np.array(d["logical_count"]))
    check_log2phy(p2l, l2p, cnt)

    if d["weight_kind"] == "float":
        mine = np.sort(p2l.reshape(L, G, P // G), axis=-1)
        ref = np.sort(ref_p2l.reshape(L, G, P // G), axis=-1)
        np.testing.assert_array_equal(mine, ref)

    b_mine = balancedness(weight, p2l, G)
    b_ref = balancedness(weight, ref_p2l, G)
    np.testing.assert_array_equal(np.isnan(b_mine), np.isnan(b_ref))
    ok = ~np.isnan(b_ref)
    np.testing.assert_allclose(b_mine[ok], b_ref[ok], rtol=0, atol=1e-9)


def test_global_flag_ignores_groups_and_nodes(golden_case):
    """enable_hierarchical=False is the global policy whatever groups/nodes say:
    the *_globalpolicy case is the same load planned with (1, 1)."""
    d = golden_case("deepseek_v3_32gpu_4node_sparse_globalpolicy")
    weight = np.array(d["weight"], dtype=np.float32)
    P, G = d["num_physical_experts"], d["num_gpus"]
    a = epx.rebalance_experts(weight, P, 8, 4, G, False)
    b = epx.rebalance_experts(weight, P, 1, 1, G, True)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a[2], np.array(d["logical_count"]))


def test_vllm_width_and_policy_rule(golden_case):
    """vLLM's entry point: hierarchical iff groups % nodes == 0, P - E + 1 columns."""
    d = golden_case("tiny_hier_float")
    weight = np.array(d["weight"], dtype=np.float32)
    L, E, P = d["num_layers"], d["num_logical_experts"], d["num_physical_experts"]
    G, N, groups = d["num_gpus"], d["num_nodes"], d["num_groups"]
    assert groups % N == 0
    p2l, l2p, cnt = epx.vllm.rebalance_experts(weight, P, groups, N, G)
    assert l2p.shape == (L, E, P - E + 1)
    s_p2l, s_l2p, s_cnt = epx.rebalance_experts(weight, P, groups, N, G, True)
    np.testing.assert_array_equal(p2l, s_p2l)
    np.testing.assert_array_equal(cnt, s_cnt)
    np.testing.assert_array_equal(l2p[:, :, :s_l2p.shape[2]], s_l2p)
    assert (l2p[:, :, s_l2p.shape[2]:] == -1).all()


def _needs(symbol):
    if not epx.has(symbol):
        pytest.skip("this libepx has no %s (its room has not landed)" % symbol)


@pytest.mark.parametrize("name", CASES)
def test_static_dispatch_tables_match_golden(name, golden_case):
    """SGLang's compute_logical_to_rank_dispatch_physical_map, every entry of
    every rank, from the reference's replica-rank map and from the ascending map."""
    if name is None:
        pytest.skip("shared/golden/eplb not found")
    _needs("epx_dispatch_table_compute")
    d = golden_case(name)
    E, P, G = d["num_logical_experts"], d["num_physical_experts"], d["num_gpus"]
    l2p = np.array(d["logical_to_physical_map"])
    want = np.array(d["rank_dispatch_from_eplb"])
    got = epx.compute_logical_to_rank_dispatch_physical_map(l2p, G, P, None)
    assert got.dtype == l2p.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    r = G - 1  # one rank alone: SGLang's call shape
    np.testing.assert_array_equal(
        epx.compute_logical_to_rank_dispatch_physical_map(l2p, G, P, r), want[r])

    p2l = np.array(d["physical_to_logical_map"])
    asc = epx.compute_logical_to_all_physical_map(p2l, E)
    np.testing.assert_array_equal(asc, np.array(d["logical_to_all_physical_map_from_mapping"]))
    want = np.array(d["rank_dispatch_from_mapping"])
    np.testing.assert_array_equal(
        epx.compute_logical_to_rank_dispatch_physical_map(asc, G, P, None), want)
    np.testing.assert_array_equal(
        epx.static_table(epx.Layout.from_map(p2l, G), sglang_version="0.5.2"), want)


@pytest.mark.parametrize("name", ["kimi_k2_8gpu_float", "deepseek_v3_32gpu_4node_sparse",
                                  "mixtral_8gpu_int", "no_redundancy_sparse"])
def test_evaluate_matches_reference_metric(name, golden_case):
    _needs("epx_balance_compute")
    d = golden_case(name)
    weight = np.array(d["weight"], dtype=np.float32)
    p2l = np.array(d["physical_to_logical_map"])
    G = d["num_gpus"]
    ev = epx.evaluate(p2l, weight, num_gpus=G)
    ref = balancedness(weight, p2l, G)
    loaded = ~np.isnan(ref)
    np.testing.assert_allclose(ev.layers.balancedness[loaded], ref[loaded], rtol=0, atol=1e-12)
    assert ev.num_loaded_layers == loaded.sum()
    assert abs(ev.balancedness - ref[loaded].mean()) < 1e-12
    assert ev.gap >= -1e-12 and ev.bound <= 1 + 1e-12
    assert ev.gpu_load.shape == (d["num_layers"], G)
    np.testing.assert_allclose(ev.gpu_load.sum(axis=1), weight.astype(float).sum(axis=1),
                               rtol=1e-9)
