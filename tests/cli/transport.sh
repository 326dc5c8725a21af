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

"$EPX_BIN" bench comm --backend mpi --model kimi-k2.5 --tokens 1 --transport host 2>"$tmp/e"; rc=$?
[ $rc -eq 2 ] || fail "bench comm --transport with mpi exited $rc"
grep -q "use it with --backend nccl --mode low-latency" "$tmp/e" || fail "message: $(cat "$tmp/e")"
echo "ok"
