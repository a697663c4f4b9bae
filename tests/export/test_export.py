"""export_run: diffusers-format directory that reloads to the same model and the same actions."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import DEMO_RECIPE, train_tiny_run
from wamkit.config import load_experiment
from wamkit.export import ExportError, export_run, verify_same_outputs
from wamkit.policy import Policy, load_from_checkpoint
from wamkit.policy.loading import load_transformer



@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("export"))


@pytest.fixture(scope="module")
def exported(run_dir, tmp_path_factory):
    return export_run(run_dir, tmp_path_factory.mktemp("out") / "policy_export")


def _obs(seed):
    rng = np.random.default_rng(seed)
    return {"image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), "state": rng.uniform(0.2, 0.8, 4), "prompt": "reach"}


def test_export_layout_and_manifest(exported, run_dir):
    assert sorted(p.name for p in exported.iterdir()) == ["transformer", "wamkit.json", "wamkit_manifest.json"]
    assert (exported / "transformer" / "config.json").is_file()
    assert list((exported / "transformer").glob("*.safetensors"))
    manifest = json.loads((exported / "wamkit.json").read_text())
    contract = json.loads((run_dir / "data_contract.json").read_text())
    assert manifest["data_contract"] == contract
    assert manifest["model"]["tokenizer"] == "pixel" and manifest["model"]["pixel_spatial_factor"] == 8
    assert manifest["model"]["max_text_tokens"] == load_experiment(DEMO_RECIPE).model.max_text_tokens
    assert manifest["model"]["preset"] == "tiny"
    assert manifest["source"]["weights"] == "ema" and manifest["source"]["step"] == 4
    assert not [p for p in exported.parent.iterdir() if p.name.startswith(".tmp_")]


def test_from_pretrained_loads_the_export_with_equal_outputs(exported, run_dir):
    from diffusers import Cosmos3OmniTransformer

    reloaded = Cosmos3OmniTransformer.from_pretrained(str(exported / "transformer"))
    original = load_from_checkpoint(run_dir, use_ema=True)
    verify_same_outputs(original.model, reloaded, original.contract, 12, original.text_tokenizer, atol=0, rtol=0)


def test_fallback_loader_gives_equal_outputs_and_verification_has_teeth(exported, run_dir):
    reloaded = load_transformer(exported / "transformer", use_from_pretrained=False)
    original = load_from_checkpoint(run_dir, use_ema=True)
    verify_same_outputs(original.model, reloaded, original.contract, 12, original.text_tokenizer, atol=0, rtol=0)
    with torch.no_grad():
        reloaded.action_proj_out.fc.weight[original.contract["domain_id"]].add_(0.01)
    with pytest.raises(ExportError, match="action"):
        verify_same_outputs(original.model, reloaded, original.contract, 12, original.text_tokenizer)


def test_policy_from_checkpoint_and_from_export_agree(exported, run_dir):
    a = Policy.from_checkpoint(run_dir, num_steps=4).predict([_obs(0), _obs(1)], seed=7)
    b = Policy.from_export(exported, num_steps=4).predict([_obs(0), _obs(1)], seed=7)
    for x, y in zip(a, b):
        assert x.shape == (8, 3)
        np.testing.assert_array_equal(x, y)


def test_raw_weight_export_differs_from_ema(exported, run_dir, tmp_path):
    raw = export_run(run_dir / "checkpoints" / "iter_000000004", tmp_path / "raw", use_ema=False)
    assert json.loads((raw / "wamkit.json").read_text())["source"]["weights"] == "raw"
    a = Policy.from_export(raw, num_steps=4).predict([_obs(0)], seed=1)[0]
    b = Policy.from_export(exported, num_steps=4).predict([_obs(0)], seed=1)[0]
    assert not np.allclose(a, b)


def test_non_empty_out_dir_is_refused_and_left_alone(run_dir, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="not empty"):
        export_run(run_dir, out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (export_run(run_dir, empty) / "wamkit.json").is_file()


def test_export_of_a_broken_path_is_a_clear_error(tmp_path):
    from wamkit.errors import CheckpointError

    with pytest.raises(CheckpointError, match="does not exist"):
        export_run(tmp_path / "missing_run", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(CheckpointError, match="wamkit.json"):
        Policy.from_export(tmp_path)


def test_lora_forward_dynamics_run_exports_merged_weights(tmp_path):
    """The export of a LoRA run is a plain transformer whose outputs equal the adapted model's."""
    from wamkit.config import config_from_dict
    from wamkit.model.tokenizer import ByteTokenizer
    from wamkit.policy.loading import lora_model_on_base
    from wamkit.train import checkpoint as ckpt
    from wamkit.train.base_identity import trainable_state

    run = train_tiny_run(tmp_path, "lora_fd", ["model.mode=\"forward_dynamics\"", "lora.enabled=true", "lora.rank=4"])
    exported = export_run(run, tmp_path / "lora_export", use_ema=False)
    plain = load_transformer(exported / "transformer")
    assert not any("lora" in k for k in plain.state_dict())

    cfg = config_from_dict(json.loads((run / "resolved_config.json").read_text()))
    latest = ckpt.latest_checkpoint(run / "checkpoints")
    saved = ckpt.checkpoint_reader(latest).read_metadata().state_dict_metadata
    assert not any(k.startswith("model.") and ("base_layer" in k or "embed_tokens" in k) for k in saved)  # the base is not copied
    adapted = lora_model_on_base(cfg, 12, ckpt.read_marker(latest)["base"], latest)  # the frozen rest, as the run built it
    state = {"model": trainable_state(adapted)}
    ckpt.load_checkpoint(latest, state)
    assert any("lora_B" in k and state["model"][k].abs().sum() > 0 for k in state["model"]), "adapters were trained"
    contract = json.loads((latest / ckpt.COMPLETE_MARKER).read_text())["data_contract"]
    verify_same_outputs(adapted.eval(), plain.eval(), contract, 12, ByteTokenizer(cfg.model.max_text_tokens))
