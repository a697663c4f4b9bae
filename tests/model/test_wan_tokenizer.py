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


@pytest.mark.parametrize("channels_last", [False, True], ids=["row-major", "channels-last"])
def test_compiled_encoder_runs_every_chunk_after_the_first_frame_through_one_graph(tiny_wan_dir, channels_last):
    """compile_encoder sends every call after the first frame through torch.compile (here with
    dynamo's eager backend: the same graphs, no codegen): a 1 + 4-frame clip already compiles its
    one chunk, the latents do not change (the zero-padded first-frame cache is exact), and clips of
    other lengths compile nothing new, in either weight layout (WanTokenizer.to sets channels-last
    on CUDA)."""
    from torch._dynamo.utils import counters

    from wamkit.model.tokenizer import channels_last_convs

    torch._dynamo.reset()
    counters.clear()
    plain = build_video_tokenizer("wan2.2", str(tiny_wan_dir))
    tok = build_video_tokenizer("wan2.2", str(tiny_wan_dir))
    if channels_last:
        channels_last_convs(tok.vae)
    tok.compile_encoder(backend="eager")
    clips = [torch.randint(0, 256, (1, frames, 32, 48, 3), dtype=torch.uint8) for frames in (5, 17, 9)]
    first = tok.encode(clips[0])
    assert counters["stats"]["unique_graphs"] == 1 and tok.compile_seconds > 0
    for clip in clips[1:]:
        torch.testing.assert_close(tok.encode(clip), plain.encode(clip), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(first, plain.encode(clips[0]), rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1


def test_uniform_first_frame_cache_pads_only_the_causal_convolutions_entries():
    """The temporal downsamplers' entries keep one frame (they read only the last); one-frame
    entries of causal convolutions get a zero frame in front; anything else is left alone."""
    from wamkit.model.tokenizer import uniform_first_frame_cache

    conv, down, deep = torch.ones(1, 2, 1, 3, 3), torch.ones(1, 2, 1, 3, 3), torch.ones(1, 2, 2, 3, 3)
    cache = [conv, down, deep, None, "Rep"]
    uniform_first_frame_cache(cache, skip=[1])
    assert cache[0].shape[2] == 2 and cache[0][:, :, 0].abs().sum() == 0 and torch.equal(cache[0][:, :, 1:], conv)
    assert cache[1] is down and cache[2] is deep and cache[3] is None and cache[4] == "Rep"


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
