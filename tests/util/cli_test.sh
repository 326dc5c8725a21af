# cli_test.sh - what the CLI shell tests share; source it, then call
# cli_scratch NAME first. Sets EPX (the binary), T (a scratch folder, removed
# on exit, and the working directory) and fail (0; a failed check sets 1).
cli_scratch() {
    EPX=${EPX_BIN:?EPX_BIN is not set}
    T=$(mktemp -d "/tmp/epx-$1.XXXXXX")
    trap 'cd /; rm -rf "$T"' EXIT
    cd "$T" || exit 1
    fail=0
}
# check NAME CMD...: CMD must succeed.
check() {
    local name=$1
    shift
    if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fail=1; fi
}
# expect_rc RC CMD...: runs CMD (stdout to out, stderr to err) within 20 s
# and wants exit status RC.
expect_rc() {
    local want=$1
    shift
    timeout 20 "$@" >out 2>err
    local rc=$?
    [ "$rc" = "$want" ] || { echo "  rc $rc, wanted $want: $*"; cat err; return 1; }
}
# refuse NEEDLE CMD...: exit 2, and the message holds NEEDLE.
refuse() {
    local needle=$1
    shift
    expect_rc 2 "$@" || return 1
    grep -qF -- "$needle" err || { echo "  message lacks '$needle':"; cat err; return 1; }
}
