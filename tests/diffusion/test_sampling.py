"""The flow sampler: schedule, exact Euler integration on a known velocity field, and packing
invariance (a batch gives the same actions as one-at-a-time with the same per-sample noise)."""

from types import SimpleNamespace

import pytest
import torch

from wamkit.diffusion.flow import shift_sigma
from wamkit.diffusion.sampling import PolicyInput, sample_policy, sigma_schedule
from wamkit.model.cosmos3 import build_transformer
from wamkit.model.attention_backends import install_packed_attention
from wamkit.model.tokenizer import ByteTokenizer, PixelTokenizer

T, MAX_DIM = 8, 8


def test_sigma_schedule_runs_from_one_to_zero_and_is_shifted():
    plain = sigma_schedule(4, 1.0)
    torch.testing.assert_close(plain, torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))
    shifted = sigma_schedule(6, 3.0)
    assert shifted[0] == 1.0 and shifted[-1] == 0.0 and len(shifted) == 7
    assert torch.all(shifted[1:] < shifted[:-1])
    torch.testing.assert_close(shifted, shift_sigma(torch.linspace(1, 0, 7, dtype=torch.float64), 3.0).float())
    assert torch.all(shifted[1:-1] > torch.linspace(1, 0, 7)[1:-1])  # shift > 1 keeps more noise
    with pytest.raises(ValueError, match="num_steps"):
        sigma_schedule(0, 1.0)


def _obs(seed, state=True, action_dim=3, prompt="reach the green target"):
    g = torch.Generator().manual_seed(seed)
    frame = torch.randint(0, 256, (16, 16, 3), generator=g, dtype=torch.uint8)
    s = None
    if state:
        s = torch.zeros(MAX_DIM)
        s[:4] = torch.rand(4, generator=g) * 2 - 1
    return PolicyInput(frame=frame, state=s, prompt=prompt + str(seed), chunk_length=T, action_dim=action_dim, domain_id=seed % 3)


class FakeVelocity(torch.nn.Module):
    """v = (x - x0) / sigma on noisy positions: the exact velocity towards fixed targets x0, so an
    Euler sampler from sigma = 1 must land exactly on x0."""

    def __init__(self, config, video_x0: float, action_x0: torch.Tensor, actions_as: str = "velocity"):
        super().__init__()
        self.config, self.actions_as = config, actions_as
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.video_x0, self.action_x0 = video_x0, action_x0
        self.calls, self.batch_sizes = 0, []

    def set_attn_processor(self, processor):
        pass

    def forward(self, **kw):
        self.calls += 1
        self.batch_sizes.append(len(kw["vision_tokens"]))
        sigma = float(kw["vision_timesteps"][0]) / 1000.0
        samples, actions = [], []
        for video, noisy, rows, noisy_rows in zip(kw["vision_tokens"], kw["vision_noisy_frame_indexes"], kw["action_tokens"], kw["action_noisy_frame_indexes"]):
            v = torch.zeros_like(video)
            v[:, :, noisy] = (video[:, :, noisy] - self.video_x0) / sigma
            a = torch.zeros_like(rows)
            target = self.action_x0[-rows.shape[0]:]
            a[noisy_rows] = (rows[noisy_rows] - target[noisy_rows]) / sigma if self.actions_as == "velocity" else target[noisy_rows]
            samples.append(v)
            actions.append(a)
        return SimpleNamespace(sample=samples, action=actions)


@pytest.fixture(scope="module")
def tiny_config():
    return build_transformer("tiny", latent_channel=12, max_action_dim=MAX_DIM, num_domains=4).config


@pytest.mark.parametrize("guidance", [1.0, 3.0])
@pytest.mark.parametrize("state", [True, False])
def test_euler_recovers_x0_exactly_for_the_exact_velocity(tiny_config, guidance, state):
    target = torch.zeros(T + 1, MAX_DIM)
    target[:, :3] = torch.linspace(-0.9, 0.9, (T + 1) * 3).view(T + 1, 3)
    model = FakeVelocity(tiny_config, 0.25, target)
    observations = [_obs(i, state=state) for i in range(3)]
    actions = sample_policy(model, install_packed_attention(model), PixelTokenizer(8), ByteTokenizer(32), observations,
                            num_steps=5, shift=3.0, generator=torch.Generator().manual_seed(0), fps=10.0, guidance=guidance)
    assert actions.shape == (3, T, MAX_DIM)
    for a in actions:
        torch.testing.assert_close(a, target[1:], atol=1e-5, rtol=1e-5)
    assert model.calls == 5  # one packed forward per step
    assert model.batch_sizes == [3 if guidance == 1.0 else 6] * 5  # guidance packs the unconditional twins in


@pytest.mark.parametrize("num_steps", [1, 4])
def test_x0_action_output_is_read_as_the_clean_chunk(tiny_config, num_steps):
    """A network whose action head outputs the clean chunk itself (diffusion.action_prediction = "x0")
    lands exactly on it in any number of steps when the sampler is told so; read as a velocity, the
    same output does not."""
    target = torch.zeros(T + 1, MAX_DIM)
    target[:, :3] = torch.linspace(-0.9, 0.9, (T + 1) * 3).view(T + 1, 3)
    observations = [_obs(i) for i in range(2)]
    results = {}
    for told in ("x0", "velocity"):
        model = FakeVelocity(tiny_config, 0.25, target, actions_as="x0")
        results[told] = sample_policy(model, install_packed_attention(model), PixelTokenizer(8), ByteTokenizer(32), observations,
                                      num_steps=num_steps, shift=3.0, generator=torch.Generator().manual_seed(0), fps=10.0,
                                      action_prediction=told)
    for a in results["x0"]:
        torch.testing.assert_close(a, target[1:], atol=1e-5, rtol=1e-5)
    assert (results["velocity"] - target[1:]).abs().max() > 0.1


def test_padded_action_channels_stay_zero(tiny_config):
    target = torch.ones(T + 1, MAX_DIM)  # the fake even pulls padded channels towards 1
    model = FakeVelocity(tiny_config, 0.0, target)
    actions = sample_policy(model, install_packed_attention(model), PixelTokenizer(8), ByteTokenizer(32), [_obs(0, action_dim=2)],
                            num_steps=3, shift=1.0, generator=torch.Generator().manual_seed(0), fps=10.0)
    assert torch.count_nonzero(actions[0, :, 2:]) == 0
    torch.testing.assert_close(actions[0, :, :2], torch.ones(T, 2))


@pytest.fixture(scope="module")
def real_model():
    torch.manual_seed(0)
    model = build_transformer("tiny", latent_channel=12, max_action_dim=MAX_DIM, num_domains=4).eval()
    with torch.no_grad():
        model.action_modality_embed.normal_()
    return model


def _sample(model, observations, generator, **kw):
    return sample_policy(model, install_packed_attention(model), PixelTokenizer(8), ByteTokenizer(32), observations,
                         num_steps=kw.get("num_steps", 4), shift=kw.get("shift", 2.0), generator=generator, fps=10.0,
                         guidance=kw.get("guidance", 1.0), cache_text=kw.get("cache_text", True))


def test_batch_equals_one_at_a_time_with_per_sample_generators(real_model):
    observations = [_obs(i) for i in range(3)]
    batched = _sample(real_model, observations, [torch.Generator().manual_seed(10 + i) for i in range(3)])
    singles = [_sample(real_model, [o], [torch.Generator().manual_seed(10 + i)])[0] for i, o in enumerate(observations)]
    for b, s in zip(batched, singles):
        torch.testing.assert_close(b, s, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(batched[0], batched[1])
    assert torch.isfinite(batched).all()


def test_batch_equals_one_at_a_time_with_one_shared_generator(real_model):
    observations = [_obs(i) for i in range(3)]
    batched = _sample(real_model, observations, torch.Generator().manual_seed(5), guidance=2.0)
    g = torch.Generator().manual_seed(5)
    singles = [_sample(real_model, [o], g, guidance=2.0)[0] for o in observations]
    for b, s in zip(batched, singles):
        torch.testing.assert_close(b, s, atol=1e-5, rtol=1e-4)


def test_guidance_changes_the_result_and_seeds_reproduce(real_model):
    obs = [_obs(1)]
    a = _sample(real_model, obs, torch.Generator().manual_seed(3))
    b = _sample(real_model, obs, torch.Generator().manual_seed(3))
    c = _sample(real_model, obs, torch.Generator().manual_seed(3), guidance=4.0)
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, c)


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_text_kv_cache_is_exact_and_skips_the_text_after_step_one(real_model, guidance):
    observations = [_obs(i, prompt="p" * (3 + 5 * i)) for i in range(2)]  # different text lengths
    und_lens = []
    real_forward = real_model.forward

    def spy(**kw):
        und_lens.append(kw["und_len"])
        return real_forward(**kw)

    real_model.forward = spy
    try:
        cached = _sample(real_model, observations, torch.Generator().manual_seed(7), guidance=guidance)
        steps_cached = list(und_lens)
        und_lens.clear()
        plain = _sample(real_model, observations, torch.Generator().manual_seed(7), guidance=guidance, cache_text=False)
    finally:
        del real_model.forward
    torch.testing.assert_close(cached, plain, atol=1e-6, rtol=1e-5)
    assert steps_cached[0] > 0 and steps_cached[1:] == [0, 0, 0]  # text tokens only in the recording step
    assert und_lens == [steps_cached[0]] * 4


def test_text_kv_reused_across_calls_with_the_same_prompts_and_weights(real_model):
    """With reuse_text_kv a later call packing the same prompts runs no text token at all, and
    still equals a call computed from scratch; another prompt, or weights changed in place,
    record again."""
    processor = install_packed_attention(real_model)
    und_lens = []
    real_forward = real_model.forward

    def spy(**kw):
        und_lens.append(kw["und_len"])
        return real_forward(**kw)

    def call(observations, seed, reuse=True):
        und_lens.clear()
        out = sample_policy(real_model, processor, PixelTokenizer(8), ByteTokenizer(32), observations, num_steps=3, shift=2.0,
                            generator=torch.Generator().manual_seed(seed), fps=10.0, reuse_text_kv=reuse)
        return out, list(und_lens)

    same = [_obs(0), _obs(1)]
    real_model.forward = spy
    try:
        _, first = call(same, 1)
        again, second = call([_obs(0), _obs(1)], 2)
        fresh, recorded = call(same, 2, reuse=False)
        _, other_prompt = call([_obs(0), _obs(1, prompt="push the puck to the goal")], 2)
        _, back = call(same, 3)
        with torch.no_grad():
            real_model.action_modality_embed.mul_(1.0)  # a counted in-place write, values unchanged
        _, after_write = call(same, 3)
    finally:
        del real_model.forward
    assert first[0] > 0 and first[1:] == [0, 0]
    assert second == [0, 0, 0]  # the text pathway never ran
    assert recorded[0] > 0  # without reuse_text_kv every call records
    torch.testing.assert_close(again, fresh, atol=1e-6, rtol=1e-5)
    assert other_prompt[0] > 0 and back[0] > 0  # the buffers of that length held the other prompt's K/V
    assert after_write[0] > 0


def test_bad_inputs_are_rejected(real_model):
    bad = _obs(0)
    bad.frame = bad.frame.float()
    with pytest.raises(ValueError, match="frame"):
        _sample(real_model, [bad], torch.Generator())
    with pytest.raises(ValueError, match="state row"):
        _sample(real_model, [_obs(0), _obs(1, state=False)], torch.Generator())
    with pytest.raises(ValueError, match="empty"):
        _sample(real_model, [], torch.Generator())


def test_rtc_steering_with_cfg_pulls_the_frozen_head_to_the_target(real_model):
    """A random model whose parameters still take gradients, with classifier-free guidance: the
    steered sample's first d actions land near the target, its batch mate is untouched."""
    from wamkit.diffusion.rtc import InpaintTarget, soft_mask

    target = torch.zeros(T, MAX_DIM)
    target[:, :3] = torch.linspace(-0.8, 0.8, T)[:, None]
    steered = _obs(0)
    steered.inpaint = InpaintTarget(target, soft_mask(T, 3, 6))
    gens = lambda: [torch.Generator().manual_seed(5), torch.Generator().manual_seed(6)]  # noqa: E731
    free = _sample(real_model, [_obs(0), _obs(1)], gens(), guidance=2.0)
    guided = _sample(real_model, [steered, _obs(1)], gens(), guidance=2.0)
    free_gap = (free[0, :3, :3] - target[:3, :3]).abs().mean()
    guided_gap = (guided[0, :3, :3] - target[:3, :3]).abs().mean()
    assert guided_gap < 0.25 * free_gap, (guided_gap, free_gap)
    torch.testing.assert_close(guided[1], free[1], atol=1e-5, rtol=1e-4)
    assert torch.count_nonzero(guided[0, :, 3:]) == 0  # padded channels stay out of the steering


def test_flex_batches_pad_their_text_to_whole_tiles_and_still_equal_one_at_a_time(real_model):
    """Under flex attention a batch's text is padded to whole tiles (packs of other prompts then share
    padded shapes, mask slots and CUDA graphs); the filler changes no action."""
    from wamkit.model.flex_attention import TILE, FlexPackedAttention

    observations = [_obs(i, prompt="p" * (3 + 5 * i)) for i in range(3)]
    flex = FlexPackedAttention(compiled=False)
    und_lens, real_forward = [], real_model.forward

    def spy(**kw):
        und_lens.append(kw["und_len"])
        return real_forward(**kw)

    real_model.set_attn_processor(flex)
    real_model.forward = spy
    try:
        batched = sample_policy(real_model, flex, PixelTokenizer(8), ByteTokenizer(32), observations, num_steps=3, shift=2.0,
                                generator=[torch.Generator().manual_seed(20 + i) for i in range(3)], fps=10.0)
    finally:
        del real_model.forward
    assert und_lens[0] % TILE == 0 and und_lens[1:] == [0, 0]
    singles = [_sample(real_model, [o], [torch.Generator().manual_seed(20 + i)], num_steps=3)[0] for i, o in enumerate(observations)]
    for b, s in zip(batched, singles):
        torch.testing.assert_close(b, s, atol=1e-5, rtol=1e-4)
