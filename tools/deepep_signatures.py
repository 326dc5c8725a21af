#!/usr/bin/env python3
"""The call shapes of DeepEP's Python API, read from DeepEP's own source.

epx.torch.Buffer stands in for DeepEP's `deep_ep.Buffer`. This script records,
from one DeepEP commit, what a caller of DeepEP can write: for the classes
epx offers in DeepEP's place (Buffer, EventOverlap, Config) every public
method's parameters in order, each with its kind (inspect.Parameter's names:
POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD, VAR_POSITIONAL, KEYWORD_ONLY,
VAR_KEYWORD) and its default as source text, whether the method is a
staticmethod, classmethod or property, the class attributes set in the
class body, and the names deep_ep's __init__ exports. The JSON it writes
(tests/data/deepep/signatures.json) is committed; python/tests/
test_deepep_signatures.py compares epx.torch against it with
inspect.signature, so CI needs neither DeepEP nor a GPU.

The Python files are parsed with `ast`; nothing of deep_ep is imported (its
__init__ loads a CUDA extension). Config is that extension's class (pybind11):
its constructor and methods were read by hand from the binding and are
written below (CONFIG); the script checks them against the binding's text
at the commit read and stops if they disagree, so a DeepEP change there
needs a new reading rather than passing unnoticed.

    tools/deepep_signatures.py --git-dir DEEPEP.git [--commit REV] [-o OUT]
    tools/deepep_signatures.py --src DEEPEP_CHECKOUT [--commit SHA] [-o OUT]

Copyright the epx authors. Licensed under the Apache License, Version 2.0;
you may use this file only in compliance with that license, a copy of which
is at http://www.apache.org/licenses/LICENSE-2.0. It is distributed "AS IS",
without warranties or conditions of any kind.
"""
import argparse
import ast
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "deepep", "signatures.json")

# The classes recorded in full, by the name deep_ep exports them under.
CLASSES = ["Buffer", "EventOverlap"]
# Dunder methods that are part of a class's call shape (construction, `with`,
# calling the object); other names starting with "_" are DeepEP's internals.
DUNDERS = {"__init__", "__call__", "__enter__", "__exit__"}

# Config, read by hand from the pybind11 binding (`pybind11::class_<Config>`
# in DeepEP's csrc; at dd758ca in csrc/legacy/buffer.hpp, register_apis, the
# constructor in csrc/legacy/config.hpp). The constructor's arguments are
# named with py::arg and carry defaults, so they are positional-or-keyword.
# The two methods are bound without py::arg: pybind11 calls their arguments
# arg0 and arg1 and takes them by position only; cxx_names are the C++
# parameter names, for the reader.
CONFIG = {
    "kind": "pybind11 class",
    "how_read": "by hand from the pybind11 binding (pybind11::class_<Config>: .def(pybind11::"
                "init<...>(), py::arg(...) = ...) and .def(name, &Config::name)); "
                "tools/deepep_signatures.py checks this reading against the binding's text",
    "class_attributes": {},
    "methods": {
        "__init__": {
            "decorator": None,
            "params": [{"name": "self", "kind": "POSITIONAL_OR_KEYWORD"}] + [
                {"name": n, "kind": "POSITIONAL_OR_KEYWORD", "default": d}
                for n, d in (("num_sms", "20"), ("num_max_nvl_chunked_send_tokens", "6"),
                             ("num_max_nvl_chunked_recv_tokens", "256"),
                             ("num_max_rdma_chunked_send_tokens", "6"),
                             ("num_max_rdma_chunked_recv_tokens", "256"))],
        },
        "get_nvl_buffer_size_hint": {
            "decorator": None,
            "params": [{"name": "self", "kind": "POSITIONAL_OR_KEYWORD"},
                       {"name": "arg0", "kind": "POSITIONAL_ONLY", "cxx_name": "hidden_bytes"},
                       {"name": "arg1", "kind": "POSITIONAL_ONLY", "cxx_name": "num_ranks"}],
        },
        "get_rdma_buffer_size_hint": {
            "decorator": None,
            "params": [{"name": "self", "kind": "POSITIONAL_OR_KEYWORD"},
                       {"name": "arg0", "kind": "POSITIONAL_ONLY", "cxx_name": "hidden_bytes"},
                       {"name": "arg1", "kind": "POSITIONAL_ONLY", "cxx_name": "num_ranks"}],
        },
    },
}


class Source:
    """DeepEP's files: a checkout on disk, or one commit of a git directory."""

    def __init__(self, src=None, git_dir=None, commit=None):
        self.src, self.git_dir = src, git_dir
        if git_dir:
            rev = (commit or "HEAD") + "^{commit}"
            self.commit = self._git("rev-parse", "--verify", rev).strip()
        else:
            try:
                self.commit = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], check=True,
                                             capture_output=True, text=True).stdout.strip()
            except (OSError, subprocess.CalledProcessError):
                self.commit = None  # not a git checkout: --commit names it
            if commit and self.commit and not self.commit.startswith(commit):
                sys.exit("deepep_signatures: %s is at %s, not %s" % (src, self.commit, commit))
            self.commit = self.commit or commit
            if not self.commit:
                sys.exit("deepep_signatures: %s is not a git checkout: name its DeepEP commit "
                         "with --commit (the golden records it)" % src)

    def _git(self, *args):
        return subprocess.run(["git", "--git-dir", self.git_dir] + list(args), check=True,
                              capture_output=True, text=True).stdout

    def read(self, path):
        if self.git_dir:
            return self._git("show", "%s:%s" % (self.commit, path))
        with open(os.path.join(self.src, path), encoding="utf-8") as f:
            return f.read()

    def exists(self, path):
        if self.git_dir:
            return subprocess.run(["git", "--git-dir", self.git_dir, "cat-file", "-e",
                                   "%s:%s" % (self.commit, path)],
                                  capture_output=True).returncode == 0
        return os.path.isfile(os.path.join(self.src, path))

    def files(self, prefix):
        if self.git_dir:
            return self._git("ls-tree", "-r", "--name-only", self.commit, prefix).split()
        out = []
        for d, _, names in os.walk(os.path.join(self.src, prefix)):
            out += [os.path.relpath(os.path.join(d, n), self.src) for n in names]
        return sorted(out)


def module_path(src, package_dir, level, module):
    """The file of `from <level dots><module> import ...` in package_dir."""
    base = package_dir
    for _ in range(level - 1):
        base = os.path.dirname(base)
    rel = os.path.join(base, *module.split(".")) if module else base
    for cand in (rel + ".py", os.path.join(rel, "__init__.py")):
        if src.exists(cand):
            return cand
    return None


def defined_in(src, path, name, depth=0):
    """(file, name) where `name`, imported from `path`, is defined: a module
    that only imports it (deep_ep/utils/event.py's EventHandle) is followed;
    None for the file when it comes from the extension (deep_ep._C)."""
    if path is None or depth > 8:
        return None, name
    tree = ast.parse(src.read(path))
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.name == name:
            return path, name
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                                for t in node.targets):
            return path, name
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                if (a.asname or a.name) == name:
                    if node.level == 0:
                        if not (node.module or "").startswith("deep_ep"):
                            return None, a.name
                        level, mod = 1, node.module[len("deep_ep"):].lstrip(".")
                        pkg = "deep_ep"
                    else:
                        level, mod, pkg = node.level, node.module or "", os.path.dirname(path)
                    return defined_in(src, module_path(src, pkg, level, mod), a.name, depth + 1)
    return path, name


def exports(src):
    """deep_ep's exported names -> where they come from, from its __init__'s
    `from ... import` statements (every one, in order)."""
    tree = ast.parse(src.read("deep_ep/__init__.py"))
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            if node.level == 0 and not (node.module or "").startswith("deep_ep"):
                continue  # another package's names (os, torch, ...)
            mod = "." * node.level + (node.module or "")
            if node.level == 0:
                rel = node.module[len("deep_ep"):].lstrip(".")
                mod, level = "." + rel, 1
            else:
                level = node.level
            path = module_path(src, "deep_ep", level, mod.lstrip("."))
            for a in node.names:
                name = a.asname or a.name
                if name.startswith("_"):
                    continue
                where, orig = defined_in(src, path, a.name)
                out[name] = {"from": mod, "name": orig, "file": where,
                             "extension": where is None}
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name) and not t.id.startswith("_"):
                    out[t.id] = {"from": None, "value": ast.get_source_segment(
                        src.read("deep_ep/__init__.py"), node.value)}
    return out


def params(fn, text):
    """The parameters of a FunctionDef in order, with kinds and defaults."""
    a = fn.args
    text_of = lambda node: ast.get_source_segment(text, node)  # noqa: E731
    out = []
    positional = [(p, "POSITIONAL_ONLY") for p in a.posonlyargs] + \
        [(p, "POSITIONAL_OR_KEYWORD") for p in a.args]
    first_default = len(positional) - len(a.defaults)
    for i, (p, kind) in enumerate(positional):
        rec = {"name": p.arg, "kind": kind}
        if i >= first_default:
            rec["default"] = text_of(a.defaults[i - first_default])
        out.append(rec)
    if a.vararg:
        out.append({"name": a.vararg.arg, "kind": "VAR_POSITIONAL"})
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        rec = {"name": p.arg, "kind": "KEYWORD_ONLY"}
        if d is not None:
            rec["default"] = text_of(d)
        out.append(rec)
    if a.kwarg:
        out.append({"name": a.kwarg.arg, "kind": "VAR_KEYWORD"})
    return out


def decorator(fn):
    names = []
    for d in fn.decorator_list:
        if isinstance(d, ast.Name):
            names.append(d.id)
        elif isinstance(d, ast.Attribute):
            names.append(d.attr)  # e.g. @x.setter
    for kind in ("staticmethod", "classmethod", "property"):
        if kind in names:
            return kind
    return None


def class_shape(src, path, name):
    text = src.read(path)
    tree = ast.parse(text)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if cls is None:
        sys.exit("deepep_signatures: no class %s in %s" % (name, path))
    methods, attrs = {}, {}
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name.startswith("_") and node.name not in DUNDERS:
                continue
            methods[node.name] = {"decorator": decorator(node), "params": params(node, text)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                node.value is not None and not node.target.id.startswith("_"):
            attrs[node.target.id] = ast.get_source_segment(text, node.value)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name) and not t.id.startswith("_"):
                    attrs[t.id] = ast.get_source_segment(text, node.value)
    return {"kind": "python class", "file": path, "class_attributes": attrs, "methods": methods}


def check_config(src):
    """Stop unless the pybind11 binding of Config at this commit says what
    CONFIG says. Returns the files it was read from."""
    binding = None
    for path in src.files("csrc"):
        if path.endswith((".hpp", ".cpp", ".h", ".cu", ".cuh")):
            text = src.read(path)
            m = re.search(r"class_<\s*Config\s*>\s*\(\s*m\s*,\s*\"Config\"\s*\)(.*?);", text, re.S)
            if m:
                binding = (path, m.group(1))
                break
    if binding is None:
        sys.exit("deepep_signatures: no pybind11::class_<Config> in csrc/: read Config anew")
    path, body = binding
    args = re.findall(r"py(?:bind11)?::arg\(\s*\"(\w+)\"\s*\)\s*(?:=\s*([^,)]+))?", body)
    init = [(p["name"], p.get("default")) for p in CONFIG["methods"]["__init__"]["params"][1:]]
    got = [(n, d.strip() if d else None) for n, d in args]
    defs = re.findall(r"\.def\(\s*\"(\w+)\"\s*,\s*&Config::(\w+)\s*\)", body)
    methods = sorted(n for n in CONFIG["methods"] if n != "__init__")
    if got != init or sorted(n for n, _ in defs) != methods or \
            any(n != f for n, f in defs) or body.count(".def(") != len(methods) + 1:
        sys.exit("deepep_signatures: %s's Config binding no longer reads as CONFIG here "
                 "(constructor %s, methods %s): read it again and update CONFIG"
                 % (path, got, [n for n, _ in defs]))
    return path


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--src", help="a DeepEP checkout")
    g.add_argument("--git-dir", help="a DeepEP git directory (bare or a clone's .git)")
    p.add_argument("--commit", help="with --git-dir the commit to read (default HEAD); with "
                   "--src the commit the files are of (needed where --src is no git checkout)")
    p.add_argument("-o", "--out", default=OUT)
    a = p.parse_args()
    src = Source(a.src, a.git_dir, a.commit)

    ex = exports(src)
    classes = {}
    for name in CLASSES:
        if name not in ex or ex[name].get("extension") or not ex[name].get("file"):
            sys.exit("deepep_signatures: deep_ep does not export a Python class %s" % name)
        classes[name] = class_shape(src, ex[name]["file"], ex[name]["name"])
    config = dict(CONFIG, file=check_config(src))
    if "Config" not in ex or not ex["Config"].get("extension"):
        sys.exit("deepep_signatures: deep_ep's Config is no longer the extension's: "
                 "record it from Python (CLASSES)")
    classes["Config"] = config

    golden = {
        "about": "DeepEP's Python call shapes, written by tools/deepep_signatures.py from "
                 "DeepEP's source (ast; Config by hand from its pybind11 binding); compared "
                 "with epx.torch by python/tests/test_deepep_signatures.py. Parameter kinds "
                 "are inspect.Parameter's; defaults are DeepEP's source text.",
        "deepep_commit": src.commit,
        "exports": {n: {k: v for k, v in e.items() if k != "file"} for n, e in ex.items()},
        "classes": classes,
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(golden, f, indent=1, sort_keys=True)
        f.write("\n")
    n = sum(len(c["methods"]) for c in classes.values())
    print("deepep_signatures: %d methods of %s from DeepEP %s -> %s"
          % (n, ", ".join(classes), src.commit, os.path.relpath(a.out)))


if __name__ == "__main__":
    main()
