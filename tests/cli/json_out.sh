#!/bin/bash
# json_out.sh - every JSON output parses (issue 29): strings escaped through
# the CLI's one writer (a model folder named with '"', a newline, ESC or byte
# 0xff), figures that are not finite written as null (eval --json on loads of
# 1e308), and a write that fails after the checks (a full disk, here the
# file-size limit) exits 1 naming the file, never "EPX_OK".
set -u
. "${EPX_SOURCE:?EPX_SOURCE is not set}/tests/util/cli_test.sh"
cli_scratch json_out
# strict_json FILE: parses as JSON with no NaN or Infinity, and is UTF-8.
strict_json() {
    python3 - "$1" <<'PY'
import json, sys
def bad(c):
    raise ValueError("non-finite %s" % c)
json.loads(open(sys.argv[1], "rb").read().decode("utf-8"), parse_constant=bad)
PY
}

# hostile folder names for --model
i=0
for name in 'a"b' $'new\nline' $'esc\x1b[31m' $'byte\xff' $'tab\t\\back'; do
    i=$((i + 1))
    mkdir -p "m$i/$name"
    cp "$EPX_SOURCE/tests/data/hf/deepseek-v3/config.json" "m$i/$name/"
    check "advise --json, model folder $i" expect_rc 0 "$EPX" advise --model "m$i/$name" --gpus 8 \
        --link pcie5 --json
    check "  is strict JSON" strict_json out
    check "trace synth, model folder $i" expect_rc 0 "$EPX" trace synth --model "m$i/$name" \
        --windows 2 --tokens 1000 -o "t$i.json"
    check "demo report.json, model folder $i" expect_rc 0 "$EPX" demo --model "m$i/$name" \
        --windows 3 --tokens 2000 --out "d$i"
    check "  is strict JSON" strict_json "d$i/report.json"
done
check "the name survives (quote)" python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["model"] == "a\"b"' d1/report.json

# figures that are not finite: null, never nan/inf
python3 - <<'PY'
import json
L, E = 2, 8
json.dump({"logical_count": [[[1e308] * E for _ in range(L)]]}, open("huge.json", "w"))
json.dump({"logical_count": [[[1e308, 0, 0, 0, 0, 0, 0, 0] for _ in range(L)]]}, open("one.json", "w"))
PY
"$EPX" layout trivial --layers 2 --experts 8 --gpus 8 -o lay.json >/dev/null || exit 1
for c in huge.json one.json; do
    "$EPX" eval --placement lay.json --counts "$c" --gpus 8 --json >out 2>err
    rc=$?
    if [ "$rc" = 0 ]; then
        check "eval --json on $c is strict JSON" strict_json out
    else
        check "eval --json on $c refused naming the load" grep -q "1e+308\|finite\|float\|2^63" err
    fi
    check "eval --json on $c: no nan or inf" bash -c '! grep -Eqi "nan|inf" out'
done
"$EPX" stats huge.json --json >out 2>err
check "stats --json on huge loads is strict JSON (or refused)" bash -c \
    '[ -s out ] && python3 -c "import json,sys; json.load(open(\"out\"), parse_constant=lambda c: 1/0)" || [ -s err ]'

# a failed write after the checks: exit 1, naming the file
"$EPX" trace synth --model deepseek-v3 --windows 2 --tokens 2000 -o c.json >/dev/null || exit 1
check "plan -o /dev/full refused as a device" refuse "character device" \
    "$EPX" plan --counts c.json --gpus 8 -o /dev/full
# full CMD...: CMD with a 1 KiB file-size limit and SIGXFSZ at its default
# (terminate), as a user's shell leaves it: epx ignores the signal itself, so
# its writes fail with EFBIG as on a full disk
full=(bash -c 'trap - XFSZ; ulimit -f 1; exec "$@"' full)
check "plan -o, file-size limit: exit 1" expect_rc 1 "${full[@]}" "$EPX" plan --counts c.json --gpus 8 \
    -o p.json
check "  names the file" grep -qF "cannot write 'p.json'" err
check "  not EPX_OK" bash -c '! grep -q EPX_OK err'
check "  no file, no temp" bash -c '[ ! -e p.json ] && ! ls -a | grep -q epx-tmp'
"$EPX" plan --counts c.json --gpus 8 -o ok.json >/dev/null || exit 1
check "plan -o .pt, file-size limit: exit 1" expect_rc 1 "${full[@]}" "$EPX" plan --counts c.json \
    --gpus 8 -o p.pt
check "  names the file" grep -qF "'p.pt'" err
check "dispatch-table, file-size limit: exit 1" expect_rc 1 "${full[@]}" "$EPX" dispatch-table \
    --placement ok.json --gpus 8 -o tab.json
check "  names the file" grep -qF "'tab.json'" err
check "trace synth, file-size limit: exit 1" expect_rc 1 "${full[@]}" "$EPX" trace synth \
    --model deepseek-v3 --windows 2 --tokens 2000 -o t.json
check "  names the file" grep -qF "'t.json'" err
exit $fail
