#!/usr/bin/env bash
# benchmarks/serve_export.py on one H200 (issue 30): `wamkit serve EXPORT` at Nano width, two device
# calls of at most 9 minutes each (the python part is bounded at 480 s by --budget-s, 500 s by timeout).
#
#   here, once:   bash benchmarks/serve_export_device.sh wheels   # fills .whl/ (git-ignored, ~45 MB): av, websockets,
#                                                                 # diffusers, importlib_metadata, openpi-client
#   device call 1: run(kind="nvidia-h200", carry=[".whl"], timeout_s=560, command="bash benchmarks/serve_export_device.sh latency")
#       makes the export (random Nano weights, bf16, ~30 GB + 2.8 GB VAE under /tmp, or /dev/shm if /tmp lacks 36 GB), starts `wamkit serve` in its own
#       process, measures 1 and 8 clients plain and with real-time chunking, the first request after /healthz 200,
#       the bad requests, then the in-process harness row (the served process idles meanwhile)
#   FP8:          run(..., command="bash benchmarks/serve_export_device.sh fp8")  # latency and in-process rows with --fp8
#   device call 2: run(kind="nvidia-h200", carry=[".whl"], timeout_s=560, command="bash benchmarks/serve_export_device.sh soak")
#       reuses the export if the machine is still the warm one (else makes it again, ~2 min), then soaks
#       8 clients for as many minutes as the budget leaves (at most 8), one row a minute
#   the 10-minute soak, across two back-to-back calls (one call is at most 10 minutes, the export and the
#   server's start come first): the soak runs detached (setsid), so it outlives the call that started it
#       run(kind="nvidia-h200", carry=[".whl"], timeout_s=590, command="bash benchmarks/serve_export_device.sh soak10-start")
#       run(kind="nvidia-h200", carry=[".whl"], timeout_s=420, command="bash benchmarks/serve_export_device.sh soak10-finish")
#       the second call must start within the machine's ~30 s warm window; it waits for the soak's end and brings
#       its log, the server's log and the results back (the first brings the rows so far)
#       SOAK_EXTRA adds serve_export.py flags to the detached run, e.g. SOAK_EXTRA="--fp8 --parts latency": the FP8
#       server (the configuration that meets the latency goal) measured at 1 and 8 clients, then soaked
#   (fallback) `... serve_export_device.sh inprocess`: the in-process harness row alone, if call 1 ran out of budget
#       before it (it runs last there, while the served process idles)
#
# Output: the tables on stdout (output_tail) and in $OUT/serve_export_<mode>.log; $OUT/wamkit_serve.log (the
# server's own log: load, warm-up per batch size) and $OUT/serve_export_results.json.
set -uo pipefail
mode=${1:?usage: bash benchmarks/serve_export_device.sh wheels|latency|fp8|soak|soak10-start|soak10-finish|inprocess}

if [ "$mode" = wheels ]; then  # on the dev machine, before the device calls
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d .whl \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 --platform any \
    "av==18.1.0" "websockets==17.4" "diffusers==0.42.1" "importlib_metadata==10.2.0" "openpi-client==0.1.2" || exit 1
  du -sh .whl
  exit 0
fi

export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
python3 -c "import av, diffusers, websockets, openpi_client" 2>/dev/null ||
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
python3 -c "import av, diffusers, websockets, openpi_client, torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))" || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
df -h /tmp /dev/shm

SOAK=/tmp/wamkit_soak10  # the detached soak's log directory (it survives between back-to-back calls)
if [ "$mode" = soak10-finish ]; then
  [ -d $SOAK ] || { echo "no detached soak on this machine ($SOAK missing): the machine was not the warm one; run soak10-start again"; exit 3; }
  for _ in $(seq 400); do [ -f $SOAK/exit_code ] && break; sleep 1; done
  cp $SOAK/*.log $SOAK/*.json "$OUT/" 2>/dev/null
  cat $SOAK/serve_export_soak.log
  [ -f $SOAK/exit_code ] || { echo "the soak is still running after 400 s: call soak10-finish again"; exit 4; }
  exit "$(cat $SOAK/exit_code)"
fi

# The export needs ~34 GB (30.3 GB bf16 transformer + 2.8 GB fp32 VAE). The image shares the 64 GB disk with /tmp, so
# take /tmp when it has 36 GB free, else /dev/shm (RAM; 128 GB machine); an export already made on this machine is reused.
export_dir=""
for d in /tmp /dev/shm; do [ -f "$d/wamkit_nano_export/wamkit.json" ] && export_dir=$d/wamkit_nano_export && break; done
if [ -z "$export_dir" ]; then
  for d in /tmp /dev/shm; do
    free_kb=$(df -Pk "$d" 2>/dev/null | awk 'NR==2 {print $4}')
    if [ "${free_kb:-0}" -gt $((36 * 1024 * 1024)) ]; then export_dir=$d/wamkit_nano_export; break; fi
  done
fi
[ -n "$export_dir" ] || { echo "neither /tmp nor /dev/shm has 36 GB free for the export"; df -h /tmp /dev/shm; exit 3; }
echo "export directory: $export_dir"

common=(--preset nano --device cuda --kind nvidia-h200 --export "$export_dir" --log-dir "$OUT"
        --num-steps 4 --image-size 256 --text-tokens 256 --clients 1,8 --requests 20 --budget-s 480)
case "$mode" in
  latency) parts=(--parts latency,bad,inprocess) ;;
  fp8) parts=(--parts latency,inprocess --fp8) ;;  # the same rows with `wamkit serve --fp8` (after latency on a warm machine: the export is reused)
  soak) parts=(--parts "" --soak-minutes 8) ;;
  soak10-start)  # later flags win: a budget of 16 minutes, logs where the next call finds them
    rm -rf $SOAK; mkdir -p $SOAK
    setsid nohup bash -c "timeout -k 20 1000 python3 benchmarks/serve_export.py ${common[*]} --parts '' --soak-minutes 10 \
      --budget-s 960 --log-dir $SOAK ${SOAK_EXTRA:-} > $SOAK/serve_export_soak.log 2>&1; echo \$? > $SOAK/exit_code" < /dev/null > /dev/null 2>&1 &
    for _ in $(seq ${FOLLOW_S:-540}); do [ -f $SOAK/exit_code ] && break; sleep 1; done
    cp $SOAK/*.log $SOAK/*.json "$OUT/" 2>/dev/null
    cat $SOAK/serve_export_soak.log
    [ -f $SOAK/exit_code ] && exit "$(cat $SOAK/exit_code)"
    echo "the soak runs on, detached: call soak10-finish now (within the ~30 s warm window)"; exit 0 ;;
  inprocess) parts=(--parts inprocess) ;;  # only if call 1 printed "skipped the in-process row: budget"
  *) echo "unknown mode $mode (wheels|latency|fp8|soak|soak10-start|soak10-finish|inprocess)"; exit 2 ;;
esac
timeout -k 20 500 python3 benchmarks/serve_export.py "${common[@]}" "${parts[@]}" 2>&1 | tee "$OUT/serve_export_$mode.log"
rc=${PIPESTATUS[0]}
df -h /tmp /dev/shm
exit "$rc"
