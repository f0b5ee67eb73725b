#!/usr/bin/env bash
# nccl_timeout.sh MPIEXEC TEST_NCCL_TIMEOUT_BINARY - runs test_nccl_timeout on one rank (the
# caller sets DTENSOR_NCCL_STALL_MS and DTENSOR_TIMEOUT_S) and judges it by its own report: after a
# timeout no collective and no dt_finalize may follow, so the test leaves with _exit and mpirun
# calls that an improper exit (non-zero status) whatever the test found. Passes when the test
# printed its "ok" line, skips (77) when it skipped (no GPU), fails otherwise or on a hang.
set -u
mpiexec=$1 bin=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
timeout -k 5 60 "$mpiexec" --allow-run-as-root --oversubscribe -np 1 "$bin" >"$out" 2>&1
rc=$?
cat "$out"
if grep -q "^SKIP:" "$out"; then exit 77; fi
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || { echo "nccl_timeout.sh: FAILED: the run hung"; exit 1; }
if grep -q "^test_nccl_timeout: .*: ok$" "$out" && ! grep -q "FAILED\|failed:" "$out"; then
  echo "nccl_timeout.sh: ok (mpirun's status $rc: the test leaves with _exit after a timeout)"
  exit 0
fi
echo "nccl_timeout.sh: FAILED (mpirun's status $rc)"
exit 1
