"""torchrun with 2 gloo processes (FSDP2 on CPU) trains exactly like one process with the same
global batch, and its sharded checkpoint resumes in one process."""

import json

import torch

from tests.helpers import DEMO_RECIPE, quick_overrides, run_cli, run_torchrun, train_in_process
from wamkit.train.checkpoint import load_checkpoint
from wamkit.train.setup import build_model
from wamkit.config import load_experiment


def _losses(run_dir):
    return [json.loads(l)["loss"] for l in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in l]


def _model_state(cfg_args, checkpoint):
    cfg = load_experiment(DEMO_RECIPE, [a for a in cfg_args if a != "--set"])
    model = build_model(cfg, tokenizer_channels=12)
    state = {"model": model.state_dict()}
    load_checkpoint(checkpoint, state)
    return state["model"]


def _assert_two_ranks_equal_one(tmp_path, two, one) -> dict:
    """Runs "two" (2 ranks) and "one" (1 process): the same losses, and the same weights at step 4;
    returns the one-process weights."""
    torch.testing.assert_close(torch.tensor(_losses(tmp_path / "two")), torch.tensor(_losses(tmp_path / "one")), rtol=1e-4, atol=1e-5)
    sharded = _model_state(two, tmp_path / "two" / "checkpoints" / "iter_000000004")
    single = _model_state(one, tmp_path / "one" / "checkpoints" / "iter_000000004")
    for key in single:
        torch.testing.assert_close(sharded[key], single[key], rtol=1e-4, atol=1e-5)
    return single


def test_two_process_fsdp_matches_one_process_and_resumes_in_one(demo_root, tmp_path):
    two = quick_overrides(demo_root, tmp_path, "two", 4, 2) + ["--set", "trainer.samples_per_step=2"]
    one = quick_overrides(demo_root, tmp_path, "one", 4, 2) + ["--set", "trainer.samples_per_step=4"]
    out = run_torchrun(["train", str(DEMO_RECIPE), *two])
    assert "world size 2, global batch 4" in out.stdout
    train_in_process([str(DEMO_RECIPE), *one])
    _assert_two_ranks_equal_one(tmp_path, two, one)

    resumed = run_cli(["train", str(DEMO_RECIPE), *two, "--set", "trainer.max_iter=6"])
    assert "resumed" in resumed.stdout and "at step 4" in resumed.stdout and "world size 1" in resumed.stdout
    losses = _losses(tmp_path / "two")
    assert len(losses) == 6 and all(map(lambda v: v == v, losses))


def test_replicated_frozen_weights_and_prefetch_train_like_one_process(demo_root, tmp_path):
    """parallel.replicate_frozen keeps the frozen text pathway out of FSDP (plain tensors on every
    rank) and prefetch_layers reorders the all-gathers: neither may change the numbers, and the
    checkpoint still loads in one process."""
    knobs = ["--set", "parallel.replicate_frozen=true", "--set", "parallel.prefetch_layers=1"]
    two = quick_overrides(demo_root, tmp_path, "two", 4, 2) + ["--set", "trainer.samples_per_step=2", *knobs]
    one = quick_overrides(demo_root, tmp_path, "one", 4, 2) + ["--set", "trainer.samples_per_step=4"]
    run_torchrun(["train", str(DEMO_RECIPE), *two])
    train_in_process([str(DEMO_RECIPE), *one])
    single = _assert_two_ranks_equal_one(tmp_path, two, one)
    assert [k for k in single if "und" in k or "embed_tokens" in k], "the demo model has no frozen text-pathway weights to replicate"


def test_lora_under_fsdp_trains_like_one_process_resumes_and_exports(demo_root, tmp_path):
    """peft LoRA adapters (and the unfrozen action pathway) sharded by FSDP2 across 2 gloo processes:
    same losses as one process, the sharded checkpoint resumes in one process and exports merged."""
    lora = ["--set", "lora.enabled=true"]
    two = quick_overrides(demo_root, tmp_path, "two", 4, 2) + ["--set", "trainer.samples_per_step=2", *lora]
    one = quick_overrides(demo_root, tmp_path, "one", 4, 2) + ["--set", "trainer.samples_per_step=4", *lora]
    run_torchrun(["train", str(DEMO_RECIPE), *two])
    train_in_process([str(DEMO_RECIPE), *one])
    torch.testing.assert_close(torch.tensor(_losses(tmp_path / "two")), torch.tensor(_losses(tmp_path / "one")), rtol=1e-4, atol=1e-5)
    resumed = run_cli(["train", str(DEMO_RECIPE), *two, "--set", "trainer.max_iter=6"])
    assert "at step 4" in resumed.stdout and "world size 1" in resumed.stdout
    run_cli(["export", str(tmp_path / "two"), str(tmp_path / "export")])
    from wamkit.policy.loading import load_from_export

    exported = load_from_export(tmp_path / "export").model.state_dict()
    assert exported and not any("lora" in key for key in exported)  # adapters merged into plain weights


def test_meta_init_materialises_shards_like_one_process(demo_root, tmp_path):
    """parallel.init = "meta": each of 2 gloo ranks fills only its shards (base weights read as row
    slices, random values keyed by name, LoRA adapters on top); the run trains exactly like one
    process materialising the whole model, and its checkpoint resumes in one process."""
    from wamkit.model.cosmos3 import build_transformer

    torch.manual_seed(1)
    build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=32).save_pretrained(tmp_path / "base" / "transformer")
    knobs = ["--set", "parallel.init=\"meta\"", "--set", "lora.enabled=true", "--set", f'checkpoint.load_path="{tmp_path / "base"}"',
             "--set", 'model.text_tokenizer_path="byte"']  # the random base ships no tokenizer
    two = quick_overrides(demo_root, tmp_path, "two", 4, 2) + ["--set", "trainer.samples_per_step=2", *knobs]
    one = quick_overrides(demo_root, tmp_path, "one", 4, 2) + ["--set", "trainer.samples_per_step=4", *knobs]
    out = run_torchrun(["train", str(DEMO_RECIPE), *two])
    assert "fresh run from base weights (diffusers transformer)" in out.stdout
    train_in_process([str(DEMO_RECIPE), *one])
    torch.testing.assert_close(torch.tensor(_losses(tmp_path / "two")), torch.tensor(_losses(tmp_path / "one")), rtol=1e-4, atol=1e-5)
    resumed = run_cli(["train", str(DEMO_RECIPE), *two, "--set", "trainer.max_iter=6"])
    assert "at step 4" in resumed.stdout and "world size 1" in resumed.stdout


def test_mixed_modes_average_over_every_ranks_samples(demo_root, tmp_path):
    """model.mode = "mixed": a rank may draw only inverse-dynamics samples (no noisy video) while the
    other draws policy ones. The video loss is the mean over all ranks' samples with noisy video, as in
    one process, not the mean of per-rank means (an all-reduce of the counts). With the goal head
    (diffusion.goal_state_loss_weight), whose loss counts the samples with noisy action rows the same way
    and whose weights live in the root's FSDP2 group (computed by a hook inside the forward)."""
    mixed = ["--set", 'model.mode="mixed"', "--set", "model.mode_weights.inverse_dynamics=1.0",
             "--set", "diffusion.goal_state_loss_weight=2.0"]
    two = quick_overrides(demo_root, tmp_path, "two", 4, 4) + ["--set", "trainer.samples_per_step=2", *mixed]
    one = quick_overrides(demo_root, tmp_path, "one", 4, 4) + ["--set", "trainer.samples_per_step=4", *mixed]
    run_torchrun(["train", str(DEMO_RECIPE), *two])
    train_in_process([str(DEMO_RECIPE), *one])
    _assert_two_ranks_equal_one(tmp_path, two, one)


def test_two_process_checkpoints_record_every_rank_and_a_damaged_rank_shard_is_found(demo_root, tmp_path):
    """Each rank hashes its own shards into the manifest; on a 2-process resume every rank checks its
    share of the files and both fall back together (on_damage = previous) to the previous intact
    checkpoint, reproducing the run; one process names the damaged shard of rank 1."""
    import pytest

    from wamkit.errors import CheckpointError
    from wamkit.train.manifest import MANIFEST

    two = quick_overrides(demo_root, tmp_path, "two", 4, 2) + ["--set", "trainer.samples_per_step=2"]
    run_torchrun(["train", str(DEMO_RECIPE), *two])
    losses = _losses(tmp_path / "two")
    damaged = tmp_path / "two" / "checkpoints" / "iter_000000004"
    files = json.loads((damaged / MANIFEST).read_text())["files"]
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "wamkit_complete.json"} <= set(files)
    shard = damaged / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match="iter_000000004: is damaged: __1_0.distcp: is"):
        _model_state(two, damaged)
    out = run_torchrun(["train", str(DEMO_RECIPE), *two, "--set", "checkpoint.on_damage=previous"])
    assert out.stdout.count("resuming from iter_000000002 instead") == 1 and "at step 2" in out.stdout
    torch.testing.assert_close(torch.tensor(_losses(tmp_path / "two")), torch.tensor(losses), rtol=1e-4, atol=1e-5)
    assert (tmp_path / "two" / "checkpoints" / "replaced_iter_000000004" / "__1_0.distcp").stat().st_size == files["__1_0.distcp"]["size"] - 10
