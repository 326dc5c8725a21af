#!/bin/bash
# pt_torch.sh - epx's .pt files against torch itself, where torch is
# installed (EPX_PYTHON, else the venv `make python-test` keeps under
# build/python with torch in it, else python3; skipped otherwise):
#  1. what epx writes, torch.load(weights_only=True) reads (also mmap=True),
#     with the same values;
#  2. what torch.save writes (every dtype epx knows, strided and offset views,
#     shared storages, 0-d and empty tensors, nested containers, scalars,
#     pickle protocols 2 and 4) epx's --tree reads to what Python sees;
#  3. what weights_only refuses or epx does not read (nn.Parameter, the
#     legacy format) epx refuses with a message.
set -u
EPX=${EPX_BIN:?EPX_BIN is not set}
VENV_PY=${EPX_SOURCE:-.}/build/python/venv/bin/python
if [ -n "${EPX_PYTHON:-}" ]; then PY=$EPX_PYTHON
elif [ -x "$VENV_PY" ]; then PY=$VENV_PY
else PY=python3; fi
if ! "$PY" -c 'import torch' 2>/dev/null; then
  echo "skipped: torch is not importable by $PY (pip install torch, or set EPX_PYTHON)"
  exit 77
fi
T=$(mktemp -d /tmp/epx-torch.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0
check() {
  local name=$1; shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fail=1; fi
}

# 1. epx writes, torch reads.
"$EPX" layout trivial --layers 3 --experts 8 --gpus 4 --redundant 4 -o "$T/map.json" >/dev/null
"$EPX" convert "$T/map.json" "$T/map.pt" >/dev/null
printf '{"logical_count": [[[1, 2.5], [3, 4]], [[0, 6], [7, 8e9]]]}' >"$T/float.json"
printf '{"logical_count": [[1, 2], [3, 4000000]]}' >"$T/int.json"
for dt in auto float32 float64; do "$EPX" convert "$T/float.json" "$T/c_$dt.pt" --dtype $dt >/dev/null || fail=1; done
for dt in int64 int32; do "$EPX" convert "$T/int.json" "$T/c_$dt.pt" --dtype $dt >/dev/null || fail=1; done
torch_reads() {
  "$PY" - "$T" <<'PY' 2>"$T/err"
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch
T = sys.argv[1]
m = torch.load(T + "/map.pt", weights_only=True)
assert list(m) == ["physical_to_logical_map"], list(m)
t = m["physical_to_logical_map"]
assert t.dtype == torch.int64 and t.tolist() == json.load(open(T + "/map.json"))["physical_to_logical_map"]
assert torch.load(T + "/map.pt", weights_only=True, mmap=True)["physical_to_logical_map"].tolist() == t.tolist()
want = {"auto": torch.float64, "int64": torch.int64, "int32": torch.int32, "float32": torch.float32,
        "float64": torch.float64}
for dt, tdt in want.items():
    c = torch.load(T + "/c_%s.pt" % dt, weights_only=True)["logical_count"]
    assert c.dtype == tdt, (dt, c.dtype)
    ref = [[1, 2], [3, 4000000]] if dt in ("int64", "int32") else [[[1, 2.5], [3, 4]], [[0, 6], [7, 8e9]]]
    assert c.tolist() == ref, (dt, c.tolist())
PY
}
check "torch.load(weights_only=True) reads what epx writes" torch_reads || cat "$T/err"

# 2. torch writes, epx reads.
"$PY" - "$T" <<'PY' 2>"$T/err" || { cat "$T/err"; fail=1; }
import collections, sys, warnings
warnings.filterwarnings("ignore")
import torch
T = sys.argv[1]
g = torch.Generator().manual_seed(7)
base = torch.randint(-1000, 1000, (6, 5), generator=g)
obj = {
    "f64": torch.randn(3, 4, generator=g, dtype=torch.float64),
    "f32": torch.randn(2, 3, 4, generator=g),
    "f16": torch.randn(7, generator=g).half(),
    "bf16": torch.randn(7, generator=g).bfloat16(),
    "i64": base, "i32": base.int(), "i16": base.short(), "i8": (base % 100).to(torch.int8),
    "u8": (base % 200).abs().to(torch.uint8), "bool": base > 0,
    "transposed": base.t(), "sliced": base[2:, 1:4], "stepped": base[::2, ::3],
    "scalar": torch.tensor(3.25), "empty": torch.zeros(0, 5), "shared": base,
    "nested": [1, -2, 2**40, -2**40, 0.5, None, True, False, "héllo ✓", (1, (2, [3])), {"k": [base[0]]}],
    "ordered": collections.OrderedDict([("b", 1), ("a", 2)]),
    7: "int key",
}
torch.save(obj, T + "/p2.pt")
torch.save(obj, T + "/p4.pt", pickle_protocol=4)
torch.save({"w": torch.nn.Parameter(torch.ones(2))}, T + "/param.pt")
torch.save({"t": torch.ones(2)}, T + "/legacy.pt", _use_new_zipfile_serialization=False)
PY
same_tree() { # file, weights_only: epx --tree equals Python's own view of torch.load
  "$EPX" convert --tree "$1" "$T/tree.json" >/dev/null 2>"$T/err" || { cat "$T/err"; return 1; }
  "$PY" - "$1" "$T/tree.json" "$2" <<'PY'
import json, math, sys, warnings
warnings.filterwarnings("ignore")
import torch
def plain(v):
    if isinstance(v, torch.Tensor): return v.tolist()
    if isinstance(v, dict): return {(k if isinstance(k, str) else json.dumps(k)): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)): return [plain(x) for x in v]
    return v
want = plain(torch.load(sys.argv[1], weights_only=sys.argv[3] == "1"))
got = json.load(open(sys.argv[2]))
if got != want:
    for k in want:
        if got.get(k) != want[k]: print("differs at", k, ":", str(got.get(k))[:200], "vs", str(want[k])[:200])
    sys.exit(1)
PY
}
check "torch.save protocol 2 reads as Python sees it" same_tree "$T/p2.pt" 1
# torch's own weights_only reader stops at protocol 4's FRAME opcode; epx
# reads the file, compared with a full torch.load of our own trusted file.
check "torch.save protocol 4 reads as Python sees it" same_tree "$T/p4.pt" 0

# 3. Refusals.
refused() {
  ! "$EPX" convert --tree "$1" "$T/x.json" >/dev/null 2>"$T/err" && grep -q "$2" "$T/err" || { cat "$T/err"; return 1; }
}
check "nn.Parameter refused, named" refused "$T/param.pt" "torch._utils._rebuild_parameter"
check "legacy format refused" refused "$T/legacy.pt" "legacy"
exit $fail
