"""A meta-built transformer materialised in place has the eager build's values where they are
deterministic (norms, zero inits, base weights) and its distributions where they are random; every
parameter and buffer is written; sharded materialisation equals the unsharded one."""

import math

import pytest
import torch

from wamkit.errors import CheckpointError
from wamkit.model.cosmos3 import build_transformer, load_pretrained_weights
from wamkit.model.materialize import initial_value, materialize
from wamkit.model.weights import BaseWeights
from wamkit.model.lora import apply_lora


def _build(meta: bool, domains: int = 4):
    torch.manual_seed(0)
    with torch.device("meta" if meta else "cpu"):
        return build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=domains)


def _poisoned_meta():
    """A meta model whose storage, once allocated, holds NaN: anything materialize skips stays NaN."""
    model = _build(meta=True)
    original = model.to_empty

    def to_empty(device):
        original(device=device)
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                t.fill_(float("nan"))
        return model

    model.to_empty = to_empty
    return model


def test_random_materialisation_writes_everything_with_the_eager_distributions():
    eager = _build(meta=False)
    model = _poisoned_meta()
    materialize(model, torch.device("cpu"), seed=0)
    for (name, mine), (_, ref) in zip(model.named_parameters(), eager.named_parameters()):
        assert torch.isfinite(mine).all(), name
        if torch.unique(ref).numel() == 1:  # deterministic: ones, zeros
            torch.testing.assert_close(mine, ref, msg=name)
        elif ref.numel() >= 2000:  # random: same distribution (std within 10%, same bound)
            assert abs(mine.std() / ref.std() - 1) < 0.1, name
            if name != "embed_tokens.weight":  # uniform inits: the same bound
                assert mine.abs().max() <= ref.abs().max() * 1.05 + 1e-6, name
    for (name, mine), (_, ref) in zip(model.named_buffers(), eager.named_buffers()):
        torch.testing.assert_close(mine, ref, msg=name)


def test_random_values_are_a_function_of_seed_and_name_only():
    a, b, c = _build(meta=True), _build(meta=True), _build(meta=True)
    materialize(a, torch.device("cpu"), seed=3)
    torch.manual_seed(123)  # the global RNG plays no part
    materialize(b, torch.device("cpu"), seed=3)
    materialize(c, torch.device("cpu"), seed=4)
    for (name, x), (_, y), (_, z) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        assert torch.equal(x, y), name
        if torch.unique(x).numel() > 1:
            assert not torch.equal(x, z), name


def test_fresh_action_head_rows_have_the_linear_fan_in_bound():
    model = _build(meta=True)
    materialize(model, torch.device("cpu"), seed=0)
    w = model.action_proj_out.fc.weight.view(4, 64, 8)
    assert w.abs().max() <= 1 / math.sqrt(64) + 1e-6 and w.abs().max() > 0.5 / math.sqrt(64)
    assert torch.count_nonzero(model.action_proj_out.bias.weight) == 0


@pytest.mark.parametrize("skip_heads", [False, True])
def test_base_weights_equal_the_eager_load(tmp_path, skip_heads):
    source = _build(meta=False)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(torch.randn_like(p))  # values no initialisation would produce
    source.save_pretrained(tmp_path / "base" / "transformer")
    eager = _build(meta=False)
    load_pretrained_weights(eager, tmp_path / "base", fresh_action_domain=2, skip_action_heads=skip_heads)
    model = _poisoned_meta()
    base = BaseWeights(tmp_path / "base")
    counts = materialize(model, torch.device("cpu"), 0, base, skip_action_heads=skip_heads, fresh_action_domain=2)
    assert counts["from_base"] == len(list(model.parameters())) - (5 if skip_heads else 0)  # 2 heads x (fc, bias) + modality embed
    for (name, mine), (_, ref), (_, src) in zip(model.named_parameters(), eager.named_parameters(), source.named_parameters()):
        if name.startswith("action_proj"):
            rows = [d for d in range(4) if d != 2] if not skip_heads else []
            for d in rows:  # the other domains keep the base's rows
                torch.testing.assert_close(mine[d], src[d], msg=name)
            assert not torch.equal(mine[2], src[2]), name  # the new domain is fresh
        elif skip_heads and name == "action_modality_embed":
            assert torch.count_nonzero(mine) == 0
        else:
            torch.testing.assert_close(mine, ref, msg=name)


def test_base_rows_are_read_as_slices(tmp_path):
    source = _build(meta=False)
    source.save_pretrained(tmp_path / "t")
    base = BaseWeights(tmp_path / "t")
    full = source.state_dict()["embed_tokens.weight"]
    torch.testing.assert_close(base.read("embed_tokens.weight", slice(10, 20)), full[10:20])
    assert base.shape("embed_tokens.weight") == tuple(full.shape)


def test_base_with_other_keys_is_a_named_error(tmp_path):
    _build(meta=False).save_pretrained(tmp_path / "t")
    with torch.device("meta"):
        bigger = build_transformer("small", latent_channel=12, max_action_dim=8, num_domains=4)
    with pytest.raises(CheckpointError, match="missing.*layers.2"):
        BaseWeights(tmp_path / "t").check_matches({k: tuple(v.shape) for k, v in bigger.state_dict().items()}, False)


def test_lora_adapters_start_as_a_zero_update():
    model = _build(meta=True)
    apply_lora(model, rank=4, alpha=8.0)
    materialize(model, torch.device("cpu"), seed=0)
    named = dict(model.named_parameters())
    a, b = named["layers.0.self_attn.add_q_proj.lora_A.default.weight"], named["layers.0.self_attn.add_q_proj.lora_B.default.weight"]
    assert torch.count_nonzero(b) == 0 and a.abs().max() > 0


def test_a_parameter_without_a_rule_is_an_error():
    model = _build(meta=True)
    model.register_parameter("mystery", torch.nn.Parameter(torch.empty(3, device="meta")))
    with pytest.raises(NotImplementedError, match="mystery"):
        initial_value(dict(model.named_modules()), "mystery", (3,), 0, torch.device("cpu"))
