#!/usr/bin/env bash
# plan.sh ESTIMATE TRAIN - dtensor-estimate (no MPI, no real run):
#  - one layout: the worst rank's lines are the trainer's own estimate of that rank (byte for
#    byte), the ranks evaluated are the first and last coordinates of each mesh dim (FSDP on 3
#    ranks: 0 and 2; dp 2 x tp 2: 0, 1, 2, 3), the verdict follows --budget (exit 0 fits, 1 not);
#  - --plan: at least 6 layouts fit a generous budget, ranked by tokens/s (non-increasing), each
#    peak within the budget, the best one named; a layout the trainer refuses is listed with its
#    reason (tp 4 with 6 heads); context-parallel layouts (--cp 2, with --sp too) are among them; MoE adds the
#    --ep layouts, with --cp too; a budget below every layout exits 1
#    naming the smallest peak; the table is the same at --jobs 1, 5 and the default (the online
#    CPUs), and a --jobs outside [1, 1024] is refused;
#  - --machine: the h100 figures change the step time, not the model's memory; a missing file, a file
#    with a bad "compute" or "inter_node" entry are refused with a message (exit 2); an inter-node dim
#    (also a group that crosses a node boundary narrower than a node) is
#    priced by the inter-node figures (slower);
#  - --routing-imbalance 2 with --ep: more rows and bytes for the worst rank;
#  - --device cuda estimates with the CUDA kernels' figures, or (a build without them) says so and
#    uses the host's (the tool passing the note on, once);
#  - a cost model's notice (the children's first stderr line) does not replace a refusal's reason;
#    a broken one is reported by a simulated run too;
#  - --micro-batches 2: fewer activation bytes; --plan lists 2 and 4 micro-batches; a count that
#    does not divide the batch, or leaves a data rank without a sequence, refused;
#  - --config read first, the flags overriding it wherever they stand (a config's np 1 counts);
#    --flag=value as the trainer takes it (--np=4, --config=FILE, --budget=1GiB);
#  - bad flags exit 2 with a message: no --np, a flag without its value, an unknown flag, a bad
#    --budget (hexadecimal, below a byte, beyond 8 EiB in its unit), a model the library refuses
#    (6 heads of 64 features), --plan with a layout flag,
#    --estimate-rank (the tool's), --top or --jobs without --plan.
set -uo pipefail
EST=$1 TRAIN=$2
export DTENSOR_QUIET=1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail=0
check() { # DESCRIPTION CONDITION...
  local d=$1
  shift
  if "$@"; then echo "ok   $d"; else echo "FAIL $d"; fail=1; fi
}
M=(--dim 64 --layers 2 --heads 4 --seq 32 --batch 8 --vocab 64)

# one layout: the trainer's estimate of the worst rank
"$EST" --np 4 "${M[@]}" --dp 2 --tp 2 > "$W/one.txt" 2>&1
rc=$?
check "one layout exits 0 without a budget" test "$rc" = 0
check "dp 2 x tp 2 evaluates ranks 0 1 2 3" grep -q "^# ranks evaluated: 0 1 2 3;" "$W/one.txt"
worst=$(sed -n 's/.*the worst: rank \([0-9]*\) by memory.*/\1/p' "$W/one.txt")
"$TRAIN" --estimate-only --np 4 --estimate-rank "${worst:-0}" "${M[@]}" --dp 2 --tp 2 > "$W/train.txt" 2>&1
check "the worst rank's lines are the trainer's" \
  cmp -s <(grep "^peak_memory\|^estimate_step\|^traffic" "$W/one.txt") \
         <(grep "^peak_memory\|^estimate_step\|^traffic" "$W/train.txt")
"$EST" --np 3 "${M[@]}" --batch 9 --parallel fsdp > "$W/three.txt" 2>&1
check "FSDP on 3 ranks evaluates ranks 0 and 2" grep -q "^# ranks evaluated: 0 2;" "$W/three.txt"
peak=$(sed -n 's/.*(peak \([0-9.]*\) GiB).*/\1/p' "$W/one.txt")
"$EST" --np 4 "${M[@]}" --dp 2 --tp 2 --budget 1GiB > "$W/fit.txt" 2>&1
check "fits in 1 GiB: exit 0, fits=yes" bash -c "[ $? = 0 ] && grep -q '^fits=yes' '$W/fit.txt'"
"$EST" --np 4 "${M[@]}" --dp 2 --tp 2 --budget 64KiB > "$W/nofit.txt" 2>&1
rc=$?
check "does not fit in 64 KiB: exit 1, fits=no (peak $peak GiB)" \
  bash -c "[ $rc = 1 ] && grep -q '^fits=no' '$W/nofit.txt'"

# --plan
"$EST" --np 4 "${M[@]}" --heads 6 --dim 96 --plan --budget 1GiB --top 100 > "$W/plan.txt" 2>&1
rc=$?
check "--plan exits 0" test "$rc" = 0
nfit=$(grep -c "^[0-9]" "$W/plan.txt")
check "--plan: at least 6 layouts fit ($nfit)" test "$nfit" -ge 6
check "--plan: ranked by tokens/s, peaks within the budget" python3 - "$W/plan.txt" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l[:1].isdigit()]
tps = [float(r[-4]) for r in rows]
peaks = [float(r[-1]) for r in rows]
sys.exit(0 if tps == sorted(tps, reverse=True) and all(p <= 1.0 for p in peaks) else 1)
PY
# the estimates run in child processes, --jobs at once: the table does not depend on how many
"$EST" --np 4 "${M[@]}" --heads 6 --dim 96 --plan --budget 1GiB --top 100 --jobs 1 > "$W/plan_j1.txt" 2>&1
"$EST" --np 4 "${M[@]}" --heads 6 --dim 96 --plan --budget 1GiB --top 100 --jobs 5 > "$W/plan_j5.txt" 2>&1
check "--plan --jobs 1 and --jobs 5: the same table as the default" \
  bash -c "cmp -s '$W/plan.txt' '$W/plan_j1.txt' && cmp -s '$W/plan.txt' '$W/plan_j5.txt'"
for bad in 0 -1 x 1025; do
  "$EST" --np 4 "${M[@]}" --plan --jobs "$bad" > "$W/badj.txt" 2>&1
  rc=$?
  check "--jobs $bad refused: exit 2 naming it" \
    bash -c "[ $rc = 2 ] && grep -q -- '--jobs needs a count' '$W/badj.txt'"
done
check "--plan: tp 4 with 6 heads refused with the trainer's reason" \
  grep -q "refused: --dp 1 --tp 4: train: --tp 4 must divide the heads (6)" "$W/plan.txt"
check "--plan: the best layout named" grep -q "^best: " "$W/plan.txt"
check "--plan: context-parallel layouts estimated" grep -q -- "^[0-9-].* --cp 2" "$W/plan.txt"
check "--plan: context x sequence parallel layouts estimated" \
  grep -q -- "^[0-9-].* --tp 2 --cp 2 --sp --loss-parallel" "$W/plan.txt"
# (np 2 from here: fewer layouts, the same paths; the sanitizer build runs this too)
"$EST" --np 2 "${M[@]}" --model moe --experts 4 --plan > "$W/moe.txt" 2>&1
check "--plan with moe: expert-parallel layouts" grep -q -- "--ep 2" "$W/moe.txt"
"$EST" --np 4 "${M[@]}" --model moe --experts 4 --plan --top 1000 > "$W/moe4.txt" 2>&1
check "--plan with moe: expert x context parallel layouts estimated" \
  grep -q -- "^[0-9-].* --dp 1 --tp 1 --ep 2 --cp 2" "$W/moe4.txt"
"$EST" --np 2 "${M[@]}" --plan --budget 4KiB > "$W/none.txt" 2>&1
rc=$?
check "--plan under every peak: exit 1, the smallest named" \
  bash -c "[ $rc = 1 ] && grep -q 'no layout fits in 0.00 GiB: the smallest peak is' '$W/none.txt'"

# --machine
"$EST" --np 4 "${M[@]}" --parallel fsdp > "$W/cpu.txt" 2>&1
"$EST" --np 4 "${M[@]}" --parallel fsdp --machine h100 > "$W/h100.txt" 2>&1
t_cpu=$(sed -n 's/^estimate_step.*time_ms=\([0-9.]*\).*/\1/p' "$W/cpu.txt")
t_gpu=$(sed -n 's/^estimate_step.*time_ms=\([0-9.]*\).*/\1/p' "$W/h100.txt")
check "--machine h100: a shorter step ($t_gpu ms vs $t_cpu)" \
  python3 -c "import sys; sys.exit(0 if 0 < float('$t_gpu') < float('$t_cpu') else 1)"
# (communication memory may differ: the machine's cost model chooses the reductions' algorithm)
cats() { sed -n 's/^peak_memory_bytes.*\(parameters=[0-9]* gradients=[0-9]* optimizer=[0-9]* activations=[0-9]*\).*/\1/p' "$1"; }
check "--machine h100: the same parameters, gradients, optimizer state, activations" \
  bash -c "[ -n \"$(cats "$W/cpu.txt")\" ] && [ \"$(cats "$W/cpu.txt")\" = \"$(cats "$W/h100.txt")\" ]"
"$EST" --np 4 "${M[@]}" --parallel fsdp --machine "$W/missing.json" > "$W/m1.txt" 2>&1
rc=$?
check "--machine missing file: exit 2 with a message" \
  bash -c "[ $rc = 2 ] && grep -q 'not h100 or h200, and not a readable file' '$W/m1.txt'"
# bad machine files: exit 2 with the reason (inter_node checked whether or not a dim spans nodes)
bad_machine() { # DESCRIPTION JSON PATTERN
  printf '%s' "$2" > "$W/badm.json"
  "$EST" --np 4 "${M[@]}" --parallel fsdp --machine "$W/badm.json" > "$W/badm.txt" 2>&1
  local rc=$?
  check "--machine $1: exit 2 naming it" bash -c "[ $rc = 2 ] && grep -qF -- '$3' '$W/badm.txt'"
}
bad_machine "bad compute" '{"compute": {"gemm_gflops": -1}}' 'gemm_gflops'
bad_machine "bad inter_node" '{"inter_node": {"all_gather": {"base_us": 1}}}' \
  '"inter_node": "all_gather"'
bad_machine "inter_node with a misspelt key" \
  '{"inter_node": {"all_gahter": {"base_us": 1, "hop_us": 1, "bw_gbps": 1}}}' \
  'unknown key "all_gahter"'
bad_machine "inter_node bandwidth 0, no dim across nodes" \
  '{"inter_node": {"all_gather": {"base_us": 1, "hop_us": 1, "bw_gbps": 0}}}' \
  'bw_gbps = 0 out of range'
bad_machine "a repeated key" '{"compute": {"gemm_gflops": 10, "gemm_gflops": 1e30}}' 'given twice'
bad_machine "inter_node holding compute" '{"inter_node": {"compute": {"op_us": 1}}}' \
  'is not a collective priced across nodes'
"$EST" --np 4 "${M[@]}" --parallel fsdp --machine h100 --gpus-per-node 2 > "$W/inter.txt" 2>&1
t_inter=$(sed -n 's/^estimate_step.*comm_ms=\([0-9.]*\).*/\1/p' "$W/inter.txt")
t_intra=$(sed -n 's/^estimate_step.*comm_ms=\([0-9.]*\).*/\1/p' "$W/h100.txt")
check "inter-node dim: more communication time ($t_inter ms vs $t_intra)" \
  python3 -c "import sys; sys.exit(0 if float('$t_inter') > float('$t_intra') else 1)"
# a group that crosses a node boundary without spanning a node's width: tp 2 over ranks {2, 3}
# at 3 ranks a node (nodes {0, 1, 2}, {3, 4, 5}), none at 4 a node
for g in 3 4; do
  "$TRAIN" --estimate-only --np 6 --dim 64 --layers 2 --heads 4 --seq 32 --batch 6 --vocab 64 \
    --tp 2 --dp 3 --machine h100 --gpus-per-node $g > "$W/gpn$g.txt" 2>&1
done
c3=$(sed -n 's/^estimate_step rank 0:.*comm_ms=\([0-9.]*\).*/\1/p' "$W/gpn3.txt")
c4=$(sed -n 's/^estimate_step rank 0:.*comm_ms=\([0-9.]*\).*/\1/p' "$W/gpn4.txt")
check "tp {2, 3} across nodes of 3: more communication time ($c3 ms vs $c4 at 4 a node)" \
  python3 -c "import sys; sys.exit(0 if float('$c3') > float('$c4') else 1)"

# routing imbalance
E=(--np 4 "${M[@]}" --model moe --experts 4 --dp 1 --ep 4)
"$EST" "${E[@]}" > "$W/bal.txt" 2>&1
"$EST" "${E[@]}" --routing-imbalance 2 > "$W/imb.txt" 2>&1
a_bal=$(sed -n 's/^peak_memory_bytes.* activations=\([0-9]*\).*/\1/p' "$W/bal.txt")
a_imb=$(sed -n 's/^peak_memory_bytes.* activations=\([0-9]*\).*/\1/p' "$W/imb.txt")
check "--routing-imbalance 2: more activations ($a_imb vs $a_bal)" test "${a_imb:-0}" -gt "${a_bal:-0}"
"$TRAIN" --routing-imbalance 2 "${M[@]}" --steps 1 > "$W/imb_real.txt" 2>&1
check "--routing-imbalance without --estimate-only refused" grep -q "go with --estimate-only" "$W/imb_real.txt"

# micro-batches: less activation memory for the same step; --plan varies them
"$EST" --np 4 "${M[@]}" --parallel fsdp --micro-batches 2 > "$W/mb2.txt" 2>&1
a_one=$(sed -n 's/^peak_memory_bytes.* activations=\([0-9]*\).*/\1/p' "$W/cpu.txt")
a_two=$(sed -n 's/^peak_memory_bytes.* activations=\([0-9]*\).*/\1/p' "$W/mb2.txt")
check "--micro-batches 2: fewer activation bytes ($a_two vs $a_one)" \
  bash -c "[ -n '$a_two' ] && [ '$a_two' -lt '$a_one' ]"
check "--plan: layouts at 2 and 4 micro-batches" \
  bash -c "grep -q -- '--micro-batches 2' '$W/plan.txt' && grep -q -- '--micro-batches 4' '$W/plan.txt'"
"$TRAIN" --estimate-only --np 4 "${M[@]}" --parallel fsdp --micro-batches 3 > "$W/mb3.txt" 2>&1
rc=$?
check "--micro-batches 3 with --batch 8: refused (exit 2)" \
  bash -c "[ $rc = 2 ] && grep -q 'must divide --batch 8' '$W/mb3.txt'"
"$TRAIN" --estimate-only --np 4 "${M[@]}" --parallel fsdp --micro-batches 4 > "$W/mb4.txt" 2>&1
rc=$?
check "--micro-batches 4 leaves 2 sequences for 4 ranks: refused (exit 2)" \
  bash -c "[ $rc = 2 ] && grep -q 'batch 8 / --micro-batches 4 (= 2 sequences a pass) is smaller' '$W/mb4.txt'"

# sizes past what the estimate handles in seconds (it took minutes, or every byte of memory):
# refused at once with the range
timeout 30 "$EST" --np 16777216 > "$W/np.txt" 2>&1
rc=$?
check "--np 16777216: refused (exit 2) with the range" \
  bash -c "[ $rc = 2 ] && grep -q 'np must be an integer in \[1, 1048576\]' '$W/np.txt'"
timeout 30 "$EST" --np 2 --layers 65536 > "$W/layers.txt" 2>&1
rc=$?
check "--layers 65536: refused (exit 2) with the range" \
  bash -c "[ $rc = 2 ] && grep -q 'layers must be an integer in \[1, 4096\]' '$W/layers.txt'"

# --device cuda: the CUDA kernels' figures where the build has them, else the host's, said once
"$TRAIN" --estimate-only --np 2 "${M[@]}" --parallel fsdp --device cuda > "$W/dev.txt" 2>&1
rc=$?
check "--device cuda estimates (exit 0, a peak line)" \
  bash -c "[ $rc = 0 ] && grep -q '^peak_memory_bytes rank 0:' '$W/dev.txt'"
check "--device cuda: either no note, or the no-CUDA-kernels one" \
  bash -c "! grep -q '^train: --device' '$W/dev.txt' || grep -q 'no cuda kernels to simulate.*host kernels' '$W/dev.txt'"
"$EST" --np 2 "${M[@]}" --parallel fsdp --device cuda > "$W/devt.txt" 2> "$W/devt.err"
check "dtensor-estimate --device cuda: the trainer's note passed on (once) where it has one" \
  bash -c "! grep -q '^train: --device' '$W/dev.txt' || [ \$(grep -c 'no cuda kernels to simulate' '$W/devt.err') = 1 ]"

# a loaded cost model's notice (the children's first stderr line) neither hides a refusal's
# reason nor repeats per child
echo '{"compute": {"gemm_gflops": 50}}' > "$W/cm.json"
env -u DTENSOR_QUIET DTENSOR_COST_MODEL="$W/cm.json" "$EST" --np 4 "${M[@]}" --tp 3 > "$W/cm1.txt" 2>&1
rc=$?
check "with a cost model loaded, a refusal exits 2 with the trainer's reason" \
  bash -c "[ $rc = 2 ] && grep -q 'dtensor-estimate: train: .*the world has 4' '$W/cm1.txt'"
env -u DTENSOR_QUIET DTENSOR_COST_MODEL="$W/cm.json" "$EST" --np 4 "${M[@]}" --heads 6 --dim 96 \
  --plan --top 1 > "$W/cm2.txt" 2>&1
check "with a cost model loaded, --plan's refusals give the trainer's reasons" \
  grep -q "refused: --dp 1 --tp 4: train: --tp 4 must divide the heads" "$W/cm2.txt"
check "with a cost model loaded, its notice is printed once" \
  test "$(grep -c 'calibrated cost model' "$W/cm2.txt")" = 1
echo '{"compute": ' > "$W/bad.json"
env -u DTENSOR_QUIET DTENSOR_COST_MODEL="$W/bad.json" "$TRAIN" --estimate-only --np 2 "${M[@]}" \
  > "$W/cm3.txt" 2>&1
check "a simulated run says it ignores a broken cost model, as dt_init does" \
  grep -q "ignoring calibrated cost model: .*bad.json" "$W/cm3.txt"
env -u DTENSOR_QUIET DTENSOR_COST_MODEL="$W/bad.json" "$TRAIN" --estimate-only --np 4 \
  --estimate-rank 3 "${M[@]}" > "$W/cm4.txt" 2>&1
check "... on any simulated rank (each is alone in its process)" \
  grep -q "ignoring calibrated cost model" "$W/cm4.txt"
# a FIFO as the per-user default is reported, not opened (it would block dt_init)
mkdir -p "$W/fhome/.cache/dtensor" && mkfifo "$W/fhome/.cache/dtensor/cost_model.json"
env -u DTENSOR_QUIET -u DTENSOR_COST_MODEL HOME="$W/fhome" timeout 60 "$TRAIN" --estimate-only \
  --np 2 "${M[@]}" > "$W/cm5.txt" 2>&1
rc=$?
check "a FIFO as the per-user cost model: the run ends (rc $rc), saying it is not a regular file" \
  bash -c "[ $rc = 0 ] && grep -q 'not a regular file' '$W/cm5.txt'"
# the trainer's --device note (a build without CUDA kernels prints one) does not hide a refusal
"$EST" --np 4 "${M[@]}" --device cuda --tp 3 > "$W/dev3.txt" 2>&1
rc=$?
check "--device cuda --tp 3: exit 2 with the trainer's reason" \
  bash -c "[ $rc = 2 ] && grep -q 'dtensor-estimate: train: .*the world has 4' '$W/dev3.txt'"

# --config is read first and the flags override it wherever they stand (as the trainer does)
printf '{"np": 2, "dim": 64, "layers": 2, "heads": 4, "seq": 32, "batch": 8, "vocab": 64}' > "$W/np2.json"
"$EST" --np 8 --config "$W/np2.json" > "$W/cfg1.txt" 2>&1
check "--np 8 before a config of np 2: ranks 0 and 7 evaluated" grep -q "^# ranks evaluated: 0 7;" "$W/cfg1.txt"
printf '{"np": 1, "dim": 64, "layers": 2, "heads": 4, "seq": 32, "batch": 8, "vocab": 64}' > "$W/np1.json"
"$EST" --config "$W/np1.json" > "$W/cfg2.txt" 2>&1
check "a config's np 1 is an --np" grep -q "^# ranks evaluated: 0;" "$W/cfg2.txt"
# --flag=value, as the trainer takes it (it was an unknown flag): the same as --flag value
"$EST" --np=4 --config="$W/np2.json" --dim=64 --checkpoint=1 --budget=1GiB > "$W/eq1.txt" 2>&1
rc=$?
check "--np=4 --config=FILE --checkpoint=1 --budget=1GiB: exit 0, ranks 0 and 3, fits" \
  bash -c "[ $rc = 0 ] && grep -q '^# ranks evaluated: 0 3;' '$W/eq1.txt' && grep -q '^fits=yes' '$W/eq1.txt'"
"$EST" --np=x > "$W/eq2.txt" 2>&1
rc=$?
check "--np=x: exit 2 naming the value" \
  bash -c "[ $rc = 2 ] && grep -q 'np must be an integer .* got .x.' '$W/eq2.txt'"

# bad flags
for args in "${M[*]}" "--np 4 --plan --loss-parallel" "--np" "--np 4 --budget" "--np 4 --dim" \
    "--np 4 --bogus 1" "--np 4 --budget lots" "--np 4 --budget 1e308TiB" "--np 4 --budget 0x10GiB" \
    "--np 4 --budget 0.5" "--np 4 --plan --tp 2" "--np 4 --estimate-rank 1" \
    "--np 4 --routing-imbalance 0.5" "--np 2 --dim 64 --heads 6 --seq 32 --batch 8 --vocab 64" \
    "--np 4 --top 3" "--np 4 --jobs 2"; do
  # shellcheck disable=SC2086
  "$EST" $args > "$W/bad.txt" 2>&1
  rc=$?
  check "bad flags '$args': exit 2 with a message" \
    bash -c "[ $rc = 2 ] && [ -s '$W/bad.txt' ]"
done
[ "$fail" = 0 ] && echo "plan: every check passed"
exit "$fail"
