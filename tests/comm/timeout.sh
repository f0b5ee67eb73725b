#!/usr/bin/env bash
# timeout.sh - runs test_timeout on NP ranks with DTENSOR_TIMEOUT_S=2 (the last rank stops) and
# checks that the job ends within the deadline plus a margin with the timeout message of every
# surviving rank.
#
#   tests/comm/timeout.sh MPIEXEC TEST_TIMEOUT_BINARY MODE NP
#
# MODE abort: the job must end non-zero (MPI_Abort) with "aborting the job" after at least one
# survivor's message (the first abort may kill the others before they report); return, async: every
# survivor prints "test_timeout: rank R ok" (its own checks: status, time, message) and no rank
# "FAILED". A hard limit (coreutils timeout) turns a hang into a failure.
set -u
mpiexec=$1 bin=$2 mode=$3 np=$4
limit=2
margin=12 # mpirun start-up and tear-down on a loaded 2-core machine (sanitizers included)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s%N)
DTENSOR_TIMEOUT_S=$limit timeout -k 5 40 "$mpiexec" --allow-run-as-root --oversubscribe \
  -np "$np" "$bin" "$mode" >"$out" 2>&1
rc=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
cat "$out"
echo "timeout.sh: mode $mode np $np: exit $rc after $elapsed_ms ms (timeout $limit s)"
fail() {
  echo "timeout.sh: FAILED: $*"
  exit 1
}
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "the job hung (killed by the hard limit)"
((elapsed_ms < (limit + margin) * 1000)) || fail "took $elapsed_ms ms (limit $limit s + $margin s)"
survivors=$((np - 1))
want='DT_ERR_TIMEOUT: all_gather (mesh dim 0, step 1/1 S(0)->R) on a communicator of'
seen=0
for r in $(seq 0 $((survivors - 1))); do
  grep -qF "[dtensor rank $r] $want $np ranks did not complete within $limit s" "$out" &&
    seen=$((seen + 1))
done
# abort: the first survivor to time out ends the job, possibly before another one reports
[ "$seen" -ge 1 ] || fail "no timeout message"
[ "$mode" = abort ] || [ "$seen" -eq "$survivors" ] || fail "$seen of $survivors timeout messages"
! grep -q "FAILED" "$out" || fail "a rank reported a failure"
if [ "$mode" = abort ]; then
  [ "$rc" -ne 0 ] || fail "the job ended with status 0 instead of being aborted"
  grep -q "aborting the job (MPI_Abort, error code 10)" "$out" || fail "no abort message"
else
  n=$(grep -c "^test_timeout: rank [0-9]* ok: DT_ERR_TIMEOUT" "$out")
  [ "$n" -eq "$survivors" ] || fail "$n of $survivors surviving ranks returned DT_ERR_TIMEOUT"
fi
echo "timeout.sh: ok"
