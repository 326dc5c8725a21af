"""PyTorch .pt files without torch (include/epx/pt.h): libepx's restricted
unpickler, which builds tensors, dicts, lists, tuples and scalars and refuses
every other global (EpxError REFUSED) without running anything.

  load(path)                      the object tree, tensors as numpy arrays
  read_dump(spec)                 SGLang expert-distribution dumps -> counts [S][L][E]
  write_mapping_pt / write_counts_pt   files torch.load(weights_only=True) reads
"""
import ctypes
import sys

import numpy as np

from . import _arrays as A
from ._native import (POINTER, Counts, EpxError, Status, Structure, c_char_p, c_double, c_int,
                      c_int32, c_int64, c_path, c_size_t, c_void_p, call, fn)
from ._counts import CCounts, counts_from_c
from .layout import Layout

__all__ = ["load", "read_dump", "write_mapping_pt", "write_counts_pt"]

MAX_DIMS = 16
if sys.byteorder != "little":  # pragma: no cover
    raise ImportError("epx.pt reads little-endian storages in place: big-endian hosts "
                      "are not supported")


class Tensor(Structure):
    """epx_pt_tensor (include/epx/pt.h)."""
    _fields_ = [("dtype", c_int), ("ndim", c_int32), ("shape", c_int64 * MAX_DIMS),
                ("strides", c_int64 * MAX_DIMS), ("storage_offset", c_int64),
                ("storage_numel", c_int64), ("storage", c_void_p)]


# epx_pt_kind
NONE, BOOL, INT, FLOAT, STRING, LIST, TUPLE, DICT, TENSOR = range(9)
# epx_pt_dtype -> numpy (bfloat16 is widened to float32: numpy has no bfloat16)
_DTYPES = {0: np.float64, 1: np.float32, 2: np.float16, 3: "bfloat16", 4: np.int64,
           5: np.int32, 6: np.int16, 7: np.int8, 8: np.uint8, 9: np.bool_}
_DTYPE_CODES = {"int64": 4, "int32": 5, "float32": 1, "float64": 0, "auto": -1}

_load = fn("epx_pt_load", c_int32, c_char_p, POINTER(c_void_p), c_void_p)
_destroy = fn("epx_pt_file_destroy", None, c_void_p)
_root = fn("epx_pt_file_root", c_void_p, c_void_p)
_kind = fn("epx_pt_value_kind", c_int, c_void_p)
_int = fn("epx_pt_value_int", c_int32, c_void_p, POINTER(c_int64), c_void_p)
_float = fn("epx_pt_value_float", c_int32, c_void_p, POINTER(c_double), c_void_p)
_string = fn("epx_pt_value_string", c_void_p, c_void_p, POINTER(c_size_t))
_len = fn("epx_pt_value_len", c_size_t, c_void_p)
_item = fn("epx_pt_value_item", c_void_p, c_void_p, c_size_t)
_dict_key = fn("epx_pt_dict_key", c_void_p, c_void_p, c_size_t)
_dict_value = fn("epx_pt_dict_value", c_void_p, c_void_p, c_size_t)
_tensor = fn("epx_pt_value_tensor", c_int32, c_void_p, POINTER(Tensor), c_void_p)
_numel = fn("epx_pt_tensor_numel", c_int32, POINTER(Tensor), POINTER(c_int64), c_void_p)
_dtype_size = fn("epx_pt_dtype_size", c_size_t, c_int)
_counts_read_pt = fn("epx_counts_read_pt", c_int32, c_char_p, POINTER(POINTER(Counts)),
                     c_void_p)
_counts_destroy = fn("epx_counts_destroy", None, POINTER(Counts))
_layout_write_pt = fn("epx_layout_write_pt", c_int32, c_void_p, c_char_p, c_void_p)
_counts_write_pt = fn("epx_counts_write_pt", c_int32, POINTER(Counts), c_char_p, c_int,
                      c_void_p)


def _tensor_to_numpy(v):
    t = Tensor()
    call(_tensor, v, ctypes.byref(t))
    n = c_int64()
    call(_numel, ctypes.byref(t), ctypes.byref(n))  # every element inside the storage
    if t.dtype not in _DTYPES:
        raise EpxError(Status.UNSUPPORTED, "tensor dtype code %d is not known to this binding"
                       % t.dtype)
    size = int(_dtype_size(t.dtype))
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if n.value == 0 or not t.storage:
        flat = np.zeros(0, dtype=np.uint8)
    else:
        raw = (ctypes.c_uint8 * (t.storage_numel * size)).from_address(t.storage)
        flat = np.frombuffer(raw, dtype=np.uint8)
    # .pt storages are little-endian, as is every host libepx builds for (x86-64, arm64).
    store = np.dtype(np.uint16) if _DTYPES[t.dtype] == "bfloat16" else np.dtype(_DTYPES[t.dtype])
    if n.value == 0:
        out = np.zeros(shape, dtype=store)
    else:
        base = flat.view(store)
        strides = tuple(t.strides[i] * size for i in range(t.ndim))
        view = np.lib.stride_tricks.as_strided(base[t.storage_offset:], shape=shape,
                                               strides=strides)
        out = np.array(view, order="C")  # a copy: the file's bytes go with the file
    if _DTYPES[t.dtype] == "bfloat16":
        out = (out.astype(np.uint32) << 16).view(np.float32)
    return out


def _convert(v, tensor):
    k = _kind(v)
    if k == NONE:
        return None
    if k in (BOOL, INT):
        x = c_int64()
        call(_int, v, ctypes.byref(x))
        return bool(x.value) if k == BOOL else int(x.value)
    if k == FLOAT:
        x = c_double()
        call(_float, v, ctypes.byref(x))
        return float(x.value)
    if k == STRING:
        n = c_size_t()
        p = _string(v, ctypes.byref(n))
        return ctypes.string_at(p, n.value).decode("utf-8", "surrogateescape")
    if k in (LIST, TUPLE):
        items = [_convert(_item(v, i), tensor) for i in range(_len(v))]
        return items if k == LIST else tuple(items)
    if k == DICT:
        return {_convert(_dict_key(v, i), tensor): _convert(_dict_value(v, i), tensor)
                for i in range(_len(v))}
    if k == TENSOR:
        return tensor(_tensor_to_numpy(v))
    raise EpxError(Status.UNSUPPORTED, "value kind %d is not known to this binding" % k)


def load(path, *, as_torch=False):
    """The object a .pt file holds, as torch.load(path, weights_only=True) would
    give it, with tensors as numpy arrays (as_torch=True: torch tensors).
    Raises EpxError: REFUSED for a pickle that asks for any other global
    (nothing is executed), PARSE / IO / UNSUPPORTED with libepx's message."""
    h = c_void_p()
    call(_load, c_path(path), ctypes.byref(h))
    try:
        return _convert(_root(h), (lambda a: A.wrap(a, True)) if as_torch else (lambda a: a))
    finally:
        _destroy(h)


def read_dump(spec, *, squeeze=False):
    """Counts [S][L][E] float64 from SGLang's expert-distribution dumps: one
    .pt path, a list of paths, or a directory of them (one file per rank).
    Stat dumps give their windows; per_pass dumps are summed over ranks per
    forward pass and mapped to logical experts, as SGLang does."""
    if isinstance(spec, (list, tuple)):
        items = [c_path(p, "spec[%d]" % i) for i, p in enumerate(spec)]
        for i, b in enumerate(items):  # the list reaches C as "a,b": a comma would split a path
            if b"," in b:
                raise ValueError("spec[%d] (%r) holds a comma, which separates the paths of a list: "
                                 "pass that file alone, or rename it" % (i, spec[i]))
        spec = b",".join(items)
    cp = POINTER(Counts)()
    call(_counts_read_pt, c_path(spec, "spec"), ctypes.byref(cp))
    try:
        a = counts_from_c(cp)
    finally:
        _counts_destroy(cp)
    return a[0] if squeeze and a.shape[0] == 1 else a


def write_mapping_pt(path, physical_to_logical_map, num_gpus=1, num_nodes=1):
    """Write {"physical_to_logical_map": int64 [L][P]} as a .pt init file."""
    lay = physical_to_logical_map if isinstance(physical_to_logical_map, Layout) else \
        Layout.from_map(physical_to_logical_map, num_gpus, num_nodes)
    call(_layout_write_pt, lay.handle, c_path(path))


def write_counts_pt(path, counts, dtype="auto"):
    """Write {"logical_count": [L][E] or [S][L][E]} as a .pt init file;
    dtype "int64", "int32", "float32", "float64" or "auto"."""
    if dtype not in _DTYPE_CODES:
        raise ValueError("dtype must be one of %s" % ", ".join(_DTYPE_CODES))
    c = CCounts(counts)
    call(_counts_write_pt, c.ptr, c_path(path), _DTYPE_CODES[dtype])
