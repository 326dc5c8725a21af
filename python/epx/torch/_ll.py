"""The low-latency EP engine (include/epx_comm_gpu.h) through ctypes, for
epx.torch.Buffer: one handle per layer shape, its device views as torch
tensors, and its calls on the caller's current stream.

The engine's memory is its own (one cudaMalloc per rank, mapped by the
peers over CUDA IPC), so the tensors here are views of it: no copy, no
allocation per call, valid while the engine lives.
"""
import ctypes
from ctypes import POINTER, Structure, c_int, c_int32, c_int64, c_size_t, c_uint32, c_void_p

from .. import _native
from . import _gpu

# enum values of include/epx.h and include/epx_comm.h
DTYPE_F32, DTYPE_BF16 = 0, 1
MODE_LOW_LATENCY = 1
SEND, RECV, IDS64 = 1, 2, 4
FP8, ROUND_SCALE, UE8M0 = 8, 16, 32  # fp8 dispatch in DeepEP's form
INFO_BYTES = 256


class EpConfig(Structure):
    """epx_ep_config (include/epx_comm.h)."""
    _fields_ = [("version", c_uint32), ("hidden", c_int32), ("top_k", c_int32),
                ("num_slots", c_int32), ("max_tokens", c_int64), ("x_dtype", c_int),
                ("y_dtype", c_int), ("combine", c_int), ("max_recv_tokens", c_int64),
                ("max_recv_entries", c_int64), ("mode", c_int)]


class GpuEpOpts(Structure):
    """epx_gpu_ep_opts (include/epx_comm_gpu.h)."""
    _fields_ = [("version", c_uint32), ("timeout_ms", c_int32), ("max_blocks", c_int32),
                ("transport", c_int32), ("shrink", c_int32), ("mask", c_void_p)]


class GpuEpViews(Structure):
    """epx_gpu_ep_views (include/epx_comm_gpu.h)."""
    _fields_ = [("x", c_void_p), ("y", c_void_p), ("counts", c_void_p), ("src_token", c_void_p),
                ("layout_range", c_void_p), ("entry_weight", c_void_p),
                ("slot_stride", c_int64), ("num_local_slots", c_int32), ("x_scales", c_void_p)]


def _bind(name, *argtypes):
    """_gpu's binding, or None where the loaded library lacks the engine (an
    older libepx_cuda.so), so importing epx.torch never fails on it."""
    if _gpu._lib is None or not hasattr(_gpu._lib, name):
        return None
    return _gpu._bind(name, *argtypes)


_buffer_bytes = _bind("epx_gpu_ep_buffer_bytes", POINTER(EpConfig), c_int32, POINTER(c_size_t),
                      c_void_p)
_open = _bind("epx_gpu_ep_open", POINTER(EpConfig), c_int32, c_int32, c_void_p,
              POINTER(GpuEpOpts), POINTER(c_void_p), c_void_p)
_info = _bind("epx_gpu_ep_info", c_void_p, c_void_p, c_void_p)
_connect = _bind("epx_gpu_ep_connect", c_void_p, c_void_p, c_void_p)
_views = _bind("epx_gpu_ep_get_views", c_void_p, POINTER(GpuEpViews), c_void_p)
_set_stream = _bind("epx_gpu_ep_set_stream", c_void_p, c_void_p, c_void_p)
_dispatch = _bind("epx_gpu_ep_dispatch_parts", c_void_p, c_int, c_int64, c_void_p, c_void_p,
                  c_void_p, c_void_p, c_void_p)
_combine = _bind("epx_gpu_ep_combine_parts", c_void_p, c_int, c_void_p, c_void_p, c_void_p, c_int,
                 c_void_p)
_health = _bind("epx_gpu_ep_health", c_void_p, c_void_p)
_transport = None
if _gpu._lib is not None and hasattr(_gpu._lib, "epx_gpu_ep_transport_name"):
    _transport = _gpu._lib.epx_gpu_ep_transport_name
    _transport.restype = ctypes.c_char_p
    _transport.argtypes = [c_void_p]
_disconnect = _bind("epx_gpu_ep_disconnect", c_void_p, c_void_p)
_destroy = None
if _gpu._lib is not None and hasattr(_gpu._lib, "epx_gpu_ep_destroy"):
    _destroy = _gpu._lib.epx_gpu_ep_destroy
    _destroy.restype = None
    _destroy.argtypes = [c_void_p]


def config(hidden, top_k, num_experts, max_tokens):
    """The engine's config for a DeepEP layer: bf16 rows both ways."""
    return EpConfig(ctypes.sizeof(EpConfig), int(hidden), int(top_k), int(num_experts),
                    int(max_tokens), DTYPE_BF16, DTYPE_BF16, 0, 0, 0, MODE_LOW_LATENCY)


def buffer_bytes(cfg, num_ranks):
    """Device bytes one rank's engine takes (epx_gpu_ep_buffer_bytes)."""
    n = c_size_t(0)
    if _buffer_bytes is None:  # _gpu.call would say "got a CUDA tensor": none was given
        raise _native.EpxError(_native.Status.UNSUPPORTED, "the engine's buffer size (Buffer's "
                               "size hints) is computed by libepx_cuda.so, which this install "
                               "cannot use: %s" % (_gpu._reason or "it lacks the low-latency "
                                                   "engine"))
    _gpu.call(_buffer_bytes, ctypes.byref(cfg), int(num_ranks), ctypes.byref(n))
    return n.value


class _Dev:
    """A device pointer as __cuda_array_interface__, for torch.as_tensor."""

    def __init__(self, ptr, shape, typestr, owner):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr,
                                         "data": (int(ptr), False), "version": 3,
                                         "strides": None}
        self.owner = owner  # the tensor keeps the engine object alive


class Engine(_native.OwnsHandle):
    """One rank's handle for one (hidden, top_k, experts, max_tokens) shape."""

    def __init__(self, cfg, rank, num_ranks, timeout_ms, mask=None):
        import torch
        self.cfg = cfg
        self.rank, self.num_ranks = int(rank), int(num_ranks)
        self.device = torch.cuda.current_device()
        h = c_void_p()
        # transport 0 = AUTO: EPX_GPU_EP_TRANSPORT in the environment, else
        # peer memory where the GPUs reach each other, host memory otherwise
        # mask: shrink mode's int32 [num_ranks] device tensor, shared by every
        # engine of one Buffer (a rank masked by one is skipped by all)
        opts = GpuEpOpts(ctypes.sizeof(GpuEpOpts), int(timeout_ms), 0, 0,
                         1 if mask is not None else 0,
                         c_void_p(mask.data_ptr()) if mask is not None else None)
        stream = torch.cuda.current_stream().cuda_stream
        _gpu.call(_open, ctypes.byref(cfg), self.rank, self.num_ranks, c_void_p(stream),
                  ctypes.byref(opts), ctypes.byref(h))
        self.h = h
        self.generation = 0  # dispatches so far: a handle names the one it came from
        v = GpuEpViews()
        try:
            _gpu.call(_views, self.h, ctypes.byref(v))
        except BaseException:
            self.destroy()
            raise
        L, S, H, R = v.num_local_slots, v.slot_stride, cfg.hidden, self.num_ranks

        def view(ptr, shape, typestr):
            return torch.as_tensor(_Dev(ptr, shape, typestr, self), device="cuda")

        self.recv_x = view(v.x, (L, S, H), "<i2").view(torch.bfloat16)
        self.y = view(v.y, (L, S, H), "<i2").view(torch.bfloat16)
        self.recv_count = view(v.counts, (L,), "<i4")
        self.src_info = view(v.src_token, (L, S), "<i4")
        self.layout_range = view(v.layout_range, (L, R), "<i8")
        self.num_local = L
        # after an fp8 dispatch: e4m3 rows [L][S][H] at the receive, and the
        # scales after them column-major, as DeepEP returns them ([L][S][G]
        # views of [L][G][S] memory: fp32 per 128 values, or UE8M0 int32)
        if v.x_scales:
            self.recv_fp8 = view(v.x, (L, S, H), "|u1").view(torch.float8_e4m3fn)
            self.recv_scales = view(v.x_scales, (L, H // 128, S), "<f4").transpose(1, 2)
            self.recv_scales_ue8m0 = view(v.x_scales, (L, H // 512, S), "<i4").transpose(1, 2) \
                if H % 512 == 0 else None

    def info(self):
        buf = ctypes.create_string_buffer(INFO_BYTES)
        _gpu.call(_info, self.h, buf)
        return buf.raw

    def connect(self, infos):
        if len(infos) != self.num_ranks or any(len(i) != INFO_BYTES for i in infos):
            raise ValueError("connect needs %d infos of %d bytes, one per rank in rank order"
                             % (self.num_ranks, INFO_BYTES))
        blob = b"".join(infos)
        _gpu.call(_connect, self.h, ctypes.create_string_buffer(blob, len(blob)))

    def transport(self):
        """"pointers", "ipc" or "host" once connected ("none" before)."""
        return _transport(self.h).decode() if _transport is not None else "ipc"

    def _on_stream(self, stream):
        import torch
        s = stream if stream is not None else torch.cuda.current_stream()
        _gpu.call(_set_stream, self.h, c_void_p(s.cuda_stream))

    def dispatch(self, parts, x, ids, stream=None):
        """Launch dispatch parts (SEND, RECV or both) on `stream` (default:
        the current one); ids int64 or int32 [T][K], x bf16 [T][H] (both
        ignored for RECV)."""
        self._on_stream(stream)
        T = 0 if x is None else x.shape[0]
        if ids is not None and ids.dtype.itemsize == 8:
            parts |= IDS64
        _gpu.call(_dispatch, self.h, parts, T, c_void_p(x.data_ptr() if x is not None else 0),
                  c_void_p(ids.data_ptr() if ids is not None else 0), None, None)

    def combine(self, parts, y, weights, out, stream=None, out_dtype=DTYPE_BF16):
        """Launch combine parts on `stream` (default: the current one): y
        (None: the engine's own) [L][S][H] bf16, weights [T][K] fp32, out
        [T][H] bf16 (or fp32 with out_dtype DTYPE_F32: the sums unrounded)."""
        self._on_stream(stream)
        _gpu.call(_combine, self.h, parts, c_void_p(y.data_ptr() if y is not None else 0),
                  c_void_p(weights.data_ptr() if weights is not None else 0),
                  c_void_p(out.data_ptr() if out is not None else 0), out_dtype)

    def health(self):
        """Raise the EpxError a fault recorded by the kernels, if any."""
        _gpu.call(_health, self.h)

    def disconnect(self):
        """Wait for the stream and unmap the peers (the first half of a
        collective teardown: every rank, then a barrier, then destroy)."""
        if self.h is not None:
            _gpu.call(_disconnect, self.h)

    def destroy(self):
        if self.h is not None and _destroy is not None:
            _destroy(self.h)
        self.h = None
