"""Files: mappings, counts, init files (JSON and .pt) and the layout handle."""
import json

import numpy as np
import pytest

import epx
from conftest import PT, REPO


def test_mapping_roundtrip(tmp_path):
    rng = np.random.default_rng(7)
    L, E, G, P = 3, 16, 4, 24
    m = np.stack([rng.permutation(np.r_[np.arange(E), rng.integers(0, E, P - E)])
                  for _ in range(L)])
    path = tmp_path / "init.json"
    epx.write_mapping(path, m, num_gpus=G)
    assert list(json.loads(path.read_text())) == ["physical_to_logical_map"]  # the one key
    back = epx.read_mapping(path)
    assert back.dtype == np.int64
    np.testing.assert_array_equal(back, m)
    d = epx.load_init_expert_location(str(path))
    np.testing.assert_array_equal(d["physical_to_logical_map"], m)


def test_counts_roundtrip(tmp_path):
    rng = np.random.default_rng(3)
    c = rng.integers(0, 1000, size=(2, 3, 8)).astype(float)
    path = tmp_path / "counts.json"
    epx.write_counts(path, c)
    np.testing.assert_array_equal(epx.read_counts(path), c)
    epx.write_counts(path, c[0])
    assert np.asarray(json.loads(path.read_text())["logical_count"]).shape == (3, 8)
    np.testing.assert_array_equal(epx.read_counts(path, squeeze=True), c[0])
    assert epx.read_counts(path).shape == (1, 3, 8)


def test_pt_path_written_as_pt_not_json_text(tmp_path):
    """SGLang torch.loads a path ending in .pt: JSON text under that name (which
    replaced a real .pt) failed to load. The writers follow the suffix."""
    torch = pytest.importorskip("torch")
    m = np.tile(np.arange(4), (2, 2))
    path = tmp_path / "init.pt"
    epx.write_mapping(path, m, num_gpus=2)
    epx.write_mapping(str(path), epx.Layout.from_map(m, 2), num_gpus=2)  # over a real .pt
    got = torch.load(path, weights_only=True)["physical_to_logical_map"]
    assert got.dtype == torch.int64
    np.testing.assert_array_equal(got.numpy(), m)
    np.testing.assert_array_equal(epx.read_mapping(path), m)
    c = np.arange(16.).reshape(2, 8)
    cpath = tmp_path / "counts.pt"
    epx.write_counts(cpath, c)
    np.testing.assert_array_equal(torch.load(cpath, weights_only=True)["logical_count"].numpy(), c)
    np.testing.assert_array_equal(epx.read_counts(cpath, squeeze=True), c)


def test_layout_write_json_refuses_a_pt_path_and_leaves_it(tmp_path):
    path = tmp_path / "init.pt"
    epx.write_mapping(path, [[0, 1, 2, 3]], num_gpus=2)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"ending in .pt .*epx.write_mapping\(path, layout\)"):
        epx.Layout.trivial(1, 4, 4, 2).write_json(path)
    assert path.read_bytes() == before
    epx.Layout.trivial(1, 4, 4, 2).write_json(tmp_path / "init.json")  # JSON as named


def test_inline_json():
    np.testing.assert_array_equal(epx.read_mapping('{"physical_to_logical_map": [[1, 0]]}'),
                                  [[1, 0]])
    d = epx.load_init_expert_location('{"logical_count": [[1, 2], [3, 4]], "other": 1}')
    np.testing.assert_array_equal(d["logical_count"], [[[1, 2], [3, 4]]])
    with pytest.raises(epx.EpxError) as ei:
        epx.load_init_expert_location('{"something": 1}')
    assert ei.value.status == epx.Status.PARSE
    assert "neither" in ei.value.message


def test_layout_views_match_sglang_conventions():
    m = np.array([[0, 1, 2, 3, 0, 0], [3, 2, 1, 0, 1, 2]])
    lay = epx.Layout.from_map(m, num_gpus=3)
    assert lay.shape == dict(num_layers=2, num_logical_experts=4, num_physical_experts=6,
                             num_gpus=3, num_nodes=1)
    np.testing.assert_array_equal(lay.physical_to_logical_map, m)
    np.testing.assert_array_equal(lay.num_valid, [[3, 1, 1, 1], [1, 2, 2, 1]])
    l2a = lay.logical_to_all_physical_map()
    assert l2a.shape == (2, 4, 3) and l2a.dtype == np.int64
    np.testing.assert_array_equal(l2a[0, 0], [0, 4, 5])
    np.testing.assert_array_equal(l2a[1, 1], [2, 4, -1])
    assert lay.logical_to_all_physical_map("sglang").shape == (2, 4, 6)  # padded to P
    np.testing.assert_array_equal(
        epx.compute_logical_to_all_physical_map(m, 4), l2a)
    np.testing.assert_array_equal(lay.clone().physical_to_logical_map, m)


def test_trivial_and_init_entry_point(tmp_path):
    t = epx.Layout.trivial(2, 8, 12, 4)
    np.testing.assert_array_equal(t.physical_to_logical_map[1], np.arange(12) % 8)
    lay = epx.init_expert_location("trivial", num_gpus=4, num_layers=2,
                                   num_logical_experts=8, num_redundant=4)
    np.testing.assert_array_equal(lay.physical_to_logical_map, t.physical_to_logical_map)
    path = tmp_path / "m.json"
    t.write_json(path)
    lay = epx.init_expert_location(str(path), num_gpus=4)
    np.testing.assert_array_equal(lay.physical_to_logical_map, t.physical_to_logical_map)
    with pytest.raises(epx.EpxError) as ei:
        epx.init_expert_location(str(path), num_gpus=5)  # 12 slots do not split over 5
    assert ei.value.status == epx.Status.SHAPE


# ---- .pt fixtures (shared/golden/pt), through the .pt reader room ----------

def _pt_or_skip(name):
    p = PT / name
    if not p.is_file():
        pytest.skip("shared/golden/pt not found")
    return p


def _expected():
    return json.loads((PT / "expected.json").read_text())


def _supported(fn, *args):
    """Run fn; skip if this libepx has no .pt reader yet (EPX_ERR_UNSUPPORTED)."""
    try:
        return fn(*args)
    except epx.EpxError as e:
        if e.status == epx.Status.UNSUPPORTED:
            pytest.skip("libepx without the .pt reader: " + e.message)
        raise


def test_pt_init_mapping():
    p = _pt_or_skip("init_mapping.pt")
    m = _supported(epx.read_mapping, p)
    np.testing.assert_array_equal(m, _expected()["init_mapping.pt"]["physical_to_logical_map"])
    d = epx.load_init_expert_location(p)
    assert list(d) == ["physical_to_logical_map"]


@pytest.mark.parametrize("name", ["init_counts_int64.pt", "strided_counts.pt",
                                  "float_counts.pt"])
def test_pt_init_counts(name):
    p = _pt_or_skip(name)
    c = _supported(epx.read_counts, p, True)
    np.testing.assert_allclose(c, np.asarray(_expected()[name]["logical_count"], dtype=float))


def test_pt_refuses_code():
    p = _pt_or_skip("evil_reduce.pt")
    try:
        epx.read_counts(p)
    except epx.EpxError as e:
        if e.status == epx.Status.UNSUPPORTED:
            pytest.skip("libepx without the .pt reader")
        assert e.status in (epx.Status.REFUSED, epx.Status.PARSE)
    else:
        pytest.fail("a pickle that calls os.system was accepted")


def test_model_shapes_and_synthetic_trace():
    k2 = epx.trace.model("Kimi_K2")
    assert (k2["name"], k2["num_layers"], k2["first_k_dense"], k2["num_experts"],
            k2["top_k"]) == ("kimi-k2", 61, 1, 384, 8)
    assert any(m["name"] == "deepseek-v3" for m in epx.trace.models())
    # A HuggingFace config.json (or its folder) names the same model.
    hf = REPO / "tests" / "data" / "hf"
    k25 = epx.trace.model(hf / "kimi-k2.5")
    assert k25 == dict(epx.trace.model("kimi-k2.5"), family="deepseek")
    with pytest.raises(epx.EpxError) as e:
        epx.trace.model(hf / "no-such-model")
    assert "no-such-model" in str(e.value)
    np.testing.assert_array_equal(epx.trace.synth(hf / "mixtral-8x7b", num_windows=1, tokens=64),
                                  epx.trace.synth("mixtral", num_windows=1, tokens=64))
    c = epx.trace.synth("deepseek-v3", num_windows=2, tokens=1000, seed=4)
    assert c.shape == (2, 61, 256)
    assert (c[:, :3] == 0).all()  # dense layers
    np.testing.assert_array_equal(c[:, 3:].sum(axis=2), 1000 * 8)  # T * top_k per row
    np.testing.assert_array_equal(c, epx.trace.synth("deepseek-v3", 2, 1000, seed=4))
    with pytest.raises(epx.EpxError) as ei:
        epx.trace.model("gpt-17")
    assert ei.value.status == epx.Status.INVALID_ARG and "kimi-k2" in ei.value.message


def test_synth_refuses_a_shift_that_never_happens():
    """A shift at or past the last window, or a shift share with no shift,
    changed nothing and was taken without a word."""
    with pytest.raises(ValueError, match=r"shift_window = 99 is outside \[0, 1\]"):
        epx.trace.synth("mixtral", num_windows=2, tokens=64, shift_window=99)
    with pytest.raises(ValueError, match=r"shift_window = 2 is outside \[0, 1\]"):
        epx.trace.synth("mixtral", num_windows=2, tokens=64, shift_window=2)
    with pytest.raises(ValueError, match="shift_layers=0.9 applies to a shift only"):
        epx.trace.synth("mixtral", num_windows=2, tokens=64, shift_layers=0.9)
    a = epx.trace.synth("mixtral", num_windows=3, tokens=640, shift_window=2, shift_layers=1.0)
    b = epx.trace.synth("mixtral", num_windows=3, tokens=640)
    np.testing.assert_array_equal(a[:2], b[:2])
    assert not np.array_equal(a[2], b[2])  # the last window shifted
