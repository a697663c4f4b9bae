#!/usr/bin/env bash
# benchmarks/policy_quality.py on the H200 machine (nvidia-h200-x2: both GPUs), the second of two device
# calls on one warm machine: the first installed .whl (wamkit's wheels) into /tmp/site. Since Meta-World's
# wheel is slimmed (benchmarks/policy_quality_wheels.sh) all three fit one carry; benchmarks/mt10_device.sh
# installs them in the same call. Carry [".whl_sim", ".gl"].
# Records metaworld/reach-v3 once, then trains + evaluates wamkit and ACT on GPU 0 and Diffusion Policy on
# GPU 1 (same dataset, samples, seeds and harness); tables and results under $OUT.
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 MUJOCO_GL=egl PYOPENGL_PLATFORM=egl
python3 -c "import av, diffusers" || { echo "the machine was recycled: /tmp/site lost the .whl set; run call 1 again"; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl_sim/*.whl || exit 1
python3 -c "import metaworld, lerobot, mujoco; print('sim wheels ok')" || exit 1
t0=$(date +%s)
D=/tmp/pq/data/metaworld_reach-v3
python3 -m wamkit.cli sim record metaworld/reach-v3 --episodes 40 --out $D --seed 0 --resolution 64 2>&1 | tail -1
pq() {  # gpu methods tag
  CUDA_VISIBLE_DEVICES=$1 timeout ${PQ_S:-500} python3 benchmarks/policy_quality.py --samples 12000 --episodes 20 \
    --seed 1000 --dp-scheduler DDIM --dp-inference-steps 10 --set data.num_workers=4 --dataset $D --methods $2 \
    --out /tmp/pq/$3 > $OUT/pq_$3.log 2>&1
  echo "pq rc=$?" >> $OUT/pq_$3.log
  cp /tmp/pq/$3/table.md $OUT/table_$3.md; cp /tmp/pq/$3/results.json $OUT/results_$3.json
}
pq 0 wamkit,act wa & pq 1 diffusion dp & wait
echo "total wall $(( $(date +%s) - t0 )) s"
cat $OUT/table_*.md
