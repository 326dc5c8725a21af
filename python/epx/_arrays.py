"""numpy in, numpy out; torch tensors accepted and handed back where torch is used.

torch is never imported here unless the caller passed a tensor (or asked for
tensors), so the package works without it.
"""
import ctypes
import numbers
import operator
import sys

import numpy as np

__all__ = ["is_torch", "as_array", "as_shaped", "shape_ints", "ptr", "wrap", "want_torch", "integer", "INT32_MAX",
           "MAX_LAYERS", "MAX_EXPERTS", "MAX_GPUS", "MAX_PHYSICAL"]

# The C types' and include/epx.h's limits (tests/test_abi.py checks the
# header still says so): every Python integer bound for C is checked against
# them before the call, so nothing wraps to int32 and nothing is sized from a
# huge value before libepx sees it.
INT32_MAX = 2 ** 31 - 1
MAX_LAYERS = 65536  # EPX_MAX_LAYERS
MAX_EXPERTS = 1 << 20  # EPX_MAX_EXPERTS
MAX_GPUS = 1 << 16  # EPX_MAX_GPUS
MAX_PHYSICAL = 4 * (MAX_EXPERTS + MAX_GPUS)  # P <= 4 (E + G), README's limits


def integer(x, name, lo=0, hi=INT32_MAX, limit=None):
    """x as a Python int for a C integer argument, checked before the call:
    an integer (int, numpy or 0-d torch integer; not bool, not a float even
    8.0, not a str) in [lo, hi]. TypeError or ValueError naming the argument,
    the value and the range (limit: where hi comes from, e.g. "EPX_MAX_GPUS")."""
    if isinstance(x, (bool, np.bool_)):
        raise TypeError("%s must be an integer, not bool %r" % (name, x))
    try:
        v = operator.index(x)
    except TypeError:
        raise TypeError("%s must be an integer, not %s %r" % (name, type(x).__name__, x)) from None
    if not lo <= v <= hi:
        raise ValueError("%s = %d is outside [%d, %d]%s" % (
            name, v, lo, hi, " (%s)" % limit if limit else
            " (the C int32 range)" if hi == INT32_MAX else ""))
    return v


def real(x, name):
    """x as a Python float for a C double argument: a real number (int,
    float, numpy or 0-d torch), not bool and not a str (float("3") took the
    text "3", float(True) the flag as 1.0). TypeError naming the argument."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        if is_torch(x) and x.dim() == 0 and not x.dtype.is_complex and x.dtype != _torch_bool():
            return float(x)
        raise TypeError("%s must be a number, not %s %r" % (name, type(x).__name__, x))
    return float(x)


def _torch_bool():
    import torch
    return torch.bool


def shape_ints(num_layers, num_logical_experts, num_physical_experts, num_gpus, num_nodes):
    """An epx_shape's five counts, each checked by integer() against its
    limit (a ctypes Shape took 2**32 + 2 GPUs as 2)."""
    return (integer(num_layers, "num_layers", 1, MAX_LAYERS, "EPX_MAX_LAYERS"),
            integer(num_logical_experts, "num_logical_experts", 1, MAX_EXPERTS, "EPX_MAX_EXPERTS"),
            integer(num_physical_experts, "num_physical_experts", 1, MAX_PHYSICAL,
                    "4 (E + G) slots at most"),
            integer(num_gpus, "num_gpus", 1, MAX_GPUS, "EPX_MAX_GPUS"),
            integer(num_nodes, "num_nodes", 1, MAX_GPUS, "EPX_MAX_GPUS"))


def is_torch(x):
    """True for a torch.Tensor. A caller holding one has imported torch already."""
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


def as_array(x, dtype, ndim=None, name="array"):
    """A C-contiguous numpy array of `dtype` holding x (numpy, torch, nested lists).

    A torch tensor is detached and copied to host memory first, as the
    reference functions do with .cpu().
    """
    if is_torch(x):
        if x.is_meta:
            raise ValueError("%s is a meta tensor: it has a shape but no values to read" % name)
        # a negated or conjugated view is read as its values (numpy() refuses the bits)
        x = x.detach().resolve_neg().resolve_conj()
        if x.is_floating_point() and x.dtype not in _NUMPY_FLOATS(x):
            x = x.float()  # bf16 (no numpy dtype): widened exactly, as weight.float()
        x = x.cpu().numpy()
    try:
        src = np.asarray(x)
    except (ValueError, TypeError) as e:  # ragged lists: numpy's own words, no name
        raise ValueError("%s must be a rectangular array of numbers (every row as long): %s"
                         % (name, e)) from None
    _check_numeric(src, name)
    if src.dtype.kind == "c":  # the cast below would drop the imaginary part silently
        raise ValueError("%s holds complex numbers (dtype %s): give real values (take .real "
                         "if the imaginary part is meant to be dropped)" % (name, src.dtype))
    if np.issubdtype(np.dtype(dtype), np.integer) and src.size:
        _check_integral(src, np.dtype(dtype), name)
    a = np.ascontiguousarray(src, dtype=dtype)
    if ndim is not None and a.ndim not in (ndim if isinstance(ndim, tuple) else (ndim,)):
        want = " or ".join("%d" % d for d in (ndim if isinstance(ndim, tuple) else (ndim,)))
        raise ValueError("%s must have %s dimensions, got shape %s" % (name, want, a.shape))
    return a


def as_shaped(x, dtype, shape, name, letters):
    """as_array with exactly `shape` (None: any size on that axis), which is
    what the C call reads: a smaller array was read past its end. ValueError
    naming the argument, its shape and the one needed (letters: "[L][P]")."""
    a = as_array(x, dtype, len(shape), name)
    if any(w is not None and g != w for g, w in zip(a.shape, shape)):
        need = "".join("[%s]" % ("any" if w is None else w) for w in shape)
        raise ValueError("%s has shape %s; it must be %s = %s" % (
            name, "".join("[%d]" % g for g in a.shape), letters, need))
    return a


def _check_numeric(src, name):
    """Strings, bytes, dates and arbitrary objects are no numbers: numpy's
    casts failed in its own words (_UFuncNoLoopError) or parsed "1" as 1."""
    if src.dtype.kind in "USVMm":
        raise TypeError("%s must hold numbers, not %s (dtype %s)"
                        % (name, "strings" if src.dtype.kind in "US" else "non-numbers",
                           src.dtype))
    if src.dtype.kind == "O":
        for v in src.flat:
            if not isinstance(v, numbers.Real):  # str, None, complex, a nested list
                raise TypeError("%s must hold numbers, not %s %r" % (name, type(v).__name__, v))


def _check_integral(src, dtype, name):
    """Values going into an integer array must be whole and fit: a fraction
    would be truncated and a large value wrapped, silently."""
    info = np.iinfo(dtype)
    if src.dtype.kind == "b":
        raise ValueError("%s must hold integers, not booleans" % name)
    if src.dtype.kind == "O":
        # each element on its own: int() cut Fraction(3, 2) and np.float32(1.5)
        vals = []
        for idx, v in np.ndenumerate(src):
            if isinstance(v, (bool, np.bool_)):
                raise ValueError("%s%s is %r: give integers, not booleans" % (name, list(idx), v))
            if isinstance(v, (int, np.integer)):
                vals.append(int(v))
                continue
            whole = None
            if isinstance(v, numbers.Real):
                try:
                    whole = int(v)
                except (OverflowError, ValueError):  # inf, nan
                    pass
            if whole is None or v != whole:
                raise ValueError("%s%s = %r is not a whole number: give integers (a fraction "
                                 "would be cut off)" % (name, list(idx), v))
            vals.append(whole)
        src = np.array(vals, dtype=object).reshape(src.shape)
    if src.dtype.kind == "f":
        bad = np.argwhere(~np.isfinite(src) | (src != np.trunc(src)))
        if len(bad):
            idx = tuple(int(i) for i in bad[0])
            raise ValueError("%s%s = %r is not a whole number: give integers (a fraction would "
                             "be cut off)" % (name, list(idx), float(src[idx])))
    lo, hi = src.min(), src.max()
    if lo < info.min or hi > info.max:
        v = lo if lo < info.min else hi
        raise ValueError("%s holds %d, outside %s's range [%d, %d]"
                         % (name, int(v), dtype.name, info.min, info.max))


def _NUMPY_FLOATS(t):
    """torch's floating dtypes numpy can hold."""
    import torch
    return (torch.float16, torch.float32, torch.float64)


def py_seed(seed, name="seed"):
    """A seed as CPython's random.Random(seed) reads an int: its absolute
    value (so -1 is 1). epx's generator takes 64 bits, so |seed| >= 2**64 is
    refused, not folded into another seed; a float is refused."""
    v = integer(seed, name, -(2 ** 64 - 1), 2 ** 64 - 1,
                "|seed| < 2**64, the seeds epx's random.Random takes")
    return abs(v)


def ptr(a, ctype):
    """A ctypes pointer to the first element of a C-contiguous array (None for None)."""
    if a is None:
        return None
    assert a.flags["C_CONTIGUOUS"]
    return a.ctypes.data_as(ctypes.POINTER(ctype))


def want_torch(as_torch, *inputs):
    """Resolve the as_torch argument: True/False as given, None = like the inputs."""
    if as_torch is None:
        return any(is_torch(x) for x in inputs)
    return bool(as_torch)


def wrap(a, torch_out, device=None):
    """Return numpy array a as is, or as a torch tensor (on `device` when given)."""
    if not torch_out:
        return a
    import torch
    t = torch.from_numpy(np.ascontiguousarray(a))
    if device is not None and str(device) != "cpu":
        t = t.to(device)
    return t
