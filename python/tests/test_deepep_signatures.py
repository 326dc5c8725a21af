# Copyright the epx authors. Licensed under the Apache License, Version 2.0;
# you may use this file only in compliance with that license, a copy of which
# is at http://www.apache.org/licenses/LICENSE-2.0. It is distributed "AS IS",
# without warranties or conditions of any kind.
"""epx.torch's drop-in for DeepEP (Buffer, EventOverlap, Config and the names
deep_ep exports) has DeepEP's call shapes: for every method DeepEP has, the
same parameter names, order, kinds and defaults, and the same static/class/
property kind, compared with inspect.signature against the golden that
tools/deepep_signatures.py read from DeepEP's source at the pinned commit
(tests/data/deepep/signatures.json; nothing is downloaded). Every departure
is listed below with its reason, so any new one fails."""
import ast
import inspect
import json

import pytest

from conftest import REPO

torch = pytest.importorskip("torch")
et = pytest.importorskip("epx.torch")

GOLDEN = json.loads((REPO / "tests" / "data" / "deepep" / "signatures.json").read_text())
# The DeepEP commit whose tests pass against epx.torch on the GPU
# (tools/stage_deepep.sh, docs/EP_TORCH.md). Regenerating the golden from
# another commit means changing this line too.
DEEPEP_COMMIT = "dd758caf451848bd150e1046af3d0a73e5fff38d"

# DeepEP methods epx.torch does not have, (class, method): reason. None now:
# the ones it cannot honour exist with DeepEP's signature and raise (below).
MISSING = {}

# DeepEP methods epx has with DeepEP's signature but cannot honour: calling
# one raises NotImplementedError naming it, (class, method): reason.
REFUSED = {
    ("Buffer", "get_local_buffer_tensor"):
        "epx has one engine per shape, made at the shape's first call: no raw buffer to view",
    ("Buffer", "internode_dispatch"):
        "no internode (RDMA) path: epx's dispatch serves the whole group as one engine",
    ("Buffer", "internode_combine"):
        "no internode (RDMA) path: epx's combine serves the whole group as one engine",
}

# Parameters epx adds to a DeepEP method, (class, method): {name: reason}.
# Each must be keyword-only with a default, so no call written for DeepEP
# reaches it.
EXTRA = {
    ("Buffer", "__init__"): {
        "timeout_ms": "epx's peer timeout (DeepEP's is fixed at ~100 s); default from "
                      "EPX_GPU_EP_TIMEOUT_MS",
    },
}

# Names deep_ep exports that epx.torch does not: name -> reason.
NOT_EXPORTED = {
    "ElasticBuffer": "DeepEP V2's elastic buffer; epx offers V1's Buffer only",
    "EPHandle": "DeepEP V2's handle of ElasticBuffer",
    "EventHandle": "DeepEP's C++ CUDA event; epx's EventOverlap holds a torch.cuda.Event",
    "get_physical_domain_size": "DeepEP V2's topology helper (its environment variables)",
    "get_logical_domain_size": "DeepEP V2's topology helper (its environment variables)",
    "find_nccl_root": "DeepEP's build helper (where its NCCL lives), not part of its API",
}

KIND = {k.name: k for k in (inspect.Parameter.POSITIONAL_ONLY,
                            inspect.Parameter.POSITIONAL_OR_KEYWORD,
                            inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.KEYWORD_ONLY,
                            inspect.Parameter.VAR_KEYWORD)}

METHODS = sorted((c, m) for c, cls in GOLDEN["classes"].items() for m in cls["methods"])


def _default(text):
    """A golden default (DeepEP's source text) as its value."""
    try:
        return ast.literal_eval(text)
    except ValueError:
        pytest.fail("DeepEP default %r is no literal: teach this test to compare it" % text)


def _same(a, b):
    return type(a) is type(b) and a == b


def decorator_of(cls, name):
    raw = inspect.getattr_static(cls, name)
    for kind in (staticmethod, classmethod, property):
        if isinstance(raw, kind):
            return kind.__name__, raw
    return None, raw


def signature_of(cls, name):
    kind, raw = decorator_of(cls, name)
    fn = {"staticmethod": lambda r: r.__func__, "classmethod": lambda r: r.__func__,
          "property": lambda r: r.fget}.get(kind, lambda r: r)(raw)
    return inspect.signature(fn)


def differences(cls_name, name, golden_params, sig):
    """What a call written for DeepEP's signature would meet differently in
    epx's `sig` (empty when nothing)."""
    extra = EXTRA.get((cls_name, name), {})
    out = []
    params = []
    for p in sig.parameters.values():
        if p.name in extra:
            if p.kind is not p.KEYWORD_ONLY or p.default is p.empty:
                out.append("epx's extra %s must be keyword-only with a default" % p.name)
        else:
            params.append(p)
    for e in sorted(set(extra) - set(sig.parameters)):
        out.append("EXTRA lists %s, which epx no longer has: drop it from EXTRA" % e)
    want = ["%s%s" % (g["name"], "=" + g["default"] if "default" in g else "")
            for g in golden_params]
    if len(params) != len(golden_params):
        out.append("%d parameters, DeepEP's %d: DeepEP (%s), epx %s"
                   % (len(params), len(golden_params), ", ".join(want), sig))
    for i, (g, p) in enumerate(zip(golden_params, params)):
        kind = KIND[g["kind"]]
        if kind is p.POSITIONAL_ONLY:
            # pybind11's unnamed arguments (arg0, ...) are taken by position
            # only: any positional parameter there accepts the same calls
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                out.append("parameter %d (%s) must be positional, epx's %s is %s"
                           % (i, g["name"], p.name, p.kind.name))
        else:
            if p.name != g["name"]:
                out.append("parameter %d is %r, DeepEP's %r" % (i, p.name, g["name"]))
            if p.kind is not kind:
                out.append("%s is %s, DeepEP's %s" % (g["name"], p.kind.name, kind.name))
        if "default" in g:
            if p.default is p.empty:
                out.append("%s has no default, DeepEP's is %s" % (g["name"], g["default"]))
            elif not _same(p.default, _default(g["default"])):
                out.append("%s defaults to %r, DeepEP's to %s" % (g["name"], p.default,
                                                                 g["default"]))
        elif p.default is not p.empty:
            out.append("%s defaults to %r, DeepEP's has no default" % (p.name, p.default))
    return out


def test_golden_is_the_pinned_deepep():
    assert GOLDEN["deepep_commit"] == DEEPEP_COMMIT, \
        "the golden was read at DeepEP %s; the pin says %s" % (GOLDEN["deepep_commit"],
                                                               DEEPEP_COMMIT)
    assert set(GOLDEN["classes"]) == {"Buffer", "EventOverlap", "Config"}


def test_allowances_name_deepep_methods():
    """Every listed allowance is about something DeepEP has (no stale entries)."""
    for cls_name, name in list(MISSING) + list(REFUSED) + list(EXTRA):
        assert name in GOLDEN["classes"][cls_name]["methods"], \
            "%s.%s is listed here but DeepEP has no such method" % (cls_name, name)
    for name in NOT_EXPORTED:
        assert name in GOLDEN["exports"], "deep_ep no longer exports %s" % name


@pytest.mark.parametrize("cls_name,name", METHODS, ids=["%s.%s" % m for m in METHODS])
def test_method_call_shape(cls_name, name):
    golden = GOLDEN["classes"][cls_name]["methods"][name]
    cls = getattr(et, cls_name)
    if (cls_name, name) in MISSING:
        assert not hasattr(cls, name), \
            "epx now offers %s.%s: drop it from MISSING" % (cls_name, name)
        return
    if name not in vars(cls):
        pytest.fail("epx.torch.%s lacks DeepEP's %s (add it, or list it in MISSING with a "
                    "reason)" % (cls_name, name))
    kind, _ = decorator_of(cls, name)
    assert kind == golden["decorator"], "%s.%s is %s in epx, %s in DeepEP" % (
        cls_name, name, kind or "a plain method", golden["decorator"] or "a plain method")
    diff = differences(cls_name, name, golden["params"], signature_of(cls, name))
    assert not diff, "%s.%s differs from DeepEP %s:\n  %s" % (
        cls_name, name, DEEPEP_COMMIT[:7], "\n  ".join(diff))


@pytest.mark.parametrize("cls_name,name", sorted(REFUSED), ids=["%s.%s" % m for m in REFUSED])
def test_refused_methods_say_so(cls_name, name):
    """Called with DeepEP's required arguments, they raise NotImplementedError
    naming themselves (a bare instance: no GPU needed)."""
    cls = getattr(et, cls_name)
    params = GOLDEN["classes"][cls_name]["methods"][name]["params"][1:]
    args = [None for p in params if "default" not in p and p["kind"] != "VAR_POSITIONAL"]
    with pytest.raises(NotImplementedError, match=name):
        getattr(cls.__new__(cls), name)(*args)


def test_class_attributes():
    for cls_name, cls in GOLDEN["classes"].items():
        for attr, text in cls["class_attributes"].items():
            got = getattr(getattr(et, cls_name), attr)
            assert _same(got, _default(text)), "%s.%s is %r, DeepEP's %s" % (cls_name, attr,
                                                                             got, text)


def test_exports():
    """deep_ep's exported names are epx.torch's, apart from NOT_EXPORTED."""
    missing = sorted(n for n in GOLDEN["exports"]
                     if n not in NOT_EXPORTED and not hasattr(et, n))
    assert not missing, "deep_ep exports %s; epx.torch does not (offer them or list them in " \
                        "NOT_EXPORTED with a reason)" % missing
    offered = sorted(n for n in NOT_EXPORTED if hasattr(et, n))
    assert not offered, "epx.torch now has %s: drop it from NOT_EXPORTED" % offered
    assert et.topk_idx_t is torch.int64  # DeepEP's default build's


def test_module_get_dispatch_layout():
    """epx.torch.get_dispatch_layout is Buffer.get_dispatch_layout without a
    Buffer: DeepEP's parameters after self, then a keyword-only num_ranks (the
    Buffer's group size, which there is no Buffer to give)."""
    golden = GOLDEN["classes"]["Buffer"]["methods"]["get_dispatch_layout"]["params"][1:]
    sig = inspect.signature(et.get_dispatch_layout)
    *params, last = sig.parameters.values()
    assert last.name == "num_ranks" and last.kind is last.KEYWORD_ONLY and \
        last.default is last.empty
    diff = differences("module", "get_dispatch_layout", golden, sig.replace(parameters=params))
    assert not diff, "epx.torch.get_dispatch_layout differs from DeepEP's:\n  " + "\n  ".join(diff)
