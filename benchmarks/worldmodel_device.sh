#!/usr/bin/env bash
# Meta-World world models on the H200 machine (nvidia-h200-x2), carry [".whl"]: one recipe per GPU, trained
# side by side on the same budget (TRAIN_S seconds or ITERS steps), then each evaluated on its run's
# held-out (validation) episodes, `eval wm --held-out`, in the settings EVALS names:
#   ema30  EMA weights, the seed's 30 Euler steps, action probes included (the headline report)
#   ema1   EMA weights, 1 step: the model's conditional mean (its PSNR-optimal prediction)
#   raw30  raw weights, 30 steps;  raw1  raw weights, 1 step
# RUNS ("GPU:RECIPE[:TAG] ...", default "0:metaworld_fd 1:metaworld_fd_residual"; a TAG names the run
# RECIPE_TAG and adds the --set overrides in $EXTRA_TAG, for ablations), TRAIN_S, ITERS (unset: the
# recipe's max_iter), EVAL_S (per setting), EVALS, EXTRA (more --set overrides for every run) and
# SKIP_TRAIN=1 (evaluate the runs already in $WM_DIR) tune it. A second call on the still-warm machine
# with the same RUNS resumes the runs from their last checkpoint (runs resume by name).
# Logs, metrics and the eval reports (eval_wm.tgz) come back under $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
nvidia-smi -L
W=${WM_DIR:-/tmp/wm}; mkdir -p $W
RUNS=${RUNS:-"0:metaworld_fd 1:metaworld_fd_residual"}
name() { local rest=${1#*:}; [ "${rest#*:}" = "$rest" ] && echo $rest || echo ${rest%%:*}_${rest#*:}; }
train() {  # gpu recipe [tag]
  local run=$2 tagged=; [ -n "$3" ] && { run=$2_$3; tagged="EXTRA_$3"; }
  CUDA_VISIBLE_DEVICES=$1 timeout ${TRAIN_S:-400} python3 -m wamkit.cli train recipes/$2.toml \
    --set job.output_root="\"$W\"" --set job.name="\"$run\"" ${ITERS:+--set trainer.max_iter=$ITERS} \
    --set checkpoint.save_iter=100 --set trainer.val_every=500 --set trainer.progress_bar=false $EXTRA \
    ${tagged:+${!tagged}} >> $OUT/train_$run.log 2>&1
  echo "train rc=$?" >> $OUT/train_$run.log
}
evalwm() {  # gpu run setting eval-args...
  local gpu=$1 run=$2 tag=$2_$3; shift 3
  CUDA_VISIBLE_DEVICES=$gpu timeout ${EVAL_S:-120} python3 -m wamkit.cli eval wm $W/$run --held-out \
    --out $W/eval_$tag "$@" > $W/eval_$tag.log 2>&1
  echo "eval $tag rc=$?" >> $W/eval_$tag.log
  grep -v Warn $W/eval_$tag.log | tail -12 > $OUT/eval_$tag.txt
}
evals() {  # gpu run; EVALS picks the settings (default: all three)
  for setting in ${EVALS:-ema30 ema1 raw30}; do
    case $setting in
      ema30) evalwm $1 $2 ema30 --num-steps 30 ;;
      ema1) evalwm $1 $2 ema1 --num-steps 1 --no-probes ;;
      raw30) evalwm $1 $2 raw30 --num-steps 30 --no-probes --raw ;;
      raw1) evalwm $1 $2 raw1 --num-steps 1 --no-probes --raw ;;
    esac
  done
}
t0=$(date +%s)
if [ -z "$SKIP_TRAIN" ]; then
  for r in $RUNS; do IFS=: read gpu recipe tag <<< "$r"; train $gpu $recipe $tag & done; wait
  echo "training wall $(( $(date +%s) - t0 )) s"
fi
for r in $RUNS; do evals ${r%%:*} $(name $r) & done; wait
echo "total wall $(( $(date +%s) - t0 )) s"
cat $OUT/eval_*.txt
for r in $RUNS; do cp $W/$(name $r)/metrics.jsonl $OUT/metrics_$(name $r).jsonl; done
(cd $W && tar czf $OUT/eval_wm.tgz eval_*)
