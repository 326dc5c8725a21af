#!/usr/bin/env bash
# ll_next_check.sh - the next GPU call for branch ll-next: a small batch's
# combine in 128-thread blocks (kSmallCombineThreads), the dispatch's slot
# ranges loaded before they are stored, and flags polled with relaxed loads
# and one fence, each timed in the same binary against the form before it
# (EPX_LL_VARIANT 1024: the usual combine blocks; 2048: the old slot-range
# loop; 4096: acquire polls, the fault word on every pass), plus a build with
# -DEPX_LL_SMALL_COMBINE_THREADS=64 in BIN/c64 (epx and test_gpu_ll), two
# rounds; normal mode; the host transport with and without 2048 | 4096; block 0's
# stamps at 1 and 8 tokens (where the dispatch's time goes); then the QUICK
# check. Logs and JSON lines under $OUT.
#   BIN=.devbin OUT=... scripts/ll_next_check.sh   (after scripts/stage_gpu.sh)
set -u
B=${BIN:-.devbin}
OUT=${OUT:-/tmp/ll_next}
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
  ll "base: usual combine blocks, old slot ranges, acquire polls (7168), round $r" $B/epx 7168 base_r$r
  ll "small combine 128 (6144), round $r" $B/epx 6144 c128_r$r
  ll "+ batched slot ranges (4096), round $r" $B/epx 4096 ranges_r$r
  ll "+ relaxed polls (0), round $r" $B/epx 0 new_r$r
  ll "small combine 64 build (0), round $r" ${B}/c64/epx 0 c64_r$r
done
echo "== normal mode"
$B/epx bench comm --backend nccl --gpus 1 --mode normal --graph --model kimi-k2.5 --tokens 1,128,1024,4096 --iters 10 --warmup 3 --json $OUT/j/normal.jsonl 2>&1 | grep -E "graph" | grep -v "floor\|engine"
for v in 6144 0 6144 0; do
  echo "== host transport, variant $v"
  EPX_LL_VARIANT=$v $B/epx bench comm --backend nccl --gpus 1 --mode low-latency --graph --transport host --model kimi-k2.5 --tokens 1,8,32,128 --iters 30 --warmup 5 --json $OUT/j/host_$v.jsonl 2>&1 | grep -E "graph" | grep -v "floor\|engine"
done
echo "== stamps, 1 token"
EPX_LL_VARIANT=8 $B/epx bench comm --backend nccl --gpus 1 --mode low-latency --graph --model kimi-k2.5 --tokens 1,8 --iters 20 --warmup 5 > $OUT/stamps.log 2>&1; grep -A3 "stamps at" $OUT/stamps.log | head -30
echo "== c64 test_gpu_ll"; timeout 200 ${B}/c64/test_gpu_ll > $OUT/tll_c64.log 2>&1; echo rc=$?; tail -2 $OUT/tll_c64.log
echo "== gpu_check QUICK"
QUICK=1 BIN=$B timeout 420 scripts/gpu_check.sh > $OUT/gpu_check.log 2>&1; echo rc=$?
grep -E "^==|FAILED|passed|PASS|ERROR SUMMARY|ok:" $OUT/gpu_check.log | head -60
tar czf $OUT/j.tgz -C $OUT j && rm -rf $OUT/j
echo ALLDONE
