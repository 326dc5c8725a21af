#!/usr/bin/env bash
# stage_gpu.sh - what a GPU machine needs from this build, in two folders
# that .git/info/exclude keeps out of git and the device tool carries:
#   .devbin   the GPU tests, the CLI and both libraries (from BIN, default build)
#   .devlibs  shared libraries the GPU image lacks (jansson, libzip)
# Then on the GPU machine: BIN=.devbin scripts/gpu_check.sh (or gpu_ll.sh).
set -eu
cd "$(dirname "$0")/.."
BIN=${BIN:-build}
grep -qx '/.devbin/' .git/info/exclude 2>/dev/null || echo '/.devbin/' >>.git/info/exclude
grep -qx '/.devlibs/' .git/info/exclude 2>/dev/null || echo '/.devlibs/' >>.git/info/exclude
rm -rf .devbin && mkdir -p .devbin .devlibs
for f in epx libepx.so libepx_cuda.so test_gpu_ll test_dispatch_gpu test_balanced_gpu test_nccl_ep \
    bench/bench_balanced; do
    [ -e "$BIN/$f" ] && cp -L "$BIN/$f" .devbin/
done
for l in libjansson.so.4 libzip.so.4; do
    p=$(ldconfig -p | awk -v l="$l" '$1 == l {print $NF; exit}')
    [ -n "$p" ] && cp -L "$p" .devlibs/
done
du -sh .devbin .devlibs
