#!/bin/bash
# One device call (~250 s) that judges normal_two_flags.patch (built in
# .devnf) against main (.devmain): low latency bf16 and fp8 over device
# memory, normal mode at 1-4,096 tokens with the meta blocks' three shares
# (half, the default; a quarter, variant 32768; five eighths, 65536), then
# the new build's test_gpu_ll (int64-id cases included) over device memory,
# host memory and NCCL, and every kernel's duration on main's NCCL
# transport at one token under ncu (issue 26). Carry .devmain/epx .devnf
# .devlibs. call_check.sh is the quick check that follows.
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64
mkdir -p /tmp/p
quiet() { grep -v "^SKIPPED\|exit 0\|^checks\|^gpu_ab"; }
BASE=.devmain NEW=.devnf OUT=/tmp/p/ll TRANSPORTS=peer BUDGET=0 ITERS=30 \
    timeout 100 scripts/gpu_ab.sh 2>&1 | quiet
BASE=.devmain NEW=.devnf OUT=/tmp/p/fp8 TRANSPORTS=peer BENCH_ARGS=--fp8 BUDGET=0 ITERS=30 \
    timeout 100 scripts/gpu_ab.sh 2>&1 | quiet
BASE=.devmain NEW=.devnf OUT=/tmp/p/nm MODE=normal TRANSPORTS=peer TOKENS=1,1024,2048,4096 \
    BUDGET=0 timeout 150 scripts/gpu_ab.sh 2>&1 | quiet
for v in 32768 65536; do
    echo "variant $v (meta share)"
    EPX_LL_VARIANT=$v timeout 40 .devnf/epx bench comm --backend nccl --gpus 1 --model kimi-k2.5 \
        --mode normal --graph --tokens 1024,2048,4096 --iters 30 --warmup 5 2>&1 | grep "dispatch   graph"
done
for tr in device host nccl; do # device: the default (pointers, or peer across processes)
    env $([ $tr = device ] || echo EPX_GPU_EP_TRANSPORT=$tr) timeout 150 .devnf/test_gpu_ll \
        > /tmp/p/test_$tr.log 2>&1
    echo "test_gpu_ll ($tr, new build with int64 ids) exit $?"
    tail -2 /tmp/p/test_$tr.log
done
timeout 120 ncu --metrics gpu__time_duration.sum --csv --launch-skip 60 --launch-count 12 \
    .devmain/epx bench comm --backend nccl --gpus 1 --model kimi-k2.5 --mode low-latency \
    --transport nccl --token-bound tokens --tokens 1 --iters 20 --warmup 5 > /tmp/p/ncu_nccl.csv 2>&1
grep -i "duration" /tmp/p/ncu_nccl.csv | awk -F'","' '{print $5, $(NF)}' | head -14
tar czf $OUT/p.tgz -C /tmp p
