"""epx.torch's balanced dispatch (torch.ops.epx.balanced_topk, Mapping.balanced):
on CPU tensors equal to epx.dispatch.balanced_topk (libepx's reference),
traced by torch.compile through its fake implementation, and on CUDA (where
a GPU is present) equal to the CPU. Random cases are seeded; a failure names
its seed."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import epx  # noqa: E402
import epx.torch as et  # noqa: E402
from epx import dispatch  # noqa: E402

SEED = int(os.environ.get("EPX_TEST_SEED", "2707"))
CUDA = torch.cuda.is_available() and et.gpu_available()
need_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device (or no libepx_cuda.so): "
                               "the GPU half runs on the H200 (scripts/gpu_torch.sh)")


def _case(rng):
    """A placement (every expert once, the rest random) and a batch with -1 holes."""
    G = int(rng.integers(1, 9))
    per = int(rng.integers(1, 5))
    P = G * per
    E = int(rng.integers(1, P + 1))
    p2l = np.concatenate([np.arange(E), rng.integers(0, E, P - E)])
    rng.shuffle(p2l)
    lay = epx.Layout.from_map(p2l[None, :], num_gpus=G)
    T, K = int(rng.integers(0, 300)), int(rng.integers(1, min(E, 8) + 1))
    ids = rng.integers(-1, E, size=(T, K))
    return lay, ids


def test_cpu_op_equals_the_reference():
    rng = np.random.default_rng(SEED)
    for it in range(40):
        lay, ids = _case(rng)
        want, split = dispatch.balanced_topk(ids, lay, 0)
        m = et.Mapping.from_layout(lay, 0, mode="balanced")
        for dt in (torch.int32, torch.int64):
            phys, per_slot = et.balanced_topk(torch.from_numpy(ids).to(dt), m)
            assert phys.dtype == torch.int32 and per_slot.dtype == torch.int64
            np.testing.assert_array_equal(phys.numpy(), want, err_msg="seed %d it %d" % (SEED, it))
            np.testing.assert_array_equal(per_slot.numpy(), split.slot_counts)
        # map_ids takes a balanced mapping too
        np.testing.assert_array_equal(et.map_ids(torch.from_numpy(ids), m).numpy(), want)


def test_through_the_dispatcher_and_compile():
    rng = np.random.default_rng(SEED + 1)
    lay, ids = _case(rng)
    m = et.Mapping.from_layout(lay, 0, mode="balanced")
    t = torch.from_numpy(ids)
    want = et.balanced_topk(t, m)
    got = torch.ops.epx.balanced_topk(t, m.replicas, m.num_valid, m.num_physical, m.num_ranks)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    f = torch.compile(lambda x: et.balanced_topk(x, m)[0], backend="eager", fullgraph=True)
    assert torch.equal(f(t), want[0])


def test_bad_inputs_are_named():
    reps = np.array([[0, 1], [2, -1]])
    with pytest.raises(ValueError, match="not a multiple of num_ranks"):
        et.Mapping.balanced(reps, 3, 2)
    m = et.Mapping.balanced(reps, 4, 2)
    with pytest.raises(ValueError, match="Mapping.balanced"):
        et.balanced_topk(torch.zeros((1, 1), dtype=torch.int64), et.Mapping.dynamic(reps, 4))
    with pytest.raises(epx.EpxError, match="topk_ids"):
        et.balanced_topk(torch.tensor([[0, 5]]), m)


@need_cuda
def test_cuda_equals_cpu():
    rng = np.random.default_rng(SEED + 2)
    for it in range(20):
        lay, ids = _case(rng)
        m = et.Mapping.from_layout(lay, 0, mode="balanced")
        want = et.balanced_topk(torch.from_numpy(ids), m)
        got = et.balanced_topk(torch.from_numpy(ids).cuda(), m.to("cuda"))
        for a, b in zip(got, want):
            assert torch.equal(a.cpu(), b), "seed %d it %d" % (SEED, it)
