# migrate.sh - `epx migrate plan` (totals beside the naive plan, --json,
# -o, errors) and `epx plan --current/--max-moves/--move-price/--failed-gpus`
# on a window of a shared trace.
. "$(dirname "$0")/../util/cli_lib.sh"

# 1 layer, 2 nodes x 2 GPUs x 2 slots, 6 experts (tests/test_migrate_plan.c's
# crafted case): 3 and 5 cross nodes once each, 4 comes from the same node,
# the second 5 of node 1 is relayed.
echo '{"physical_to_logical_map": [[5, 0, 1, 4, 2, 3, 4, 2]]}' >"$TMP/a.json"
echo '{"physical_to_logical_map": [[5, 0, 1, 3, 4, 5, 2, 5]]}' >"$TMP/b.json"
expect_exit 0 "$EPX" migrate plan --from "$TMP/a.json" --to "$TMP/b.json" --gpus 4 --nodes 2 \
    --expert-bytes 100 --json -o "$TMP/rel.json"
python3 - "$TMP/out" "$TMP/rel.json" <<'PY' || fail "migrate plan --json"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["bytes_moved"] == 400 and d["bytes_inter_node"] == 200 and d["bytes_intra_node"] == 200, d
assert d["naive_bytes_moved"] == 500 and d["naive_changed"] == 5, d
assert d["kept"] == 4 and d["relayed"] == 1 and d["received"] == 3, d
assert [g["received"] for g in d["per_gpu"]] == [0, 100, 200, 100], d
m = json.load(open(sys.argv[2]))
assert list(m) == ["physical_to_logical_map"]
assert m["physical_to_logical_map"] == [[5, 0, 1, 3, 4, 5, 5, 2]], m
PY
expect_exit 0 "$EPX" migrate plan --from "$TMP/a.json" --to "$TMP/b.json" --gpus 4 --nodes 2 \
    --expert-bytes 100 --no-relay --no-relabel
expect_in "$TMP/out" "slots changed" "naive" "GB over links" "of the naive plan's bytes"
# Losing GPU 1: what it held must come from elsewhere or be loaded. A target
# that leaves experts 1 and 3 only there is refused, naming them; one that
# keeps a live replica of each is planned.
expect_exit 2 "$EPX" migrate plan --from "$TMP/a.json" --to "$TMP/b.json" --gpus 4 --nodes 2 \
    --expert-bytes 100 --failed-gpus 1
expect_in "$TMP/err" "the target: layer 0: logical expert 1 has replicas only on failed GPUs (GPU 1)" \
    "epx plan --failed-gpus"
echo '{"physical_to_logical_map": [[5, 0, 1, 3, 4, 1, 2, 3]]}' >"$TMP/b1.json"
expect_exit 0 "$EPX" migrate plan --from "$TMP/a.json" --to "$TMP/b1.json" --gpus 4 --nodes 2 \
    --expert-bytes 100 --failed-gpus 1 --json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["slots"] == 6 and d["per_gpu"][1] == {"sent": 0, "received": 0}, d' "$TMP/out" \
    || fail "failed GPU still moves"

# The repair after losing GPU 1 (issue 27 item 3): expert 1 was held only
# there, so it takes one spare slot (a second 2) on a survivor and is loaded;
# nothing else moves.
expect_exit 0 "$EPX" migrate plan --from "$TMP/a.json" --gpus 4 --nodes 2 --expert-bytes 100 \
    --failed-gpus 1 --json -o "$TMP/rep.json"
python3 - "$TMP/out" "$TMP/a.json" "$TMP/rep.json" <<'PY' || fail "migrate plan --failed-gpus (repair)"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["repair_forced_moves"] == 1 and d["changed"] == 1 and d["loaded"] == 1, d
assert d["bytes_moved"] == 0 and d["bytes_loaded"] == 100 and d["kept"] == 5, d
a = json.load(open(sys.argv[2]))["physical_to_logical_map"][0]
r = json.load(open(sys.argv[3]))["physical_to_logical_map"][0]
live = [p for p in range(8) if p // 2 != 1]
assert sorted(r[p] for p in live) == [0, 1, 2, 3, 4, 5], r
assert sum(a[p] != r[p] for p in live) == 1 and a[2:4] == r[2:4], (a, r)
PY
expect_exit 0 "$EPX" migrate plan --from "$TMP/a.json" --gpus 4 --expert-bytes 100 --failed-gpus 1 \
    --counts '{"logical_count": [[1, 1, 9, 1, 1, 1]]}'
expect_in "$TMP/out" "repair after losing GPU(s) 1: 1 (layer, expert) pairs" "nothing else moves" \
    "balancedness on the live GPUs (--counts load)" \
    "(7.1 % of the load is on experts only the lost GPUs held: not served), repaired"
# Lists that cannot be: a GPU twice, every GPU, too few slots left.
expect_exit 2 "$EPX" migrate plan --from "$TMP/a.json" --gpus 4 --expert-bytes 1 --failed-gpus 1,1
expect_in "$TMP/err" "--failed-gpus '1,1' names GPU 1 twice (item 2 repeats it): list each GPU once"
expect_exit 2 "$EPX" migrate plan --from "$TMP/a.json" --gpus 4 --expert-bytes 1 --failed-gpus 3,0,1,2
expect_in "$TMP/err" "--failed-gpus '3,0,1,2' marks all 4 GPUs failed" "list only the GPUs that were lost"
expect_exit 2 "$EPX" migrate plan --from "$TMP/a.json" --gpus 4 --expert-bytes 1 --failed-gpus 1,2
expect_in "$TMP/err" "--failed-gpus '1,2' leaves 2 surviving GPU(s) with 2 slots each, 4 slots for 6 experts" \
    "give at least 3 surviving GPUs, or more slots per GPU (P >= 12: 3 per GPU)"
expect_exit 2 "$EPX" migrate plan --from "$TMP/a.json" --gpus 4 --expert-bytes 1
expect_in "$TMP/err" "--to is required (or give --failed-gpus LIST alone"
expect_exit 2 "$EPX" migrate plan --from "$TMP/a.json" --to "$TMP/b.json" --gpus 4 --expert-bytes 1 \
    --counts '{"logical_count": [[1, 1, 1, 1, 1, 1]]}'
expect_in "$TMP/err" "--counts chooses the repair's spare replicas"
expect_exit 2 "$EPX" migrate plan --from "$TMP/a.json" --gpus 4 --expert-bytes 1 --failed-gpus 1 \
    --counts '{"logical_count": [[1, 1, 1, 1, 1]]}'
expect_in "$TMP/err" "holds 1 layers x 5 experts, the placement 1 x 6"
# epx plan on the survivors with the layout in service and GPU 1 lost: the
# planned sets go to the survivors that keep the most; a move price undoes
# every move that buys no balance, down to the one the loss forces.
expect_exit 0 "$EPX" plan --counts '{"logical_count": [[1, 1, 1, 1, 1, 1]]}' --gpus 4 --physical 8 \
    --current "$TMP/a.json" --failed-gpus 1 -o "$TMP/el.json" --report "$TMP/el_r.json"
expect_in "$TMP/out" "balancedness on the 3 live GPUs 1.0000" "the lost GPUs force 1 of these moves" \
    "--max-moves 1 moves those alone" \
    "(16.7 % of the load is on experts only the lost GPUs held: not served) -> planned 1.0000"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["live_gpus"] == [0, 2, 3] and r["balancedness_live_gpus"] == 1.0, r' \
    "$TMP/el_r.json" || fail "plan --failed-gpus report: live GPUs"
expect_exit 0 "$EPX" plan --counts '{"logical_count": [[1, 1, 1, 1, 1, 1]]}' --gpus 4 --physical 8 \
    --current "$TMP/a.json" --failed-gpus 1 --move-price 0.000001 -o "$TMP/el.json"
expect_in "$TMP/out" "moves from --current: 1 of 6 live slots change" "planned 1.0000"
expect_exit 2 "$EPX" plan --counts '{"logical_count": [[1, 1, 1, 1, 1, 1]]}' --gpus 4 --physical 8 \
    -o "$TMP/x.json" --failed-gpus 2,2
expect_in "$TMP/err" "--failed-gpus '2,2' names GPU 2 twice"
expect_exit 2 "$EPX" plan --counts '{"logical_count": [[1, 1, 1, 1, 1, 1]]}' --gpus 4 --physical 8 \
    -o "$TMP/x.json" --failed-gpus 0,1,2,3
expect_in "$TMP/err" "marks all 4 GPUs failed"

# Bad input: exit 2 with the reason.
expect_exit 2 "$EPX" migrate plan --from "$TMP/a.json" --to "$TMP/b.json" --gpus 4
expect_in "$TMP/err" "--expert-bytes is required"
echo '{"physical_to_logical_map": [[5, 0, 1, 4, 2, 3]]}' >"$TMP/c.json"
expect_exit 2 "$EPX" migrate plan --from "$TMP/a.json" --to "$TMP/c.json" --gpus 2 --expert-bytes 1
expect_in "$TMP/err" "differ in shape"
expect_exit 2 "$EPX" migrate plan --from "$TMP/a.json" --gpus 4 --expert-bytes 1 --failed-gpus 1,+2
expect_in "$TMP/err" "--failed-gpus '1,+2' has a signed item '+2': GPUs are numbered 0 to 3"
expect_exit 2 "$EPX" plan --counts '{"logical_count": [[1, 1, 1, 1, 1, 1]]}' --gpus 4 --physical 8 \
    -o "$TMP/x.json" --active-ranks +0,1,2
expect_in "$TMP/err" "--active-ranks '+0,1,2' has a signed item '+0': ranks are numbered 0 to 3"
expect_exit 2 "$EPX" migrate plan --from "$TMP/a.json" --to "$TMP/b.json" --gpus 4 --expert-bytes 1 --failed-gpus 7
expect_in "$TMP/err" "--failed-gpus '7': item 1 (7) is above the limit 3"
# An id past what epx supports, up to the reader's INT32_MAX: inferring E as
# max id + 1 overflowed there (undefined behaviour; the repair then blamed
# "outside [0, 5)"), and a large id read as a model of 2147483647 experts.
for id in 2147483647 2147483646; do
    echo "{\"physical_to_logical_map\": [[$id, 0, 1, 4, 2, 3, 4, 2]]}" >"$TMP/big.json"
    expect_exit 2 "$EPX" migrate plan --from "$TMP/big.json" --to "$TMP/b.json" --gpus 4 --expert-bytes 1
    expect_in "$TMP/err" "big.json': layer 0, slot 0 holds logical expert $id, past the 1048576 experts"
    expect_exit 2 "$EPX" migrate plan --from "$TMP/a.json" --to "$TMP/big.json" --gpus 4 --expert-bytes 1
    expect_in "$TMP/err" "big.json': layer 0, slot 0 holds logical expert $id, past the 1048576 experts"
    expect_exit 2 "$EPX" migrate plan --from "$TMP/big.json" --gpus 4 --expert-bytes 1 --failed-gpus 1
    expect_in "$TMP/err" "big.json': layer 0, slot 0 holds logical expert $id, past the 1048576 experts"
done
expect_exit 2 "$EPX" migrate apply --from "$TMP/a.json" --to "$TMP/b.json" --gpus 4 --expert-bytes 1
expect_in "$TMP/err" "only action is 'plan'"

# epx plan with the layout in service, on two windows of the Qwen3 trace.
[ -d "${EPX_SHARED:-}/traces" ] || { echo "no shared/traces: skipping the planner part"; exit 0; }
python3 - "$EPX_SHARED/traces/qwen3_235b.json" "$TMP" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for w in (0, 1):
    json.dump({"logical_count": d["logical_count"][w]}, open(f"{sys.argv[2]}/w{w}.json", "w"))
PY
expect_exit 0 "$EPX" plan --counts "$TMP/w0.json" --gpus 8 --redundant 16 -o "$TMP/p0.json"
expect_exit 0 "$EPX" plan --counts "$TMP/w1.json" --gpus 8 --redundant 16 -o "$TMP/p1.json" \
    --current "$TMP/p0.json" --max-moves 200 --expert-bytes 37748736
expect_in "$TMP/out" "moves from --current: " "balance gained per GB moved"
expect_exit 0 "$EPX" plan --counts "$TMP/w1.json" --gpus 8 --redundant 16 -o "$TMP/pp.json" \
    --current "$TMP/p0.json" --move-price 0.002
python3 - "$TMP/p0.json" "$TMP/p1.json" "$TMP/pp.json" <<'PY' || fail "plan --current"
import json, sys
a, b, c = (json.load(open(f))["physical_to_logical_map"] for f in sys.argv[1:])
moved = sum(x != y for ra, rb in zip(a, b) for x, y in zip(ra, rb))
assert 0 < moved <= 200, moved
assert all(sorted(set(r)) == list(range(128)) for r in b)
moved_p = sum(x != y for ra, rc in zip(a, c) for x, y in zip(ra, rc))
assert moved_p < sum(len(r) for r in a) // 2, moved_p
PY
expect_exit 2 "$EPX" plan --counts "$TMP/w1.json" --gpus 8 --redundant 16 -o "$TMP/x.json" --max-moves 5
expect_in "$TMP/err" "--max-moves counts moves from the placement in service" "--current FILE"
# Losing GPU 2 of 8 (144 slots, 18 per GPU, 126 live: too few for 128 experts).
expect_exit 2 "$EPX" plan --counts "$TMP/w1.json" --gpus 8 --redundant 16 -o "$TMP/x.json" --failed-gpus 2
expect_in "$TMP/err" "--failed-gpus '2' leaves 7 surviving GPU(s) with 18 slots each, 126 slots for 128 experts" \
    "give at least 8 surviving GPUs, or more slots per GPU (P >= 152: 19 per GPU)"
expect_exit 0 "$EPX" plan --counts "$TMP/w1.json" --gpus 8 --redundant 24 -o "$TMP/f.json" \
    --failed-gpus 2 --report "$TMP/f_report.json"
python3 - "$TMP/f.json" "$TMP/f_report.json" <<'PY' || fail "plan --failed-gpus"
import json, sys
m = json.load(open(sys.argv[1]))["physical_to_logical_map"]
w = json.load(open(sys.argv[2]))["replica_weights"]
spg = 19
for l, row in enumerate(m):
    live = set(e for g in range(8) if g != 2 for e in row[g * spg:(g + 1) * spg])
    assert live == set(range(128)), l
    assert all(x == 0 for x in w[l][2 * spg:3 * spg]), l
PY
exit 0
