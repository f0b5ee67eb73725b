#!/usr/bin/env bash
# loss_parity.sh - the same model, seed and data on 1, 2 and 4 ranks (1-D meshes and a 2x2 mesh,
# parameters sharded by the default tensor-parallel plan) give the same loss curve to rtol 1e-5 in
# f32 over 20 steps, dense and MoE, untied and with tied embeddings; the MoE also expert-parallel (experts Shard(0) on 2 and 4
# ranks, the rest of the default plan kept; and with a capacity factor it drops choices); two runs of
# one configuration give bitwise-identical losses
# (the JSONL losses are printed with 9 significant digits, enough to round-trip an f32), also
# with selective activation checkpointing on (which must free memory).
#   loss_parity.sh MPIEXEC TRAIN_BINARY WORKDIR
set -euo pipefail
MPI=$1 TRAIN=$2 W=$3
mkdir -p "$W"
steps=${PARITY_STEPS:-20} # fewer under the sanitizers (CI's time): every path still runs
common=(--steps "$steps" --batch 8 --seq 16 --dim 32 --layers 2 --heads 4 --experts 4)
run() { # name np extra...
  local name=$1 np=$2
  shift 2
  "$MPI" --allow-run-as-root --oversubscribe -np "$np" "$TRAIN" "${common[@]}" "$@" \
    --metrics "$W/$name.jsonl" > "$W/$name.log" 2>&1 || { cat "$W/$name.log"; exit 1; }
  [ "$(wc -l < "$W/$name.jsonl")" -eq "$steps" ] || { echo "$name: expected $steps steps"; exit 1; }
}
losses() { sed 's/.*"loss":\([^,]*\),.*/\1/' "$1"; }
compare() { # a b rtol
  paste -d' ' <(losses "$W/$1.jsonl") <(losses "$W/$2.jsonl") | awk -v r="$3" -v a="$1" -v b="$2" '
    { d = $1 - $2; if (d < 0) d = -d; m = $1 < 0 ? -$1 : $1;
      if (d > r * m) { printf "%s vs %s step %d: %s vs %s (rtol %s)\n", a, b, NR - 1, $1, $2, r; bad = 1 }
      if (d / m > worst) worst = d / m }
    END { printf "%-12s vs %-12s worst relative difference %.3g\n", a, b, worst; exit bad }'
}
for model in dense moe; do
  run "${model}_np1" 1 --model $model
  run "${model}_np2" 2 --model $model
  run "${model}_np4" 4 --model $model
  run "${model}_2x2" 4 --model $model --mesh 2x2
  run "${model}_np2b" 2 --model $model
  run "${model}_ckpt" 2 --model $model --checkpoint
  compare "${model}_np1" "${model}_np2" 1e-5
  compare "${model}_np1" "${model}_np4" 1e-5
  compare "${model}_np1" "${model}_2x2" 1e-5
  compare "${model}_np2" "${model}_np2b" 0
  compare "${model}_np2" "${model}_ckpt" 0   # recomputation is bit for bit
  grep -q "checkpointing freed [1-9]" "$W/${model}_ckpt.log" || { echo "checkpointing freed nothing"; exit 1; }
done
# expert parallelism: the experts Shard(0) over the ranks, the same curve
ep_plan='*.experts.*=S(0);*.wq=S(0);*.wk=S(0);*.wv=S(0);*.w1=S(0);*.w3=S(0);*.wo=S(1);*.w2=S(1);output=S(0);tok_emb=S(1);*.router=R'
for np in 2 4; do
  run "moe_ep_np$np" $np --model moe --plan "$ep_plan"
  grep -q "# moe: expert parallel over mesh dim 0" "$W/moe_ep_np$np.log" || { echo "moe_ep_np$np: not expert parallel"; exit 1; }
  compare moe_np1 "moe_ep_np$np" 1e-5
done
grep -q "# moe: global routing" "$W/moe_np2.log" || { echo "moe_np2: expected the global routing"; exit 1; }
# a capacity factor of 0.5 keeps at most half of the 2 x 256 routing choices: at least 256 dropped
run moe_cap_np2 2 --model moe --capacity-factor 0.5
dropped=$(sed -n 's/^# moe: .*, \([0-9]*\) dropped$/\1/p' "$W/moe_cap_np2.log")
[ -n "$dropped" ] && [ "$dropped" -ge 256 ] || { echo "moe_cap_np2: dropped '$dropped', expected >= 256"; exit 1; }
# tied embeddings (--tie-embeddings: the output projection is the token embedding, one (V, D)
# table placed Shard(0) on the vocabulary by the default plan): the same curve on 2 and 4 ranks
# and a 2x2 mesh, dense and MoE; the table is counted once (V x D = 16 x 32 fewer parameters)
params() { sed -n 's/^# dtensor train: [a-z]* model, \([0-9]*\) parameters.*/\1/p' "$W/$1.log"; }
for model in dense moe; do
  run "${model}_tied_np1" 1 --model $model --tie-embeddings
  run "${model}_tied_np2" 2 --model $model --tie-embeddings
  run "${model}_tied_np4" 4 --model $model --tie-embeddings
  run "${model}_tied_2x2" 4 --model $model --tie-embeddings --mesh 2x2
  compare "${model}_tied_np1" "${model}_tied_np2" 1e-5
  compare "${model}_tied_np1" "${model}_tied_np4" 1e-5
  compare "${model}_tied_np1" "${model}_tied_2x2" 1e-5
  grep -q "(output tied to tok_emb)" "$W/${model}_tied_np2.log" || { echo "${model}_tied_np2: not tied"; exit 1; }
  untied=$(params "${model}_np1") tied=$(params "${model}_tied_np1")
  [ -n "$tied" ] && [ $((untied - tied)) -eq $((16 * 32)) ] ||
    { echo "$model: $tied tied parameters, $untied untied: the table must count once"; exit 1; }
done
# the loss went down: last below first
for model in dense moe; do
  first=$(losses "$W/${model}_np1.jsonl" | head -1) last=$(losses "$W/${model}_np1.jsonl" | tail -1)
  awk -v f="$first" -v l="$last" -v m=$model 'BEGIN { if (!(l < f)) { print m ": loss did not decrease"; exit 1 } }'
done
echo "loss_parity: passed"
