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
#   MPS=1       run them under MPS where nvidia-cuda-mps-control exists (0: time-sliced)
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
# runs more ranks than GPUs): what crosses the host link between ranks. Under
# MPS, so the processes run side by side (without it they take turns and the
# times are the GPU's time slices), each launch capped to its share of the
# GPU: every block of a launch must be resident at once (bench/RESULTS.md).
if command -v mpirun >/dev/null && [ "${RANKS:-2 4}" != 0 ]; then
    mps=0
    if command -v nvidia-cuda-mps-control >/dev/null && [ "${MPS:-1}" = 1 ]; then
        export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/epx-mps-pipe}
        export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/epx-mps-log}
        mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
        sms=$(nvidia-smi --query-gpu=multiprocessor_count --format=csv,noheader 2>/dev/null |
            head -1 | tr -dc 0-9)
        mps=1
    fi
    for n in ${RANKS:-2 4}; do
        for t in peer host; do
            cap=()
            if [ $mps = 1 ]; then
                nvidia-cuda-mps-control -d
                cap=(--max-blocks $((2 * ${sms:-132} / n)))
            fi
            echo "== bench, transport $t, $n processes on the GPU$([ $mps = 1 ] && echo ", MPS, ${cap[*]}")"
            timeout 300 mpirun --allow-run-as-root --oversubscribe -np "$n" \
                -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE ${CUDA_MPS_PIPE_DIRECTORY:+-x CUDA_MPS_PIPE_DIRECTORY} \
                "$BIN/epx" bench comm --backend nccl \
                --mode low-latency --graph --transport $t --model kimi-k2.5 "${cap[@]}" \
                --tokens "${TOKENS:-1,8,32,128}" --iters "${ITERS:-50}" --warmup 10 \
                --json "$OUT/ep_transport.jsonl" 2>&1 | grep -v "floor\|bare kernels" || fail=1
            [ $mps = 1 ] && { echo quit | nvidia-cuda-mps-control; sleep 2; }
        done
    done
fi
ls /dev/shm | grep epx-ll && { echo "LEFT IN /dev/shm"; fail=1; }
[ $fail = 0 ] && echo "gpu_transport: all passed" || echo "gpu_transport: FAILURES above"
exit $fail
