#!/usr/bin/env bash
# cp_memory.sh - context parallelism's memory at sequence 8192: one training step (dense, 1 layer,
# dim 64, batch 1) on 1 rank and with --cp 2 and --cp 4; each rank's peak of activation memory
# (dt_memory_stats' "activations", as the trainer prints it) within 10 % of 1/cp of the single
# rank's; and no quadratic attention scratch: "other" (sdpa's and the ring's block scores, the
# ring's shard buffers) below 1/8 of the S x S f32 scores (32 MiB) on every rank of every run
# (an S x S matrix on one rank, or the ring's C x C blocks at cp 2, would exceed it).
#   cp_memory.sh MPIEXEC TRAIN_BINARY WORKDIR
set -euo pipefail
MPI=$1 TRAIN=$2 W=$3
mkdir -p "$W"
common=(--steps 1 --batch 1 --seq 8192 --dim 64 --layers 1 --heads 4 --vocab 64 --model dense)
field() { sed -n "s/^peak_memory_bytes rank $2: .*$3=\([0-9]*\).*/\1/p" "$W/$1.log"; }
for cp in 1 2 4; do
  flags=()
  [ "$cp" -gt 1 ] && flags=(--cp "$cp")
  "$MPI" --allow-run-as-root --oversubscribe -np "$cp" "$TRAIN" "${common[@]}" "${flags[@]}" \
    > "$W/cp$cp.log" 2>&1 || { cat "$W/cp$cp.log"; exit 1; }
done
a1=$(field cp1 0 activations) o1=$(field cp1 0 other)
[ -n "$a1" ] && [ "$a1" -gt 0 ] || { echo "no activation peak on 1 rank"; exit 1; }
limit=$((8192 * 8192 * 4 / 8))
echo "cp 1: activations $a1 bytes, other $o1 (limit $limit)"
[ "$o1" -lt "$limit" ] || { echo "the attention scratch on one rank is quadratic"; exit 1; }
for cp in 2 4; do
  for r in $(seq 0 $((cp - 1))); do
    a=$(field "cp$cp" "$r" activations) o=$(field "cp$cp" "$r" other)
    awk -v a="$a" -v a1="$a1" -v o="$o" -v lim="$limit" -v cp="$cp" -v r="$r" 'BEGIN {
      ratio = a / a1 * cp
      printf "cp %d rank %d: activations %d bytes (%.3f of 1/cp of one rank'"'"'s), other %d\n", cp, r, a, ratio, o
      if (ratio < 0.9 || ratio > 1.1) { print "activations not within 10% of 1/cp"; exit 1 }
      if (o >= lim) { print "the attention scratch is quadratic"; exit 1 } }'
  done
done
echo "cp_memory: passed"
