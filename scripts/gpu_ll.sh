#!/usr/bin/env bash
# gpu_ll.sh - the low-latency EP engine's GPU run, in one call on a GPU
# machine: the GPU test (one rank, 2-4 ranks as processes over CUDA IPC,
# graphs, faults), the same under compute-sanitizer memcheck, then
# `epx bench comm` in both modes on the H = 7168 / top-8 layer. Logs and
# JSON lines go to $OUT (or ./gpu-out).
#   BIN=build TOOL=build-dev scripts/gpu_ll.sh   use binaries built there
#   LIBS=DIR                                     extra shared libraries
#   BASE=DIR                                     also time DIR/epx (an older
#                         build) in low-latency mode, alternating with TOOL's,
#                         so a change is judged within one run (base_*.jsonl)
#   ONLY_LL=1                                    skip the normal-mode bench
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH=${LIBS:+$LIBS:}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
BIN=${BIN:-build} TOOL=${TOOL:-build}
TOKENS=${TOKENS:-1,2,4,8,16,32,64,128,512,4096}
# Low latency keeps an expert-major receive of num_local_slots * R * max_tokens
# rows (DeepEP's layout), so its token counts stop at decode sizes.
TOKENS_LL=${TOKENS_LL:-1,2,4,8,16,32,64,128,512}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
ldd "$BIN/test_gpu_ll" "$TOOL/epx" | grep "not found" && echo "MISSING LIBRARIES"

echo "== GPU test"
timeout 400 "$BIN/test_gpu_ll" 2>&1 | tee "$OUT/test_gpu_ll.log"
[ "${PIPESTATUS[0]}" = 0 ] || echo "GPU TEST FAILED"
if command -v compute-sanitizer >/dev/null && [ "${SANITIZE:-1}" = 1 ]; then
    echo "== compute-sanitizer memcheck"
    timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 --target-processes all \
        "$BIN/test_gpu_ll" >"$OUT/memcheck.log" 2>&1
    echo "memcheck exit $?"; tail -5 "$OUT/memcheck.log"
fi
# The other GPU tests whose code the EP work touched (cmocka from LIBS).
for t in test_dispatch_gpu test_nccl_ep; do
    [ -x "$BIN/$t" ] || continue
    echo "== $t"; (cd tests && timeout 300 "../$BIN/$t") >"$OUT/$t.log" 2>&1
    echo "$t exit $?"; tail -3 "$OUT/$t.log"
done
echo "== where the time goes: block 0's global-timer stamps inside each low-latency kernel"
EPX_LL_VARIANT=8 timeout 120 "$TOOL/epx" bench comm --backend nccl --mode low-latency --model kimi-k2.5 \
    --tokens 1,8,32,128 --iters 3 --warmup 1 2>&1 | grep stamps | tee "$OUT/stamps.log"
if [ -n "${BASE:-}" ]; then
    for round in 1 2; do
        for who in base new; do
            bin=$TOOL/epx; [ $who = base ] && bin=$BASE/epx
            echo "== round $round: $who ($bin) low-latency, graph and launched"
            for g in --graph; do
                timeout 200 "$bin" bench comm --backend nccl --mode low-latency $g --model kimi-k2.5 \
                    --tokens "$TOKENS_LL" --iters ${ITERS:-50} --warmup 10 \
                    --json "$OUT/${who}_ll.jsonl" >"$OUT/${who}_${round}${g:+_graph}.log" 2>&1; echo "exit $?"
            done
        done
    done
    EPX_LL_VARIANT=8 timeout 120 "$BASE/epx" bench comm --backend nccl --mode low-latency \
        --model kimi-k2.5 --tokens 1,8,32,128 --iters 3 --warmup 1 2>&1 | grep stamps |
        sed 's/^/base /' | tee -a "$OUT/stamps.log"
fi
modes="low-latency normal"; [ "${ONLY_LL:-0}" = 1 ] && modes=low-latency
[ "${ONLY_LL:-0}" = 1 ] && [ -n "${BASE:-}" ] && modes=""  # timed above already
for mode in $modes; do
    extra=""; toks=$TOKENS; [ $mode = low-latency ] && extra="--graph" && toks=$TOKENS_LL
    echo "== epx bench comm --mode $mode"
    timeout 300 "$TOOL/epx" bench comm --backend nccl --mode $mode $extra --model kimi-k2.5 \
        --tokens "$toks" --iters ${ITERS:-50} --warmup 10 --json "$OUT/ep_h200.jsonl" 2>&1 |
        tee "$OUT/bench_$mode.log"
done
