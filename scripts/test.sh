#!/usr/bin/env bash
# README command 2: set up, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
WAMKIT_SIM=1 bash scripts/setup.sh
. .venv/bin/activate
python -m pytest "$@"
