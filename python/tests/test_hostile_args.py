"""Hostile arguments a fuzzing pass of the Python API found unchecked: each
was read past its end by C, wrapped to int32, written under a wrong name,
computed into NaN or dropped without a word. Every one now raises, naming
the argument and what it must be."""
import ctypes

import numpy as np
import pytest

import epx
from epx import dispatch as D
from epx import metrics, pt
from epx import sglang as S
from epx._native import EpxError


def _layout(L=3):
    return epx.Layout.from_map(np.tile([0, 1, 2, 3, 0, 1, 2, 3], (L, 1)), 2)  # E 4, P 8, G 2


# ---- arrays C reads in full: their shape must be the layout's ----------------

@pytest.mark.parametrize("call, needle", [
    (lambda lay: metrics.gpu_loads(lay, np.ones((3, 4)), replica_weights=np.full((3, 4), .5)),
     "replica_weights has shape [3][4]; it must be [L][P] = [3][8]"),
    (lambda lay: metrics.evaluate(lay, np.ones((3, 4)), replica_weights=np.full((1, 8), .5)),
     "replica_weights has shape [1][8]"),
    (lambda lay: D.static_table(lay, "epx", replica_weights=np.ones((1, 1))),
     "replica_weights has shape [1][1]; it must be [L][P] = [3][8]"),
    (lambda lay: D.static_table(lay, "epx", expected_load=np.ones((3, 2))),
     "expected_load has shape [3][2]; it must be [L][E] = [3][4]"),
    (lambda lay: D.static_table(lay, replicas=np.zeros((1, 4, 1), int)),
     "replicas has shape [1][4][1]; it must be [L][E][X] = [3][4][any]"),
    (lambda lay: D.sglang_rank_lists(lay, replicas=np.zeros((3, 2, 1), int)),
     "replicas has shape [3][2][1]"),
    (lambda lay: D.table_gpu_load(lay, D.static_table(lay), np.ones((3, 1))),
     "load has shape [3][1]; it must be [L][E] = [3][4]"),
    (lambda lay: D.table_gpu_load(lay, np.zeros((1, 3, 4), int), np.ones((3, 4))),
     "table has shape [1][3][4]; it must be [G][L][E] = [2][3][4]"),
    (lambda lay: D.dispatch_topk([[0, 1]], lay, 0, mode="static", table=np.zeros((2, 3, 2), int)),
     "table has shape [2][3][2]; it must be [G][L][E] = [any][3][4]"),
    (lambda lay: D.dispatch_topk([[0, 1]], lay, 0, mode="weighted",
                                 replica_weights=np.full((1, 2), .5)),
     "replica_weights has shape [1][2]"),
])
def test_short_arrays_refused_before_c_reads_them(call, needle):
    with pytest.raises(ValueError) as e:
        call(_layout())
    assert needle in str(e.value)


def test_unknown_table_algorithm_named():
    with pytest.raises(ValueError, match="algorithm must be one of .*not 'foo'"):
        D.static_table(_layout(), algorithm="foo")


# ---- wrapper classes take libepx's handles only ------------------------------

@pytest.mark.parametrize("make", [lambda: epx.Plan(None), lambda: epx.Layout(123),
                                  lambda: epx.Layout(ctypes.c_void_p())])
def test_wrapper_of_no_handle_refused(make):
    with pytest.raises(TypeError, match=r"wraps a handle libepx made"):
        make()


def _plan():
    return epx.plan(np.ones((2, 8)), num_gpus=4)


@pytest.mark.parametrize("make", [
    lambda: epx.Layout(epx.Layout.trivial(2, 4, 8, 2).handle),  # freed twice: SIGABRT
    lambda: epx.Plan(epx.Layout.trivial(2, 4, 8, 2).handle),  # a layout read as a plan: SIGSEGV
    lambda: epx.Layout(_plan().layout.handle),  # the plan's layout freed under it
    lambda: epx.Plan(_plan()._h),  # the plan freed twice
])
def test_wrapping_a_live_handle_again_refused(make):
    with pytest.raises(TypeError, match=r"is not public: a handle is wrapped once"):
        make()


def test_the_packages_own_wrappers_still_free_and_share_safely():
    lay = epx.Layout.trivial(2, 4, 8, 2)
    view = _plan().layout  # the plan lives on in its view
    del lay
    assert view.physical_to_logical_map.shape == (2, 8)
    assert epx.Layout.from_map([[0, 1]], 1).clone().num_logical_experts == 2


# ---- integers: checked, never wrapped to int32 or truncated ------------------

@pytest.mark.parametrize("call, needle", [
    (lambda: epx.Layout.trivial(2, 4, 8, 2 ** 32 + 2), "num_gpus = 4294967298 is outside"),
    (lambda: epx.Layout.from_map([[0, 1, 2, 3]], 2 ** 32 + 2), "num_gpus = 4294967298"),
    (lambda: epx.Layout.from_map([[0, 1, 2, 3]], 2.9), "num_gpus must be an integer, not float"),
    (lambda: epx.Layout.from_map([[0, 1, 2, 3]], "2"), "num_gpus must be an integer, not str"),
    (lambda: epx.Layout.from_map([[0, 2 ** 31 - 1]], 2), "num_logical_experts = 2147483648"),
    (lambda: metrics.bound_max_load([1, 2, 3, 4], 2 ** 32 + 8, 2), "num_physical = 4294967304"),
    (lambda: epx.init_expert_location('{"physical_to_logical_map": [[0, 1, 2, 3]]}', 2 ** 32 + 2),
     "num_gpus = 4294967298"),
    (lambda: epx.trace.synth("mixtral-8x7b", 2 ** 32 + 2, 100), "num_windows = 4294967298"),
    (lambda: epx.Layout.trivial(2, 4, 8, 2).logical_to_all_physical_map(2 ** 31 - 1),
     "width = 2147483647 is outside [1, 8] (num_physical_experts"),
    (lambda: S.compute_logical_to_all_physical_map([[0, 1, 2, 3]], 4.7), "must be an integer"),
    (lambda: D.count_ids([[0, 1]], 4.5), "num_experts must be an integer, not float"),
    (lambda: D.count_ids([[0, 1]], -1), "num_experts = -1 is outside"),
    (lambda: D.balanced_split([1, 2], replicas=[[0, 1], [2, 3]], num_physical=4.9, num_gpus=2),
     "num_physical must be an integer"),
    (lambda: _layout().logical_to_all_physical_map(2.9), "width must be an integer"),
    (lambda: _layout().logical_to_all_physical_map("full"), 'or "sglang"'),
])
def test_integers_checked(call, needle):
    with pytest.raises((TypeError, ValueError)) as e:
        call()
    assert needle in str(e.value)


@pytest.mark.parametrize("algorithm", [2 ** 32 + 1, True, 99])
def test_plan_algorithm_code_checked(algorithm):
    with pytest.raises(ValueError, match="unknown algorithm"):
        epx.plan(np.ones((2, 8)), 2, algorithm=algorithm)


# ---- paths: str, bytes or PathLike, no NUL ------------------------------------

def test_path_types_and_nul(tmp_path):
    lay = _layout()
    for bad in (None, 7, 2.5):
        with pytest.raises(TypeError, match="must be a path"):
            lay.write_json(bad)
        with pytest.raises(TypeError, match="must be a path"):
            epx.read_mapping(bad)
    nul = str(tmp_path / "out.json") + "\x00.bak"
    with pytest.raises(ValueError, match="NUL byte"):
        lay.write_json(nul)
    with pytest.raises(ValueError, match="NUL byte"):
        pt.write_mapping_pt(nul, lay)
    assert not (tmp_path / "out.json").exists()
    good = tmp_path / "m.json"
    lay.write_json(bytes(good))  # bytes is a path, not the text "b'...'"
    assert good.exists() and not (tmp_path / ("b'%s'" % good)).exists()


def test_dump_list_item_with_a_comma(tmp_path):
    with pytest.raises(ValueError, match=r"spec\[1\] .* holds a comma"):
        pt.read_dump([str(tmp_path / "a.pt"), str(tmp_path / "runs,old.pt")])
    # a path that exists is one name, commas and all (it was split at them)
    (tmp_path / "runs,old").mkdir()
    dump = tmp_path / "runs,old" / "c.pt"
    pt.write_counts_pt(str(dump), np.array([[1.0, 2.0, 3.0, 4.0]]))
    assert pt.read_dump(str(dump)).tolist() == [[[1.0, 2.0, 3.0, 4.0]]]
    assert epx.read_counts(str(dump)).tolist() == [[[1.0, 2.0, 3.0, 4.0]]]


# ---- loads: what the readers take back, sums that stay finite -----------------

def test_writers_refuse_loads_readers_refuse(tmp_path):
    for bad, needle in ((np.nan, "is nan"), (-3.0, "is -3"), (1e19, r"above 2\^63")):
        c = np.array([[1.0, bad, 2.0, 3.0]])
        with pytest.raises(EpxError, match=needle):
            epx.write_counts(str(tmp_path / "c.json"), c)
        with pytest.raises(EpxError, match=needle):
            pt.write_counts_pt(str(tmp_path / "c.pt"), c)
    assert not list(tmp_path.iterdir())


def test_huge_loads_refused_not_nan():
    lay = _layout(1)
    huge = np.full((1, 4), 1e308)
    for call in (lambda: metrics.evaluate(lay, huge), lambda: metrics.gpu_loads(lay, huge),
                 lambda: metrics.bound_max_load(huge[0], 8, 2),
                 lambda: D.table_gpu_load(lay, D.static_table(lay), huge)):
        with pytest.raises(EpxError, match="above 2"):
            call()
    with pytest.raises(EpxError, match="is nan"):
        D.table_gpu_load(lay, D.static_table(lay), np.array([[1.0, np.nan, 0, 0]]))


# ---- options an algorithm does not take are refused ----------------------------

def test_deepseek_refuses_active_ranks_and_planner_keywords():
    t = np.ones((3, 2, 8))
    with pytest.raises(ValueError, match="active_ranks applies to the elasticity_aware"):
        S.rebalance_experts_from_windows(t, 16, 4, 2, 1, "deepseek", active_ranks=[0, 0, 0, 1])
    with pytest.raises(TypeError, match="unexpected keywords for algorithm 'deepseek'"):
        S.rebalance_experts_from_windows(t, 16, 4, 2, 1, "deepseek", estimate="max")


# ---- messages that name the argument at fault ----------------------------------

def test_messages_name_the_argument_at_fault():
    with pytest.raises(ValueError, match="log2phy has 2 rows"):
        S.LPLBSolver([0, 1, 2, 3, 0, 1, 2, 3], np.zeros((2, 2), int), 2)
    assert not epx.has("_handle") and not epx.has("__class__") and epx.has("epx_version")
    first = epx.plan(np.ones((1, 4)), 2)
    again = epx.plan(np.ones((1, 4)), 2, current=first)  # a Plan is the placement in service
    assert again.layout.physical_to_logical_map.shape == first.layout.physical_to_logical_map.shape
    with pytest.raises(TypeError, match="current must be a Layout or a Plan"):
        epx.plan(np.ones((1, 4)), 2, current="placement.json")


# ---- a second pass (2026-12-05): copies, sums, fractions, shared slots ----------

def test_copies_of_handle_owners_clone_or_refuse():
    """copy.copy made a second owner of one C handle, freed twice (a crash):
    a Layout's copy is a clone; a Plan's or Balancer's is refused, as is
    pickling any of them."""
    import copy
    import pickle
    lay = _layout()
    for dup in (copy.copy(lay), copy.deepcopy(lay)):
        assert dup.handle.value != lay.handle.value
        np.testing.assert_array_equal(dup.physical_to_logical_map, lay.physical_to_logical_map)
    del lay  # the copies own their handles
    plan = epx.plan(np.ones((1, 8)), num_gpus=4, num_redundant=4)
    bal = D.Balancer(4, 2, 8, 4)
    for obj, name in ((plan, "Plan"), (bal, "Balancer"), (_layout(), "Layout")):
        if name != "Layout":
            with pytest.raises(TypeError, match="%s owns a C handle" % name):
                copy.copy(obj)
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(obj)


def test_window_sums_of_narrow_integers_do_not_wrap():
    """uint8 windows of 128 summed to 0 in uint8; torch sums integers in int64."""
    t = np.array([[[128, 10, 10, 11]], [[128, 10, 10, 11]]], dtype=np.uint8)
    got = S.rebalance_experts_from_windows(t, 8, 2, 1, 1, "deepseek")
    want = S.rebalance_experts_from_windows(t.astype(np.int64), 8, 2, 1, 1, "deepseek")
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bad", [__import__("fractions").Fraction(3, 2), np.float32(1.5),
                                 float("inf")])
def test_object_arrays_of_fractions_refused(bad):
    """int() cut Fraction(3, 2) and np.float32(1.5) to 1 in object arrays."""
    ids = np.array([[bad, 0]], dtype=object)
    with pytest.raises(ValueError, match="is not a whole number"):
        D.count_ids(ids, 4)
    whole = np.array([[__import__("fractions").Fraction(4, 2), 0]], dtype=object)
    np.testing.assert_array_equal(D.count_ids(whole, 4), [1, 0, 1, 0])


def test_torch_mappings_check_their_lists():
    """A slot listed by two experts sent one's tokens to the other; padding
    past num_valid was never read, so never checked; balanced lists took any
    negative id as padding."""
    from epx.torch import Mapping
    with pytest.raises(ValueError, match="slot 1 is listed by expert 0 and by expert 1"):
        Mapping.dynamic([[0, 1], [1, 3]], 4)
    with pytest.raises(ValueError, match=r"replicas\[0\]\[1\] = -5 is outside \[-1, 4\)"):
        Mapping.dynamic([[0, -5], [1, 3]], 4, num_valid=[1, 2])
    with pytest.raises(ValueError, match=r"num_valid\[0\] is 1, but replicas\[0\] holds 2"):
        Mapping.dynamic([[0, 2], [1, 3]], 4, num_valid=[1, 2])
    with pytest.raises(ValueError, match=r"replicas\[1\] has no slot"):
        Mapping.dynamic([[0, 2], [-1, -1]], 4)
    with pytest.raises(ValueError, match=r"replicas\[0\]\[1\] = -9 is outside"):
        Mapping.balanced([[0, -9], [1, -1]], 2, 2)
    with pytest.raises(ValueError, match=r"replicas\[0\]\[1\] = -5 is outside \[-1, 8\)"):
        D.Balancer(4, 2, 8, 4).solve(np.array([[0, -5], [1, 5], [2, 6], [3, 7]]), [3, 1, 1, 1])
    with pytest.raises(ValueError, match=r"replicas\[2\] has a -1 before slot 6"):
        D.Balancer(4, 2, 8, 4).solve(np.array([[0, 4], [1, 5], [-1, 6], [3, 7]]), [3, 1, 1, 1])
    with pytest.raises(ValueError, match=r"replicas\[3\] has no slot"):
        D.Balancer(4, 2, 8, 4).solve(np.array([[0, 4], [1, 5], [2, 6], [-1, -1]]), [3, 1, 1, 1])
    lay = _layout()
    table = D.static_table(lay)
    with pytest.raises(ValueError, match=r"table must be \[G\]\[L\]\[E\] = \[2, 3, 4\]"):
        Mapping.from_layout(lay, 0, "static", table=table[:, :, :3])


def test_log2phy_of_another_expert_refused_at_construction():
    p2l = np.array([0, 1, 2, 3, 0, 1, 2, 3])
    with pytest.raises(ValueError, match="slot 5 holds expert 1, not 0"):
        S.LPLBSolver(p2l, np.array([[0, 5], [1, 4], [2, 6], [3, 7]]), 4)
    with pytest.raises(ValueError, match=r"log2phy\[0\]\[1\] = -7 is outside \[-1, 8\)"):
        S.LPLBSolver(p2l, np.array([[0, -7], [1, 5], [2, 6], [3, 7]]), 4)
    with pytest.raises(ValueError, match="slot 5 holds expert 1, not 0"):
        D.balanced_log2phy_prob([3, 1, 1, 1], replicas=[[0, 4], [1, 5], [2, 6], [3, 7]],
                                num_physical=8, num_gpus=4,
                                log2phy=[[0, 5], [1, 4], [2, 6], [3, 7]])


def test_a_shared_balancer_serves_threads():
    """Four threads on one Balancer got 347 wrong replica counts of 1200: the
    C workspace serves one call at a time, so calls take turns."""
    import threading
    rng = np.random.default_rng(0)
    E, W, P, G = 64, 4, 96, 8
    lay = epx.plan(rng.integers(1, 1000, (1, E)).astype(float), num_gpus=G,
                   num_physical_experts=P).layout
    reps = lay.logical_to_all_physical_map(W)[0]
    batches = [rng.integers(0, 500, E) for _ in range(8)]
    want = [D.Balancer(E, W, P, G).solve(reps, c).replica_counts for c in batches]
    shared, bad = D.Balancer(E, W, P, G), []

    def run(i):
        for it in range(150):
            j = (i + it) % 8
            if not np.array_equal(shared.solve(reps, batches[j]).replica_counts, want[j]):
                bad.append(j)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad, "%d wrong answers from a shared Balancer" % len(bad)


def test_map_ids_mode_checked():
    """2**40 + 2 was narrowed to a C int and ran as mode 2 (dynamic)."""
    torch = pytest.importorskip("torch")
    import epx.torch  # noqa: F401  (registers torch.ops.epx)
    ids = torch.tensor([[0, 1], [1, 0]], dtype=torch.int32)
    reps = torch.tensor([[0, 2], [1, 3]], dtype=torch.int32)
    nv = torch.tensor([2, 2], dtype=torch.int32)
    for mode in (2 ** 40 + 2, -1, 9):
        with pytest.raises(ValueError, match="is not a dispatch mode"):
            torch.ops.epx.map_ids(ids, mode, 2, 4, None, reps, nv, None, 0, 0, 0)
    assert torch.ops.epx.map_ids(ids, 2, 2, 4, None, reps, nv, None, 0, 0, 0).shape == (2, 2)


def test_names_and_numbers_are_what_they_say():
    """A model name went through str() (None looked up 'None', a NUL cut the
    name short), options through float() (the text "3" was 3.0); a layout's
    balanced split dropped replicas / num_gpus given beside it."""
    from epx import trace
    with pytest.raises(TypeError, match="name must be a model name"):
        trace.model(None)
    with pytest.raises(ValueError, match="NUL"):
        trace.model("deepseek-v3\x00junk")
    with pytest.raises(TypeError, match="move_price must be a number, not str"):
        epx.plan(np.ones((1, 8)), num_gpus=4, num_redundant=4, move_price="3")
    with pytest.raises(TypeError, match="drift must be a number, not bool"):
        trace.synth("mixtral", num_windows=2, tokens=100, drift=True)
    lay = _layout()
    with pytest.raises(ValueError, match="not both: num_gpus given beside the layout"):
        D.balanced_split([1, 1, 1, 1], layout=lay, num_gpus=2)
    with pytest.raises(ValueError, match="layer=1 picks a layer of a layout"):
        D.balanced_split([1, 1], replicas=[[0], [1]], num_physical=2, num_gpus=2, layer=1)
    assert trace.synth("mixtral", num_windows=2, tokens=100, drift=np.float32(0.2)).shape[0] == 2


def test_wrong_kinds_of_object_named():
    """An ndarray as a layout failed inside ("tuple indices must be integers"),
    an object() with AttributeError, a numpy array of rows in
    per_token_cast_fp8 with AttributeError."""
    with pytest.raises(TypeError, match="layout must be an epx.Layout or epx.Plan, not ndarray"):
        D.balanced_split([1, 1], layout=np.zeros((2, 2)))
    torch = pytest.importorskip("torch")
    from epx.torch import Mapping
    from epx.torch.buffer import per_token_cast_fp8
    with pytest.raises(TypeError, match="layout must be an epx.Layout or epx.Plan, not object"):
        Mapping.from_layout(object(), 0)
    with pytest.raises(TypeError, match="x must be a torch tensor of rows"):
        per_token_cast_fp8(np.zeros((2, 128)))
    with pytest.raises(TypeError, match="a 0-d tensor"):
        per_token_cast_fp8(torch.tensor(1.0))


def test_tensor_views_read_as_their_values():
    """A negated view (torch's neg bit) raised torch's RuntimeError from
    .numpy(); a meta tensor NotImplementedError."""
    torch = pytest.importorskip("torch")
    ids = torch.tensor([[-0, -1], [-2, -3]])
    neg = torch._neg_view(ids)  # values 0, 1, 2, 3 with the neg bit set
    np.testing.assert_array_equal(D.count_ids(neg, 4), [1, 1, 1, 1])
    with pytest.raises(ValueError, match="topk_ids is a meta tensor"):
        D.count_ids(torch.empty((2, 2), dtype=torch.int64, device="meta"), 4)
