#!/usr/bin/env bash
# small_combine_check.sh - the next GPU call for branch small-combine: a
# small batch's combine in 128-thread blocks (kSmallCombineThreads) timed
# against the usual 256-thread blocks (EPX_LL_VARIANT=1024, same binary) and
# a build with -DEPX_LL_SMALL_COMBINE_THREADS=64 in BIN/c64 (epx and
# test_gpu_ll), two rounds; normal mode; the host transport; block 0's
# stamps at 1 and 8 tokens (where the dispatch's time goes); then the
# QUICK check. Logs and JSON lines under $OUT.
#   BIN=.devbin OUT=... scripts/small_combine_check.sh   (after scripts/stage_gpu.sh)
set -u
B=${BIN:-.devbin}
OUT=${OUT:-/tmp/small_combine}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0
exec > >(tee "$OUT/check.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
ll() { # label epx variant file
  echo "== $1"
  EPX_LL_VARIANT=$3 $2 bench comm --backend nccl --gpus 1 --mode low-latency --graph --model kimi-k2.5 --tokens 1,8,32,128 --iters 50 --warmup 10 --json $OUT/j/ll_$4.jsonl 2>&1 | grep -E "graph" | grep -v "floor\|engine"
}
mkdir -p $OUT/j
for r in 1 2; do
  ll "combine 256 (variant 1024), round $r" $B/epx 1024 c256_r$r
  ll "small combine 128, round $r" $B/epx 0 c128_r$r
  ll "small combine 64, round $r" ${B}/c64/epx 0 c64_r$r
done
echo "== normal mode"
$B/epx bench comm --backend nccl --gpus 1 --mode normal --graph --model kimi-k2.5 --tokens 1,128,1024,4096 --iters 10 --warmup 3 --json $OUT/j/normal.jsonl 2>&1 | grep -E "graph" | grep -v "floor\|engine"
echo "== host transport"
$B/epx bench comm --backend nccl --gpus 1 --mode low-latency --graph --transport host --model kimi-k2.5 --tokens 1,8,32,128 --iters 30 --warmup 5 --json $OUT/j/host.jsonl 2>&1 | grep -E "graph|launch" | grep -v "floor\|engine"
echo "== stamps, 1 token"
EPX_LL_VARIANT=8 $B/epx bench comm --backend nccl --gpus 1 --mode low-latency --graph --model kimi-k2.5 --tokens 1,8 --iters 20 --warmup 5 > $OUT/stamps.log 2>&1; grep -A3 "stamps at" $OUT/stamps.log | head -30
echo "== c64 test_gpu_ll"; timeout 200 ${B}/c64/test_gpu_ll > $OUT/tll_c64.log 2>&1; echo rc=$?; tail -2 $OUT/tll_c64.log
echo "== gpu_check QUICK"
QUICK=1 BIN=$B timeout 420 scripts/gpu_check.sh > $OUT/gpu_check.log 2>&1; echo rc=$?
grep -E "^==|FAILED|passed|PASS|ERROR SUMMARY|ok:" $OUT/gpu_check.log | head -60
tar czf $OUT/j.tgz -C $OUT j && rm -rf $OUT/j
echo ALLDONE
