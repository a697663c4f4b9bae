"""LoRA through peft: what trains, the frozen-action-pathway refusal, DCP save/load, merge for
export, and a forward-dynamics LoRA run that resumes exactly."""

import json

import pytest
import torch

from wamkit.config import load_experiment
from wamkit.data import write_demo_dataset
from wamkit.errors import ConfigError
from wamkit.model.cosmos3 import build_transformer, set_trainable
from wamkit.model.weights import is_action_head_param
from wamkit.model.lora import DEFAULT_TARGET_MODULES, apply_lora, merge_lora, prepare_trainable
from wamkit.model.attention import packed_layout
from wamkit.model.attention_backends import install_packed_attention
from wamkit.model.packing import SequenceSample, pack_samples
from wamkit.train.checkpoint import load_checkpoint, save_checkpoint

from tests.helpers import DEMO_RECIPE

RANK, ALPHA = 4, 8.0


def _base(seed: int = 0):
    torch.manual_seed(seed)
    model = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4)
    with torch.no_grad():
        model.action_modality_embed.normal_()
    set_trainable(model, train_text_pathway=False)
    return model


def _lora(seed: int = 0, train_action_pathway: bool = True):
    model = _base(seed)
    counts = apply_lora(model, RANK, ALPHA, DEFAULT_TARGET_MODULES, train_action_pathway)
    return model, counts


def _randomize_adapters(model, seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:  # fresh B is 0: the adapters would be a no-op and the tests toothless
                param.copy_(torch.randn(param.shape, generator=g) * 0.2)


def _batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    samples = [
        SequenceSample(
            text_ids=torch.randint(3, 250, (6 + i,), generator=g).tolist(), video=torch.randn(12, 3, 4, 4, generator=g),
            actions=torch.randn(9, 8, generator=g), clean_video_frames=[0], clean_action_rows=[0], sigma=0.3 + 0.2 * i,
            domain_id=i, fps=10.0, action_start_frame=0,
        )
        for i in range(2)
    ]
    return samples


@torch.no_grad()
def _forward(model, samples):
    model.eval()
    batch = pack_samples(samples, model.config)
    processor = install_packed_attention(model)
    with packed_layout(processor, batch):
        out = model(**batch.forward_kwargs)
    return out


def _expected_lora_params(model) -> int:
    total = 0
    for name, module in model.named_modules():
        if name.split(".")[-1] in DEFAULT_TARGET_MODULES:
            base = module.base_layer
            total += RANK * (base.in_features + base.out_features)
    return total


def test_trainable_parameters_are_the_adapters_plus_the_action_pathway():
    model, counts = _lora()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    action = sum(p.numel() for n, p in model.named_parameters() if is_action_head_param(n))
    lora = _expected_lora_params(model)
    assert lora > 0 and action > 0
    assert counts["trainable"] == lora + action == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert counts["lora"] == lora and counts["action_pathway"] == action
    assert all("lora_" in n or is_action_head_param(n) for n in trainable)
    assert {"action_proj_in.fc.weight", "action_proj_out.fc.weight", "action_modality_embed"} <= trainable

    frozen_heads, counts = _lora(train_action_pathway=False)
    assert counts["trainable"] == lora
    assert all("lora_" in n for n, p in frozen_heads.named_parameters() if p.requires_grad)


def test_unknown_target_module_is_a_config_error():
    with pytest.raises(ConfigError, match="lora.target_modules"):
        apply_lora(_base(), RANK, ALPHA, ["add_qq_proj"], True)


def test_frozen_action_pathway_is_refused_for_forward_dynamics():
    base = ['data.path="x"', "lora.enabled=true", "lora.train_action_pathway=false"]
    for mode in (['model.mode="forward_dynamics"'], ['model.mode="mixed"']):
        with pytest.raises(ConfigError, match="degenerates into first-frame video prediction"):
            load_experiment(None, base + mode)
    # Without forward dynamics a frozen action pathway is a legitimate choice.
    load_experiment(None, base + ['model.mode="policy"'])
    load_experiment(None, base + ['model.mode="mixed"', "model.mode_weights.forward_dynamics=0"])
    load_experiment(None, ['data.path="x"', 'model.mode="forward_dynamics"', "lora.train_action_pathway=false"])  # LoRA off


def test_prepare_trainable_without_lora_keeps_set_trainable():
    cfg = load_experiment(None, ['data.path="x"'])
    model = _base()
    before = {n: p.requires_grad for n, p in model.named_parameters()}
    counts = prepare_trainable(model, cfg)
    assert before == {n: p.requires_grad for n, p in model.named_parameters()}
    assert counts["trainable"] == sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_lora_weights_save_and_load_with_the_dcp_checkpoint(tmp_path):
    model, _ = _lora(seed=0)
    _randomize_adapters(model)
    reference = _forward(model, _batch())
    path = save_checkpoint(tmp_path / "checkpoints", 3, {"model": model.state_dict()})
    assert any(".lora_A." in k for k in model.state_dict())

    fresh, _ = _lora(seed=1)  # different base weights and zero adapters
    assert not torch.allclose(_forward(fresh, _batch()).sample[0], reference.sample[0])
    load_checkpoint(path, {"model": fresh.state_dict()})
    loaded = _forward(fresh, _batch())
    for a, b in zip(loaded.sample + loaded.action, reference.sample + reference.action):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_merged_plain_model_equals_the_lora_model():
    model, _ = _lora()
    _randomize_adapters(model)
    lora_out = _forward(model, _batch())
    base_out = _forward(_base(), _batch())
    assert not torch.allclose(lora_out.sample[0], base_out.sample[0], atol=1e-4)  # the adapters matter

    merged_state = merge_lora(model)
    plain = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4)
    assert set(merged_state) == set(plain.state_dict())
    plain.load_state_dict(merged_state, strict=True)
    merged_out = _forward(plain, _batch())
    for a, b in zip(merged_out.sample + merged_out.action, lora_out.sample + lora_out.action):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert any(".lora_A." in k for k in model.state_dict())  # merge_lora left the LoRA model as it was


def _cfg(data, out, name, max_iter):
    overrides = [
        f'job.name="{name}"', f'job.output_root="{out}"', f'data.path="{data}"', "data.generate_demo=false",
        f"trainer.max_iter={max_iter}", "checkpoint.save_iter=2", "trainer.samples_per_step=2", "trainer.progress_bar=false",
        "trainer.val_every=0", "scheduler.warm_up_steps=[1]",
        "scheduler.cycle_lengths=[6]",  # the default cycle is max_iter long: the 4-step launch would decay faster
        'model.mode="forward_dynamics"', "lora.enabled=true", "lora.rank=4",
    ]
    return load_experiment(DEMO_RECIPE, overrides)


def _losses(run_dir):
    return {r["step"]: (r["loss"], r["action_loss"]) for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r}


def test_forward_dynamics_lora_training_resumes_exactly(tmp_path, capsys):
    from wamkit.train.trainer import Trainer

    data = write_demo_dataset(tmp_path / "reach", num_episodes=8)
    straight = Trainer(_cfg(data, tmp_path, "straight", 6))
    optimized = sum(p.numel() for group in straight.optimizer.param_groups for p in group["params"])
    assert optimized == straight.parameter_counts["trainable"] == straight.parameter_counts["lora"] + straight.parameter_counts["action_pathway"]
    frozen = {n: p.detach().clone() for n, p in straight.model.named_parameters() if not p.requires_grad}
    assert any("base_layer" in n for n in frozen) and any("mlp_moe_gen" in n for n in frozen)
    straight.train()
    for name, param in straight.model.named_parameters():
        if name in frozen:  # base weights, generation MLPs, norms, ... do not move under LoRA
            assert torch.equal(param, frozen[name]), name

    Trainer(_cfg(data, tmp_path, "resumed", 4)).train()
    capsys.readouterr()
    second = Trainer(_cfg(data, tmp_path, "resumed", 6))
    summary = second.train()
    assert "at step 4" in capsys.readouterr().out and summary["step"] == 6

    a, b = _losses(tmp_path / "straight"), _losses(tmp_path / "resumed")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5, 6]
    assert [a[s] for s in (5, 6)] == [b[s] for s in (5, 6)]  # bit-identical on CPU
    assert all(action == 0.0 for _, action in a.values())  # forward dynamics: no action loss
