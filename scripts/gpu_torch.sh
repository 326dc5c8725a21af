#!/usr/bin/env bash
# gpu_torch.sh - epx.torch on a GPU machine, in one call: the op tests (CUDA
# kernels against the CPU references, a CUDA graph replay, torch.compile with
# inductor), bench/torch_ops.py (each op against its plain-torch
# formulation, same run) and bench/normal_torch.py (DeepEP's normal mode on
# epx.torch.Buffer beside a copy of the same bytes). Logs and JSON lines go to $OUT (or ./gpu-out).
#   BIN=build      where libepx.so and libepx_cuda.so were built (cmake
#                  --build build --target epx epx_cuda_shared); they need
#                  libjansson and libzip, taken from ./.devlibs when the
#                  machine lacks them, and pytest from ./.devpy likewise.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
BIN=$ROOT/${BIN:-build}
export LD_LIBRARY_PATH=$ROOT/.devlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export EPX_LIBRARY=$BIN/libepx.so EPX_CUDA_LIBRARY=$BIN/libepx_cuda.so
export PYTHONPATH=$ROOT/python:$ROOT/.devpy PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
python3 -c "import torch, epx.torch as et; print('torch', torch.__version__, 'cuda', \
torch.cuda.is_available(), 'epx gpu', et.gpu_available(), et.gpu_unavailable_reason())"

echo "== tests"
(cd /tmp && python3 -m pytest -p no:cacheprovider -q -rs "$ROOT/python/tests/test_torch_ops.py" \
    "$ROOT/python/tests/test_torch.py" "$ROOT/python/tests/test_torch_balanced.py") 2>&1 | tee "$OUT/torch_test.log"
echo "tests exit ${PIPESTATUS[0]}"
echo "== bench"
python3 "$ROOT/bench/torch_ops.py" --json "$OUT/torch_ops.jsonl" 2>&1 | tee "$OUT/torch_bench.log"
echo "== DeepEP's normal mode on epx.torch.Buffer (one rank, beside a copy)"
python3 "$ROOT/bench/normal_torch.py" --json "$OUT/torch_normal.jsonl" 2>&1 | tee "$OUT/normal_bench.log"
