#!/usr/bin/env bash
# peer-env.sh - the measured peer: a virtual environment with a pinned PyTorch 2.x (CPU use) from
# PyPI, made once and reused, for the peer benchmarks (bench/peer_*.py, bench/*_torch.py) and the
# fixture scripts of tests/fixtures. Never needed by CI or the library: CI keeps Debian's packages
# and the committed fixtures.
#
#   tools/peer-env.sh            make (or reuse) the environment; print "peer: torch VERSION
#                                (PYTHON)" and, on the last line, the environment's python
#   tools/peer-env.sh --python   only the last line (scripts: PY=$(tools/peer-env.sh --python))
#
# Environment: DTENSOR_PEER_VENV (where; default ~/.cache/dtensor/peer-venv-torch<VERSION>),
# DTENSOR_PEER_TORCH (the pinned version, default below), DTENSOR_PEER_PYTHON (the interpreter
# the environment is made from; default Debian's /usr/bin/python3, not the first on the PATH).
# Exit status 77 (the CTest and Automake "skipped" code) when PyPI cannot be reached and no
# environment exists: callers print that the peer is skipped and go on.
set -euo pipefail

TORCH=${DTENSOR_PEER_TORCH:-2.11.0}
BASE_PY=${DTENSOR_PEER_PYTHON:-/usr/bin/python3}
VENV=${DTENSOR_PEER_VENV:-$HOME/.cache/dtensor/peer-venv-torch$TORCH}
quiet=0
[ "${1:-}" = --python ] && quiet=1

say() { [ $quiet = 1 ] && echo "$*" >&2 || echo "$*"; }

have() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c \
  "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH' else 1)" \
  >/dev/null 2>&1; }

if ! have; then
  [ -x "$BASE_PY" ] || { echo "peer-env: no $BASE_PY (set DTENSOR_PEER_PYTHON)" >&2; exit 1; }
  say "peer-env: making $VENV with torch $TORCH from PyPI (once; about 3 GB with its CUDA wheels)"
  if ! timeout 20 "$BASE_PY" -c \
    "import urllib.request; urllib.request.urlopen('https://pypi.org/simple/torch/', timeout=15)" \
    >/dev/null 2>&1; then
    echo "peer-env: PyPI (https://pypi.org) is unreachable: the PyTorch $TORCH peer is skipped" >&2
    exit 77
  fi
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  "$BASE_PY" -m venv "$VENV" >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  # numpy: the fixture and benchmark scripts; the rest comes with torch
  "$VENV/bin/python" -m pip install -q "torch==$TORCH" numpy >&2
  have || { echo "peer-env: torch $TORCH did not import from $VENV" >&2; exit 1; }
fi
say "peer: torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')" \
  "($("$VENV/bin/python" -c 'import sys; print(sys.version.split()[0])'), $VENV)"
echo "$VENV/bin/python"
