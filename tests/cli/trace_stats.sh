# trace_stats.sh - `epx trace synth` and `epx stats` end to end: the same seed
# writes the same bytes, shapes and sums are right, stats agree with an
# independent Python computation, placements and nodes change what they
# should, and bad input exits 2 with a reason.
. "$(dirname "$0")/../util/cli_lib.sh"
command -v python3 >/dev/null || { echo "skip: python3 not installed"; exit 77; }

# Determinism: same seed, same file; another seed, another file.
expect_exit 0 "$EPX" trace synth --model kimi-k2 --windows 3 --tokens 4096 --seed 11 -o "$TMP/a.json"
expect_exit 0 "$EPX" trace synth --model Kimi_K2 --windows 3 --tokens 4096 --seed 11 -o "$TMP/b.json"
cmp -s "$TMP/a.json" "$TMP/b.json" || fail "same seed wrote different files"
expect_exit 0 "$EPX" trace synth --model kimi-k2 --windows 3 --tokens 4096 --seed 12 -o "$TMP/c.json"
cmp -s "$TMP/a.json" "$TMP/c.json" && fail "different seeds wrote the same file"

python3 - "$TMP/a.json" <<'PY' || fail "kimi-k2 trace has the wrong shape or sums"
import json, sys
lc = json.load(open(sys.argv[1]))["logical_count"]
assert len(lc) == 3 and all(len(w) == 61 and all(len(r) == 384 for r in w) for w in lc)
for w in lc:
    assert sum(w[0]) == 0, "dense layer 0 carries load"
    for r in w[1:]:
        assert sum(r) == 4096 * 8 and max(r) <= 4096 and min(r) >= 0
PY

# Stats on the trivial layout (P = E = 384, 8 GPUs) against Python.
expect_exit 0 "$EPX" stats "$TMP/a.json" --json --top 0
python3 - "$TMP/a.json" "$TMP/out" <<'PY' || fail "epx stats disagrees with the Python reference"
import json, sys
lc = json.load(open(sys.argv[1]))["logical_count"]
out = json.load(open(sys.argv[2]))
assert out["windows"] == 3 and out["gpus"] == 8 and out["physical"] == 384
assert len(out["per_window"]) == 3
for s, w in enumerate(out["per_window"]):
    bals = []
    for l, row in enumerate(lc[s]):
        loads = [sum(row[g * 48:(g + 1) * 48]) for g in range(8)]
        if sum(loads) == 0:
            continue
        mean, mx = sum(loads) / 8, max(loads)
        bals.append((l, mean / mx, (mx - mean) / mean))
    want = sum(b for _, b, _ in bals) / len(bals)
    assert abs(w["balancedness"] - want) < 1e-9, (w["balancedness"], want)
    assert abs(w["rank_imbalance"] - sum(i for _, _, i in bals) / len(bals)) < 1e-9
    worst = [x["layer"] for x in w["worst_layers"]]
    assert worst == [l for l, _, _ in sorted(bals, key=lambda t: (t[1], t[0]))], "order"
    assert w["internode_share"] == 0.0  # one node
    assert 0 < w["balancedness"] <= w["bound"] <= 1 and abs(w["gap"] - (w["bound"] - w["balancedness"])) < 1e-12
PY

# The text form names the windows and shows worst layers first.
expect_exit 0 "$EPX" stats "$TMP/a.json"
expect_in "$TMP/out" "3 window(s) x 61 layers x 384 experts, 60 layer(s) with load" \
    "trivial (P = E)" "window 0, worst layers first" "all windows summed"

# A placement on 2 nodes: uniform replica choice crosses nodes half the time
# whatever the placement; local-first choices cross less.
expect_exit 0 "$EPX" layout trivial --layers 61 --experts 384 --gpus 16 --redundant 32 -o "$TMP/map.json"
for t in uniform gpu-local node-local; do
    expect_exit 0 "$EPX" stats "$TMP/a.json" --placement "$TMP/map.json" --gpus 16 --nodes 2 --traffic $t --json
    cp "$TMP/out" "$TMP/$t.out"
done
python3 - "$TMP/uniform.out" "$TMP/gpu-local.out" "$TMP/node-local.out" <<'PY' || fail "inter-node shares are wrong"
import json, sys
u, g, n = (json.load(open(p))["all_windows"]["internode_share"] for p in sys.argv[1:])
assert abs(u - 0.5) < 1e-12, u
# Trivial layout on 16 GPUs, P = 416: most experts have one replica, so a
# GPU-local choice helps only the source GPU itself (1/16 of tokens).
assert n <= g < u, (u, g, n)
PY

# Calibration: the default skew gives the balancedness of shared/traces.
if [ -f "${EPX_SHARED:-}/traces/kimi_k2.json" ]; then
    expect_exit 0 "$EPX" trace synth --model kimi-k2 --windows 8 --tokens 65536 --seed 101 -o "$TMP/k.json"
    expect_exit 0 "$EPX" stats "$TMP/k.json" --json
    cp "$TMP/out" "$TMP/k.out"
    expect_exit 0 "$EPX" stats "$EPX_SHARED/traces/kimi_k2.json" --json
    python3 - "$TMP/k.out" "$TMP/out" <<'PY' || fail "synthetic balancedness is far from shared/traces"
import json, sys
a, b = (json.load(open(p))["all_windows"]["balancedness"] for p in sys.argv[1:])
assert abs(a - b) < 0.04, (a, b)
PY
fi

# SGLang's .pt stat dumps read through the same entry point (once the .pt
# reader is in the build): by default the ring buffer's rows are one window,
# their sum, and the output says so; --stat-rows windows keeps the rows.
pt="${EPX_SHARED:-}/golden/pt/stat_dump_mixtral.pt"
if [ -f "$pt" ]; then
    "$EPX" stats "$pt" --json >"$TMP/sum" 2>"$TMP/err" &&
        "$EPX" stats "$pt" --json --stat-rows windows >"$TMP/out" 2>"$TMP/err"; rc=$?
    if [ $rc -eq 0 ]; then
        python3 - "$TMP/out" "$TMP/sum" <<'PY' || fail "stats of the mixtral .pt dump look wrong"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["windows"] == 8 and d["layers"] == 32 and d["experts"] == 8, d
assert all(0 < w["balancedness"] <= 1 for w in d["per_window"])
assert "time-ordered windows" in d["input"], d["input"]
s = json.load(open(sys.argv[2]))
assert s["windows"] == 1 and "stat dump" in s["input"] and "summed" in s["input"], s["input"]
assert s["per_window"][0]["tokens"] == d["all_windows"]["tokens"]
PY
    elif ! grep -q "not supported" "$TMP/err"; then
        cat "$TMP/err" >&2; fail "epx stats on a .pt dump exited $rc"
    fi
fi

# Bad input: exit 2 with a reason.
expect_exit 2 "$EPX" trace synth --model llama-moe -o "$TMP/x.json"
expect_in "$TMP/err" "unknown model 'llama-moe'" "kimi-k2"
expect_exit 2 "$EPX" trace synth --model mixtral --skew 1..x -o "$TMP/x.json"
expect_in "$TMP/err" "--skew"
expect_exit 2 "$EPX" trace synth --model mixtral --skew 2..1 -o "$TMP/x.json"
expect_in "$TMP/err" "--skew 2..1 runs backwards: write the smaller first (1..2)"
# a third dot is a malformed range, not a backwards one (1...2 read as 1..0.2)
expect_exit 2 "$EPX" trace synth --model mixtral --skew 1...2 -o "$TMP/x.json"
expect_in "$TMP/err" "--skew '1...2' is malformed: write A..B, two numbers with exactly two dots"
grep -q "backwards" "$TMP/err" && fail "1...2 called backwards: $(cat "$TMP/err")"
expect_exit 2 "$EPX" trace synth --model mixtral --tokens 0 -o "$TMP/x.json"
# a shift in no layer changes nothing (it wrote the trace without one)
expect_exit 2 "$EPX" trace synth --model mixtral --windows 4 --shift 3 --shift-layers 0 -o "$TMP/x.json"
expect_in "$TMP/err" "--shift-layers 0 shifts no layer, so --shift 3 would change nothing"
[ ! -e "$TMP/x.json" ] || fail "--shift-layers 0 wrote a trace"
expect_exit 2 "$EPX" trace synth --model mixtral
expect_in "$TMP/err" "-o is required"
expect_exit 2 "$EPX" trace frobnicate
expect_exit 0 "$EPX" trace synth --help
expect_in "$TMP/out" "built-in models" "glm-4.5" "qwen3-30b-a3b"
expect_exit 2 "$EPX" stats "$TMP/a.json" --placement "$TMP/map.json"
expect_in "$TMP/err" "--gpus is required"
expect_exit 2 "$EPX" stats "$TMP/a.json" --gpus 7
expect_in "$TMP/err" "384" "7"
expect_exit 0 "$EPX" layout trivial --layers 32 --experts 8 --gpus 8 -o "$TMP/mix.json"
expect_exit 2 "$EPX" stats "$TMP/a.json" --placement "$TMP/mix.json" --gpus 8
expect_in "$TMP/err" "32 layers" "61"
expect_exit 2 "$EPX" stats "$TMP/missing.json"
expect_exit 2 "$EPX" stats "$TMP/map.json"
expect_in "$TMP/err" "placement"
expect_exit 2 "$EPX" stats "$TMP/a.json" --traffic random
echo "trace_stats: ok"
