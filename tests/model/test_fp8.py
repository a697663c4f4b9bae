"""FP8 matmuls for serving (wamkit.model.fp8) on the CPU, whose torch._scaled_mm runs the same math:
a quantized layer stays within e4m3's rounding of the original, only the generation pathway is
replaced, and a policy served that way predicts what its bf16/fp32 self predicts, closely."""

import numpy as np
import pytest
import torch

from tests.helpers import train_tiny_run
from wamkit.errors import WamkitError
from wamkit.model.cosmos3 import build_transformer
from wamkit.model.fp8 import GENERATION_LINEARS, Float8Linear, quantize_generation_linears
from wamkit.policy import Policy


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("bias", [False, True])
def test_float8_linear_is_within_e4m3_rounding_and_keeps_shapes(bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, bias=bias)
    with torch.no_grad():
        linear.weight[3] *= 50  # an outlier output channel: row-wise scales keep the others precise
    fp8 = Float8Linear(linear)
    x = torch.randn(2, 7, 64)
    x[0, 2] *= 30  # an outlier token
    with torch.no_grad():
        ref, out = linear(x), fp8(x)
    assert out.shape == (2, 7, 48) and out.dtype == x.dtype
    assert _relative(out, ref) < 0.06  # e4m3: 3 mantissa bits
    rest = [c for c in range(48) if c != 3]
    assert _relative(out[1][:, rest], ref[1][:, rest]) < 0.06
    assert fp8.weight_fp8.dtype == torch.float8_e4m3fn and not any(True for _ in fp8.parameters())
    assert fp8(torch.randn(0, 64)).shape == (0, 48)
    # the input gradient (real-time chunking's vector-Jacobian product): the dequantized weight's
    x = torch.randn(5, 64, requires_grad=True)
    cotangent = torch.randn(5, 48)
    (fp8(x) * cotangent).sum().backward()
    torch.testing.assert_close(x.grad, cotangent @ linear.weight.detach(), rtol=0.06, atol=0.06 * cotangent.abs().max().item())


def test_only_the_generation_pathway_is_quantized():
    model = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4)
    text_weight = model.layers[0].self_attn.to_q.weight.clone()
    assert quantize_generation_linears(model) == len(model.layers) * len(GENERATION_LINEARS)
    layer = model.layers[0]
    assert all(isinstance(layer.get_submodule(name), Float8Linear) for name in GENERATION_LINEARS)
    assert type(layer.self_attn.to_q) is torch.nn.Linear and torch.equal(layer.self_attn.to_q.weight, text_weight)
    assert type(layer.mlp.gate_proj) is torch.nn.Linear
    with pytest.raises(WamkitError, match="no plain generation-pathway linear layer"):
        quantize_generation_linears(model)  # twice: nothing left to replace


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("fp8"))


def _observations(n):
    rng = np.random.default_rng(0)
    return [{"image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), "state": rng.uniform(0.2, 0.8, 4),
             "prompt": "move to the green target"} for _ in range(n)]


def test_a_policy_with_fp8_matmuls_predicts_close_to_itself(run_dir):
    obs = _observations(2)
    plain = Policy.from_checkpoint(run_dir, num_steps=4)
    fast = Policy.from_checkpoint(run_dir, num_steps=4)
    assert fast.use_fp8_matmuls() == len(fast.model.layers) * len(GENERATION_LINEARS) == fast.fp8_linears
    a = plain.predict_normalized(obs, seed=5)
    b = fast.predict_normalized(obs, seed=5)
    assert torch.isfinite(b).all() and not torch.equal(a, b)  # FP8 did run
    assert _relative(b, a) < 0.1, _relative(b, a)


def test_fp8_layers_compile_as_serving_compiles_them(run_dir):
    """On CUDA a Policy compiles its MLPs (compile_pointwise), the generation MLP's FP8 layers
    included: they must trace through dynamo and inductor and give the eager result."""
    from wamkit.model.cuda_graphs import compile_pointwise

    obs = _observations(1)
    eager = Policy.from_checkpoint(run_dir, num_steps=2)
    eager.use_fp8_matmuls()
    compiled = Policy.from_checkpoint(run_dir, num_steps=2)
    assert compile_pointwise(compiled.model, compiled.processor) > 0
    compiled.use_fp8_matmuls()
    torch.testing.assert_close(compiled.predict_normalized(obs, seed=1), eager.predict_normalized(obs, seed=1), rtol=1e-4, atol=1e-4)


def test_stacked_qkv_equals_its_parts_and_the_views_keep_no_copy():
    """q, k and v read one input: stacked, it is quantized once and multiplied once, and each
    output block equals what its own layer gives (per-row input scales and per-channel weight
    scales do not depend on the neighbours)."""
    torch.manual_seed(0)
    linears = [torch.nn.Linear(64, n, bias=False) for n in (64, 32, 32)]
    fused, views = Float8Linear.stacked(linears)
    x = torch.randn(9, 64)
    with torch.no_grad():
        whole = fused(x)
        parts = [Float8Linear(linear)(x) for linear in linears]
        alone = [view(x) for view in views]
    torch.testing.assert_close(whole, torch.cat(parts, dim=-1), rtol=1e-6, atol=1e-6)
    for a, b in zip(alone, parts):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert all(v.weight_fp8.untyped_storage().data_ptr() == fused.weight_fp8.untyped_storage().data_ptr() for v in views)


def test_a_quantized_layer_runs_five_fp8_matmuls_not_seven(monkeypatch):
    """The attention's q, k, v go through the stacked layer (one matmul), then the output
    projection and the MLP's gate, up and down: 5 per layer and forward."""
    from wamkit.model.attention import packed_layout
    from wamkit.model.attention_backends import attention_backend, install_packed_attention
    from wamkit.model.packing import SequenceSample, pack_samples

    model = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4).eval()
    quantize_generation_linears(model)
    processor = install_packed_attention(model, attention_backend("auto", torch.device("cpu"), torch.float32))
    sample = SequenceSample(text_ids=[1, 2, 3], video=torch.randn(12, 2, 4, 4), actions=torch.randn(4, 8), clean_video_frames=[0],
                            clean_action_rows=[], sigma=0.5, domain_id=1, fps=10.0, action_start_frame=1)
    batch = pack_samples([sample], model.config)
    calls = []
    real = torch._scaled_mm
    monkeypatch.setattr(torch, "_scaled_mm", lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.no_grad(), packed_layout(processor, batch):
        model(**batch.forward_kwargs)
    assert len(calls) == 5 * len(model.layers)
