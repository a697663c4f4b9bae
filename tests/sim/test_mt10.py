"""Meta-World MT10: one recording command for the ten tasks, and `wamkit eval sim` over a suite of tasks
(per-task success with intervals, the average, a success and a failure video per task, success vs step)."""

import json
from pathlib import Path

import numpy as np
import pytest

import wamkit.sim  # noqa: F401 - picks the headless GL backend before metaworld imports mujoco
from tests.helpers import REPO, run_cli
from wamkit.config import load_experiment
from wamkit.data import LeRobotV3Dataset
from wamkit.data.doctor import DatasetExpectation, diagnose
from wamkit.eval import (EvalResult, evaluate_checkpoints, evaluate_suite, load_policy, wilson_interval,
                         write_suite_report)
from wamkit.eval.sim_eval import EpisodeResult
from wamkit.eval.suite import SuiteResult
from wamkit.sim import SUITES, SimError, expand_env_names, get_spec, record
from wamkit.train.trainer import Trainer

MT10 = ["reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
        "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3"]
TWO = "metaworld/reach-v3,metaworld/window-close-v3"


@pytest.fixture(scope="module")
def mt10(tmp_path_factory):
    out = tmp_path_factory.mktemp("mt10") / "data"
    return out, record("metaworld/mt10", 1, out, seed=0, resolution=64)


@pytest.fixture(scope="module")
def run_dir(mt10, tmp_path_factory):
    root, _ = mt10
    tmp = tmp_path_factory.mktemp("run")
    overrides = {
        "job.name": '"mt10_tiny"', "job.output_root": f'"{tmp}"', "data.path": f'"{root}"', "data.val_fraction": "0.0",
        "trainer.max_iter": "4", "checkpoint.save_iter": "2", "trainer.samples_per_step": "2",
        "trainer.progress_bar": "false", "trainer.val_every": "0", "scheduler.warm_up_steps": "[1]",
    }
    Trainer(load_experiment(REPO / "recipes" / "demo_tiny.toml", [f"{k}={v}" for k, v in overrides.items()])).train()
    return tmp / "mt10_tiny"


def test_suite_names_expand_in_order_once_and_unknown_names_say_the_nearest():
    assert expand_env_names("metaworld/mt10") == [f"metaworld/{t}" for t in MT10]
    assert expand_env_names("metaworld/push-v3, metaworld/mt3") == [
        "metaworld/push-v3", "metaworld/reach-v3", "metaworld/drawer-open-v3"]
    with pytest.raises(SimError, match="did you mean 'metaworld/mt10'"):
        expand_env_names("metaworld/mt11")
    with pytest.raises(SimError, match="names no env"):
        expand_env_names(" , ")
    assert len({get_spec(n).task for n in SUITES["metaworld/mt10"]}) == 10  # one distinct task text per task


def test_one_command_records_a_successful_expert_episode_of_every_mt10_task(mt10):
    root, summary = mt10
    assert summary.attempted == 10 and summary.kept == 10 and summary.dropped == 0
    ds = LeRobotV3Dataset(root)
    texts = [get_spec(f"metaworld/{t}").task for t in MT10]
    assert [ds.episode_task(e) for e in ds.episode_indices] == texts  # task text per episode, in suite order
    assert sorted(ds.tasks.values()) == sorted(texts)
    assert diagnose(root, DatasetExpectation(chunk_length=8, max_action_dim=8, fps=80.0)).ok
    provenance = json.loads((root / "meta" / "wamkit_recording.json").read_text())
    assert provenance["env_name"].split(",") == [f"metaworld/{t}" for t in MT10]


def _videos_follow_the_rule(result):
    """Exactly the first success and the first failure of the task carry a video (when that outcome occurred)."""
    firsts = {next((e.index for e in result.per_episode if e.success == ok), None) for ok in (True, False)} - {None}
    assert {e.index for e in result.per_episode if e.video} == firsts
    for e in result.per_episode:
        if e.video:
            assert (Path(result.out_dir) / e.video).stat().st_size > 0
            assert e.video.endswith("success.mp4" if e.success else "failure.mp4")


def test_suite_evaluation_reports_each_task_and_the_average(run_dir, tmp_path):
    policy = load_policy(run_dir, num_steps=1)
    suite = evaluate_suite(policy, expand_env_names(TWO), 3, seed=1, out_dir=tmp_path, max_episode_steps=8,
                           execute_horizon=4, num_steps=1)
    assert [t.env_name for t in suite.tasks] == TWO.split(",")
    assert suite.episodes == 6 and suite.successes == sum(t.successes for t in suite.tasks)
    assert suite.success_rate == pytest.approx(np.mean([t.success_rate for t in suite.tasks]))
    assert suite.ci95 == wilson_interval(suite.successes, 6) and suite.training_step == 4
    for task in suite.tasks:
        assert task.episodes == 3 and Path(task.out_dir).parent == tmp_path
        assert (Path(task.out_dir) / "report.md").is_file()
        assert [e.seed for e in task.per_episode] == [e.seed for e in suite.tasks[0].per_episode]  # same seeds
        _videos_follow_the_rule(task)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["per_task_success"] == {t.env_name: t.success_rate for t in suite.tasks}
    report = (tmp_path / "report.md").read_text()
    assert all(f"| {name} |" in report for name in TWO.split(",")) and "| **average** |" in report


def test_suite_report_links_a_success_and_a_failure_video_per_task(tmp_path):
    def task(env, outcomes):
        episodes = [EpisodeResult(i, i, ok, 10, 2, f"rollout_{i:03d}_{'success' if ok else 'failure'}.mp4")
                    for i, ok in enumerate(outcomes)]
        k = sum(outcomes)
        return EvalResult(env_name=env, task=env, episodes=len(outcomes), successes=k, success_rate=k / len(outcomes),
                          ci95=wilson_interval(k, len(outcomes)), mean_episode_length=10.0, mean_success_length=10.0,
                          execute_horizon=8, chunk_length=8, max_episode_steps=200, resolution=64, seed=1, num_steps=2,
                          policy_source={}, training_step=7, seconds=1.0, per_episode=episodes,
                          out_dir=str(tmp_path / env.replace("/", "_")))

    tasks = [task("metaworld/reach-v3", [False, True]), task("metaworld/push-v3", [False, False])]
    suite = SuiteResult(tasks, 4, 1, 0.25, wilson_interval(1, 4), 10.0, 7, 1.0, str(tmp_path))
    rows = {line.split("|")[1].strip(): line for line in write_suite_report(suite, tmp_path).read_text().splitlines()
            if line.startswith("| metaworld/")}
    assert "[rollout_001_success.mp4](metaworld_reach-v3/rollout_001_success.mp4)" in rows["metaworld/reach-v3"]
    assert "[rollout_000_failure.mp4](metaworld_reach-v3/rollout_000_failure.mp4)" in rows["metaworld/reach-v3"]
    assert "| 0/2 = 0.000 |" in rows["metaworld/push-v3"] and "| - |" in rows["metaworld/push-v3"]  # no success video


def test_success_vs_step_over_a_suite_plots_the_average_and_each_task(run_dir, tmp_path):
    results = evaluate_checkpoints(run_dir, TWO, 1, seed=2, out_dir=tmp_path, num_steps=1, max_episode_steps=4)
    assert [r.training_step for r in results] == [2, 4] and all(len(r.tasks) == 2 for r in results)
    assert (tmp_path / "success_vs_step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (tmp_path / "report.md").read_text()
    assert "| step | average success | 95% CI | metaworld/reach-v3 | metaworld/window-close-v3 |" in report
    assert all((tmp_path / f"step_{s:09d}" / "report.md").is_file() for s in (2, 4))
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [sorted(r["per_task_success"]) for r in saved] == [sorted(TWO.split(","))] * 2


def test_cli_eval_sim_on_a_suite_prints_each_task_the_average_and_a_video(run_dir, tmp_path):
    proc = run_cli(["eval", "sim", str(run_dir), TWO, "--episodes", "1", "--seed", "3", "--max-steps", "4",
                    "--num-steps", "1", "--noise-scale", "0.5", "--raw", "--out", str(tmp_path / "ev"), "--device", "cpu"])
    lines = proc.stdout.splitlines()
    assert any(line.startswith("metaworld/reach-v3: success ") for line in lines)
    assert any(line.startswith("average of 2 tasks: success ") for line in lines)
    video = Path(next(line for line in lines if line.startswith("rollout video: ")).split(": ", 1)[1])
    assert video.is_file() and video.parent.parent == tmp_path / "ev"
    # the sampler's noise scale is what was measured: in every task's results and in the suite's report
    saved = json.loads((video.parent / "results.json").read_text())
    assert saved["noise_scale"] == 0.5 and saved["policy_source"]["weights"] == "raw"  # --raw: not the EMA
    assert "1 denoising steps from noise x 0.5" in (tmp_path / "ev" / "report.md").read_text()


def test_batched_closed_loop_evaluates_every_task_on_the_serial_seeds(run_dir, tmp_path):
    from wamkit.eval.suite import evaluate_envs

    policy = load_policy(run_dir, num_steps=1)
    kw = dict(max_episode_steps=8, execute_horizon=4, num_steps=1)
    batched = evaluate_envs(policy, expand_env_names(TWO), 2, seed=1, workers=2, out_dir=tmp_path / "b", **kw)
    serial = evaluate_envs(policy, expand_env_names(TWO), 2, seed=1, out_dir=tmp_path / "s", **kw)
    assert [t.env_name for t in batched.tasks] == [t.env_name for t in serial.tasks] == TWO.split(",")
    for b, s in zip(batched.tasks, serial.tasks):
        assert b.episodes == 2 and [e.seed for e in b.per_episode] == [e.seed for e in s.per_episode]
        assert all(e.length <= 8 for e in b.per_episode)
        for task in (b, s):  # both paths keep each episode's best shaped reward (Meta-World's: 0-10)
            assert all(0.0 <= e.best_reward <= 10.0 for e in task.per_episode)
            assert task.mean_best_reward == pytest.approx(np.mean([e.best_reward for e in task.per_episode]))
    assert batched.mean_best_reward == pytest.approx(np.mean([t.mean_best_reward for t in batched.tasks]))
    assert (tmp_path / "b" / "results.json").is_file() and batched.ci95 == wilson_interval(batched.successes, 4)
    timing = batched.tasks[0].timing  # where the wall time went: the policy's batched predicts vs the simulators
    assert timing["rounds"] >= 2 and 1 <= timing["mean_batch"] <= 2 and timing["policy_s"] > 0 and timing["env_s"] > 0
    assert timing["policy_s"] + timing["env_s"] <= batched.tasks[0].seconds and serial.tasks[0].timing is None
    assert set(timing["ms_per_predict_by_batch"]) <= {"1", "2"} and all(v > 0 for v in timing["ms_per_predict_by_batch"].values())


def test_expert_trace_serial_and_batched_counts_every_executed_step_and_reports_it(run_dir, tmp_path):
    from wamkit.eval.suite import evaluate_envs

    policy = load_policy(run_dir, num_steps=1)
    kw = dict(max_episode_steps=8, execute_horizon=4, num_steps=1, expert_trace=True)
    for workers in (0, 2):
        result = evaluate_envs(policy, expand_env_names(TWO), 2, seed=1, workers=workers, out_dir=tmp_path / str(workers), **kw)
        for task in result.tasks:
            trace = task.expert_agreement
            assert trace["names"] == list(get_spec(task.env_name).action_names)
            assert trace["all"]["steps"] == sum(e.length for e in task.per_episode)
            assert (trace["failed"] is None) == all(e.success for e in task.per_episode)
            assert all(s is None or 0 <= s <= 1 for s in trace["all"]["same_direction"])
            report = (Path(task.out_dir) / "report.md").read_text()
            assert "against the scripted expert" in report
    plain = evaluate_envs(policy, expand_env_names(TWO), 1, seed=1, workers=2, max_episode_steps=4, num_steps=1)
    assert plain.tasks[0].expert_agreement is None


def test_batched_closed_loop_with_more_workers_than_episodes(run_dir, tmp_path):
    """Every episode ends in the first round (4 steps, 4 executed), so three workers come free while only
    one episode is left: the H200 curve (2 episodes a task, 15 workers) once died popping an empty queue there."""
    from wamkit.eval.suite import evaluate_envs

    policy = load_policy(run_dir, num_steps=1)
    result = evaluate_envs(policy, expand_env_names(TWO), 2, seed=1, workers=3, out_dir=tmp_path / "b",
                           max_episode_steps=4, execute_horizon=4, num_steps=1)
    assert [t.episodes for t in result.tasks] == [2, 2]


def test_padded_batches_give_every_predict_the_pools_size_and_the_same_episodes(run_dir, tmp_path):
    """pad_batches (the default for a policy that replays CUDA graphs: one capture per batch shape) hands every
    predict a batch of the pool's size, the live observations first, and keeps only their chunks: the episodes
    end as without padding, while the report still counts the live batch sizes."""
    from wamkit.eval.batched import evaluate_batched, padded_batch

    assert padded_batch([1, 2], 4) == [1, 2, 1, 1] and padded_batch([1, 2], 0) == [1, 2] == padded_batch([1, 2], 2)
    policy = load_policy(run_dir, num_steps=1)
    assert policy.replays_cuda_graphs is False  # on the CPU: no graphs, so no padding unless asked
    sizes, predict = [], policy.predict
    policy.predict = lambda observations, **kw: sizes.append(len(observations)) or predict(observations, **kw)
    kw = dict(max_episode_steps=8, execute_horizon=4, num_steps=1, workers=3)
    padded = evaluate_batched(policy, expand_env_names(TWO), 2, seed=1, pad_batches=True, **kw)
    padded_sizes, sizes[:] = list(sizes), []
    plain = evaluate_batched(policy, expand_env_names(TWO), 2, seed=1, **kw)
    assert set(padded_sizes) == {3} and min(sizes) < 3  # 4 episodes on 3 workers: the last rounds run fewer
    for a, b in zip(padded, plain):
        assert [(e.seed, e.success, e.length) for e in a.per_episode] == [(e.seed, e.success, e.length) for e in b.per_episode]
        assert [e.best_reward for e in a.per_episode] == pytest.approx([e.best_reward for e in b.per_episode], abs=1e-3)
    assert padded[0].timing["padded_to"] == 3 and plain[0].timing["padded_to"] == 0
    assert padded[0].timing["ms_per_predict_by_batch"].keys() == plain[0].timing["ms_per_predict_by_batch"].keys()


def _frame_count(video: Path) -> int:
    import av

    with av.open(str(video)) as container:
        return sum(1 for _ in container.decode(video=0))


def test_batched_videos_are_replays_of_the_first_success_and_failure_of_each_task(run_dir, tmp_path):
    """The batched loop renders only the states the policy plans from; its videos replay the counted episodes'
    executed actions in a worker: one frame per executed action after the first, under the serial names."""
    from wamkit.eval.suite import evaluate_envs

    policy = load_policy(run_dir, num_steps=1)
    kw = dict(max_episode_steps=8, execute_horizon=4, num_steps=1)
    result = evaluate_envs(policy, expand_env_names(TWO), 3, seed=1, workers=2, out_dir=tmp_path / "b", **kw)
    for task in result.tasks:
        for outcome in (True, False):
            episodes = [e for e in task.per_episode if e.success == outcome]
            if not episodes:
                continue
            first, rest = episodes[0], episodes[1:]
            assert first.video == f"rollout_{first.index:03d}_{'success' if outcome else 'failure'}.mp4"
            assert _frame_count(Path(task.out_dir) / first.video) == first.length + 1
            assert all(e.video is None for e in rest)
        assert "rollout_" in (Path(task.out_dir) / "report.md").read_text()
    assert "rollout_" in (tmp_path / "b" / "report.md").read_text()  # the suite's success / failure video columns
    none = evaluate_envs(policy, expand_env_names(TWO), 1, seed=1, workers=2, out_dir=tmp_path / "n", num_videos=0, **kw)
    assert not list((tmp_path / "n").rglob("*.mp4")) and all(e.video is None for t in none.tasks for e in t.per_episode)


def test_a_worker_replay_renders_the_states_the_closed_loop_reached():
    """The replay behind the batched videos: the same seed and actions give the same first and last frames
    as the evaluation's own reset and chunk (the simulation is deterministic)."""
    from wamkit.sim.workers import EnvSettings, _act, _replay, _reset

    envs, settings, name = {}, EnvSettings(resolution=64), "metaworld/reach-v3"
    actions = np.random.default_rng(0).uniform(-1, 1, size=(6, 4))
    try:
        first, _ = _reset(envs, settings, name, 7)
        last, taken, *_ = _act(envs, settings, name, actions, 100)
        _reset(envs, settings, name, 8)  # another episode in between, as in a worker's life
        frames, success, fps = _replay(envs, settings, name, 7, actions)
    finally:
        for env in envs.values():
            env.close()
    assert taken == 6 and frames.shape == (7, 64, 64, 3) and fps == get_spec(name).fps and success is False
    assert np.array_equal(frames[0], first["image"]) and np.array_equal(frames[-1], last["image"])
    assert not np.array_equal(frames[0], frames[-1])
