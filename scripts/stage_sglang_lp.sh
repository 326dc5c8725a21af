#!/usr/bin/env bash
# stage_sglang_lp.sh - SGLang 0.5.23's own per-batch LP dispatch path
# (sglang.srt.eplb.lplb_solver.LPLBSolver and the three CUDA kernels it
# JIT-builds through tvm-ffi and NVIDIA MathDx's cuBLASDx) for a GPU machine
# that reaches no package index, in .devsgl/ (git-ignored; the device tool
# carries it when a run names it in `carry`):
#
#   .devsgl/site/            PYTHONPATH for python/bench/bench_sglang_lp.py:
#     sglang/                only the modules the LP path imports, from the
#                            SGLang wheel, plus epx's stubs for the heavy
#                            package modules around them
#                            (python/bench/sglang_lp_stubs, which says why)
#     tvm_ffi/               apache-tvm-ffi 0.1.11 (SGLang's pin): cp312-abi3
#                            (Python >= 3.12) and cp311 cores side by side
#     msgspec/               msgspec (SGLang's JIT build specs), one core per
#                            Python in PYVERS
#     nvidia/mathdx/         nvidia-mathdx 25.6.0 (SGLang's pin): cuBLASDx,
#                            commonDx and the CUTLASS/CuTe headers, not cuFFTDx
#                            and the other libraries the LP kernel never reads
#   .devsgl/shared/traces/   the two traces the benchmark reads (kimi_k2,
#                            deepseek_v3), from ../shared when it is there
#   .devsgl/lib/             epx's libepx.so and libepx_cuda.so from BIN
#                            (default build/), and the libjansson/libzip
#                            they link, which the GPU image lacks
#   .devsgl/STAGED           what was staged, from which files
#
# Nothing of SGLang goes into git: it is unpacked from the wheel here.
# Wheels are downloaded once into build/sgl-dl (DL) and reused from there
# (no network needed then); the SGLang wheel comes from SGLANG_WHEEL, else a
# cached copy under build/ (this checkout's or the main worktree's peer-test
# downloads), else pip download.
#
#   scripts/stage_sglang_lp.sh          (network for pip download, once)
#   PYVERS="3.12 3.13" scripts/stage_sglang_lp.sh
# Then on the GPU machine, carrying .devsgl alone: scripts/gpu_sglang_lp.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DEST=$ROOT/.devsgl
SITE=$DEST/site
PYVERS=${PYVERS:-"3.12 3.11 3.13"}
# shellcheck disable=SC2086 # PYVERS is a list of words
VERS=$(printf '%s\n' 3.12 $PYVERS | sort -u | tr '\n' ' ') # 3.12 always: the H200's
PY=${PYTHON:-python3}
SGL_VER=0.5.23
TVM_FFI=apache-tvm-ffi==0.1.11
MATHDX=nvidia-mathdx==25.6.0
MSGSPEC=msgspec==0.23.0
DL=${DL:-$ROOT/build/sgl-dl}
PLAT=(--only-binary=:all: --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

command -v unzip >/dev/null || { echo "stage_sglang_lp: unzip is needed" >&2; exit 1; }
mkdir -p "$DL"

# ---- the SGLang wheel -------------------------------------------------------
common=$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null || echo "$ROOT/.git")
whl=${SGLANG_WHEEL:-}
if [ -z "$whl" ]; then
    for d in "$ROOT/build/peer-test/downloads" "$(dirname "$common")/build/peer-test/downloads" \
        "$DL"; do
        for f in "$d"/sglang-"$SGL_VER"-*.whl; do
            [ -f "$f" ] && { whl=$f; break 2; }
        done
    done
fi
if [ -z "$whl" ]; then
    echo "stage_sglang_lp: no cached sglang-$SGL_VER wheel; pip download (39 MB)"
    "$PY" -m pip download -q --disable-pip-version-check --no-deps --python-version 3.12 \
        "${PLAT[@]}" --platform manylinux_2_34_x86_64 -d "$DL" "sglang==$SGL_VER"
    for f in "$DL"/sglang-"$SGL_VER"-*.whl; do whl=$f; done
fi
echo "stage_sglang_lp: SGLang wheel $whl"

# ---- tvm-ffi, MathDx, msgspec ------------------------------------------------
fetch() { # fetch PYVER NAME==VERSION...: wheels for one Python into $DL/py$PYVER
    local v=$1 spec name need=()
    shift
    for spec in "$@"; do # a wheel already there is not asked for again
        name=${spec%%==*}
        ls "$DL/py$v/${name//-/_}-${spec#*==}-"*.whl >/dev/null 2>&1 || need+=("$spec")
    done
    [ ${#need[@]} -eq 0 ] && return 0
    mkdir -p "$DL/py$v"
    "$PY" -m pip download -q --disable-pip-version-check --no-deps --python-version "$v" \
        "${PLAT[@]}" -d "$DL/py$v" "${need[@]}"
}
fetch 3.12 "$TVM_FFI" "$MATHDX" "$MSGSPEC"
for v in $VERS; do # tvm-ffi's abi3 core serves 3.12 and later; older get their own
    [ "${v#3.}" -lt 12 ] && fetch "$v" "$TVM_FFI" "$MSGSPEC"
    [ "${v#3.}" -gt 12 ] && fetch "$v" "$MSGSPEC"
done

rm -rf "$DEST"
mkdir -p "$SITE"

# ---- SGLang: the LP path's modules, their kernel sources and headers ----------
# lplb_solver -> kernels.ops.lplb.{torch_solver,cuda_solver} -> kernels.jit.utils
# (load_jit, the arch probe, the mathdx dependency) -> kernels.jit.{include,
# csrc/lplb}; ops.lplb's __init__ registers through kernels.{registry,spec};
# the JIT code reads its switches from srt.environ. test/kernels/lplb.py is
# SGLang's torch reference of the same solve (the benchmark's cross-check).
unzip -q "$whl" -d "$SITE" \
    'sglang/srt/eplb/__init__.py' 'sglang/srt/eplb/lplb_solver.py' 'sglang/srt/environ.py' \
    'sglang/kernels/registry.py' 'sglang/kernels/spec.py' 'sglang/kernels/ops/lplb/*' \
    'sglang/kernels/jit/__init__.py' 'sglang/kernels/jit/utils/*' \
    'sglang/kernels/jit/include/*' 'sglang/kernels/jit/csrc/lplb/*' \
    'sglang/test/__init__.py' 'sglang/test/kernels/__init__.py' 'sglang/test/kernels/lplb.py' \
    'sglang/version.py' 'sglang/_version.py' "sglang-$SGL_VER.dist-info/*"
# helpers of other backends (ROCm, Helion) that import the rest of SGLang
rm -f "$SITE/sglang/kernels/jit/utils/hipcc.py" "$SITE/sglang/kernels/jit/utils/helion_runtime.py"
# the dist-info's RECORD lists the whole wheel; only METADATA (the version) is kept
find "$SITE/sglang-$SGL_VER.dist-info" -type f ! -name METADATA ! -name WHEEL -delete
cp -r "$ROOT/python/bench/sglang_lp_stubs/sglang" "$SITE/"

# ---- tvm-ffi -------------------------------------------------------------------
# Headers (tvm/ffi, dlpack) and libtvm_ffi.so are what JIT modules build and
# link against (the core also links libtvm_ffi_testing.so); the bundled
# libbacktrace sources are not needed.
for v in $VERS; do
    for w in "$DL/py$v"/apache_tvm_ffi-*.whl; do
        [ -f "$w" ] && unzip -q -o "$w" -d "$SITE" -x 'tvm_ffi/3rdparty/libbacktrace/*'
    done
done
# ---- msgspec: one core per Python (the .so names differ by version) ------------
for v in $VERS; do
    for w in "$DL/py$v"/msgspec-*.whl; do
        [ -f "$w" ] && unzip -q -o "$w" -d "$SITE"
    done
done
# ---- MathDx: cuBLASDx and what it includes --------------------------------------
unzip -q "$DL"/py3.12/nvidia_mathdx-*.whl -d "$SITE" \
    'nvidia/mathdx/include/cublasdx.hpp' 'nvidia/mathdx/include/cublasdx/*' \
    'nvidia/mathdx/include/commondx/*' 'nvidia/mathdx/external/cutlass/*' \
    'nvidia_mathdx-*.dist-info/METADATA' 'nvidia_mathdx-*.dist-info/WHEEL' \
    'nvidia_mathdx-*.dist-info/licenses/*'
# CUTLASS's device-wide GEMM, convolution and epilogue collectives are not
# reached by cuBLASDx's block-level GEMM (its includes stop at cute/ and the
# core cutlass/ headers; a compile's depfile lists them)
for d in gemm conv epilogue transform reduction experimental; do
    rm -rf "$SITE/nvidia/mathdx/external/cutlass/include/cutlass/$d"
done
find "$SITE" -name __pycache__ -prune -exec rm -rf {} +

# ---- traces -------------------------------------------------------------------------
SHARED=${EPX_SHARED:-$ROOT/../shared}
if [ -f "$SHARED/traces/kimi_k2.json" ] && [ -f "$SHARED/traces/deepseek_v3.json" ]; then
    mkdir -p "$DEST/shared/traces"
    cp "$SHARED/traces/kimi_k2.json" "$SHARED/traces/deepseek_v3.json" "$DEST/shared/traces/"
else
    echo "stage_sglang_lp: no traces in $SHARED: the benchmark will use synthetic batches"
fi

# ---- epx's libraries --------------------------------------------------------------
BIN=${BIN:-build}
mkdir -p "$DEST/lib"
if [ -f "$BIN/libepx.so" ] && [ -f "$BIN/libepx_cuda.so" ]; then
    cp -L "$BIN/libepx.so" "$BIN/libepx_cuda.so" "$DEST/lib/"
    for l in libjansson.so.4 libzip.so.4; do
        p=$(ldconfig -p | awk -v l="$l" '$1 == l {print $NF; exit}')
        [ -n "$p" ] && cp -L "$p" "$DEST/lib/"
    done
else
    echo "stage_sglang_lp: no libepx.so and libepx_cuda.so in $BIN (make build, or set BIN):" \
        "the GPU run will look for them in build/ there" >&2
fi

{
    echo "staged $(date -u +%Y-%m-%dT%H:%MZ) by scripts/stage_sglang_lp.sh"
    echo "sglang $SGL_VER from $(basename "$whl")"
    for v in $VERS; do ls "$DL/py$v"/*.whl 2>/dev/null || true; done | sort -u |
        sed "s|^$DL/||"
    echo "python cores: $VERS"
    for f in "$DEST"/lib/*; do [ -f "$f" ] && echo "epx from $BIN: ${f##*/}"; done
} >"$DEST/STAGED"
grep -qx '/.devsgl/' .gitignore || echo '/.devsgl/' >>.gitignore
for d in "$SITE"/*/ "$DEST"/lib "$DEST"/shared "$DEST"; do
    [ -e "$d" ] && du -sh "$d"
done | sed 's|'"$ROOT"'/||'
