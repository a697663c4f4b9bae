"""Where a run computes: `--device auto` picks the GPU when there is one, and every module of a run
(transformer, video tokenizer, EMA) is built on the Trainer's device. The meta device stands in for
a GPU here: a module built without the run's device (a VAE left on the host) shows up as a CPU tensor."""

import pytest
import torch

from tests.helpers import DEMO_RECIPE, quick_overrides
from wamkit.config import load_experiment
from wamkit.device import resolve_device
from wamkit.errors import ConfigError
from wamkit.train.trainer import Trainer


def _tensors(trainer):
    yield from (("transformer", n, t) for n, t in [*trainer.model.named_parameters(), *trainer.model.named_buffers()])
    yield from (("video tokenizer", n, t) for n, t in [*trainer.video_tokenizer.vae.named_parameters(), *trainer.video_tokenizer.vae.named_buffers()])
    yield from (("ema", n, t) for n, t in trainer.ema.shadow.items())


@pytest.mark.parametrize("init", ["eager", "meta"])
def test_every_module_of_a_run_is_built_on_the_trainers_device(demo_root, tiny_wan_dir, tmp_path, init):
    args = quick_overrides(demo_root, tmp_path, "placed", 4, 4) + [
        "--set", 'model.tokenizer="wan2.2"', "--set", f'model.vae_path="{tiny_wan_dir}"', "--set", f'parallel.init="{init}"']
    trainer = Trainer(load_experiment(DEMO_RECIPE, [a for a in args if a != "--set"]), device="meta")
    assert trainer.device == torch.device("meta")
    wrong = [f"{what} {name}: {t.device}" for what, name, t in _tensors(trainer) if t.device.type != "meta"]
    assert not wrong, wrong
    assert trainer.video_tokenizer.device.type == "meta"


def test_auto_is_the_cpu_without_a_gpu_and_cuda_without_one_is_a_named_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="--device"):
        resolve_device("cuda")


def test_auto_under_torchrun_takes_the_local_rank_gpu_and_explicit_cpu_warns(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device("auto") == torch.device("cuda", 1)
    assert resolve_device("cuda") == torch.device("cuda", 1)
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert resolve_device("cpu") == torch.device("cpu")
    assert "warning: --device cpu on a machine with a CUDA GPU" in capsys.readouterr().err
