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
