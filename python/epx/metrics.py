"""How well a placement balances a load (include/epx/metrics.h): GPU loads,
balancedness (epx's and SGLang's), the bound no placement can beat, the gap."""
import ctypes
from dataclasses import dataclass

import numpy as np

from . import _arrays as A
from ._native import POINTER, Structure, c_double, c_int32, c_void_p, call, fn
from .layout import Layout

__all__ = ["evaluate", "Evaluation", "gpu_loads", "bound_max_load"]


class LayerBalance(Structure):
    """epx_layer_balance (include/epx/metrics.h)."""
    _fields_ = [("total", c_double), ("mean_gpu_load", c_double), ("max_gpu_load", c_double),
                ("max_gpu", c_int32), ("loaded", c_int32), ("balancedness", c_double),
                ("balancedness_sglang", c_double), ("max_per_replica_opt", c_double),
                ("bound_max_load", c_double), ("bound", c_double)]


class Balance(Structure):
    """epx_balance (include/epx/metrics.h)."""
    _fields_ = [("balancedness", c_double), ("balancedness_sglang", c_double),
                ("bound", c_double), ("gap", c_double), ("num_loaded_layers", c_int32),
                ("worst_layer", c_int32)]


_gpu_loads = fn("epx_gpu_loads", c_int32, c_void_p, POINTER(c_double), POINTER(c_double),
                POINTER(c_double), c_void_p)
_balance = fn("epx_balance_compute", c_int32, c_void_p, POINTER(c_double), POINTER(c_double),
              POINTER(Balance), POINTER(LayerBalance), c_void_p)
_bound = fn("epx_bound_max_load", c_int32, POINTER(c_double), c_int32, c_int32, c_int32,
            POINTER(c_double), POINTER(c_double), POINTER(c_int32), c_void_p)

_LAYER_DTYPE = np.dtype([(f, np.float64 if t is c_double else np.int32)
                         for f, t in LayerBalance._fields_], align=True)


@dataclass
class Evaluation:
    """The figures for one placement and load. `layers` is a numpy record array
    [L] with the per-layer fields of epx_layer_balance; gpu_load is [L][G]."""
    balancedness: float
    balancedness_sglang: float
    bound: float
    gap: float
    num_loaded_layers: int
    worst_layer: int
    layers: np.ndarray
    gpu_load: np.ndarray


def _resolve(placement, num_gpus, num_nodes, replica_weights):
    """A Layout (plus the plan's replica weights) from a Layout, a Plan or a map."""
    if hasattr(placement, "layout") and hasattr(placement, "replica_weights"):
        if replica_weights is None:
            replica_weights = placement.replica_weights
        return placement.layout, replica_weights
    if isinstance(placement, Layout):
        return placement, replica_weights
    if num_gpus is None:
        raise ValueError("evaluating a physical_to_logical_map needs num_gpus")
    return Layout.from_map(placement, num_gpus, num_nodes), replica_weights


def _load(counts, lay):
    a = A.as_array(counts, np.float64, (2, 3), "counts")
    if a.ndim == 3:
        a = np.ascontiguousarray(a.sum(axis=0))  # windows summed, as SGLang plans
    want = (lay.num_layers, lay.num_logical_experts)
    if a.shape != want:
        raise ValueError("counts have shape %s but the placement needs %s (L, E)"
                         % (a.shape, want))
    return a


def _weights(rw, lay):
    """replica_weights as [L][P] doubles, or None."""
    if rw is None:
        return None
    return A.as_shaped(rw, np.float64, (lay.num_layers, lay.num_physical_experts),
                       "replica_weights", "[L][P]")


def gpu_loads(placement, counts, num_gpus=None, num_nodes=1, replica_weights=None):
    """[L][G] load of every GPU (an expert's load split evenly over its replicas,
    or by replica_weights [L][P])."""
    lay, rw = _resolve(placement, num_gpus, num_nodes, replica_weights)
    w = _load(counts, lay)
    rw = _weights(rw, lay)
    out = np.empty((lay.num_layers, lay.num_gpus), dtype=np.float64)
    call(_gpu_loads, lay.handle, A.ptr(w, c_double), A.ptr(rw, c_double), A.ptr(out, c_double))
    return out


def evaluate(placement, counts, num_gpus=None, num_nodes=1, replica_weights=None):
    """Balancedness, bound and gap of a placement (a Layout, a Plan, or a
    physical_to_logical_map with num_gpus) for loads [L][E] or [S][L][E]
    (windows summed). A Plan's replica weights are used unless given."""
    lay, rw = _resolve(placement, num_gpus, num_nodes, replica_weights)
    w = _load(counts, lay)
    rw = _weights(rw, lay)
    L = lay.num_layers
    summary = Balance()
    layers = (LayerBalance * L)()
    call(_balance, lay.handle, A.ptr(w, c_double), A.ptr(rw, c_double), ctypes.byref(summary),
         layers)
    rec = np.frombuffer(layers, dtype=_LAYER_DTYPE, count=L).copy().view(np.recarray)
    return Evaluation(summary.balancedness, summary.balancedness_sglang, summary.bound,
                      summary.gap, summary.num_loaded_layers, summary.worst_layer, rec,
                      gpu_loads(lay, w, replica_weights=rw))


def bound_max_load(load, num_physical, num_gpus):
    """For one layer's load [E]: (bound on the max GPU load, optimal max
    per-replica load, replica counts [E] attaining it)."""
    w = A.as_array(load, np.float64, 1, "load")
    E = w.shape[0]
    b, m = c_double(), c_double()
    reps = np.empty(E, dtype=np.int32)
    P = A.integer(num_physical, "num_physical", 1, A.MAX_PHYSICAL, "4 (E + G) slots at most")
    G = A.integer(num_gpus, "num_gpus", 1, A.MAX_GPUS, "EPX_MAX_GPUS")
    call(_bound, A.ptr(w, c_double), E, P, G, ctypes.byref(b),
         ctypes.byref(m), A.ptr(reps, c_int32))
    return b.value, m.value, reps.astype(np.int64)
