#!/usr/bin/env bash
# gpu_runtime_selftest.sh: prove, on this (Debian, no GPU) machine, that the archive made by
# tools/gpu_runtime.sh runs our MPI tests with the system's Open MPI, PMIx, hwloc, libevent,
# OpenBLAS, cJSON (every package the archive carries), the CUDA toolkit, ssh and xz hidden.
#
#   tools/gpu_runtime_selftest.sh [--archive FILE] [--build DIR] [--test NAME]...
#
# Defaults: --archive .gpu-runtime.tar.xz, --build build, --test test_host_mpi --test test_ops_mpi.
# Needs root and util-linux unshare. Runs in a private mount and network namespace (only lo):
#  1. hides every file of the carried packages (a decoy that is neither an ELF library nor a
#     working program is bind-mounted over each), their folders, /usr/local/cuda*, ssh and xz;
#  2. negative controls: mpirun and a test binary must FAIL there without gpu_env.sh (else the
#     hiding did not work and the test fails);
#  3. sources tools/gpu_env.sh on the archive (unpacked into a temp folder, by Python since xz is
#     hidden), runs `mpirun -np 2 <test>` with LD_DEBUG=libs and checks that every library any
#     process loaded came from the unpacked archive or from glibc/libgcc, and that libmpi,
#     libopen-pal, libpmix, libhwloc, libevent, libopenblas, libcjson and the vader and PMIx
#     components were loaded from the archive;
#  4. cuBLASLt discovery: fake site-packages (a fake python3 on PATH that reports them) in the
#     CUDA 13 wheel layout nvidia/cu13/lib, the older nvidia/cublas/lib, torch/lib, and
#     DTENSOR_CUDA_LIBDIR; a missing one must give a clear error. With the real libcublasLt
#     bind-mounted into the fake wheel, a probe linked to cudart and cublasLt runs under mpirun
#     and must load cudart from the archive and cuBLASLt from the fake site-packages.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ARCHIVE=$REPO/.gpu-runtime.tar.xz
BUILD=$REPO/build
TESTS=()
INNER=0
while [ $# -gt 0 ]; do
  case "$1" in
    --archive) ARCHIVE=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --test) TESTS+=("$2"); shift 2 ;;
    --inner) INNER=1; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[ ${#TESTS[@]} -gt 0 ] || TESTS=(test_host_mpi test_ops_mpi)

# =================================== outer: prepare, then re-enter in a namespace ==================
if [ $INNER = 0 ]; then
  fail() { echo "gpu_runtime_selftest: FAILED: $*" >&2; exit 1; }
  [ "$(id -u)" = 0 ] || fail "needs root (unshare --mount, bind mounts)"
  command -v unshare >/dev/null || fail "needs util-linux unshare"
  ARCHIVE=$(readlink -f "$ARCHIVE"); BUILD=$(readlink -f "$BUILD")
  [ -f "$ARCHIVE" ] || fail "no archive $ARCHIVE (run tools/gpu_runtime.sh --bin <build>/tests first)"
  for t in "${TESTS[@]}"; do [ -x "$BUILD/tests/$t" ] || fail "no test binary $BUILD/tests/$t"; done
  T=$(mktemp -d /tmp/gpu_runtime_selftest.XXXXXX)
  trap 'rm -rf "$T"' EXIT
  # the manifest: which packages to hide
  mkdir -p "$T/peek"
  xz -dc "$ARCHIVE" | tar -xf - -C "$T/peek" ./manifest || fail "cannot read the manifest of $ARCHIVE"
  # a probe linked to the CUDA runtime and cuBLASLt, built against the toolkit here
  CUDA=${CUDA_HOME:-/usr/local/cuda}
  if [ -s "$T/peek/manifest/external.txt" ] && [ -f "$CUDA/include/cublasLt.h" ]; then
    cat >"$T/cuda_probe.c" <<'EOF'
#include <stdio.h>
#include <cuda_runtime.h>
#include <cublasLt.h>
int main(void) {
  int n = -1;
  cudaError_t e = cudaGetDeviceCount(&n);
  cublasLtHandle_t h;
  cublasStatus_t s = cublasLtCreate(&h);
  if (s == CUBLAS_STATUS_SUCCESS) cublasLtDestroy(h);
  printf("cuda_probe: cudaGetDeviceCount %d (count %d), cublasLtCreate %d, cuBLASLt version %zu\n",
         (int)e, n, (int)s, cublasLtGetVersion());
  return 0;
}
EOF
    cc -O1 -o "$T/cuda_probe" "$T/cuda_probe.c" -I"$CUDA/include" -L"$CUDA/lib64" \
      -lcudart -lcublasLt -Wl,-rpath,"$CUDA/lib64" || fail "cannot build the CUDA probe"
    LT=$(readlink -f "$CUDA/lib64/libcublasLt.so.13")
  else
    LT=""
  fi
  export ST_T=$T ST_ARCHIVE=$ARCHIVE ST_BUILD=$BUILD ST_LT=$LT
  export ST_TESTS="${TESTS[*]}"
  unshare --mount --net --fork -- bash "$0" --inner
  exit $?
fi

# =================================== inner: in the namespace =======================================
T=$ST_T
npass=0 nfail=0
pass() { echo "PASS: $*"; npass=$((npass + 1)); }
fail() { echo "FAIL: $*"; nfail=$((nfail + 1)); }
finish() {
  if [ $nfail = 0 ]; then
    echo "gpu_runtime_selftest: PASSED ($npass checks)"; exit 0
  fi
  echo "gpu_runtime_selftest: FAILED ($nfail of $((npass + nfail)) checks)"; exit 1
}
M=$T/peek/manifest
mount --make-rprivate / 2>/dev/null
ip link set lo up 2>/dev/null || echo "note: could not bring lo up"

# ---- 1. hide ------------------------------------------------------------------------------------
printf '#!/bin/sh\necho "hidden by gpu_runtime_selftest" >&2\nexit 99\n' >"$T/decoy"
chmod 755 "$T/decoy"
mkdir -p "$T/empty"
info() { sed -n "s/^$1=//p" "$M/info.txt"; }
pkglibdir=$(info ompi_pkglibdir)
HIDE_DIRS=("$(dirname "$(dirname "$pkglibdir")")" "$(info pmix_prefix)" "$(info ompi_sysconfdir)"
  /usr/share/openmpi /usr/lib/x86_64-linux-gnu/hwloc /usr/lib/x86_64-linux-gnu/openblas-pthread)
for d in /usr/local/cuda*; do
  d=$(readlink -f "$d")
  case " ${HIDE_DIRS[*]} " in *" $d "*) ;; *) HIDE_DIRS+=("$d") ;; esac
done
# the real cuBLASLt, bind-mounted into a fake CUDA 13 wheel before the toolkit is hidden
SP=$T/site1/lib/python3.12/site-packages
mkdir -p "$SP/nvidia/cu13/lib"
touch "$SP/nvidia/cu13/lib/libcublasLt.so.13"
[ -n "$ST_LT" ] && mount --bind "$ST_LT" "$SP/nvidia/cu13/lib/libcublasLt.so.13"
# glibc and libgcc files: the only libraries allowed from the system (listed before hiding:
# dpkg-query itself needs some of the libraries hidden below)
dpkg-query -L libc6 libgcc-s1 2>/dev/null | while read -r f; do [ -f "$f" ] && readlink -f "$f"; done |
  sort -u >"$T/system-ok"
# compat libraries (zlib, libudev, ...) that this test's own tools need stay visible; gpu_env.sh
# then picks the system's copy for them, and the carried one for the rest
KEEP_VISIBLE=$(for t in bash python3 tar grep sed awk dpkg-query mount timeout; do
  p=$(PATH=/usr/sbin:/usr/bin:/sbin:/bin command -v "$t") && ldd "$p" 2>/dev/null | awk '$2 == "=>" {print $3}'; done |
  xargs -r readlink -f | sort -u)
pkgs=$(cut -f1 "$M/packages.tsv")
: >"$T/hide-files"
for p in $pkgs; do dpkg-query -L "$p" 2>/dev/null; done |
  while read -r f; do [ -f "$f" ] && readlink -f "$f"; done | sort -u >"$T/pkg-files"
nfile=0 ndir=0 kept=""
while read -r r; do
  skip=0
  for d in "${HIDE_DIRS[@]}"; do case "$r" in "$d"/*) skip=1 ;; esac; done
  [ $skip = 1 ] && continue
  if grep -qxF "$r" <<<"$KEEP_VISIBLE"; then
    # allowed from the system only when the archive carries it as a compat library
    if awk -F'\t' -v r="$r" '$1 == "compat" && $3 == r {f = 1} END {exit !f}' "$M/libs.tsv"; then
      kept="$kept $(basename "$r")"; echo "$r" >>"$T/system-ok"; continue
    fi
  fi
  mount --bind "$T/decoy" "$r" && nfile=$((nfile + 1))
done <"$T/pkg-files"
for f in /usr/bin/ssh /usr/bin/rsh; do [ -e "$f" ] && mount --bind "$T/decoy" "$(readlink -f "$f")"; done
# xz: absent rather than broken (a file without the executable bit)
: >"$T/noexec"; chmod 644 "$T/noexec"
[ -e /usr/bin/xz ] && mount --bind "$T/noexec" "$(readlink -f /usr/bin/xz)"
for d in "${HIDE_DIRS[@]}"; do
  [ -d "$d" ] && mount --bind "$T/empty" "$d" && ndir=$((ndir + 1))
done
echo "hidden: $nfile files of $(echo "$pkgs" | wc -w) packages, $ndir folders (${HIDE_DIRS[*]}), ssh, xz"
echo "kept visible (this test's own tools need them):${kept:- none}"

# ---- 2. negative controls: nothing of the system's runtime must work now -------------------------
TEST1=$ST_BUILD/tests/${ST_TESTS%% *}
if mpirun -np 1 true >/dev/null 2>&1; then
  fail "the system's mpirun still runs: the hiding did not work"
else
  pass "without gpu_env.sh, mpirun fails (system Open MPI hidden)"
fi
if "$TEST1" >/dev/null 2>&1; then
  fail "$TEST1 still runs without gpu_env.sh: the hiding did not work"
else
  pass "without gpu_env.sh, $(basename "$TEST1") cannot load its libraries"
fi
if [ -s /usr/lib/x86_64-linux-gnu/libmpi.so.40 ] && head -c 4 /usr/lib/x86_64-linux-gnu/libmpi.so.40 | grep -q ELF; then
  fail "/usr/lib/x86_64-linux-gnu/libmpi.so.40 is still an ELF file"
fi
if command -v xz >/dev/null && xz --version >/dev/null 2>&1; then
  fail "xz still works (the python3 unpack path is not tested)"
fi

# ---- 3. the archive: unpack (python3, no xz), source, run ---------------------------------------
export DTENSOR_GPU_RUNTIME_ARCHIVE=$ST_ARCHIVE DTENSOR_GPU_RUNTIME_DIR=$T/rt
ORIG_PATH=$PATH
# fake python3: reports the fake site-packages to gpu_env.sh's query, else is Debian's python3
fake_python() { # folder, site-packages...
  local dir=$1 sp; shift
  mkdir -p "$dir"
  {
    echo '#!/bin/sh'
    echo 'case "$*" in *getsitepackages*)'
    for sp in "$@"; do echo "  echo $sp"; done
    echo '  exit 0 ;;'
    echo 'esac'
    echo 'exec /usr/bin/python3 "$@"'
  } >"$dir/python3"
  chmod 755 "$dir/python3"
}
fake_python "$T/fakebin1" "$SP"
# only the fake python3 and Debian's own (which has no nvidia wheels) are on PATH
export PATH=$T/fakebin1:/usr/sbin:/usr/bin:/sbin:/bin
line=$(source "$REPO/tools/gpu_env.sh" 2>&1 >/dev/null; echo "rc=$?")
echo "$line"
case "$line" in
  *"(unpacked)"*rc=0) pass "gpu_env.sh unpacked the archive without xz and set up" ;;
  *) fail "gpu_env.sh did not unpack/set up: $line" ;;
esac
# shellcheck source=/dev/null
line=$(source "$REPO/tools/gpu_env.sh" 2>&1; echo "rc=$?")
case "$line" in
  *"(reused)"*rc=0) pass "second source reuses the unpacked folder" ;;
  *) fail "second source: $line" ;;
esac
# shellcheck source=/dev/null
source "$REPO/tools/gpu_env.sh" 2>/dev/null
# shellcheck source=/dev/null
source "$REPO/tools/gpu_env.sh" 2>/dev/null || fail "gpu_env.sh returned non-zero"
RT=${DTENSOR_GPU_RUNTIME:-/nonexistent}
n_ld=$(tr ':' '\n' <<<"$LD_LIBRARY_PATH" | grep -c "^$RT")
n_path=$(tr ':' '\n' <<<"$PATH" | grep -c "^$RT")
if [ "$n_path" = 1 ] && [ "$(tr ':' '\n' <<<"$LD_LIBRARY_PATH" | sort | uniq -d | wc -l)" = 0 ]; then
  pass "idempotent: sourced 4 times, PATH has the runtime once, LD_LIBRARY_PATH no duplicates ($n_ld runtime folders)"
else
  fail "not idempotent: PATH=$PATH LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
fi
if [ "$(command -v mpirun)" = "$RT/bin/mpirun" ]; then
  pass "mpirun is the archive's ($RT/bin/mpirun)"
else
  fail "mpirun resolves to $(command -v mpirun)"
fi

check_loads() { # LD_DEBUG folder, label, extra allowed prefix; prints violations
  local dir=$1 label=$2 allow=${3:-} f r bad=0 procs
  procs=$(ls "$dir" | wc -l)
  grep -h "calling init:" "$dir"/* | awk '{print $NF}' | sort -u >"$T/loaded"
  while read -r f; do
    r=$(readlink -f "$f")
    case "$f" in "$RT"/*) continue ;; esac
    [ -n "$allow" ] && case "$f" in "$allow"/*) continue ;; esac
    grep -qxF "$r" "$T/system-ok" && continue
    echo "  $label: loaded from outside the archive: $f"
    bad=1
  done <"$T/loaded"
  [ $bad = 0 ] || return 1
  echo "  $label: $procs processes, $(wc -l <"$T/loaded") distinct libraries, all from $RT or glibc/libgcc"
}
need_from_rt() { # LD_DEBUG folder, label, regexes
  local dir=$1 label=$2 re ok=0; shift 2
  for re in "$@"; do
    if ! grep -h "calling init:" "$dir"/* | awk '{print $NF}' | grep -E "$re" | grep -q "^$RT/"; then
      echo "  $label: $re was not loaded from the archive"; ok=1
    fi
  done
  return $ok
}

# a compat library the system has but in too old a version must come from the archive
cp "$RT/manifest/compat-needs.tsv" "$T/compat-needs.save"
printf 'libz.so.1\tZLIB_99.0\n' >>"$RT/manifest/compat-needs.tsv"
line=$(source "$REPO/tools/gpu_env.sh" 2>&1 >/dev/null)
cp "$T/compat-needs.save" "$RT/manifest/compat-needs.tsv"
case "$line" in
  *"carried compat:"*" libz"*) pass "compat: a system libz without a needed symbol version is replaced by the carried one" ;;
  *) fail "compat: system libz lacking ZLIB_99.0 was still used: $line" ;;
esac
source "$REPO/tools/gpu_env.sh" 2>/dev/null

for t in $ST_TESTS; do
  bin=$ST_BUILD/tests/$t
  rm -rf "$T/ld.$t"; mkdir -p "$T/ld.$t"
  out=$(LD_DEBUG=libs LD_DEBUG_OUTPUT=$T/ld.$t/ld OPENBLAS_NUM_THREADS=1 \
        timeout 300 mpirun -np 2 "$bin" 2>&1); rc=$?
  echo "$out" | tail -3 | sed "s/^/  $t: /"
  if [ $rc != 0 ]; then fail "mpirun -np 2 $t: rc $rc"; continue; fi
  pass "mpirun -np 2 $t: rc 0"
  if check_loads "$T/ld.$t" "$t" && need_from_rt "$T/ld.$t" "$t" '/libmpi\.so' '/libopen-pal\.so' \
       '/libopen-rte\.so' '/libpmix\.so' '/libhwloc\.so' '/libevent_core' '/libopenblas' '/libcjson' \
       '/mca_btl_vader\.so' '/mca_pml_ob1\.so' '/pmix_mca_[a-z_]+\.so'; then
    pass "$t: Open MPI, PMIx, hwloc, libevent, OpenBLAS, cJSON and the vader/PMIx plugins came from the archive"
  else
    fail "$t: libraries from outside the archive (see above)"
  fi
  [ "$(ls "$T/ld.$t" | wc -l)" -ge 3 ] || fail "$t: expected LD_DEBUG logs of mpirun and 2 ranks"
done

# ---- 4. cuBLASLt discovery ------------------------------------------------------------------------
if [ ! -s "$M/external.txt" ]; then
  echo "note: the archive asks for no CUDA library (made with --no-cuda): discovery not tested"
  finish
fi
try_env() { # PATH-first fake bin, expected substring; prints the line
  PATH=$1:/usr/sbin:/usr/bin:/sbin:/bin bash -c 'source "$0/tools/gpu_env.sh" 2>&1 >/dev/null; echo "rc=$?"' "$REPO"
}
mklayout() { # name, relative lib folder; makes a fake site-packages and python3 reporting it
  local sp=$T/$1/site-packages
  mkdir -p "$sp/$2"
  : >"$sp/$2/libcublasLt.so.13"
  fake_python "$T/$1/bin" /nonexistent "$sp"
}
mklayout wheel12 nvidia/cublas/lib
mklayout torchlib torch/lib
mkdir -p "$T/override"
fake_python "$T/none/bin" "$T/none"
: >"$T/override/libcublasLt.so.13"
for c in "wheel12|$T/wheel12/bin|$T/wheel12/site-packages/nvidia/cublas/lib" \
         "torchlib|$T/torchlib/bin|$T/torchlib/site-packages/torch/lib" \
         "cu13|$T/fakebin1|$SP/nvidia/cu13/lib"; do
  IFS='|' read -r name bin want <<<"$c"
  line=$(unset DTENSOR_CUDA_LIBDIR; try_env "$bin")
  case "$line" in
    *"libcublasLt $want "*rc=0) pass "finder: $name layout -> $want" ;;
    *) fail "finder: $name layout: $line" ;;
  esac
done
line=$(DTENSOR_CUDA_LIBDIR=$T/override try_env "$T/wheel12/bin")
case "$line" in
  *"libcublasLt $T/override "*rc=0) pass "finder: DTENSOR_CUDA_LIBDIR wins over site-packages" ;;
  *) fail "finder: DTENSOR_CUDA_LIBDIR: $line" ;;
esac
line=$(try_env "$T/none/bin")
echo "  missing: $line"
case "$line" in
  *"error: not found on this machine: libcublasLt.so.13"*rc=1) pass "finder: a missing cuBLASLt gives a clear error and rc 1" ;;
  *) fail "finder: missing cuBLASLt: $line" ;;
esac
line=$(DTENSOR_GPU_ENV_NO_CUDA=1 try_env "$T/none/bin")
case "$line" in
  *rc=0) pass "finder: DTENSOR_GPU_ENV_NO_CUDA=1 skips the search" ;;
  *) fail "finder: DTENSOR_GPU_ENV_NO_CUDA=1: $line" ;;
esac

if [ -n "$ST_LT" ] && [ -x "$T/cuda_probe" ]; then
  rm -rf "$T/ld.probe"; mkdir -p "$T/ld.probe"
  out=$(LD_DEBUG=libs LD_DEBUG_OUTPUT=$T/ld.probe/ld timeout 120 mpirun -np 2 "$T/cuda_probe" 2>&1); rc=$?
  echo "$out" | sed 's/^/  /'
  if [ $rc = 0 ] && echo "$out" | grep -q "cuda_probe: cudaGetDeviceCount"; then
    pass "cuda_probe (cudart + cuBLASLt) runs under mpirun -np 2 with the toolkit hidden"
    if check_loads "$T/ld.probe" cuda_probe "$SP" &&
       grep -h "calling init:" "$T"/ld.probe/* | grep -q " $RT/cuda/libcudart.so" &&
       grep -h "calling init:" "$T"/ld.probe/* | grep -q " $SP/nvidia/cu13/lib/libcublasLt.so.13"; then
      pass "cuda_probe: libcudart from the archive, libcublasLt from the fake site-packages"
    else
      grep -h "calling init:" "$T"/ld.probe/* | grep -E "cudart|cublas" | sort -u | sed 's/^/  /'
      fail "cuda_probe: CUDA libraries from the wrong place"
    fi
  else
    fail "cuda_probe under mpirun: rc $rc"
  fi
else
  echo "note: no CUDA toolkit here: the probe was not run (finder tests above still ran)"
fi
PATH=$ORIG_PATH
finish
