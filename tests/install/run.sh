#!/usr/bin/env bash
# run.sh BUILD_DIR SOURCE_DIR [MPIEXEC] - installs the build into a temporary prefix and checks
# what a program outside the tree gets from it:
#   1. the shared library's exported CMake interface and its pkg-config --libs name no private
#      dependency (cJSON, OpenBLAS, CUDA, the C++ runtime), and libdtensor.so exports dt_* only;
#   2. a C project (consumer/) and a C++-only project (consumer_cxx/, run under MPIEXEC on 2
#      ranks) build with find_package(dtensor) and run, with pkg-config unable to find cJSON or
#      OpenBLAS and CUDAToolkit disabled (as on a machine without their dev packages), and their
#      link lines name no private dependency;
#   3. the same C and C++ programs build through pkg-config (cc and c++) and run;
#   4. a C project links the static library (find_package(dtensor COMPONENTS static), which needs
#      the dev packages) and runs; without them that component is reported missing;
#   5. dt_tensor_full (deprecated) warns at use, dt_tensor_gather_full does not;
#   6. the installed dtensor-explain runs.
set -euo pipefail
build=$1 src=$2 mpiexec=${3:-mpirun}
here="$src/tests/install"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "install_consumer: FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }
# logged NAME CMD...: runs CMD with its output in $tmp/NAME.log, shown (and a failure) if it fails
logged() {
  local name=$1
  shift
  "$@" >"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log" >&2; fail "$name: '$*' failed"; }
}
mpi2() { "$mpiexec" --allow-run-as-root --oversubscribe -np 2 "$@"; }

prefix="$tmp/prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
so=$(find "$prefix" -name 'libdtensor.so' | head -n 1)
[ -n "$so" ] || fail "no libdtensor.so under $prefix"
libdir=$(dirname "$so")
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
private='cjson|openblas|cuda|cublas|stdc\+\+|PkgConfig::'

step "1. the shared library's interface"
targets="$libdir/cmake/dtensor/dtensorTargets.cmake"
[ -f "$targets" ] || fail "no $targets"
if grep -Ei "$private" "$libdir"/cmake/dtensor/dtensorTargets*.cmake; then
  fail "the shared target's exported interface names a private dependency (above)"
fi
grep -E 'INTERFACE_LINK_LIBRARIES' "$targets" || true
# libdtensor.so's dynamic symbols: the dt_ API and the linker's own, nothing else
extra=$(nm -D --defined-only "$so" | awk '{print $3}' |
        grep -Ev '^(dt_|_init$|_fini$|_edata$|_end$|__bss_start$)' || true)
[ -z "$extra" ] || fail "libdtensor.so exports non-dt_ symbols: $(echo "$extra" | head -n 5)"
echo "libdtensor.so exports $(nm -D --defined-only "$so" | grep -c ' dt_') dt_* symbols only"

# pkg-config sees dtensor.pc and MPI's .pc files only: no libcjson.pc, no openblas.pc
mkdir -p "$tmp/pc"
for m in ompi-c ompi mpi; do
  d=$(pkg-config --variable=pcfiledir "$m" 2>/dev/null || true)
  [ -n "$d" ] && [ -f "$d/$m.pc" ] && ln -sf "$d/$m.pc" "$tmp/pc/$m.pc"
done
nodev=(env PKG_CONFIG_LIBDIR="$libdir/pkgconfig:$tmp/pc" PKG_CONFIG_PATH=)
if "${nodev[@]}" pkg-config --exists libcjson; then fail "the restricted pkg-config finds cJSON"; fi
pclibs=$("${nodev[@]}" pkg-config --cflags --libs dtensor) || fail "pkg-config dtensor: missing .pc"
echo "pkg-config --cflags --libs dtensor: $pclibs"
if echo "$pclibs" | grep -Ei "$private"; then fail "pkg-config --libs names a private one"; fi

step "2. CMake consumers of the shared library, no dev packages of the private dependencies"
nocuda=(-DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
logged c-configure "${nodev[@]}" cmake -S "$here/consumer" -B "$tmp/c" \
  -DCMAKE_PREFIX_PATH="$prefix" "${nocuda[@]}"
logged c-build cmake --build "$tmp/c" -v
if grep -E -- ' -o c( |$)' "$tmp/c-build.log" | grep -Ei "$private"; then
  fail "the C consumer's link line names a private dependency"
fi
"$tmp/c/c"
logged cxx-configure "${nodev[@]}" cmake -S "$here/consumer_cxx" -B "$tmp/cxx" \
  -DCMAKE_PREFIX_PATH="$prefix" "${nocuda[@]}"
if grep -q 'CMAKE_C_COMPILER' "$tmp/cxx/CMakeCache.txt"; then fail "the C++ consumer enabled C"; fi
logged cxx-build cmake --build "$tmp/cxx" -v
if grep -E -- ' -o cxx( |$)' "$tmp/cxx-build.log" | grep -Ei "$private"; then
  fail "the C++ consumer's link line names a private dependency"
fi
mpi2 "$tmp/cxx/cxx"

step "3. pkg-config consumers (cc, c++)"
# shellcheck disable=SC2086 # word splitting of the flags is intended
cc -Wall -Werror "$here/consumer/main.c" $pclibs -o "$tmp/c2"
"$tmp/c2"
# ompi-c has no C++ bindings (libmpi_cxx): C++ code that includes <mpi.h> skips them
# shellcheck disable=SC2086
c++ -std=c++17 -Wall -Werror -DOMPI_SKIP_MPICXX=1 "$here/consumer_cxx/main.cpp" $pclibs \
  -o "$tmp/cxx2"
mpi2 "$tmp/cxx2"

step "4. the static library (COMPONENTS static)"
if "${nodev[@]}" cmake -S "$here/consumer" -B "$tmp/s0" -DCMAKE_PREFIX_PATH="$prefix" \
    -DDT_STATIC=ON "${nocuda[@]}" >"$tmp/s0.log" 2>&1; then
  fail "COMPONENTS static configured without cJSON and OpenBLAS"
fi
grep -q "static library needs" "$tmp/s0.log" || { cat "$tmp/s0.log"; fail "no message"; }
logged s-configure cmake -S "$here/consumer" -B "$tmp/s" -DCMAKE_PREFIX_PATH="$prefix" \
  -DDT_STATIC=ON
logged s-build cmake --build "$tmp/s"
if readelf -d "$tmp/s/c" | grep -q 'libdtensor'; then fail "the static consumer needs the .so"; fi
"$tmp/s/c"

step "5. dt_tensor_full is deprecated"
printf '#include "dtensor/dtensor.h"\nint f(dt_tensor_t t, float* o) { return %s(t, o, 4); }\n' \
  dt_tensor_gather_full >"$tmp/new.c"
sed 's/dt_tensor_gather_full/dt_tensor_full/' "$tmp/new.c" >"$tmp/old.c"
cc -fsyntax-only -Werror -I"$prefix/include" "$tmp/new.c" || fail "dt_tensor_gather_full warns"
if cc -fsyntax-only -Werror -I"$prefix/include" "$tmp/old.c" 2>/dev/null; then
  fail "dt_tensor_full is not marked deprecated"
fi

step "6. dtensor-explain"
"$prefix/bin/dtensor-explain" redistribute --mesh 2 --shape 4 --from S0 --to R --json
echo "install_consumer: ok"
