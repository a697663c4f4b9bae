"""An export serves in the dtype it was written in: a bf16 transformer loads as bf16 (diffusers'
from_pretrained alone would upcast it to fp32: twice the memory and fp32 matmuls on a GPU)."""

import pytest
import torch

from wamkit.model.cosmos3 import build_transformer
from wamkit.policy.loading import load_transformer, stored_dtype


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("use_from_pretrained", [True, False])
def test_an_export_loads_in_the_dtype_it_was_written_in(tmp_path, dtype, use_from_pretrained):
    torch.manual_seed(0)
    model = build_transformer("tiny", 48, 36, 32).to(dtype)
    model.save_pretrained(tmp_path, max_shard_size="200KB")  # several shards + an index, as a 30 GB Nano export has
    assert len(list(tmp_path.glob("*.safetensors"))) > 1 and stored_dtype(tmp_path) == dtype
    loaded = load_transformer(tmp_path, use_from_pretrained=use_from_pretrained)
    assert {p.dtype for p in loaded.parameters()} == {dtype}
    expected = model.state_dict()
    for name, value in loaded.state_dict().items():
        assert torch.equal(value, expected[name]), name
