#!/usr/bin/env python3
"""Goldens for `epx dispatch-table --sglang-version V`, from SGLang's own code.

For each release the script takes sglang/srt/eplb/expert_location.py out of
that release's wheel (`pip download --no-deps sglang==V`), lifts only the
functions behind the static dispatch table out of it (ast, no edits to their
bodies) and runs them with the imports around them stubbed: a server_args
carrying ep_size and nnodes, and the runtime-context getters of >= 0.5.17.
SGLang's code uses torch; where torch is not installed, a shim over numpy
stands in for the few calls those functions make (torch.full, torch.tensor,
torch.sum, torch.all, boolean-mask assignment, .tolist/.item/.to/.cpu), so
the releases' own bodies still run unchanged.

For every case and release it records what SGLang computes on each rank r:
  rank_dispatch_from_eplb    [G][L][E]  init_by_eplb: DeepSeek's
                             logical_to_physical_map, never cut;
  rank_dispatch_from_mapping [G][L][E]  init_by_mapping/init_trivial: the
                             ascending lists, cut to rank r's nearest replica
                             where the release cuts them; row r of rank r's
                             own table;
  logical_to_all_physical_map_from_mapping [G][L][E][X]  rank r's (cut)
                             lists, -1 padded to the widest of all ranks:
                             what `epx dispatch-table --rank-lists` and
                             epx.sglang_rank_lists must equal. The cut
                             (_compute_logical_to_all_physical_map) changed
                             in 0.5.4.post2 (it starts), 0.5.16 (the node
                             step only where it narrows) and 0.5.17 (only
                             with an a2a backend); VERSIONS holds each side.

The rank-invariant command records the per-token dispatch of releases whose
expert_location_dispatch.py has the `rank_invariant` rule (0.5.23: the
"dynamic" algorithm without an a2a backend picks replica token row mod
num_valid). It lifts _topk_ids_logical_to_physical_dynamic from the release,
builds the lists as the release does without an a2a backend (no cut:
_compute_logical_to_all_physical_map with moe_a2a_backend "none", padded to
P as _init_raw does; num_valid = entries != -1) from a mapping
(init_by_mapping) and from DeepSeek's logical_to_physical_map
(init_by_eplb), and runs it on seeded topk_ids [T][K] for every layer
(torch needed: the function calls torch.arange and advanced indexing).

Usage:
  tools/sglang_tables.py download DIR 0.5.2 0.5.3 ...   (needs PyPI)
  tools/sglang_tables.py generate DIR OUTDIR [--shared ../shared/golden/eplb]
  tools/sglang_tables.py rank-invariant DIR OUTDIR
DIR holds DIR/<version>/expert_location.py and, from 0.5.23,
expert_location_dispatch.py (download writes that layout).
"""
import argparse
import ast
import inspect
import json
import os
import random
import sys
import types

from wheel_files import extract

VERSIONS = [
    "0.5.2", "0.5.3", "0.5.4.post1", "0.5.4.post2", "0.5.5", "0.5.15", "0.5.16",
    "0.5.17", "0.5.23",
]
NEEDED = [
    "compute_logical_to_rank_dispatch_physical_map",
    "_logical_to_all_physical_raw",
    "_compute_gpu_id_of_physical_expert",
    "_compute_node_id_of_physical_expert",
    "_fair_choices",
    "_find_nearest_expert",
    "_prefer_same_node_experts",
    "_compute_logical_to_all_physical_map",
    "_pad_nested_array",
]


def download(dest, versions):
    want = {"sglang/srt/eplb/expert_location.py": "expert_location.py",
            "sglang/srt/eplb/expert_location_dispatch.py": "expert_location_dispatch.py"}
    for v in versions:
        extract("sglang", v, dest, lambda name: want.get(name))


class _NS(types.SimpleNamespace):
    pass


def _install_stubs(ep_size, nnodes):
    """The modules the lifted functions import inside their bodies."""
    moe = _NS(ep_join_mode="normal", moe_a2a_backend="deepep",
              ep_dispatch_algorithm="static")
    par = _NS(ep_size=ep_size, nnodes=nnodes)
    rc = types.ModuleType("sglang.srt.runtime_context")
    rc.get_exec = lambda: _NS(moe=moe)
    rc.get_parallel = lambda: par
    el = types.ModuleType("sglang.srt.elastic_ep.elastic_ep")
    el.elastic_expanded_world_enabled = lambda: False
    for name in ["sglang", "sglang.srt", "sglang.srt.elastic_ep"]:
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["sglang.srt.runtime_context"] = rc
    sys.modules["sglang.srt.elastic_ep.elastic_ep"] = el
    return _NS(ep_size=ep_size, nnodes=nnodes, ep_join_mode="normal",
               moe_a2a_backend="deepep", ep_dispatch_algorithm="static")


def _torch():
    """torch, or the numpy shim when torch is not installed."""
    try:
        import torch

        return torch
    except ImportError:
        pass
    import numpy as np

    class Tensor(np.ndarray):
        device = "cpu"

        def to(self, *a, **k):
            return self

        def cpu(self):
            return self

    def tensor(x, dtype=None, device=None):
        return np.asarray(x, dtype=dtype or np.int64).view(Tensor)

    def full(size, fill_value, dtype=None):
        return np.full(size, fill_value, dtype=dtype or np.int64).view(Tensor)

    shim = types.ModuleType("torch")
    shim.Tensor, shim.tensor, shim.full = Tensor, tensor, full
    shim.sum = lambda x: np.sum(x)
    shim.all = lambda x: np.all(x)
    shim.int64 = np.int64
    return shim


def load_release(path):
    torch = _torch()
    from typing import Iterable, List, Optional

    tree = ast.parse(open(path).read())
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in NEEDED]
    mod = ast.Module(body=keep, type_ignores=[])
    ns = {"torch": torch, "random": random, "List": List, "Optional": Optional,
          "Iterable": Iterable, "ServerArgs": object, "__name__": "sglang_lifted"}
    exec(compile(mod, path, "exec"), ns)
    return ns


def _call(fn, **kw):
    params = inspect.signature(fn).parameters
    if "num_gpus" in params:
        kw["num_gpus"] = kw.pop("ep_size")
    return fn(**{k: v for k, v in kw.items() if k in params})


def run_case(ns, case):
    torch = _torch()

    G, N = case["num_gpus"], case["num_nodes"]
    E, P = case["num_logical_experts"], case["num_physical_experts"]
    sa = _install_stubs(G, N)
    rc = sys.modules["sglang.srt.runtime_context"]
    ns.update(get_exec=rc.get_exec, get_parallel=rc.get_parallel)  # >= 0.5.23's top imports
    table_fn = ns["compute_logical_to_rank_dispatch_physical_map"]
    l2a_fn = ns["_compute_logical_to_all_physical_map"]
    p2l = torch.tensor(case["physical_to_logical_map"])
    l2p = torch.tensor(case["logical_to_physical_map"])
    out = {"rank_dispatch_from_eplb": [], "rank_dispatch_from_mapping": [],
           "logical_to_all_physical_map_from_mapping": []}
    for r in range(G):
        t = _call(table_fn, server_args=sa, logical_to_all_physical_map=l2p, ep_size=G,
                  num_physical_experts=P, ep_rank=r)
        out["rank_dispatch_from_eplb"].append(t.tolist())
        cut = _call(l2a_fn, server_args=sa, physical_to_logical_map=p2l,
                    num_logical_experts=E, ep_size=G, moe_ep_rank=r)
        t = _call(table_fn, server_args=sa, logical_to_all_physical_map=cut, ep_size=G,
                  num_physical_experts=P, ep_rank=r)
        out["rank_dispatch_from_mapping"].append(t.tolist())
        out["logical_to_all_physical_map_from_mapping"].append(cut.tolist())
    X = max(len(x) for rk in out["logical_to_all_physical_map_from_mapping"]
            for lay in rk for x in lay)
    out["logical_to_all_physical_map_from_mapping"] = [
        [[x + [-1] * (X - len(x)) for x in lay] for lay in rk]
        for rk in out["logical_to_all_physical_map_from_mapping"]]
    return out


def crafted(seed, L, E, G, N, per):
    """A random placement: every expert once, the rest of the P = G * per
    slots random (some experts keep a lone replica), and a shuffled
    replica-rank order standing for DeepSeek's."""
    rng = random.Random(seed)
    P = G * per
    p2l, l2p = [], []
    for _ in range(L):
        slots = list(range(E)) + [rng.randrange(E) for _ in range(P - E)]
        rng.shuffle(slots)
        reps = [[p for p in range(P) if slots[p] == e] for e in range(E)]
        for r in reps:
            rng.shuffle(r)
        p2l.append(slots)
        l2p.append(reps)
    X = max(len(r) for lay in l2p for r in lay)
    l2p = [[r + [-1] * (X - len(r)) for r in lay] for lay in l2p]
    return {"name": f"crafted_{seed}_g{G}_n{N}", "num_layers": L, "num_logical_experts": E,
            "num_physical_experts": P, "num_gpus": G, "num_nodes": N,
            "physical_to_logical_map": p2l, "logical_to_physical_map": l2p}


def truncated(path, layers):
    d = json.load(open(path))
    X = max(len([p for p in r if p >= 0]) for lay in d["logical_to_physical_map"][:layers]
            for r in lay)
    return {"name": os.path.basename(path)[:-5] + f"_l{layers}", "num_layers": layers,
            "num_logical_experts": d["num_logical_experts"],
            "num_physical_experts": d["num_physical_experts"], "num_gpus": d["num_gpus"],
            "num_nodes": d["num_nodes"],
            "physical_to_logical_map": d["physical_to_logical_map"][:layers],
            "logical_to_physical_map": [[r[:X] for r in lay]
                                        for lay in d["logical_to_physical_map"][:layers]]}


def cases(shared):
    out = []
    for i, (G, N, per, E) in enumerate([(8, 1, 2, 12), (8, 2, 2, 12), (8, 4, 3, 14),
                                          (8, 8, 2, 10), (16, 2, 2, 20), (16, 4, 1, 12),
                                          (16, 8, 3, 30), (4, 2, 3, 5)]):
        out.append(crafted(100 + i, 3, E, G, N, per))
    if shared:
        # small shared cases, so the goldens stay small (the per-rank lists
        # of a 256-expert model run to megabytes)
        for name, layers in [("random_041_sparse", 1), ("random_100_int", 1),
                             ("one_slot_per_gpu_float", 2), ("random_054_float", 1),
                             ("random_009_float", 3)]:
            p = os.path.join(shared, name + ".json")
            if os.path.exists(p):
                out.append(truncated(p, layers))
    return out


def generate(src, outdir, shared):
    os.makedirs(outdir, exist_ok=True)
    all_cases = cases(shared)
    releases = {v: load_release(os.path.join(src, v, "expert_location.py")) for v in VERSIONS
                if os.path.exists(os.path.join(src, v, "expert_location.py"))}
    for case in all_cases:
        case["sglang"] = {v: run_case(ns, case) for v, ns in releases.items()}
        with open(os.path.join(outdir, case["name"] + ".json"), "w") as f:
            json.dump(case, f, separators=(",", ":"))
            f.write("\n")
        print(case["name"], "releases:", " ".join(releases))


def _install_a2a_none():
    """Stubs for a server with no a2a backend (rank_invariant's condition)."""
    _install_stubs(1, 1)
    moe = _NS(ep_join_mode="normal", moe_a2a_backend="none", ep_dispatch_algorithm="dynamic")
    rc = sys.modules["sglang.srt.runtime_context"]
    par = rc.get_parallel()
    rc.get_exec = lambda: _NS(moe=moe)
    return rc, par


def load_dispatch(path):
    """_topk_ids_logical_to_physical_dynamic of a release, unedited."""
    import torch
    from typing import Optional

    src = open(path).read()
    if "rank_invariant" not in src:
        return None
    tree = ast.parse(src)
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef)
            and n.name == "_topk_ids_logical_to_physical_dynamic"]
    ns = {"torch": torch, "Optional": Optional, "ExpertLocationDispatchInfo": object,
          "__name__": "sglang_lifted_dispatch"}
    exec(compile(ast.Module(body=keep, type_ignores=[]), path, "exec"), ns)
    return ns["_topk_ids_logical_to_physical_dynamic"]


def run_rank_invariant(ns, dyn, case, batches):
    """Chosen slots [B][L][T][K] from the mapping's and DeepSeek's lists."""
    import torch

    G, N = case["num_gpus"], case["num_nodes"]
    E, P = case["num_logical_experts"], case["num_physical_experts"]
    rc, par = _install_a2a_none()
    par.ep_size, par.nnodes = G, N
    ns.update(get_exec=rc.get_exec, get_parallel=rc.get_parallel)
    l2a_fn = ns["_compute_logical_to_all_physical_map"]
    p2l = torch.tensor(case["physical_to_logical_map"])
    lists = {}
    for r in range(G):  # no a2a backend: no cut, every rank alike
        m = _call(l2a_fn, physical_to_logical_map=p2l, num_logical_experts=E, ep_size=G,
                  moe_ep_rank=r)
        assert r == 0 or torch.equal(m, lists["mapping"]), "lists differ across ranks"
        lists["mapping"] = m
    lists["eplb"] = torch.tensor(case["logical_to_physical_map"])
    out = {}
    for key, m in lists.items():
        m = torch.nn.functional.pad(m, (0, P - m.shape[-1]), value=-1)  # as _init_raw
        nv = torch.count_nonzero(m != -1, dim=-1)
        rows = []
        for ids in batches:
            per_layer = []
            for layer in range(case["num_layers"]):
                info = _NS(rank_invariant=True, partial_logical_to_all_physical_map=m[layer],
                           partial_logical_to_all_physical_map_num_valid=nv[layer])
                per_layer.append(dyn(torch.tensor(ids[layer], dtype=torch.int32), info).tolist())
            rows.append(per_layer)
        out["chosen_from_" + key] = rows
        out["logical_to_all_physical_map_from_" + key] = m.tolist()
    return out


def generate_rank_invariant(src, outdir):
    os.makedirs(outdir, exist_ok=True)
    rels = {}
    for v in VERSIONS:
        d = os.path.join(src, v)
        if os.path.exists(os.path.join(d, "expert_location_dispatch.py")):
            dyn = load_dispatch(os.path.join(d, "expert_location_dispatch.py"))
            if dyn is not None:
                rels[v] = (load_release(os.path.join(d, "expert_location.py")), dyn)
    if not rels:
        sys.exit("no release under %s has the rank_invariant rule" % src)
    for i, (G, N, per, E) in enumerate([(8, 1, 2, 12), (8, 2, 3, 14), (4, 2, 3, 5),
                                          (16, 4, 2, 20)]):
        case = crafted(200 + i, 2, E, G, N, per)
        rng = random.Random(300 + i)
        batches = []
        for T, K in [(1, 4), (7, 2), (64, 4), (33, 1)]:
            K = min(K, E)
            batches.append([[rng.sample(range(E), K) for _ in range(T)]
                            for _ in range(case["num_layers"])])
        case["topk_ids"] = batches
        case["sglang"] = {v: run_rank_invariant(ns, dyn, case, batches)
                          for v, (ns, dyn) in rels.items()}
        name = case["name"].replace("crafted", "rank_invariant")
        with open(os.path.join(outdir, name + ".json"), "w") as f:
            json.dump(case, f, separators=(",", ":"))
            f.write("\n")
        print(name, "releases:", " ".join(rels))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("download")
    d.add_argument("dir")
    d.add_argument("versions", nargs="*", default=VERSIONS)
    g = sub.add_parser("generate")
    g.add_argument("dir")
    g.add_argument("outdir")
    g.add_argument("--shared", default=None)
    ri = sub.add_parser("rank-invariant")
    ri.add_argument("dir")
    ri.add_argument("outdir")
    a = ap.parse_args()
    if a.cmd == "download":
        download(a.dir, a.versions)
    elif a.cmd == "rank-invariant":
        generate_rank_invariant(a.dir, a.outdir)
    else:
        generate(a.dir, a.outdir, a.shared)


if __name__ == "__main__":
    main()
