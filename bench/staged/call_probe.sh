#!/bin/bash
# One device call (~150 s): main's kernels under test_ids64.patch's cases
# (int64 ids in the large batches), and where the NCCL transport's round trip
# goes at one token, every kernel's duration (ours and NCCL's) under ncu, for
# issue 26's <= 2x. Carry .devmain .devlibs.
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64
mkdir -p /tmp/p
timeout 100 .devmain/test_gpu_ll > /tmp/p/ids64.log 2>&1; echo "test_gpu_ll (main + int64 ids) exit $?"
tail -3 /tmp/p/ids64.log
timeout 120 ncu --metrics gpu__time_duration.sum --csv --launch-skip 60 --launch-count 12 \
    .devmain/epx bench comm --backend nccl --gpus 1 --model kimi-k2.5 --mode low-latency \
    --transport nccl --token-bound tokens --tokens 1 --iters 20 --warmup 5 > /tmp/p/ncu_nccl.csv 2>&1
grep -i "duration" /tmp/p/ncu_nccl.csv | awk -F'","' '{print $5, $(NF)}' | head -14
cp /tmp/p/ncu_nccl.csv /tmp/p/ids64.log $OUT/ 2>/dev/null
