#!/usr/bin/env bash
# check_simd.sh - fails when a CPU-specific clone of a host kernel (DT_SIMD in
# src/internal/common.h: the `.avx2` and `.avx512f` functions GCC's target_clones makes) holds a
# fused multiply-add. The clones must compute what the baseline build computes, bit for bit; an
# FMA rounds once where the baseline rounds twice (GCC's vectorizer can fuse a * b +- c * d even
# with -ffp-contract=off).
#
#   tools/check_simd.sh LIBRARY        (libdtensor.so or libdtensor.a)
#
# Exit 0: no FMA in a clone (it prints how many clones it read); 1: the clones holding one;
# 77 (skipped): no objdump, or a build without clones (clang, non-x86, non-glibc).
set -euo pipefail
lib=${1:?usage: check_simd.sh LIBRARY}
command -v objdump > /dev/null || { echo "check_simd: no objdump: skipped"; exit 77; }
objdump -d --no-show-raw-insn "$lib" | awk '
  /^[0-9a-f]+ <[^>]*>:$/ {
    fn = $2; gsub(/[<>:]/, "", fn)
    clone = fn ~ /\.(avx2|avx512f)$/
    if (clone) n++
    next
  }
  clone && $0 ~ /[[:space:]]v?f(n)?m(add|sub|addsub|subadd)[0-9]+[ps][sd][[:space:]]/ { bad[fn]++ }
  END {
    if (n == 0) { print "check_simd: no clones in this build: skipped"; exit 77 }
    nb = 0
    for (f in bad) { printf "check_simd: %s holds %d fused multiply-adds\n", f, bad[f]; nb++ }
    if (nb) exit 1
    printf "check_simd: %d clones, no fused multiply-add\n", n
  }'
