#!/usr/bin/env bash
# check_entries.sh - fails when a public status function does not name itself in its messages.
#
#   tools/check_entries.sh [ROOT]     (default: the repository this script lives in)
#
# Every `DT_API dt_status_t dt_x(` declared in ROOT/include/dtensor/*.h must be defined under
# ROOT/src (a definition starts at column 0 with `dt_status_t dt_x(` and ends at the next `}` in
# column 0, or on its own line) with a body that opens the public-entry scope: DT_ENTRY_RETURN(...)
# or dt_error_scope_enter (dtensor/check.h). Then a failure recorded anywhere below it, in a helper
# or in another public function it calls, reads "dt_x: ..." (see dt_last_error). The allow-list
# below holds the few that need no scope, each with its reason; prefer wrapping:
#
#   dt_status_t dt_x(...) { DT_ENTRY_RETURN(dt__x(...)); }     (the body in a static dt__x)
#
# Exit status 0 when every public status function is covered, 1 with one line per offender (a
# function without the scope, one declared and not defined, a stale allow-list entry) otherwise.
set -euo pipefail
root=$(cd "${1:-$(dirname "$0")/..}" && pwd)

# name: reason. Keep it short: a function that records no error at all, or the recorder itself.
allow=(
  "dt_set_error: the recorder itself; its func argument names the entry of what it records"
  "dt_cost_model_reset: never fails, records nothing"
  "dt_memory_reset_peak: never fails, records nothing"
  "dt_set_timeout_handler: never fails, records nothing"
  "dt_grouped_mm_flops_reset: never fails, records nothing"
)

bad=0
report() {
  echo "check_entries: $1"
  bad=1
}
allowed() { # name -> 0 when on the allow-list
  local a
  for a in "${allow[@]}"; do [ "${a%%:*}" = "$1" ] && return 0; done
  return 1
}

# The public status functions, declarations joined so that a split one is found too
# ("DT_API DT__DEPRECATED(...)\ndt_status_t dt_tensor_full(").
names=$(cat "$root"/include/dtensor/*.h | tr '\n' ' ' |
  grep -oE 'DT_API[[:space:]]+(DT__DEPRECATED\([^)]*\)[[:space:]]+)?dt_status_t[[:space:]]+dt_[A-Za-z0-9_]+[[:space:]]*\(' |
  sed -E 's/.*(dt_[A-Za-z0-9_]+)[[:space:]]*\($/\1/' | sort -u || true)
[ -n "$names" ] || report "no DT_API dt_status_t declarations under $root/include/dtensor"

# One awk pass over every source file: "name<TAB>file:line<TAB>covered(0|1)" per definition.
mapfile -d '' files < <(find "$root/src" -type f \( -name '*.c' -o -name '*.cu' -o -name '*.cpp' \) -print0 | sort -z)
defs=$(awk '
  FNR == 1 { on = 0 }
  !on && /^dt_status_t[ \t]+dt_[A-Za-z0-9_]+[ \t]*\(/ {
    name = $0; sub(/^dt_status_t[ \t]+/, "", name); sub(/[ \t]*\(.*/, "", name)
    on = 1; body = ""; where = FILENAME ":" FNR; opened = 0
  }
  on {
    body = body $0 "\n"
    if (!opened && $0 ~ /\)[ \t]*;[ \t]*(\/\*.*)?$/) { on = 0; next } # a prototype
    first = 0
    if (!opened && $0 ~ /\{/) { opened = 1; first = 1 }
    # the end: a "}" in column 0, or a body opened and closed on one line ("{ DT_ENTRY_...; }")
    if (opened && ($0 ~ /^\}/ || (first && $0 ~ /\{.*\}[ \t]*$/))) {
      covered = (body ~ /DT_ENTRY_RETURN[ \t]*\(/ || body ~ /dt_error_scope_enter[ \t]*\(/) ? 1 : 0
      printf "%s\t%s\t%d\n", name, where, covered
      on = 0
    }
  }' "${files[@]}")

for n in $names; do
  line=$(awk -F'\t' -v n="$n" '$1 == n { print; exit }' <<<"$defs")
  if [ -z "$line" ]; then
    allowed "$n" || report "$n is declared in include/dtensor but not defined under src/"
    continue
  fi
  where=$(cut -f2 <<<"$line")
  where=${where#"$root"/}
  if [ "$(cut -f3 <<<"$line")" = 1 ]; then
    allowed "$n" && report "$n ($where) is wrapped: drop it from the allow-list in tools/check_entries.sh"
  elif ! allowed "$n"; then
    report "$n ($where) does not name itself: wrap its body, $n(...) { DT_ENTRY_RETURN(dt__impl(...)); }"
  fi
done
for a in "${allow[@]}"; do
  grep -qx "${a%%:*}" <<<"$names" || report "allow-list entry ${a%%:*} is not a public status function"
done

[ "$bad" = 0 ] && echo "check_entries: $(wc -w <<<"$names") public status functions name themselves (${#allow[@]} allowed)"
exit "$bad"
