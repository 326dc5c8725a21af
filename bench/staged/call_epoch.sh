#!/bin/bash
# One device call (~280 s) that judges the three prologue patches of
# bench/staged (README.md there), each build one more on top of the last:
# .devC = main + epoch_red.patch, .devD = + fp8_epoch_first.patch, .devE = +
# route_early.patch (epx, test_gpu_ll and both libraries), main in .devmain.
# Low latency bf16 and fp8 over device memory, the four builds alternated
# (gpu_ab.sh's NEW3), and normal mode; then .devE's test_gpu_ll over every
# transport and under memcheck, and DeepEP's test_low_latency.py on 2
# processes. Carry .devmain/epx .devC/epx .devD/epx .devE .devlibs .deepep.
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64
mkdir -p /tmp/e
q() { grep -v "^SKIPPED\|exit 0\|^checks\|^gpu_ab"; }
ab() { # out [env...]
    local out=$1
    shift
    env BASE=.devmain NEW=.devC NEW2=.devD NEW3=.devE OUT=/tmp/e/$out TRANSPORTS=peer BUDGET=0 \
        ITERS=30 "$@" timeout 120 scripts/gpu_ab.sh 2>&1 | q
}
ab ll
ab fp8 BENCH_ARGS=--fp8
ab nm MODE=normal TOKENS=1,1024,4096 ITERS=20
tar czf $OUT/e.tgz -C /tmp e
for tr in device host nccl; do
    env $([ $tr = device ] || echo EPX_GPU_EP_TRANSPORT=$tr) timeout 40 .devE/test_gpu_ll \
        > /tmp/t.log 2>&1
    rc=$?
    echo "test_gpu_ll $tr exit $rc"
    [ $rc = 0 ] || tail -3 /tmp/t.log
done
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 --target-processes all \
    .devE/test_gpu_ll > /tmp/m.log 2>&1
echo "memcheck exit $?"
tail -2 /tmp/m.log
EPX_LIBRARY=$PWD/.devE/libepx.so EPX_CUDA_LIBRARY=$PWD/.devE/libepx_cuda.so PYTHONPATH=$PWD/python \
    timeout 120 python3 tools/deepep_ll_check.py --deepep .deepep --num-processes 2 --timeout 110 \
    2>&1 | tail -3
