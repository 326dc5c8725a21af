# Copyright the epx authors. Licensed under the Apache License, Version 2.0;
# you may use this file only in compliance with that license, a copy of which
# is at http://www.apache.org/licenses/LICENSE-2.0. It is distributed "AS IS",
# without warranties or conditions of any kind.
"""scripts/ncu_lines.py on canned input: Nsight Compute's source page (two
launches of one kernel, one of another) and nvdisasm's line table; the
samples land on the right source lines, per launch."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("ncu_lines",
                                               os.path.join(ROOT, "scripts", "ncu_lines.py"))
nl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nl)

HDR = ["Address", "Source", nl.SAMPLES, nl.NOT_ISSUED, "# Samples", nl.EXECUTED]


def page(kernel, base, rows):
    out = [["Kernel Name", kernel], HDR]
    for off, sass, s, n, e in rows:
        out.append([hex(base + off), sass, str(s), str(n), str(s), "{:,}".format(e)])
    return out


DISASM = """
\t.text._Z8dispatchv:
        //## File "/src/comm/gpu/ll_ep.cu", line 10
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
        //## File "/src/core/numeric.h", line 43
        /*0020*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
\t.text._Z7combinev:
        //## File "/src/comm/gpu/ll_ep.cu", line 99
        /*0000*/                   LDC R1, c[0x0][0x28] ;
"""


def test_samples_land_on_source_lines_per_launch():
    csv_rows = (page("dispatch(Args)", 0x7f0000001000,
                     [(0x00, "LDC R1, c[0x0][0x28]", 0, 0, 512), (0x10, "S2R R0, SR_TID.X", 2, 1, 512),
                      (0x20, "BAR.SYNC.DEFER_BLOCKING 0x0", 40, 40, 16),
                      (0x30, "EXIT", 0, 0, 0)])
                + page("dispatch(Args)", 0x7f0000001000,
                       [(0x00, "LDC R1, c[0x0][0x28]", 0, 0, 512),
                        (0x20, "BAR.SYNC.DEFER_BLOCKING 0x0", 20, 18, 16)])
                + page("combine(Args)", 0x7f0000009000, [(0x00, "LDC R1, c[0x0][0x28]", 5, 5, 8)]))
    hot = list(nl.filter_rows(csv_rows))
    # the unexecuted, unsampled EXIT is dropped; the thousands separator read
    assert len(hot) == 6 and all(h[5] in (512, 16, 8) for h in hot)
    groups = nl.launches(hot)
    assert [k for k, _ in groups] == ["dispatch(Args)", "dispatch(Args)", "combine(Args)"]
    agg, n = nl.by_line(groups, nl.line_table(DISASM), "dispatch")
    assert n == 2
    # LDC + S2R, then LDC alone: (1024 + 512) / 2 executed, (2 + 0) / 2 sampled
    assert agg[("ll_ep.cu", 10)] == [1.0, 0.5, 768.0]
    assert agg[("numeric.h", 43)] == [30.0, 29.0, 16.0]
    agg_c, n_c = nl.by_line(groups, nl.line_table(DISASM), "combine")
    assert n_c == 1 and agg_c[("ll_ep.cu", 99)] == [5.0, 5.0, 8.0]


def test_a_launch_from_other_code_is_not_counted():
    # another build's launches: an offset the kernel does not have, or
    # another instruction at one it has
    for rows in ([(0x00, "LDC R1, c[0x0][0x28]", 1, 1, 1), (0x40, "EXIT", 1, 1, 1)],
                 [(0x00, "LDC R1, c[0x0][0x28]", 1, 1, 1), (0x10, "IMAD R2, R0, R1", 1, 1, 1)]):
        groups = nl.launches(list(nl.filter_rows(page("dispatch(Args)", 0x1000, rows))))
        agg, n = nl.by_line(groups, nl.line_table(DISASM), "dispatch")
        assert n == 0 and agg == {}
    assert nl.opcode("@!P0 BRA 0x120") == "BRA" and nl.opcode("") == ""


def test_an_instruction_without_operands_matches_its_disassembly():
    # nvdisasm writes "ERRBAR;" with no space before the semicolon, Nsight
    # Compute "ERRBAR": a kernel with a fence once matched no launch at all
    text = DISASM.replace("        /*0020*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;",
                          "        /*0020*/                   ERRBAR;")
    rows = [(0x00, "LDC R1, c[0x0][0x28]", 1, 1, 4), (0x20, "@!P3  ERRBAR", 3, 3, 4)]
    groups = nl.launches(list(nl.filter_rows(page("dispatch(Args)", 0x1000, rows))))
    agg, n = nl.by_line(groups, nl.line_table(text), "dispatch")
    assert n == 1 and agg[("numeric.h", 43)] == [3.0, 3.0, 4.0]
    assert nl.opcode("ERRBAR;") == "ERRBAR" and nl.opcode("@!P3  ERRBAR") == "ERRBAR"


def test_a_callee_after_the_kernel_counts_apart():
    # ten samples inside the kernel, one at an address past its end (a
    # __noinline__ function the kernel calls): the launch counts, the
    # callee's samples under None
    rows = [(0x00, "LDC R1, c[0x0][0x28]", 1, 1, 1), (0x10, "S2R R0, SR_TID.X", 1, 1, 1)]
    rows += [(0x20, "BAR.SYNC.DEFER_BLOCKING 0x0", 1, 1, 1)] * 8 + [(0x200, "IADD3 R1", 7, 7, 3)]
    groups = nl.launches(list(nl.filter_rows(page("dispatch(Args)", 0x1000, rows))))
    agg, n = nl.by_line(groups, nl.line_table(DISASM), "dispatch")
    assert n == 1 and agg[None] == [7.0, 7.0, 3.0] and agg[("numeric.h", 43)][0] == 8.0
    # a wrong instruction inside the kernel still refuses the launch
    rows[1] = (0x10, "IMAD R2, R0, R1", 1, 1, 1)
    groups = nl.launches(list(nl.filter_rows(page("dispatch(Args)", 0x1000, rows))))
    assert nl.by_line(groups, nl.line_table(DISASM), "dispatch")[1] == 0


def test_filter_refuses_to_write_over_its_input(tmp_path):
    import subprocess
    import sys
    f = tmp_path / "page.csv"
    f.write_text("Kernel Name,k\n")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "ncu_lines.py"), "filter",
                        str(f), str(f)], capture_output=True, text=True)
    assert r.returncode != 0 and "over its input" in r.stderr
    assert f.read_text() == "Kernel Name,k\n"  # untouched


def test_stall_reasons_per_line_and_busy():
    # a page with stall_* columns (all samples, and the not-issued ones the
    # filter leaves out): each line gets its samples by reason, per launch
    hdr = HDR + ["stall_barrier", "stall_wait", "stall_barrier (Not Issued)"]
    rows = [["Kernel Name", "dispatch(Args)"], hdr,
            ["0x1000", "LDC R1, c[0x0][0x28]", "3", "3", "3", "8", "0", "3", "0"],
            ["0x1010", "S2R R0, SR_TID.X", "0", "0", "0", "8", "0", "0", "0"],
            ["0x1020", "BAR.SYNC.DEFER_BLOCKING 0x0", "9", "9", "9", "8", "9", "0", "9"]]
    hot = list(nl.filter_rows(rows))
    assert [h[6] for h in hot] == ["wait=3", "", "barrier=9"]
    assert nl.parse_reasons("wait=3;barrier=9") == {"wait": 3, "barrier": 9}
    why = {}
    agg, n = nl.by_line(nl.launches(hot), nl.line_table(DISASM), "dispatch", why)
    assert n == 1 and why[("ll_ep.cu", 10)] == {"wait": 3.0}
    assert why[("numeric.h", 43)] == {"barrier": 9.0} and agg[("numeric.h", 43)][0] == 9.0
    # all samples: the barrier's line first; busy: the line with work first,
    # the barrier's at 0, and no barrier among the reasons
    plain = nl.report(agg, why, n, "dispatch", 2, True, False)
    assert plain[1] == "by reason: barrier 75.0%, wait 25.0%" and "numeric.h:43" in plain[2]
    busy = nl.report(agg, why, n, "dispatch", 2, True, True)
    assert busy[1] == "by reason: wait 100.0%"
    assert "ll_ep.cu:10  [wait 3]" in busy[2] and busy[3].split()[0] == "0.0"
    assert agg[("numeric.h", 43)][0] == 9.0  # report left the caller's figures alone
    # a row of an older filter's file (six columns) reads as no reasons
    six = nl.launches([h[:6] for h in hot])
    assert all(r[5] == "" for _, rows_ in six for r in rows_)
