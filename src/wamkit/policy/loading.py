"""Rebuild a trained model for inference from a run's DCP checkpoint or from an export directory."""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from wamkit.config import ExperimentConfig, config_from_dict
from wamkit.device import resolve_inference_dtype
from wamkit.errors import CheckpointError, ConfigError
from wamkit.model.cosmos3 import host_checked_domain_heads
from wamkit.model.goal_head import drop_goal_head
from wamkit.model.lora import apply_lora, merge_lora
from wamkit.model.text_tokenizer import text_tokenizer_from_export, text_tokenizer_info
from wamkit.model.tokenizer import build_video_tokenizer
from wamkit.storage import is_remote, location
from wamkit.train import checkpoint as ckpt
from wamkit.train import manifest as files
from wamkit.train.base_identity import BASE_KEY, base_identity, check_same_base, trainable_state

EXPORT_MANIFEST = "wamkit.json"
EXPORT_FORMAT = "wamkit-export"
EXPORT_VERSION = 1
CONTRACT_KEYS = ("fps", "chunk_length", "action_dim", "max_action_dim", "use_state", "domain_id", "prompt_template", "action_normalizer")


@dataclass
class LoadedModel:
    """Everything inference needs. `model_info` is what an export records to rebuild the rest."""

    model: torch.nn.Module
    video_tokenizer: object
    text_tokenizer: object
    contract: dict
    model_info: dict
    diffusion: dict
    source: dict = field(default_factory=dict)
    experiment_config: dict | None = None


def is_export(path) -> bool:
    """Whether `path` (a local path, or an s3:// / gs:// URL of a run or checkpoint) is an export
    directory. A URL string must not go through Path(), which would make "s3://b" a local "s3:/b";
    exports in a bucket are refused (their diffusers weights load from a local directory)."""
    where = location(path, "checkpoint path")
    if not (where / EXPORT_MANIFEST).is_file():
        return False
    if is_remote(where):
        raise ConfigError("checkpoint path", f"{where} is an export in an object store; exports load from a local directory",
                          f"copy it first (aws s3 cp --recursive {where} ./export, or gcloud storage cp -r), or pass the run")
    return True


def resolve_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """A run directory (uses checkpoints/latest), its checkpoints/ directory or one iter_<N>
    directory -> (iteration dir, run dir); in an object store (s3://, gs://) as UPaths."""
    path = location(path, "checkpoint path")
    if not path.exists():
        raise CheckpointError(str(path), "does not exist", "pass a run directory (runs/<name>) or a checkpoints/iter_<N> directory")
    if (path / ckpt.COMPLETE_MARKER).exists() or path.name.startswith("iter_"):
        ckpt.check_complete(path)
        return path, path.parent.parent
    checkpoints = path if path.name == "checkpoints" else path / "checkpoints"
    latest = ckpt.latest_checkpoint(checkpoints)
    if latest is None:
        raise CheckpointError(str(path), "has no complete checkpoint (no checkpoints/latest)", "train the run first, or pass an iter_<N> directory")
    return latest, checkpoints.parent


def model_info_from_config(cfg: ExperimentConfig, text_tokenizer) -> dict:
    """What an export records to rebuild the model's surroundings; the text tokenizer is the one the
    run resolved (wamkit.model.text_tokenizer), whose files the export carries."""
    vae = str(Path(cfg.model.vae_path).expanduser().resolve()) if cfg.model.vae_path else ""
    return {
        "preset": cfg.model.preset,
        "mode": cfg.model.mode,
        "tokenizer": cfg.model.tokenizer,
        "vae_path": vae,
        "pixel_spatial_factor": cfg.model.pixel_spatial_factor,
        **text_tokenizer_info(text_tokenizer),
        "max_text_tokens": cfg.model.max_text_tokens,
        "max_action_dim": cfg.model.max_action_dim,
        "num_domains": cfg.model.num_domains,
        "attention": cfg.model.attention,
    }


def _check_contract(contract: dict, where: str) -> None:
    missing = [k for k in CONTRACT_KEYS if k not in contract]
    if missing:
        raise CheckpointError(where, f"data contract lacks {missing}", "re-save the checkpoint with this wamkit version")
    if contract["use_state"] and not contract.get("state_normalizer"):
        raise CheckpointError(where, "data contract has use_state = true but no state_normalizer", "re-save the checkpoint with this wamkit version")


def _has_ema(iteration: Path) -> bool:
    keys = ckpt.checkpoint_reader(iteration).read_metadata().state_dict_metadata
    return any(k == "ema" or k.startswith("ema.") for k in keys)


def load_from_checkpoint(path: str | Path, use_ema: bool = True, device: str | torch.device = "cpu",
                         dtype: str | torch.dtype = "auto") -> LoadedModel:
    """`dtype`: what the model computes in (wamkit.device.resolve_inference_dtype; "auto": on a GPU the
    run's training compute dtype, on the CPU the checkpoint's float32)."""
    from wamkit.train.setup import build_model, build_tokenizers, check_vocab

    iteration, run_dir = resolve_checkpoint(path)
    config_file = run_dir / "resolved_config.json"
    if not config_file.is_file():
        raise CheckpointError(str(config_file), "is missing next to the checkpoint", "pass a checkpoint inside its run directory (runs/<name>/checkpoints/iter_<N>)")
    cfg = config_from_dict(json.loads(config_file.read_text()))
    ckpt.verify_checkpoint(iteration, cfg.checkpoint.verify)  # before its marker or .metadata is read
    marker = ckpt.read_marker(iteration)
    contract = marker.get("data_contract")
    if contract is None:
        raise CheckpointError(str(iteration / ckpt.COMPLETE_MARKER), "has no data_contract", "re-save the checkpoint with this wamkit version")
    _check_contract(contract, str(iteration / ckpt.COMPLETE_MARKER))
    video_tokenizer, text_tokenizer = build_tokenizers(cfg)
    saved_base = marker.get(BASE_KEY)
    if saved_base is not None:  # a LoRA run's checkpoint holds only what trained: its base first
        model = lora_model_on_base(cfg, video_tokenizer.latent_channels, saved_base, iteration)
    else:
        model = build_model(cfg, video_tokenizer.latent_channels, "cpu")
        if cfg.lora.enabled:  # an older LoRA checkpoint with every weight: load into the same structure
            apply_lora(model, cfg.lora.rank, cfg.lora.alpha, cfg.lora.target_modules, cfg.lora.train_action_pathway, cfg.lora.dropout)
    check_vocab(model, text_tokenizer)
    state: dict = {"model": trainable_state(model) if saved_base is not None else model.state_dict()}
    if use_ema:
        if not _has_ema(iteration):
            raise CheckpointError(str(iteration), "has no EMA weights (ema.enabled was false)", "load with use_ema=False")
        state["ema"] = {n: torch.empty_like(p, dtype=torch.float32) for n, p in model.named_parameters() if p.requires_grad}
    ckpt.load_checkpoint(iteration, state, verify=None)  # verified above
    if use_ema:
        with torch.no_grad():
            params = dict(model.named_parameters())
            for name, value in state["ema"].items():
                params[name].copy_(value.to(params[name].dtype))
    if cfg.lora.enabled:  # fold the adapters in: serving and export see a plain transformer
        merged = merge_lora(model)
        model = build_model(cfg, video_tokenizer.latent_channels, "cpu")
        model.load_state_dict(merged, strict=True)
    dtype = resolve_inference_dtype(dtype, device, cfg.parallel.param_dtype, torch.float32)
    model = place_for_inference(model, device, dtype)
    video_tokenizer.to(device, vae_dtype(device, dtype))
    return LoadedModel(
        model=model, video_tokenizer=video_tokenizer, text_tokenizer=text_tokenizer, contract=contract,
        model_info=model_info_from_config(cfg, text_tokenizer), diffusion=dataclasses.asdict(cfg.diffusion),
        source={"checkpoint": str(iteration.resolve()), "step": int(marker.get("step", -1)), "weights": "ema" if use_ema else "raw"},
        experiment_config=dataclasses.asdict(cfg),
    )


def reload_refusal(loaded: LoadedModel, path: str | Path) -> str | None:
    """Why `reload_weights` cannot load `path` into `loaded` in place (None: it can): only another
    checkpoint of the run that built it, full-weight (a LoRA run's weights were merged into copies), with
    the same data contract."""
    built_from = loaded.source.get("checkpoint")
    if "export" in loaded.source or built_from is None:  # an export's source names its run's checkpoint too
        return "the model was loaded from an export, not from a run's checkpoint"
    if (loaded.experiment_config or {}).get("lora", {}).get("enabled"):
        return "a LoRA run's adapters were merged into the weights at load time"
    iteration, run_dir = resolve_checkpoint(path)
    if Path(str(run_dir)).resolve() != Path(built_from).parent.parent.resolve():
        return f"{iteration} belongs to another run than {built_from}"
    if ckpt.read_marker(iteration).get("data_contract") != loaded.contract:
        return f"{iteration} records another data contract than {built_from}"
    persistent = _persistent_buffers(loaded.model)
    if persistent:  # only the trained parameters are copied in; what training changes in a buffer would be missed
        return f"the model keeps persistent buffers ({', '.join(sorted(persistent)[:3])}), which only a fresh load reads"
    return None


def _persistent_buffers(model: torch.nn.Module) -> set[str]:
    """Names of the buffers the model saves in its state_dict (BatchNorm's running statistics, say; none in today's models)."""
    saved = model.state_dict().keys()
    return {name for name, _ in model.named_buffers() if name in saved}


def reload_weights(loaded: LoadedModel, path: str | Path, use_ema: bool = True) -> LoadedModel:
    """Another checkpoint of the same run copied into `loaded.model` in place (the trained weights only:
    frozen ones never change within a run), so every tensor keeps its address and CUDA graphs captured
    for the model replay the new weights; a success-vs-step curve then captures its graphs once instead
    of once per checkpoint. The same values as `load_from_checkpoint` (each fp32 value cast once to the
    model's dtype). Raises CheckpointError naming why when `reload_refusal` has a reason."""
    reason = reload_refusal(loaded, path)
    if reason is not None:
        raise CheckpointError(str(path), f"cannot be loaded in place: {reason}", "load it afresh (wamkit.policy.load_policy)")
    iteration, _ = resolve_checkpoint(path)
    ckpt.verify_checkpoint(iteration, (loaded.experiment_config or {}).get("checkpoint", {}).get("verify", "hash"))
    if use_ema and not _has_ema(iteration):
        raise CheckpointError(str(iteration), "has no EMA weights (ema.enabled was false)", "load with use_ema=False")
    group = "ema" if use_ema else "model"
    params = dict(loaded.model.named_parameters())
    saved = ckpt.checkpoint_reader(iteration).read_metadata().state_dict_metadata
    values = {key[len(group) + 1:]: torch.empty(meta.size, dtype=meta.properties.dtype)  # the saved `group`.<parameter>
              for key, meta in saved.items() if key.startswith(group + ".") and key[len(group) + 1:] in params}
    ckpt.load_checkpoint(iteration, {group: values}, verify=None)  # verified above
    with torch.no_grad():
        for name, value in values.items():
            params[name].copy_(value)
    marker = ckpt.read_marker(iteration)
    source = {"checkpoint": str(iteration.resolve()), "step": int(marker.get("step", -1)), "weights": "ema" if use_ema else "raw"}
    return dataclasses.replace(loaded, source=source)


def load_model(path: str | Path, use_ema: bool = True, device: str | torch.device = "cpu",
               dtype: str | torch.dtype = "auto") -> LoadedModel:
    """An export directory (has wamkit.json), a run directory or a checkpoints/iter_<N> directory, as a policy or a
    world model loads it. A checkpoint holds the EMA and the raw weights; an export holds one set, so asking it for
    the raw ones is refused rather than answered with whatever it holds."""
    if not is_export(path):
        return load_from_checkpoint(path, use_ema=use_ema, device=device, dtype=dtype)
    if not use_ema:
        raise CheckpointError(str(path), "is an export, which holds one set of weights (the EMA unless exported with --raw)",
                              "evaluate the run's checkpoint for its raw weights, or export it with `wamkit export --raw`")
    return load_from_export(path, device=device, dtype=dtype)


def place_for_inference(model: torch.nn.Module, device: str | torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The whole model on `device` in `dtype`, frozen, in eval mode. diffusers asks for the timestep
    embedder in fp32 and warns at every `.to(dtype)`; training's FSDP2 mixed precision computes every
    module in the compute dtype, that one included, and inference follows training (nn.Module.to
    directly: the same cast without the warning). A training-only goal head is left behind."""
    return torch.nn.Module.to(drop_goal_head(model), device, dtype).eval().requires_grad_(False)


def vae_dtype(device: str | torch.device, dtype: torch.dtype) -> torch.dtype | None:
    """The VAE's weights beside a model computing in `dtype`: on GPUs the same reduced dtype, as
    training's build_tokenizers encodes in its compute dtype; else float32 (None: as built)."""
    return dtype if torch.device(device).type == "cuda" and dtype != torch.float32 else None


def lora_model_on_base(cfg, channels: int, saved_base: dict, iteration: Path) -> torch.nn.Module:
    """A LoRA run's model on the host with its frozen weights rebuilt as the run built them (the base
    it names, or its seed's keyed random values) and checked against the recorded checksum; the
    trainable tensors are then loaded from the checkpoint."""
    from wamkit.train.setup import build_model, materialize_run_model

    cfg = copy.deepcopy(cfg)
    cfg.checkpoint.load_path, cfg.job.seed = saved_base["load_path"], saved_base["seed"]
    if cfg.checkpoint.load_path and not Path(cfg.checkpoint.load_path).exists():
        raise CheckpointError(str(iteration), f"names its base weights {cfg.checkpoint.load_path}, which do not exist (a LoRA "
                              "checkpoint holds only the adapters and the trained action pathway)",
                              "put the base weights back at that path (or a link to them), then load again")
    model = build_model(cfg, channels, meta=True)
    apply_lora(model, cfg.lora.rank, cfg.lora.alpha, cfg.lora.target_modules, cfg.lora.train_action_pathway, cfg.lora.dropout)
    materialize_run_model(model, cfg, torch.device("cpu"), load_base=True)
    check_same_base(saved_base, base_identity(cfg, model), iteration)
    return model


def read_manifest(directory: str | Path) -> dict:
    directory = Path(directory).expanduser()
    manifest = directory / EXPORT_MANIFEST
    if not manifest.is_file():
        raise CheckpointError(str(manifest), "is missing", "pass a directory written by wamkit.export.export_run")
    data = json.loads(manifest.read_text())
    if data.get("format") != EXPORT_FORMAT or data.get("version") != EXPORT_VERSION:
        raise CheckpointError(str(manifest), f"format {data.get('format')!r} version {data.get('version')!r} is not {EXPORT_FORMAT!r} v{EXPORT_VERSION}", "re-export with this wamkit version")
    for key in ("data_contract", "model", "diffusion"):
        if key not in data:
            raise CheckpointError(str(manifest), f"has no {key!r} entry", "re-export with this wamkit version")
    _check_contract(data["data_contract"], str(manifest))
    return data


def load_transformer(transformer_dir: str | Path, use_from_pretrained: bool | None = None):
    """Cosmos3OmniTransformer from a save_pretrained directory, in the dtype its weights were written
    in (stored_dtype): a bf16 export serves in bf16, every module included, as training's bf16
    computes. (diffusers' from_pretrained alone upcasts to fp32: twice the memory, fp32 matmuls.)
    from_pretrained needs the `accelerate` package for this class; without it, build from
    config.json and load the safetensors strictly (same weights, same outputs)."""
    import importlib.util

    from diffusers import Cosmos3OmniTransformer
    from safetensors.torch import load_file

    from wamkit.model.variants import transformer_class_named

    transformer_dir = Path(transformer_dir)
    dtype = stored_dtype(transformer_dir)
    config = Cosmos3OmniTransformer.load_config(str(transformer_dir))
    transformer_class = transformer_class_named(config.get("_class_name"))  # ours when the run had frame positions or a stem
    if use_from_pretrained is None:
        use_from_pretrained = importlib.util.find_spec("accelerate") is not None
    if use_from_pretrained:
        model = transformer_class.from_pretrained(str(transformer_dir), torch_dtype=dtype)
        return host_checked_domain_heads(torch.nn.Module.to(model, dtype))  # its fp32 time embedder too (place_for_inference)
    model = transformer_class.from_config(config)
    files = sorted(transformer_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(str(transformer_dir), "no *.safetensors files found", "re-export the run")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(str(transformer_dir), f"weights do not match config.json: {exc}", "re-export the run") from exc
    return host_checked_domain_heads(torch.nn.Module.to(model, dtype))


SAFETENSORS_FLOATS = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def stored_dtype(transformer_dir: str | Path) -> torch.dtype:
    """The floating dtype of an export's weights, read from the safetensors headers (no tensor is
    loaded): the narrowest one present, float32 when all are."""
    from safetensors import safe_open

    found = set()
    for file in sorted(Path(transformer_dir).glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            found.update(f.get_slice(key).get_dtype() for key in f.keys())
    for name in ("BF16", "F16"):
        if name in found:
            return SAFETENSORS_FLOATS[name]
    return torch.float32


EXPORT_DAMAGE_FIX = "re-export the run (wamkit export RUN OUT_DIR), or restore the damaged files from a copy of the export"


def write_file_manifest(directory: Path) -> None:
    """Record every file of an export (sizes and hashes, wamkit.train.manifest); call after the last file."""
    files.write_manifest(directory, files.file_entries(directory, files.list_files(directory), hashes=True), hashes=True)


def verify_export(directory: Path) -> None:
    """Check an export's files against its file manifest (at the level its run's checkpoint.verify
    names, hashes by default); an export written before manifests loads with a one-line note."""
    damage = files.damage_of(directory, _export_verify_level(directory), collective=False)
    if damage is None:
        print(files.unverified_note(directory), flush=True)
    elif damage:
        raise CheckpointError(str(directory), files.damage_report(directory, damage), EXPORT_DAMAGE_FIX)


def _export_verify_level(directory: Path) -> str:
    try:
        level = json.loads((directory / EXPORT_MANIFEST).read_text())["experiment_config"]["checkpoint"]["verify"]
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return "hash"
    return level if level in files.VERIFY_LEVELS else "hash"


def load_from_export(directory: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype = "auto") -> LoadedModel:
    """`dtype`: what the model computes in (wamkit.device.resolve_inference_dtype; "auto": on a GPU the
    run's training compute dtype, on the CPU the dtype the export was written in)."""
    directory = Path(directory).expanduser()
    verify_export(directory)
    data = read_manifest(directory)
    info = data["model"]
    text_tokenizer = text_tokenizer_from_export(directory, info)
    transformer_dir = directory / "transformer"
    if not (transformer_dir / "config.json").is_file():
        raise CheckpointError(str(transformer_dir), "has no config.json", "re-export the run")
    model = load_transformer(transformer_dir)
    compute_dtype = ((data.get("experiment_config") or {}).get("parallel") or {}).get("param_dtype")
    dtype = resolve_inference_dtype(dtype, device, compute_dtype, next(model.parameters()).dtype)
    video_tokenizer = build_video_tokenizer(info["tokenizer"], info.get("vae_path", ""), int(info["pixel_spatial_factor"]),
                                            device=device, dtype=vae_dtype(device, dtype))
    if text_tokenizer.vocab_size > model.config.vocab_size:
        raise CheckpointError(str(directory), "text tokenizer is larger than the model's vocabulary", "re-export the run")
    model = place_for_inference(model, device, dtype)
    return LoadedModel(
        model=model, video_tokenizer=video_tokenizer, text_tokenizer=text_tokenizer, contract=data["data_contract"],
        model_info=info, diffusion=data["diffusion"], source={**data.get("source", {}), "export": str(directory.resolve())},
        experiment_config=data.get("experiment_config"),
    )
