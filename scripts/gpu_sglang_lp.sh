#!/usr/bin/env bash
# gpu_sglang_lp.sh - on a GPU machine, SGLang 0.5.23's own LP dispatch path
# beside epx's balanced routing (python/bench/bench_sglang_lp.py), from what
# scripts/stage_sglang_lp.sh put in .devsgl/ (SGLang's LP modules, tvm-ffi,
# MathDx, msgspec, the two traces, epx's libraries): no network needed.
# The device tool carries .devsgl when a run names it in `carry`.
#   OUT=gpu-out  where the log and the JSON lines go ($OUT/sglang_lp.log,
#                $OUT/sglang_lp.jsonl); extra arguments go to the benchmark
#                (e.g. --layers 4, --tokens 128,4096, --compile-only).
# SGLang's JIT modules are built into build/sgl-jit (kept while the machine is).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
DEV=$ROOT/.devsgl
if [ ! -d "$DEV/site/sglang" ]; then
    echo "gpu_sglang_lp: $DEV/site is missing: run scripts/stage_sglang_lp.sh where there is" \
        "network, and name .devsgl in the run's carry" >&2
    exit 2
fi
LIB=$DEV/lib
[ -f "$LIB/libepx_cuda.so" ] || LIB=$ROOT/build
export LD_LIBRARY_PATH=$DEV/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export EPX_LIBRARY=$LIB/libepx.so EPX_CUDA_LIBRARY=$LIB/libepx_cuda.so
export PYTHONPATH=$DEV/site:$ROOT/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
command -v nvidia-smi >/dev/null &&
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
head -n 2 "$DEV/STAGED"
set -o pipefail
python3 "$ROOT/python/bench/bench_sglang_lp.py" --json "$OUT/sglang_lp.jsonl" "$@" 2>&1 |
    tee "$OUT/sglang_lp.log"
