"""Build step of the epx Python package: compile libepx from the repository's C
sources with CMake and ship it inside the package as epx/_lib/libepx.so.

`pip install ./python` (from the repository root) runs this. It needs cmake, a
C compiler and the library's Debian build dependencies (scripts/deps.sh
installs them); nothing is downloaded besides setuptools itself.

Environment knobs:
  EPX_CMAKE_BUILD_DIR  reuse this CMake build folder (incremental re-builds;
                       scripts/python-test.sh points it under build/)
  EPX_PREBUILT_LIB     skip CMake and package this libepx.so as it is (and the
                       libepx_cuda.so beside it, as EPX_PY_CUDA says)
  EPX_BUILD_JOBS       parallel build jobs (default: the number of CPUs)
  EPX_PY_CUDA          auto (default): also build libepx_cuda.so, the CUDA
                       kernels epx.torch runs on CUDA tensors, when CMake finds
                       nvcc; 1: require it; 0: skip it

The GPU library is optional: without nvcc the package installs with CPU
references only and says so (epx.torch.gpu_unavailable_reason()).
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py as _build_py

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LIB_NAME = "libepx.so"
CUDA_LIB_NAME = "libepx_cuda.so"


def _fail(msg):
    sys.stderr.write("epx build: %s\n" % msg)
    raise SystemExit(1)


def _run(cmd):
    sys.stderr.write("epx build: %s\n" % " ".join(str(c) for c in cmd))
    try:
        subprocess.check_call([str(c) for c in cmd])
    except FileNotFoundError:
        _fail("%s is not installed: run scripts/deps.sh (Debian: apt-get install cmake gcc "
              "pkg-config libjansson-dev libzip-dev libcmocka-dev)" % cmd[0])
    except subprocess.CalledProcessError as e:
        _fail("%s failed with exit code %d: the messages above say why (missing -dev "
              "packages are installed by scripts/deps.sh)" % (cmd[0], e.returncode))


def _cuda_wanted():
    v = os.environ.get("EPX_PY_CUDA", "auto").strip().lower()
    if v not in ("auto", "0", "1"):
        _fail("EPX_PY_CUDA=%s: use auto, 1 (require the GPU library) or 0 (skip it)" % v)
    return v


def build_libepx(build_temp):
    """Return the paths of a freshly built (or prebuilt) libepx.so and of
    libepx_cuda.so (None when it was not built)."""
    cuda = _cuda_wanted()
    prebuilt = os.environ.get("EPX_PREBUILT_LIB")
    if prebuilt:
        if not Path(prebuilt).is_file():
            _fail("EPX_PREBUILT_LIB=%s is not a file" % prebuilt)
        gpu = Path(prebuilt).with_name(CUDA_LIB_NAME)
        if cuda == "1" and not gpu.is_file():
            _fail("EPX_PY_CUDA=1 but %s is missing beside EPX_PREBUILT_LIB (build it with "
                  "cmake --build BUILD --target epx_cuda_shared)" % gpu)
        return Path(prebuilt), (gpu if cuda != "0" and gpu.is_file() else None)
    if not (REPO / "CMakeLists.txt").is_file() or not (REPO / "include" / "epx.h").is_file():
        _fail("the C sources are not beside python/ (%s has no CMakeLists.txt and include/epx.h): "
              "install from the epx repository (pip install ./python) or set EPX_PREBUILT_LIB"
              % REPO)
    bdir = Path(os.environ.get("EPX_CMAKE_BUILD_DIR") or (Path(build_temp) / "cmake")).resolve()
    bdir.mkdir(parents=True, exist_ok=True)
    # configured every time: cheap, and a changed EPX_PY_CUDA takes effect
    _run(["cmake", "-S", REPO, "-B", bdir, "-DCMAKE_BUILD_TYPE=Release",
          "-DEPX_WITH_CUDA=%s" % ("OFF" if cuda == "0" else "ON"), "-DEPX_WITH_MPI=OFF",
          "-DEPX_BUILD_TESTS=OFF"])
    jobs = os.environ.get("EPX_BUILD_JOBS") or str(os.cpu_count() or 2)
    if not jobs.isdigit() or int(jobs) < 1:
        _fail("EPX_BUILD_JOBS=%s: give the build's parallel jobs as a whole number from 1, or "
              "leave it unset for one per CPU" % jobs)
    _run(["cmake", "--build", bdir, "--target", "epx", "-j", jobs])
    lib = bdir / LIB_NAME
    if not lib.is_file():
        _fail("cmake finished but %s is missing" % lib)
    gpu = None
    # CMake defines the target only when it found nvcc (CMakeLists.txt)
    if cuda != "0" and (bdir / "CMakeFiles" / "epx_cuda_shared.dir").is_dir():
        _run(["cmake", "--build", bdir, "--target", "epx_cuda_shared", "-j", jobs])
        gpu = bdir / CUDA_LIB_NAME
    elif cuda == "1":
        _fail("EPX_PY_CUDA=1 but CMake found no nvcc: put the CUDA toolkit's bin/ on PATH "
              "(or install it under /usr/local/cuda)")
    else:
        sys.stderr.write("epx build: nvcc not found: epx.torch will serve CPU tensors only\n")
    return lib, gpu


class build_py(_build_py):
    """The usual Python files, plus libepx.so built by CMake into epx/_lib/."""

    def run(self):
        super().run()
        build = self.get_finalized_command("build")
        lib, gpu = build_libepx(build.build_temp)
        dest = Path(self.build_lib) / "epx" / "_lib"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(str(lib), str(dest / LIB_NAME))
        if gpu is not None:
            shutil.copy2(str(gpu), str(dest / CUDA_LIB_NAME))


class BinaryDistribution(Distribution):
    """The wheel carries a native library: tag it for this platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": build_py}, distclass=BinaryDistribution)
