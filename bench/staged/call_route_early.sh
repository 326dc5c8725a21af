#!/bin/bash
# Judges bench/staged/route_early.patch (main + it staged in .devR; main in .devK) and
# small_bf16_2sm.patch on top of it (.devR2): bf16 and fp8 low latency alternated,
# then test_gpu_ll on both; then poll_flag.patch alone on main (.devPF) against
# main, and its test_gpu_ll over the three transports. Carry .devK/epx .devR/epx
# .devR/test_gpu_ll .devR2/epx .devR2/test_gpu_ll .devPF/epx .devPF/test_gpu_ll
# .devlibs (whole folders pass the 64 MiB limit).
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
env BASE=.devK NEW=.devPF OUT=/tmp/q/pf TRANSPORTS="peer host" BUDGET=0 ITERS=30 \
    timeout 150 scripts/gpu_ab.sh 2>&1 | q
env BASE=.devK NEW=.devPF OUT=/tmp/q/pfn TRANSPORTS=peer MODE=normal TOKENS=1,1024,4096 \
    BUDGET=0 ITERS=20 timeout 150 scripts/gpu_ab.sh 2>&1 | q
tar czf $OUT/q.tgz -C /tmp q
for b in R R2 PF; do
    timeout 40 .dev$b/test_gpu_ll > /tmp/t.log 2>&1
    echo "test_gpu_ll .dev$b exit $?"
    tail -1 /tmp/t.log
done
for tr in host nccl; do
    EPX_GPU_EP_TRANSPORT=$tr timeout 60 .devPF/test_gpu_ll > /tmp/t.log 2>&1
    echo "test_gpu_ll .devPF $tr exit $?"
done
