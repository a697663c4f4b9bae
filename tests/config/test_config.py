import pytest

from tests.helpers import DEMO_RECIPE, run_cli
from wamkit.config import load_experiment
from wamkit.errors import ConfigError


def test_overrides_are_typed_and_applied_in_order():
    cfg = load_experiment(DEMO_RECIPE, ["trainer.max_iter=7", "scheduler.warm_up_steps=[3]", "trainer.max_iter=9", "job.name=abc"])
    assert cfg.trainer.max_iter == 9
    assert cfg.scheduler.warm_up_steps == [3]
    assert cfg.job.name == "abc"


def test_unknown_key_names_the_nearest_valid_key():
    with pytest.raises(ConfigError) as err:
        load_experiment(DEMO_RECIPE, ["trainer.max_iters=5"])
    assert "trainer.max_iters" in str(err.value) and "did you mean trainer.max_iter" in str(err.value)


def test_unknown_key_in_recipe_file_is_rejected(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('[optimizer]\nlearning_rate = 0.1\n[data]\npath = "x"\n')
    with pytest.raises(ConfigError, match="optimizer.learning_rate.*unknown key"):
        load_experiment(recipe)


def test_wrong_type_and_bad_values_are_rejected():
    with pytest.raises(ConfigError, match="expected an integer"):
        load_experiment(DEMO_RECIPE, ["trainer.max_iter=many"])
    with pytest.raises(ConfigError, match="multiple of 4"):
        load_experiment(DEMO_RECIPE, ["data.chunk_length=10"])
    with pytest.raises(ConfigError, match="data.normalization"):
        load_experiment(DEMO_RECIPE, ["data.normalization=zscore"])


def test_cli_reports_config_errors_without_traceback():
    proc = run_cli(["train", str(DEMO_RECIPE), "--set", "model.presett=tiny", "--dry-run"], check=False)
    assert proc.returncode == 2
    assert "did you mean model.preset" in proc.stderr and "Traceback" not in proc.stderr


def test_dry_run_prints_resolved_config_and_token_counts(demo_root):
    proc = run_cli(["train", str(DEMO_RECIPE), "--dry-run", "--set", f'data.path="{demo_root}"'])
    assert "[trainer]" in proc.stdout and "max_iter = 400" in proc.stdout
    assert "video 48 (3 latent frames x 16 patches) + action 9 (8 actions + 1 state row)" in proc.stdout
    assert "parameters: total" in proc.stdout


def test_dry_run_of_nano_preset_counts_real_parameters_without_memory(demo_root):
    proc = run_cli(["train", str(DEMO_RECIPE), "--dry-run", "--set", f'data.path="{demo_root}"', "--set", "model.preset=nano", "--set", "model.max_action_dim=36"])
    line = next(l for l in proc.stdout.splitlines() if l.startswith("parameters:"))
    total = int(line.split("total ")[1].split()[0].replace(",", ""))
    assert 15.0e9 < total < 15.6e9  # Cosmos3-Nano: 15.2 B with both pathways


def test_recipe_extends_overlays_a_parent(tmp_path):
    (tmp_path / "full.toml").write_text('[data]\npath = "x"\nchunk_length = 32\nfps = 50.0\n[trainer]\nmax_iter = 9000\n')
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "t.toml").write_text('extends = "../full.toml"\n[trainer]\nmax_iter = 5\n')
    cfg = load_experiment(tmp_path / "tiny" / "t.toml")
    assert cfg.trainer.max_iter == 5 and cfg.data.chunk_length == 32 and cfg.data.fps == 50.0
    (tmp_path / "loop.toml").write_text('extends = "loop.toml"\n')
    with pytest.raises(ConfigError, match="cycle"):
        load_experiment(tmp_path / "loop.toml")


def test_unset_environment_variable_in_a_path_is_named():
    import os

    from wamkit.config.schema import expand_env

    os.environ.pop("WAMKIT_TEST_UNSET", None)
    with pytest.raises(ConfigError, match="WAMKIT_TEST_UNSET"):
        expand_env("${WAMKIT_TEST_UNSET}/data", "data.path")
    os.environ["WAMKIT_TEST_FALLBACK"] = "/fb"
    assert expand_env("${WAMKIT_TEST_UNSET:-$WAMKIT_TEST_FALLBACK}/d", "data.path") == "/fb/d"


def test_memory_estimate_counts_replicated_frozen_weights_whole_in_param_dtype():
    from types import SimpleNamespace

    from wamkit.train.dry_run import memory_estimate

    params = {"total": 10 * 2**30, "trainable": 4 * 2**30}  # 6 Gi frozen
    model_config = SimpleNamespace(num_hidden_layers=10, hidden_size=1024)

    def cfg(replicate_frozen):
        parallel = SimpleNamespace(replicate_frozen=replicate_frozen, param_dtype="bfloat16", activation_checkpointing="none")
        return SimpleNamespace(parallel=parallel, ema=SimpleNamespace(enabled=False))

    sharded, replicated = (memory_estimate(params, model_config, cfg(r), 8, 0) for r in (False, True))
    assert sharded["weights"] == 10 * 4 / 8  # every weight an fp32 shard
    assert replicated["weights"] == 4 * 4 / 8 + 6 * 2  # trainable fp32 shards + the frozen ones whole in bf16
    assert replicated["gathered"] < sharded["gathered"]  # only trainable weights are all-gathered
    assert memory_estimate(params, model_config, cfg(True), 1, 0)["weights"] == 10 * 4  # one process: nothing replicated


def test_negative_prefetch_is_refused_with_the_field_named():
    proc = run_cli(["train", str(DEMO_RECIPE), "--dry-run", "--set", "parallel.prefetch_layers=-1"], check=False)
    assert proc.returncode != 0 and "parallel.prefetch_layers" in proc.stderr + proc.stdout
