# Copyright the epx authors. Licensed under the Apache License, Version 2.0;
# you may use this file only in compliance with that license, a copy of which
# is at http://www.apache.org/licenses/LICENSE-2.0. It is distributed "AS IS",
# without warranties or conditions of any kind.
"""scripts/gpu_ab.sh without a GPU: fake builds whose `epx` writes one graph
row per token size, and a fake nvidia-smi. The builds (two to four) alternate
over two rounds, the table lists each build's rounds in order, the checks name
the build they run on, and a wrong CHECK or a NEW3 without NEW2 is a clear
error."""
import os
import stat
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_ab.sh")

FAKE_EPX = """#!/bin/sh
j=""; tr=""
while [ $# -gt 0 ]; do
  case $1 in --json) j=$2; shift;; --transport) tr=$2; shift;; esac; shift
done
n=$(cat "$(dirname "$0")/rounds" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "$(dirname "$0")/rounds"
for t in 1 8; do
  echo "{\\"mode\\": \\"low-latency\\", \\"graph\\": true, \\"tokens\\": $t, \\"phase\\": \\"round-trip\\", \\"median_us\\": @US@.$n, \\"transport\\": \\"$tr\\"}" >> "$j"
done
"""


def executable(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def builds(tmp_path):
    dirs = {}
    for name, us in (("base", 10), ("new", 9), ("new2", 8), ("new3", 7)):
        d = tmp_path / name
        d.mkdir()
        executable(d / "epx", FAKE_EPX.replace("@US@", str(us)))
        dirs[name] = d
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "nvidia-smi", "#!/bin/sh\necho 'FAKE GPU, 0, 0'\n")
    return dirs, str(bin_dir) + os.pathsep + os.environ["PATH"]


def run(tmp_path, path, **env):
    e = dict(os.environ, PATH=path, TRANSPORTS="peer", BUDGET="1", OUT=str(tmp_path / "out"))
    e.update({k: str(v) for k, v in env.items()})
    return subprocess.run(["bash", SCRIPT], env=e, capture_output=True, text=True)


def test_three_builds_side_by_side(tmp_path):
    d, path = builds(tmp_path)
    p = run(tmp_path, path, BASE=d["base"], NEW=d["new"], NEW2=d["new2"])
    assert p.returncode == 0, p.stdout + p.stderr
    assert "graph-replayed us, base -> new -> new2" in p.stdout
    # each build ran once per round: its figures carry the round in their last digit
    assert "peer      1 round-trip 10.10 / 10.20 -> 9.10 / 9.20 -> 8.10 / 8.20" in p.stdout
    assert f"checks on new2 ({d['new2']})" in p.stdout
    assert "SKIPPED test_gpu_ll_peer" in p.stdout


def test_two_builds_and_the_checked_one(tmp_path):
    d, path = builds(tmp_path)
    p = run(tmp_path, path, BASE=d["base"], NEW=d["new"])
    assert p.returncode == 0, p.stdout + p.stderr
    assert "peer      8 round-trip 10.10 / 10.20 -> 9.10 / 9.20" in p.stdout
    assert f"checks on new ({d['new']})" in p.stdout
    p = run(tmp_path, path, BASE=d["base"], NEW=d["new"], CHECK="newest")
    assert p.returncode == 2 and "CHECK=newest: give new, new2 or new3" in p.stderr
    p = run(tmp_path, path, BASE=d["base"], NEW=d["new"], CHECK="new2")
    assert p.returncode != 0 and "CHECK=new2 needs NEW2=DIR" in p.stderr


def test_four_builds_stacked(tmp_path):
    # three changes each on top of the last, judged in one alternated run
    d, path = builds(tmp_path)
    p = run(tmp_path, path, BASE=d["base"], NEW=d["new"], NEW2=d["new2"], NEW3=d["new3"])
    assert p.returncode == 0, p.stdout + p.stderr
    assert "graph-replayed us, base -> new -> new2 -> new3" in p.stdout
    assert "peer      1 round-trip 10.10 / 10.20 -> 9.10 / 9.20 -> 8.10 / 8.20 -> 7.10 / 7.20" \
        in p.stdout
    assert f"checks on new3 ({d['new3']})" in p.stdout
    p = run(tmp_path, path, BASE=d["base"], NEW=d["new"], NEW2=d["new2"], NEW3=d["new3"],
            CHECK="new2")
    assert p.returncode == 0 and f"checks on new2 ({d['new2']})" in p.stdout
    p = run(tmp_path, path, BASE=d["base"], NEW=d["new"], NEW3=d["new3"])
    assert p.returncode == 2 and "NEW3 is the change on top of NEW2's" in p.stderr
