#!/usr/bin/env bash
# fsdp.sh - data-parallel training throughput of bench_train's Llama-style model at three sizes:
# ours on one rank without a wrapper, our DDP and FSDP at np 2, and PyTorch's
# DistributedDataParallel (gloo) at np 2 -- the PyTorch 2.x peer of tools/peer-env.sh
# (bench/peer_train.py), which also runs FSDP2 (fully_shard, "torch FSDP2" rows), or, when that
# environment is unavailable, Debian's 1.13 (bench/fsdp_torch.py, DDP only) --, all with one
# thread per rank and the same
# per-rank batch (8 x 128 tokens) and optimizer (AdamW, clipping at 1). Also np independent
# single-rank runs side by side ("alone": no communication), whose throughput over np times one
# rank's is the ceiling any scaling efficiency can reach on this machine (shared cores, caches
# and memory bandwidth).
#
#   bench/fsdp.sh [BUILD_DIR]      (after a build; default BUILD_DIR=build)
#
# Environment: ROUNDS (default 2), SIZES (default "1M 10M 50M"), NP (default 2). Every round runs
# the five configurations of a size one after the other (ours none, alone, torch DDP, ours DDP,
# ours FSDP; reversed in even rounds), so ours and torch alternate on this noisy shared machine. The
# table shows each configuration's best step over the rounds (step 0 of every run is a warmup); the
# ratios below are medians over the rounds of ratios taken within a round, between runs made back to
# back (this machine's speed drifts by 10-15% over minutes, so best steps from different moments
# would compare the moments, not the configurations). Without the 2.x peer it installs
# python3-torch when it is missing and we are root; otherwise torch is skipped (its columns say
# "-"). bench/peer.sh compares against the 2.x peer at np 2 and 4 with spreads. Prints a table,
# then exactly one last line:
#   fsdp_vs_torch_min=<min over 10M, 50M of FSDP tokens/s / torch DDP tokens/s> (each a median
#   over rounds as above)
#   fsdp_vs_torch_small=<the same at 1M> fsdp_vs_ddp_time=<max over sizes of FSDP step time / DDP
#   step time> scaling_efficiency=<min over sizes of FSDP tokens/s at np / (np x one rank's)>
# after a line scaling_ceiling=<min over sizes of alone tokens/s / (np x one rank's)>
# fsdp_vs_alone=<min over sizes of FSDP tokens/s / alone tokens/s>.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
ROUNDS=${ROUNDS:-2}
SIZES=${SIZES:-"1M 10M 50M"}
NP=${NP:-2}
BIN="$BUILD/bench/bench_fsdp"
[ -x "$BIN" ] || { echo "fsdp.sh: $BIN not found: build first (cmake --build $BUILD)" >&2; exit 2; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x OPENBLAS_NUM_THREADS)

have_torch=1
TORCH_PY=/usr/bin/python3 TORCH_SCRIPT=bench/fsdp_torch.py
if PEER_PY=$(tools/peer-env.sh --python 2>/dev/null); then
  TORCH_PY=$PEER_PY TORCH_SCRIPT=bench/peer_train.py
  echo "fsdp.sh: torch peer $("$PEER_PY" -c 'import torch; print(torch.__version__)') (tools/peer-env.sh)"
elif ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "fsdp.sh: installing python3-torch (Debian, about 635 MB)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch; } \
      >/dev/null 2>&1 || true
  fi
  /usr/bin/python3 -c 'import torch' 2>/dev/null || {
    have_torch=0
    echo "fsdp.sh: torch is not importable by /usr/bin/python3: skipping the torch runs"
  }
fi

size_args() {
  case $1 in
    1M) echo "--dim 128 --layers 4 --heads 4 --vocab 1024 --ffn 344 --steps 10" ;;
    10M) echo "--dim 256 --layers 10 --heads 8 --vocab 4096 --ffn 688 --steps 5" ;;
    50M) echo "--dim 512 --layers 14 --heads 8 --vocab 4096 --ffn 1376 --steps 4" ;;
    *) echo "fsdp.sh: unknown size $1 (1M, 10M, 50M)" >&2; exit 2 ;;
  esac
}

RESULTS=$(mktemp)
LOG=$(mktemp)
trap 'rm -f "$RESULTS" "$LOG"' EXIT
port=$((29500 + $$ % 500))

# run SIZE CONFIG: one run; appends "SIZE CONFIG key=value..." to $RESULTS
run() {
  local size=$1 cfg=$2 round=$3 args rc=0
  args=$(size_args "$size")
  case $cfg in
    none) "${MPIRUN[@]}" -np 1 "$BIN" --parallel none $args >"$LOG" 2>&1 || rc=$? ;;
    alone | ddp | fsdp) "${MPIRUN[@]}" -np "$NP" "$BIN" --parallel "$cfg" $args >"$LOG" 2>&1 || rc=$? ;;
    torch | tfsdp)
      port=$((port + 1))
      local mode=()
      [ "$TORCH_SCRIPT" = bench/peer_train.py ] && mode=(--parallel "$([ $cfg = torch ] && echo ddp || echo fsdp)")
      "${MPIRUN[@]}" -np "$NP" "$TORCH_PY" "$TORCH_SCRIPT" "${mode[@]}" $args --port $port \
        >"$LOG" 2>&1 || rc=$?
      ;;
  esac
  local line
  line=$(grep '^result ' "$LOG" | tail -1 || true)
  if [ $rc -ne 0 ] || [ -z "$line" ]; then
    echo "fsdp.sh: $size $cfg failed (rc $rc):" >&2
    tail -5 "$LOG" >&2
    return 0
  fi
  printf '%-4s %-6s round=%s %s\n' "$size" "$cfg" "$round" "$line" | tee -a "$RESULTS"
}

echo "# bench_fsdp: np $NP, $ROUNDS rounds, sizes $SIZES; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
for size in $SIZES; do
  echo "# $size: load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
  for r in $(seq "$ROUNDS"); do
    cfgs="none alone torch ddp fsdp tfsdp"
    [ $((r % 2)) -eq 0 ] && cfgs="tfsdp fsdp ddp torch alone none"
    for c in $cfgs; do
      [ "$c" = torch ] && [ $have_torch -eq 0 ] && continue
      [ "$c" = tfsdp ] && [ "$TORCH_SCRIPT" != bench/peer_train.py ] && continue
      run "$size" "$c" "$r"
    done
  done
done

echo "# load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"

# Best step per (size, config), the table and the summary line.
awk -v sizes="$SIZES" -v np="$NP" '
  function val(s, k,   i, n, a) { n = split(s, a, " "); for (i = 1; i <= n; i++) if (index(a[i], k "=") == 1) return substr(a[i], length(k) + 2); return "" }
  { key = $1 " " $2; ms = val($0, "step_ms") + 0; r = val($0, "round")
    if (!(key in best) || ms < best[key]) { best[key] = ms; tps[key] = val($0, "tokens_per_s"); peak[key] = val($0, "peak_mib") }
    rtps[key " " r] = val($0, "tokens_per_s"); rms[key " " r] = ms; if (r > nr) nr = r
    params[$1] = val($0, "params") }
  # the median over rounds of a ratio taken within each round (configurations run back to back)
  function med(kind, x, y, k,   r, n, v, i, j, t) { n = 0
    for (r = 1; r <= nr; r++) { if (!((x " " r) in rtps) || !((y " " r) in rtps)) continue
      v[++n] = kind == "time" ? rms[x " " r] / rms[y " " r] : rtps[x " " r] / (k * rtps[y " " r]) }
    if (n == 0) return "nan"
    for (i = 2; i <= n; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
  function fmt(x) { return x == "" ? "-" : x }
  END {
    printf "\n| size | parameters | configuration | ranks | best step (ms) | tokens/s | peak MiB/rank |\n|---|---:|---|---:|---:|---:|---:|\n"
    n = split(sizes, S, " "); split("none alone ddp fsdp torch tfsdp", C, " ")
    name["none"] = "ours, no wrapper"; name["alone"] = "ours, independent copies"; name["ddp"] = "ours DDP"; name["fsdp"] = "ours FSDP"; name["torch"] = "torch DDP (gloo)"; name["tfsdp"] = "torch FSDP2 (gloo)"
    for (i = 1; i <= n; i++) for (j = 1; j <= 6; j++) { k = S[i] " " C[j]; if (!(k in best)) continue
      printf "| %s | %s | %s | %d | %.1f | %.1f | %s |\n", S[i], params[S[i]], name[C[j]], C[j] == "none" ? 1 : np, best[k], tps[k], fmt(peak[k]) }
    printf "\nRatios: the median over the rounds of the ratio within each round (configurations run back to back).\n"
    printf "\n| size | FSDP / torch DDP (tokens/s) | FSDP / torch FSDP2 (tokens/s) | FSDP / DDP (step time) | FSDP scaling efficiency | DDP scaling efficiency | ceiling (independent copies) | FSDP / independent copies |\n|---|---:|---:|---:|---:|---:|---:|---:|\n"
    vmin = "nan"; vsmall = "nan"; tmax = "nan"; emin = "nan"; cmin = "nan"; amin = "nan"
    for (i = 1; i <= n; i++) { s = S[i]; f = s " fsdp"; d = s " ddp"; t = s " torch"; o = s " none"; a = s " alone"
      r1 = med("tps", f, t, 1); r2 = med("time", f, d, 1)
      e1 = med("tps", f, o, np); e2 = med("tps", d, o, np)
      c1 = med("tps", a, o, np); a1 = med("tps", f, a, 1); r3 = med("tps", f, s " tfsdp", 1)
      printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", s, r1 == "nan" ? "-" : sprintf("%.3f", r1), r3 == "nan" ? "-" : sprintf("%.3f", r3), r2 == "nan" ? "-" : sprintf("%.3f", r2), e1 == "nan" ? "-" : sprintf("%.3f", e1), e2 == "nan" ? "-" : sprintf("%.3f", e2), c1 == "nan" ? "-" : sprintf("%.3f", c1), a1 == "nan" ? "-" : sprintf("%.3f", a1)
      if (r1 != "nan") { if (s == "1M") vsmall = r1; else if (vmin == "nan" || r1 < vmin) vmin = r1 }
      if (r2 != "nan" && (tmax == "nan" || r2 > tmax)) tmax = r2
      if (e1 != "nan" && (emin == "nan" || e1 < emin)) emin = e1
      if (c1 != "nan" && (cmin == "nan" || c1 < cmin)) cmin = c1
      if (a1 != "nan" && (amin == "nan" || a1 < amin)) amin = a1 }
    f3 = "%.3f"
    printf "\nscaling_ceiling=%s fsdp_vs_alone=%s\n", cmin == "nan" ? cmin : sprintf(f3, cmin), amin == "nan" ? amin : sprintf(f3, amin)
    printf "\nfsdp_vs_torch_min=%s fsdp_vs_torch_small=%s fsdp_vs_ddp_time=%s scaling_efficiency=%s\n",
      vmin == "nan" ? vmin : sprintf(f3, vmin), vsmall == "nan" ? vsmall : sprintf(f3, vsmall),
      tmax == "nan" ? tmax : sprintf(f3, tmax), emin == "nan" ? emin : sprintf(f3, emin)
  }' "$RESULTS"
