"""`wamkit` command line: train | distill | export | serve | data | sim | eval."""

from __future__ import annotations

import argparse
import logging
import json
import os
import sys
import time

STARTED = time.perf_counter()  # the command's start, before torch is imported: trainer.time_budget_s counts from here

# Before torch starts CUDA: expandable segments keep fragmentation from turning a run whose peak fits
# into an out-of-memory one (packed lengths change every step). A user's own setting wins.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

from wamkit import __version__  # noqa: E402
from wamkit.device import DEVICE_HELP, DTYPE_CHOICES, DTYPE_HELP, INFERENCE_DTYPES  # noqa: E402
from wamkit.errors import ConfigError, WamkitError  # noqa: E402

SIM_PIXEL_FORMATS = ("yuv420p", "yuv444p")  # wamkit.data.writer.PIXEL_FORMATS for H.264 (kept here: no av import to parse)

NOISE_SCALE_HELP = ("scale of the noise each chunk's sampling starts from: 1 = the trained distribution, < 1 nearer "
                    "its mode, 0 = one chunk whatever the seed")

# One convention for --set everywhere (help, docs, recipe headers): values bare, '' for an empty one,
# TOML quotes only for a string that would otherwise read as a number, bool or list.
SET_HELP = ("override one recipe key, repeatable: SECTION.KEY=VALUE with VALUE a TOML literal or a bare string, "
            "e.g. --set trainer.max_iter=100 --set data.path=/data/my_set --set checkpoint.load_path='' "
            "(empty); TOML-quote a string that would read as a number or bool: --set job.name='\"2024\"'")
RECIPE_HELP = "a TOML recipe, e.g. recipes/demo_tiny.toml (every key, its default and meaning: src/wamkit/config/schema.py)"
EPILOG = """examples:
  wamkit train recipes/demo_tiny.toml --dry-run          check every input, print shapes and memory
  wamkit train recipes/demo_tiny.toml --set trainer.max_iter=100
  wamkit eval sim runs/demo_tiny metaworld/easy4 --episodes 3 --seed 1000
  wamkit export runs/demo_tiny exports/demo_tiny && wamkit serve exports/demo_tiny --port 8000
run `wamkit COMMAND --help` for a command's arguments and defaults."""
TRAIN_EPILOG = """examples:
  wamkit train recipes/demo_tiny.toml --dry-run
  wamkit train recipes/tiny/g1_simple.toml --set data.path=data/synth_g1_simple --set job.name=g1_try
  torchrun --nproc-per-node=8 -m wamkit.cli train recipes/g1_simple.toml   (FSDP2 over 8 GPUs)
re-running the same job.name resumes it exactly."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's default in its help (unless the help already says it, or there is none to
    show), and epilogs as written."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if not action.option_strings or "default" in text or default is None or default is False or default is argparse.SUPPRESS or default == []:
            return text
        return f"{text} (default: %(default)s)".strip()


# Loggers of optional packages that talk at import time about nothing a wamkit user can act on:
# torchao (optimizer.kind = "adamw8bit") loading C++ kernels built for another torch, diffusers
# registering torchao's quantized tensor types, and torch's notice about torchao's enum registration.
QUIET_IMPORT_LOGGERS = ("torchao", "diffusers.quantizers.torchao.torchao_quantizer", "torch.utils._pytree")


def main(argv: list[str] | None = None) -> int:
    for name in QUIET_IMPORT_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except WamkitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wamkit", description="Post-train Cosmos3 into robot policies and world models.",
                                     epilog=EPILOG, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"wamkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser = _with_formatter(sub.add_parser)

    train = sub.add_parser("train", help="train (or resume, by job.name) from a TOML recipe", epilog=TRAIN_EPILOG)
    train.add_argument("recipe", help=RECIPE_HELP)
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP)
    train.add_argument("--dry-run", action="store_true", help="print the resolved config, implied shapes and memory, and check every input the run reads (all problems at once, exit 2 if any); do not train")
    train.add_argument("--device", default="auto", help=DEVICE_HELP)

    data = sub.add_parser("data", help="dataset tools")
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="DATA_COMMAND")
    data_sub.add_parser = _with_formatter(data_sub.add_parser)
    demo = data_sub.add_parser("demo", help="write a generated 2-D reach dataset (LeRobot v3.0, what the tests use) to OUT_DIR")
    demo.add_argument("out_dir", help="directory to write (created)")
    demo.add_argument("--episodes", type=int, default=32, help="episodes to generate")
    synth = data_sub.add_parser("synth", help="write a small synthetic dataset with a seed recipe's exact schema")
    synth.add_argument("schema", help="g1_simple | droid | so101")
    synth.add_argument("out_dir", help="directory to write (created)")
    synth.add_argument("--episodes", type=int, default=6, help="episodes to generate")
    synth.add_argument("--camera-size", default=None, metavar="HxW", help="every camera at this frame size (default: the schema's tiny size)")
    validate = data_sub.add_parser("validate", help="check a sim-bimanual local bundle; --materialize builds one packed sample")
    validate.add_argument("--bundle", required=True, help="bundle directory (manifest.json + samples.json)")
    validate.add_argument("--materialize", action="store_true", help="also build one packed sample of --stage and report shapes/dtypes")
    validate.add_argument("--stage", type=int, default=0, choices=[0, 1, 2, 3])
    bundle = data_sub.add_parser("bundle", help="convert a bimanual LeRobot v3.0 dataset (ALOHA layout) into a sim-bimanual bundle")
    bundle.add_argument("lerobot_dir", help="LeRobot v3.0 dataset (e.g. from `wamkit sim record aloha/transfer-cube`)")
    bundle.add_argument("out", help="bundle directory to write (must not exist or be empty)")
    bundle.add_argument("--chunk-length", type=int, required=True, help="T: windows of T+1 frames / T action rows (multiple of 4; the stage recipes use 32)")
    bundle.add_argument("--stride", type=int, default=None, help="frames between window starts (default: T, no overlap)")
    bundle.add_argument("--val-fraction", type=float, default=0.1, help="episodes held out for validation (split before windowing)")
    bundle.add_argument("--seed", type=int, default=0, help="seed of the episode split")
    bundle.add_argument("--cameras", default=None, help="comma-separated video keys, tiled left to right (default: all)")
    bundle.add_argument("--resolution", type=int, default=0, help="canvas tier: 0 native, 256, 480 or 720")
    bundle.add_argument("--source", default="aloha", help="source name in the manifest")
    bundle.add_argument("--caption", default="{task}", help="caption template filled with the episode's task")
    cache = data_sub.add_parser("cache-latents", help="tokenize every window of a recipe's dataset once; train with data.latent_cache=DIR")
    cache.add_argument("recipe", help=RECIPE_HELP)
    cache.add_argument("--out", required=True, help="cache directory to write")
    cache.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP)
    cache.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"], help="latent storage dtype")
    cache.add_argument("--device", default="auto", help=DEVICE_HELP)
    doctor = data_sub.add_parser("doctor", help="check a LeRobot v3.0 dataset (against a recipe) and print fixes")
    doctor.add_argument("path", help="LeRobot v3.0 dataset root (meta/, data/, videos/)")
    doctor.add_argument("--recipe", help="check dims, fps, cameras and stats against this recipe")
    doctor.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="with --recipe: " + SET_HELP)
    stats = data_sub.add_parser("stats", help="compute meta/stats.json (min/max/mean/std/q01/q99) from the parquet data")
    stats.add_argument("path", help="LeRobot v3.0 dataset root; writes PATH/meta/stats.json")
    stats.add_argument("--keys", nargs="*", default=[], help="features to cover (default: every numeric feature)")
    stats.add_argument("--overwrite", action="store_true", help="replace an existing meta/stats.json")

    distill = sub.add_parser("distill", help="stage 2/3 distillation (TF-dCM / SF-DMD) from a recipe with a [distill] section")
    distill.add_argument("recipe", help="a TOML recipe with a [distill] section (recipes/sim_bimanual_stage2.toml, stage3)")
    distill.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP)
    distill.add_argument("--device", default="auto", help=DEVICE_HELP)
    distill.add_argument("--dry-run", action="store_true", help="print the resolved recipe, [distill] section and implied shapes, "
                         "and check every input the run reads, the frozen models included (exit 2 if any is missing)")

    export = sub.add_parser("export", help="export a run's checkpoint to a self-contained diffusers-format directory")
    export.add_argument("path", help="run directory or checkpoints/iter_<N>")
    export.add_argument("out_dir", help="export directory to write (local)")
    export.add_argument("--raw", action="store_true", help="export the raw weights instead of the EMA")
    export.add_argument("--student-only", action="store_true", help="distillation run: export the student's EMA (+ student.json with its sampling ladder)")
    export.add_argument("--device", default="auto", help="where the reload check runs; " + DEVICE_HELP)
    export.add_argument("--dtype", default="float32", choices=tuple(INFERENCE_DTYPES),
                        help="the written weights' dtype: float32 keeps the checkpoint's masters; bfloat16 is half the size "
                        "and what a GPU serves in anyway (wamkit serve --dtype auto)")

    serve = sub.add_parser("serve", help="serve a policy over websockets (openpi protocol; GET /healthz)")
    serve.add_argument("path", help="export directory (wamkit.json), run directory or checkpoints/iter_<N>")
    serve.add_argument("--host", default="127.0.0.1", help="use 0.0.0.0 to accept remote clients")
    serve.add_argument("--port", type=int, default=8000, help="TCP port (0: any free port, printed at startup)")
    serve.add_argument("--num-steps", type=int, default=10, help="denoising steps per chunk")
    serve.add_argument("--seed", type=int, default=0, help="noise seed of requests that send no 'seed'")
    serve.add_argument("--noise-scale", type=float, default=1.0, help=NOISE_SCALE_HELP)
    serve.add_argument("--batch-window-ms", type=float, default=5.0, help="batch requests arriving within this window")
    serve.add_argument("--max-batch", type=int, default=16, help="most requests in one batched forward")
    serve.add_argument("--max-request-bytes", type=int, default=16 * 1024 * 1024, help="larger requests get an error")
    serve.add_argument("--device", default="auto", help=DEVICE_HELP)
    serve.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help=DTYPE_HELP)
    serve.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=None,
                       help="run every batch size up to --max-batch once before /healthz answers 200 (default: on for CUDA)")
    serve.add_argument("--warmup-size", default=None, metavar="HxW",
                       help="camera frame size for the warm-up (default: the training cameras' size from the data contract)")
    serve.add_argument("--resize-images", action="store_true",
                       help="resize camera images of another size than training's, as the training canvas does "
                       "(default: refuse them, naming both sizes: a silent resize hides a mis-set camera)")
    serve.add_argument("--stats-every", type=float, default=60.0, metavar="SECONDS",
                       help="log request counts and latency percentiles this often (0: never)")
    serve.add_argument("--fp8", action="store_true",
                       help="multiply the generation pathway in FP8 (e4m3 weights, row-wise scales; GPUs of compute "
                       "capability 8.9+): half the weight memory, actions within FP8's rounding of bf16's; slower than bf16 "
                       "at one client on an H200, faster at eight (docs/serving.md)")

    sim = sub.add_parser("sim", help="simulators: record scripted-expert demonstrations")
    sim_sub = sim.add_subparsers(dest="sim_command", required=True, metavar="SIM_COMMAND")
    sim_sub.add_parser = _with_formatter(sim_sub.add_parser)
    sim_record = sim_sub.add_parser("record", help="roll out ENV's scripted expert and write successful episodes as LeRobot v3.0")
    sim_record.add_argument("env", help="registered env name: metaworld/<task>-v3 (the ten MT10 tasks), aloha/transfer-cube, "
                            "so101/pick-place; comma-separated for several, or a suite: metaworld/mt10, metaworld/easy4, metaworld/mt3")
    sim_record.add_argument("--episodes", type=int, required=True, help="expert attempts; failed ones are dropped and counted")
    sim_record.add_argument("--out", required=True, help="output dataset directory (must not exist or be empty)")
    sim_record.add_argument("--seed", type=int, default=0, help="seed of the first episode's placements")
    sim_record.add_argument("--resolution", type=int, default=64, help="square camera frame size in px (multiple of 16)")
    sim_record.add_argument("--max-steps", type=int, default=None, help="step budget per episode (default: the env's)")
    sim_record.add_argument("--camera", default=None,
                            help="camera to render (default: the env's); Meta-World and aloha/transfer-cube take several, comma-separated, e.g. corner,topview; "
                            "NAME@<zoom>x narrows a camera's view about its centre, e.g. corner@2x; a +shadow suffix lights it from straight "
                            "above with shadows, the depth cue one view lacks, e.g. corner@2x+shadow (eval sim renders what the recording used)")
    sim_record.add_argument("--action-repeat", type=int, default=1,
                            help="hold each expert action for K simulator steps: the dataset runs at the env's fps / K")
    sim_record.add_argument("--workers", type=int, default=0,
                            help="simulator processes for the rollouts (0: in this process; the dataset is the same for any count)")
    sim_record.add_argument("--pix-fmt", choices=SIM_PIXEL_FORMATS, default="yuv444p",
                            help="video pixel format: yuv444p (default) keeps the colour the simulator renders for evaluation; "
                            "yuv420p (LeRobot's default, plays in browsers) halves the colour resolution, which smears small "
                            "coloured cues at 64 px (a window-open policy: 10/30 trained on 4:2:0, 25/30 on 4:4:4)")
    sim_record.add_argument("--expert-noise", type=float, default=0.0,
                            help="execute the expert's actions with Gaussian noise of this scale times each action's half range "
                            "and record its clean actions (DART): states off the expert's path labelled with its correction, "
                            "e.g. 0.2; failed episodes are dropped as always")

    evaluate = sub.add_parser("eval", help="evaluate a policy")
    eval_sub = evaluate.add_subparsers(dest="eval_command", required=True, metavar="EVAL_COMMAND")
    eval_sub.add_parser = _with_formatter(eval_sub.add_parser)
    eval_sim = eval_sub.add_parser("sim", help="closed-loop success rate in a simulator; writes report.md, results.json, mp4s")
    eval_sim.add_argument("path", help="export directory (wamkit.json), run directory or checkpoints/iter_<N>")
    eval_sim.add_argument("env", help="registered env name (e.g. metaworld/push-v3), comma-separated names, or a suite: "
                          "metaworld/mt10, metaworld/easy4, metaworld/mt3 (per-task success and the average)")
    eval_sim.add_argument("--episodes", type=int, required=True, help="episodes per task")
    eval_sim.add_argument("--seed", type=int, required=True, help="episode seeds; use one other than the recording seed")
    eval_sim.add_argument("--horizon", type=int, default=None, help="actions executed per chunk before re-planning "
                          "(default: chunk length; half of it with --inference-delay)")
    eval_sim.add_argument("--inference-delay", type=int, nargs="+", default=None, metavar="D",
                          help="simulate D control steps of inference latency (several: one run each) with --modes; "
                          "writes OUT/realtime.md")
    eval_sim.add_argument("--modes", default="sync,naive,rtc", help="with --inference-delay: sync (stop while computing), "
                          "naive (keep executing, then jump), rtc (real-time chunking)")
    eval_sim.add_argument("--out", default=None, help="report directory (default: eval/<env>)")
    eval_sim.add_argument("--resolution", type=int, default=None, help="frame size (default: the training dataset's)")
    eval_sim.add_argument("--max-steps", type=int, default=None, help="step budget per episode (default: the env's)")
    eval_sim.add_argument("--num-steps", type=int, default=10, help="denoising steps per chunk")
    eval_sim.add_argument("--noise-scale", type=float, default=1.0, help=NOISE_SCALE_HELP)
    eval_sim.add_argument("--raw", action="store_true", help="evaluate a run's raw weights instead of its EMA "
                          "(a checkpoint holds both; an export holds one set and refuses this)")
    eval_sim.add_argument("--all-checkpoints", action="store_true", help="evaluate every checkpoint of a run and plot success vs step (PNG)")
    eval_sim.add_argument("--expert-trace", action="store_true", help="also ask the simulator's scripted expert what it would do "
                          "in every state the policy acts in; the report says, per action dimension, how often the policy "
                          "moved the way the expert firmly asked and how far apart they were (failed episodes apart)")
    eval_sim.add_argument("--device", default="auto", help=DEVICE_HELP)
    eval_sim.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help=DTYPE_HELP)
    eval_sim.add_argument("--workers", type=int, default=0, help="simulator processes: the policy answers all of them in one "
                          "batch per chunk (much faster on many cores; videos are replays of the episodes' actions); 0: serial, in this process")
    eval_sim.add_argument("--videos", type=int, default=1, help="rollout videos per task and outcome: the first N successes "
                          "and the first N failures (default 1; 0: none)")
    wm = eval_sub.add_parser("wm", help="world-model rollouts along recorded episodes: videos, metrics, report")
    wm.add_argument("checkpoint", help="run directory, checkpoints/iter_<N> directory or export directory")
    wm.add_argument("--dataset", help="LeRobot v3.0 dataset (default: the training dataset)")
    wm_episodes = wm.add_mutually_exclusive_group()
    wm_episodes.add_argument("--episodes", type=int, nargs="*", default=None, help="episode indices (default: first validation episode)")
    wm_episodes.add_argument("--held-out", action="store_true", help="every validation episode of the run (held out of training)")
    wm.add_argument("--modes", nargs="+", default=["teacher_forced", "autoregressive"], choices=["teacher_forced", "autoregressive"])
    wm.add_argument("--num-steps", type=int, default=30, help="denoising steps per chunk (seed eval setting: 30)")
    wm.add_argument("--shift", type=float, default=None, help="noise-schedule shift (default: the training shift; seed eval: 10)")
    wm.add_argument("--guidance", type=float, default=1.0, help="classifier-free guidance scale (1.0 = off)")
    wm.add_argument("--guidance-interval", type=float, nargs=2, default=[0.0, 1.0], metavar=("LOW", "HIGH"), help="sigma range where guidance applies")
    wm.add_argument("--solver", choices=["euler", "unipc"], default="euler", help="sampler")
    wm.add_argument("--seed", type=int, default=0, help="noise seed")
    wm.add_argument("--no-probes", action="store_true", help="skip the per-axis action probes")
    wm.add_argument("--raw", action="store_true", help="evaluate a checkpoint's raw weights instead of its EMA")
    wm.add_argument("--attention", choices=["sdpa", "flex", "per_sample"], default=None,
                    help="attention backend for sampling (default: the run's, with flex sampled as per_sample)")
    wm.add_argument("--out", help="output directory (default: <run>/eval_wm/iter_<N> or <export>/eval_wm)")
    wm.add_argument("--device", default="auto", help=DEVICE_HELP)
    wm.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help=DTYPE_HELP)
    wmp = eval_sub.add_parser("wm-policy", help="rank policies by closed-loop rollouts imagined in a world model (against their eval sim success when given)")
    wmp.add_argument("world_model", help="forward-dynamics run directory, checkpoints/iter_<N> directory or export directory")
    wmp.add_argument("--policies", nargs="+", required=True, metavar="PATH", help="at least 2 policy checkpoints/exports, e.g. RUN/checkpoints/iter_*")
    wmp.add_argument("--sim-reports", nargs="+", metavar="RESULTS", help="one `wamkit eval sim` results.json (or its directory) per "
                     "policy, same order: the ranking is rank-correlated with their success (without them: the ranking alone, "
                     "over every task's held-out episodes)")
    wmp.add_argument("--dataset", help="recorded successful episodes (default: the world model's training dataset)")
    wmp.add_argument("--episodes", type=int, nargs="*", default=None, help="episode indices (default: the world model's validation episodes of the sim task)")
    wmp.add_argument("--state", choices=["none", "recorded", "affine"], default="none",
                     help="what state-using models are shown: 'affine', the state advanced by the actions taken (a least-squares "
                     "model fit on the dataset's other episodes; its fit is in the report); 'recorded', the recorded state at "
                     "the same step (leaks the expert's trajectory)")
    wmp.add_argument("--score", choices=["best", "final"], default="best", help="closest approach to the goal frame, or the last imagined frame")
    wmp.add_argument("--horizon", type=int, default=None, help="actions executed per re-plan (default: each sim report's, else the chunk)")
    wmp.add_argument("--max-steps", type=int, default=None, help="imagined frames per episode (default: the longest recorded episode)")
    wmp.add_argument("--policy-steps", type=int, default=None, help="policy denoising steps (default: each sim report's, else 10)")
    wmp.add_argument("--num-steps", type=int, default=30, help="world-model denoising steps per chunk")
    wmp.add_argument("--shift", type=float, default=None, help="world-model noise shift (default: the training shift)")
    wmp.add_argument("--guidance", type=float, default=1.0, help="world-model classifier-free guidance scale (1.0 = off)")
    wmp.add_argument("--solver", choices=["euler", "unipc"], default="euler", help="world-model sampler")
    wmp.add_argument("--seed", type=int, default=0, help="noise seed")
    wmp.add_argument("--no-videos", action="store_true", help="skip the mp4s and strip.png")
    wmp.add_argument("--out", help="output directory (default: eval/wm_policy/<env>)")
    wmp.add_argument("--device", default="auto", help=DEVICE_HELP)
    wmp.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help=DTYPE_HELP + " (the world model's and every policy's)")
    ol = eval_sub.add_parser("open-loop", help="what a policy asks for in held-out recorded expert states, against the recorded actions")
    ol.add_argument("path", help="export directory (wamkit.json), run directory or checkpoints/iter_<N>")
    ol.add_argument("--dataset", help="recorded episodes (default: the policy's training dataset)")
    ol.add_argument("--episodes", type=int, nargs="*", default=None, help="episode indices (default: the run's validation episodes)")
    ol.add_argument("--horizon", type=int, default=None, help="actions of each chunk compared (default: half the chunk)")
    ol.add_argument("--every", type=int, default=8, help="predict a chunk every this many recorded steps")
    ol.add_argument("--num-steps", type=int, default=10, help="policy denoising steps")
    ol.add_argument("--seed", type=int, default=0, help="noise seed")
    ol.add_argument("--swap-prompts", action="store_true",
                    help="show each task's episodes the next task's text: does the policy read its task from the text or the scene?")
    ol.add_argument("--out", help="output directory (default: eval/open_loop)")
    ol.add_argument("--device", default="auto", help=DEVICE_HELP)
    wmm = eval_sub.add_parser("wm-policy-merge", help="one ranking from wm-policy reports of the same world model, episodes and settings")
    wmm.add_argument("reports", nargs="+", metavar="REPORT", help="`wamkit eval wm-policy` output directories or their report.json")
    wmm.add_argument("--out", help="output directory (default: <first report's parent>/merged)")
    wmm.add_argument("--sim-reports", nargs="+", metavar="RESULTS", help="one `wamkit eval sim` results.json per merged policy "
                     "(in the merged order) for reports judged without them: the ranking is then rank-correlated with their success")

    return parser


def _with_formatter(add_parser):
    """Subcommands format their help like the top level (defaults shown, epilogs as written)."""
    def add(*args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        return add_parser(*args, **kwargs)
    return add


# Path arguments of the commands that read runs and checkpoints (an object-store URL is fine there:
# wamkit.storage) and those they write to (exports and reports are local directories).
INPUT_ARGUMENTS = ("path", "checkpoint", "world_model", "policies")
OUTPUT_ARGUMENTS = ("out_dir", "out")


def _check_urls(args) -> None:
    """Check the URLs among the path arguments before any work: a scheme wamkit cannot read or a
    missing backend is an error naming the argument, and so is an output URL, which would
    otherwise become a local folder named "s3:"."""
    from wamkit.storage import check_url, is_url

    for name in INPUT_ARGUMENTS + OUTPUT_ARGUMENTS:
        values = getattr(args, name, None)
        for value in values if isinstance(values, list) else [values]:
            where = f"wamkit {args.command} {name.upper()}"
            if value is not None and is_url(value) and name in OUTPUT_ARGUMENTS:
                raise ConfigError(where, f"{value!r} is an object-storage URL; exports and reports are written to a "
                                  "local directory", "write it locally, then copy it (aws s3 cp --recursive, gcloud storage cp -r)")
            if value is not None:
                check_url(value, where)


def _dispatch(args) -> int:
    if args.command in ("export", "serve", "eval"):
        _check_urls(args)
    if getattr(args, "device", None) is not None:  # decided once, here, for every command that computes
        from wamkit.device import resolve_device

        args.device = str(resolve_device(args.device))
    if args.command == "train":
        return _train(args)
    if args.command == "data" and args.data_command == "demo":
        from wamkit.data import write_demo_dataset

        path = write_demo_dataset(args.out_dir, num_episodes=args.episodes)
        print(f"wrote LeRobot v3.0 demo dataset to {path}")
        return 0
    if args.command == "data" and args.data_command == "synth":
        from wamkit.sim.schema_synth import write_schema_dataset

        size = tuple(int(v) for v in args.camera_size.lower().split("x")) if args.camera_size else None
        print(f"wrote {args.schema} schema dataset to {write_schema_dataset(args.schema, args.out_dir, args.episodes, camera_size=size)}")
        return 0
    if args.command == "data" and args.data_command == "cache-latents":
        from wamkit.config import load_experiment
        from wamkit.train.latents import cache_latents

        out = cache_latents(load_experiment(args.recipe, args.overrides), args.out, dtype=args.dtype, device=args.device)
        print(f"wrote latent cache to {out}; train with --set data.latent_cache={out}")
        return 0
    if args.command == "data" and args.data_command == "doctor":
        from wamkit.config import load_experiment
        from wamkit.data.doctor import doctor_main

        cfg = load_experiment(args.recipe, [f"data.path={args.path!r}", *args.overrides]) if args.recipe else None
        return doctor_main(args.path, cfg)
    if args.command == "data" and args.data_command == "stats":
        from wamkit.data.stats import stats_main

        return stats_main(args.path, args.keys, args.overwrite)
    if args.command == "sim" and args.sim_command == "record":
        from wamkit.sim import sim_record_main

        return sim_record_main(args)
    if args.command == "eval" and args.eval_command == "wm":
        from wamkit.worldmodel import eval_wm_main

        episodes = "held_out" if args.held_out else args.episodes
        return eval_wm_main(args.checkpoint, dataset=args.dataset, episodes=episodes, modes=args.modes, out_dir=args.out,
                            num_steps=args.num_steps, shift=args.shift, guidance=args.guidance,
                            guidance_interval=tuple(args.guidance_interval), solver=args.solver, seed=args.seed,
                            probes=not args.no_probes, device=args.device, use_ema=not args.raw, attention=args.attention,
                            dtype=args.dtype)
    if args.command == "eval" and args.eval_command == "wm-policy-merge":
        from wamkit.worldmodel.policy_eval import merge_main

        return merge_main(args.reports, args.out, args.sim_reports)
    if args.command == "eval" and args.eval_command == "wm-policy":
        from wamkit.worldmodel.policy_eval import eval_wm_policy_main

        return eval_wm_policy_main(args.world_model, args.policies, args.sim_reports, dataset=args.dataset, episodes=args.episodes,
                                   out_dir=args.out, state=args.state, score=args.score, horizon=args.horizon,
                                   max_steps=args.max_steps, policy_steps=args.policy_steps, num_steps=args.num_steps,
                                   shift=args.shift, guidance=args.guidance, solver=args.solver, seed=args.seed,
                                   videos=not args.no_videos, device=args.device, dtype=args.dtype)
    if args.command == "eval" and args.eval_command == "open-loop":
        from wamkit.eval.open_loop import open_loop_main

        return open_loop_main(args.path, args.dataset, args.episodes, args.horizon, args.every, args.seed, args.out,
                              args.device, args.num_steps, args.swap_prompts)
    if args.command == "eval" and args.eval_command == "sim":
        from wamkit.eval.suite import eval_sim_main

        return eval_sim_main(args)
    if args.command == "data" and args.data_command == "bundle":
        from wamkit.bimanual.convert import bundle_main

        return bundle_main(args)
    if args.command == "data" and args.data_command == "validate":
        from wamkit.bimanual import validate_main

        return validate_main(args.bundle, materialize=args.materialize, stage=args.stage)
    if args.command == "distill" and args.dry_run:
        import dataclasses

        from wamkit.distill import load_distill_recipe

        cfg, dcfg = load_distill_recipe(args.recipe, args.overrides)
        section = "# [distill]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in dataclasses.asdict(dcfg).items())
        frozen = {f"distill.{k}": v for k, v in dataclasses.asdict(dcfg).items() if k.endswith("_path") and v}
        return _dry_run(cfg, section, frozen, dcfg)
    if args.command == "distill":
        from wamkit.distill import distill_main
        from wamkit.train.stack_dump import dump_stacks_on_sigterm

        dump_stacks_on_sigterm()
        summary = distill_main(args.recipe, args.overrides, device=args.device)
        if os.environ.get("RANK", "0") == "0":  # under torchrun, one summary, not one per process
            print("[wamkit] done: " + json.dumps(summary, indent=2))
        return 0
    if args.command == "export":
        if args.student_only:
            from wamkit.distill import export_student

            print(f"exported student EMA to {export_student(args.path, args.out_dir, dtype=args.dtype)}")
            return 0
        from wamkit.export import export_run

        print(f"exported to {export_run(args.path, args.out_dir, use_ema=not args.raw, device=args.device, dtype=args.dtype)}")
        return 0
    if args.command == "serve":
        from wamkit.serve import serve_main
        from wamkit.serve.warmup import parse_size

        return serve_main(args.path, host=args.host, port=args.port, num_steps=args.num_steps, seed=args.seed,
                          batch_window_ms=args.batch_window_ms, max_batch=args.max_batch,
                          max_request_bytes=args.max_request_bytes, device=args.device, warmup=args.warmup,
                          warmup_size=parse_size(args.warmup_size) if args.warmup_size else None,
                          resize_images=args.resize_images, stats_every_s=args.stats_every, fp8=args.fp8, dtype=args.dtype,
                          noise_scale=args.noise_scale)
    raise AssertionError(args)


def _train(args) -> int:
    from wamkit.config import load_experiment

    cfg = load_experiment(args.recipe, args.overrides)
    if args.dry_run:
        return _dry_run(cfg)
    from wamkit.train.stack_dump import dump_stacks_on_sigterm
    from wamkit.train.trainer import Trainer

    dump_stacks_on_sigterm()  # a job killed from outside says where it was (a hang's only trace)
    summary = Trainer(cfg, device=args.device, started=STARTED).train()
    if os.environ.get("RANK", "0") == "0":  # under torchrun, one summary, not one per process
        print("[wamkit] done: " + json.dumps(summary, indent=2))
    return 0


def _dry_run(cfg, extra: str = "", iterations: dict[str, str] | None = None, dcfg=None) -> int:
    """`--dry-run`: the resolved config, shapes and memory, then the input checks on stdout and each
    problem with its fix on stderr (as a launch would print it); non-zero when any would stop the run."""
    from wamkit.train.dry_run import describe
    from wamkit.train.preflight import preflight

    try:
        print(describe(cfg, dcfg))
    except WamkitError as exc:  # an input the shapes need is broken: the checks below name it, with the rest
        print(f"# shapes not computed: {exc.where}: {exc.problem}")
    if extra:
        print(extra)
    report = preflight(cfg, iterations)
    print("\n".join(report.lines()))
    for problem in report.problems:
        print(f"error: {problem}", file=sys.stderr)
    return 2 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
