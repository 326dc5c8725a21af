"""Mapping: how one layer's logical expert ids become physical slots, as the
tensors the kernels read (epx_dispatch_spec in include/epx/dispatch.h).

Built once per layer (and per placement) on the CPU, checked there, then
moved to the device with .to(); map_ids reads it every batch. The checks
matter: the CUDA kernels trust the tables they are given.
"""
import ctypes

import numpy as np
import torch

from .. import _arrays as _A
from .. import dispatch as _dispatch
from .._native import call as _cpu_call
from .._replicas import valid_counts
from ..layout import Layout as _Layout

__all__ = ["Mapping", "BALANCED"]

# Balanced dispatch is no epx_dispatch_spec mode: it reads the whole batch
# (epx.torch.balanced_topk), so its Mapping carries this marker instead.
BALANCED = "balanced"


def _int32(a, name, ndim):
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    a = np.asarray(a)
    if a.ndim != ndim or not np.issubdtype(a.dtype, np.integer):
        raise ValueError("%s must be an integer array with %d dimension(s), got %s %s"
                         % (name, ndim, a.dtype, a.shape))
    bad = np.argwhere((a < -(1 << 31)) | (a > (1 << 31) - 1)) if a.size else []
    if len(bad):
        idx = tuple(int(i) for i in bad[0])
        raise ValueError("%s%s = %d does not fit in int32" % (name, list(idx), int(a[idx])))
    return np.ascontiguousarray(a, dtype=np.int32)


def _num_physical(num_physical):
    """num_physical checked before anything is sized from it (no int32 wrap)."""
    return _A.integer(num_physical, "num_physical", 1, _A.MAX_PHYSICAL, "4 (E + G) slots at most")


def _check_slots(name, slots, num_physical):
    bad = np.argwhere((slots < 0) | (slots >= num_physical))
    if bad.size:
        idx = tuple(int(i) for i in bad[0])
        raise ValueError("%s%s is %d: slots are in [0, %d) (num_physical)"
                         % (name, list(idx), int(slots[idx]), num_physical))


def _replica_rows(replicas, num_valid, num_physical):
    """replicas [E][W] (-1 padding last) and num_valid [E], checked."""
    reps = _int32(replicas, "replicas", 2)
    E = reps.shape[0]
    nv = valid_counts(reps, num_physical)
    if num_valid is not None:
        given = _int32(num_valid, "num_valid", 1)
        if given.shape != (E,):
            raise ValueError("num_valid has %d entries for %d experts" % (given.shape[0], E))
        differ = np.nonzero(given != nv)[0]
        if differ.size:
            e = int(differ[0])
            raise ValueError("num_valid[%d] is %d, but replicas[%d] holds %d slots before its "
                             "-1 padding: give the count of its slots, or leave num_valid out"
                             % (e, int(given[e]), e, int(nv[e])))
    listed = reps >= 0
    # a slot holds one expert: listed by two, one's tokens would land on the other's
    slots, experts = reps[listed], np.nonzero(listed)[0]
    order = np.argsort(slots, kind="stable")
    twice = np.nonzero(slots[order][1:] == slots[order][:-1])[0]
    if twice.size:
        a, b = order[twice[0]], order[twice[0] + 1]
        raise ValueError("slot %d is listed by expert %d and by expert %d: a slot is listed "
                         "once, by the expert it holds" % (int(slots[a]), int(experts[a]),
                                                           int(experts[b])))
    return reps, nv


class Mapping:
    """One layer's logical -> physical mapping. Use the constructors:

    Mapping.static(table_row, num_physical)      slot = table_row[e] (this rank's
                                                 row of a static dispatch table)
    Mapping.dynamic(replicas, num_physical)      uniform over expert e's replicas
    Mapping.weighted(replicas, slot_weights, num_physical)
                                                 by per-slot shares (a Plan's
                                                 replica_weights row)
    Mapping.balanced(replicas, num_physical, num_ranks)
                                                 each batch split exactly: the
                                                 least max GPU load (balanced_topk)
    Mapping.from_layout(layout, layer, ...)      from an epx.Layout or epx.Plan

    replicas [E][W]: expert e's slots first, -1 padding after (num_valid
    counts them unless given). Tensors are int32 on .device.
    """

    def __init__(self, mode, num_experts, num_physical, table=None, replicas=None,
                 num_valid=None, thresholds=None, num_ranks=None):
        self.mode, self.num_experts, self.num_physical = mode, num_experts, num_physical
        self.num_ranks = num_ranks  # balanced only: GPU g holds slots g*P/G .. (g+1)*P/G - 1
        self.table, self.replicas, self.num_valid = table, replicas, num_valid
        self.thresholds = thresholds

    @property
    def device(self):
        return next(t.device for t in (self.table, self.replicas) if t is not None)

    def to(self, device):
        """This mapping with its tensors on `device`."""
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Mapping(self.mode, self.num_experts, self.num_physical, move(self.table),
                       move(self.replicas), move(self.num_valid), move(self.thresholds),
                       self.num_ranks)

    def __repr__(self):
        mode = {v: k for k, v in _dispatch.DISPATCH_MODES.items()}.get(self.mode, self.mode)
        return "Mapping(%s, E=%d, P=%d, device=%s)" % (mode, self.num_experts,
                                                       self.num_physical, self.device)

    @classmethod
    def static(cls, table_row, num_physical):
        P = _num_physical(num_physical)
        t = _int32(table_row, "table_row", 1)
        _check_slots("table_row", t, P)
        return cls(_dispatch.DISPATCH_MODES["static"], t.shape[0], P,
                   table=torch.from_numpy(t))

    @classmethod
    def dynamic(cls, replicas, num_physical, num_valid=None):
        P = _num_physical(num_physical)
        reps, nv = _replica_rows(replicas, num_valid, P)
        return cls(_dispatch.DISPATCH_MODES["dynamic"], reps.shape[0], P,
                   replicas=torch.from_numpy(reps), num_valid=torch.from_numpy(nv))

    @classmethod
    def balanced(cls, replicas, num_physical, num_ranks, num_valid=None):
        P = _num_physical(num_physical)
        G = _A.integer(num_ranks, "num_ranks", 1, _A.MAX_GPUS, "EPX_MAX_GPUS")
        if P % G:
            raise ValueError("num_physical (%d) is not a multiple of num_ranks (%d): rank r "
                             "holds slots r*P/G .. (r+1)*P/G - 1" % (P, G))
        reps, nv = _replica_rows(replicas, num_valid, P)
        return cls(BALANCED, reps.shape[0], P, replicas=torch.from_numpy(reps),
                   num_valid=torch.from_numpy(nv), num_ranks=G)

    @classmethod
    def weighted(cls, replicas, slot_weights, num_physical, num_valid=None):
        P = _num_physical(num_physical)
        reps, nv = _replica_rows(replicas, num_valid, P)
        w = slot_weights.detach().cpu().numpy() if isinstance(slot_weights, torch.Tensor) \
            else slot_weights
        w = np.asarray(w)
        if not (np.issubdtype(w.dtype, np.floating) or np.issubdtype(w.dtype, np.integer) or
                w.dtype == np.bool_):
            # complex would keep only its real part; str/object reach numpy's own message
            raise ValueError("slot_weights must be real numbers, got %s: one share per "
                             "physical slot (a Plan's replica_weights row)"
                             % ("complex" if np.iscomplexobj(w) else w.dtype.str))
        w = np.ascontiguousarray(w, dtype=np.float64)
        if w.shape != (P,):
            raise ValueError("slot_weights must be [num_physical] = [%d], got %s" % (P, w.shape))
        E, W = reps.shape
        th = np.empty((E, W), dtype=np.uint32)
        ip = lambda a: a.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))  # noqa: E731
        _cpu_call(_dispatch._thresholds, ip(reps), ip(nv), 1, E, W,
                  w.ctypes.data_as(ctypes.POINTER(ctypes.c_double)), P,
                  th.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)))
        return cls(_dispatch.DISPATCH_MODES["weighted"], E, P, replicas=torch.from_numpy(reps),
                   num_valid=torch.from_numpy(nv),
                   thresholds=torch.from_numpy(th.view(np.int32)))  # the same 32 bits

    @classmethod
    def from_layout(cls, layout, layer, mode="weighted", table=None, ep_rank=0):
        """Layer `layer` of an epx.Layout or epx.Plan: "static" takes `table`
        [G][L][E] (epx.static_table) row ep_rank; "dynamic" the layout's
        replicas; "weighted" a Plan's replica_weights; "balanced" the
        layout's replicas, split per batch over its GPUs."""
        weights = getattr(layout, "replica_weights", None)
        lay = layout.layout if hasattr(layout, "layout") else layout
        if not isinstance(lay, _Layout):
            raise TypeError("layout must be an epx.Layout or epx.Plan, not %s"
                            % type(layout).__name__)
        s = lay.shape
        L, P = s["num_layers"], s["num_physical_experts"]
        layer = _A.integer(layer, "layer", 0, L - 1, "num_layers - 1")
        if mode == "static":
            if table is None:
                raise ValueError("mode='static' needs table [G][L][E] (epx.static_table)")
            tab = np.asarray(table)
            want = (s["num_gpus"], L, s["num_logical_experts"])
            if tab.shape != want:
                raise ValueError("table must be [G][L][E] = %s for this layout "
                                 "(epx.static_table), got shape %s" % (list(want), tab.shape))
            rank = _A.integer(ep_rank, "ep_rank", 0, tab.shape[0] - 1, "the table's ranks - 1")
            m = cls.static(tab[rank, layer], P)
            row = m.table.numpy()
            _dispatch._check_holds(lay.physical_to_logical_map, row, "table", layer,
                                   np.arange(row.shape[0]), lambda i: (rank, layer) + i)
            return m
        reps = lay.logical_to_all_physical_map(lay.max_replicas)[layer]
        nv = np.asarray(lay.num_valid)[layer]
        if mode == "dynamic":
            return cls.dynamic(reps, P, nv)
        if mode == BALANCED:
            return cls.balanced(reps, P, s["num_gpus"], nv)
        if mode == "weighted":
            if weights is None:
                raise ValueError("mode='weighted' needs a Plan (its replica_weights); a Layout "
                                 "has none: use mode='dynamic' or Mapping.weighted")
            return cls.weighted(reps, np.asarray(weights)[layer], P, nv)
        raise ValueError("mode must be 'static', 'dynamic', 'weighted' or 'balanced', got %r"
                         % (mode,))
