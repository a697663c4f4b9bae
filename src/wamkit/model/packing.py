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
        return frame_chunk_ids(self.video.shape[1], self.causal_chunk_frames)

    def noisy_video_frames(self) -> list[int]:
        return noisy_positions(self.video.shape[1], self.clean_video_frames)

    def noisy_action_rows(self) -> list[int]:
        return [] if self.actions is None else noisy_positions(self.actions.shape[0], self.clean_action_rows)


def frame_chunk_ids(num_frames: int, causal_chunk_frames: int) -> list[int]:
    """Chunk id of each of `num_frames` latent frames: frame 0 alone, then K frames a chunk (all 0 when K <= 0)."""
    k = causal_chunk_frames
    return [0 if (k <= 0 or f == 0) else 1 + (f - 1) // k for f in range(num_frames)]


def noisy_positions(count: int, clean) -> list[int]:
    """The positions in range(count) that are not clean."""
    clean = set(clean)
    return [i for i in range(count) if i not in clean]


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
    params = _PackParams(config.latent_patch_size, config.unified_3d_mrope_temporal_modality_margin,
                         bool(config.enable_fps_modulation), float(config.base_fps))
    filler = text_padding([len(s.text_ids) for s in samples], text_multiple)
    und_len = sum(len(s.text_ids) for s in samples) + filler
    device = samples[0].video.device
    keys = [_layout_of(s) for s in samples]
    layouts = [_sample_layout(key, params) for key in keys]
    has_actions = layouts[0].n_act is not None
    if any((lay.n_act is not None) != has_actions for lay in layouts):
        raise ValueError("either every sample in a packed batch has actions or none does")
    # Per sample only Python bookkeeping: every position and index tensor below is one of the layout's
    # cached pieces or one batched op, so the host's work per step does not grow with ~40 tensor ops a
    # sample (at batch 256 those held an MT10 step on an H200 host-bound).
    input_ids, und_runs, gen_runs, text_pos, gen_pos = [], [], [], [], []
    vision_starts, action_starts = [], []
    cursor = und_len
    for i, (s, lay) in enumerate(zip(samples, layouts)):
        input_ids.extend(s.text_ids)
        und_runs.append((i, lay.n_text))
        text_pos.append(text_positions(lay.n_text))
        gen_pos.append(lay.gen_pos)
        vision_starts.append(cursor)
        cursor += lay.n_vision
        if has_actions:
            _check_domain(i, s.domain_id, getattr(config, "num_embodiment_domains", None))
            action_starts.append(cursor)
            cursor += lay.n_act
        gen_runs.append((i, lay.n_gen))
    if filler:  # after every real sample's text, so each sample's text keeps its place and positions
        input_ids.extend([0] * filler)
        und_runs.append((len(samples), filler))
        text_pos.append(text_positions(filler))

    def up(values, dtype=torch.long) -> torch.Tensor:  # host -> device without a blocking copy (a stream sync each)
        host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
        return host.to(device, non_blocking=True)

    merged = merge and mergeable(samples, keys)
    kwargs = dict(
        input_ids=up(input_ids),
        text_indexes=torch.arange(und_len, dtype=torch.long, device=device),
        position_ids=up(torch.cat(text_pos + gen_pos, dim=1)),
        und_len=und_len,
        sequence_length=cursor,
        vision_tokens=None if merged else [s.video.unsqueeze(0) for s in samples],
        vision_token_shapes=[lay.grid for lay in layouts],
        vision_sequence_indexes=up(_offset_pieces([lay.vision_range for lay in layouts], vision_starts)),
        vision_mse_loss_indexes=up(_offset_pieces([lay.vision_loss for lay in layouts], vision_starts)),
        vision_timesteps=up(_repeat([s.sigma * 1000.0 for s in samples], [len(lay.vision_loss) for lay in layouts])),
        vision_noisy_frame_indexes=_on_device([lay.noisy_frames_t for lay in layouts], device),
    )
    if has_actions:
        action_sigmas = [(s.sigma if s.action_sigma is None else s.action_sigma) * 1000.0 for s in samples]
        kwargs.update(
            action_tokens=None if merged else [s.actions for s in samples],
            action_token_shapes=[(lay.n_act, 1, 1) for lay in layouts],
            action_sequence_indexes=up(_offset_pieces([lay.action_range for lay in layouts], action_starts)),
            action_mse_loss_indexes=up(_offset_pieces([lay.noisy_rows_t for lay in layouts], action_starts)),
            action_timesteps=up(_repeat(action_sigmas, [len(lay.noisy_rows) for lay in layouts])),
            action_noisy_frame_indexes=_on_device([lay.noisy_rows_t for lay in layouts], device),
            action_domain_ids=list(up([s.domain_id for s in samples]).unbind()),
        )
    if merged:
        kwargs.update(_merged_items(samples, kwargs, has_actions))
    return PackedBatch(
        merged=merged,
        forward_kwargs=kwargs,
        und_sample_ids=up(_expand_runs(und_runs)),
        gen_sample_ids=up(_expand_runs(gen_runs)),
        num_samples=len(samples),
        vision_noisy_frames=[list(lay.noisy_frames) for lay in layouts],
        action_noisy_rows=[list(lay.noisy_rows) for lay in layouts] if has_actions else [],
        gen_chunk_ids=up(torch.cat([lay.chunk_ids for lay in layouts])) if any(s.causal_chunk_frames > 0 for s in samples) else None,
        layout_key=(str(device), *keys, *((("filler", filler),) if filler else ())),
    )


@dataclass(frozen=True)
class _PackParams:
    """The transformer config's numbers that positions depend on (hashable: a layout cache key)."""

    patch: int
    margin: float
    fps_modulation: bool
    base_fps: float


@dataclass(frozen=True, eq=False)
class _SampleLayout:
    """One sample's generation layout: its positions and indexes relative to its own first token. Shared
    (read only) by every sample of the same layout; pack_samples offsets the indexes in one op a batch."""

    n_text: int
    grid: tuple[int, int, int]
    n_vision: int
    noisy_frames: tuple[int, ...]
    noisy_frames_t: torch.Tensor  # long
    vision_range: torch.Tensor  # arange(n_vision)
    vision_loss: torch.Tensor  # every token of every noisy frame, frame by frame
    n_act: int | None
    noisy_rows: tuple[int, ...]
    noisy_rows_t: torch.Tensor  # long; also the action loss indexes relative to the first row
    action_range: torch.Tensor  # arange(n_act)
    gen_pos: torch.Tensor  # [3, n_vision + n_act] mRoPE ids (video grid, then action rows)
    chunk_ids: torch.Tensor  # [n_vision + n_act] block-causal chunk of every generation token

    @property
    def n_gen(self) -> int:
        return self.n_vision + (self.n_act or 0)


@functools.lru_cache(maxsize=4096)
def _sample_layout(key: tuple, params: _PackParams) -> _SampleLayout:
    """The layout of `_layout_of(sample)` (text length, latent shape, action rows, causal chunking, first
    action frame, fps, clean frames, clean rows), built once per process."""
    n_text, (t, h, w), n_act, causal, action_start, fps, clean_frames, clean_rows = key
    grid = (t, math.ceil(h / params.patch), math.ceil(w / params.patch))
    per_frame = grid[1] * grid[2]
    offset = n_text + params.margin
    fps = fps if params.fps_modulation else None
    noisy = tuple(noisy_positions(t, clean_frames))
    noisy_t = torch.tensor(noisy, dtype=torch.long)
    frame_chunk = frame_chunk_ids(t, causal)
    pos = [grid_positions(*grid, offset, fps, params.base_fps, TEMPORAL_FACTOR, TEMPORAL_FACTOR)]
    chunks = [torch.tensor(frame_chunk, dtype=torch.long).repeat_interleave(per_frame)]
    rows: tuple[int, ...] = ()
    if n_act is not None:
        rows = tuple(noisy_positions(n_act, clean_rows))
        pos.append(grid_positions(n_act, 1, 1, offset, fps, params.base_fps, 1, TEMPORAL_FACTOR, action_start))
        pixel = [action_start + r for r in range(n_act)]  # latent frame of pixel frame p: ceil(p / 4)
        chunks.append(torch.tensor([frame_chunk[min((q + TEMPORAL_FACTOR - 1) // TEMPORAL_FACTOR, t - 1)] for q in pixel], dtype=torch.long))
    return _SampleLayout(
        n_text=n_text, grid=grid, n_vision=t * per_frame, noisy_frames=noisy, noisy_frames_t=noisy_t,
        vision_range=torch.arange(t * per_frame), vision_loss=(noisy_t[:, None] * per_frame + torch.arange(per_frame)).flatten(),
        n_act=n_act, noisy_rows=rows, noisy_rows_t=torch.tensor(rows, dtype=torch.long),
        action_range=torch.arange(n_act or 0), gen_pos=torch.cat(pos, dim=1), chunk_ids=torch.cat(chunks),
    )


def _offset_pieces(pieces: list[torch.Tensor], starts: list[int]) -> torch.Tensor:
    """cat(piece_i + start_i): each sample's relative indexes moved to its place in the sequence, in a
    few ops for the whole batch."""
    if not pieces:
        return torch.zeros(0, dtype=torch.long)
    counts = torch.tensor([len(x) for x in pieces], dtype=torch.long)
    return torch.cat(pieces) + torch.repeat_interleave(torch.tensor(starts, dtype=torch.long), counts)


def _repeat(values: list[float], counts: list[int]) -> torch.Tensor:
    """float32 [sum(counts)]: values[i] repeated counts[i] times."""
    return torch.repeat_interleave(torch.tensor(values, dtype=torch.float32), torch.tensor(counts, dtype=torch.long))


def mergeable(samples: list[SequenceSample], keys: list[tuple] | None = None) -> bool:
    """Every sample has the same generation layout and action domain (only the texts may differ).
    `keys`: the samples' `_layout_of`, when the caller has them."""
    keys = keys or [_layout_of(s) for s in samples]
    first = keys[0][1:], samples[0].domain_id
    return all((key[1:], s.domain_id) == first for key, s in zip(keys[1:], samples[1:]))


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
