#!/bin/sh
# The Python binding's tests, as `make python-test` (part of `make test`) runs
# them: a venv under build/, numpy + pytest (and scipy, optional) from the
# package index, the epx package installed from ./python (which builds libepx
# with CMake), then pytest python/tests. Quick on re-runs: the venv, the
# packages and the CMake build folder are kept, and the package is re-installed
# only when a source file changed since the last install.
#
#   EPX_PY_BUILD  folder for the venv and the CMake build (default build/python)
#   PYTHON        the interpreter to make the venv with (default python3)
#   EPX_PY_TORCH  the torch release installed for epx.torch's tests (default
#                 2.11.0, the H200 machine's; from PyPI, ~3 GB with its CUDA
#                 wheels, once per venv); 0 = none (those tests skip)
#   EPX_PY_SETUP_ONLY  1 = make the venv and install epx, run no tests (what
#                 `make peer-test` needs)
#   extra arguments go to pytest, e.g. scripts/python-test.sh -k golden; -rs
#   prints every skip with its reason
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PYBUILD=${EPX_PY_BUILD:-build/python}
case $PYBUILD in /*) ;; *) PYBUILD=$ROOT/$PYBUILD ;; esac
VENV=$PYBUILD/venv
PY=${PYTHON:-python3}
mkdir -p "$PYBUILD"

command -v "$PY" >/dev/null 2>&1 || ./scripts/deps.sh
if [ ! -x "$VENV/bin/python" ]; then
    # Debian's python3 has no venv/ensurepip without python3-venv (in deps.sh).
    if ! "$PY" -m venv "$VENV" >"$PYBUILD/venv.log" 2>&1; then
        rm -rf "$VENV"
        echo "epx: python3 -m venv failed; installing python3-venv" >&2
        ./scripts/deps.sh
        "$PY" -m venv "$VENV"
    fi
fi
VPY=$VENV/bin/python

if ! "$VPY" -c "import numpy, pytest, setuptools, wheel" >/dev/null 2>&1; then
    "$VPY" -m pip install -q --disable-pip-version-check numpy pytest setuptools wheel
fi

# scipy's linprog checks balanced dispatch against the LP; its tests skip without it.
if ! "$VPY" -c "import scipy.optimize" >/dev/null 2>&1; then
    "$VPY" -m pip install -q --disable-pip-version-check scipy ||
        echo "epx: scipy could not be installed; the linprog tests will skip" >&2
fi

TORCH=${EPX_PY_TORCH:-2.11.0}
if [ "$TORCH" != 0 ] && ! "$VPY" -c "import torch" >/dev/null 2>&1; then
    echo "epx: installing torch==$TORCH into $VENV for epx.torch's tests (EPX_PY_TORCH=0 skips)"
    "$VPY" -m pip install -q --disable-pip-version-check "torch==$TORCH"
fi

# Re-install when any input of the package is newer than the last install.
STAMP=$PYBUILD/installed.stamp
if [ ! -f "$STAMP" ] || ! "$VPY" -c "import epx" >/dev/null 2>&1 ||
   [ -n "$(find python/epx python/setup.py python/pyproject.toml src include CMakeLists.txt \
           -newer "$STAMP" -type f -print 2>/dev/null | head -n 1)" ]; then
    # No build isolation: setuptools is in the venv already, nothing to fetch.
    EPX_CMAKE_BUILD_DIR=$PYBUILD/cmake "$VPY" -m pip install -q --disable-pip-version-check \
        --no-build-isolation --no-deps --force-reinstall ./python
    touch "$STAMP"
fi

[ "${EPX_PY_SETUP_ONLY:-0}" = 1 ] && exit 0

# Run from a neutral folder so `import epx` is the installed package, not python/epx.
cd "$PYBUILD"
exec "$VPY" -m pytest -p no:cacheprovider -q -rs "$ROOT/python/tests" "$@"
