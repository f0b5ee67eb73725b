#!/usr/bin/env bash
# mlp_parity.sh - examples/mlp (a model of one's own: Linear-ReLU-Linear, cross-entropy, AdamW)
# gives the same loss curve on 1 rank and in every layout (fsdp, tp, fsdp_tp) on 2 and 4 ranks,
# to rtol 1e-5 over 30 steps (the losses are printed with 9 significant digits, enough to
# round-trip an f32); each layout really splits the parameters (rank 0 holds about 1/N of them);
# the loss goes down; a bad flag is refused with status 2; --help (no mpirun) prints the flags.
#   mlp_parity.sh MPIEXEC MLP_BINARY WORKDIR
set -euo pipefail
MPI=$1 MLP=$2 W=$3
mkdir -p "$W"
STEPS=30
run() { # name np args...
  local name=$1 np=$2
  shift 2
  "$MPI" --allow-run-as-root --oversubscribe -np "$np" "$MLP" --steps $STEPS "$@" \
    > "$W/$name.log" 2>&1 || { cat "$W/$name.log"; echo "$name: failed"; exit 1; }
  sed -n 's/^step [0-9]* loss //p' "$W/$name.log" > "$W/$name.loss"
  [ "$(wc -l < "$W/$name.loss")" -eq $STEPS ] || { cat "$W/$name.log"; echo "$name: expected $STEPS steps"; exit 1; }
  grep -q "^final_loss=" "$W/$name.log" || { echo "$name: no final line"; exit 1; }
  # "# mlp: ... : 1348 parameters, H held by rank 0": H at most total / np plus the biases that
  # stay replicated (tp's fc2.bias: 4 elements)
  read -r total held < <(sed -n 's/^# mlp: .*: \([0-9]*\) parameters, \([0-9]*\) held by rank 0$/\1 \2/p' "$W/$name.log")
  [ -n "${held:-}" ] || { echo "$name: no parameter line"; exit 1; }
  awk -v t="$total" -v h="$held" -v n="$np" -v a="$name" 'BEGIN {
    if (h > t / n + 4 || h * n < t) { printf "%s: rank 0 holds %d of %d parameters on %d ranks\n", a, h, t, n; exit 1 } }'
}
compare() { # a b rtol
  paste -d' ' "$W/$1.loss" "$W/$2.loss" | awk -v r="$3" -v a="$1" -v b="$2" '
    { d = $1 - $2; if (d < 0) d = -d; m = $1 < 0 ? -$1 : $1;
      if (d > r * m) { printf "%s vs %s step %d: %s vs %s (rtol %s)\n", a, b, NR - 1, $1, $2, r; bad = 1 }
      if (d / m > worst) worst = d / m }
    END { printf "%-12s vs %-12s worst relative difference %.3g\n", a, b, worst; exit bad }'
}
run ref 1 --parallel fsdp
for how in tp fsdp_tp; do
  run "${how}_np1" 1 --parallel $how
  compare ref "${how}_np1" 0 # one rank: the same computation, bit for bit
done
for np in 2 4; do
  for how in fsdp tp fsdp_tp; do
    run "${how}_np$np" $np --parallel $how
    compare ref "${how}_np$np" 1e-5
  done
done
run fsdp_tp_dp2 2 --parallel fsdp_tp --tp 1 # the 2-D mesh with FSDP over 2 ranks
compare ref fsdp_tp_dp2 1e-5
grep -q "mesh (tp 2, dp 2)" "$W/fsdp_tp_np4.log" || { echo "fsdp_tp_np4: expected a (tp 2, dp 2) mesh"; exit 1; }
first=$(head -1 "$W/ref.loss") last=$(tail -1 "$W/ref.loss")
awk -v f="$first" -v l="$last" 'BEGIN { if (!(l < 0.5 * f)) { printf "loss %s -> %s: did not halve\n", f, l; exit 1 } }'
if "$MPI" --allow-run-as-root --oversubscribe -np 1 "$MLP" --parallel nope > "$W/bad.log" 2>&1; then
  echo "--parallel nope was accepted"; exit 1
fi
grep -q "usage: mlp" "$W/bad.log" || { cat "$W/bad.log"; echo "no usage line"; exit 1; }
"$MLP" --help > "$W/help.log" 2>&1 || { cat "$W/help.log"; echo "--help (without mpirun) failed"; exit 1; }
grep -q -- "--parallel" "$W/help.log" || { cat "$W/help.log"; echo "--help lists no flags"; exit 1; }
echo "mlp_parity: passed"
