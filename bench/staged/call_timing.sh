#!/bin/bash
# One device call that times bench/staged/instances_no_compact.patch (.devsmall)
# and normal_two_flags.patch on top (.devtwo) against main (.devmain):
# low latency bf16 (peer, host) and fp8 (peer), then normal mode, with the
# half split (variant 32768) once; then main's kernels under test_ids64.patch's
# cases. Carry .devmain .devsmall/epx .devtwo/epx .devlibs (each epx is
# static: BUDGET=0 runs no check; ~33 MB). The builds, each with
# test_ids64.patch: main, main + instances_no_compact.patch, main + both
# patches, each its epx, test_gpu_ll and two libraries in that folder.
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64
mkdir -p /tmp/p
BASE=.devmain NEW=.devsmall NEW2=.devtwo OUT=/tmp/p/ll TRANSPORTS="peer host" BUDGET=0 \
    timeout 200 scripts/gpu_ab.sh 2>&1 | grep -v "^SKIPPED\|exit 0\|^checks\|^gpu_ab"
BASE=.devmain NEW=.devsmall NEW2=.devtwo OUT=/tmp/p/fp8 TRANSPORTS=peer BENCH_ARGS=--fp8 BUDGET=0 \
    timeout 100 scripts/gpu_ab.sh 2>&1 | grep -v "^SKIPPED\|exit 0\|^checks\|^gpu_ab"
BASE=.devmain NEW=.devsmall NEW2=.devtwo OUT=/tmp/p/nm MODE=normal TRANSPORTS=peer \
    TOKENS=1,1024,2048,4096 BUDGET=0 timeout 150 scripts/gpu_ab.sh 2>&1 | grep -v "^SKIPPED\|exit 0\|^checks\|^gpu_ab"
EPX_LL_VARIANT=32768 timeout 40 .devtwo/epx bench comm --backend nccl --gpus 1 --model kimi-k2.5 \
    --mode normal --graph --tokens 1024,2048,4096 --iters 30 --warmup 5 2>&1 | grep "dispatch   graph"
# Where the NCCL transport's round trip goes at one token: every kernel's
# duration (ours and NCCL's), launched, under ncu (issue 26's <= 2x).
timeout 120 ncu --metrics gpu__time_duration.sum --csv --launch-skip 60 --launch-count 12 \
    .devmain/epx bench comm --backend nccl --gpus 1 --model kimi-k2.5 --mode low-latency \
    --transport nccl --token-bound tokens --tokens 1 --iters 20 --warmup 5 > /tmp/p/ncu_nccl.csv 2>&1
grep -i "duration" /tmp/p/ncu_nccl.csv | awk -F'","' '{print $5, $(NF)}' | head -14
# main's kernels with int64 ids in the large batches (test_ids64.patch)
timeout 100 .devmain/test_gpu_ll > /tmp/p/ids64.log 2>&1; echo "test_gpu_ll (main + int64 ids) exit $?"
tail -3 /tmp/p/ids64.log
tar czf $OUT/p.tgz -C /tmp p
