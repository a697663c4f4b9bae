"""`wamkit train --dry-run`: the resolved config and the shapes it implies, without training.
Builds the model on the meta device, so even the Nano preset costs no memory."""

from __future__ import annotations


from wamkit.config import format_config
from wamkit.data.canvas import CanvasTransform, effective_padding
from wamkit.bimanual.bundle import is_bundle, open_bundle
from wamkit.data.multi import is_multi_root
from wamkit.errors import ConfigError
from wamkit.model.cosmos3 import count_parameters
from wamkit.train.disk import estimated_checkpoint_bytes, extra_save_steps, format_bytes, number_of_saves, required_bytes
from wamkit.train.memory import token_counts
from wamkit.model.tokenizer import PIXEL_TOKENIZERS, latent_channels_for
from wamkit.train.datasets import open_dataset
from wamkit.train.setup import build_model, build_tokenizers


NOMINAL_VIEW = (720, 1280)  # camera size assumed by a dry run without the dataset (then fitted to the tier)


def describe(cfg, dcfg=None) -> str:
    """`dcfg`: a distillation recipe's [distill] section, whose extra models the memory lines count."""
    lines = ["# resolved config", format_config(cfg)]
    _, text_tok = build_tokenizers(cfg) if cfg.model.tokenizer in PIXEL_TOKENIZERS else (None, None)
    channels = latent_channels_for(cfg.model.tokenizer, cfg.model.pixel_spatial_factor)
    model = build_model(cfg, channels, meta=True)
    if cfg.lora.enabled:  # adapters change what trains (and so optimizer and EMA memory)
        from wamkit.model.lora import apply_lora

        apply_lora(model, cfg.lora.rank, cfg.lora.alpha, cfg.lora.target_modules, cfg.lora.train_action_pathway, cfg.lora.dropout)
    params = count_parameters(model)
    lines.append("# model")
    lines.append(f"preset = {cfg.model.preset}  layers = {model.config.num_hidden_layers}  hidden = {model.config.hidden_size}")
    lines.append(f"parameters: total {params['total']:,}  generation pathway {params['generation']:,}  trainable {params['trainable']:,}")
    lines.append("# tokens per sample")
    token_lines, sample = _token_lines(cfg, model, text_tok)
    lines.extend(token_lines)
    t = cfg.trainer
    lines.append("# batch")
    lines.append(f"samples per step per rank = {t.samples_per_step} x grad_accum {t.grad_accum_iter} (x world size under torchrun)")
    lines.append("global batch = " + ", ".join(f"{w} GPU{'s' if w > 1 else ''}: {t.samples_per_step * t.grad_accum_iter * w}" for w in (1, 8, 64)))
    lines.extend(memory_lines(cfg, model, sample, dcfg))
    lines.extend(checkpoint_lines(params, cfg))
    return "\n".join(lines)


def checkpoint_lines(params: dict, cfg) -> list[str]:
    """Disk per save and what checkpoint.keep_last holds on to, so a run is sized against its disk
    before it starts (each save also checks the free space itself: wamkit.train.disk)."""
    from wamkit.train.base_identity import saves_trainable_only
    from wamkit.train.parallel import DTYPES

    frozen_bytes = 0 if saves_trainable_only(cfg) else DTYPES[cfg.parallel.param_dtype].itemsize
    size = estimated_checkpoint_bytes(params["total"], params["trainable"], cfg.ema.enabled, frozen_bytes)
    saves = number_of_saves(cfg.trainer.max_iter, cfg.checkpoint.save_iter,
                            extra_save_steps(cfg.trainer.max_iter, cfg.checkpoint.save_steps, cfg.checkpoint.save_fractions))
    keep = cfg.checkpoint.keep_last
    frozen = params["total"] - params["trainable"]
    weights = (f"trainable weights fp32 {format_bytes(4 * params['trainable'])} + "
               + ("no frozen weights (LoRA: the base is referenced, not copied)" if not frozen_bytes else
                  f"frozen weights {cfg.parallel.param_dtype} {format_bytes(frozen_bytes * frozen)}"))
    lines = ["# checkpoints (disk, whole checkpoint on the shared run directory, all ranks together)",
             f"per save: {format_bytes(size)} ({weights} + AdamW {format_bytes(8 * params['trainable'])}"
             + (f" + EMA {format_bytes(4 * params['trainable'])}" if cfg.ema.enabled else "")
             + f"); a save needs {format_bytes(required_bytes(size))} free"]
    if keep > 0 and keep < saves:
        lines.append(f"keep_last = {keep}: {keep} x {format_bytes(size)} = {format_bytes(keep * size)} kept, "
                     f"{format_bytes((keep + 1) * size)} while a save is written (older ones are removed after it)")
    else:
        why = "keep_last = 0 keeps every checkpoint" if keep <= 0 else f"keep_last = {keep} >= the run's {saves} saves"
        lines.append(f"{why}: {saves} saves x {format_bytes(size)} = {format_bytes(saves * size)} by "
                     f"max_iter = {cfg.trainer.max_iter} (save_iter = {cfg.checkpoint.save_iter})")
    return lines


def memory_lines(cfg, model, sample: dict[str, int], dcfg=None) -> list[str]:
    """The per-GPU estimate (wamkit.train.memory, the trainer's own gate) at 1, 2 and 8 GPUs for a sample
    of `sample`'s token_counts, judged against this machine's GPU or, without one, an H200; with the ways
    to fit when one GPU does not. A distillation run (`dcfg`) is counted with every model it holds
    (memory.distill_estimate)."""
    import torch

    from wamkit.train import memory

    tokens_per_sample = sample["total"]

    counts = memory.model_counts(model, cfg.lora.enabled)
    vae = memory.vae_parameter_count(cfg)
    if torch.cuda.is_available():
        usable, total = memory.usable_bytes(torch.device("cuda"))
        against = f"this machine's {torch.cuda.get_device_name()} ({total / memory.GIB:.1f} GiB, {usable / memory.GIB:.1f} usable)"
    else:
        total = H200_BYTES
        usable = total * (1 - memory.GATE_MARGIN)
        against = f"an H200 ({total / memory.GIB:.1f} GiB, {usable / memory.GIB:.1f} usable; no GPU here)"
    lines = [f"# memory per GPU (estimate, GiB: what torch allocates at the peak; the trainer refuses a run that does not fit) against {against}"]
    if dcfg is not None:
        return lines + distill_memory_lines(cfg, model, sample, dcfg, vae, usable)
    plans = {}  # world size -> (knobs with "auto" resolved, estimate)
    for world in (1, 2, 8):
        knobs = memory.Knobs.from_config(cfg, world, sample)
        knobs = memory.resolve_checkpointing(counts, knobs, tokens_per_sample, vae, usable)
        est = memory.estimate(counts, knobs, tokens_per_sample, vae)
        plans[world] = knobs, est
        verdict = "fits" if est["total"] <= usable else "DOES NOT FIT"
        auto = f" (activation checkpointing auto -> {knobs.checkpointing})" if cfg.parallel.activation_checkpointing == "auto" else ""
        lines.append(f"{world} GPU{'s' if world > 1 else ''}{auto}: {memory.format_estimate(est)}  -> {verdict}")
    one, one_est = plans[1]
    if one_est["total"] > usable:
        lines.append(memory.fit_report(counts, memory.lora_counts_for(model, cfg), one, tokens_per_sample, vae, usable))
    return lines


def distill_memory_lines(cfg, model, sample: dict[str, int], dcfg, vae: int, usable: float) -> list[str]:
    """The distillation estimate at 1, 2 and 8 GPUs and the smallest GPU count it fits (the single-model
    advice does not apply: a distillation holds several whole models and takes no LoRA)."""
    from wamkit.train import memory

    if cfg.parallel.activation_checkpointing == "auto":
        return ["distillation: parallel.activation_checkpointing = 'auto' is resolved by `wamkit train` only; "
                "`wamkit distill` refuses it (set 'none' or 'selective')"]
    chunks = memory.distill_chunks(cfg)
    counts = memory.model_counts(model, cfg.lora.enabled)
    lines = [f"distillation ({dcfg.method}): the student, its EMA model and the "
             + ("frozen teacher" if dcfg.method == "tf_dcm" else f"frozen reference and the critic; the student turn keeps {chunks} chunks' activations")]
    for world in (1, 2, 8):
        est = memory.distill_total(counts, cfg, world, sample, vae, dcfg.method)
        lines.append(f"{world} GPU{'s' if world > 1 else ''}: {memory.format_estimate(est)}  -> {'fits' if est['total'] <= usable else 'DOES NOT FIT'}")
    smallest = memory.smallest_distill_world(counts, cfg, sample, vae, dcfg.method, usable)
    lines.append(f"the smallest GPU count that fits: {smallest}" if smallest else
                 f"no GPU count up to {memory.WORLD_SIZES[-1]} fits (fewer samples per step or a shorter clip would)")
    return lines


H200_BYTES = 143_771 * 2**20  # an H200's memory as nvidia-smi and torch report it (140.4 GiB)


def _token_lines(cfg, model, text_tok) -> tuple[list[str], dict[str, int]]:
    """Printable lines and a sample's memory.token_counts (zero totals when the frame size is unknown)."""
    try:
        root = cfg.data.resolved_path()
        at_hand = (root / "meta" / "info.json").exists() or is_multi_root(root) or cfg.data.generate_demo
    except ConfigError as exc:
        root, at_hand = f"{cfg.data.path} ({exc.problem})", False
    if at_hand is False and not isinstance(root, str) and is_bundle(root):
        bundle = open_bundle(root)
        cameras, views = ["bundle"], [tuple(bundle.manifest["frame_size"])]
        source = f"bundle {root}: {len(bundle.samples)} samples"
        task = bundle.samples[0].get("caption", "") if bundle.samples else ""
    elif at_hand:
        dataset = open_dataset(cfg)
        cameras = cfg.data.camera_keys or dataset.camera_keys
        views = [tuple(dataset.features[k]["shape"][:2]) for k in cameras]
        source = f"dataset {root}: fps {dataset.fps}, {len(dataset.episode_indices)} episodes, cameras {cameras}"
        task = dataset.episode_task(dataset.episode_indices[0])
    elif cfg.data.resolution:
        cameras = cfg.data.camera_keys or ["camera"]
        views = [NOMINAL_VIEW] * len(cameras)
        source = f"dataset {root} not at hand: assuming {len(cameras)} camera(s) of {NOMINAL_VIEW[0]}x{NOMINAL_VIEW[1]} (16:9)"
        task = "a typical task description of a few words"
    else:
        return [f"dataset {root} not found and data.resolution = 0 (native): frame size unknown"], {"total": 0, "latent_values": 0, "latent_positions": 0}
    canvas = CanvasTransform.from_config(cfg.data, cameras)
    height, width = canvas.size(views)
    content = canvas.content_size(views)
    fill = effective_padding(content, (height, width), canvas.padding)
    padded = f" ({content[0]}x{content[1]} {fill}-padded)" if fill != "none" else ""
    text = len(text_tok.encode(cfg.data.prompt_template.format(task=task))) if text_tok else cfg.model.max_text_tokens
    n = token_counts(cfg, model.config, (height, width), text)
    return [
        f"{source}; canvas {height}x{width}{padded}",
        f"text {text} (e.g. {task!r}) + video {n['vision']} ({n['frames']} latent frames x {n['per_frame']} patches) + action "
        f"{n['actions']} ({cfg.data.chunk_length} actions{' + 1 state row' if cfg.data.use_state else ''}) = {n['total']}",
    ], n
