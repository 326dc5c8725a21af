#!/bin/bash
# advise_fit.sh - `epx advise --measured` fits latency + bytes / bandwidth to
# each operation's points, and where it cannot fit a bandwidth it says why
# (the points, not a guess): times that fall as bytes grow, every point the
# same bytes, one point with bytes; a clean pair of points is fitted.
set -u
. "${EPX_SOURCE:?EPX_SOURCE is not set}/tests/util/cli_test.sh"
cli_scratch advise-fit
# summary FILE T1 B1 T2 B2: an `epx bench comm -o` summary of two rows on 2
# ranks whose every operation took T1 us for B1 bytes and T2 us for B2
summary() {
    python3 - "$@" <<'PY'
import json, sys
f, t1, b1, t2, b2 = sys.argv[1], *map(float, sys.argv[2:])
rows = []
for k, t, b in ((1, t1, b1), (8, t2, b2)):
    row = {"tokens": k}
    for op in ("dispatch", "combine", "allreduce"):
        row.update({op + "_us": t, op + "_bytes": b, op + "_in_bytes": 2 * b})
    rows.append(row)
json.dump({"format": "epx-bench-comm-1", "backend": "mpi", "model": "qwen3-30b", "ranks": 2,
           "hidden": 2048, "top_k": 8, "experts": 128, "dtype": "f32", "combine": "topk",
           "rows": rows}, open(f, "w"))
PY
}
# says FILE NEEDLE: advise on FILE exits 0 and its answer holds NEEDLE
says() {
    "$EPX" advise --model qwen3-30b --gpus 2 --link pcie5 --measured "$1" >out 2>err ||
        { echo "  rc $?: $(cat err)"; return 1; }
    grep -qF -- "$2" out || { echo "  answer lacks '$2':"; cat out; return 1; }
}
summary dec.json 1000 8256 20 66048
summary same.json 10 8256 30 8256
summary one.json 10 0 30 8256
summary good.json 10 8256 30 66048
check "falling times: said" says dec.json "no bandwidth to fit: time does not grow with bytes"
check "same bytes: said" says same.json "no bandwidth to fit: every point moves the same bytes"
check "one point with bytes: said" says one.json "no bandwidth to fit: one point sends bytes"
check "two clean points: fitted" says good.json "dispatch: fitted"
check "  and nothing unfitted" bash -c '! grep -q "no bandwidth" out'
exit $fail
