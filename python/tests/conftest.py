"""Shared fixtures: where the repository and shared/golden are.

shared/ sits beside the repository (../shared from its root, as CTest passes
it) or wherever $EPX_SHARED points. Tests that need it skip cleanly without it.
"""
import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def shared_dir():
    env = os.environ.get("EPX_SHARED")
    return Path(env) if env else REPO.parent / "shared"


GOLDEN = shared_dir() / "golden"
EPLB = GOLDEN / "eplb"
PT = GOLDEN / "pt"


def eplb_cases():
    idx = EPLB / "index.json"
    if not idx.is_file():
        return []
    return json.loads(idx.read_text())["cases"]


@pytest.fixture
def golden_case():
    """Load one golden EPLB case by name (skips when shared/golden is absent)."""
    def load(name):
        p = EPLB / (name + ".json")
        if not p.is_file():
            pytest.skip("shared/golden not found at %s (set EPX_SHARED)" % GOLDEN)
        return json.loads(p.read_text())
    return load


def pytest_report_header(config):
    import epx
    return "epx %s, libepx %s from %s; golden: %s" % (
        epx.__version__, epx.version(), epx.library_path(),
        GOLDEN if GOLDEN.is_dir() else "absent")
