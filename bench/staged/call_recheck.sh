#!/bin/bash
# One device call (~300 s): the parts of the quick check that call_check.sh's
# run lost: test_gpu_ll over every transport and under memcheck (its random
# shapes now zeroed first: they left normal, variant and ids64 to the stack,
# which memcheck's differed), and DeepEP's low-latency test over host memory
# (cut off by that call's limit). Carry .devnf2 .devlibs .deepep.
cd "$(dirname "$0")/../.."
ROOT=$PWD BIN=$PWD/.devnf2
export LD_LIBRARY_PATH=$ROOT/.devlibs:/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
fail=0
run() { # name, command...
    echo "== $1 ($(date +%s))"; shift
    "$@" >/tmp/recheck.log 2>&1; rc=$?
    if [ $rc = 0 ]; then tail -3 /tmp/recheck.log; else tail -30 /tmp/recheck.log; fi
    [ $rc = 0 ] || { echo "FAILED (exit $rc)"; fail=1; }
}
run "test_gpu_ll" timeout 150 "$BIN/test_gpu_ll"
run "test_gpu_ll, host memory" env EPX_GPU_EP_TRANSPORT=host timeout 150 "$BIN/test_gpu_ll"
run "test_gpu_ll, NCCL" env EPX_GPU_EP_TRANSPORT=nccl timeout 150 "$BIN/test_gpu_ll"
run "test_gpu_ll under memcheck" timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 \
    --target-processes all "$BIN/test_gpu_ll"
run "test_gpu_ll under memcheck, host memory" env EPX_GPU_EP_TRANSPORT=host timeout 200 \
    compute-sanitizer --tool memcheck --error-exitcode 9 --target-processes all "$BIN/test_gpu_ll"
run "DeepEP's test_low_latency.py, 2 processes, host memory" env EPX_GPU_EP_TRANSPORT=host \
    EPX_LIBRARY="$BIN/libepx.so" EPX_CUDA_LIBRARY="$BIN/libepx_cuda.so" PYTHONPATH="$ROOT/python" \
    timeout 150 python3 tools/deepep_ll_check.py --deepep .deepep --num-processes 2 --timeout 140
echo "end $(date +%s)"
[ $fail = 0 ] && echo "recheck: all passed" || echo "recheck: FAILURES above"
