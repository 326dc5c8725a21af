"""epx: expert parallelism for MoE inference, over libepx (C11) through ctypes.

    import epx
    p2l, l2p, cnt = epx.rebalance_experts(weight, 416, 1, 1, 8, False)  # SGLang's, exactly
    plan = epx.plan(counts, num_gpus=8, num_redundant=32)               # epx's own planner

Drop-ins with the engines' signatures live in epx.sglang and epx.vllm; errors
are epx.EpxError (.status, .name, .message: libepx's sentence).
"""
from ._native import (EpxAssertionError, EpxAssertionValueError, EpxError, EpxIndexError,
                      EpxNotImplementedError, EpxZeroDivisionError, Status, has, library_path,
                      version)
from .io import (init_expert_location, read_counts, read_mapping, write_counts,
                 write_mapping)
from .layout import Layout
from .metrics import Evaluation, evaluate, gpu_loads
from .planner import Plan, plan
from .sglang import (compute_logical_to_all_physical_map,
                     compute_logical_to_rank_dispatch_physical_map, load_init_expert_location,
                     rebalance_experts, rebalance_experts_from_windows)
from .dispatch import dispatch_topk, sglang_rank_lists, static_table
from .pt import read_dump as read_expert_distribution_dump
from . import dispatch, metrics, pt, sglang, trace, vllm  # noqa: F401  (namespaces)

__version__ = "0.1.0"

__all__ = ["EpxError", "EpxAssertionError", "EpxAssertionValueError", "EpxZeroDivisionError",
           "EpxIndexError", "EpxNotImplementedError", "Status", "Layout", "Plan", "plan", "evaluate", "Evaluation",
           "gpu_loads", "static_table", "sglang_rank_lists", "dispatch_topk",
           "has", "library_path", "version",
           "read_mapping", "read_counts", "write_mapping", "write_counts",
           "init_expert_location", "load_init_expert_location", "read_expert_distribution_dump", "rebalance_experts",
           "rebalance_experts_from_windows", "compute_logical_to_rank_dispatch_physical_map",
           "compute_logical_to_all_physical_map", "dispatch", "metrics", "pt", "sglang", "trace", "vllm"]
