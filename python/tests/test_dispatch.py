"""Per-token dispatch and epx's static tables through the binding."""
import numpy as np
import pytest

import epx


@pytest.fixture(autouse=True)
def _needs_dispatch():
    if not epx.has("epx_dispatch_map_ids"):
        pytest.skip("this libepx has no dispatch room")


def _layout():
    m = np.array([[0, 1, 2, 3, 0, 0, 1, 2], [3, 2, 1, 0, 3, 3, 3, 2]])
    return epx.Layout.from_map(m, num_gpus=4), m


def test_static_dispatch_follows_the_table():
    lay, m = _layout()
    table = epx.static_table(lay)
    assert table.shape == (4, 2, 4)
    ids = np.array([[0, 1], [2, 3], [-1, 0]])
    for r in range(4):
        got = epx.dispatch_topk(ids, lay, 1, mode="static", table=table, ep_rank=r)
        want = np.where(ids >= 0, table[r, 1][np.maximum(ids, 0)], -1)
        np.testing.assert_array_equal(got, want)


def test_dynamic_dispatch_lands_on_replicas_and_spreads():
    lay, m = _layout()
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 4, size=(4000, 2))
    for layer in range(2):
        slots = epx.dispatch_topk(ids, lay, layer, mode="dynamic", seed=3)
        assert (m[layer][slots] == ids).all()  # every token goes to a replica of its expert
    slots = epx.dispatch_topk(ids, lay, 1, mode="dynamic", seed=3)
    hits = np.bincount(slots[ids == 3], minlength=8)[[0, 4, 5, 6]]
    assert hits.min() > 0.2 * (ids == 3).sum()  # four replicas, about a quarter each
    again = epx.dispatch_topk(ids, lay, 1, mode="dynamic", seed=3)
    np.testing.assert_array_equal(slots, again)  # keyed, so reproducible
    other = epx.dispatch_topk(ids, lay, 1, mode="dynamic", seed=3, pass_id=1)
    assert (other != slots).any()


def test_weighted_dispatch_follows_weights():
    lay, m = _layout()
    w = np.zeros((2, 8))
    for l in range(2):
        for e in range(4):
            slots = np.flatnonzero(m[l] == e)
            w[l, slots] = 1.0 / len(slots)
    w[0, 0], w[0, 4], w[0, 5] = 1.0, 0.0, 0.0  # expert 0 of layer 0: all on slot 0
    ids = np.zeros((500, 1), dtype=np.int64)
    got = epx.dispatch_topk(ids, lay, 0, mode="weighted", replica_weights=w)
    assert (got == 0).all()


def test_epx_table_and_gpu_load():
    lay, m = _layout()
    t = epx.static_table(lay, algorithm="epx")
    for r in range(4):
        for l in range(2):
            assert (m[l][t[r, l]] == np.arange(4)).all()
    load = np.ones((2, 4))
    g = epx.dispatch.table_gpu_load(lay, t, load)
    np.testing.assert_allclose(g.sum(axis=1), load.sum(axis=1))


def test_bad_ids_raise():
    lay, _ = _layout()
    with pytest.raises(epx.EpxError) as ei:
        epx.dispatch_topk(np.array([[7]]), lay, 0)
    assert ei.value.status == epx.Status.INVALID_ARG and "7" in ei.value.message


def test_sglang_signature_and_ep_size_alias():
    lay, m = _layout()
    l2a = lay.logical_to_all_physical_map()
    full = epx.compute_logical_to_rank_dispatch_physical_map(l2a, 4, 8, None)
    assert full.shape == (4, 2, 4) and full.dtype == np.int64
    for r in range(4):
        np.testing.assert_array_equal(
            epx.compute_logical_to_rank_dispatch_physical_map(
                logical_to_all_physical_map=l2a, ep_size=4, num_physical_experts=8, ep_rank=r),
            full[r])
    np.testing.assert_array_equal(full, epx.static_table(lay, sglang_version="0.5.2"))
    assert epx.compute_logical_to_rank_dispatch_physical_map(
        l2a.astype(np.int32), 4, 8, 0).dtype == np.int32
    with pytest.raises(TypeError):
        epx.compute_logical_to_rank_dispatch_physical_map(l2a, 4, 8, 0, ep_size=2)


_SGLANG_TABLES = __import__("pathlib").Path(__file__).resolve().parents[2] / "tests" / "data" / \
    "sglang_tables"


@pytest.mark.parametrize("name", ["crafted_101_g8_n2", "crafted_106_g16_n8", "random_054_float_l1"])
def test_static_table_per_sglang_release(name):
    """static_table(sglang_version=V) equals what SGLang V's own code computes
    (tests/data/sglang_tables, from tools/sglang_tables.py), from the mapping
    (cut per rank from 0.5.4.post2) and from the replica-rank lists."""
    import json
    path = _SGLANG_TABLES / (name + ".json")
    if not path.exists():
        pytest.skip("tests/data/sglang_tables not found")
    d = json.loads(path.read_text())
    lay = epx.Layout.from_map(np.array(d["physical_to_logical_map"]), d["num_gpus"],
                              d["num_nodes"], d["num_logical_experts"])
    l2p = np.array(d["logical_to_physical_map"])
    for v, want in d["sglang"].items():
        np.testing.assert_array_equal(epx.static_table(lay, sglang_version=v),
                                      want["rank_dispatch_from_mapping"])
        np.testing.assert_array_equal(epx.static_table(lay, sglang_version=v, replicas=l2p),
                                      want["rank_dispatch_from_eplb"])
        np.testing.assert_array_equal(
            epx.compute_logical_to_rank_dispatch_physical_map(
                l2p, d["num_gpus"], d["num_physical_experts"], None, sglang_version=v,
                nnodes=d["num_nodes"]),
            want["rank_dispatch_from_eplb"])


@pytest.mark.parametrize("name", sorted(p.stem for p in _SGLANG_TABLES.glob("*.json")))
def test_sglang_rank_lists_per_release(name):
    """sglang_rank_lists(sglang_version=V) equals the lists each rank of SGLang
    V keeps (logical_to_all_physical_map_from_mapping, from the release's own
    _compute_logical_to_all_physical_map on every rank: cut from 0.5.4.post2),
    from a Layout and from a Plan's layout alike; P wide it is SGLang's own
    padding; from replica-rank lists nothing is cut."""
    import json
    d = json.loads((_SGLANG_TABLES / (name + ".json")).read_text())
    G, P = d["num_gpus"], d["num_physical_experts"]
    lay = epx.Layout.from_map(np.array(d["physical_to_logical_map"]), G, d["num_nodes"],
                              d["num_logical_experts"])
    l2p = np.array(d["logical_to_physical_map"])
    valid = [[[p for p in x if p >= 0] for x in layer] for layer in l2p.tolist()]
    for v, want in d["sglang"].items():
        want = np.array(want["logical_to_all_physical_map_from_mapping"])
        got = epx.sglang_rank_lists(lay, sglang_version=v)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want)
        wide = epx.dispatch.sglang_rank_lists(lay, sglang_version=v, width=P)
        assert wide.shape == want.shape[:3] + (P,)
        np.testing.assert_array_equal(wide[..., :want.shape[3]], want)
        assert (wide[..., want.shape[3]:] == -1).all()
        eplb = epx.sglang_rank_lists(lay, sglang_version=v, replicas=l2p)
        for rank in eplb.tolist():
            assert [[[p for p in x if p >= 0] for x in layer] for layer in rank] == valid


def test_sglang_rank_lists_refusals():
    p2l = np.array([[0, 1, 2, 3, 0, 1, 2, 3]])
    lay = epx.Layout.from_map(p2l, 4)
    assert epx.sglang_rank_lists(lay, sglang_version="0.5.4.post1").shape == (4, 1, 4, 2)
    cut = epx.sglang_rank_lists(lay)  # 0.5.23: every rank keeps its own GPU's replica
    assert cut.shape == (4, 1, 4, 2)
    assert cut[0, 0, 0].tolist() == [0, -1] and cut[2, 0, 0].tolist() == [4, -1]
    with pytest.raises(epx.EpxError, match="out_width is 1 but the widest"):
        epx.sglang_rank_lists(lay, width=1)
    with pytest.raises(ValueError, match="width = 9 is outside"):
        epx.sglang_rank_lists(lay, width=9)
    with pytest.raises(TypeError, match="width must be an integer"):
        epx.sglang_rank_lists(lay, width=2.0)
    with pytest.raises(epx.EpxError, match="0.5.16rc1"):
        epx.sglang_rank_lists(lay, sglang_version="0.5.16rc1")


_SGLANG_DISPATCH = _SGLANG_TABLES.parent / "sglang_dispatch"


@pytest.mark.parametrize("name", sorted(p.stem for p in _SGLANG_DISPATCH.glob("*.json")))
def test_rank_invariant_per_release(name):
    """dispatch_topk(mode="rank_invariant") picks the replicas SGLang V's own
    _topk_ids_logical_to_physical_dynamic picks with rank_invariant set
    (tests/data/sglang_dispatch, from tools/sglang_tables.py rank-invariant),
    from a mapping's lists and from DeepSeek's logical_to_physical_map."""
    import json
    d = json.loads((_SGLANG_DISPATCH / (name + ".json")).read_text())
    lay = epx.Layout.from_map(np.array(d["physical_to_logical_map"]), d["num_gpus"],
                              d["num_nodes"], d["num_logical_experts"])
    l2p = np.array(d["logical_to_physical_map"])
    assert d["sglang"]
    for v, want in d["sglang"].items():
        # the release's uncut lists are the layout's ascending ones
        m = np.array(want["logical_to_all_physical_map_from_mapping"])
        np.testing.assert_array_equal(lay.logical_to_all_physical_map(m.shape[2]), m)
        for b, batch in enumerate(d["topk_ids"]):
            for layer, ids in enumerate(batch):
                ids = np.array(ids)
                got = epx.dispatch_topk(ids, lay, layer, mode="rank_invariant", seed=5)
                np.testing.assert_array_equal(got, want["chosen_from_mapping"][b][layer])
                got = epx.dispatch_topk(ids, lay, layer, mode="rank_invariant", replicas=l2p)
                np.testing.assert_array_equal(got, want["chosen_from_eplb"][b][layer])
                # SGLang's P-wide padding changes nothing
                wide = np.array(want["logical_to_all_physical_map_from_eplb"])
                got = epx.dispatch_topk(ids, lay, layer, mode="rank_invariant", replicas=wide)
                np.testing.assert_array_equal(got, want["chosen_from_eplb"][b][layer])


def test_rank_invariant_rule_and_refusals():
    lay, _ = _layout()
    ids = np.array([[0, 1], [0, 2], [0, 3], [1, 0], [-1, 0]])
    reps = lay.logical_to_all_physical_map(lay.max_replicas)
    nv = lay.num_valid
    got = epx.dispatch_topk(ids, lay, 0, mode="rank_invariant")
    for t in range(ids.shape[0]):
        for k in range(ids.shape[1]):
            e = ids[t, k]
            assert got[t, k] == (-1 if e < 0 else reps[0, e, t % nv[0, e]])
    l2p = np.array(reps)
    l2p[0, 0, 0] = -1
    if nv[0, 0] > 1:
        with pytest.raises(ValueError, match=r"replicas\[0\]\[0\] has a -1 before slot"):
            epx.dispatch_topk(ids, lay, 0, mode="rank_invariant", replicas=l2p)
    l2p[0, 0, :] = -1
    with pytest.raises(ValueError, match="has no slot"):
        epx.dispatch_topk(ids, lay, 0, mode="rank_invariant", replicas=l2p)
    with pytest.raises(ValueError, match="is outside"):
        epx.dispatch_topk(ids, lay, 0, mode="rank_invariant", replicas=l2p + 99)
    with pytest.raises(ValueError, match="the layout needs"):
        epx.dispatch_topk(ids, lay, 0, mode="rank_invariant", replicas=l2p[:, :1])
    with pytest.raises(ValueError, match="for mode='rank_invariant' only"):
        epx.dispatch_topk(ids, lay, 0, mode="dynamic", replicas=reps)
    with pytest.raises(ValueError, match="mode must be one of"):
        epx.dispatch_topk(ids, lay, 0, mode="row")


def _contradicting():
    """A layout and its own lists and table with one slot listed for the wrong expert."""
    lay = epx.Layout.trivial(2, 4, 8, 2)
    reps = lay.logical_to_all_physical_map()
    reps[0, 0, 0] = 1  # slot 1 holds expert 1
    table = epx.static_table(lay)
    table[1, 0, 0] = 1
    return lay, reps, table


@pytest.mark.parametrize("call, where", [
    (lambda lay, r, t: epx.static_table(lay, replicas=r), r"replicas\[0\]\[0\]\[0\] = 1"),
    (lambda lay, r, t: epx.sglang_rank_lists(lay, replicas=r), r"replicas\[0\]\[0\]\[0\] = 1"),
    (lambda lay, r, t: epx.dispatch_topk(np.array([[0, 1]]), lay, 0, mode="rank_invariant",
                                         replicas=r), r"replicas\[0\]\[0\]\[0\] = 1"),
    (lambda lay, r, t: epx.dispatch_topk(np.array([[0, 1]]), lay, 0, mode="static", table=t,
                                         ep_rank=1), r"table\[1\]\[0\]\[0\] = 1"),
    (lambda lay, r, t: epx.dispatch.table_gpu_load(lay, t, np.ones((2, 4))),
     r"table\[1\]\[0\]\[0\] = 1"),
])
def test_lists_and_tables_that_contradict_the_layout_refused(call, where):
    """They routed expert 0's tokens to slot 1, which holds expert 1."""
    with pytest.raises(ValueError, match=where + r" gives \[layer 0\]\[expert 0\] slot 1, but "
                                                 r"slot 1 holds expert 1 in the layout"):
        call(*_contradicting())


def test_torch_mapping_table_that_contradicts_the_layout_refused():
    pytest.importorskip("torch")
    import epx.torch as et
    lay, _, table = _contradicting()
    with pytest.raises(ValueError, match=r"table\[1\]\[0\]\[0\] = 1 gives \[layer 0\]\[expert 0\]"):
        et.Mapping.from_layout(lay, 0, mode="static", table=table, ep_rank=1)
    et.Mapping.from_layout(lay, 1, mode="static", table=table, ep_rank=1)  # layer 1 is sound


def test_pass_id_is_keyed_modulo_2_32_as_documented():
    """The C spec's pass is a uint32 counter: a larger pass_id wraps, and both
    bindings say so (pass 2^32 draws as pass 0); past 2^64 - 1 is refused."""
    lay = epx.Layout.trivial(1, 4, 16, 2)
    ids = np.tile(np.arange(4), (64, 1))
    a = epx.dispatch_topk(ids, lay, 0, pass_id=5)
    np.testing.assert_array_equal(a, epx.dispatch_topk(ids, lay, 0, pass_id=2 ** 32 + 5))
    assert not np.array_equal(a, epx.dispatch_topk(ids, lay, 0, pass_id=6))
    with pytest.raises(ValueError, match="pass_id = 18446744073709551616 is outside"):
        epx.dispatch_topk(ids, lay, 0, pass_id=2 ** 64)
    assert "modulo 2^32" in epx.dispatch_topk.__doc__
    torch = pytest.importorskip("torch")
    import epx.torch as et
    assert "modulo 2^32" in et.map_ids.__doc__
    m = et.Mapping.from_layout(lay, 0, mode="dynamic")
    t = torch.from_numpy(ids)
    assert torch.equal(et.map_ids(t, m, pass_id=5), et.map_ids(t, m, pass_id=2 ** 32 + 5))


@pytest.mark.parametrize("mode, kw, arg", [
    ("dynamic", {"table": "T"}, "table"),
    ("dynamic", {"ep_rank": 1}, "ep_rank"),
    ("weighted", {"table": "T", "replica_weights": "W"}, "table"),
    ("dynamic", {"replica_weights": "W"}, "replica_weights"),
    ("static", {"table": "T", "replica_weights": "W"}, "replica_weights"),
    ("balanced", {"table": "T"}, "table"),
    ("physical", {"ep_rank": 0}, "ep_rank"),
])
def test_dispatch_topk_refuses_arguments_its_mode_does_not_read(mode, kw, arg):
    lay = epx.Layout.trivial(2, 4, 8, 2)
    fill = {"T": epx.static_table(lay), "W": np.full((2, 8), .5)}
    kw = {k: fill.get(v, v) if isinstance(v, str) else v for k, v in kw.items()}
    with pytest.raises(ValueError, match=r"^%s= is for mode=.* only, not '%s'" % (arg, mode)):
        epx.dispatch_topk(np.array([[0, 1]]), lay, 0, mode=mode, **kw)


def test_static_dispatch_still_defaults_to_rank_0():
    lay = epx.Layout.trivial(2, 4, 8, 2)
    table = epx.static_table(lay)
    ids = np.array([[0, 1, 2, 3]])
    np.testing.assert_array_equal(epx.dispatch_topk(ids, lay, 1, mode="static", table=table),
                                  epx.dispatch_topk(ids, lay, 1, mode="static", table=table,
                                                    ep_rank=0))


@pytest.mark.parametrize("kw", [{"seed": 7}, {"sglang_version": "0.5.23"}])
def test_epx_table_refuses_sglang_only_arguments(kw):
    """The epx table draws nothing and follows no release: both were dropped."""
    lay = epx.Layout.trivial(2, 4, 8, 2)
    with pytest.raises(ValueError, match=r"%s=.* is for algorithm='sglang' only" % list(kw)[0]):
        epx.static_table(lay, algorithm="epx", **kw)
    epx.static_table(lay, algorithm="sglang", **kw)  # where they apply
    np.testing.assert_array_equal(epx.static_table(lay), epx.static_table(lay, seed=42))


def test_dispatch_takes_a_plan_as_the_other_calls_do():
    """dispatch_topk(ids, plan, layer) raised AttributeError."""
    p = epx.plan(np.arange(1., 17.).reshape(2, 8), num_gpus=4, num_redundant=4)
    lay = p.layout
    ids = np.tile(np.arange(8), (16, 1))
    for mode in ("dynamic", "physical", "rank_invariant", "balanced"):
        np.testing.assert_array_equal(epx.dispatch_topk(ids, p, 1, mode=mode),
                                      epx.dispatch_topk(ids, lay, 1, mode=mode))
    np.testing.assert_array_equal(  # a Plan weighs by its own replica weights
        epx.dispatch_topk(ids, p, 1, mode="weighted"),
        epx.dispatch_topk(ids, lay, 1, mode="weighted", replica_weights=p.replica_weights))
    t = epx.static_table(p)
    np.testing.assert_array_equal(epx.dispatch_topk(ids, p, 0, mode="static", table=t),
                                  epx.dispatch_topk(ids, lay, 0, mode="static", table=t))
    np.testing.assert_array_equal(epx.dispatch.table_gpu_load(p, t, np.ones((2, 8))),
                                  epx.dispatch.table_gpu_load(lay, t, np.ones((2, 8))))
    with pytest.raises(TypeError, match="layout must be an epx.Layout or an epx.Plan, not dict"):
        epx.dispatch_topk(ids, {}, 0)
