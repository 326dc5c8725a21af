"""DeepEP's normal-mode rows on the GPU in one launch each (epx_normal_* in
include/epx_comm_gpu.h): the same format and results as the plain-torch
steps of epx.torch._normal, which stay the reference and the path where
the library lacks these kernels."""
import ctypes
from ctypes import POINTER, Structure, c_int, c_int32, c_int64, c_void_p

import torch

from . import _gpu
from ._ll import _bind


class NormalRows(Structure):
    """epx_normal_rows (include/epx_comm_gpu.h)."""
    _fields_ = [("hidden", c_int32), ("width", c_int32), ("num_ranks", c_int32),
                ("num_experts", c_int32)]


_pack = _bind("epx_normal_pack", POINTER(NormalRows), c_int64, c_int, c_void_p, c_int64, c_void_p,
              c_int64, c_int64, c_void_p, c_int, c_int32, c_void_p, c_void_p, c_void_p, c_void_p,
              c_void_p, c_void_p, c_void_p, c_void_p)
_counts = _bind("epx_normal_counts", POINTER(NormalRows), c_void_p, c_void_p, c_int32, c_int32,
                c_void_p, c_void_p, c_void_p, c_void_p)
_unpack = _bind("epx_normal_unpack", POINTER(NormalRows), c_int, c_void_p, c_void_p, c_void_p,
                c_int32, c_int64, c_int32, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p,
                c_void_p, c_void_p, c_void_p)
_fill = _bind("epx_normal_fill", POINTER(NormalRows), c_void_p, c_void_p, c_int64, c_void_p,
              c_void_p, c_int32, c_void_p, c_void_p, c_void_p)
_combined = _bind("epx_normal_combined", POINTER(NormalRows), c_void_p, c_int64, c_void_p,
                  c_void_p, c_int32, c_void_p, c_void_p, c_void_p, c_void_p)


def available():
    """True where the loaded libepx_cuda.so has the kernels."""
    return None not in (_pack, _counts, _unpack, _fill, _combined)


def _p(t):
    return c_void_p(t.data_ptr() if t is not None else 0)


def _stream():
    return c_void_p(torch.cuda.current_stream().cuda_stream)


class Rows:
    """The row format of one engine, and its kernels on the current stream."""

    def __init__(self, hidden, width, num_ranks, num_experts):
        self.f = NormalRows(hidden, width, num_ranks, num_experts)
        self.H, self.R, self.E = hidden, num_ranks, num_experts
        self.L = num_experts // num_ranks

    def pack(self, stage, columns, x, scales, topk_idx, topk_weights, in_rank, per_rank,
             per_expert):
        T = x.shape[0]
        fp8 = scales is not None
        K = 0 if topk_idx is None else topk_idx.shape[1]
        _gpu.call(_pack, ctypes.byref(self.f), T, int(fp8), _p(x), x.stride(0), _p(scales),
                  scales.stride(0) if fp8 else 0, scales.stride(1) if fp8 else 0, _p(topk_idx),
                  int(topk_idx is not None and topk_idx.dtype == torch.int64), K,
                  _p(topk_weights), _p(in_rank), _p(per_rank), _p(per_expert), _p(stage),
                  _p(columns), _stream())

    def counts(self, recv, layout_range, rank, alignment):
        """(rank_prefix_matrix [R][R] int32, counts [1 + L] int32: tokens
        received, then the aligned per-expert counts)."""
        prefix = torch.empty((self.R, self.R), dtype=torch.int32, device=recv.device)
        counts = torch.empty(1 + self.L, dtype=torch.int32, device=recv.device)
        _gpu.call(_counts, ctypes.byref(self.f), _p(recv), _p(layout_range), rank, alignment,
                  _p(prefix), _p(counts), _stream())
        return prefix, counts

    def unpack(self, recv, layout_range, src_info, rank, n, fp8, K):
        """(x, ids, weights, src, rows) for n rows, fresh tensors."""
        dev, H = recv.device, self.H
        x = torch.empty((n, H), dtype=torch.float8_e4m3fn if fp8 else torch.bfloat16, device=dev)
        scales = torch.empty((n, H // 128), dtype=torch.float32, device=dev) if fp8 else None
        ids = torch.empty((n, K), dtype=torch.int64, device=dev) if K else None
        w = torch.empty((n, K), dtype=torch.float32, device=dev) if K else None
        src = torch.empty(n, dtype=torch.int32, device=dev)
        rows = torch.empty(n, dtype=torch.int64, device=dev)
        _gpu.call(_unpack, ctypes.byref(self.f), int(fp8), _p(recv), _p(layout_range),
                  _p(src_info), rank, n, K, _p(x), _p(scales), _p(ids), _p(w), _p(src), _p(rows),
                  _stream())
        return (x, scales) if fp8 else x, ids, w, src, rows

    def fill(self, y, rows, x, topk_weights, layout_range=None):
        """layout_range (a num_worst_tokens dispatch's): also zero the rows
        of tokens received past the ones returned."""
        K = 0 if topk_weights is None else topk_weights.shape[1]
        _gpu.call(_fill, ctypes.byref(self.f), _p(y), _p(rows), rows.shape[0], _p(x),
                  _p(topk_weights), K, _p(layout_range), _stream())

    def combined(self, out, T, K, bias):
        x = torch.empty((T, self.H), dtype=torch.bfloat16, device=out.device)
        w = torch.empty((T, K), dtype=torch.float32, device=out.device) if K else None
        b0, b1 = (tuple(bias) + (None, None))[:2]
        _gpu.call(_combined, ctypes.byref(self.f), _p(out), T, _p(b0), _p(b1), K, _p(x), _p(w),
                  _stream())
        return x, w
