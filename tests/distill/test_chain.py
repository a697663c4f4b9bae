"""The sim-bimanual 4-stage chain at tiny scale on CPU: stage 0 -> 1 (Trainer) -> 2 (TF-dCM) -> 3 (SF-DMD)
-> student export; stage 3's critic/student alternation and resume by run name."""

import json

import pytest
import torch
import torch.distributed.checkpoint as dcp

from tests.bimanual.tiny import recipe, tiny_overrides
from wamkit.bimanual import write_synthetic_bundle
from wamkit.config import load_experiment
from wamkit.distill import DistillTrainer, export_student, load_distill_recipe
from wamkit.errors import CheckpointError, ConfigError
from wamkit.train.metrics import read_metrics
from wamkit.train.trainer import Trainer


def _keys(iteration):
    return set(dcp.FileSystemReader(str(iteration)).read_metadata().state_dict_metadata)


def _top(keys):
    return {k.split(".")[0] for k in keys}


def test_four_stage_chain(tmp_path):
    bundle = write_synthetic_bundle(tmp_path / "bundle", samples=8)
    runs = tmp_path / "runs"
    t0 = Trainer(load_experiment(recipe(0), tiny_overrides(bundle, runs, "c-stage0", 2, chunk_frames=0)))
    s0 = t0.train()
    stage0 = s0["latest_checkpoint"]
    assert t0.objective.causal_chunk_frames == 0

    t1 = Trainer(load_experiment(recipe(1), tiny_overrides(bundle, runs, "c-stage1", 2, stage0)))
    assert t1.init_note.startswith("fresh run from base weights (wamkit checkpoint)") and t1.objective.causal_chunk_frames == 1
    s1 = t1.train()
    stage1 = s1["latest_checkpoint"]
    assert s1["step"] == 2 and not t1.optimizer.state == {}  # fresh optimizer state, stepped twice

    cfg2, d2 = load_distill_recipe(recipe(2), tiny_overrides(bundle, runs, "c-stage2", 2, stage1, extra={"distill.teacher_path": f'"{stage1}"'}))
    s2 = DistillTrainer(cfg2, d2).train()
    assert s2["student_updates"] == 2 and s2["critic_updates"] == 0
    keys2 = _top(_keys(s2["latest_checkpoint"]))
    assert {"model", "optimizer", "ema", "scheduler"} <= keys2 and "teacher" not in keys2 and "critic" not in keys2
    losses = [r["loss"] for r in read_metrics(runs / "c-stage2" / "metrics.jsonl")]
    assert len(losses) == 2 and all(l == l and l < float("inf") for l in losses)

    extra3 = {"distill.reference_path": f'"{stage0}"', "distill.critic_path": f'"{stage0}"'}
    cfg3, d3 = load_distill_recipe(recipe(3), tiny_overrides(bundle, runs, "c-stage3", 7, s2["latest_checkpoint"], extra=extra3))
    first = DistillTrainer(cfg3, d3).train()  # interrupted after 7 iterations (critic x6 incl. step 7, student x1)
    assert (first["critic_updates"], first["student_updates"]) == (6, 1)
    cfg3, d3 = load_distill_recipe(recipe(3), tiny_overrides(bundle, runs, "c-stage3", 12, s2["latest_checkpoint"], extra=extra3))
    resumed = DistillTrainer(cfg3, d3)
    s3 = resumed.train()  # same run name: resumes at step 7
    assert resumed.latest is not None and s3["step"] == 12
    student = dict(resumed.student.named_parameters())
    frozen = [n for n, _ in resumed.ema_model.named_parameters() if n not in resumed.ema.shadow]
    assert frozen, "the tiny model has no frozen (text-pathway) weights"
    for name, param in resumed.ema_model.named_parameters():  # after a resume too: the student's, not the build's
        expected = student[name] if name in frozen else resumed.ema.shadow[name]
        assert torch.equal(param.detach(), expected.detach()), name
    assert (s3["critic_updates"], s3["student_updates"]) == (10, 2)
    roles = [r["role"] for r in read_metrics(runs / "c-stage3" / "metrics.jsonl")]
    assert roles == ["critic"] * 5 + ["student"] + ["critic"] * 5 + ["student"]
    keys3 = _keys(s3["latest_checkpoint"])
    assert {"model", "optimizer", "ema", "critic", "critic_optimizer", "critic_scheduler"} <= _top(keys3)
    assert any(k.startswith("optimizer.state.") for k in keys3) and any(k.startswith("critic_optimizer.state.") for k in keys3)
    assert "reference" not in _top(keys3)

    out = export_student(s3["latest_checkpoint"], tmp_path / "student")
    student = json.loads((out / "student.json").read_text())
    assert student["variant"] == "student_ema" and student["sampling"]["num_steps"] == 4 and len(student["sampling"]["sigmas"]) == 5
    manifest = json.loads((out / "wamkit.json").read_text())
    assert manifest["source"]["weights"] == "ema" and manifest["data_contract"]["action_dim"] == 59
    with pytest.raises(CheckpointError, match="not a distillation"):
        export_student(stage1, tmp_path / "not_student")


def test_distill_config_errors(tmp_path):
    bundle = write_synthetic_bundle(tmp_path / "bundle", samples=4)
    with pytest.raises(ConfigError, match="teacher_path"):
        load_distill_recipe(recipe(2), tiny_overrides(bundle, tmp_path, "x", 1, "", extra={"distill.teacher_path": '""'}))
    with pytest.raises(ConfigError, match="causal_chunk_frames"):
        load_distill_recipe(recipe(2), tiny_overrides(bundle, tmp_path, "x", 1, "", chunk_frames=0, extra={"distill.teacher_path": '"a"'}))
    with pytest.raises(ConfigError, match="video_prediction"):
        load_distill_recipe(recipe(2), tiny_overrides(bundle, tmp_path, "x", 1, "", extra={"distill.teacher_path": '"a"',
                                                                                           "diffusion.video_prediction": '"x0"'}))
    with pytest.raises(ConfigError, match="unknown key"):
        load_distill_recipe(recipe(3), tiny_overrides(bundle, tmp_path, "x", 1, "", extra={"distill.critic_step": 3}))
