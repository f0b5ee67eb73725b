#!/usr/bin/env bash
# trainer_cli.sh - examples/train as a user drives it: a JSON config (flags override it), the
# byte-level loader on a text file, the progress and final lines, the JSONL metrics, the loss
# curve PNG when gnuplot is installed, and clear failures for a bad config key, a missing data
# file and a bad flag. Then the data-parallel modes on a tiny model: --parallel ddp and fsdp (f32,
# and bf16 with reshard_after_forward 0 and no prefetch) on 2 ranks, hsdp on a 2x2 mesh on 4,
# each ending with its final line; the f32 ones train the same model on the same global batch as
# --parallel none, so their final losses agree with it; and clear refusals of fsdp on a 2-D mesh,
# hsdp on a 1-D one, an explicit --plan with ddp and an unknown --parallel value. Then the
# parallel config: --tp 2 with --sp and --loss-parallel, and a JSON {"dp": 2, "tp": 2, "sp": true}
# on 4 ranks, agreeing with --parallel none, the traffic line, and clear refusals. --steps 1
# reports the tokens/s of its one step (the mean leaves out two warm-up steps: it was 0).
#   trainer_cli.sh MPIEXEC TRAIN_BINARY SOURCE_DIR WORKDIR
set -euo pipefail
MPI=$1 TRAIN=$2 SRC=$3 W=$4
mkdir -p "$W"
run() { "$MPI" --allow-run-as-root --oversubscribe "$@"; }
cat > "$W/cfg.json" <<JSON
{"steps": 4, "batch": 4, "seq": 16, "dim": 32, "layers": 1, "heads": 4, "data": "$SRC/README.md",
 "lr": 0.003, "metrics": "$W/m.jsonl", "plot": "$W/loss.png", "mesh": "2"}
JSON
run -np 2 "$TRAIN" --config "$W/cfg.json" --steps 5 > "$W/out.txt" 2>&1 || { cat "$W/out.txt"; exit 1; }
grep -q "vocab 256" "$W/out.txt" || { echo "byte-level corpus not used"; cat "$W/out.txt"; exit 1; }
[ "$(grep -c '^step ' "$W/out.txt")" -eq 5 ] || { echo "expected 5 step lines (flag overrides config)"; exit 1; }
grep -Eq '^step +4 loss [0-9.]+ lr .* tokens/s [0-9]+ GFLOP/s [0-9.]+ MFU [0-9.]+%' "$W/out.txt" || { echo "bad progress line"; exit 1; }
[ "$(grep -Ec '^peak_memory rank [01]: parameters=[0-9.]+MiB gradients=[0-9.]+MiB optimizer=[0-9.]+MiB activations=[0-9.]+MiB communication=[0-9.]+MiB other=[0-9.]+MiB total=[0-9.]+MiB$' "$W/out.txt")" -eq 2 ] || { echo "expected a peak_memory line per rank"; cat "$W/out.txt"; exit 1; }
tail -1 "$W/out.txt" | grep -Eq '^final_loss=[0-9.]+ entropy_floor=nan tokens_per_s=[0-9]+$' || { echo "bad final line"; tail -1 "$W/out.txt"; exit 1; }
[ "$(wc -l < "$W/m.jsonl")" -eq 5 ] || { echo "metrics: expected 5 lines"; exit 1; }
grep -q '"mfu":' "$W/m.jsonl" || { echo "metrics lack mfu"; exit 1; }
if command -v gnuplot > /dev/null; then
  [ -s "$W/loss.png" ] || { echo "no loss curve although gnuplot is installed"; exit 1; }
  [ "$(head -c 8 "$W/loss.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || { echo "loss.png is not a PNG"; exit 1; }
  grep -q "^# loss curve: $W/loss.png" "$W/out.txt" || { echo "no '# loss curve' line"; exit 1; }
fi
echo '{"stepz": 3}' > "$W/bad.json"
if run -np 1 "$TRAIN" --config "$W/bad.json" > "$W/bad.txt" 2>&1; then echo "bad key accepted"; exit 1; fi
grep -q "unknown config key 'stepz'" "$W/bad.txt" || { cat "$W/bad.txt"; exit 1; }
if run -np 1 "$TRAIN" --data "$W/nope.txt" --steps 1 > "$W/nofile.txt" 2>&1; then echo "missing file accepted"; exit 1; fi
grep -q "cannot open" "$W/nofile.txt" || { cat "$W/nofile.txt"; exit 1; }
if run -np 1 "$TRAIN" --frobnicate 3 > "$W/flag.txt" 2>&1; then echo "bad flag accepted"; exit 1; fi
grep -q "bad argument '--frobnicate'" "$W/flag.txt" || { cat "$W/flag.txt"; exit 1; }
# data parallelism: tiny model on the Markov corpus (entropy floor known)
tiny=(--steps 4 --batch 4 --seq 16 --dim 32 --layers 2 --heads 4)
final_re='^final_loss=[0-9.]+ entropy_floor=1\.2732 tokens_per_s=[0-9]+$'
# --steps 1: no step is left after the two warm-up steps; tokens_per_s is that of the step that
# ran (it was 0), and a '#' line says so
run -np 1 "$TRAIN" "${tiny[@]}" --steps 1 > "$W/one_step.txt" 2>&1 || { cat "$W/one_step.txt"; exit 1; }
tail -1 "$W/one_step.txt" | grep -Eq '^final_loss=[0-9.]+ entropy_floor=1\.2732 tokens_per_s=[1-9][0-9]*$' || { echo "--steps 1: tokens_per_s is not the step's"; tail -2 "$W/one_step.txt"; exit 1; }
grep -q '^# tokens_per_s: the mean of all 1 step run, warm-up included' "$W/one_step.txt" || { echo "--steps 1: no '# tokens_per_s' line"; cat "$W/one_step.txt"; exit 1; }
if grep -q '^# tokens_per_s' "$W/out.txt"; then echo "5 steps: a '# tokens_per_s' line"; exit 1; fi
dp_run() { # name np flags...
  local name=$1 np=$2
  shift 2
  run -np "$np" "$TRAIN" "${tiny[@]}" "$@" > "$W/$name.txt" 2>&1 || { echo "$name failed"; cat "$W/$name.txt"; exit 1; }
  tail -1 "$W/$name.txt" | grep -Eq "$final_re" || { echo "$name: bad final line"; cat "$W/$name.txt"; exit 1; }
  [ "$(grep -c '^step ' "$W/$name.txt")" -eq 4 ] || { echo "$name: expected 4 step lines"; exit 1; }
  [ "$(grep -c '^peak_memory rank ' "$W/$name.txt")" -eq "$np" ] || { echo "$name: expected $np peak_memory lines"; exit 1; }
}
final_of() { tail -1 "$W/$1.txt" | sed 's/^final_loss=\([0-9.]*\) .*/\1/'; }
same_loss() { # a b: final losses within 1e-3 relative (f32, 4 steps, different reduction orders)
  awk -v a="$(final_of "$1")" -v b="$(final_of "$2")" -v na="$1" -v nb="$2" \
    'BEGIN { d = a - b; if (d < 0) d = -d; if (d > 1e-3 * a) { printf "%s final_loss %s vs %s %s\n", na, a, nb, b; exit 1 } }'
}
dp_run dp_none 2
dp_run dp_ddp 2 --parallel ddp --bucket-mb 0.01
grep -q '^# dtensor train: .*parallel ddp (' "$W/dp_ddp.txt" || { echo "ddp: header lacks the mode"; head -3 "$W/dp_ddp.txt"; exit 1; }
dp_run dp_fsdp 2 --parallel fsdp
grep -q '^# dtensor train: .*parallel fsdp (3 groups, reshard_after_forward 1, param_dtype f32, prefetch 1)' "$W/dp_fsdp.txt" || { echo "fsdp: header lacks the mode"; head -3 "$W/dp_fsdp.txt"; exit 1; }
# torchtitan's wrapping: block 0 gathered in forward and again in backward, the last block and
# the root once (kept from forward to backward); with reshard 0 every group once
grep -q '^traffic last step, mesh dim 0: all_gather 4 calls ' "$W/dp_fsdp.txt" || { echo "fsdp: expected 4 all-gathers per step"; grep traffic "$W/dp_fsdp.txt"; exit 1; }
dp_run dp_fsdp_bf16 2 --parallel fsdp --param-dtype bf16 --reshard-after-forward 0 --prefetch 0
grep -q '^traffic last step, mesh dim 0: all_gather 3 calls ' "$W/dp_fsdp_bf16.txt" || { echo "fsdp reshard 0: expected 3 all-gathers per step"; grep traffic "$W/dp_fsdp_bf16.txt"; exit 1; }
dp_run dp_hsdp 4 --parallel hsdp --mesh 2x2
grep -q '^# dtensor train: .*mesh 2x2 over 4 ranks, parallel hsdp (' "$W/dp_hsdp.txt" || { echo "hsdp: header lacks the mode"; head -3 "$W/dp_hsdp.txt"; exit 1; }
same_loss dp_none dp_ddp
same_loss dp_none dp_fsdp
same_loss dp_none dp_hsdp
refused() { # name expected-message np flags...
  local name=$1 msg=$2 np=$3
  shift 3
  if run -np "$np" "$TRAIN" "${tiny[@]}" "$@" > "$W/$name.txt" 2>&1; then echo "$name: accepted $*"; exit 1; fi
  grep -qF -- "$msg" "$W/$name.txt" || { echo "$name: lacks '$msg'"; cat "$W/$name.txt"; exit 1; }
}
refused fsdp_2d "train: --parallel fsdp runs on a 1-D mesh over all ranks, got --mesh 2x2" 1 --parallel fsdp --mesh 2x2
refused hsdp_1d "train: --parallel hsdp needs a 2-D mesh --mesh RxS" 1 --parallel hsdp
refused ddp_plan "train: --plan applies to --parallel none only" 1 --parallel ddp --plan '*=R'
refused bad_par "parallel must be none, ddp, fsdp or hsdp, got 'zero3'" 1 --parallel zero3
# the parallel config
dp_run pc_tp 2 --tp 2 --sp --loss-parallel
grep -q '^# dtensor train: .*mesh (tp, dp) 2x1 over 2 ranks, parallel dp 1 x tp 2 x ep 1, sequence parallel, loss parallel' "$W/pc_tp.txt" || { echo "tp: header lacks the config"; head -3 "$W/pc_tp.txt"; exit 1; }
grep -Eq '^traffic last step, mesh dim 0 tp: all_gather [0-9]+ calls [0-9]+ bytes; .*reduce_scatter' "$W/pc_tp.txt" || { echo "tp: no traffic line"; cat "$W/pc_tp.txt"; exit 1; }
same_loss dp_none pc_tp
echo '{"dp": 2, "tp": 2, "sp": true}' > "$W/pc.json"
dp_run pc_dp_tp 4 --config "$W/pc.json"
grep -q 'parallel dp 2 x tp 2 x ep 1, sequence parallel' "$W/pc_dp_tp.txt" || { echo "json parallel config not applied"; head -3 "$W/pc_dp_tp.txt"; exit 1; }
same_loss dp_none pc_dp_tp
refused pc_world "train: --dp 1 x --tp 2 x --ep 1 x --cp 1 = 2 ranks, the world has 1" 1 --tp 2
refused pc_world_dp "train: --dp 1 x --tp 2 x --ep 1 x --cp 1 = 2 ranks, the world has 4 (--dp 2 fills it)" 4 --tp 2
refused pc_heads "train: --tp 3 must divide the heads (4)" 3 --tp 3
refused pc_sp "train: --sp and --loss-parallel go with --tp" 1 --sp
refused pc_ep_div "train: --ep 2 needs --model moe with a multiple of 2 experts (got moe, 3)" 2 --ep 2 --model moe --experts 3
refused pc_mix "train: --dp/--tp/--ep/--cp build their own mesh and plan: drop --parallel fsdp" 2 --tp 2 --parallel fsdp
refused pc_mesh "train: --dp/--tp/--ep/--cp build their own mesh and plan: drop --mesh" 2 --cp 2 --mesh 2
refused pc_sp_tp1 "train: --sp and --loss-parallel go with --tp (2 or more)" 2 --cp 2 --sp
refused cp_seq "train: --cp 3 splits each sequence into 6 chunks (2 per rank, load-balanced for causal attention): --seq 16 is not a multiple of 6" 3 --cp 3
refused cp_sp "train: --tp 4 must divide the heads (4), the kv heads (4) and --seq / --cp (sequence parallel)" 8 --cp 2 --tp 4 --sp --seq 12
echo "trainer_cli: passed"
