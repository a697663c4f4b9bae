"""`wamkit eval wm-policy`: the world model as a policy evaluator. Tiny runs trained a few CPU steps
give the models; the true success rates are `wamkit eval sim` reports written by eval's own writer."""

import json

import numpy as np
import pytest
import torch

from wamkit.cli import main
from wamkit.config import load_experiment
from wamkit.data import LeRobotV3Dataset, write_demo_dataset
from wamkit.eval.report import write_report
from wamkit.eval.sim_eval import EvalResult, load_policy, wilson_interval
from wamkit.train.trainer import Trainer
from wamkit.worldmodel import WorldModel, WorldModelError, load_episode, rollout_episode
from wamkit.worldmodel import policy_eval as PE
from wamkit.worldmodel.state_model import StateTrack
from tests.helpers import DEMO_RECIPE, train_tiny_run

TASK = "reach the blue target"
EPISODES = [0, 1]  # both "reach the blue target" in the 8-episode demo dataset (seed 0)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An image-only `mixed` run (world model and policy checkpoints at steps 1..3) and a policy-mode
    run that uses the robot state."""
    root = tmp_path_factory.mktemp("wmp")
    data = write_demo_dataset(root / "reach", num_episodes=8)
    cfg = load_experiment(DEMO_RECIPE, [
        'model.mode="mixed"', 'job.name="mixed"', f'job.output_root="{root}"', f'data.path="{data}"',
        "data.generate_demo=false", "data.use_state=false", "trainer.max_iter=3", "checkpoint.save_iter=1",
        "trainer.samples_per_step=2", "trainer.progress_bar=false", "trainer.val_every=0", "scheduler.warm_up_steps=[1]",
    ])
    Trainer(cfg).train()
    return root / "mixed", train_tiny_run(root, "stateful"), data, root


def _ckpt(run, step):
    return run / "checkpoints" / f"iter_{step:09d}"


def _sim_report(out, step, successes, n=10, task=TASK, env="demo/reach", horizon=8, best_reward=None):
    """A results.json exactly as `wamkit eval sim` writes it (`best_reward`: a sim with a dense reward's mean best)."""
    r = EvalResult(env_name=env, task=task, episodes=n, successes=successes, success_rate=successes / n,
                   ci95=wilson_interval(successes, n), mean_episode_length=40.0, mean_success_length=None,
                   execute_horizon=horizon, chunk_length=8, max_episode_steps=100, resolution=64, seed=1, num_steps=2,
                   policy_source={}, training_step=step, seconds=1.0, mean_best_reward=best_reward,
                   best_reward_se=None if best_reward is None else 0.1)
    write_report(r, out)
    return out


def _wm(run):
    return WorldModel.from_path(run, num_steps=2)


# ---- rank correlation and scorer (no models) ---------------------------------------------------------
def test_average_ranks_spearman_and_kendall_by_hand():
    np.testing.assert_allclose(PE.average_ranks([10, 20, 20, 5]), [2, 3.5, 3.5, 1])
    assert PE.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert PE.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert PE.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)  # 1 - 6*2/(4*15)
    assert PE.kendall_tau_b([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(2 / 3)  # (5 - 1) / 6 pairs
    assert PE.spearman([1, 2, 3], [0.5, 0.5, 0.5]) is None and PE.kendall_tau_b([1, 2, 3], [0, 0, 0]) is None
    assert PE.rank_correlation([1, 2, 3], [0, 0, 0])["note"].startswith("undefined")


def test_episode_ranks_count_every_episode_once():
    """The mean of PSNRs lets one episode of wide spread decide; the episode rank counts each episode once."""
    per_episode = [[20.0, 20.0, 30.0],   # a: last on two episodes, far ahead on the third (mean 23.3)
                   [21.0, 21.0, 22.0]]   # b: first on two episodes (mean 21.3)
    ranks = PE.episode_ranks(per_episode)
    np.testing.assert_allclose(ranks, [5 / 3, 4 / 3])
    assert np.mean(per_episode[0]) > np.mean(per_episode[1]) and ranks[1] < ranks[0]
    np.testing.assert_allclose(PE.episode_ranks([[1.0, 2.0], [1.0, 3.0], [0.0, 2.0]]), [2.0, 1.25, 2.75])  # ties share
    assert PE.episode_ranks([[1.0, 2.0], [1.0]]) is None and PE.episode_ranks([[1.0], []]) is None  # no common episode set
    rows = [{"label": "a", "score": 23.3, "per_episode": per_episode[0], "success_rate": 0.2},
            {"label": "b", "score": 21.3, "per_episode": per_episode[1], "success_rate": 0.7}]
    PE._add_ranks(rows)
    assert [r["predicted_rank"] for r in rows] == [2.0, 1.0] and [r["true_rank"] for r in rows] == [2.0, 1.0]
    c = PE._correlations(rows)
    assert c["correlation"]["ranked_by"] == "episode_rank" and c["correlation"]["spearman_rho"] == 1.0
    assert c["correlation_by_aggregate"]["mean_score"]["spearman_rho"] == -1.0
    del rows[0]["per_episode"]  # a row without per-episode scores: the mean score ranks, and no stale episode rank stays
    PE._add_ranks(rows)
    assert all("episode_rank" not in r for r in rows) and [r["predicted_rank"] for r in rows] == [1.0, 2.0]
    assert PE._correlations(rows)["correlation"]["ranked_by"] == "mean_score"


def test_rank_correlations_match_scipy_with_ties():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for _ in range(20):
        x, y = rng.integers(0, 4, 7).astype(float), rng.integers(0, 5, 7).astype(float)
        if len(set(x)) < 2 or len(set(y)) < 2:
            continue
        assert PE.spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic)
        assert PE.kendall_tau_b(x, y) == pytest.approx(stats.kendalltau(x, y).statistic)


def test_exact_permutation_p_value():
    assert PE.spearman_p_exact([1, 2, 3], [1, 2, 3]) == pytest.approx(2 / 6)  # rho = +-1 in 2 of 3! orderings
    assert PE.spearman_p_exact([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(2 / 24)
    assert PE.spearman_p_exact([1, 2], [1, 2]) == 1.0
    assert PE.spearman_p_exact(list(range(9)), list(range(9))) is None  # too many orderings to enumerate


def _noisy(goal, amplitudes, seed=0):
    g = torch.Generator().manual_seed(seed)
    frames = [(goal.float() + a * torch.randn(goal.shape, generator=g)).clamp(0, 255).round().to(torch.uint8)
              for a in amplitudes]
    return torch.stack(frames)


def test_scorer_picks_the_closest_approach_or_the_last_frame():
    goal = torch.randint(0, 256, (16, 16, 3), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    curve = PE.goal_psnr(_noisy(goal, [60, 30, 5, 40]), goal)
    assert int(curve.argmax()) == 2 and curve[2] > curve[1] > curve[3] > curve[0]
    assert PE.rollout_score(curve, "best") == pytest.approx(float(curve[2]))
    assert PE.rollout_score(curve, "final") == pytest.approx(float(curve[3]))
    reached = PE.goal_psnr(torch.stack([goal, goal]), goal)  # identical frames: infinite PSNR, capped
    assert reached.tolist() == [100.0, 100.0]
    closer = PE.rollout_score(PE.goal_psnr(_noisy(goal, [20, 10]), goal))
    farther = PE.rollout_score(PE.goal_psnr(_noisy(goal, [20, 15]), goal))
    assert closer > farther
    with pytest.raises(WorldModelError, match="best"):
        PE.rollout_score(curve, "mean")


def test_changed_region_scores_the_moved_object_not_the_background():
    """A small object moves between the first and the goal frame over a textured background: the
    changed-region PSNR tells a rollout that left it where it was from one that moved it, far more
    sharply than the whole frame, and a frame equal to the goal there is capped however the rest differs."""
    g = torch.Generator().manual_seed(3)
    background = torch.randint(40, 200, (32, 32, 3), generator=g, dtype=torch.uint8)
    first, goal = background.clone(), background.clone()
    first[4:8, 4:8], goal[20:24, 20:24] = 255, 255  # the object's start and goal squares
    mask = PE.changed_mask(first, goal)
    assert mask[4:8, 4:8].all() and mask[20:24, 20:24].all() and mask[2, 2] and mask[25, 25]  # dilated by 2
    assert not mask[14, 14] and not mask[0, 31] and int(mask.sum()) == 2 * 8 * 8
    stayed, moved = first.clone(), goal.clone()
    moved[0:2] = 0  # reached the goal, but the top rows (background) are off
    frame = PE.goal_psnr(torch.stack([stayed, moved]), goal)
    region = PE.goal_psnr(torch.stack([stayed, moved]), goal, mask)
    assert region[1] == 100.0 and region[0] < frame[0]  # the object's miss weighs fully inside the region
    assert region[1] - region[0] > frame[1] - frame[0]
    # an empty region (the goal frame equals the first) falls back to the whole frame
    assert torch.equal(PE.goal_psnr(torch.stack([stayed]), goal, torch.zeros(32, 32, dtype=torch.bool)),
                       PE.goal_psnr(torch.stack([stayed]), goal))


def test_swapped_actions_drive_each_episode_with_the_one_half_the_list_away_cut_or_held():
    def ep(i, n):
        return PE.EpisodeData(i, torch.zeros(n, 4, 4, 3, dtype=torch.uint8), np.arange(n * 2, dtype=np.float32).reshape(n, 2) + 100 * i,
                              None, TASK)

    eps = [ep(0, 3), ep(1, 5)]
    swapped = PE.swapped_actions(eps)
    assert [s.episode for s in swapped] == [0, 1] and all(s.frames is e.frames for s, e in zip(swapped, eps))
    np.testing.assert_array_equal(swapped[0].actions, eps[1].actions[:3])  # the longer one's cut to length
    np.testing.assert_array_equal(swapped[1].actions, np.concatenate([eps[0].actions, eps[0].actions[-1:].repeat(2, 0)]))
    four = [ep(i, 4) for i in range(4)]  # e.g. two tasks of two episodes each, listed by index
    assert [int(s.actions[0, 0]) // 100 for s in PE.swapped_actions(four)] == [2, 3, 0, 1]  # always the other task


def test_sim_report_errors(tmp_path):
    with pytest.raises(WorldModelError, match="eval sim"):
        PE.load_sim_report(tmp_path / "nope")
    (tmp_path / "all.json").write_text(json.dumps([{"success_rate": 0.5}]))
    with pytest.raises(WorldModelError, match="step_<N>/results.json"):
        PE.load_sim_report(tmp_path / "all.json")
    (tmp_path / "bad.json").write_text(json.dumps({"env_name": "x"}))
    with pytest.raises(WorldModelError, match="lacks eval sim field"):
        PE.load_sim_report(tmp_path / "bad.json")
    r = PE.load_sim_report(_sim_report(tmp_path / "ok", 3, 4))  # a directory holding results.json
    assert (r.successes, r.episodes, r.training_step, r.execute_horizon) == (4, 10, 3, 8)
    assert r.ci95 == pytest.approx(wilson_interval(4, 10))


def test_cli_needs_two_policies_before_loading_anything(tmp_path, capsys):
    rep = _sim_report(tmp_path / "a", 1, 1)
    assert main(["eval", "wm-policy", "no_wm", "--policies", "p1", "--sim-reports", str(rep)]) == 2
    assert "at least 2" in capsys.readouterr().err
    assert main(["eval", "wm-policy", "no_wm", "--policies", "p1", "p2", "--sim-reports", str(rep)]) == 2
    assert "got 1 for 2 policies" in capsys.readouterr().err


# ---- with models ----------------------------------------------------------------------------------
class ReplayPolicy:
    """Replays an episode's recorded actions chunk after chunk (what the `expert` reference does)."""

    def __init__(self, actions, chunk):
        self.actions, self.chunk, self.t = actions, chunk, 0

    def predict(self, observations, seed=0, num_steps=None):
        assert len(observations) == 1 and observations[0]["image"].dtype == np.uint8
        chunk = self.actions[self.t:self.t + self.chunk].astype(np.float32)
        self.t += self.chunk
        return [chunk]


@pytest.mark.parametrize("chunks_per_plan", [1, 2])
def test_replaying_the_recorded_actions_reproduces_the_expert_rollout(runs, chunks_per_plan):
    run, _, data, _ = runs
    wm = _wm(run)
    ep = load_episode(LeRobotV3Dataset(data), 0, wm.contract)
    expert = rollout_episode(wm, ep, "autoregressive", seed=5).pred  # [N, T+1, ...]
    steps = 2 * wm.chunk_length - 3  # not a whole number of chunks: the video is cut to max_steps
    horizon = chunks_per_plan * wm.chunk_length  # one re-plan feeds the world model this many chunks
    video = PE.imagine(ReplayPolicy(ep.actions, horizon), wm, [ep], None, horizon, steps, seed=5)
    assert video.shape == (1, 1 + steps, *ep.frames.shape[1:]) and video.dtype == torch.uint8
    assert torch.equal(video[0, 0], ep.frames[0])
    assert torch.equal(video[0, 1:], torch.cat([c[1:] for c in expert])[:steps])  # same frames, actions, noise


def test_contract_and_state_mismatches_are_refused_with_a_fix(runs):
    run, stateful, _, _ = runs
    wm = _wm(run)
    policy = load_policy(stateful)
    with pytest.raises(WorldModelError, match="--state recorded"):
        PE.check_state(policy, wm, "none", "stateful")
    PE.check_state(policy, wm, "recorded", "stateful")
    PE.check_pair(policy, wm, "stateful", 64)
    with pytest.raises(WorldModelError, match="frame size"):
        PE.check_pair(policy, wm, "stateful", 32)
    with pytest.raises(WorldModelError, match="multiple of 8"):
        PE.check_horizon(policy, wm, 4, "stateful")
    policy.contract["fps"] = 80.0
    with pytest.raises(WorldModelError, match="fps"):
        PE.check_pair(policy, wm, "stateful", 64)
    policy.contract["fps"], policy.contract["action_dim"] = wm.fps, 4
    with pytest.raises(WorldModelError, match="(?s)action_dim.*same robot"):
        PE.check_pair(policy, wm, "stateful", 64)
    policy.contract["action_dim"] = wm.action_dim
    policy.loaded.model_info["mode"] = "forward_dynamics"
    with pytest.raises(WorldModelError, match="never learned to act"):
        PE.check_pair(policy, wm, "stateful", 64)


def test_eval_wm_policy_end_to_end(runs, tmp_path, capsys):
    run, stateful, data, _ = runs
    rewards = [2.0, 1.0, 5.0]  # the sim's graded measure, ordered unlike success
    reports = [_sim_report(tmp_path / f"sim/step_{s:09d}", s, k, best_reward=b) for (s, k), b in zip(((1, 1), (2, 6), (3, 3)), rewards)]
    out = tmp_path / "out"
    args = ["eval", "wm-policy", str(run), "--policies", *(str(_ckpt(run, s)) for s in (1, 2, 3)),
            "--sim-reports", *map(str, reports), "--episodes", *map(str, EPISODES), "--num-steps", "2",
            "--max-steps", "16", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert report["format"] == "wamkit-wm-policy-report" and report["episodes"] == EPISODES and report["task"] == TASK
    assert report["settings"]["max_steps"] == 16 and report["settings"]["state"] == "none"
    rows = report["policies"]
    assert [r["label"] for r in rows] == ["mixed@1", "mixed@2", "mixed@3"]
    assert [r["success_rate"] for r in rows] == [0.1, 0.6, 0.3] and [r["true_rank"] for r in rows] == [3, 1, 2]
    assert rows[1]["ci95"] == pytest.approx(wilson_interval(6, 10))
    for r in rows:
        assert len(r["per_episode"]) == 2 and len(r["goal_psnr_by_step"]) == 16
        assert r["score"] == pytest.approx(np.mean(r["per_episode"])) and 0 < r["score"] <= 100
        assert max(r["goal_psnr_by_step"]) <= r["score"] + 1e-9  # best: each episode's max over its curve
    scores = [r["score"] for r in rows]
    ranks = [np.mean([PE.average_ranks(-np.asarray([r["per_episode"][e] for r in rows]))[i] for e in range(2)])
             for i in range(3)]  # each policy's rank on each episode, averaged
    assert [r["episode_rank"] for r in rows] == pytest.approx(ranks)
    np.testing.assert_allclose([r["predicted_rank"] for r in rows], PE.average_ranks(ranks))
    corr = report["correlation"]
    assert corr["ranked_by"] == "episode_rank" and corr["n"] == 3
    assert corr["spearman_rho"] == pytest.approx(PE.spearman([-x for x in ranks], [0.1, 0.6, 0.3]))
    assert corr["kendall_tau_b"] == pytest.approx(PE.kendall_tau_b([-x for x in ranks], [0.1, 0.6, 0.3]))
    assert [r["best_reward"] for r in rows] == rewards  # the same ranking against the reward as well
    assert report["correlation_with_best_reward"]["spearman_rho"] == pytest.approx(PE.spearman([-x for x in ranks], rewards))
    mean_score = report["correlation_by_aggregate"]["mean_score"]
    assert mean_score["spearman_rho"] == pytest.approx(PE.spearman(scores, [0.1, 0.6, 0.3]))
    assert report["correlation_by_region"]["frame"] == mean_score  # the mean score is the whole frame's
    changed = [r["by_region"]["changed"]["score"] for r in rows]
    assert report["correlation_by_region"]["changed"]["spearman_rho"] == pytest.approx(PE.spearman(changed, [0.1, 0.6, 0.3]))
    assert all(r["by_region"]["frame"]["score"] == r["score"] and 0 < r["by_region"]["changed"]["score"] <= 100 for r in rows)
    assert list(report["references"]) == ["expert", "swapped_actions", "static"]  # two episodes: the swap is there
    assert all(set(ref["by_region"]) == set(PE.SCORE_REGIONS) for ref in report["references"].values())
    for f in report["files"]:
        assert (out / f).stat().st_size > 0, f
    assert "videos/mixed_step1.mp4" in report["files"] and "strip.png" in report["files"]
    md = (out / "report.md").read_text()
    assert md.count("| mixed@") == 3 and "Spearman rho" in md and "*expert (reference)*" in md
    assert "The mean score over the changed region alone: Spearman rho" in md and "changed-region score [dB]" in md
    assert "(ranked by the mean episode rank)" in md and "Ranked by the mean score instead: Spearman rho" in md
    assert "Against the sim's best shaped reward instead of success" in md and "Action response (expert minus swapped_actions" in md
    assert "| mixed@2 |" in printed and "Spearman rho" in printed

    # the reports must follow the policies' order (training steps are checked)
    assert main(args[:args.index("--sim-reports") + 1] + [str(reports[1]), str(reports[0]), str(reports[2])]
                + args[args.index("--episodes"):]) == 2
    assert "training step" in capsys.readouterr().err


def test_without_sim_reports_the_judge_ranks_the_policies_alone(runs, tmp_path, capsys):
    """A policy no simulator can evaluate (a real robot's) is still ranked: by the imagined score alone, over the
    policies' whole chunk (eval sim's default), with no success and no correlation claimed; a merge of such reports
    ranks their rows together the same way, and one given the sim reports afterwards equals the judge given them."""
    run = runs[0]
    out = tmp_path / "alone"
    args = ["eval", "wm-policy", str(run), "--policies", *(str(_ckpt(run, s)) for s in (1, 3)), "--episodes", *map(str, EPISODES),
            "--num-steps", "2", "--policy-steps", "2", "--max-steps", "16", "--no-videos", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert "correlation" not in report and report["env_name"] is None and report["episodes"] == EPISODES
    rows = report["policies"]
    assert all(r["success_rate"] is None and r["true_rank"] is None and r["sim_report"] is None for r in rows)
    assert all(r["execute_horizon"] == load_policy(_ckpt(run, 1)).chunk_length for r in rows)
    assert sorted(r["predicted_rank"] for r in rows) == [1.0, 2.0]
    best = min(rows, key=lambda r: r["predicted_rank"])
    assert best["episode_rank"] == min(r["episode_rank"] for r in rows)
    assert "No sim reports" in printed and printed.index(f"| {best['label']} |") < printed.index("(reference)")
    assert "env: none (no sim reports)" in (out / "report.md").read_text()
    merged = PE.merge_reports([out, out], tmp_path / "merged")  # the same judge twice: ties, still no correlation
    assert "correlation" not in merged and sorted(r["predicted_rank"] for r in merged["policies"]) == [1.5, 1.5, 3.5, 3.5]
    # the sim reports, when given, must still be one per policy
    rep = _sim_report(tmp_path / "one", 1, 1)
    assert main(args + ["--sim-reports", str(rep)]) == 2 and "got 1 for 2 policies" in capsys.readouterr().err

    # attached afterwards (a judge that ran beside the closed loops): the report the judge writes when given them
    sims = [str(_sim_report(tmp_path / f"sim/step_{s:09d}", s, k)) for s, k in ((1, 2), (3, 7))]
    merge = ["eval", "wm-policy-merge", str(out), "--out", str(tmp_path / "attached"), "--sim-reports"]
    assert main(merge + sims[::-1]) == 2 and "training step" in capsys.readouterr().err  # out of order
    assert main(merge + sims) == 0
    attached = json.loads((tmp_path / "attached" / "report.json").read_text())
    assert main(args[:-2] + ["--out", str(tmp_path / "with"), "--sim-reports", *sims]) == 0
    judged = json.loads((tmp_path / "with" / "report.json").read_text())
    assert attached["correlation"] == judged["correlation"] and attached["env_name"] == judged["env_name"] == "demo/reach"
    keys = ("score", "episode_rank", "predicted_rank", "success_rate", "true_rank", "ci95", "sim_report")
    assert [[r[k] for k in keys] for r in attached["policies"]] == [[r[k] for k in keys] for r in judged["policies"]]
    assert main(["eval", "wm-policy-merge", str(tmp_path / "with"), "--sim-reports", *sims]) == 2
    assert "has its sim success already" in capsys.readouterr().err


def test_state_policies_need_state_recorded(runs, tmp_path, capsys):
    run, stateful, _, _ = runs
    reports = [_sim_report(tmp_path / "r4", 4, 2), _sim_report(tmp_path / "r3", 3, 5)]
    args = ["eval", "wm-policy", str(run), "--policies", str(stateful), str(_ckpt(run, 3)), "--sim-reports",
            *map(str, reports), "--episodes", "0", "--num-steps", "2", "--max-steps", "8", "--no-videos",
            "--out", str(tmp_path / "out")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "policy stateful@4 use(s) a robot state" in err and "--state recorded" in err
    assert main(args + ["--state", "recorded"]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["settings"]["state"] == "recorded" and report["files"] == ["report.json", "report.md"]
    assert "approximation" in (tmp_path / "out" / "report.md").read_text()

    # affine: the state advanced by the actions taken, its model fit on the other 7 episodes and reported on episode 0
    assert main(args + ["--state", "affine", "--out", str(tmp_path / "affine")]) == 0
    report = json.loads((tmp_path / "affine" / "report.json").read_text())
    fit = report["state_model"]["observation.state"]
    assert report["settings"]["state"] == "affine" and fit["episodes"] == 1 and fit["fit_transitions"] > 0
    assert len(fit["step_change_r2"]) == len(fit["final_drift"]) == len(fit["range"]) > 0
    assert "advanced by the actions taken" in (tmp_path / "affine" / "report.md").read_text()


class _StateSpy:
    """A policy that records the states it is shown and always asks for the same action."""

    use_state, chunk_length = True, 8

    def __init__(self, action_dim: int):
        self.action_dim, self.seen = action_dim, []

    def predict(self, observations, seed=None, num_steps=None):
        self.seen.append(np.stack([o["state"] for o in observations]))
        return [np.full((self.chunk_length, self.action_dim), 0.7, dtype=np.float32) for _ in observations]


def test_affine_state_follows_the_policy_not_the_recording(runs):
    """With the affine model the policy sees the states its own actions lead to; with the recorded one, the expert's."""
    run, _, data, _ = runs
    wm, ds = _wm(run), LeRobotV3Dataset(data)
    contract = {**wm.contract, "use_state": True, "state_key": "observation.state"}
    ep = load_episode(ds, 0, contract)
    fitted = PE.fit_state_models(ds, ["observation.state"], "action", [ep])["observation.state"][0]
    recorded, affine = _StateSpy(wm.action_dim), _StateSpy(wm.action_dim)
    horizon = wm.chunk_length
    PE.imagine(recorded, wm, [ep], StateTrack([ep.states]), horizon, 3 * horizon, seed=5)
    PE.imagine(affine, wm, [ep], StateTrack([ep.states], fitted), horizon, 3 * horizon, seed=5)
    assert np.array_equal(np.stack(recorded.seen)[:, 0], ep.states[[0, horizon, 2 * horizon]])
    mine = fitted.roll(ep.states[0], np.full((2 * horizon + 1, wm.action_dim), 0.7))
    assert np.allclose(np.stack(affine.seen)[:, 0], mine[[0, horizon, 2 * horizon]])
    assert np.array_equal(affine.seen[0], recorded.seen[0])  # both start at the recorded first state


def test_references_follow_the_judges_state_mode(runs):
    """Under `affine` a reference driven by another episode's actions is shown the states those actions lead to,
    not the arm's recorded positions (a world model that draws the arm where its state row says would otherwise look
    as if it followed the swapped actions); under `recorded` (no state model) the recorded rows stay."""
    run, _, data, _ = runs
    wm, ds = _wm(run), LeRobotV3Dataset(data)
    wm.contract = {**wm.contract, "use_state": True, "state_key": "observation.state"}
    eps = [load_episode(ds, e, wm.contract) for e in EPISODES]
    models = PE.fit_state_models(ds, ["observation.state"], "action", eps)
    swapped = PE.swapped_actions(eps)
    assert PE._states_for_actions(wm, swapped, {}) is swapped  # recorded: nothing changes
    driven = PE._states_for_actions(wm, swapped, models)
    for ep, sw, dr in zip(eps, swapped, driven):
        np.testing.assert_allclose(dr.states, models["observation.state"][0].roll(ep.states[0], sw.actions))
        np.testing.assert_array_equal(dr.states[0], ep.states[0])  # from the episode's own observed first state
        assert not np.allclose(dr.states, ep.states) and dr.actions is sw.actions and dr.frames is ep.frames
    wm.contract = {**wm.contract, "use_state": False}
    assert PE._states_for_actions(wm, swapped, models) is swapped  # an image-only world model reads no state


def test_action_response_counts_the_episodes_the_swap_did_not_move():
    refs = {"expert": {"per_episode": [20.0, 19.0, 18.5, 21.0]}, "swapped_actions": {"per_episode": [19.0, 19.01, 18.5, 20.0]},
            "static": {"per_episode": [17.0] * 4}}
    r = PE.action_response(refs)
    assert r["episodes"] == 4 and r["unmoved"] == 2 and r["mean_db"] == pytest.approx((1.0 - 0.01 + 0 + 1.0) / 4)
    assert r["sem_db"] == pytest.approx(np.std([1.0, -0.01, 0.0, 1.0], ddof=1) / 2)
    assert "2 of 4 episodes moved less than 0.02 dB" in PE.action_response_text(r)
    assert PE.action_response({"expert": {"per_episode": [1.0]}, "static": {"per_episode": [0.0]}}) is None


class _ConstantLeRobotPolicy(torch.nn.Module):
    """Duck-types a LeRobot ACT policy (wamkit.eval.lerobot_adapter wraps it): one fixed chunk."""

    name = "act"

    def __init__(self, action_dim: int, horizon: int):
        super().__init__()
        self.action_dim, self.horizon = action_dim, horizon

    def predict_action_chunk(self, batch):
        return torch.full((batch["observation.state"].shape[0], self.horizon, self.action_dim), 0.1)


def test_a_lerobot_policy_judged_alone_merges_into_one_ranking_with_checkpoints(runs, tmp_path, capsys):
    """benchmarks/policy_quality.py judges ACT / DP in the process that trained them (min_policies=1); their
    reports and the checkpoints' (`wamkit eval wm-policy`) become one ranking (`wamkit eval wm-policy-merge`)."""
    from wamkit.eval.lerobot_adapter import LeRobotPolicy

    run, _, data, _ = runs
    wm, ds = _wm(run), LeRobotV3Dataset(data)
    contract = {**wm.contract, "state_key": "observation.state"}  # the image-only world model's data; ACT reads the state
    state_dim = int(ds.features["observation.state"]["shape"][0])
    policy = LeRobotPolicy(_ConstantLeRobotPolicy(wm.action_dim, 8), lambda x: x, lambda a: a, camera_keys=wm.camera_keys[:1],
                           chunk_length=8, action_dim=wm.action_dim, state_dim=state_dim, fps=wm.fps,
                           source={"method": "act", "step": 5}, contract=contract)
    settings = dict(episodes=EPISODES, state="recorded", max_steps=16, videos=False)
    act_report = [PE.load_sim_report(_sim_report(tmp_path / "sim_act", 5, 9))]
    with pytest.raises(WorldModelError, match="at least 2"):
        PE.evaluate_policies(wm, [policy], act_report, ds, tmp_path / "lone", **settings)
    lone = PE.evaluate_policies(wm, [policy], act_report, ds, tmp_path / "judge_act", min_policies=1, **settings)
    assert [r["label"] for r in lone["policies"]] == ["act@5"] and lone["correlation"]["n"] == 1

    reports = [_sim_report(tmp_path / f"sim/step_{s:09d}", s, k) for s, k in ((1, 1), (2, 6))]
    args = ["eval", "wm-policy", str(run), "--policies", str(_ckpt(run, 1)), str(_ckpt(run, 2)), "--sim-reports",
            *map(str, reports), "--dataset", str(data), "--episodes", *map(str, EPISODES), "--num-steps", "2",
            "--max-steps", "16", "--state", "recorded", "--no-videos", "--out", str(tmp_path / "judge_ckpts")]
    assert main(args) == 0
    capsys.readouterr()
    assert main(["eval", "wm-policy-merge", str(tmp_path / "judge_ckpts"), str(tmp_path / "judge_act" / "report.json"),
                 "--out", str(tmp_path / "merged")]) == 0
    assert "| act@5 |" in capsys.readouterr().out
    merged = json.loads((tmp_path / "merged" / "report.json").read_text())
    ckpts = json.loads((tmp_path / "judge_ckpts" / "report.json").read_text())
    rows = merged["policies"]
    assert [r["label"] for r in rows] == ["mixed@1", "mixed@2", "act@5"]
    scores = [r["score"] for r in rows]
    assert scores == [*(r["score"] for r in ckpts["policies"]), lone["policies"][0]["score"]]
    assert [r["true_rank"] for r in rows] == [3, 2, 1]  # 0.1, 0.6, 0.9
    assert lone["policies"][0]["episode_rank"] == 1.0  # alone, first on every episode; recomputed when merged:
    ranks = PE.episode_ranks([r["per_episode"] for r in rows])
    assert [r["episode_rank"] for r in rows] == pytest.approx(ranks)
    np.testing.assert_allclose([r["predicted_rank"] for r in rows], PE.average_ranks(ranks))
    assert merged["correlation"]["n"] == 3 and merged["correlation"]["ranked_by"] == "episode_rank"
    assert merged["correlation"]["spearman_rho"] == pytest.approx(PE.spearman(-ranks, [0.1, 0.6, 0.9]))
    assert merged["correlation_by_aggregate"]["mean_score"]["spearman_rho"] == pytest.approx(PE.spearman(scores, [0.1, 0.6, 0.9]))
    changed = [r["by_region"]["changed"]["score"] for r in rows]  # recomputed over the merged rows too
    assert merged["correlation_by_region"]["changed"]["spearman_rho"] == pytest.approx(PE.spearman(changed, [0.1, 0.6, 0.9]))
    assert "correlation_with_best_reward" not in merged  # sims without a dense reward: no second ranking is made up
    assert len(merged["merged_from"]) == 2 and "| act@5 |" in (tmp_path / "merged" / "report.md").read_text()

    # a report the world model wrote with other settings does not join the ranking
    other = args[:args.index("--max-steps") + 1] + ["8"] + args[args.index("--max-steps") + 2:-1] + [str(tmp_path / "judge_8")]
    assert main(other) == 0
    capsys.readouterr()
    assert main(["eval", "wm-policy-merge", str(tmp_path / "judge_ckpts"), str(tmp_path / "judge_8")]) == 2
    assert "settings" in capsys.readouterr().err


def test_policy_quality_judges_its_lerobot_rows_as_the_cli_would(runs, tmp_path, monkeypatch):
    """benchmarks/policy_quality.py --judge-world-model: a trained LeRobot policy's row gets its world-model
    score under <out>/judge/<method>, with settings that merge with the CLI's; a judge that fails leaves
    the row's closed-loop result standing and says why."""
    from types import SimpleNamespace

    from tests.helpers import load_benchmark_script
    from wamkit.eval.lerobot_adapter import LeRobotPolicy

    pq = load_benchmark_script(monkeypatch, "policy_quality")
    run, _, data, _ = runs
    wm = _wm(run)
    policy = LeRobotPolicy(_ConstantLeRobotPolicy(wm.action_dim, 8), lambda x: x, lambda a: a, camera_keys=wm.camera_keys[:1],
                           chunk_length=8, action_dim=wm.action_dim, fps=wm.fps, source={"method": "act", "step": 5},
                           state_dim=int(LeRobotV3Dataset(data).features["observation.state"]["shape"][0]),
                           contract={**wm.contract, "state_key": "observation.state"})
    out = tmp_path / "pq"
    _sim_report(out / "eval" / "act", 5, 9)
    args = SimpleNamespace(judge_world_model=str(run), device="cpu", judge_num_steps=2, judge_max_steps=16, judge_episodes=EPISODES,
                           judge_state=["recorded", "affine"])
    row = pq.Row("act")
    assert pq.judge_row(args, policy, row, out, 8)
    assert row.extra["judge"]["score"] == pytest.approx(json.loads((out / "judge" / "act" / "report.json").read_text())["policies"][0]["score"])
    second = json.loads((out / "judge_affine" / "act" / "report.json").read_text())  # the second mode, beside the first
    assert second["settings"]["state"] == "affine" and row.extra["judge_affine"]["score"] == pytest.approx(second["policies"][0]["score"])

    reports = [_sim_report(tmp_path / f"sim/step_{s:09d}", s, k) for s, k in ((1, 1), (2, 6))]
    assert main(["eval", "wm-policy", str(run), "--policies", str(_ckpt(run, 1)), str(_ckpt(run, 2)), "--sim-reports",
                 *map(str, reports), "--episodes", *map(str, EPISODES), "--num-steps", "2", "--max-steps", "16",
                 "--state", "recorded", "--no-videos", "--out", str(tmp_path / "cli")]) == 0
    merged = PE.merge_reports([tmp_path / "cli", out / "judge" / "act"], tmp_path / "merged")
    assert [r["label"] for r in merged["policies"]] == ["mixed@1", "mixed@2", "act@5"]

    broken = pq.Row("diffusion")
    assert not pq.judge_row(SimpleNamespace(**{**vars(args), "judge_world_model": str(tmp_path / "no_model")}), policy, broken, out, 8)
    assert "error" in broken.extra["judge"] and broken.status == "pending"  # judge_row leaves the status (the sim result) alone


def test_p_value_beyond_enumeration_is_drawn_and_agrees_with_the_exact_one():
    """Nine or more policies: a seeded permutation p-value, close to the exact one where both exist."""
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=8), rng.normal(size=8)
    assert PE.spearman_p_permutation(x, y) == pytest.approx(PE.spearman_p_exact(x, y), abs=0.01)
    p, method = PE.spearman_p(list(range(9)), list(range(9)))
    assert method.startswith("permutation") and 0 < p < 1e-4  # 2 of 9! orderings reach |rho| = 1
    assert PE.rank_correlation(list(range(9)), [0, 1, 2, 3, 4, 5, 6, 8, 7])["spearman_p"] < 0.001
    assert PE.spearman_p_permutation([1, 2, 3], [5, 5, 5]) is None


def test_a_two_camera_world_model_judges_two_camera_policies_on_their_views(tmp_path):
    """A recording of `--camera corner,topview` tiles both views side by side; the judge splits each imagined
    canvas back into the two views the policy takes (the recorded ones at frame 0), and ranks as for one camera."""
    from wamkit.sim import record

    data = tmp_path / "rec"
    record("metaworld/reach-v3", 2, data, resolution=64, camera="corner,topview")
    Trainer(load_experiment(DEMO_RECIPE, [
        'model.mode="mixed"', 'job.name="two"', f'job.output_root="{tmp_path}"', f'data.path="{data}"',
        "data.generate_demo=false", "data.use_state=false", "data.val_fraction=0.5", "trainer.max_iter=2",
        "checkpoint.save_iter=1", "trainer.samples_per_step=2", "trainer.progress_bar=false", "trainer.val_every=0",
        "scheduler.warm_up_steps=[1]"])).train()
    run, ds = tmp_path / "two", LeRobotV3Dataset(data)
    wm = _wm(run)
    assert wm.camera_keys == ["observation.images.corner", "observation.images.topview"]
    policies = [load_policy(_ckpt(run, s), num_steps=2) for s in (1, 2)]
    seen = []
    original = policies[0].predict

    def spy(observations, **kw):
        seen.extend(o["image"] for o in observations)
        return original(observations, **kw)

    policies[0].predict = spy
    task = ds.episode_task(0)
    reports = [PE.load_sim_report(_sim_report(tmp_path / f"sim/step_{s:09d}", s, k, task=task, env="metaworld/reach-v3"))
               for s, k in ((1, 2), (2, 7))]
    report = PE.evaluate_policies(wm, policies, reports, ds, tmp_path / "judge", episodes=[0], max_steps=16, videos=False)
    assert [r["label"] for r in report["policies"]] == ["two@1", "two@2"] and report["correlation"]["n"] == 2
    assert all(isinstance(image, list) and [v.shape for v in image] == [(64, 64, 3)] * 2 for image in seen)
    first = [ds.decode_frames(0, key, [0])[0] for key in wm.camera_keys]
    assert all(np.array_equal(a, b) for a, b in zip(seen[0], first))  # frame 0: the recorded views themselves
    assert len(seen) == 2  # one plan per 8 actions over 16 imagined steps
