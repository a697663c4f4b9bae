"""benchmarks/policy_quality.py on a tiny budget (wamkit only: LeRobot is not installed in CI), its
"not run" rows when lerobot cannot be imported, and the LeRobot adapter inside wamkit's closed loop
(with a stand-in policy, so no lerobot is needed). The real numbers come from device runs."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import wamkit.sim  # noqa: F401 - picks the headless GL backend before metaworld imports mujoco
from tests.helpers import REPO, load_benchmark_script
from wamkit.eval import evaluate
from wamkit.eval.lerobot_adapter import LeRobotPolicy

SCRIPT = REPO / "benchmarks" / "policy_quality.py"


def test_wamkit_only_run_records_data_trains_evaluates_and_writes_table(tmp_path):
    out = tmp_path / "pq"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--methods", "wamkit", "--samples", "16", "--batch-size", "8", "--episodes", "2",
         "--max-steps", "8", "--record-episodes", "3", "--out", str(out), "--videos", "0"],
        capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    header = ("| method | samples seen | train wall time | params (trainable) | success (95% CI) | mean episode length "
              "| training peak GPU memory |")
    assert header in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| wamkit tiny Cosmos3 |")]
    assert len(rows) == 1 and rows[0].split("|")[2].strip() == "16", rows
    assert (out / "table.md").read_text() in proc.stdout

    # the default dataset was recorded under --out, and training used wamkit's train split of it
    info = json.loads((out / "data" / "metaworld_reach-v3" / "meta" / "info.json").read_text())
    assert info["total_episodes"] == 3
    result = json.loads((out / "results.json").read_text())
    assert result["train_episodes"] == 2 and len(result["val_episodes"]) == 1 and result["chunk"] == 8
    (row,) = result["rows"]
    assert row["method"] == "wamkit" and row["status"] == "ok"
    assert row["samples_seen"] == 16 and row["steps"] == 2 and row["batch_size"] == 8
    assert row["peak_memory_gib"] is None and rows[0].rstrip().endswith("| — (CPU) |")  # a GPU row gives its peak in GiB
    assert 0 < row["params_trainable"] <= row["params_total"] and row["train_wall_s"] > 0
    assert row["episodes"] == 2 and 0 <= row["successes"] <= 2
    assert 0 <= row["ci95"][0] <= row["success_rate"] <= row["ci95"][1] <= 1
    assert 1 <= row["mean_episode_length"] <= 8  # the --max-steps budget reached the harness
    assert "2 steps x 8 samples" in row["note"] and f"- wamkit tiny Cosmos3: {row['note']}" in proc.stdout
    assert (out / "eval" / "wamkit" / "results.json").is_file()


def test_lerobot_rows_say_why_they_did_not_run(monkeypatch):
    pq = load_benchmark_script(monkeypatch, "policy_quality")
    for name in [m for m in sys.modules if m == "lerobot" or m.startswith("lerobot.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "lerobot", None)  # import lerobot -> ImportError
    reasons = pq.probe_lerobot()
    assert set(reasons) == {"act", "diffusion"}
    assert all(r and r.startswith("lerobot not importable (") for r in reasons.values()), reasons
    rows = [pq.Row("act", status=f"not run: {reasons['act']}"), pq.Row("diffusion", status=f"not run: {reasons['diffusion']}")]
    table = pq.markdown(rows, "header")
    assert f"| LeRobot ACT | — | — | — | not run: {reasons['act']} | — | — |" in table
    assert "| LeRobot Diffusion Policy |" in table


def test_a_gpu_row_reports_its_training_peak_memory(monkeypatch):
    pq = load_benchmark_script(monkeypatch, "policy_quality")
    row = pq.Row("act", status="ok", samples_seen=256, train_wall_s=1.0, params_total=10, params_trainable=10, successes=1,
                 episodes=2, success_rate=0.5, ci95=[0.1, 0.9], mean_episode_length=100.0, peak_memory_gib=3.25)
    assert pq.markdown([row], "header").splitlines()[4].endswith("| 100.0 | 3.2 GiB |")
    assert pq.peak_memory_gib("cpu") is None


class _StandInPolicy(torch.nn.Module):
    """Duck-types a LeRobot diffusion policy: records what it is given, returns a fixed chunk."""

    name = "diffusion"

    def __init__(self, horizon: int):
        super().__init__()
        self.horizon, self.seen = horizon, []

    def predict_action_chunk(self, batch):
        self.seen.append({k: v.clone() for k, v in batch.items()})
        b = batch["observation.state"].shape[0]
        return torch.tensor([0.5, 0.0, 0.0, -1.0]).expand(b, self.horizon, 4).clone()


def test_adapter_feeds_raw_observations_and_runs_in_the_closed_loop():
    inner = _StandInPolicy(horizon=6)
    scale = lambda x: {k: v * 2 if k == "observation.state" else v for k, v in x.items()}  # noqa: E731
    policy = LeRobotPolicy(inner, scale, lambda a: a / 2, camera_keys=["observation.images.front"], chunk_length=4,
                           action_dim=4, state_dim=4, fps=80.0, source={"step": 7})
    image = np.full((8, 8, 3), 255, np.uint8)
    (chunk,) = policy.predict([{"image": image, "state": np.arange(4, dtype=np.float32), "prompt": "x"}], seed=3)
    assert chunk.dtype == np.float32 and chunk.shape == (4, 4)  # sliced to chunk_length, postprocessed
    np.testing.assert_allclose(chunk[0], [0.25, 0.0, 0.0, -0.5])
    seen = inner.seen[-1]
    assert seen["observation.images.front"].shape == (1, 3, 8, 8) and float(seen["observation.images.front"].max()) == 1.0
    assert seen["observation.state"].shape == (1, 1, 4)  # diffusion policy: [B, n_obs_steps, Ds]
    np.testing.assert_allclose(seen["observation.state"][0, 0].numpy(), [0, 2, 4, 6])
    with pytest.raises(ValueError, match="state"):
        policy.predict([{"image": image, "state": np.zeros(3), "prompt": "x"}])

    result = evaluate(policy, "metaworld/reach-v3", episodes=1, seed=5, resolution=32, max_episode_steps=10)
    assert result.per_episode[0].length == 10 and result.per_episode[0].replans == 3  # 4 + 4 + 2 steps
    assert result.chunk_length == 4 and result.training_step == 7
    assert inner.seen[-1]["observation.images.front"].shape == (1, 3, 32, 32)


def test_adapter_takes_every_camera_of_a_two_camera_recording_in_the_closed_loop():
    """A policy trained on `--camera corner,topview` is evaluated with both views, each under its own key."""
    inner = _StandInPolicy(horizon=4)
    keys = ["observation.images.corner", "observation.images.topview"]
    policy = LeRobotPolicy(inner, lambda x: x, lambda a: a, camera_keys=keys, chunk_length=4, action_dim=4, state_dim=4,
                           fps=80.0, source={"step": 1})
    with pytest.raises(ValueError, match="1 view"):
        policy.predict([{"image": np.zeros((8, 8, 3), np.uint8), "state": np.zeros(4, np.float32), "prompt": "x"}])

    evaluate(policy, "metaworld/reach-v3", episodes=1, seed=5, resolution=32, max_episode_steps=4)
    seen = inner.seen[-1]
    assert all(seen[k].shape == (1, 3, 32, 32) for k in keys)
    assert not torch.equal(seen[keys[0]], seen[keys[1]])  # two different cameras, not one view twice
