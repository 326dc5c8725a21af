#!/usr/bin/env bash
# llt_check.sh - the next GPU call for branch ll-threads: the lean dispatch of
# a low-latency batch in blocks of 256 threads (512 elsewhere), and the
# combine probed at 128 threads a block (a build with
# -DEPX_LL_COMBINE_THREADS=128 in BIN/c128). Tests first (test_gpu_ll over
# device memory, host memory and NCCL, memcheck on the quick cases), then
# the round trip timed with EPX_LL_VARIANT=0 (256) against 512 (the old
# 512-thread dispatch) and the 128-thread combine, alternated, two rounds.
#   BIN=.devbin scripts/llt_check.sh   (after scripts/stage_gpu.sh)
set -u
BIN=${BIN:-build}
export LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
for t in peer host nccl; do
    echo "== test_gpu_ll, transport $t"
    EPX_GPU_EP_TRANSPORT=$t timeout 200 "$BIN/test_gpu_ll" 2>&1 | grep -v "^test seed" | tail -6
done
echo "== memcheck (quick cases)"
EPX_GPU_TEST_QUICK=1 timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$BIN/test_gpu_ll" 2>&1 | tail -1
[ -x "$BIN/c128/test_gpu_ll" ] && { echo "== test_gpu_ll, combine at 128 threads";
    timeout 200 "$BIN/c128/test_gpu_ll" 2>&1 | tail -3; }
ll() { # label epx variant
    echo "== $1"
    EPX_LL_VARIANT=$3 "$2" bench comm --backend nccl --gpus 1 --mode low-latency --graph \
        --model kimi-k2.5 --tokens 1,8,32,128 --iters 50 --warmup 10 2>&1 |
        grep -E "graph" | grep -v "floor\|engine"
}
for r in 1 2; do
    ll "dispatch 512, round $r" "$BIN/epx" 512
    ll "dispatch 256, round $r" "$BIN/epx" 0
    [ -x "$BIN/c128/epx" ] && ll "dispatch 256, combine 128, round $r" "$BIN/c128/epx" 0
done
