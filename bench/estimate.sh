#!/usr/bin/env bash
# estimate.sh - how well and how fast train --estimate-only (dt_init_simulated: the meta backend
# and simulated communicators) predicts a run, without running it.
#   bench/estimate.sh [BUILD_DIR]
# 1. The test matrix of tests/estimate/estimate.sh (16 configurations at np 1 to 8: none, DDP,
#    FSDP with reshard 1, 0 and 2, bf16 and activation checkpointing, HSDP, TP, TP+SP with loss
#    parallelism, FSDP x TP, MoE with FSDP, EP, FSDP x TP x EP) against real runs:
#    estimate_worst_err = the largest relative error of any category of any rank over the
#    configurations whose sizes do not depend on routing (the EP ones follow the real routing,
#    which the simulation takes as balanced: their worst error is printed apart); for the
#    timing-dependent communication and total peaks, the distance to the range between the
#    estimate and its DTENSOR_SIM_COMPLETE=wait variant (the error against the point estimate
#    alone is printed too);
#    traffic_exact = 1 when every configuration's traffic per mesh dim equals the real run's.
# 2. estimate_ms_512 = the median of 5 runs (and the spread) of the wall time of one estimate
#    of a Llama-style model of 6.7 G parameters (dim 4096, 32 layers, 32 heads, 8 kv heads,
#    vocab 32000, sequence 4096, batch 64, activation checkpointing) on 512 ranks as dp 64 x tp 8
#    with sequence parallelism, in one process.
# rank_corr (the step-time ranking against measured runs) needs the step-time model, which is not
# built yet: printed as nan.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
TRAIN="$BUILD/examples/train"
[ -x "$TRAIN" ] || { echo "estimate.sh: $TRAIN not found: build first" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
W=$(mktemp -d)
echo "# estimate.sh: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
set +e
bash tests/estimate/estimate.sh "$TRAIN" "$(command -v mpirun)" "$W" | tee "$W/matrix.txt"
matrix_rc=${PIPESTATUS[0]}
set -e
worst() { # lines -> the largest "name=value" over them
  grep -o '[a-z_]*=[0-9.]*' | awk -F= 'BEGIN { m = 0 } { v = $2 + 0; if (v > m) m = v } END { printf "%.4f", m }'
}
err=$(grep -v "(routed)" "$W/matrix.txt" | grep "worst relative error" | sed 's/.*worst relative error://; s/;.*//' | worst)
point=$(grep -v "(routed)" "$W/matrix.txt" | grep "point estimate" | sed 's/.*point estimate://; s/ \[real.*//' | worst)
routed=$(grep "(routed)" "$W/matrix.txt" | grep "worst relative error" | sed 's/.*worst relative error://; s/;.*//' | worst)
exact=1
grep -q "traffic lines equal" "$W/matrix.txt" || exact=0
grep -q "DIFFER" "$W/matrix.txt" && exact=0
ARGS=(--estimate-only --np 512 --dp 64 --tp 8 --sp --dim 4096 --layers 32 --heads 32 --kv-heads 8
      --vocab 32000 --seq 4096 --batch 64 --checkpoint)
ms=()
for i in 1 2 3 4 5; do
  t0=$(date +%s.%N)
  "$TRAIN" "${ARGS[@]}" > "$W/big.txt" 2>&1
  t1=$(date +%s.%N)
  ms+=("$(echo "($t1 - $t0) * 1000" | bc -l)")
done
sorted=$(printf '%s\n' "${ms[@]}" | sort -g)
med=$(echo "$sorted" | sed -n 3p) lo=$(echo "$sorted" | head -1) hi=$(echo "$sorted" | tail -1)
echo "# 6.7 G parameters on 512 ranks (dp 64 x tp 8, sp, checkpointing), rank 0:"
grep "^peak_memory rank\|^traffic" "$W/big.txt" | sed 's/^/#   /'
printf "# estimate wall time: median %.1f ms (%.1f..%.1f) over 5 runs\n" "$med" "$lo" "$hi"
echo "# EP configurations (balanced routing assumed): worst relative error $routed"
echo "# communication and total against the point estimate alone (not the [poll, wait] range): worst $point"
[ "$matrix_rc" = 0 ] || echo "# the test matrix reported a difference (see above)"
rm -rf "$W"
printf "estimate_worst_err=%s traffic_exact=%s rank_corr=nan estimate_ms_512=%.1f\n" "$err" "$exact" "$med"
