"""How `wamkit distill` builds its models. Every model (student, EMA, teacher / reference, critic) is built
the way the Trainer does on a GPU: on the meta device, materialised on the run's device, weights read into
the shards (`parallel.init = "meta"`, the default on CUDA); on the CPU that path must give the eager
build's models and losses, for TF-dCM (stage 2) and SF-DMD (stage 3). Settings it cannot honour are
refused before anything is built."""

import pytest
import torch

from tests.bimanual.tiny import recipe, tiny_overrides
from wamkit.distill import DistillTrainer, load_distill_recipe
from wamkit.errors import ConfigError
from wamkit.train.metrics import read_metrics


def _distill(chain, stage, init, iters):
    bundle, runs, stage0, stage1 = chain
    extra = ({"distill.teacher_path": f'"{stage1}"'} if stage == 2
             else {"distill.reference_path": f'"{stage0}"', "distill.critic_path": f'"{stage0}"'})
    extra["parallel.init"] = f'"{init}"'
    name = f"m{stage}-{init}"
    trainer = DistillTrainer(*load_distill_recipe(recipe(stage), tiny_overrides(bundle, runs, name, iters, stage1, extra=extra)), device="cpu")
    return trainer, runs / name


@pytest.mark.parametrize("stage,iters", [(2, 2), (3, 6)])
def test_meta_built_models_distill_like_eager_ones(chain, stage, iters):
    meta, meta_dir = _distill(chain, stage, "meta", iters)
    eager, eager_dir = _distill(chain, stage, "eager", iters)
    assert meta.on_meta and not eager.on_meta
    roles = ["student", "teacher"] if stage == 2 else ["student", "reference", "critic"]
    for role in roles:  # loaded weights identical; nothing left on the meta device
        got, want = getattr(meta, role).state_dict(), getattr(eager, role).state_dict()
        assert got.keys() == want.keys()
        for name in want:
            assert got[name].device.type == "cpu", f"{role} {name}"
            torch.testing.assert_close(got[name], want[name], rtol=0, atol=0, msg=f"{role} {name}")
    meta.train(), eager.train()
    got = [(r["role"], r["loss"]) for r in read_metrics(meta_dir / "metrics.jsonl")]
    want = [(r["role"], r["loss"]) for r in read_metrics(eager_dir / "metrics.jsonl")]
    assert len(got) == iters and [r for r, _ in got] == [r for r, _ in want]
    torch.testing.assert_close(torch.tensor([l for _, l in got]), torch.tensor([l for _, l in want]), rtol=1e-5, atol=1e-7)


def test_a_missing_teacher_is_named_before_anything_is_built(chain, tmp_path):
    bundle, runs, _, stage1 = chain
    overrides = tiny_overrides(bundle, runs, "m-missing", 1, stage1,
                               extra={"distill.teacher_path": f'"{tmp_path / "nowhere"}"', "parallel.init": '"meta"'})
    with pytest.raises(ConfigError, match="distill.teacher_path"):
        DistillTrainer(*load_distill_recipe(recipe(2), overrides), device="cpu")


def test_full_activation_checkpointing_is_refused_with_the_working_choices(chain):
    bundle, runs, _, stage1 = chain
    overrides = tiny_overrides(bundle, runs, "m-full-ac", 1, stage1,
                               extra={"distill.teacher_path": f'"{stage1}"', "parallel.activation_checkpointing": '"full"'})
    with pytest.raises(ConfigError, match="parallel.activation_checkpointing") as err:
        DistillTrainer(*load_distill_recipe(recipe(2), overrides), device="cpu")
    assert "'selective'" in err.value.fix


def test_lora_is_refused_rather_than_silently_training_full_weights(chain):
    bundle, runs, _, stage1 = chain
    overrides = tiny_overrides(bundle, runs, "m-lora", 1, stage1, extra={"distill.teacher_path": f'"{stage1}"', "lora.enabled": "true"})
    with pytest.raises(ConfigError, match="lora.enabled") as err:
        load_distill_recipe(recipe(2), overrides)
    assert "--dry-run" in err.value.fix
