"""The Wan2.2 VAE path through diffusers' AutoencoderKLWan, on a tiny config saved in the real
on-disk format (config.json + safetensors)."""

import pytest
import torch
from diffusers import AutoencoderKLWan

from wamkit.errors import ConfigError, DataError
from wamkit.model.tokenizer import WanTokenizer, build_video_tokenizer, single_frame_convs


def test_wan_tokenizer_shape_contract_and_normalisation(tiny_wan_dir):
    tok = build_video_tokenizer("wan2.2", str(tiny_wan_dir))
    assert isinstance(tok, WanTokenizer) and tok.latent_channels == 48 and tok.spatial_factor == 16
    video = torch.randint(0, 256, (2, 9, 32, 48, 3), dtype=torch.uint8)
    z = tok.encode(video)
    assert z.shape == (2, 48, 3, 2, 3)  # 1 + 8/4 latent frames, 16x down
    raw = tok.vae.encode(video.permute(0, 4, 1, 2, 3).float() / 127.5 - 1).latent_dist.mode()
    torch.testing.assert_close(z, (raw - 0.1) / 2.0)
    back = tok.decode(z)
    assert back.shape == video.shape and back.dtype == torch.uint8


def test_wan_first_latent_frame_depends_only_on_the_first_frame(tiny_wan_dir):
    """What lets policy inference encode one observed frame instead of a T+1 clip."""
    tok = WanTokenizer.from_pretrained(tiny_wan_dir)
    clip = torch.randint(0, 256, (1, 9, 32, 32, 3), dtype=torch.uint8)
    alone = tok.encode(clip[:, :1])
    torch.testing.assert_close(alone[:, :, 0], tok.encode(clip)[:, :, 0], atol=1e-5, rtol=1e-4)


def _encode_decode_counting_conv2d(vae, x):
    calls = []
    original = torch.nn.functional.conv2d
    torch.nn.functional.conv2d = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        with torch.no_grad():
            z = vae.encode(x).latent_dist.mode()
            return z, vae.decode(z).sample, len(calls)
    finally:
        torch.nn.functional.conv2d = original


def test_single_frame_2d_convolutions_equal_the_causal_3d_ones(tiny_wan_dir):
    """The fast path for one-frame chunks (a policy's observed frame, the first chunk of a clip)."""
    plain = AutoencoderKLWan.from_pretrained(tiny_wan_dir).eval()
    tok = WanTokenizer.from_pretrained(tiny_wan_dir)
    convs = [m for m in tok.vae.modules() if type(m).__name__ == "WanCausalConv3d"]
    fast = [m for m in convs if getattr(m, "_single_frame_fast_path", False)]
    assert len(fast) > len(convs) // 2 and single_frame_convs(tok.vae) == 0  # most convs, and idempotent
    fast_names = {name for name, m in tok.vae.named_modules() if getattr(m, "_single_frame_fast_path", False)}
    eligible = []  # calls of those convs in the PLAIN model on one frame without a cache

    def count(module, args, kwargs):
        cache = args[1] if len(args) > 1 else kwargs.get("cache_x")
        eligible.append(args[0].shape[2] == 1 and cache is None)

    for name, m in plain.named_modules():
        if name in fast_names:
            m.register_forward_pre_hook(count, with_kwargs=True)
    for frames in (1, 9):
        x = torch.rand(1, 3, frames, 32, 48) * 2 - 1
        eligible.clear()
        got, got_back, fast_calls = _encode_decode_counting_conv2d(tok.vae, x)
        want, want_back, plain_calls = _encode_decode_counting_conv2d(plain, x)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got_back, want_back, atol=1e-5, rtol=1e-4)
        assert sum(eligible) > 0 and fast_calls - plain_calls == sum(eligible)  # each of them ran as one 2D conv


def test_wan_errors_name_the_fix(tiny_wan_dir, tmp_path):
    with pytest.raises(ConfigError, match="config.json"):
        WanTokenizer.from_pretrained(tmp_path)
    tok = WanTokenizer.from_pretrained(tiny_wan_dir)
    with pytest.raises(DataError, match="divisible"):
        tok.encode(torch.zeros(1, 5, 40, 32, 3, dtype=torch.uint8))


def test_pixel_first_latent_frame_depends_only_on_the_first_frame():
    tok = build_video_tokenizer("pixel", pixel_spatial_factor=8)
    clip = torch.randint(0, 256, (1, 9, 32, 32, 3), dtype=torch.uint8)
    torch.testing.assert_close(tok.encode(clip[:, :1])[:, :, 0], tok.encode(clip)[:, :, 0])


def test_compiled_encoder_runs_steady_chunks_through_one_graph_and_encodes_the_same(tiny_wan_dir):
    """compile_encoder sends the calls from the third chunk on through torch.compile (here with
    dynamo's eager backend: the same graphs, no codegen) and the first two eagerly: the latents do
    not change, graphs are captured, and a second clip of the same shape compiles nothing new."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    video = torch.randint(0, 256, (1, 17, 32, 48, 3), dtype=torch.uint8)
    expected = build_video_tokenizer("wan2.2", str(tiny_wan_dir)).encode(video)
    tok = build_video_tokenizer("wan2.2", str(tiny_wan_dir))
    tok.compile_encoder(backend="eager")
    first = tok.encode(video)
    graphs = counters["stats"]["unique_graphs"]
    second = tok.encode(torch.randint(0, 256, (1, 17, 32, 48, 3), dtype=torch.uint8))
    torch.testing.assert_close(first, expected)
    assert graphs > 0 and counters["stats"]["unique_graphs"] == graphs
    assert second.shape == first.shape


def test_encode_flops_are_what_the_tokenizer_runs_counted_without_running_it(tiny_wan_dir):
    from torch.utils.flop_counter import FlopCounterMode

    from wamkit.model.flops import encode_flops
    from wamkit.model.tokenizer import PixelTokenizer

    tok = WanTokenizer.from_pretrained(tiny_wan_dir)
    clips = torch.randint(0, 255, (2, 9, 32, 48, 3), dtype=torch.uint8)
    with FlopCounterMode(display=False) as counter:
        tok.encode(clips)  # the real encode, single-frame convolutions and all
    counted = encode_flops(tok, tuple(clips.shape))  # on a meta copy
    assert counted == pytest.approx(counter.get_total_flops(), rel=1e-3) and counted > 0
    assert encode_flops(tok, (1, 9, 32, 48, 3)) == counted / 2
    assert encode_flops(tok, (2, 5, 32, 48, 3)) < counted  # fewer frames, fewer causal chunks
    assert encode_flops(PixelTokenizer(), tuple(clips.shape)) == 0.0
