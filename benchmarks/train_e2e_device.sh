#!/usr/bin/env bash
# benchmarks/train_e2e.py on the H200 machine, carry [".whl"] (benchmarks/policy_quality_wheels.sh fills it):
#   PHASE=1gpu-a bash benchmarks/train_e2e_device.sh   # nvidia-h200: so101 LoRA and g1_simple_1gpu, online VAE and latent cache
#   PHASE=1gpu-b bash benchmarks/train_e2e_device.sh   # nvidia-h200: droid_1gpu online; g1_simple as its header runs it (the
#                                                       # memory gate); so101 from the cache for 200 steps with a save (flat memory, size)
#   PHASE=auto   bash benchmarks/train_e2e_device.sh   # nvidia-h200: so101 with activation checkpointing "auto", online, cache, relaunch
#   PHASE=encode bash benchmarks/train_e2e_device.sh   # nvidia-h200: the VAE encode per clip (SO-101, G1 canvases), then so101
#                                                       # online on a cold machine (the first step's compile split is in its log)
#   PHASE=rows   bash benchmarks/train_e2e_device.sh   # nvidia-h200: the online rows again on a cold machine (so101 first:
#                                                       # its launch -> first step with the VAE warm-up), g1_simple_1gpu, droid_1gpu
#   PHASE=fullft bash benchmarks/train_e2e_device.sh   # nvidia-h200, carry [".whl", ".whl_lowbit"]: g1_simple_1gpu_full (8-bit AdamW)
#   PHASE=2gpu   bash benchmarks/train_e2e_device.sh   # nvidia-h200-x2: g1_simple and droid on 2 GPUs
#   PHASE=harness bash benchmarks/train_e2e_device.sh  # the packed forward/backward alone
# Logs and tables land in $OUT.
# .whl_lowbit (optional, carry it too): torchao for optimizer.kind = "adamw8bit" (recipes/g1_simple_1gpu_full.toml)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  $(ls .whl_lowbit/*.whl 2>/dev/null) || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
# pip install --no-compile skips what a user's pip install does: bytecode. Without it every launch would
# compile diffusers' ~1,000 modules again (launch -> first step is a number we own), so compile them here.
python3 -m compileall -q -j 0 /tmp/site > /dev/null
echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset}" | tee -a $OUT/machine.txt
python3 -X importtime -c "import wamkit.train.trainer" 2> $OUT/importtime.txt  # a warm import of the trainer, module by module
python3 - $OUT/importtime.txt <<'PYEOF' | tee -a $OUT/machine.txt
import sys
rows = [line.split("|") for line in open(sys.argv[1]) if line.startswith("import time:") and "cumulative" not in line]
total = max(int(r[1]) for r in rows) / 1e6
depth = lambda name: (len(name) - len(name.lstrip(" ")) - 1) // 2  # noqa: E731  importtime indents 2 per level
top = sorted(((int(r[1]), r[2].strip()) for r in rows if depth(r[2].rstrip("\n")) <= 2), reverse=True)[1:8]
print(f"import wamkit.train.trainer: {total:.1f} s; largest: " + ", ".join(f"{n} {us / 1e6:.1f} s" for us, n in top))
PYEOF
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/machine.txt
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a $OUT/machine.txt
python3 -c "import torch, diffusers; print('torch', torch.__version__, 'diffusers', diffusers.__version__)" | tee -a $OUT/machine.txt
E2E="benchmarks/train_e2e.py --steps ${STEPS:-10} --warmup ${WARMUP:-3} --timeout ${RUN_S:-200} $EXTRA"
case "${PHASE:-1gpu-a}" in
  1gpu-a) python3 $E2E --gpus 1 --recipes ${RECIPES:-so101_fd_chunk16 g1_simple_1gpu} 2>&1 | tee $OUT/e2e_1gpu_online.txt
          python3 $E2E --gpus 1 --recipes ${RECIPES:-so101_fd_chunk16 g1_simple_1gpu} --latent-cache 2>&1 | tee $OUT/e2e_1gpu_cache.txt ;;
  1gpu-b) python3 $E2E --gpus 1 --recipes droid_1gpu 2>&1 | tee $OUT/e2e_1gpu_droid.txt
          [ -n "$SKIP_SO101_200" ] && SO101=0
          # the seed recipe exactly as its header runs it, on one GPU: the gate must refuse it with what fits
          python3 -c "import sys; sys.argv=['x']; sys.path.insert(0, 'benchmarks'); from pathlib import Path; import train_e2e as e; e.random_wan22_vae(Path('/tmp/wamkit_e2e')); e.prepare(Path('/tmp/wamkit_e2e'), 'g1_simple', (480, 640), 6)"
          ( export SIMPLE_ROOT=/tmp/wamkit_e2e/data_g1_simple_480x640 BASE_CHECKPOINT_PATH= WAN_VAE_PATH=/tmp/wamkit_e2e/wan22_vae_random
            WAMKIT_OUTPUT_ROOT=/tmp/wamkit_e2e/runs timeout 120 torchrun --nproc-per-node=1 -m wamkit.cli train recipes/g1_simple.toml \
              --set job.name=g1_simple > $OUT/g1_simple_header.txt 2>&1; echo "exit code $?" >> $OUT/g1_simple_header.txt )
          grep -E "wamkit\]|error|fix|--set|GiB|exit code" $OUT/g1_simple_header.txt
          [ "$SO101" = 0 ] || python3 benchmarks/train_e2e.py --steps 200 --warmup 20 --timeout 330 --gpus 1 --recipes so101_fd_chunk16 --latent-cache --save \
            2>&1 | tee $OUT/e2e_1gpu_so101_200.txt ;;
  auto) # so101 as its header runs it on one H200: activation checkpointing "auto" (none fits), online and from the
        # cache, then the online run relaunched (torch's compile caches warm, as on a resume)
        python3 $E2E --gpus 1 --recipes so101_fd_chunk16 2>&1 | tee $OUT/e2e_auto_online.txt
        python3 $E2E --gpus 1 --recipes so101_fd_chunk16 --latent-cache 2>&1 | tee $OUT/e2e_auto_cache.txt
        python3 $E2E --gpus 1 --recipes so101_fd_chunk16 2>&1 | tee $OUT/e2e_auto_online_relaunch.txt ;;
  encode) # the training run first, on cold caches; the encode diagnostic after it with caches of its own (cold too)
          python3 $E2E --gpus 1 --recipes so101_fd_chunk16 2>&1 | tee $OUT/e2e_encode_online.txt
          grep -h "first step done" /tmp/wamkit_e2e/*.log
          export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_vae_bench TRITON_CACHE_DIR=/tmp/triton_vae_bench
          python3 benchmarks/vae_encode.py --sizes 544x736 --frames 17 --batch 6 --repeats 3 2>&1 | tee $OUT/vae_encode_so101.txt
          python3 benchmarks/vae_encode.py --sizes 256x320 --frames 33 --batch 8 --repeats 3 2>&1 | tee $OUT/vae_encode_g1.txt ;;
  rows) WAMKIT_SYNC_DEBUG=1 python3 $E2E --gpus 1 --recipes so101_fd_chunk16 g1_simple_1gpu droid_1gpu 2>&1 | tee $OUT/e2e_rows_online.txt
        grep -h "first step done\|startup:\|warmed up\|memory: peak\|synchronised" /tmp/wamkit_e2e/*.log ;;
  fullft) # the G1 full fine-tune on one H200 with the 8-bit AdamW (carry [".whl", ".whl_lowbit"]), online then from the cache
          python3 $E2E --gpus 1 --recipes g1_simple_1gpu_full 2>&1 | tee $OUT/e2e_fullft_online.txt
          python3 $E2E --gpus 1 --recipes g1_simple_1gpu_full --latent-cache 2>&1 | tee $OUT/e2e_fullft_cache.txt ;;
  2gpu) python3 $E2E --gpus 2 --recipes ${RECIPES:-g1_simple droid} 2>&1 | tee $OUT/e2e_2gpu.txt ;;
  harness) python3 benchmarks/train_throughput.py --layers 36 --no-baseline --packed g1=16,droid=16 --steps 5 --warmup 2 2>&1 | tee $OUT/harness.txt ;;
esac
cp /tmp/wamkit_e2e/*.log $OUT/ 2>/dev/null
