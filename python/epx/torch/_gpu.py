"""libepx_cuda.so through ctypes: the library with its CUDA kernels, built by
`pip install ./python` where nvcc is present (setup.py) and shipped beside
libepx.so. It links the CUDA runtime statically, so it needs only the driver,
whatever CUDA runtime torch brought.

Without it (no nvcc at install time) `available()` is False and `reason()`
says so; CPU tensors are still served by libepx.so's references.
"""
import ctypes
import os
from ctypes import POINTER, c_int, c_int32, c_int64, c_void_p
from pathlib import Path

from .._native import EpxError, Error, Status
from ..dispatch import DispatchSpec, TokenLayout

__all__ = ["available", "reason", "library_path", "call", "dispatch_layout", "map_ids",
           "gather_rows", "combine_rows", "TokenLayout"]


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


def available():
    """True when CUDA tensors can be served (the GPU library loaded)."""
    return _lib is not None


def reason():
    """Why CUDA tensors cannot be served, or None when they can."""
    return _reason


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
        raise EpxError(Status.UNSUPPORTED, "epx.torch got a CUDA tensor, but " + _reason)
    err = Error()
    st = f(*args, ctypes.byref(err))
    if st != 0:
        raise EpxError(st, err.msg.decode("utf-8", "replace") or "(no message)")


dispatch_layout = _bind("epx_cuda_dispatch_layout", POINTER(DispatchSpec), c_void_p, c_int64,
                        c_int32, c_int32, c_int32, c_void_p, POINTER(TokenLayout), c_void_p,
                        c_void_p)
map_ids = _bind("epx_cuda_dispatch_map_ids", POINTER(DispatchSpec), c_void_p, c_int64, c_int32,
                c_void_p, c_void_p, c_void_p)
gather_rows = _bind("epx_cuda_gather_rows", c_void_p, c_int, c_int64, c_int64, c_void_p, c_int64,
                    c_int32, c_void_p, c_void_p, c_void_p)
combine_rows = _bind("epx_cuda_combine_rows", c_void_p, c_int, c_int64, c_void_p, c_void_p,
                     c_int64, c_int32, c_void_p, c_void_p, c_void_p)
