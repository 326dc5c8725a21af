"""torch tensors in, torch tensors out (skips cleanly without torch)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import epx  # noqa: E402


def _weight():
    g = torch.Generator().manual_seed(0)
    return torch.rand(4, 32, generator=g) * 100


def test_rebalance_experts_takes_and_returns_tensors():
    w = _weight()
    p2l, l2p, cnt = epx.rebalance_experts(w, 48, 4, 2, 8, True)
    for t in (p2l, l2p, cnt):
        assert isinstance(t, torch.Tensor)
        assert t.dtype == torch.int64 and t.device.type == "cpu"
    assert p2l.shape == (4, 48) and cnt.shape == (4, 32) and l2p.shape[:2] == (4, 32)
    assert l2p.shape[2] == int(cnt.max())
    n_p2l, n_l2p, n_cnt = epx.rebalance_experts(w.numpy(), 48, 4, 2, 8, True)
    np.testing.assert_array_equal(p2l.numpy(), n_p2l)
    np.testing.assert_array_equal(l2p.numpy(), n_l2p)
    np.testing.assert_array_equal(cnt.numpy(), n_cnt)


def test_integer_and_double_weights_are_used_as_float32():
    w = (_weight() * 10).round()
    a = epx.rebalance_experts(w.to(torch.int64), 40, 1, 1, 8, False)
    b = epx.rebalance_experts(w.to(torch.float64), 40, 1, 1, 8, False)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_as_torch_switch():
    w = _weight().numpy()
    out = epx.rebalance_experts(w, 32, 1, 1, 4, False, as_torch=True)
    assert all(isinstance(t, torch.Tensor) for t in out)
    out = epx.rebalance_experts(torch.from_numpy(w), 32, 1, 1, 4, False, as_torch=False)
    assert all(isinstance(t, np.ndarray) for t in out)


def test_layout_from_tensor_and_windows_entry_point():
    w = _weight()
    p2l, _, cnt = epx.rebalance_experts(w, 40, 1, 1, 8, False)
    lay = epx.Layout.from_map(p2l, num_gpus=8)
    np.testing.assert_array_equal(lay.num_valid, cnt.numpy())
    windows = torch.stack([w / 2, w / 2])
    out = epx.rebalance_experts_from_windows(windows, 40, 5, None, 1, "deepseek")
    assert all(isinstance(t, torch.Tensor) for t in out)
    assert torch.equal(out[0], p2l)


def test_vllm_keeps_the_device():
    w = _weight()
    out = epx.vllm.rebalance_experts(w, 40, 1, 1, 8)
    assert all(t.device == w.device for t in out)
    assert out[1].shape == (4, 32, 40 - 32 + 1)


def test_pt_files_written_by_epx_load_in_torch(tmp_path):
    if not epx.has("epx_layout_write_pt"):
        pytest.skip("this libepx has no .pt writer")
    m = torch.arange(12).reshape(1, 12) % 8
    epx.pt.write_mapping_pt(tmp_path / "m.pt", m, num_gpus=4)
    got = torch.load(tmp_path / "m.pt", weights_only=True)
    assert list(got) == ["physical_to_logical_map"]
    assert torch.equal(got["physical_to_logical_map"], m.to(torch.int64))
    torch.save({"logical_count": torch.ones(2, 3, dtype=torch.int32).t()}, tmp_path / "c.pt")
    o = epx.pt.load(tmp_path / "c.pt", as_torch=True)
    assert torch.equal(o["logical_count"], torch.ones(3, 2, dtype=torch.int32))
