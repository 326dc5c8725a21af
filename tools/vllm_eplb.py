#!/usr/bin/env python3
"""Goldens for epx.vllm, from vLLM's own EPLB code, release by release.

vLLM's EPLB placement changed shape and arithmetic a few times. Read from the
wheels 0.9.2 - 0.34.0 (only vllm/distributed/eplb/ differs in what matters):

  0.9.2 - 0.11.0   rebalance_algo.rebalance_experts(weight, num_replicas,
                   num_groups, num_nodes, num_gpus) -> (phy2log, log2phy,
                   logcnt); DeepSeek's EPLB in torch, float32, torch.sort.
  0.11.1 - 0.12.0  the same function; balanced_packing sorts with
                   np.argsort and adds pack loads onto Python floats.
  0.13.0           policy.DefaultEplbPolicy.rebalance_experts (classmethod,
                   last argument num_ranks), the same 3-tuple.
  0.14.0 - 0.18.1  + old_global_expert_indices=None (the map in service:
                   experts that stay on a GPU keep their old slots); all
                   numpy: group loads numpy's float32 sums, quotients
                   (float32 / int64) and pack loads in float64.
  0.19.0 - 0.34.0  returns phy2log alone, a CPU int64 tensor.

The script takes those files out of each release's wheel (`pip download
--no-deps vllm==V`), runs them as they are (rebalance_algo.py and
policy/abstract.py import only torch and numpy; default.py's one relative
import is replaced by the AbstractEplbPolicy of the same release), and
records what each release computes on the cases below. It needs torch.

Ties: where loads tie, vLLM's sorts (torch.sort, np.argsort) are not stable,
so the order of equal loads is up to the sort; its argmax/argmin (and epx's)
take the lowest index. For every case and release the script runs the code
three times: as it is, with its sorts made stable (equal loads in ascending
index order, epx's order) and with equal loads in descending index order:
  tie_free           the three phy2log are equal (no tie in a sort decided);
  rank_tie_free      the same of the replica ranks (log2phy's order; 3-tuple
                     releases: replicas of one expert always tie with each
                     other in the GPU packing);
  counts_tie_free    the replica counts are, as (load, count) pairs (experts
                     of equal load may trade counts);
  max_load_tie_free  the per-GPU max loads are;
  phy2log_stable, replica_rank_stable  the stable run's answer, where it
                     differs from the release's.
`check N` compares epx.vllm with the releases on N more random cases (needs
torch and an installed epx) and prints the tallies.

Usage:
  tools/vllm_eplb.py download DIR [0.9.2 0.11.0 ...]   (needs PyPI)
  tools/vllm_eplb.py generate DIR OUT.json             (needs torch)
  tools/vllm_eplb.py check DIR N                       (needs torch and epx)
DIR holds DIR/<version>/rebalance_algo.py or DIR/<version>/policy/*.py.
"""
import argparse
import ast
import json
import os

from wheel_files import extract

# Each side of every change above, and the newest release read.
VERSIONS = ["0.9.2", "0.11.0", "0.11.1", "0.12.0", "0.13.0", "0.14.0", "0.18.1", "0.19.0",
            "0.34.0"]
EPLB = "vllm/distributed/eplb/"
FILES = ["rebalance_algo.py", "policy/abstract.py", "policy/default.py"]


def download(dest, versions):
    wanted = {EPLB + f: f for f in FILES}
    for v in versions:
        extract("vllm", v, dest, wanted.get)
        print("downloaded", v)


def _exec(path, ns):
    """Run a module's source in ns, minus its relative imports (the caller
    put what they bring into ns)."""
    tree = ast.parse(open(path).read())
    tree.body = [n for n in tree.body if not (isinstance(n, ast.ImportFrom) and n.level)]
    exec(compile(tree, path, "exec"), ns)
    return ns


def load_release(root):
    """(api, ns, run): api "module" (the function) or "class" (the policy),
    ns the namespace the release's code runs in (_TieOrder patches its np),
    run(weight, P, groups, nodes, gpus, old) its entry point as released."""
    algo = os.path.join(root, "rebalance_algo.py")
    if os.path.exists(algo):
        ns = _exec(algo, {"__name__": "vllm_rebalance_algo"})
        fn = ns["rebalance_experts"]
        return "module", ns, lambda w, P, g, n, G, old: fn(w, P, g, n, G)
    abstract = _exec(os.path.join(root, "policy/abstract.py"), {"__name__": "vllm_abstract"})
    ns = _exec(os.path.join(root, "policy/default.py"),
               {"__name__": "vllm_default", "AbstractEplbPolicy": abstract["AbstractEplbPolicy"]})
    cls = ns["DefaultEplbPolicy"]

    def run(w, P, g, n, G, old):
        if old is None:
            return cls.rebalance_experts(w, P, g, n, G)
        return cls.rebalance_experts(w, P, g, n, G, old_global_expert_indices=old)

    return "class", ns, run


def _np():
    import numpy as np

    return np


def _normalise(out):
    """(phy2log, log2phy|None, logcnt|None) as numpy, from either return shape."""
    if isinstance(out, tuple):
        return tuple(x.cpu().numpy() for x in out)
    return out.cpu().numpy(), None, None


def _rank_of_slot(p2l, l2p):
    """Replica rank of each slot [L][P]: log2phy[l][e][r] == p <=> rank[l][p] == r.
    Checked against log2phy, so the test can rebuild it from (phy2log, rank)."""
    np = _np()
    L, P = p2l.shape
    rank = np.full((L, P), -1, dtype=np.int64)
    for l in range(L):
        for e in range(l2p.shape[1]):
            for r, p in enumerate(l2p[l, e]):
                if p >= 0:
                    assert p2l[l, p] == e and rank[l, p] == -1
                    rank[l, p] = r
    assert (rank >= 0).all()
    return rank


def _max_loads(w, p2l, G):
    """Per layer, the largest GPU load: an expert's load split evenly over its replicas."""
    np = _np()
    L, P = p2l.shape
    out = []
    for l in range(L):
        cnt = np.bincount(p2l[l], minlength=w.shape[1])
        per = w[l].astype(np.float64)[p2l[l]] / cnt[p2l[l]]
        out.append(float(per.reshape(G, P // G).sum(axis=1).max()))
    return out


class _TieOrder:
    """Within `with _TieOrder(ns, order)`, the release's sorts put equal keys
    in ascending ("stable") or descending ("reversed") index order: np.argsort
    through the module's `np`, torch's Tensor.sort/torch.sort for the torch
    releases. Nothing else changes; order None leaves the code as it is."""

    def __init__(self, ns, order):
        self.ns, self.order = ns, order

    def _argsort(self, a, axis=-1, **kw):
        np = _np()
        if self.order == "stable":
            return np.argsort(a, axis=axis, kind="stable")
        return _reverse_ties(np, a, axis)

    def __enter__(self):
        import torch

        if self.order is None:
            return self
        np = _np()
        self.saved = (self.ns.get("np"), torch.Tensor.sort, torch.sort)
        proxy = type("np_proxy", (), {"__getattr__": lambda _, k: getattr(np, k)})()
        proxy.argsort = self._argsort
        if "np" in self.ns:
            self.ns["np"] = proxy
        orig = torch.Tensor.sort
        order = self.order

        def sort(t, dim=-1, descending=False, stable=False):
            if order == "stable":
                return orig(t, dim=dim, descending=descending, stable=True)
            f = t.flip(dim)  # stable on the flipped tensor: ties by descending index
            r = orig(f, dim=dim, descending=descending, stable=True)
            return type(r)((r.values, t.size(dim) - 1 - r.indices))

        torch.Tensor.sort = sort
        torch.sort = sort
        return self

    def __exit__(self, *exc):
        import torch

        if self.order is not None:
            np_mod, torch.Tensor.sort, torch.sort = self.saved
            if np_mod is not None:
                self.ns["np"] = np_mod


def _reverse_ties(np, a, axis):
    """argsort with equal keys in descending index order."""
    n = a.shape[axis]
    idx = np.argsort(np.flip(a, axis=axis), axis=axis, kind="stable")
    return n - 1 - idx


def run_case(release, case):
    import torch

    np = _np()
    _, ns, run = release
    w = np.asarray(case["weight"], dtype=case["dtype"])
    P, g, n, G = (case[k] for k in ("num_replicas", "num_groups", "num_nodes", "num_gpus"))
    old = None if case["old"] is None else np.asarray(case["old"], dtype=np.int64)
    E = w.shape[1]
    runs = {}
    for order in (None, "stable", "reversed"):
        t_old = None if old is None else torch.from_numpy(old.copy())
        with _TieOrder(ns, order):
            runs[order] = _normalise(run(torch.from_numpy(w.copy()), P, g, n, G, t_old))
    p2l, l2p, cnt = runs[None]
    res = {"phy2log": p2l.tolist()}
    if l2p is not None:
        assert l2p.shape == (w.shape[0], E, P - E + 1)
        res["replica_rank"] = _rank_of_slot(p2l, l2p).tolist()
        assert (cnt == np.stack([np.bincount(r, minlength=E) for r in p2l])).all()

    def counts(m):
        # experts of equal load may trade replica counts: compare per layer
        # the sorted (load, count) pairs
        c = [np.bincount(r, minlength=E) for r in m]
        return [sorted(zip(w[l].tolist(), c[l].tolist())) for l in range(len(c))]

    maps = [runs[o][0] for o in (None, "stable", "reversed")]
    # the 3-tuple releases: replicas of one expert tie with each other in the
    # GPU packing, so their ranks can move where phy2log does not
    ranks = [None if l2p is None else _rank_of_slot(*runs[o][:2])
             for o in (None, "stable", "reversed")]
    res["tie_free"] = all((m == p2l).all() for m in maps)
    if l2p is not None:
        res["rank_tie_free"] = all((r == ranks[0]).all() for r in ranks)
    res["counts_tie_free"] = all(counts(m) == counts(p2l) for m in maps)
    res["max_load_tie_free"] = all(_max_loads(w, m, G) == _max_loads(w, p2l, G) for m in maps)
    if not (runs["stable"][0] == p2l).all():
        res["phy2log_stable"] = runs["stable"][0].tolist()
    if l2p is not None and not (ranks[1] == ranks[0]).all():
        res["replica_rank_stable"] = ranks[1].tolist()
    return res


def _case(name, weight, P, groups, nodes, gpus, dtype="int64", old=None):
    return {"name": name, "weight": weight, "dtype": dtype, "num_replicas": P,
            "num_groups": groups, "num_nodes": nodes, "num_gpus": gpus, "old": old}


def cases():
    """Small shapes: nodes 1, 2, 4, 8; lone-replica experts (P == E and the
    cold experts of every case); ties built in; with and without an old map."""
    np = _np()
    rng = np.random.default_rng(20261203)
    out = []

    def ints(L, E, hi=1000):
        return rng.integers(1, hi, size=(L, E)).tolist()

    # distinct random loads, each node count and both policies (groups % nodes)
    for E, P, groups, nodes, gpus in [(16, 24, 4, 1, 4), (16, 24, 4, 2, 4), (32, 48, 8, 4, 8),
                                      (32, 64, 8, 8, 8), (24, 32, 6, 4, 8), (20, 30, 5, 2, 2),
                                      (12, 12, 4, 2, 4), (16, 20, 1, 1, 4)]:
        out.append(_case(f"random_e{E}_p{P}_g{groups}_n{nodes}_r{gpus}", ints(3, E), P,
                         groups, nodes, gpus))
    # loads drawn without replacement from a wide range: ties are unlikely,
    # so most of these pin the exact placement
    for E, P, groups, nodes, gpus in [(16, 24, 4, 1, 4), (32, 48, 8, 2, 8), (32, 48, 8, 4, 8),
                                      (32, 64, 8, 8, 8), (24, 36, 3, 2, 6)]:
        w = [rng.choice(10 ** 6, size=E, replace=False).tolist() for _ in range(2)]
        out.append(_case(f"distinct_e{E}_p{P}_n{nodes}", w, P, groups, nodes, gpus))
        w0 = [rng.choice(10 ** 6, size=E, replace=False).tolist() for _ in range(2)]
        out.append(_case(f"distinct_old_e{E}_p{P}_n{nodes}", w, P, groups, nodes, gpus,
                         old={"previous": w0}))
    # float loads (vLLM takes weight.float())
    w = (rng.random((2, 32)) * 100).astype(np.float32).tolist()
    out.append(_case("float_e32_p48_n2", w, 48, 8, 2, 8, dtype="float32"))
    # skewed: one hot expert takes many replicas, most keep one
    w = ints(2, 32, 50)
    w[0][5], w[1][17] = 100000, 50000
    out.append(_case("hot_e32_p48_n4", w, 48, 8, 4, 8))
    # ties: equal loads, equal groups, equal per-replica quotients
    out.append(_case("tie_uniform_n1", [[7] * 16] * 2, 24, 4, 1, 4))
    out.append(_case("tie_uniform_n4", [[5] * 32] * 2, 48, 8, 4, 8))
    out.append(_case("tie_pairs_n2", [[10, 10, 3, 3, 8, 8, 1, 1, 6, 6, 2, 2, 9, 9, 4, 4]] * 2,
                     24, 4, 2, 4))
    out.append(_case("tie_quotients_n1", [[12, 6, 4, 3, 12, 6, 4, 3, 2, 2, 1, 1]], 18, 1, 1, 6))
    out.append(_case("tie_zero_layer_n2", [[0] * 16, [3] * 8 + [0] * 8], 24, 4, 2, 4))
    out.append(_case("tie_groups_n8", [[4, 4, 2, 2] * 8], 48, 8, 8, 8))
    # small integer loads split over three replicas: per-GPU sums that are
    # equal in float32 (epx, vLLM <= 0.13.0) and not in float64 (vLLM >= 0.14.0);
    # found by `check 2000` (its cases 656 and 1032)
    out.append(_case("float64_sums_n1", [[1, 2, 7, 0, 8, 0, 2, 2, 1, 0, 1, 4, 3, 8, 0, 0],
                                         [0, 7, 8, 0, 0, 6, 2, 1, 1, 3, 6, 2, 6, 3, 2, 0]],
                     24, 4, 1, 4))
    # numpy's float32 group sums (vLLM >= 0.14.0): groups of 16 float loads
    out.append(_case("numpy_group_sums_n2", _group_sum_weights(), 80, 4, 2, 8,
                     dtype="float32"))
    # with the map in service: vLLM's own previous answer, the identity, a shuffle
    for E, P, groups, nodes, gpus in [(16, 24, 4, 1, 4), (32, 48, 8, 2, 8), (32, 64, 8, 8, 8),
                                      (32, 48, 8, 4, 8)]:
        w0, w1 = ints(3, E), ints(3, E)
        out.append(_case(f"old_prev_e{E}_p{P}_n{nodes}", w1, P, groups, nodes, gpus,
                         old={"previous": w0}))
    ident = [[p % 16 for p in range(24)]] * 2
    out.append(_case("old_identity_n1", ints(2, 16), 24, 4, 1, 4, old=ident))
    shuf = [rng.permutation([p % 16 for p in range(24)]).tolist() for _ in range(2)]
    out.append(_case("old_shuffled_n2", ints(2, 16), 24, 4, 2, 4, old=shuf))
    holes = [[-1 if p % 5 == 0 else p % 16 for p in range(24)]] * 2
    out.append(_case("old_holes_n1", ints(2, 16), 24, 4, 1, 4, old=holes))
    out.append(_case("old_ties_n2", [[5] * 16] * 2, 24, 4, 2, 4,
                     old=[[(p * 7) % 16 for p in range(24)]] * 2))
    return out


def _group_sum_weights():
    """One layer of 4 groups of 16 float32 loads: groups 0 and 1 hold the same
    loads in two orders, drawn until numpy's pairwise sums (vLLM >= 0.14.0's
    weight.reshape(...).sum(-1)) and running float32 sums (DeepSeek, epx's
    float32 rule) order the two groups oppositely; groups 2 and 3 lighter.
    No two sort keys tie, so vLLM's answer is the same in every tie order."""
    np = _np()
    rng = np.random.default_rng(5)  # its own stream: the other cases keep theirs

    def running(a):
        s = np.float32(0)
        for x in a:
            s = np.float32(s + x)
        return s

    while True:
        a = (rng.random(16) * 1000).astype(np.float32)
        b = rng.permutation(a)
        pa, pb, sa, sb = a.sum(), b.sum(), running(a), running(b)
        if pa != pb and sa != sb and (pa < pb) != (sa < sb):
            c, d = ((rng.random(16) * 900).astype(np.float32) for _ in range(2))
            return [np.concatenate([a, b, c, d]).tolist()]


def generate(src, out_path):
    import numpy as np
    import torch

    releases = {v: load_release(os.path.join(src, v)) for v in VERSIONS
                if os.path.isdir(os.path.join(src, v))}
    newest = max(releases, key=lambda v: tuple(int(x) for x in v.split(".")))
    all_cases = cases()
    for case in all_cases:
        if isinstance(case["old"], dict):
            # the map in service is what the newest release planned for an
            # earlier window, as vLLM passes its own previous answer
            prev = np.asarray(case["old"]["previous"], dtype=np.int64)
            run = releases[newest][2]
            case["old"] = _normalise(run(torch.from_numpy(prev), case["num_replicas"],
                                         case["num_groups"], case["num_nodes"],
                                         case["num_gpus"], None))[0].tolist()
        case["vllm"] = {}
        for v, release in releases.items():
            if case["old"] is not None and release[0] == "module":
                continue  # no old map before the policy class
            if case["old"] is not None and v == "0.13.0":
                continue  # 0.13.0's class takes no old map either
            case["vllm"][v] = run_case(release, case)
        print(case["name"], " ".join(f"{v}:{'=' if r['tie_free'] else 'T'}"
                                     for v, r in case["vllm"].items()))
    meta = {"generator": "tools/vllm_eplb.py", "versions": sorted(releases),
            "torch": torch.__version__, "numpy": np.__version__}
    with open(out_path, "w") as f:
        json.dump({"meta": meta, "cases": all_cases}, f, separators=(",", ":"))
        f.write("\n")


def check(src, n):
    """epx.vllm against every release on n random cases: exact against the
    stable-sort run always, against the release where no tie decided."""
    import numpy as np
    import epx

    releases = {v: load_release(os.path.join(src, v)) for v in VERSIONS
                if os.path.isdir(os.path.join(src, v))}
    rng = np.random.default_rng(n)
    shapes = [(16, 24, 4, 1, 4), (32, 48, 8, 2, 8), (32, 48, 8, 4, 8), (32, 64, 8, 8, 8),
              (64, 80, 8, 2, 8), (24, 36, 3, 2, 6), (20, 24, 5, 2, 4), (16, 16, 4, 4, 4)]
    float_shapes = [(64, 80, 4, 2, 8), (128, 144, 4, 2, 8), (64, 72, 2, 1, 8)]
    tally = {v: [0, 0, 0, 0] for v in releases}  # runs, = stable, tie-free, = released
    for i in range(n):
        E, P, g, nodes, G = shapes[i % len(shapes)]
        hi = [10, 1000, 10 ** 6, None][i % 4]
        if hi is None:  # float loads, where float32 and float64 sums part most often
            # half of them in groups of 16 and 32: numpy's and torch's blocked sums
            if i % 8 == 3:
                E, P, g, nodes, G = float_shapes[(i // 8) % len(float_shapes)]
            case = _case("check", (rng.random((2, E)) * 1000).astype(np.float32).tolist(),
                         P, g, nodes, G, dtype="float32")
            hi = 1000
        else:
            case = _case("check", rng.integers(0, hi, size=(2, E)).tolist(), P, g, nodes, G)
        if i % 2:
            prev = rng.integers(0, hi, size=(2, E))
            case["old"] = epx.vllm.DefaultEplbPolicy.rebalance_experts(prev, P, g, nodes,
                                                                       G).tolist()
        w = np.asarray(case["weight"], dtype=case["dtype"])
        for v, release in releases.items():
            if case["old"] is not None and (release[0] == "module" or v == "0.13.0"):
                continue
            res = run_case(release, case)
            if release[0] == "module":
                mine = epx.vllm.rebalance_experts(w, P, g, nodes, G)[0]
            else:
                old = () if case["old"] is None else (np.asarray(case["old"]),)
                mine = epx.vllm.policy_for(v).rebalance_experts(w, P, g, nodes, G, *old)
                mine = mine if isinstance(mine, np.ndarray) else mine[0]
            t = tally[v]
            t[0] += 1
            same = bool((mine == np.asarray(res.get("phy2log_stable", res["phy2log"]))).all())
            t[1] += same
            if not same:
                print(f"case {i} (E={E} P={P} groups={g} nodes={nodes} gpus={G}), vLLM {v}: "
                      f"epx differs from the stable-sort run")
            t[2] += res["tie_free"]
            t[3] += res["tie_free"] and bool((mine == np.asarray(res["phy2log"])).all())
    for v, (runs, stable, free, same) in tally.items():
        print(f"{v}: {runs} runs; epx == stable-sort run: {stable}; tie-free: {free}, "
              f"epx == release there: {same}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("download")
    d.add_argument("dir")
    d.add_argument("versions", nargs="*", default=VERSIONS)
    g = sub.add_parser("generate")
    g.add_argument("dir")
    g.add_argument("out")
    c = sub.add_parser("check")
    c.add_argument("dir")
    c.add_argument("n", type=int)
    a = ap.parse_args()
    if a.cmd == "download":
        download(a.dir, a.versions)
    elif a.cmd == "check":
        check(a.dir, a.n)
    else:
        generate(a.dir, a.out)


if __name__ == "__main__":
    main()
