"""Balanced per-batch dispatch in SGLang 0.5.23's form (`--ep-dispatch-algorithm
lp`): the log2phy_prob [E][X] float32 tensor its LPLBSolver.solve returns and
_topk_ids_logical_to_physical_probability draws each token's replica from.

What SGLang computes, read from 0.5.23's sglang/srt/eplb/lplb_solver.py and
its kernels (lp_prep.cuh, lp_post.cuh, dispatch_probability.cuh):
  - counts per logical expert are all-reduced over the EP group and divided
    by their total (clamped to at least 1), so the LP's variables are
    fractions of the whole batch, not of each expert;
  - the LP: min M subject to, for each replicated expert, its replicas'
    fractions summing to its share of the batch, and every GPU's load
    (fractions of its slots, single-copy experts' shares included) <= M;
    the replicas and GPUs come from phy2log (slot p on GPU p // (P / G));
  - the solution is scattered per slot (phy_prob[p]: the replica's fraction;
    a single-copy expert's slot holds the expert's whole share) and
    gathered through the rank's log2phy list [E][X] (its
    logical_to_all_physical_map row, -1 padded, P wide): log2phy_prob[e][j]
    = phy_prob[log2phy[e][j]], 0 where log2phy[e][j] == -1. Rows do not sum
    to 1; the draw normalises by the row sum, and a row summing to 0 falls
    back to uniform over the row's valid replicas.

epx puts its exact optimum (balanced_split) in the same places: phy_prob[p]
= share x count / max(total, 1) of the replica in slot p. The max GPU load it
implies is the LP's optimum exactly (SGLang's interior-point solver runs a
fixed 5 iterations in float32 and approaches it). An expert with no tokens in
the batch has fraction 0 on every replica, which is the LP's only feasible
value there; its row is 0 and SGLang's draw would take it uniformly, but no
token of the batch asks for it.
"""
import numpy as np

from . import _arrays as A
from ._balanced import _placement, balanced_split, count_ids


def _full_lists(phy2log, num_logical):
    """The ascending, uncut replica lists [E][W] (-1 padded) of phy2log [P]:
    what SGLang's LP counts copies and GPU loads from."""
    p2l = A.as_array(phy2log, np.int64, 1, "phy2log")
    if p2l.size and (p2l.min() < 0 or p2l.max() >= num_logical):
        bad = int(np.nonzero((p2l < 0) | (p2l >= num_logical))[0][0])
        raise ValueError("phy2log[%d] = %d is outside [0, %d)" % (bad, int(p2l[bad]), num_logical))
    cnt = np.bincount(p2l, minlength=num_logical)
    if (cnt == 0).any():
        raise ValueError("logical expert %d has no slot in phy2log"
                         % int(np.nonzero(cnt == 0)[0][0]))
    W = int(cnt.max())
    lists = -np.ones((num_logical, W), np.int64)
    fill = np.zeros(num_logical, np.int64)
    for p, e in enumerate(p2l):
        lists[e, fill[e]] = p
        fill[e] += 1
    return lists


def slot_fractions(split, replicas, counts, num_physical):
    """phy_prob [P] float64: each slot's fraction of the whole batch under
    the split (SGLang's phy_prob, before the gather through log2phy)."""
    r = A.as_array(replicas, np.int64, 2, "replicas")
    c = A.as_array(counts, np.float64, 1, "counts")
    total = max(float(c.sum()), 1.0)
    out = np.zeros(A.integer(num_physical, "num_physical", 1, A.MAX_PHYSICAL,
                             "4 (E + G) slots at most"), np.float64)
    valid = r >= 0
    out[r[valid]] = (split.shares * c[:, None])[valid] / total
    return out


def _check_log2phy(m, owner):
    """log2phy [E][X]: every entry -1 or a slot in [0, P) that holds row e's
    expert (owner [P]: the expert each slot holds, -1 none); a slot of
    another expert would hand it this expert's probability."""
    P = owner.shape[0]
    if m.size and (m.min() < -1 or m.max() >= P):
        e, j = (int(v) for v in np.argwhere((m < -1) | (m >= P))[0])
        raise ValueError("log2phy[%d][%d] = %d is outside [-1, %d)" % (e, j, int(m[e, j]), P))
    rows = np.arange(m.shape[0])[:, None]
    wrong = np.argwhere((m >= 0) & (owner[np.maximum(m, 0)] != rows))
    if len(wrong):
        e, j = (int(v) for v in wrong[0])
        raise ValueError("log2phy[%d][%d] = %d, but slot %d holds expert %d, not %d: the map is "
                         "of another layer or placement" % (e, j, int(m[e, j]), int(m[e, j]),
                                                            int(owner[m[e, j]]), e))


def balanced_log2phy_prob(counts, layout=None, layer=0, replicas=None, num_physical=None,
                          num_gpus=None, log2phy=None):
    """SGLang 0.5.23's log2phy_prob [E][X] float32 from epx's exact split of
    one layer's counts [E] (tokens per logical expert, all ranks summed).

    The placement is a Layout's layer, or replicas [E][W] (the uncut lists,
    -1 padded) on num_physical slots over num_gpus GPUs, as for
    balanced_split. log2phy [E][X] is the list the probabilities are
    gathered through, the map SGLang's draw is given with them (its
    logical_to_all_physical_map[layer], P wide); default: the placement's own
    lists. A rank whose lists SGLang cut to the nearest replica (an a2a
    backend with init_by_mapping) passes its cut lists here, and gets, as
    in SGLang, the LP's fraction of that one replica."""
    r, P, G = _placement(layout, layer, replicas, num_physical, num_gpus)
    r = A.as_array(r, np.int64, 2, "replicas")
    split = balanced_split(counts, replicas=r, num_physical=P, num_gpus=G)
    phy = slot_fractions(split, r, counts, P)
    m = r if log2phy is None else A.as_array(log2phy, np.int64, 2, "log2phy")
    if m.shape[0] != r.shape[0]:
        raise ValueError("log2phy has %d rows, the placement %d experts" % (m.shape[0], r.shape[0]))
    owner = np.full(P, -1, np.int64)
    valid = r >= 0
    owner[r[valid]] = np.nonzero(valid)[0]
    _check_log2phy(m, owner)
    return np.where(m >= 0, phy[np.maximum(m, 0)], 0.0).astype(np.float32)


class LPLBSolver:
    """A drop-in for sglang.srt.eplb.lplb_solver.LPLBSolver (0.5.23): the
    same constructor and solve(topk_ids) -> log2phy_prob, the LP's optimum
    computed exactly by libepx on the CPU (no JIT, no Hopper, no cuBLASDx),
    returned as a float32 tensor on topk_ids' device.

    phy2log [P] and log2phy [E][X] are the layer's maps; every rank of
    ep_group must call solve, as in SGLang: the counts are all-reduced
    (ep_group.all_reduce on a float32 tensor, its return value used)."""

    def __init__(self, phy2log, log2phy, num_gpus, ep_group=None,
                 logical_to_all_physical_map_num_valid=None):
        self.log2phy = A.as_array(log2phy, np.int64, 2, "log2phy")
        self.num_logical, self.max_copies = self.log2phy.shape
        p2l = A.as_array(phy2log, np.int64, 1, "phy2log")
        self.num_phy = p2l.shape[0]
        self.num_gpus = A.integer(num_gpus, "num_gpus", 1, A.MAX_GPUS, "EPX_MAX_GPUS")
        if self.num_phy % self.num_gpus:
            raise ValueError("num_phy (%d) is not a multiple of num_gpus (%d): each rank owns "
                             "num_phy // num_gpus consecutive slots"
                             % (self.num_phy, self.num_gpus))
        self.ep_group = ep_group
        if p2l.size and p2l.max() >= self.num_logical:
            raise ValueError("phy2log names logical expert %d but log2phy has %d rows (one per "
                             "logical expert): the two maps are of different layers or models"
                             % (int(p2l.max()), self.num_logical))
        if p2l.size and p2l.min() < 0:
            raise ValueError("phy2log[%d] = %d: every slot holds a logical expert (>= 0)"
                             % (int(np.argmin(p2l)), int(p2l.min())))
        _check_log2phy(self.log2phy, p2l)  # now, not at the first solve
        self.replicas = _full_lists(p2l, self.num_logical)

    def solve(self, topk_ids):
        """log2phy_prob [E][X] float32 for this batch's topk_ids [T][K]."""
        import torch
        counts = torch.from_numpy(count_ids(topk_ids, self.num_logical).astype(np.float32))
        if self.ep_group is not None:
            counts = counts.to(topk_ids.device)
            counts = self.ep_group.all_reduce(counts)
        c = np.rint(counts.detach().cpu().numpy()).astype(np.int64)
        prob = balanced_log2phy_prob(c, replicas=self.replicas, num_physical=self.num_phy,
                                     num_gpus=self.num_gpus, log2phy=self.log2phy)
        return torch.from_numpy(prob).to(topk_ids.device)
