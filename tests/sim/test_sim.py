"""Meta-World recording -> LeRobot v3.0 -> tiny training run -> closed-loop evaluation, end to end."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import wamkit.sim  # noqa: E402,F401 - picks the headless GL backend before metaworld imports mujoco


from wamkit.config import load_experiment  # noqa: E402
from wamkit.data import LeRobotV3Dataset  # noqa: E402
from wamkit.data.doctor import DatasetExpectation, diagnose  # noqa: E402
from wamkit.eval import EvalError, evaluate, evaluate_checkpoints, wilson_interval  # noqa: E402
from wamkit.sim import SimError, get_spec, make_env, record  # noqa: E402
from wamkit.train.trainer import Trainer  # noqa: E402

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "demo_tiny.toml"
ENV = "metaworld/reach-v3"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim") / "reach"
    # attempt 1 gets a 5-step budget: the expert cannot succeed, so it must be dropped and counted
    summary = record(ENV, 3, out, seed=0, resolution=64, step_budgets=[None, 5, None])
    return out, summary


@pytest.fixture(scope="module")
def run_dir(recorded, tmp_path_factory):
    root, _ = recorded
    tmp = tmp_path_factory.mktemp("run")
    overrides = {
        "job.name": '"sim_tiny"', "job.output_root": f'"{tmp}"', "data.path": f'"{root}"',
        "data.generate_demo": "false", "data.val_fraction": "0.0", "data.chunk_length": "8",
        "model.max_action_dim": "8", "model.pixel_spatial_factor": "8",
        "trainer.max_iter": "4", "checkpoint.save_iter": "2", "trainer.samples_per_step": "2",
        "trainer.progress_bar": "false", "trainer.val_every": "0", "scheduler.warm_up_steps": "[1]",
    }
    Trainer(load_experiment(RECIPE, [f"{k}={v}" for k, v in overrides.items()])).train()
    return tmp / "sim_tiny"


def test_registry_names_and_errors():
    spec = get_spec("metaworld/push-v3")
    assert spec.fps == 80.0 and spec.state_dim == 4 and spec.action_dim == 4
    with pytest.raises(SimError, match="did you mean 'metaworld/reach-v3'"):
        get_spec("metaworld/reach-v2")
    with pytest.raises(SimError, match="multiple of 16"):
        record(ENV, 1, "/nonexistent/never", resolution=60)


def test_env_observation_and_determinism():
    with make_env(ENV, resolution=64) as env:
        a = env.reset(123)
        assert a["image"].shape == (64, 64, 3) and a["image"].dtype == np.uint8
        assert a["state"].shape == (4,) and a["prompt"] == get_spec(ENV).task
        r = env.step(env.expert_action())
        assert r.obs["state"].shape == (4,) and not r.done
        b = env.reset(123)
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_allclose(a["state"], b["state"])


def test_the_first_frame_shows_the_placement_the_episode_is_played_in():
    """Meta-World moves the drawer after its reset's last physics step; without a forward pass frame 0 and the
    observation showed the previous placement, and the first step jumped (a policy planned its first chunk, and
    the expert its first action, for a drawer that was not there)."""
    with make_env("metaworld/drawer-open-v3", resolution=64) as env:
        for seed in (2000006000, 2000006001):  # placements 9 cm apart from the stale ones before the fix
            first = env.reset(seed)
            handle = env._raw_obs[4:7].copy()
            after = env.step(np.zeros(4, np.float32))
            np.testing.assert_allclose(env._raw_obs[4:7], handle, atol=1e-4)
            # the closed drawer does not move under a no-op: only the arm settles a little
            assert np.abs(first["image"].astype(int) - after.obs["image"]).mean() < 1.0


def test_two_cameras_render_both_views_and_record_one_video_each(tmp_path):
    """`camera="corner,topview"`: the first view is the single-camera image (corner flipped upright), the second
    another picture; recording writes one video feature per camera."""
    with make_env(ENV, resolution=32) as one, make_env(ENV, resolution=32, camera="corner,topview") as two:
        a, b = one.reset(7), two.reset(7)
        assert list(b["views"]) == ["corner", "topview"] and "views" not in a
        np.testing.assert_array_equal(b["image"], a["image"])
        np.testing.assert_array_equal(b["views"]["corner"], a["image"])
        assert b["views"]["topview"].shape == (32, 32, 3) and not np.array_equal(b["views"]["topview"], a["image"])
    with pytest.raises(SimError, match="'top' does not exist"):
        make_env(ENV, resolution=32, camera="corner,top")
    record(ENV, 1, tmp_path / "two", resolution=32, camera="corner,topview")
    features = LeRobotV3Dataset(tmp_path / "two").features
    assert {k for k in features if k.startswith("observation.images.")} == {"observation.images.corner",
                                                                          "observation.images.topview"}


def test_a_zoomed_camera_shows_the_centre_of_the_view_at_twice_the_pixels():
    """`corner@2x` narrows the corner camera's field of view about its centre: its 32 px frame is the middle
    of the 64 px one (the same rays, pixel for pixel, up to rasterization at edges); another spec of the same
    camera in the same env keeps its own zoom, and bad specs name the form."""
    from wamkit.sim.base import parse_camera, zoomed_fovy

    assert parse_camera("corner") == ("corner", 1.0, False) and parse_camera("corner@2.5x") == ("corner", 2.5, False)
    assert zoomed_fovy(90.0, 1.0) == pytest.approx(90.0) and zoomed_fovy(90.0, 2.0) == pytest.approx(53.13, abs=0.01)
    with make_env(ENV, resolution=64) as wide, make_env(ENV, resolution=32, camera="corner@2x,corner") as env:
        full, obs = wide.reset(7)["image"], env.reset(7)
        zoomed, unzoomed = obs["views"]["corner@2x"], obs["views"]["corner"]
        centre = full[16:48, 16:48].astype(int)
        assert np.mean(np.abs(zoomed.astype(int) - centre).max(-1) <= 8) > 0.95
        assert np.mean(np.abs(unzoomed.astype(int) - centre).max(-1) <= 8) < 0.6  # the unzoomed view is another picture
        np.testing.assert_array_equal(env.render("corner"), unzoomed)  # rendering one spec leaves the other's zoom
    for bad in ("corner@2", "corner@x", "corner@20x", "@2x"):
        with pytest.raises(SimError, match="NAME@<zoom>x"):
            make_env(ENV, resolution=32, camera=bad)


def test_a_shadow_camera_lights_from_above_and_leaves_the_other_views_as_they_were():
    """`+shadow` renders a camera with one shadow-casting sun straight above the scene: the gripper and the
    floating goal marker cast their shadows onto the table below them (the depth cue one view lacks). It acts
    on that render's scene only: the model's lights stay as they were and a plain view of the same env renders
    exactly as in an env without any shadow camera."""
    import mujoco

    from wamkit.sim.base import parse_camera

    assert parse_camera("corner@2x+shadow") == ("corner", 2.0, True) and parse_camera("corner+shadow") == ("corner", 1.0, True)
    assert parse_camera("corner@2x").shadow is False
    for bad in ("corner+shadow@2x", "+shadow", "corner+shade"):
        with pytest.raises(SimError, match=r"\+shadow"):
            make_env(ENV, resolution=32, camera=bad)
    with make_env(ENV, resolution=48) as plain_env, make_env(ENV, resolution=48, camera="corner,corner+shadow") as env:
        model = env._env.model
        lights_before = model.light_dir.copy(), model.light_castshadow.copy()
        plain, obs = plain_env.reset(3)["image"], env.reset(3)
        np.testing.assert_array_equal(obs["views"]["corner"], plain)
        shadowed = obs["views"]["corner+shadow"]
        assert np.mean(np.abs(shadowed.astype(int) - plain).max(-1) > 24) > 0.02  # another lighting, shadows on the table
        scene = env._update_scene(env._env.data, "corner+shadow")
        sun = [scene.lights[i] for i in range(scene.nlight) if scene.lights[i].castshadow]
        assert len(sun) == 1 and sun[0].directional and np.allclose(sun[0].dir, (0, 0, -1))
        assert scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW]
        np.testing.assert_array_equal(env.render("corner"), plain)  # the plain view after a shadow render: unchanged
        np.testing.assert_array_equal(model.light_dir, lights_before[0])
        np.testing.assert_array_equal(model.light_castshadow, lights_before[1])


def test_a_policy_is_evaluated_with_the_camera_its_recording_used(tmp_path):
    """A one-camera recording keys its view `observation.images.front` whatever camera rendered it; the run's
    contract keeps the camera (`sim_camera`), so `eval sim` renders the zoomed view the policy trained on, and a
    policy of one camera out of a two-camera recording sees that camera, not the env's default."""
    from wamkit.eval import evaluate
    from wamkit.eval.cameras import policy_cameras
    from wamkit.eval.sim_eval import load_policy
    from wamkit.sim.expert import episode_seed

    seen = {}
    for name, camera, keys in (("zoomed", "corner@2x", None), ("picked", "corner,topview", '["observation.images.topview"]')):
        data = tmp_path / f"{name}_data"
        record(ENV, 2, data, seed=0, resolution=32, camera=camera)
        overrides = {"job.name": f'"{name}"', "job.output_root": f'"{tmp_path}"', "data.path": f'"{data}"',
                     "data.generate_demo": "false", "data.val_fraction": "0.0", "data.chunk_length": "8",
                     "model.max_action_dim": "8", "model.pixel_spatial_factor": "8", "trainer.max_iter": "1",
                     "checkpoint.save_iter": "1", "trainer.samples_per_step": "2", "trainer.progress_bar": "false",
                     "trainer.val_every": "0", "scheduler.warm_up_steps": "[1]", **({"data.camera_keys": keys} if keys else {})}
        Trainer(load_experiment(RECIPE, [f"{k}={v}" for k, v in overrides.items()])).train()
        policy = load_policy(str(tmp_path / name), num_steps=1)
        original = policy.predict

        def spy(observations, _original=original, _name=name, **kw):
            seen.setdefault(_name, observations[0]["image"])
            return _original(observations, **kw)

        policy.predict = spy
        evaluate(policy, ENV, episodes=1, seed=0, max_episode_steps=8)
        with make_env(ENV, resolution=32, camera=policy_cameras(policy)) as env:
            expected = env.reset(episode_seed(0, 0))["image"]
        seen[name] = (seen[name], expected, policy_cameras(policy))
    assert seen["zoomed"][2] == "corner@2x" and seen["picked"][2] == "topview"
    for image, expected, _ in seen.values():
        np.testing.assert_array_equal(image, expected)
    with make_env(ENV, resolution=32) as default:
        assert not np.array_equal(default.reset(episode_seed(0, 0))["image"], seen["picked"][0])


def test_a_recording_shows_the_frames_the_policy_will_be_evaluated_on(tmp_path):
    """`wamkit sim record` (yuv444p by default): the decoded first frame is the simulator's render of that placement
    up to the codec's rounding; `--pix-fmt yuv420p` smears the small coloured cues (the 99th percentile of the
    per-pixel error: 46 of 255 at 32 px, 17 with 4:4:4)."""
    from wamkit.cli import main
    from wamkit.data.video import close_all
    from wamkit.data.writer import DEFAULT_CAMERA_KEY
    from wamkit.sim.expert import episode_seed

    with make_env(ENV, resolution=32) as env:
        render = env.reset(episode_seed(0, 0))["image"].astype(int)
    error = {}
    for name, options in (("default", []), ("yuv420p", ["--pix-fmt", "yuv420p"])):
        out = tmp_path / name
        assert main(["sim", "record", ENV, "--episodes", "1", "--out", str(out), "--resolution", "32", *options]) == 0
        close_all()
        ds = LeRobotV3Dataset(out)
        pix_fmt = ds.info["features"][DEFAULT_CAMERA_KEY]["info"]["video.pix_fmt"]
        assert json.loads((out / "meta" / "wamkit_recording.json").read_text())["pix_fmt"] == pix_fmt
        decoded = ds.decode_frames(0, DEFAULT_CAMERA_KEY, [0])[0].astype(int)
        error[pix_fmt] = np.percentile(np.abs(decoded - render).max(-1), 99)
    assert error["yuv444p"] < 25 < error["yuv420p"], error


def test_a_chunk_executed_blind_ends_in_the_observation_of_stepping_with_eyes_open():
    """The closed-loop workers step a chunk without rendering and render once after its last action:
    that observation is the one a per-step rendering loop ends with, pixel for pixel."""
    from wamkit.sim.workers import EnvSettings, _act, _env

    with make_env(ENV, resolution=64) as env:
        env.reset(7)
        chunk, rewards = [], []
        for _ in range(8):
            chunk.append(env.expert_action())
            result = env.step(chunk[-1])
            seen = result.obs
            rewards.append(result.reward)
    envs, settings = {}, EnvSettings(resolution=64)
    worker_env = _env(envs, ENV, settings)  # the env a worker process keeps for this task
    worker_env.reset(7)
    obs, taken, success, done, asked, best = _act(envs, settings, ENV, chunk, steps_left=100, expert=True)
    assert taken == 8 and not done and best == max(rewards)  # the chunk's best shaped reward, as stepped
    # the expert asked in each state the chunk acted in: the chunk itself, as the chunk is the expert's own
    np.testing.assert_allclose(np.stack(asked), np.stack(chunk), atol=1e-6)
    np.testing.assert_array_equal(obs["image"], seen["image"])
    np.testing.assert_array_equal(obs["state"], seen["state"])
    assert worker_env.step(chunk[0], observe=False).obs is None
    worker_env.close()


def test_recorded_dataset_loads_passes_doctor_and_drops_failures(recorded):
    root, summary = recorded
    assert summary.attempted == 3 and summary.kept == 2 and summary.dropped == 1
    assert summary.dropped_attempts == [1]
    assert summary.expert_success_rate == pytest.approx(2 / 3)
    ds = LeRobotV3Dataset(root)
    assert ds.fps == 80.0 and ds.episode_indices == [0, 1]
    assert ds.feature_dim("observation.state") == 4 and ds.feature_dim("action") == 4
    assert ds.episode_task(0) == get_spec(ENV).task
    lengths = [ds.episode_length(e) for e in ds.episode_indices]
    assert lengths == summary.kept_lengths and all(n > 5 for n in lengths)  # the 5-step failure is not in the data
    frames = ds.decode_frames(0, ds.camera_keys[0], [0, lengths[0] - 1])
    assert frames.shape == (2, 64, 64, 3)
    report = diagnose(root, DatasetExpectation(chunk_length=8, max_action_dim=8, fps=80.0))
    assert report.ok, report.format()
    provenance = json.loads((root / "meta" / "wamkit_recording.json").read_text())
    assert provenance["dropped_attempts"] == [1] and len(provenance["episode_seeds_kept"]) == 2


def test_wilson_interval():
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and 0.2 < hi < 0.35
    for n in (5, 10, 50, 500):  # exact ends: 0/50 once gave 6.9e-18, and a negative error bar in a plot
        assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0
    lo, hi = wilson_interval(5, 10)
    assert lo < 0.5 < hi and hi - 0.5 == pytest.approx(0.5 - lo)
    with pytest.raises(EvalError):
        wilson_interval(0, 0)


def test_closed_loop_evaluation_writes_report(run_dir, tmp_path):
    from wamkit.policy import Policy

    policy = Policy.from_checkpoint(run_dir, num_steps=2)
    with pytest.raises(EvalError, match="execute_horizon"):
        evaluate(policy, ENV, 1, seed=1, execute_horizon=99)
    result = evaluate(policy, ENV, 2, seed=1, execute_horizon=4, out_dir=tmp_path, max_episode_steps=12,
                      num_videos=2)
    assert 0.0 <= result.success_rate <= 1.0 and result.episodes == 2
    assert result.ci95[0] <= result.success_rate <= result.ci95[1]
    assert result.resolution == 64 and result.training_step == 4
    assert all(1 <= e.length <= 12 and e.replans == -(-e.length // 4) for e in result.per_episode)
    assert 1 <= result.mean_episode_length <= 12
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["success_rate"] == result.success_rate and saved["episodes"] == 2
    assert "success rate" in (tmp_path / "report.md").read_text()
    videos = sorted(tmp_path.glob("rollout_*.mp4"))
    assert len(videos) == 2
    import av

    with av.open(str(videos[0])) as c:
        n = sum(1 for _ in c.decode(video=0))
    assert n == result.per_episode[0].length + 1


def test_success_vs_step_over_checkpoints(run_dir, tmp_path):
    results = evaluate_checkpoints(run_dir, ENV, 1, seed=2, out_dir=tmp_path, num_steps=1, max_episode_steps=4,
                                   num_videos=0)
    assert [r.training_step for r in results] == [2, 4]
    plots = list(tmp_path.glob("success_vs_step.*"))
    assert len(plots) == 1 and plots[0].stat().st_size > 0
    assert "| 2 |" in (tmp_path / "report.md").read_text()
    assert len(json.loads((tmp_path / "results.json").read_text())) == 2


def test_evaluating_every_checkpoint_loads_the_policy_once_and_the_rest_in_place(run_dir, tmp_path, monkeypatch):
    import wamkit.eval.suite as suite

    built = []
    real = suite.load_policy
    monkeypatch.setattr(suite, "load_policy", lambda *a, **k: built.append(a[0]) or real(*a, **k))
    evaluated = []
    monkeypatch.setattr(suite, "evaluate_envs", lambda policy, *a, **k: evaluated.append(
        (policy, policy.loaded.source["step"], [p.data_ptr() for p in policy.model.parameters()])) or _FakeResult(len(evaluated)))
    monkeypatch.setattr(suite, "write_checkpoints_report", lambda *a, **k: None)
    evaluate_checkpoints(run_dir, ENV, 1, seed=2, out_dir=tmp_path, num_steps=1)
    assert [Path(p).name for p in built] == ["iter_000000002"]  # the first checkpoint only; the second in place
    (first, step_a, ptrs_a), (second, step_b, ptrs_b) = evaluated
    assert first is second and (step_a, step_b) == (2, 4) and ptrs_a == ptrs_b


class _FakeResult:
    def __init__(self, n: int):
        self.training_step = n


def test_a_checkpoint_loaded_in_place_equals_it_loaded_afresh(run_dir):
    from wamkit.policy import load_policy

    first, second = sorted((Path(run_dir) / "checkpoints").glob("iter_*"))
    policy, fresh = load_policy(first, num_steps=2), load_policy(second, num_steps=2)
    obs = {"image": np.full((64, 64, 3), 90, np.uint8), "state": np.array([0.0, 0.6, 0.2, 1.0], np.float32), "prompt": "reach"}
    before = policy.predict([obs], seed=3)
    ptrs = [p.data_ptr() for p in policy.model.parameters()]
    policy.reload(second)
    assert [p.data_ptr() for p in policy.model.parameters()] == ptrs
    assert policy.loaded.source["step"] == 4 and policy.loaded.source["checkpoint"] == str(second.resolve())
    pairs = list(zip(policy.model.state_dict().values(), fresh.model.state_dict().values(), strict=True))
    assert all(torch.equal(a, b) for a, b in pairs)
    after = policy.predict([obs], seed=3)
    assert np.array_equal(after, fresh.predict([obs], seed=3)) and not np.array_equal(after, before)
    raw = load_policy(second, num_steps=2, use_ema=False)  # the raw weights too (--raw)
    policy.reload(second, use_ema=False)
    assert all(torch.equal(a, b) for a, b in zip(policy.model.state_dict().values(), raw.model.state_dict().values(), strict=True))
    assert policy.loaded.source["weights"] == "raw"
    assert not all(torch.equal(a, b) for a, b in zip(policy.model.state_dict().values(), fresh.model.state_dict().values()))


def test_loading_in_place_is_refused_with_the_reason(run_dir, tmp_path):
    import dataclasses

    from wamkit.errors import CheckpointError
    from wamkit.policy import load_policy

    first, second = sorted((Path(run_dir) / "checkpoints").glob("iter_*"))
    policy = load_policy(first, num_steps=1)
    loaded = policy.loaded
    policy.loaded = dataclasses.replace(loaded, contract={**loaded.contract, "fps": 1})
    assert "another data contract" in policy.reload_refusal(second)
    with pytest.raises(CheckpointError, match="another data contract"):
        policy.reload(second)
    from wamkit.export import export_run

    exported = load_policy(export_run(run_dir, tmp_path / "export"), num_steps=1)
    assert "export" in exported.reload_refusal(second)
    policy.loaded = dataclasses.replace(loaded, experiment_config={**loaded.experiment_config, "lora": {"enabled": True}})
    assert "LoRA" in policy.reload_refusal(second)
    policy.loaded = dataclasses.replace(loaded, source={**loaded.source, "checkpoint": str(tmp_path / "other" / "checkpoints" / "iter_2")})
    assert "another run" in policy.reload_refusal(second)
    policy.loaded = loaded
    assert policy.reload_refusal(second) is None
    policy.model.register_buffer("running_mean", torch.zeros(3))  # a persistent buffer (BatchNorm's kind): only a fresh load reads it
    assert "persistent buffers (running_mean)" in policy.reload_refusal(second)
    policy.model.register_buffer("running_mean", torch.zeros(3), persistent=False)
    assert policy.reload_refusal(second) is None


def test_plot_falls_back_to_svg_without_matplotlib(tmp_path, monkeypatch):
    import sys

    from wamkit.eval import plot_success_vs_step

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    path = plot_success_vs_step([(0, 0.0, 0.0, 0.5), (10, 0.5, 0.2, 0.8)], tmp_path / "p.png")
    assert path.suffix == ".svg" and path.read_text().startswith("<svg")


def test_multi_task_recording_writes_one_dataset_with_every_task(tmp_path):
    summary = record("metaworld/reach-v3,metaworld/drawer-open-v3", 1, tmp_path / "mt", seed=0, resolution=64)
    ds = LeRobotV3Dataset(tmp_path / "mt")
    assert summary.attempted == 2 and summary.kept == 2
    assert sorted(ds.episode_task(e) for e in ds.episode_indices) == sorted(ds.tasks.values())
    assert len(set(ds.tasks.values())) == 2 and ds.fps == 80


class _Recording:
    """The real policy, with each predict request kept (what the executor asked for, and when)."""

    def __init__(self, policy):
        self.policy, self.requests = policy, []

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def predict(self, observations, **kwargs):
        self.requests.append(dict(observations[0]))
        return self.policy.predict(observations, **kwargs)


def test_inference_delay_modes_keep_time_and_send_the_committed_actions(run_dir):
    from wamkit.policy import Policy

    policy = Policy.from_checkpoint(run_dir, num_steps=2)
    runs, requests = {}, {}
    for mode in ("sync", "naive", "rtc"):
        recording = _Recording(policy)
        runs[mode] = evaluate(recording, ENV, 2, seed=1, execute_horizon=4, max_episode_steps=32, inference_delay=3,
                              mode=mode, num_videos=0)
        requests[mode] = recording.requests
    for e in runs["sync"].per_episode:  # every chunk is waited for: 3 idle ticks each
        assert e.ticks == e.length + 3 * e.replans
    for mode in ("naive", "rtc"):  # only the first chunk is waited for; then a chunk every 4 ticks
        for e in runs[mode].per_episode:
            assert e.ticks == e.length + 3 and e.replans == 1 + -(-(e.length - 4) // 4)
        # one seam per chunk taken over; a chunk requested in the last 3 ticks never arrives
        assert sum(e.replans - 2 for e in runs[mode].per_episode) <= runs[mode].seams <= sum(e.replans - 1 for e in runs[mode].per_episode)
    assert not any("committed_actions" in r for r in requests["sync"] + requests["naive"])
    steered = [r for r in requests["rtc"] if "committed_actions" in r]
    assert len(steered) == len(requests["rtc"]) - 2  # all but each episode's first request
    assert all(r["committed_actions"].shape == (4, 4) and r["inference_delay"] == 3 for r in steered)
    with pytest.raises(EvalError, match="inference-delay"):
        evaluate(policy, ENV, 1, seed=1, execute_horizon=6, inference_delay=3, mode="naive")
    with pytest.raises(EvalError, match="mode 'fast'"):
        evaluate(policy, ENV, 1, seed=1, execute_horizon=4, inference_delay=1, mode="fast")


def test_eval_sim_cli_writes_the_delay_table(run_dir, tmp_path):
    from tests.helpers import run_cli

    out = tmp_path / "rt"
    run_cli(["eval", "sim", str(run_dir), ENV, "--episodes", "1", "--seed", "1", "--inference-delay", "0", "2",
             "--max-steps", "12", "--num-steps", "1", "--out", str(out), "--device", "cpu"])
    rows = json.loads((out / "realtime.json").read_text())
    assert [(r["inference_delay"], r["mode"]) for r in rows] == [(d, m) for d in (0, 2) for m in ("sync", "naive", "rtc")]
    table = (out / "realtime.md").read_text()
    assert "| 2 | rtc |" in table and "seam jerk" in table
    assert (out / "delay_2_rtc" / "report.md").read_text().count("inference delay 2 control steps, mode rtc") == 1


def test_recording_with_workers_writes_the_same_dataset(tmp_path):
    """Attempts are seeded by their index and written in attempt order, whatever the process count."""
    budgets = [None, 5, None]  # attempt 1 fails in both
    one = record(ENV, 3, tmp_path / "one", seed=0, resolution=64, step_budgets=budgets)
    two = record(ENV, 3, tmp_path / "two", seed=0, resolution=64, step_budgets=budgets, workers=2)
    assert (one.kept_lengths, one.dropped_attempts) == (two.kept_lengths, two.dropped_attempts) == (one.kept_lengths, [1])
    a, b = LeRobotV3Dataset(tmp_path / "one"), LeRobotV3Dataset(tmp_path / "two")
    for ep in a.episode_indices:
        np.testing.assert_array_equal(a.episode_columns(ep, ["action"])["action"], b.episode_columns(ep, ["action"])["action"])
        frames = [0, a.episode_length(ep) - 1]
        np.testing.assert_array_equal(a.decode_frames(ep, a.camera_keys[0], frames), b.decode_frames(ep, b.camera_keys[0], frames))


class _LoggedEnv:
    """An env whose expert actions and executed actions are logged: what DART recording asks and does."""

    def __init__(self, env):
        self.env, self.asked, self.executed = env, [], []
        self.spec = env.spec

    def reset(self, seed):
        return self.env.reset(seed)

    def expert_action(self):
        self.asked.append(self.env.expert_action())
        return self.asked[-1]

    def step(self, action):
        self.executed.append(np.array(action))
        return self.env.step(action)


def test_expert_noise_executes_perturbed_actions_and_records_the_experts(tmp_path):
    """DART: the env is stepped with the noisy action, the dataset keeps the expert's own; the noise is drawn from
    the episode seed (reproducible, the same in simulator workers) and the trajectory leaves the clean one."""
    from wamkit.sim.expert import rollout_expert

    with make_env(ENV, resolution=32) as env:
        noisy = _LoggedEnv(env)
        episode, _ = rollout_expert(noisy, 7, 40, post_success_steps=0, action_noise=0.3)
        np.testing.assert_array_equal(episode.actions, np.stack(noisy.asked))
        executed, (low, high) = np.stack(noisy.executed), env.spec.action_bounds
        assert np.all(executed >= np.asarray(low)) and np.all(executed <= np.asarray(high))
        offset = executed - episode.actions
        assert 0.1 < np.abs(offset).mean() < 0.5, "noise of 0.3 of the half range [-1, 1]: mean |offset| ~0.24 before clipping"
        again, _ = rollout_expert(env, 7, 40, post_success_steps=0, action_noise=0.3)
        clean, _ = rollout_expert(env, 7, 40, post_success_steps=0)
        np.testing.assert_array_equal(again.states, episode.states)
        assert np.abs(clean.states[-1, :3] - episode.states[-1, :3]).max() > 1e-3
        with pytest.raises(SimError, match="expert action noise"):
            rollout_expert(env, 7, 5, action_noise=-0.1)
    with pytest.raises(SimError, match="expert action noise"):
        record(ENV, 1, tmp_path / "bad", expert_noise=float("nan"), workers=2)
    assert not (tmp_path / "bad").exists()
    one = record(ENV, 2, tmp_path / "one", seed=0, resolution=32, expert_noise=0.2)
    two = record(ENV, 2, tmp_path / "two", seed=0, resolution=32, expert_noise=0.2, workers=2)
    assert json.loads((tmp_path / "two" / "meta" / "wamkit_recording.json").read_text())["expert_noise"] == 0.2
    a, b = LeRobotV3Dataset(tmp_path / "one"), LeRobotV3Dataset(tmp_path / "two")
    assert one.kept_lengths == two.kept_lengths
    for ep in a.episode_indices:
        np.testing.assert_array_equal(a.episode_columns(ep, ["observation.state"])["observation.state"],
                                      b.episode_columns(ep, ["observation.state"])["observation.state"])
