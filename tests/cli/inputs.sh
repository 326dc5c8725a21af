#!/bin/bash
# inputs.sh - every input goes through one bounded, safe reader (issue 29):
# a FIFO, device or socket given as --model, --counts, --placement,
# --measured or a convert input is refused with exit 2 before it is opened
# (no hang, no run-away read of /dev/zero), a symlink to one likewise; a file
# above its byte limit (config.json: 1 MiB; JSON inputs: 1 GiB) is refused
# from its size, naming the path and the limit; a config.json nested or
# padded beyond its limits is refused before it is parsed.
set -u
. "${EPX_SOURCE:?EPX_SOURCE is not set}/tests/util/cli_test.sh"
cli_scratch inputs
# fast NEEDLE CMD...: exit 2 within 5 s, the message names NEEDLE.
fast() {
    local needle=$1
    shift
    timeout 5 "$@" >out 2>err
    local rc=$?
    [ "$rc" = 2 ] || { echo "  rc $rc, wanted 2: $*"; head -c 600 err; return 1; }
    grep -qF -- "$needle" err || { echo "  message lacks '$needle':"; cat err; return 1; }
}

"$EPX" trace synth --model deepseek-v3 --windows 2 --tokens 2000 -o c.json >/dev/null || exit 1
"$EPX" plan --counts c.json --gpus 8 -o p.json >/dev/null || exit 1
mkfifo f.json fifo.pt fifo
ln -s /dev/urandom rand.json
ln -s f.json link-to-fifo.json
mkdir m && mkfifo m/config.json

# --model PATH on every command that takes one
for cmd in "trace synth -o t.json" "advise --gpus 8 --link pcie5" "demo --out d" \
    "bench comm --backend mpi --tokens 1"; do
    read -ra a <<<"$cmd"
    check "$cmd --model /dev/zero" fast "'/dev/zero' is a character device" "$EPX" "${a[@]}" \
        --model /dev/zero
    check "$cmd --model FIFO f.json" fast "'f.json' is a FIFO" "$EPX" "${a[@]}" --model f.json
    check "$cmd --model symlink to /dev/urandom" fast "'rand.json' is a character device" \
        "$EPX" "${a[@]}" --model rand.json
    check "$cmd --model symlink to a FIFO" fast "is a FIFO" "$EPX" "${a[@]}" \
        --model link-to-fifo.json
done
check "--model folder with a FIFO config.json" fast "config.json" "$EPX" trace synth \
    --model m -o t.json
check "nothing was written" test ! -e t.json -a ! -e d

# size: refused from the size, before a byte is read (sparse files)
truncate -s 2M big-config.json
check "config.json of 2 MiB" fast "1048576 bytes, the limit for a config.json" \
    "$EPX" trace synth --model big-config.json -o t.json
check "  names the path" grep -qF "'big-config.json'" err
truncate -s 2G big-counts.json
check "--counts of 2 GiB" fast "1073741824 bytes, the limit for a JSON input" \
    "$EPX" plan --counts big-counts.json --gpus 8 -o q.json
check "  names the path" grep -qF "'big-counts.json'" err
check "--measured of 2 GiB" fast "the limit for --measured" \
    "$EPX" advise --model deepseek-v3 --gpus 8 --link pcie5 --measured big-counts.json

# JSON bounds of a config.json under 1 MiB
python3 - <<'PY'
import json
base = json.load(open("/dev/stdin")) if False else None
deep = '{"model_type": "deepseek_v3", "x": ' + "[" * 100 + "]" * 100 + "}"
open("deep.json", "w").write(deep)
wide = '{"model_type": "deepseek_v3", "x": [' + ",".join(["1"] * 300000) + "]}"
open("wide.json", "w").write(wide)
PY
check "config.json nested 100 deep" fast "deeper than 64 levels" \
    "$EPX" trace synth --model deep.json -o t.json
check "config.json of 300000 values" fast "more than 262144 JSON values" \
    "$EPX" trace synth --model wide.json -o t.json

# the other readers
check "plan --counts FIFO" fast "'f.json' is a FIFO" "$EPX" plan --counts f.json --gpus 8 -o q.json
check "plan --counts /dev/zero" fast "character device" \
    "$EPX" plan --counts /dev/zero --gpus 8 -o q.json
check "plan --counts FIFO without .json" fast "is a FIFO" \
    "$EPX" plan --counts fifo --gpus 8 -o q.json
check "plan --current FIFO" fast "is a FIFO" "$EPX" plan --counts c.json --gpus 8 \
    --current f.json --max-moves 10 -o q.json
check "eval --placement FIFO" fast "is a FIFO" "$EPX" eval --placement f.json --counts c.json \
    --gpus 8
check "eval --counts symlink to /dev/urandom" fast "character device" \
    "$EPX" eval --placement p.json --counts rand.json --gpus 8
check "inspect FIFO" fast "is a FIFO" "$EPX" inspect f.json --gpus 8
check "stats FIFO .pt" fast "is a FIFO" "$EPX" stats fifo.pt
check "convert FIFO .pt" fast "is a FIFO" "$EPX" convert fifo.pt q.json
check "convert /dev/zero" fast "character device" "$EPX" convert /dev/zero q.json
check "dispatch-table --placement FIFO" fast "is a FIFO" \
    "$EPX" dispatch-table --placement f.json --gpus 8 -o q.json
check "migrate plan --from FIFO" fast "is a FIFO" \
    "$EPX" migrate plan --from f.json --to p.json --gpus 8 --expert-bytes 1000
check "advise --measured FIFO" fast "'f.json' is a FIFO" \
    "$EPX" advise --model deepseek-v3 --gpus 8 --link pcie5 --measured f.json
check "advise --measured /dev/zero" fast "character device" \
    "$EPX" advise --model deepseek-v3 --gpus 8 --link pcie5 --measured /dev/zero
check "no output was written" test ! -e q.json
exit $fail
