"""`wamkit train --dry-run` checks every input at once (wamkit.train.preflight)."""

from __future__ import annotations

from pathlib import Path

import pytest

from wamkit.cli import main

ROOT = Path(__file__).resolve().parents[2]
G1 = str(ROOT / "recipes" / "g1_simple.toml")
TINY = ["--set", "model.preset=tiny"]  # the checks do not depend on the width; a tiny meta build is faster


def _errors(capsys) -> tuple[str, list[str]]:
    out, err = capsys.readouterr()
    return out, [line for line in err.splitlines() if not line.startswith("  ")]


def test_unset_variables_are_all_reported(monkeypatch, capsys, tmp_path):
    for var in ("SIMPLE_ROOT", "DATASET_PATH", "BASE_CHECKPOINT_PATH", "WAN_VAE_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WAMKIT_OUTPUT_ROOT", str(tmp_path))
    assert main(["train", G1, "--dry-run", *TINY]) == 2
    out, errors = _errors(capsys)
    assert [e.split(":")[1].strip() for e in errors] == ["data.path", "checkpoint.load_path", "model.vae_path"]
    assert all(e.startswith("error: ") for e in errors)
    assert "3 problems would stop the run" in out


def test_missing_paths_are_all_reported_with_their_values_expanded(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SIMPLE_ROOT", str(tmp_path / "no_data"))
    monkeypatch.setenv("BASE_CHECKPOINT_PATH", str(tmp_path / "no_base"))
    monkeypatch.setenv("WAN_VAE_PATH", str(tmp_path))  # exists, but is no VAE directory
    monkeypatch.setenv("WAMKIT_OUTPUT_ROOT", str(tmp_path))
    assert main(["train", G1, "--dry-run", *TINY]) == 2
    out, errors = _errors(capsys)
    assert len(errors) == 3
    assert "does not exist" in errors[0] and "does not exist" in errors[1] and "config.json" in errors[2]
    assert f'vae_path = "{tmp_path}"' in out and "${" not in out.split("# model")[0]  # the resolved config is expanded


def test_every_input_in_place_exits_zero(monkeypatch, capsys, tmp_path):
    from wamkit.sim.schema_synth import write_schema_dataset

    data = write_schema_dataset("g1_simple", tmp_path / "data", 2)
    monkeypatch.setenv("WAMKIT_OUTPUT_ROOT", str(tmp_path / "runs"))
    assert main(["train", str(ROOT / "recipes/tiny/g1_simple.toml"), "--dry-run", "--set", f"data.path={str(data)!r}"]) == 0
    out, errors = _errors(capsys)
    assert errors == [] and "every input is in place" in out
    assert "ok    dataset: " in out and "36-D" in out


def test_dataset_keys_keep_ranges_and_output_root(monkeypatch, capsys, tmp_path):
    from wamkit.sim.schema_synth import write_schema_dataset

    data = write_schema_dataset("g1_simple", tmp_path / "data", 2)
    (data / "meta" / "stats.json").unlink()
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        code = main(["train", str(ROOT / "recipes/tiny/g1_simple.toml"), "--dry-run", "--set", f"data.path={str(data)!r}",
                     "--set", f"data.keep_ranges_path={str(tmp_path / 'ranges.json')!r}",
                     "--set", f"job.output_root={str(locked)!r}"])
    finally:
        locked.chmod(0o700)
    assert code == 2
    _, errors = _errors(capsys)
    where = " ".join(errors)
    assert "stats.json" in where and "keep_ranges_path" in where
    import os

    if os.geteuid() != 0:  # root writes anywhere
        assert "job.output_root" in where


def test_base_checkpoint_of_another_shape_is_reported(monkeypatch, capsys, tmp_path):
    import torch
    from safetensors.torch import save_file

    from wamkit.sim.schema_synth import write_schema_dataset

    data = write_schema_dataset("g1_simple", tmp_path / "data", 2)
    save_file({"proj_in.weight": torch.zeros(2, 2)}, str(tmp_path / "base.safetensors"))
    monkeypatch.setenv("WAMKIT_OUTPUT_ROOT", str(tmp_path / "runs"))
    code = main(["train", str(ROOT / "recipes/tiny/g1_simple.toml"), "--dry-run", "--set", f"data.path={str(data)!r}",
                 "--set", f"checkpoint.load_path={str(tmp_path / 'base.safetensors')!r}"])
    assert code == 2
    _, errors = _errors(capsys)
    assert len(errors) == 1 and "base.safetensors: keys do not match the model" in errors[0]


@pytest.mark.parametrize("flag", ["--help"])
def test_dry_run_is_documented(flag, capsys):
    with pytest.raises(SystemExit):
        main(["train", flag])
    assert "every input" in capsys.readouterr().out


def test_distill_dry_run_checks_the_frozen_models(monkeypatch, capsys, tmp_path):
    from tests.bimanual.tiny import recipe, tiny_overrides
    from wamkit.bimanual import write_synthetic_bundle

    bundle = write_synthetic_bundle(tmp_path / "bundle", samples=4, chunk_length=8)
    stage1 = tmp_path / "runs" / "s1" / "checkpoints" / "iter_000000002"
    stage1.mkdir(parents=True)  # there, but never completed
    sets = tiny_overrides(bundle, tmp_path / "runs", "s2", 2, load_path=str(tmp_path / "nope"),
                          extra={"distill.teacher_path": f'"{stage1}"'})
    argv = ["distill", str(recipe(2)), "--dry-run"] + [a for s in sets for a in ("--set", s)]
    assert main(argv) == 2
    out, errors = _errors(capsys)
    assert [e.split(":")[1].strip() for e in errors] == ["checkpoint.load_path", "distill.teacher_path"], out
    assert "no COMPLETE marker" in errors[1] or "not a completed" in errors[1]
