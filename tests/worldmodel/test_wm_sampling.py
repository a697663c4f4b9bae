"""The world-model sampler: exact integration of a known velocity field (Euler and UniPC), the
conditioning layout (frame 0 + every action row clean, one packed forward per step), guidance
interval, packing invariance and the seed's eval setting."""

from types import SimpleNamespace

import pytest
import torch

from wamkit.model.cosmos3 import build_transformer
from wamkit.model.attention_backends import install_packed_attention
from wamkit.model.tokenizer import ByteTokenizer, PixelTokenizer
from wamkit.worldmodel.sampling import SEED_EVAL_SETTING, sample_video

T, MAX_DIM, H = 8, 8, 16


class FakeVelocity(torch.nn.Module):
    """v = (x - x0) / sigma on noisy video frames: the exact velocity towards a fixed target x0, so a
    correct sampler from sigma = 1 lands exactly on x0. Records what it was given."""

    def __init__(self, config, video_x0: float, predicts: str = "velocity"):
        super().__init__()
        self.config, self.predicts = config, predicts
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.video_x0 = video_x0
        self.calls, self.batch_sizes, self.noisy_action_rows, self.sigmas = 0, [], [], []

    def set_attn_processor(self, processor):
        pass

    def forward(self, **kw):
        self.calls += 1
        self.batch_sizes.append(len(kw["vision_tokens"]))
        self.noisy_action_rows.append([len(a) for a in kw["action_noisy_frame_indexes"]])
        sigma = float(kw["vision_timesteps"][0]) / 1000.0
        self.sigmas.append(sigma)
        samples, actions = [], []
        for video, noisy, rows in zip(kw["vision_tokens"], kw["vision_noisy_frame_indexes"], kw["action_tokens"]):
            v = torch.zeros_like(video)
            v[:, :, noisy] = (video[:, :, noisy] - self.video_x0) / sigma if self.predicts == "velocity" else self.video_x0
            samples.append(v)
            actions.append(torch.zeros_like(rows))
        return SimpleNamespace(sample=samples, action=actions)


@pytest.fixture(scope="module")
def tiny_config():
    return build_transformer("tiny", latent_channel=12, max_action_dim=MAX_DIM, num_domains=4).config


def _inputs(b, state=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    frames = torch.randint(0, 256, (b, H, H, 3), generator=g, dtype=torch.uint8)
    actions = torch.zeros(b, T, MAX_DIM)
    actions[..., :3] = torch.rand(b, T, 3, generator=g) * 2 - 1
    states = torch.rand(b, MAX_DIM, generator=g) if state else None
    return frames, actions, states


@pytest.mark.parametrize("solver", ["euler", "unipc"])
@pytest.mark.parametrize("guidance", [1.0, 3.0])
@pytest.mark.parametrize("state", [True, False])
def test_sampler_recovers_x0_for_the_exact_velocity(tiny_config, solver, guidance, state):
    model = FakeVelocity(tiny_config, 0.25)
    tok = PixelTokenizer(8)
    frames, actions, states = _inputs(3, state)
    video, latents = sample_video(model, install_packed_attention(model), tok, ByteTokenizer(32), frames, actions, states,
                                  num_steps=5, shift=3.0, guidance=guidance, generator=torch.Generator().manual_seed(0),
                                  fps=10.0, solver=solver, prompts=["a", "b", "c"], return_latents=True)
    assert video.shape == (3, T + 1, H, H, 3) and video.dtype == torch.uint8
    torch.testing.assert_close(latents[:, :, 1:], torch.full_like(latents[:, :, 1:], 0.25), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(latents[:, :, 0], tok.encode(frames.unsqueeze(1))[:, :, 0])  # frame 0 stays clean
    assert model.calls == 5  # one packed forward per step
    assert model.batch_sizes == [3 if guidance == 1.0 else 6] * 5
    assert all(n == 0 for rows in model.noisy_action_rows for n in rows)  # every action row is clean conditioning


def test_guidance_interval_limits_the_unconditional_twins(tiny_config):
    model = FakeVelocity(tiny_config, 0.0)
    frames, actions, states = _inputs(2)
    sample_video(model, install_packed_attention(model), PixelTokenizer(8), ByteTokenizer(32), frames, actions, states,
                 num_steps=4, shift=1.0, guidance=2.0, guidance_interval=(0.4, 0.8), fps=10.0)
    # sigmas 1.0, 0.75, 0.5, 0.25: only 0.75 and 0.5 are inside [0.4, 0.8]
    assert model.batch_sizes == [2, 4, 4, 2]


def test_seed_eval_setting_is_30_steps_shift_10_no_guidance(tiny_config):
    assert SEED_EVAL_SETTING == {"num_steps": 30, "guidance": 1.0, "shift": 10.0, "solver": "euler", "guidance_interval": (0.0, 1.0)}
    model = FakeVelocity(tiny_config, 0.0)
    frames, actions, states = _inputs(1)
    kw = {k: v for k, v in SEED_EVAL_SETTING.items()}
    sample_video(model, install_packed_attention(model), PixelTokenizer(8), ByteTokenizer(32), frames, actions, states, fps=10.0, **kw)
    assert model.calls == 30 and model.batch_sizes == [1] * 30
    assert model.sigmas[0] == pytest.approx(1.0) and model.sigmas[1] > 1 - 1 / 30  # shift 10 keeps early steps noisy


@pytest.fixture(scope="module")
def real_model():
    torch.manual_seed(0)
    return build_transformer("tiny", latent_channel=12, max_action_dim=MAX_DIM, num_domains=4).eval()


def _real(model, frames, actions, states, generator, **kw):
    return sample_video(model, install_packed_attention(model, kw.get("backend", "sdpa")), PixelTokenizer(8), ByteTokenizer(32), frames, actions, states,
                        num_steps=kw.get("num_steps", 3), shift=2.0, generator=generator, fps=10.0,
                        guidance=kw.get("guidance", 1.0), prompts=kw.get("prompts"), return_latents=True,
                        guidance_interval=kw.get("guidance_interval", (0.0, 1.0)), cache_text=kw.get("cache_text", True))[1]


def test_batch_equals_one_at_a_time_and_actions_matter(real_model):
    frames, actions, states = _inputs(2, seed=3)
    batched = _real(real_model, frames, actions, states, [torch.Generator().manual_seed(10 + i) for i in range(2)])
    for i in range(2):
        single = _real(real_model, frames[i:i + 1], actions[i:i + 1], states[i:i + 1], [torch.Generator().manual_seed(10 + i)])
        torch.testing.assert_close(batched[i], single[0], atol=1e-5, rtol=1e-4)
    other = _real(real_model, frames[:1], -actions[:1], states[:1], [torch.Generator().manual_seed(10)])
    assert not torch.allclose(other[0], batched[0])  # the clean action rows condition the video
    assert torch.isfinite(batched).all()


@pytest.mark.parametrize("backend", ["sdpa", "per_sample"])
def test_text_kv_cache_is_exact_when_guided_and_plain_layouts_alternate(real_model, backend):
    frames, actions, states = _inputs(2, seed=4)
    kw = dict(num_steps=5, guidance=2.5, guidance_interval=(0.5, 0.8), prompts=["push the block", "open the drawer now"])
    cached = _real(real_model, frames, actions, states, torch.Generator().manual_seed(1), backend=backend, **kw)
    plain = _real(real_model, frames, actions, states, torch.Generator().manual_seed(1), cache_text=False, **kw)
    torch.testing.assert_close(cached, plain, atol=1e-6, rtol=1e-5)
    unguided = _real(real_model, frames, actions, states, torch.Generator().manual_seed(1), **{**kw, "guidance": 1.0})
    assert not torch.allclose(cached, unguided)  # sigmas 1, .89 plain; .75, .57 guided; .33 plain again


def test_text_kv_reused_by_the_next_call_with_the_same_prompts(real_model):
    frames, actions, states = _inputs(2, seed=5)
    processor = install_packed_attention(real_model, "sdpa")
    kw = dict(num_steps=3, shift=2.0, fps=10.0, prompts=["push the block", "open the drawer"], return_latents=True)
    und_lens, real_forward = [], real_model.forward

    def spy(**forward_kw):
        und_lens.append(forward_kw["und_len"])
        return real_forward(**forward_kw)

    real_model.forward = spy
    try:
        runs = []
        for reuse in (True, True, False):
            und_lens.clear()
            latents = sample_video(real_model, processor, PixelTokenizer(8), ByteTokenizer(32), frames, actions, states,
                                   generator=torch.Generator().manual_seed(2), reuse_text_kv=reuse, **kw)[1]
            runs.append((latents, list(und_lens)))
    finally:
        del real_model.forward
    (_, first), (again, second), (fresh, recorded) = runs
    assert first[0] > 0 and second == [0, 0, 0] and recorded[0] > 0
    torch.testing.assert_close(again, fresh, atol=1e-6, rtol=1e-5)


def test_bad_inputs_are_rejected(real_model):
    frames, actions, states = _inputs(1)
    with pytest.raises(ValueError, match="first_frames"):
        _real(real_model, frames.float(), actions, states, torch.Generator())
    with pytest.raises(ValueError, match="multiple of 4"):
        _real(real_model, frames, actions[:, :6], states, torch.Generator())
    with pytest.raises(ValueError, match="solver"):
        sample_video(real_model, install_packed_attention(real_model), PixelTokenizer(8), ByteTokenizer(32), frames, actions,
                     states, num_steps=2, shift=1.0, solver="dpm")


def test_video_residual_adds_frame_zero_back():
    """The network's output is the difference from frame 0: the same velocity field lands on
    x0 + latent frame 0 when the run generates residuals, and on x0 otherwise."""
    tok = PixelTokenizer(8)
    frames, actions, states = _inputs(2)
    runs = {}
    for residual in (False, True):
        model = FakeVelocity(build_transformer("tiny", latent_channel=12, max_action_dim=MAX_DIM, num_domains=4).config, 0.25)
        _, runs[residual] = sample_video(model, install_packed_attention(model), tok, ByteTokenizer(32), frames, actions, states,
                                         num_steps=4, shift=3.0, generator=torch.Generator().manual_seed(0), fps=10.0,
                                         prompts=["a", "b"], return_latents=True, video_residual=residual)
    first = tok.encode(frames.unsqueeze(1))[:, :, :1]
    torch.testing.assert_close(runs[True][:, :, :1], first)
    torch.testing.assert_close(runs[True][:, :, 1:], runs[False][:, :, 1:] + first, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_steps", [1, 4])
def test_x0_prediction_is_read_as_the_clean_video(tiny_config, num_steps):
    """A network that outputs the clean target itself (diffusion.video_prediction = "x0") lands exactly
    on it in any number of steps when the sampler is told so; read as a velocity, the same output
    does not."""
    tok = PixelTokenizer(8)
    frames, actions, states = _inputs(2)
    results = {}
    for told in ("x0", "velocity"):
        model = FakeVelocity(tiny_config, 0.25, predicts="x0")
        _, results[told] = sample_video(model, install_packed_attention(model), tok, ByteTokenizer(32), frames, actions,
                                        states, num_steps=num_steps, shift=3.0, generator=torch.Generator().manual_seed(0),
                                        fps=10.0, prompts=["a", "b"], return_latents=True, video_prediction=told)
    future = results["x0"][:, :, 1:]
    torch.testing.assert_close(future, torch.full_like(future, 0.25), atol=1e-5, rtol=1e-5)
    assert (results["velocity"][:, :, 1:] - 0.25).abs().max() > 0.1


def test_zero_initialised_residual_x0_model_is_copy_last_frame():
    """model.zero_init_video_output: an untrained residual x0 world model built by the trainer predicts
    no change, so its sampled future is the observed frame repeated (copy-last-frame), at any step count."""
    from wamkit.config import load_experiment
    from wamkit.train.setup import build_model

    cfg = load_experiment("recipes/demo_tiny.toml", ["model.zero_init_video_output=true", 'model.mode="forward_dynamics"',
                                                      f"model.max_action_dim={MAX_DIM}"])
    model = build_model(cfg, 12)
    assert float(model.proj_out.weight.detach().abs().sum()) == 0.0
    tok = PixelTokenizer(8)
    frames, actions, states = _inputs(2)
    _, latents = sample_video(model, install_packed_attention(model, "sdpa"), tok, ByteTokenizer(32), frames, actions, states,
                              num_steps=3, shift=1.0, generator=torch.Generator().manual_seed(0), fps=10.0, prompts=["a", "b"],
                              return_latents=True, video_prediction="x0", video_residual=True)
    first = latents[:, :, :1]
    torch.testing.assert_close(latents[:, :, 1:], first.expand_as(latents[:, :, 1:]))
    with pytest.raises(Exception, match="zero_init_video_output"):
        load_experiment("recipes/demo_tiny.toml", ["model.zero_init_video_output=true", 'checkpoint.load_path="/x"'])
