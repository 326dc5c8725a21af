#!/bin/sh
# format.sh - apply .clang-format to the C, CUDA and header files git tracks
# (`scripts/format.sh`), or check that they already match it
# (`scripts/format.sh --check`, what `make format-check` and `make test` run).
#
# Formatting depends on the formatter's version: this needs clang-format 14
# (clang-format-14 or clang-format); with another version or none the check
# says so and passes, so a machine without it can still run the suite.
set -eu
cd "$(dirname "$0")/.."

# Paths left alone, one pattern a line (grep -E on the path from the repository
# root): none today.
EXCLUDE='
'

mode=apply
[ "${1:-}" = "--check" ] && mode=check

CF=""
for c in clang-format-14 clang-format; do
    if command -v "$c" >/dev/null 2>&1; then CF=$c; break; fi
done
if [ -z "$CF" ]; then
    echo "format: clang-format not found: not checked (install clang-format-14)"
    exit 0
fi
major=$("$CF" --version | sed -n 's/.*version \([0-9][0-9]*\)\..*/\1/p')
if [ "$major" != "14" ]; then
    echo "format: $CF is version $major, the style is fixed with 14: not checked"
    exit 0
fi

patterns=$(printf '%s\n' "$EXCLUDE" | sed '/^$/d')
files=$(git ls-files -- '*.c' '*.h' '*.cu' '*.cuh')
if [ -n "$patterns" ]; then
    files=$(printf '%s\n' "$files" | grep -v -E "$(printf '%s\n' "$patterns" | paste -sd'|' -)" || true)
fi
[ -n "$files" ] || { echo "format: no files"; exit 0; }

if [ "$mode" = apply ]; then
    printf '%s\n' "$files" | xargs "$CF" -i --style=file
    echo "format: $(printf '%s\n' "$files" | wc -l) files formatted"
    exit 0
fi
bad=""
for f in $files; do
    if ! "$CF" --style=file "$f" | cmp -s - "$f"; then bad="$bad $f"; fi
done
if [ -n "$bad" ]; then
    echo "format: these files differ from .clang-format (run scripts/format.sh):" >&2
    for f in $bad; do echo "  $f" >&2; done
    exit 1
fi
echo "format: $(printf '%s\n' "$files" | wc -l) files match .clang-format"
