"""Evaluation of the block-causal sim-bimanual stages: chunk-by-chunk sampling is the distillation's own
rollout, bundle episodes are read as training reads them, and a student export evaluates exactly as its run."""

import json

import numpy as np
import pytest
import torch

from tests.bimanual.tiny import recipe, tiny_overrides
from wamkit.bimanual import write_synthetic_bundle
from wamkit.bimanual.bundle import BundleTransform, BundleWindows, open_bundle
from wamkit.config import load_experiment
from wamkit.diffusion.chunked import chunk_ids, chunk_step
from wamkit.distill import DistillTrainer, export_student, load_distill_recipe
from wamkit.train.trainer import Trainer
from wamkit.worldmodel.chunked import sample_video_chunked
from wamkit.worldmodel.report import eval_wm_main
from wamkit.worldmodel.rollout import BundleEpisodes, WorldModel


def test_chunk_cut_and_step_rules():
    assert chunk_ids(5, 2) == [0, 1, 1, 2, 2] and chunk_ids(4, 1) == [0, 1, 2, 3]
    x, v = torch.ones(2, 3), torch.full((2, 3), 0.5)
    assert torch.equal(chunk_step("euler", x, v, 0.8, 0.3), x - 0.25)
    assert torch.equal(chunk_step("consistency", x, v, 0.8, 0.0), x - 0.4)  # the last step lands on x0
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    expected = 0.5 * torch.randn((2, 3), generator=g2) + 0.5 * (x - 0.4)
    assert torch.allclose(chunk_step("consistency", x, v, 0.8, 0.5, g1), expected)
    with pytest.raises(ValueError):
        chunk_step("heun", x, v, 0.8, 0.5)


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """Synthetic bundle -> stage 0 -> stage 1 -> stage 2 (one step each): a saved distilled student."""
    tmp = tmp_path_factory.mktemp("wm_chunked")
    bundle = write_synthetic_bundle(tmp / "bundle", samples=8)
    runs = tmp / "runs"
    s0 = Trainer(load_experiment(recipe(0), tiny_overrides(bundle, runs, "w-stage0", 1, chunk_frames=0))).train()
    s1 = Trainer(load_experiment(recipe(1), tiny_overrides(bundle, runs, "w-stage1", 1, s0["latest_checkpoint"]))).train()
    stage1 = s1["latest_checkpoint"]
    cfg2, d2 = load_distill_recipe(recipe(2), tiny_overrides(bundle, runs, "w-stage2", 1, stage1,
                                                               extra={"distill.teacher_path": f'"{stage1}"'}))
    trainer = DistillTrainer(cfg2, d2)
    trainer.train()
    return {"bundle": bundle, "runs": runs, "trainer": trainer, "tmp": tmp}


def test_chunked_sampling_is_the_distillation_rollout(chain):
    """With every chunk leaving at the ladder's last step, SF-DMD's rollout and evaluation's sampler draw
    the same noise in the same order and must produce the same video."""
    trainer = chain["trainer"]
    trainer.exit_step = lambda chunk: len(trainer.student_sigmas) - 2
    data = trainer.data.samples("train", trainer.cfg)
    samples = [data[0], data[1]]
    latents = [trainer.video_tokenizer.encode(s.video.unsqueeze(0))[0].float() for s in samples]
    with torch.no_grad():
        rolled = trainer.rollout(samples, latents, [torch.Generator().manual_seed(i) for i in range(2)], with_grad=False)
    expected = trainer.video_tokenizer.decode(torch.stack(rolled))
    prompts = [trainer.cfg.data.prompt_template.format(task=s.task) for s in samples]
    video = sample_video_chunked(
        trainer.student, trainer.procs["student"], trainer.video_tokenizer, trainer.text_tokenizer,
        torch.stack([s.video[0] for s in samples]), torch.stack([s.actions for s in samples]), trainer.student_sigmas,
        trainer.chunk_frames, "consistency", [torch.Generator().manual_seed(i) for i in range(2)], trainer.fps, prompts)
    assert video.shape == expected.shape and (video.int() - expected.int()).abs().max() <= 1


def test_bundle_episode_is_what_training_reads(chain):
    episodes = BundleEpisodes(chain["bundle"])
    bundle = open_bundle(chain["bundle"])
    window = BundleWindows(bundle, "train")[0]
    ep = episodes.load(episodes.number(window.episode_id))
    assert ep.task == window.caption and len(ep.actions) == len(ep.frames) - 1
    assert torch.equal(ep.frames[: len(window.video)], window.video)
    wm = WorldModel.from_path(chain["runs"] / "w-stage2")
    sample = BundleTransform(bundle)(window)
    normalized = wm.normalize_actions(ep.actions[: len(window.actions)])
    assert torch.allclose(normalized, sample.actions, atol=1e-6)


def test_student_export_evaluates_as_its_run(chain):
    run = chain["runs"] / "w-stage2"
    wm = WorldModel.from_path(run)
    assert wm.chunk_frames == 1 and wm.solver == "consistency" and wm.student_sigmas == chain["trainer"].student_sigmas
    out_run, out_export = chain["tmp"] / "eval_run", chain["tmp"] / "eval_export"
    export = export_student(run, chain["tmp"] / "export")
    for path, out in ((run, out_run), (export, out_export)):
        assert eval_wm_main(path, episodes="held_out", modes=["autoregressive"], out_dir=out, probes=False) == 0
    a, b = (json.loads((o / "report.json").read_text()) for o in (out_run, out_export))
    assert a["episodes"] == b["episodes"] and a["episodes"]
    assert a["settings"]["student_sigmas"] == b["settings"]["student_sigmas"] == wm.student_sigmas
    ra, rb = a["results"]["autoregressive"]["model"], b["results"]["autoregressive"]["model"]
    assert np.isclose(ra["psnr"], rb["psnr"], atol=1e-6) and np.isclose(ra["ssim"], rb["ssim"], atol=1e-8)


def test_chunked_sampling_runs_text_once_per_chunk_or_reuses_it(chain):
    """The text pathway runs in the first step of each chunk (`cache_text`), or in no step of a later
    call with the same prompts (`reuse_text_kv`); every variant equals the plain sampler that runs the
    whole sequence at every step."""
    trainer = chain["trainer"]
    model, processor = trainer.student, trainer.procs["student"]
    data = trainer.data.samples("train", trainer.cfg)
    samples = [data[0], data[1]]
    frames, actions = torch.stack([s.video[0] for s in samples]), torch.stack([s.actions for s in samples])
    prompts = [trainer.cfg.data.prompt_template.format(task=s.task) for s in samples]
    und_lens, real_forward = [], model.forward

    def spy(**kw):
        und_lens.append(kw["und_len"])
        return real_forward(**kw)

    def run(**kw):
        und_lens.clear()
        video = sample_video_chunked(model, processor, trainer.video_tokenizer, trainer.text_tokenizer, frames, actions,
                                     trainer.student_sigmas, trainer.chunk_frames, "consistency",
                                     [torch.Generator().manual_seed(i) for i in range(2)], trainer.fps, prompts, **kw)
        return video, list(und_lens)

    model.forward = spy
    try:
        plain, plain_lens = run(cache_text=False)
        cached, cached_lens = run()
        _, first_lens = run(reuse_text_kv=True)
        reused, reused_lens = run(reuse_text_kv=True)
    finally:
        del model.forward
    steps = len(trainer.student_sigmas) - 1
    chunks = len(plain_lens) // steps
    assert chunks >= 2 and all(n > 0 for n in plain_lens)
    assert cached_lens == ([plain_lens[0]] + [0] * (steps - 1)) * chunks
    assert first_lens[0] > 0 and first_lens[1:] == [0] * (len(first_lens) - 1)
    assert reused_lens == [0] * len(plain_lens)
    for video in (cached, reused):
        assert (video.int() - plain.int()).abs().max() <= 1
