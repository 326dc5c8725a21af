"""The import shim behind tools/peer_test.py: stand-ins for the few modules of
vLLM and SGLang that the engines' own unit tests import, filled either with
the release's own code (mode "engine", to show the harness is fair) or with
epx's drop-ins (mode "epx"). Nothing of the engines lives here: their files
are read at run time from the folder tools/peer_test.py extracted them to.

Environment (set by tools/peer_test.py):
  EPX_PEER_MODE     "engine" or "epx"
  EPX_PEER_SRC      the release's extracted files (vllm/... or sglang/...)
  EPX_PEER_VERSION  the release, e.g. 0.34.0

What comes from where, per module the tests import:
  vllm.distributed.eplb.rebalance_algo   rebalance_experts: the release's
                                          (engine) or epx.vllm.rebalance_experts
  vllm.distributed.eplb.policy.default   DefaultEplbPolicy: the release's, or
                                          epx.vllm.policy_for(release)
  vllm.distributed.eplb.eplb_state       compute_logical_maps and
                                          _compute_eplb_load_stats, vLLM's map
                                          bookkeeping the tests read results
                                          with: the release's in both modes
  vllm.platforms                         current_platform: no XPU here
  vllm.distributed.eplb.policy           the release's policy table
                                          (EPLB_POLICIES) where it has one
                                          (>= 0.13.0), over the two stand-ins
                                          above; else an empty package
  vllm.config.parallel                   EPLBPolicyOption, lifted from the
                                          release's config/parallel.py
  vllm.envs, vllm.plugins                the release's own files, whole: its
                                          plugin loader (load_general_plugins)
                                          and the VLLM_PLUGINS it reads
  vllm (__version__)                     the release string
  sglang.srt.eplb.expert_location        the release's functions; in mode epx
                                          compute_logical_to_rank_dispatch_
                                          physical_map is epx.sglang.
                                          dispatch_map_for(release)
  sglang.srt.runtime_context             a settable stand-in (set_parallel)
                                          for get_parallel() / get_exec()
  sglang.test.*                          CustomTestCase = unittest.TestCase,
                                          register_*_ci no-ops
"""
import ast
import os
import random
import types
import typing
from pathlib import Path

MODE = os.environ.get("EPX_PEER_MODE", "engine")
SRC = Path(os.environ.get("EPX_PEER_SRC", "."))
VERSION = os.environ.get("EPX_PEER_VERSION", "")
if MODE not in ("engine", "epx"):
    raise RuntimeError("EPX_PEER_MODE must be engine or epx, not %r" % MODE)


def exec_source(path, ns, keep=None):
    """Run a file of the release in ns. Relative imports are dropped (the
    caller put what they bring into ns); keep(name) -> bool limits the
    top-level statements to the function definitions it accepts."""
    tree = ast.parse(Path(path).read_text(), str(path))
    body = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level:
            continue
        if keep is not None:
            if not isinstance(node, ast.FunctionDef) or node.decorator_list \
                    or not keep(node.name):
                continue
        body.append(node)
    if keep is not None:  # lifted functions: annotations are not evaluated
        future = ast.parse("from __future__ import annotations").body
        body = future + body
    tree.body = body
    exec(compile(tree, str(path), "exec"), ns)
    return ns


# ---- vLLM ---------------------------------------------------------------------

_VLLM_EPLB = SRC / "vllm" / "distributed" / "eplb"


def vllm_rebalance_algo(ns):
    if MODE == "epx":
        import epx.vllm
        ns["rebalance_experts"] = epx.vllm.rebalance_experts
    else:
        exec_source(_VLLM_EPLB / "rebalance_algo.py", ns)


def vllm_policy_abstract(ns):
    exec_source(_VLLM_EPLB / "policy" / "abstract.py", ns)


def vllm_policy_default(ns):
    if MODE == "epx":
        import epx.vllm
        ns["DefaultEplbPolicy"] = epx.vllm.policy_for(VERSION)
    else:
        from vllm.distributed.eplb.policy.abstract import AbstractEplbPolicy
        ns["AbstractEplbPolicy"] = AbstractEplbPolicy
        exec_source(_VLLM_EPLB / "policy" / "default.py", ns)


def vllm_policy_table(ns):
    path = _VLLM_EPLB / "policy" / "__init__.py"
    if not path.exists():
        return  # before 0.13.0: no table; the package holds the two modules only
    from vllm.distributed.eplb.policy.abstract import AbstractEplbPolicy
    from vllm.distributed.eplb.policy.default import DefaultEplbPolicy
    ns.update(AbstractEplbPolicy=AbstractEplbPolicy, DefaultEplbPolicy=DefaultEplbPolicy)
    exec_source(path, ns)


def vllm_config_parallel(ns):
    """EPLBPolicyOption, the Literal the policy table is checked against,
    lifted from the release's config/parallel.py (the rest of that module
    pulls in the whole of vLLM's configuration)."""
    path = SRC / "vllm" / "config" / "parallel.py"
    tree = ast.parse(path.read_text(), str(path))
    keep = [n for n in tree.body if isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "EPLBPolicyOption" for t in n.targets)]
    ns["Literal"] = typing.Literal
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec"), ns)


def vllm_whole(rel):
    def fill_it(ns):
        exec_source(SRC / rel, ns)
    return fill_it


def vllm_eplb_state(ns):
    import numpy as np
    import torch
    ns.update(torch=torch, np=np)
    exec_source(_VLLM_EPLB / "eplb_state.py", ns,
                keep=lambda n: n in ("compute_logical_maps", "_compute_eplb_load_stats"))


class _Platform:
    """vllm.platforms.current_platform as far as the tests ask: is_xpu() etc."""

    def __getattr__(self, name):
        if name.startswith("is_"):
            if name == "is_cuda":
                import torch
                return torch.cuda.is_available
            return lambda: False
        raise AttributeError(name)


def vllm_platforms(ns):
    ns["current_platform"] = _Platform()


# ---- SGLang -------------------------------------------------------------------

class _Parallel:
    def __init__(self):
        self.ep_size = None
        self.nnodes = None

    def __getattribute__(self, name):
        v = object.__getattribute__(self, name)
        if v is None and name in ("ep_size", "nnodes"):
            raise ValueError("config namespace 'parallel' not published (the test must call "
                             "sglang.srt.runtime_context.set_parallel first)")
        return v


PARALLEL = _Parallel()
MOE = types.SimpleNamespace(ep_join_mode="normal", moe_a2a_backend="deepep",
                            ep_dispatch_algorithm="static")
ELASTIC = {"expanded": False}


def sglang_runtime_context(ns):
    def set_parallel(ep_size, nnodes, ep_join_mode="normal", expanded=False):
        PARALLEL.ep_size, PARALLEL.nnodes = ep_size, nnodes
        MOE.ep_join_mode = ep_join_mode
        ELASTIC["expanded"] = expanded
    ns.update(get_parallel=lambda: PARALLEL, get_exec=lambda: types.SimpleNamespace(moe=MOE),
              set_parallel=set_parallel)


def sglang_elastic_ep(ns):
    ns["elastic_expanded_world_enabled"] = lambda: ELASTIC["expanded"]


def engine_expert_location():
    """The release's own expert_location functions (every undecorated
    top-level function), with their imports stood in for."""
    import logging

    import torch
    from sglang.srt.runtime_context import get_exec, get_parallel
    ns = {"torch": torch, "random": random, "F": torch.nn.functional, "logging": logging,
          "logger": logging.getLogger("sglang_peer"), "List": typing.List,
          "Optional": typing.Optional, "Iterable": typing.Iterable, "Tuple": typing.Tuple,
          "ServerArgs": object, "get_parallel": get_parallel, "get_exec": get_exec,
          "__name__": "sglang_peer_expert_location"}
    return exec_source(SRC / "sglang" / "srt" / "eplb" / "expert_location.py", ns,
                       keep=lambda n: True)


def sglang_expert_location(ns):
    for k, v in engine_expert_location().items():
        if not k.startswith("__"):
            ns[k] = v
    if MODE == "epx":
        import epx.sglang
        ns["compute_logical_to_rank_dispatch_physical_map"] = \
            epx.sglang.dispatch_map_for(VERSION)


def sglang_ci_register(ns):
    def __getattr__(name):
        if name.startswith("register_"):
            return lambda *a, **k: None
        raise AttributeError(name)
    ns["__getattr__"] = __getattr__


def sglang_test_utils(ns):
    import unittest
    ns["CustomTestCase"] = unittest.TestCase


FILL = {
    "vllm.distributed.eplb.rebalance_algo": vllm_rebalance_algo,
    "vllm.distributed.eplb.policy.abstract": vllm_policy_abstract,
    "vllm.distributed.eplb.policy.default": vllm_policy_default,
    "vllm.distributed.eplb.eplb_state": vllm_eplb_state,
    "vllm.distributed.eplb.policy": vllm_policy_table,
    "vllm.config.parallel": vllm_config_parallel,
    "vllm.envs": vllm_whole("vllm/envs.py"),
    "vllm.plugins": vllm_whole("vllm/plugins/__init__.py"),
    "vllm.platforms": vllm_platforms,
    "sglang.srt.runtime_context": sglang_runtime_context,
    "sglang.srt.elastic_ep.elastic_ep": sglang_elastic_ep,
    "sglang.srt.eplb.expert_location": sglang_expert_location,
    "sglang.test.ci.ci_register": sglang_ci_register,
    "sglang.test.test_utils": sglang_test_utils,
}


def fill(name, ns):
    """Called by each stand-in module with its own globals()."""
    FILL[name](ns)
