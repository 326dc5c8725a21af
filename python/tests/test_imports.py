"""The package's modules import each other without a circle: every relative
import (at module level or inside a function) is an edge, and the graph of
python/epx is acyclic, so any module can be imported first."""
import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "epx"


def _module_name(path):
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _edges():
    """{module: {modules of epx it imports}}, from the source."""
    mods = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph = {}
    for name, path in mods.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = pkg.split(".")
            base = base[:len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
            if target in mods:
                deps.add(target)
            for alias in node.names:  # `from . import x` names a module
                sub = target + "." + alias.name
                if sub in mods:
                    deps.add(sub)
        # a package's __init__ importing its own submodules is not a circle
        # of theirs; a submodule's import of its package is the __init__ edge
        graph[name] = {d for d in deps if d != name}
    return graph


def _cycle(graph):
    """One import circle as a list of modules, or None."""
    state = {}

    def visit(n, stack):
        state[n] = 1
        stack.append(n)
        for d in sorted(graph.get(n, ())):
            if d.startswith(n + "."):
                continue  # a package's own submodule
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = visit(d, stack)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n, [])
            if found:
                return found
    return None


def test_no_import_circle():
    graph = _edges()
    assert "epx.io" in graph and "epx.planner" in graph
    assert _cycle(graph) is None, "import circle: " + " -> ".join(_cycle(graph))


def test_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("first", ["epx.io", "epx.planner", "epx.sglang", "epx.vllm",
                                   "epx.pt", "epx.trace", "epx.dispatch"])
def test_each_module_imports_first(first):
    """In a fresh interpreter, any module of the package can be the first imported."""
    importlib.import_module("epx")  # installed here
    r = subprocess.run([sys.executable, "-c", "import %s" % first], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
