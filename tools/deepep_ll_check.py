#!/usr/bin/env python3
# Copyright the epx authors. Licensed under the Apache License, Version 2.0;
# you may use this file only in compliance with that license, a copy of which
# is at http://www.apache.org/licenses/LICENSE-2.0. It is distributed "AS IS",
# without warranties or conditions of any kind.
"""Run DeepEP's own low-latency test (tests/legacy/test_low_latency.py) or
its normal-mode test (tests/legacy/test_intranode.py, --test intranode)
against epx.torch.Buffer, with N processes sharing one GPU (or, with
--own-gpus, each on a GPU of its own).

    python3 tools/deepep_ll_check.py [--deepep DIR] [--test low_latency|intranode]
        [--own-gpus] --num-processes N [--timeout S] [-- TEST ARGS]

DIR (default .deepep, written by tools/stage_deepep.sh, never committed) holds
DeepEP's test and deep_ep/utils/ as plain files. A temporary package named
deep_ep is built from them: our __init__ exports epx.torch's Buffer and
EventOverlap and topk_idx_t = torch.int64, our _C is a placeholder for
DeepEP's extension (its utils import EventHandle from it), and DeepEP's
utils/*.py are copied unchanged. Importing it, as every spawned process does,
changes only what sharing one GPU needs, nothing in the test's checks (with
--own-gpus nothing at all: NCCL and a GPU per rank, as DeepEP runs it):
  - utils.envs.init_dist runs as DeepEP wrote it, with backend "gloo" (no
    device_id) and torch.cuda.set_device(0) in every process;
  - torch.distributed's all_reduce, all_gather, all_gather_into_tensor and
    broadcast run on CPU copies of CUDA tensors under gloo, copied back.
"""
import os
import re
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

TOOL = os.path.abspath(__file__)
TESTS = {name: os.path.join("tests", "legacy", "test_%s.py" % name)
         for name in ("low_latency", "intranode")}

# ---- the patches, installed by the shim's __init__ in every process ---------


class _Done:  # the Work of an async_op collective that already finished
    def wait(self, *_):
        return True


def _on_device(t):  # a seam for the CPU dry-check
    return t.is_cuda


def _via_host(args):
    import torch
    import torch.distributed as dist
    flat = [t for a in args for t in (a if isinstance(a, (list, tuple)) else (a,))
            if isinstance(t, torch.Tensor)]
    return dist.is_initialized() and dist.get_backend() == "gloo" and any(map(_on_device, flat))


def _host_copy(t, moved):
    import torch
    if isinstance(t, list):
        return [_host_copy(x, moved) for x in t]
    if isinstance(t, torch.Tensor) and _on_device(t):
        moved.append((t, torch.empty(t.shape, dtype=t.dtype, device="cpu").copy_(t)))
        return moved[-1][1]
    return t


def _in_place(orig):
    def collective(*args, **kwargs):
        if not _via_host(list(args) + list(kwargs.values())):
            return orig(*args, **kwargs)
        moved = []
        work = orig(*[_host_copy(a, moved) for a in args],
                    **{k: _host_copy(v, moved) for k, v in kwargs.items()})
        if work is not None:
            work.wait()
        for dev, host in moved:
            dev.copy_(host)
        return work
    return collective


def _gather_into(orig_all_gather, orig):
    # Gloo takes only a [world * n, ...] output; the test's [world, n, ...]
    # is one NCCL accepts. Gather a list, then fill the output in rank order.
    def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
        import torch
        import torch.distributed as dist
        if not _via_host([output_tensor, input_tensor]):
            return orig(output_tensor, input_tensor, group=group, async_op=async_op)
        src = _host_copy(input_tensor, [])
        parts = [torch.empty_like(src) for _ in range(dist.get_world_size(group))]
        orig_all_gather(parts, src, group=group)
        output_tensor.copy_(torch.cat([p.reshape(-1) for p in parts]).view(output_tensor.shape))
        return _Done() if async_op else None
    return all_gather_into_tensor


def _one_gpu(orig_init_dist):
    def init_dist(*args, **kwargs):
        import torch
        import torch.distributed as dist
        real_init, real_set = dist.init_process_group, torch.cuda.set_device

        def init_gloo(*a, **kw):
            kw.pop("device_id", None)
            kw["backend"] = "gloo"
            return real_init(*a[1:], **kw)  # a[0], if given, was the backend
        dist.init_process_group, torch.cuda.set_device = init_gloo, lambda _dev: real_set(0)
        try:
            return orig_init_dist(*args, **kwargs)
        finally:
            dist.init_process_group, torch.cuda.set_device = real_init, real_set
    return init_dist


# The Buffer calls each rank made, printed when the test destroys its buffer:
# --shrink-test checks without printing, so this line is what shows that a
# survivor went through its loops (and a stopped rank did not).
COUNTED = ("low_latency_dispatch", "low_latency_combine", "clean_low_latency_buffer",
           "low_latency_query_mask_buffer")
CALLS_LINE = "epx-shim calls:"


def _count_calls(buffer_cls):
    import torch.distributed as dist
    calls = dict.fromkeys(COUNTED, 0)

    def counted(name, orig):
        def call(self, *args, **kwargs):
            calls[name] += 1
            return orig(self, *args, **kwargs)
        return call

    for name in COUNTED:
        setattr(buffer_cls, name, counted(name, getattr(buffer_cls, name)))
    orig_destroy = buffer_cls.destroy

    def destroy(self, *args, **kwargs):
        print("[rank %d] %s %s" % (dist.get_rank(), CALLS_LINE,
                                   " ".join("%s=%d" % kv for kv in calls.items())), flush=True)
        return orig_destroy(self, *args, **kwargs)

    buffer_cls.destroy = destroy


# Set by the runner for --own-gpus in every process it starts.
OWN_GPUS = "EPX_DEEPEP_OWN_GPUS"


def shares_one_gpu(env=os.environ):
    """Whether the ranks share GPU 0 (the patches below), or each has its own."""
    return env.get(OWN_GPUS) != "1"


def install(envs, buffer_cls=None):
    """Patch torch.distributed and DeepEP's utils.envs, once a process: for
    ranks sharing one GPU; ranks on GPUs of their own only count calls."""
    import torch.distributed as dist
    if not getattr(dist, "_epx_shim", False):
        dist._epx_shim = True
        if shares_one_gpu():
            dist.all_gather_into_tensor = _gather_into(dist.all_gather,
                                                       dist.all_gather_into_tensor)
            for name in ("all_reduce", "all_gather", "broadcast"):
                setattr(dist, name, _in_place(getattr(dist, name)))
            envs.init_dist = _one_gpu(envs.init_dist)
        if buffer_cls is not None:
            _count_calls(buffer_cls)


# ---- the shim package ----------------------------------------------------------

SHIM_INIT = '''# Written by epx's tools/deepep_ll_check.py: DeepEP's tests on epx.torch.Buffer.
import importlib.util as _iu, sys as _sys, torch as _torch
from epx.torch import Buffer, Config, EventOverlap
topk_idx_t = _torch.int64
if "_epx_ll_check" not in _sys.modules:
    _spec = _iu.spec_from_file_location("_epx_ll_check", %r)
    _sys.modules["_epx_ll_check"] = _iu.module_from_spec(_spec)
    _spec.loader.exec_module(_sys.modules["_epx_ll_check"])
from .utils import envs as _envs
_sys.modules["_epx_ll_check"].install(_envs, Buffer)
'''
SHIM_C = '''# Written by epx's tools/deepep_ll_check.py: no DeepEP C++ extension here.
class EventHandle:
    def __init__(self, *_a, **_k):
        raise NotImplementedError("deep_ep._C.EventHandle: not in the epx shim")
def __getattr__(name):
    raise AttributeError("deep_ep._C.%s: DeepEP's extension is not in the epx shim" % name)
'''


def build_shim(deepep, dest):
    pkg = os.path.join(dest, "deep_ep")
    shutil.copytree(os.path.join(deepep, "deep_ep", "utils"), os.path.join(pkg, "utils"),
                    ignore=lambda d, names: [n for n in names if not n.endswith(".py")])
    for name, text in (("__init__.py", SHIM_INIT % TOOL), ("_C.py", SHIM_C)):
        with open(os.path.join(pkg, name), "w") as f:
            f.write(text)


# ---- running the test and reading its output -----------------------------------

# What each rank prints once a part of the test is through: the first line
# comes after every dispatch/combine check of test_main and the bench() run.
STAGES = (("checks+bench", "] Dispatch + combine bandwidth"),
          ("kineto", "] Dispatch bandwidth:"), ("kineto-hook", "] Dispatch send/recv time"))


def rank_segments(lines):
    """Each '[rank N] ...' report as a line of its own: the ranks print at
    once, so one rank's report can run into another's line (seen on the
    H200: '...max_t=4515.23 us[rank 0] Dispatch + combine bandwidth: ...')."""
    return [seg for l in lines for seg in re.split(r"(?=\[rank \d+\] )", l) if seg]


def calls_of(lines, r):
    """Rank r's counted Buffer calls, or None where it printed none. The
    ranks print at once, so another rank's line may run into this one's (seen
    on the H200: '...=0[rank 0] epx-shim calls: ...'): the report is found
    anywhere in a line and ends where the next rank's begins."""
    tag = "[rank %d] %s" % (r, CALLS_LINE)
    for l in lines:
        at = l.find(tag)
        if at >= 0:
            rest = l[at + len(tag):].split("[rank ", 1)[0]
            return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", rest)}
    return None


def verdict(rc, n, done, calls, stopped):
    """PASS only when the run exited 0 AND showed its work: without
    --shrink-test every rank printed its bench line (which comes after all
    its checks); with it every survivor reported the same calls, mask
    queries among them, and every stopped rank fewer dispatches."""
    if rc != 0:
        return "TIMEOUT" if rc == 124 else "FAIL"
    if not stopped:
        return "PASS" if all(STAGES[0][0] in done[r] for r in range(n)) else "FAIL (no checks ran)"
    survivors = [r for r in range(n) if r not in stopped]
    seen = [calls[r] for r in survivors]
    if not survivors or None in seen or seen[0]["low_latency_query_mask_buffer"] == 0 \
            or any(c != seen[0] for c in seen):
        return "FAIL (survivors did not all run the shrink checks)"
    if any(calls[r] is None or calls[r]["low_latency_dispatch"] >= seen[0]["low_latency_dispatch"]
           for r in stopped):
        return "FAIL (a stopped rank went on)"
    return "PASS"


def summarise_intranode(lines, rc, n, extra):
    """test_intranode.py prints from rank 0 only: a '[testing] ... passed'
    line per checked combination, then its tuning, whose last line ('Best
    combine') comes after every check of every rank (each check asserts)."""
    passed = [l for l in lines if l.startswith("[testing]") and l.endswith(" passed")]
    errors = [l for l in lines if re.match(r"^[\w.]*(Error|Exception)\b", l)]
    where = [(l.strip(), lines[i + 1].strip() if i + 1 < len(lines) else "")
             for i, l in enumerate(lines) if "test_intranode.py\", line" in l]
    print("\n==== DeepEP test_intranode.py on epx.torch.Buffer: %d processes on one GPU%s"
          % (n, ", test args: " + " ".join(extra) if extra else ""))
    print("checked combinations passed (rank 0's lines): %d" % len(passed))
    if where:
        print("last test line in a traceback: %s\n    %s" % where[-1])
    if errors:
        print("error: %s" % errors[-1])
    done = passed and any("[tuning] Best combine" in l for l in lines)
    result = ("TIMEOUT" if rc == 124 else "FAIL") if rc else \
        "PASS" if done else "FAIL (the checks or the tuning did not run)"
    print("RESULT: %s (exit code %d)" % (result, rc))
    return result


def summarise(lines, rc, n, extra):
    said = rank_segments(lines)
    done = {r: [s for s, key in STAGES if any(l.startswith("[rank %d]" % r) and key in l
                                               for l in said)] for r in range(n)}
    calls = {r: calls_of(lines, r) for r in range(n)}
    errors = [l for l in lines if re.match(r"^[\w.]*(Error|Exception)\b", l)]
    where = [(l.strip(), lines[i + 1].strip() if i + 1 < len(lines) else "")
             for i, l in enumerate(lines) if "test_low_latency.py\", line" in l]
    failed = sorted({m.group(1) for l in lines for m in [re.search(r"-- Process (\d+) term", l)]
                     if m})
    print("\n==== DeepEP test_low_latency.py on epx.torch.Buffer: %d processes on one GPU%s"
          % (n, ", test args: " + " ".join(extra) if extra else ""))
    print("all dispatch/combine checks passed on ranks: %s"
          % ([r for r in range(n) if STAGES[0][0] in done[r]] or "none"))
    for r in range(n):
        print("  rank %d finished: %s" % (r, ", ".join(done[r]) or "nothing"))
    stopped = [l.strip() for l in lines if "failed when first calling" in l]
    stopped_ranks = {int(m.group(1)) for l in stopped for m in [re.match(r"Rank (\d+) ", l)] if m}
    if stopped:  # --shrink-test: the ranks the test stops on purpose
        print("simulated failures: %s" % "; ".join(stopped))
        for r in range(n):
            print("  rank %d %s: %s" % (r, "(stopped)" if r in stopped_ranks else "(survivor)",
                                       " ".join("%s=%d" % kv for kv in calls[r].items())
                                       if calls[r] else "no calls reported"))
    seeds = sum("Testing with seed" in l for l in lines)
    if seeds:
        print("pressure test: %d seed(s) started" % seeds)
    if failed:
        print("failed process(es): %s" % ", ".join(failed))
    if where:
        print("last test line in a traceback: %s\n    %s" % where[-1])
    if errors:
        print("error: %s" % errors[-1])
    result = verdict(rc, n, done, calls, stopped_ranks)
    print("RESULT: %s (exit code %d)" % (result, rc))
    return result


def visible_gpus():
    """The GPUs this machine shows (nvidia-smi -L), 0 without one."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


def main(argv):
    if argv[:1] == ["--inner"]:  # the test's own process: it runs as __main__
        sys.path[:] = [d for d in sys.path if os.path.abspath(d) != os.path.dirname(TOOL)]
        # the test's own folder, as `python3 tests/legacy/test_X.py` has it
        # (test_intranode.py imports test_low_latency from there)
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[1])))
        sys.argv = argv[1:]
        runpy.run_path(argv[1], run_name="__main__")
        return 0
    cut = argv.index("--") if "--" in argv else len(argv)
    argv, extra = argv[:cut], argv[cut + 1:]
    import argparse
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--deepep", default=os.path.join(os.path.dirname(os.path.dirname(TOOL)),
                                                    ".deepep"), help="DeepEP files (.deepep)")
    p.add_argument("--test", choices=sorted(TESTS), default="low_latency",
                   help="which DeepEP test (default low_latency)")
    p.add_argument("--num-processes", type=int, required=True, help="processes (ranks)")
    p.add_argument("--own-gpus", action="store_true",
                   help="each process on a GPU of its own (NCCL, as DeepEP runs its test); "
                        "without it every process shares GPU 0")
    p.add_argument("--timeout", type=int, default=0, help="stop the run after S seconds")
    a = p.parse_args(argv)
    test = os.path.join(a.deepep, TESTS[a.test])
    if not os.path.isfile(test) or not os.path.isdir(os.path.join(a.deepep, "deep_ep", "utils")):
        p.error("%s lacks %s or deep_ep/utils/: run tools/stage_deepep.sh"
                % (a.deepep, TESTS[a.test]))
    if a.num_processes < 1 or "--num-processes" in extra:
        p.error("give --num-processes N (N >= 1) to this tool, not after --")
    if a.own_gpus:
        gpus = visible_gpus()
        if gpus < a.num_processes:
            p.error("--own-gpus with --num-processes %d needs %d GPUs; %d are visible: give "
                    "--num-processes %d or fewer, or drop --own-gpus to share one"
                    % (a.num_processes, a.num_processes, gpus, max(gpus, 1)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="epx-deepep-") as tmp:
        build_shim(a.deepep, tmp)
        path = [tmp] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="1",
                   RANK="0", NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join(path))
        if a.own_gpus:
            env[OWN_GPUS] = "1"
        env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        env.setdefault("NVSHMEM_DISABLE_NVLS", "1")
        if "lo" in [name for _, name in socket.if_nameindex()]:
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every process is on this host
        cmd = [sys.executable, TOOL, "--inner", test, "--num-processes", str(a.num_processes)]
        proc = subprocess.Popen(cmd + extra, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        if a.timeout:  # the spawned ranks share the runner's process group
            signal.signal(signal.SIGALRM, lambda *_: os.killpg(proc.pid, signal.SIGKILL))
            signal.alarm(a.timeout)
        lines = []
        for line in proc.stdout:
            sys.stdout.write(line)
            lines.append(line.rstrip("\n"))
        rc = proc.wait()
        signal.alarm(0)
    rc = 124 if rc == -signal.SIGKILL and a.timeout else rc if rc >= 0 else 128 - rc
    result = (summarise_intranode if a.test == "intranode" else summarise)(
        lines, rc, a.num_processes, extra)
    return rc if rc != 0 or result == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
