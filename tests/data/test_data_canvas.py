"""Camera canvas: layouts, resolution tiers and buckets, never upscaling, padding, training == serving."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from wamkit.data import (BUCKETS, CanvasTransform, Normalizer, SampleTransform, Window, canvas_size, compose_canvas,
                         compose_frames)
from wamkit.data.canvas import ASPECTS, contract_padding, nearest_bucket, pad_canvas, split_canvas
from wamkit.errors import ConfigError, DataError


def views(n=3, h=180, w=320, t=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (t, h, w, 3), generator=g, dtype=torch.uint8) for _ in range(n)]


def test_buckets_are_the_reference_table():
    """Five aspects per tier, (H, W): the released model's training canvases; 4:3 is 320x256, 736x544 and
    1104x832 as WxH, and there is no 640x480 bucket."""
    assert ASPECTS == ("1:1", "4:3", "3:4", "16:9", "9:16")
    four_three = {tier: dict(zip(ASPECTS, buckets))["4:3"] for tier, buckets in BUCKETS.items()}
    assert four_three == {256: (256, 320), 480: (544, 736), 720: (832, 1104)}
    assert BUCKETS[256] == ((256, 256), (256, 320), (320, 256), (192, 320), (320, 192))
    assert BUCKETS[480] == ((640, 640), (544, 736), (736, 544), (480, 832), (832, 480))
    assert BUCKETS[720] == ((960, 960), (832, 1104), (1104, 832), (720, 1280), (1280, 720))
    assert all((480, 640) not in buckets for buckets in BUCKETS.values())
    for tier, buckets in BUCKETS.items():
        assert all(h % 16 == 0 and w % 16 == 0 for h, w in buckets), tier
        for (h, w), aspect in zip(buckets, ASPECTS):  # each bucket is within 6% of its named aspect
            a, b = map(int, aspect.split(":"))
            assert abs((h / w) / (b / a) - 1) < 0.07, (tier, aspect)


def test_droid_concat_lands_on_the_544x736_bucket():
    """DROID: a 360x640 wrist on top, two exteriors at half size below -> 540x640, which the reference
    puts in 736x544 (WxH) unscaled: 4 rows and 96 columns of padding."""
    shapes = [(360, 640)] * 3
    assert canvas_size(shapes, "concat_view", 480, 0) == (544, 736)
    canvas = CanvasTransform("concat_view", 480, 0)
    assert canvas.content_size(shapes) == (540, 640)
    v = views(3, 360, 640, t=1)
    out = canvas(torch.stack(v))
    assert out.shape == (1, 544, 736, 3) and torch.equal(out[:, :360], torch.cat([v[0], out[:, :360, 640:]], dim=2))
    # 544/16 = 34, 736/16 = 46 latents -> 17 x 23 = 391 patches of 2x2 per latent frame
    assert (544 // 16 // 2) * (736 // 16 // 2) == 391


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
    ((180, 320), "concat_view", 3, 480, (544, 736)),
    ((240, 320), "side_by_side", 1, 256, (256, 320)),  # 0.75: 4:3 (0.8) is 0.05 away, 16:9 (0.6) 0.15
    ((480, 640), "side_by_side", 1, 480, (544, 736)),
    ((288, 480), "side_by_side", 1, 256, (192, 320)),
    ((64, 96), "side_by_side", 1, 256, (192, 320)),  # the synthetic G1 ego camera
    ((360, 640), "side_by_side", 1, 720, (720, 1280)),
    ((640, 360), "side_by_side", 1, 480, (832, 480)),
])
def test_tier_bucket_fit_and_pad(shape, layout, n, tier, bucket):
    v = views(n, *shape, t=1)
    out = compose_canvas([x[0].numpy() for x in v], layout, tier, 0)
    assert isinstance(out, np.ndarray) and out.dtype == np.uint8 and out.shape == (*bucket, 3)
    assert canvas_size([shape] * n, layout, tier, 0) == bucket


def test_never_upscales_pads_instead():
    img = np.full((60, 80, 3), 77, np.uint8)
    out = compose_canvas([img], "side_by_side", 480, padding="zero")  # 4:3 -> 544x736, the image stays 60x80
    assert out.shape == (544, 736, 3)
    assert np.all(out[:60, :80] == 77) and np.all(out[60:] == 0) and np.all(out[:, 80:] == 0)
    # reflect cannot mirror a pad wider than the content: the reference replicates the edge instead
    grad = np.broadcast_to(np.arange(80, dtype=np.uint8)[None, :, None], (60, 80, 3)).copy()
    out = compose_canvas([grad], "side_by_side", 480)
    assert out.shape == (544, 736, 3) and np.array_equal(out[:60, :80], grad)
    assert np.all(out[:, 80:] == 79) and np.array_equal(out[60:, :80], np.broadcast_to(grad[-1], (484, 80, 3)))


def test_reflection_padding_mirrors_the_content():
    """Bottom and right pads are the content mirrored about its last row / column (edge not repeated),
    as the reference's reflection padding; the zero knob keeps black."""
    g = torch.Generator().manual_seed(3)
    img = torch.randint(0, 256, (1, 540, 640, 3), generator=g, dtype=torch.uint8)
    out = pad_canvas(img, (544, 736))
    assert torch.equal(out[:, :540, :640], img)
    for k in range(1, 97):  # column 640 + k - 1 mirrors column 640 - 1 - k
        assert torch.equal(out[:, :540, 639 + k], img[:, :, 639 - k])
    for k in range(1, 5):
        assert torch.equal(out[:, 539 + k, :640], img[:, 539 - k])
    assert torch.equal(out[:, 540:, 640:], out[:, 540:, :640].flip(2)[:, :, 1:97])  # the corner mirrors both ways
    ref = F.pad(img.permute(0, 3, 1, 2).float(), (0, 96, 0, 4), mode="reflect").to(torch.uint8).permute(0, 2, 3, 1)
    assert torch.equal(out, ref)  # exactly torch's reflect, done on uint8
    assert out[:, 540:].any() and out[:, :, 640:].any()
    zero = pad_canvas(img, (544, 736), "zero")
    assert torch.equal(zero[:, :540, :640], img) and not zero[:, 540:].any() and not zero[:, :, 640:].any()
    padded = CanvasTransform("concat_view", 480, 0)(torch.stack(views(3, 360, 640, t=1)))
    assert torch.equal(padded[:, :, 640 + 5], padded[:, :, 640 - 1 - 6])
    zeroed = CanvasTransform("concat_view", 480, 0, padding="zero")(torch.stack(views(3, 360, 640, t=1)))
    assert not zeroed[:, :, 640:].any() and not zeroed[:, 540:].any()


def test_downscale_keeps_aspect_and_content():
    img = np.zeros((480, 960, 3), np.uint8)
    img[:, :480] = 255
    out = compose_canvas([img], "side_by_side", 256)
    b = nearest_bucket(480, 960, 256)
    assert out.shape == (*b, 3) and b == (192, 320)
    scale = min(b[0] / 480, b[1] / 960)
    h, w = round(480 * scale), round(960 * scale)
    assert np.all(out[:h, : w // 2 - 2] == 255) and np.all(out[:h, w // 2 + 2: w] == 0)
    assert np.array_equal(out[h:], out[h - 2:2 * h - b[0] - 2:-1][: b[0] - h])  # reflected below the content


@pytest.mark.parametrize("padding", ["reflect", "zero"])
def test_serving_equals_training(padding):
    v = views(3, 180, 320, t=3)
    canvas = CanvasTransform("concat_view", 480, wrist_index=0, padding=padding)
    train = canvas(torch.stack(v))
    state = canvas.state_dict()
    assert state["padding"] == padding and CanvasTransform.from_state_dict(state).state_dict() == state
    for t in range(3):
        serve = compose_canvas([x[t].numpy() for x in v], state["camera_layout"], state["resolution"],
                               state["wrist_index"], contract_padding(state))
        assert np.array_equal(serve, train[t].numpy())


def test_old_contract_without_padding_loads_as_zero():
    """Contracts written before data.canvas_padding were zero-padded: serve them that way."""
    old = {"camera_layout": "concat_view", "resolution": 480, "wrist_index": 0}
    assert contract_padding(old) == "zero" and contract_padding(None) == "zero"
    canvas = CanvasTransform.from_state_dict(old)
    assert canvas.padding == "zero" and canvas.state_dict() == {**old, "padding": "zero"}
    v = views(3, 180, 320, t=1)
    out = canvas(torch.stack(v))
    assert out.shape == (1, 544, 736, 3) and not out[:, 270:].any() and not out[:, :, 320:].any()
    from wamkit.worldmodel.rollout import compose_views
    assert torch.equal(compose_views([x.numpy() for x in v], old), out)


def test_sample_transform_uses_canvas(demo_ds):
    from wamkit.data import WindowDataset
    w = WindowDataset(demo_ds, [1], chunk_length=4)[0]
    norm = Normalizer.from_stats(demo_ds.stats, "action", "minmax")
    s = SampleTransform(norm, None, 8, False, 0, canvas=CanvasTransform("side_by_side", 256))(w)
    assert s.video.shape == (5, 256, 256, 3)  # 64x64 is never upscaled: padded into 256x256
    assert torch.equal(s.video[:, :64, :64], w.video[0])
    assert torch.equal(s.video[:, :64, 64:], w.video[0][:, :, -1:].expand(-1, -1, 192, -1))  # edge: pad > 64
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
    with pytest.raises(ConfigError, match="canvas_padding"):
        CanvasTransform("side_by_side", 256, padding="mirror")

    class Cfg:
        camera_layout, resolution, wrist_camera = "concat_view", 0, ""
    with pytest.raises(ConfigError, match="wrist_camera"):
        CanvasTransform.from_config(Cfg, ["a", "b", "c"])
    Cfg.wrist_camera = "b"
    assert CanvasTransform.from_config(Cfg, ["a", "b", "c"]).wrist_index == 1
    assert CanvasTransform.from_config(Cfg, ["a", "b", "c"]).padding == "reflect"  # the default
    Cfg.canvas_padding = "zero"
    assert CanvasTransform.from_config(Cfg, ["a", "b", "c"]).state_dict()["padding"] == "zero"


def test_side_by_side_views_of_different_heights():
    """Taller views shrink to the shortest height, aspect kept; views already that height are untouched."""
    tall, short = views(1, 120, 160)[0], views(1, 60, 100, seed=1)[0]
    out = compose_frames([tall, short])
    assert out.shape == (2, 60, 180, 3) and canvas_size([(120, 160), (60, 100)]) == (60, 180)
    assert torch.equal(out[:, :, 80:], short)
    flat = torch.full((1, 120, 160, 3), 77, dtype=torch.uint8)
    assert (compose_frames([flat, short[:1]])[:, :, :80] == 77).all()  # an antialiased shrink of a flat view
    assert compose_canvas([tall[0].numpy(), short[0].numpy()], "side_by_side", 256).shape == (192, 320, 3)


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


@pytest.mark.parametrize("shapes,tier", [([(64, 64), (64, 64)], 0), ([(64, 64), (48, 80), (64, 32)], 0),
                                         ([(64, 64), (64, 64)], 256), ([(180, 320), (240, 320)], 480)])
def test_a_split_canvas_composes_back_to_the_same_pixels(shapes, tier):
    """The world-model judge splits a generated canvas into views for a multi-camera policy, which tiles them
    again: the canvas it composes must be the one the world model generated."""
    g = torch.Generator().manual_seed(1)
    frames = [torch.randint(0, 256, (2, h, w, 3), generator=g, dtype=torch.uint8) for h, w in shapes]
    canvas = compose_frames(frames, "side_by_side", tier)
    parts = split_canvas(canvas, shapes, "side_by_side", tier)
    assert len(parts) == len(shapes)
    assert torch.equal(compose_frames([p.contiguous() for p in parts], "side_by_side", tier), canvas)
    if tier == 0 and len({h for h, _ in shapes}) == 1:  # plain tiling: the views themselves
        assert all(torch.equal(p, f) for p, f in zip(parts, frames))
    one_step = split_canvas(canvas[0], shapes, "side_by_side", tier)  # a single frame [H, W, 3] too
    assert all(torch.equal(a, b[0]) for a, b in zip(one_step, parts))


def test_split_canvas_refuses_what_it_cannot_invert():
    canvas = compose_frames(views(3, 64, 64), "concat_view")
    with pytest.raises(DataError, match="(?s)concat_view.*side_by_side"):
        split_canvas(canvas, [(64, 64)] * 3, "concat_view")
    with pytest.raises(DataError, match="view sizes"):
        split_canvas(compose_frames(views(2, 64, 64)), [(64, 64)] * 3)
