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
#    of a Llama-style MoE of 8.03 G parameters (dim 4096, 32 layers, 32 heads, 8 kv heads, 8
#    experts of width 1792, top 2, vocab 128256, sequence 4096, batch 64, bf16 on a cuda device,
#    activation checkpointing) on 512 ranks as FSDP 16 x TP 8 x EP 4 with sequence parallelism,
#    in one process (the whole `train --estimate-only` process). The dense 6.7 G model on
#    dp 64 x tp 8 of earlier runs is timed too (printed apart).
# 3. rank_corr = Spearman's correlation between the estimated and the measured tokens/s of
#    PLAN_LAYOUTS (10) layouts of one model at np 4 taken from the planner's own table
#    (dtensor-estimate --plan: every layout of 4 ranks it enumerates, ranked by its estimate),
#    spread evenly over its ranks (of layouts with equal estimates, such as reshard 1 and 0 on
#    one data-parallel group, the first). Beside it, rank_corr_fixed (a comment line) does the
#    same for 10 fixed layouts whose speeds differ by about as much as repeated runs of one
#    layout do here (DDP with 25 MiB and with 0.02 MiB buckets; FSDP with reshard 1 and 0, with
#    activation checkpointing, with bf16 parameters and without prefetching; dp 2 x tp 2; tp 4;
#    tp 4 with sequence and loss parallelism). Each real run is measured RANK_ROUNDS (3) times
#    (alternating all the layouts; tokens/s of the steps after the first two, the median run),
#    the estimates made with a compute and cost model that dtensor-calibrate measured at np 4
#    just before (--force: this machine has fewer cores than ranks, which is what the runs see
#    too; ranks yield their core while they wait in MPI, OMPI_MCA_mpi_yield_when_idle=1, in the
#    calibration and the runs alike). The worst relative error of an estimated step time (both
#    sets) is printed before the last line. RANK_LAYOUTS=0 skips this part (rank_corr=nan);
#    RANK_NP=2 measures at np 2 instead (one rank per vCPU here; the fixed tensor-parallel
#    layouts become tp 2, tp 2 + sp, tp 2 + sp + loss parallel).
# 4. LONG_SEQ=1 (off by default: about 5 minutes here): attention-bound steps, a dense Llama of
#    1 layer, dim 128, 2 heads of 64, batch 1 at sequence 4096, 8192 and 16384, cp 1 (one rank)
#    and cp 2 (two ranks), three real runs each (alternating) against the estimate made with an
#    np 2 calibration; printed as comments, the last line unchanged.
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
est_tps() { sed -n 's/^estimate_step rank 0:.*tokens_per_s=\([0-9.]*\).*/\1/p'; }  # train output
real_tps() { sed -n 's/^final_loss=.*tokens_per_s=\([0-9.]*\).*/\1/p'; }
calibrate() { # NP FILE: dtensor-calibrate's fit at NP ranks (--force: fewer cores than ranks here)
  DTENSOR_QUIET=1 mpirun --oversubscribe -np "$1" "$BUILD/tools/dtensor-calibrate" -o "$2" --force \
    > "$W/cal.txt" 2>&1 || { cat "$W/cal.txt"; echo "estimate.sh: calibration failed" >&2; exit 1; }
  grep "^compute:" "$W/cal.txt" | sed "s/^/# np $1 /"
}
exact=1
grep -q "traffic lines equal" "$W/matrix.txt" || exact=0
grep -q "DIFFER" "$W/matrix.txt" && exact=0
time5() { # OUT ARGS...: the median (and range) of 5 wall times in ms -> "med lo hi"
  local out=$1 ms=() t0 t1
  shift
  for i in 1 2 3 4 5; do
    t0=$(date +%s.%N)
    "$TRAIN" "$@" > "$out" 2>&1
    t1=$(date +%s.%N)
    ms+=("$(echo "($t1 - $t0) * 1000" | bc -l)")
  done
  local sorted
  sorted=$(printf '%s\n' "${ms[@]}" | sort -g)
  echo "$(echo "$sorted" | sed -n 3p) $(echo "$sorted" | head -1) $(echo "$sorted" | tail -1)"
}
read -r med lo hi < <(time5 "$W/big.txt" --estimate-only --np 512 --dp 16 --tp 8 --ep 4 --sp \
  --model moe --experts 8 --top-k 2 --ffn-dim 1792 --dim 4096 --layers 32 --heads 32 --kv-heads 8 \
  --vocab 128256 --seq 4096 --batch 64 --checkpoint --device cuda)
echo "# 8.03 G-parameter MoE on 512 ranks (FSDP 16 x TP 8 x EP 4, sp, checkpointing), rank 0:"
grep "^peak_memory rank\|^traffic\|^estimate_step" "$W/big.txt" | sed 's/^/#   /'
printf "# estimate wall time: median %.1f ms (%.1f..%.1f) over 5 runs\n" "$med" "$lo" "$hi"
read -r dmed dlo dhi < <(time5 "$W/dense.txt" --estimate-only --np 512 --dp 64 --tp 8 --sp \
  --dim 4096 --layers 32 --heads 32 --kv-heads 8 --vocab 32000 --seq 4096 --batch 64 --checkpoint)
printf "# the dense 6.7 G model on dp 64 x tp 8: median %.1f ms (%.1f..%.1f)\n" "$dmed" "$dlo" "$dhi"
echo "# EP configurations (balanced routing assumed): worst relative error $routed"
echo "# communication and total against the point estimate alone (not the [poll, wait] range): worst $point"
[ "$matrix_rc" = 0 ] || echo "# the test matrix reported a difference (see above)"
corr=nan corr_fixed=nan terr=nan
if [ "${RANK_LAYOUTS:-1}" != 0 ]; then
  # 4 ranks on 2 cores: a rank waiting in MPI yields its core (Open MPI busy-polls otherwise, and
  # the waiting ranks take CPU from the computing ones: 30-40 % slower steps, measured)
  export OMPI_MCA_mpi_yield_when_idle=1
  N=${RANK_NP:-4}
  calibrate "$N" "$W/cost.json"
  M=(--dim 256 --layers 4 --heads 8 --seq 128 --batch 8)
  TPL=("--dp 2 --tp 2" "--dp 1 --tp 4" "--dp 1 --tp 4 --sp --loss-parallel")
  [ "$N" = 2 ] && TPL=("--dp 1 --tp 2" "--dp 1 --tp 2 --sp" "--dp 1 --tp 2 --sp --loss-parallel")
  FIXED=("--parallel ddp" "--parallel fsdp" "--parallel fsdp --reshard-after-forward 0"
         "--parallel fsdp --checkpoint" "--parallel fsdp --param-dtype bf16" "${TPL[@]}"
         "--parallel ddp --bucket-mb 0.02" "--parallel fsdp --prefetch 0")
  # the planner's own table of this model at N ranks, with the same calibration: PLAN_LAYOUTS
  # layouts spread evenly over its ranks (of layouts with equal estimates, the first)
  DTENSOR_COST_MODEL="$W/cost.json" "$BUILD/tools/dtensor-estimate" --np "$N" "${M[@]}" --plan \
    --top 10000 > "$W/plan.txt" 2>&1 || { cat "$W/plan.txt"; echo "estimate.sh: --plan failed" >&2; exit 1; }
  mapfile -t PLAN < <(python3 - "$W/plan.txt" "${PLAN_LAYOUTS:-10}" <<'PY'
import sys
rows, seen = [], set()
for line in open(sys.argv[1]):
    f = line.split()
    if not f or not f[0].isdigit():
        continue
    tps = f[-4]
    if tps in seen:
        continue
    seen.add(tps)
    rows.append(" ".join(f[1:-4]))
k = min(int(sys.argv[2]), len(rows))
for j in range(k):
    print(rows[round(j * (len(rows) - 1) / max(k - 1, 1))])
PY
)
  echo "# the planner's table at np $N: $(grep -c '^[0-9]' "$W/plan.txt") layouts, ${#PLAN[@]} measured"
  LAYOUTS=("${FIXED[@]}" "${PLAN[@]}")
  : > "$W/est.txt"
  : > "$W/real.txt"
  for i in "${!LAYOUTS[@]}"; do
    # shellcheck disable=SC2086
    est=$(DTENSOR_COST_MODEL="$W/cost.json" "$TRAIN" --estimate-only --np "$N" "${M[@]}" \
          ${LAYOUTS[$i]} 2>&1 | est_tps)
    echo "$i ${est:-0}" >> "$W/est.txt"
  done
  for round in $(seq "${RANK_ROUNDS:-3}"); do
    for i in "${!LAYOUTS[@]}"; do
      # shellcheck disable=SC2086
      got=$(DTENSOR_COST_MODEL="$W/cost.json" DTENSOR_QUIET=1 mpirun --oversubscribe -np "$N" "$TRAIN" \
              "${M[@]}" ${LAYOUTS[$i]} --steps 8 2>&1 | real_tps)
      echo "$i ${got:-0}" >> "$W/real.txt"
    done
  done
  read -r corr corr_fixed terr < <(python3 - "$W/est.txt" "$W/real.txt" "${#FIXED[@]}" \
                                    "${LAYOUTS[@]}" <<'PY'
import sys
est = {}
for line in open(sys.argv[1]):
    i, v = line.split(); est[int(i)] = float(v)
real = {}
for line in open(sys.argv[2]):
    i, v = line.split(); real.setdefault(int(i), []).append(float(v))
nfixed = int(sys.argv[3])
names = sys.argv[4:]
def ranks(xs):
    order = sorted(range(len(xs)), key=lambda k: xs[k])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]: j += 1
        for k in range(i, j + 1): r[order[k]] = (i + j) / 2.0
        i = j + 1
    return r
def spearman(e, m):
    re, rm = ranks(e), ranks(m)
    n = len(e)
    if n < 2:
        return float("nan")
    mr = sum(re) / n
    mm = sum(rm) / n
    cov = sum((a - mr) * (b - mm) for a, b in zip(re, rm))
    va = sum((a - mr) ** 2 for a in re) ** 0.5
    vb = sum((b - mm) ** 2 for b in rm) ** 0.5
    return cov / (va * vb) if va > 0 and vb > 0 else float("nan")
worst = 0.0
out = []
for title, keys in (("fixed layouts (near-ties: they differ by about the runs' noise)",
                     [k for k in sorted(est) if k < nfixed]),
                    ("layouts spread over the planner's table", [k for k in sorted(est) if k >= nfixed])):
    print("# %s:" % title, file=sys.stderr)
    e = [est[k] for k in keys]
    m = [sorted(real[k])[len(real[k]) // 2] for k in keys]  # the median run
    for k, ev, mv in zip(keys, e, m):
        err = abs(mv / ev - 1.0) if ev > 0 and mv > 0 else float("inf")  # step time = tokens / (tokens/s)
        worst = max(worst, err)
        spread = " / ".join("%.0f" % v for v in real[k])
        print("#   %-62s estimated %7.0f tokens/s, measured %7.0f (%s), step time error %+.1f%%"
              % (names[k], ev, mv, spread, 100.0 * (mv / ev - 1.0) if ev > 0 else float("nan")),
              file=sys.stderr)
    rho = spearman(e, m)
    print("#   Spearman %.3f" % rho, file=sys.stderr)
    out.append(rho)
print("%.3f %.3f %.3f" % (out[1], out[0], worst))
PY
)
fi
if [ "${LONG_SEQ:-0}" = 1 ]; then
  export OMPI_MCA_mpi_yield_when_idle=1
  calibrate 2 "$W/cost2.json"
  L=(--steps 3 --batch 1 --dim 128 --layers 1 --heads 2 --vocab 256 --model dense)
  declare -A got
  for round in 1 2 3; do
    for seq in 4096 8192 16384; do
      for cp in 1 2; do
        f=(); [ "$cp" -gt 1 ] && f=(--cp "$cp")
        got[$seq.$cp]+="$(DTENSOR_COST_MODEL="$W/cost2.json" DTENSOR_QUIET=1 mpirun --oversubscribe \
          -np "$cp" "$TRAIN" "${L[@]}" --seq "$seq" "${f[@]}" 2>&1 | real_tps) "
      done
    done
  done
  for seq in 4096 8192 16384; do
    for cp in 1 2; do
      f=(); [ "$cp" -gt 1 ] && f=(--cp "$cp")
      est=$(DTENSOR_COST_MODEL="$W/cost2.json" "$TRAIN" "${L[@]}" --seq "$seq" "${f[@]}" \
            --estimate-only --np "$cp" 2>&1 | est_tps)
      python3 -c 'import sys
seq, cp, est, runs = sys.argv[1], sys.argv[2], float(sys.argv[3]), [float(v) for v in sys.argv[4:]]
med = sorted(runs)[len(runs) // 2]
print("# seq %s cp %s: estimated %.0f tokens/s, measured %.0f (%s), step time error %+.1f%%"
      % (seq, cp, est, med, " / ".join("%.0f" % v for v in runs), 100.0 * (med / est - 1.0)))' \
        "$seq" "$cp" "${est:-0}" ${got[$seq.$cp]}
    done
  done
fi
rm -rf "$W"
echo "# step time: worst relative error of an estimate against its measured median: $terr"
[ "$corr" = nan ] || echo "# rank_corr_fixed=$corr_fixed (the 10 fixed layouts)"
printf "estimate_worst_err=%s traffic_exact=%s rank_corr=%s estimate_ms_512=%.1f\n" \
  "$err" "$exact" "$corr" "$med"
