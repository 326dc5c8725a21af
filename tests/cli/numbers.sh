#!/bin/bash
# numbers.sh - numbers in (issue 17): every numeric option refuses junk,
# NaN, infinities, negatives and out-of-range values with exit 2 and a
# message naming the value, the rule and the fix; epx advise --measured
# refuses negative, huge, non-numeric figures and all-zero times in both of
# its formats; and advise's verdicts never state an impossible range.
set -u
. "${EPX_SOURCE:?EPX_SOURCE is not set}/tests/util/cli_test.sh"
cli_scratch numbers

lay=("$EPX" layout trivial --experts 8 --gpus 2 -o l.json)
check "--layers -3" refuse "below the minimum 1: use at least 1" "${lay[@]}" --layers -3
check "--layers huge" refuse "above the limit 65536: use at most 65536" "${lay[@]}" --layers 99999999999999999999
check "--layers junk" refuse "not a whole number" "${lay[@]}" --layers 3x
check "--layers 1.5" refuse "not a whole number" "${lay[@]}" --layers 1.5
syn=("$EPX" trace synth --model deepseek-v3 -o t.json)
check "--drift nan" refuse "not a finite number" "${syn[@]}" --drift nan
check "--drift inf" refuse "not a finite number" "${syn[@]}" --drift inf
check "--drift -1" refuse "below the minimum 0" "${syn[@]}" --drift -1
check "--tokens -5" refuse "--tokens -5 is below the minimum 1: use at least 1" "${syn[@]}" --tokens -5
check "--windows 0" refuse "use at least 1" "${syn[@]}" --windows 0
adv=("$EPX" advise --model kimi-k2 --link nvlink4)
check "--imbalance 1e999" refuse "not a finite number" "${adv[@]}" --gpus 8 --imbalance 1e999
check "--imbalance 0.5" refuse "use at least 1" "${adv[@]}" --gpus 8 --imbalance 0.5
check "--gpus 0" refuse "use at least 2" "${adv[@]}" --gpus 0
# one GPU: nothing crosses a link, so there is no EP/TP question (it printed
# a table of EP 30-55 us vs TP 12 us under "neither scheme communicates")
check "--gpus 1 refused" refuse "--gpus 1 is below the minimum 2: use at least 2" "${adv[@]}" --gpus 1
check "no output written" test ! -e l.json -a ! -e t.json

# --measured: JSON lines of epx bench comm --json
line() { # mode phase median_us gbps
  printf '{"backend": "mpi", "mode": "%s", "ranks": 8, "tokens": %s, "phase": "%s", "median_us": %s, "graph": false, "gbps": %s, "device": "cpu"}\n' \
    "$1" "$5" "$2" "$3" "$4"
}
good() {
  line normal dispatch 40 10 64; line normal dispatch 80 20 4096
  line normal combine 40 10 64; line normal combine 80 20 4096
  line tp-allreduce allreduce 20 30 64; line tp-allreduce allreduce 90 40 4096
}
good > good.jsonl
check "good --measured reads" sh -c '"$@" >/dev/null' - "${adv[@]}" --gpus 8 --measured good.jsonl
# CPU figures for a GPU link: warned on stderr, and the answer names which
# figures are measured and which the link's assumed ones (the file has no
# low-latency lines: that mode stays assumed; they were mixed silently)
expect_rc 0 "${adv[@]}" --gpus 8 --measured good.jsonl
check "CPU figures: warned" grep -qF "warning: --measured 'good.jsonl' was timed on the CPU (mpi on cpu), not on GPUs over nvlink4" err
check "  the answer names each figure's source" grep -qF "figures: EP normal mode measured, EP low-latency mode assumed, TP measured (measured: mpi on cpu; assumed: nvlink4's)" out
expect_rc 0 "${adv[@]}" --gpus 8 --measured good.jsonl --json
check "  and --json" grep -qF '"figures": {"ep": "measured", "ep_low_latency": "assumed", "tp": "measured", "measured_on": "mpi on cpu"}' out
sed 's/"backend": "mpi"/"backend": "nccl"/; s/"device": "cpu"/"device": "NVIDIA H100"/' good.jsonl >gpu.jsonl
expect_rc 0 "${adv[@]}" --gpus 8 --measured gpu.jsonl
check "GPU figures: no warning" test ! -s err
{ good; line normal dispatch -5 10 128; } > neg.jsonl
check "negative median_us" refuse "record 7: median_us is -5" "${adv[@]}" --gpus 8 --measured neg.jsonl
{ good; line normal combine 1e300 10 128; } > huge.jsonl
check "huge median_us" refuse "median_us is 1e+300" "${adv[@]}" --gpus 8 --measured huge.jsonl
{ good; line normal combine '"fast"' 10 128; } > str.jsonl
check "string median_us" refuse "not a number (a JSON string)" "${adv[@]}" --gpus 8 --measured str.jsonl
{ good; line normal combine 10 -3 128; } > gb.jsonl
check "negative gbps" refuse "gbps is -3" "${adv[@]}" --gpus 8 --measured gb.jsonl
{ good; line normal combine NaN 3 128; } > nan.jsonl
check "NaN median_us refused" refuse "" "${adv[@]}" --gpus 8 --measured nan.jsonl

# --measured: the older epx-bench-comm-1 summary
summary() { # dispatch_us
  printf '{"format": "epx-bench-comm-1", "backend": "mpi", "model": "kimi-k2", "ranks": 8, "rows": [\n'
  printf ' {"tokens": 64, "dispatch_us": %s, "dispatch_bytes": 1000, "combine_us": 30, "combine_bytes": 1000, "allreduce_us": 10, "allreduce_bytes": 500},\n' "$1"
  printf ' {"tokens": 4096, "dispatch_us": 90, "dispatch_bytes": 64000, "combine_us": 90, "combine_bytes": 64000, "allreduce_us": 80, "allreduce_bytes": 32000}]}\n'
}
summary 30 > s.json
check "good summary reads" sh -c '"$@" >/dev/null' - "${adv[@]}" --gpus 8 --measured s.json
summary -30 > sneg.json
check "summary negative" refuse "dispatch_us is -30" "${adv[@]}" --gpus 8 --measured sneg.json
summary '"x"' > sstr.json
check "summary string" refuse "dispatch_us is not a number" "${adv[@]}" --gpus 8 --measured sstr.json
summary 1e12 > shuge.json
check "summary huge" refuse "from 0 to 1e+09 us" "${adv[@]}" --gpus 8 --measured shuge.json

# --measured all zeros (nothing was timed): refused, naming the file, what
# it holds and what to pass instead, in both formats; it once gave an answer
zero_row=' {"tokens": 64, "dispatch_us": 0, "dispatch_bytes": 0, "combine_us": 0, "combine_bytes": 0, "allreduce_us": 0, "allreduce_bytes": 0}'
printf '{"format": "epx-bench-comm-1", "backend": "mpi", "model": "kimi-k2", "ranks": 8, "rows": [\n%s,\n%s]}\n' \
  "$zero_row" "$zero_row" > szero.json
check "summary all zeros" refuse "--measured 'szero.json': every dispatch_us of its 2 row(s) is 0: nothing was timed; pass the figures of a run of 'epx bench comm ... --json FILE' (or -o FILE), or leave --measured out for nvlink4's assumed figures" \
  "${adv[@]}" --gpus 8 --measured szero.json
for op in "normal dispatch" "normal combine" "tp-allreduce allreduce"; do
  line $op 0 0 64; line $op 0 0 4096
done > zero.jsonl
check "lines all zeros" refuse "--measured 'zero.jsonl': every median_us of its 2 normal dispatch line(s) is 0: nothing was timed" \
  "${adv[@]}" --gpus 8 --measured zero.jsonl
{ good | grep -v allreduce; line tp-allreduce allreduce 0 0 64; line tp-allreduce allreduce 0 0 4096; } > arzero.jsonl
check "lines: one operation all zeros" refuse "every median_us of its 2 tp-allreduce allreduce line(s) is 0" \
  "${adv[@]}" --gpus 8 --measured arzero.jsonl
{ good; line normal dispatch 0 0 16; } > onezero.jsonl
check "one zero among timed lines reads" sh -c '"$@" >/dev/null' - "${adv[@]}" --gpus 8 --measured onezero.jsonl

possible() { ! grep -qE 'below 0 tokens|\((0|1) per GPU\)' <<<"$1"; }
# verdicts: never "below 0 tokens", never "1 per GPU" below one token per GPU
for G in 8 64 512 4096; do
  for link in nvlink4 pcie4 ib-ndr; do
    a=$("$EPX" advise --model kimi-k2 --gpus $G --link $link | grep '^answer')
    check "verdict G=$G $link is possible" possible "$a"
  done
done
a=$("$EPX" advise --model kimi-k2 --gpus 4096 --link nvlink4 | grep '^answer')
check "4096 GPUs: says per GPU" grep -q 'each of the 4096 GPUs a token' <<<"$a"
# more GPUs than experts: a top-2 token reaches at most 2 other GPUs (it once read 2.09)
reach() { "$EPX" advise --model mixtral-8x7b --gpus "$1" --link pcie5 |
  sed -n 's/.*it reaches \([0-9.]*\) other.*/\1/p'; }
at_most_k() { awk -v r="$(reach "$1")" -v k=2 'BEGIN { exit !(r != "" && r <= k) }'; }
for G in 8 9 64 1025; do check "mixtral on $G GPUs reaches at most 2" at_most_k $G; done
# ... which means redundant slots (8 experts on 16 GPUs): said, not assumed silently
expect_rc 0 "$EPX" advise --model mixtral-8x7b --gpus 16 --link nvlink4
check "more GPUs than experts: the slots stated" grep -qF "16 GPUs for 8 experts: each GPU holds one replica, so 8 redundant slots" out
check "  in the answer too" grep -qF "8 redundant slots assumed" out
expect_rc 0 "$EPX" advise --model mixtral-8x7b --gpus 65536 --link nvlink4 --json
check "  65536 GPUs: --json says how many" grep -qF '"redundant_slots_assumed": 65528' out
check "  and 7/8 of 2 on 8 GPUs" test "$(reach 8)" = 1.75

# loads: a total beyond what SGLang's int64 counts hold is refused on read
# (each 1e308 once gave NaN balancedness with exit 0)
printf '{"logical_count": [[1e308, 1e308, 1e308, 1e308]]}' >big.json
check "stats: loads beyond a double refused" refuse "more than a double holds" "$EPX" stats big.json
"$EPX" layout trivial --layers 1 --experts 4 --gpus 2 -o lay.json >/dev/null
check "eval: likewise" refuse "above 2^63" "$EPX" eval --placement lay.json --counts big.json \
  --gpus 2
printf '{"logical_count": [[5e18, 5e18, 3, 4]]}' >sum.json
check "a total just above 2^63 refused" refuse "the loads sum to 1e+19" "$EPX" stats sum.json
printf '{"logical_count": [[4e18, 4e18, 3, 4]]}' >fits.json
check "a total just below it reads" expect_rc 0 "$EPX" stats fits.json --gpus 2

exit $fail
