"""The pieces of whole-forward CUDA graph replay that run on any device: the arguments flattened into
graph inputs and rebuilt, the action heads without their device-side check (a sync, not allowed
in a capture), and the host-side domain check that replaces it. The capture itself needs a GPU
(benchmarks/serve_latency.py compares graphs with the plain forward)."""

import pytest
import torch

from tests.model.test_packing import _model, _sample
from wamkit.model.attention import packed_layout
from wamkit.model.attention_backends import install_packed_attention
from diffusers.models.transformers.transformer_cosmos3 import DomainAwareLinear

from wamkit.model.cosmos3 import HostCheckedDomainLinear
from wamkit.model.cuda_graphs import ForwardGraphs, flatten_arguments, unflatten_arguments
from wamkit.model.packing import pack_samples


def _batch():
    gen = torch.Generator().manual_seed(3)
    return [_sample(gen, 5, 3, 4, 4, 9, 0.3, 0, True), _sample(gen, 8, 3, 4, 4, 9, 0.6, 3, True)]


def test_arguments_round_trip_through_graph_inputs():
    model = _model()
    kwargs = pack_samples(_batch(), model.config).forward_kwargs
    tensors, structure = flatten_arguments(kwargs)
    assert len(tensors) > 10 and hash(structure) is not None  # hashable: part of the graph key
    rebuilt = unflatten_arguments(tensors, structure)
    assert rebuilt.keys() == kwargs.keys()
    for name, value in kwargs.items():
        if isinstance(value, list):
            assert type(rebuilt[name]) is list and all(a is b or a == b for a, b in zip(rebuilt[name], value))
        else:
            assert rebuilt[name] is value or rebuilt[name] == value


def test_the_captured_forward_computes_the_plain_forward():
    """What a capture records: the forward over rebuilt arguments; bit for bit the plain one."""
    model = _model()
    processor = install_packed_attention(model)
    batch = pack_samples(_batch(), model.config)
    with torch.no_grad(), packed_layout(processor, batch):
        plain = model(**batch.forward_kwargs)
        tensors, structure = flatten_arguments(batch.forward_kwargs)
        captured = model(**unflatten_arguments([t.clone() for t in tensors], structure))
    for a, b in zip(plain.sample + plain.action, captured.sample + captured.action):
        assert torch.equal(a, b)


def test_action_heads_skip_the_device_check_and_compute_diffusers_arithmetic():
    model = _model()
    heads = [model.action_proj_in, model.action_proj_out]
    assert all(type(h) is HostCheckedDomainLinear for h in heads)
    assert any(name.startswith("action_proj_in.fc") for name in model.state_dict())  # names unchanged
    ids = torch.tensor([1, 3])
    for x in (torch.randn(2, model.action_proj_in.input_size), torch.randn(2, 5, model.action_proj_in.input_size)):
        expected = DomainAwareLinear.forward(model.action_proj_in, x, ids)
        assert torch.equal(model.action_proj_in(x, ids), expected)


def test_domain_ids_are_checked_on_the_host_before_packing():
    model = _model()
    samples = _batch()
    samples[1].domain_id = 4  # the model has 4 domains: 0-3
    with pytest.raises(ValueError, match="sample 1: domain_id 4 is outside the model's \\[0, 4\\)"):
        pack_samples(samples, model.config)


def test_forward_graphs_need_a_cuda_model():
    with pytest.raises(ValueError, match="CUDA"):
        ForwardGraphs(_model(), None)
