#!/bin/bash
# formats.sh - the writer follows the extension (.pt: a PyTorch zip; else
# JSON), the reader follows the content (a zip is .pt whatever its name, a
# .pt name holding JSON reads as JSON), JSON output is strict (stats --json
# writes null, never inf or nan), and a directory given as a file says so.
set -u
EPX=${EPX_BIN:?EPX_BIN is not set}
T=$(mktemp -d /tmp/epx-formats.XXXXXX)
trap 'cd /; rm -rf "$T"' EXIT
cd "$T" || exit 1
fail=0
check() { # name, command...
  local name=$1; shift
  if "$@" >out 2>err; then echo "ok   $name"; else echo "FAIL $name"; cat err; fail=1; fi
}
is_zip() { [ "$(head -c 2 "$1")" = PK ]; }
is_json() { python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$1"; }
command -v python3 >/dev/null || { echo "skipped: python3 is needed to check JSON"; exit 77; }

check "trace synth" "$EPX" trace synth --model deepseek-v3 --windows 2 --tokens 2000 -o c.json
check "trace synth -o .pt" "$EPX" trace synth --model deepseek-v3 --windows 2 --tokens 2000 -o c.pt
check "  is a zip" is_zip c.pt
check "plan -o .pt" "$EPX" plan --counts c.json --gpus 8 -o p.pt
check "  is a zip" is_zip p.pt
check "plan -o .json" "$EPX" plan --counts c.json --gpus 8 -o p.json
check "  is JSON" is_json p.json
check "plan -o other name: JSON" "$EPX" plan --counts c.json --gpus 8 -o p.mapping
check "  is JSON" is_json p.mapping
check "layout -o .pt" "$EPX" layout trivial --layers 4 --experts 8 --gpus 2 -o l.pt
check "  is a zip" is_zip l.pt
check "dispatch-table -o .pt refused" sh -c '"$@"; [ $? = 2 ]' - "$EPX" dispatch-table \
  --placement p.json --gpus 8 -o t.pt

# the reader follows the content
cp p.pt dump.pt.bak
check "mapping zip named .pt.bak" "$EPX" convert dump.pt.bak m.json
check "  same map as the JSON" python3 -c 'import json; assert json.load(open("m.json")) == json.load(open("p.json"))'
cp c.pt counts.bak
check "counts zip named .bak" "$EPX" stats counts.bak --gpus 8
cp p.json json.pt
check "JSON named .pt" "$EPX" convert json.pt m2.json
check "--tree on a .bak zip" "$EPX" convert --tree dump.pt.bak tree.json
check "--placement .pt.bak" "$EPX" stats c.json --placement dump.pt.bak --gpus 8

# strict JSON: loads whose figures would overflow are refused on read (their
# total above 2^63); the largest that read give finite figures, no NaN/inf
echo '{"logical_count": [[[1e308, 1e308, 1e308, 1e308], [0, 0, 0, 1]]]}' > big.json
check "stats on loads beyond a double: refused" sh -c \
  '! "$0" stats big.json --gpus 2 --json >/dev/null 2>err && grep -q "scale them down" err' "$EPX"
echo '{"logical_count": [[[4e18, 4e18, 1e18, 1e17], [0, 0, 0, 1]]]}' > large.json
"$EPX" stats large.json --gpus 2 --json > s.json 2>err
check "stats --json on the largest loads is strict JSON" python3 -c '
import json
def bad(c): raise ValueError(c)
json.load(open("s.json"), parse_constant=bad)'
check "  with every figure finite" sh -c '! grep -q null s.json'

# a directory as input
mkdir d
"$EPX" dispatch-table --placement d --gpus 8 -o t.json 2>derr
check "directory as input says so" grep -q "is a directory" derr
exit $fail
