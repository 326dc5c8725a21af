#!/usr/bin/env bash
# gpu_dispatch.sh - the dispatch room's GPU run, in one call on a GPU machine:
# the GPU tests (plain and under compute-sanitizer), bench_dispatch and the
# PyTorch peer in the same run. Logs and CSVs go to $OUT (or ./gpu-out).
#   BIN=build-X scripts/gpu_dispatch.sh     use binaries built there (they
#                                           need only libcudart), else build
#                                           them here with nvcc and gcc.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv

BIN=${BIN:-build-dispatch}
TEST=$BIN/test_dispatch_gpu BENCH=$BIN/bench/bench_dispatch
if ! { [ -x "$TEST" ] && [ -x "$BENCH" ] && ! ldd "$TEST" "$BENCH" | grep -q "not found"; }; then
    echo "building the GPU programs here"
    B=/tmp/epx-gpu-build; mkdir -p $B
    CF="-std=c11 -O2 -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc/core -I/usr/local/cuda/include"
    objs=""
    for f in src/core/*.c src/layout/*.c src/dispatch/pyrandom.c src/dispatch/static_table.c src/dispatch/token.c; do
        o=$B/$(basename "$f" .c).o; gcc $CF -c "$f" -o "$o" || exit 1; objs="$objs $o"
    done
    nvcc -std=c++17 -arch=sm_90 -O3 -Iinclude -Isrc/core -c src/cuda/dispatch.cu -o $B/dispatch_cu.o || exit 1
    gcc $CF -c tests/gpu/test_dispatch_gpu.c -o $B/test.o || exit 1
    nvcc -arch=sm_90 $B/test.o $B/dispatch_cu.o $objs -o $B/test_dispatch_gpu -lm || exit 1
    nvcc -std=c++17 -arch=sm_90 -O3 -Iinclude -Isrc/core bench/dispatch.cu $B/dispatch_cu.o $objs -o $B/bench_dispatch -lm || exit 1
    TEST=$B/test_dispatch_gpu BENCH=$B/bench_dispatch
fi

echo "== GPU test"; (cd tests && "../$TEST") 2>&1 | tee "$OUT/gpu_test.log"
[ "${PIPESTATUS[0]}" = 0 ] || echo "GPU TEST FAILED"
if command -v compute-sanitizer >/dev/null; then
    for tool in memcheck racecheck synccheck; do
        echo "== compute-sanitizer $tool (quick cases)"
        (cd tests && EPX_GPU_TEST_QUICK=1 timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 "../$TEST") \
            >"$OUT/sanitizer.tmp" 2>&1
        echo "$tool exit $?" | tee -a "$OUT/sanitizer.log"; tail -4 "$OUT/sanitizer.tmp" | tee -a "$OUT/sanitizer.log"
        rm -f "$OUT/sanitizer.tmp"
    done
fi
echo "== bench_dispatch"; "$BENCH" --csv "$OUT/bench_dispatch.csv" 2>&1 | tee "$OUT/bench_dispatch.log"
echo "== torch"; timeout 240 python3 bench/dispatch_torch.py --csv "$OUT/torch.csv" 2>&1 | tee "$OUT/torch.log"
