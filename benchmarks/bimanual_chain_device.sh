#!/usr/bin/env bash
# Issue 29 on one H200 (kind nvidia-h200): the sim-bimanual chain from simulated ALOHA data, in two (at most three)
# calls of <= 10 minutes, each carry [".whl_bimanual", ".gl"] (benchmarks/bimanual_wheels.sh fills them).
# Calls back to back: each later call reads the checkpoints the earlier ones left under /tmp/bimanual,
# which survive only while the machine stays warm; PHASE=3 alone needs nothing from them (it records the
# data again on a fresh machine).
#
#   PHASE=1 bash benchmarks/bimanual_chain_device.sh       # ~8.8 min: install 0.3, record 160 episodes on 14 processes
#                                                          #   0.7, bundle 0.5, validate x4 at once ~0.3, stage 0 (700 x 16)
#                                                          #   2.4, stage 1 (450 x 16) 1.7, stage 2 (500 x 8) 3.0, readbacks
#   PHASE=2 bash benchmarks/bimanual_chain_device.sh       # ~8.5: what phase 1 left of stage 2, stage 3 (360 x 4 = 60 student
#                                                          #   + 300 critic updates) 4.4, then the judging (student, teacher
#                                                          #   at 30 steps, export + its eval, strip and mp4) ~2.5, then the
#                                                          #   student's rollouts profiled (lines "student [wamkit] ...") ~1
#   PHASE="2 3" bash benchmarks/bimanual_chain_device.sh   # only if phase 2 was cut: its rest, then Nano width with what
#                                                          #   is left of the call: each stage's first 3 steps (0, 1 with
#                                                          #   LoRA) or its estimate and the GPU count it needs (2, 3)
#   PHASE=3 bash benchmarks/bimanual_chain_device.sh       # ~5 min on a fresh machine: Nano width alone (records the data again)
# MEASURED (2026-12-02, seventh session, benchmarks/RESULTS.md) with phase 1 = data + stages 0-1: phase 1 400 s,
# phase 2 564 s (stages 2-3 441 s with checks, then the deadline in the judging), PHASE="2 3" 565 s (judging
# 413 s: each eval wm ~120 s, ~90 s of it SSIM on one host thread, since moved to the GPU; Nano 0-1). Stage 2
# has since moved into phase 1 and the four validations run at once: two calls are the plan, a third only if
# the deadline cut one. MEASURED (2026-12-02, eighth session): PHASE=1 then PHASE=2, 564 + 566 s, every goal met
# (student 19.03 dB, teacher 19.23, copy-last 12.40, 27.4 video s/s = 7.9x the teacher); phase 1's deadline
# fell in stage 2's readback, which phase 2 did first; phase 2's in the profiled diagnostic eval after the verdict. TRAIN_ATTENTION=per_sample goes back to the slower per_sample stages 0-1 if flex fails.
# Every call (one phase or several) stops its stages at 560 s; a later phase first finishes what an earlier
# one left unfinished (a stage resumes from its last checkpoint), and any phase run again on the warm machine
# skips completed stages. A phase that prints "stopped by the phase deadline" exits 1 but has lost nothing:
# go on with the next phase.
# Logs, metrics, the eval reports, the strip and the mp4 come back under $OUT (at most 8 files: tarred).
set -o pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl_bimanual/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 MUJOCO_GL=egl OMP_NUM_THREADS=1
EGL_VENDOR=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json  # where the device README says the driver's EGL lives
[ -f $EGL_VENDOR ] && export __EGL_VENDOR_LIBRARY_FILENAMES=$EGL_VENDOR
python3 -c "import mujoco; mujoco.Renderer(mujoco.MjModel.from_xml_string('<mujoco/>'), 16, 16); print('MuJoCo EGL ok')" || exit 1
P=${PHASE:?set PHASE=1, 2, 3 or several in order, e.g. "2 3"}; P=${P// /_}
W=/tmp/bimanual; R=$W/out_phase$P; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/machine.txt"
python3 benchmarks/bimanual_chain.py --phase $PHASE --work $W --out "$R" ${TRAIN_ATTENTION:+--train-attention $TRAIN_ATTENTION} \
  2>&1 | tee "$R/driver.log"
rc=$?
grep -h -E "^bimanual_ar|^goals|^nano_stage|^student \[wamkit\]" "$R/driver.log" > "$OUT/RESULTS_phase$P.txt"
cp "$R/driver.log" "$OUT/"
cp "$R"/*.png "$R"/*.mp4 "$OUT/" 2>/dev/null
(cd "$R" && tar czf "$OUT/phase$P.tgz" --exclude='*.mp4' --exclude='*.png' .)
exit $rc
