#!/usr/bin/env bash
# tools_cli.sh TRAIN EXPLAIN CALIBRATE COST_NOTICE MPIEXEC - the command-line tools:
#   --help of train, dtensor-explain (and its subcommands) and dtensor-calibrate exits 0 without
#   mpirun and lists the flags on stdout; a bad flag exits 2 (-o checked before measuring: an empty
#   or overlong name, a path it cannot write); train's --data refuses a directory, FIFO or device;
#   --config at the end, without its file, is a bad flag, and so is --resume without
#   --checkpoint-dir, --np or --estimate-rank without --estimate-only; a --metrics or --plot path
#   that cannot be written is refused before training (exit 2 on every rank);
#   dtensor-calibrate writes only the -o FILE: nothing in $HOME without it; an implausible fit
#   (forced oversubscription: DTENSOR_CALIBRATE_CPUS=1 on 2 ranks) is refused with exit 3 and
#   nothing written, and written with --force, its "compute" model too (positive rates, printed);
#   --compute-only on one rank measures only the compute model and keeps the loaded collectives;
#   its op cost and bandwidth are fitted to training steps (given step times come back as the
#   figures they were made of; steps faster than their FLOPs keep the isolated measurements);
#   dt_init says on rank 0 (once) which cost model it loaded: $DTENSOR_COST_MODEL or the per-user
#   default, and nothing under DTENSOR_QUIET=1 or DTENSOR_COST_MODEL=none.
set -euo pipefail
train=$1 explain=$2 calib=$3 notice=$4 mpiexec=$5
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "tools_cli: FAIL: $*" >&2; exit 1; }
mpi() { "$mpiexec" --allow-run-as-root --oversubscribe "$@"; }
# expect RC CMD...: runs CMD (stdout to $tmp/out, stderr to $tmp/err), fails unless it exits RC
expect() {
  local want=$1 rc=0
  shift
  "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
  if [ "$rc" -ne "$want" ]; then
    cat "$tmp/out" "$tmp/err" >&2
    fail "'$*' exited $rc, expected $want"
  fi
}
lists() { # name, then strings the last stdout must contain
  local name=$1
  shift
  for s in "$@"; do grep -qF -- "$s" "$tmp/out" || fail "$name does not list '$s'"; done
}

echo "== --help"
expect 0 "$train" --help
lists "train --help" --steps --kv-heads --parallel --reshard-after-forward --checkpoint --device \
  --config "(default: 1000)" "JSON config" kv_heads reshard_after_forward "*.wq=S(0)"
[ -s "$tmp/err" ] && fail "train --help wrote to stderr"
expect 0 "$train" -h
expect 0 "$explain" --help
lists "dtensor-explain --help" --mesh --shape --from --to --dtype --flatten --greedy --visualize \
  --cost-model --json --arg --all --in
for sub in redistribute op ops; do
  expect 0 "$explain" "$sub" --help
  lists "dtensor-explain $sub --help" --mesh
done
expect 0 "$calib" --help
lists "dtensor-calibrate --help" "-o FILE" "-e MAX_BYTES" --force "cost_model.json"
expect 2 "$calib" --bogus
expect 2 "$calib" -e lots
expect 2 "$calib" -e 100 # below the smallest size timed: refused, not raised silently
grep -qF "[65536, 2^30], got '100'" "$tmp/err" || fail "calibrate -e 100: $(cat "$tmp/err")"
# -o checked before measuring: an empty or overlong name, a path through a file, a directory
expect 2 "$calib" -o ""
expect 2 "$calib" -o "/tmp/$(printf 'a%.0s' $(seq 1 1100))"
touch "$tmp/plain"
expect 2 "$calib" -o "$tmp/plain/model.json"
grep -q "cannot write there: Not a directory" "$tmp/err" || fail "calibrate -o through a file: $(cat "$tmp/err")"
expect 2 "$calib" -o "$tmp"
expect 2 "$calib" -o "$tmp/newdir/sub/"
[ -e "$tmp/newdir" ] && fail "a refused -o created $tmp/newdir"
expect 2 mpi -np 1 "$train" --bogus-flag
grep -q -- "--help" "$tmp/err" || fail "train's bad-flag message does not point at --help"
expect 2 "$train" --stesp 3 # a typo names the flag meant
grep -qF -- "unknown flag (did you mean --steps?)" "$tmp/err" || fail "no suggestion: $(cat "$tmp/err")"
expect 2 "$train" --steps # a flag that takes a value, at the end
grep -qF "a value must follow it" "$tmp/err" || fail "--steps without a value: $(cat "$tmp/err")"
expect 2 "$train" --steps=x # --flag=value is checked as --flag value is
grep -qF "steps must be an integer" "$tmp/err" || fail "--steps=x: $(cat "$tmp/err")"
expect 0 mpi -np 1 "$train" --steps=2 --dim=32 --layers=1 --batch=4 --seq=8
grep -q "^step *1 " "$tmp/out" || fail "--steps=2 did not run 2 steps: $(cat "$tmp/out")"
# --profile: rank 0's op profile of the steps after the first, the losses unchanged
expect 0 mpi -np 2 "$train" --steps 3 --dim 32 --layers 2 --batch 8 --seq 16 --parallel fsdp
ref=$(grep "^step *2 " "$tmp/out" | awk '{print $4}')
expect 0 mpi -np 2 "$train" --steps 3 --dim 32 --layers 2 --batch 8 --seq 16 --parallel fsdp --profile
grep -q "^# op profile: " "$tmp/out" || fail "--profile printed no table: $(cat "$tmp/out")"
[ "$(grep -c "^# op profile: " "$tmp/out")" = 1 ] || fail "--profile: a table per rank"
# 2 profiled steps x (2 layers x 7 linears + the output): 30 linears, 30 backward rules, each
# one product for the input's gradient (mm) and one for the weight's (mm_t)
for op in linear_nobias linear_nobias.backward mm mm_t; do
  grep -Eq "^  $op +30 " "$tmp/out" || fail "--profile: not 30 $op calls: $(cat "$tmp/out")"
done
grep -Eq "^  work_wait +[0-9]+ " "$tmp/out" || fail "--profile: no communication wait under FSDP"
[ "$(grep "^step *2 " "$tmp/out" | awk '{print $4}')" = "$ref" ] || fail "--profile changed the loss"
# --data: a file's bytes; a directory, a FIFO or a device is refused (exit 2), not read (a
# directory's length was LONG_MAX to allocate, a FIFO blocked the open)
mkdir -p "$tmp/datadir"
mkfifo "$tmp/datafifo"
for bad in "$tmp/datadir" "$tmp/datafifo" /dev/null; do
  expect 2 timeout 60 "$train" --steps 1 --dim 16 --layers 1 --batch 2 --seq 4 --data "$bad"
  grep -qF "$bad is not a regular file" "$tmp/err" || fail "--data $bad: $(cat "$tmp/err")"
done
expect 2 "$train" --steps 1 --config # the config file's name, at the end
grep -qF "'--config': a value must follow it" "$tmp/err" || fail "--config without a value: $(cat "$tmp/err")"
expect 2 "$train" --steps 1 --resume # nothing to resume from
grep -qF -- "--resume continues from the newest checkpoint in --checkpoint-dir" "$tmp/err" ||
  fail "--resume without --checkpoint-dir: $(cat "$tmp/err")"
for flag in "--np 4" "--estimate-rank 1"; do # the simulated world's, without --estimate-only
  # shellcheck disable=SC2086
  expect 2 "$train" --steps 1 $flag
  grep -qF -- "go with --estimate-only" "$tmp/err" || fail "$flag in a real run: $(cat "$tmp/err")"
done
# --metrics, --plot and --checkpoint-dir: a path rank 0 cannot write is refused before training,
# every rank exiting 2 (a run ended without its metrics, gnuplot drew the PNG to stdout, a
# checkpoint directory under a file failed only after the last step)
mkdir -p "$tmp/outdir"
touch "$tmp/afile"
for bad in "--metrics $tmp/nodir/m.jsonl" "--metrics $tmp/outdir" "--plot $tmp/nodir/loss.png" \
  "--checkpoint-dir $tmp/afile/ck"; do
  # shellcheck disable=SC2086
  expect 2 mpi -np 2 "$train" --steps 1 --dim 16 --layers 1 --batch 2 --seq 4 $bad
  [ "$(grep -cF -- "${bad%% *} ${bad#* }: cannot write there" "$tmp/err")" = 1 ] ||
    fail "$bad: $(cat "$tmp/err")"
  [ -s "$tmp/out" ] && fail "$bad: a refused run wrote to stdout: $(head -c 300 "$tmp/out")"
done
[ -e "$tmp/nodir" ] && fail "a refused --metrics created $tmp/nodir"
# --freeze: the same losses under every data-parallel wrapper (frozen parameters neither
# gathered into gradients nor stepped), other than the unfrozen run's, and for frozen experts
# under expert parallelism; AdamW holds no moments for
# the frozen ones; a pattern that matches nothing is a usage error
small=(--steps 3 --dim 32 --layers 2 --batch 8 --seq 16)
loss2() { grep "^step *2 " "$tmp/out" | awk '{print $4}'; }
expect 0 mpi -np 2 "$train" "${small[@]}" --freeze "tok_emb,layers.0.*"
grep -q "^# frozen (--freeze tok_emb,layers.0.\*): 10 parameters" "$tmp/out" ||
  fail "no frozen line: $(cat "$tmp/out")"
ref=$(loss2)
for par in fsdp ddp; do
  expect 0 mpi -np 2 "$train" "${small[@]}" --parallel "$par" --freeze "tok_emb,layers.0.*"
  [ -n "$ref" ] && [ "$(loss2)" = "$ref" ] || fail "--freeze under $par: loss $(loss2), not $ref"
done
expect 0 mpi -np 2 "$train" "${small[@]}"
[ "$(loss2)" != "$ref" ] || fail "--freeze changed nothing (loss $ref either way)"
# frozen experts under expert parallelism (--ep puts new Shard(0) leaves in their place) stay
# frozen: the losses of the run without --ep (they used to train, as if not frozen)
expect 0 mpi -np 2 "$train" "${small[@]}" --model moe --freeze "*.experts.*"
mref=$(loss2)
expect 0 mpi -np 2 "$train" "${small[@]}" --model moe --ep 2 --freeze "*.experts.*"
[ -n "$mref" ] && [ "$(loss2)" = "$mref" ] || fail "--freeze of experts under --ep 2: loss $(loss2), not $mref"
est() { grep "^peak_memory_bytes rank 0" "$tmp/out" | sed 's/.*optimizer=\([0-9]*\).*/\1/'; }
expect 0 "$train" --estimate-only --np 2 --steps 1 --parallel fsdp
all=$(est)
expect 0 "$train" --estimate-only --np 2 --steps 1 --parallel fsdp --freeze "layers.*"
[ -n "$all" ] && [ "$(est)" -lt "$all" ] || fail "frozen moments: optimizer $(est), not below $all"
expect 2 mpi -np 2 "$train" "${small[@]}" --freeze "layrs.*"
grep -qF "pattern 'layrs.*' matches no parameter" "$tmp/err" || fail "--freeze typo: $(cat "$tmp/err")"
expect 2 "$train" --freeze "tok_emb,,norm"
expect 2 mpi -np 2 "$train" "${small[@]}" --freeze "*"
grep -qF "leaves no parameter to train" "$tmp/err" || fail "--freeze '*': $(cat "$tmp/err")"
# resumed without the --freeze it was saved with: the missing AdamW state says so (exit 2)
expect 0 mpi -np 2 "$train" "${small[@]}" --freeze "tok_emb" --checkpoint-dir "$tmp/fz"
expect 2 mpi -np 2 "$train" "${small[@]}" --steps 4 --resume --checkpoint-dir "$tmp/fz"
grep -qF "resume with the --freeze it was saved with" "$tmp/err" || fail "resume: $(cat "$tmp/err")"
grep -q "MPI_ABORT" "$tmp/err" && fail "the resume aborted the job: $(cat "$tmp/err")"
# tied: one (V, D) table under two names, frozen by either pattern that lists it (tok_emb)
expect 0 mpi -np 2 "$train" "${small[@]}" --tie-embeddings --freeze "tok_emb"
grep -q "^# frozen (--freeze tok_emb): 1 parameters" "$tmp/out" || fail "tied freeze: $(cat "$tmp/out")"
# a model config the library refuses: one message and exit 2 on every rank, no MPI_Abort
expect 2 mpi -np 2 "$train" --heads 3 --steps 1
[ "$(grep -c "head dim must be a whole even number" "$tmp/err")" = 1 ] ||
  fail "--heads 3 at np 2: $(cat "$tmp/err")"
grep -q "MPI_ABORT" "$tmp/err" && fail "--heads 3 aborted the job: $(cat "$tmp/err")"

echo "== dtensor-calibrate writes only -o FILE"
mkdir -p "$tmp/home"
expect 0 env -u DTENSOR_COST_MODEL HOME="$tmp/home" DTENSOR_CALIBRATE_CPUS=2x "$mpiexec" \
  --allow-run-as-root --oversubscribe -np 2 "$calib" -e 65536
[ "$(grep -c "ignoring DTENSOR_CALIBRATE_CPUS=2x" "$tmp/err")" = 1 ] ||
  fail "calibrate took DTENSOR_CALIBRATE_CPUS=2x without a notice: $(cat "$tmp/err")"
grep -q "not written" "$tmp/out" || fail "calibrate without -o does not say it wrote nothing"
left=$(find "$tmp/home" -mindepth 1)
[ -z "$left" ] || fail "calibrate without -o wrote into \$HOME: $left"
expect 3 env DTENSOR_CALIBRATE_CPUS=1 DTENSOR_COST_MODEL=none "$mpiexec" --allow-run-as-root \
  --oversubscribe -np 2 "$calib" -e 65536 -o "$tmp/m/model.json"
grep -q "oversubscribed: 2 ranks on 1 usable cores" "$tmp/err" || fail "no oversubscription warning"
[ -e "$tmp/m/model.json" ] && fail "a refused fit was written"
expect 0 env DTENSOR_CALIBRATE_CPUS=1 DTENSOR_COST_MODEL=none "$mpiexec" --allow-run-as-root \
  --oversubscribe -np 2 "$calib" -e 65536 -o "$tmp/m/model.json" --force
grep -q "oversubscribed" "$tmp/err" || fail "--force hides the warning"
[ -s "$tmp/m/model.json" ] || fail "--force did not write $tmp/m/model.json"
# the compute model of simulated step times, measured with the collectives: positive figures
# (attention's rate too: 0 would mean "the GEMM rate", i.e. not measured)
/usr/bin/python3 - "$tmp/m/model.json" <<'PY' || fail "the fit has no plausible \"compute\" entry"
import json, sys
c = json.load(open(sys.argv[1]))["compute"]
rates = ("gemm_gflops", "gemm_bf16_gflops", "mem_gbps", "attn_gflops")
ok = all(c[k] > 0 for k in rates) and c["op_us"] >= 0
ok = ok and 0.0 <= c["comm_overlap"] <= 1.0  # measured: 2 ranks on the host
sys.exit(0 if ok else 1)
PY
grep -q "^compute: op_us" "$tmp/out" || fail "calibrate does not print the compute model"
grep -q "comm_overlap [0-9.]* (an all-gather beside small ops)" "$tmp/out" ||
  fail "calibrate on 2 host ranks does not measure comm_overlap"
# --nccl: on a host backend it needs a GPU (exit 1, a message); a dry run on the emulated GPU
# (NCCL emulated over MPI) adds an "nccl" object and keeps the rest of the loaded model
rc=0
DTENSOR_BACKEND=cpu "$mpiexec" --allow-run-as-root --oversubscribe -np 2 "$calib" --nccl \
  -e 65536 >"$tmp/out" 2>"$tmp/err" || rc=$?
# no GPU: no cuda backend (1); a GPU shared by both ranks: not on NCCL (3)
{ [ "$rc" = 1 ] || [ "$rc" = 3 ]; } && grep -q -- "--nccl" "$tmp/err" ||
  fail "calibrate --nccl without a GPU per rank: rc $rc, $(cat "$tmp/err")"
if [ "${DT_HAVE_EMU:-0}" = 1 ]; then
  expect 0 env DTENSOR_BACKEND=cuda-emu DTENSOR_COST_MODEL="$tmp/m/model.json" "$mpiexec" \
    --allow-run-as-root --oversubscribe -np 2 "$calib" --nccl -e 65536 -o "$tmp/m/nccl.json" --force
  /usr/bin/python3 - "$tmp/m/model.json" "$tmp/m/nccl.json" <<'PY' || fail "the --nccl fit is wrong"
import json, sys
host, both = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
n = both["nccl"]
ok = sorted(n) == ["all_gather", "all_reduce", "all_to_all", "reduce_scatter"]
ok = ok and all(n[k]["bw_gbps"] > 0 and n[k]["base_us"] >= 0 for k in n)
ok = ok and all(both[k] == host[k] for k in host)  # the loaded model kept as it was
sys.exit(0 if ok else 1)
PY
fi

# --compute-only: one rank is enough; the compute model measured, the loaded collectives kept
expect 2 "$calib" --compute-only --nccl
grep -q "exclude each other" "$tmp/err" || fail "--compute-only --nccl: no reason given"
expect 0 env DTENSOR_COST_MODEL="$tmp/m/model.json" "$mpiexec" --allow-run-as-root \
  --oversubscribe -np 1 "$calib" --compute-only --force -o "$tmp/m/compute.json"
grep -q "^compute: op_us" "$tmp/out" || fail "--compute-only does not print the compute model"
grep -q "^all_gather" "$tmp/out" && fail "--compute-only timed the collectives"
/usr/bin/python3 - "$tmp/m/model.json" "$tmp/m/compute.json" <<'PY' || fail "the --compute-only file is wrong"
import json, sys
host, new = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
ok = all(new[k] == host[k] for k in host if k != "compute")  # the loaded collectives kept
c = new["compute"]
ok = ok and c["comm_overlap"] == host["compute"]["comm_overlap"]  # one rank: kept as loaded
ok = ok and all(c[k] > 0 for k in ("gemm_gflops", "gemm_bf16_gflops", "mem_gbps", "attn_gflops"))
sys.exit(0 if ok else 1)
PY

# op_us and mem_gbps are fitted to four training steps; $DTENSOR_CALIBRATE_STEP_US replaces the
# measured step times: times made of 2000 us per op and 0.01 GB/s (the steps' own counts, which
# the output prints) give those figures back; times shorter than the steps' FLOPs leave the
# isolated add's figures; a malformed list is refused before measuring (exit 2)
grep -q "^# steps: op_us .* fitted to 4 training steps" "$tmp/out" || fail "no step fit printed"
times=$(/usr/bin/python3 - "$tmp/out" <<'PY'
import re, sys
rows = re.findall(r"\((\d+) ops, (\d+) bytes, (\d+) FLOPs\)", open(sys.argv[1]).read())
assert len(rows) == 4 and all(int(o) > 0 and int(b) > 0 for o, b, f in rows), rows
print(",".join("%.1f" % (int(o) * 2000.0 + int(b) / 10.0) for o, b, f in rows))
PY
) || fail "the step lines lack their counts"
expect 0 env DTENSOR_CALIBRATE_STEP_US="$times" DTENSOR_COST_MODEL="$tmp/m/model.json" \
  "$mpiexec" --allow-run-as-root --oversubscribe -np 1 "$calib" --compute-only --force \
  -o "$tmp/m/steps.json"
/usr/bin/python3 - "$tmp/m/steps.json" <<'PY' || fail "the step fit did not recover 2000 us and 0.01 GB/s: $(grep steps: "$tmp/out")"
import json, sys
c = json.load(open(sys.argv[1]))["compute"]
sys.exit(0 if abs(c["op_us"] / 2000.0 - 1) < 0.03 and abs(c["mem_gbps"] / 0.01 - 1) < 0.03 else 1)
PY
expect 0 env DTENSOR_CALIBRATE_STEP_US=1,1,1,1 DTENSOR_COST_MODEL=none "$mpiexec" \
  --allow-run-as-root --oversubscribe -np 1 "$calib" --compute-only --force
iso=$(sed -n 's/.*(the isolated add: op_us \([0-9.]*\), mem_gbps \([0-9.]*\)).*/\1 \2/p' "$tmp/out")
got=$(sed -n 's/^compute: op_us \([0-9.]*\), mem_gbps \([0-9.]*\),.*/\1 \2/p' "$tmp/out")
[ -n "$iso" ] && [ "$iso" = "$got" ] || fail "steps faster than their FLOPs: '$got', not the isolated '$iso'"
expect 2 env DTENSOR_CALIBRATE_STEP_US=1,2 "$calib" --compute-only
grep -q "DTENSOR_CALIBRATE_STEP_US needs 4 positive step times" "$tmp/err" || fail "a bad step list: $(cat "$tmp/err")"

echo "== where dt_init's cost model came from"
notice_lines() { grep -c "calibrated cost model" "$tmp/err" || true; }
expect 0 env DTENSOR_COST_MODEL="$tmp/m/model.json" "$mpiexec" --allow-run-as-root \
  --oversubscribe -np 2 "$notice"
[ "$(notice_lines)" = 1 ] || { cat "$tmp/err"; fail "expected one notice line (rank 0)"; }
grep -qF "$tmp/m/model.json (\$DTENSOR_COST_MODEL)" "$tmp/err" || fail "the notice names no file"
mkdir -p "$tmp/home/.cache/dtensor"
cp "$tmp/m/model.json" "$tmp/home/.cache/dtensor/cost_model.json"
expect 0 env -u DTENSOR_COST_MODEL HOME="$tmp/home" "$mpiexec" --allow-run-as-root \
  --oversubscribe -np 2 "$notice"
grep -q "cost_model.json (the per-user default" "$tmp/err" || fail "no notice of the per-user model"
expect 0 env -u DTENSOR_COST_MODEL HOME="$tmp/home" DTENSOR_QUIET=1 "$mpiexec" --allow-run-as-root \
  --oversubscribe -np 2 "$notice"
[ "$(notice_lines)" = 0 ] || fail "DTENSOR_QUIET=1 still prints the notice"
expect 0 env DTENSOR_COST_MODEL=none HOME="$tmp/home" "$mpiexec" --allow-run-as-root \
  --oversubscribe -np 2 "$notice"
[ "$(notice_lines)" = 0 ] || fail "DTENSOR_COST_MODEL=none still loads a model"
echo "tools_cli: ok"
