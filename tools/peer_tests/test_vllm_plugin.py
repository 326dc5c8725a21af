"""epx's own test of its vLLM plugin (epx.vllm_plugin) through vLLM's own code,
run by tools/peer_test.py under its shim in mode "engine": vLLM's plugin
loader (vllm/plugins/__init__.py with vllm/envs.py), its policy table
(vllm/distributed/eplb/policy/__init__.py) and its DefaultEplbPolicy are the
release's files, taken from its sdist; epx comes in only through the
`vllm.general_plugins` entry point of the installed epx package, as it would
in a vLLM process. Each case is a fresh interpreter (vLLM loads plugins once
per process), which calls vLLM's load_general_plugins() and then imports
vLLM's EPLB_POLICIES, the table EplbState picks its policy from."""
import json
import os
import subprocess
import sys
import textwrap

import _epx_peer

VERSION = _epx_peer.VERSION

# One vLLM process: its own DefaultEplbPolicy kept aside, the plugins loaded
# by vLLM's loader, then the table read and both policies run on the same
# loads (random floats: no ties, where DeepSeek's sorts would be free to
# differ) for a few shapes, with and without the map in service.
PROCESS = textwrap.dedent("""
    import json, logging, sys
    import numpy as np
    import torch
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(name)s %(levelname)s %(message)s")
    from vllm.distributed.eplb.policy.default import DefaultEplbPolicy as vllms_own
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from vllm.distributed.eplb.policy import EPLB_POLICIES
    policy = EPLB_POLICIES["default"]
    out = {"policy": policy.__module__ + "." + policy.__qualname__, "same": [], "valid": []}
    rng = np.random.default_rng(2834)
    for L, E, P, groups, nodes, G in [(3, 16, 24, 4, 2, 8), (2, 12, 16, 4, 1, 4),
                                      (2, 20, 32, 5, 2, 8), (4, 8, 8, 1, 1, 4)]:
        w = torch.tensor(rng.random((L, E)) * 1000, dtype=torch.float32)
        args = [w, P, groups, nodes, G]
        if "{version}" >= "0.14":  # the map in service arrived in 0.14.0
            args.append(torch.tensor(np.tile(np.arange(P) % E, (L, 1))))
        for a in (args[:5], args):
            mine, ref = policy.rebalance_experts(*a), vllms_own.rebalance_experts(*a)
            mine = mine if isinstance(mine, tuple) else (mine,)
            ref = ref if isinstance(ref, tuple) else (ref,)
            # phy2log (and logcnt) slot for slot; log2phy as each expert's set
            # of slots: an expert's own replicas carry equal loads, a tie whose
            # replica-rank order vLLM's unstable sort leaves open (docs/TIES.md)
            same = [torch.equal(torch.as_tensor(x), torch.as_tensor(y))
                    for x, y in zip(mine, ref)]
            if len(mine) == 3:
                same[1] = torch.equal(torch.as_tensor(mine[1]).sort(-1).values,
                                      torch.as_tensor(ref[1]).sort(-1).values)
            out["same"].append(all(same))
            p2l = torch.as_tensor(mine[0])
            out["valid"].append(tuple(p2l.shape) == (L, P) and
                                all(set(r.tolist()) == set(range(E)) for r in p2l))
    print(json.dumps(out))
""").replace("{version}", VERSION if VERSION.count(".") == 2 and
             VERSION.split(".")[1].isdigit() and int(VERSION.split(".")[1]) >= 14 else "0.13")


def _process(algorithm, **env_more):
    env = dict(os.environ, **env_more)
    env.pop("EPX_VLLM_ALGORITHM", None)
    if algorithm is not None:
        env["EPX_VLLM_ALGORITHM"] = algorithm
    r = subprocess.run([sys.executable, "-c", PROCESS], env=env, capture_output=True, text=True)
    out = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None
    return r.returncode, out, r.stderr


def test_without_the_variable_vllm_keeps_its_own_policy():
    rc, out, err = _process(None)
    assert rc == 0, err
    assert out["policy"].endswith(".DefaultEplbPolicy") and not out["policy"].startswith("epx.")
    assert all(out["same"]) and all(out["valid"])
    assert "vllm.plugins.epx" not in err


def test_deepseek_is_epx_and_plans_as_vllm_does():
    rc, out, err = _process("deepseek")
    assert rc == 0, err
    assert out["policy"].startswith("epx.vllm.")  # epx's class in vLLM's own table
    assert all(out["valid"])
    assert all(out["same"]), out  # DeepSeek's EPLB: vLLM's placements, slot for slot
    assert "vllm.plugins.epx INFO epx: vLLM's EPLB policy 'default' is epx's now " \
           "(EPX_VLLM_ALGORITHM=deepseek" in err


def test_epx_is_epxs_planner():
    rc, out, err = _process("epx")
    assert rc == 0, err
    assert out["policy"].startswith("epx.vllm.Epx")
    assert all(out["valid"])
    assert not all(out["same"])  # a planner of its own, not DeepSeek's
    assert "EPX_VLLM_ALGORITHM=epx: epx's own planner" in err


def test_vllms_allowlist_is_honoured():
    """VLLM_PLUGINS names the plugins vLLM's loader may load: without epx,
    the variable alone changes nothing. (So the plugin is loaded by vLLM.)"""
    rc, out, err = _process("epx", VLLM_PLUGINS="some_other_plugin")
    assert rc == 0, err
    assert not out["policy"].startswith("epx.")
    rc, out, err = _process("epx", VLLM_PLUGINS="epx")
    assert rc == 0, err
    assert out["policy"].startswith("epx.vllm.Epx")


def test_a_bad_value_stops_vllm_naming_it():
    rc, out, err = _process("hierarchical")
    assert rc != 0
    assert "ValueError: EPX_VLLM_ALGORITHM='hierarchical' is not an epx EPLB algorithm" in err
    assert "choices: deepseek, epx" in err
