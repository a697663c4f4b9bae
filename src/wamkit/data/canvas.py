"""Compose the cameras of one time step into the single video canvas the model sees.

Two layouts (`data.camera_layout`):

* ``side_by_side``: the views tiled left to right, in `data.camera_keys` order. Views taller than the
  shortest one are first shrunk to its height, aspect kept (never upscaling any view).
* ``concat_view`` (the DROID recipe): the wrist view (`data.wrist_camera`) on top at full size; the
  two other (exterior) views, each resized to half the wrist view's height and width, side by side
  below it, in `data.camera_keys` order. Exactly three views; canvas = (1.5 H, W) of the wrist view.

Then a resolution tier (`data.resolution`): 0 keeps the composed canvas as it is (native). 256, 480
and 720 follow the released model's training canvases (the reference framework's action data path):
the tier's five aspect buckets (table :data:`BUCKETS`: 1:1, 4:3, 3:4, 16:9, 9:16), the one whose H/W is
nearest the composed canvas's H/W (plain difference; ties go to the earlier bucket); the canvas shrunk
to fit inside it, aspect kept and never upscaled; then padded bottom and right to the bucket size
(`data.canvas_padding`): ``reflect`` mirrors the content as the reference does (edge-replicated instead
when a pad is not smaller than the content along either side, where a mirror cannot reach), ``zero``
fills black, as wamkit did before. Every bucket is divisible by 16, the tokenizer's spatial factor.

All work is on uint8 tensors with torch interpolation (bilinear, antialiased when shrinking), so
training (:class:`CanvasTransform`, called by SampleTransform) and serving (:func:`compose_canvas`)
produce identical pixels.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from wamkit.errors import ConfigError, DataError

CAMERA_LAYOUTS = ("side_by_side", "concat_view")
RESOLUTION_TIERS = (0, 256, 480, 720)
SPATIAL_FACTOR = 16
PADDING_MODES = ("reflect", "zero")
# What a data contract without a "padding" key was trained with (every canvas before the knob existed).
LEGACY_PADDING = "zero"

# (height, width) buckets per tier, in the aspect order below: the reference framework's
# VIDEO_RES_SIZE_INFO (stored there as (W, H)) for the tiers wamkit offers. All divisible by 16.
ASPECTS = ("1:1", "4:3", "3:4", "16:9", "9:16")  # W:H
BUCKETS: dict[int, tuple[tuple[int, int], ...]] = {
    256: ((256, 256), (256, 320), (320, 256), (192, 320), (320, 192)),
    480: ((640, 640), (544, 736), (736, 544), (480, 832), (832, 480)),  # 4:3 holds DROID's 540x640 concat
    720: ((960, 960), (832, 1104), (1104, 832), (720, 1280), (1280, 720)),
}


def _check_buckets() -> None:
    for tier, buckets in BUCKETS.items():
        for h, w in buckets:
            assert h % SPATIAL_FACTOR == 0 and w % SPATIAL_FACTOR == 0, (tier, h, w)


_check_buckets()


def check_layout(layout: str, tier: int, padding: str = "reflect") -> None:
    if layout not in CAMERA_LAYOUTS:
        raise ConfigError("data.camera_layout", f"{layout!r} is not one of {list(CAMERA_LAYOUTS)}",
                          f"use one of {list(CAMERA_LAYOUTS)}")
    if int(tier) not in RESOLUTION_TIERS:
        raise ConfigError("data.resolution", f"{tier!r} is not one of {list(RESOLUTION_TIERS)}",
                          "use 0 (native), 256, 480 or 720")
    if padding not in PADDING_MODES:
        raise ConfigError("data.canvas_padding", f"{padding!r} is not one of {list(PADDING_MODES)}",
                          "use 'reflect' (the released model's canvases) or 'zero'")


def contract_padding(canvas: dict | None) -> str:
    """The padding a data contract's `canvas` entry was trained with: contracts written before the
    knob carry no key and were zero-padded."""
    return str((canvas or {}).get("padding", LEGACY_PADDING))


def nearest_bucket(height: int, width: int, tier: int) -> tuple[int, int]:
    """The tier's bucket whose H/W is nearest height/width. A plain difference of ratios, first bucket
    on ties, as the reference picks its target size (a log distance picks differently near 1:1)."""
    if tier not in BUCKETS:
        raise ConfigError("data.resolution", f"{tier!r} has no buckets", f"use one of {sorted(BUCKETS)}")
    target = height / width
    return min(BUCKETS[tier], key=lambda b: abs(b[0] / b[1] - target))


def fit_size(height: int, width: int, bucket: tuple[int, int]) -> tuple[int, int]:
    """Size of the canvas scaled to fit inside `bucket`, aspect kept, never larger than it already is
    (half rounded up, as the reference rounds)."""
    scale = min(bucket[0] / height, bucket[1] / width, 1.0)
    return (min(bucket[0], max(1, int(height * scale + 0.5))), min(bucket[1], max(1, int(width * scale + 0.5))))


def composed_size(view_shapes: Sequence[tuple[int, int]], layout: str, wrist_index: int = 0) -> tuple[int, int]:
    """(H, W) of the composed canvas before the resolution tier, for views of the given (H, W)."""
    _check_views(view_shapes, layout, wrist_index)
    if layout == "side_by_side":
        sizes = _side_by_side_sizes(view_shapes)
        return sizes[0][0], sum(w for _, w in sizes)
    h, w = view_shapes[wrist_index]
    return h + h // 2, w


def canvas_size(view_shapes: Sequence[tuple[int, int]], layout: str = "side_by_side", tier: int = 0,
                wrist_index: int = 0) -> tuple[int, int]:
    """(H, W) of the final canvas: composed, then fitted and padded to the tier's bucket."""
    check_layout(layout, tier)
    h, w = composed_size(view_shapes, layout, wrist_index)
    return (h, w) if tier == 0 else nearest_bucket(h, w, tier)


def content_size(view_shapes: Sequence[tuple[int, int]], layout: str = "side_by_side", tier: int = 0,
                 wrist_index: int = 0) -> tuple[int, int]:
    """(H, W) of the composed pixels inside the final canvas (the rest is padding)."""
    check_layout(layout, tier)
    h, w = composed_size(view_shapes, layout, wrist_index)
    return (h, w) if tier == 0 else fit_size(h, w, nearest_bucket(h, w, tier))


def _check_views(view_shapes: Sequence[tuple[int, int]], layout: str, wrist_index: int) -> None:
    if not view_shapes:
        raise DataError("data.camera_keys", "no camera views to compose", "select at least one camera")
    if layout == "side_by_side":
        return
    if len(view_shapes) != 3:
        raise DataError("data.camera_layout", f"'concat_view' needs exactly 3 cameras (1 wrist + 2 exterior), got "
                        f"{len(view_shapes)}", "set data.camera_keys to three cameras, or use 'side_by_side'")
    if not 0 <= wrist_index < 3:
        raise DataError("data.wrist_camera", f"wrist index {wrist_index} is not one of the 3 views",
                        "set data.wrist_camera to one of data.camera_keys")
    h, w = view_shapes[wrist_index]
    if h % 2 or w % 2:
        raise DataError("data.wrist_camera", f"the wrist view is {h}x{w}; 'concat_view' halves it for the exterior "
                        "views and needs an even height and width", "use cameras of even size")


def _side_by_side_sizes(view_shapes: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """(H, W) of each view once tiled: the shortest view's height, aspect kept (only ever shrinking)."""
    h = min(vh for vh, _ in view_shapes)
    return [(h, w if vh == h else max(1, round(w * h / vh))) for vh, w in view_shapes]


def _resize(frames: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """uint8 [N, H, W, 3] -> uint8 [N, h, w, 3], bilinear (antialiased when shrinking). On the CPU
    through torch's uint8 channels-last kernel (7-10x faster per window than going through float,
    within 1-2 grey levels of it: benchmarks/canvas_resize.py); elsewhere through float."""
    if tuple(frames.shape[1:3]) == tuple(size):
        return frames
    if frames.device.type != "cpu":
        return resize_through_float(frames, size)
    x = frames.permute(0, 3, 1, 2)  # NCHW view of channels-last memory
    y = F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=_shrinks(frames, size))
    return y.permute(0, 2, 3, 1).contiguous()


def resize_view(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """One uint8 [H, W, 3] camera image at `size` (H, W), resized exactly as the training canvas
    resizes its views (serving's opt-in for clients whose cameras run at another resolution)."""
    return _resize(torch.from_numpy(np.ascontiguousarray(image))[None], tuple(size))[0].numpy()


def resize_through_float(frames: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """`_resize` through float interpolation and rounding: the path off the CPU (and the reference)."""
    x = frames.permute(0, 3, 1, 2).float()
    y = F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=_shrinks(frames, size))
    return y.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def _shrinks(frames: torch.Tensor, size: tuple[int, int]) -> bool:
    return size[0] < frames.shape[1] or size[1] < frames.shape[2]


def effective_padding(content: tuple[int, int], size: tuple[int, int], padding: str = "reflect") -> str:
    """What fills a `size` canvas around `content` (H, W): "none", "zero", "reflect", or "edge" where
    reflect was asked but a pad is not smaller than the content along one side (no mirror reaches)."""
    pad_h, pad_w = size[0] - content[0], size[1] - content[1]
    if not (pad_h or pad_w):
        return "none"
    if padding == "reflect" and (pad_h >= content[0] or pad_w >= content[1]):
        return "edge"
    return padding


def pad_canvas(frames: torch.Tensor, size: tuple[int, int], padding: str = "reflect") -> torch.Tensor:
    """uint8 [N, h, w, C] -> [N, H, W, C], content top-left, padded bottom and right.

    ``reflect`` mirrors the content about its last row/column (the edge pixel is not repeated), as the
    reference's reflection padding; where a pad is not smaller than the content along either side no
    mirror reaches, so both sides are edge-replicated instead, as the reference falls back. Done by
    gathering rows then columns, so it is exact on uint8 on any device. ``zero`` pads black."""
    h, w = frames.shape[1:3]
    pad_h, pad_w = size[0] - h, size[1] - w
    if pad_h < 0 or pad_w < 0:
        raise DataError("pad_canvas", f"content {h}x{w} is larger than the canvas {size[0]}x{size[1]}",
                        "fit the content into the bucket before padding")
    if not (pad_h or pad_w):
        return frames
    if padding == "zero":  # [N, H, W, C] pads (C, W, H) from the last dim
        return F.pad(frames, (0, 0, 0, pad_w, 0, pad_h))
    if padding != "reflect":
        raise ConfigError("data.canvas_padding", f"{padding!r} is not one of {list(PADDING_MODES)}",
                          "use 'reflect' or 'zero'")
    mirror = effective_padding((h, w), size, padding) == "reflect"

    def index(n: int, total: int) -> torch.Tensor:
        i = torch.arange(total, device=frames.device)
        return torch.where(i < n, i, 2 * (n - 1) - i) if mirror else i.clamp(max=n - 1)

    out = frames.index_select(1, index(h, size[0])) if pad_h else frames
    return out.index_select(2, index(w, size[1])) if pad_w else out


def compose_frames(views: Sequence[torch.Tensor] | torch.Tensor, layout: str = "side_by_side", tier: int = 0,
                   wrist_index: int = 0, padding: str = "reflect") -> torch.Tensor:
    """Views [V][N, H, W, 3] uint8 (N time steps each) -> canvas [N, H', W', 3] uint8."""
    check_layout(layout, tier, padding)
    stacked = views if isinstance(views, torch.Tensor) else None
    views = list(views)
    for v in views:
        if not isinstance(v, torch.Tensor) or v.dtype != torch.uint8 or v.ndim != 4 or v.shape[-1] != 3:
            raise DataError("compose_frames", f"views must be uint8 tensors [N, H, W, 3], got "
                            f"{getattr(v, 'dtype', type(v).__name__)} {tuple(getattr(v, 'shape', ()))}",
                            "pass RGB uint8 frames")
    if len({v.shape[0] for v in views}) > 1:
        raise DataError("compose_frames", f"views have different frame counts {[v.shape[0] for v in views]}",
                        "pass the same time steps for every camera")
    shapes = [tuple(v.shape[1:3]) for v in views]
    _check_views(shapes, layout, wrist_index)
    if layout == "side_by_side" and stacked is not None:  # a view when the views were decoded side by side
        n, h, w, c = stacked.shape[1:]
        canvas = stacked.permute(1, 2, 0, 3, 4).reshape(n, h, len(views) * w, c)
    elif layout == "side_by_side":
        views = [_resize(v, size) for v, size in zip(views, _side_by_side_sizes(shapes))]
        canvas = views[0] if len(views) == 1 else torch.cat(views, dim=2)
    else:
        wrist = views[wrist_index]
        h, w = shapes[wrist_index]
        exterior = [v for i, v in enumerate(views) if i != wrist_index]
        left = _resize(exterior[0], (h // 2, w // 2))
        right = _resize(exterior[1], (h // 2, w - w // 2))
        canvas = torch.cat([wrist, torch.cat([left, right], dim=2)], dim=1)
    if tier == 0:
        return canvas.contiguous()
    H, W = canvas.shape[1:3]
    bucket = nearest_bucket(H, W, tier)
    fitted = _resize(canvas, fit_size(H, W, bucket))
    return pad_canvas(fitted, bucket, padding).contiguous()


def compose_canvas(images: Sequence[np.ndarray | torch.Tensor], layout: str = "side_by_side", tier: int = 0,
                   wrist_index: int = 0, padding: str = "reflect"):
    """One time step for serving: camera images [H, W, 3] uint8 (in data.camera_keys order) -> canvas
    [H', W', 3] uint8, exactly as in training. Returns numpy for numpy input, else a torch tensor.
    Serving passes the contract's padding (:func:`contract_padding`), not this default."""
    images = list(images)
    as_numpy = bool(images) and all(isinstance(im, np.ndarray) for im in images)
    views = []
    for i, im in enumerate(images):
        t = torch.from_numpy(np.ascontiguousarray(im)) if isinstance(im, np.ndarray) else im
        if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.ndim != 3 or t.shape[-1] != 3:
            raise DataError(f"compose_canvas: images[{i}]", f"must be uint8 [H, W, 3], got "
                            f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}",
                            "pass RGB uint8 images")
        views.append(t[None])
    out = compose_frames(views, layout, tier, wrist_index, padding)[0]
    return out.numpy() if as_numpy else out


def split_canvas(canvas: torch.Tensor, view_shapes: Sequence[tuple[int, int]], layout: str = "side_by_side",
                 tier: int = 0) -> list[torch.Tensor]:
    """The inverse of the composition for a generated canvas [..., H', W', 3]: one view per camera, in the
    order it was tiled, such that composing them again gives the same canvas (the world-model judge hands a
    multi-camera policy its views this way). `view_shapes` are the cameras' recorded (H, W). At tier 0 with
    views of one height these are the views themselves; otherwise they are the views as tiled (shrunk to the
    common height and to the tier's bucket), which compose back without further resizing. Side by side only:
    `concat_view` shrinks its exterior views, which do not compose back to the same pixels."""
    check_layout(layout, int(tier))
    if layout != "side_by_side":
        raise DataError("data.camera_layout", f"a {layout!r} canvas cannot be split back into camera views",
                        "train the world model and the policies with camera_layout = 'side_by_side'")
    h, w = content_size(view_shapes, layout, int(tier))
    expected = canvas_size(view_shapes, layout, int(tier))
    if tuple(canvas.shape[-3:-1]) != tuple(expected):
        raise DataError("split_canvas", f"the canvas is {tuple(canvas.shape[-3:-1])}, views {list(view_shapes)} compose to "
                        f"{expected}", "pass the view sizes of the cameras the canvas was composed from")
    widths = [vw for _, vw in _side_by_side_sizes(view_shapes)]
    edges = np.rint(np.cumsum([0, *widths]) * (w / sum(widths))).astype(int)
    return [canvas[..., :h, a:b, :] for a, b in zip(edges[:-1], edges[1:])]


class CanvasTransform:
    """video [V, T+1, H, W, 3] uint8 (or a list of V [T+1, H_v, W_v, 3] for cameras of different sizes)
    -> [T+1, H', W', 3] uint8 with a fixed layout and tier.

    The default (side_by_side, native) is the plain left-to-right tiling."""

    def __init__(self, layout: str = "side_by_side", tier: int = 0, wrist_index: int = 0, padding: str = "reflect"):
        check_layout(layout, int(tier), padding)
        self.layout, self.tier, self.wrist_index, self.padding = layout, int(tier), int(wrist_index), padding

    @classmethod
    def from_config(cls, data_cfg, camera_keys: Sequence[str]) -> "CanvasTransform":
        """From DataConfig: `wrist_camera` names one of `camera_keys` (required for concat_view)."""
        layout = getattr(data_cfg, "camera_layout", "side_by_side")
        tier = int(getattr(data_cfg, "resolution", 0))
        wrist = getattr(data_cfg, "wrist_camera", "")
        padding = getattr(data_cfg, "canvas_padding", "reflect")
        check_layout(layout, tier, padding)
        index = 0
        if layout == "concat_view":
            if not wrist:
                raise ConfigError("data.wrist_camera", "is empty while data.camera_layout = 'concat_view'",
                                  f"name the wrist camera, one of {list(camera_keys)}")
            if wrist not in camera_keys:
                raise ConfigError("data.wrist_camera", f"{wrist!r} is not one of the selected cameras "
                                  f"{list(camera_keys)}", "name one of data.camera_keys")
            index = list(camera_keys).index(wrist)
        return cls(layout, tier, index, padding)

    @classmethod
    def from_state_dict(cls, state: dict | None) -> "CanvasTransform":
        """From a data contract's `canvas` entry; one without `padding` predates it and was zero-padded."""
        state = state or {}
        return cls(state.get("camera_layout", "side_by_side"), int(state.get("resolution", 0)),
                   int(state.get("wrist_index", 0)), contract_padding(state))

    def size(self, view_shapes: Sequence[tuple[int, int]]) -> tuple[int, int]:
        return canvas_size(view_shapes, self.layout, self.tier, self.wrist_index)

    def content_size(self, view_shapes: Sequence[tuple[int, int]]) -> tuple[int, int]:
        return content_size(view_shapes, self.layout, self.tier, self.wrist_index)

    def __call__(self, video: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
        return compose_frames(video, self.layout, self.tier, self.wrist_index, self.padding)

    def state_dict(self) -> dict:
        return {"camera_layout": self.layout, "resolution": self.tier, "wrist_index": self.wrist_index,
                "padding": self.padding}
