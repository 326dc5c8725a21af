"""SGLang's files (include/epx/io.h): placement mappings, counts, and the
`--init-expert-location` entry point. Paths may end in .json or .pt; a string
starting with '{' is inline JSON, as SGLang accepts it."""
import ctypes

import numpy as np

from ._native import (LOG_FN, POINTER, Counts, Structure, c_char_p, c_int, c_int32,
                      c_path, c_uint32, c_void_p, call, epx_free, fn, sglang_release)
from ._counts import CCounts, counts_destroy, counts_from_c, counts_to_c
from . import _arrays as A
from .layout import PRIVATE, Layout
from .planner import ALGORITHMS, _choice

__all__ = ["read_mapping", "read_counts", "write_mapping", "write_counts",
           "init_expert_location", "counts_to_c", "counts_from_c"]

_mapping_read = fn("epx_mapping_read", c_int32, c_char_p, POINTER(POINTER(c_int32)),
                   POINTER(c_int32), POINTER(c_int32), c_void_p)
_counts_read = fn("epx_counts_read", c_int32, c_char_p, POINTER(POINTER(Counts)), c_void_p)
_counts_write = fn("epx_counts_write_json", c_int32, POINTER(Counts), c_char_p, c_void_p)
_layout_init = fn("epx_layout_init", c_int32, c_char_p, c_void_p, POINTER(c_void_p), c_void_p)


class InitOpts(Structure):
    """epx_init_opts (include/epx/io.h)."""
    _fields_ = [("version", c_uint32), ("num_gpus", c_int32), ("num_nodes", c_int32),
                ("num_logical_experts", c_int32), ("num_layers", c_int32),
                ("num_physical", c_int32), ("num_redundant", c_int32), ("num_groups", c_int32),
                ("log", LOG_FN), ("log_user", c_void_p), ("algorithm", c_int),
                ("sglang_version", c_char_p)]


# The options-struct convention (include/epx.h): version = the struct's size.
INIT_OPTS_VERSION = ctypes.sizeof(InitOpts)


def _spec(spec):
    """A path or inline JSON for C (c_path: str, bytes or PathLike, no NUL)."""
    return c_path(spec, "spec")


def read_mapping(spec):
    """physical_to_logical_map [L][P] int64 from a .json / .pt file or inline JSON."""
    p = POINTER(c_int32)()
    L, P = c_int32(), c_int32()
    call(_mapping_read, _spec(spec), ctypes.byref(p), ctypes.byref(L), ctypes.byref(P))
    try:
        n = L.value * P.value
        return np.ctypeslib.as_array(p, shape=(n,)).reshape(L.value, P.value).astype(np.int64)
    finally:
        epx_free(ctypes.cast(p, c_void_p))


def read_counts(spec, squeeze=False):
    """logical_count from an init file or inline JSON ({"logical_count": [L][E] |
    [S][L][E]}): float64 [S][L][E] ([L][E] reads as S = 1; squeeze=True drops S
    when it is 1)."""
    cp = POINTER(Counts)()
    call(_counts_read, _spec(spec), ctypes.byref(cp))
    try:
        a = counts_from_c(cp)
    finally:
        counts_destroy(cp)
    return a[0] if squeeze and a.shape[0] == 1 else a


def _is_pt(path):
    """SGLang reads a path ending in ".pt" with torch.load, any other as JSON
    (its endswith test, case and all); the writers follow the same rule, as
    the CLI's do, so a file is read back in the format it was written in."""
    return c_path(path).endswith(b".pt")


def write_mapping(path, physical_to_logical_map, num_gpus=1, num_nodes=1):
    """Write {"physical_to_logical_map": [L][P]} atomically, SGLang's init
    format: a .pt file (int64 tensor, epx.pt.write_mapping_pt) when path
    ends in ".pt", else JSON. The map (or a Layout) is validated first
    (every expert needs a replica; P % num_gpus == 0)."""
    if _is_pt(path):
        from .pt import write_mapping_pt
        return write_mapping_pt(path, physical_to_logical_map, num_gpus, num_nodes)
    lay = physical_to_logical_map if isinstance(physical_to_logical_map, Layout) else \
        Layout.from_map(physical_to_logical_map, num_gpus, num_nodes)
    lay.write_json(path)


def write_counts(path, counts):
    """Write {"logical_count": [S][L][E]} ([L][E] when S == 1): a .pt file
    (epx.pt.write_counts_pt, dtype "auto") when path ends in ".pt", else JSON."""
    if _is_pt(path):
        from .pt import write_counts_pt
        return write_counts_pt(path, counts)
    c = CCounts(counts)
    call(_counts_write, c.ptr, c_path(path))


def init_expert_location(spec, num_gpus, num_nodes=1, num_logical_experts=0, num_layers=0,
                         num_physical=0, num_redundant=0, num_groups=0, *, algorithm="auto",
                         sglang_version=None):
    """What SGLang's --init-expert-location takes ("trivial", a .json/.pt path, or
    inline JSON with physical_to_logical_map or logical_count) as a Layout.

    logical_count is planned as SGLang's init_by_eplb plans it: DeepSeek's EPLB
    with SGLang's choice (algorithm="auto", its --eplb-algorithm default:
    hierarchical when num_groups divides over num_nodes; or "deepseek",
    "deepseek-hierarchical"), as release sglang_version's copy runs it (None =
    DeepSeek's original: float32 sums like SGLang <= 0.5.10.post1, but ties to
    the lowest index where those releases follow torch's sort). Pass the
    model's num_groups (n_group: 8 for DeepSeek-V3) as SGLang does; 0 plans
    with the global policy. algorithm="epx" asks for epx's own planner instead
    (sglang_version must then be None)."""
    code = _choice(ALGORITHMS, algorithm, "algorithm")
    sv = None
    if sglang_version is not None:  # a malformed release raises, a newer one warns
        sv = sglang_release(sglang_version, "eplb")[0]
    o = InitOpts(INIT_OPTS_VERSION, A.integer(num_gpus, "num_gpus", 1, A.MAX_GPUS, "EPX_MAX_GPUS"),
                 A.integer(num_nodes, "num_nodes", 1, A.MAX_GPUS, "EPX_MAX_GPUS"),
                 A.integer(num_logical_experts, "num_logical_experts", 0, A.MAX_EXPERTS,
                           "EPX_MAX_EXPERTS; 0 = from the input"),
                 A.integer(num_layers, "num_layers", 0, A.MAX_LAYERS,
                           "EPX_MAX_LAYERS; 0 = from the input"),
                 A.integer(num_physical, "num_physical", 0, A.MAX_PHYSICAL,
                           "4 (E + G) slots at most; 0 = from the input"),
                 A.integer(num_redundant, "num_redundant", 0, A.MAX_PHYSICAL, "slots"),
                 A.integer(num_groups, "num_groups", 0, A.MAX_EXPERTS, "EPX_MAX_EXPERTS"),
                 LOG_FN(), None, code,
                 sv)
    h = c_void_p()
    call(_layout_init, _spec(spec), ctypes.byref(o), ctypes.byref(h))
    return Layout(h, _key=PRIVATE)
