"""The torch custom ops (namespace "epx"): one C call each, CUDA tensors to
libepx_cuda.so's kernels on the current stream, CPU tensors to libepx.so's
references. Registered with torch.library.custom_op plus a fake (meta)
implementation, so torch.compile traces them and CUDA graphs capture them:
outputs are allocated by torch, the kernels are only enqueued, nothing waits.

Integer inputs (topk ids, positions) may be int32 or int64; they are narrowed
to int32 (one conversion kernel for int64) because every kernel works on
int32 ids. Rows are float32 or bfloat16.
"""
import ctypes
from typing import List, Optional

import torch

from .. import _arrays as _A
from .. import dispatch as _dispatch
from .._native import EpxError, Status
from .._native import call as _cpu_call
from . import _cpu, _gpu

PHYSICAL, STATIC, DYNAMIC, WEIGHTED = (_dispatch.DISPATCH_MODES[m] for m in
                                       ("physical", "static", "dynamic", "weighted"))
_ROW_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
_U64 = (1 << 64) - 1


def _addr(t):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def _int_ptr(t):
    return None if t is None else ctypes.cast(t.data_ptr(), ctypes.POINTER(ctypes.c_int32))


def _same_device(name, t, device, ref="the ids"):
    if t is not None and t.device != device:
        raise ValueError("%s is on %s but %s is on %s: put every input of one call on "
                         "one device" % (name, t.device, ref, device))


_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1


def _device(t):
    """The device of an op's first tensor: CPU or CUDA, nothing else (the C
    references would read another device's pointers as host memory)."""
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError("epx.torch serves CPU and CUDA tensors, not %s: move the inputs with "
                         ".cpu() or .cuda()" % t.device)
    return t.device


def tensor_arg(t, name):
    """t when it is a torch.Tensor, else a TypeError in the caller's name
    (torch's own names the op's parameter and prints its schema)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s must be a torch.Tensor, got %s: convert it with torch.as_tensor"
                        % (name, type(t).__name__))
    return t


def _int_meta(t, name, ndim, empty_k=False):
    """The checks of _ints that read no values (the fakes run them too).
    A [T][0] tensor is refused (each token needs an expert), a [0][0] one
    too unless empty_k (combine's pos: nothing to combine)."""
    if t.layout != torch.strided:
        raise ValueError("%s must be a dense tensor, got layout %s: pass t.to_dense()"
                         % (name, t.layout))
    if t.dim() != ndim:
        raise ValueError("%s must have %d dimensions, got shape %s" % (name, ndim,
                                                                        tuple(t.shape)))
    if ndim == 2 and t.shape[1] == 0 and (t.shape[0] > 0 or not empty_k):
        raise ValueError("%s has shape %s: each token needs at least one expert (top-k >= 1)"
                         % (name, tuple(t.shape)))
    if t.dtype not in (torch.int32, torch.int64):
        raise ValueError("%s must be int32 or int64, got %s" % (name, t.dtype))


def _ints(t, name, ndim, empty_k=False):
    """t as a contiguous int32 tensor of ndim dimensions, or a clear error.
    int64 values outside int32 must not wrap into valid ids: on the CPU they
    are refused by name; on CUDA (no host sync) they become INT32_MAX, an id
    the kernels treat as out of range."""
    _int_meta(t, name, ndim, empty_k)
    if t.dtype == torch.int64:
        if t.device.type == "cpu":
            bad = (t < _I32_MIN) | (t > _I32_MAX)
            if bool(bad.any()):
                idx = tuple(int(i) for i in bad.nonzero()[0])
                raise ValueError("%s%s = %d does not fit in int32: ids and positions are "
                                 "int32" % (name, list(idx), int(t[idx])))
        else:
            t = t.clamp(min=_I32_MIN, max=_I32_MAX)
    return t.to(torch.int32).contiguous()


def _rows(t, name):
    if t.dim() != 2:
        raise ValueError("%s must be [rows][hidden], got shape %s" % (name, tuple(t.shape)))
    if t.dtype not in _ROW_DTYPES:
        raise ValueError("%s is %s; epx moves float32 and bfloat16 rows (convert with "
                         ".to(torch.bfloat16))" % (name, t.dtype))
    return t.contiguous()


def _weights_meta(weights, T, K):
    """combine's weights: [T][K], real (a complex weight's cast would keep
    only its real part)."""
    if tuple(weights.shape) != (T, K):
        raise ValueError("weights is %s but pos is %s: one weight per (token, k)"
                         % (tuple(weights.shape), (T, K)))
    if weights.is_complex():
        raise ValueError("weights is %s: combine weights are real (any float or integer "
                         "dtype); pass weights.real or weights.abs()" % weights.dtype)


def _count(v, name, hi, limit):
    """An op's count argument in [1, hi] (torch's int is int64; the C
    arguments are int32)."""
    return _A.integer(v, name, 1, hi, limit)


def _check_ranks(count, num_ranks, count_name, held):
    """count (the caller's count_name: num_experts or num_physical) spread
    evenly over num_ranks, each rank holding its run of `held` (experts or
    slots); the message names the caller's parameters and the nearest
    counts that divide."""
    if count < 1 or num_ranks < 1 or count % num_ranks:
        fix = ""
        if num_ranks >= 1:
            below = count - count % num_ranks
            fix = "; use %s = %s" % (count_name, " or ".join(
                str(n) for n in (below, below + num_ranks) if n >= 1))
        raise ValueError("%s (%d) must be a positive multiple of num_ranks (%d): rank r holds "
                         "%s r*%s/num_ranks .. (r+1)*%s/num_ranks - 1%s"
                         % (count_name, count, num_ranks, held, count_name, count_name, fix))


def _refuse_outside(ids, bound, ids_name, bound_name):
    """After the C reference refused ids (it names its own arguments: phys,
    P, E), raise the refusal again in the caller's names: the first id
    outside [-1, bound). Returns when every id is inside (another failure,
    which the caller re-raises as it is). Only on the failure path: a batch
    that passes pays nothing for the names."""
    bad = ((ids < -1) | (ids >= bound)).nonzero()
    if bad.shape[0]:
        t, k = (int(i) for i in bad[0])
        raise EpxError(Status.INVALID_ARG, "%s[%d][%d] = %d is outside [-1, %d): each id is "
                       "-1 (none) or below %s = %d" % (ids_name, t, k, int(ids[t, k]), bound,
                                                      bound_name, bound)) from None


def _launch(device, entry, *args):
    """Enqueue GPU entry point `entry` on `device`'s current stream (the
    stream and error arguments appended), switching devices only when needed."""
    idx = torch.cuda.current_device() if device.index is None else device.index
    problem = _gpu.arch_problem(idx)
    if problem is not None:
        raise EpxError(Status.UNSUPPORTED, problem)
    stream = ctypes.c_void_p(torch.cuda.current_stream(idx).cuda_stream)
    if idx == torch.cuda.current_device():
        _gpu.call(entry, *args, stream)
    else:
        with torch.cuda.device(idx):
            _gpu.call(entry, *args, stream)


def run(name, tensors, *args):
    """Op `name` on args: its implementation directly when eager(*tensors),
    else through torch's dispatcher (torch.ops.epx.<name>)."""
    op = globals()["impl_" + name] if eager(*tensors) else getattr(torch.ops.epx, name)
    return op(*args)


_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def eager(*tensors):
    """True when a call may skip torch's dispatcher and run the implementation
    directly: plain tensors needing no grad, no torch.compile tracing and no
    dispatch or function mode (fake tensors, make_fx, functionalization)
    active. The dispatcher costs 11-20 us a call (bench/RESULTS.md); these
    checks ~1 us. Under any
    of those the custom op itself runs, so tracing sees the op."""
    # is_compiling first: dynamo folds it to True and never traces the rest.
    # torch.jit.trace records only ops: a direct C call would leave the trace
    # returning its outputs' uninitialised memory. vmap/grad (functorch)
    # wrap tensors that have no storage for the C call to read.
    return (not torch.compiler.is_compiling() and torch._C._len_torch_dispatch_stack() == 0 and
            torch._C._len_torch_function_stack() == 0 and not torch._C._is_tracing() and
            all(t is None or (type(t) is torch.Tensor and not t.requires_grad and
                              not _wrapped(t)) for t in tensors))


# ---- layout ------------------------------------------------------------------

_FULL = ("rank_offsets", "rank_perm", "pair_rank_pos", "slot_offsets", "slot_perm",
         "pair_slot_pos")


def _layout_outputs(T, K, P, G, device, full):
    i64 = dict(dtype=torch.int64, device=device)
    outs = {"tokens_per_rank": torch.empty(G, **i64), "tokens_per_slot": torch.empty(P, **i64),
            "is_token_in_rank": torch.empty((T, G), dtype=torch.bool, device=device)}
    if full:
        i32 = dict(dtype=torch.int32, device=device)
        outs.update(rank_offsets=torch.empty(G + 1, **i32),
                    # capacity T*K; the tail past the last offset is -1, not stale memory
                    rank_perm=torch.full((T * K,), -1, **i32),
                    pair_rank_pos=torch.empty((T, K), **i32),
                    slot_offsets=torch.empty(P + 1, **i32),
                    slot_perm=torch.full((T * K,), -1, **i32),
                    pair_slot_pos=torch.empty((T, K), **i32))
    return outs


# What each layout op calls its inputs, for its messages: (ids, count, what
# a rank holds). dispatch_layout's ids may carry another name (DeepEP's
# get_dispatch_layout calls them topk_idx).
_LAYOUT_NAMES = {False: ("topk_ids", "num_experts", "experts"),
                 True: ("phys", "num_physical", "slots")}


def _layout(ids, P, G, full, ids_name=None):
    own_name, count_name, held = _LAYOUT_NAMES[full]
    ids_name = ids_name or own_name
    _layout_counts(P, G, full)
    _device(ids)
    ids = _ints(ids, ids_name, 2)
    T, K = ids.shape
    outs = _layout_outputs(T, K, P, G, ids.device, full)
    lay = _dispatch.TokenLayout(**{k: v.data_ptr() for k, v in outs.items()})
    if ids.device.type == "cuda":
        spec = _dispatch.DispatchSpec(PHYSICAL, P, P, 1, None, None, None, None, 0, 0, 0)
        phys = torch.empty((T, K), dtype=torch.int32, device=ids.device)
        _launch(ids.device, _gpu.dispatch_layout, ctypes.byref(spec), _addr(ids), T, K, P, G,
                _addr(phys), ctypes.byref(lay))
    else:
        try:
            _cpu_call(_cpu.token_layout, _addr(ids), T, K, P, G, ctypes.byref(lay))
        except EpxError:
            _refuse_outside(ids, P, ids_name, count_name)
            raise
    return outs


LAYOUT_FIELDS = ("tokens_per_rank", "tokens_per_slot", "is_token_in_rank") + _FULL


def _as_list(outs, full):
    """The op's outputs in order: DeepEP's three, or every field."""
    return [outs[k] for k in (LAYOUT_FIELDS if full else LAYOUT_FIELDS[:3])]


def _layout_counts(P, G, full):
    count_name, held = _LAYOUT_NAMES[full][1:]
    _count(P, count_name, _A.MAX_PHYSICAL if full else _A.MAX_EXPERTS,
           "4 (E + G) slots at most" if full else "EPX_MAX_EXPERTS")
    _count(G, "num_ranks", _A.MAX_GPUS, "EPX_MAX_GPUS")
    _check_ranks(P, G, count_name, held)


def _fake_layout(ids, P, G, full, ids_name=None):
    _layout_counts(P, G, full)
    _int_meta(ids, ids_name or _LAYOUT_NAMES[full][0], 2)
    T, K = ids.shape
    return _as_list(_layout_outputs(T, K, P, G, ids.device, full), full)


def impl_dispatch_layout(topk_ids: torch.Tensor, num_experts: int, num_ranks: int,
                         ids_name: str = "topk_ids") -> List[torch.Tensor]:
    return _as_list(_layout(topk_ids, num_experts, num_ranks, False, ids_name), False)


def impl_token_layout(phys: torch.Tensor, num_physical: int, num_ranks: int) -> List[torch.Tensor]:
    return _as_list(_layout(phys, num_physical, num_ranks, True), True)


dispatch_layout = torch.library.custom_op("epx::dispatch_layout", impl_dispatch_layout,
                                          mutates_args=())
dispatch_layout.register_fake(lambda ids, P, G, ids_name="topk_ids":
                              _fake_layout(ids, P, G, False, ids_name))
token_layout = torch.library.custom_op("epx::token_layout", impl_token_layout, mutates_args=())
token_layout.register_fake(lambda ids, P, G: _fake_layout(ids, P, G, True))


# ---- logical -> physical ---------------------------------------------------------


def _map_spec(mode, E, P, table, replicas, num_valid, thresholds, seed, pass_id, layer):
    width = 1 if replicas is None else replicas.shape[1]
    return _dispatch.DispatchSpec(mode, E, P, width, _int_ptr(table), _int_ptr(replicas),
                                  _int_ptr(num_valid),
                                  None if thresholds is None else
                                  ctypes.cast(thresholds.data_ptr(),
                                              ctypes.POINTER(ctypes.c_uint32)),
                                  seed & _U64, pass_id & 0xFFFFFFFF, layer & 0xFFFFFFFF)


def _table_arg(name, t, num_experts, ndim):
    """A mapping table as the kernels read it: int32, [E] or [E][W], contiguous.
    (Mapping builds them so; the op checks because a wrong dtype would be read
    as other numbers.)"""
    if t is None:
        return None
    if t.dtype != torch.int32 or t.dim() != ndim or t.shape[0] != num_experts:
        raise ValueError("%s must be int32 with %d dimension(s) and %d rows (one per expert), "
                         "got %s %s: build it with epx.torch.Mapping"
                         % (name, ndim, num_experts, t.dtype, tuple(t.shape)))
    return t.contiguous()


def impl_map_ids(topk_ids: torch.Tensor, mode: int, num_experts: int, num_physical: int,
            table: Optional[torch.Tensor], replicas: Optional[torch.Tensor],
            num_valid: Optional[torch.Tensor], thresholds: Optional[torch.Tensor], seed: int,
            pass_id: int, layer: int) -> torch.Tensor:
    dev = _device(topk_ids)
    ids = _ints(topk_ids, "topk_ids", 2)
    # the C spec's fields are int32 / uint32: checked, never truncated
    if isinstance(mode, bool) or mode not in _dispatch.DISPATCH_MODES.values():
        raise ValueError("mode %r is not a dispatch mode: one of %s (epx.dispatch.DISPATCH_MODES; "
                         "epx.torch.Mapping sets it)"
                         % (mode, ", ".join("%d (%s)" % (v, k) for k, v in
                                            sorted(_dispatch.DISPATCH_MODES.items(),
                                                   key=lambda kv: kv[1]))))
    _A.integer(num_experts, "num_experts", 0, _A.MAX_EXPERTS, "EPX_MAX_EXPERTS")
    _count(num_physical, "num_physical", _A.MAX_PHYSICAL, "4 (E + G) slots at most")
    _A.integer(pass_id, "pass_id", 0, 2 ** 32 - 1, "map_ids keys it modulo 2^32")
    _A.integer(layer, "layer", 0, 2 ** 32 - 1, "a uint32")
    for name, t in (("table", table), ("replicas", replicas), ("num_valid", num_valid),
                    ("thresholds", thresholds)):
        _same_device(name, t, dev)
    table, replicas, num_valid, thresholds = (
        _table_arg(n, t, num_experts, d) for n, t, d in
        (("table", table, 1), ("replicas", replicas, 2), ("num_valid", num_valid, 1),
         ("thresholds", thresholds, 2)))
    if thresholds is not None and (replicas is None or thresholds.shape != replicas.shape):
        # the C reads thresholds[e][r] with the replicas' width
        raise ValueError("thresholds has shape %s but replicas %s: one threshold per replica; "
                         "build both with epx.torch.Mapping.weighted"
                         % (tuple(thresholds.shape), None if replicas is None else
                            tuple(replicas.shape)))
    T, K = ids.shape
    spec = _map_spec(mode, num_experts, num_physical, table, replicas, num_valid, thresholds,
                     seed, pass_id, layer)
    out = torch.empty((T, K), dtype=torch.int32, device=dev)
    if dev.type == "cuda":
        _launch(dev, _gpu.map_ids, ctypes.byref(spec), _addr(ids), T, K, _addr(out))
    else:
        try:
            _cpu_call(_dispatch._map_ids, ctypes.byref(spec), _int_ptr(ids), T, K,
                      _int_ptr(out))
        except EpxError:
            # ids are the mapping's experts (slots in physical mode)
            bound, name = ((num_physical, "num_physical") if mode == PHYSICAL else
                           (num_experts, "the mapping's num_experts"))
            _refuse_outside(ids, bound, "topk_ids", name)
            raise
    return out


map_ids = torch.library.custom_op("epx::map_ids", impl_map_ids, mutates_args=())


@map_ids.register_fake
def _(topk_ids, mode, num_experts, num_physical, table, replicas, num_valid, thresholds, seed,
      pass_id, layer):
    _int_meta(topk_ids, "topk_ids", 2)
    return torch.empty(tuple(topk_ids.shape), dtype=torch.int32, device=topk_ids.device)


# ---- rows ----------------------------------------------------------------------


def impl_gather_rows(x: torch.Tensor, order: torch.Tensor, per_token: int) -> torch.Tensor:
    _device(x)
    x = _rows(x, "x")
    if order.dim() != 1:
        raise ValueError("order must be 1-D (a send order: rank_perm or slot_perm), got shape %s"
                         % (tuple(order.shape),))
    _same_device("order", order, x.device, "x")
    order = _ints(order, "order", 1)
    _count(per_token, "per_token", _I32_MAX, "1 for rank_perm, K for slot_perm")
    T, H = x.shape
    n = order.shape[0]
    # every row is written once (zeros for -1): no clearing pass, nothing stale
    out = torch.empty((n, H), dtype=x.dtype, device=x.device)
    dt = _ROW_DTYPES[x.dtype]
    if x.device.type == "cuda":
        _launch(x.device, _gpu.gather_rows, _addr(x), dt, T, H, _addr(order), n, per_token,
                _addr(out))
    else:
        _cpu_call(_cpu.gather_rows, _addr(x), dt, T, H, _addr(order), n, per_token, _addr(out))
    return out


gather_rows = torch.library.custom_op("epx::gather_rows", impl_gather_rows, mutates_args=())


@gather_rows.register_fake
def _(x, order, per_token):
    _rows(x, "x")
    _same_device("order", order, x.device, "x")
    if order.dim() != 1:
        raise ValueError("order must be 1-D (a send order: rank_perm or slot_perm), got shape %s"
                         % (tuple(order.shape),))
    _int_meta(order, "order", 1)
    _count(per_token, "per_token", _I32_MAX, "1 for rank_perm, K for slot_perm")
    return x.new_empty((order.shape[0], x.shape[1]))


def impl_combine(y: torch.Tensor, pos: torch.Tensor,
                 weights: Optional[torch.Tensor]) -> torch.Tensor:
    _device(y)
    y = _rows(y, "y")
    _same_device("pos", pos, y.device, "y")
    pos = _ints(pos, "pos", 2, empty_k=True)
    T, K = pos.shape
    if weights is not None:
        _same_device("weights", weights, y.device, "y")
        _weights_meta(weights, T, K)
        weights = weights.to(torch.float32).contiguous()
    H = y.shape[1]
    if y.shape[0] == 0:
        # nothing was routed (every id -1): zero rows, as the formula gives;
        # a position that points anywhere is refused on the CPU
        if y.device.type == "cpu" and bool((pos != -1).any()):
            t, k = (int(i) for i in (pos != -1).nonzero()[0])
            raise ValueError("pos[%d][%d] = %d but y has no rows: every position must be -1 "
                             "(none), or y is [rows][hidden] of the send order pos indexes"
                             % (t, k, int(pos[t, k])))
        return torch.zeros((T, H), dtype=y.dtype, device=y.device)
    out = torch.empty((T, H), dtype=y.dtype, device=y.device)
    dt = _ROW_DTYPES[y.dtype]
    if y.device.type == "cuda":
        _launch(y.device, _gpu.combine_rows, _addr(y), dt, H, _addr(pos), _addr(weights), T, K,
                _addr(out))
    else:
        _cpu_call(_cpu.combine_rows, _addr(y), dt, y.shape[0], H, _addr(pos), _addr(weights), T,
                  K, _addr(out))
    return out


combine = torch.library.custom_op("epx::combine", impl_combine, mutates_args=())


@combine.register_fake
def _(y, pos, weights):
    _rows(y, "y")
    _same_device("pos", pos, y.device, "y")
    _int_meta(pos, "pos", 2, empty_k=True)
    if weights is not None:
        _same_device("weights", weights, y.device, "y")
        _weights_meta(weights, *pos.shape)
    return y.new_empty((pos.shape[0], y.shape[1]))


# ---- autograd ------------------------------------------------------------------
# Plain-torch backward formulas, so a tensor that needs grad (training, or a
# torch.compile'd module with parameters) gets gradients instead of torch's
# "no autograd formula was registered" at backward(). Both accumulate in
# float32 and round once to the input's dtype, as the forward does.


def _gather_setup(ctx, inputs, output):
    x, order, per_token = inputs
    ctx.x_shape, ctx.x_dtype, ctx.per_token = tuple(x.shape), x.dtype, per_token
    ctx.save_for_backward(order)


def _gather_backward(ctx, grad):
    """out[i] = x[order[i] // per_token] (0 where order[i] = -1): each x row
    gets the sum of the gradients of the rows gathered from it."""
    order, = ctx.saved_tensors
    ok = order >= 0
    src = torch.div(order[ok].long(), ctx.per_token, rounding_mode="floor")
    gx = torch.zeros(ctx.x_shape, dtype=torch.float32, device=grad.device)
    gx.index_add_(0, src, grad[ok].float())
    return gx.to(ctx.x_dtype), None, None


gather_rows.register_autograd(_gather_backward, setup_context=_gather_setup)


def _combine_setup(ctx, inputs, output):
    y, pos, weights = inputs
    ctx.y_dtype, ctx.w_dtype = y.dtype, None if weights is None else weights.dtype
    ctx.save_for_backward(y, pos, weights)


def _combine_backward(ctx, grad):
    """out[t] = sum over k with pos[t][k] >= 0 of w[t][k] * y[pos[t][k]]:
    y's row pos[t][k] gets w[t][k] * grad[t]; w[t][k] gets <grad[t],
    y[pos[t][k]]> (0 where pos[t][k] = -1)."""
    y, pos, weights = ctx.saved_tensors
    T, K = pos.shape
    ok = pos >= 0
    t_idx, k_idx = ok.nonzero(as_tuple=True)
    rows = pos[ok].long()
    g = grad.float()[t_idx]  # [pairs][H]
    gy = gw = None
    if ctx.needs_input_grad[0]:
        scale = g if weights is None else g * weights[t_idx, k_idx].float()[:, None]
        gy = torch.zeros(y.shape, dtype=torch.float32, device=y.device)
        gy.index_add_(0, rows, scale)
        gy = gy.to(ctx.y_dtype)
    if weights is not None and ctx.needs_input_grad[2]:
        gw = torch.zeros((T, K), dtype=torch.float32, device=grad.device)
        gw[t_idx, k_idx] = (g * y[rows].float()).sum(1)
        gw = gw.to(ctx.w_dtype)
    return gy, None, gw


combine.register_autograd(_combine_backward, setup_context=_combine_setup)
