#!/bin/bash
# Where the balanced kernel's time goes past one token (issue 27): the
# profile build's balprof lines (cmake -DEPX_BAL_PROFILE=ON; see
# src/cuda/balanced.cu) for Kimi-K2.5 and ds-v3-node at 1, 16, 128 and 4,096
# tokens, and DeepSeek-V3 at 128, then the median of each field per size
# (~60 s). Build on the development VM first:
#   cmake -S . -B build-balprof -DCMAKE_BUILD_TYPE=Release -DEPX_BUILD_TESTS=ON \
#     -DEPX_WITH_CUDA=ON -DEPX_WITH_MPI=OFF -DEPX_BAL_PROFILE=ON
#   cmake --build build-balprof --target bench_balanced -j 2
# and carry build-balprof/bench/bench_balanced (or set B to another such
# binary, e.g. a staged change's). Its figures are the profile
# build's (stamps and atomics on the path), not the kernel's timing.
set -u
cd "$(dirname "$0")/../.."
B=${B:-build-balprof/bench/bench_balanced}
mkdir -p /tmp/bp
run() { # shape tokens
    timeout 120 "$B" --shape "$1" --tokens "$2" > "/tmp/bp/$1_$2.log" 2>&1
    echo "$1 $2: exit $?"
}
for T in 1 16 128 4096; do
    run kimi-k2.5 $T
    run ds-v3-node $T
done
run deepseek-v3 128
tar czf "$OUT/bp.tgz" -C /tmp bp
python3 - <<'PY'
import glob, os, statistics
names = ["count", "group", "comps", "solve", "summary", "outputs", "pairs",
         "sums", "best", "split", "round"]
print(f"{'run':18} {'M':>4} {'C':>3} " + " ".join(f"{n:>8}" for n in names) + "   (median ns)")
for f in sorted(glob.glob("/tmp/bp/*.log")):
    rows = []
    for line in open(f):
        p = line.split()
        if p and p[0] == "balprof" and p[1] == "1" and len(p) >= 15:
            rows.append([int(x) for x in p[2:15]])
    if not rows:
        print(os.path.basename(f)[:-4], "no balprof lines")
        continue
    med = [statistics.median(r[i] for r in rows) for i in range(13)]
    print(f"{os.path.basename(f)[:-4]:18} {med[0]:4.0f} {med[1]:3.0f} " +
          " ".join(f"{v:8.0f}" for v in med[2:]))
PY
