"""The one experiment schema. Every recipe knob lives here, typed and documented; nothing else in
wamkit reads a recipe, so a knob that is documented is a knob that reaches the code."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from wamkit.config.lerobot_home import check_repo_id
from wamkit.config.env import ENV_PATH_FIELDS, _empty_fix, _from_env, expand_fields, resolved
from wamkit.errors import ConfigError
from wamkit.storage import check_url, is_remote, location

PREDICTIONS = ("velocity", "x0")  # diffusion.video_prediction, diffusion.action_prediction
X0_LOSS_WEIGHTINGS = ("velocity", "uniform")  # diffusion.x0_loss_weighting
ACTION_LOSSES = ("mse", "l1")  # diffusion.action_loss
ACTION_SIGMAS = ("shared", "independent")  # diffusion.action_sigma

TASK_MODES = ("policy", "forward_dynamics", "inverse_dynamics", "mixed")
SAMPLE_MODES = ("policy", "forward_dynamics", "inverse_dynamics")  # what `mixed` draws from
NORMALIZATION_MODES = ("minmax", "quantile", "meanstd", "asinh", "none")
SCHEDULER_KINDS = ("LambdaLinear", "LambdaCosine", "constant")
OPTIMIZER_KINDS = ("adamw", "adamw8bit")
TOKENIZER_KINDS = ("pixel", "pixel_unshuffle", "wan2.2")
FRAME_POSITION_KINDS = ("none", "fourier")  # wamkit.model.frame_positions
VISION_STEM_KINDS = ("none", "conv", "resnet", "action_keypoints", "action_eye")  # wamkit.model.vision_stem
ATTENTION_BACKENDS = ("auto", "sdpa", "flex", "per_sample")
ACTION_SPACES = ("", "joint_pos", "joint_velocity", "cartesian_position", "cartesian_velocity")


@dataclass
class JobConfig:
    """Run identity: `name` is the run name; re-running the same name resumes it."""

    name: str = "demo"
    output_root: str = ""  # "" -> $WAMKIT_OUTPUT_ROOT or ./runs
    seed: int = 0

    def run_dir(self):
        """<output_root>/<name>: a Path, or a UPath when output_root is an s3:// or gs:// URL."""
        if self.output_root:
            return location(self.output_root, "job.output_root") / self.name
        return location(os.environ.get("WAMKIT_OUTPUT_ROOT", "") or "runs", "WAMKIT_OUTPUT_ROOT") / self.name

    def local_dir(self) -> Path:
        """Where the run's append-only logs are written (metrics.jsonl, TensorBoard, W&B files): the run
        directory itself, or for a run in an object store a local staging copy that is uploaded with
        every checkpoint ($WAMKIT_STAGING_DIR, default ~/.cache/wamkit/staging, then bucket/prefix/name)."""
        run = self.run_dir()
        if not is_remote(run):
            return run
        staging = Path(os.environ.get("WAMKIT_STAGING_DIR", "") or "~/.cache/wamkit/staging").expanduser()
        return staging / run.protocol / run.path


@dataclass
class DataConfig:
    """Where the LeRobot v3.0 dataset is and how windows are cut from it."""

    path: str = ""  # dataset root; ${VAR} is expanded. With repo_id set it plays LeRobot's `root`: it wins
    repo_id: str = ""  # "org/name" with path = "": LeRobot's local copy ($HF_LEROBOT_HOME), offline (config.lerobot_home)
    generate_demo: bool = False  # write the embedded demo dataset to `path` when it is missing
    camera_keys: list[str] = field(default_factory=list)  # [] -> every video feature
    state_key: str = "observation.state"
    action_key: str = "action"
    chunk_length: int = 32  # T actions <-> T+1 frames
    fps: float = 0.0  # 0 -> the dataset's fps; otherwise must equal it
    normalization: str = "minmax"
    state_normalization: str = ""  # "" -> same as `normalization`
    use_state: bool = True
    val_fraction: float = 0.1
    # which episodes validation holds out: "random" (val_fraction of all episodes, seeded) or "per_task" (val_fraction
    # of each task's episodes: every task of a multi-task dataset is validated, and a world model's judge imagines
    # from every task; a random 4% of MT10's 493 episodes once left pick-place out and drawn 5 of drawer-open's)
    val_split: str = "random"
    num_workers: int = 0
    # per loader process: keep every episode's decoded frames when the dataset's decoded video fits this
    # (decoded once instead of a keyframe seek per window; wamkit.data.episode_frames); 0 = never
    frame_cache_mb: float = 1024.0
    domain_name: str = "demo"
    domain_id: int = 0
    prompt_template: str = "{task}"
    # cameras -> one canvas (wamkit.data.canvas): side_by_side | concat_view (wrist on top, two exterior
    # views at half size below; wrist_camera names the wrist key among camera_keys)
    camera_layout: str = "side_by_side"
    wrist_camera: str = ""
    resolution: int = 0  # 0 native | 256 | 480 | 720: fit (never upscale) + pad to the tier's aspect bucket
    canvas_padding: str = "reflect"  # reflect (the released model's canvases) | zero: how the bucket is filled
    keep_ranges_path: str = ""  # "" -> no filter; JSON {trajectory_key: [[start, end], ...]} (wamkit.data.selection)
    trajectory_key_field: str = ""  # "" -> episode_index; else a meta/episodes column naming the trajectory
    include_failures: bool = False  # data.path holding success/ (+ failure/): also train on failure/
    shuffle: str = "windows"  # windows (permute all windows per epoch) | episodes (permute episodes, windows in order)
    # DROID-style action spaces; "" for datasets with one action column. The DROID state is joint
    # positions, so a state row is only meaningful with joint_pos actions (the seed's rule).
    action_space: str = ""  # "" | joint_pos | joint_velocity | cartesian_position | cartesian_velocity
    latent_cache: str = ""  # a directory from `wamkit data cache-latents`: train on its latents, skip video + VAE
    # train-time augmentation: each clip shifted by up to this many pixels (the same offset for all its
    # frames, edges repeated; wamkit.data.augment), for policies trained from scratch on few placements
    random_shift_px: int = 0

    def resolved_path(self) -> Path:
        """data.path when set (LeRobot's `root`), else the local copy of data.repo_id LeRobot downloaded."""
        if not self.path and self.repo_id:
            from wamkit.config.lerobot_home import resolve_repo_id

            return resolve_repo_id(self.repo_id)
        return Path(resolved(self, "path")).expanduser()


@dataclass
class ModeWeights:
    """Relative weights of the per-sample modes when model.mode = "mixed" (need not sum to 1)."""

    policy: float = 1.0
    forward_dynamics: float = 1.0
    inverse_dynamics: float = 0.0


@dataclass
class ModelConfig:
    """Which network and tokenizer to build."""

    preset: str = "tiny"  # tiny | nano | edge | super
    # policy: frame 0 + state row clean, future video + actions noisy | forward_dynamics: frame 0 + all
    # action rows clean, future video noisy | inverse_dynamics: all video clean, actions noisy |
    # mixed: one of the three per sample, drawn with `mode_weights`
    mode: str = "policy"
    mode_weights: ModeWeights = field(default_factory=ModeWeights)
    # pixel (parameter-free: area-pooled by pixel_spatial_factor) | pixel_unshuffle (parameter-free, lossless:
    # space-to-depth, every pixel kept in 3 * factor^2 channels) | wan2.2 (AutoencoderKLWan)
    tokenizer: str = "pixel"
    vae_path: str = ""  # diffusers AutoencoderKLWan directory, for tokenizer = "wan2.2"
    # torch.compile the Wan2.2 VAE encoder when training on a GPU: about 2x faster encodes (21.6 vs 44
    # ms per 33-frame 256x320 clip on an H200) for one compile at the first step (every chunk after the first
    # frame; the log's first-step line says how long). Runs from a latent cache (data.latent_cache) never
    # encode and do not compile it.
    compile_vae: bool = True
    pixel_spatial_factor: int = 16  # the pixel tokenizers' spatial downsampling
    text_tokenizer_path: str = ""  # "" -> the base checkpoint's own tokenizer, bytes without a base; "byte"; or a tokenizer directory
    max_text_tokens: int = 64
    max_action_dim: int = 36
    num_domains: int = 32
    train_text_pathway: bool = False
    # auto (flex for bf16 on CUDA, per_sample otherwise) | sdpa (dense masks) | flex (block masks) |
    # per_sample (fused SDPA sample by sample: no pack-wide masks, nothing compiled)
    attention: str = "auto"
    # Cosmos3's fps modulation of temporal positions: one second spans the same positions at any
    # recording rate (base_fps 24, so a latent frame at 80 fps is 0.3 positions after the previous
    # one). Off: positions are frame indices, 1 apart. For models trained from scratch; a pretrained
    # Cosmos3 was trained with it on.
    fps_modulation: bool = True
    # Start the video output projection (proj_out) at zero, as DiT zero-initialises its last layer; for
    # models trained from scratch. With diffusion.video_residual and video_prediction = "x0" the untrained
    # model then predicts "nothing moves", i.e. copy-last-frame, and training only has to add motion.
    zero_init_video_output: bool = False
    # none | fourier: vision tokens also carry their place in the frame (Fourier features of row and column
    # through a learned projection, zero at the start; wamkit.model.frame_positions): mRoPE alone moves
    # attention by relative offsets but never writes a token's place into what it carries. For models
    # trained from scratch; a base checkpoint has no such weights.
    frame_positions: str = "none"
    # none | conv: three 3x3 convolutions over each latent frame beside the linear patch embedding, added to the
    # patches through a projection that starts at zero (wamkit.model.vision_stem): local features before
    # attention, which a model trained from scratch on few demonstrations otherwise builds from patches. For models
    # trained from scratch; a base checkpoint has no such weights. resnet: one convolution and two residual blocks
    # (five convolutions, GroupNorm), a deeper reader of the frame. action_keypoints: the residual stem plus 32
    # spatial-softmax keypoints of each sample's latest observed frame added to its action rows (measured once,
    # benchmarks/RESULTS.md thirty-fifth session: 0.665 against 0.64 on MT10, inside the noise). action_eye: the
    # residual stem plus a ResNet-18 (GroupNorm, from scratch) over the pixels of each sample's latest observed frame,
    # added to its action rows: ACT's reader of the camera (needs model.tokenizer = "pixel_unshuffle").
    vision_stem: str = "none"


@dataclass
class DiffusionConfig:
    """Rectified-flow objective: x_s = s*eps + (1-s)*x0, target v = eps - x0."""

    video_loss_weight: float = 1.0
    action_loss_weight: float = 10.0  # the seeds' loss_scale for actions
    shift: float = 0.0  # 0 -> resolution-dependent: base_shift * sqrt(H*W / base_resolution^2)
    base_shift: float = 3.0
    base_resolution: int = 256
    logit_mean: float = 0.0
    logit_std: float = 1.0
    # 0: bidirectional attention among a sample's generation tokens. K > 0: block-causal teacher forcing
    # (chunk-autoregressive world model): latent frames 1.. form chunks of K frames; each step draws one
    # target chunk per sample, keeps every other chunk clean, and its tokens attend only to earlier
    # chunks and themselves (wamkit.model.packing.SequenceSample.causal_chunk_frames)
    causal_chunk_frames: int = 0
    # Generate future video latents as differences from the observed latent frame 0 (zero = copy the
    # last frame), so a world model only has to learn what moves. For models trained from scratch on
    # the pixel tokenizer; a pretrained Cosmos3 was trained on absolute latents (keep it off there).
    video_residual: bool = False
    # What the network's video output means: "velocity" (eps - x0, as Cosmos3 is pretrained) or "x0"
    # (the clean latents; trained with the velocity loss it implies, |x0_hat - x0|^2 / max(s, 0.05)^2).
    # x0 suits models trained from scratch in pixel space: the output is clean by construction, so
    # samples carry no leftover noise, and with video_residual an all-zero output is copy-last-frame
    # at every noise level.
    video_prediction: str = "velocity"
    # The same choice for the action head's output. "x0" with x0_loss_weighting = "uniform" trains the
    # head towards the conditional mean of the action chunk, which a 1-step sample returns: for
    # demonstrations with one right answer per observation (scripted experts), the chunk a regression
    # policy such as ACT predicts.
    action_prediction: str = "velocity"
    # How an x0 prediction's squared error is weighted per noise level s: "velocity" (1 / max(s, 0.05)^2,
    # the velocity loss it implies: low-noise samples, i.e. fine detail, dominate) or "uniform" (1: the
    # high-noise samples dominate, where the net must predict the conditional mean of the future from
    # the observed frame and the actions alone; that mean is what a 1-step sample returns and what PSNR
    # rewards). Read for every output predicted as x0 (video_prediction, action_prediction).
    x0_loss_weighting: str = "velocity"
    # The action head's error per value: "mse" (squared, the reference) or "l1" (absolute, as ACT trains). A
    # squared error's gradient fades with the error, so once the chunk is roughly right the video loss outweighs
    # the last centimetres of a reach; an absolute error keeps pulling at a constant rate, and its minimiser at
    # high noise is the conditional median (the majority move) rather than the mean (a blend of moves).
    action_loss: str = "mse"
    # The action chunk's noise level in training. "shared": the sample's one level for its video and its
    # actions (the reference). "independent": the chunk draws its own (the same logit-normal, shifted by
    # action_shift), so the head learns actions from pure noise beside partly denoised video, and actions
    # at low noise beside noisy video. With a shared level the actions are nearly pure noise only when the
    # future video is too (s > 0.9: ~1.4% of logit-normal draws at shift 1), and at lower levels the
    # half-clean future video hands the head its answer (inverse dynamics); sampling starts every chunk at
    # s = 1. Samplers still step video and actions together.
    action_sigma: str = "shared"
    action_shift: float = 0.0  # with action_sigma = "independent": 0 -> the video's shift
    # Future latent frames a policy sample carries beside its actions (each 4 video frames). 0: the whole chunk's
    # future, 1 + T/4 latent frames with the observed one (Cosmos3's policy sequence). K in 1..T/4: the first K
    # (frames 1..4K): fewer tokens a training step and a shorter sampler sequence (T = 16: 383 -> 255 tokens at
    # K = 2), the video objective then covering the chunk's first 4K frames. Policy mode only (a world model's
    # future frames are its output).
    future_video_latents: int = 0
    # Frames between the video frames a policy sample's future latents stack (each latent frame holds 4). 1: consecutive
    # frames. S > 1: every S-th, so fewer latent frames reach as far (T = 16, S = 4: one latent frame of frames 4, 8,
    # 12, 16: 191 tokens, the chunk's end still shown). With future_video_latents = 0: T / (4 S) of them. Policy mode,
    # models trained from scratch (a pretrained Cosmos3 reads frame times from fps, which a stride would mislabel).
    future_video_stride: int = 1
    # Weight of an auxiliary loss that makes the action rows say where the episode ends: a training-only head
    # (wamkit.model.goal_head) maps each sample's noisy action rows to the robot state at its episode's last frame, a
    # goal the recording itself gives (hindsight), with the action loss's error. 0: off. For goals that only the camera
    # shows (a marker on the table): the state a demonstration ends in is where that marker was.
    goal_state_loss_weight: float = 0.0
    # The goal head's target: 0, the state at the episode's last frame; H > 0, the state H frames after the window's
    # first (the episode's last when that lies beyond it): a nearer goal, which in a push's first phase lies at the puck.
    goal_state_horizon: int = 0


@dataclass
class OptimizerConfig:
    # adamw: torch's fused AdamW, fp32 moments (8 bytes per trainable parameter); adamw8bit: torchao's
    # AdamW8bit, block-wise 8-bit moments (~2 bytes), what lets a full fine-tune's state fit one GPU
    kind: str = "adamw"
    lr: float = 2e-4
    action_head_lr_multiplier: float = 5.0
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    eps: float = 1e-8
    grad_clip: float = 1.0


@dataclass
class SchedulerConfig:
    """Imaginaire-style lambda schedules: per cycle, a linear warm-up from f_start to f_max, then a
    linear (LambdaLinear) or cosine (LambdaCosine) decay to f_min at the cycle end."""

    kind: str = "LambdaLinear"
    warm_up_steps: list[int] = field(default_factory=lambda: [0])
    cycle_lengths: list[int] = field(default_factory=list)  # [] -> [trainer.max_iter]
    f_start: list[float] = field(default_factory=lambda: [1e-6])
    f_max: list[float] = field(default_factory=lambda: [1.0])
    f_min: list[float] = field(default_factory=lambda: [0.0])


@dataclass
class TrainerConfig:
    max_iter: int = 1000
    samples_per_step: int = 8  # per-rank micro-batch, packed into one sequence
    max_tokens_per_batch: int = 0  # > 0: token budget per packed sequence; sets samples_per_step from it
    grad_accum_iter: int = 1
    log_every: int = 10
    val_every: int = 0  # 0 -> no in-loop validation
    val_samples: int = 16
    progress_bar: bool = True
    # > 0: train for this many wall-clock seconds from launch instead of to max_iter (which stays the
    # ceiling): the step rate is timed after the first steps and the run's last step and learning-rate
    # schedule are fitted to the budget (wamkit.train.time_budget)
    time_budget_s: float = 0.0


@dataclass
class EMAConfig:
    enabled: bool = True
    beta: float = 0.999
    warmup: float = 10.0  # beta_t = min(beta, t / (t + warmup)): beta_0 = 0, a copy


@dataclass
class CheckpointConfig:
    save_iter: int = 500
    # extra steps to save at besides every save_iter (early checkpoints for a success-vs-step curve or a
    # world-model judge that needs policies of very different quality)
    save_steps: list[int] = field(default_factory=list)
    # extra saves at these fractions of the run's steps (in (0, 1]); with trainer.time_budget_s they follow
    # the fitted last step, so a time-boxed run still saves early, middle and late checkpoints (a fraction
    # that lands before the fit, in the first ~22 steps, is not saved)
    save_fractions: list[float] = field(default_factory=list)
    load_path: str = ""  # base weights for a fresh run: diffusers dir, reference safetensors, or wamkit iteration dir
    skip_action_heads: bool = False  # don't load action_proj_in/out + action_modality_embed from a foreign base
    keep_last: int = 0  # 0 -> keep all; never prunes the newest intact one, never counts damaged ones
    verify: str = "hash"  # hash | size: what every load checks against the manifest (sizes always; "size" also records no hashes)
    on_damage: str = "error"  # error | previous: a resume whose checkpoint is damaged stops, or resumes from the newest intact one
    resume_step: int = 0  # 0 -> resume from `latest`; N -> from iter_<N> (stepping back past a damaged checkpoint)


@dataclass
class ParallelConfig:
    """torch.distributed layout. World size comes from torchrun; shard degree = world / replicate."""

    data_parallel_replicate_degree: int = 1  # > 1: HSDP (replicate across nodes, shard inside)
    # > 1: k ranks split each packed sequence's tokens (all-gather K/V attention; wamkit.train.context_parallel).
    # Data parallel = world / k; parameters shard over dp_shard x cp. `wamkit train` only.
    context_parallel_degree: int = 1
    # none | selective (recompute the MLPs) | full (whole layers) | auto: the least recomputation whose
    # memory estimate fits the GPU (wamkit.train.memory.choose_checkpointing; the log and --dry-run say which)
    activation_checkpointing: str = "none"
    compile: bool = False  # torch.compile each decoder layer
    param_dtype: str = "float32"  # compute dtype at any world size (FSDP2 mixed precision, wamkit.train.parallel); trainable masters stay fp32, frozen weights are stored in it
    reduce_dtype: str = "float32"  # gradient reduction dtype
    reshard_after_forward: bool = True  # False: keep layers gathered until backward (less traffic, more memory)
    # True: frozen weights (the text pathway) are kept whole on every GPU in param_dtype instead of
    # sharded, so they are never all-gathered: about half the FSDP traffic of a Nano fine-tune, for
    # (frozen params x 2 bytes) per GPU. Pays off on few GPUs per node.
    replicate_frozen: bool = False
    prefetch_layers: int = 0  # > 0: explicitly prefetch this many decoder layers ahead (0: FSDP2's own)
    # How the transformer gets its values. "meta": built on the meta device, sharded, then each rank
    # fills only its shards on its device (random values keyed by parameter name; base weights read as
    # row slices): no host copy of a 15 B model. "eager": built whole where the run computes, then
    # sharded. "auto": meta on GPUs, eager on the CPU.
    init: str = "auto"


@dataclass
class LoRAConfig:
    """Low-rank adapters (peft) on the generation attention projections; everything else frozen
    except, with train_action_pathway, the action heads (action_proj_in/out, action_modality_embed)."""

    enabled: bool = False
    rank: int = 16
    alpha: float = 32.0
    target_modules: list[str] = field(default_factory=lambda: ["add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"])
    dropout: float = 0.0
    train_action_pathway: bool = True


WANDB_MODES = ("online", "offline", "disabled")


@dataclass
class LoggingConfig:
    """Experiment tracking beside metrics.jsonl and TensorBoard (which are always written). W&B
    ("online" | "offline" | "disabled") gets the same per-step metrics from rank 0, plus the resolved
    config and data contract once; relaunching the run name continues the same W&B run (its id is
    kept in <run>/wandb_run_id). Needs the `tracking` extra; credentials only from the environment
    (WANDB_API_KEY or `wandb login`); "offline" needs none (upload later with `wandb sync`)."""

    wandb: str = "disabled"
    project: str = "wamkit"
    group: str = ""  # "" -> no group
    run_name: str = ""  # "" -> job.name


@dataclass
class ExperimentConfig:
    job: JobConfig = field(default_factory=JobConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    ema: EMAConfig = field(default_factory=EMAConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def validate(self) -> "ExperimentConfig":
        """Reject knob combinations that would train on garbage; called after every load."""
        raw = self._resolve_env()
        check_url(self.job.output_root, "job.output_root")
        check_url(self.checkpoint.load_path, "checkpoint.load_path")
        _choice("model.mode", self.model.mode, TASK_MODES)
        _choice("logging.wandb", self.logging.wandb, WANDB_MODES)
        self._validate_modes_and_lora()
        _choice("model.tokenizer", self.model.tokenizer, TOKENIZER_KINDS)
        _choice("model.frame_positions", self.model.frame_positions, FRAME_POSITION_KINDS)
        _choice("model.vision_stem", self.model.vision_stem, VISION_STEM_KINDS)
        _choice("model.attention", self.model.attention, ATTENTION_BACKENDS)
        _choice("data.normalization", self.data.normalization, NORMALIZATION_MODES)
        _choice("data.val_split", self.data.val_split, ("random", "per_task"))
        _choice("data.camera_layout", self.data.camera_layout, ("side_by_side", "concat_view"))
        _choice("data.canvas_padding", self.data.canvas_padding, ("reflect", "zero"))
        _choice("data.shuffle", self.data.shuffle, ("windows", "episodes"))
        _choice("data.action_space", self.data.action_space, ACTION_SPACES)
        if self.data.use_state and self.data.action_space not in ("", "joint_pos"):
            raise ConfigError(
                "data.use_state", f"is true with data.action_space = {self.data.action_space!r}",
                "the state is joint positions: use action_space = 'joint_pos', or set use_state = false",
            )
        if self.data.resolution not in (0, 256, 480, 720):
            raise ConfigError("data.resolution", f"{self.data.resolution} is not one of [0, 256, 480, 720]", "use 0 (native), 256, 480 or 720")
        if self.data.state_normalization:
            _choice("data.state_normalization", self.data.state_normalization, NORMALIZATION_MODES)
        _choice("scheduler.kind", self.scheduler.kind, SCHEDULER_KINDS)
        _choice("optimizer.kind", self.optimizer.kind, OPTIMIZER_KINDS)
        _choice("parallel.activation_checkpointing", self.parallel.activation_checkpointing, ("none", "selective", "full", "auto"))
        _choice("parallel.param_dtype", self.parallel.param_dtype, ("float32", "bfloat16"))
        _choice("parallel.reduce_dtype", self.parallel.reduce_dtype, ("float32", "bfloat16"))
        _choice("parallel.init", self.parallel.init, ("auto", "meta", "eager"))
        if self.data.chunk_length <= 0 or self.data.chunk_length % 4:
            raise ConfigError(
                "data.chunk_length",
                f"{self.data.chunk_length} is not a positive multiple of 4",
                "the video tokenizer compresses time 4x: T+1 frames -> 1 + T/4 latent frames; use 16, 32, ...",
            )
        self._validate_future_video_latents()
        if not 0 <= self.data.domain_id < self.model.num_domains:
            raise ConfigError(
                "data.domain_id",
                f"{self.data.domain_id} is outside [0, {self.model.num_domains})",
                "pick a free domain row of the action heads",
            )
        if not 0 <= self.data.val_fraction < 1:
            raise ConfigError("data.val_fraction", f"{self.data.val_fraction} not in [0, 1)", "use e.g. 0.1")
        for name in ("max_iter", "samples_per_step", "grad_accum_iter", "log_every"):
            if getattr(self.trainer, name) <= 0:
                raise ConfigError(f"trainer.{name}", f"is {getattr(self.trainer, name)}; it must be positive",
                                  f"--set trainer.{name}={getattr(TrainerConfig(), name)}")
        from wamkit.config.schedule import check_schedule  # torch-free

        check_schedule(self.scheduler, self.trainer.max_iter)
        for name in ("video_prediction", "action_prediction"):
            if getattr(self.diffusion, name) not in PREDICTIONS:
                raise ConfigError(f"diffusion.{name}", f"unknown prediction {getattr(self.diffusion, name)!r}",
                                  f"use one of {list(PREDICTIONS)}")
        if self.model.frame_positions != "none" and self.checkpoint.load_path:
            raise ConfigError("model.frame_positions", f"= {self.model.frame_positions!r} adds weights that the base "
                              f"checkpoint.load_path = {self.checkpoint.load_path!r} does not have",
                              "--set model.frame_positions=none to fine-tune the base (it places tokens through its own mRoPE)")
        if self.model.vision_stem != "none" and self.checkpoint.load_path:
            raise ConfigError("model.vision_stem", f"= {self.model.vision_stem!r} adds weights that the base "
                              f"checkpoint.load_path = {self.checkpoint.load_path!r} does not have",
                              "--set model.vision_stem=none to fine-tune the base (its pretrained patch embedding sees already)")
        if self.model.vision_stem == "action_eye" and self.model.tokenizer != "pixel_unshuffle":
            raise ConfigError("model.vision_stem", f"= 'action_eye' reads the frame's pixels back out of the latents, "
                              f"which model.tokenizer = {self.model.tokenizer!r} does not keep",
                              "--set model.tokenizer=pixel_unshuffle (every pixel kept), or another model.vision_stem")
        if self.model.zero_init_video_output and self.checkpoint.load_path:
            raise ConfigError("model.zero_init_video_output", "is for models trained from scratch, but checkpoint.load_path "
                              f"= {self.checkpoint.load_path!r} loads weights over it",
                              "--set model.zero_init_video_output=false to fine-tune the base, or --set checkpoint.load_path='' to train from scratch")
        if self.diffusion.action_loss not in ACTION_LOSSES:
            raise ConfigError("diffusion.action_loss", f"unknown loss {self.diffusion.action_loss!r}",
                              f"use one of {', '.join(ACTION_LOSSES)}")
        if self.diffusion.x0_loss_weighting not in X0_LOSS_WEIGHTINGS:
            raise ConfigError("diffusion.x0_loss_weighting", f"unknown weighting {self.diffusion.x0_loss_weighting!r}",
                              f"use one of {list(X0_LOSS_WEIGHTINGS)}")
        if self.data.random_shift_px < 0:
            raise ConfigError("data.random_shift_px", f"{self.data.random_shift_px} is negative", "use 0 (no shift) or N >= 1 pixels")
        if self.data.random_shift_px and self.data.latent_cache:
            raise ConfigError("data.random_shift_px", f"is {self.data.random_shift_px} but data.latent_cache = "
                              f"{self.data.latent_cache!r} holds latents encoded without a shift",
                              "--set data.random_shift_px=0 to train on the cache, or --set data.latent_cache='' to shift the decoded video")
        _choice("diffusion.action_sigma", self.diffusion.action_sigma, ACTION_SIGMAS)
        if self.diffusion.action_shift < 0:
            raise ConfigError("diffusion.action_shift", f"{self.diffusion.action_shift} is negative",
                              "use 0 (the video's shift) or a positive shift (1.0 = none; larger = noisier)")
        if self.diffusion.goal_state_loss_weight < 0:
            raise ConfigError("diffusion.goal_state_loss_weight", f"{self.diffusion.goal_state_loss_weight} is negative",
                              "use 0 (off) or a positive weight")
        if self.diffusion.goal_state_horizon < 0:
            raise ConfigError("diffusion.goal_state_horizon", f"{self.diffusion.goal_state_horizon} is negative",
                              "use 0 (the episode's last frame) or H >= 1 frames ahead")
        if self.diffusion.goal_state_loss_weight > 0 and not self.data.use_state:
            raise ConfigError("diffusion.goal_state_loss_weight", f"is {self.diffusion.goal_state_loss_weight} but "
                              "data.use_state is false: its target is the episode's last state",
                              "--set data.use_state=true (with data.state_key) or --set diffusion.goal_state_loss_weight=0")
        if self.diffusion.causal_chunk_frames < 0:
            raise ConfigError("diffusion.causal_chunk_frames", f"{self.diffusion.causal_chunk_frames} is negative", "use 0 (bidirectional) or K >= 1 latent frames per chunk")
        if self.parallel.context_parallel_degree < 1:
            raise ConfigError("parallel.context_parallel_degree", f"{self.parallel.context_parallel_degree} is below 1",
                              "use 1 (no context parallelism) or the number of GPUs that split one sequence")
        if self.parallel.prefetch_layers < 0:
            raise ConfigError("parallel.prefetch_layers", f"{self.parallel.prefetch_layers} is negative", "use 0 (FSDP2's own prefetch) or N >= 1 layers")
        if self.checkpoint.save_iter <= 0:
            raise ConfigError("checkpoint.save_iter", "must be positive", "set it to max_iter to save once")
        if any(int(step) <= 0 for step in self.checkpoint.save_steps):
            raise ConfigError("checkpoint.save_steps", f"{self.checkpoint.save_steps} has a step below 1",
                              "list positive training steps, e.g. [50, 150]")
        if any(not 0 < float(f) <= 1 for f in self.checkpoint.save_fractions):
            raise ConfigError("checkpoint.save_fractions", f"{self.checkpoint.save_fractions} has a value outside (0, 1]",
                              "list fractions of the run's steps, e.g. [0.05, 0.25, 0.5]")
        if self.trainer.time_budget_s < 0:
            raise ConfigError("trainer.time_budget_s", f"is {self.trainer.time_budget_s}; it must be 0 (off) or positive",
                              "--set trainer.time_budget_s=600 trains for ten minutes from launch")
        _choice("checkpoint.verify", self.checkpoint.verify, ("hash", "size"))
        _choice("checkpoint.on_damage", self.checkpoint.on_damage, ("error", "previous"))
        for name in ("keep_last", "resume_step"):
            if getattr(self.checkpoint, name) < 0:
                raise ConfigError(f"checkpoint.{name}", f"is {getattr(self.checkpoint, name)}; it must be 0 or positive", f"--set checkpoint.{name}=0")
        if self.model.tokenizer == "wan2.2" and not self.model.vae_path:
            raise ConfigError(
                "model.vae_path", f"is empty{_from_env(raw, 'model.vae_path')} while model.tokenizer = 'wan2.2'",
                _empty_fix(raw, "model.vae_path") + "; or --set model.tokenizer=pixel for the parameter-free tokenizer (tiny models)",
            )
        if self.data.repo_id:
            check_repo_id(self.data.repo_id)
        elif not self.data.path:
            raise ConfigError("data.path", f"is empty{_from_env(raw, 'data.path')}", _empty_fix(raw, "data.path") +
                              "; or --set data.repo_id=<org>/<name> for a dataset LeRobot downloaded")
        return self

    def _resolve_env(self) -> dict[str, str]:
        """Expand the ${VAR} references of the path fields, once, at load: every layer then reads the
        values as they are, and the run records the paths it used (`checkpoint.load_path =
        "${BASE_CHECKPOINT_PATH}"` with BASE_CHECKPOINT_PATH= (empty) means random init). A reference to an
        unset variable stays as written with its error recorded: a dry run or a listing needs no
        environment, and `resolved(section, key)` raises the error where the path is needed. Returns
        {field: value as written} of the fields it expanded."""
        raw = {}
        sections: dict[str, list[str]] = {}
        for dotted in ENV_PATH_FIELDS:
            section, key = dotted.split(".")
            sections.setdefault(section, []).append(key)
        for section, keys in sections.items():
            raw.update(expand_fields(getattr(self, section), section, keys))
        return raw

    def _validate_future_video_latents(self) -> None:
        k, s, t = self.diffusion.future_video_latents, self.diffusion.future_video_stride, self.data.chunk_length
        if s < 1 or t % (4 * s):
            raise ConfigError("diffusion.future_video_stride", f"is {s}; data.chunk_length {t} must hold whole latent "
                              "frames of 4 frames at that stride", f"use a stride S >= 1 with {t} divisible by 4 S (1, 2, 4 for 16)")
        most = t // (4 * s)
        if not 0 <= k <= most:
            raise ConfigError("diffusion.future_video_latents", f"is {k}; data.chunk_length {t} has {most} future latent "
                              f"frames at diffusion.future_video_stride {s}", f"use 0 (all of them) up to {most}")
        cut = k > 0 or s > 1  # the samples carry fewer future frames than the chunk has
        if cut and self.model.mode != "policy":
            raise ConfigError("diffusion.future_video_latents", f"= {k}, future_video_stride = {s} with model.mode = "
                              f"{self.model.mode!r}", "a world model's future frames are its output: keep 0 and 1 outside "
                              "model.mode = 'policy'")
        if cut and self.data.latent_cache:
            raise ConfigError("diffusion.future_video_latents", f"= {k}, future_video_stride = {s} with data.latent_cache set",
                              "`wamkit data cache-latents` stores every latent frame of a window: train from the videos "
                              "(data.latent_cache = '') or keep 0 and 1")
        if s > 1 and self.checkpoint.load_path:
            raise ConfigError("diffusion.future_video_stride", f"is {s} with checkpoint.load_path = {self.checkpoint.load_path!r}",
                              "a pretrained Cosmos3 reads frame times from fps, which strided clips mislabel: keep 1 to fine-tune a base")

    def _validate_modes_and_lora(self) -> None:
        weights = self.model.mode_weights
        for name in SAMPLE_MODES:
            if getattr(weights, name) < 0:
                raise ConfigError(f"model.mode_weights.{name}", f"{getattr(weights, name)} is negative", "weights are >= 0")
        if self.model.mode == "mixed" and sum(getattr(weights, n) for n in SAMPLE_MODES) <= 0:
            raise ConfigError("model.mode_weights", "all weights are 0 while model.mode = 'mixed'", "give at least one mode a positive weight")
        lora = self.lora
        if not lora.enabled:
            return
        if lora.rank <= 0:
            raise ConfigError("lora.rank", f"{lora.rank} is not positive", "use e.g. 16")
        if not lora.target_modules:
            raise ConfigError("lora.target_modules", "is empty", "e.g. ['add_q_proj', 'add_k_proj', 'add_v_proj', 'to_add_out']")
        if not 0 <= lora.dropout < 1:
            raise ConfigError("lora.dropout", f"{lora.dropout} not in [0, 1)", "use 0.0")
        uses_forward_dynamics = self.model.mode == "forward_dynamics" or (
            self.model.mode == "mixed" and weights.forward_dynamics > 0
        )
        if uses_forward_dynamics and not lora.train_action_pathway:
            raise ConfigError(
                "lora.train_action_pathway",
                "is false while forward dynamics is trained: with the action pathway frozen, forward dynamics "
                "silently degenerates into first-frame video prediction (the frozen action heads give the "
                "clean action rows no usable conditioning)",
                "set lora.train_action_pathway = true, or train another mode",
            )


def _choice(field_name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(field_name, f"{value!r} is not one of {list(allowed)}", f"use one of {list(allowed)}")
