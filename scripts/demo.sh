#!/usr/bin/env bash
# README command 1: set up (with Meta-World), train the tiny Cosmos3 policy on the bundled Meta-World demos
# (CPU), then run it closed loop in the simulator on placements never recorded (3 episodes of each of the 4 tasks)
# and print its success rate.
set -euo pipefail
cd "$(dirname "$0")/.."
WAMKIT_SIM=${WAMKIT_SIM:-metaworld} bash scripts/setup.sh
. .venv/bin/activate
wamkit train recipes/demo_tiny.toml "$@"
RUN="$(python -m wamkit.config.run_dir recipes/demo_tiny.toml "$@")"  # the run train wrote, with the same overrides
wamkit eval sim "$RUN" metaworld/easy4 --episodes 3 --seed 1000 --out "$RUN/eval_sim"
