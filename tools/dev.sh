#!/usr/bin/env bash
# dev.sh - build, run and test dtensor on Debian 12. Installs missing Debian packages when root.
#
#   tools/dev.sh example   build the trainer and examples/mlp (only they and the library), run the
#                          trainer under mpirun (4 ranks); prints how long each took
#   tools/dev.sh test      build (warnings as errors) and run the whole test suite, then the
#                          sanitizer build (ASan + UBSan) of the same suite
#   tools/dev.sh bench     build and run the benchmarks (redistribution at 2 and 4 ranks,
#                          planning latency, op dispatch)
#   tools/dev.sh fuzz [SECONDS]
#                          build the libFuzzer harnesses (clang) and run each for SECONDS
#                          (default 60); new corpus entries and crash files stay in fuzz-out/
#
# `test` also builds the harnesses and runs each on its seed corpus and for FUZZ_SECONDS (default
# 6) more; a crash fails it. Environment: NP (example ranks, default 4), BUILD_DIR (default
# build), DTENSOR_SKIP_ASAN=1, DTENSOR_SKIP_FUZZ=1, FUZZ_SECONDS.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake ninja-build pkg-config openmpi-bin libopenmpi-dev libopenblas-dev
      libcmocka-dev libcjson-dev libxxhash-dev clang libclang-rt-14-dev gnuplot-nox)

install_deps() {
  local missing=()
  for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "dev.sh: installing missing Debian packages: ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "dev.sh: not root; run: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Open MPI refuses to run as root and to start more ranks than cores unless told otherwise.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1

# The CUDA toolkit: where nvcc is installed the cuda backend must build (DTENSOR_CUDA=ON fails the
# configure instead of leaving it out); elsewhere AUTO builds without it.
CUDA_FLAG=-DDTENSOR_CUDA=AUTO
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
if command -v nvcc >/dev/null 2>&1; then CUDA_FLAG=-DDTENSOR_CUDA=ON; fi

configure() { # dir, extra cmake args...
  local dir=$1
  shift
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTENSOR_WERROR=ON "$@" >/dev/null
}

configure_build() { # dir, extra cmake args...: everything (library, tools, tests, benchmarks)
  configure "$@"
  cmake --build "$1" -j "$(nproc)"
}

FUZZERS=(placement cost_model explain train_config plan_pattern ckpt_index ckpt_header)

build_fuzzers() { # dir
  CC=clang cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTENSOR_WERROR=ON \
    -DDTENSOR_FUZZ=ON -DDTENSOR_BUILD_TESTS=OFF -DDTENSOR_BUILD_TOOLS=OFF -DDTENSOR_CUDA=OFF \
    -DDTENSOR_SIMT_EMU=OFF >/dev/null
  cmake --build "$1" -j "$(nproc)" --target dtensor_fuzzers
}

# Runs every harness for $2 seconds on its seed corpus (tests/fuzz/corpus/<name>, read only) with
# new entries in $3/<name>/corpus and crash files in $3/<name>/; returns non-zero on any finding.
run_fuzzers() { # build dir, seconds, output dir
  local rc=0
  for f in "${FUZZERS[@]}"; do
    mkdir -p "$3/$f/corpus"
    if ! ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        "$1/tests/fuzz/fuzz_$f" -max_total_time="$2" -timeout=10 -rss_limit_mb=2048 \
        -max_len=4096 -print_final_stats=1 -dict="tests/fuzz/$f.dict" \
        -artifact_prefix="$3/$f/" "$3/$f/corpus" "tests/fuzz/corpus/$f" > "$3/$f.log" 2>&1; then
      echo "dev.sh: fuzz_$f found a problem (log: $3/$f.log, inputs: $3/$f/crash-* etc.)" >&2
      tail -n 40 "$3/$f.log" >&2
      rc=1
    fi
    echo "fuzz_$f: $(grep -E '^stat::number_of_executed_units' "$3/$f.log" | awk '{print $2}') runs in $2 s"
  done
  return $rc
}

cmd=${1:-}
case "$cmd" in
  example)
    install_deps
    B=${BUILD_DIR:-build}
    t0=$SECONDS
    configure "$B"
    cmake --build "$B" -j "$(nproc)" --target train mlp # the examples and the library, only
    t1=$SECONDS
    mpirun -np "${NP:-4}" "$B/examples/train" --model "${MODEL:-dense}" \
      --metrics train_metrics.jsonl --plot train_loss.png
    echo "dev.sh: build $((t1 - t0)) s, training $((SECONDS - t1)) s" \
      "($(nproc) cores; \`tools/dev.sh test\` builds the rest)"
    ;;
  test)
    install_deps
    B=${BUILD_DIR:-build}
    configure_build "$B" "$CUDA_FLAG"
    (cd "$B" && ctest --output-on-failure -j 2)
    if [ "${DTENSOR_SKIP_ASAN:-0}" != 1 ]; then
      echo "== sanitizer build (ASan + UBSan) =="
      # the CUDA code is compiled, and run by the SIMT emulator, in the plain build above; the
      # emulator is left out here (it doubled this half's build and test time: CI's 30 minutes)
      configure_build "$B-asan" -DDTENSOR_SANITIZE=ON -DDTENSOR_BUILD_TOOLS=ON -DDTENSOR_CUDA=OFF \
        -DDTENSOR_SIMT_EMU=OFF
      # Open MPI keeps allocations past exit and dlcloses components; see docs/testing.md.
      export OMPI_MCA_mca_base_component_disable_dlclose=1
      export ASAN_OPTIONS=detect_leaks=1
      export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
      export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
      # The cpu-backend half of the suite: the guarded backend's copies of each test check the
      # same memory errors ASan does (test_backend_guarded_np2 still runs the guarded backend).
      (cd "$B-asan" && ctest --output-on-failure -j 2 -LE guarded)
    fi
    if [ "${DTENSOR_SKIP_FUZZ:-0}" != 1 ]; then
      echo "== fuzzers (libFuzzer + ASan + UBSan, ${FUZZ_SECONDS:-6} s each) =="
      build_fuzzers "$B-fuzz"
      out=$(mktemp -d)
      run_fuzzers "$B-fuzz" "${FUZZ_SECONDS:-6}" "$out" || { echo "inputs kept in $out" >&2; exit 1; }
      rm -rf "$out"
    fi
    ;;
  fuzz)
    install_deps
    build_fuzzers "${BUILD_DIR:-build}-fuzz"
    run_fuzzers "${BUILD_DIR:-build}-fuzz" "${2:-60}" fuzz-out
    ;;
  bench)
    install_deps
    B=${BUILD_DIR:-build}
    configure "$B"
    cmake --build "$B" -j "$(nproc)" --target bench_redistribute bench_plan bench_dispatch
    for np in 2 4; do mpirun -np $np "$B/bench/bench_redistribute"; done
    "$B/bench/bench_plan"
    "$B/bench/bench_dispatch"
    ;;
  *)
    echo "usage: tools/dev.sh example|test|bench|fuzz [SECONDS]" >&2
    exit 2
    ;;
esac
