#!/usr/bin/env python3
"""Where a kernel's time goes, by source line, from Nsight Compute's samples.

`ncu --page source --print-source sass --csv` lists every SASS instruction of
every profiled launch with its warp-stall samples and executed count, by
absolute address and without source lines (the CLI does not correlate them),
and is tens of MB. Two steps:

  on the GPU machine (python3 alone):
    ncu --section WarpStateStats --section SourceCounters --warp-sampling-interval 0 \\
        --cache-control none --clock-control none -k regex:dispatch_kernel -o rep CMD...
    ncu -i rep.ncu-rep --page source --csv --print-source sass > /tmp/all.csv
    scripts/ncu_lines.py filter /tmp/all.csv $OUT/hot.csv       (rows with samples or executions)

  here, with the same binary (its cubin's line table, read by nvdisasm -g):
    scripts/ncu_lines.py map hot.csv build/epx --kernel dispatch_kernel

`map` sums each source line's samples (all and not issued) and executed
warp-instructions over the launches of the kernel, per launch, and prints the
top lines. A launch is a run of rows of one kernel whose addresses ascend; an
instruction's offset is its address minus its launch's first row's (the
first instruction always executes). `--reasons` adds each line's three
largest stall reasons and the kernel's samples by reason; `--busy` leaves out
the samples of warps waiting at a barrier (`stall_barrier`), so that a block
whose few busy warps keep the rest waiting ranks the busy warps' lines.
"""
import argparse
import collections
import csv
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = "Warp Stall Sampling (All Samples)"
NOT_ISSUED = "Warp Stall Sampling (Not-issued Samples)"
EXECUTED = "Instructions Executed"


def to_int(v):
    try:
        return int(str(v).replace(",", "") or 0)
    except ValueError:
        return 0


def filter_rows(lines):
    """(kernel, address, sass, samples, not issued, executed, reasons) of the
    rows of an ncu source page (csv rows) that were sampled or executed;
    reasons: the row's samples by stall reason, "barrier=12;wait=3" (the
    page's stall_* columns of all samples, where it has them)."""
    kernel, cols, stalls = None, None, []
    for r in lines:
        if not r:
            continue
        if r[0] == "Kernel Name":
            kernel = r[1]
        elif r[0] == "Address":
            cols = (r.index(SAMPLES), r.index(NOT_ISSUED), r.index(EXECUTED))
            stalls = [(i, h[len("stall_"):]) for i, h in enumerate(r)
                      if h.startswith("stall_") and "Not Issued" not in h]
        elif cols is not None and kernel is not None and len(r) > max(cols):
            s, n, e = (to_int(r[c]) for c in cols)
            if s or e:
                why = ";".join("%s=%d" % (name, to_int(r[i])) for i, name in stalls
                               if i < len(r) and to_int(r[i]))
                yield kernel, r[0], r[1], s, n, e, why


def parse_reasons(text):
    """{reason: samples} of filter_rows's reasons field."""
    out = collections.Counter()
    for part in filter(None, (text or "").split(";")):
        name, _, v = part.partition("=")
        out[name] += to_int(v)
    return out


def launches(rows):
    """Rows grouped into launches: [(kernel, [(offset, sass, s, n, e, reasons)])]."""
    out, prev = [], None
    for kernel, addr, sass, s, n, e, *why in rows:
        a = int(addr, 16)
        if prev is None or kernel != prev[0] or a < prev[1]:
            out.append((kernel, a, []))
        out[-1][2].append((a - out[-1][1], sass, s, n, e, why[0] if why else ""))
        prev = (kernel, a)
    return [(k, rows_) for k, _, rows_ in out]


def opcode(sass):
    """The instruction's mnemonic without modifiers or predicate: 'BAR' of
    '@P0 BAR.SYNC.DEFER_BLOCKING 0x0', 'ERRBAR' of nvdisasm's 'ERRBAR;' (an
    instruction without operands carries its semicolon)."""
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0].rstrip(";") if words else ""


def line_table(disasm_text):
    """{function: {offset: ((file, line), mnemonic)}} from `nvdisasm -g -c`."""
    table, fn, loc = {}, None, None
    for l in disasm_text.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", l)
        if m:
            fn = m.group(1)
            table[fn] = {}
            continue
        m = re.search(r'//## File "([^"]+)", line (\d+)', l)
        if m:
            loc = (os.path.basename(m.group(1)), int(m.group(2)))
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(\S.*)", l)
        if fn and m:
            table[fn][int(m.group(1), 16)] = (loc, opcode(m.group(2)))
    return table


def tool(name):
    """cuobjdump / nvdisasm: CUDA's, else PATH's (PyPI's nvidia-cuda-cuobjdump and
    nvidia-cuda-nvdisasm wheels hold both), else the ones the triton wheel ships."""
    found = shutil.which(name)
    if found and not os.access(os.path.join("/usr/local/cuda/bin", name), os.X_OK):
        return found
    for d in ["/usr/local/cuda/bin"] + glob.glob(os.path.join(
            ROOT, "build", "python", "venv", "lib", "python3*", "site-packages", "triton",
            "backends", "nvidia", "bin")):
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    sys.exit("ncu_lines: no %s (CUDA's bin/, or triton's in build/python/venv)" % name)


def disassemble(binary):
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([tool("cuobjdump"), "-xelf", "all", os.path.abspath(binary)], cwd=d,
                       check=True, capture_output=True)
        text = []
        for cubin in sorted(glob.glob(os.path.join(d, "*.cubin"))):
            text.append(subprocess.run([tool("nvdisasm"), "-g", "-c", cubin],
                                       capture_output=True, text=True).stdout)
    return "\n".join(text)


def by_line(groups, table, kernel, reasons=None):
    """Per source line, summed over the launches of `kernel` and divided by
    their number: [samples, not issued, executed]; and the launch count.
    Where `reasons` is a dict, it gets each line's samples by stall reason,
    per launch too."""
    fns = [f for f in table if kernel in f]
    agg, n = collections.defaultdict(lambda: [0, 0, 0]), 0
    for k, rows in groups:
        if kernel not in k:
            continue
        # the function whose instruction at each offset is the sampled one;
        # rows past its end (a __noinline__ callee placed after the kernel)
        # count under "?", as long as they are at most a tenth of the rows
        def matched(f):
            end = max(table[f])
            inside = [(o, sass) for o, sass, *_ in rows if o <= end]
            return len(inside) >= 0.9 * len(rows) and all(
                o in table[f] and table[f][o][1] == opcode(sass) for o, sass in inside)
        fn = next((f for f in fns if matched(f)), None)
        if fn is None:
            continue
        n += 1
        for off, sass, s, ni, e, *why in rows:
            ok = off in table[fn] and table[fn][off][1] == opcode(sass)
            loc = table[fn][off][0] if ok else None
            v = agg[loc]
            v[0] += s
            v[1] += ni
            v[2] += e
            if reasons is not None:
                reasons.setdefault(loc, collections.Counter()).update(
                    parse_reasons(why[0] if why else ""))
    if reasons is not None:
        for loc in reasons:
            reasons[loc] = {k: x / max(n, 1) for k, x in reasons[loc].items()}
    return {loc: [x / max(n, 1) for x in v] for loc, v in agg.items()}, n


def report(agg, why, n, kernel, top, reasons, busy):
    """map's lines: the top `top` source lines by samples (without the
    barrier's where busy), each with its three largest reasons and the
    totals by reason first where `reasons`."""
    if busy:  # the barrier's samples out of the ranking and the totals
        agg = {loc: [v[0] - why.get(loc, {}).get("barrier", 0)] + v[1:]
               for loc, v in agg.items()}
        why = {loc: {k: x for k, x in r.items() if k != "barrier"} for loc, r in why.items()}
    out = ["%s: %d launches; per launch: samples%s, not issued, warp-instructions executed"
           % (kernel, n, " (busy: no barrier)" if busy else "")]
    if reasons:
        total = collections.Counter()
        for r in why.values():
            total.update(r)
        whole = sum(total.values()) or 1
        out.append("by reason: " + ", ".join("%s %.1f%%" % (k, 100 * x / whole)
                                             for k, x in total.most_common(8)))
    for loc, v in sorted(agg.items(), key=lambda x: -x[1][0])[:top]:
        line = "%8.1f %8.1f %10.0f  %s" % (v[0], v[1], v[2], "%s:%d" % loc if loc else "?")
        if reasons:
            top3 = collections.Counter(why.get(loc, {})).most_common(3)
            line += "  [" + ", ".join("%s %.0f" % (k, x) for k, x in top3) + "]"
        out.append(line)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("filter")
    f.add_argument("source_csv")
    f.add_argument("out_csv")
    m = sub.add_parser("map")
    m.add_argument("hot_csv")
    m.add_argument("binary")
    m.add_argument("--kernel", required=True)
    m.add_argument("--top", type=int, default=30)
    m.add_argument("--reasons", action="store_true",
                   help="each line's three largest stall reasons, and the totals by reason")
    m.add_argument("--busy", action="store_true",
                   help="leave out the samples at a barrier (stall_barrier): rank the lines "
                   "by the rest")
    args = ap.parse_args()
    if args.cmd == "filter":
        if os.path.exists(args.out_csv) and os.path.samefile(args.source_csv, args.out_csv):
            sys.exit("ncu_lines: filter would write over its input %s: name another output"
                     % args.out_csv)
        with open(args.source_csv, newline="") as src, open(args.out_csv, "w", newline="") as dst:
            w = csv.writer(dst)
            for row in filter_rows(csv.reader(src)):
                w.writerow(row)
        return 0
    rows = [(r[0], r[1], r[2], to_int(r[3]), to_int(r[4]), to_int(r[5]),
             r[6] if len(r) > 6 else "") for r in csv.reader(open(args.hot_csv, newline=""))]
    why = {}
    agg, n = by_line(launches(rows), line_table(disassemble(args.binary)), args.kernel, why)
    if n == 0:
        sys.exit("ncu_lines: no launch of a kernel named like '%s' matches %s's code"
                 % (args.kernel, args.binary))
    if (args.reasons or args.busy) and not any(why.values()):
        sys.exit("ncu_lines: %s has no stall reasons (filtered by an older ncu_lines, or "
                 "a page without stall_* columns): filter the source page again"
                 % args.hot_csv)
    print("\n".join(report(agg, why, n, args.kernel, args.top, args.reasons, args.busy)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
