#!/usr/bin/env bash
# gpu_twins.sh - the device twins tests/CMakeLists.txt declares (dt_device_twins(NAME NP...)), one
# line each: NAME NP... (tools/gpu_pack.sh packs them, tools/gpu_check.sh runs them on the GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
sed -n 's/^dt_device_twins(\([A-Za-z0-9_]*\) \([0-9 ]*\)).*/\1 \2/p' tests/CMakeLists.txt
