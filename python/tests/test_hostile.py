"""Hostile inputs to the Python API (issue 29): every one refused with an error
naming the argument and the rule, never a silent wrap or a silent default."""
import warnings

import numpy as np
import pytest

import epx


# ---- SGLang release strings: one parser for the CLI and Python -------------

def _layout():
    m = np.array([[0, 1, 2, 3, 0, 0, 1, 2], [3, 2, 1, 0, 3, 3, 3, 2]])
    return epx.Layout.from_map(m, num_gpus=4)


def _w():
    return np.arange(1, 17, dtype=np.float32).reshape(2, 8)


def _every_release_taker(v):
    """Each Python entry point that takes an SGLang release, called with v."""
    lay = _layout()
    l2p = np.array([[[0, 4, 5], [1, 6, -1], [2, 7, -1], [3, -1, -1]]] * 2)
    return [
        lambda: epx.sglang.rebalance_experts(_w(), 12, 1, 1, 4, False, sglang_version=v),
        lambda: epx.plan(_w(), num_gpus=4, num_redundant=4, algorithm="deepseek",
                         sglang_version=v),
        lambda: epx.static_table(lay, sglang_version=v),
        lambda: epx.sglang.compute_logical_to_rank_dispatch_physical_map(
            l2p, 4, 8, 0, sglang_version=v),
        lambda: epx.planner.sglang_eplb_rule(v),
    ]


@pytest.mark.parametrize("v", ["0.5", "0.5.post1", "0.5.2\x00junk", "99.0", "0.5.2 ", "",
                               "0.05.2", "0.5.2rc1", "latest", "0.5.2\u00e9"])
def test_malformed_release_refused(v):
    for f in _every_release_taker(v):
        with pytest.raises(epx.EpxError) as ei:
            f()
        assert ei.value.status == epx.Status.INVALID_ARG
        assert "MAJOR.MINOR.PATCH" in ei.value.message, ei.value.message


@pytest.mark.parametrize("v", ["0.4.0", "0.0.0", "0.5.1", "0.5.1.post3"])
def test_older_release_refused_naming_the_oldest(v):
    for f in _every_release_taker(v):
        with pytest.raises(epx.EpxError) as ei:
            f()
        assert "older than 0.5.2, the oldest release epx reproduces" in ei.value.message


@pytest.mark.parametrize("v", [0.5, 0.52, 5, b"0.5.2", True])
def test_release_not_a_str_refused(v):
    for f in _every_release_taker(v):
        with pytest.raises(TypeError, match="sglang_version must be a str"):
            f()


def test_newer_release_warns_everywhere():
    for f in _every_release_taker("99.0.0"):
        with pytest.warns(UserWarning, match=r"99\.0\.0 is newer than the newest release"):
            f()
    for f in _every_release_taker("0.5.2"):  # the oldest: no word
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            f()
