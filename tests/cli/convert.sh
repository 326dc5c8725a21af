#!/bin/bash
# convert.sh - `epx convert` end to end: every golden .pt fixture converts to
# JSON equal to its expected.json (compared in Python's json, exactly), the
# per_pass dump to [S][L][E] counts that match a Python reference built from
# its own --tree output, round trips .pt -> .json -> .pt, several ranks, and
# hostile files: evil_reduce.pt and a pickle that would `touch` a marker exit
# non-zero with a message, and the marker never appears.
set -u
EPX=${EPX_BIN:?EPX_BIN is not set}
SRC=${EPX_SOURCE:?EPX_SOURCE is not set}
command -v python3 >/dev/null || { echo "skipped: python3 is needed to compare JSON"; exit 77; }
T=$(mktemp -d /tmp/epx-convert.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0
check() { # name, command...
  local name=$1; shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fail=1; fi
}

# Compare epx's outputs for one fixture with its expected.json entry.
compare() { # dir, fixture name
  local dir=$1 name=$2
  "$EPX" convert "$dir/$name" "$T/$name.json" >/dev/null 2>"$T/err" || { cat "$T/err"; return 1; }
  "$EPX" convert --tree "$dir/$name" "$T/$name.tree.json" >/dev/null 2>"$T/err" || { cat "$T/err"; return 1; }
  # a stat dump's rows, one window each (refused for any other input)
  rm -f "$T/$name.rows.json"
  "$EPX" convert --stat-rows windows "$dir/$name" "$T/$name.rows.json" >/dev/null 2>&1
  python3 - "$dir/expected.json" "$name" "$T/$name.json" "$T/$name.tree.json" "$T/$name.rows.json" <<'PY'
import json, os, sys
exp = json.load(open(sys.argv[1]))[sys.argv[2]]
out = json.load(open(sys.argv[3]))
tree = json.load(open(sys.argv[4]))
rows = json.load(open(sys.argv[5])) if os.path.exists(sys.argv[5]) else None
kind = exp["kind"]
def fail(msg):
    print(sys.argv[2] + ": " + msg); sys.exit(1)
if kind == "init_mapping":
    if out != {"physical_to_logical_map": exp["physical_to_logical_map"]}: fail("mapping differs")
    if tree != out: fail("tree differs")
elif kind == "init_counts":
    if out["logical_count"] != exp["logical_count"]: fail("logical_count differs")
    if tree["logical_count"] != exp["logical_count"]: fail("tree differs")
elif kind == "stat_dump":
    # by default the rows are summed into one window, as plan and stats read
    # the dump (row order carries no time); --stat-rows windows keeps them
    if rows is None: fail("--stat-rows windows refused on a stat dump")
    lc = rows["logical_count"]
    summed = [[sum(w[l][e] for w in lc) for e in range(len(lc[0][0]))] for l in range(len(lc[0]))]
    if out["logical_count"] != summed: fail("default output is not the rows summed")
    if "logical_count" in exp:
        if lc != exp["logical_count"]: fail("logical_count differs")
    else:
        shape = [len(lc), len(lc[0]), len(lc[0][0])]
        if shape != exp["shape"]: fail("shape %s != %s" % (shape, exp["shape"]))
        if sum(x for w in lc for r in w for x in r) != exp["sum"]: fail("sum differs")
        if lc[0][1][:len(exp["first_row_layer1"])] != exp["first_row_layer1"]: fail("row differs")
    for k in ("rank", "average_utilization_rate_over_window"):
        if tree[k] != exp[k]: fail("%s: %r != %r" % (k, tree[k], exp[k]))
    if tree["logical_count"] != lc: fail("tree differs from counts")
elif kind == "per_pass":
    recs = tree["records"]
    if len(recs) != exp["num_records"]: fail("record count")
    if [r["forward_pass_id"] for r in recs] != exp["forward_pass_ids"]: fail("pass ids")
    if recs[0]["global_physical_count"] != exp["global_physical_count_0"]: fail("gpc 0")
    m = tree["last_physical_to_logical_map"]
    if m[0] != exp["last_physical_to_logical_map_row0"]: fail("map row 0")
    E = max(max(r) for r in m) + 1
    ref = []
    for r in sorted(recs, key=lambda r: r["forward_pass_id"]):
        g = r["global_physical_count"]
        w = [[0] * E for _ in m]
        for l, row in enumerate(g):
            for p, x in enumerate(row): w[l][m[l][p]] += x
        ref.append(w)
    if out["logical_count"] != ref: fail("counts differ from the scatter-add reference")
else:
    fail("unknown kind " + kind)
if kind != "stat_dump" and rows is not None: fail("--stat-rows windows accepted on " + kind)
PY
}

refused() { # file: must exit non-zero naming what it called, printing nothing it ran
  local f=$1 want=$2
  "$EPX" convert "$f" "$T/evil.json" >"$T/out" 2>"$T/err"
  local rc=$?
  [ $rc -ne 0 ] && grep -q "$want" "$T/err" && grep -q "nothing was executed" "$T/err" &&
    ! grep -q owned "$T/out" && [ ! -e "$T/evil.json" ] || { cat "$T/out" "$T/err"; return 1; }
}

for dir in "$SRC/tests/data/pt" "${EPX_SHARED:-/nonexistent}/golden/pt"; do
  if [ ! -f "$dir/expected.json" ]; then echo "note: $dir absent; its fixtures are skipped"; continue; fi
  for name in $(python3 -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1]))))' "$dir/expected.json"); do
    if [ "$name" = evil_reduce.pt ]; then
      check "$dir/$name refused" refused "$dir/$name" posix.system
    else
      check "$dir/$name" compare "$dir" "$name"
    fi
  done
done

# A pickle that calls posix.system("touch MARKER") and builtins.eval: refused, never run.
python3 - "$T" <<'PY'
import sys, zipfile
T = sys.argv[1]
def pt(path, pkl):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("evil/data.pkl", pkl)
        z.writestr("evil/byteorder", "little")
        z.writestr("evil/version", "3\n")
cmd = ("touch " + T + "/MARKER").encode()
pt(T + "/touch.pt", b"\x80\x02}X\r\x00\x00\x00logical_countcposix\nsystem\nX" +
   len(cmd).to_bytes(4, "little") + cmd + b"\x85Rs.")
code = b"__import__('os').system('touch " + T.encode() + b"/MARKER')"
pt(T + "/eval.pt", b"\x80\x02cbuiltins\neval\nX" + len(code).to_bytes(4, "little") + code + b"\x85R.")
PY
check "touch pickle refused" refused "$T/touch.pt" posix.system
check "eval pickle refused" refused "$T/eval.pt" builtins.eval
check "marker never created" test ! -e "$T/MARKER"

# Round trips: .pt -> .json -> .pt -> .json is stable, for counts and maps.
rt() { # fixture, extra args for the .pt step
  local f=$1; shift
  "$EPX" convert "$f" "$T/a.json" >/dev/null && "$EPX" convert "$T/a.json" "$T/b.pt" "$@" >/dev/null &&
    "$EPX" convert "$T/b.pt" "$T/c.json" >/dev/null && cmp -s "$T/a.json" "$T/c.json"
}
check "round trip mapping" rt "$SRC/tests/data/pt/init_mapping.pt"
check "round trip strided counts" rt "$SRC/tests/data/pt/strided_counts.pt"
check "round trip per_pass as int32" rt "$SRC/tests/data/pt/per_pass_rank0.pt" --dtype int32
check "round trip per_pass as float32" rt "$SRC/tests/data/pt/per_pass_rank0.pt" --dtype float32

# Several ranks: the same dump renamed to rank 1 is a duplicate (pass, rank)
# pair, refused; a comma list and a directory name the same files.
mkdir -p "$T/ranks"
cp "$SRC/tests/data/pt/per_pass_rank0.pt" "$T/ranks/r0.pt"
cp "$SRC/tests/data/pt/per_pass_rank0.pt" "$T/ranks/r1.pt"
dup() {
  ! "$EPX" convert "$1" "$T/d.json" >/dev/null 2>"$T/err" && grep -q "recorded twice" "$T/err"
}
check "duplicate ranks (directory) refused" dup "$T/ranks"
check "duplicate ranks (comma list) refused" dup "$T/ranks/r0.pt,$T/ranks/r1.pt"
single_dir() {
  rm -f "$T/ranks/r1.pt" && "$EPX" convert "$T/ranks" "$T/dir.json" >/dev/null &&
    "$EPX" convert "$SRC/tests/data/pt/per_pass_rank0.pt" "$T/one.json" >/dev/null &&
    cmp -s "$T/dir.json" "$T/one.json"
}
check "directory of one rank equals the file" single_dir

# Usage errors: exit 2 with a message.
usage() { "$EPX" convert "$@" >/dev/null 2>"$T/err"; [ $? -eq 2 ] && [ -s "$T/err" ]; }
refused_as() { # needle, convert args...: exit 2, the needle said, nothing written
  local needle=$1; shift
  usage "$@" && grep -qF -- "$needle" "$T/err" && [ ! -e "$T/x.pt" ] && [ ! -e "$T/x.json" ]
}
check "OUT without extension" usage "$SRC/tests/data/pt/init_mapping.pt" "$T/x.txt"
check "--dtype on a mapping" usage "$SRC/tests/data/pt/init_mapping.pt" "$T/x.pt" --dtype int32
check "--dtype on JSON output" usage "$SRC/tests/data/pt/strided_counts.pt" "$T/x.json" --dtype int32
check "missing input" usage "$T/none.json" "$T/x.pt"
# stat dumps: the same dump twice, or beside a plain counts file, is refused
# (both were read: 2 windows of one recording, or windows of two meanings);
# a mapping takes no read options
GP=${EPX_SHARED:-/nonexistent}/golden/pt
if [ -f "$GP/stat_dump_mixtral.pt" ]; then
  cp "$GP/stat_dump_mixtral.pt" "$T/copy.pt"
  check "a stat dump twice refused" refused_as "hold the same stat dump" \
    "$GP/stat_dump_mixtral.pt,$GP/stat_dump_mixtral.pt" "$T/x.json"
  check "  and its copy" refused_as "hold the same stat dump" "$GP/stat_dump_mixtral.pt,$T/copy.pt" "$T/x.json"
  check "a stat dump beside init counts refused" refused_as \
    "is a stat dump but '$GP/init_counts_int64.pt' is a logical_count file (not a stat dump): give files of one kind" \
    "$GP/stat_dump_mixtral.pt,$GP/init_counts_int64.pt" "$T/x.json"
  # the default is what plan reads from the .pt: the plans agree
  sum_plans() {
    "$EPX" convert "$GP/stat_dump_mixtral.pt" "$T/sdm.json" >"$T/out" &&
      grep -q "summed into one window" "$T/out" &&
      "$EPX" plan --counts "$T/sdm.json" --gpus 4 --redundant 4 -o "$T/p1.json" >/dev/null &&
      "$EPX" plan --counts "$GP/stat_dump_mixtral.pt" --gpus 4 --redundant 4 -o "$T/p2.json" >/dev/null &&
      cmp -s "$T/p1.json" "$T/p2.json"
  }
  check "stat dump converted as plan reads it" sum_plans
fi
check "--stat-rows on a mapping refused" refused_as "is a mapping: drop them" \
  "$SRC/tests/data/pt/init_mapping.pt" "$T/x.json" --stat-rows windows
# a count the dtype cannot hold is refused by value, not rounded: float32
# read 16777217 back as 16777216 while int32 refused its overflow
echo '{"logical_count": [[16777217, 2, 3, 4]]}' >"$T/c24.json"
check "float32 refuses 16777217" refused_as "load [0][0][0] is 16777217, which float32 cannot hold exactly" "$T/c24.json" "$T/x.pt" --dtype float32
check "  and names the fix" refused_as "write int64 or float64" "$T/c24.json" "$T/x.pt" --dtype float32
echo '{"logical_count": [[2147483648, 2, 3, 4]]}' >"$T/c31.json"
check "int32 names the value and int64" refused_as "is 2147483648, which int32 cannot hold: write int64 or float64" "$T/c31.json" "$T/x.pt" --dtype int32
check "JSON that is neither mapping nor counts" usage "$SRC/tests/data/pt/expected.json" "$T/x.pt"
cp "$SRC/tests/data/pt/expected.json" "$T/notzip.pt"
check ".pt that is not a zip" usage "$T/notzip.pt" "$T/x.json"

# --tree writes every dict key as JSON does (5 -> "5", None -> "null"); a dict
# whose keys would then collide is refused, never written with a key twice
python3 - "$T" <<'PY'
import pickle, sys, zipfile
for name, d in (("keys.pt", {5: 1, "5": 2}), ("keys_ok.pt", {5: 1, "6": [1.5], None: "a"}),
                ("empty.pt", {})):
    with zipfile.ZipFile(sys.argv[1] + "/" + name, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(d, protocol=2))
        z.writestr("archive/version", "3\n")
PY
check "--tree: keys JSON writes alike refused" bash -c \
  '"$0" convert --tree "$1/keys.pt" "$1/k.json" 2>"$1/err"; [ $? = 2 ] && grep -qF "two keys that JSON writes alike, \"5\"" "$1/err" && [ ! -e "$1/k.json" ]' "$EPX" "$T"
check "--tree: scalar keys written as JSON does" bash -c \
  '"$0" convert --tree "$1/keys_ok.pt" "$1/k2.json" >/dev/null && python3 -c "import json,sys; assert json.load(open(sys.argv[1])) == {\"5\": 1, \"6\": [1.5], \"null\": \"a\"}" "$1/k2.json"' "$EPX" "$T"

check "an empty dict: its keys said to be none" bash -c \
  '"$0" convert "$1/empty.pt" "$1/e.json" 2>"$1/err"; [ $? = 2 ] && grep -qF "its keys: none, an empty dict" "$1/err"' "$EPX" "$T"
# a file with both forms converts its mapping, as SGLang's init takes it, and
# says that the counts are left out
printf '{"physical_to_logical_map": [[0, 1, 1]], "logical_count": [[5, 7]]}' >"$T/both.json"
check "both forms: the mapping, with a note" bash -c \
  '"$0" convert "$1/both.json" "$1/both.pt" >/dev/null 2>"$1/err" && grep -qF "the mapping is converted" "$1/err" &&
   "$0" convert "$1/both.pt" "$1/both2.json" >/dev/null && grep -qF "physical_to_logical_map" "$1/both2.json"' "$EPX" "$T"

exit $fail
