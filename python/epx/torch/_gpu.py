"""libepx_cuda.so through ctypes: the library with its CUDA kernels, built by
`pip install ./python` where nvcc is present (setup.py) and shipped beside
libepx.so. It links the CUDA runtime statically, so it needs only the driver,
whatever CUDA runtime torch brought.

Without it (no nvcc at install time) `available()` is False and `reason()`
says so; CPU tensors are still served by libepx.so's references.
"""
import ctypes
import os
from ctypes import POINTER, Structure, c_double, c_int, c_int32, c_int64, c_void_p
from pathlib import Path

from .. import _native
from .._native import EpxError, Status
from ..dispatch import DispatchSpec, TokenLayout

__all__ = ["available", "reason", "library_path", "call", "dispatch_layout", "map_ids",
           "gather_rows", "combine_rows", "TokenLayout", "BalancedOut", "balanced_create",
           "balanced_topk"]


def library_path():
    """$EPX_CUDA_LIBRARY, else libepx_cuda.so beside the package's libepx.so."""
    env = os.environ.get("EPX_CUDA_LIBRARY")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "_lib" / "libepx_cuda.so"


def _load():
    path = library_path()
    if not path.is_file():
        return None, ("this epx install has no GPU library (%s is missing): nvcc was not found "
                      "when `pip install ./python` ran. Re-install where the CUDA toolkit is "
                      "(nvcc on PATH or in /usr/local/cuda), or set EPX_CUDA_LIBRARY to a built "
                      "libepx_cuda.so" % path)
    try:
        return ctypes.CDLL(str(path)), None
    except OSError as e:
        return None, "%s could not be loaded: %s" % (path, e)


_lib, _reason = _load()


# The kernels are built for sm_90 (CMakeLists.txt: cubin and PTX of compute
# 9.0), so they run on Hopper and later; an older GPU gets a sentence, not
# CUDA's "no kernel image".
MIN_CAPABILITY = (9, 0)
_arch_checked = {}


def arch_problem(index):
    """None when device `index` can run the kernels, else why not (cached)."""
    if index not in _arch_checked:
        import torch
        cap = torch.cuda.get_device_capability(index)
        _arch_checked[index] = None if cap >= MIN_CAPABILITY else (
            "libepx_cuda.so is built for sm_90 (Hopper) and later; cuda:%d (%s) is sm_%d%d. "
            "Rebuild with CMAKE_CUDA_ARCHITECTURES naming it, or use CPU tensors"
            % (index, torch.cuda.get_device_name(index), cap[0], cap[1]))
    return _arch_checked[index]


# How reason() begins when the library loaded but torch sees no GPU.
NO_GPU = "torch sees no CUDA GPU"


def available():
    """True when CUDA tensors can be served: the GPU library loaded, torch
    sees a GPU, and the current one is new enough."""
    return reason() is None


def reason():
    """Why CUDA tensors cannot be served, or None when they can."""
    if _lib is None:
        return _reason
    import torch
    if not torch.cuda.is_available():  # the library alone serves nothing without a GPU
        return ("%s (torch.cuda.is_available() is False; torch %s, built for CUDA %s): CPU "
                "tensors are served by libepx.so's references"
                % (NO_GPU, torch.__version__, torch.version.cuda))
    return arch_problem(torch.cuda.current_device())


def _bind(name, *argtypes):
    if _lib is None:
        return None
    f = getattr(_lib, name)
    f.restype = c_int32
    f.argtypes = list(argtypes)
    return f


def call(f, *args):
    """Call a GPU entry point (last argument epx_error*); raise EpxError on failure."""
    if f is None:
        raise EpxError(Status.UNSUPPORTED, "epx.torch got a CUDA tensor, but " + str(_reason))
    return _native.call(f, *args)


dispatch_layout = _bind("epx_cuda_dispatch_layout", POINTER(DispatchSpec), c_void_p, c_int64,
                        c_int32, c_int32, c_int32, c_void_p, POINTER(TokenLayout), c_void_p,
                        c_void_p)
map_ids = _bind("epx_cuda_dispatch_map_ids", POINTER(DispatchSpec), c_void_p, c_int64, c_int32,
                c_void_p, c_void_p, c_void_p)
gather_rows = _bind("epx_cuda_gather_rows", c_void_p, c_int, c_int64, c_int64, c_void_p, c_int64,
                    c_int32, c_void_p, c_void_p, c_void_p)
combine_rows = _bind("epx_cuda_combine_rows", c_void_p, c_int, c_int64, c_void_p, c_void_p,
                     c_int64, c_int32, c_void_p, c_void_p, c_void_p)


class BalancedOut(Structure):
    """epx_cuda_balanced_out (include/epx_cuda.h): device pointers, each optional."""
    _fields_ = [("shares", POINTER(c_double)), ("replica_counts", POINTER(c_int64)),
                ("slot_counts", c_void_p), ("gpu_load", POINTER(c_double)),
                ("summary", POINTER(c_int64))]


balanced_create = _bind("epx_cuda_dispatch_balanced_create", c_int32, c_int32, c_int32, c_int32,
                        POINTER(c_void_p), c_void_p)
balanced_topk = _bind("epx_cuda_dispatch_balanced_topk", c_void_p, c_void_p, c_void_p, c_void_p,
                      c_int64, c_int32, c_void_p, POINTER(BalancedOut), c_void_p, c_void_p)
