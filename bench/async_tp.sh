#!/usr/bin/env bash
# async_tp.sh - asynchronous TP against the synchronous sequence-parallel plan: examples/train with
# --tp T --sp, without and with --async-tp, alternated ROUNDS times in one run (bench/ab_train.sh
# on one build: the machine's noise hits both alike), one OpenBLAS thread per rank. Prints each
# round's tokens/s (the steps after the first), the ratio async / sync per round, and the median
# ratio with its spread (min..max), the two runs' traffic over tp; checks that the two runs'
# losses agree within 1e-5.
#   bench/async_tp.sh [BUILD_DIR]
# Environment: TP (default 2), ROUNDS (5), STEPS (5), DIM (512), LAYERS (2), SEQ (512), BATCH (4),
# DEVICE (cpu; cuda on a GPU machine with one GPU per rank).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
TP=${TP:-2} DIM=${DIM:-512} LAYERS=${LAYERS:-2} SEQ=${SEQ:-512} BATCH=${BATCH:-4}
DEVICE=${DEVICE:-cpu}
BASE_NAME=sync NEW_NAME=async NEW_FLAGS=--async-tp RTOL=1e-5 \
  exec bash bench/ab_train.sh "$BUILD" "$BUILD" "$TP" --dim "$DIM" --layers "$LAYERS" --heads 8 \
  --seq "$SEQ" --batch "$BATCH" --vocab 256 --order 1 --warmup 2 --tp "$TP" --sp --device "$DEVICE"
