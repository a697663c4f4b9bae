"""The pieces of whole-forward CUDA graph replay that run on any device: the arguments flattened into
graph inputs and rebuilt, the action heads without their device-side check (what a capture runs),
and the host-side domain check that replaces it. The capture itself needs a GPU (benchmarks)."""

import pytest
import torch

from tests.model.test_packing import _model, _sample
from wamkit.model.attention import packed_layout
from wamkit.model.attention_backends import install_packed_attention
from wamkit.model.cuda_graphs import ForwardGraphs, flatten_arguments, unchecked_domain_heads, unflatten_arguments
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
    """What a capture records: rebuilt arguments, unchecked action heads; bit for bit the same."""
    model = _model()
    processor = install_packed_attention(model)
    batch = pack_samples(_batch(), model.config)
    heads = [model.action_proj_in, model.action_proj_out]
    with torch.no_grad(), packed_layout(processor, batch):
        plain = model(**batch.forward_kwargs)
        tensors, structure = flatten_arguments(batch.forward_kwargs)
        with unchecked_domain_heads(model):
            assert all("forward" in vars(h) for h in heads)
            captured = model(**unflatten_arguments([t.clone() for t in tensors], structure))
    assert not any("forward" in vars(h) for h in heads)  # diffusers' own forward is back
    for a, b in zip(plain.sample + plain.action, captured.sample + captured.action):
        assert torch.equal(a, b)
    x3 = torch.randn(2, 5, model.action_proj_in.input_size)
    ids = torch.tensor([1, 3])
    with unchecked_domain_heads(model):
        unchecked = model.action_proj_in(x3, ids)
    torch.testing.assert_close(unchecked, model.action_proj_in(x3, ids), rtol=0, atol=0)


def test_domain_ids_are_checked_on_the_host_before_packing():
    model = _model()
    samples = _batch()
    samples[1].domain_id = 4  # the model has 4 domains: 0-3
    with pytest.raises(ValueError, match="sample 1: domain_id 4 is outside the model's \\[0, 4\\)"):
        pack_samples(samples, model.config)


def test_forward_graphs_need_a_cuda_model():
    with pytest.raises(ValueError, match="CUDA"):
        ForwardGraphs(_model(), None)
