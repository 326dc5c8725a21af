# Copyright the epx authors. Licensed under the Apache License, Version 2.0;
# you may use this file only in compliance with that license, a copy of which
# is at http://www.apache.org/licenses/LICENSE-2.0. It is distributed "AS IS",
# without warranties or conditions of any kind.
"""docs/ENVIRONMENT.md lists exactly the environment variables the sources
read: every EPX_ variable read by the library, the CLI, the Python package,
the tools, the tests, the benchmarks and the scripts is on the page, and
every variable on the page is still read somewhere."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "ENVIRONMENT.md")
TREES = ("src", "include", "tools", "tests", "bench", "scripts", "python/epx", "python/tests",
         "python/bench", "python/examples", "python/setup.py", "cmake", "CMakeLists.txt",
         "Makefile", ".ci")
SUFFIXES = (".c", ".h", ".cu", ".cuh", ".py", ".sh", ".cmake", ".txt", "Makefile", "run")

# How a variable is read. C: getenv and the switch and whole-number parsers. Python:
# os.getenv, os.environ.get or os.environ[...] not being assigned (a plain
# name, or a module constant ENV = "EPX_..."), and `"EPX_..." in os.environ`.
# Shell and make: $EPX_... or ${EPX_...}; a line that only sets a variable
# for a child process (EPX_LIBRARY=... cmd) is not a read. CMake: $ENV{...}.
READS = (
    re.compile(r'getenv\(\s*["\'](EPX_\w+)["\']'),
    re.compile(r'epxi_env_(?:switch|whole)\(\s*"(EPX_\w+)"'),
    re.compile(r'environ\.get\(\s*["\'](EPX_\w+)["\']'),
    re.compile(r'environ\[\s*["\'](EPX_\w+)["\']\s*\](?!\s*=[^=])'),
    re.compile(r'["\'](EPX_\w+)["\']\s+in\s+os\.environ'),
    re.compile(r'^\s*ENV\s*=\s*["\'](EPX_\w+)', re.M),
    re.compile(r'\$ENV\{(EPX_\w+)\}'),
)
SHELL_READ = re.compile(r'\$\{?(EPX_\w+)')


def files():
    for tree in TREES:
        top = os.path.join(ROOT, tree)
        if os.path.isfile(top):
            yield top
        for folder, _, names in os.walk(top):
            for name in names:
                if name.endswith(SUFFIXES):
                    yield os.path.join(folder, name)


def variables_read():
    found = {}
    for path in files():
        with open(path, errors="replace") as f:
            text = f.read()
        shell = path.endswith((".sh", "Makefile", "run"))
        for pattern in READS + ((SHELL_READ,) if shell else ()):
            for m in pattern.finditer(text):
                found.setdefault(m.group(1), os.path.relpath(path, ROOT))
    return found


def variables_documented():
    with open(DOC) as f:
        text = f.read()
    # the tables' first column: `EPX_X` or `EPX_A`, `EPX_B`
    names = set()
    for line in text.splitlines():
        if line.startswith("| `EPX_"):
            names.update(re.findall(r"`(EPX_\w+)`", line.split("|")[1]))
    return names


def test_the_scan_finds_the_variables_it_must():
    read = variables_read()
    for name in ("EPX_THREADS", "EPX_GPU_EP_TRANSPORT", "EPX_BALANCED_PDL", "EPX_LIBRARY",
                 "EPX_VLLM_ALGORITHM", "EPX_PY_TORCH", "EPX_SHARED", "EPX_BUILD_JOBS",
                 "EPX_BIN"):
        assert name in read, name


def test_every_variable_read_is_documented():
    missing = sorted(set(variables_read()) - variables_documented())
    assert not missing, "read but not in docs/ENVIRONMENT.md: " + ", ".join(
        "%s (%s)" % (n, variables_read()[n]) for n in missing)


def test_every_documented_variable_is_read():
    stale = sorted(variables_documented() - set(variables_read()))
    assert not stale, "in docs/ENVIRONMENT.md but read nowhere: " + ", ".join(stale)
