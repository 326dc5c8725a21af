#!/usr/bin/env bash
# bal_check.sh - one GPU call for a change to the balanced kernel (first
# used for the small-batch cuts of branch bal-small, bench/RESULTS.md):
# test_balanced_gpu four ways and under memcheck, then bench_balanced
# against a base build's, alternated, two rounds.
#   BIN=.devbin scripts/bal_check.sh   (after scripts/stage_gpu.sh, with the
#   base build's bench_balanced copied to BIN/bench_balanced_base)
set -u
BIN=${BIN:-build}
export LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for env in "" EPX_BALANCED_CLOSED_FORM=0 EPX_BALANCED_SUBSET_GPUS=0 EPX_BALANCED_GRID_PAIRS=0; do
    echo "== test_balanced_gpu ${env:-(default)}"
    env $env "$BIN/test_balanced_gpu" 2>&1 | tail -1
done
echo "== memcheck (quick cases)"
EPX_GPU_TEST_QUICK=1 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$BIN/test_balanced_gpu" 2>&1 | tail -1
for r in 1 2; do
    for b in bench_balanced_base bench_balanced; do
        echo "== $b round $r"
        "$BIN/$b" 2>&1 | grep -v "^device\|^shape" | awk '{print $1, $5, $6, $7}' | tr '\n' ';'
        echo
    done
done
