#!/usr/bin/env python3
"""PyTorch's equivalents of bench_dispatch's ops, timed the same way, same shapes.

E = 384, P = 416, G = 8, K = 8, H = 7168 bf16, T in {1, 64, 512, 4096, 16384}.
Ops (what an SGLang / DeepEP-style PyTorch path does):
  static gather   table[topk]                                   (SGLang "static")
  dynamic         l2all[topk, randint % num_valid[topk]]        (SGLang "dynamic")
  layout          bincount per slot, is_token_in_rank, tokens per rank, and the
                  two send orders by stable sorts (DeepEP get_dispatch_layout + sort)
  permute         x.index_select(0, token of each row) into slot order and rank order
  combine         gather y rows per (token, k), weight, sum over k in fp32, to bf16
  copy            a 2 GiB clone (the bandwidth ceiling, read + write)
Each op is timed eagerly and from a CUDA graph of REPS launches (median of 31
replays, per op). Prints a table; --csv FILE writes the rows.
"""
import argparse
import statistics

import torch

E, P, G, K, H = 384, 416, 8, 8, 7168
PER = P // G


def timed(fn, reps, rounds=31, graph=True, hold=False):
    """Median us per call of fn over `rounds` rounds of `reps` calls, CUDA
    events around each round. hold: each round is queued behind a ~100 us
    torch.cuda._sleep, so the events time the GPU's work alone and not the
    host's launch (as `epx bench comm --graph` times its replays)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
        run = g.replay
    else:
        def run():
            for _ in range(reps):
                fn()
    for _ in range(3):
        run()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if hold:
            torch.cuda._sleep(200_000)  # cycles: ~100 us at the H200's clock
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / reps)
    return statistics.median(times)


def one_rank_group():
    """A gloo group of this one process (met through a temporary file), for
    the benches that time epx.torch.Buffer on one GPU; a context manager that
    tears the group down."""
    import contextlib
    import os
    import tempfile

    import torch.distributed as dist

    @contextlib.contextmanager
    def group():
        with tempfile.TemporaryDirectory() as d:
            dist.init_process_group("gloo", init_method="file://" + os.path.join(d, "store"),
                                    rank=0, world_size=1)
            try:
                yield dist.group.WORLD
            finally:
                dist.destroy_process_group()
    return group()


def append_jsonl(path, rows):
    """Append rows (dicts) to the JSON-lines file at path, one a line."""
    import json
    with open(path, "a") as f:
        for line in rows:
            f.write(json.dumps(line) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    rows = []

    n = (2 << 30) // 2
    src = torch.ones(n, dtype=torch.bfloat16, device=dev)
    dst = torch.empty_like(src)
    us = timed(lambda: dst.copy_(src), 2)
    copy_bw = 2 * src.numel() * 2 / (us * 1e-6) / 1e9
    rows.append(("copy_ 2GiB (torch)", 0, us, us, copy_bw))
    del src, dst

    p2l = torch.cat([torch.arange(E), torch.arange(32)])[torch.randperm(P)].to(dev)
    nv = torch.bincount(p2l, minlength=E).to(torch.int32)
    W = int(nv.max())
    l2all = torch.full((E, W), -1, dtype=torch.int32, device=dev)
    order = torch.argsort(p2l, stable=True)
    starts = torch.cumsum(nv, 0) - nv
    col = torch.arange(P, device=dev) - starts[p2l[order]]
    l2all[p2l[order], col] = order.to(torch.int32)
    table = l2all[:, 0].contiguous()

    for T in (1, 64, 512, 4096, 16384):
        topk = torch.stack([torch.randperm(E, device=dev)[:K] for _ in range(min(T, 64))])
        topk = topk.repeat((T + 63) // 64, 1)[:T].to(torch.int32).contiguous()
        reps = 5 if T >= 4096 else 20

        def static():
            return table[topk.long()]

        def dynamic():
            idx = topk.long()
            r = torch.randint(0, 65536, topk.shape, dtype=torch.int32, device=dev) % nv[idx]
            return l2all[idx, r.long()]

        phys = dynamic()

        def layout():
            flat = phys.flatten().long()
            per_slot = torch.zeros(P, dtype=torch.long, device=dev).scatter_add_(
                0, flat, torch.ones_like(flat))  # bincount would sync: not capturable
            rank = phys.long() // PER
            in_rank = torch.zeros((T, G), dtype=torch.bool, device=dev)
            in_rank.scatter_(1, rank, True)
            per_rank = in_rank.sum(0)
            slot_perm = torch.sort(flat, stable=True).indices
            minslot = torch.full((T, G), P, dtype=torch.long, device=dev)
            minslot.scatter_reduce_(1, rank, phys.long(), reduce="amin")
            rank_perm = torch.sort(minslot.flatten(), stable=True).indices
            return per_slot, in_rank, per_rank, slot_perm, rank_perm

        for name, fn in (("static gather", static), ("dynamic", dynamic), ("layout", layout)):
            rows.append((name, T, timed(fn, reps, graph=False), timed(fn, reps), None))

        x = torch.randn(T, H, device=dev).to(torch.bfloat16)
        w = torch.rand(T, K, device=dev)
        _, in_rank, _, slot_perm, rank_perm = layout()
        slot_tok = (slot_perm // K).contiguous()
        nr = int(in_rank.sum())
        rank_tok = (rank_perm[:nr] // G).contiguous()
        y = x.index_select(0, slot_tok)
        pos = torch.empty(T * K, dtype=torch.long, device=dev)
        pos[slot_perm] = torch.arange(T * K, device=dev)
        pos = pos.view(T, K)

        def permute_slot():
            return x.index_select(0, slot_tok)

        def permute_rank():
            return x.index_select(0, rank_tok)

        def combine():
            return (y[pos].float() * w[..., None]).sum(1).to(torch.bfloat16)

        rowb = H * 2
        for name, fn, nrows in (("permute rank-order", permute_rank, nr),
                                ("permute slot-order", permute_slot, T * K),
                                ("combine slot-order", combine, T * K)):
            e, gr = timed(fn, reps, graph=False), timed(fn, reps)
            bw = (T + nrows) * rowb / (gr * 1e-6) / 1e9
            rows.append((name, T, e, gr, bw))

    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"{'op':22s} {'T':>6s} {'eager us':>10s} {'graph us':>10s} {'GB/s':>8s} {'%copy':>7s}")
    for name, T, e, g, bw in rows:
        bws = f"{bw:8.0f}" if bw else f"{'-':>8s}"
        pct = f"{100 * bw / copy_bw:6.1f}%" if bw else f"{'-':>7s}"
        print(f"{name:22s} {T:6d} {e:10.2f} {g:10.2f} {bws} {pct}")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("op,T,eager_us,graph_us,GBps\n")
            for name, T, e, g, bw in rows:
                f.write(f"{name},{T},{e:.3f},{g:.3f},{'' if bw is None else f'{bw:.1f}'}\n")


if __name__ == "__main__":
    main()
