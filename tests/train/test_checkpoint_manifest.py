"""Checkpoints you can trust: every save records its files (names, sizes, xxh3 hashes) and every
load checks them, so a damaged checkpoint is one CheckpointError naming the checkpoint, the file,
what is wrong and the fix; a resume can go on from the newest intact one; nothing is deleted."""

import json
import shutil

import pytest
import torch

from tests.helpers import DEMO_RECIPE, quick_overrides, run_cli
from wamkit.config import load_experiment
from wamkit.errors import CheckpointError, ConfigError
from wamkit.train import checkpoint as ckpt
from wamkit.train.manifest import MANIFEST
from wamkit.train.trainer import Trainer

SHARD, META = "__0_0.distcp", ".metadata"


def _cfg(demo_root, out, name, max_iter, *extra):
    args = quick_overrides(demo_root, out, name, max_iter, 2) + [a for kv in extra for a in ("--set", kv)]
    return load_experiment(DEMO_RECIPE, [a for a in args if a != "--set"])


def _losses(run_dir):
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


@pytest.fixture(scope="module")
def trained(demo_root, tmp_path_factory):
    """A 4-step run with checkpoints at 2 and 4: its losses are those of an uninterrupted run."""
    out = tmp_path_factory.mktemp("manifest_runs")
    Trainer(_cfg(demo_root, out, "run", 4)).train()
    return out


def _copy(trained, tmp_path):
    """The 4-step run, copied under tmp_path as if it had been trained there."""
    run = tmp_path / "run"
    shutil.copytree(trained / "run", run)
    config = json.loads((run / "resolved_config.json").read_text())
    config["job"]["output_root"] = str(tmp_path)
    (run / "resolved_config.json").write_text(json.dumps(config))
    return run


def _flip(path, at=None):
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if at is None else at
    data[i:i + 8] = bytes(b ^ 0xFF for b in data[i:i + 8])
    path.write_bytes(bytes(data))


def _cut(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _from_iteration_2(path):  # a shard copied from another iteration: same size, other bytes
    shutil.copy(path.parents[1] / "iter_000000002" / path.name, path)


def _edit_manifest(path):  # a manifest that disagrees with the files, edited by hand (digest left stale)
    body = json.loads(path.read_text())
    body["files"][SHARD]["size"] += 1
    path.write_text(json.dumps(body))


DAMAGE = {  # name: (file, how, what the error says about it)
    "bytes flipped mid-shard": (SHARD, _flip, "content hash differs"),
    "shard cut short": (SHARD, _cut, "bytes, the manifest says"),
    "shard deleted": (SHARD, lambda p: p.unlink(), "missing"),
    "bytes flipped in .metadata": (META, _flip, "content hash differs"),
    "torn .metadata": (META, _cut, "bytes, the manifest says"),
    "shard from another iteration": (SHARD, _from_iteration_2, "content hash differs"),
    "manifest edited": (MANIFEST, _edit_manifest, "torn or altered"),
    "manifest deleted": (MANIFEST, lambda p: p.unlink(), "missing"),
    "completion marker deleted": (ckpt.COMPLETE_MARKER, lambda p: p.unlink(), "missing"),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_resuming_a_damaged_latest_checkpoint_names_the_file_and_the_way_back(kind, demo_root, trained, tmp_path):
    run = _copy(trained, tmp_path)
    file, damage, problem = DAMAGE[kind]
    damaged = run / "checkpoints" / "iter_000000004"
    damage(damaged / file)
    before = sorted((p.name, p.stat().st_size) for p in damaged.iterdir())
    with pytest.raises(CheckpointError) as err:
        Trainer(_cfg(demo_root, tmp_path, "run", 4))
    text = str(err.value)
    assert text.startswith(f"{damaged}: is damaged: {file}") and problem in text, text
    assert "iter_000000002" in err.value.fix and "--set checkpoint.resume_step=2" in err.value.fix, err.value.fix
    assert "Nothing was deleted" in err.value.fix
    assert sorted((p.name, p.stat().st_size) for p in damaged.iterdir()) == before  # nothing touched


@pytest.mark.parametrize("pointer", [None, "", "iter_0000000"])
def test_a_lost_or_torn_latest_pointer_is_damage_not_a_fresh_start(pointer, demo_root, trained, tmp_path):
    run = _copy(trained, tmp_path)
    latest = run / "checkpoints" / ckpt.LATEST
    latest.unlink() if pointer is None else latest.write_text(pointer)
    with pytest.raises(CheckpointError) as err:
        Trainer(_cfg(demo_root, tmp_path, "run", 4))
    assert "is damaged: latest: " in str(err.value) and "--set checkpoint.resume_step=4" in err.value.fix, str(err.value)
    assert "at step 4" in Trainer(_cfg(demo_root, tmp_path, "run", 4, "checkpoint.on_damage=previous")).resume_or_init()


def test_the_cli_prints_the_error_without_a_traceback_and_the_set_it_names_resumes(demo_root, trained, tmp_path):
    run = _copy(trained, tmp_path)
    _flip(run / "checkpoints" / "iter_000000004" / SHARD)
    args = ["train", str(DEMO_RECIPE), *quick_overrides(demo_root, tmp_path, "run", 4, 2)]
    failed = run_cli(args, check=False)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr
    assert f"iter_000000004: is damaged: {SHARD}: content hash differs" in failed.stderr
    resumed = run_cli(args + ["--set", "checkpoint.resume_step=2"])
    assert "at step 2" in resumed.stdout
    assert _losses(run) == _losses(trained / "run")  # steps 3 and 4 again, exactly as the uninterrupted run had them
    kept = run / "checkpoints" / "replaced_iter_000000004"  # the damaged one, moved aside by the new save of step 4
    assert kept.is_dir() and (kept / SHARD).read_bytes() != (run / "checkpoints" / "iter_000000004" / SHARD).read_bytes()
    stale = run_cli(args + ["--set", "checkpoint.resume_step=2"], check=False)
    assert stale.returncode == 2 and "remove --set checkpoint.resume_step=2" in stale.stderr, stale.stderr  # a relaunch never goes back


def test_on_damage_previous_resumes_from_the_newest_intact_one_and_reproduces_the_run(demo_root, trained, tmp_path, capsys):
    run = _copy(trained, tmp_path)
    _cut(run / "checkpoints" / "iter_000000004" / SHARD)
    summary = Trainer(_cfg(demo_root, tmp_path, "run", 4, "checkpoint.on_damage=previous")).train()
    out = capsys.readouterr().out
    assert "WARNING" in out and "resuming from iter_000000002 instead" in out and "resumed" in out and "at step 2" in out
    assert summary["step"] == 4 and _losses(run) == _losses(trained / "run")
    assert (run / "checkpoints" / "replaced_iter_000000004" / SHARD).is_file()


def test_size_mode_records_no_hashes_and_still_catches_a_cut_shard(demo_root, tmp_path):
    Trainer(_cfg(demo_root, tmp_path, "sized", 2, "checkpoint.verify=size")).train()
    iteration = tmp_path / "sized" / "checkpoints" / "iter_000000002"
    body = json.loads((iteration / MANIFEST).read_text())
    assert body["hash"] is None and all(set(e) == {"size"} for e in body["files"].values())
    _cut(iteration / SHARD)
    with pytest.raises(CheckpointError, match="bytes, the manifest says"):
        ckpt.load_checkpoint(iteration, {"x": torch.zeros(1)}, verify="hash")


def test_a_checkpoint_written_before_manifests_loads_with_a_note(demo_root, trained, tmp_path, capsys):
    run = _copy(trained, tmp_path)
    for iteration in (run / "checkpoints").glob("iter_*"):
        (iteration / MANIFEST).unlink()
        marker = json.loads((iteration / ckpt.COMPLETE_MARKER).read_text())
        marker.pop("manifest")
        (iteration / ckpt.COMPLETE_MARKER).write_text(json.dumps(marker))
    trainer = Trainer(_cfg(demo_root, tmp_path, "run", 4))
    assert "at step 4" in trainer.resume_or_init()
    notes = [line for line in capsys.readouterr().out.splitlines() if "cannot be verified" in line]
    assert len(notes) == 1 and "iter_000000004" in notes[0]
    from wamkit.policy import load_from_checkpoint

    assert load_from_checkpoint(run).source["step"] == 4  # serve / eval / export read it too


def _tiny_checkpoints(directory, steps):
    for step in steps:
        ckpt.save_checkpoint(directory, step, {"x": torch.full((64,), float(step))})


def test_keep_last_never_prunes_the_last_intact_one_nor_for_a_newer_damaged_one(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    _tiny_checkpoints(checkpoints, [1, 2])
    _cut(checkpoints / "iter_000000002" / SHARD)  # the newest is damaged
    ckpt.prune_checkpoints(checkpoints, keep_last=1)
    assert sorted(p.name for p in ckpt.iterations(checkpoints)) == ["iter_000000001", "iter_000000002"]

    # A run that resumed from 2 (past a damaged 4 and an intact 5) saves 3: neither newer one counts
    # or goes; of the older ones, those that fail the size check stay, the intact ones beyond
    # keep_last go (pruning stats files, it does not hash them: 0 goes although bytes changed).
    checkpoints = tmp_path / "resumed" / "checkpoints"
    _tiny_checkpoints(checkpoints, [0, 1, 2, 4, 5])
    _cut(checkpoints / "iter_000000004" / SHARD)
    _cut(checkpoints / "iter_000000001" / SHARD)
    _flip(checkpoints / "iter_000000000" / SHARD)
    _tiny_checkpoints(checkpoints, [3])
    ckpt.prune_checkpoints(checkpoints, keep_last=1)
    assert sorted(p.name for p in ckpt.iterations(checkpoints)) == ["iter_000000001", "iter_000000003", "iter_000000004", "iter_000000005"]


def test_an_export_records_its_files_and_serve_refuses_a_damaged_one(demo_root, trained, tmp_path):
    from wamkit.export import export_run
    from wamkit.policy.loading import load_from_export
    from wamkit.serve.server import load_policy  # what `wamkit serve` and `wamkit eval` load

    out = export_run(trained / "run", tmp_path / "export", device="cpu")
    files = json.loads((out / MANIFEST).read_text())["files"]
    weights = next(n for n in files if n.endswith(".safetensors"))
    assert {"wamkit.json", "transformer/config.json", weights} <= set(files)
    assert load_policy(out).loaded.contract["domain_id"] == load_from_export(out).contract["domain_id"]
    _flip(out / weights)
    for load in (load_from_export, load_policy):
        with pytest.raises(CheckpointError) as err:
            load(out)
        assert str(err.value).startswith(f"{out}: is damaged: {weights}: content hash differs") and "re-export" in err.value.fix


def test_a_damaged_checkpoint_named_for_serving_or_as_base_weights_is_refused(demo_root, trained, tmp_path):
    from wamkit.train.setup import load_base_weights, build_model

    run = _copy(trained, tmp_path)
    iteration = run / "checkpoints" / "iter_000000004"
    _flip(iteration / META, at=100)
    from wamkit.serve.server import load_policy

    with pytest.raises(CheckpointError, match=f"iter_000000004: is damaged: {META}"):
        load_policy(run)
    cfg = _cfg(demo_root, tmp_path, "fresh", 1, f'checkpoint.load_path="{iteration}"')
    with pytest.raises(CheckpointError, match=f"iter_000000004: is damaged: {META}"):
        load_base_weights(build_model(cfg, tokenizer_channels=12), cfg)


@pytest.mark.parametrize("knob, value", [("verify", '"sha256"'), ("on_damage", '"skip"'), ("resume_step", "-1")])
def test_the_new_knobs_refuse_values_they_cannot_honour(knob, value):
    with pytest.raises(ConfigError, match=f"checkpoint.{knob}"):
        load_experiment(DEMO_RECIPE, [f"checkpoint.{knob}={value}"])
