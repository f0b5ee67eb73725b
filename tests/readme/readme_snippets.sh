#!/usr/bin/env bash
# readme_snippets.sh - the README's C code compiles as written and runs. Fenced blocks whose info
# string is "c file=NAME" are concatenated, in order, into NAME; each NAME is compiled against
# the built library (the library's own warnings, as errors) and run under mpirun as listed below
# (a program's exit status is its check: the Example's tensor comes back whole, the tutorial's
# loss halves). A listed file that the README lacks is a failure, and so is a file the README has
# that is not listed. The tutorial's sizes in the prose ("The model is N lines", ...) are its
# blocks' line counts.
#   readme_snippets.sh CC README INCLUDE_DIR LIBDTENSOR MPIEXEC WORKDIR
set -euo pipefail
CC=$1 README=$2 INC=$3 LIB=$4 MPI=$5 W=$6
rm -rf "$W"
mkdir -p "$W"
# file -> runs ("NP:ARGS" separated by spaces; ARGS may be empty)
declare -A RUNS=(
  [example.c]="4:"
  [tutorial.c]="1:fsdp 2:fsdp 2:tp 4:fsdp 4:tp 4:fsdp_tp"
)
awk -v dir="$W" '
  /^```c file=/ { split($2, kv, "="); out = dir "/" kv[2]; print "#line " NR + 1 " \"README.md\"" >> out; next }
  /^```/ { out = ""; next }
  out != "" { print >> out }' "$README"
status=0
# the sizes the prose gives: "The model is N lines ..., its three layouts M ..., the training
# program K" for the three tutorial.c blocks
read -r n1 n2 n3 < <(awk '/^```c file=tutorial.c/ { b++; c[b] = 0; f = 1; next }
  /^```/ { f = 0 } f { c[b]++ } END { print c[1] + 0, c[2] + 0, c[3] + 0 }' "$README")
prose=$(tr '\n' ' ' < "$README")
for claim in "The model is $n1 lines" "its three layouts $n2 " "the training program $n3."; do
  grep -qF "$claim" <<< "$prose" ||
    { echo "README: the tutorial's blocks are $n1, $n2 and $n3 lines; no \"$claim\""; status=1; }
done
for f in "$W"/*.c; do
  [ -e "$f" ] || break
  [ -n "${RUNS[$(basename "$f")]+x}" ] || { echo "README has $(basename "$f"), which this test does not run"; status=1; }
done
for name in "${!RUNS[@]}"; do
  src="$W/$name" bin="$W/${name%.c}"
  [ -s "$src" ] || { echo "README: no \`\`\`c file=$name block"; status=1; continue; }
  if ! "$CC" -std=c17 -Wall -Wextra -Wshadow -Wno-unused-parameter -Werror -I"$INC" "$src" -o "$bin" "$LIB" -Wl,-rpath,"$(dirname "$LIB")" -lm \
      > "$W/$name.cc.log" 2>&1; then
    echo "README $name does not compile:"; cat "$W/$name.cc.log"; status=1; continue
  fi
  for run in ${RUNS[$name]}; do
    np=${run%%:*} args=${run#*:}
    # shellcheck disable=SC2086
    if "$MPI" --allow-run-as-root --oversubscribe -np "$np" "$bin" $args > "$W/$name.$np.$args.log" 2>&1; then
      echo "README $name on $np ranks${args:+ ($args)}: ok; $(tail -1 "$W/$name.$np.$args.log")"
    else
      echo "README $name on $np ranks${args:+ ($args)} failed:"; tail -20 "$W/$name.$np.$args.log"; status=1
    fi
  done
done
[ $status -eq 0 ] && echo "readme_snippets: passed"
exit $status
