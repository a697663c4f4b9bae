"""Each seed recipe runs end to end at tiny scale on a dataset with its exact schema, and the
full-size recipe resolves (dry run) without data, naming every missing input."""

import json

import pytest

from tests.helpers import REPO, run_cli
from wamkit.config import load_experiment
from wamkit.data import LeRobotV3Dataset
from wamkit.sim.schema_synth import SCHEMAS, write_schema_dataset

CASES = {"g1_simple": "g1_simple", "so101_fd_chunk16": "so101", "droid": "droid"}


@pytest.mark.parametrize("recipe,schema", sorted(CASES.items()))
def test_tiny_variant_trains_resumes_and_keeps_the_full_recipe_schema(recipe, schema, tmp_path):
    data = write_schema_dataset(schema, tmp_path / schema, episodes=4)
    ds = LeRobotV3Dataset(data / "success" if (data / "success").is_dir() else data)
    full = load_experiment(REPO / "recipes" / f"{recipe}.toml")
    tiny = load_experiment(REPO / "recipes" / "tiny" / f"{recipe}.toml")
    assert ds.fps == full.data.fps == tiny.data.fps
    assert ds.feature_dim("action") == len(SCHEMAS[schema].action_names) <= full.model.max_action_dim
    for knob in ("chunk_length", "normalization", "use_state", "domain_id"):
        assert getattr(tiny.data, knob) == getattr(full.data, knob)
    assert (tiny.model.mode, tiny.lora.enabled) == (full.model.mode, full.lora.enabled)

    args = ["train", str(REPO / "recipes" / "tiny" / f"{recipe}.toml"), "--set", f'data.path="{data}"', "--set", f'job.output_root="{tmp_path}"']
    run_cli(args + ["--set", "trainer.max_iter=2"])
    resumed = run_cli(args)
    assert "resumed" in resumed.stdout and "at step 2" in resumed.stdout
    records = [json.loads(l) for l in (tmp_path / full.job.name / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4]
    assert any("val_loss" in r for r in records)


@pytest.mark.parametrize("recipe", sorted(CASES))
def test_full_recipe_dry_run_without_data(recipe):
    proc = run_cli(["train", str(REPO / "recipes" / f"{recipe}.toml"), "--dry-run"], check=False)
    assert proc.returncode == 2 and "data.path" in proc.stderr  # the shapes still print; the missing inputs are named
    assert "preset = nano" in proc.stdout and "global batch" in proc.stdout and "memory per GPU" in proc.stdout
    canvas = {  # the reference's buckets: DROID's concat 4:3 at 480 (736x544 WxH), a 16:9 camera at 256
        "droid": ("canvas 544x736", "video 3519 (9 latent frames x 391 patches)"),
        "g1_simple": ("canvas 192x320", "video 540 (9 latent frames x 60 patches)"),
    }.get(recipe, ())
    assert all(line in proc.stdout for line in canvas), proc.stdout
    assert "8 GPUs:" in proc.stdout


def test_droid_rules(tmp_path):
    from wamkit.errors import ConfigError, DataError

    recipe = REPO / "recipes" / "droid.toml"
    with pytest.raises(ConfigError, match="joint_pos"):
        load_experiment(recipe, ["data.action_space=cartesian_velocity"])
    data = write_schema_dataset("droid", tmp_path / "droid", episodes=4)
    args = ["train", str(REPO / "recipes" / "tiny" / "droid.toml"), "--set", f'data.path="{data}"', "--set", f'job.output_root="{tmp_path}"']
    missing = run_cli(args + ["--set", f'data.keep_ranges_path="{tmp_path / "nope.json"}"'], check=False)
    assert missing.returncode == 2 and "nope.json" in missing.stderr
    dry = run_cli(args + ["--dry-run"])
    assert "canvas 96x112" in dry.stdout  # wrist 64x112 on top, two exteriors at half size below
