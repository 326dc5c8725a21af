#!/usr/bin/env python3
"""Append the graph-replayed rows of one gpu_ab.sh call to a results file.

gpu_ab.sh leaves ab_<transport>_<base|new>.jsonl in its OUT folder, each with
round 1's rows and then round 2's (`epx bench comm --json` appends). This
keeps the graph rows (engine and floors), numbers the rounds by the order in
which each (transport, tokens, phase, mode, floor) cell comes back, and tags
every row with the build it timed and a note, so bench/RESULTS.md can point
at them:

  scripts/ab_rows.py AB_DIR bench/results/ep_h100.jsonl \\
      --base 059c317 --new 67c34d3 --note "what the new build changes"

AB_DIR may also be the ab.tgz that gpu_ab.sh's PACK=1 leaves.

A call with a third build (gpu_ab.sh's NEW2) adds --new2 NAME --note2 TEXT, and
one with a fourth (NEW3) --new3 NAME --note3 TEXT as well.
"""
import argparse
import collections
import glob
import json
import os
import re
import sys
import tarfile
import tempfile


def rows_of(path, build, note):
    seen = collections.Counter()
    for line in open(path):
        r = json.loads(line)
        if not r.get("graph"):
            continue
        key = (r.get("transport"), r["tokens"], r["phase"], r["mode"], r.get("floor"))
        seen[key] += 1
        r.update(build=build, note=note, round=seen[key])
        yield r


def unpack(archive, into):
    """The archive's plain files into `into`, each by its file name, refusing
    any other member, any path that leaves it (Python before 3.11.4 has no
    extraction filter) and a second file of one name (two calls' folders in
    one archive), which would overwrite the first."""
    taken = {}
    try:
        with tarfile.open(archive) as t:
            for m in t.getmembers():
                parts = m.name.split("/")
                if not (m.isfile() or m.isdir()) or m.name.startswith("/") or ".." in parts:
                    sys.exit(f"ab_rows: {archive}: member {m.name!r} is not a plain file "
                             "inside the archive")
                if m.isfile() and parts[-1] in taken:
                    sys.exit(f"ab_rows: {archive}: members {taken[parts[-1]]!r} and {m.name!r} "
                             "have one file name: give each call's folder on its own")
                if m.isfile():
                    taken[parts[-1]] = m.name
                    with t.extractfile(m) as src, open(os.path.join(into, parts[-1]), "wb") as dst:
                        dst.write(src.read())
    except (tarfile.TarError, OSError) as e:
        sys.exit(f"ab_rows: {archive} is neither a folder nor a readable tar archive: {e}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("ab_dir", help="gpu_ab.sh's OUT folder (ab_*_base.jsonl, ab_*_new.jsonl)")
    p.add_argument("results", help="the JSON-lines file to append to")
    p.add_argument("--base", required=True, help="the base build's name (a commit)")
    p.add_argument("--new", required=True, help="the new build's name (a commit)")
    p.add_argument("--note", required=True, help="what the new build changes")
    p.add_argument("--new2", help="the third build's name, when gpu_ab.sh timed NEW2")
    p.add_argument("--note2", help="what the third build changes (with --new2)")
    p.add_argument("--new3", help="the fourth build's name, when gpu_ab.sh timed NEW3")
    p.add_argument("--note3", help="what the fourth build changes (with --new3)")
    a = p.parse_args()
    for n in ("2", "3"):
        if (getattr(a, "new" + n) is None) != (getattr(a, "note" + n) is None):
            sys.exit(f"ab_rows: --new{n} and --note{n} go together: give both or neither")
    if a.new3 is not None and a.new2 is None:
        sys.exit("ab_rows: --new3 names the build on top of --new2's: give --new2 too")
    with tempfile.TemporaryDirectory() as tmp:
        ab_dir = a.ab_dir
        if os.path.isfile(ab_dir):  # gpu_ab.sh's PACK=1 archive
            unpack(ab_dir, tmp)
            ab_dir = tmp
        append_rows(a, ab_dir)


def append_rows(a, ab_dir):
    files = sorted(glob.glob(os.path.join(ab_dir, "ab_*_*.jsonl")))
    if not files:
        sys.exit(f"ab_rows: no ab_*_*.jsonl in {a.ab_dir}: give gpu_ab.sh's OUT folder "
                 "or its ab.tgz")
    out = []
    for f in files:
        m = re.fullmatch(r"ab_([a-z]+)_(base|new|new2|new3)\.jsonl", os.path.basename(f))
        if m is None:
            continue
        who = m.group(2)
        for n, nth in (("2", "third"), ("3", "fourth")):
            if who == "new" + n and getattr(a, "new" + n) is None:
                sys.exit(f"ab_rows: {f} holds a {nth} build's rows: name it with --new{n} and "
                         f"--note{n}")
        build = {"base": a.base, "new": a.new, "new2": a.new2, "new3": a.new3}[who]
        what = {"base": f"the base, beside {a.new}", "new": a.note, "new2": a.note2,
                "new3": a.note3}[who]
        note = f"{m.group(1)} transport, {what}"
        out.extend(rows_of(f, build, note))
    with open(a.results, "a") as fh:
        for r in out:
            fh.write(json.dumps(r) + "\n")
    print(f"ab_rows: {len(out)} rows appended to {a.results}")


if __name__ == "__main__":
    main()
