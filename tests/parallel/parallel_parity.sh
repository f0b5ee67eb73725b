#!/usr/bin/env bash
# parallel_parity.sh - the trainer's parallel configs (--dp, --tp, --ep, --sp, --loss-parallel, --async-tp)
# against the single-rank run (--parallel none on 1 rank) from the same seed, dense and MoE, on 2,
# 3, 4 and 8 ranks (FSDP x TP, FSDP x EP, TP x EP, FSDP x TP x EP; FSDP on 3 ranks, where shards
# are uneven), gradient accumulation (--micro-batches: FSDP 2 micro-batches, DDP 4, reducing after
# the last only), context parallelism (--cp: cp 2 and 4, with tp, dp, dp x tp, ep, tp x ep,
# dp x ep (the expert mesh takes cp), with sequence parallelism over tp, MoE; its ring's traffic and halved activations), and tied embeddings under TP, FSDP (on 2 and 3 ranks), DDP and FSDP x TP: 20
# steps, every f32 loss within 1e-5 relative (the worst printed per config), bf16 parameters with
# routed experts under FSDP and EP within 2e-2, and a rerun bitwise equal. Ends with one line per config and "parallel_parity: passed".
#   parallel_parity.sh MPIEXEC TRAIN_BINARY WORKDIR
# PARITY_CONFIGS="name ..." runs only those configs (the emulated-CUDA test: its kernels are the
# same whatever the layout, so a few layouts cover them); the checks of configs left out are skipped.
set -euo pipefail
MPI=$1 TRAIN=$2 W=$3
only=" ${PARITY_CONFIGS:-} "
wanted() { [ "$only" = "  " ] || [[ "$only" == *" $1 "* ]]; }
mkdir -p "$W"
steps=${PARITY_STEPS:-20} # fewer under the sanitizers (CI's time): every path still runs
common=(--steps "$steps" --batch 8 --seq 16 --dim 32 --layers 2 --heads 4 --experts 4 --warmup 5)
run() { # name np flags...
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
    END { printf "%-22s vs %-10s worst relative difference %.3g\n", a, b, worst; exit bad }'
}
# name np model flags
configs=(
  "tp2        2 dense --tp 2"
  "tp4        4 dense --tp 4"
  "tp2_sp     2 dense --tp 2 --sp"
  "tp4_sp_lp  4 dense --tp 4 --sp --loss-parallel"
  "tp2_lp     2 dense --tp 2 --loss-parallel"
  "dp2        2 dense --dp 2"
  "tp2_moe    2 moe   --tp 2 --sp"
  "dp2_tp2    4 dense --dp 2 --tp 2"
  "dp2_tp2_sp 4 dense --dp 2 --tp 2 --sp --loss-parallel"
  "dp2_tp2_moe 4 moe  --dp 2 --tp 2"
  "ep2        2 moe   --ep 2"
  "ep4        4 moe   --ep 4"
  "tp2_ep2    4 moe   --tp 2 --ep 2 --sp --loss-parallel"
  "dp2_ep2    4 moe   --dp 2 --ep 2"
  "dp4_tp2    8 dense --dp 4 --tp 2 --sp"
  "dp2_tp2_ep2 8 moe  --dp 2 --tp 2 --ep 2 --sp --loss-parallel"
  "tp2_ep4    8 moe   --tp 2 --ep 4"
  "dp3        3 dense --dp 3"
  "dp3_moe    3 moe   --dp 3"
  "dp2_mb2    2 dense --dp 2 --micro-batches 2"
  "ddp_mb4    2 dense --parallel ddp --micro-batches 4"
  "cp2        2 dense --cp 2"
  "cp4        4 dense --cp 4"
  "cp2_tp2    4 dense --cp 2 --tp 2 --loss-parallel"
  "dp2_cp2    4 dense --dp 2 --cp 2"
  "dp2_cp2_tp2 8 dense --dp 2 --cp 2 --tp 2"
  "cp2_moe    2 moe   --cp 2"
  "dp2_cp2_moe 4 moe  --dp 2 --cp 2"
  "cp2_tp2_moe 4 moe  --cp 2 --tp 2"
  "cp4_moe    4 moe   --cp 4"
  "dp2_cp2_tp2_moe 8 moe --dp 2 --cp 2 --tp 2"
  "ep2_cp2    4 moe   --ep 2 --cp 2"
  "tp2_ep2_cp2 8 moe  --tp 2 --ep 2 --cp 2 --loss-parallel"
  "cp2_mb2    2 dense --cp 2 --micro-batches 2"
  "dp2_ep2_cp2 8 moe  --dp 2 --ep 2 --cp 2"
  "cp2_tp2_sp 4 dense --cp 2 --tp 2 --sp"
  "cp2_tp2_sp_moe 4 moe --cp 2 --tp 2 --sp --loss-parallel"
  "dp2_cp2_tp2_sp 8 dense --dp 2 --cp 2 --tp 2 --sp --loss-parallel"
  "tp2_sp_async 2 dense --tp 2 --sp --async-tp"
  "tp4_sp_lp_async 4 dense --tp 4 --sp --loss-parallel --async-tp"
  "dp2_tp2_sp_async 4 dense --dp 2 --tp 2 --sp --loss-parallel --async-tp"
  "tp2_moe_async 2 moe --tp 2 --sp --async-tp"
  "cp2_tp2_sp_async 4 dense --cp 2 --tp 2 --sp --async-tp"
)
for model in dense moe; do run "${model}_np1" 1 --model $model; done
for c in "${configs[@]}"; do
  read -r name np model flags <<< "$c"
  wanted "$name" || continue
  # shellcheck disable=SC2086
  run "$name" "$np" --model "$model" $flags
  compare "$name" "${model}_np1" 1e-5
done
# tied embeddings (--tie-embeddings: one (V, D) table for tok_emb and output): TP 2 (embedding
# rowwise and output colwise agree on Shard(0)), FSDP 2 (the root group holds it), DDP 2 (one
# reduction), FSDP 2 x TP 2, CP 2 x TP 2 with SP, dense and MoE, against the tied single-rank run
tied_configs=(
  "tied_tp2         2 dense --tp 2"
  "tied_tp2_sp_lp   2 dense --tp 2 --sp --loss-parallel"
  "tied_dp2         2 dense --dp 2"
  "tied_ddp2        2 dense --parallel ddp"
  "tied_dp2_tp2     4 dense --dp 2 --tp 2"
  "tied_tp2_moe     2 moe   --tp 2"
  "tied_dp2_moe     2 moe   --dp 2"
  "tied_ddp2_moe    2 moe   --parallel ddp"
  "tied_dp2_tp2_moe 4 moe   --dp 2 --tp 2"
  "tied_dp3         3 dense --dp 3"
  "tied_cp2_tp2_sp  4 dense --cp 2 --tp 2 --sp --loss-parallel"
)
for model in dense moe; do
  run "${model}_tied_np1" 1 --model $model --tie-embeddings
  # the tie changes the model: its curve is not the untied one
  if cmp -s <(losses "$W/${model}_tied_np1.jsonl") <(losses "$W/${model}_np1.jsonl"); then
    echo "${model}: --tie-embeddings changed nothing"; exit 1
  fi
done
for c in "${tied_configs[@]}"; do
  read -r name np model flags <<< "$c"
  wanted "$name" || continue
  # shellcheck disable=SC2086
  run "$name" "$np" --model "$model" --tie-embeddings $flags
  compare "$name" "${model}_tied_np1" 1e-5
done
# bf16 parameters under FSDP with routed experts (the experts kept in f32 beside bf16 blocks under
# EP without FSDP; bf16 rows, f32 gates and f32 aux loss), and with context parallelism (the ring
# in f32 between bf16 projections): within bf16's reach of the f32 run
bf16_configs=(
  "dp2_moe_bf16 2 moe --dp 2 --param-dtype bf16"
  "ep2_bf16     2 moe --ep 2 --param-dtype bf16"
  "dp2_ep2_bf16 4 moe --dp 2 --ep 2 --param-dtype bf16"
  "dp2_cp2_bf16 4 moe --dp 2 --cp 2 --param-dtype bf16"
  "cp2_tp2_sp_bf16 4 dense --cp 2 --tp 2 --sp --param-dtype bf16"
  "dp2_tp2_sp_bf16 4 dense --dp 2 --tp 2 --sp --param-dtype bf16"
  "dp2_tp2_sp_async_bf16 4 dense --dp 2 --tp 2 --sp --async-tp --param-dtype bf16"
)
for c in "${bf16_configs[@]}"; do
  read -r name np model flags <<< "$c"
  wanted "$name" || continue
  # shellcheck disable=SC2086
  run "$name" "$np" --model "$model" $flags
  compare "$name" "${model}_np1" 2e-2
done
# asynchronous TP in bf16 against the synchronous plan in bf16: the same roundings but the rings'
# sums (FSDP's partial sums of w's gradient and the projections' input gradients kept partial
# through the casts), within 1e-3
if wanted dp2_tp2_sp_bf16 && wanted dp2_tp2_sp_async_bf16; then
  compare dp2_tp2_sp_async_bf16 dp2_tp2_sp_bf16 1e-3
fi
# reruns are bitwise equal
read -r name np model flags <<< "${configs[3]}"
if wanted "$name"; then
  # shellcheck disable=SC2086
  run "${name}_again" "$np" --model "$model" $flags
  compare "${name}_again" "$name" 0
fi
if wanted ep2; then
  grep -q "^# moe: expert parallel over mesh dim 1" "$W/ep2.log" || { echo "ep2 did not run expert parallel"; exit 1; }
fi
# MoE under TP, FSDP x TP and CP x TP: each rank routes its own tokens (the sequence split over
# tp, the batch over dp), not every token on every tp rank
for n in tp2_moe dp2_tp2_moe cp2_tp2_moe tp2_moe_async; do
  wanted "$n" || continue
  grep -q "^# moe: each rank routes its own tokens" "$W/$n.log" || { echo "$n: not routed per rank"; grep "^# moe" "$W/$n.log"; exit 1; }
done
# FSDP x TP with MoE and no EP: the experts (whole on every tp rank) in groups of their own over
# (tp, dp) flattened: their all-gathers and reduce-scatters run on the merged dims
if wanted dp2_tp2_moe; then
  grep -Eq "^traffic last step, mesh flattened dims: all_gather .* reduce_scatter" "$W/dp2_tp2_moe.log" ||
    { echo "dp2_tp2_moe: the experts were not sharded over tp x dp"; grep "^traffic" "$W/dp2_tp2_moe.log"; exit 1; }
fi
# FSDP x EP: the experts on their own mesh view, sharded over efsdp (and tp, where tp > 1: each tp
# rank dispatches its own tokens), dispatched over ep
for n in dp2_ep2 dp2_tp2_ep2 dp2_ep2_cp2; do
  wanted "$n" || continue
  grep -q "experts (ep, tp, efsdp" "$W/$n.log" || { echo "$n: no expert mesh"; exit 1; }
  grep -q "^traffic last step, expert mesh dim 0 ep: all_to_all" "$W/$n.log" ||
    { echo "$n: no all-to-all over ep"; exit 1; }
  # (with cp: over efsdp x cp, merged)
  grep -Eq "^traffic last step, expert mesh (dim 2 efsdp|flattened dims): all_gather .* reduce_scatter" "$W/$n.log" ||
    { echo "$n: the experts were not sharded over efsdp"; exit 1; }
done
# with tp as well: sharded over tp x efsdp merged, no separate reduction of their gradients over tp
if wanted dp2_tp2_ep2; then
  grep -Eq "^traffic last step, expert mesh flattened dims: all_gather .* reduce_scatter" "$W/dp2_tp2_ep2.log" &&
    grep -q "^traffic last step, expert mesh dim 1 tp: none" "$W/dp2_tp2_ep2.log" ||
    { echo "dp2_tp2_ep2: the experts were not sharded over tp x efsdp"; grep "^traffic" "$W/dp2_tp2_ep2.log"; exit 1; }
fi
# context parallelism: the sequence over the cp dim, attention as ring attention (send_recv on
# cp: per layer 1 step forward, 3 backward at cp 2), activations halved, parameters sharded over dp x cp
for n in cp2 dp2_cp2_tp2; do
  wanted "$n" || continue
  grep -q "^traffic last step, mesh dim 2 cp: .*send_recv 8 calls" "$W/$n.log" ||
    { echo "$n: no ring over cp (2 layers x 4 send_recv)"; exit 1; }
  # the parameters sharded over dp x cp (FSDP's shard_span 2): their gradients reduce-scattered
  # once per FSDP group (3) over cp (dp 1) or dp x cp merged, not all-reduced per parameter
  grep -Eq "^traffic last step, mesh (dim 2 cp|flattened dims): all_gather [0-9]+ calls [0-9]+ bytes; (all_reduce [12] calls [0-9] bytes; )?reduce_scatter 3 calls" "$W/$n.log" ||
    { echo "$n: parameters not sharded over dp x cp by FSDP's groups"; grep "^traffic" "$W/$n.log"; exit 1; }
done
# context x sequence parallelism: the residual stream of each cp rank's tokens sharded over tp
# (all-gathers before the projections, reduce-scatters after), the ring still over cp
for n in cp2_tp2_sp dp2_cp2_tp2_sp; do
  wanted "$n" || continue
  grep -q "^traffic last step, mesh dim 0 tp: all_gather .* reduce_scatter" "$W/$n.log" ||
    { echo "$n: the residual stream was not sequence-sharded over tp"; grep "mesh dim 0" "$W/$n.log"; exit 1; }
  grep -q "^traffic last step, mesh dim 2 cp: .*send_recv 8 calls" "$W/$n.log" ||
    { echo "$n: no ring over cp"; exit 1; }
done
# asynchronous TP: each block's all-gathers and reduce-scatters over tp became rings (send_recv:
# per dense layer 4 forward (q/k/v's gather, wo's scatter, w1/w3's gather, w2's scatter) and 4
# backward; MoE layers 2 and 2); what is left of all_gather is outside the blocks
for n in tp2_sp_async:16 tp4_sp_lp_async:48 dp2_tp2_sp_async:16 tp2_moe_async:8; do
  wanted "${n%%:*}" || continue
  grep -q "^traffic last step, mesh dim 0 tp: .*send_recv ${n##*:} calls" "$W/${n%%:*}.log" ||
    { echo "${n%%:*}: expected ${n##*:} ring steps over tp"; grep "mesh dim 0" "$W/${n%%:*}.log"; exit 1; }
done
act() { sed -n 's/^peak_memory_bytes rank 0: .*activations=\([0-9]*\).*/\1/p' "$W/$1.log"; }
if wanted cp2_tp2 && wanted cp2_tp2_sp; then
  a1=$(act cp2_tp2) a2=$(act cp2_tp2_sp)
  [ "$a2" -lt "$a1" ] || { echo "cp2_tp2_sp holds $a2 activation bytes, cp2_tp2 $a1: expected fewer"; exit 1; }
fi
if wanted cp2; then
  a1=$(act dense_np1) a2=$(act cp2)
  awk -v a="$a1" -v b="$a2" 'BEGIN { r = b / a; if (r < 0.45 || r > 0.55) { printf "cp2 holds %s activation bytes, np1 %s: expected about half\n", b, a; exit 1 } }'
  # the optimizer state of parameters sharded over cp (dp 1): half of one rank's
  opt() { sed -n 's/^peak_memory_bytes rank 0: .*optimizer=\([0-9]*\).*/\1/p' "$W/$1.log"; }
  o1=$(opt dense_np1) o2=$(opt cp2)
  awk -v a="$o1" -v b="$o2" 'BEGIN { r = b / a; if (r < 0.45 || r > 0.55) { printf "cp2 holds %s optimizer bytes, np1 %s: expected about half\n", b, a; exit 1 } }'
fi
echo "parallel_parity: passed"
