#!/usr/bin/env bash
# check_layers_negative.sh - tools/check_layers.sh must fail on each kind of violation: an include
# of a layer above, tensor data moved with memcpy above the backend seam, tensor data read through
# a typed pointer, and nn/parallel code taking a tensor's local pointer; and pass on clean code
# (a backend member on tensor data, a kernel file).
set -euo pipefail
check=$1
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
mkdir -p "$t/src/"{ops,nn,parallel,tensor,backend} "$t/include"
expect() { # want (0|1), file, content, [needle]
  rm -f "$t"/src/*/*.c
  printf '%b\n' "$3" > "$t/src/$2"
  set +e
  out=$(bash "$check" "$t/src" 2>&1)
  rc=$?
  set -e
  if [ "$rc" -ne "$1" ]; then
    echo "check_layers on src/$2 returned $rc, expected $1:"
    printf '%b\n' "$3"
    echo "$out"
    exit 1
  fi
  if [ -n "${4:-}" ] && ! grep -q -- "$4" <<<"$out"; then
    echo "check_layers on src/$2: no '$4' in: $out"
    exit 1
  fi
}
expect 1 tensor/a.c '#include "ops/ops.h"' "layer 5 includes"
expect 1 ops/a.c 'void f(dt_tensor_t t, void* d) { memcpy(d, t->data, 4); }' "moved with the C library"
expect 1 ops/a.c 'void f(dt_local_tensor_t v) { memset(v.data, 0, 4); }' "moved with the C library"
expect 1 tensor/a.c 'float f(dt_tensor_t t) { return *(const float*)t->data; }' "typed pointer"
expect 1 ops/a.c 'int64_t f(dt_tensor_t s) { const int64_t* p = (const int64_t*)s->data; return p[0]; }' "typed pointer"
expect 1 nn/a.c 'void f(dt_tensor_t t) { void* p; dt_tensor_to_local(t, &p, NULL); }' "local pointer"
expect 1 parallel/a.c 'void f(void) { dt_tensor_from_local(m, DT_F32, 1, s, pl, buf, s, &t); }' "local pointer"
expect 0 tensor/a.c 'void f(dt_backend_t b, dt_tensor_t t) { b->iface->memset(b, t->data, 0, 4); }'
expect 0 ops/kernels_x.c 'void f(dt_local_tensor_t* o) { memset(o->data, 0, 4); float* y = (float*)o->data; }'
expect 0 backend/a.c 'void f(dt_tensor_t t, void* d) { memcpy(d, t->data, 4); }'
echo "check_layers_negative: every violation found, clean code passes"
