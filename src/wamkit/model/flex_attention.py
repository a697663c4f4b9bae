"""The GPU path of packed attention: the same cross-sample masks as `PackedAttention`, expressed as
flex-attention block masks so fully masked tiles are skipped instead of computed."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from wamkit.model.packing import PackedAttention, sdpa_attention

_compiled_flex = None


def _flex():
    """flex_attention is only fast compiled; compile once per process, lazily. Sequence lengths
    change from batch to batch (prompts differ), so the second shape compiles a dynamic kernel:
    with static shapes dynamo would hit its recompile limit and fall back to the unfused kernel."""
    global _compiled_flex
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=None)
    return _compiled_flex


class FlexPackedAttention(PackedAttention):
    def __init__(self, compiled: bool = True, max_cached_layouts: int = 16):
        super().__init__()
        self.compiled = compiled
        self.und_block = self.gen_block = None
        # Block masks by layout key: building one costs milliseconds, and a server sees the same few
        # layouts over and over (and CUDA graphs need the very same mask tensors on every replay).
        self._blocks: OrderedDict[tuple, tuple] = OrderedDict()
        self.max_cached_layouts = max_cached_layouts
        self._single = False

    def set_layout(self, und_ids: torch.Tensor, gen_ids: torch.Tensor, gen_chunk_ids: torch.Tensor | None = None) -> None:
        key = self.layout_key
        if key and key in self._blocks:
            self._blocks.move_to_end(key)
            self.und_block, self.gen_block = self._blocks[key]
        else:
            self.und_block, self.gen_block = self._block_masks(und_ids, gen_ids, gen_chunk_ids)
            if key:
                self._blocks[key] = (self.und_block, self.gen_block)
                while len(self._blocks) > self.max_cached_layouts:
                    self._blocks.popitem(last=False)
        self.und_mask = self.gen_mask = True  # marks "layout installed" for the base class check
        # One bidirectional sample (a policy request): the masks are plain causal / full, which
        # SDPA's fused kernels run faster than a block-sparse kernel at these lengths.
        self._single = key is not None and len(key) == 2 and gen_chunk_ids is None

    def captured_state(self) -> tuple:
        return self.und_block, self.gen_block, list(self._kv_buffers)

    @staticmethod
    def _block_masks(und_ids: torch.Tensor, gen_ids: torch.Tensor, gen_chunk_ids: torch.Tensor | None):
        kv_ids = torch.cat([und_ids, gen_ids])
        kv_chunks = None if gen_chunk_ids is None else torch.cat([torch.full_like(und_ids, -1), gen_chunk_ids])

        def und_mask(b, h, q, kv):
            return (und_ids[q] == und_ids[kv]) & (q >= kv)

        def gen_mask(b, h, q, kv):
            if kv_chunks is None:
                return gen_ids[q] == kv_ids[kv]
            return (gen_ids[q] == kv_ids[kv]) & (kv_chunks[kv] <= gen_chunk_ids[q])  # block-causal

        n_und, n_gen, device = len(und_ids), len(gen_ids), und_ids.device
        return (create_block_mask(und_mask, None, None, n_und, n_und, device=device),
                create_block_mask(gen_mask, None, None, n_gen, n_und + n_gen, device=device))

    def clear(self) -> None:
        super().clear()
        self.und_block = self.gen_block = None
        self._single = False

    def attend(self, q, k, v, pathway: str) -> torch.Tensor:
        if self._single:
            return sdpa_attention(q, k, v, causal=pathway == "und")
        block = self.und_block if pathway == "und" else self.gen_block
        fn = _flex() if self.compiled else flex_attention
        device = q.device.type
        if torch.is_autocast_enabled(device):  # under autocast flex falls back to a dense math kernel (N^2 memory)
            dtype = torch.get_autocast_dtype(device)
            q, k, v = (x.to(dtype) for x in (q, k, v))
        with torch.autocast(device, enabled=False):
            out = fn(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0), block_mask=block, enable_gqa=True)
        return out.squeeze(0).transpose(0, 1).flatten(-2, -1)

