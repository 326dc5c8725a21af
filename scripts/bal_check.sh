#!/usr/bin/env bash
# bal_check.sh - one GPU call for a change to the balanced kernel (first
# used for the small-batch cuts of branch bal-small, bench/RESULTS.md):
# test_balanced_gpu five ways, under memcheck and racecheck, epx.torch's
# balanced and ops tests on CUDA where BIN holds the libraries, then
# bench_balanced against a base build's, alternated, two rounds.
#   BIN=.devbin scripts/bal_check.sh   (after scripts/stage_gpu.sh, with the
#   base build's bench_balanced copied to BIN/bench_balanced_base; carry
#   .devbin .devlibs .devpy). Where BIN also holds bench_balanced_step1,
#   bench_balanced_step2 (the first changes of a stack, each built alone),
#   they are timed between the two, in that order.
# Exits nonzero when a check fails; the timings run either way.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(cd "${BIN:-build}" && pwd)
export LD_LIBRARY_PATH=$ROOT/.devlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
fail=0
check() { # name, command...: its last line, and FAILED with the exit code
    local name=$1 out rc
    shift
    out=$("$@" 2>&1)
    rc=$?
    echo "== $name: $(printf '%s\n' "$out" | tail -1)"
    [ $rc = 0 ] || { printf '%s\n' "$out" | tail -8; echo "FAILED (exit $rc)"; fail=1; }
}
for env in "" EPX_BALANCED_CLOSED_FORM=0 EPX_BALANCED_SUBSET_GPUS=0 EPX_BALANCED_GRID_PAIRS=0 \
    "EPX_BALANCED_SUBSET_GPUS=0 EPX_BALANCED_DENSE_START=0"; do
    check "test_balanced_gpu ${env:-(default)}" env $env "$BIN/test_balanced_gpu"
done
for env in "" EPX_BALANCED_SUBSET_GPUS=0; do
    check "memcheck ${env:-(default)}, quick cases" env EPX_GPU_TEST_QUICK=1 $env \
        compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/test_balanced_gpu"
done
check "racecheck, max-flows only, quick cases" env EPX_GPU_TEST_QUICK=1 \
    EPX_BALANCED_SUBSET_GPUS=0 compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$BIN/test_balanced_gpu"
if [ -e "$BIN/libepx.so" ] && [ -e "$BIN/libepx_cuda.so" ]; then
    check "epx.torch's balanced and ops tests on CUDA" env EPX_LIBRARY="$BIN/libepx.so" \
        EPX_CUDA_LIBRARY="$BIN/libepx_cuda.so" PYTHONPATH="$ROOT/python:$ROOT/.devpy" \
        bash -c "cd /tmp && python3 -m pytest -p no:cacheprovider -q \
        '$ROOT/python/tests/test_torch_balanced.py' '$ROOT/python/tests/test_torch_ops.py'"
fi
for r in 1 2; do
    for b in bench_balanced_base $(cd "$BIN" && ls bench_balanced_step[1-9] 2>/dev/null) \
        bench_balanced; do
        echo "== $b round $r"
        "$BIN/$b" 2>&1 | grep -v "^device\|^shape" | awk '{print $1, $5, $6, $7}' | tr '\n' ';'
        echo
    done
done
[ $fail = 0 ] && echo "bal_check: all checks passed" || echo "bal_check: FAILURES above"
exit $fail
