#!/bin/bash
# The low-latency engine's transports from the CLI without a GPU: epx advise
# --transport states and prices the host-memory transport (twice the bytes
# on the link), --measured uses the asked transport's JSON lines only and
# says which to ask for when the file has another's; epx bench comm
# --transport is refused where it means nothing, and a bad value is named.
set -u
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d /tmp/epx-transport.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
A=("$EPX_BIN" advise --model kimi-k2.5 --gpus 8 --link pcie5)
peer=$("${A[@]}" --json) || fail "advise exited $?"
host=$("${A[@]}" --transport host --json) || fail "advise --transport host exited $?"
grep -q '"transport": "peer"' <<<"$peer" || fail "default transport is not peer: $peer"
grep -q '"transport": "host"' <<<"$host" || fail "--transport host not reported: $host"
slope() { sed 's/.*"ep_low_latency_us": \[[0-9.]*, \([0-9.]*\)\].*/\1/' <<<"$1"; }
awk -v p="$(slope "$peer")" -v h="$(slope "$host")" 'BEGIN { exit !(h > 1.99 * p && h < 2.01 * p) }' ||
    fail "host transport's per-token cost $(slope "$host") is not twice peer's $(slope "$peer")"
out=$("${A[@]}" --transport host) || fail "advise text exited $?"
grep -q "low-latency transport host: pinned host memory" <<<"$out" || fail "host transport not stated: $out"
out=$("${A[@]}") || fail "advise text exited $?"
grep -q "need --transport host" <<<"$out" || fail "peer transport's limit not stated: $out"
msg=$("${A[@]}" --transport nvme 2>&1); rc=$?
[ $rc -eq 2 ] || fail "--transport nvme exited $rc"
grep -q "not 'nvme'" <<<"$msg" || fail "bad transport not named: $msg"

# Measured lines of the host transport only (two low-latency points per
# phase, the all-reduce), as epx bench comm --json writes them.
line() { # mode phase tokens us gbps transport
    printf '{"backend": "nccl", "mode": "%s", "ranks": 1, "tokens": %d, "hidden": 7168, "topk": 8, "dtype": "bf16", "phase": "%s", "median_us": %s, "p99_us": %s, "launches": 1, "graph": false, "gbps": %s, "copy_pct": null, "device": "H200"%s}\n' \
        "$1" "$3" "$2" "$4" "$4" "$5" "${6:+, \"transport\": \"$6\", \"link_pct\": 50.0}"
}
{
    line low-latency dispatch 1 20.0 1.0 host
    line low-latency dispatch 32 60.0 10.0 host
    line low-latency combine 1 22.0 1.0 host
    line low-latency combine 32 70.0 10.0 host
    line tp-allreduce allreduce 1 10.0 1.0 ""
    line tp-allreduce allreduce 32 12.0 40.0 ""
} >"$tmp/host.jsonl"
msg=$("${A[@]}" --measured "$tmp/host.jsonl" 2>&1); rc=$?
[ $rc -eq 2 ] || fail "host-only figures read as peer's: exit $rc: $msg"
grep -q "low-latency figures of the host transport only" <<<"$msg" || fail "message: $msg"
grep -q "pass --transport host" <<<"$msg" || fail "the fix is not named: $msg"
out=$("${A[@]}" --measured "$tmp/host.jsonl" --transport host) || fail "advise --measured --transport host exited $?"
grep -q "low-latency dispatch: .* (both fitted, 2 points)" <<<"$out" || fail "host lines not fitted: $out"

# Lines of another rank count (processes sharing a GPU, another machine) are
# not fitted with the rest, and the fit says so; nor are lines timed with
# another token bound than the batch's own (--token-bound max).
{
    cat "$tmp/host.jsonl"
    sed 's/"ranks": 1/"ranks": 2/; s/"median_us": \([0-9.]*\)/"median_us": 9\1/' "$tmp/host.jsonl"
    grep '"low-latency"' "$tmp/host.jsonl" | grep '"tokens": 1,' |
        sed 's/"median_us": \([0-9.]*\)/"median_us": 7\1/; s/}$/, "token_bound": 32}/'
} >"$tmp/mixed.jsonl"
out=$("${A[@]}" --measured "$tmp/mixed.jsonl" --transport host) || fail "advise on mixed lines exited $?"
grep -q "6 line(s) of other rank counts left out" <<<"$out" || fail "other rank counts not named: $out"
grep -q "low-latency dispatch: .* (both fitted, 2 points)" <<<"$out" ||
    fail "other ranks' or another bound's lines fitted: $out"
# Without --gpus's count in the file, the newest line's count is fitted (by
# date, wherever it sits), not the first line's.
{
    sed 's/"ranks": 1/"ranks": 2/; s/}$/, "date": "2020-01-01T00:00:00Z"}/' "$tmp/host.jsonl"
    sed 's/}$/, "date": "2026-01-01T00:00:00Z"}/' "$tmp/host.jsonl"
} >"$tmp/dated.jsonl"
out=$("${A[@]}" --measured "$tmp/dated.jsonl" --transport host) || fail "advise on dated lines exited $?"
grep -q "(nccl, 1 rank(s), H200)" <<<"$out" && grep -q "6 line(s) of other rank counts left out" <<<"$out" ||
    fail "the newest lines' rank count not fitted: $out"

# fp8 (epx bench comm --fp8): --dtype fp8 prices the low-latency dispatch at
# H + H/32 bytes a row and fits only the fp8 dispatch lines; a file without
# them names the command that measures them; bf16 questions ignore them.
fp8=$("${A[@]}" --dtype fp8 --json) || fail "advise --dtype fp8 exited $?"
grep -q '"dtype": "fp8"' <<<"$fp8" || fail "--dtype fp8 not reported: $fp8"
awk -v p="$(slope "$peer")" -v f="$(slope "$fp8")" 'BEGIN { exit !(f < 0.9 * p && f > 0.6 * p) }' ||
    fail "fp8's per-token cost $(slope "$fp8") is not below bf16's $(slope "$peer")"
msg=$("${A[@]}" --transport host --dtype fp8 --measured "$tmp/host.jsonl" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "no fp8 low-latency dispatch figures" <<<"$msg" && grep -q -- "--fp8 --json FILE" <<<"$msg" ||
    fail "--dtype fp8 without fp8 lines: exit $rc: $msg"
sed 's/"dtype": "bf16", "phase": "dispatch", "median_us": \([0-9.]*\)/"dtype": "fp8-e4m3", "phase": "dispatch", "median_us": 1\1/' \
    "$tmp/host.jsonl" >"$tmp/fp8.jsonl"
cat "$tmp/host.jsonl" >>"$tmp/fp8.jsonl" # beside the bf16 lines, as one file may hold both
out=$("${A[@]}" --transport host --dtype fp8 --measured "$tmp/fp8.jsonl") || fail "advise --dtype fp8 --measured exited $?"
grep -q "low-latency dispatch: 1[0-9][0-9]\.[0-9] us" <<<"$out" || fail "fp8 lines not the ones fitted: $out"
grep -q "fp8 low-latency dispatch: 7456 bytes" <<<"$out" || fail "fp8 record size not stated: $out"
out=$("${A[@]}" --transport host --measured "$tmp/fp8.jsonl") || fail "advise bf16 --measured exited $?"
grep -q "low-latency dispatch: [0-9]\{1,2\}\.[0-9] us" <<<"$out" || fail "bf16 fit took fp8 lines: $out"

"$EPX_BIN" bench comm --backend mpi --model kimi-k2.5 --tokens 1 --transport host 2>"$tmp/e"; rc=$?
[ $rc -eq 2 ] || fail "bench comm --transport with mpi exited $rc"
grep -q "use it with --backend nccl (not --engine nccl)" "$tmp/e" || fail "message: $(cat "$tmp/e")"
# --max-blocks and --token-bound: only where the GPU engine runs; a bound is tokens or max
"$EPX_BIN" bench comm --backend mpi --model kimi-k2.5 --tokens 1 --max-blocks 8 2>"$tmp/e"; rc=$?
[ $rc -eq 2 ] || fail "bench comm --max-blocks with mpi exited $rc"
grep -q "use it with --backend nccl (not --engine nccl)" "$tmp/e" || fail "message: $(cat "$tmp/e")"
"$EPX_BIN" bench comm --backend nccl --mode low-latency --model kimi-k2.5 --tokens 1 \
    --token-bound most 2>"$tmp/e"; rc=$?
[ $rc -eq 2 ] || fail "bench comm --token-bound most exited $rc"
grep -q "not 'most'" "$tmp/e" || fail "bad token bound not named: $(cat "$tmp/e")"
"$EPX_BIN" bench comm --backend mpi --model kimi-k2.5 --tokens 1 --token-bound max 2>"$tmp/e"; rc=$?
[ $rc -eq 2 ] || fail "bench comm --token-bound with mpi exited $rc"
grep -q "use it with --backend nccl (not --engine nccl)" "$tmp/e" || fail "message: $(cat "$tmp/e")"
# --engine picks normal mode's GPU path (the GPU engine, or the older NCCL
# one): only there, only gpu or nccl, and per-rank partials are the older's.
"$EPX_BIN" bench comm --backend mpi --model kimi-k2.5 --tokens 1 --engine gpu 2>"$tmp/e"; rc=$?
[ $rc -eq 2 ] && grep -q "use it with --backend nccl --mode normal" "$tmp/e" ||
    fail "bench comm --engine with mpi: exit $rc: $(cat "$tmp/e")"
"$EPX_BIN" bench comm --backend nccl --model kimi-k2.5 --tokens 1 --engine cuda 2>"$tmp/e"; rc=$?
[ $rc -eq 2 ] && grep -q "not 'cuda'" "$tmp/e" || fail "bench comm --engine cuda: exit $rc: $(cat "$tmp/e")"
"$EPX_BIN" bench comm --backend nccl --model kimi-k2.5 --tokens 1 --engine gpu --combine rank \
    2>"$tmp/e"; rc=$?
[ $rc -eq 2 ] && grep -q "drop --combine rank, or give --engine nccl" "$tmp/e" ||
    fail "bench comm --engine gpu --combine rank: exit $rc: $(cat "$tmp/e")"

# Normal-mode lines of the GPU engine (they name a transport) are fitted
# without the older NCCL path's lines when a file holds both.
{
    line normal dispatch 1 9.0 1.0 pointers
    line normal dispatch 4096 50.0 1000.0 pointers
    line normal dispatch 1 190.0 1.0 ""
    line normal dispatch 4096 230.0 250.0 ""
    line normal combine 1 9.0 1.0 pointers
    line normal combine 4096 250.0 1900.0 pointers
    line normal combine 1 100.0 1.0 ""
    line normal combine 4096 800.0 580.0 ""
    line tp-allreduce allreduce 1 10.0 1.0 ""
    line tp-allreduce allreduce 32 12.0 40.0 ""
} >"$tmp/normal.jsonl"
out=$("${A[@]}" --measured "$tmp/normal.jsonl") || fail "advise on normal lines exited $?"
grep -q "normal dispatch: [0-9]\.[0-9] us .*(latency measured, bandwidth the link's: no byte crossed a link, 2 points)" <<<"$out" ||
    fail "the GPU engine's normal lines not the ones fitted: $out"

# One rank's bytes stay in its GPU's memory: its lines give EP's latencies,
# never a bandwidth for --link (an H200's HBM is no PCIe link), except the
# host transport's dispatch, whose rows cross the host link (its combine takes
# the link's rate halved: twice the bytes cross it); its all-reduce
# communicates nothing, so TP is the link's. Two ranks' lines are fitted.
out=$("${A[@]}" --measured "$tmp/normal.jsonl" --json) || fail "advise --json on one rank exited $?"
grep -q '"tp": "assumed"' <<<"$out" || fail "one rank's TP not the link's: $out"
out=$("${A[@]}" --measured "$tmp/normal.jsonl") || fail "advise on one rank exited $?"
grep -q "normal dispatch: .* + 36.0 GB/s" <<<"$out" || fail "one rank's bandwidth fitted: $out"
grep -q "tp-allreduce allreduce: 25.0 us + 40.0 GB/s (both the link's" <<<"$out" ||
    fail "one rank's all-reduce latency used for TP: $out"
grep -q "one rank: EP's latencies carried over to --gpus" <<<"$out" || fail "one rank unsaid: $out"
out=$("${A[@]}" --measured "$tmp/host.jsonl" --transport host) || fail "advise host exited $?"
grep -q "low-latency combine: .* + 18.0 GB/s (latency measured, bandwidth the link's" <<<"$out" ||
    fail "one rank's host combine (no row crosses) fitted a bandwidth: $out"
sed 's/"ranks": 1/"ranks": 2/' "$tmp/normal.jsonl" >"$tmp/two.jsonl"
out=$("$EPX_BIN" advise --model kimi-k2.5 --gpus 2 --link pcie5 --measured "$tmp/two.jsonl") ||
    fail "advise on two ranks exited $?"
grep -q "normal dispatch: [0-9]\.[0-9] us .*(both fitted, 2 points)" <<<"$out" ||
    fail "two ranks' normal lines not fitted: $out"
grep -q "tp-allreduce allreduce: .*(both fitted, 2 points)" <<<"$out" || fail "two ranks' all-reduce: $out"
# ... unless they were processes sharing a GPU (epx bench comm writes "shared_gpu")
sed 's/}$/, "shared_gpu": true}/' "$tmp/two.jsonl" >"$tmp/shared.jsonl"
out=$("$EPX_BIN" advise --model kimi-k2.5 --gpus 2 --link pcie5 --measured "$tmp/shared.jsonl") ||
    fail "advise on shared-GPU ranks exited $?"
grep -q "ranks sharing GPUs: EP's latencies carried over" <<<"$out" &&
    grep -q "normal dispatch: .* + 36.0 GB/s (latency measured, bandwidth the link's" <<<"$out" ||
    fail "shared-GPU ranks' bandwidth fitted: $out"
grep -q "4 normal-mode line(s) of the older NCCL path left out" <<<"$out" ||
    fail "the older path's lines left out unsaid: $out"
echo "ok"
