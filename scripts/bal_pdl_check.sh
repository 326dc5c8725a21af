#!/usr/bin/env bash
# bal_pdl_check.sh - the next GPU call for branch bal-pdl: the balanced
# kernels launched with programmatic dependent launch (src/core/pdl.cuh,
# shared with the EP engine now). Tests first (test_balanced_gpu with PDL,
# without it and in the grid form; memcheck; test_gpu_ll, whose launch went
# through the shared helper), then bench_balanced with EPX_BALANCED_PDL=0
# and 1, alternated, two rounds.
#   BIN=.devbin scripts/bal_pdl_check.sh   (after scripts/stage_gpu.sh)
set -u
BIN=${BIN:-build}
export LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
for env in "" EPX_BALANCED_PDL=0 EPX_BALANCED_GRID_PAIRS=0; do
    echo "== test_balanced_gpu ${env:-(default)}"
    env $env "$BIN/test_balanced_gpu" 2>&1 | tail -1
done
echo "== memcheck (quick cases)"
EPX_GPU_TEST_QUICK=1 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$BIN/test_balanced_gpu" 2>&1 | tail -1
echo "== test_gpu_ll"
timeout 200 "$BIN/test_gpu_ll" 2>&1 | tail -5
for r in 1 2; do
    for p in 0 1; do
        echo "== bench_balanced EPX_BALANCED_PDL=$p round $r"
        EPX_BALANCED_PDL=$p "$BIN/bench_balanced" 2>&1 | grep -v "^device\|^shape" |
            awk '{print $1, $5, $6, $7}' | grep -v "^deepseek-v3" | tr '\n' ';'
        echo
    done
done
