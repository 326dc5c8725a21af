"""Drop-ins for SGLang's EPLB entry points, with the same signatures and return
values, computed by libepx.

  rebalance_experts(...)             sglang.srt.eplb.eplb_algorithms.deepseek
  rebalance_experts_from_windows(...) sglang.srt.eplb.eplb_algorithms.rebalance_experts
  compute_logical_to_rank_dispatch_physical_map(...)
                                     sglang.srt.eplb.expert_location
  compute_logical_to_all_physical_map(...)   (its _compute_logical_to_all_physical_map)
  load_init_expert_location(spec)    the data_dict of compute_initial_expert_location_metadata

Arrays come back as numpy unless a torch tensor went in (or as_torch=True):
then as CPU torch tensors, as the reference returns them.
"""
import numpy as np

from . import _arrays as A
from . import planner as _plan
from ._native import EpxError, Status
from .io import read_counts, read_mapping
from .layout import Layout

__all__ = ["rebalance_experts", "rebalance_experts_from_windows",
           "compute_logical_to_rank_dispatch_physical_map", "compute_logical_to_all_physical_map",
           "load_init_expert_location"]


def _trim_log2phy(l2p, cnt, width):
    """Cut or keep the replica columns: "max" = the largest count over the whole
    tensor (SGLang's and DeepSeek's current EPLB), "full" = P - E + 1 (vLLM)."""
    if width == "full":
        return l2p
    if width != "max":
        raise ValueError("log2phy_width must be 'max' (SGLang) or 'full' (P - E + 1, vLLM), "
                         "got %r" % (width,))
    x = int(cnt.max()) if cnt.size else 1
    return l2p[:, :, :x]


def _epx_triple(weight, num_replicas, num_groups, num_nodes, num_gpus, enable_hierarchical,
                **plan_kw):
    """epx's own planner, returned in the reference's triple: replicas of an
    expert in ascending slot order (epx has no replica ranks)."""
    plan_kw.setdefault("node_local", "default" if enable_hierarchical else "off")
    p = _plan.plan(weight, num_gpus=num_gpus, num_physical_experts=num_replicas,
                   num_nodes=num_nodes if enable_hierarchical else 1,
                   algorithm="epx", num_groups=num_groups, **plan_kw)
    lay = p.layout
    p2l = lay.physical_to_logical_map
    E, P = lay.num_logical_experts, lay.num_physical_experts
    l2p = lay.logical_to_all_physical_map(width=max(P - E + 1, 1))
    return p2l, l2p, lay.num_valid


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
    """
    torch_out = A.want_torch(as_torch, weight)
    if algorithm == "deepseek":
        if plan_kw:
            raise TypeError("unexpected keywords for algorithm='deepseek': %s"
                            % ", ".join(sorted(plan_kw)))
        p2l, l2p, cnt = _plan.deepseek(weight, num_replicas, num_groups, num_nodes, num_gpus,
                                       enable_hierarchical, sglang_version=sglang_version)
    elif algorithm == "epx":
        if sglang_version is not None:
            raise ValueError("sglang_version=%r applies to algorithm='deepseek' (SGLang's copy "
                             "of EPLB), not to epx's planner: drop it or use "
                             "algorithm='deepseek'" % (sglang_version,))
        p2l, l2p, cnt = _epx_triple(weight, num_replicas, num_groups, num_nodes, num_gpus,
                                    enable_hierarchical, **plan_kw)
    else:
        raise ValueError("algorithm must be 'deepseek' or 'epx', got %r" % (algorithm,))
    l2p = _trim_log2phy(l2p, cnt, log2phy_width)
    out = tuple(np.ascontiguousarray(a, dtype=np.int64) for a in (p2l, l2p, cnt))
    return tuple(A.wrap(a, torch_out) for a in out)


def _algorithm_name(algorithm):
    name = getattr(algorithm, "name", algorithm)  # an EplbAlgorithm member, or a string
    return str(name).lower().replace("-", "_")


def rebalance_experts_from_windows(tokens_per_expert, num_physical_experts,
                                   num_local_physical_experts, num_groups, num_nodes,
                                   algorithm, *, as_torch=None, sglang_version=None, **plan_kw):
    """SGLang's eplb_algorithms.rebalance_experts: tokens_per_expert [S][L][E]
    (windows), algorithm an EplbAlgorithm member or its name. "deepseek" and
    "deepseek_hierarchical" sum the windows and run DeepSeek EPLB exactly, as
    release sglang_version's copy does (None = DeepSeek's original); "epx"
    hands all windows to epx's planner (it estimates from them)."""
    name = _algorithm_name(algorithm)
    P = A.integer(num_physical_experts, "num_physical_experts", 1, A.MAX_PHYSICAL,
                  "4 (E + G) slots at most")
    local = A.integer(num_local_physical_experts, "num_local_physical_experts", 1, P,
                      "num_physical_experts")
    if P % local:
        raise ValueError("num_physical_experts (%d) is not a multiple of "
                         "num_local_physical_experts (%d): every GPU holds as many slots" % (P, local))
    num_gpus = P // local
    torch_out = A.want_torch(as_torch, tokens_per_expert)
    if name in ("deepseek", "deepseek_hierarchical"):
        t = A.as_array(tokens_per_expert, np.float64, 3, "tokens_per_expert")
        return rebalance_experts(t.sum(axis=0), num_physical_experts, num_groups, num_nodes,
                                 num_gpus, name == "deepseek_hierarchical", as_torch=torch_out,
                                 sglang_version=sglang_version)
    if name in ("epx", "epx_hierarchical"):
        if sglang_version is not None:
            raise ValueError("sglang_version=%r applies to the deepseek algorithms, not to "
                             "epx's planner" % (sglang_version,))
        t = A.as_array(tokens_per_expert, np.float64, 3, "tokens_per_expert")
        p2l, l2p, cnt = _epx_triple(t, num_physical_experts, num_groups, num_nodes, num_gpus,
                                    True, **plan_kw)
        l2p = _trim_log2phy(l2p, cnt, "max")
        return tuple(A.wrap(np.ascontiguousarray(a, dtype=np.int64), torch_out)
                     for a in (p2l, l2p, cnt))
    raise EpxError(Status.UNSUPPORTED,
                   "EPLB algorithm %r is not served by epx: use deepseek, "
                   "deepseek_hierarchical or epx" % (name,))


def compute_logical_to_all_physical_map(physical_to_logical_map, num_logical_experts,
                                        *, as_torch=None):
    """SGLang's _compute_logical_to_all_physical_map: [L][E][X] int64, the slots
    of each expert ascending, -1 padded to X = the largest replica count."""
    torch_out = A.want_torch(as_torch, physical_to_logical_map)
    m = A.as_array(physical_to_logical_map, np.int64, 2, "physical_to_logical_map")
    # G = 1: this map does not depend on the GPU count.
    lay = Layout.from_map(m, num_gpus=1, num_logical_experts=int(num_logical_experts))
    return A.wrap(lay.logical_to_all_physical_map(), torch_out)


def compute_logical_to_rank_dispatch_physical_map(logical_to_all_physical_map, num_gpus=None,
                                                  num_physical_experts=None, ep_rank=None,
                                                  seed=42, *, ep_size=None,
                                                  sglang_version="0.5.2", nnodes=1):
    """SGLang's static dispatch table for rank ep_rank: [L][E], the one replica
    each logical expert's tokens go to from that rank; bit-exact with SGLang's
    rules as shared/golden records them (CPython's random.Random(seed), one
    generator for the whole table). ep_rank=None returns all ranks [G][L][E].
    ep_size= is accepted for num_gpus (newer SGLang's name for it). The dtype
    (and torch-ness, and device) follows the input, as in SGLang.

    The rule is SGLang <= 0.5.2's, whose call shape this is, unless
    sglang_version= names another release (nnodes= then counts from 0.5.3:
    same-node preference; from 0.5.4.post2 single-replica experts skip the
    generator). The lists are used as given: the per-rank cut SGLang's
    init_by_mapping makes from 0.5.4.post2 comes before this function
    (epx.static_table(layout, sglang_version=V) does both)."""
    if ep_size is not None:
        if num_gpus is not None and int(num_gpus) != int(ep_size):
            raise TypeError("num_gpus (%s) and ep_size (%s) disagree" % (num_gpus, ep_size))
        num_gpus = ep_size
    if num_gpus is None or num_physical_experts is None:
        raise TypeError("compute_logical_to_rank_dispatch_physical_map needs num_gpus "
                        "(or ep_size) and num_physical_experts")
    from . import dispatch  # the dispatch room's binding
    return dispatch.sglang_static_table(logical_to_all_physical_map, num_gpus,
                                        num_physical_experts, ep_rank, seed,
                                        sglang_version=sglang_version, num_nodes=nnodes)


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
