#!/usr/bin/env bash
# ab_train.sh - one training config run two ways, alternated ROUNDS times in one run so that the
# machine's noise hits both alike, one OpenBLAS thread per rank: two builds of the library (a
# change against its base), or one build with extra flags on one side (NEW_FLAGS="--async-tp").
# Prints each round's tokens/s (the trainer's steady-state figure: the mean over the steps after
# the first), the ratio new / base per round, the median ratio with its spread (min..max), each
# side's "# moe" line, rank 0's peak memory and traffic lines, and checks that the two runs'
# losses agree within RTOL.
#   bench/ab_train.sh BASE_BUILD NEW_BUILD NP [train flags...]
#   e.g. git worktree add /tmp/base HEAD~1 && cmake -S /tmp/base -B /tmp/base-build ... &&
#        bench/ab_train.sh /tmp/base-build build 2 --model moe --tp 2 --sp
# Environment: ROUNDS (5), STEPS (5), RTOL (1e-5), BASE_FLAGS and NEW_FLAGS (extra flags of one
# side, split on spaces), BASE_NAME and NEW_NAME (the sides' names in the output: base, new).
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
BASE=$1 NEW=$2 NP=$3
shift 3
ROUNDS=${ROUNDS:-5} STEPS=${STEPS:-5} RTOL=${RTOL:-1e-5}
BN=${BASE_NAME:-base} NN=${NEW_NAME:-new}
read -r -a base_flags <<< "${BASE_FLAGS:-}"
read -r -a new_flags <<< "${NEW_FLAGS:-}"
for b in "$BASE" "$NEW"; do
  [ -x "$b/examples/train" ] || { echo "ab_train.sh: $b/examples/train not found: build first" >&2; exit 2; }
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mpi_yield_when_idle=1 OPENBLAS_NUM_THREADS=1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
echo "# ab_train.sh: np $NP, $* ; $BN: $BASE ${BASE_FLAGS:-}, $NN: $NEW ${NEW_FLAGS:-}; $STEPS steps, $ROUNDS rounds; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
tps() { # metrics file: mean tokens/s over the steps after the first
  awk -F'"tokens_per_s":' 'NR > 1 { split($2, a, ","); s += a[1]; n++ } END { printf "%.0f", s / n }' "$1"
}
losses() { sed 's/.*"loss":\([^,]*\),.*/\1/' "$1"; }
ratios=()
for r in $(seq 1 "$ROUNDS"); do
  for side in base new; do
    b=$BASE extra=("${base_flags[@]}")
    [ "$side" = new ] && b=$NEW extra=("${new_flags[@]}")
    mpirun --allow-run-as-root --oversubscribe -x OPENBLAS_NUM_THREADS -np "$NP" \
      "$b/examples/train" --steps "$STEPS" "$@" "${extra[@]}" --metrics "$W/$side.jsonl" \
      > "$W/$side.log" 2>&1 || { cat "$W/$side.log"; exit 1; }
  done
  paste -d' ' <(losses "$W/base.jsonl") <(losses "$W/new.jsonl") | awk -v r="$RTOL" '
    { d = $1 - $2; if (d < 0) d = -d; if (d > r * ($1 < 0 ? -$1 : $1)) { print "losses differ: " $0; exit 1 } }'
  s=$(tps "$W/base.jsonl") a=$(tps "$W/new.jsonl")
  ratio=$(awk -v a="$a" -v s="$s" 'BEGIN { printf "%.3f", a / s }')
  ratios+=("$ratio")
  printf 'round %d: %s %8s tokens/s, %s %8s tokens/s, %s/%s %s\n' "$r" "$BN" "$s" "$NN" "$a" \
    "$NN" "$BN" "$ratio"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk -v t="$NN/$BN" '{ v[NR] = $1 } END {
  m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
  printf "ab_train: %s tokens/s median %.3f (min %.3f, max %.3f) over %d rounds\n", t, m, v[1], v[NR], NR }'
for side in base new; do
  name=$BN
  [ "$side" = new ] && name=$NN
  grep -E "^# moe:|^peak_memory rank 0|^traffic last step" "$W/$side.log" | sed "s/^/$name: /"
done
