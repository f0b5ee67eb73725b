#!/usr/bin/env bash
# run.sh BUILD_DIR SOURCE_DIR - installs the build into a temporary prefix, then builds and runs a
# consumer through find_package(dtensor) and through pkg-config.
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src/tests/install/consumer" -B "$tmp/b" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/b" >/dev/null
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/b/c"
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
cc "$src/tests/install/consumer/main.c" $(pkg-config --cflags --libs dtensor) -o "$tmp/c2"
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/c2"
"$tmp/prefix/bin/dtensor-explain" redistribute --mesh 2 --shape 4 --from S0 --to R --json
