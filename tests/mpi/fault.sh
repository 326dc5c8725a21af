#!/bin/bash
# fault.sh MPIRUN NP BINARY kill|stop [low-latency] - run mpi_fault and judge by the files
# the surviving ranks write: each must report EPX_ERR_TIMEOUT or
# EPX_ERR_COMM within LIMIT_MS of starting its dispatch. mpirun's own exit
# status is ignored (it reports the killed rank); `timeout` bounds the run
# so a hang fails the test instead of stalling CI.
set -u
MPIRUN=$1 NP=$2 BIN=$3 MODE=$4 EPMODE=${5:-}
LIMIT_MS=${LIMIT_MS:-8000}
OUT=$(mktemp -d /tmp/epx-fault.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
timeout 90 "$MPIRUN" --oversubscribe --allow-run-as-root --enable-recovery -np "$NP" \
    "$BIN" "$MODE" "$OUT" $EPMODE >"$OUT/log" 2>&1
echo "mpirun exited with $? (ignored; a killed rank makes it nonzero)"
fail=0
for ((r = 0; r < NP; r++)); do
    [ "$r" -eq 1 ] && continue
    f="$OUT/rank.$r"
    if [ ! -s "$f" ]; then
        echo "FAIL: rank $r wrote no result (killed by mpirun, or hung)"
        fail=1
        continue
    fi
    read -r status ms msg <"$f"
    echo "rank $r: $status after $ms ms: $msg"
    case "$status" in
    EPX_ERR_TIMEOUT | EPX_ERR_COMM) ;;
    *) echo "FAIL: rank $r returned $status, expected EPX_ERR_TIMEOUT or EPX_ERR_COMM"; fail=1 ;;
    esac
    if [ "${ms%.*}" -gt "$LIMIT_MS" ]; then
        echo "FAIL: rank $r took $ms ms, above $LIMIT_MS"
        fail=1
    fi
done
[ "$fail" -ne 0 ] && { echo "--- mpirun output"; cat "$OUT/log"; }
exit "$fail"
