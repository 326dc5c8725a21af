"""Failures surface as epx.EpxError carrying libepx's status and sentence."""
import numpy as np
import pytest

import epx


def test_bad_shape_names_the_fix():
    w = np.ones((2, 16), dtype=np.float32)
    with pytest.raises(epx.EpxError) as ei:
        epx.rebalance_experts(w, 17, 1, 1, 4, False)
    e = ei.value
    assert e.status == epx.Status.SHAPE and e.name == "EPX_ERR_SHAPE"
    assert "17" in e.message and "4" in e.message and "16 or 20" in e.message
    assert str(e).startswith("EPX_ERR_SHAPE: ")


def test_negative_or_nan_weight_is_refused():
    for bad in (-1.0, np.nan, np.inf):
        w = np.ones((2, 8), dtype=np.float32)
        w[1, 3] = bad
        with pytest.raises(epx.EpxError) as ei:
            epx.rebalance_experts(w, 8, 1, 1, 4, False)
        assert ei.value.status == epx.Status.INVALID_ARG
        assert "layer 1, expert 3" in ei.value.message


def test_groups_must_divide_experts():
    w = np.ones((1, 12), dtype=np.float32)
    with pytest.raises(epx.EpxError) as ei:
        epx.rebalance_experts(w, 16, 5, 1, 4, True)
    assert ei.value.status in (epx.Status.SHAPE, epx.Status.INVALID_ARG)
    assert "5" in ei.value.message


def test_invalid_map_names_layer_slot_and_id():
    m = np.array([[0, 1, 2, 3], [0, 1, 9, 3]])
    with pytest.raises(epx.EpxError) as ei:
        epx.Layout.from_map(m, num_gpus=2, num_logical_experts=4)
    e = ei.value
    assert e.status == epx.Status.INVALID_MAP
    assert "9" in e.message and "1" in e.message


def test_expert_without_replica():
    m = np.array([[0, 1, 1, 3]])
    with pytest.raises(epx.EpxError) as ei:
        epx.Layout.from_map(m, num_gpus=2, num_logical_experts=4)
    assert ei.value.status == epx.Status.INVALID_MAP
    assert "2" in ei.value.message


def test_missing_file_is_io_error(tmp_path):
    with pytest.raises(epx.EpxError) as ei:
        epx.read_mapping(tmp_path / "nope.json")
    assert ei.value.status == epx.Status.IO
    assert "nope.json" in ei.value.message


def test_malformed_json_is_parse_error():
    with pytest.raises(epx.EpxError) as ei:
        epx.read_mapping('{"physical_to_logical_map": [[0, 1], [2]')
    assert ei.value.status == epx.Status.PARSE


def test_error_is_an_exception_with_fields():
    e = epx.EpxError(3, "boom")
    assert isinstance(e, Exception)
    assert e.status == epx.Status.PARSE and e.name == "EPX_ERR_PARSE" and e.message == "boom"
    assert epx.EpxError(99, "x").status == 99  # a code newer than this binding


def test_python_side_checks():
    with pytest.raises(ValueError):
        epx.rebalance_experts(np.ones(8), 8, 1, 1, 4, False)  # 1-D weight
    with pytest.raises(ValueError):
        epx.rebalance_experts(np.ones((1, 8)), 8, 1, 1, 4, False, log2phy_width="wide")
    with pytest.raises(ValueError):
        epx.rebalance_experts(np.ones((1, 8)), 8, 1, 1, 4, False, algorithm="greedy")
