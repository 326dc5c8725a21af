#!/usr/bin/env bash
# gpu_transport.sh - the low-latency engine's transports on a GPU machine in
# one call: the engine's test over each transport (host memory and NCCL also
# under compute-sanitizer memcheck), then `epx bench comm` at one rank for each
# transport in the same run (graph replays and launches; the host rows
# carry link_pct against pinned copies timed beside them), and with 2 and 4
# processes sharing the GPU under mpirun. JSON lines to
# $OUT/ep_transport.jsonl (or ./gpu-out).
#   BIN=build   where test_gpu_ll and epx were built
#   TOKENS=1,8,32,128  ITERS=50
#   RANKS="2 4" processes sharing the GPU under mpirun, peer and host (0: none)
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/${BIN:-build}
export LD_LIBRARY_PATH=$ROOT/.devlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
fail=0
for t in peer host nccl; do
    echo "== engine test, transport $t"
    EPX_GPU_EP_TRANSPORT=$t timeout 400 "$BIN/test_gpu_ll" >"$OUT/test_gpu_ll_$t.log" 2>&1 || fail=1
    tail -5 "$OUT/test_gpu_ll_$t.log"
done
if command -v compute-sanitizer >/dev/null && [ "${SANITIZE:-1}" = 1 ]; then
    for t in host nccl; do
        echo "== memcheck, transport $t"
        # NCCL's own set-up probes kernel images with calls that fail by design:
        # API errors are not memory errors (memcheck still reports those).
        EPX_GPU_EP_TRANSPORT=$t timeout 400 compute-sanitizer --tool memcheck --error-exitcode 9 \
            --report-api-errors no \
            --target-processes all "$BIN/test_gpu_ll" >"$OUT/memcheck_$t.log" 2>&1 || fail=1
        tail -3 "$OUT/memcheck_$t.log"
    done
fi
for t in peer host nccl; do
    echo "== bench, transport $t"
    timeout 200 "$BIN/epx" bench comm --backend nccl --mode low-latency --graph --transport $t \
        --model kimi-k2.5 --tokens "${TOKENS:-1,8,32,128}" --iters "${ITERS:-50}" --warmup 10 \
        --json "$OUT/ep_transport.jsonl" 2>&1 | grep -v "floor\|bare kernels" || fail=1
done
# Several processes sharing the GPU (the engine bootstraps over MPI when a host
# runs more ranks than GPUs): what crosses the host link between ranks.
if command -v mpirun >/dev/null && [ "${RANKS:-2 4}" != 0 ]; then
    for n in ${RANKS:-2 4}; do
        for t in peer host; do
            echo "== bench, transport $t, $n processes on the GPU"
            timeout 300 mpirun --allow-run-as-root --oversubscribe -np "$n" \
                -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE "$BIN/epx" bench comm --backend nccl \
                --mode low-latency --graph --transport $t --model kimi-k2.5 \
                --tokens "${TOKENS:-1,8,32,128}" --iters "${ITERS:-50}" --warmup 10 \
                --json "$OUT/ep_transport.jsonl" 2>&1 | grep -v "floor\|bare kernels" || fail=1
        done
    done
fi
ls /dev/shm | grep epx-ll && { echo "LEFT IN /dev/shm"; fail=1; }
[ $fail = 0 ] && echo "gpu_transport: all passed" || echo "gpu_transport: FAILURES above"
exit $fail
