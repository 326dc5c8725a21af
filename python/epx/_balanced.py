"""Balanced per-batch dispatch (include/epx/dispatch.h, part 4), re-exported by
epx.dispatch: each expert's batch tokens split over its replicas so that the
largest GPU load is the least any split reaches (the optimum of SGLang
0.5.23's LP dispatch, exactly), the GPU loads lexicographically minimal,
integer counts within one token of the shares, and topk ids routed by them."""
import ctypes
import threading
from collections import namedtuple
from fractions import Fraction

import numpy as np

from . import _arrays as A
from .layout import Layout
from ._replicas import valid_counts
from ._native import (POINTER, OwnsHandle, Structure, c_double, c_int32, c_int64, c_void_p, call,
                      fn)


class BalancedOut(Structure):
    """epx_balanced_out (include/epx/dispatch.h)."""
    _fields_ = [("shares", POINTER(c_double)), ("replica_counts", POINTER(c_int64)),
                ("slot_counts", POINTER(c_int64)), ("gpu_load", POINTER(c_double)),
                ("max_load_num", c_int64), ("max_load_den", c_int64),
                ("max_load_int", c_int64), ("num_levels", c_int32)]

_create = fn("epx_dispatch_balanced_create", c_int32, c_int32, c_int32, c_int32, c_int32,
             POINTER(c_void_p), c_void_p)
_destroy = fn("epx_dispatch_balanced_destroy", None, c_void_p)
_count = fn("epx_dispatch_count_ids", c_int32, POINTER(c_int32), c_int64, c_int32, c_int32,
            POINTER(c_int64), c_void_p)
_solve = fn("epx_dispatch_balanced_solve", c_int32, c_void_p, POINTER(c_int32), POINTER(c_int32),
            POINTER(c_int64), POINTER(BalancedOut), c_void_p)
_map = fn("epx_dispatch_balanced_map_ids", c_int32, c_void_p, POINTER(c_int32), POINTER(c_int32),
          POINTER(c_int64), POINTER(c_int32), c_int64, c_int32, POINTER(c_int32), c_void_p)
_topk = fn("epx_dispatch_balanced_topk", c_int32, c_void_p, POINTER(c_int32), POINTER(c_int32),
           POINTER(c_int32), c_int64, c_int32, POINTER(c_int32), POINTER(BalancedOut), c_void_p)

BalancedSplit = namedtuple("BalancedSplit", [
    "shares",          # [E][W] float64: share of each replica column (log2phy_prob's form)
    "replica_counts",  # [E][W] int64: integer tokens per replica column
    "slot_counts",     # [P] int64: integer tokens per slot
    "gpu_load",        # [G] float64: fractional tokens per GPU
    "max_load",        # fractions.Fraction: the optimum max GPU load, exactly
    "max_load_int",    # int: the largest integer GPU load, ceil(max_load)
    "num_levels"])     # int: distinct load levels of the lexicographic optimum


class Balancer(OwnsHandle):
    """A balancer sized for E experts, replica lists of width W, P slots on G
    GPUs (slot p on GPU p // (P // G)); reuse it for every layer and batch.
    One call at a time uses its workspace: calls from several threads take
    turns (a lock), so a shared Balancer gives each the right answer."""

    def __init__(self, num_experts, width, num_physical, num_gpus):
        self.E = A.integer(num_experts, "num_experts", 1, A.MAX_EXPERTS, "EPX_MAX_EXPERTS")
        self.W = A.integer(width, "width", 1, 1 << 16, "replica lists of 65,536 at most")
        self.P = A.integer(num_physical, "num_physical", 1, A.MAX_PHYSICAL,
                           "4 (E + G) slots at most")
        self.G = A.integer(num_gpus, "num_gpus", 1, 4096, "the balancer's 4,096 GPUs")
        self._h = c_void_p()
        self._lock = threading.Lock()  # the C workspace serves one call at a time
        call(_create, self.E, self.W, self.P, self.G, ctypes.byref(self._h))

    def __del__(self):
        if getattr(self, "_h", None):
            _destroy(self._h)
            self._h = None

    def _lists(self, replicas):
        """replicas [E][W] checked: int32, and their num_valid [E]."""
        r = np.ascontiguousarray(A.as_array(replicas, np.int32, 2, "replicas"))
        if r.shape != (self.E, self.W):
            raise ValueError("replicas is %s, the balancer was made for [%d][%d]"
                             % (list(r.shape), self.E, self.W))
        return r, valid_counts(r, self.P)

    def solve(self, replicas, counts):
        """The balanced split of one layer's batch: replicas [E][W] slot ids,
        -1 padded at the end; counts [E] tokens per logical expert."""
        r, nv = self._lists(replicas)
        c = A.as_array(counts, np.int64, 1, "counts")
        if c.shape[0] != self.E:
            raise ValueError("counts has %d entries, E is %d" % (c.shape[0], self.E))
        sh = np.empty((self.E, self.W), np.float64)
        rc = np.empty((self.E, self.W), np.int64)
        sc = np.empty(self.P, np.int64)
        gl = np.empty(self.G, np.float64)
        out = BalancedOut(A.ptr(sh, c_double), A.ptr(rc, c_int64), A.ptr(sc, c_int64),
                          A.ptr(gl, c_double), 0, 0, 0, 0)
        with self._lock:
            call(_solve, self._h, A.ptr(r, c_int32), A.ptr(nv, c_int32), A.ptr(c, c_int64),
                 ctypes.byref(out))
        return BalancedSplit(sh, rc, sc, gl, Fraction(out.max_load_num, out.max_load_den),
                             int(out.max_load_int), int(out.num_levels))

    def route(self, replicas, replica_counts, topk_ids):
        """topk_ids [T][K] to slots [T][K] (int64, -1 stays -1): each expert's
        (t, k) pairs, in order, fill its replica columns by replica_counts."""
        r, nv = self._lists(replicas)
        rc = A.as_array(replica_counts, np.int64, 2, "replica_counts")
        if rc.shape != (self.E, self.W):
            raise ValueError("replica_counts is %s, want [%d][%d]"
                             % (list(rc.shape), self.E, self.W))
        ids = A.as_array(topk_ids, np.int32, 2, "topk_ids")
        T, K = ids.shape
        out = np.empty((T, K), np.int32)
        with self._lock:
            call(_map, self._h, A.ptr(r, c_int32), A.ptr(nv, c_int32), A.ptr(rc, c_int64),
                 A.ptr(ids, c_int32), T, K, A.ptr(out, c_int32))
        return out.astype(np.int64)


def count_ids(topk_ids, num_experts):
    """Tokens per logical expert [E] int64 of topk_ids [T][K] (-1 skipped)."""
    ids = A.as_array(topk_ids, np.int32, 2, "topk_ids")
    E = A.integer(num_experts, "num_experts", 1, A.MAX_EXPERTS, "EPX_MAX_EXPERTS")
    out = np.empty(E, np.int64)
    call(_count, A.ptr(ids, c_int32), ids.shape[0], ids.shape[1], E, A.ptr(out, c_int64))
    return out


def _placement(layout, layer, replicas, num_physical, num_gpus):
    given = [n for n, v in (("replicas", replicas), ("num_physical", num_physical),
                            ("num_gpus", num_gpus)) if v is not None]
    if layout is not None and given:
        # a layout carries its own lists and shape: these were dropped without a word
        raise ValueError("give a layout (and layer), or replicas with num_physical and "
                         "num_gpus, not both: %s given beside the layout" % ", ".join(given))
    if layout is None and (isinstance(layer, bool) or layer != 0):
        raise ValueError("layer=%r picks a layer of a layout; replicas are one layer's lists "
                         "already" % (layer,))
    if layout is not None:
        if hasattr(layout, "layout") and hasattr(layout, "replica_weights"):
            layout = layout.layout  # a Plan
        if not isinstance(layout, Layout):
            raise TypeError("layout must be an epx.Layout or epx.Plan, not %s (for lists, pass "
                            "replicas=, num_physical= and num_gpus=)" % type(layout).__name__)
        s = layout.shape
        layer = A.integer(layer, "layer", 0, s["num_layers"] - 1, "num_layers - 1")
        return (layout.logical_to_all_physical_map()[layer], s["num_physical_experts"],
                s["num_gpus"])
    if replicas is None or num_physical is None or num_gpus is None:
        raise ValueError("give a layout (and layer), or replicas with num_physical and num_gpus")
    return (replicas, A.integer(num_physical, "num_physical", 1, A.MAX_PHYSICAL,
                                "4 (E + G) slots at most"),
            A.integer(num_gpus, "num_gpus", 1, 4096, "the balancer's 4,096 GPUs"))


def balanced_split(counts, layout=None, layer=0, replicas=None, num_physical=None, num_gpus=None):
    """The balanced split (BalancedSplit) of one layer's counts [E], for a
    Layout's layer, or for replicas [E][X] (SGLang's
    logical_to_all_physical_map[layer], -1 padded) on num_physical slots
    over num_gpus GPUs. Its shares [E][X] are per column of those lists:
    the form of SGLang's log2phy_prob."""
    r, P, G = _placement(layout, layer, replicas, num_physical, num_gpus)
    r = A.as_array(r, np.int32, 2, "replicas")
    return Balancer(r.shape[0], r.shape[1], P, G).solve(r, counts)


def balanced_topk(topk_ids, layout=None, layer=0, replicas=None, num_physical=None,
                  num_gpus=None):
    """Count, split and route one layer's topk_ids [T][K]: (slots [T][K]
    int64, BalancedSplit). Same placement arguments as balanced_split; a
    torch input gives a torch tensor of slots on its device."""
    torch_in = A.is_torch(topk_ids)
    r, P, G = _placement(layout, layer, replicas, num_physical, num_gpus)
    r = A.as_array(r, np.int32, 2, "replicas")
    b = Balancer(r.shape[0], r.shape[1], P, G)
    split = b.solve(r, count_ids(topk_ids, r.shape[0]))
    slots = b.route(r, split.replica_counts, topk_ids)
    return A.wrap(slots, torch_in, topk_ids.device if torch_in else None), split
