#!/bin/bash
# Judges bench/staged/route_early.patch (main + it staged in .devR; main in .devK):
# bf16 and fp8 low latency alternated, then test_gpu_ll. Carry .devK/epx .devR .devlibs.
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64
mkdir -p /tmp/q
q() { grep -v "^SKIPPED\|exit 0\|^checks\|^gpu_ab"; }
ab() { local out=$1; shift
    env BASE=.devK NEW=.devR OUT=/tmp/q/$out TRANSPORTS=peer BUDGET=0 \
        ITERS=30 "$@" timeout 100 scripts/gpu_ab.sh 2>&1 | q; }
ab ll
ab fp8 BENCH_ARGS=--fp8
tar czf $OUT/q.tgz -C /tmp q
timeout 40 .devR/test_gpu_ll > /tmp/t.log 2>&1; echo "test_gpu_ll device exit $?"; tail -1 /tmp/t.log
