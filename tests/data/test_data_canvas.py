"""Camera canvas: layouts, resolution tiers and buckets, never upscaling, training == serving."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wamkit.data import (BUCKETS, CanvasTransform, Normalizer, SampleTransform, Window, canvas_size, compose_canvas,
                         compose_frames)
from wamkit.data.canvas import nearest_bucket
from wamkit.errors import ConfigError, DataError


def views(n=3, h=180, w=320, t=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (t, h, w, 3), generator=g, dtype=torch.uint8) for _ in range(n)]


def test_buckets_divisible_by_16_and_required_entries():
    for tier, buckets in BUCKETS.items():
        assert all(h % 16 == 0 and w % 16 == 0 for h, w in buckets), tier
    assert (544, 736) in BUCKETS[480] and (192, 320) in BUCKETS[256] and (480, 640) in BUCKETS[480]


def test_native_side_by_side_is_plain_tiling():
    v = views(2, 64, 64)
    out = CanvasTransform()(torch.stack(v))
    assert torch.equal(out, torch.cat(v, dim=2))


def test_concat_view_layout():
    v = views(3, 180, 320)
    out = CanvasTransform("concat_view", 0, wrist_index=1)(torch.stack(v))
    assert out.shape == (2, 270, 320, 3)
    assert torch.equal(out[:, :180], v[1])  # wrist on top at full size
    # exteriors at half size, in camera order: a flat exterior stays flat
    flat = [torch.full((1, 180, 320, 3), c, dtype=torch.uint8) for c in (10, 200, 90)]
    out = CanvasTransform("concat_view", 0, wrist_index=2)(torch.stack(flat))
    assert torch.all(out[:, :180] == 90) and torch.all(out[:, 180:, :160] == 10) and torch.all(out[:, 180:, 160:] == 200)


@pytest.mark.parametrize("shape,layout,n,tier,bucket", [
    ((180, 320), "concat_view", 3, 480, (480, 640)),
    ((240, 320), "side_by_side", 1, 256, (224, 288)),
    ((288, 480), "side_by_side", 1, 256, (192, 320)),
    ((360, 640), "side_by_side", 1, 720, (720, 1280)),
])
def test_tier_bucket_fit_and_pad(shape, layout, n, tier, bucket):
    v = views(n, *shape, t=1)
    out = compose_canvas([x[0].numpy() for x in v], layout, tier, 0)
    assert isinstance(out, np.ndarray) and out.dtype == np.uint8 and out.shape == (*bucket, 3)
    assert canvas_size([shape] * n, layout, tier, 0) == bucket


def test_never_upscales_pads_instead():
    img = np.full((60, 80, 3), 77, np.uint8)
    out = compose_canvas([img], "side_by_side", 480)  # 4:3 -> 480x640 bucket, but the image stays 60x80
    assert out.shape == (480, 640, 3)
    assert np.all(out[:60, :80] == 77) and np.all(out[60:] == 0) and np.all(out[:, 80:] == 0)


def test_downscale_keeps_aspect_and_content():
    img = np.zeros((480, 960, 3), np.uint8)
    img[:, :480] = 255
    out = compose_canvas([img], "side_by_side", 256)
    b = nearest_bucket(480, 960, 256)
    assert out.shape == (*b, 3)
    scale = min(b[0] / 480, b[1] / 960)
    h, w = round(480 * scale), round(960 * scale)
    assert np.all(out[:h, : w // 2 - 2] == 255) and np.all(out[:h, w // 2 + 2: w] == 0) and np.all(out[h:] == 0)


def test_serving_equals_training():
    v = views(3, 180, 320, t=3)
    canvas = CanvasTransform("concat_view", 480, wrist_index=0)
    train = canvas(torch.stack(v))
    for t in range(3):
        serve = compose_canvas([x[t].numpy() for x in v], "concat_view", 480, 0)
        assert np.array_equal(serve, train[t].numpy())


def test_sample_transform_uses_canvas(demo_ds):
    from wamkit.data import WindowDataset
    w = WindowDataset(demo_ds, [1], chunk_length=4)[0]
    norm = Normalizer.from_stats(demo_ds.stats, "action", "minmax")
    s = SampleTransform(norm, None, 8, False, 0, canvas=CanvasTransform("side_by_side", 256))(w)
    assert s.video.shape == (5, 256, 256, 3)  # 64x64 is never upscaled: padded into 256x256
    assert torch.equal(s.video[:, :64, :64], w.video[0])
    three = Window(torch.stack([w.video[0]] * 3), None, w.action, w.task, 1, 0)
    s = SampleTransform(norm, None, 8, False, 0, canvas=CanvasTransform("concat_view", 0))(three)
    assert s.video.shape == (5, 96, 64, 3)


def test_errors():
    with pytest.raises(ConfigError, match="camera_layout"):
        CanvasTransform("grid")
    with pytest.raises(ConfigError, match="resolution"):
        CanvasTransform("side_by_side", 360)
    with pytest.raises(DataError, match="exactly 3 cameras"):
        CanvasTransform("concat_view")(torch.stack(views(2, 32, 32)))
    with pytest.raises(DataError, match="uint8"):
        compose_canvas([np.zeros((8, 8, 3), np.float32)])

    class Cfg:
        camera_layout, resolution, wrist_camera = "concat_view", 0, ""
    with pytest.raises(ConfigError, match="wrist_camera"):
        CanvasTransform.from_config(Cfg, ["a", "b", "c"])
    Cfg.wrist_camera = "b"
    assert CanvasTransform.from_config(Cfg, ["a", "b", "c"]).wrist_index == 1


def test_side_by_side_views_of_different_heights():
    """Taller views shrink to the shortest height, aspect kept; views already that height are untouched."""
    tall, short = views(1, 120, 160)[0], views(1, 60, 100, seed=1)[0]
    out = compose_frames([tall, short])
    assert out.shape == (2, 60, 180, 3) and canvas_size([(120, 160), (60, 100)]) == (60, 180)
    assert torch.equal(out[:, :, 80:], short)
    flat = torch.full((1, 120, 160, 3), 77, dtype=torch.uint8)
    assert (compose_frames([flat, short[:1]])[:, :, :80] == 77).all()  # an antialiased shrink of a flat view
    assert compose_canvas([tall[0].numpy(), short[0].numpy()], "side_by_side", 256).shape == (160, 400, 3)


@pytest.mark.parametrize("size", [(240, 320), (100, 130), (600, 800)])  # shrink (antialiased) and enlarge
def test_uint8_resize_stays_within_a_grey_level_of_float_interpolation(size):
    import torch.nn.functional as F

    from wamkit.data.canvas import _resize

    gen = torch.Generator().manual_seed(0)
    frames = torch.randint(0, 256, (3, 480, 1280, 3), generator=gen, dtype=torch.uint8)[:, :, :640]  # a view, as decoded
    shrink = size[0] < 480
    ref = F.interpolate(frames.permute(0, 3, 1, 2).float(), size=size, mode="bilinear", align_corners=False, antialias=shrink)
    ref = ref.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
    out = _resize(frames, size)
    assert out.dtype == torch.uint8 and out.shape == (3, *size, 3) and out.is_contiguous()
    assert int((out.int() - ref.int()).abs().max()) <= 1
