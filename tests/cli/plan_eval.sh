# plan_eval.sh - `epx plan` and `epx eval` end to end: the mapping file SGLang
# takes (one key), the report, parity with shared/tools/eplb_model.py on
# random shapes (seeds printed), eval's JSON against a direct computation,
# and every kind of bad input exiting 2 with a message naming the values.
. "$(dirname "$0")/../util/cli_lib.sh"
command -v python3 >/dev/null || { echo "skip: python3 not installed"; exit 77; }

# A 3-window load: 4 layers (layer 0 dense, no load), 8 experts.
python3 - "$TMP/c.json" <<'PY'
import json, random, sys
r = random.Random(7)
c = [[[0] * 8] + [[r.randint(0, 900) for _ in range(8)] for _ in range(3)] for _ in range(3)]
json.dump({"logical_count": c, "rank": 0}, open(sys.argv[1], "w"))
PY

expect_exit 0 "$EPX" plan --counts "$TMP/c.json" --gpus 4 --redundant 4 --algorithm deepseek \
    -o "$TMP/m.json" --report "$TMP/r.json"
expect_in "$TMP/out" "with deepseek" "balancedness" "wrote $TMP/m.json"
python3 - "$TMP/m.json" "$TMP/r.json" "$TMP/c.json" <<'PY' || fail "mapping or report is wrong"
import json, sys
m = json.load(open(sys.argv[1])); r = json.load(open(sys.argv[2])); c = json.load(open(sys.argv[3]))["logical_count"]
assert list(m) == ["physical_to_logical_map"], list(m)
p2l = m["physical_to_logical_map"]
assert len(p2l) == 4 and all(len(row) == 12 for row in p2l)
assert all(sorted(set(row)) == list(range(8)) for row in p2l)
for k in ("algorithm", "balancedness", "bound", "gap", "replica_weights", "plan_seconds", "balancedness_sglang"):
    assert k in r, k
assert r["algorithm"] == "deepseek" and r["num_windows"] == 3 and r["num_physical_experts"] == 12
assert 0 <= r["plan_seconds"] < 5
w = r["replica_weights"]
for l in range(4):
    for e in range(8):
        s = sum(w[l][p] for p in range(12) if p2l[l][p] == e)
        assert abs(s - 1) < 1e-12, (l, e, s)
        assert all(abs(w[l][p] - 1 / p2l[l].count(e)) < 1e-15 for p in range(12) if p2l[l][p] == e)
# balancedness on the windows' sum, loads split evenly, mean over loaded layers
tot = [[sum(c[s][l][e] for s in range(3)) for e in range(8)] for l in range(4)]
vals = []
for l in range(4):
    if sum(tot[l]) == 0: continue
    loads = [0.0] * 4
    for p, e in enumerate(p2l[l]):
        loads[p // 3] += tot[l][e] / p2l[l].count(e)
    vals.append(sum(loads) / 4 / max(loads))
want = sum(vals) / len(vals)
assert abs(r["balancedness"] - want) < 1e-12, (r["balancedness"], want)
assert r["bound"] >= r["balancedness"] - 1e-12 and r["bound"] <= 1 + 1e-12
PY

# eval --json: per-window balancedness against a direct computation.
expect_exit 0 "$EPX" eval --placement "$TMP/m.json" --counts "$TMP/c.json" --gpus 4 --json
cp "$TMP/out" "$TMP/eval.json"
python3 - "$TMP/m.json" "$TMP/c.json" "$TMP/eval.json" <<'PY' || fail "eval --json is wrong"
import json, sys
p2l = json.load(open(sys.argv[1]))["physical_to_logical_map"]
c = json.load(open(sys.argv[2]))["logical_count"]
j = json.load(open(sys.argv[3]))
for k in ("balancedness", "per_window", "bound", "worst_layers"):
    assert k in j, k
assert len(j["per_window"]) == 3
for s in range(3):
    vals = []
    for l in range(4):
        if sum(c[s][l]) == 0: continue
        loads = [0.0] * 4
        for p, e in enumerate(p2l[l]):
            loads[p // 3] += c[s][l][e] / p2l[l].count(e)
        vals.append(sum(loads) / 4 / max(loads))
    assert abs(j["per_window"][s] - sum(vals) / len(vals)) < 1e-12
assert abs(j["balancedness"] - sum(j["per_window"]) / 3) < 1e-12
assert 0 < j["balancedness"] <= j["bound"] + 1e-12 <= 1 + 2e-12
assert all(w["layer"] in (1, 2, 3) for w in j["worst_layers"])
PY
expect_exit 0 "$EPX" eval --placement "$TMP/m.json" --counts "$TMP/c.json" --gpus 4
expect_in "$TMP/out" "window" "mean" "worst layers"

# The default algorithm and auto run and give valid files.
expect_exit 0 "$EPX" plan --counts "$TMP/c.json" --gpus 4 --redundant 4 -o "$TMP/d.json"
expect_exit 0 "$EPX" plan --counts "$TMP/c.json" --gpus 4 --nodes 2 --groups 4 --redundant 4 --algorithm auto -o "$TMP/a.json"
expect_in "$TMP/out" "deepseek-hierarchical"
expect_exit 0 "$EPX" eval --placement "$TMP/a.json" --counts "$TMP/c.json" --gpus 4 --nodes 2

# Parity with the pure-Python model on random shapes, ties included.
if [ -f "${EPX_SHARED:-}/tools/eplb_model.py" ]; then
python3 - "$EPX" "$EPX_SHARED/tools" "$TMP" <<'PY' || fail "epx plan differs from eplb_model.py"
import json, random, subprocess, sys
epx, tools, tmp = sys.argv[1:4]
sys.path.insert(0, tools)
import eplb_model
for seed in range(1, 9):
    r = random.Random(seed)
    nodes = r.choice([1, 2, 4]); G = nodes * r.randint(1, 3); groups = nodes * r.randint(1, 3)
    E = groups * r.randint(1, 4); P = -(-E // G) * G + G * r.randint(0, 3); L = r.randint(1, 3)
    hier = r.random() < 0.5
    w = [[float(r.randint(0, 5)) if seed % 2 else r.random() * 100 for _ in range(E)] for _ in range(L)]
    json.dump({"logical_count": w}, open(tmp + "/rc.json", "w"))
    cmd = [epx, "plan", "--counts", tmp + "/rc.json", "--gpus", str(G), "--physical", str(P), "-o", tmp + "/rm.json"]
    cmd += ["--algorithm", "deepseek-hierarchical", "--groups", str(groups), "--nodes", str(nodes)] if hier else ["--algorithm", "deepseek"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, (seed, res.stderr)
    mine = json.load(open(tmp + "/rm.json"))["physical_to_logical_map"]
    ref, _, _ = eplb_model.rebalance(w, P, groups if hier else 1, nodes if hier else 1, G)
    print(f"seed {seed}: L={L} E={E} P={P} G={G} nodes={nodes} groups={groups} hierarchical={hier}: "
          + ("same map" if mine == ref else "DIFFERENT"))
    assert mine == ref, seed
PY
else
    echo "note: shared/tools/eplb_model.py not found; model parity skipped"
fi

# ---- bad input: exit 2 and a message that names the values ----
expect_exit 2 "$EPX" plan --counts "$TMP/c.json" --gpus 4 --physical 18 -o "$TMP/x.json"
expect_in "$TMP/err" "18" "4" "20"
expect_exit 2 "$EPX" plan --counts "$TMP/c.json" --gpus 16 -o "$TMP/x.json"
expect_in "$TMP/err" "8" "16"
expect_exit 2 "$EPX" plan --counts "$TMP/c.json" --gpus 4 --groups 3 -o "$TMP/x.json"
expect_in "$TMP/err" "8 experts" "3"
expect_exit 2 "$EPX" plan --counts "$TMP/c.json" --gpus 4 --nodes 4 --groups 2 --algorithm deepseek-hierarchical -o "$TMP/x.json"
expect_in "$TMP/err" "2 groups" "4 nodes"
expect_exit 2 "$EPX" plan --counts "$TMP/c.json" --gpus 4 --redundant 4 --physical 12 -o "$TMP/x.json"
expect_in "$TMP/err" "not both"
expect_exit 2 "$EPX" plan --counts "$TMP/c.json" --gpus 4 --algorithm greedy -o "$TMP/x.json"
expect_in "$TMP/err" "greedy"
expect_exit 2 "$EPX" plan --counts "$TMP/c.json" --gpus 4 --node-local sometimes -o "$TMP/x.json"
expect_in "$TMP/err" "sometimes"
expect_exit 2 "$EPX" plan --counts "$TMP/c.json" --gpus 4 --node-local strict --algorithm deepseek -o "$TMP/x.json"
expect_in "$TMP/err" "strict" "deepseek"
expect_exit 2 "$EPX" plan --gpus 4 -o "$TMP/x.json"
expect_in "$TMP/err" "--counts is required"
expect_exit 2 "$EPX" plan --counts "$TMP/c.json" --gpus four -o "$TMP/x.json"
echo '{"logical_count": [[1, 2, -3, 4]]}' >"$TMP/neg.json"
expect_exit 2 "$EPX" plan --counts "$TMP/neg.json" --gpus 2 -o "$TMP/x.json"
expect_in "$TMP/err" "-3"
echo '{"logical_count": [[1, 2, "a", 4]]}' >"$TMP/nan.json"
expect_exit 2 "$EPX" plan --counts "$TMP/nan.json" --gpus 2 -o "$TMP/x.json"
expect_exit 2 "$EPX" eval --placement "$TMP/m.json" --counts "$TMP/neg.json" --gpus 4
expect_in "$TMP/err" "-3"
[ ! -e "$TMP/x.json" ] || fail "a failed plan left an output file"

# eval: counts for another model (layers, experts), more GPUs than slots.
python3 -c 'import json; print(json.dumps({"logical_count": [[1] * 8] * 5}))' >"$TMP/c5.json"
expect_exit 2 "$EPX" eval --placement "$TMP/m.json" --counts "$TMP/c5.json" --gpus 4
expect_in "$TMP/err" "5 layers" "4"
python3 -c 'import json; print(json.dumps({"logical_count": [[1] * 6] * 4}))' >"$TMP/c6.json"
expect_exit 2 "$EPX" eval --placement "$TMP/m.json" --counts "$TMP/c6.json" --gpus 4
expect_in "$TMP/err" "expert 7" "6 experts"
expect_exit 2 "$EPX" eval --placement "$TMP/m.json" --counts "$TMP/c.json" --gpus 24
expect_in "$TMP/err" "12" "24"
expect_exit 2 "$EPX" eval --placement "$TMP/m.json" --counts "$TMP/c.json" --gpus 5
expect_in "$TMP/err" "12" "5"
expect_exit 2 "$EPX" eval --counts "$TMP/c.json" --gpus 4
expect_in "$TMP/err" "--placement is required"
expect_exit 2 "$EPX" eval --placement "$TMP/c.json" --counts "$TMP/c.json" --gpus 4
expect_in "$TMP/err" "counts file"
# Multi-node with groups: the report states the cross-node share; DeepSeek's
# hierarchical policy keeps every group on its node (share 0), epx's default
# relaxed mode spends some cross-node replicas, strict spends none.
"$EPX" trace synth --model deepseek-v3 --windows 2 --tokens 4096 --seed 3 -o "$TMP/v3.json" >/dev/null || fail "trace synth"
for mode in hier relaxed strict; do
    case $mode in
        hier) extra="--algorithm deepseek-hierarchical" ;;
        *) extra="--node-local $mode" ;;
    esac
    # shellcheck disable=SC2086
    expect_exit 0 "$EPX" plan --counts "$TMP/v3.json" --gpus 16 --nodes 2 --groups 8 --redundant 16 $extra -o "$TMP/x-$mode.json" --report "$TMP/r-$mode.json"
    expect_in "$TMP/out" "cross-node share"
done
python3 - "$TMP" <<'PY' || fail "cross-node shares wrong"
import json, sys
d = sys.argv[1]
x = {m: json.load(open(f"{d}/r-{m}.json"))["cross_node_share"] for m in ("hier", "relaxed", "strict")}
assert x["hier"] == 0 and x["strict"] == 0, x
assert 0 < x["relaxed"] < 0.5, x
PY
echo "plan/eval: all checks passed"
