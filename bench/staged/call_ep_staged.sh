#!/bin/bash
# Judges bench/staged/staging_stride.patch and staged_flags.patch on top of it
# (~350 s). Stage on the development VM (add the folders to .git/info/exclude):
#   .devM:  main's epx                                     (BASE)
#   .devS2: main + staging_stride.patch: epx, test_gpu_ll   (NEW)
#           (both static), and test_gpu_ll_unfixed = the test built with
#           the patch's test part alone (the engine unfixed)
#   .devS3: main + both patches: epx, test_gpu_ll           (NEW2)
# (BUDGET=0: gpu_ab.sh runs no checks, so no libraries), and carry .devM
# .devS2 .devS3 .devlibs (~45 MiB with the tree). The fifteenth session
# left these folders staged on the development VM. The unfixed engine must fail the
# new staged case; both fixed builds pass test_gpu_ll on the default, host
# and nccl transports; the times say whether the early flag read pays over
# NCCL and costs nothing over device and host memory.
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name --format=csv,noheader
if [ -x .devS2/test_gpu_ll_unfixed ]; then
    echo "== unfixed engine, the new staged case (expected to fail)"
    timeout 150 .devS2/test_gpu_ll_unfixed > /tmp/u.log 2>&1
    echo "exit $?"
    tail -3 /tmp/u.log
fi
for d in S2 S3; do
    for tr in "" host nccl; do
        EPX_GPU_EP_TRANSPORT=$tr timeout 90 .dev$d/test_gpu_ll > /tmp/t.log 2>&1
        echo "== .dev$d test_gpu_ll ${tr:-default}: exit $?"
        tail -2 /tmp/t.log
    done
done
env BASE=.devM NEW=.devS2 NEW2=.devS3 OUT=/tmp/ab TRANSPORTS="nccl peer host" BUDGET=0 \
    ITERS=30 timeout 200 scripts/gpu_ab.sh 2>&1 | grep -v "^SKIPPED\|exit 0\|^checks\|^gpu_ab"
tar czf "$OUT/ab.tgz" -C /tmp ab
