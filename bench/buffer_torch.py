#!/usr/bin/env python3
"""epx.torch.Buffer (DeepEP's low-latency API) against the C engine it wraps,
same shape, same run (issue 25's targets: as a CUDA graph within 1 us of the
C engine's figure; called eagerly at most 25 us above the graph figure).

One rank on the one GPU (a gloo group of one process), the Kimi-K2.5 layer:
H = 7168 bf16, top-8 of E = 384 experts, num_max_dispatch_tokens_per_rank =
the largest T. Timed per T, median of 31 rounds of CUDA events
(bench/dispatch_torch.py's `timed`):
  graph   eight round trips (dispatch + zero-copy combine) captured in one
          CUDA graph, queued behind a hold so the events time the GPU alone,
          per round trip (as `epx bench comm --graph` times its own)
  eager   the same two calls from Python, 10 back to back per round: what
          the custom-op layer, the argument checks and ctypes add
  fp8     the graph again with use_fp8=True (fp8 on the wire)
With --epx PATH the C engine is measured first in the same run
(`epx bench comm --backend nccl --gpus 1 --mode low-latency --graph`, its
round-trip rows) and printed beside. --json FILE appends JSON lines with
"api": "torch" (bench/results/ep_h200.jsonl's format plus "c_engine_us").
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dispatch_torch import append_jsonl, one_rank_group, timed  # noqa: E402  (one timing method for the benches)

from epx.torch import Buffer  # noqa: E402

H, K, E = 7168, 8, 384


def c_engine(epx, tokens):
    """The C engine's round trip (graph, launched) per T, from epx bench comm."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "c.jsonl")
        subprocess.run([epx, "bench", "comm", "--backend", "nccl", "--gpus", "1", "--mode",
                        "low-latency", "--graph", "--model", "kimi-k2.5", "--tokens",
                        ",".join(map(str, tokens)), "--json", out], check=True,
                       stdout=subprocess.DEVNULL)
        rows = [json.loads(line) for line in open(out)]
    return {(r["tokens"], r["graph"]): r["median_us"] for r in rows
            if r["mode"] == "low-latency" and r["phase"] == "round-trip"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1,8,32,128")
    ap.add_argument("--epx", help="the epx CLI, to time the C engine in the same run")
    ap.add_argument("--json", help="append JSON lines here")
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    M = max(tokens)
    c = c_engine(args.epx, tokens) if args.epx else {}
    with one_rank_group() as group:
        rows = run(tokens, M, c, group)
    if args.json:
        append_jsonl(args.json, rows)


def run(tokens, M, c, group):
    """The rows of every T (M tokens per rank at most; c: the C engine's
    figures), on a Buffer over `group`."""
    torch.manual_seed(0)
    dev = torch.device("cuda")
    buf = Buffer(group, low_latency_mode=True, explicitly_destroy=True,
                 num_rdma_bytes=Buffer.get_low_latency_rdma_size_hint(M, H, 1, E))
    rows = []
    print("%6s %12s %12s %12s %12s %14s" % ("tokens", "torch graph", "C graph", "torch eager",
                                          "C launched", "fp8 graph"))
    for T in tokens:
        x = torch.randn(T, H, device=dev).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(E, device=dev)[:K] for _ in range(T)])
        w = torch.rand(T, K, device=dev)
        out = torch.empty(T, H, dtype=torch.bfloat16, device=dev)

        def round_trip(fp8=False):
            _, _, handle, _, _ = buf.low_latency_dispatch(x, ids, M, E, use_fp8=fp8)
            buf.low_latency_combine(None, ids, w, handle, zero_copy=True, out=out)

        r = dict(api="torch", backend="nccl", mode="low-latency", phase="round-trip", ranks=1,
                 tokens=T, hidden=H, topk=K, dtype="bf16", device=torch.cuda.get_device_name(),
                 date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
        graph = timed(round_trip, 8, hold=True)
        eager = timed(round_trip, 10, graph=False)
        fp8 = timed(lambda: round_trip(True), 8, hold=True)
        for g, us, dt in ((True, graph, "bf16"), (False, eager, "bf16"), (True, fp8, "fp8-e4m3")):
            line = dict(r, graph=g, median_us=round(us, 3), dtype=dt,
                        c_engine_us=c.get((T, g)) if dt == "bf16" else None)
            rows.append(line)
        fmt = lambda v: "%12.2f" % v if v is not None else "%12s" % "-"  # noqa: E731
        print("%6d %s %s %s %s %14.2f" % (T, fmt(graph), fmt(c.get((T, True))), fmt(eager),
                                           fmt(c.get((T, False))), fp8))
    buf.destroy()
    return rows


if __name__ == "__main__":
    main()
