#!/usr/bin/env python3
"""A MoE layer run with expert parallelism through epx.torch.Buffer, checked
against the same layer computed densely in one process.

    router -> top-k experts -> Buffer.low_latency_dispatch -> each local
    expert's MLP on its rows (recv_x[e, :recv_count[e]]) ->
    Buffer.low_latency_combine -> the layer's output

This is how a serving engine swaps DeepEP for epx: the calls below are
DeepEP's low-latency calls; only the import differs (`from epx.torch import
Buffer` instead of `from deep_ep import Buffer`), and epx's buffer also takes a
gloo group, so several processes can share one GPU.

    python moe_layer_ep.py --ranks 2            # 2 processes on cuda:0, epx.torch.Buffer
    python moe_layer_ep.py --ranks 4 --emulate  # one CPU process: every rank's exchange by
                                                # the plain-torch definition the engine is
                                                # tested against (no GPU needed)

Prints the largest difference from the dense layer relative to its largest
value, and exits 1 when it is above the bf16 tolerance.
"""
import argparse
import os
import socket
import sys

import torch
import torch.nn.functional as F

TOLERANCE = 2e-2  # bf16 activations, fp32 math: relative to the output's scale


class Layer:
    """A router and E SwiGLU experts (fp32 weights, bf16 activations)."""

    def __init__(self, seed, experts, hidden, inter, topk):
        g = torch.Generator().manual_seed(seed)
        self.E, self.H, self.I, self.K = experts, hidden, inter, topk
        self.router = torch.randn((hidden, experts), generator=g) / hidden ** 0.5
        self.gate_up = torch.randn((experts, 2 * inter, hidden), generator=g) / hidden ** 0.5
        self.down = torch.randn((experts, hidden, inter), generator=g) / inter ** 0.5

    def to(self, device):
        for name in ("router", "gate_up", "down"):
            setattr(self, name, getattr(self, name).to(device))
        return self

    def route(self, x):
        """top-k expert ids (int64) and their normalised weights (fp32)."""
        probs = torch.softmax(x.float() @ self.router, dim=-1)
        w, ids = probs.topk(self.K, dim=-1)
        return ids, (w / w.sum(-1, keepdim=True)).float()

    def expert(self, e, rows):
        """Expert e's MLP on rows [n][H] bf16 -> bf16."""
        h = rows.float() @ self.gate_up[e].T
        gate, up = h.split(self.I, dim=-1)
        return ((F.silu(gate) * up) @ self.down[e].T).to(torch.bfloat16)

    def dense(self, x):
        """The layer in one process: each token's experts, weighted."""
        ids, w = self.route(x)
        out = torch.zeros((x.shape[0], self.H))
        for t in range(x.shape[0]):
            for k in range(self.K):
                y = self.expert(int(ids[t, k]), x[t:t + 1]).float()[0]
                out[t] += w[t, k] * y
        return out.to(torch.bfloat16)


def batches(args):
    """Every rank's tokens (each rank derives all of them from the seed)."""
    g = torch.Generator().manual_seed(args.seed + 1)
    return [torch.randn((args.tokens - r % 2, args.hidden), generator=g).to(torch.bfloat16)
            for r in range(args.ranks)]


def run_experts(layer, rank, recv_x, recv_count):
    """Each local expert on its rows, in the dispatch's layout. A serving
    engine runs one grouped GEMM here (masked by recv_count)."""
    L = recv_x.shape[0]
    y = torch.zeros_like(recv_x)
    counts = recv_count.tolist()
    for e in range(L):
        if counts[e]:
            y[e, :counts[e]] = layer.expert(rank * L + e, recv_x[e, :counts[e]])
    return y


def relative_error(got, want):
    scale = want.float().abs().max().clamp_min(1e-6)
    return float((got.float().cpu() - want.float()).abs().max() / scale)


def emulate(args, layer, xs):
    """All ranks in this process: the exchange by its definition
    (epx.torch.buffer.reference_dispatch / reference_combine)."""
    from epx.torch.buffer import reference_combine, reference_dispatch
    R, E, M = args.ranks, args.experts, args.tokens
    L = E // R
    routes = [layer.route(x) for x in xs]
    ids_all = [ids for ids, _ in routes]
    ys, ranges = [], []
    for r in range(R):
        recv_x, count, _, layout = reference_dispatch(xs, ids_all, r, E, M)
        ys.append(run_experts(layer, r, recv_x, count))
        ranges.append(layout)
    worst = 0.0
    for r in range(R):
        ids, w = routes[r]
        seen = {}

        def row_of(t, k, ids=ids, r=r, seen=seen):
            # the rows of (rank r, expert e) are its (t, k) in order, from begin
            e = int(ids[t, k])
            owner, le = e // L, e % L
            n = seen.get((t, k))
            if n is None:
                n = int((ids[:t] == e).sum()) + int((ids[t, :k] == e).sum())
                seen[(t, k)] = n
            begin = int(ranges[owner][le, r]) >> 32
            return ys[owner][le, begin + n]

        out = reference_combine(row_of, ids, w, hidden=args.hidden)
        worst = max(worst, relative_error(out, layer.dense(xs[r])))
    return worst


def worker(rank, args, port, result):
    import torch.distributed as dist
    from epx.torch import Buffer
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=args.ranks)
    torch.cuda.set_device(0)
    layer = Layer(args.seed, args.experts, args.hidden, args.inter, args.topk).to("cuda")
    x = batches(args)[rank].cuda()
    M, E = args.tokens, args.experts
    buf = Buffer(dist.group.WORLD, num_rdma_bytes=Buffer.get_low_latency_rdma_size_hint(
        M, args.hidden, args.ranks, E), low_latency_mode=True, explicitly_destroy=True,
        timeout_ms=60000)
    ids, w = layer.route(x)
    recv_x, recv_count, handle, _, _ = buf.low_latency_dispatch(x, ids, M, E, use_fp8=False)
    y = run_experts(layer, rank, recv_x, recv_count)
    out, _, _ = buf.low_latency_combine(y, ids, w, handle)
    torch.cuda.synchronize()
    err = relative_error(out, layer.to("cpu").dense(x.cpu()))
    buf.destroy()
    dist.destroy_process_group()
    result[rank] = err


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=8, help="tokens per rank (max tokens)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--inter", type=int, default=128)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--emulate", action="store_true",
                    help="one CPU process, the exchange by its plain-torch definition")
    a = ap.parse_args(argv)
    if a.ranks < 1 or a.experts % a.ranks or a.topk > a.experts or a.tokens < 2:
        ap.error("need ranks >= 1 dividing experts (%d), topk <= experts, tokens >= 2"
                 % a.experts)
    layer = Layer(a.seed, a.experts, a.hidden, a.inter, a.topk)
    if a.emulate:
        worst = emulate(a, layer, batches(a))
    else:
        import torch.multiprocessing as mp
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        result = mp.Manager().dict()
        mp.spawn(worker, args=(a, port, result), nprocs=a.ranks)
        worst = max(result.values())
    print("%d ranks (%s): largest difference from the dense layer %.3g of its scale "
          "(tolerance %.0e)" % (a.ranks, "emulated" if a.emulate else "epx.torch.Buffer",
                                worst, TOLERANCE))
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    sys.exit(main(sys.argv[1:]))
