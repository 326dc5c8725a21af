"""epx.torch.Buffer's normal mode (DeepEP's dispatch/combine) on a GPU: R in
{1, 2, 3} processes share cuda:0 over a gloo group (CUDA IPC between them),
and each call is checked against the plain-torch definition in
epx.torch._normal: received tokens, local top-k ids and weights, source
indices, rank_prefix_matrix and per-expert counts bit for bit, in bf16 and
fp8, with and without top-k, cached and worst-case dispatches, async
events, and the combine (x and weights summed over ranks) also after another
dispatch came between; through the epx_normal_* kernels and through the
plain-torch steps (EPX_TORCH_NORMAL_KERNELS=0). Skipped without a CUDA GPU or the engine (CI); run on
the H200 (scripts/gpu_check.sh). Every rank builds every rank's inputs from
the seed; a failure names its rank and seed."""
import datetime
import os
import traceback

import pytest

torch = pytest.importorskip("torch")
import epx.torch as et  # noqa: E402
from epx._native import EpxError  # noqa: E402
from epx.torch import _normal as N  # noqa: E402
from epx.torch import buffer as B  # noqa: E402

import test_torch_buffer_gpu as G  # noqa: E402  (its skip rule and port)

pytestmark = G.pytestmark
SEED = G.SEED
# (hidden, top-k, experts per rank, most tokens per rank)
SHAPES = [(256, 4, 3, 40), (7168, 8, 16, 300)]


def inputs(seed, R, H, K, E, M):
    """Every rank's x, top-k ids (distinct, some -1), weights and DeepEP's
    layout; one rank sends no token when R >= 2."""
    g = torch.Generator().manual_seed(seed)
    Ts = [int(torch.randint(1, M + 1, (1,), generator=g)) for _ in range(R)]
    if R >= 2:
        Ts[int(torch.randint(0, R, (1,), generator=g))] = 0
    out = []
    for T in Ts:
        x = torch.randn((T, H), generator=g).to(torch.bfloat16)
        ids = torch.topk(torch.rand((T, E), generator=g), K, dim=1).indices
        ids[torch.rand((T, K), generator=g) < 0.1] = -1
        w = torch.randn((T, K), generator=g)
        lay = et.get_dispatch_layout(ids, E, num_ranks=R)
        out.append(dict(x=x, ids=ids, w=w, per_rank=lay[0], per_expert=lay[2], in_rank=lay[3]))
    return out


def check_shape(buf, rank, R, si, H, K, LPR, M):
    E = max(LPR, -(-K // R)) * R  # room for K distinct experts
    allb = inputs(SEED * 100 + si, R, H, K, E, M)
    mine = {k: v.cuda() for k, v in allb[rank].items()}
    ins = [b["in_rank"] for b in allb]
    for fp8 in (False, True):
        xs = [B.per_token_cast_fp8(b["x"]) if fp8 else b["x"] for b in allb]
        x = xs[rank]
        x = (x[0].cuda(), x[1].cuda().T.contiguous().T) if fp8 else x.cuda()  # column-major
        ref = N.reference_dispatch(xs, ins, [b["ids"] for b in allb], [b["w"] for b in allb],
                                   [b["per_expert"] for b in allb], rank)
        tag = "rank %d of %d, seed %d, shape %d, fp8 %s" % (rank, R, SEED, si, fp8)
        args = dict(num_tokens_per_rank=mine["per_rank"], is_token_in_rank=mine["in_rank"],
                    num_tokens_per_expert=mine["per_expert"], topk_idx=mine["ids"],
                    topk_weights=mine["w"], expert_alignment=8)
        rx, rids, rw, counts, handle, ev = buf.dispatch(x, **args)
        got = (rx[0].view(torch.uint8), rx[1]) if fp8 else (rx.view(torch.int16),)
        want = (ref[0][0].view(torch.uint8), ref[0][1]) if fp8 else (ref[0].view(torch.int16),)
        assert all(torch.equal(a.cpu(), b) for a, b in zip(got, want)), tag + ": x"
        assert torch.equal(rids.cpu(), ref[1]) and torch.equal(rw.cpu(), ref[2]), tag + ": top-k"
        assert torch.equal(handle[3].cpu(), ref[3]), tag + ": recv_src_idx"
        assert torch.equal(handle[0].cpu(), ref[4]), tag + ": rank_prefix_matrix"
        assert counts == [(c + 7) // 8 * 8 for c in ref[5]], tag + ": counts"
        n = ref[3].numel()
        # worst case, async: same tensors padded
        wx, wids, ww, empty, _, ev = buf.dispatch(x, num_worst_tokens=n + 5, async_finish=True,
                                                  **args)
        ev.current_stream_wait()
        wfirst = wx[0] if fp8 else wx
        assert empty == [] and wfirst.shape[0] == n + 5, tag
        assert torch.equal(wfirst[:n].view(torch.uint8 if fp8 else torch.int16).cpu(),
                           got[0].cpu()), tag + ": worst x"
        assert (wids[n:] == -1).all() and torch.equal(wids[:n], rids), tag + ": worst ids"
        # cached, without top-k
        cx = buf.dispatch(x, handle=handle)[0]
        cfirst = cx[0] if fp8 else cx
        assert torch.equal(cfirst.view(torch.uint8 if fp8 else torch.int16), got[0]), tag
        # combine: each rank's "expert output" is its rows scaled by (rank + 1)
        ys = [(N.reference_dispatch([b["x"] for b in allb], ins, None, None,
                                    [b["per_expert"] for b in allb], r)[0].float() * (r + 1))
              .to(torch.bfloat16) for r in range(R)]
        wss = [N.reference_dispatch([b["x"] for b in allb], ins, [b["ids"] for b in allb],
                                    [b["w"] for b in allb], [b["per_expert"] for b in allb],
                                    r)[2] for r in range(R)]
        want_x, want_w = N.reference_combine(ys, wss, ins, rank)
        out, ow, _ = buf.combine(ys[rank].cuda(), handle, topk_weights=wss[rank].cuda())
        assert torch.equal(out.cpu(), want_x), tag + ": combine x"
        assert torch.equal(ow.cpu(), want_w), tag + ": combine weights"
        # bias terms join the fp32 sum before its one rounding
        g = torch.Generator().manual_seed(SEED * 31 + si)
        T = ins[rank].shape[0]
        b0, b1 = (torch.randn((T, H), generator=g).to(torch.bfloat16) for _ in range(2))
        outb, _, _ = buf.combine(ys[rank].cuda(), handle, bias=(b0.cuda(), b1.cuda()))
        sums, _ = N.reference_combine(ys, None, ins, rank, rounded=False)
        assert torch.equal(outb.cpu(), ((sums + b0.float()) + b1.float()).to(torch.bfloat16)), \
            tag + ": combine with bias"
        # num_worst_tokens one below what came (where 2+ came): the last token
        # is left out, normal_health says so once, and with the kernels the
        # combine sums zeros for it (not an earlier batch's rows)
        came = [sum(int(ins[s][:, r].sum()) for s in range(R)) for r in range(R)]
        fit = [max(c - 1, 1) for c in came]
        dx, _, _, _, dh, _ = buf.dispatch(x, num_worst_tokens=fit[rank], **args)
        assert (dx[0] if fp8 else dx).shape[0] == fit[rank], tag
        assert dropped_reported(buf) == (came[rank] > fit[rank]), tag + ": normal_health"
        assert not dropped_reported(buf), tag + ": reported twice"
        if next(iter(buf._engines.values())).rows is not None:
            y_in = torch.zeros((fit[rank], H), dtype=torch.bfloat16)
            y_in[:min(came[rank], fit[rank])] = ys[rank][:fit[rank]]
            kept = [torch.cat([ys[r][:fit[r]], torch.zeros_like(ys[r][fit[r]:])])
                    for r in range(R)]
            dout, _, _ = buf.combine(y_in.cuda(), dh)
            assert torch.equal(dout.cpu(), N.reference_combine(kept, None, ins, rank)[0]), \
                tag + ": combine after tokens were left out"
        # another layout in between: combine still routes as its own dispatch
        other = inputs(SEED * 100 + si + 50, R, H, K, E, M)[rank]
        buf.dispatch(other["x"].cuda(), num_tokens_per_rank=other["per_rank"].cuda(),
                     is_token_in_rank=other["in_rank"].cuda(),
                     num_tokens_per_expert=other["per_expert"].cuda())
        out2, _, _ = buf.combine(ys[rank].cuda(), handle)
        assert torch.equal(out2.cpu(), want_x), tag + ": combine after another dispatch"


def dropped_reported(buf):
    try:
        buf.normal_health()
    except EpxError as e:
        assert "did not fit num_worst_tokens" in str(e), e
        return True
    return False


def run_rank(rank, R, group, kernels):
    os.environ["EPX_TORCH_NORMAL_KERNELS"] = str(kernels)
    buf = B.Buffer(group, num_nvl_bytes=int(1e9), explicitly_destroy=True,
                   timeout_ms=G.TIMEOUT_MS)
    for si, (H, K, LPR, M) in enumerate(SHAPES):
        check_shape(buf, rank, R, si, H, K, LPR, M)
    # the path asked for is the path taken
    assert all((e.rows is not None) == bool(kernels) for e in buf._engines.values()), kernels
    torch.cuda.synchronize()
    buf.destroy()


def _worker(rank, R, port, kernels):
    import torch.distributed as dist
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=R, timeout=datetime.timedelta(seconds=300))
    try:
        run_rank(rank, R, dist.group.WORLD, kernels)
    except BaseException:
        raise AssertionError("rank %d of %d failed (EPX_TORCH_SEED=%d, kernels %d):\n%s" % (
            rank, R, SEED, kernels, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("kernels", [1, 0], ids=["kernels", "torch-steps"])
@pytest.mark.parametrize("R", [1, 2, 3])
def test_normal_mode_matches_the_definition(R, kernels):
    import torch.multiprocessing as mp
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    mp.spawn(_worker, args=(R, G._free_port(), kernels), nprocs=R, join=True)
