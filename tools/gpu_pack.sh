#!/usr/bin/env bash
# gpu_pack.sh [BUILD_DIR] - packs what tools/gpu_check.sh runs on the GPU machine into
# .gpu-build.tar.xz (carried with .gpu-runtime.tar.xz; both are git-ignored): the test programs
# it names, the trainer, bench_gpu and the shared library, stripped (the test programs link the
# library statically, CUDA code and all: about 4 MB each stripped, far less compressed).
#
#   cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTENSOR_CUDA=ON
#   cmake --build build-gpu
#   tools/gpu_runtime.sh --bin build-gpu/tests   # the runtime libraries (.gpu-runtime.tar.xz)
#   tools/gpu_pack.sh build-gpu                  # the programs (.gpu-build.tar.xz)
# then carry .gpu-runtime.tar.xz and .gpu-build.tar.xz and run tools/gpu_check.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build-gpu}
[ -d "$B/tests" ] || { echo "gpu_pack: no build in $B (see the header of this script)" >&2; exit 1; }
# the programs gpu_check.sh names, and every device twin of tests/CMakeLists.txt
mapfile -t twins < <(tools/gpu_twins.sh | cut -d' ' -f1)
TESTS=(probe_backend test_cuda_backend test_simt_emu_gpu test_conformance test_device_errors
       test_device_leaks test_nccl_timeout "${twins[@]}")
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/gpu-build/tests" "$stage/gpu-build/examples" "$stage/gpu-build/bench" \
  "$stage/gpu-build/lib" "$stage/gpu-build/tools"
for t in "${TESTS[@]}"; do
  [ -x "$B/tests/$t" ] || { echo "gpu_pack: $B/tests/$t is missing (a build with DTENSOR_CUDA?)" >&2; exit 1; }
  strip -o "$stage/gpu-build/tests/$t" "$B/tests/$t"
done
strip -o "$stage/gpu-build/examples/train" "$B/examples/train"
strip -o "$stage/gpu-build/tools/dtensor-calibrate" "$B/tools/dtensor-calibrate"
for b in bench_gpu bench_nccl; do
  [ -x "$B/bench/$b" ] && strip -o "$stage/gpu-build/bench/$b" "$B/bench/$b"
done
for so in "$B"/libdtensor.so*; do
  if [ -L "$so" ]; then cp -P "$so" "$stage/gpu-build/lib/"; else strip -o "$stage/gpu-build/lib/$(basename "$so")" "$so"; fi
done
cp tests/reference/ops_fixtures.json tests/reference/special_fixtures.json \
  tests/reference/train_fixture.json "$stage/gpu-build/"
git rev-parse HEAD > "$stage/gpu-build/COMMIT" 2>/dev/null || true
# the test programs each link the static library: one dictionary larger than the whole tar
# lets xz store the shared code once (a default 8 MiB window saw each copy afresh: 78 MiB)
tar -C "$stage" -cf - gpu-build | xz -T1 -9 --lzma2=preset=9,dict=512MiB > .gpu-build.tar.xz
echo "gpu_pack: $(du -sh "$stage/gpu-build" | cut -f1) unpacked, $(du -h .gpu-build.tar.xz | cut -f1) in .gpu-build.tar.xz"
