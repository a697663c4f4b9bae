#!/usr/bin/env bash
# What benchmarks/bimanual_chain_device.sh needs on the H200 image (Python 3.12, torch 2.11; numpy, scipy,
# pyarrow, pillow, matplotlib, lxml, protobuf, absl-py, pyparsing, imageio, tqdm, requests are there) and
# that the image lacks: wamkit's own (av, diffusers, websockets, importlib_metadata) and the ALOHA
# simulator (gym-aloha 0.1.5 over dm_control, MuJoCo 3.3.0 and its EGL context), into ONE folder that
# every device call carries, so each call can start from a bare machine:
#
#   bash benchmarks/bimanual_wheels.sh        # fills .whl_bimanual/ (~58 MB) and .gl/ (EGL loader .debs)
#
# /.whl_bimanual/ and /.gl/ are git-ignored (.gitignore). dm_control's wheel is 56 MB, mostly assets of
# suites wamkit never loads (locomotion's soccer and walkers, the dog model, test assets): it is
# repacked without them (dm_control.suite and dm_control.mujoco, which gym-aloha imports, keep every
# file they read), so the set fits the 64 MiB a call carries with the working tree. labmaze (imported
# only by dm_control.locomotion) and glfw (MUJOCO_GL=egl) are left out.
set -euo pipefail
DIR=.whl_bimanual
PACKAGES=(
  "av==18.1.0" "websockets==17.4" "diffusers==0.42.1" "importlib_metadata==10.2.0"   # wamkit
  "mujoco==3.3.0" "dm_control==1.0.28" "dm-env==1.6" "dm-tree==0.1.10" "PyOpenGL==3.1.10"
  "gym-aloha==0.1.5" "gymnasium==1.4.0" "farama-notifications==0.0.6"
)
DROP=(dm_control/locomotion/ dm_control/suite/dog_assets/ dm_control/mujoco/testing/ dm_control/blender/
      dm_control/mjcf/test_assets/ dm_control/suite/all_domains.png)
GL_DEBS=(libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)

mkdir -p "$DIR"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d "$DIR" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any "${PACKAGES[@]}"

python3 - "$DIR"/dm_control-*.whl "${DROP[@]}" <<'EOF'
"""Rewrite the wheel without the dropped paths, its RECORD listing only what stays."""
import sys, zipfile
from pathlib import Path
wheel, drop = Path(sys.argv[1]), tuple(sys.argv[2:])
tmp = wheel.with_suffix(".tmp")
with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
    for item in src.infolist():
        if item.filename.startswith(drop):
            continue
        data = src.read(item)
        if item.filename.endswith(".dist-info/RECORD"):
            data = b"".join(l + b"\n" for l in data.splitlines() if not l.decode().startswith(drop))
        dst.writestr(item, data)
tmp.replace(wheel)
EOF

mkdir -p .gl /tmp/amd64/partial
APT=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
apt-get "${APT[@]}" update >/dev/null
(cd .gl && apt-get "${APT[@]}" download "${GL_DEBS[@]}")
du -sh "$DIR" .gl
