"""Dispatch (include/epx/dispatch.h): static dispatch tables (SGLang's, bit for
bit, and epx's load-aware one) and per-token dispatch of topk_ids to slots."""
import ctypes

import numpy as np

from . import _arrays as A
from ._replicas import valid_counts
from ._native import (POINTER, EpxIndexError, EpxZeroDivisionError, Shape, Status, Structure,
                      c_double, c_int, c_int32, c_int64, c_uint32, c_uint64, c_void_p, call, fn,
                      sglang_release)

__all__ = ["sglang_static_table", "static_table", "sglang_rank_lists", "table_gpu_load",
           "dispatch_topk",
           "Balancer", "BalancedSplit", "balanced_split", "balanced_topk", "count_ids",
           "balanced_log2phy_prob",
           "TABLE_ALGORITHMS", "DISPATCH_MODES"]

TABLE_ALGORITHMS = {"sglang": 0, "epx": 1}
DISPATCH_MODES = {"physical": 0, "static": 1, "dynamic": 2, "weighted": 3, "rank_invariant": 4}


class TableOpts(Structure):
    """epx_table_opts (include/epx/dispatch.h)."""
    _fields_ = [("version", c_uint32), ("algorithm", c_int), ("seed", c_uint64),
                ("expected_load", POINTER(c_double)), ("replica_weights", POINTER(c_double)),
                ("sglang_version", ctypes.c_char_p), ("init_by_mapping", c_int32),
                ("progress", c_void_p), ("progress_user", c_void_p),
                ("rank_only", c_int32), ("rank", c_int32)]


class DispatchSpec(Structure):
    """epx_dispatch_spec (include/epx/dispatch.h)."""
    _fields_ = [("mode", c_int), ("num_experts", c_int32), ("num_physical", c_int32),
                ("width", c_int32), ("table", POINTER(c_int32)), ("replicas", POINTER(c_int32)),
                ("num_valid", POINTER(c_int32)), ("thresholds", POINTER(c_uint32)),
                ("seed", c_uint64), ("pass_", c_uint32), ("layer", c_uint32)]


class TokenLayout(Structure):
    """epx_token_layout (include/epx/dispatch.h): addresses of the caller's
    arrays (host or device), every one optional. Used by epx.torch."""
    _fields_ = [("tokens_per_rank", c_void_p), ("tokens_per_slot", c_void_p),
                ("is_token_in_rank", c_void_p), ("rank_offsets", c_void_p),
                ("rank_perm", c_void_p), ("pair_rank_pos", c_void_p),
                ("slot_offsets", c_void_p), ("slot_perm", c_void_p),
                ("pair_slot_pos", c_void_p)]


# The options-struct convention (include/epx.h): version = the struct's size.
TABLE_OPTS_VERSION = ctypes.sizeof(TableOpts)

_table_compute = fn("epx_dispatch_table_compute", c_int32, POINTER(Shape), POINTER(c_int32),
                    c_int32, POINTER(TableOpts), POINTER(c_int32), c_void_p)
_table_from_layout = fn("epx_dispatch_table_from_layout", c_int32, c_void_p,
                        POINTER(TableOpts), POINTER(c_int32), c_void_p)
_lists_compute = fn("epx_dispatch_rank_lists_compute", c_int32, POINTER(Shape), POINTER(c_int32),
                    c_int32, POINTER(TableOpts), c_int32, POINTER(c_int32), POINTER(c_int32),
                    c_void_p)
_lists_from_layout = fn("epx_dispatch_rank_lists_from_layout", c_int32, c_void_p,
                        POINTER(TableOpts), c_int32, POINTER(c_int32), POINTER(c_int32), c_void_p)
_table_gpu_load = fn("epx_dispatch_table_gpu_load", c_int32, POINTER(Shape), POINTER(c_int32),
                     POINTER(c_double), POINTER(c_double), c_void_p)
_thresholds = fn("epx_dispatch_thresholds", c_int32, POINTER(c_int32), POINTER(c_int32), c_int32,
                 c_int32, c_int32, POINTER(c_double), c_int32, POINTER(c_uint32), c_void_p)
_map_ids = fn("epx_dispatch_map_ids", c_int32, POINTER(DispatchSpec), POINTER(c_int32), c_int64,
              c_int32, POINTER(c_int32), c_void_p)


def _opts(algorithm, seed, expected_load, replica_weights, keep, sglang_version=None, s=None):
    """The table options; s: the layout's shape, which the weights must fit."""
    if algorithm not in TABLE_ALGORITHMS:
        raise ValueError("algorithm must be one of %s, not %r"
                         % (", ".join(sorted(TABLE_ALGORITHMS)), algorithm))
    el = rw = None
    if expected_load is not None:
        el = A.as_shaped(expected_load, np.float64,
                         (s["num_layers"], s["num_logical_experts"]), "expected_load", "[L][E]")
        keep.append(el)
    if replica_weights is not None:
        rw = A.as_shaped(replica_weights, np.float64,
                         (s["num_layers"], s["num_physical_experts"]), "replica_weights",
                         "[L][P]")
        keep.append(rw)
    return TableOpts(TABLE_OPTS_VERSION, TABLE_ALGORITHMS[algorithm], A.py_seed(seed),
                     A.ptr(el, c_double), A.ptr(rw, c_double),
                     None if sglang_version is None else
                     sglang_release(sglang_version, "table", stacklevel=5)[0], 0)


def _placement(layout, replica_weights=None, take_weights=False):
    """(Layout, replica_weights) from a Layout or a Plan (its layout; its
    replica weights when take_weights and none were given). Anything else
    is a TypeError naming it (it failed later on a missing attribute)."""
    from .layout import Layout
    from .planner import Plan
    if isinstance(layout, Plan):
        if replica_weights is None and take_weights:
            replica_weights = layout.replica_weights
        return layout.layout, replica_weights
    if not isinstance(layout, Layout):
        raise TypeError("layout must be an epx.Layout or an epx.Plan, not %s"
                        % type(layout).__name__)
    return layout, replica_weights


def _check_holds(p2l, slots, name, layers, experts, index=lambda i: i):
    """Refuse a slot that does not hold the expert it is listed for: C reads
    the replica lists and tables as they are, so such a slot routed the
    expert's tokens to another expert. p2l: the layout's [L][P]; slots: the
    array (any shape); layers, experts: arrays broadcasting to slots' shape
    that give each entry's layer and expert; index(i): the position of entry
    i in the caller's array, for the message. Slots outside [0, P) (and -1
    padding) are left to the range checks."""
    P = p2l.shape[1]
    inside = (slots >= 0) & (slots < P)
    held = p2l[layers, np.where(inside, slots, 0)]
    bad = np.argwhere(inside & (held != experts))
    if len(bad):
        i = tuple(int(v) for v in bad[0])
        l = int(np.broadcast_to(layers, slots.shape)[i])
        e = int(np.broadcast_to(experts, slots.shape)[i])
        slot = int(slots[i])
        raise ValueError("%s%s = %d gives [layer %d][expert %d] slot %d, but slot %d holds "
                         "expert %d in the layout (its tokens would reach the wrong expert): "
                         "use lists and tables made from this layout"
                         % (name, "".join("[%d]" % v for v in index(i)), slot, l, e, slot, slot,
                            int(p2l[l, slot])))


_WIDE = (-2 ** 63, 2 ** 63 - 1)


def sglang_static_table(logical_to_all_physical_map, num_gpus, num_physical_experts, ep_rank,
                        seed=42, sglang_version="0.5.2", num_nodes=1):
    """SGLang's compute_logical_to_rank_dispatch_physical_map: [L][E] for
    ep_rank ([G][L][E] when ep_rank is None), the replica order of the input
    map deciding the choices as in SGLang. Output dtype follows the input's;
    a torch input gives a tensor on its device. The rule is that of SGLang
    release sglang_version (default 0.5.2, whose call shape this is; from
    0.5.3 on num_nodes counts); the lists are used as given (SGLang's
    per-rank cut of init_by_mapping happens before this function)."""
    src = logical_to_all_physical_map
    torch_in = A.is_torch(src)
    dtype = src.dtype if hasattr(src, "dtype") else np.int64
    # Refused as the class SGLang's own code raises there (EpxZeroDivisionError
    # and EpxIndexError are ValueErrors too), in its order: the GPU count it
    # divides by, the map's shape, an expert with no replica to choose from,
    # then the rows it indexes (no layer, a rank past the last).
    G = A.integer(num_gpus, "num_gpus", *_WIDE)
    if G == 0:
        raise EpxZeroDivisionError(Status.INVALID_ARG, "num_gpus = 0 is outside [1, %d] "
                                   "(EPX_MAX_GPUS)" % A.MAX_GPUS)
    G = A.integer(G, "num_gpus", 1, A.MAX_GPUS, "EPX_MAX_GPUS")
    m = A.as_array(src, np.int32, 3, "logical_to_all_physical_map")
    L, E, W = m.shape
    empty = np.argwhere(~(m != -1).any(axis=2))
    if len(empty):
        layer, e = (int(v) for v in empty[0])
        raise EpxZeroDivisionError(Status.INVALID_MAP, "logical expert %d of layer %d has no "
                                   "replica: every expert needs at least one slot" % (e, layer))
    if L == 0:
        raise EpxIndexError(Status.SHAPE, "logical_to_all_physical_map has no layer (shape "
                            "%s): there is no table to take a rank's rows from" % list(m.shape))
    shape = Shape(L, E, A.integer(num_physical_experts, "num_physical_experts", 1,
                                  A.MAX_PHYSICAL, "4 (E + G) slots at most"), G,
                  A.integer(num_nodes, "num_nodes", 1, A.MAX_GPUS, "EPX_MAX_GPUS"))
    if ep_rank is not None:  # a rank, not a Python index: -1 is not rank G - 1
        r = A.integer(ep_rank, "ep_rank", *_WIDE)
        if r >= G:  # SGLang indexes its [G] tables past the last
            raise EpxIndexError(Status.INVALID_ARG, "ep_rank = %d is outside [0, %d] "
                                "(num_gpus - 1)" % (r, G - 1))
        ep_rank = A.integer(r, "ep_rank", 0, G - 1, "num_gpus - 1")
    out = np.empty((G, L, E), dtype=np.int32)
    opts = TableOpts(TABLE_OPTS_VERSION, TABLE_ALGORITHMS["sglang"], A.py_seed(seed), None, None,
                     sglang_release(sglang_version, "table")[0], 0)
    call(_table_compute, ctypes.byref(shape), A.ptr(m, c_int32), W, ctypes.byref(opts),
         A.ptr(out, c_int32))
    res = out if ep_rank is None else out[ep_rank]
    if torch_in:
        t = A.wrap(np.ascontiguousarray(res, dtype=np.int64), True, src.device)
        return t.to(dtype)
    return np.ascontiguousarray(res, dtype=dtype)


def static_table(layout, algorithm="sglang", seed=None, expected_load=None, replica_weights=None,
                 replicas=None, sglang_version=None):
    """Static dispatch tables [G][L][E] int64 for a Layout (or a Plan).

    sglang_version: the SGLang release whose rule "sglang" follows (None =
    the library's default, EPX_SGLANG_DEFAULT_VERSION, 0.5.23); from a layout
    the lists are init_by_mapping's, cut per rank from 0.5.4.post2 on.

    algorithm="sglang": SGLang's table from the layout's ascending replica map
    (what init_by_mapping / init_trivial build), or from `replicas` [L][E][X]
    in the order given (init_by_eplb passes DeepSeek's replica-rank order).
    algorithm="epx": deterministic, same GPU, then same node, then the
    replica whose GPU is furthest below its expected load (expected_load
    [L][E], replica_weights [L][P]; a Plan supplies its replica weights).
    seed (default 42, SGLang's) and sglang_version are "sglang"'s only, the
    loads and weights "epx"'s only: either given to the other is refused."""
    if algorithm == "epx":  # deterministic, no release rule: neither would be read
        for arg, value in (("seed", seed), ("sglang_version", sglang_version)):
            if value is not None:
                raise ValueError("%s=%r is for algorithm='sglang' only: the 'epx' table draws "
                                 "nothing and follows no SGLang release; drop it"
                                 % (arg, value))
    if seed is None:
        seed = 42
    layout, replica_weights = _placement(layout, replica_weights, algorithm == "epx")
    keep = []
    s = layout.shape
    opts = _opts(algorithm, seed, expected_load, replica_weights, keep, sglang_version, s)
    out = np.empty((s["num_gpus"], s["num_layers"], s["num_logical_experts"]), dtype=np.int32)
    if replicas is None:
        call(_table_from_layout, layout.handle, ctypes.byref(opts), A.ptr(out, c_int32))
    else:
        m = A.as_shaped(replicas, np.int32, (s["num_layers"], s["num_logical_experts"], None),
                        "replicas", "[L][E][X]")
        _check_lists(layout, m, "replicas")
        shape = Shape(*[s[f] for f, _ in Shape._fields_])
        call(_table_compute, ctypes.byref(shape), A.ptr(m, c_int32), m.shape[2],
             ctypes.byref(opts), A.ptr(out, c_int32))
    return out.astype(np.int64)


def sglang_rank_lists(layout, sglang_version=None, replicas=None, width=None):
    """The replica lists SGLang keeps on each rank [G][L][E][X] int64, -1
    padded: ExpertLocationMetadata.logical_to_all_physical_map of rank r at
    [r], the lists that rank's static table (static_table) is computed from
    and its dynamic dispatch draws from.

    From a Layout (or a Plan) the lists are init_by_mapping's: ascending, and
    from SGLang 0.5.4.post2 on cut on rank r to the one replica nearest r
    (a lone replica, else the first on r's GPU, else the first on its node)
    where there is one. With `replicas` [L][E][X] (DeepSeek's replica-rank
    lists, as init_by_eplb passes them) no release cuts: every rank holds
    them as given, -1 entries dropped. sglang_version: the release (None =
    the library's default, EPX_SGLANG_DEFAULT_VERSION). width: the columns of
    the result; None = the widest list of any rank, the number of physical
    slots P gives SGLang's own padding (its tensors are P wide, the most
    taken); a width below the widest list raises EpxError naming both. As a rank with an all-to-all
    backend and ep_join_mode "normal" computes them (libepx's
    epx_dispatch_rank_lists_compute)."""
    layout = _placement(layout)[0]
    keep = []
    opts = _opts("sglang", 42, None, None, keep, sglang_version)
    s = layout.shape
    need = c_int32(0)
    if replicas is None:
        args = (layout.handle, ctypes.byref(opts))
        run = _lists_from_layout
    else:
        m = A.as_shaped(replicas, np.int32, (s["num_layers"], s["num_logical_experts"], None),
                        "replicas", "[L][E][X]")
        _check_lists(layout, m, "replicas")
        shape = Shape(*[s[f] for f, _ in Shape._fields_])
        args = (ctypes.byref(shape), A.ptr(m, c_int32), m.shape[2], ctypes.byref(opts))
        run = _lists_compute
    call(run, *args, 0, None, ctypes.byref(need))
    P = s["num_physical_experts"]
    X = need.value if width is None else \
        A.integer(width, "width", 1, max(P, need.value), "num_physical_experts, SGLang's padding")
    out = np.empty((s["num_gpus"], s["num_layers"], s["num_logical_experts"], X), dtype=np.int32)
    call(run, *args, X, A.ptr(out, c_int32), None)
    return out.astype(np.int64)


def table_gpu_load(layout, table, load):
    """Tokens each GPU receives [L][G] under static tables [G][L][E] when every
    rank sends 1/G of each expert's load [L][E]. layout: a Layout or a Plan."""
    layout = _placement(layout)[0]
    s = layout.shape
    shape = Shape(*[s[f] for f, _ in Shape._fields_])
    L, E = s["num_layers"], s["num_logical_experts"]
    t = A.as_shaped(table, np.int32, (s["num_gpus"], L, E), "table", "[G][L][E]")
    w = A.as_shaped(load, np.float64, (L, E), "load", "[L][E]")
    _check_holds(layout.physical_to_logical_map, t, "table", np.arange(L)[None, :, None],
                 np.arange(E)[None, None, :])
    out = np.empty((s["num_layers"], s["num_gpus"]), dtype=np.float64)
    call(_table_gpu_load, ctypes.byref(shape), A.ptr(t, c_int32), A.ptr(w, c_double),
         A.ptr(out, c_double))
    return out


def dispatch_topk(topk_ids, layout, layer, mode="dynamic", table=None, replica_weights=None,
                  seed=0, pass_id=0, ep_rank=None, replicas=None):
    """Map one layer's logical topk_ids [T][K] to physical slots [T][K] (int64,
    -1 stays -1) under a Layout or a Plan (its layout): "static" takes `table`
    [G][L][E] row ep_rank; "dynamic" picks uniformly over the replicas;
    "weighted" by replica_weights [L][P] (a Plan's own by default);
    "balanced" splits this batch exactly (balanced_topk). Choices
    are keyed by (seed, pass_id, layer, token, k), as the CUDA kernels' are;
    pass_id, a pass counter in [0, 2^64), is keyed modulo 2^32 as the C
    spec's uint32 pass word (pass 2^32 draws as pass 0).
    table= and ep_rank= (default 0) are for "static" only, replica_weights=
    for "weighted" only, replicas= for "rank_invariant" only: given to
    another mode, which would not read them, they are refused.
    "rank_invariant" is SGLang 0.5.23's dynamic rule without an all-to-all
    backend: token row t takes replica t % num_valid of the expert's list,
    no draw. Its lists are the layout's ascending ones (init_by_mapping), or
    `replicas` [L][E][X] when given (DeepSeek's logical_to_physical_map, as
    init_by_eplb passes it; -1 padding at the tail of each list)."""
    if mode != "balanced" and mode not in DISPATCH_MODES:
        raise ValueError("mode must be one of %s, got %r"
                         % (", ".join(list(DISPATCH_MODES) + ["balanced"]), mode))
    # an argument the mode does not read is refused, not dropped
    for arg, value, owner in (("table", table, "static"), ("ep_rank", ep_rank, "static"),
                              ("replica_weights", replica_weights, "weighted"),
                              ("replicas", replicas, "rank_invariant")):
        if value is not None and mode != owner:
            raise ValueError("%s= is for mode=%r only, not %r, which does not read it: drop it "
                             "or use mode=%r" % (arg, owner, mode, owner))
    layout, replica_weights = _placement(layout, replica_weights, mode == "weighted")
    if mode == "balanced":
        return balanced_topk(topk_ids, layout, layer)[0]
    torch_in = A.is_torch(topk_ids)
    ids = A.as_array(topk_ids, np.int32, 2, "topk_ids")
    T, K = ids.shape
    s = layout.shape
    L, E, P = s["num_layers"], s["num_logical_experts"], s["num_physical_experts"]
    layer = A.integer(layer, "layer", 0, L - 1, "num_layers - 1")
    keep = []
    spec = DispatchSpec(DISPATCH_MODES[mode], E, P, 1, None, None, None, None,
                        A.integer(seed, "seed", 0, 2 ** 64 - 1, "a uint64"),
                        A.integer(pass_id, "pass_id", 0, 2 ** 64 - 1) & 0xFFFFFFFF, layer)
    if mode == "static":
        if table is None:
            raise ValueError("mode='static' needs table [G][L][E] (epx.dispatch.static_table)")
        tab = A.as_shaped(table, np.int32, (None, L, E), "table", "[G][L][E]")
        rank = A.integer(0 if ep_rank is None else ep_rank, "ep_rank", 0, tab.shape[0] - 1,
                         "the table's ranks - 1")
        row = np.ascontiguousarray(tab[rank, layer])
        _check_holds(layout.physical_to_logical_map, row, "table", layer, np.arange(E),
                     lambda i: (rank, layer) + i)
        keep.append(row)
        spec.table = A.ptr(row, c_int32)
    elif mode in ("dynamic", "weighted", "rank_invariant"):
        if replicas is None:
            W = layout.max_replicas
            reps = np.ascontiguousarray(layout.logical_to_all_physical_map(W), dtype=np.int32)
            nv = np.ascontiguousarray(layout.num_valid, dtype=np.int32)
        else:
            reps, nv = _replica_lists(replicas, L, E, P)
            _check_lists(layout, reps, "replicas")
            W = reps.shape[2]
        keep += [reps, nv]
        spec.width = W
        r_layer = np.ascontiguousarray(reps[layer])
        n_layer = np.ascontiguousarray(nv[layer])
        keep += [r_layer, n_layer]
        spec.replicas = A.ptr(r_layer, c_int32)
        spec.num_valid = A.ptr(n_layer, c_int32)
        if mode == "weighted":
            if replica_weights is None:
                raise ValueError("mode='weighted' needs replica_weights [L][P], or a Plan "
                                 "(its replica_weights) for the layout")
            w = A.as_shaped(replica_weights, np.float64, (L, P), "replica_weights", "[L][P]")
            th = np.empty((L, E, W), dtype=np.uint32)
            call(_thresholds, A.ptr(reps, c_int32), A.ptr(nv, c_int32), L, E, W,
                 A.ptr(w, c_double), P, A.ptr(th, c_uint32))
            t_layer = np.ascontiguousarray(th[layer])
            keep.append(t_layer)
            spec.thresholds = A.ptr(t_layer, c_uint32)
    elif mode != "physical":
        raise ValueError("mode must be one of %s, got %r" % (", ".join(DISPATCH_MODES), mode))
    out = np.empty((T, K), dtype=np.int32)
    call(_map_ids, ctypes.byref(spec), A.ptr(ids, c_int32), T, K, A.ptr(out, c_int32))
    return A.wrap(out.astype(np.int64), torch_in, topk_ids.device if torch_in else None)


def _check_lists(layout, reps, name):
    """Replica lists [L][E][X] must list only slots of their own expert."""
    L, E = reps.shape[:2]
    _check_holds(layout.physical_to_logical_map, reps, name, np.arange(L)[:, None, None],
                 np.arange(E)[None, :, None])


def _replica_lists(replicas, L, E, P):
    """[L][E][X] lists with -1 padding at each tail, and their lengths."""
    reps = np.ascontiguousarray(A.as_array(replicas, np.int32, 3, "replicas"))
    if reps.shape[0] != L or reps.shape[1] != E or reps.shape[2] < 1:
        raise ValueError("replicas is %s; the layout needs [%d][%d][X] with X >= 1"
                         % (list(reps.shape), L, E))
    return reps, valid_counts(reps, P)


# ---- balanced per-batch dispatch (epx/dispatch.h part 4; _balanced.py) ----
from ._balanced import (BalancedOut, Balancer, BalancedSplit, balanced_split,  # noqa: E402
                        balanced_topk, count_ids)
from ._lp import balanced_log2phy_prob  # noqa: E402  (SGLang's LP form)
