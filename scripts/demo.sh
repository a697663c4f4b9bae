#!/usr/bin/env bash
# README command 1: set up, then train the tiny Cosmos3 policy on the generated demo dataset (CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
WAMKIT_SIM=${WAMKIT_SIM:-0} bash scripts/setup.sh
. .venv/bin/activate
wamkit train recipes/demo_tiny.toml "$@"
