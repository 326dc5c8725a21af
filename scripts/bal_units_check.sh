#!/usr/bin/env bash
# bal_units_check.sh - one GPU call for branch bal-units (the subset solve's
# rounding skipped where a level leaves no unit over, its slack tables built
# from the experts with units, and the loops over a level's experts walking
# a mask of them instead of testing every expert; the same results bit for
# bit, which the CPU checks on 3,000 random layers): test_balanced_gpu by
# default, in the grid form and with max-flows only, memcheck on the quick
# cases, then bench_balanced of main and of the branch alternated, two rounds
# (ids -> slots and counts -> shares, us per layer).
# Staging (.devbu, ignored): test_balanced_gpu and bench_balanced built on
# the branch, bench_balanced_main on main; carry .devbu .devlibs.
export LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
D=.devbu
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
step test_grid env EPX_BALANCED_GRID_PAIRS=0 "$D/test_balanced_gpu"
step test_flows env EPX_BALANCED_SUBSET_GPUS=0 "$D/test_balanced_gpu"
step memcheck env EPX_GPU_TEST_QUICK=1 compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$D/test_balanced_gpu"
for r in 1 2; do
    for b in bench_balanced_main bench_balanced; do
        echo "== $b round $r"
        timeout 200 "$D/$b" --csv "$OUT/${b}_$r.csv" 2>&1 | grep -v "^device\|^shape" |
            awk '{print $1, $5, $6, $7}' | tr '\n' ';'
        echo
    done
done
exit $fail
