#!/usr/bin/env python3
"""How a placement's node locality shapes per-batch balanced routing: the
balanced split (epx.dispatch.balanced_topk, and the GPU kernel behind
epx.torch.balanced_topk) solves each connected part of the graph "GPUs
joined by an expert with replicas on both" on its own, a part of at most
10 GPUs over its subsets (tens of us a layer on an H200) and a larger one
by max-flows on one GPU thread (hundreds of us to ms; bench/RESULTS.md).
This plans DeepSeek-V3 on 32 GPUs / 4 nodes from the shared trace's windows
0..3 with each `node_local` mode and prints, over the layers, the largest
part's GPUs (median and max) and the plan's balancedness on the next
window: the parts of a placement are the largest a batch can meet (a
batch's parts join only GPUs its tokens' experts span).

  python routing_parts.py [--shared ../shared] [--trace deepseek_v3]
"""
import argparse
import os
import statistics

import numpy as np

import epx


def largest_part(phy2log, num_gpus):
    """The GPUs of the largest connected part of each layer's placement."""
    layers, slots = phy2log.shape
    per = slots // num_gpus
    out = []
    for layer in range(layers):
        root = list(range(num_gpus))

        def find(g):
            while root[g] != g:
                root[g] = root[root[g]]
                g = root[g]
            return g

        gpus_of = {}
        for s in range(slots):
            gpus_of.setdefault(int(phy2log[layer, s]), set()).add(s // per)
        for gpus in gpus_of.values():
            gpus = sorted(gpus)
            for g in gpus[1:]:
                a, b = find(gpus[0]), find(g)
                if a != b:
                    root[max(a, b)] = min(a, b)
        sizes = {}
        for g in range(num_gpus):
            sizes[find(g)] = sizes.get(find(g), 0) + 1
        out.append(max(sizes.values()))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--shared", default=os.path.join(here, "..", "..", "..", "shared"))
    ap.add_argument("--trace", default="deepseek_v3")
    ap.add_argument("--gpus", type=int, default=32)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--redundant", type=int, default=32)
    args = ap.parse_args()
    counts = epx.read_counts(os.path.join(args.shared, "traces", args.trace + ".json"))
    plan_on, next_window = counts[:4].sum(axis=0), counts[4]
    print(f"{args.trace}: {args.gpus} GPUs / {args.nodes} nodes, {args.redundant} redundant; "
          "plan on windows 0..3, balancedness on window 4")
    print(f"{'node_local':<10} {'largest part, median':>21} {'max':>5} {'next window':>12}")
    for mode in ("strict", "default", "off"):
        plan = epx.plan(plan_on, args.gpus, num_redundant=args.redundant, num_nodes=args.nodes,
                        num_groups=args.groups, node_local=mode)
        parts = largest_part(np.asarray(plan.layout.physical_to_logical_map), args.gpus)
        ev = epx.evaluate(plan.layout, next_window)
        print(f"{mode:<10} {statistics.median(parts):>21.0f} {max(parts):>5} "
              f"{ev.balancedness:>12.4f}")


if __name__ == "__main__":
    main()
