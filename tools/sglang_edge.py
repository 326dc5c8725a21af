#!/usr/bin/env python3
"""Golden for epx.sglang's drop-ins on edge and invalid inputs, from SGLang
0.5.23's own code: tests/data/sglang_edge_0523.json.

The valid-case goldens (tools/sglang_eplb.py, tools/sglang_tables.py) check
results; this one checks what an engine unit test can also observe: the
output's dtype, shape and device on edge shapes (no layer, one expert, as
many slots as experts, one slot per GPU), on every weight dtype (int32,
int64, float16, bfloat16, float32, float64, bool) and on non-contiguous
tensors, keyword and positional calls, and which standard exception class
SGLang's code raises on an invalid input.

Functions run, SGLang's own (loaded by the loaders of those two tools, the
modules around them stubbed, nothing edited):
  deepseek   eplb_algorithms.deepseek.rebalance_experts
             (epx.sglang.rebalance_experts)
  windows    eplb_algorithms.rebalance_experts, the algorithm an EplbAlgorithm
             member (epx.sglang.rebalance_experts_from_windows)
  l2a        expert_location._compute_logical_to_all_physical_map with
             moe_ep_rank None (no per-rank cut)
             (epx.sglang.compute_logical_to_all_physical_map)
  l2a_rank   the same in 0.5.23's own call shape (p2l, E, ep_size,
             moe_ep_rank), the runtime context holding an all-to-all backend
             ("deepep"), ep_size and nnodes: the lists cut to the rank
  table      expert_location.compute_logical_to_rank_dispatch_physical_map,
             0.5.23's call shape, the runtime context holding ep_size and
             nnodes (epx.sglang.dispatch_map_for("0.5.23"))

A case holds its call: "args" (positional) and "kwargs", each value JSON or
an encoded one: {"tensor": flat values, "shape", "dtype", "layout":
"contiguous" | "strided" (every other column of a twice-wide tensor) |
"transposed" (the transpose of a contiguous tensor) | "expanded" (one row
broadcast over the layers, stride 0)} or {"algorithm": name} (an
EplbAlgorithm member). "context" {"ep_size", "nnodes"} is the runtime
context of table cases; "active_ranks" the elastic mask. Its "sglang"
record is either {"returns": [{"values", "dtype", "shape", "device"}, ...],
"tuple": bool} or {"raises": {"class": name, "bases": [standard classes it
is an instance of]}}.

Usage (torch needed):
  tools/sglang_edge.py generate WHEEL_OR_DIR OUT.json
WHEEL_OR_DIR: SGLang 0.5.23's wheel, or a directory holding its
sglang/srt/eplb/ tree.
"""
import argparse
import json
import os
import random
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sglang_eplb  # noqa: E402
import sglang_tables  # noqa: E402

BASES = ["AssertionError", "ValueError", "TypeError", "IndexError", "RuntimeError",
         "KeyError", "ZeroDivisionError", "NotImplementedError", "AttributeError"]


# ---- encoding -----------------------------------------------------------------

def T(values, shape, dtype="float32", layout="contiguous"):
    """An encoded tensor: flat row-major values of the logical tensor."""
    return {"tensor": list(values), "shape": list(shape), "dtype": dtype, "layout": layout}


def A(name):
    return {"algorithm": name}


def decode(v, torch, algorithms):
    """An encoded value as the call's argument (algorithms: name -> member)."""
    if isinstance(v, dict) and "tensor" in v:
        dt = getattr(torch, v["dtype"])
        shape = v["shape"]
        base = torch.tensor(v["tensor"], dtype=torch.float64).reshape(shape)
        layout = v["layout"]
        if layout == "contiguous":
            return base.to(dt).contiguous()
        if layout == "strided":  # every other column of a twice-wide tensor
            wide = torch.zeros(list(shape[:-1]) + [2 * shape[-1]], dtype=torch.float64)
            wide[..., ::2] = base
            return wide.to(dt)[..., ::2]
        if layout == "transposed":
            return base.transpose(-1, -2).contiguous().to(dt).transpose(-1, -2)
        if layout == "expanded":  # the first layer's row broadcast over all layers
            return base[:1].to(dt).expand(shape)
        raise ValueError(layout)
    if isinstance(v, dict) and "algorithm" in v:
        return algorithms[v["algorithm"]]
    return v


def record_output(out, torch):
    outs = list(out) if isinstance(out, tuple) else [out]
    rec = []
    for t in outs:
        if not isinstance(t, torch.Tensor):
            rec.append({"python": repr(t)})
            continue
        vals = t.tolist()
        rec.append({"values": vals, "dtype": str(t.dtype).replace("torch.", ""),
                    "shape": list(t.shape), "device": str(t.device)})
    return {"returns": rec, "tuple": isinstance(out, tuple)}


# ---- cases --------------------------------------------------------------------

def _rand(rng, n, kind):
    if kind == "int":
        return [rng.randrange(0, 50) for _ in range(n)]
    return [rng.randrange(0, 4096) / 8 for _ in range(n)]


def cases():
    rng = random.Random(523)
    out = []

    def add(name, fn, args, kwargs=None, **extra):
        c = {"name": name, "fn": fn, "args": args, "kwargs": kwargs or {}}
        c.update(extra)
        out.append(c)

    # -- deepseek.rebalance_experts(weight, num_replicas, num_groups, num_nodes,
    #    num_gpus, enable_hierarchical)
    w = _rand(rng, 2 * 8, "int")
    for dt in ["float32", "float64", "float16", "bfloat16", "int32", "int64", "bool"]:
        add("deepseek_dtype_" + dt, "deepseek", [T(w, [2, 8], dt), 12, 4, 2, 4, True])
    add("deepseek_global_dtype_int64", "deepseek", [T(w, [2, 8], "int64"), 12, 4, 2, 4, False])
    for lay in ["strided", "transposed"]:
        add("deepseek_" + lay, "deepseek", [T(w, [2, 8], "float32", lay), 12, 4, 2, 4, True])
        add("deepseek_global_" + lay, "deepseek", [T(w, [2, 8], "float32", lay), 12, 1, 1, 4,
                                                   False])
    add("deepseek_keywords", "deepseek", [],
        {"weight": T(w, [2, 8]), "num_replicas": 12, "num_groups": 4, "num_nodes": 2,
         "num_gpus": 4, "enable_hierarchical": True})
    add("deepseek_mixed_call", "deepseek", [T(w, [2, 8]), 12],
        {"num_groups": 4, "num_nodes": 2, "num_gpus": 4, "enable_hierarchical": False})
    add("deepseek_zero_layers", "deepseek", [T([], [0, 8]), 12, 4, 2, 4, True])
    add("deepseek_zero_layers_global", "deepseek", [T([], [0, 8]), 12, 1, 1, 4, False])
    add("deepseek_one_expert", "deepseek", [T([5.0], [1, 1]), 1, 1, 1, 1, False])
    add("deepseek_one_expert_replicated", "deepseek", [T([5.0, 0.0], [2, 1]), 4, 1, 1, 2,
                                                       False])
    add("deepseek_one_expert_hier", "deepseek", [T([5.0], [1, 1]), 2, 1, 1, 2, True])
    add("deepseek_replicas_eq_experts", "deepseek", [T(w, [2, 8]), 8, 4, 2, 4, True])
    add("deepseek_replicas_eq_experts_global", "deepseek", [T(w, [2, 8]), 8, 1, 1, 4, False])
    add("deepseek_gpus_eq_replicas", "deepseek", [T(w, [2, 8]), 12, 4, 2, 12, False])
    add("deepseek_gpus_eq_replicas_hier", "deepseek", [T(w, [2, 8]), 12, 4, 2, 12, True])
    add("deepseek_one_gpu", "deepseek", [T(w, [2, 8]), 12, 4, 1, 1, True])
    add("deepseek_all_zero", "deepseek", [T([0] * 16, [2, 8]), 12, 4, 2, 4, True])
    add("deepseek_global_groups_none", "deepseek", [T(w, [2, 8]), 12, None, None, 4, False])
    add("deepseek_global_groups_odd", "deepseek", [T(w, [2, 8]), 12, 3, 5, 4, False])
    add("deepseek_negative_weight", "deepseek",
        [T([-1.0, 2, -3, 4, 5, -6, 7, 8], [1, 8]), 12, 1, 1, 4, False])
    add("deepseek_nan_weight", "deepseek",
        [T([float("nan"), 2, 3, 4, 5, 6, 7, 8], [1, 8]), 12, 1, 1, 4, False])
    add("deepseek_inf_weight", "deepseek",
        [T([float("inf"), 2, 3, 4, 5, 6, 7, 8], [1, 8]), 12, 1, 1, 4, False])
    # invalid shapes and counts
    add("deepseek_replicas_not_multiple_of_gpus", "deepseek", [T(w, [2, 8]), 10, 4, 2, 4, True])
    add("deepseek_replicas_not_multiple_of_gpus_global", "deepseek",
        [T(w, [2, 8]), 10, 1, 1, 4, False])
    add("deepseek_fewer_replicas_than_experts", "deepseek", [T(w, [2, 8]), 4, 1, 1, 4, False])
    add("deepseek_fewer_replicas_than_experts_hier", "deepseek", [T(w, [2, 8]), 4, 4, 2, 2, True])
    add("deepseek_zero_replicas", "deepseek", [T(w, [2, 8]), 0, 1, 1, 4, False])
    add("deepseek_experts_not_multiple_of_groups", "deepseek", [T(w, [2, 8]), 12, 3, 1, 4, True])
    add("deepseek_groups_not_multiple_of_nodes", "deepseek", [T(w, [2, 8]), 12, 4, 3, 3, True])
    add("deepseek_gpus_not_multiple_of_nodes", "deepseek", [T(w, [2, 8]), 12, 4, 4, 6, True])
    add("deepseek_zero_gpus", "deepseek", [T(w, [2, 8]), 12, 1, 1, 0, False])
    add("deepseek_zero_gpus_hier", "deepseek", [T(w, [2, 8]), 12, 4, 2, 0, True])
    add("deepseek_negative_gpus", "deepseek", [T(w, [2, 8]), 12, 1, 1, -4, False])
    add("deepseek_zero_groups_hier", "deepseek", [T(w, [2, 8]), 12, 0, 1, 4, True])
    add("deepseek_zero_nodes_hier", "deepseek", [T(w, [2, 8]), 12, 4, 0, 4, True])
    add("deepseek_groups_none_hier", "deepseek", [T(w, [2, 8]), 12, None, 1, 4, True])
    add("deepseek_float_replicas", "deepseek", [T(w, [2, 8]), 12.0, 1, 1, 4, False])
    add("deepseek_weight_1d", "deepseek", [T(w[:8], [8]), 12, 1, 1, 4, False])
    add("deepseek_weight_3d", "deepseek", [T(w, [1, 2, 8]), 12, 1, 1, 4, False])
    add("deepseek_too_many_args", "deepseek", [T(w, [2, 8]), 12, 1, 1, 4, False, 1])
    add("deepseek_missing_arg", "deepseek", [T(w, [2, 8]), 12, 1, 1, 4])
    add("deepseek_unknown_keyword", "deepseek", [T(w, [2, 8]), 12, 1, 1, 4, False],
        {"bogus": 1})

    # -- eplb_algorithms.rebalance_experts(tokens_per_expert, num_physical_experts,
    #    num_local_physical_experts, num_groups, num_nodes, algorithm)
    tw = _rand(rng, 3 * 2 * 8, "int")
    for dt in ["int32", "int64", "float32", "float64", "float16", "bfloat16"]:
        add("windows_dtype_" + dt, "windows", [T(tw, [3, 2, 8], dt), 12, 3, 4, 2,
                                               A("deepseek_hierarchical")])
    add("windows_global_strided", "windows",
        [T(tw, [3, 2, 8], "float32", "strided"), 12, 3, 4, 2, A("deepseek")])
    add("windows_keywords", "windows", [],
        {"tokens_per_expert": T(tw, [3, 2, 8]), "num_physical_experts": 12,
         "num_local_physical_experts": 3, "num_groups": None, "num_nodes": 1,
         "algorithm": A("deepseek")})
    add("windows_zero_windows", "windows", [T([], [0, 2, 8]), 12, 3, 4, 2, A("deepseek")])
    add("windows_one_window_one_expert", "windows", [T([3.0], [1, 1, 1]), 1, 1, None, 1,
                                                     A("deepseek")])
    add("windows_one_slot_per_gpu", "windows", [T(tw, [3, 2, 8]), 8, 1, 4, 2,
                                                A("deepseek_hierarchical")])
    add("windows_local_zero", "windows", [T(tw, [3, 2, 8]), 12, 0, 4, 2, A("deepseek")])
    add("windows_local_above_slots", "windows", [T(tw, [3, 2, 8]), 12, 16, 4, 2, A("deepseek")])
    add("windows_local_not_divisor", "windows", [T(tw, [3, 2, 8]), 12, 5, 4, 2, A("deepseek")])
    add("windows_local_not_divisor_asserts", "windows", [T(tw, [3, 2, 8]), 9, 2, 4, 2,
                                                         A("deepseek")])
    add("windows_2d", "windows", [T(tw[:16], [2, 8]), 12, 3, 4, 2, A("deepseek")])
    add("windows_algorithm_none", "windows", [T(tw, [3, 2, 8]), 12, 3, 4, 2, None])
    add("windows_algorithm_name", "windows", [T(tw, [3, 2, 8]), 12, 3, 4, 2, "deepseek"])
    add("windows_fewer_slots", "windows", [T(tw, [3, 2, 8]), 4, 1, 4, 2, A("deepseek")])
    add("windows_groups_none_hier", "windows", [T(tw, [3, 2, 8]), 12, 3, None, 1,
                                                A("deepseek_hierarchical")])
    # deepseek_vec's own dtypes and edges
    tv = [rng.randrange(0, 30) for _ in range(2 * 2 * 8)]
    for dt in ["int32", "int64", "float32"]:
        add("vec_dtype_" + dt, "windows", [T(tv, [2, 2, 8], dt), 12, 3, 4, 2, A("deepseek_vec")])
    add("vec_hier_int32", "windows", [T(tv, [2, 2, 8], "int32"), 12, 3, 4, 2,
                                      A("deepseek_vec_hierarchical")])
    add("vec_replicas_eq_experts", "windows", [T(tv, [2, 2, 8], "int32"), 8, 2, None, 1,
                                               A("deepseek_vec")])
    # elasticity_aware: all ranks active, and one down
    te = [rng.randrange(0, 30) for _ in range(1 * 2 * 8)]
    add("elastic_all_active", "windows", [T(te, [1, 2, 8], "float32"), 12, 3, 4, 2,
                                          A("elasticity_aware")], active_ranks=[1, 1, 1, 1])
    add("elastic_one_down", "windows", [T(te, [1, 2, 8], "int32"), 12, 3, 4, 2,
                                        A("elasticity_aware")], active_ranks=[1, 0, 1, 1])

    # -- _compute_logical_to_all_physical_map(physical_to_logical_map,
    #    num_logical_experts) (no per-rank cut)
    p2l = [0, 1, 2, 3, 0, 0, 1, 2, 3, 2, 1, 0, 3, 3, 2, 1]
    for dt in ["int64", "int32", "int16", "uint8"]:
        add("l2a_dtype_" + dt, "l2a", [T(p2l, [2, 8], dt), 4])
    for lay in ["strided", "transposed", "expanded"]:
        add("l2a_" + lay, "l2a", [T(p2l, [2, 8], "int64", lay), 4])
    add("l2a_keywords", "l2a", [], {"physical_to_logical_map": T(p2l, [2, 8], "int64"),
                                    "num_logical_experts": 4})
    add("l2a_one_expert", "l2a", [T([0], [1, 1], "int64"), 1])
    add("l2a_slots_eq_experts", "l2a", [T([3, 1, 0, 2], [1, 4], "int64"), 4])
    add("l2a_expert_without_slot", "l2a", [T(p2l, [2, 8], "int64"), 6])
    add("l2a_zero_layers", "l2a", [T([], [0, 8], "int64"), 4])
    add("l2a_zero_slots", "l2a", [T([], [2, 0], "int64"), 4])
    add("l2a_zero_experts", "l2a", [T(p2l, [2, 8], "int64"), 0])
    add("l2a_id_too_large", "l2a", [T(p2l, [2, 8], "int64"), 3])
    add("l2a_negative_id", "l2a", [T([0, 1, -1, 2], [1, 4], "int64"), 4])
    add("l2a_float_map", "l2a", [T(p2l, [2, 8], "float32"), 4])
    add("l2a_bool_map", "l2a", [T([0, 1, 1, 0], [1, 4], "bool"), 2])
    add("l2a_1d", "l2a", [T(p2l[:8], [8], "int64"), 4])
    add("l2a_3d", "l2a", [T(p2l, [1, 2, 8], "int64"), 4])
    add("l2a_float_experts", "l2a", [T(p2l, [2, 8], "int64"), 4.0])

    # -- the same with moe_ep_rank: every rank of random maps, one and two nodes
    for i, (G, N, per, E) in enumerate([(2, 1, 3, 5), (4, 1, 2, 6), (4, 2, 3, 9),
                                        (8, 2, 2, 12), (8, 4, 1, 8)]):
        P = G * per
        rows = []
        for _ in range(2):
            r = list(range(E)) + [rng.randrange(E) for _ in range(P - E)]
            rng.shuffle(r)
            rows += r
        for rank in range(G):
            add("l2a_rank_%d_%d" % (i, rank), "l2a_rank", [T(rows, [2, P], "int64"), E, G, rank],
                context={"ep_size": G, "nnodes": N})
    add("l2a_rank_out_of_range", "l2a_rank", [T(p2l, [2, 8], "int64"), 4, 4, 4],
        context={"ep_size": 4, "nnodes": 1})

    # -- compute_logical_to_rank_dispatch_physical_map(logical_to_all_physical_map,
    #    ep_size, num_physical_experts, ep_rank, seed=42), 0.5.23's shape
    # two layers of 4 experts over 8 slots on 4 GPUs
    l2p = [0, 4, 5, 1, 6, -1, 2, 7, -1, 3, -1, -1,
           3, 4, -1, 0, 5, 6, 1, 7, -1, 2, -1, -1]
    ctx = {"ep_size": 4, "nnodes": 1}
    ctx2 = {"ep_size": 4, "nnodes": 2}
    for dt in ["int64", "int32"]:
        for r in [0, 3]:
            add("table_%s_rank%d" % (dt, r), "table", [T(l2p, [2, 4, 3], dt), 4, 8, r],
                context=ctx)
    add("table_two_nodes", "table", [T(l2p, [2, 4, 3], "int64"), 4, 8, 1], context=ctx2)
    add("table_seed", "table", [T(l2p, [2, 4, 3], "int64"), 4, 8, 2, 7], context=ctx)
    add("table_negative_seed", "table", [T(l2p, [2, 4, 3], "int64"), 4, 8, 2, -7], context=ctx)
    add("table_keywords", "table", [],
        {"logical_to_all_physical_map": T(l2p, [2, 4, 3], "int64"), "ep_size": 4,
         "num_physical_experts": 8, "ep_rank": 2, "seed": 42}, context=ctx)
    add("table_strided", "table", [T(l2p, [2, 4, 3], "int64", "strided"), 4, 8, 1], context=ctx)
    add("table_transposed", "table", [T(l2p, [2, 4, 3], "int64", "transposed"), 4, 8, 1],
        context=ctx)
    add("table_one_expert", "table", [T([0, 1], [1, 1, 2], "int64"), 2, 2, 1],
        context={"ep_size": 2, "nnodes": 1})
    add("table_one_gpu", "table", [T(l2p, [2, 4, 3], "int64"), 1, 8, 0],
        context={"ep_size": 1, "nnodes": 1})
    add("table_slots_eq_gpus", "table", [T(l2p, [2, 4, 3], "int64"), 8, 8, 5],
        context={"ep_size": 8, "nnodes": 1})
    add("table_zero_layers", "table", [T([], [0, 4, 3], "int64"), 4, 8, 0], context=ctx)
    add("table_rank_out_of_range", "table", [T(l2p, [2, 4, 3], "int64"), 4, 8, 4], context=ctx)
    add("table_rank_negative", "table", [T(l2p, [2, 4, 3], "int64"), 4, 8, -1], context=ctx)
    add("table_zero_gpus", "table", [T(l2p, [2, 4, 3], "int64"), 0, 8, 0], context=ctx)
    add("table_expert_without_replica", "table",
        [T([0, 1, -1, -1, 2, 3], [1, 3, 2], "int64"), 2, 4, 0],
        context={"ep_size": 2, "nnodes": 1})
    add("table_slots_not_multiple_of_gpus", "table", [T(l2p, [2, 4, 3], "int64"), 3, 8, 0],
        context={"ep_size": 3, "nnodes": 1})
    add("table_slot_out_of_range", "table", [T(l2p, [2, 4, 3], "int64"), 4, 6, 0], context=ctx)
    add("table_2d", "table", [T(l2p[:12], [4, 3], "int64"), 4, 8, 0], context=ctx)
    add("table_float_map", "table", [T(l2p, [2, 4, 3], "float32"), 4, 8, 1], context=ctx)
    add("table_missing_rank", "table", [T(l2p, [2, 4, 3], "int64"), 4, 8], context=ctx)
    return out


# ---- running SGLang's own functions ------------------------------------------

def _wheel_tree(src):
    """A directory holding sglang/srt/eplb/ (extracted from a wheel if src is one)."""
    if os.path.isdir(src):
        return src
    dest = tempfile.mkdtemp(prefix="sglang_edge_")
    with zipfile.ZipFile(src) as z:
        for name in z.namelist():
            if name.startswith("sglang/srt/eplb/") and name.endswith(".py"):
                z.extract(name, dest)
    return dest


class Release:
    def __init__(self, root):
        import torch

        torch.set_num_threads(1)
        self.root = root
        self.algos = sglang_eplb.load_release(root)
        self.deepseek = sys.modules["sglang.srt.eplb.eplb_algorithms.deepseek"]
        self.members = {m.name: m for m in self.algos.EplbAlgorithm}
        self.tables = sglang_tables.load_release(
            os.path.join(root, "sglang", "srt", "eplb", "expert_location.py"))

    def _elastic(self, active):
        import torch

        class State:
            active_ranks = torch.tensor(active, dtype=torch.int32)

        class Manager:
            @staticmethod
            def instance():
                return State

        sys.modules["sglang.srt.elastic_ep.elastic_ep"].ElasticEPStateManager = Manager

    def function(self, case):
        fn = case["fn"]
        if fn == "deepseek":
            return self.deepseek.rebalance_experts
        if fn == "windows":
            if "active_ranks" in case:
                self._elastic(case["active_ranks"])
            return self.algos.rebalance_experts
        ctx = case.get("context", {"ep_size": 1, "nnodes": 1})
        sglang_tables._install_stubs(ctx["ep_size"], ctx["nnodes"])
        rc = sys.modules["sglang.srt.runtime_context"]
        self.tables.update(get_exec=rc.get_exec, get_parallel=rc.get_parallel)
        if fn == "l2a":
            l2a = self.tables["_compute_logical_to_all_physical_map"]

            def no_cut(*args, **kwargs):  # SGLang without a per-rank cut (moe_ep_rank None)
                return l2a(*args, **kwargs, ep_size=1, moe_ep_rank=None)
            return no_cut
        if fn == "l2a_rank":  # the stubs' backend is "deepep": the rank's cut
            return self.tables["_compute_logical_to_all_physical_map"]
        return self.tables["compute_logical_to_rank_dispatch_physical_map"]

    def run(self, case):
        import torch

        f = self.function(case)
        args = [decode(a, torch, self.members) for a in case["args"]]
        kwargs = {k: decode(v, torch, self.members) for k, v in case["kwargs"].items()}
        try:
            out = f(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - recording which one is the point
            return record_error(e)
        return record_output(out, torch)


def record_error(e):
    import builtins

    return {"raises": {"class": type(e).__name__,
                       "bases": [b for b in BASES if isinstance(e, getattr(builtins, b))]}}


def generate(src, out):
    rel = Release(_wheel_tree(src))
    all_cases = cases()
    for c in all_cases:
        c["sglang"] = rel.run(c)
        r = c["sglang"]
        print("%-45s %s" % (c["name"], r["raises"]["class"] + " " + ",".join(r["raises"]["bases"])
                            if "raises" in r else
                            " ".join("%s%s" % (o.get("dtype"), o.get("shape"))
                                     for o in r["returns"])))
    doc = {"sglang_version": "0.5.23", "generator": "tools/sglang_edge.py", "cases": all_cases}
    with open(out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("src")
    g.add_argument("out")
    a = ap.parse_args()
    generate(a.src, a.out)


if __name__ == "__main__":
    main()
