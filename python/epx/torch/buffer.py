"""epx.torch.Buffer: epx's EP engine behind DeepEP's calling convention
(DeepEP V1's `deep_ep.Buffer`: the low-latency methods, and the normal-mode
dispatch/combine at the end of this file, docs/EP_TORCH.md's last section),
so code written for DeepEP switches by changing its import:

    from epx.torch import Buffer            # was: from deep_ep import Buffer
    buf = Buffer(group, num_rdma_bytes=Buffer.get_low_latency_rdma_size_hint(
        num_max_dispatch_tokens_per_rank, hidden, group.size(), num_experts),
        low_latency_mode=True, num_qps_per_rank=num_experts // group.size())
    recv_x, recv_count, handle, event, hook = buf.low_latency_dispatch(
        x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts, use_fp8=False)
    # recv_x [local experts, ranks * max tokens, hidden]: a grouped GEMM reads it as it is
    combined_x, event, hook = buf.low_latency_combine(y, topk_idx, topk_weights, handle)

The group carries only the exchange of buffer handles at the first call of a
shape and at destroy; any torch.distributed backend works (gloo too, so
several processes can share one GPU). Every call runs on the caller's current
stream, allocates nothing on the device in dispatch, and can be captured in a
CUDA graph once the shape's first call has run outside the capture.

Where epx differs from DeepEP, and why (docs/EP_TORCH.md has the list):
- rows are in a fixed order: each local expert's rows come by source rank,
  then by token, then by k (DeepEP's order depends on arrival), so results
  are reproducible bit for bit;
- recv_x, recv_count and the handle's tensors are views of the engine's
  memory, valid until the next dispatch of the same shape (DeepEP allocates
  new tensors, and reuses its own buffers after two calls);
- use_fp8 quantises in the sending kernel, DeepEP's format on the wire (e4m3
  and one fp32 scale per 128 values: H + H / 32 bytes a row); the tensors
  returned are views of the engine's receive, as with bf16;
  use_logfmt is accepted and sends bf16 (no precision lost);
- the engine is created at the first call of each (hidden, top-k, experts,
  max tokens), which is collective: every rank's first call of a shape must
  come outside CUDA-graph capture;
- shrink mode masks a rank whose flag does not come within timeout_ms
  (default 100 s as DeepEP's, or EPX_GPU_EP_TIMEOUT_MS); a masked rank's
  tokens and experts are dropped as DeepEP's test defines; clean_low_latency_buffer
  is a barrier only in shrink mode (epx's buffers need no zeroing);
- the wait-cycle statistics are not implemented and refuse with a message;
- get_comm_stream returns the caller's current stream (epx's calls run
  there); get_local_buffer_tensor and internode_dispatch/combine exist with
  DeepEP's signatures and raise NotImplementedError (no raw buffer, no RDMA
  path).
"""
import os

import torch

from .. import _arrays as _A
from .._native import EpxError, Status
from . import _gpu, _ll, _normal, _normal_gpu

__all__ = ["Buffer", "Config", "EventOverlap", "per_token_cast_fp8", "reference_dispatch",
           "reference_combine"]

# DeepEP's per-token quantisation constants (e4m3's largest finite value).
_FP8_MAX = 448.0


class EventOverlap:
    """DeepEP's EventOverlap: an event (or None) and tensors kept alive until
    the caller waits on it."""

    def __init__(self, event=None, extra_tensors=None):
        self.event = event
        self.extra_tensors = extra_tensors
        self.hook_after_wait = None
        self._release = False

    def current_stream_wait(self, release_handle=False):
        assert self.event is not None, "this EventOverlap holds no event (async_finish was False)"
        torch.cuda.current_stream().wait_event(self.event)
        if self.hook_after_wait is not None:
            hook, self.hook_after_wait = self.hook_after_wait, None
            hook()
        if release_handle:
            self.event = None

    def register_hook_after_wait(self, hook_after_wait):
        assert self.hook_after_wait is None, "a hook is already registered"
        self.hook_after_wait = hook_after_wait

    def __call__(self, release_handle=False):
        self._release = release_handle
        return self

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        if self.event is not None:
            self.current_stream_wait(self._release)
        self._release = False


def _fail(msg):
    raise ValueError(msg)


class _Handle(tuple):
    """DeepEP's handle tuple (src_info, layout_range, max tokens, hidden,
    num_experts), also naming the engine and the dispatch it came from: the
    engine keeps one dispatch per shape, so a combine must use the latest."""

    def __new__(cls, items, engine, generation):
        h = super().__new__(cls, items)
        h._epx_engine, h._epx_generation = engine, generation
        return h


class _NormalHandle(tuple):
    """DeepEP's normal-mode handle, six items as DeepEP's: (rank_prefix_matrix
    int32 [R][R], the engine rows of the received tokens int64, which of them
    are real (the plain-torch steps with num_worst_tokens: bool; else None),
    recv_src_idx int32 (-1 past the real ones), is_token_in_rank, None); it
    also names its engine, its layout and whether it was a num_worst_tokens
    dispatch."""

    def __new__(cls, items, engine, layout, worst=False, captured=False):
        h = super().__new__(cls, items)
        h._epx_engine, h._epx_layout, h._epx_worst = engine, layout, worst
        h._epx_captured = captured  # dispatched inside a CUDA-graph capture
        return h


class Config:
    """DeepEP's Config (SMs and chunk sizes of its normal-mode kernels):
    accepted everywhere DeepEP takes one; epx's engine sizes its own grid."""

    def __init__(self, num_sms=20, num_max_nvl_chunked_send_tokens=6,
                 num_max_nvl_chunked_recv_tokens=256, num_max_rdma_chunked_send_tokens=6,
                 num_max_rdma_chunked_recv_tokens=256):
        self.num_sms = num_sms
        self.num_max_nvl_chunked_send_tokens = num_max_nvl_chunked_send_tokens
        self.num_max_nvl_chunked_recv_tokens = num_max_nvl_chunked_recv_tokens
        self.num_max_rdma_chunked_send_tokens = num_max_rdma_chunked_send_tokens
        self.num_max_rdma_chunked_recv_tokens = num_max_rdma_chunked_recv_tokens

    def get_nvl_buffer_size_hint(self, hidden_bytes, num_ranks):
        """The num_nvl_bytes for NORMAL_HINT_TOKENS tokens per rank and call
        of hidden_bytes / 2 bf16 values (experts only widen the rows of a tiny
        hidden; 256 are assumed)."""
        hidden = max(1, _A.integer(hidden_bytes, "hidden_bytes", 1, 2 ** 40) // 2)
        num_ranks = _A.integer(num_ranks, "num_ranks", 1, _A.MAX_GPUS, "EPX_MAX_GPUS")
        cfg = _ll.config(_normal.row_width(hidden, 256, num_ranks), num_ranks, num_ranks,
                         NORMAL_HINT_TOKENS + 1)
        return _ll.buffer_bytes(cfg, num_ranks)

    def get_rdma_buffer_size_hint(self, hidden_bytes, num_ranks):
        """0: epx's normal mode uses no RDMA buffer."""
        return 0


# Tokens per rank and call Config.get_nvl_buffer_size_hint sizes for (a
# prefill chunk of 8192 tokens spread over 2+ ranks).
NORMAL_HINT_TOKENS = 4096
# The most tokens per rank and call a normal-mode engine is sized for,
# however large num_nvl_bytes is (a prefill chunk; more is refused by name).
NORMAL_MAX_TOKENS = 1 << 16


def _normal_tokens(width, num_ranks, nbytes):
    """The most tokens per rank (count row included) an engine of rows of
    `width` columns over num_ranks ranks takes within nbytes (0 if none)."""
    lo, hi = 0, NORMAL_MAX_TOKENS
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _ll.buffer_bytes(_ll.config(width, num_ranks, num_ranks, mid), num_ranks) <= nbytes:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _wait(previous_event):
    ev = getattr(previous_event, "event", previous_event)
    if ev is not None:
        torch.cuda.current_stream().wait_event(ev)


def _check_cuda(name, t, dtype, ndim, device, contiguous=True):
    if not isinstance(t, torch.Tensor):
        _fail("%s must be a torch.Tensor, not %s" % (name, type(t).__name__))
    if t.device.type != "cuda" or t.device.index != device:
        _fail("%s is on %s, but this Buffer's GPU is cuda:%d: move it there" % (name, t.device,
                                                                                 device))
    if dtype is not None and t.dtype not in (dtype if isinstance(dtype, tuple) else (dtype,)):
        _fail("%s has dtype %s; DeepEP's API takes %s" % (
            name, t.dtype, " or ".join(str(d) for d in (dtype if isinstance(dtype, tuple)
                                                         else (dtype,)))))
    if t.dim() != ndim:
        _fail("%s must have %d dimensions, not shape %s" % (name, ndim, tuple(t.shape)))
    if contiguous and not t.is_contiguous():
        _fail("%s must be contiguous (call .contiguous())" % name)


def _int(name, v, lo=None):
    if isinstance(v, bool) or not isinstance(v, int):
        _fail("%s must be an int, not %r" % (name, v))
    if lo is not None and v < lo:
        _fail("%s must be >= %d, not %d" % (name, lo, v))
    if v >= 2**31:
        _fail("%s (%d) must be below 2**31" % (name, v))
    return v


def _env_timeout_ms():
    """Buffer's default timeout: EPX_GPU_EP_TIMEOUT_MS, else DeepEP's 100 s."""
    import os
    v = os.environ.get("EPX_GPU_EP_TIMEOUT_MS", "")
    if v == "":
        return 100000
    if not v.isdigit() or not 1 <= int(v) <= 2**31 - 1:
        _fail("EPX_GPU_EP_TIMEOUT_MS is %r: give milliseconds, a whole number from 1" % v)
    return int(v)


def _env_normal_kernels():
    """EPX_TORCH_NORMAL_KERNELS: 1 (or unset) libepx_cuda's normal-mode
    kernels where it has them, 0 the plain-torch steps."""
    v = os.environ.get("EPX_TORCH_NORMAL_KERNELS", "")
    if v not in ("", "0", "1"):
        _fail("EPX_TORCH_NORMAL_KERNELS is %r: give 1 (libepx_cuda's kernels, the default) or 0 "
              "(plain torch), or leave it unset" % v)
    return v != "0"


class _ShrinkExchange:
    """Shrink mode's exchange at a shape's engine creation: every rank's value
    through torch.distributed's key-value store, each waited for until a
    deadline of the Buffer's timeout; a rank not there by then is absent
    (None) in this and every later gather of the same creation. DeepEP
    allocates in its constructor, so a rank that stops before its first
    dispatch holds nobody; epx creates engines per shape at their first
    call, and this keeps that from waiting for a stopped rank."""
    made = 0  # Buffers of this process: every rank makes them in one order

    def __init__(self, buf, key):
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d
        self.store = c10d._get_default_store()
        self.rank, self.n, self.timeout_ms = buf.rank, buf.group_size, buf.timeout_ms
        ranks = dist.get_process_group_ranks(buf.group)
        self.prefix = "epx-shrink/%s/%d/%s" % (",".join(map(str, ranks)), buf._uid,
                                               "-".join(map(str, key)))
        self.present = list(range(self.n))

    def gather(self, name, value):
        import datetime
        import pickle
        import time
        self.store.set("%s/%s/%d" % (self.prefix, name, self.rank), pickle.dumps(value))
        out = [None] * self.n
        deadline = time.monotonic() + self.timeout_ms / 1000.0
        for r in list(self.present):
            k = "%s/%s/%d" % (self.prefix, name, r)
            left = max(deadline - time.monotonic(), 0.001)
            try:
                self.store.wait([k], datetime.timedelta(seconds=left))
            except RuntimeError:  # not there by the deadline: that rank stopped
                self.present.remove(r)
                continue
            out[r] = pickle.loads(self.store.get(k))
        return out


def _new_mask(n):
    """Shrink mode's mask: int32 [n] on the current GPU, all ranks unmasked."""
    return torch.zeros((n,), dtype=torch.int32, device="cuda")


def per_token_cast_fp8(x, round_scale=False, use_ue8m0=False):
    """DeepEP's fp8 form of bf16 rows [..., H]: e4m3 values and one scale per
    128 values (amax * (1 / 448), amax at least 1e-4; round_scale: the next
    power of two; use_ue8m0: that power's exponent byte, four packed in an
    int32), the scales column-major in the last two dimensions as DeepEP
    returns them. The same bits on the CPU and on CUDA."""
    if use_ue8m0 and not round_scale:
        _fail("use_ue8m0 needs round_scale=True (DeepEP's rule)")
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        # a numpy array raised AttributeError, a 0-d tensor "not enough values to unpack"
        raise TypeError("x must be a torch tensor of rows [..., H], not %s"
                        % (type(x).__name__ if not isinstance(x, torch.Tensor)
                           else "a 0-d tensor"))
    *lead, H = x.shape
    if H % 128:
        _fail("fp8 dispatch needs hidden divisible by 128, not %d" % H)
    g = x.float().reshape(*lead, H // 128, 128)
    amax = g.abs().amax(dim=-1).clamp_min(1e-4)
    # DeepEP's kernel arithmetic, in float32 on every device: the scale is
    # amax * (float)(1 / 448) and the values are x * (448 / amax), a true
    # division (tensor by tensor: torch's scalar / tensor takes a reciprocal).
    scale = amax * (1.0 / _FP8_MAX)
    factor = torch.full_like(amax, _FP8_MAX) / amax
    if round_scale:
        # the next power of two from the bits, as DeepEP's kernel (log2 in
        # float32 can round a scale just above a power of two down to it)
        b = scale.view(torch.int32)
        e = ((b >> 23) & 0xff) - 127 + ((b & 0x7fffff) != 0).to(torch.int32)
        scale = torch.ldexp(torch.ones_like(scale), e)
        factor = torch.ones_like(scale) / scale  # a power of two: exact
    data = (g * factor.unsqueeze(-1)).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)
    data = data.reshape(*lead, H)
    if use_ue8m0:
        if H % 512:
            _fail("UE8M0 scales need hidden divisible by 512, not %d" % H)
        exp = (scale.view(torch.int32) >> 23).to(torch.int32) & 0xff
        exp = exp.reshape(*lead, H // 512, 4)
        packed = exp[..., 0] | (exp[..., 1] << 8) | (exp[..., 2] << 16) | (exp[..., 3] << 24)
        scale = packed
    # column-major in the last two dims: allocated [.., S, rows] then transposed
    sc = scale.transpose(-1, -2).contiguous().transpose(-1, -2)
    return data, sc


class Buffer:
    """DeepEP's Buffer, low-latency methods, on epx's engine. Constructor
    arguments as DeepEP's; the sizes are lower bounds that are checked when
    a shape's engine is created."""

    num_sms = 20

    def __init__(self, group, num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False,
                 num_qps_per_rank=24, allow_nvlink_for_low_latency_mode=True, allow_mnnvl=False,
                 explicitly_destroy=False, enable_shrink=False, comm=None, *,
                 timeout_ms=None):
        import torch.distributed as dist
        reason = _gpu.reason()
        if reason is not None and reason.startswith(_gpu.NO_GPU):
            reason = None  # said plainly below
        if reason is not None or _ll._open is None:
            raise EpxError(Status.UNSUPPORTED, "epx.torch.Buffer needs libepx_cuda.so with the "
                           "low-latency engine: " + str(reason or "this build lacks it"))
        if not torch.cuda.is_available():
            raise EpxError(Status.UNSUPPORTED, "epx.torch.Buffer needs a CUDA GPU; none is "
                           "visible")
        if group is None and comm is None:
            _fail("Buffer needs a torch.distributed group (or DeepEP's mpi4py comm)")
        if comm is not None:
            _fail("epx.torch.Buffer exchanges handles over a torch.distributed group; pass "
                  "group= (mpi4py communicators are not supported)")
        if timeout_ms is None:
            timeout_ms = _env_timeout_ms()
        for name, v in (("num_nvl_bytes", num_nvl_bytes), ("num_rdma_bytes", num_rdma_bytes),
                        ("num_qps_per_rank", num_qps_per_rank), ("timeout_ms", timeout_ms)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                _fail("%s must be a non-negative int, not %r" % (name, v))
        self.group = group
        self.rank = dist.get_rank(group)
        self.group_size = dist.get_world_size(group)
        self.num_nvl_bytes = num_nvl_bytes
        self.num_rdma_bytes = num_rdma_bytes
        self.low_latency_mode = bool(low_latency_mode)
        self.explicitly_destroy = bool(explicitly_destroy)
        self.enable_shrink = bool(enable_shrink)
        self.timeout_ms = timeout_ms
        # shrink mode's mask, one int32 per rank (1 = masked), read by every
        # engine of this Buffer in its kernels
        self._mask = _new_mask(self.group_size) if self.enable_shrink else None
        self._uid = _ShrinkExchange.made  # names this Buffer's keys in the store
        _ShrinkExchange.made += 1
        self.device = torch.cuda.current_device()
        self._engines = {}
        self._layouts = 0  # normal-mode dispatches so far: names each one's layout
        self._dropped = None  # tokens num_worst_tokens left out (normal_health)
        self._destroyed = False

    # ---- sizes ------------------------------------------------------------

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks,
                                       num_experts):
        """Bytes of one rank's engine for this shape (at top-k 11, DeepEP's
        largest), rounded up to 128 as DeepEP's hint is."""
        cfg = _ll.config(_int("hidden", hidden, 1), 11,
                         _int("num_experts", num_experts, 1),
                         _int("num_max_dispatch_tokens_per_rank",
                              num_max_dispatch_tokens_per_rank, 1))
        n = _ll.buffer_bytes(cfg, _int("num_ranks", num_ranks, 1))
        return (n + 127) // 128 * 128

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank, hidden, num_experts):
        """epx's buffers need no cleaning (each batch's rows carry its
        epoch, so stale ones are told apart). In shrink mode it is DeepEP's
        barrier among the ranks still unmasked: every engine runs an empty
        dispatch and combine, which masks a rank that does not take part
        within the timeout. Handles of earlier dispatches are spent."""
        self._alive()
        if not self.enable_shrink:
            return
        for eng in self._engines.values():
            eng.dispatch(_ll.SEND | _ll.RECV, None, None)  # no tokens: only the flags
            eng.generation += 1
            eng.num_tokens = 0
            eng.combine(_ll.SEND | _ll.RECV, None, None, None)

    # ---- shrink mode's mask (DeepEP's names) ------------------------------------

    def _shrink(self, what):
        self._alive()
        if not self.enable_shrink:
            _fail("%s needs Buffer(..., enable_shrink=True)" % what)

    def low_latency_update_mask_buffer(self, rank_to_mask, mask=False):
        """Mask (mask=True) or unmask a rank for dispatch, combine and clean,
        in stream order. Every rank must do the same at the same point."""
        self._shrink("low_latency_update_mask_buffer")
        r = _int("rank_to_mask", rank_to_mask, 0)
        if r >= self.group_size:
            _fail("rank_to_mask %d is outside the group's %d ranks" % (r, self.group_size))
        self._mask[r] = 1 if mask else 0

    def low_latency_query_mask_buffer(self, mask_status):
        """Copy the mask into mask_status ([num_ranks] int32 on this GPU;
        1 = masked), in stream order."""
        self._shrink("low_latency_query_mask_buffer")
        _check_cuda("mask_status", mask_status, torch.int32, 1, self.device)
        if mask_status.shape[0] != self.group_size:
            _fail("mask_status has %d entries, not the group's %d ranks"
                  % (mask_status.shape[0], self.group_size))
        mask_status.copy_(self._mask)

    def low_latency_clean_mask_buffer(self):
        """Unmask every rank, in stream order."""
        self._shrink("low_latency_clean_mask_buffer")
        self._mask.zero_()

    def get_next_low_latency_combine_buffer(self, handle):
        """The expert-output tensor [local experts, ranks * max tokens,
        hidden] bf16 that combine reads with zero_copy=True (the engine's
        own, contiguous)."""
        return self._engine_of(handle).y

    def get_dispatch_layout(self, topk_idx, num_experts, previous_event=None,
                            async_finish=False, allocate_on_comm_stream=False):
        """DeepEP's get_dispatch_layout for this Buffer's ranks:
        (num_tokens_per_rank int32, None (no RDMA ranks), num_tokens_per_expert
        int32, is_token_in_rank bool, EventOverlap); see
        epx.torch.get_dispatch_layout."""
        if self._destroyed:
            _fail("this Buffer was destroyed")
        from . import get_dispatch_layout
        return get_dispatch_layout(topk_idx, num_experts, previous_event, async_finish,
                                   allocate_on_comm_stream, num_ranks=self.group_size)

    @staticmethod
    def capture():
        ev = torch.cuda.Event()
        ev.record()
        return EventOverlap(ev)

    def get_comm_stream(self):
        """The stream epx's calls run on: the caller's current stream (epx
        has no communication stream of its own). Waiting on it, or running
        work on it, orders that work after epx's as DeepEP's comm stream
        would; it adds no ordering that the stream does not already have."""
        if self._destroyed:
            _fail("this Buffer was destroyed")
        return torch.cuda.current_stream()

    def get_local_buffer_tensor(self, dtype, size=None, offset=0, use_rdma_buffer=False):
        """DeepEP's view of its raw NVLink (or RDMA) buffer: not offered.
        epx's memory is one engine per shape, created at the shape's first
        call, so there is no single raw buffer to slice."""
        raise NotImplementedError(
            "get_local_buffer_tensor: epx.torch.Buffer has no raw buffer to view (each "
            "(hidden, top-k, experts, max tokens) shape has its own engine, made at its first "
            "call); use the tensors dispatch returns, or get_next_low_latency_combine_buffer")

    # ---- the engine of a shape ----------------------------------------------

    def _alive(self):
        if self._destroyed:
            _fail("this Buffer was destroyed")
        if not self.low_latency_mode:
            _fail("the low-latency methods need Buffer(..., low_latency_mode=True)")

    def _engine(self, hidden, top_k, num_experts, max_tokens):
        key = (hidden, top_k, num_experts, max_tokens)

        def make():
            if num_experts % self.group_size:
                _fail("num_experts (%d) must be a multiple of the group's %d ranks"
                      % (num_experts, self.group_size))
            cfg = _ll.config(hidden, top_k, num_experts, max_tokens)
            need = _ll.buffer_bytes(cfg, self.group_size)
            if self.num_rdma_bytes and self.num_rdma_bytes < need:
                _fail("num_rdma_bytes (%d) is below the %d bytes this shape needs (hidden %d, "
                      "top-k %d, %d experts, %d tokens per rank): size it with "
                      "Buffer.get_low_latency_rdma_size_hint"
                      % ((self.num_rdma_bytes, need) + key))
            return cfg
        return self._open_engine(key, "hidden %d, top-k %d, %d experts, %d tokens" % key, make)

    def _open_engine(self, key, shape, make):
        """The engine of `key`, created collectively at its first call:
        make() returns its config or raises the reason it cannot be made."""
        eng = self._engines.get(key)
        if eng is not None:
            return eng
        import torch.distributed as dist
        # Every rank reaches the gathers below whatever happens here, so a
        # rank that fails does not leave its peers waiting.
        eng, err, info, local = None, None, b"", None
        try:
            if torch.cuda.is_current_stream_capturing():
                _fail("the first call of a shape (%s) creates its engine, which a CUDA-graph "
                      "capture cannot hold: run one call before capturing" % shape)
            cfg = make()
            eng = _ll.Engine(cfg, self.rank, self.group_size, self.timeout_ms, self._mask)
            info = eng.info()
        except EpxError as e:
            err = (int(e.status), str(e))
        except ValueError as e:
            err, local = (int(Status.INVALID_ARG), str(e)), e
        except Exception as e:  # noqa: BLE001 - reported on every rank below
            err = (int(Status.INTERNAL), "%s: %s" % (type(e).__name__, e))
        # Shrink mode gathers over the job's store with a deadline, so a rank
        # that stopped before this call is left out (its info all zeros:
        # the engine masks it) instead of holding the others in a collective.
        ex = _ShrinkExchange(self, key) if self.enable_shrink else None
        if ex is not None:
            infos = [bytes(_ll.INFO_BYTES) if i is None else i for i in ex.gather("info", info)]
        else:
            infos = [None] * self.group_size
            dist.all_gather_object(infos, info, group=self.group)
        # Connect only when every rank opened (a failed one sent no info).
        if err is None and all(len(i) == _ll.INFO_BYTES for i in infos):
            try:
                eng.connect(infos)
            except EpxError as e:
                err = (int(e.status), str(e))
        if ex is not None:
            errs = ex.gather("error", err)
        else:
            errs = [None] * self.group_size
            dist.all_gather_object(errs, err, group=self.group)
        bad = [(r, e) for r, e in enumerate(errs) if e is not None]
        if bad:
            if eng is not None:
                eng.destroy()
            if local is not None:
                raise local  # this rank's own argument error, as DeepEP would raise it
            rank, (status, msg) = next((b for b in bad if b[0] == self.rank), bad[0])
            raise EpxError(status, "epx.torch.Buffer: creating the engine failed on rank %d: %s"
                           % (rank, msg))
        if ex is not None:
            ex.gather("mapped", True)  # every peer still here mapped before anyone launches
        else:
            dist.barrier(group=self.group)  # every peer mapped before anyone launches
        self._engines[key] = eng
        return eng

    def _engine_of(self, handle):
        self._alive()
        if not isinstance(handle, tuple) or len(handle) != 5:
            _fail("handle must be the 5-tuple low_latency_dispatch returned")
        eng = getattr(handle, "_epx_engine", None)
        if eng is None or all(eng is not e for e in self._engines.values()):
            _fail("this handle does not come from a dispatch of this Buffer: combine needs its "
                  "dispatch's handle")
        if handle._epx_generation != eng.generation:
            _fail("this handle's dispatch was followed by another dispatch of the same shape, "
                  "whose rows replaced its own: epx keeps one dispatch per shape, so combine "
                  "the latest dispatch (DeepEP keeps two)")
        return eng

    # ---- DeepEP's low-latency calls ------------------------------------------

    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
                             cumulative_local_expert_recv_stats=None,
                             dispatch_wait_recv_cost_stats=None, use_fp8=True, round_scale=False,
                             use_ue8m0=False, async_finish=False, return_recv_hook=False):
        """Send each token to the ranks of its experts; returns (recv_x,
        recv_count, handle, event, hook) in DeepEP's shapes and dtypes: recv_x
        [local experts, ranks * max tokens, hidden] bf16 (with use_fp8 a
        tuple (e4m3 data, fp32 scales [.., hidden / 128]) or int32 UE8M0
        scales), recv_count [local experts] int32, handle (src_info,
        layout_range, max tokens, hidden, num_experts)."""
        self._alive()
        M = _int("num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank, 1)
        E = _int("num_experts", num_experts, 1)
        _check_cuda("x", x, torch.bfloat16, 2, self.device)
        _check_cuda("topk_idx", topk_idx, (torch.int64, torch.int32), 2, self.device)
        T, H = x.shape
        if topk_idx.shape[0] != T:
            _fail("topk_idx has %d rows but x has %d tokens" % (topk_idx.shape[0], T))
        K = topk_idx.shape[1]
        if not 1 <= K <= 64:
            _fail("topk_idx has %d columns; epx serves top-k 1..64" % K)
        if T > M:
            _fail("x has %d tokens, above num_max_dispatch_tokens_per_rank (%d)" % (T, M))
        if async_finish and return_recv_hook:
            _fail("async_finish and return_recv_hook cannot both be True (DeepEP's rule)")
        if use_ue8m0 and not round_scale:
            _fail("use_ue8m0 needs round_scale=True (DeepEP's rule)")
        if dispatch_wait_recv_cost_stats is not None:
            raise NotImplementedError("dispatch_wait_recv_cost_stats: epx does not count wait "
                                      "cycles per rank yet; pass None")
        if cumulative_local_expert_recv_stats is not None:
            s = cumulative_local_expert_recv_stats
            _check_cuda("cumulative_local_expert_recv_stats", s, torch.int32, 1, self.device)
            if s.shape[0] != E // max(self.group_size, 1):
                _fail("cumulative_local_expert_recv_stats has %d entries, not the %d local "
                      "experts" % (s.shape[0], E // self.group_size))
        if topk_idx.dtype != torch.int64:
            topk_idx = topk_idx.to(torch.int64)  # every negative id means none, as DeepEP's
        eng = self._engine(H, K, E, M)
        send_stream = torch.cuda.current_stream() if return_recv_hook else None

        fp8 = (_ll.FP8 | (_ll.ROUND_SCALE if round_scale else 0) |
               (_ll.UE8M0 if use_ue8m0 else 0)) if use_fp8 else 0
        if use_fp8 and (H % (512 if use_ue8m0 else 128) or eng.recv_fp8 is None):
            _fail("fp8 dispatch needs hidden divisible by %d, not %d"
                  % (512 if use_ue8m0 else 128, H))

        def receive():
            eng.dispatch(_ll.RECV, None, None, stream=send_stream)  # DeepEP: the send's stream
            return finish()

        def finish():
            if cumulative_local_expert_recv_stats is not None:
                cumulative_local_expert_recv_stats.add_(eng.recv_count)
            return recv_out

        # what the receive fills: views of the engine's memory, handed out
        # at once (with a hook, before it has run, as DeepEP does)
        recv_out = eng.recv_x if not use_fp8 else \
            (eng.recv_fp8, eng.recv_scales_ue8m0 if use_ue8m0 else eng.recv_scales)

        def launched():
            eng.num_tokens = T  # what combine must be given back
            eng.generation += 1
            return _Handle((eng.src_info, eng.layout_range, M, H, E), eng, eng.generation)

        if return_recv_hook:
            eng.dispatch(_ll.SEND | fp8, x, topk_idx)
            handle = launched()
            return recv_out, eng.recv_count, handle, EventOverlap(None), receive
        eng.dispatch(_ll.SEND | _ll.RECV | fp8, x, topk_idx)
        handle = launched()
        recv_x = finish()
        event = EventOverlap(self.capture().event, (x, topk_idx)) if async_finish else \
            EventOverlap(None)
        return recv_x, eng.recv_count, handle, event, None

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, use_logfmt=False,
                            zero_copy=False, async_finish=False, return_recv_hook=False, out=None,
                            combine_wait_recv_cost_stats=None):
        """Send the expert outputs x [local experts, ranks * max tokens,
        hidden] bf16 back and reduce each token's in fp32, k ascending,
        rounded once to bf16: returns (combined_x [tokens, hidden] bf16,
        event, hook)."""
        eng = self._engine_of(handle)
        if combine_wait_recv_cost_stats is not None:
            raise NotImplementedError("combine_wait_recv_cost_stats: epx does not count wait "
                                      "cycles per rank yet; pass None")
        if use_logfmt and zero_copy:
            _fail("use_logfmt and zero_copy cannot both be True (DeepEP's rule)")
        if async_finish and return_recv_hook:
            _fail("async_finish and return_recv_hook cannot both be True (DeepEP's rule)")
        L, S, H = eng.recv_x.shape
        if not zero_copy:
            _check_cuda("x", x, torch.bfloat16, 3, self.device)
            if tuple(x.shape) != (L, S, H):
                _fail("x has shape %s; combine takes the dispatch's layout (%d, %d, %d)"
                      % (tuple(x.shape), L, S, H))
        _check_cuda("topk_idx", topk_idx, (torch.int64, torch.int32), 2, self.device)
        _check_cuda("topk_weights", topk_weights, torch.float32, 2, self.device)
        T, K = topk_idx.shape
        if tuple(topk_weights.shape) != (T, K) or K != eng.cfg.top_k:
            _fail("topk_idx %s and topk_weights %s must both be [tokens, %d] as at dispatch"
                  % (tuple(topk_idx.shape), tuple(topk_weights.shape), eng.cfg.top_k))
        if T != getattr(eng, "num_tokens", T):
            _fail("topk_idx has %d tokens but this handle's dispatch sent %d: combine takes "
                  "the dispatch's tokens" % (T, eng.num_tokens))
        if out is None:
            out = torch.empty((T, H), dtype=torch.bfloat16, device=topk_weights.device)
        else:
            _check_cuda("out", out, torch.bfloat16, 2, self.device)
            if tuple(out.shape) != (T, H):
                _fail("out has shape %s, not (%d, %d)" % (tuple(out.shape), T, H))
        y = None if zero_copy or x.data_ptr() == eng.y.data_ptr() else x
        if return_recv_hook:
            eng.combine(_ll.SEND, y, topk_weights, out)
            send_stream = torch.cuda.current_stream()
            return out, EventOverlap(None), lambda: eng.combine(_ll.RECV, None, None, None,
                                                                stream=send_stream)
        eng.combine(_ll.SEND | _ll.RECV, y, topk_weights, out)
        event = EventOverlap(self.capture().event, (x, topk_weights, out)) if async_finish else \
            EventOverlap(None)
        return out, event, None

    def low_latency_health(self):
        """epx's own: raise the EpxError the kernels recorded since the last
        check (a batch refused on every rank for an id outside [-1, experts)
        or one expert twice in a token: INVALID_ARG, reported once; a peer
        that stopped: TIMEOUT, for good). Does not wait for the GPU; call it
        where the ranks are in step, e.g. after a synchronisation."""
        self._alive()
        for eng in self._engines.values():
            eng.health()

    # ---- DeepEP's normal (high-throughput) calls ------------------------------------

    @staticmethod
    def is_sm90_compiled():
        """True: dispatch takes DeepEP's fp8 input (e4m3 rows and fp32 scales
        per 128 values) on any GPU epx runs on."""
        return True

    @staticmethod
    def set_num_sms(new_num_sms):
        """DeepEP's knob for its normal-mode kernels; kept in Buffer.num_sms
        and the configs below, which epx's engine does not need (it sizes its
        own grid)."""
        if isinstance(new_num_sms, bool) or not isinstance(new_num_sms, int) or \
                new_num_sms <= 0 or new_num_sms % 2:
            _fail("set_num_sms takes a positive even int (DeepEP's rule), not %r" % (new_num_sms,))
        Buffer.num_sms = new_num_sms

    @staticmethod
    def get_dispatch_config(num_ranks):
        """A Config as DeepEP's call returns one; epx reads none of it."""
        return Config(Buffer.num_sms, 6, 256, 6, 128)

    @staticmethod
    def get_combine_config(num_ranks):
        """A Config as DeepEP's call returns one; epx reads none of it."""
        return Config(Buffer.num_sms, 6, 256, 6, 128)

    def _normal_engine(self, hidden, num_experts):
        """The engine of DeepEP's normal mode for (hidden, experts): one slot
        per rank, a row of _normal.row_width columns, as many tokens per
        rank as num_nvl_bytes holds."""
        R = self.group_size
        key = ("normal", hidden, num_experts)
        width = _normal.row_width(hidden, num_experts, R)

        def make():
            if self.num_nvl_bytes == 0:
                _fail("dispatch and combine (DeepEP's normal mode) need Buffer(group, "
                      "num_nvl_bytes=...) above 0: it bounds the tokens a rank sends per call")
            if self.enable_shrink:
                _fail("DeepEP's normal mode has no shrink mode: use a Buffer without "
                      "enable_shrink for dispatch and combine")
            M = _normal_tokens(width, R, self.num_nvl_bytes)
            if M < 2:
                _fail("num_nvl_bytes (%d) holds no token of hidden %d over %d ranks: give it at "
                      "least %d" % (self.num_nvl_bytes, hidden, R,
                                    _ll.buffer_bytes(_ll.config(width, R, R, 2), R)))
            return _ll.config(width, R, R, M)
        eng = self._open_engine(key, "normal mode, hidden %d, %d experts" % (hidden, num_experts),
                                make)
        if not hasattr(eng, "stage"):
            # the kernels where the library has them (EPX_TORCH_NORMAL_KERNELS=0:
            # the plain-torch steps, as the tests compare both); read first, so
            # a refused value leaves the engine as it was
            kernels = _env_normal_kernels()
            M = eng.cfg.max_tokens
            dev = eng.recv_x.device  # the engine's GPU
            eng.stage = torch.zeros((M, width), dtype=torch.bfloat16, device=dev)
            eng.columns = torch.full((M, R), -1, dtype=torch.int32, device=dev)
            eng.ones = torch.ones((M, R), dtype=torch.float32, device=dev)
            eng.layout = None  # which dispatch's layout the engine holds
            eng.hidden, eng.num_experts = hidden, num_experts
            use = kernels and eng.stage.is_cuda and _normal_gpu.available()
            eng.rows = _normal_gpu.Rows(hidden, width, R, num_experts) if use else None
        return eng

    def _normal_check(self, name, t, dtype, ndim, rows=None, whose="x has %d tokens"):
        _check_cuda(name, t, dtype, ndim, self.device)
        if rows is not None and t.shape[0] != rows:
            _fail("%s has %d rows; %s" % (name, t.shape[0], whose % rows))

    def dispatch(self, x, handle=None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None,
                 is_token_in_rank=None, num_tokens_per_expert=None, topk_idx=None,
                 topk_weights=None, expert_alignment=1, num_worst_tokens=0, config=None,
                 previous_event=None, async_finish=False, allocate_on_comm_stream=False):
        """DeepEP's normal-mode dispatch: each token goes once to every rank
        in its is_token_in_rank row. Returns (recv_x, recv_topk_idx,
        recv_topk_weights, num_recv_tokens_per_expert_list, handle, event) in
        DeepEP's shapes and dtypes; the received tokens come in (source rank,
        token) order and are fresh tensors. Without num_worst_tokens the
        host waits for the counts (as DeepEP's does)."""
        if self._destroyed:
            _fail("this Buffer was destroyed")
        fp8 = isinstance(x, tuple)
        x, scales = x if fp8 else (x, None)
        if fp8:
            self._normal_check("x[0]", x, torch.float8_e4m3fn, 2)
            T, H = x.shape
            if H % 128:
                _fail("fp8 x has hidden %d; DeepEP's fp8 rows need a multiple of 128" % H)
            _check_cuda("x[1]", scales, torch.float32, 2, self.device, contiguous=False)
            if tuple(scales.shape) != (T, H // 128):
                _fail("x[1] (the scales) has shape %s, not (%d, %d)" % (tuple(scales.shape), T,
                                                                        H // 128))
        else:
            self._normal_check("x", x, torch.bfloat16, 2)
            T, H = x.shape
            if H % 8:
                _fail("x has hidden %d; DeepEP's rows need a multiple of 8 (16 bytes)" % H)
        R, cached = self.group_size, handle is not None
        alignment = _int("expert_alignment", expert_alignment, 1)
        worst = _int("num_worst_tokens", num_worst_tokens, 0)
        if num_tokens_per_rdma_rank is not None:
            _fail("num_tokens_per_rdma_rank: epx's Buffer has no RDMA ranks; pass None")
        if allocate_on_comm_stream and (previous_event is None or not async_finish):
            _fail("allocate_on_comm_stream needs previous_event and async_finish=True "
                  "(DeepEP's condition)")
        if cached:
            if topk_idx is not None or topk_weights is not None:
                _fail("a cached dispatch (handle given) takes no topk_idx or topk_weights "
                      "(DeepEP's rule)")
            eng, layout = self._normal_handle(handle)
            in_rank, E = handle[4], eng.num_experts
            if in_rank.shape[0] != T or eng.hidden != H:
                _fail("x is [%d, %d] but the handle's dispatch sent [%d, %d]: a cached dispatch "
                      "sends the same tokens" % (T, H, in_rank.shape[0], eng.hidden))
        else:
            if num_tokens_per_rank is None or is_token_in_rank is None or \
                    num_tokens_per_expert is None:
                _fail("dispatch without a handle needs num_tokens_per_rank, is_token_in_rank and "
                      "num_tokens_per_expert (get_dispatch_layout gives them)")
            self._normal_check("num_tokens_per_rank", num_tokens_per_rank, torch.int32, 1)
            self._normal_check("is_token_in_rank", is_token_in_rank, torch.bool, 2, T)
            self._normal_check("num_tokens_per_expert", num_tokens_per_expert, torch.int32, 1)
            E = num_tokens_per_expert.shape[0]
            if num_tokens_per_rank.shape[0] != R or is_token_in_rank.shape[1] != R:
                _fail("num_tokens_per_rank %s and is_token_in_rank %s must have the group's %d "
                      "ranks" % (tuple(num_tokens_per_rank.shape),
                                 tuple(is_token_in_rank.shape), R))
            if E % R:
                _fail("num_tokens_per_expert has %d experts, not a multiple of the group's %d "
                      "ranks" % (E, R))
            if topk_idx is not None:
                self._normal_check("topk_idx", topk_idx, (torch.int64, torch.int32), 2, T)
                if not 1 <= topk_idx.shape[1] <= _normal.KCAP:
                    _fail("topk_idx has %d columns; epx's normal mode carries top-k 1..%d"
                          % (topk_idx.shape[1], _normal.KCAP))
                if topk_weights is not None:
                    self._normal_check("topk_weights", topk_weights, torch.float32, 2, T)
                    if topk_weights.shape[1] != topk_idx.shape[1]:
                        _fail("topk_weights has %d columns, topk_idx %d"
                              % (topk_weights.shape[1], topk_idx.shape[1]))
            elif topk_weights is not None:
                _fail("topk_weights needs topk_idx")
            in_rank = is_token_in_rank
            eng, layout = self._normal_engine(H, E), None
        if T + 1 > eng.cfg.max_tokens:
            _fail("x has %d tokens; this Buffer's num_nvl_bytes (%d) holds %d per rank at hidden "
                  "%d over %d ranks: give it more bytes" % (T, self.num_nvl_bytes,
                                                           eng.cfg.max_tokens - 1, H, R))
        _wait(previous_event)
        K = None if topk_idx is None else topk_idx.shape[1]
        counted = (None, None) if cached else (num_tokens_per_rank, num_tokens_per_expert)
        (eng.rows or _normal).pack(eng.stage, eng.columns, x, scales, topk_idx, topk_weights,
                                   in_rank, *counted)
        eng.dispatch(_ll.SEND | _ll.RECV, eng.stage[:T + 1], eng.columns[:T + 1])
        eng.num_tokens = T
        if torch.cuda.is_current_stream_capturing():
            eng.graphed = True  # replays now change the engine behind the host's back
        if not cached:
            self._layouts += 1
            layout = self._layouts
        eng.layout = layout
        recv_x, recv_ids, recv_w, per_expert_list, got = (
            self._receive_kernels if eng.rows is not None else self._receive_torch)(
                eng, E, fp8, K, alignment, worst, handle if cached else None)
        if recv_ids is not None and topk_idx.dtype != recv_ids.dtype:
            recv_ids = recv_ids.to(topk_idx.dtype)  # DeepEP returns topk_idx's dtype
        if not cached:
            handle = _NormalHandle(got + (in_rank, None), eng, layout, worst > 0,
                                   torch.cuda.is_current_stream_capturing())
        event = EventOverlap(self.capture().event, (x, in_rank)) if async_finish else \
            EventOverlap(None)
        if cached:
            return recv_x, None, None, None, None, event  # DeepEP's cached-dispatch outputs
        return recv_x, recv_ids, recv_w, per_expert_list, handle, event

    def combine(self, x, handle, topk_weights=None, bias=None, config=None, previous_event=None,
                async_finish=False, allocate_on_comm_stream=False):
        """DeepEP's normal-mode combine: each token's rows summed over the
        ranks it went to (no weights applied), in fp32, rounded once to bf16,
        bias terms added before the rounding; with topk_weights their fp32
        sums too. Returns (combined_x [tokens, hidden] bf16, combined_topk_weights
        or None, event)."""
        if self._destroyed:
            _fail("this Buffer was destroyed")
        eng, layout = self._normal_handle(handle)
        rows = handle[1]
        self._normal_check("x", x, torch.bfloat16, 2)
        if x.shape[0] != rows.shape[0]:
            _fail("x has %d rows; the handle's dispatch received %d tokens: combine takes one "
                  "row per received token" % (x.shape[0], rows.shape[0]))
        T, H = handle[4].shape[0], eng.hidden
        if x.shape[1] != H:
            _fail("x has hidden %d; the handle's dispatch sent %d" % (x.shape[1], H))
        K = None
        if topk_weights is not None:
            self._normal_check("topk_weights", topk_weights, torch.float32, 2)
            K = topk_weights.shape[1]
            if topk_weights.shape[0] != rows.shape[0]:
                _fail("topk_weights has %d rows; the handle's dispatch received %d tokens"
                      % (topk_weights.shape[0], rows.shape[0]))
            if not 1 <= K <= _normal.KCAP:
                _fail("topk_weights has %d columns; epx's normal mode carries top-k 1..%d"
                      % (K, _normal.KCAP))
        bias = bias if isinstance(bias, tuple) else (bias,)
        if len(bias) > 2:
            _fail("bias is one tensor or a tuple of two (DeepEP's rule), not %d" % len(bias))
        for b in bias:
            if b is not None:
                self._normal_check("bias", b, torch.bfloat16, 2, T,
                                   "the handle's dispatch sent %d tokens")
                if b.shape[1] != H:
                    _fail("bias has hidden %d, not the dispatch's %d" % (b.shape[1], H))
        if allocate_on_comm_stream and (previous_event is None or not async_finish):
            _fail("allocate_on_comm_stream needs previous_event and async_finish=True "
                  "(DeepEP's condition)")
        _wait(previous_event)
        capturing = torch.cuda.is_current_stream_capturing()
        # The engine routes a combine by its latest dispatch. The host knows
        # which one that is while no CUDA graph is involved; once one was
        # captured, a replay can have changed it (eager calls then always
        # resend), and a combine captured apart from its dispatch cannot know
        # what the engine will hold at replay (it resends too).
        unknown = not handle._epx_captured if capturing else getattr(eng, "graphed", False)
        if eng.layout != layout or unknown:
            # Send this handle's columns again (rows unread) so the engine
            # routes the combine as its dispatch did. Every rank decides
            # alike: the layouts follow the calls, which every rank makes in
            # one order.
            _normal.route(eng.columns, handle[4])
            eng.dispatch(_ll.SEND | _ll.RECV, eng.stage[:T + 1], eng.columns[:T + 1])
            eng.layout = layout
        if eng.rows is not None:
            eng.rows.fill(eng.y[0], rows, x, topk_weights,
                          eng.layout_range[0] if handle._epx_worst else None)
        else:
            _normal.fill_combine(eng.y[0], rows, x, topk_weights)
        # fp32 sums where the weights or a bias need them; else the engine
        # rounds to bf16 itself (half the bytes written and read back)
        exact = K is not None or any(b is not None for b in bias)
        out = torch.empty((T + 1, eng.cfg.hidden), dtype=torch.float32 if exact else
                          torch.bfloat16, device=eng.y.device)
        eng.combine(_ll.SEND | _ll.RECV, None, eng.ones[:T + 1], out,
                    out_dtype=_ll.DTYPE_F32 if exact else _ll.DTYPE_BF16)
        if exact and eng.rows is not None:
            combined_x, combined_w = eng.rows.combined(out, T, K or 0, bias)
        else:
            combined_x, combined_w = _normal.combined(out, T, H, K, bias)
        event = EventOverlap(self.capture().event, (x, out)) if async_finish else \
            EventOverlap(None)
        return combined_x, combined_w, event

    def internode_dispatch(self, x, handle=None, num_tokens_per_rank=None,
                           num_tokens_per_rdma_rank=None, is_token_in_rank=None,
                           num_tokens_per_expert=None, topk_idx=None, topk_weights=None,
                           expert_alignment=1, config=None, previous_event=None,
                           async_finish=False, allocate_on_comm_stream=False):
        """DeepEP's internode (RDMA) half of dispatch, which its dispatch
        calls across nodes: not offered; epx's dispatch serves the whole
        group as one engine."""
        raise NotImplementedError(
            "internode_dispatch: epx.torch.Buffer has no internode (RDMA) path; call "
            "dispatch, which serves every rank of the group")

    def internode_combine(self, x, handle, topk_weights=None, bias=None, config=None,
                          previous_event=None, async_finish=False, allocate_on_comm_stream=False):
        """DeepEP's internode (RDMA) half of combine: not offered (see
        internode_dispatch)."""
        raise NotImplementedError(
            "internode_combine: epx.torch.Buffer has no internode (RDMA) path; call combine "
            "with the handle dispatch returned")

    def _receive_kernels(self, eng, E, fp8, K, alignment, worst, handle):
        """The receive as DeepEP's tensors, by epx_normal_counts/unpack: (x,
        ids, weights, per-expert list, (rank_prefix_matrix, rows, None, src))."""
        recv, lr = eng.recv_x[0], eng.layout_range[0]
        per_expert_list, prefix = [], None
        if handle is not None:
            n = handle[1].shape[0]
        else:
            prefix, counts = eng.rows.counts(recv, lr, self.rank, alignment)
            n = worst
            if worst:
                self._count_dropped(counts[:1], worst)
            else:  # the host learns the count and the list in one wait
                n, *per_expert_list = counts.tolist()
        x, ids, w, src, rows = eng.rows.unpack(recv, lr, eng.src_info[0], self.rank, n, fp8,
                                               K or 0)
        return x, ids, w, per_expert_list, (prefix, rows, None, src)

    def _receive_torch(self, eng, E, fp8, K, alignment, worst, handle):
        """The same in plain torch steps (epx.torch._normal): where the
        library lacks the kernels."""
        R, L = self.group_size, E // self.group_size
        recv, lr = eng.recv_x[0], eng.layout_range[0]
        per_expert_list, got = [], None
        if handle is not None:
            rows, valid = handle[1], handle[2]
        else:
            per_rank, per_expert = _normal.counts_of(recv, _normal.count_rows(lr), R, E)
            prefix = torch.cumsum(per_rank, 0, dtype=torch.int32)
            n = worst
            if not worst:  # the host learns the count and the list in one wait
                real = ((lr & 0xFFFFFFFF) - 1).clamp(min=0).sum().view(1)
                aligned = (per_expert.sum(0, dtype=torch.int32)[self.rank * L:(self.rank + 1) * L]
                           + alignment - 1) // alignment * alignment
                n, *per_expert_list = torch.cat([real, aligned.to(torch.int64)]).tolist()
            rows, valid, real, _ = _normal.row_map(lr, n)
            valid = valid if worst else None  # without padding every row is real
            if worst:
                self._count_dropped(real.sum().view(1), worst)
            src = eng.src_info[0].index_select(0, rows)
            if valid is not None:
                src = torch.where(valid, src, -1)
            got = (prefix, rows, valid, src)
        x, ids, w = _normal.unpack(recv, rows, valid, eng.hidden, fp8, K, self.rank, L)
        return x, ids, w, per_expert_list, got

    def _count_dropped(self, received, worst):
        """Tokens past num_worst_tokens are not returned: count them on the
        device (no host wait) for normal_health to report."""
        if self._dropped is None:
            self._dropped = torch.zeros(1, dtype=torch.int64, device=received.device)
        self._dropped += (received.to(torch.int64) - worst).clamp(min=0)

    def normal_health(self):
        """epx's own: raise EpxError(INVALID_ARG) when a dispatch with
        num_worst_tokens received more tokens than that since the last check
        (those past it were not returned, and their combine rows are zeros).
        Waits for the GPU."""
        if self._dropped is None:
            return
        n = int(self._dropped.item())
        if n:
            self._dropped.zero_()
            raise EpxError(Status.INVALID_ARG, "dispatch: %d received token(s) did not fit "
                           "num_worst_tokens and were left out: pass a larger num_worst_tokens "
                           "(at most the ranks' tokens, num_ranks * num_tokens)" % n)

    def _normal_handle(self, handle):
        if not isinstance(handle, _NormalHandle):
            _fail("handle must be the handle a dispatch of this Buffer returned")
        eng = handle._epx_engine
        if all(eng is not e for e in self._engines.values()):
            _fail("this handle does not come from a dispatch of this Buffer")
        return eng, handle._epx_layout

    # ---- lifetime -------------------------------------------------------------

    def destroy(self):
        """Collective: every rank stops launching, then frees its engines."""
        import torch.distributed as dist
        assert self.explicitly_destroy, "destroy() is for Buffer(..., explicitly_destroy=True)"
        if self._destroyed:
            return
        torch.cuda.synchronize()
        dist.barrier(group=self.group)  # nobody launches any more
        for eng in self._engines.values():
            eng.disconnect()  # unmap the peers
        dist.barrier(group=self.group)  # nobody maps our buffers any more
        for eng in self._engines.values():
            eng.destroy()
        self._engines.clear()
        self._destroyed = True

    def __del__(self):
        # Not collective (DeepEP's explicitly_destroy=False): the engines are
        # freed with the process when no one called destroy().
        pass


# ---- the plain-torch definition the engine is tested against ------------------

def reference_dispatch(xs, topk_idxs, rank, num_experts, num_max_dispatch_tokens_per_rank):
    """What rank `rank` receives, by definition: for each of its local
    experts e (global id rank * L + e), the rows of every source rank s, every
    token t and every k with topk_idxs[s][t][k] == that id, in (s, t, k)
    order. xs[s] [T_s][H] and topk_idxs[s] [T_s][K] are every rank's inputs
    (any device; negative ids mean no expert). Returns (recv_x [L][R*M][H],
    recv_count [L] int32, src_info [L][R*M] int32, layout_range [L][R]
    int64); rows past recv_count are zeros."""
    R, M, E = len(xs), int(num_max_dispatch_tokens_per_rank), int(num_experts)
    L, H = E // R, xs[0].shape[1]
    recv_x = torch.zeros((L, R * M, H), dtype=xs[0].dtype)
    src_info = torch.zeros((L, R * M), dtype=torch.int32)
    count = torch.zeros(L, dtype=torch.int32)
    layout = torch.zeros((L, R), dtype=torch.int64)
    for e in range(L):
        gid, n = rank * L + e, 0
        for s in range(R):
            ids = topk_idxs[s].cpu().to(torch.int64)
            t_idx, _ = (ids == gid).nonzero(as_tuple=True)  # row-major: (t, k) order
            begin = n
            for t in t_idx.tolist():
                recv_x[e, n] = xs[s][t].cpu()
                src_info[e, n] = t
                n += 1
            layout[e, s] = (begin << 32) | (n - begin)
        count[e] = n
    return recv_x, count, src_info, layout


def reference_combine(expert_out, topk_idx, topk_weights, hidden=None):
    """The combine of one rank's tokens, by definition: out[t] = bf16(sum
    over k ascending with topk_idx[t][k] >= 0 of w[t][k] * y_k), in fp32,
    each product and sum rounded (no fused multiply-add). expert_out(t, k)
    gives y_k [H] (the output of token t's k-th expert for it); hidden sets H
    when no token has an expert."""
    T, K = topk_idx.shape
    rows = []
    for t in range(T):
        acc = None
        for k in range(K):
            if int(topk_idx[t, k]) < 0:
                continue
            y = expert_out(t, k).float().cpu()
            term = topk_weights[t, k].float().cpu() * y
            acc = term + 0.0 if acc is None else acc + term
        rows.append(acc if acc is not None else None)
    H = hidden if hidden is not None else next((r.shape[0] for r in rows if r is not None), 0)
    out = torch.zeros((T, H), dtype=torch.float32)
    for t, r in enumerate(rows):
        if r is not None:
            out[t] = r
    return out.to(torch.bfloat16)
