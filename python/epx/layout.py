"""The layout handle (include/epx/layout.h): which logical expert each physical
slot holds, per layer, and the maps derived from it (SGLang's
ExpertLocationMetadata)."""
import ctypes

import numpy as np

from . import _arrays as A
from ._native import POINTER, OwnsHandle, Shape, c_int32, c_path, c_void_p, call, fn

__all__ = ["Layout"]

LAYOUT_MAKERS = "Layout.from_map, Layout.trivial, epx.plan or epx.init_expert_location"

_create_trivial = fn("epx_layout_create_trivial", c_int32, POINTER(Shape), POINTER(c_void_p),
                     c_void_p)
_create_from_map = fn("epx_layout_create_from_map", c_int32, POINTER(Shape), POINTER(c_int32),
                      POINTER(c_void_p), c_void_p)
_destroy = fn("epx_layout_destroy", None, c_void_p)
_clone = fn("epx_layout_clone", c_int32, c_void_p, POINTER(c_void_p), c_void_p)
_shape = fn("epx_layout_shape", POINTER(Shape), c_void_p)
_p2l = fn("epx_layout_physical_to_logical", POINTER(c_int32), c_void_p)
_num_valid = fn("epx_layout_num_valid", POINTER(c_int32), c_void_p)
_max_replicas = fn("epx_layout_max_replicas", c_int32, c_void_p)
_l2all = fn("epx_layout_logical_to_all_physical", POINTER(c_int32), c_void_p, POINTER(c_int32))
_export_l2all = fn("epx_layout_export_logical_to_all_physical", c_int32, c_void_p, c_int32,
                   POINTER(c_int32), c_void_p)
_write_json = fn("epx_layout_write_json", c_int32, c_void_p, ctypes.c_char_p, c_void_p)


def _copy(p, shape):
    n = int(np.prod(shape))
    return np.ctypeslib.as_array(p, shape=(n,)).reshape(shape).astype(np.int64)


def _handle(h, cls, how):
    """A libepx handle (a non-NULL ctypes.c_void_p) for a wrapper class: any
    other value reached C as a pointer and crashed on first use."""
    if not isinstance(h, ctypes.c_void_p) or not h.value:
        raise TypeError("%s(handle) wraps a handle libepx made, not %r: build one with %s"
                        % (cls, h, how))
    return h


# The key only this package's constructors pass to Layout(...) and Plan(...).
# Who frees a handle is decided where it is made: a wrapper built from a raw
# handle (layout.handle, a plan's layout handle, another object's) would free
# memory it does not own (a double free) or read a layout as a plan.
PRIVATE = object()


def refuse_raw(cls, key, handle, how):
    """The check of Layout(...) and Plan(...): only the package's own
    constructors (which pass PRIVATE) may wrap a handle."""
    if key is not PRIVATE:
        _handle(handle, cls, how)  # the message for a value that is no handle at all
        raise TypeError("%s(handle) is not public: a handle is wrapped once, by the call that "
                        "made it (its wrapper frees it), so a second wrapper would free it "
                        "again. Build one with %s; to share one, pass the %s object itself"
                        % (cls, how, cls))


class Layout(OwnsHandle):
    """An epx_layout. Build one with Layout.from_map / Layout.trivial, or get one
    from epx.plan(...) or epx.init_expert_location(...). Maps come back as
    int64 numpy arrays (copies), as SGLang keeps them.

    Ownership: Layout(handle) is not a public constructor (TypeError). Each
    handle has exactly one owner: a Layout made by from_map, trivial, clone or
    init_expert_location owns and frees its handle; a Plan's .layout borrows
    the plan's (the plan frees it, and the view keeps the plan alive).
    .handle is for passing to C, never for wrapping again."""

    __slots__ = ("_h", "_owner")

    def __init__(self, handle, owner=None, _key=None):
        # owner: an object (a Plan) that owns the handle; None = we own it.
        self._h = None
        self._owner = owner
        refuse_raw("Layout", _key, handle, LAYOUT_MAKERS)
        self._h = _handle(handle, "Layout", LAYOUT_MAKERS)

    def __del__(self):
        if getattr(self, "_owner", 1) is None and getattr(self, "_h", None):
            _destroy(self._h)
            self._h = None

    @classmethod
    def trivial(cls, num_layers, num_logical_experts, num_physical_experts, num_gpus,
                num_nodes=1):
        """Slot p of every layer holds expert p % E (SGLang's init_trivial)."""
        s = Shape(*A.shape_ints(num_layers, num_logical_experts, num_physical_experts, num_gpus,
                                num_nodes))
        h = c_void_p()
        call(_create_trivial, ctypes.byref(s), ctypes.byref(h))
        return cls(h, _key=PRIVATE)

    @classmethod
    def from_map(cls, physical_to_logical_map, num_gpus, num_nodes=1, num_logical_experts=None):
        """A layout from physical_to_logical_map [L][P] (numpy, torch or lists).
        E defaults to max id + 1. Raises EpxError(INVALID_MAP) naming the layer,
        slot and id of a bad entry, or the expert left without a replica."""
        m = A.as_array(physical_to_logical_map, np.int64, 2, "physical_to_logical_map")
        if m.size and (m.min() < np.iinfo(np.int32).min or m.max() > np.iinfo(np.int32).max):
            raise ValueError("physical_to_logical_map holds ids outside int32")
        m32 = np.ascontiguousarray(m, dtype=np.int32)
        L, P = m32.shape
        if num_logical_experts is not None:
            E = A.integer(num_logical_experts, "num_logical_experts", 1, A.MAX_EXPERTS,
                          "EPX_MAX_EXPERTS")
        else:
            E = int(m32.max()) + 1 if m32.size else 0
        if L < 1 or P < 1 or E < 1:
            raise ValueError("physical_to_logical_map has shape %s and %d experts: it needs at "
                             "least one layer, slot and expert" % (list(m32.shape), E))
        s = Shape(*A.shape_ints(L, E, P, num_gpus, num_nodes))
        h = c_void_p()
        call(_create_from_map, ctypes.byref(s), A.ptr(m32, c_int32), ctypes.byref(h))
        return cls(h, _key=PRIVATE)

    @property
    def handle(self):
        """The epx_layout* as a ctypes c_void_p (for other bindings)."""
        return self._h

    def clone(self):
        """An owned copy (copy.copy and copy.deepcopy give one too)."""
        h = c_void_p()
        call(_clone, self._h, ctypes.byref(h))
        return Layout(h, _key=PRIVATE)

    _clone = clone

    @property
    def shape(self):
        """dict(num_layers, num_logical_experts, num_physical_experts, num_gpus, num_nodes)."""
        s = _shape(self._h).contents
        return {f: int(getattr(s, f)) for f, _ in Shape._fields_}

    @property
    def num_layers(self):
        return self.shape["num_layers"]

    @property
    def num_logical_experts(self):
        return self.shape["num_logical_experts"]

    @property
    def num_physical_experts(self):
        return self.shape["num_physical_experts"]

    @property
    def num_gpus(self):
        return self.shape["num_gpus"]

    @property
    def num_nodes(self):
        return self.shape["num_nodes"]

    @property
    def physical_to_logical_map(self):
        """[L][P] int64: the logical expert in each slot."""
        s = self.shape
        return _copy(_p2l(self._h), (s["num_layers"], s["num_physical_experts"]))

    @property
    def num_valid(self):
        """[L][E] int64: replica count of each logical expert."""
        s = self.shape
        return _copy(_num_valid(self._h), (s["num_layers"], s["num_logical_experts"]))

    @property
    def max_replicas(self):
        return int(_max_replicas(self._h))

    def logical_to_all_physical_map(self, width=None):
        """[L][E][width] int64: the slots of each expert, ascending, -1 padded.
        width=None gives the narrowest (the largest replica count, as SGLang's
        _compute_logical_to_all_physical_map); "sglang" pads to P, as
        ExpertLocationMetadata stores it. A width above P is refused
        (ValueError), as is one below the largest replica count (EpxError)."""
        s = self.shape
        L, E, P = s["num_layers"], s["num_logical_experts"], s["num_physical_experts"]
        if width is None:
            width = self.max_replicas
        elif isinstance(width, str):
            if width != "sglang":
                raise ValueError('width must be an integer, None (the largest replica count) or '
                                 '"sglang" (P, as SGLang pads), not %r' % (width,))
            width = P
        # no list holds more than P slots: a wider width only sized a huge
        # buffer of padding (2^31 - 1 took 38 s to fail with MemoryError)
        width = A.integer(width, "width", 1, P, 'num_physical_experts, the most slots a list '
                          'holds; "sglang" pads to it')
        have = c_int32()
        lists = _l2all(self._h, ctypes.byref(have))
        if L * E > 0 and self.max_replicas <= width <= have.value:
            # the layout's own lists, cut to width and widened in one copy
            # (an int32 export first would double the bytes touched)
            view = np.ctypeslib.as_array(lists, shape=(L * E * have.value,))
            return view.reshape(L, E, have.value)[:, :, :width].astype(np.int64)
        out = np.empty((L, E, width), dtype=np.int32)
        call(_export_l2all, self._h, width, A.ptr(out, c_int32))
        return out.astype(np.int64)

    def write_json(self, path):
        """Write {"physical_to_logical_map": [L][P]} (the one key SGLang accepts)
        as JSON. A path ending in ".pt" is refused (SGLang would torch.load
        the JSON text and fail): epx.write_mapping(path, layout) writes the
        format the suffix names."""
        if c_path(path).endswith(b".pt"):
            raise ValueError("write_json(%r): a path ending in .pt is read by SGLang with "
                             "torch.load, not as JSON; use epx.write_mapping(path, layout), "
                             "which writes a .pt for a .pt path, or name the file .json"
                             % (path,))
        call(_write_json, self._h, c_path(path))

    def __repr__(self):
        s = self.shape
        return ("Layout(L=%(num_layers)d, E=%(num_logical_experts)d, P=%(num_physical_experts)d, "
                "G=%(num_gpus)d, N=%(num_nodes)d)" % s)
