"""parallel.param_dtype = "bfloat16" is one mechanism at every world size: FSDP2's mixed precision,
on a one-rank mesh in one process (so N ranks compute what one computes: tests/train/test_distributed.py).
Compute really runs in bf16 over fp32 trainable masters, the mRoPE positions and timesteps are not
rounded, and the frozen weights are stored once in bf16 and used in place: no per-step copy."""

import copy
import warnings
from types import SimpleNamespace

import pytest
import torch

from wamkit.model.cosmos3 import build_transformer, set_trainable
from wamkit.model.attention import packed_layout
from wamkit.model.attention_backends import install_packed_attention
from wamkit.model.packing import SequenceSample, pack_samples
from wamkit.train.parallel import parallelize


def _knobs(checkpointing: str, dtype: str = "bfloat16") -> SimpleNamespace:
    return SimpleNamespace(parallel=SimpleNamespace(
        activation_checkpointing=checkpointing, compile=False, param_dtype=dtype, reduce_dtype="float32",
        reshard_after_forward=True, replicate_frozen=False, prefetch_layers=0))


def _batch(model):
    gen = torch.Generator().manual_seed(3)
    samples = [SequenceSample(text_ids=torch.randint(3, 250, (n,), generator=gen).tolist(), video=torch.randn(12, 3, 4, 4, generator=gen),
                              actions=torch.randn(9, 8, generator=gen), clean_video_frames=[0], clean_action_rows=[0], sigma=sigma,
                              domain_id=0, fps=10.0, action_start_frame=0)
               for n, sigma in ((5, 0.3), (9, 0.7))]
    return pack_samples(samples, model.config)


def _frozen_pointer_probe(model):
    """Forward pre-hooks recording, for every module that owns frozen parameters, whether the tensor it
    computes with is the stored parameter itself (same storage) or a copy."""
    stored = {id(m): {n: p.data_ptr() for n, p in m._parameters.items() if p is not None and not p.requires_grad}
              for m in model.modules()}
    copies, hooks = [], []
    for module in model.modules():
        if stored[id(module)]:
            def hook(m, args, kwargs, expected=stored[id(module)]):
                copies.extend(n for n, ptr in expected.items() if m._parameters[n].data_ptr() != ptr)
            hooks.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    return copies, hooks


def _step(model, batch):
    """(video output, loss, {name: fp32 gradient}, root inputs seen, frozen weights computed from a copy)."""
    processor = install_packed_attention(model)
    seen = {}
    hook = model.register_forward_pre_hook(lambda m, a, kw: seen.update({k: kw[k] for k in ("position_ids", "vision_timesteps")}) or None,
                                           with_kwargs=True)
    copies, probes = _frozen_pointer_probe(model)
    with packed_layout(processor, batch):
        out = model(**batch.forward_kwargs)
        loss = sum(s.float().pow(2).mean() for s in out.sample) + sum(a.float().pow(2).mean() for a in out.action)
        loss.backward()
    for h in [hook, *probes]:
        h.remove()
    grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad) for n, p in model.named_parameters() if p.grad is not None}
    return torch.cat([s.float().flatten() for s in out.sample]), loss.detach(), grads, seen, copies


@pytest.mark.parametrize("checkpointing", ["none", "selective", "full"])
def test_bf16_compute_over_fp32_masters_with_frozen_weights_used_in_place(one_process_group, checkpointing):
    torch.manual_seed(0)
    model = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=2)
    set_trainable(model, train_text_pathway=False)
    fp32 = parallelize(copy.deepcopy(model), one_process_group, _knobs(checkpointing, "float32"))
    bf16 = parallelize(model, one_process_group, _knobs(checkpointing))
    batch = _batch(bf16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, loss, grads, seen, copies = _step(bf16, batch)
    assert not [w for w in caught if "returned a view" in str(w.message)]  # FSDP2's hooks sit on tensors we own
    reference, _, _, _, _ = _step(fp32, batch)

    assert out.dtype == torch.float32 and not torch.equal(out, reference)  # the bf16 path really ran in bf16
    torch.testing.assert_close(out, reference, rtol=0.1, atol=0.1)  # ... and computed the same function
    assert all(p.dtype == torch.float32 for p in bf16.parameters() if p.requires_grad)  # masters stay fp32
    assert all(p.dtype == torch.bfloat16 for p in bf16.parameters() if not p.requires_grad)  # frozen: once, in bf16
    assert grads and all(g.dtype == torch.float32 for g in grads.values())
    assert all(bf16.get_parameter(n).requires_grad for n in grads)  # no gradient storage for frozen weights
    assert copies == []  # every frozen weight was computed with in place, not from a per-step copy
    assert seen["position_ids"].dtype == torch.float32 and seen["vision_timesteps"].dtype == torch.float32
    torch.testing.assert_close(seen["position_ids"], batch.forward_kwargs["position_ids"], rtol=0, atol=0)  # bf16 would put 15000..15063 on 14976 / 15040


def test_selective_checkpointing_gives_every_layer_the_same_mlp_class(one_process_group):
    """One class (one compiled guard) per MLP type: per-instance wrappers made each of the 36 Nano layers
    recompile until dynamo's limit, after which flex attention ran unfused (benchmarks/RESULTS.md)."""
    model = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=2)
    names = {n for n, _ in model.named_parameters()}
    parallelize(model, one_process_group, _knobs("selective"))
    for attr in ("mlp", "mlp_moe_gen"):
        classes = {type(getattr(layer, attr)) for layer in model.layers}
        assert len(classes) == 1 and next(iter(classes)).__name__.startswith("Checkpointed")
        assert all("forward" not in vars(getattr(layer, attr)) for layer in model.layers)  # no per-instance attribute
    assert {n for n, _ in model.named_parameters()} == names  # checkpoints keep their keys
