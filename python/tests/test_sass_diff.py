# Copyright the epx authors. Licensed under the Apache License, Version 2.0;
# you may use this file only in compliance with that license, a copy of which
# is at http://www.apache.org/licenses/LICENSE-2.0. It is distributed "AS IS",
# without warranties or conditions of any kind.
"""scripts/sass_diff.py on canned cuobjdump output: addresses, encodings and
the anonymous namespace's hash do not make kernels differ, an instruction
does; registers and stack are read per kernel; the exit status says whether
any kernel differs (with a fake cuobjdump on PATH)."""
import importlib.util
import os
import stat
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "sass_diff.py")
spec = importlib.util.spec_from_file_location("sass_diff", SCRIPT)
sd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sd)


def sass(hash_, body):
    lines = ["", "Fatbin elf code:", "================", "arch = sm_90", ""]
    for name, ins in body:
        lines.append(f"\t\tFunction : _ZN{hash_}15dispatch_kernel{name}")
        lines.append("\t.headerflags\t@\"EF_CUDA_SM90\"")
        for i, t in enumerate(ins):
            lines.append(f"        /*{i * 16:04x}*/                   {t} ;  /* 0x000000{i:02x}ff047984 */")
            lines.append("                                                  /* 0x000fe20000000000 */")
        lines.append("\t\t..........")
    return "\n".join(lines) + "\n"


def res(hash_, body):
    out = ["Resource usage:"]
    for name, reg, stack in body:
        out.append(f" Function _ZN{hash_}15dispatch_kernel{name}:")
        out.append(f"  REG:{reg} STACK:{stack} SHARED:0 LOCAL:0 CONSTANT[0]:592 TEXTURE:0 SURFACE:0 SAMPLER:0")
    return "\n".join(out) + "\n"


OLD = [("A", ["MOV R1, c[0x0][0x28]", "EXIT"]), ("B", ["LDG.E R2, desc[UR4][R2.64]", "EXIT"])]
NEW = [("A", ["MOV R1, c[0x0][0x28]", "EXIT"]), ("B", ["LDG.E R3, desc[UR4][R2.64]", "EXIT"])]


def test_hash_addresses_and_encodings_do_not_count():
    a = sd.kernel_sass(sass("_GLOBAL__N__aaaa_", OLD))
    b = sd.kernel_sass(sass("_GLOBAL__N__bbbb_", OLD))
    assert a == b
    ins = a["_ZN_G_15dispatch_kernelA"]
    assert ins[0].startswith("MOV R1, c[0x0][0x28] ;") and "/*0000*/" not in ins[0]
    # the encodings (control bits included) stay: code that schedules differently differs
    assert ins[0].endswith("/* 0x00000000ff047984 */") and len(ins) == 4


def test_an_address_shift_alone_does_not_count():
    a = sd.kernel_sass(sass("_GLOBAL__N__aaaa_", OLD))
    b = sd.kernel_sass(sass("_GLOBAL__N__aaaa_", OLD).replace("/*0010*/", "/*0110*/"))
    assert a == b


def test_one_register_name_makes_a_kernel_differ():
    a = sd.kernel_sass(sass("_GLOBAL__N__aaaa_", OLD))
    b = sd.kernel_sass(sass("_GLOBAL__N__bbbb_", NEW))
    ra = sd.kernel_resources(res("_GLOBAL__N__aaaa_", [("A", 64, 24), ("B", 64, 0)]))
    rb = sd.kernel_resources(res("_GLOBAL__N__bbbb_", [("A", 78, 0), ("B", 64, 0)]))
    rows = sd.compare(a, b, ra, rb)
    assert [(r[0], r[1][-1]) for r in rows] == [("same", "A"), ("DIFF", "B")]
    assert rows[0][4:] == ((64, 24), (78, 0))
    assert sd.compare(a, b, ra, rb, match="kernelA$")[0][0] == "same"
    assert sd.short("_ZN_G_15dispatch_kernelILb1EEEv") == "dispatch_kernelILb1EEEv"


def test_only_in_one_build():
    a = sd.kernel_sass(sass("_GLOBAL__N__aaaa_", OLD[:1]))
    b = sd.kernel_sass(sass("_GLOBAL__N__aaaa_", OLD))
    assert [r[0] for r in sd.compare(a, b, {}, {})] == ["same", "only new"]
    assert [r[0] for r in sd.compare(b, a, {}, {})] == ["same", "only old"]


def fake_cuobjdump(tmp_path, name, outputs):
    """A cuobjdump that prints outputs[(flag, lib basename)]."""
    exe = tmp_path / name
    table = {f"{flag} {lib}": text for (flag, lib), text in outputs.items()}
    exe.write_text("#!" + sys.executable + "\nimport os, sys\nT = " + repr(table) +
                   "\nprint(T[sys.argv[1] + ' ' + os.path.basename(sys.argv[2])], end='')\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe)


def run(tmp_path, old, new, *extra):
    for lib in ("old.so", "new.so"):
        (tmp_path / lib).write_bytes(b"\0")
    exe = fake_cuobjdump(tmp_path, "cuobjdump", {
        ("-sass", "old.so"): sass("_GLOBAL__N__aaaa_", old),
        ("-sass", "new.so"): sass("_GLOBAL__N__bbbb_", new),
        ("-res-usage", "old.so"): res("_GLOBAL__N__aaaa_", [(n, 64, 0) for n, _ in old]),
        ("-res-usage", "new.so"): res("_GLOBAL__N__bbbb_", [(n, 64, 0) for n, _ in new]),
    })
    return subprocess.run([sys.executable, SCRIPT, str(tmp_path / "old.so"), str(tmp_path / "new.so"),
                           *extra], capture_output=True, text=True, env={**os.environ, "CUOBJDUMP": exe})


def test_exit_status_says_whether_a_kernel_differs(tmp_path):
    same = run(tmp_path, OLD, OLD)
    assert same.returncode == 0, same.stderr
    assert "0 of 2 kernels differ" in same.stdout
    diff = run(tmp_path, OLD, NEW)
    assert diff.returncode == 1
    assert "1 of 2 kernels differ" in diff.stdout
    assert "DIFF" in diff.stdout and "64 reg 0 B stack" in diff.stdout


def test_a_missing_library_or_no_match_is_named(tmp_path):
    p = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "nope.so"), str(tmp_path / "nope.so")],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "nope.so: no such file" in p.stderr
    q = run(tmp_path, OLD, OLD, "--match", "combine_kernel")
    assert q.returncode != 0 and "no kernel matches 'combine_kernel'" in q.stderr
