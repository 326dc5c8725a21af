"""epx.pt: the restricted .pt reader and writers, on shared/golden/pt fixtures
(torch-written) and on round trips."""
import json

import numpy as np
import pytest

import epx
from conftest import PT


@pytest.fixture(autouse=True)
def _needs_pt():
    if not epx.has("epx_pt_load"):
        pytest.skip("this libepx has no .pt reader")


def fixture(name):
    p = PT / name
    if not p.is_file():
        pytest.skip("shared/golden/pt not found")
    return p


def expected(name):
    return json.loads((PT / "expected.json").read_text())[name]


def test_stat_dump_tree():
    o = epx.pt.load(fixture("stat_dump_mixtral.pt"))
    want = expected("stat_dump_mixtral.pt")
    assert set(o) == {"rank", "logical_count", "average_utilization_rate_over_window"}
    assert o["rank"] == want["rank"] and o["average_utilization_rate_over_window"] is None
    assert o["logical_count"].dtype == np.int32
    np.testing.assert_array_equal(o["logical_count"], want["logical_count"])


def test_kimi_dump_and_reader():
    o = epx.pt.load(fixture("stat_dump_kimi_k2.pt"))
    want = expected("stat_dump_kimi_k2.pt")
    assert list(o["logical_count"].shape) == want["shape"]
    assert int(o["logical_count"].sum()) == want["sum"]
    head = want["first_row_layer1"]  # the first entries of batch 0, layer 1
    np.testing.assert_array_equal(o["logical_count"][0, 1, :len(head)], head)
    assert o["average_utilization_rate_over_window"] == want["average_utilization_rate_over_window"]
    c = epx.read_expert_distribution_dump(fixture("stat_dump_kimi_k2.pt"))
    np.testing.assert_array_equal(c, o["logical_count"])


def test_per_pass_dump():
    o = epx.pt.load(fixture("per_pass_rank0.pt"))
    want = expected("per_pass_rank0.pt")
    recs = o["records"]
    assert len(recs) == want["num_records"]
    assert [r["forward_pass_id"] for r in recs] == want["forward_pass_ids"]
    np.testing.assert_array_equal(recs[0]["global_physical_count"],
                                  want["global_physical_count_0"])
    np.testing.assert_array_equal(o["last_physical_to_logical_map"][0],
                                  want["last_physical_to_logical_map_row0"])
    # logical counts: slots folded onto experts through the map, as SGLang does
    c = epx.read_expert_distribution_dump([fixture("per_pass_rank0.pt")])
    m = o["last_physical_to_logical_map"]
    order = np.argsort([r["forward_pass_id"] for r in recs], kind="stable")
    E = int(m.max()) + 1
    for s, i in enumerate(order):
        g = recs[i]["global_physical_count"]
        ref = np.stack([np.bincount(m[l], weights=g[l], minlength=E) for l in range(len(m))])
        np.testing.assert_array_equal(c[s], ref)


def test_strided_tensor_is_honoured():
    o = epx.pt.load(fixture("strided_counts.pt"))
    np.testing.assert_array_equal(o["logical_count"], expected("strided_counts.pt")["logical_count"])


def test_evil_pickle_is_refused():
    with pytest.raises(epx.EpxError) as ei:
        epx.pt.load(fixture("evil_reduce.pt"))
    assert ei.value.status == epx.Status.REFUSED
    assert "system" in ei.value.message and "nothing was executed" in ei.value.message


def test_roundtrips(tmp_path):
    rng = np.random.default_rng(11)
    m = np.stack([rng.permutation(np.r_[np.arange(8), [0, 1, 2, 3]]) for _ in range(3)])
    epx.pt.write_mapping_pt(tmp_path / "m.pt", m, num_gpus=4)
    back = epx.pt.load(tmp_path / "m.pt")
    assert back["physical_to_logical_map"].dtype == np.int64
    np.testing.assert_array_equal(back["physical_to_logical_map"], m)
    np.testing.assert_array_equal(epx.read_mapping(tmp_path / "m.pt"), m)
    c = rng.integers(0, 99, size=(2, 3, 8)).astype(float)
    for dtype in ("int64", "int32", "float32", "float64", "auto"):
        epx.pt.write_counts_pt(tmp_path / "c.pt", c, dtype=dtype)
        np.testing.assert_array_equal(epx.read_counts(tmp_path / "c.pt"), c)
        np.testing.assert_array_equal(
            epx.load_init_expert_location(tmp_path / "c.pt")["logical_count"], c)
    with pytest.raises(ValueError):
        epx.pt.write_counts_pt(tmp_path / "c.pt", c, dtype="int8")


def test_not_a_zip(tmp_path):
    p = tmp_path / "x.pt"
    p.write_bytes(b"not a zip at all")
    with pytest.raises(epx.EpxError) as ei:
        epx.pt.load(p)
    assert ei.value.status in (epx.Status.PARSE, epx.Status.UNSUPPORTED)
