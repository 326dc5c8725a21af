# eval_routing.sh - `epx eval --routing`: per-batch balancedness under every
# accepted rule (static, dynamic, weighted, balanced, rank-invariant), in
# text and JSON; balanced never below another rule on the same batches (it
# is the per-batch optimum), one-pair batches at exactly 1/G, the same
# figures on a re-run, and bad values and option combinations exiting 2
# with a message naming them.
. "$(dirname "$0")/../util/cli_lib.sh"
command -v python3 >/dev/null || { echo "skip: python3 not installed"; exit 77; }

# 3 windows, 3 layers (layer 0 dense), 8 experts with a skew; 4 GPUs, 12 slots.
python3 - "$TMP/c.json" <<'PY'
import json, random, sys
r = random.Random(27)
c = [[[0] * 8] + [[r.randint(0, 50) * (9 if e < 2 else 1) for e in range(8)] for _ in range(2)]
     for _ in range(3)]
json.dump({"logical_count": c}, open(sys.argv[1], "w"))
PY
expect_exit 0 "$EPX" plan --counts "$TMP/c.json" --gpus 4 --redundant 4 -o "$TMP/p.json" \
    --report "$TMP/r.json"
run() { expect_exit 0 "$EPX" eval --placement "$TMP/p.json" --counts "$TMP/c.json" --gpus 4 "$@"; }

for r in static dynamic weighted balanced rank-invariant; do
    w=""
    [ "$r" = weighted ] && w="--weights $TMP/r.json"
    # shellcheck disable=SC2086
    run --routing "$r" $w --batch-tokens 1,16,256 --batches 6 --top-k 2 --json
    cp "$TMP/out" "$TMP/$r.json"
    # shellcheck disable=SC2086
    run --routing "$r" $w --batch-tokens 1,16,256 --batches 6 --top-k 2 --json
    cmp -s "$TMP/out" "$TMP/$r.json" || fail "$r: a re-run gives other figures"
    # shellcheck disable=SC2086
    run --routing "$r" $w
    expect_in "$TMP/out" "per batch, routing $r" "T=4096"
    # shellcheck disable=SC2086
    run --routing "$r" $w --batch-tokens 1 --top-k 1 --json
    python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['per_batch']; \
assert d['balancedness'] == [0.25], d" "$TMP/out" || fail "$r: a one-pair batch is not 1/G"
done
python3 - "$TMP" <<'PY' || fail "per-batch figures wrong"
import json, sys
d = sys.argv[1]
pb = {r: json.load(open(f"{d}/{r}.json"))["per_batch"]
      for r in ("static", "dynamic", "weighted", "balanced", "rank-invariant")}
for r, x in pb.items():
    assert x["routing"] == r and x["tokens"] == [1, 16, 256] and x["top_k"] == 2, x
    assert x["batches_per_layer"] == 6 and x["seed"] == 0, x
    assert all(0 < v <= 1 for v in x["balancedness"]), x
for r in pb:
    for a, b in zip(pb["balanced"]["balancedness"], pb[r]["balancedness"]):
        assert a >= b - 1e-12, (r, pb["balanced"], pb[r])
assert pb["balanced"]["balancedness"][2] > pb["static"]["balancedness"][2], pb
PY
# another seed draws other batches
run --routing dynamic --batch-tokens 16 --seed 5 --json
cmp -s "$TMP/out" "$TMP/dynamic.json" && fail "--seed changes nothing"

bad() { # NEEDLE ARGS...: exit 2 naming NEEDLE
    local n=$1
    shift
    expect_exit 2 "$EPX" eval --placement "$TMP/p.json" --counts "$TMP/c.json" --gpus 4 "$@"
    expect_in "$TMP/err" "epx eval: " "$n"
}
bad "--routing 'lp' is not a routing: use static, dynamic, weighted, balanced or rank-invariant" \
    --routing lp
bad "--routing 'Balanced' is not a routing" --routing Balanced
bad "--top-k is for the per-batch figures: add --routing" --top-k 4
# K distinct experts of 8: --top-k 9 was once routed as top-8, printed as top-9
bad "--top-k 9 is more than the counts' 8 experts per layer: give --top-k 8 or fewer" \
    --routing static --top-k 9
bad "--batch-tokens is for the per-batch figures" --batch-tokens 1,2
bad "--routing weighted needs --weights FILE" --routing weighted
bad "--weights is for --routing weighted only" --routing balanced --weights "$TMP/r.json"
bad "needs \"replica_weights\": [L][P] = [3][12]" --routing weighted --weights "$TMP/p.json"
python3 - "$TMP/r.json" "$TMP/w1.json" "$TMP/w2.json" <<'PY'
import json, sys
w = json.load(open(sys.argv[1]))["replica_weights"]
w[1] = w[1][:-1]
json.dump({"replica_weights": w}, open(sys.argv[2], "w"))
w = json.load(open(sys.argv[1]))["replica_weights"]
w[2][5] = -1
json.dump({"replica_weights": w}, open(sys.argv[3], "w"))
PY
bad "replica_weights[1] must hold 12 numbers" --routing weighted --weights "$TMP/w1.json"
bad "replica_weights[2][5] must be a number >= 0" --routing weighted --weights "$TMP/w2.json"
# a report of another placement (its own map differs), and an expert whose
# replicas all weigh 0, are refused by name
python3 - "$TMP/r.json" "$TMP/w3.json" "$TMP/w4.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
m = r["physical_to_logical_map"]
m[1][0], m[1][1] = m[1][1], m[1][0]
json.dump(r, open(sys.argv[2], "w"))
r = json.load(open(sys.argv[1]))
m, w = r["physical_to_logical_map"], r["replica_weights"]
for p, e in enumerate(m[2]):
    if e == 3:
        w[2][p] = 0.0
json.dump(r, open(sys.argv[3], "w"))
PY
if python3 -c "import json,sys; m=json.load(open(sys.argv[1]))['physical_to_logical_map'][1]; \
sys.exit(m[0] == m[1])" "$TMP/r.json"; then
    bad "its physical_to_logical_map is not --placement's (layer 1, slot 0" --routing weighted \
        --weights "$TMP/w3.json"
fi
bad "replica_weights[2]: every replica of expert 3 weighs 0" --routing weighted \
    --weights "$TMP/w4.json"
# the per-batch work is bounded before it starts
bad "above the limit 2.15e+09 (a few minutes on one core): lower --batches or --batch-tokens" \
    --routing dynamic --batch-tokens 65536,65535 --batches 1024 --top-k 8
echo "eval --routing: all checks passed"
