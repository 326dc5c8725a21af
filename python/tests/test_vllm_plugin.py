"""epx's vLLM plugin (epx.vllm_plugin) against a small fake of vLLM's policy
table, in a fresh interpreter per case. The check against vLLM's own plugin
loader and policy table is tools/peer_tests/test_vllm_plugin.py (`make
peer-test`, which downloads the release)."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import epx
import epx.vllm

# The fake: vllm.__version__ and vllm.distributed.eplb.policy.EPLB_POLICIES,
# what the plugin touches, and nothing else.
FAKE = {
    "vllm/__init__.py": "__version__ = {version!r}\n",
    "vllm/distributed/__init__.py": "",
    "vllm/distributed/eplb/__init__.py": "",
    "vllm/distributed/eplb/policy/__init__.py":
        "class DefaultEplbPolicy:\n    pass\n\nEPLB_POLICIES = {'default': DefaultEplbPolicy}\n",
}

RUN = textwrap.dedent("""
    import json, logging, sys
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
    from epx.vllm_plugin import register
    cls = register()
    from vllm.distributed.eplb.policy import EPLB_POLICIES
    d = EPLB_POLICIES["default"]
    print(json.dumps({"returned": None if cls is None else cls.__name__,
                      "default": d.__module__ + "." + d.__qualname__}))
""")


def _run(tmp_path, algorithm, version="0.34.0", table=True):
    for rel, text in FAKE.items():
        if not table and "policy" in rel:
            continue
        f = tmp_path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text.replace("{version!r}", repr(version)))
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    env.pop("EPX_VLLM_ALGORITHM", None)
    if algorithm is not None:
        env["EPX_VLLM_ALGORITHM"] = algorithm
    r = subprocess.run([sys.executable, "-c", RUN], env=env, cwd=str(tmp_path),
                       capture_output=True, text=True)
    return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else None), r.stderr


def test_unset_or_empty_leaves_vllms_policy(tmp_path):
    for value in (None, "", "  "):
        rc, out, err = _run(tmp_path, value)
        assert rc == 0, err
        assert out == {"returned": None,
                       "default": "vllm.distributed.eplb.policy.DefaultEplbPolicy"}
        assert "epx" not in err


@pytest.mark.parametrize("algorithm,version,name", [
    ("deepseek", "0.34.0", "DefaultEplbPolicy"), ("epx", "0.34.0", "EpxEplbPolicy"),
    ("deepseek", "0.18.1", "TupleEplbPolicy"), ("epx", "0.14.0", "EpxTupleEplbPolicy"),
    ("deepseek", "0.13.0", "TupleEplbPolicy013"), ("epx", "0.13.0", "EpxTupleEplbPolicy013")])
def test_enabled_puts_epx_into_the_default_entry(tmp_path, algorithm, version, name):
    rc, out, err = _run(tmp_path, algorithm, version)
    assert rc == 0, err
    assert out == {"returned": name, "default": "epx.vllm." + name}
    line = [x for x in err.splitlines() if x.startswith("vllm.plugins.epx: ")]
    assert len(line) == 1, err
    assert "EPLB policy 'default' is epx's now" in line[0]
    assert "EPX_VLLM_ALGORITHM=%s" % algorithm in line[0] and "vLLM %s" % version in line[0]


def test_bad_value_names_it_and_the_choices(tmp_path):
    rc, out, err = _run(tmp_path, "deepseek_hierarchical")
    assert rc != 0
    assert "EPX_VLLM_ALGORITHM='deepseek_hierarchical' is not an epx EPLB algorithm" in err
    assert "choices: deepseek, epx" in err and "unset it" in err


def test_vllm_without_a_policy_table_is_refused(tmp_path):
    rc, out, err = _run(tmp_path, "epx", version="0.12.0")
    assert rc != 0 and "vLLM 0.12.0 has no policy class" in err and "0.13.0 or later" in err
    rc, out, err = _run(tmp_path / "b", "epx", table=False)
    assert rc != 0 and "has no EPLB policy table" in err and "unset EPX_VLLM_ALGORITHM" in err


def test_entry_point_is_installed():
    """pip install ./python registers the plugin where vLLM's loader looks."""
    from importlib.metadata import entry_points
    eps = entry_points()
    group = eps.select(group="vllm.general_plugins") if hasattr(eps, "select") \
        else eps.get("vllm.general_plugins", [])
    mine = [e for e in group if e.name == "epx"]
    if not mine and not epx.__file__.endswith(os.path.join("site-packages", "epx", "__init__.py")):
        pytest.skip("epx is imported from a source tree, not an installed package")
    assert [e.value for e in mine] == ["epx.vllm_plugin:register"]


def test_epx_policy_plans_with_epx_in_vllms_call_shape():
    rng = np.random.default_rng(28)
    w = rng.random((3, 16)) * 1000
    old = np.tile(np.arange(24) % 16, (3, 1))
    for cls in (epx.vllm.EpxEplbPolicy, epx.vllm.policy_for("0.34.0", "epx")):
        p2l = cls.rebalance_experts(w, 24, 4, 2, 8)
        assert p2l.shape == (3, 24) and p2l.dtype == np.int64
        assert all(set(row.tolist()) == set(range(16)) for row in p2l)
        kept = cls.rebalance_experts(w, 24, 4, 2, 8, old)
        assert sorted(map(tuple, np.sort(kept, axis=1))) == sorted(map(tuple, np.sort(p2l, axis=1)))
    p2l, l2p, cnt = epx.vllm.EpxTupleEplbPolicy.rebalance_experts(w, 24, 4, 2, 8)
    assert cnt.sum(axis=1).tolist() == [24, 24, 24]
    with pytest.raises(ValueError, match="'hier' is not one of deepseek, epx"):
        epx.vllm.policy_for("0.34.0", "hier")
