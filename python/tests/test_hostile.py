"""Hostile inputs to the Python API (issue 29): every one refused with an error
naming the argument and the rule, never a silent wrap or a silent default."""
import warnings

import numpy as np
import pytest

import epx


# ---- SGLang release strings: one parser for the CLI and Python -------------

def _layout():
    m = np.array([[0, 1, 2, 3, 0, 0, 1, 2], [3, 2, 1, 0, 3, 3, 3, 2]])
    return epx.Layout.from_map(m, num_gpus=4)


def _w():
    return np.arange(1, 17, dtype=np.float32).reshape(2, 8)


def _every_release_taker(v):
    """Each Python entry point that takes an SGLang release, called with v."""
    lay = _layout()
    l2p = np.array([[[0, 4, 5], [1, 6, -1], [2, 7, -1], [3, -1, -1]]] * 2)
    return [
        lambda: epx.sglang.rebalance_experts(_w(), 12, 1, 1, 4, False, sglang_version=v),
        lambda: epx.plan(_w(), num_gpus=4, num_redundant=4, algorithm="deepseek",
                         sglang_version=v),
        lambda: epx.static_table(lay, sglang_version=v),
        lambda: epx.sglang.compute_logical_to_rank_dispatch_physical_map(
            l2p, 4, 8, 0, sglang_version=v),
        lambda: epx.planner.sglang_eplb_rule(v),
    ]


@pytest.mark.parametrize("v", ["0.5", "0.5.post1", "0.5.2\x00junk", "99.0", "0.5.2 ", "",
                               "0.05.2", "0.5.2rc1", "latest", "0.5.2\u00e9"])
def test_malformed_release_refused(v):
    for f in _every_release_taker(v):
        with pytest.raises(epx.EpxError) as ei:
            f()
        assert ei.value.status == epx.Status.INVALID_ARG
        assert "MAJOR.MINOR.PATCH" in ei.value.message, ei.value.message


@pytest.mark.parametrize("v", ["0.4.0", "0.0.0", "0.5.1", "0.5.1.post3"])
def test_older_release_refused_naming_the_oldest(v):
    for f in _every_release_taker(v):
        with pytest.raises(epx.EpxError) as ei:
            f()
        assert "older than 0.5.2, the oldest release epx reproduces" in ei.value.message


@pytest.mark.parametrize("v", [0.5, 0.52, 5, b"0.5.2", True])
def test_release_not_a_str_refused(v):
    for f in _every_release_taker(v):
        with pytest.raises(TypeError, match="sglang_version must be a str"):
            f()


def test_newer_release_warns_everywhere():
    for f in _every_release_taker("99.0.0"):
        with pytest.warns(UserWarning, match=r"99\.0\.0 is newer than the newest release"):
            f()
    for f in _every_release_taker("0.5.2"):  # the oldest: no word
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            f()


# ---- Python integers: checked against the C types' ranges before the call --

def test_vllm_rebalance_refuses_wrapping_integers():
    w = np.arange(1, 33, dtype=np.float32).reshape(1, 32)
    pol = epx.vllm.DefaultEplbPolicy
    for args, name in [((w, 32, 1, 1, 2 ** 32 + 8), "num_ranks"),
                       ((w, 32, 2 ** 32 + 1, 1, 8), "num_groups"),
                       ((w, 32, 1, 2 ** 32 + 1, 8), "num_nodes"),
                       ((w, 2 ** 32 + 32, 1, 1, 8), "num_replicas")]:
        with pytest.raises(ValueError) as ei:
            pol.rebalance_experts(*args)
        msg = str(ei.value)
        assert name in msg and str(max(a for a in args[1:] if isinstance(a, int))) in msg, msg
        assert "outside [1, " in msg, msg
    with pytest.raises(ValueError, match=r"num_ranks = -8 is outside \[1, 65536\]"):
        pol.rebalance_experts(w, 32, 1, 1, -8)
    with pytest.raises(TypeError, match="num_ranks must be an integer, not float"):
        pol.rebalance_experts(w, 32, 1, 1, 8.0)
    with pytest.raises(ValueError, match="num_gpus = 4294967304 is outside"):
        epx.vllm.rebalance_experts(w, 32, 1, 1, 2 ** 32 + 8)
    # the largest legal values still run
    p2l = pol.rebalance_experts(w, 32, 1, 1, 8)
    assert p2l.shape == (1, 32)


def test_planner_and_tables_refuse_wrapping_integers():
    w = np.arange(1, 17, dtype=np.float32).reshape(2, 8)
    with pytest.raises(ValueError, match="num_gpus = 4294967300 is outside"):
        epx.sglang.rebalance_experts(w, 12, 1, 1, 2 ** 32 + 4, False)
    with pytest.raises(ValueError, match=r"num_replicas = 4294967308 is outside \[1, 48\]"):
        epx.sglang.rebalance_experts(w, 2 ** 32 + 12, 1, 1, 4, False)
    with pytest.raises(ValueError, match="num_gpus = 4294967300"):
        epx.plan(w, num_gpus=2 ** 32 + 4, num_redundant=4)
    with pytest.raises(TypeError, match="num_redundant must be an integer, not float"):
        epx.plan(w, num_gpus=4, num_redundant=4.5)
    lay = _layout()
    l2p = np.array([[[0, 4, 5], [1, 6, -1], [2, 7, -1], [3, -1, -1]]] * 2)
    f = epx.sglang.compute_logical_to_rank_dispatch_physical_map
    with pytest.raises(ValueError, match=r"ep_rank = -1 is outside \[0, 3\]"):
        f(l2p, 4, 8, -1)
    with pytest.raises(ValueError, match="num_gpus = 4294967300"):
        f(l2p, 2 ** 32 + 4, 8, 0)
    ids = np.array([[0, 1], [2, 3]])
    with pytest.raises(ValueError, match=r"layer = 4294967297 is outside \[0, 1\]"):
        epx.dispatch_topk(ids, lay, 2 ** 32 + 1)
    with pytest.raises(TypeError, match="layer must be an integer, not float"):
        epx.dispatch_topk(ids, lay, 1.0)
    table = epx.static_table(lay)
    with pytest.raises(ValueError, match=r"ep_rank = -1 is outside \[0, 3\]"):
        epx.dispatch_topk(ids, lay, 0, mode="static", table=table, ep_rank=-1)


def test_torch_ops_refuse_wrapping_integers():
    torch = pytest.importorskip("torch", reason="torch is not installed (EPX_PY_TORCH=0)")
    import epx.torch as et
    ids = torch.tensor([[0, 1], [2, 3]], dtype=torch.int64)
    with pytest.raises(TypeError, match="num_experts must be an integer, not float 8.5"):
        et.dispatch_layout(ids, 8.5, 4)
    with pytest.raises(ValueError, match=r"num_experts = 4294967304 is outside \[1, 1048576\] "
                                         r"\(EPX_MAX_EXPERTS\)"):
        et.dispatch_layout(ids, 2 ** 32 + 8, 8)
    with pytest.raises(ValueError, match=r"num_ranks = -4 is outside \[1, 65536\]"):
        et.dispatch_layout(ids, 8, -4)
    with pytest.raises(ValueError, match="num_physical = 4294967328 is outside"):
        et.Mapping.static(torch.arange(4, dtype=torch.int32), 2 ** 32 + 32)
    with pytest.raises(ValueError, match="num_physical = 4294967328 is outside"):
        et.token_layout(ids.to(torch.int32), 2 ** 32 + 32, 4)
    m = et.Mapping.static(torch.arange(4, dtype=torch.int32), 8)
    with pytest.raises(ValueError, match=r"layer = 4294967299 is outside \[0, 4294967295\]"):
        et.map_ids(ids, m, layer=2 ** 32 + 3)
    with pytest.raises(ValueError, match=r"layer = -1 is outside"):
        et.map_ids(ids, m, layer=-1)
    with pytest.raises(TypeError, match="layer must be an integer, not float"):
        et.map_ids(ids, m, layer=3.0)
    lay = _layout()
    table = epx.static_table(lay)
    with pytest.raises(ValueError, match=r"ep_rank = -1 is outside \[0, 3\]"):
        et.Mapping.from_layout(lay, 0, mode="static", table=table, ep_rank=-1)
    with pytest.raises(ValueError, match=r"layer = 4294967297 is outside \[0, 1\]"):
        et.Mapping.from_layout(lay, 2 ** 32 + 1, mode="dynamic")
    # legal calls still run
    tpr, tpe, in_rank = et.dispatch_layout(ids, 8, 4)
    assert int(tpe.sum()) == 4
    assert et.map_ids(ids, m, layer=2 ** 32 - 1).shape == (2, 2)


def test_python_limits_match_the_header():
    import re
    from conftest import REPO
    from epx import _arrays as A
    h = (REPO / "include" / "epx.h").read_text()
    want = {"EPX_MAX_LAYERS": A.MAX_LAYERS, "EPX_MAX_EXPERTS": A.MAX_EXPERTS,
            "EPX_MAX_GPUS": A.MAX_GPUS}
    for name, value in want.items():
        m = re.search(r"#define %s (.+)" % name, h)
        assert m and eval(m.group(1)) == value, name
    assert epx._native._newest_verified().decode() == "0.5.23"
    assert re.search(r'#define EPX_SGLANG_OLDEST_VERSION "0\.5\.2"', h)


def test_table_seeds_follow_cpython_random():
    lay = _layout()
    # random.Random(-1) is random.Random(1): CPython seeds with abs(n)
    np.testing.assert_array_equal(epx.static_table(lay, seed=-42), epx.static_table(lay, seed=42))
    for bad in (2 ** 64 + 42, 2 ** 100, -(2 ** 64)):
        with pytest.raises(ValueError, match=r"seed = .* is outside .*\|seed\| < 2\*\*64"):
            epx.static_table(lay, seed=bad)
    with pytest.raises(TypeError, match="seed must be an integer, not float"):
        epx.static_table(lay, seed=42.0)
    l2p = np.array([[[0, 4, 5], [1, 6, -1], [2, 7, -1], [3, -1, -1]]] * 2)
    f = epx.sglang.compute_logical_to_rank_dispatch_physical_map
    np.testing.assert_array_equal(f(l2p, 4, 8, 0, seed=-7), f(l2p, 4, 8, 0, seed=7))


def test_from_windows_counts_checked():
    t = np.ones((2, 2, 8))
    f = epx.sglang.rebalance_experts_from_windows
    with pytest.raises(ValueError, match=r"num_local_physical_experts = 0 is outside \[1, 12\]"):
        f(t, 12, 0, 1, 1, "deepseek")
    with pytest.raises(ValueError, match="not a multiple"):
        f(t, 12, 5, 1, 1, "deepseek")


def test_bf16_weights_accepted_like_the_vllm_wrappers():
    torch = pytest.importorskip("torch", reason="torch is not installed (EPX_PY_TORCH=0)")
    w = torch.arange(1, 17, dtype=torch.float32).reshape(2, 8)
    a = epx.sglang.rebalance_experts(w.to(torch.bfloat16), 12, 1, 1, 4, False)
    b = epx.sglang.rebalance_experts(w, 12, 1, 1, 4, False)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_torch_ids_shapes_named():
    torch = pytest.importorskip("torch", reason="torch is not installed (EPX_PY_TORCH=0)")
    import epx.torch as et
    with pytest.raises(ValueError, match=r"topk_ids has shape \(64, 0\): each token needs at "
                                         r"least one expert"):
        et.dispatch_layout(torch.zeros((64, 0), dtype=torch.int64), 8, 4)
    sparse = torch.tensor([[0, 1], [2, 3]]).to_sparse()
    with pytest.raises(ValueError, match="topk_ids must be a dense tensor"):
        et.dispatch_layout(sparse, 8, 4)


def test_integer_arrays_refuse_fractions_wraps_and_booleans():
    """Every integer array the binding hands to C goes through one check: a
    float map with fractions is refused (it used to be truncated), as are
    values past the C type and booleans."""
    import numpy as np
    import epx._arrays as A
    assert A.as_array(np.array([[1.0, 2.0]]), np.int32, 2).tolist() == [[1, 2]]
    with pytest.raises(ValueError, match=r"table\[0, 1\] = 2.5 is not a whole number"):
        A.as_array(np.array([[1.0, 2.5]]), np.int32, 2, "table")
    with pytest.raises(ValueError, match="outside int32's range"):
        A.as_array([2 ** 31], np.int32, 1, "ids")
    with pytest.raises(ValueError, match="not booleans"):
        A.as_array([True, False], np.int32, 1, "ids")
    with pytest.raises(ValueError, match="not a whole number"):
        A.as_array([float("inf")], np.int64, 1, "ids")


@pytest.mark.parametrize("call, name", [
    (lambda: epx.Layout.from_map([[0 + 1j, 1, 0, 1]], 2), "physical_to_logical_map"),
    (lambda: epx.plan(np.ones((2, 8)) * (1 + 2j), num_gpus=4), "counts"),
    (lambda: epx.dispatch_topk(np.array([[0, 1j]]), epx.Layout.trivial(1, 4, 8, 2), 0), "topk_ids"),
    (lambda: epx.dispatch_topk([[0, 1]], epx.Layout.trivial(1, 4, 8, 2), 0, mode="weighted",
                               replica_weights=np.ones((1, 8), complex)), "replica_weights"),
    (lambda: epx.metrics.gpu_loads(epx.Layout.trivial(1, 4, 8, 2), np.ones((1, 4), np.complex64)),
     "counts"),
])
def test_complex_arrays_refused_not_cut_to_their_real_part(call, name):
    with pytest.raises(ValueError, match=r"^%s holds complex numbers" % name):
        call()


def test_complex_tensor_refused():
    torch = pytest.importorskip("torch", reason="torch is not installed (EPX_PY_TORCH=0)")
    with pytest.raises(ValueError, match=r"weight holds complex numbers \(dtype complex64\)"):
        epx.rebalance_experts(torch.ones((2, 8), dtype=torch.complex64), 8, 1, 1, 4, False)


@pytest.mark.parametrize("call, kind, needle", [
    (lambda: epx.Layout.from_map([["0", "1"]], num_gpus=2), TypeError,
     r"physical_to_logical_map must hold numbers, not strings"),
    (lambda: epx.dispatch_topk([["0", "1"]], epx.Layout.trivial(1, 4, 8, 2), 0), TypeError,
     r"topk_ids must hold numbers, not strings"),
    (lambda: epx.plan([[1, 2], [3]], num_gpus=2), ValueError,
     r"counts must be a rectangular array of numbers"),
    (lambda: epx.plan([[1, None]], num_gpus=2), TypeError,
     r"counts must hold numbers, not NoneType"),
    (lambda: epx.trace.synth("mixtral", skew=1.0), TypeError, r"skew must be a pair \(lo, hi\)"),
    (lambda: epx.trace.synth("mixtral", skew=("a", 1)), TypeError, r"skew must be a pair"),
])
def test_numpy_errors_become_messages_naming_the_argument(call, kind, needle):
    with pytest.raises(kind, match=needle):
        call()


def test_torch_ops_refuse_numpy_arrays_by_name():
    """torch's dispatcher answered a numpy array with its schema dump."""
    pytest.importorskip("torch", reason="torch is not installed (EPX_PY_TORCH=0)")
    import epx.torch as et
    y, pos = np.ones((2, 4), np.float32), np.zeros((2, 1), np.int32)
    with pytest.raises(TypeError, match="^y must be a torch.Tensor, got ndarray"):
        et.combine(y, pos)
    lay = epx.Layout.trivial(1, 4, 8, 2)
    with pytest.raises(TypeError, match="^topk_ids must be a torch.Tensor, got ndarray"):
        et.balanced_topk(pos, et.Mapping.from_layout(lay, 0, mode="balanced"))
    with pytest.raises(TypeError, match="^topk_ids must be a torch.Tensor, got ndarray"):
        et.map_ids(pos, et.Mapping.from_layout(lay, 0, mode="dynamic"))
