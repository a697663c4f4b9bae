#!/usr/bin/env bash
# FSDP2 scaling at Nano width on the H200 machine (nvidia-h200-x2), carry [".whl"]: two GPUs with the
# frozen text pathway replicated (parallel.replicate_frozen) and layers kept gathered through backward,
# then replicated with explicit prefetch of 2 layers, then one GPU; G1 16 and DROID 4 samples per GPU.
# Each run gets RUN_S seconds (default 175: the three fit one 10-minute device call).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
B="benchmarks/train_throughput.py --layers 36 --no-baseline --packed g1=16,droid=4 --steps 5 --warmup 2"
run() {  # tag torchrun-args...
  local tag=$1; shift; local t0=$(date +%s)
  timeout ${RUN_S:-175} torchrun --standalone "$@" > $OUT/$tag.log 2>&1
  echo "rc=$? wall=$(( $(date +%s) - t0 ))s" >> $OUT/$tag.log
  grep -E "^\||mfu_|rc=" $OUT/$tag.log
}
run two_replfrozen_gathered --nproc-per-node 2 $B --replicate-frozen --no-reshard-after-forward
run two_replfrozen_pf2 --nproc-per-node 2 $B --replicate-frozen --prefetch 2
run one --nproc-per-node 1 $B
