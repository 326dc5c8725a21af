"""ctypes over libepx: loading the library, the error type, the C structs.

Every other module of the package declares the few C functions it calls with
`fn(name, restype, *argtypes)`. A function this build of libepx does not have
(a room that has not landed, or an older library) binds to a stub that raises
EpxError(EPX_ERR_UNSUPPORTED) when called, so importing epx never fails on a
missing symbol and `epx.has(name)` tells what is there.
"""
import ctypes
import enum
import os
from ctypes import (POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int, c_int32,
                    c_int64, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p)
from pathlib import Path

__all__ = ["EpxError", "EpxAssertionError", "EpxAssertionValueError", "EpxZeroDivisionError",
           "EpxIndexError", "EpxNotImplementedError", "Status", "lib", "fn", "has", "call", "library_path",
           "c_path"]


class Status(enum.IntEnum):
    """epx_status, append-only as in include/epx.h."""
    OK = 0
    INVALID_ARG = 1
    SHAPE = 2
    PARSE = 3
    IO = 4
    NOMEM = 5
    OVERFLOW = 6
    UNSUPPORTED = 7
    REFUSED = 8
    INVALID_MAP = 9
    COMM = 10
    CUDA = 11
    TIMEOUT = 12
    INTERNAL = 13


def _status(code):
    try:
        return Status(code)
    except ValueError:
        return code


class EpxError(Exception):
    """A failed libepx call.

    .status   the epx_status (a Status member, or the raw int for a newer code)
    .name     its C name, e.g. "EPX_ERR_SHAPE"
    .message  the library's sentence: the offending value, the limit, the fix
    """

    def __init__(self, status, message, name=None):
        self.status = _status(int(status))
        self.name = name or ("EPX_ERR_" + self.status.name if isinstance(self.status, Status)
                             else "EPX_ERR_UNKNOWN")
        self.message = message
        super().__init__("%s: %s" % (self.name, message))


class EpxAssertionError(EpxError, AssertionError):
    """An EpxError that is also an AssertionError: what the engine drop-ins
    (epx.vllm, epx.sglang's DeepSeek EPLB) raise where the engine's own code
    asserts on an impossible shape (slots not a multiple of the GPUs, experts
    not a multiple of the groups, GPUs not a multiple of the nodes, fewer
    slots than experts). Code written against the engine, which catches
    AssertionError, catches it; code written against epx catches EpxError.
    The message is libepx's sentence, as for any EpxError."""


class EpxAssertionValueError(EpxAssertionError, ValueError):
    """An EpxAssertionError that is also a ValueError: a count epx always
    refused as a ValueError where the engine's own code asserts (SGLang's
    num_physical_experts not a multiple of num_local_physical_experts)."""


class EpxZeroDivisionError(EpxError, ValueError, ZeroDivisionError):
    """An EpxError for a count of zero that the engine's own code divides
    by (SGLang's num_gpus = 0, num_local_physical_experts = 0, an expert with
    no replica in its dispatch table): a ValueError, as epx refuses any value
    out of range, and a ZeroDivisionError, as the engine's arithmetic fails,
    so a test written against either catches it."""


class EpxIndexError(EpxError, ValueError, IndexError):
    """An EpxError for an index, or an empty axis, that the engine's own
    code indexes past (SGLang's ep_rank >= ep_size, a table or a plan of no
    layer, expert ids with num_logical_experts = 0): a ValueError, as epx
    refuses any value out of range, and an IndexError, as the engine's
    indexing fails."""


class EpxNotImplementedError(EpxError, NotImplementedError):
    """An EpxError for an algorithm the engine's dispatcher does not know
    (SGLang's rebalance_experts raises NotImplementedError there)."""


# The statuses the drop-ins raise as EpxAssertionError: a shape or argument the
# engine's code rejects with `assert`.
ASSERTED = (Status.SHAPE, Status.INVALID_ARG)


class as_assertion:
    """Context manager: re-raise an EpxError whose status is in ASSERTED as
    EpxAssertionError (same status, name and message); others pass as they
    are."""

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if (kind is not None and issubclass(kind, EpxError)
                and not isinstance(err, EpxAssertionError) and err.status in ASSERTED):
            raise EpxAssertionError(err.status, err.message, err.name) from None
        return False


def library_path():
    """Where libepx.so is loaded from: $EPX_LIBRARY, else the copy inside the package."""
    env = os.environ.get("EPX_LIBRARY")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent / "_lib" / "libepx.so"


def _load():
    path = library_path()
    if not path.is_file():
        raise ImportError("epx: %s not found; install the package with `pip install ./python` "
                          "from the epx repository (it builds libepx), or point EPX_LIBRARY "
                          "at a built libepx.so" % path)
    return ctypes.CDLL(str(path))


lib = _load()


class OwnsHandle:
    """A wrapper that frees its C handle when it is collected. copy.copy made
    a second wrapper of the same handle, and the two freed it twice (a crash):
    a class with a real copy gives it as _clone (copy and deepcopy return
    it); any other refuses copies, and pickling, with TypeError."""

    __slots__ = ()

    def _clone(self):
        raise TypeError("%s owns a C handle, freed with it, and cannot be copied: make another "
                        "one the way this one was made" % type(self).__name__)

    def __copy__(self):
        return self._clone()

    def __deepcopy__(self, memo):
        return self._clone()

    def __reduce_ex__(self, protocol):
        raise TypeError("%s owns a C handle and cannot be pickled: save what it holds (a "
                        "Layout's map with epx.write_mapping) and build it again"
                        % type(self).__name__)


class Error(Structure):
    """epx_error: status + message buffer (EPX_ERRMSG_MAX = 512)."""
    _fields_ = [("status", c_int), ("msg", c_char * 512)]


def _stub(name):
    def missing(*_args, **_kw):
        raise EpxError(Status.UNSUPPORTED,
                       "this libepx (%s) has no %s: the binding needs a newer library; "
                       "rebuild it with `pip install ./python`" % (library_path(), name))
    missing.__name__ = name
    missing.epx_missing = True
    return missing


def fn(name, restype, *argtypes):
    """Bind one C function, or a stub that raises when the symbol is absent."""
    try:
        f = getattr(lib, name)
    except AttributeError:
        return _stub(name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


def has(name):
    """True when this libepx exports the C function `name` (an epx_ name: the
    ctypes library object's own attributes, _handle and the like, are not)."""
    if not isinstance(name, str) or not name.startswith("epx"):
        return False
    try:
        getattr(lib, name)
        return True
    except AttributeError:
        return False


_status_str = fn("epx_status_str", c_char_p, c_int)
_version = fn("epx_version", c_char_p)
epx_free = fn("epx_free", None, c_void_p)


def version():
    """libepx's version, "MAJOR.MINOR.PATCH"."""
    return _version().decode()


def c_path(path, name="path"):
    """A path argument as bytes for C: str, bytes or os.PathLike. Anything
    else is a TypeError (None became a file named 'None'), a NUL byte a
    ValueError (C read it as the end: "out.json\\x00.bak" wrote out.json),
    as open() refuses both."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, (str, bytes)):
        raise TypeError("%s must be a path (str, bytes or os.PathLike), not %s %r"
                        % (name, type(path).__name__, path))
    b = os.fsencode(path)
    if b"\0" in b:
        raise ValueError("%s holds a NUL byte: %r" % (name, path))
    return b


def call(f, *args):
    """Call an epx function whose last argument is epx_error*; raise on failure."""
    err = Error()
    st = f(*args, ctypes.byref(err))
    if st != 0:
        msg = err.msg.decode("utf-8", "replace") or "(no message)"
        raise EpxError(st, msg, _status_str(st).decode())
    return st


# ---- SGLang release strings ---------------------------------------------

_release_rule = {
    "eplb": fn("epx_sglang_eplb_rule", c_int32, c_char_p, POINTER(c_int), POINTER(c_int32),
               c_void_p),
    "table": fn("epx_sglang_table_rule", c_int32, c_char_p, POINTER(c_int), POINTER(c_int32),
                c_void_p),
}
_newest_verified = fn("epx_sglang_newest_verified", c_char_p)


def sglang_release(sglang_version, kind, name="sglang_version", stacklevel=3, warn=True):
    """The one check of an SGLang release from Python, before anything uses it:
    a str (not a float such as 0.5, nor bytes), no NUL (C would read up to it),
    then the library's one parser (core's release.c, as the CLI's
    --sglang-version): MAJOR.MINOR.PATCH[.postN] from the oldest release epx
    reproduces, else EpxError naming the value; a release newer than the
    newest verified one warns (that one's rule is used). kind: "eplb" or
    "table". Returns (the release as bytes for C, the rule number)."""
    if not isinstance(sglang_version, str):
        raise TypeError("%s must be a str such as '%s' (MAJOR.MINOR.PATCH[.postN]), not %s %r"
                        % (name, _newest_verified().decode(), type(sglang_version).__name__,
                           sglang_version))
    if "\x00" in sglang_version or not sglang_version.isascii():
        raise EpxError(Status.INVALID_ARG,
                       "%s %r is not MAJOR.MINOR.PATCH[.postN]: it holds a NUL or non-ASCII "
                       "character" % (name, sglang_version))
    raw = sglang_version.encode("ascii")
    rule, newer = c_int(0), c_int32(0)
    call(_release_rule[kind], raw, ctypes.byref(rule), ctypes.byref(newer))
    if newer.value and warn:
        import warnings
        newest = _newest_verified().decode()
        warnings.warn("SGLang %s is newer than the newest release epx verified (%s); using %s's "
                      "%s rule" % (sglang_version, newest, newest,
                                   "EPLB" if kind == "eplb" else "dispatch table"),
                      stacklevel=stacklevel)
    return raw, rule.value


# ---- structs mirrored from the headers (tests/test_abi.py checks the field lists) ----

class Shape(Structure):
    """epx_shape (include/epx.h)."""
    _fields_ = [("num_layers", c_int32), ("num_logical_experts", c_int32),
                ("num_physical_experts", c_int32), ("num_gpus", c_int32),
                ("num_nodes", c_int32)]


class Counts(Structure):
    """epx_counts (include/epx/counts.h)."""
    _fields_ = [("num_windows", c_int32), ("num_layers", c_int32), ("num_experts", c_int32),
                ("data", POINTER(c_double))]


LOG_FN = ctypes.CFUNCTYPE(None, c_void_p, c_int, c_char_p)

__all__ += ["ASSERTED", "as_assertion", "Error", "Shape", "Counts", "LOG_FN", "epx_free", "version",
            "POINTER", "c_char_p", "c_double", "c_float", "c_int", "c_int32", "c_int64",
            "c_size_t", "c_uint8", "c_uint32", "c_uint64", "c_void_p"]
