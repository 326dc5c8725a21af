#!/bin/bash
# One device call: the quick check on the build that would land (.devtwo,
# or .devsmall if only that one wins: BIN=.devsmall). Carry that folder,
# .devlibs .deepep .devpy.
cd "$(dirname "$0")/../.."
QUICK=1 BIN=${BIN:-.devtwo} timeout 570 scripts/gpu_check.sh 2>&1 | tail -60
