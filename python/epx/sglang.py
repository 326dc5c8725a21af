"""Drop-ins for SGLang's EPLB entry points, with the same signatures and return
values, computed by libepx.

  rebalance_experts(...)             sglang.srt.eplb.eplb_algorithms.deepseek
  rebalance_experts_from_windows(...) sglang.srt.eplb.eplb_algorithms.rebalance_experts
  compute_logical_to_rank_dispatch_physical_map(...)
                                     sglang.srt.eplb.expert_location, in each
                                     release's call shape (dispatch_map_for(V))
  compute_logical_to_all_physical_map(...)   (its _compute_logical_to_all_physical_map)
  load_init_expert_location(spec)    the data_dict of compute_initial_expert_location_metadata
  LPLBSolver(phy2log, log2phy, num_gpus, ep_group)
                                     sglang.srt.eplb.lplb_solver (0.5.23, --ep-dispatch-algorithm
                                     lp): solve(topk_ids) -> log2phy_prob, the LP's exact optimum

Arrays come back as numpy unless a torch tensor went in (or as_torch=True):
then as CPU torch tensors, as the reference returns them.
"""
import numpy as np

from . import _arrays as A
from . import planner as _plan
from ._lp import LPLBSolver
from ._native import (EpxAssertionError, EpxAssertionValueError, EpxError, EpxIndexError,
                      EpxNotImplementedError, EpxZeroDivisionError, Status, as_assertion,
                      sglang_release)
from .dispatch import sglang_rank_lists
from .io import read_counts, read_mapping
from .layout import Layout

__all__ = ["rebalance_experts", "rebalance_experts_from_windows",
           "compute_logical_to_rank_dispatch_physical_map", "dispatch_map_for",
           "compute_logical_to_all_physical_map",
           "load_init_expert_location", "LPLBSolver"]


def _check_width(width):
    if width not in ("max", "full"):
        raise ValueError("log2phy_width must be 'max' (SGLang) or 'full' (P - E + 1, vLLM), "
                         "got %r" % (width,))


def _trim_log2phy(l2p, cnt, width):
    """Cut or keep the replica columns: "max" = the largest count over the whole
    tensor (SGLang's and DeepSeek's current EPLB), "full" = P - E + 1 (vLLM)."""
    _check_width(width)
    if width == "full":
        return l2p
    x = int(cnt.max()) if cnt.size else 1
    return l2p[:, :, :x]


def _epx_triple(weight, num_replicas, num_groups, num_nodes, num_gpus, enable_hierarchical,
                log2phy_width, **plan_kw):
    """epx's own planner, returned in the reference's triple: replicas of an
    expert in ascending slot order (epx has no replica ranks). The replica
    lists come at the width asked for ("max": the largest count, what
    _trim_log2phy would cut P - E + 1 columns down to)."""
    plan_kw.setdefault("node_local", "default" if enable_hierarchical else "off")
    p = _plan.plan(weight, num_gpus=num_gpus, num_physical_experts=num_replicas,
                   num_nodes=num_nodes if enable_hierarchical else 1,
                   algorithm="epx", num_groups=num_groups, **plan_kw)
    lay = p.layout
    p2l = lay.physical_to_logical_map
    E, P = lay.num_logical_experts, lay.num_physical_experts
    cnt = lay.num_valid
    width = max(int(cnt.max()) if cnt.size else 1, 1) if log2phy_width == "max" else P - E + 1
    l2p = lay.logical_to_all_physical_map(width=max(width, 1))
    return p2l, l2p, cnt


_WIDE = (-2 ** 63, 2 ** 63 - 1)


def _deepseek_checks(weight, num_replicas, num_groups, num_nodes, num_gpus, hierarchical):
    """What SGLang's copy of DeepSeek's EPLB refuses before it plans, in its
    order and as the class its code raises there (an engine test's
    pytest.raises catches epx's): a missing group or node count (None) is
    a TypeError, a zero one divided by an EpxZeroDivisionError, a shape it
    asserts on an EpxAssertionError, a weight of no layer (after those)
    an EpxIndexError. The global policy reads neither groups nor nodes.
    Returns (num_groups, num_nodes) for the call: 1 and 1 when global."""
    shape = getattr(weight, "shape", None)
    if shape is None or len(shape) != 2:
        return num_groups, num_nodes  # as_array names the shape
    L, E = (int(v) for v in shape)
    names = ("num_groups", "num_nodes") if hierarchical else ()
    ints = [A.integer(v, n, *_WIDE, "an integer") for v, n in zip((num_groups, num_nodes), names)]
    groups, nodes = ints if hierarchical else (1, 1)
    G = A.integer(num_gpus, "num_gpus", *_WIDE, "an integer")
    P = A.integer(num_replicas, "num_replicas", *_WIDE, "an integer")

    def zero(name, what):
        return EpxZeroDivisionError(Status.INVALID_ARG, "%s = 0: %s" % (name, what))

    def asserts(message):
        """A shape SGLang asserts on: libepx refuses it as EpxAssertionError in
        its own words where every count is one it takes; else this message."""
        if min(P, G, groups, nodes) >= 1:
            return True
        raise EpxAssertionError(Status.SHAPE, message)

    if hierarchical:
        if groups == 0:
            raise zero("num_groups", "the hierarchical policy splits the experts into groups "
                       "(pass the model's n_group, DeepSeek-V3: 8)")
        if E % groups:
            asserts("%d experts are not a multiple of num_groups (%d)" % (E, groups))
            return groups, nodes
        if nodes == 0:
            raise zero("num_nodes", "the hierarchical policy packs the groups onto nodes")
        if groups % nodes or G % nodes:
            asserts("num_groups (%d) and num_gpus (%d) must be multiples of num_nodes (%d)"
                    % (groups, G, nodes))
            return groups, nodes
    if G == 0:
        raise zero("num_gpus", "the slots are spread over the GPUs")
    if P % G or P < E:
        asserts("num_replicas (%d) must be a multiple of num_gpus (%d) and at least the %d "
                "experts" % (P, G, E))
        return groups, nodes
    if L == 0 and P > 0 and G > 0 and nodes > 0:
        raise EpxIndexError(Status.SHAPE, "weight has no layer (shape [0, %d]): there is "
                            "nothing to place" % E)
    return groups, nodes


def rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus,
                      enable_hierarchical, *, algorithm="deepseek", log2phy_width="max",
                      as_torch=None, sglang_version=None, **plan_kw):
    """SGLang's deepseek.rebalance_experts, exactly.

    weight [layers, num_logical_experts] (numpy, torch or lists; used as float32,
    as the reference's weight.float()). Returns
      physical_to_logical_map [layers, num_replicas] int64,
      logical_to_physical_map [layers, num_logical_experts, X] int64: the slots of
          each expert in replica-rank order, padded with -1; X = the largest
          replica count over all layers (log2phy_width="full": P - E + 1),
      logical_count [layers, num_logical_experts] int64.
    enable_hierarchical=False is the global policy (groups and nodes ignored).
    sglang_version: the SGLang release whose copy to follow, ties included
    (float64 pack sums from 0.5.11; tied loads in torch's sort order); None =
    DeepSeek's original with ties to the lowest index.
    algorithm="epx" runs epx's own planner instead (extra keywords go to
    epx.plan(...)); its replicas are listed in ascending slot order.
    A shape SGLang's copy asserts on raises epx.EpxAssertionError (an
    EpxError and an AssertionError) with libepx's sentence.
    """
    torch_out = A.want_torch(as_torch, weight)
    if algorithm == "deepseek":
        if plan_kw:
            raise TypeError("unexpected keywords for algorithm='deepseek': %s"
                            % ", ".join(sorted(plan_kw)))
        num_groups, num_nodes = _deepseek_checks(weight, num_replicas, num_groups, num_nodes,
                                                 num_gpus, enable_hierarchical)
        with as_assertion():  # SGLang's copy asserts on these shapes
            p2l, l2p, cnt = _plan.deepseek(weight, num_replicas, num_groups, num_nodes,
                                           num_gpus, enable_hierarchical,
                                           sglang_version=sglang_version)
    elif algorithm == "epx":
        if sglang_version is not None:
            raise ValueError("sglang_version=%r applies to algorithm='deepseek' (SGLang's copy "
                             "of EPLB), not to epx's planner: drop it or use "
                             "algorithm='deepseek'" % (sglang_version,))
        _check_width(log2phy_width)  # before any work
        p2l, l2p, cnt = _epx_triple(weight, num_replicas, num_groups, num_nodes, num_gpus,
                                    enable_hierarchical, log2phy_width, **plan_kw)
    else:
        raise ValueError("algorithm must be 'deepseek' or 'epx', got %r" % (algorithm,))
    l2p = _trim_log2phy(l2p, cnt, log2phy_width)
    out = tuple(np.ascontiguousarray(a, dtype=np.int64) for a in (p2l, l2p, cnt))
    return tuple(A.wrap(a, torch_out) for a in out)


def _algorithm_name(algorithm):
    name = getattr(algorithm, "name", algorithm)  # an EplbAlgorithm member, or a string
    return str(name).lower().replace("-", "_")


_SGLANG_ONLY = ("deepseek_vec", "deepseek_vec_hierarchical", "elasticity_aware",
                "elasticity_aware_hierarchical")


def _sglang_only(t, P, num_gpus, num_groups, num_nodes, name, active_ranks, sglang_version,
                 torch_out):
    """deepseek_vec(_hierarchical) and elasticity_aware(_hierarchical), as
    release sglang_version (None: the newest verified) runs them."""
    failed = None
    if name.startswith("elasticity"):
        if active_ranks is not None:
            failed = ~_plan.flags(active_ranks, "active_ranks", num_gpus, "nonzero = active")
    elif active_ranks is not None:
        raise ValueError("active_ranks applies to the elasticity_aware algorithms, not to %r"
                         % (name,))
    with as_assertion():  # where SGLang's code asserts
        p = _plan.plan(t, num_gpus=num_gpus, num_physical_experts=P, num_nodes=num_nodes,
                       algorithm=name, num_groups=num_groups, failed_gpus=failed,
                       sglang_version=sglang_version)
    lists = p.replica_lists
    cnt = (lists >= 0).sum(axis=2)
    if name.startswith("elasticity"):  # the largest count wide, as the release
        lists = lists[:, :, :max(int(cnt.max()), 1)]
    out = (p.physical_to_logical_map, lists, cnt)
    return tuple(A.wrap(np.ascontiguousarray(a, dtype=d), torch_out)
                 for a, d in zip(out, _SGLANG_ONLY_DTYPES[name]))


# The release's output dtypes: deepseek_vec builds torch.int (int32) tensors,
# its hierarchical form gathers the slots' experts through an int64 map;
# elasticity_aware is DeepSeek's code (int64).
_SGLANG_ONLY_DTYPES = {
    "deepseek_vec": (np.int32, np.int32, np.int32),
    "deepseek_vec_hierarchical": (np.int64, np.int32, np.int32),
    "elasticity_aware": (np.int64, np.int64, np.int64),
    "elasticity_aware_hierarchical": (np.int64, np.int64, np.int64),
}


def _window_sum(tokens_per_expert):
    """SGLang's weight for the deepseek algorithms, tokens_per_expert.sum(dim=0),
    in the input's own dtype: float32 windows summed in float64 rounded
    differently and could change the plan. A tensor is summed by torch
    itself (SGLang's exact arithmetic); a numpy array or list, which SGLang
    does not take, by numpy as torch sums: floats in their dtype, integers
    of any width in int64 (uint8 windows of 128 summed to 0 in uint8)."""
    if A.is_torch(tokens_per_expert):
        if tokens_per_expert.dim() != 3:
            raise ValueError("tokens_per_expert must have 3 dimensions [S][L][E], got shape %s"
                             % list(tokens_per_expert.shape))
        A.as_array(tokens_per_expert[:0], np.float64, 3, "tokens_per_expert")  # dtype check
        return tokens_per_expert.sum(dim=0)
    src = np.asarray(tokens_per_expert) if isinstance(tokens_per_expert, np.ndarray) else None
    dtype = src.dtype if src is not None and src.dtype.kind in "iuf" else np.float64
    t = A.as_array(tokens_per_expert, dtype, 3, "tokens_per_expert")
    return t.sum(axis=0, dtype=np.int64 if t.dtype.kind in "iu" else t.dtype)


def rebalance_experts_from_windows(tokens_per_expert, num_physical_experts,
                                   num_local_physical_experts, num_groups, num_nodes,
                                   algorithm, *, as_torch=None, sglang_version=None,
                                   active_ranks=None, **plan_kw):
    """SGLang's eplb_algorithms.rebalance_experts: tokens_per_expert [S][L][E]
    (windows), algorithm an EplbAlgorithm member or its name. "deepseek" and
    "deepseek_hierarchical" sum the windows in their dtype (torch's own sum
    for a tensor, as SGLang's tokens_per_expert.sum(dim=0)) and run DeepSeek
    EPLB exactly, as release sglang_version's copy does (None = DeepSeek's
    original); "epx"
    hands all windows to epx's planner (it estimates from them).
    SGLang 0.5.23's others, exactly as that release runs them on the CPU
    (sglang_version None = the newest verified): "deepseek_vec" and
    "deepseek_vec_hierarchical" plan on the windows as steps (the replica
    lists P - E + 1 wide, as theirs); "elasticity_aware" and
    "elasticity_aware_hierarchical" over active_ranks ([ep_size], nonzero =
    active; None = all, as ElasticEPStateManager.healthy_rank_state), where
    the release reads ElasticEPStateManager; a failed rank's slots hold
    expert 0 and are in no list, as there."""
    name = _algorithm_name(algorithm)
    if name not in ("deepseek", "deepseek_hierarchical", "epx", "epx_hierarchical") \
            and name not in _SGLANG_ONLY:  # SGLang's dispatcher raises first
        raise EpxNotImplementedError(
            Status.UNSUPPORTED, "EPLB algorithm %r is not served by epx: use deepseek, "
            "deepseek_hierarchical, deepseek_vec, deepseek_vec_hierarchical, "
            "elasticity_aware, elasticity_aware_hierarchical or epx" % (name,))
    P = A.integer(num_physical_experts, "num_physical_experts", 1, A.MAX_PHYSICAL,
                  "4 (E + G) slots at most")
    local = A.integer(num_local_physical_experts, "num_local_physical_experts", *_WIDE,
                      "an integer")
    if not 1 <= local <= P:
        msg = ("num_local_physical_experts = %d is outside [1, %d] (num_physical_experts)"
               % (local, P))
        if local < 0:
            raise ValueError(msg)
        # SGLang divides by local, then by P // local (0 GPUs when local > P)
        raise EpxZeroDivisionError(Status.INVALID_ARG, msg)
    if P % local:  # SGLang's P % (P // local) asserts, or plans other GPUs than given
        raise EpxAssertionValueError(Status.SHAPE, "num_physical_experts (%d) is not a multiple "
                                     "of num_local_physical_experts (%d): every GPU holds as "
                                     "many slots" % (P, local))
    num_gpus = P // local
    torch_out = A.want_torch(as_torch, tokens_per_expert)
    if name in ("deepseek", "deepseek_hierarchical"):
        # neither takes these: they were dropped without a word
        if active_ranks is not None:
            raise ValueError("active_ranks applies to the elasticity_aware algorithms, not to %r"
                             % (name,))
        if plan_kw:
            raise TypeError("unexpected keywords for algorithm %r: %s"
                            % (name, ", ".join(sorted(plan_kw))))
        return rebalance_experts(_window_sum(tokens_per_expert), num_physical_experts,
                                 num_groups, num_nodes,
                                 num_gpus, name == "deepseek_hierarchical", as_torch=torch_out,
                                 sglang_version=sglang_version)
    if name in _SGLANG_ONLY:
        if plan_kw:
            raise TypeError("unexpected keywords for algorithm %r: %s"
                            % (name, ", ".join(sorted(plan_kw))))
        t = A.as_array(tokens_per_expert, np.float64, 3, "tokens_per_expert")
        return _sglang_only(t, P, num_gpus, num_groups, num_nodes, name, active_ranks,
                            sglang_version, torch_out)
    if active_ranks is not None:
        raise ValueError("active_ranks applies to the elasticity_aware algorithms, not to %r"
                         % (name,))
    if name in ("epx", "epx_hierarchical"):
        if sglang_version is not None:
            raise ValueError("sglang_version=%r applies to the deepseek algorithms, not to "
                             "epx's planner" % (sglang_version,))
        t = A.as_array(tokens_per_expert, np.float64, 3, "tokens_per_expert")
        p2l, l2p, cnt = _epx_triple(t, num_physical_experts, num_groups, num_nodes, num_gpus,
                                    True, "max", **plan_kw)
        return tuple(A.wrap(np.ascontiguousarray(a, dtype=np.int64), torch_out)
                     for a in (p2l, l2p, cnt))
    raise AssertionError("unreachable: %r was checked above" % (name,))


def _floating(x):
    """True for a tensor or array (or lists) of floating-point values."""
    if A.is_torch(x):
        return x.is_floating_point()
    try:
        a = np.asarray(x)
    except (ValueError, TypeError):
        return False  # ragged lists: as_array names them
    return a.size > 0 and a.dtype.kind == "f"


def compute_logical_to_all_physical_map(physical_to_logical_map, num_logical_experts,
                                        ep_size=None, moe_ep_rank=None, *, as_torch=None,
                                        a2a_backend=None, nnodes=None):
    """SGLang's _compute_logical_to_all_physical_map: [L][E][X] int64, the
    slots of each expert ascending, -1 padded to X = the largest replica
    count. In 0.5.23's call shape (p2l, E, ep_size, moe_ep_rank) with a rank,
    and an all-to-all backend other than "none", rank moe_ep_rank's lists are
    cut as that release cuts them: an expert with a replica on the rank's
    GPU, else on its node, keeps that one alone (epx.sglang_rank_lists' rule,
    checked against SGLang's goldens). The backend and the node count are
    read from SGLang's runtime context, as there (a2a_backend= and nnodes=
    give them outside SGLang); without a rank, or with backend "none", no
    list is cut. An
    expert with no slot (num_logical_experts above the ids present) is a
    row of -1, as there. A tensor gives a tensor on its device, as SGLang's.
    Errors as SGLang's (each an instance of the class SGLang's code raises):
    an id >= num_logical_experts (any id when it is 0) is an
    EpxIndexError, a float map a TypeError, no layer (or neither slot nor
    expert) a ValueError; a negative id, which SGLang's list indexing would
    file under expert E + id, is an EpxIndexError too."""
    torch_in = A.is_torch(physical_to_logical_map)
    torch_out = A.want_torch(as_torch, physical_to_logical_map)
    if _floating(physical_to_logical_map):
        raise TypeError("physical_to_logical_map holds floats (dtype %s): expert ids are "
                        "integers (SGLang indexes a list with them)"
                        % (getattr(physical_to_logical_map, "dtype", None)
                           or np.asarray(physical_to_logical_map).dtype,))
    m = A.as_array(physical_to_logical_map, np.int64, 2, "physical_to_logical_map")
    E = A.integer(num_logical_experts, "num_logical_experts", 0, A.MAX_EXPERTS,
                  "EPX_MAX_EXPERTS")
    L, P = m.shape
    if L < 1 or (E == 0 and P == 0):
        raise ValueError("physical_to_logical_map has no %s (shape %s): SGLang's max() of "
                         "no lists fails" % ("layer" if L < 1 else "slot and no expert",
                                             list(m.shape)))
    bad = np.argwhere((m < 0) | (m >= E))
    if len(bad):
        l, p = (int(v) for v in bad[0])
        raise EpxIndexError(Status.INVALID_MAP, "physical_to_logical_map[%d][%d] = %d is "
                            "outside [0, %d) (num_logical_experts): no expert holds that slot"
                            % (l, p, int(m[l, p]), E))
    order = np.argsort(m, axis=1, kind="stable")  # slots grouped by expert, ascending
    ids = np.take_along_axis(m, order, axis=1)
    counts = np.zeros((L, E), dtype=np.int64)
    np.add.at(counts, (np.repeat(np.arange(L), P), m.ravel()), 1)
    X = int(counts.max())
    out = np.full((L, E, X), -1, dtype=np.int64)
    # the j-th slot of expert e is at sorted position start[e] + j
    start = np.cumsum(counts, axis=1) - counts
    rank = np.arange(P)[None, :] - np.take_along_axis(start, ids, axis=1)
    out[np.repeat(np.arange(L), P), ids.ravel(), rank.ravel()] = order.ravel()
    device = physical_to_logical_map.device if torch_in else None
    if moe_ep_rank is not None and _cuts_lists(a2a_backend):
        out = _rank_cut(m, E, ep_size, moe_ep_rank, nnodes)
    return A.wrap(out, torch_out, device)


def _cuts_lists(a2a_backend):
    """Whether SGLang 0.5.23 cuts a rank's lists: with an all-to-all backend
    (its get_exec().moe.moe_a2a_backend, or a2a_backend= outside SGLang)."""
    if a2a_backend is None:
        try:
            from sglang.srt.runtime_context import get_exec
        except ImportError:
            raise EpxError(Status.INVALID_ARG, "moe_ep_rank is given, and whether SGLang cuts "
                           "the lists to the rank depends on its all-to-all backend, read from "
                           "its runtime context: call this inside SGLang, or pass "
                           "a2a_backend= (\"none\": no cut)") from None
        a2a_backend = get_exec().moe.moe_a2a_backend
    return a2a_backend != "none"


def _rank_cut(m, E, ep_size, rank, nnodes):
    """Rank `rank`'s lists [L][E][X] from the map m [L][P], cut as SGLang
    0.5.23 cuts them, -1 padded to this rank's longest list (its own
    _pad_nested_array)."""
    wide = (-2 ** 63, 2 ** 63 - 1, "an integer")
    G = A.integer(ep_size, "ep_size", 1, A.MAX_GPUS, "EPX_MAX_GPUS")
    r = A.integer(rank, "moe_ep_rank", *wide)
    if not 0 <= r < G:
        raise EpxIndexError(Status.INVALID_ARG, "moe_ep_rank %d is outside [0, %d) (ep_size)"
                            % (r, G))
    N = _nodes_from(G, G, nnodes, None, "nnodes") if nnodes is not None else _runtime_nodes(G)
    layout = Layout.from_map(m, num_gpus=G, num_nodes=N or 1, num_logical_experts=E)
    lists = sglang_rank_lists(layout, "0.5.23")[r]
    X = int((lists >= 0).sum(axis=2).max())
    return np.ascontiguousarray(lists[:, :, :max(X, 1)], dtype=np.int64)


# ---- the static dispatch table, in each release's call shape ----------------
#
# SGLang's compute_logical_to_rank_dispatch_physical_map changed how it is
# called (read from each release's wheel):
#   <= 0.5.2          (logical_to_all_physical_map, num_gpus, num_physical_experts,
#                     ep_rank, seed=42); no node preference.
#   0.5.3 - 0.5.16    (server_args, logical_to_all_physical_map, num_gpus | ep_size,
#                     num_physical_experts, ep_rank, seed=42); GPUs per node =
#                     server_args.ep_size // server_args.nnodes, no node
#                     preference when server_args.ep_join_mode == "scale".
#   >= 0.5.17         (logical_to_all_physical_map, ep_size, num_physical_experts,
#                     ep_rank, seed=42); the same two values read from SGLang's
#                     runtime context: get_parallel().ep_size // .nnodes and
#                     get_exec().moe.ep_join_mode (sglang.srt.runtime_context).
# SERVER_ARGS_SINCE and RUNTIME_CONTEXT_SINCE mark the changes.
SERVER_ARGS_SINCE = (0, 5, 3, 0)
RUNTIME_CONTEXT_SINCE = (0, 5, 17, 0)


def _sglang_release(version):
    """(major, minor, patch, post) of an SGLang release string ("0.5.4.post2"),
    read by libepx's one parser, as every other release epx takes (issue 29):
    MAJOR.MINOR.PATCH[.postN] from the oldest release epx reproduces, else
    EpxError naming the value; a newer release warns when its table is made."""
    raw = sglang_release(version, "table", warn=False)[0].decode()
    parts = raw.lstrip("v").split(".")
    post = int(parts[3][len("post"):]) if len(parts) == 4 else 0
    return (int(parts[0]), int(parts[1]), int(parts[2]), post)


def _call_shape(version):
    """"plain" (<= 0.5.2), "server_args" (0.5.3 - 0.5.16) or "runtime" (>= 0.5.17)."""
    v = _sglang_release(version)
    if v < SERVER_ARGS_SINCE:
        return "plain"
    return "server_args" if v < RUNTIME_CONTEXT_SINCE else "runtime"


def _nodes_from(ep_size, gpus_per_node_ep_size, nnodes, join_mode, where):
    """The node count epx plans with for ep_size GPUs, from the engine's
    (ep_size, nnodes, ep_join_mode): 1 (no same-node preference) when SGLang
    would not prefer same-node replicas, else ep_size / GPUs per node."""
    if join_mode == "scale":
        return 1  # SGLang skips the same-node preference for a scale joiner
    # integers, as SGLang's argparse makes them: int() cut nnodes = 2.5 to 2 and
    # parsed "2", where SGLang's ep_size // nnodes gives a float or a TypeError
    wide = (-2 ** 63, 2 ** 63 - 1, "an integer, as SGLang's --nnodes / --ep-size")
    nnodes = A.integer(nnodes, "%s nnodes" % where, *wide)
    gpus_per_node_ep_size = A.integer(gpus_per_node_ep_size, "%s ep_size" % where, *wide)
    ep_size = A.integer(ep_size, "ep_size", *wide)
    if nnodes <= 0 or gpus_per_node_ep_size % nnodes:
        raise EpxError(Status.SHAPE, "%s: ep_size (%s) is not a multiple of nnodes (%s): every "
                       "node must hold the same number of GPUs" % (where, gpus_per_node_ep_size,
                                                                    nnodes))
    per_node = int(gpus_per_node_ep_size) // nnodes
    if per_node <= 0 or int(ep_size) % per_node:
        raise EpxError(Status.SHAPE, "%s: ep_size (%s) is not a multiple of the %d GPUs per node "
                       "(%s GPUs on %d nodes)" % (where, ep_size, per_node,
                                                  gpus_per_node_ep_size, nnodes))
    return int(ep_size) // per_node


def _server_args_nodes(server_args, ep_size):
    """SGLang 0.5.3 - 0.5.16: the node count from server_args (ep_size,
    nnodes, ep_join_mode), as those releases read it."""
    nnodes = getattr(server_args, "nnodes", 1)
    sa_ep = getattr(server_args, "ep_size", None) or ep_size
    return _nodes_from(ep_size, sa_ep, nnodes, getattr(server_args, "ep_join_mode", None),
                       "server_args")


def _runtime_nodes(ep_size):
    """SGLang >= 0.5.17: the node count from SGLang's runtime context
    (sglang.srt.runtime_context.get_parallel() and get_exec().moe), read as
    those releases read it; None where SGLang is not importable (no runtime
    context: then one node). Errors of an unpublished context pass through,
    as they would from SGLang's own function."""
    try:
        from sglang.srt.runtime_context import get_exec, get_parallel
    except ImportError:
        return None
    join_mode = get_exec().moe.ep_join_mode
    try:
        from sglang.srt.elastic_ep.elastic_ep import elastic_expanded_world_enabled
    except ImportError:
        elastic_expanded_world_enabled = None
    if elastic_expanded_world_enabled is not None and elastic_expanded_world_enabled():
        join_mode = "scale"  # an expanded elastic world: no same-node preference either
    par = get_parallel()
    return _nodes_from(ep_size, par.ep_size, par.nnodes, join_mode, "SGLang's runtime context")


def _looks_like_server_args(x):
    return (x is not None and not hasattr(x, "shape") and not isinstance(x, (list, tuple))
            and (hasattr(x, "nnodes") or hasattr(x, "ep_size")))


def compute_logical_to_rank_dispatch_physical_map(*args, sglang_version=None, nnodes=None,
                                                  **kwargs):
    """SGLang's static dispatch table for rank ep_rank: [L][E], the one replica
    each logical expert's tokens go to from that rank; bit-exact with SGLang's
    rules as shared/golden records them (CPython's random.Random(seed), one
    generator for the whole table). ep_rank=None returns all ranks [G][L][E].
    The dtype (and torch-ness, and device) follows the input, as in SGLang.

    Called in the shape of the release sglang_version names (see the table
    above; dispatch_map_for(V) gives a function with exactly that signature):
      <= 0.5.2 (the default, sglang_version=None):
        (logical_to_all_physical_map, num_gpus, num_physical_experts,
         ep_rank=None, seed=42)
      0.5.3 - 0.5.16, or any call that passes server_args (by keyword or
      first): (server_args, logical_to_all_physical_map, num_gpus | ep_size,
        num_physical_experts, ep_rank, seed=42); the node count comes from
        server_args (ep_size // nnodes GPUs per node; one node when
        ep_join_mode == "scale"); with no sglang_version the rule is 0.5.16's.
      >= 0.5.17: (logical_to_all_physical_map, ep_size, num_physical_experts,
        ep_rank, seed=42); the node count from SGLang's runtime context where
        sglang is importable, else one node.
    ep_size= and num_gpus= name the same argument in every shape. nnodes=
    (epx's keyword) overrides the node count in any shape. The rule is that
    of sglang_version (0.5.2 when None and no server_args): from 0.5.3 the
    node count counts (same-node preference), from 0.5.4.post2 single-replica
    experts skip the generator. The lists are used as given: the per-rank cut
    SGLang's init_by_mapping makes from 0.5.4.post2 comes before this function
    (epx.static_table(layout, sglang_version=V) does both)."""
    args = list(args)
    server_args = kwargs.pop("server_args", None)
    if server_args is None and args and _looks_like_server_args(args[0]):
        server_args = args.pop(0)
    shape = "plain" if sglang_version is None else _call_shape(sglang_version)
    if server_args is not None:
        if sglang_version is None:
            sglang_version, shape = "0.5.16", "server_args"
        elif shape != "server_args":
            raise TypeError("SGLang %s's compute_logical_to_rank_dispatch_physical_map takes no "
                            "server_args (only 0.5.3 - 0.5.16 do; %s)"
                            % (sglang_version, "it reads SGLang's runtime context"
                               if shape == "runtime" else "it has no node preference"))
    if sglang_version is None:
        sglang_version = "0.5.2"
    names = ["logical_to_all_physical_map", "num_gpus", "num_physical_experts", "ep_rank",
             "seed"]
    if len(args) > len(names):
        raise TypeError("compute_logical_to_rank_dispatch_physical_map takes at most %d "
                        "positional arguments (%d given)" % (len(names), len(args)))
    bound = dict(zip(names, args))
    if "ep_size" in kwargs:
        ep_size = kwargs.pop("ep_size")
        if "num_gpus" in kwargs or "num_gpus" in bound:
            num_gpus = kwargs.pop("num_gpus", bound.get("num_gpus"))
            if num_gpus is not None and ep_size is not None and int(num_gpus) != int(ep_size):
                raise TypeError("num_gpus (%s) and ep_size (%s) disagree" % (num_gpus, ep_size))
        bound["num_gpus"] = ep_size
    for k in list(kwargs):
        if k not in names:
            raise TypeError("compute_logical_to_rank_dispatch_physical_map got an unexpected "
                            "keyword argument %r" % k)
        if k in bound:
            raise TypeError("compute_logical_to_rank_dispatch_physical_map got multiple values "
                            "for argument %r" % k)
        bound[k] = kwargs.pop(k)
    l2a = bound.get("logical_to_all_physical_map")
    num_gpus, num_physical = bound.get("num_gpus"), bound.get("num_physical_experts")
    if l2a is None or num_gpus is None or num_physical is None:
        raise TypeError("compute_logical_to_rank_dispatch_physical_map needs "
                        "logical_to_all_physical_map, num_gpus (or ep_size) and "
                        "num_physical_experts")
    if nnodes is None:
        if shape == "server_args" and server_args is not None:
            nnodes = _server_args_nodes(server_args, num_gpus)
        elif shape == "runtime":
            nnodes = _runtime_nodes(num_gpus)
    from . import dispatch  # the dispatch room's binding
    return dispatch.sglang_static_table(l2a, num_gpus, num_physical, bound.get("ep_rank"),
                                        bound.get("seed", 42), sglang_version=sglang_version,
                                        num_nodes=1 if nnodes is None else nnodes)


def dispatch_map_for(sglang_version):
    """compute_logical_to_rank_dispatch_physical_map with exactly the call
    shape and rule of SGLang release sglang_version ("0.5.2", "0.5.16",
    "0.5.23"), to put where that release's function was:

        expert_location.compute_logical_to_rank_dispatch_physical_map = \
            epx.sglang.dispatch_map_for("0.5.16")
    """
    version = sglang_version  # a str: the release parser refuses anything else
    shape = _call_shape(version)
    run = compute_logical_to_rank_dispatch_physical_map
    if shape == "plain":
        def table(logical_to_all_physical_map, num_gpus, num_physical_experts, ep_rank,
                  seed=42):
            return run(logical_to_all_physical_map, num_gpus, num_physical_experts, ep_rank,
                       seed, sglang_version=version)
    elif shape == "server_args":
        def table(server_args, logical_to_all_physical_map, ep_size, num_physical_experts,
                  ep_rank, seed=42):
            return run(logical_to_all_physical_map, ep_size, num_physical_experts, ep_rank,
                       seed, server_args=server_args, sglang_version=version)
    else:
        def table(logical_to_all_physical_map, ep_size, num_physical_experts, ep_rank,
                  seed=42):
            return run(logical_to_all_physical_map, ep_size, num_physical_experts, ep_rank,
                       seed, sglang_version=version)
    table.__name__ = "compute_logical_to_rank_dispatch_physical_map"
    table.__qualname__ = table.__name__
    table.__doc__ = ("SGLang %s's compute_logical_to_rank_dispatch_physical_map (%s call "
                     "shape), computed by epx." % (version, shape))
    return table


def load_init_expert_location(spec, *, as_torch=None):
    """The dict SGLang builds from --init-expert-location (a .json/.pt path or
    inline JSON): {"physical_to_logical_map": [L][P] int64} or
    {"logical_count": [S][L][E] float64 ([L][E] files as S = 1)}."""
    torch_out = bool(as_torch)
    try:
        return {"physical_to_logical_map": A.wrap(read_mapping(spec), torch_out)}
    except EpxError as e:
        if e.status != Status.PARSE or "physical_to_logical_map" not in e.message:
            raise
        mapping_error = e
    try:
        return {"logical_count": A.wrap(read_counts(spec), torch_out)}
    except EpxError as e:
        if e.status != Status.PARSE or "logical_count" not in e.message:
            raise
        raise EpxError(Status.PARSE, "%s holds neither physical_to_logical_map nor "
                       "logical_count (%s; %s)" % (_short(spec), mapping_error.message,
                                                   e.message)) from None


def _short(spec):
    s = str(spec)
    return s if len(s) <= 80 else s[:77] + "..."
