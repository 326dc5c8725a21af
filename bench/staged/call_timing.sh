#!/bin/bash
# One device call that times bench/staged/instances_no_compact.patch (.devsmall)
# and normal_two_flags.patch on top (.devtwo) against main (.devmain):
# low latency bf16 (peer, host) and fp8 (peer), then normal mode, with the
# half split (variant 32768) once (~500 s). Carry .devmain/epx .devsmall/epx
# .devtwo/epx .devlibs (each epx is static: BUDGET=0 runs no check). The
# builds, each with test_ids64.patch: main, main + instances_no_compact.patch,
# main + both patches, each its epx, test_gpu_ll and two libraries in that
# folder. call_probe.sh and call_check.sh are the other two calls.
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64
mkdir -p /tmp/p
BASE=.devmain NEW=.devsmall NEW2=.devtwo OUT=/tmp/p/ll TRANSPORTS="peer host" BUDGET=0 \
    ITERS=30 timeout 240 scripts/gpu_ab.sh 2>&1 | grep -v "^SKIPPED\|exit 0\|^checks\|^gpu_ab"
BASE=.devmain NEW=.devsmall NEW2=.devtwo OUT=/tmp/p/fp8 TRANSPORTS=peer BENCH_ARGS=--fp8 BUDGET=0 \
    ITERS=30 timeout 110 scripts/gpu_ab.sh 2>&1 | grep -v "^SKIPPED\|exit 0\|^checks\|^gpu_ab"
BASE=.devmain NEW=.devsmall NEW2=.devtwo OUT=/tmp/p/nm MODE=normal TRANSPORTS=peer \
    TOKENS=1,1024,2048,4096 BUDGET=0 timeout 150 scripts/gpu_ab.sh 2>&1 | grep -v "^SKIPPED\|exit 0\|^checks\|^gpu_ab"
EPX_LL_VARIANT=32768 timeout 40 .devtwo/epx bench comm --backend nccl --gpus 1 --model kimi-k2.5 \
    --mode normal --graph --tokens 1024,2048,4096 --iters 30 --warmup 5 2>&1 | grep "dispatch   graph"
tar czf $OUT/p.tgz -C /tmp p
