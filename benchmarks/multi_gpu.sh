#!/usr/bin/env bash
# Multi-GPU runs of issue 4/9 on one host: FSDP2 over all GPUs, HSDP (2 x N/2), and a training
# checkpoint saved on N GPUs resumed on 2. Usage: bash benchmarks/multi_gpu.sh [N] [OUT_DIR]
set -uo pipefail
N=${1:-4}
OUT=${2:-/tmp/wamkit_multi_gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
F='^\||mfu|world|Error|error'
echo "== FSDP2 x$N, 16 G1 / 4 DROID samples per GPU"
torchrun --standalone --nproc-per-node "$N" benchmarks/train_throughput.py --layers 36 --no-reshard-after-forward \
  --packed g1=16,droid=4 2>&1 | tee "$OUT/fsdp$N.log" | grep -E "$F"
echo "== HSDP 2x$((N / 2)), same batch"
torchrun --standalone --nproc-per-node "$N" benchmarks/train_throughput.py --layers 36 --no-reshard-after-forward \
  --packed g1=16,droid=4 --replicate 2 2>&1 | tee "$OUT/hsdp$N.log" | grep -E "$F"
echo "== train the tiny demo on $N GPUs (save at step 4), resume on 2 GPUs to step 6"
python3 -c "from wamkit.data import write_demo_dataset; write_demo_dataset('/tmp/demo_reach', num_episodes=12)"
COMMON="--device cuda --set data.path=/tmp/demo_reach --set job.output_root=$OUT/runs --set trainer.progress_bar=false --set trainer.val_every=0 --set scheduler.warm_up_steps=[1] --set checkpoint.save_iter=4 --set trainer.samples_per_step=2"
torchrun --standalone --nproc-per-node "$N" -m wamkit.cli train recipes/demo_tiny.toml $COMMON --set trainer.max_iter=4 2>&1 | grep -E "world size|resumed|fresh|Error" | tee "$OUT/save$N.log"
torchrun --standalone --nproc-per-node 2 -m wamkit.cli train recipes/demo_tiny.toml $COMMON --set trainer.max_iter=6 2>&1 | grep -E "world size|resumed|fresh|Error|step\"" | tee "$OUT/resume2.log"
cat "$OUT/runs/demo_tiny/metrics.jsonl" | cut -c1-120
