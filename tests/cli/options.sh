#!/bin/bash
# options.sh - every numeric option of every subcommand, driven with hostile
# values from one table (issue 29): junk, spaces, hex, fractions for whole
# numbers, NaN and infinities, one past each end of the range, and values
# past 64 bits. Each must exit 2 within the time limit, write nothing, and
# name the command, the option, the value and the range to use ("epx plan:
# --gpus 0 is below the minimum 1: use at least 1"). The table is checked
# against every subcommand's --help, so an option added later without a row
# here fails this test.
set -u
. "${EPX_SOURCE:?EPX_SOURCE is not set}/tests/util/cli_test.sh"
cli_scratch options

"$EPX" trace synth --model deepseek-v3 --windows 2 --tokens 2000 -o c.json >/dev/null || exit 1
"$EPX" plan --counts c.json --gpus 8 -o p.json >/dev/null || exit 1

# Each subcommand once, valid as it stands; a row's option is dropped from
# it and given the hostile value instead. The outputs are o.json and dd.
declare -A base=(
  [demo]="demo --windows 2 --tokens 1000 --out dd"
  [plan]="plan --counts c.json --gpus 8 -o o.json"
  [eval]="eval --placement p.json --counts c.json --gpus 8 --routing balanced"
  [inspect]="inspect p.json --gpus 8"
  [layout trivial]="layout trivial --layers 2 --experts 8 --gpus 2 -o o.json"
  [stats]="stats c.json"
  [convert]="convert c.json o.json"
  [trace synth]="trace synth --model deepseek-v3 --windows 2 -o o.json"
  [dispatch-table]="dispatch-table --placement p.json --gpus 8 -o o.json"
  [migrate plan]="migrate plan --from p.json --to p.json --gpus 8 --expert-bytes 100"
  [bench comm]="bench comm --backend mpi --model qwen3-30b --tokens 1 --iters 1 --warmup 0"
  [advise]="advise --model kimi-k2 --gpus 8 --link nvlink4"
)

# command | option | kind | lo | hi   (lo and hi as the messages print them)
# kinds: int (whole number), real, list (comma-separated whole numbers),
# range (A..B of reals), text (not numeric: listed so --help is covered).
table="
demo|--gpus|int|1|65536
demo|--nodes|int|1|65536
demo|--redundant|int|0|1048576
demo|--windows|int|2|4096
demo|--tokens|int|1|1073741824
demo|--seed|int|0|2147483647
demo|--model|text
demo|--out|text
plan|--gpus|int|1|65536
plan|--nodes|int|1|65536
plan|--groups|int|0|1048576
plan|--redundant|int|0|1048576
plan|--physical|int|1|2097152
plan|--max-moves|int|0|2147483647
plan|--move-price|real|0|1
plan|--expert-bytes|int|1|1000000000000000
plan|--failed-gpus|list|0|7
plan|--active-ranks|list|0|7
plan|--window-passes|int|1|16777216
plan|--counts|text
plan|--algorithm|text
plan|--node-local|text
plan|--sglang-version|text
plan|-o|text
plan|--report|text
plan|--current|text
plan|--stat-rows|text
eval|--gpus|int|1|65536
eval|--nodes|int|1|65536
eval|--placement|text
eval|--counts|text
eval|--top-k|int|1|1024
eval|--batches|int|1|1024
eval|--seed|int|0|2147483647
eval|--batch-tokens|list|1|65536
eval|--routing|text
eval|--weights|text
inspect|--gpus|int|1|65536
inspect|--nodes|int|1|65536
inspect|--experts|int|1|1048576
layout trivial|--layers|int|1|65536
layout trivial|--experts|int|1|1048576
layout trivial|--gpus|int|1|65536
layout trivial|--redundant|int|0|1048576
layout trivial|-o|text
stats|--gpus|int|1|65536
stats|--nodes|int|1|65536
stats|--top|int|0|65536
stats|--window-passes|int|1|16777216
stats|--placement|text
stats|--traffic|text
stats|--stat-rows|text
convert|--dtype|text
convert|--window-passes|int|1|16777216
convert|--stat-rows|text
trace synth|--windows|int|1|16777216
trace synth|--tokens|int|1|1099511627776
trace synth|--seed|int|0|18446744073709551615
trace synth|--skew|range|0|5
trace synth|--drift|real|0|5
trace synth|--shift|int|1|16777216
trace synth|--shift-layers|real|0|1
trace synth|--per-pass|int|1|65536
trace synth|--model|text
trace synth|-o|text
dispatch-table|--gpus|int|1|65536
dispatch-table|--nodes|int|1|65536
dispatch-table|--experts|int|1|1048576
dispatch-table|--rank|int|0|65535
dispatch-table|--seed|int|0|2147483647
dispatch-table|--placement|text
dispatch-table|--order|text
dispatch-table|--algorithm|text
dispatch-table|--counts|text
dispatch-table|--sglang-version|text
dispatch-table|-o|text
dispatch-table|--rank-lists|text
migrate plan|--gpus|int|1|65536
migrate plan|--nodes|int|1|65536
migrate plan|--experts|int|1|1048576
migrate plan|--expert-bytes|int|1|1000000000000000
migrate plan|--failed-gpus|list|0|7
migrate plan|--from|text
migrate plan|--to|text
migrate plan|--counts|text
migrate plan|-o|text
bench comm|--tokens|list|1|1048576
bench comm|--iters|int|1|100000
bench comm|--warmup|int|0|100000
bench comm|--redundant|int|0|1048576
bench comm|--timeout-ms|int|1|3600000
bench comm|--seed|int|0|2147483647
bench comm|--gpus|int|1|1024
bench comm|--max-blocks|int|1|65535
bench comm|--backend|text
bench comm|--model|text
bench comm|--dtype|text
bench comm|--combine|text
bench comm|--mode|text
bench comm|--transport|text
bench comm|--token-bound|text
bench comm|--engine|text
bench comm|--json|text
bench comm|-o|text
advise|--gpus|int|2|65536
advise|--imbalance|real|1|1000
advise|--model|text
advise|--link|text
advise|--measured|text
advise|--dtype|text
advise|--combine|text
advise|--transport|text
"

# try CMD OPT VALUE NEEDLE...: the subcommand's base with OPT VALUE exits 2
# within the limit, writes nothing, and says "epx CMD: " and every NEEDLE.
tries=0
try() {
  local c=$1 opt=$2 v=$3 b
  shift 3
  b=$(sed -E "s/(^| )$opt [^ ]+//" <<<"${base[$c]}")
  rm -rf o.json dd
  tries=$((tries + 1))
  # shellcheck disable=SC2086
  if ! expect_rc 2 "$EPX" $b "$opt" "$v"; then
    echo "FAIL $c $opt '$v'"; fail=1; return
  fi
  for n in "epx $c: " "$@"; do
    grep -qF -- "$n" err || { echo "FAIL $c $opt '$v': message lacks '$n':"; cat err; fail=1; return; }
  done
  if [ -e o.json ] || [ -e dd ]; then echo "FAIL $c $opt '$v': wrote output"; fail=1; fi
}

# Values past the range: one past each end where that fits a bash integer,
# and always one past 64 bits.
past() { # lo hi: prints "value side" lines
  local lo=$1 hi=$2
  if [ ${#lo} -lt 18 ]; then echo "$((lo - 1)) below"; fi
  if [ ${#hi} -lt 18 ]; then echo "$((hi + 1)) above"; fi
  echo "99999999999999999999999 above"
  echo "-99999999999999999999999 below"
}

while IFS='|' read -r c opt kind lo hi; do
  [ -z "$c" ] && continue
  case $kind in
  int)
    for v in "" abc 8x " 8" "8 " 0x10 1.5 1e3 nan "--"; do
      try "$c" "$opt" "$v" "$opt '$v' is not a whole number: give one from $lo to $hi"
    done
    while read -r v side; do
      if [ "$side" = below ]; then
        try "$c" "$opt" "$v" "$opt $v is below the minimum $lo: use at least $lo"
      else
        try "$c" "$opt" "$v" "$opt $v is above the limit $hi: use at most $hi"
      fi
    done < <(past "$lo" "$hi")
    ;;
  real)
    for v in "" abc 8x " 1" 0x1p0 1e 1.2.3; do
      try "$c" "$opt" "$v" "$opt '$v' is not a number: give one from $lo to $hi"
    done
    for v in nan -nan inf -inf infinity 1e999; do
      try "$c" "$opt" "$v" "$opt '$v' is not a finite number: give one from $lo to $hi"
    done
    try "$c" "$opt" "$((lo - 1))" "$opt $((lo - 1)) is below the minimum $lo: use at least $lo"
    try "$c" "$opt" "$hi.5" "$opt $hi.5 is above the limit $hi: use at most $hi"
    try "$c" "$opt" "-1e308" "is below the minimum $lo"
    ;;
  list)
    for v in "" "," "1,,2" "1," ",1"; do
      try "$c" "$opt" "$v" "$opt '$v' is not a comma-separated list of whole numbers from $lo to $hi"
    done
    try "$c" "$opt" "$lo,x" "$opt '$lo,x': item 2 'x' is not a whole number: give numbers from $lo to $hi"
    try "$c" "$opt" "$lo,1.5" "item 2 '1.5' is not a whole number"
    try "$c" "$opt" "$lo,$((hi + 1))" "$opt '$lo,$((hi + 1))': item 2 ($((hi + 1))) is above the limit $hi: use at most $hi"
    try "$c" "$opt" "$((lo - 1))" "item 1 ($((lo - 1))) is below the minimum $lo: use at least $lo"
    try "$c" "$opt" "$lo,99999999999999999999999" "item 2 (99999999999999999999999) is above the limit $hi"
    ;;
  range)
    for v in "" x 0x1p0 ".." "1.." "..1"; do
      try "$c" "$opt" "$v" "$opt" "'" "is not a number: give one from $lo to $hi"
    done
    try "$c" "$opt" "1..x" "$opt (B of A..B) 'x' is not a number: give one from $lo to $hi"
    try "$c" "$opt" "nan..1" "$opt (A of A..B) 'nan' is not a finite number"
    try "$c" "$opt" "1..inf" "$opt (B of A..B) 'inf' is not a finite number"
    try "$c" "$opt" "-1..1" "$opt (A of A..B) -1 is below the minimum $lo: use at least $lo"
    try "$c" "$opt" "1..$((hi + 1))" "$opt (B of A..B) $((hi + 1)) is above the limit $hi: use at most $hi"
    try "$c" "$opt" "$((hi + 1))" "$opt (A..B or A) $((hi + 1)) is above the limit $hi"
    try "$c" "$opt" "2..1" "$opt 2..1 runs backwards: write the smaller first (1..2)"
    ;;
  text) ;;
  *) echo "FAIL bad table row: $c $opt $kind"; fail=1 ;;
  esac
done <<<"$table"
echo "ok   $tries hostile values tried"

# The table covers every option that takes a value in every --help, and
# names no option that is not there.
for c in "${!base[@]}"; do
  # shellcheck disable=SC2086
  "$EPX" $c --help | awk '/^options:/ {o = 1; next}
    o && substr($0, 1, 3) == "  -" { n = split(substr($0, 3, 24), w, " "); if (n >= 2) print w[1] }' |
    grep -vx -- '-h,' >have || { echo "FAIL $c --help"; fail=1; }
  grep "^$c|" <<<"$table" | cut -d'|' -f2 | sort >listed
  sort have -o have
  if ! diff -u listed have >diff.txt; then
    echo "FAIL $c: the table and --help differ (- table, + help):"; cat diff.txt; fail=1
  else
    echo "ok   $c: $(wc -l <have) options with a value, all in the table"
  fi
done

# The bases themselves run (so each refusal above is the value's doing).
# bench comm's runs Open MPI, whose own allocations LeakSanitizer reports
# (cmake/mpi.cmake); its leaks are not looked for here.
for c in "${!base[@]}"; do
  rm -rf o.json dd
  leaks=1
  [ "$c" = "bench comm" ] && leaks=0
  # shellcheck disable=SC2086
  ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=$leaks timeout 60 "$EPX" ${base[$c]} >out 2>err
  rc=$?
  if [ "$rc" = 0 ]; then
    echo "ok   base of $c runs"
  elif [ "$c" = "bench comm" ] && grep -q "without MPI\|MPI" err; then
    echo "ok   base of $c skipped: $(head -1 err)"
  else
    echo "FAIL base of $c (rc $rc):"; cat err; fail=1
  fi
done
exit $fail
