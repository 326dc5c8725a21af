#!/usr/bin/env bash
# gpu_multi.sh - the several-GPU run in one call, for the day `status` lends a
# machine of 2-8 GPUs: how its GPUs are linked, the EP engine checked and
# timed with a rank per GPU over each transport (one process driving every
# GPU, and a process per GPU under mpirun, where the host transport is what a
# PCIe box without peer access runs), TP's all-reduce beside it, DeepEP's own
# tests with a process per GPU, and `epx advise` answering from these figures
# instead of a one-GPU floor. Every `epx bench comm` checks its results
# against the reference before it times anything.
#   BIN=.devbin   epx and both libraries (scripts/stage_gpu.sh)
#   OUT           the logs and ep_multi.jsonl (default ./gpu-out)
#   MODEL=kimi-k2.5  TOKENS=1,8,32,128  NTOKENS=1,1024,4096  ITERS=50
#   LINK=nvlink4  the link `epx advise` assumes where nothing was measured
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and the like): the lending
# machines' rule (device/KINDS.md), kept in every process started here.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/${BIN:-.devbin}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$ROOT/.devlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
MODEL=${MODEL:-kimi-k2.5}
TOKENS=${TOKENS:-1,8,32,128}
NTOKENS=${NTOKENS:-1,1024,4096}
ITERS=${ITERS:-50}
J=$OUT/ep_multi.jsonl
G=$(nvidia-smi -L | grep -c '^GPU')
if [ "$G" -lt 2 ]; then
    echo "gpu_multi.sh: this machine shows $G GPU(s); the several-GPU run needs 2 or more"
    exit 2
fi
fail=0
run() { # name, log, command...
    local name=$1 log=$OUT/$2
    shift 2
    echo "== $name"
    "$@" >"$log" 2>&1
    local rc=$?
    grep -E "graph|launch|answer|PASS|FAIL|passed|error" "$log" | grep -v "floor" | tail -30
    [ $rc = 0 ] || { tail -20 "$log"; echo "FAILED (exit $rc)"; fail=1; }
}
nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv,noheader | tee "$OUT/gpus.txt"
nvidia-smi topo -m >"$OUT/topo.txt" 2>&1 && cat "$OUT/topo.txt"
B=("$BIN/epx" bench comm --backend nccl --model "$MODEL" --iters "$ITERS" --warmup 10 --json "$J")
# One process, a thread per GPU: every transport, fp8, and normal mode, at
# all G GPUs and at 2 (what one more hop costs).
for g in $(printf '%s\n' "$G" 2 | sort -un); do
    for tr in peer host nccl; do
        run "low latency, $g GPUs, transport $tr" "ll_${g}_$tr.log" \
            timeout 300 "${B[@]}" --gpus "$g" --mode low-latency --graph --transport "$tr" \
            --tokens "$TOKENS"
    done
    run "low latency fp8, $g GPUs" "ll_${g}_fp8.log" \
        timeout 300 "${B[@]}" --gpus "$g" --mode low-latency --graph --fp8 --tokens "$TOKENS"
    run "normal mode, $g GPUs" "normal_$g.log" \
        timeout 300 "${B[@]}" --gpus "$g" --mode normal --graph --tokens "$NTOKENS"
done
# A process per GPU under mpirun: the engine bootstraps as a serving system's
# ranks do, and the host transport crosses each GPU's own PCIe link.
if command -v mpirun >/dev/null; then
    M=(mpirun --allow-run-as-root --oversubscribe -np "$G" -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE
        -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS)
    for tr in peer host; do
        run "low latency, $G processes, transport $tr" "mpi_ll_$tr.log" \
            timeout 300 "${M[@]}" "${B[@]}" --mode low-latency --graph --transport "$tr" \
            --tokens "$TOKENS"
    done
fi
# DeepEP's own tests, unchanged, with a process per GPU on epx.torch.Buffer
# (staged by tools/stage_deepep.sh into .deepep).
if [ -d "$ROOT/.deepep" ] && python3 -c "import torch" 2>/dev/null; then
    for t in low_latency intranode; do
        run "DeepEP's test_$t.py, $G processes on $G GPUs" "deepep_$t.log" \
            env EPX_LIBRARY="$BIN/libepx.so" EPX_CUDA_LIBRARY="$BIN/libepx_cuda.so" \
            PYTHONPATH="$ROOT/python" timeout 400 python3 "$ROOT/tools/deepep_ll_check.py" \
            --deepep "$ROOT/.deepep" --test "$t" --own-gpus --num-processes "$G" --timeout 380
    done
fi
# The answer from these figures: the links measured, not assumed.
for tr in peer host nccl; do
    run "epx advise, $G GPUs, transport $tr" "advise_$tr.log" \
        "$BIN/epx" advise --model "$MODEL" --gpus "$G" --link "${LINK:-nvlink4}" --transport "$tr" \
        --measured "$J"
done
echo "gpu_multi: $([ $fail = 0 ] && echo "all ran" || echo "some FAILED"); figures in $J"
exit $fail
