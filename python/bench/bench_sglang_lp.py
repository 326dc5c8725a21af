#!/usr/bin/env python3
"""SGLang 0.5.23's own per-batch LP dispatch (`--ep-dispatch-algorithm lp`)
beside epx's balanced routing, same GPU, same placements, same batches.

SGLang: sglang.srt.eplb.lplb_solver.LPLBSolver, one per layer, built as
SGLang's init_lplb_solvers builds it (phy2log, log2phy [E][P] padded to P as
ExpertLocationMetadata stores it, num_gpus, ep_group=None: one process, no
all-reduce, logical_to_all_physical_map_num_valid); solve(topk_ids) counts
the batch and runs its three JIT CUDA kernels (LP prep, a fused single-block
interior-point solve built with cuBLASDx, log2phy_prob out). Two SGLang rows:
  sglang_lp_solve     solve(topk_ids) -> log2phy_prob [E][P]
  sglang_lp_dispatch  solve, then the draw SGLang's topk path makes with it
                      (cuda_solver.dispatch_probability: ids -> slots)
epx: epx.torch.balanced_topk(topk_ids, Mapping.balanced(...)): ids -> counts
-> exact split -> integer counts -> slots, one launch (row epx_balanced).

Shapes are epx's balanced benchmarks' (bench/balanced.cu,
python/bench/bench_balanced_lp.py): Kimi-K2.5 E = 384, P = 416 on 8 GPUs;
DeepSeek-V3 E = 256, P = 288 on 32 GPUs (4 nodes, 8 groups); K = 8, T in
1, 16, 128, 1024, 4096. With the traces (--shared, default .devsgl/shared
then ../shared): placements are epx.plan of windows 0..3, and each layer's
batch is T tokens drawn from a window 4..7 of that layer's counts (K distinct
experts a token, weighted by the counts). Without them: bench/balanced.cu's
synthetic placement (extra slots to hot experts) and skewed ids E*u^2.

Every layer's result is checked before anything is timed: both engines'
slots hold the token's logical expert, epx's slot counts are its slots', and
epx's exact optimum (epx.dispatch.Balancer, one CPU call) equals the LP's
optimum by scipy's linprog (bench_balanced_lp.lp, when scipy is there).
Reported beside the times: each engine's max GPU load over that optimum
(median and max over layers): for sglang_lp_solve the load log2phy_prob
implies (its rows normalised over the expert's replicas, as its draw reads
them, times the expert's tokens), for the two routings the load of the slots
they chose; and the layers whose interior-point solve did not converge (the
kernel then writes 0.5 everywhere: uniform over the replicas).

Times: CUDA events around the layers' calls, one call per layer, median of
--rounds rounds, divided by the layers: eager (launched from Python, what an
engine pays per call) and from a CUDA graph of the same calls where capture
works (bench/dispatch_torch.py's `timed`). SGLang's JIT compile is timed on
its own first: every module the chosen layers need (one IPM, prep and post
module per distinct LP shape, one draw module per model), built at once by
SGLang's parallel_compile through its load_jit, into --jit-cache.

  PYTHONPATH=.devsgl/site:python python3 python/bench/bench_sglang_lp.py --json out.jsonl
  (scripts/gpu_sglang_lp.sh sets the rest; scripts/stage_sglang_lp.sh builds .devsgl)
  --compile-only: no GPU needed; build the modules for sm_90a and stop.
"""
import argparse
import datetime
import functools
import json
import os
import shutil
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SITE = os.path.join(ROOT, ".devsgl", "site")
SGLANG_VERSION = "0.5.23"
SETUPS = (  # shape, trace, G, nodes, P, groups
    ("kimi-k2.5", "kimi_k2", 8, 1, 416, None),
    ("deepseek-v3", "deepseek_v3", 32, 4, 288, 8),
)
SYNTH_E = {"kimi-k2.5": 384, "deepseek-v3": 256}
K = 8
ENGINES = ("sglang_lp_solve", "sglang_lp_dispatch", "epx_balanced")
DEVICE = "cuda"  # a test may point the whole run elsewhere


def fail(msg, code=2):
    print("bench_sglang_lp: " + msg, file=sys.stderr)
    sys.exit(code)


def tail(text, lines=60):
    return "\n".join(str(text).splitlines()[-lines:])


def import_sglang():
    """SGLang's LP modules from the staged .devsgl/site (or PYTHONPATH)."""
    if os.path.isdir(SITE) and SITE not in sys.path:
        sys.path.insert(0, SITE)
    try:
        from sglang.srt.eplb.lplb_solver import LPLBSolver
        from sglang.kernels.ops.lplb import cuda_solver
        from sglang.kernels.jit.utils import override_jit_cuda_arch, parallel_compile
        from sglang.version import __version__
        import sglang
    except ImportError as e:
        where = SITE if os.path.isdir(SITE) else "nowhere (%s is missing)" % SITE
        fail("SGLang %s's LP path could not be imported from %s: %s. Stage it with "
             "scripts/stage_sglang_lp.sh (on a machine with network; .devsgl/ then travels "
             "with `carry`), for this Python (%d.%d: PYVERS in that script)"
             % (SGLANG_VERSION, where, e, sys.version_info[0], sys.version_info[1]))
    if __version__ != SGLANG_VERSION:
        fail("the staged SGLang is %s, not %s: re-run scripts/stage_sglang_lp.sh"
             % (__version__, SGLANG_VERSION))
    return (LPLBSolver, cuda_solver, override_jit_cuda_arch, parallel_compile,
            os.path.dirname(sglang.__file__))


def check_tools():
    """What SGLang's load_jit runs: ninja (the Python package's when it is not
    on PATH), the host compiler ($CXX or c++) and nvcc (CUDA_HOME, PATH or
    /usr/local/cuda, as its toolchain looks)."""
    if shutil.which("ninja") is None:
        try:
            import ninja
            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ["PATH"]
        except (ImportError, AttributeError):
            fail("ninja is not on PATH (SGLang's JIT build runs it): install ninja")
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        fail("the host compiler %s is not on PATH (SGLang's JIT build runs it)" % cxx)
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = os.path.join(home, "bin", "nvcc") if home else (shutil.which("nvcc") or
                                                         "/usr/local/cuda/bin/nvcc")
    if not os.path.isfile(nvcc):
        fail("nvcc is not at %s (SGLang's JIT build runs it): set CUDA_HOME" % nvcc)


# ---- placements and batches -------------------------------------------------------

def synthetic_placement(rng, E, P, G, nodes):
    """bench/balanced.cu's make_place: every expert one slot (expert e on node
    e % nodes), the node's extra slots to its hot experts (the first
    2 (P - E) by the batches' skew), slots shuffled within the node."""
    per_node = P // nodes
    hot = min(2 * (P - E), E)
    p2l = np.empty(P, np.int64)
    fill = [0] * nodes
    for e in range(E):
        nd = e % nodes
        p2l[nd * per_node + fill[nd]] = e
        fill[nd] += 1
    for nd in range(nodes):
        while fill[nd] < per_node:
            h = int(rng.integers(max(hot // nodes, 1))) * nodes + nd
            p2l[nd * per_node + fill[nd]] = h if h < E else nd
            fill[nd] += 1
        rng.shuffle(p2l[nd * per_node:(nd + 1) * per_node])
    return p2l


def draw_tokens(rng, p, T):
    """T tokens of K distinct experts each, drawn without replacement by
    weights p (Gumbel top-K: the same law as successive weighted draws)."""
    with np.errstate(divide="ignore"):
        keys = np.log(p)[None, :] + rng.gumbel(size=(T, len(p)))
    return np.argpartition(-keys, K - 1, axis=1)[:, :K].astype(np.int32)


def build_setup(shape, trace, G, nodes, P, groups, shared, n_layers, rng):
    import epx
    path = os.path.join(shared, "traces", trace + ".json") if shared else None
    if path and os.path.isfile(path):
        with open(path) as f:
            counts = np.array(json.load(f)["logical_count"], dtype=np.float64)
        plan = epx.plan(counts[:4], G, num_physical_experts=P, num_nodes=nodes,
                        num_groups=groups)
        lay = plan.layout
        live = [l for l in range(lay.num_layers) if counts[4:, l].sum() > 0]
        pick = sorted(set(live[int(round(i))] for i in
                          np.linspace(0, len(live) - 1, min(n_layers, len(live)))))

        def batch(j, l, T):
            c = counts[4 + j % 4, l]
            return draw_tokens(rng, c / c.sum(), T)
        source = "trace %s (plan of windows 0..3, batches from 4..7)" % path
    else:
        E = SYNTH_E[shape]
        lay = epx.Layout.from_map(synthetic_placement(rng, E, P, G, nodes)[None, :], G, nodes, E)
        pick = [0] * n_layers

        def batch(j, l, T):
            u = rng.random((T, K))
            return (E * u * u).astype(np.int32)
        source = "synthetic (bench/balanced.cu's placement, ids E*u^2)"
    p2l = np.asarray(lay.physical_to_logical_map)
    return {"shape": shape, "E": lay.num_logical_experts, "P": P, "G": G, "source": source,
            "layers": pick, "p2l": p2l, "nv": np.asarray(lay.num_valid),
            "l2p_sgl": lay.logical_to_all_physical_map("sglang"),
            "l2p_epx": lay.logical_to_all_physical_map(), "batch": batch}


def module_args(cs, p2l, E, X, G, sm_ver):
    """The JIT modules LPLBSolver's constructor and solve() ask for, by the
    arithmetic of its __init__: (builder, args) for the IPM, prep and post."""
    logcnt = np.bincount(p2l, minlength=E)
    single, red_log = int((logcnt == 1).sum()), int((logcnt > 1).sum())
    red_phy = int((logcnt[p2l] > 1).sum())
    nc, nv = red_log + G, red_phy + G + 2
    bd = cs.DEFAULT_BLOCK_DIM
    return [(cs._ipm_module, (nc, nv, bd, cs.DEFAULT_NUM_ITERS, sm_ver)),
            (cs._prep_module, (nc, nv, single, red_log, G, bd)),
            (cs._post_module, (E, X, single, red_phy, bd))]


def prebuild(cs, parallel_compile, setups, sm_ver):
    """Every module of every chosen layer, built at once; (wall s, [s each])."""
    jobs = {}
    for s in setups:
        for l in s["layers"]:
            for fn, args in module_args(cs, s["p2l"][l], s["E"], s["P"], s["G"], sm_ver):
                jobs[(fn.__name__, args)] = (fn, args)
        jobs[("_dispatch_module", (s["P"],))] = (cs._dispatch_module,
                                                  (s["P"], cs.DISPATCH_BLOCK_DIM))
    each = []

    def timed_build(fn, args):
        t0 = time.perf_counter()
        fn(*args)
        each.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    try:
        parallel_compile([functools.partial(timed_build, fn, args) for fn, args in jobs.values()],
                         max_workers=os.cpu_count())
    except Exception as e:  # SGLang's load_jit: RuntimeError with nvcc's output
        fail("SGLang's JIT build failed (%s). The compiler's output, last lines:\n%s"
             % (type(e).__name__, tail(e)), 3)
    return time.perf_counter() - t0, each


# ---- the checks --------------------------------------------------------------------

def gpu_max(slot_load, G):
    return float(np.asarray(slot_load, np.float64).reshape(G, -1).sum(1).max())


def implied_load(prob, l2p, counts, P):
    """The slot loads SGLang's draw realises in expectation from log2phy_prob:
    each row normalised over the expert's replicas (uniform when it is all
    zero), times the expert's tokens."""
    valid = l2p >= 0
    pr = np.where(valid, prob, 0.0)
    rs = pr.sum(1, keepdims=True)
    share = np.where(rs > 0, pr / np.where(rs > 0, rs, 1.0), valid / valid.sum(1, keepdims=True))
    load = np.zeros(P)
    np.add.at(load, l2p[valid], (share * counts[:, None])[valid])
    return load


def check_slots(name, phys, ids, p2l, where):
    if phys.shape != ids.shape or (p2l[phys] != ids).any():
        fail("%s: %s routed a token to a slot of another expert" % (where, name), 4)


# ---- main --------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_shared = os.path.join(ROOT, ".devsgl", "shared")
    if not os.path.isdir(default_shared):
        default_shared = os.environ.get("EPX_SHARED", os.path.join(ROOT, "..", "shared"))
    ap.add_argument("--shared", default=default_shared,
                    help="folder with traces/ (default .devsgl/shared, else $EPX_SHARED or "
                         "../shared); none there: synthetic batches")
    ap.add_argument("--layers", type=int, default=8, help="layers per shape (default 8)")
    ap.add_argument("--tokens", default="1,16,128,1024,4096", help="the T values")
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--shapes", default=",".join(s[0] for s in SETUPS))
    ap.add_argument("--jit-cache", default=os.path.join(ROOT, "build", "sgl-jit"),
                    help="SGLANG_JIT_CACHE_DIR for the compiled modules (default build/sgl-jit)")
    ap.add_argument("--no-graph", action="store_true", help="eager times only")
    ap.add_argument("--compile-only", action="store_true",
                    help="build SGLang's modules for sm_90a (no GPU needed) and stop")
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--json", help="append the JSON lines to this file too")
    args = ap.parse_args()
    Ts = [int(t) for t in args.tokens.split(",")]
    shapes = args.shapes.split(",")
    if set(shapes) - {s[0] for s in SETUPS}:
        fail("--shapes: known shapes are %s" % ", ".join(s[0] for s in SETUPS))
    os.environ.setdefault("SGLANG_JIT_CACHE_DIR", os.path.abspath(args.jit_cache))

    try:
        import torch
    except ImportError:
        fail("PyTorch is not installed for %s" % sys.executable)
    if not args.compile_only:
        if not torch.cuda.is_available():
            fail("no CUDA GPU visible to torch %s: this benchmark times GPU kernels (use "
                 "--compile-only to check SGLang's JIT build without one)" % torch.__version__)
        cap = torch.cuda.get_device_capability()
        if cap < (9, 0):
            fail("SGLang's LP solver needs sm_90 or newer; %s is sm_%d%d"
                 % (torch.cuda.get_device_name(), cap[0], cap[1]))
    LPLBSolver, cs, override_arch, parallel_compile, sgl_dir = import_sglang()
    check_tools()
    try:
        from epx import dispatch
        import epx.torch as et
    except (ImportError, OSError) as e:
        fail("epx could not be imported (%s): PYTHONPATH needs python/ and EPX_LIBRARY a "
             "built libepx.so (scripts/gpu_sglang_lp.sh sets both)" % e)
    if not args.compile_only and not et.gpu_available():
        fail("epx's GPU path is unavailable: %s" % et.gpu_unavailable_reason())
    try:
        sys.path.insert(0, HERE)
        from bench_balanced_lp import lp as linprog_opt
    except ImportError:
        linprog_opt = None
        print("bench_sglang_lp: scipy is missing: the optimum is epx's alone, not linprog's")
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from dispatch_torch import timed

    rng = np.random.default_rng(args.seed)
    setups = [build_setup(*s, args.shared, args.layers, rng) for s in SETUPS if s[0] in shapes]
    cache_dir = os.environ["SGLANG_JIT_CACHE_DIR"]
    warm = os.path.isdir(cache_dir) and any(os.scandir(cache_dir))
    print("SGLang %s from %s; JIT cache %s (%s)" % (SGLANG_VERSION, sgl_dir, cache_dir,
                                                   "holds builds" if warm else "empty"))
    for s in setups:
        print("%s: E=%d P=%d G=%d, layers %s, %s" % (s["shape"], s["E"], s["P"], s["G"],
                                                    s["layers"], s["source"]))

    if args.compile_only:
        with override_arch(9, 0):
            wall, each = prebuild(cs, parallel_compile, setups, cs._sm_ver())
        print("compile-only: %d modules for sm_90a in %.1f s (each %.1f .. %.1f s, on %d CPUs)"
              % (len(each), wall, min(each), max(each), os.cpu_count()))
        return

    dev = torch.device(DEVICE)
    meta = {"bench": "sglang_lp", "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "sglang": SGLANG_VERSION,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")}
    print("device: %s, torch %s" % (meta["device"], meta["torch"]))
    rows = []
    wall, each = prebuild(cs, parallel_compile, setups, cs._sm_ver())
    rows.append(dict(meta, engine="sglang_jit", modules=len(each), wall_s=round(wall, 2),
                     module_s_median=round(statistics.median(each), 2),
                     module_s_max=round(max(each), 2), cpus=os.cpu_count(), cache_warm=warm))
    print("SGLang JIT: %d modules in %.1f s wall (%s; one module %.1f s median, %.1f s max, "
          "%d CPUs)" % (len(each), wall, "cache held builds" if warm else "cold cache",
                        statistics.median(each), max(each), os.cpu_count()))

    table = []
    for s in setups:
        E, P, G = s["E"], s["P"], s["G"]
        p2l = s["p2l"]
        solvers, maps, init_s = [], [], []
        for l in s["layers"]:
            t0 = time.perf_counter()
            try:
                solvers.append(LPLBSolver(
                    torch.from_numpy(p2l[l]).to(dev), torch.from_numpy(s["l2p_sgl"][l]).to(dev),
                    G, None, torch.from_numpy(s["nv"][l]).to(dev)))
            except Exception as e:
                fail("SGLang's LPLBSolver could not be built for %s layer %d (%s):\n%s"
                     % (s["shape"], l, type(e).__name__, tail(e)), 3)
            torch.cuda.synchronize()
            init_s.append(time.perf_counter() - t0)
            maps.append(et.Mapping.balanced(s["l2p_epx"][l], P, G, s["nv"][l]).to(dev))
        l2p32 = [torch.from_numpy(s["l2p_sgl"][l]).to(dev, torch.int32) for l in s["layers"]]
        balancer = dispatch.Balancer(E, s["l2p_epx"].shape[2], P, G)
        rows.append(dict(meta, engine="sglang_lp_init", shape=s["shape"], layers=len(solvers),
                         init_ms_median=round(1e3 * statistics.median(init_s), 3)))
        for T in Ts:
            ids_np = [s["batch"](j, l, T) for j, l in enumerate(s["layers"])]
            ids = [torch.from_numpy(a).to(dev) for a in ids_np]
            ratio = {e: [] for e in ENGINES}
            nonconv = 0
            first_ms = None
            for j, l in enumerate(s["layers"]):
                where = "%s T=%d layer %d" % (s["shape"], T, l)
                counts = np.bincount(ids_np[j].ravel(), minlength=E).astype(np.int64)
                opt = float(balancer.solve(s["l2p_epx"][l], counts).max_load)
                if linprog_opt is not None:
                    z = linprog_opt(s["l2p_epx"][l], P, G, counts)
                    if abs(z - opt) > 1e-6 * max(1.0, z):
                        fail("%s: epx's optimum %.9g differs from linprog's %.9g" % (where, opt, z),
                             4)
                t0 = time.perf_counter()
                prob = solvers[j].solve(ids[j])
                torch.cuda.synchronize()
                if first_ms is None:
                    first_ms = 1e3 * (time.perf_counter() - t0)
                prob_np = prob.double().cpu().numpy()
                x = getattr(solvers[j], "_x", None)
                if x is not None and bool((x == 0.5).all()):
                    nonconv += 1
                phys_s = cs.dispatch_probability(ids[j], prob, l2p32[j]).cpu().numpy()
                phys_e, per_slot = et.balanced_topk(ids[j], maps[j])
                phys_e, per_slot = phys_e.cpu().numpy(), per_slot.cpu().numpy()
                check_slots("SGLang's draw", phys_s, ids_np[j], p2l[l], where)
                check_slots("epx.torch.balanced_topk", phys_e, ids_np[j], p2l[l], where)
                if (np.bincount(phys_e.ravel(), minlength=P) != per_slot).any():
                    fail("%s: epx's tokens_per_slot is not its slots' count" % where, 4)
                if opt <= 0:
                    continue
                ratio["sglang_lp_solve"].append(
                    gpu_max(implied_load(prob_np, s["l2p_sgl"][l], counts, P), G) / opt)
                ratio["sglang_lp_dispatch"].append(
                    gpu_max(np.bincount(phys_s.ravel(), minlength=P), G) / opt)
                ratio["epx_balanced"].append(gpu_max(per_slot, G) / opt)
                # no split beats the optimum: a ratio below 1 is a bug here
                low = [e for e in ENGINES if ratio[e][-1] < 1 - 1e-6]
                if low:
                    fail("%s: %s below the optimum %.6g: the load check is wrong"
                         % (where, low, opt), 4)

            pairs = list(zip(solvers, ids, l2p32, maps))
            fns = {
                "sglang_lp_solve": lambda: [sv.solve(i) for sv, i, _, _ in pairs],
                "sglang_lp_dispatch": lambda: [cs.dispatch_probability(i, sv.solve(i), m32)
                                               for sv, i, m32, _ in pairs],
                "epx_balanced": lambda: [et.balanced_topk(i, m) for _, i, _, m in pairs],
            }
            for eng in ("epx_balanced", "sglang_lp_solve", "sglang_lp_dispatch"):
                eager = timed(fns[eng], 1, rounds=args.rounds, graph=False) / len(pairs)
                graph, gerr = None, None
                if not args.no_graph:
                    try:
                        graph = timed(fns[eng], 1, rounds=args.rounds, graph=True) / len(pairs)
                    except Exception as e:  # capture refused: say why, keep going
                        gerr = "%s: %s" % (type(e).__name__, " | ".join(tail(e, 3).splitlines()))
                        torch.cuda.synchronize()
                r = ratio[eng]
                row = dict(meta, shape=s["shape"], E=E, P=P, G=G, K=K, T=T, layers=len(pairs),
                           engine=eng, eager_us=round(eager, 2),
                           graph_us=None if graph is None else round(graph, 2),
                           max_load_over_opt_median=round(statistics.median(r), 4) if r else None,
                           max_load_over_opt_max=round(max(r), 4) if r else None)
                if gerr:
                    row["graph_error"] = gerr
                if eng == "sglang_lp_solve":
                    row["ipm_not_converged"] = nonconv
                    row["first_solve_ms"] = round(first_ms, 3)
                rows.append(row)
                table.append(row)
                print("%-12s %5d %-19s %10.2f %10s %9s %9s" % (
                    s["shape"], T, eng, eager, "-" if graph is None else "%.2f" % graph,
                    "-" if not r else "%.4f" % statistics.median(r),
                    "-" if not r else "%.4f" % max(r)), flush=True)

    print("\n%-12s %5s %-19s %10s %10s %9s %9s" % ("shape", "T", "engine", "eager us",
                                                  "graph us", "load med", "load max"))
    print("(per layer; load = max GPU load / the exact optimum, over the layers)")
    for r in table:
        print("%-12s %5d %-19s %10.2f %10s %9s %9s" % (
            r["shape"], r["T"], r["engine"], r["eager_us"],
            "-" if r["graph_us"] is None else "%.2f" % r["graph_us"],
            "-" if r["max_load_over_opt_median"] is None else
            "%.4f" % r["max_load_over_opt_median"],
            "-" if r["max_load_over_opt_max"] is None else "%.4f" % r["max_load_over_opt_max"]))
    errs = sorted({r["graph_error"] for r in table if "graph_error" in r})
    for e in errs:
        print("graph capture refused: %s" % e)
    print()
    lines = [json.dumps(r) for r in rows]
    print("\n".join(lines))
    if args.json:
        with open(args.json, "a") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
