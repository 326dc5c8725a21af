# cli_lib.sh - helpers for the CLI tests (sourced, not a test itself).
# $EPX_BIN is the CLI, $EPX_SHARED the shared/ folder (CTest sets both).
set -u
EPX=${EPX_BIN:-./epx}
TMP=$(mktemp -d /tmp/epx-cli.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# expect_exit CODE CMD...: run CMD, check its exit code, keep stdout/stderr in
# $TMP/out and $TMP/err. A code >= 128 (a signal) always fails.
expect_exit() {
    want=$1; shift
    "$@" >"$TMP/out" 2>"$TMP/err"; got=$?
    [ "$got" -lt 128 ] || { cat "$TMP/err" >&2; fail "'$*' crashed (exit $got)"; }
    [ "$got" -eq "$want" ] || { cat "$TMP/out" "$TMP/err" >&2; fail "'$*' exited $got, wanted $want"; }
}
# expect_in FILE TEXT...: every TEXT occurs in FILE.
expect_in() {
    f=$1; shift
    for t in "$@"; do grep -qF -- "$t" "$f" || { cat "$f" >&2; fail "'$t' not in $(basename "$f")"; }; done
}
