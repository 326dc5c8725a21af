#!/bin/bash
# Issue 26's NCCL transport at one rank (2.15x the device-memory round trip on
# an H100, fourteenth session): does NCCL's own kernel get cheaper with fewer
# channels or threads, or another protocol? main's epx (BIN, default .devK),
# the NCCL transport and the pointers beside it, each NCCL setting alternated
# with the default, two rounds (~90 s). NCCL_P2P_LL_THRESHOLD was tried in the
# sixth session (no change). Carry BIN's epx and .devlibs.
set -u
cd "$(dirname "$0")/../.."
BIN=${BIN:-.devK}
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64
mkdir -p /tmp/n
run() { # name env...
    local name=$1
    shift
    env "$@" timeout 60 "$BIN/epx" bench comm --backend nccl --mode low-latency --graph \
        --model kimi-k2.5 --transport nccl --token-bound tokens --tokens 1,8,32 --iters 30 \
        --warmup 10 --json "/tmp/n/$name.jsonl" > "/tmp/n/$name.log" 2>&1
    echo "$name: exit $?"
}
for round in 1 2; do
    env timeout 60 "$BIN/epx" bench comm --backend nccl --mode low-latency --graph \
        --model kimi-k2.5 --transport peer --tokens 1,8,32 --iters 30 --warmup 10 \
        --json /tmp/n/pointers.jsonl > /tmp/n/pointers.log 2>&1
    run default
    run max_channels_1 NCCL_MAX_NCHANNELS=1
    run min_max_channels_2 NCCL_MIN_NCHANNELS=2 NCCL_MAX_NCHANNELS=2
    run threads_64 NCCL_NTHREADS=64
    run proto_simple NCCL_PROTO=Simple
    run proto_ll NCCL_PROTO=LL
    run channels_per_peer_1 NCCL_NCHANNELS_PER_NET_PEER=1
done
tar czf "$OUT/n.tgz" -C /tmp n
python3 - <<'PY'
import glob, json, os, collections
cell = collections.defaultdict(list)
for f in sorted(glob.glob("/tmp/n/*.jsonl")):
    name = os.path.basename(f)[:-6]
    for line in open(f):
        r = json.loads(line)
        if r.get("graph") and r["mode"] != "floor" and r["phase"] == "round-trip":
            cell[(name, r["tokens"])].append(r["median_us"])
for name in sorted({k[0] for k in cell}):
    print(f"{name:22}", "  ".join(f"{t}: " + " / ".join("%.2f" % v for v in cell[(name, t)])
                                   for t in (1, 8, 32) if (name, t) in cell))
PY
