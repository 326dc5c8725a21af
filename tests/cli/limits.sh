#!/bin/bash
# limits.sh - size parameters have documented maxima, checked before any
# work with the value, the limit and the fix (README "Limits"): slots per
# layer P <= 4 (E + G) (at the limit accepted, one over refused), memory
# estimated before allocating (demo --gpus 65536, trace synth with 2^24
# windows), both refused at once (exit 2) without allocating; a JSON output
# above the 1 GiB epx reads back refused before any work, naming its bytes
# and the option to lower (issue 29).
set -u
EPX=${EPX_BIN:?EPX_BIN is not set}
T=$(mktemp -d /tmp/epx-limits.XXXXXX)
trap 'cd /; rm -rf "$T"' EXIT
cd "$T" || exit 1
fail=0
run() { # name, want rc, needle (or ""), command...
  local name=$1 want=$2 needle=$3; shift 3
  local t0=$SECONDS
  timeout 60 "$@" >out 2>err
  local rc=$?
  if [ "$rc" = "$want" ] && { [ -z "$needle" ] || grep -qF -- "$needle" err; }; then
    echo "ok   $name ($((SECONDS - t0)) s)"
  else
    echo "FAIL $name (rc $rc)"; cat err; fail=1
  fi
}
lay=("$EPX" layout trivial --layers 2 --experts 8 --gpus 2 -o l.json)
run "layout --redundant at the limit (4 x (8 + 2) - 8 = 32)" 0 "" "${lay[@]}" --redundant 32
run "layout --redundant one over" 2 "above the limit 40 (4 x (8 experts + 2 GPUs)): use at most 32 redundant slots" \
  "${lay[@]}" --redundant 33
"$EPX" trace synth --model deepseek-v3 --windows 2 --tokens 2000 -o c.json >/dev/null || exit 1
run "plan --redundant at the limit" 0 "" "$EPX" plan --counts c.json --gpus 8 --redundant 800 -o p.json
run "plan --redundant 12800 refused" 2 "use at most 800 redundant slots" \
  "$EPX" plan --counts c.json --gpus 8 --redundant 12800 -o p.json
run "plan --physical over" 2 "--physical 2000" "$EPX" plan --counts c.json --gpus 8 --physical 2000 -o p.json
run "demo --gpus 65536 refused before allocating" 2 "half of this machine's memory" \
  "$EPX" demo --gpus 65536 --out d
check_rss() { # the refusal above used little memory
  /usr/bin/time -f %M "$EPX" demo --gpus 65536 --out d 2>&1 >/dev/null | tail -1
}
if [ -x /usr/bin/time ]; then
  kb=$(check_rss)
  if [ "$kb" -lt 200000 ]; then echo "ok   demo refusal used $kb KB"; else echo "FAIL demo used $kb KB"; fail=1; fi
fi
run "trace synth --windows 16777216 refused" 2 "use fewer --windows" \
  "$EPX" trace synth --model kimi-k2 --windows 16777216 -o t.json
check_none() { [ ! -e d ] && [ ! -e t.json ]; }
check_none && echo "ok   nothing written" || { echo "FAIL something written"; fail=1; }
# bench comm's buffers for the largest --tokens, estimated before any is allocated (issue 29)
run "bench comm --tokens 1048576 refused before allocating" 2 "--tokens 1048576 at hidden 2048, top-8 needs about" \
  "$EPX" bench comm --backend mpi --model qwen3-30b --tokens 1,1048576 --iters 1 --warmup 0
# Outputs and shapes that would be huge (issue 29): refused at once, naming
# the bytes or the shape and what to lower; never a crash or a long run.
run "trace synth --per-pass 4096: the JSON's bytes and the options" 2 \
  "t.json would be about 2.3 GB of JSON (767557632 numbers), above the 1 GiB that epx reads back (EPX_MAX_INPUT_BYTES): use fewer --windows or --per-pass, or write a .pt file" \
  "$EPX" trace synth --model kimi-k2 --windows 8 --per-pass 4096 -o t.json
run "trace synth 4096 windows of 2^40 tokens: long numbers counted" 2 "above the 1 GiB that epx reads back" \
  "$EPX" trace synth --model kimi-k2 --windows 4096 --tokens 1099511627776 -o t.json
run "trace synth .pt: memory for 2^24 rows" 2 "use fewer --windows or --per-pass" \
  "$EPX" trace synth --model kimi-k2 --windows 256 --per-pass 65536 -o t.pt
run "trace synth --windows x --per-pass past 2^24 rows" 2 "--windows 512 x --per-pass 65536 is 33554432 rows, above the limit 16777216" \
  "$EPX" trace synth --model kimi-k2 --windows 512 --per-pass 65536 -o t.json
run "layout trivial --layers 65536 (JSON above 1 GiB)" 2 \
  "bl.json would be about 1.6 GB of JSON (268435456 numbers), above the 1 GiB that epx reads back (EPX_MAX_INPUT_BYTES): use fewer --layers or --experts, or write a .pt file" \
  "$EPX" layout trivial --layers 65536 --experts 4096 --gpus 8 -o bl.json
run "layout trivial at every limit at once" 2 "layout trivial: " \
  "$EPX" layout trivial --layers 65536 --experts 1048576 --gpus 65536 --redundant 1048576 -o bl.pt
run "layout trivial .pt: memory names the options" 2 "use fewer --layers, --experts or --redundant" \
  "$EPX" layout trivial --layers 65536 --experts 1048576 --gpus 8 -o bl.pt
"$EPX" layout trivial --layers 1 --experts 65536 --gpus 65536 -o wide.json >/dev/null || exit 1
run "dispatch-table for 65536 ranks refused before the [G][L][E] table" 2 "dispatch-table: " \
  "$EPX" dispatch-table --placement wide.json --gpus 65536 -o dt.json
# SGLang's cut table is G passes of G ranks: at 2,048 GPUs of 61 layers x 384
# experts (2^36.5 rank-entries, ~25 minutes on one core) refused before any pass,
# naming --rank, which computes one rank's row in a second
"$EPX" layout trivial --layers 61 --experts 384 --gpus 2048 --redundant 1664 -o g2k.json >/dev/null ||
  exit 1
run "dispatch-table: the cut table's G^2 work refused, --rank named" 2 \
  "2048 per-rank passes of 2048 ranks x 61 layers x 384 experts" \
  "$EPX" dispatch-table --placement g2k.json --gpus 2048 -o dt.json
grep -qF -- "--rank R" err || { echo "FAIL the refusal does not name --rank"; fail=1; }
run "dispatch-table --rank at 2048 GPUs: one pass, runs" 0 "" \
  "$EPX" dispatch-table --placement g2k.json --gpus 2048 --rank 7 -o one.json
"$EPX" trace synth --model kimi-k2 --windows 2 --tokens 1000 -o kc.json >/dev/null || exit 1
run "eval --routing static at 2048 GPUs refused before the table" 2 "route by another rule" \
  "$EPX" eval --placement g2k.json --counts kc.json --gpus 2048 --routing static
run "demo --gpus 2048: its static tables refused before any work" 2 "per layout" \
  "$EPX" demo --model kimi-k2 --gpus 2048 --out d
rm -f one.json
"$EPX" layout trivial --layers 65536 --experts 8 --gpus 8 -o tall.json >/dev/null || exit 1
run "migrate --expert-bytes times slots past 64 bits names the most that fits" 2 \
  "overflows a 64-bit byte count: use at most 35184372088831 bytes per expert" \
  "$EPX" migrate plan --from tall.json --to tall.json --gpus 8 --expert-bytes 1000000000000000
# demo: a model at the limits is refused naming --model, and the rounding of
# P is only announced for a shape that runs
sed -e 's/"num_hidden_layers": 61/"num_hidden_layers": 65536/' -e 's/"first_k_dense_replace": 3/"first_k_dense_replace": 0/' \
  -e 's/"n_routed_experts": 256/"n_routed_experts": 1048576/' "${EPX_SOURCE:?}/tests/data/hf/deepseek-v3/config.json" >huge.json
run "demo on a 65536-layer, 2^20-expert config" 2 "or a smaller --model" "$EPX" demo --model huge.json --out d
run "demo --gpus 3 --redundant 1048576" 2 "--redundant 1048576 gives 1048962 slots per layer" \
  "$EPX" demo --gpus 3 --redundant 1048576 --out d
grep -q "do not divide" err && { echo "FAIL demo announced a rounding it then refused"; fail=1; }
check_none && echo "ok   nothing written" || { echo "FAIL something written"; fail=1; }
[ ! -e bl.json ] && [ ! -e bl.pt ] && [ ! -e dt.json ] && [ ! -e t.pt ] && echo "ok   no big output" ||
  { echo "FAIL a big output was written"; fail=1; }
exit $fail
