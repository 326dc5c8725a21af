#!/bin/bash
# Judges bench/staged/bal_regs.patch (~200 s): the subset solve's slack
# values in each lane's registers, the split's (64 bits) and the rounding's
# (32 bits). bal_check.sh times three builds: main, the split's part alone
# (bench_balanced_step1) and the whole patch. Stage on the development VM:
#   git apply bench/staged/bal_regs.patch && make build JOBS=2
#   BIN=build scripts/stage_gpu.sh
#   cp <main's build>/bench/bench_balanced .devbin/bench_balanced_base
#   cp <main + bal_split_regs.patch>/bench/bench_balanced .devbin/bench_balanced_step1
#   (bal_split_regs.patch: the split's part alone, also against main)
# and carry .devbin .devlibs .devpy (bal_check needs test_balanced_gpu, the
# libraries and the three bench_balanced; the rest of .devbin can go, under
# the carry's 64 MiB). The sixteenth session left .devbin staged so.
# bal_check.sh's checks (test_balanced_gpu five ways, memcheck, racecheck on
# the max-flows, epx.torch's balanced tests) and timings, then racecheck and
# synccheck on the default solve.
set -u
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64
BIN=.devbin timeout 300 scripts/bal_check.sh 2>&1 | tail -24
for tool in racecheck synccheck; do
    EPX_GPU_TEST_QUICK=1 timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 \
        .devbin/test_balanced_gpu > /tmp/$tool.log 2>&1
    echo "== $tool, default solve, quick cases: exit $?"
    tail -2 /tmp/$tool.log
done
