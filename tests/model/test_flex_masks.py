"""The tile-wise block masks of FlexPackedAttention against flex attention's own create_block_mask:
same attention output on packed layouts (text causal per sample, generation bidirectional or
block-causal per sample), never a full tile that create_block_mask calls partial or empty, and no
more than a few extra partial tiles."""

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from wamkit.model.flex_attention import FlexPackedAttention, _block_masks, _padded_ids


def _layout(text_lengths, gen_lengths, chunk_frames=None):
    und = torch.cat([torch.full((n,), i) for i, n in enumerate(text_lengths)])
    gen = torch.cat([torch.full((n,), i) for i, n in enumerate(gen_lengths)])
    chunks = None
    if chunk_frames:  # chunk id of each generation token: equal runs of chunk_frames tokens per sample
        chunks = torch.cat([torch.arange(n) // chunk_frames for n in gen_lengths])
    return und, gen, chunks


def _reference(und, gen, chunks):
    kv_ids = torch.cat([und, gen])
    kv_chunks = None if chunks is None else torch.cat([torch.full_like(und, -1), chunks])

    def und_mask(b, h, q, kv):
        return (und[q] == und[kv]) & (q >= kv)

    def gen_mask(b, h, q, kv):
        if kv_chunks is None:
            return gen[q] == kv_ids[kv]
        return (gen[q] == kv_ids[kv]) & (kv_chunks[kv] <= chunks[q])

    return (create_block_mask(und_mask, None, None, len(und), len(und), device="cpu"),
            create_block_mask(gen_mask, None, None, len(gen), len(kv_ids), device="cpu"))


def _tiles(mask):
    partial, full = mask.to_dense(), None
    full_mask = mask.full_kv_num_blocks is not None
    if full_mask:
        from torch.nn.attention.flex_attention import BlockMask

        full = BlockMask.from_kv_blocks(mask.full_kv_num_blocks, mask.full_kv_indices, BLOCK_SIZE=mask.BLOCK_SIZE,
                                        seq_lengths=mask.seq_lengths).to_dense()
        partial = BlockMask.from_kv_blocks(mask.kv_num_blocks, mask.kv_indices, BLOCK_SIZE=mask.BLOCK_SIZE,
                                           seq_lengths=mask.seq_lengths).to_dense()
    return partial.bool(), (full.bool() if full is not None else torch.zeros_like(partial, dtype=torch.bool))


def _effective(mask, q_len: int, kv_len: int) -> torch.Tensor:
    """The [q, kv] boolean mask a BlockMask applies: full tiles all allowed, partial tiles through its
    mask_mod, every other tile masked."""
    partial, full = _tiles(mask)
    bq, bkv = mask.BLOCK_SIZE
    grid = lambda t: t[0, 0].repeat_interleave(bq, 0).repeat_interleave(bkv, 1)[:q_len, :kv_len]  # noqa: E731
    return grid(full) | (grid(partial) & _mask_of(mask, q_len, kv_len))


def _mask_of(mask, q_len: int, kv_len: int) -> torch.Tensor:
    zero = torch.zeros((), dtype=torch.long)
    return mask.mask_mod(zero, zero, torch.arange(q_len)[:, None], torch.arange(kv_len)[None, :]).bool()


OUTPUT_CHECK_MAX = 4_000_000  # q x kv pairs up to which eager flex attention also runs (seconds above it)


@pytest.mark.parametrize("text,gen,chunk", [
    ([5, 9], [300, 700], None),
    ([32] * 4, [3080] * 4, None),  # the Meta-World world model: 32 text + 3080 generation tokens per sample
    ([7, 130, 3], [257, 129, 512], None),
    ([16, 16, 16], [400, 260, 390], 100),  # block-causal teacher forcing
    ([28], [100], None),  # keys fill whole tiles, queries do not: padded queries see no key at all
])
def test_tile_masks_match_create_block_mask(text, gen, chunk):
    und, gen_ids, chunks = _layout(text, gen, chunk)
    ours = _block_masks(_padded_ids(und, gen_ids, chunks))
    theirs = _reference(und, gen_ids, chunks)
    g = torch.Generator().manual_seed(0)
    for mine, ref, q_len, kv_len in zip(ours, theirs, (len(und), len(gen_ids)), (len(und), len(und) + len(gen_ids))):
        padded_q, padded_kv = mine.seq_lengths  # whole tiles: padding tokens after the real ones
        assert padded_q % 128 == 0 and padded_kv % 128 == 0 and padded_q >= q_len and padded_kv >= kv_len
        effective = _effective(mine, padded_q, padded_kv)
        # over the real tokens the mask our tiles apply is exactly the reference's, element by element
        assert torch.equal(effective[:q_len, :kv_len], _mask_of(ref, q_len, kv_len))
        assert not effective[:q_len, kv_len:].any() and not effective[q_len:, :kv_len].any()  # padding is its own sample
        if q_len * kv_len <= OUTPUT_CHECK_MAX:  # and flex attention reads the tiles as _effective does
            q = torch.randn(1, 2, q_len, 16, generator=g)
            k, v = torch.randn(1, 2, kv_len, 16, generator=g), torch.randn(1, 2, kv_len, 16, generator=g)
            pad = lambda x, n: torch.nn.functional.pad(x, (0, 0, 0, n - x.shape[2]))  # noqa: E731
            ours_out = flex_attention(pad(q, padded_q), pad(k, padded_kv), pad(v, padded_kv), block_mask=mine)
            torch.testing.assert_close(ours_out[:, :, :q_len], flex_attention(q, k, v, block_mask=ref))
            assert torch.isfinite(ours_out).all()
        my_partial, my_full = _tiles(mine)
        ref_partial, ref_full = _tiles(ref)
        assert my_full.shape == ref_full.shape  # padding to whole tiles adds no tile
        assert not (my_full & ~ref_full).any()  # a full tile skips the mask: it must really be full
        assert not ((ref_partial | ref_full) & ~(my_partial | my_full)).any()  # no allowed tile dropped
        extra = int((my_partial | my_full).sum() - (ref_partial | ref_full).sum())
        assert extra <= 2 * len(text) + 3, f"{extra} tiles more than create_block_mask"


def test_attend_pads_ragged_lengths():
    """FlexPackedAttention.attend pads q, k, v to its masks' whole tiles and hands back only the real
    rows: the same output as dense-mask SDPA for lengths of no whole tile (flex has no CPU backward;
    the GPU step trains through the same padded masks)."""
    from wamkit.model.attention import PackedAttention

    und, gen_ids, _ = _layout([5, 23], [40, 60])  # kv = 128 exactly; queries 28 and 100
    g = torch.Generator().manual_seed(1)
    for pathway, q_len, kv_len in (("und", len(und), len(und)), ("gen", len(gen_ids), len(und) + len(gen_ids))):
        q = torch.randn(q_len, 4, 16, generator=g)
        k, v = torch.randn(kv_len, 2, 16, generator=g), torch.randn(kv_len, 2, 16, generator=g)
        outs = []
        for processor in (FlexPackedAttention(compiled=False), PackedAttention()):
            processor.set_layout(und, gen_ids)
            outs.append(processor.attend(q, k, v, pathway))
        assert outs[0].shape == (q_len, 4 * 16)
        torch.testing.assert_close(outs[0], outs[1])


def test_layouts_of_one_padded_shape_share_mask_tensors():
    """A second layout of the same padded shape (another mix of prompts) is written into the first
    one's mask tensors, so a CUDA graph captured on the first replays the second correctly: same
    graph_key, same tensor objects, contents and attention output those of the second layout."""
    from wamkit.model.attention import PackedAttention

    flex = FlexPackedAttention(compiled=False)
    first, second = _layout([40, 52], [300, 300]), _layout([52, 40], [300, 300])  # both pad to 128 + 640
    flex.layout_key = ("cpu", "a", "b")
    flex.set_layout(*first[:2])
    key, und_block, tensors = flex.graph_key, flex.und_block, [flex.gen_block.kv_indices, flex.gen_block.full_kv_indices]
    flex.layout_key = ("cpu", "b", "a")
    flex.set_layout(*second[:2])
    assert flex.graph_key == key and flex.und_block is und_block
    assert flex.gen_block.kv_indices is tensors[0] and flex.gen_block.full_kv_indices is tensors[1]
    fresh = _block_masks(_padded_ids(*second))
    for mine, ref in zip((flex.und_block, flex.gen_block), fresh):
        q_len, kv_len = ref.seq_lengths
        assert torch.equal(_effective(mine, q_len, kv_len), _effective(ref, q_len, kv_len))
    und, gen_ids, _ = second
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(len(gen_ids), 4, 16, generator=g), torch.randn(len(und) + len(gen_ids), 2, 16, generator=g), \
        torch.randn(len(und) + len(gen_ids), 2, 16, generator=g)
    dense = PackedAttention()
    dense.set_layout(und, gen_ids)
    torch.testing.assert_close(flex.attend(q, k, v, "gen"), dense.attend(q, k, v, "gen"))
    flex.layout_key = ("cpu", "c", "d")
    flex.set_layout(*_layout([40, 52], [300, 600])[:2])  # another padded shape: another slot, another key
    assert flex.graph_key != key
