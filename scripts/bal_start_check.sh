#!/usr/bin/env bash
# bal_start_check.sh - one GPU call for branch bal-start (each max-flow
# level's ratio search started from the densest GPU when denser than the
# whole; the same results bit for bit, ~2.2x fewer max-flows on DeepSeek-V3
# with replicas on any GPU, ~0.5x the CPU solve there from 128 tokens):
# test_balanced_gpu by default, with max-flows only (every component through
# the changed path) and with EPX_BALANCED_DENSE_START=0, memcheck on the
# quick cases, then bench_balanced of main and of the branch alternated, two
# rounds (ids -> slots, counts -> shares, the CPU reference; us per layer).
# Staging (.devst, ignored): test_balanced_gpu and bench_balanced built on
# the branch, bench_balanced_main on main; carry .devst .devlibs.
export LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
D=.devst
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
fail=0
step() { # name, command...: its log under $OUT, PASS or FAIL on one line
    local name=$1
    shift
    if timeout 300 "$@" >"$OUT/$name.log" 2>&1; then echo "PASS $name"; else
        echo "FAIL $name (rc $?)"
        tail -5 "$OUT/$name.log"
        fail=1
    fi
}
step test_default "$D/test_balanced_gpu"
step test_flows env EPX_BALANCED_SUBSET_GPUS=0 "$D/test_balanced_gpu"
step test_plain_start env EPX_BALANCED_DENSE_START=0 "$D/test_balanced_gpu"
step memcheck env EPX_GPU_TEST_QUICK=1 EPX_BALANCED_SUBSET_GPUS=0 compute-sanitizer \
    --tool memcheck --error-exitcode 3 "$D/test_balanced_gpu"
for r in 1 2; do
    for b in bench_balanced_main bench_balanced; do
        echo "== $b round $r"
        timeout 240 "$D/$b" --csv "$OUT/${b}_$r.csv" 2>&1 | grep -v "^device\|^shape" |
            awk '{print $1, $5, $6, $7, $8}' | tr '\n' ';'
        echo
    done
done
exit $fail
