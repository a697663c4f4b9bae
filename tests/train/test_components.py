import math

import pytest
import torch

from wamkit.config.schema import OptimizerConfig
from wamkit.errors import ConfigError
from wamkit.model.cosmos3 import build_transformer, set_trainable
from wamkit.train.ema import EMA
from wamkit.train.optim import build_optimizer
from wamkit.config.schedule import LambdaSchedule
from wamkit.diffusion.flow import add_noise, sample_sigmas, shift_sigma


def test_lambda_linear_warmup_then_anneal_to_f_min():
    s = LambdaSchedule("LambdaLinear", [10], [110], [0.0], [1.0], [0.1])
    assert s(0) == 0.0 and s(5) == pytest.approx(0.5) and s(10) == pytest.approx(1.0)
    assert s(60) == pytest.approx(0.55) and s(109) == pytest.approx(0.1 + 0.9 / 100)
    assert s(500) == pytest.approx(0.1)


def test_lambda_cosine_cycles():
    s = LambdaSchedule("LambdaCosine", [0], [100, 100], [1.0], [1.0], [0.0])
    assert s(0) == pytest.approx(1.0) and s(50) == pytest.approx(0.5) and s(100) == pytest.approx(1.0)
    assert s(199) == pytest.approx(0.5 * (1 + math.cos(math.pi * 99 / 100)))


def test_schedule_rejects_inconsistent_cycles():
    with pytest.raises(ConfigError, match="scheduler.f_max"):
        LambdaSchedule("LambdaLinear", [0], [10, 10], [0.0], [1.0, 1.0, 1.0], [0.0])


def test_optimizer_groups_action_head_lr_multiplier_and_no_frozen_params():
    model = build_transformer("tiny", 12, 8, 4)
    set_trainable(model, False)
    opt = build_optimizer(model, OptimizerConfig(lr=2e-4, action_head_lr_multiplier=5.0))
    lrs = {g["name"]: g["lr"] for g in opt.param_groups}
    assert lrs["action_head_no_decay"] == pytest.approx(1e-3) and lrs["backbone"] == pytest.approx(2e-4)
    in_optimizer = {id(p) for g in opt.param_groups for p in g["params"]}
    assert id(model.lm_head.weight) not in in_optimizer
    assert id(model.layers[0].self_attn.to_q.weight) not in in_optimizer
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_ema_starts_as_copy_then_averages():
    lin = torch.nn.Linear(2, 2)
    ema = EMA(lin, beta=0.9, warmup=10)
    with torch.no_grad():
        lin.weight.fill_(1.0)
    ema.update(lin, step=0)
    assert torch.equal(ema.shadow["weight"], lin.weight)
    with torch.no_grad():
        lin.weight.fill_(3.0)
    ema.update(lin, step=90)  # beta = min(0.9, 90/100) = 0.9
    assert torch.allclose(ema.shadow["weight"], torch.full((2, 2), 0.9 * 1.0 + 0.1 * 3.0))


def test_rectified_flow_definitions():
    x0, eps = torch.randn(5), torch.randn(5)
    xs, v = add_noise(x0, 0.25, eps)
    torch.testing.assert_close(xs, 0.25 * eps + 0.75 * x0)
    torch.testing.assert_close(v, eps - x0)
    assert shift_sigma(torch.tensor(0.5), 3.0).item() == pytest.approx(0.75)
    s = sample_sigmas(1000, torch.Generator().manual_seed(0), shift=3.0)
    assert 0 < s.min() and s.max() < 1 and s.mean() > 0.6  # shift pushes towards noise


def _loss_and_grads(model):
    from wamkit.model.attention import packed_layout
    from wamkit.model.attention_backends import install_packed_attention
    from wamkit.model.packing import SequenceSample, pack_samples

    gen = torch.Generator().manual_seed(0)
    sample = SequenceSample(text_ids=[5, 6, 7], video=torch.randn(12, 2, 4, 4, generator=gen), actions=torch.randn(5, 8, generator=gen),
                            clean_video_frames=[0], clean_action_rows=[0], sigma=0.5)
    processor = install_packed_attention(model)
    batch = pack_samples([sample], model.config)
    with packed_layout(processor, batch):
        out = model(**batch.forward_kwargs)
    loss = sum(x.square().mean() for x in out.sample + out.action)
    model.zero_grad()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_selective_activation_checkpointing_recomputes_only_the_mlps_and_changes_nothing():
    from wamkit.train.parallel import checkpoint_mlps

    torch.manual_seed(0)
    model = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=2)
    plain_loss, plain_grads = _loss_and_grads(model)
    names = [n for n, _ in model.named_parameters()]
    calls = {"mlp": 0, "attn": 0}
    for layer in model.layers:
        layer.mlp_moe_gen.up_proj.register_forward_hook(lambda *a: calls.__setitem__("mlp", calls["mlp"] + 1))
        layer.self_attn.add_q_proj.register_forward_hook(lambda *a: calls.__setitem__("attn", calls["attn"] + 1))
    assert checkpoint_mlps(model) == 2 * len(model.layers)
    loss, grads = _loss_and_grads(model)
    torch.testing.assert_close(loss, plain_loss)
    assert grads.keys() == plain_grads.keys() and [n for n, _ in model.named_parameters()] == names
    for n, g in grads.items():
        torch.testing.assert_close(g, plain_grads[n], msg=n)
    layers = len(model.layers)
    assert calls == {"mlp": 2 * layers, "attn": layers}  # the MLPs ran again in backward, attention did not


def test_adamw8bit_says_once_that_its_step_graphs_are_not_cached(caplog):
    """torchao's AdamW8bit: inductor's per-shape "Failed to pickle cache key" tracebacks become one line."""
    import logging

    model = torch.nn.Linear(16, 16)
    build_optimizer(model, OptimizerConfig(kind="adamw8bit"))
    codecache = logging.getLogger("torch._inductor.codecache")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            codecache.warning("Failed to pickle cache key")
        codecache.warning("another warning")
    messages = [r.getMessage() for r in caplog.records]
    assert "Failed to pickle cache key" not in messages and "another warning" in messages
    assert sum("AdamW8bit step graphs cannot be stored" in m for m in messages) <= 1  # once per process (maybe earlier)
