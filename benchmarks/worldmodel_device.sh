#!/usr/bin/env bash
# The Meta-World world models on the H200 machine (nvidia-h200-x2), carry [".whl"]: the plain recipe on
# GPU 0 and the residual one on GPU 1 train side by side on the same budget (TRAIN_S seconds or ITERS
# steps), then both are evaluated on the held-out episodes (2 4 30 34) with the seed's 30 Euler steps.
# Logs, metrics and the eval reports (eval_wm.tgz) come back under $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi -L
W=/tmp/wm; mkdir -p $W
train() {  # gpu recipe tag
  CUDA_VISIBLE_DEVICES=$1 timeout ${TRAIN_S:-400} python3 -m wamkit.cli train recipes/$2.toml --device cuda \
    --set job.output_root="\"$W\"" --set trainer.max_iter=${ITERS:-900} --set checkpoint.save_iter=100 \
    --set trainer.val_every=300 --set trainer.progress_bar=false > $OUT/train_$3.log 2>&1
  echo "train rc=$?" >> $OUT/train_$3.log
}
evalwm() {  # gpu run tag
  CUDA_VISIBLE_DEVICES=$1 timeout ${EVAL_S:-180} python3 -m wamkit.cli eval wm $W/$2 --episodes 2 4 30 34 --device cuda \
    --no-probes --out $W/eval_$3 > $W/eval_$3.log 2>&1
  echo "eval rc=$?" >> $W/eval_$3.log
}
t0=$(date +%s)
train 0 metaworld_fd plain & train 1 metaworld_fd_residual residual & wait
echo "training wall $(( $(date +%s) - t0 )) s"
evalwm 0 metaworld_fd plain & evalwm 1 metaworld_fd_residual residual & wait
echo "total wall $(( $(date +%s) - t0 )) s"
for tag in plain residual; do grep -v Warn $W/eval_$tag.log | tail -4; done
cp $W/metaworld_fd/metrics.jsonl $OUT/metrics_plain.jsonl; cp $W/metaworld_fd_residual/metrics.jsonl $OUT/metrics_residual.jsonl
tar czf $OUT/eval_wm.tgz -C $W eval_plain eval_residual eval_plain.log eval_residual.log
