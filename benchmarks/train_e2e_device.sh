#!/usr/bin/env bash
# benchmarks/train_e2e.py on the H200 machine, carry [".whl"] (benchmarks/policy_quality_wheels.sh fills it):
#   PHASE=2gpu   bash benchmarks/train_e2e_device.sh   # nvidia-h200-x2: g1_simple and droid on 2 GPUs, + the harness rows
#   PHASE=1gpu   bash benchmarks/train_e2e_device.sh   # g1_simple / droid on 1 GPU, latent-cache variant, so101 LoRA
# Logs and tables land in $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/machine.txt
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a $OUT/machine.txt
python3 -c "import torch, diffusers; print('torch', torch.__version__, 'diffusers', diffusers.__version__)" | tee -a $OUT/machine.txt
E2E="benchmarks/train_e2e.py --steps ${STEPS:-12} --warmup ${WARMUP:-4} --timeout ${RUN_S:-270} $EXTRA"
case "${PHASE:-2gpu}" in
  2gpu) python3 $E2E --gpus 2 --recipes ${RECIPES:-g1_simple droid} 2>&1 | tee $OUT/e2e_2gpu.txt ;;
  1gpu) python3 $E2E --gpus 1 --recipes ${RECIPES:-g1_simple so101_fd_chunk16} 2>&1 | tee $OUT/e2e_1gpu.txt
        python3 $E2E --gpus 1 --recipes g1_simple --latent-cache 2>&1 | tee $OUT/e2e_1gpu_cache.txt ;;
  harness) python3 benchmarks/train_throughput.py --layers 36 --no-baseline --packed g1=16,droid=16 --steps 5 --warmup 2 2>&1 | tee $OUT/harness.txt ;;
esac
cp /tmp/wamkit_e2e/*.log $OUT/ 2>/dev/null
