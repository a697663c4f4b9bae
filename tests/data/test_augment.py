"""data.random_shift_px: each training clip moved by its own offset (edges repeated), the same for all its
frames, drawn from the sample's generator; nothing drawn and nothing moved at 0; refused with a latent cache;
named when several cameras share the canvas (their seams are crossed)."""

import pytest
import torch

from tests.helpers import DEMO_RECIPE
from wamkit.config import load_experiment
from wamkit.config.schema import DiffusionConfig
from wamkit.data.augment import draw_shifts, seam_note, shift_clips
from wamkit.data.sample import TrainingSample
from wamkit.diffusion.objective import ModeObjective
from wamkit.errors import ConfigError
from wamkit.model.cosmos3 import build_transformer
from wamkit.model.tokenizer import build_text_tokenizer, build_video_tokenizer


def _reference_shift(clip: torch.Tensor, dy: int, dx: int, pad: int) -> torch.Tensor:
    """Replicate-pad by `pad` and crop H x W at (pad + dy, pad + dx): the textbook random shift."""
    _, height, width, _ = clip.shape
    padded = torch.nn.functional.pad(clip.permute(0, 3, 1, 2).float(), (pad, pad, pad, pad), mode="replicate")
    crop = padded[:, :, pad + dy:pad + dy + height, pad + dx:pad + dx + width]
    return crop.permute(0, 2, 3, 1).to(clip.dtype)


def test_shift_equals_a_replicate_pad_and_crop_and_moves_every_frame_alike():
    g = torch.Generator().manual_seed(0)
    clips = torch.randint(0, 256, (5, 3, 12, 16, 3), generator=g, dtype=torch.uint8)
    shifts = torch.tensor([[0, 0], [4, -4], [-3, 2], [1, 4], [-4, -1]])
    out = shift_clips(clips, shifts)
    assert out.shape == clips.shape and out.dtype == torch.uint8
    assert torch.equal(out[0], clips[0])  # offset (0, 0): untouched
    for b, (dy, dx) in enumerate(shifts.tolist()):
        assert torch.equal(out[b], _reference_shift(clips[b], dy, dx, pad=4)), (dy, dx)
    assert torch.equal(out[1, :, :8, 4:], clips[1, :, 4:, :12])  # content moved up by 4 and right by 4 (dx = -4)


def test_offsets_come_from_each_samples_generator_within_the_bound():
    gens = [torch.Generator().manual_seed(s) for s in range(200)]
    shifts = draw_shifts(3, gens)
    assert shifts.shape == (200, 2) and int(shifts.min()) == -3 and int(shifts.max()) == 3
    again = draw_shifts(3, [torch.Generator().manual_seed(s) for s in range(200)])
    assert torch.equal(shifts, again)


def _objective(random_shift_px: int) -> ModeObjective:
    torch.manual_seed(0)
    video_tok = build_video_tokenizer("pixel", "", 8)
    model = build_transformer("tiny", video_tok.latent_channels, 8, 4)
    return ModeObjective(model, video_tok, build_text_tokenizer("", 32), DiffusionConfig(), "{task}", 10.0, "sdpa",
                         random_shift_px=random_shift_px)


def _samples(n: int) -> list[TrainingSample]:
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(8, dtype=torch.bool)
    return [TrainingSample(video=torch.randint(0, 256, (9, 32, 32, 3), generator=g, dtype=torch.uint8),
                           actions=torch.rand(8, 8, generator=g), state=torch.rand(8, generator=g), action_mask=mask,
                           task="reach", domain_id=0) for _ in range(n)]


def test_a_training_step_encodes_the_shifted_clips_and_probes_do_not():
    samples = _samples(3)
    objective = _objective(4)
    seen = {}
    objective.model.register_forward_pre_hook(lambda _m, _a, kw: seen.update(kw), with_kwargs=True)
    objective(samples, [torch.Generator().manual_seed(10 + i) for i in range(3)])
    shifts = draw_shifts(4, [torch.Generator().manual_seed(10 + i) for i in range(3)])
    assert shifts.abs().sum() > 0
    expected = objective.encode_videos([s.video for s in samples], shifts)
    unshifted = objective.latents_of(samples)  # no generators (memory probes, bundle checks): no shift
    # the items' latent frames one after another (a merged pack is one item of every sample's frames);
    # frame 0 of each sample is clean, so it is the encoding itself
    fed = torch.cat([item[0] for item in seen["vision_tokens"]], dim=1)
    t = expected[0].shape[1]
    for b in range(3):
        torch.testing.assert_close(fed[:, b * t], expected[b][:, 0])
        assert not torch.equal(fed[:, b * t], unshifted[b][:, 0])


def test_no_shift_draws_nothing():
    samples = _samples(2)
    gens = [torch.Generator().manual_seed(5), torch.Generator().manual_seed(6)]
    _objective(0).latents_of(samples, gens)
    assert [torch.rand(1, generator=g).item() for g in gens] == \
        [torch.rand(1, generator=torch.Generator().manual_seed(s)).item() for s in (5, 6)]


def test_config_errors():
    base = ['data.path="x"']
    with pytest.raises(ConfigError, match="data.random_shift_px.*negative"):
        load_experiment(None, base + ["data.random_shift_px=-1"])
    with pytest.raises(ConfigError, match="latent_cache"):
        load_experiment(None, base + ["data.random_shift_px=4", 'data.latent_cache="/tmp/cache"'])
    assert load_experiment(None, base + ["data.random_shift_px=4"]).data.random_shift_px == 4


def test_a_shift_of_several_cameras_says_that_views_cross_their_seams(tmp_path, capsys):
    """The canvas is shifted as one image: with two cameras side by side, pixels of one cross into the
    other, which opening the run's data says; one camera, or no shift, says nothing."""
    from wamkit.sim.record import record
    from wamkit.train.datasets import build_run_data

    assert seam_note(4, 1) is None and seam_note(0, 3) is None
    record("metaworld/reach-v3", 1, tmp_path / "two", resolution=32, camera="corner,topview")
    for px, said in ((2, True), (0, False)):
        build_run_data(load_experiment(DEMO_RECIPE, [f'data.path="{tmp_path / "two"}"', "data.generate_demo=false",
                                                     f"data.random_shift_px={px}", "data.val_fraction=0.0"]))
        out = capsys.readouterr().out
        assert ("random_shift_px = 2 shifts the canvas of 2 cameras" in out) == said, out
