"""tools/peer_test.py and its shim (tools/peer_shim) on a made-up release:
the shim hands the test the release's code in mode engine and epx's drop-in
in mode epx, the counts come out of pytest's report, and an unreachable
package index skips with the reason."""
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO

TOOL = REPO / "tools" / "peer_test.py"


def _tool():
    spec = importlib.util.spec_from_file_location("peer_test", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fake_vllm(root):
    """A release tree with the files the shim reads, written by this test."""
    eplb = root / "vllm" / "distributed" / "eplb"
    (eplb / "policy").mkdir(parents=True)
    (eplb / "policy" / "abstract.py").write_text("class AbstractEplbPolicy:\n    pass\n")
    (eplb / "policy" / "default.py").write_text(textwrap.dedent("""\
        from .abstract import AbstractEplbPolicy

        class DefaultEplbPolicy(AbstractEplbPolicy):
            FAKE = True
        """))
    (eplb / "eplb_state.py").write_text(textwrap.dedent("""\
        import os  # a module-level statement the shim leaves out
        RAISE = 1 / 0 if os.environ.get("NEVER") else 0

        def compute_logical_maps(phy2log, n):
            return "maps", n

        def _compute_eplb_load_stats(x):
            return torch.as_tensor(x).sum(), np.float64(1)

        def other():
            raise AssertionError("not lifted")
        """))


TEST = textwrap.dedent("""\
    import os
    import pytest
    from vllm.distributed.eplb.policy.default import DefaultEplbPolicy
    from vllm.distributed.eplb.eplb_state import compute_logical_maps
    from vllm.distributed.eplb import eplb_state
    from vllm.platforms import current_platform

    def test_the_policy_of_the_mode():
        if os.environ["EPX_PEER_MODE"] == "engine":
            assert DefaultEplbPolicy.FAKE
        else:
            import epx.vllm
            assert DefaultEplbPolicy is epx.vllm.policy_for("0.34.0")

    def test_helpers_are_the_releases():
        assert compute_logical_maps(None, 3) == ("maps", 3)
        assert not hasattr(eplb_state, "other") and not current_platform.is_xpu()

    def test_skipped():
        pytest.skip("no such device here")

    def test_fails():
        assert False
    """)


@pytest.mark.parametrize("mode", ["engine", "epx"])
def test_shim_and_counts(tmp_path, mode):
    pytest.importorskip("torch")
    tool = _tool()
    src = tmp_path / "src"
    _fake_vllm(src)
    test = tmp_path / "test_fake.py"
    test.write_text(TEST)
    work = tmp_path / "work"
    work.mkdir()
    r = tool.run_pytest(sys.executable, test, src, "0.34.0", mode, work)
    assert (r["passed"], r["failed"], r["skipped"]) == (2, 1, 1), r["log"]
    assert r["skips"] == ["test_skipped: no such device here"]


def test_unreachable_index_skips_with_the_reason(tmp_path):
    env = dict(os.environ, EPX_PEER_INDEX="http://127.0.0.1:9/simple")
    r = subprocess.run([sys.executable, str(TOOL), "--only", "vllm", "--cache",
                        str(tmp_path), "--python", sys.executable], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SKIP" in r.stdout
    if importlib.util.find_spec("torch"):
        # test_eplb_algo.py of five releases, the plugin's test of three
        assert r.stdout.count("PyPI unreachable (http://127.0.0.1:9/simple/vllm/") == 8
        assert r.stdout.count("test_vllm_plugin.py: PyPI unreachable") == 3


def test_sglang_test_file_absent_skips_saying_where(tmp_path):
    env = dict(os.environ, EPX_PEER_INDEX="http://127.0.0.1:9/simple")
    env.pop("EPX_SGLANG_TEST", None)
    r = subprocess.run([sys.executable, str(TOOL), "--only", "sglang", "--versions", "0.5.16",
                        "--cache", str(tmp_path), "--python", sys.executable],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0
    if importlib.util.find_spec("torch"):
        assert "--sglang-test" in r.stdout and "not on PyPI" in r.stdout
