#!/bin/bash
# One device call (~270 s) that judges bench/staged/epoch_red.patch (built
# in .devC/epx) and fp8_epoch_first.patch on top of it (.devD: epx,
# test_gpu_ll and both libraries) against main (.devmain/epx): low latency
# bf16 and fp8 and normal mode over device memory, alternated, then .devD's
# test_gpu_ll over every transport and under memcheck, and DeepEP's
# test_low_latency.py on 2 processes (the combine's epoch changes too).
# Carry .devmain/epx .devC/epx .devD .devlibs .deepep.
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64
mkdir -p /tmp/e
q() { grep -v "^SKIPPED\|exit 0\|^checks\|^gpu_ab"; }
BASE=.devmain NEW=.devC NEW2=.devD OUT=/tmp/e/ll TRANSPORTS=peer BUDGET=0 ITERS=30 timeout 80 \
    scripts/gpu_ab.sh 2>&1 | q
BASE=.devmain NEW=.devC NEW2=.devD OUT=/tmp/e/fp8 TRANSPORTS=peer BENCH_ARGS=--fp8 BUDGET=0 ITERS=30 \
    timeout 80 scripts/gpu_ab.sh 2>&1 | q
BASE=.devmain NEW=.devC NEW2=.devD OUT=/tmp/e/nm MODE=normal TRANSPORTS=peer TOKENS=1,1024,4096 BUDGET=0 \
    ITERS=20 timeout 80 scripts/gpu_ab.sh 2>&1 | q
tar czf $OUT/e.tgz -C /tmp e
for tr in device host nccl; do
    env $([ $tr = device ] || echo EPX_GPU_EP_TRANSPORT=$tr) timeout 40 .devD/test_gpu_ll \
        > /tmp/t.log 2>&1
    rc=$?
    echo "test_gpu_ll $tr exit $rc"
    [ $rc = 0 ] || tail -3 /tmp/t.log
done
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 --target-processes all \
    .devD/test_gpu_ll > /tmp/m.log 2>&1
echo "memcheck exit $?"
tail -2 /tmp/m.log
EPX_LIBRARY=$PWD/.devD/libepx.so EPX_CUDA_LIBRARY=$PWD/.devD/libepx_cuda.so PYTHONPATH=$PWD/python \
    timeout 120 python3 tools/deepep_ll_check.py --deepep .deepep --num-processes 2 --timeout 110 \
    2>&1 | tail -3
