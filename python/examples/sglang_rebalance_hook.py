#!/usr/bin/env python3
"""Plug epx into an engine's EPLB rebalance hook.

SGLang's rebalance (EPLBManager -> ExpertLocationMetadata.init_by_eplb)
calls, through module attributes:
  sglang.srt.eplb.eplb_algorithms.deepseek.rebalance_experts(weight, num_replicas,
      num_groups, num_nodes, num_gpus, enable_hierarchical)
  sglang.srt.eplb.expert_location.compute_logical_to_rank_dispatch_physical_map(
      logical_to_all_physical_map, num_gpus, num_physical_experts, ep_rank, seed=42)
  (server_args first from 0.5.3; the installed release's call shape is used)
vLLM calls vllm.distributed.eplb.rebalance_algo.rebalance_experts(weight,
num_replicas, num_groups, num_nodes, num_gpus). install() replaces whichever of
these is importable with epx's drop-in (same arguments, same return values), so
the engine's next rebalance runs in C. Put, before the engine starts:

    import sglang_rebalance_hook; sglang_rebalance_hook.install()

EPX_EPLB_ALGORITHM=epx switches the placement to epx's own algorithm (default:
deepseek, which reproduces the reference exactly).

Run standalone: `python sglang_rebalance_hook.py` patches an installed engine
and reports what it replaced; where none is installed (or with --demo) it
runs the same hook against a stand-in engine module on a synthetic Kimi-K2
load and prints the balancedness and time before and after.
"""
import argparse
import importlib
import os
import sys
import time
import types

import numpy as np

import epx

# (module, attribute, replacement) for every engine entry point epx can take.
TARGETS = [
    ("sglang.srt.eplb.eplb_algorithms.deepseek", "rebalance_experts", "sglang"),
    ("sglang.srt.managers.eplb_algorithms.deepseek", "rebalance_experts", "sglang"),  # older
    ("sglang.srt.eplb.expert_location", "compute_logical_to_rank_dispatch_physical_map",
     "dispatch"),
    ("sglang.srt.managers.expert_location", "compute_logical_to_rank_dispatch_physical_map",
     "dispatch"),
    ("vllm.distributed.eplb.rebalance_algo", "rebalance_experts", "vllm"),
    ("vllm.distributed.eplb.eplb_state", "rebalance_experts", "vllm"),  # imported by name
]


def _replacement(kind, algorithm):
    if kind == "sglang":
        def rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus,
                              enable_hierarchical):
            return epx.sglang.rebalance_experts(weight, num_replicas, num_groups, num_nodes,
                                                num_gpus, enable_hierarchical,
                                                algorithm=algorithm)
        return rebalance_experts
    if kind == "vllm":
        def rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus):
            return epx.vllm.rebalance_experts(weight, num_replicas, num_groups, num_nodes,
                                              num_gpus, algorithm=algorithm)
        return rebalance_experts
    return _dispatch_table_for(installed_sglang_version())


def installed_sglang_version():
    """The installed SGLang's release, or None (no SGLang: the demo's stand-in)."""
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("sglang")
    except (ImportError, PackageNotFoundError):
        return None


def _dispatch_table_for(sglang_version):
    """SGLang's dispatch-table function in the installed release's call shape
    (server_args from 0.5.3, the runtime context from 0.5.17) and rule; the
    <= 0.5.2 shape without SGLang."""
    if sglang_version is None:
        return epx.sglang.compute_logical_to_rank_dispatch_physical_map
    return epx.sglang.dispatch_map_for(sglang_version)


def install(modules=None, algorithm=None, verbose=True):
    """Replace the engine functions found in `modules` (default: TARGETS, those
    importable). Returns {module.attr: original} so uninstall() can undo it."""
    algorithm = algorithm or os.environ.get("EPX_EPLB_ALGORITHM") or "deepseek"
    if algorithm not in ("deepseek", "epx"):
        raise ValueError("EPLB algorithm %r (EPX_EPLB_ALGORITHM or algorithm=): give deepseek "
                         "(DeepSeek's EPLB, computed by libepx) or epx (epx's planner)"
                         % (algorithm,))
    replaced = {}
    for mod_name, attr, kind in modules or TARGETS:
        try:
            mod = sys.modules.get(mod_name) or importlib.import_module(mod_name)
        except Exception:  # the engine (or this version's module) is not installed
            continue
        if not hasattr(mod, attr):
            continue
        key = "%s.%s" % (mod_name, attr)
        replaced[key] = getattr(mod, attr)
        setattr(mod, attr, _replacement(kind, algorithm))
        if verbose:
            print("epx: %s -> epx (%s)" % (key, algorithm))
    return replaced


def uninstall(replaced):
    for key, original in replaced.items():
        mod_name, attr = key.rsplit(".", 1)
        setattr(sys.modules[mod_name], attr, original)


# ---- demo: the same hook against a stand-in engine ---------------------------

def _standin_engine():
    """A module shaped like SGLang's deepseek.py, and the engine code that calls
    it the way eplb_algorithms.rebalance_experts does (by module attribute)."""
    ds = types.ModuleType("standin_engine.deepseek")

    def rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus,
                          enable_hierarchical):
        raise RuntimeError("the stand-in engine has no placement of its own")
    ds.rebalance_experts = rebalance_experts
    sys.modules[ds.__name__] = ds

    def engine_rebalance(logical_count, num_physical_experts, num_local_physical_experts,
                         num_groups, num_nodes, hierarchical):
        return ds.rebalance_experts(weight=logical_count.sum(axis=0),
                                    num_replicas=num_physical_experts, num_groups=num_groups,
                                    num_nodes=num_nodes,
                                    num_gpus=num_physical_experts // num_local_physical_experts,
                                    enable_hierarchical=hierarchical)
    return ds, engine_rebalance


def demo(model="kimi-k2", gpus=8, redundant=32, windows=4, algorithm=None):
    m = epx.trace.model(model)
    E, L = m["num_experts"], m["num_layers"]
    P = E + redundant
    counts = epx.trace.synth(model, num_windows=windows, tokens=16384, seed=1)
    ds, engine_rebalance = _standin_engine()
    replaced = install([(ds.__name__, "rebalance_experts", "sglang")], algorithm=algorithm)
    assert replaced, "the stand-in was not patched"

    load = counts.sum(axis=0)
    before = epx.evaluate(epx.Layout.trivial(L, E, P, gpus), load)
    t0 = time.perf_counter()
    p2l, l2p, cnt = engine_rebalance(counts, P, P // gpus, m["num_groups"], 1, False)
    dt = time.perf_counter() - t0
    after = epx.evaluate(p2l, load, num_gpus=gpus)
    table = epx.sglang.compute_logical_to_rank_dispatch_physical_map(l2p, gpus, P, ep_rank=0)
    print("model %s: L=%d E=%d P=%d on %d GPUs, %d windows of synthetic load"
          % (model, L, E, P, gpus, windows))
    print("  trivial placement : balancedness %.4f (bound %.4f)" % (before.balancedness,
                                                                    before.bound))
    print("  after the hook    : balancedness %.4f, rebalance took %.1f ms"
          % (after.balancedness, dt * 1e3))
    print("  outputs           : physical_to_logical_map %s, logical_to_physical_map %s, "
          "logical_count %s, %s; rank 0 dispatch table %s"
          % (tuple(p2l.shape), tuple(l2p.shape), tuple(cnt.shape), p2l.dtype,
             tuple(table.shape)))
    uninstall(replaced)
    return after.balancedness > before.balancedness


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--demo", action="store_true", help="use the stand-in engine even if "
                    "SGLang or vLLM is installed")
    ap.add_argument("--model", default="kimi-k2")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--redundant", type=int, default=32)
    ap.add_argument("--algorithm", choices=["deepseek", "epx"], default=None)
    args = ap.parse_args(argv)
    if not args.demo:
        replaced = install(algorithm=args.algorithm)
        if replaced:
            print("epx: patched %d engine function(s); start the engine in this process"
                  % len(replaced))
            return 0
        print("epx: neither SGLang nor vLLM is installed here: running the demo")
    ok = demo(args.model, args.gpus, args.redundant, algorithm=args.algorithm)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
