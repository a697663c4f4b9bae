"""parallel.param_dtype = "bfloat16": one process computes exactly what FSDP2's mixed precision
computes (so N ranks reproduce one process), and neither rounds the mRoPE positions or timesteps."""

import copy
from types import SimpleNamespace

import pytest
import torch

from wamkit.model.cosmos3 import build_transformer, set_trainable
from wamkit.model.attention import packed_layout
from wamkit.model.attention_backends import install_packed_attention
from wamkit.model.packing import SequenceSample, pack_samples
from wamkit.train.parallel import compute_precision, parallelize


def _knobs(checkpointing: str) -> SimpleNamespace:
    return SimpleNamespace(parallel=SimpleNamespace(
        activation_checkpointing=checkpointing, compile=False, param_dtype="bfloat16", reduce_dtype="float32",
        reshard_after_forward=True, replicate_frozen=False, prefetch_layers=0))


def _batch(model):
    gen = torch.Generator().manual_seed(3)
    samples = [SequenceSample(text_ids=torch.randint(3, 250, (n,), generator=gen).tolist(), video=torch.randn(12, 3, 4, 4, generator=gen),
                              actions=torch.randn(9, 8, generator=gen), clean_video_frames=[0], clean_action_rows=[0], sigma=sigma,
                              domain_id=0, fps=10.0, action_start_frame=0)
               for n, sigma in ((5, 0.3), (9, 0.7))]
    return pack_samples(samples, model.config)


def _step(model, batch, cfg, mesh):
    """(video output, loss, {name: fp32 gradient}) of one forward + backward under compute_precision."""
    processor = install_packed_attention(model)
    seen = {}
    hook = model.register_forward_pre_hook(lambda m, a, kw: seen.update({k: kw[k] for k in ("position_ids", "vision_timesteps")}) or None,
                                           with_kwargs=True)
    with compute_precision(cfg, mesh, [model]), packed_layout(processor, batch):
        out = model(**batch.forward_kwargs)
        loss = sum(s.float().pow(2).mean() for s in out.sample) + sum(a.float().pow(2).mean() for a in out.action)
        loss.backward()
    hook.remove()
    grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad) for n, p in model.named_parameters() if p.grad is not None}
    return torch.cat([s.float().flatten() for s in out.sample]), loss.detach(), grads, seen


@pytest.mark.parametrize("checkpointing", ["none", "selective", "full"])
def test_one_process_bf16_equals_fsdp2_mixed_precision(one_process_group, checkpointing):
    torch.manual_seed(0)
    model = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=2)
    set_trainable(model, train_text_pathway=False)
    sharded = parallelize(copy.deepcopy(model), one_process_group, _knobs(checkpointing))
    single = parallelize(model, None, _knobs(checkpointing))
    batch = _batch(single)
    out_1, loss_1, grads_1, seen_1 = _step(single, batch, _knobs(checkpointing), None)
    out_n, loss_n, grads_n, seen_n = _step(sharded, batch, _knobs(checkpointing), one_process_group)

    assert out_1.dtype == torch.float32 and all(p.dtype == torch.float32 for p in single.parameters())  # masters restored
    assert grads_1 and all(g.dtype == torch.float32 for g in grads_1.values())
    with torch.no_grad(), packed_layout(install_packed_attention(single), batch):  # fp32 compute, outside the block
        reference = torch.cat([s.float().flatten() for s in single(**batch.forward_kwargs).sample])
    assert not torch.equal(out_1, reference)  # the bf16 path really ran in bf16
    torch.testing.assert_close(out_1, out_n, rtol=0, atol=0)
    torch.testing.assert_close(loss_1, loss_n, rtol=0, atol=0)
    assert grads_1.keys() == grads_n.keys()
    for name in grads_1:
        torch.testing.assert_close(grads_1[name], grads_n[name], rtol=1e-6, atol=1e-7, msg=name)
    for seen in (seen_1, seen_n):  # bf16 would put positions 15000..15063 on 14976 / 15040
        assert seen["position_ids"].dtype == torch.float32 and seen["vision_timesteps"].dtype == torch.float32
        torch.testing.assert_close(seen["position_ids"], batch.forward_kwargs["position_ids"], rtol=0, atol=0)
