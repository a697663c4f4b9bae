"""`wamkit train --dry-run`: the resolved config and the shapes it implies, without training.
Builds the model on the meta device, so even the Nano preset costs no memory."""

from __future__ import annotations

import math

from wamkit.config import format_config
from wamkit.model.cosmos3 import count_parameters
from wamkit.model.tokenizer import TEMPORAL_FACTOR
from wamkit.train.setup import build_model, build_tokenizers, open_dataset


def describe(cfg) -> str:
    lines = ["# resolved config", format_config(cfg)]
    video_tok, text_tok = build_tokenizers(cfg) if cfg.model.tokenizer == "pixel" else (None, None)
    channels = video_tok.latent_channels if video_tok else 48
    model = build_model(cfg, channels, meta=True)
    params = count_parameters(model)
    lines.append("# model")
    lines.append(f"preset = {cfg.model.preset}  layers = {model.config.num_hidden_layers}  hidden = {model.config.hidden_size}")
    lines.append(f"parameters: total {params['total']:,}  generation pathway {params['generation']:,}  trainable {params['trainable']:,}")
    lines.append("# tokens per sample")
    lines.extend(_token_lines(cfg, model, text_tok))
    t = cfg.trainer
    lines.append("# batch")
    lines.append(f"samples per step per rank = {t.samples_per_step} x grad_accum {t.grad_accum_iter} (x world size under torchrun)")
    return "\n".join(lines)


def _token_lines(cfg, model, text_tok) -> list[str]:
    root = cfg.data.resolved_path()
    if not (root / "meta" / "info.json").exists() and not cfg.data.generate_demo:
        return [f"dataset {root} not found: frame size unknown, token counts need the dataset"]
    dataset = open_dataset(cfg)
    cameras = cfg.data.camera_keys or dataset.camera_keys
    shapes = [dataset.features[k]["shape"] for k in cameras]
    height = max(s[0] for s in shapes)
    width = sum(s[1] for s in shapes)  # cameras side by side
    factor = 16 if cfg.model.tokenizer == "wan2.2" else cfg.model.pixel_spatial_factor
    patch = model.config.latent_patch_size
    t = 1 + cfg.data.chunk_length // TEMPORAL_FACTOR
    per_frame = math.ceil(height / factor / patch) * math.ceil(width / factor / patch)
    vision = t * per_frame
    actions = cfg.data.chunk_length + int(cfg.data.use_state)
    task = dataset.episode_task(dataset.episode_indices[0])
    text = len(text_tok.encode(cfg.data.prompt_template.format(task=task))) if text_tok else cfg.model.max_text_tokens
    return [
        f"dataset {root}: fps {dataset.fps}, {len(dataset.episode_indices)} episodes, cameras {cameras}, canvas {height}x{width}",
        f"text {text} (e.g. {task!r}) + video {vision} ({t} latent frames x {per_frame} patches) + action {actions} "
        f"({cfg.data.chunk_length} actions{' + 1 state row' if cfg.data.use_state else ''}) = {text + vision + actions}",
    ]
