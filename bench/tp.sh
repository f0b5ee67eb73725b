#!/usr/bin/env bash
# tp.sh - tensor-parallel training steps with examples/train: TP 2 (2 ranks) and FSDP 2 x TP 2
# (4 ranks), each without and with sequence parallelism, one OpenBLAS thread per rank. Prints
# tokens/s and, for the last step, the counters' bytes per mesh dim next to the formulas (rank 0;
# f32, b the per-rank batch, s, h, V, L layers, t = 2):
#   tp all-reduce   (4 L + 2) b s h 4 bytes  (4 per layer; the embedding's output forward, the
#                   final norm's input gradient backward), plus 4 bytes reading the loss
#   tp all-gather   b s V 4 (the logits, no loss parallelism)
#   --sp: each of those all-reduces becomes an all-gather plus a reduce-scatter of b s h 4 bytes
#         (the counters count an all-gather's output and a reduce-scatter's input), and the norm
#         weights' gradients are all-reduced ((2 L + 1) h 4 bytes)
#   dp all-gather   2 x 4 x Psi_tp (the tensor-parallel shards of every FSDP group, padded),
#   dp reduce-scatter 4 x Psi_tp
#   bench/tp.sh [BUILD_DIR]
# tokens/s is the whole job's (FSDP 2 x TP 2 trains twice the batch of TP 2 on 4 ranks, which on a
# 2-core machine share the cores). Environment: STEPS (default 6), DIM (256), LAYERS (4), SEQ (128), BATCH (8 per data rank).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
STEPS=${STEPS:-6} DIM=${DIM:-256} LAYERS=${LAYERS:-4} SEQ=${SEQ:-128} BATCH=${BATCH:-8}
TRAIN="$BUILD/examples/train"
[ -x "$TRAIN" ] || { echo "tp.sh: $TRAIN not found: build first" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
V=256 H=8
F=$(( (DIM * 8 / 3 + 7) / 8 * 8 ))
common=(--steps "$STEPS" --dim "$DIM" --layers "$LAYERS" --heads "$H" --seq "$SEQ" --vocab "$V"
        --order 1 --warmup 2)
W=$(mktemp -d)
echo "# tp.sh: dim $DIM, $LAYERS layers, ffn $F, seq $SEQ, vocab $V, $BATCH sequences per data rank, $STEPS steps; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-22s %9s  %s\n' config tokens/s "last step: counters (formula)"
run() { # name np dp sp flags...
  local name=$1 np=$2 dp=$3 sp=$4
  shift 4
  mpirun --allow-run-as-root --oversubscribe -x OPENBLAS_NUM_THREADS -np "$np" "$TRAIN" \
    "${common[@]}" --batch $((BATCH * dp)) "$@" > "$W/$name.log" 2>&1 || { cat "$W/$name.log"; exit 1; }
  local tps b=$BATCH t=2 L=$LAYERS
  tps=$(tail -1 "$W/$name.log" | sed 's/.*tokens_per_s=\([0-9]*\).*/\1/')
  local bsh=$((b * SEQ * DIM * 4))
  # Psi over the tp shards: per layer 4 D^2 / t + 3 D F / t + 2 D; embedding and output V D / t; norm D
  local psi=$(( L * (4 * DIM * DIM / t + 3 * DIM * F / t + 2 * DIM) + 2 * V * DIM / t + DIM ))
  local tp_line dp_line
  tp_line=$(grep "mesh dim 0 tp:" "$W/$name.log" | sed 's/.*tp://')
  dp_line=$(grep "mesh dim 1 dp:" "$W/$name.log" | sed 's/.*dp://' || true)
  if [ "$sp" = 0 ]; then
    printf '%-22s %9s  tp:%s (all_reduce %d bytes, all_gather %d)\n' "$name" "$tps" "$tp_line" \
      $(( (4 * L + 2) * bsh )) $(( b * SEQ * V * 4 ))
  else
    printf '%-22s %9s  tp:%s (all_gather %d + logits %d, reduce_scatter %d, all_reduce %d)\n' \
      "$name" "$tps" "$tp_line" $(( (4 * L + 2) * bsh )) $(( b * SEQ * V * 4 )) \
      $(( (4 * L + 2) * bsh )) $(( (2 * L + 1) * DIM * 4 ))
  fi
  [ -n "$dp_line" ] && [ "$dp_line" != " none" ] && printf '%-22s %9s  dp:%s (all_gather >= %d, reduce_scatter >= %d)\n' "" "" \
    "$dp_line" $(( 2 * 4 * psi )) $(( 4 * psi ))
  return 0
}
mpirun --allow-run-as-root --oversubscribe -x OPENBLAS_NUM_THREADS -np 1 "$TRAIN" "${common[@]}" \
  --batch "$BATCH" > "$W/one.log" 2>&1 || { cat "$W/one.log"; exit 1; }
printf '%-22s %9s\n' "one rank" "$(tail -1 "$W/one.log" | sed 's/.*tokens_per_s=\([0-9]*\).*/\1/')"
run "tp2" 2 1 0 --tp 2
run "tp2 sp" 2 1 1 --tp 2 --sp
run "fsdp2 x tp2" 4 2 0 --dp 2 --tp 2
run "fsdp2 x tp2 sp" 4 2 1 --dp 2 --tp 2 --sp
rm -rf "$W"
