"""FP8 matmuls for serving: the generation pathway's linear layers with float8 (e4m3) weights.

A served chunk is four generation passes over a few hundred tokens; at Nano width their bf16 matmuls
are ~73% of the GPU time (benchmarks/RESULTS.md, issue 30). Hopper-class GPUs multiply e4m3 at twice
the bf16 rate. Each weight row (output channel) is scaled once into e4m3's range. Each activation row
(token) is scaled at every call, and `torch._scaled_mm` multiplies and rescales to the compute dtype.
Row-wise scales keep one outlier channel or token from flattening the rest.

The text pathway runs once per chunk (its K/V are cached) and stays in bf16, as do the embeddings
and heads. Training never sees FP8: this is an inference-time rewrite of a trained policy.
torchao's float8 inference does the same on CUDA only, and refuses the CPU, where the tests run. The
CPU has `torch._scaled_mm` too.

Measured at Nano width on one H200 (benchmarks/RESULTS.md, issue 30): the FP8 matmuls save ~20 ms a
chunk and the per-call activation quantization spends it again, so one client is slower than bf16."""

from __future__ import annotations

import torch

from wamkit.errors import WamkitError

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)
# The generation pathway's projections in each decoder layer of Cosmos3OmniTransformer (attention
# for the vision/action tokens, and their MLP).
GENERATION_LINEARS = ("self_attn.add_q_proj", "self_attn.add_k_proj", "self_attn.add_v_proj", "self_attn.to_add_out",
                      "mlp_moe_gen.gate_proj", "mlp_moe_gen.up_proj", "mlp_moe_gen.down_proj")
MULTIPLE = 16  # _scaled_mm's alignment of both matrix dimensions on CUDA


def _row_scales(x: torch.Tensor) -> torch.Tensor:
    """fp32 [rows, 1]: each row's largest magnitude maps to e4m3's largest finite value."""
    return x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX


def _quantize_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 rows, fp32 [rows, 1] scales). Eagerly this is five kernels (abs, amax, clamp, divide,
    cast), which at serving's few hundred tokens cost as much as the FP8 matmul saves; on CUDA it
    runs compiled, as one fused kernel."""
    scale = _row_scales(rows)
    return (rows.float() / scale).to(E4M3), scale


_compiled_quantize = None


def _quantizer(rows: torch.Tensor):
    """The compiled quantizer on CUDA; the plain one on the CPU and inside a region being compiled
    already (the compiled MLPs of `compile_pointwise`), where inductor fuses it with its neighbours."""
    global _compiled_quantize
    if not rows.is_cuda or torch.compiler.is_compiling():
        return _quantize_rows
    if _compiled_quantize is None:
        _compiled_quantize = torch.compile(_quantize_rows, dynamic=None)
    return _compiled_quantize


class _Float8Matmul(torch.autograd.Function):
    """rows @ W^T + bias through `torch._scaled_mm`, which has no derivative. The gradient with
    respect to the rows is the one of the dequantized weight, with the activations' rounding taken
    as the identity. Real-time chunking steers the denoiser through that vector-Jacobian product.
    Nothing trains through FP8, so the weights get no gradient."""

    @staticmethod
    def forward(ctx, rows, weight_fp8, weight_scale, bias):
        ctx.save_for_backward(weight_fp8, weight_scale)
        quantized, scale = _quantizer(rows)(rows.detach())
        on_cuda = rows.is_cuda
        out_dtype = torch.bfloat16 if on_cuda else rows.dtype  # CUDA's row-wise kernels write bf16 only
        # fast accumulation: Hopper's FP8 tensor-core accumulator without the periodic fp32 promotion,
        # the usual choice for inference (the serving benchmark reports the actions' distance to bf16)
        out = torch._scaled_mm(quantized, weight_fp8.t(), scale_a=scale, scale_b=weight_scale,
                               bias=None if bias is None else bias.to(out_dtype), out_dtype=out_dtype, use_fast_accum=on_cuda)
        return out.to(rows.dtype)

    @staticmethod
    def backward(ctx, grad):
        weight_fp8, weight_scale = ctx.saved_tensors
        weight = weight_fp8.to(grad.dtype) * weight_scale.t().to(grad.dtype)  # [out, in], dequantized
        return grad @ weight, None, None, None


class Float8Linear(torch.nn.Module):
    """nn.Linear's forward with an e4m3 weight and per-output-channel scales, and activations
    quantized per token at each call. It keeps no copy of the original weight."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        weight_fp8, scale = _quantize_rows(linear.weight.detach())
        self._set(weight_fp8, scale.t().contiguous(), None if linear.bias is None else linear.bias.detach().clone())

    def _set(self, weight_fp8: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.out_features, self.in_features = weight_fp8.shape
        self.register_buffer("weight_fp8", weight_fp8)  # [out, in], row-major
        self.register_buffer("weight_scale", weight_scale)  # [1, out]
        self.register_buffer("bias", bias)

    @classmethod
    def _of(cls, weight_fp8: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None) -> "Float8Linear":
        """A layer over buffers that exist already (a stacked layer's, or rows of one)."""
        layer = cls.__new__(cls)
        torch.nn.Module.__init__(layer)
        layer._set(weight_fp8, weight_scale, bias)
        return layer

    @classmethod
    def stacked(cls, linears: list[torch.nn.Linear]) -> tuple["Float8Linear", list["Float8Linear"]]:
        """One layer over the outputs of `linears` that read the same input (a projection's q, k
        and v): the input is quantized once and multiplied once. Returns it and one layer per input
        linear whose buffers are views of its rows (no second copy), for anyone calling them alone."""
        parts = [cls(linear) for linear in linears]
        biases = [p.bias for p in parts]
        if any(b is not None for b in biases):
            biases = [b if b is not None else torch.zeros(p.out_features, dtype=p.weight_scale.dtype, device=p.weight_scale.device)
                      for b, p in zip(biases, parts)]
        whole = cls._of(torch.cat([p.weight_fp8 for p in parts]), torch.cat([p.weight_scale for p in parts], dim=1),
                        torch.cat(biases) if biases[0] is not None else None)
        views, start = [], 0
        for p in parts:
            end = start + p.out_features
            views.append(cls._of(whole.weight_fp8[start:end], whole.weight_scale[:, start:end],
                                 None if whole.bias is None or p.bias is None else whole.bias[start:end]))
            start = end
        return whole, views

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] == 0:
            return x.new_empty(*x.shape[:-1], self.out_features)
        out = _Float8Matmul.apply(rows, self.weight_fp8, self.weight_scale, self.bias)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, e4m3 weights, row-wise scales"


def check_fp8_device(device: torch.device) -> None:
    """FP8 matmuls need compute capability 8.9 or newer (Ada, Hopper) on CUDA; the CPU runs them
    too, slowly (tests, development)."""
    if device.type != "cuda":
        return
    cap = torch.cuda.get_device_capability(device)
    if cap < (8, 9):
        raise WamkitError("--fp8", f"{torch.cuda.get_device_name(device)} (compute capability {cap[0]}.{cap[1]}) has no FP8 matmuls",
                          "serve without --fp8, or on a GPU of compute capability 8.9 or newer (L4, L40, H100, H200)")


FUSED_QKV = "add_qkv_fp8"  # the attribute of a layer's attention that wamkit's processor multiplies q, k, v with at once
_QKV = ("add_q_proj", "add_k_proj", "add_v_proj")


def quantize_generation_linears(model: torch.nn.Module) -> int:
    """Replace every decoder layer's generation-pathway nn.Linear (GENERATION_LINEARS) whose sizes
    are multiples of 16 with a Float8Linear, in place; returns how many. The q, k and v projections
    also become one stacked layer (`FUSED_QKV`, wamkit.model.attention uses it): one quantization
    and one matmul instead of three. Layers already replaced, or wrapped by LoRA (serve a merged
    export), are left alone; none replaced is an error."""
    replaced = 0
    for layer in model.layers:
        attn = layer.self_attn
        qkv = [getattr(attn, name, None) for name in _QKV]
        if all(_quantizable(m) for m in qkv):
            fused, views = Float8Linear.stacked(qkv)
            attn.add_module(FUSED_QKV, fused)
            for name, view in zip(_QKV, views):
                setattr(attn, name, view)
            replaced += len(_QKV)
        for name in GENERATION_LINEARS:
            parent_name, _, child = name.rpartition(".")
            parent = layer.get_submodule(parent_name)
            module = getattr(parent, child, None)
            if not _quantizable(module):
                continue
            setattr(parent, child, Float8Linear(module))
            replaced += 1
    if not replaced:
        raise WamkitError("--fp8", "the model has no plain generation-pathway linear layer to quantize",
                          "serve an export (`wamkit export RUN OUT`: LoRA merged) or drop --fp8")
    return replaced


def _quantizable(module) -> bool:
    return type(module) is torch.nn.Linear and not module.in_features % MULTIPLE and not module.out_features % MULTIPLE
