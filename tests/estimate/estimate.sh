#!/usr/bin/env bash
# estimate.sh TRAIN MPIEXEC [WORKDIR] - the simulated run (train --estimate-only: dt_init_simulated,
# the meta backend, simulated communicators) against real runs of the same configurations: for
# each, `train --steps 2` under mpirun, then `train --estimate-only --np N --estimate-rank R` for
# every rank R, compared by compare.py (every rank's peak memory per category within 3 %, rank 0's
# traffic per mesh dim equal byte for byte). Dense and MoE models, f32 and bf16 parameters, with and
# without activation checkpointing; none (tensor parallel by the plan), DDP, FSDP with
# reshard_after_forward 1, 0 and 2, HSDP, TP, TP+SP, FSDP x TP with checkpointing, TP and FSDP
# at sequence 256 and 128 (the attention kernels' scratch grows as its square), and (routed:
# the simulation takes the routing as balanced, so 25 % and calls only) EP and FSDP x TP x EP;
# context parallelism (CP alone, also with DTENSOR_SDPA_PATH=flash; FSDP x CP, CP x TP with
# checkpointing, EP x CP); asynchronous TP.
# A real run's communication peak depends on when its asynchronous collectives complete (FSDP's
# prefetch): it may lie between the estimate and the estimate with DTENSOR_SIM_COMPLETE=wait (a
# rank that lags sees every collective complete late); when it is outside even so, the real run
# is repeated (up to 3 runs), and the runs it took are printed.
set -euo pipefail
TRAIN=$1 MPI=$2 W=${3:-$(mktemp -d)}
mkdir -p "$W"
export DTENSOR_QUIET=1 OPENBLAS_NUM_THREADS=1
COMMON=(--steps 2 --dim 32 --layers 2 --batch 16 --seq 16)
# ESTIMATE_ARGS: more trainer flags for every run and estimate (e.g. "--device cuda": the estimate
# against device memory; tools/gpu_check.sh)
read -r -a extra <<< "${ESTIMATE_ARGS:-}"
COMMON+=("${extra[@]}")
device="" # a --device run: the communication peak may also be as low as complete-at-first-test
[[ " ${extra[*]} " == *" --device "* ]] && ! [[ " ${extra[*]} " == *" --device cpu "* ]] && device=1
fail=0 n=0
run() { # NP [--routed] ARGS...
  local np=$1
  shift
  # ESTIMATE_MAX_NP: only the configurations of at most that many ranks (the sanitizers: CI's time)
  [ "$np" -le "${ESTIMATE_MAX_NP:-8}" ] || return 0
  local routed=""
  if [ "$1" = "--routed" ]; then routed=--routed; shift; fi
  local tag
  tag=$(echo "np$np $*" | tr -c 'A-Za-z0-9' '_')
  local ests=() lates=() earlies=()
  for ((r = 0; r < np; r++)); do
    "$TRAIN" --estimate-only --np "$np" --estimate-rank "$r" "${COMMON[@]}" "$@" > "$W/$tag.est$r" 2>&1 ||
      { echo "estimate np $np rank $r $* failed:"; tail -5 "$W/$tag.est$r"; fail=1; return; }
    DTENSOR_SIM_COMPLETE=wait "$TRAIN" --estimate-only --np "$np" --estimate-rank "$r" "${COMMON[@]}" "$@" \
      > "$W/$tag.late$r" 2>&1 || { echo "estimate (late) np $np rank $r $* failed"; fail=1; return; }
    ests+=("$W/$tag.est$r")
    lates+=("$W/$tag.late$r")
    if [ -n "$device" ]; then # a device's collectives may complete as soon as tested (NCCL's
      # finish on their stream; the emulated GPU's before the call returns)
      DTENSOR_SIM_COMPLETE=now "$TRAIN" --estimate-only --np "$np" --estimate-rank "$r" "${COMMON[@]}" \
        "$@" > "$W/$tag.early$r" 2>&1 || { echo "estimate (early) np $np rank $r $* failed"; fail=1; return; }
      earlies+=("$W/$tag.early$r")
    fi
  done
  local try ok=0
  for try in 1 2 3; do
    "$MPI" --allow-run-as-root --oversubscribe -np "$np" "$TRAIN" "${COMMON[@]}" "$@" > "$W/$tag.real" 2>&1 ||
      { echo "run np $np $* failed:"; tail -5 "$W/$tag.real"; fail=1; return; }
    if python3 "$(dirname "$0")/compare.py" $routed "$W/$tag.real" "${ests[@]}" -- "${lates[@]}" \
        ${device:+-- "${earlies[@]}"} > "$W/$tag.cmp" 2>&1; then
      ok=1
      break
    fi
    # only the communication peak may differ between runs (timing); anything else is a failure
    grep -q "rank [0-9]*: \(parameters\|gradients\|optimizer\|activations\|other\) \|traffic differs" "$W/$tag.cmp" && break
  done
  n=$((n + 1))
  if [ $ok = 1 ]; then
    echo "np $np $* ${routed:+(routed) }: $(tail -1 "$W/$tag.cmp") [real runs: $try]"
  else
    echo "np $np $* ${routed:+(routed) }: DIFFERS"
    cat "$W/$tag.cmp"
    fail=1
  fi
}
run 1 --parallel none
run 2 --parallel none
run 2 --parallel ddp
run 2 --parallel fsdp
run 2 --parallel fsdp --reshard-after-forward 0
run 4 --parallel fsdp --reshard-after-forward 2
run 2 --parallel fsdp --param-dtype bf16 --checkpoint
run 4 --parallel hsdp --mesh 2x2
run 2 --tp 2
run 2 --tp 2 --sp --loss-parallel
run 2 --tp 2 --sp --async-tp # asynchronous TP: the rings' scratch and send_recv traffic
run 4 --dp 2 --tp 2 --sp --async-tp --param-dtype bf16 # gather rings in bf16, scatter rings in f32 (bf16: FSDP over dp)
run 4 --dp 2 --tp 2 --sp --checkpoint
run 2 --model moe --parallel fsdp
run 2 --tp 2 --seq 256 --batch 4 # long sequences: the attention kernels' score scratch
run 2 --parallel fsdp --seq 128 --batch 4 --checkpoint
run 2 --routed --model moe --ep 2
run 8 --routed --model moe --dp 2 --tp 2 --ep 2 --sp
run 2 --cp 2 --seq 64 --batch 4 # context parallelism: ring attention's block scratch and transfers
run 2 --cp 2 --seq 64 --batch 4 --param-dtype bf16 # k and v around the ring in bf16
# the blocks in the fused flash kernels (a device: no block scratch; the host: the same as above)
DTENSOR_SDPA_PATH=flash run 2 --cp 2 --seq 128 --batch 2 --checkpoint
run 4 --dp 2 --cp 2 --seq 64 --batch 4 # context parallelism: ring attention's blocks and transfers
run 4 --cp 2 --tp 2 --seq 64 --batch 4 --checkpoint
run 4 --cp 2 --tp 2 --sp --loss-parallel --seq 64 --batch 4 # the cp ranks' rows sequence-sharded over tp
run 4 --routed --model moe --ep 2 --cp 2 --seq 64 --batch 4 # experts over ep, attention's ring over cp
[ $fail = 0 ] && echo "estimate: $n configurations, every one as the real run"
exit $fail
