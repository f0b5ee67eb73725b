#!/usr/bin/env bash
# with_backend.sh BACKEND PROBE CMD... - runs CMD with DTENSOR_BACKEND=BACKEND when PROBE (the
# probe_backend program) can open that backend here; exits 77 (ctest's SKIP_RETURN_CODE: reported
# as skipped, not passed) when this build or machine has no such backend, e.g. no GPU.
set -uo pipefail
backend=$1 probe=$2
shift 2
"$probe" "$backend"
rc=$?
if [ "$rc" -eq 77 ]; then echo "with_backend: skipped (no $backend backend here)"; exit 77; fi
[ "$rc" -eq 0 ] || exit "$rc"
export DTENSOR_BACKEND=$backend
exec "$@"
