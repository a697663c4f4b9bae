"""The camera size a served policy accepts: the training cameras' (the data contract's `camera_sizes`).

An image of another size would still run (the canvas composes whatever it gets), but the model would
see the scene at a scale, crop or token count it never trained on, and act on it without a word. So
the default is to refuse it, naming the camera, both sizes and the fix: a mis-set camera resolution
is found at the first request, not in the robot's behaviour. `wamkit serve --resize-images` opts in
to resizing each view to its training size with the training canvas's own resize (bilinear,
antialiased when shrinking), for clients whose cameras cannot be set to the training size."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from wamkit.serve.protocol import ProtocolError


def contract_sizes(contract: dict, camera_keys: Sequence[str]) -> list[tuple[int, int]] | None:
    """(H, W) per camera from the data contract; None for a run trained before it recorded them."""
    sizes = contract.get("camera_sizes")
    return [tuple(int(v) for v in s) for s in sizes] if sizes and len(sizes) == len(camera_keys) else None


def fit_camera_sizes(image, where: str, camera_keys: Sequence[str], sizes: list[tuple[int, int]] | None,
                     resize: bool) -> object:
    """`image` as the request gave it (a list of [H, W, 3] views, or one [H, W, 3] / [V, H, W, 3]
    array) with every view at its camera's training size: unchanged when it already is, resized when
    `resize`, else a ProtocolError. Shapes it cannot read pass through for the policy to refuse."""
    views = _as_views(image)
    if sizes is None or views is None or len(views) != len(sizes):
        return image
    wrong = [i for i, (view, size) in enumerate(zip(views, sizes)) if tuple(view.shape[:2]) != size]
    if not wrong:
        return image
    if resize:
        from wamkit.data.canvas import resize_view

        return [resize_view(view, size) if i in wrong else view for i, (view, size) in enumerate(zip(views, sizes))]
    i = wrong[0]
    (h, w), (got_h, got_w) = sizes[i], views[i].shape[:2]
    name = f"{where}[{camera_keys[i]!r}]" if isinstance(image, list) else where
    raise ProtocolError(name, f"is {got_h}x{got_w}; camera {camera_keys[i]!r} was trained at {h}x{w} (HxW)",
                        f"send {h}x{w} images (set the camera or resize on the client), or start the server with "
                        "--resize-images to resize them as the training canvas does")


def _as_views(image) -> list[np.ndarray] | None:
    if isinstance(image, list) and all(isinstance(v, np.ndarray) and v.ndim == 3 for v in image):
        return image
    if isinstance(image, np.ndarray) and image.ndim in (3, 4) and image.shape[-1] == 3 and image.dtype == np.uint8:
        return [image] if image.ndim == 3 else list(image)
    return None
