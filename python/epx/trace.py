"""Built-in MoE shapes of public models, shapes read from HuggingFace
config.json files (include/epx/model.h), and synthetic expert-load traces
(include/epx/trace.h): what `epx trace synth` writes."""
import ctypes
import os

from ._native import (POINTER, Counts, Structure, c_char_p, c_double, c_int32, c_int64,
                      c_path, c_uint32, c_uint64, c_void_p, call, fn)
from . import _arrays as A
from ._counts import counts_from_c

__all__ = ["model", "models", "synth"]


class Model(Structure):
    """epx_model (include/epx/trace.h)."""
    _fields_ = [("name", c_char_p), ("num_layers", c_int32), ("first_k_dense", c_int32),
                ("num_experts", c_int32), ("top_k", c_int32), ("num_groups", c_int32),
                ("topk_group", c_int32), ("shared_experts", c_int32), ("hidden", c_int32),
                ("moe_intermediate", c_int32)]


class ModelInfo(Structure):
    """epx_model_info (include/epx/model.h): model.name points into name."""
    _fields_ = [("model", Model), ("name", ctypes.c_char * 64), ("family", ctypes.c_char * 16),
                ("from_config", c_int32), ("scoring", c_int32),
                ("routed_scaling_factor", ctypes.c_float), ("norm_topk_prob", c_int32)]


class TraceOpts(Structure):
    """epx_trace_opts (include/epx/trace.h)."""
    _fields_ = [("version", c_uint32), ("num_windows", c_int32), ("tokens", c_int64),
                ("seed", c_uint64), ("skew_lo", c_double), ("skew_hi", c_double),
                ("drift", c_double), ("shift_window", c_int32), ("per_pass", c_int32),
                ("shift_layers", c_double)]


# The options-struct convention (include/epx.h): version = the struct's size.
TRACE_OPTS_VERSION = ctypes.sizeof(TraceOpts)

_lookup = fn("epx_model_lookup", c_int32, c_char_p, POINTER(POINTER(Model)), c_void_p)
_resolve = fn("epx_model_resolve", c_int32, c_char_p, POINTER(ModelInfo), c_void_p)
_list = fn("epx_model_list", POINTER(Model), POINTER(c_int32))
_synth = fn("epx_trace_synth", c_int32, POINTER(Model), POINTER(TraceOpts),
            POINTER(POINTER(Counts)), c_void_p)
_counts_destroy = fn("epx_counts_destroy", None, POINTER(Counts))


def _as_dict(m):
    return {f: (getattr(m, f).decode() if f == "name" else int(getattr(m, f)))
            for f, _ in Model._fields_}


def _find(name):
    """A built-in name or a config.json path (or its folder), resolved; the
    returned epx_model_info owns the name its model points at."""
    info = ModelInfo()
    if not isinstance(name, (str, os.PathLike)):
        # str(None) looked up a model named 'None', str(b"x") one named "b'x'"
        raise TypeError("name must be a model name or a config.json path (str or os.PathLike), "
                        "not %s %r" % (type(name).__name__, name))
    call(_resolve, c_path(name, "name"), ctypes.byref(info))
    return info


def model(name):
    """The shape of a model as a dict: a built-in name ("kimi-k2",
    "deepseek-v3", ...) or a HuggingFace config.json or its folder (the
    "family" key then says how it was read; "built-in" for a name)."""
    info = _find(name)
    d = _as_dict(info.model)
    d["family"] = info.family.decode()
    return d


def models():
    """Every built-in model's shape."""
    n = c_int32()
    p = _list(ctypes.byref(n))
    return [_as_dict(p[i]) for i in range(n.value)]


def synth(name, num_windows=8, tokens=65536, seed=0, skew=(0.8, 1.3), drift=0.1,
          shift_window=0, per_pass=1, shift_layers=None):
    """A synthetic load trace [S][L][E] (float64 holding integers) for a
    model (a built-in name or a config.json path, as model()); dense layers are rows of zeros, as SGLang records them.
    shift_window: hot experts move at that window (in [1, num_windows);
    0 = never) in a share shift_layers of the layers (default 0.5; only
    with a shift); per_pass: each window as that many sparse per-pass rows."""
    p = _find(name)
    try:
        lo, hi = skew  # a pair: skew=1.0 failed as "'float' object is not subscriptable"
        lo, hi = A.real(lo, "skew[0]"), A.real(hi, "skew[1]")
    except (TypeError, ValueError):
        raise TypeError("skew must be a pair (lo, hi) of numbers, the range of each layer's "
                        "sigma, not %r: for one value give (s, s)" % (skew,)) from None
    S = A.integer(num_windows, "num_windows", 1, A.INT32_MAX)
    # a shift at or past the last window, or a share with no shift, would change nothing
    W = A.integer(shift_window, "shift_window", 0, max(S - 1, 0),
                  "num_windows - 1: the windows are 0 .. %d; 0 = no shift" % (S - 1))
    if shift_layers is None:
        shift_layers = 0.5
    elif W == 0:
        raise ValueError("shift_layers=%r applies to a shift only: give shift_window too"
                         % (shift_layers,))
    o = TraceOpts(TRACE_OPTS_VERSION, S,
                  A.integer(tokens, "tokens", 1, 2 ** 63 - 1, "an int64"),
                  A.integer(seed, "seed", 0, 2 ** 64 - 1, "a uint64"),
                  lo, hi, A.real(drift, "drift"), W,
                  A.integer(per_pass, "per_pass", 1, A.INT32_MAX),
                  A.real(shift_layers, "shift_layers"))
    cp = POINTER(Counts)()
    call(_synth, ctypes.byref(p.model), ctypes.byref(o), ctypes.byref(cp))
    try:
        return counts_from_c(cp)
    finally:
        _counts_destroy(cp)
