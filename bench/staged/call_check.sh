#!/bin/bash
# One device call (~450 s): normal mode at 1-4,096 tokens, main (.devmain)
# against normal_two_flags.patch with half the grid as meta blocks (.devnf)
# and with five eighths (.devnf2, the form that would land), alternated;
# then the quick check on .devnf2. Carry .devmain/epx .devnf/epx .devnf2
# .devlibs .deepep .devpy.
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64
mkdir -p /tmp/p
BASE=.devmain NEW=.devnf NEW2=.devnf2 OUT=/tmp/p/nm MODE=normal TRANSPORTS=peer \
    TOKENS=1,1024,2048,4096 BUDGET=0 timeout 150 scripts/gpu_ab.sh 2>&1 |
    grep -v "^SKIPPED\|exit 0\|^checks\|^gpu_ab"
tar czf $OUT/p.tgz -C /tmp p
QUICK=1 BIN=.devnf2 timeout 420 scripts/gpu_check.sh 2>&1 | tail -50
