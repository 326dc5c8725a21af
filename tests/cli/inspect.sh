# inspect.sh - `epx layout trivial` and `epx inspect`: valid maps pass, each
# kind of broken map exits 2 with a message naming the values, nothing crashes.
. "$(dirname "$0")/../util/cli_lib.sh"

expect_exit 0 "$EPX" layout trivial --layers 61 --experts 384 --gpus 8 --redundant 32 -o "$TMP/k2.json"
python3 - "$TMP/k2.json" <<'PY' || fail "trivial map is not 61x416 with only the SGLang key"
import json, sys
d = json.load(open(sys.argv[1]))
assert list(d) == ["physical_to_logical_map"], list(d)
m = d["physical_to_logical_map"]
assert len(m) == 61 and all(len(r) == 416 for r in m)
assert all(m[l][p] == p % 384 for l in range(61) for p in range(416))
PY
expect_exit 0 "$EPX" inspect "$TMP/k2.json" --gpus 8
expect_in "$TMP/out" "61 layers" "384 logical experts" "inferred" "52 slots per GPU" "valid: yes"

# 390 slots do not divide over 8 GPUs.
python3 -c 'import json; print(json.dumps({"physical_to_logical_map": [[p % 384 for p in range(390)]]}))' >"$TMP/390.json"
expect_exit 2 "$EPX" inspect "$TMP/390.json" --gpus 8
expect_in "$TMP/err" "390" "8"

# A slot holding logical id 400 with --experts 384.
python3 -c '
import json
m = [[p % 384 for p in range(416)] for _ in range(3)]
m[2][17] = 400
print(json.dumps({"physical_to_logical_map": m}))' >"$TMP/400.json"
expect_exit 2 "$EPX" inspect "$TMP/400.json" --gpus 8 --experts 384
expect_in "$TMP/err" "slot 17" "layer 2" "400"

# Logical expert 7 has no slot in layer 1.
python3 -c '
import json
m = [[p % 16 for p in range(16)] for _ in range(2)]
m[1][7] = 8
print(json.dumps({"physical_to_logical_map": m}))' >"$TMP/no7.json"
expect_exit 2 "$EPX" inspect "$TMP/no7.json" --gpus 4 --experts 16
expect_in "$TMP/err" "expert 7" "layer 1"

# Usage errors and hostile inputs: exit 2, never a crash or a hang.
expect_exit 2 "$EPX" inspect "$TMP/k2.json"
expect_in "$TMP/err" "--gpus is required"
expect_exit 2 "$EPX" inspect "$TMP/k2.json" --gpus eight
expect_exit 2 "$EPX" inspect "$TMP/k2.json" --gpu 8
expect_in "$TMP/err" "unknown option"
expect_exit 2 "$EPX" inspect /nonexistent.json --gpus 8
printf '{"physical_to_logical_map": [[0,1],[0' >"$TMP/trunc.json"
expect_exit 2 "$EPX" inspect "$TMP/trunc.json" --gpus 1
printf '\000\377garbage' >"$TMP/bin.json"
expect_exit 2 "$EPX" inspect "$TMP/bin.json" --gpus 1
python3 -c 'print("{\"physical_to_logical_map\": " + "[" * 100000 + "]" * 100000 + "}")' >"$TMP/deep.json"
timeout 20 "$EPX" inspect "$TMP/deep.json" --gpus 1 >/dev/null 2>&1; rc=$?
[ "$rc" -eq 2 ] || fail "deeply nested input exited $rc"
expect_exit 2 "$EPX" layout trivial --layers 0 --experts 8 --gpus 2 -o "$TMP/x.json"
expect_exit 2 "$EPX" layout trivial --layers 2 --experts 8 --gpus 3 -o "$TMP/x.json"
expect_in "$TMP/err" "(8)" "(3)"
expect_exit 0 "$EPX" --help
expect_exit 0 "$EPX" inspect --help
expect_exit 2 "$EPX" nosuchcommand
echo "inspect: ok"
