#!/usr/bin/env python3
"""The engines' own unit tests, run unchanged against epx (`make peer-test`).

For each release below the harness downloads the release's files from PyPI
into a cache (default build/peer-test/), takes out its unit test and the
engine code behind it, and runs the test with pytest twice behind a small
import shim (tools/peer_shim): once on the release's own code ("engine", to
show the harness is fair: it must pass there) and once with epx's drop-ins
in place of the engine's functions ("epx"). The test files run as released;
nothing of the engines is kept in the repository.

  vLLM 0.9.2 0.12.0 0.13.0 0.18.1 0.34.0
      tests/distributed/test_eplb_algo.py, from the release's sdist (the
      wheels hold no tests). pip would build an sdist's metadata to download
      it (installing vLLM's build requirements, torch included), so the sdist
      is fetched from the package index's simple API, which pip reads too,
      and checked against the index's sha256.
  vLLM 0.13.0 0.18.1 0.34.0 (the plugin)
      tools/peer_tests/test_vllm_plugin.py, epx's own test of its vLLM
      plugin (epx.vllm_plugin, the vllm.general_plugins entry point of the
      installed epx package) through the release's own plugin loader
      (vllm/plugins/__init__.py, vllm/envs.py) and policy table
      (vllm/distributed/eplb/policy/__init__.py), from the same sdist. It
      runs in mode "engine" only: the release's code throughout, epx coming
      in by the plugin alone.
  SGLang 0.5.16
      test/registered/unit/eplb/test_compute_logical_to_rank_dispatch_
      physical_map.py (the one that runs without a server), in 0.5.16's call
      shape (server_args=). SGLang publishes wheels only and they hold no
      tests, so this file is taken from --sglang-test FILE (or
      $EPX_SGLANG_TEST, or CACHE/sglang/<its name>): e.g. `git show
      v0.5.16:test/registered/unit/eplb/<its name>` in an SGLang checkout.
      Without it that run is skipped, saying so. The engine code comes from
      the release's wheel (pip download --no-deps).
  SGLang 0.5.23
      tools/peer_tests/test_sglang_runtime_call_shape.py, epx's own test of
      0.5.23's call shape (the node count from SGLang's runtime context)
      against 0.5.23's own function.

Where PyPI cannot be reached and the cache lacks a release, its runs are
skipped with the reason, and the exit status is 0. A run that fails in
either mode makes the exit status 1.

Usage: tools/peer_test.py [--cache DIR] [--python PY] [--sglang-test FILE]
                          [--only vllm|sglang] [--versions V ...]
PY needs torch, numpy, pytest and epx (default: build/python/venv/bin/python,
the venv scripts/python-test.sh makes, else this interpreter).
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIM = ROOT / "tools" / "peer_shim"
OWN_TESTS = ROOT / "tools" / "peer_tests"

VLLM_VERSIONS = ["0.9.2", "0.12.0", "0.13.0", "0.18.1", "0.34.0"]
VLLM_TEST = "tests/distributed/test_eplb_algo.py"
VLLM_CODE = ["vllm/distributed/eplb/rebalance_algo.py", "vllm/distributed/eplb/eplb_state.py",
             "vllm/distributed/eplb/policy/abstract.py", "vllm/distributed/eplb/policy/default.py",
             "vllm/distributed/eplb/policy/__init__.py", "vllm/config/parallel.py",
             "vllm/plugins/__init__.py", "vllm/envs.py"]
# The releases whose plugin loader and policy table epx's plugin is run
# through (the table arrived in 0.13.0), and the test that does it.
VLLM_PLUGIN_VERSIONS = ["0.13.0", "0.18.1", "0.34.0"]
VLLM_PLUGIN_TEST = OWN_TESTS / "test_vllm_plugin.py"

SGLANG_TEST_NAME = "test_compute_logical_to_rank_dispatch_physical_map.py"
SGLANG_CODE = ["sglang/srt/eplb/expert_location.py"]
# release -> the test it runs: SGLang's own unit test (None: the file given)
# or epx's test of that release's call shape
SGLANG_RUNS = {"0.5.16": None, "0.5.23": OWN_TESTS / "test_sglang_runtime_call_shape.py"}

# The package index: $EPX_PEER_INDEX, else pip's ($PIP_INDEX_URL), else PyPI.
INDEX = os.environ.get("EPX_PEER_INDEX") or os.environ.get("PIP_INDEX_URL") or \
    "https://pypi.org/simple"


class Unreachable(Exception):
    """The package index could not be reached."""


def _say(*a):
    print(*a, flush=True)


# ---- downloads ------------------------------------------------------------------

def _index_files(project):
    """The index's file list for one project (PEP 691 JSON, as pip reads it)."""
    req = urllib.request.Request("%s/%s/" % (INDEX.rstrip("/"), project),
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.load(r)["files"]
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise Unreachable("%s: %s" % (req.full_url, e)) from None


def fetch_sdist(project, version, dest):
    """dest/<project>-<version>.tar.gz, downloaded once and checked."""
    name = "%s-%s.tar.gz" % (project, version)
    path = dest / name
    if path.exists():
        return path
    files = [f for f in _index_files(project) if f["filename"] == name]
    if not files:
        raise FileNotFoundError("%s %s has no sdist %s on %s" % (project, version, name, INDEX))
    f = files[0]
    dest.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    try:
        with urllib.request.urlopen(f["url"], timeout=600) as r, open(tmp, "wb") as out:
            h = hashlib.sha256()
            for chunk in iter(lambda: r.read(1 << 20), b""):
                h.update(chunk)
                out.write(chunk)
    except (urllib.error.URLError, OSError) as e:
        tmp.unlink(missing_ok=True)
        raise Unreachable("%s: %s" % (f["url"], e)) from None
    want = f.get("hashes", {}).get("sha256")
    if want and h.hexdigest() != want:
        tmp.unlink()
        raise RuntimeError("%s: sha256 %s, the index says %s" % (name, h.hexdigest(), want))
    tmp.rename(path)
    return path


def fetch_wheel(project, version, dest, python):
    """The release's wheel (any CPython 3.12 manylinux x86_64 build: only
    its Python files are read), by pip download --no-deps."""
    have = sorted(dest.glob("%s-%s-*.whl" % (project, version)))
    if have:
        return have[0]
    _index_files(project)  # raises Unreachable before pip tries
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [python, "-m", "pip", "download", "--no-deps", "--quiet", "--only-binary", ":all:",
           "--platform", "manylinux_2_34_x86_64", "--python-version", "3.12",
           "--implementation", "cp", "%s==%s" % (project, version), "-d", str(dest)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    have = sorted(dest.glob("%s-%s-*.whl" % (project, version)))
    if r.returncode != 0 or not have:
        msg = (r.stderr or r.stdout).strip().splitlines()
        text = msg[-1] if msg else "pip download failed"
        if any(w in (r.stderr or "") for w in ("NewConnectionError", "Network is unreachable",
                                               "Temporary failure", "timed out",
                                               "Connection refused",
                                               "Max retries")):
            raise Unreachable(text)
        raise RuntimeError("pip download %s==%s: %s" % (project, version, text))
    return have[0]


def extract_sdist(archive, members, dest):
    """Members (paths below the sdist's top folder) into dest, as they are."""
    with tarfile.open(archive) as t:
        top = t.getnames()[0].split("/")[0]
        for m in members:
            try:
                data = t.extractfile("%s/%s" % (top, m))
            except KeyError:
                continue  # a release without this file (e.g. rebalance_algo.py from 0.13)
            out = dest / m
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data.read())


def extract_sdist_once(archive, members, dest):
    """extract_sdist, skipped when dest already holds these members (a stamp
    lists them, so a longer list re-extracts from the cached archive)."""
    stamp = dest / ".epx-members"
    want = "\n".join(members)
    if stamp.exists() and stamp.read_text() == want:
        return
    extract_sdist(archive, members, dest)
    stamp.write_text(want)


def extract_wheel(archive, members, dest):
    with zipfile.ZipFile(archive) as z:
        for m in members:
            out = dest / m
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(z.read(m))


# ---- running a test -------------------------------------------------------------

def run_pytest(python, test_file, src, version, mode, workdir):
    """pytest on an unchanged copy of test_file, the shim first on the path.
    Returns {"passed", "failed", "skipped", "skips": [reasons], "log"}."""
    run_dir = Path(tempfile.mkdtemp(prefix="%s-" % mode, dir=workdir))
    test = run_dir / Path(test_file).name
    test.write_bytes(Path(test_file).read_bytes())
    junit = run_dir / "junit.xml"
    path = os.pathsep.join([str(SHIM)] + ([os.environ["PYTHONPATH"]]
                                          if os.environ.get("PYTHONPATH") else []))
    env = dict(os.environ, EPX_PEER_MODE=mode, EPX_PEER_SRC=str(src),
               EPX_PEER_VERSION=version, PYTHONPATH=path, PYTHONDONTWRITEBYTECODE="1")
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
           "--rootdir", str(run_dir), "--junitxml", str(junit), str(test)]
    r = subprocess.run(cmd, cwd=run_dir, env=env, capture_output=True, text=True)
    res = {"passed": 0, "failed": 0, "skipped": 0, "skips": [], "log": r.stdout + r.stderr}
    if not junit.exists():
        res["failed"] = 1
        return res
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = {c.tag for c in case}
        if kinds & {"failure", "error"}:
            res["failed"] += 1
        elif "skipped" in kinds:
            res["skipped"] += 1
            s = case.find("skipped")
            res["skips"].append("%s: %s" % (case.get("name"), s.get("message", "")))
        else:
            res["passed"] += 1
    if r.returncode not in (0, 5) and res["failed"] == 0:
        res["failed"] = 1  # pytest failed outside the cases (collection, import)
    return res


def _python(arg):
    if arg:  # a path is made absolute: the tests run in another folder
        return os.path.abspath(arg) if os.sep in arg else arg  # not resolve(): a venv
    venv = ROOT / "build" / "python" / "venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _missing_modules(python):
    probe = ("import importlib.util as u, sys; "
             "m = [n for n in ('torch', 'numpy', 'pytest', 'epx') if u.find_spec(n) is None]; "
             "print(' '.join(m))")
    r = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "(the interpreter did not run)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", default=str(ROOT / "build" / "peer-test"))
    ap.add_argument("--python", help="the interpreter that runs the tests")
    ap.add_argument("--sglang-test", default=os.environ.get("EPX_SGLANG_TEST"),
                    help="SGLang's %s (0.5.16's)" % SGLANG_TEST_NAME)
    ap.add_argument("--only", choices=["vllm", "sglang"])
    ap.add_argument("--versions", nargs="*", help="limit to these releases")
    a = ap.parse_args()

    cache = Path(a.cache).resolve()
    python = _python(a.python)
    missing = _missing_modules(python)
    if missing:
        _say("peer-test: SKIP: %s lacks %s (run `make python-test` first, or pass --python)"
             % (python, missing))
        return 0
    work = cache / "runs"
    work.mkdir(parents=True, exist_ok=True)
    sglang_test = Path(a.sglang_test) if a.sglang_test else cache / "sglang" / SGLANG_TEST_NAME

    plan = []  # (engine, version, fetch-and-extract -> (test file, src), modes, test name)
    both = ("engine", "epx")

    def vllm_src(v):
        src = cache / "vllm" / v
        archive = fetch_sdist("vllm", v, cache / "downloads")  # cached after the first
        extract_sdist_once(archive, [VLLM_TEST] + VLLM_CODE, src)
        return src

    if a.only in (None, "vllm"):
        for v in VLLM_VERSIONS:
            def prep(v=v):
                src = vllm_src(v)
                return src / VLLM_TEST, src
            plan.append(("vllm", v, prep, both, Path(VLLM_TEST).name))
        for v in VLLM_PLUGIN_VERSIONS:
            def prep(v=v):
                return VLLM_PLUGIN_TEST, vllm_src(v)
            plan.append(("vllm", v, prep, ("engine",), VLLM_PLUGIN_TEST.name))
    if a.only in (None, "sglang"):
        for v, own in SGLANG_RUNS.items():
            def prep(v=v, own=own):
                test = own or sglang_test
                if not test.exists():
                    raise FileNotFoundError(
                        "SGLang's %s is not on PyPI (SGLang publishes wheels only, without "
                        "tests): put 0.5.16's at %s or pass --sglang-test FILE"
                        % (SGLANG_TEST_NAME, test))
                src = cache / "sglang" / v
                if not (src / SGLANG_CODE[0]).exists():
                    archive = fetch_wheel("sglang", v, cache / "downloads", python)
                    extract_wheel(archive, SGLANG_CODE, src)
                return test, src
            plan.append(("sglang", v, prep, both, (own or sglang_test).name))
    if a.versions:
        plan = [p for p in plan if p[1] in a.versions]

    rows, failed = [], False
    for engine, v, prep, modes, name in plan:
        try:
            test, src = prep()
        except Unreachable as e:
            _say("peer-test: SKIP %s %s %s: PyPI unreachable (%s)" % (engine, v, name, e))
            rows.append((engine, v, "-", "skipped: PyPI unreachable  [%s]" % name))
            continue
        except FileNotFoundError as e:
            _say("peer-test: SKIP %s %s %s: %s" % (engine, v, name, e))
            rows.append((engine, v, "-", "skipped: test file absent  [%s]" % name))
            continue
        for mode in modes:
            r = run_pytest(python, test, src, v, mode, work)
            line = "%d passed, %d failed, %d skipped" % (r["passed"], r["failed"], r["skipped"])
            rows.append((engine, v, mode, line + ("  [%s]" % test.name)))
            for s in r["skips"]:
                _say("peer-test: %s %s %s skipped %s" % (engine, v, mode, s))
            if r["failed"]:
                failed = True
                _say("peer-test: %s %s %s FAILED; pytest said:\n%s"
                     % (engine, v, mode, r["log"][-6000:]))
    _say("\n%-7s %-8s %-7s %s" % ("engine", "release", "code", "result"))
    for row in rows:
        _say("%-7s %-8s %-7s %s" % row)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
