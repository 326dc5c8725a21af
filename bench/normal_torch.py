#!/usr/bin/env python3
"""epx.torch.Buffer's normal mode (DeepEP's dispatch/combine) on one rank,
beside a plain copy of the same bytes, same run.

One rank on the one GPU (a gloo group of one process), the Kimi-K2.5 layer:
H = 7168 bf16, top-8 of E = 384 experts, every token to the one rank. Per T,
median us per call over 31 rounds of CUDA events (bench/dispatch_torch.py's
`timed`):
  dispatch        with top-k and weights, as DeepEP's test calls it: the
                  host waits for the counts (DeepEP's does too)
  worst           num_worst_tokens = T: no host wait; also as a CUDA graph
  cached          a dispatch with the handle (no top-k)
  combine         with the weights
  round trip graph  a worst-case dispatch and its combine, captured together
  copy            x.clone(): the bytes of one phase once through memory
The graphs run on a second Buffer: once a dispatch of a shape was captured,
that Buffer's eager combines re-send their columns (docs/EP_TORCH.md), which
the eager columns must not time.
--json FILE appends JSON lines ("api": "torch", "mode": "normal").
"""
import argparse
import datetime
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dispatch_torch import append_jsonl, one_rank_group, timed  # noqa: E402  (one method for the benches)

from epx.torch import Buffer  # noqa: E402

H, K, E = 7168, 8, 384


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1,32,512,4096")
    ap.add_argument("--json", help="append JSON lines here")
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    with one_rank_group() as group:
        rows = run(tokens, group)
    if args.json:
        append_jsonl(args.json, rows)


def run(tokens, group):
    """The rows of every T, on a Buffer over `group`."""
    torch.manual_seed(0)
    dev = torch.device("cuda")
    buf = Buffer(group, num_nvl_bytes=int(4e9), explicitly_destroy=True)
    gbuf = Buffer(group, num_nvl_bytes=int(4e9), explicitly_destroy=True)  # for the graphs
    rows = []
    cols = ("dispatch", "worst", "cached", "combine", "worst graph", "round trip graph", "copy")
    print("%6s" % "tokens" + "".join("%17s" % c for c in cols) + "   (us per call)")
    for T in tokens:
        x = torch.randn(T, H, device=dev).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(E, device=dev)[:K] for _ in range(T)])
        w = torch.rand(T, K, device=dev)
        per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(ids, E)
        args_ = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                     num_tokens_per_expert=per_expert, topk_idx=ids, topk_weights=w)
        rx, _, rw, _, handle, _ = buf.dispatch(x, **args_)

        def round_trip():
            r = gbuf.dispatch(x, num_worst_tokens=T, **args_)
            gbuf.combine(r[0], r[4], topk_weights=r[2])

        got = {
            "dispatch": timed(lambda: buf.dispatch(x, **args_), 1, graph=False),
            "worst": timed(lambda: buf.dispatch(x, num_worst_tokens=T, **args_), 5, graph=False),
            "cached": timed(lambda: buf.dispatch(x, handle=handle), 5, graph=False),
            "combine": timed(lambda: buf.combine(rx, handle, topk_weights=rw), 5, graph=False),
            "worst graph": timed(lambda: gbuf.dispatch(x, num_worst_tokens=T, **args_), 5,
                                 hold=True),
            "round trip graph": timed(round_trip, 5, hold=True),
            "copy": timed(lambda: x.clone(), 5, hold=True),
        }
        print("%6d" % T + "".join("%17.2f" % got[c] for c in cols))
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        for c in cols:
            rows.append(dict(api="torch", mode="normal", call=c, ranks=1, tokens=T, hidden=H,
                             topk=K, experts=E, dtype="bf16", median_us=round(got[c], 3),
                             device=torch.cuda.get_device_name(), date=date))
    buf.destroy()
    gbuf.destroy()
    return rows


if __name__ == "__main__":
    main()
