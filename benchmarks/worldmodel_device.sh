#!/usr/bin/env bash
# The Meta-World world models on the H200 machine (nvidia-h200-x2), carry [".whl"]: the plain recipe on
# GPU 0 and the residual one on GPU 1 train side by side on the same budget (TRAIN_S seconds or ITERS
# steps), then each is evaluated on the held-out episodes (2 4 30 34) three ways:
#   ema30  EMA weights, the seed's 30 Euler steps, action probes included (the headline report)
#   ema1   EMA weights, 1 step: the model's conditional mean (its PSNR-optimal prediction)
#   raw30  raw weights, 30 steps
# TRAIN_S, ITERS, EVAL_S (per setting), EVALS, EXTRA (more --set overrides for both runs) and SKIP_TRAIN=1 (evaluate the runs already in $WM_DIR) tune it.
# Logs, metrics and the eval reports (eval_wm.tgz) come back under $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
nvidia-smi -L
W=${WM_DIR:-/tmp/wm}; mkdir -p $W
train() {  # gpu recipe tag
  CUDA_VISIBLE_DEVICES=$1 timeout ${TRAIN_S:-400} python3 -m wamkit.cli train recipes/$2.toml --device cuda \
    --set job.output_root="\"$W\"" --set trainer.max_iter=${ITERS:-1500} --set checkpoint.save_iter=100 \
    --set trainer.val_every=500 --set trainer.progress_bar=false $EXTRA > $OUT/train_$3.log 2>&1
  echo "train rc=$?" >> $OUT/train_$3.log
}
evalwm() {  # gpu run tag setting eval-args...
  local gpu=$1 run=$2 tag=$3_$4; shift 4
  CUDA_VISIBLE_DEVICES=$gpu timeout ${EVAL_S:-120} python3 -m wamkit.cli eval wm $W/$run --episodes 2 4 30 34 \
    --device cuda --out $W/eval_$tag "$@" > $W/eval_$tag.log 2>&1
  echo "eval $tag rc=$?" >> $W/eval_$tag.log
  grep -v Warn $W/eval_$tag.log | tail -12 > $OUT/eval_$tag.txt
}
evals() {  # gpu run tag; EVALS picks the settings (default: all three)
  for setting in ${EVALS:-ema30 ema1 raw30}; do
    case $setting in
      ema30) evalwm $1 $2 $3 ema30 --num-steps 30 ;;
      ema1) evalwm $1 $2 $3 ema1 --num-steps 1 --no-probes ;;
      raw30) evalwm $1 $2 $3 raw30 --num-steps 30 --no-probes --raw ;;
    esac
  done
}
t0=$(date +%s)
if [ -z "$SKIP_TRAIN" ]; then
  train 0 metaworld_fd plain & train 1 metaworld_fd_residual residual & wait
  echo "training wall $(( $(date +%s) - t0 )) s"
fi
evals 0 metaworld_fd plain & evals 1 metaworld_fd_residual residual & wait
echo "total wall $(( $(date +%s) - t0 )) s"
cat $OUT/eval_*.txt
cp $W/metaworld_fd/metrics.jsonl $OUT/metrics_plain.jsonl; cp $W/metaworld_fd_residual/metrics.jsonl $OUT/metrics_residual.jsonl
(cd $W && tar czf $OUT/eval_wm.tgz eval_*)
