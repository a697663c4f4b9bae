"""The GPU path of packed attention: the same cross-sample masks as `PackedAttention`, expressed as
flex-attention block masks so fully masked tiles are skipped instead of computed."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from wamkit.model.attention import PackedAttention, sdpa_attention

TILE = 128  # flex attention's default block size
PADDING_ID = 2**30  # sample and chunk id of padding tokens: above every real one (ids stay sorted), read without a host sync

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
    # Sampling packs pad their text to whole tiles (pack_samples' text_multiple): packs of different
    # prompts then share padded shapes, and with them mask slots and captured graphs.
    inference_text_multiple = TILE

    def __init__(self, compiled: bool = True, max_slots: int = 16):
        super().__init__()
        self.compiled = compiled
        self.und_block = self.gen_block = None
        # Masks by padded shape, at fixed addresses: a layout of a shape seen before is copied into the
        # same tensors, so a CUDA graph captured for one mix of prompts replays every other mix of the
        # same padded shape (graph_key). A closed loop's batches mix tasks anew at every chunk.
        self._slots: OrderedDict[tuple, _MaskSlot] = OrderedDict()
        self.max_slots = max_slots
        self._slot: _MaskSlot | None = None
        self._serial = 0
        self._single = False

    def set_layout(self, und_ids: torch.Tensor, gen_ids: torch.Tensor, gen_chunk_ids: torch.Tensor | None = None) -> None:
        ids = _padded_ids(und_ids, gen_ids, gen_chunk_ids)
        shape = (str(und_ids.device), *(None if t is None else len(t) for t in ids.values()))
        slot = self._slots.get(shape)
        if slot is None:
            self._serial += 1
            slot = self._slots[shape] = _MaskSlot(self._serial, ids)
            while len(self._slots) > self.max_slots:
                self._slots.popitem(last=False)
        elif slot.layout_key is None or slot.layout_key != self.layout_key:
            slot.refill(ids)
        self._slots.move_to_end(shape)
        slot.layout_key = self.layout_key  # None (an unkeyed layout) always refills next time
        self._slot = slot
        self.und_block, self.gen_block = slot.und_block, slot.gen_block
        self.und_mask = self.gen_mask = True  # marks "layout installed" for the base class check
        # One bidirectional sample (a policy request): the masks are plain causal / full, which
        # SDPA's fused kernels run faster than a block-sparse kernel at these lengths.
        key = self.layout_key
        self._single = key is not None and len(key) == 2 and gen_chunk_ids is None

    @property
    def graph_key(self) -> tuple | None:
        """What a captured graph reads besides its inputs: the padded shape's mask slot (whose
        contents change in place from layout to layout), or for a lone sample its layout."""
        if self.layout_key is None or self._slot is None:
            return None
        return self.layout_key if self._single else ("flex-slot", self._slot.serial)

    def captured_state(self) -> tuple:
        return self.und_block, self.gen_block, list(self._kv_buffers)

    def clear(self) -> None:
        super().clear()
        self.und_block = self.gen_block = None
        self._slot = None
        self._single = False

    def attend(self, q, k, v, pathway: str) -> torch.Tensor:
        if self._single:
            return sdpa_attention(q, k, v, causal=pathway == "und")
        block = self.und_block if pathway == "und" else self.gen_block
        n = len(q)
        q_len, kv_len = block.seq_lengths  # whole tiles (see _block_masks)
        q, k, v = _pad_rows(q, q_len), _pad_rows(k, kv_len), _pad_rows(v, kv_len)
        fn = _flex() if self.compiled else flex_attention
        device = q.device.type
        if torch.is_autocast_enabled(device):  # under autocast flex falls back to a dense math kernel (N^2 memory)
            dtype = torch.get_autocast_dtype(device)
            q, k, v = (x.to(dtype) for x in (q, k, v))
        with torch.autocast(device, enabled=False):
            out = fn(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0), block_mask=block, enable_gqa=True)
        return out.squeeze(0).transpose(0, 1)[:n].flatten(-2, -1)


class _MaskSlot:
    """The block masks of one padded shape and the id tensors their mask_mods read. `refill` copies
    another layout of the same shape into these very tensors (CUDA graphs read them by address)."""

    def __init__(self, serial: int, ids: dict):
        self.serial = serial
        self.layout_key: tuple | None = None  # the layout the tensors hold now
        self.ids = ids
        self.und_block, self.gen_block = _block_masks(ids)

    def refill(self, ids: dict) -> None:
        for name, value in ids.items():
            if value is not None:
                self.ids[name].copy_(value)
        und_block, gen_block = _block_masks(self.ids)
        _copy_block_mask(self.und_block, und_block)
        _copy_block_mask(self.gen_block, gen_block)


def _padded_ids(und_ids: torch.Tensor, gen_ids: torch.Tensor, gen_chunk_ids: torch.Tensor | None) -> dict:
    """Sample (and chunk) ids over lengths padded to whole tiles (`attend` pads q, k and v to match):
    inductor's flex lowering finds no kernel for some short or ragged lengths once it compiles dynamic
    shapes (a closed-loop evaluation died on one, 2026-12-03). Padding tokens form one extra sample of
    their own, after every real one (ids stay sorted), so no real token sees them or is seen by them."""
    kv_ids = _pad_to_tiles(torch.cat([und_ids, gen_ids]))
    kv_chunks = gen_chunks = None
    if gen_chunk_ids is not None:  # padding's chunk comes after every real one, like its sample id
        kv_chunks = _pad_to_tiles(torch.cat([torch.full_like(und_ids, -1), gen_chunk_ids]))
        gen_chunks = _pad_to_tiles(gen_chunk_ids)
    return dict(und=_pad_to_tiles(und_ids), gen=_pad_to_tiles(gen_ids), kv=kv_ids, kv_chunks=kv_chunks, gen_chunks=gen_chunks)


def _block_masks(ids: dict) -> tuple[BlockMask, BlockMask]:
    """The text and generation pathways' block masks over `ids` (_padded_ids); their mask_mods read
    those very tensors, so new ids written into them change what the masks say."""
    und_ids, gen_ids, kv_ids, kv_chunks, gen_chunks = (ids[k] for k in ("und", "gen", "kv", "kv_chunks", "gen_chunks"))

    def und_mask(b, h, q, kv):
        return (und_ids[q] == und_ids[kv]) & (q >= kv)

    def gen_mask(b, h, q, kv):
        if kv_chunks is None:
            return gen_ids[q] == kv_ids[kv]
        return (gen_ids[q] == kv_ids[kv]) & (kv_chunks[kv] <= gen_chunks[q])  # block-causal

    # Which tiles are empty, partial or full follows from each tile's range of sample ids (and
    # chunk ids), so the masks are built tile by tile: create_block_mask would evaluate the mask
    # at every (q, kv) pair, ~2.5e9 of them for 16 packed world-model samples, at every step.
    und = _TileRanges(und_ids)
    und_full, und_any = _tile_classes(und, und, causal=True)
    gen_full, gen_any = _tile_classes(_TileRanges(gen_ids, gen_chunks), _TileRanges(kv_ids, kv_chunks), causal=False)
    return (_block_mask(und_full, und_any, und_mask, len(und_ids), len(und_ids)),
            _block_mask(gen_full, gen_any, gen_mask, len(gen_ids), len(kv_ids)))


def _copy_block_mask(dst: BlockMask, src: BlockMask) -> None:
    """Every tensor of `src` (block counts and indices, both directions) into `dst`'s of the same shape."""
    for name, value in vars(src).items():
        if isinstance(value, torch.Tensor):
            getattr(dst, name).copy_(value)


def _pad_to_tiles(ids: torch.Tensor) -> torch.Tensor:
    """`ids` followed by PADDING_ID up to a whole number of tiles (at least one)."""
    pad = max(TILE, -(-len(ids) // TILE) * TILE) - len(ids)
    return torch.cat([ids, ids.new_full((pad,), PADDING_ID)]) if pad else ids


def _pad_rows(x: torch.Tensor, length: int) -> torch.Tensor:
    """[N, H, D] -> [length, H, D] with zero rows after the real ones."""
    return torch.nn.functional.pad(x, (0, 0, 0, 0, 0, length - len(x))) if length > len(x) else x


class _TileRanges:
    """Per tile of TILE consecutive tokens: first/last token position and min/max sample id (and
    chunk id). Sample ids are sorted within each of a sequence's runs, so tiles whose id ranges do
    not meet share no sample; ranges that meet are treated as sharing one (a tile over the boundary
    of two runs can only be over-counted as partial, which costs speed, never correctness). The ids
    fill whole tiles (_pad_to_tiles): no short tail tile needs excluding from "full" by hand."""

    def __init__(self, ids: torch.Tensor, chunks: torch.Tensor | None = None):
        assert len(ids) % TILE == 0, "pad the ids to whole tiles first (_pad_to_tiles)"
        self.count = len(ids) // TILE
        self.first = torch.arange(self.count, device=ids.device) * TILE
        self.last = self.first + TILE - 1
        self.id_min, self.id_max = _tile_min_max(ids, self.count)
        self.chunk_min, self.chunk_max = _tile_min_max(chunks, self.count) if chunks is not None else (None, None)


def _tile_min_max(values: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    tiles = values.view(count, TILE)
    return tiles.amin(1), tiles.amax(1)


def _tile_classes(q: _TileRanges, kv: _TileRanges, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(full, any) [q tiles, kv tiles]: every pair allowed / possibly some pair allowed."""
    col = lambda x: x[:, None]  # noqa: E731
    one_sample = (col(q.id_min) == col(q.id_max)) & (kv.id_min == kv.id_max) & (col(q.id_min) == kv.id_min)
    meet = (col(q.id_min) <= kv.id_max) & (kv.id_min <= col(q.id_max))
    full, any_ = one_sample, meet
    if causal:  # kv <= q
        full = full & (kv.last <= col(q.first))
        any_ = any_ & (kv.first <= col(q.last))
    if q.chunk_min is not None:  # block-causal: kv chunk <= q chunk
        full = full & (kv.chunk_max <= col(q.chunk_min))
        any_ = any_ & (kv.chunk_min <= col(q.chunk_max))
    return full, any_


def _block_mask(full: torch.Tensor, any_: torch.Tensor, mask_mod, q_len: int, kv_len: int) -> BlockMask:
    partial = any_ & ~full

    def ordered(dense: torch.Tensor):  # kv tiles listed first-to-last per q tile, used ones first
        counts = dense.sum(-1, dtype=torch.int32)
        order = torch.argsort(dense.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
        return counts[None, None], order[None, None]

    return BlockMask.from_kv_blocks(*ordered(partial), *ordered(full), BLOCK_SIZE=TILE, mask_mod=mask_mod,
                                    seq_lengths=(q_len, kv_len))
