#!/usr/bin/env bash
# dev.sh - build, run and test dtensor on Debian 12. Installs missing Debian packages when root.
#
#   tools/dev.sh example   build and run the trainer example under mpirun (4 ranks)
#   tools/dev.sh test      build (warnings as errors) and run the whole test suite, then the
#                          sanitizer build (ASan + UBSan) of the same suite
#   tools/dev.sh bench     build and run the benchmarks (redistribution at 2 and 4 ranks,
#                          planning latency, op dispatch)
#
# Environment: NP (example ranks, default 4), BUILD_DIR (default build), DTENSOR_SKIP_ASAN=1.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake ninja-build pkg-config openmpi-bin libopenmpi-dev libopenblas-dev
      libcmocka-dev libcjson-dev)

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

configure_build() { # dir, extra cmake args...
  local dir=$1
  shift
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTENSOR_WERROR=ON "$@" >/dev/null
  cmake --build "$dir" -j "$(nproc)"
}

cmd=${1:-}
case "$cmd" in
  example)
    install_deps
    B=${BUILD_DIR:-build}
    configure_build "$B"
    mpirun -np "${NP:-4}" "$B/examples/train" --model "${MODEL:-dense}" \
      --metrics train_metrics.jsonl --plot train_loss.png
    ;;
  test)
    install_deps
    B=${BUILD_DIR:-build}
    configure_build "$B"
    (cd "$B" && ctest --output-on-failure -j 2)
    if [ "${DTENSOR_SKIP_ASAN:-0}" != 1 ]; then
      echo "== sanitizer build (ASan + UBSan) =="
      configure_build "$B-asan" -DDTENSOR_SANITIZE=ON -DDTENSOR_BUILD_TOOLS=ON
      # Open MPI keeps allocations past exit and dlcloses components; see docs/testing.md.
      export OMPI_MCA_mca_base_component_disable_dlclose=1
      export ASAN_OPTIONS=fast_unwind_on_malloc=0:detect_leaks=1
      export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
      export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
      (cd "$B-asan" && ctest --output-on-failure -j 2)
    fi
    ;;
  bench)
    install_deps
    B=${BUILD_DIR:-build}
    configure_build "$B"
    for np in 2 4; do mpirun -np $np "$B/bench/bench_redistribute"; done
    "$B/bench/bench_plan"
    "$B/bench/bench_dispatch"
    ;;
  *)
    echo "usage: tools/dev.sh example|test|bench" >&2
    exit 2
    ;;
esac
