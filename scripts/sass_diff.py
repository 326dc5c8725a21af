#!/usr/bin/env python3
# Copyright the epx authors. Licensed under the Apache License, Version 2.0;
# you may use this file only in compliance with that license, a copy of which
# is at http://www.apache.org/licenses/LICENSE-2.0. It is distributed "AS IS",
# without warranties or conditions of any kind.
"""Which kernels a change touched, from two builds' machine code.

    scripts/sass_diff.py OLD/libepx_cuda.so NEW/libepx_cuda.so [--match dispatch_kernel]

For every kernel in either library (those whose name matches --match, a
regular expression): whether its SASS is the same instruction for
instruction (encodings and control bits included; addresses and the
anonymous namespace's hash left out), its instruction count, and its
registers and stack bytes a thread in both builds (cuobjdump -res-usage).
A change whose kernels all read "same" needs no new timing; a kernel whose
stack grew spills more. Exits 1 when any matched kernel differs. cuobjdump
comes from PATH or $CUOBJDUMP.
"""
import argparse
import os
import re
import subprocess
import sys

HASH = re.compile(r"_GLOBAL__N__[0-9a-f]+_")
ADDRESS = re.compile(r"/\*[0-9a-f]*\*/")


def kernel_sass(text):
    """{kernel: [lines]} from `cuobjdump -sass` output, each line without
    its address comment (its encoding, control bits included, stays: code
    that schedules differently differs)."""
    out, name = {}, None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            name = HASH.sub("_G_", m.group(1))
            out[name] = []
        elif name is not None and "identifier" not in line:
            ins = ADDRESS.sub("", line).strip()
            if ins and not ins.startswith(".") and ins != "..........":
                out[name].append(ins)
    return out


def kernel_resources(text):
    """{kernel: (registers, stack bytes)} from `cuobjdump -res-usage` output."""
    out, name = {}, None
    for line in text.splitlines():
        m = re.search(r"Function (\S+):", line)
        if m:
            name = HASH.sub("_G_", m.group(1))
            continue
        if name is not None:
            reg = re.search(r"REG:(\d+)", line)
            stack = re.search(r"STACK:(\d+)", line)
            if reg:
                out[name] = (int(reg.group(1)), int(stack.group(1)) if stack else 0)
                name = None
    return out


def short(name):
    """A kernel's name from its kernel-name part on (namespaces dropped)."""
    m = re.search(r"\d+([a-z_]*kernel\w*)", name)
    return m.group(1) if m else name


def compare(old_sass, new_sass, old_res, new_res, match=None):
    """Rows (status, kernel, old count, new count, old (reg, stack), new
    (reg, stack)) for every kernel of either build matching `match`."""
    rows = []
    for k in sorted(set(old_sass) | set(new_sass)):
        if match and not re.search(match, k):
            continue
        a, b = old_sass.get(k), new_sass.get(k)
        status = "same" if a == b else "only new" if a is None else "only old" if b is None else "DIFF"
        rows.append((status, k, len(a or []), len(b or []), old_res.get(k), new_res.get(k)))
    return rows


def cuobjdump(lib, flag):
    exe = os.environ.get("CUOBJDUMP", "cuobjdump")
    try:
        return subprocess.run([exe, flag, lib], check=True, capture_output=True, text=True).stdout
    except FileNotFoundError:
        sys.exit(f"sass_diff: {exe} not found: put CUDA's bin on PATH or set CUOBJDUMP")
    except subprocess.CalledProcessError as e:
        sys.exit(f"sass_diff: {exe} {flag} {lib} failed: {e.stderr.strip()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--match", help="only kernels whose mangled name matches this regex")
    args = ap.parse_args()
    for lib in (args.old, args.new):
        if not os.path.isfile(lib):
            sys.exit(f"sass_diff: {lib}: no such file (give two builds' libepx_cuda.so)")
    rows = compare(kernel_sass(cuobjdump(args.old, "-sass")), kernel_sass(cuobjdump(args.new, "-sass")),
                   kernel_resources(cuobjdump(args.old, "-res-usage")),
                   kernel_resources(cuobjdump(args.new, "-res-usage")), args.match)
    if not rows:
        sys.exit(f"sass_diff: no kernel matches {args.match!r}")
    fmt = lambda r: "-" if r is None else f"{r[0]} reg {r[1]} B stack"
    for status, k, na, nb, ra, rb in rows:
        print(f"{status:8} {short(k)[:70]:70} {na:6} -> {nb:6}  {fmt(ra)} -> {fmt(rb)}")
    differs = sum(r[0] != "same" for r in rows)
    print(f"sass_diff: {differs} of {len(rows)} kernels differ")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
