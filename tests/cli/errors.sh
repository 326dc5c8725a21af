#!/bin/bash
# errors.sh - one exit-code table (0 ok, 1 runtime failure, 2 bad usage or
# input) and messages that name the value, the rule and the fix: a
# directory as input, a migration across two models (both named), P that
# does not divide over G (G's divisors of P first), unknown options; every
# message starts "epx SUBCOMMAND:".
set -u
EPX=${EPX_BIN:?EPX_BIN is not set}
T=$(mktemp -d /tmp/epx-errors.XXXXXX)
trap 'cd /; rm -rf "$T"' EXIT
cd "$T" || exit 1
fail=0
# refuse "needle" CMD...: exit 2 and the message holds needle
refuse() {
  local name=$1 needle=$2; shift 2
  timeout 30 "$@" >out 2>err
  local rc=$?
  if [ "$rc" = 2 ] && grep -qF -- "$needle" err; then echo "ok   $name"; return; fi
  echo "FAIL $name (rc $rc)"; cat err; fail=1
}
"$EPX" trace synth --model deepseek-v3 --windows 2 --tokens 2000 -o v3.json >/dev/null || exit 1
"$EPX" trace synth --model kimi-k2 --windows 2 --tokens 2000 -o k2.json >/dev/null || exit 1
"$EPX" plan --counts v3.json --gpus 8 -o v3p.json >/dev/null || exit 1
"$EPX" plan --counts k2.json --gpus 8 -o k2p.json >/dev/null || exit 1
mkdir d

refuse "directory as placement" "'d' is a directory" "$EPX" dispatch-table --placement d --gpus 8 -o t.json
refuse "directory as mapping" "is a directory" "$EPX" inspect d --gpus 8
refuse "migrate across models names both" "deepseek-v3 (61 layers, 256 experts)" \
  "$EPX" migrate plan --from v3p.json --to k2p.json --gpus 8 --expert-bytes 1000
grep -q "kimi-k2" err && echo "ok   and the other" || { echo "FAIL the other model"; fail=1; }
refuse "--gpus 3 on P=256 names G's divisors" "use 2 or 4 GPUs (divisors of 256)" \
  "$EPX" stats v3.json --placement v3p.json --gpus 3
refuse "--gpus 12 --nodes 2" "use 8 or 16 GPUs" "$EPX" stats v3.json --placement v3p.json --gpus 12 --nodes 2
refuse "unknown option" "unknown option '--gpu'" "$EPX" plan --counts v3.json --gpu 8 -o x.json
refuse "a comma list of JSON files says what lists take" "a comma list names SGLang's .pt dumps" \
  "$EPX" convert v3.json,v3.json x.json
refuse "a default that breaks a limit is called the default" "--redundant 32 (the default) gives" \
  "$EPX" demo --model mixtral --gpus 1 --out d
# a size given twice would print its row twice: the repeat is named
refuse "--batch-tokens twice" "--batch-tokens '32,1,32': item 3 (32) repeats item 1" \
  "$EPX" eval --placement v3p.json --counts v3.json --gpus 8 --routing static --batch-tokens 32,1,32
refuse "--tokens twice" "--tokens '1,8,1': item 3 (1) repeats item 1" \
  "$EPX" bench comm --backend mpi --model qwen3-30b --tokens 1,8,1
refuse "unknown command" "unknown command" "$EPX" plann
refuse "missing file" "cannot open" "$EPX" plan --counts nothere.json --gpus 8 -o x.json
# a .pt name that is no zip archive is read as JSON, and the message says both
printf 'garbage' >bin.pt
refuse "a .pt that is no zip" "is no PyTorch file (torch.save writes a zip archive)" "$EPX" \
  stats bin.pt
# --window-passes groups a per_pass dump's passes: on anything else it is
# refused (it was ignored); on a per_pass dump it applies
refuse "--window-passes on a JSON trace" "holds no per_pass dump: drop it" "$EPX" stats \
  v3.json --window-passes 4
"$EPX" stats "$EPX_SOURCE/tests/data/pt/per_pass_rank0.pt" --window-passes 3 >out 2>err &&
  grep -q "3 passes per window" out || { echo "FAIL --window-passes on a per_pass dump"; fail=1; }
# ... one that does not divide its 3 passes is refused (2 made a last window
# of 1 pass, 100 one window of 3)
refuse "--window-passes 2 of 3 passes" "(--window-passes 2) does not divide the 3 forward passes recorded: give a divisor of 3 (1, 3)" \
  "$EPX" stats "$EPX_SOURCE/tests/data/pt/per_pass_rank0.pt" --window-passes 2
refuse "--window-passes 100 of 3 passes" "(it is more than all of them)" \
  "$EPX" plan --counts "$EPX_SOURCE/tests/data/pt/per_pass_rank0.pt" --gpus 4 --window-passes 100 -o wp.json
[ ! -e wp.json ] || { echo "FAIL --window-passes 100 wrote its plan"; fail=1; }
# --stat-rows windows where there is no stat dump: refused like --window-passes
# (it did nothing); plan's deepseek-vec still reads any input as its series
for cmd in "stats v3.json" "plan --counts v3.json --gpus 8 -o sr.json" \
  "stats $EPX_SOURCE/tests/data/pt/per_pass_rank0.pt"; do
  # shellcheck disable=SC2086
  refuse "--stat-rows windows: $cmd" "holds no stat dump" "$EPX" $cmd --stat-rows windows
done
"$EPX" plan --counts v3.json --gpus 8 --algorithm deepseek-vec -o dv.json >out 2>err ||
  { echo "FAIL deepseek-vec on a trace"; cat err; fail=1; }
# A suggested fix must exist where it is suggested: plan and stats take the
# expert count from the counts (no --experts), plan's groups message offers
# 0 for none, and convert has no --placement.
"$EPX" trace synth --model mixtral-8x7b --windows 2 --tokens 1000 -o mix.json >/dev/null || exit 1
"$EPX" layout trivial --layers 32 --experts 12 --gpus 4 -o cur12.json >/dev/null || exit 1
"$EPX" convert cur12.json cur12.pt >/dev/null || exit 1
no_option() { # name option: the last message names no such option
  ! grep -qF -- "$2" err || { echo "FAIL $1: suggests $2, which is no option there"; cat err; fail=1; }
}
refuse "plan --current of another model" "--current cur12.json holds logical expert 8 (layer 0, slot 8), but the counts have 8 experts per layer: they are for different models" \
  "$EPX" plan --counts mix.json --gpus 4 --redundant 4 --current cur12.json -o x.json
no_option "plan --current" "--experts"
refuse "stats --placement of another model" "--placement cur12.json holds logical expert 8" \
  "$EPX" stats mix.json --placement cur12.json --gpus 4
no_option "stats --placement" "--experts"
refuse "plan --groups 3 of 8 experts" "or 0 for none" "$EPX" plan --counts mix.json --gpus 4 --groups 3 -o x.json
"$EPX" plan --counts mix.json --gpus 4 --groups 0 -o g0.json >out 2>err ||
  { echo "FAIL --groups 0 (none), as the message offers, refused"; cat err; fail=1; }
refuse "convert: mappings in a list" "convert each mapping on its own" "$EPX" convert cur12.pt,cur12.pt o.json
no_option "convert: mappings in a list" "--placement"
refuse "plan --counts of a mapping" "it is a placement, not a load" "$EPX" plan --counts cur12.pt --gpus 4 -o x.json
no_option "plan --counts of a mapping" "--placement"
# epx help COMMAND is COMMAND --help; an unknown one is named
"$EPX" help plan >out 2>err && grep -q '^usage: epx plan --counts' out ||
  { echo "FAIL help plan"; fail=1; }
refuse "help of an unknown command" "unknown command 'plann'" "$EPX" help plann
# Every line of an error starts "epx SUBCOMMAND:", the option parser's too:
# it once said "epx bench:" for bench comm (likewise migrate plan and layout
# trivial), "invalid: epx inspect: ...", and nothing for trace's action.
prefix() {
  local want=$1; shift
  timeout 30 "$@" >out 2>err
  if [ -s err ] && awk -v w="$want" 'index($0, w) != 1 { bad = 1 } END { exit bad }' err; then
    echo "ok   '$want' from $*"
  else
    echo "FAIL '$want' from $*:"; cat err; fail=1
  fi
}
python3 -c 'print({"physical_to_logical_map": [list(range(12))]})' | tr "'" '"' >p12.json
prefix "epx bench comm: " "$EPX" bench comm --bogus
prefix "epx bench comm: " "$EPX" bench comm --backend mpi --model kimi-k2 --tokens 1 --iters 0
prefix "epx bench: " "$EPX" bench nothing
prefix "epx migrate plan: " "$EPX" migrate plan --bogus
prefix "epx migrate plan: " "$EPX" migrate plan --from v3p.json
prefix "epx layout trivial: " "$EPX" layout trivial --bogus 1
prefix "epx trace: " "$EPX" trace
prefix "epx trace: " "$EPX" trace synt --model kimi-k2 -o x.json
prefix "epx trace synth: " "$EPX" trace synth --bogus
prefix "epx inspect: invalid: " "$EPX" inspect p12.json --gpus 5
prefix "epx advise: " "$EPX" advise --model kimi-k2 --gpus 8 --link pcie9
prefix "epx demo: " "$EPX" demo --gpus 0
prefix "epx dispatch-table: " "$EPX" dispatch-table --placement v3p.json --gpus 3 -o t.json
exit $fail
