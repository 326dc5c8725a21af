#!/usr/bin/env bash
# bal_next_check.sh - one GPU call for branch bal-next, which merges
# bal-units (the subset solve's rounding skipped where a level leaves no
# unit over, its slack tables from the experts with units, the loops over a
# level's experts walking a lane-built mask) and bal-start (max-flow levels
# started from the densest candidate set). Both keep every output bit for
# bit (3,000 random layers hash equal to main's on the CPU, also with
# max-flows only). First the checks, on the merged build: test_balanced_gpu
# by default, with max-flows only, every batch in the grid form, and with
# EPX_BALANCED_DENSE_START=0; memcheck on the quick cases (both solves).
# Then bench_balanced of main, bal-units, bal-start and bal-next, one after
# the other, and main and bal-next again (ids -> slots, counts -> shares,
# the CPU reference; us per layer).
# Staging (.devbn, ignored): test_balanced_gpu of bal-next; bench_balanced of
# each build as bench_<branch>; carry .devbn .devlibs.
export LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
D=.devbn
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
fail=0
step() { # name, command...: its log under $OUT, PASS or FAIL on one line
    local name=$1
    shift
    if timeout 150 "$@" >"$OUT/$name.log" 2>&1; then echo "PASS $name ($SECONDS s)"; else
        echo "FAIL $name (rc $?)"
        tail -5 "$OUT/$name.log"
        fail=1
    fi
}
step test_default "$D/test_balanced_gpu"
step test_flows env EPX_BALANCED_SUBSET_GPUS=0 "$D/test_balanced_gpu"
step test_grid env EPX_BALANCED_GRID_PAIRS=0 "$D/test_balanced_gpu"
step test_plain_start env EPX_BALANCED_DENSE_START=0 "$D/test_balanced_gpu"
step memcheck env EPX_GPU_TEST_QUICK=1 compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$D/test_balanced_gpu"
step memcheck_flows env EPX_GPU_TEST_QUICK=1 EPX_BALANCED_SUBSET_GPUS=0 compute-sanitizer \
    --tool memcheck --error-exitcode 3 "$D/test_balanced_gpu"
# the second main / bal-next pair only while the call's 600 s leave room
for b in main bal-units bal-start bal-next main bal-next; do
    if [ "$SECONDS" -gt 440 ]; then
        echo "== $b skipped: $SECONDS s used"
        continue
    fi
    echo "== $b"
    timeout 100 "$D/bench_$b" --csv "$OUT/bench_${b}_$SECONDS.csv" 2>&1 |
        grep -v "^device\|^shape" | awk '{print $1, $5, $6, $7, $8}' | tr '\n' ';'
    echo
done
# one archive: a call brings back only a few files from $OUT
(cd "$OUT" && tar czf bal_next_out.tgz ./*.log ./*.csv 2>/dev/null && rm -f ./*.log ./*.csv)
exit $fail
