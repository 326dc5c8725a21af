#!/bin/bash
# Judges bench/staged/bal_split_regs.patch (~180 s): the subset split's
# slack values in each lane's registers. Stage on the development VM:
#   git apply bench/staged/bal_split_regs.patch && make build JOBS=2
#   BIN=build scripts/stage_gpu.sh
#   cp <main's build>/bench/bench_balanced .devbin/bench_balanced_base
# and carry .devbin .devlibs .devpy. bal_check.sh's checks (test_balanced_gpu
# five ways, memcheck, racecheck on the max-flows, epx.torch's balanced
# tests) and timings, then racecheck and synccheck on the default solve.
set -u
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64
BIN=.devbin timeout 300 scripts/bal_check.sh 2>&1 | tail -16
for tool in racecheck synccheck; do
    EPX_GPU_TEST_QUICK=1 timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 \
        .devbin/test_balanced_gpu > /tmp/$tool.log 2>&1
    echo "== $tool, default solve, quick cases: exit $?"
    tail -2 /tmp/$tool.log
done
