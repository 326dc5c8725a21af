"""The ctypes mirrors of the C structs and the symbols the binding calls, checked
against the headers and the library, so a header change that the binding
missed fails here rather than corrupting memory."""
import ctypes
import re

import pytest

import epx
from epx import _native, dispatch, io, metrics, planner, pt, trace
from conftest import REPO

INCLUDE = REPO / "include"

MIRRORS = {
    "epx_shape": _native.Shape,
    "epx_error": _native.Error,
    "epx_counts": _native.Counts,
    "epx_init_opts": io.InitOpts,
    "epx_plan_opts": planner.PlanOpts,
    "epx_table_opts": dispatch.TableOpts,
    "epx_dispatch_spec": dispatch.DispatchSpec,
    "epx_token_layout": dispatch.TokenLayout,
    "epx_balanced_out": dispatch.BalancedOut,
    "epx_layer_balance": metrics.LayerBalance,
    "epx_balance": metrics.Balance,
    "epx_pt_tensor": pt.Tensor,
    "epx_model": trace.Model,
    "epx_model_info": trace.ModelInfo,
    "epx_trace_opts": trace.TraceOpts,
}


def _headers():
    if not (INCLUDE / "epx.h").is_file():
        pytest.skip("include/ not beside python/ (installed without the sources)")
    text = (INCLUDE / "epx.h").read_text()
    for h in sorted((INCLUDE / "epx").glob("*.h")):
        text += "\n" + h.read_text()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def struct_fields(text, name):
    m = re.search(r"typedef\s+struct\s+%s\s*\{(.*?)\}\s*%s\s*;" % (name, name), text, re.S)
    assert m, "struct %s not found in the headers" % name
    fields = []
    for decl in m.group(1).split(";"):
        decl = decl.strip()
        if not decl:
            continue
        decl = re.sub(r"\[[^\]]*\]", "", decl)  # arrays: keep the name
        fields.append(re.findall(r"[A-Za-z_]\w*", decl)[-1])
    return fields


@pytest.mark.parametrize("cname", sorted(MIRRORS))
def test_struct_mirrors_match_headers(cname):
    fields = struct_fields(_headers(), cname)
    # a trailing underscore dodges a Python keyword (pass_)
    assert [f.rstrip("_") for f, _ in MIRRORS[cname]._fields_] == fields


def test_option_versions_match_headers():
    text = _headers()
    # Every options struct's version is its size (include/epx.h), so the
    # binding's version is the size of its mirror, which must match C's.
    for macro, cname, value, mirror in (
            ("EPX_PLAN_OPTS_VERSION", "epx_plan_opts", planner.PLAN_OPTS_VERSION,
             planner.PlanOpts),
            ("EPX_TABLE_OPTS_VERSION", "epx_table_opts", dispatch.TABLE_OPTS_VERSION,
             dispatch.TableOpts),
            ("EPX_TRACE_OPTS_VERSION", "epx_trace_opts", trace.TRACE_OPTS_VERSION,
             trace.TraceOpts),
            ("EPX_INIT_OPTS_VERSION", "epx_init_opts", io.INIT_OPTS_VERSION, io.InitOpts)):
        m = re.search(r"#define\s+%s\s+\(\(uint32_t\)sizeof\((\w+)\)\)" % macro, text)
        assert m and m.group(1) == cname, macro
        assert value == ctypes.sizeof(mirror), macro
    m = re.search(r"#define\s+EPX_ERRMSG_MAX\s+(\d+)", text)
    assert int(m.group(1)) == _native.Error.msg.size


def test_status_codes_match_header():
    text = _headers()
    body = re.search(r"typedef enum epx_status \{(.*?)\} epx_status;", text, re.S).group(1)
    codes = dict((n, int(v)) for n, v in re.findall(r"EPX_(?:ERR_)?(\w+)\s*=\s*(\d+)", body))
    assert codes == {s.name: s.value for s in epx.Status}


def test_eplb_rules_match_header():
    text = _headers()
    body = re.search(r"typedef enum epx_eplb_rule \{(.*?)\} epx_eplb_rule;", text, re.S).group(1)
    rules = dict((n, int(v)) for n, v in re.findall(r"EPX_EPLB_RULE_(\w+)\s*=\s*(\d+)", body))
    assert rules == {k.upper().replace("-", "_"): v for k, v in epx.planner.EPLB_RULES.items()}


def test_bound_symbols_are_declared_and_exported():
    """Every C function the binding binds is declared in a header; those the
    foundation rooms provide must be exported by this libepx."""
    text = _headers()
    from pathlib import Path
    src = "".join(p.read_text() for p in Path(epx.__file__).parent.glob("*.py"))
    names = set(re.findall(r'fn\("(epx_\w+)"', src))
    assert names
    undeclared = sorted(n for n in names if not re.search(r"\b%s\s*\(" % n, text))
    assert not undeclared, "bound but not declared in include/: %s" % undeclared
    for n in ("epx_version", "epx_layout_create_from_map", "epx_mapping_read",
              "epx_counts_read", "epx_layout_init"):
        assert epx.has(n), n


def test_ll_engine_mirrors_match_headers():
    """epx.torch._ll's mirrors of the GPU engine's structs and constants
    (include/epx_comm.h, include/epx_comm_gpu.h, outside the MIRRORS' headers)."""
    pytest.importorskip("torch")
    from epx.torch import _ll
    paths = [INCLUDE / h for h in ("epx.h", "epx_comm.h", "epx_comm_gpu.h")]
    if not all(p.is_file() for p in paths):
        pytest.skip("include/ not beside python/ (installed without the sources)")
    text = "\n".join(p.read_text() for p in paths)
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    for cname, mirror in (("epx_ep_config", _ll.EpConfig), ("epx_gpu_ep_opts", _ll.GpuEpOpts),
                          ("epx_gpu_ep_views", _ll.GpuEpViews)):
        assert [f for f, _ in mirror._fields_] == struct_fields(text, cname), cname
    for macro, value in (("EPX_GPU_EP_INFO_BYTES", _ll.INFO_BYTES), ("EPX_GPU_EP_SEND", _ll.SEND),
                         ("EPX_GPU_EP_RECV", _ll.RECV), ("EPX_GPU_EP_IDS64", _ll.IDS64)):
        m = re.search(r"#define\s+%s\s+(\d+)" % macro, text)
        assert m and int(m.group(1)) == value, macro
    for name, value in (("EPX_DTYPE_F32", _ll.DTYPE_F32), ("EPX_DTYPE_BF16", _ll.DTYPE_BF16),
                        ("EPX_EP_MODE_LOW_LATENCY", _ll.MODE_LOW_LATENCY)):
        m = re.search(r"\b%s\s*=\s*(\d+)" % name, text)
        assert m and int(m.group(1)) == value, name
