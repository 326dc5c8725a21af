#!/usr/bin/env python3
"""Goldens for `epx plan --algorithm deepseek* --sglang-version V`, from
SGLang's own copy of DeepSeek's EPLB.

For each release the script takes sglang/srt/eplb/eplb_algorithms/ out of
that release's wheel (`pip download --no-deps sglang==V`) and imports it
unchanged, with only the modules around it stubbed (sglang.srt.utils, whose
get_bool_env_var <= 0.5.3 imports and never calls, and
sglang.srt.elastic_ep.elastic_ep, which 0.5.4.post1 - 0.5.10.post1 import at
the top and the deepseek algorithms never use). It then calls the release's
eplb_algorithms.rebalance_experts with compute_algorithm's choice, exactly as
ExpertLocationMetadata.init_by_eplb does, on each case.

Read from the releases (`check` on every 0.5.x from 0.5.2 to 0.5.23 and
0.5.4.post1, 0.5.4.post2, 0.5.10.post1), deepseek.py has three versions
and changed once in a way that changes results: from 0.5.11
balanced_packing sums pack loads over weight.tolist() (Python floats,
float64) where <= 0.5.10.post1 added float32 tensor elements. (0.5.4 only
dropped an unused import; deepseek_vec.py is byte-identical in every
release; compute_algorithm's auto rule never changed; __init__.py changed
at 0.5.4, 0.5.8 and 0.5.10 for the elasticity_aware algorithms only, which
epx serves as 0.5.23 has them: generate-0523 below.) VERSIONS holds a release on each side of every change,
and the oldest and newest; `check` prints the sha256 of each release's
files, so a new release can be placed in a group before it is added.

Each case records its load, shape and request, a `ties` flag (two equal
float32 values where an unstable sort or an argmax must choose: equal
loads, equal group loads, or equal per-replica loads w/k of two experts;
epx's own DeepSeek rule sends those to the lowest index, its SGLang rules
take torch's sort order, as the releases do), and per release:
  physical_to_logical_map [L][P], logical_to_physical_map [L][E][X]
  (replica-rank order, X = the largest replica count), logical_count [L][E].

SGLang 0.5.23's other algorithms (`generate-0523`, into its own OUTDIR:
tests/data/sglang_eplb_0523) are run from 0.5.23 alone, through the same
rebalance_experts and compute_algorithm: deepseek_vec and
deepseek_vec_hierarchical on the per-step series (int32 counts, as stat
mode records them, and float32 ones, as torch.tensor makes of JSON reals;
1 to 40 steps, so torch's sums over steps take both their forms), and
elasticity_aware(_hierarchical) with active-rank masks (all active, one,
several and most ranks down), the mask given as ElasticEPStateManager's
instance().active_ranks. torch runs single-threaded (its sums over steps
are split across threads from 32768 elements). Each case adds "dtype"
(the tensor's) and, for elasticity_aware, "active_ranks" [G] (1 = active).

Usage (torch needed: e.g. a venv with torch and numpy):
  tools/sglang_eplb.py download DIR [VERSIONS...]   (needs PyPI)
  tools/sglang_eplb.py check DIR
  tools/sglang_eplb.py generate DIR OUTDIR
  tools/sglang_eplb.py generate-0523 DIR OUTDIR
DIR holds DIR/<version>/sglang/srt/eplb/eplb_algorithms/*.py.
"""
import argparse
import glob
import hashlib
import importlib
import json
import os
import random
import sys
import types

from wheel_files import extract

VERSIONS = ["0.5.2", "0.5.10.post1", "0.5.11", "0.5.23"]
PKG = "sglang/srt/eplb/eplb_algorithms/"


def download(dest, versions):
    for v in versions:
        extract("sglang", v, dest,
                lambda name: name if name.startswith(PKG) and name.endswith(".py") else None)


def load_release(root):
    """The release's eplb_algorithms package, imported from root/sglang/...
    with the two modules around it stubbed."""
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]
    sg = types.ModuleType("sglang")
    sg.__path__ = [os.path.join(root, "sglang")]
    sys.modules["sglang"] = sg
    utils = types.ModuleType("sglang.srt.utils")
    utils.get_bool_env_var = lambda name, default="false": False
    el = types.ModuleType("sglang.srt.elastic_ep.elastic_ep")
    el.ElasticEPStateManager = None
    sys.modules["sglang.srt.utils"] = utils
    sys.modules["sglang.srt.elastic_ep"] = types.ModuleType("sglang.srt.elastic_ep")
    sys.modules["sglang.srt.elastic_ep.elastic_ep"] = el
    return importlib.import_module("sglang.srt.eplb.eplb_algorithms")


def run_case(algos, case):
    import torch

    t = torch.tensor(case["logical_count"], dtype=torch.float64)
    if t.dim() == 2:
        t = t.unsqueeze(0)
    P, G = case["num_physical_experts"], case["num_gpus"]
    groups = case["num_groups"] or None  # 0 = the model has none (SGLang's None)
    algo = algos.compute_algorithm(raw_algorithm=case["algorithm"], num_groups=groups,
                                   num_nodes=case["num_nodes"])
    p2l, l2p, cnt = algos.rebalance_experts(
        tokens_per_expert=t, num_physical_experts=P, num_local_physical_experts=P // G,
        num_groups=groups, num_nodes=case["num_nodes"], algorithm=algo)
    return {"algorithm": algo.name, "physical_to_logical_map": p2l.tolist(),
            "logical_to_physical_map": l2p.tolist(), "logical_count": cnt.tolist()}


def run_case_0523(algos, case):
    """One case of 0.5.23's deepseek_vec / elasticity_aware, as init_by_eplb
    calls rebalance_experts (the active ranks through the state manager)."""
    import torch

    dtype = {"int32": torch.int32, "float32": torch.float32, "float64": torch.float64}
    t = torch.tensor(case["logical_count"], dtype=dtype[case["dtype"]])
    if t.dim() == 2:
        t = t.unsqueeze(0)
    P, G = case["num_physical_experts"], case["num_gpus"]
    groups = case["num_groups"] or None
    active = torch.tensor(case.get("active_ranks", [1] * G), dtype=torch.int32)

    class State:
        active_ranks = active

    class Manager:
        @staticmethod
        def instance():
            return State

    sys.modules["sglang.srt.elastic_ep.elastic_ep"].ElasticEPStateManager = Manager
    algo = algos.compute_algorithm(raw_algorithm=case["algorithm"], num_groups=groups,
                                   num_nodes=case["num_nodes"])
    p2l, l2p, cnt = algos.rebalance_experts(
        tokens_per_expert=t, num_physical_experts=P, num_local_physical_experts=P // G,
        num_groups=groups, num_nodes=case["num_nodes"], algorithm=algo)
    return {"algorithm": algo.name, "physical_to_logical_map": p2l.tolist(),
            "logical_to_physical_map": l2p.tolist(), "logical_count": cnt.tolist()}


def cases_0523():
    """Seeded cases for deepseek_vec(_hierarchical) and
    elasticity_aware(_hierarchical)."""
    import numpy as np

    rng = random.Random(27)
    out = []

    def add(name, load, G, N, P, K, algo, dtype, active=None):
        S, L, E = len(load), len(load[0]), len(load[0][0])
        c = {"name": name, "num_layers": L, "num_logical_experts": E, "num_physical_experts": P,
             "num_gpus": G, "num_nodes": N, "num_groups": K, "algorithm": algo, "dtype": dtype,
             "num_steps": S, "logical_count": load}
        if active is not None:
            c["active_ranks"] = active
        out.append(c)

    def series(kind, S, L, E):
        if kind == "int":  # int32 counts, ties likely
            return [[[rng.randrange(0, 300) for _ in range(E)] for _ in range(L)]
                    for _ in range(S)]
        if kind == "ties":  # few values, a layer without load, large equal ones
            big = [[[rng.choice([0, 1, 2, 5]) for _ in range(E)] for _ in range(L)]
                   for _ in range(S)]
            for s in range(S):
                big[s][0] = [0] * E
                if L > 2:
                    big[s][2] = [10_000_000 + rng.choice([0, 1]) for _ in range(E)]
            return big
        # float32 values, spread over magnitudes
        return [[[float(np.float32(rng.lognormvariate(4, 1.5))) for _ in range(E)]
                 for _ in range(L)] for _ in range(S)]

    # (G, N, E, P, groups, L): one slot per GPU and several; L * E below 8,
    # below 32, between blocks of 32 and past them (torch's column forms).
    vec = [(4, 1, 4, 8, 0, 1), (4, 1, 16, 20, 0, 2), (4, 1, 24, 32, 0, 3), (8, 1, 24, 32, 4, 3),
           (2, 1, 6, 6, 0, 2), (8, 2, 32, 48, 4, 2), (4, 1, 48, 64, 0, 2)]
    hvec = [(4, 1, 16, 24, 4, 2), (8, 2, 32, 48, 4, 3), (8, 2, 32, 40, 8, 2),
            (16, 4, 32, 64, 8, 2), (8, 4, 24, 32, 4, 3), (4, 2, 8, 8, 2, 2)]
    steps = [1, 3, 8, 20, 40]
    for i, (G, N, E, P, K, L) in enumerate(vec):
        for j, kind in enumerate(["int", "float", "ties"]):
            S = steps[(i + j) % len(steps)]
            add(f"vec_{kind}_{i:02d}_s{S}", series(kind, S, L, E), G, N, P, K, "deepseek_vec",
                "float32" if kind == "float" else "int32")
    for i, (G, N, E, P, K, L) in enumerate(hvec):
        for j, kind in enumerate(["int", "float", "ties"]):
            S = steps[(i + j + 2) % len(steps)]
            add(f"hvec_{kind}_{i:02d}_s{S}", series(kind, S, L, E), G, N, P, K,
                "deepseek_vec_hierarchical", "float32" if kind == "float" else "int32")
    # Sums that only torch's order tells apart: in layer 2 every expert
    # carries the same large load per step (the 1e-4 tie-breaker lost in
    # float32), so every candidate's sum over steps is the same in exact
    # arithmetic, and the experts whose column takes the other form of
    # torch's sum (columns 64..71 of 72) must round lower than the others.
    import torch

    for n, (G, N, E, P, K, algo) in enumerate([(4, 1, 24, 32, 0, "deepseek_vec"),
                                               (8, 1, 24, 32, 0, "deepseek_vec"),
                                               (8, 2, 24, 32, 4, "deepseek_vec_hierarchical")]):
        S, L = 40, 3
        while True:
            v = [rng.randrange(10_000_000, 16_000_000) for _ in range(S)]
            col = torch.tensor(v, dtype=torch.float32)[:, None].expand(S, L * E).contiguous()
            sums = col.sum(0)
            if sums[64] < sums[48]:
                break
        load = series("int", S, L, E)
        for s_ in range(S):
            load[s_][2] = [v[s_]] * E
        add(f"form_{n}_{algo}", load, G, N, P, K, algo, "int32")
    # elasticity_aware: (G, N, E, P, groups, masks)
    el = [(4, 1, 16, 24, 0, [[1, 1, 1, 1], [1, 0, 1, 1], [0, 1, 1, 1], [1, 1, 0, 1]]),
          (8, 2, 32, 48, 4, [[1] * 8, [1, 1, 1, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1, 0],
                             [1, 1, 1, 1, 1, 1, 1, 0]]),
          (8, 1, 16, 24, 0, [[1] * 8, [1, 1, 1, 1, 1, 1, 0, 1]]),
          (16, 4, 64, 96, 8, [[1] * 16, [1] * 15 + [0], [0, 1, 1, 1] * 4])]
    for i, (G, N, E, P, K, masks) in enumerate(el):
        for m, mask in enumerate(masks):
            for algo in ["elasticity_aware", "elasticity_aware_hierarchical"]:
                if algo.endswith("hierarchical") and K == 0 and all(mask):
                    continue  # the release needs groups there
                for kind in ["int", "float"]:
                    load = [[[rng.randrange(0, 5000) if kind == "int" else
                              float(rng.lognormvariate(6, 1.5)) for _ in range(E)]
                             for _ in range(2)] for _ in range(3)]
                    if m == 1 and kind == "int":
                        load[0][1] = [3] * E  # ties
                    h = "h" if algo.endswith("hierarchical") else ""
                    add(f"el{h}_{kind}_{i}_m{m}", load, G, N, P, K, algo,
                        "int32" if kind == "int" else "float64", mask)
    return out


def generate_0523(src, outdir):
    import torch

    torch.set_num_threads(1)
    os.makedirs(outdir, exist_ok=True)
    algos = load_release(os.path.join(src, "0.5.23"))
    source = sha(os.path.join(src, "0.5.23"))
    for case in cases_0523():
        case["sglang_source_sha256"] = {"0.5.23": source}
        case["sglang"] = {"0.5.23": run_case_0523(algos, case)}
        with open(os.path.join(outdir, case["name"] + ".json"), "w") as f:
            json.dump(case, f, separators=(",", ":"))
            f.write("\n")
        print(case["name"], case["sglang"]["0.5.23"]["algorithm"])


def has_ties(case):
    """Equal float32 values where the reference's unstable sort or argmax
    chooses (see the module's docstring)."""
    import numpy as np

    w = np.asarray(case["logical_count"], dtype=np.float64)
    if w.ndim == 3:
        w = w.sum(axis=0)
    w = w.astype(np.float32)
    L, E = w.shape
    K = case["num_groups"] or 1
    X = case["num_physical_experts"] - E + 1
    for row in w:
        if len(set(row.tolist())) < E:
            return True
        g = row.reshape(K, E // K).sum(axis=1, dtype=np.float32)
        if len(set(g.tolist())) < K:
            return True
        seen = {}
        for e, x in enumerate(row.tolist()):
            for k in range(1, X + 1):
                q = float(np.float32(x) / np.float32(k))
                if seen.setdefault(q, e) != e:
                    return True
    return False


def _case(name, load, G, N, P, groups, algorithm):
    L, E = (len(load), len(load[0])) if not isinstance(load[0][0], list) else \
        (len(load[0]), len(load[0][0]))
    c = {"name": name, "num_layers": L, "num_logical_experts": E, "num_physical_experts": P,
         "num_gpus": G, "num_nodes": N, "num_groups": groups, "algorithm": algorithm,
         "logical_count": load}
    c["ties"] = has_ties(c)
    return c


def near_load(rng, L, E, base, spread):
    """float32-exact loads packed close together, where float32 and float64
    pack sums round apart (the cases that tell the rules apart)."""
    import numpy as np

    return [[float(np.float32(base + rng.random() * spread)) for _ in range(E)]
            for _ in range(L)]


def cases():
    rng = random.Random(18)
    out = []
    # (G, N, E, P, groups, algorithm): nodes 1, 2, 4, 8; global, hierarchical
    # and auto; P = E (single replicas everywhere) and redundant slots.
    shapes = [(4, 1, 16, 16, 0, "deepseek"), (4, 1, 16, 24, 0, "deepseek"),
              (8, 1, 32, 48, 4, "auto"), (8, 2, 32, 40, 4, "deepseek_hierarchical"),
              (8, 2, 32, 32, 8, "auto"), (16, 4, 64, 80, 8, "auto"),
              (16, 4, 64, 96, 4, "deepseek"), (16, 8, 64, 96, 8, "deepseek_hierarchical"),
              (32, 8, 64, 128, 16, "auto"), (8, 8, 16, 24, 8, "deepseek_hierarchical")]
    for i, (G, N, E, P, K, algo) in enumerate(shapes):
        # [S][L][E] integer windows, summed as SGLang sums them; ties likely
        ints = [[[rng.randrange(0, 5000) for _ in range(E)] for _ in range(3)]
                for _ in range(3)]
        out.append(_case(f"int_{i:02d}_g{G}_n{N}", ints, G, N, P, K, algo))
        out.append(_case(f"float_{i:02d}_g{G}_n{N}",
                         [[float(rng.lognormvariate(6, 1.5)) for _ in range(E)] for _ in range(2)],
                         G, N, P, K, algo))
        out.append(_case(f"near_{i:02d}_g{G}_n{N}", near_load(rng, 4, E, 1e7, 1e5),
                         G, N, P, K, algo))
        # Ties everywhere: few distinct loads, a layer with all loads equal
        # and one without load; torch's sort order decides them.
        few = [[rng.choice([0, 1, 2, 3, 8]) for _ in range(E)] for _ in range(2)]
        out.append(_case(f"ties_{i:02d}_g{G}_n{N}", few + [[7] * E, [0] * E], G, N, P, K, algo))
    return out


# Many replicas per GPU: where float32 and float64 pack sums part most.
MANY = [(4, 1, 64, 64, 0, "deepseek"), (4, 1, 64, 96, 0, "deepseek"), (8, 2, 64, 96, 8, "auto"),
        (16, 4, 64, 128, 8, "auto"), (16, 4, 64, 128, 8, "deepseek_hierarchical")]


def parting_cases(old, new):
    """Per MANY shape, the first of up to 40 seeded draws on which releases
    old and new (the last of one rule, the first of the next) place
    differently with no ties, so the goldens tell the rules apart."""
    rng = random.Random(1811)
    out = []
    for i, (G, N, E, P, K, algo) in enumerate(MANY):
        for _ in range(40):
            c = _case(f"parting_{i}_g{G}_n{N}", near_load(rng, 4, E, 1e7, 1e5), G, N, P, K, algo)
            a = run_case(load_release(old), c)["physical_to_logical_map"]
            b = run_case(load_release(new), c)["physical_to_logical_map"]
            if a != b and not c["ties"]:
                out.append(c)
                break
    return out


def sha(root):
    h = hashlib.sha256()
    for p in sorted(glob.glob(os.path.join(root, PKG, "*.py"))):
        h.update(open(p, "rb").read())
    return h.hexdigest()[:16]


def releases(src):
    return [v for v in VERSIONS if os.path.isdir(os.path.join(src, v, PKG))]


def check(src):
    for v in sorted(os.listdir(src)):
        if os.path.isdir(os.path.join(src, v, PKG)):
            one = hashlib.sha256(open(os.path.join(src, v, PKG, "deepseek.py"), "rb").read())
            print(v, "package", sha(os.path.join(src, v)), "deepseek.py", one.hexdigest()[:16])


def generate(src, outdir):
    os.makedirs(outdir, exist_ok=True)
    all_cases = cases()
    have = releases(src)
    if "0.5.10.post1" in have and "0.5.11" in have:
        all_cases += parting_cases(os.path.join(src, "0.5.10.post1"),
                                   os.path.join(src, "0.5.11"))
    source = {v: sha(os.path.join(src, v)) for v in have}
    for case in all_cases:
        case["sglang"] = {}
        case["sglang_source_sha256"] = source
    for v in have:
        algos = load_release(os.path.join(src, v))
        for case in all_cases:
            case["sglang"][v] = run_case(algos, case)
    for case in all_cases:
        outs = case["sglang"]
        differ = len({json.dumps(o["physical_to_logical_map"]) for o in outs.values()}) > 1
        case["releases_differ"] = differ
        with open(os.path.join(outdir, case["name"] + ".json"), "w") as f:
            json.dump(case, f, separators=(",", ":"))
            f.write("\n")
        print(case["name"], "ties" if case["ties"] else "no ties",
              "releases differ" if differ else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("download")
    d.add_argument("dir")
    d.add_argument("versions", nargs="*", default=VERSIONS)
    c = sub.add_parser("check")
    c.add_argument("dir")
    g = sub.add_parser("generate")
    g.add_argument("dir")
    g.add_argument("outdir")
    n = sub.add_parser("generate-0523")
    n.add_argument("dir")
    n.add_argument("outdir")
    a = ap.parse_args()
    if a.cmd == "download":
        download(a.dir, a.versions)
    elif a.cmd == "check":
        check(a.dir)
    elif a.cmd == "generate-0523":
        generate_0523(a.dir, a.outdir)
    else:
        generate(a.dir, a.outdir)


if __name__ == "__main__":
    main()
