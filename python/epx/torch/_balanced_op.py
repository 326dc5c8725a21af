"""The balanced per-batch dispatch op (torch.ops.epx.balanced_topk): count one
layer's topk ids per logical expert, split each expert over its replicas so
that the largest GPU load is the least any split reaches, and route the ids
by that split (include/epx/dispatch.h part 4). CPU tensors run libepx's
reference (epx_dispatch_balanced_topk), CUDA tensors the GPU kernel
(epx_cuda_dispatch_balanced_topk) on the current stream; both give the same
slots.

Each call needs a workspace sized for (E, W, P, G). They are made on first
use and kept, one per shape (and device), so a batch allocates nothing after
the first; a lock serialises CPU calls sharing one. On CUDA the workspace
is used in stream order: calls that share a shape on one device must run
on one stream (or be ordered), and the first call of a shape must come
before any CUDA graph capture (cudaMalloc cannot be captured).
"""
import ctypes
import threading
from typing import List

import torch

from .. import _arrays as _A
from .. import _balanced
from .._native import c_void_p
from .._native import call as _cpu_call
from . import _gpu
from .._native import EpxError
from ._ops import (_addr, _check_ranks, _count, _device, _int_meta, _int_ptr, _ints, _launch,
                   _refuse_outside, _same_device, _table_arg, eager)

_lock = threading.Lock()
_cpu_balancers = {}
_gpu_balancers = {}


def _cpu_balancer(E, W, P, G):
    key = (E, W, P, G)
    if key not in _cpu_balancers:
        _cpu_balancers[key] = _balanced.Balancer(E, W, P, G)
    return _cpu_balancers[key]


def _gpu_balancer(device, E, W, P, G):
    idx = torch.cuda.current_device() if device.index is None else device.index
    key = (idx, E, W, P, G)
    if key not in _gpu_balancers:
        h = c_void_p()
        with torch.cuda.device(idx):
            _gpu.call(_gpu.balanced_create, E, W, P, G, ctypes.byref(h))
        _gpu_balancers[key] = h
    return _gpu_balancers[key]


def _counts(num_physical, num_ranks):
    _count(num_physical, "num_physical", _A.MAX_PHYSICAL, "4 (E + G) slots at most")
    _count(num_ranks, "num_ranks", _A.MAX_GPUS, "EPX_MAX_GPUS")
    _check_ranks(num_physical, num_ranks, "num_physical", "slots")


def _check(topk_ids, replicas, num_valid, num_physical, num_ranks):
    dev = _device(topk_ids)
    ids = _ints(topk_ids, "topk_ids", 2)
    _same_device("replicas", replicas, dev)
    _same_device("num_valid", num_valid, dev)
    if replicas.dim() != 2:
        raise ValueError("replicas must be [E][W], got shape %s: build it with "
                         "epx.torch.Mapping.balanced" % (tuple(replicas.shape),))
    E = replicas.shape[0]
    replicas = _table_arg("replicas", replicas, E, 2)
    num_valid = _table_arg("num_valid", num_valid, E, 1)
    _counts(num_physical, num_ranks)
    return dev, ids, replicas, num_valid


def impl_balanced_topk(topk_ids: torch.Tensor, replicas: torch.Tensor, num_valid: torch.Tensor,
                       num_physical: int, num_ranks: int) -> List[torch.Tensor]:
    dev, ids, replicas, num_valid = _check(topk_ids, replicas, num_valid, num_physical,
                                           num_ranks)
    E, W = replicas.shape
    T, K = ids.shape
    phys = torch.empty((T, K), dtype=torch.int32, device=dev)
    slot_counts = torch.empty(num_physical, dtype=torch.int64, device=dev)
    if dev.type == "cuda":
        b = _gpu_balancer(dev, E, W, num_physical, num_ranks)
        out = _gpu.BalancedOut(None, None, _addr(slot_counts), None, None)
        _launch(dev, _gpu.balanced_topk, b, _addr(replicas), _addr(num_valid), _addr(ids), T, K,
                _addr(phys), ctypes.byref(out))
        return [phys, slot_counts]
    out = _balanced.BalancedOut(None, None, ctypes.cast(slot_counts.data_ptr(),
                                                        ctypes.POINTER(ctypes.c_int64)),
                                None, 0, 0, 0, 0)
    with _lock:
        b = _cpu_balancer(E, W, num_physical, num_ranks)
        try:
            _cpu_call(_balanced._topk, b._h, _int_ptr(replicas), _int_ptr(num_valid),
                      _int_ptr(ids), T, K, _int_ptr(phys), ctypes.byref(out))
        except EpxError:
            _refuse_outside(ids, E, "topk_ids", "the mapping's num_experts")
            raise
    return [phys, slot_counts]


balanced_topk = torch.library.custom_op("epx::balanced_topk", impl_balanced_topk,
                                        mutates_args=())


@balanced_topk.register_fake
def _(topk_ids, replicas, num_valid, num_physical, num_ranks):
    _int_meta(topk_ids, "topk_ids", 2)
    _counts(num_physical, num_ranks)
    return [torch.empty(tuple(topk_ids.shape), dtype=torch.int32, device=topk_ids.device),
            torch.empty(num_physical, dtype=torch.int64, device=topk_ids.device)]


def run(topk_ids, replicas, num_valid, num_physical, num_ranks):
    """The op, directly when eager (see _ops.eager), else through torch's dispatcher."""
    op = impl_balanced_topk if eager(topk_ids, replicas, num_valid) else \
        torch.ops.epx.balanced_topk
    return op(topk_ids, replicas, num_valid, num_physical, num_ranks)
