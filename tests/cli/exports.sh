# exports.sh - the shared library exports the public API (epx_*) and nothing
# else: no internal epxi_ helper, no stray global.
. "$(dirname "$0")/../util/cli_lib.sh"
lib="$(dirname "$EPX")/libepx.so"
[ -f "$lib" ] || fail "$lib not built"
command -v nm >/dev/null || { echo "skip: nm not installed"; exit 77; }
nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRV]$/ {print $3}' >"$TMP/syms"
[ -s "$TMP/syms" ] || fail "no exported symbols"
if grep -v '^epx_' "$TMP/syms" >"$TMP/bad"; then
    cat "$TMP/bad" >&2; fail "symbols outside the epx_ prefix are exported"
fi
grep -qx epx_layout_create_trivial "$TMP/syms" || fail "epx_layout_create_trivial not exported"
echo "exports: $(wc -l <"$TMP/syms") symbols, all epx_"
