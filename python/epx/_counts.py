"""epx_counts (include/epx/counts.h) between numpy and C: the owned struct
the planner, the file readers and the trace recorder hand to libepx, and the
copy back. It sits below io, planner, pt and trace so that none of them
imports another for it (io uses the planner's option tables, so the planner
must not import io)."""
import ctypes

import numpy as np

from . import _arrays as A
from ._native import POINTER, Counts, OwnsHandle, call, fn

__all__ = ["CCounts", "counts_to_c", "counts_from_c"]

_counts_create = fn("epx_counts_create", ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                    ctypes.c_int32, POINTER(POINTER(Counts)), ctypes.c_void_p)
counts_destroy = fn("epx_counts_destroy", None, POINTER(Counts))


def counts_from_c(cp):
    """Copy an epx_counts* into a float64 numpy array [S][L][E] (does not free it)."""
    c = cp.contents
    shape = (c.num_windows, c.num_layers, c.num_experts)
    n = shape[0] * shape[1] * shape[2]
    return np.ctypeslib.as_array(c.data, shape=(n,)).reshape(shape).copy()


class CCounts(OwnsHandle):
    """An owned epx_counts* filled from a numpy array; freed with the object."""

    def __init__(self, counts):
        a = A.as_array(counts, np.float64, (2, 3), "counts")
        if a.ndim == 2:
            a = a[None]
        S, L, E = a.shape
        self.ptr = POINTER(Counts)()
        call(_counts_create, S, L, E, ctypes.byref(self.ptr))
        ctypes.memmove(self.ptr.contents.data, a.ctypes.data, a.nbytes)
        self.shape = a.shape

    def __del__(self):
        if getattr(self, "ptr", None):
            counts_destroy(self.ptr)
            self.ptr = None


def counts_to_c(counts):
    """An owned epx_counts (CCounts) from [L][E] or [S][L][E] loads."""
    return CCounts(counts)
