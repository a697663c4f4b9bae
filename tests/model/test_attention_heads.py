"""The K/V head expansion of fused SDPA (one sample, no mask) is exactly grouped-query attention."""

import torch
import torch.nn.functional as F

from wamkit.model.attention import expand_kv_heads, sdpa_attention


def test_expanded_heads_follow_their_query_groups():
    x = torch.randn(5, 4, 8)
    out = expand_kv_heads(x, 16)
    assert torch.equal(out, x.repeat_interleave(4, dim=1))
    assert torch.equal(out[:, 4:8], x[:, 1:2].expand(5, 4, 8))  # query heads 4-7 read K/V head 1


def test_unmasked_sdpa_equals_the_masked_gqa_path():
    q, k, v = torch.randn(6, 8, 16), torch.randn(9, 2, 16), torch.randn(9, 2, 16)
    everything = torch.ones(6, 9, dtype=torch.bool)
    torch.testing.assert_close(sdpa_attention(q, k, v), sdpa_attention(q, k, v, everything))
    reference = F.scaled_dot_product_attention(q.transpose(0, 1), k.repeat_interleave(4, 1).transpose(0, 1),
                                               v.repeat_interleave(4, 1).transpose(0, 1))
    torch.testing.assert_close(sdpa_attention(q, k, v), reference.transpose(0, 1).flatten(-2, -1))
