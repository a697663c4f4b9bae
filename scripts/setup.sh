#!/usr/bin/env bash
# Create .venv (once) and install wamkit with its pinned CPU torch. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
# torch first and pinned: a loose requirement would pull a multi-GB CUDA build.
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -e ".[test]"
# openpi's client for tests/serve: it pins numpy<2 but runs on numpy 2, so install it without deps
python -m pip install --quiet --no-deps "openpi-client==0.1.2"
