# Copyright the epx authors. Licensed under the Apache License, Version 2.0;
# you may use this file only in compliance with that license, a copy of which
# is at http://www.apache.org/licenses/LICENSE-2.0. It is distributed "AS IS",
# without warranties or conditions of any kind.
"""tools/deepep_ll_check.py's verdict: a run that exits 0 but shows no
checks must not read PASS (DeepEP's --shrink-test prints nothing of its
own, so the shim's per-rank call counts are the evidence)."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location(
    "deepep_ll_check", os.path.join(ROOT, "tools", "deepep_ll_check.py"))
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)


def calls_line(r, d, c, k, q):
    return "[rank %d] %s low_latency_dispatch=%d low_latency_combine=%d " \
           "clean_low_latency_buffer=%d low_latency_query_mask_buffer=%d" % (
               r, check.CALLS_LINE, d, c, k, q)


SHRINK_STOPS = ["Rank 1 failed when first calling dispatch communication API, exit...",
                "Rank 3 failed when first calling combine communication API, exit..."]


def test_shrink_pass_needs_survivors_calls():
    lines = SHRINK_STOPS + [calls_line(0, 30, 20, 10, 40), calls_line(2, 30, 20, 10, 40),
                            calls_line(1, 0, 0, 0, 0), calls_line(3, 2, 0, 0, 1)]
    assert check.summarise(lines, 0, 4, ["--shrink-test"]) == "PASS"


def test_shrink_without_counts_fails():
    # the run before the counts existed: exit 0, nothing shown
    assert check.summarise(SHRINK_STOPS, 0, 4, ["--shrink-test"]).startswith("FAIL")


def test_shrink_survivors_disagree_or_skip_masks():
    lines = SHRINK_STOPS + [calls_line(0, 30, 20, 10, 40), calls_line(2, 29, 20, 10, 40),
                            calls_line(1, 0, 0, 0, 0), calls_line(3, 2, 0, 0, 1)]
    assert check.summarise(lines, 0, 4, ["--shrink-test"]).startswith("FAIL")
    lines = SHRINK_STOPS + [calls_line(r, 30, 20, 10, 0) for r in (0, 2)] + \
        [calls_line(1, 0, 0, 0, 0), calls_line(3, 2, 0, 0, 1)]
    assert check.summarise(lines, 0, 4, ["--shrink-test"]).startswith("FAIL")


def test_stopped_rank_that_went_on_fails():
    lines = SHRINK_STOPS + [calls_line(r, 30, 20, 10, 40) for r in range(4)]
    assert check.summarise(lines, 0, 4, ["--shrink-test"]) == "FAIL (a stopped rank went on)"


def test_plain_run_needs_every_bench_line():
    bench = "[rank %d] Dispatch + combine bandwidth: 1.00 GB/s, avg_t=1.00 us"
    assert check.summarise([bench % 0, bench % 1], 0, 2, []) == "PASS"
    assert check.summarise([bench % 0], 0, 2, []).startswith("FAIL")
    assert check.summarise([bench % 0, bench % 1], 124, 2, []) == "TIMEOUT"
    assert check.summarise([bench % 0, bench % 1], 1, 2, []) == "FAIL"


def test_ranks_printing_at_once():
    # Seen on the H200: one rank's call counts ran into the other's line.
    joined = calls_line(1, 246, 254, 0, 0) + calls_line(0, 246, 254, 0, 0)
    assert check.calls_of([joined], 0)["low_latency_dispatch"] == 246
    assert check.calls_of([joined], 1) == {"low_latency_dispatch": 246,
                                           "low_latency_combine": 254,
                                           "clean_low_latency_buffer": 0,
                                           "low_latency_query_mask_buffer": 0}
    bench = "[rank %d] Dispatch + combine bandwidth: 4.89 GB/s, avg_t=4505.29 us"
    assert check.summarise([bench % 0, bench % 1, joined], 0, 2, []) == "PASS"


def test_intranode_pass_needs_checks_and_the_tuning_after_them():
    passed = "[testing] Running with BF16, with top-k (async=False, previous=False) ... passed"
    best = "[tuning] Best combine: SMs 24, NVL chunk 1: 10.00 GB/s (NVL), t: 100.00 us"
    assert check.summarise_intranode([passed, best], 0, 2, []) == "PASS"
    assert check.summarise_intranode([passed], 0, 2, []).startswith("FAIL")  # stopped early
    assert check.summarise_intranode([best], 0, 2, []).startswith("FAIL")  # no check ran
    assert check.summarise_intranode([passed, best], 1, 2, []) == "FAIL"
    assert check.summarise_intranode([], 124, 2, []) == "TIMEOUT"


def test_a_report_run_into_another_ranks_line_counts():
    # seen on the H200: rank 0's bench line printed into rank 1's
    lines = ["[rank 1] Dispatch + combine bandwidth: 4.94 GB/s, max_t=4515.23 us"
             "[rank 0] Dispatch + combine bandwidth: 4.89 GB/s, avg_t=4507.64 us"]
    assert check.summarise(lines, 0, 2, []) == "PASS"
    rank1_only = ["[rank 1] Dispatch + combine bandwidth: 4.94 GB/s, max_t=4515.23 us"]
    assert check.summarise(rank1_only, 0, 2, []).startswith("FAIL")


def test_own_gpus_leaves_the_test_alone():
    assert check.shares_one_gpu({})
    assert check.shares_one_gpu({check.OWN_GPUS: "0"})
    assert not check.shares_one_gpu({check.OWN_GPUS: "1"})


def test_own_gpus_needs_a_gpu_per_process(tmp_path, monkeypatch, capsys):
    (tmp_path / "tests" / "legacy").mkdir(parents=True)
    (tmp_path / "tests" / "legacy" / "test_low_latency.py").write_text("")
    (tmp_path / "deep_ep" / "utils").mkdir(parents=True)
    monkeypatch.setattr(check, "visible_gpus", lambda: 1)
    try:
        check.main(["--deepep", str(tmp_path), "--own-gpus", "--num-processes", "2"])
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("--own-gpus with more processes than GPUs was not refused")
    err = capsys.readouterr().err
    assert "needs 2 GPUs; 1 are visible" in err and "--num-processes 1 or fewer" in err
