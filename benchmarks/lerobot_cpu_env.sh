#!/usr/bin/env bash
# LeRobot's ACT and Diffusion Policy on the CPU dev box, for benchmarks/policy_quality.py on a testbed
# (e.g. the tiny push testbed, benchmarks/RESULTS.md, twenty-ninth session) without spending device time.
#
#   bash benchmarks/lerobot_cpu_env.sh                    # fills .lerobot_cpu/ (git-ignored), ~20 s; wheels from
#                                                         # $WHEELS (default .whl_p2) where there, else PyPI
#   PYTHONPATH=.lerobot_cpu .venv/bin/python benchmarks/policy_quality.py --methods act ...
#
# The box runs Python 3.11 and lerobot 0.6.1 wants 3.12, so this is a diagnostic environment, not an install:
# - lerobot's wheel (from .whl_p2/, benchmarks/policy_quality_wheels.sh; else PyPI) is unpacked, not installed,
#   and its eight uses of 3.12-only syntax (PEP 695 `type X = ...` aliases and generic class/def brackets)
#   are rewritten to their 3.11 spelling; nothing else of it changes.
# - PyPI's torchvision 0.28 (the pair of torch 2.13) is a CUDA build: its C ops (nms, roi_align, ...) cannot
#   load here, so `_C.so` is left out and the fake-kernel registrations that need them are skipped. ResNet-18,
#   all that ACT and DP use of torchvision, is plain torch.
# Numbers from it are CPU testbed numbers; the GPU head-to-head stays benchmarks/mt10_device.sh PHASE=2.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DEST=${DEST:-.lerobot_cpu}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

wheel() {  # name==version -> path of its wheel (the carry folder first, else PyPI)
  local name=${1%%==*} found
  found=$(ls "${WHEELS:-.whl_p2}"/"${name//-/_}"-*.whl "${WHEELS:-.whl_p2}"/"$name"-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$found" ]; then
    # pure-Python wheels are fetched as for 3.12 (lerobot's Requires-Python), torchvision for this interpreter
    "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$TMP" \
      $([ "$name" = torchvision ] || echo --python-version 3.12) "$1" >&2
    found=$(ls "$TMP"/"${name//-/_}"-*.whl "$TMP"/"$name"-*.whl 2>/dev/null | head -1)
  fi
  echo "$found"
}

rm -rf "$DEST" && mkdir -p "$DEST"
for spec in lerobot==0.6.1 draccus==0.11.6 mergedeep==1.3.4 torchvision==0.28.0; do
  "$PY" -m zipfile -e "$(wheel "$spec")" "$DEST"  # unpacked: pip refuses lerobot's Requires-Python here
done
# lerobot's and draccus's imports that the project venv lacks
"$PY" -m pip install -q --no-deps --target "$DEST" typing-inspect==0.9.0 mypy-extensions==1.2.0 einops==0.8.2 \
  opencv-python-headless==5.1.0.95

mv "$DEST/torchvision/_C.so" "$DEST/torchvision/_C.so.cuda-build"
"$PY" - "$DEST" <<'EOF'
import re, sys
from pathlib import Path

dest = Path(sys.argv[1])

def rewrite(rel, old, new, count=1):
    path = dest / rel
    text = path.read_text()
    got = len(re.findall(old, text, flags=re.M))
    if got != count:
        raise SystemExit(f"{path}: expected {count} match(es) of {old!r}, found {got}: another lerobot version?")
    path.write_text(re.sub(old, new, text, flags=re.M))

subscriptable = r"\n    __class_getitem__ = classmethod(lambda cls, item: cls)"
rewrite("lerobot/processor/pipeline.py", r"^class DataProcessorPipeline\[TInput, TOutput\]\(HubMixin\):",
        "class DataProcessorPipeline(HubMixin):" + subscriptable)
rewrite("lerobot/datasets/streaming_dataset.py", r"^class Backtrackable\[T\]:", "class Backtrackable:" + subscriptable)
rewrite("lerobot/utils/io_utils.py", r"def deserialize_json_into_object\[T: JsonLike\]\(fpath: Path, obj: T\) -> T:",
        "def deserialize_json_into_object(fpath: Path, obj):")
rewrite("lerobot/motors/motors_bus.py", r"^type (\w+) =", r"\1 =", count=2)
rewrite("lerobot/datasets/aggregate.py", r"^type (\w+) =", r"\1 =", count=3)
rewrite("torchvision/_meta_registrations.py", r'^@torch\.library\.register_fake\(("torchvision::\w+")\)',
        r"@(torch.library.register_fake(\1) if torchvision.extension._has_ops() else (lambda f: f))", count=2)
EOF
PYTHONPATH="$DEST" "$PY" -c "
import importlib.metadata as md, torch, torchvision.models as m, lerobot.policies.act.modeling_act, lerobot.policies.diffusion.modeling_diffusion
assert m.resnet18()(torch.zeros(1, 3, 64, 64)).shape == (1, 1000)
print('lerobot', md.version('lerobot'), 'with ACT and Diffusion Policy imports on this box from $DEST')" 2>&1 | grep -v -i "warn\|torchao" | tail -1
