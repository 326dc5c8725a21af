#!/bin/bash
# limits.sh - size parameters have documented maxima, checked before any
# work with the value, the limit and the fix (README "Limits"): slots per
# layer P <= 4 (E + G) (at the limit accepted, one over refused), memory
# estimated before allocating (demo --gpus 65536, trace synth with 2^24
# windows), both refused at once (exit 2) without allocating.
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
exit $fail
