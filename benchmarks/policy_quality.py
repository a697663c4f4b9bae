"""Policy quality: wamkit's tiny Cosmos3 policy vs LeRobot's ACT and Diffusion Policy, trained on the
same demonstrations with the same number of samples seen, evaluated in the same closed loop.

    python benchmarks/policy_quality.py [--env metaworld/reach-v3] [--dataset DIR] [--samples 12000]
        [--batch-size 8] [--episodes 20] [--seed 1000] [--methods wamkit,act,diffusion] [--device cpu|cuda]
        [--out runs/policy_quality] [--recipe recipes/metaworld_reach_tiny.toml] [--set KEY=VALUE ...]
        [--train-seconds S] [--horizon H] [--workers W]

`--env` may be a suite (metaworld/mt10: one policy for all tasks; ACT and DP see no task text, the
scene tells the task). `--train-seconds` trains the LeRobot methods for a wall-time budget (the same GPU
time as a wamkit run, benchmarks/mt10_device.sh); `--workers` runs the closed loop batched over W
simulator processes (wamkit.eval.batched).

On the CPU dev box (Python 3.11; lerobot wants 3.12): `bash benchmarks/lerobot_cpu_env.sh`, then run this with
`PYTHONPATH=.lerobot_cpu` (a diagnostic environment; its header says what it rewrites).
On the H200 machine: `benchmarks/policy_quality_wheels.sh` fetches what it lacks (too much for one
device call), `benchmarks/policy_quality_device.sh` runs the recorded configuration (header: how).

Data: `--dataset` (a single-task LeRobot v3.0 dataset of the env; recorded with `wamkit sim record` at
`--record-seed` when missing; default `<out>/data/<env>`). Every method trains on the training episodes
of wamkit's split (`data.val_fraction`, `job.seed` of the recipe) and on the same observation times:
the start frames of wamkit's training windows (`data.chunk_length` actions each).

* wamkit: `wamkit.train.trainer.Trainer` on the recipe, `trainer.max_iter = samples / batch`, validation
  off, then the EMA weights through `wamkit.policy.Policy` (the recipe's denoising steps).
* ACT / Diffusion Policy: lerobot's own config classes, policies, pre/post processors (dataset
  statistics from the dataset's meta/stats.json, per-channel image mean/std from the training frames),
  optimizer and LR-scheduler presets, and lerobot-train's update (forward -> loss, backward, clip to
  the preset's grad_clip_norm, step); ResNet-18 from scratch (`pretrained_backbone_weights=None`),
  no image augmentation. Frames are decoded once into memory (not counted in the training time).
  ACT: chunk_size = n_action_steps = the wamkit chunk, lerobot's default size (dim_model 512, VAE).
  Diffusion Policy: lerobot's default U-Net, n_obs_steps 1 (the harness shows the policy one
  observation per re-plan), horizon 2 x chunk (a multiple of 8), n_action_steps = chunk, GroupNorm in
  the backbone (the original recipe without pretrained weights), DDPM with all 100 timesteps at
  inference unless --dp-scheduler/--dp-inference-steps say otherwise. Actions past an episode's end
  are padded with its last action and masked as LeRobot's dataset does.

Evaluation: `wamkit.eval.sim_eval.evaluate` with the same env, episode seeds (`--seed`), frame size and
execute horizon (the chunk) for every method; the LeRobot policies go through
`wamkit.eval.lerobot_adapter.LeRobotPolicy`. Prints one markdown table and writes `<out>/results.json`
and `<out>/table.md` (rewritten after every method, so an interrupted run keeps what finished).
A method that cannot run (lerobot not importable) gets a "not run: ..." row; one that fails gets a
"failed: ..." row and the script exits 1 after printing the table.

Cost: closed-loop evaluation is serial (one env, one chunk request per re-plan, ~25 re-plans in a
failed 200-step episode); Diffusion Policy's 100 DDPM steps per chunk dominate it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
METHODS = ("wamkit", "act", "diffusion")
LABELS = {"wamkit": "wamkit tiny Cosmos3", "act": "LeRobot ACT", "diffusion": "LeRobot Diffusion Policy"}


@dataclass
class Row:
    method: str
    status: str = "pending"  # pending | ok | not run: ... | failed: ...
    samples_seen: int | None = None
    batch_size: int | None = None
    steps: int | None = None
    train_wall_s: float | None = None
    params_total: int | None = None
    params_trainable: int | None = None
    successes: int | None = None
    episodes: int | None = None
    success_rate: float | None = None
    ci95: list[float] | None = None
    mean_episode_length: float | None = None
    eval_wall_s: float | None = None
    peak_memory_gib: float | None = None  # GPU memory allocated at most while training (None off CUDA)
    final_loss: float | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="metaworld/reach-v3")
    p.add_argument("--dataset", default=None, help="LeRobot v3.0 dataset of --env (recorded there when missing)")
    p.add_argument("--record-episodes", type=int, default=40)
    p.add_argument("--record-seed", type=int, default=0)
    p.add_argument("--resolution", type=int, default=64, help="frame size when recording")
    p.add_argument("--recipe", default=str(REPO / "recipes" / "metaworld_reach_tiny.toml"))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra wamkit recipe override (repeatable)")
    p.add_argument("--samples", type=int, default=12000, help="training samples seen by each method")
    p.add_argument("--train-seconds", type=float, default=None,
                   help="LeRobot methods: train for this wall time instead of --samples (steps fixed from the rate of "
                   "the first steps, so the LR schedule still ends): the same GPU time as a wamkit run")
    p.add_argument("--horizon", type=int, default=None, help="actions executed per chunk before re-planning (default: the chunk)")
    p.add_argument("--workers", type=int, default=0,
                   help="simulator processes for the closed loop (wamkit.eval.batched; 0: serial, with videos)")
    p.add_argument("--batch-size", type=int, default=8, help="samples per optimizer step, every method")
    p.add_argument("--episodes", type=int, default=20, help="closed-loop evaluation episodes per method")
    p.add_argument("--seed", type=int, default=1000, help="evaluation seed (episode i resets with seed*1000003+i)")
    p.add_argument("--max-steps", type=int, default=None, help="episode step budget (default: the env's)")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--device", default="cpu")
    p.add_argument("--lerobot-lr", type=float, default=None, help="override the LeRobot presets' learning rate")
    p.add_argument("--dp-scheduler", choices=("DDPM", "DDIM"), default="DDPM", help="Diffusion Policy noise scheduler")
    p.add_argument("--dp-inference-steps", type=int, default=None,
                   help="Diffusion Policy denoising steps per chunk (default: lerobot's, all 100 training timesteps)")
    p.add_argument("--videos", type=int, default=1, help="rollout videos kept per method and outcome (the first successes and failures)")
    p.add_argument("--judge-world-model", default=None, metavar="WM",
                   help="also score each LeRobot policy in this forward-dynamics world model (a checkpoint, run or export of "
                   "the same data), as `wamkit eval wm-policy WM --state S` would: <out>/judge/<method>/report.json (the "
                   "first --judge-state; <out>/judge_<S>/<method> for any other), which `wamkit eval wm-policy-merge` "
                   "ranks beside checkpoints judged with the same settings")
    p.add_argument("--judge-state", nargs="+", choices=("recorded", "affine"), default=["recorded"],
                   help="the state ACT and DP are shown in imagination (wm-policy's --state); several: judged once per mode")
    p.add_argument("--judge-max-steps", type=int, default=None, help="imagined frames per episode (wm-policy's --max-steps)")
    p.add_argument("--judge-num-steps", type=int, default=30, help="world-model denoising steps per chunk (wm-policy's --num-steps)")
    p.add_argument("--judge-episodes", type=int, nargs="*", default=None,
                   help="recorded episodes (wm-policy's --episodes; default: the world model's validation episodes of the task)")
    p.add_argument("--out", default=str(REPO / "runs" / "policy_quality"))
    args = p.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in args.methods if m not in METHODS]
    if bad or not args.methods:
        p.error(f"--methods: unknown {bad}; choose from {','.join(METHODS)}")
    if args.samples < args.batch_size or args.batch_size < 1:
        p.error("--samples must be >= --batch-size >= 1")
    return args


# ---- data -----------------------------------------------------------------------------------------
def ensure_dataset(args, out: Path) -> Path:
    from wamkit.sim.record import record

    path = Path(args.dataset) if args.dataset else out / "data" / args.env.replace("/", "_")
    if not (path / "meta" / "info.json").is_file():
        summary = record(args.env, args.record_episodes, path, seed=args.record_seed, resolution=args.resolution)
        print(f"[policy_quality] {summary.format()}", flush=True)
    recording = path / "meta" / "wamkit_recording.json"
    if recording.is_file():
        from wamkit.sim.envs import expand_env_names

        envs = json.loads(recording.read_text()).get("env_name", "")
        if expand_env_names(envs) != expand_env_names(args.env):
            print(f"[policy_quality] warning: {path} was recorded from {envs!r}, evaluating on {args.env!r} "
                  "(ACT and Diffusion Policy are not language-conditioned)", flush=True)
    return path.resolve()


def wamkit_config(args, dataset: Path, out: Path):
    from wamkit.config import load_experiment

    steps = args.samples // args.batch_size
    pairs = {"data.path": str(dataset), "data.generate_demo": False, "job.name": f"wamkit_{args.env.replace('/', '_')}",
             "job.output_root": str(out / "runs"), "trainer.max_iter": steps, "trainer.samples_per_step": args.batch_size,
             "trainer.grad_accum_iter": 1, "trainer.val_every": 0, "trainer.log_every": max(1, steps // 50),
             "trainer.progress_bar": False, "checkpoint.save_iter": steps}
    overrides = [f"{k}={json.dumps(v)}" for k, v in pairs.items()] + list(args.overrides)
    cfg = load_experiment(args.recipe, overrides)
    if any(w >= steps for w in cfg.scheduler.warm_up_steps):  # tiny budgets: the warm-up must end inside the run
        cfg = load_experiment(args.recipe, overrides + [f"scheduler.warm_up_steps=[{steps // 2}]"])
    if cfg.trainer.max_tokens_per_batch:
        raise SystemExit("policy_quality: the recipe sets trainer.max_tokens_per_batch; samples seen must be fixed")
    return cfg


class TrainingSamples:
    """The observation times of wamkit's training windows, frames decoded once: sample i is the
    camera frames (one per camera) and state at (episode, start) and the next `horizon` actions, padded past
    the episode's end with its last action (flagged in action_is_pad, as LeRobot's dataset does)."""

    def __init__(self, windows, horizon: int, device):
        import torch

        ds = windows.dataset
        self.camera_keys, self.state_key, self.action_key = list(windows.camera_keys), windows.state_key, windows.action_key
        self.index = np.asarray(windows.index, dtype=np.int64)
        episodes = sorted({int(e) for e in self.index[:, 0]})
        frames, states, actions, offsets, total = {k: [] for k in self.camera_keys}, [], [], {}, 0
        for ep in episodes:
            n = ds.episode_length(ep)
            cols = ds.episode_columns(ep, [self.state_key, self.action_key])
            for key in self.camera_keys:
                frames[key].append(ds.decode_frames(ep, key, np.arange(n)))
            states.append(np.asarray(cols[self.state_key], dtype=np.float32).reshape(n, -1))
            actions.append(np.asarray(cols[self.action_key], dtype=np.float32).reshape(n, -1))
            offsets[ep], total = total, total + n
        self.episodes = episodes
        self.frames = {key: torch.from_numpy(np.concatenate(f)).permute(0, 3, 1, 2).contiguous().to(device)  # uint8 [N,3,H,W]
                       for key, f in frames.items()}
        self.states = torch.from_numpy(np.concatenate(states)).to(device)
        self.actions = torch.from_numpy(np.concatenate(actions)).to(device)
        ep_start = np.array([offsets[int(e)] for e in self.index[:, 0]])
        ep_last = np.array([offsets[int(e)] + ds.episode_length(int(e)) - 1 for e in self.index[:, 0]])
        self.rows = torch.from_numpy(ep_start + self.index[:, 1]).to(device)  # global row of each sample's observation
        self.last = torch.from_numpy(ep_last).to(device)
        self.horizon = int(horizon)
        self.device = device

    def __len__(self) -> int:
        return len(self.rows)

    def image_stats(self, key: str) -> dict:
        """Per-channel mean/std of one camera's training frames in [0, 1], shaped [3, 1, 1] like LeRobot's stats."""
        x = self.frames[key].float().div(255.0)
        return {"mean": x.mean(dim=(0, 2, 3)).view(3, 1, 1).cpu().numpy(), "std": x.std(dim=(0, 2, 3)).view(3, 1, 1).cpu().numpy()}

    def batch(self, idx) -> dict:
        import torch

        rows = self.rows[idx]
        steps = rows[:, None] + torch.arange(self.horizon, device=self.device)[None]
        last = self.last[idx][:, None]
        images = {key: frames[rows].float().div(255.0) for key, frames in self.frames.items()}
        return {**images, "observation.state": self.states[rows],
                "action": self.actions[torch.minimum(steps, last)], "action_is_pad": steps > last}


def epoch_order(n: int, seed: int):
    """Reshuffled every epoch (like a shuffling DataLoader), seeded."""
    rng, epoch = np.random.default_rng(seed), 0
    while True:
        yield from rng.permutation(n)
        epoch += 1


# ---- methods --------------------------------------------------------------------------------------
def count_params(model) -> tuple[int, int]:
    params = list(model.parameters())
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)


def sync(device: str) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def reset_peak_memory(device: str) -> None:
    """Start counting a method's training peak afresh (each method's row reports its own; the trainer's reset)."""
    import torch

    from wamkit.train import memory

    if str(device).startswith("cuda"):
        memory.reset_peak(torch.device(device))


def peak_memory_gib(device: str) -> float | None:
    """GPU memory allocated at most since reset_peak_memory, in GiB; None off CUDA. Every GPU row of ours reports
    its peak memory, the baselines' as well as wamkit's (whose trainer also prints it against its --dry-run)."""
    import torch

    from wamkit.train import memory

    return torch.cuda.max_memory_allocated(device) / memory.GIB if str(device).startswith("cuda") else None


def train_wamkit(args, cfg, row: Row):
    import torch

    from wamkit.policy import Policy
    from wamkit.policy.loading import load_from_checkpoint
    from wamkit.train.trainer import Trainer, attention_backend

    run_dir = cfg.job.run_dir()
    if run_dir.exists():  # a fresh run every time: the Trainer would otherwise resume it
        shutil.rmtree(run_dir)
    reset_peak_memory(args.device)
    t0 = time.perf_counter()
    trainer = Trainer(cfg, device=args.device)
    summary = trainer.train()
    sync(args.device)
    row.train_wall_s = time.perf_counter() - t0
    row.peak_memory_gib = peak_memory_gib(args.device)
    counts = trainer.parameter_counts
    row.params_total, row.params_trainable = int(counts["total"]), int(counts["trainable"])
    row.steps, row.batch_size = cfg.trainer.max_iter, cfg.trainer.samples_per_step
    row.samples_seen = trainer.consumed
    row.final_loss = summary["last_loss_mean"]
    del trainer
    if str(args.device).startswith("cuda"):
        torch.cuda.empty_cache()
    # the attention kernel training used (auto: sdpa unless bf16 on CUDA), EMA weights
    attention = attention_backend(cfg.model.attention, torch.device(args.device), cfg.parallel.param_dtype)
    policy = Policy(load_from_checkpoint(run_dir, use_ema=True, device=args.device), attention=attention)
    row.note = (f"{row.steps} steps x {row.batch_size} samples (`{Path(args.recipe).name}`, lr {cfg.optimizer.lr:g}, "
                f"EMA weights, video + action loss), {policy.num_steps} denoising steps per chunk, {attention} attention; video decoded "
                f"on the fly inside the timed loop; run dir {run_dir}")
    return policy


def lerobot_horizon(method: str, chunk: int) -> int:
    """Actions per training sample: ACT predicts the executed chunk; Diffusion Policy predicts about
    twice that (its U-Net needs a multiple of 2 ** len(down_dims) = 8) and executes the first chunk."""
    return chunk if method == "act" else -(-2 * chunk // 8) * 8


def lerobot_policy(method: str, samples: TrainingSamples, stats: dict, chunk: int, args):
    """A fresh LeRobot policy and its pre/post processors for the dataset's features."""
    from lerobot.configs import FeatureType, PolicyFeature

    features = {key: PolicyFeature(type=FeatureType.VISUAL, shape=(3, *map(int, frames.shape[2:])))
                for key, frames in samples.frames.items()}
    features |= {"observation.state": PolicyFeature(type=FeatureType.STATE, shape=(samples.states.shape[1],))}
    outputs = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(samples.actions.shape[1],))}
    common = dict(input_features=features, output_features=outputs, device=args.device, pretrained_backbone_weights=None)
    if method == "act":
        from lerobot.policies.act import ACTConfig, ACTPolicy, make_act_pre_post_processors

        config = ACTConfig(chunk_size=chunk, n_action_steps=chunk, **common)
        policy_cls, make_processors = ACTPolicy, make_act_pre_post_processors
    else:
        from lerobot.policies.diffusion import DiffusionConfig, DiffusionPolicy, make_diffusion_pre_post_processors

        # GroupNorm instead of BatchNorm: the original Diffusion Policy's choice for a backbone trained from scratch
        config = DiffusionConfig(n_obs_steps=1, horizon=lerobot_horizon(method, chunk), n_action_steps=chunk,
                                 use_group_norm=True, noise_scheduler_type=args.dp_scheduler,
                                 num_inference_steps=args.dp_inference_steps, **common)
        policy_cls, make_processors = DiffusionPolicy, make_diffusion_pre_post_processors
    if args.lerobot_lr is not None:
        config.optimizer_lr = args.lerobot_lr
        if hasattr(config, "optimizer_lr_backbone"):
            config.optimizer_lr_backbone = args.lerobot_lr
    policy = policy_cls(config).to(args.device)
    pre, post = make_processors(config, dataset_stats=stats)
    return config, policy, pre, post


def judge_dir(out: Path, state_index: int, state: str) -> Path:
    """Where the judge's reports of one state mode go: judge/ for the first mode, judge_<mode>/ for the others."""
    return out / ("judge" if state_index == 0 else f"judge_{state}")


def judge(args, policy, sim_report_dir: Path, out: Path, horizon: int, state: str) -> dict:
    """The world model's score of one LeRobot policy: `wamkit eval wm-policy --state <state>` with the
    defaults the CLI has (dataset and episodes from the world model, seed 0, best PSNR, videos off)."""
    from wamkit.data import LeRobotV3Dataset
    from wamkit.worldmodel import WorldModel
    from wamkit.worldmodel.policy_eval import evaluate_policies, load_sim_report

    wm = WorldModel.from_path(args.judge_world_model, device=args.device, num_steps=args.judge_num_steps)
    return evaluate_policies(wm, [policy], [load_sim_report(sim_report_dir)], LeRobotV3Dataset(wm.contract["dataset"]), out,
                             episodes=args.judge_episodes, state=state, horizon=horizon, max_steps=args.judge_max_steps,
                             videos=False, min_policies=1)


def judge_row(args, policy, row: Row, out: Path, horizon: int) -> bool:
    """judge() for a method's row, once per --judge-state; a failure is reported in the row (its sim result
    stands) and returns False."""
    ok = True
    for i, state in enumerate(args.judge_state):
        key = judge_dir(out, i, state).name  # judge, judge_<mode>: the row's key is its reports' directory
        where = judge_dir(out, i, state) / row.method
        try:
            judged = judge(args, policy, out / "eval" / row.method, where, horizon, state)
        except Exception as exc:  # noqa: BLE001 - the closed-loop result above is still valid
            traceback.print_exc()
            row.extra[key] = {"error": f"{type(exc).__name__}: {exc}"}
            ok = False
            continue
        score = judged["policies"][0]["score"]
        row.extra[key] = {"dir": str(where), "score": score, "state": state}
        print(f"[policy_quality] {LABELS[row.method]}: world-model score {score:.2f} dB with the {state} state "
              f"({where / 'report.json'})", flush=True)
    return ok


def train_lerobot(method: str, args, windows, dataset, chunk: int, seed: int, row: Row, contract: dict | None = None):
    import torch

    from wamkit.eval.lerobot_adapter import LeRobotPolicy, add_obs_steps_dim

    torch.manual_seed(seed)
    t_data = time.perf_counter()
    samples = TrainingSamples(windows, lerobot_horizon(method, chunk), args.device)
    stats = {k: {s: np.asarray(v, dtype=np.float32) for s, v in dataset.stats[k].items() if s != "count"}
             for k in (samples.state_key, samples.action_key)}
    stats["observation.state"] = stats.pop(samples.state_key)
    stats["action"] = stats.pop(samples.action_key)
    stats |= {key: samples.image_stats(key) for key in samples.camera_keys}
    data_s = time.perf_counter() - t_data

    steps = args.samples // args.batch_size
    reset_peak_memory(args.device)
    t0 = time.perf_counter()
    config, policy, pre, post = lerobot_policy(method, samples, stats, chunk, args)
    optim_cfg = config.get_optimizer_preset()
    optimizer = optim_cfg.build(policy.get_optim_params())
    sched_cfg = config.get_scheduler_preset()
    scheduler = sched_cfg.build(optimizer, steps) if sched_cfg is not None else None
    order = epoch_order(len(samples), seed)
    policy.train()
    losses = []
    step, t_warm, refix = 0, 0.0, PROBE_STEPS
    while step < steps:
        if args.train_seconds and step == WARMUP_STEPS:  # the rate is timed from here: the first steps autotune
            sync(args.device)
            t_warm = time.perf_counter() - t0
        if args.train_seconds and step == refix:  # the budget in steps, from the measured steady rate
            sync(args.device)
            steps = time_box_steps(t_warm, time.perf_counter() - t0, step, args.train_seconds)
            scheduler = _rebuilt(sched_cfg, optimizer, steps, step) if sched_cfg is not None else None
            refix = (step + steps) // 2 if refix == PROBE_STEPS and steps > 2 * step else -1  # once more, halfway
        idx = torch.as_tensor([next(order) for _ in range(args.batch_size)], device=args.device)
        batch = add_obs_steps_dim(pre(samples.batch(idx)), policy)
        loss, _ = policy.forward(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), optim_cfg.grad_clip_norm)
        optimizer.step()
        optimizer.zero_grad()
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.item())
        step += 1
        if step % max(1, steps // 10) == 0:
            print(f"[policy_quality] {method} step {step}/{steps} loss {np.mean(losses[-max(1, steps // 10):]):.4f}",
                  flush=True)
    sync(args.device)
    row.train_wall_s = time.perf_counter() - t0
    row.peak_memory_gib = peak_memory_gib(args.device)
    row.params_total, row.params_trainable = count_params(policy)
    row.steps, row.batch_size, row.samples_seen = steps, args.batch_size, steps * args.batch_size
    row.final_loss = float(np.mean(losses[-max(1, min(50, steps // 4)):]))
    lr = optimizer.param_groups[0]["lr"] if scheduler is None else optim_cfg.lr
    executed = f"the first {args.horizon or chunk} executed per re-plan"  # the harness's, not lerobot's action queue
    if method == "act":
        arch = f"chunk_size {config.chunk_size} ({executed}), dim_model {config.dim_model}, VAE (kl_weight {config.kl_weight:g})"
    else:
        arch = (f"n_obs_steps 1, horizon {config.horizon}, n_action_steps {config.n_action_steps} ({executed}), down_dims "
                f"{list(config.down_dims)}, GroupNorm, {config.noise_scheduler_type} {policy.diffusion.num_inference_steps} inference steps")
    row.note = (f"{steps} steps x {args.batch_size} samples, lerobot preset optimizer {type(optim_cfg).__name__} lr {lr:g}"
                f"{', ' + type(sched_cfg).__name__ + ' ' + sched_cfg.name if sched_cfg is not None else ''}, grad clip "
                f"{optim_cfg.grad_clip_norm:g}; {config.vision_backbone} from scratch, {arch}; frames pre-decoded "
                f"({data_s:.1f} s, not timed)")
    policy.eval()
    return LeRobotPolicy(policy, pre, post, camera_keys=samples.camera_keys, chunk_length=chunk,
                         action_dim=samples.actions.shape[1], state_dim=samples.states.shape[1], fps=dataset.fps,
                         source={"method": method, "step": steps}, contract=contract,
                         num_steps=getattr(getattr(policy, "diffusion", None), "num_inference_steps", 1))


WARMUP_STEPS = 20  # a --train-seconds run's first steps (cuDNN autotuning, allocator growth): not timed
PROBE_STEPS = 60  # the step at which it fixes its step count from the rate since WARMUP_STEPS, re-fixed halfway


def time_box_steps(t_warm: float, t_now: float, step: int, train_seconds: float) -> int:
    """Total steps of a time-boxed run at `step` (t_now seconds in, t_warm at WARMUP_STEPS): the rate since
    the warm-up, not since the start. Timed from step 0, the warm-up's slow steps made the H200 MT10 run
    (issue 26) fix 1801 ACT steps that took 86 s of a 240 s box."""
    return steps_in_budget((t_now - t_warm) / max(1, step - WARMUP_STEPS), train_seconds - t_now, step)


def steps_in_budget(seconds_per_step: float, seconds_left: float, done: int) -> int:
    """Total steps of a time-boxed run: those done plus what fits the time left at the measured rate."""
    return done + max(0, int(seconds_left / max(seconds_per_step, 1e-9)))


def _rebuilt(sched_cfg, optimizer, steps: int, done: int):
    """The preset LR schedule for `steps` in all, advanced past the `done` steps already taken (the
    optimizer keeps its `initial_lr`, so the new schedule starts from the preset rate)."""
    scheduler = sched_cfg.build(optimizer, steps)
    for _ in range(done):
        scheduler.step()
    return scheduler


def probe_lerobot() -> dict[str, str | None]:
    """None for a LeRobot method that imports, else why not."""
    reasons: dict[str, str | None] = {}
    for method, module in (("act", "lerobot.policies.act"), ("diffusion", "lerobot.policies.diffusion")):
        try:
            __import__(module)
            if method == "diffusion":
                import diffusers  # noqa: F401 - DiffusionPolicy's DDPM scheduler
            reasons[method] = None
        except Exception as exc:  # noqa: BLE001 - any import failure is reported in the table
            reasons[method] = f"lerobot not importable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    return reasons


# ---- report -------------------------------------------------------------------------------------
def _fmt_int(n: int | None) -> str:
    if n is None:
        return "—"
    return f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.1f} k" if n >= 1e3 else str(n)


def markdown(rows: list[Row], header: str) -> str:
    lines = [header, "", "| method | samples seen | train wall time | params (trainable) | success (95% CI) | mean episode length "
             "| training peak GPU memory |", "| --- | ---: | ---: | ---: | --- | ---: | ---: |"]
    for r in rows:
        if r.status != "ok":
            lines.append(f"| {LABELS[r.method]} | {r.samples_seen or '—'} | — | — | {r.status} | — | — |")
            continue
        params = f"{_fmt_int(r.params_total)} ({_fmt_int(r.params_trainable)})"
        peak = "— (CPU)" if r.peak_memory_gib is None else f"{r.peak_memory_gib:.1f} GiB"
        lines.append(f"| {LABELS[r.method]} | {r.samples_seen} | {r.train_wall_s:.1f} s | {params} | {r.successes}/{r.episodes} = "
                     f"{r.success_rate:.2f} ({r.ci95[0]:.2f}–{r.ci95[1]:.2f}) | {r.mean_episode_length:.1f} | {peak} |")
    lines.append("")
    lines += [f"- {LABELS[r.method]}: {r.note or r.status}" for r in rows]
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, rows: list[Row], meta: dict) -> str:
    header = (f"Policy quality on `{meta['env']}` ({meta['device']}): {meta['train_episodes']} training episodes of "
              f"`{meta['dataset']}`, {meta['episodes']} closed-loop episodes per method (eval seed {meta['seed']}, "
              f"execute horizon {meta['horizon']}, {meta['resolution']} px"
              f"{', step budget ' + str(meta['max_episode_steps']) if meta['max_episode_steps'] else ''}).")
    text = markdown(rows, header)
    (out / "table.md").write_text(text)
    (out / "results.json").write_text(json.dumps({**meta, "rows": [r.__dict__ for r in rows]}, indent=2, default=float))
    return text


def main(argv=None) -> int:
    args = parse_args(argv)
    # The torch/diffusers (triton) stack is imported before any MuJoCo GL context exists: with Mesa's
    # llvmpipe (software EGL), loading triton's LLVM after Mesa's crashes the process. wamkit's training stack
    # only for wamkit's own method and the judge (ACT runs where diffusers is missing; LeRobot's DP needs it for its
    # noise scheduler).
    import torch  # noqa: F401
    import wamkit.sim  # noqa: F401 - picks a headless MUJOCO_GL before mujoco is imported
    from wamkit.eval.suite import evaluate_envs
    from wamkit.sim.envs import expand_env_names
    from wamkit.train.datasets import build_run_data
    if "wamkit" in args.methods or args.judge_world_model:
        import wamkit.policy  # noqa: F401
        import wamkit.train.trainer  # noqa: F401

    unavailable = probe_lerobot() if {"act", "diffusion"} & set(args.methods) else {}
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    dataset_path = ensure_dataset(args, out)
    cfg = wamkit_config(args, dataset_path, out)
    run_data = build_run_data(cfg)
    dataset, windows = run_data.dataset, run_data.train_windows
    chunk = cfg.data.chunk_length
    cam = windows.camera_keys[0]
    resolution = int(dataset.features[cam]["shape"][0])
    meta = {"env": args.env, "dataset": str(dataset_path), "device": args.device, "samples": args.samples,
            "batch_size": args.batch_size, "episodes": args.episodes, "seed": args.seed, "chunk": chunk,
            "resolution": resolution, "max_episode_steps": args.max_steps, "horizon": args.horizon or chunk,
            "train_seconds": args.train_seconds, "train_episodes": len(run_data.contract["train_episodes"]),
            "train_windows": len(windows), "val_episodes": run_data.contract["val_episodes"],
            "recipe": args.recipe, "torch": torch.__version__, "python": sys.version.split()[0]}
    rows = [Row(m) for m in args.methods]
    failed = False
    for row in rows:
        if unavailable.get(row.method):
            row.status = f"not run: {unavailable[row.method]}"
            row.note = row.status
            write_outputs(out, rows, meta)
            continue
        print(f"[policy_quality] === {LABELS[row.method]}: training on {args.samples} samples", flush=True)
        try:
            if row.method == "wamkit":
                policy = train_wamkit(args, cfg, row)
            else:
                policy = train_lerobot(row.method, args, windows, dataset, chunk, cfg.job.seed, row, run_data.contract)
            t0 = time.perf_counter()
            result = evaluate_envs(policy, expand_env_names(args.env), args.episodes, args.seed, workers=args.workers,
                                   execute_horizon=args.horizon or chunk, resolution=resolution, max_episode_steps=args.max_steps,
                                   out_dir=out / "eval" / row.method, num_videos=args.videos)
            row.eval_wall_s = time.perf_counter() - t0
            row.successes, row.episodes, row.success_rate = result.successes, result.episodes, result.success_rate
            row.ci95, row.mean_episode_length = list(result.ci95), result.mean_episode_length
            row.status = "ok"
            tasks = getattr(result, "tasks", [result])
            row.extra = {"eval_dir": result.out_dir, "per_task": {t.env_name: [t.successes, t.episodes] for t in tasks},
                         "per_task_best_reward": {t.env_name: t.mean_best_reward for t in tasks}}
            print(f"[policy_quality] {LABELS[row.method]}: success {result.successes}/{result.episodes}, trained in "
                  f"{row.train_wall_s:.1f} s, evaluated in {row.eval_wall_s:.1f} s", flush=True)
            if args.judge_world_model and row.method != "wamkit":  # wamkit's checkpoints are judged by the CLI
                failed = not judge_row(args, policy, row, out, args.horizon or chunk) or failed
        except Exception as exc:  # noqa: BLE001 - one method failing must not hide the others' rows
            traceback.print_exc()
            failed = True
            row.status = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            row.note = row.note or row.status
        finally:
            policy = None
            if str(args.device).startswith("cuda"):
                torch.cuda.empty_cache()
        write_outputs(out, rows, meta)
    print(write_outputs(out, rows, meta), end="")
    print(f"[policy_quality] wrote {out / 'table.md'} and {out / 'results.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
