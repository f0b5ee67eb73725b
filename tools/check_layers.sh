#!/usr/bin/env bash
# check_layers.sh - fails when a source file includes a header of a layer above its own.
#
#   tools/check_layers.sh [SRC_DIR]     (default: the src/ next to this script)
#
# Layers, bottom up (a file may include its own layer and the ones below):
#   0 core (src/core, src/internal)   1 placement   2 backend, comm   3 mesh   4 redistribute
#   5 tensor   6 strategy   7 ops   8 autograd   9 lib.c (init/finalize of every layer)
# src/nn and src/parallel are built on the public API: they include only <dtensor/...> headers
# (and the C library); src/checkpoint too, and its own checkpoint/format.h. Public headers (include/dtensor) may include only each other.
# Tensor bytes above the backend seam: outside src/backend and the kernels (src/ops/kernels_*.c,
# src/ops/cuda/), no memcpy/memset/memmove may take a tensor's data (`->data`, `.data`) and no
# tensor data may be cast to a typed pointer (only backend members move or read it: a device
# backend's memory is not host memory); src/nn and src/parallel may not take a tensor's local
# pointer at all (dt_tensor_to_local, dt_tensor_from_local: they use dt_tensor_read_local,
# dt_tensor_write_local, dt_tensor_copy_local, dt_tensor_fill_local).
# Exit status 0 when every include goes downward and no tensor bytes are touched above the seam,
# 1 with one line per violation otherwise.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
src=${1:-$here/src}
inc=$(cd "$src/../include" 2>/dev/null && pwd || true)

layer_of() { # path relative to src -> layer number, or "public"
  case "$1" in
    core/* | internal/*) echo 0 ;;
    placement/*) echo 1 ;;
    backend/* | comm/*) echo 2 ;;
    mesh/*) echo 3 ;;
    redistribute/*) echo 4 ;;
    tensor/*) echo 5 ;;
    strategy/*) echo 6 ;;
    ops/*) echo 7 ;;
    autograd/*) echo 8 ;;
    lib.c) echo 9 ;;
    nn/* | parallel/*) echo public ;;
    checkpoint/*) echo checkpoint ;;
    *) echo unknown ;;
  esac
}

bad=0
report() {
  echo "check_layers: $1"
  bad=1
}

while IFS= read -r -d '' f; do
  rel=${f#"$src"/}
  mine=$(layer_of "$rel")
  if [ "$mine" = unknown ]; then
    report "$rel: file outside every known layer (add its folder to tools/check_layers.sh)"
    continue
  fi
  while IFS= read -r line; do
    n=${line%%:*}
    hdr=$(sed -E 's/^[^"]*"([^"]+)".*/\1/' <<<"${line#*:}")
    case "$hdr" in
      dtensor/*) continue ;; # the public API is below every internal layer
      ../* | */../*) report "$rel:$n: relative include \"$hdr\" hides its layer"; continue ;;
    esac
    if [ "$mine" = checkpoint ]; then
      case "$hdr" in checkpoint/*) continue ;; esac
      report "$rel:$n: includes \"$hdr\"; checkpoint may include only <dtensor/...> and checkpoint/"
      continue
    fi
    if [ "$mine" = public ]; then
      report "$rel:$n: includes \"$hdr\"; nn and parallel may include only <dtensor/...>"
      continue
    fi
    theirs=$(layer_of "$hdr")
    if [ "$theirs" = unknown ] || [ "$theirs" = public ]; then
      report "$rel:$n: includes \"$hdr\", which is not an internal header of a known layer"
    elif [ "$theirs" -gt "$mine" ]; then
      report "$rel:$n: layer $mine includes \"$hdr\" of layer $theirs (above)"
    fi
  done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" || true)
done < <(find "$src" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cpp' \) -print0 | sort -z)

# Tensor bytes above the seam (see the header).
while IFS= read -r -d '' f; do
  rel=${f#"$src"/}
  case "$rel" in backend/* | ops/kernels_* | ops/cuda/*) continue ;; esac
  while IFS= read -r line; do
    report "$rel:${line%%:*}: tensor data moved with the C library above the backend seam (use a backend member or dt_tensor_*_local)"
  done < <(grep -nE '\b(memcpy|memset|memmove)[[:space:]]*\(.*(->|\.)data\b' "$f" | grep -v 'iface->' || true)
  while IFS= read -r line; do
    report "$rel:${line%%:*}: tensor data read through a typed pointer above the backend seam"
  done < <(grep -nE '\([[:space:]]*(const[[:space:]]+)?(float|double|u?int(8|16|32|64)_t|int|long)[[:space:]]*\*[[:space:]]*\)[[:space:]]*\(?[A-Za-z_][A-Za-z0-9_]*(->|\.)data\b' "$f" || true)
  case "$rel" in
    nn/* | parallel/* | checkpoint/*)
      while IFS= read -r line; do
        report "$rel:${line%%:*}: takes a tensor's local pointer (nn and parallel move tensor bytes with dt_tensor_read_local / write_local / copy_local / fill_local)"
      done < <(grep -nE '\bdt_tensor_(to_local|to_local_backend|from_local|from_local_backend)[[:space:]]*\(' "$f" || true)
      ;;
  esac
done < <(find "$src" -type f \( -name '*.c' -o -name '*.h' \) -print0 | sort -z)

if [ -n "$inc" ]; then
  while IFS= read -r -d '' f; do
    while IFS= read -r line; do
      hdr=$(sed -E 's/^[^"]*"([^"]+)".*/\1/' <<<"${line#*:}")
      case "$hdr" in dtensor/*) ;; *) report "${f#"$inc"/}:${line%%:*}: public header includes \"$hdr\"" ;; esac
    done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" || true)
  done < <(find "$inc" -type f -name '*.h' -print0 | sort -z)
fi

if [ "$bad" -eq 0 ]; then
  echo "check_layers: every include goes downward; no tensor bytes touched above the backend seam"
fi
exit "$bad"
