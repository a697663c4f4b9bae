"""Block-causal packed attention (stage 1+): chunk k's outputs do not depend on later chunks."""

import torch

from wamkit.model.cosmos3 import build_transformer
from wamkit.model.attention import PackedAttention, packed_layout
from wamkit.model.attention_backends import install_packed_attention
from wamkit.model.packing import SequenceSample, pack_samples


def _sample(video, actions, k):
    return SequenceSample(text_ids=list(range(5, 12)), video=video, actions=actions, clean_video_frames=[0],
                          clean_action_rows=list(range(actions.shape[0])), sigma=0.5, fps=10.0, causal_chunk_frames=k)


def _forward(model, proc, seqs):
    batch = pack_samples(seqs, model.config)
    with packed_layout(proc, batch):
        out = model(**batch.forward_kwargs)
    return out.sample


def test_later_chunks_do_not_change_earlier_outputs():
    torch.manual_seed(0)
    model = build_transformer("tiny", 12, 64, 4).eval()
    proc = install_packed_attention(model, "sdpa")
    video, actions = torch.randn(12, 3, 4, 4), torch.randn(8, 64)
    changed_video = video.clone()
    changed_video[:, 2] += 1.0  # latent frame 2 = chunk 2
    changed_actions = actions.clone()
    changed_actions[4:] += 1.0  # action rows leading into pixel frames 5..8 = latent frame 2 = chunk 2
    other = _sample(torch.randn(12, 3, 4, 4), torch.randn(8, 64), 1)  # a second packed sample
    with torch.no_grad():
        a = _forward(model, proc, [_sample(video, actions, 1), other])
        b = _forward(model, proc, [_sample(changed_video, changed_actions, 1), other])
        bi_a = _forward(model, proc, [_sample(video, actions, 0)])
        bi_b = _forward(model, proc, [_sample(changed_video, changed_actions, 0)])
    assert torch.allclose(a[0][0][:, :2], b[0][0][:, :2], atol=1e-6)  # chunks 0 and 1 unchanged
    assert not torch.allclose(a[0][0][:, 2], b[0][0][:, 2])  # chunk 2 itself changes
    assert torch.allclose(a[1][0], b[1][0], atol=1e-6)  # the other sample is untouched
    assert not torch.allclose(bi_a[0][0][:, :2], bi_b[0][0][:, :2])  # bidirectional: earlier frames do see it


def test_chunk_ids_and_mask():
    seq = _sample(torch.zeros(12, 5, 2, 2), torch.zeros(16, 64), 2)
    assert seq.frame_chunk_ids() == [0, 1, 1, 2, 2]
    batch = pack_samples([seq], build_transformer("tiny", 12, 64, 4).config)
    ids = batch.gen_chunk_ids.tolist()
    per_frame = 1  # 2x2 latents with patch size 2
    assert ids[:5 * per_frame] == [0, 1, 1, 2, 2]
    assert ids[5:] == [1] * 8 + [2] * 8  # pixel frames 1..8 -> latent 1..2 (chunk 1); 9..16 -> latent 3..4 (chunk 2)
    proc = PackedAttention()
    proc.set_layout(batch.und_sample_ids, batch.gen_sample_ids, gen_chunk_ids=batch.gen_chunk_ids)
    und = len(seq.text_ids)
    assert proc.gen_mask[:, :und].all()  # text always visible
    gen = proc.gen_mask[:, und:]
    chunks = batch.gen_chunk_ids
    assert torch.equal(gen, chunks[None, :] <= chunks[:, None])
