"""epx.torch: epx's per-batch dispatch ops on torch tensors.

    import epx.torch as et
    tpr, tpe, in_rank = et.dispatch_layout(topk_ids, num_experts=256, num_ranks=8)
    tpr, _, tpe, in_rank, ev = et.get_dispatch_layout(topk_idx, 256, num_ranks=8)  # DeepEP's
    m = et.Mapping.weighted(replicas, slot_weights, num_physical=288).to("cuda")
    phys = et.map_ids(topk_ids, m, layer=3, pass_id=step)
    phys, per_slot = et.balanced_topk(topk_ids, et.Mapping.balanced(replicas, 288, 8))
    lay = et.token_layout(phys, num_physical=288, num_ranks=8)
    send = et.permute(x, lay, "rank")
    out = et.combine(y, lay.pair_slot_pos, topk_weights)

CUDA tensors run epx's CUDA kernels (libepx_cuda.so, built by `pip install
./python` where nvcc is present) on the caller's current stream: no copy to
the host, no synchronisation. CPU tensors run libepx's C references, which
compute the same numbers (integers equal, floats bit for bit). Every op is a
torch custom op (torch.ops.epx.*) with a fake implementation, so torch.compile
traces it and a CUDA graph captures it; permute and combine register their
backward, so rows that need grad train through them. Called eagerly on plain tensors the
functions here skip torch's dispatcher (11-20 us a call, bench/RESULTS.md) and run the same
implementation directly; under tracing, fake tensors or any mode they go
through the op.

The CUDA kernels trust their inputs where checking would need the host:
ids outside [-1, E) count as -1, and positions must come from token_layout
of the same batch. The CPU references check everything and raise EpxError.
"""
try:
    import torch
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError("epx.torch needs PyTorch, which is not installed here: `pip install "
                      "torch` (any build; CUDA tensors need a CUDA build). `import epx` works "
                      "without it.") from e

from typing import NamedTuple

from .. import _arrays as _A
from . import _balanced_op, _gpu, _ops
from ._mapping import BALANCED, Mapping
from .buffer import Buffer, Config, EventOverlap

__all__ = ["dispatch_layout", "get_dispatch_layout", "token_layout", "TokenLayout", "Mapping",
           "map_ids", "balanced_topk", "permute", "combine", "gpu_available", "gpu_unavailable_reason", "Buffer", "Config", "EventOverlap",
           "topk_idx_t"]

# DeepEP's deep_ep.topk_idx_t, the dtype its callers cast topk_idx to (int64
# in DeepEP's default build); epx's calls take int32 ids as well.
topk_idx_t = torch.int64


def gpu_available():
    """True when this install can serve CUDA tensors (libepx_cuda.so loaded)."""
    return _gpu.available()


def gpu_unavailable_reason():
    """Why CUDA tensors cannot be served (None when they can)."""
    return _gpu.reason()


def dispatch_layout(topk_ids, num_experts, num_ranks):
    """DeepEP's get_dispatch_layout: (tokens_per_rank [G] int64, tokens_per_expert
    [E] int64, is_token_in_rank [T][G] bool) for topk_ids [T][K] (int32 or
    int64) whose experts are spread evenly, E/G per rank in order. A token
    counts once per rank it reaches however many of its experts live there;
    ids of -1 are ignored."""
    return _dispatch_layout(topk_ids, num_experts, num_ranks, "topk_ids")


def _dispatch_layout(ids, num_experts, num_ranks, ids_name):
    """dispatch_layout, its messages naming the ids as the caller calls them
    (get_dispatch_layout's are DeepEP's topk_idx)."""
    E = _A.integer(num_experts, "num_experts", 1, _A.MAX_EXPERTS, "EPX_MAX_EXPERTS")
    G = _A.integer(num_ranks, "num_ranks", 1, _A.MAX_GPUS, "EPX_MAX_GPUS")
    _ops.tensor_arg(ids, ids_name)
    return tuple(_ops.run("dispatch_layout", (ids,), ids, E, G, ids_name))


def get_dispatch_layout(topk_idx, num_experts, previous_event=None, async_finish=False,
                        allocate_on_comm_stream=False, *, num_ranks):
    """DeepEP's Buffer.get_dispatch_layout, its arguments, defaults and five
    outputs, for num_ranks ranks (DeepEP's Buffer knows it from its group;
    epx.torch.Buffer.get_dispatch_layout passes its own):

      num_tokens_per_rank       [num_ranks] torch.int (int32)
      num_tokens_per_rdma_rank  None: epx has no RDMA ranks (DeepEP's value
                                for intranode settings)
      num_tokens_per_expert     [num_experts] torch.int
      is_token_in_rank          [num_tokens][num_ranks] torch.bool
      event                     EventOverlap: holding a CUDA event recorded
                                after the work when async_finish, else none
                                (event None), as DeepEP returns it

    topk_idx [num_tokens][num_topk] int64 (DeepEP's topk_idx_t) or int32, -1
    = no expert; experts are spread evenly, num_experts / num_ranks per rank
    in order. epx computes on the caller's current stream (it has no
    communication stream): previous_event, when it holds a CUDA event, is
    waited on by that stream first; allocate_on_comm_stream is accepted
    under DeepEP's condition (previous_event given and async_finish) and
    changes nothing, the tensors belonging to the current stream.
    dispatch_layout is the same computation with int64 counts and three
    outputs."""
    if allocate_on_comm_stream and (previous_event is None or not async_finish):
        raise ValueError("allocate_on_comm_stream needs previous_event and async_finish=True "
                         "(DeepEP's condition)")
    cuda = isinstance(topk_idx, torch.Tensor) and topk_idx.is_cuda
    if async_finish and not cuda:
        raise ValueError("async_finish=True needs CUDA tensors (an event on the GPU stream); "
                         "topk_idx is on %s" % getattr(topk_idx, "device", type(topk_idx)))
    if previous_event is not None:
        ev = getattr(previous_event, "event", previous_event)
        if ev is not None:
            if not isinstance(ev, torch.cuda.Event):
                raise TypeError("previous_event must be an EventOverlap (or torch.cuda.Event) "
                                "holding a torch.cuda.Event, not %s" % type(ev).__name__)
            torch.cuda.current_stream().wait_event(ev)
    tpr, tpe, in_rank = _dispatch_layout(topk_idx, num_experts, num_ranks, "topk_idx")
    tpr, tpe = tpr.to(torch.int32), tpe.to(torch.int32)
    if async_finish:
        done = torch.cuda.Event()
        done.record()
        event = EventOverlap(done, (topk_idx, tpr, tpe, in_rank))
    else:
        event = EventOverlap(None)
    return tpr, None, tpe, in_rank, event


class TokenLayout(NamedTuple):
    """Where a batch goes (epx_token_layout in include/epx/dispatch.h).

    tokens_per_rank [G], tokens_per_slot [P] int64; is_token_in_rank [T][G]
    bool; rank order: rank_offsets [G+1], rank_perm [T*K] (token ids, -1 past
    the last), pair_rank_pos [T][K] (row of each token's representative pair,
    else -1); slot order: slot_offsets [P+1], slot_perm [T*K] (pair ids t*K+k,
    -1 past the last), pair_slot_pos [T][K]. Offsets and positions int32."""
    tokens_per_rank: torch.Tensor
    tokens_per_slot: torch.Tensor
    is_token_in_rank: torch.Tensor
    rank_offsets: torch.Tensor
    rank_perm: torch.Tensor
    pair_rank_pos: torch.Tensor
    slot_offsets: torch.Tensor
    slot_perm: torch.Tensor
    pair_slot_pos: torch.Tensor


def token_layout(phys, num_physical, num_ranks):
    """The whole layout of a batch of physical slots phys [T][K] (map_ids'
    output), slot p living on rank p // (P/G): counts, both send orders and
    their inverse positions, in one kernel launch."""
    P = _A.integer(num_physical, "num_physical", 1, _A.MAX_PHYSICAL, "4 (E + G) slots at most")
    G = _A.integer(num_ranks, "num_ranks", 1, _A.MAX_GPUS, "EPX_MAX_GPUS")
    _ops.tensor_arg(phys, "phys")
    return TokenLayout(*_ops.run("token_layout", (phys,), phys, P, G))


def map_ids(topk_ids, mapping, *, layer=0, pass_id=0, seed=0):
    """Logical expert ids [T][K] to physical slots [T][K] int32 under `mapping`
    (an epx.torch.Mapping on the ids' device). Random choices are keyed by
    (seed, pass_id, layer, token, k): the same on CPU and GPU, new every pass.
    pass_id is a pass counter in [0, 2^64): it is keyed modulo 2^32, as the
    C spec's uint32 pass word (pass 2^32 draws as pass 0), so a step counter
    can be passed as it grows. A balanced mapping draws nothing
    (balanced_topk's slots)."""
    _ops.tensor_arg(topk_ids, "topk_ids")
    m = _mapping_arg(mapping)
    if m.mode == BALANCED:
        return balanced_topk(topk_ids, m)[0]
    tables = (m.table, m.replicas, m.num_valid, m.thresholds)
    # layer is a uint32 in the C spec: checked, never taken modulo 2^32;
    # pass_id counts passes and is keyed modulo 2^32
    layer = _A.integer(layer, "layer", 0, 2 ** 32 - 1, "a uint32")
    pass_id = _A.integer(pass_id, "pass_id", 0, 2 ** 64 - 1)
    return _ops.run("map_ids", (topk_ids,) + tables, topk_ids, m.mode, m.num_experts,
                    m.num_physical, *tables, _signed64(seed), pass_id & 0xFFFFFFFF, layer)


def _mapping_arg(mapping):
    if not isinstance(mapping, Mapping):
        raise TypeError("mapping must be an epx.torch.Mapping (Mapping.static, .dynamic, "
                        ".weighted, .balanced or .from_layout), got %s" % type(mapping).__name__)
    return mapping


def balanced_topk(topk_ids, mapping):
    """Balanced per-batch dispatch of one layer's topk_ids [T][K] (int32 or
    int64, -1 = none) under a Mapping.balanced on the ids' device: each
    expert's tokens split over its replicas so the largest GPU load is the
    least any split reaches (SGLang 0.5.23's LP optimum, exactly), integer
    loads within one token per replica of it, expert e's (t, k) pairs in
    order filling its replicas. Returns (phys [T][K] int32, tokens_per_slot
    [P] int64). CPU and CUDA give the same slots."""
    _ops.tensor_arg(topk_ids, "topk_ids")
    m = _mapping_arg(mapping)
    if m.mode != BALANCED:
        raise ValueError("balanced_topk needs a Mapping.balanced (or from_layout(..., "
                         "mode='balanced')), got %r" % (m,))
    return tuple(_balanced_op.run(topk_ids, m.replicas, m.num_valid, m.num_physical,
                                  m.num_ranks))


def permute(x, layout, order="rank"):
    """Rows x [T][H] in a send order of `layout` (token_layout's output):
    "rank": each token once per destination rank, rank by rank (rank_perm);
    "slot": each (token, k) pair once, slot by slot (slot_perm). The result
    has T*K rows, the capacity; rows past the order's last offset are zero.
    x needs at least the layout's T rows (only those are read).
    Every row is written once (a gather), float32 or bfloat16. Differentiable
    in x (the gradient is the scatter-add of the rows back to their tokens)."""
    if not isinstance(layout, TokenLayout):
        raise TypeError("layout must be epx.torch.token_layout's output, got %s"
                        % type(layout).__name__)
    if order not in ("rank", "slot"):
        raise ValueError("order must be 'rank' or 'slot', got %r" % (order,))
    _ops.tensor_arg(x, "x")
    T = layout.is_token_in_rank.shape[0]
    # too few rows read as the gather's own "order[i] = ... is outside"; more
    # rows (a padded buffer) are fine: only the first T are read
    if x.dim() != 2 or x.shape[0] < T:
        raise ValueError("x has %s, the layout was built for %d tokens: permute the rows "
                         "[T][H] = [%d][H] the layout's ids came with"
                         % ("shape %s" % list(x.shape) if x.dim() != 2 else
                            "%d row%s" % (x.shape[0], "" if x.shape[0] == 1 else "s"), T, T))
    _check_layout(layout)
    perm, per_token = ((layout.rank_perm, 1) if order == "rank" else
                       (layout.slot_perm, layout.pair_slot_pos.shape[1]))
    return _ops.run("gather_rows", (x, perm), x, perm, per_token)


def _check_layout(layout):
    """The fields of one batch agree on T and K (token_layout's always do; a
    layout put together from two batches would gather other rows without a
    word: slot_perm's pair ids t*K+k read with another K)."""
    T = layout.is_token_in_rank.shape[0]
    if layout.pair_slot_pos.dim() != 2 or layout.pair_slot_pos.shape[0] != T:
        raise ValueError("layout.pair_slot_pos has shape %s, is_token_in_rank %d tokens: the "
                         "fields are of different batches; use token_layout's output as it is"
                         % (list(layout.pair_slot_pos.shape), T))
    K = layout.pair_slot_pos.shape[1]
    for name in ("pair_rank_pos",):
        f = getattr(layout, name)
        if list(f.shape) != [T, K]:
            raise ValueError("layout.%s has shape %s, not [%d][%d] (T, K from pair_slot_pos): "
                             "the fields are of different batches; use token_layout's output "
                             "as it is" % (name, list(f.shape), T, K))
    for name in ("rank_perm", "slot_perm"):
        f = getattr(layout, name)
        if f.dim() != 1 or f.numel() != T * K:
            raise ValueError("layout.%s has shape %s, not [%d] (T * K = %d * %d): the fields "
                             "are of different batches; use token_layout's output as it is"
                             % (name, list(f.shape), T * K, T, K))


def combine(y, pos, weights=None):
    """The weighted combine back to token order: out[t] = sum over k with
    pos[t][k] >= 0 of weights[t][k] * y[pos[t][k]], accumulated in float32 by
    fused multiply-adds in k order (bitwise equal on CPU and GPU), stored in
    y's dtype. weights [T][K] (any float dtype; None = 1). Differentiable in
    y and weights (plain-torch backward, accumulated in float32)."""
    for t, name in ((y, "y"), (pos, "pos"), (weights, "weights")):
        if t is not None:  # a numpy array got torch's schema dump
            _ops.tensor_arg(t, name)
    return _ops.run("combine", (y, pos, weights), y, pos, weights)


def _signed64(seed):
    """torch schemas carry int64: a uint64 seed travels as its two's complement."""
    s = _A.integer(seed, "seed", 0, 2 ** 64 - 1, "a uint64")
    return s - (1 << 64) if s >= 1 << 63 else s
