#!/usr/bin/env python3
"""epx.torch's ops against their plain-torch formulations, same shapes, same run.

Kimi-K2.5 layer: E = 384 experts on P = 416 slots over G = 8 ranks, K = 8,
H = 7168 bf16; T = 1 .. 16384 tokens. Each op is timed launched from Python
(eager: what a PyTorch engine pays per call, the custom-op dispatch and ctypes
included) and from a CUDA graph (the kernels alone), as bench/dispatch_torch.py
times (median of 31 rounds). The plain-torch side is what an engine writes
without epx, capturable (no host sync):
  dispatch_layout  scatter_add per expert, scatter into is_token_in_rank, sum
  map static       table[ids] with -1 kept
  map weighted     one uniform draw per pair against the expert's cumulative shares
  token_layout     the counts, then both send orders by stable sorts
  permute          x.index_select by the send order's token of each row
  combine          gather y per (token, k), weight, fp32 sum over k, to bf16
Output: a table, and --json FILE appends JSON lines (bench/results/).
"""
import argparse
import datetime
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dispatch_torch import timed  # noqa: E402  (one timing method for both benches)

import epx.torch as et  # noqa: E402

E, P, G, K, H = 384, 416, 8, 8, 7168
PER = P // G


def placement(dev):
    """Expert e on slot e; 32 extra slots replicate random experts."""
    g = torch.Generator().manual_seed(0)
    extra = torch.randint(0, E, (P - E,), generator=g)
    cols = [[e] + [E + i for i in range(P - E) if extra[i] == e] for e in range(E)]
    W = max(len(c) for c in cols)
    reps = torch.tensor([c + [-1] * (W - len(c)) for c in cols], dtype=torch.int32)
    shares = torch.rand(P, generator=g) + 0.5
    return reps.to(dev), shares.to(dev), et.Mapping.weighted(reps, shares, P).to(dev)


def torch_ops(dev, reps, shares, table):
    nv = (reps >= 0).sum(1)
    w = torch.where(reps >= 0, shares[reps.clamp(min=0).long()], 0.0)
    cum = torch.cumsum(w, 1) / w.sum(1, keepdim=True)

    def layout_counts(ids):
        ok = ids >= 0
        flat = torch.where(ok, ids, E).flatten().long()
        per_e = torch.zeros(E + 1, dtype=torch.long, device=dev).scatter_add_(
            0, flat, torch.ones_like(flat))[:E]
        rank = torch.where(ok, ids.long() // (E // G), G)
        in_rank = torch.zeros((ids.shape[0], G + 1), dtype=torch.bool, device=dev)
        in_rank.scatter_(1, rank, True)
        in_rank = in_rank[:, :G]
        return in_rank.sum(0), per_e, in_rank

    def map_static(ids):
        return torch.where(ids >= 0, table[ids.clamp(min=0).long()], -1)

    def map_weighted(ids):
        e = ids.clamp(min=0).long()
        u = torch.rand(ids.shape, device=dev)
        j = (u[..., None] >= cum[e]).sum(-1).clamp(max=nv[e] - 1)
        return torch.where(ids >= 0, reps[e, j], -1)

    def token_layout(phys):
        T = phys.shape[0]
        ok = phys >= 0
        flat = torch.where(ok, phys, P).flatten().long()
        per_slot = torch.zeros(P + 1, dtype=torch.long, device=dev).scatter_add_(
            0, flat, torch.ones_like(flat))[:P]
        rank = torch.where(ok, phys.long() // PER, G)
        in_rank = torch.zeros((T, G + 1), dtype=torch.bool, device=dev)
        in_rank.scatter_(1, rank, True)
        per_rank = in_rank[:, :G].sum(0)
        slot_perm = torch.sort(flat, stable=True).indices
        minslot = torch.full((T, G + 1), P, dtype=torch.long, device=dev)
        minslot.scatter_reduce_(1, rank, torch.where(ok, phys.long(), P), reduce="amin")
        rank_perm = torch.sort(minslot[:, :G].flatten(), stable=True).indices
        return per_slot, in_rank, per_rank, slot_perm, rank_perm

    return layout_counts, map_static, map_weighted, token_layout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="append JSON lines here")
    ap.add_argument("--tokens", default="1,16,128,1024,4096,16384")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    reps, shares, wmap = placement(dev)
    table = reps[:, 0].contiguous()
    smap = et.Mapping.static(table.cpu(), P).to(dev)
    t_layout, t_static, t_weighted, t_token_layout = torch_ops(dev, reps, shares, table)
    rows = []
    for T in (int(t) for t in args.tokens.split(",")):
        ids = torch.stack([torch.randperm(E, device=dev)[:K] for _ in range(min(T, 64))])
        ids = ids.repeat((T + 63) // 64, 1)[:T].to(torch.int32).contiguous()
        phys = et.map_ids(ids, wmap, pass_id=1)
        lay = et.token_layout(phys, P, G)
        x = torch.randn(T, H, device=dev).to(torch.bfloat16)
        w = torch.rand(T, K, device=dev)
        y = et.permute(x, lay, "slot")
        slot_tok = (lay.slot_perm.clamp(min=0) // K).long()
        rank_tok = lay.rank_perm.clamp(min=0).long()
        pos = lay.pair_slot_pos.long()

        def t_combine():
            ok = pos >= 0
            return (y[pos.clamp(min=0)].float() * torch.where(ok, w, 0.0)[..., None]).sum(1) \
                .to(torch.bfloat16)

        pairs = (
            ("dispatch_layout", lambda: et.dispatch_layout(ids, P, G), lambda: t_layout(ids)),
            ("map static", lambda: et.map_ids(ids, smap), lambda: t_static(ids)),
            ("map weighted", lambda: et.map_ids(ids, wmap, pass_id=2), lambda: t_weighted(ids)),
            ("token_layout", lambda: et.token_layout(phys, P, G), lambda: t_token_layout(phys)),
            ("permute rank-order", lambda: et.permute(x, lay, "rank"),
             lambda: x.index_select(0, rank_tok)),
            ("permute slot-order", lambda: et.permute(x, lay, "slot"),
             lambda: x.index_select(0, slot_tok)),
            ("combine slot-order", lambda: et.combine(y, lay.pair_slot_pos, w), t_combine),
        )
        reps_n = 3 if T >= 4096 else 20
        for name, ours, theirs in pairs:
            r = dict(op=name, tokens=T, hidden=H, topk=K, experts=E, slots=P, ranks=G)
            r["epx_eager_us"] = timed(ours, reps_n, graph=False)
            r["torch_eager_us"] = timed(theirs, reps_n, graph=False)
            r["epx_graph_us"] = timed(ours, reps_n)
            r["torch_graph_us"] = timed(theirs, reps_n)
            rows.append(r)
            print(f"{name:20s} T={T:6d}  eager epx {r['epx_eager_us']:9.1f} torch "
                  f"{r['torch_eager_us']:9.1f} ({r['torch_eager_us'] / r['epx_eager_us']:5.1f}x)"
                  f"  graph epx {r['epx_graph_us']:9.1f} torch {r['torch_graph_us']:9.1f} "
                  f"({r['torch_graph_us'] / r['epx_graph_us']:5.1f}x)", flush=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                date=datetime.date.today().isoformat(), bench="bench/torch_ops.py")
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps({**r, **meta}) + "\n")


if __name__ == "__main__":
    main()
