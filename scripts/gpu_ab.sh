#!/usr/bin/env bash
# gpu_ab.sh - one device call that judges a change to the EP engine: the
# new build's low-latency round trips beside a base build's, alternated, two
# rounds, over the transports asked for, then the engine's checks on the new
# build for as long as the call's time allows (most important first). This
# session's form of it took 255 s (bench/RESULTS.md, the prologues).
#   BASE=DIR NEW=DIR   each holds epx, test_gpu_ll, libepx.so, libepx_cuda.so
#                      (DIR/epx alone for BASE)
#   NEW2=DIR           optional: a third build timed beside them (a second change
#                      on top of NEW's), so one call judges both
#   NEW3=DIR           optional, with NEW2: a fourth (a third change on top of NEW2's)
#   CHECK=new|new2|new3  the build the checks run on (default: the last one given)
#   TRANSPORTS="peer host nccl"  TOKENS=1,8,32,128  ITERS=40
#   MODE=low-latency   or normal (the GPU engine's normal mode runs over peer only:
#                      TRANSPORTS=peer, and TOKENS=1,1024,2048,4096 say more)
#   BENCH_ARGS="--fp8"  more `epx bench comm` options for every timing run
#   BUDGET=400         seconds after which the remaining checks are skipped
#   OUT                where the JSON lines and logs go (the device tool's $OUT)
#   PACK=1             at the end, everything written to OUT packed into OUT/ab.tgz
#                      (the device tool returns 8 files; scripts/ab_rows.py reads the tgz)
# Staging, on the development VM: the base build's files into one ignored
# folder, the new build's into another (BIN=build scripts/stage_gpu.sh gives
# .devbin), and carry both with .devlibs (and .devpy, .deepep for the torch
# and DeepEP checks).
set -u
: "${BASE:?BASE=DIR: the build timed as the base}" "${NEW:?NEW=DIR: the build judged}"
OUT=${OUT:-/tmp/gpu_ab}
[ -z "${NEW3:-}" ] || [ -n "${NEW2:-}" ] ||
    { echo "gpu_ab.sh: NEW3 is the change on top of NEW2's: give NEW2=DIR too" >&2 && exit 2; }
WHO="base new${NEW2:+ new2}${NEW3:+ new3}"
CHECK=${CHECK:-${WHO##* }}
case $CHECK in
new) CHK=$NEW ;;
new2) CHK=${NEW2:?CHECK=new2 needs NEW2=DIR} ;;
new3) CHK=${NEW3:?CHECK=new3 needs NEW3=DIR} ;;
*) echo "gpu_ab.sh: CHECK=$CHECK: give new, new2 or new3" >&2 && exit 2 ;;
esac
TRANSPORTS=${TRANSPORTS:-peer host nccl}
MODE=${MODE:-low-latency}
TOKENS=${TOKENS:-1,8,32,128}
ITERS=${ITERS:-40}
BUDGET=${BUDGET:-400}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH=$ROOT/.devlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
start=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - start))); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader

written=() # the files this script puts in OUT (PACK=1 packs them)
for round in 1 2; do
    for tr in $TRANSPORTS; do
        for who in $WHO; do
            case $who in
            base) bin=$BASE/epx ;;
            new) bin=$NEW/epx ;;
            new2) bin=$NEW2/epx ;;
            new3) bin=$NEW3/epx ;;
            esac
            bound=""
            [ "$tr" = nccl ] && bound="--token-bound tokens"
            timeout 120 "$bin" bench comm --backend nccl --mode "$MODE" --graph \
                --model kimi-k2.5 --transport "$tr" $bound ${BENCH_ARGS:-} --tokens "$TOKENS" \
                --iters "$ITERS" --warmup 10 --json "$OUT/ab_${tr}_$who.jsonl" \
                >"$OUT/ab_${tr}_${who}_$round.log" 2>&1
            echo "round $round, $tr, $who: exit $?"
            written+=("ab_${tr}_$who.jsonl" "ab_${tr}_${who}_$round.log")
        done
    done
done
python3 - "$OUT" "$WHO" $TRANSPORTS <<'PY'
import json, sys, collections
out, builds, transports = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
cell = collections.defaultdict(list)
for tr in transports:
    for who in builds:
        try:
            lines = open(f"{out}/ab_{tr}_{who}.jsonl")
        except OSError:
            continue
        for line in lines:
            r = json.loads(line)
            if r.get("graph") and r["mode"] != "floor":
                cell[(tr, r["tokens"], r["phase"], who)].append(r["median_us"])
print("graph-replayed us, " + " -> ".join(builds) + " (one figure per round)")
for tr, t, ph in sorted({k[:3] for k in cell}):
    side = [" / ".join("%.2f" % v for v in cell[(tr, t, ph, who)]) for who in builds]
    print(f"{tr:5} {t:5} {ph:10} " + " -> ".join(side))
PY
echo "checks on $CHECK ($CHK)"

fail=0 skipped=0
check() { # name, minimum seconds left, command...
    local name=$1 need=$2
    shift 2
    if [ "$(left)" -lt "$need" ]; then
        echo "SKIPPED $name: $(left) s left of BUDGET"
        skipped=$((skipped + 1))
        return
    fi
    written+=("$name.log")
    if timeout "$(left)" "$@" >"$OUT/$name.log" 2>&1; then
        echo "PASS $name"
    else
        echo "FAIL $name (exit $?)"
        tail -20 "$OUT/$name.log"
        fail=1
    fi
}
for tr in peer host nccl; do
    check "test_gpu_ll_$tr" 40 env EPX_GPU_EP_TRANSPORT=$tr "$CHK/test_gpu_ll"
done
for tr in peer host; do
    check "memcheck_$tr" 80 env EPX_GPU_EP_TRANSPORT=$tr compute-sanitizer --tool memcheck \
        --error-exitcode 9 --target-processes all "$CHK/test_gpu_ll"
done
check torch_gpu 80 env EPX_LIBRARY="$CHK/libepx.so" EPX_CUDA_LIBRARY="$CHK/libepx_cuda.so" \
    PYTHONPATH="$ROOT/python:$ROOT/.devpy" bash -c "cd /tmp && python3 -m pytest -p no:cacheprovider \
    -q '$ROOT/python/tests/test_torch_buffer_gpu.py' '$ROOT/python/tests/test_torch_normal_gpu.py'"
if [ -d "$ROOT/.deepep" ]; then
    check deepep_ll 60 env EPX_LIBRARY="$CHK/libepx.so" EPX_CUDA_LIBRARY="$CHK/libepx_cuda.so" \
        PYTHONPATH="$ROOT/python" python3 "$ROOT/tools/deepep_ll_check.py" \
        --deepep "$ROOT/.deepep" --num-processes 2 --timeout 300
fi
echo "gpu_ab: $(($(date +%s) - start)) s; checks $([ $fail = 0 ] && echo passed || echo FAILED)," \
    "$skipped skipped"
if [ "${PACK:-0}" = 1 ]; then # the files this script wrote, as one
    files=$(printf '%s\n' "${written[@]}" | sort -u)
    (cd "$OUT" && tar czf ab.tgz $files && rm -f $files) || echo "gpu_ab: could not pack $OUT" >&2
fi
exit $fail
