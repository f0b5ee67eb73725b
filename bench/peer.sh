#!/usr/bin/env bash
# peer.sh - ours against PyTorch 2.x (the measured peer of issue 21: tools/peer-env.sh's pinned
# torch, CPU, gloo) in every peer benchmark, ours and theirs alternating within one run:
#   dispatch       bench_dispatch --peer vs bench/peer_dispatch.py: `a + a` on a Shard(0) 512x512
#                  f32, cache hit and miss (a new shape every call; theirs also with its sharding
#                  propagation caches cleared every call)
#   redistribute   bench_redistribute vs bench/peer_redistribute.py (DTensor.redistribute): every
#                  transition at 4 KiB .. 16 MiB (factor 16). Ours over Open MPI's shared memory
#                  (vader) and over TCP (--mca btl tcp,self, like for like with gloo's TCP loopback)
#   fsdp           bench_fsdp --parallel ddp|fsdp vs bench/peer_train.py --parallel ddp|fsdp
#                  (DistributedDataParallel, FSDP2 fully_shard) at about 1M/10M/50M parameters
#   tp             examples/train --tp N --sp vs bench/peer_train.py --parallel tp
#                  (parallelize_module: colwise/rowwise + SequenceParallel), tp.sh's model
#   checkpoint     bench_checkpoint --reps 1 vs bench/peer_checkpoint.py (torch.distributed.
#                  checkpoint: dcp.save / dcp.load / dcp.async_save, FileSystemWriter with
#                  sync_files=True): K f32 tensors of CKPT_MIB MiB, Shard(0); sync save, load
#                  warm, load evicted, async save stall and all it blocks, the same with the
#                  copy off the training thread (ours' deferred copy, theirs' DefaultStager),
#                  the work done beside them, Shard(0) -> Shard(1) load and its peak extra RSS.
#                  Not in the default PARTS: every run (a warm-up round and one measured)
#                  writes and fsyncs 6-8x CKPT_MIB to CKPT_DIR (up to 2 GiB per side and round
#                  at 256 MiB, removed as it goes).
# at np 2 and 4. Every round runs ours, then theirs (reversed in even rounds); a row's ratio is
# ours / theirs in speed (theirs' time / ours'), taken within each round and reported as the
# median over rounds and its spread (min..max); the times are medians over rounds. Theirs runs at
# its best thread count: per part and np one probe run with torch.set_num_threads 1 and 2 picks
# the faster. Ours: one OpenBLAS thread per rank. Peak memory: the largest peak RSS over ranks
# (/usr/bin/time for ours; getrusage in the scripts for theirs), in MiB.
#
#   bench/peer.sh [BUILD_DIR]       (default build; needs what PARTS run built: bench_dispatch,
#                                    bench_redistribute, bench_fsdp, examples/train,
#                                    bench_checkpoint)
#
# Environment: PEER_RESULTS (a file: keep the raw per-round results there),
# PARTS (default "dispatch redistribute fsdp tp"; "checkpoint" only when named), NPS ("2 4"),
# ROUNDS (3: dispatch, redistribute, tp, checkpoint), CKPT_MIB (256), CKPT_TENSORS (8), CKPT_DIR
# (/tmp), CKPT_WORK_MS (the simulated work between an async save and its wait, the same on both
# sides; default CKPT_MIB, i.e. 1 ms per MiB), CKPT_DCP_ARGS (theirs' writer: default
# "--thread-count 2": the fastest sync save here, see docs/performance.md), CKPT_OURS_MPI (ours'
# mpirun flags: default "--bind-to none", unbound as torchrun's processes, so that the
# background writer thread may run on any core as theirs do; set and empty: mpirun's default
# binding, one core per rank at np 2; CKPT_DCP_ARGS set and empty: DCP's defaults),
# FSDP_ROUNDS (2),
# FSDP_SIZES ("1M 10M 50M"), FSDP_BIG_NP ("2": the nps at which 50M runs, 1 round and 3 steps:
# one step takes tens of seconds on two shared cores), FSDP_MODES ("ddp fsdp"), TORCH_THREADS
# (unset: probe; a number: use it, no probe; the probe runs FSDP2 at 1M for the fsdp part, and
# DDP's best count can differ; the checkpoint part's probes the sync save and loads).
# Prints the rows as markdown tables, then exactly one last line:
#   peer_dispatch_ratio=<min over the dispatch rows hit, miss, miss_vs_cleared> peer_redistribute_min=<min over transitions and
#   sizes, ours over shared memory> peer_fsdp_min=<min over sizes, nps, DDP and FSDP>
#   peer_tp_min=<min over nps> peer_redistribute_tcp_min=<the same with ours over TCP>
#   [peer_checkpoint_min=<min over the operations save, load, load_evicted, async_stall,
#   async_blocked, staged_stall, staged_blocked, reshard and the nps; on the same line, when
#   the checkpoint part ran>]
# (every one a median ratio as above: > 1 means ours is faster). Exit status 77 when
# tools/peer-env.sh reports the peer unavailable (PyPI unreachable, no environment).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
PARTS=${PARTS:-"dispatch redistribute fsdp tp"}
NPS=${NPS:-"2 4"}
ROUNDS=${ROUNDS:-3}
FSDP_ROUNDS=${FSDP_ROUNDS:-2}
FSDP_SIZES=${FSDP_SIZES:-"1M 10M 50M"}
FSDP_BIG_NP=${FSDP_BIG_NP:-2}
CKPT_MIB=${CKPT_MIB:-256}
CKPT_TENSORS=${CKPT_TENSORS:-8}
CKPT_DIR=${CKPT_DIR:-/tmp}
CKPT_WORK_MS=${CKPT_WORK_MS:-$CKPT_MIB}
CKPT_DCP_ARGS=${CKPT_DCP_ARGS---thread-count 2}
CKPT_OURS_MPI=${CKPT_OURS_MPI---bind-to none}
for part in $PARTS; do
  case $part in
    dispatch) bins=bench/bench_dispatch ;;
    redistribute) bins=bench/bench_redistribute ;;
    fsdp) bins=bench/bench_fsdp ;;
    tp) bins=examples/train ;;
    checkpoint) bins=bench/bench_checkpoint ;;
    *) echo "peer.sh: unknown part $part" >&2; exit 2 ;;
  esac
  for b in $bins; do
    [ -x "$BUILD/$b" ] || { echo "peer.sh: $BUILD/$b not found: build first" >&2; exit 2; }
  done
done
rc=0
PY=$(tools/peer-env.sh --python) || rc=$?
if [ $rc -eq 77 ]; then
  echo "peer.sh: the PyTorch peer is unavailable (tools/peer-env.sh: PyPI unreachable and no" \
    "environment): skipped"
  exit 77
elif [ $rc -ne 0 ]; then
  echo "peer.sh: tools/peer-env.sh failed (exit $rc)" >&2
  exit 1
fi
TORCHRUN=$(dirname "$PY")/torchrun
TORCH_VERSION=$("$PY" -c 'import torch; print(torch.__version__)')

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x OPENBLAS_NUM_THREADS)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
RES=$W/results # lines: part row np round who key=value...

# ---- launching ----
# theirs NP LOG SCRIPT ARGS...: torchrun from the peer's environment (rank 0 prints the result);
# a failed run (gloo has aborted now and then on this loaded machine) is tried once more, and its
# log kept in $PEER_FAILED (default /tmp/peer-failed)
PEER_FAILED=${PEER_FAILED:-/tmp/peer-failed}
theirs() {
  local np=$1 log=$2 try
  shift 2
  for try in 1 2; do
    "$TORCHRUN" --standalone --nproc_per_node "$np" "$@" >"$log" 2>&1 && return 0
    mkdir -p "$PEER_FAILED"
    cp "$log" "$PEER_FAILED/$(date +%H%M%S)-np$np-try$try.log"
    echo "peer.sh: torch run failed (try $try, log in $PEER_FAILED): $*" >&2
  done
  return 1
}
# ours NP LOG [MPI_ARGS] -- BIN ARGS...: every rank under /usr/bin/time for its peak RSS
ours() {
  local np=$1 log=$2 mpi=()
  shift 2
  while [ "$1" != -- ]; do mpi+=("$1"); shift; done
  shift
  "${MPIRUN[@]}" "${mpi[@]}" -np "$np" /usr/bin/time -f "rss_kib=%M" "$@" >"$log" 2>&1 ||
    { echo "peer.sh: run failed: $*" >&2; tail -5 "$log" >&2; return 1; }
}
kv() { sed -n "s/.*[ ^]$1=\([^ ]*\).*/\1/p" | tail -1; } # kv KEY < text: the last KEY=value
rss_mib() { grep -o 'rss_kib=[0-9]*' "$1" | cut -d= -f2 | sort -n | tail -1 | awk '{printf "%.0f", $1 / 1024}'; }
record() { echo "$*" >>"$RES"; } # record PART ROW NP ROUND WHO key=value...

# best_threads NAME NP LOG SCRIPT ARGS...: probe theirs at 1 and 2 threads; prints the faster
# (by the number the probe's `key` holds: lower is better)
best_threads() {
  local key=$1 np=$2 log=$3 best=1 bt=""
  shift 3
  if [ -n "${TORCH_THREADS:-}" ]; then echo "$TORCH_THREADS"; return; fi
  for t in 1 2; do
    theirs "$np" "$log" "$@" --threads "$t" || continue
    local v
    v=$(grep -h "$key=" "$log" | tail -1 | kv "$key")
    echo "# probe np $np threads $t: $key=$v" >&2
    if [ -n "$v" ] && { [ -z "$bt" ] || awk -v a="$v" -v b="$bt" 'BEGIN { exit !(a < b) }'; }; then
      bt=$v best=$t
    fi
  done
  echo $best
}

echo "# peer.sh: ours ($BUILD) vs torch $TORCH_VERSION (gloo, torchrun); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"

# ---- dispatch ----
part_dispatch() {
  local np=$1 t r log
  t=$(best_threads hit_us "$np" "$W/probe.log" bench/peer_dispatch.py --rounds 2)
  echo "# dispatch np $np: torch threads $t"
  for r in $(seq "$ROUNDS"); do
    for who in $([ $((r % 2)) -eq 1 ] && echo "ours theirs" || echo "theirs ours"); do
      log=$W/d.log
      if [ $who = ours ]; then
        ours "$np" "$log" -- "$BUILD/bench/bench_dispatch" --peer 5 || continue
      else
        theirs "$np" "$log" bench/peer_dispatch.py --threads "$t" || continue
      fi
      local line
      line=$(grep '^peer_dispatch' "$log" | tail -1)
      echo "dispatch np=$np round=$r $who: $line"
      record dispatch hit "$np" "$r" $who us="$(echo "$line" | kv hit_us)" threads="$t"
      record dispatch miss "$np" "$r" $who us="$(echo "$line" | kv miss_us)" threads="$t"
      record dispatch again "$np" "$r" $who us="$(echo "$line" | kv again_us)" threads="$t"
      # theirs with its caches cleared against ours' miss (ours has no cache to clear)
      if [ $who = ours ]; then
        record dispatch miss_vs_cleared "$np" "$r" ours us="$(echo "$line" | kv miss_us)"
      else
        record dispatch miss_vs_cleared "$np" "$r" theirs us="$(echo "$line" | kv clear_us)" threads="$t"
      fi
    done
  done
}

# ---- redistribution ----
part_redistribute() {
  local np=$1 t r log args=(-b 4K -e 16M -f 16 -r 3)
  t=$(best_threads us "$np" "$W/probe.log" bench/peer_redistribute.py -e 1048576 -k 'P->R' -r 2)
  echo "# redistribute np $np: torch threads $t"
  for r in $(seq "$ROUNDS"); do
    local order="ours tcp theirs"
    [ $((r % 2)) -eq 0 ] && order="theirs tcp ours"
    for who in $order; do
      log=$W/r.log
      case $who in
        ours) ours "$np" "$log" -- "$BUILD/bench/bench_redistribute" "${args[@]}" || continue ;;
        tcp) ours "$np" "$log" --mca btl tcp,self -- "$BUILD/bench/bench_redistribute" \
          "${args[@]}" || continue ;;
        theirs) theirs "$np" "$log" bench/peer_redistribute.py -b 4096 -e $((16 << 20)) -f 16 \
          -r 3 --threads "$t" || continue ;;
      esac
      if [ $who = theirs ]; then
        grep '^case=' "$log" | while read -r l; do
          record redistribute "$(echo " $l" | kv case)@$(echo " $l" | kv bytes)" "$np" "$r" theirs \
            us="$(echo " $l" | kv us)" threads="$t"
        done
      else
        awk '$1 ~ /->/ && $2 ~ /^[0-9]+$/ { print $1 "@" $2, $4 }' "$log" | while read -r row us; do
          record redistribute "$row" "$np" "$r" $who us="$us"
        done
      fi
      echo "redistribute np=$np round=$r $who: done"
    done
  done
}

# ---- FSDP2 / DDP ----
# size_args SIZE: the model flags, word-split on purpose where used (as fsdp.sh's)
size_args() {
  case $1 in
    1M) echo "--dim 128 --layers 4 --heads 4 --vocab 1024 --ffn 344 --steps 10" ;;
    10M) echo "--dim 256 --layers 10 --heads 8 --vocab 4096 --ffn 688 --steps 5" ;;
    50M) echo "--dim 512 --layers 14 --heads 8 --vocab 4096 --ffn 1376 --steps 3" ;;
  esac
}
# shellcheck disable=SC2046
part_fsdp() {
  local np=$1 t r log size mode
  t=$(best_threads step_ms "$np" "$W/probe.log" bench/peer_train.py --parallel fsdp $(size_args 1M))
  echo "# fsdp np $np: torch threads $t (probed at 1M, FSDP2)"
  for size in $FSDP_SIZES; do
    local rounds=$FSDP_ROUNDS
    if [ "$size" = 50M ]; then
      case " $FSDP_BIG_NP " in *" $np "*) rounds=1 ;; *) continue ;; esac
    fi
    for r in $(seq "$rounds"); do
      for mode in ${FSDP_MODES:-ddp fsdp}; do
        for who in $([ $((r % 2)) -eq 1 ] && echo "ours theirs" || echo "theirs ours"); do
          log=$W/f.log
          if [ $who = ours ]; then
            ours "$np" "$log" -- "$BUILD/bench/bench_fsdp" --parallel $mode $(size_args "$size") ||
              continue
          else
            theirs "$np" "$log" bench/peer_train.py --parallel $mode $(size_args "$size") \
              --threads "$t" || continue
          fi
          local line rss
          line=$(grep '^result' "$log" | tail -1)
          rss=$(echo " $line" | kv rss_mib)
          [ -n "$rss" ] || rss=$(rss_mib "$log")
          echo "fsdp $size np=$np round=$r $who $mode: $line rss_mib=$rss"
          record fsdp "$size@$mode" "$np" "$r" $who ms="$(echo " $line" | kv step_ms)" \
            tps="$(echo " $line" | kv tokens_per_s)" rss="$rss" threads="$t"
        done
      done
    done
  done
}

# ---- tensor parallelism with sequence parallelism (tp.sh's model) ----
TP_MODEL=(--dim 256 --layers 4 --heads 8 --seq 128 --vocab 256 --batch 8)
part_tp() {
  local np=$1 t r log
  t=$(best_threads step_ms "$np" "$W/probe.log" bench/peer_train.py --parallel tp "${TP_MODEL[@]}" \
    --ffn 688 --steps 4 --skip 2)
  echo "# tp np $np: torch threads $t"
  for r in $(seq "$ROUNDS"); do
    for who in $([ $((r % 2)) -eq 1 ] && echo "ours theirs" || echo "theirs ours"); do
      log=$W/t.log
      local ms tps rss
      if [ $who = ours ]; then
        ours "$np" "$log" -- "$BUILD/examples/train" --tp "$np" --sp "${TP_MODEL[@]}" --order 1 \
          --warmup 2 --steps 8 || continue
        # the best step after the first two (they fill the caches), as theirs
        tps=$(awk '$1 == "step" && $2 >= 2 { for (i = 1; i < NF; i++) if ($i == "tokens/s") print $(i + 1) }' \
          "$log" | sort -g | tail -1)
        ms=$(awk -v t="$tps" 'BEGIN { printf "%.1f", 8 * 128 / t * 1e3 }')
        rss=$(rss_mib "$log")
      else
        theirs "$np" "$log" bench/peer_train.py --parallel tp "${TP_MODEL[@]}" --ffn 688 \
          --steps 8 --skip 2 --threads "$t" || continue
        local line
        line=$(grep '^result' "$log" | tail -1)
        ms=$(echo " $line" | kv step_ms) tps=$(echo " $line" | kv tokens_per_s)
        rss=$(echo " $line" | kv rss_mib)
      fi
      echo "tp np=$np round=$r $who: step_ms=$ms tokens_per_s=$tps rss_mib=$rss"
      record tp "tp$np+sp" "$np" "$r" $who ms="$ms" tps="$tps" rss="$rss" threads="$t"
    done
  done
}

# ---- distributed checkpoints: ours vs torch.distributed.checkpoint ----
# Rows, from the per-round lines (the same keys on both sides): save, load, load_evicted, reshard
# (their _s), async_stall (the copy in the call), async_blocked (its stall + the wait after
# CKPT_WORK_MS of work: all the training thread waits for one async save), staged_stall and
# staged_blocked (the same with the copy off the training thread: ours' deferred copy, theirs'
# DefaultStager), async_work and staged_work (work_frac, work_frac_staged: the work done beside
# the background save over the work done undisturbed; higher is better, the ratio is ours /
# theirs). Ours' raw POSIX write and reads of the same bytes beside save and the loads, and the
# reshard load's peak extra RSS.
CKPT_ROWS="save load load_evicted async_stall async_blocked staged_stall staged_blocked reshard async_work staged_work"
# shellcheck disable=SC2086
part_checkpoint() {
  local np=$1 t r log args=(--mib "$CKPT_MIB" --tensors "$CKPT_TENSORS" --dir "$CKPT_DIR")
  t=$(best_threads total_s "$np" "$W/probe.log" bench/peer_checkpoint.py "${args[@]}" --reps 1 \
    --no-async $CKPT_DCP_ARGS)
  echo "# checkpoint np $np: torch threads $t, theirs $CKPT_DCP_ARGS, ours mpirun $CKPT_OURS_MPI," \
    "work $CKPT_WORK_MS ms"
  for r in $(seq "$ROUNDS"); do
    for who in $([ $((r % 2)) -eq 1 ] && echo "ours theirs" || echo "theirs ours"); do
      log=$W/c.log
      # the previous run's written gigabytes flushed first: otherwise a run started right after
      # one (ours starts at once, theirs after importing torch for seconds) has its fsyncs wait
      # on that writeback (ours' save measured 0.38-0.41 s after ours, 0.12-0.13 after theirs)
      sync
      if [ $who = ours ]; then
        DTENSOR_QUIET=1 ours "$np" "$log" $CKPT_OURS_MPI -- "$BUILD/bench/bench_checkpoint" \
          "${args[@]}" --reps 1 --work-ms "$CKPT_WORK_MS" || continue
      else
        theirs "$np" "$log" bench/peer_checkpoint.py "${args[@]}" --reps 1 --work-ms "$CKPT_WORK_MS" \
          $CKPT_DCP_ARGS --threads "$t" || continue
      fi
      local line row v raw rss
      line=$(grep -E '^(checkpoint_round|peer_checkpoint) ' "$log" | tail -1)
      [ -n "$line" ] || { echo "peer.sh: no result line from $who (np $np)" >&2; continue; }
      echo "checkpoint np=$np round=$r $who: $line"
      for row in $CKPT_ROWS; do
        raw="" rss=""
        case $row in
          async_blocked | staged_blocked)
            v=$(awk -v a="$(echo " $line" | kv "${row%_blocked}_stall_s")" \
              -v b="$(echo " $line" | kv "${row%_blocked}_wait_s")" 'BEGIN { printf "%.4f", a + b }') ;;
          async_work) v=$(echo " $line" | kv work_frac) ;;
          staged_work) v=$(echo " $line" | kv work_frac_staged) ;;
          *) v=$(echo " $line" | kv "${row}_s") ;;
        esac
        if [ $who = ours ]; then
          case $row in
            save) raw=$(echo " $line" | kv raw_write_s) ;;
            load) raw=$(echo " $line" | kv raw_read_s) ;;
            load_evicted) raw=$(echo " $line" | kv raw_read_evicted_s) ;;
          esac
        fi
        [ $row = reshard ] && rss=$(echo " $line" | kv reshard_extra_mib)
        record checkpoint "$row" "$np" "$r" $who s="$v" raw="$raw" rss="$rss" threads="$t"
      done
    done
  done
}

for part in $PARTS; do
  for np in $NPS; do
    echo "# $part np $np: load $(cut -d' ' -f1-3 /proc/loadavg)"
    "part_$part" "$np"
  done
done
echo "# load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"

# ---- tables and the summary line ----
# Per (part, row, np): medians over rounds of ours' and theirs' values and of the within-round
# ratio theirs/ours of the time (ms or us), its min and max.
[ -s "$RES" ] || { echo "peer.sh: no results" >&2; exit 1; }
[ -z "${PEER_RESULTS:-}" ] || cp "$RES" "$PEER_RESULTS"
awk '
  function val(s, k,   i, n, a) { n = split(s, a, " "); for (i = 1; i <= n; i++) if (index(a[i], k "=") == 1) return substr(a[i], length(k) + 2); return "" }
  function med(arr, n,   i, j, t) { for (i = 2; i <= n; i++) { t = arr[i]; for (j = i - 1; j >= 1 && arr[j] > t; j--) arr[j + 1] = arr[j]; arr[j + 1] = t }
    return n % 2 ? arr[(n + 1) / 2] : (arr[n / 2] + arr[n / 2 + 1]) / 2 }
  { part = $1; row = $2; np = $3; r = $4; who = $5; key = part " " row " " np
    if (!(key in seen)) { seen[key] = 1; order[++nk] = key }
    t = val($0, part == "fsdp" || part == "tp" ? "ms" : part == "checkpoint" ? "s" : "us"); T[key, who, r] = t
    RAW[key, who, r] = val($0, "raw")
    if (who != "ours" && who != "tcp") th[key] = val($0, "threads")
    TPS[key, who, r] = val($0, "tps"); RSS[key, who, r] = val($0, "rss"); if (r > nr) nr = r }
  function stat(key, who, what,   r, n, v) { n = 0
    for (r = 1; r <= nr; r++) if ((key, who, r) in T && T[key, who, r] != "" && (what != "raw" || RAW[key, who, r] != "") && (what != "rss" || part != "checkpoint" || RSS[key, who, r] != "")) v[++n] = (what == "t" ? T[key, who, r] : what == "tps" ? TPS[key, who, r] : what == "raw" ? RAW[key, who, r] : RSS[key, who, r]) + 0
    return n ? med(v, n) : "" }
  function ratio(key, who,   r, n, v, lo, hi, m) { n = 0; lo = ""; hi = ""
    for (r = 1; r <= nr; r++) if ((key, who, r) in T && (key, "theirs", r) in T && T[key, who, r] > 0 && T[key, "theirs", r] > 0) {
      x = key ~ /^checkpoint [a-z]+_work / ? T[key, who, r] / T[key, "theirs", r] : T[key, "theirs", r] / T[key, who, r]; v[++n] = x; if (lo == "" || x < lo) lo = x; if (hi == "" || x > hi) hi = x }
    if (n == 0) return "-"
    m = med(v, n); last_med = m
    return sprintf("%.2f (%.2f..%.2f)", m, lo, hi) }
  function upd(name, m) { if (!(name in mins) || m < mins[name]) mins[name] = m }
  END {
    hdr["dispatch"] = "\n### Dispatch (`a + a`, Shard(0), 512x512 f32; µs per call)\n\n| row | np | ours (µs) | theirs (µs) | ours/theirs speed: median (min..max) | torch threads |\n|---|---:|---:|---:|---:|---:|"
    hdr["redistribute"] = "\n### Redistribution (f32 (S/1024, 256); µs per call; ours over shared memory and over TCP, theirs gloo over TCP)\n\n| transition | bytes | np | ours shm (µs) | ours TCP (µs) | theirs (µs) | speed ratio, shm: median (min..max) | speed ratio, TCP: median (min..max) | torch threads |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    hdr["fsdp"] = "\n### FSDP2 and DDP (best step after step 0; RSS = largest peak over ranks)\n\n| size | mode | np | ours step (ms) | theirs step (ms) | ours tokens/s | theirs tokens/s | ours RSS (MiB) | theirs RSS (MiB) | speed ratio: median (min..max) | torch threads |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    hdr["checkpoint"] = "\n### Distributed checkpoints (ours vs torch.distributed.checkpoint; seconds, slowest rank; raw = ours\x27 POSIX write + fsync / read of the same bytes in the same run)\n\n| operation | np | ours (s) | theirs (s) | raw POSIX (s) | speed ratio: median (min..max) | ours peak extra RSS (MiB) | theirs peak extra RSS (MiB) | torch threads |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    hdr["tp"] = "\n### Tensor parallel + sequence parallel (dim 256, 4 layers, seq 128, vocab 256, 8 sequences; best step after two)\n\n| config | np | ours step (ms) | theirs step (ms) | ours tokens/s | theirs tokens/s | ours RSS (MiB) | theirs RSS (MiB) | speed ratio: median (min..max) | torch threads |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for (i = 1; i <= nk; i++) { key = order[i]; split(key, k, " "); part = k[1]; row = k[2]; np = k[3]
      if (!(part in printed)) { print hdr[part]; printed[part] = 1 }
      if (part == "dispatch") {
        s = ratio(key, "ours"); m = last_med; if (s != "-" && row != "again") upd("dispatch", m)
        printf "| %s | %s | %.2f | %.2f | %s | %s |\n", row, np, stat(key, "ours", "t"), stat(key, "theirs", "t"), s, th[key]
      } else if (part == "redistribute") {
        split(row, rb, "@")
        s1 = ratio(key, "ours"); m1 = last_med; s2 = ratio(key, "tcp"); m2 = last_med
        if (s1 != "-") upd("redistribute", m1); if (s2 != "-") upd("redistribute_tcp", m2)
        printf "| %s | %s | %s | %.1f | %.1f | %.1f | %s | %s | %s |\n", rb[1], rb[2], np, stat(key, "ours", "t"), stat(key, "tcp", "t"), stat(key, "theirs", "t"), s1, s2, th[key]
      } else if (part == "checkpoint") {
        s = ratio(key, "ours"); m = last_med
        if (s != "-" && row !~ /_work$/) upd("checkpoint", m)
        rw = stat(key, "ours", "raw"); ro = stat(key, "ours", "rss"); rt = stat(key, "theirs", "rss")
        printf "| %s | %s | %.4f | %.4f | %s | %s | %s | %s | %s |\n", row (row ~ /_work$/ ? " (fraction of the work done)" : ""), np, stat(key, "ours", "t"), stat(key, "theirs", "t"), rw == "" ? "-" : sprintf("%.4f", rw), s, ro == "" ? "-" : sprintf("%.1f", ro), rt == "" ? "-" : sprintf("%.1f", rt), th[key]
      } else {
        s = ratio(key, "ours"); m = last_med; if (s != "-") upd(part, m)
        if (part == "fsdp") { split(row, sm, "@"); lead = sm[1] " | " (sm[2] == "fsdp" ? "FSDP / FSDP2" : "DDP / DDP") }
        else lead = row
        printf "| %s | %s | %.1f | %.1f | %.0f | %.0f | %s | %s | %s | %s |\n", lead, np, stat(key, "ours", "t"), stat(key, "theirs", "t"), stat(key, "ours", "tps"), stat(key, "theirs", "tps"), stat(key, "ours", "rss"), stat(key, "theirs", "rss"), s, th[key]
      } }
    f = "%.2f"
    printf "\npeer_dispatch_ratio=%s peer_redistribute_min=%s peer_fsdp_min=%s peer_tp_min=%s peer_redistribute_tcp_min=%s",
      "dispatch" in mins ? sprintf(f, mins["dispatch"]) : "-", "redistribute" in mins ? sprintf(f, mins["redistribute"]) : "-",
      "fsdp" in mins ? sprintf(f, mins["fsdp"]) : "-", "tp" in mins ? sprintf(f, mins["tp"]) : "-",
      "redistribute_tcp" in mins ? sprintf(f, mins["redistribute_tcp"]) : "-"
    if ("checkpoint" in printed) printf " peer_checkpoint_min=%s", "checkpoint" in mins ? sprintf(f, mins["checkpoint"]) : "-"
    printf "\n"
  }' "$RES"
