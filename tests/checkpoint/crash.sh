#!/usr/bin/env bash
# crash.sh CKPT_CRASH MPIEXEC [RUNS] [SEED] - crash safety of checkpoints (dtensor/checkpoint.h).
#   RUNS times (default 20): starts `ckpt_crash save` (np 2: a save at every step, sync and async
#   (the copy in the save or deferred) in turn, keep_last 2, resuming from `latest`), waits for
#   its first save to be published, then after a random 0.05 to 1.5 s kills with kill -9 rank 0, rank 1 or the whole job (mpirun and
#   both ranks), in turn. After each kill (every process gone):
#     - `ckpt_crash check` (np 2 and np 1 in turn) loads `latest` onto other placements, checks
#       every value is exactly that of the step recorded in it and that `latest` names that step,
#       and runs dt_checkpoint_verify;
#     - latest's step is at least the last step the job reported published before the kill;
#     - the *.tmp entries the kill left (a save was under way: counted) are gone once the next
#       run's first save is published (and ckpt_crash itself checks after every sync save that
#       none is left).
#   The seed (default: the time) is printed; CRASH_SEED or the 4th argument replays a run.
set -euo pipefail
prog=$1 mpiexec=$2 runs=${3:-20} seed=${4:-${CRASH_SEED:-$(date +%s)}}
RANDOM=$seed
echo "crash.sh: $runs runs, seed $seed (replay: CRASH_SEED=$seed)"
tmp=$(mktemp -d /tmp/dt_ckpt_crash.XXXXXX)
dir=$tmp/ckpt
mkdir -p "$tmp/pids"
job=
cleanup() {
  if [ -n "$job" ]; then kill -9 "$job" 2>/dev/null || true; fi
  [ -f "$tmp/mpirun.pid" ] && kill -9 "$(cat "$tmp/mpirun.pid")" 2>/dev/null || true
  for f in "$tmp"/pids/pid.*; do
    [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "crash.sh: FAIL (seed $seed, run $run): $*" >&2
  for f in "$tmp"/log.* "$tmp"/check.*; do
    [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; } >&2
  done
  exit 1
}
mpi() { "$mpiexec" --allow-run-as-root --oversubscribe "$@"; }
# alive PID: the process exists and is not a zombie (a rank whose mpirun died is reparented and
# may stay a zombie for a while)
alive() {
  local s
  s=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${s#Z}" = "$s" ]
}
# waits up to $2 seconds for pid $1 to end; 1 when it did not
gone_within() {
  local pid=$1 tenths=$(($2 * 10))
  while alive "$pid" && [ "$tenths" -gt 0 ]; do
    sleep 0.1
    tenths=$((tenths - 1))
  done
  ! alive "$pid"
}

midsave=0 unpublished=0 leftovers= total_saves=0 stale=
for run in $(seq 1 "$runs"); do
  rm -f "$tmp"/pids/pid.*
  log=$tmp/log.$run
  rm -f "$tmp/mpirun.pid"
  # mpirun runs under a shell that waits for it ($job), so that killing mpirun is no job of ours
  # that bash reports as killed
  bash -c '"$@" & echo $! >"$0"; wait $!' "$tmp/mpirun.pid" "$mpiexec" --allow-run-as-root \
    --oversubscribe -np 2 "$prog" save "$dir" "$tmp/pids" >"$log" 2>&1 &
  job=$!
  # the first save of this run is published before the kill window opens
  waited=0
  until grep -q '^ready' "$log"; do
    alive "$job" || fail "ckpt_crash save ended before its first save: $(tail -n 5 "$log")"
    [ "$waited" -lt 600 ] || fail "no save published within 60 s"
    sleep 0.1
    waited=$((waited + 1))
  done
  # leftovers of the previous kill are gone after this successful save (latest.tmp is checked by
  # ckpt_crash itself: the next publish writes one again at any moment)
  for x in $leftovers; do
    [ "$x" = latest.tmp ] && continue
    [ -e "$dir/$x" ] && fail "$x, left by the previous kill, survived the next successful save"
  done
  ms=$((50 + RANDOM % 1451))
  sleep "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
  grep -qE 'FAIL|returned DT_' "$log" && fail "ckpt_crash save failed before the kill"
  alive "$job" || fail "ckpt_crash save ended before the kill: $(tail -n 5 "$log")"
  p0=$(cat "$tmp/pids/pid.0") p1=$(cat "$tmp/pids/pid.1")
  last=$(grep '^saved step' "$log" | tail -n 1 | awk '{print $3}')
  case $((run % 3)) in
    1) what="rank 0" && kill -9 "$p0" ;;
    2) what="rank 1" && kill -9 "$p1" ;;
    0) what="the whole job" && kill -9 "$(cat "$tmp/mpirun.pid")" "$p0" "$p1" 2>/dev/null || true ;;
  esac
  # mpirun ends the job when a rank dies; make sure nothing is left writing
  gone_within "$job" 20 || kill -9 "$(cat "$tmp/mpirun.pid")" 2>/dev/null || true
  for p in "$p0" "$p1"; do gone_within "$p" 5 || kill -9 "$p" 2>/dev/null || true; done
  wait "$job" 2>/dev/null || true
  job=
  for p in "$p0" "$p1"; do gone_within "$p" 5 || fail "rank process $p survived kill -9"; done
  if grep -qE 'FAIL|returned DT_' "$log"; then
    fail "ckpt_crash save: $(grep -E 'FAIL|returned DT_' "$log" | head -n 1)"
  fi
  saves=$(grep -c '^saved step' "$log" || true)
  total_saves=$((total_saves + saves))
  grep -q '^unpublished step' "$log" && unpublished=$((unpublished + 1))
  leftovers=$(cd "$dir" && ls -d -- *.tmp 2>/dev/null || true)
  state="between saves"
  if [ -n "$leftovers" ]; then
    midsave=$((midsave + 1))
    state="mid-save: $(echo $leftovers)"
  fi
  # a directory that is neither complete (index.json) nor *.tmp: a removal (keep_last) cut short;
  # counted, not an error (loads never see it), but nothing ever removes it
  for d in "$dir"/step_*; do
    [ -d "$d" ] || continue
    case $d in *.tmp) continue ;; esac
    [ -f "$d/index.json" ] && continue
    case " $stale " in *" ${d##*/} "*) ;; *) stale="$stale ${d##*/}" ;; esac
  done
  np=$((run % 2 == 1 ? 2 : 1))
  chk=$tmp/check.$run
  mpi -np "$np" "$prog" check "$dir" >"$chk" 2>&1 ||
    fail "ckpt_crash check (np $np): $(tail -n 5 "$chk")"
  step=$(grep '^check ok step' "$chk" | awk '{print $4}')
  [ -n "$step" ] || fail "ckpt_crash check printed no result: $(tail -n 5 "$chk")"
  [ "$step" -ge "$last" ] ||
    fail "latest is step $step, but step $last was published before the kill"
  echo "run $run: killed $what after ${ms} ms, $saves saves (last reported $last), $state;" \
    "latest step $step checked at np $np"
done
echo "crash.sh: $runs kills, $midsave landed mid-save (a *.tmp left behind), $unpublished" \
  "restarts found a complete but unpublished checkpoint, $total_saves saves published; seed $seed"
[ -z "$stale" ] || echo "crash.sh: note: incomplete directories left by cut-short removals:$stale"
