"""Policy / forward-dynamics / inverse-dynamics / mixed: which tokens are clean, which are noisy, and
which losses they get — including packed batches with no noisy action rows or no noisy video."""

import math

import pytest
import torch

from wamkit.config import load_experiment
from wamkit.config.schema import DiffusionConfig
from wamkit.data.sample import TrainingSample
from wamkit.diffusion.flow import sample_sigmas
from wamkit.diffusion.objective import ModeObjective, PolicyObjective
from wamkit.errors import ConfigError
from wamkit.model.cosmos3 import build_transformer
from wamkit.model.goal_head import attach_goal_head
from wamkit.model.tokenizer import build_text_tokenizer, build_video_tokenizer

T, A, USED = 8, 8, 5  # chunk, max_action_dim, real action channels


def _samples(n: int, seed: int = 0, with_state: bool = True) -> list[TrainingSample]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(A, dtype=torch.bool)
    mask[:USED] = True
    out = []
    for i in range(n):
        actions = torch.rand(T, A, generator=g) * 2 - 1
        actions[:, USED:] = 0
        state = (torch.rand(A, generator=g) * 2 - 1) * mask if with_state else None
        video = torch.randint(0, 256, (T + 1, 32, 32, 3), generator=g, dtype=torch.uint8)
        goal = (torch.rand(A, generator=g) * 2 - 1) * mask if with_state else None  # the episode's last state
        out.append(TrainingSample(video=video, actions=actions, state=state, action_mask=mask, task=f"reach {i}", domain_id=i % 2,
                                  goal_state=goal, state_mask=mask if with_state else None))
    return out


def _objective(mode: str, weights=None, **diffusion) -> ModeObjective:
    torch.manual_seed(0)
    video_tok = build_video_tokenizer("pixel", "", 8)
    model = build_transformer("tiny", video_tok.latent_channels, A, 4)
    with torch.no_grad():
        model.action_modality_embed.normal_()
    if diffusion.get("goal_state_loss_weight", 0) > 0:
        attach_goal_head(model)
    return ModeObjective(model, video_tok, build_text_tokenizer("", 32), DiffusionConfig(**diffusion), "{task}", 10.0, "sdpa", mode=mode, mode_weights=weights)


def _gens(n: int, seed: int = 100) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


def _capture(model):
    seen = {}

    def hook(_module, _args, kwargs):
        seen.update(kwargs)

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def _clean_rows(sample: TrainingSample) -> torch.Tensor:
    return torch.cat([sample.state.unsqueeze(0), sample.actions]) if sample.state is not None else sample.actions


def test_policy_objective_name_is_the_policy_mode():
    assert PolicyObjective is ModeObjective
    assert _objective("policy").sample_mode(torch.Generator()) == "policy"


def test_forward_dynamics_feeds_clean_actions_and_has_no_action_loss():
    objective = _objective("forward_dynamics")
    seen = _capture(objective.model)
    samples = _samples(3)
    losses = objective(samples, _gens(3))
    assert objective.last_modes == ["forward_dynamics"] * 3
    for sample, rows in zip(samples, seen["action_tokens"]):
        assert torch.equal(rows, _clean_rows(sample))  # exactly the clean normalized state + actions
    assert seen["action_mse_loss_indexes"].numel() == 0 and seen["action_timesteps"].numel() == 0
    assert all(idx.numel() == 0 for idx in seen["action_noisy_frame_indexes"])
    latents = objective.encode_videos([s.video for s in samples])
    for x0, fed, noisy in zip(latents, seen["vision_tokens"], seen["vision_noisy_frame_indexes"]):
        assert torch.equal(fed[0][:, 0], x0[:, 0]) and not torch.equal(fed[0][:, 1:], x0[:, 1:])
        assert noisy.tolist() == list(range(1, x0.shape[1]))
    assert losses.action == 0.0 and losses.video > 0 and math.isfinite(losses.total.item())
    losses.total.backward()
    assert objective.model.proj_out.weight.grad is not None
    # no noisy action row was decoded: the head's gradient is exactly zero (present, so FSDP2 ranks reduce alike)
    assert not objective.model.action_proj_out.fc.weight.grad.any() and not objective.model.action_proj_out.bias.weight.grad.any()
    assert objective.model.action_proj_in.fc.weight.grad is not None  # the clean rows condition the video


def test_inverse_dynamics_keeps_every_frame_clean_and_has_no_video_loss():
    objective = _objective("inverse_dynamics")
    seen = _capture(objective.model)
    samples = _samples(3)
    losses = objective(samples, _gens(3))
    latents = objective.encode_videos([s.video for s in samples])
    for x0, fed in zip(latents, seen["vision_tokens"]):
        assert torch.equal(fed[0], x0)
    assert seen["vision_mse_loss_indexes"].numel() == 0 and seen["vision_timesteps"].numel() == 0
    for sample, rows, noisy in zip(samples, seen["action_tokens"], seen["action_noisy_frame_indexes"]):
        assert torch.equal(rows[0], sample.state)  # the state row stays clean
        assert not torch.equal(rows[1:], sample.actions)
        assert noisy.tolist() == list(range(1, T + 1))
    assert losses.video == 0.0 and losses.action > 0 and math.isfinite(losses.total.item())
    losses.total.backward()
    assert not objective.model.proj_out.weight.grad.any() and not objective.model.proj_out.bias.grad.any()
    assert objective.model.action_proj_out.fc.weight.grad is not None


def test_inverse_dynamics_without_state_row():
    objective = _objective("inverse_dynamics")
    seen = _capture(objective.model)
    samples = _samples(2, with_state=False)
    losses = objective(samples, _gens(2))
    assert [n.tolist() for n in seen["action_noisy_frame_indexes"]] == [list(range(T))] * 2
    assert losses.video == 0.0 and losses.action > 0


def test_policy_mode_split_is_unchanged():
    objective = _objective("policy")
    seen = _capture(objective.model)
    samples = _samples(2)
    losses = objective(samples, _gens(2))
    for sample, rows, noisy in zip(samples, seen["action_tokens"], seen["action_noisy_frame_indexes"]):
        assert torch.equal(rows[0], sample.state) and noisy.tolist() == list(range(1, T + 1))
    assert [n.tolist() for n in seen["vision_noisy_frame_indexes"]] == [[1, 2]] * 2
    assert losses.video > 0 and losses.action > 0


def test_mixed_batch_averages_each_loss_over_the_samples_that_have_it():
    """One packed batch with all three modes equals the per-sample forwards, and each loss is the
    mean over exactly the samples whose modality is noisy."""
    modes = ["policy", "forward_dynamics", "inverse_dynamics", "forward_dynamics"]
    samples = _samples(4, seed=3)
    mixed = _objective("mixed", {"policy": 1, "forward_dynamics": 1, "inverse_dynamics": 1})
    mixed.sample_mode = lambda _g, it=iter(modes): next(it)  # prescribe the draws
    with torch.no_grad():
        packed = mixed(samples, _gens(4))
        singles = [_objective(m)([s], [g]) for m, s, g in zip(modes, samples, _gens(4))]
    videos = [float(single.video) for m, single in zip(modes, singles) if m != "inverse_dynamics"]
    actions = [float(single.action) for m, single in zip(modes, singles) if m != "forward_dynamics"]
    assert float(packed.video) == pytest.approx(sum(videos) / len(videos), rel=1e-4)
    assert float(packed.action) == pytest.approx(sum(actions) / len(actions), rel=1e-4)
    assert [float(s.action) for m, s in zip(modes, singles) if m == "forward_dynamics"] == [0.0, 0.0]


def test_mixed_draws_come_from_each_samples_generator():
    objective = _objective("mixed", {"policy": 1, "forward_dynamics": 1, "inverse_dynamics": 1})
    draws = [objective.sample_mode(g) for g in _gens(60, seed=7)]
    assert draws == [objective.sample_mode(g) for g in _gens(60, seed=7)]  # reproducible on resume
    assert set(draws) == {"policy", "forward_dynamics", "inverse_dynamics"}
    only_fd = _objective("mixed", {"policy": 0, "forward_dynamics": 2, "inverse_dynamics": 0})
    assert {only_fd.sample_mode(g) for g in _gens(20)} == {"forward_dynamics"}


def test_mixed_batch_with_no_noisy_actions_at_all():
    objective = _objective("mixed", {"policy": 0, "forward_dynamics": 1, "inverse_dynamics": 0})
    losses = objective(_samples(2), _gens(2))
    assert losses.action == 0.0 and math.isfinite(losses.total.item())
    losses.total.backward()


def test_mode_config_validation(tmp_path):
    base = ["data.path=\"x\""]
    cfg = load_experiment(None, base + ['model.mode="mixed"', "model.mode_weights.inverse_dynamics=0.5"])
    assert (cfg.model.mode_weights.policy, cfg.model.mode_weights.inverse_dynamics) == (1.0, 0.5)
    with pytest.raises(ConfigError, match="model.mode"):
        load_experiment(None, base + ['model.mode="world"'])
    with pytest.raises(ConfigError, match="negative"):
        load_experiment(None, base + ["model.mode_weights.policy=-1"])
    with pytest.raises(ConfigError, match="all weights are 0"):
        load_experiment(None, base + ['model.mode="mixed"', "model.mode_weights.policy=0", "model.mode_weights.forward_dynamics=0"])
    with pytest.raises(ConfigError, match="did you mean"):
        load_experiment(None, base + ["model.mode_weights.forward=1"])


def test_video_residual_noises_the_difference_from_frame_zero():
    """With diffusion.video_residual the noisy video is built from frames 1.. minus frame 0: a clip
    whose frames never change has an all-zero target, so the noisy tokens are pure scaled noise."""
    plain, residual = _objective("forward_dynamics"), _objective("forward_dynamics", video_residual=True)
    seen_plain, seen_residual = _capture(plain.model), _capture(residual.model)
    static = _samples(2)
    for s in static:
        s.video = s.video[:1].expand_as(s.video).clone()
    plain(static, _gens(2))
    residual(static, _gens(2))
    for fed_p, fed_r in zip(seen_plain["vision_tokens"], seen_residual["vision_tokens"]):
        torch.testing.assert_close(fed_r[0][:, 0], fed_p[0][:, 0])  # the observed frame is fed as it is
        # Same noise eps and level s: plain x_s = s*eps + (1-s)*x0, residual x_s = s*eps (its x0 is 0).
        x0 = fed_p[0][:, :1].expand_as(fed_p[0][:, 1:])
        diff = fed_p[0][:, 1:] - fed_r[0][:, 1:]
        keep = float((diff * x0).sum() / (x0 * x0).sum())  # 1 - s
        assert 0.0 < keep < 1.0
        torch.testing.assert_close(diff, keep * x0, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("weighting", ["velocity", "uniform"])
def test_x0_prediction_trains_towards_the_clean_latents(weighting):
    """diffusion.video_prediction = "x0": the video loss is |out - x0|^2 on the noisy frames, divided
    by max(s, 0.05)^2 (the velocity error the x0 output implies) or, with x0_loss_weighting =
    "uniform", left as it is."""
    objective = _objective("forward_dynamics", video_prediction="x0", x0_loss_weighting=weighting)
    samples, sigmas, outputs = _samples(2), [], []

    def record_sigma(_module, _args, kwargs):
        sigmas.extend(float(t) / 1000.0 for t in torch.unique_consecutive(kwargs["vision_timesteps"]))  # one per token

    objective.model.register_forward_pre_hook(record_sigma, with_kwargs=True)
    objective.model.register_forward_hook(lambda _m, _a, out: outputs.append(out))
    losses = objective(samples, _gens(2))
    x0 = objective.latents_of(samples)
    expected = []
    for i, (latents, sigma) in enumerate(zip(x0, sigmas)):
        pred = outputs[0].sample[i][0].detach().float()[:, 1:]
        weight = 1.0 / max(sigma, 0.05) ** 2 if weighting == "velocity" else 1.0
        expected.append((pred - latents[:, 1:]).pow(2).mean() * weight)
    assert len(sigmas) == 2 and all(s < 0.9 for s in sigmas)  # the two weightings differ on these levels
    assert float(losses.video) == pytest.approx(float(torch.stack(expected).mean()), rel=1e-5)


@pytest.mark.parametrize("weighting,action_loss", [("velocity", "mse"), ("uniform", "mse"), ("uniform", "l1")])
def test_x0_action_prediction_trains_towards_the_clean_chunk(weighting, action_loss):
    """diffusion.action_prediction = "x0": the action loss is the masked |out - actions|^2 on the noisy
    rows (|out - actions| with diffusion.action_loss = "l1"), weighted per noise level like the video's."""
    objective = _objective("policy", action_prediction="x0", x0_loss_weighting=weighting, action_loss=action_loss)
    samples, sigmas, outputs = _samples(2), [], []

    def record_sigma(_module, _args, kwargs):
        sigmas.extend(float(t) / 1000.0 for t in torch.unique_consecutive(kwargs["vision_timesteps"]))

    objective.model.register_forward_pre_hook(record_sigma, with_kwargs=True)
    objective.model.register_forward_hook(lambda _m, _a, out: outputs.append(out))
    losses = objective(samples, _gens(2))
    expected = []
    for i, (sample, sigma) in enumerate(zip(samples, sigmas)):
        rows = torch.cat([sample.state.unsqueeze(0), sample.actions]) if sample.state is not None else sample.actions
        noisy = list(range(1 if sample.state is not None else 0, rows.shape[0]))
        mask = sample.action_mask
        diff = outputs[0].action[i].detach().float()[noisy] - rows[noisy]
        err = (diff.abs() if action_loss == "l1" else diff.pow(2)) * mask
        weight = 1.0 / max(sigma, 0.05) ** 2 if weighting == "velocity" else 1.0
        expected.append(err.sum() / (len(noisy) * mask.sum()) * weight)
    assert float(losses.action) == pytest.approx(float(torch.stack(expected).mean()), rel=1e-5)


def test_unknown_video_prediction_is_refused():
    with pytest.raises(ConfigError, match="video_prediction"):
        load_experiment(None, ['diffusion.video_prediction="eps"'])
    with pytest.raises(ConfigError, match="action_prediction"):
        load_experiment(None, ['diffusion.action_prediction="eps"'])
    with pytest.raises(ConfigError, match="x0_loss_weighting"):
        load_experiment(None, ['diffusion.x0_loss_weighting="snr"'])
    with pytest.raises(ConfigError, match="action_loss"):
        load_experiment(None, ['diffusion.action_loss="huber"'])


def test_text_filler_leaves_the_loss_unchanged():
    """Training packs padded for compiled code (text_multiple) give the same losses, and their text
    prefix has the padded length."""
    plain = _objective("policy")
    padded = _objective("policy")
    padded.text_multiple = 128
    seen = _capture(padded.model)
    samples = _samples(3)
    want, got = plain(samples, _gens(3)), padded(samples, _gens(3))
    assert seen["und_len"] == 128 and seen["und_len"] > sum(len(s.task) for s in samples)
    assert float(got.video) == pytest.approx(float(want.video), rel=1e-5)
    assert float(got.action) == pytest.approx(float(want.action), rel=1e-5)


def test_training_pads_text_only_for_compiled_code():
    from wamkit.model.attention_backends import training_text_multiple
    from wamkit.model.packing import TEXT_PAD_MULTIPLE

    assert training_text_multiple(False, "flex") == training_text_multiple(True, "per_sample") == TEXT_PAD_MULTIPLE
    assert training_text_multiple(False, "per_sample", 256) == training_text_multiple(False, "sdpa", 256) == 0
    # bigger packs, bigger multiples (whole tiles): their total text spreads wider from step to step
    assert training_text_multiple(True, "flex", 16) == 128 and training_text_multiple(True, "flex", 17) == 256
    assert training_text_multiple(True, "flex", 256) == 2048


def test_clean_and_noisy_positions_index_without_a_python_list():
    """On a GPU, indexing with a Python list is a blocking host-to-device copy (a stream sync) per
    call; the objective's position sets are runs of consecutive positions, which become slices."""
    from wamkit.diffusion.objective import index_of

    cpu = torch.device("cpu")
    assert index_of([0], cpu) == slice(0, 1)
    assert index_of([1, 2, 3, 4], cpu) == slice(1, 5)
    assert index_of([], cpu) == slice(0, 0)
    scattered = index_of([0, 2, 3], cpu)
    assert isinstance(scattered, torch.Tensor) and scattered.tolist() == [0, 2, 3]
    x = torch.arange(10.0)
    for positions in ([0], [3, 4, 5], [], [1, 7]):
        assert torch.equal(x[index_of(positions, cpu)], x[positions])


def test_teacher_forcing_keeps_every_frame_clean_but_the_target_chunks():
    """Block-causal teacher forcing: the one target chunk holds add_noise's values (the same draws as
    a bidirectional run), every other latent frame the clean latents."""
    from wamkit.diffusion.flow import add_noise

    objective = _objective("policy", causal_chunk_frames=1)
    sample = _samples(1)[0]
    x0 = objective.encode_videos([sample.video])[0]
    generator = torch.Generator().manual_seed(7)
    seq, _ = objective._noised_sequence(sample, x0, 0.6, generator)
    replay = torch.Generator().manual_seed(7)
    noise = torch.randn(x0.shape, generator=replay)
    torch.randn((T + 1, A), generator=replay)  # the action noise, drawn in between
    target = int(torch.randint(1, x0.shape[1], (1,), generator=replay))
    noisy, _ = add_noise(x0, 0.6, noise)
    assert seq.clean_video_frames == [f for f in range(x0.shape[1]) if f != target]
    assert torch.equal(seq.video[:, target], noisy[:, target])
    rest = seq.clean_video_frames
    assert torch.equal(seq.video[:, rest], x0[:, rest])


@pytest.mark.parametrize("mode,with_state,diffusion", [
    ("policy", True, {}), ("policy", False, {"action_prediction": "x0", "x0_loss_weighting": "velocity"}),
    ("forward_dynamics", True, {"video_prediction": "x0"}), ("inverse_dynamics", True, {}),
    ("policy", True, {"action_sigma": "independent", "action_shift": 3.0, "action_prediction": "x0", "x0_loss_weighting": "velocity"}),
    ("policy", True, {"action_prediction": "x0", "x0_loss_weighting": "uniform", "action_loss": "l1"}),
    ("policy", True, {"action_loss": "l1", "goal_state_loss_weight": 3.0}),
])
@pytest.mark.parametrize("keyed", [False, True], ids=["generator_noise", "keyed_noise"])
def test_stacked_step_equals_the_per_sample_step(mode, with_state, diffusion, keyed, monkeypatch):
    """Samples of one shape take the stacked path (one merged pack, batched noising and losses): the
    same noise, losses and gradients as the per-sample path, which mixed batches still take. Also with
    the GPU's keyed noise (wamkit.diffusion.keyed_noise), forced here on the CPU."""
    from wamkit.diffusion import keyed_noise

    monkeypatch.setattr(keyed_noise, "use_keyed", lambda device: keyed)
    samples = [TrainingSample(**{**s.__dict__, "domain_id": 1}) for s in _samples(4, with_state=with_state)]
    results = []
    for stacked in (False, True):
        objective = _objective(mode, **diffusion)
        seen = _capture(objective.model)
        if not stacked:
            objective._uniform = lambda *_: False
        losses = objective(samples, _gens(4))
        losses.total.backward()
        grads = [p.grad.clone() for p in objective.model.parameters() if p.grad is not None]
        results.append((losses, grads, len(seen["vision_tokens"])))
    (plain, plain_grads, plain_items), (fast, fast_grads, fast_items) = results
    assert (plain_items, fast_items) == (4, 1)
    for name in ("total", "video", "action") + (("goal_state",) if plain.goal_state is not None else ()):
        torch.testing.assert_close(getattr(fast, name), getattr(plain, name), atol=1e-6, rtol=1e-5)
    assert len(fast_grads) == len(plain_grads) > 0
    for g_fast, g_plain in zip(fast_grads, plain_grads):
        torch.testing.assert_close(g_fast, g_plain, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("stacked", [False, True])
def test_independent_action_sigma_noises_the_chunk_at_its_own_level(stacked):
    """diffusion.action_sigma = "independent": each sample's action rows draw their own noise level right
    after the video's (from the sample's generator, shifted by action_shift), carry it as their timestep,
    and are noised and loss-weighted at it; the video keeps the level a shared run would draw."""
    samples = _samples(3)
    shared = _objective("policy", action_prediction="x0", x0_loss_weighting="velocity")
    indep = _objective("policy", action_prediction="x0", x0_loss_weighting="velocity", action_sigma="independent", action_shift=3.0)
    if not stacked:
        indep._uniform = shared._uniform = lambda *_: False
    seen_shared, seen = _capture(shared.model), _capture(indep.model)
    outputs = []
    indep.model.register_forward_hook(lambda _m, _a, out: outputs.append(out))
    shared(samples, _gens(3))
    losses = indep(samples, _gens(3))
    torch.testing.assert_close(seen["vision_timesteps"], seen_shared["vision_timesteps"])
    expected_sigmas, expected_action_sigmas = [], []
    for g in _gens(3):
        expected_sigmas.append(sample_sigmas(1, g, 1.0).item())  # DiffusionConfig's default shift 0 -> resolution shift
        expected_action_sigmas.append(sample_sigmas(1, g, 3.0).item())
    action_t = seen["action_timesteps"].view(3, T) / 1000.0  # state row clean: T noisy rows a sample
    assert torch.allclose(action_t, torch.tensor(expected_action_sigmas)[:, None].expand(3, T), atol=1e-5)
    video_t = torch.unique_consecutive(seen["vision_timesteps"]) / 1000.0
    assert not torch.allclose(video_t, action_t[:, 0], atol=1e-3)  # the two levels differ
    noisy = seen["action_tokens"]  # [rows, D] per sample, or one merged [B, rows, D] item
    noisy = torch.stack(list(noisy)) if len(noisy) == 3 else noisy[0]
    expected_loss = []
    for i, sample in enumerate(samples):
        s_a = float(action_t[i, 0])
        rows = _clean_rows(sample)
        assert torch.equal(noisy[i][0], rows[0])  # the state row stays clean
        residual = (noisy[i][1:] - (1 - s_a) * rows[1:]) * sample.action_mask  # = s_a * noise on the real channels
        assert float(residual.abs().max()) > 0
        pred = outputs[0].action[i].detach().float()[1:]
        err = (pred - rows[1:]).pow(2) * sample.action_mask
        expected_loss.append(err.sum() / (T * sample.action_mask.sum()) / max(s_a, 0.05) ** 2)
    assert float(losses.action) == pytest.approx(float(torch.stack(expected_loss).mean()), rel=1e-4)


def test_action_sigma_config_validation():
    base = ["data.path=\"x\""]
    with pytest.raises(ConfigError, match="action_sigma"):
        load_experiment(None, base + ['diffusion.action_sigma="per_row"'])
    with pytest.raises(ConfigError, match="action_shift"):
        load_experiment(None, base + ["diffusion.action_shift=-1.0"])
    assert load_experiment(None, base + ['diffusion.action_sigma="independent"']).diffusion.action_sigma == "independent"
