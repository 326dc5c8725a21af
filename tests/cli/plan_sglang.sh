#!/bin/bash
# plan_sglang.sh - `epx plan --sglang-version V` (issue 18): the mapping
# equals what SGLang release V's own EPLB placed (tests/data/sglang_eplb,
# from tools/sglang_eplb.py) on both sides of its change at 0.5.11, the
# default is DeepSeek's original (equal to SGLang <= 0.5.10.post1 where no
# loads tie: those releases order ties as torch's sort does), the report
# always carries logical_to_physical_map in the order SGLang builds
# (replica-rank for DeepSeek plans, ascending for epx's), dispatch-table
# reads it, and bad or newer releases are refused or warned about.
set -u
. "${EPX_SOURCE:?EPX_SOURCE is not set}/tests/util/cli_test.sh"
cli_scratch plan_sglang
command -v python3 >/dev/null || { echo "skip: python3 not installed"; exit 77; }
CASE=$EPX_SOURCE/tests/data/sglang_eplb/parting_2_g8_n2.json # 8 GPUs, 2 nodes, 8 groups, P 96
plan=("$EPX" plan --counts "$CASE" --gpus 8 --nodes 2 --groups 8 --physical 96 --algorithm auto)

same() { # MAPPING REPORT VERSION: the release's placement, and the report agrees
    python3 - "$CASE" "$@" <<'PY'
import json, sys
case, m, r, v = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), json.load(open(sys.argv[3])), sys.argv[4]
want = case["sglang"][v]
assert m["physical_to_logical_map"] == want["physical_to_logical_map"], "placement differs"
assert r["physical_to_logical_map"] == m["physical_to_logical_map"]
assert r["logical_to_physical_order"] == "replica-rank"
l2p, w = r["logical_to_physical_map"], want["logical_to_physical_map"]
assert len(l2p[0][0]) == len(w[0][0]), "width is not the largest replica count"
assert l2p == w, "replica-rank lists differ"
PY
}
for v in 0.5.10.post1 0.5.11; do
    check "plan $v" expect_rc 0 "${plan[@]}" --sglang-version "$v" -o "m$v.json" --report "r$v.json"
    check "equals SGLang $v" same "m$v.json" "r$v.json" "$v"
done
check "the releases part on this load" bash -c '! cmp -s m0.5.10.post1.json m0.5.11.json'
check "default: DeepSeek's original" expect_rc 0 "${plan[@]}" -o m.json --report r.json
check "default = 0.5.10.post1 on this tie-free load" cmp -s m.json m0.5.10.post1.json
check "report: no release" python3 -c 'import json,sys; assert json.load(open("r.json"))["sglang_version"] is None'
check "report: the release" python3 -c 'import json,sys; assert json.load(open("r0.5.11.json"))["sglang_version"] == "0.5.11"'

# epx's plan: SGLang reads the mapping file, so its lists are ascending.
check "plan epx" expect_rc 0 "$EPX" plan --counts "$CASE" --gpus 8 --physical 96 -o e.json --report re.json
check "epx report: ascending lists" python3 - re.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["logical_to_physical_order"] == "ascending"
for row, lists in zip(r["physical_to_logical_map"], r["logical_to_physical_map"]):
    for e, slots in enumerate(lists):
        s = [p for p in slots if p >= 0]
        assert s == sorted(p for p in range(len(row)) if row[p] == e), (e, slots)
        assert slots[len(s):] == [-1] * (len(slots) - len(s))
PY

# The report is a placement dispatch-table reads in replica-rank order.
check "dispatch-table from the report" expect_rc 0 "$EPX" dispatch-table --placement r0.5.11.json \
    --gpus 8 --nodes 2 --order replica-rank -o t.json
check "table names replicas of the right experts" python3 - r0.5.11.json t.json <<'PY'
import json, sys
r, t = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))["logical_to_rank_dispatch_physical_map"]
p2l = r["physical_to_logical_map"]
assert all(p2l[l][slot] == e for rank in t for l, row in enumerate(rank) for e, slot in enumerate(row))
PY

check "junk release" refuse "SGLang release '0.5.x' is not MAJOR.MINOR" "${plan[@]}" --sglang-version 0.5.x -o x.json
check "pre-release" refuse "'0.5.11rc1'" "${plan[@]}" --sglang-version 0.5.11rc1 -o x.json
# one parser for every release string (issue 29): MAJOR.MINOR.PATCH[.postN] from the oldest
# release epx reproduces (0.5.2); shortened, suffixed or older ones are refused
for v in 0.5 0.5.post1 0.5.2junk 0.05.2 " 0.5.2" "0.5.2 " ""; do
    check "release '$v' refused" refuse "is not MAJOR.MINOR.PATCH[.postN]" "${plan[@]}" \
        --sglang-version "$v" -o x.json
done
for v in 0.4.0 0.0.0 0.5.1 0.5.1.post2; do
    check "release $v refused as too old" refuse "older than 0.5.2, the oldest release epx reproduces" \
        "${plan[@]}" --sglang-version "$v" -o x.json
    check "  dispatch-table too" refuse "older than 0.5.2" "$EPX" dispatch-table --placement \
        m0.5.11.json --gpus 8 --nodes 2 --sglang-version "$v" -o x.json
done
check "dispatch-table refuses 0.5" refuse "is not MAJOR.MINOR.PATCH" "$EPX" dispatch-table \
    --placement m0.5.11.json --gpus 8 --nodes 2 --sglang-version 0.5 -o x.json
check "the oldest is accepted" expect_rc 0 "${plan[@]}" --sglang-version 0.5.2 -o o.json
check "  and its .postN" expect_rc 0 "${plan[@]}" --sglang-version 0.5.2.post1 -o o.json
check "epx refuses it" refuse "--sglang-version) '0.5.11' applies to the DeepSeek modes" \
    "$EPX" plan --counts "$CASE" --gpus 8 --physical 96 --sglang-version 0.5.11 -o x.json
check "nothing written on refusal" test ! -e x.json
check "newer release warns" expect_rc 0 "${plan[@]}" --sglang-version 0.7.0 -o n.json
check "  the warning" grep -qF "SGLang 0.7.0 is newer than the newest release epx verified (0.5.23)" err
check "  with the newest rule" cmp -s n.json m0.5.11.json
# SGLang 0.5.23's deepseek_vec and elasticity_aware (issue 27): the mapping and
# the report's replica-rank lists equal the release's (tests/data/sglang_eplb_0523);
# deepseek-vec reads the windows as steps, elasticity-aware the active ranks.
D=$EPX_SOURCE/tests/data/sglang_eplb_0523
same0523() { # CASE MAPPING REPORT
    python3 - "$@" <<'PY'
import json, sys
case, m, r = (json.load(open(a)) for a in sys.argv[1:4])
want = case["sglang"]["0.5.23"]
assert m["physical_to_logical_map"] == want["physical_to_logical_map"], "placement differs"
assert r["sglang_version"] == "0.5.23" and r["logical_to_physical_order"] == "replica-rank"
w, X = want["logical_to_physical_map"], len(want["logical_to_physical_map"][0][0])
# the report is as wide as the largest replica count; deepseek_vec's lists P - E + 1
l2p = [[(lst + [-1] * X)[:X] for lst in layer] for layer in r["logical_to_physical_map"]]
assert l2p == w, "replica-rank lists differ"
PY
}
for c in form_1_deepseek_vec hvec_float_01_s40 elh_int_1_m2 el_int_3_m2; do
    f=$D/$c.json
    args=$(python3 - "$f" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
a = ["--gpus", c["num_gpus"], "--nodes", c["num_nodes"], "--physical", c["num_physical_experts"],
     "--algorithm", c["algorithm"].replace("_", "-")]
if c["num_groups"] and "hierarchical" in c["algorithm"]:  # the global forms take none
    a += ["--groups", c["num_groups"]]
if "active_ranks" in c:
    a += ["--active-ranks", ",".join(str(g) for g, x in enumerate(c["active_ranks"]) if x)]
print(" ".join(map(str, a)))
PY
)
    # shellcheck disable=SC2086
    check "plan $c" expect_rc 0 "$EPX" plan --counts "$f" $args -o "v$c.json" --report "rv$c.json"
    check "  equals SGLang 0.5.23" same0523 "$f" "v$c.json" "rv$c.json"
done
el=("$EPX" plan --counts "$D/el_int_0_m0.json" --gpus 4 --physical 24 --algorithm elasticity-aware)
check "active ranks: empty" refuse "--active-ranks '' is not a comma-separated list" "${el[@]}" --active-ranks "" -o x.json
check "active ranks: twice" refuse "names rank 2 twice" "${el[@]}" --active-ranks 0,2,2 -o x.json
check "active ranks: out of range" refuse "item 2 (4) is above the limit 3" "${el[@]}" --active-ranks 0,4 -o x.json
check "active ranks: too few" refuse "leaves 2 rank(s) with 6 slots each, 12 slots for 16 experts" "${el[@]}" --active-ranks 0,3 -o x.json
check "  names the fix" grep -qF "give at least 3 active ranks" err
# epx's own planner takes them too: the ranks left out hold nothing (issue 27 item 3)
check "active ranks: epx plans on them" expect_rc 0 "$EPX" plan --counts "$D/el_int_0_m0.json" --gpus 4 --physical 24 --active-ranks 0,1,3 -o ea.json --report rea.json
check "  rank 2 is served by nobody" python3 - rea.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["live_gpus"] == [0, 1, 3], r["live_gpus"]
spg = 6
for w, row in zip(r["replica_weights"], r["physical_to_logical_map"]):
    assert all(x == 0 for x in w[2 * spg:3 * spg]), w
    assert set(row[:2 * spg] + row[3 * spg:]) == set(range(16)), row
assert 0 < r["balancedness_live_gpus"] <= 1
PY
check "active ranks: epx, too few" refuse "leaves 2 rank(s) with 6 slots each" "$EPX" plan --counts "$D/el_int_0_m0.json" --gpus 4 --physical 24 --active-ranks 0,1 -o x.json
check "active ranks: not with --failed-gpus" refuse "not both" "${el[@]}" --active-ranks 0,1,2 --failed-gpus 3 -o x.json
check "elasticity-aware before 0.5.23 refused" refuse "give --sglang-version 0.5.23" "${el[@]}" --sglang-version 0.5.11 -o x.json
check "nothing written on refusal" test ! -e x.json
check "help names the releases" bash -c '"$0" plan --help 2>&1 | grep -q "0.5.2 - 0.5.23"' "$EPX"
exit $fail
