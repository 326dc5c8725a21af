#!/bin/bash
# Judges bench/staged/staging_stride.patch (~200 s). Build on the development VM first:
#   git apply bench/staged/staging_stride.patch && make build JOBS=2
#   mkdir -p .devS2/base && cp build/{epx,test_gpu_ll,libepx.so,libepx_cuda.so} .devS2/
#   cp <main's epx> .devS2/base/epx
#   and, to show the new case failing without the fix, the test built with
#   only the patch's test part (the engine unfixed) as .devS2/test_gpu_ll_unfixed
# (add /.devS2/ to .git/info/exclude), then carry .devS2 and .devlibs.
# The unfixed engine must fail the new case (its receives read source 1's
# flag 8 bytes after source 0's: a timeout fault); the fixed one passes every
# case on the default and the nccl transport; the pointers are no slower.
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name --format=csv,noheader
if [ -x .devS2/test_gpu_ll_unfixed ]; then
    echo "== unfixed engine, the new staged case (expected to fail)"
    timeout 70 .devS2/test_gpu_ll_unfixed > /tmp/u.log 2>&1
    echo "exit $?"
    tail -4 /tmp/u.log
fi
echo "== fixed, default"
timeout 90 .devS2/test_gpu_ll > /tmp/f.log 2>&1
echo "exit $?"
tail -6 /tmp/f.log
echo "== fixed, nccl transport"
EPX_GPU_EP_TRANSPORT=nccl timeout 60 .devS2/test_gpu_ll > /tmp/n.log 2>&1
echo "exit $?"
tail -4 /tmp/n.log
env BASE=.devS2/base NEW=.devS2 OUT=/tmp/ab TRANSPORTS="peer host" BUDGET=0 ITERS=30 \
    timeout 150 scripts/gpu_ab.sh 2>&1 | grep -v "^SKIPPED\|exit 0\|^checks\|^gpu_ab"
tar czf "$OUT/ab.tgz" -C /tmp ab u.log f.log n.log 2>/dev/null
