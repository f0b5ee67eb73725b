#!/usr/bin/env bash
# cp.sh - context parallelism: tokens/s and peak activation memory of one training setup at
# sequence 4096, 8192 and 16384 for cp 1, 2 and 4 at the same global batch, and the ring's overlap.
#
#   bash bench/cp.sh [BUILD_DIR]        (default build; needs examples/train and bench/bench_cp)
#
# The trainer (dense Llama, 1 layer, dim 128, 2 heads of 64, vocab 256, batch 1, 3 steps: its
# tokens_per_s is step 2's, after the caches fill) on 1 rank, then --cp 2 and --cp 4 (one rank per
# core at cp 2 on this 2-core machine; cp 4 oversubscribes), once per sequence length; at 8192 cp 1
# and cp 2 run alternately twice more, and the spread of their ratio is printed. Activation memory
# is the trainer's peak_memory_bytes "activations" of rank 0 (dt_memory_stats). Then bench_cp at
# 8192 on 2 ranks: the ring's communication hidden behind its blocks.
# Last line: cp_mem_ratio=<activations cp 2 / cp 1 at 16384: ideal 0.5>
#            cp_tokens_ratio=<tokens/s cp 2 / cp 1 at 8192, the mean of the two alternating pairs>
#            cp_overlap=<bench_cp's, 1 = every transfer hidden>
set -euo pipefail
B=${1:-build}
TRAIN=$B/examples/train
export OPENBLAS_NUM_THREADS=1 DTENSOR_COST_MODEL=none DTENSOR_QUIET=1 OMPI_MCA_mpi_yield_when_idle=1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
common=(--steps 3 --batch 1 --dim 128 --layers 1 --heads 2 --vocab 256 --model dense)
run() { # seq cp -> "tokens_per_s activations"
  local seq=$1 cp=$2 flags=()
  [ "$cp" -gt 1 ] && flags=(--cp "$cp")
  mpirun --allow-run-as-root --oversubscribe -np "$cp" "$TRAIN" "${common[@]}" --seq "$seq" \
    "${flags[@]}" > "$W/run.log" 2>&1 || { cat "$W/run.log"; exit 1; }
  local tps act
  tps=$(sed -n 's/^final_loss=.* tokens_per_s=\([0-9.]*\).*/\1/p' "$W/run.log")
  act=$(sed -n 's/^peak_memory_bytes rank 0: .*activations=\([0-9]*\).*/\1/p' "$W/run.log")
  echo "$tps $act"
}
printf "%-6s %-3s %12s %16s %10s\n" seq cp tokens_per_s activations_MiB vs_cp1
for seq in 4096 8192 16384; do
  base=""
  for cp in 1 2 4; do
    read -r tps act <<< "$(run "$seq" "$cp")"
    [ -z "$base" ] && base=$act
    [ "$seq" = 16384 ] && [ "$cp" = 1 ] && a1=$act
    [ "$seq" = 16384 ] && [ "$cp" = 2 ] && a2=$act
    printf "%-6s %-3s %12s %16.1f %10.3f\n" "$seq" "$cp" "$tps" "$(echo "$act / 1048576" | bc -l)" \
      "$(echo "$act / $base" | bc -l)"
  done
done
ratios=()
for rep in 1 2; do
  read -r t1 _ <<< "$(run 8192 1)"
  read -r t2 _ <<< "$(run 8192 2)"
  ratios+=("$(echo "$t2 / $t1" | bc -l)")
  printf "8192 pair %d: cp 1 %s tokens/s, cp 2 %s tokens/s\n" "$rep" "$t1" "$t2"
done
mem=$(echo "$a2 / $a1" | bc -l)
tok=$(echo "(${ratios[0]} + ${ratios[1]}) / 2" | bc -l)
printf "tokens/s ratio cp 2 / cp 1 at 8192: %.3f and %.3f\n" "${ratios[0]}" "${ratios[1]}"
mpirun --allow-run-as-root --oversubscribe -np 2 "$B/bench/bench_cp" --seq 8192 --iters 8 > "$W/ov.txt"
cat "$W/ov.txt"
ov=$(sed -n 's/^cp_overlap=\([0-9.]*\).*/\1/p' "$W/ov.txt")
printf "cp_mem_ratio=%.3f cp_tokens_ratio=%.3f cp_overlap=%s\n" "$mem" "$tok" "$ov"
