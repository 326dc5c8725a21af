"""Drop-ins for vLLM's EPLB placement, computed by libepx (DeepSeek's EPLB).

vLLM's entry point changed shape over its releases (read from each wheel by
tools/vllm_eplb.py; the goldens in tests/data/vllm/eplb.json are their own
answers):

  DefaultEplbPolicy      vllm.distributed.eplb.policy.DefaultEplbPolicy of
                         0.19.0 - 0.34.0: the classmethod
                         rebalance_experts(weight, num_replicas, num_groups,
                         num_nodes, num_ranks, old_global_expert_indices=None)
                         -> phy2log [layers, num_replicas] int64 (a CPU tensor
                         when a tensor went in, as vLLM returns it).
  TupleEplbPolicy        the same class of 0.14.0 - 0.18.1, which returns
                         (phy2log, log2phy, logcnt).
  TupleEplbPolicy013     0.13.0's: the same 3-tuple, no
                         old_global_expert_indices, float32 arithmetic.
  rebalance_experts(...) vllm.distributed.eplb.rebalance_algo.rebalance_experts
                         of 0.9.2 - 0.12.0: (weight, num_replicas, num_groups,
                         num_nodes, num_gpus) -> the same 3-tuple, on the
                         input's device.
  policy_for(version)    the class that matches a release string;
                         policy_for(version, "epx") the same call shape
                         running epx's own planner (EpxEplbPolicy,
                         EpxTupleEplbPolicy, EpxTupleEplbPolicy013).

epx.vllm_plugin puts one of these into vLLM's policy table without a patch
(the vllm.general_plugins entry point, EPX_VLLM_ALGORITHM=deepseek|epx).

Errors: where vLLM's code asserts on an impossible shape (num_replicas not a
multiple of the GPUs, experts not a multiple of the groups, GPUs not a
multiple of the nodes, fewer replicas than experts) the drop-ins raise
EpxAssertionError, both an epx.EpxError (status, libepx's sentence naming the
value and the fix) and an AssertionError, as vLLM's callers catch it.

Every release runs DeepSeek's EPLB: hierarchical when num_groups % num_nodes
== 0, else the global policy; log2phy has P - E + 1 columns, each expert's
slots in replica-rank order. Given the map in service, releases >= 0.14.0
keep experts that stay on a GPU in their old slots (preserve_intragpu_slots,
mirrored with each release's signature). vLLM's other classmethods
(balanced_packing, replicate_experts, rebalance_experts_hierarchical) are its
internals, not the policy API, and are not mirrored.

Arithmetic: each class computes as its releases do. vLLM <= 0.13.0 works in
float32 (DeepSeek's rule); from 0.14.0 vLLM runs in numpy: a group's load is
numpy's (pairwise) float32 sum, the per-replica load is a float64 quotient
and pack loads are float64 sums; DefaultEplbPolicy and TupleEplbPolicy
follow that (libepx's EPX_EPLB_RULE_VLLM_F64, the class attribute
EPLB_RULE). So epx returns, slot for slot, what each verified release
returns with its sorts made stable, on every golden and on every random case
of `tools/vllm_eplb.py check`, but one: vLLM <= 0.13.0 adds a group's float
loads with torch's blocked sum, epx one by one, and the golden
numpy_group_sums_n2 rounds them apart (same replica counts and max load).

Where loads tie, vLLM's sorts (torch.sort up to 0.11.0, np.argsort after) are
not stable and epx's are (lowest index first; docs/TIES.md): the placement
can then differ; the replica counts (as (load, count) pairs) differ only
where node packing ties groups of equal total load made of different
experts, and the per-GPU max load differed in no case tested. Where no sort
key ties, epx equals the release as released.
"""
import re
import warnings

import numpy as np

from . import _arrays as A
from . import planner as _plan
from . import sglang as _sglang
from ._native import EpxAssertionError, as_assertion

__all__ = ["EpxAssertionError", "DefaultEplbPolicy", "TupleEplbPolicy", "TupleEplbPolicy013",
           "EpxEplbPolicy", "EpxTupleEplbPolicy", "EpxTupleEplbPolicy013", "rebalance_experts",
           "policy_for", "ALGORITHMS", "VERIFIED_VERSIONS"]

# The releases whose own code produced tests/data/vllm/eplb.json: each side of
# every change, and the newest read.
VERIFIED_VERSIONS = ("0.9.2", "0.11.0", "0.11.1", "0.12.0", "0.13.0", "0.14.0", "0.18.1",
                     "0.19.0", "0.34.0")


def _deepseek(weight, num_replicas, num_groups, num_nodes, num_gpus, algorithm="deepseek",
              rule="deepseek", **plan_kw):
    """vLLM's rule for the policy (no flag: groups divisible by nodes), with
    log2phy P - E + 1 wide; numpy int64 triple. rule: the release's
    arithmetic (epx.planner.EPLB_RULES: "deepseek" = float32, vLLM <= 0.13.0;
    "vllm-f64" = vLLM >= 0.14.0). A shape vLLM asserts on raises
    EpxAssertionError (an EpxError and an AssertionError)."""
    with as_assertion():
        return _deepseek_checked(weight, num_replicas, num_groups, num_nodes, num_gpus,
                                 algorithm, rule, **plan_kw)


def _deepseek_checked(weight, num_replicas, num_groups, num_nodes, num_gpus, algorithm, rule,
                      **plan_kw):
    num_replicas, num_gpus = _int(num_replicas, "num_replicas"), _int(num_gpus, "num_gpus")
    hierarchical = _int(num_groups, "num_groups") % _int(num_nodes, "num_nodes") == 0
    if A.is_torch(weight):
        weight = weight.detach().float().cpu()  # vLLM's weight.float(): bf16 and ints too
    if algorithm == "deepseek":
        if plan_kw:
            raise TypeError("unexpected keywords for algorithm='deepseek': %s"
                            % ", ".join(sorted(plan_kw)))
        out = _plan.deepseek(weight, num_replicas, num_groups, num_nodes, num_gpus,
                             hierarchical, rule=rule)
        return tuple(np.ascontiguousarray(a, dtype=np.int64) for a in out)
    return _sglang.rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus,
                                     hierarchical, algorithm=algorithm, log2phy_width="full",
                                     as_torch=False, **plan_kw)


# The largest value each argument may take (include/epx.h's limits): checked
# before the call, so 2**32 + 8 ranks is refused, not wrapped to 8.
_LIMITS = {"num_replicas": (A.MAX_PHYSICAL, "4 (E + G) slots at most"),
           "num_groups": (A.MAX_EXPERTS, "EPX_MAX_EXPERTS"),
           "num_nodes": (A.MAX_GPUS, "EPX_MAX_GPUS"), "num_gpus": (A.MAX_GPUS, "EPX_MAX_GPUS"),
           "num_ranks": (A.MAX_GPUS, "EPX_MAX_GPUS")}


def _int(x, name):
    hi, limit = _LIMITS.get(name, (A.INT32_MAX, None))
    return A.integer(x, name, 1, hi, limit)


def rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus, *,
                      algorithm="deepseek", as_torch=None, **plan_kw):
    """vLLM 0.9.2 - 0.12.0's rebalance_algo.rebalance_experts(weight,
    num_replicas, num_groups, num_nodes, num_gpus) -> (phy2log [L][P],
    log2phy [L][E][P-E+1], logcnt [L][E]), int64, on the input's device;
    float32 arithmetic, as those releases. algorithm="epx" runs epx's own
    planner (its replicas in slot order)."""
    torch_out = A.want_torch(as_torch, weight)
    out = _deepseek(weight, num_replicas, num_groups, num_nodes, num_gpus, algorithm, **plan_kw)
    device = weight.device if A.is_torch(weight) else None
    return tuple(A.wrap(a, torch_out, device) for a in out)


# ---- the map in service ---------------------------------------------------


def _old_map(old, shape, num_logical):
    """The map in service as int64 [L][P]; it must describe the same slots."""
    a = A.as_array(old, None, 2, "old_global_expert_indices")
    if a.dtype.kind not in "iu":
        raise TypeError("old_global_expert_indices must hold integer expert ids (the "
                        "physical_to_logical_map in service), got dtype %s" % a.dtype)
    if a.shape != shape:
        raise ValueError("old_global_expert_indices has shape %s but the new map is %s "
                         "(layers, num_replicas): slots are kept only between maps of one "
                         "shape; pass None after the number of slots changed"
                         % (tuple(a.shape), shape))
    a = a.astype(np.int64)
    bad = (a < -1) | (a >= num_logical)
    if bad.any():
        l, p = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError("old_global_expert_indices[%d][%d] = %d is not an expert id in "
                         "[0, %d) nor -1 (an empty slot)" % (l, p, a[l, p], num_logical))
    return a


def _occurrence(keys):
    """occ[i] = how many entries before i (in row order) hold keys[i]."""
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    starts = np.flatnonzero(np.r_[True, sk[1:] != sk[:-1]])
    run_start = np.repeat(starts, np.diff(np.r_[starts, sk.size]))
    occ = np.empty_like(order)
    occ[order] = np.arange(sk.size) - run_start
    return occ


def _slot_sources(new, old, num_ranks):
    """For one layer: src[j] = the position of the new map whose expert goes to
    slot j, as vLLM's preserve_intragpu_slots moves them. On each GPU, the
    t-th old slot holding expert x keeps x when the GPU's new slots hold x at
    least t + 1 times (it takes the t-th of them); the new entries left over
    fill the slots left over, both in slot order."""
    P = new.size
    k = P // num_ranks
    gpu = np.arange(P) // k
    span = int(max(new.max(initial=0), old.max(initial=0))) + 2
    key_new, key_old = gpu * span + new + 1, gpu * span + old + 1  # old may hold -1
    # (gpu, expert, occurrence) names one entry on each side
    pair_new = key_new * k + _occurrence(key_new)
    pair_old = key_old * k + _occurrence(key_old)
    kept = np.isin(pair_old, pair_new)  # old slots that keep their expert
    taken = np.isin(pair_new, pair_old)  # new entries that went to such a slot
    src = np.empty(P, dtype=np.int64)
    by_pair = np.argsort(pair_new)
    src[kept] = by_pair[np.searchsorted(pair_new, pair_old[kept], sorter=by_pair)]
    # per GPU, as many entries are left as slots: both in ascending global
    # order, the t-th leftover entry and the t-th free slot share a GPU
    src[~kept] = np.flatnonzero(~taken)
    return src


def _keep_slots(phy2log, num_ranks, old):
    """src [L][P]: phy2log[l, src[l]] is vLLM's map after slot preservation."""
    L, P = phy2log.shape
    if num_ranks <= 0 or P % num_ranks:
        return np.tile(np.arange(P, dtype=np.int64), (L, 1))  # vLLM leaves it as is
    return np.stack([_slot_sources(phy2log[l], old[l], num_ranks) for l in range(L)])


def _triple_after(phy2log, log2phy, src):
    """phy2log, log2phy, logcnt after moving entries by src: each slot's
    replica rank travels with its expert, as vLLM moves phy_replicas_idx."""
    L = phy2log.shape[0]
    rank = np.full(phy2log.shape, -1, dtype=np.int64)
    l, _, r = np.nonzero(log2phy >= 0)
    rank[l, log2phy[log2phy >= 0]] = r  # nonzero and masking walk in the same order
    lay = np.arange(L)[:, None]
    p2l, rk = phy2log[lay, src], rank[lay, src]
    l2p = np.full_like(log2phy, -1)
    l2p[np.broadcast_to(lay, p2l.shape), p2l, rk] = np.arange(p2l.shape[1])
    logcnt = (l2p >= 0).sum(axis=2).astype(np.int64)
    return p2l, l2p, logcnt


# ---- the policy classes ---------------------------------------------------


class DefaultEplbPolicy:
    """vLLM 0.19.0 - 0.34.0's DefaultEplbPolicy (vllm.distributed.eplb.policy):
    vllm.distributed.eplb.policy.EPLB_POLICIES["default"] = DefaultEplbPolicy
    swaps it in. Accepts torch tensors or numpy arrays. Computes as those
    releases do (float64 quotients and pack sums: EPLB_RULE)."""

    # the arithmetic, an epx.planner.EPLB_RULES name
    EPLB_RULE = "vllm-f64"
    # the planner: "deepseek" (DeepSeek's EPLB, as vLLM computes it) or "epx"
    ALGORITHM = "deepseek"

    @classmethod
    def rebalance_experts(cls, weight, num_replicas, num_groups, num_nodes, num_ranks,
                          old_global_expert_indices=None):
        """weight [layers, num_logical_experts] (any real dtype; used as
        float32, as vLLM's weight.float()); old_global_expert_indices: the
        physical_to_logical_map in service [layers, num_replicas] (-1 = an
        empty slot) or None. Returns phy2log [layers, num_replicas] int64:
        a CPU torch tensor when either input is a tensor, else numpy."""
        p2l, l2p, cnt = cls._triple(weight, num_replicas, num_groups, num_nodes, num_ranks,
                                    old_global_expert_indices)
        return cls._result(p2l, l2p, cnt, weight, old_global_expert_indices)

    @classmethod
    def preserve_intragpu_slots(cls, phy2log, num_ranks, old_phy2log):
        """vLLM's post-pass on its own: the new map, reordered on each GPU so
        experts that stay there keep their slots in old_phy2log."""
        torch_out = A.want_torch(None, phy2log, old_phy2log)
        new = A.as_array(phy2log, np.int64, 2, "phy2log")
        num_ranks = _int(num_ranks, "num_ranks")
        old = _old_map(old_phy2log, new.shape, int(new.max(initial=-1)) + 1)
        out = new[np.arange(new.shape[0])[:, None], _keep_slots(new, num_ranks, old)]
        return A.wrap(out, torch_out)

    @classmethod
    def _triple(cls, weight, num_replicas, num_groups, num_nodes, num_ranks, old):
        num_ranks = _int(num_ranks, "num_ranks")  # vLLM's name, in the message
        if cls.ALGORITHM == "deepseek":
            p2l, l2p, cnt = _deepseek(weight, num_replicas, num_groups, num_nodes, num_ranks,
                                      rule=cls.EPLB_RULE)
        else:
            p2l, l2p, cnt = _deepseek(weight, num_replicas, num_groups, num_nodes, num_ranks,
                                      algorithm=cls.ALGORITHM)
        if old is None:
            return p2l, l2p, cnt
        old = _old_map(old, p2l.shape, l2p.shape[1])
        return _triple_after(p2l, l2p, _keep_slots(p2l, int(num_ranks), old))

    @staticmethod
    def _result(p2l, l2p, cnt, *inputs):
        # vLLM returns torch.from_numpy(...): on the CPU whatever the input's device
        return A.wrap(p2l, A.want_torch(None, *inputs))


class TupleEplbPolicy(DefaultEplbPolicy):
    """vLLM 0.14.0 - 0.18.1's DefaultEplbPolicy: the same call and
    arithmetic, returning (phy2log [L][P], log2phy [L][E][P-E+1], logcnt
    [L][E]) int64 on the weight's device (torch) or as numpy."""

    @classmethod
    def preserve_intragpu_slots(cls, phy2log, phy_replicas_idx, num_ranks, old_phy2log):
        """vLLM 0.14.0 - 0.18.1's post-pass: (phy2log, phy_replicas_idx) with
        each slot's replica index moved along with its expert."""
        torch_out = A.want_torch(None, phy2log, phy_replicas_idx, old_phy2log)
        new = A.as_array(phy2log, np.int64, 2, "phy2log")
        ridx = A.as_array(phy_replicas_idx, np.int64, 2, "phy_replicas_idx")
        if ridx.shape != new.shape:
            raise ValueError("phy_replicas_idx has shape %s, phy2log %s: one replica index "
                             "per slot" % (ridx.shape, new.shape))
        num_ranks = _int(num_ranks, "num_ranks")
        old = _old_map(old_phy2log, new.shape, int(new.max(initial=-1)) + 1)
        src = _keep_slots(new, num_ranks, old)
        lay = np.arange(new.shape[0])[:, None]
        return A.wrap(new[lay, src], torch_out), A.wrap(ridx[lay, src], torch_out)

    @staticmethod
    def _result(p2l, l2p, cnt, weight, old):
        torch_out = A.want_torch(None, weight, old)
        device = weight.device if A.is_torch(weight) else None
        return tuple(A.wrap(np.ascontiguousarray(a), torch_out, device) for a in (p2l, l2p, cnt))


class TupleEplbPolicy013(TupleEplbPolicy):
    """vLLM 0.13.0's DefaultEplbPolicy: the 3-tuple of TupleEplbPolicy, but
    no old_global_expert_indices (the map in service arrived in 0.14.0) and
    float32 arithmetic (torch: quotients and pack loads in float32, as
    DeepSeek's EPLB)."""

    EPLB_RULE = "deepseek"

    @classmethod
    def rebalance_experts(cls, weight, num_replicas, num_groups, num_nodes, num_ranks,
                          old_global_expert_indices=None):
        """weight [layers, num_logical_experts] -> (phy2log, log2phy, logcnt).
        vLLM 0.13.0 takes no map in service: old_global_expert_indices must
        be None."""
        if old_global_expert_indices is not None:
            raise TypeError("vLLM 0.13.0's rebalance_experts takes no "
                            "old_global_expert_indices (the map in service arrived in "
                            "0.14.0): use TupleEplbPolicy for 0.14.0 - 0.18.1")
        p2l, l2p, cnt = cls._triple(weight, num_replicas, num_groups, num_nodes, num_ranks, None)
        return cls._result(p2l, l2p, cnt, weight, None)


class EpxEplbPolicy(DefaultEplbPolicy):
    """DefaultEplbPolicy's call and result (vLLM 0.19.0 - 0.34.0), planned by
    epx's own planner instead of DeepSeek's EPLB; with the map in service,
    experts that stay on a GPU keep their slots, as vLLM keeps them."""

    ALGORITHM = "epx"


class EpxTupleEplbPolicy(TupleEplbPolicy):
    """TupleEplbPolicy's call and 3-tuple (vLLM 0.14.0 - 0.18.1), planned by epx."""

    ALGORITHM = "epx"


class EpxTupleEplbPolicy013(TupleEplbPolicy013):
    """TupleEplbPolicy013's call and 3-tuple (vLLM 0.13.0), planned by epx."""

    ALGORITHM = "epx"


# policy_for's algorithms: the class of each call shape that runs each planner
ALGORITHMS = {
    "deepseek": {DefaultEplbPolicy: DefaultEplbPolicy, TupleEplbPolicy: TupleEplbPolicy,
                 TupleEplbPolicy013: TupleEplbPolicy013},
    "epx": {DefaultEplbPolicy: EpxEplbPolicy, TupleEplbPolicy: EpxTupleEplbPolicy,
            TupleEplbPolicy013: EpxTupleEplbPolicy013},
}


def _release(version):
    m = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-]?[A-Za-z0-9.+-]*)$", str(version))
    if not m:
        raise ValueError("vLLM version must look like 0.34.0 (MAJOR.MINOR[.PATCH]), got %r"
                         % (version,))
    return tuple(int(x or 0) for x in m.groups())


def policy_for(version, algorithm="deepseek"):
    """The drop-in matching vLLM release `version` ("0.34.0", "v0.15.1"):
    DefaultEplbPolicy from 0.19.0, TupleEplbPolicy for 0.14.0 - 0.18.x,
    TupleEplbPolicy013 for 0.13.x. Older
    releases have no policy class (use epx.vllm.rebalance_experts); a release
    newer than the newest verified one warns and gets the newest API.
    algorithm: "deepseek" (DeepSeek's EPLB, as the release computes it) or
    "epx" (epx's own planner in the release's call shape)."""
    if algorithm not in ALGORITHMS:
        raise ValueError("algorithm %r is not one of %s" % (algorithm, ", ".join(ALGORITHMS)))
    return ALGORITHMS[algorithm][_shape_for(version)]


def _shape_for(version):
    v = _release(version)
    if v < (0, 9, 2):
        raise ValueError("vLLM %s has no EPLB (it arrived in 0.9.2)" % (version,))
    if v < (0, 13, 0):
        raise ValueError("vLLM %s has no policy class: its entry point is the function "
                         "rebalance_algo.rebalance_experts, use epx.vllm.rebalance_experts"
                         % (version,))
    if v > _release(VERIFIED_VERSIONS[-1]):
        warnings.warn("vLLM %s is newer than the newest release epx was checked against "
                      "(%s); using that release's policy API" % (version, VERIFIED_VERSIONS[-1]),
                      stacklevel=3)
    if v >= (0, 19, 0):
        return DefaultEplbPolicy
    return TupleEplbPolicy if v >= (0, 14, 0) else TupleEplbPolicy013
