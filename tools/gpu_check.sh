#!/usr/bin/env bash
# gpu_check.sh - the one prepared run for the GPU machine (it has CUDA, PyTorch, cmake and ninja but
# no MPI, no package registry, no network). Everything it runs was built and packed here:
#
#   cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTENSOR_CUDA=ON
#   cmake --build build-gpu && tools/gpu_runtime.sh --bin build-gpu/tests && tools/gpu_pack.sh build-gpu
#   # carry .gpu-runtime.tar.xz and .gpu-build.tar.xz; on the GPU machine, from the repository root:
#   tools/gpu_check.sh            (or: DT_GPU_CHECK_BACKEND=cuda-emu tools/gpu_check.sh here, as a
#                                  dry run of the script on the emulator, benchmarks skipped)
#
# Steps, each under its own time limit, in order of importance (correctness first); a step that
# would start after $DT_GPU_CHECK_BUDGET_S seconds (default 420) is skipped and says so, so the
# whole run ends in under 8 minutes. DT_GPU_CHECK_ONLY='REGEX' runs only the steps whose names
# match (besides the probe), for a short rerun:
#   machine     GPU, driver, OS, glibc; the runtime (tools/gpu_env.sh) and the packed programs
#   backend     test_cuda_backend (every vtable member against the cpu backend), test_simt_emu_gpu
#               (the emulator's own test kernels on the real GPU: the emulator's rules are CUDA's)
#   conformance test_conformance at np 1 and 2 (every op x dtype, cpu against cuda), sdpa's flash
#               path, ring attention at np 1 on both block paths (auto; flash: fused kernels);
#               test_comm_conformance (the NCCL communicator against MPI, bit for bit) at np 1
#               and np = number of GPUs; test_nccl_timeout (NCCL's deadline, np 1)
#   errors      test_device_errors and test_device_leaks (1000 FSDP steps) at np 2
#   twins       every device twin of tests/CMakeLists.txt (tools/gpu_twins.sh) at each of its np:
#               redistribution, ops against PyTorch's fixtures, autograd, FSDP, DDP, TP, EP, MoE,
#               optimizer, memory, local transfers, ring attention, async TP, checkpoints, ...
#   estimate    tests/estimate/estimate.sh with --device cuda (np <= GPUs): the estimate against device peaks
#   parity      tests/nn/loss_parity.sh on the GPU (np 1, 2, 4 on one GPU, f32, rtol 1e-5) and
#               tests/parallel/parallel_parity.sh (every parallel config of the trainer, np up to 8)
#   gemm        bench_gpu: dt_mm bf16 4096^3 and 8192^3 against the same cuBLASLt call made
#               directly, TF32, host-staging bandwidth; bench_nccl: redistributions over the NCCL
#               plane against raw NCCL calls, 1-256 MiB; bench_gpu --attention on each of
#               attention's paths (DTENSOR_SDPA_PATH=gemm, flash) against bench/sdpa_torch_gpu.py
#               (PyTorch's SDPA) at the two training shapes, bf16, forward + backward;
#               bench_gpu --ring on ring attention's two block paths (gemm, flash), alternated,
#               then each once with bf16 inputs; dtensor-calibrate --compute-only on the GPU
#               (the estimator's GEMM, bandwidth and attention rates: $OUT/compute_cuda.json);
#               ncu_* (where ncu is installed): Nsight Compute on attention's kernels
#   train       our trainer and bench/train_torch_gpu.py (PyTorch eager, bf16 autocast, SDPA) on
#               the same ~125M-parameter model, then ~1B, alternating ours and theirs; then the
#               125M step's op profile (--profile: time per op, backward rule and wait)
# Output: one line per step (PASS/FAIL/SKIP, seconds), logs in $OUT (default /tmp/gpu_check; on
# the device tool's machine set OUT to its $OUT so the logs come back), and the last line:
#   gpu_check: gemm_vs_cublaslt=<x> train_vs_torch=<125M>/<1B> mfu=<x> conformance_ops=<n>
#              nccl_conformance=PASS:<cases> nccl_vs_raw=<x> failed=<k>
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
T0=$(date +%s)
BUDGET=${DT_GPU_CHECK_BUDGET_S:-420}
BACKEND=${DT_GPU_CHECK_BACKEND:-cuda}
ONLY=${DT_GPU_CHECK_ONLY:-} # a regex of step names (e.g. 'conformance_.*|train_.*'): only those
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
failed=0

elapsed() { echo $(($(date +%s) - T0)); }
note() { echo "$*" | tee -a "$SUMMARY"; }

# step NAME LIMIT_S CMD...: runs CMD (output in $OUT/NAME.log) unless the budget is spent
step() {
  local name=$1 limit=$2
  shift 2
  if [ -n "$ONLY" ] && [ "$name" != probe ] && ! [[ $name =~ ^($ONLY)$ ]]; then
    return 0 # not asked for (DT_GPU_CHECK_ONLY)
  fi
  if [ "$(elapsed)" -ge "$BUDGET" ]; then
    note "SKIP  $name (budget of ${BUDGET}s spent)"
    return 0
  fi
  local s
  s=$(date +%s)
  # stdin from /dev/null: mpirun forwards its stdin to rank 0 and would eat a loop's input
  timeout --kill-after=10 "$limit" "$@" < /dev/null > "$OUT/$name.log" 2>&1
  local rc=$? d=$(($(date +%s) - s))
  if [ $rc -eq 0 ]; then note "PASS  $name (${d}s)"
  elif [ $rc -eq 77 ]; then note "SKIP  $name (${d}s): $(tail -n 1 "$OUT/$name.log")"
  else
    failed=$((failed + 1))
    note "FAIL  $name (${d}s, rc $rc): $(grep -m1 -iE 'fail|error|abort' "$OUT/$name.log" | cut -c1-300)"
  fi
  return 0
}

note "== gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) backend $BACKEND"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$SUMMARY"
note "os: $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}"), $(getconf GNU_LIBC_VERSION), $(nproc) cores"

# the runtime (Open MPI, OpenBLAS, cJSON, cuBLASLt's folder) and the packed programs
if [ ! -d gpu-build ] && [ -f .gpu-build.tar.xz ]; then
  tar -xJf .gpu-build.tar.xz 2>/dev/null || python3 -c "import tarfile; tarfile.open('.gpu-build.tar.xz').extractall('.')"
fi
[ -d gpu-build ] || { note "FAIL  no gpu-build/ (run tools/gpu_pack.sh here and carry .gpu-build.tar.xz)"; exit 1; }
note "programs: built from commit $(cut -c1-12 gpu-build/COMMIT 2>/dev/null || echo unknown)"
if [ "$BACKEND" = cuda ]; then
  # shellcheck source=tools/gpu_env.sh
  source tools/gpu_env.sh 2>&1 | tee -a "$SUMMARY" || true
  source tools/gpu_env.sh > /dev/null 2>&1 || { note "FAIL  tools/gpu_env.sh"; exit 1; }
else
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
fi
export LD_LIBRARY_PATH="$ROOT/gpu-build/lib:${LD_LIBRARY_PATH:-}"
export OPENBLAS_NUM_THREADS=1 DTENSOR_COST_MODEL=none DT_TEST_REFERENCE_DIR="$ROOT/gpu-build"
G=$ROOT/gpu-build
MPI=(mpirun --allow-run-as-root --oversubscribe)

# backend
step probe 30 "$G/tests/probe_backend" "$BACKEND"
if grep -q "^SKIP  probe\|^FAIL  probe" "$SUMMARY"; then
  note "gpu_check: no usable $BACKEND backend here: $(cat "$OUT/probe.log")"
  exit 1
fi
step test_cuda_backend 60 "$G/tests/test_cuda_backend"
[ "$BACKEND" = cuda ] && step test_simt_emu_gpu 60 "$G/tests/test_simt_emu_gpu"

# conformance
for np in 1 2; do
  step "conformance_np$np" 120 env DTENSOR_CONFORMANCE_BACKEND="$BACKEND" DTENSOR_CHECK_SCRATCH=1 \
    "${MPI[@]}" -np $np \
    "$G/tests/test_conformance"
done

# the NCCL communicator against MPI, bit for bit: np = number of GPUs (NCCL refuses two ranks on
# one GPU), at least 1
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "${ngpu:-0}" -ge 1 ] || ngpu=1
for np in $(printf '%s\n' 1 "$ngpu" | sort -un); do
  step "nccl_conformance_np$np" 120 env DTENSOR_BACKEND="$BACKEND" "${MPI[@]}" -np "$np" \
    "$G/tests/test_comm_conformance"
done

# NCCL's deadline: the comm stream stalled 4 s by the test hook against a 1 s deadline (np 1)
step nccl_timeout_np1 30 env DTENSOR_BACKEND="$BACKEND" DTENSOR_NCCL_STALL_MS=4000 \
  DTENSOR_TIMEOUT_S=1 bash tests/comm/nccl_timeout.sh mpirun "$G/tests/test_nccl_timeout"

# attention's flash path everywhere (auto takes it for the bf16/f16 forward only)
step conformance_sdpa_flash_np1 60 env DTENSOR_CONFORMANCE_BACKEND="$BACKEND" \
  DTENSOR_CONFORMANCE_OPS=sdpa,sdpa_grad DTENSOR_SDPA_PATH=flash "${MPI[@]}" -np 1 \
  "$G/tests/test_conformance"
# ring attention in device memory (np 1: over the NCCL plane; np 2 on one GPU stages through the
# host) on both block paths: auto (bf16/f16 and short f32 blocks fused), the fused flash kernels
# everywhere (flash)
for p in auto flash; do
  step "ring_attention_${p}_np1" 60 env DTENSOR_BACKEND="$BACKEND" DTENSOR_SDPA_PATH="$p" \
    "${MPI[@]}" -np 1 "$G/tests/test_ring_attention"
done

# errors, leaks
step device_errors_np2 60 env DT_DEVICE_BACKEND="$BACKEND" "${MPI[@]}" -np 2 "$G/tests/test_device_errors"
step device_leaks_np2 120 env DT_DEVICE_BACKEND="$BACKEND" "${MPI[@]}" -np 2 "$G/tests/test_device_leaks"

# twins: every dt_device_twins(NAME NP...) of tests/CMakeLists.txt at each of its np (what ctest's
# `cuda` label runs), the paths no GPU has run yet first; the NCCL conformance ran above
declare -A ran=()
twin() { # test np
  ran["$1_np$2"]=1
  step "$1_np$2" 90 env DTENSOR_BACKEND="$BACKEND" "${MPI[@]}" -np "$2" "$G/tests/$1"
}
# asynchronous TP's rings: np 1 computes in device memory (cuBLASLt GEMMs with the rings' strides,
# over NCCL); np 2 shares the GPU (staged through host memory over MPI)
twin test_tp_overlap 1
for t in test_tp_overlap test_ring_attention test_moe test_checkpoint test_data_plane \
         test_after_finalize test_moe_ep; do
  twin "$t" 2
done
while read -r name nps; do
  [ "$name" = test_comm_conformance ] && continue
  for np in $nps; do
    [ -n "${ran["${name}_np$np"]:-}" ] || twin "$name" "$np"
  done
done < <(tools/gpu_twins.sh)

# loss parity on one GPU: np 1, 2, 4 (host-staged communication), f32
step loss_parity 150 env DTENSOR_BACKEND="$BACKEND" bash tests/nn/loss_parity.sh mpirun \
  "$G/examples/train" "$OUT/loss_parity"
# the trainer's parallel configs (TP, SP, loss parallel, FSDP x TP, EP, up to 8 ranks on the GPU)
step parallel_parity 150 env DTENSOR_BACKEND="$BACKEND" bash tests/parallel/parallel_parity.sh \
  mpirun "$G/examples/train" "$OUT/parallel_parity"

# the estimator (train --estimate-only --device cuda: one GPU per rank) against the device runs'
# memory and traffic, configurations of up to $DT_GPU_CHECK_ESTIMATE_NP ranks (default: the GPUs;
# ranks sharing a GPU stage their data through host memory, which the estimate does not assume)
step estimate_cuda 90 env ESTIMATE_ARGS="--device $BACKEND" ESTIMATE_MAX_NP="${DT_GPU_CHECK_ESTIMATE_NP:-$ngpu}" \
  bash tests/estimate/estimate.sh "$G/examples/train" mpirun "$OUT/estimate"

# benchmarks (GPU only)
gemm=na tvt1=na tvt2=na mfu=na nvr=na
if [ "$BACKEND" = cuda ]; then
  if [ -x "$G/bench/bench_gpu" ]; then
    step bench_gpu 120 "$G/bench/bench_gpu"
    gemm=$(sed -n 's/.*gemm_vs_cublaslt=\([0-9.]*\).*/\1/p' "$OUT/bench_gpu.log" 2>/dev/null | tail -n 1)
    # the estimator's compute model of this GPU (GEMM rates, bandwidth, attention's rate: the
    # --machine h100/h200 figures assume them), written to $OUT/compute_cuda.json
    step calibrate_compute 60 env DTENSOR_BACKEND=cuda DTENSOR_COST_MODEL=none "${MPI[@]}" -np 1 \
      "$G/tools/dtensor-calibrate" --compute-only --force -o "$OUT/compute_cuda.json"
    note "$(grep '^compute:' "$OUT/calibrate_compute.log" 2>/dev/null || echo 'compute: na')"
    # attention alone, bf16 at the training shapes: each of our two paths (the variable is read
    # once per process) and PyTorch's SDPA (flash); forward + backward per call, ours / torch
    for p in gemm flash; do
      step "attention_$p" 60 env DTENSOR_SDPA_PATH="$p" "$G/bench/bench_gpu" --attention
    done
    step attention_torch 60 python3 bench/sdpa_torch_gpu.py
    # where attention's kernels spend their time: Nsight Compute (where the machine has it) on the
    # first launch of each, the 125M shape (instruction counts, issue rate, stalls, occupancy)
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
    if [ -n "$ncu" ]; then
      for kp in 'tc_fwd flash' 'tc_dq flash' 'tc_dkv flash' 'attn_softmax gemm' 'attn_ds gemm'; do
        set -- $kp
        step "ncu_$1" 40 env DTENSOR_SDPA_PATH="$2" "$ncu" --clock-control none \
          --section SpeedOfLight --section Occupancy --section LaunchStats \
          --section WarpStateStats --section ComputeWorkloadAnalysis \
          --section InstructionStats -k "regex:dt_$1_kernel" -c 1 "$G/bench/bench_gpu" --attention
      done
    fi
    # ring attention's blocks, f32, the two block paths alternated (two processes each)
    for r in 1 2; do
      for p in gemm flash; do
        step "ring_${p}_$r" 60 env DTENSOR_SDPA_PATH="$p" "$G/bench/bench_gpu" --ring
      done
    done
    # and bf16 inputs (k and v around the ring in bf16; gemm: the blocks' f32 products on f32
    # copies, flash: the tensor-core kernels reading bf16 as stored, accumulating in f32; the 1k
    # shape is the 125M model's: against attention_* above, what the ring costs over bf16 sdpa)
    for p in gemm flash; do
      step "ring_${p}_bf16" 60 env DTENSOR_SDPA_PATH="$p" "$G/bench/bench_gpu" --ring bf16
    done
    for sh in 8k 1k; do
      line="ring $sh step ms:"
      for p in gemm flash; do
        v=$(cat "$OUT/ring_${p}_1.log" "$OUT/ring_${p}_2.log" 2>/dev/null |
          sed -n "s/^ring path=.*ms_$sh=\([0-9.]*\).*/\1/p" | paste -sd/ -)
        b=$(sed -n "s/^ring path=.*ms_$sh=\([0-9.]*\).*/\1/p" "$OUT/ring_${p}_bf16.log" 2>/dev/null)
        line="$line $p ${v:-na} (bf16 ${b:-na})"
      done
      note "$line"
    done
    att_ms() { # LOG PREFIX SHAPE: forward + backward ms from a last line
      sed -n "s/^$2 .*fwd_ms_$3=\([0-9.]*\) bwd_ms_$3=\([0-9.]*\).*/\1 \2/p" "$1" 2>/dev/null |
        tail -n 1 | awk '{ if (NF == 2) printf "%.3f", $1 + $2 }'
    }
    for sh in 125M 1B; do
      t=$(att_ms "$OUT/attention_torch.log" torch_attention "$sh")
      line="attention $sh fwd+bwd ms: torch ${t:-na}"
      for p in gemm flash; do
        o=$(att_ms "$OUT/attention_$p.log" attention "$sh")
        line="$line, ours $p ${o:-na} ($(awk -v a="$o" -v b="$t" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.2fx torch", a / b; else print "na" }'))"
      done
      note "$line"
    done
  fi
  # redistributions over the NCCL plane against raw NCCL (np = number of GPUs; at np 1 the plan
  # moves nothing, so the difference is the per-call overhead)
  if [ -x "$G/bench/bench_nccl" ]; then
    step bench_nccl 120 "${MPI[@]}" -np "$ngpu" "$G/bench/bench_nccl" -b 1M -e 256M -n 10 -r 3
    nvr=$(sed -n 's/^nccl_vs_raw=\([^ ]*\) overhead_us=\([^ ]*\) overlap_fraction=\([^ ]*\).*/\1,overhead_us=\2,overlap_fraction=\3/p' \
      "$OUT/bench_nccl.log" 2>/dev/null | tail -n 1)
  fi
  # asynchronous TP on and off (one rank per GPU: only with two or more)
  if [ "$ngpu" -ge 2 ]; then
    step async_tp 240 env TP="$ngpu" DEVICE=cuda ROUNDS=3 DIM=2048 SEQ=2048 BATCH=2 \
      bash bench/async_tp.sh "$G"
  fi
  # name dim layers heads batch seq steps
  train_pair() {
    local name=$1 dim=$2 layers=$3 heads=$4 batch=$5 seq=$6 steps=$7
    step "train_ours_$name" 150 "${MPI[@]}" -np 1 "$G/examples/train" --device cuda --parallel fsdp \
      --param-dtype bf16 --dim "$dim" --layers "$layers" --heads "$heads" --batch "$batch" \
      --seq "$seq" --steps "$steps" --vocab 256 --order 1 --warmup 2 --metrics "$OUT/ours_$name.jsonl"
    step "train_torch_$name" 150 python3 bench/train_torch_gpu.py --dim "$dim" --layers "$layers" \
      --heads "$heads" --vocab 256 --batch "$batch" --seq "$seq" --steps "$steps"
  }
  train_pair 125M 896 13 14 8 1024 12
  # attention's flash path for the gradient too (bf16: tensor-core wmma kernels, scores on chip)
  # against auto (its gradient on the GEMM path: cuBLASLt products, scores through memory), same
  # model: tells whether auto should take it there too
  step train_ours_125M_flash 150 env DTENSOR_SDPA_PATH=flash "${MPI[@]}" -np 1 "$G/examples/train" \
    --device cuda --parallel fsdp --param-dtype bf16 --dim 896 --layers 13 --heads 14 --batch 8 \
    --seq 1024 --steps 8 --vocab 256 --order 1 --warmup 2 --metrics "$OUT/ours_125M_flash.jsonl"
  train_pair 1B 2048 20 16 4 1024 8
  # where the 125M step's time goes: the op profile (each op waits for its kernels; steps 2-4)
  step train_ours_125M_profile 120 "${MPI[@]}" -np 1 "$G/examples/train" --device cuda \
    --parallel fsdp --param-dtype bf16 --dim 896 --layers 13 --heads 14 --batch 8 --seq 1024 \
    --steps 4 --vocab 256 --order 1 --warmup 2 --profile
  ours_tps() { # median tokens/s of steps 3.. of our metrics
    [ -f "$1" ] && sed -n 's/.*"tokens_per_s":\([0-9.]*\).*/\1/p' "$1" | tail -n +4 | sort -g |
      awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "na"}' || echo na
  }
  ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.3f", a / b; else print "na" }'; }
  for name in 125M 1B; do
    o=$(ours_tps "$OUT/ours_$name.jsonl")
    t=$(sed -n 's/.*torch_tokens_per_s=\([0-9.]*\).*/\1/p' "$OUT/train_torch_$name.log" 2>/dev/null | tail -n 1)
    note "train $name: ours ${o:-na} tokens/s, torch ${t:-na} tokens/s"
    if [ "$name" = 125M ]; then tvt1=$(ratio "$o" "$t"); else tvt2=$(ratio "$o" "$t"); fi
  done
  [ -f "$OUT/ours_125M_flash.jsonl" ] &&
    note "train 125M, attention's flash path: ours $(ours_tps "$OUT/ours_125M_flash.jsonl") tokens/s"
  mfu=$(sed -n 's/.*"mfu":\([0-9.e-]*\).*/\1/p' "$OUT/ours_1B.jsonl" 2>/dev/null | tail -n +4 | sort -g |
        awk '{a[NR]=$1} END {if (NR) printf "%.3f", a[int((NR+1)/2)]; else print "na"}')
fi
ops=$(sed -n 's/^test_conformance np=1: \([0-9]*\) ops.*/\1/p' "$OUT/conformance_np1.log" 2>/dev/null | tail -n 1)
ncc=$(sed -n 's/^nccl_conformance=\(PASS\) cases=\([0-9]*\).*/\1:\2/p' "$OUT/nccl_conformance_np1.log" 2>/dev/null | tail -n 1)
note "gpu_check: gemm_vs_cublaslt=${gemm:-na} train_vs_torch=${tvt1}/${tvt2} mfu=${mfu:-na} conformance_ops=${ops:-0} nccl_conformance=${ncc:-na} nccl_vs_raw=${nvr:-na} failed=$failed elapsed_s=$(elapsed)"
[ "$failed" -eq 0 ]
