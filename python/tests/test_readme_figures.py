# Copyright the epx authors. Licensed under the Apache License, Version 2.0;
# you may use this file only in compliance with that license, a copy of which
# is at http://www.apache.org/licenses/LICENSE-2.0. It is distributed "AS IS",
# without warranties or conditions of any kind.
"""scripts/readme_figures.py: the README's EP figures are the JSON lines'
(issue 24: no engine figure typed by hand). The real README against the
committed bench/results/ep_h200.jsonl, then the script's rules on small
made-up files: one run per block, a drifted figure caught, a missing block
named."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "readme_figures.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def test_readme_matches_the_committed_json_lines():
    r = run("--check")
    assert r.returncode == 0, r.stderr


def row(date, tokens, us, mode="low-latency", transport="pointers", floor=None, reps=8):
    r = {"backend": "nccl", "mode": mode, "ranks": 1, "tokens": tokens, "hidden": 7168,
         "topk": 8, "dtype": "bf16", "phase": "round-trip", "median_us": us, "graph": True,
         "date": date}
    if reps:
        r["graph_reps"] = reps
    if floor:
        r["floor"] = floor
    else:
        r["transport"] = transport
    return r


def normal_row(date, tokens, phase, us, copy_pct):
    r = row(date, tokens, us, mode="normal")
    r.update(phase=phase, copy_pct=copy_pct)
    return r


def one_run(date, base):
    """Engine, flag floor, the host and NCCL transports at 1/8/32/128 tokens,
    and normal mode at 1/1024/4096."""
    rows = []
    for i, t in enumerate((1, 8, 32, 128)):
        rows.append(row(date, t, base + i))
        rows.append(row(date, t, base / 2 + i, mode="floor", floor="flag"))
        rows.append(row(date, t, 10 * base + i, transport="host"))
        rows.append(row(date, t, 2 * base + i, transport="nccl"))
    for i, t in enumerate((1, 1024, 4096)):
        rows.append(normal_row(date, t, "dispatch", base + i, 60.0 + i))
        rows.append(normal_row(date, t, "combine", base + i, 90.0 + i))
        rows.append(normal_row(date, t, "round-trip", 3 * base + i, 80.0))
    return rows


def write(tmp_path, rows, readme):
    j = tmp_path / "ep.jsonl"
    j.write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = tmp_path / "README.md"
    m.write_text(readme)
    return str(j), str(m)


README = ("# t\n- bullet:\n  <!-- figures: ll-engine -->\n  <!-- /figures -->\n"
          "  <!-- figures: ll-host -->\n  <!-- /figures -->\n"
          "  <!-- figures: ll-nccl -->\n  <!-- /figures -->\n"
          "  <!-- figures: normal-engine -->\n  <!-- /figures -->\nend\n")


def test_write_then_check_takes_the_newest_run(tmp_path):
    # two runs an hour apart: the figures must all come from the second
    rows = one_run("2026-12-04T01:00:00Z", 20.0) + one_run("2026-12-04T02:00:00Z", 30.0)
    j, m = write(tmp_path, rows, README)
    assert run("--check", "--jsonl", j, "--readme", m).returncode == 1
    assert run("--write", "--jsonl", j, "--readme", m).returncode == 0
    text = open(m).read()
    assert "30.0 / 31.0 / 32.0 / 33.0 µs at 1 / 8 / 32 / 128 tokens" in text
    assert "15.0 / 16.0 / 17.0 / 18.0 µs for two bare kernels" in text
    assert "20.0 / 21.0" not in text  # nothing of the older run
    assert "300.0 / 301.0 / 302.0 / 303.0" in text and "60.0 / 61.0 / 62.0 / 63.0" in text
    flat = " ".join(text.split())
    assert "take 90.0 / 91.0 / 92.0 µs at 1 / 1024 / 4096 tokens" in flat
    assert "the dispatch runs at 62% and the combine at 92%" in flat
    assert text.startswith("# t\n") and text.endswith("end\n")  # the rest untouched
    assert run("--check", "--jsonl", j, "--readme", m).returncode == 0


def test_rows_of_another_token_bound_are_not_the_default_figures(tmp_path):
    # `--token-bound max` beside the default in one run, written after it: the
    # NCCL figures stay the default's (each batch's own bound)
    rows = one_run("2026-12-04T02:00:00Z", 30.0)
    for r in rows:
        if r.get("transport") == "nccl":
            r["token_bound"] = r["tokens"]
    # (at 128 tokens the largest batch's bound is its own: the same setting)
    padded = [dict(r, median_us=r["median_us"] + 500.0, token_bound=128)
              for r in rows if r.get("transport") == "nccl" and r["tokens"] < 128]
    j, m = write(tmp_path, rows + padded, README)
    assert run("--write", "--jsonl", j, "--readme", m).returncode == 0
    text = open(m).read()
    assert "60.0 / 61.0 / 62.0 / 63.0" in text and "560.0" not in text


def test_a_figure_edited_by_hand_is_caught(tmp_path):
    j, m = write(tmp_path, one_run("2026-12-04T02:00:00Z", 30.0), README)
    assert run("--write", "--jsonl", j, "--readme", m).returncode == 0
    text = open(m).read()
    open(m, "w").write(text.replace("31.0", "29.0", 1))
    r = run("--check", "--jsonl", j, "--readme", m)
    assert r.returncode == 1 and "ll-engine" in r.stderr and "--write" in r.stderr


def test_a_missing_block_or_run_is_named(tmp_path):
    j, m = write(tmp_path, one_run("2026-12-04T02:00:00Z", 30.0),
                 README.replace("  <!-- figures: ll-nccl -->\n  <!-- /figures -->\n", ""))
    r = run("--check", "--jsonl", j, "--readme", m)
    assert r.returncode == 1 and "ll-nccl: no block" in r.stderr
    # a run without the floor rows gives the engine block nothing to stand on
    rows = [r_ for r_ in one_run("2026-12-04T02:00:00Z", 30.0) if r_["mode"] != "floor"]
    j, m = write(tmp_path, rows, README)
    r = run("--write", "--jsonl", j, "--readme", m)
    assert r.returncode == 1 and "ll-engine" in r.stderr and "no run" in r.stderr


def test_the_buffer_sentence_comes_from_its_own_run(tmp_path):
    # the Buffer's rows carry the C engine's figure of their own run, an hour
    # after the engine's: the sentence uses the largest gap within that run
    torch_rows = []
    for t, (us, c) in zip((1, 8, 32, 128), ((15.8, 15.7), (17.5, 18.1), (19.3, 20.4),
                                             (29.0, 28.6))):
        r = row("2026-12-04T03:00:00Z", t, us)
        r.update(api="torch", c_engine_us=c)
        torch_rows.append(r)
    rows = one_run("2026-12-04T02:00:00Z", 30.0) + torch_rows
    j, m = write(tmp_path, rows, README)
    assert run("--write", "--jsonl", j, "--readme", m).returncode == 0
    text = " ".join(open(m).read().split())
    assert "30.0 / 31.0 / 32.0 / 33.0 µs" in text  # the engine's run, not the Buffer's
    assert "within 1.1 µs of the C engine's figure measured beside it" in text
    # without Buffer rows there is no such sentence
    j, m = write(tmp_path, one_run("2026-12-04T02:00:00Z", 30.0), README)
    assert run("--write", "--jsonl", j, "--readme", m).returncode == 0
    assert "PyTorch" not in open(m).read()
