"""Placement (include/epx/plan.h): DeepSeek EPLB reproduced exactly (and as
each SGLang release's copy of it runs), and epx's own planner with its
options."""
import ctypes

import numpy as np

from . import _arrays as A
from ._native import (LOG_FN, POINTER, Counts, Shape, Structure, c_char_p, c_double,
                      c_float, c_int, c_int32, c_uint8, c_uint32, c_void_p, call, fn,
                      sglang_release)
from ._counts import CCounts
from ._native import EpxError, OwnsHandle, Status
from .layout import PRIVATE, Layout, _handle, refuse_raw

__all__ = ["deepseek", "plan", "Plan", "ALGORITHMS", "EPLB_RULES"]

# ---- DeepSeek EPLB, exact -------------------------------------------------

_plan_deepseek = fn("epx_plan_deepseek_rule", c_int32, POINTER(c_float), c_int32, c_int32,
                    c_int32, c_int32, c_int32, c_int32, c_int, c_int, POINTER(c_int32),
                    POINTER(c_int32), POINTER(c_int32), c_void_p)

_newest = fn("epx_sglang_newest_verified", c_char_p)
# The newest SGLang release epx was checked against (EPX_SGLANG_DEFAULT_VERSION).
SGLANG_NEWEST_VERIFIED = _newest().decode()


def sglang_eplb_rule(sglang_version):
    """The EPLB rule (epx_eplb_rule) of an SGLang release: 1 = float32 pack
    sums (SGLang <= 0.5.10.post1), 2 = float64 (SGLang >= 0.5.11), both with
    torch's order of tied loads; None gives 0, DeepSeek's own rule (float32,
    ties to the lowest index). A release newer than SGLANG_NEWEST_VERIFIED warns (the newest
    rule is used); a malformed one raises EpxError naming it."""
    if sglang_version is None:
        return 0
    return sglang_release(sglang_version, "eplb", stacklevel=4)[1]


# epx_eplb_rule (include/epx/plan.h) by name.
EPLB_RULES = {"deepseek": 0, "sglang-f32": 1, "sglang-f64": 2, "vllm-f64": 3}


def _rule_number(rule, sglang_version):
    if rule is None:
        return sglang_eplb_rule(sglang_version)
    if sglang_version is not None:
        raise ValueError("pass sglang_version=%r or rule=%r, not both: the release names its "
                         "rule" % (sglang_version, rule))
    if not isinstance(rule, str) or rule not in EPLB_RULES:
        raise ValueError("rule must be one of %s, got %r"
                         % (", ".join(repr(k) for k in EPLB_RULES), rule))
    return EPLB_RULES[rule]


def deepseek(weight, num_replicas, num_groups, num_nodes, num_gpus, hierarchical,
             sglang_version=None, rule=None):
    """DeepSeek's rebalance_experts on float32 weight [L][E], as numpy int32:
    (phys_to_log [L][P], log_to_phys [L][E][P-E+1] in replica-rank order with
    -1 padding, logical_count [L][E]). sglang_version: run it as that SGLang
    release's copy does (float64 pack sums from 0.5.11; tied loads in torch's
    sort order); None = DeepSeek's original, ties to the lowest index.
    rule: an EPLB rule by name instead (EPLB_RULES; "vllm-f64" is vLLM >=
    0.14.0's arithmetic: numpy's float32 group sums, float64 quotients and
    pack sums, ties to the lowest index). The engine-shaped wrappers are in
    epx.sglang and epx.vllm."""
    rule = _rule_number(rule, sglang_version)
    w = A.as_array(weight, np.float32, 2, "weight")
    L, E = w.shape
    # Checked before anything is sized from them (no int32 wrap, no huge buffers).
    G = A.integer(num_gpus, "num_gpus", 1, A.MAX_GPUS, "EPX_MAX_GPUS")
    nodes = A.integer(num_nodes, "num_nodes", 1, A.MAX_GPUS, "EPX_MAX_GPUS")
    P = A.integer(num_replicas, "num_replicas", 1, 4 * (E + G),
                  "4 (E + G) slots at most, E = %d, G = %d" % (E, G))
    X = max(P - E + 1, 1)
    p2l = np.empty((L, P), dtype=np.int32)
    l2p = np.empty((L, E, X), dtype=np.int32)
    cnt = np.empty((L, E), dtype=np.int32)
    groups = 1 if num_groups is None else A.integer(num_groups, "num_groups", 0, A.MAX_EXPERTS,
                                                     "EPX_MAX_EXPERTS")
    call(_plan_deepseek, A.ptr(w, c_float), L, E, P, groups, nodes, G,
         1 if hierarchical else 0, rule, A.ptr(p2l, c_int32), A.ptr(l2p, c_int32),
         A.ptr(cnt, c_int32))
    return p2l, l2p, cnt


# ---- the full planner -----------------------------------------------------

ALGORITHMS = {"epx": 0, "deepseek": 1, "deepseek-hierarchical": 2, "auto": 3,
              "deepseek-vec": 4, "deepseek-vec-hierarchical": 5, "elasticity-aware": 6,
              "elasticity-aware-hierarchical": 7}
_ALGO_NAMES = {v: k for k, v in ALGORITHMS.items()}
NODE_LOCAL = {"default": 0, "strict": 1, "relaxed": 2, "off": 3}
ESTIMATES = {"default": 0, "sum": 1, "recency": 2, "mean-std": 3, "minmax": 4}
_EST_NAMES = {v: k for k, v in ESTIMATES.items()}


class PlanOpts(Structure):
    """epx_plan_opts (include/epx/plan.h)."""
    _fields_ = [("version", c_uint32), ("algorithm", c_int), ("num_groups", c_int32),
                ("node_local", c_int), ("cross_node_budget", c_double), ("estimate", c_int),
                ("estimate_param", c_double), ("current", c_void_p), ("max_moves", c_int32),
                ("move_price", c_double), ("failed_gpus", POINTER(c_uint8)), ("log", LOG_FN),
                ("log_user", c_void_p), ("progress", c_void_p), ("progress_user", c_void_p),
                ("sglang_version", c_char_p)]


# The options-struct convention (include/epx.h): version = the struct's size.
PLAN_OPTS_VERSION = ctypes.sizeof(PlanOpts)

_compute = fn("epx_plan_compute", c_int32, POINTER(Counts), POINTER(Shape), POINTER(PlanOpts),
              POINTER(c_void_p), c_void_p)
_destroy = fn("epx_plan_destroy", None, c_void_p)
_layout = fn("epx_plan_layout", c_void_p, c_void_p)
_weights = fn("epx_plan_replica_weights", POINTER(c_double), c_void_p)
_seconds = fn("epx_plan_seconds", c_double, c_void_p)
_algorithm = fn("epx_plan_algorithm", c_int, c_void_p)
_l2p = fn("epx_plan_logical_to_physical", POINTER(c_int32), c_void_p, POINTER(c_int32),
          POINTER(c_int32))


def _choice(table, value, what):
    """A name of `table` (any case, _ or -), or one of its C values."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        if int(value) not in table.values():
            raise ValueError("unknown %s %d: one of %s, or its value %s" % (
                what, value, ", ".join(table), sorted(set(table.values()))))
        return int(value)
    key = str(value).lower().replace("_", "-")
    if key not in table:
        raise ValueError("unknown %s %r: one of %s" % (what, value, ", ".join(table)))
    return table[key]


def _current(current):
    """plan()'s current placement as a layout handle: a Layout, a Plan (its
    layout), or None."""
    if current is None:
        return None
    if isinstance(current, Plan):
        current = current.layout
    if not isinstance(current, Layout):
        raise TypeError("current must be a Layout or a Plan (the placement in service), not %s"
                        % type(current).__name__)
    return current.handle


class Plan(OwnsHandle):
    """A computed placement (epx_plan): .layout, .replica_weights [L][P],
    .seconds (the placement computation alone), .algorithm (AUTO resolved).

    Made by epx.plan(...) only: Plan(handle) is refused (TypeError), as a
    plan handle cannot be told from a layout's, and the Plan frees its
    handle (see Layout)."""

    def __init__(self, handle, _key=None):
        self._h = None
        refuse_raw("Plan", _key, handle, "epx.plan")
        self._h = _handle(handle, "Plan", "epx.plan")

    def __del__(self):
        if getattr(self, "_h", None):
            _destroy(self._h)
            self._h = None

    @property
    def layout(self):
        """The plan's Layout (it keeps the plan alive). A new view per access:
        a Plan that held its Layout, which holds the Plan, would be a cycle,
        freed only when the cyclic collector runs (a plan's layout is 16 MB
        at DeepSeek-V3's 256-GPU shape, and plans piled up between runs)."""
        return Layout(c_void_p(_layout(self._h)), owner=self, _key=PRIVATE)

    @property
    def physical_to_logical_map(self):
        return self.layout.physical_to_logical_map

    @property
    def replica_weights(self):
        s = self.layout.shape
        L, P = s["num_layers"], s["num_physical_experts"]
        return np.ctypeslib.as_array(_weights(self._h), shape=(L * P,)).reshape(L, P).copy()

    @property
    def logical_to_physical_map(self):
        """[L][E][X] int32, -1 padded (X = the largest replica count): each
        expert's slots in the order SGLang builds them for this plan, DeepSeek's
        replica-rank order for a DeepSeek plan (init_by_eplb), ascending for
        others (init_by_mapping); see .replica_rank_order."""
        return self._l2p()[0]

    @property
    def replica_rank_order(self):
        """True when logical_to_physical_map is in DeepSeek's replica-rank order."""
        return self._l2p()[1]

    @property
    def replica_lists(self):
        """[L][E][P - E + 1] int32, -1 padded: logical_to_physical_map at
        full width. A slot listed nowhere (a failed rank's, in an
        elasticity-aware plan) is in no list."""
        return self._l2p(full=True)[0]

    def _l2p(self, full=False):
        s = self.layout.shape
        L, E = s["num_layers"], s["num_logical_experts"]
        w, rank = c_int32(0), c_int32(0)
        p = _l2p(self._h, ctypes.byref(w), ctypes.byref(rank))
        if not p:  # built at the first call; NULL when memory ran out
            raise EpxError(Status.NOMEM, "out of memory building the plan's "
                           "logical_to_physical_map")
        lists = np.ctypeslib.as_array(p, shape=(L * E * w.value,)).reshape(L, E, w.value)
        X = w.value if full else max(int(self.layout.num_valid.max()) if L * E else 1, 1)
        return lists[:, :, :X].copy(), bool(rank.value)

    @property
    def seconds(self):
        return float(_seconds(self._h))

    @property
    def algorithm(self):
        code = int(_algorithm(self._h))
        return _ALGO_NAMES.get(code, code)

    def __repr__(self):
        return "Plan(%s, %r, %.3g s)" % (self.algorithm, self.layout, self.seconds)


def flags(x, name, G, meaning):
    """A [G] array of per-GPU flags as bool: booleans or integers only (a
    string is truthy, so ["0", "1"] marked every GPU), exactly G of them."""
    a = x.detach().cpu().numpy() if A.is_torch(x) else x
    try:
        a = np.asarray(a)
    except (ValueError, TypeError) as e:
        raise ValueError("%s must be [%d] booleans or integers: %s" % (name, G, e)) from None
    if a.dtype.kind == "O" and all(isinstance(v, (bool, np.bool_, int, np.integer))
                                   for v in a.flat):
        a = a.astype(np.int64)
    if a.dtype.kind not in "biu":
        raise TypeError("%s must hold booleans or integers (%s), not dtype %s: %r"
                        % (name, meaning, a.dtype, x))
    if a.shape != (G,):
        raise ValueError("%s must have one entry per EP rank (GPU), %d, got shape %s"
                         % (name, G, a.shape))
    return a != 0


def _check_estimate_param(est, param):
    """epx's planner: estimate_param is recency's half-life (> 0 windows;
    the default estimate is recency) or mean-std's z (>= 0); < 0 = the
    default. The sum and minmax estimates read no parameter, and libepx
    takes a half-life of 0 as the default: both were dropped without a
    word."""
    p = A.real(param, "estimate_param")
    if p != p:
        return  # NaN: libepx names it
    if p >= 0 and est in (ESTIMATES["sum"], ESTIMATES["minmax"]):
        raise ValueError("estimate_param = %g does not apply to estimate %r, which has no "
                         "parameter: it is recency's half-life or mean-std's z; leave it < 0"
                         % (p, _EST_NAMES[est]))
    if p == 0 and est in (ESTIMATES["default"], ESTIMATES["recency"]):
        raise ValueError("estimate_param = 0 is no half-life for the recency estimate: give "
                         "a half-life > 0 windows, or < 0 for the default")


def plan(counts, num_gpus, num_physical_experts=None, num_redundant=None, num_nodes=1,
         algorithm="epx", num_groups=None, node_local="default", cross_node_budget=-1.0,
         estimate="default", estimate_param=-1.0, current=None, max_moves=-1, move_price=0.0,
         failed_gpus=None, sglang_version=None):
    """Plan a placement for loads [L][E] or [S][L][E] (numpy, torch or lists).

    P is num_physical_experts, or E + num_redundant (default E: no redundancy);
    both may be given only when they agree.
    algorithm: "epx" (default), "deepseek", "deepseek-hierarchical" or "auto"
    (SGLang's rule); SGLang's "deepseek-vec", "deepseek-vec-hierarchical" (on
    the windows as steps), "elasticity-aware" and "elasticity-aware-hierarchical"
    (the active ranks: not failed_gpus). current: the Layout in service, to
    price moves (max_moves, move_price). failed_gpus: [G] truthy = lost GPU.
    estimate (epx's planner): "default", "sum", "recency", "mean-std" or
    "minmax"; estimate_param: recency's half-life (> 0) or mean-std's z
    (>= 0), < 0 for the default, refused where it does not apply.
    sglang_version: DeepSeek modes plan as that SGLang release's copy of EPLB
    (None = DeepSeek's original; a newer release than epx verified warns).
    Returns a Plan; raises EpxError with libepx's message on bad input.
    """
    c = CCounts(counts)
    S, L, E = c.shape
    G = A.integer(num_gpus, "num_gpus", 1, A.MAX_GPUS, "EPX_MAX_GPUS")
    R = None if num_redundant is None else A.integer(num_redundant, "num_redundant", 0,
                                                      A.MAX_PHYSICAL, "4 (E + G) slots at most")
    if num_physical_experts is None:
        num_physical_experts = E + (R or 0)
    P = A.integer(num_physical_experts, "num_physical_experts", 1, A.MAX_PHYSICAL,
                  "4 (E + G) slots at most")
    if R is not None and P != E + R:  # one of the two was dropped without a word
        raise ValueError("num_physical_experts = %d and num_redundant = %d disagree: with %d "
                         "experts P = E + num_redundant = %d; pass one of them"
                         % (P, R, E, E + R))
    shape = Shape(L, E, P, G, A.integer(num_nodes, "num_nodes", 1, A.MAX_GPUS, "EPX_MAX_GPUS"))
    fg = None
    if failed_gpus is not None:
        fg = np.ascontiguousarray(flags(failed_gpus, "failed_gpus", G, "nonzero = failed"),
                                  dtype=np.uint8)
    sv = None
    if sglang_version is not None:
        sv = sglang_release(sglang_version, "eplb")[0]  # checked; a newer release warns
    est, algo = _choice(ESTIMATES, estimate, "estimate"), _choice(ALGORITHMS, algorithm,
                                                                  "algorithm")
    if algo == ALGORITHMS["epx"]:  # the others refuse any estimate_param (libepx)
        _check_estimate_param(est, estimate_param)
    o = PlanOpts(PLAN_OPTS_VERSION, algo,
                 0 if num_groups is None else A.integer(num_groups, "num_groups", 0,
                                                         A.MAX_EXPERTS, "EPX_MAX_EXPERTS"),
                 _choice(NODE_LOCAL, node_local, "node_local"),
                 A.real(cross_node_budget, "cross_node_budget"),
                 est, A.real(estimate_param, "estimate_param"),
                 _current(current),
                 A.integer(max_moves, "max_moves", -1),
                 A.real(move_price, "move_price"), A.ptr(fg, c_uint8), LOG_FN(), None, None, None,
                 sv)
    h = c_void_p()
    call(_compute, c.ptr, ctypes.byref(shape), ctypes.byref(o), ctypes.byref(h))
    return Plan(h, _key=PRIVATE)

