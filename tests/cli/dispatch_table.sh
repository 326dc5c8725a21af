# dispatch_table.sh - `epx dispatch-table`: SGLang's table from a mapping
# (ascending order) and from a golden case's logical_to_physical_map
# (replica-rank order) equals the golden tables, --rank writes one [L][E]
# slice, epx's table keeps every rank on a replica of the right expert,
# every bad option exits 2 with a message, and a long table shows its
# progress on a terminal.
. "$(dirname "$0")/../util/cli_lib.sh"
SRC=${EPX_SOURCE:-$(dirname "$0")/../..}
CASE="$SRC/tests/data/dispatch/mixtral_8gpu_int.json"
[ -f "$CASE" ] || fail "$CASE missing"

# These goldens are SGLang <= 0.5.2's.
expect_exit 0 "$EPX" dispatch-table --placement "$CASE" --gpus 8 --sglang-version 0.5.2 -o "$TMP/asc.json"
expect_in "$TMP/out" "SGLang 0.5.2 table (ascending order) for 8 ranks x 32 layers x 8 experts"
expect_exit 0 "$EPX" dispatch-table --placement "$CASE" --gpus 8 --order replica-rank --sglang-version 0.5.2 -o "$TMP/rr.json"
expect_exit 0 "$EPX" dispatch-table --placement "$CASE" --gpus 8 --rank 3 --sglang-version 0.5.2 -o "$TMP/r3.json"
expect_in "$TMP/out" "table (ascending order) for rank 3 x 32 layers x 8 experts"
python3 - "$CASE" "$TMP" <<'PY' || fail "tables differ from the golden case"
import json, sys
case = json.load(open(sys.argv[1]))
d = sys.argv[2]
asc = json.load(open(d + "/asc.json"))
rr = json.load(open(d + "/rr.json"))
r3 = json.load(open(d + "/r3.json"))
assert list(asc) == ["logical_to_rank_dispatch_physical_map"]
assert asc["logical_to_rank_dispatch_physical_map"] == case["rank_dispatch_from_mapping"]
assert rr["logical_to_rank_dispatch_physical_map"] == case["rank_dispatch_from_eplb"]
assert r3["logical_to_rank_dispatch_physical_map"] == case["rank_dispatch_from_mapping"][3]
PY

# epx's table, with and without an expected load.
python3 - "$CASE" "$TMP/counts.json" <<'PY'
import json, sys
case = json.load(open(sys.argv[1]))
json.dump({"logical_count": case["weight"]}, open(sys.argv[2], "w"))
PY
expect_exit 0 "$EPX" dispatch-table --placement "$CASE" --gpus 8 --algorithm epx --counts "$TMP/counts.json" -o "$TMP/epx.json"
expect_in "$TMP/out" "epx table" "balancedness of the load under this table"
expect_exit 0 "$EPX" dispatch-table --placement "$CASE" --gpus 8 --nodes 2 --algorithm epx -o "$TMP/epx2.json"
python3 - "$CASE" "$TMP/epx.json" <<'PY' || fail "epx table sends a rank to a slot without its expert"
import json, sys
case = json.load(open(sys.argv[1]))
t = json.load(open(sys.argv[2]))["logical_to_rank_dispatch_physical_map"]
p2l = case["physical_to_logical_map"]
per = len(p2l[0]) // 8
for g, tl in enumerate(t):
    for l, row in enumerate(tl):
        for e, p in enumerate(row):
            assert p2l[l][p] == e
            if any(p2l[l][q] == e and q // per == g for q in range(len(p2l[l]))):
                assert p // per == g
PY

# Each release of tests/data/sglang_tables (SGLang's own output), --nodes
# honoured: a 2-node and an 8-node case, both orders, one rank alone; with
# --rank-lists, each rank's replica lists as the release keeps them.
for C in crafted_101_g8_n2 crafted_106_g16_n8; do
    SC="$SRC/tests/data/sglang_tables/$C.json"
    G=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["num_gpus"])' "$SC")
    N=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["num_nodes"])' "$SC")
    for V in 0.5.2 0.5.3 0.5.4.post2 0.5.15 0.5.16 0.5.23; do
        expect_exit 0 "$EPX" dispatch-table --placement "$SC" --gpus "$G" --nodes "$N" --sglang-version "$V" -o "$TMP/m.json" --rank-lists "$TMP/ml.json"
        expect_in "$TMP/out" "SGLang $V table" "replica lists of ranks 0 to $((G - 1)) (ascending, cut as init_by_mapping)"
        expect_exit 0 "$EPX" dispatch-table --placement "$SC" --gpus "$G" --nodes "$N" --sglang-version "$V" --order replica-rank -o "$TMP/e.json" --rank-lists "$TMP/el.json"
        expect_exit 0 "$EPX" dispatch-table --placement "$SC" --gpus "$G" --nodes "$N" --sglang-version "$V" --rank 1 -o "$TMP/m1.json" --rank-lists "$TMP/ml1.json"
        python3 - "$SC" "$TMP" "$V" <<'PY' || fail "$C: tables differ from SGLang $V's"
import json, sys
case, d, v = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
want = case["sglang"][v]
get = lambda f: json.load(open(d + f))["logical_to_rank_dispatch_physical_map"]
assert get("/m.json") == want["rank_dispatch_from_mapping"]
assert get("/e.json") == want["rank_dispatch_from_eplb"]
assert get("/m1.json") == want["rank_dispatch_from_mapping"][1]
lists = lambda f: json.load(open(d + f))["logical_to_all_physical_map"]
assert lists("/ml.json") == want["logical_to_all_physical_map_from_mapping"]
# one rank alone: its lists, padded to its own widest
mine = [[[p for p in x if p >= 0] for x in lay] for lay in lists("/ml1.json")]
assert mine == [[[p for p in x if p >= 0] for x in lay]
                for lay in want["logical_to_all_physical_map_from_mapping"][1]]
# replica-rank order: DeepSeek's lists on every rank, never cut
l2p = [[[p for p in x if p >= 0] for x in lay] for lay in case["logical_to_physical_map"]]
assert all([[[p for p in x if p >= 0] for x in lay] for lay in rk] == l2p for rk in lists("/el.json"))
PY
    done
done
# SGLang 0.5.2's rule has no node step (its tables above on 2 and 8 nodes
# are its tables on one): --nodes says so rather than pass unremarked.
SC="$SRC/tests/data/sglang_tables/crafted_101_g8_n2.json"
expect_exit 0 "$EPX" dispatch-table --placement "$SC" --gpus 8 --nodes 2 --sglang-version 0.5.2 -o "$TMP/n2.json"
expect_in "$TMP/err" "note: SGLang 0.5.2's rule does not look at nodes" "--nodes 2 gives the table of one node"
expect_exit 0 "$EPX" dispatch-table --placement "$SC" --gpus 8 --sglang-version 0.5.2 -o "$TMP/n1.json"
cmp -s "$TMP/n1.json" "$TMP/n2.json" || fail "0.5.2: the tables of 1 and 2 nodes differ"
[ ! -s "$TMP/err" ] || fail "0.5.2 on one node: $(cat "$TMP/err")"
expect_exit 0 "$EPX" dispatch-table --placement "$SC" --gpus 8 --nodes 2 --sglang-version 0.5.3 -o "$TMP/n3.json"
[ ! -s "$TMP/err" ] || fail "0.5.3 on 2 nodes noted: $(cat "$TMP/err")"
# The default is the newest verified release, named in the help.
expect_exit 0 "$EPX" dispatch-table --placement "$SC" --gpus 8 --nodes 2 -o "$TMP/d.json"
expect_in "$TMP/out" "SGLang 0.5.23 table"
python3 - "$SC" "$TMP/d.json" <<'PY' || fail "the default table differs from SGLang 0.5.23's"
import json, sys
assert json.load(open(sys.argv[2]))["logical_to_rank_dispatch_physical_map"] == \
    json.load(open(sys.argv[1]))["sglang"]["0.5.23"]["rank_dispatch_from_mapping"]
PY
expect_exit 0 "$EPX" dispatch-table --help
expect_in "$TMP/out" "--sglang-version" "default 0.5.23"
# A newer release warns and uses the newest rule; a malformed one is refused.
expect_exit 0 "$EPX" dispatch-table --placement "$SC" --gpus 8 --nodes 2 --sglang-version 0.6.1 -o "$TMP/n.json"
expect_in "$TMP/err" "newer than the newest release epx verified (0.5.23); using 0.5.23's dispatch rule"
# ... and the table is labelled with the release whose rule made it, as plan
# words it (it read "SGLang 0.6.1 table" and "using that release's rule")
expect_in "$TMP/out" "SGLang 0.5.23 (asked: 0.6.1) table"
cmp -s "$TMP/n.json" "$TMP/d.json" || fail "0.6.1's table is not 0.5.23's"
expect_exit 2 "$EPX" dispatch-table --placement "$SC" --gpus 8 --sglang-version 0.5.16rc1 -o "$TMP/x.json"
expect_in "$TMP/err" "MAJOR.MINOR"
expect_exit 2 "$EPX" dispatch-table --placement "$SC" --gpus 8 --algorithm epx --sglang-version 0.5.2 -o "$TMP/x.json"
expect_in "$TMP/err" "--algorithm sglang only"
# --rank-lists: SGLang's only, JSON, never the table's own path; in the help.
expect_exit 2 "$EPX" dispatch-table --placement "$SC" --gpus 8 --algorithm epx -o "$TMP/x.json" --rank-lists "$TMP/xl.json"
expect_in "$TMP/err" "--rank-lists is used by --algorithm sglang only"
expect_exit 2 "$EPX" dispatch-table --placement "$SC" --gpus 8 -o "$TMP/x.json" --rank-lists "$TMP/xl.pt"
expect_in "$TMP/err" "--rank-lists" "name it .json"
expect_exit 2 "$EPX" dispatch-table --placement "$SC" --gpus 8 -o "$TMP/x.json" --rank-lists "$TMP/x.json"
expect_in "$TMP/err" "same file"
[ ! -e "$TMP/x.json" ] && [ ! -e "$TMP/xl.json" ] || fail "a refused --rank-lists run wrote a file"
expect_exit 0 "$EPX" dispatch-table --help
expect_in "$TMP/out" "--rank-lists FILE" "logical_to_all_physical_map [G][L][E][X]"

# A plain mapping file has no replica-rank order.
python3 -c 'import json; print(json.dumps({"physical_to_logical_map": [[0, 1, 2, 3, 0, 1, 2, 3]]}))' >"$TMP/map.json"
expect_exit 2 "$EPX" dispatch-table --placement "$TMP/map.json" --gpus 4 --order replica-rank -o "$TMP/x.json"
expect_in "$TMP/err" "logical_to_physical_map" "--order ascending"
# Maps that disagree.
python3 -c 'import json; print(json.dumps({"physical_to_logical_map": [[0, 1, 0, 1]], "logical_to_physical_map": [[[0, 1], [3, -1]]]}))' >"$TMP/bad.json"
expect_exit 2 "$EPX" dispatch-table --placement "$TMP/bad.json" --gpus 2 --order replica-rank -o "$TMP/x.json"
expect_in "$TMP/err" "lists slot 1" "disagree"
# Lists that repeat a slot, miss one, pad before a slot or name one past P.
rr() { # NAME LISTS NEEDLE...
    local name=$1 lists=$2
    shift 2
    echo "{\"physical_to_logical_map\": [[0, 1, 0, 1]], \"logical_to_physical_map\": [$lists]}" \
        >"$TMP/$name.json"
    expect_exit 2 "$EPX" dispatch-table --placement "$TMP/$name.json" --gpus 2 --order replica-rank \
        -o "$TMP/x.json"
    expect_in "$TMP/err" "$@"
}
rr twice '[[0, 0], [1, 3]]' "logical_to_physical_map[0][0] lists slot 0 twice (columns 0 and 1)"
rr missing '[[0, -1], [1, 3]]' "lists 1 of the 2 slots physical_to_logical_map gives expert 0 (slot 2 is missing)"
rr padfirst '[[-1, 0, 2], [1, 3, -1]]' "lists slot 0 after the padding at column 0"
rr past '[[0, 9], [1, 3]]' "lists slot 9 outside [0, 4) (the slots per layer)"
[ -e "$TMP/x.json" ] && fail "a refused table was written"
# Bad options.
expect_exit 2 "$EPX" dispatch-table --placement "$TMP/map.json" --gpus 3 -o "$TMP/x.json"
expect_exit 2 "$EPX" dispatch-table --placement "$TMP/map.json" --gpus 4 --rank 4 -o "$TMP/x.json"
expect_in "$TMP/err" "--rank 4"
expect_exit 2 "$EPX" dispatch-table --placement "$TMP/map.json" --gpus 4 --order sideways -o "$TMP/x.json"
expect_exit 2 "$EPX" dispatch-table --placement "$TMP/map.json" --gpus 4 --algorithm fast -o "$TMP/x.json"
expect_exit 2 "$EPX" dispatch-table --placement "$TMP/map.json" --gpus 4 --counts "$TMP/counts.json" -o "$TMP/x.json"
expect_in "$TMP/err" "--algorithm epx only"
expect_exit 2 "$EPX" dispatch-table --placement "$TMP/map.json" --gpus 4 --algorithm epx --seed 1 -o "$TMP/x.json"
expect_exit 2 "$EPX" dispatch-table --placement "$TMP/map.json" --gpus 4 --algorithm epx --counts "$TMP/counts.json" -o "$TMP/x.json"
expect_in "$TMP/err" "--counts is [32][8]"
expect_exit 2 "$EPX" dispatch-table --gpus 4 -o "$TMP/x.json"
expect_exit 0 "$EPX" dispatch-table --help
expect_in "$TMP/out" "replica-rank" "logical_to_physical_map"

# SGLang's cut table is G passes of the whole table (about 5 min on two
# cores at 1,024 GPUs x 61 layers x 384 experts): on a terminal its progress
# shows on stderr, as plan's and demo's do (cli_progress: nothing off a
# terminal, nor for work under a quarter second). About a second of work
# here, on two threads: the first pass told may be the second, and the clock
# still starts there (it once counted from the boot).
if command -v script >/dev/null 2>&1; then
    expect_exit 0 "$EPX" layout trivial --layers 16 --experts 64 --gpus 256 --redundant 192 \
        -o "$TMP/g256.json"
    EPX_THREADS=2 script -qec "'$EPX' dispatch-table --placement '$TMP/g256.json' --gpus 256 \
        -o '$TMP/t256.json'" /dev/null >"$TMP/tty" 2>&1 ||
        { cat "$TMP/tty" >&2; fail "dispatch-table on a terminal failed"; }
    tr '\r' '\n' <"$TMP/tty" >"$TMP/tty.lines"
    expect_in "$TMP/tty.lines" "epx dispatch-table: ranks computed 256/256 ("
    sed -n 's/.*ranks computed [0-9]*\/256 (\([0-9.]*\) s).*/\1/p' "$TMP/tty.lines" |
        awk '$1 > 60 { bad = 1 } END { exit bad }' ||
        { cat "$TMP/tty.lines" >&2; fail "elapsed time past a minute"; }
else
    echo "note: script(1) not installed; progress on a terminal not checked"
fi
echo "dispatch-table: golden tables reproduced from both orders; errors explained"
