"""Pack many samples into the ONE joint sequence that diffusers' Cosmos3OmniTransformer.forward takes.

Layout: every sample's text tokens first (the causal "understanding" prefix), then every sample's
generation tokens (video patches, then action rows). Each token carries its sample id, and
`PackedAttention` masks across samples: text is causal inside its own sample; a sample's generation
tokens see only that sample's text and generation tokens. mRoPE positions are built per sample,
exactly as for a lone sample, so a packed forward equals per-sample forwards. This module is the layout
(pure data); the processors are `wamkit.model.attention` and `wamkit.model.flex_attention`, the backend
choice `wamkit.model.attention_backends`."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch

from wamkit.model.tokenizer import TEMPORAL_FACTOR


@dataclass
class SequenceSample:
    """One sample's generation inputs, already noised (clean positions hold clean values)."""

    text_ids: list[int]
    video: torch.Tensor  # [C, t, h, w] latents
    actions: torch.Tensor | None  # [L, D] rows (optional clean state row first, then actions)
    clean_video_frames: list[int]
    clean_action_rows: list[int]
    sigma: float  # noise level of this sample's noisy tokens, in [0, 1] (its action rows': action_sigma when set)
    domain_id: int = 0
    fps: float = 24.0
    action_start_frame: int = 1  # pixel frame of the first action row (0 when a state row leads)
    # Block-causal generation (teacher forcing / chunk-autoregressive): 0 = bidirectional. K > 0 groups
    # latent frames into chunks (frame 0 alone is chunk 0, then K frames per chunk); a generation token
    # attends only to generation tokens of its own and earlier chunks (and to its sample's text). An
    # action row belongs to the chunk of the latent frame of the pixel frame it leads into.
    causal_chunk_frames: int = 0
    action_sigma: float | None = None  # the noisy action rows' own level (diffusion.action_sigma); None: sigma

    def frame_chunk_ids(self) -> list[int]:
        """Chunk id of every latent frame (all 0 when bidirectional)."""
        k = self.causal_chunk_frames
        return [0 if (k <= 0 or f == 0) else 1 + (f - 1) // k for f in range(self.video.shape[1])]

    def noisy_video_frames(self) -> list[int]:
        return [f for f in range(self.video.shape[1]) if f not in set(self.clean_video_frames)]

    def noisy_action_rows(self) -> list[int]:
        if self.actions is None:
            return []
        return [r for r in range(self.actions.shape[0]) if r not in set(self.clean_action_rows)]


@dataclass
class PackedBatch:
    forward_kwargs: dict
    und_sample_ids: torch.Tensor  # [und_len]
    gen_sample_ids: torch.Tensor  # [sequence_length - und_len]
    num_samples: int
    vision_noisy_frames: list[list[int]] = field(default_factory=list)
    action_noisy_rows: list[list[int]] = field(default_factory=list)
    gen_chunk_ids: torch.Tensor | None = None  # [sequence_length - und_len]; None = bidirectional
    layout_key: tuple = ()  # equal keys <=> equal positions, indexes and masks
    merged: bool = False  # one vision item and one action item for all samples (pack_samples' `merge`)

    def vision_items(self, videos) -> list[torch.Tensor]:
        """The forward's `vision_tokens` from every sample's [C, t, h, w] latents: a list, or when
        merged also one [B, C, t, h, w] tensor."""
        if not self.merged:
            return [v.unsqueeze(0) for v in videos]
        return [_merged_video(videos)]

    def action_items(self, actions) -> list[torch.Tensor]:
        """The forward's `action_tokens` from every sample's [L, D] rows (a list, or when merged also [B, L, D])."""
        if not self.merged:
            return list(actions)
        return [_merged_rows(actions)]

    def video_outputs(self, out) -> torch.Tensor:
        """The forward's video predictions as one [B, C, t, h, w] tensor (a view when merged; zeros
        at clean frames, as diffusers returns them). Unmerged, the samples must share one shape."""
        if not self.merged:
            return torch.stack([v[0] for v in out.sample])
        merged = out.sample[0][0]  # [C, B*t, h, w]
        c, bt, h, w = merged.shape
        return merged.view(c, self.num_samples, bt // self.num_samples, h, w).transpose(0, 1)

    def action_outputs(self, out) -> torch.Tensor:
        """The forward's action predictions as one [B, L, D] tensor (see video_outputs)."""
        if not self.merged:
            return torch.stack(list(out.action))
        rows = out.action[0]
        return rows.view(self.num_samples, rows.shape[0] // self.num_samples, rows.shape[1])


@functools.lru_cache(maxsize=4096)
def text_positions(num_tokens: int) -> torch.Tensor:
    """Text shares one increasing id on all three mRoPE axes."""
    return torch.arange(num_tokens, dtype=torch.float32).expand(3, -1)


@functools.lru_cache(maxsize=4096)  # a pack repeats a few layouts; callers only read (torch.cat copies)
def grid_positions(
    grid_t: int, grid_h: int, grid_w: int, temporal_offset: float, fps: float | None, base_fps: float,
    temporal_compression: int, base_temporal_compression: int, start_frame: int = 0,
) -> torch.Tensor:
    """mRoPE ids of a (t, h, w) token grid; with fps modulation the temporal axis is rescaled so
    that one second spans the same positions whatever the recording rate."""
    frames = torch.arange(grid_t, dtype=torch.float32) + start_frame
    if fps is not None and grid_t > 1:
        frames = frames / (fps / temporal_compression) * (base_fps / base_temporal_compression)
    t = (frames + temporal_offset).view(-1, 1).expand(-1, grid_h * grid_w).flatten()
    h = torch.arange(grid_h, dtype=torch.float32).view(1, -1, 1).expand(grid_t, -1, grid_w).flatten()
    w = torch.arange(grid_w, dtype=torch.float32).view(1, 1, -1).expand(grid_t, grid_h, -1).flatten()
    return torch.stack([t, h, w])


TEXT_PAD_MULTIPLE = 128  # one flex-attention tile


def text_padding(text_lengths: list[int], multiple: int) -> int:
    """Filler tokens that round the pack's text up to a multiple of `multiple` (0: no padding)."""
    total = sum(text_lengths)
    return 0 if multiple <= 0 else -total % multiple


def pack_samples(samples: list[SequenceSample], config, text_multiple: int = 0, merge: bool = False) -> PackedBatch:
    """Build the forward kwargs of one packed sequence. `config` is the transformer's config.

    `text_multiple` > 0 rounds the text prefix up to a multiple of it with filler tokens that form a
    sample of their own (text only: they attend to each other, nothing attends to them), so the
    outputs of real samples are unchanged. Packs of prompts of different lengths then share a few
    sequence lengths, which is what compiled layers (guarded on exact shapes) and compiled flex
    attention need to avoid recompiling every step.

    `merge`: when every sample has one generation layout (grid, action rows, clean sets, domain; the
    texts may differ), diffusers' forward gets them as ONE vision item of B x t frames and ONE action
    item of B x L rows. Its patchify, timestep-embedding, head and unpatchify code loops over items,
    ~100 kernels a sample forward and backward that left a medium MT10 step host-bound on an H200;
    merged it runs once. Tokens, order and outputs are the same (the frames of sample b are frames
    b*t..b*t+t-1 of the item); read the outputs with PackedBatch.video_outputs / action_outputs."""
    p = config.latent_patch_size
    margin = config.unified_3d_mrope_temporal_modality_margin
    fps_mod = config.enable_fps_modulation
    base_fps = float(config.base_fps)
    filler = text_padding([len(s.text_ids) for s in samples], text_multiple)
    und_len = sum(len(s.text_ids) for s in samples) + filler
    device = samples[0].video.device

    input_ids, und_runs, gen_runs = [], [], []  # runs: (sample id, token count), expanded at the end
    text_pos, gen_pos = [], []
    vision_seq, vision_loss, vision_shapes, vision_noisy, vision_t = [], [], [], [], []
    action_seq, action_loss, action_shapes, action_noisy, action_t, domains = [], [], [], [], [], []
    cursor = und_len
    chunk_ids: list[torch.Tensor] = []
    for i, s in enumerate(samples):
        n_text = len(s.text_ids)
        input_ids.extend(s.text_ids)
        und_runs.append((i, n_text))
        text_pos.append(text_positions(n_text))
        offset = n_text + margin
        _, t, h, w = s.video.shape
        grid = (t, math.ceil(h / p), math.ceil(w / p))
        per_frame = grid[1] * grid[2]
        n_vision = t * per_frame
        vision_seq.append(torch.arange(cursor, cursor + n_vision))
        noisy = torch.tensor(s.noisy_video_frames(), dtype=torch.long)
        vision_noisy.append(noisy)
        # every token of every noisy frame, frame by frame: built as tensors (a Python int per token cost
        # ~10 ms a step at 64 samples of 1,280 video tokens)
        vision_loss.append((cursor + noisy[:, None] * per_frame + torch.arange(per_frame)).flatten())
        vision_t.append(torch.full((len(noisy) * per_frame,), s.sigma * 1000.0, dtype=torch.float32))
        vision_shapes.append(grid)
        gen_pos.append(grid_positions(*grid, offset, s.fps if fps_mod else None, base_fps, TEMPORAL_FACTOR, TEMPORAL_FACTOR))
        frame_chunk = s.frame_chunk_ids()
        chunk_ids.append(torch.tensor(frame_chunk, dtype=torch.long).repeat_interleave(per_frame))
        cursor += n_vision
        n_gen = n_vision
        if s.actions is not None:
            _check_domain(i, s.domain_id, getattr(config, "num_embodiment_domains", None))
            n_act = s.actions.shape[0]
            rows = s.noisy_action_rows()
            action_seq.append(torch.arange(cursor, cursor + n_act))
            action_loss.extend(cursor + r for r in rows)
            action_noisy.append(torch.tensor(rows, dtype=torch.long))
            action_t.extend([(s.sigma if s.action_sigma is None else s.action_sigma) * 1000.0] * len(rows))
            action_shapes.append((n_act, 1, 1))
            domains.append(torch.tensor(s.domain_id, dtype=torch.long))
            gen_pos.append(grid_positions(n_act, 1, 1, offset, s.fps if fps_mod else None, base_fps, 1, TEMPORAL_FACTOR, s.action_start_frame))
            pixel = [s.action_start_frame + r for r in range(n_act)]  # latent frame of pixel frame p: ceil(p / 4)
            chunk_ids.append(torch.tensor([frame_chunk[min((p + TEMPORAL_FACTOR - 1) // TEMPORAL_FACTOR, t - 1)] for p in pixel], dtype=torch.long))
            cursor += n_act
            n_gen += n_act
        gen_runs.append((i, n_gen))
    if filler:  # after every real sample's text, so each sample's text keeps its place and positions
        input_ids.extend([0] * filler)
        und_runs.append((len(samples), filler))
        text_pos.append(text_positions(filler))

    has_actions = bool(action_seq)
    if has_actions and len(action_seq) != len(samples):
        raise ValueError("either every sample in a packed batch has actions or none does")

    def up(values, dtype=torch.long) -> torch.Tensor:  # host -> device without a blocking copy (a stream sync each)
        host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
        return host.to(device, non_blocking=True)

    kwargs = dict(
        input_ids=up(input_ids),
        text_indexes=torch.arange(und_len, dtype=torch.long, device=device),
        position_ids=up(torch.cat(text_pos + gen_pos, dim=1)),
        und_len=und_len,
        sequence_length=cursor,
        vision_tokens=[s.video.unsqueeze(0) for s in samples],
        vision_token_shapes=vision_shapes,
        vision_sequence_indexes=up(torch.cat(vision_seq)),
        vision_mse_loss_indexes=up(torch.cat(vision_loss)),
        vision_timesteps=up(torch.cat(vision_t)),
        vision_noisy_frame_indexes=_on_device(vision_noisy, device),
    )
    if has_actions:
        kwargs.update(
            action_tokens=[s.actions for s in samples],
            action_token_shapes=action_shapes,
            action_sequence_indexes=up(torch.cat(action_seq)),
            action_mse_loss_indexes=up(action_loss),
            action_timesteps=up(action_t, torch.float32),
            action_noisy_frame_indexes=_on_device(action_noisy, device),
            action_domain_ids=_on_device([d.reshape(1) for d in domains], device, shape=()),
        )
    merged = merge and mergeable(samples)
    if merged:
        kwargs.update(_merged_items(samples, kwargs, has_actions))
    return PackedBatch(
        merged=merged,
        forward_kwargs=kwargs,
        und_sample_ids=up(_expand_runs(und_runs)),
        gen_sample_ids=up(_expand_runs(gen_runs)),
        num_samples=len(samples),
        vision_noisy_frames=[v.tolist() for v in vision_noisy],
        action_noisy_rows=[a.tolist() for a in action_noisy],
        gen_chunk_ids=up(torch.cat(chunk_ids)) if any(s.causal_chunk_frames > 0 for s in samples) else None,
        layout_key=(str(device), *(_layout_of(s) for s in samples), *((("filler", filler),) if filler else ())),
    )


def mergeable(samples: list[SequenceSample]) -> bool:
    """Every sample has the same generation layout and action domain (only the texts may differ)."""
    first = _layout_of(samples[0])[1:], samples[0].domain_id
    return all((_layout_of(s)[1:], s.domain_id) == first for s in samples[1:])


def _merged_items(samples: list[SequenceSample], kwargs: dict, has_actions: bool) -> dict:
    """The per-item forward kwargs of mergeable samples as one vision item (and one action item):
    frame f of sample b is frame b*t + f, row r is row b*L + r."""
    b, t = len(samples), samples[0].video.shape[1]
    grid = kwargs["vision_token_shapes"][0]
    offsets = torch.arange(b, device=kwargs["vision_noisy_frame_indexes"][0].device)[:, None]
    out = dict(
        vision_tokens=[_merged_video([s.video for s in samples])],
        vision_token_shapes=[(b * grid[0], grid[1], grid[2])],
        vision_noisy_frame_indexes=[(kwargs["vision_noisy_frame_indexes"][0] + offsets * t).flatten()],
    )
    if has_actions:
        rows = samples[0].actions.shape[0]
        out.update(
            action_tokens=[_merged_rows([s.actions for s in samples])],
            action_token_shapes=[(b * rows, 1, 1)],
            action_noisy_frame_indexes=[(kwargs["action_noisy_frame_indexes"][0] + offsets * rows).flatten()],
            action_domain_ids=kwargs["action_domain_ids"][:1],
        )
    return out


def _merged_video(videos) -> torch.Tensor:
    """Every sample's [C, t, h, w] latents (a list or one [B, C, t, h, w] tensor) as one [1, C, B*t, h, w] item."""
    stacked = videos.transpose(0, 1) if isinstance(videos, torch.Tensor) else torch.stack(list(videos), dim=1)
    c, b, t, h, w = stacked.shape
    return stacked.reshape(1, c, b * t, h, w)


def _merged_rows(actions) -> torch.Tensor:
    """Every sample's [L, D] rows (a list or one [B, L, D] tensor) as one [B*L, D] item."""
    stacked = actions if isinstance(actions, torch.Tensor) else torch.stack(list(actions))
    return stacked.reshape(-1, stacked.shape[-1])


def _expand_runs(runs: list[tuple[int, int]]) -> torch.Tensor:
    """[(id, n), ...] -> the ids, each repeated n times (long), without a Python int per token."""
    if not runs:
        return torch.zeros(0, dtype=torch.long)
    ids, counts = zip(*runs)
    return torch.repeat_interleave(torch.tensor(ids, dtype=torch.long), torch.tensor(counts, dtype=torch.long))


def _on_device(tensors: list[torch.Tensor], device, shape: tuple | None = None) -> list[torch.Tensor]:
    """Small per-sample index tensors moved in one host-to-device copy and split there (views): one
    copy per step instead of one per sample. `shape` reshapes each piece (() for scalars)."""
    if not tensors:
        return []
    pieces = torch.cat(tensors).to(device, non_blocking=True).split([len(t) for t in tensors])
    return [p.reshape(shape) for p in pieces] if shape is not None else list(pieces)


def _check_domain(i: int, domain_id: int, num_domains: int | None) -> None:
    """On the host, before anything is on the GPU: the action heads' own check reads the ids back
    from the device (a sync per head), which CUDA graphs of the whole forward skip."""
    if num_domains is not None and not 0 <= int(domain_id) < int(num_domains):
        raise ValueError(f"sample {i}: domain_id {domain_id} is outside the model's [0, {num_domains}) action domains; "
                         "use the domain id the run trained with (its data contract's domain_id)")


def _layout_of(s: SequenceSample) -> tuple:
    n_act = None if s.actions is None else s.actions.shape[0]
    return (len(s.text_ids), tuple(s.video.shape[1:]), n_act, s.causal_chunk_frames, s.action_start_frame, s.fps,
            tuple(s.clean_video_frames), tuple(s.clean_action_rows))
