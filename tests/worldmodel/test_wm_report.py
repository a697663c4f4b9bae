"""End to end: train a tiny forward-dynamics model for a few steps, then evaluate it as a world
model on one episode in both modes and check every report file."""

import json

import pytest
import torch

from wamkit.config import load_experiment
from wamkit.data import write_demo_dataset
from wamkit.train.trainer import Trainer
from wamkit.worldmodel import WorldModel, WorldModelError, eval_wm_main
from wamkit.worldmodel.rollout import chunk_starts



@pytest.fixture(scope="module")
def fd_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("wm")
    data = write_demo_dataset(root / "reach", num_episodes=8)
    cfg = load_experiment("recipes/demo_tiny.toml", [
        'model.mode="forward_dynamics"', f'job.output_root="{root / "runs"}"', f'data.path="{data}"',
        "data.generate_demo=false", "trainer.max_iter=4", "checkpoint.save_iter=4", "trainer.samples_per_step=2",
        "trainer.progress_bar=false", "trainer.val_every=0", "scheduler.warm_up_steps=[1]",
    ])
    Trainer(cfg).train()
    return root / "runs" / cfg.job.name, data


def test_chunk_starts():
    assert chunk_starts(17, 8) == [0, 8]
    assert chunk_starts(16, 8) == [0]
    assert chunk_starts(8, 8) == []


def test_episodes_rolled_out_together_equal_each_alone(fd_run):
    """Batching chunks across episodes (autoregressive: chunk k of every episode at once) changes no
    video: noise is per (seed, episode, chunk). Episodes of different lengths drop out as they end."""
    from wamkit.data import LeRobotV3Dataset
    from wamkit.worldmodel.rollout import load_episode, rollout_episode, rollout_episodes

    run, data = fd_run
    wm = WorldModel.from_path(run, num_steps=3)
    dataset = LeRobotV3Dataset(data)
    eps = [load_episode(dataset, e, wm.contract) for e in (0, 1, 2)]
    eps[1].frames, eps[1].actions = eps[1].frames[:17], eps[1].actions[:16]  # 2 chunks where the others have more
    for mode in ("autoregressive", "teacher_forced"):
        together = rollout_episodes(wm, eps, mode, seed=5, max_batch=2)
        alone = [rollout_episode(wm, ep, mode, seed=5) for ep in eps]
        assert [r.starts for r in together] == [r.starts for r in alone] and len(together[1].starts) == 2
        for a, b in zip(together, alone):
            assert a.pred.shape == b.pred.shape and (a.pred.int() - b.pred.int()).abs().max() <= 1
            assert torch.equal(a.baseline, b.baseline)
        assert sum(r.wall_seconds for r in together) > 0


def test_the_first_rollout_warms_the_model_up_untimed_and_once(fd_run):
    """The real-time factor measures steady generation: the model's first batch runs once, untimed, and
    its seconds are kept apart; the videos are the ones a model that never warmed up would make."""
    from wamkit.data import LeRobotV3Dataset
    from wamkit.worldmodel.report import score
    from wamkit.worldmodel.rollout import load_episode, rollout_episodes

    run, data = fd_run
    wm = WorldModel.from_path(run, num_steps=2)
    eps = [load_episode(LeRobotV3Dataset(data), e, wm.contract) for e in (0, 1)]
    first = rollout_episodes(wm, eps, "autoregressive", seed=3)
    again = rollout_episodes(wm, eps, "autoregressive", seed=3)
    assert score(first, "pred", wm.fps)["warmup_seconds"] > 0 and score(again, "pred", wm.fps)["warmup_seconds"] == 0
    assert all(torch.equal(a.pred, b.pred) for a, b in zip(first, again))
    predict, batches = wm.predict, []

    def counting(first_frames, *rest):
        batches.append(len(first_frames))
        return predict(first_frames, *rest)

    wm.predict, wm.warmed_up = counting, False
    rollout_episodes(wm, eps, "autoregressive", seed=3)
    # the warm-up (chunk 0 of both episodes), then one batch per chunk index k
    assert batches[0] == len(eps) and len(batches) == 1 + max(len(r.starts) for r in first)


def test_eval_wm_writes_a_complete_report(fd_run, tmp_path):
    run_dir, data = fd_run
    out = tmp_path / "report"
    rc = eval_wm_main(run_dir, dataset=str(data), episodes=[0], modes=["teacher_forced", "autoregressive"],
                      out_dir=out, num_steps=2, shift=10.0, guidance=1.0, seed=0)
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert report["format"] == "wamkit-wm-report" and report["episodes"] == [0]
    assert report["settings"]["num_steps"] == 2 and report["settings"]["shift"] == 10.0
    for mode in ("teacher_forced", "autoregressive"):
        res = report["results"][mode]
        for which in ("model", "baseline"):
            r = res[which]
            assert r["psnr"] is not None and 0 <= r["ssim"] <= 1
            assert r["per_chunk"] and all(len(c["psnr_by_step"]) == 8 for c in r["per_chunk"])
            assert {"frames", "seconds", "reached_end", "threshold_db"} <= set(r["usable_horizon"])
        assert res["model"]["real_time_factor"] > 0 and res["baseline"]["motion_ratio"] == 0.0
        assert len(res["model"]["psnr_by_chunk_step"]) == 8
        assert (out / "videos" / f"ep000_{mode}.mp4").stat().st_size > 0
        assert (out / "plots" / f"{mode}_psnr.png").stat().st_size > 0  # matplotlib is a dependency
    n_chunks = len(report["results"]["autoregressive"]["model"]["per_chunk"])
    assert len(report["results"]["autoregressive"]["model"]["psnr_by_horizon"]) == 8 * n_chunks
    # chunk 0 has the same conditioning and noise in both modes
    tf0 = report["results"]["teacher_forced"]["model"]["per_chunk"][0]["psnr_by_step"]
    ar0 = report["results"]["autoregressive"]["model"]["per_chunk"][0]["psnr_by_step"]
    assert tf0 == pytest.approx(ar0)
    probes = report["probes"]["0"]
    assert set(probes["model"]["axes"]) == {"0", "1", "2"} and "separation_deg" in probes["model"]
    assert (out / "videos" / "ep000_probes.mp4").stat().st_size > 0
    md = (out / "report.md").read_text()
    assert "copy-last-frame baseline" in md and md.count("| teacher_forced |") == 2 and md.count("| autoregressive |") == 2
    for f in report["files"]:
        assert (out / f).exists(), f


def test_policy_checkpoints_are_refused_with_a_fix(fd_run):
    from wamkit.policy.loading import load_from_checkpoint

    loaded = load_from_checkpoint(fd_run[0])
    loaded.model_info["mode"] = "policy"
    with pytest.raises(WorldModelError, match="forward_dynamics"):
        WorldModel(loaded)
    wm = WorldModel(loaded, allow_any_mode=True, num_steps=1)
    assert wm.chunk_length == 8 and wm.use_state


def test_compose_views_matches_training_tiling():
    import numpy as np

    from wamkit.worldmodel.rollout import compose_views

    a = np.zeros((3, 8, 8, 3), np.uint8)
    b = np.full((3, 8, 8, 3), 200, np.uint8)
    tiled = compose_views([a, b], None)
    assert tiled.shape == (3, 8, 16, 3) and int(tiled[0, 0, 8, 0]) == 200
    same = compose_views([a, b], {"camera_layout": "side_by_side", "resolution": 0, "wrist_index": 0})
    assert torch.equal(same, tiled)


def test_held_out_evaluates_every_validation_episode(fd_run, tmp_path):
    """`eval wm --held-out`: all of the run's validation episodes, as its contract recorded them."""
    run_dir, data = fd_run
    val_episodes = WorldModel.from_path(run_dir).contract["val_episodes"]
    assert len(val_episodes) >= 1
    rc = eval_wm_main(run_dir, dataset=str(data), episodes="held_out", modes=["teacher_forced"], out_dir=tmp_path,
                      num_steps=1, probes=False)
    assert rc == 0
    assert json.loads((tmp_path / "report.json").read_text())["episodes"] == [int(e) for e in val_episodes]


def test_rollouts_sample_flex_runs_with_per_sample():
    """Flex recompiles for every new rollout pack, so world models sample flex-trained runs with the
    exact per_sample backend; every other backend is kept, and an explicit choice wins."""
    from wamkit.worldmodel.rollout import sampling_attention

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert sampling_attention("flex", cuda, torch.bfloat16) == "per_sample"
    assert sampling_attention("auto", cuda, torch.bfloat16) == "per_sample"  # auto resolves to flex there
    assert sampling_attention("sdpa", cuda, torch.bfloat16) == "sdpa"
    assert sampling_attention("auto", cpu, torch.float32) == "per_sample"


def test_eval_wm_attention_override(fd_run, tmp_path):
    """`eval wm --attention sdpa` samples with dense masks: the same report numbers as the default."""
    from wamkit.model.attention import PackedAttention, PerSampleAttention

    run_dir, data = fd_run
    assert type(WorldModel.from_path(run_dir, attention="sdpa").processor) is PackedAttention
    assert isinstance(WorldModel.from_path(run_dir).processor, PerSampleAttention)
    psnr = {}
    for backend in (None, "sdpa"):
        out = tmp_path / str(backend)
        eval_wm_main(run_dir, dataset=str(data), episodes=[0], modes=["teacher_forced"], out_dir=out, num_steps=2,
                     probes=False, attention=backend)
        psnr[backend] = json.loads((out / "report.json").read_text())["results"]["teacher_forced"]["model"]["psnr"]
    assert psnr[None] == pytest.approx(psnr["sdpa"], abs=1e-3)


def test_report_names_the_episodes_the_axes_and_ends_with_a_verdict(fd_run, tmp_path, capsys):
    run_dir, data = fd_run
    out = tmp_path / "named"
    assert eval_wm_main(run_dir, dataset=str(data), episodes=[0], modes=["teacher_forced"], out_dir=out, num_steps=1) == 0
    printed = capsys.readouterr().out
    assert f"evaluating episodes [0] of {data}" in printed and "held out of training" in printed
    assert "x real time (video s per compute s)" in printed
    assert "verdict teacher_forced: the model " in printed and "copy-last-frame by " in printed and " dB PSNR (" in printed
    report = json.loads((out / "report.json").read_text())
    names = report["action_names"]
    assert len(names) == 3
    md = (out / "report.md").read_text()
    assert f"| 0 | 0 {names[0]} |" in md  # probe rows carry the contract's action name
    assert md.rstrip().splitlines()[-1].startswith("- teacher_forced: the model ")  # the report ends with the verdict


def test_rollouts_profile_names_the_functions_per_predict(fd_run, monkeypatch, capsys):
    """WAMKIT_PROFILE_ROLLOUTS=1: the timed rollouts (not the warm-up) summarised per batched predict."""
    from wamkit.data import LeRobotV3Dataset
    from wamkit.train.step_profile import ROLLOUTS_ENV
    from wamkit.worldmodel.rollout import load_episode, rollout_episodes

    run, data = fd_run
    wm = WorldModel.from_path(run, num_steps=2)
    eps = [load_episode(LeRobotV3Dataset(data), e, wm.contract) for e in (0, 1)]
    monkeypatch.setenv(ROLLOUTS_ENV, "1")
    rollouts = rollout_episodes(wm, eps, "teacher_forced", max_batch=2)
    out = capsys.readouterr().out
    predicts = -(-sum(len(r.starts) for r in rollouts) // 2)
    assert f"profile of teacher_forced rollouts of 2 episodes ({predicts} predicts)" in out and "per predict:" in out
    assert "diffusers/models/transformers/transformer_cosmos3.py:forward" in out
    monkeypatch.setenv(ROLLOUTS_ENV, "0")
    rollout_episodes(wm, eps, "teacher_forced", max_batch=2)
    assert "profile of" not in capsys.readouterr().out


def test_a_world_model_rolls_out_in_bf16_close_to_fp32(fd_run):
    """`--dtype bfloat16` (a GPU's "auto" for a bf16-trained run): every weight in bf16, and the
    rollout is the fp32 one up to rounding, not another video."""
    from wamkit.data import LeRobotV3Dataset
    from wamkit.worldmodel.rollout import load_episode, rollout_episode

    run, data = fd_run
    full, half = WorldModel.from_path(run, num_steps=2), WorldModel.from_path(run, num_steps=2, dtype="bfloat16")
    assert {p.dtype for p in half.model.parameters()} == {torch.bfloat16}
    ep = load_episode(LeRobotV3Dataset(data), 0, full.contract)
    a, b = (rollout_episode(wm, ep, "autoregressive", seed=4).pred for wm in (full, half))
    assert a.shape == b.shape and a.dtype == b.dtype == torch.uint8
    diff = (a.int() - b.int()).abs().float()
    assert diff.max() > 0 and diff.mean() < 2.0  # rounding of a few levels, on average under 2 of 255
