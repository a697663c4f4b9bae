"""The attention processors of packed sequences (the layout itself is `wamkit.model.packing`, pure data).

`PackedAttention` (dense masks, SDPA) and `PerSampleAttention` (SDPA sample by sample) compute diffusers'
dual-pathway attention with cross-sample masks: text is causal inside its own sample; a sample's generation
tokens see only that sample's text and generation tokens. The flex-attention twin is
`wamkit.model.flex_attention`; which one a run installs is `wamkit.model.attention_backends`."""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

from wamkit.model.fp8 import FUSED_QKV
from wamkit.model.packing import PackedBatch


class PackedAttention:
    """Attention processor for packed sequences: the diffusers dual-pathway computation with
    cross-sample masks. One instance is shared by every layer; `set_layout` installs a batch."""

    def __init__(self):
        self.und_mask: torch.Tensor | None = None
        self.gen_mask: torch.Tensor | None = None
        # Text K/V cache for repeated denoising forwards (see wamkit.model.denoise): "off", "record"
        # (full sequence; each layer's text K/V is copied into a persistent buffer) or "replay" (the
        # sequence holds generation tokens only; text K/V come from the buffers, layer by layer).
        self.text_cache = "off"
        # What each text length's buffers hold: the key of the forward that last recorded them completely
        # (wamkit.model.denoise.DenoisingForward.text_key). Equal keys replay without recording again.
        self._kv_holds: dict[int, object] = {}
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

    def start_text_cache(self, record: bool, text_length: int) -> None:
        """Before each forward of a cached loop: `record` runs the full sequence and fills the
        buffers (which hold nothing valid until `text_recorded`); otherwise the forward carries no
        text tokens and replays them."""
        self.text_cache = "record" if record else "replay"
        if record:
            self._kv_holds.pop(int(text_length), None)
        self._kv_buffers = self._kv_sets.setdefault(int(text_length), [])
        self.rewind_text_cache()

    def text_recorded(self, key, text_length: int) -> None:
        """A recording forward completed: the buffers of `text_length` hold the text K/V of `key`."""
        self._kv_holds[int(text_length)] = key

    def holds_text(self, key, text_length: int) -> bool:
        return self._kv_holds.get(int(text_length)) == key

    def forget_text_kv(self) -> None:
        """The model's weights changed: no recorded text K/V may be replayed."""
        self._kv_holds.clear()

    def rewind_text_cache(self) -> None:
        """Back to layer 0 (a forward visits the layers in order)."""
        self._layer_cursor = 0

    @property
    def graph_key(self) -> tuple | None:
        """What a captured forward reads besides its inputs, as a CUDA graph key: here the layout's
        own masks (wamkit.model.flex_attention keys by padded shape instead)."""
        return self.layout_key

    def captured_state(self) -> tuple:
        """Everything a captured forward reads by address: must outlive the graph."""
        return self.und_mask, self.gen_mask, list(self._kv_buffers)

    def stop_text_cache(self) -> None:
        """Back to plain forwards. The buffers keep what they hold: a forward with the same text key
        that comes before anyone records over them replays without recording again."""
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
        fused = getattr(attn, FUSED_QKV, None)  # set by wamkit.model.fp8: one FP8 matmul for all three
        if fused is not None:
            q, k, v = fused(gen_seq).split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
        else:
            q, k, v = attn.add_q_proj(gen_seq), attn.add_k_proj(gen_seq), attn.add_v_proj(gen_seq)
        q = attn.norm_added_q(q.reshape(-1, heads, d))
        k = attn.norm_added_k(k.reshape(-1, kv_heads, d))
        return self.rope(q, cos, sin), self.rope(k, cos, sin), v.reshape(-1, kv_heads, d)

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


def expand_kv_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[M, H_kv, D] -> [M, heads, D], each K/V head repeated for its query group: what
    repeat_interleave(dim=1) gives, as one copy kernel instead of an index computation and a gather."""
    m, kv_heads, d = x.shape
    return x[:, :, None].expand(m, kv_heads, heads // kv_heads, d).reshape(m, heads, d)


def sdpa_attention(q, k, v, mask: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
    """[N, H, D] queries over [M, H_kv, D] keys -> [N, H*D]. With a dense mask SDPA handles GQA; without
    one (plain causal / full attention) the K/V heads are expanded so SDPA's fused kernels apply."""
    if mask is None:
        k, v = expand_kv_heads(k, q.shape[1]), expand_kv_heads(v, q.shape[1])
        options = {"is_causal": causal}
    else:
        options = {"attn_mask": mask.to(q.device), "enable_gqa": True}
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0), **options)
    return out.squeeze(0).transpose(0, 1).flatten(-2, -1)



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
