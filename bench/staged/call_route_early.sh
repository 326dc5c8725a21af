#!/bin/bash
# Judges bench/staged/route_early.patch (main + it staged in .devR; main in .devK) and
# small_bf16_2sm.patch on top of it (.devR2): bf16 and fp8 low latency alternated,
# then test_gpu_ll on both. Carry .devK/epx .devR/epx .devR/test_gpu_ll .devR2/epx
# .devR2/test_gpu_ll .devlibs (whole folders pass the 64 MiB limit).
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64
mkdir -p /tmp/q
q() { grep -v "^SKIPPED\|exit 0\|^checks\|^gpu_ab"; }
ab() { local out=$1; shift
    env BASE=.devK NEW=.devR NEW2=.devR2 OUT=/tmp/q/$out TRANSPORTS=peer BUDGET=0 \
        ITERS=30 "$@" timeout 100 scripts/gpu_ab.sh 2>&1 | q; }
ab ll
ab fp8 BENCH_ARGS=--fp8
tar czf $OUT/q.tgz -C /tmp q
for b in R R2; do
    timeout 40 .dev$b/test_gpu_ll > /tmp/t.log 2>&1
    echo "test_gpu_ll .dev$b exit $?"
    tail -1 /tmp/t.log
done
