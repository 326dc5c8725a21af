# Copyright the epx authors. Licensed under the Apache License, Version 2.0;
# you may use this file only in compliance with that license, a copy of which
# is at http://www.apache.org/licenses/LICENSE-2.0. It is distributed "AS IS",
# without warranties or conditions of any kind.
"""scripts/ab_rows.py on a canned gpu_ab.sh folder: only graph rows are kept,
each cell's rounds are numbered in the order they came, and the builds and
notes say which side timed them."""
import io
import json
import os
import subprocess
import sys
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "ab_rows.py")


def row(tokens, phase, us, graph=True, mode="low-latency", floor=None, transport="pointers"):
    r = {"mode": mode, "tokens": tokens, "phase": phase, "median_us": us, "graph": graph,
         "transport": transport}
    if floor:
        r["floor"] = floor
    return r


def write(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def tar_of(path, members):
    """A .tgz at path holding {name inside the archive: bytes}."""
    with tarfile.open(path, "w:gz") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


def ab_rows(src, out):
    """ab_rows.py on src into out (base a, new b, note c), its output kept."""
    return subprocess.run([sys.executable, SCRIPT, str(src), str(out), "--base", "a", "--new",
                           "b", "--note", "c"], capture_output=True, text=True)


def test_rounds_builds_and_notes(tmp_path):
    one_round = lambda us: [row(1, "dispatch", us), row(1, "dispatch", 99.0, graph=False),
                            row(1, "round-trip", 2 * us),
                            row(1, "round-trip", 9.0, mode="floor", floor="flag", transport=None)]
    write(tmp_path / "ab_peer_base.jsonl", one_round(7.0) + one_round(7.1))
    write(tmp_path / "ab_peer_new.jsonl", one_round(6.0) + one_round(6.1))
    out = tmp_path / "results.jsonl"
    out.write_text('{"kept": true}\n')
    subprocess.run([sys.executable, SCRIPT, str(tmp_path), str(out), "--base", "aaa",
                    "--new", "bbb", "--note", "the change"], check=True)
    got = [json.loads(l) for l in out.read_text().splitlines()]
    assert got[0] == {"kept": True}
    got = got[1:]
    assert len(got) == 12 and all(r["graph"] for r in got)
    disp = [(r["build"], r["round"], r["median_us"]) for r in got if r["phase"] == "dispatch"]
    assert disp == [("aaa", 1, 7.0), ("aaa", 2, 7.1), ("bbb", 1, 6.0), ("bbb", 2, 6.1)]
    floors = [r["round"] for r in got if r["mode"] == "floor"]
    assert floors == [1, 2, 1, 2]
    assert {r["note"] for r in got if r["build"] == "bbb"} == {"peer transport, the change"}
    assert {r["note"] for r in got if r["build"] == "aaa"} == {"peer transport, the base, beside bbb"}


def test_empty_folder_is_a_clear_error(tmp_path):
    p = ab_rows(tmp_path, tmp_path / "r.jsonl")
    assert p.returncode != 0 and "no ab_*_*.jsonl" in p.stderr
    assert not (tmp_path / "r.jsonl").exists()


def test_third_build(tmp_path):
    write(tmp_path / "ab_host_base.jsonl", [row(8, "combine", 5.0)])
    write(tmp_path / "ab_host_new.jsonl", [row(8, "combine", 4.0)])
    write(tmp_path / "ab_host_new2.jsonl", [row(8, "combine", 3.0)])
    out = tmp_path / "r.jsonl"
    args = [sys.executable, SCRIPT, str(tmp_path), str(out), "--base", "a", "--new", "b",
            "--note", "one change"]
    p = subprocess.run(args, capture_output=True, text=True)
    assert p.returncode != 0 and "--new2" in p.stderr and not out.exists()
    p = subprocess.run(args + ["--new2", "c"], capture_output=True, text=True)
    assert p.returncode != 0 and "go together" in p.stderr
    subprocess.run(args + ["--new2", "c", "--note2", "both changes"], check=True)
    got = {r["build"]: (r["median_us"], r["note"])
           for r in map(json.loads, out.read_text().splitlines())}
    assert got == {"a": (5.0, "host transport, the base, beside b"),
                   "b": (4.0, "host transport, one change"),
                   "c": (3.0, "host transport, both changes")}


def test_fourth_build(tmp_path):
    for who, us in (("base", 5.0), ("new", 4.0), ("new2", 3.0), ("new3", 2.0)):
        write(tmp_path / f"ab_peer_{who}.jsonl", [row(1, "dispatch", us)])
    out = tmp_path / "r.jsonl"
    args = [sys.executable, SCRIPT, str(tmp_path), str(out), "--base", "a", "--new", "b",
            "--note", "one", "--new2", "c", "--note2", "two"]
    p = subprocess.run(args, capture_output=True, text=True)
    assert p.returncode != 0 and "fourth build" in p.stderr and "--new3" in p.stderr
    assert not out.exists()
    p = subprocess.run(args + ["--new3", "d"], capture_output=True, text=True)
    assert p.returncode != 0 and "--new3 and --note3 go together" in p.stderr
    p = subprocess.run(args[:-4] + ["--new3", "d", "--note3", "three"], capture_output=True,
                       text=True)
    assert p.returncode != 0 and "give --new2 too" in p.stderr
    subprocess.run(args + ["--new3", "d", "--note3", "three"], check=True)
    got = {r["build"]: (r["median_us"], r["note"])
           for r in map(json.loads, out.read_text().splitlines())}
    assert got == {"a": (5.0, "peer transport, the base, beside b"),
                   "b": (4.0, "peer transport, one"), "c": (3.0, "peer transport, two"),
                   "d": (2.0, "peer transport, three")}


def test_packed_archive(tmp_path):
    """gpu_ab.sh's PACK=1 leaves ab.tgz; the rows come out of it as from the folder."""
    src = tmp_path / "src"
    src.mkdir()
    write(src / "ab_peer_base.jsonl", [row(1, "dispatch", 7.0)])
    write(src / "ab_peer_new.jsonl", [row(1, "dispatch", 6.0)])
    (src / "ab_peer_new_1.log").write_text("a log\n")
    with tarfile.open(tmp_path / "ab.tgz", "w:gz") as t:
        for f in sorted(src.iterdir()):
            t.add(f, arcname=f.name)
    out = tmp_path / "r.jsonl"
    assert ab_rows(tmp_path / "ab.tgz", out).returncode == 0
    rows = map(json.loads, out.read_text().splitlines())
    got = sorted((r["build"], r["median_us"]) for r in rows)
    assert got == [("a", 7.0), ("b", 6.0)]


def test_archive_that_leaves_its_folder_is_refused(tmp_path):
    tar_of(tmp_path / "bad.tgz", {"../ab_peer_base.jsonl": b"{}\n"})
    p = ab_rows(tmp_path / "bad.tgz", tmp_path / "r.jsonl")
    assert p.returncode != 0 and "not a plain file inside" in p.stderr
    assert not (tmp_path / "r.jsonl").exists()
    assert not (tmp_path.parent / "ab_peer_base.jsonl").exists()


def test_unreadable_archive_is_a_clear_error(tmp_path):
    (tmp_path / "junk.tgz").write_bytes(b"not a tar")
    p = ab_rows(tmp_path / "junk.tgz", tmp_path / "r.jsonl")
    assert p.returncode != 0 and "neither a folder nor a readable tar archive" in p.stderr


def test_archive_of_two_folders_is_refused(tmp_path):
    """Two calls' folders in one archive hold files of one name: refused, not
    one call's rows silently overwritten by the other's."""
    data = json.dumps(row(1, "dispatch", 7.0)).encode() + b"\n"
    tar_of(tmp_path / "two.tgz", {folder + "/ab_peer_base.jsonl": data
                                  for folder in ("fp8", "bf16")})
    p = ab_rows(tmp_path / "two.tgz", tmp_path / "r.jsonl")
    assert p.returncode != 0 and "have one file name" in p.stderr
    assert not (tmp_path / "r.jsonl").exists()
