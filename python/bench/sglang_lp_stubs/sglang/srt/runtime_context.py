"""epx's stub for `sglang.srt.runtime_context` (python/bench/sglang_lp_stubs).

The real module holds the server's process-wide context and imports its
argument groups. sglang.srt.eplb.lplb_solver reads one thing from it,
get_resources().lplb_solvers, a dict of the per-layer solvers that its
get/set/clear_global_lplb_solver helpers use; the benchmark constructs
LPLBSolver directly, so a plain dict is all that is needed."""
import types

_RESOURCES = types.SimpleNamespace(lplb_solvers={})


def get_resources():
    return _RESOURCES
