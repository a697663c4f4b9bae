#!/usr/bin/env bash
# What benchmarks/policy_quality.py needs on the H200 image ('cuda': Python 3.12, torch 2.11,
# torchvision 0.26, numpy 2.x, huggingface_hub 1.x, einops, opencv-python-headless, transformers, peft,
# accelerate, pyarrow, scipy, imageio, pyyaml, typing-inspect, rich, tensorboard, msgpack, matplotlib)
# and that the image lacks. No dependencies are resolved: the lists below are the measured import
# closure of `lerobot.policies.{act,diffusion}`, Meta-World rendering through EGL and wamkit.
#
#   bash benchmarks/policy_quality_wheels.sh        # fills .whl/ (wamkit), .whl_sim/ (sim + LeRobot), .gl/ (EGL),
#                                                   # .whl_p1/ and .whl_p2/ (mt10_device.sh's two phases)
#
# The folders are git-ignored (.gitignore). Meta-World's wheel is rewritten with its textures
# downscaled (benchmarks/slim_wheel.py: 35 -> 5 MiB; 64 px renders never see the full-size ones); one phase's
# wheels (.whl_p1 or .whl_p2, below) and .gl fit one device call beside the working tree, which the end checks.
# Record and evaluate with the same install.
#
# .gl holds the glvnd/EGL loader libraries the image lacks (MuJoCo's EGL context fails without them).
set -euo pipefail
# slim_wheel.py needs Pillow: the project venv has it (scripts/setup.sh), a bare python3 may not
PILLOW_PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}

WAMKIT=(  # wamkit's own needs: the transformer/VAE, the video reader/writer, the server
  "av==18.1.0" "websockets==17.4" "diffusers==0.42.1" "importlib_metadata==10.2.0"
)
SIM=(  # the simulator and the LeRobot baselines
  "mujoco==3.3.0"        # metaworld 3.1.1 pins it
  "glfw==2.11.0"         # imported by metaworld's renderer, even when EGL draws
  "lerobot==0.6.1"       # ACT and Diffusion Policy (policies, configs, processors)
  "draccus==0.11.6"      # lerobot.configs (PreTrainedConfig is a draccus.ChoiceRegistry)
  "mergedeep==1.3.4"     # imported by draccus
  "gymnasium==1.4.0"     # lerobot.envs (imported by lerobot.policies.pretrained) and metaworld
  "farama-notifications==0.0.6"  # imported by gymnasium
  "metaworld==3.1.1"     # the Meta-World v3 tasks and scripted experts (35 MB of meshes and textures)
  "PyOpenGL==3.1.10"     # mujoco's EGL context (mujoco.egl)
)
GL_DEBS=(libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)

download() {  # dir packages...
  local dir=$1; shift
  mkdir -p "$dir"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d "$dir" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 --platform any "$@"
}
download .whl "${WAMKIT[@]}"
download .whl_sim "${SIM[@]}"
"$PILLOW_PY" "$(dirname "$0")/slim_wheel.py" .whl_sim/metaworld-3.1.1-py3-none-any.whl  # needs Pillow
# PyOpenGL without its Windows DLLs and OpenGL ES wrappers (3.0 -> 1.6 MiB): MuJoCo's EGL context imports only
# OpenGL.EGL, OpenGL.error and OpenGL.platform, and frames recorded with it match a full install's byte for byte
# (thirty-ninth session); the tree's growth had put PHASE=2's carry over the 64 MiB (the device counts disk blocks)
"$PILLOW_PY" "$(dirname "$0")/slim_wheel.py" .whl_sim/pyopengl-3.1.10-py3-none-any.whl --drop OpenGL/DLLS \
  --drop OpenGL/GLES1 --drop OpenGL/GLES2 --drop OpenGL/GLES3 --drop OpenGL/raw/GLES1 --drop OpenGL/raw/GLES2 --drop OpenGL/raw/GLES3

mkdir -p .gl /tmp/amd64/partial
APT=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
apt-get "${APT[@]}" update >/dev/null
(cd .gl && apt-get "${APT[@]}" download "${GL_DEBS[@]}")

# .whl_p1 / .whl_p2: what mt10_device.sh PHASE=1 / PHASE=2 install, hard links into the folders above, now that the
# working tree (7 MiB) leaves too little of the 64 MiB carry for all three folders: PHASE=1 needs no LeRobot and
# no serving packages (carry [".whl_p1", ".gl"], WHEEL_DIRS=.whl_p1), PHASE=2 no wamkit serving packages (carry
# [".whl_p2", ".gl"], WHEEL_DIRS=.whl_p2). Both carry diffusers without its pipelines (.whl_slim: 2 of 6 MiB; wamkit
# uses its models and schedulers, LeRobot's Diffusion Policy its schedulers; wamkit's tests pass on it), which leaves
# room beside the tree and lets PHASE=2 run on a fresh machine too
rm -rf .whl_slim && mkdir .whl_slim && cp .whl/diffusers-*.whl .whl_slim/
"$PILLOW_PY" "$(dirname "$0")/slim_wheel.py" .whl_slim/diffusers-*.whl --drop diffusers/pipelines --drop diffusers/modular_pipelines
rm -rf .whl_p1 .whl_p2 && mkdir .whl_p1 .whl_p2
for f in .whl/av-* .whl_slim/diffusers-* .whl/importlib_metadata-* .whl_sim/farama* .whl_sim/glfw* .whl_sim/gymnasium* \
         .whl_sim/metaworld* .whl_sim/mujoco* .whl_sim/pyopengl* .whl_sim/PyOpenGL*; do
  [ -e "$f" ] && ln "$f" .whl_p1/
done
for f in .whl/av-* .whl/importlib_metadata-* .whl_sim/*.whl .whl_slim/diffusers-*; do ln "$f" .whl_p2/; done
for dir in .whl .whl_sim .whl_slim .whl_p1 .whl_p2 .gl; do
  echo "$dir: $(du -sh "$dir" | cut -f1)"
done
# in disk blocks, as the device counts the carry (bytes had passed a carry it refused in the thirty-ninth session)
tree=$(( $(git ls-files -co --exclude-standard -z | du -c --files0-from=- | tail -1 | cut -f1) << 10 ))
# one call carries one phase's wheels beside .gl: check the larger phase
for phase in .whl_p1 .whl_p2; do
  carry=$(( $(du -c "$phase" .gl | tail -1 | cut -f1) << 10 ))
  echo "working tree $((tree >> 20)) MiB + $phase and .gl $((carry >> 20)) MiB = $(((tree + carry) >> 20)) MiB of 64 MiB"
  (( tree + carry < 64 << 20 )) || { echo "over the device carry limit"; exit 1; }
done
