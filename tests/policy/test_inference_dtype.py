"""What a loaded model computes in: on a GPU the run's training compute dtype (a checkpoint's fp32
masters would otherwise run full-fp32 matmuls there), on the CPU the stored dtype; `--dtype` says
otherwise, and `wamkit export --dtype bfloat16` writes half-size weights that reload as written."""

import numpy as np
import pytest
import torch

from tests.helpers import train_tiny_run
from wamkit.device import resolve_inference_dtype
from wamkit.errors import ConfigError
from wamkit.export import ExportError, export_run
from wamkit.policy import Policy, load_from_checkpoint, load_from_export
from wamkit.policy.loading import stored_dtype


def test_auto_is_the_training_compute_dtype_on_a_gpu_and_the_stored_one_on_the_cpu():
    assert resolve_inference_dtype("auto", "cuda:0", "bfloat16", torch.float32) == torch.bfloat16
    assert resolve_inference_dtype("auto", "cuda", "float32", torch.bfloat16) == torch.float32
    assert resolve_inference_dtype("auto", "cpu", "bfloat16", torch.float32) == torch.float32
    assert resolve_inference_dtype("auto", "cpu", "bfloat16", torch.bfloat16) == torch.bfloat16
    assert resolve_inference_dtype("auto", "cuda", None, torch.float32) == torch.float32  # an export that records none
    assert resolve_inference_dtype("float32", "cuda", "bfloat16", torch.float32) == torch.float32
    assert resolve_inference_dtype("bfloat16", "cpu", "float32", torch.float32) == torch.bfloat16
    with pytest.raises(ConfigError, match="--dtype.*'bf16'"):
        resolve_inference_dtype("bf16", "cpu", "float32", torch.float32)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("dtype"))


def _obs():
    rng = np.random.default_rng(3)
    return {"image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), "state": rng.uniform(0.2, 0.8, 4), "prompt": "reach"}


def test_a_checkpoint_loaded_in_bf16_computes_in_bf16_close_to_fp32(run_dir):
    fp32 = Policy(load_from_checkpoint(run_dir), num_steps=4)
    bf16 = Policy(load_from_checkpoint(run_dir, dtype="bfloat16"), num_steps=4)
    assert {p.dtype for p in fp32.model.parameters()} == {torch.float32}
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
    a = fp32.predict([_obs()], seed=5)[0]
    b = bf16.predict([_obs()], seed=5)[0]
    assert a.dtype == b.dtype == np.float32 and a.shape == b.shape and np.isfinite(b).all()
    assert not np.array_equal(a, b)  # it really computed in another dtype
    assert np.abs(a - b).max() < 0.05 * max(1.0, float(np.abs(a).max()))  # bf16 rounding, not another model


def test_a_bf16_export_is_half_the_size_and_reloads_in_bf16(run_dir, tmp_path):
    full = export_run(run_dir, tmp_path / "fp32", device="cpu")
    half = export_run(run_dir, tmp_path / "bf16", device="cpu", dtype="bfloat16")  # its own reload check passed
    assert stored_dtype(full / "transformer") == torch.float32 and stored_dtype(half / "transformer") == torch.bfloat16
    size = lambda d: sum(f.stat().st_size for f in (d / "transformer").glob("*.safetensors"))  # noqa: E731
    assert 0.45 < size(half) / size(full) < 0.55
    assert {p.dtype for p in load_from_export(half).model.parameters()} == {torch.bfloat16}  # auto on the CPU: as written
    assert {p.dtype for p in load_from_export(half, dtype="float32").model.parameters()} == {torch.float32}
    with pytest.raises(ExportError, match="--dtype"):
        export_run(run_dir, tmp_path / "bad", device="cpu", dtype="int8")
    assert not (tmp_path / "bad").exists()
