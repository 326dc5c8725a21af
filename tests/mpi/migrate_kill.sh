#!/bin/bash
# migrate_kill.sh MPIRUN NP BINARY CHUNK - rank 1 dies (SIGKILL) in the
# middle of a migration moved CHUNK layers at a time (0 = all at once).
# Judged by the files the survivors write: each must report EPX_ERR_TIMEOUT
# or EPX_ERR_COMM, keep every layer wholly old or wholly new ("consistent"),
# and have committed exactly the chunks that finished before the death
# (none with CHUNK 0, the first chunk otherwise). mpirun's exit status is
# ignored (it reports the killed rank); `timeout` turns a hang into a failure.
set -u
MPIRUN=$1 NP=$2 BIN=$3 CHUNK=$4
OUT=$(mktemp -d /tmp/epx-migrate-kill.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
timeout 90 "$MPIRUN" --oversubscribe --allow-run-as-root --enable-recovery -np "$NP" \
    "$BIN" kill "$OUT" "$CHUNK" >"$OUT/log" 2>&1
echo "mpirun exited with $? (ignored; the killed rank makes it nonzero)"
want=$CHUNK
fail=0
for ((r = 0; r < NP; r++)); do
    [ "$r" -eq 1 ] && continue
    f="$OUT/rank.$r"
    if [ ! -s "$f" ]; then
        echo "FAIL: rank $r wrote no result (killed by mpirun, or hung)"
        fail=1
        continue
    fi
    read -r status committed verdict msg <"$f"
    echo "rank $r: $status, $committed layers committed, $verdict: $msg"
    case "$status" in
    EPX_ERR_TIMEOUT | EPX_ERR_COMM) ;;
    *) echo "FAIL: rank $r returned $status"; fail=1 ;;
    esac
    [ "$verdict" = consistent ] || { echo "FAIL: rank $r is inconsistent"; fail=1; }
    [ "$committed" -eq "$want" ] || { echo "FAIL: rank $r committed $committed layers, want $want"; fail=1; }
done
[ "$fail" -ne 0 ] && { echo "--- mpirun output"; cat "$OUT/log"; }
exit "$fail"
