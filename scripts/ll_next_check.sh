#!/usr/bin/env bash
# ll_next_check.sh - the GPU calls for branch ll-next (bench/RESULTS.md, "For
# the next device call: branch ll-next"). Changes behind an EPX_LL_VARIANT
# bit that restores the form before each, so one binary attributes them:
# 1024 a small batch's combine in the usual 256-thread blocks, 2048 the slot
# ranges stored between their loads, 8192 normal mode's first meta asked for
# after the slots' scan. (4096, relaxed polls' old form, went: the relaxed
# polls lost on the H200, 2026-12-05.) The bits cannot show what the new code costs in
# registers, so main's build (BIN/base/epx) is timed beside it as the base.
# BIN/c64/epx: the branch built with -DEPX_LL_SMALL_COMBINE_THREADS=64.
#   PART=timing  (~4 min) the round trips, two rounds alternated; normal mode;
#                the host transport; block 0's stamps at 1 and 8 tokens
#   PART=check   (~7 min) the QUICK check (its test_gpu_ll runs the old forms too)
#   BIN=.devbin OUT=... PART=... scripts/ll_next_check.sh
# Staging, on the development VM (scripts/stage_gpu.sh wipes .devbin, so it
# goes first; every build is Release with tests, CUDA and MPI, as `make build`):
#   BIN=build scripts/stage_gpu.sh                       # this branch's build
#   mkdir -p .devbin/base .devbin/c64
#   cp -L MAIN_BUILD/epx .devbin/base/                   # main's build, the base
#   cp -L C64_BUILD/epx .devbin/c64/                     # this branch with
#                                   # -DCMAKE_CUDA_FLAGS=-DEPX_LL_SMALL_COMBINE_THREADS=64
# and carry .devbin, .devlibs (and .deepep, .devpy for PART=check).
set -u
B=${BIN:-.devbin}
OUT=${OUT:-/tmp/ll_next}
PART=${PART:-timing}
mkdir -p "$OUT/j"
export LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0
exec > >(tee -a "$OUT/$PART.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
comm() { # label epx variant file mode tokens iters [--transport host]
    echo "== $1"
    EPX_LL_VARIANT=$3 "$2" bench comm --backend nccl --gpus 1 --mode "$5" --graph \
        --model kimi-k2.5 --tokens "$6" --iters "$7" --warmup 5 ${8:+$8} \
        --json "$OUT/j/$4.jsonl" 2>&1 | grep -E "graph" | grep -v "floor\|engine"
}
if [ "$PART" = timing ]; then
    for r in 1 2; do
        comm "main, round $r" "$B/base/epx" 0 ll_main_r$r low-latency 1,8,32,128 50
        comm "ll-next, round $r" "$B/epx" 0 ll_new_r$r low-latency 1,8,32,128 50
        comm "ll-next, usual combine blocks (1024), round $r" "$B/epx" 1024 ll_1024_r$r low-latency 1,8,32,128 50
        comm "ll-next, old slot ranges (2048), round $r" "$B/epx" 2048 ll_2048_r$r low-latency 1,8,32,128 50
        comm "ll-next built with a 64-thread small combine, round $r" "$B/c64/epx" 0 ll_c64_r$r low-latency 1,8,32,128 50
    done
    for r in 1 2; do
        comm "normal mode, main, round $r" "$B/base/epx" 0 n_main_r$r normal 1,128,1024,4096 10
        comm "normal mode, ll-next, round $r" "$B/epx" 0 n_new_r$r normal 1,128,1024,4096 10
        comm "normal mode, ll-next, meta after the scan (8192), round $r" "$B/epx" 8192 n_8192_r$r normal 1,128,1024,4096 10
    done
    for r in 1 2; do
        comm "host transport, main, round $r" "$B/base/epx" 0 h_main_r$r low-latency 1,8,32,128 30 "--transport host"
        comm "host transport, ll-next, round $r" "$B/epx" 0 h_new_r$r low-latency 1,8,32,128 30 "--transport host"
    done
    echo "== stamps (ll-next)"
    EPX_LL_VARIANT=8 "$B/epx" bench comm --backend nccl --gpus 1 --mode low-latency --graph \
        --model kimi-k2.5 --tokens 1,8 --iters 20 --warmup 5 >"$OUT/stamps.log" 2>&1
    grep -A3 "stamps at" "$OUT/stamps.log" | head -30
    tar czf "$OUT/j.tgz" -C "$OUT" j && rm -rf "$OUT/j"
else
    echo "== gpu_check QUICK (test_gpu_ll over three transports runs the old forms too)"
    QUICK=1 BIN=$B timeout 560 scripts/gpu_check.sh >"$OUT/gpu_check.log" 2>&1
    echo "rc=$?"; grep -E "^==|FAILED|passed|PASS|ERROR SUMMARY|ok:" "$OUT/gpu_check.log" | head -60
fi
echo ALLDONE
