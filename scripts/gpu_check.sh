#!/usr/bin/env bash
# gpu_check.sh - every GPU test in one call, no benchmarks: the dispatch
# kernels (and balanced dispatch's), the low-latency EP engine (1-4 ranks, graphs, faults; also under
# compute-sanitizer memcheck), epx.torch's CUDA tests (the ops and the
# DeepEP-style Buffer, both modes), and DeepEP's own low-latency and normal-mode
# (test_intranode.py) tests on that Buffer when .deepep/ was staged (tools/stage_deepep.sh). What a change to
# GPU code is checked with before it lands; the timing scripts are
# gpu_dispatch.sh, gpu_ll.sh and gpu_torch.sh.
#   QUICK=1     skip what the EP engine does not touch (the dispatch kernels)
#               and DeepEP's test beyond 2 processes (and its shrink test on 6),
#               when device time is short.
#   PART=1|2    half of it, for a device call's 600 s limit (the whole took
#               more than 470 s on an H100, fifteenth session): 1 = the
#               kernels' tests, memcheck and epx.torch; 2 = the processes'
#               examples and DeepEP's tests. Unset: both.
#   BIN=build   where test_dispatch_gpu, test_gpu_ll, libepx.so and
#               libepx_cuda.so were built; libjansson/libzip from ./.devlibs
#               and pytest from ./.devpy where the machine lacks them.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/${BIN:-build}
export LD_LIBRARY_PATH=$ROOT/.devlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
fail=0
run() { # name, command...
    echo "== $1"; shift
    "$@" >/tmp/gpu_check.log 2>&1; rc=$?
    # A failure shows enough of its log to act on; a pass, its summary.
    if [ $rc = 0 ]; then tail -4 /tmp/gpu_check.log; else tail -40 /tmp/gpu_check.log; fi
    [ $rc = 0 ] || { echo "FAILED (exit $rc)"; fail=1; }
}
case "${PART:-}" in
"" | 1 | 2) ;;
*)
    echo "gpu_check.sh: PART=${PART} names no half: give 1, 2, or leave it unset for both" >&2
    exit 2
    ;;
esac
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "${PART:-}" != 2 ]; then
[ "${QUICK:-0}" = 1 ] || run "dispatch kernels" bash -c "cd '$ROOT/tests' && '$BIN/test_dispatch_gpu'"
[ "${QUICK:-0}" = 1 ] || run "balanced dispatch kernel" "$BIN/test_balanced_gpu"
[ "${QUICK:-0}" = 1 ] || run "balanced dispatch kernel, max-flows only" env \
    EPX_BALANCED_SUBSET_GPUS=0 "$BIN/test_balanced_gpu"
[ "${QUICK:-0}" = 1 ] || run "balanced dispatch kernel, every batch in the grid form" env \
    EPX_BALANCED_GRID_PAIRS=0 "$BIN/test_balanced_gpu"
run "low-latency EP engine" "$BIN/test_gpu_ll"
# The same cases over the host-memory transport (pinned shared memory), which
# also checks that no segment is left in /dev/shm.
run "low-latency EP engine, host-memory transport" env EPX_GPU_EP_TRANSPORT=host "$BIN/test_gpu_ll"
run "low-latency EP engine, NCCL transport (one rank)" env EPX_GPU_EP_TRANSPORT=nccl "$BIN/test_gpu_ll"
# Plain launches (the default is programmatic dependent launch).
[ "${QUICK:-0}" = 1 ] || run "low-latency EP engine, plain launches" env EPX_GPU_EP_PDL=0 \
    "$BIN/test_gpu_ll"
if command -v compute-sanitizer >/dev/null; then
    run "low-latency EP engine under memcheck" compute-sanitizer --tool memcheck \
        --error-exitcode 9 --target-processes all "$BIN/test_gpu_ll"
    run "low-latency EP engine under memcheck, host-memory transport" env \
        EPX_GPU_EP_TRANSPORT=host compute-sanitizer --tool memcheck \
        --error-exitcode 9 --target-processes all "$BIN/test_gpu_ll"
    [ "${QUICK:-0}" = 1 ] || run "dispatch kernels under memcheck (quick cases)" bash -c "cd '$ROOT/tests' && \
        EPX_GPU_TEST_QUICK=1 compute-sanitizer --tool memcheck --error-exitcode 9 '$BIN/test_dispatch_gpu'"
    [ "${QUICK:-0}" = 1 ] || run "balanced dispatch kernel under memcheck (quick cases)" env \
        EPX_GPU_TEST_QUICK=1 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/test_balanced_gpu"
fi
run "epx.torch on CUDA" env EPX_LIBRARY="$BIN/libepx.so" EPX_CUDA_LIBRARY="$BIN/libepx_cuda.so" \
    PYTHONPATH="$ROOT/python:$ROOT/.devpy" bash -c "cd /tmp && python3 -m pytest -p no:cacheprovider \
    -q -rs '$ROOT/python/tests/test_torch_ops.py' '$ROOT/python/tests/test_torch.py' \
    '$ROOT/python/tests/test_torch_buffer.py' '$ROOT/python/tests/test_torch_buffer_gpu.py' \
    '$ROOT/python/tests/test_torch_normal.py' '$ROOT/python/tests/test_torch_normal_gpu.py' \
    '$ROOT/python/tests/test_torch_balanced.py'"
fi
if [ "${PART:-}" != 1 ]; then
run "the MoE layer example on epx.torch.Buffer, 2 and 3 processes" env \
    EPX_LIBRARY="$BIN/libepx.so" EPX_CUDA_LIBRARY="$BIN/libepx_cuda.so" PYTHONPATH="$ROOT/python" \
    bash -c "python3 '$ROOT/python/examples/moe_layer_ep.py' --ranks 2 && \
             python3 '$ROOT/python/examples/moe_layer_ep.py' --ranks 3 --experts 12"
# DeepEP's own low-latency test on epx.torch.Buffer, where its files were
# staged (tools/stage_deepep.sh; never committed) and carried as .deepep.
if [ -d "$ROOT/.deepep" ]; then
    for n in 2 $([ "${QUICK:-0}" = 1 ] || echo 3 4); do
        run "DeepEP's test_low_latency.py on epx.torch.Buffer, $n processes" env \
            EPX_LIBRARY="$BIN/libepx.so" EPX_CUDA_LIBRARY="$BIN/libepx_cuda.so" \
            PYTHONPATH="$ROOT/python" python3 "$ROOT/tools/deepep_ll_check.py" \
            --deepep "$ROOT/.deepep" --num-processes $n --timeout 400
    done
    # its normal-mode test (dispatch/combine): 256 experts need 2 or 4 ranks
    for n in 2 $([ "${QUICK:-0}" = 1 ] || echo 4); do
        run "DeepEP's test_intranode.py on epx.torch.Buffer, $n processes" env \
            EPX_LIBRARY="$BIN/libepx.so" EPX_CUDA_LIBRARY="$BIN/libepx_cuda.so" \
            PYTHONPATH="$ROOT/python" python3 "$ROOT/tools/deepep_ll_check.py" \
            --deepep "$ROOT/.deepep" --test intranode --num-processes $n --timeout 400
    done
    run "DeepEP's test_low_latency.py on epx.torch.Buffer, 2 processes, host-memory transport" \
        env EPX_GPU_EP_TRANSPORT=host EPX_LIBRARY="$BIN/libepx.so" \
        EPX_CUDA_LIBRARY="$BIN/libepx_cuda.so" PYTHONPATH="$ROOT/python" python3 \
        "$ROOT/tools/deepep_ll_check.py" --deepep "$ROOT/.deepep" --num-processes 2 --timeout 400
    # Its failure simulation (shrink mode) needs 6 ranks; six processes time-slicing one GPU
    # need a longer deadline than 8 s before a peer counts as stopped (bench/RESULTS.md).
    [ "${QUICK:-0}" = 1 ] || run "DeepEP's test_low_latency.py --shrink-test, 6 processes" env \
        EPX_GPU_EP_TIMEOUT_MS=30000 EPX_LIBRARY="$BIN/libepx.so" \
        EPX_CUDA_LIBRARY="$BIN/libepx_cuda.so" PYTHONPATH="$ROOT/python" python3 \
        "$ROOT/tools/deepep_ll_check.py" --deepep "$ROOT/.deepep" --num-processes 6 \
        --timeout 400 -- --shrink-test
fi
fi
[ $fail = 0 ] && echo "gpu_check${PART:+ part $PART}: all passed" || echo "gpu_check: FAILURES above"
exit $fail
