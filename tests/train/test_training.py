"""End-to-end training runs on the generated demo dataset."""

import json

import pytest
import torch

from tests.helpers import DEMO_RECIPE, quick_overrides, run_cli
from wamkit.config import load_experiment
from wamkit.model.cosmos3 import build_transformer


def _records(run_dir):
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_demo_policy_loss_falls_and_outputs_are_where_announced(demo_root, tmp_path):
    args = quick_overrides(demo_root, tmp_path, "learn", 60, 30) + ["--set", "trainer.samples_per_step=8", "--set", "trainer.val_every=30"]
    proc = run_cli(["train", str(DEMO_RECIPE), *args])
    summary = json.loads(proc.stdout.split("[wamkit] done: ", 1)[1])
    assert summary["latest_checkpoint"].endswith("iter_000000060")
    records = _records(tmp_path / "learn")
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 60 and all(r["step"] for r in records)
    first, last = sum(losses[:15]) / 15, sum(losses[-15:]) / 15
    assert last < 0.7 * first, (first, last)  # 0.55 on the dev box (60 steps)
    vals = [r for r in records if "val_loss" in r]
    assert len(vals) == 2 and vals[1]["val_loss"] < vals[0]["val_loss"]
    # the parts, unweighted: the total is the recipe's weighted sum of them
    for r in vals:
        assert r["val_loss"] == pytest.approx(1.0 * r["val_video_loss"] + 10.0 * r["val_action_loss"], rel=1e-5)
    assert any((tmp_path / "learn" / "tensorboard").iterdir())
    contract = json.loads((tmp_path / "learn" / "data_contract.json").read_text())
    assert contract["action_dim"] == 3 and contract["state_dim"] == 4 and contract["chunk_length"] == 8
    assert set(contract["train_episodes"]).isdisjoint(contract["val_episodes"])


def test_new_run_name_starts_from_base_weights(demo_root, tmp_path):
    base = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=32)
    base.save_pretrained(tmp_path / "base" / "transformer")
    # the base ships no tokenizer files: say that it embeds byte ids (else a ConfigError, tests/model/test_text_tokenizer.py)
    args = quick_overrides(demo_root, tmp_path, "from_base", 3, 3) + ["--set", f'checkpoint.load_path="{tmp_path / "base"}"',
                                                                      "--set", 'model.text_tokenizer_path="byte"']
    proc = run_cli(["train", str(DEMO_RECIPE), *args])
    assert "fresh run from base weights (diffusers transformer)" in proc.stdout
    # a later stage can start from this run's checkpoint as its base
    chained = quick_overrides(demo_root, tmp_path, "chained", 3, 3) + ["--set", f'checkpoint.load_path="{tmp_path / "from_base" / "checkpoints" / "iter_000000003"}"']
    assert "base weights (wamkit checkpoint)" in run_cli(["train", str(DEMO_RECIPE), *chained]).stdout


def test_action_dim_larger_than_max_action_dim_is_refused(demo_root, tmp_path):
    args = quick_overrides(demo_root, tmp_path, "narrow", 2, 2) + ["--set", "model.max_action_dim=2"]
    proc = run_cli(["train", str(DEMO_RECIPE), *args], check=False)
    assert proc.returncode == 2
    assert "max_action_dim" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "narrow" / "checkpoints").exists()


def test_missing_info_json_is_named(tmp_path):
    (tmp_path / "empty" / "meta").mkdir(parents=True)
    args = quick_overrides(tmp_path / "empty", tmp_path, "nodata", 2, 2)
    proc = run_cli(["train", str(DEMO_RECIPE), *args], check=False)
    assert proc.returncode == 2 and "meta/info.json" in proc.stderr


def test_stats_with_zero_range_are_refused_before_training(demo_root, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(demo_root, broken)
    stats = json.loads((broken / "meta" / "stats.json").read_text())
    stats["action"]["max"] = stats["action"]["min"]
    (broken / "meta" / "stats.json").write_text(json.dumps(stats))
    proc = run_cli(["train", str(DEMO_RECIPE), *quick_overrides(broken, tmp_path, "zr", 2, 2)], check=False)
    assert proc.returncode == 2 and "stats.json" in proc.stderr and "action" in proc.stderr


def test_token_budget_sets_the_samples_per_packed_sequence(demo_root, tmp_path):
    # demo windows: the recipe's max_text_tokens + 3 latent frames x 16 patches + 8 actions + 1 state row
    tokens = load_experiment(DEMO_RECIPE).model.max_text_tokens + 3 * 16 + 8 + 1
    budget = ["--set", f"trainer.max_tokens_per_batch={3 * tokens + tokens // 2}", "--set", "scheduler.warm_up_steps=[1]"]
    run_cli(["train", str(DEMO_RECIPE), *quick_overrides(demo_root, tmp_path, "budget", 2, 2), *budget])
    resolved = json.loads((tmp_path / "budget" / "resolved_config.json").read_text())
    assert resolved["trainer"]["samples_per_step"] == 3  # floor(3.5 windows)
    small = quick_overrides(demo_root, tmp_path, "tiny_budget", 2, 2) + ["--set", "trainer.max_tokens_per_batch=50", "--set", "scheduler.warm_up_steps=[1]"]
    proc = run_cli(["train", str(DEMO_RECIPE), *small], check=False)
    assert proc.returncode == 2 and "trainer.max_tokens_per_batch" in proc.stderr and f"{tokens} tokens" in proc.stderr


def test_full_activation_checkpointing_trains_packed_samples(demo_root, tmp_path):
    """Full checkpointing re-runs each layer in the backward pass, after the forward returned: the
    packed attention layout must still be there (the DROID and SO-101 recipes train this way)."""
    args = quick_overrides(demo_root, tmp_path, "full_ac", 3, 3) + ["--set", 'parallel.activation_checkpointing="full"']
    run_cli(["train", str(DEMO_RECIPE), *args])
    losses = [json.loads(line)["loss"] for line in (tmp_path / "full_ac" / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 3 and all(v == v for v in losses)


def test_only_logged_steps_wait_for_the_device(demo_root, tmp_path, monkeypatch):
    """The step timer's read is the step's one wait for the GPU: steps between log steps skip it (the
    host queues ahead), and a logged step's rates cover every step since the last one."""
    from tests.helpers import train_in_process
    from wamkit.train.step_timer import StepTimer

    reads = []
    real_read = StepTimer.read
    monkeypatch.setattr(StepTimer, "read", lambda self: reads.append(1) or real_read(self))
    args = quick_overrides(demo_root, tmp_path, "interval", 7, 7) + ["--set", "trainer.log_every=3"]
    train_in_process([str(DEMO_RECIPE), *args])
    records = [r for r in _records(tmp_path / "interval") if "loss" in r]
    assert [r["step"] for r in records] == [3, 6, 7]  # logged every 3 steps and at the final save
    assert len(reads) == 4  # the first step, then the logged ones
    for r in records:
        assert r["time_forward_backward_s"] > 0 and r["step_s"] > 0
    assert records[0]["samples_per_s"] * records[0]["step_s"] * 2 == pytest.approx(8.0, rel=1e-6)  # steps 2-3, 4 samples each
