# readme.sh - every command in README.md's ```sh blocks runs, in order, in a
# fresh folder, with `epx` meaning the CLI just built; so the README cannot
# rot. ```text blocks hold what cannot run here: `make demo` (its body,
# `epx demo`, is tests/cli/demo.sh), `make test` (this suite itself), SGLang's
# own commands and C code.
. "$(dirname "$0")/../util/cli_lib.sh"
readme="$EPX_SOURCE/README.md"
[ -f "$readme" ] || fail "README.md not found at $readme"
grep -qx 'make demo     # the main job, on an embedded default (no input files needed)' "$readme" || fail "README lost 'make demo'"
grep -q '^make test ' "$readme" || fail "README lost 'make test'"

mkdir -p "$TMP/bin" "$TMP/work/build"
ln -s "$EPX" "$TMP/bin/epx"
ln -s "$EPX" "$TMP/work/build/epx" # the README says ./build/epx, from the repository root
python3 - "$readme" >"$TMP/commands.sh" <<'PY'
import sys
lines, inside = [], False
for raw in open(sys.argv[1]):
    s = raw.strip()
    if s.startswith("```"):
        inside = (s == "```sh") if not inside else False
        continue
    if inside and s and not s.startswith("#"):
        lines.append(s)
print("\n".join(lines))
PY
n=$(wc -l <"$TMP/commands.sh")
[ "$n" -ge 10 ] || fail "only $n README commands found"
cd "$TMP/work"
i=0
while IFS= read -r line; do
    i=$((i + 1))
    PATH="$TMP/bin:$PATH" bash -c "$line" >"$TMP/out" 2>"$TMP/err"; rc=$?
    if [ "$rc" -ne 0 ]; then
        cat "$TMP/out" "$TMP/err" >&2
        fail "README command $i exited $rc: $line"
    fi
done <"$TMP/commands.sh"
echo "readme: $i commands ran"
