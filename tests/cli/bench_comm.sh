#!/bin/bash
# epx bench comm (MPI backend, 2 ranks) and epx advise: the bench checks its
# results before timing and prints every op per token count; its JSON feeds
# advise --measured; advise answers for Kimi-K2.5 on 8 GPUs over PCIe Gen5
# and NVLink with the numbers behind it; bad input is refused clearly.
set -u
fail() { echo "FAIL: $*"; exit 1; }
out=$("$EPX_BIN" advise --model kimi-k2.5 --gpus 8 --link pcie5) || fail "advise pcie5 exited $?"
grep -q "answer: EP starts to win at [0-9]* tokens per step" <<<"$out" || fail "no crossover for pcie5: $out"
grep -q "assumptions:" <<<"$out" || fail "assumptions not stated"
out=$("$EPX_BIN" advise --model kimi-k2.5 --gpus 8 --link nvlink4) || fail "advise nvlink4 exited $?"
grep -q "answer: EP starts to win" <<<"$out" || fail "no answer for nvlink4: $out"
j=$("$EPX_BIN" advise --model deepseek-v3 --gpus 8 --link nvlink5 --json) || fail "advise --json exited $?"
grep -q '"crossover_tokens"' <<<"$j" || fail "advise --json lacks crossover_tokens: $j"
"$EPX_BIN" advise --model kimi-k2.5 --gpus 8 --link pcie9 2>/dev/null && fail "unknown link accepted"
msg=$("$EPX_BIN" advise --model kimi-k2.5 --gpus 8 --link pcie9 2>&1)
grep -q "known: nvlink3" <<<"$msg" || fail "unknown link message: $msg"
"$EPX_BIN" bench comm --backend gloo --model kimi-k2.5 --tokens 1 2>/dev/null; [ $? -eq 2 ] || fail "bad backend not a usage error"
"$EPX_BIN" bench comm --backend mpi --model kimi-k2.5 --tokens 1,x 2>/dev/null; [ $? -eq 2 ] || fail "bad token list not a usage error"
# --gpus N: ranks as threads of one process, over NCCL only; more GPUs than
# visible is a usage error naming both numbers (where a GPU is visible)
msg=$("$EPX_BIN" bench comm --backend mpi --model kimi-k2.5 --tokens 1 --gpus 2 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "use it with --backend nccl" <<<"$msg" || fail "--gpus with mpi: exit $rc: $msg"
msg=$("$EPX_BIN" bench comm --backend mpi --model kimi-k2.5 --tokens 1 --fp8 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "use it with --backend nccl --mode low-latency" <<<"$msg" || fail "--fp8 with mpi: exit $rc: $msg"
msg=$("$EPX_BIN" bench comm --backend nccl --model kimi-k2.5 --tokens 1 --gpus 1024 2>&1); rc=$?
if grep -q "built without NCCL\|none is visible" <<<"$msg"; then
    [ $rc -eq 1 ] || fail "--gpus without a GPU: exit $rc: $msg"
else
    [ $rc -eq 2 ] && grep -q -- "--gpus 1024 asks for more GPUs than the [0-9]* this process sees" \
        <<<"$msg" || fail "--gpus past the visible GPUs: exit $rc: $msg"
fi
# --json appends: a file that holds anything but earlier runs' JSON lines is
# refused before the run and left as it was
tmpj=$(mktemp /tmp/epx-bench-json.XXXXXX)
echo '{"logical_count": [[1, 2]]}' >"$tmpj"
msg=$("$EPX_BIN" bench comm --backend mpi --model kimi-k2.5 --tokens 1 --json "$tmpj" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "holds something other than the JSON lines of earlier runs (line 1" \
    <<<"$msg" || { rm -f "$tmpj"; fail "--json over a counts file: exit $rc: $msg"; }
[ "$(cat "$tmpj")" = '{"logical_count": [[1, 2]]}' ] || { rm -f "$tmpj"; fail "--json spoilt its file"; }
rm -f "$tmpj"

MPIRUN=$(command -v mpirun || true)
if [ -z "$MPIRUN" ]; then echo "mpirun not found: MPI part skipped"; exit 77; fi
if "$EPX_BIN" bench comm --backend mpi --model qwen3-30b --tokens 1 2>&1 | grep -q "built without MPI"; then
    echo "epx built without MPI: bench part skipped"; exit 77
fi
tmp=$(mktemp -d /tmp/epx-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# --model PATH: a HuggingFace config.json's folder names the model (one rank).
out=$("$EPX_BIN" bench comm --backend mpi --model "$EPX_SOURCE/tests/data/hf/gpt-oss-120b" --tokens 1 \
    --iters 1 --warmup 0 2>&1) || fail "bench comm --model PATH exited $?: $out"
grep -qF "(H 2880, top-4, 128 experts)" <<<"$out" || fail "bench comm did not read the config: $out"
# -o writes valid JSON whatever the model folder is named (issue 29): '"', a
# newline, ESC and byte 0xff are escaped, and advise --measured reads it back.
for name in 'q"uote' $'new\nline\x1b[0m' $'byte\xff'; do
    mkdir -p "$tmp/$name"
    cp "$EPX_SOURCE/tests/data/hf/gpt-oss-120b/config.json" "$tmp/$name/"
    "$EPX_BIN" bench comm --backend mpi --model "$tmp/$name" --tokens 1 --iters 1 --warmup 0 \
        -o "$tmp/h.json" >/dev/null 2>&1 || fail "bench comm -o, model folder '$name': exit $?"
    python3 - "$tmp/h.json" <<'PY' || fail "bench comm -o, model folder '$name': not strict JSON"
import json, sys
json.loads(open(sys.argv[1], "rb").read().decode("utf-8"), parse_constant=lambda c: 1 / 0)
PY
    "$EPX_BIN" advise --model "$tmp/$name" --gpus 1 --link pcie5 --measured "$tmp/h.json" \
        --json >/dev/null 2>&1 || true
done
timeout 120 "$MPIRUN" --oversubscribe --allow-run-as-root -np 2 "$EPX_BIN" bench comm --backend mpi \
    --model qwen3-30b --tokens 1,7,32 --iters 3 --warmup 1 -o "$tmp/m.json" >"$tmp/out" 2>&1 ||
    { cat "$tmp/out"; fail "bench comm under mpirun failed"; }
grep -q "2 rank(s)" "$tmp/out" || fail "bench did not run on 2 ranks: $(cat "$tmp/out")"
# The memory check counts every rank on the machine, and what a rank holds
# grows with the ranks (the TP buffer, low latency's blocks from each peer):
# a batch one rank alone would fit, that 4 low-latency ranks would take
# about 0.7 of this machine's memory to run, is refused at once (one rank
# alone would need about 0.06 of it).
mem_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
big=$((mem_kb * 1024 / 10 * 7 / (992 * 7168)))
[ "$big" -gt 1048576 ] && big=1048576
timeout 120 "$MPIRUN" --oversubscribe --allow-run-as-root -np 4 "$EPX_BIN" bench comm --backend mpi \
    --mode low-latency --model kimi-k2 --tokens "1,$big" --iters 1 --warmup 0 >"$tmp/mem" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "on 4 ranks, 4 of them on this machine, needs about" "$tmp/mem" ||
    fail "4 ranks of --tokens $big on one machine: exit $rc: $(head -c 2000 "$tmp/mem")"
# --json onto earlier lines whose file lacks its last newline (an editor, a
# copy): the new lines start on a line of their own, and so does a file of
# blank lines; every line stays readable.
"$EPX_BIN" bench comm --backend mpi --model qwen3-30b --tokens 1 --iters 1 --warmup 0 \
    --json "$tmp/nl.jsonl" >/dev/null 2>&1 || fail "bench comm --json exited $?"
printf '%s' "$(cat "$tmp/nl.jsonl")" >"$tmp/cut.jsonl"
printf '\n\n' >"$tmp/blank.jsonl"
for f in cut blank; do
    out=$("$EPX_BIN" bench comm --backend mpi --model qwen3-30b --tokens 1 --iters 1 --warmup 0 \
        --json "$tmp/$f.jsonl" 2>&1) || fail "--json onto $f.jsonl: exit $?: $out"
done
python3 - "$tmp/cut.jsonl" "$tmp/blank.jsonl" <<'PY' || fail "--json spoilt a file without its last newline"
import json, sys
cut = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
blank = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
assert len(cut) == 8 and len(blank) == 4, (len(cut), len(blank))
PY
grep -q "checked before timing" "$tmp/out" || fail "no check statement"
for t in 1 7 32; do
    for op in dispatch combine allreduce; do
        grep -Eq "^ +$t +$op " "$tmp/out" || fail "no $op row for $t tokens: $(cat "$tmp/out")"
    done
done
grep -q '"format": "epx-bench-comm-1"' "$tmp/m.json" || fail "JSON format tag missing"
out=$("$EPX_BIN" advise --model qwen3-30b --gpus 2 --link pcie5 --measured "$tmp/m.json") ||
    fail "advise --measured exited $?"
grep -q "measured by epx bench comm (mpi, 2 rank(s)" <<<"$out" || fail "measured figures not used: $out"
# The low-latency protocol, checked then timed, as JSON lines.
timeout 120 "$MPIRUN" --oversubscribe --allow-run-as-root -np 2 "$EPX_BIN" bench comm --backend mpi \
    --mode low-latency --model qwen3-30b --tokens 1,5 --iters 3 --warmup 1 --json "$tmp/ll.jsonl" \
    >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "bench comm --mode low-latency failed"; }
grep -q "low-latency mode, 2 rank(s)" "$tmp/out" || fail "no low-latency table: $(cat "$tmp/out")"
[ "$(wc -l <"$tmp/ll.jsonl")" -eq 8 ] || fail "expected 8 JSON lines (2 token counts x 4 phases)"
python3 - "$tmp/ll.jsonl" <<'PY' || fail "JSON lines malformed"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = {"backend", "mode", "ranks", "tokens", "hidden", "topk", "dtype", "phase", "median_us",
        "p99_us", "launches", "graph", "gbps", "copy_pct", "device", "date"}
assert all(keys <= set(r) for r in rows), rows[0]
assert {r["phase"] for r in rows} == {"dispatch", "combine", "round-trip", "allreduce"}
assert {r["mode"] for r in rows} == {"low-latency", "tp-allreduce"}
assert all(r["ranks"] == 2 and r["median_us"] > 0 and r["p99_us"] >= r["median_us"] for r in rows)
PY
out=$("$EPX_BIN" advise --model qwen3-30b --gpus 2 --link pcie5 --measured "$tmp/ll.jsonl") ||
    fail "advise --measured on JSON lines exited $?"
grep -q "measured by epx bench comm (mpi, 2 rank(s)" <<<"$out" || fail "JSON lines not used: $out"
grep -q "low-latency dispatch: .* us" <<<"$out" || fail "low-latency fixed cost not fitted: $out"
# A file gathers runs (--json appends): advise fits each figure on the newest
# run that has it, by date, wherever it sits in the file; an older build's
# slower lines are left out and counted.
python3 - "$tmp/ll.jsonl" "$tmp/runs.jsonl" <<'PY' || fail "could not write the two-run file"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
old = [dict(r, date="2020-01-01T00:00:%02dZ" % i, median_us=r["median_us"] * 10)
       for i, r in enumerate(rows)]
with open(sys.argv[2], "w") as f:
    for r in rows + old:  # the newest run first: dates decide, not the order
        f.write(json.dumps(r) + "\n")
PY
runs=$("$EPX_BIN" advise --model qwen3-30b --gpus 2 --link pcie5 --measured "$tmp/runs.jsonl") ||
    fail "advise --measured on two runs exited $?"
want=$(grep -o "low-latency dispatch: [0-9.]* us + [0-9.]* GB/s" <<<"$out")
got=$(grep -o "low-latency dispatch: [0-9.]* us + [0-9.]* GB/s" <<<"$runs")
[ -n "$want" ] && [ "$want" = "$got" ] || fail "two runs: fitted '$got', the newest run alone '$want'"
grep -q "of the newest run; 2 older line(s) left out" <<<"$runs" ||
    fail "the older run's lines not counted: $runs"
"$EPX_BIN" bench comm --backend mpi --mode low-latency --combine rank --model qwen3-30b --tokens 1 2>/dev/null
[ $? -eq 2 ] || fail "low latency with rank-order combine not a usage error"
"$EPX_BIN" bench comm --backend mpi --mode low-latency --graph --model qwen3-30b --tokens 1 2>/dev/null
[ $? -eq 2 ] || fail "--graph without the GPU engine not a usage error"
echo '{"rows": []}' >"$tmp/bad.json"
"$EPX_BIN" advise --model qwen3-30b --gpus 2 --link pcie5 --measured "$tmp/bad.json" 2>/dev/null
[ $? -eq 2 ] || fail "a file without the format tag was accepted"
echo ok
