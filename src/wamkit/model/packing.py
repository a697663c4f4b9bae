"""Pack many samples into the ONE joint sequence that diffusers' Cosmos3OmniTransformer.forward takes.

Layout: every sample's text tokens first (the causal "understanding" prefix), then every sample's
generation tokens (video patches, then action rows). Each token carries its sample id, and
`PackedAttention` masks across samples: text is causal inside its own sample; a sample's generation
tokens see only that sample's text and generation tokens. mRoPE positions are built per sample,
exactly as for a lone sample, so a packed forward equals per-sample forwards."""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from wamkit.model.tokenizer import TEMPORAL_FACTOR


@dataclass
class SequenceSample:
    """One sample's generation inputs, already noised (clean positions hold clean values)."""

    text_ids: list[int]
    video: torch.Tensor  # [C, t, h, w] latents
    actions: torch.Tensor | None  # [L, D] rows (optional clean state row first, then actions)
    clean_video_frames: list[int]
    clean_action_rows: list[int]
    sigma: float  # noise level of this sample's noisy tokens, in [0, 1]
    domain_id: int = 0
    fps: float = 24.0
    action_start_frame: int = 1  # pixel frame of the first action row (0 when a state row leads)
    # Block-causal generation (teacher forcing / chunk-autoregressive): 0 = bidirectional. K > 0 groups
    # latent frames into chunks (frame 0 alone is chunk 0, then K frames per chunk); a generation token
    # attends only to generation tokens of its own and earlier chunks (and to its sample's text). An
    # action row belongs to the chunk of the latent frame of the pixel frame it leads into.
    causal_chunk_frames: int = 0

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


def text_positions(num_tokens: int) -> torch.Tensor:
    """Text shares one increasing id on all three mRoPE axes."""
    return torch.arange(num_tokens, dtype=torch.float32).expand(3, -1)


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


def pack_samples(samples: list[SequenceSample], config, text_multiple: int = 0) -> PackedBatch:
    """Build the forward kwargs of one packed sequence. `config` is the transformer's config.

    `text_multiple` > 0 rounds the text prefix up to a multiple of it with filler tokens that form a
    sample of their own (text only: they attend to each other, nothing attends to them), so the
    outputs of real samples are unchanged. Packs of prompts of different lengths then share a few
    sequence lengths, which is what compiled layers (guarded on exact shapes) and compiled flex
    attention need to avoid recompiling every step."""
    p = config.latent_patch_size
    margin = config.unified_3d_mrope_temporal_modality_margin
    fps_mod = config.enable_fps_modulation
    base_fps = float(config.base_fps)
    filler = text_padding([len(s.text_ids) for s in samples], text_multiple)
    und_len = sum(len(s.text_ids) for s in samples) + filler
    device = samples[0].video.device

    input_ids, und_ids, gen_ids = [], [], []
    text_pos, gen_pos = [], []
    vision_seq, vision_loss, vision_shapes, vision_noisy, vision_t = [], [], [], [], []
    action_seq, action_loss, action_shapes, action_noisy, action_t, domains = [], [], [], [], [], []
    cursor = und_len
    chunk_ids: list[torch.Tensor] = []
    for i, s in enumerate(samples):
        n_text = len(s.text_ids)
        input_ids.extend(s.text_ids)
        und_ids.extend([i] * n_text)
        text_pos.append(text_positions(n_text))
        offset = n_text + margin
        _, t, h, w = s.video.shape
        grid = (t, math.ceil(h / p), math.ceil(w / p))
        per_frame = grid[1] * grid[2]
        n_vision = t * per_frame
        vision_seq.append(torch.arange(cursor, cursor + n_vision))
        noisy = s.noisy_video_frames()
        vision_noisy.append(torch.tensor(noisy, dtype=torch.long))
        vision_loss.extend(cursor + f * per_frame + k for f in noisy for k in range(per_frame))
        vision_t.extend([s.sigma * 1000.0] * (len(noisy) * per_frame))
        vision_shapes.append(grid)
        gen_pos.append(grid_positions(*grid, offset, s.fps if fps_mod else None, base_fps, TEMPORAL_FACTOR, TEMPORAL_FACTOR))
        frame_chunk = s.frame_chunk_ids()
        chunk_ids.append(torch.tensor(frame_chunk, dtype=torch.long).repeat_interleave(per_frame))
        cursor += n_vision
        n_gen = n_vision
        if s.actions is not None:
            n_act = s.actions.shape[0]
            rows = s.noisy_action_rows()
            action_seq.append(torch.arange(cursor, cursor + n_act))
            action_loss.extend(cursor + r for r in rows)
            action_noisy.append(torch.tensor(rows, dtype=torch.long))
            action_t.extend([s.sigma * 1000.0] * len(rows))
            action_shapes.append((n_act, 1, 1))
            domains.append(torch.tensor(s.domain_id, dtype=torch.long))
            gen_pos.append(grid_positions(n_act, 1, 1, offset, s.fps if fps_mod else None, base_fps, 1, TEMPORAL_FACTOR, s.action_start_frame))
            pixel = [s.action_start_frame + r for r in range(n_act)]  # latent frame of pixel frame p: ceil(p / 4)
            chunk_ids.append(torch.tensor([frame_chunk[min((p + TEMPORAL_FACTOR - 1) // TEMPORAL_FACTOR, t - 1)] for p in pixel], dtype=torch.long))
            cursor += n_act
            n_gen += n_act
        gen_ids.extend([i] * n_gen)
    if filler:  # after every real sample's text, so each sample's text keeps its place and positions
        input_ids.extend([0] * filler)
        und_ids.extend([len(samples)] * filler)
        text_pos.append(text_positions(filler))

    has_actions = bool(action_seq)
    if has_actions and len(action_seq) != len(samples):
        raise ValueError("either every sample in a packed batch has actions or none does")
    long = dict(dtype=torch.long, device=device)
    kwargs = dict(
        input_ids=torch.tensor(input_ids, **long),
        text_indexes=torch.arange(und_len, **long),
        position_ids=torch.cat(text_pos + gen_pos, dim=1).to(device),
        und_len=und_len,
        sequence_length=cursor,
        vision_tokens=[s.video.unsqueeze(0) for s in samples],
        vision_token_shapes=vision_shapes,
        vision_sequence_indexes=torch.cat(vision_seq).to(device),
        vision_mse_loss_indexes=torch.tensor(vision_loss, **long),
        vision_timesteps=torch.tensor(vision_t, dtype=torch.float32, device=device),
        vision_noisy_frame_indexes=[v.to(device) for v in vision_noisy],
    )
    if has_actions:
        kwargs.update(
            action_tokens=[s.actions for s in samples],
            action_token_shapes=action_shapes,
            action_sequence_indexes=torch.cat(action_seq).to(device),
            action_mse_loss_indexes=torch.tensor(action_loss, **long),
            action_timesteps=torch.tensor(action_t, dtype=torch.float32, device=device),
            action_noisy_frame_indexes=[a.to(device) for a in action_noisy],
            action_domain_ids=[d.to(device) for d in domains],
        )
    return PackedBatch(
        forward_kwargs=kwargs,
        und_sample_ids=torch.tensor(und_ids, **long),
        gen_sample_ids=torch.tensor(gen_ids, **long),
        num_samples=len(samples),
        vision_noisy_frames=[v.tolist() for v in vision_noisy],
        action_noisy_rows=[a.tolist() for a in action_noisy],
        gen_chunk_ids=torch.cat(chunk_ids).to(device) if any(s.causal_chunk_frames > 0 for s in samples) else None,
        layout_key=(str(device), *(_layout_of(s) for s in samples), *((("filler", filler),) if filler else ())),
    )


def _layout_of(s: SequenceSample) -> tuple:
    n_act = None if s.actions is None else s.actions.shape[0]
    return (len(s.text_ids), tuple(s.video.shape[1:]), n_act, s.causal_chunk_frames, s.action_start_frame, s.fps,
            tuple(s.clean_video_frames), tuple(s.clean_action_rows))


class PackedAttention:
    """Attention processor for packed sequences: the diffusers dual-pathway computation with
    cross-sample masks. One instance is shared by every layer; `set_layout` installs a batch."""

    def __init__(self):
        self.und_mask: torch.Tensor | None = None
        self.gen_mask: torch.Tensor | None = None
        # Text K/V cache for repeated denoising forwards (see wamkit.model.denoise): "off", "record"
        # (full sequence; each layer's text K/V is copied into a persistent buffer) or "replay" (the
        # sequence holds generation tokens only; text K/V come from the buffers, layer by layer).
        self.text_cache, self.text_cache_owner = "off", None
        # One set per text length, never evicted: captured CUDA graphs (record and replay) read these
        # addresses, and a re-allocated set would split the two. Memory: layers x 2 x text x kv width.
        self._kv_sets: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._kv_buffers: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._layer_cursor = 0
        self.layout_key: tuple | None = None  # set by packed_layout; identifies the masks (CUDA graph key)
        self.rope = _rope  # swapped for a compiled twin by wamkit.model.cuda_graphs.compile_pointwise

    def set_layout(self, und_ids: torch.Tensor, gen_ids: torch.Tensor, gen_chunk_ids: torch.Tensor | None = None) -> None:
        same_und = und_ids[:, None] == und_ids[None, :]
        causal = torch.ones_like(same_und).tril()
        self.und_mask = same_und & causal
        self.gen_mask = gen_ids[:, None] == torch.cat([und_ids, gen_ids])[None, :]
        if gen_chunk_ids is not None:  # block-causal: text always visible, generation keys of chunks <= own
            kv_chunks = torch.cat([torch.full_like(und_ids, -1), gen_chunk_ids])
            self.gen_mask = self.gen_mask & (kv_chunks[None, :] <= gen_chunk_ids[:, None])

    def clear(self) -> None:
        self.und_mask = self.gen_mask = None

    def start_text_cache(self, owner, record: bool, text_length: int) -> None:
        """Before each forward of a cached loop: `record` runs the full sequence and fills the
        buffers; otherwise the forward carries no text tokens and replays them."""
        self.text_cache, self.text_cache_owner = ("record" if record else "replay"), owner
        self._kv_buffers = self._kv_sets.setdefault(int(text_length), [])
        self.rewind_text_cache()

    def rewind_text_cache(self) -> None:
        """Back to layer 0 (a forward visits the layers in order)."""
        self._layer_cursor = 0

    def captured_state(self) -> tuple:
        """Everything a captured forward reads by address: must outlive the graph."""
        return self.und_mask, self.gen_mask, list(self._kv_buffers)

    def stop_text_cache(self) -> None:
        """Back to plain forwards. The buffers keep the owner's K/V: if it comes back before anyone
        records over them, it replays without recording again."""
        self.text_cache = "off"

    def __call__(self, attn, und_seq, gen_seq, rotary_emb):
        if self.und_mask is None:
            raise RuntimeError("PackedAttention has no layout: run the forward inside `packed_layout(...)`")
        cos_und, sin_und, cos_gen, sin_gen = (r.unsqueeze(1) for r in rotary_emb)
        q_gen, k_gen, v_gen = self.project_gen(attn, gen_seq, cos_gen, sin_gen)

        if self.text_cache == "replay":
            und_out = und_seq.new_zeros((0, attn.num_attention_heads * attn.head_dim))
            k_und_for_gen, v_und = self._next_text_kv()
        else:
            q_und, k_und, v_und, k_und_for_gen = self.project_und(attn, und_seq, cos_und, sin_und)
            und_out = self.attend(q_und, k_und, v_und, "und")
            if self.text_cache == "record":
                k_und_for_gen, v_und = self._record_text_kv(k_und_for_gen, v_und)

        gen_out = self.attend(q_gen, torch.cat([k_und_for_gen, k_gen]), torch.cat([v_und, v_gen]), "gen")
        return attn.to_out(und_out), attn.to_add_out(gen_out)

    def project_gen(self, attn, gen_seq, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Generation-pathway q, k (normed, rotated) and v, [N, heads, d]."""
        heads, kv_heads, d = attn.num_attention_heads, attn.num_key_value_heads, attn.head_dim
        q = attn.norm_added_q(attn.add_q_proj(gen_seq).view(-1, heads, d))
        k = attn.norm_added_k(attn.add_k_proj(gen_seq).view(-1, kv_heads, d))
        v = attn.add_v_proj(gen_seq).view(-1, kv_heads, d)
        return self.rope(q, cos, sin), self.rope(k, cos, sin), v

    def project_und(self, attn, und_seq, cos, sin) -> tuple[torch.Tensor, ...]:
        """Text-pathway q, k, v and the text keys generation tokens see (k_norm_und_for_gen), [N, heads, d]."""
        heads, kv_heads, d = attn.num_attention_heads, attn.num_key_value_heads, attn.head_dim
        q = attn.norm_q(attn.to_q(und_seq).view(-1, heads, d))
        k = attn.norm_k(attn.to_k(und_seq).view(-1, kv_heads, d))
        v = attn.to_v(und_seq).view(-1, kv_heads, d)
        k_for_gen = attn.k_norm_und_for_gen(k) if attn.k_norm_und_for_gen is not None else k
        q, k, k_for_gen = (self.rope(x, cos, sin) for x in (q, k, k_for_gen))
        return q, k, v, k_for_gen

    def _record_text_kv(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy into this layer's persistent buffers (stable addresses, so captured CUDA graphs that
        read them stay valid from one request to the next)."""
        i = self._layer_cursor
        self._layer_cursor += 1
        if i == len(self._kv_buffers):
            self._kv_buffers.append((torch.empty_like(k), torch.empty_like(v)))
        kb, vb = self._kv_buffers[i]
        if kb.shape != k.shape or kb.dtype != k.dtype or kb.device != k.device:
            self._kv_buffers[i] = kb, vb = torch.empty_like(k), torch.empty_like(v)
        kb.copy_(k)
        vb.copy_(v)
        return kb, vb

    def _next_text_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        i = self._layer_cursor
        self._layer_cursor += 1
        if i >= len(self._kv_buffers):
            raise RuntimeError("text K/V replay without a recorded forward: run one step with record=True first")
        return self._kv_buffers[i]

    def attend(self, q, k, v, pathway: str) -> torch.Tensor:
        """[N, H, D] tensors -> [N, H*D]; dense boolean masks through SDPA (the CPU/test path)."""
        return sdpa_attention(q, k, v, self.und_mask if pathway == "und" else self.gen_mask)

    def attend_rows(self, q, k, v, pathway: str, start: int) -> torch.Tensor:
        """Queries of the pathway's rows [start, start + len(q)) over ALL its keys (context parallelism:
        a rank holds a slice of the queries and gathers every key); the mask's rows of those queries."""
        mask = self.und_mask if pathway == "und" else self.gen_mask
        return sdpa_attention(q, k, v, mask[start:start + len(q)])


class PerSampleAttention(PackedAttention):
    """The packed layout, attended sample by sample through SDPA's fused kernels. Exact like the
    masked paths, but nothing is built over the whole pack (no N x N mask, no block mask) and
    nothing is compiled, so packs whose lengths change every step (world-model batches with prompts
    of different lengths) cost no recompilation. A block-causal layout adds one small mask per sample."""

    def set_layout(self, und_ids: torch.Tensor, gen_ids: torch.Tensor, gen_chunk_ids: torch.Tensor | None = None) -> None:
        n = int(max(und_ids.max(), gen_ids.max())) + 1
        self.und_segments, self.gen_segments = _segments(und_ids, n), _segments(gen_ids, n)
        self.text_length = len(und_ids)
        self.chunk_masks = None
        if gen_chunk_ids is not None:  # per sample: text always visible, generation keys of chunks <= own
            self.chunk_masks = []
            for (us, ue), (gs, ge) in zip(self.und_segments, self.gen_segments):
                chunks = gen_chunk_ids[gs:ge]
                kv_chunks = torch.cat([torch.full((ue - us,), -1, dtype=chunks.dtype, device=chunks.device), chunks])
                self.chunk_masks.append(kv_chunks[None, :] <= chunks[:, None])
        self.und_mask = self.gen_mask = True  # marks "layout installed" for the base class check

    def captured_state(self) -> tuple:
        return self.chunk_masks, list(self._kv_buffers)

    @torch.compiler.disable
    def attend(self, q, k, v, pathway: str) -> torch.Tensor:
        """Never traced: compiled decoder layers (parallel.compile) would guard on every sample's
        boundaries and recompile for each new pack; they break around this call instead."""
        if pathway == "und":
            return torch.cat([sdpa_attention(q[s:e], k[s:e], v[s:e], causal=True) for s, e in self.und_segments])
        outs = []
        for i, ((us, ue), (gs, ge)) in enumerate(zip(self.und_segments, self.gen_segments)):
            if gs == ge:  # text-only filler (pack_samples' text_multiple)
                continue
            keys = slice(self.text_length + gs, self.text_length + ge)
            mask = self.chunk_masks[i] if self.chunk_masks is not None else None
            outs.append(sdpa_attention(q[gs:ge], torch.cat([k[us:ue], k[keys]]), torch.cat([v[us:ue], v[keys]]), mask))
        return torch.cat(outs)


    def attend_rows(self, q, k, v, pathway: str, start: int) -> torch.Tensor:
        """`PackedAttention.attend_rows` sample by sample: each sample's queries in the row range over
        that sample's keys, with the causal (text) or chunk (block-causal) mask rows they need."""
        end, outs = start + len(q), []
        for i, ((us, ue), (gs, ge)) in enumerate(zip(self.und_segments, self.gen_segments)):
            lo, hi = (us, ue) if pathway == "und" else (gs, ge)
            a, b = max(lo, start), min(hi, end)
            if a >= b:
                continue
            if pathway == "und":
                keys = slice(us, ue)
                mask = torch.arange(a, b, device=q.device)[:, None] >= torch.arange(us, ue, device=q.device)[None, :]
                outs.append(sdpa_attention(q[a - start:b - start], k[keys], v[keys], mask))
                continue
            keys = slice(self.text_length + gs, self.text_length + ge)
            mask = self.chunk_masks[i][a - gs:b - gs] if self.chunk_masks is not None else None
            outs.append(sdpa_attention(q[a - start:b - start], torch.cat([k[us:ue], k[keys]]), torch.cat([v[us:ue], v[keys]]), mask))
        return torch.cat(outs)


def _segments(ids: torch.Tensor, n: int) -> list[tuple[int, int]]:
    """[start, end) of each sample's run in a sequence whose sample ids ascend (pack order)."""
    if len(ids) > 1 and bool((ids[1:] < ids[:-1]).any()):
        raise ValueError("per-sample attention needs each sample's tokens contiguous and in pack order")
    ends = torch.bincount(ids.long(), minlength=n).cumsum(0).tolist()
    return list(zip([0] + ends[:-1], ends))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def sdpa_attention(q, k, v, mask: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
    """[N, H, D] queries over [M, H_kv, D] keys -> [N, H*D]. With a dense mask SDPA handles GQA; without
    one (plain causal / full attention) the K/V heads are expanded so SDPA's fused kernels apply."""
    if mask is None:
        groups = q.shape[1] // k.shape[1]
        k, v = (x.repeat_interleave(groups, dim=1) for x in (k, v))
        options = {"is_causal": causal}
    else:
        options = {"attn_mask": mask.to(q.device), "enable_gqa": True}
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0), **options)
    return out.squeeze(0).transpose(0, 1).flatten(-2, -1)


def attention_backend(choice: str, device: torch.device, compute_dtype: str | torch.dtype) -> str:
    """auto: flex block masks for bf16 on CUDA; otherwise (CPU, and fp32 on CUDA, where inductor
    finds no flex kernel for small fp32 heads) per-sample SDPA, which skips the cross-sample pairs a
    dense mask computes (4.7x faster than dense masks for 4 packed world-model samples on CPU:
    benchmarks/RESULTS.md). Dense masks (`sdpa`) stay the reference the others are tested against.
    Training and inference share the rule."""
    if choice == "auto":
        return "flex" if device.type == "cuda" and compute_dtype in ("bfloat16", torch.bfloat16) else "per_sample"
    return choice


def training_text_multiple(compiled: bool, backend: str) -> int:
    """The `text_multiple` training packs get: compiled layers are guarded on exact shapes and flex
    compiles its kernel, so both get packs of a few lengths (TEXT_PAD_MULTIPLE); eager backends none.
    Without it, prompts of different lengths recompile every step until dynamo's limit, after which
    flex runs unfused and materialises the scores (benchmarks/RESULTS.md: 73 GiB for 16 world-model
    samples)."""
    return TEXT_PAD_MULTIPLE if compiled or backend == "flex" else 0


def install_packed_attention(model, backend: str = "sdpa") -> PackedAttention:
    """backend "sdpa": dense masks (CPU, tests); "flex": block-sparse flex attention (GPU);
    "per_sample": fused SDPA per sample (GPU, packs of changing lengths)."""
    if backend == "flex":
        from wamkit.model.flex_attention import FlexPackedAttention

        processor = FlexPackedAttention()
    elif backend == "sdpa":
        processor = PackedAttention()
    elif backend == "per_sample":
        processor = PerSampleAttention()
    else:
        raise ValueError(f"unknown attention backend {backend!r}: use 'sdpa', 'flex' or 'per_sample'")
    model.set_attn_processor(processor)
    return processor


def hold_layout(processor: PackedAttention, batch: PackedBatch) -> None:
    """Set `batch`'s layout and leave it set. Training forwards use this: with activation
    checkpointing the backward pass re-runs the layers, after the forward has returned, and must see
    the same masks; the next step's forward replaces them."""
    processor.layout_key = batch.layout_key
    if batch.gen_chunk_ids is None:
        processor.set_layout(batch.und_sample_ids, batch.gen_sample_ids)
    else:
        processor.set_layout(batch.und_sample_ids, batch.gen_sample_ids, gen_chunk_ids=batch.gen_chunk_ids)


@contextmanager
def packed_layout(processor: PackedAttention, batch: PackedBatch):
    hold_layout(processor, batch)
    try:
        yield
    finally:
        processor.clear()
        processor.layout_key = None
