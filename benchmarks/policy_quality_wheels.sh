#!/usr/bin/env bash
# Wheels that benchmarks/policy_quality.py needs on the H200 image ('cuda': Python 3.12, torch 2.11,
# torchvision 0.26, numpy 2.x, huggingface_hub 1.x, einops, opencv-python-headless, transformers, peft,
# accelerate, pyarrow, scipy, imageio, pyyaml, typing-inspect, rich, tensorboard, msgpack, matplotlib)
# and that the image lacks. No dependencies are resolved: the list below is the measured import
# closure of `lerobot.policies.{act,diffusion}`, Meta-World rendering through EGL and wamkit.
#
#   bash benchmarks/policy_quality_wheels.sh [DIR]        # default DIR: .whl/ (git-ignored)
#
# Then on the device (repository root; nothing can be fetched there):
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
#     && export PYTHONPATH=/tmp/site:src MUJOCO_GL=egl PYOPENGL_PLATFORM=egl \
#     && python3 benchmarks/policy_quality.py --device cuda --samples 12000 --episodes 20 --seed 1000 \
#     --dp-scheduler DDIM --dp-inference-steps 10 --set data.num_workers=4 --out $OUT/policy_quality
#
# DDIM with 10 steps gives Diffusion Policy the same 10 denoising steps per chunk as wamkit and keeps the
# run inside one 10-minute device command; drop those two flags for lerobot's default 100-step DDPM.
#
# Size: ~88 MB. lerobot's own wheel is 1.6 MB (no large assets); metaworld (35 MB of textures and
# meshes) and av (34 MB, FFmpeg inside) are most of it, and both serve wamkit's side (the simulator
# and the H.264 datasets), not the baselines.
set -euo pipefail

DIR="${1:-.whl}"
mkdir -p "$DIR"

# Wheels built for a platform (CPython 3.12, manylinux x86_64).
BINARY=(
  "mujoco==3.3.0"        # metaworld 3.1.1 pins it
  "av==18.1.0"           # wamkit's video reader/writer (H.264 datasets, rollout mp4s)
  "websockets==17.4"     # imported by wamkit.serve
  "glfw==2.11.0"         # py3-none-manylinux (bundles libglfw); imported by metaworld's renderer, EGL draws
)
# Pure-Python wheels (py3-none-any).
PURE=(
  "lerobot==0.6.1"       # ACT and Diffusion Policy (policies, configs, processors)
  "draccus==0.11.6"      # lerobot.configs (PreTrainedConfig is a draccus.ChoiceRegistry)
  "mergedeep==1.3.4"     # imported by draccus
  "gymnasium==1.4.0"     # lerobot.envs (imported by lerobot.policies.pretrained) and metaworld
  "farama-notifications==0.0.6"  # imported by gymnasium
  "metaworld==3.1.1"     # the Meta-World v3 tasks and scripted experts
  "PyOpenGL==3.1.10"     # mujoco's EGL context (mujoco.egl)
  "diffusers==0.42.1"    # wamkit's Cosmos3 transformer; lerobot's DDPM scheduler
  "importlib_metadata==10.2.0"  # imported by diffusers
)

COMMON=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d "$DIR")
python3 -m pip download -q "${COMMON[@]}" --abi cp312 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "${BINARY[@]}"
python3 -m pip download -q "${COMMON[@]}" --platform any "${PURE[@]}"

echo "wheels in $DIR:"
ls -l "$DIR"/*.whl | awk '{printf "  %8.1f MB  %s\n", $5 / 1048576, $NF}'
du -ch "$DIR"/*.whl | tail -1
