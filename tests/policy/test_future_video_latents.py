"""`diffusion.future_video_latents` / `future_video_stride`: a policy that carries fewer future latent frames beside
its actions, in training (the samples' clips), in the estimate (tokens a sample) and in sampling (its sequence)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import wamkit.diffusion.sampling as sampling
from tests.helpers import DEMO_RECIPE, run_cli, train_tiny_run
from wamkit.config import load_experiment
from wamkit.data import LeRobotV3Dataset, Normalizer, SampleTransform, Window, WindowDataset
from wamkit.errors import ConfigError
from wamkit.model.tokenizer import future_latent_frames, sample_frame_indices
from wamkit.policy import load_policy

T = 8  # the demo recipe's chunk: 9 frames, 1 + 2 latent frames


def test_frame_indices_keep_the_observed_frame_and_four_per_latent_at_the_stride():
    assert sample_frame_indices(16) is None and future_latent_frames(16) == 4  # all 17 frames, 4 future latents
    assert sample_frame_indices(16, 1) == [0, 1, 2, 3, 4] and sample_frame_indices(16, 2) == list(range(9))
    assert sample_frame_indices(16, 0, 4) == [0, 4, 8, 12, 16] and future_latent_frames(16, 0, 4) == 1  # reaches the end
    assert sample_frame_indices(16, 0, 2) == list(range(0, 17, 2)) and future_latent_frames(16, 0, 2) == 2
    assert sample_frame_indices(16, 1, 2) == [0, 2, 4, 6, 8] and future_latent_frames(16, 1, 2) == 1


def test_config_refuses_a_count_the_chunk_lacks_a_world_model_and_a_latent_cache():
    assert load_experiment(DEMO_RECIPE, ["diffusion.future_video_latents=2"]).diffusion.future_video_latents == 2
    with pytest.raises(ConfigError, match=r"future_video_latents.*is 3; data.chunk_length 8 has 2") as err:
        load_experiment(DEMO_RECIPE, ["diffusion.future_video_latents=3"])
    assert "up to 2" in err.value.fix
    with pytest.raises(ConfigError, match="future_video_latents.*-1"):
        load_experiment(DEMO_RECIPE, ["diffusion.future_video_latents=-1"])
    with pytest.raises(ConfigError, match="model.mode = 'forward_dynamics'"):
        load_experiment(DEMO_RECIPE, ["diffusion.future_video_latents=1", 'model.mode="forward_dynamics"'])
    with pytest.raises(ConfigError, match="data.latent_cache") as err:
        load_experiment(DEMO_RECIPE, ["diffusion.future_video_latents=1", 'data.latent_cache="/tmp/cache"'])
    assert "cache-latents" in err.value.fix
    assert load_experiment(DEMO_RECIPE, ["diffusion.future_video_stride=2"]).diffusion.future_video_stride == 2
    with pytest.raises(ConfigError, match=r"future_video_stride.*is 4; data.chunk_length 8") as err:
        load_experiment(DEMO_RECIPE, ["diffusion.future_video_stride=4"])  # 8 frames hold no latent of 4 at stride 4
    with pytest.raises(ConfigError, match=r"future_video_latents.*is 2.*1 future latent frames at diffusion.future_video_stride 2"):
        load_experiment(DEMO_RECIPE, ["diffusion.future_video_stride=2", "diffusion.future_video_latents=2"])
    with pytest.raises(ConfigError, match="future_video_stride.*checkpoint.load_path") as err:
        load_experiment(DEMO_RECIPE, ["diffusion.future_video_stride=2", 'checkpoint.load_path="/tmp/base"'])
    assert "keep 1" in err.value.fix


def test_samples_keep_their_first_frames_for_one_camera_and_for_cameras_of_two_sizes(demo_root):
    demo_ds = LeRobotV3Dataset(demo_root)
    window = WindowDataset(demo_ds, [4], chunk_length=T)[10]
    norm = Normalizer.from_stats(demo_ds.stats, "action", "minmax")
    kept = SampleTransform(norm, None, 8, use_state=False, domain_id=0, frame_indices=[0, 1, 2, 3, 4])(window)
    assert kept.video.shape[0] == 5 and torch.equal(kept.video, window.video[0, :5])
    strided = SampleTransform(norm, None, 8, use_state=False, domain_id=0, frame_indices=[0, 2, 4, 6, 8])(window)
    assert torch.equal(strided.video, window.video[0, ::2])
    assert SampleTransform(norm, None, 8, use_state=False, domain_id=0)(window).video.shape[0] == T + 1  # 0: all
    small = window.video[0][:, ::2, ::2]  # a second camera at half the size: the window holds a list
    two = Window([window.video[0], small], window.state, window.action, window.task, 4, 10)
    kept = SampleTransform(norm, None, 8, use_state=False, domain_id=0, frame_indices=[0, 1, 2, 3, 4])(two)
    whole = SampleTransform(norm, None, 8, use_state=False, domain_id=0)(two)
    assert whole.video.shape[0] == T + 1 and torch.equal(kept.video, whole.video[:5])  # the same canvas, cut
    assert torch.equal(kept.actions[:, :3], norm.normalize(window.action).float())  # the actions stay whole


def test_dry_run_counts_the_kept_latent_frames(demo_root):
    proc = run_cli(["train", str(DEMO_RECIPE), "--dry-run", "--set", f'data.path="{demo_root}"',
                    "--set", "diffusion.future_video_latents=1"])
    assert "video 32 (2 latent frames x 16 patches) + action 9 (8 actions + 1 state row)" in proc.stdout
    proc = run_cli(["train", str(DEMO_RECIPE), "--dry-run", "--set", f'data.path="{demo_root}"',
                    "--set", "diffusion.future_video_stride=2"])
    assert "video 32 (2 latent frames x 16 patches)" in proc.stdout  # one future latent of frames 2, 4, 6, 8


@pytest.mark.parametrize("knob", ["diffusion.future_video_latents=1", "diffusion.future_video_stride=2"])
def test_a_policy_trained_with_one_future_latent_samples_with_one(tmp_path, monkeypatch, knob):
    run = train_tiny_run(tmp_path, "fvl", extra=[knob])
    policy = load_policy(run)
    assert (policy.future_video_latents, policy.future_video_stride) == ((1, 1) if "latents" in knob else (0, 2))
    seen = []
    build = sampling._sequence

    def spy(text_ids, video, *args, **kwargs):
        seen.append(tuple(video.shape))
        return build(text_ids, video, *args, **kwargs)

    monkeypatch.setattr(sampling, "_sequence", spy)
    frame = np.zeros((64, 64, 3), dtype=np.uint8)
    obs = {"image": frame, "state": np.zeros(policy.state_dim, dtype=np.float32), "prompt": "reach the blue target"}
    chunk = policy.predict([obs], seed=0, num_steps=2)[0]
    assert chunk.shape == (policy.chunk_length, policy.action_dim) and np.isfinite(chunk).all()
    assert seen and all(shape[1] == 2 for shape in seen)  # [C, 1 + 1 latent frames, h, w]
