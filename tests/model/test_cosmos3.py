import pytest
import torch

from wamkit.errors import CheckpointError, ConfigError
from wamkit.model.cosmos3 import build_transformer, load_pretrained_weights, set_trainable
from wamkit.model.weights import is_generation_param
from wamkit.model.tokenizer import ByteTokenizer, PixelTokenizer


def _tiny(domains=4):
    torch.manual_seed(0)
    return build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=domains)


def test_text_pathway_and_lm_head_frozen_generation_trainable():
    model = _tiny()
    set_trainable(model, train_text_pathway=False)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert "layers.0.self_attn.add_q_proj.weight" in trainable
    assert "layers.0.mlp_moe_gen.up_proj.weight" in trainable
    assert "action_proj_in.fc.weight" in trainable and "action_modality_embed" in trainable
    assert "layers.0.self_attn.to_q.weight" not in trainable
    assert "layers.0.mlp.up_proj.weight" not in trainable
    assert "lm_head.weight" not in trainable and "embed_tokens.weight" not in trainable
    set_trainable(model, train_text_pathway=True)
    assert not model.lm_head.weight.requires_grad and model.layers[0].self_attn.to_q.weight.requires_grad


def test_action_heads_start_at_fan_in_scale():
    model = _tiny()
    w = model.action_proj_out.fc.weight.view(4, 64, 8)
    assert w.abs().max() <= 1 / 64**0.5 + 1e-6
    assert torch.count_nonzero(model.action_proj_out.bias.weight) == 0


def test_load_diffusers_dir_strict_and_fresh_domain(tmp_path):
    source = _tiny()
    source.save_pretrained(tmp_path / "base" / "transformer")
    target = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4)
    load_pretrained_weights(target, tmp_path / "base", fresh_action_domain=2)
    torch.testing.assert_close(target.layers[1].self_attn.add_k_proj.weight, source.layers[1].self_attn.add_k_proj.weight)
    fc_t, fc_s = target.action_proj_in.fc.weight, source.action_proj_in.fc.weight
    torch.testing.assert_close(fc_t[0], fc_s[0])
    assert not torch.equal(fc_t[2], fc_s[2])  # the new domain is re-initialised


def test_load_diffusers_dir_lists_mismatched_keys(tmp_path):
    build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4).save_pretrained(tmp_path / "t")
    bigger = build_transformer("small", latent_channel=12, max_action_dim=8, num_domains=4)
    with pytest.raises(CheckpointError, match="missing.*layers.2"):
        load_pretrained_weights(bigger, tmp_path / "t", fresh_action_domain=None)


def test_unpublished_presets_say_how_to_get_the_shape():
    with pytest.raises(ConfigError, match="checkpoint.load_path"):
        build_transformer("super", 48, 36, 32)


def test_generation_param_classification():
    assert is_generation_param("layers.3.self_attn.norm_added_q.weight")
    assert is_generation_param("time_embedder.linear_1.weight")
    assert not is_generation_param("layers.3.self_attn.to_out.weight")


def test_pixel_tokenizer_shape_contract_and_round_trip():
    tok = PixelTokenizer(spatial_factor=8)
    video = torch.zeros(2, 33, 64, 32, 3, dtype=torch.uint8)
    video[:, :, :8, :8] = 200  # one bright 8x8 cell survives 8x area pooling exactly
    z = tok.encode(video)
    assert z.shape == (2, 12, 9, 8, 4)
    back = tok.decode(z)
    assert back.shape == video.shape
    assert torch.equal(back, video)


def test_lossless_pixel_tokenizer_keeps_every_pixel():
    """Space-to-depth: a one-pixel marker that 4x area pooling blurs into its cell comes back exactly,
    at the same 16x16 token grid per 64 px frame, with 3 * 4^2 channels per latent pixel."""
    gen = torch.Generator().manual_seed(0)
    video = torch.randint(0, 256, (2, 9, 64, 32, 3), generator=gen, dtype=torch.uint8)
    video[:, :, 10, 7] = torch.tensor([255, 0, 0], dtype=torch.uint8)  # a red one-pixel goal marker
    lossless, pooled = PixelTokenizer(4, lossless=True), PixelTokenizer(4)
    z = lossless.encode(video)
    assert z.shape == (2, 3 * 16 * 4, 3, 16, 8) and lossless.latent_channels == 192
    assert pooled.encode(video).shape[-2:] == z.shape[-2:]
    assert torch.equal(lossless.decode(z), video)
    assert not torch.equal(pooled.decode(pooled.encode(video)), video)


def test_byte_tokenizer_bounds():
    tok = ByteTokenizer(max_tokens=8)
    ids = tok.encode("reach the green target")
    assert len(ids) == 8 and ids[0] == tok.bos_id and ids[-1] == tok.eos_id and max(ids) < tok.vocab_size


def _to_reference_names(state):
    """Write a diffusers state dict under the reference framework's names (the test's fixture)."""
    import re

    renames = [
        (r"\.self_attn\.add_(q|k|v)_proj\.", r".self_attn.\1_proj_moe_gen."),
        (r"\.self_attn\.to_add_out\.", ".self_attn.o_proj_moe_gen."),
        (r"\.self_attn\.norm_added_(q|k)\.", r".self_attn.\1_norm_moe_gen."),
        (r"\.self_attn\.to_(q|k|v)\.", r".self_attn.\1_proj."),
        (r"\.self_attn\.to_out\.", ".self_attn.o_proj."),
        (r"\.self_attn\.norm_(q|k)\.", r".self_attn.\1_norm."),
    ]
    top = {"proj_in.": "vae2llm.", "proj_out.": "llm2vae.", "action_proj_in.": "action2llm.", "action_proj_out.": "llm2action."}
    out = {}
    for key, value in state.items():
        new = key
        for pattern, repl in renames:
            new = re.sub(pattern, repl, new)
        for old, ref in top.items():
            if new.startswith(old):
                new = ref + new[len(old):]
        if new.startswith(("layers.", "embed_tokens.", "norm.", "norm_moe_gen.")):
            new = "language_model.model." + new
        elif new.startswith("lm_head."):
            new = "language_model." + new
        out["model.net." + new] = value.clone()
    return out


def test_reference_framework_safetensors_load_with_renames(tmp_path):
    from safetensors.torch import save_file

    from wamkit.model.cosmos3 import load_pretrained_weights

    source = _tiny()
    ref = _to_reference_names(source.state_dict())
    assert any("q_proj_moe_gen" in k for k in ref) and any(k.startswith("model.net.vae2llm") for k in ref)
    save_file(ref, str(tmp_path / "reference.safetensors"))
    target = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4)
    kind = load_pretrained_weights(target, tmp_path / "reference.safetensors", fresh_action_domain=None)
    assert kind == "reference-framework safetensors"
    for key, value in source.state_dict().items():
        torch.testing.assert_close(target.state_dict()[key], value)


def test_reference_import_strictness_lists_the_offending_keys(tmp_path):
    from safetensors.torch import save_file

    from wamkit.model.cosmos3 import load_pretrained_weights

    ref = _to_reference_names(_tiny().state_dict())
    ref["model.net.sound2llm.weight"] = torch.zeros(2)
    del ref["model.net.language_model.model.layers.1.mlp_moe_gen.up_proj.weight"]
    save_file(ref, str(tmp_path / "r.safetensors"))
    with pytest.raises(CheckpointError) as err:
        load_pretrained_weights(_tiny(), tmp_path / "r.safetensors", fresh_action_domain=None)
    assert "layers.1.mlp_moe_gen.up_proj.weight" in str(err.value) and "sound2llm.weight" in str(err.value)


def test_skip_action_heads_loads_a_base_of_another_action_width(tmp_path):
    from wamkit.model.cosmos3 import load_pretrained_weights

    base = build_transformer("tiny", latent_channel=12, max_action_dim=64, num_domains=4)
    base.save_pretrained(tmp_path / "wide")
    narrow = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4)
    fresh_head = narrow.action_proj_in.fc.weight.clone()
    with pytest.raises(CheckpointError, match="action_proj_in"):
        load_pretrained_weights(narrow, tmp_path / "wide", fresh_action_domain=None)
    load_pretrained_weights(narrow, tmp_path / "wide", fresh_action_domain=None, skip_action_heads=True)
    torch.testing.assert_close(narrow.layers[0].mlp_moe_gen.up_proj.weight, base.layers[0].mlp_moe_gen.up_proj.weight)
    assert torch.equal(narrow.action_proj_in.fc.weight, fresh_head)
