#!/usr/bin/env python3
"""Time per call of epx's drop-ins beside the PyTorch reference, for the
Kimi-K2 and DeepSeek-V3 shapes:

  rebalance_experts (DeepSeek EPLB, as SGLang calls it on every rebalance)
  compute_logical_to_rank_dispatch_physical_map (SGLang's static dispatch table)

The reference is the engine's own code, never a copy: SGLang's
eplb_algorithms/deepseek.py and eplb/expert_location.py, imported from an
installed sglang, or loaded by path from an unpacked sglang wheel
(--ref-path DIR, the folder holding sglang/). Without torch, or without the
reference, only epx is timed and the output says so.

Results are checked before anything is timed: epx's placement against the
reference's (logical_count identical, balancedness identical to 1e-9, as
shared/golden/README.md defines parity); dispatch tables entry by entry.

--epx-default also times epx's own planner through the same drop-in
(rebalance_experts(..., algorithm="epx"), torch in and out, the shape's groups
and nodes) against the reference, the two calls alternating; its placement is
validated, not compared (it is another placement), and its balancedness shown.

  python bench_rebalance.py [--repeat 5] [--threads 1] [--ref-path DIR] [--json FILE]
                            [--epx-default] [--shapes SUBSTR,...]
"""
import argparse
import importlib
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
import types

import numpy as np

import epx

# (label, model, GPUs, nodes, physical slots): SGLang's auto rule picks the
# hierarchical policy when num_groups % num_nodes == 0.
SHAPES = [
    ("kimi-k2 8 GPUs", "kimi-k2", 8, 1, 416),
    ("deepseek-v3 32 GPUs 4 nodes", "deepseek-v3", 32, 4, 288),
    ("deepseek-v3 64 GPUs 8 nodes", "deepseek-v3", 64, 8, 320),
    ("deepseek-v3 256 GPUs 32 nodes", "deepseek-v3", 256, 32, 512),
]


# ---- the reference --------------------------------------------------------

def _load_file(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while it executes
    spec.loader.exec_module(mod)
    return mod


def _stub_runtime_context():
    """expert_location.py asks the running server for its parallel settings.
    Outside a server, answer as a plain single-job run does: no elastic EP,
    ep_size and nnodes as set by set_parallel() before each call."""
    ctx = types.ModuleType("sglang.srt.runtime_context")
    par = types.SimpleNamespace(ep_size=1, nnodes=1)
    exe = types.SimpleNamespace(moe=types.SimpleNamespace(ep_join_mode="none"))
    ctx.get_parallel = lambda: par
    ctx.get_exec = lambda: exe
    ctx.get_device = lambda: "cpu"
    ctx.get_resources = lambda: None
    el = types.ModuleType("sglang.srt.elastic_ep.elastic_ep")
    el.elastic_expanded_world_enabled = lambda: False
    for n in ("sglang", "sglang.srt", "sglang.srt.elastic_ep"):
        sys.modules.setdefault(n, types.ModuleType(n))
    sys.modules["sglang.srt.runtime_context"] = ctx
    sys.modules["sglang.srt.elastic_ep.elastic_ep"] = el
    return par


def reference_version(ref_path):
    """The SGLang release the reference is (its dist-info, or the installed
    package), so epx's table is asked for by that release's rule; None where
    unknown (then both sides' rules may differ and the table is not compared)."""
    import glob
    import re
    for d in glob.glob(os.path.join(ref_path or "", "sglang-*.dist-info")):
        return os.path.basename(d)[len("sglang-"):-len(".dist-info")]
    vf = os.path.join(ref_path or "", "sglang", "version.py")
    if os.path.isfile(vf):
        m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", open(vf).read())
        if m:
            return m.group(1)
    try:
        from importlib.metadata import version
        return version("sglang")
    except Exception:  # noqa: BLE001 - not installed
        return None


def find_reference(ref_path):
    """-> (torch, rebalance_experts, dispatch_fn, set_parallel, notes)."""
    notes = []
    try:
        import torch
    except ImportError:
        return None, None, None, None, ["torch is not installed: timing epx only"]
    reb = disp = None
    set_par = lambda G, N: None  # noqa: E731
    try:
        reb = importlib.import_module("sglang.srt.eplb.eplb_algorithms.deepseek").rebalance_experts
        disp = importlib.import_module(
            "sglang.srt.eplb.expert_location").compute_logical_to_rank_dispatch_physical_map
        notes.append("reference: installed sglang")
    except Exception as e:  # not installed, or its imports need a server
        root = ref_path or next((p for p in sys.path if os.path.isfile(
            os.path.join(p, "sglang/srt/eplb/eplb_algorithms/deepseek.py"))), None)
        if root is None:
            notes.append("no sglang reference found (%s): timing epx only" % type(e).__name__)
            return torch, None, None, None, notes
        eplb = os.path.join(root, "sglang", "srt", "eplb")
        reb = _load_file("ref_deepseek", os.path.join(eplb, "eplb_algorithms",
                                                      "deepseek.py")).rebalance_experts
        notes.append("reference: %s loaded by path" % os.path.join(eplb, "eplb_algorithms",
                                                                   "deepseek.py"))
        try:
            par = _stub_runtime_context()
            disp = _load_file("ref_expert_location", os.path.join(
                eplb, "expert_location.py")).compute_logical_to_rank_dispatch_physical_map

            def set_par(G, N):
                par.ep_size, par.nodes = G, N
                par.nnodes = N
            notes.append("reference dispatch: %s, single-job runtime context"
                         % os.path.join(eplb, "expert_location.py"))
        except Exception as e2:
            notes.append("reference dispatch not loadable (%s)" % e2)
    return torch, reb, disp, set_par, notes


# ---- timing and checks ------------------------------------------------------

def timeit(f, repeat):
    f()  # warm
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return min(ts), statistics.median(ts)


def timeit_alternating(fs, repeat):
    """Each of fs once per round, in turn, so that a busy machine slows all
    alike: -> [(best, median)] in fs's order."""
    for f in fs:
        f()  # warm
    ts = [[] for _ in fs]
    for _ in range(repeat):
        for f, t in zip(fs, ts):
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
    return [(min(t), statistics.median(t)) for t in ts]


def balancedness(weight, p2l, G):
    w = np.asarray(weight, dtype=np.float32).astype(np.float64)
    L, E = w.shape
    out = []
    for l in range(L):
        cnt = np.bincount(p2l[l], minlength=E)
        gpu = (w[l, p2l[l]] / cnt[p2l[l]]).reshape(G, -1).sum(axis=1)
        if gpu.max() > 0:
            out.append(gpu.mean() / gpu.max())
    return np.array(out)


def check_parity(weight, G, mine, ref):
    p, _, c = (np.asarray(x) for x in mine)
    rp, _, rc = (x.numpy() for x in ref)
    if not np.array_equal(c, rc):
        raise SystemExit("parity check failed: logical_count differs from the reference")
    b, rb = balancedness(weight, p, G), balancedness(weight, rp, G)
    if b.shape != rb.shape or np.abs(b - rb).max() > 1e-9:
        raise SystemExit("parity check failed: balancedness differs from the reference")
    return float(b.mean())


def run(args):
    torch, ref_reb, ref_disp, set_par, notes = find_reference(args.ref_path)
    ref_ver = args.ref_version or (reference_version(args.ref_path) if ref_disp is not None
                                   else None)
    if ref_disp is not None:
        notes.append("epx's table by SGLang %s's rule" % ref_ver if ref_ver else
                     "reference release unknown (give --ref-version): tables not compared")
    if torch is not None:
        torch.set_num_threads(args.threads)
    rows = []
    pick = [s.strip() for s in args.shapes.split(",")] if args.shapes else None
    for label, model, G, N, P in SHAPES:
        if pick and not any(s in label for s in pick):
            continue
        m = epx.trace.model(model)
        groups = m["num_groups"]
        hier = groups % N == 0
        weight = epx.trace.synth(model, num_windows=1, tokens=65536, seed=0)[0].astype(
            np.float32)
        L, E = weight.shape
        row = dict(shape=label, L=L, E=E, P=P, G=G, N=N, groups=groups,
                   policy="hierarchical" if hier else "global")
        call = lambda: epx.rebalance_experts(weight, P, groups, N, G, hier)  # noqa: E731
        mine = call()
        if ref_reb is not None:
            tw = torch.from_numpy(weight)
            ref = ref_reb(tw, P, groups, N, G, hier)
            row["balancedness"] = check_parity(weight, G, mine, ref)
            row["parity"] = "logical_count and balancedness identical"
            row["ref_s"] = timeit(lambda: ref_reb(tw, P, groups, N, G, hier), args.repeat)
            row["epx_torch_s"] = timeit(
                lambda: epx.rebalance_experts(tw, P, groups, N, G, hier), args.repeat)
        else:
            lay = epx.Layout.from_map(mine[0], G)  # validates the placement
            np.testing.assert_array_equal(lay.num_valid, mine[2])
            row["balancedness"] = float(balancedness(weight, mine[0], G).mean())
        row["epx_s"] = timeit(call, args.repeat)
        if args.epx_default:
            default = lambda w: epx.rebalance_experts(  # noqa: E731
                w, P, groups, N, G, hier, algorithm="epx")
            dp = np.asarray(default(weight)[0])
            epx.Layout.from_map(dp, G)  # validates the placement
            row["default_balancedness"] = float(balancedness(weight, dp, G).mean())
            if ref_reb is not None:
                row["default_s"], row["default_ref_s"] = timeit_alternating(
                    [lambda: default(tw), lambda: ref_reb(tw, P, groups, N, G, hier)],
                    args.repeat)
            else:
                row["default_s"] = timeit(lambda: default(weight), args.repeat)

        l2p = mine[1]
        # the reference release's rule and node count (its call shape for the
        # first four arguments is the same in every release without server_args)
        rule = dict(sglang_version=ref_ver, nnodes=N) if ref_ver else {}
        table = epx.compute_logical_to_rank_dispatch_physical_map(l2p, G, P, 0, **rule)
        row["epx_table_s"] = timeit(
            lambda: epx.compute_logical_to_rank_dispatch_physical_map(l2p, G, P, 0, **rule),
            args.repeat)
        if ref_disp is not None and ref_ver:
            set_par(G, N)
            tl2p = torch.from_numpy(l2p)
            rt = ref_disp(tl2p, G, P, 0).numpy()
            row["table_parity"] = bool(np.array_equal(rt, table))
            row["ref_table_s"] = timeit(lambda: ref_disp(tl2p, G, P, 0), max(1, args.repeat // 2))
        rows.append(row)
        print(_fmt(row), flush=True)
        if args.epx_default:
            print(_fmt_default(row), flush=True)
    env = dict(python=platform.python_version(), numpy=np.__version__,
               torch=getattr(torch, "__version__", None), threads=args.threads,
               machine=platform.machine(), cpus=os.cpu_count(), libepx=epx.version(),
               notes=notes)
    return env, rows


def _fmt(r):
    def t(x):
        return "%8.2f ms" % (x[0] * 1e3) if x else "       -   "
    s = "%-30s %-12s epx %s" % (r["shape"], r["policy"], t(r["epx_s"]))
    if "ref_s" in r:
        s += " | torch in/out %s | reference %s | x%.0f" % (
            t(r["epx_torch_s"]), t(r["ref_s"]), r["ref_s"][0] / r["epx_torch_s"][0])
    s += " || table epx %s" % t(r["epx_table_s"])
    if "ref_table_s" in r:
        s += " | reference %s | x%.0f | %s" % (
            t(r["ref_table_s"]), r["ref_table_s"][0] / r["epx_table_s"][0],
            "identical" if r["table_parity"] else "DIFFERENT")
    return s


def _fmt_default(r):
    ms = lambda x: "%8.2f ms" % (x * 1e3)  # noqa: E731
    s = "  epx default, medians: epx %s (balancedness %.4f)" % (
        ms(r["default_s"][1]), r["default_balancedness"])
    if "default_ref_s" in r:
        s += " | reference %s (%.4f) | x%.1f" % (
            ms(r["default_ref_s"][1]), r["balancedness"],
            r["default_ref_s"][1] / r["default_s"][1])
    return s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (reference)")
    ap.add_argument("--ref-path", default=None,
                    help="folder holding an unpacked sglang/ package (no install needed)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--ref-version", default=None,
                    help="the reference's SGLang release (found from its dist-info or "
                         "sglang/version.py when not given): epx's table follows its rule")
    ap.add_argument("--epx-default", action="store_true",
                    help="also time epx's own planner (algorithm='epx') against the "
                    "reference, alternating, medians")
    ap.add_argument("--shapes", default=None,
                    help="only the shapes whose label contains one of these "
                    "comma-separated strings")
    args = ap.parse_args(argv)
    print("best of %d calls after a warm-up; epx = numpy in/out" % args.repeat)
    env, rows = run(args)
    for n in env["notes"]:
        print("note:", n)
    print("env:", json.dumps({k: v for k, v in env.items() if k != "notes"}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(env=env, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
