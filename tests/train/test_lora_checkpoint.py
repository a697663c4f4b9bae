"""A LoRA run's checkpoints hold only what trains plus the identity of its base: its frozen weights are
rebuilt from the base on resume, the resumed run continues exactly, and a resume against another base
is refused naming both. Trained in bf16 compute, as on a GPU: frozen weights stored in bf16."""

import json
import shutil

import pytest
import torch

from tests.helpers import train_tiny_run
from wamkit.config import load_experiment
from wamkit.errors import CheckpointError
from wamkit.train import checkpoint as ckpt
from wamkit.train.setup import build_model
from wamkit.train.trainer import Trainer

LORA = ["lora.enabled=true", "lora.rank=4", 'model.mode="forward_dynamics"', 'parallel.param_dtype="bfloat16"']
BASE = ['model.text_tokenizer_path="byte"']  # the test base was itself trained on byte tokens


def _losses(run):
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def _saved_keys(iteration):
    return set(ckpt.checkpoint_reader(iteration).read_metadata().state_dict_metadata)


def test_lora_checkpoint_holds_only_what_trains_and_names_its_base(tmp_path):
    run = train_tiny_run(tmp_path, "lora", LORA)
    latest = ckpt.latest_checkpoint(run / "checkpoints")
    model_keys = {k.removeprefix("model.") for k in _saved_keys(latest) if k.startswith("model.")}
    assert model_keys and all("lora_" in k or "action_" in k for k in model_keys), sorted(model_keys)[:5]
    base = ckpt.read_marker(latest)["base"]
    assert base["load_path"] == "" and base["param_dtype"] == "bfloat16" and base["frozen_checksum"][0] > 1000
    full = train_tiny_run(tmp_path, "full", ['model.mode="forward_dynamics"', 'parallel.param_dtype="bfloat16"'])
    size = lambda it: sum(f.stat().st_size for f in it.iterdir())  # noqa: E731
    assert size(latest) < 0.5 * size(ckpt.latest_checkpoint(full / "checkpoints"))


def test_lora_run_stores_frozen_weights_once_in_bf16(tmp_path):
    trainer = Trainer(load_experiment("recipes/demo_tiny.toml", [
        f'job.output_root="{tmp_path}"', 'job.name="dtypes"', "trainer.progress_bar=false", *LORA]))
    frozen = [p for p in trainer.model.parameters() if not p.requires_grad]
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)  # never an fp32 copy of what does not train
    assert trainable and all(p.dtype == torch.float32 for p in trainable)  # fp32 masters


def _rewind(run, step: int) -> None:
    """A finished run as a job pre-empted after `step` leaves it: `latest` names that step's
    checkpoint, the later ones and their metrics are gone."""
    for later in (run / "checkpoints").glob("iter_*"):
        if ckpt.checkpoint_step(later) > step:
            shutil.rmtree(later)
    (run / "checkpoints" / "latest").write_text(ckpt.iteration_dir(run / "checkpoints", step).name + "\n")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("".join(f"{line}\n" for line in lines if json.loads(line)["step"] <= step))


def test_lora_resume_rebuilds_the_base_and_continues_exactly(tmp_path):
    run = train_tiny_run(tmp_path, "lora", [*LORA, "checkpoint.save_iter=2"])
    straight = _losses(run)
    _rewind(run, 2)
    resumed = _losses(train_tiny_run(tmp_path, "lora", [*LORA, "checkpoint.save_iter=2"]))
    assert len(straight) == 4 and resumed == straight  # bit for bit


def _save_base(path, seed: int) -> None:
    """A diffusers-format base of the demo recipe's shape (random weights of `seed`)."""
    torch.manual_seed(seed)
    build_model(load_experiment("recipes/demo_tiny.toml"), tokenizer_channels=12).save_pretrained(path)


def test_lora_resume_against_a_changed_base_is_refused_naming_it(tmp_path):
    base = tmp_path / "base"
    _save_base(base, seed=1)
    run = train_tiny_run(tmp_path, "lora", [*LORA, *BASE, f'checkpoint.load_path="{base}"', "checkpoint.save_iter=2"])
    assert ckpt.read_marker(ckpt.latest_checkpoint(run / "checkpoints"))["base"]["load_path"] == str(base)
    _rewind(run, 2)
    shutil.rmtree(base)
    _save_base(base, seed=2)  # other weights at the same path
    with pytest.raises(CheckpointError, match=rf"iter_000000002: was trained on frozen weights .* {base} gives .* the base changed"):
        train_tiny_run(tmp_path, "lora", [*LORA, *BASE, f'checkpoint.load_path="{base}"', "checkpoint.save_iter=2"])
