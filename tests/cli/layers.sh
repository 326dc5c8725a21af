#!/usr/bin/env bash
# The rooms of src/ stand in order: every import points down, no circle of
# files, at most 6 floors (scripts/check_layers.py holds the table).
set -euo pipefail
src="${EPX_SOURCE:-$(cd "$(dirname "$0")/../.." && pwd)}"
command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }
exec python3 "$src/scripts/check_layers.py" "$src"
