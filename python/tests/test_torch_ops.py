"""epx.torch's ops against plain-torch formulas (CPU, in CI) and the CUDA
kernels against the CPU references (where a GPU is present), incl. a CUDA
graph capture and torch.compile. Random cases are seeded; a failure names
its seed."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import epx  # noqa: E402
import epx.torch as et  # noqa: E402

SEEDS = range(int(os.environ.get("EPX_TORCH_SEEDS", "12")))
CUDA = torch.cuda.is_available() and et.gpu_available()
need_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device (or no libepx_cuda.so): "
                               "the GPU half runs on the H200 (scripts/gpu_torch.sh)")


def _case(seed, device="cpu"):
    """A random batch: topk ids with -1 holes, a placement with replicas."""
    g = torch.Generator().manual_seed(seed)
    G = int(torch.randint(1, 9, (1,), generator=g))
    E = G * int(torch.randint(1, 9, (1,), generator=g))
    P = E + G * int(torch.randint(0, 3, (1,), generator=g))
    T = int(torch.randint(0, 70, (1,), generator=g))
    K = min(int(torch.randint(1, 9, (1,), generator=g)), E)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]) if T else \
        torch.empty((0, K), dtype=torch.int64)
    ids[torch.rand(ids.shape, generator=g) < 0.1] = -1
    return dict(G=G, E=E, P=P, T=T, K=K, ids=ids.to(device), g=g)


# ---- plain-torch formulas: the definitions in include/epx/dispatch.h ------------

def ref_dispatch_layout(ids, E, G):
    valid = ids >= 0
    per_expert = torch.bincount(ids[valid], minlength=E)
    rank = torch.where(valid, ids // (E // G), G)
    in_rank = torch.zeros((ids.shape[0], G + 1), dtype=torch.bool)
    in_rank.scatter_(1, rank, True)
    in_rank = in_rank[:, :G]
    return in_rank.sum(0), per_expert, in_rank


def ref_token_layout(phys, P, G):
    T, K = phys.shape
    per = P // G
    pairs = [(int(phys[t, k]), t, k) for t in range(T) for k in range(K) if phys[t, k] >= 0]
    slot_sorted = sorted(pairs)
    pair_slot_pos = torch.full((T, K), -1, dtype=torch.int32)
    for i, (_, t, k) in enumerate(slot_sorted):
        pair_slot_pos[t, k] = i
    reps = {}  # (rank, token) -> (lowest slot, its lowest k)
    for s, t, k in pairs:
        key = (s // per, t)
        if key not in reps or (s, k) < reps[key]:
            reps[key] = (s, k)
    rank_sorted = sorted(reps.items(), key=lambda kv: (kv[0][0], kv[1][0], kv[0][1]))
    pair_rank_pos = torch.full((T, K), -1, dtype=torch.int32)
    for i, ((_, t), (_, k)) in enumerate(rank_sorted):
        pair_rank_pos[t, k] = i
    tpr = torch.bincount(torch.tensor([g for (g, _) in reps], dtype=torch.int64), minlength=G)
    tps = torch.bincount(torch.tensor([s for s, _, _ in pairs], dtype=torch.int64),
                         minlength=P)
    return dict(tokens_per_rank=tpr, tokens_per_slot=tps, pair_rank_pos=pair_rank_pos,
                pair_slot_pos=pair_slot_pos,
                rank_offsets=torch.cat([torch.zeros(1), tpr.cumsum(0)]).to(torch.int32),
                slot_offsets=torch.cat([torch.zeros(1), tps.cumsum(0)]).to(torch.int32),
                rank_perm=torch.tensor([t for ((_, t), _) in rank_sorted] +
                                       [-1] * (T * K - len(rank_sorted)), dtype=torch.int32),
                slot_perm=torch.tensor([t * K + k for (_, t, k) in slot_sorted] +
                                       [-1] * (T * K - len(slot_sorted)), dtype=torch.int32))


def ref_combine(y, pos, w):
    acc = torch.zeros((pos.shape[0], y.shape[1]), dtype=torch.float64)
    for k in range(pos.shape[1]):
        ok = pos[:, k] >= 0
        wk = torch.ones(pos.shape[0], dtype=torch.float64) if w is None else w[:, k].double()
        acc[ok] += wk[ok, None] * y[pos[ok, k].long()].double()
    return acc


# ---- CPU: against the formulas --------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_dispatch_layout_is_deepeps(seed):
    c = _case(seed)
    got = et.dispatch_layout(c["ids"], c["E"], c["G"])
    want = ref_dispatch_layout(c["ids"], c["E"], c["G"])
    for name, a, b in zip(("tokens_per_rank", "tokens_per_expert", "is_token_in_rank"), got, want):
        assert torch.equal(a, b), "seed %d: %s differs" % (seed, name)
    assert got[0].dtype == torch.int64 and got[2].dtype == torch.bool


@pytest.mark.parametrize("seed", SEEDS)
def test_token_layout_matches_its_definition(seed):
    c = _case(seed)
    phys = torch.where(c["ids"] >= 0, c["ids"] * (c["P"] // c["E"]) if c["P"] % c["E"] == 0
                       else c["ids"], -1).to(torch.int32)
    lay = et.token_layout(phys, c["P"], c["G"])
    want = ref_token_layout(phys, c["P"], c["G"])
    for name, ref in want.items():
        assert torch.equal(getattr(lay, name).to(ref.dtype), ref), "seed %d: %s" % (seed, name)


@pytest.mark.parametrize("seed", SEEDS)
def test_static_mapping_is_a_gather(seed):
    c = _case(seed)
    table = torch.randint(0, c["P"], (c["E"],), generator=c["g"])
    phys = et.map_ids(c["ids"], et.Mapping.static(table, c["P"]))
    want = torch.where(c["ids"] >= 0, table[c["ids"].clamp(min=0)], -1)
    assert torch.equal(phys.long(), want), "seed %d" % seed


def _replicas(c):
    """Expert e on slot e, the extra P - E slots replicate random experts."""
    E, P = c["E"], c["P"]
    extra = torch.randint(0, E, (P - E,), generator=c["g"])
    cols = [[e] + [E + i for i in range(P - E) if extra[i] == e] for e in range(E)]
    W = max(len(r) for r in cols)
    return torch.tensor([r + [-1] * (W - len(r)) for r in cols])


@pytest.mark.parametrize("mode", ["dynamic", "weighted"])
@pytest.mark.parametrize("seed", SEEDS)
def test_random_mappings_pick_replicas_as_the_reference(seed, mode):
    c = _case(seed)
    reps = _replicas(c)
    w = torch.rand(c["P"], generator=c["g"]) + 0.1
    m = et.Mapping.dynamic(reps, c["P"]) if mode == "dynamic" else \
        et.Mapping.weighted(reps, w, c["P"])
    phys = et.map_ids(c["ids"], m, layer=3, pass_id=seed, seed=2**63 + seed)
    for t in range(c["T"]):
        for k in range(c["K"]):
            e = int(c["ids"][t, k])
            if e < 0:
                assert phys[t, k] == -1
            else:
                assert int(phys[t, k]) in reps[e].tolist(), "seed %d: (%d, %d)" % (seed, t, k)
    # the same choices as the numpy binding's dispatch_topk (one C reference) on a Layout
    # holding these replicas in ascending order, as Layout.logical_to_all_physical_map lists them
    pl = torch.full((1, c["P"]), -1, dtype=torch.int64)
    for e in range(c["E"]):
        pl[0, reps[e][reps[e] >= 0]] = e
    layout = epx.Layout.from_map(pl.numpy(), num_gpus=c["G"], num_logical_experts=c["E"])
    if mode == "dynamic":
        mm = et.Mapping.from_layout(layout, 0, mode="dynamic")
        ref = epx.dispatch_topk(c["ids"].numpy(), layout, 0, mode="dynamic", seed=2**63 + seed,
                                pass_id=seed)
        got = et.map_ids(c["ids"], mm, layer=0, pass_id=seed, seed=2**63 + seed)
        assert torch.equal(got.long(), torch.as_tensor(ref)), "seed %d" % seed


def test_weighted_mapping_follows_the_shares():
    reps = torch.tensor([[0, 1, 2]])
    w = torch.tensor([1.0, 2.0, 5.0])
    ids = torch.zeros((20000, 1), dtype=torch.int64)
    phys = et.map_ids(ids, et.Mapping.weighted(reps, w, 3), pass_id=1)
    frac = torch.bincount(phys.flatten().long(), minlength=3).double() / ids.numel()
    assert torch.allclose(frac, w.double() / w.sum(), atol=0.02), frac


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", SEEDS)
def test_permute_and_combine_are_the_formulas(seed, dtype):
    c = _case(seed)
    phys = torch.where(c["ids"] >= 0, c["ids"], -1)
    lay = et.token_layout(phys, c["E"], c["G"])
    H = 1 + int(torch.randint(0, 40, (1,), generator=c["g"]))
    x = torch.randn((c["T"], H), generator=c["g"]).to(dtype)
    for order, pos in (("rank", lay.pair_rank_pos), ("slot", lay.pair_slot_pos)):
        out = et.permute(x, lay, order)
        want = torch.zeros((pos.numel(), H), dtype=dtype)
        ok = pos >= 0
        want[pos[ok].long()] = x[ok.nonzero()[:, 0]]
        assert torch.equal(out, want), "seed %d" % seed
    y = torch.randn((lay.slot_perm.numel(), H), generator=c["g"]).to(dtype)
    w = torch.rand((c["T"], c["K"]), generator=c["g"])
    for weights in (w, None):
        got = et.combine(y, lay.pair_slot_pos, weights)
        assert got.dtype == dtype
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        assert torch.allclose(got.double(), ref_combine(y, lay.pair_slot_pos, weights),
                              rtol=tol, atol=tol), "seed %d" % seed


def test_ops_pass_torch_opcheck():
    c = _case(5)
    phys = torch.where(c["ids"] >= 0, c["ids"], -1).to(torch.int32)
    lay = et.token_layout(phys, c["E"], c["G"])
    x = torch.randn(c["T"], 16)
    m = et.Mapping.static(torch.arange(c["E"]), c["E"])
    for op, args in ((torch.ops.epx.dispatch_layout.default, (c["ids"], c["E"], c["G"])),
                     (torch.ops.epx.token_layout.default, (phys, c["E"], c["G"])),
                     (torch.ops.epx.map_ids.default, (c["ids"], m.mode, m.num_experts,
                                                      m.num_physical, m.table, None, None, None,
                                                      0, 0, 0)),
                     (torch.ops.epx.gather_rows.default, (x, lay.slot_perm, c["K"])),
                     (torch.ops.epx.combine.default, (et.permute(x, lay, "slot"),
                                                      lay.pair_slot_pos, None))):
        torch.library.opcheck(op, args)


def test_the_eager_shortcut_equals_the_registered_op():
    c = _case(11)
    lay = et.token_layout(c["ids"], c["E"], c["G"])
    op = torch.ops.epx.token_layout(c["ids"], c["E"], c["G"])
    assert all(torch.equal(a, b) for a, b in zip(lay, op))
    x = torch.randn(c["T"], 8)
    assert torch.equal(et.permute(x, lay, "slot"),
                       torch.ops.epx.gather_rows(x, lay.slot_perm, c["K"]))
    x.requires_grad_(True)  # grad or a mode sends the call through the dispatcher
    assert not et._ops.eager(x) and et._ops.eager(x.detach())
    with torch._subclasses.fake_tensor.FakeTensorMode():
        assert not et._ops.eager(torch.empty(2))


def test_compiled_graph_equals_eager():
    c = _case(7)

    def step(ids, x):
        lay = et.token_layout(ids, c["E"], c["G"])
        return et.combine(et.permute(x, lay, "slot"), lay.pair_slot_pos)

    x = torch.randn(c["T"], 8)
    eager = step(c["ids"], x)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)(c["ids"], x)
    assert torch.equal(eager, compiled)


def test_errors_name_the_value_and_the_fix():
    ids = torch.tensor([[0, 9]])
    with pytest.raises(epx.EpxError, match="9"):
        et.dispatch_layout(ids, 8, 2)  # the CPU reference checks ids
    with pytest.raises(ValueError, match="multiple of num_ranks"):
        et.dispatch_layout(ids, 9, 2)
    with pytest.raises(ValueError, match="float32 and bfloat16"):
        et.permute(torch.zeros(1, 4, dtype=torch.float16),
                   et.token_layout(torch.zeros(1, 1, dtype=torch.int32), 2, 1))
    with pytest.raises(ValueError, match="'rank' or 'slot'"):
        et.permute(torch.zeros(1, 4), et.token_layout(torch.zeros(1, 1, dtype=torch.int32), 2, 1),
                   "token")
    with pytest.raises(ValueError, match=r"table_row\[1\] is 7"):
        et.Mapping.static([0, 7], 4)
    with pytest.raises(ValueError, match=r"replicas\[1\] has no slot"):
        et.Mapping.dynamic([[0, 1], [-1, -1]], 4)
    with pytest.raises(ValueError, match="int32"):
        torch.ops.epx.map_ids(ids, 1, 2, 4, torch.zeros(2, dtype=torch.int64), None, None, None,
                              0, 0, 0)
    with pytest.raises(ValueError, match="one weight per"):
        et.combine(torch.zeros(2, 4), torch.zeros(1, 2, dtype=torch.int32), torch.zeros(1, 3))
    with pytest.raises(TypeError, match="Mapping"):
        et.map_ids(ids, [0, 1])


def test_layout_errors_name_the_callers_parameters():
    """dispatch_layout, DeepEP's get_dispatch_layout (topk_idx), token_layout
    and map_ids refuse in the names their callers pass, never the C
    reference's own (phys, P, E), and say which counts would divide."""
    ids = torch.tensor([[0, 9]])
    static8 = et.Mapping.static(torch.arange(8), 8)
    cases = [
        (lambda: et.dispatch_layout(ids, 8, 2), epx.EpxError,
         r": topk_ids\[0\]\[1\] = 9 is outside \[-1, 8\): each id is -1 \(none\) or below "
         r"num_experts = 8$"),
        (lambda: torch.ops.epx.dispatch_layout(ids, 8, 2), epx.EpxError,
         r": topk_ids\[0\]\[1\] = 9 .* num_experts = 8$"),
        (lambda: et.get_dispatch_layout(ids, 8, num_ranks=2), epx.EpxError,
         r": topk_idx\[0\]\[1\] = 9 .* num_experts = 8$"),
        (lambda: et.token_layout(ids, 8, 2), epx.EpxError,
         r": phys\[0\]\[1\] = 9 .* num_physical = 8$"),
        (lambda: et.map_ids(ids, static8), epx.EpxError,
         r": topk_ids\[0\]\[1\] = 9 .* below the mapping's num_experts = 8$"),
        (lambda: et.dispatch_layout(ids, 9, 2), ValueError,
         r"^num_experts \(9\) must be a positive multiple of num_ranks \(2\): rank r holds "
         r"experts r\*num_experts/num_ranks \.\. \(r\+1\)\*num_experts/num_ranks - 1; use "
         r"num_experts = 8 or 10$"),
        (lambda: et.get_dispatch_layout(ids, 3, num_ranks=4), ValueError,
         r"^num_experts \(3\) must be .*; use num_experts = 4$"),
        (lambda: et.token_layout(ids, 9, 2), ValueError,
         r"^num_physical \(9\) must be .* holds slots r\*num_physical/num_ranks"),
        (lambda: et.get_dispatch_layout(torch.zeros(3, dtype=torch.int32), 8, num_ranks=2),
         ValueError, r"^topk_idx must have 2 dimensions"),
        (lambda: et.get_dispatch_layout(ids.float(), 8, num_ranks=2), ValueError,
         r"^topk_idx must be int32 or int64"),
        (lambda: et.get_dispatch_layout(torch.tensor([[2**40]]), 8, num_ranks=2), ValueError,
         r"^topk_idx\[0, 0\] = 1099511627776 does not fit in int32"),
        (lambda: et.get_dispatch_layout([[0, 1]], 8, num_ranks=2), TypeError,
         r"^topk_idx must be a torch.Tensor, got list"),
        (lambda: et.dispatch_layout([[0, 1]], 8, 2), TypeError,
         r"^topk_ids must be a torch.Tensor, got list"),
        (lambda: et.token_layout(torch.zeros(3, dtype=torch.int32), 8, 2), ValueError,
         r"^phys must have 2 dimensions"),
    ]
    for call, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            call()


def test_int64_values_outside_int32_are_refused_not_wrapped():
    ids = torch.tensor([[0, 2**32 + 3]])
    with pytest.raises(ValueError, match=r"topk_ids\[0, 1\] = 4294967299"):
        et.dispatch_layout(ids, 8, 2)
    with pytest.raises(ValueError, match=r"table_row\[0\] = 4294967297"):
        et.Mapping.static([2**32 + 1] * 8, 8)
    with pytest.raises(ValueError, match="does not fit in int32"):
        et.combine(torch.zeros(2, 4), torch.tensor([[-2**40]]))


def test_empty_batches_and_nothing_routed():
    empty = torch.empty((0, 4), dtype=torch.int64)
    tpr, tpe, in_rank = et.dispatch_layout(empty, 8, 2)
    assert tpr.tolist() == [0, 0] and tpe.tolist() == [0] * 8 and in_rank.shape == (0, 2)
    lay = et.token_layout(empty, 8, 2)
    assert lay.rank_offsets.tolist() == [0, 0, 0] and lay.slot_perm.numel() == 0
    assert et.permute(torch.empty((0, 16)), lay, "slot").shape == (0, 16)
    # every id -1: the send order is empty and the combine is zeros
    pos = torch.full((3, 2), -1, dtype=torch.int32)
    out = et.combine(torch.empty((0, 8)), pos, torch.ones(3, 2))
    assert torch.equal(out, torch.zeros(3, 8))
    with pytest.raises(ValueError, match="y has no rows"):
        et.combine(torch.empty((0, 8)), torch.tensor([[0, -1]]))


def test_other_devices_are_refused():
    with pytest.raises(ValueError, match="CPU and CUDA tensors, not meta"):
        et.dispatch_layout(torch.zeros((2, 2), dtype=torch.int32, device="meta"), 8, 2)


def test_import_without_torch_says_how_to_install():
    code = "import sys; sys.modules['torch'] = None\ntry:\n import epx.torch\nexcept ImportError " \
           "as e:\n print(e)\nimport epx; print('epx ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "pip install torch" in out.stdout and "epx ok" in out.stdout, out.stdout + out.stderr


# ---- CUDA: the kernels against the CPU references --------------------------------

@need_cuda
@pytest.mark.parametrize("seed", SEEDS)
def test_cuda_equals_cpu(seed):
    c = _case(seed)
    ids_d = c["ids"].cuda()
    for a, b in zip(et.dispatch_layout(ids_d, c["E"], c["G"]),
                    et.dispatch_layout(c["ids"], c["E"], c["G"])):
        assert torch.equal(a.cpu(), b), "seed %d" % seed
    reps = _replicas(c)
    m = et.Mapping.weighted(reps, torch.rand(c["P"], generator=c["g"]) + 0.1, c["P"])
    phys = et.map_ids(c["ids"], m, layer=2, pass_id=seed, seed=seed)
    phys_d = et.map_ids(ids_d, m.to("cuda"), layer=2, pass_id=seed, seed=seed)
    assert torch.equal(phys_d.cpu(), phys), "seed %d" % seed
    lay, lay_d = et.token_layout(phys, c["P"], c["G"]), et.token_layout(phys_d, c["P"], c["G"])
    for name in et.TokenLayout._fields:
        assert torch.equal(getattr(lay_d, name).cpu(), getattr(lay, name)), "seed %d: %s" % (
            seed, name)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn((c["T"], 136), generator=c["g"]).to(dtype)
        w = torch.rand((c["T"], c["K"]), generator=c["g"])
        for order in ("rank", "slot"):
            got = et.permute(x.cuda(), lay_d, order).cpu()
            assert torch.equal(got, et.permute(x, lay, order)), "seed %d: %s" % (seed, order)
        s, s_d = et.permute(x, lay, "slot"), et.permute(x.cuda(), lay_d, "slot")
        o, o_d = et.combine(s, lay.pair_slot_pos, w), et.combine(s_d, lay_d.pair_slot_pos,
                                                                 w.cuda())
        assert torch.equal(o_d.cpu(), o), "seed %d: combine not bitwise equal" % seed


@need_cuda
def test_cuda_empty_batch_and_wide_ids():
    empty = torch.empty((0, 4), dtype=torch.int64, device="cuda")
    for a, b in zip(et.token_layout(empty, 8, 2), et.token_layout(empty.cpu(), 8, 2)):
        assert torch.equal(a.cpu(), b)
    tpr, tpe, _ = et.dispatch_layout(empty, 8, 2)
    assert tpr.tolist() == [0, 0] and tpe.tolist() == [0] * 8
    # an int64 id past int32 counts as out of range (-1) on the GPU, never as another expert
    ids = torch.tensor([[0, 2**32 + 3]], device="cuda")
    tpr, tpe, _ = et.dispatch_layout(ids, 8, 2)
    assert tpe.tolist() == [1, 0, 0, 0, 0, 0, 0, 0]


@need_cuda
def test_cuda_graph_replays_with_new_data():
    c = _case(3)
    E, G = c["E"], c["G"]
    ids = c["ids"].cuda()
    x = torch.randn((c["T"], 256), device="cuda", dtype=torch.bfloat16)

    def step():
        lay = et.token_layout(ids, E, G)
        return et.combine(et.permute(x, lay, "rank"), lay.pair_rank_pos)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for trial in range(3):
        ids.copy_(torch.where(torch.rand(ids.shape, device="cuda") < 0.2, -1, ids))
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, step()), "trial %d" % trial


@need_cuda
def test_cuda_compile_inductor():
    c = _case(9)
    ids = c["ids"].cuda()
    fn = torch.compile(lambda i: et.dispatch_layout(i, c["E"], c["G"]), fullgraph=True)
    for a, b in zip(fn(ids), et.dispatch_layout(c["ids"], c["E"], c["G"])):
        assert torch.equal(a.cpu(), b)


# ---- DeepEP's get_dispatch_layout: its call and its five outputs -----------------

def _deepep_style_reference(ids, E, G):
    """The counts as DeepEP's tests build theirs: torch.int (int32) tensors,
    one count per expert and per rank; a token counts once per rank."""
    per_expert = torch.zeros((E,), dtype=torch.int)
    for i in range(E):
        per_expert[i] = (ids == i).sum()
    rank_of = torch.where(ids >= 0, ids // (E // G), -1)
    in_rank = torch.zeros((ids.shape[0], G), dtype=torch.bool)
    per_rank = torch.empty((G,), dtype=torch.int)
    for r in range(G):
        in_rank[:, r] = (rank_of == r).any(dim=1)
        per_rank[r] = in_rank[:, r].sum()
    return per_rank, per_expert, in_rank


@pytest.mark.parametrize("seed", SEEDS)
def test_get_dispatch_layout_is_deepeps_call(seed):
    """Five outputs as DeepEP returns them, compared the way DeepEP's own
    test compares them (torch.allclose, which refuses int64 against int32)."""
    c = _case(seed)
    for ids in (c["ids"], c["ids"].to(torch.int32)):
        tpr, rdma, tpe, in_rank, event = et.get_dispatch_layout(ids, c["E"], num_ranks=c["G"])
        ref_tpr, ref_tpe, ref_in_rank = _deepep_style_reference(c["ids"], c["E"], c["G"])
        assert torch.allclose(tpr, ref_tpr)
        assert torch.allclose(tpe, ref_tpe)
        assert torch.allclose(in_rank, ref_in_rank)
        assert tpr.dtype == torch.int32 and tpe.dtype == torch.int32
        assert in_rank.dtype == torch.bool and in_rank.shape == (c["T"], c["G"])
        assert rdma is None  # no RDMA ranks
        assert isinstance(event, et.EventOverlap) and event.event is None
        # epx's own dispatch_layout: the same numbers, int64
        own = et.dispatch_layout(ids, c["E"], c["G"])
        assert torch.equal(own[0], tpr.long()) and torch.equal(own[1], tpe.long())
        assert torch.equal(own[2], in_rank)


def test_int64_counts_are_what_deepeps_test_refuses():
    """Why the int32: DeepEP's comparison raises on epx's int64 counts."""
    c = _case(3)
    own = et.dispatch_layout(c["ids"], c["E"], c["G"])[0]
    with pytest.raises(RuntimeError):
        torch.allclose(own, _deepep_style_reference(c["ids"], c["E"], c["G"])[0])


def test_get_dispatch_layout_signature_is_deepeps():
    """DeepEP's Buffer.get_dispatch_layout(self, topk_idx, num_experts,
    previous_event=None, async_finish=False, allocate_on_comm_stream=False)
    (deep_ep/buffers/legacy.py); the function form adds keyword num_ranks."""
    import inspect
    want = [("topk_idx", inspect.Parameter.empty), ("num_experts", inspect.Parameter.empty),
            ("previous_event", None), ("async_finish", False),
            ("allocate_on_comm_stream", False)]
    meth = inspect.signature(et.Buffer.get_dispatch_layout).parameters
    assert [(n, p.default) for n, p in meth.items()] == [("self", inspect.Parameter.empty)] + want
    fn = inspect.signature(et.get_dispatch_layout).parameters
    assert [(n, p.default) for n, p in fn.items()][:5] == want
    assert fn["num_ranks"].kind == inspect.Parameter.KEYWORD_ONLY


def test_buffer_get_dispatch_layout_uses_its_ranks():
    """The Buffer's method passes its group size (no GPU needed here: a
    Buffer object without an engine)."""
    buf = object.__new__(et.Buffer)
    buf.group_size, buf._destroyed = 4, False
    ids = torch.tensor([[0, 5], [7, -1], [2, 3]])
    tpr, rdma, tpe, in_rank, _ = buf.get_dispatch_layout(ids, 8)
    assert tpr.tolist() == [1, 1, 1, 1] and rdma is None and tpe.sum() == 5
    buf._destroyed = True
    with pytest.raises(ValueError, match="destroyed"):
        buf.get_dispatch_layout(ids, 8)


def test_get_dispatch_layout_arguments_refused_with_a_reason():
    ids = torch.tensor([[0, 1]])
    with pytest.raises(ValueError, match="previous_event and async_finish"):
        et.get_dispatch_layout(ids, 4, allocate_on_comm_stream=True, num_ranks=2)
    with pytest.raises(ValueError, match="CUDA"):
        et.get_dispatch_layout(ids, 4, async_finish=True, num_ranks=2)
    with pytest.raises(TypeError, match="torch.cuda.Event"):
        et.get_dispatch_layout(ids, 4, previous_event=et.EventOverlap(object()), num_ranks=2)
    with pytest.raises(TypeError):
        et.get_dispatch_layout(ids, 4)  # num_ranks is needed


@need_cuda
def test_get_dispatch_layout_events_on_cuda():
    c = _case(5, "cuda")
    before = et.Buffer.capture()
    tpr, rdma, tpe, in_rank, event = et.get_dispatch_layout(
        c["ids"], c["E"], previous_event=before, async_finish=True,
        allocate_on_comm_stream=True, num_ranks=c["G"])
    assert isinstance(event.event, torch.cuda.Event)
    event.current_stream_wait()
    ref = _deepep_style_reference(c["ids"].cpu(), c["E"], c["G"])
    assert torch.allclose(tpr.cpu(), ref[0]) and torch.allclose(tpe.cpu(), ref[1])
    assert torch.equal(in_rank.cpu(), ref[2]) and tpr.device.type == "cuda"


def test_permute_names_too_few_rows_of_x():
    """Too few rows read as 'epx_gather_rows: order[1] = 1 is outside ...'."""
    lay = et.token_layout(torch.tensor([[0, 1], [2, 3]]), 8, 2)
    with pytest.raises(ValueError, match=r"x has 1 row, the layout was built for 2 tokens"):
        et.permute(torch.ones(1, 4), lay)
    x = torch.arange(12.).reshape(3, 4)  # a padded buffer: its first 2 rows are read
    assert torch.equal(et.permute(x, lay), et.permute(x[:2], lay))


def test_permute_refuses_a_layout_of_two_batches():
    """Fields of batches with another K gathered other rows without a word
    (slot_perm's pair ids t*K+k read with pair_slot_pos' K)."""
    a = et.token_layout(torch.tensor([[0, 3], [1, 2]], dtype=torch.int32), 4, 2)
    b = et.token_layout(torch.tensor([[0, 3, 1], [1, 2, 0]], dtype=torch.int32), 4, 2)
    x = torch.randn(2, 8)
    for mixed, field in [(a._replace(pair_slot_pos=b.pair_slot_pos), "pair_rank_pos"),
                         (a._replace(slot_perm=b.slot_perm), "slot_perm"),
                         (b._replace(rank_perm=a.rank_perm), "rank_perm")]:
        for order in ("rank", "slot"):
            with pytest.raises(ValueError, match=r"layout\.%s has shape .* different batches"
                               % field):
                et.permute(x, mixed, order)
    assert et.permute(x, a, "slot").shape == (4, 8)  # one batch's own layout is fine


def test_gpu_unavailable_where_torch_sees_no_gpu(monkeypatch):
    """The GPU library alone said True (and no reason) on a machine with no GPU."""
    from epx.torch import _gpu
    monkeypatch.setattr(_gpu, "_lib", object())  # the library loaded
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert et.gpu_available() is False
    assert et.gpu_unavailable_reason().startswith("torch sees no CUDA GPU "
                                                  "(torch.cuda.is_available() is False")


# ---- autograd: permute and combine accept tensors that need grad ----------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(4))
def test_permute_and_combine_backward_are_the_formulas(seed, dtype):
    """A tensor that needs grad went through the op and its output had a
    grad_fn, but backward() raised 'no autograd formula was registered': an
    accepted input that did not work. The gradients are the plain-torch
    formulas' (a gather's is a scatter-add; the combine's are w * grad for y
    and <grad, y row> for the weights)."""
    c = _case(seed)
    lay = et.token_layout(c["ids"], c["E"], c["G"])
    H = 8
    x = torch.randn((c["T"], H), generator=c["g"]).to(dtype).requires_grad_(True)
    w = torch.rand((c["T"], c["K"]), generator=c["g"]).requires_grad_(True)
    for order, pos in (("rank", lay.pair_rank_pos), ("slot", lay.pair_slot_pos)):
        sent = et.permute(x, lay, order)
        y = (sent.float() * 1.5).to(dtype)  # an "expert"
        out = et.combine(y, pos, w)
        g = torch.randn(out.shape, generator=c["g"]).to(dtype)
        gx, gw = torch.autograd.grad(out, (x, w), g)
        # the reference: index the rows, weight them, sum over k (float32)
        xr, wr = x.detach().float().requires_grad_(True), w.detach().requires_grad_(True)
        ok = (pos >= 0).float()
        rows = (xr * 1.5)[:, None, :].expand(-1, c["K"], -1)  # y[pos[t][k]] is token t's row
        ref = (wr[:, :, None] * ok[:, :, None] * rows).sum(1)
        rgx, rgw = torch.autograd.grad(ref, (xr, wr), g.float())
        # rank order sends a token once per rank: its pos is -1 for the other
        # k on that rank, whose weight gets no gradient from that row
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=5e-2)
        assert gx.dtype == dtype and gx.shape == x.shape and gw.dtype == torch.float32
        assert torch.allclose(gx.float(), rgx, **tol), "seed %d %s" % (seed, order)
        assert torch.allclose(gw, rgw, **tol), "seed %d %s" % (seed, order)


def test_backward_needs_no_grad_for_the_positions_and_keeps_weight_dtype():
    lay = et.token_layout(torch.tensor([[0, 3], [1, -1]]), 4, 2)
    y = torch.randn(3, 4, requires_grad=True)
    out = et.combine(y, lay.pair_slot_pos)  # no weights: each is 1
    out.sum().backward()
    want = torch.zeros(3, 4)
    want[lay.pair_slot_pos[lay.pair_slot_pos >= 0].long()] = 1
    assert torch.equal(y.grad, want)
    w = torch.rand(2, 2, dtype=torch.float64, requires_grad=True)
    et.combine(y.detach(), lay.pair_slot_pos, w).sum().backward()
    assert w.grad.dtype == torch.float64 and w.grad[1, 1] == 0


def test_autograd_registrations_pass_opcheck():
    c = _case(3)
    lay = et.token_layout(c["ids"], c["E"], c["G"])
    x = torch.randn(c["T"], 16, requires_grad=True)
    y = torch.randn(lay.slot_perm.numel(), 16, requires_grad=True)
    w = torch.rand(c["T"], c["K"], requires_grad=True)
    torch.library.opcheck(torch.ops.epx.gather_rows.default, (x, lay.slot_perm, c["K"]))
    torch.library.opcheck(torch.ops.epx.combine.default, (y, lay.pair_slot_pos, w))


def test_compiled_backward_equals_eager():
    c = _case(7)

    def step(x, w):
        lay = et.token_layout(c["ids"], c["E"], c["G"])
        return et.combine(et.permute(x, lay, "slot") * 2, lay.pair_slot_pos, w)

    x = torch.randn(c["T"], 8, requires_grad=True)
    w = torch.rand(c["T"], c["K"], requires_grad=True)
    want = torch.autograd.grad(step(x, w).sum(), (x, w))
    f = torch.compile(step, backend="aot_eager", fullgraph=True)
    got = torch.autograd.grad(f(x, w).sum(), (x, w))
    assert all(torch.allclose(a, b) for a, b in zip(want, got))


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated")
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_jit_trace_records_the_ops_not_their_outputs():
    """Under torch.jit.trace the eager shortcut ran the C call directly: the
    trace recorded only the torch.empty of each output, and the traced
    function returned uninitialised memory for new inputs (silently)."""
    def step(ids, x):
        lay = et.token_layout(ids, 8, 2)
        return et.combine(et.permute(x, lay, "slot"), lay.pair_slot_pos)

    ids0 = torch.tensor([[0, 5], [3, -1], [7, 1]])
    ids1 = torch.tensor([[2, 6], [-1, 4], [1, 0]])
    x0, x1 = torch.randn(3, 8), torch.randn(3, 8)
    traced = torch.jit.trace(step, (ids0, x0), check_trace=False)
    assert torch.equal(traced(ids1, x1), step(ids1, x1))


def test_vmap_goes_through_the_op():
    """vmap's batched tensors took the eager shortcut, whose C call read
    their data pointer: 'Cannot access data pointer of Tensor that doesn't
    have storage'. Through the op, torch's fallback runs it per sample."""
    lay = et.token_layout(torch.tensor([[0, 1], [1, -1], [2, 3], [0, 2], [3, -1]]), 4, 2)
    x = torch.randn(3, 5, 4)
    got = torch.vmap(lambda x: et.combine(et.permute(x, lay, "slot"), lay.pair_slot_pos))(x)
    want = torch.stack([et.combine(et.permute(x[i], lay, "slot"), lay.pair_slot_pos)
                        for i in range(3)])
    assert torch.equal(got, want)


# ---- inputs refused by name, never read as other numbers ------------------------

def test_complex_weights_are_refused_not_truncated():
    """combine took complex weights as their real part (torch's cast, a
    warning at most); Mapping.weighted took complex slot weights the same
    way (numpy's), and a str reached numpy's own message."""
    pos = torch.tensor([[0, 1]])
    with pytest.raises(ValueError, match=r"^weights is torch.complex64: .*real"):
        et.combine(torch.ones(2, 4), pos, torch.ones(1, 2, dtype=torch.complex64))
    reps = [[0], [1]]
    with pytest.raises(ValueError, match=r"^slot_weights must be real numbers, got complex"):
        et.Mapping.weighted(reps, torch.ones(2, dtype=torch.complex64), 2)
    with pytest.raises(ValueError, match=r"^slot_weights must be real numbers, got <U3"):
        et.Mapping.weighted(reps, ["abc", "d"], 2)


def test_combine_of_no_rows_refuses_every_position_but_minus_one():
    """With y of 0 rows, pos = -2 gave zeros (only pos >= 0 was looked for),
    where any y with rows refuses it."""
    with pytest.raises(ValueError, match=r"pos\[0\]\[1\] = -2 .* y has no rows"):
        et.combine(torch.empty((0, 8)), torch.tensor([[-1, -2]]))
    with pytest.raises(ValueError, match=r"pos\[0\]\[0\] = 0 .* y has no rows"):
        et.combine(torch.empty((0, 8)), torch.tensor([[0, -1]]))


def test_device_messages_name_the_reference_input():
    """combine and gather_rows said 'but the ids are on cpu' (they take no ids)."""
    with pytest.raises(ValueError, match=r"^weights is on meta but y is on cpu"):
        et.combine(torch.ones(2, 4), torch.tensor([[0, 1]]), torch.ones(1, 2, device="meta"))
    with pytest.raises(ValueError, match=r"^order is on meta but x is on cpu"):
        torch.ops.epx.gather_rows(torch.ones(2, 4), torch.zeros(2, dtype=torch.int32,
                                                              device="meta"), 1)


def test_no_expert_columns_are_refused_in_the_callers_names():
    """A [0][0] batch passed the 'top-k >= 1' check (it had no tokens) and
    the C reference refused it as its own 'phys is [0][0]'."""
    empty = torch.zeros((0, 0), dtype=torch.int64)
    reps = [[0, 2], [1, -1]]
    for call in (lambda: et.dispatch_layout(empty, 2, 1), lambda: et.token_layout(empty, 2, 1),
                 lambda: et.map_ids(empty, et.Mapping.static([0, 1], 2)),
                 lambda: et.balanced_topk(empty, et.Mapping.balanced(reps, 3, 1))):
        with pytest.raises(ValueError, match=r"^(topk_ids|phys) has shape \(0, 0\): .*top-k"):
            call()
    # combine's pos of no tokens and no columns has nothing to combine: zeros
    assert et.combine(torch.empty((0, 4)), torch.zeros((0, 0), dtype=torch.int32)).shape == (0, 4)


def test_map_ids_thresholds_must_match_the_replicas():
    """thresholds [E][W'] with W' != W was read with the replicas' width:
    a narrower table read past its end, a wider one as other numbers."""
    m = et.Mapping.weighted([[0, 2], [1, 3]], torch.ones(4), 4)
    ids = torch.tensor([[0, 1]])
    for th in (m.thresholds[:, :1].contiguous(), torch.zeros(2, 5, dtype=torch.int32)):
        with pytest.raises(ValueError, match=r"thresholds has shape \(2, %d\) but replicas "
                                             r"\(2, 2\)" % th.shape[1]):
            torch.ops.epx.map_ids(ids, m.mode, 2, 4, None, m.replicas, m.num_valid, th, 0, 0, 0)


def test_op_counts_are_range_checked_before_use():
    """torch.ops.epx.* took counts unchecked: per_token 2^40 was refused by
    the C reference as 'per_token = 0' (truncated), num_physical 2^40 tried
    to allocate terabytes."""
    with pytest.raises(ValueError, match=r"per_token = 1099511627776 is outside \[1, "):
        torch.ops.epx.gather_rows(torch.ones(2, 4), torch.tensor([0, 1]), 2**40)
    with pytest.raises(ValueError, match=r"num_physical = 1099511627776 is outside \[1, "):
        torch.ops.epx.token_layout(torch.zeros(1, 1, dtype=torch.int32), 2**40, 2)
    with pytest.raises(ValueError, match=r"num_ranks = 4294967296 is outside \[1, "):
        torch.ops.epx.dispatch_layout(torch.zeros(1, 1, dtype=torch.int32), 8, 2**32)
    m = et.Mapping.balanced([[0], [1]], 2, 1)
    with pytest.raises(ValueError, match=r"num_physical = 1099511627776 is outside \[1, "):
        torch.ops.epx.balanced_topk(torch.zeros(1, 1, dtype=torch.int32), m.replicas,
                                    m.num_valid, 2**40, 1)


def test_fake_implementations_refuse_as_the_real_ones():
    """Under FakeTensorMode (torch.compile's tracing) a 1-D topk_ids failed
    as 'not enough values to unpack', a 1-D x as 'tuple index out of
    range', and a float16 y was given a float16 output the real op refuses."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        ids1 = torch.zeros(5, dtype=torch.int64)
        for call, pattern in (
                (lambda: et.dispatch_layout(ids1, 8, 2), r"^topk_ids must have 2 dimensions"),
                (lambda: et.token_layout(ids1, 8, 2), r"^phys must have 2 dimensions"),
                (lambda: et.dispatch_layout(ids1.float()[:, None], 8, 2),
                 r"^topk_ids must be int32 or int64"),
                (lambda: torch.ops.epx.gather_rows(torch.zeros(5), ids1.int(), 1),
                 r"^x must be \[rows\]\[hidden\]"),
                (lambda: et.combine(torch.zeros(5, 4, dtype=torch.float16),
                                    torch.zeros(5, 2, dtype=torch.int32)),
                 r"^y is torch.float16; epx moves float32 and bfloat16"),
                (lambda: et.combine(torch.zeros(5, 4), torch.zeros(5, 2, dtype=torch.int32),
                                    torch.zeros(5, 3)), r"one weight per"),
                (lambda: torch.ops.epx.map_ids(ids1, 0, 8, 8, None, None, None, None, 0, 0, 0),
                 r"^topk_ids must have 2 dimensions")):
            with pytest.raises(ValueError, match=pattern):
                call()


def test_balanced_topk_names_the_mappings_experts():
    """balanced_topk's refusal named the C reference's (E)."""
    m = et.Mapping.balanced([[0, 2], [1, -1]], 4, 2)
    with pytest.raises(epx.EpxError, match=r": topk_ids\[0\]\[1\] = 5 is outside \[-1, 2\): .* "
                                           r"below the mapping's num_experts = 2$"):
        et.balanced_topk(torch.tensor([[0, 5]]), m)


def test_map_ids_op_counts_and_keys_are_range_checked():
    """torch.ops.epx.map_ids took num_physical 2^40 (truncated to 0 in the
    C spec: 'id 4 is outside [-1, 1099511627776)') and a layer of 2^40
    (silently taken modulo 2^32; map_ids itself refuses it)."""
    ids = torch.tensor([[4]])
    with pytest.raises(ValueError, match=r"^num_physical = 1099511627776 is outside \[1, "):
        torch.ops.epx.map_ids(ids, 0, 8, 2**40, None, None, None, None, 0, 0, 0)
    with pytest.raises(ValueError, match=r"^layer = 1099511627776 is outside \[0, 4294967295\]"):
        torch.ops.epx.map_ids(ids, 0, 8, 8, None, None, None, None, 0, 0, 2**40)
    with pytest.raises(ValueError, match=r"^pass_id = -1 is outside \[0, 4294967295\]"):
        torch.ops.epx.map_ids(ids, 0, 8, 8, None, None, None, None, 0, -1, 0)
