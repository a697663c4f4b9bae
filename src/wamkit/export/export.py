"""export_run: a run's checkpoint -> a diffusers-format directory that serves without the run.

    <out_dir>/transformer/      Cosmos3OmniTransformer.save_pretrained (from_pretrained loads it)
    <out_dir>/text_tokenizer/   the run's resolved text tokenizer (none for the byte tokenizer)
    <out_dir>/wamkit.json       data contract + what is needed to rebuild tokenizers and sampling
    <out_dir>/wamkit_manifest.json  every file's size and hash, checked by every load (wamkit.train.manifest)

The directory is written under a temporary sibling, reloaded and checked against the in-memory
model on a fixed packed input, and only then renamed into place; an existing non-empty out_dir is
never touched."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from wamkit.device import INFERENCE_DTYPES
from wamkit.errors import WamkitError
from wamkit.model.text_tokenizer import save_text_tokenizer
from wamkit.model.attention import packed_layout
from wamkit.model.attention_backends import install_packed_attention
from wamkit.model.packing import SequenceSample, pack_samples
from wamkit.policy.loading import (EXPORT_FORMAT, EXPORT_MANIFEST, EXPORT_VERSION, load_from_checkpoint, load_from_export,
                                   write_file_manifest)


EXPORT_DTYPES = tuple(INFERENCE_DTYPES)  # what an export may be written in; float32 (the default) keeps the masters


class ExportError(WamkitError):
    """An export could not be written or did not reproduce the trained model."""


def export_run(run_or_checkpoint: str | Path, out_dir: str | Path, use_ema: bool = True,
               atol: float = 1e-5, rtol: float = 1e-4, device: str = "auto", dtype: str = "float32") -> Path:
    """Export a run directory (its latest checkpoint) or one iter_<N> directory to `out_dir`, its
    weights written in `dtype` (float32: the checkpoint's masters, lossless; bfloat16: half the
    size, what a GPU serves in anyway); the reloaded export must reproduce the same model's outputs
    on `device` (resolve_device)."""
    from wamkit.device import resolve_device

    out_dir = Path(out_dir).expanduser()
    _refuse_existing(out_dir)
    device = resolve_device(device)
    if dtype not in EXPORT_DTYPES:
        raise ExportError("--dtype", f"{dtype!r} is not an export dtype", f"use one of {', '.join(EXPORT_DTYPES)}")
    loaded = load_from_checkpoint(run_or_checkpoint, use_ema=use_ema, device=device, dtype=dtype)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".tmp_{out_dir.name}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        write_export(loaded, tmp)
        reloaded = load_from_export(tmp, device=device, dtype=dtype)
        verify_same_tokens(loaded.text_tokenizer, reloaded.text_tokenizer, loaded.contract["prompt_template"])
        verify_same_outputs(loaded.model, reloaded.model, loaded.contract, loaded.video_tokenizer.latent_channels,
                            loaded.text_tokenizer, atol=atol, rtol=rtol)
        _refuse_existing(out_dir)  # someone may have written there meanwhile
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked above)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def write_export(loaded, directory: Path) -> None:
    """The export's files, into an existing empty `directory`: the transformer in the dtype it is held
    in (a run's checkpoint loads in float32), the text tokenizer, wamkit.json."""
    loaded.model.save_pretrained(str(directory / "transformer"))
    save_text_tokenizer(loaded.text_tokenizer, directory)
    manifest = {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "data_contract": loaded.contract,
        "model": loaded.model_info,
        "diffusion": loaded.diffusion,
        "source": loaded.source,
        "experiment_config": loaded.experiment_config,
    }
    (directory / EXPORT_MANIFEST).write_text(json.dumps(manifest, indent=2))
    write_file_manifest(directory)  # sizes and hashes of every file, checked at every load (wamkit.train.manifest)


def _refuse_existing(out_dir: Path) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ExportError(str(out_dir), "already exists and is not empty", "choose a new output directory or delete this one")


TOKENIZER_PROBES = ("verify export", "pick up the red cube and place it in the bowl", "Öffne die Schublade, 2x schneller!")


def verify_same_tokens(expected, actual, prompt_template: str) -> None:
    """Raise ExportError unless the exported text tokenizer gives the training tokenizer's ids."""
    for probe in TOKENIZER_PROBES:
        text = prompt_template.format(task=probe)
        a, b = expected.encode(text), actual.encode(text)
        if a != b or expected.vocab_size != actual.vocab_size:
            raise ExportError("export", f"the exported text tokenizer encodes {text!r} as {b[:16]}..., training used {a[:16]}...",
                              "check the transformers version; the export must tokenize exactly as training did")


def fixed_packed_input(contract: dict, latent_channels: int, text_tokenizer, device="cpu",
                       dtype: torch.dtype = torch.float32) -> list[SequenceSample]:
    """Two deterministic samples shaped like the run's inputs (one with a state row if the run used
    state), at two noise levels: enough to exercise text, video and action pathways; their values are
    drawn in fp32 and given in the model's `dtype`, as the samplers give them."""
    gen = torch.Generator().manual_seed(1234)
    t = 1 + int(contract["chunk_length"]) // 4
    rows = int(contract["chunk_length"]) + (1 if contract["use_state"] else 0)
    clean = [0] if contract["use_state"] else []
    samples = []
    for sigma, prompt in ((0.35, "verify export"), (0.8, "a second, longer prompt for the export check")):
        samples.append(SequenceSample(
            text_ids=text_tokenizer.encode(contract["prompt_template"].format(task=prompt)),
            video=torch.randn(latent_channels, t, 2, 3, generator=gen).to(device, dtype),
            actions=torch.randn(rows, int(contract["max_action_dim"]), generator=gen).to(device, dtype),
            clean_video_frames=[0], clean_action_rows=clean, sigma=sigma, domain_id=int(contract["domain_id"]),
            fps=float(contract["fps"]), action_start_frame=0 if clean else 1,
        ))
    return samples


@torch.no_grad()
def verify_same_outputs(expected_model, actual_model, contract: dict, latent_channels: int, text_tokenizer,
                        atol: float = 1e-5, rtol: float = 1e-4) -> None:
    """Raise ExportError unless both transformers give the same packed outputs."""
    outputs = []
    for model in (expected_model, actual_model):
        param = next(model.parameters())
        batch = pack_samples(fixed_packed_input(contract, latent_channels, text_tokenizer, param.device, param.dtype), model.config)
        processor = install_packed_attention(model)
        with packed_layout(processor, batch):
            outputs.append(model(**batch.forward_kwargs))
    expected, actual = outputs
    pairs = [("sample", a, b) for a, b in zip(expected.sample, actual.sample)]
    pairs += [("action", a, b) for a, b in zip(expected.action or [], actual.action or [])]
    if len(expected.sample) != len(actual.sample) or (expected.action is None) != (actual.action is None):
        raise ExportError("export", "reloaded transformer returns a different output structure", "report this as a bug")
    for name, a, b in pairs:
        try:
            torch.testing.assert_close(b.float().cpu(), a.float().cpu(), atol=atol, rtol=rtol)
        except AssertionError as exc:
            raise ExportError("export", f"reloaded transformer's {name} output differs from the trained model: {exc}",
                              "check the diffusers version and that the checkpoint loaded fully") from exc
