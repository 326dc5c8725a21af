#!/usr/bin/env python3
"""The README's EP figures, written from the benchmark's JSON lines.

Issue 24 asks that no engine figure in the README be typed by hand: the JSON
lines that `epx bench comm --json` and bench/buffer_torch.py append to
bench/results/ep_h200.jsonl are the source. Each figure block of README.md
sits between `<!-- figures: NAME -->` and `<!-- /figures -->`; this script
rebuilds every block from the newest run that holds its rows.

  scripts/readme_figures.py            print the blocks
  scripts/readme_figures.py --check    exit 1 naming each block that differs
  scripts/readme_figures.py --write    rewrite them in README.md

A run is a stretch of consecutive lines whose dates lie within RUN_GAP_S of
each other (one `epx bench comm` call and the scripts run right after it), so
every figure of a block comes from one run, as the README says. `epx advise
--measured` draws its runs by the same rule (tools/epx/bench_runs.c,
CLI_RUN_GAP_S): change both together.
"""
import argparse
import datetime
import json
import os
import re
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENS = (1, 8, 32, 128)
DECODE = (1, 8, 32)  # the sizes the latency targets speak of
RUN_GAP_S = 300
BLOCK = re.compile(r"( *<!-- figures: ([a-z0-9-]+) -->\n)(.*?)( *<!-- /figures -->)", re.S)
INDENT = "  "  # the blocks continue a README bullet


def when(row):
    return datetime.datetime.strptime(row["date"], "%Y-%m-%dT%H:%M:%SZ")


def runs(rows):
    """Consecutive rows split where the date jumps by more than RUN_GAP_S."""
    out = []
    for r in rows:
        if out and abs((when(r) - when(out[-1][-1])).total_seconds()) <= RUN_GAP_S:
            out[-1].append(r)
        else:
            out.append([r])
    return out


def round_trips(run, mode="low-latency", transport="pointers", api=None, floor=None, reps=True):
    """{tokens: median us} of the graph-replayed round trips of one kind in a run
    (reps: only rows timed as several iterations per graph, `graph_reps`). Rows
    of an engine whose token bound was not the batch's own (`--token-bound
    max`, a before/after beside the default) are not the default's figures."""
    got = {}
    for r in run:
        if (r.get("mode") == mode and r.get("phase") == "round-trip" and r.get("graph")
                and r.get("ranks") == 1 and r.get("dtype") == "bf16" and r.get("api") == api
                and r.get("floor") == floor
                and r.get("token_bound", r.get("tokens")) == r.get("tokens")
                and (mode == "floor" or api is not None or r.get("transport") == transport)
                and (not reps or api is not None or r.get("graph_reps"))):
            got[r["tokens"]] = r["median_us"]
    return got


def newest(all_runs, *kinds, tokens=TOKENS):
    """The newest run that holds every token count of every kind (a function
    of the run returning {tokens: us})."""
    for run in reversed(all_runs):
        if all(all(t in k(run) for t in tokens) for k in kinds):
            return run
    return None


def fmt(v):
    return "%.0f" % v if v >= 1000 else "%.1f" % v


def series(d):
    return " / ".join(fmt(d[t]) for t in TOKENS)


def ll_engine(all_runs):
    eng = lambda run: round_trips(run)  # noqa: E731
    flag = lambda run: round_trips(run, mode="floor", floor="flag")  # noqa: E731
    run = newest(all_runs, eng, flag)
    if run is None:
        return None
    e, f = eng(run), flag(run)
    ratios = [e[t] / f[t] for t in DECODE]
    text = ("Dispatch + combine take %s µs at %s tokens with DeepEP's expert-major receive, "
            "against %s µs for two bare kernels with a minimal flag protocol moving the same "
            "bytes in the same run: %.1f-%.1fx that floor at decode sizes"
            % (series(e), " / ".join(map(str, TOKENS)), series(f), min(ratios), max(ratios)))
    # The Buffer's rows carry the C engine's figure of their own run
    # (bench/buffer_torch.py), so they need not share the engine's run.
    torch_run = newest(all_runs, torch_round_trips)
    if torch_run is not None:
        rows = [r for r in torch_run if is_torch_graph(r)]
        gap = max(abs(r["median_us"] - r["c_engine_us"]) for r in rows)
        text += ("; the same round trip from PyTorch (`epx.torch.Buffer`) costs within %.1f µs "
                 "of the C engine's figure measured beside it" % gap)
    return text + "."


def is_torch_graph(r):
    return (r.get("api") == "torch" and r.get("graph") and r.get("dtype") == "bf16"
            and r.get("c_engine_us") is not None)


def torch_round_trips(run):
    """{tokens: median us} of the Buffer's graph-replayed round trips in a run."""
    return {r["tokens"]: r["median_us"] for r in run if is_torch_graph(r)}


def ll_transport(all_runs, transport, label):
    other = lambda run: round_trips(run, transport=transport, reps=False)  # noqa: E731
    dev = lambda run: round_trips(run, reps=False)  # noqa: E731
    run = newest(all_runs, other, dev)
    if run is None:
        return None
    o, d = other(run), dev(run)
    ratio = max(o[t] / d[t] for t in DECODE)
    reps = [r.get("graph_reps") for r in run if r.get("transport") == transport and r.get("graph")]
    how = ("%d iterations per graph" % reps[-1] if reps and reps[-1]
           else "one iteration per graph, the timing before 2026-12-04")
    return ("%s: %s µs per graph-replayed round trip at %s tokens, beside %s µs over device "
            "memory in the same call (up to %.1fx at decode sizes; %s)."
            % (label, series(o), " / ".join(map(str, TOKENS)), series(d), ratio, how))


NORMAL_TOKENS = (1, 1024, 4096)  # a decode step, a prefill chunk, issue 24's bandwidth size


def normal_rows(run, phase):
    """{tokens: row} of normal mode's graph-replayed `phase` rows in a run
    (one rank, bf16, device memory, several iterations per graph, each
    batch's own token bound)."""
    return {r["tokens"]: r for r in run
            if r.get("mode") == "normal" and r.get("phase") == phase and r.get("graph")
            and r.get("ranks") == 1 and r.get("dtype") == "bf16" and r.get("api") is None
            and r.get("transport") == "pointers" and r.get("graph_reps")
            and r.get("token_bound", r.get("tokens")) == r.get("tokens")}


def normal_engine(all_runs):
    kinds = [lambda run, ph=ph: normal_rows(run, ph) for ph in ("round-trip", "dispatch",
                                                                 "combine")]
    run = newest(all_runs, *kinds, tokens=NORMAL_TOKENS)
    if run is None:
        return None
    rt = {t: r["median_us"] for t, r in normal_rows(run, "round-trip").items()}
    big = NORMAL_TOKENS[-1]
    d, c = normal_rows(run, "dispatch")[big], normal_rows(run, "combine")[big]
    return ("Normal mode (`--mode normal`, the compact receive, the same graph timing): dispatch "
            "+ combine take %s µs at %s tokens; at %d tokens the dispatch runs at %.0f%% and "
            "the combine at %.0f%% of a device copy of the same bytes timed in the same run "
            "(issue 24 asks 80%%)."
            % (" / ".join(fmt(rt[t]) for t in NORMAL_TOKENS),
               " / ".join(map(str, NORMAL_TOKENS)), big, d["copy_pct"], c["copy_pct"]))


GENERATORS = {
    "ll-engine": ll_engine,
    "ll-host": lambda runs_: ll_transport(runs_, "host", "Pinned host memory (for GPUs without "
                                          "peer access)"),
    "ll-nccl": lambda runs_: ll_transport(runs_, "nccl", "Over NCCL (one rank sending to itself)"),
    "normal-engine": normal_engine,
}


def wrap(sentence):
    """A block's body: the sentence wrapped as a continuation of a bullet."""
    return textwrap.fill(sentence, width=96, initial_indent=INDENT, subsequent_indent=INDENT,
                         break_on_hyphens=False) + "\n"


def blocks(jsonl):
    rows = [json.loads(line) for line in open(jsonl) if line.strip()]
    all_runs = runs(rows)
    out = {}
    for name, gen in GENERATORS.items():
        sentence = gen(all_runs)
        out[name] = wrap(sentence) if sentence is not None else None
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    ap.add_argument("--jsonl", default=os.path.join(ROOT, "bench", "results", "ep_h200.jsonl"))
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--check", action="store_true")
    g.add_argument("--write", action="store_true")
    args = ap.parse_args()
    want = blocks(args.jsonl)
    text = open(args.readme, encoding="utf-8").read()
    found, bad = set(), []

    def sub(m):
        name = m.group(2)
        found.add(name)
        if name not in want:
            bad.append("%s: no such figure block (known: %s)" % (name, ", ".join(want)))
            return m.group(0)
        if want[name] is None:
            bad.append("%s: %s holds no run with its rows" % (name, args.jsonl))
            return m.group(0)
        if m.group(3) != want[name]:
            bad.append("%s: the README's figures differ from %s" % (name, args.jsonl))
        return m.group(1) + want[name] + m.group(4)

    new = BLOCK.sub(sub, text)
    missing = [n for n in want if n not in found]
    if args.check:
        for b in bad + ["%s: no block in %s" % (n, args.readme) for n in missing]:
            print("readme_figures: " + b, file=sys.stderr)
        if bad or missing:
            print("readme_figures: run scripts/readme_figures.py --write", file=sys.stderr)
            return 1
        return 0
    if args.write:
        if any("differ" not in b for b in bad):
            print("\n".join("readme_figures: " + b for b in bad), file=sys.stderr)
            return 1
        # beside the README, then renamed over it: a failed write leaves it whole
        tmp = args.readme + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(new)
        os.replace(tmp, args.readme)
        return 0
    for name, body in want.items():
        print("%s<!-- figures: %s -->\n%s%s<!-- /figures -->"
              % (INDENT, name, body or INDENT + "(no run)\n", INDENT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
