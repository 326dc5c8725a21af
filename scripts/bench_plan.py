#!/usr/bin/env python3
"""bench_plan.py - planning time of HEAD's CLI beside an older commit's, on the
same inputs, the two runs alternating (`make bench-plan BASE=<commit>`), so a
slowdown shows as a ratio measured in one sitting (issue 30).

Builds BASE's CLI (CLI only, Release) in build-bench/BASE, uses HEAD's from
./build (built by the Makefile target first), synthesizes one window of each
model, then for each case runs `epx plan ... --report` N times per build,
alternating, and prints the medians of `plan_seconds` (the planner alone, not
the file I/O) and their ratio. Nothing is written outside build-bench/.

    scripts/bench_plan.py --base eb82a5a [--runs 15] [--head build/epx]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (name, model, plan arguments)
CASES = [
    ("Kimi-K2, 8 GPUs, deepseek", "kimi-k2",
     ["--gpus", "8", "--redundant", "32", "--algorithm", "deepseek"]),
    ("DeepSeek-V3, 32 GPUs / 4 nodes, deepseek-hierarchical", "deepseek-v3",
     ["--gpus", "32", "--nodes", "4", "--groups", "8", "--physical", "288", "--algorithm",
      "deepseek-hierarchical"]),
    ("DeepSeek-V3, 256 GPUs / 32 nodes, deepseek (global)", "deepseek-v3",
     ["--gpus", "256", "--nodes", "32", "--physical", "512", "--algorithm", "deepseek"]),
    ("Kimi-K2, 8 GPUs, epx (default)", "kimi-k2", ["--gpus", "8", "--redundant", "32"]),
    ("DeepSeek-V3, 32 GPUs / 4 nodes, epx (default)", "deepseek-v3",
     ["--gpus", "32", "--nodes", "4", "--groups", "8", "--physical", "288"]),
    ("DeepSeek-V3, 256 GPUs / 32 nodes, epx (default)", "deepseek-v3",
     ["--gpus", "256", "--nodes", "32", "--groups", "8", "--physical", "512"]),
]


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, **kw)


def build_base(rev, out):
    """BASE's CLI (Release, no CUDA/MPI/tests) in out/; returns its path."""
    src = out / "src"
    if not src.exists():
        run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(src), rev])
    else:
        run(["git", "-C", str(src), "checkout", "--detach", rev])
    bld = out / "build"
    run(["cmake", "-S", str(src), "-B", str(bld), "-DCMAKE_BUILD_TYPE=Release",
         "-DEPX_BUILD_TESTS=OFF", "-DEPX_WITH_CUDA=OFF", "-DEPX_WITH_MPI=OFF"])
    run(["cmake", "--build", str(bld), "--target", "epx_cli", "-j", str(os.cpu_count() or 2)])
    return bld / "epx"


def plan_seconds(epx, counts, args, work):
    rep = work / "report.json"
    run([str(epx), "plan", "--counts", str(counts), *args, "-o", str(work / "placement.json"),
         "--report", str(rep)])
    return json.loads(rep.read_text())["plan_seconds"]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the commit to compare with (any git rev)")
    ap.add_argument("--runs", type=int, default=15, help="runs per build and case (default 15)")
    ap.add_argument("--head", default=str(ROOT / "build" / "epx"), help="HEAD's CLI")
    a = ap.parse_args(argv)
    if a.runs < 1:
        ap.error("--runs must be at least 1, not %d" % a.runs)
    head = Path(a.head)
    if not head.is_file():
        sys.exit("bench_plan: %s is missing: run `make demo-build` first" % head)
    rev = run(["git", "-C", str(ROOT), "rev-parse", "--verify", a.base + "^{commit}"]).stdout
    rev = rev.strip()
    out = ROOT / "build-bench" / rev[:12]
    out.mkdir(parents=True, exist_ok=True)
    print("building %s's CLI in %s ..." % (rev[:12], out), flush=True)
    base = build_base(rev, out)
    work = out / "work"
    work.mkdir(exist_ok=True)
    traces = {}
    for _, model, _ in CASES:
        if model not in traces:
            traces[model] = work / ("%s.json" % model)
            run([str(head), "trace", "synth", "--model", model, "--windows", "1", "--tokens",
                 "65536", "--seed", "1", "-o", str(traces[model])])
    print("\n%-58s %12s %12s %8s" % ("plan (%d runs each, alternating)" % a.runs,
                                      rev[:10] + " ms", "HEAD ms", "ratio"))
    for name, model, args in CASES:
        t = {"base": [], "head": []}
        for _ in range(a.runs):
            for who, exe in (("base", base), ("head", head)):
                t[who].append(plan_seconds(exe, traces[model], args, work))
        mb, mh = statistics.median(t["base"]), statistics.median(t["head"])
        print("%-58s %12.3f %12.3f %7.2fx" % (name, mb * 1e3, mh * 1e3, mh / mb))
    print("\nratio = HEAD / base: above 1 is slower. Medians of plan_seconds (--report).")


if __name__ == "__main__":
    main(sys.argv[1:])
