"""What a run holds per GPU, counted tensor by tensor, and the gate that uses it.

One estimator serves `--dry-run`, the trainer's check before it builds anything on the GPU, and
the report of an out-of-memory error that still happens. It follows wamkit.train.parallel's
layout: trainable parameters keep fp32 master shards, fp32 sharded gradients, AdamW's two fp32
moments and the fp32 EMA, all divided over the FSDP2 shard group; frozen parameters are stored once
in `parallel.param_dtype`, whole on one GPU and with `parallel.replicate_frozen`, sharded otherwise;
two layers are gathered in the compute dtype at a time (every layer from its forward to its backward with
`parallel.reshard_after_forward = false`), and a layer's unsharded gradients exist
while it is reduced; saved activations depend on the checkpointing mode and on whether the
generation pathway's weights train (a frozen linear layer keeps no input for a weight gradient);
what lies outside the decoder layers grows with tokens and width, the fp32 latents with the
tokenizer's values per sample; the Wan2.2 VAE sits on the GPU in the compute dtype. The AdamW step is fused (no temporaries the size
of the trainable state). Torch's allocator peak is what is estimated; the gate keeps a margin for
the CUDA context and fragmentation."""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import torch

from wamkit.errors import WamkitError

GIB = 2**30

# Saved activation bytes per token, layer and hidden unit, by checkpointing mode and by what trains,
# measured at Nano width on one H200 (benchmarks/RESULTS.md, "Memory, one H200"): full fine-tune
# without checkpointing 31.6 (70.0 GiB peak for 6632 packed tokens, less bf16 weights and gradients);
# LoRA without checkpointing 26.6 (g1_simple_1gpu, 75.2 GiB), LoRA with the MLPs recomputed 14.4
# (droid_1gpu, 86.2 GiB). Full checkpointing keeps each layer's input (4) and recomputes one layer at
# a time in the backward pass (so101_fd_chunk16 within 8% of it, online and from the latent cache).
# The full fine-tune's selective figure is not measured: the LoRA ratio (14.4 / 26.6) applied to 31.6.
# Those Nano peaks also held what lives outside the decoder layers (OUTSIDE_LAYER_BYTES below), spread
# over 36 layers; it is now counted on its own, so each measured figure is shown less its 36th share.
NANO_LAYERS = 36
# Bytes per token and hidden unit outside the decoder layers (the embeddings, the final norm and output
# projection, the backward's working set there), which no layer count scales; and bytes per latent value
# of a sample (the clean, noised and target latents and the prediction in fp32, their loss terms):
# fitted to five first-step peaks of medium-width runs on one H200 (benchmarks/RESULTS.md, seventeenth
# session), which the per-layer figures alone had missed by 14-43% -- most where a pixel tokenizer puts
# 3x8x8x4 latent values in each token (128 px at pixel factor 8: 21.8 GiB peak, 12.4 estimated).
OUTSIDE_LAYER_BYTES = 57.0
LATENT_VALUE_BYTES = 30.0
# A vision stem (wamkit.model.vision_stem) saves STEM_SAVED_TENSORS[kind] tensors of STEM_CHANNELS values per latent
# position for the backward pass, in the compute dtype (and "action_eye" its ResNet-18's activations of the clean
# frames too: wamkit.model.vision_stem.stem_saved_values): "conv" at MT10's shape (batch 256, 5 latent frames of
# 16x16) 0.23 GiB, the 0.2 GiB its peak rose by beside the plain recipe (twentieth session).
_OUTSIDE_SHARE = OUTSIDE_LAYER_BYTES / NANO_LAYERS
ACTIVATION_BYTES = {
    ("none", "full"): 31.6 - _OUTSIDE_SHARE, ("selective", "full"): 17.1 - _OUTSIDE_SHARE, ("full", "full"): 4.0,
    ("none", "lora"): 26.6 - _OUTSIDE_SHARE, ("selective", "lora"): 14.4 - _OUTSIDE_SHARE, ("full", "lora"): 4.0,
}
# Every figure above was measured with compiled decoder layers (the recipes they come from set
# parallel.compile), which fuse the norms, MLP gates and rotary embedding and so save fewer
# intermediates for the backward. An eager step saves this many times as much: 67.1 against 40.7
# bytes per token, layer and hidden unit, counted by saved-tensor hooks at medium width in bf16 on the
# CPU (benchmarks/activation_bytes.py); on one H200 the eager distillation stages 2 and 3 had peaked
# 18% and 24% over an estimate without it (benchmarks/RESULTS.md, issue 29). Whole-layer
# checkpointing's saved layer inputs are the same either way.
EAGER_ACTIVATION_FACTOR = 1.65
# Optimizer state per trainable parameter, by optimizer.kind: AdamW's two fp32 moments, or torchao's
# AdamW8bit's two uint8 moments with one fp32 scale per block of 256 values each.
OPTIMIZER_STATE_BYTES = {"adamw": 8.0, "adamw8bit": 2.0 + 2 * 4 / 256}
GATE_MARGIN = 0.08  # of the device's memory kept free for the CUDA context, NCCL buffers and fragmentation
# `parallel.activation_checkpointing = "auto"` takes the first of these that fits: the least recomputation.
CHECKPOINTING_BY_SPEED = ("none", "selective", "full")
ESTIMATE_ALLOWANCE = 0.10  # what "auto" leaves unplanned beyond the gate's margin: the estimate's own error
WORLD_SIZES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class ModelCounts:
    """Parameter counts of the model as the run trains it (LoRA applied), by placement unit."""

    total: int
    trainable: int
    layers: int
    hidden: int
    layer_trainable: int  # the largest decoder layer's
    layer_frozen: int
    lora: bool  # the generation pathway's weights are frozen (adapters train)

    @property
    def frozen(self) -> int:
        return self.total - self.trainable


def model_counts(model: torch.nn.Module, lora: bool) -> ModelCounts:
    layers = list(model.layers)

    def numel(params, trainable: bool) -> int:
        return sum(p.numel() for p in params if p.requires_grad == trainable)

    return ModelCounts(
        total=sum(p.numel() for p in model.parameters()), trainable=numel(model.parameters(), True),
        layers=len(layers), hidden=model.config.hidden_size,
        layer_trainable=max(numel(layer.parameters(), True) for layer in layers),
        layer_frozen=max(numel(layer.parameters(), False) for layer in layers), lora=lora)


@dataclass(frozen=True)
class Knobs:
    """The recipe knobs the estimate depends on; the gate's advice varies them."""

    world: int
    replicate: int
    param_bytes: int
    replicate_frozen: bool
    checkpointing: str
    ema: bool
    samples_per_step: int
    grad_accum: int
    optimizer_bytes: float = OPTIMIZER_STATE_BYTES["adamw"]  # per trainable parameter (optimizer.kind)
    compiled: bool = True  # parallel.compile: the activation coefficients' own setting (EAGER_ACTIVATION_FACTOR)
    latent_values_per_sample: int = 0  # token_counts' "latent_values": what the tokenizer and frame put in a sample
    stem_values_per_sample: int = 0  # what a vision stem saves per sample (wamkit.model.vision_stem.stem_saved_values)
    reshard_after_forward: bool = True  # parallel.reshard_after_forward: False keeps every layer gathered until its backward

    @classmethod
    def from_config(cls, cfg, world: int, sample: dict[str, int] | None = None) -> "Knobs":
        """`sample`: token_counts' dict of one training sample (its latent values and positions, and the positions of
        its clean frames); without it the latents and the stem count nothing."""
        from wamkit.model.vision_stem import stem_saved_values
        from wamkit.train.parallel import DTYPES

        sample = sample or {"latent_values": 0, "latent_positions": 0, "observed_positions": 0}
        p = cfg.parallel
        replicate = p.data_parallel_replicate_degree if world % max(p.data_parallel_replicate_degree, 1) == 0 else 1
        return cls(world, replicate, DTYPES[p.param_dtype].itemsize, bool(getattr(p, "replicate_frozen", False)),
                   p.activation_checkpointing, cfg.ema.enabled, cfg.trainer.samples_per_step, cfg.trainer.grad_accum_iter,
                   OPTIMIZER_STATE_BYTES[cfg.optimizer.kind], bool(p.compile), int(sample["latent_values"]),
                   round(stem_saved_values(cfg.model.vision_stem, int(sample["latent_positions"]),
                                           int(sample["observed_positions"]), cfg.model.pixel_spatial_factor)),
                   bool(p.reshard_after_forward))


def estimate(counts: ModelCounts, knobs: Knobs, tokens_per_sample: int, vae_params: int = 0) -> dict[str, float]:
    """Bytes per GPU by what holds them, and their total (see the module docstring)."""
    if knobs.checkpointing not in CHECKPOINTING_BY_SPEED:
        raise ValueError(f"activation checkpointing {knobs.checkpointing!r} has no estimate: resolve 'auto' first (resolve_checkpointing)")
    shard = max(knobs.world // knobs.replicate, 1)
    whole = knobs.world == 1 or knobs.replicate_frozen  # wamkit.train.parallel.frozen_left_whole
    t, b = counts.trainable, knobs.param_bytes
    tokens = tokens_per_sample * knobs.samples_per_step
    what = "lora" if counts.lora else "full"
    eager = 1.0 if knobs.compiled else EAGER_ACTIVATION_FACTOR
    per_layer = ACTIVATION_BYTES[(knobs.checkpointing, what)] * (1.0 if knobs.checkpointing == "full" else eager)
    activations = tokens * counts.layers * counts.hidden * per_layer
    if knobs.checkpointing == "full":  # the backward recomputes one layer with everything saved
        activations += tokens * counts.hidden * ACTIVATION_BYTES[("none", what)] * eager
    gathered_per_layer = counts.layer_trainable + (0 if whole else counts.layer_frozen)
    gathered_at_once = 2 if knobs.reshard_after_forward else counts.layers + 1  # + the backward's prefetch
    est = {
        "trainable weights (fp32)": 4 * t / shard,
        "frozen weights": b * counts.frozen / (1 if whole else shard),
        "gradients (fp32)": 4 * t / shard,
        "AdamW moments": knobs.optimizer_bytes * t / shard,
        "EMA": 4 * t / shard if knobs.ema else 0.0,
        "gathered layers": gathered_at_once * b * gathered_per_layer,
        "layer gradients": (b + 4) * counts.layer_trainable,
        "activations": activations,
        "outside layers": tokens * counts.hidden * OUTSIDE_LAYER_BYTES,
        "latents": knobs.samples_per_step * knobs.latent_values_per_sample * LATENT_VALUE_BYTES,
        "vision stem": knobs.samples_per_step * knobs.stem_values_per_sample * b,
        "VAE": b * vae_params,
    }
    est["total"] = sum(est.values())
    return est


def distill_estimate(counts: ModelCounts, knobs: Knobs, tokens_per_sample: int, vae_params: int, method: str,
                     chunks: int) -> dict[str, float]:
    """Bytes per GPU of a `wamkit distill` run: the student as `estimate` counts it, plus the whole models
    the DistillTrainer builds beside it, each sharded exactly like the student (fp32 masters of what the
    build trains, the rest in `parallel.param_dtype`): the EMA model and the frozen teacher (tf_dcm) or
    reference (sf_dmd); sf_dmd's critic also trains (gradients, AdamW moments; no EMA). The SF-DMD
    student turn backpropagates through one forward per chunk of its rollout (each chunk's exit step),
    so it keeps `chunks` times the activations of one forward; TF-dCM's student runs one."""
    est = estimate(counts, knobs, tokens_per_sample, vae_params)
    shard = max(knobs.world // knobs.replicate, 1)
    whole = knobs.world == 1 or knobs.replicate_frozen
    model = 4 * counts.trainable / shard + knobs.param_bytes * counts.frozen / (1 if whole else shard)
    est.pop("total")
    est["EMA model"] = model
    if method == "tf_dcm":
        est["frozen teacher"] = model
    else:
        est["frozen reference"] = model
        est["critic (weights, gradients, AdamW)"] = model + (4 + knobs.optimizer_bytes) * counts.trainable / shard
        est["activations"] *= max(int(chunks), 1)
    est["total"] = sum(est.values())
    return est


def choose_checkpointing(counts: ModelCounts, knobs: Knobs, tokens_per_sample: int, vae_params: int, usable: float) -> str:
    """What "auto" means: the least recomputation (none, then the MLPs, then whole layers) whose
    estimate fits `usable` bytes with ESTIMATE_ALLOWANCE to spare. Recomputation costs a third of a
    LoRA step's arithmetic (full), so a GPU with room should not pay it. Full when nothing fits: the
    gate then says what does."""
    for mode in CHECKPOINTING_BY_SPEED:
        if estimate(counts, replace(knobs, checkpointing=mode), tokens_per_sample, vae_params)["total"] <= usable * (1 - ESTIMATE_ALLOWANCE):
            return mode
    return "full"


def resolve_checkpointing(counts: ModelCounts, knobs: Knobs, tokens_per_sample: int, vae_params: int, usable: float) -> Knobs:
    """`knobs` with "auto" replaced by its choice for this GPU; other modes unchanged."""
    if knobs.checkpointing != "auto":
        return knobs
    return replace(knobs, checkpointing=choose_checkpointing(counts, knobs, tokens_per_sample, vae_params, usable))


def token_counts(cfg, model_config, canvas_hw: tuple[int, int], text_tokens: int) -> dict[str, int]:
    """Tokens one training sample occupies in a pack: its prompt, its latent video patches (frames x
    patches per frame), its action rows (plus the state row), and their total; and the latent values
    its video patches carry (channels x patch area each), which the estimate counts apart from tokens."""
    import math

    from wamkit.model.tokenizer import future_latent_frames, latent_channels_for

    factor = 16 if cfg.model.tokenizer == "wan2.2" else cfg.model.pixel_spatial_factor
    patch = model_config.latent_patch_size
    frames = 1 + future_latent_frames(cfg.data.chunk_length, cfg.diffusion.future_video_latents, cfg.diffusion.future_video_stride)
    per_frame = math.ceil(canvas_hw[0] / factor / patch) * math.ceil(canvas_hw[1] / factor / patch)
    actions = cfg.data.chunk_length + int(cfg.data.use_state)
    latent_positions = frames * per_frame * patch**2
    latent_values = latent_positions * latent_channels_for(cfg.model.tokenizer, cfg.model.pixel_spatial_factor)
    return {"text": text_tokens, "frames": frames, "per_frame": per_frame, "vision": frames * per_frame, "actions": actions,
            "total": text_tokens + frames * per_frame + actions, "latent_values": latent_values,
            "latent_positions": latent_positions, "observed_positions": clean_frames(cfg, frames) * per_frame * patch**2}


def clean_frames(cfg, frames: int) -> int:
    """A sample's clean latent frames at most (wamkit.diffusion.objective): all of them where inverse dynamics may be
    drawn (model.mode) or causal chunks keep every chunk but one clean, else the observed first frame."""
    inverse = cfg.model.mode == "inverse_dynamics" or (cfg.model.mode == "mixed" and cfg.model.mode_weights.inverse_dynamics > 0)
    return frames if inverse or cfg.diffusion.causal_chunk_frames > 0 else 1


def format_estimate(est: dict[str, float]) -> str:
    return "  ".join(f"{k} {v / GIB:.2f}" for k, v in est.items())


def reset_peak(device: torch.device) -> float:
    """The peak allocated so far (GiB: the build's and a resume's transients), then torch's peak
    counter reset, so that the next peak read is the steps' own, the one the estimate models."""
    peak = torch.cuda.max_memory_allocated(device) / GIB
    torch.cuda.reset_peak_memory_stats(device)
    return peak


def first_step_line(device: torch.device, estimate_bytes: float | None, setup_peak_gib: float,
                    where: str = "in the first step") -> str:
    """measured_line for the steps just run on `device`, against the gate's estimate in bytes."""
    return measured_line(torch.cuda.max_memory_allocated(device) / GIB, None if estimate_bytes is None else estimate_bytes / GIB,
                         setup_peak_gib, where)


def measured_line(step_peak_gib: float, estimate_gib: float | None, setup_peak_gib: float,
                  where: str = "in the first step") -> str:
    """What the trainer logs after its first step (a distillation: after its first student update, the
    first step that holds every optimizer's state): the steps' peak beside the estimate (its error on
    the run's own shape, signed: negative means the estimate was short) and the build's peak, which
    the estimate does not model (materialising or loading one tensor at a time stays below it)."""
    said = "" if estimate_gib is None else f" against the estimate's {estimate_gib:.1f} GiB ({(estimate_gib - step_peak_gib) / step_peak_gib:+.0%})"
    return f"memory: peak {step_peak_gib:.1f} GiB allocated {where}{said}; {setup_peak_gib:.1f} GiB while building and loading"


def vae_parameter_count(cfg) -> int:
    """Parameters of the run's Wan2.2 VAE (its config.json, else the published layout), built on the
    meta device; 0 for the pixel tokenizer."""
    if cfg.model.tokenizer != "wan2.2":
        return 0
    import json
    from pathlib import Path

    from diffusers import AutoencoderKLWan

    from wamkit.config.env import resolved
    from wamkit.errors import ConfigError
    from wamkit.model.tokenizer import WAN22_VAE_LAYOUT

    layout = dict(WAN22_VAE_LAYOUT)
    try:
        config = Path(resolved(cfg.model, "vae_path")) / "config.json"
        if config.is_file():
            layout = {k: v for k, v in json.loads(config.read_text()).items() if not k.startswith("_")}
    except ConfigError:
        pass  # an unset path: the dry run reports it; count the published layout
    with torch.device("meta"):
        vae = AutoencoderKLWan(**layout)
    return sum(p.numel() for p in vae.parameters())


@dataclass(frozen=True)
class Option:
    """One way to run: the --set overrides it takes, its knobs and its estimate."""

    sets: tuple[str, ...]
    knobs: Knobs
    total: float


def advice(counts: ModelCounts, lora_counts: ModelCounts | None, knobs: Knobs, tokens: int, vae: int,
           capacity: float) -> tuple[int | None, list[Option]]:
    """(the smallest GPU count that fits with the recipe's knobs, ways to fit on this GPU count).
    `lora_counts`: the counts with the recipe's LoRA adapters applied (None when it already uses LoRA
    or cannot). The ways are each single change, then cumulative ones until one fits."""
    total = lambda c, k: estimate(c, k, tokens, vae)["total"]  # noqa: E731
    smallest = next((w for w in WORLD_SIZES if total(counts, replace(knobs, world=w, replicate=1)) <= capacity), None)

    def smaller_micro_batch(k: Knobs, c: ModelCounts) -> tuple[str, Knobs] | None:
        """The largest halved micro-batch that fits (else 1), gradient accumulation keeping the batch."""
        batch = k.samples_per_step * k.grad_accum
        sizes = [m for m in (k.samples_per_step // 2**i for i in range(1, 12)) if m >= 1 and batch % m == 0]
        if not sizes:
            return None
        m = next((m for m in sizes if total(c, replace(k, samples_per_step=m, grad_accum=batch // m)) <= capacity), sizes[-1])
        return f"trainer.samples_per_step={m} --set trainer.grad_accum_iter={batch // m}", replace(k, samples_per_step=m, grad_accum=batch // m)

    def changes(k: Knobs, c: ModelCounts, c_lora):
        """(--set text, knobs, counts) of each way to need less, cheapest in quality first."""
        if not k.compiled:  # fewer saved intermediates, and a faster step
            yield "parallel.compile=true", replace(k, compiled=True), c
        if k.checkpointing != "full":
            yield 'parallel.activation_checkpointing="full"', replace(k, checkpointing="full"), c
        micro = smaller_micro_batch(k, c)
        if micro:
            yield (*micro, c)
        if k.optimizer_bytes > OPTIMIZER_STATE_BYTES["adamw8bit"]:
            yield 'optimizer.kind="adamw8bit"', replace(k, optimizer_bytes=OPTIMIZER_STATE_BYTES["adamw8bit"]), c
        if c_lora is not None and not c.lora:
            yield "lora.enabled=true", k, c_lora
        if k.ema:
            yield "ema.enabled=false", replace(k, ema=False), c

    options = [Option((sets,), k, total(c, k)) for sets, k, c in changes(knobs, counts, lora_counts)]
    taken, k, c = [], knobs, counts  # the same changes together, in that order, until the run fits
    while total(c, k) > capacity:
        step = next(changes(k, c, lora_counts), None)
        if step is None:
            break
        sets, k, c = step
        taken.append(sets)
        if len(taken) > 1:
            options.append(Option(tuple(taken), k, total(c, k)))
    return smallest, options


def run_token_counts(cfg, model_config, data, text_tokenizer) -> dict[str, int] | None:
    """token_counts of one training sample before any batch is read: the frame the transformer sees
    and a training task's prompt (wamkit.data.run_data.RunData); None where they are not known."""
    if data.frame_size is None or data.example_task is None:
        return None
    prompt = cfg.data.prompt_template.format(task=data.example_task)
    return token_counts(cfg, model_config, data.frame_size, len(text_tokenizer.encode(prompt)))


def distill_total(counts: ModelCounts, cfg, world: int, sample: dict[str, int], vae_params: int, method: str) -> dict[str, float]:
    """A distillation run's estimate on `world` GPUs (distill_estimate) for a sample of `sample`'s
    token_counts, with the chunks its student turn keeps from the run's clip and chunking: what
    `--dry-run` prints and `wamkit distill` gates on."""
    knobs = Knobs.from_config(cfg, world, sample)
    return distill_estimate(counts, knobs, sample["total"], vae_params, method, distill_chunks(cfg))


def distill_chunks(cfg) -> int:
    """Chunks of a clip whose activations the student turn keeps (1 when bidirectional)."""
    from wamkit.model.tokenizer import TEMPORAL_FACTOR

    frames = cfg.data.chunk_length // TEMPORAL_FACTOR
    return -(-frames // max(cfg.diffusion.causal_chunk_frames, 1))


def smallest_distill_world(counts: ModelCounts, cfg, sample: dict[str, int], vae_params: int, method: str, usable: float) -> int | None:
    return next((w for w in WORLD_SIZES if distill_total(counts, cfg, w, sample, vae_params, method)["total"] <= usable), None)


class GPUMemoryError(WamkitError):
    """A run does not fit the GPU's memory: the estimate, the GPU count that fits, the knobs that do."""


def fit_report(counts: ModelCounts, lora_counts: ModelCounts | None, knobs: Knobs, tokens: int, vae: int, capacity: float) -> str:
    """The lines of advice shared by the gate and the out-of-memory report."""
    smallest, options = advice(counts, lora_counts, knobs, tokens, vae, capacity)
    lines = [f"the smallest GPU count that fits these knobs: {smallest}" if smallest else
             f"no GPU count up to {WORLD_SIZES[-1]} fits these knobs"]
    lines.append(f"on {knobs.world} GPU{'s' if knobs.world > 1 else ''} (estimate per GPU against {capacity / GIB:.1f} GiB usable):")
    for option in options:
        verdict = "fits" if option.total <= capacity else "does not fit"
        lines.append(f"  --set {' --set '.join(option.sets)}: {option.total / GIB:.1f} GiB ({verdict})")
    return "\n".join(lines)


def usable_bytes(device: torch.device) -> tuple[float, float]:
    """(usable, total) bytes of a GPU for a run: what is free now plus what this process's caching
    allocator already holds (the VAE, and the blocks the encoder's background warm-up is using or
    has freed to the cache, wamkit.train.warmup), less the gate's margin of the total."""
    free, total = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - GATE_MARGIN * total, total


def lora_counts_for(model: torch.nn.Module, cfg) -> ModelCounts | None:
    """The counts the recipe's LoRA section would give (a meta copy; None when LoRA is already on)."""
    if cfg.lora.enabled:
        return None
    from wamkit.model.lora import apply_lora

    meta = copy.deepcopy(model).to("meta")
    apply_lora(meta, cfg.lora.rank, cfg.lora.alpha, cfg.lora.target_modules, cfg.lora.train_action_pathway, cfg.lora.dropout)
    return model_counts(meta, lora=True)
