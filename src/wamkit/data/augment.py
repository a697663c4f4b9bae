"""Train-time image augmentation: a random shift of each clip (`data.random_shift_px`).

A policy trained from scratch on a few dozen object placements per task learns where things are from
very few images; shifting each training clip by a few pixels (edge pixels repeated, as padding and a
random crop back to the same size would) is the standard regulariser for that (DrQ's random shift,
Diffusion Policy's random crop). Every frame of a clip moves by the same offset, so the future video a
world-action model predicts stays consistent with its observed frame, and the actions are untouched.
Evaluation and serving never shift.

The offsets are drawn from each sample's own generator (wamkit.diffusion.objective), so they are a
function of (seed, global sample position): N ranks draw what one rank draws and a resumed run
repeats them.
"""

from __future__ import annotations

import torch


def seam_note(max_px: int, num_views: int) -> str | None:
    """What a shift of the composed canvas does to several cameras: at each seam up to `max_px` pixels of
    one view move into its neighbour (the clip is shifted as one image, not view by view). None when
    nothing crosses a seam."""
    if max_px <= 0 or num_views <= 1:
        return None
    return (f"data.random_shift_px = {max_px} shifts the canvas of {num_views} cameras as one image: at each seam up "
            f"to {max_px} px of one view move into its neighbour (views are not shifted one by one)")


def draw_shifts(max_px: int, generators: list[torch.Generator]) -> torch.Tensor:
    """[B, 2] long offsets (dy, dx), each uniform in [-max_px, max_px], one pair from each sample's generator."""
    return torch.stack([torch.randint(-max_px, max_px + 1, (2,), generator=g) for g in generators])


def shift_clips(videos: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """`videos` [B, T, H, W, C] with clip b moved by shifts[b] = (dy, dx) pixels: out[b, t, y, x] =
    videos[b, t, clamp(y + dy), clamp(x + dx)] (content moves up/left for positive offsets, the uncovered
    border repeats the edge: a replicate pad and a crop back to H x W). One gather for the batch, on
    whatever device the clips are."""
    b, _, height, width, _ = videos.shape
    shifts = shifts.to(videos.device, non_blocking=True)
    rows = (torch.arange(height, device=videos.device)[None] + shifts[:, :1]).clamp_(0, height - 1)  # [B, H]
    cols = (torch.arange(width, device=videos.device)[None] + shifts[:, 1:]).clamp_(0, width - 1)  # [B, W]
    batch = torch.arange(b, device=videos.device)[:, None, None]
    # advanced indices around the time slice put their broadcast dims first: [B, H, W, T, C]
    return videos[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2, 4)
