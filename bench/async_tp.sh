#!/usr/bin/env bash
# async_tp.sh - asynchronous TP against the synchronous sequence-parallel plan: examples/train with
# --tp T --sp, without and with --async-tp, alternated ROUNDS times in one run (the machine's noise
# hits both alike), one OpenBLAS thread per rank. Prints each round's tokens/s (the trainer's
# steady-state figure: the steps after the first), the ratio async / sync per round, and the
# median ratio with its spread (min..max). Also checks the two runs' losses agree within 1e-5.
#   bench/async_tp.sh [BUILD_DIR]
# Environment: TP (default 2), ROUNDS (5), STEPS (5), DIM (512), LAYERS (2), SEQ (512), BATCH (4),
# DEVICE (cpu; cuda on a GPU machine with one GPU per rank).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
TP=${TP:-2} ROUNDS=${ROUNDS:-5} STEPS=${STEPS:-5} DIM=${DIM:-512} LAYERS=${LAYERS:-2}
SEQ=${SEQ:-512} BATCH=${BATCH:-4} DEVICE=${DEVICE:-cpu}
TRAIN="$BUILD/examples/train"
[ -x "$TRAIN" ] || { echo "async_tp.sh: $TRAIN not found: build first" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
common=(--steps "$STEPS" --dim "$DIM" --layers "$LAYERS" --heads 8 --seq "$SEQ" --batch "$BATCH"
        --vocab 256 --order 1 --warmup 2 --tp "$TP" --sp --device "$DEVICE")
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
echo "# async_tp.sh: tp $TP, dim $DIM, $LAYERS layers, seq $SEQ, batch $BATCH, $STEPS steps, device $DEVICE; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
tps() { # metrics file: mean tokens/s over the steps after the first
  awk -F'"tokens_per_s":' 'NR > 1 { split($2, a, ","); s += a[1]; n++ } END { printf "%.0f", s / n }' "$1"
}
ratios=()
for r in $(seq 1 "$ROUNDS"); do
  for mode in sync async; do
    extra=()
    [ "$mode" = async ] && extra=(--async-tp)
    mpirun --allow-run-as-root --oversubscribe -x OPENBLAS_NUM_THREADS -np "$TP" "$TRAIN" \
      "${common[@]}" "${extra[@]}" --metrics "$W/$mode.jsonl" > "$W/$mode.log" 2>&1 ||
      { cat "$W/$mode.log"; exit 1; }
  done
  paste -d' ' <(sed 's/.*"loss":\([^,]*\),.*/\1/' "$W/sync.jsonl") \
              <(sed 's/.*"loss":\([^,]*\),.*/\1/' "$W/async.jsonl") |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * ($1 < 0 ? -$1 : $1)) { print "losses differ: " $0; exit 1 } }'
  s=$(tps "$W/sync.jsonl") a=$(tps "$W/async.jsonl")
  ratio=$(awk -v a="$a" -v s="$s" 'BEGIN { printf "%.3f", a / s }')
  ratios+=("$ratio")
  printf 'round %d: sync %8s tokens/s, async %8s tokens/s, async/sync %s\n' "$r" "$s" "$a" "$ratio"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{ v[NR] = $1 } END {
  m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
  printf "async_tp: async/sync tokens/s median %.3f (min %.3f, max %.3f) over %d rounds\n", m, v[1], v[NR], NR }'
grep "^traffic last step, mesh dim 0" "$W/sync.log" | sed 's/^/sync:  /'
grep "^traffic last step, mesh dim 0" "$W/async.log" | sed 's/^/async: /'
